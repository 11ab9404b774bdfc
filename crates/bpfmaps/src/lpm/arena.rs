//! Block arena for the LPM trie: node blocks are carved from large chunks
//! instead of one heap allocation each, so a lookup's few blocks share
//! pages (the kernel trie's dTLB problem), big chunks are backed by huge
//! pages where the kernel allows (`MADV_HUGEPAGE`), and dropping a trie of
//! a million prefixes frees a few dozen chunks instead of walking it.
//!
//! Sizes are rounded up to 16-byte classes. The writer (one at a time,
//! under the trie's lock) allocates from a private free list per class, then
//! from blocks returned after their grace period, then from the current
//! chunk; when that is used up, from the smallest larger free block, split,
//! and only then from a new chunk. Returns arrive from epoch-deferred closures on any thread, so they
//! go onto a lock-free push-only stack per class (linked through the dead
//! block's first word), which the writer drains whole.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use parking_lot::Mutex;

const GRANULE: usize = 16;
/// Largest block: a data block with 256 runs and 511 prefixes, or a child
/// block of 256 nodes, is under 5 KiB.
const MAX_BLOCK: usize = 8 << 10;
const CLASSES: usize = MAX_BLOCK / GRANULE + 1;
/// Small tries stay small: chunks start at 4 KiB and double up to 2 MiB.
const FIRST_CHUNK: usize = 4 << 10;
const HUGE_PAGE: usize = 2 << 20;

/// A block arena. `alloc` is for the (single) writer; `release` may run
/// anywhere.
pub(super) struct Arena {
    writer: Mutex<ArenaWriter>,
    returned: [AtomicPtr<u8>; CLASSES],
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

/// The writer's side: private free lists and the chunk being carved.
struct ArenaWriter {
    free: [*mut u8; CLASSES],
    cursor: *mut u8,
    end: *mut u8,
    next_chunk: usize,
}

// SAFETY: used only under the trie's writer lock.
unsafe impl Send for ArenaWriter {}

impl Default for ArenaWriter {
    fn default() -> Self {
        ArenaWriter {
            free: [ptr::null_mut(); CLASSES],
            cursor: ptr::null_mut(),
            end: ptr::null_mut(),
            next_chunk: FIRST_CHUNK,
        }
    }
}

/// Puts the free block at `block` of `class` granules on the writer's list.
fn push_free(w: &mut ArenaWriter, block: *mut u8, class: usize) {
    // SAFETY: the block is free, at least one granule, and ours to link.
    unsafe { block.cast::<*mut u8>().write(w.free[class]) };
    w.free[class] = block;
}

fn class_of(size: usize) -> usize {
    assert!(
        size <= MAX_BLOCK,
        "LPM block of {size} bytes exceeds the arena's largest class"
    );
    size.div_ceil(GRANULE)
}

impl Arena {
    pub fn new() -> Self {
        Arena {
            writer: Mutex::new(ArenaWriter::default()),
            returned: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            chunks: Mutex::new(Vec::new()),
            chunk_bytes: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
        }
    }

    /// Allocates a block for `layout` (align at most 16). Meant for the
    /// trie's single writer, so the lock is uncontended.
    pub fn alloc(&self, layout: Layout) -> NonNull<u8> {
        debug_assert!(layout.align() <= GRANULE);
        let mut w = self.writer.lock();
        let w = &mut *w;
        let class = class_of(layout.size());
        self.live_bytes
            .fetch_add(class * GRANULE, Ordering::Relaxed);
        if w.free[class].is_null() {
            w.free[class] = self.returned[class].swap(ptr::null_mut(), Ordering::Acquire);
        }
        let block = w.free[class];
        if let Some(block) = NonNull::new(block) {
            // SAFETY: a free block's first word links to the next free one.
            w.free[class] = unsafe { block.as_ptr().cast::<*mut u8>().read() };
            return block;
        }
        let size = class * GRANULE;
        if (w.end as usize) - (w.cursor as usize) < size {
            if let Some(block) = self.split_free(w, class) {
                return block;
            }
            // The end of the chunk becomes a free block of its own size.
            let tail = (w.end as usize) - (w.cursor as usize);
            if tail >= GRANULE {
                push_free(w, w.cursor, tail / GRANULE);
            }
            self.new_chunk(w, size);
        }
        let block = w.cursor;
        // SAFETY: the chunk has room for `size` more bytes.
        w.cursor = unsafe { w.cursor.add(size) };
        NonNull::new(block).expect("chunk memory")
    }

    /// Before the arena grows: the smallest free block of a larger class,
    /// its first `class` granules handed out and the rest kept free.
    /// Returned blocks are taken in first, all classes at once. Runs once
    /// per chunk, so its walks cost little; it keeps the free lists of a
    /// trie built by many copy-on-write updates from holding more than
    /// the trie itself (blocks grow a class at a time as nodes fill).
    fn split_free(&self, w: &mut ArenaWriter, class: usize) -> Option<NonNull<u8>> {
        for c in 1..CLASSES {
            let mut block = self.returned[c].swap(ptr::null_mut(), Ordering::Acquire);
            while !block.is_null() {
                // SAFETY: a free block's first word links to the next.
                let next = unsafe { block.cast::<*mut u8>().read() };
                push_free(w, block, c);
                block = next;
            }
        }
        let c = (class + 1..CLASSES).find(|&c| !w.free[c].is_null())?;
        let block = w.free[c];
        // SAFETY: as above.
        w.free[c] = unsafe { block.cast::<*mut u8>().read() };
        // SAFETY: the block has c > class granules.
        push_free(w, unsafe { block.add(class * GRANULE) }, c - class);
        NonNull::new(block)
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
        #[cfg(target_os = "linux")]
        if size >= HUGE_PAGE {
            // SAFETY: advice on memory we own; failure only loses the hint.
            unsafe { libc::madvise(p.cast(), size, libc::MADV_HUGEPAGE) };
        }
        self.chunks.lock().push((chunk, layout));
        self.chunk_bytes.fetch_add(size, Ordering::Relaxed);
        w.cursor = p;
        // SAFETY: one past the end of the chunk.
        w.end = unsafe { p.add(size) };
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
        let mut head = self.returned[class].load(Ordering::Relaxed);
        loop {
            // SAFETY: the block is dead; its first word becomes the link.
            unsafe { block.cast::<*mut u8>().write(head) };
            match self.returned[class].compare_exchange_weak(
                head,
                block,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Whether some released block is waiting to be reused (for tests).
    #[cfg(test)]
    pub fn has_returned(&self) -> bool {
        self.returned
            .iter()
            .any(|r| !r.load(Ordering::Relaxed).is_null())
    }

    /// Bytes of chunk memory held.
    pub fn bytes(&self) -> usize {
        self.chunk_bytes.load(Ordering::Relaxed)
    }

    /// Bytes in live blocks (rounded to their size class): what the trie
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
        for _ in 0..2000 {
            arena.alloc(Layout::from_size_align(MAX_BLOCK, 16).unwrap());
        }
        assert!(arena.bytes() >= 2000 * MAX_BLOCK);
    }

    use proptest::prelude::*;

    proptest! {
        /// Random allocations and releases (sizes across all classes):
        /// live blocks never overlap, and each keeps what was written into
        /// it, through block reuse, splitting and chunk tails.
        #[test]
        fn live_blocks_never_overlap(ops in prop::collection::vec((any::<bool>(), 1usize..MAX_BLOCK, any::<u8>()), 1..400)) {
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
