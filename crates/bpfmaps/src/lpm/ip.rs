//! Typed LPM tables for IP users: `ipnet` prefixes in, addresses and
//! prefixes out, values as plain-old-data.

use std::marker::PhantomData;
use std::net::{Ipv4Addr, Ipv6Addr};

use bytemuck::Pod;
use ipnet::{Ipv4Net, Ipv6Net};

use super::trie::{Found, LpmTrie};
use crate::core::contract::Map;
use crate::core::error::{Error, Result};
use crate::core::flags::BPF_ANY;
use crate::core::reclaim::{Guard, pin};

/// An IP prefix type the typed table can store (IPv4 or IPv6).
pub trait IpPrefix: Copy {
    /// Address type.
    type Addr: Copy;
    /// Address bytes, on the stack.
    type Octets: AsRef<[u8]>;
    /// Address bytes (network order) of this family.
    const BYTES: usize;
    /// Prefix data (network order, host bits as given) and length.
    fn to_parts(&self) -> (Vec<u8>, u32);
    /// Builds a prefix from data and length.
    fn from_parts(data: &[u8], len: u32) -> Self;
    /// Address bytes.
    fn addr_bytes(addr: &Self::Addr) -> Self::Octets;
}

impl IpPrefix for Ipv4Net {
    type Addr = Ipv4Addr;
    type Octets = [u8; 4];
    const BYTES: usize = 4;
    fn to_parts(&self) -> (Vec<u8>, u32) {
        (self.addr().octets().to_vec(), self.prefix_len() as u32)
    }
    fn from_parts(data: &[u8], len: u32) -> Self {
        let octets: [u8; 4] = data.try_into().expect("4 bytes");
        Ipv4Net::new(Ipv4Addr::from(octets), len as u8).expect("valid prefix length")
    }
    fn addr_bytes(addr: &Ipv4Addr) -> [u8; 4] {
        addr.octets()
    }
}

impl IpPrefix for Ipv6Net {
    type Addr = Ipv6Addr;
    type Octets = [u8; 16];
    const BYTES: usize = 16;
    fn to_parts(&self) -> (Vec<u8>, u32) {
        (self.addr().octets().to_vec(), self.prefix_len() as u32)
    }
    fn from_parts(data: &[u8], len: u32) -> Self {
        let octets: [u8; 16] = data.try_into().expect("16 bytes");
        Ipv6Net::new(Ipv6Addr::from(octets), len as u8).expect("valid prefix length")
    }
    fn addr_bytes(addr: &Ipv6Addr) -> [u8; 16] {
        addr.octets()
    }
}

/// An LPM table keyed by IP prefixes with `V` values.
///
/// ```
/// use bpfmaps::lpm::Ipv4Lpm;
///
/// let table: Ipv4Lpm<u32> = Ipv4Lpm::new(1000).unwrap();
/// table.insert("10.0.0.0/8".parse().unwrap(), 1).unwrap();
/// table.insert("10.1.0.0/16".parse().unwrap(), 2).unwrap();
/// assert_eq!(table.longest_match("10.1.2.3".parse().unwrap()), Some(("10.1.0.0/16".parse().unwrap(), 2)));
/// assert_eq!(table.covering("10.1.2.0/24".parse().unwrap()).len(), 2);
/// assert_eq!(table.remove("10.1.0.0/16".parse().unwrap()), Ok(2));
/// ```
pub struct IpLpm<P: IpPrefix, V: Pod> {
    trie: LpmTrie,
    _types: PhantomData<fn() -> (P, V)>,
}

/// IPv4 table.
pub type Ipv4Lpm<V> = IpLpm<Ipv4Net, V>;
/// IPv6 table.
pub type Ipv6Lpm<V> = IpLpm<Ipv6Net, V>;

impl<P: IpPrefix, V: Pod> IpLpm<P, V> {
    /// A table of at most `max_entries` prefixes.
    pub fn new(max_entries: u32) -> Result<Self> {
        if size_of::<V>() == 0 {
            return Err(Error::invalid("zero-sized values"));
        }
        Ok(IpLpm {
            trie: LpmTrie::new(P::BYTES, size_of::<V>(), max_entries)?,
            _types: PhantomData,
        })
    }

    /// Inserts or replaces `prefix` (host bits are ignored).
    pub fn insert(&self, prefix: P, value: V) -> Result<()> {
        let (data, len) = prefix.to_parts();
        self.trie
            .insert(&data, len, bytemuck::bytes_of(&value), BPF_ANY)
    }

    /// Removes `prefix`, returning its value.
    pub fn remove(&self, prefix: P) -> Result<V> {
        let (data, len) = prefix.to_parts();
        let mut value = V::zeroed();
        self.trie
            .remove(&data, len, Some(bytemuck::bytes_of_mut(&mut value)))?;
        Ok(value)
    }

    /// The value of the longest stored prefix containing `addr`, read
    /// under the caller's `guard` (pin once for a burst of lookups): the
    /// fast path, `LpmTrie::get_as`, with no prefix built.
    ///
    /// ```
    /// use bpfmaps::lpm::Ipv4Lpm;
    ///
    /// let table: Ipv4Lpm<u32> = Ipv4Lpm::new(1000).unwrap();
    /// table.insert("10.0.0.0/8".parse().unwrap(), 1).unwrap();
    /// let guard = bpfmaps::pin();
    /// let hops: Vec<_> = ["10.1.2.3", "11.0.0.1"]
    ///     .map(|a| table.get(a.parse().unwrap(), &guard))
    ///     .into();
    /// assert_eq!(hops, [Some(1), None]);
    /// ```
    #[inline(always)]
    pub fn get(&self, addr: P::Addr, guard: &Guard) -> Option<V> {
        self.trie.get_as(P::addr_bytes(&addr).as_ref(), guard)
    }

    /// The longest stored prefix containing `addr`, with its value.
    pub fn longest_match(&self, addr: P::Addr) -> Option<(P, V)> {
        let bytes = P::addr_bytes(&addr);
        let guard = pin();
        let (len, value) = self.trie.longest_match(bytes.as_ref(), &guard)?;
        let mut data = bytes.as_ref().to_vec();
        super::key::mask_host_bits(&mut data, len);
        Some((
            P::from_parts(&data, len),
            bytemuck::pod_read_unaligned(&value),
        ))
    }

    /// The value stored for exactly `prefix`.
    pub fn exact(&self, prefix: P) -> Option<V> {
        let (data, len) = prefix.to_parts();
        let guard = pin();
        let value = self.trie.exact(&data, len, &guard)?;
        Some(bytemuck::pod_read_unaligned(&value))
    }

    /// Every stored prefix containing `prefix` (itself included), shortest
    /// first.
    pub fn covering(&self, prefix: P) -> Vec<(P, V)> {
        let (data, len) = prefix.to_parts();
        let guard = pin();
        self.collect(
            self.trie.covering(&data, len, &guard).unwrap_or_default(),
            &guard,
        )
    }

    /// Every stored prefix inside `prefix` (itself included), in prefix
    /// order.
    pub fn covered(&self, prefix: P) -> Vec<(P, V)> {
        let (data, len) = prefix.to_parts();
        let guard = pin();
        self.collect(
            self.trie.covered(&data, len, &guard).unwrap_or_default(),
            &guard,
        )
    }

    /// Every prefix in prefix order (address, then length): a snapshot,
    /// collected by one `LpmTrie::for_each` under a guard that is gone
    /// before the caller sees the first item. A lazy iterator would hold
    /// its guard, and so every block freed meanwhile, for as long as the
    /// caller takes; the snapshot costs its `Vec` instead.
    pub fn iter(&self) -> impl Iterator<Item = (P, V)> {
        let guard = pin();
        let mut out = Vec::with_capacity(self.trie.len());
        self.trie.for_each(&guard, |d, l, v| {
            out.push((P::from_parts(d, l), bytemuck::pod_read_unaligned(v)))
        });
        out.into_iter()
    }

    fn collect(&self, found: Vec<Found>, guard: &Guard) -> Vec<(P, V)> {
        found
            .iter()
            .map(|f| {
                (
                    P::from_parts(&f.data, f.prefixlen),
                    bytemuck::pod_read_unaligned(&self.trie.value_of(f, guard)),
                )
            })
            .collect()
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.trie.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.trie.len() == 0
    }

    /// The byte-level trie underneath.
    pub fn as_trie(&self) -> &LpmTrie {
        &self.trie
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net4(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_queries() {
        let t: Ipv4Lpm<u64> = Ipv4Lpm::new(100).unwrap();
        for (i, p) in [
            "0.0.0.0/0",
            "10.0.0.0/8",
            "10.1.0.0/16",
            "10.1.2.0/24",
            "10.1.3.0/24",
            "192.168.0.0/16",
        ]
        .iter()
        .enumerate()
        {
            t.insert(net4(p), i as u64).unwrap();
        }
        // Host bits are dropped.
        t.insert(net4("172.16.5.5/12"), 99).unwrap();
        assert_eq!(t.exact(net4("172.16.0.0/12")), Some(99));
        assert_eq!(t.exact(net4("172.16.0.0/13")), None);
        assert_eq!(
            t.longest_match("10.1.2.200".parse().unwrap()),
            Some((net4("10.1.2.0/24"), 3))
        );
        assert_eq!(
            t.longest_match("8.8.8.8".parse().unwrap()),
            Some((net4("0.0.0.0/0"), 0))
        );
        let cov: Vec<_> = t
            .covering(net4("10.1.2.128/25"))
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(
            cov,
            ["0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24"].map(net4)
        );
        let inside: Vec<_> = t
            .covered(net4("10.0.0.0/8"))
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(
            inside,
            ["10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.3.0/24"].map(net4)
        );
        let all: Vec<_> = t.iter().map(|e| e.0).collect();
        let mut sorted = all.clone();
        sorted.sort_by_key(|n| (n.addr(), n.prefix_len()));
        assert_eq!((all.len(), &all), (7, &sorted));
        let guard = pin();
        for a in [
            "10.1.2.200",
            "8.8.8.8",
            "10.1.3.1",
            "192.168.7.7",
            "172.31.0.1",
        ] {
            let a = a.parse().unwrap();
            assert_eq!(t.get(a, &guard), t.longest_match(a).map(|m| m.1), "{a}");
        }
        drop(guard);
        assert_eq!(t.remove(net4("10.1.0.0/16")), Ok(2));
        assert_eq!(t.remove(net4("10.1.0.0/16")), Err(Error::NotFound));
        assert_eq!(
            t.longest_match("10.1.9.9".parse().unwrap()),
            Some((net4("10.0.0.0/8"), 1))
        );
    }

    #[test]
    fn ipv6_queries() {
        let t: Ipv6Lpm<[u8; 3]> = Ipv6Lpm::new(10).unwrap();
        t.insert("2001:db8::/32".parse().unwrap(), [1, 2, 3])
            .unwrap();
        t.insert("2001:db8:1::/48".parse().unwrap(), [4, 5, 6])
            .unwrap();
        let (p, v) = t.longest_match("2001:db8:1::7".parse().unwrap()).unwrap();
        assert_eq!((p, v), ("2001:db8:1::/48".parse().unwrap(), [4, 5, 6]));
        assert_eq!(t.longest_match("2001:db9::1".parse().unwrap()), None);
        let guard = pin();
        assert_eq!(
            t.get("2001:db8:1::7".parse().unwrap(), &guard),
            Some([4, 5, 6])
        );
        assert_eq!(
            t.get("2001:db8:2::7".parse().unwrap(), &guard),
            Some([1, 2, 3])
        );
        assert_eq!(t.get("2001:db9::1".parse().unwrap(), &guard), None);
        assert_eq!(t.covered("2001:db8::/32".parse().unwrap()).len(), 2);
    }
}
