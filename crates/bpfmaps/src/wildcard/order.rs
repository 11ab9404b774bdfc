//! Rule order for `get_next_key`, kept beside the writer's hash index of
//! the rules.
//!
//! The writer finds a rule's table through a hash table: an update of a
//! cold map then waits on a few cache misses, where a B-tree of the
//! rules compared rules whose parts sit across memory at every level, a
//! dozen misses a removal (docs/benchmarks.md, "A hash index of rules").
//! A walk in rule order needs a sorted run instead. The first walk
//! builds one and it is kept: the rules added since go into a small
//! B-tree beside it, the rules removed since stay in it and the walk
//! skips them, and once the changes since outnumber half of it, it is
//! dropped, for the next walk to build again. Maps that are never
//! walked never pay for it; a walk costs a binary search a step, and the
//! rebuilds cost O(log n) per update that wore the run out.

use std::collections::BTreeSet;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;

use super::chain::Entry;
use super::map::Placed;
use super::schema::Rule;

/// The rules in rule order, as of its last build, and the changes since.
pub(super) struct RuleOrder {
    /// The rules held at the build, in rule order (an entry replaced
    /// since is still its rule's).
    sorted: Vec<Arc<Entry>>,
    /// Rules added since the build and still held.
    added: BTreeSet<Placed>,
    /// Rules of `sorted` removed or replaced since.
    stale: usize,
}

impl RuleOrder {
    /// The order of `held`, every rule held (each once).
    pub(super) fn build<'a>(held: impl Iterator<Item = &'a Arc<Entry>>) -> Self {
        let mut sorted: Vec<Arc<Entry>> = held.cloned().collect();
        sorted.sort_unstable_by(|a, b| a.rule.cmp(&b.rule));
        RuleOrder {
            sorted,
            added: BTreeSet::new(),
            stale: 0,
        }
    }

    /// The first rule after `after` (`None`: the first rule) among those
    /// `held` says are held.
    pub(super) fn next(&self, after: Option<&Rule>, held: impl Fn(&Rule) -> bool) -> Option<&Rule> {
        let start = after.map_or(0, |a| self.sorted.partition_point(|e| e.rule <= *a));
        let old = self.sorted[start..]
            .iter()
            .map(|e| &e.rule)
            .find(|r| held(r));
        let lower = after.map_or(Unbounded, Excluded);
        let new = self
            .added
            .range::<Rule, _>((lower, Unbounded))
            .next()
            .map(|p| &p.0.rule);
        match (old, new) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A rule not held before is now.
    pub(super) fn add(&mut self, entry: &Arc<Entry>) {
        self.added.insert(Placed(Arc::clone(entry)));
    }

    /// `rule`, held, is no longer.
    pub(super) fn remove(&mut self, rule: &Rule) {
        if !self.added.remove(rule) {
            self.stale += 1;
        }
    }

    /// `entry` took the place of its rule's entry (its value changed).
    pub(super) fn replace(&mut self, entry: &Arc<Entry>) {
        if self.added.remove(&entry.rule) {
            self.add(entry);
        } else {
            // The run keeps the old entry (and its value) alive: counted,
            // so that a run worn by replacements is dropped too.
            self.stale += 1;
        }
    }

    /// Whether the changes since the build outnumber half of it (or a
    /// small run's 64): then it is dropped.
    pub(super) fn worn(&self) -> bool {
        self.added.len() + self.stale > self.sorted.len() / 2 + 64
    }

    /// Bytes it holds (an estimate from sizes).
    pub(super) fn bytes(&self) -> usize {
        use std::mem::size_of;
        size_of::<Self>()
            + self.sorted.capacity() * size_of::<Arc<Entry>>()
            + self.added.len() * (size_of::<Placed>() + 8)
    }
}
