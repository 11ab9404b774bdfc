//! `bpfmaps-bench`: run one benchmark suite, or all of them as a report.
//!
//! ```text
//! bpfmaps-bench <suite> [--quick] [--json FILE] [--plots DIR] [--data DIR] [--reps N] [suite options]
//! bpfmaps-bench report [--quick] [--out DIR] [--data DIR] [--only a,b]
//! bpfmaps-bench list
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{ArgMatches, Args, Command, CommandFactory, FromArgMatches, Parser};

use bpfmaps_bench::machine::Machine;
use bpfmaps_bench::plot::render_svg;
use bpfmaps_bench::record::METRICS;
use bpfmaps_bench::report::{self, ReportInput};
use bpfmaps_bench::suite::{RunOptions, default_matches, run_suite};
use bpfmaps_bench::suites;

/// Benchmarks for bpfmaps: one subcommand per suite, plus `report`.
#[derive(Parser)]
#[command(
    name = "bpfmaps-bench",
    version,
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {}

/// Options every suite takes.
#[derive(Args, Debug)]
struct CommonArgs {
    /// Short run (well under a minute per suite): fewer cases, repetitions, time.
    #[arg(long)]
    quick: bool,
    /// Write the records as a JSON array to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the suite's charts (SVG) into DIR.
    #[arg(long, value_name = "DIR")]
    plots: Option<PathBuf>,
    /// Real data sets (suites fall back to generated data when absent).
    #[arg(long, value_name = "DIR", default_value = "../shared/data")]
    data: PathBuf,
    /// Timed repetitions per measurement [default: 5, quick: 3].
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
}

/// `report` options.
#[derive(Args, Debug)]
struct ReportArgs {
    /// Run every suite in quick mode.
    #[arg(long)]
    quick: bool,
    /// Output directory for report.md, results.json and the SVG charts.
    #[arg(long, value_name = "DIR", default_value = "report")]
    out: PathBuf,
    /// Real data sets (suites fall back to generated data when absent).
    #[arg(long, value_name = "DIR", default_value = "../shared/data")]
    data: PathBuf,
    /// Timed repetitions per measurement [default: 5, quick: 3].
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
    /// Only these suites (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn command() -> Command {
    let mut cmd =
        Cli::command().about("Benchmarks for bpfmaps: one subcommand per suite, plus `report`.");
    for s in suites::ALL {
        // The derive would set `about` from the struct's doc: set ours after.
        let sub = CommonArgs::augment_args(s.args(Command::new(s.name()))).about(s.about());
        cmd = cmd.subcommand(sub);
    }
    cmd.subcommand(
        ReportArgs::augment_args(Command::new("report"))
            .about("Run every suite; write report.md, results.json and SVG charts"),
    )
    .subcommand(Command::new("list").about("List the suites and the metric names"))
}

fn main() -> ExitCode {
    let matches = command().get_matches();
    let result = match matches.subcommand() {
        Some(("report", m)) => run_report(m),
        Some(("list", _)) => {
            list();
            Ok(())
        }
        Some((name, m)) => run_one(name, m),
        None => unreachable!("clap requires a subcommand"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bpfmaps-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn run_one(name: &str, m: &ArgMatches) -> Result<()> {
    let suite = suites::by_name(name).ok_or_else(|| format!("no suite {name:?}"))?;
    let args = CommonArgs::from_arg_matches(m)?;
    let opts = RunOptions {
        quick: args.quick,
        reps: args.reps,
        data_dir: args.data.clone(),
    };
    let run = run_suite(suite, opts, m.clone());
    if let Some(path) = &args.json {
        write_json(path, &run.records)?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plots {
        std::fs::create_dir_all(dir)?;
        for plot in suite.plots(&run.records) {
            let path = dir.join(format!("{}.svg", plot.name));
            render_svg(&plot, &path)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn write_json(path: &Path, records: &[bpfmaps_bench::Record]) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(records)? + "\n")?;
    Ok(())
}

fn run_report(m: &ArgMatches) -> Result<()> {
    let args = ReportArgs::from_arg_matches(m)?;
    for name in &args.only {
        suites::by_name(name).ok_or_else(|| format!("no suite {name:?}"))?;
    }
    let start = Instant::now();
    let opts = RunOptions {
        quick: args.quick,
        reps: args.reps,
        data_dir: args.data.clone(),
    };
    let mut runs = Vec::new();
    for &suite in suites::ALL {
        if !args.only.is_empty() && !args.only.iter().any(|n| n == suite.name()) {
            continue;
        }
        let run = run_suite(suite, opts.clone(), default_matches(suite));
        runs.push((suite, run));
    }
    let input = ReportInput {
        runs,
        machine: Machine::detect(),
        quick: args.quick,
        plan: opts.plan(),
        data_dir: (args.data.display().to_string(), args.data.exists()),
        elapsed: start.elapsed(),
    };
    report::write(&args.out, &input)?;
    println!(
        "wrote {}/report.md, results.json and charts in {:.1} s",
        args.out.display(),
        input.elapsed.as_secs_f64()
    );
    Ok(())
}

fn list() {
    println!("suites:");
    for s in suites::ALL {
        println!("  {:<14} {}", s.name(), s.about());
    }
    println!("\nmetrics (stable names, see METRICS.md):");
    for m in METRICS {
        println!("  {:<20} {:<6} {}", m.name, m.unit, m.doc);
    }
}
