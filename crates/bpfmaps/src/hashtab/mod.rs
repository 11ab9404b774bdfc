//! Hash maps: `BPF_MAP_TYPE_HASH` and `BPF_MAP_TYPE_LRU_HASH`.
//!
//! # Structure
//! A power-of-two array of buckets (one per entry, as the kernel), each a
//! chain of elements. Elements live in large slab chunks (see `slab`),
//! preallocated by default, so a full map never allocates on update; with
//! `BPF_F_NO_PREALLOC` chunks are added as the map fills.
//!
//! ```text
//!  bucket heads (8 B each)    slab chunk
//!  +------+                  +------+------+------+------+
//!  | head | ---------------> | elem | elem | elem | ...  |
//!  +------+                  +------+------+------+------+
//!  writer locks: striped, at most 4096, bucket i -> lock i % n
//! ```
//!
//! # Concurrency
//! - Lookups are lock-free: pin an epoch, walk the chain, read the value in
//!   place. They never wait for a writer.
//! - Writers take the one (striped) bucket lock they touch. An update never writes a
//!   value a reader can see: it fills a fresh element and swaps it into the
//!   chain with a single release store, so readers see the old value or the
//!   new one whole, and a lookup that starts after `update` returned sees the
//!   new one.
//! - Unlinked elements are recycled only after an epoch grace period.
//! - Dropping a map hands its memory to a background thread.
//!
//! # Hashing
//! Per map, a [`HashPolicy`]: the kernel's jhash, xxh3, or the proposed
//! hybrid. The default, xxh3, was chosen by the `hash-sweep` benchmark
//! (see [`crate::hash`]).
//!
//! # Example
//! ```
//! use bpfmaps::hashtab::HashMap;
//! use bpfmaps::{Map, BPF_NOEXIST};
//!
//! let map = HashMap::new(4, 8, 1000).unwrap();
//! map.update(&1u32.to_ne_bytes(), &10u64.to_ne_bytes(), BPF_NOEXIST).unwrap();
//! let guard = bpfmaps::pin();
//! let value = map.get(&1u32.to_ne_bytes(), &guard).unwrap(); // zero-copy
//! assert_eq!(value, &10u64.to_ne_bytes());
//! ```

mod slab;
mod table;
#[cfg(test)]
mod tests;
mod typed;

use parking_lot::Mutex;
use std::sync::atomic::Ordering;

use crate::core::contract::{BATCH_PIN_CHUNK, BatchError, Caps, MapInfo, MapOps, MapSpec, MapType};
use crate::core::error::{Error, Result};
use crate::core::family::{Family, KeyKind, SizeRule};
use crate::core::flags::{BPF_F_NO_PREALLOC, BPF_F_ZERO_SEED, UpdateFlag};
use crate::core::reclaim::{Guard, pin};
use crate::hash::{HashPolicy, seed_for};
use slab::ElemPtr;
use table::{RawTable, TableOptions};

pub use typed::{TypedHashMap, TypedLruHashMap};

/// `BPF_F_NO_COMMON_LRU`: accepted for compatibility; bpfmaps has one clock
/// per map and no per-CPU lists, so it changes nothing.
pub const BPF_F_NO_COMMON_LRU: u32 = 1 << 1;

impl MapType {
    /// `BPF_MAP_TYPE_HASH`.
    pub const HASH: MapType = MapType(1);
    /// `BPF_MAP_TYPE_LRU_HASH`.
    pub const LRU_HASH: MapType = MapType(9);
}

/// Keys of 1 to 512 bytes (the BPF stack).
const KEY_SIZE: SizeRule = SizeRule::between(1, 512);
/// Values of 1 byte to 1 MiB.
const VALUE_SIZE: SizeRule = SizeRule::between(1, 1 << 20);

/// `BPF_MAP_TYPE_HASH`, for the registry.
pub const HASH_FAMILY: Family = Family {
    map_type: MapType::HASH,
    name: "hash",
    map_flags: BPF_F_NO_PREALLOC | BPF_F_ZERO_SEED,
    map_extra: 0,
    key_size: KEY_SIZE,
    value_size: VALUE_SIZE,
    keys: KeyKind::Bytes,
    sample_layout: None,
    build: |spec| Ok(Box::new(HashMap::from_spec(spec)?)),
};

/// `BPF_MAP_TYPE_LRU_HASH`, for the registry. `BPF_F_NO_PREALLOC` is
/// declared so that it is refused with `EOPNOTSUPP`, as the kernel does,
/// rather than `EINVAL`.
pub const LRU_HASH_FAMILY: Family = Family {
    map_type: MapType::LRU_HASH,
    name: "lru_hash",
    map_flags: BPF_F_NO_PREALLOC | BPF_F_ZERO_SEED | BPF_F_NO_COMMON_LRU,
    map_extra: 0,
    key_size: KEY_SIZE,
    value_size: VALUE_SIZE,
    keys: KeyKind::Bytes,
    sample_layout: None,
    build: |spec| Ok(Box::new(LruHashMap::from_spec(spec)?)),
};

/// How to build a hash map beyond sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashOptions {
    /// Allocate all elements up front (the kernel's default).
    pub prealloc: bool,
    /// Hash function policy.
    pub policy: HashPolicy,
    /// Hash seed; `None` draws a random one.
    pub seed: Option<u32>,
}

impl Default for HashOptions {
    fn default() -> Self {
        HashOptions {
            prealloc: true,
            policy: HashPolicy::default(),
            seed: None,
        }
    }
}

impl HashOptions {
    fn from_spec(spec: &MapSpec) -> Self {
        HashOptions {
            prealloc: spec.flags & BPF_F_NO_PREALLOC == 0,
            policy: spec.hash.unwrap_or_default(),
            seed: Some(seed_for(spec.flags)),
        }
    }

    fn table(self, key_size: usize, value_size: usize, max_entries: u32) -> TableOptions {
        TableOptions {
            key_size,
            value_size,
            max_entries: max_entries as usize,
            prealloc: self.prealloc,
            policy: self.policy,
            seed: self.seed.unwrap_or_else(rand::random),
        }
    }

    /// The info of a map of `map_type` built with these options.
    fn info(
        self,
        map_type: MapType,
        key_size: usize,
        value_size: usize,
        max_entries: u32,
    ) -> Result<MapInfo> {
        let size = |what: &str, rule: SizeRule, n: usize| match u32::try_from(n) {
            Ok(n) if rule.allows(n) => Ok(n),
            _ => Err(Error::invalid(format!(
                "{what} {n}: a hash map takes {}..={}",
                rule.min, rule.max
            ))),
        };
        if max_entries == 0 {
            return Err(Error::invalid("max_entries must be non-zero"));
        }
        let mut map_flags = if self.prealloc { 0 } else { BPF_F_NO_PREALLOC };
        if self.seed == Some(0) {
            map_flags |= BPF_F_ZERO_SEED;
        }
        Ok(MapInfo {
            map_type,
            key_size: size("key_size", KEY_SIZE, key_size)?,
            value_size: size("value_size", VALUE_SIZE, value_size)?,
            max_entries,
            map_flags,
            map_extra: 0,
        })
    }
}

/// `BPF_MAP_TYPE_HASH`: fixed-capacity hash map with lock-free lookups.
pub struct HashMap {
    table: RawTable,
    info: MapInfo,
}

impl HashMap {
    /// A preallocated map with the default hash and a random seed.
    pub fn new(key_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
        Self::with_options(key_size, value_size, max_entries, HashOptions::default())
    }

    /// A map with explicit options.
    pub fn with_options(
        key_size: usize,
        value_size: usize,
        max_entries: u32,
        options: HashOptions,
    ) -> Result<Self> {
        Self::of_type(MapType::HASH, key_size, value_size, max_entries, options)
    }

    /// A table of either hash map type.
    fn of_type(
        map_type: MapType,
        key_size: usize,
        value_size: usize,
        max_entries: u32,
        options: HashOptions,
    ) -> Result<Self> {
        let info = options.info(map_type, key_size, value_size, max_entries)?;
        Ok(HashMap {
            table: RawTable::new(options.table(key_size, value_size, max_entries))?,
            info,
        })
    }

    /// Builds either hash map type from a spec that passed its family's
    /// checks.
    fn from_spec(spec: &MapSpec) -> Result<Self> {
        let options = HashOptions::from_spec(spec);
        let (ks, vs) = (spec.key_size as usize, spec.value_size as usize);
        let map = Self::of_type(spec.map_type, ks, vs, spec.max_entries, options)?;
        Ok(HashMap {
            info: spec.info(),
            ..map
        })
    }

    /// The value stored under `key`, borrowed in place while `guard` is
    /// pinned (and the map alive). Lock-free. A key of the wrong size is
    /// simply not found.
    #[inline]
    pub fn get<'g>(&'g self, key: &[u8], guard: &'g Guard) -> Option<&'g [u8]> {
        self.table.get(key, guard)
    }

    /// The hash policy in use.
    pub fn hash_policy(&self) -> HashPolicy {
        self.table.policy
    }

    /// Visits every entry under one guard (weakly consistent under
    /// concurrent writers: each entry present throughout is seen once).
    pub fn for_each<'g>(&'g self, guard: &'g Guard, f: impl FnMut(&'g [u8], &'g [u8])) {
        self.table.for_each(guard, f)
    }
}

/// The byte contract shared by both hash maps: the entry points of the
/// kernel's `htab_map_ops` and `htab_lru_map_ops`.
macro_rules! impl_hash_ops {
    ($ty:ty, $caps:expr) => {
        impl MapOps for $ty {
            const CAPS: Caps = $caps;
            fn map_info(&self) -> MapInfo {
                self.base().info
            }
            fn map_len(&self) -> usize {
                self.base().table.len()
            }
            fn map_mem_usage(&self) -> usize {
                self.base().table.memory_usage() + size_of::<Self>() - size_of::<RawTable>()
            }
            #[inline]
            fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
                match self.get(key, guard) {
                    Some(found) => {
                        crate::core::bytes::copy(value, found);
                        Ok(())
                    }
                    None => Err(Error::NotFound),
                }
            }
            /// Without a pin (`RawTable::read_unpinned`) where sizes allow.
            #[inline]
            fn map_lookup_elem_unguarded(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
                let table = &self.base().table;
                if !table.reads_unpinned() {
                    return self.map_lookup_elem(key, value, &pin());
                }
                match table.read_unpinned(key, value) {
                    Some(found) => {
                        self.mark_used(found);
                        Ok(())
                    }
                    None => Err(Error::NotFound),
                }
            }
            fn map_update_elem(
                &self,
                key: &[u8],
                value: &[u8],
                flag: UpdateFlag,
                guard: &Guard,
            ) -> Result<()> {
                self.update_checked(key, value, flag, guard)
            }
            fn map_delete_elem(&self, key: &[u8], guard: &Guard) -> Result<()> {
                self.base().table.delete(key, None, guard)
            }
            fn map_lookup_and_delete_elem(
                &self,
                key: &[u8],
                value: &mut [u8],
                guard: &Guard,
            ) -> Result<()> {
                self.base().table.delete(key, Some(value), guard)
            }
            fn map_get_next_key(
                &self,
                key: Option<&[u8]>,
                next: &mut [u8],
                guard: &Guard,
            ) -> Result<usize> {
                self.base().table.next_key(key, next, guard)?;
                Ok(next.len())
            }
            /// Straight from the chains (`RawTable::lookup_batch`), as
            /// the kernel's batch copies whole buckets; an LRU map's
            /// entries are not marked used by it, as in the kernel.
            fn map_lookup_batch(
                &self,
                after: Option<&[u8]>,
                keys: &mut [u8],
                values: &mut [u8],
                room: usize,
            ) -> std::result::Result<usize, BatchError> {
                Ok(self
                    .base()
                    .table
                    .lookup_batch(after, keys, values, room, BATCH_PIN_CHUNK))
            }
        }
    };
}

impl_hash_ops!(HashMap, Caps::KEYED.union(Caps::LOOKUP_AND_DELETE));
impl_hash_ops!(
    LruHashMap,
    Caps::KEYED
        .union(Caps::LOOKUP_AND_DELETE)
        .union(Caps::EVICTS)
);

/// The table under both hash maps.
trait HashBase {
    fn base(&self) -> &HashMap;
    /// What a lookup that found `e` records (the LRU map: recency).
    fn mark_used(&self, e: ElemPtr);
}

impl HashBase for HashMap {
    fn base(&self) -> &HashMap {
        self
    }
    #[inline]
    fn mark_used(&self, _: ElemPtr) {}
}

impl HashBase for LruHashMap {
    fn base(&self) -> &HashMap {
        &self.base
    }
    /// Sets the referenced bit. After a lookup without a pin the element
    /// may have been recycled since: the bit then lands on another entry
    /// (or a free one), which costs that entry one sweep of the clock, no
    /// more.
    #[inline]
    fn mark_used(&self, e: ElemPtr) {
        // SAFETY: slab memory outlives the table; the bit is an atomic.
        let header = unsafe { e.header() };
        if !header.referenced.load(Ordering::Relaxed) {
            header.referenced.store(true, Ordering::Relaxed);
        }
    }
}

impl HashMap {
    /// An update whose sizes and flag were checked.
    fn update_checked(
        &self,
        key: &[u8],
        value: &[u8],
        flag: UpdateFlag,
        guard: &Guard,
    ) -> Result<()> {
        self.table
            .update(key, value, flag, guard, || false)
            .map(|_| ())
    }
}

/// `BPF_MAP_TYPE_LRU_HASH`: when full, an update evicts a least recently
/// used entry instead of failing.
///
/// Recency is tracked with the CLOCK algorithm over the slab: a lookup sets
/// the element's referenced bit (one relaxed store, only when not already
/// set, so hot entries do not bounce cache lines); an insert into a full
/// map sweeps the clock hand, clearing referenced bits, and evicts the first
/// unreferenced entry. Like the kernel, the LRU map is always preallocated.
pub struct LruHashMap {
    /// The table, with the LRU map's type in its info.
    base: HashMap,
    hand: Mutex<usize>,
}

impl LruHashMap {
    /// A map with the default hash and a random seed.
    pub fn new(key_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
        Self::with_options(key_size, value_size, max_entries, HashOptions::default())
    }

    /// A map with explicit options (`prealloc: false` is `EOPNOTSUPP`).
    pub fn with_options(
        key_size: usize,
        value_size: usize,
        max_entries: u32,
        options: HashOptions,
    ) -> Result<Self> {
        if !options.prealloc {
            return Err(Error::Unsupported);
        }
        Ok(LruHashMap {
            base: HashMap::of_type(
                MapType::LRU_HASH,
                key_size,
                value_size,
                max_entries,
                options,
            )?,
            hand: Mutex::new(0),
        })
    }

    /// Builds from a spec that passed [`LRU_HASH_FAMILY`]'s checks
    /// (`BPF_F_NO_PREALLOC` is `EOPNOTSUPP`: LRU maps are preallocated).
    fn from_spec(spec: &MapSpec) -> Result<Self> {
        if spec.flags & BPF_F_NO_PREALLOC != 0 {
            return Err(Error::Unsupported);
        }
        Ok(LruHashMap {
            base: HashMap::from_spec(spec)?,
            hand: Mutex::new(0),
        })
    }

    /// The value under `key`, borrowed in place; marks the entry recently
    /// used. Lock-free.
    #[inline]
    pub fn get<'g>(&'g self, key: &[u8], guard: &'g Guard) -> Option<&'g [u8]> {
        let e = self
            .base
            .table
            .find(key, self.base.table.hash(key), guard)?;
        self.mark_used(e);
        // SAFETY: reachable under the pinned guard; values of reachable
        // elements are immutable.
        Some(unsafe { e.value(self.base.table.layout()) })
    }

    /// Whether `key` is present, without marking it used.
    pub fn contains_key(&self, key: &[u8]) -> bool {
        let guard = pin();
        self.base
            .table
            .find(key, self.base.table.hash(key), &guard)
            .is_some()
    }

    /// Visits every entry (weakly consistent), without marking them used.
    pub fn for_each<'g>(&'g self, guard: &'g Guard, f: impl FnMut(&'g [u8], &'g [u8])) {
        self.base.table.for_each(guard, f)
    }

    /// An update whose sizes and flag were checked: a new key in a full
    /// map evicts first.
    fn update_checked(
        &self,
        key: &[u8],
        value: &[u8],
        flag: UpdateFlag,
        guard: &Guard,
    ) -> Result<()> {
        let mut attempts = 0;
        self.base
            .table
            .update(key, value, flag, guard, || {
                attempts += 1;
                attempts <= 64 && self.evict_one(guard)
            })
            .map(|_| ())
    }

    /// Evicts one unreferenced entry, sweeping the clock hand at most twice
    /// around. Returns whether room was made (by us or a racing delete).
    fn evict_one(&self, guard: &Guard) -> bool {
        let mut hand = self.hand.lock();
        if self.base.table.len() < self.base.table.max_entries {
            return true; // someone else made room meanwhile
        }
        for _ in 0..2 {
            let mut victim = None;
            self.base.table.slab().for_each_from(*hand, |index, e| {
                // SAFETY: slab memory lives as long as the table; the flags
                // are atomics, and `evict` re-checks under the bucket lock.
                let h = unsafe { e.header() };
                if !h.live.load(Ordering::Relaxed) {
                    return true;
                }
                if h.referenced.load(Ordering::Relaxed) {
                    h.referenced.store(false, Ordering::Relaxed);
                    return true;
                }
                victim = Some((index, e));
                false
            });
            if let Some((index, e)) = victim {
                *hand = index + 1;
                if self.base.table.evict(e, guard) {
                    return true;
                }
            }
        }
        self.base.table.len() < self.base.table.max_entries
    }
}
