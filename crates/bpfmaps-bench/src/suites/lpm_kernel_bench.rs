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

use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::keys::shuffled_indices;
use crate::lpm_tables::{
    Answers, AnyLpm, BATCH, LpmStep, LpmTable, Role, build, check_agreement, drop_and_reclaim,
    each_lpm, lpm_names, roles, value_of,
};
use crate::measure::{in_turns, rate_samples_interleaved};
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
pub struct Opts {
    /// Entries: dense /32 keys 0..N.
    #[arg(long, default_value_t = 10_000)]
    entries: u32,
    /// Maps built and dropped per repetition of `free` [quick: 10; full: 30].
    #[arg(long)]
    free_builds: Option<usize>,
}

/// Operations in report order.
const OPS: [&str; 4] = ["lookup", "update", "delete-insert", "free"];

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

/// One implementation's table for every operation but `lookup`, with
/// its monomorphic loops behind one object so the implementations can be
/// timed in turns.
trait Ops {
    /// Implementation name.
    fn name(&self) -> &'static str;
    /// One batch of `update` (re-inserting existing keys); returns its
    /// operations.
    fn update_batch(&mut self) -> u64;
    /// One batch of `delete-insert`; returns its operations.
    fn delete_insert_batch(&mut self) -> u64;
    /// Entries freed per second over `free_builds` builds and drops (the
    /// builds untimed).
    fn free_rate(&self) -> f64;
    /// The table's prefixes and answers now.
    fn check(&self) -> (usize, Answers);
}

struct Kept<'b, T> {
    bench: &'b Bench<'b>,
    table: T,
    /// Where `update` and `delete-insert` are in `bench.order`.
    pos: usize,
}

impl<T: LpmTable<V4>> Kept<'_, T> {
    /// The next key in update order.
    fn next(&mut self) -> u32 {
        let i = self.bench.order[self.pos];
        self.pos = (self.pos + 1) % self.bench.order.len();
        i
    }
}

impl<T: LpmTable<V4>> Ops for Kept<'_, T> {
    fn name(&self) -> &'static str {
        T::NAME
    }

    fn update_batch(&mut self) -> u64 {
        for _ in 0..BATCH {
            let i = self.next();
            self.table
                .insert(&self.bench.keys[i as usize], value_of(i as usize));
        }
        BATCH as u64
    }

    fn delete_insert_batch(&mut self) -> u64 {
        for _ in 0..BATCH / 2 {
            let i = self.next();
            let k = &self.bench.keys[i as usize];
            assert!(self.table.remove(k), "{}: key {i} missing", T::NAME);
            self.table.insert(k, value_of(i as usize));
        }
        BATCH as u64
    }

    fn free_rate(&self) -> f64 {
        let drop_once = || {
            let before = crate::alloc::current();
            let built = build::<V4, T>(&self.bench.keys);
            let slack = (built.held / 20).max(64 << 10);
            drop_and_reclaim(built.table, before, slack, Duration::from_secs(1))
        };
        let builds = self.bench.free_builds;
        let total: Duration = (0..builds).map(|_| drop_once()).sum();
        (builds as f64 * f64::from(self.bench.n)) / total.as_secs_f64().max(1e-9)
    }

    fn check(&self) -> (usize, Answers) {
        (
            self.table.count(),
            Answers::of::<V4, T>(&self.table, &self.bench.lookups),
        )
    }
}

/// One batch of a write operation on a kept table.
type Batch = fn(&mut dyn Ops) -> u64;

/// Builds each implementation and compares its lookups with the kernel
/// port's.
struct Lookups<'b>(&'b Bench<'b>);

impl LpmStep<V4> for Lookups<'_> {
    type Out = (Box<dyn AnyLpm<V4>>, usize);
    type Reference = Answers;

    fn step<T: LpmTable<V4> + Sync + 'static>(
        &self,
        reference: Option<&Answers>,
    ) -> (Self::Out, Answers) {
        let b = self.0;
        let t = build::<V4, T>(&b.keys).table;
        let got = Answers::of::<V4, T>(&t, &b.lookups);
        let c = case_of(b.n, "lookup");
        let bad = reference.map_or(0, |r| check_agreement(b.ctx, &c, T::NAME, &got, r));
        b.ctx.step();
        ((Box::new(t), bad), got)
    }
}

/// Builds each implementation for the write and free operations.
impl<'b> LpmStep<V4> for &'b Bench<'b> {
    type Out = Box<dyn Ops + 'b>;
    type Reference = ();

    fn step<T: LpmTable<V4> + Sync + 'static>(&self, _: Option<&()>) -> (Self::Out, ()) {
        let table = build::<V4, T>(&self.keys).table;
        (
            Box::new(Kept {
                bench: self,
                table,
                pos: 0,
            }),
            (),
        )
    }
}

impl Bench<'_> {
    fn records(&self, op: &str, name: &str, samples: &[f64], bad: Option<usize>) -> Vec<Record> {
        let c = case_of(self.n, op);
        let mut recs = rate_records(self.ctx, &c, name, samples);
        if let Some(bad) = bad {
            let s = self.ctx.suite();
            recs.push(Record::single(s, &c, name, &LPM_DISAGREEMENTS, bad as f64));
        }
        recs
    }

    /// `lookup` for every implementation playing one of `roles`, timed in
    /// turns; returns the records and the kernel port's answers.
    fn lookup(&self, roles: &[Role]) -> (Vec<Record>, Answers) {
        let kept = each_lpm(&Lookups(self), roles, None);
        let reference = kept[0].0.answers(&self.lookups);
        let rates = {
            let mut loops: Vec<_> = kept.iter().map(|k| k.0.lookups(&self.lookups)).collect();
            rate_samples_interleaved(self.ctx.plan(), &mut loops)
        };
        self.ctx.step();
        let recs = kept
            .iter()
            .zip(rates)
            .flat_map(|((t, bad), r)| self.records("lookup", t.name(), &r, Some(*bad)))
            .collect();
        (recs, reference)
    }

    /// `update`, `delete-insert` and `free` for the implementations playing
    /// one of `roles`, each operation timed in turns; checks every table
    /// still answers as before after the writes.
    fn writes_and_frees(&self, roles: &[Role], reference: &Answers) -> Vec<Record> {
        let mut kept = each_lpm(&self, roles, Some(()));
        let mut recs = Vec::new();
        let ops: [(&str, Batch); 2] = [
            ("update", |k| k.update_batch()),
            ("delete-insert", |k| k.delete_insert_batch()),
        ];
        for (op, batch) in ops {
            let rates = {
                let mut loops: Vec<_> = kept.iter_mut().map(|k| move || batch(&mut **k)).collect();
                rate_samples_interleaved(self.ctx.plan(), &mut loops)
            };
            self.ctx.step();
            for (k, r) in kept.iter().zip(rates) {
                let bad = (op == "delete-insert").then(|| {
                    let (count, after) = k.check();
                    assert_eq!(count, self.n as usize, "{}: entries lost", k.name());
                    let c = case_of(self.n, op);
                    check_agreement(self.ctx, &c, k.name(), &after, reference)
                });
                recs.extend(self.records(op, k.name(), &r, bad));
            }
        }
        // One untimed round first, as the timed ones will run.
        for k in &kept {
            k.free_rate();
        }
        let rates = in_turns(kept.len(), self.ctx.reps(), |i| kept[i].free_rate());
        self.ctx.step();
        for (k, r) in kept.iter().zip(rates) {
            recs.extend(self.records("free", k.name(), &r, None));
        }
        recs
    }
}

impl Suite for LpmKernelBench {
    type Opts = Opts;
    const NAME: &'static str = "lpm-kernel-bench";
    const ABOUT: &'static str = "the kernel's LPM bench shape (10K dense /32 keys): lookup, update, delete+insert, free; bpfmaps vs the kernel port";

    const DESCRIBE: &'static str = "The shape of `tools/testing/selftests/bpf/benchs/bench_lpm_trie_map.c`: \
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
         The peers `prefix-trie` and `ip_network_table` run the lookups only. \
         Every implementation is built first; then each operation is timed \
         in turns (one repetition of each implementation at a time, the \
         first rotating).";

    const BASELINE: &'static str = "kernel";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
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
        let lookup_roles = roles(true);
        ctx.set_steps((lpm_names(lookup_roles).len() + OPS.len()) as u64);
        let (mut all, reference) = bench.lookup(lookup_roles);
        ctx.print(&all);
        let writes = bench.writes_and_frees(roles(false), &reference);
        ctx.print(&writes);
        all.extend(writes);
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let impls = lpm_names(roles(true));
        let others: Vec<&str> = impls.iter().copied().filter(|&i| i != "kernel").collect();
        let mut cols = vec!["op".to_string()];
        cols.extend(impls.iter().map(|i| format!("{i} M/s")));
        cols.extend(lpm_names(roles(false)).iter().map(|i| format!("{i} ns/op")));
        cols.extend(others.iter().map(|i| format!("{i}/kernel")));
        cols.push("bpfmaps/prefix-trie".into());
        let mut t = Table::new(
            "lpm-kernel-bench: operations per second (millions) and speed vs the kernel port",
            &cols.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .with_note(
            "Medians; ratios are speed ratios: above 1 means faster than the denominator. \
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
            let mut row = vec![crate::record::case_value(c, "op").to_string()];
            row.extend(impls.iter().map(|&i| fmt_mops(get(i).map(|r| r.value))));
            row.extend(lpm_names(roles(false)).iter().map(|&i| ns(i)));
            row.extend(
                others
                    .iter()
                    .map(|&i| fmt_ratio(ratio(get(i), get("kernel")))),
            );
            row.push(fmt_ratio(ratio(get("bpfmaps"), get("prefix-trie"))));
            t.push(row);
        }
        vec![t]
    }
}
