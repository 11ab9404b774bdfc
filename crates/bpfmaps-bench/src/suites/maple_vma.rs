//! `maple-vma`: a replay of address-space changes on the range maps,
//! built from this machine's real `/proc/*/maps` layouts.
//!
//! Varies: the map. Holds fixed: the trace (one seed): the layouts of
//! every readable `/proc/PID/maps` (the bench's own first), one per
//! simulated process, each in its own 2^48 window of one map (a
//! machine-wide map, as a profiler or sandbox keeps for all the processes
//! it watches; with more processes than layouts, they repeat as forked
//! workers do), and episodes drawn at random:
//! - `mmap` (4 in 10): a new mapping, its size drawn from the real
//!   mappings' sizes (at most 64 MiB), placed at the top of the highest
//!   free run below the process's highest mapping (the kernel's top-down
//!   `get_unmapped_area`), touched at both ends; once 256 are live, the
//!   oldest is unmapped;
//! - `mprotect` and its undo (3 in 10): a page-aligned middle part of a
//!   real mapping of 3 pages or more stored with a new value (a split in
//!   three), touched, then the whole mapping stored back (the merge);
//! - `brk` (1 in 10): the heap grown by 1 to 32 pages and shrunk back;
//! - partial `munmap` (2 in 10): the last page of a live new mapping cut
//!   off;
//!
//! each followed by four page faults (`find_vma`: a load at an address
//! inside a random real mapping of the process). Every op is timed
//! together, one thread; after the replay the maps must agree at every
//! address the trace touched.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::measure::in_turns;
use crate::range_tables::{BTreeRanges, RANGE_TABLES, RangeStep, RangeTable, step_at};
use crate::record::{OPS_PER_SEC, Record, case, case_value, find, ratio};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct MapleVma;

/// `maple-vma` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Simulated processes, each with a real layout [default: 64, or the
    /// number of layouts found if more].
    #[arg(long)]
    processes: Option<usize>,
    /// Episodes in the trace [quick: 20000; full: 100000].
    #[arg(long)]
    steps: Option<usize>,
    /// Only the maple tree.
    #[arg(long)]
    no_peers: bool,
}

const PAGE: u64 = 4096;
/// Each simulated process's window of the map.
const WINDOW_BITS: u32 = 48;
/// Addresses at or above this (the vsyscall page) are left out: they do
/// not fit a window.
const USER_TOP: u64 = 1 << 47;
/// Largest new mapping.
const MAX_MMAP: u64 = 64 << 20;
/// New mappings live at once; the oldest is unmapped past this.
const LIVE_MMAPS: usize = 256;
const SEED: u64 = 0x766d_6173;

/// A mapping of a real layout: its inclusive address range, and whether
/// it is the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub first: u64,
    pub last: u64,
    pub heap: bool,
}

/// The mappings of `/proc/PID/maps` text below [`USER_TOP`]; lines that
/// do not parse are skipped.
pub(crate) fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let (range, rest) = line.split_once(' ')?;
            let (start, end) = range.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            (start < end && end <= USER_TOP).then(|| Mapping {
                first: start,
                last: end - 1,
                heap: rest.trim_end().ends_with("[heap]"),
            })
        })
        .collect()
}

/// The layouts of this machine's processes: `/proc/self/maps` first, then
/// every other readable `/proc/PID/maps` with mappings, by pid.
pub(crate) fn machine_layouts() -> Vec<Vec<Mapping>> {
    let own = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut layouts = vec![parse_maps(&own)];
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| pid != std::process::id())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) {
            layouts.push(parse_maps(&text));
        }
    }
    layouts.retain(|l| !l.is_empty());
    layouts
}

/// One operation of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VmaOp {
    /// `store_range`: a new mapping, a protection change or its undo, the
    /// heap grown.
    Store { first: u64, last: u64, value: u64 },
    /// `erase_range`: an unmap, whole or partial, the heap shrunk.
    Erase { first: u64, last: u64 },
    /// A page fault's `find_vma`.
    Load(u64),
}

impl VmaOp {
    /// Runs the op on `map`; a load's value goes into `sink`.
    #[inline]
    pub(crate) fn apply<T: RangeTable>(self, map: &mut T, sink: &mut u64) {
        match self {
            VmaOp::Store { first, last, value } => map.store(first, last, value),
            VmaOp::Erase { first, last } => map.erase(first, last),
            VmaOp::Load(at) => *sink = sink.wrapping_add(map.load(at).unwrap_or(0)),
        }
    }
}

/// A replay: the starting address space, the ops, and addresses to check
/// and to load from.
pub(crate) struct Trace {
    /// The mappings at the start, `(first, last, value)`, ascending.
    pub initial: Vec<(u64, u64, u64)>,
    pub ops: Vec<VmaOp>,
    /// Addresses inside the starting mappings (what the episodes leave as
    /// they found it, but for a protection change in progress).
    pub probes: Vec<u64>,
    /// The ops that write.
    pub writes: usize,
}

impl Trace {
    /// Every address an op names, for the agreement check.
    pub(crate) fn touched(&self) -> Vec<u64> {
        self.ops
            .iter()
            .flat_map(|op| match *op {
                VmaOp::Store { first, last, .. } | VmaOp::Erase { first, last } => [first, last],
                VmaOp::Load(at) => [at, at],
            })
            .collect()
    }
}

/// A simulated process: its window's base and its starting mappings.
struct Process {
    maps: Vec<(u64, u64, u64)>,
    heap: Option<usize>,
    /// The first address of its highest mapping: new mappings go below.
    top: u64,
    base: u64,
}

/// The highest `start` with `start..start + size` free in `lo..=hi`, as
/// the kernel's top-down search places a new mapping.
fn highest_free(model: &BTreeRanges, lo: u64, hi: u64, size: u64) -> Option<u64> {
    let mut end = hi;
    for (&first, &(last, _)) in model.0.range(..=hi).rev() {
        if last < end && end - last >= size {
            let start = end + 1 - size;
            return (start >= lo).then_some(start);
        }
        if first <= lo {
            return None;
        }
        end = end.min(first - 1);
    }
    (end >= lo && end - lo + 1 >= size).then(|| end + 1 - size)
}

/// Builds the replay: `processes` windows over `layouts`, `steps`
/// episodes. The ops are run on a model as they are drawn, so every
/// placement is free when it is made.
pub(crate) fn trace(layouts: &[Vec<Mapping>], processes: usize, steps: usize, seed: u64) -> Trace {
    assert!(!layouts.is_empty(), "a layout");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = BTreeRanges::new();
    let mut value = 0u64;
    let mut fresh = || {
        value += 1;
        value
    };
    let procs: Vec<Process> = (0..processes)
        .map(|p| {
            let base = (p as u64) << WINDOW_BITS;
            let layout = &layouts[p % layouts.len()];
            let maps: Vec<(u64, u64, u64)> = layout
                .iter()
                .map(|m| (base + m.first, base + m.last, fresh()))
                .collect();
            Process {
                heap: layout.iter().position(|m| m.heap),
                top: maps.last().map_or(base + USER_TOP, |m| m.0),
                maps,
                base,
            }
        })
        .collect();
    let initial: Vec<(u64, u64, u64)> = procs.iter().flat_map(|p| p.maps.clone()).collect();
    for &(first, last, v) in &initial {
        model.insert(first, last, v);
    }
    let sizes: Vec<u64> = initial
        .iter()
        .map(|&(first, last, _)| (last - first + 1).min(MAX_MMAP))
        .collect();
    let mut ops = Vec::new();
    let mut live: VecDeque<(u64, u64)> = VecDeque::new();
    let emit = |op: VmaOp, model: &mut BTreeRanges, ops: &mut Vec<VmaOp>| {
        op.apply(model, &mut 0);
        ops.push(op);
    };
    for _ in 0..steps {
        let p = &procs[rng.random_range(0..procs.len())];
        match rng.random_range(0..10) {
            0..4 => {
                let size = sizes[rng.random_range(0..sizes.len())];
                let lo = p.base + (1 << 32);
                if let Some(start) = highest_free(&model, lo, p.top - 1, size) {
                    let last = start + size - 1;
                    let v = fresh();
                    emit(
                        VmaOp::Store {
                            first: start,
                            last,
                            value: v,
                        },
                        &mut model,
                        &mut ops,
                    );
                    emit(VmaOp::Load(start), &mut model, &mut ops);
                    emit(VmaOp::Load(last), &mut model, &mut ops);
                    live.push_back((start, last));
                    if live.len() > LIVE_MMAPS {
                        let (first, last) = live.pop_front().expect("live mappings");
                        emit(VmaOp::Erase { first, last }, &mut model, &mut ops);
                    }
                }
            }
            4..7 => {
                let (first, last, v) = p.maps[rng.random_range(0..p.maps.len())];
                let pages = (last - first + 1) / PAGE;
                if pages >= 3 {
                    let start = rng.random_range(1..pages - 1);
                    let count = rng.random_range(1..pages - start);
                    let a = first + start * PAGE;
                    let b = a + count * PAGE - 1;
                    emit(
                        VmaOp::Store {
                            first: a,
                            last: b,
                            value: fresh(),
                        },
                        &mut model,
                        &mut ops,
                    );
                    emit(VmaOp::Load(a), &mut model, &mut ops);
                    emit(
                        VmaOp::Store {
                            first,
                            last,
                            value: v,
                        },
                        &mut model,
                        &mut ops,
                    );
                }
            }
            7 => {
                if let Some(h) = p.heap {
                    let (first, last, v) = p.maps[h];
                    let grown = last + rng.random_range(1..=32) * PAGE;
                    if model.0.range(last + 1..=grown).next().is_none() {
                        emit(
                            VmaOp::Store {
                                first,
                                last: grown,
                                value: v,
                            },
                            &mut model,
                            &mut ops,
                        );
                        emit(VmaOp::Load(grown), &mut model, &mut ops);
                        emit(
                            VmaOp::Erase {
                                first: last + 1,
                                last: grown,
                            },
                            &mut model,
                            &mut ops,
                        );
                    }
                }
            }
            _ => {
                if !live.is_empty() {
                    let k = rng.random_range(0..live.len());
                    let (first, last) = live[k];
                    if last - first + 1 >= 2 * PAGE {
                        let cut = last + 1 - PAGE;
                        emit(VmaOp::Erase { first: cut, last }, &mut model, &mut ops);
                        live[k] = (first, cut - 1);
                    }
                }
            }
        }
        for _ in 0..4 {
            let (first, last, _) = p.maps[rng.random_range(0..p.maps.len())];
            emit(
                VmaOp::Load(rng.random_range(first..=last)),
                &mut model,
                &mut ops,
            );
        }
    }
    let probes = (0..1 << 16)
        .map(|_| {
            let (first, last, _) = initial[rng.random_range(0..initial.len())];
            rng.random_range(first..=last)
        })
        .collect();
    let writes = ops
        .iter()
        .filter(|op| !matches!(op, VmaOp::Load(_)))
        .count();
    Trace {
        initial,
        ops,
        probes,
        writes,
    }
}

/// One replay of the trace on a fresh map: its ops/s, and the sum of its
/// values at every touched address afterwards.
struct Replay<'a> {
    trace: &'a Trace,
    touched: &'a [u64],
}

impl RangeStep for Replay<'_> {
    type Out = (f64, u64);
    fn step<T: RangeTable>(&self) -> Self::Out {
        let mut map = T::new();
        for &(first, last, value) in &self.trace.initial {
            map.insert(first, last, value);
        }
        let mut sink = 0;
        let began = Instant::now();
        for &op in &self.trace.ops {
            op.apply(&mut map, &mut sink);
        }
        let secs = began.elapsed().as_secs_f64();
        black_box(sink);
        (
            self.trace.ops.len() as f64 / secs,
            map.load_sum(self.touched),
        )
    }
}

impl Suite for MapleVma {
    type Opts = Opts;
    const NAME: &'static str = "maple-vma";
    const ABOUT: &'static str = "range maps replaying address-space changes (mmap, munmap, mprotect, brk, faults) built from this machine's /proc/*/maps";
    const DESCRIBE: &'static str = "The layouts of every readable `/proc/PID/maps` on this \
         machine (the bench's own first), one per simulated process (64 by default; layouts \
         repeat, as forked workers share one), each in its own 2^48 window of one map. A \
         seeded trace of episodes, each followed by four page faults (a load inside a random \
         real mapping of the process): `mmap` (4 in 10; a size drawn from the real \
         mappings', at most 64 MiB, placed top-down below the process's highest mapping; \
         the oldest of 256 live new mappings unmapped), `mprotect` of a page-aligned middle \
         part of a real mapping and its undo (3 in 10: a split in three, then the merge), \
         `brk` growth by 1-32 pages and its undo (1 in 10), a partial `munmap` of a new \
         mapping's last page (2 in 10). Each map replays the whole trace from the starting \
         layout, timed whole, one thread; the maps take turns, a fresh build each time. \
         `ops_per_sec` counts every op, loads included; after the replay every map must \
         agree at every address the trace named.";
    const BASELINE: &'static str = "btreemap";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let layouts = machine_layouts();
        let processes = opts.processes.unwrap_or(64.max(layouts.len())).max(1);
        let steps = opts
            .steps
            .unwrap_or(if ctx.quick() { 20_000 } else { 100_000 });
        let trace = trace(&layouts, processes, steps, SEED);
        let touched = trace.touched();
        let maps = if opts.no_peers { 1 } else { RANGE_TABLES.len() };
        ctx.set_steps(1);
        // Each map's repetitions run back to back within its turn, the
        // turns rotating over the maps.
        let replay = Replay {
            trace: &trace,
            touched: &touched,
        };
        let mut checks = vec![None; maps];
        let samples = in_turns(maps, ctx.reps(), |i| {
            let (rate, check) = step_at(i, &replay);
            checks[i] = Some(check);
            rate
        });
        assert!(
            checks.windows(2).all(|w| w[0] == w[1]),
            "the maps disagree after the replay: {checks:?}"
        );
        let c = case(&[
            ("processes", &processes),
            ("ranges", &trace.initial.len()),
            ("ops", &trace.ops.len()),
            ("writes", &trace.writes),
        ]);
        let s = ctx.suite();
        let recs: Vec<Record> = samples
            .iter()
            .enumerate()
            .map(|(i, rates)| {
                Record::stats(
                    s,
                    &c,
                    RANGE_TABLES[i],
                    &OPS_PER_SEC,
                    Stats::from_samples(rates),
                )
            })
            .collect();
        ctx.step();
        ctx.print(&recs);
        recs
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "maple-vma: ops/s replaying address-space changes from this machine's layouts",
            &[
                "processes",
                "ranges",
                "ops (writes)",
                "bpfmaps",
                "btreemap",
                "rangemap",
                "nodit",
                "bpfmaps/btreemap",
                "bpfmaps/rangemap",
            ],
        )
        .with_note("Speed ratio: above 1 means the maple tree replays faster.");
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        for c in cases {
            let get = |imp: &str| find(records, c, imp, OPS_PER_SEC.name);
            let cell =
                |imp: &str| get(imp).map_or("-".into(), |r| format!("{:.2} M", r.value / 1e6));
            let param = |k: &str| case_value(c, k).to_string();
            t.push(vec![
                param("processes"),
                param("ranges"),
                format!("{} ({})", param("ops"), param("writes")),
                cell(RANGE_TABLES[0]),
                cell(RANGE_TABLES[1]),
                cell(RANGE_TABLES[2]),
                cell(RANGE_TABLES[3]),
                fmt_ratio(ratio(get(RANGE_TABLES[0]), get(RANGE_TABLES[1]))),
                fmt_ratio(ratio(get(RANGE_TABLES[0]), get(RANGE_TABLES[2]))),
            ]);
        }
        vec![t]
    }
}

#[cfg(test)]
mod tests {
    use bpfmaps::maple::MapleTree;

    use super::*;

    #[test]
    fn parses_proc_maps_lines() {
        let text = "\
55d0c1a00000-55d0c1a02000 r--p 00000000 fe:00 1 /usr/bin/cat
55d0c2000000-55d0c2021000 rw-p 00000000 00:00 0                          [heap]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
not a line";
        let maps = parse_maps(text);
        assert_eq!(
            maps,
            vec![
                Mapping {
                    first: 0x55d0_c1a0_0000,
                    last: 0x55d0_c1a0_1fff,
                    heap: false
                },
                Mapping {
                    first: 0x55d0_c200_0000,
                    last: 0x55d0_c202_0fff,
                    heap: true
                },
            ]
        );
        assert!(!machine_layouts().is_empty(), "/proc/self/maps is read");
    }

    #[test]
    fn highest_free_places_top_down() {
        let mut model = BTreeRanges::new();
        model.insert(0x1000, 0x1fff, 1);
        model.insert(0x5000, 0x5fff, 2);
        assert_eq!(highest_free(&model, 0, 0x8fff, 0x1000), Some(0x8000));
        assert_eq!(highest_free(&model, 0, 0x5fff, 0x1000), Some(0x4000));
        assert_eq!(highest_free(&model, 0, 0x5fff, 0x3000), Some(0x2000));
        assert_eq!(highest_free(&model, 0x2800, 0x5fff, 0x3000), None);
    }

    #[test]
    fn replays_agree_with_the_model() {
        let layouts = machine_layouts();
        let trace = trace(&layouts, 4, 2000, 7);
        assert!(trace.writes > 0 && trace.ops.len() > trace.writes);
        let mut model = BTreeRanges::new();
        let mut tree = MapleTree::<u64>::new();
        for &(first, last, value) in &trace.initial {
            model.insert(first, last, value);
            RangeTable::insert(&mut tree, first, last, value);
        }
        let (mut a, mut b) = (0, 0);
        for &op in &trace.ops {
            op.apply(&mut model, &mut a);
            op.apply(&mut tree, &mut b);
        }
        assert_eq!(a, b, "the loads agree");
        let touched = trace.touched();
        for &at in &touched {
            assert_eq!(model.load(at), RangeTable::load(&tree, at), "at {at:#x}");
        }
    }

    #[test]
    fn runs_small() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let records = crate::suites::run_quick(
            "maple-vma",
            &["--processes", "4", "--steps", "500"],
            no_data,
        );
        assert_eq!(records.len(), 4);
        assert!(records.iter().all(|r| r.value > 0.0));
        let suite = crate::suites::by_name("maple-vma").unwrap();
        assert_eq!(suite.summaries(&records).len(), 1);
    }
}
