//! `BPF_MAP_TYPE_STACK_TRACE`: stack traces interned to 32-bit ids, with the
//! kernel's semantics (`kernel/bpf/stackmap.c`).
//!
//! # What
//! A profiler's BPF program calls `bpf_get_stackid(ctx, map, flags)` on every
//! sample: the kernel walks the stack, hashes the frame addresses and stores
//! the trace in the bucket the hash selects; the bucket index is the stack
//! id, which the program counts in a hash map. Userspace later reads each id
//! back with `lookup`. Here the caller supplies the frames
//! ([`StackTraceMap::get_stackid`]), and the rest is the kernel's algorithm.
//!
//! # Terms and layout
//! - *frames*: up to `max_depth` `u64` instruction addresses, innermost
//!   first. `value_size` is `8 * max_depth`; `max_depth` is 1..=127 (the
//!   kernel's default `sysctl_perf_event_max_stack`).
//! - *bucket*: one slot per id; `max_entries` rounded up to a power of two
//!   of them. A bucket holds at most one stack, with its full 32-bit hash.
//!
//! ```text
//!  buckets (8 B each)       Stack (24 B)            frames (8 B * len)
//!  +------+------+-----+    +------+-------------+   +----+----+-----+
//!  | null | ptr  | ... | -> | hash | frames: ptr | ->| ip | ip | ... |
//!  +------+------+-----+    |      | len         |   +----+----+-----+
//!     id 0  id 1            +------+-------------+
//! ```
//!
//! # `get_stackid`, step by step (the kernel's `__bpf_get_stackid`)
//! 1. Drop the first `flags & BPF_F_SKIP_FIELD_MASK` frames, keep at most
//!    `max_depth` of the rest (the kernel asks perf for no more than that, so
//!    deeper frames are truncated, not an error). Nothing left: `EINVAL`
//!    (the kernel says `EFAULT`, which [`Error`] has no variant for).
//! 2. `hash = jhash2(frames as u32 words, 0)` (or the [`StackHash`] chosen),
//!    `id = hash & (buckets - 1)`.
//! 3. The bucket holds a stack with this hash and `BPF_F_FAST_STACK_CMP` is
//!    set, or holds these very frames: return `id`.
//! 4. The bucket holds another stack and `BPF_F_REUSE_STACKID` is not set:
//!    `EEXIST`, and the [`collisions`](StackTraceMap::collisions) counter
//!    goes up: that sample's stack is lost.
//! 5. Otherwise store the frames in the bucket (replacing any old stack) and
//!    return `id`.
//!
//! # Invariants
//! 1. A published `Stack` is never written; replacing a bucket's stack swaps
//!    in a fresh allocation, so a reader sees the old stack or the new one
//!    whole, never a mix.
//! 2. A stack unlinked from its bucket is freed only after every thread
//!    pinned at unlink time has unpinned (epoch reclamation).
//! 3. Every stored stack's `hash & mask` is its bucket index.
//! 4. At most `max_entries` buckets are occupied (`len`): storing into an
//!    empty bucket reserves a slot first; a full map answers `ENOMEM`, as the
//!    kernel's preallocated free list does when it runs dry.
//!
//! # Concurrency
//! Everything is lock-free. Readers ([`get`](StackTraceMap::get),
//! `lookup`, `get_next_key`) pin an epoch and `Acquire`-load a bucket
//! pointer. `get_stackid` decides on the stack it loaded and installs its
//! own with one compare-and-swap (`AcqRel`, pairing with the readers'
//! `Acquire`); if another writer changed the bucket in between, the CAS
//! fails and the decision is taken again on the new contents, so a call
//! never overwrites a stack it did not compare against. `delete` swaps the
//! bucket to null. Old stacks go to `Guard::defer_destroy`.
//!
//! # Differences from the kernel
//! - The kernel stores with an unconditional `xchg`, so two CPUs storing
//!   different stacks into one empty bucket both "succeed" and one id then
//!   names the other's stack; here the loser sees the winner's stack and
//!   answers as step 3 or 4 says.
//! - Stacks are allocated on demand instead of from a preallocated free
//!   list; replacing a stack with `BPF_F_REUSE_STACKID` therefore never fails
//!   for lack of memory, which the kernel's can when the list is empty.
//! - `lookup_and_delete` works (the kernel answers `EOPNOTSUPP`), and
//!   `BPF_F_USER_STACK` is accepted and ignored (the caller chose the frames).
//! - Optional hashes: xxh3 and SipHash-1-3 ([`StackHash`]).
//!
//! # Example
//! ```
//! use bpfmaps::stackmap::StackTraceMap;
//! use bpfmaps::{Map, Error, BPF_F_REUSE_STACKID};
//!
//! let map = StackTraceMap::new(4, 1024).unwrap();
//! let id = map.get_stackid(&[0xffff_1000, 0xffff_2000], 0).unwrap();
//! assert_eq!(map.get_stackid(&[0xffff_1000, 0xffff_2000], 0), Ok(id)); // same stack, same id
//!
//! let mut value = [0u8; 32]; // value_size = 8 * max_depth
//! map.lookup(&id.to_ne_bytes(), &mut value).unwrap();
//! assert_eq!(&value[..8], &0xffff_1000u64.to_ne_bytes());
//! assert_eq!(&value[16..], &[0u8; 16]); // zero-padded
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_epoch::{Atomic, Owned, Shared};
use siphasher::sip::SipHasher13;

use crate::core::contract::{Caps, MapInfo, MapOps, MapSpec, MapType};
use crate::core::error::{Error, Result};
use crate::core::family::{Family, KeyKind, SizeRule};
use crate::core::flags::{BPF_F_FAST_STACK_CMP, BPF_F_REUSE_STACKID, UpdateFlag};
use crate::core::reclaim::{Guard, drop_in_background, pin};
use crate::hash::{jhash2, xxh3};

impl MapType {
    /// `BPF_MAP_TYPE_STACK_TRACE`.
    pub const STACK_TRACE: MapType = MapType(7);
}

/// `BPF_MAP_TYPE_STACK_TRACE`, for the registry: 4-byte ids, values of
/// `8 * max_depth` bytes, no flags, no extra (the kernel's
/// `stack_map_alloc`).
pub const STACK_TRACE_FAMILY: Family = Family {
    map_type: MapType::STACK_TRACE,
    name: "stack_trace",
    map_flags: 0,
    map_extra: 0,
    key_size: SizeRule::exactly(4),
    value_size: SizeRule::multiples(
        FRAME_SIZE as u32,
        FRAME_SIZE as u32,
        MAX_DEPTH * FRAME_SIZE as u32,
    ),
    keys: KeyKind::Index,
    sample_layout: None,
    build: |spec| Ok(Box::new(StackTraceMap::from_spec(spec)?)),
};

/// Deepest stack a map may hold: the kernel's default
/// `sysctl_perf_event_max_stack`.
pub const MAX_DEPTH: u32 = 127;
/// `BPF_F_SKIP_FIELD_MASK`: the low 8 bits of `get_stackid` flags are the
/// number of innermost frames to skip.
pub const BPF_F_SKIP_FIELD_MASK: u64 = 0xff;
/// `BPF_F_USER_STACK`: in the kernel, walk the user stack. Accepted and
/// ignored here: the caller supplies the frames.
pub const BPF_F_USER_STACK: u64 = 1 << 8;

/// Every flag `get_stackid` accepts.
const GET_STACKID_FLAGS: u64 =
    BPF_F_SKIP_FIELD_MASK | BPF_F_USER_STACK | BPF_F_FAST_STACK_CMP | BPF_F_REUSE_STACKID;
/// Bytes per frame.
const FRAME_SIZE: usize = size_of::<u64>();
/// Most buckets (`max_entries` above this is `E2BIG`, as the kernel).
const MAX_BUCKETS: u32 = 1 << 31;

/// The hash that picks a stack's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StackHash {
    /// The kernel: `jhash2` over the frames as native 32-bit words, seed 0.
    #[default]
    Jhash2,
    /// xxh3 over the frame bytes, seed 0.
    Xxh3,
    /// SipHash-1-3 over the frame bytes, with a random key per map (stack
    /// ids an attacker cannot aim at one bucket).
    SipHash,
}

/// The hasher instance: `StackHash` plus the key it needs.
#[derive(Debug, Clone)]
enum Hasher {
    Jhash2,
    Xxh3,
    Sip(SipHasher13),
}

impl Hasher {
    fn new(kind: StackHash) -> Self {
        match kind {
            StackHash::Jhash2 => Hasher::Jhash2,
            StackHash::Xxh3 => Hasher::Xxh3,
            StackHash::SipHash => {
                Hasher::Sip(SipHasher13::new_with_keys(rand::random(), rand::random()))
            }
        }
    }

    fn kind(&self) -> StackHash {
        match self {
            Hasher::Jhash2 => StackHash::Jhash2,
            Hasher::Xxh3 => StackHash::Xxh3,
            Hasher::Sip(_) => StackHash::SipHash,
        }
    }

    #[inline]
    fn hash(&self, frames: &[u64]) -> u32 {
        match self {
            // The kernel's `jhash2((u32 *)ips, trace_len / sizeof(u32), 0)`.
            Hasher::Jhash2 => jhash2(bytemuck::cast_slice(frames), 0),
            Hasher::Xxh3 => xxh3(bytemuck::cast_slice(frames), 0),
            Hasher::Sip(sip) => sip.hash(bytemuck::cast_slice(frames)) as u32,
        }
    }
}

/// One stored stack trace. Immutable once published (invariant 1).
struct Stack {
    /// The full 32-bit hash of `frames`.
    hash: u32,
    frames: Box<[u64]>,
}

/// The bucket array. Owns the stacks still linked in it and frees them when
/// dropped.
#[derive(Default)]
struct Buckets(Box<[Atomic<Stack>]>);

impl Drop for Buckets {
    fn drop(&mut self) {
        for slot in std::mem::take(&mut self.0) {
            // SAFETY: we own the array, so no thread can reach these stacks
            // any more; a stack still linked was never retired (unlinking
            // and retiring go together), so it is freed exactly once, here.
            drop(unsafe { slot.try_into_owned() });
        }
    }
}

/// `BPF_MAP_TYPE_STACK_TRACE`: interns stack traces to bucket ids.
/// Lock-free readers and writers.
pub struct StackTraceMap {
    buckets: Buckets,
    /// `buckets - 1`.
    mask: u32,
    max_depth: u32,
    info: MapInfo,
    hasher: Hasher,
    /// Occupied buckets plus in-flight reservations (invariant 4).
    len: AtomicUsize,
    /// Frames held by linked stacks, for `memory_usage`.
    frames: AtomicUsize,
    /// `get_stackid` calls that answered `EEXIST`.
    collisions: AtomicU64,
}

impl std::fmt::Debug for StackTraceMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackTraceMap")
            .field("max_depth", &self.max_depth)
            .field("max_entries", &self.info.max_entries)
            .field("buckets", &self.buckets.0.len())
            .field("hash", &self.hasher.kind())
            .field("stacks", &self.stacks())
            .field("collisions", &self.collisions())
            .finish()
    }
}

impl StackTraceMap {
    /// A map of stacks up to `max_depth` frames (1..=127) with
    /// `max_entries` ids (rounded up to a power of two of buckets), hashed
    /// as the kernel does.
    pub fn new(max_depth: u32, max_entries: u32) -> Result<Self> {
        Self::with_hash(max_depth, max_entries, StackHash::default())
    }

    /// As [`new`](Self::new) with a choice of hash.
    ///
    /// ```
    /// use bpfmaps::stackmap::{StackHash, StackTraceMap};
    ///
    /// let map = StackTraceMap::with_hash(8, 100, StackHash::Xxh3).unwrap();
    /// assert_eq!(map.bucket_count(), 128);
    /// assert_eq!(StackTraceMap::with_hash(128, 100, StackHash::Xxh3).unwrap_err().errno(), 22);
    /// ```
    pub fn with_hash(max_depth: u32, max_entries: u32, hash: StackHash) -> Result<Self> {
        if !(1..=MAX_DEPTH).contains(&max_depth) {
            return Err(Error::invalid(format!(
                "stack map max_depth {max_depth}: expected 1..={MAX_DEPTH}"
            )));
        }
        if max_entries == 0 {
            return Err(Error::invalid("stack map max_entries must be non-zero"));
        }
        if max_entries > MAX_BUCKETS {
            return Err(Error::Full); // E2BIG, as the kernel
        }
        let n = max_entries.next_power_of_two() as usize;
        let mut buckets = Vec::new();
        buckets.try_reserve_exact(n).map_err(|_| Error::NoMemory)?;
        buckets.resize_with(n, Atomic::null);
        Ok(StackTraceMap {
            buckets: Buckets(buckets.into_boxed_slice()),
            mask: (n - 1) as u32,
            max_depth,
            info: MapInfo {
                map_type: MapType::STACK_TRACE,
                key_size: 4,
                value_size: max_depth * FRAME_SIZE as u32,
                max_entries,
                map_flags: 0,
                map_extra: 0,
            },
            hasher: Hasher::new(hash),
            len: AtomicUsize::new(0),
            frames: AtomicUsize::new(0),
            collisions: AtomicU64::new(0),
        })
    }

    /// Builds from a spec that passed [`STACK_TRACE_FAMILY`]'s checks.
    fn from_spec(spec: &MapSpec) -> Result<Self> {
        Self::new(spec.value_size / FRAME_SIZE as u32, spec.max_entries)
    }

    /// `bpf_get_stackid`: the id of `frames` (innermost first), storing
    /// them if new. See the module docs for the algorithm and flags.
    ///
    /// Errors: `EINVAL` for unknown flags or nothing left after skipping;
    /// `EEXIST` when the bucket holds another stack and
    /// `BPF_F_REUSE_STACKID` is not set (counted in
    /// [`collisions`](Self::collisions)); `ENOMEM` when `max_entries` buckets
    /// are already occupied. No error changes the map.
    ///
    /// ```
    /// use bpfmaps::stackmap::StackTraceMap;
    ///
    /// let map = StackTraceMap::new(2, 16).unwrap();
    /// // Deeper stacks are truncated to max_depth, as the kernel does.
    /// let id = map.get_stackid(&[1, 2, 3], 0).unwrap();
    /// assert_eq!(map.get_stackid(&[1, 2], 0), Ok(id));
    /// // The low 8 flag bits skip innermost frames.
    /// assert_eq!(map.get_stackid(&[9, 1, 2], 1), Ok(id));
    /// assert_eq!(map.get_stackid(&[], 0).unwrap_err().errno(), 22);
    /// ```
    pub fn get_stackid(&self, frames: &[u64], flags: u64) -> Result<u32> {
        if flags & !GET_STACKID_FLAGS != 0 {
            return Err(Error::invalid(format!(
                "get_stackid flags {:#x} unknown",
                flags & !GET_STACKID_FLAGS
            )));
        }
        let skip = (flags & BPF_F_SKIP_FIELD_MASK) as usize;
        if frames.len() <= skip {
            return Err(Error::invalid("no frames left after skipping"));
        }
        let ips = &frames[skip..];
        let ips = &ips[..ips.len().min(self.max_depth as usize)];
        let hash = self.hasher.hash(ips);
        let id = hash & self.mask;
        let slot = &self.buckets.0[id as usize];

        let guard = pin();
        let mut new: Option<Owned<Stack>> = None;
        // Pairs with the successful CAS below (and in other writers): the
        // stack's fields are visible before we read them.
        let mut cur = slot.load(Ordering::Acquire, &guard);
        loop {
            // SAFETY: loaded under `guard`; stacks are freed only through
            // `defer_destroy` after being unlinked (invariant 2).
            let old_len = match unsafe { cur.as_ref() } {
                Some(old) => {
                    if old.hash == hash
                        && (flags & BPF_F_FAST_STACK_CMP != 0 || *old.frames == *ips)
                    {
                        return Ok(id);
                    }
                    if flags & BPF_F_REUSE_STACKID == 0 {
                        self.collisions.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::Exists);
                    }
                    Some(old.frames.len())
                }
                None => {
                    if !self.reserve() {
                        return Err(Error::NoMemory);
                    }
                    None
                }
            };
            let stack = new.take().unwrap_or_else(|| {
                Owned::new(Stack {
                    hash,
                    frames: ips.into(),
                })
            });
            // Counted before the CAS so that a racing `remove` of this very
            // stack (which happens after the CAS) never drives it below 0.
            self.frames.fetch_add(ips.len(), Ordering::Relaxed);
            // Release publishes the new stack's fields to readers' Acquire
            // loads; Acquire on failure reads the winner's stack.
            match slot.compare_exchange(cur, stack, Ordering::AcqRel, Ordering::Acquire, &guard) {
                Ok(_) => {
                    if let Some(old_len) = old_len {
                        self.frames.fetch_sub(old_len, Ordering::Relaxed);
                        // SAFETY: `cur` was just unlinked by our CAS, so no
                        // new reader can reach it, and it is retired once.
                        unsafe { guard.defer_destroy(cur) };
                    }
                    return Ok(id);
                }
                Err(lost) => {
                    self.frames.fetch_sub(ips.len(), Ordering::Relaxed);
                    if old_len.is_none() {
                        self.len.fetch_sub(1, Ordering::Relaxed); // the reservation
                    }
                    new = Some(lost.new);
                    cur = lost.current;
                }
            }
        }
    }

    /// The frames stored under `id`, borrowed while `guard` is pinned
    /// (without the zero padding `lookup` adds). Lock-free.
    ///
    /// ```
    /// use bpfmaps::stackmap::StackTraceMap;
    ///
    /// let map = StackTraceMap::new(8, 64).unwrap();
    /// let id = map.get_stackid(&[10, 20, 30], 0).unwrap();
    /// let guard = bpfmaps::pin();
    /// assert_eq!(map.get(id, &guard), Some(&[10, 20, 30][..]));
    /// ```
    #[inline]
    pub fn get<'g>(&'g self, id: u32, guard: &'g Guard) -> Option<&'g [u64]> {
        let slot = self.buckets.0.get(id as usize)?;
        // SAFETY: loaded under `guard` (invariant 2); pairs with the
        // writers' Release CAS, so the stack is seen whole (invariant 1).
        let stack = unsafe { slot.load(Ordering::Acquire, guard).as_ref() }?;
        Some(&stack.frames)
    }

    /// How many `get_stackid` calls answered `EEXIST`: samples whose stack
    /// was lost to a bucket collision. Size the map up if this grows.
    pub fn collisions(&self) -> u64 {
        self.collisions.load(Ordering::Relaxed)
    }

    /// Occupied buckets (stored stacks).
    pub fn stacks(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Deepest stack stored, in frames (`value_size / 8`).
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }

    /// Number of buckets (ids are `0..bucket_count()`).
    pub fn bucket_count(&self) -> u32 {
        self.mask + 1
    }

    /// The hash in use.
    pub fn hash(&self) -> StackHash {
        self.hasher.kind()
    }

    /// The full 32-bit hash of `frames` (after any skipping and truncation
    /// the caller wants); `hash & (bucket_count() - 1)` is their id.
    pub fn stack_hash(&self, frames: &[u64]) -> u32 {
        self.hasher.hash(frames)
    }

    /// Reserves room for one more occupied bucket; `false` when full.
    fn reserve(&self) -> bool {
        let max = self.info.max_entries as usize;
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Decodes a (size-checked) 4-byte key into a bucket index, if in range.
    fn id(&self, key: &[u8]) -> Option<usize> {
        let id = u32::from_ne_bytes(key.try_into().expect("checked: 4 bytes")) as usize;
        (id < self.buckets.0.len()).then_some(id)
    }

    /// Unlinks the stack in bucket `id`, copying it into `out` if given.
    fn remove(&self, id: usize, out: Option<&mut [u8]>, guard: &Guard) -> Result<()> {
        let old = self.buckets.0[id].swap(Shared::null(), Ordering::AcqRel, guard);
        // SAFETY: loaded under `guard` (invariant 2).
        let stack = unsafe { old.as_ref() }.ok_or(Error::NotFound)?;
        if let Some(out) = out {
            copy_padded(&stack.frames, out);
        }
        self.len.fetch_sub(1, Ordering::Relaxed);
        self.frames.fetch_sub(stack.frames.len(), Ordering::Relaxed);
        // SAFETY: our swap unlinked it; nobody else can retire it.
        unsafe { guard.defer_destroy(old) };
        Ok(())
    }
}

/// Copies `frames` into `out` as native-endian bytes, zero-filling the rest.
fn copy_padded(frames: &[u64], out: &mut [u8]) {
    let (head, tail) = out.split_at_mut(frames.len() * FRAME_SIZE);
    head.copy_from_slice(bytemuck::cast_slice(frames));
    tail.fill(0);
}

/// The kernel's `stack_trace_map_ops`, plus lookup-and-delete and the
/// generic batches.
impl MapOps for StackTraceMap {
    const CAPS: Caps = Caps::KEYED.union(Caps::LOOKUP_AND_DELETE);
    fn map_info(&self) -> MapInfo {
        self.info
    }
    /// Occupied buckets.
    fn map_len(&self) -> usize {
        self.stacks()
    }
    /// The struct, the bucket array and the stored stacks.
    fn map_mem_usage(&self) -> usize {
        size_of::<Self>()
            + size_of_val::<[Atomic<Stack>]>(&self.buckets.0)
            + self.stacks() * size_of::<Stack>()
            + self.frames.load(Ordering::Relaxed) * FRAME_SIZE
    }
    /// Copies the frames of stack `id` into `value`, zero-padded;
    /// `ENOENT` for an empty bucket or an id beyond the buckets.
    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
        let frames = self
            .id(key)
            .and_then(|id| self.get(id as u32, guard))
            .ok_or(Error::NotFound)?;
        copy_padded(frames, value);
        Ok(())
    }
    /// `EINVAL`: stacks are stored only by `get_stackid`, as the kernel.
    fn map_update_elem(&self, _: &[u8], _: &[u8], _: UpdateFlag, _: &Guard) -> Result<()> {
        Err(Error::invalid(
            "stack map: stacks are stored by get_stackid",
        ))
    }
    /// Frees bucket `id`: `ENOENT` if empty, `E2BIG` for an id beyond the
    /// buckets (as the kernel).
    fn map_delete_elem(&self, key: &[u8], guard: &Guard) -> Result<()> {
        self.remove(self.id(key).ok_or(Error::Full)?, None, guard)
    }
    fn map_lookup_and_delete_elem(
        &self,
        key: &[u8],
        value: &mut [u8],
        guard: &Guard,
    ) -> Result<()> {
        self.remove(self.id(key).ok_or(Error::NotFound)?, Some(value), guard)
    }
    /// The next occupied id after `key`, in increasing order; no key, or a
    /// key naming an empty bucket, gives the first occupied id (the kernel's
    /// `stack_map_get_next_key`).
    fn map_get_next_key(
        &self,
        key: Option<&[u8]>,
        next: &mut [u8],
        guard: &Guard,
    ) -> Result<usize> {
        let start = match key.and_then(|key| self.id(key)) {
            Some(id) if self.get(id as u32, guard).is_some() => id + 1,
            _ => 0,
        };
        let found = self.buckets.0[start.min(self.buckets.0.len())..]
            .iter()
            .position(|slot| !slot.load(Ordering::Acquire, guard).is_null())
            .ok_or(Error::NotFound)?;
        next.copy_from_slice(&((start + found) as u32).to_ne_bytes());
        Ok(next.len())
    }
}

impl Drop for StackTraceMap {
    fn drop(&mut self) {
        // Stacks still linked are freed on the reaper thread (see
        // `core::reclaim`); retired ones by the epoch collector.
        drop_in_background(std::mem::take(&mut self.buckets));
    }
}

#[cfg(test)]
mod tests;
