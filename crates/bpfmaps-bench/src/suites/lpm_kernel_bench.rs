//! `lpm-kernel-bench`: the shape of the kernel's LPM trie benchmark
//! (`tools/testing/selftests/bpf/benchs/bench_lpm_trie_map.c`), bpfmaps
//! against the kernel port.
//!
//! Varies: the operation and the implementation. Holds fixed: N = 10K
//! entries with dense /32 keys `0..N` (IPv4 data = the number as 4 bytes
//! big-endian), u32 values, one thread. As in the kernel bench the trie has
//! no gaps below N, its worst case.
//!
//! - `lookup`: random keys in `0..N` (every lookup hits), one guard per
//!   256 lookups; the peers `prefix-trie` and `ip_network_table` too.
//! - `update`: re-insert existing keys (`BPF_ANY`) in a shuffled order.
//! - `delete-insert`: delete a key and insert it again (two operations).
//! - `free`: drop a full map and wait until its memory is back with the
//!   allocator (flushing deferred frees); the builds are not timed.

use std::time::Duration;

use bpfmaps::lpm::{KernelLpmTrie, LpmTrie};
use clap::{Args, Command};
use ip_network_table::IpNetworkTable;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::keys::shuffled_indices;
use crate::lpm_tables::{
    Answers, BATCH, LpmTable, PrefixTrie, build, check_agreement, drop_and_reclaim, lookup_rates,
    value_of,
};
use crate::measure::rate_samples;
use crate::prefixes::{Prefix, V4};
use crate::record::{LPM_DISAGREEMENTS, NS_PER_OP, OPS_PER_SEC, Record, case, find, ratio};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::suites::lpm_data::SEED;
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct LpmKernelBench;

/// `lpm-kernel-bench` options.
#[derive(Debug, Args)]
struct Opts {
    /// Entries: dense /32 keys 0..N.
    #[arg(long, default_value_t = 10_000)]
    entries: u32,
    /// Maps built and dropped per repetition of `free` [quick: 10; full: 30].
    #[arg(long)]
    free_builds: Option<usize>,
}

/// Operations in report order.
const OPS: [&str; 4] = ["lookup", "update", "delete-insert", "free"];
/// Implementations in report order; the first is the baseline.
const IMPLS: [&str; 4] = ["kernel", "bpfmaps", "prefix-trie", "ip_network_table"];

/// Lookup keys per case.
const LOOKUP_KEYS: usize = 1 << 16;

fn case_of(n: u32, op: &str) -> String {
    case(&[("n", &n), ("op", &op)])
}

/// Key `i`: the number as 4 bytes big-endian, /32.
fn key(i: u32) -> Prefix<V4> {
    Prefix::new(i.to_be_bytes(), 32)
}

/// Rate samples to `ops_per_sec` and `ns_per_op` records.
fn rate_records(ctx: &Ctx, c: &str, name: &str, samples: &[f64]) -> Vec<Record> {
    vec![
        Record::stats(
            ctx.suite(),
            c,
            name,
            &OPS_PER_SEC,
            Stats::from_samples(samples),
        ),
        Record::stats(
            ctx.suite(),
            c,
            name,
            &NS_PER_OP,
            Stats::inverse_of(samples, 1e9),
        ),
    ]
}

/// Everything the operations share.
struct Bench<'a> {
    ctx: &'a Ctx,
    n: u32,
    keys: Vec<Prefix<V4>>,
    /// Random keys in `0..n`, as addresses.
    lookups: Vec<[u8; 4]>,
    /// Keys in the order updates visit them.
    order: Vec<u32>,
    free_builds: usize,
}

impl Bench<'_> {
    fn lookup<T: LpmTable<V4>>(&self, reference: Option<&Answers>) -> (Vec<Record>, Answers) {
        let t = build::<V4, T>(&self.keys).table;
        let got = Answers::of::<V4, T>(&t, &self.lookups);
        let c = case_of(self.n, "lookup");
        let samples = lookup_rates::<V4, T>(self.ctx.plan(), &t, &self.lookups);
        let mut recs = rate_records(self.ctx, &c, T::NAME, &samples);
        let bad = reference.map_or(0, |r| check_agreement(self.ctx, &c, T::NAME, &got, r));
        recs.push(Record::single(
            self.ctx.suite(),
            &c,
            T::NAME,
            &LPM_DISAGREEMENTS,
            bad as f64,
        ));
        self.ctx.step();
        (recs, got)
    }

    /// `update` and `delete-insert` on one table; checks it still answers
    /// as before afterwards.
    fn writes<T: LpmTable<V4>>(&self, reference: &Answers) -> Vec<Record> {
        let mut t = build::<V4, T>(&self.keys).table;
        let n = self.order.len();
        let mut pos = 0;
        let samples = rate_samples(self.ctx.plan(), || {
            for _ in 0..BATCH {
                let i = self.order[pos];
                t.insert(&self.keys[i as usize], value_of(i as usize));
                pos = (pos + 1) % n;
            }
            BATCH as u64
        });
        let mut recs = rate_records(self.ctx, &case_of(self.n, "update"), T::NAME, &samples);
        self.ctx.step();
        let samples = rate_samples(self.ctx.plan(), || {
            for _ in 0..BATCH / 2 {
                let i = self.order[pos];
                let k = &self.keys[i as usize];
                assert!(t.remove(k), "{}: key {i} missing", T::NAME);
                t.insert(k, value_of(i as usize));
                pos = (pos + 1) % n;
            }
            BATCH as u64
        });
        let c = case_of(self.n, "delete-insert");
        recs.extend(rate_records(self.ctx, &c, T::NAME, &samples));
        assert_eq!(t.count(), n, "{}: entries lost", T::NAME);
        let after = Answers::of::<V4, T>(&t, &self.lookups);
        let bad = check_agreement(self.ctx, &c, T::NAME, &after, reference);
        recs.push(Record::single(
            self.ctx.suite(),
            &c,
            T::NAME,
            &LPM_DISAGREEMENTS,
            bad as f64,
        ));
        self.ctx.step();
        recs
    }

    /// Time to drop a full map, per entry.
    fn free<T: LpmTable<V4>>(&self) -> Vec<Record> {
        let drop_once = || {
            let before = crate::alloc::current();
            let built = build::<V4, T>(&self.keys);
            let slack = (built.held / 20).max(64 << 10);
            drop_and_reclaim(built.table, before, slack, Duration::from_secs(1))
        };
        drop_once();
        let samples: Vec<f64> = (0..self.ctx.reps())
            .map(|_| {
                let total: Duration = (0..self.free_builds).map(|_| drop_once()).sum();
                (self.free_builds as f64 * f64::from(self.n)) / total.as_secs_f64().max(1e-9)
            })
            .collect();
        self.ctx.step();
        rate_records(self.ctx, &case_of(self.n, "free"), T::NAME, &samples)
    }
}

impl Suite for LpmKernelBench {
    fn name(&self) -> &'static str {
        "lpm-kernel-bench"
    }

    fn about(&self) -> &'static str {
        "the kernel's LPM bench shape (10K dense /32 keys): lookup, update, delete+insert, free; bpfmaps vs the kernel port"
    }

    fn describe(&self) -> &'static str {
        "The shape of `tools/testing/selftests/bpf/benchs/bench_lpm_trie_map.c`: \
         N = 10,000 dense /32 keys `0..N` (IPv4 data = the number as 4 bytes \
         big-endian), u32 values, one thread. `lookup`: 65,536 random keys in \
         `0..N`, the same for every implementation, one guard per 256 lookups \
         (bpfmaps and the kernel port), values summed into a checksum that \
         must agree with the kernel port's. `update`: re-insert existing keys \
         with `BPF_ANY` in a shuffled order. `delete-insert`: delete a key \
         and insert it again (each counts as one operation). `free`: time from \
         `drop` of a full map until its memory is back with the allocator, per \
         entry (the builds in between are not timed; for bpfmaps, which frees \
         replaced blocks and finally its arena after an epoch grace period, \
         this includes flushing those deferred frees on the same thread). \
         The peers `prefix-trie` and `ip_network_table` run the lookups only."
    }

    fn baseline(&self) -> &'static str {
        "kernel"
    }

    fn args(&self, cmd: Command) -> Command {
        Opts::augment_args(cmd)
    }

    fn run(&self, ctx: &Ctx) -> Vec<Record> {
        let opts: Opts = ctx.options();
        let n = opts.entries.max(1);
        let keys: Vec<Prefix<V4>> = (0..n).map(key).collect();
        let mut rng = StdRng::seed_from_u64(SEED);
        let lookups = (0..LOOKUP_KEYS)
            .map(|_| rng.random_range(0..n).to_be_bytes())
            .collect();
        let bench = Bench {
            ctx,
            n,
            keys,
            lookups,
            order: shuffled_indices(n as usize, SEED),
            free_builds: opts
                .free_builds
                .unwrap_or(if ctx.quick() { 10 } else { 30 })
                .max(1),
        };
        ctx.set_steps(4 + 2 * 2 + 2);

        let mut all = Vec::new();
        let (recs, reference) = bench.lookup::<KernelLpmTrie>(None);
        ctx.print(&recs);
        all.extend(recs);
        let (recs, _) = bench.lookup::<LpmTrie>(Some(&reference));
        ctx.print(&recs);
        all.extend(recs);
        let (recs, _) = bench.lookup::<PrefixTrie<V4>>(Some(&reference));
        ctx.print(&recs);
        all.extend(recs);
        let (recs, _) = bench.lookup::<IpNetworkTable<u32>>(Some(&reference));
        ctx.print(&recs);
        all.extend(recs);

        let mut writes = bench.writes::<KernelLpmTrie>(&reference);
        writes.extend(bench.writes::<LpmTrie>(&reference));
        writes.sort_by_key(|r| OPS.iter().position(|op| r.param("op") == Some(op)));
        ctx.print(&writes);
        all.extend(writes);

        let mut frees = bench.free::<KernelLpmTrie>();
        frees.extend(bench.free::<LpmTrie>());
        ctx.print(&frees);
        all.extend(frees);
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "lpm-kernel-bench: operations per second (millions) and speed vs the kernel port",
            &[
                "op",
                "kernel M/s",
                "bpfmaps M/s",
                "prefix-trie M/s",
                "ip_network_table M/s",
                "kernel ns/op",
                "bpfmaps ns/op",
                "bpfmaps/kernel",
                "prefix-trie/kernel",
                "ip_network_table/kernel",
                "bpfmaps/prefix-trie",
            ],
        )
        .with_note(
            "Ratios are speed ratios: above 1 means faster than the denominator. \
             `free` counts entries freed by `drop` (until the memory is back).",
        );
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        for c in cases {
            let get = |imp: &str| find(records, c, imp, OPS_PER_SEC.name);
            let ns = |imp: &str| {
                find(records, c, imp, NS_PER_OP.name)
                    .map_or("-".into(), |r| format!("{:.1}", r.value))
            };
            t.push(vec![
                crate::record::case_param(c, "op")
                    .unwrap_or("?")
                    .to_string(),
                fmt_mops(get(IMPLS[0]).map(|r| r.value)),
                fmt_mops(get(IMPLS[1]).map(|r| r.value)),
                fmt_mops(get(IMPLS[2]).map(|r| r.value)),
                fmt_mops(get(IMPLS[3]).map(|r| r.value)),
                ns("kernel"),
                ns("bpfmaps"),
                fmt_ratio(ratio(get("bpfmaps"), get("kernel"))),
                fmt_ratio(ratio(get("prefix-trie"), get("kernel"))),
                fmt_ratio(ratio(get("ip_network_table"), get("kernel"))),
                fmt_ratio(ratio(get("bpfmaps"), get("prefix-trie"))),
            ]);
        }
        vec![t]
    }
}
