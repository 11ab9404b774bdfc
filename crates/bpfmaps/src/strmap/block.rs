//! One trie node in one allocation: the bytes every key below it shares
//! (its skip), the value of the key that ends here, and its children, each
//! either another node or a leaf held inline (the rest of its key and its
//! value). Keys are stored once, spread over the path that spells them.
//!
//! Layout, in 8-byte words:
//!
//! ```text
//! [header][slot 0] .. [slot n-1][bytes ..]
//! bytes: labels (n, ascending) | skip | end value (if any) | leaf records
//! leaf record: tail | value
//! ```
//!
//! Slot `i` is the child under `labels[i]`: a pointer to a node (low bit
//! 0) or `tail_len << 32 | offset << 1 | 1`, a leaf whose record is at
//! `offset` of the byte area. The slot holds the tail's length, so a
//! record is only its bytes (a length in the record cost two bytes per
//! leaf, about 1.8 bytes per key on kernel symbols).
//! A node is immutable once published, except the slots of node children,
//! which the writer swaps (release) when it replaces a child; every other
//! change builds a new node and publishes it through its parent's slot.
//!
//! A bucket (see "Buckets" below) is a node with no slots whose byte area
//! holds a small subtree's keys as sorted records.
//!
//! A node is its own heap allocation, or one of many copied into a
//! [`Slab`] (its header's packed bit set) by a compaction that lays a
//! subtree out in walk order; a packed node is never freed alone, its slab
//! is, once its last node is retired.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::bytes;
use crate::core::prefetch::prefetch;

/// 0x01 in every byte of a word.
const LOW_BYTES: u64 = 0x0101_0101_0101_0101;

/// Most children a node has: one per byte value.
pub const MAX_CHILDREN: usize = 256;

const N_BITS: u32 = 9;
const END_BIT: u64 = 1 << N_BITS;
const SKIP_SHIFT: u32 = N_BITS + 1;
const SKIP_BITS: u32 = 13;
/// Set in the header of a node that lives in a [`Slab`].
const PACKED_BIT: u64 = 1 << (SKIP_SHIFT + SKIP_BITS);
/// Where a packed node's header keeps the size of its subtree (itself
/// and everything below, back to back in its slab) in cache lines, 1 to
/// [`MAX_SPAN_LINES`]; 0 when it is bigger, or the node is not packed.
const SPAN_SHIFT: u32 = SKIP_SHIFT + SKIP_BITS + 1;
const SPAN_BITS: u32 = 8;
/// Largest subtree span a header records, in lines.
pub const MAX_SPAN_LINES: usize = (1 << SPAN_BITS) - 1;
const WORDS_SHIFT: u32 = 32;
const WORDS_MASK: u64 = (1 << 31) - 1;
/// Set in the header of a bucket ([`Bucket`](#buckets)): a node with no
/// children that holds a small subtree's keys as sorted records.
const BUCKET_BIT: u64 = 1 << 63;
/// Where a leaf's slot keeps its tail's length (its record's offset, in
/// the bits below, is under 2^31: a node's byte area is at most 256
/// leaves of 4095 tail bytes and 65535 value bytes).
const LEAF_LEN_SHIFT: u32 = 32;

/// Longest skip a node can hold; keys are at most 4096 bytes, so a skip
/// (which never holds a key's first byte) is at most 4095.
pub const MAX_SKIP: usize = (1 << SKIP_BITS) - 1;

/// A published node, readable while the guard of lifetime `'g` is pinned.
#[derive(Clone, Copy)]
pub struct Node<'g> {
    base: NonNull<AtomicU64>,
    _guard: PhantomData<&'g ()>,
}

/// Where one node of a lookup leads ([`Node::step`]).
pub enum Step<'g, 'k> {
    /// On to this node, with this much of the key left.
    Down(Node<'g>, &'k [u8]),
    /// The answer.
    Done(Option<&'g [u8]>),
}

/// A child as a reader sees it.
pub enum Child<'g> {
    Node(Node<'g>),
    Leaf { tail: &'g [u8], value: &'g [u8] },
}

impl<'g> Node<'g> {
    /// The node a non-zero slot word points at.
    ///
    /// # Safety
    /// `word` was loaded (acquire) from a slot or root of a live trie under
    /// the guard of lifetime `'g`, and is a node pointer.
    #[inline(always)]
    pub unsafe fn from_word(word: u64) -> Self {
        debug_assert!(word != 0 && word & 1 == 0);
        Node {
            // SAFETY: non-zero (caller).
            base: unsafe { NonNull::new_unchecked(word as usize as *mut AtomicU64) },
            _guard: PhantomData,
        }
    }

    /// The word that points at this node.
    #[inline(always)]
    pub fn word(self) -> u64 {
        self.base.as_ptr() as usize as u64
    }

    /// A plain read, so that the several fields a lookup reads from one
    /// node come from one load (atomic loads are never merged).
    #[inline(always)]
    fn header(self) -> u64 {
        // SAFETY: every node has its header word, written before the node
        // was published (the reader's acquire load of the pointer orders
        // it) and never again: no write races this read.
        unsafe { *(self.base.as_ptr() as *const u64) }
    }

    /// Number of children.
    #[inline(always)]
    pub fn len(self) -> usize {
        (self.header() & ((1 << N_BITS) - 1)) as usize
    }

    /// Whether a key ends at this node.
    #[inline(always)]
    pub fn has_end(self) -> bool {
        self.header() & END_BIT != 0
    }

    #[inline(always)]
    fn skip_len(self) -> usize {
        ((self.header() >> SKIP_SHIFT) & ((1 << SKIP_BITS) - 1)) as usize
    }

    fn words(self) -> usize {
        ((self.header() >> WORDS_SHIFT) & WORDS_MASK) as usize
    }

    /// Whether this node is a bucket: the keys of a small subtree as
    /// sorted records, no children.
    #[inline(always)]
    pub fn is_bucket(self) -> bool {
        self.header() & BUCKET_BIT != 0
    }

    /// Whether this node holds at most one bucket's worth of keys without
    /// children of its own: a bucket, or a node holding one key (a
    /// subtree's only key, or a tail too long to keep inline).
    #[inline(always)]
    pub fn is_small(self) -> bool {
        self.len() == 0
    }

    /// Whether this node lives in a [`Slab`] (and is freed with it).
    #[inline]
    pub fn is_packed(self) -> bool {
        self.header() & PACKED_BIT != 0
    }

    /// The lines its packed subtree spans (0: not packed, or more than
    /// [`MAX_SPAN_LINES`]).
    #[inline(always)]
    pub fn span_lines(self) -> usize {
        ((self.header() >> SPAN_SHIFT) & ((1 << SPAN_BITS) - 1)) as usize
    }

    /// Records that its subtree takes `bytes` bytes from its start on.
    ///
    /// # Safety
    /// The node is a packed copy not yet published.
    pub unsafe fn set_span(self, bytes: usize) {
        let lines = bytes.div_ceil(64);
        if (1..=MAX_SPAN_LINES).contains(&lines) {
            // SAFETY: unpublished (caller): no reader, no other writer.
            unsafe { *(self.base.as_ptr() as *mut u64) |= (lines as u64) << SPAN_SHIFT };
        }
    }

    /// Asks for every line of its packed subtree (`span_lines` of them).
    #[inline(always)]
    pub fn prefetch_subtree(self, lines: usize) {
        let start = (self.base.as_ptr() as usize) & !63;
        // One more line than the span: the node need not start a line.
        for i in 0..=lines {
            prefetch((start + 64 * i) as *const u8);
        }
    }

    /// Copies this node, marked packed, to `dst` (room for
    /// `size() / 8` words); returns the copy's word. Its node slots still
    /// point at this node's children: the caller repoints them.
    ///
    /// # Safety
    /// `dst` is valid for writes of this node's words, 8-byte aligned,
    /// and unpublished; the caller holds the writer lock, so no slot of
    /// this node changes during the copy.
    pub unsafe fn copy_packed(self, dst: NonNull<u64>) -> u64 {
        let words = self.words();
        let n = self.len();
        // SAFETY: `dst` holds `words` words (caller); the header and the
        // byte area are never written after publication, and the slots
        // are read atomically.
        unsafe {
            let dst = dst.as_ptr();
            dst.write(self.header() | PACKED_BIT);
            for i in 0..n {
                dst.add(1 + i).write(self.slot(i).load(Ordering::Relaxed));
            }
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(1 + n) as *const u64,
                dst.add(1 + n),
                words - 1 - n,
            );
            dst as usize as u64
        }
    }

    /// Bytes this node's allocation takes.
    pub fn size(self) -> usize {
        self.words() * 8
    }

    /// The byte area: labels, skip, end value, leaf records.
    #[inline(always)]
    fn bytes(self) -> &'g [u8] {
        let n = self.len();
        // SAFETY: the words after the slots are written before the node is
        // published and never again, so a shared borrow of them is sound
        // for as long as the guard keeps the node alive.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(1 + n) as *const u8,
                (self.words() - 1 - n) * 8,
            )
        }
    }

    /// The labels of the children, ascending.
    #[inline(always)]
    pub fn labels(self) -> &'g [u8] {
        &self.bytes()[..self.len()]
    }

    /// The bytes every key in this subtree has next.
    #[inline(always)]
    pub fn skip(self) -> &'g [u8] {
        let n = self.len();
        &self.bytes()[n..n + self.skip_len()]
    }

    /// The value of the key that ends here (its length is `value_size`).
    #[inline(always)]
    pub fn end_value(self, value_size: usize) -> Option<&'g [u8]> {
        let at = self.len() + self.skip_len();
        self.has_end().then(|| &self.bytes()[at..at + value_size])
    }

    /// The slot of child `i`.
    #[inline(always)]
    pub fn slot(self, i: usize) -> &'g AtomicU64 {
        debug_assert!(i < self.len());
        // SAFETY: i < n slots follow the header.
        unsafe { &*self.base.as_ptr().add(1 + i) }
    }

    /// Child `i`.
    #[inline(always)]
    pub fn child(self, i: usize, value_size: usize) -> Child<'g> {
        let word = self.slot(i).load(Ordering::Acquire);
        if word & 1 == 0 {
            // SAFETY: a node pointer read from a live node's slot.
            return Child::Node(unsafe { Node::from_word(word) });
        }
        leaf(word, self.bytes(), value_size)
    }

    /// Its fields decoded once, for a loop over its children.
    #[inline(always)]
    pub fn parts(self, value_size: usize) -> Parts<'g> {
        let (n, skip_len) = (self.len(), self.skip_len());
        let bytes = self.bytes();
        let (labels, rest) = bytes.split_at(n);
        let (skip, rest) = rest.split_at(skip_len);
        Parts {
            labels,
            skip,
            end: self.has_end().then(|| &rest[..value_size]),
            // SAFETY: `n` slots follow the header.
            slots: unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(1), n) },
            bytes,
            value_size,
        }
    }

    /// Child `i` if there is one and it is a node (no leaf record
    /// looked at).
    #[inline(always)]
    pub fn node_child(self, i: usize) -> Option<Node<'g>> {
        let word = (i < self.len()).then(|| self.slot(i).load(Ordering::Acquire))?;
        // SAFETY: a node pointer read from a live node's slot.
        (word & 1 == 0).then(|| unsafe { Node::from_word(word) })
    }

    /// Asks for this node's first two cache lines (most nodes are under
    /// 128 bytes), before they are read.
    #[inline(always)]
    pub fn prefetch(self) {
        let p = self.base.as_ptr().cast::<u8>();
        prefetch(p);
        prefetch(p.wrapping_add(64));
    }

    /// Asks for every child node, so that an ordered walk finds a later
    /// sibling in cache by the time it gets there.
    #[inline]
    pub fn prefetch_children(self) {
        for i in 0..self.len() {
            // Relaxed: only an address to prefetch; the walk loads the
            // slot again (acquire) before reading the child.
            let word = self.slot(i).load(Ordering::Relaxed);
            if word & 1 == 0 {
                // SAFETY: a node pointer read from a live node's slot.
                unsafe { Node::from_word(word) }.prefetch();
            }
        }
    }

    /// One node of a lookup: `rest` is what of the key is left to match
    /// here. The hot loop of every lookup, so it decodes the header once
    /// and reads the fields at the offsets the layout fixes, with no
    /// bound checks (callgrind, lookups of this machine's kernel symbols
    /// in a scratch program: 946 instructions per lookup, 1,019 with the
    /// fields sliced one by one).
    #[inline(always)]
    pub fn step<'k>(self, rest: &'k [u8], value_size: usize) -> Step<'g, 'k> {
        let header = self.header();
        let n = (header & ((1 << N_BITS) - 1)) as usize;
        let skip_len = ((header >> SKIP_SHIFT) & ((1 << SKIP_BITS) - 1)) as usize;
        // SAFETY: the byte area follows the header and `n` slots and holds
        // the labels (`n`), the skip (`skip_len`), the end value
        // (`value_size`, when END_BIT is set) and every leaf's record at
        // the offset and of the tail length its slot gives, followed by
        // `value_size` value bytes (`Spec::build`); it is never written
        // once the node is published, and the guard keeps it alive.
        unsafe {
            let bytes = self.base.as_ptr().add(1 + n) as *const u8;
            let field = |at: usize, len: usize| std::slice::from_raw_parts(bytes.add(at), len);
            let Some(rest) = bytes::strip_prefix(rest, field(n, skip_len)) else {
                return Step::Done(None);
            };
            if header & BUCKET_BIT != 0 {
                return Step::Done(bucket_find(bytes.add(skip_len), rest, value_size));
            }
            let Some((&label, after)) = rest.split_first() else {
                let end = header & END_BIT != 0;
                return Step::Done(end.then(|| field(n + skip_len, value_size)));
            };
            let Some(i) = find_label(field(0, (n + skip_len).next_multiple_of(8)), n, label) else {
                return Step::Done(None);
            };
            let word = self.slot(i).load(Ordering::Acquire);
            if word & 1 == 0 {
                return Step::Down(Node::from_word(word), after);
            }
            let at = (word as u32 >> 1) as usize;
            let tail_len = (word >> LEAF_LEN_SHIFT) as usize;
            let found = bytes::equal(field(at, tail_len), after);
            Step::Done(found.then(|| field(at + tail_len, value_size)))
        }
    }

    /// The index of the child under `label`.
    #[inline(always)]
    pub fn find(self, label: u8) -> Option<usize> {
        find_label(self.bytes(), self.len(), label)
    }

    /// A bucket's records by index, for a writer.
    pub fn bucket(self, value_size: usize) -> Bucket<'g> {
        debug_assert!(self.is_bucket());
        let area = &self.bytes()[self.skip_len()..];
        let c = usize::from(area[0]);
        let (tags, rest) = area[1..].split_at(c);
        let (offsets, records) = rest.split_at(2 * (c + 1));
        Bucket {
            tags,
            offsets,
            records,
            value_size,
        }
    }

    /// A bucket's records in order: each key's rest past the skip, and its
    /// value.
    pub fn bucket_entries(self, value_size: usize) -> BucketEntries<'g> {
        self.bucket_entries_from(value_size, 0)
    }

    /// A bucket's records in order from record `first` on.
    pub fn bucket_entries_from(self, value_size: usize, first: usize) -> BucketEntries<'g> {
        let bucket = self.bucket(value_size);
        let first = first.min(bucket.len());
        BucketEntries {
            ends: &bucket.offsets[2 * (first + 1)..],
            records: bucket.records,
            value_size,
            start: bucket.offset(first),
        }
    }

    /// How many keys a bucket holds.
    pub fn bucket_len(self) -> usize {
        self.bucket(0).len()
    }
}

// Buckets
//
// Below a branching point, most subtrees hold a handful of keys spread
// over a chain of small nodes (70 % of the nodes of the real key sets
// have two children): a lookup would wait for one node after another.
// A subtree of at most `BUCKET_KEYS` keys whose records take at most
// `BUCKET_BYTES` is instead one *bucket*: a childless node whose byte
// area holds
//
//   skip | c | tags (c bytes) | offsets (c + 1 u16) | records
//   record i: rest of key i past the skip | value     (sorted by rest)
//
// A lookup strips the skip, hashes the rest of its key to a one-byte tag,
// compares it with the c tags a word at a time and checks the record of
// each tag that matches: one node, a few lines, instead of a chain. The
// records are in key order, so a walk reads them front to back, and the
// offsets give each record's bounds (`offsets[c]` is the records' end).
// Whether a set of keys is a bucket depends only on the set (its count and
// its rests past their common prefix), so the shape stays canonical.

/// Most keys a bucket holds (its count is a byte). Chosen by `strmap-real`
/// lookups of the shared kernel symbols, BTF strings and English words
/// against 32, 64 and 128 keys: the larger, the fewer nodes above the
/// buckets and the faster (docs/benchmarks.md, "String keys").
pub const BUCKET_KEYS: usize = 255;
/// Most bytes a bucket's records (rests past its skip, and values) take:
/// what a write copies. 4 KiB against 3 KiB in the same runs, and against
/// 6 and 8 KiB in a scratch program: larger buckets looked up no faster
/// beyond the noise.
pub const BUCKET_BYTES: usize = 4096;

/// A key's rest hashed to a bucket's one-byte tag: its length and its
/// first and last (up to) eight bytes, mixed by a multiply.
#[inline(always)]
pub fn tag(rest: &[u8]) -> u8 {
    let n = rest.len();
    let load = |s: &[u8]| {
        let mut word = [0u8; 8];
        word[..s.len()].copy_from_slice(s);
        u64::from_le_bytes(word)
    };
    let (head, tail) = if n >= 8 {
        (load(&rest[..8]), load(&rest[n - 8..]))
    } else {
        (load(rest), 0)
    };
    let h = (head ^ tail.rotate_left(29) ^ (n as u64) << 56).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 56) as u8
}

/// The value of `rest` in the bucket whose area (past its skip) starts at
/// `area`.
///
/// # Safety
/// `area` points at a published bucket's `c` byte, followed by its tags,
/// offsets and records as `build_bucket` laid them out, and at least 8
/// bytes past the tags rounded up to a word (the offsets alone are 6 or
/// more, the records 2 or more); the guard keeps them alive.
#[inline(always)]
unsafe fn bucket_find<'g>(area: *const u8, rest: &[u8], value_size: usize) -> Option<&'g [u8]> {
    // SAFETY: the layout above (caller).
    unsafe {
        let c = usize::from(*area);
        let tags = area.add(1);
        let offsets = tags.add(c);
        let records = offsets.add(2 * (c + 1));
        let offset = |i: usize| {
            usize::from(u16::from_le_bytes([
                *offsets.add(2 * i),
                *offsets.add(2 * i + 1),
            ]))
        };
        let pattern = u64::from(tag(rest)) * LOW_BYTES;
        for w in 0..c.div_ceil(8) {
            let x = u64::from_le((tags.add(8 * w) as *const u64).read_unaligned()) ^ pattern;
            // Every zero byte of `x` (a matching tag) is flagged; a flag
            // above one may be false, and the record compare refuses it.
            let mut zero = x.wrapping_sub(LOW_BYTES) & !x & (LOW_BYTES << 7);
            while zero != 0 {
                let i = 8 * w + zero.trailing_zeros() as usize / 8;
                if i >= c {
                    break;
                }
                let (start, end) = (offset(i), offset(i + 1));
                let len = end - start - value_size;
                if bytes::equal(std::slice::from_raw_parts(records.add(start), len), rest) {
                    return Some(std::slice::from_raw_parts(
                        records.add(start + len),
                        value_size,
                    ));
                }
                zero &= zero - 1;
            }
        }
        None
    }
}

/// A bucket's records by index ([`Node::bucket`]).
#[derive(Clone, Copy)]
pub struct Bucket<'g> {
    tags: &'g [u8],
    /// `len() + 1` of them: record `i` is `offsets[i]..offsets[i + 1]`.
    offsets: &'g [u8],
    records: &'g [u8],
    value_size: usize,
}

impl<'g> Bucket<'g> {
    /// How many keys it holds.
    pub fn len(self) -> usize {
        self.tags.len()
    }

    fn offset(self, i: usize) -> usize {
        usize::from(u16::from_le_bytes([
            self.offsets[2 * i],
            self.offsets[2 * i + 1],
        ]))
    }

    /// Record `i`: its rest and its value.
    pub fn record(self, i: usize) -> (&'g [u8], &'g [u8]) {
        let record = &self.records[self.offset(i)..self.offset(i + 1)];
        record.split_at(record.len() - self.value_size)
    }

    /// Bytes its records take.
    pub fn records_bytes(self) -> usize {
        self.offset(self.len())
    }

    /// Where `rest` is among its records (sorted), as `binary_search`.
    pub fn search(self, rest: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.record(mid).0.cmp(rest) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }
}

/// Iterator over a bucket's records ([`Node::bucket_entries`]).
pub struct BucketEntries<'g> {
    /// The ends of the records not yet visited.
    ends: &'g [u8],
    records: &'g [u8],
    value_size: usize,
    /// Where the next record starts.
    start: usize,
}

impl<'g> Iterator for BucketEntries<'g> {
    type Item = (&'g [u8], &'g [u8]);

    /// One offset read per record: its start is the last one's end.
    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let (end, ends) = self.ends.split_first_chunk::<2>()?;
        let end = usize::from(u16::from_le_bytes(*end));
        self.ends = ends;
        let record = &self.records[self.start..end];
        self.start = end;
        Some(record.split_at(record.len() - self.value_size))
    }
}

/// A copy of `old` (a bucket) with its records `at..at + removed`
/// replaced by `added` (a key's rest and value, or none), the rest kept
/// as they are: the same skip, the kept records and tags copied in at
/// most three moves. The common write to a bucket (a new key, a new
/// value, a removal that leaves the skip as it is); unpublished.
pub fn splice_bucket(
    old: Node<'_>,
    at: usize,
    removed: usize,
    added: Option<(&[u8], &[u8])>,
    value_size: usize,
) -> (u64, usize) {
    let skip = old.skip();
    let bucket = old.bucket(value_size);
    let c = bucket.len();
    let (cut, resume, end) = (
        bucket.offset(at),
        bucket.offset(at + removed),
        bucket.offset(c),
    );
    let added_n = usize::from(added.is_some());
    let added_len = added.map_or(0, |(k, v)| k.len() + v.len());
    let new_c = c - removed + added_n;
    // SAFETY: unpublished; filled here before it is returned.
    let (word, size, tags, offsets, records) =
        unsafe { new_bucket(skip, new_c, end - (resume - cut) + added_len) };
    // Tags and records: those before, the new one, those after.
    tags[..at].copy_from_slice(&bucket.tags[..at]);
    tags[at + added_n..].copy_from_slice(&bucket.tags[at + removed..]);
    records[..cut].copy_from_slice(&bucket.records[..cut]);
    if let Some((key, value)) = added {
        debug_assert_eq!(value.len(), value_size);
        tags[at] = tag(key);
        records[cut..cut + key.len()].copy_from_slice(key);
        records[cut + key.len()..cut + added_len].copy_from_slice(value);
    }
    records[cut + added_len..].copy_from_slice(&bucket.records[resume..end]);
    // Offsets up to the cut as they were; those after it move by the
    // change in size.
    offsets[..2 * (at + 1)].copy_from_slice(&bucket.offsets[..2 * (at + 1)]);
    for i in at + removed..=c {
        let moved = bucket.offset(i) + cut + added_len - resume;
        let o = 2 * (i - removed + added_n);
        offsets[o..o + 2].copy_from_slice(&(moved as u16).to_le_bytes());
    }
    (word, size)
}

/// A key of a bucket being built: its rest past the bucket's skip in two
/// pieces (`head` then `tail`, so that a writer need not join them) and
/// its value.
#[derive(Clone, Copy)]
pub struct Record<'a> {
    pub head: &'a [u8],
    pub tail: &'a [u8],
    pub value: &'a [u8],
}

impl<'a> Record<'a> {
    /// A key whose rest is `rest`, tag to be computed.
    pub fn new(rest: &'a [u8], value: &'a [u8]) -> Self {
        Record {
            head: &[],
            tail: rest,
            value,
        }
    }
}

/// Allocates and fills a bucket past `skip` of `entries` (sorted by
/// rest; 2 to 255 of them, records under 64 KiB); unpublished. Returns
/// its word and size.
pub fn build_bucket(skip: &[u8], entries: &[Record<'_>]) -> (u64, usize) {
    debug_assert!((1..entries.len()).all(|i| {
        let e = |i: usize| [entries[i].head, entries[i].tail].concat();
        e(i - 1) < e(i)
    }));
    let bytes = entries
        .iter()
        .map(|e| e.head.len() + e.tail.len() + e.value.len())
        .sum();
    // SAFETY: unpublished; filled here before it is returned.
    let (word, size, tags, offsets, records) = unsafe { new_bucket(skip, entries.len(), bytes) };
    let mut at = 0;
    for (i, e) in entries.iter().enumerate() {
        offsets[2 * i..2 * i + 2].copy_from_slice(&(at as u16).to_le_bytes());
        let key = at..at + e.head.len() + e.tail.len();
        for piece in [e.head, e.tail, e.value] {
            records[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        tags[i] = tag(&records[key]);
    }
    offsets[2 * entries.len()..].copy_from_slice(&(at as u16).to_le_bytes());
    (word, size)
}

/// Allocates a bucket of `c` keys (2 to 255) whose records take `records`
/// bytes (under 64 KiB) past `skip`, writes its header, skip and count,
/// and returns its word and size and its tags, offsets and records to
/// fill.
///
/// # Safety
/// The slices are the new bucket's, unpublished: the caller fills them
/// and drops them before it publishes the word.
unsafe fn new_bucket<'a>(
    skip: &[u8],
    c: usize,
    records: usize,
) -> (u64, usize, &'a mut [u8], &'a mut [u8], &'a mut [u8]) {
    assert!((2..=255).contains(&c) && records <= usize::from(u16::MAX) && skip.len() <= MAX_SKIP);
    let byte_len = skip.len() + 1 + c + 2 * (c + 1) + records;
    let words = 1 + byte_len.div_ceil(8);
    let base = alloc_words(words);
    // SAFETY: `words` words, ours until published (caller).
    let bytes = unsafe {
        base.write(BUCKET_BIT | (skip.len() as u64) << SKIP_SHIFT | (words as u64) << WORDS_SHIFT);
        std::slice::from_raw_parts_mut(base.add(1) as *mut u8, byte_len)
    };
    let (head, area) = bytes.split_at_mut(skip.len());
    head.copy_from_slice(skip);
    area[0] = c as u8;
    let (tags, rest) = area[1..].split_at_mut(c);
    let (offsets, out) = rest.split_at_mut(2 * (c + 1));
    (base as usize as u64, words * 8, tags, offsets, out)
}

/// The index of `label` among the `n` labels at the start of a node's
/// byte area, compared a word (8 labels) at a time, with no branch on
/// where the label is. Wide nodes are common above the buckets, where a
/// binary search (used for more than 16 labels before buckets) took 10 %
/// longer per lookup of kernel symbols (scratch timings, 155-158 against
/// 172-177 ns).
#[inline(always)]
fn find_label(bytes: &[u8], n: usize, label: u8) -> Option<usize> {
    // The byte area is whole words, so it holds the `n.div_ceil(8)` words
    // read here; bytes past the labels may match too, and are refused by
    // `i < n`.
    let pattern = u64::from(label) * LOW_BYTES;
    for w in 0..n.div_ceil(8) {
        let word = u64::from_le_bytes(bytes[8 * w..8 * w + 8].try_into().expect("a word"));
        let x = word ^ pattern;
        // The lowest byte flagged is the lowest zero byte of `x` (the
        // borrow that can flag a byte wrongly only runs upwards).
        let zero = x.wrapping_sub(LOW_BYTES) & !x & (LOW_BYTES << 7);
        if zero != 0 {
            let i = 8 * w + zero.trailing_zeros() as usize / 8;
            return (i < n).then_some(i);
        }
    }
    None
}

/// A node's fields, decoded from its header once ([`Node::parts`]).
pub struct Parts<'g> {
    /// The children's labels, ascending.
    pub labels: &'g [u8],
    /// The bytes every key below has next.
    pub skip: &'g [u8],
    /// The value of the key that ends here.
    pub end: Option<&'g [u8]>,
    slots: &'g [AtomicU64],
    bytes: &'g [u8],
    value_size: usize,
}

impl<'g> Parts<'g> {
    /// Child `i` ([`Node::child`]).
    #[inline(always)]
    pub fn child(&self, i: usize) -> Child<'g> {
        let word = self.slots[i].load(Ordering::Acquire);
        if word & 1 == 0 {
            // SAFETY: a node pointer read from a live node's slot.
            return Child::Node(unsafe { Node::from_word(word) });
        }
        leaf(word, self.bytes, self.value_size)
    }
}

/// The leaf a slot word describes: its record in the node's byte area.
#[inline(always)]
fn leaf(word: u64, bytes: &[u8], value_size: usize) -> Child<'_> {
    let at = (word as u32 >> 1) as usize;
    let tail_len = (word >> LEAF_LEN_SHIFT) as usize;
    let (tail, value) = bytes[at..at + tail_len + value_size].split_at(tail_len);
    Child::Leaf { tail, value }
}

/// A node's content, built by the writer before it is published.
pub struct Spec {
    pub skip: Vec<u8>,
    pub end: Option<Vec<u8>>,
    /// Children by ascending label.
    pub children: Vec<(u8, ChildSpec)>,
}

/// A child in a [`Spec`].
pub enum ChildSpec {
    /// A published node (its word), kept as is.
    Node(u64),
    Leaf {
        tail: Vec<u8>,
        value: Vec<u8>,
    },
}

impl Spec {
    /// The content of `node`.
    pub fn of(node: Node<'_>, value_size: usize) -> Self {
        debug_assert!(!node.is_bucket(), "a bucket is rebuilt from its entries");
        Spec {
            skip: node.skip().to_vec(),
            end: node.end_value(value_size).map(<[u8]>::to_vec),
            children: (0..node.len())
                .map(|i| {
                    let child = match node.child(i, value_size) {
                        Child::Node(n) => ChildSpec::Node(n.word()),
                        Child::Leaf { tail, value } => ChildSpec::Leaf {
                            tail: tail.to_vec(),
                            value: value.to_vec(),
                        },
                    };
                    (node.labels()[i], child)
                })
                .collect(),
        }
    }

    /// Puts `child` under `label`, replacing any child there.
    pub fn set_child(&mut self, label: u8, child: ChildSpec) {
        match self.children.binary_search_by_key(&label, |c| c.0) {
            Ok(i) => self.children[i].1 = child,
            Err(i) => self.children.insert(i, (label, child)),
        }
    }

    /// Removes the child under `label`.
    pub fn remove_child(&mut self, label: u8) -> Option<ChildSpec> {
        let i = self.children.binary_search_by_key(&label, |c| c.0).ok()?;
        Some(self.children.remove(i).1)
    }

    /// Allocates and fills the node (unpublished: the caller publishes
    /// its word with a release store). Returns its word and size.
    pub fn build(&self) -> (u64, usize) {
        let n = self.children.len();
        assert!(n <= MAX_CHILDREN && self.skip.len() <= MAX_SKIP);
        let end_len = self.end.as_ref().map_or(0, Vec::len);
        let leaves: usize = self
            .children
            .iter()
            .map(|(_, c)| match c {
                ChildSpec::Node(_) => 0,
                ChildSpec::Leaf { tail, value } => tail.len() + value.len(),
            })
            .sum();
        let byte_len = n + self.skip.len() + end_len + leaves;
        let words = 1 + n + byte_len.div_ceil(8);
        let base = alloc_words(words);
        let header = n as u64
            | if self.end.is_some() { END_BIT } else { 0 }
            | (self.skip.len() as u64) << SKIP_SHIFT
            | (words as u64) << WORDS_SHIFT;
        // SAFETY: the allocation is ours until published; `words` words.
        unsafe {
            base.write(header);
            let bytes = std::slice::from_raw_parts_mut(base.add(1 + n) as *mut u8, byte_len);
            let mut at = 0;
            let mut put = |src: &[u8]| {
                bytes[at..at + src.len()].copy_from_slice(src);
                at += src.len();
                at - src.len()
            };
            for (label, _) in &self.children {
                put(&[*label]);
            }
            put(&self.skip);
            if let Some(end) = &self.end {
                put(end);
            }
            for (i, (_, child)) in self.children.iter().enumerate() {
                let word = match child {
                    ChildSpec::Node(word) => *word,
                    ChildSpec::Leaf { tail, value } => {
                        let record = put(tail);
                        put(value);
                        (tail.len() as u64) << LEAF_LEN_SHIFT | (record as u64) << 1 | 1
                    }
                };
                base.add(1 + i).write(word);
            }
            debug_assert_eq!(at, byte_len);
        }
        (base as usize as u64, words * 8)
    }
}

fn layout(words: usize) -> Layout {
    Layout::array::<u64>(words).expect("node layout")
}

/// `words` zeroed words (at least one), for a node or a slab.
fn alloc_words(words: usize) -> *mut u64 {
    let layout = layout(words);
    // SAFETY: non-zero size.
    let base = unsafe { alloc_zeroed(layout) } as *mut u64;
    if base.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    base
}

/// Frees the node `word` points at (its children are not touched);
/// returns the bytes it took.
///
/// # Safety
/// The node is unreachable for every reader (unpublished, or past the
/// grace period of its retirement), not packed, and freed once.
pub unsafe fn free(word: u64) -> usize {
    // SAFETY: a node pointer (caller); read its size before freeing.
    let node = unsafe { Node::from_word(word) };
    debug_assert!(!node.is_packed(), "a packed node is freed with its slab");
    let words = node.words();
    // SAFETY: allocated by `Spec::build` with this layout.
    unsafe { dealloc(word as usize as *mut u8, layout(words)) };
    words * 8
}

/// One allocation holding many packed nodes back to back, freed whole
/// (dropped) once the last of them is retired and its grace period is
/// over: a compaction copies a subtree here in walk order, so that an
/// ordered walk reads memory front to back.
pub struct Slab {
    base: NonNull<u64>,
    words: usize,
    /// Nodes in it not yet retired.
    live: usize,
}

// SAFETY: plain memory; its owner (a subtree's writer, then a deferred
// free) is the only one to free it.
unsafe impl Send for Slab {}

impl Slab {
    /// Room for `words` words and `nodes` live nodes.
    pub fn new(words: usize, nodes: usize) -> Self {
        Slab {
            // A subtree has a node of 2 words or more.
            base: NonNull::new(alloc_words(words)).expect("allocated"),
            words,
            live: nodes,
        }
    }

    /// Where word `at` of the slab is.
    pub fn at(&self, at: usize) -> NonNull<u64> {
        assert!(at < self.words, "inside the slab");
        // SAFETY: in bounds.
        unsafe { self.base.add(at) }
    }

    /// Its first address, for ordering slabs.
    pub fn start(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Bytes it takes.
    pub fn size(&self) -> usize {
        self.words * 8
    }

    /// Whether the node `word` is inside it.
    pub fn holds(&self, word: u64) -> bool {
        (self.start()..self.start() + self.size()).contains(&(word as usize))
    }

    /// One of its nodes retired; true when that was the last.
    pub fn retire_one(&mut self) -> bool {
        self.live -= 1;
        self.live == 0
    }
}

/// Dropping a slab frees its nodes: its owner drops it only once no reader
/// can reach them (past the grace period of the last one's retirement, or
/// with the map).
impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; unreachable (above).
        unsafe { dealloc(self.base.as_ptr() as *mut u8, layout(self.words)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_node_reads_back_its_spec() {
        let leaf = |t: &[u8], v: u8| ChildSpec::Leaf {
            tail: t.to_vec(),
            value: vec![v; 3],
        };
        let inner = Spec {
            skip: b"zz".to_vec(),
            end: Some(vec![7; 3]),
            children: vec![],
        };
        let (inner_word, _) = inner.build();
        let spec = Spec {
            skip: b"abc".to_vec(),
            end: None,
            children: vec![
                (0, leaf(b"", 1)),
                (b'q', ChildSpec::Node(inner_word)),
                (0xff, leaf(b"tail\0", 2)),
            ],
        };
        let (word, size) = spec.build();
        // SAFETY: just built, never published.
        let node = unsafe { Node::from_word(word) };
        assert_eq!(size, node.size());
        assert_eq!((node.len(), node.has_end()), (3, false));
        assert_eq!(
            (node.labels(), node.skip()),
            (&[0, b'q', 0xff][..], &b"abc"[..])
        );
        assert_eq!(node.end_value(3), None);
        assert!(matches!(
            node.child(0, 3),
            Child::Leaf {
                tail: b"",
                value: [1, 1, 1]
            }
        ));
        assert!(matches!(
            node.child(2, 3),
            Child::Leaf {
                tail: b"tail\0",
                value: [2, 2, 2]
            }
        ));
        let Child::Node(n) = node.child(1, 3) else {
            panic!("a node child")
        };
        assert_eq!(
            (n.skip(), n.end_value(3)),
            (&b"zz"[..], Some(&[7, 7, 7][..]))
        );
        assert_eq!((node.find(b'q'), node.find(b'r')), (Some(1), None));
        let back = Spec::of(node, 3);
        assert_eq!(
            (back.skip, back.end, back.children.len()),
            (b"abc".to_vec(), None, 3)
        );
        // SAFETY: unpublished, freed once each.
        unsafe {
            free(word);
            free(inner_word);
        }
    }
}
