//! IP prefix sets for the LPM suites: the real tables and the BGP trace
//! from the data directory, generated fallbacks, and lookup addresses.
//!
//! Everything random here is drawn from a [`StdRng`] with a fixed seed, so
//! a suite builds the same prefixes and probes the same addresses in every
//! run and for every implementation.
//!
//! # Files (under `--data`, gzip, one item a line)
//! - `lpm/prefixes_ipv4.txt.gz`, `lpm/prefixes_ipv6.txt.gz`: a full table
//!   (901,899 IPv4 and 160,147 IPv6 CIDRs, canonical, unique).
//! - `lpm/ris/ris_as3333_initial_ipv4.txt.gz`: the table of one RIPE RIS
//!   peer at 00:00, and `..._mutations_ipv4.txt.gz` its next 24 hours of
//!   BGP updates, lines `A prefix` (announce) and `W prefix` (withdraw).

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::io::{self, BufRead, BufReader};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use flate2::read::GzDecoder;
use ip_network::{IpNetwork, Ipv4Network, Ipv6Network};
use ip_network_table::IpNetworkTable;
use ipnet::{Ipv4Net, Ipv6Net};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// The full IPv4 table.
pub const IPV4_TABLE: &str = "lpm/prefixes_ipv4.txt.gz";
/// The full IPv6 table.
pub const IPV6_TABLE: &str = "lpm/prefixes_ipv6.txt.gz";
/// The RIS peer's IPv4 table at the start of the trace.
pub const RIS_INITIAL_IPV4: &str = "lpm/ris/ris_as3333_initial_ipv4.txt.gz";
/// The RIS peer's 24 hours of IPv4 updates.
pub const RIS_MUTATIONS_IPV4: &str = "lpm/ris/ris_as3333_mutations_ipv4.txt.gz";

/// An address family: its byte image and the peers' types for it.
pub trait Family: Copy + Debug + Eq + Ord + Hash + Send + Sync + Default + 'static {
    /// `ipv4` or `ipv6`, for case names.
    const NAME: &'static str;
    /// Address bits (32 or 128).
    const BITS: u8;
    /// Address bytes, network order (`[u8; 4]` or `[u8; 16]`).
    type Addr: Copy
        + Debug
        + Default
        + Eq
        + Ord
        + Hash
        + Send
        + Sync
        + AsRef<[u8]>
        + AsMut<[u8]>
        + 'static;
    /// The `ipnet` prefix type (what `prefix-trie` stores).
    type Net: prefix_trie::Prefix + bpfmaps::lpm::IpPrefix + Copy + Debug + Send + Sync;

    /// Parses a CIDR of this family (host bits cleared); `None` otherwise.
    fn parse(s: &str) -> Option<Prefix<Self>>;
    /// The prefix as `ipnet`.
    fn net(p: &Prefix<Self>) -> Self::Net;
    /// A full-length `ipnet` prefix for an address (what `get_lpm` takes).
    fn host_net(a: &Self::Addr) -> Self::Net;
    /// The prefix as `ip_network`.
    fn ip_network(p: &Prefix<Self>) -> IpNetwork;
    /// `ip_network_table`'s longest match for an address.
    fn ip_network_match(t: &IpNetworkTable<u32>, a: &Self::Addr) -> Option<u32>;
    /// A uniformly random address of the "random addresses" lookup set:
    /// any IPv4 address, or an IPv6 address inside 2000::/3 (global unicast,
    /// where the table's routes are).
    fn random_addr(rng: &mut StdRng) -> Self::Addr;
}

/// IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct V4;

/// IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct V6;

impl Family for V4 {
    const NAME: &'static str = "ipv4";
    const BITS: u8 = 32;
    type Addr = [u8; 4];
    type Net = Ipv4Net;

    fn parse(s: &str) -> Option<Prefix<V4>> {
        let net: Ipv4Net = s.trim().parse().ok()?;
        Some(Prefix::new(net.addr().octets(), net.prefix_len()))
    }
    fn net(p: &Prefix<V4>) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::from(p.addr), p.len).expect("prefix length <= 32")
    }
    #[inline]
    fn host_net(a: &[u8; 4]) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::from(*a), 32).expect("/32")
    }
    fn ip_network(p: &Prefix<V4>) -> IpNetwork {
        Ipv4Network::new(Ipv4Addr::from(p.addr), p.len)
            .expect("canonical prefix")
            .into()
    }
    #[inline]
    fn ip_network_match(t: &IpNetworkTable<u32>, a: &[u8; 4]) -> Option<u32> {
        t.longest_match_ipv4(Ipv4Addr::from(*a)).map(|(_, v)| *v)
    }
    fn random_addr(rng: &mut StdRng) -> [u8; 4] {
        rng.random()
    }
}

impl Family for V6 {
    const NAME: &'static str = "ipv6";
    const BITS: u8 = 128;
    type Addr = [u8; 16];
    type Net = Ipv6Net;

    fn parse(s: &str) -> Option<Prefix<V6>> {
        let net: Ipv6Net = s.trim().parse().ok()?;
        Some(Prefix::new(net.addr().octets(), net.prefix_len()))
    }
    fn net(p: &Prefix<V6>) -> Ipv6Net {
        Ipv6Net::new(Ipv6Addr::from(p.addr), p.len).expect("prefix length <= 128")
    }
    #[inline]
    fn host_net(a: &[u8; 16]) -> Ipv6Net {
        Ipv6Net::new(Ipv6Addr::from(*a), 128).expect("/128")
    }
    fn ip_network(p: &Prefix<V6>) -> IpNetwork {
        Ipv6Network::new(Ipv6Addr::from(p.addr), p.len)
            .expect("canonical prefix")
            .into()
    }
    #[inline]
    fn ip_network_match(t: &IpNetworkTable<u32>, a: &[u8; 16]) -> Option<u32> {
        t.longest_match_ipv6(Ipv6Addr::from(*a)).map(|(_, v)| *v)
    }
    fn random_addr(rng: &mut StdRng) -> [u8; 16] {
        let mut a: [u8; 16] = rng.random();
        a[0] = 0x20 | (a[0] & 0x1f);
        a
    }
}

/// A prefix: address bytes with the host bits cleared, and a length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix<F: Family> {
    /// Network-order bytes, host bits zero.
    pub addr: F::Addr,
    /// Length in bits.
    pub len: u8,
}

impl<F: Family> Prefix<F> {
    /// `addr/len` with the host bits of `addr` cleared.
    pub fn new(mut addr: F::Addr, len: u8) -> Prefix<F> {
        assert!(len <= F::BITS, "prefix length {len} > {}", F::BITS);
        clear_host_bits(addr.as_mut(), len);
        Prefix { addr, len }
    }

    /// A uniformly random address inside the prefix.
    pub fn random_inside(&self, rng: &mut StdRng) -> F::Addr {
        let mut a = F::random_addr(rng);
        let (bytes, p) = (a.as_mut(), self.addr.as_ref());
        let full = self.len as usize / 8;
        bytes[..full].copy_from_slice(&p[..full]);
        let rest = self.len % 8;
        if rest != 0 {
            let keep = 0xffu8 << (8 - rest);
            bytes[full] = (p[full] & keep) | (bytes[full] & !keep);
        }
        a
    }
}

/// Zeroes every bit of `bytes` from bit `len` on (most significant first).
pub fn clear_host_bits(bytes: &mut [u8], len: u8) {
    let full = len as usize / 8;
    if full < bytes.len() {
        let rest = len % 8;
        bytes[full] &= if rest == 0 { 0 } else { 0xff << (8 - rest) };
        bytes[full + 1..].fill(0);
    }
}

/// Calls `f` with each line of a gzip text file.
pub fn for_each_line(path: &Path, mut f: impl FnMut(&str) -> io::Result<()>) -> io::Result<()> {
    let file = std::fs::File::open(path)?;
    let reader = BufReader::with_capacity(1 << 16, GzDecoder::new(file));
    for line in reader.lines() {
        f(line?.trim_end_matches('\r'))?;
    }
    Ok(())
}

fn bad_line(path: &Path, line: usize, text: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}:{line}: not a prefix: {text:?}", path.display()),
    )
}

/// The prefixes of a gzip file with one CIDR per line, in file order
/// (blank lines skipped; a line that is not a prefix of `F` is an error).
pub fn load_prefixes<F: Family>(path: &Path) -> io::Result<Vec<Prefix<F>>> {
    let mut out = Vec::new();
    let mut n = 0;
    for_each_line(path, |line| {
        n += 1;
        if !line.trim().is_empty() {
            out.push(F::parse(line).ok_or_else(|| bad_line(path, n, line))?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// One BGP update of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mutation<F: Family> {
    /// `A` (announce: insert or replace) or `W` (withdraw: remove).
    pub announce: bool,
    /// The prefix.
    pub prefix: Prefix<F>,
    /// The value an announce stores: its line number in the file.
    pub value: u32,
}

/// The mutations of a gzip trace with lines `A prefix` / `W prefix`.
pub fn load_mutations<F: Family>(path: &Path) -> io::Result<Vec<Mutation<F>>> {
    let mut out = Vec::new();
    let mut n = 0u32;
    for_each_line(path, |line| {
        n += 1;
        if line.trim().is_empty() {
            return Ok(());
        }
        let (op, cidr) = line
            .split_once(' ')
            .ok_or_else(|| bad_line(path, n as usize, line))?;
        let announce = match op {
            "A" => true,
            "W" => false,
            _ => return Err(bad_line(path, n as usize, line)),
        };
        let prefix = F::parse(cidr).ok_or_else(|| bad_line(path, n as usize, line))?;
        out.push(Mutation {
            announce,
            prefix,
            value: n,
        });
        Ok(())
    })?;
    Ok(out)
}

/// `count` distinct random prefixes with lengths uniform in `lens`
/// (addresses from [`Family::random_addr`]), deterministic for `seed`.
pub fn generate<F: Family>(
    count: usize,
    lens: std::ops::RangeInclusive<u8>,
    seed: u64,
) -> Vec<Prefix<F>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = HashSet::with_capacity(count);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let len = rng.random_range(lens.clone());
        let p = Prefix::new(F::random_addr(&mut rng), len);
        if seen.insert(p) {
            out.push(p);
        }
    }
    out
}

/// `items` in a random order fixed by `seed`.
pub fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
    let mut v = items.to_vec();
    v.shuffle(&mut StdRng::seed_from_u64(seed));
    v
}

/// Appends the items of `extra` not already in `base`, in order, until
/// `base` holds `limit` items.
pub fn top_up<F: Family>(base: &mut Vec<Prefix<F>>, extra: &[Prefix<F>], limit: usize) {
    if base.len() >= limit {
        return;
    }
    let mut seen: HashSet<Prefix<F>> = base.iter().copied().collect();
    for p in extra {
        if base.len() >= limit {
            break;
        }
        if seen.insert(*p) {
            base.push(*p);
        }
    }
}

/// `count` addresses, each inside a prefix of `prefixes` picked uniformly,
/// with random host bits.
pub fn addrs_inside<F: Family>(prefixes: &[Prefix<F>], count: usize, seed: u64) -> Vec<F::Addr> {
    assert!(!prefixes.is_empty(), "no prefixes to draw addresses from");
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| prefixes[rng.random_range(0..prefixes.len())].random_inside(&mut rng))
        .collect()
}

/// `count` addresses from [`Family::random_addr`].
pub fn addrs_random<F: Family>(count: usize, seed: u64) -> Vec<F::Addr> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count).map(|_| F::random_addr(&mut rng)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_and_masks() {
        let p = V4::parse("10.1.2.3/12").unwrap();
        assert_eq!((p.addr, p.len), ([10, 0, 0, 0], 12));
        let p = V6::parse("2001:db8::1/32").unwrap();
        assert_eq!(p.addr[..4], [0x20, 0x01, 0x0d, 0xb8]);
        assert!(p.addr[4..].iter().all(|&b| b == 0));
        assert!(V4::parse("2001:db8::/32").is_none());
        assert!(V6::parse("10.0.0.0/8").is_none());
        assert_eq!(Prefix::<V4>::new([255; 4], 0).addr, [0; 4]);
        assert_eq!(Prefix::<V4>::new([255; 4], 32).addr, [255; 4]);
    }

    #[test]
    fn addresses_fall_inside_their_prefix() {
        let mut rng = StdRng::seed_from_u64(1);
        for p in generate::<V4>(500, 0..=32, 3) {
            let a = p.random_inside(&mut rng);
            assert_eq!(Prefix::<V4>::new(a, p.len), p);
        }
        for p in generate::<V6>(500, 0..=128, 4) {
            let a = p.random_inside(&mut rng);
            assert_eq!(Prefix::<V6>::new(a, p.len), p);
        }
        let a = addrs_random::<V6>(1000, 5);
        assert!(a.iter().all(|a| a[0] >> 5 == 1), "inside 2000::/3");
        assert_eq!(a, addrs_random::<V6>(1000, 5), "deterministic");
    }

    #[test]
    fn generated_prefixes_are_distinct_and_topped_up() {
        let g = generate::<V4>(2000, 8..=32, 9);
        assert_eq!(g.iter().collect::<HashSet<_>>().len(), 2000);
        assert!(g.iter().all(|p| (8..=32).contains(&p.len)));
        let mut base = g[..100].to_vec();
        top_up(&mut base, &g[50..300], 250);
        assert_eq!(base.len(), 250);
        assert_eq!(base[..], g[..250]);
    }

    #[test]
    fn reads_gzip_tables_and_traces() {
        let dir = std::env::temp_dir().join(format!("bpfmaps-bench-pfx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            let mut gz = flate2::write::GzEncoder::new(
                std::fs::File::create(&path).unwrap(),
                flate2::Compression::fast(),
            );
            gz.write_all(text.as_bytes()).unwrap();
            gz.finish().unwrap();
            path
        };
        let t = write("t.gz", "1.0.0.0/24\r\n10.0.0.0/8\n\n");
        let v = load_prefixes::<V4>(&t).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1], Prefix::new([10, 0, 0, 0], 8));
        let m = write("m.gz", "A 10.0.0.0/8\nW 10.0.0.0/8\n");
        let v = load_mutations::<V4>(&m).unwrap();
        assert_eq!(v.len(), 2);
        assert!(v[0].announce && !v[1].announce);
        assert_eq!((v[0].value, v[1].value), (1, 2));
        let bad = write("b.gz", "A 10.0.0.0/8\nX 1.2.3.4\n");
        assert!(load_mutations::<V4>(&bad).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
