//! `maple-readers`: range-map loads per second of 1 and 2 reader threads
//! while a writer replays address-space changes, the maple tree against a
//! `RwLock` around the best single-threaded peer
//! (`BTreeMap<u64, (u64, V)>`).
//!
//! Varies: the readers (1, 2) and the map. Holds fixed: `maple-vma`'s
//! trace (this machine's layouts, 64 simulated processes by default, a
//! shorter run of its episodes), which the writer replays pass after
//! pass; the readers' addresses (inside the starting mappings); the time
//! of each repetition.

use std::hint::black_box;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bpfmaps::maple::MapleTree;
use clap::Args;

use crate::measure::in_turns;
use crate::range_tables::{BTreeRanges, RangeTable};
use crate::record::{LOOKUPS_PER_SEC, Record, WRITER_OPS_PER_SEC, case, case_value, find, ratio};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::suites::maple_vma::{VmaOp, machine_layouts, trace};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct MapleReaders;

/// `maple-readers` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Simulated processes [default: as `maple-vma`].
    #[arg(long)]
    processes: Option<usize>,
    /// Episodes in the writer's trace, replayed pass after pass.
    #[arg(long, default_value_t = 5000)]
    steps: usize,
    /// Milliseconds per repetition [quick: 100; full: 1000].
    #[arg(long)]
    duration_ms: Option<u64>,
}

/// The maps compared: the maple tree's readers pinned once a batch, the
/// same tree read by `get` (a read section a load, whose frees the
/// writer checks with `membarrier`), and the peer.
const MAPS: [&str; 3] = ["bpfmaps", "bpfmaps-get", "rwlock-btreemap"];

/// A map the readers and the writer share.
trait Shared: Sync {
    /// Sums the values of the ranges holding `indices` (misses add 0).
    fn load_sum(&self, indices: &[u64]) -> u64;
    /// Runs the writer's op (a load's value goes into `sink`).
    fn apply(&self, op: VmaOp, sink: &mut u64);
}

impl Shared for MapleTree<u64> {
    fn load_sum(&self, indices: &[u64]) -> u64 {
        RangeTable::load_sum(self, indices)
    }
    fn apply(&self, op: VmaOp, sink: &mut u64) {
        match op {
            VmaOp::Store { first, last, value } => {
                self.store_range(first, last, value).expect("a valid range")
            }
            VmaOp::Erase { first, last } => {
                self.erase_range(first, last).expect("a valid range");
            }
            VmaOp::Load(at) => {
                *sink = sink.wrapping_add(self.load(at, &bpfmaps::pin()).map_or(0, |e| *e.value))
            }
        }
    }
}

/// The maple tree read by `get`, a read section a load and no guard
/// (`mtree_load`'s form): its writer's frees wait for those sections.
struct ByGet<'a>(&'a MapleTree<u64>);

impl Shared for ByGet<'_> {
    fn load_sum(&self, indices: &[u64]) -> u64 {
        indices
            .iter()
            .map(|&i| self.0.get(i).map_or(0, |(_, v)| v))
            .fold(0, u64::wrapping_add)
    }
    fn apply(&self, op: VmaOp, sink: &mut u64) {
        match op {
            VmaOp::Load(at) => *sink = sink.wrapping_add(self.0.get(at).map_or(0, |(_, v)| v)),
            write => self.0.apply(write, sink),
        }
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
    fn apply(&self, op: VmaOp, sink: &mut u64) {
        match op {
            VmaOp::Load(at) => {
                *sink =
                    sink.wrapping_add(self.0.read().expect("not poisoned").load(at).unwrap_or(0))
            }
            write => write.apply(&mut *self.0.write().expect("not poisoned"), sink),
        }
    }
}

/// One repetition: `readers` threads loading, the writer replaying whole
/// passes of `ops` until `time` is up. Returns (loads/s summed over
/// readers, writer ops/s).
fn run_once(
    map: &dyn Shared,
    ops: &[VmaOp],
    probes: &[u64],
    readers: usize,
    time: Duration,
) -> (f64, f64) {
    let stop = AtomicBool::new(false);
    let loads = AtomicU64::new(0);
    let mut writer_ops = 0u64;
    let began = Instant::now();
    std::thread::scope(|s| {
        for r in 0..readers {
            let (stop, loads) = (&stop, &loads);
            s.spawn(move || {
                let mut at = (r * probes.len() / readers.max(1)) / BATCH * BATCH;
                let mut done = 0u64;
                // A batch at least, however late the thread starts: a
                // short run on a busy machine counts something.
                loop {
                    black_box(map.load_sum(&probes[at..at + BATCH]));
                    at = (at + BATCH) % probes.len();
                    done += BATCH as u64;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                loads.fetch_add(done, Ordering::Relaxed);
            });
        }
        let mut sink = 0;
        // A pass at least, as the readers' batch.
        loop {
            for &op in ops {
                map.apply(op, &mut sink);
            }
            writer_ops += ops.len() as u64;
            if began.elapsed() >= time {
                break;
            }
        }
        black_box(sink);
        stop.store(true, Ordering::Relaxed);
    });
    let secs = began.elapsed().as_secs_f64();
    (
        loads.load(Ordering::Relaxed) as f64 / secs,
        writer_ops as f64 / secs,
    )
}

impl Suite for MapleReaders {
    type Opts = Opts;
    const NAME: &'static str = "maple-readers";
    const ABOUT: &'static str = "range-map loads/s of 1 and 2 readers beside a writer: the maple tree vs a RwLock'd BTreeMap";
    const DESCRIBE: &'static str = "`maple-vma`'s starting layout (this machine's \
         `/proc/*/maps`, 64 simulated processes by default) with distinct u64 values. \
         Readers (1 or 2 threads) load addresses inside the starting mappings, in batches of \
         256 (the maple tree: one guard a batch, lock-free; `bpfmaps-get`, the same tree \
         read by `get`, a read section a load, whose retired nodes the writer frees after \
         a `membarrier` that 64 frees share and a look at the readers' records; the peer: \
         a read lock per load, \
         `std::sync::RwLock` around a `BTreeMap<u64, (u64, V)>`, the best single-threaded \
         peer of `maple-scale`). A writer on the main thread replays `maple-vma`'s trace \
         (5,000 episodes by default: mmap, munmap, mprotect and its undo, brk, page faults) \
         pass after pass, whole passes only (the write lock per write for the peer, a read \
         lock per fault). Each repetition runs for the set time; the maps take turns. \
         `lookups_per_sec` is summed over the readers, `writer_ops_per_sec` counts the \
         writer's ops, faults included. On this 2-core machine two readers and a writer are \
         three busy threads.";
    const BASELINE: &'static str = "rwlock-btreemap";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let time =
            Duration::from_millis(
                opts.duration_ms
                    .unwrap_or(if ctx.quick() { 100 } else { 1000 }),
            );
        let layouts = machine_layouts();
        let processes = opts.processes.unwrap_or(64.max(layouts.len())).max(1);
        let trace = trace(&layouts, processes, opts.steps, 0x7265_6164);
        let n = trace.initial.len();
        let tree = MapleTree::new();
        let mut btree = BTreeRanges::new();
        for &(first, last, value) in &trace.initial {
            tree.insert_range(first, last, value)
                .expect("disjoint ranges");
            btree.insert(first, last, value);
        }
        let locked = LockedBTree(RwLock::new(btree));
        let probes = &trace.probes;
        assert_eq!(
            Shared::load_sum(&tree, probes),
            locked.load_sum(probes),
            "the maps disagree"
        );
        let by_get = ByGet(&tree);
        let maps: [&dyn Shared; 3] = [&tree, &by_get, &locked];
        ctx.set_steps(2);
        let s = ctx.suite();
        let mut recs = Vec::new();
        for readers in [1usize, 2] {
            let mut writes = vec![Vec::new(); MAPS.len()];
            let loads = in_turns(MAPS.len(), ctx.reps(), |i| {
                let (l, w) = run_once(maps[i], &trace.ops, probes, readers, time);
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
        // Whole passes of overwrites leave every address as one pass
        // does, however many ran: the maps agree wherever the trace wrote.
        let touched = trace.touched();
        assert_eq!(
            (
                Shared::load_sum(&tree, probes),
                Shared::load_sum(&tree, &touched)
            ),
            (locked.load_sum(probes), locked.load_sum(&touched)),
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
                "get loads/s",
                "rwlock loads/s",
                "bpfmaps/rwlock",
                "get/rwlock",
                "bpfmaps writes/s",
                "get writes/s",
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
                case_value(c, "n").into(),
                case_value(c, "readers").into(),
                cell(MAPS[0], LOOKUPS_PER_SEC.name),
                cell(MAPS[1], LOOKUPS_PER_SEC.name),
                cell(MAPS[2], LOOKUPS_PER_SEC.name),
                fmt_ratio(ratio(
                    get(MAPS[0], LOOKUPS_PER_SEC.name),
                    get(MAPS[2], LOOKUPS_PER_SEC.name),
                )),
                fmt_ratio(ratio(
                    get(MAPS[1], LOOKUPS_PER_SEC.name),
                    get(MAPS[2], LOOKUPS_PER_SEC.name),
                )),
                cell(MAPS[0], WRITER_OPS_PER_SEC.name),
                cell(MAPS[1], WRITER_OPS_PER_SEC.name),
                cell(MAPS[2], WRITER_OPS_PER_SEC.name),
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
        let args = ["--processes", "4", "--steps", "300", "--duration-ms", "20"];
        let records = crate::suites::run_quick("maple-readers", &args, no_data);
        assert_eq!(records.len(), 12);
        assert!(records.iter().all(|r| r.value > 0.0));
        let suite = crate::suites::by_name("maple-readers").unwrap();
        assert_eq!(suite.summaries(&records).len(), 1);
    }
}
