//! `lpm-updates`: replaying a real day of BGP updates (RIPE RIS peer
//! AS3333, 2026-05-11) onto its initial IPv4 table: updates per second,
//! alone and with one reader thread looking up concurrently.
//!
//! Varies: the implementation and whether a reader runs. Holds fixed: the
//! initial table (1,042,325 prefixes, loaded untimed before each replay),
//! the mutations in trace order (quick: the first 300,000 of 1,393,421):
//! `A prefix` inserts or replaces (`BPF_ANY`) with the line number as the
//! value, `W prefix` removes (`ENOENT` ignored). Without the trace files a
//! synthetic trace stands in (the run says so).

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bpfmaps::lpm::{KernelLpmTrie, LpmTrie};
use clap::{Args, Command};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::lpm_tables::{Answers, BATCH, LpmTable, PrefixTrie, SharedLpm, build, check_agreement};
use crate::prefixes::{
    Mutation, Prefix, RIS_INITIAL_IPV4, RIS_MUTATIONS_IPV4, V4, addrs_inside, load_mutations,
    top_up,
};
use crate::record::{
    BUILD_MS, LOOKUPS_PER_SEC, LPM_DISAGREEMENTS, Record, UPDATES_PER_SEC, case, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::suites::lpm_data::{SEED, generated_ipv4, load};
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct LpmUpdates;

/// `lpm-updates` options.
#[derive(Debug, Args)]
struct Opts {
    /// Mutations to replay from the start of the trace [quick: 300000; full: all].
    #[arg(long)]
    mutations: Option<usize>,
    /// Reader addresses (inside the initial table's prefixes; whole batches of 256).
    #[arg(long, default_value_t = 1 << 20)]
    addrs: usize,
    /// Skip the replays with a concurrent reader.
    #[arg(long)]
    no_reader: bool,
}

/// Implementations of the single-threaded replay, in report order.
const IMPLS: [&str; 3] = ["kernel", "bpfmaps", "prefix-trie"];

/// The trace: an initial table and the mutations replayed onto it.
struct Trace {
    name: &'static str,
    initial: Vec<Prefix<V4>>,
    mutations: Vec<Mutation<V4>>,
}

/// A synthetic stand-in for the RIS trace: 500K generated prefixes, then
/// mutations over a pool of 100K of them and 35K new ones, 97% announces.
fn synthetic_trace(count: usize) -> Trace {
    let mut all = generated_ipv4(535_000);
    let initial: Vec<Prefix<V4>> = all.drain(..500_000).collect();
    let mut pool = initial[..100_000].to_vec();
    top_up(&mut pool, &all, 135_000);
    let mut rng = StdRng::seed_from_u64(SEED + 7);
    let mutations = (1..=count as u32)
        .map(|line| Mutation {
            announce: rng.random_range(0..100) < 97,
            prefix: pool[rng.random_range(0..pool.len())],
            value: line,
        })
        .collect();
    Trace {
        name: "generated",
        initial,
        mutations,
    }
}

fn load_trace(ctx: &Ctx, limit: Option<usize>) -> Trace {
    let initial = load::<V4>(ctx, RIS_INITIAL_IPV4);
    let mutations = match ctx.data_file(RIS_MUTATIONS_IPV4) {
        Some(p) => match load_mutations::<V4>(&p) {
            Ok(m) => Some(m),
            Err(e) => {
                ctx.note(&format!("lpm-updates: reading {}: {e}", p.display()));
                None
            }
        },
        None => {
            ctx.note(&format!(
                "lpm-updates: {RIS_MUTATIONS_IPV4} not found under {}",
                ctx.data_dir().display()
            ));
            None
        }
    };
    match (initial, mutations) {
        (Some(initial), Some(mut mutations)) => {
            if let Some(l) = limit {
                mutations.truncate(l);
            }
            Trace {
                name: "ris-as3333-ipv4",
                initial,
                mutations,
            }
        }
        _ => {
            let t = synthetic_trace(limit.unwrap_or(1_400_000));
            ctx.note(&format!(
                "lpm-updates: no RIS trace: replaying a synthetic one ({} initial prefixes, {} mutations)",
                t.initial.len(),
                t.mutations.len()
            ));
            t
        }
    }
}

/// Applies every mutation; returns the elapsed seconds.
fn apply<T: LpmTable<V4>>(t: &mut T, mutations: &[Mutation<V4>]) -> f64 {
    let start = Instant::now();
    for m in mutations {
        if m.announce {
            t.insert(&m.prefix, m.value);
        } else {
            t.remove(&m.prefix);
        }
    }
    start.elapsed().as_secs_f64()
}

/// Everything a replay needs.
struct Replay<'a> {
    ctx: &'a Ctx,
    trace: Trace,
    /// Reader and verification addresses.
    addrs: Vec<[u8; 4]>,
}

impl Replay<'_> {
    fn case(&self, readers: usize) -> String {
        case(&[
            ("trace", &self.trace.name),
            ("initial", &self.trace.initial.len()),
            ("mutations", &self.trace.mutations.len()),
            ("readers", &readers),
        ])
    }

    /// Single-threaded replays; returns the records and the final answers.
    fn alone<T: LpmTable<V4>>(
        &self,
        reference: Option<&(Answers, usize)>,
    ) -> (Vec<Record>, (Answers, usize)) {
        let (mut rates, mut builds) = (Vec::new(), Vec::new());
        let mut last = None;
        for _ in 0..self.ctx.reps() {
            drop(last.take());
            let mut built = build::<V4, T>(&self.trace.initial);
            builds.push(built.time.as_secs_f64() * 1e3);
            let secs = apply(&mut built.table, &self.trace.mutations);
            rates.push(self.trace.mutations.len() as f64 / secs);
            last = Some(built.table);
        }
        let t = last.expect("at least one replay");
        let fin = (Answers::of::<V4, T>(&t, &self.addrs), t.count());
        let c = self.case(0);
        let bad = reference.map_or(0, |r| {
            if r.1 != fin.1 {
                self.ctx.note(&format!(
                    "WARNING: {} holds {} prefixes after the replay, kernel {}",
                    T::NAME,
                    fin.1,
                    r.1
                ));
            }
            check_agreement(self.ctx, &c, T::NAME, &fin.0, &r.0) + usize::from(r.1 != fin.1)
        });
        let s = self.ctx.suite();
        let recs = vec![
            Record::stats(
                s,
                &c,
                T::NAME,
                &UPDATES_PER_SEC,
                Stats::from_samples(&rates),
            ),
            Record::stats(s, &c, T::NAME, &BUILD_MS, Stats::from_samples(&builds)),
            Record::single(s, &c, T::NAME, &LPM_DISAGREEMENTS, bad as f64),
        ];
        self.ctx.step();
        self.ctx.print(&recs);
        (recs, fin)
    }

    /// Replays with one reader thread looking up the same table meanwhile.
    fn with_reader<T: LpmTable<V4> + SharedLpm<V4>>(
        &self,
        reference: &(Answers, usize),
    ) -> Vec<Record> {
        let (mut updates, mut lookups) = (Vec::new(), Vec::new());
        let mut last = None;
        let addrs = &self.addrs[..];
        for _ in 0..self.ctx.reps() {
            drop(last.take());
            let t = build::<V4, T>(&self.trace.initial).table;
            let stop = AtomicBool::new(false);
            let barrier = Barrier::new(2);
            let (secs, (done, reader_secs)) = std::thread::scope(|s| {
                let (t, stop, barrier) = (&t, &stop, &barrier);
                let reader = s.spawn(move || {
                    let mut cursor = 0;
                    let mut done = 0u64;
                    let mut acc = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        acc = acc.wrapping_add(t.sum_batch(&addrs[cursor..cursor + BATCH]));
                        cursor = (cursor + BATCH) % addrs.len();
                        done += BATCH as u64;
                    }
                    std::hint::black_box(acc);
                    (done, start.elapsed().as_secs_f64())
                });
                barrier.wait();
                let start = Instant::now();
                for m in &self.trace.mutations {
                    if m.announce {
                        t.insert_shared(&m.prefix, m.value);
                    } else {
                        t.remove_shared(&m.prefix);
                    }
                }
                let secs = start.elapsed().as_secs_f64();
                stop.store(true, Ordering::Relaxed);
                (secs, reader.join().expect("reader thread"))
            });
            updates.push(self.trace.mutations.len() as f64 / secs);
            lookups.push(done as f64 / reader_secs);
            last = Some(t);
        }
        let t = last.expect("at least one replay");
        let c = self.case(1);
        let fin = Answers::of::<V4, T>(&t, &self.addrs);
        let bad = check_agreement(self.ctx, &c, T::NAME, &fin, &reference.0)
            + usize::from(t.count() != reference.1);
        let s = self.ctx.suite();
        let recs = vec![
            Record::stats(
                s,
                &c,
                T::NAME,
                &UPDATES_PER_SEC,
                Stats::from_samples(&updates),
            ),
            Record::stats(
                s,
                &c,
                T::NAME,
                &LOOKUPS_PER_SEC,
                Stats::from_samples(&lookups),
            ),
            Record::single(s, &c, T::NAME, &LPM_DISAGREEMENTS, bad as f64),
        ];
        self.ctx.step();
        self.ctx.print(&recs);
        recs
    }
}

impl Suite for LpmUpdates {
    fn name(&self) -> &'static str {
        "lpm-updates"
    }

    fn about(&self) -> &'static str {
        "replay of a real day of BGP updates: updates/s alone and with one concurrent reader"
    }

    fn describe(&self) -> &'static str {
        "The RIPE RIS trace of peer 193.0.0.56 (AS3333) on 2026-05-11: the \
         initial IPv4 table (`lpm/ris/ris_as3333_initial_ipv4.txt.gz`, 1,042,325 \
         prefixes) is loaded (untimed here; `build_ms` reports it), then the \
         day's mutations (`..._mutations_ipv4.txt.gz`, 1,393,421: 1,355,568 \
         announces, 37,853 withdraws; quick mode replays the first 300,000) \
         are applied in order: an announce inserts or replaces (`BPF_ANY`) \
         with the line number as the value, a withdraw removes (`ENOENT` \
         ignored). `readers=0`: the replay alone, one thread (prefix-trie \
         through `&mut`). `readers=1`: bpfmaps and the kernel port again, \
         with one reader thread looking up 2^20 addresses inside the initial \
         table's prefixes in a loop (one guard per 256 lookups) for as long \
         as the replay runs; `lookups_per_sec` is the reader's rate. Each \
         repetition replays onto a freshly built table. Afterwards every \
         table must answer the same lookups as the kernel port's and hold as \
         many prefixes."
    }

    fn baseline(&self) -> &'static str {
        "kernel"
    }

    fn args(&self, cmd: Command) -> Command {
        Opts::augment_args(cmd)
    }

    fn run(&self, ctx: &Ctx) -> Vec<Record> {
        let opts: Opts = ctx.options();
        let limit = opts
            .mutations
            .or(if ctx.quick() { Some(300_000) } else { None });
        let trace = load_trace(ctx, limit);
        let count = opts.addrs.max(1).div_ceil(BATCH) * BATCH;
        let replay = Replay {
            ctx,
            addrs: addrs_inside(&trace.initial, count, SEED + 3),
            trace,
        };
        ctx.set_steps(if opts.no_reader { 3 } else { 5 });
        let (mut all, reference) = replay.alone::<KernelLpmTrie>(None);
        all.extend(replay.alone::<LpmTrie>(Some(&reference)).0);
        all.extend(replay.alone::<PrefixTrie<V4>>(Some(&reference)).0);
        if !opts.no_reader {
            all.extend(replay.with_reader::<KernelLpmTrie>(&reference));
            all.extend(replay.with_reader::<LpmTrie>(&reference));
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        cases.dedup();
        let mut t = Table::new(
            "lpm-updates: BGP trace replay",
            &[
                "readers",
                "kernel updates M/s",
                "bpfmaps updates M/s",
                "prefix-trie updates M/s",
                "bpfmaps/kernel",
                "prefix-trie/kernel",
                "bpfmaps/prefix-trie",
                "kernel reader M lookups/s",
                "bpfmaps reader M lookups/s",
                "reader bpfmaps/kernel",
            ],
        )
        .with_note(
            "Mutations applied per second by the one writer (millions) and, with \
             a reader, that reader's lookups per second; ratios above 1 mean \
             faster than the denominator.",
        );
        for c in cases {
            let u = |imp: &str| find(records, c, imp, UPDATES_PER_SEC.name);
            let l = |imp: &str| find(records, c, imp, LOOKUPS_PER_SEC.name);
            t.push(vec![
                crate::record::case_param(c, "readers")
                    .unwrap_or("?")
                    .to_string(),
                fmt_mops(u(IMPLS[0]).map(|r| r.value)),
                fmt_mops(u(IMPLS[1]).map(|r| r.value)),
                fmt_mops(u(IMPLS[2]).map(|r| r.value)),
                fmt_ratio(ratio(u("bpfmaps"), u("kernel"))),
                fmt_ratio(ratio(u("prefix-trie"), u("kernel"))),
                fmt_ratio(ratio(u("bpfmaps"), u("prefix-trie"))),
                fmt_mops(l("kernel").map(|r| r.value)),
                fmt_mops(l("bpfmaps").map(|r| r.value)),
                fmt_ratio(ratio(l("bpfmaps"), l("kernel"))),
            ]);
        }
        vec![t]
    }
}
