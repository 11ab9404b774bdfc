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

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::free_list::{Chain, FirstWord, FreeList};

const GRANULE: usize = 16;
/// Largest block: 8 KiB (an LPM data block with 256 runs and 511
/// prefixes, or a child block of 256 nodes, is under 5 KiB).
pub(crate) const MAX_BLOCK: usize = 8 << 10;
const CLASSES: usize = MAX_BLOCK / GRANULE + 1;
/// Small maps stay small: chunks start at 4 KiB and double up to 2 MiB.
const FIRST_CHUNK: usize = 4 << 10;
const HUGE_PAGE: usize = 2 << 20;

/// A block arena. `alloc` is for the (single) writer; `release` may run
/// anywhere.
pub(crate) struct Arena {
    writer: Mutex<ArenaWriter>,
    /// Per size class, blocks back from their grace period.
    returned: [FreeList; CLASSES],
    chunks: Mutex<Vec<(NonNull<u8>, Layout)>>,
    chunk_bytes: AtomicUsize,
    /// Bytes in blocks handed out and not yet released.
    live_bytes: AtomicUsize,
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
}

impl Default for ArenaWriter {
    fn default() -> Self {
        ArenaWriter {
            free: std::array::from_fn(|_| Chain::default()),
            cursor: 0,
            end: 0,
            next_chunk: FIRST_CHUNK,
        }
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
    pub fn new() -> Self {
        Arena {
            writer: Mutex::new(ArenaWriter::default()),
            returned: std::array::from_fn(|_| FreeList::default()),
            chunks: Mutex::new(Vec::new()),
            chunk_bytes: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
        }
    }

    /// Allocates a block for `layout` (align at most 16). Meant for a map's
    /// single writer, so the lock is uncontended.
    pub fn alloc(&self, layout: Layout) -> NonNull<u8> {
        debug_assert!(layout.align() <= GRANULE);
        let mut w = self.writer.lock();
        let w = &mut *w;
        let class = class_of(layout.size());
        self.live_bytes
            .fetch_add(class * GRANULE, Ordering::Relaxed);
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
        w.next_chunk = (size * 2).min(HUGE_PAGE).max(w.next_chunk);
        let align = if size >= HUGE_PAGE { HUGE_PAGE } else { 4096 };
        let layout = Layout::from_size_align(size, align).expect("chunk layout");
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout) };
        let Some(chunk) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        #[cfg(all(target_os = "linux", not(miri)))]
        if size >= HUGE_PAGE {
            // SAFETY: advice on memory we own; failure only loses the hint.
            unsafe { libc::madvise(p.cast(), size, libc::MADV_HUGEPAGE) };
        }
        self.chunks.lock().push((chunk, layout));
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
        let class = class_of(size);
        self.live_bytes
            .fetch_sub(class * GRANULE, Ordering::Relaxed);
        // SAFETY: the block is dead, and at least a granule of ours.
        unsafe { self.returned[class].release(&FirstWord, block as usize) };
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
        for (chunk, layout) in self.chunks.get_mut().drain(..) {
            // SAFETY: allocated in new_chunk with this layout; the arena is
            // the last owner.
            unsafe { dealloc(chunk.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        fn live_blocks_never_overlap(ops in prop::collection::vec((any::<bool>(), 1usize..TEST_MAX_BLOCK, any::<u8>()), 1..TEST_OPS)) {
            let arena = Arena::new();
            let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
            for (release, size, fill) in ops {
                if release && !live.is_empty() {
                    let (p, n, f) = live.swap_remove(fill as usize % live.len());
                    // SAFETY: allocated with n bytes, still ours.
                    let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                    prop_assert!(bytes.iter().all(|&b| b == f), "a live block was overwritten");
                    // SAFETY: unreachable from here on.
                    unsafe { arena.release(p, n) };
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
            for (p, n, f) in live {
                // SAFETY: as above.
                let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                prop_assert!(bytes.iter().all(|&b| b == f));
            }
        }
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
