//! `maple-kernel`: the maple tree authors' benchmarks
//! (`lib/test_maple_tree.c`, the `bench_*` functions behind `BENCH_*`)
//! reproduced with [`MapleTree`], beside the kernel's own tree running
//! them (the native peer [`kernel_maple`], one process per run).
//!
//! Varies: the shape (one per kernel benchmark, named as the kernel names
//! it) and the implementation. Holds fixed: each shape's tree, loop and
//! values as in linux-source-6.12's `lib/test_maple_tree.c`; `u64` values
//! for the kernel's `xa_mk_value(i)`; one thread.
//!
//! The kernel's loop counts are fixed in its binaries, so the kernel runs
//! them whole; bpfmaps runs 1/`--scale-down` of each count per repetition
//! and both report time per operation. See [`MapleKernel`]'s `DESCRIBE`
//! for what each shape does on both sides.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bpfmaps::maple::MapleTree;
use bpfmaps::{Guard, pin};
use clap::Args;

use crate::measure::{in_turns, settle_reaper};
use crate::native::kernel_maple::{self, KernelMaple, Shape};
use crate::record::{NS_PER_OP, Record, case, case_value, find, ratio};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct MapleKernel;

/// The shapes' names, as the kernel's functions name them
/// (`bench_NAME`), in the source's order.
const SHAPE_NAMES: [&str; 9] = [
    "slot_store",
    "node_store",
    "awalk",
    "walk",
    "load",
    "mt_for_each",
    "mas_for_each",
    "mas_prev",
    "forking",
];

/// `maple-kernel` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Shapes to run [default: all].
    #[arg(long, value_delimiter = ',', value_parser = SHAPE_NAMES)]
    shapes: Vec<String>,
    /// Each repetition of a bpfmaps shape runs 1/N of the kernel's loop
    /// count (at least one iteration) [quick: 250; full: 50].
    #[arg(long)]
    scale_down: Option<u64>,
    /// Do not build or run the kernel's binaries.
    #[arg(long)]
    no_kernel: bool,
    /// Shapes the kernel's binaries run, of those run [quick: forking (the
    /// others run for seconds each); full: all].
    #[arg(long, value_delimiter = ',', value_parser = SHAPE_NAMES)]
    kernel_shapes: Vec<String>,
    /// Runs (processes) of each kernel binary [default: 1, so that the
    /// report stays within its time (a round of the nine binaries takes
    /// about 70 s here); docs/benchmarks.md's figures use 3].
    #[arg(long)]
    kernel_reps: Option<usize>,
    /// bpfmaps pins one guard per 256 `load`s and per `mt_for_each` pass
    /// (in place of `get`'s and `find_cloned`'s read section a call, as
    /// `mtree_load` and `mt_find` take the RCU read lock).
    #[arg(long)]
    guard_per_batch: bool,
}

/// One kernel benchmark: its name, binary, and timed loop's count.
#[derive(Debug, Clone, Copy)]
struct ShapeDef {
    name: &'static str,
    kernel: Shape,
    /// Iterations of the kernel's timed loop (`count`, or `nr_fork`).
    count: u64,
    /// Operations per iteration (as [`Shape::ops`] counts them).
    per_iter: u64,
}

/// Every shape, with the counts of linux-source-6.12's
/// `lib/test_maple_tree.c` (a test checks them against [`Shape::ops`]).
const SHAPES: [ShapeDef; 9] = [
    ShapeDef {
        name: "slot_store",
        kernel: Shape::SlotStore,
        count: 20_000_000,
        per_iter: 2,
    },
    ShapeDef {
        name: "node_store",
        kernel: Shape::NodeStore,
        count: 20_000_000,
        per_iter: 1,
    },
    ShapeDef {
        name: "awalk",
        kernel: Shape::Awalk,
        count: 50_000_000,
        per_iter: 1,
    },
    ShapeDef {
        name: "walk",
        kernel: Shape::Walk,
        count: 550_000_000,
        per_iter: 1,
    },
    ShapeDef {
        name: "load",
        kernel: Shape::Load,
        count: 550_000_000,
        per_iter: 1,
    },
    ShapeDef {
        name: "mt_for_each",
        kernel: Shape::MtForEach,
        count: 1_000_000,
        per_iter: ENTRIES_PER_PASS,
    },
    ShapeDef {
        name: "mas_for_each",
        kernel: Shape::MasForEach,
        count: 1_000_000,
        per_iter: ENTRIES_PER_PASS,
    },
    ShapeDef {
        name: "mas_prev",
        kernel: Shape::MasPrev,
        count: 1_000_000,
        per_iter: ENTRIES_PER_PASS,
    },
    ShapeDef {
        name: "forking",
        kernel: Shape::Fork,
        count: 80_000,
        per_iter: 1,
    },
];

fn case_of(shape: &str) -> String {
    case(&[("shape", &shape)])
}

// The kernel's constants, by function.

/// `bench_slot_store`: `brk_start`, `brk`, and `max` of its tree.
const BRK_START: u64 = 100;
const BRK: u64 = 105;
const SLOT_STORE_MAX: u64 = 1040;
/// `bench_node_store`: the first `overwrite`, its wrap, and `max`.
const OVERWRITE_FIRST: u64 = 76;
const OVERWRITE_WRAP: u64 = 135;
const NODE_STORE_MAX: u64 = 240;
/// `bench_awalk`, `bench_walk`, `bench_load`: `max` of the tree, and the
/// index walked, loaded, and cut out for the gap search.
const WALK_MAX: u64 = 2500;
const WALK_INDEX: u64 = 1470;
/// `bench_awalk`: `mas_empty_area_rev(&mas, 0, 2000, 10)`, and where the
/// area it finds starts (the top of the gap 1466..=1479 left by cutting
/// out 1470..=1475).
const AWALK_WINDOW: (u64, u64, u64) = (0, 2000, 10);
const AWALK_FOUND: u64 = 1470;
/// The iteration benchmarks: `max`, and the entries a pass visits (one
/// every 5 below it).
const ITER_MAX: u64 = 2500;
const ENTRIES_PER_PASS: u64 = ITER_MAX / 5;
/// `bench_forking`: `nr_entries` (the tree holds `nr_entries + 1`).
const FORK_ENTRIES: u64 = 134;

/// `mtree_store_range(mt, first, last, NULL)`: in the kernel, storing
/// NULL over a range deletes what the range covers, cutting the part of
/// any entry reaching past either end down to what is outside:
/// `MapleTree::erase_range`, one write.
fn store_null(tree: &MapleTree<u64>, first: u64, last: u64) {
    tree.erase_range(first, last).expect("a valid range");
}

/// `for (i = 0; i < max; i += step) mtree_store_range(mt, i, i + width(i),
/// xa_mk_value(i))`: the kernel benchmarks' trees.
fn stepped(max: u64, step: u64, width: impl Fn(u64) -> u64) -> MapleTree<u64> {
    let tree = MapleTree::new();
    for i in (0..max).step_by(step as usize) {
        tree.store_range(i, i + width(i), i).expect("a valid range");
    }
    tree
}

/// `MT_BUG_ON(mt, x)` as `lib/test_maple_tree.c` defines it without
/// `CONFIG_DEBUG_MAPLE_TREE`: two atomic counters, every check counted in
/// one and every pass in the other. The iteration benchmarks check each
/// entry they visit, so the kernel's loops pay the two atomic increments,
/// and so do these.
#[derive(Default)]
struct BugOn {
    run: AtomicU64,
    passed: AtomicU64,
}

impl BugOn {
    /// `MT_BUG_ON(mt, !ok)`.
    #[inline(always)]
    fn check(&self, ok: bool) {
        self.run.fetch_add(1, Ordering::Relaxed);
        if ok {
            self.passed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Panics unless every check passed and there were some.
    fn assert_passed(&self, shape: &str) {
        let (run, passed) = (
            self.run.load(Ordering::Relaxed),
            self.passed.load(Ordering::Relaxed),
        );
        assert!(run > 0, "{shape}: nothing checked");
        assert_eq!(passed, run, "{shape}: {passed} of {run} checks passed");
    }
}

/// One shape's tree and timed loop on bpfmaps.
trait Loop {
    /// Runs `iters` iterations of the kernel's timed loop.
    fn run(&mut self, iters: u64);
    /// Checks the tree and the loop's checks after the timings.
    fn verify(&self) {}
}

/// `bench_slot_store`; with `in_place`, its writes go through
/// [`MapleTree::exclusive`].
struct SlotStore(MapleTree<u64>, bool);

impl SlotStore {
    fn new(in_place: bool) -> Self {
        let tree = stepped(SLOT_STORE_MAX, 10, |_| 5);
        // The NULL store leaves exactly the kernel's tree.
        store_null(&tree, BRK, BRK);
        let g = pin();
        let below = tree.load(BRK - 1, &g).map(|e| (e.first, e.last, *e.value));
        assert_eq!(below, Some((BRK_START, BRK - 1, BRK_START)));
        assert!(tree.load(BRK, &g).is_none());
        assert_eq!(tree.len(), (SLOT_STORE_MAX / 10) as usize);
        drop(g);
        tree.store_range(BRK_START, BRK, BRK)
            .expect("a valid range");
        SlotStore(tree, in_place)
    }
}

impl Loop for SlotStore {
    fn run(&mut self, iters: u64) {
        if self.1 {
            let mut tree = self.0.exclusive();
            for _ in 0..iters {
                tree.erase_range(BRK, BRK).expect("a valid range");
                tree.store_range(BRK_START, BRK, BRK)
                    .expect("a valid range");
            }
            return;
        }
        let tree = &self.0;
        for _ in 0..iters {
            store_null(tree, BRK, BRK);
            tree.store_range(BRK_START, BRK, BRK)
                .expect("a valid range");
        }
    }

    fn verify(&self) {
        let g = pin();
        let e = self.0.load(BRK, &g).map(|e| (e.first, e.last, *e.value));
        assert_eq!(e, Some((BRK_START, BRK, BRK)), "slot_store");
        assert_eq!(self.0.len(), (SLOT_STORE_MAX / 10) as usize, "slot_store");
    }
}

/// `bench_node_store`: `overwrite` goes on from one run to the next, as
/// in the kernel's one loop.
struct NodeStore {
    tree: MapleTree<u64>,
    overwrite: u64,
    in_place: bool,
}

impl Loop for NodeStore {
    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            let o = self.overwrite;
            if self.in_place {
                self.tree.exclusive().store_range(o, o + 15, o)
            } else {
                self.tree.store_range(o, o + 15, o)
            }
            .expect("a valid range");
            self.overwrite += 5;
            if self.overwrite >= OVERWRITE_WRAP {
                self.overwrite = OVERWRITE_FIRST;
            }
        }
    }

    fn verify(&self) {
        // The last store is whole (76, 81, .. 131, then 76 again), and
        // the tree below 76 untouched.
        let last = match self.overwrite {
            OVERWRITE_FIRST => OVERWRITE_FIRST + 5 * ((OVERWRITE_WRAP - 1 - OVERWRITE_FIRST) / 5),
            o => o - 5,
        };
        let g = pin();
        let e = self
            .tree
            .load(last, &g)
            .map(|e| (e.first, e.last, *e.value));
        assert!(
            e.is_some_and(|(f, l, v)| l == f + 15 && v == f),
            "node_store: {e:?}"
        );
        let e = self.tree.load(70, &g).map(|e| (e.first, e.last, *e.value));
        assert_eq!(e, Some((70, 75, 70)), "node_store");
    }
}

/// `bench_awalk`: `mas_empty_area_rev` then `mas_reset`, so each search
/// starts at the root; the kernel's loop holds no lock, so one guard for
/// the run.
struct Awalk(MapleTree<u64>);

impl Awalk {
    fn new() -> Self {
        let tree = stepped(WALK_MAX, 10, |_| 5);
        store_null(&tree, WALK_INDEX, WALK_INDEX + 5);
        let (min, max, size) = AWALK_WINDOW;
        assert_eq!(
            tree.empty_area_rev(min, max, size, &pin()),
            Ok(AWALK_FOUND),
            "awalk"
        );
        Awalk(tree)
    }
}

impl Loop for Awalk {
    fn run(&mut self, iters: u64) {
        let g = pin();
        let (min, max, size) = AWALK_WINDOW;
        for _ in 0..iters {
            black_box(self.0.empty_area_rev(black_box(min), max, size, &g).ok());
        }
    }
}

/// `bench_walk`: `mas_walk` then `mas_reset`: a fresh cursor each time, so
/// each walk starts at the root; no lock in the kernel's loop, so one
/// guard for the run.
struct Walk(MapleTree<u64>);

impl Loop for Walk {
    fn run(&mut self, iters: u64) {
        let g = pin();
        for _ in 0..iters {
            // The index hidden before the cursor is made: `black_box` also
            // tells the compiler that any memory may change, so after it a
            // cursor made first is written out and read back (13.8-15.1 ns
            // against 10.7), which no caller pays.
            let index = black_box(WALK_INDEX);
            let mut mas = self.0.cursor(&g);
            black_box(mas.load(index).map(|e| *e.value));
        }
    }

    fn verify(&self) {
        let g = pin();
        let v = self.0.cursor(&g).load(WALK_INDEX).map(|e| *e.value);
        assert_eq!(v, Some(WALK_INDEX), "walk");
    }
}

/// `bench_load`: `mtree_load`, which takes the RCU read lock itself:
/// `get`, a read section a load, as `mtree_load`'s (or `load` under one
/// guard per 256 with `--guard-per-batch`).
struct Load {
    tree: MapleTree<u64>,
    per_call: bool,
}

impl Loop for Load {
    fn run(&mut self, iters: u64) {
        let load =
            |g: &Guard| black_box(self.tree.load(black_box(WALK_INDEX), g).map(|e| *e.value));
        if self.per_call {
            for _ in 0..iters {
                black_box(self.tree.get(black_box(WALK_INDEX)).map(|(_, v)| v));
            }
        } else {
            let mut left = iters;
            while left > 0 {
                let n = left.min(BATCH as u64);
                let g = pin();
                for _ in 0..n {
                    load(&g);
                }
                left -= n;
            }
        }
    }

    fn verify(&self) {
        let v = self.tree.load(WALK_INDEX, &pin()).map(|e| *e.value);
        assert_eq!(v, Some(WALK_INDEX), "load");
        assert_eq!(self.tree.get(WALK_INDEX), Some((1470..=1475, 1470)), "get");
    }
}

/// `bench_mt_for_each`: `mt_for_each` is `mt_find` then `mt_find_after`
/// in a loop, each a walk from the root under its own RCU read lock:
/// `find_cloned` (a read section a call, from the root), or `find` under
/// one guard per pass with `--guard-per-batch`, `index` moved past each
/// entry found.
struct MtForEach {
    tree: MapleTree<u64>,
    per_call: bool,
    bug: BugOn,
}

impl MtForEach {
    /// `mt_find(mt, &index, max)`: the entry, with `index` moved past it;
    /// under `guard`, or in a read section of its own.
    #[inline(always)]
    fn mt_find(&self, index: &mut u64, guard: Option<&Guard>) -> Option<u64> {
        if *index > ITER_MAX {
            return None;
        }
        let (last, v) = match guard {
            Some(g) => self
                .tree
                .find(*index, ITER_MAX, g)
                .map(|e| (e.last, *e.value)),
            None => self
                .tree
                .find_cloned(*index, ITER_MAX)
                .map(|(r, v)| (*r.end(), v)),
        }?;
        *index = last.wrapping_add(1);
        Some(v)
    }
}

impl Loop for MtForEach {
    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            let mut j = 0u64;
            let mut index = 0u64;
            let pass = (!self.per_call).then(pin);
            while let Some(v) = self.mt_find(&mut index, pass.as_ref()) {
                self.bug.check(v == j);
                j += 5;
                // mt_find_after: stop once index wrapped.
                if index == 0 {
                    break;
                }
            }
        }
    }

    fn verify(&self) {
        self.bug.assert_passed("mt_for_each");
    }
}

/// `bench_mas_for_each`: `mas_for_each` (`mas_find` to `max`) under one
/// RCU read lock, then `mas_set(&mas, 0)`: a fresh cursor per pass (the
/// first find walks from the root), `next` for `mas_find`; one guard for
/// the run.
struct MasForEach {
    tree: MapleTree<u64>,
    bug: BugOn,
}

impl Loop for MasForEach {
    fn run(&mut self, iters: u64) {
        let g = pin();
        for _ in 0..iters {
            let mut j = 0u64;
            let mut mas = self.tree.cursor(&g);
            let mut entry = mas.seek_at_or_after(0);
            while let Some(e) = entry.filter(|e| e.first <= ITER_MAX) {
                self.bug.check(*e.value == j);
                j += 5;
                entry = mas.next();
            }
        }
    }

    fn verify(&self) {
        self.bug.assert_passed("mas_for_each");
    }
}

/// `bench_mas_prev`: `mas_set(&mas, ULONG_MAX)`, then `mas_prev(&mas, 0)`
/// until NULL, under one RCU read lock: a fresh cursor per pass placed on
/// the last entry (`seek_at_or_before(u64::MAX)`, the first `mas_prev`),
/// then `prev`; one guard for the run.
struct MasPrev {
    tree: MapleTree<u64>,
    bug: BugOn,
}

impl Loop for MasPrev {
    fn run(&mut self, iters: u64) {
        let g = pin();
        for _ in 0..iters {
            let mut j = ITER_MAX - 5;
            let mut mas = self.tree.cursor(&g);
            let mut entry = mas.seek_at_or_before(u64::MAX);
            while let Some(e) = entry {
                self.bug.check(*e.value == j);
                j = j.wrapping_sub(5);
                entry = mas.prev();
            }
        }
    }

    fn verify(&self) {
        self.bug.assert_passed("mas_prev");
    }
}

/// `__mt_dup`: `MapleTree::dup`, which copies node by node as the
/// kernel's does.
fn dup(tree: &MapleTree<u64>) -> MapleTree<u64> {
    tree.dup()
}

/// `bench_forking`: per fork, a copy of the 135-entry tree ([`dup`]),
/// every entry of the copy stored again over itself in one walk
/// (`mas_for_each` + `mas_store`), and the copy dropped
/// (`__mt_destroy`). With `in_place`, through [`MapleTree::exclusive`]:
/// one cursor walk storing each value where it lies (`for_each_mut`).
struct Forking(MapleTree<u64>, bool);

impl Forking {
    fn new(in_place: bool) -> Self {
        let tree = MapleTree::new();
        for i in 0..=FORK_ENTRIES {
            tree.store_range(i * 10, i * 10 + 5, i)
                .expect("a valid range");
        }
        let copy = dup(&tree);
        let (g, h) = (pin(), pin());
        assert!(tree.iter(&g).eq(copy.iter(&h)), "forking: the copy differs");
        assert_eq!(copy.len(), FORK_ENTRIES as usize + 1);
        Forking(tree, in_place)
    }
}

impl Loop for Forking {
    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            let mut newmt = dup(&self.0);
            if self.1 {
                // mas_for_each + mas_store of each entry over its own
                // range: one cursor, each value stored where it lies.
                newmt.exclusive().for_each_mut(|_, v| *v = black_box(*v));
            } else {
                let g = pin();
                for e in newmt.iter(&g) {
                    newmt
                        .store_range(e.first, e.last, *e.value)
                        .expect("a valid range");
                }
            }
            black_box(newmt.len());
            drop(newmt);
        }
    }

    fn verify(&self) {
        assert_eq!(self.0.len(), FORK_ENTRIES as usize + 1, "forking");
    }
}

/// The implementation name of the in-place runs.
const IN_PLACE: &str = "bpfmaps-in-place";

/// The shapes that write, run twice: shared (copy on write) and in place.
const WRITE_SHAPES: [Shape; 3] = [Shape::SlotStore, Shape::NodeStore, Shape::Fork];

/// `shape`'s tree, built as its kernel function builds it, and its loop;
/// with `in_place`, writes through [`MapleTree::exclusive`].
fn prepare(shape: &ShapeDef, per_call: bool, in_place: bool) -> Box<dyn Loop> {
    let walk_tree = || stepped(WALK_MAX, 10, |_| 5);
    match shape.kernel {
        Shape::SlotStore => Box::new(SlotStore::new(in_place)),
        Shape::NodeStore => Box::new(NodeStore {
            tree: stepped(NODE_STORE_MAX, 10, |_| 5),
            overwrite: OVERWRITE_FIRST,
            in_place,
        }),
        Shape::Awalk => Box::new(Awalk::new()),
        Shape::Walk => Box::new(Walk(walk_tree())),
        Shape::Load => Box::new(Load {
            tree: walk_tree(),
            per_call,
        }),
        Shape::MtForEach => Box::new(MtForEach {
            tree: stepped(ITER_MAX, 5, |_| 4),
            per_call,
            bug: BugOn::default(),
        }),
        // One entry in six ends an index early, leaving a gap.
        Shape::MasForEach => Box::new(MasForEach {
            tree: stepped(ITER_MAX, 5, |i| if i % 30 == 0 { 3 } else { 4 }),
            bug: BugOn::default(),
        }),
        Shape::MasPrev => Box::new(MasPrev {
            tree: stepped(ITER_MAX, 5, |i| if i % 30 == 0 { 3 } else { 4 }),
            bug: BugOn::default(),
        }),
        Shape::Fork => Box::new(Forking::new(in_place)),
    }
}

/// One timed thing: a bpfmaps shape's loop, or a kernel binary.
enum Runner<'a> {
    Bpfmaps {
        shape: &'static ShapeDef,
        /// `bpfmaps`, or `bpfmaps-in-place` for writes through
        /// `exclusive`.
        name: &'static str,
        bench: Box<dyn Loop>,
        iters: u64,
    },
    Kernel {
        shape: &'static ShapeDef,
        maple: &'a KernelMaple,
        /// Why a run failed: no more runs, and no record.
        failed: Option<String>,
    },
}

impl Runner<'_> {
    fn shape(&self) -> &'static ShapeDef {
        match self {
            Runner::Bpfmaps { shape, .. } | Runner::Kernel { shape, .. } => shape,
        }
    }

    /// One sample: nanoseconds per operation, or NaN for a kernel run that
    /// failed (now or before).
    fn sample(&mut self, ctx: &Ctx) -> f64 {
        match self {
            Runner::Bpfmaps {
                shape,
                bench,
                iters,
                ..
            } => {
                let start = Instant::now();
                bench.run(*iters);
                let elapsed = start.elapsed();
                // Nodes handed to the reaper are freed before the next
                // sample, not during it.
                settle_reaper();
                elapsed.as_nanos() as f64 / (*iters * shape.per_iter) as f64
            }
            Runner::Kernel {
                shape,
                maple,
                failed,
            } => {
                if failed.is_some() {
                    return f64::NAN;
                }
                match maple.run(shape.kernel) {
                    Ok(time) => shape.kernel.ns_per_op(time),
                    Err(e) => {
                        ctx.note(&format!(
                            "kernel {}: run failed, no record: {}",
                            shape.name,
                            e.lines().next().unwrap_or("")
                        ));
                        *failed = Some(e);
                        f64::NAN
                    }
                }
            }
        }
    }
}

/// Shape names from an option, or `default`, in [`SHAPES`]' order.
fn shapes_of(given: &[String], default: &[&str]) -> Vec<&'static ShapeDef> {
    let chosen: Vec<&str> = if given.is_empty() {
        default.to_vec()
    } else {
        given.iter().map(String::as_str).collect()
    };
    SHAPES.iter().filter(|s| chosen.contains(&s.name)).collect()
}

impl Suite for MapleKernel {
    type Opts = Opts;
    const NAME: &'static str = "maple-kernel";
    const ABOUT: &'static str = "the maple tree authors' benchmarks (lib/test_maple_tree.c bench_*) on MapleTree beside the kernel's tree built from linux-source-6.12: ns per op";

    const DESCRIBE: &'static str = "The benchmark functions of linux-source-6.12's \
         `lib/test_maple_tree.c`, each reproduced with `bpfmaps::maple::MapleTree<u64>` \
         (`u64` values for the kernel's `xa_mk_value(i)`), and run by the kernel's own \
         tree (`kernel`: `lib/maple_tree.c` in the kernel's userspace harness \
         `tools/testing/radix-tree`, built at `-O2` without `CONFIG_DEBUG_MAPLE_TREE`, \
         one binary per `BENCH_*`, one process per run (`--kernel-reps`, 1 by default: a round of the nine takes about 70 s), timed whole from spawn \
         to exit and divided by its loop's operations, so start-up, the tree's build \
         and exit are in its time). Each kernel tree is a plain `MT_FLAGS_ALLOC_RANGE` \
         one, not in RCU mode, so its stores rewrite nodes in place where they can \
         and free replaced nodes at once; bpfmaps always writes copy-on-write for its \
         lock-free readers and frees through epochs. bpfmaps builds the same tree \
         (untimed) and times the same loop with 1/`--scale-down` of its count per \
         repetition (50 by default, 250 with `--quick`), the shapes and the kernel's \
         runs timed in turns. Shapes (case `shape`): \
         `slot_store`: 104 entries `i..=i+5` (i = 0, 10, .. 1030); the loop stores NULL \
         over 105..=105 (cutting the entry 100..=105 down to 100..=104) and stores \
         100..=105 again; 2 ops an iteration. The NULL store is `erase_range(105, \
         105)`. \
         `node_store`: 24 entries `i..=i+5` (i < 240); the loop stores `o..=o+15`, o \
         from 76 up by 5, back to 76 at 135: each store covers several entries \
         (`store_range`). \
         `awalk`: 250 entries `i..=i+5` (i < 2500), 1470..=1475 then removed \
         (`erase`); the loop is `mas_empty_area_rev(0, 2000, 10)` and `mas_reset` \
         (`empty_area_rev(0, 2000, 10)`, which must answer 1470). \
         `walk`: the same 250 entries; `mas_walk` to 1470 and `mas_reset` (a fresh \
         `cursor` and its `load(1470)`, so each walk starts at the root). \
         `load`: the same; `mtree_load(1470)` (`get`, a read section a call, as \
         `mtree_load` takes the RCU read lock itself; `load` under one guard per 256 \
         with `--guard-per-batch`). \
         `mt_for_each`: 500 entries `i..=i+4` (i = 0, 5, .. 2495); a pass is \
         `mt_for_each(.., 2500)`, `mt_find` then `mt_find_after` until NULL, each a \
         walk from the root under its own RCU read lock (`find_cloned(index, 2500)`, \
         a read section a call; `find` under one guard per pass with \
         `--guard-per-batch`; `index` moved past the entry found); op = entry visited. \
         `mas_for_each`: 500 entries, every sixth one index shorter (gaps); a pass is \
         `mas_for_each(.., 2500)` then `mas_set(0)`, all under one RCU read lock (a \
         fresh `cursor`, `seek_at_or_after(0)`, then `next` to 2500, under one \
         guard); op = entry visited. \
         `mas_prev`: the same tree; a pass is `mas_set(ULONG_MAX)` then \
         `mas_prev(.., 0)` until NULL (a fresh cursor, `seek_at_or_before(u64::MAX)`, \
         then `prev`); op = entry visited. In the three iteration shapes both sides \
         check every entry's value with the kernel's `MT_BUG_ON` (two atomic \
         increments). \
         `forking`: 135 entries `10i..=10i+5`; per fork, `__mt_dup` of the tree, \
         `mas_for_each` over the copy storing each entry over itself (`mas_store`), \
         and `__mt_destroy`; op = fork. The copy is `MapleTree::dup` (a node-by-node \
         copy, as `__mt_dup`); then a walk of the copy storing each entry \
         over itself, and `drop`.";

    const BASELINE: &'static str = "kernel";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let shapes = shapes_of(&opts.shapes, &SHAPE_NAMES);
        let scale_down = opts
            .scale_down
            .unwrap_or(if ctx.quick() { 250 } else { 50 })
            .max(1);
        let reps = ctx.reps();
        let kernel_reps = opts.kernel_reps.unwrap_or(1).max(1);
        let kernel_shapes: Vec<&'static ShapeDef> = if opts.no_kernel {
            Vec::new()
        } else {
            let default: &[&str] = if ctx.quick() {
                &["forking"]
            } else {
                &SHAPE_NAMES
            };
            shapes_of(&opts.kernel_shapes, default)
                .into_iter()
                .filter(|s| shapes.iter().any(|t| t.name == s.name))
                .collect()
        };
        let maple = if kernel_shapes.is_empty() {
            if !opts.no_kernel && !shapes.is_empty() {
                ctx.note("kernel: no shape selected for the kernel's binaries");
            }
            None
        } else {
            let wanted: Vec<Shape> = kernel_shapes.iter().map(|s| s.kernel).collect();
            match kernel_maple::build_shapes(&kernel_maple::default_cache_dir(), &wanted) {
                Ok(m) => Some(m),
                Err(e) => {
                    ctx.note(&format!(
                        "kernel: skipped, its binaries did not build: {}",
                        e.lines().next().unwrap_or("")
                    ));
                    None
                }
            }
        };

        let mut runners: Vec<Runner> = shapes
            .iter()
            .flat_map(|&shape| {
                let ways: &[bool] = if WRITE_SHAPES.contains(&shape.kernel) {
                    &[false, true]
                } else {
                    &[false]
                };
                ways.iter().map(move |&in_place| (shape, in_place))
            })
            .map(|(shape, in_place)| {
                let iters = (shape.count / scale_down).max(1);
                let mut bench = prepare(shape, !opts.guard_per_batch, in_place);
                // Warm-up: a quarter of a repetition, untimed.
                bench.run((iters / 4).max(1));
                settle_reaper();
                Runner::Bpfmaps {
                    shape,
                    name: if in_place { IN_PLACE } else { "bpfmaps" },
                    bench,
                    iters,
                }
            })
            .collect();
        if let Some(maple) = &maple {
            runners.extend(kernel_shapes.iter().map(|&shape| Runner::Kernel {
                shape,
                maple,
                failed: None,
            }));
        }
        let limits: Vec<usize> = runners
            .iter()
            .map(|r| match r {
                Runner::Bpfmaps { .. } => reps,
                Runner::Kernel { .. } => kernel_reps,
            })
            .collect();
        let total: usize = limits.iter().sum();
        ctx.set_steps(total as u64);
        let mut taken = vec![0usize; runners.len()];
        let samples = in_turns(runners.len(), reps.max(kernel_reps), |i| {
            if taken[i] == limits[i] {
                return f64::NAN;
            }
            taken[i] += 1;
            let s = runners[i].sample(ctx);
            ctx.step();
            s
        });

        let mut records = Vec::new();
        for shape in &shapes {
            for (r, samples) in runners.iter().zip(&samples) {
                if r.shape().name != shape.name {
                    continue;
                }
                let name = match r {
                    Runner::Bpfmaps { bench, name, .. } => {
                        bench.verify();
                        *name
                    }
                    Runner::Kernel {
                        failed: Some(_), ..
                    } => continue,
                    Runner::Kernel { .. } => "kernel",
                };
                let kept: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
                records.push(Record::stats(
                    ctx.suite(),
                    &case_of(shape.name),
                    name,
                    &NS_PER_OP,
                    Stats::from_samples(&kept),
                ));
            }
        }
        ctx.print(&records);
        records
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "maple-kernel: ns per operation, MapleTree vs the kernel's maple tree, on the kernel's benchmark shapes",
            &[
                "shape",
                "one op",
                "bpfmaps ns/op",
                "in place ns/op",
                "kernel ns/op",
                "kernel/bpfmaps",
                "kernel/in place",
            ],
        )
        .with_note(
            "Medians over repetitions. kernel/bpfmaps is the kernel's time per op over bpfmaps': \
             above 1 means bpfmaps is faster. The kernel's times are whole processes (start-up, \
             the tree's build and exit included) over its loop's operations; bpfmaps' are the \
             loop alone, on 1/--scale-down of the kernel's count. slot_store's NULL store is \
             `erase_range`; forking's copy is `MapleTree::dup`.",
        );
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        for c in cases {
            let name = case_value(c, "shape");
            let op = SHAPES
                .iter()
                .find(|s| s.name == name)
                .map_or("?", |s| s.kernel.op());
            let ns = |imp: &str| find(records, c, imp, NS_PER_OP.name);
            let fmt = |r: Option<&Record>| r.map_or("-".into(), |r| fmt_ns(r.value));
            t.push(vec![
                name.to_string(),
                op.to_string(),
                fmt(ns("bpfmaps")),
                fmt(ns(IN_PLACE)),
                fmt(ns("kernel")),
                fmt_ratio(ratio(ns("kernel"), ns("bpfmaps"))),
                fmt_ratio(ratio(ns("kernel"), ns(IN_PLACE))),
            ]);
        }
        vec![t]
    }
}

/// `12.3`, or `12345` for the large per-fork times.
fn fmt_ns(ns: f64) -> String {
    if ns >= 1000.0 {
        format!("{ns:.0}")
    } else {
        format!("{ns:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_the_kernel_binaries() {
        for s in &SHAPES {
            assert_eq!(s.count * s.per_iter, s.kernel.ops(), "{}", s.name);
        }
        let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        assert_eq!(names, SHAPE_NAMES);
    }

    /// Every shape, quick, with tiny counts and without the kernel's
    /// binaries (they run for seconds each): the loops check themselves
    /// and the table builds.
    #[test]
    fn runs_small_without_the_kernel() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        for extra in [&[][..], &["--guard-per-batch"][..]] {
            let mut args = vec!["--no-kernel", "--scale-down", "200000"];
            args.extend_from_slice(extra);
            let records = crate::suites::run_quick("maple-kernel", &args, no_data.clone());
            // The write shapes run twice: shared and in place.
            assert_eq!(records.len(), SHAPES.len() + WRITE_SHAPES.len());
            for s in &SHAPES {
                let r = find(&records, &case_of(s.name), "bpfmaps", NS_PER_OP.name);
                assert!(r.is_some_and(|r| r.value > 0.0), "{}", s.name);
                let in_place = find(&records, &case_of(s.name), IN_PLACE, NS_PER_OP.name);
                assert_eq!(
                    in_place.is_some_and(|r| r.value > 0.0),
                    WRITE_SHAPES.contains(&s.kernel),
                    "{} in place",
                    s.name
                );
            }
            let suite = crate::suites::by_name("maple-kernel").unwrap();
            let tables = suite.summaries(&records);
            assert_eq!(tables.len(), 1);
            assert!(tables[0].to_text().contains("mas_prev"));
        }
    }

    /// The NULL store cuts an entry as the kernel's does, at either end or
    /// in the middle.
    #[test]
    fn null_store_cuts_entries() {
        let tree = stepped(100, 10, |_| 5);
        store_null(&tree, 23, 23);
        store_null(&tree, 40, 41);
        store_null(&tree, 64, 65);
        store_null(&tree, 70, 75);
        let g = pin();
        let got: Vec<(u64, u64, u64)> = tree
            .range(20..80, &g)
            .map(|e| (e.first, e.last, *e.value))
            .collect();
        assert_eq!(
            got,
            [
                (20, 22, 20),
                (24, 25, 20),
                (30, 35, 30),
                (42, 45, 40),
                (50, 55, 50),
                (60, 63, 60)
            ]
        );
    }
}
