//! A block arena: a map's blocks carved from large chunks instead of one
//! heap allocation each, so a lookup's few blocks share pages (the kernel
//! LPM trie's dTLB problem), big chunks are backed by huge pages where the
//! kernel allows (`MADV_HUGEPAGE`), and dropping a map of a million blocks
//! frees a few dozen chunks instead of walking it. The LPM trie's node
//! blocks live here; any map with copy-on-write blocks can.
//!
//! Sizes are rounded up to 16-byte classes. The one writer (a map's
//! writer lock serialises allocations; the arena's own lock is then never
//! contended) allocates from its private chain per class, then from the
//! blocks released after their grace period, then from the current chunk;
//! when that is used up, from the smallest larger free block, split, and
//! only then from a new chunk. Releases arrive from epoch-deferred
//! closures on any thread, so they go onto the per-class lock-free free
//! lists (`core::free_list`), linked through the dead block's first word.
//! The writer retires blocks in batches ([`Arena::retire`]): one
//! deferred call and one update of the counts per 64 blocks.
//!
//! Freed blocks of one class do not make a block of another, so churn
//! that moves blocks between classes leaves the chunks holding more than
//! the map uses. A map then compacts: [`Arena::start_generation`] sets
//! every chunk aside as the old generation and carves from fresh chunks,
//! sized to what is live; the map copies its live blocks over and, after
//! a grace period, releases the copied originals in one count
//! ([`Arena::release_relocated`]). Blocks of the old generation never go
//! back on a free list; once the last of them is released, its chunks go
//! back to the system.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use smallvec::SmallVec;

use super::free_list::{Chain, FirstWord, FreeList, Links};
use super::read_section;
use super::reclaim::Guard;

const GRANULE: usize = 16;
/// Largest block: 8 KiB (an LPM data block with 256 runs and 511
/// prefixes, or a child block of 256 nodes, is under 5 KiB).
pub(crate) const MAX_BLOCK: usize = 8 << 10;
const CLASSES: usize = MAX_BLOCK / GRANULE + 1;
/// Retired blocks released together after one grace period.
const RETIRE_BATCH: usize = 64;
/// Small maps stay small: chunks start at 4 KiB and double up to 2 MiB.
const FIRST_CHUNK: usize = 4 << 10;
/// A huge page's bytes (x86-64's 2 MiB).
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel for huge pages under `size` bytes at `p` (memory of
/// this process's own allocation, aligned to [`HUGE_PAGE`]) when they
/// span one: a big structure's random reads then miss the TLB less.
/// Where the kernel gives none (or off Linux, or under Miri), nothing.
pub(crate) fn advise_huge_pages(p: *mut u8, size: usize) {
    #[cfg(all(target_os = "linux", not(miri)))]
    if size >= HUGE_PAGE {
        // SAFETY: advice on memory the caller owns; failure only loses
        // the hint.
        unsafe { libc::madvise(p.cast(), size, libc::MADV_HUGEPAGE) };
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = (p, size);
}

/// A block arena. `alloc` is for the (single) writer; `release` may run
/// anywhere.
pub(crate) struct Arena {
    writer: Mutex<ArenaWriter>,
    /// Per size class, blocks back from their grace period.
    returned: [FreeList; CLASSES],
    /// A release reads this to tell an old generation's block from a
    /// current one; starting or ending a generation writes it, so then no
    /// release is halfway through pushing a block onto a free list.
    chunks: RwLock<Chunks>,
    chunk_bytes: AtomicUsize,
    /// Bytes in blocks handed out and not yet released (all generations).
    live_bytes: AtomicUsize,
    /// Of those, bytes in the current generation's blocks ...
    current_live: AtomicUsize,
    /// ... and of these, bytes in retired blocks (unreachable, waiting for
    /// their grace period).
    current_retired: AtomicUsize,
    /// Set when the arena grew with many free blocks: `fragmented` says
    /// so once.
    compact_wanted: AtomicBool,
    /// Retired blocks (address, class) waiting to fill a batch.
    retired: Mutex<Vec<(usize, usize)>>,
    /// Whether readers also reach the blocks in read sections
    /// (`core::read_section`), so that a retired batch waits for those
    /// too after its epoch grace period.
    read_sections: bool,
}

/// A writer's allocations and retirements for one write
/// ([`Arena::session`]): the writer lock is held throughout, and the
/// counts and the retirement batch are updated once, when it ends.
pub(crate) struct Session<'a> {
    writer: parking_lot::MutexGuard<'a, ArenaWriter>,
    arena: &'a Arc<Arena>,
    guard: &'a Guard,
    allocated: usize,
    retired: SmallVec<[(usize, usize); 8]>,
}

impl Session<'_> {
    /// A block for `layout`, as [`Arena::alloc`].
    pub fn alloc(&mut self, layout: Layout) -> NonNull<u8> {
        self.allocated += class_of(layout.size()) * GRANULE;
        self.arena.alloc_in(&mut self.writer, layout)
    }

    /// Retires a block, as [`Arena::retire`], when the session ends.
    ///
    /// # Safety
    /// As [`Arena::retire`]: by the time the session ends, no reader that
    /// pins can reach `block`.
    pub unsafe fn retire(&mut self, block: *mut u8, size: usize) {
        self.retired.push((block as usize, class_of(size)));
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.allocated > 0 {
            self.arena.count_live(self.allocated);
        }
        if !self.retired.is_empty() {
            self.arena.retire_all(&self.retired, self.guard);
        }
    }
}

/// One chunk of blocks.
struct Chunk {
    start: NonNull<u8>,
    layout: Layout,
}

impl Chunk {
    fn holds(&self, block: usize) -> bool {
        (self.start.as_ptr() as usize..self.start.as_ptr() as usize + self.layout.size())
            .contains(&block)
    }
}

#[derive(Default)]
struct Chunks {
    /// The chunks blocks are carved from.
    current: Vec<Chunk>,
    /// Their bytes.
    current_bytes: usize,
    /// The chunks set aside by each `start_generation`, until every block
    /// in them is released.
    old: Vec<OldGeneration>,
    /// The id the next generation set aside gets.
    next_id: u64,
}

impl Chunks {
    fn old_holding(&self, block: usize) -> Option<&OldGeneration> {
        self.old.iter().find(|o| o.holds(block))
    }
}

/// A generation set aside by a compaction: its chunks, until every block
/// in them is released.
struct OldGeneration {
    id: u64,
    /// Sorted by address.
    chunks: Vec<Chunk>,
    /// Bytes in its blocks not yet released.
    live: AtomicUsize,
}

/// Old generations draining at once, at most: more compactions wait.
const MAX_OLD_GENERATIONS: usize = 4;

impl OldGeneration {
    fn holds(&self, block: usize) -> bool {
        let after = self
            .chunks
            .partition_point(|c| c.start.as_ptr() as usize <= block);
        after > 0 && self.chunks[after - 1].holds(block)
    }
}

// SAFETY: chunks are plain memory owned by the arena; the block protocol
// (writer-only allocation, returns after grace periods) governs access.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

/// The writer's side: private chains of free blocks and the chunk being
/// carved.
struct ArenaWriter {
    free: [Chain; CLASSES],
    cursor: usize,
    end: usize,
    next_chunk: usize,
    /// Bytes allocated in this generation (the copies included).
    allocated: usize,
    /// The fewest free bytes `fragmented` saw in its current window of
    /// looks, and how many looks the window has had.
    low_free: usize,
    looks: u32,
}

impl Default for ArenaWriter {
    fn default() -> Self {
        ArenaWriter {
            free: [Chain::EMPTY; CLASSES],
            cursor: 0,
            end: 0,
            next_chunk: FIRST_CHUNK,
            allocated: 0,
            low_free: usize::MAX,
            looks: 0,
        }
    }
}

/// A batch of retired blocks past their grace period, released when
/// dropped (on whichever thread runs the deferred call, or the reaper).
struct ReleaseRetired {
    arena: Arc<Arena>,
    batch: Vec<(usize, usize)>,
}

impl Drop for ReleaseRetired {
    fn drop(&mut self) {
        // SAFETY: made only by `release_after_grace`, and dropped only
        // after the grace period (and the read sections) it waits for.
        unsafe { self.arena.release_retired(std::mem::take(&mut self.batch)) };
    }
}

fn class_of(size: usize) -> usize {
    assert!(
        size <= MAX_BLOCK,
        "a block of {size} bytes exceeds the arena's largest class"
    );
    size.div_ceil(GRANULE)
}

impl Arena {
    #[inline]
    pub fn new() -> Self {
        Arena::build(false)
    }

    /// An arena whose retired blocks wait for the read sections open at
    /// the end of their grace period as well (a map whose readers may
    /// read in sections rather than pinned).
    #[inline]
    pub fn with_read_sections() -> Self {
        read_section::init();
        Arena::build(true)
    }

    /// Built in one place, and inlined with its callers: an arena is
    /// 8 KiB of padded free lists, and with `with_read_sections` out of
    /// line `Arc::new` copied it, 5 % more instructions a fork of the
    /// kernel's `bench_forking` (a new tree each; callgrind).
    #[inline(always)]
    fn build(read_sections: bool) -> Self {
        Arena {
            writer: Mutex::new(ArenaWriter::default()),
            returned: FreeList::many(),
            chunks: RwLock::new(Chunks::default()),
            chunk_bytes: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
            current_live: AtomicUsize::new(0),
            current_retired: AtomicUsize::new(0),
            compact_wanted: AtomicBool::new(false),
            retired: Mutex::new(Vec::with_capacity(RETIRE_BATCH)),
            read_sections,
        }
    }

    /// Allocates a block for `layout` (align at most 16). Meant for a map's
    /// single writer, so the lock is uncontended.
    pub fn alloc(&self, layout: Layout) -> NonNull<u8> {
        let mut w = self.writer.lock();
        self.count_live(class_of(layout.size()) * GRANULE);
        self.alloc_in(&mut w, layout)
    }

    /// Counts `bytes` more in blocks handed out.
    fn count_live(&self, bytes: usize) {
        self.live_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.current_live.fetch_add(bytes, Ordering::Relaxed);
    }

    /// [`alloc`](Self::alloc) under the writer lock, its bytes counted by
    /// the caller.
    fn alloc_in(&self, w: &mut ArenaWriter, layout: Layout) -> NonNull<u8> {
        debug_assert!(layout.align() <= GRANULE);
        let class = class_of(layout.size());
        w.allocated += class * GRANULE;
        let block = self.returned[class]
            .take(&FirstWord, &mut w.free[class])
            .or_else(|| self.carve(w, class))
            .unwrap_or_else(|| {
                let size = class * GRANULE;
                // The end of the chunk becomes a free block of its own size.
                let tail = w.end - w.cursor;
                if tail >= GRANULE {
                    // SAFETY: the tail is unused memory of our chunk.
                    unsafe { w.free[tail / GRANULE].push(&FirstWord, w.cursor) };
                }
                // Growing with this much free: compact instead, soon.
                if self.free_bytes(0) >= (64 << 10).max(self.reachable() / 16) && self.paid_for(w) {
                    self.compact_wanted.store(true, Ordering::Relaxed);
                }
                self.new_chunk(w, size);
                self.carve(w, class).expect("a new chunk fits the block")
            });
        NonNull::new(block as *mut u8).expect("chunk memory")
    }

    /// `class` granules from the current chunk, or else from the smallest
    /// larger free block; `None` when neither has room.
    fn carve(&self, w: &mut ArenaWriter, class: usize) -> Option<usize> {
        let size = class * GRANULE;
        if w.end - w.cursor >= size {
            let block = w.cursor;
            w.cursor += size;
            return Some(block);
        }
        self.split_free(w, class)
    }

    /// Before the arena grows: the smallest free block of a larger class,
    /// its first `class` granules handed out and the rest kept free.
    /// Returned blocks are taken in first, all classes at once. Runs once
    /// per chunk, so its walks cost little; it keeps the free lists of a
    /// map built by many copy-on-write updates from holding more than the
    /// map itself (blocks grow a class at a time as nodes fill).
    fn split_free(&self, w: &mut ArenaWriter, class: usize) -> Option<usize> {
        // Fewer free bytes than a larger class needs: skip the walk over
        // every class (what a growing arena sees). `current_live` already
        // counts the block being allocated, which is not carved yet; a
        // release racing with this only adds.
        if self.free_bytes(w.end - w.cursor) < GRANULE {
            return None;
        }
        for (c, returned) in self.returned.iter().enumerate().skip(1) {
            let mut taken = returned.take_all();
            while let Some(block) = taken.pop(&FirstWord) {
                // SAFETY: a released block is free and ours.
                unsafe { w.free[c].push(&FirstWord, block) };
            }
        }
        let c = (class + 1..CLASSES).find(|&c| !w.free[c].is_empty())?;
        let block = w.free[c].pop(&FirstWord)?;
        // SAFETY: the block has c > class granules; its tail is free.
        unsafe { w.free[c - class].push(&FirstWord, block + class * GRANULE) };
        Some(block)
    }

    /// Starts a new chunk with room for at least `need` bytes.
    fn new_chunk(&self, w: &mut ArenaWriter, need: usize) {
        let mut size = w.next_chunk;
        while size < need {
            size *= 2;
        }
        w.next_chunk = (size * 2).min(HUGE_PAGE);
        let align = if size >= HUGE_PAGE { HUGE_PAGE } else { 4096 };
        let layout = Layout::from_size_align(size, align).expect("chunk layout");
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout) };
        let Some(chunk) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        advise_huge_pages(p, size);
        let mut chunks = self.chunks.write();
        chunks.current.push(Chunk {
            start: chunk,
            layout,
        });
        chunks.current_bytes += size;
        self.chunk_bytes.fetch_add(size, Ordering::Relaxed);
        w.cursor = p as usize;
        w.end = w.cursor + size;
    }

    /// Returns a block nobody can reach any more (lock-free; any thread).
    ///
    /// # Safety
    /// `block` came from `alloc` with a layout of `size` bytes and is
    /// unreachable.
    pub unsafe fn release(&self, block: *mut u8, size: usize) {
        // SAFETY: the caller's.
        unsafe { self.release_blocks([(block as usize, class_of(size))], false) };
    }

    /// Retires a block the writer just made unreachable: it goes back to
    /// the arena after a grace period, with a batch of others
    /// (`RETIRE_BATCH`), so the epoch collector gets one deferred call
    /// and the counts one update per batch instead of per block. A batch
    /// not yet full waits for the next retirements or for
    /// [`flush_retired`](Self::flush_retired).
    ///
    /// # Safety
    /// `block` came from `alloc` with a layout of `size` bytes, and no
    /// reader that pins after now can reach it.
    pub unsafe fn retire(self: &Arc<Self>, block: *mut u8, size: usize, guard: &Guard) {
        self.retire_all(&[(block as usize, class_of(size))], guard);
    }

    /// A write's allocations and retirements under one take of each lock
    /// and one update of the counts: a map write that copies a path of
    /// blocks pays the atomic operations once, not once per block (they
    /// were half the time of a maple tree store).
    pub fn session<'a>(self: &'a Arc<Self>, guard: &'a Guard) -> Session<'a> {
        Session {
            writer: self.writer.lock(),
            arena: self,
            guard,
            allocated: 0,
            retired: SmallVec::new(),
        }
    }

    /// Hands the retired blocks not yet in a full batch to the collector
    /// (a writer that wants them back soon: `clear`, compaction).
    pub fn flush_retired(self: &Arc<Self>, guard: &Guard) {
        let batch = std::mem::take(&mut *self.retired.lock());
        if !batch.is_empty() {
            self.release_after_grace(batch, guard);
        }
    }

    /// Adds `blocks` to the batch waiting for a grace period.
    fn retire_all(self: &Arc<Self>, blocks: &[(usize, usize)], guard: &Guard) {
        let bytes = blocks.iter().map(|&(_, class)| class * GRANULE).sum();
        self.current_retired.fetch_add(bytes, Ordering::Relaxed);
        let mut retired = self.retired.lock();
        retired.extend_from_slice(blocks);
        if retired.len() >= RETIRE_BATCH {
            let batch = std::mem::replace(&mut *retired, Vec::with_capacity(RETIRE_BATCH));
            drop(retired);
            self.release_after_grace(batch, guard);
        }
    }

    fn release_after_grace(self: &Arc<Self>, batch: Vec<(usize, usize)>, guard: &Guard) {
        // Every block is unreachable for readers pinned after its
        // retirement, which came before this; released after the grace
        // period (and after the read sections open then).
        let release = ReleaseRetired {
            arena: Arc::clone(self),
            batch,
        };
        if self.read_sections {
            guard.defer(move || read_section::free_after(release));
        } else {
            guard.defer(move || drop(release));
        }
        // Into the global queue now: the thread's bag holds 64 deferred
        // calls before it goes by itself, which is 64 batches here.
        guard.flush();
    }

    /// Releases a batch of retired blocks.
    ///
    /// # Safety
    /// Every block is past its grace period.
    unsafe fn release_retired(&self, batch: Vec<(usize, usize)>) {
        // SAFETY: the caller's.
        unsafe { self.release_blocks(batch, true) };
    }

    /// Releases blocks given as (address, class), under one read of the
    /// chunks: current ones onto the free lists with one update of the
    /// counts (of the retired bytes too, when they were counted by
    /// `retire`), an old generation's counted out of it. (A retired block
    /// of an old generation was counted there as live.)
    ///
    /// # Safety
    /// Every block came from `alloc` with its class and is unreachable.
    unsafe fn release_blocks(
        &self,
        blocks: impl IntoIterator<Item = (usize, usize)>,
        retired: bool,
    ) {
        let chunks = self.chunks.read();
        let mut current = 0;
        let mut old: SmallVec<[(u64, usize); 2]> = SmallVec::new();
        // Current blocks, chained per class (class, first, last) and given
        // back one chain per class: one atomic update each, not per block.
        let mut chains: SmallVec<[(usize, usize, usize); 4]> = SmallVec::new();
        for (block, class) in blocks {
            let bytes = class * GRANULE;
            match chunks.old_holding(block) {
                Some(generation) => match old.iter_mut().find(|(id, _)| *id == generation.id) {
                    Some((_, sum)) => *sum += bytes,
                    None => old.push((generation.id, bytes)),
                },
                None => {
                    current += bytes;
                    match chains.iter_mut().find(|(c, _, _)| *c == class) {
                        Some((_, first, _)) => {
                            // SAFETY: the block is dead, and at least a
                            // granule of ours.
                            unsafe { FirstWord.set_next(block, *first) };
                            *first = block;
                        }
                        None => chains.push((class, block, block)),
                    }
                }
            }
        }
        for (class, first, last) in chains {
            // SAFETY: every block of the chain is dead and ours.
            unsafe { self.returned[class].release_chain(&FirstWord, first, last) };
        }
        if current > 0 {
            self.live_bytes.fetch_sub(current, Ordering::Relaxed);
            self.current_live.fetch_sub(current, Ordering::Relaxed);
            if retired {
                self.current_retired.fetch_sub(current, Ordering::Relaxed);
            }
        }
        drop(chunks);
        for (id, bytes) in old {
            self.release_old(self.chunks.read(), id, bytes);
        }
    }

    /// The bytes a block of `size` bytes takes (its size class).
    pub fn block_bytes(size: usize) -> usize {
        class_of(size) * GRANULE
    }

    /// Whether compacting would pay: free blocks (released, not yet
    /// reused) add up to at least 64 KiB and to a sixteenth of the
    /// reachable bytes (live, not retired) when the arena had to grow, or
    /// to an eighth throughout a window of `LOOKS` calls, and the
    /// generation has paid for a compaction (`paid_for`). Writer only;
    /// meant to be called every few writes.
    ///
    /// A growing table's freed blocks are soon reused, so it does not
    /// compact; each compaction leaves no free block, and the next needs
    /// new ones, so its cost is spread over many writes. Blocks come back
    /// from their grace periods in bursts (the epoch collector frees many
    /// bags at once), and the writes after a burst reuse them: so only
    /// free bytes that stay free over a window count, not one look's.
    pub fn fragmented(&self) -> bool {
        /// Looks per window.
        const LOOKS: u32 = 8;
        if self.compact_wanted.swap(false, Ordering::Relaxed) {
            return true;
        }
        let mut w = self.writer.lock();
        let free = self.free_bytes(w.end - w.cursor);
        w.low_free = w.low_free.min(free);
        w.looks += 1;
        if w.looks < LOOKS {
            return false;
        }
        let low = std::mem::replace(&mut w.low_free, usize::MAX);
        w.looks = 0;
        // Blocks still in their grace periods come back as free ones: as
        // many free bytes as are retired are only the next burst's room.
        let retired = self.current_retired.load(Ordering::Relaxed);
        low >= (64 << 10).max(self.reachable() / 8).max(retired) && self.paid_for(&w)
    }

    /// Whether this generation has allocated three times what a
    /// compaction would copy: compactions then cost at most a third of
    /// the allocating, however often fragmentation recurs (a table being
    /// built fragments too, for a while).
    fn paid_for(&self, w: &ArenaWriter) -> bool {
        w.allocated >= 3 * self.reachable()
    }

    /// Bytes in free blocks of the current chunks, `tail` bytes of the
    /// last one not carved yet.
    fn free_bytes(&self, tail: usize) -> usize {
        let held = self.chunks.read().current_bytes;
        held.saturating_sub(tail + self.current_live.load(Ordering::Relaxed))
    }

    /// Bytes in current blocks that are live and not retired.
    fn reachable(&self) -> usize {
        // (A release may fall between the two loads: saturating.)
        (self.current_live.load(Ordering::Relaxed))
            .saturating_sub(self.current_retired.load(Ordering::Relaxed))
    }

    /// Sets every current chunk aside as an old generation: from now on
    /// blocks are carved from new chunks (the first sized to hold what is
    /// live), and the old generation's blocks, once released, are not
    /// reused. Returns its id, for `release_relocated`; `None` (nothing
    /// done) while `MAX_OLD_GENERATIONS` still drain. Writer only.
    pub fn start_generation(&self) -> Option<u64> {
        let mut w = self.writer.lock();
        // Taken after the writer's lock, as `new_chunk` does.
        let mut chunks = self.chunks.write();
        if chunks.old.len() >= MAX_OLD_GENERATIONS {
            return None;
        }
        // Every free block lies in a chunk set aside now.
        for returned in &self.returned {
            let _ = returned.take_all();
        }
        // No release runs now (the write lock): the counts are exact.
        let live = self.current_live.swap(0, Ordering::Relaxed);
        let retired = self.current_retired.swap(0, Ordering::Relaxed);
        // The copies of the reachable blocks fill one chunk of their size
        // (huge pages for most of it), so a compacted map holds what it
        // uses; growth after it takes chunks as usual.
        *w = ArenaWriter {
            next_chunk: live
                .saturating_sub(retired)
                .next_multiple_of(4096)
                .max(FIRST_CHUNK),
            ..ArenaWriter::default()
        };
        let id = chunks.next_id;
        chunks.next_id += 1;
        let mut old = std::mem::take(&mut chunks.current);
        chunks.current_bytes = 0;
        old.sort_by_key(|c| c.start);
        if live == 0 {
            self.free_chunks(old);
        } else {
            chunks.old.push(OldGeneration {
                id,
                chunks: old,
                live: AtomicUsize::new(live),
            });
        }
        Some(id)
    }

    /// Releases, as one count, blocks of old generation `id` that were
    /// copied to the current one (so none of them is released alone).
    ///
    /// # Safety
    /// Blocks of that generation totalling `bytes` (by
    /// [`block_bytes`](Self::block_bytes)) are unreachable and are never
    /// passed to `release`.
    pub unsafe fn release_relocated(&self, id: u64, bytes: usize) {
        self.release_old(self.chunks.read(), id, bytes);
    }

    /// Counts `bytes` of old generation `id` released; the last of them
    /// gives its chunks back to the system.
    fn release_old(&self, chunks: RwLockReadGuard<'_, Chunks>, id: u64, bytes: usize) {
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
        let old = chunks
            .old
            .iter()
            .find(|o| o.id == id)
            .expect("a draining generation");
        let before = old.live.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "more released than the generation held");
        drop(chunks);
        if before == bytes {
            let mut chunks = self.chunks.write();
            let at = chunks.old.iter().position(|o| o.id == id).expect("drained");
            let old = chunks.old.swap_remove(at);
            drop(chunks);
            self.free_chunks(old.chunks);
        }
    }

    /// Gives a set-aside generation's chunks back to the system.
    fn free_chunks(&self, chunks: Vec<Chunk>) {
        for chunk in chunks {
            self.chunk_bytes
                .fetch_sub(chunk.layout.size(), Ordering::Relaxed);
            // SAFETY: allocated in new_chunk with this layout; every
            // block in it is released, and no free list holds one.
            unsafe { dealloc(chunk.start.as_ptr(), chunk.layout) };
        }
    }

    /// Whether `start_generation` would refuse: `MAX_OLD_GENERATIONS`
    /// still drain.
    pub fn at_generation_limit(&self) -> bool {
        self.chunks.read().old.len() >= MAX_OLD_GENERATIONS
    }

    /// Whether an old generation is still draining (for tests).
    #[cfg(test)]
    pub fn draining(&self) -> bool {
        !self.chunks.read().old.is_empty()
    }

    /// Whether some released block is waiting to be reused (for tests).
    #[cfg(test)]
    pub fn has_returned(&self) -> bool {
        self.returned.iter().any(FreeList::has_returned)
    }

    /// Bytes of chunk memory held.
    pub fn bytes(&self) -> usize {
        self.chunk_bytes.load(Ordering::Relaxed)
    }

    /// Bytes in live blocks (rounded to their size class): what the map
    /// uses of what it holds.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::Relaxed)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let chunks = std::mem::take(self.chunks.get_mut());
        for chunk in chunks
            .current
            .into_iter()
            .chain(chunks.old.into_iter().flat_map(|o| o.chunks))
        {
            // SAFETY: allocated in new_chunk with this layout; the arena is
            // the last owner.
            unsafe { dealloc(chunk.start.as_ptr(), chunk.layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::reclaim::{pin, wait_for_grace};

    #[test]
    fn blocks_are_reused_after_release_and_chunks_grow() {
        let arena = Arena::new();
        let l = Layout::from_size_align(100, 8).unwrap();
        let a = arena.alloc(l);
        let b = arena.alloc(l);
        assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 112);
        // SAFETY: a is unused.
        unsafe { arena.release(a.as_ptr(), 100) };
        assert_eq!(arena.alloc(l), a, "a returned block is reused first");
        assert_eq!(arena.bytes(), FIRST_CHUNK);
        let n = if cfg!(miri) { 40 } else { 2000 };
        for _ in 0..n {
            arena.alloc(Layout::from_size_align(MAX_BLOCK, 16).unwrap());
        }
        assert!(arena.bytes() >= n * MAX_BLOCK);
    }

    use proptest::prelude::*;

    /// Under Miri, smaller blocks and fewer operations: it checks every
    /// byte written and read, a thousand times slower than a native run.
    const TEST_MAX_BLOCK: usize = if cfg!(miri) { 200 } else { MAX_BLOCK };
    const TEST_OPS: usize = if cfg!(miri) { 60 } else { 400 };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::scaled(256, 3) as u32))]

        /// Random allocations and releases (sizes across all classes):
        /// live blocks never overlap, and each keeps what was written into
        /// it, through block reuse, splitting and chunk tails.
        #[test]
        fn live_blocks_never_overlap(ops in prop::collection::vec((0u8..10, 1usize..TEST_MAX_BLOCK, any::<u8>()), 1..TEST_OPS)) {
            let arena = Arc::new(Arena::new());
            let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
            // Per old generation, bytes of relocated blocks not yet
            // released.
            let mut relocated: Vec<(u64, usize)> = Vec::new();
            for (op, size, fill) in ops {
                if op == 0 && let Some(id) = arena.start_generation() {
                    // Compaction: every live block copied to the new
                    // generation, the originals released later in one
                    // count.
                    let mut bytes = 0;
                    for (p, n, _) in &mut live {
                        let copy = arena.alloc(Layout::from_size_align(*n, 16).unwrap()).as_ptr();
                        // SAFETY: both blocks are ours, n bytes each.
                        unsafe { std::ptr::copy_nonoverlapping(*p, copy, *n) };
                        bytes += Arena::block_bytes(*n);
                        *p = copy;
                    }
                    if bytes > 0 {
                        relocated.push((id, bytes));
                    }
                } else if op == 1 && !relocated.is_empty() {
                    let (id, bytes) = relocated.remove(fill as usize % relocated.len());
                    // SAFETY: the originals are unreachable.
                    unsafe { arena.release_relocated(id, bytes) };
                } else if op < 6 && !live.is_empty() {
                    let (p, n, f) = live.swap_remove(fill as usize % live.len());
                    // SAFETY: allocated with n bytes, still ours.
                    let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                    prop_assert!(bytes.iter().all(|&b| b == f), "a live block was overwritten");
                    // SAFETY: unreachable from here on.
                    unsafe {
                        if op < 4 {
                            arena.release(p, n);
                        } else {
                            arena.retire(p, n, &pin());
                        }
                    }
                } else {
                    let p = arena.alloc(Layout::from_size_align(size, 16).unwrap()).as_ptr();
                    prop_assert_eq!(p as usize % 16, 0);
                    let end = p as usize + size;
                    for &(q, m, _) in &live {
                        prop_assert!(end <= q as usize || q as usize + m <= p as usize, "overlap");
                    }
                    // SAFETY: a fresh block of `size` bytes.
                    unsafe { std::ptr::write_bytes(p, fill, size) };
                    live.push((p, size, fill));
                }
            }
            let in_use: usize = live.iter().map(|&(_, n, _)| Arena::block_bytes(n)).sum();
            let pending: usize = relocated.iter().map(|r| r.1).sum();
            // Retired blocks come back after their grace period, a batch
            // not yet full once flushed.
            arena.flush_retired(&pin());
            wait_for_grace(|| arena.live_bytes() == in_use + pending);
            prop_assert_eq!(arena.live_bytes(), in_use + pending);
            prop_assert_eq!(arena.reachable(), in_use);
            for (p, n, f) in live {
                // SAFETY: as above.
                let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                prop_assert!(bytes.iter().all(|&b| b == f));
                // SAFETY: unreachable from here on.
                unsafe { arena.release(p, n) };
            }
            for (id, bytes) in relocated {
                // SAFETY: as above.
                unsafe { arena.release_relocated(id, bytes) };
            }
            prop_assert!(!arena.draining(), "an old generation never drained");
            prop_assert_eq!(arena.live_bytes(), 0);
        }
    }

    /// Retired blocks come back in batches, a partial one when flushed,
    /// and those of an old generation drain it.
    #[test]
    fn retired_blocks_come_back_in_batches() {
        let arena = Arc::new(Arena::new());
        let l = Layout::from_size_align(100, 8).unwrap();
        let bytes = Arena::block_bytes(100);
        let blocks: Vec<_> = (0..RETIRE_BATCH + 3)
            .map(|_| arena.alloc(l).as_ptr())
            .collect();
        let guard = pin();
        for &b in &blocks[..RETIRE_BATCH + 1] {
            // SAFETY: unused, retired once.
            unsafe { arena.retire(b, 100, &guard) };
        }
        drop(guard);
        assert_eq!(arena.reachable(), 2 * bytes);
        assert!(
            wait_for_grace(|| arena.live_bytes() == 3 * bytes),
            "a full batch never came back"
        );
        assert!(arena.has_returned());
        // The one left over is in an old generation now; it drains it
        // with the two relocated.
        let id = arena.start_generation().unwrap();
        arena.flush_retired(&pin());
        // SAFETY: the last two, as if copied to the new generation.
        unsafe { arena.release_relocated(id, 2 * bytes) };
        assert!(
            wait_for_grace(|| !arena.draining()),
            "the flushed block never drained the old generation"
        );
        assert_eq!((arena.live_bytes(), arena.bytes()), (0, 0));
    }

    /// Blocks from before a generation are never handed out again; its
    /// chunks go back once all of them are released, relocated ones in
    /// one count.
    #[test]
    fn an_old_generation_is_never_reused_and_goes_back_when_drained() {
        let arena = Arena::new();
        let l = Layout::from_size_align(100, 8).unwrap();
        let blocks: Vec<_> = (0..8).map(|_| arena.alloc(l).as_ptr()).collect();
        // SAFETY: unused.
        unsafe { arena.release(blocks[0], 100) };
        let held = arena.bytes();
        let id = arena.start_generation().unwrap();
        let new = arena.alloc(l).as_ptr();
        let in_old = |p: *mut u8| arena.chunks.read().old_holding(p as usize).is_some();
        assert!(blocks.iter().all(|&b| in_old(b)) && !in_old(new));
        assert_eq!(arena.bytes(), held + FIRST_CHUNK);
        // Two released one by one, five as relocated.
        // SAFETY: unused, each released once.
        unsafe {
            arena.release(blocks[1], 100);
            arena.release(blocks[2], 100);
            assert!(arena.draining());
            arena.release_relocated(id, 5 * Arena::block_bytes(100));
        }
        assert!(!arena.draining(), "the last release drains it");
        assert_eq!(arena.bytes(), FIRST_CHUNK);
        assert_eq!(arena.live_bytes(), Arena::block_bytes(100));
        // SAFETY: unused.
        unsafe { arena.release(new, 100) };
        assert_eq!(arena.alloc(l).as_ptr(), new, "current blocks are reused");
    }

    #[test]
    fn a_block_larger_than_the_next_chunk_gets_a_chunk_that_fits() {
        let arena = Arena::new();
        let big = Layout::from_size_align(MAX_BLOCK, 16).unwrap();
        let a = arena.alloc(big);
        // SAFETY: the block is ours and MAX_BLOCK bytes long.
        unsafe { std::ptr::write_bytes(a.as_ptr(), 0xab, MAX_BLOCK) };
        assert!(arena.bytes() >= MAX_BLOCK);
    }
}
