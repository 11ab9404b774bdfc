//! The [`Suite`] trait, the per-run context [`Ctx`], and [`run_suite`],
//! which prints a suite's results as they come in the style of the
//! kernel's `bench` tool:
//!
//! ```text
//! n=100000,ks=64,fill=16/16   bpfmaps(xxh3)    12.345 ± 0.123 M ops/s   mem 4.2 MiB   1.31x
//! ```
//!
//! The trailing ratio is the speed relative to the suite's baseline in the
//! same case (above 1 means faster, whichever way the metric points).

use std::cell::{Cell, RefCell};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{ArgMatches, Args, Command, FromArgMatches};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::measure::Plan;
use crate::plot::LinePlot;
use crate::record::{Record, metric};
use crate::table::Table;

/// Operations per batch in every suite's timed loops: lookups per pinned
/// guard (as a BPF program runs its lookups under one RCU read section)
/// and per clock check.
pub const BATCH: usize = 256;

/// One benchmark question: a name, options, a run, and how to present it.
/// Suites are listed in [`crate::suites::ALL`] as [`DynSuite`]s.
pub trait Suite: Sync {
    /// The suite's own options: a clap `Args` struct whose options all
    /// have defaults (`report` runs every suite with them).
    type Opts: Args + FromArgMatches;
    /// Subcommand name (`hashfn`, `hash-sweep`, ...).
    const NAME: &'static str;
    /// One line for `--help` and the report.
    const ABOUT: &'static str;
    /// What the suite varies and holds fixed, for the report (Markdown).
    const DESCRIBE: &'static str;
    /// The implementation the others are compared with.
    const BASELINE: &'static str;
    /// Runs the suite, printing through `ctx` as it goes.
    fn run(&self, ctx: &Ctx, opts: Self::Opts) -> Vec<Record>;
    /// Derived tables (ratios), built from records alone.
    fn summaries(&self, _records: &[Record]) -> Vec<Table> {
        Vec::new()
    }
    /// Charts, built from records alone.
    fn plots(&self, _records: &[Record]) -> Vec<LinePlot> {
        Vec::new()
    }
}

/// A [`Suite`] behind one type, for the list of suites, the CLI and the
/// report.
pub trait DynSuite: Sync {
    /// [`Suite::NAME`].
    fn name(&self) -> &'static str;
    /// [`Suite::ABOUT`].
    fn about(&self) -> &'static str;
    /// [`Suite::DESCRIBE`].
    fn describe(&self) -> &'static str;
    /// [`Suite::BASELINE`].
    fn baseline(&self) -> &'static str;
    /// Adds the suite's own options to its subcommand.
    fn args(&self, cmd: Command) -> Command;
    /// Parses the suite's options from `ctx` and runs it.
    fn run(&self, ctx: &Ctx) -> Vec<Record>;
    /// [`Suite::summaries`].
    fn summaries(&self, records: &[Record]) -> Vec<Table>;
    /// [`Suite::plots`].
    fn plots(&self, records: &[Record]) -> Vec<LinePlot>;
}

impl<S: Suite> DynSuite for S {
    fn name(&self) -> &'static str {
        S::NAME
    }
    fn about(&self) -> &'static str {
        S::ABOUT
    }
    fn describe(&self) -> &'static str {
        S::DESCRIBE
    }
    fn baseline(&self) -> &'static str {
        S::BASELINE
    }
    fn args(&self, cmd: Command) -> Command {
        S::Opts::augment_args(cmd)
    }
    fn run(&self, ctx: &Ctx) -> Vec<Record> {
        let opts = S::Opts::from_arg_matches(&ctx.matches).unwrap_or_else(|e| e.exit());
        Suite::run(self, ctx, opts)
    }
    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        Suite::summaries(self, records)
    }
    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        Suite::plots(self, records)
    }
}

/// Options shared by every suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Short run: fewer cases, repetitions and time per repetition.
    pub quick: bool,
    /// Repetitions, overriding the default (5, or 3 when quick).
    pub reps: Option<usize>,
    /// Real data sets (may be absent: suites must fall back).
    pub data_dir: PathBuf,
}

impl RunOptions {
    /// Timed repetitions per measurement: `reps`, else 5 (3 when quick).
    pub fn reps(&self) -> usize {
        self.reps.unwrap_or(if self.quick { 3 } else { 5 })
    }

    /// The default timing plan: the repetitions above, 40 ms each when
    /// quick and 60 ms otherwise (100 ms until R23: the full report
    /// outgrew its 25 minutes on a slower machine; 60 ms still holds a
    /// million lookups of 60 ns). Suites scale it to their operation cost.
    pub fn plan(&self) -> Plan {
        let rep = if self.quick { 40 } else { 60 };
        Plan::new(self.reps(), Duration::from_millis(rep))
    }
}

/// Shows the bar only on a terminal, and only once a run has taken a few
/// seconds, so short runs and redirected output stay clean.
struct Progress {
    bar: ProgressBar,
    start: Instant,
    shown: Cell<bool>,
    tty: bool,
}

const SHOW_PROGRESS_AFTER: Duration = Duration::from_secs(2);

impl Progress {
    fn new(prefix: &'static str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
        let style = ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} (eta {eta})",
        )
        .expect("valid progress template");
        bar.set_style(style);
        bar.set_prefix(prefix);
        Progress {
            bar,
            start: Instant::now(),
            shown: Cell::new(false),
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn tick(&self) {
        self.bar.inc(1);
        if self.tty && !self.shown.get() && self.start.elapsed() >= SHOW_PROGRESS_AFTER {
            self.shown.set(true);
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
}

/// What a running suite sees: options, timing plan, data directory,
/// progress and printing.
pub struct Ctx {
    suite: &'static str,
    baseline: &'static str,
    opts: RunOptions,
    matches: ArgMatches,
    progress: Progress,
    printed: RefCell<Vec<Record>>,
}

impl Ctx {
    /// A context for `suite` with parsed suite options `matches`.
    pub fn new(suite: &dyn DynSuite, opts: RunOptions, matches: ArgMatches) -> Ctx {
        Ctx {
            suite: suite.name(),
            baseline: suite.baseline(),
            opts,
            matches,
            progress: Progress::new(suite.name()),
            printed: RefCell::new(Vec::new()),
        }
    }

    /// The running suite's name, for records.
    pub fn suite(&self) -> &'static str {
        self.suite
    }

    /// Whether `--quick` was given.
    pub fn quick(&self) -> bool {
        self.opts.quick
    }

    /// Timed repetitions per measurement ([`RunOptions::reps`]).
    pub fn reps(&self) -> usize {
        self.opts.reps()
    }

    /// The default timing plan ([`RunOptions::plan`]).
    pub fn plan(&self) -> Plan {
        self.opts.plan()
    }

    /// A list option: what was given, else the mode's default.
    pub fn list_or<T: Clone>(&self, given: Vec<T>, quick: &[T], full: &[T]) -> Vec<T> {
        if !given.is_empty() {
            given
        } else if self.opts.quick {
            quick.to_vec()
        } else {
            full.to_vec()
        }
    }

    /// The data directory given with `--data`.
    pub fn data_dir(&self) -> &Path {
        &self.opts.data_dir
    }

    /// `DATA/rel` if it exists. Suites fall back to generated or machine
    /// data when this is `None`.
    pub fn data_file(&self, rel: &str) -> Option<PathBuf> {
        let p = self.opts.data_dir.join(rel);
        p.exists().then_some(p)
    }

    /// Sets the number of steps the progress bar counts to.
    pub fn set_steps(&self, total: u64) {
        self.progress.bar.set_length(total);
    }

    /// One step done.
    pub fn step(&self) {
        self.progress.tick();
    }

    /// Prints a line of text above the progress bar.
    pub fn note(&self, msg: &str) {
        self.progress.bar.suspend(|| println!("{msg}"));
    }

    /// Prints records, one line per (case, impl): the first record's metric
    /// with its spread, the others appended, then the speed relative to the
    /// baseline in the same case if the baseline was printed before.
    pub fn print(&self, records: &[Record]) {
        let mut lines = Vec::new();
        let mut i = 0;
        while i < records.len() {
            let head = &records[i];
            let mut j = i + 1;
            while j < records.len()
                && records[j].case == head.case
                && records[j].impl_name == head.impl_name
            {
                j += 1;
            }
            let mut line = format!(
                "{:<27} {:<22} {}",
                head.case,
                head.impl_name,
                fmt_value(head, true)
            );
            for r in &records[i + 1..j] {
                let label = metric(&r.metric).map_or(r.metric.as_str(), |m| m.label);
                line += &format!("   {label} {}", fmt_value(r, false));
            }
            if head.impl_name != self.baseline {
                let printed = self.printed.borrow();
                let base = printed.iter().chain(records.iter()).find(|b| {
                    b.impl_name == self.baseline && b.case == head.case && b.metric == head.metric
                });
                if let Some(speed) = base.and_then(|b| speed_vs(head, b)) {
                    line += &format!("   {speed:.2}x");
                }
            }
            lines.push(line);
            i = j;
        }
        self.printed.borrow_mut().extend_from_slice(records);
        self.progress.bar.suspend(|| {
            for l in &lines {
                println!("{l}");
            }
        });
    }

    fn finish(&self) {
        self.progress.bar.finish_and_clear();
    }
}

/// Speed of `r` relative to `base` (same metric): above 1 is better.
pub fn speed_vs(r: &Record, base: &Record) -> Option<f64> {
    let higher = metric(&r.metric).is_none_or(|m| m.higher_is_better);
    let (num, den) = if higher {
        (r.value, base.value)
    } else {
        (base.value, r.value)
    };
    (den > 0.0 && num.is_finite()).then(|| num / den)
}

/// `12.345 [12.012..12.457] M ops/s` (median [min..max]), `3.21
/// [3.19..3.30] ns`, `4.2 MiB`, `0`, `0.0032`.
pub fn fmt_value(r: &Record, with_spread: bool) -> String {
    let spread = |scale: f64, prec: usize| match (r.min, r.max) {
        (Some(lo), Some(hi)) if with_spread => {
            format!(" [{:.prec$}..{:.prec$}]", lo / scale, hi / scale)
        }
        _ => String::new(),
    };
    match r.unit.as_str() {
        "ops/s" => {
            let (scale, prefix) = if r.value >= 1e9 {
                (1e9, "G ")
            } else if r.value >= 1e6 {
                (1e6, "M ")
            } else if r.value >= 1e3 {
                (1e3, "K ")
            } else {
                (1.0, "")
            };
            format!("{:7.3}{} {prefix}ops/s", r.value / scale, spread(scale, 3))
        }
        "ns" => format!("{:7.2}{} ns", r.value, spread(1.0, 2)),
        "bytes" => fmt_bytes(r.value),
        "count" => format!("{:.0}", r.value),
        "ratio" => format!("{:.4}{}", r.value, spread(1.0, 4)),
        other => format!("{:.3}{} {other}", r.value, spread(1.0, 3)),
    }
}

/// `512 B`, `3.0 KiB`, `4.2 MiB`, `1.10 GiB`.
pub fn fmt_bytes(b: f64) -> String {
    const KIB: f64 = 1024.0;
    if b >= KIB * KIB * KIB {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    } else if b >= KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else if b >= KIB {
        format!("{:.1} KiB", b / KIB)
    } else {
        format!("{b:.0} B")
    }
}

/// What one suite run produced.
#[derive(Debug, Clone)]
pub struct SuiteRun {
    /// The measurements.
    pub records: Vec<Record>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// Parses a suite's options with no arguments (all defaults), as `report`
/// runs suites.
pub fn default_matches(suite: &dyn DynSuite) -> ArgMatches {
    suite
        .args(Command::new(suite.name()).no_binary_name(true))
        .try_get_matches_from(Vec::<String>::new())
        .expect("suite options must all have defaults")
}

/// Runs `suite`: a header, the records as they come, then the summaries.
pub fn run_suite(suite: &dyn DynSuite, opts: RunOptions, matches: ArgMatches) -> SuiteRun {
    let mode = if opts.quick { "quick" } else { "full" };
    println!(
        "== {}: {} ({mode}; ratio = speed vs {} in the same case, >1 is faster)",
        suite.name(),
        suite.about(),
        suite.baseline()
    );
    let start = Instant::now();
    crate::measure::spin(Duration::from_millis(if opts.quick { 200 } else { 500 }));
    let ctx = Ctx::new(suite, opts, matches);
    let records = suite.run(&ctx);
    ctx.finish();
    let elapsed = start.elapsed();
    for t in suite.summaries(&records) {
        println!("\n{}", t.to_text());
    }
    println!(
        "== {} done in {:.1} s\n",
        suite.name(),
        elapsed.as_secs_f64()
    );
    SuiteRun { records, elapsed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{FALSE_POSITIVE_RATE, LOOKUPS_PER_SEC, MEM_BYTES_HELD, NS_PER_HASH};
    use crate::stats::Stats;

    /// `--reps` overrides the mode's repetitions; the mode sets their time.
    #[test]
    fn plans_follow_the_options() {
        let opts = |quick, reps| RunOptions {
            quick,
            reps,
            data_dir: PathBuf::new(),
        };
        assert_eq!(opts(false, None).plan().reps, 5);
        assert_eq!(opts(true, None).plan().reps, 3);
        assert_eq!(opts(false, Some(2)).plan().reps, 2);
        assert_eq!(
            opts(false, Some(2)).plan().rep_time,
            Duration::from_millis(60)
        );
        assert_eq!(
            opts(true, Some(7)).plan().rep_time,
            Duration::from_millis(40)
        );
    }

    #[test]
    fn values_format_like_the_kernel_bench() {
        let samples = [12.2e6, 12.457e6, 12.345e6, 12.012e6, 12.4e6];
        let r = Record::stats(
            "s",
            "c",
            "i",
            &LOOKUPS_PER_SEC,
            Stats::from_samples(&samples),
        );
        assert_eq!(fmt_value(&r, true), " 12.345 [12.012..12.457] M ops/s");
        let m = Record::single("s", "c", "i", &MEM_BYTES_HELD, 4.2 * 1024.0 * 1024.0);
        assert_eq!(fmt_value(&m, true), "4.2 MiB");
        let f = Record::single("s", "c", "i", &FALSE_POSITIVE_RATE, 0.003_21);
        assert_eq!(fmt_value(&f, true), "0.0032");
    }

    #[test]
    fn speed_follows_the_metric_direction() {
        let fast = Record::single("s", "c", "a", &NS_PER_HASH, 2.0);
        let slow = Record::single("s", "c", "b", &NS_PER_HASH, 4.0);
        assert_eq!(speed_vs(&fast, &slow), Some(2.0));
        let hi = Record::single("s", "c", "a", &LOOKUPS_PER_SEC, 4.0);
        let lo = Record::single("s", "c", "b", &LOOKUPS_PER_SEC, 2.0);
        assert_eq!(speed_vs(&hi, &lo), Some(2.0));
    }
}
