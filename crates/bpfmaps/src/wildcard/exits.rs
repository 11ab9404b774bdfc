//! Exit bounds: when a probe may stop early.
//!
//! A probe walks the tables in order of their best priority and stops at
//! the first whose best cannot beat the match in hand. That leaves it
//! probing every table whose best is better than the match, though most
//! hold no rule that even overlaps it: on acl1_10k a packet matched in
//! the first table by a rule of priority 5,000 or worse probes the
//! tables after it, whose best rules have priorities from 4,838.
//!
//! A rule's *exit bound* is the worst priority among the rules that
//! overlap it and come before it in rule order (0 when none does). A
//! rule that beats a match on some packet matches that packet too, so it
//! overlaps the match and is no worse than the match's exit bound: a
//! probe holding a match may stop at the first table whose best priority
//! is worse than the match's exit bound, not only worse than its
//! priority. The bound counts the rules of the match's own table too,
//! though a probe never needs it to (a bucket's first match is its
//! best): so a rule that moves between tables (a split) leaves every
//! bound true, and a reader that started before the move, on the view
//! before it, cannot stop short of the rule's new table. On the
//! ClassBench 10K sets the bounds took the tables probed a packet from
//! 2.83 / 3.93 / 4.69 to 2.56 / 3.86 / 3.23 (acl1 / fw1 / ipc1;
//! docs/benchmarks.md, "Exit bounds").
//!
//! Only a [`load`](super::WildcardMap::load) works the bounds out, over
//! every rule held, and publishes a view whose probes read them. They
//! hold while every rule held is of that set: a bound may be too high
//! (a rule removed since), which costs probes; a rule taken out and put
//! back gets the bound it had, and a new value keeps it (`map/write.rs`,
//! `Writer::exits_after_adding`); any other new rule is in no bound, so
//! it voids them all until the next load, as do more rules taken out
//! than half of those held (the entries remembered for them, freed).
//!
//! Finding the overlapping pairs: two rules that overlap, one of which
//! fits the other's table (fixes at least the bits the table hashes),
//! agree on every bit that table hashes, so they share a bucket of it;
//! a bucket lookup finds them. Pairs where neither fits the other's
//! table are checked by hand, table pair by table pair, the cheapest
//! first, up to [`HAND_PAIRS_PER_RULE`] a rule; the rules of a table
//! pair past that budget keep their priority as their bound (no early
//! stop), so the work stays linear in the rules.

use std::collections::HashMap;
use std::sync::Arc;

use super::chain::{Entry, Width, Word};
use super::map::{Tuple, fits};
use super::schema::Rule;

/// Pairs of rules checked by hand a load may spend, per rule held. The
/// ClassBench 10K sets hold 147 (acl1), 706 (ipc1) and 2,040 (fw1) such
/// pairs a rule: acl1's and ipc1's are all checked, fw1's cheapest
/// table pairs only (its bounds save little: 3.93 tables probed a
/// packet to 3.86, where ipc1's go from 4.69 to 3.23).
const HAND_PAIRS_PER_RULE: usize = 1024;

/// One table as the computation sees it: its tuple and its rules.
pub(super) struct TableRules {
    pub(super) tuple: Tuple,
    pub(super) rules: Vec<Arc<Entry>>,
}

/// Whether two rules match some packet in common.
pub(super) fn overlap(a: &Rule, b: &Rule) -> bool {
    a.bounds()
        .iter()
        .zip(b.bounds())
        .all(|(x, y)| x.0 <= y.1 && y.0 <= x.1)
}

/// Calls `hit(x, y)` for each pair of `a[x]` and `b[y]` that overlap,
/// their bounds compared as words of `W` (which hold every field): `b`'s
/// bounds field by field, side by side, so that the compares of one rule
/// of `a` against all of `b` run as vectors.
fn overlapping_pairs<W: Word>(a: &[&Rule], b: &[&Rule], hit: &mut dyn FnMut(usize, usize)) {
    let Some(first) = b.first() else { return };
    let fields = first.bounds().len();
    let side = |pick: fn(&(u128, u128)) -> u128| -> Vec<Vec<W>> {
        (0..fields)
            .map(|f| b.iter().map(|r| W::of(pick(&r.bounds()[f]))).collect())
            .collect()
    };
    let (lows, highs) = (side(|b| b.0), side(|b| b.1));
    let mut apart = vec![false; b.len()];
    for (x, r) in a.iter().enumerate() {
        apart.fill(false);
        for (f, &(lo, hi)) in r.bounds().iter().enumerate() {
            let (lo, hi) = (W::of(lo), W::of(hi));
            for ((ap, &l), &h) in apart.iter_mut().zip(&lows[f]).zip(&highs[f]) {
                *ap |= (lo > h) | (l > hi);
            }
        }
        for (y, _) in apart.iter().enumerate().filter(|(_, ap)| !**ap) {
            hit(x, y);
        }
    }
}

/// Each rule's exit bound, in the order of `tables` and their rules.
///
/// `fixed` gives a rule's fixed bits per field; `bucket(t, rule, visit)`
/// calls `visit` on each rule of table `t`'s bucket that `rule` hashes
/// to (a rule that fits the table); `width`, a word that holds every
/// field.
pub(super) fn exit_bounds(
    tables: &[TableRules],
    width: Width,
    fixed: impl Fn(&Rule) -> Tuple,
    mut bucket: impl FnMut(usize, &Rule, &mut dyn FnMut(&Entry)),
) -> Vec<Vec<u32>> {
    let where_is: HashMap<*const Entry, (usize, usize), foldhash::fast::RandomState> = tables
        .iter()
        .enumerate()
        .flat_map(|(t, table)| {
            (table.rules.iter().enumerate()).map(move |(k, e)| (Arc::as_ptr(e), (t, k)))
        })
        .collect();
    let fixed: Vec<Vec<Tuple>> = tables
        .iter()
        .map(|t| t.rules.iter().map(|e| fixed(&e.rule)).collect())
        .collect();
    // The worst priority of a better overlapping rule found so far.
    let mut worst: Vec<Vec<u32>> = tables.iter().map(|t| vec![0; t.rules.len()]).collect();
    let mut unknown: Vec<Vec<bool>> = tables.iter().map(|t| vec![false; t.rules.len()]).collect();
    let record = |worst: &mut Vec<Vec<u32>>, (t, k): (usize, usize), (u, j): (usize, usize)| {
        let (a, b) = (&tables[t].rules[k].rule, &tables[u].rules[j].rule);
        if a < b {
            worst[u][j] = worst[u][j].max(a.priority);
        } else {
            worst[t][k] = worst[t][k].max(b.priority);
        }
    };
    // Pairs of which one fits the other's table: through its bucket.
    for (t, table) in tables.iter().enumerate() {
        for (k, e) in table.rules.iter().enumerate() {
            for (u, other) in tables.iter().enumerate() {
                if !fits(&fixed[t][k], &other.tuple) {
                    continue;
                }
                bucket(u, &e.rule, &mut |q| {
                    if !std::ptr::eq(q, &**e) && overlap(&e.rule, &q.rule) {
                        record(&mut worst, (t, k), where_is[&std::ptr::from_ref(q)]);
                    }
                });
            }
        }
    }
    // Pairs neither of which fits the other's table: by hand, the
    // cheapest table pairs first, within the budget.
    let misfits = |t: usize, u: usize| -> Vec<usize> {
        (0..tables[t].rules.len())
            .filter(|&k| !fits(&fixed[t][k], &tables[u].tuple))
            .collect()
    };
    let mut pairs: Vec<(usize, usize, Vec<usize>, Vec<usize>)> = Vec::new();
    for t in 0..tables.len() {
        for u in t + 1..tables.len() {
            let (a, b) = (misfits(t, u), misfits(u, t));
            if !a.is_empty() && !b.is_empty() {
                pairs.push((t, u, a, b));
            }
        }
    }
    pairs.sort_by_key(|(_, _, a, b)| a.len() * b.len());
    let held: usize = tables.iter().map(|t| t.rules.len()).sum();
    let mut budget = HAND_PAIRS_PER_RULE.saturating_mul(held);
    for (t, u, a, b) in pairs {
        let cost = a.len() * b.len();
        if cost > budget {
            a.iter().for_each(|&k| unknown[t][k] = true);
            b.iter().for_each(|&j| unknown[u][j] = true);
            continue;
        }
        budget -= cost;
        let rules = |t: usize, ks: &[usize]| -> Vec<&Rule> {
            ks.iter().map(|&k| &tables[t].rules[k].rule).collect()
        };
        let (ra, rb) = (rules(t, &a), rules(u, &b));
        let mut hit = |x: usize, y: usize| record(&mut worst, (t, a[x]), (u, b[y]));
        match width {
            Width::W32 => overlapping_pairs::<u32>(&ra, &rb, &mut hit),
            Width::W64 => overlapping_pairs::<u64>(&ra, &rb, &mut hit),
            Width::W128 => overlapping_pairs::<u128>(&ra, &rb, &mut hit),
        }
    }
    tables
        .iter()
        .enumerate()
        .map(|(t, table)| {
            (table.rules.iter().enumerate())
                .map(|(k, e)| {
                    let p = e.rule.priority;
                    if unknown[t][k] { p } else { worst[t][k].min(p) }
                })
                .collect()
        })
        .collect()
}
