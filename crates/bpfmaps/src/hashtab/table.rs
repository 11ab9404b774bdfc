//! The raw table shared by `HashMap` and `LruHashMap`: buckets of chains of
//! slab elements, lock-free readers, per-bucket writer locks.
//!
//! Invariants:
//! 1. A bucket chain holds only live elements; an element is in at most one
//!    chain; every element in bucket `b` has `hash & mask == b`.
//! 2. A reachable element is never written: an update builds a new element
//!    and swaps it into the chain (one `Release` store), so a reader sees the
//!    old value or the new one, never a mix.
//! 3. An unlinked element keeps its `next` until no reader pinned at unlink
//!    time remains (epoch grace period); only then is it reused.
//! 4. `len` counts linked elements and never exceeds `max_entries`: a new
//!    key reserves its slot before it is linked.
//! 5. Every unlink (delete, replacement, eviction) bumps its lock stripe's
//!    `unlinks` count with a release store before the element is retired.
//!
//! Readers come in two kinds. Pinned ones (`find`, `get`) borrow elements
//! for their guard's lifetime (invariants 2 and 3). Unpinned ones
//! (`read_unpinned`, the byte contract's `Map::lookup`) skip the pin's
//! fence and copy the value out instead: slab memory is never freed while
//! the table lives, so following a stale pointer is harmless, and a walk
//! during which the stripe's `unlinks` did not change saw no element of
//! its bucket unlinked, so none recycled (invariants 3 and 5). They check
//! after every element and start again if it changed; after a few walks
//! cut short that way, they pin and walk once more as pinned readers do.

use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};

use parking_lot::{Mutex, MutexGuard};

use super::slab::{ElemHeader, ElemLayout, ElemPtr, Slab, WordKey};
use crate::core::bytes;
use crate::core::error::{Error, Result};
use crate::core::flags::UpdateFlag;
use crate::core::prefetch::prefetch;
use crate::core::reclaim::{Guard, pin};
use crate::hash::HashPolicy;

/// Buckets a batch walk reads at a time (`lookup_batch`). 16, 32 and 64
/// walked a 100K-entry map equally fast (docs/benchmarks.md, "The batch
/// walk in windows").
const WALK_WINDOW: usize = 32;

/// Where a batch walk copies its entries, back to back. `K` and `V` are
/// the key and value sizes when the walk was compiled for them (0: read
/// from `layout`): with the sizes known, a copy is a load and a store,
/// and the walk took 3.5 ns an entry in cache against 6.6 with the sizes
/// read at run time, 9.1 against 12.0 at 100K entries (SZ1-SZ5 in
/// docs/benchmarks.md, "Native pairs, and the string maps' batches").
///
/// The slots are written through pointers whose room was checked once
/// (`new`): indexing checked each slot's bounds, four branches and the
/// buffers' lengths reloaded from the stack an entry, 24 instructions an
/// entry's copy against 14 (docs/benchmarks.md, "The batch walk's
/// copies").
struct BatchOut<'a, const K: usize, const V: usize> {
    /// The next key's and value's slots, and how many of each are left.
    /// `left` shadows the walk's own count (`room - copied`), and the
    /// test on it is the faster: checking `copied == room` instead took
    /// 4 fewer instructions an entry but 6.2 ns an entry at 10K against
    /// 5.6 (six runs in turns; the room was read from the stack;
    /// docs/benchmarks.md, "The batch walk's copies").
    keys: *mut u8,
    values: *mut u8,
    left: usize,
    layout: ElemLayout,
    buffers: PhantomData<&'a mut [u8]>,
}

impl<'a, const K: usize, const V: usize> BatchOut<'a, K, V> {
    /// `room` slots of `keys` and `values`, back to back from their
    /// starts; panics if they do not hold them (the callers size them).
    fn new(keys: &'a mut [u8], values: &'a mut [u8], layout: ElemLayout, room: usize) -> Self {
        let fits =
            |buffer: &[u8], size: usize| room.checked_mul(size).is_some_and(|n| n <= buffer.len());
        assert!(
            fits(keys, layout.key_size) && fits(values, layout.value_size),
            "batch buffers smaller than their room"
        );
        BatchOut {
            keys: keys.as_mut_ptr(),
            values: values.as_mut_ptr(),
            left: room,
            layout,
            buffers: PhantomData,
        }
    }

    /// Copies the chain from `p` on, counting in `copied`; false once
    /// the room is full. Inlined: without it the walk of 100K entries
    /// took 2-5 % longer (three runs of `hash_batch_walk`).
    #[inline(always)]
    fn chain(&mut self, mut p: *mut ElemHeader, copied: &mut usize) -> bool {
        while let Some(e) = ptr::NonNull::new(p) {
            if self.left == 0 {
                return false;
            }
            let e = ElemPtr(e);
            // SAFETY: reachable under the walk's guard; a reachable
            // element's key and value are never written (invariant 2).
            unsafe {
                self.copy(e.key(&self.layout), e.value(&self.layout));
                p = e.header().next.load(Ordering::Acquire);
            }
            *copied += 1;
        }
        true
    }

    /// Copies a key and a value into the next slots (`left > 0`).
    #[inline(always)]
    fn copy(&mut self, key: &[u8], value: &[u8]) {
        let (ks, vs) = match K == 0 || V == 0 {
            true => (self.layout.key_size, self.layout.value_size),
            false => (K, V),
        };
        debug_assert!(self.left > 0 && key.len() == ks && value.len() == vs);
        // SAFETY: `left > 0` slots of `ks` and `vs` bytes remain from
        // `keys` and `values` (`new`); an element's key and value have
        // the layout's sizes, `K` and `V` when they are not 0.
        unsafe {
            if K == 0 || V == 0 {
                bytes::copy(std::slice::from_raw_parts_mut(self.keys, ks), key);
                bytes::copy(std::slice::from_raw_parts_mut(self.values, vs), value);
            } else {
                ptr::copy_nonoverlapping(key.as_ptr(), self.keys, K);
                ptr::copy_nonoverlapping(value.as_ptr(), self.values, V);
            }
            self.keys = self.keys.add(ks);
            self.values = self.values.add(vs);
        }
        self.left -= 1;
    }
}

/// `lookup_batch`'s arguments: after, keys, values, room, repin_every.
type BatchArgs<'a> = (Option<&'a [u8]>, &'a mut [u8], &'a mut [u8], usize, usize);

/// The first elements of a window's non-empty buckets, in bucket order.
type Firsts = [*mut ElemHeader; WALK_WINDOW];

/// One hash bucket: its chain head and the stripe its writers lock. Heads
/// are a dense array of pointers (8 bytes a bucket, all a pinned reader
/// touches); stripes are at most `MAX_LOCKS`.
#[derive(Clone, Copy)]
struct Bucket<'a> {
    head: &'a AtomicPtr<ElemHeader>,
    stripe: &'a Stripe,
}

/// The writers' lock for a set of buckets, and how many elements were
/// unlinked from them so far (invariant 5; written under the lock).
#[derive(Default)]
struct Stripe {
    lock: Mutex<()>,
    unlinks: AtomicU64,
}

impl Stripe {
    /// Counts an unlink done under `_lock` (invariant 5).
    fn count_unlink(&self, _lock: &MutexGuard<'_, ()>) {
        let n = self.unlinks.load(Ordering::Relaxed);
        self.unlinks.store(n + 1, Ordering::Release);
    }
}

/// Walks without a pin a lookup tries before it pins one: a stripe whose
/// writers unlink during every walk would otherwise starve it.
const UNPINNED_WALKS: usize = 4;

/// Lock stripes: enough that writers on two cores rarely meet.
const MAX_LOCKS: usize = 4096;

/// Construction options for a raw table.
#[derive(Debug, Clone, Copy)]
pub(super) struct TableOptions {
    pub key_size: usize,
    pub value_size: usize,
    pub max_entries: usize,
    pub prealloc: bool,
    pub policy: HashPolicy,
    pub seed: u32,
}

/// What an update did to an existing element.
pub(super) enum Replaced {
    /// The key was new.
    Inserted,
    /// An older element was swapped out.
    Updated,
}

pub(super) struct RawTable {
    heads: Box<[AtomicPtr<ElemHeader>]>,
    stripes: Box<[Stripe]>,
    mask: usize,
    slab: Arc<Slab>,
    len: AtomicUsize,
    pub max_entries: usize,
    pub policy: HashPolicy,
    seed: u32,
    /// Keys of at most 16 bytes and values of at most 64: longer ones are
    /// compared and copied faster by `memcmp`/`memcpy` under a pin than
    /// word by word with atomic loads (docs/benchmarks.md).
    reads_unpinned: bool,
}

impl RawTable {
    pub fn new(opts: TableOptions) -> Result<Self> {
        if opts.key_size == 0 || opts.value_size == 0 || opts.max_entries == 0 {
            return Err(Error::invalid(
                "key_size, value_size and max_entries must be non-zero",
            ));
        }
        if opts.key_size > 512 {
            return Err(Error::invalid("key_size above 512 bytes (the BPF stack)"));
        }
        if opts.value_size > (1 << 20) {
            return Err(Error::invalid("value_size above 1 MiB"));
        }
        // As the kernel: one bucket per entry, rounded up to a power of two.
        let n_buckets = opts
            .max_entries
            .checked_next_power_of_two()
            .ok_or(Error::NoMemory)?;
        let heads = (0..n_buckets)
            .map(|_| AtomicPtr::new(ptr::null_mut()))
            .collect();
        let stripes = (0..n_buckets.min(MAX_LOCKS))
            .map(|_| Stripe::default())
            .collect();
        let layout = ElemLayout::new(opts.key_size, opts.value_size);
        let (prealloc, grow_by) = if opts.prealloc {
            // Slack for elements waiting out their grace period.
            (opts.max_entries, (opts.max_entries / 32).max(16))
        } else {
            (0, (opts.max_entries / 64).clamp(16, 4096))
        };
        Ok(RawTable {
            heads,
            stripes,
            mask: n_buckets - 1,
            slab: Arc::new(Slab::new(layout, prealloc, grow_by)?),
            len: AtomicUsize::new(0),
            max_entries: opts.max_entries,
            policy: opts.policy,
            seed: opts.seed,
            reads_unpinned: opts.key_size <= 16 && opts.value_size <= 64,
        })
    }

    #[inline]
    pub fn layout(&self) -> &ElemLayout {
        &self.slab.layout
    }

    #[inline]
    pub fn hash(&self, key: &[u8]) -> u32 {
        self.policy.hash(key, self.seed)
    }

    #[inline]
    fn bucket(&self, hash: u32) -> Bucket<'_> {
        let i = hash as usize & self.mask;
        // The stripe count is a power of two no larger than the bucket count.
        Bucket {
            head: &self.heads[i],
            stripe: &self.stripes[i & (self.stripes.len() - 1)],
        }
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Finds the element holding `key`. Lock-free: never waits for a writer.
    ///
    /// Keys are compared after the stored hash matches, so the comparison
    /// almost always succeeds: `bytes::equal` avoids a `memcmp` call for the
    /// common small sizes.
    #[inline]
    pub fn find(&self, key: &[u8], hash: u32, _guard: &Guard) -> Option<ElemPtr> {
        let layout = self.layout();
        let mut p = self.heads[hash as usize & self.mask].load(Ordering::Acquire);
        while let Some(e) = ptr::NonNull::new(p) {
            let e = ElemPtr(e);
            // SAFETY: reachable under the pinned guard (invariant 3).
            let h = unsafe { e.header() };
            // SAFETY: as above; keys of reachable elements are immutable.
            if h.hash.load(Ordering::Relaxed) == hash && bytes::equal(unsafe { e.key(layout) }, key)
            {
                return Some(e);
            }
            p = h.next.load(Ordering::Acquire);
        }
        None
    }

    /// The value bytes of `key`, borrowed for the guard's lifetime.
    #[inline]
    pub fn get<'g>(&self, key: &[u8], guard: &'g Guard) -> Option<&'g [u8]> {
        let e = self.find(key, self.hash(key), guard)?;
        // SAFETY: the element stays allocated and unwritten while `guard` is pinned.
        Some(unsafe { e.value(self.layout()) })
    }

    /// Copies the value of `key` into `out` without a pin; whether found.
    /// Lock-free, as `find`, and never returns a value the key did not
    /// hold during the call (see the module doc for why).
    /// Only for tables whose `reads_unpinned()`.
    #[inline]
    pub fn read_unpinned(&self, key: &[u8], out: &mut [u8]) -> Option<ElemPtr> {
        debug_assert!(self.reads_unpinned());
        self.read_unpinned_or_pin(key, out, UNPINNED_WALKS)
    }

    /// Whether keys and values are short enough for `read_unpinned`.
    #[inline]
    pub fn reads_unpinned(&self) -> bool {
        self.reads_unpinned
    }

    /// `read_unpinned`, pinning for a last walk after `walks` that writers
    /// of the stripe interrupted.
    #[inline]
    pub(super) fn read_unpinned_or_pin(
        &self,
        key: &[u8],
        out: &mut [u8],
        walks: usize,
    ) -> Option<ElemPtr> {
        let layout = self.layout();
        let hash = self.hash(key);
        let bucket = self.bucket(hash);
        let words = WordKey::new(key);
        'walk: for _ in 0..walks {
            // Acquire: a walk that starts after an unlink sees it done.
            let unlinks = bucket.stripe.unlinks.load(Ordering::Acquire);
            // Whatever is loaded below from a recycled element was stored
            // after its unlink was counted (`ElemPtr::init`, the free
            // list's release store): the fence makes that count visible.
            let unchanged = || {
                fence(Ordering::Acquire);
                bucket.stripe.unlinks.load(Ordering::Relaxed) == unlinks
            };
            let mut p = bucket.head.load(Ordering::Acquire);
            let found = loop {
                let e = ptr::NonNull::new(p).map(ElemPtr)?;
                // SAFETY: slab memory outlives the table; every word read
                // here is read atomically (`slab` module doc).
                let h = unsafe { e.header() };
                // SAFETY: as above.
                if h.hash.load(Ordering::Relaxed) == hash && unsafe { e.key_matches_racy(&words) } {
                    break e;
                }
                p = h.next.load(Ordering::Acquire);
                if !unchanged() {
                    continue 'walk;
                }
            };
            // SAFETY: as above.
            unsafe { found.copy_value_racy(layout, out) };
            if unchanged() {
                return Some(found);
            }
        }
        self.read_pinned(key, hash, out)
    }

    /// `read_unpinned`'s last resort: a walk under a pin.
    #[cold]
    #[inline(never)]
    fn read_pinned(&self, key: &[u8], hash: u32, out: &mut [u8]) -> Option<ElemPtr> {
        let guard = pin();
        let found = self.find(key, hash, &guard)?;
        // SAFETY: reachable under the pinned guard.
        bytes::copy(out, unsafe { found.value(self.layout()) });
        Some(found)
    }

    /// Walks a locked bucket for `key`; returns the link that points at it.
    fn find_locked<'b>(
        &self,
        bucket: Bucket<'b>,
        _lock: &MutexGuard<'b, ()>,
        key: &[u8],
        hash: u32,
    ) -> Option<(&'b AtomicPtr<ElemHeader>, ElemPtr)> {
        let layout = self.layout();
        let mut link = bucket.head;
        loop {
            let e = ElemPtr(ptr::NonNull::new(link.load(Ordering::Relaxed))?);
            // SAFETY: under the bucket lock the chain cannot change, and
            // linked elements are live.
            let h = unsafe { e.header() };
            // SAFETY: as above.
            if h.hash.load(Ordering::Relaxed) == hash && unsafe { e.key(layout) } == key {
                return Some((link, e));
            }
            link = &h.next;
        }
    }

    /// Reserves room for one more entry; `false` when full.
    fn reserve(&self) -> bool {
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_entries).then_some(n + 1)
            })
            .is_ok()
    }

    /// Retires an unlinked element: back to the slab after the grace period.
    fn retire(&self, e: ElemPtr, guard: &Guard) {
        // SAFETY: the element was just unlinked under its bucket lock.
        unsafe { e.header() }.live.store(false, Ordering::Relaxed);
        let slab = Arc::clone(&self.slab);
        guard.defer(move || slab.release(e));
    }

    /// Inserts or replaces. `on_full` runs (without any bucket lock held)
    /// when a new key finds the table full; it returns whether to retry
    /// (the LRU map evicts there) or give up with `E2BIG`.
    pub fn update(
        &self,
        key: &[u8],
        value: &[u8],
        flag: UpdateFlag,
        guard: &Guard,
        mut on_full: impl FnMut() -> bool,
    ) -> Result<Replaced> {
        let hash = self.hash(key);
        let bucket = self.bucket(hash);
        loop {
            let lock = bucket.stripe.lock.lock();
            let old = self.find_locked(bucket, &lock, key, hash);
            flag.check(old.is_some())?;
            if old.is_none() && !self.reserve() {
                drop(lock);
                if on_full() {
                    continue;
                }
                return Err(Error::Full);
            }
            let new = match self.slab.alloc() {
                Ok(e) => e,
                Err(err) => {
                    if old.is_none() {
                        self.len.fetch_sub(1, Ordering::Relaxed);
                    }
                    return Err(err);
                }
            };
            // SAFETY: fresh from the free list, private until published.
            unsafe { new.init(self.layout(), hash, key, value) };
            // SAFETY: as above.
            let new_h = unsafe { new.header() };
            new_h.live.store(true, Ordering::Relaxed);
            return Ok(match old {
                Some((link, old)) => {
                    // SAFETY: `old` is linked, and we hold its bucket lock.
                    let next = unsafe { old.header() }.next.load(Ordering::Relaxed);
                    new_h.next.store(next, Ordering::Relaxed);
                    // Publishes the new element's bytes (pairs with the
                    // Acquire loads in `find`).
                    link.store(new.0.as_ptr(), Ordering::Release);
                    bucket.stripe.count_unlink(&lock);
                    self.retire(old, guard);
                    Replaced::Updated
                }
                None => {
                    new_h
                        .next
                        .store(bucket.head.load(Ordering::Relaxed), Ordering::Relaxed);
                    bucket.head.store(new.0.as_ptr(), Ordering::Release);
                    Replaced::Inserted
                }
            });
        }
    }

    /// Removes `key`, first copying its value into `out` if given.
    pub fn delete(&self, key: &[u8], out: Option<&mut [u8]>, guard: &Guard) -> Result<()> {
        let hash = self.hash(key);
        let bucket = self.bucket(hash);
        let lock = bucket.stripe.lock.lock();
        let (link, e) = self
            .find_locked(bucket, &lock, key, hash)
            .ok_or(Error::NotFound)?;
        if let Some(out) = out {
            // SAFETY: linked element under its bucket lock.
            out.copy_from_slice(unsafe { e.value(self.layout()) });
        }
        self.unlink(bucket, &lock, link, e, guard);
        Ok(())
    }

    fn unlink(
        &self,
        bucket: Bucket<'_>,
        lock: &MutexGuard<'_, ()>,
        link: &AtomicPtr<ElemHeader>,
        e: ElemPtr,
        guard: &Guard,
    ) {
        // SAFETY: linked element; caller holds its bucket lock.
        let next = unsafe { e.header() }.next.load(Ordering::Relaxed);
        link.store(next, Ordering::Release);
        bucket.stripe.count_unlink(lock);
        self.len.fetch_sub(1, Ordering::Relaxed);
        self.retire(e, guard);
    }

    /// Unlinks `victim` if it is still linked (LRU eviction). Returns whether
    /// it was.
    pub fn evict(&self, victim: ElemPtr, guard: &Guard) -> bool {
        // SAFETY: slab memory outlives the table; the hash may be stale if the
        // element was recycled, which the chain walk below detects.
        let hash = unsafe { victim.header() }.hash.load(Ordering::Relaxed);
        let bucket = self.bucket(hash);
        let lock = bucket.stripe.lock.lock();
        let mut link = bucket.head;
        loop {
            let Some(e) = ptr::NonNull::new(link.load(Ordering::Relaxed)) else {
                return false;
            };
            if e == victim.0 {
                self.unlink(bucket, &lock, link, victim, guard);
                return true;
            }
            // SAFETY: linked element under the bucket lock.
            link = unsafe { &e.as_ref().next };
        }
    }

    /// The kernel's `get_next_key`: the key after `key` in bucket order; the
    /// first key if `key` is `None` or not in the table.
    pub fn next_key(&self, key: Option<&[u8]>, out: &mut [u8], guard: &Guard) -> Result<()> {
        let layout = *self.layout();
        let mut start_bucket = 0;
        if let Some(key) = key {
            let hash = self.hash(key);
            if let Some(e) = self.find(key, hash, guard) {
                // SAFETY: reachable under the guard.
                let next = unsafe { e.header() }.next.load(Ordering::Acquire);
                if let Some(n) = ptr::NonNull::new(next) {
                    // SAFETY: reachable under the guard.
                    out.copy_from_slice(unsafe { ElemPtr(n).key(&layout) });
                    return Ok(());
                }
                start_bucket = (hash as usize & self.mask) + 1;
            }
        }
        for head in &self.heads[start_bucket..] {
            if let Some(first) = ptr::NonNull::new(head.load(Ordering::Acquire)) {
                // SAFETY: reachable under the guard.
                out.copy_from_slice(unsafe { ElemPtr(first).key(&layout) });
                return Ok(());
            }
        }
        Err(Error::NotFound)
    }

    /// The kernel's hash-map `lookup_batch`, copying straight from the
    /// chains: up to `room` entries after `after` (the order and the
    /// restart of [`next_key`](Self::next_key): a missing `after` starts
    /// from the first bucket) into `keys` and `values`, back to back.
    /// Each value is one element's, whole (invariant 2). The guard is
    /// renewed between windows of buckets, every `repin_every` entries or
    /// so, so a long batch does not hold back reclamation.
    ///
    /// The buckets go in windows of [`WALK_WINDOW`], a pipeline of three
    /// steps a window apart: the window ahead's heads are read and their
    /// first elements asked for; this window's second elements are asked
    /// for (their firsts came in a window ago); then this window is
    /// copied. A walk bucket by bucket waited on each element in turn and
    /// mispredicted the empty buckets, about half of a full table's;
    /// here the heads are gathered without a branch.
    pub fn lookup_batch(
        &self,
        after: Option<&[u8]>,
        keys: &mut [u8],
        values: &mut [u8],
        room: usize,
        repin_every: usize,
    ) -> usize {
        let args = (after, keys, values, room, repin_every);
        // The common sizes compiled in (`BatchOut`); any other, read.
        match (self.layout().key_size, self.layout().value_size) {
            (4, 4) => self.lookup_batch_sized::<4, 4>(args),
            (4, 8) => self.lookup_batch_sized::<4, 8>(args),
            (4, 16) => self.lookup_batch_sized::<4, 16>(args),
            (8, 4) => self.lookup_batch_sized::<8, 4>(args),
            (8, 8) => self.lookup_batch_sized::<8, 8>(args),
            (8, 16) => self.lookup_batch_sized::<8, 16>(args),
            (16, 4) => self.lookup_batch_sized::<16, 4>(args),
            (16, 8) => self.lookup_batch_sized::<16, 8>(args),
            (16, 16) => self.lookup_batch_sized::<16, 16>(args),
            _ => self.lookup_batch_sized::<0, 0>(args),
        }
    }

    /// [`lookup_batch`](Self::lookup_batch) for keys of `K` and values of
    /// `V` bytes (0: any size).
    fn lookup_batch_sized<const K: usize, const V: usize>(
        &self,
        (after, keys, values, room, repin_every): BatchArgs<'_>,
    ) -> usize {
        let layout = *self.layout();
        let mut copied = 0;
        let mut out = BatchOut::<K, V>::new(keys, values, layout, room);
        let mut guard = pin();
        let mut start = 0;
        if let Some(key) = after {
            let hash = self.hash(key);
            if let Some(e) = self.find(key, hash, &guard) {
                // The rest of the chain `after` sits in.
                // SAFETY: reachable under the guard.
                let rest = unsafe { e.header() }.next.load(Ordering::Acquire);
                if !out.chain(rest, &mut copied) {
                    return room;
                }
                start = (hash as usize & self.mask) + 1;
            }
        }
        let mut firsts: Firsts = [ptr::null_mut(); WALK_WINDOW];
        let mut ahead = firsts;
        let (mut len, mut end) = self.read_window(start, &mut firsts);
        let mut pinned_at = 0;
        loop {
            let (ahead_len, ahead_end) = self.read_window(end, &mut ahead);
            for &first in &firsts[..len] {
                // SAFETY: read from a head under the guard.
                prefetch(unsafe { &*first }.next.load(Ordering::Relaxed));
            }
            for &first in &firsts[..len] {
                if !out.chain(first, &mut copied) {
                    return room;
                }
            }
            if ahead_end == end {
                return copied;
            }
            // Between windows the guard may move on; the window ahead was
            // read under the old one, so it is read again.
            if copied - pinned_at >= repin_every {
                guard.repin();
                pinned_at = copied;
                (len, end) = self.read_window(end, &mut firsts);
            } else {
                std::mem::swap(&mut firsts, &mut ahead);
                (len, end) = (ahead_len, ahead_end);
            }
        }
    }

    /// Reads the heads of a window of buckets from `start` on into
    /// `firsts`: the non-empty ones gathered without a branch, their first
    /// elements asked for. Returns how many, and where the window ends.
    /// The caller holds the guard they are read under.
    fn read_window(&self, start: usize, firsts: &mut Firsts) -> (usize, usize) {
        let end = (start + WALK_WINDOW).min(self.heads.len());
        let mut len = 0;
        for head in &self.heads[start..end] {
            let first = head.load(Ordering::Acquire);
            firsts[len] = first;
            len += usize::from(!first.is_null());
        }
        for &first in &firsts[..len] {
            prefetch(first);
        }
        (len, end)
    }

    /// Visits every live element (weakly consistent under concurrent writes).
    pub fn for_each<'g>(&self, guard: &'g Guard, mut f: impl FnMut(&'g [u8], &'g [u8])) {
        let layout = *self.layout();
        let _ = guard;
        for head in self.heads.iter() {
            let mut p = head.load(Ordering::Acquire);
            while let Some(e) = ptr::NonNull::new(p) {
                let e = ElemPtr(e);
                // SAFETY: reachable under the guard.
                unsafe { f(e.key(&layout), e.value(&layout)) };
                // SAFETY: as above.
                p = unsafe { e.header() }.next.load(Ordering::Acquire);
            }
        }
    }

    /// The slab, for the LRU clock.
    pub fn slab(&self) -> &Slab {
        &self.slab
    }

    pub fn memory_usage(&self) -> usize {
        size_of::<Self>()
            + self.heads.len() * size_of::<AtomicPtr<ElemHeader>>()
            + self.stripes.len() * size_of::<Stripe>()
            + self.slab.bytes()
    }
}

impl Drop for RawTable {
    fn drop(&mut self) {
        // Elements live in the slab (freed in the background when the last
        // deferred release lets go of it); the bucket array goes too.
        crate::core::reclaim::drop_in_background(std::mem::take(&mut self.heads));
    }
}
