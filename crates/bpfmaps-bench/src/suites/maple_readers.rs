//! `maple-readers`: range-map loads per second of 1 and 2 reader threads
//! while a writer changes the map, the maple tree against a `RwLock`
//! around the best single-threaded peer (`BTreeMap<u64, (u64, V)>`).
//!
//! Varies: the readers (1, 2) and the map. Holds fixed: the layout
//! (`maple-scale`'s, N ranges), the readers' indices (uniform over its
//! span), the writer's work (in turns: cut a random range's last index
//! off, then store the range whole again: two writes that change a leaf
//! each, as `mprotect` and its undo split and merge a mapping), the time
//! of each repetition.

use std::hint::black_box;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bpfmaps::maple::MapleTree;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::measure::in_turns;
use crate::range_tables::{BTreeRanges, RangeTable};
use crate::record::{LOOKUPS_PER_SEC, Record, WRITER_OPS_PER_SEC, case, case_param, find, ratio};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::suites::maple_scale::layout;
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct MapleReaders;

/// `maple-readers` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Ranges stored [quick: 10000; full: 100000].
    #[arg(long)]
    ranges: Option<usize>,
    /// Milliseconds per repetition [quick: 100; full: 1000].
    #[arg(long)]
    duration_ms: Option<u64>,
}

/// The maps compared.
const MAPS: [&str; 2] = ["bpfmaps", "rwlock-btreemap"];

/// A map the readers and the writer share.
trait Shared: Sync {
    /// Sums the values of the ranges holding `indices` (misses add 0).
    fn load_sum(&self, indices: &[u64]) -> u64;
    /// Stores `first..=last` with `value`, cutting what it overlaps.
    fn store(&self, first: u64, last: u64, value: u64);
    /// Cuts `index` off the range ending there.
    fn cut_last(&self, first: u64, last: u64, value: u64);
}

impl Shared for MapleTree<u64> {
    fn load_sum(&self, indices: &[u64]) -> u64 {
        RangeTable::load_sum(self, indices)
    }
    fn store(&self, first: u64, last: u64, value: u64) {
        self.store_range(first, last, value).expect("a valid range");
    }
    fn cut_last(&self, _first: u64, last: u64, _value: u64) {
        self.erase_range(last, last).expect("a valid range");
    }
}

/// The single-threaded peer behind a reader-writer lock: a read lock per
/// load (what a shared `RwLock<map>` is used with), the write lock per
/// write.
struct LockedBTree(RwLock<BTreeRanges>);

impl Shared for LockedBTree {
    fn load_sum(&self, indices: &[u64]) -> u64 {
        indices
            .iter()
            .map(|&i| self.0.read().expect("not poisoned").load(i).unwrap_or(0))
            .fold(0, u64::wrapping_add)
    }
    fn store(&self, first: u64, last: u64, value: u64) {
        // The writer only restores a range it cut: its first index is a
        // key.
        self.0
            .write()
            .expect("not poisoned")
            .insert(first, last, value);
    }
    fn cut_last(&self, first: u64, last: u64, value: u64) {
        let mut map = self.0.write().expect("not poisoned");
        if last > first {
            map.insert(first, last - 1, value);
        } else {
            map.0.remove(&first);
        }
    }
}

/// One repetition: `readers` threads loading, the writer writing, for
/// `time`. Returns (loads/s summed over readers, writes/s).
fn run_once(
    map: &dyn Shared,
    ranges: &[(u64, u64)],
    probes: &[u64],
    readers: usize,
    time: Duration,
    seed: u64,
) -> (f64, f64) {
    let stop = AtomicBool::new(false);
    let loads = AtomicU64::new(0);
    let mut writes = 0u64;
    let began = Instant::now();
    std::thread::scope(|s| {
        for r in 0..readers {
            let (stop, loads) = (&stop, &loads);
            s.spawn(move || {
                let mut at = (r * probes.len() / readers.max(1)) / BATCH * BATCH;
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    black_box(map.load_sum(&probes[at..at + BATCH]));
                    at = (at + BATCH) % probes.len();
                    done += BATCH as u64;
                }
                loads.fetch_add(done, Ordering::Relaxed);
            });
        }
        let mut rng = StdRng::seed_from_u64(seed);
        while began.elapsed() < time {
            let k = rng.random_range(0..ranges.len());
            let (first, last) = ranges[k];
            map.cut_last(first, last, k as u64 + 1);
            map.store(first, last, k as u64 + 1);
            writes += 2;
        }
        stop.store(true, Ordering::Relaxed);
    });
    let secs = began.elapsed().as_secs_f64();
    (
        loads.load(Ordering::Relaxed) as f64 / secs,
        writes as f64 / secs,
    )
}

impl Suite for MapleReaders {
    type Opts = Opts;
    const NAME: &'static str = "maple-readers";
    const ABOUT: &'static str = "range-map loads/s of 1 and 2 readers beside a writer: the maple tree vs a RwLock'd BTreeMap";
    const DESCRIBE: &'static str = "`maple-scale`'s layout of N ranges (100,000; 10,000 with \
         `--quick`) with distinct u64 values. Readers (1 or 2 threads) load indices drawn \
         uniformly over the layout's span, in batches of 256 (the maple tree: one guard a \
         batch, lock-free; the peer: a read lock per load, `std::sync::RwLock` around a \
         `BTreeMap<u64, (u64, V)>`, the best single-threaded peer of `maple-scale`). A \
         writer on the main thread, in turns: cuts a random range's last index off \
         (`erase_range`, or the `BTreeMap` entry shortened) and stores the range whole \
         again, as `mprotect` and its undo split and merge a mapping; each is one write \
         (the write lock per write for the peer). Each repetition runs for the set time; \
         the maps take turns. `lookups_per_sec` is summed over the readers, \
         `writer_ops_per_sec` the writer's. On this 2-core machine two readers and a \
         writer are three busy threads.";
    const BASELINE: &'static str = "rwlock-btreemap";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let n = opts
            .ranges
            .unwrap_or(if ctx.quick() { 10_000 } else { 100_000 })
            .max(1);
        let time =
            Duration::from_millis(
                opts.duration_ms
                    .unwrap_or(if ctx.quick() { 100 } else { 1000 }),
            );
        let ranges = layout(n);
        let span = ranges.last().map_or(1, |r| r.1 + 16);
        let mut rng = StdRng::seed_from_u64(0x7265_6164);
        let probes: Vec<u64> = (0..1 << 16).map(|_| rng.random_range(0..span)).collect();
        let tree = MapleTree::new();
        let mut btree = BTreeRanges::new();
        for (k, &(first, last)) in ranges.iter().enumerate() {
            tree.store_range(first, last, k as u64 + 1)
                .expect("a valid range");
            btree.insert(first, last, k as u64 + 1);
        }
        let locked = LockedBTree(RwLock::new(btree));
        assert_eq!(
            Shared::load_sum(&tree, &probes),
            locked.load_sum(&probes),
            "the maps disagree"
        );
        let maps: [&dyn Shared; 2] = [&tree, &locked];
        ctx.set_steps(2);
        let s = ctx.suite();
        let mut recs = Vec::new();
        for readers in [1usize, 2] {
            let mut writes = vec![Vec::new(); 2];
            let loads = in_turns(2, ctx.reps(), |i| {
                let (l, w) = run_once(maps[i], &ranges, &probes, readers, time, readers as u64);
                writes[i].push(w);
                l
            });
            let c = case(&[("n", &n), ("readers", &readers)]);
            for (i, name) in MAPS.iter().enumerate() {
                recs.push(Record::stats(
                    s,
                    &c,
                    name,
                    &LOOKUPS_PER_SEC,
                    Stats::from_samples(&loads[i]),
                ));
                recs.push(Record::stats(
                    s,
                    &c,
                    name,
                    &WRITER_OPS_PER_SEC,
                    Stats::from_samples(&writes[i]),
                ));
            }
            ctx.step();
        }
        // The writer left every range as it found it.
        assert_eq!(
            Shared::load_sum(&tree, &probes),
            locked.load_sum(&probes),
            "the maps disagree after the writes"
        );
        ctx.print(&recs);
        recs
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        let mut t = Table::new(
            "maple-readers: loads/s of the readers and writes/s of the writer beside them",
            &[
                "ranges",
                "readers",
                "bpfmaps loads/s",
                "rwlock loads/s",
                "bpfmaps/rwlock",
                "bpfmaps writes/s",
                "rwlock writes/s",
            ],
        )
        .with_note("Speed ratio: above 1 means the maple tree's readers load more.");
        let m = |v: f64| format!("{:.2} M", v / 1e6);
        for c in cases {
            let get = |imp: &str, metric: &str| find(records, c, imp, metric);
            let cell =
                |imp: &str, metric: &str| get(imp, metric).map_or("-".into(), |r| m(r.value));
            t.push(vec![
                case_param(c, "n").unwrap_or("?").into(),
                case_param(c, "readers").unwrap_or("?").into(),
                cell(MAPS[0], LOOKUPS_PER_SEC.name),
                cell(MAPS[1], LOOKUPS_PER_SEC.name),
                fmt_ratio(ratio(
                    get(MAPS[0], LOOKUPS_PER_SEC.name),
                    get(MAPS[1], LOOKUPS_PER_SEC.name),
                )),
                cell(MAPS[0], WRITER_OPS_PER_SEC.name),
                cell(MAPS[1], WRITER_OPS_PER_SEC.name),
            ]);
        }
        vec![t]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_small() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let args = ["--ranges", "2000", "--duration-ms", "20"];
        let records = crate::suites::run_quick("maple-readers", &args, no_data);
        assert_eq!(records.len(), 8);
        assert!(records.iter().all(|r| r.value > 0.0));
        let suite = crate::suites::by_name("maple-readers").unwrap();
        assert_eq!(suite.summaries(&records).len(), 1);
    }
}
