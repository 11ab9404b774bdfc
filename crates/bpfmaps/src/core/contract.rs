//! The byte-level map contract: [`Map`], what front ends and `create()`
//! hand out, and [`MapOps`], what a map family implements.
//!
//! Keys and values cross this boundary as byte slices of the sizes given
//! at creation, like the `bpf()` syscall. The kernel splits the work the
//! same way: `kernel/bpf/syscall.c` checks what is common to every map
//! (sizes, flags, which operations a type has) and only then calls the
//! family's `bpf_map_ops`. Here every family implements [`MapOps`] and
//! gets [`Map`] from one generic layer, so the checks are written once:
//!
//! | step | done by |
//! |---|---|
//! | key and value sizes (`EINVAL`) | the generic layer, from [`MapInfo`] and [`Caps::VAR_KEYS`] |
//! | update flags decoded (`EINVAL` for unknown bits) | the generic layer ([`UpdateFlag`]) |
//! | operations the family lacks (`EOPNOTSUPP`) | the generic layer, from [`MapOps::CAPS`] |
//! | lookup and update of key-less maps (bloom filter) | peek and push, as the syscall does |
//! | batch operations, partial progress, one pin per chunk | the generic layer |
//! | everything else (what a key means, `E2BIG`, `EEXIST`, `ENOENT`) | the family |
//!
//! Typed APIs on each map sit beside this for Rust users who want
//! zero-copy reads under a guard they hold.

use bitflags::bitflags;

use super::error::{Error, Result, check_len};
use super::flags::UpdateFlag;
use super::reclaim::{Guard, pin};

/// A map type: the kernel's `enum bpf_map_type` number for the types the
/// kernel has (`BPF_MAP_TYPE_HASH` is 1), and numbers from
/// [`MapType::PRIVATE`] up for bpfmaps' own. Each family declares its
/// constant in its own module (`MapType::HASH` in `hashtab`, ...); the
/// registry (`bpfmaps::registry`) lists them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MapType(pub u32);

impl MapType {
    /// First number of the map types the kernel does not have (the
    /// kernel's own end at 33 in Linux 6.15), so front ends can tell them
    /// apart from the kernel's.
    pub const PRIVATE: u32 = 0x1000;
}

/// What `bpf_map_get_info_by_fd` tells about a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapInfo {
    /// The map's type.
    pub map_type: MapType,
    /// Key size in bytes (for [`Caps::VAR_KEYS`] maps: the longest key).
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// Capacity given at creation.
    pub max_entries: u32,
    /// Creation flags in effect (`BPF_F_NO_PREALLOC`, ...).
    pub map_flags: u32,
    /// The kind-specific extra given at creation (`map_extra`).
    pub map_extra: u64,
}

/// Everything creating a map needs, like `union bpf_attr` for
/// `BPF_MAP_CREATE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSpec {
    /// Which map to build.
    pub map_type: MapType,
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
    pub fn new(map_type: MapType, key_size: u32, value_size: u32, max_entries: u32) -> Self {
        MapSpec {
            map_type,
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

    /// The info of a map built from this spec with `map_flags` in effect.
    pub fn info(&self) -> MapInfo {
        MapInfo {
            map_type: self.map_type,
            key_size: self.key_size,
            value_size: self.value_size,
            max_entries: self.max_entries,
            map_flags: self.flags,
            map_extra: self.extra,
        }
    }
}

bitflags! {
    /// The operations a map family has beyond its info, length and memory,
    /// as the kernel's `bpf_map_ops` entries are present or `NULL`. The
    /// generic layer answers `EOPNOTSUPP` for the others without calling
    /// the family.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Caps: u32 {
        /// `lookup`.
        const LOOKUP = 1 << 0;
        /// `update` (a family may still refuse every update with a
        /// reason, as the stack trace map's `EINVAL` does).
        const UPDATE = 1 << 1;
        /// `delete`.
        const DELETE = 1 << 2;
        /// `lookup_and_delete`.
        const LOOKUP_AND_DELETE = 1 << 3;
        /// `get_next_key` iteration.
        const NEXT_KEY = 1 << 4;
        /// The four batch operations (lookup-and-delete batches also need
        /// `LOOKUP_AND_DELETE`), built on the single-element ones.
        const BATCH = 1 << 5;
        /// A key-less map (bloom filter, queue, stack): `push` and `peek`,
        /// and, as in the syscall, `update` pushes and `lookup` peeks.
        const PUSH_PEEK = 1 << 6;
        /// Keys of any length from 1 to `key_size` bytes, the slice's
        /// length being the key's.
        const VAR_KEYS = 1 << 7;
        /// A full map makes room for a new key by evicting an old one
        /// instead of answering `E2BIG` (the LRU map).
        const EVICTS = 1 << 8;
    }
}

impl Caps {
    /// A map with keys: lookup, update, delete, iteration and batches.
    pub const KEYED: Caps = Caps::LOOKUP
        .union(Caps::UPDATE)
        .union(Caps::DELETE)
        .union(Caps::NEXT_KEY)
        .union(Caps::BATCH);
}

/// A batch operation that stopped part way: `processed` elements were
/// done before `error` (the kernel's `attr->batch.count`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("batch stopped after {processed} elements: {error}")]
pub struct BatchError {
    /// How many elements were done before the failure.
    pub processed: usize,
    /// Why it stopped.
    pub error: Error,
}

impl BatchError {
    /// A batch refused before its first element.
    fn at_start(error: Error) -> Self {
        BatchError {
            processed: 0,
            error,
        }
    }
}

/// The byte-level contract of every map, object safe so front ends can
/// hold a `Box<dyn Map>`. Implemented for every [`MapOps`] family by the
/// generic layer; never by hand.
///
/// Lookups never block: they run under an epoch guard and never take a
/// lock. Errors follow the kernel's errno (see [`Error`]).
pub trait Map: Send + Sync {
    /// Type, sizes, capacity and flags.
    fn info(&self) -> MapInfo;
    /// The operations this map has.
    fn caps(&self) -> Caps;
    /// The map's type.
    fn map_type(&self) -> MapType {
        self.info().map_type
    }
    /// Key size in bytes (the longest key for [`Caps::VAR_KEYS`] maps).
    fn key_size(&self) -> usize {
        self.info().key_size as usize
    }
    /// Value size in bytes.
    fn value_size(&self) -> usize {
        self.info().value_size as usize
    }
    /// Capacity given at creation.
    fn max_entries(&self) -> u32 {
        self.info().max_entries
    }

    /// Copies the value stored under `key` into `value`. For key-less maps
    /// (`key` empty) this is `peek`, as in the syscall.
    fn lookup(&self, key: &[u8], value: &mut [u8]) -> Result<()>;
    /// Stores `value` under `key`; `flags` is `BPF_ANY`, `BPF_NOEXIST` or
    /// `BPF_EXIST`. For key-less maps (`key` empty) this is `push`.
    fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()>;
    /// Removes `key`; `ENOENT` if absent.
    fn delete(&self, key: &[u8]) -> Result<()>;
    /// Copies the value out and removes the key, atomically with respect to
    /// other writers.
    fn lookup_and_delete(&self, key: &[u8], value: &mut [u8]) -> Result<()>;
    /// Writes into `next` the key after `key` and returns its length (the
    /// key size, but for [`Caps::VAR_KEYS`] maps). No key gives the first
    /// key; the last key gives `ENOENT`; what a key that is not in the map
    /// gives is the family's (the hash maps restart from the first key, as
    /// the kernel does).
    fn get_next_key(&self, key: Option<&[u8]>, next: &mut [u8]) -> Result<usize>;
    /// Number of entries.
    fn len(&self) -> usize;
    /// Whether the map holds no entries.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of memory the map holds (tables, elements, slack).
    fn memory_usage(&self) -> usize;

    /// `bpf_map_push_elem`, for key-less maps.
    fn push(&self, value: &[u8], flags: u64) -> Result<()>;
    /// `bpf_map_peek_elem`, for key-less maps. For the bloom filter `value`
    /// is an input: `Ok` means "maybe present", `ENOENT` "certainly absent".
    fn peek(&self, value: &mut [u8]) -> Result<()>;

    /// Copies up to `keys.len() / key_size` entries, starting after the key
    /// `after` (`None`: from the first). Returns how many were copied; fewer
    /// than the room given means the iteration is complete. Continue with
    /// the last key copied as `after`.
    fn lookup_batch(
        &self,
        after: Option<&[u8]>,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<usize, BatchError>;
    /// Copies up to `keys.len() / key_size` entries out and deletes them.
    /// Returns how many were moved; fewer than the room means the map was
    /// emptied.
    fn lookup_and_delete_batch(
        &self,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<usize, BatchError>;
    /// Applies `update` to each key/value pair in order. Returns how many
    /// were applied, or where and why it stopped; `flags` are checked
    /// before the first element.
    fn update_batch(&self, keys: &[u8], values: &[u8], flags: u64) -> Result<usize, BatchError>;
    /// Deletes each key in order. Returns how many were deleted, or where
    /// and why it stopped (`ENOENT` for a missing key, as the kernel does).
    fn delete_batch(&self, keys: &[u8]) -> Result<usize, BatchError>;
}

impl std::fmt::Debug for dyn Map + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("info", &self.info())
            .field("len", &self.len())
            .finish()
    }
}

/// What a map family implements, as the kernel's `struct bpf_map_ops`:
/// the operations, on inputs the generic layer has already checked (key
/// and value sizes right, update flags decoded, the operation in
/// [`CAPS`](MapOps::CAPS)), under a guard it has pinned. Every family gets
/// [`Map`] from this; only what a key means and the answers are its own.
///
/// An operation outside `CAPS` is never called, so its default body is
/// never run.
pub trait MapOps: Send + Sync {
    /// The operations this family has.
    const CAPS: Caps;

    /// Type, sizes, capacity and flags.
    fn map_info(&self) -> MapInfo;
    /// Number of entries.
    fn map_len(&self) -> usize;
    /// Bytes held (`map_mem_usage`).
    fn map_mem_usage(&self) -> usize;

    /// `map_lookup_elem`: copies the value of `key` into `value`.
    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
        let _ = (key, value, guard);
        Err(Error::Unsupported)
    }
    /// `map_lookup_elem` for a caller that holds no guard (`Map::lookup`).
    /// A family whose readers can do without a pin overrides it: pinning
    /// is a large share of a short lookup's cost (docs/benchmarks.md).
    #[inline]
    fn map_lookup_elem_unguarded(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        self.map_lookup_elem(key, value, &pin())
    }
    /// `map_update_elem`.
    fn map_update_elem(
        &self,
        key: &[u8],
        value: &[u8],
        flag: UpdateFlag,
        guard: &Guard,
    ) -> Result<()> {
        let _ = (key, value, flag, guard);
        Err(Error::Unsupported)
    }
    /// `map_delete_elem`.
    fn map_delete_elem(&self, key: &[u8], guard: &Guard) -> Result<()> {
        let _ = (key, guard);
        Err(Error::Unsupported)
    }
    /// `map_lookup_and_delete_elem`.
    fn map_lookup_and_delete_elem(
        &self,
        key: &[u8],
        value: &mut [u8],
        guard: &Guard,
    ) -> Result<()> {
        let _ = (key, value, guard);
        Err(Error::Unsupported)
    }
    /// `map_update_batch`: `n` keys and values (checked sizes, back to
    /// back) stored in order under `flag`; returns `n`, or how many were
    /// stored before the error. The default updates them one by one
    /// ([`update_each`]); a family that builds faster from many at once
    /// overrides it, with the same result.
    fn map_update_batch(
        &self,
        keys: &[u8],
        values: &[u8],
        n: usize,
        flag: UpdateFlag,
    ) -> Result<usize, BatchError> {
        update_each(self, keys, values, n, flag)
    }
    /// `map_lookup_batch`: copies up to `room` entries after `after`
    /// (`None`: from the first; checked) into `keys` (in [`BatchKeys`]'
    /// layout) and `values`, and returns how many. The default walks
    /// with `map_get_next_key` and `map_lookup_elem` ([`lookup_each`]); a
    /// family that can copy straight from its structure overrides it,
    /// with the same order and the same answer to a missing `after`.
    fn map_lookup_batch(
        &self,
        after: Option<&[u8]>,
        keys: &mut [u8],
        values: &mut [u8],
        room: usize,
    ) -> Result<usize, BatchError> {
        lookup_each(self, after, keys, values, room)
    }
    /// `map_get_next_key`: writes the key after `key` (`None`: the first)
    /// into `next`, which holds `key_size` bytes, and returns its length.
    fn map_get_next_key(
        &self,
        key: Option<&[u8]>,
        next: &mut [u8],
        guard: &Guard,
    ) -> Result<usize> {
        let _ = (key, next, guard);
        Err(Error::Unsupported)
    }
    /// `map_push_elem`.
    fn map_push_elem(&self, value: &[u8], flag: UpdateFlag) -> Result<()> {
        let _ = (value, flag);
        Err(Error::Unsupported)
    }
    /// `map_peek_elem`.
    fn map_peek_elem(&self, value: &mut [u8]) -> Result<()> {
        let _ = value;
        Err(Error::Unsupported)
    }
}

/// Elements a batch runs under one pinned guard before letting the epoch
/// move on (a long batch must not hold back every grace period, as the
/// kernel's batches `cond_resched()` between elements).
pub(crate) const BATCH_PIN_CHUNK: usize = 64;

/// `EOPNOTSUPP` unless `caps` has `needed`.
#[inline(always)]
fn require(caps: Caps, needed: Caps) -> Result<()> {
    if caps.contains(needed) {
        Ok(())
    } else {
        Err(Error::Unsupported)
    }
}

/// Checks a key against the map: exactly `key_size` bytes, or 1 to
/// `key_size` for variable-length keys.
#[inline(always)]
fn check_key(info: &MapInfo, caps: Caps, key: &[u8]) -> Result<()> {
    let max = info.key_size as usize;
    if caps.contains(Caps::VAR_KEYS) {
        if (1..=max).contains(&key.len()) {
            Ok(())
        } else {
            Err(var_key_error(key.len(), max))
        }
    } else {
        check_len("key", key.len(), max)
    }
}

#[cold]
#[inline(never)]
fn var_key_error(got: usize, max: usize) -> Error {
    Error::invalid(format!("key is {got} bytes, the map takes 1 to {max}"))
}

#[inline(always)]
fn check_value(info: &MapInfo, value: &[u8]) -> Result<()> {
    check_len("value", value.len(), info.value_size as usize)
}

/// How a batch lays out its keys. Fixed-size keys sit back to back,
/// `key_size` bytes each. A key of a map with variable-length keys
/// ([`Caps::VAR_KEYS`]) takes a slot of `4 + key_size` bytes, laid out as
/// the kernel lays out an LPM key (`struct bpf_lpm_trie_key`): its length
/// as a native-endian `u32`, then the key, zero-padded.
///
/// ```
/// use bpfmaps::{BatchKeys, Map, MapSpec, MapType, BPF_ANY};
///
/// let map = bpfmaps::create(&MapSpec::new(MapType::QP_TRIE, 8, 4, 16)).unwrap();
/// let layout = BatchKeys::of(&*map);
/// let keys = layout.encode(&[&b"vfs_read"[..], b"vfs"]).unwrap();
/// map.update_batch(&keys, &[1u32.to_ne_bytes(), 2u32.to_ne_bytes()].concat(), BPF_ANY).unwrap();
/// let (mut keys, mut values) = (vec![0; 2 * layout.stride()], vec![0; 8]);
/// assert_eq!(map.lookup_batch(None, &mut keys, &mut values).unwrap(), 2);
/// assert_eq!(layout.key(&keys, 0).unwrap(), b"vfs");
/// assert_eq!(layout.key(&keys, 1).unwrap(), b"vfs_read");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchKeys {
    key_size: usize,
    var: bool,
}

/// Bytes before a variable-length key in its batch slot: its length.
const LEN_BYTES: usize = size_of::<u32>();

impl BatchKeys {
    /// The layout `map`'s batches use.
    pub fn of(map: &(impl Map + ?Sized)) -> Self {
        Self::for_info(&map.info(), map.caps())
    }

    fn for_info(info: &MapInfo, caps: Caps) -> Self {
        BatchKeys {
            key_size: info.key_size as usize,
            var: caps.contains(Caps::VAR_KEYS),
        }
    }

    /// Bytes per key in a batch's key buffer.
    pub fn stride(self) -> usize {
        self.key_size + if self.var { LEN_BYTES } else { 0 }
    }

    /// Key `i` of a batch's key buffer; `EINVAL` for a slot past the
    /// buffer or a variable-length key whose length is 0 or past
    /// `key_size`.
    pub fn key(self, keys: &[u8], i: usize) -> Result<&[u8]> {
        let stride = self.stride();
        let slot = keys
            .get(i * stride..(i + 1) * stride)
            .ok_or_else(|| Error::invalid(format!("batch key {i} is past the buffer")))?;
        if !self.var {
            return Ok(slot);
        }
        let (len, key) = slot.split_at(LEN_BYTES);
        let len = u32::from_ne_bytes(len.try_into().expect("4 bytes")) as usize;
        if !(1..=self.key_size).contains(&len) {
            return Err(var_key_error(len, self.key_size));
        }
        Ok(&key[..len])
    }

    /// A key buffer holding `keys` in this layout; `EINVAL` for a key
    /// this map cannot take.
    pub fn encode(self, keys: &[&[u8]]) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; keys.len() * self.stride()];
        for (i, key) in keys.iter().enumerate() {
            if !self.var {
                // A fixed-size key is the whole slot: never padded or cut.
                check_len("key", key.len(), self.key_size)?;
            }
            self.put(&mut buf, i, |out| {
                let n = key.len().min(out.len());
                out[..n].copy_from_slice(&key[..n]);
                Ok(key.len())
            })?;
        }
        Ok(buf)
    }

    /// Fills slot `i` of `keys`: `write` puts a key into the
    /// `key_size`-byte buffer it is given and returns the key's length.
    pub(crate) fn put(
        self,
        keys: &mut [u8],
        i: usize,
        write: impl FnOnce(&mut [u8]) -> Result<usize>,
    ) -> Result<()> {
        let stride = self.stride();
        let slot = &mut keys[i * stride..(i + 1) * stride];
        if !self.var {
            return write(slot).map(drop);
        }
        let (head, key) = slot.split_at_mut(LEN_BYTES);
        let len = write(key)?;
        if !(1..=self.key_size).contains(&len) {
            return Err(var_key_error(len, self.key_size));
        }
        key[len..].fill(0);
        head.copy_from_slice(&(len as u32).to_ne_bytes());
        Ok(())
    }
}

/// How many entries fit in both batch buffers; checks they hold whole
/// keys and values.
fn batch_room(info: &MapInfo, caps: Caps, keys_len: usize, values_len: usize) -> Result<usize> {
    let (ks, vs) = (
        BatchKeys::for_info(info, caps).stride(),
        info.value_size as usize,
    );
    if ks == 0 || vs == 0 {
        return Err(Error::Unsupported);
    }
    if !keys_len.is_multiple_of(ks) || !values_len.is_multiple_of(vs) {
        return Err(Error::invalid(
            "batch buffers are not a whole number of keys and values",
        ));
    }
    Ok((keys_len / ks).min(values_len / vs))
}

/// The batch capability check.
fn require_batch<T: MapOps>(more: Caps) -> Result<(), BatchError> {
    require(T::CAPS, Caps::BATCH | more).map_err(BatchError::at_start)
}

/// The checks a batch that fills key and value buffers starts with
/// (`lookup_batch`, `lookup_and_delete_batch`): `T` has `BATCH` and
/// `more`, and the buffers hold whole keys and values. Gives the map's
/// info, its batch key layout, its value size and how many entries the
/// buffers hold.
fn out_batch<T: MapOps>(
    map: &T,
    more: Caps,
    keys: &[u8],
    values: &[u8],
) -> Result<(MapInfo, BatchKeys, usize, usize), BatchError> {
    require_batch::<T>(more)?;
    let info = map.map_info();
    let room =
        batch_room(&info, T::CAPS, keys.len(), values.len()).map_err(BatchError::at_start)?;
    let layout = BatchKeys::for_info(&info, T::CAPS);
    Ok((info, layout, info.value_size as usize, room))
}

/// `map_update_elem` on each of `n` keys and values in order, the guard
/// renewed now and then: the default `map_update_batch`, and a family's
/// fallback from its own.
pub fn update_each<T: MapOps + ?Sized>(
    map: &T,
    keys: &[u8],
    values: &[u8],
    n: usize,
    flag: UpdateFlag,
) -> Result<usize, BatchError> {
    let layout = BatchKeys::for_info(&map.map_info(), T::CAPS);
    let vs = values.len() / n.max(1);
    each_pinned(n, |i, guard| {
        map.map_update_elem(layout.key(keys, i)?, &values[i * vs..][..vs], flag, guard)
    })
}

/// A family's `map_update_batch` through a bulk build that leaves what
/// [`update_each`] would: the keys up to the first one `parse` refuses
/// go to `bulk`, and the error then says where the batch stopped. A
/// bulk build is all or nothing: if `bulk` refuses the keys, they are
/// updated one by one, so the count and error are exact.
pub fn update_in_bulk<'a, T: MapOps + ?Sized, K>(
    map: &T,
    (keys, values): (&'a [u8], &'a [u8]),
    n: usize,
    flag: UpdateFlag,
    parse: impl Fn(&'a [u8]) -> Result<K>,
    bulk: impl FnOnce(Vec<(K, &'a [u8])>) -> Result<()>,
) -> Result<usize, BatchError> {
    let (ks, vs) = (keys.len() / n.max(1), values.len() / n.max(1));
    let mut parsed = Vec::with_capacity(n);
    let mut stop = None;
    for i in 0..n {
        match parse(&keys[i * ks..][..ks]) {
            Ok(key) => parsed.push((key, &values[i * vs..][..vs])),
            Err(error) => {
                stop = Some(BatchError {
                    processed: i,
                    error,
                });
                break;
            }
        }
    }
    let good = parsed.len();
    if bulk(parsed).is_err() {
        return update_each(map, &keys[..good * ks], &values[..good * vs], good, flag)
            .and_then(|done| stop.map_or(Ok(done), Err));
    }
    stop.map_or(Ok(n), Err)
}

/// `map_get_next_key` then `map_lookup_elem`, entry by entry, the guard
/// renewed now and then: the default `map_lookup_batch`. A key deleted
/// between the two steps is skipped.
pub fn lookup_each<T: MapOps + ?Sized>(
    map: &T,
    after: Option<&[u8]>,
    keys: &mut [u8],
    values: &mut [u8],
    room: usize,
) -> Result<usize, BatchError> {
    let info = map.map_info();
    let (layout, vs) = (
        BatchKeys::for_info(&info, T::CAPS),
        info.value_size as usize,
    );
    // The key to go on from, in one buffer reused for every step.
    let mut prev: Vec<u8> = after.map(<[u8]>::to_vec).unwrap_or_default();
    let mut has_prev = after.is_some();
    let mut copied = 0;
    let mut guard = pin();
    for step in 1.. {
        if copied == room {
            break;
        }
        if step % BATCH_PIN_CHUNK == 0 {
            guard.repin();
        }
        let stop = |error| BatchError {
            processed: copied,
            error,
        };
        let next = layout.put(keys, copied, |next| {
            map.map_get_next_key(has_prev.then_some(&prev[..]), next, &guard)
        });
        match next {
            Ok(()) => {}
            Err(Error::NotFound) => break,
            Err(e) => return Err(stop(e)),
        }
        let next = layout.key(keys, copied).map_err(stop)?;
        prev.clear();
        prev.extend_from_slice(next);
        has_prev = true;
        match map.map_lookup_elem(next, &mut values[copied * vs..(copied + 1) * vs], &guard) {
            Ok(()) => copied += 1,
            Err(Error::NotFound) => {}
            Err(e) => return Err(stop(e)),
        }
    }
    Ok(copied)
}

/// Runs `op` on elements `0..n` in order under a guard re-pinned every
/// [`BATCH_PIN_CHUNK`] elements; stops at the first error with how many
/// were done.
fn each_pinned(
    n: usize,
    mut op: impl FnMut(usize, &Guard) -> Result<()>,
) -> Result<usize, BatchError> {
    let mut guard = pin();
    for i in 0..n {
        if i > 0 && i % BATCH_PIN_CHUNK == 0 {
            guard.repin();
        }
        op(i, &guard).map_err(|error| BatchError {
            processed: i,
            error,
        })?;
    }
    Ok(n)
}

impl<T: MapOps> Map for T {
    #[inline(always)]
    fn info(&self) -> MapInfo {
        self.map_info()
    }

    fn caps(&self) -> Caps {
        T::CAPS
    }

    #[inline]
    fn lookup(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        if T::CAPS.contains(Caps::PUSH_PEEK) {
            check_len("key", key.len(), 0)?;
            return self.peek(value);
        }
        require(T::CAPS, Caps::LOOKUP)?;
        let info = self.map_info();
        check_key(&info, T::CAPS, key)?;
        check_value(&info, value)?;
        self.map_lookup_elem_unguarded(key, value)
    }

    fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
        if T::CAPS.contains(Caps::PUSH_PEEK) {
            check_len("key", key.len(), 0)?;
            return self.push(value, flags);
        }
        require(T::CAPS, Caps::UPDATE)?;
        let flag = UpdateFlag::from_bits(flags)?;
        let info = self.map_info();
        check_key(&info, T::CAPS, key)?;
        check_value(&info, value)?;
        self.map_update_elem(key, value, flag, &pin())
    }

    fn delete(&self, key: &[u8]) -> Result<()> {
        require(T::CAPS, Caps::DELETE)?;
        check_key(&self.map_info(), T::CAPS, key)?;
        self.map_delete_elem(key, &pin())
    }

    fn lookup_and_delete(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        require(T::CAPS, Caps::LOOKUP_AND_DELETE)?;
        let info = self.map_info();
        check_key(&info, T::CAPS, key)?;
        check_value(&info, value)?;
        self.map_lookup_and_delete_elem(key, value, &pin())
    }

    fn get_next_key(&self, key: Option<&[u8]>, next: &mut [u8]) -> Result<usize> {
        require(T::CAPS, Caps::NEXT_KEY)?;
        let info = self.map_info();
        if let Some(key) = key {
            check_key(&info, T::CAPS, key)?;
        }
        check_len("next key buffer", next.len(), info.key_size as usize)?;
        self.map_get_next_key(key, next, &pin())
    }

    fn len(&self) -> usize {
        self.map_len()
    }

    fn memory_usage(&self) -> usize {
        self.map_mem_usage()
    }

    fn push(&self, value: &[u8], flags: u64) -> Result<()> {
        require(T::CAPS, Caps::PUSH_PEEK)?;
        let flag = UpdateFlag::from_bits(flags)?;
        check_value(&self.map_info(), value)?;
        self.map_push_elem(value, flag)
    }

    fn peek(&self, value: &mut [u8]) -> Result<()> {
        require(T::CAPS, Caps::PUSH_PEEK)?;
        check_value(&self.map_info(), value)?;
        self.map_peek_elem(value)
    }

    fn lookup_batch(
        &self,
        after: Option<&[u8]>,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<usize, BatchError> {
        let (info, _, _, room) = out_batch(self, Caps::NEXT_KEY | Caps::LOOKUP, keys, values)?;
        if let Some(after) = after {
            check_key(&info, T::CAPS, after).map_err(BatchError::at_start)?;
        }
        self.map_lookup_batch(after, keys, values, room)
    }

    fn lookup_and_delete_batch(
        &self,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<usize, BatchError> {
        let (_, layout, vs, room) =
            out_batch(self, Caps::NEXT_KEY | Caps::LOOKUP_AND_DELETE, keys, values)?;
        let mut moved = 0;
        let mut guard = pin();
        while moved < room {
            if moved > 0 && moved % BATCH_PIN_CHUNK == 0 {
                guard.repin();
            }
            let stop = |error| BatchError {
                processed: moved,
                error,
            };
            match layout.put(keys, moved, |key| self.map_get_next_key(None, key, &guard)) {
                Ok(()) => {}
                Err(Error::NotFound) => break,
                Err(e) => return Err(stop(e)),
            }
            let key = layout.key(keys, moved).map_err(stop)?;
            let value = &mut values[moved * vs..(moved + 1) * vs];
            match self.map_lookup_and_delete_elem(key, value, &guard) {
                Ok(()) => moved += 1,
                Err(Error::NotFound) => {} // raced with another deleter
                Err(e) => return Err(stop(e)),
            }
        }
        Ok(moved)
    }

    fn update_batch(&self, keys: &[u8], values: &[u8], flags: u64) -> Result<usize, BatchError> {
        require_batch::<T>(Caps::UPDATE)?;
        let flag = UpdateFlag::from_bits(flags).map_err(BatchError::at_start)?;
        let info = self.map_info();
        let (ks, vs) = (
            BatchKeys::for_info(&info, T::CAPS).stride(),
            info.value_size as usize,
        );
        let n =
            batch_room(&info, T::CAPS, keys.len(), values.len()).map_err(BatchError::at_start)?;
        if keys.len() != n * ks || values.len() != n * vs {
            return Err(BatchError::at_start(Error::invalid(
                "batch keys and values hold different counts",
            )));
        }
        self.map_update_batch(keys, values, n, flag)
    }

    fn delete_batch(&self, keys: &[u8]) -> Result<usize, BatchError> {
        require_batch::<T>(Caps::DELETE)?;
        let layout = BatchKeys::for_info(&self.map_info(), T::CAPS);
        let ks = layout.stride();
        if ks == 0 || !keys.len().is_multiple_of(ks) {
            return Err(BatchError::at_start(Error::invalid(
                "batch keys are not a whole number of keys",
            )));
        }
        each_pinned(keys.len() / ks, |i, guard| {
            self.map_delete_elem(layout.key(keys, i)?, guard)
        })
    }
}
