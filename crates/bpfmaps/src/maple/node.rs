//! The maple tree's nodes: wide, immutable once published, carved from
//! the map's block arena.
//!
//! A **leaf** holds up to [`LEAF_SLOTS`] ranges, sorted and disjoint:
//! their first indices in one array (what a search scans), then each
//! range's last index beside its value (what a hit reads next, in one
//! cache line). The kernel's leaves
//! store a pivot per slot and an explicit `NULL` slot for every gap, so a
//! range with free space after it takes two slots; here a gap is simply
//! the space between one range's `last` and the next one's `first`, so a
//! range takes one slot whether or not it has neighbours (24 bytes with a
//! `u64` value, against the kernel's 32 for a range and its gap).
//!
//! A **branch** holds up to [`BRANCH_SLOTS`] children, and for each, as
//! the kernel's allocation-tree nodes do, what a search needs without
//! touching it: `lo` (the first index of its first range, the routing
//! key), `hi` (the last index of its last range) and `gap` (the largest
//! free run between two of its ranges). Free runs between children are
//! `lo[i + 1] - hi[i] - 1`; those before the first range and after the
//! last are the tree's edges.
//!
//! Unused slots of `first`, of the leaf's last indices, of `lo` and of
//! `hi` hold `u64::MAX`, so a search counts the keys at or below an index
//! over the whole array, without a branch on the length (only an index
//! of `u64::MAX` counts the padding, and takes its own answer).
//!
//! Nodes never change once a reader can reach them: a write builds new
//! copies of the nodes it changes and publishes a new root (copy on
//! write, as the kernel's maple tree in RCU mode), and the replaced nodes
//! are retired to the arena after a grace period: crossbeam's epoch for
//! pinned readers, then the read sections of readers that copy out
//! ([`MapleTree::get`](super::MapleTree::get), `core::read_section`).

use std::alloc::Layout;
use std::hint::select_unpredictable;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::core::arena::{Arena, MAX_BLOCK, Session};
use crate::core::read_section;
use crate::core::reclaim::Guard;

/// Slots per node, leaves and branches alike: 15, so that a node's header
/// and keys fill two cache lines, a leaf of `u64` values six and a branch
/// eight (docs/design.md, "Range maps"). For the node-size sweep only,
/// `--cfg bpfmaps_maple_slots="7"` or `"31"` builds the tree with 7 or 31
/// (docs/benchmarks.md, "Node size").
const SLOTS: usize = if cfg!(bpfmaps_maple_slots = "7") {
    7
} else if cfg!(bpfmaps_maple_slots = "31") {
    31
} else {
    15
};
/// Ranges per leaf.
pub const LEAF_SLOTS: usize = SLOTS;
/// Children per branch.
pub const BRANCH_SLOTS: usize = SLOTS;
/// Nodes are sized in whole cache lines. The tree's arena carves only
/// such sizes from chunks aligned to pages, so every node starts a line.
const LINE: usize = 64;
/// A node left with fewer entries than this by a removal is merged with
/// a neighbour (a quarter, not the textbook half: merges copy nodes, and
/// loads only pay a level for a tree this sparse): 4 of 15.
pub const MIN_FILL: usize = SLOTS.div_ceil(4);

/// What every node starts with.
#[repr(C)]
pub struct Header {
    /// 0 for a leaf; a branch's children are one level below it.
    pub level: u8,
    /// Ranges (leaf) or children (branch) in use.
    pub len: u8,
}

/// A node pointer: a leaf or a branch, by its header's level.
pub type NodePtr = NonNull<Header>;

/// A leaf: up to [`LEAF_SLOTS`] disjoint ranges, sorted.
#[repr(C)]
pub struct Leaf<V> {
    pub header: Header,
    pub first: [u64; LEAF_SLOTS],
    pub slot: [Slot<V>; LEAF_SLOTS],
}

/// A range's last index and its value.
#[repr(C)]
pub struct Slot<V> {
    pub last: u64,
    pub value: MaybeUninit<V>,
}

/// A branch: up to [`BRANCH_SLOTS`] children and what each spans.
#[repr(C)]
pub struct Branch {
    pub header: Header,
    /// One more than the children: `lo[BRANCH_SLOTS]` is padding, so that
    /// `lo[1..]` holds as many keys as a node search takes.
    pub lo: [u64; BRANCH_SLOTS + 1],
    pub child: [Option<NodePtr>; BRANCH_SLOTS],
    pub hi: [u64; BRANCH_SLOTS],
    pub gap: [u64; BRANCH_SLOTS],
}

/// Index of the slot whose key is the last at or below `index`, among
/// `len` sorted keys padded with `u64::MAX`: the count of keys `<=
/// index`, which may be 0 (none is).
///
/// The padding is above every index but `u64::MAX`, which is at or above
/// every key: that index takes its own answer, `len`, instead of a clamp
/// of the count, which would add two steps to the chain of dependent
/// loads a descent is (`docs/benchmarks.md`, "the search's clamp").
///
/// Two steps of three independent compares, no branch: shorter than a
/// binary search's four dependent steps, and far fewer instructions than
/// summing all 15 compares (both measured slower, on random indices and
/// on one index again and again: `docs/benchmarks.md`, "node search").
/// (7 keys take one such step, 31 three.)
#[inline(always)]
pub fn count_le<const N: usize>(keys: &[u64; N], len: usize, index: u64) -> usize {
    search_by::<N>(|k| keys[k], len, index).0
}

/// [`count_le`] over `N` keys read by `key` (`0..N`; keys that need not
/// be side by side, as a leaf's last indices beside their values), and
/// the first key above `index` (`u64::MAX` if none is).
///
/// That key is picked from the keys the search compared, by selects a
/// random index cannot mispredict, rather than loaded at the count: a
/// caller that goes on from it (a forward walk, from the end of the
/// range it found) waits on one load fewer. A search that does not use
/// it costs nothing: the selects are dropped.
#[inline(always)]
fn search_by<const N: usize>(key: impl Fn(usize) -> u64, len: usize, index: u64) -> (usize, u64) {
    const { assert!(N == 7 || N == 15 || N == 31, "7, 15 or 31 keys") };
    let le = |k: u64| k <= index;
    // Keys 3, 7 and 11 split the node in four groups: the answer is in
    // group `g`, past its `4g` keys (and below the group's fourth key, a
    // pivot, or the end) ...
    let (base, pivot) = match N {
        7 => {
            let p = key(3);
            (4 * le(p) as usize, select_unpredictable(le(p), u64::MAX, p))
        }
        15 => {
            let (p0, p1, p2) = (key(3), key(7), key(11));
            let groups = le(p0) as usize + le(p1) as usize + le(p2) as usize;
            (4 * groups, first_above([p0, p1, p2, u64::MAX], index))
        }
        // (31: four groups of eight, then a group's halves)
        _ => {
            let base = 8 * (le(key(7)) as usize + le(key(15)) as usize + le(key(23)) as usize);
            let base = base + 4 * le(key(base + 3)) as usize;
            (
                base,
                if base + 3 < N {
                    key(base + 3)
                } else {
                    u64::MAX
                },
            )
        }
    };
    // ... and as many of the group's first three keys.
    let (a, b, c) = (key(base), key(base + 1), key(base + 2));
    if index == u64::MAX {
        return (len, u64::MAX);
    }
    let count = base + le(a) as usize + le(b) as usize + le(c) as usize;
    (count, first_above([a, b, c, pivot], index))
}

/// The first of four sorted keys above `index` (the last if none of the
/// first three is): two levels of selects, no branch.
#[inline(always)]
fn first_above(keys: [u64; 4], index: u64) -> u64 {
    let pick = |key: u64, otherwise: u64| select_unpredictable(key > index, key, otherwise);
    select_unpredictable(
        keys[1] > index,
        pick(keys[0], keys[1]),
        pick(keys[2], keys[3]),
    )
}

impl<V> Leaf<V> {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.header.len as usize
    }

    /// The last index of the range in slot `k`.
    #[inline(always)]
    pub fn last(&self, k: usize) -> u64 {
        self.slot[k].last
    }

    /// The value in slot `k` (`k < len`).
    #[inline(always)]
    pub fn value(&self, k: usize) -> &V {
        debug_assert!(k < self.len());
        // SAFETY: slots below `len` are initialised when the leaf is built.
        unsafe { self.slot[k].value.assume_init_ref() }
    }

    /// The slot of the range holding `index`, if one does.
    #[inline(always)]
    pub fn find(&self, index: u64) -> Option<usize> {
        let k = count_le(&self.first, self.len(), index);
        (k > 0 && self.last(k - 1) >= index).then(|| k - 1)
    }

    /// The slot `k` of the first range that ends at or after `index` (the
    /// one holding it, or the next; `len` if none does), and that range's
    /// last index (`u64::MAX` past the ranges).
    ///
    /// The count of ranges ending before `index`: a search of the last
    /// indices alone (unused slots end at `u64::MAX`), where a search of
    /// the first indices leaves a look at the range before, and a branch
    /// on it that random indices cannot predict. The last index comes
    /// from the search's keys ([`search_by`]): a forward walk's next index
    /// is that last index plus one (docs/benchmarks.md, "Forward searches
    /// on last indices").
    #[inline(always)]
    pub fn at_or_after(&self, index: u64) -> (usize, u64) {
        if index == 0 {
            return (0, self.last(0));
        }
        search_by::<LEAF_SLOTS>(|k| self.slot[k].last, self.len(), index - 1)
    }

    /// What the parent records of this leaf.
    pub fn span(&self) -> Span {
        let n = self.len();
        let gap = (1..n)
            .map(|k| self.first[k] - self.last(k - 1) - 1)
            .max()
            .unwrap_or(0);
        Span {
            lo: self.first[0],
            hi: self.last(n - 1),
            gap,
        }
    }
}

impl Branch {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.header.len as usize
    }

    /// The child whose span is the last to start at or below `index`
    /// (the first child for an index below them all).
    ///
    /// The count of the children after the first that start at or below
    /// `index`: the first child's start need not be compared, since an
    /// index below it goes to that child too.
    #[inline(always)]
    pub fn route(&self, index: u64) -> usize {
        let after_first = self.lo[1..].first_chunk::<BRANCH_SLOTS>();
        count_le(
            after_first.expect("lo has a key more"),
            self.len() - 1,
            index,
        )
    }

    /// [`route`](Self::route) for a branch of at most three children:
    /// one step of compares where a fuller branch's search takes two.
    /// The root of most trees is such a branch, and a descent pays each
    /// step in its chain of dependent loads (docs/benchmarks.md, "A
    /// small root").
    #[inline(always)]
    pub fn route_small(&self, index: u64) -> usize {
        debug_assert!(self.len() <= 3);
        let count = (self.lo[1] <= index) as usize + (self.lo[2] <= index) as usize;
        if index == u64::MAX {
            self.len() - 1
        } else {
            count
        }
    }

    /// Routes by the search that fits the branch's size: for a descent's
    /// first step, where one tree's root takes the same branch every time.
    #[inline(always)]
    pub fn route_root(&self, index: u64) -> usize {
        if self.len() <= 3 {
            self.route_small(index)
        } else {
            self.route(index)
        }
    }

    /// The first child whose span ends at or after `from` (`len` if none
    /// does): where a forward search from `from` goes on, found from `hi`
    /// alone, so no second look at the child's end waits on the search.
    /// `small`: the branch has at most three children (one step of
    /// compares, as [`route_small`](Self::route_small)).
    #[inline(always)]
    pub fn ending_from(&self, from: u64, small: bool) -> usize {
        if from == 0 {
            return 0;
        }
        // Children ending before `from` are those ending at or below
        // `from - 1`; unused slots of `hi` hold `u64::MAX`, above it.
        let below = from - 1;
        if small {
            debug_assert!(self.len() <= 3);
            (self.hi[0] <= below) as usize
                + (self.hi[1] <= below) as usize
                + (self.hi[2] <= below) as usize
        } else {
            count_le(&self.hi, self.len(), below)
        }
    }

    #[inline(always)]
    pub fn child(&self, i: usize) -> NodePtr {
        self.child[i].expect("a branch slot below len holds a child")
    }

    /// What this branch records of child `i`.
    #[inline]
    pub fn record(&self, i: usize) -> Span {
        Span {
            lo: self.lo[i],
            hi: self.hi[i],
            gap: self.gap[i],
        }
    }

    /// Records `span` for child `i`.
    #[inline]
    pub fn set_record(&mut self, i: usize, span: Span) {
        (self.lo[i], self.hi[i], self.gap[i]) = (span.lo, span.hi, span.gap);
    }

    /// The child `i` with what this branch records of it.
    pub fn sub(&self, i: usize) -> Sub {
        Sub {
            node: self.child(i),
            span: self.record(i),
        }
    }

    /// What the parent records of this branch.
    pub fn span(&self) -> Span {
        let n = self.len();
        let mut gap = self.gap[0];
        for i in 1..n {
            gap = gap.max(self.gap[i]).max(self.lo[i] - self.hi[i - 1] - 1);
        }
        Span {
            lo: self.lo[0],
            hi: self.hi[n - 1],
            gap,
        }
    }
}

/// What a branch records of a child: its first and last index held, and
/// the largest free run inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub lo: u64,
    pub hi: u64,
    pub gap: u64,
}

/// A child and its span: what a write hands up to the level above.
#[derive(Debug, Clone, Copy)]
pub struct Sub {
    pub node: NodePtr,
    pub span: Span,
}

/// One range as a write handles it.
#[derive(Debug, Clone)]
pub struct Item<V> {
    pub first: u64,
    pub last: u64,
    pub value: V,
}

/// Reads a node's header.
///
/// # Safety
/// `node` points to a live node.
#[inline(always)]
pub unsafe fn header<'a>(node: NodePtr) -> &'a Header {
    // SAFETY: the caller's.
    unsafe { node.as_ref() }
}

/// The node as a leaf.
///
/// # Safety
/// `node` is a live leaf of values `V`, alive for `'a`.
#[inline(always)]
pub unsafe fn as_leaf<'a, V>(node: NodePtr) -> &'a Leaf<V> {
    // SAFETY: the caller's; the header is the leaf's first field.
    unsafe { node.cast::<Leaf<V>>().as_ref() }
}

/// A readers' descent from `root` to a leaf: `step` turns each branch
/// and the slot its search routed to into the child to go on in, or ends
/// the search (`None`). The root is routed by [`Branch::route_root`],
/// the levels below it by [`Branch::route`].
///
/// # Safety
/// The nodes under `root` are live for the descent.
#[inline(always)]
pub unsafe fn descend(
    root: NodePtr,
    index: u64,
    mut step: impl FnMut(&Branch, usize) -> Option<NodePtr>,
) -> Option<NodePtr> {
    // SAFETY: the caller's; children of live branches are live.
    unsafe {
        if header(root).level == 0 {
            return Some(root);
        }
        let mut branch = as_branch(root);
        let mut i = branch.route_root(index);
        // The parent's level says when a child is a leaf: the loop's exit
        // does not wait on the child's header.
        loop {
            let node = step(branch, i)?;
            if branch.header.level == 1 {
                return Some(node);
            }
            branch = as_branch(node);
            i = branch.route(index);
        }
    }
}

/// A forward search's descent from `root`: to the leaf holding the first
/// range that ends at or after `from`, or `None` if no range does. Each
/// branch is searched on its children's last indices
/// ([`Branch::ending_from`]); the root's size picks its search once, as
/// in [`descend`].
///
/// # Safety
/// The nodes under `root` are live for the descent.
#[inline(always)]
pub unsafe fn descend_from(root: NodePtr, from: u64) -> Option<NodePtr> {
    // SAFETY: the caller's; children of live branches are live.
    unsafe {
        if header(root).level == 0 {
            return Some(root);
        }
        let mut branch = as_branch(root);
        let mut i = branch.ending_from(from, branch.len() <= 3);
        // Below the root, the parent only comes down to a child that
        // ends at or after `from`: only the root can have none.
        if i == branch.len() {
            return None;
        }
        loop {
            let node = branch.child(i);
            if branch.header.level == 1 {
                return Some(node);
            }
            branch = as_branch(node);
            i = branch.ending_from(from, false);
        }
    }
}

/// The node as a branch.
///
/// # Safety
/// `node` is a live branch, alive for `'a`.
#[inline(always)]
pub unsafe fn as_branch<'a>(node: NodePtr) -> &'a Branch {
    // SAFETY: the caller's; the header is the branch's first field.
    unsafe { node.cast::<Branch>().as_ref() }
}

/// `layout` rounded up to whole cache lines.
const fn whole_lines(layout: Layout) -> Layout {
    match Layout::from_size_align(layout.size().div_ceil(LINE) * LINE, layout.align()) {
        Ok(layout) => layout,
        Err(_) => panic!("a node layout"),
    }
}

/// A pointer that may cross to the thread that frees it.
struct SendPtr(NodePtr);
// SAFETY: nodes are plain memory owned by the tree; whoever holds this
// after the grace period is the only one to touch the node.
unsafe impl Send for SendPtr {}

/// The tree's node memory: allocation from the arena, retirement after
/// a grace period (dropping a leaf's values first when `V` needs it).
pub struct Nodes<V> {
    pub arena: Arc<Arena>,
    _values: std::marker::PhantomData<fn(V) -> V>,
}

impl<V: Clone + Send + Sync + 'static> Nodes<V> {
    const LEAF: Layout = const {
        let layout = Layout::new::<Leaf<V>>();
        assert!(
            layout.size() <= MAX_BLOCK && layout.align() <= 16,
            "a maple tree value must be at most 500 bytes and 16-aligned: box larger ones"
        );
        whole_lines(layout)
    };
    const BRANCH: Layout = whole_lines(Layout::new::<Branch>());

    pub fn new() -> Self {
        Nodes {
            arena: Arc::new(Arena::with_read_sections()),
            _values: std::marker::PhantomData,
        }
    }

    /// A new leaf holding the `n` `items` (1 to `LEAF_SLOTS`, sorted and
    /// disjoint), with its span.
    pub fn leaf(&self, items: impl Iterator<Item = Item<V>>, n: usize) -> Sub {
        let mut leaf = self.leaf_builder();
        for item in items.take(n) {
            leaf.push(item.first, item.last, item.value);
        }
        debug_assert_eq!(leaf.len, n);
        leaf.finish()
    }

    /// A new leaf, filled range by range.
    pub fn leaf_builder(&self) -> LeafBuilder<V> {
        LeafBuilder {
            leaf: self.arena.alloc(Self::LEAF).cast::<Leaf<V>>(),
            len: 0,
        }
    }

    /// [`leaf_builder`](Self::leaf_builder), allocating in `session`.
    pub fn leaf_builder_in(&self, session: &mut Session<'_>) -> LeafBuilder<V> {
        LeafBuilder {
            leaf: session.alloc(Self::LEAF).cast::<Leaf<V>>(),
            len: 0,
        }
    }

    /// A new branch over `subs` (1 to `BRANCH_SLOTS` children of one level,
    /// in order), with its span.
    pub fn branch(&self, level: u8, subs: &[Sub]) -> Sub {
        debug_assert!((1..=BRANCH_SLOTS).contains(&subs.len()));
        let node = self.arena.alloc(Self::BRANCH).cast::<Branch>();
        let mut branch = Branch {
            header: Header {
                level,
                len: subs.len() as u8,
            },
            lo: [u64::MAX; BRANCH_SLOTS + 1],
            hi: [u64::MAX; BRANCH_SLOTS],
            gap: [0; BRANCH_SLOTS],
            child: [None; BRANCH_SLOTS],
        };
        for (i, sub) in subs.iter().enumerate() {
            branch.set_record(i, sub.span);
            branch.child[i] = Some(sub.node);
        }
        let span = branch.span();
        // SAFETY: a fresh block of the branch's layout.
        unsafe { node.as_ptr().write(branch) };
        Sub {
            node: node.cast(),
            span,
        }
    }

    /// A copy of the subtree under `node`, in `session` (`__mt_dup`):
    /// each node copied whole, then its values cloned over the copies (a
    /// leaf) or its children replaced by theirs (a branch), so the spans
    /// recorded come along unchanged.
    ///
    /// # Safety
    /// `node` is a live node of a tree of `V`s that no write changes
    /// during the copy.
    pub unsafe fn copy_subtree_in(&self, session: &mut Session<'_>, node: NodePtr) -> NodePtr {
        // SAFETY: the caller's; the blocks are fresh, of each node's
        // layout; a bitwise copy of a node is a node but for its values
        // (each written over with a clone before the copy is used) and
        // its children (each replaced); children of a live branch are
        // live.
        unsafe {
            if header(node).level == 0 {
                let copy = session.alloc(Self::LEAF).cast::<Leaf<V>>().as_ptr();
                let leaf = as_leaf::<V>(node);
                std::ptr::copy_nonoverlapping(leaf, copy, 1);
                for k in 0..leaf.len() {
                    (&raw mut (*copy).slot[k].value).write(MaybeUninit::new(leaf.value(k).clone()));
                }
                return NonNull::new_unchecked(copy).cast();
            }
            let copy = session.alloc(Self::BRANCH).cast::<Branch>().as_ptr();
            let branch = as_branch(node);
            std::ptr::copy_nonoverlapping(branch, copy, 1);
            for i in 0..branch.len() {
                (*copy).child[i] = Some(self.copy_subtree_in(session, branch.child(i)));
            }
            NonNull::new_unchecked(copy).cast()
        }
    }

    /// A copy of `old` with child `i`'s record replaced by `sub`: a
    /// branch on the path of a write that changed one child in place.
    pub fn branch_with(&self, session: &mut Session<'_>, old: &Branch, i: usize, sub: Sub) -> Sub {
        debug_assert!(i < old.len());
        let node = session.alloc(Self::BRANCH).cast::<Branch>();
        // SAFETY: a fresh block of a branch's layout; `Branch` is plain
        // data, so a bitwise copy is a copy.
        unsafe {
            let branch = node.as_ptr();
            std::ptr::copy_nonoverlapping(old, branch, 1);
            (*branch).set_record(i, sub.span);
            (*branch).child[i] = Some(sub.node);
            Sub {
                node: node.cast(),
                span: (*branch).span(),
            }
        }
    }

    /// Retires one node (not its children): freed after a grace period,
    /// a leaf's values dropped first.
    ///
    /// # Safety
    /// `node` is a node of this tree that no reader pinning from now on
    /// can reach, retired once.
    pub unsafe fn retire(&self, node: NodePtr, guard: &Guard) {
        // SAFETY: live until the grace period ends.
        let leaf = unsafe { header(node) }.level == 0;
        if leaf && std::mem::needs_drop::<V>() {
            // SAFETY: the caller's: unreachable, freed once, after the
            // grace period and the read sections open at its end.
            let leaf = unsafe { FreeSubtree::<V>::new(Arc::clone(&self.arena), node) };
            guard.defer(move || read_section::free_after(leaf));
        } else {
            let size = if leaf { Self::LEAF } else { Self::BRANCH }.size();
            // SAFETY: the caller's.
            unsafe { self.arena.retire(node.as_ptr().cast(), size, guard) };
        }
    }

    /// [`retire`](Self::retire) in `session` (a leaf whose values need
    /// dropping still goes alone, through `guard`).
    ///
    /// # Safety
    /// As [`retire`](Self::retire), by the time `session` ends.
    pub unsafe fn retire_in(&self, session: &mut Session<'_>, node: NodePtr, guard: &Guard) {
        // SAFETY: live until the grace period ends.
        let leaf = unsafe { header(node) }.level == 0;
        if leaf && std::mem::needs_drop::<V>() {
            // SAFETY: the caller's.
            return unsafe { self.retire(node, guard) };
        }
        let size = if leaf { Self::LEAF } else { Self::BRANCH }.size();
        // SAFETY: the caller's.
        unsafe { session.retire(node.as_ptr().cast(), size) };
    }

    /// Retires a node and everything below it. A subtree of more than a
    /// leaf is walked and freed on the reaper thread after the grace
    /// period and the read sections open at its end ([`MapleTree::get`]'s),
    /// so the writer never pays for a big one.
    ///
    /// # Safety
    /// As [`retire`](Self::retire), for the whole subtree.
    ///
    /// [`MapleTree::get`]: super::MapleTree::get
    pub unsafe fn retire_subtree(&self, node: NodePtr, guard: &Guard) {
        // SAFETY: live until the grace period ends.
        if unsafe { header(node) }.level == 0 {
            // SAFETY: the caller's.
            return unsafe { self.retire(node, guard) };
        }
        // SAFETY: the caller's: unreachable, freed once, after both waits.
        let subtree = unsafe { FreeSubtree::<V>::new(Arc::clone(&self.arena), node) };
        guard.defer(move || read_section::free_after_in_background(subtree));
    }
}

/// A leaf under construction in a fresh block: ranges pushed in order,
/// then [`finish`](LeafBuilder::finish) sets the rest and gives its span.
/// (Dropping one unfinished leaks the block and the values pushed: only
/// a panic does that.)
pub struct LeafBuilder<V> {
    leaf: NonNull<Leaf<V>>,
    len: usize,
}

impl<V> LeafBuilder<V> {
    /// Appends the range `first..=last` (above the last pushed).
    #[inline(always)]
    pub fn push(&mut self, first: u64, last: u64, value: V) {
        assert!(self.len < LEAF_SLOTS, "a leaf holds {LEAF_SLOTS} ranges");
        let k = self.len;
        // SAFETY: slot `k` of our unpublished block, in bounds.
        unsafe {
            let leaf = self.leaf.as_ptr();
            (&raw mut (*leaf).first[k]).write(first);
            (&raw mut (*leaf).slot[k]).write(Slot {
                last,
                value: MaybeUninit::new(value),
            });
        }
        self.len += 1;
    }

    /// Pushes copies of `old`'s ranges `from`.
    #[inline(always)]
    pub fn extend_from(&mut self, old: &Leaf<V>, from: std::ops::Range<usize>)
    where
        V: Clone,
    {
        for k in from {
            self.push(old.first[k], old.last(k), old.value(k).clone());
        }
    }

    /// The finished leaf (at least one range pushed) and its span.
    pub fn finish(self) -> Sub {
        debug_assert!(self.len > 0);
        // SAFETY: our unpublished block; every field is written before
        // the node is returned (the values past `len` stay uninitialised,
        // which `MaybeUninit` allows), and no reference reaches a field
        // still uninitialised.
        unsafe {
            let leaf = self.leaf.as_ptr();
            for k in self.len..LEAF_SLOTS {
                (&raw mut (*leaf).first[k]).write(u64::MAX);
                (&raw mut (*leaf).slot[k].last).write(u64::MAX);
            }
            (&raw mut (*leaf).header).write(Header {
                level: 0,
                len: self.len as u8,
            });
            Sub {
                node: self.leaf.cast(),
                span: (*leaf).span(),
            }
        }
    }
}

/// A subtree no reader can reach, freed whole when dropped.
pub struct FreeSubtree<V> {
    pub arena: Arc<Arena>,
    root: SendPtr,
    _values: std::marker::PhantomData<fn(V) -> V>,
}

impl<V> FreeSubtree<V> {
    /// # Safety
    /// Nobody reads the subtree under `root` any more, and nothing else
    /// frees it.
    pub unsafe fn new(arena: Arc<Arena>, root: NodePtr) -> Self {
        FreeSubtree {
            arena,
            root: SendPtr(root),
            _values: std::marker::PhantomData,
        }
    }
}

impl<V> Drop for FreeSubtree<V> {
    fn drop(&mut self) {
        let mut stack = vec![self.root.0];
        while let Some(node) = stack.pop() {
            // SAFETY: the subtree is ours alone (`new`'s contract).
            unsafe {
                if header(node).level > 0 {
                    let branch = as_branch(node);
                    stack.extend((0..branch.len()).map(|i| branch.child(i)));
                }
                free_node::<V>(&self.arena, node);
            }
        }
    }
}

/// Drops a leaf's values, then gives the node's block back.
///
/// # Safety
/// Nobody can read the node any more, and it is freed once.
unsafe fn free_node<V>(arena: &Arena, node: NodePtr) {
    // SAFETY: the caller's.
    unsafe {
        let size = if header(node).level == 0 {
            let leaf = node.cast::<Leaf<V>>().as_ptr();
            for k in 0..(*leaf).len() {
                (*leaf).slot[k].value.assume_init_drop();
            }
            whole_lines(Layout::new::<Leaf<V>>()).size()
        } else {
            whole_lines(Layout::new::<Branch>()).size()
        };
        arena.release(node.as_ptr().cast(), size);
    }
}
