//! `bpfmaps-bench report`: Markdown, JSON and SVG from a set of suite runs.
//!
//! Layout of the output directory:
//! - `report.md`: machine, method, then per suite: what it varies, the
//!   summary tables (ratios), the charts, and every result in a pivot
//!   table (case × implementation) with speed relative to the baseline;
//! - `results.json`: every record (see [`crate::record`]);
//! - `*.svg`: the charts.

use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::time::Duration;

use crate::machine::Machine;
use crate::measure::Plan;
use crate::plot::render_svg;
use crate::record::{Record, find, metric};
use crate::suite::{DynSuite, SuiteRun, fmt_bytes, speed_vs};

/// Everything a report is made from.
pub struct ReportInput<'a> {
    /// Suites in run order with what they produced.
    pub runs: Vec<(&'a dyn DynSuite, SuiteRun)>,
    /// Where and when.
    pub machine: Machine,
    /// Whether suites ran in quick mode.
    pub quick: bool,
    /// The timing plan the suites started from.
    pub plan: Plan,
    /// The `--data` directory and whether it existed.
    pub data_dir: (String, bool),
    /// Total wall time.
    pub elapsed: Duration,
}

/// Writes `report.md`, `results.json` and the charts into `dir`.
pub fn write(dir: &Path, input: &ReportInput<'_>) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let records: Vec<&Record> = input.runs.iter().flat_map(|(_, r)| &r.records).collect();
    let json = serde_json::to_string_pretty(&records).map_err(io::Error::other)?;
    std::fs::write(dir.join("results.json"), json + "\n")?;

    let mut md = String::new();
    let mode = if input.quick { "quick" } else { "full" };
    let _ = write!(
        md,
        "# bpfmaps benchmark report\n\n\
         Generated {} by `bpfmaps-bench report{}` ({mode} mode, {:.0} s in all). \
         Every number below was measured in this run; `results.json` holds them all.\n\n\
         ## Machine\n\n{}\n\
         ## Method\n\n\
         - Rates: `std::time::Instant` around batches of operations, {} repetitions of {} ms each by default (a suite may scale that to its operations' cost) after a warm-up of half a repetition; \
         implementations compared in one case are timed in interleaved turns, the first rotating; \
         `median [min..max]` over repetitions.\n\
         - Speed ratios: above 1 means faster than the baseline named in the section, whichever way the metric points.\n\
         - Memory: bytes requested from the allocator and still held by the building thread after building \
         (a counting global allocator); `reported` is the map's own `memory_usage()`.\n\
         - Peers of the hash suites hash with the same policy and seed as bpfmaps (a `BuildHasher` per policy), \
         so they differ from bpfmaps only in table design.\n\
         - Data directory: `{}` ({}). The hash suites use generated data (kernel-bench keys, synthetic \
         stacks); the LPM suites read the real tables there and say in their output when they fall back to \
         generated prefixes; `strmap-real` reads `strings/` there, this machine's `/proc/kallsyms` and \
         `/sys/kernel/btf/vmlinux` in place of the kernel symbols and BTF strings there if those are missing, \
         and skips a set it cannot read; `strmap-threads` reads \
         `strings/kallsyms.txt.gz` there, else this machine's `/proc/kallsyms`; `strmap-synthetic` \
         generates its keys.\n\n",
        input.machine.date,
        if input.quick { " --quick" } else { "" },
        input.elapsed.as_secs_f64(),
        input.machine.to_markdown(),
        input.plan.reps,
        input.plan.rep_time.as_millis(),
        input.data_dir.0,
        if input.data_dir.1 {
            "present"
        } else {
            "absent"
        },
    );

    for (suite, run) in &input.runs {
        let _ = write!(
            md,
            "## {}\n\n{}\n\n{}\n\nBaseline: `{}`. Ran in {:.1} s.\n\n",
            suite.name(),
            suite.about(),
            suite.describe(),
            suite.baseline(),
            run.elapsed.as_secs_f64()
        );
        for t in suite.summaries(&run.records) {
            md += &t.to_markdown();
            md.push('\n');
        }
        for plot in suite.plots(&run.records) {
            let file = format!("{}.svg", plot.name);
            match render_svg(&plot, &dir.join(&file)) {
                Ok(()) => {
                    let _ = writeln!(md, "![{}]({file})\n", plot.title);
                }
                Err(e) => {
                    let _ = writeln!(md, "_chart {file} failed: {e}_\n");
                }
            }
        }
        md += &all_results(*suite, &run.records);
    }
    std::fs::write(dir.join("report.md"), md)
}

/// One pivot table per metric, inside a collapsible block.
fn all_results(suite: &dyn DynSuite, records: &[Record]) -> String {
    let mut out = format!(
        "<details><summary>All {} results of {}</summary>\n\n",
        records.len(),
        suite.name()
    );
    let mut metrics: Vec<&str> = Vec::new();
    for r in records {
        if !metrics.contains(&r.metric.as_str()) {
            metrics.push(&r.metric);
        }
    }
    for m in metrics {
        let rows: Vec<&Record> = records.iter().filter(|r| r.metric == m).collect();
        let mut cases: Vec<&str> = Vec::new();
        let mut impls: Vec<&str> = Vec::new();
        for r in &rows {
            if !cases.contains(&r.case.as_str()) {
                cases.push(&r.case);
            }
            if !impls.contains(&r.impl_name.as_str()) {
                impls.push(&r.impl_name);
            }
        }
        let unit = rows.first().map_or("", |r| r.unit.as_str());
        let shown_unit = match unit {
            "ops/s" => "M ops/s",
            "bytes" => "",
            u => u,
        };
        let _ = write!(
            out,
            "**{m}** {}\n\n| case |",
            if shown_unit.is_empty() {
                String::new()
            } else {
                format!("({shown_unit})")
            }
        );
        for i in &impls {
            let _ = write!(out, " {i} |");
        }
        out += "\n| --- |";
        out += &" ---: |".repeat(impls.len());
        out.push('\n');
        for c in cases {
            let _ = write!(out, "| {c} |");
            for i in &impls {
                let cell = find(records, c, i, m).map_or("".into(), |r| {
                    let mut cell = cell_value(r);
                    if *i != suite.baseline()
                        && r.min.is_some()
                        && let Some(s) =
                            find(records, c, suite.baseline(), m).and_then(|b| speed_vs(r, b))
                    {
                        let _ = write!(cell, " ({s:.2}x)");
                    }
                    cell
                });
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
        if let Some(info) = metric(m) {
            let _ = write!(out, "\n_{}_: {}.\n", info.name, info.doc);
        }
        out.push('\n');
    }
    out + "</details>\n\n"
}

/// A compact cell: `12.35 [12.01..12.46]` (M ops/s), `3.21 [3.19..3.30]`
/// (ns), `4.2 MiB`.
fn cell_value(r: &Record) -> String {
    let (scale, prec) = match r.unit.as_str() {
        "ops/s" => (1e6, 2),
        "bytes" => return fmt_bytes(r.value),
        "count" => return format!("{:.0}", r.value),
        "ratio" => (1.0, 4),
        "ms" => (1.0, 3),
        _ => (1.0, 2),
    };
    let v = r.value / scale;
    match (r.min, r.max) {
        (Some(lo), Some(hi)) => {
            format!("{v:.prec$} [{:.prec$}..{:.prec$}]", lo / scale, hi / scale)
        }
        _ => format!("{v:.prec$}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::LOOKUPS_PER_SEC;
    use crate::stats::Stats;

    #[test]
    fn cells_are_compact() {
        let samples = Stats::from_samples(&[12.46e6, 12.01e6, 12.345e6]);
        let r = Record::stats("s", "c", "i", &LOOKUPS_PER_SEC, samples);
        assert_eq!(cell_value(&r), "12.35 [12.01..12.46]");
    }
}
