//! `stackmap`: how many samples `StackTraceMap::get_stackid` loses to
//! bucket collisions under each [`StackHash`], against what a uniform hash
//! would lose, and how fast it re-finds stacks it already holds.
//!
//! Varies: the hash and the load (distinct stacks offered per bucket).
//! Holds fixed: 2^17 buckets (`max_entries` 131072), `max_depth` 127, flags
//! 0 (no `BPF_F_REUSE_STACKID`, no `BPF_F_FAST_STACK_CMP`), and the stacks:
//! generated, deterministic for a seed (see [`CallGraph`]).
//!
//! With one stack per bucket and no reuse, a stack whose bucket is taken is
//! lost (`EEXIST`). For a uniform hash, `N` distinct stacks in `B` buckets
//! occupy `B (1 - e^{-N/B})` buckets on average, so the expected fraction
//! lost is `1 - (1 - e^{-load}) / load` with `load = N / B`; the summary
//! shows it with its spread (two standard deviations of the occupied count).
//!
//! At each load every hash's map is built fresh and kept; their
//! `get_stackid` loops are then timed in interleaved turns, after bpfmaps'
//! reaper thread has freed the previous load's maps, so the timing does not
//! share the CPU with those frees.

use std::collections::HashSet;
use std::hint::black_box;
use std::ops::RangeInclusive;

use bpfmaps::stackmap::{StackHash, StackTraceMap};
use bpfmaps::{Error, Map};
use clap::{Args, value_parser};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::measure::{rate_samples_interleaved, settle_reaper};
use crate::plot::LinePlot;
use crate::record::{
    COLLISION_RATE, MEM_REPORTED, Record, STACK_COLLISIONS, STACKIDS_PER_SEC, case, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct StackMap;

/// `stackmap` options; an empty list means the defaults for the mode.
#[derive(Debug, Args)]
pub struct Opts {
    /// Buckets as a power of two: `max_entries` is 2^this.
    #[arg(long, default_value_t = 17, value_parser = value_parser!(u32).range(6..=22))]
    buckets_log2: u32,
    /// Distinct stacks offered, in percent of the buckets [quick: 50,80; full: 10,25,50,80,100].
    #[arg(long, value_delimiter = ',', value_parser = value_parser!(u32).range(1..=100))]
    loads: Vec<u32>,
    /// Seed of the call graph and the walks over it.
    #[arg(long, default_value_t = 0x57ac_6e1d)]
    seed: u64,
}

/// Hashes in report order; the first is the kernel's and the baseline.
const HASHES: [(StackHash, &str); 3] = [
    (StackHash::Jhash2, "jhash2"),
    (StackHash::Xxh3, "xxh3"),
    (StackHash::SipHash, "siphash"),
];
/// The implementation name of the uniform-hash expectation.
const THEORY: &str = "uniform(theory)";
/// `max_depth` of the maps: the kernel's default `perf_event_max_stack`.
const MAX_DEPTH: u32 = 127;

/// Where the synthetic kernel text starts.
const TEXT_BASE: u64 = 0xffff_ffff_8100_0000;
/// Bytes per function.
const FN_SIZE: u64 = 0x40;
/// Functions in the call graph.
const FUNCTIONS: u32 = 16_384;
/// Functions that start stacks (entry points); they are never called.
const ROOTS: u32 = 32;
/// Callees per function.
const CALLEES: RangeInclusive<usize> = 4..=16;
/// Frames per stack.
const DEPTH: RangeInclusive<usize> = 5..=40;

/// A random call graph: every function calls a fixed set of 4 to 16
/// others (recursion included), from distinct call sites. A stack is a walk
/// from a root, each step taking callee `j` of the caller's set with
/// probability about proportional to `1 / (j + 1)` (hot paths), so stacks
/// share long prefixes and often differ only in the last frames, as real
/// profiles do.
///
/// Frame addresses are `TEXT_BASE + function * 0x40 + offset`: a caller's
/// frame is the return address of the call site (`4 + 3 * j` for callee
/// `j`), the leaf's a sampled instruction anywhere in the function. Stacks
/// are stored innermost (leaf) frame first, as the kernel stores them.
struct CallGraph {
    callees: Vec<Vec<u32>>,
}

impl CallGraph {
    fn new(rng: &mut StdRng) -> CallGraph {
        let callees = (0..FUNCTIONS)
            .map(|_| {
                let k = rng.random_range(CALLEES);
                (0..k).map(|_| rng.random_range(ROOTS..FUNCTIONS)).collect()
            })
            .collect();
        CallGraph { callees }
    }

    /// A random stack into `out`, innermost frame first.
    fn walk(&self, rng: &mut StdRng, out: &mut Vec<u64>) {
        out.clear();
        let depth = rng.random_range(DEPTH);
        let mut f = rng.random_range(0..ROOTS);
        for _ in 1..depth {
            let calls = &self.callees[f as usize];
            let j = skewed(rng, calls.len());
            out.push(fn_addr(f) + 4 + 3 * j as u64);
            f = calls[j];
        }
        out.push(fn_addr(f) + rng.random_range(0..FN_SIZE));
        out.reverse();
    }
}

fn fn_addr(f: u32) -> u64 {
    TEXT_BASE + u64::from(f) * FN_SIZE
}

/// An index in `0..len`, `j` with probability `log((j + 2) / (j + 1)) /
/// log(len + 1)`: about `1 / (j + 1)`, normalised.
fn skewed(rng: &mut StdRng, len: usize) -> usize {
    let u: f64 = rng.random();
    ((((len + 1) as f64).powf(u) - 1.0) as usize).min(len - 1)
}

/// Distinct stacks back to back.
struct Stacks {
    frames: Vec<u64>,
    ends: Vec<usize>,
}

impl Stacks {
    /// `count` distinct stacks walked from one call graph, in walk order.
    fn generate(count: usize, seed: u64) -> Stacks {
        let mut rng = StdRng::seed_from_u64(seed);
        let graph = CallGraph::new(&mut rng);
        let mut seen: HashSet<Box<[u64]>> = HashSet::with_capacity(count);
        let mut stacks = Stacks {
            frames: Vec::new(),
            ends: Vec::with_capacity(count),
        };
        let mut buf = Vec::new();
        let mut walks = 0usize;
        while stacks.len() < count {
            walks += 1;
            assert!(
                walks <= 100 * count,
                "call graph too small for {count} stacks"
            );
            graph.walk(&mut rng, &mut buf);
            if seen.insert(buf.as_slice().into()) {
                stacks.frames.extend_from_slice(&buf);
                stacks.ends.push(stacks.frames.len());
            }
        }
        stacks
    }

    /// Stacks `order`, in that order, copied back to back.
    fn pick(&self, order: &[usize]) -> Stacks {
        let mut out = Stacks {
            frames: Vec::new(),
            ends: Vec::with_capacity(order.len()),
        };
        for &i in order {
            out.frames.extend_from_slice(self.get(i));
            out.ends.push(out.frames.len());
        }
        out
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    #[inline]
    fn get(&self, i: usize) -> &[u64] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.frames[start..self.ends[i]]
    }
}

/// Expected fraction of `n` distinct items that find their bucket taken
/// (one item per bucket) among `b` buckets under a uniform hash, and the
/// standard deviation of that fraction.
fn uniform_collisions(n: usize, b: usize) -> (f64, f64) {
    let (n, b) = (n as f64, b as f64);
    let load = n / b;
    let mean = 1.0 - (1.0 - (-load).exp()) / load;
    // Empty buckets E: Var = b(b-1)(1-2/b)^n + b(1-1/b)^n - b^2(1-1/b)^2n.
    let p1 = (n * (-1.0 / b).ln_1p()).exp();
    let p2 = (n * (-2.0 / b).ln_1p()).exp();
    let var = b * (b - 1.0) * p2 + b * p1 - b * b * p1 * p1;
    (mean, var.max(0.0).sqrt() / n)
}

fn case_of(buckets: usize, load: u32) -> String {
    case(&[("buckets", &buckets), ("load", &format!("{load}%"))])
}

fn load_of(r: &Record) -> Option<f64> {
    r.param("load")?.trim_end_matches('%').parse().ok()
}

/// One hash's map, filled and kept for the timing.
struct Kept {
    name: &'static str,
    map: StackTraceMap,
    /// The stacks it stored, shuffled, copied back to back.
    queries: Stacks,
    /// The id of each of `queries`.
    ids: Vec<u32>,
    /// `get_stackid` calls that answered `EEXIST`.
    exists: u64,
}

/// Offers the first `n` stacks to a fresh map with `hash`, once each;
/// keeps the map with the stacks it stored, to re-offer.
fn fill(stacks: &Stacks, n: usize, buckets: usize, hash: StackHash, name: &'static str) -> Kept {
    let map = StackTraceMap::with_hash(MAX_DEPTH, buckets as u32, hash).expect("creating the map");
    let mut stored: Vec<(usize, u32)> = Vec::with_capacity(n);
    let mut exists = 0u64;
    for i in 0..n {
        match map.get_stackid(stacks.get(i), 0) {
            Ok(id) => stored.push((i, id)),
            Err(Error::Exists) => exists += 1,
            Err(e) => panic!("get_stackid: {e}"),
        }
    }
    assert_eq!(map.collisions(), exists, "collisions() counts EEXIST");
    assert_eq!(map.stacks(), stored.len(), "one stored stack per Ok");
    assert!(!stored.is_empty(), "a fresh map stores the first stack");

    // Re-offered in a shuffled order, as samples arrive, but copied back to
    // back so that the loop measures the map, not fetching the query.
    stored.shuffle(&mut StdRng::seed_from_u64(n as u64));
    let order: Vec<usize> = stored.iter().map(|&(i, _)| i).collect();
    Kept {
        name,
        map,
        queries: stacks.pick(&order),
        ids: stored.iter().map(|&(_, id)| id).collect(),
        exists,
    }
}

/// The loop re-offering `k`'s stored stacks, boxed: one dynamic call per
/// batch of [`BATCH`] `get_stackid` calls.
fn reoffer(k: &Kept) -> Box<dyn FnMut() -> u64 + '_> {
    let mut cursor = 0;
    Box::new(move || {
        let mut lost = 0usize;
        for _ in 0..BATCH {
            let id = k.ids[cursor];
            if k.map.get_stackid(black_box(k.queries.get(cursor)), 0) != Ok(id) {
                lost += 1;
            }
            cursor = if cursor + 1 == k.ids.len() {
                0
            } else {
                cursor + 1
            };
        }
        assert_eq!(lost, 0, "a stored stack must keep its id");
        BATCH as u64
    })
}

/// Times every kept map's re-offering loop in turns; each one's records.
fn measure(ctx: &Ctx, kept: &[Kept], n: usize, c: &str) -> Vec<Record> {
    // The maps of the previous load may still be being freed.
    settle_reaper();
    let rates = {
        let mut loops: Vec<_> = kept.iter().map(reoffer).collect();
        rate_samples_interleaved(ctx.plan(), &mut loops)
    };
    let suite = ctx.suite();
    let mut recs = Vec::new();
    for (k, samples) in kept.iter().zip(rates) {
        let name = k.name;
        recs.extend([
            Record::stats(
                suite,
                c,
                name,
                &STACKIDS_PER_SEC,
                Stats::from_samples(&samples),
            ),
            Record::single(suite, c, name, &COLLISION_RATE, k.exists as f64 / n as f64),
            Record::single(suite, c, name, &STACK_COLLISIONS, k.exists as f64),
            Record::single(suite, c, name, &MEM_REPORTED, k.map.memory_usage() as f64),
        ]);
    }
    recs
}

impl Suite for StackMap {
    type Opts = Opts;
    const NAME: &'static str = "stackmap";
    const ABOUT: &'static str =
        "StackTraceMap collision rate per stack hash vs a uniform hash, and get_stackid calls/s";

    const DESCRIBE: &'static str = "Generated stacks (no real profile needed): a random call graph of \
         16384 functions 64 bytes apart from 0xffffffff81000000, 32 roots, \
         each function calling 4-16 others with hot paths favoured; a stack \
         is a walk of 5-40 frames from a root, return addresses of the call \
         sites and a sampled address in the leaf, stored leaf first as the \
         kernel does. Distinct stacks (fixed seed) are offered once to a \
         fresh map of 2^17 buckets with flags 0, so a stack whose bucket is \
         taken is lost (`EEXIST`): `collision_rate` is EEXIST per stack \
         offered, next to a uniform hash's expectation `1 - (1 - e^-load) / \
         load`. `jhash2` is the kernel's hash (seed 0), `xxh3` seed 0, \
         `siphash` SipHash-1-3 with a random key per map (its rate varies \
         run to run by about the theory's spread). `stackids_per_sec` is \
         `get_stackid` re-offering the stored stacks in a shuffled order: \
         hash, bucket load and frame compare, the profiler's hot path. At \
         each load the three maps are filled first and kept; then their \
         `get_stackid` loops are timed in turns (interleaved): one \
         repetition of each hash at a time, the one going first rotating, \
         each turn after an untimed quarter-length warm-up of its own, so \
         that load drifting on the machine falls on all of them alike.";

    const BASELINE: &'static str = "jhash2";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let mut loads = ctx.list_or(opts.loads, &[50, 80], &[10, 25, 50, 80, 100]);
        loads.sort_unstable();
        loads.dedup();
        let buckets = 1usize << opts.buckets_log2;
        let offered = |load: u32| buckets * load as usize / 100;
        let most = loads.iter().map(|&l| offered(l)).max().unwrap_or(0);
        // Per load: each hash's map filled, then the timing.
        ctx.set_steps((loads.len() * (HASHES.len() + 1)) as u64);

        let start = std::time::Instant::now();
        let stacks = Stacks::generate(most, opts.seed);
        ctx.note(&format!(
            "stacks: {} distinct, mean depth {:.1}, generated in {:.2} s",
            stacks.len(),
            stacks.frames.len() as f64 / stacks.len().max(1) as f64,
            start.elapsed().as_secs_f64()
        ));

        let mut all = Vec::new();
        for &load in &loads {
            let n = offered(load);
            if n == 0 {
                continue;
            }
            let c = case_of(buckets, load);
            // Every hash's map filled and kept, then their get_stackid
            // loops timed in turns.
            let kept: Vec<Kept> = HASHES
                .iter()
                .map(|&(hash, name)| {
                    let k = fill(&stacks, n, buckets, hash, name);
                    ctx.step();
                    k
                })
                .collect();
            let mut recs = measure(ctx, &kept, n, &c);
            ctx.step();
            let (expected, _) = uniform_collisions(n, buckets);
            recs.push(Record::single(
                ctx.suite(),
                &c,
                THEORY,
                &COLLISION_RATE,
                expected,
            ));
            ctx.print(&recs);
            all.extend(recs);
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut cases: Vec<&str> = Vec::new();
        for r in records {
            if !cases.contains(&r.case.as_str()) {
                cases.push(&r.case);
            }
        }
        let mut rates = Table::new(
            "stackmap: stacks lost to collisions (EEXIST per distinct stack offered)",
            &[
                "load",
                "stacks",
                "jhash2",
                "xxh3",
                "siphash",
                "uniform ± 2σ",
            ],
        )
        .with_note(
            "Percent of distinct stacks lost with flags 0, and what a uniform hash loses on average (± two standard deviations).",
        );
        let mut speed = Table::new(
            "stackmap: get_stackid on stored stacks",
            &[
                "load",
                "jhash2 M/s",
                "xxh3 M/s",
                "siphash M/s",
                "xxh3/jhash2",
                "siphash/jhash2",
            ],
        )
        .with_note("Millions of calls per second re-offering stacks already stored; ratios above 1 are faster than the kernel's jhash2.");
        for c in cases {
            let get = |imp: &str, m: &str| find(records, c, imp, m);
            let pct = |imp: &str| {
                get(imp, COLLISION_RATE.name)
                    .map_or("-".into(), |r| format!("{:.2}%", r.value * 100.0))
            };
            let load = crate::record::case_value(c, "load");
            let buckets: Option<usize> =
                crate::record::case_param(c, "buckets").and_then(|b| b.parse().ok());
            let pct_load: Option<usize> = load.trim_end_matches('%').parse().ok();
            let (n, theory) = match (buckets, pct_load) {
                (Some(b), Some(l)) if b * l >= 100 => {
                    let n = b * l / 100;
                    let (mean, sd) = uniform_collisions(n, b);
                    (
                        n.to_string(),
                        format!("{:.2}% ± {:.2}", mean * 100.0, 2.0 * sd * 100.0),
                    )
                }
                _ => ("-".into(), "-".into()),
            };
            rates.push(vec![
                load.to_string(),
                n,
                pct("jhash2"),
                pct("xxh3"),
                pct("siphash"),
                theory,
            ]);
            let mops = |imp: &str| fmt_mops(get(imp, STACKIDS_PER_SEC.name).map(|r| r.value));
            let vs = |imp: &str| {
                fmt_ratio(ratio(
                    get(imp, STACKIDS_PER_SEC.name),
                    get("jhash2", STACKIDS_PER_SEC.name),
                ))
            };
            speed.push(vec![
                load.to_string(),
                mops("jhash2"),
                mops("xxh3"),
                mops("siphash"),
                vs("xxh3"),
                vs("siphash"),
            ]);
        }
        vec![rates, speed]
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut p = LinePlot::new(
            "stackmap-collisions",
            "Stacks lost to bucket collisions vs load (flags 0)",
            "distinct stacks offered (% of buckets)",
            "% of stacks lost (EEXIST)",
        );
        for name in HASHES.iter().map(|(_, n)| *n).chain([THEORY]) {
            let pts = records
                .iter()
                .filter(|r| r.impl_name == name && r.metric == COLLISION_RATE.name)
                .filter_map(|r| Some((load_of(r)?, r.value * 100.0)))
                .collect();
            p.add(name, pts);
        }
        if p.is_empty() { Vec::new() } else { vec![p] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_are_distinct_deterministic_and_kernel_shaped() {
        let a = Stacks::generate(2000, 7);
        let b = Stacks::generate(2000, 7);
        assert_eq!(a.frames, b.frames);
        let set: HashSet<&[u64]> = (0..a.len()).map(|i| a.get(i)).collect();
        assert_eq!(set.len(), 2000);
        for i in 0..a.len() {
            let s = a.get(i);
            assert!(DEPTH.contains(&s.len()), "depth {}", s.len());
            assert!(
                s.iter()
                    .all(|&ip| (TEXT_BASE..fn_addr(FUNCTIONS)).contains(&ip))
            );
            // Outermost frame last: a root's call site.
            let root = (s[s.len() - 1] - TEXT_BASE) / FN_SIZE;
            assert!(root < u64::from(ROOTS));
        }
    }

    #[test]
    fn kept_maps_reoffer_their_stored_stacks() {
        let stacks = Stacks::generate(300, 3);
        for (hash, name) in HASHES {
            // 300 stacks in 256 buckets: some are lost.
            let k = fill(&stacks, 300, 256, hash, name);
            assert!(k.exists > 0 && k.ids.len() + k.exists as usize == 300);
            assert_eq!(k.queries.len(), k.ids.len());
            let mut lp = reoffer(&k);
            // More calls than stored stacks: the loop wraps around.
            for _ in 0..2 {
                assert_eq!(lp(), BATCH as u64);
            }
        }
    }

    #[test]
    fn uniform_expectation_matches_a_simulation() {
        let (mean, sd) = uniform_collisions(512, 1024);
        // 1 - (1 - e^-0.5) / 0.5
        assert!((mean - 0.2131).abs() < 1e-3, "{mean}");
        assert!(sd > 0.0 && sd < 0.05, "{sd}");
        let mut rng = StdRng::seed_from_u64(1);
        let trials = 200;
        let mut total = 0.0;
        for _ in 0..trials {
            let mut taken = vec![false; 1024];
            let mut lost = 0;
            for _ in 0..512 {
                let b = rng.random_range(0..1024);
                if std::mem::replace(&mut taken[b], true) {
                    lost += 1;
                }
            }
            total += f64::from(lost) / 512.0;
        }
        let sim = total / f64::from(trials);
        assert!(
            (sim - mean).abs() < 4.0 * sd / f64::from(trials).sqrt(),
            "{sim} vs {mean}"
        );
    }
}
