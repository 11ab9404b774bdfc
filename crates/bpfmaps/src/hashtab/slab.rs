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
//! the collector never takes a lock), linked through its `next` word.
//!
//! Readers that hold no pin (`RawTable::read_unpinned`) may still be
//! reading an element while it is recycled, and detect it afterwards. So
//! every word of an element that such a reader loads (header, key, value,
//! free-list link) is written with atomic stores, and a recycled element
//! is refilled only after a release fence (`ElemPtr::init`): a reader that
//! loads any word of the new contents then sees, after its acquire fence,
//! the unlink count its bucket's writer bumped before retiring it.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::{self, NonNull};
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

use parking_lot::Mutex;

use crate::core::error::{Error, Result};
use crate::core::free_list::{Chain, FreeList, Links};
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

    /// The 8-byte word at `offset` (a multiple of 8 inside the element).
    ///
    /// # Safety
    /// The element lies in slab memory that outlives `'a`.
    #[inline(always)]
    unsafe fn word<'a>(self, offset: usize) -> &'a AtomicU64 {
        debug_assert_eq!(offset % 8, 0);
        // SAFETY: elements are 8-aligned and `offset` is a multiple of 8
        // inside one; where readers without a pin may race, slab words are
        // only accessed atomically (see the module doc).
        unsafe { AtomicU64::from_ptr(self.bytes(offset).cast()) }
    }

    /// Whether the key equals `key`, read word by word with atomic loads,
    /// so that it may be called on an element being recycled meanwhile
    /// (the answer is then meaningless, and the caller discards it).
    ///
    /// # Safety
    /// The element lies in slab memory that outlives the call.
    #[inline(always)]
    pub unsafe fn key_matches_racy(self, key: &WordKey) -> bool {
        let stored = |i: usize| {
            // SAFETY: the caller's; the key's words lie inside the element.
            unsafe { self.word(HEADER + 8 * i) }.load(Ordering::Relaxed)
        };
        stored(0) == key.words[0] && (!key.two_words || stored(1) == key.words[1])
    }

    /// Copies the value into `out` with atomic loads (see `key_matches_racy`).
    ///
    /// # Safety
    /// As for `key_matches_racy`.
    #[inline(always)]
    pub unsafe fn copy_value_racy(self, layout: &ElemLayout, out: &mut [u8]) {
        let stored = |i: usize| {
            // SAFETY: the caller's; the value's words lie inside the element.
            unsafe { self.word(layout.value_offset + 8 * i) }.load(Ordering::Relaxed)
        };
        let n = out.len();
        // The common sizes as `bytes::copy` does them: whole words, then
        // one overlapping store for the tail (loading the words into a
        // buffer for `bytes::copy` ran more instructions per lookup).
        match n {
            8..=16 => {
                let first = stored(0);
                out[..8].copy_from_slice(&first.to_le_bytes());
                if n > 8 {
                    let both = u128::from(stored(1)) << 64 | u128::from(first);
                    let tail = (both >> (8 * (n - 8))) as u64;
                    out[n - 8..].copy_from_slice(&tail.to_le_bytes());
                }
            }
            4..=7 => {
                let first = stored(0);
                out[..4].copy_from_slice(&(first as u32).to_le_bytes());
                out[n - 4..].copy_from_slice(&((first >> (8 * (n - 4))) as u32).to_le_bytes());
            }
            _ => {
                let (words, tail) = out.as_chunks_mut::<8>();
                for (i, word) in words.iter_mut().enumerate() {
                    *word = stored(i).to_le_bytes();
                }
                if !tail.is_empty() {
                    let last = stored(n / 8).to_le_bytes();
                    for (byte, value) in tail.iter_mut().zip(last) {
                        *byte = value;
                    }
                }
            }
        }
    }

    /// Stores `bytes` from `offset` in whole words, the last one padded
    /// with zeros.
    ///
    /// # Safety
    /// The words lie inside the element, which the caller owns.
    unsafe fn store_words(self, offset: usize, bytes: &[u8]) {
        for (i, chunk) in bytes.chunks(8).enumerate() {
            // SAFETY: the caller's.
            unsafe { self.word(offset + 8 * i) }.store(padded(chunk), Ordering::Relaxed);
        }
    }

    /// Fills a private element (just taken from the free list, unreachable
    /// through any bucket) before it is published.
    ///
    /// # Safety
    /// The caller owns the element exclusively (readers without a pin may
    /// still load its words; they detect the refill, see the module doc).
    pub unsafe fn init(self, layout: &ElemLayout, hash: u32, key: &[u8], value: &[u8]) {
        debug_assert_eq!(key.len(), layout.key_size);
        debug_assert_eq!(value.len(), layout.value_size);
        // Orders the unlink that retired this element's previous contents
        // before every store below (pairs with `read_unpinned`'s acquire
        // fence).
        fence(Ordering::Release);
        // SAFETY: exclusive ownership.
        let h = unsafe { self.header() };
        h.hash.store(hash, Ordering::Relaxed);
        h.referenced.store(false, Ordering::Relaxed);
        h.next.store(ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: exclusive ownership; the areas lie inside the element.
        unsafe {
            self.store_words(HEADER, key);
            self.store_words(layout.value_offset, value);
        }
    }
}

/// A key of up to 16 bytes as elements store it (`padded` words),
/// prepared once per lookup.
pub(super) struct WordKey {
    words: [u64; 2],
    two_words: bool,
}

impl WordKey {
    #[inline(always)]
    pub fn new(key: &[u8]) -> Self {
        debug_assert!(key.len() <= 16, "longer keys take the pinned walk");
        // Whole-word loads where the key has them (`padded` on both halves
        // ran more instructions per lookup).
        let n = key.len();
        let le_at = |at: usize| u64::from_le_bytes(key[at..at + 8].try_into().expect("8 bytes"));
        let first = if n >= 8 { le_at(0) } else { padded(key) };
        let second = match n {
            16.. => le_at(8),
            // The word that ends the key holds bytes 8.. in its top bytes.
            9..=15 => le_at(n - 8) >> (8 * (16 - n)),
            _ => 0,
        };
        WordKey {
            words: [first, second],
            two_words: n > 8,
        }
    }
}

/// `chunk` (0 to 8 bytes) as a little-endian word, zero-padded: how keys
/// and values are stored. Two overlapping loads instead of a `memcpy`
/// call; the bytes they share are equal, so OR joins them.
#[inline(always)]
fn padded(chunk: &[u8]) -> u64 {
    let n = chunk.len();
    let u32_at = |at: usize| {
        u64::from(u32::from_le_bytes(
            chunk[at..at + 4].try_into().expect("4 bytes"),
        ))
    };
    let u16_at = |at: usize| {
        u64::from(u16::from_le_bytes(
            chunk[at..at + 2].try_into().expect("2 bytes"),
        ))
    };
    match n {
        8 => u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
        4..=7 => u32_at(0) | u32_at(n - 4) << (8 * (n - 4)),
        2..=3 => u16_at(0) | u16_at(n - 2) << (8 * (n - 2)),
        1 => u64::from(chunk[0]),
        0 => 0,
        _ => unreachable!("a chunk holds at most 8 bytes"),
    }
}

/// Free-list links in the element's `next` word, stored atomically and
/// with release ordering: a reader without a pin may still load `next`
/// of a free element (see the module doc).
struct NextLink;

// SAFETY: the link is the element's `next`, read back as stored.
unsafe impl Links for NextLink {
    #[inline]
    unsafe fn next(&self, entry: usize) -> usize {
        // SAFETY: free list entries are slab elements.
        unsafe { &*(entry as *const ElemHeader) }
            .next
            .load(Ordering::Relaxed) as usize
    }

    #[inline]
    unsafe fn set_next(&self, entry: usize, next: usize) {
        // SAFETY: as above.
        unsafe { &*(entry as *const ElemHeader) }
            .next
            .store(next as *mut ElemHeader, Ordering::Release)
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
            // private, its `next` free for the link.
            unsafe { free.push(&NextLink, base.as_ptr().add(i * self.layout.size) as usize) };
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
        let elem = match self.returned.take(&NextLink, &mut free) {
            Some(elem) => elem,
            None => {
                self.grow(&mut free, self.grow_by)?;
                free.pop(&NextLink).expect("a new chunk's elements")
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
        // `next` becomes the link.
        unsafe { self.returned.release(&NextLink, elem.0.as_ptr() as usize) };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-wise reads of the unpinned path see every key byte and
    /// copy every value byte, for each size class they treat apart (the
    /// table's own tests cannot tell: its hash check hides a key compare
    /// that skips bytes).
    #[test]
    fn racy_reads_see_every_key_byte_and_copy_every_value_byte() {
        for ks in 1..=16 {
            for vs in [1, 3, 4, 7, 8, 9, 15, 16, 17, 24, 61, 64] {
                let layout = ElemLayout::new(ks, vs);
                let slab = Slab::new(layout, 1, 1).unwrap();
                let e = slab.alloc().unwrap();
                let key: Vec<u8> = (1..=ks as u8).collect();
                let value: Vec<u8> = (0..vs as u8).map(|j| 0x80 | j).collect();
                // SAFETY: fresh from the slab, ours alone; the slab outlives `e`.
                unsafe { e.init(&layout, 0, &key, &value) };
                // SAFETY: as above.
                assert!(unsafe { e.key_matches_racy(&WordKey::new(&key)) });
                for j in 0..ks {
                    let mut other = key.clone();
                    other[j] ^= 0x40;
                    // SAFETY: as above.
                    let matches = unsafe { e.key_matches_racy(&WordKey::new(&other)) };
                    assert!(!matches, "ks={ks}: byte {j} not compared");
                }
                let mut out = vec![0; vs];
                // SAFETY: as above.
                unsafe { e.copy_value_racy(&layout, &mut out) };
                assert_eq!(out, value, "ks={ks} vs={vs}");
            }
        }
    }
}
