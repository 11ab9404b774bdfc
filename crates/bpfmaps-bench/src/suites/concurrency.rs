//! `concurrency`: lookups per second with 1 and 2 reader threads while one
//! writer updates, deletes and reinserts, for bpfmaps `HashMap` vs every
//! implementation of [`crate::hash_impls`] that takes concurrent writes
//! (dashmap, with boxed and fixed-array keys).
//!
//! Varies: the number of readers and the map. Holds fixed: 100K entries,
//! 16-byte kernel-bench keys, 8-byte values, the same hash (policy and
//! seed) for both maps, a fixed duration per repetition.
//!
//! The writer walks the keys in a shuffled order; seven of every eight
//! operations are an update (`BPF_ANY`) to a new value, the eighth a delete
//! followed by a reinsert. Every value written for key `id` is
//! `id << 32 | generation`, so a reader checks that what it read belongs to
//! the key it asked for: `mismatches` counts values that do not, and must
//! be 0. `read_misses` counts reads that fell between a delete and its
//! reinsert, which is allowed.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bpfmaps::HashPolicy;
use clap::Args;

use crate::hash_impls::{HashImpl, Probes, ReadCounts, hash_impls};
use crate::hasher::PolicyBuildHasher;
use crate::keys::{KeySet, shuffled_indices};
use crate::measure::thread_cpu_time;
use crate::plot::LinePlot;
use crate::record::{
    LOOKUPS_PER_CPU_SEC, LOOKUPS_PER_SEC, MEM_BYTES_HELD, MISMATCHES, READ_MISSES, Record,
    WRITER_OPS_PER_SEC, case, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::suites::parse_policy;
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct Concurrency;

/// `concurrency` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Entries in the map (all present at the start).
    #[arg(long, default_value_t = 100_000)]
    entries: u32,
    /// Key size in bytes.
    #[arg(long, default_value_t = 16)]
    key_size: usize,
    /// Reader thread counts to run (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2])]
    readers: Vec<usize>,
    /// Milliseconds per repetition [quick: 500; full: 2000].
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Hash policy of both maps.
    #[arg(long, value_parser = parse_policy, default_value = "xxh3")]
    policy: HashPolicy,
}

/// Writer operations per stop check.
const WRITER_BATCH: usize = 64;

/// One timed repetition.
struct Once {
    lookups_per_sec: f64,
    lookups_per_cpu_sec: f64,
    writer_ops_per_sec: f64,
    reads: ReadCounts,
}

fn run_once(
    map: &dyn HashImpl,
    keys: &KeySet,
    readers: usize,
    duration: Duration,
    rep: u64,
) -> Once {
    let writes = map.shared().expect("a map that takes concurrent writes");
    let n = keys.len();
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(readers + 2);
    std::thread::scope(|s| {
        let reader_threads: Vec<_> = (0..readers)
            .map(|r| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    let ids = shuffled_indices(n, rep * 100 + r as u64);
                    let probes = KeySet::kernel_indices(&ids, keys.key_size());
                    let mut counts = ReadCounts::default();
                    let mut pos = 0;
                    barrier.wait();
                    let (start, cpu) = (Instant::now(), thread_cpu_time());
                    while !stop.load(Ordering::Relaxed) {
                        let end = (pos + BATCH).min(n);
                        counts += map.read_batch(Probes {
                            keys: probes.slice(pos..end),
                            key_size: keys.key_size(),
                            ids: &ids[pos..end],
                        });
                        pos = if end == n { 0 } else { end };
                    }
                    (counts, start.elapsed(), thread_cpu_time() - cpu)
                })
            })
            .collect();
        let writer = {
            let (stop, barrier) = (&stop, &barrier);
            s.spawn(move || {
                let ids = shuffled_indices(n, rep * 100 + 99);
                let (mut ops, mut generation, mut pos) = (0u64, 0u32, 0usize);
                barrier.wait();
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..WRITER_BATCH {
                        let id = ids[pos];
                        pos = (pos + 1) % n;
                        generation = generation.wrapping_add(1);
                        let key = keys.key(id as usize);
                        let value = u64::from(id) << 32 | u64::from(generation);
                        if generation % 8 == 0 {
                            writes.remove(key);
                            writes.write(key, value);
                            ops += 2;
                        } else {
                            writes.write(key, value);
                            ops += 1;
                        }
                    }
                }
                ops as f64 / start.elapsed().as_secs_f64()
            })
        };
        barrier.wait();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let mut once = Once {
            lookups_per_sec: 0.0,
            lookups_per_cpu_sec: 0.0,
            writer_ops_per_sec: writer.join().expect("writer thread"),
            reads: ReadCounts::default(),
        };
        for t in reader_threads {
            let (counts, elapsed, cpu) = t.join().expect("reader thread");
            once.lookups_per_sec += counts.total() as f64 / elapsed.as_secs_f64();
            once.lookups_per_cpu_sec += counts.total() as f64 / cpu.as_secs_f64();
            once.reads += counts;
        }
        once
    })
}

/// Runs `readers` reader threads against each map in turn, the first
/// rotating with the repetition; records per map.
fn measure(
    ctx: &Ctx,
    maps: &[(&str, Box<dyn HashImpl>, usize)],
    keys: &KeySet,
    readers: usize,
    duration: Duration,
    base: &str,
) -> Vec<Record> {
    let c = format!("readers={readers},{base}");
    let n = maps.len();
    let mut samples = vec![(Vec::new(), Vec::new(), Vec::new(), ReadCounts::default()); n];
    for rep in 0..ctx.reps() {
        for k in 0..n {
            let i = (rep + k) % n;
            let (name, map, _) = &maps[i];
            let once = run_once(&**map, keys, readers, duration, rep as u64);
            assert_eq!(map.len(), keys.len(), "{name}: entries lost");
            samples[i].0.push(once.lookups_per_sec);
            samples[i].1.push(once.lookups_per_cpu_sec);
            samples[i].2.push(once.writer_ops_per_sec);
            samples[i].3 += once.reads;
            ctx.step();
        }
    }
    let s = ctx.suite();
    maps.iter()
        .zip(samples)
        .flat_map(|((name, _, held), (lookups, per_cpu, writes, reads))| {
            [
                Record::stats(s, &c, name, &LOOKUPS_PER_SEC, Stats::from_samples(&lookups)),
                Record::stats(
                    s,
                    &c,
                    name,
                    &LOOKUPS_PER_CPU_SEC,
                    Stats::from_samples(&per_cpu),
                ),
                Record::stats(
                    s,
                    &c,
                    name,
                    &WRITER_OPS_PER_SEC,
                    Stats::from_samples(&writes),
                ),
                Record::single(s, &c, name, &MISMATCHES, reads.bad as f64),
                Record::single(s, &c, name, &READ_MISSES, reads.missing as f64),
                Record::single(s, &c, name, &MEM_BYTES_HELD, *held as f64),
            ]
        })
        .collect()
}

impl Suite for Concurrency {
    type Opts = Opts;
    const NAME: &'static str = "concurrency";
    const ABOUT: &'static str =
        "lookups/s with 1-2 readers under a busy writer, bpfmaps HashMap vs dashmap";

    const DESCRIBE: &'static str = "100K entries, 16-byte kernel-bench keys, 8-byte values, both maps \
         hashing with the same policy and seed. One writer thread loops over \
         the keys: 7 of 8 operations are updates (`BPF_ANY`) to a new value, \
         the 8th a delete and a reinsert. Readers look up every key in a \
         shuffled order (bpfmaps pins one guard per 256 lookups) and check \
         that each value was written for that key (`mismatches`, must be 0). \
         The maps take turns within each repetition, the first rotating. \
         `lookups_per_sec` is summed over readers; with 2 readers and the \
         writer there are 3 busy threads, more than a 2-core machine has, so \
         the scheduler decides much of it: `lookups_per_cpu_sec` divides by \
         the readers' own CPU time instead.";

    const BASELINE: &'static str = "dashmap";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let duration =
            Duration::from_millis(
                opts.duration_ms
                    .unwrap_or(if ctx.quick() { 500 } else { 2000 }),
            );
        let n = opts.entries as usize;
        let keys = KeySet::kernel(n, opts.key_size);
        let seed: u32 = rand::random();
        let base = case(&[
            ("n", &n),
            ("ks", &opts.key_size),
            ("hash", &opts.policy.name()),
        ]);

        let hasher = PolicyBuildHasher::new(opts.policy, seed);
        // Every implementation that takes writes while readers read.
        let maps: Vec<(&str, Box<dyn HashImpl>, usize)> = hash_impls(opts.key_size)
            .iter()
            .filter_map(|e| {
                let probe = crate::alloc::MemProbe::start();
                let map = e.filled(&keys, n, hasher);
                let held = probe.held();
                map.shared().is_some().then_some((e.name, map, held))
            })
            .collect();
        ctx.set_steps((opts.readers.len() * maps.len() * ctx.reps()) as u64);

        let mut all = Vec::new();
        for &readers in &opts.readers {
            let recs = measure(ctx, &maps, &keys, readers, duration, &base);
            ctx.print(&recs);
            all.extend(recs);
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "concurrency: readers under one writer",
            &[
                "readers",
                "peer",
                "bpfmaps lookups M/s",
                "peer lookups M/s",
                "bpfmaps/peer",
                "per reader CPU-s",
                "bpfmaps writer M/s",
                "peer writer M/s",
                "writer bpfmaps/peer",
                "mismatches (bpfmaps, peer)",
            ],
        )
        .with_note("Lookups summed over reader threads (medians); `per reader CPU-s` is bpfmaps/peer in lookups per second of the readers' own CPU time, which does not depend on how the scheduler shares 2 cores among 3 threads; mismatches must be 0. `dashmap[N]` is dashmap with fixed-array keys.");
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        for c in cases {
            let get = |imp: &str, m: &str| find(records, c, imp, m);
            let count = |imp: &str| {
                get(imp, MISMATCHES.name).map_or("-".into(), |r| format!("{:.0}", r.value))
            };
            let mut peers: Vec<&str> = records
                .iter()
                .filter(|r| r.case == c && r.impl_name != "bpfmaps")
                .map(|r| r.impl_name.as_str())
                .collect();
            peers.dedup();
            for peer in peers {
                let vs = |m: &str| fmt_ratio(ratio(get("bpfmaps", m), get(peer, m)));
                t.push(vec![
                    crate::record::case_value(c, "readers").to_string(),
                    peer.to_string(),
                    fmt_mops(get("bpfmaps", LOOKUPS_PER_SEC.name).map(|r| r.value)),
                    fmt_mops(get(peer, LOOKUPS_PER_SEC.name).map(|r| r.value)),
                    vs(LOOKUPS_PER_SEC.name),
                    vs(LOOKUPS_PER_CPU_SEC.name),
                    fmt_mops(get("bpfmaps", WRITER_OPS_PER_SEC.name).map(|r| r.value)),
                    fmt_mops(get(peer, WRITER_OPS_PER_SEC.name).map(|r| r.value)),
                    vs(WRITER_OPS_PER_SEC.name),
                    format!("{}, {}", count("bpfmaps"), count(peer)),
                ]);
            }
        }
        vec![t]
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut p = LinePlot::new(
            "concurrency",
            "Lookups/s (all readers) and writer ops/s vs reader threads",
            "reader threads",
            "million operations per second",
        );
        let mut impls: Vec<&str> = records.iter().map(|r| r.impl_name.as_str()).collect();
        impls.sort_unstable();
        impls.dedup();
        for imp in impls {
            for (m, what) in [(LOOKUPS_PER_SEC, "lookups"), (WRITER_OPS_PER_SEC, "writer")] {
                let pts = records
                    .iter()
                    .filter(|r| r.impl_name == imp && r.metric == m.name)
                    .filter_map(|r| Some((r.param("readers")?.parse().ok()?, r.value / 1e6)))
                    .collect();
                p.add(format!("{imp} {what}"), pts);
            }
        }
        if p.is_empty() { Vec::new() } else { vec![p] }
    }
}
