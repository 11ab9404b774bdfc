//! Route slots, for values over 4 bytes: every stored prefix owns one
//! fixed-size slot holding its value, addressed by a `u32` id that the
//! trie's leaves hold. (Values of up to 4 bytes live in the leaves.)
//!
//! Slots live in 4096-slot chunks reached through a chunk table sized at
//! creation, so readers index without locks while writers add chunks.
//! A slot is immutable while any leaf can point at it: changing a value
//! takes a new slot. Freed slots are reused only after an epoch grace
//! period, through the shared free list (`core::free_list`): the deferred
//! release links the dead slot by id through its first four bytes.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::core::error::{Error, Result};
use crate::core::free_list::{Chain, FreeList, Links, NIL};
use crate::core::reclaim::Guard;

/// "No route": a leaf with no matching prefix.
pub(super) const NO_ROUTE: u32 = u32::MAX;
const CHUNK_SHIFT: u32 = 12;
const CHUNK: usize = 1 << CHUNK_SHIFT;

pub(super) struct RouteStore {
    value_size: usize,
    slot_size: usize,
    chunks: Box<[AtomicPtr<u8>]>,
    allocated_chunks: AtomicUsize,
    /// Slots back from their grace period.
    returned: FreeList,
}

/// Writer-only allocation state (kept under the trie's writer lock).
#[derive(Debug, Default)]
pub(super) struct RouteAlloc {
    free: Chain,
    next_fresh: u32,
}

/// A free slot holds the id of the next one in its first four bytes
/// (values here are over 4 bytes).
// SAFETY: the link is read back as written, from the same slot.
unsafe impl Links for RouteStore {
    unsafe fn next(&self, id: usize) -> usize {
        // SAFETY: a free slot of an allocated chunk.
        match unsafe { self.slot(id as u32).cast::<u32>().read_unaligned() } {
            NO_ROUTE => NIL,
            next => next as usize,
        }
    }

    unsafe fn set_next(&self, id: usize, next: usize) {
        let next = if next == NIL { NO_ROUTE } else { next as u32 };
        // SAFETY: a free slot nobody else touches.
        unsafe { self.slot(id as u32).cast::<u32>().write_unaligned(next) }
    }
}

impl RouteStore {
    /// Room for `max_entries` live routes plus as many waiting out a grace
    /// period.
    pub fn new(value_size: usize, max_entries: u32) -> Self {
        let slots = (max_entries as usize)
            .saturating_mul(2)
            .saturating_add(CHUNK);
        let n_chunks = slots.div_ceil(CHUNK).min((u32::MAX as usize) / CHUNK);
        RouteStore {
            value_size,
            slot_size: value_size.max(4),
            chunks: (0..n_chunks)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            allocated_chunks: AtomicUsize::new(0),
            returned: FreeList::default(),
        }
    }

    fn chunk_layout(&self) -> Layout {
        Layout::from_size_align(CHUNK * self.slot_size, 8).expect("chunk layout")
    }

    #[inline(always)]
    fn slot(&self, id: u32) -> *mut u8 {
        let chunk = self.chunks[(id >> CHUNK_SHIFT) as usize].load(Ordering::Acquire);
        debug_assert!(!chunk.is_null());
        // SAFETY: ids are handed out only inside allocated chunks.
        unsafe { chunk.add((id as usize & (CHUNK - 1)) * self.slot_size) }
    }

    /// The value of route `id`, readable while `guard` is pinned.
    ///
    /// # Safety
    /// `id` must be a live route: read from the trie under `guard` (or by
    /// the writer).
    #[inline(always)]
    pub unsafe fn value<'g>(&'g self, id: u32, _guard: &'g Guard) -> &'g [u8] {
        // SAFETY: the slot is immutable while reachable (module docs).
        unsafe { std::slice::from_raw_parts(self.slot(id), self.value_size) }
    }

    /// Takes a slot and fills it (writer only).
    pub fn alloc(&self, state: &mut RouteAlloc, value: &[u8]) -> Result<u32> {
        let id = if let Some(id) = self.returned.take(self, &mut state.free) {
            id as u32
        } else {
            let id = state.next_fresh;
            let chunk = (id >> CHUNK_SHIFT) as usize;
            if chunk >= self.chunks.len() {
                // Every slot is live or still in its grace period.
                return Err(Error::Busy);
            }
            if self.chunks[chunk].load(Ordering::Relaxed).is_null() {
                // SAFETY: non-zero size.
                let p = unsafe { alloc_zeroed(self.chunk_layout()) };
                if p.is_null() {
                    return Err(Error::NoMemory);
                }
                self.chunks[chunk].store(p, Ordering::Release);
                self.allocated_chunks.fetch_add(1, Ordering::Relaxed);
            }
            state.next_fresh += 1;
            id
        };
        let slot = self.slot(id);
        // SAFETY: the slot is private to the writer until its id is published.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), slot, value.len()) };
        Ok(id)
    }

    /// Gives back a slot no reader can reach any more (after the grace
    /// period; lock-free, may run on any thread).
    pub fn release(&self, id: u32) {
        // SAFETY: the slot is dead (its grace period is over) and ours.
        unsafe { self.returned.release(self, id as usize) };
    }

    /// Bytes held by slot chunks and the chunk table.
    pub fn bytes(&self) -> usize {
        self.allocated_chunks.load(Ordering::Relaxed) * CHUNK * self.slot_size
            + self.chunks.len() * size_of::<AtomicPtr<u8>>()
    }
}

impl Drop for RouteStore {
    fn drop(&mut self) {
        let layout = self.chunk_layout();
        for chunk in self.chunks.iter() {
            let p = chunk.load(Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: allocated in `alloc` with this layout; no reader
                // remains (we are dropped).
                unsafe { dealloc(p, layout) };
            }
        }
    }
}
