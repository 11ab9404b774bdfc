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

use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::lpm_tables::{
    Answers, BATCH, LpmStep, LpmTable, Role, build, check_agreement, each_lpm, lpm_names, roles,
};
use crate::measure::in_turns;
use crate::plot::LinePlot;
use crate::prefixes::{
    Mutation, Prefix, RIS_INITIAL_IPV4, RIS_MUTATIONS_IPV4, V4, addrs_inside, load_mutations,
    top_up,
};
use crate::record::{
    BUILD_MS, LOOKUPS_PER_SEC, LPM_DISAGREEMENTS, Record, UPDATES_PER_SEC, case, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::suites::lpm_churn;
use crate::suites::lpm_data::{SEED, generated_ipv4, load};
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct LpmUpdates;

/// `lpm-updates` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Mutations to replay from the start of the trace [quick: 300000; full: all].
    #[arg(long)]
    mutations: Option<usize>,
    /// Reader addresses (inside the initial table's prefixes; whole batches of 256).
    #[arg(long, default_value_t = 1 << 20)]
    addrs: usize,
    /// Skip the replays with a concurrent reader.
    #[arg(long)]
    no_reader: bool,
    /// Rounds of removing and re-inserting a random fifth, for memory after
    /// churn [quick: 2; full: 5; 0: no memory measurements].
    #[arg(long)]
    churn_rounds: Option<usize>,
}

/// The implementations that take writes beside a reader.
const SHARED: &[Role] = &[Role::Kernel, Role::Bpfmaps];

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

/// What a table answered after a replay, and how many prefixes it held.
type Final = (Answers, usize);

/// One implementation's replays: each turn builds a fresh table from the
/// initial set (untimed) and replays the trace onto it (timed); the last
/// table is kept for the check.
trait Replayer {
    /// Implementation name.
    fn name(&self) -> &'static str;
    /// One replay alone; returns mutations per second.
    fn alone(&mut self) -> f64;
    /// One replay while a reader looks up the same table; returns
    /// mutations per second (the reader's rate goes to `lookups`).
    fn with_reader(&mut self) -> f64;
    /// Build times of the turns so far (ms).
    fn builds(&self) -> &[f64];
    /// The reader's lookups per second in the turns so far.
    fn lookups(&self) -> &[f64];
    /// The last table's answers.
    fn final_answers(&self) -> Final;
}

struct Turns<'r, T> {
    replay: &'r Replay<'r>,
    last: Option<T>,
    builds: Vec<f64>,
    lookups: Vec<f64>,
}

impl<T: LpmTable<V4> + Sync> Turns<'_, T> {
    fn fresh(&mut self) -> T {
        drop(self.last.take());
        let built = build::<V4, T>(&self.replay.trace.initial);
        self.builds.push(built.time.as_secs_f64() * 1e3);
        built.table
    }
}

impl<T: LpmTable<V4> + Sync> Replayer for Turns<'_, T> {
    fn name(&self) -> &'static str {
        T::NAME
    }

    fn alone(&mut self) -> f64 {
        let mut t = self.fresh();
        let mutations = &self.replay.trace.mutations;
        let secs = apply(&mut t, mutations);
        self.last = Some(t);
        mutations.len() as f64 / secs
    }

    fn with_reader(&mut self) -> f64 {
        let t = self.fresh();
        let shared = t.shared().expect("a table that takes concurrent writes");
        let (addrs, mutations) = (&self.replay.addrs[..], &self.replay.trace.mutations);
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
            for m in mutations {
                if m.announce {
                    shared.insert_shared(&m.prefix, m.value);
                } else {
                    shared.remove_shared(&m.prefix);
                }
            }
            let secs = start.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            (secs, reader.join().expect("reader thread"))
        });
        self.lookups.push(done as f64 / reader_secs);
        self.last = Some(t);
        mutations.len() as f64 / secs
    }

    fn builds(&self) -> &[f64] {
        &self.builds
    }

    fn lookups(&self) -> &[f64] {
        &self.lookups
    }

    fn final_answers(&self) -> Final {
        let t = self.last.as_ref().expect("at least one replay");
        (Answers::of::<V4, T>(t, &self.replay.addrs), t.count())
    }
}

impl<'r> LpmStep<V4> for &'r Replay<'r> {
    type Out = Box<dyn Replayer + 'r>;
    type Reference = ();

    fn step<T: LpmTable<V4> + Sync + 'static>(&self, _: Option<&()>) -> (Self::Out, ()) {
        let turns = Turns::<T> {
            replay: self,
            last: None,
            builds: Vec::new(),
            lookups: Vec::new(),
        };
        (Box::new(turns), ())
    }
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

    /// Replays onto every implementation playing one of `roles`, in turns
    /// (one replay of each per repetition, the first rotating), alone or
    /// with a reader; then checks every final table against the kernel
    /// port's (`reference`, or the first's). Returns the records and the
    /// kernel port's final answers.
    fn replays(
        &self,
        roles: &[Role],
        readers: usize,
        reference: Option<&Final>,
    ) -> (Vec<Record>, Final) {
        let mut impls = each_lpm(&self, roles, Some(()));
        let rates = in_turns(impls.len(), self.ctx.reps(), |i| {
            let rate = if readers == 0 {
                impls[i].alone()
            } else {
                impls[i].with_reader()
            };
            self.ctx.step();
            rate
        });
        let c = self.case(readers);
        let s = self.ctx.suite();
        let mut reference = reference.cloned();
        let mut recs = Vec::new();
        for (imp, rates) in impls.iter().zip(rates) {
            let name = imp.name();
            let fin = imp.final_answers();
            let r = reference.get_or_insert_with(|| fin.clone());
            if r.1 != fin.1 {
                self.ctx.note(&format!(
                    "WARNING: {name} holds {} prefixes after the replay, kernel {}",
                    fin.1, r.1
                ));
            }
            let bad = check_agreement(self.ctx, &c, name, &fin.0, &r.0) + usize::from(r.1 != fin.1);
            recs.push(Record::stats(
                s,
                &c,
                name,
                &UPDATES_PER_SEC,
                Stats::from_samples(&rates),
            ));
            if readers == 0 {
                let builds = Stats::from_samples(imp.builds());
                recs.push(Record::stats(s, &c, name, &BUILD_MS, builds));
            } else {
                let lookups = Stats::from_samples(imp.lookups());
                recs.push(Record::stats(s, &c, name, &LOOKUPS_PER_SEC, lookups));
            }
            recs.push(Record::single(s, &c, name, &LPM_DISAGREEMENTS, bad as f64));
        }
        self.ctx.print(&recs);
        (recs, reference.expect("at least one implementation"))
    }
}

impl Suite for LpmUpdates {
    type Opts = Opts;
    const NAME: &'static str = "lpm-updates";
    const ABOUT: &'static str =
        "replay of a real day of BGP updates: updates/s alone and with one concurrent reader";

    const DESCRIBE: &'static str = "The RIPE RIS trace of peer 193.0.0.56 (AS3333) on 2026-05-11: the \
         initial IPv4 table (`lpm/ris/ris_as3333_initial_ipv4.txt.gz`, 1,042,325 \
         prefixes) is loaded (untimed here; `build_ms` reports it), then the \
         day's mutations (`..._mutations_ipv4.txt.gz`, 1,393,421: 1,355,568 \
         announces, 37,853 withdraws; quick mode replays the first 300,000) \
         are applied in order: an announce inserts or replaces (`BPF_ANY`) \
         with the line number as the value, a withdraw removes (`ENOENT` \
         ignored). `readers=0`: the replay alone, one thread (the peers \
         through `&mut`). `readers=1`: bpfmaps and the kernel port again, \
         with one reader thread looking up 2^20 addresses inside the initial \
         table's prefixes in a loop (one guard per 256 lookups) for as long \
         as the replay runs; `lookups_per_sec` is the reader's rate. Each \
         repetition replays onto a freshly built table, the implementations \
         in turns (one replay of each per repetition, the first rotating). \
         Afterwards every table must answer the same lookups as the kernel \
         port's and hold as many prefixes.";

    const BASELINE: &'static str = "kernel";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
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
        let alone = roles(true);
        let turns = lpm_names(alone).len() + if opts.no_reader { 0 } else { SHARED.len() };
        ctx.set_steps((turns * ctx.reps()) as u64);
        let (mut all, reference) = replay.replays(alone, 0, None);
        if !opts.no_reader {
            all.extend(replay.replays(SHARED, 1, Some(&reference)).0);
        }
        let rounds = opts
            .churn_rounds
            .unwrap_or(if ctx.quick() { 2 } else { lpm_churn::ROUNDS });
        if rounds > 0 {
            let churn = lpm_churn::Churn {
                suite: ctx.suite(),
                trace: replay.trace.name,
                initial: &replay.trace.initial,
                mutations: &replay.trace.mutations,
                rounds,
            };
            let recs: Vec<Record> = each_lpm(&churn, alone, Some(())).concat();
            ctx.print(&recs);
            all.extend(recs);
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut cases: Vec<&str> = records
            .iter()
            .filter(|r| r.param("readers").is_some())
            .map(|r| r.case.as_str())
            .collect();
        cases.dedup();
        let impls = lpm_names(roles(true));
        let others: Vec<&str> = impls.iter().copied().filter(|&i| i != "kernel").collect();
        let mut cols = vec!["readers".to_string()];
        cols.extend(impls.iter().map(|i| format!("{i} updates M/s")));
        cols.extend(others.iter().map(|i| format!("{i}/kernel")));
        cols.push("bpfmaps/prefix-trie".into());
        cols.extend(
            lpm_names(SHARED)
                .iter()
                .map(|i| format!("{i} reader M lookups/s")),
        );
        cols.push("reader bpfmaps/kernel".into());
        let mut t = Table::new(
            "lpm-updates: BGP trace replay",
            &cols.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .with_note(
            "Mutations applied per second by the one writer (millions, medians) and, with \
             a reader, that reader's lookups per second; ratios above 1 mean \
             faster than the denominator.",
        );
        for c in cases {
            let u = |imp: &str| find(records, c, imp, UPDATES_PER_SEC.name);
            let l = |imp: &str| find(records, c, imp, LOOKUPS_PER_SEC.name);
            let mut row = vec![crate::record::case_value(c, "readers").to_string()];
            row.extend(impls.iter().map(|&i| fmt_mops(u(i).map(|r| r.value))));
            row.extend(others.iter().map(|&i| fmt_ratio(ratio(u(i), u("kernel")))));
            row.push(fmt_ratio(ratio(u("bpfmaps"), u("prefix-trie"))));
            row.extend(
                lpm_names(SHARED)
                    .iter()
                    .map(|&i| fmt_mops(l(i).map(|r| r.value))),
            );
            row.push(fmt_ratio(ratio(l("bpfmaps"), l("kernel"))));
            t.push(row);
        }
        let mut tables = vec![t];
        tables.extend(lpm_churn::summary(Self::NAME, records, &impls));
        tables
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        lpm_churn::plots(Self::NAME, records, &lpm_names(roles(true)))
    }
}
