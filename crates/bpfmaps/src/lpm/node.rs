//! Trie nodes and their two kinds of blocks, immutable but for payloads.
//!
//! A node covers one byte (8 bits) of the key. It is two atomic pointers,
//! each to an immutable, popcount-compressed block that a writer replaces
//! whole (copy-on-write). The one exception: a prefix's payload, wherever
//! a block holds it, is an atomic word that the writer may overwrite in
//! place when the prefix gets a new value:
//!
//! ```text
//! Node (24 B) = { children: *ChildBlock, data: *DataBlock, skip }
//!
//! ChildBlock = [ child bits: 256 + ranks (40 B) | len | Node x len ]
//!                 bit b set <=> a child node exists for key byte b
//!
//! DataBlock  = [ run bits (40 B) | default leaf (8 B) | counts, depth,
//!                levels (8 B) | runs, in groups of 4: 4 codes (1 B each),
//!                then their 4 payloads (4 B each) |
//!                hidden prefix index x h (2 B) | hidden payload x h (4 B) ]
//! ```
//!
//! * Prefixes: a prefix with `l` bits inside the node's byte (1..=8, or 0
//!   for `/0` at the root) and bit pattern `p` has index `(1 << l) | p`, a
//!   complete binary tree over the byte.
//! * Runs: for every byte value `b`, the longest prefix at this node or
//!   above that covers `b` ("leaf pushing", as in poptrie) wins `b`.
//!   Run-length encoded: run bit `b` is set where a new winner starts,
//!   and the run holding `b` is entry `rank(bits <= b) - 1`. A run holds
//!   its winner's payload (the value itself when values fit in 4 bytes)
//!   and a code: `l + 1` for the node's prefix of `l` bits, else
//!   `INHERITED` (the default, a match) or `NO_MATCH` (0), so whether a
//!   run matched is its code alone. The code and the run's first byte
//!   name the prefix, so the runs are also the node's set of prefixes:
//!   only those that win no byte (longer prefixes of the node cover them
//!   all) are listed apart, as hidden. Each payload is stored once
//!   (5 bytes per run; the blocks used to hold 8-byte leaves, a 512-bit
//!   prefix set and a payload slot per prefix: 22 bytes per prefix of the
//!   real IPv4 table held, 12.2 now). A lookup reads a run's code and
//!   payload, nearly always from one cache line.
//!   Bytes that have a child get their true run too: a reader that loaded
//!   the child block before the child existed reads it.
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

/// What a lookup answers with: the matched prefix's length and its payload
/// (the value itself when values fit in 4 bytes, else a route slot id), so
/// a lookup ends at the leaf with no further load for small values. Blocks
/// store it in two halves (a run's payload and a one-byte code that gives
/// the length); the inherited default and the direct index store it whole.
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

    /// The leaf's bytes as one word.
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

/// A whole leaf as one word, which readers load whole, so the writer can
/// give the prefix a new payload in place while lookups run: a block's
/// inherited default.
#[repr(transparent)]
pub(super) struct LeafCell(AtomicU64);

impl LeafCell {
    pub const fn new(leaf: Leaf) -> Self {
        LeafCell(AtomicU64::new(leaf.to_word()))
    }

    /// Acquire: pairs with the writer's release store of a new payload,
    /// which may be the id of a route slot filled just before.
    #[inline(always)]
    pub fn load(&self) -> Leaf {
        Leaf::from_word(self.0.load(Ordering::Acquire))
    }

    /// Writer: the same prefix with a new payload.
    fn set_payload(&self, payload: [u8; 4]) {
        let leaf = Leaf {
            payload,
            ..self.load()
        };
        self.0.store(leaf.to_word(), Ordering::Release);
    }
}

/// A payload as a block stores it (a run's, or a hidden prefix's): its
/// bytes as one word (`u32::from_ne_bytes`), which readers load whole and
/// the writer may overwrite in place.
type PayloadCell = AtomicU32;

/// Acquire: a payload written in place may be the id of a route slot the
/// writer filled just before its release store (`store_payload`); the
/// reader then reads that slot. (A plain load on x86; a relaxed one would
/// let the slot's bytes be read before they are visible elsewhere.)
#[inline(always)]
fn load_payload(cell: &PayloadCell) -> [u8; 4] {
    cell.load(Ordering::Acquire).to_ne_bytes()
}

/// Release: publishes a route slot filled before the store (pairs with
/// `load_payload`).
fn store_payload(cell: &PayloadCell, payload: [u8; 4]) {
    cell.store(u32::from_ne_bytes(payload), Ordering::Release);
}

/// A run's code: `l + 1` for the node's prefix of `l` bits (0..=8) that
/// covers the run, else [`INHERITED`] or [`NO_MATCH`].
fn code_of(l: u32) -> u8 {
    l as u8 + 1
}

/// Code of a run that inherits the node's default, a matching prefix.
const INHERITED: u8 = 10;
/// Code of a run that matches nothing (the node's default is no match), so
/// whether a run matched is one compare of its code with 0.
const NO_MATCH: u8 = 0;

/// The code of runs inheriting `default`.
fn default_code(default: Leaf) -> u8 {
    if default.is_none() {
        NO_MATCH
    } else {
        INHERITED
    }
}

/// Bits inside the node of the prefix a run with `code` answers with, if
/// it is one of the node's own.
fn own_bits(code: u8) -> Option<u32> {
    (code != NO_MATCH && code != INHERITED).then(|| u32::from(code) - 1)
}

/// The node's prefix a run with `code` starting at byte `start` answers
/// with, if it is one of the node's own (its index, see `prefix_index`).
fn winner_of(code: u8, start: usize) -> Option<usize> {
    own_bits(code).map(|l| prefix_index(l, start as u8))
}

/// Whether runs with the same `code` starting at bytes `a` and `b` have
/// the same winner: the default, or one prefix of the node.
fn same_winner(code: u8, a: usize, b: usize) -> bool {
    own_bits(code).is_none_or(|l| (a ^ b) >> (8 - l) == 0)
}

/// What a lookup reads from where it ends: a whole [`Leaf`] (value and
/// prefix length, for `longest_match`), or a [`Hit`] (value and whether
/// anything matched, for `get`), which takes fewer instructions, so more
/// lookups fit in the CPU's reorder window at once.
pub(super) trait Answer: Copy {
    fn from_leaf(leaf: Leaf) -> Self;
    /// The answer of run `run` of `block` (`run < n_runs`).
    fn from_run(block: &DataBlock, run: usize) -> Self;
}

impl Answer for Leaf {
    #[inline(always)]
    fn from_leaf(leaf: Leaf) -> Self {
        leaf
    }
    #[inline(always)]
    fn from_run(block: &DataBlock, run: usize) -> Self {
        block.leaf_at(run)
    }
}

/// A lookup's answer without the prefix length, in one register (so a
/// caller's choice between answers is one conditional move): the payload
/// in the low 32 bits; from bit 34 up, something nonzero for a match and
/// zero for none (a run's code, or the direct index's packed length + 1,
/// which `Hit::from_bits` takes as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hit(u64);

impl Hit {
    /// No match.
    pub const NONE: Hit = Hit(0);

    /// A hit whose bits are laid out as above.
    #[inline(always)]
    pub fn from_bits(bits: u64) -> Self {
        Hit(bits)
    }

    #[inline(always)]
    fn new(payload: [u8; 4], matched: u64) -> Self {
        Hit(u64::from(u32::from_ne_bytes(payload)) | matched << 34)
    }

    #[inline(always)]
    pub fn payload(self) -> [u8; 4] {
        (self.0 as u32).to_ne_bytes()
    }

    #[inline(always)]
    pub fn is_none(self) -> bool {
        self.0 >> 34 == 0
    }
}

impl Answer for Hit {
    #[inline(always)]
    fn from_leaf(leaf: Leaf) -> Self {
        Hit::new(leaf.payload, u64::from(!leaf.is_none()))
    }
    #[inline(always)]
    fn from_run(block: &DataBlock, run: usize) -> Self {
        // Nonzero codes match.
        Hit::new(block.payload(run), u64::from(block.code(run)))
    }
}

/// The prefixes a node stores, with their payloads: decoded from its data
/// block, for the writer to change and rebuild from, and for iteration.
#[derive(Clone)]
pub(super) struct Prefixes {
    /// Bit `idx` per stored prefix (see `prefix_index`).
    pub bits: Bits<8>,
    /// The payload of the prefix at each set index (only those are
    /// written: no 2 KiB of zeroes per update).
    payloads: [MaybeUninit<[u8; 4]>; 512],
}

impl Prefixes {
    pub fn new() -> Self {
        Prefixes {
            bits: Bits::EMPTY,
            payloads: [MaybeUninit::uninit(); 512],
        }
    }

    /// The payload of the prefix at `idx`, if stored.
    pub fn get(&self, idx: usize) -> Option<[u8; 4]> {
        // SAFETY: the payloads of set indices are written.
        self.bits
            .get(idx)
            .then(|| unsafe { self.payloads[idx].assume_init() })
    }

    /// Stores (`Some`) or removes (`None`) the prefix at `idx`.
    pub fn set(&mut self, idx: usize, payload: Option<[u8; 4]>) {
        match payload {
            Some(p) => self.put(idx, p),
            None => self.bits.clear_raw(idx),
        }
        self.bits.fix_ranks();
    }

    /// Stores the prefix at `idx` (call `bits.fix_ranks` after a run of
    /// these).
    fn put(&mut self, idx: usize, payload: [u8; 4]) {
        self.bits.set_raw(idx);
        self.payloads[idx].write(payload);
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.bits.count()
    }
}

impl PartialEq for Prefixes {
    fn eq(&self, other: &Self) -> bool {
        self.bits == other.bits && self.bits.ones().all(|i| self.get(i) == other.get(i))
    }
}

impl std::fmt::Debug for Prefixes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.bits.ones().map(|i| (i, self.get(i))))
            .finish()
    }
}

/// Run-length encoder for a block's runs: a run is a maximal range of
/// bytes with the same winner (the inherited default, or one prefix). The
/// runs are kept as the block lays them out, so the block gets them with
/// one copy.
struct Runs {
    bits: Bits<4>,
    /// The first `n` runs are written (no 1 KiB of zeroes per build).
    buf: [MaybeUninit<u8>; runs_bytes(256)],
    n: usize,
    /// Where the last run starts, and its code.
    last_start: usize,
    last_code: u8,
}

impl Runs {
    fn new() -> Self {
        Runs {
            bits: Bits::default(),
            buf: [MaybeUninit::uninit(); runs_bytes(256)],
            n: 0,
            last_start: 0,
            last_code: 0,
        }
    }

    /// Whether a run starting at `start` with `code` has the last run's
    /// winner, so it continues that run.
    fn continues(&self, start: usize, code: u8) -> bool {
        self.n > 0 && self.last_code == code && same_winner(code, self.last_start, start)
    }

    /// Appends a run (its start bit is the caller's).
    fn append(&mut self, payload: [u8; 4], code: u8) {
        let [at_code, at_payload] = run_offsets(self.n);
        self.buf[at_code].write(code);
        for (i, b) in payload.into_iter().enumerate() {
            self.buf[at_payload + i].write(b);
        }
        self.n += 1;
        self.last_code = code;
    }

    /// Bytes from `start` on are won by the run with `code` and `payload`:
    /// a new run, unless the last run has the same winner.
    fn push(&mut self, start: usize, payload: [u8; 4], code: u8) {
        if self.continues(start, code) {
            return;
        }
        self.bits.set_raw(start);
        self.append(payload, code);
        self.last_start = start;
    }

    /// Copies the old runs that start in `a..b` (each ending at the next
    /// start, or `b`); the first folds into ours if it has the same
    /// winner. Whole groups of four are copied at once when old and new
    /// runs line up (always for the runs before a change).
    fn copy_old(&mut self, old: &DataBlock, a: usize, b: usize) {
        if a >= b {
            return;
        }
        let mut starts = old.run_bits.words_in(a, b);
        let mut first = old.run_bits.rank(a);
        let mut count: usize = starts.iter().map(|w| w.count_ones() as usize).sum();
        if count == 0 {
            return;
        }
        let w = starts.iter().position(|w| *w != 0).expect("count > 0");
        let first_start = 64 * w + starts[w].trailing_zeros() as usize;
        if self.continues(first_start, old.code(first)) {
            // The first old run continues our last one: drop its start.
            starts[w] &= starts[w] - 1;
            first += 1;
            count -= 1;
            if count == 0 {
                return;
            }
        }
        self.bits.or_words(&starts);
        let end = first + count;
        let mut run = first;
        if first % 4 == self.n % 4 {
            while run < end && !run.is_multiple_of(4) {
                self.append(old.payload(run), old.code(run));
                run += 1;
            }
            let groups = (end - run) / 4;
            if groups > 0 {
                // SAFETY: both are whole groups of runs: `groups` of the
                // old block's from `run` and of ours from `n`, in bounds.
                unsafe {
                    ptr::copy_nonoverlapping(
                        old.run_addresses(run)[0],
                        self.buf[run_offsets(self.n)[0]..].as_mut_ptr().cast::<u8>(),
                        20 * groups,
                    )
                };
                self.n += 4 * groups;
                run += 4 * groups;
                self.last_code = old.code(run - 1);
            }
        }
        for run in run..end {
            self.append(old.payload(run), old.code(run));
        }
        let w = starts.iter().rposition(|w| *w != 0).expect("count > 0");
        self.last_start = 64 * w + 63 - starts[w].leading_zeros() as usize;
    }

    /// Fresh runs for bytes `lo..hi` from `prefixes` (all those inside
    /// the range, and the longest above it) under `default`: the winner
    /// can change only where a prefix inside the range starts or ends, so
    /// cut there and give each segment the longest prefix covering its
    /// first byte.
    fn fill(&mut self, prefixes: &Prefixes, default: Leaf, lo: usize, hi: usize) {
        let prefix_bits = &prefixes.bits;
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
            for idx in prefix_bits.ones_in(base + first, base + end) {
                let (_, plo, phi) = index_range(idx);
                cut_bits.set_raw(plo);
                cut_bits.set_raw(phi);
            }
        }
        let best = |b: usize| {
            (0..=8u32)
                .rev()
                .map(|l| (l, prefix_index(l, b as u8)))
                .find(|&(_, idx)| prefix_bits.get(idx))
                .map_or((default.payload, default_code(default)), |(l, idx)| {
                    (prefixes.get(idx).expect("stored"), code_of(l))
                })
        };
        let mut cuts = cut_bits.ones().peekable();
        while let Some(start) = cuts.next() {
            match cuts.peek() {
                Some(_) if start < hi => {
                    let (payload, code) = best(start);
                    self.push(start, payload, code);
                }
                _ => break,
            }
        }
    }

    /// Ends the runs: ranks, and the last group's unused codes.
    fn finish(&mut self) {
        self.bits.fix_ranks();
        for run in self.n..self.n.next_multiple_of(4) {
            self.buf[run_offsets(run)[0]].write(NO_MATCH);
        }
    }

    fn code(&self, run: usize) -> u8 {
        // SAFETY: the first n runs are written.
        unsafe { self.buf[run_offsets(run)[0]].assume_init() }
    }

    /// The node's prefixes that win a byte in `lo..hi` (after `finish`).
    fn winners_in(&self, lo: usize, hi: usize) -> Bits<8> {
        let mut out = Bits::default();
        for (run, start) in runs_overlapping(&self.bits, lo, hi) {
            if let Some(idx) = winner_of(self.code(run), start) {
                out.set_raw(idx);
            }
        }
        out
    }

    /// The runs as the block lays them out (after `finish`).
    fn bytes(&self) -> &[MaybeUninit<u8>] {
        &self.buf[..runs_bytes(self.n)]
    }
}

/// The runs of `bits` (run starts, ranks fixed) that overlap bytes
/// `lo..hi`, as (run, its first byte).
fn runs_overlapping(bits: &Bits<4>, lo: usize, hi: usize) -> impl Iterator<Item = (usize, usize)> {
    let first = bits.rank_incl(lo) - 1;
    let first_start = bits.last_one_upto(lo).expect("bit 0 is set");
    std::iter::once(first_start)
        .chain(bits.ones_in(lo + 1, hi))
        .enumerate()
        .map(move |(i, start)| (first + i, start))
}

/// Whether prefix index `i` lies under index `idx` (or is `idx`).
fn in_subtree(i: usize, idx: usize) -> bool {
    let (li, l) = (index_range(i).0, index_range(idx).0);
    li >= l && i >> (li - l) == idx
}

/// Header of a data block. Then, in order: the runs, in groups of four
/// (their four codes, then their four payloads: 20 B, so a run's code and
/// payload nearly always share a cache line, and the runs a lookup reads
/// sit right after the bits it just read), and the hidden prefixes: their
/// indices (2 B each) and payloads (4 B each). A hidden prefix is one that
/// no byte answers with (longer prefixes of the node cover it all); every
/// other prefix's payload is in the runs it wins, so it is stored once.
/// Everything but the payloads (the default's, the runs' and the hidden
/// prefixes', which `LpmTrie` may replace in place) is fixed once
/// published.
#[repr(C)]
pub(super) struct DataBlock {
    pub run_bits: Bits<4>,
    pub default: LeafCell,
    n_runs: u16,
    /// Prefixes stored in the node, hidden ones included.
    n_prefixes: u16,
    /// At most 255: only prefixes shorter than 8 bits inside the byte hide.
    n_hidden: u8,
    /// The node's depth: an own run of code `c` answers with a prefix of
    /// `8 * depth + c - 1` bits.
    depth: u8,
    /// Bit `l` set if the node may store a prefix of `l` bits inside the
    /// byte (exact after a full build; removals leave bits set), so a
    /// rebuild knows when no prefix can lie above the changed one.
    levels: u16,
}

/// A data block of one run holding `Leaf::NONE`, never freed: lets a
/// reader load "some block's leaf" without a branch (see `direct.rs`).
#[repr(C)]
pub(super) struct StaticBlock {
    header: DataBlock,
    /// The run's group: its code and three unused ones.
    code: [u8; 4],
    payload: PayloadCell,
}

pub(super) static NONE_BLOCK: StaticBlock = StaticBlock {
    header: DataBlock {
        run_bits: Bits::FIRST,
        default: LeafCell::new(Leaf::NONE),
        n_runs: 1,
        n_prefixes: 0,
        n_hidden: 0,
        depth: 0,
        levels: 0,
    },
    code: [0; 4],
    payload: PayloadCell::new(0),
};

impl StaticBlock {
    /// The block.
    pub fn block(&'static self) -> &'static DataBlock {
        debug_assert_eq!(
            (
                std::mem::offset_of!(StaticBlock, payload),
                std::mem::offset_of!(StaticBlock, code)
            ),
            (RUNS_OFFSET + 4, RUNS_OFFSET),
            "the run sits where a block's runs are"
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

/// Where the runs start in a data block (what `layout` gives).
const RUNS_OFFSET: usize = size_of::<DataBlock>();
const _: () = assert!(RUNS_OFFSET.is_multiple_of(align_of::<PayloadCell>()));

/// Bytes of `n` runs: whole groups of four codes and four payloads, and a
/// last group with four codes and its payloads.
const fn runs_bytes(n: usize) -> usize {
    20 * (n / 4) + [0, 8, 12, 16][n % 4]
}

/// Offsets of run `run`'s code and payload from the start of the runs.
#[inline(always)]
const fn run_offsets(run: usize) -> [usize; 2] {
    let group = 20 * (run / 4);
    [group + run % 4, group + 4 + 4 * (run % 4)]
}
impl DataBlock {
    /// Layout and the offsets of (hidden indices, hidden payloads).
    fn layout(n_runs: usize, n_hidden: usize) -> (Layout, [usize; 2]) {
        let runs =
            Layout::from_size_align(runs_bytes(n_runs), align_of::<PayloadCell>()).expect("runs");
        let (l, at_runs) = Layout::new::<DataBlock>().extend(runs).expect("layout");
        debug_assert_eq!(at_runs, RUNS_OFFSET);
        let (l, hidden) = l
            .extend(Layout::array::<u16>(n_hidden).expect("hidden"))
            .expect("layout");
        let (l, hidden_payloads) = l
            .extend(Layout::array::<PayloadCell>(n_hidden).expect("hidden payloads"))
            .expect("layout");
        let offsets = [hidden, hidden_payloads];
        debug_assert_eq!(Self::offsets(n_runs, n_hidden), offsets);
        (l.pad_to_align(), offsets)
    }

    /// The offsets `layout` gives, by plain arithmetic.
    fn offsets(n_runs: usize, n_hidden: usize) -> [usize; 2] {
        let hidden = RUNS_OFFSET + runs_bytes(n_runs);
        [hidden, (hidden + 2 * n_hidden).next_multiple_of(4)]
    }

    /// Builds the block of a node at `depth` storing `prefixes` under
    /// `default`. Every byte gets its true run, those with a child too: a
    /// reader that loaded the child block before the child was added may
    /// read this block's run for it.
    pub fn build(
        arena: &Arena,
        depth: usize,
        prefixes: &Prefixes,
        default: Leaf,
    ) -> NonNull<DataBlock> {
        let mut runs = Runs::new();
        runs.fill(prefixes, default, 0, 256);
        runs.finish();
        let winners = runs.winners_in(0, 256);
        let hidden: Vec<_> = prefixes
            .bits
            .ones()
            .filter(|&i| !winners.get(i))
            .map(|i| (i as u16, prefixes.get(i).expect("stored")))
            .collect();
        let levels = prefixes
            .bits
            .ones()
            .fold(0, |acc, i| acc | 1 << index_range(i).0);
        Self::assemble(
            arena,
            depth,
            default,
            &runs,
            &hidden,
            prefixes.len(),
            levels,
        )
    }

    /// The block of the same node (at `depth`) with the prefix at `idx`
    /// stored with `payload` (`Some`) or removed (`None`). Only what the
    /// change can touch is recomputed: the runs in `idx`'s byte range, and
    /// whether `idx`, the prefixes inside its range and the longest one
    /// above it win any byte; the other runs and hidden prefixes are
    /// copied.
    pub fn with_prefix(
        &self,
        arena: &Arena,
        depth: usize,
        idx: usize,
        payload: Option<[u8; 4]>,
    ) -> NonNull<DataBlock> {
        let (_, lo, hi) = index_range(idx);
        let default = self.default.load();
        let (mut near, above) = self.prefixes_around(idx);
        let had = near.get(idx).is_some();
        near.set(idx, payload);
        let n_prefixes =
            self.n_prefixes as usize + usize::from(payload.is_some()) - usize::from(had);

        let mut runs = Runs::new();
        runs.copy_old(self, 0, lo);
        runs.fill(&near, default, lo, hi);
        if hi < 256 {
            // The old run holding `hi` up to the next old run, then those.
            let run = self.run_of(hi as u8);
            runs.push(hi, self.payload(run), self.code(run));
            runs.copy_old(self, hi + 1, 256);
        }
        runs.finish();

        let touched = |i: usize| in_subtree(i, idx) || Some(i) == above;
        let (old_hidden, slots) = self.hidden();
        let mut hidden: Vec<_> = old_hidden
            .iter()
            .zip(slots)
            .filter(|(i, _)| !touched(**i as usize))
            .map(|(&i, slot)| (i, load_payload(slot)))
            .collect();
        let winners = runs.winners_in(lo, hi);
        for i in near.bits.ones() {
            // Bytes outside `lo..hi` keep their runs: only the prefix
            // above can win some of them.
            let wins_outside = Some(i) == above && self.wins_outside(i, lo, hi);
            if !winners.get(i) && !wins_outside {
                hidden.push((i as u16, near.get(i).expect("stored")));
            }
        }
        hidden.sort_unstable_by_key(|&(i, _)| i);
        let levels = self.levels | u16::from(payload.is_some()) << index_range(idx).0;
        Self::assemble(arena, depth, default, &runs, &hidden, n_prefixes, levels)
    }

    /// The prefixes inside `idx`'s byte range (`idx` included), and the
    /// longest prefix above it, which wins the bytes of the range that
    /// none inside wins: what a rebuild of the range reads.
    fn prefixes_around(&self, idx: usize) -> (Prefixes, Option<usize>) {
        let (l_idx, lo, hi) = index_range(idx);
        let mut out = Prefixes::new();
        let mut above: Option<(usize, [u8; 4])> = None;
        // Sorts a stored prefix: inside the range, above it, or neither.
        let take = |i: usize, payload: [u8; 4], out: &mut Prefixes, above: &mut Option<_>| {
            let li = index_range(i).0;
            if in_subtree(i, idx) {
                out.put(i, payload);
            } else if li < l_idx && idx >> (l_idx - li) == i && above.is_none_or(|(a, _)| a < i) {
                *above = Some((i, payload));
            }
        };
        // Takes the prefixes that win bytes in `lo..hi`; true if one of
        // those bytes inherits the default (no prefix covers it).
        let scan = |lo: usize, hi: usize, out: &mut Prefixes, above: &mut Option<_>| {
            let mut inherits = false;
            for (run, start) in runs_overlapping(&self.run_bits, lo, hi) {
                match winner_of(self.code(run), start) {
                    Some(i) => take(i, self.payload(run), out, above),
                    None => inherits = true,
                }
            }
            inherits
        };
        // Whether the longest visible prefix above is known: found, or
        // none can exist (a byte of its range inherits the default, or the
        // node stores nothing that short).
        let mut settled = self.levels & ((1 << l_idx) - 1) == 0;
        settled |= scan(lo, hi, &mut out, &mut above);
        // One above that wins no byte in the range wins some in the range
        // of a shorter one: look in ever larger ranges, one sibling half
        // at a time (a longer one above, if visible, wins there first).
        let mut level = l_idx;
        while !settled && above.is_none() && level > 0 {
            let (_, slo, shi) = index_range((idx >> (l_idx - level)) ^ 1);
            settled |= scan(slo, shi, &mut out, &mut above);
            level -= 1;
        }
        // Hidden ones, last: one above may be longer than the visible one.
        let (hidden, slots) = self.hidden();
        for (&i, slot) in hidden.iter().zip(slots) {
            take(i as usize, load_payload(slot), &mut out, &mut above);
        }
        out.bits.fix_ranks();
        if let Some((a, payload)) = above {
            out.set(a, Some(payload));
        }
        (out, above.map(|(a, _)| a))
    }

    /// Whether the node's prefix at `i`, which covers `lo..hi`, wins a byte
    /// of its range outside `lo..hi`.
    fn wins_outside(&self, i: usize, lo: usize, hi: usize) -> bool {
        let (l, alo, ahi) = index_range(i);
        let code = code_of(l);
        let left = (alo < lo).then(|| self.run_of(alo as u8)..=self.run_of((lo - 1) as u8));
        let right = (hi < ahi).then(|| self.run_of(hi as u8)..=self.run_of((ahi - 1) as u8));
        left.into_iter()
            .chain(right)
            .flatten()
            .any(|run| self.code(run) == code)
    }

    /// Allocates and fills a block: `runs` (finished), then `hidden`
    /// (ascending indices).
    fn assemble(
        arena: &Arena,
        depth: usize,
        default: Leaf,
        runs: &Runs,
        hidden: &[(u16, [u8; 4])],
        n_prefixes: usize,
        levels: u16,
    ) -> NonNull<DataBlock> {
        let (layout, [at_hidden, at_hidden_payloads]) = Self::layout(runs.n, hidden.len());
        let p = arena.alloc(layout).as_ptr();
        let block = NonNull::new(p.cast::<DataBlock>()).expect("arena block");
        // SAFETY: fresh allocation of the right layout; offsets from
        // `layout`. A payload cell holds a payload's bytes.
        unsafe {
            block.as_ptr().write(DataBlock {
                run_bits: runs.bits,
                default: LeafCell::new(default),
                n_runs: runs.n as u16,
                n_prefixes: n_prefixes as u16,
                n_hidden: hidden.len() as u8,
                depth: depth as u8,
                levels,
            });
            let bytes = runs.bytes();
            ptr::copy_nonoverlapping(bytes.as_ptr().cast::<u8>(), p.add(RUNS_OFFSET), bytes.len());
            let (at_idx, at_payload) = (
                p.add(at_hidden).cast::<u16>(),
                p.add(at_hidden_payloads).cast::<[u8; 4]>(),
            );
            for (i, &(idx, payload)) in hidden.iter().enumerate() {
                at_idx.add(i).write(idx);
                at_payload.add(i).write(payload);
            }
        }
        block
    }

    /// A block with no prefixes: every byte maps to `default`.
    pub fn empty(arena: &Arena, default: Leaf) -> NonNull<DataBlock> {
        Self::build(arena, 0, &Prefixes::new(), default)
    }

    #[inline(always)]
    fn at(&self, offset: usize) -> *const u8 {
        // SAFETY: offsets come from `layout` for this block's counts.
        unsafe { ptr::from_ref(self).cast::<u8>().add(offset) }
    }

    #[inline(always)]
    fn offsets_here(&self) -> [usize; 2] {
        Self::offsets(self.n_runs as usize, self.n_hidden as usize)
    }

    /// Where run `run`'s code and payload are (to prefetch, then load).
    #[inline(always)]
    pub fn run_addresses(&self, run: usize) -> [*const u8; 2] {
        run_offsets(run).map(|offset| self.at(RUNS_OFFSET + offset))
    }

    /// Run `run`'s payload cell (`run < n_runs`).
    #[inline(always)]
    fn payload_cell(&self, run: usize) -> &PayloadCell {
        debug_assert!(run < self.n_runs as usize);
        // SAFETY: run < n_runs: written by `build` at this offset.
        unsafe { &*self.run_addresses(run)[1].cast::<PayloadCell>() }
    }

    /// Run `run`'s payload.
    #[inline(always)]
    fn payload(&self, run: usize) -> [u8; 4] {
        load_payload(self.payload_cell(run))
    }

    /// Run `run`'s code (`run < n_runs`).
    #[inline(always)]
    fn code(&self, run: usize) -> u8 {
        debug_assert!(run < self.n_runs as usize);
        // SAFETY: run < n_runs: written by `build` at this offset.
        unsafe { *self.run_addresses(run)[0] }
    }

    /// The hidden prefixes' indices (ascending) and payloads.
    fn hidden(&self) -> (&[u16], &[PayloadCell]) {
        let [at_hidden, at_payloads] = self.offsets_here();
        let n = self.n_hidden as usize;
        // SAFETY: n hidden indices and payloads at these offsets.
        unsafe {
            (
                std::slice::from_raw_parts(self.at(at_hidden).cast::<u16>(), n),
                std::slice::from_raw_parts(self.at(at_payloads).cast::<PayloadCell>(), n),
            )
        }
    }

    /// The run holding byte `b`.
    #[inline(always)]
    pub fn run_of(&self, b: u8) -> usize {
        // Bit 0 is always set, so the rank is at least 1.
        self.run_bits.rank_incl(b as usize) - 1
    }

    /// The leaf of run `run` (`run < n_runs`): its payload, and the
    /// length its code gives (chosen without a branch: whether a run is
    /// inherited is unpredictable for random keys).
    #[inline(always)]
    pub fn leaf_at(&self, run: usize) -> Leaf {
        let (payload, code) = (self.payload(run), self.code(run));
        let own = (u32::from(self.depth) << 3).wrapping_add(u32::from(code).wrapping_sub(1));
        // The default's length, or no match (`u32::MAX`) for NO_MATCH.
        let inherited = self.default.load().prefixlen;
        Leaf {
            payload,
            prefixlen: std::hint::select_unpredictable(
                code == NO_MATCH || code == INHERITED,
                inherited,
                own,
            ),
        }
    }

    /// The leaf for byte `b`: the longest prefix of this node covering
    /// `b`, else the inherited default. For a byte with a child, that is
    /// what the child inherits.
    #[inline(always)]
    pub fn leaf(&self, b: u8) -> Leaf {
        self.leaf_at(self.run_of(b))
    }

    /// Where the stored prefix at `idx` keeps its payload: its hidden
    /// slot, or each run it wins (none if it is not stored).
    fn cells_of(&self, idx: usize) -> impl Iterator<Item = &PayloadCell> {
        let (hidden, slots) = self.hidden();
        let (l, lo, hi) = index_range(idx);
        let slot = hidden.binary_search(&(idx as u16)).ok().map(|i| &slots[i]);
        // Only this prefix has its length in its own byte range.
        let runs = slot
            .is_none()
            .then(|| self.run_of(lo as u8)..=self.run_of((hi - 1) as u8))
            .into_iter()
            .flatten()
            .filter(move |&run| self.code(run) == code_of(l))
            .map(|run| self.payload_cell(run));
        slot.into_iter().chain(runs)
    }

    /// Writer: the stored prefix at `idx` gets the new `payload`.
    pub fn set_prefix_payload(&self, idx: usize, payload: [u8; 4]) {
        for cell in self.cells_of(idx) {
            store_payload(cell, payload);
        }
    }

    /// Writer: the inherited default (the same prefix) gets the new
    /// `payload`, and so does every run that inherits it.
    pub fn set_inherited_payload(&self, payload: [u8; 4]) {
        self.default.set_payload(payload);
        for run in (0..self.n_runs as usize).filter(|&run| self.code(run) == INHERITED) {
            store_payload(self.payload_cell(run), payload);
        }
    }

    /// The prefixes stored in this node, with their payloads.
    pub fn prefixes(&self) -> Prefixes {
        let mut out = Prefixes::new();
        for (run, start) in self.run_bits.ones().enumerate() {
            if let Some(idx) = winner_of(self.code(run), start) {
                out.put(idx, self.payload(run));
            }
        }
        let (hidden, slots) = self.hidden();
        for (&idx, slot) in hidden.iter().zip(slots) {
            out.put(idx as usize, load_payload(slot));
        }
        out.bits.fix_ranks();
        out
    }

    /// Payload of the prefix at `idx`, if stored.
    pub fn prefix(&self, idx: usize) -> Option<[u8; 4]> {
        self.cells_of(idx).next().map(load_payload)
    }

    /// Number of hidden prefixes (for tests).
    #[cfg(test)]
    pub fn hidden_len(&self) -> usize {
        self.n_hidden as usize
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
            let (n, h) = ((*block).n_runs as usize, (*block).n_hidden as usize);
            arena.release(block.cast(), Self::layout(n, h).0.size())
        }
    }
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
        let mut prefixes = Prefixes::new();
        prefixes.set(prefix_index(1, 0x00), Some([7; 4])); // 0xxxxxxx -> 7
        prefixes.set(prefix_index(8, 0x10), Some([9; 4])); // 00010000 -> 9
        prefixes.set(prefix_index(2, 0xc0), Some([5; 4])); // 11xxxxxx -> 5, hidden:
        prefixes.set(prefix_index(3, 0xc0), Some([6; 4])); // 110xxxxx
        prefixes.set(prefix_index(3, 0xe0), Some([8; 4])); // 111xxxxx
        let leaf = |x: u8, prefixlen| Leaf {
            payload: [x; 4],
            prefixlen,
        };
        let arena = Arena::new();
        let block = DataBlock::build(&arena, 1, &prefixes, leaf(3, 4));
        // SAFETY: just built, private.
        let d = unsafe { block.as_ref() };
        let got: Vec<Leaf> = [0, 0x10, 0x11, 0x7f, 0x80, 0xbf, 0xc0, 0xff]
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
                leaf(3, 4),
                leaf(6, 11),
                leaf(8, 11),
            ]
        );
        assert_eq!((d.n_runs, d.n_hidden, d.n_prefixes), (6, 1, 5));
        assert_eq!(d.levels, 1 << 1 | 1 << 2 | 1 << 3 | 1 << 8);
        assert_eq!(
            (
                d.prefix(prefix_index(8, 0x10)),
                d.prefix(prefix_index(2, 0xc0)),
                d.prefix(3)
            ),
            (Some([9; 4]), Some([5; 4]), None)
        );
        assert_eq!(d.prefixes(), prefixes);
        // New payloads in place: a visible prefix, a hidden one, the default.
        d.set_prefix_payload(prefix_index(1, 0x00), [1; 4]);
        d.set_prefix_payload(prefix_index(2, 0xc0), [2; 4]);
        d.set_inherited_payload([4; 4]);
        assert_eq!(
            (d.leaf(0x11), d.leaf(0x10), d.leaf(0x80), d.default.load()),
            (leaf(1, 9), leaf(9, 16), leaf(4, 4), leaf(4, 4))
        );
        prefixes.set(prefix_index(1, 0x00), Some([1; 4]));
        prefixes.set(prefix_index(2, 0xc0), Some([2; 4]));
        assert_eq!(d.prefixes(), prefixes);
        // SAFETY: private.
        unsafe { DataBlock::free(&arena, block.as_ptr()) };
    }

    /// Removing a prefix whose range is all its own: the bytes go to the
    /// longest prefix above, found outside the range (here past a hidden
    /// shorter one), as a full build gives them.
    #[test]
    fn a_removal_uncovers_the_longest_prefix_above() {
        let arena = Arena::new();
        let mut set = Prefixes::new();
        set.set(prefix_index(1, 0x00), Some([1; 4])); // hidden by the two below
        set.set(prefix_index(2, 0x00), Some([2; 4]));
        set.set(prefix_index(2, 0x40), Some([3; 4]));
        set.set(prefix_index(8, 0x00), Some([4; 4]));
        let before = DataBlock::build(&arena, 0, &set, Leaf::NONE);
        // SAFETY: private blocks.
        let after = unsafe { before.as_ref() }.with_prefix(&arena, 0, prefix_index(8, 0x00), None);
        set.set(prefix_index(8, 0x00), None);
        let full = DataBlock::build(&arena, 0, &set, Leaf::NONE);
        // SAFETY: private blocks.
        let (after, full) = unsafe { (after.as_ref(), full.as_ref()) };
        assert_eq!(after.leaf(0x00).payload, [2; 4]);
        assert_eq!(
            (0..=255).map(|b| after.leaf(b)).collect::<Vec<_>>(),
            (0..=255).map(|b| full.leaf(b)).collect::<Vec<_>>()
        );
        assert_eq!(after.prefixes(), set);
    }

    #[test]
    fn the_static_block_answers_none() {
        let d = NONE_BLOCK.block();
        assert_eq!((d.leaf(0), d.leaf(255)), (Leaf::NONE, Leaf::NONE));
        assert_eq!(d.prefixes(), Prefixes::new());
    }

    use proptest::prelude::*;

    /// Prefix indices of a node, each with a payload from a few values
    /// (so neighbours of the same length often share one).
    fn node_contents() -> impl Strategy<Value = Vec<(usize, u8)>> {
        prop::collection::vec((2usize..512, 0u8..3), 0..40)
    }

    fn prefixes_of(idxs: &[(usize, u8)]) -> Prefixes {
        let mut p = Prefixes::new();
        for &(i, v) in idxs {
            p.set(i, Some([v; 4]));
        }
        p
    }

    fn default_leaf() -> Leaf {
        Leaf {
            payload: [1; 4],
            prefixlen: 3,
        }
    }

    proptest! {
        /// A chain of changes, each rebuilding only the changed prefix's
        /// byte range from the block before, gives the same runs, leaves,
        /// hidden prefixes and counts as a full build of the same prefixes,
        /// and the block gives back the prefixes it holds.
        #[test]
        fn incremental_builds_match_full(
            idxs in node_contents(),
            changes in prop::collection::vec((1usize..512, prop::option::of(0u8..3)), 1..12),
            no_default in any::<bool>(),
        ) {
            let arena = Arena::new();
            let default = if no_default { Leaf::NONE } else { default_leaf() };
            let mut set = prefixes_of(&idxs);
            let mut block = DataBlock::build(&arena, 2, &set, default);
            let mut blocks = vec![block];
            for (idx, value) in changes {
                let payload = value.map(|v| [v; 4]);
                set.set(idx, payload);
                // SAFETY: private blocks.
                block = unsafe { block.as_ref() }.with_prefix(&arena, 2, idx, payload);
                let full = DataBlock::build(&arena, 2, &set, default);
                blocks.extend([block, full]);
                // SAFETY: private blocks.
                let (inc, full) = unsafe { (block.as_ref(), full.as_ref()) };
                for byte in 0..=255u8 {
                    prop_assert_eq!(inc.leaf(byte), full.leaf(byte), "byte {}", byte);
                }
                prop_assert_eq!(inc.run_bits, full.run_bits);
                prop_assert_eq!(inc.hidden().0, full.hidden().0);
                prop_assert_eq!(inc.n_prefixes, full.n_prefixes);
                prop_assert_eq!(inc.prefixes(), set.clone());
                for i in 1..512 {
                    prop_assert_eq!(inc.prefix(i), set.get(i), "idx {}", i);
                }
            }
            // SAFETY: private blocks.
            unsafe { blocks.iter().for_each(|p| DataBlock::free(&arena, p.as_ptr())) };
        }
    }
}
