//! The range maps the `maple-*` suites compare, behind one trait: the
//! maple tree, a `BTreeMap<u64, (u64, V)>` used as a range map (what Rust
//! users write by hand), `rangemap::RangeInclusiveMap` and `nodit`'s
//! `NoditMap`.

use std::collections::BTreeMap;

use bpfmaps::maple::MapleTree;
use nodit::interval::ii;
use nodit::{Interval, NoditMap};
use rangemap::RangeInclusiveMap;

/// A map of disjoint inclusive `u64` ranges to `u64` values.
pub trait RangeTable: Send + Sync + 'static {
    /// Name in records.
    const NAME: &'static str;
    /// An empty map.
    fn new() -> Self;
    /// Stores a range that overlaps no stored one.
    fn insert(&mut self, first: u64, last: u64, value: u64);
    /// Stores `first..=last`, overwriting what it covers and cutting the
    /// ranges it overlaps at its ends (`mtree_store_range`).
    fn store(&mut self, first: u64, last: u64, value: u64);
    /// Frees `first..=last`, cutting the ranges it overlaps at its ends.
    fn erase(&mut self, first: u64, last: u64);
    /// The value of the range holding `index`.
    fn load(&self, index: u64) -> Option<u64>;
    /// The lowest `start >= min` with `start..start + size` free.
    fn empty_area(&self, min: u64, size: u64) -> Option<u64>;
    /// The value of the first range that ends at or after `from`: the one
    /// holding it, or the next (`mt_find` to the end; `find_vma`'s search).
    fn find(&self, from: u64) -> Option<u64>;
    /// [`find`](Self::find) from each of `froms`, the values summed (none
    /// adds 0): the timed loop's batch.
    fn find_sum(&self, froms: &[u64]) -> u64 {
        froms
            .iter()
            .map(|&i| self.find(i).unwrap_or(0))
            .fold(0, u64::wrapping_add)
    }
    /// The values of the ranges holding `indices`, summed (a miss adds
    /// 0): the timed loop's batch.
    fn load_sum(&self, indices: &[u64]) -> u64 {
        indices
            .iter()
            .map(|&i| self.load(i).unwrap_or(0))
            .fold(0, u64::wrapping_add)
    }
}

impl RangeTable for MapleTree<u64> {
    const NAME: &'static str = "bpfmaps";
    fn new() -> Self {
        MapleTree::new()
    }
    fn insert(&mut self, first: u64, last: u64, value: u64) {
        self.insert_range(first, last, value)
            .expect("disjoint ranges");
    }
    fn store(&mut self, first: u64, last: u64, value: u64) {
        self.store_range(first, last, value).expect("a valid range");
    }
    fn erase(&mut self, first: u64, last: u64) {
        self.erase_range(first, last).expect("a valid range");
    }
    #[inline]
    fn load(&self, index: u64) -> Option<u64> {
        self.load(index, &bpfmaps::pin()).map(|e| *e.value)
    }
    fn empty_area(&self, min: u64, size: u64) -> Option<u64> {
        self.empty_area(min, u64::MAX, size, &bpfmaps::pin()).ok()
    }
    fn find(&self, from: u64) -> Option<u64> {
        self.find(from, u64::MAX, &bpfmaps::pin()).map(|e| *e.value)
    }
    /// One guard per batch, as [`load_sum`](RangeTable::load_sum).
    fn find_sum(&self, froms: &[u64]) -> u64 {
        let guard = bpfmaps::pin();
        froms
            .iter()
            .map(|&i| self.find(i, u64::MAX, &guard).map_or(0, |e| *e.value))
            .fold(0, u64::wrapping_add)
    }
    /// One guard per batch, as a BPF program's loads share one RCU read
    /// section.
    fn load_sum(&self, indices: &[u64]) -> u64 {
        let guard = bpfmaps::pin();
        indices
            .iter()
            .map(|&i| self.load(i, &guard).map_or(0, |e| *e.value))
            .fold(0, u64::wrapping_add)
    }
}

/// A `BTreeMap` keyed by each range's first index: a load is the last key
/// at or below the index, then a check of its end. The usual hand-written
/// range map.
pub struct BTreeRanges(pub(crate) BTreeMap<u64, (u64, u64)>);

impl RangeTable for BTreeRanges {
    const NAME: &'static str = "btreemap";
    fn new() -> Self {
        BTreeRanges(BTreeMap::new())
    }
    fn insert(&mut self, first: u64, last: u64, value: u64) {
        self.0.insert(first, (last, value));
    }
    fn store(&mut self, first: u64, last: u64, value: u64) {
        self.erase(first, last);
        self.0.insert(first, (last, value));
    }
    fn erase(&mut self, first: u64, last: u64) {
        // A range from below reaching in: keep its parts outside.
        if let Some((&f, &(l, v))) = self.0.range(..first).next_back()
            && l >= first
        {
            self.0.insert(f, (first - 1, v));
            if l > last {
                self.0.insert(last + 1, (l, v));
            }
        }
        // Ranges starting inside: gone, but for a tail past `last`.
        while let Some((&f, &(l, v))) = self.0.range(first..=last).next() {
            self.0.remove(&f);
            if l > last {
                self.0.insert(last + 1, (l, v));
            }
        }
    }
    #[inline]
    fn load(&self, index: u64) -> Option<u64> {
        let (_, &(last, value)) = self.0.range(..=index).next_back()?;
        (last >= index).then_some(value)
    }
    /// A walk over the ranges from `min` until a gap fits: what a
    /// `BTreeMap` user has (no per-subtree gap record).
    fn empty_area(&self, min: u64, size: u64) -> Option<u64> {
        let mut start = match self.0.range(..=min).next_back() {
            Some((_, &(last, _))) if last >= min => last.checked_add(1)?,
            _ => min,
        };
        for (&first, &(last, _)) in self.0.range(start..) {
            if first - start >= size {
                return Some(start);
            }
            start = last.checked_add(1)?;
        }
        (u64::MAX - start >= size - 1).then_some(start)
    }
    fn find(&self, from: u64) -> Option<u64> {
        match self.0.range(..=from).next_back() {
            Some((_, &(last, value))) if last >= from => Some(value),
            _ => self.0.range(from..).next().map(|(_, &(_, value))| value),
        }
    }
}

/// `rangemap::RangeInclusiveMap` (a `BTreeMap` of ranges underneath,
/// coalescing equal neighbours: every stored value here is distinct).
pub struct RangeMap(RangeInclusiveMap<u64, u64>);

impl RangeTable for RangeMap {
    const NAME: &'static str = "rangemap";
    fn new() -> Self {
        RangeMap(RangeInclusiveMap::new())
    }
    fn insert(&mut self, first: u64, last: u64, value: u64) {
        self.0.insert(first..=last, value);
    }
    fn store(&mut self, first: u64, last: u64, value: u64) {
        self.0.insert(first..=last, value);
    }
    fn erase(&mut self, first: u64, last: u64) {
        self.0.remove(first..=last);
    }
    #[inline]
    fn load(&self, index: u64) -> Option<u64> {
        self.0.get(&index).copied()
    }
    fn empty_area(&self, min: u64, size: u64) -> Option<u64> {
        self.0
            .gaps(&(min..=u64::MAX))
            .find(|g| g.end() - g.start() >= size - 1)
            .map(|g| *g.start())
    }
    fn find(&self, from: u64) -> Option<u64> {
        self.0
            .overlapping(&(from..=u64::MAX))
            .next()
            .map(|(_, &value)| value)
    }
}

/// `nodit::NoditMap` with inclusive intervals.
pub struct Nodit(NoditMap<u64, Interval<u64>, u64>);

impl RangeTable for Nodit {
    const NAME: &'static str = "nodit";
    fn new() -> Self {
        Nodit(NoditMap::new())
    }
    fn insert(&mut self, first: u64, last: u64, value: u64) {
        self.0
            .insert_strict(ii(first, last), value)
            .unwrap_or_else(|_| panic!("nodit: {first}..={last} overlaps"));
    }
    fn store(&mut self, first: u64, last: u64, value: u64) {
        let _ = self.0.insert_overwrite(ii(first, last), value);
    }
    fn erase(&mut self, first: u64, last: u64) {
        self.0.cut(&ii(first, last)).for_each(drop);
    }
    #[inline]
    fn load(&self, index: u64) -> Option<u64> {
        self.0.get_at_point(&index).copied()
    }
    fn empty_area(&self, min: u64, size: u64) -> Option<u64> {
        self.0
            .gaps_trimmed(&ii(min, u64::MAX))
            .find(|g| g.end() - g.start() >= size - 1)
            .map(|g| *g.start())
    }
    fn find(&self, from: u64) -> Option<u64> {
        self.0
            .overlapping(&ii(from, u64::MAX))
            .next()
            .map(|(_, &value)| value)
    }
}

/// Runs `f` over every range map, in a fixed order.
pub trait RangeStep {
    /// What a step gives back.
    type Out;
    /// One map.
    fn step<T: RangeTable>(&self) -> Self::Out;
}

/// `s` on map `i` of [`RANGE_TABLES`].
pub fn step_at<S: RangeStep>(i: usize, s: &S) -> S::Out {
    match RANGE_TABLES[i] {
        "bpfmaps" => s.step::<MapleTree<u64>>(),
        "btreemap" => s.step::<BTreeRanges>(),
        "rangemap" => s.step::<RangeMap>(),
        _ => s.step::<Nodit>(),
    }
}

/// Each map's output, the maple tree first; peers unless `peers` is false.
pub fn each_range_table<S: RangeStep>(s: &S, peers: bool) -> Vec<S::Out> {
    let maps = if peers { RANGE_TABLES.len() } else { 1 };
    (0..maps).map(|i| step_at(i, s)).collect()
}

/// The maps' names, in [`each_range_table`]'s and [`step_at`]'s order.
pub const RANGE_TABLES: [&str; 4] = ["bpfmaps", "btreemap", "rangemap", "nodit"];
