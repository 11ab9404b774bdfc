//! [`Exclusive`]: writes in place, for a tree nobody else can read.
//!
//! A [`MapleTree`] shared with readers never changes a published node:
//! every write copies the leaf it changes and the branches above it, and
//! retires the old ones through the epoch scheme. That is what lets
//! readers run without a lock, and it is most of a write's cost. A tree
//! borrowed `&mut` has no readers (a guard's borrows of it are gone, and
//! no other thread holds it), so a write may edit its leaf where it lies,
//! as the kernel's maple tree does outside RCU mode (`mt_clear_in_rcu`):
//! no allocation, no retirement, no clone of the values it keeps.
//!
//! A write that fits its leaf ([`LeafWrite::fits`]) is done in place;
//! one that splits or merges nodes, or spans several leaves, takes the
//! shared path (copy on write), which is as correct under `&mut`.

use std::mem::MaybeUninit;
use std::ops::{Deref, RangeInclusive};
use std::ptr::{self, NonNull};

use smallvec::SmallVec;

use super::node::{Branch, Item, LEAF_SLOTS, Leaf, Slot, as_leaf};
use super::tree::{Entry, LeafWrite, MapleTree, check_range};
use crate::core::error::{Error, Result};
use crate::core::reclaim::pin;

/// A tree borrowed `&mut`: its writes edit nodes in place
/// ([`MapleTree::exclusive`]). Reads go through to the tree (it derefs
/// to it), and need no guard through [`get`](Self::get) and
/// [`get_mut`](Self::get_mut).
///
/// ```
/// use bpfmaps::maple::MapleTree;
///
/// let mut tree = MapleTree::new();
/// let mut ex = tree.exclusive();
/// ex.store_range(0x1000, 0x1fff, 1u64).unwrap();
/// ex.store_range(0x1800, 0x1800, 2).unwrap(); // cuts 0x1000..=0x1fff in three
/// *ex.get_mut(0x1900).unwrap().1 += 10;
/// assert_eq!(ex.get(0x1fff).map(|e| (e.range(), *e.value)), Some((0x1801..=0x1fff, 11)));
/// assert_eq!(ex.erase(0x1234), Some((0x1000..=0x17ff, 1)));
/// assert_eq!(tree.len(), 2);
/// ```
pub struct Exclusive<'t, V: Clone + Send + Sync + 'static> {
    tree: &'t mut MapleTree<V>,
}

impl<V: Clone + Send + Sync + 'static> MapleTree<V> {
    /// Exclusive access: writes in place, without copies
    /// ([`Exclusive`]). For a tree being built, or one thread's own.
    pub fn exclusive(&mut self) -> Exclusive<'_, V> {
        Exclusive { tree: self }
    }
}

impl<V: Clone + Send + Sync + 'static> Deref for Exclusive<'_, V> {
    type Target = MapleTree<V>;
    fn deref(&self) -> &MapleTree<V> {
        self.tree
    }
}

impl<V: Clone + Send + Sync + 'static> Exclusive<'_, V> {
    /// The range holding `index` and its value ([`MapleTree::load`],
    /// without a guard).
    pub fn get(&self, index: u64) -> Option<Entry<'_, V>> {
        // SAFETY: `&self` borrows the `&mut` of the tree: no write runs
        // while the entry lives.
        unsafe { self.tree.load_in(index) }
    }

    /// The range holding `index` and its value, to change in place.
    pub fn get_mut(&mut self, index: u64) -> Option<(RangeInclusive<u64>, &mut V)> {
        // SAFETY: `&mut self`: nobody else reads or writes the nodes; the
        // value is borrowed for as long as the tree is.
        unsafe {
            let node = self.tree.leaf_of(index)?;
            let k = as_leaf::<V>(node).find(index)?;
            let leaf = node.cast::<Leaf<V>>().as_ptr();
            let slot = &mut (*leaf).slot[k];
            Some(((*leaf).first[k]..=slot.last, slot.value.assume_init_mut()))
        }
    }

    /// Calls `f` on every range, in order, with its value to change in
    /// place: one cursor walk, as the kernel's `mas_for_each` with a
    /// `mas_store` of each entry over its own range (its fork benchmark),
    /// where [`get_mut`](Self::get_mut) per range would descend from the
    /// root each time.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(RangeInclusive<u64>, &mut V)) {
        let guard = pin();
        let mut cursor = self.tree.cursor(&guard);
        let mut range = cursor.seek_at_or_after(0).map(|e| e.range());
        while let Some(r) = range {
            let (node, k) = cursor
                .position()
                .expect("the cursor is on the range it returned");
            // SAFETY: `&mut self`: nobody else reads or writes the nodes,
            // and the value's borrow ends before the cursor moves on.
            let value = unsafe {
                let leaf = node.cast::<Leaf<V>>().as_ptr();
                (*leaf).slot[k].value.assume_init_mut()
            };
            f(r, value);
            range = cursor.next().map(|e| e.range());
        }
    }

    /// [`MapleTree::store_range`], in place.
    pub fn store_range(&mut self, first: u64, last: u64, value: V) -> Result<()> {
        check_range(first, last)?;
        match &self.plan(first, last) {
            Some(w) if w.fits(true) => {
                // SAFETY: planned just now, and it fits.
                drop(unsafe { self.apply(w, first, last, Some(value), false) })
            }
            _ => self.tree.write(first, last, Some(value), &pin()),
        }
        Ok(())
    }

    /// [`MapleTree::store`], in place.
    pub fn store(&mut self, index: u64, value: V) -> Result<()> {
        self.store_range(index, index, value)
    }

    /// [`MapleTree::insert_range`], in place: `EEXIST` if an index of
    /// `first..=last` is taken.
    pub fn insert_range(&mut self, first: u64, last: u64, value: V) -> Result<()> {
        check_range(first, last)?;
        match &self.plan(first, last) {
            Some(w) if w.a < w.b => Err(Error::Exists),
            Some(w) if w.fits(true) => {
                // SAFETY: planned just now, and it fits.
                drop(unsafe { self.apply(w, first, last, Some(value), false) });
                Ok(())
            }
            Some(_) => {
                self.tree.write(first, last, Some(value), &pin());
                Ok(())
            }
            // Several leaves (or none): the shared path checks them.
            None => self.tree.insert_range(first, last, value),
        }
    }

    /// [`MapleTree::insert`], in place.
    pub fn insert(&mut self, index: u64, value: V) -> Result<()> {
        self.insert_range(index, index, value)
    }

    /// [`MapleTree::erase`], in place: the value is moved out, not cloned.
    pub fn erase(&mut self, index: u64) -> Option<(RangeInclusive<u64>, V)> {
        let (first, last) = self.get(index).map(|e| (e.first, e.last))?;
        match &self.plan(first, last) {
            Some(w) if w.fits(false) => {
                // SAFETY: planned just now, and it fits.
                let value = unsafe { self.apply(w, first, last, None, true) };
                Some((first..=last, value.expect("the range erased")))
            }
            _ => self.tree.erase(index),
        }
    }

    /// [`MapleTree::erase_range`], in place.
    pub fn erase_range(&mut self, first: u64, last: u64) -> Result<bool> {
        check_range(first, last)?;
        match &self.plan(first, last) {
            Some(w) if w.a == w.b => Ok(false),
            Some(w) if w.fits(false) => {
                // SAFETY: planned just now, and it fits.
                drop(unsafe { self.apply(w, first, last, None, false) });
                Ok(true)
            }
            _ => self.tree.erase_range(first, last),
        }
    }

    /// The leaf a write of `first..=last` changes, if it changes one.
    #[inline(always)]
    fn plan(&mut self, first: u64, last: u64) -> Option<LeafWrite> {
        let root = NonNull::new(*self.tree.root.get_mut())?;
        // SAFETY: `&mut self`: the root is live and ours alone.
        unsafe { LeafWrite::plan::<V>(root, first, last) }
    }

    /// Stores `value` (or nothing) over `first..=last` in `w`'s leaf,
    /// then brings the records of the branches above it up to date.
    /// Returns the value of the first range the write overlapped if
    /// `keep_first` (what an erase of one range returns); drops the
    /// others (the pieces it keeps of cut ones hold clones).
    ///
    /// # Safety
    /// `w` was planned for `first..=last` on this tree with no write
    /// since, and `w.fits(value.is_some())`; with `keep_first`, it
    /// overlaps a range.
    #[inline(always)]
    unsafe fn apply(
        &mut self,
        w: &LeafWrite,
        first: u64,
        last: u64,
        value: Option<V>,
        keep_first: bool,
    ) -> Option<V> {
        let (a, b, n) = (w.a, w.b, w.n);
        let leaf = w.leaf.cast::<Leaf<V>>().as_ptr();
        // SAFETY: `&mut self`: nobody else reaches the nodes, so they may
        // change; the caller's plan gives the slots (`a <= b <= n <=
        // LEAF_SLOTS`, and the result fits). No reference into a node is
        // held across a change to it.
        unsafe {
            // A store over exactly one stored range (the kernel's exact
            // fit): the value changes, and nothing else does.
            let exact = b == a + 1 && (*leaf).first[a] == first && (*leaf).slot[a].last == last;
            let value = match value {
                Some(value) if exact => {
                    let old = std::mem::replace((*leaf).slot[a].value.assume_init_mut(), value);
                    return keep_first.then_some(old);
                }
                value => value,
            };
            let value_of = |k: usize| (*leaf).slot[k].value.assume_init_ref().clone();
            // The pieces kept of cut ranges, cloned before anything moves:
            // a clone that panics leaves the tree as it was.
            let left = w.cut_left.then(|| Item {
                first: (*leaf).first[a],
                last: first - 1,
                value: value_of(a),
            });
            let right = w.cut_right.then(|| Item {
                first: last + 1,
                last: (*leaf).slot[b - 1].last,
                value: value_of(b - 1),
            });
            let new = value.map(|value| Item { first, last, value });
            let m = w.added(new.is_some());
            // The overlapped values leave the leaf before it changes, and
            // are dropped once it is whole again.
            let take = |k: usize| (*leaf).slot[k].value.assume_init_read();
            let kept = keep_first.then(|| take(a));
            let gone: SmallVec<[V; LEAF_SLOTS]> = if std::mem::needs_drop::<V>() {
                (a + keep_first as usize..b).map(take).collect()
            } else {
                SmallVec::new()
            };
            // Slide the ranges after the write to their place ...
            let firsts = (&raw mut (*leaf).first).cast::<u64>();
            let slots = (&raw mut (*leaf).slot).cast::<Slot<V>>();
            if b != a + m {
                ptr::copy(firsts.add(b), firsts.add(a + m), n - b);
                ptr::copy(slots.add(b), slots.add(a + m), n - b);
            }
            // ... put the write's in between ...
            for (k, item) in (a..).zip(left.into_iter().chain(new).chain(right)) {
                firsts.add(k).write(item.first);
                slots.add(k).write(Slot {
                    last: item.last,
                    value: MaybeUninit::new(item.value),
                });
            }
            // ... and pad the slots left free, as a new leaf's.
            let len = n - (b - a) + m;
            for k in len..n {
                firsts.add(k).write(u64::MAX);
                (*slots.add(k)).last = u64::MAX;
            }
            (*leaf).header.len = len as u8;
            // Each branch on the path records its child's span; the root's
            // own span is nobody's record.
            let mut span = (*leaf).span();
            for (depth, &(parent, i)) in w.path.iter().enumerate().rev() {
                let branch = parent.cast::<Branch>().as_ptr();
                if (*branch).record(i) == span {
                    break;
                }
                (*branch).set_record(i, span);
                if depth > 0 {
                    span = (*branch).span();
                }
            }
            let count = self.tree.len.get_mut();
            *count = *count + m - (b - a);
            drop(gone);
            kept
        }
    }
}
