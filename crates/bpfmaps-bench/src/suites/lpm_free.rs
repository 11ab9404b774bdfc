//! `lpm-free`: the time to free a map of 1M prefixes, and the longest stall
//! a concurrent reader thread sees meanwhile.
//!
//! Varies: the implementation and how the map is freed (`drop`, or
//! bpfmaps' `clear()`). Holds fixed: the prefixes (1M: the real IPv4
//! table in a fixed shuffled order topped up from the RIS peer's table, or
//! generated), u32 values, one reader thread looking up in a loop.
//!
//! Targets (from the issue): a free of 1M prefixes under 50 ms, and no
//! reader stall over 1 ms.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bpfmaps::lpm::LpmTrie;
use clap::Args;

use crate::lpm_tables::{BATCH, LpmStep, LpmTable, Role, build, each_lpm, lpm_names, roles};
use crate::measure::{in_turns, thread_cpu_time};
use crate::prefixes::{Prefix, V4, addrs_inside};
use crate::record::{
    FREE_MS, MAX_READER_STALL_MS, MAX_READER_STALL_ON_CPU_MS, Record, case, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::suites::lpm_data::{SEED, ipv4_prefixes};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct LpmFree;

/// `lpm-free` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Prefixes in the map that is freed.
    #[arg(long, default_value_t = 1_000_000)]
    entries: usize,
    /// Prefixes in the separate map the reader looks up while a map is dropped.
    #[arg(long, default_value_t = 100_000)]
    reader_entries: usize,
    /// Milliseconds the reader keeps watching after the free returns [quick: 50; full: 200].
    #[arg(long)]
    tail_ms: Option<u64>,
}

/// Free targets from the issue.
const TARGET_FREE_MS: f64 = 50.0;
const TARGET_STALL_MS: f64 = 1.0;
/// Reader lookups before the window opens.
const WARM: Duration = Duration::from_millis(20);

/// Flags between the main thread and the reader.
#[derive(Default)]
struct Watch {
    watching: AtomicBool,
    stop: AtomicBool,
}

/// What the reader saw while watching.
#[derive(Debug, Default, Clone, Copy)]
struct Stall {
    /// Longest wall-clock gap between consecutive completed lookups.
    wall: Duration,
    /// The same gap less the time the reader was off the CPU in its batch:
    /// the part it spent running (not preempted).
    on_cpu: Duration,
}

/// Looks up `addrs` in a loop until stopped, and records the longest gap
/// between consecutive completed lookups while `watching` is set. The
/// thread's CPU time is read once per batch of [`BATCH`] lookups: wall
/// time the batch took beyond its CPU time was spent off the CPU, and is
/// taken off the batch's longest gap for [`Stall::on_cpu`].
fn reader<T: LpmTable<V4>>(t: &T, addrs: &[[u8; 4]], w: &Watch, ready: &Barrier) -> Stall {
    let (mut cursor, mut acc, mut stall) = (0, 0u64, Stall::default());
    ready.wait();
    let mut last = Instant::now();
    let (mut batch_wall, mut batch_cpu) = (last, thread_cpu_time());
    while !w.stop.load(Ordering::Relaxed) {
        let watching = w.watching.load(Ordering::Relaxed);
        let mut longest = Duration::ZERO;
        t.visit_batch(&addrs[cursor..cursor + BATCH], |v| {
            acc = acc.wrapping_add(u64::from(v.unwrap_or(0)));
            let now = Instant::now();
            longest = longest.max(now - last);
            last = now;
        });
        cursor = (cursor + BATCH) % addrs.len();
        let (wall, cpu) = (Instant::now(), thread_cpu_time());
        if watching {
            let off_cpu = (wall - batch_wall).saturating_sub(cpu.saturating_sub(batch_cpu));
            stall.wall = stall.wall.max(longest);
            stall.on_cpu = stall.on_cpu.max(longest.saturating_sub(off_cpu));
        }
        (batch_wall, batch_cpu) = (wall, cpu);
    }
    std::hint::black_box(acc);
    stall
}

/// Runs `op` on this thread while a reader loops over `map`; returns the
/// time `op` took and the reader's longest stalls from the start of `op`
/// until `tail` after it returned.
fn watch<T: LpmTable<V4> + Sync>(
    map: &T,
    addrs: &[[u8; 4]],
    tail: Duration,
    op: impl FnOnce() -> Duration,
) -> (Duration, Stall) {
    let w = Watch::default();
    let ready = Barrier::new(2);
    std::thread::scope(|s| {
        let (w, ready) = (&w, &ready);
        let r = s.spawn(move || reader(map, addrs, w, ready));
        ready.wait();
        std::thread::sleep(WARM);
        w.watching.store(true, Ordering::Relaxed);
        let took = op();
        std::thread::sleep(tail);
        w.watching.store(false, Ordering::Relaxed);
        w.stop.store(true, Ordering::Relaxed);
        (took, r.join().expect("reader thread"))
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What one suite run shares.
struct Free<'a> {
    ctx: &'a Ctx,
    n: usize,
    prefixes: &'a [Prefix<V4>],
    reader_prefixes: &'a [Prefix<V4>],
    addrs: Vec<[u8; 4]>,
    tail: Duration,
}

/// One implementation's drops: the map its reader looks up while a big
/// one is dropped, and what each turn saw.
struct Drops<'f, T> {
    free: &'f Free<'f>,
    reader_map: T,
    /// How long the last drop took: the next idle window is as long.
    took: Duration,
    drops: DropSamples,
}

/// What the turns of one implementation saw.
#[derive(Default)]
struct DropSamples {
    name: &'static str,
    frees: Vec<f64>,
    stalls: Vec<Stall>,
    idle: Vec<Stall>,
}

/// One turn of `drop` and `idle`, behind one type for every implementation.
trait DropTurn {
    /// Builds a big map, watches an idle window as long as the last drop,
    /// then drops the map while the reader watches.
    fn turn(&mut self);
    /// What the turns so far saw.
    fn samples(&self) -> &DropSamples;
}

impl<T: LpmTable<V4> + Sync> DropTurn for Drops<'_, T> {
    fn turn(&mut self) {
        let f = self.free;
        let big = build::<V4, T>(f.prefixes).table;
        assert_eq!(big.count(), f.n, "{}: prefixes lost", T::NAME);
        let took = self.took;
        let (_, idle) = watch(&self.reader_map, &f.addrs, f.tail, || {
            std::thread::sleep(took);
            Duration::ZERO
        });
        let (took, stall) = watch(&self.reader_map, &f.addrs, f.tail, move || {
            let start = Instant::now();
            drop(big);
            start.elapsed()
        });
        self.took = took;
        self.drops.idle.push(idle);
        self.drops.frees.push(ms(took));
        self.drops.stalls.push(stall);
    }

    fn samples(&self) -> &DropSamples {
        &self.drops
    }
}

impl<'f> LpmStep<V4> for &'f Free<'f> {
    type Out = Box<dyn DropTurn + 'f>;
    type Reference = ();

    fn step<T: LpmTable<V4> + Sync + 'static>(&self, _: Option<&()>) -> (Self::Out, ()) {
        let drops = Drops {
            free: self,
            reader_map: build::<V4, T>(self.reader_prefixes).table,
            took: Duration::ZERO,
            drops: DropSamples {
                name: T::NAME,
                ..DropSamples::default()
            },
        };
        (Box::new(drops), ())
    }
}

impl Free<'_> {
    fn records(&self, imp: &str, op: &str, frees: &[f64], stalls: &[Stall]) -> Vec<Record> {
        let c = case(&[("n", &self.n), ("op", &op)]);
        let s = self.ctx.suite();
        let mut recs = Vec::new();
        if !frees.is_empty() {
            recs.push(Record::stats(
                s,
                &c,
                imp,
                &FREE_MS,
                Stats::from_samples(frees),
            ));
        }
        let worst = |f: fn(&Stall) -> Duration| stalls.iter().map(f).max().map_or(0.0, ms);
        recs.push(Record::single(
            s,
            &c,
            imp,
            &MAX_READER_STALL_MS,
            worst(|x| x.wall),
        ));
        recs.push(Record::single(
            s,
            &c,
            imp,
            &MAX_READER_STALL_ON_CPU_MS,
            worst(|x| x.on_cpu),
        ));
        self.ctx.step();
        self.ctx.print(&recs);
        recs
    }

    /// `drop` of a full map while the reader looks up in a separate map of
    /// the same kind; before it, a window as long with nothing freed
    /// (`idle`; before, so that work the allocator defers from the drop to
    /// a later call does not land in it).
    /// `drop` and `idle` for every implementation playing one of `roles`,
    /// in turns (one repetition of each at a time, the first rotating).
    fn drop_and_idle(&self, roles: &[Role]) -> Vec<Record> {
        let mut drops = each_lpm(&self, roles, Some(()));
        in_turns(drops.len(), self.ctx.reps(), |i| {
            drops[i].turn();
            0.0
        });
        let mut recs = Vec::new();
        for d in drops.iter().map(|d| d.samples()) {
            recs.extend(self.records(d.name, "drop", &d.frees, &d.stalls));
            recs.extend(self.records(d.name, "idle", &[], &d.idle));
        }
        recs
    }

    fn clear(&self) -> Vec<Record> {
        let (mut frees, mut stalls) = (Vec::new(), Vec::new());
        for _ in 0..self.ctx.reps() {
            let big = build::<V4, LpmTrie>(self.prefixes).table;
            let (took, stall) = watch(&big, &self.addrs, self.tail, || {
                let start = Instant::now();
                big.clear();
                start.elapsed()
            });
            assert_eq!(LpmTable::<V4>::count(&big), 0, "clear left prefixes");
            frees.push(ms(took));
            stalls.push(stall);
        }
        self.records("bpfmaps", "clear", &frees, &stalls)
    }
}

impl Suite for LpmFree {
    type Opts = Opts;
    const NAME: &'static str = "lpm-free";
    const ABOUT: &'static str = "time to free a map of 1M prefixes (drop, clear) and the longest stall of a concurrent reader";

    const DESCRIBE: &'static str = "A map of 1M IPv4 prefixes (the real table in a fixed shuffled order, \
         topped up from the RIS AS3333 table; generated /8-/32 prefixes if the \
         data is absent) with u32 values is built (untimed) and freed on the \
         main thread: `drop` (bpfmaps and the kernel port) or `clear()` \
         (bpfmaps, which hands the old tree to a background thread after a \
         grace period). `free_ms` is the time the main thread spends in the \
         call. Meanwhile one reader thread looks up addresses inside the first \
         100K prefixes in a loop (one guard per 256 lookups) and records the \
         longest gap between two consecutive completed lookups from the start \
         of the free until 50 ms (full: 200 ms) after it returned, which \
         catches work deferred past the call. For `drop` the reader uses a \
         separate 100K-prefix map of the same kind (a map being dropped cannot \
         be read); for `clear()` it reads the map being cleared. `idle` is the \
         same reader over a window as long (taken before the free) with \
         nothing freed: the machine's own noise floor. Stalls are the worst \
         over the repetitions. On a shared machine a preempted reader shows a \
         stall of a scheduler tick (4 ms at 250 Hz) that no map caused: \
         `max_reader_stall_on_cpu_ms` takes off the time the reader was off \
         the CPU (its thread CPU time, read once per 256 lookups, against the \
         wall time). The implementations' `drop` repetitions run in turns \
         (one of each at a time, the first rotating). Targets: free under \
         50 ms, no stall over 1 ms.";

    const BASELINE: &'static str = "kernel";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let set = ipv4_prefixes(ctx, opts.entries.max(1));
        ctx.note(&format!("lpm-free: prefixes: {}", set.source));
        let n = set.prefixes.len();
        let reader_n = opts.reader_entries.clamp(1, n);
        let free = Free {
            ctx,
            n,
            prefixes: &set.prefixes,
            reader_prefixes: &set.prefixes[..reader_n],
            addrs: addrs_inside(&set.prefixes[..reader_n], 1 << 16, SEED + 4),
            tail: Duration::from_millis(opts.tail_ms.unwrap_or(if ctx.quick() { 50 } else { 200 })),
        };
        ctx.set_steps(2 * lpm_names(roles(false)).len() as u64 + 1);
        let mut all = free.drop_and_idle(roles(false));
        all.extend(free.clear());
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "lpm-free: freeing a full map, and a concurrent reader's longest stall",
            &[
                "impl",
                "op",
                "free ms",
                "speed vs kernel drop",
                "free < 50 ms",
                "max reader stall ms",
                "stall < 1 ms",
                "on-CPU stall ms",
                "on-CPU < 1 ms",
                "idle max stall ms",
            ],
        )
        .with_note(
            "`free ms`: median time the freeing thread spent in the call; stalls: \
             the worst gap between two lookups of the reader over all \
             repetitions; on-CPU: that gap less the time the reader was \
             preempted (what the map, not the machine, is to blame for); \
             `idle`: a window as long with nothing freed.",
        );
        let at = |c: &str, imp: &str, m: &str| find(records, c, imp, m);
        let mut cases: Vec<&str> = records
            .iter()
            .filter(|r| r.metric == FREE_MS.name)
            .map(|r| r.case.as_str())
            .collect();
        cases.dedup();
        for c in cases {
            let op = crate::record::case_value(c, "op");
            let idle_case = c.replace(&format!("op={op}"), "op=idle");
            let kernel_drop = c.replace(&format!("op={op}"), "op=drop");
            for imp in ["kernel", "bpfmaps"] {
                let Some(free) = at(c, imp, FREE_MS.name) else {
                    continue;
                };
                let stall = at(c, imp, MAX_READER_STALL_MS.name);
                let on_cpu = at(c, imp, MAX_READER_STALL_ON_CPU_MS.name);
                let yes = |ok: bool| if ok { "yes" } else { "no" }.to_string();
                t.push(vec![
                    imp.to_string(),
                    op.to_string(),
                    format!("{:.3}", free.value),
                    fmt_ratio(ratio(at(&kernel_drop, "kernel", FREE_MS.name), Some(free))),
                    yes(free.value < TARGET_FREE_MS),
                    stall.map_or("-".into(), |r| format!("{:.3}", r.value)),
                    stall.map_or("-".into(), |r| yes(r.value < TARGET_STALL_MS)),
                    on_cpu.map_or("-".into(), |r| format!("{:.3}", r.value)),
                    on_cpu.map_or("-".into(), |r| yes(r.value < TARGET_STALL_MS)),
                    at(&idle_case, imp, MAX_READER_STALL_MS.name)
                        .map_or("-".into(), |r| format!("{:.3}", r.value)),
                ]);
            }
        }
        vec![t]
    }
}
