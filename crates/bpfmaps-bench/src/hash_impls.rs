//! The hash map implementations the hash suites compare, behind one trait,
//! and the one list every suite builds them from ([`hash_impls`]).
//!
//! | name | type | lookup |
//! |---|---|---|
//! | `bpfmaps` | `bpfmaps::hashtab::HashMap` | `get(key, &guard)`, one guard per batch |
//! | `bpfmaps-lookup` | the same | `Map::lookup(key, &mut value)`: the byte contract, a pin and a copy per call |
//! | `bpfmaps-lookup-guarded` | the same | `Map::lookup` with a batch's calls inside one outer guard: the contract without the pin |
//! | `std` / `std[N]` | `std::collections::HashMap<Box<[u8]>, u64>` / `<[u8; N], u64>` | `get` |
//! | `hashbrown` / `hashbrown[N]` | `hashbrown::HashMap`, likewise | `get` |
//! | `dashmap` / `dashmap[N]` | `dashmap::DashMap` 6, likewise | `get` (a shard read lock per call) |
//! | `judy` | JudyHS from libJudy (C), where `libjudy-dev` is installed ([`crate::native`]) | `JudyHSGet` |
//!
//! Peers hash with the same policy and seed as bpfmaps (a
//! [`PolicyBuildHasher`]), so a comparison is between table designs at
//! equal hash (except for the native `judy`, which hashes its own way);
//! they are sized for their keys up front, as preallocation does. The
//! fixed-array variants (`[N]`) are what a user who knows the
//! key size writes, and the faster of each peer's two variants is the one
//! the targets are compared with. Values are `id << 32 | generation`, so
//! a reader can check that what it read was written for its key.
//!
//! Adding a peer: an impl of [`HashImpl`] and one line in [`hash_impls`]
//! (a native one under its `cfg`, see [`crate::native`]).

use std::hint::black_box;

use bpfmaps::hashtab::{HashMap, HashOptions};
use bpfmaps::{BPF_ANY, Map};
use dashmap::DashMap;

use crate::hasher::PolicyBuildHasher;

/// What a batch of reads saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadCounts {
    /// Values read for the key asked for.
    pub found: u64,
    /// Keys not found.
    pub missing: u64,
    /// Values of another key: must stay 0.
    pub bad: u64,
}

impl std::ops::AddAssign for ReadCounts {
    fn add_assign(&mut self, o: ReadCounts) {
        self.found += o.found;
        self.missing += o.missing;
        self.bad += o.bad;
    }
}

impl ReadCounts {
    /// Lookups in all.
    pub fn total(&self) -> u64 {
        self.found + self.missing + self.bad
    }

    #[inline(always)]
    fn see(&mut self, id: u32, value: Option<u64>) {
        match value {
            Some(v) if v >> 32 == u64::from(id) => self.found += 1,
            Some(_) => self.bad += 1,
            None => self.missing += 1,
        }
    }
}

/// A batch of lookups: keys laid out back to back (so a loop reads them
/// sequentially and measures the map, not the key fetch) and the id each
/// key's value carries.
#[derive(Debug, Clone, Copy)]
pub struct Probes<'a> {
    /// The keys, `key_size` bytes each.
    pub keys: &'a [u8],
    /// The key size.
    pub key_size: usize,
    /// Key `i`'s id.
    pub ids: &'a [u32],
}

impl<'a> Probes<'a> {
    /// Each key with its id.
    #[inline(always)]
    fn each(self) -> impl Iterator<Item = (&'a [u8], u32)> {
        self.keys
            .chunks_exact(self.key_size)
            .zip(self.ids.iter().copied())
    }
}

/// A hash map from byte keys to `u64` values, as the suites drive it:
/// filled, then read in batches (a dynamic call per batch of a few hundred
/// lookups, each batch's loop monomorphic), and, for maps that allow it,
/// written by one thread while others read.
pub trait HashImpl: Send + Sync {
    /// Inserts or replaces (`BPF_ANY`).
    fn put(&mut self, key: &[u8], value: u64);
    /// Looks every probe up (bpfmaps under one guard).
    fn read_batch(&self, probes: Probes<'_>) -> ReadCounts;
    /// Entries held.
    fn len(&self) -> usize;
    /// Whether it holds no entries.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The map's own account of its memory, if it keeps one.
    fn reported(&self) -> Option<usize> {
        None
    }
    /// Writes through `&self` while readers read, if the map allows them.
    fn shared(&self) -> Option<&dyn SharedWrites> {
        None
    }
}

/// Writes a concurrent map takes through `&self`.
pub trait SharedWrites: Sync {
    /// Inserts or replaces (`BPF_ANY`).
    fn write(&self, key: &[u8], value: u64);
    /// Deletes a present key.
    fn remove(&self, key: &[u8]);
}

/// One implementation in the list: its name and how to build it empty.
#[derive(Clone, Copy)]
pub struct HashEntry {
    /// Name in records, before the hash policy: `std[16](xxh3)`.
    pub name: &'static str,
    /// A userspace peer (skipped by `--no-peers`), not bpfmaps itself.
    pub peer: bool,
    /// It hashes with a function of its own, not the policy's (so a suite
    /// builds it once, named without a policy).
    pub own_hash: bool,
    /// An empty map for `count` keys of `key_size` bytes, hashing with
    /// `hasher`.
    pub build: fn(key_size: usize, count: usize, hasher: PolicyBuildHasher) -> Box<dyn HashImpl>,
}

impl HashEntry {
    /// Builds it and fills it with keys `0..count` of `keys` (value of key
    /// `i`: `i << 32`).
    pub fn filled(
        &self,
        keys: &crate::keys::KeySet,
        count: usize,
        hasher: PolicyBuildHasher,
    ) -> Box<dyn HashImpl> {
        let mut map = (self.build)(keys.key_size(), count, hasher);
        for i in 0..count {
            map.put(keys.key(i), (i as u64) << 32);
        }
        assert_eq!(map.len(), count, "{}: duplicate keys", self.name);
        map
    }
}

/// Every implementation for keys of `key_size` bytes, bpfmaps first; the
/// fixed-array peers exist for the sizes `hash-sweep` sweeps.
pub fn hash_impls(key_size: usize) -> Vec<HashEntry> {
    let mut v = vec![
        HashEntry {
            name: "bpfmaps",
            peer: false,
            own_hash: false,
            build: |ks, n, h| Box::new(Bpfmaps::new(ks, n, h)),
        },
        HashEntry {
            name: "bpfmaps-lookup",
            peer: false,
            own_hash: false,
            build: |ks, n, h| Box::new(ByteContract::<false>(Bpfmaps::new(ks, n, h))),
        },
        HashEntry {
            name: "bpfmaps-lookup-guarded",
            peer: false,
            own_hash: false,
            build: |ks, n, h| Box::new(ByteContract::<true>(Bpfmaps::new(ks, n, h))),
        },
        HashEntry {
            name: "std",
            peer: true,
            own_hash: false,
            build: |_, n, h| {
                Box::new(
                    std::collections::HashMap::<Box<[u8]>, u64, _>::with_capacity_and_hasher(n, h),
                )
            },
        },
        HashEntry {
            name: "hashbrown",
            peer: true,
            own_hash: false,
            build: |_, n, h| {
                Box::new(hashbrown::HashMap::<Box<[u8]>, u64, _>::with_capacity_and_hasher(n, h))
            },
        },
        HashEntry {
            name: "dashmap",
            peer: true,
            own_hash: false,
            build: |_, n, h| Box::new(DashMap::<Box<[u8]>, u64, _>::with_capacity_and_hasher(n, h)),
        },
    ];
    #[cfg(native_judy)]
    v.push(HashEntry {
        name: "judy",
        peer: true,
        own_hash: true,
        build: |_, _, _| Box::new(crate::native::judy::JudyHs::new()),
    });
    v.extend(fixed_array_impls(key_size));
    v
}

/// The list's entry named `name`.
pub fn hash_impl(key_size: usize, name: &str) -> HashEntry {
    hash_impls(key_size)
        .into_iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no hash implementation {name}"))
}

/// bpfmaps' `HashMap`, preallocated, with the peers' policy and seed.
struct Bpfmaps(HashMap);

impl Bpfmaps {
    fn new(key_size: usize, count: usize, hasher: PolicyBuildHasher) -> Self {
        let options = HashOptions {
            prealloc: true,
            policy: hasher.policy,
            seed: Some(hasher.seed),
        };
        Bpfmaps(
            HashMap::with_options(key_size, 8, count as u32, options).expect("creating the map"),
        )
    }
}

impl HashImpl for Bpfmaps {
    fn put(&mut self, key: &[u8], value: u64) {
        SharedWrites::write(self, key, value);
    }
    #[inline]
    fn read_batch(&self, probes: Probes<'_>) -> ReadCounts {
        let guard = bpfmaps::pin();
        let mut c = ReadCounts::default();
        for (key, id) in probes.each() {
            let value = self.0.get(black_box(key), &guard).map(read_u64);
            c.see(id, value);
        }
        c
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn reported(&self) -> Option<usize> {
        Some(self.0.memory_usage())
    }
    fn shared(&self) -> Option<&dyn SharedWrites> {
        Some(self)
    }
}

impl SharedWrites for Bpfmaps {
    fn write(&self, key: &[u8], value: u64) {
        self.0
            .update(key, &value.to_ne_bytes(), BPF_ANY)
            .expect("update");
    }
    fn remove(&self, key: &[u8]) {
        self.0.delete(key).expect("delete of a present key");
    }
}

/// bpfmaps through the byte contract: `Map::lookup`, which copies the
/// value out and pins per call (what the C and Python front ends call),
/// or, with `GUARDED`, every call of a batch inside one outer guard (a
/// nested pin is a counter; the outer one is the only fence), to tell the
/// contract's own cost from the pin's.
struct ByteContract<const GUARDED: bool>(Bpfmaps);

impl<const GUARDED: bool> HashImpl for ByteContract<GUARDED> {
    fn put(&mut self, key: &[u8], value: u64) {
        self.0.put(key, value);
    }
    #[inline]
    fn read_batch(&self, probes: Probes<'_>) -> ReadCounts {
        let _outer = GUARDED.then(bpfmaps::pin);
        let mut c = ReadCounts::default();
        let mut value = [0u8; 8];
        for (key, id) in probes.each() {
            let found = self.0.0.lookup(black_box(key), &mut value).is_ok();
            c.see(id, found.then(|| u64::from_ne_bytes(value)));
        }
        c
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

#[inline(always)]
fn read_u64(v: &[u8]) -> u64 {
    u64::from_ne_bytes(v[..8].try_into().expect("8-byte values"))
}

/// [`HashImpl`] for a std-like peer map: how a key slice becomes its key
/// type, how it looks one up, whether it takes concurrent writes.
macro_rules! peer_impl {
    ($map:ty, |$k:ident| $to_key:expr, |$m:ident, $kk:ident| $get:expr, $shared:tt) => {
        impl HashImpl for $map {
            fn put(&mut self, $k: &[u8], value: u64) {
                self.insert($to_key, value);
            }
            #[inline]
            fn read_batch(&self, probes: Probes<'_>) -> ReadCounts {
                let mut c = ReadCounts::default();
                let $m = self;
                for ($kk, id) in probes.each() {
                    let $kk = black_box($kk);
                    c.see(id, $get);
                }
                c
            }
            fn len(&self) -> usize {
                <$map>::len(self)
            }
            peer_impl!(@shared $shared);
        }
    };
    (@shared yes) => {
        fn shared(&self) -> Option<&dyn SharedWrites> {
            Some(self)
        }
    };
    (@shared no) => {};
}

peer_impl!(
    std::collections::HashMap<Box<[u8]>, u64, PolicyBuildHasher>,
    |key| key.into(),
    |m, key| m.get(key).copied(),
    no
);
peer_impl!(
    hashbrown::HashMap<Box<[u8]>, u64, PolicyBuildHasher>,
    |key| key.into(),
    |m, key| m.get(key).copied(),
    no
);
peer_impl!(
    DashMap<Box<[u8]>, u64, PolicyBuildHasher>,
    |key| key.into(),
    |m, key| m.get(key).map(|v| *v),
    yes
);

impl SharedWrites for DashMap<Box<[u8]>, u64, PolicyBuildHasher> {
    fn write(&self, key: &[u8], value: u64) {
        // BPF_ANY without allocating a key when it is present.
        match self.get_mut(key) {
            Some(mut v) => *v = value,
            None => {
                self.insert(key.into(), value);
            }
        }
    }
    fn remove(&self, key: &[u8]) {
        assert!(
            DashMap::remove(self, key).is_some(),
            "delete of a present key"
        );
    }
}

/// JudyHS (`judy`), a C peer from `libjudy-dev`: not sized up front (it
/// grows node by node), not concurrent. It takes no `BuildHasher`: it
/// hashes keys longer than a word with its own 32-bit function (and
/// decodes shorter ones directly), so its rows compare a different hash
/// too, and its rows under each policy name are the same map. Its blocks
/// come from Rust's global allocator ([`crate::native::judy`]), so its
/// memory is measured as the other maps' is.
#[cfg(native_judy)]
impl HashImpl for crate::native::judy::JudyHs {
    fn put(&mut self, key: &[u8], value: u64) {
        self.insert(key, usize::try_from(value).expect("values fit a word"));
    }
    #[inline]
    fn read_batch(&self, probes: Probes<'_>) -> ReadCounts {
        let mut c = ReadCounts::default();
        for (key, id) in probes.each() {
            c.see(id, self.get(black_box(key)).map(|v| v as u64));
        }
        c
    }
    fn len(&self) -> usize {
        crate::native::judy::JudyHs::len(self)
    }
}

/// A fixed-array key from a slice of its size.
#[inline(always)]
fn array<const N: usize>(key: &[u8]) -> [u8; N] {
    key.try_into().expect("keys of the map's size")
}

macro_rules! fixed_array_peers {
    ($($n:literal)*) => {
        $(
            peer_impl!(
                std::collections::HashMap<[u8; $n], u64, PolicyBuildHasher>,
                |key| array::<$n>(key),
                |m, key| m.get(&array::<$n>(key)).copied(),
                no
            );
            peer_impl!(
                hashbrown::HashMap<[u8; $n], u64, PolicyBuildHasher>,
                |key| array::<$n>(key),
                |m, key| m.get(&array::<$n>(key)).copied(),
                no
            );
            peer_impl!(
                DashMap<[u8; $n], u64, PolicyBuildHasher>,
                |key| array::<$n>(key),
                |m, key| m.get(&array::<$n>(key)).map(|v| *v),
                yes
            );

            impl SharedWrites for DashMap<[u8; $n], u64, PolicyBuildHasher> {
                fn write(&self, key: &[u8], value: u64) {
                    self.insert(array::<$n>(key), value);
                }
                fn remove(&self, key: &[u8]) {
                    let removed = DashMap::remove(self, &array::<$n>(key));
                    assert!(removed.is_some(), "delete of a present key");
                }
            }
        )*

        /// The fixed-array peers for `key_size`, if it is one of the sizes
        /// the sweep uses.
        fn fixed_array_impls(key_size: usize) -> Vec<HashEntry> {
            match key_size {
                $(
                    $n => vec![
                        HashEntry {
                            name: concat!("std[", $n, "]"),
                            peer: true,
                            own_hash: false,
                            build: |_, n, h| Box::new(std::collections::HashMap::<[u8; $n], u64, _>::with_capacity_and_hasher(n, h)),
                        },
                        HashEntry {
                            name: concat!("hashbrown[", $n, "]"),
                            peer: true,
                            own_hash: false,
                            build: |_, n, h| Box::new(hashbrown::HashMap::<[u8; $n], u64, _>::with_capacity_and_hasher(n, h)),
                        },
                        HashEntry {
                            name: concat!("dashmap[", $n, "]"),
                            peer: true,
                            own_hash: false,
                            build: |_, n, h| Box::new(DashMap::<[u8; $n], u64, _>::with_capacity_and_hasher(n, h)),
                        },
                    ],
                )*
                _ => Vec::new(),
            }
        }
    };
}

fixed_array_peers!(4 8 12 16 24 32 48 64 128 240 256);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeySet;

    /// Every implementation holds what was put and reads it back, through
    /// the same probe batches, at a swept size and at one without fixed
    /// arrays.
    #[test]
    fn every_implementation_reads_back_what_was_put() {
        for key_size in [16, 20] {
            let keys = KeySet::kernel(300, key_size);
            let hasher = PolicyBuildHasher::new(bpfmaps::HashPolicy::Xxh3, 7);
            let impls = hash_impls(key_size);
            // Six (nine with the fixed arrays), and `judy` if built in.
            let native = usize::from(cfg!(native_judy));
            assert_eq!(impls.len(), (if key_size == 16 { 9 } else { 6 }) + native);
            assert_eq!(impls.iter().any(|e| e.name == "judy"), cfg!(native_judy));
            for e in &impls {
                let map = e.filled(&keys, 200, hasher);
                let ids: Vec<u32> = (0..300).collect();
                let probes = Probes {
                    keys: keys.slice(0..300),
                    key_size,
                    ids: &ids,
                };
                let c = map.read_batch(probes);
                assert_eq!((c.found, c.missing, c.bad), (200, 100, 0), "{}", e.name);
                let wrong: Vec<u32> = (1..=300).collect();
                let c = map.read_batch(Probes {
                    ids: &wrong,
                    ..probes
                });
                assert_eq!(c.bad, 200, "{}", e.name);
                let concurrent = ["bpfmaps", "dashmap", "dashmap[16]"].contains(&e.name);
                assert_eq!(map.shared().is_some(), concurrent, "{}", e.name);
                if let Some(w) = map.shared() {
                    w.write(keys.key(0), 1); // key 0, a new generation
                    w.remove(keys.key(1));
                    w.write(keys.key(250), 250 << 32);
                    let c = map.read_batch(probes);
                    assert_eq!((c.found, c.missing, c.bad), (200, 100, 0), "{}", e.name);
                    assert_eq!(map.len(), 200, "{}", e.name);
                }
            }
        }
    }
}
