//! Element storage for the hash maps: elements live in large chunks, never
//! one allocation each, and are recycled through a free list once no reader
//! can still see them.
//!
//! ```text
//!  element (size = 16 + round8(key_size) + round8(value_size))
//!  +--------+------+----+----+---------------+-----------------+
//!  | next 8 | hash | lv | rf | key (padded)  | value (padded)  |
//!  +--------+------+----+----+---------------+-----------------+
//!  0        8      12   13   16              16+round8(key)
//! ```
//! `lv` is "live" (linked in a bucket), `rf` the LRU referenced bit.
//!
//! Free list: the shared one (`core::free_list`). Writers take elements
//! from a chain under a mutex. An element unlinked from its bucket is not
//! reusable until every reader pinned at unlink time has unpinned; the
//! epoch collector then releases it, lock-free (a reader thread running
//! the collector never takes a lock), linked through its first word (the
//! dead element's `next`).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::core::error::{Error, Result};
use crate::core::free_list::{Chain, FirstWord, FreeList};
use crate::core::reclaim::drop_in_background;

/// Header at the start of every element; key and value bytes follow.
#[repr(C, align(8))]
pub(super) struct ElemHeader {
    /// Next element in the bucket chain, or in the free list when free.
    pub next: AtomicPtr<ElemHeader>,
    /// Hash of the key, written before the element is published.
    pub hash: AtomicU32,
    /// Whether the element is linked in a bucket.
    pub live: AtomicBool,
    /// LRU: set by lookups, cleared by the clock hand.
    pub referenced: AtomicBool,
}

/// Where key and value sit inside an element.
#[derive(Debug, Clone, Copy)]
pub(super) struct ElemLayout {
    pub key_size: usize,
    pub value_size: usize,
    pub value_offset: usize,
    pub size: usize,
}

const HEADER: usize = size_of::<ElemHeader>();
/// Elements are 8-aligned so typed values up to 8-byte alignment can be
/// borrowed in place.
pub(super) const ELEM_ALIGN: usize = 8;

impl ElemLayout {
    pub fn new(key_size: usize, value_size: usize) -> Self {
        let round = |n: usize| n.div_ceil(ELEM_ALIGN) * ELEM_ALIGN;
        let value_offset = HEADER + round(key_size);
        ElemLayout {
            key_size,
            value_size,
            value_offset,
            size: value_offset + round(value_size),
        }
    }
}

/// A pointer to an element that may cross threads (inside deferred frees).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct ElemPtr(pub NonNull<ElemHeader>);
// SAFETY: an ElemPtr is only an address into slab memory that outlives it;
// who may touch the element is governed by bucket locks and epochs.
unsafe impl Send for ElemPtr {}

impl ElemPtr {
    /// # Safety
    /// The element must be live for `'a` (reachable under a pinned guard, or
    /// owned by the caller).
    #[inline]
    pub unsafe fn header<'a>(self) -> &'a ElemHeader {
        // SAFETY: the caller guarantees the element outlives 'a.
        unsafe { self.0.as_ref() }
    }

    #[inline]
    fn bytes(self, offset: usize) -> *mut u8 {
        // SAFETY: offset stays inside the element (callers pass layout offsets).
        unsafe { self.0.as_ptr().cast::<u8>().add(offset) }
    }

    /// # Safety
    /// As for `header`; the key must not be written during `'a`.
    #[inline]
    pub unsafe fn key<'a>(self, layout: &ElemLayout) -> &'a [u8] {
        // SAFETY: the key lies inside the element; it is immutable while the
        // element is reachable.
        unsafe { std::slice::from_raw_parts(self.bytes(HEADER), layout.key_size) }
    }

    /// # Safety
    /// As for `key`.
    #[inline]
    pub unsafe fn value<'a>(self, layout: &ElemLayout) -> &'a [u8] {
        // SAFETY: as for key.
        unsafe { std::slice::from_raw_parts(self.bytes(layout.value_offset), layout.value_size) }
    }

    /// Fills a private element (just taken from the free list, unreachable
    /// by readers) before it is published.
    ///
    /// # Safety
    /// The caller owns the element exclusively.
    pub unsafe fn init(self, layout: &ElemLayout, hash: u32, key: &[u8], value: &[u8]) {
        debug_assert_eq!(key.len(), layout.key_size);
        debug_assert_eq!(value.len(), layout.value_size);
        // SAFETY: exclusive ownership; the ranges lie inside the element.
        unsafe {
            let h = self.header();
            h.hash.store(hash, Ordering::Relaxed);
            h.referenced.store(false, Ordering::Relaxed);
            h.next.store(ptr::null_mut(), Ordering::Relaxed);
            ptr::copy_nonoverlapping(key.as_ptr(), self.bytes(HEADER), key.len());
            ptr::copy_nonoverlapping(value.as_ptr(), self.bytes(layout.value_offset), value.len());
        }
    }
}

/// One contiguous run of elements.
struct Chunk {
    base: NonNull<u8>,
    elems: usize,
    layout: Layout,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `Slab::grow` with this layout.
        unsafe { dealloc(self.base.as_ptr(), self.layout) }
    }
}

// SAFETY: a Chunk is plain memory; access to its elements is synchronised by
// the table's locks and epochs.
unsafe impl Send for Chunk {}

/// All elements of one map.
pub(super) struct Slab {
    pub layout: ElemLayout,
    chunks: Mutex<Vec<Chunk>>,
    /// Free elements for writers.
    free: Mutex<Chain>,
    /// Elements back from their grace period.
    returned: FreeList,
    total: AtomicUsize,
    /// Elements per chunk when growing.
    grow_by: usize,
}

// SAFETY: element memory is shared by design and guarded by the table's
// protocol; the free chain is only touched under its mutex.
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl Slab {
    /// A slab holding `prealloc` elements up front; it grows by `grow_by`
    /// when the free list runs dry.
    pub fn new(layout: ElemLayout, prealloc: usize, grow_by: usize) -> Result<Self> {
        let slab = Slab {
            layout,
            chunks: Mutex::new(Vec::new()),
            free: Mutex::new(Chain::default()),
            returned: FreeList::default(),
            total: AtomicUsize::new(0),
            grow_by: grow_by.max(1),
        };
        if prealloc > 0 {
            slab.grow(&mut slab.free.lock(), prealloc)?;
        }
        Ok(slab)
    }

    /// Allocates a chunk of `n` elements and threads them onto `free`.
    fn grow(&self, free: &mut Chain, n: usize) -> Result<()> {
        let bytes = n.checked_mul(self.layout.size).ok_or(Error::NoMemory)?;
        let layout = Layout::from_size_align(bytes, 64).map_err(|_| Error::NoMemory)?;
        // SAFETY: non-zero size (n >= 1, element size >= 16).
        let base = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(Error::NoMemory)?;
        for i in (0..n).rev() {
            // SAFETY: i < n, inside the chunk; the element is fresh and
            // private, its first word free for the link.
            unsafe { free.push(&FirstWord, base.as_ptr().add(i * self.layout.size) as usize) };
        }
        self.chunks.lock().push(Chunk {
            base,
            elems: n,
            layout,
        });
        self.total.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Takes a free element for a writer.
    pub fn alloc(&self) -> Result<ElemPtr> {
        let mut free = self.free.lock();
        let elem = match self.returned.take(&FirstWord, &mut free) {
            Some(elem) => elem,
            None => {
                self.grow(&mut free, self.grow_by)?;
                free.pop(&FirstWord).expect("a new chunk's elements")
            }
        };
        Ok(ElemPtr(
            NonNull::new(elem as *mut ElemHeader).expect("free list holds non-null elements"),
        ))
    }

    /// Gives back an element no reader can see any more (called after the
    /// grace period, possibly on a reader's thread: lock-free).
    pub fn release(&self, elem: ElemPtr) {
        // SAFETY: the element is unreachable by readers and writers; its
        // first word (`next`) becomes the link.
        unsafe { self.returned.release(&FirstWord, elem.0.as_ptr() as usize) };
    }

    /// Bytes held by element chunks.
    pub fn bytes(&self) -> usize {
        self.total.load(Ordering::Relaxed) * self.layout.size
    }

    /// Calls `f` on every element slot, in chunk order (for the LRU clock).
    /// `f` returns `false` to stop.
    pub fn for_each_from(&self, start: usize, mut f: impl FnMut(usize, ElemPtr) -> bool) {
        let chunks = self.chunks.lock();
        let total: usize = chunks.iter().map(|c| c.elems).sum();
        if total == 0 {
            return;
        }
        let mut index = start % total;
        for _ in 0..total {
            let (mut chunk, mut offset) = (0, index);
            while offset >= chunks[chunk].elems {
                offset -= chunks[chunk].elems;
                chunk += 1;
            }
            // SAFETY: offset < elems of that chunk.
            let elem = unsafe { chunks[chunk].base.as_ptr().add(offset * self.layout.size) };
            let elem = ElemPtr(NonNull::new(elem.cast()).expect("chunk memory is non-null"));
            if !f(index, elem) {
                return;
            }
            index = (index + 1) % total;
        }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // Freeing a million-element map must not stall whoever drops it
        // (possibly a reader running the epoch collector).
        drop_in_background(std::mem::take(&mut *self.chunks.lock()));
    }
}
