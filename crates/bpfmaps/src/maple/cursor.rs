//! A cursor over the tree (the kernel's `ma_state`) and the iterators
//! built on it: it keeps its path from the root, so stepping to the next
//! or previous range, or seeking an index near the last one, climbs only
//! as far as it must instead of starting again from the root.
//!
//! A seek from the root goes straight down, as [`MapleTree::load`] does,
//! and records only the root it started from: many walks (`mas_walk`)
//! never leave their leaf, and one that records nothing its caller does
//! not read compiles to `load`'s loads (docs/benchmarks.md, "the
//! search's clamp"). The path is built from that root, the same version
//! of the tree, when a step first leaves the leaf.

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use smallvec::SmallVec;

use super::node::{NodePtr, as_branch, as_leaf, count_le, header};
use super::tree::{Entry, MapleTree, entry_at};
use crate::core::reclaim::Guard;

/// One branch on the cursor's path: the child taken, and the indices the
/// branch routes to it.
#[derive(Clone, Copy)]
struct Step {
    branch: NodePtr,
    child: usize,
    min: u64,
    max: u64,
}

/// A position among the tree's ranges, valid for the guard's lifetime: on
/// a range, before the first or after the last. It reads the tree as it
/// was when it last moved up to the root; a cursor kept across writes
/// goes on reading the nodes it is on, which the guard keeps alive.
///
/// ```
/// use bpfmaps::maple::MapleTree;
///
/// let tree = MapleTree::new();
/// for i in 0..100u64 {
///     tree.store_range(i * 10, i * 10 + 4, i).unwrap();
/// }
/// let guard = bpfmaps::pin();
/// let mut cursor = tree.cursor(&guard);
/// cursor.seek_at_or_after(503);
/// assert_eq!(cursor.entry().map(|e| *e.value), Some(50));
/// assert_eq!(cursor.next().map(|e| e.first), Some(510));
/// assert_eq!(cursor.prev().map(|e| e.first), Some(500));
/// assert_eq!(cursor.prev().map(|e| e.first), Some(490));
/// ```
pub struct Cursor<'g, V: Clone + Send + Sync + 'static> {
    tree: &'g MapleTree<V>,
    guard: &'g Guard,
    /// The branches from the root to the leaf, when recorded.
    path: SmallVec<[Step; 8]>,
    /// The root the leaf was reached from while `path` is not recorded
    /// (after a seek straight down from the root).
    unrecorded_root: Option<NodePtr>,
    /// The leaf the cursor is in (`None`: not placed yet, or empty tree).
    leaf: Option<NodePtr>,
    /// Its slot in the leaf: -1 before the first range, `len` after the
    /// last (only at the tree's ends).
    slot: isize,
    /// After a `load` that missed: the cursor stands in the free run
    /// after `slot`, on no range (as `mas_walk` leaves the kernel's state
    /// on a gap's empty entry), so `prev` returns `slot`'s range.
    in_gap: bool,
    /// The indices the leaf is routed (as `Step`); while the path is not
    /// recorded, those of its own ranges (which surely route to it).
    leaf_min: u64,
    leaf_max: u64,
    _values: PhantomData<&'g V>,
}

impl<V: Clone + Send + Sync + 'static> MapleTree<V> {
    /// A cursor on this tree, not placed yet (`entry` is `None` until a
    /// seek).
    pub fn cursor<'g>(&'g self, guard: &'g Guard) -> Cursor<'g, V> {
        Cursor {
            tree: self,
            guard,
            path: SmallVec::new(),
            unrecorded_root: None,
            leaf: None,
            slot: -1,
            in_gap: false,
            leaf_min: 0,
            leaf_max: u64::MAX,
            _values: PhantomData,
        }
    }

    /// Every range in order, first to last (`mt_for_each`); `rev()` walks
    /// them backwards.
    pub fn iter<'g>(&'g self, guard: &'g Guard) -> Iter<'g, V> {
        self.range(.., guard)
    }

    /// The ranges holding an index in `window`, in order (`mas_for_each`
    /// with a maximum); `rev()` walks them backwards (`mas_prev`).
    pub fn range<'g>(&'g self, window: impl RangeBounds<u64>, guard: &'g Guard) -> Iter<'g, V> {
        let lo = match window.start_bound() {
            Bound::Included(&lo) => Some(lo),
            Bound::Excluded(&lo) => lo.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let hi = match window.end_bound() {
            Bound::Included(&hi) => Some(hi),
            Bound::Excluded(&hi) => hi.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        let (lo, hi, done) = match (lo, hi) {
            (Some(lo), Some(hi)) if lo <= hi => (lo, hi, false),
            _ => (1, 0, true),
        };
        Iter {
            front: self.cursor(guard),
            back: self.cursor(guard),
            lo,
            hi,
            front_seen: None,
            back_seen: None,
            done,
        }
    }
}

impl<'g, V: Clone + Send + Sync + 'static> Cursor<'g, V> {
    /// The range the cursor is on (`None` in a free run).
    #[inline]
    pub fn entry(&self) -> Option<Entry<'g, V>> {
        if self.in_gap {
            return None;
        }
        let leaf = self.leaf?;
        // SAFETY: the cursor's nodes live while its guard is pinned.
        let leaf = unsafe { as_leaf::<V>(leaf) };
        let k = usize::try_from(self.slot)
            .ok()
            .filter(|&k| k < leaf.len())?;
        Some(Entry {
            first: leaf.first[k],
            last: leaf.last(k),
            value: leaf.value(k),
        })
    }

    /// The leaf and slot of the range the cursor is on, for a caller
    /// that owns the tree `&mut` and edits the value in place.
    pub(super) fn position(&self) -> Option<(NodePtr, usize)> {
        let leaf = self.leaf?;
        // SAFETY: the cursor's nodes live while its guard is pinned.
        let len = unsafe { header(leaf) }.len as usize;
        let k = usize::try_from(self.slot).ok().filter(|&k| k < len)?;
        Some((leaf, k))
    }

    /// Climbs the path until the node routed `index`'s way is in it, then
    /// descends to `index`'s leaf. From the root (straight down) if the
    /// cursor is not placed or no branch on its path holds `index`.
    fn descend_to(&mut self, index: u64) -> Option<usize> {
        let mut node = if self.leaf.is_some() && (self.leaf_min..=self.leaf_max).contains(&index) {
            self.leaf?
        } else {
            while self
                .path
                .last()
                .is_some_and(|s| !(s.min..=s.max).contains(&index))
            {
                self.path.pop();
            }
            match self.path.last() {
                Some(s) => {
                    (self.leaf_min, self.leaf_max) = (s.min, s.max);
                    // SAFETY: the cursor's nodes are live.
                    unsafe { as_branch(s.branch) }.child(s.child)
                }
                None => return self.descend_from_root(index),
            }
        };
        // SAFETY: nodes reached from the root live while the guard is
        // pinned.
        unsafe {
            node = self.descend_recording(node, index);
            self.leaf = Some(node);
            let leaf = as_leaf::<V>(node);
            Some(count_le(&leaf.first, leaf.len(), index))
        }
    }

    /// From `node`, whose indices are `self.leaf_min..=self.leaf_max`,
    /// down to the leaf `index` routes to, each branch passed pushed on
    /// the path.
    ///
    /// # Safety
    /// `node` is live while the guard is pinned.
    unsafe fn descend_recording(&mut self, mut node: NodePtr, index: u64) -> NodePtr {
        // SAFETY: the caller's; children of live branches are live.
        unsafe {
            while header(node).level > 0 {
                let branch = as_branch(node);
                let i = branch.route(index);
                let step = self.step(node, i);
                self.path.push(step);
                (self.leaf_min, self.leaf_max) = (step.min, step.max);
                node = branch.child(i);
            }
        }
        node
    }

    /// A seek from the root, straight down to `index`'s leaf without
    /// recording the path (see the module's doc); the leaf's bounds are
    /// its own ranges' until the path is recorded.
    #[inline(always)]
    fn descend_from_root(&mut self, index: u64) -> Option<usize> {
        self.path.clear();
        let root = self.tree.root(self.guard)?;
        // SAFETY: nodes reached from the root live while the guard is
        // pinned.
        unsafe {
            let node = self.tree.leaf_below(root, index);
            self.unrecorded_root = Some(root);
            self.leaf = Some(node);
            let leaf = as_leaf::<V>(node);
            let len = leaf.len();
            (self.leaf_min, self.leaf_max) = match len {
                0 => (1, 0), // an empty root: no index is surely here
                _ => (leaf.first[0], leaf.last(len - 1)),
            };
            Some(count_le(&leaf.first, len, index))
        }
    }

    /// Records the path from the root the cursor's leaf was reached from
    /// down to that leaf, if it is not recorded: its first index routes
    /// there, in that version of the tree, which the guard keeps alive.
    fn record_path(&mut self) {
        let (Some(root), Some(leaf)) = (self.unrecorded_root.take(), self.leaf) else {
            return;
        };
        (self.leaf_min, self.leaf_max) = (0, u64::MAX);
        // SAFETY: the cursor's nodes are live. (An empty leaf is a root,
        // so its padding key routes nowhere.)
        unsafe {
            let first = as_leaf::<V>(leaf).first[0];
            let node = self.descend_recording(root, first);
            debug_assert_eq!(node, leaf, "the leaf's first index routes to it");
        }
    }

    /// The step into child `i` of `branch`, whose own indices are
    /// `self.leaf_min..=self.leaf_max` (the bounds of the node above).
    fn step(&self, branch: NodePtr, i: usize) -> Step {
        // SAFETY: a live branch.
        let b = unsafe { as_branch(branch) };
        Step {
            branch,
            child: i,
            min: if i == 0 { self.leaf_min } else { b.lo[i] },
            max: if i + 1 == b.len() {
                self.leaf_max
            } else {
                b.lo[i + 1] - 1
            },
        }
    }

    /// Places the cursor on the range holding `index` and returns it
    /// (`mas_walk`); on a miss, it is left in the free run `index` is in:
    /// `next` returns the range after it and `prev` the one before.
    #[inline(always)]
    pub fn load(&mut self, index: u64) -> Option<Entry<'g, V>> {
        self.in_gap = false;
        let k = match self.leaf {
            // A fresh cursor: no path to climb (the walk inlined).
            None => self.descend_from_root(index)?,
            Some(_) => self.descend_to(index)?,
        };
        self.slot = k as isize - 1;
        // From the leaf in hand, not `entry()`: re-reading the cursor's
        // fields makes the walk wait on their stores (a nanosecond of 11).
        // SAFETY: the cursor's nodes live while its guard is pinned.
        let leaf = unsafe { as_leaf::<V>(self.leaf?) };
        let hit = (k > 0 && leaf.last(k - 1) >= index).then(|| entry_at(leaf, k - 1));
        self.in_gap = hit.is_none();
        hit
    }

    /// Places the cursor on the first range that holds `index` or comes
    /// after it, and returns it (after the last range: `None`).
    pub fn seek_at_or_after(&mut self, index: u64) -> Option<Entry<'g, V>> {
        self.in_gap = false;
        let k = self.descend_to(index)?;
        self.slot = k as isize - 1;
        match self.entry() {
            Some(e) if e.last >= index => Some(e),
            _ => self.next(),
        }
    }

    /// Places the cursor on the last range that holds `index` or comes
    /// before it, and returns it (before the first range: `None`).
    pub fn seek_at_or_before(&mut self, index: u64) -> Option<Entry<'g, V>> {
        self.in_gap = false;
        let k = self.descend_to(index)?;
        self.slot = k as isize;
        self.prev()
    }

    /// Moves to the next range and returns it (`mas_next`); after the last
    /// one the cursor stays past the end and returns `None`. (Not
    /// `Iterator::next`: a cursor moves both ways; [`Iter`] is the
    /// iterator.)
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Entry<'g, V>> {
        self.in_gap = false;
        let leaf = self.leaf?;
        // SAFETY: the cursor's nodes are live.
        let len = unsafe { header(leaf) }.len as isize;
        if self.slot + 1 < len {
            self.slot += 1;
            return self.entry();
        }
        if self.sibling_leaf(true) {
            self.slot = 0;
        } else {
            self.slot = len;
        }
        self.entry()
    }

    /// Moves to the previous range and returns it (`mas_prev`); before the
    /// first one the cursor stays before it and returns `None`.
    pub fn prev(&mut self) -> Option<Entry<'g, V>> {
        self.leaf?;
        if std::mem::take(&mut self.in_gap) {
            return self.entry(); // the range before the free run
        }
        if self.slot > 0 {
            self.slot -= 1;
            return self.entry();
        }
        if self.sibling_leaf(false) {
            // SAFETY: the cursor's nodes are live.
            self.slot = unsafe { header(self.leaf?) }.len as isize - 1;
        } else {
            self.slot = -1;
        }
        self.entry()
    }

    /// Moves to the leaf after (or before) this one: up to the lowest
    /// branch with a child on that side, then down its edge. False, and
    /// the cursor unmoved, at the tree's end.
    fn sibling_leaf(&mut self, forward: bool) -> bool {
        self.record_path();
        let Some(depth) = self.path.iter().rposition(|s| {
            // SAFETY: the cursor's nodes are live.
            let len = unsafe { as_branch(s.branch) }.len();
            if forward {
                s.child + 1 < len
            } else {
                s.child > 0
            }
        }) else {
            return false;
        };
        self.path.truncate(depth + 1);
        let mut step = self.path.pop().expect("the path reaches depth");
        // The bounds of the branch itself: those of the step above, or
        // the whole space at the root.
        (self.leaf_min, self.leaf_max) = self.path.last().map_or((0, u64::MAX), |s| (s.min, s.max));
        let i = if forward {
            step.child + 1
        } else {
            step.child - 1
        };
        step = self.step(step.branch, i);
        self.path.push(step);
        (self.leaf_min, self.leaf_max) = (step.min, step.max);
        // SAFETY: children of live branches are live.
        unsafe {
            let mut node = as_branch(step.branch).child(i);
            while header(node).level > 0 {
                let branch = as_branch(node);
                let i = if forward { 0 } else { branch.len() - 1 };
                let step = self.step(node, i);
                self.path.push(step);
                (self.leaf_min, self.leaf_max) = (step.min, step.max);
                node = branch.child(i);
            }
            self.leaf = Some(node);
        }
        true
    }
}

/// The ranges holding an index in a window, in order, from either end
/// (`MapleTree::iter`, `MapleTree::range`).
pub struct Iter<'g, V: Clone + Send + Sync + 'static> {
    front: Cursor<'g, V>,
    back: Cursor<'g, V>,
    lo: u64,
    hi: u64,
    /// The first index of the last range each end yielded: the ends stop
    /// where they meet.
    front_seen: Option<u64>,
    back_seen: Option<u64>,
    done: bool,
}

impl<'g, V: Clone + Send + Sync + 'static> Iterator for Iter<'g, V> {
    type Item = Entry<'g, V>;

    fn next(&mut self) -> Option<Entry<'g, V>> {
        if self.done {
            return None;
        }
        let e = match self.front_seen {
            None => self.front.seek_at_or_after(self.lo),
            Some(_) => self.front.next(),
        };
        match e {
            Some(e) if e.first <= self.hi && self.back_seen.is_none_or(|b| e.first < b) => {
                self.front_seen = Some(e.first);
                Some(e)
            }
            _ => {
                self.done = true;
                None
            }
        }
    }
}

impl<'g, V: Clone + Send + Sync + 'static> DoubleEndedIterator for Iter<'g, V> {
    fn next_back(&mut self) -> Option<Entry<'g, V>> {
        if self.done {
            return None;
        }
        let e = match self.back_seen {
            None => self.back.seek_at_or_before(self.hi),
            Some(_) => self.back.prev(),
        };
        match e {
            Some(e) if e.last >= self.lo && self.front_seen.is_none_or(|f| e.first > f) => {
                self.back_seen = Some(e.first);
                Some(e)
            }
            _ => {
                self.done = true;
                None
            }
        }
    }
}

impl<V: Clone + Send + Sync + 'static> std::iter::FusedIterator for Iter<'_, V> {}
