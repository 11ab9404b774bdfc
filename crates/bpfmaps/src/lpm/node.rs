//! Trie nodes and their two kinds of blocks, immutable but for payloads.
//!
//! A node covers one byte (8 bits) of the key. It is two atomic pointers,
//! each to an immutable, popcount-compressed block that a writer replaces
//! whole (copy-on-write). The one exception: a prefix's payload, wherever
//! a leaf or a payload slot holds it, is an atomic word that the writer may
//! overwrite in place when the prefix gets a new value (`LeafCell`):
//!
//! ```text
//! Node (24 B) = { children: *ChildBlock, data: *DataBlock, skip }
//!
//! ChildBlock = [ child bits: 256 + ranks (40 B) | len | Node x len ]
//!                 bit b set <=> a child node exists for key byte b
//!
//! DataBlock  = [ leaf bits (40 B) | default (8 B) | n_leaves | n_prefixes |
//!                Leaf x n_leaves | prefix bits: 512 + ranks (80 B) |
//!                payload x n_prefixes ]
//! Leaf (8 B) = { payload: value or route id (4 B), prefixlen (4 B) }
//! ```
//!
//! * Prefix bits: the prefixes stored in this node, as a complete binary
//!   tree over the byte: a prefix with `l` bits inside the byte (1..=8, or 0
//!   for `/0` at the root) and bit pattern `p` has index `(1 << l) | p`.
//! * Leaves: for every byte value `b`, the longest prefix at this node or
//!   above that covers `b` ("leaf pushing", as in poptrie): its length and
//!   payload (the value itself when values fit in 4 bytes). Run-length
//!   encoded: leaf bit `b` is set where a new run starts, and the run
//!   holding `b` is entry `rank(bits <= b) - 1`. Bytes that have a child
//!   get their true leaf too: a reader that loaded the child block before
//!   the child existed reads it.
//! * Default: the route this node inherits from above (the parent's best
//!   match for the byte leading here), painted under this node's prefixes.
//!
//! Children are stored inline in their block, so a lookup moves down one
//! level with one pointer load plus one `popcnt`.
//!
//! * Skip (path compression): a node below depth 2 may sit at the end of a
//!   compressed edge that skips up to 7 key bytes, where the uncompressed
//!   trie would have a chain of nodes with one child and no prefixes (the
//!   sparse lower levels of an IPv6 table). A lookup entering the node
//!   compares those bytes with the key; on a mismatch the answer is the
//!   node's default (nothing is stored along the skipped bytes). The skip
//!   is part of the node's entry in its parent's child block, so it costs
//!   no extra load.

use std::alloc::Layout;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::arena::Arena;
use super::bits::Bits;

/// Key bytes a compressed edge skips: up to [`Skip::MAX`], packed with
/// their count in the top byte (all zero: no skip).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Skip(u64);

impl Skip {
    /// Longest skip: seven bytes and the count fit one word.
    pub const MAX: usize = 7;
    pub const NONE: Skip = Skip(0);

    /// The skip over `bytes` (at most `MAX`).
    pub fn new(bytes: &[u8]) -> Skip {
        debug_assert!(bytes.len() <= Self::MAX);
        let mut word = (bytes.len() as u64) << 56;
        for (i, &b) in bytes.iter().enumerate() {
            word |= u64::from(b) << (8 * i);
        }
        Skip(word)
    }

    #[inline(always)]
    pub fn len(self) -> usize {
        (self.0 >> 56) as usize
    }

    #[inline(always)]
    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    #[inline(always)]
    pub fn byte(self, i: usize) -> u8 {
        (self.0 >> (8 * i)) as u8
    }

    /// The skipped bytes.
    pub fn bytes(self) -> impl Iterator<Item = u8> {
        (0..self.len()).map(move |i| self.byte(i))
    }

    /// How many leading skipped bytes `key` repeats.
    pub fn common_prefix(self, key: &[u8]) -> usize {
        self.bytes().zip(key).take_while(|(a, b)| a == *b).count()
    }

    /// Whether `key` starts with the skipped bytes. One word compare when
    /// 8 key bytes are there to load (a byte loop's varying trip count
    /// mispredicts on lookups that cross edges of different lengths).
    #[inline(always)]
    pub fn matches(self, key: &[u8]) -> bool {
        let n = self.len();
        match key.first_chunk::<8>() {
            Some(head) => (u64::from_le_bytes(*head) ^ self.0) & ((1 << (8 * n)) - 1) == 0,
            None => key.len() >= n && (0..n).all(|i| key[i] == self.byte(i)),
        }
    }

    /// The skipped bytes packed in the low 56 bits, first byte lowest.
    fn packed(self) -> u64 {
        self.0 & ((1 << 56) - 1)
    }

    /// The first `n` bytes (`n <= len`).
    pub fn head(self, n: usize) -> Skip {
        Skip(self.packed() & ((1u64 << (8 * n)) - 1) | (n as u64) << 56)
    }

    /// The bytes from `n` on (`n <= len`).
    pub fn tail(self, n: usize) -> Skip {
        Skip(self.packed() >> (8 * n) | ((self.len() - n) as u64) << 56)
    }

    /// `self`, then `b`, then `next`: the skip of a child whose parent
    /// edge and own edge merge; `None` if that is over `MAX`.
    pub fn join(self, b: u8, next: Skip) -> Option<Skip> {
        let n = self.len();
        let len = n + 1 + next.len();
        (len <= Self::MAX).then(|| {
            Skip(
                self.packed()
                    | u64::from(b) << (8 * n)
                    | next.packed() << (8 * (n + 1))
                    | (len as u64) << 56,
            )
        })
    }
}

/// A child-block entry: the node's (children, data, skip).
pub(super) type Entry = (*mut ChildBlock, *mut DataBlock, Skip);

/// One trie node: pointers to its current child and data blocks, and the
/// key bytes its edge skips (fixed for the life of the entry).
#[repr(C)]
pub(super) struct Node {
    pub children: AtomicPtr<ChildBlock>,
    pub data: AtomicPtr<DataBlock>,
    pub skip: Skip,
}

impl Node {
    /// A node holding `data` and no children.
    pub fn new(data: NonNull<DataBlock>) -> Self {
        Node {
            children: AtomicPtr::new(ptr::null_mut()),
            data: AtomicPtr::new(data.as_ptr()),
            skip: Skip::NONE,
        }
    }

    /// The current data block.
    ///
    /// # Safety
    /// The caller is pinned (or is the writer) for `'a`.
    #[inline(always)]
    pub unsafe fn data<'a>(&self) -> &'a DataBlock {
        // SAFETY: a node's data pointer is never null and blocks live until
        // a grace period after they are replaced.
        unsafe { &*self.data.load(Ordering::Acquire) }
    }

    /// The current child block, if any.
    ///
    /// # Safety
    /// As for `data`.
    #[inline(always)]
    pub unsafe fn children<'a>(&self) -> Option<&'a ChildBlock> {
        // SAFETY: as for data.
        unsafe { self.children.load(Ordering::Acquire).as_ref() }
    }

    /// The child for key byte `b`, if any.
    ///
    /// # Safety
    /// As for `data`.
    #[inline(always)]
    pub unsafe fn child<'a>(&self, b: u8) -> Option<&'a Node> {
        // SAFETY: as for data.
        let block = unsafe { self.children()? };
        // SAFETY: the bit says the entry exists.
        block
            .bits
            .get(b as usize)
            .then(|| unsafe { block.node(block.bits.rank(b as usize)) })
    }
}

/// Header of a child block; `len` nodes follow.
#[repr(C)]
pub(super) struct ChildBlock {
    pub bits: Bits<4>,
    len: u32,
}

impl ChildBlock {
    fn layout(len: usize) -> (Layout, usize) {
        Layout::new::<ChildBlock>()
            .extend(Layout::array::<Node>(len).expect("child array layout"))
            .expect("child block layout")
    }

    /// Allocates a block for `bits` whose nodes are `entries`, in byte
    /// order.
    pub fn alloc(arena: &Arena, bits: Bits<4>, nodes: &[Entry]) -> NonNull<ChildBlock> {
        debug_assert_eq!(bits.count(), nodes.len());
        let (layout, offset) = Self::layout(nodes.len());
        debug_assert_eq!(
            offset,
            size_of::<ChildBlock>().next_multiple_of(align_of::<Node>())
        );
        let p = arena.alloc(layout).as_ptr();
        let block = NonNull::new(p.cast::<ChildBlock>()).expect("arena block");
        // SAFETY: fresh allocation of the right layout.
        unsafe {
            block.as_ptr().write(ChildBlock {
                bits,
                len: nodes.len() as u32,
            });
            let first = p.add(offset).cast::<Node>();
            for (i, &(c, d, skip)) in nodes.iter().enumerate() {
                first.add(i).write(Node {
                    children: AtomicPtr::new(c),
                    data: AtomicPtr::new(d),
                    skip,
                });
            }
        }
        block
    }

    /// Node `i` (in byte order).
    ///
    /// # Safety
    /// `i < len`.
    #[inline(always)]
    pub unsafe fn node(&self, i: usize) -> &Node {
        const OFFSET: usize = size_of::<ChildBlock>().next_multiple_of(align_of::<Node>());
        // SAFETY: the nodes follow the header at `offset`; i < len.
        unsafe {
            &*ptr::from_ref(self)
                .cast::<u8>()
                .add(OFFSET)
                .cast::<Node>()
                .add(i)
        }
    }

    /// The entries of every node, in byte order.
    pub fn entries(&self) -> Vec<Entry> {
        (0..self.len as usize)
            .map(|i| {
                // SAFETY: i < len.
                let n = unsafe { self.node(i) };
                (
                    n.children.load(Ordering::Relaxed),
                    n.data.load(Ordering::Relaxed),
                    n.skip,
                )
            })
            .collect()
    }

    /// Number of children.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Gives the block itself (not the blocks its nodes point to) back to
    /// the arena.
    ///
    /// # Safety
    /// No one can reach the block any more.
    pub unsafe fn free(arena: &Arena, block: *mut ChildBlock) {
        // SAFETY: allocated by `alloc` from this arena with this length.
        unsafe { arena.release(block.cast(), Self::layout((*block).len as usize).0.size()) }
    }
}

/// What a leaf holds: the matched prefix's length and its payload (the
/// value itself when values fit in 4 bytes, else a route slot id), so a
/// lookup ends at the leaf with no further load for small values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(super) struct Leaf {
    pub payload: [u8; 4],
    pub prefixlen: u32,
}

impl Leaf {
    /// No prefix matches.
    pub const NONE: Leaf = Leaf {
        payload: [0; 4],
        prefixlen: u32::MAX,
    };

    #[inline(always)]
    pub fn is_none(&self) -> bool {
        self.prefixlen == u32::MAX
    }

    /// The leaf's bytes as one word: a `LeafCell` holds the same bytes
    /// as a `Leaf`, so blocks are filled and copied with `memcpy`.
    #[inline(always)]
    const fn to_word(self) -> u64 {
        let [p0, p1, p2, p3] = self.payload;
        let [l0, l1, l2, l3] = self.prefixlen.to_ne_bytes();
        u64::from_ne_bytes([p0, p1, p2, p3, l0, l1, l2, l3])
    }

    #[inline(always)]
    const fn from_word(word: u64) -> Leaf {
        let [p0, p1, p2, p3, l0, l1, l2, l3] = word.to_ne_bytes();
        Leaf {
            payload: [p0, p1, p2, p3],
            prefixlen: u32::from_ne_bytes([l0, l1, l2, l3]),
        }
    }
}

const _: () = assert!(size_of::<LeafCell>() == size_of::<Leaf>());
const _: () = assert!(align_of::<LeafCell>() >= align_of::<Leaf>());

/// A leaf as a block stores it: one word, which readers load whole, so
/// the writer can give a stored prefix a new payload in place while
/// lookups run (`LpmTrie::insert` over an existing prefix).
#[repr(transparent)]
pub(super) struct LeafCell(AtomicU64);

impl LeafCell {
    pub const fn new(leaf: Leaf) -> Self {
        LeafCell(AtomicU64::new(leaf.to_word()))
    }

    #[inline(always)]
    pub fn load(&self) -> Leaf {
        Leaf::from_word(self.0.load(Ordering::Relaxed))
    }

    /// Writer: the same prefix with a new payload.
    pub fn set_payload(&self, payload: [u8; 4]) {
        let leaf = Leaf {
            payload,
            ..self.load()
        };
        self.0.store(leaf.to_word(), Ordering::Release);
    }
}

/// Set bits of `W` words, in increasing order.
struct OnesOfW<const W: usize> {
    words: [u64; W],
    w: usize,
}
type OnesOf8 = OnesOfW<8>;

impl<const W: usize> Iterator for OnesOfW<W> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        while self.w < W && self.words[self.w] == 0 {
            self.w += 1;
        }
        let word = self.words.get_mut(self.w)?;
        let bit = word.trailing_zeros() as usize;
        *word &= *word - 1;
        Some(64 * self.w + bit)
    }
}

/// Run-length encoder for leaves.
struct Runs {
    bits: Bits<4>,
    /// The first `n` are written (no 2 KiB of zeroes per build).
    leaves: [MaybeUninit<Leaf>; 256],
    n: usize,
}

impl Runs {
    fn new() -> Self {
        Runs {
            bits: Bits::default(),
            leaves: [const { MaybeUninit::uninit() }; 256],
            n: 0,
        }
    }

    /// The last run's leaf, if any.
    fn last(&self) -> Option<&Leaf> {
        // SAFETY: the first n leaves are written.
        self.n
            .checked_sub(1)
            .map(|i| unsafe { self.leaves[i].assume_init_ref() })
    }

    /// Bytes from `start` on hold `leaf`: a new run, unless the previous
    /// run already holds it.
    fn push(&mut self, start: usize, leaf: Leaf) {
        if self.last() == Some(&leaf) {
            return;
        }
        self.bits.set_raw(start);
        self.leaves[self.n].write(leaf);
        self.n += 1;
    }

    /// Copies the old runs that start in `a..b` (each ending at the next
    /// start, or `b`), a word at a time; the first folds into ours if it
    /// holds the same leaf.
    fn copy_old(&mut self, old: &DataBlock, a: usize, b: usize) {
        if a >= b {
            return;
        }
        let mut starts = old.leaf_bits.words_in(a, b);
        let mut first = old.leaf_bits.rank(a);
        let mut count: usize = starts.iter().map(|w| w.count_ones() as usize).sum();
        if count == 0 {
            return;
        }
        if self.last() == Some(&old.leaf_at_run(first).load()) {
            // The first old run continues our last one: drop its start.
            let w = starts.iter().position(|w| *w != 0).expect("count > 0");
            starts[w] &= starts[w] - 1;
            first += 1;
            count -= 1;
        }
        self.bits.or_words(&starts);
        let from = &old.leaves()[first..first + count];
        // SAFETY: a LeafCell holds a Leaf's bytes; only this thread (the
        // writer) ever stores into them, so a plain read races with nothing.
        unsafe {
            ptr::copy_nonoverlapping(
                from.as_ptr().cast::<Leaf>(),
                self.leaves[self.n..].as_mut_ptr().cast::<Leaf>(),
                count,
            )
        };
        self.n += count;
    }

    fn finish(&mut self) -> (Bits<4>, &[Leaf]) {
        self.bits.fix_ranks();
        // SAFETY: the first n leaves are written; MaybeUninit<Leaf> has
        // Leaf's layout.
        let leaves = unsafe { &*(ptr::from_ref(&self.leaves[..self.n]) as *const [Leaf]) };
        (self.bits, leaves)
    }
}

/// Header of a data block. Then, in order: `n_leaves` leaves (8 B each, so
/// the leaves a lookup reads sit right after the bits it just read), the
/// prefix bits (80 B) and `n_prefixes` payloads (4 B each). Everything
/// but the leaves' payloads (in the runs, the default and the payload
/// slots, which `LpmTrie` may replace in place) is fixed once published.
#[repr(C)]
pub(super) struct DataBlock {
    pub leaf_bits: Bits<4>,
    pub default: LeafCell,
    n_leaves: u16,
    n_prefixes: u16,
}

/// A data block of one run holding `Leaf::NONE`, never freed: lets a
/// reader load "some block's leaf" without a branch (see `direct.rs`).
#[repr(C)]
pub(super) struct StaticBlock {
    header: DataBlock,
    leaf: LeafCell,
}

pub(super) static NONE_BLOCK: StaticBlock = StaticBlock {
    header: DataBlock {
        leaf_bits: Bits::FIRST,
        default: LeafCell::new(Leaf::NONE),
        n_leaves: 1,
        n_prefixes: 0,
    },
    leaf: LeafCell::new(Leaf::NONE),
};

impl StaticBlock {
    /// The block.
    pub fn block(&'static self) -> &'static DataBlock {
        debug_assert_eq!(
            std::mem::offset_of!(StaticBlock, leaf),
            LEAVES_OFFSET,
            "the leaf sits where a block's leaves start"
        );
        &self.header
    }
}

/// Index of the prefix with `l` bits (0..=8) and pattern `p` in a node.
#[inline]
pub(super) fn prefix_index(l: u32, byte: u8) -> usize {
    if l == 0 {
        1
    } else {
        (1 << l) | (byte as usize >> (8 - l))
    }
}

/// Bits of a prefix index inside its byte: (l, first byte, one past last).
#[inline]
pub(super) fn index_range(idx: usize) -> (u32, usize, usize) {
    let l = usize::BITS - 1 - idx.leading_zeros();
    let p = idx & ((1 << l) - 1);
    (l, p << (8 - l), (p + 1) << (8 - l))
}

/// Where the leaves start in a data block (what `DataBlock::layout` gives).
const LEAVES_OFFSET: usize = size_of::<DataBlock>().next_multiple_of(align_of::<Leaf>());

impl DataBlock {
    /// Layout and the offsets of (leaves, prefix bits, payloads).
    /// A node without prefixes (most interior nodes of a sparse trie) has
    /// no prefix-bits region at all: 80 bytes saved per such node.
    fn layout(n_leaves: usize, n_prefixes: usize) -> (Layout, [usize; 3]) {
        let (l, leaves) = Layout::new::<DataBlock>()
            .extend(Layout::array::<Leaf>(n_leaves).expect("leaves"))
            .expect("layout");
        let bits_layout = if n_prefixes == 0 {
            Layout::new::<()>()
        } else {
            Layout::new::<Bits<8>>()
        };
        let (l, bits) = l.extend(bits_layout).expect("layout");
        let (l, payloads) = l
            .extend(Layout::array::<AtomicU32>(n_prefixes).expect("payloads"))
            .expect("layout");
        let layout = l.pad_to_align();
        debug_assert_eq!(
            Self::offsets(n_leaves, n_prefixes),
            [leaves, bits, payloads]
        );
        (layout, [leaves, bits, payloads])
    }

    /// The offsets `layout` gives, by plain arithmetic: readers of a block's
    /// prefixes (`prefix`, `best_for`) need them often.
    #[inline(always)]
    fn offsets(n_leaves: usize, n_prefixes: usize) -> [usize; 3] {
        let end_of_leaves = LEAVES_OFFSET + n_leaves * size_of::<Leaf>();
        if n_prefixes == 0 {
            [LEAVES_OFFSET, end_of_leaves, end_of_leaves]
        } else {
            let bits = end_of_leaves.next_multiple_of(align_of::<Bits<8>>());
            [LEAVES_OFFSET, bits, bits + size_of::<Bits<8>>()]
        }
    }

    /// Builds the block of a node at `depth` for `prefix_bits`/`payloads`
    /// and `default`. Leaves are computed only for bytes in `changed`
    /// (`lo..hi`); the others are copied, run by run, from `old` (pass
    /// `None` and `0..256` for a full build). Every byte gets its true
    /// leaf, those with a child too: a reader that loaded the child block
    /// before the child was added may read this block's leaf for it.
    pub fn build(
        arena: &Arena,
        depth: usize,
        prefix_bits: &Bits<8>,
        payloads: &[[u8; 4]],
        default: Leaf,
        old: Option<&DataBlock>,
        (lo, hi): (usize, usize),
    ) -> NonNull<DataBlock> {
        debug_assert_eq!(prefix_bits.count(), payloads.len());
        debug_assert!(old.is_some() || (lo, hi) == (0, 256));
        let mut runs = Runs::new();

        // 1. Old runs starting before `lo`.
        if let Some(o) = old {
            runs.copy_old(o, 0, lo);
        }

        // 2. Fresh leaves for `lo..hi`: the value can change only where a
        // prefix inside the range starts or ends, so cut there and give each
        // segment the longest prefix covering its first byte.
        let mut cut_bits = Bits::<5>::default();
        cut_bits.set_raw(lo);
        cut_bits.set_raw(hi);
        // Only prefixes inside lo..hi: at each level, the indices whose
        // byte ranges fall within it.
        for l in 0..=8u32 {
            let shift = 8 - l;
            let (first, end) = (lo.div_ceil(1 << shift), hi >> shift);
            if first >= end {
                continue;
            }
            let base = 1usize << l;
            let inside = prefix_bits.words_in(base + first, base + end);
            for idx in (OnesOf8 {
                words: inside,
                w: 0,
            }) {
                let (_, plo, phi) = index_range(idx);
                cut_bits.set_raw(plo);
                cut_bits.set_raw(phi);
            }
        }
        let best = |b: usize| {
            (0..=8u32)
                .rev()
                .map(|l| prefix_index(l, b as u8))
                .find(|&idx| prefix_bits.get(idx))
                .map(|idx| Leaf {
                    payload: payloads[prefix_bits.rank(idx)],
                    prefixlen: 8 * depth as u32 + index_range(idx).0,
                })
                .unwrap_or(default)
        };
        let mut cuts = cut_bits.ones().peekable();
        while let Some(start) = cuts.next() {
            match cuts.peek() {
                Some(_) if start < hi => runs.push(start, best(start)),
                _ => break,
            }
        }

        // 3. Old leaves from `hi` on: the old value at `hi` up to the next
        // old run, then the old runs.
        if let Some(o) = old
            && hi < 256
        {
            runs.push(hi, o.leaf(hi as u8));
            runs.copy_old(o, hi + 1, 256);
        }
        let (leaf_bits, leaves) = runs.finish();

        let (layout, [at_leaves, at_bits, at_payloads]) =
            Self::layout(leaves.len(), payloads.len());
        debug_assert_eq!(at_leaves, LEAVES_OFFSET);
        let p = arena.alloc(layout).as_ptr();
        let block = NonNull::new(p.cast::<DataBlock>()).expect("arena block");
        // SAFETY: fresh allocation of the right layout; offsets from `layout`.
        unsafe {
            block.as_ptr().write(DataBlock {
                leaf_bits,
                default: LeafCell::new(default),
                n_leaves: leaves.len() as u16,
                n_prefixes: payloads.len() as u16,
            });
            // A LeafCell holds a Leaf's bytes, a payload slot a payload's.
            ptr::copy_nonoverlapping(
                leaves.as_ptr(),
                p.add(at_leaves).cast::<Leaf>(),
                leaves.len(),
            );
            if !payloads.is_empty() {
                p.add(at_bits).cast::<Bits<8>>().write(*prefix_bits);
            }
            ptr::copy_nonoverlapping(
                payloads.as_ptr(),
                p.add(at_payloads).cast::<[u8; 4]>(),
                payloads.len(),
            );
        }
        block
    }

    /// A block with no prefixes: every byte maps to `default`.
    pub fn empty(arena: &Arena, default: Leaf) -> NonNull<DataBlock> {
        Self::build(arena, 0, &Bits::default(), &[], default, None, (0, 256))
    }

    #[inline(always)]
    fn at(&self, offset: usize) -> *const u8 {
        // SAFETY: offsets come from `layout` for this block's counts.
        unsafe { ptr::from_ref(self).cast::<u8>().add(offset) }
    }

    /// Leaf run `i`.
    #[inline(always)]
    fn leaf_at_run(&self, i: usize) -> &LeafCell {
        &self.leaves()[i]
    }

    /// All leaf runs.
    fn leaves(&self) -> &[LeafCell] {
        // SAFETY: n_leaves leaves start right after the header.
        unsafe {
            std::slice::from_raw_parts(
                self.at(LEAVES_OFFSET).cast::<LeafCell>(),
                self.n_leaves as usize,
            )
        }
    }

    /// The leaf for byte `b`. Only meaningful where there is no child.
    #[inline(always)]
    pub fn leaf(&self, b: u8) -> Leaf {
        self.leaf_cell(b).load()
    }

    /// Writer: gives every run in bytes `lo..hi` whose leaf is a prefix of
    /// `prefixlen` bits the new `payload` (the caller's prefix: no other of
    /// that length reaches these bytes). False, with nothing changed, if
    /// such a run reaches outside `lo..hi`: it was merged with a neighbour
    /// of the same length and value, so only a rebuild can split it.
    pub fn set_run_payloads(&self, lo: usize, hi: usize, prefixlen: u32, payload: [u8; 4]) -> bool {
        let first = self.leaf_bits.rank_incl(lo) - 1;
        let last = self.leaf_bits.rank_incl(hi - 1) - 1;
        let ours = |r: usize| self.leaf_at_run(r).load().prefixlen == prefixlen;
        let outside = (ours(first) && !self.leaf_bits.get(lo))
            || (ours(last) && hi < 256 && !self.leaf_bits.get(hi));
        if outside {
            return false;
        }
        for r in (first..=last).filter(|&r| ours(r)) {
            self.leaf_at_run(r).set_payload(payload);
        }
        true
    }

    /// Writer: the payload of the stored prefix at `idx` becomes `payload`.
    pub fn set_prefix_payload(&self, idx: usize, payload: [u8; 4]) {
        let bits = self.prefix_bits();
        debug_assert!(bits.get(idx));
        self.payload_slots()[bits.rank(idx)].store(u32::from_ne_bytes(payload), Ordering::Release);
    }

    /// Where the leaf for byte `b` is (to prefetch, then load).
    #[inline(always)]
    pub fn leaf_cell(&self, b: u8) -> &LeafCell {
        let run = self.leaf_bits.rank_incl(b as usize) - 1;
        let at_leaves = LEAVES_OFFSET;
        // SAFETY: bit 0 is always set, so 0 <= run < n_leaves; leaves start
        // right after the header.
        unsafe { &*self.at(at_leaves).cast::<LeafCell>().add(run) }
    }

    /// The prefixes stored in this node (bit `idx` per prefix).
    pub fn prefix_bits(&self) -> &Bits<8> {
        static NONE: Bits<8> = Bits::EMPTY;
        if self.n_prefixes == 0 {
            return &NONE;
        }
        let [_, at_bits, _] = Self::offsets(self.n_leaves as usize, self.n_prefixes as usize);
        // SAFETY: written by `build` at this offset when there are prefixes.
        unsafe { &*self.at(at_bits).cast::<Bits<8>>() }
    }

    /// The stored prefixes' payload slots, in index order.
    fn payload_slots(&self) -> &[AtomicU32] {
        let [.., at_payloads] = Self::offsets(self.n_leaves as usize, self.n_prefixes as usize);
        // SAFETY: n_prefixes payloads written by `build` at this offset.
        unsafe {
            std::slice::from_raw_parts(
                self.at(at_payloads).cast::<AtomicU32>(),
                self.n_prefixes as usize,
            )
        }
    }

    /// Payloads of the stored prefixes, in index order.
    /// Writer only (a copy, with room for one more to insert).
    pub fn payloads(&self) -> Vec<[u8; 4]> {
        let slots = self.payload_slots();
        let mut out = Vec::with_capacity(slots.len() + 1);
        // SAFETY: a payload slot holds the payload's bytes, and only the
        // writer (the caller) stores into them, so a plain copy races with
        // nothing; `out` has room for them.
        unsafe {
            ptr::copy_nonoverlapping(
                slots.as_ptr().cast::<[u8; 4]>(),
                out.as_mut_ptr(),
                slots.len(),
            );
            out.set_len(slots.len());
        }
        out
    }

    /// Payload of the prefix at `idx`, if stored.
    pub fn prefix(&self, idx: usize) -> Option<[u8; 4]> {
        let bits = self.prefix_bits();
        bits.get(idx)
            .then(|| load_payload(&self.payload_slots()[bits.rank(idx)]))
    }

    /// The longest match for byte `b` among the prefixes of this node (at
    /// `depth`), else the inherited default: what a child at `b` inherits.
    pub fn best_for(&self, depth: usize, b: u8) -> Leaf {
        (0..=8)
            .rev()
            .find_map(|l| {
                self.prefix(prefix_index(l, b)).map(|payload| Leaf {
                    payload,
                    prefixlen: 8 * depth as u32 + l,
                })
            })
            .unwrap_or(self.default.load())
    }

    /// Whether the node stores no prefixes.
    pub fn has_no_prefixes(&self) -> bool {
        self.n_prefixes == 0
    }

    /// Gives the block back to the arena.
    ///
    /// # Safety
    /// No one can reach the block any more.
    pub unsafe fn free(arena: &Arena, block: *mut DataBlock) {
        // SAFETY: allocated by `build` from this arena with these counts.
        unsafe {
            let (n, m) = ((*block).n_leaves as usize, (*block).n_prefixes as usize);
            arena.release(block.cast(), Self::layout(n, m).0.size())
        }
    }
}

/// A payload slot holds the payload's bytes (`u32::from_ne_bytes`).
fn load_payload(slot: &AtomicU32) -> [u8; 4] {
    slot.load(Ordering::Relaxed).to_ne_bytes()
}

/// Gives a whole subtree back to the arena: every block reachable from
/// `children`/`data`.
///
/// # Safety
/// No one can reach the subtree any more.
pub(super) unsafe fn free_subtree(arena: &Arena, children: *mut ChildBlock, data: *mut DataBlock) {
    // SAFETY: the caller owns the subtree.
    unsafe {
        if !children.is_null() {
            for (c, d, _) in (*children).entries() {
                free_subtree(arena, c, d);
            }
            ChildBlock::free(arena, children);
        }
        if !data.is_null() {
            DataBlock::free(arena, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_match_what_starts_with_their_bytes() {
        let bytes = [3u8, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8];
        for n in 0..=Skip::MAX {
            let skip = Skip::new(&bytes[..n]);
            for len in 0..=bytes.len() {
                // Flip no byte (flip == len), or one of them.
                for flip in 0..=len {
                    let mut key = bytes[..len].to_vec();
                    if flip < len {
                        key[flip] ^= 0x80;
                    }
                    let want = key.starts_with(&bytes[..n]);
                    assert_eq!(skip.matches(&key), want, "n {n} key {key:?}");
                }
            }
        }
    }

    #[test]
    fn skips_split_and_join_like_byte_strings() {
        let s = Skip::new(&[1, 2, 3, 4, 5]);
        let bytes = |s: Skip| s.bytes().collect::<Vec<_>>();
        assert_eq!(bytes(s.head(0)), []);
        assert_eq!(bytes(s.head(2)), [1, 2]);
        assert_eq!(bytes(s.tail(2)), [3, 4, 5]);
        assert_eq!(bytes(s.tail(5)), []);
        assert_eq!(s.tail(5), Skip::NONE);
        assert_eq!(s.head(2).join(3, s.tail(3)), Some(s));
        assert_eq!(Skip::NONE.join(9, Skip::NONE), Some(Skip::new(&[9])));
        assert_eq!(
            s.join(6, Skip::new(&[7])),
            Some(Skip::new(&[1, 2, 3, 4, 5, 6, 7]))
        );
        assert_eq!(s.join(6, Skip::new(&[7, 8])), None);
        assert_eq!(s.common_prefix(&[1, 2, 9]), 2);
    }

    #[test]
    fn prefix_indices_cover_their_byte_ranges() {
        assert_eq!(prefix_index(0, 0xab), 1);
        assert_eq!(index_range(1), (0, 0, 256));
        assert_eq!(prefix_index(1, 0x80), 3);
        assert_eq!(index_range(3), (1, 128, 256));
        assert_eq!(prefix_index(8, 0x05), 256 + 5);
        assert_eq!(index_range(261), (8, 5, 6));
        assert_eq!(
            index_range(prefix_index(3, 0b1010_0000)),
            (3, 0b1010_0000, 0b1100_0000)
        );
    }

    #[test]
    fn data_block_paints_longest_prefix_per_byte() {
        let mut bits = Bits::<8>::default();
        bits.set_raw(prefix_index(1, 0x00)); // 0xxxxxxx -> 7
        bits.set_raw(prefix_index(8, 0x10)); // 00010000 -> 9
        bits.fix_ranks();
        let leaf = |x: u8, prefixlen| Leaf {
            payload: [x; 4],
            prefixlen,
        };
        let arena = Arena::new();
        let block = DataBlock::build(
            &arena,
            1,
            &bits,
            &[[7; 4], [9; 4]],
            leaf(3, 4),
            None,
            (0, 256),
        );
        // SAFETY: just built, private.
        let d = unsafe { block.as_ref() };
        let got: Vec<Leaf> = [0, 0x10, 0x11, 0x7f, 0x80, 0xff]
            .iter()
            .map(|&b| d.leaf(b))
            .collect();
        assert_eq!(
            got,
            vec![
                leaf(7, 9),
                leaf(9, 16),
                leaf(7, 9),
                leaf(7, 9),
                leaf(3, 4),
                leaf(3, 4)
            ]
        );
        assert_eq!(
            (
                d.best_for(1, 0x10),
                d.best_for(1, 0x20),
                d.best_for(1, 0x90)
            ),
            (leaf(9, 16), leaf(7, 9), leaf(3, 4))
        );
        assert_eq!(
            (d.n_leaves, d.prefix(prefix_index(8, 0x10)), d.prefix(3)),
            (4, Some([9; 4]), None)
        );
        // SAFETY: private.
        unsafe { DataBlock::free(&arena, block.as_ptr()) };
    }

    use proptest::prelude::*;

    /// Prefix indices of a node.
    fn node_contents() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(2usize..512, 0..40)
    }

    fn block_for(
        arena: &Arena,
        idxs: &[usize],
        old: Option<&DataBlock>,
        range: (usize, usize),
    ) -> NonNull<DataBlock> {
        let mut bits = Bits::<8>::default();
        idxs.iter().for_each(|&i| bits.set_raw(i));
        bits.fix_ranks();
        let payloads: Vec<[u8; 4]> = bits.ones().map(|i| (i as u32).to_ne_bytes()).collect();
        let default = Leaf {
            payload: [1; 4],
            prefixlen: 3,
        };
        DataBlock::build(arena, 2, &bits, &payloads, default, old, range)
    }

    proptest! {
        /// Changing one prefix and rebuilding only its byte range gives the
        /// same leaves and runs as a full rebuild, at every byte.
        #[test]
        fn incremental_build_matches_full(idxs in node_contents(), changed in 2usize..512) {
            let arena = Arena::new();
            let before = block_for(&arena, &idxs, None, (0, 256));
            let mut after_idxs = idxs.clone();
            if let Some(pos) = after_idxs.iter().position(|&i| i == changed) { after_idxs.remove(pos); } else { after_idxs.push(changed); }
            let (_, lo, hi) = index_range(changed);
            // SAFETY: private blocks.
            let incremental = block_for(&arena, &after_idxs, Some(unsafe { before.as_ref() }), (lo, hi));
            let full = block_for(&arena, &after_idxs, None, (0, 256));
            // SAFETY: private blocks.
            let (inc, full_ref) = unsafe { (incremental.as_ref(), full.as_ref()) };
            for b in 0..=255u8 {
                prop_assert_eq!(inc.leaf(b), full_ref.leaf(b), "byte {}", b);
            }
            prop_assert_eq!(inc.n_leaves, full_ref.n_leaves);
            // SAFETY: private blocks.
            unsafe { [before, incremental, full].iter().for_each(|p| DataBlock::free(&arena, p.as_ptr())) };
        }
    }
}
