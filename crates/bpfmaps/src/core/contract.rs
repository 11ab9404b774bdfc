//! The byte-level map contract every map implements, and `create()`, the
//! userspace `bpf_map_create`.
//!
//! Keys and values cross this boundary as byte slices of exactly the sizes
//! given at creation, like the `bpf()` syscall. Typed APIs on each map sit
//! on top for Rust users.

use super::error::{Error, Result, check_len};

/// The map types bpfmaps implements, with the kernel's names in the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MapKind {
    /// `BPF_MAP_TYPE_HASH`.
    Hash,
    /// `BPF_MAP_TYPE_LRU_HASH`.
    LruHash,
    /// `BPF_MAP_TYPE_BLOOM_FILTER`.
    BloomFilter,
    /// `BPF_MAP_TYPE_STACK_TRACE`.
    StackTrace,
    /// `BPF_MAP_TYPE_LPM_TRIE`.
    LpmTrie,
}

/// Everything `create()` needs, like `union bpf_attr` for `BPF_MAP_CREATE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSpec {
    /// Which map to build.
    pub kind: MapKind,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// Capacity: the map never holds more entries than this.
    pub max_entries: u32,
    /// Creation flags (`BPF_F_NO_PREALLOC`, `BPF_F_ZERO_SEED`, ...).
    pub flags: u32,
    /// Kind-specific extra, the kernel's `map_extra` (bloom filter: the
    /// number of hash functions in the low 4 bits).
    pub extra: u64,
    /// Hash function for hashed maps; `None` picks the map's default.
    pub hash: Option<crate::hash::HashPolicy>,
}

impl MapSpec {
    /// A spec with no flags, no extra and the default hash.
    pub fn new(kind: MapKind, key_size: u32, value_size: u32, max_entries: u32) -> Self {
        MapSpec {
            kind,
            key_size,
            value_size,
            max_entries,
            flags: 0,
            extra: 0,
            hash: None,
        }
    }

    /// Sets the creation flags.
    pub fn flags(mut self, flags: u32) -> Self {
        self.flags = flags;
        self
    }

    /// Sets the kind-specific extra.
    pub fn extra(mut self, extra: u64) -> Self {
        self.extra = extra;
        self
    }

    /// Sets the hash policy.
    pub fn hash(mut self, hash: crate::hash::HashPolicy) -> Self {
        self.hash = Some(hash);
        self
    }
}

/// Builds any map from its spec, as `bpf_map_create` does.
///
/// ```
/// use bpfmaps::{create, Map, MapKind, MapSpec, BPF_ANY};
///
/// let map = create(&MapSpec::new(MapKind::Hash, 4, 8, 1024)).unwrap();
/// map.update(&7u32.to_ne_bytes(), &42u64.to_ne_bytes(), BPF_ANY).unwrap();
/// let mut value = [0u8; 8];
/// map.lookup(&7u32.to_ne_bytes(), &mut value).unwrap();
/// assert_eq!(u64::from_ne_bytes(value), 42);
/// ```
pub fn create(spec: &MapSpec) -> Result<Box<dyn Map>> {
    Ok(match spec.kind {
        MapKind::Hash => Box::new(crate::hashtab::HashMap::from_spec(spec)?),
        MapKind::LruHash => Box::new(crate::hashtab::LruHashMap::from_spec(spec)?),
        MapKind::BloomFilter => Box::new(crate::bloom::BloomFilter::from_spec(spec)?),
        MapKind::StackTrace => Box::new(crate::stackmap::StackTraceMap::from_spec(spec)?),
        MapKind::LpmTrie => Box::new(crate::lpm::LpmTrie::from_spec(spec)?),
    })
}

/// A batch operation that stopped part way: `processed` elements were
/// applied before `error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("batch stopped after {processed} elements: {error}")]
pub struct BatchError {
    /// How many elements were applied before the failure.
    pub processed: usize,
    /// Why it stopped.
    pub error: Error,
}

/// The byte-level contract of every map, object safe so front ends can hold
/// a `Box<dyn Map>`.
///
/// Lookups never block: they run under an epoch guard and never take a lock.
/// Errors follow the kernel's errno (see [`Error`]).
pub trait Map: Send + Sync {
    /// Which map type this is.
    fn kind(&self) -> MapKind;
    /// Key size in bytes.
    fn key_size(&self) -> usize;
    /// Value size in bytes.
    fn value_size(&self) -> usize;
    /// Capacity given at creation.
    fn max_entries(&self) -> u32;

    /// Copies the value stored under `key` into `value`.
    fn lookup(&self, key: &[u8], value: &mut [u8]) -> Result<()>;
    /// Stores `value` under `key`; `flags` is `BPF_ANY`, `BPF_NOEXIST` or
    /// `BPF_EXIST`.
    fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()>;
    /// Removes `key`; `ENOENT` if absent.
    fn delete(&self, key: &[u8]) -> Result<()>;
    /// Copies the value out and removes the key, atomically with respect to
    /// other writers.
    fn lookup_and_delete(&self, key: &[u8], value: &mut [u8]) -> Result<()>;
    /// Writes into `next` the key after `key`. No key, or a key that is not
    /// in the map, gives the first key; the last key gives `ENOENT`.
    fn get_next_key(&self, key: Option<&[u8]>, next: &mut [u8]) -> Result<()>;
    /// Number of entries.
    fn len(&self) -> usize;
    /// Whether the map holds no entries.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of memory the map holds (tables, elements, slack).
    fn memory_usage(&self) -> usize;

    /// `bpf_map_push_elem`: for queue-like maps (the bloom filter). Other
    /// maps answer `EOPNOTSUPP`.
    fn push(&self, _value: &[u8], _flags: u64) -> Result<()> {
        Err(Error::Unsupported)
    }
    /// `bpf_map_peek_elem`. For the bloom filter `value` is an input: `Ok`
    /// means "maybe present", `ENOENT` means "certainly absent".
    fn peek(&self, _value: &mut [u8]) -> Result<()> {
        Err(Error::Unsupported)
    }

    /// Copies up to `keys.len() / key_size` entries, starting after the key
    /// `after` (`None`: from the first). Returns how many were copied; fewer
    /// than the room given means the iteration is complete. Continue with the
    /// last key copied as `after`.
    fn lookup_batch(
        &self,
        after: Option<&[u8]>,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<usize> {
        let (ks, vs) = (self.key_size(), self.value_size());
        let room = batch_room(keys.len(), values.len(), ks, vs)?;
        let mut prev: Option<Vec<u8>> = after.map(<[u8]>::to_vec);
        let mut copied = 0;
        while copied < room {
            let next = &mut keys[copied * ks..(copied + 1) * ks];
            match self.get_next_key(prev.as_deref(), next) {
                Ok(()) => {}
                Err(Error::NotFound) => break,
                Err(e) => return Err(e),
            }
            // A key deleted between get_next_key and lookup is skipped.
            match self.lookup(next, &mut values[copied * vs..(copied + 1) * vs]) {
                Ok(()) => {
                    prev = Some(next.to_vec());
                    copied += 1;
                }
                Err(Error::NotFound) => prev = Some(next.to_vec()),
                Err(e) => return Err(e),
            }
        }
        Ok(copied)
    }

    /// Copies up to `keys.len() / key_size` entries out and deletes them.
    /// Returns how many were moved; fewer than the room means the map was
    /// emptied.
    fn lookup_and_delete_batch(&self, keys: &mut [u8], values: &mut [u8]) -> Result<usize> {
        let (ks, vs) = (self.key_size(), self.value_size());
        let room = batch_room(keys.len(), values.len(), ks, vs)?;
        let mut moved = 0;
        let mut key = vec![0u8; ks];
        while moved < room {
            match self.get_next_key(None, &mut key) {
                Ok(()) => {}
                Err(Error::NotFound) => break,
                Err(e) => return Err(e),
            }
            match self.lookup_and_delete(&key, &mut values[moved * vs..(moved + 1) * vs]) {
                Ok(()) => {
                    keys[moved * ks..(moved + 1) * ks].copy_from_slice(&key);
                    moved += 1;
                }
                Err(Error::NotFound) => {} // raced with another deleter
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }

    /// Applies `update` to each key/value pair in order. Returns how many
    /// were applied, or where and why it stopped.
    fn update_batch(&self, keys: &[u8], values: &[u8], flags: u64) -> Result<usize, BatchError> {
        let (ks, vs) = (self.key_size(), self.value_size());
        let n = batch_room(keys.len(), values.len(), ks, vs).map_err(|error| BatchError {
            processed: 0,
            error,
        })?;
        if keys.len() != n * ks || values.len() != n * vs {
            let error = Error::invalid("batch keys and values hold different counts");
            return Err(BatchError {
                processed: 0,
                error,
            });
        }
        for i in 0..n {
            self.update(
                &keys[i * ks..(i + 1) * ks],
                &values[i * vs..(i + 1) * vs],
                flags,
            )
            .map_err(|error| BatchError {
                processed: i,
                error,
            })?;
        }
        Ok(n)
    }

    /// Deletes each key in order. Returns how many were deleted, or where and
    /// why it stopped (`ENOENT` for a missing key, as the kernel does).
    fn delete_batch(&self, keys: &[u8]) -> Result<usize, BatchError> {
        let ks = self.key_size();
        if ks == 0 || !keys.len().is_multiple_of(ks) {
            let error = Error::invalid("batch keys are not a whole number of keys");
            return Err(BatchError {
                processed: 0,
                error,
            });
        }
        for (i, key) in keys.chunks_exact(ks).enumerate() {
            self.delete(key).map_err(|error| BatchError {
                processed: i,
                error,
            })?;
        }
        Ok(keys.len() / ks)
    }
}

/// How many entries fit in both batch buffers; checks they hold whole keys
/// and values.
fn batch_room(keys_len: usize, values_len: usize, ks: usize, vs: usize) -> Result<usize> {
    if ks == 0 {
        return Err(Error::Unsupported);
    }
    if !keys_len.is_multiple_of(ks) || (vs != 0 && !values_len.is_multiple_of(vs)) {
        return Err(Error::invalid(
            "batch buffers are not a whole number of keys and values",
        ));
    }
    let by_values = values_len.checked_div(vs).unwrap_or(usize::MAX);
    Ok((keys_len / ks).min(by_values))
}

/// Checks a key buffer against the map's key size.
pub(crate) fn check_key(map_key_size: usize, key: &[u8]) -> Result<()> {
    check_len("key", key.len(), map_key_size)
}

/// Checks a value buffer against the map's value size.
pub(crate) fn check_value(map_value_size: usize, value: &[u8]) -> Result<()> {
    check_len("value", value.len(), map_value_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = MapKind> {
        prop_oneof![
            Just(MapKind::Hash),
            Just(MapKind::LruHash),
            Just(MapKind::BloomFilter),
            Just(MapKind::StackTrace),
            Just(MapKind::LpmTrie),
        ]
    }

    #[derive(Debug, Clone)]
    enum Call {
        Lookup(usize, usize),
        Update(usize, usize, u64),
        Delete(usize),
        LookupAndDelete(usize, usize),
        NextKey(Option<usize>, usize),
        Push(usize, u64),
        Peek(usize),
        Batch(usize, usize),
    }

    fn call() -> impl Strategy<Value = Call> {
        let size = prop_oneof![0usize..12, 250usize..262];
        prop_oneof![
            (size.clone(), size.clone()).prop_map(|(k, v)| Call::Lookup(k, v)),
            (
                size.clone(),
                size.clone(),
                prop_oneof![0u64..4, Just(1 << 10), Just(u64::MAX)]
            )
                .prop_map(|(k, v, f)| Call::Update(k, v, f)),
            size.clone().prop_map(Call::Delete),
            (size.clone(), size.clone()).prop_map(|(k, v)| Call::LookupAndDelete(k, v)),
            (prop::option::of(size.clone()), size.clone()).prop_map(|(k, n)| Call::NextKey(k, n)),
            (size.clone(), 0u64..3).prop_map(|(v, f)| Call::Push(v, f)),
            size.clone().prop_map(Call::Peek),
            (0usize..40, 0usize..80).prop_map(|(k, v)| Call::Batch(k, v)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]

        /// Any spec and any sequence of calls with buffers of any size, on
        /// any map: errors, never a panic, and a map whose length stays
        /// within its capacity.
        #[test]
        fn bad_input_never_panics(
            kind in kind(),
            key_size in prop_oneof![Just(0u32), Just(4), Just(8), 0u32..10, 250u32..262],
            value_size in prop_oneof![Just(8u32), Just(16), 0u32..12, 1016u32..1020],
            max_entries in 0u32..40,
            flags in prop_oneof![3 => Just(0u32), 1 => Just(1), 1 => Just(64), 1 => 0u32..2048],
            extra in prop_oneof![3 => Just(0u64), 1 => 0u64..40],
            calls in prop::collection::vec(call(), 0..60),
        ) {
            let spec = MapSpec { kind, key_size, value_size, max_entries, flags, extra, hash: None };
            let Ok(map) = create(&spec) else { return Ok(()) };
            let bytes = |n: usize, seed: usize| -> Vec<u8> { (0..n).map(|i| (i * 31 + seed) as u8).collect() };
            for (i, c) in calls.into_iter().enumerate() {
                let _ = match c {
                    Call::Lookup(k, v) => map.lookup(&bytes(k, i), &mut bytes(v, 0)),
                    Call::Update(k, v, f) => map.update(&bytes(k, i % 7), &bytes(v, i), f),
                    Call::Delete(k) => map.delete(&bytes(k, i % 7)),
                    Call::LookupAndDelete(k, v) => map.lookup_and_delete(&bytes(k, i % 7), &mut bytes(v, 0)),
                    Call::NextKey(k, n) => map.get_next_key(k.map(|k| bytes(k, i % 7)).as_deref(), &mut bytes(n, 0)),
                    Call::Push(v, f) => map.push(&bytes(v, i), f),
                    Call::Peek(v) => map.peek(&mut bytes(v, i)),
                    Call::Batch(k, v) => {
                        let _ = map.lookup_batch(None, &mut bytes(k, 0), &mut bytes(v, 0));
                        let _ = map.update_batch(&bytes(k, i), &bytes(v, i), 0);
                        map.delete_batch(&bytes(k, i)).map(|_| ()).map_err(|e| e.error)
                    }
                };
                if map.kind() != MapKind::BloomFilter {
                    prop_assert!(map.len() <= map.max_entries() as usize);
                }
            }
            let _ = map.memory_usage();
        }
    }
}
