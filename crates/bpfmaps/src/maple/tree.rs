//! [`MapleTree`]: loads, stores and erases, gap search and allocation.
//!
//! A write holds the writer lock, rebuilds the nodes its range touches
//! (one leaf and its path for most writes; for a store that spans many
//! leaves, the two edge leaves, with the subtrees between them retired
//! whole), and publishes a new root with one atomic store. A reader that
//! loaded the old root finishes on the old nodes, which stay alive until
//! its guard goes: it sees each range as before the write or as after,
//! never a mix.

use std::ops::RangeInclusive;
use std::ptr::{NonNull, null_mut};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::node::{
    BRANCH_SLOTS, Branch, Header, Item, LEAF_SLOTS, Leaf, MIN_FILL, NodePtr, Nodes, Sub, as_branch,
    as_leaf, count_le, descend, descend_from, header,
};
use crate::core::error::{Error, Result};
use crate::core::prefetch::prefetch;
use crate::core::read_section;
use crate::core::reclaim::{Guard, pin};

/// A range tree: non-overlapping inclusive ranges of `u64` indices, each
/// holding a value, with lock-free readers and one writer at a time (the
/// kernel's maple tree, `lib/maple_tree.c`, in userspace).
///
/// ```
/// use bpfmaps::maple::MapleTree;
///
/// let tree = MapleTree::new();
/// tree.store_range(0x1000, 0x1fff, "text").unwrap();
/// tree.store_range(0x4000, 0x4fff, "heap").unwrap();
/// let guard = bpfmaps::pin();
/// let hit = tree.load(0x1234, &guard).unwrap();
/// assert_eq!((hit.first, hit.last, *hit.value), (0x1000, 0x1fff, "text"));
/// assert!(tree.load(0x2000, &guard).is_none());
/// // The lowest free run of 0x1000 indices at or above 0x1000:
/// assert_eq!(tree.empty_area(0x1000, u64::MAX, 0x1000, &guard), Ok(0x2000));
/// ```
pub struct MapleTree<V: Clone + Send + Sync + 'static> {
    /// The root node; null when the tree is empty.
    pub(super) root: AtomicPtr<Header>,
    pub(super) len: AtomicUsize,
    /// Whether loads ask for nodes' lines ahead: the nodes have outgrown
    /// [`PREFETCH_FROM`] (set by writes; a hint, so a stale one is only
    /// slower).
    far: AtomicBool,
    writer: Mutex<()>,
    pub(super) nodes: Nodes<V>,
}

// SAFETY: the nodes hold `V`s that readers on any thread borrow (`Sync`)
// and that are dropped on whichever thread frees their node (`Send`);
// writers are serialised by the lock.
unsafe impl<V: Clone + Send + Sync + 'static> Send for MapleTree<V> {}
// SAFETY: as above.
unsafe impl<V: Clone + Send + Sync + 'static> Sync for MapleTree<V> {}

/// A stored range and its value, borrowed for the guard's lifetime.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<'g, V> {
    /// First index of the range.
    pub first: u64,
    /// Last index of the range (inclusive).
    pub last: u64,
    /// Its value.
    pub value: &'g V,
}

impl<V> Clone for Entry<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for Entry<'_, V> {}

impl<V> Entry<'_, V> {
    /// The range, as `first..=last`.
    pub fn range(&self) -> RangeInclusive<u64> {
        self.first..=self.last
    }
}

impl<V: Clone + Send + Sync + 'static> Default for MapleTree<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// Checks `first <= last`.
pub(super) fn check_range(first: u64, last: u64) -> Result<()> {
    if first <= last {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "range {first:#x}..={last:#x}: first is above last"
        )))
    }
}

/// Checks a gap search's window and size, as `mas_empty_area` does.
fn check_window(min: u64, max: u64, size: u64) -> Result<()> {
    if min > max {
        return Err(Error::invalid(format!(
            "window {min:#x}..={max:#x}: min is above max"
        )));
    }
    if size == 0 {
        return Err(Error::invalid("a free area of size 0"));
    }
    if max - min < size - 1 {
        return Err(Error::invalid(format!(
            "a free area of {size:#x} indices cannot fit in {min:#x}..={max:#x}"
        )));
    }
    Ok(())
}

impl<V: Clone + Send + Sync + 'static> MapleTree<V> {
    /// An empty tree.
    pub fn new() -> Self {
        MapleTree {
            root: AtomicPtr::new(null_mut()),
            len: AtomicUsize::new(0),
            far: AtomicBool::new(false),
            writer: Mutex::new(()),
            nodes: Nodes::new(),
        }
    }

    /// Number of ranges stored.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no range is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the tree holds: its node arena (slack included).
    pub fn memory_usage(&self) -> usize {
        std::mem::size_of::<Self>() + self.nodes.arena.bytes()
    }

    /// The root, for readers (`None`: empty).
    #[inline(always)]
    pub(super) fn root(&self, _guard: &Guard) -> Option<NodePtr> {
        NonNull::new(self.root.load(Ordering::Acquire))
    }

    /// The range holding `index` and its value (`mtree_load`).
    #[inline]
    pub fn load<'g>(&'g self, index: u64, _guard: &'g Guard) -> Option<Entry<'g, V>> {
        // SAFETY: nodes reached from the root stay alive while `guard` is
        // pinned.
        unsafe { self.load_in(index) }
    }

    /// The range holding `index` and a clone of its value, without a
    /// guard (`mtree_load`, which takes the RCU read lock itself).
    ///
    /// The read runs in a read section (`core::read_section`): one plain
    /// store in and one out, where a pin is a locked instruction that
    /// keeps one lookup's cache misses from overlapping the next's. The
    /// tree frees a node only after the sections open when its epoch
    /// grace period ended have closed, so the node read here outlives the
    /// read. The value is cloned inside the section: a clone that blocks
    /// holds back the freeing of retired nodes (never a writer).
    ///
    /// ```
    /// use bpfmaps::maple::MapleTree;
    ///
    /// let tree = MapleTree::new();
    /// tree.store_range(10, 19, 7u64).unwrap();
    /// assert_eq!(tree.get(15), Some((10..=19, 7)));
    /// assert_eq!(tree.get(20), None);
    /// ```
    // Inlined into its caller (its descent is already inlined into it):
    // a call returned the range and value through memory and saved and
    // restored four registers: 1.1-1.6 ns of the kernel's `load`
    // shape's 8.4-8.8 (docs/benchmarks.md, "`get` inlined").
    #[inline(always)]
    pub fn get(&self, index: u64) -> Option<(RangeInclusive<u64>, V)> {
        let _section = read_section::enter();
        // SAFETY: a node reachable now is freed only after this read
        // section closes (`Nodes` frees after the read sections).
        unsafe { self.load_in(index) }.map(|e| (e.range(), e.value.clone()))
    }

    /// [`load`](Self::load), for a caller that keeps the nodes alive for
    /// `'a` by other means.
    ///
    /// # Safety
    /// No node reachable now is freed during `'a`: a guard pinned for
    /// `'a`, a read section open for it, or the tree borrowed `&mut` for
    /// it (no write can run).
    #[inline(always)]
    pub(super) unsafe fn load_in<'a>(&'a self, index: u64) -> Option<Entry<'a, V>> {
        // SAFETY: the caller's.
        unsafe {
            let leaf = as_leaf::<V>(self.leaf_of(index)?);
            leaf.find(index).map(|k| entry_at(leaf, k))
        }
    }

    /// The leaf `index` routes to (`None`: the tree is empty), each node's
    /// later lines asked for as the descent reaches it.
    ///
    /// # Safety
    /// As [`load_in`](Self::load_in), for the nodes of the descent.
    #[inline(always)]
    pub(super) unsafe fn leaf_of(&self, index: u64) -> Option<NodePtr> {
        let root = NonNull::new(self.root.load(Ordering::Acquire))?;
        // SAFETY: the caller's.
        Some(unsafe { self.leaf_below(root, index) })
    }

    /// The leaf `index` routes to under `root`.
    ///
    /// # Safety
    /// As [`leaf_of`](Self::leaf_of), for the nodes under `root`.
    #[inline(always)]
    pub(super) unsafe fn leaf_below(&self, root: NodePtr, index: u64) -> NodePtr {
        // A small tree's nodes are in cache: asking for their lines only
        // costs instructions (docs/benchmarks.md, "Prefetching by size").
        let far = self.far.load(Ordering::Relaxed);
        let step = |branch: &Branch, i: usize| {
            let child = branch.child(i);
            if far {
                prefetch_lookup::<V>(child, branch.header.level == 1);
            }
            Some(child)
        };
        // SAFETY: the caller's; nodes never change once published (but
        // under `&mut`, when nobody reads them).
        unsafe { descend(root, index, step) }.expect("every index routes to a leaf")
    }

    /// The first range that holds an index in `from..=max`, if any
    /// (`mt_find`; none when `from > max`, as there).
    ///
    /// One descent, never a step back: each branch records the last index
    /// its children hold, so the child to take is the first that ends at
    /// or after `from`, found by one search of those last indices (and
    /// in the leaf, of its ranges' last indices).
    #[inline]
    pub fn find<'g>(&'g self, from: u64, max: u64, _guard: &'g Guard) -> Option<Entry<'g, V>> {
        // SAFETY: nodes reached from the root stay alive while `guard` is
        // pinned.
        unsafe { self.find_in(from, max) }
    }

    /// [`find`](Self::find) without a guard, as [`get`](Self::get) is
    /// [`load`](Self::load) without one: the range and a clone of its
    /// value, read in a read section (`mt_find`, which takes the RCU read
    /// lock itself).
    ///
    /// ```
    /// use bpfmaps::maple::MapleTree;
    ///
    /// let tree = MapleTree::new();
    /// tree.store_range(10, 19, 7u64).unwrap();
    /// assert_eq!(tree.find_cloned(0, 100), Some((10..=19, 7)));
    /// assert_eq!(tree.find_cloned(20, 100), None);
    /// ```
    #[inline]
    pub fn find_cloned(&self, from: u64, max: u64) -> Option<(RangeInclusive<u64>, V)> {
        let _section = read_section::enter();
        // SAFETY: as in `get`.
        unsafe { self.find_in(from, max) }.map(|e| (e.range(), e.value.clone()))
    }

    /// [`find`](Self::find), for a caller that keeps the nodes alive for
    /// `'a` by other means.
    ///
    /// # Safety
    /// As [`load_in`](Self::load_in).
    #[inline(always)]
    unsafe fn find_in<'a>(&'a self, from: u64, max: u64) -> Option<Entry<'a, V>> {
        if from > max {
            return None;
        }
        let root = NonNull::new(self.root.load(Ordering::Acquire))?;
        // SAFETY: the caller's.
        unsafe {
            let leaf = as_leaf::<V>(descend_from(root, from)?);
            let (k, last) = leaf.at_or_after(from);
            (k < leaf.len() && leaf.first[k] <= max).then(|| Entry {
                first: leaf.first[k],
                last,
                value: leaf.value(k),
            })
        }
    }

    /// The last range that holds an index in `min..=from`, if any
    /// (`mt_find` backwards, as `mas_find_rev`; none when `min > from`):
    /// one descent, as [`find`](Self::find).
    #[inline]
    pub fn find_rev<'g>(&'g self, from: u64, min: u64, _guard: &'g Guard) -> Option<Entry<'g, V>> {
        if min > from {
            return None;
        }
        let root = NonNull::new(self.root.load(Ordering::Acquire))?;
        // Only at the root can every child start above `from`.
        let step = |branch: &Branch, i: usize| (branch.lo[i] <= from).then(|| branch.child(i));
        // SAFETY: nodes reached from the root stay alive while `guard` is
        // pinned.
        unsafe {
            let leaf = as_leaf::<V>(descend(root, from, step)?);
            let k = count_le(&leaf.first, leaf.len(), from).checked_sub(1)?;
            (leaf.last(k) >= min).then(|| entry_at(leaf, k))
        }
    }

    /// Stores `value` over `first..=last` (`mtree_store_range`): whatever
    /// the range covered is overwritten, and a range reaching past either
    /// end keeps its part outside. `EINVAL` if `first > last`.
    pub fn store_range(&self, first: u64, last: u64, value: V) -> Result<()> {
        check_range(first, last)?;
        let _writer = self.writer.lock();
        self.write(first, last, Some(value), &pin());
        Ok(())
    }

    /// Stores `value` at one index (`mtree_store`).
    pub fn store(&self, index: u64, value: V) -> Result<()> {
        self.store_range(index, index, value)
    }

    /// Stores `value` over `first..=last` if no index of it is taken
    /// (`mtree_insert_range`): `EEXIST` if one is, `EINVAL` if
    /// `first > last`.
    pub fn insert_range(&self, first: u64, last: u64, value: V) -> Result<()> {
        check_range(first, last)?;
        let _writer = self.writer.lock();
        let guard = pin();
        if self.find(first, last, &guard).is_some() {
            return Err(Error::Exists);
        }
        self.write(first, last, Some(value), &guard);
        Ok(())
    }

    /// Stores `value` at one index if it is free (`mtree_insert`).
    pub fn insert(&self, index: u64, value: V) -> Result<()> {
        self.insert_range(index, index, value)
    }

    /// Removes the whole range holding `index` and returns it with its
    /// value (`mtree_erase`).
    pub fn erase(&self, index: u64) -> Option<(RangeInclusive<u64>, V)> {
        let _writer = self.writer.lock();
        let guard = pin();
        let hit = self.load(index, &guard)?;
        let removed = (hit.range(), hit.value.clone());
        self.write(hit.first, hit.last, None, &guard);
        Some(removed)
    }

    /// Frees `first..=last` (`mtree_store_range` of `NULL`): ranges inside
    /// are removed, and one reaching past either end keeps its part
    /// outside. Returns whether anything was stored there; `EINVAL` if
    /// `first > last`.
    pub fn erase_range(&self, first: u64, last: u64) -> Result<bool> {
        check_range(first, last)?;
        let _writer = self.writer.lock();
        let guard = pin();
        if self.find(first, last, &guard).is_none() {
            return Ok(false);
        }
        self.write(first, last, None, &guard);
        Ok(true)
    }

    /// Keeps [`far`](Self::far) in step with the nodes' memory, after a
    /// write.
    #[inline]
    fn note_size(&self) {
        self.far
            .store(self.nodes.arena.bytes() >= PREFETCH_FROM, Ordering::Relaxed);
    }

    /// Removes every range (`mtree_destroy`, but the tree stays usable).
    /// The nodes are freed after a grace period on the reaper thread.
    pub fn clear(&self) {
        let _writer = self.writer.lock();
        let old = self.root.swap(null_mut(), Ordering::AcqRel);
        self.len.store(0, Ordering::Relaxed);
        if let Some(old) = NonNull::new(old) {
            // SAFETY: unlinked above; the writer lock makes this the only
            // retirement of it.
            unsafe { self.nodes.retire_subtree(old, &pin()) };
        }
    }

    /// Stores `value` over `first..=last` if `check`, run under the
    /// writer lock, allows it (the byte contract's flags and limit).
    pub(super) fn store_checked(
        &self,
        first: u64,
        last: u64,
        value: V,
        check: impl FnOnce(&Self, &Guard) -> Result<()>,
    ) -> Result<()> {
        check_range(first, last)?;
        let _writer = self.writer.lock();
        let guard = pin();
        check(self, &guard)?;
        self.write(first, last, Some(value), &guard);
        Ok(())
    }

    /// Removes the range `first..=last` if exactly it is stored, and
    /// returns its value; `ENOENT` otherwise.
    pub(super) fn erase_exact(&self, first: u64, last: u64) -> Result<V> {
        let _writer = self.writer.lock();
        let guard = pin();
        let value = match self.load(first, &guard) {
            Some(e) if (e.first, e.last) == (first, last) => e.value.clone(),
            _ => return Err(Error::NotFound),
        };
        self.write(first, last, None, &guard);
        Ok(value)
    }

    /// The ranges `store_range(first, last, _)` would add (the new one, and
    /// the pieces of ranges it cuts), less those it would cover: how the
    /// count changes. For the byte contract's `max_entries` check.
    pub(super) fn store_delta<'g>(&'g self, first: u64, last: u64, guard: &'g Guard) -> isize {
        let mut delta = 1isize;
        let mut cursor = self.cursor(guard);
        let mut hit = cursor.seek_at_or_after(first);
        while let Some(e) = hit.filter(|e| e.first <= last) {
            delta -= 1;
            delta += (e.first < first) as isize + (e.last > last) as isize;
            hit = cursor.next();
        }
        delta
    }

    /// The lowest index `start >= min` such that `start..start + size` is
    /// free and ends at or below `max` (`mas_empty_area`): `EBUSY` if
    /// there is none, `EINVAL` for a bad window. Visits O(log n) nodes:
    /// the branches record each child's largest free run.
    pub fn empty_area(&self, min: u64, max: u64, size: u64, guard: &Guard) -> Result<u64> {
        check_window(min, max, size)?;
        let mut search = GapSearch {
            min,
            max,
            size,
            prev: None,
        };
        if let Some(root) = self.root(guard) {
            // SAFETY: nodes stay alive while `guard` is pinned.
            if let Some(found) = unsafe { search.lowest::<V>(root) } {
                return found.ok_or(Error::Busy);
            }
        }
        search.run_to(u64::MAX).ok_or(Error::Busy)
    }

    /// The highest `start` such that `start..start + size` is free, starts
    /// at or above `min` and ends at or below `max`
    /// (`mas_empty_area_rev`, which places the area at the top of the
    /// highest free run): `EBUSY` if there is none.
    pub fn empty_area_rev(&self, min: u64, max: u64, size: u64, guard: &Guard) -> Result<u64> {
        check_window(min, max, size)?;
        let mut search = GapSearch {
            min,
            max,
            size,
            prev: None,
        };
        if let Some(root) = self.root(guard) {
            // SAFETY: nodes stay alive while `guard` is pinned.
            if let Some(found) = unsafe { search.highest::<V>(root) } {
                return found.ok_or(Error::Busy);
            }
        }
        search.run_down_to(0).ok_or(Error::Busy)
    }

    /// Stores `value` over the lowest free run of `size` indices in
    /// `min..=max` and returns its first index (`mtree_alloc_range`):
    /// `EBUSY` if there is none.
    pub fn alloc_range(&self, size: u64, value: V, min: u64, max: u64) -> Result<u64> {
        let _writer = self.writer.lock();
        let guard = pin();
        let start = self.empty_area(min, max, size, &guard)?;
        self.write(start, start + (size - 1), Some(value), &guard);
        Ok(start)
    }

    /// As [`alloc_range`](Self::alloc_range), at the top of the highest
    /// free run (`mtree_alloc_rrange`).
    pub fn alloc_rrange(&self, size: u64, value: V, min: u64, max: u64) -> Result<u64> {
        let _writer = self.writer.lock();
        let guard = pin();
        let start = self.empty_area_rev(min, max, size, &guard)?;
        self.write(start, start + (size - 1), Some(value), &guard);
        Ok(start)
    }

    /// Stores `value` at the lowest free index in `*next..=hi`, or, when
    /// there is none, in `lo..*next` (`mtree_alloc_cyclic`, for ids that
    /// are not reused at once). Returns the index and whether the search
    /// wrapped around; `*next` becomes the index after it. `EBUSY` when
    /// `lo..=hi` is full, `EINVAL` if `lo > hi`.
    pub fn alloc_cyclic(&self, value: V, lo: u64, hi: u64, next: &mut u64) -> Result<(u64, bool)> {
        check_window(lo, hi, 1)?;
        let _writer = self.writer.lock();
        let guard = pin();
        let from = (*next).clamp(lo, hi);
        let (index, mut wrapped) = match self.empty_area(from, hi, 1, &guard) {
            Ok(index) => (index, false),
            Err(Error::Busy) if from > lo => (self.empty_area(lo, from - 1, 1, &guard)?, true),
            Err(e) => return Err(e),
        };
        self.write(index, index, Some(value), &guard);
        *next = index.wrapping_add(1);
        if *next == 0 || *next > hi {
            *next = lo;
            wrapped = true;
        }
        Ok((index, wrapped))
    }

    /// A copy of the tree (`__mt_dup`, what `fork()` does to an address
    /// space): every node copied once, in one walk, with the writer lock
    /// held so the copy is one state of the tree. Readers go on.
    pub fn dup(&self) -> Self {
        let _writer = self.writer.lock();
        let copy = MapleTree::new();
        if let Some(root) = NonNull::new(self.root.load(Ordering::Relaxed)) {
            // SAFETY: the writer lock keeps every node of this tree alive
            // and unchanged for the walk.
            let root = unsafe {
                let guard = pin();
                let mut session = copy.nodes.arena.session(&guard);
                copy.nodes.copy_subtree_in(&mut session, root)
            };
            copy.root.store(root.as_ptr(), Ordering::Release);
            copy.len.store(self.len(), Ordering::Relaxed);
            copy.note_size();
        }
        copy
    }

    /// Stores `value` (or nothing, for an erase) over `first..=last`,
    /// under the writer lock (or `&mut` of the tree).
    pub(super) fn write(&self, first: u64, last: u64, value: Option<V>, guard: &Guard) {
        let old = NonNull::new(self.root.load(Ordering::Relaxed));
        let value = match old {
            // SAFETY: the writer lock is held; the root is live.
            Some(root) => match unsafe { self.write_in_leaf(root, first, last, value, guard) } {
                Ok(()) => return,
                Err(value) => value,
            },
            None => value,
        };
        let new = value.map(|value| Item { first, last, value });
        let mut w = Write {
            nodes: &self.nodes,
            // SAFETY: the writer lock is held; the root is live.
            fill: old.map_or(Fill::Even, |root| unsafe {
                append_fill::<V>(root, first, last)
            }),
            retired: SmallVec::new(),
            removed: 0,
            added: new.is_some() as usize,
        };
        let root = match old {
            None => new.map(|item| w.nodes.leaf(std::iter::once(item), 1).node),
            // SAFETY: the writer lock is held: the tree is ours to read
            // whole, and ours alone to change.
            Some(old) => unsafe {
                let level = header(old).level;
                let done = w.rewrite(old, first, last, new.as_ref());
                w.retired.push((old, false));
                w.new_root(done.subs, level)
            },
        };
        self.root
            .store(root.map_or(null_mut(), NonNull::as_ptr), Ordering::Release);
        self.note_size();
        let (added, removed) = (w.added, w.removed);
        for (node, subtree) in w.retired {
            // SAFETY: unlinked by the root store above; each listed once.
            unsafe {
                if subtree {
                    self.nodes.retire_subtree(node, guard);
                } else {
                    self.nodes.retire(node, guard);
                }
            }
        }
        let len = self.len.load(Ordering::Relaxed) + added - removed;
        self.len.store(len, Ordering::Relaxed);
    }
}

/// A write that changes one leaf and nothing else: `first..=last` lies
/// under one child at every level, so every range it touches is in that
/// leaf (those before it end below the leaf's first index, those after
/// start above `last`).
pub(super) struct LeafWrite {
    /// The branches above the leaf, from the root, and the child taken.
    pub path: SmallVec<[(NodePtr, usize); 8]>,
    pub leaf: NodePtr,
    /// Ranges in the leaf.
    pub n: usize,
    /// Ranges `a..b` overlap the write; the first and last of them may
    /// keep a piece outside it.
    pub a: usize,
    pub b: usize,
    pub cut_left: bool,
    pub cut_right: bool,
}

impl LeafWrite {
    /// Finds the leaf of `first..=last`, or `None` when the write spans
    /// several leaves.
    ///
    /// # Safety
    /// The writer lock is held (or `&mut` of the tree); `root` is the
    /// live root.
    #[inline(always)]
    pub unsafe fn plan<V>(root: NodePtr, first: u64, last: u64) -> Option<Self> {
        let mut path = SmallVec::new();
        let mut node = root;
        // SAFETY: the caller's: nodes reached from the root are live.
        let leaf = unsafe {
            while header(node).level > 0 {
                let branch = as_branch(node);
                let i = branch.route(first);
                // `last` routes to the same child unless the next starts
                // at or below it (unused slots hold `u64::MAX`).
                if i + 1 < branch.len() && branch.lo[i + 1] <= last {
                    return None;
                }
                path.push((node, i));
                node = branch.child(i);
            }
            as_leaf::<V>(node)
        };
        let n = leaf.len();
        // From the first range to end at or after `first` to past the
        // last to start at or below `last`.
        let (a, _) = leaf.at_or_after(first);
        let mut b = a;
        while b < n && leaf.first[b] <= last {
            b += 1;
        }
        Some(LeafWrite {
            path,
            leaf: node,
            n,
            a,
            b,
            cut_left: a < b && leaf.first[a] < first,
            cut_right: a < b && leaf.last(b - 1) > last,
        })
    }

    /// Ranges the write adds: its own and the pieces it cuts off.
    #[inline]
    pub fn added(&self, storing: bool) -> usize {
        self.cut_left as usize + storing as usize + self.cut_right as usize
    }

    /// Whether the leaf can take the write without a split or a merge:
    /// it keeps at least `MIN_FILL` ranges (or no fewer than it had, or
    /// it is the root) and at most `LEAF_SLOTS`.
    pub fn fits(&self, storing: bool) -> bool {
        let len = self.n - (self.b - self.a) + self.added(storing);
        let fill_kept = len >= MIN_FILL || len >= self.n || self.path.is_empty();
        len > 0 && len <= LEAF_SLOTS && fill_kept
    }
}

impl<V: Clone + Send + Sync + 'static> MapleTree<V> {
    /// The common write, without repacking ([`LeafWrite::fits`]): the
    /// leaf is rebuilt, and each branch above it copied with that child's
    /// record replaced: what [`Write::rewrite`] would build, at a fraction
    /// of its work. Gives `value` back when the write needs `rewrite` (a
    /// split, a merge, several leaves).
    ///
    /// # Safety
    /// The writer lock is held; `root` is the live root.
    unsafe fn write_in_leaf(
        &self,
        root: NodePtr,
        first: u64,
        last: u64,
        value: Option<V>,
        guard: &Guard,
    ) -> std::result::Result<(), Option<V>> {
        // SAFETY: the caller's.
        let Some(w) = (unsafe { LeafWrite::plan::<V>(root, first, last) }) else {
            return Err(value);
        };
        if !w.fits(value.is_some()) {
            return Err(value);
        }
        let added = w.added(value.is_some());
        let (a, b, n) = (w.a, w.b, w.n);
        // SAFETY: the caller's: a live leaf.
        let leaf = unsafe { as_leaf::<V>(w.leaf) };
        let mut session = self.nodes.arena.session(guard);
        let mut built = self.nodes.leaf_builder_in(&mut session);
        built.extend_from(leaf, 0..a);
        if w.cut_left {
            built.push(leaf.first[a], first - 1, leaf.value(a).clone());
        }
        if let Some(value) = value {
            built.push(first, last, value);
        }
        if w.cut_right {
            built.push(last + 1, leaf.last(b - 1), leaf.value(b - 1).clone());
        }
        built.extend_from(leaf, b..n);
        let mut sub = built.finish();
        for &(parent, i) in w.path.iter().rev() {
            // SAFETY: a live branch on the path.
            sub = self
                .nodes
                .branch_with(&mut session, unsafe { as_branch(parent) }, i, sub);
        }
        self.root.store(sub.node.as_ptr(), Ordering::Release);
        self.note_size();
        // SAFETY: unlinked by the root store above; each retired once.
        unsafe {
            self.nodes.retire_in(&mut session, w.leaf, guard);
            for &(parent, _) in &w.path {
                self.nodes.retire_in(&mut session, parent, guard);
            }
        }
        drop(session);
        let count = self.len.load(Ordering::Relaxed) + added - (b - a);
        self.len.store(count, Ordering::Relaxed);
        Ok(())
    }
}

impl<V: Clone + Send + Sync + 'static> Clone for MapleTree<V> {
    /// [`dup`](MapleTree::dup).
    fn clone(&self) -> Self {
        self.dup()
    }
}

impl<V: Clone + Send + Sync + 'static> Drop for MapleTree<V> {
    fn drop(&mut self) {
        // Without values to drop, dropping the arena frees every block at
        // once; with them, the nodes are walked on the reaper thread.
        if std::mem::needs_drop::<V>()
            && let Some(root) = NonNull::new(*self.root.get_mut())
        {
            // SAFETY: `&mut self`: no reader holds the tree; nodes retired
            // earlier are not reachable from the root.
            let subtree =
                unsafe { super::node::FreeSubtree::<V>::new(self.nodes.arena.clone(), root) };
            crate::core::reclaim::drop_in_background(subtree);
        }
    }
}

/// Where a split puts the entries: a write that appended at the end of
/// the tree leaves the left node full (sequential stores then fill their
/// nodes, as the kernel's `mab_calc_split` does), one at the start the
/// right node; any other, half and half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    Left,
    Right,
    Even,
}

/// What rewriting a node gives its parent: the nodes that replace it
/// (none, if it emptied), and whether it lost entries.
struct Rewritten {
    subs: SmallVec<[Sub; 4]>,
    shrunk: bool,
}

/// One write's work: the nodes it replaced, and the count of ranges it
/// added and removed.
struct Write<'a, V: Clone + Send + Sync + 'static> {
    nodes: &'a Nodes<V>,
    /// How the nodes it splits are filled.
    fill: Fill,
    /// Nodes to retire once the new root is published (with their
    /// subtrees, when marked).
    retired: SmallVec<[(NodePtr, bool); 16]>,
    added: usize,
    removed: usize,
}

impl<V: Clone + Send + Sync + 'static> Write<'_, V> {
    /// The nodes replacing `node` once `first..=last` holds `new` (or
    /// nothing). `node` itself is left for the caller to retire.
    ///
    /// # Safety
    /// `node` is a live node of the tree, under the writer lock.
    unsafe fn rewrite(
        &mut self,
        node: NodePtr,
        first: u64,
        last: u64,
        new: Option<&Item<V>>,
    ) -> Rewritten {
        // SAFETY: the caller's.
        let level = unsafe { header(node) }.level;
        if level == 0 {
            // SAFETY: the caller's.
            return unsafe { self.rewrite_leaf(node, first, last, new) };
        }
        // SAFETY: the caller's.
        let branch = unsafe { as_branch(node) };
        let n = branch.len();
        let (i, j) = (branch.route(first), branch.route(last));
        // SAFETY: children of a live branch are live.
        let left = unsafe { self.rewrite(branch.child(i), first, last, new) };
        self.retired.push((branch.child(i), false));
        let mut changed = left.subs;
        let mut shrunk = left.shrunk;
        if j > i {
            for m in i + 1..j {
                // SAFETY: as above; the whole subtree is covered.
                self.removed += unsafe { subtree_len::<V>(branch.child(m)) };
                self.retired.push((branch.child(m), true));
            }
            // SAFETY: as above.
            let right = unsafe { self.rewrite(branch.child(j), first, last, None) };
            self.retired.push((branch.child(j), false));
            changed.extend(right.subs);
            shrunk = true;
        }
        let mut subs: SmallVec<[Sub; BRANCH_SLOTS + 4]> = SmallVec::new();
        subs.extend((0..i).map(|m| branch.sub(m)));
        let start = subs.len();
        subs.extend(changed.iter().copied());
        let end = subs.len();
        subs.extend((j + 1..n).map(|m| branch.sub(m)));
        if shrunk {
            // SAFETY: the subs are live nodes one level below `branch`.
            unsafe { self.normalize(&mut subs, start..end, level - 1) };
        } else if end - start == 2 && self.fill == Fill::Even {
            // SAFETY: as above.
            unsafe { self.spill(&mut subs, start, level - 1) };
        }
        Rewritten {
            shrunk: shrunk || subs.len() < n,
            subs: self.pack_branches(level, &subs, self.fill),
        }
    }

    /// # Safety
    /// As [`rewrite`](Self::rewrite), for a leaf.
    unsafe fn rewrite_leaf(
        &mut self,
        node: NodePtr,
        first: u64,
        last: u64,
        new: Option<&Item<V>>,
    ) -> Rewritten {
        // SAFETY: the caller's.
        let leaf = unsafe { as_leaf::<V>(node) };
        let n = leaf.len();
        let mut items: SmallVec<[Item<V>; LEAF_SLOTS + 3]> = SmallVec::new();
        let mut placed = false;
        let place = |items: &mut SmallVec<_>, placed: &mut bool| {
            if !*placed {
                *placed = true;
                items.extend(new.cloned());
            }
        };
        for k in 0..n {
            let (f, l) = (leaf.first[k], leaf.last(k));
            let value = leaf.value(k);
            if l < first {
                items.push(Item {
                    first: f,
                    last: l,
                    value: value.clone(),
                });
            } else if f > last {
                place(&mut items, &mut placed);
                items.push(Item {
                    first: f,
                    last: l,
                    value: value.clone(),
                });
            } else {
                self.removed += 1;
                if f < first {
                    self.added += 1;
                    items.push(Item {
                        first: f,
                        last: first - 1,
                        value: value.clone(),
                    });
                }
                place(&mut items, &mut placed);
                if l > last {
                    self.added += 1;
                    items.push(Item {
                        first: last + 1,
                        last: l,
                        value: value.clone(),
                    });
                }
            }
        }
        place(&mut items, &mut placed);
        Rewritten {
            shrunk: items.len() < n,
            subs: self.pack_leaves(items, self.fill),
        }
    }

    /// `items` in leaves: none, one, or as many as they fill.
    fn pack_leaves<const N: usize>(
        &self,
        items: SmallVec<[Item<V>; N]>,
        fill: Fill,
    ) -> SmallVec<[Sub; 4]>
    where
        [Item<V>; N]: smallvec::Array<Item = Item<V>>,
    {
        let mut items = items.into_iter();
        split_sizes(items.len(), LEAF_SLOTS, fill)
            .map(|range| {
                self.nodes
                    .leaf(items.by_ref().take(range.len()), range.len())
            })
            .collect()
    }

    /// `subs` in branches at `level`.
    fn pack_branches(&self, level: u8, subs: &[Sub], fill: Fill) -> SmallVec<[Sub; 4]> {
        split_sizes(subs.len(), BRANCH_SLOTS, fill)
            .map(|range| self.nodes.branch(level, &subs[range]))
            .collect()
    }

    /// Merges each node in `subs[check]` left with fewer than `MIN_FILL`
    /// entries with a neighbour (the entries of both repacked into one
    /// node, or two if they fill more).
    ///
    /// # Safety
    /// `subs` are live nodes at `level`, under the writer lock.
    unsafe fn normalize<const N: usize>(
        &mut self,
        subs: &mut SmallVec<[Sub; N]>,
        check: std::ops::Range<usize>,
        level: u8,
    ) where
        [Sub; N]: smallvec::Array<Item = Sub>,
    {
        let (mut k, mut end) = (check.start, check.end);
        while k < end && k < subs.len() {
            // SAFETY: the caller's.
            let fill = unsafe { header(subs[k].node) }.len as usize;
            if subs.len() == 1 || fill >= MIN_FILL {
                k += 1;
                continue;
            }
            let a = if k + 1 < subs.len() { k } else { k - 1 };
            // SAFETY: the caller's.
            let merged = unsafe { self.merge(&subs[a..a + 2], level) };
            subs[a] = merged[0];
            if merged.len() == 2 {
                // Two nodes from more than a node's worth: both are full
                // enough.
                subs[a + 1] = merged[1];
                k = a + 2;
            } else {
                // One node, checked again; what followed moved down one.
                subs.remove(a + 1);
                end = (end - 1).max(a + 1);
                k = a;
            }
        }
    }

    /// The entries of `nodes` (neighbours at `level`, in order) in as few
    /// nodes as hold them, filled evenly; `nodes` are retired.
    ///
    /// # Safety
    /// As [`normalize`](Self::normalize).
    unsafe fn merge(&mut self, nodes: &[Sub], level: u8) -> SmallVec<[Sub; 4]> {
        self.retired.extend(nodes.iter().map(|s| (s.node, false)));
        if level == 0 {
            let items: SmallVec<[Item<V>; 3 * LEAF_SLOTS]> = nodes
                .iter()
                // SAFETY: the caller's.
                .map(|s| unsafe { as_leaf::<V>(s.node) })
                .flat_map(|leaf| {
                    (0..leaf.len()).map(|k| Item {
                        first: leaf.first[k],
                        last: leaf.last(k),
                        value: leaf.value(k).clone(),
                    })
                })
                .collect();
            return self.pack_leaves(items, Fill::Even);
        }
        let mut subs: SmallVec<[Sub; 3 * BRANCH_SLOTS]> = nodes
            .iter()
            // SAFETY: the caller's.
            .map(|s| unsafe { as_branch(s.node) })
            .flat_map(|b| (0..b.len()).map(|i| b.sub(i)))
            .collect();
        // A child left small with no neighbour in its old parent has one
        // now.
        let all = 0..subs.len();
        // SAFETY: children of live branches.
        unsafe { self.normalize(&mut subs, all, level - 1) };
        self.pack_branches(level, &subs, Fill::Even)
    }

    /// After a child split in two (`subs[at..at + 2]`): if a neighbour, or
    /// failing that the node past a full neighbour, has room, the nodes
    /// from there to the split are repacked into one node fewer, as a
    /// B*-tree spills to a sibling before it splits, so that nodes
    /// filled by writes in random order are fuller.
    ///
    /// # Safety
    /// As [`normalize`](Self::normalize).
    unsafe fn spill<const N: usize>(&mut self, subs: &mut SmallVec<[Sub; N]>, at: usize, level: u8)
    where
        [Sub; N]: smallvec::Array<Item = Sub>,
    {
        let cap = if level == 0 { LEAF_SLOTS } else { BRANCH_SLOTS };
        // SAFETY: the caller's.
        let len = |s: &Sub| unsafe { header(s.node) }.len as usize;
        // Windows holding the two halves, nearest neighbours first.
        let windows = [
            at.checked_sub(1).map(|l| l..at + 2),
            Some(at..at + 3),
            at.checked_sub(2).map(|l| l..at + 2),
            Some(at..at + 4),
        ];
        let Some(window) = windows.into_iter().flatten().find(|w| {
            w.end <= subs.len()
                && subs[w.clone()].iter().map(len).sum::<usize>() <= (w.len() - 1) * cap
        }) else {
            return;
        };
        // SAFETY: the caller's.
        let merged = unsafe { self.merge(&subs[window.clone()], level) };
        debug_assert_eq!(merged.len(), window.len() - 1);
        subs.remove(window.end - 1);
        subs[window.start..window.end - 1].copy_from_slice(&merged);
    }

    /// The new root over what rewriting the old one (at `level`) gave: a
    /// branch over several, a single node with branches of one child
    /// dropped, or nothing.
    ///
    /// # Safety
    /// The subs are live nodes, under the writer lock.
    unsafe fn new_root(&mut self, subs: SmallVec<[Sub; 4]>, level: u8) -> Option<NodePtr> {
        let mut root = match subs.len() {
            0 => return None,
            1 => subs[0].node,
            _ => self.nodes.branch(level + 1, &subs).node,
        };
        loop {
            // SAFETY: the caller's.
            if unsafe { header(root) }.level == 0 {
                return Some(root);
            }
            // SAFETY: as above.
            let branch = unsafe { as_branch(root) };
            if branch.len() > 1 {
                return Some(root);
            }
            self.retired.push((root, false));
            root = branch.child(0);
        }
    }
}

/// Node memory (the arena's chunks) from which a load asks for each
/// node's later lines as it descends: about an L2 cache. Below it the
/// nodes are in cache and the asking costs more than it saves.
const PREFETCH_FROM: usize = 1 << 20;

/// Asks for the lines of `node` a load reads after its keys: the child
/// pointers of a branch, the ends and values of a leaf. Which of them it
/// reads depends on the keys, so without this the load waits for two
/// misses in a row; with it they overlap. (The keys' own two lines are
/// asked for at once: the header's read touches the first, the binary
/// search's first compare, of the eighth key, the second; prefetching
/// that one too measured no different.)
#[inline(always)]
fn prefetch_lookup<V>(node: NodePtr, leaf: bool) {
    let base = node.as_ptr().cast::<u8>();
    let end = if leaf {
        std::mem::size_of::<Leaf<V>>()
    } else {
        std::mem::offset_of!(Branch, hi)
    };
    for line in (128..end).step_by(64) {
        prefetch(base.wrapping_add(line));
    }
}

/// How a write at `first..=last` fills the nodes it splits: past every
/// range, leave the left node full; before every range, the right one.
///
/// # Safety
/// `root` is live.
unsafe fn append_fill<V>(root: NodePtr, first: u64, last: u64) -> Fill {
    // SAFETY: the caller's.
    let (lo, hi) = unsafe {
        if header(root).level == 0 {
            let leaf = as_leaf::<V>(root);
            (leaf.first[0], leaf.last(leaf.len() - 1))
        } else {
            let branch = as_branch(root);
            (branch.lo[0], branch.hi[branch.len() - 1])
        }
    };
    if first > hi {
        Fill::Left
    } else if last < lo {
        Fill::Right
    } else {
        Fill::Even
    }
}

/// Index ranges splitting `n` entries into nodes of at most `cap`: as
/// few nodes as hold them, filled as `fill` says.
fn split_sizes(n: usize, cap: usize, fill: Fill) -> impl Iterator<Item = std::ops::Range<usize>> {
    let nodes = n.div_ceil(cap);
    let mut bounds: SmallVec<[usize; 4]> = SmallVec::new();
    bounds.push(0);
    for m in 1..nodes {
        bounds.push(match fill {
            Fill::Left => m * cap,
            Fill::Right => n - (nodes - m) * cap,
            Fill::Even => n * m / nodes,
        });
    }
    bounds.push(n);
    (0..nodes).map(move |m| bounds[m]..bounds[m + 1])
}

/// The range in slot `k` of `leaf`, with its value.
#[inline(always)]
pub(super) fn entry_at<V>(leaf: &Leaf<V>, k: usize) -> Entry<'_, V> {
    Entry {
        first: leaf.first[k],
        last: leaf.last(k),
        value: leaf.value(k),
    }
}

/// Ranges stored under `node`.
///
/// # Safety
/// `node` is live for the walk.
unsafe fn subtree_len<V>(node: NodePtr) -> usize {
    // SAFETY: the caller's; children of a live branch are live.
    unsafe {
        let h = header(node);
        if h.level == 0 {
            return h.len as usize;
        }
        let branch = as_branch(node);
        (0..branch.len())
            .map(|i| subtree_len::<V>(branch.child(i)))
            .sum()
    }
}

/// A search for a free run of `size` indices in `min..=max`, walking the
/// free runs between ranges in order (or in reverse): `prev` is the
/// boundary the walk has passed (the last index of the range before, or
/// the first index of the range after, in reverse).
struct GapSearch {
    min: u64,
    max: u64,
    size: u64,
    prev: Option<u64>,
}

impl GapSearch {
    /// Checks the free run from after `prev` up to `end` (exclusive of
    /// `end`'s range: the run is `prev + 1..end`, with `end` the first
    /// index of the next range, or `u64::MAX` inclusive at the tree's
    /// end). `Some(Some(start))`: found; `Some(None)`: no later run can
    /// fit; `None`: go on.
    fn run_to(&self, end_inclusive: u64) -> Option<u64> {
        let start = match self.prev {
            Some(p) if p == u64::MAX => return None,
            Some(p) => p + 1,
            None => 0,
        };
        if start > end_inclusive {
            return None;
        }
        let (lo, hi) = (start.max(self.min), end_inclusive.min(self.max));
        (lo <= hi && hi - lo >= self.size - 1).then_some(lo)
    }

    /// Whether no run starting after `prev` can fit below `max`.
    fn past_window(&self) -> bool {
        match self.prev {
            Some(p) => p == u64::MAX || (p + 1).max(self.min) > self.max - (self.size - 1),
            None => false,
        }
    }

    /// The lowest fit under `node`: `Some(Some(start))` found, `Some(None)`
    /// the window is passed, `None` not found here (`prev` moved past the
    /// node).
    ///
    /// # Safety
    /// `node` is live for the search.
    unsafe fn lowest<V>(&mut self, node: NodePtr) -> Option<Option<u64>> {
        // SAFETY: the caller's.
        if unsafe { header(node) }.level == 0 {
            // SAFETY: as above.
            let leaf = unsafe { as_leaf::<V>(node) };
            for k in 0..leaf.len() {
                if leaf.first[k] > 0
                    && let Some(found) = self.run_to(leaf.first[k] - 1)
                {
                    return Some(Some(found));
                }
                self.prev = Some(leaf.last(k));
                if self.past_window() {
                    return Some(None);
                }
            }
            return None;
        }
        // SAFETY: as above.
        let branch = unsafe { as_branch(node) };
        for i in 0..branch.len() {
            if branch.hi[i] < self.min {
                self.prev = Some(branch.hi[i]);
                continue;
            }
            if branch.lo[i] > 0
                && let Some(found) = self.run_to(branch.lo[i] - 1)
            {
                return Some(Some(found));
            }
            if branch.gap[i] >= self.size {
                // SAFETY: children of a live branch are live.
                if let Some(done) = unsafe { self.lowest::<V>(branch.child(i)) } {
                    return Some(done);
                }
            }
            self.prev = Some(branch.hi[i]);
            if self.past_window() {
                return Some(None);
            }
        }
        None
    }

    /// Checks the free run from `start` down to after `prev` (the first
    /// index of the range above, or none: `u64::MAX` inclusive). Returns
    /// the highest start that fits.
    fn run_down_to(&self, start_inclusive: u64) -> Option<u64> {
        let end = match self.prev {
            Some(0) => return None,
            Some(p) => p - 1,
            None => u64::MAX,
        };
        if start_inclusive > end {
            return None;
        }
        let (lo, hi) = (start_inclusive.max(self.min), end.min(self.max));
        (lo <= hi && hi - lo >= self.size - 1).then(|| hi - (self.size - 1))
    }

    /// Whether no run ending below `prev` can fit above `min`.
    fn below_window(&self) -> bool {
        match self.prev {
            Some(p) => p == 0 || (p - 1).min(self.max) < self.min.saturating_add(self.size - 1),
            None => false,
        }
    }

    /// The highest fit under `node`, as [`lowest`](Self::lowest) in
    /// reverse.
    ///
    /// # Safety
    /// `node` is live for the search.
    unsafe fn highest<V>(&mut self, node: NodePtr) -> Option<Option<u64>> {
        // SAFETY: the caller's.
        if unsafe { header(node) }.level == 0 {
            // SAFETY: as above.
            let leaf = unsafe { as_leaf::<V>(node) };
            for k in (0..leaf.len()).rev() {
                if leaf.last(k) < u64::MAX
                    && let Some(found) = self.run_down_to(leaf.last(k) + 1)
                {
                    return Some(Some(found));
                }
                self.prev = Some(leaf.first[k]);
                if self.below_window() {
                    return Some(None);
                }
            }
            return None;
        }
        // SAFETY: as above.
        let branch = unsafe { as_branch(node) };
        for i in (0..branch.len()).rev() {
            if branch.lo[i] > self.max {
                self.prev = Some(branch.lo[i]);
                continue;
            }
            if branch.hi[i] < u64::MAX
                && let Some(found) = self.run_down_to(branch.hi[i] + 1)
            {
                return Some(Some(found));
            }
            if branch.gap[i] >= self.size {
                // SAFETY: children of a live branch are live.
                if let Some(done) = unsafe { self.highest::<V>(branch.child(i)) } {
                    return Some(done);
                }
            }
            self.prev = Some(branch.lo[i]);
            if self.below_window() {
                return Some(None);
            }
        }
        None
    }
}
