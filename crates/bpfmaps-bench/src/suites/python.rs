//! `python`: the Python package (`bpfmaps_rs`) against Python's own
//! peers, pytricia and py-radix for IP prefixes and a `dict` for the hash
//! map, on the same data in the same run. The measuring is Python's:
//! this suite prepares the interpreter and runs
//! `crates/bpfmaps-py/bench/bench.py`, whose docstring says what it
//! times, then reads its JSON.
//!
//! The interpreter is the virtual environment `target/py-venv`, made
//! with `python3 -m venv` if absent, with numpy, maturin, pytricia and
//! py-radix from PyPI and the package built into it by `maturin develop
//! --release` (the README's test command leaves it ready; a fresh checkout
//! pays a few minutes here). Without Python 3 or PyPI the suite says so
//! and returns nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;

use crate::record::{NS_PER_LOOKUP, NS_PER_OP, Record, find, ratio};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct Python;

/// `python` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// The virtual environment to use (made and filled if absent)
    /// [default: target/py-venv].
    #[arg(long)]
    venv: Option<PathBuf>,
}

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Runs `cmd`, quietly; its output if it failed.
fn quiet(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The venv's interpreter, with the package and the peers installed.
fn prepare(venv: &Path) -> Result<PathBuf, String> {
    let python = venv.join("bin/python");
    if !python.exists() {
        quiet(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    }
    quiet(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "maturin>=1.5,<2",
        "numpy>=1.21",
        "pytricia>=1.0",
        "py-radix>=1.0",
    ]))?;
    quiet(
        Command::new(venv.join("bin/maturin"))
            .args(["develop", "--release", "--quiet", "--manifest-path"])
            .arg(root().join("crates/bpfmaps-py/Cargo.toml"))
            .env("VIRTUAL_ENV", venv)
            .env("CARGO_TARGET_DIR", root().join("target")),
    )?;
    Ok(python)
}

/// One row of bench.py's JSON.
#[derive(serde::Deserialize)]
struct Row {
    case: String,
    #[serde(rename = "impl")]
    impl_name: String,
    ns: f64,
    min: f64,
    max: f64,
}

#[derive(serde::Deserialize)]
struct Output {
    source: String,
    missing_peers: Vec<String>,
    python: String,
    rows: Vec<Row>,
}

impl Suite for Python {
    type Opts = Opts;
    const NAME: &'static str = "python";
    const ABOUT: &'static str = "the Python package against pytricia, py-radix and dict, same data (Python's clock); the wildcard map's three forms";
    const DESCRIBE: &'static str = "`crates/bpfmaps-py/bench/bench.py` in the virtual \
        environment `target/py-venv` (made here if absent). LPM on the real IPv4 table: \
        lookups one dotted-quad string at a time from a Python loop in `bpfmaps_rs.Lpm.get`, \
        `pytricia.get` and py-radix's `search_best`, and `bpfmaps_rs.Lpm.lookup_many` over a \
        numpy `uint32` array and over the list of dotted-quad strings, for addresses uniform over IPv4 and inside stored prefixes (as \
        `lpm-real` draws them); every table's answers compared first. Hash map, 100K `u32` \
        keys: `t[k]` on a `bpfmaps_rs.Table` against a `dict`, `lookup_many`, and the whole \
        table read by `items_lookup_batch` (pairs of ints, walked with `for k, v in` and \
        collected by `list`) and `items_many` (numpy arrays) against a `for k in table` walk, \
        bare and with `table[k]` for each key (BCC's `items()`, against `table.items()`, the \
        same objects read in batches). Wildcard map on ClassBench's acl1_10k loaded as one rule set (10K generated \
        5-tuple rules without the data): packets drawn inside random rules, classified one at \
        a time from text (`classify`), as numpy rows of field values (`classify_many`) and as \
        headers' bytes (`classify_many_keys`), the three forms' answers compared first. \
        Medians of repetitions timed in turns.";
    const BASELINE: &'static str = "pytricia.get";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        ctx.set_steps(2);
        let venv = opts.venv.unwrap_or_else(|| root().join("target/py-venv"));
        let python = match prepare(&venv) {
            Ok(p) => p,
            Err(e) => {
                ctx.note(&format!("python: skipped, no Python environment: {e}"));
                return Vec::new();
            }
        };
        ctx.step();
        let json =
            std::env::temp_dir().join(format!("bpfmaps-python-bench-{}.json", std::process::id()));
        let mut cmd = Command::new(&python);
        cmd.arg(root().join("crates/bpfmaps-py/bench/bench.py"))
            .arg("--data")
            .arg(ctx.data_dir())
            .arg("--json")
            .arg(&json)
            .arg("--reps")
            .arg(ctx.reps().to_string());
        if ctx.quick() {
            cmd.arg("--quick");
        }
        if let Err(e) = quiet(&mut cmd) {
            panic!("bench.py: {e}");
        }
        let out: Output =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("bench.py's JSON"))
                .expect("bench.py's JSON rows");
        let _ = std::fs::remove_file(&json);
        ctx.note(&format!("python: Python {}, {}", out.python, out.source));
        if !out.missing_peers.is_empty() {
            ctx.note(&format!(
                "python: peers not installed: {}",
                out.missing_peers.join(", ")
            ));
        }
        ctx.step();
        let recs: Vec<Record> = out
            .rows
            .iter()
            .map(|r| {
                let metric = if r.case.contains("read_all") {
                    &NS_PER_OP
                } else {
                    &NS_PER_LOOKUP
                };
                let s = Stats {
                    median: r.ns,
                    min: r.min,
                    max: r.max,
                    n: ctx.reps(),
                };
                Record::stats(ctx.suite(), &r.case, &r.impl_name, metric, s)
            })
            .collect();
        ctx.print(&recs);
        recs
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let ns = |case: &str, imp: &str| {
            find(records, case, imp, NS_PER_LOOKUP.name)
                .or_else(|| find(records, case, imp, NS_PER_OP.name))
        };
        let mut lpm = Table::new(
            "python: IPv4 LPM lookups from Python, ns per address, and speed vs pytricia",
            &["addresses", "bpfmaps get", "bpfmaps lookup_many", "lookup_many of strings", "pytricia", "py-radix", "get/pytricia", "lookup_many/pytricia", "lookup_many(str)/pytricia", "get/py-radix"],
        )
        .with_note("Targets (issue 14): lookup_many at least 20x pytricia's per-address rate, get at least as fast as pytricia's.");
        for kind in ["random", "inside"] {
            let c = format!("lpm,addrs={kind}");
            let cell = |imp| ns(&c, imp).map_or("-".into(), |r: &Record| format!("{:.0}", r.value));
            let py = ns(&c, "pytricia.get");
            lpm.push(vec![
                kind.into(),
                cell("bpfmaps_rs.Lpm.get"),
                cell("bpfmaps_rs.Lpm.lookup_many"),
                cell("bpfmaps_rs.Lpm.lookup_many(str)"),
                cell("pytricia.get"),
                cell("py-radix.search_best"),
                fmt_ratio(ratio(py, ns(&c, "bpfmaps_rs.Lpm.get"))),
                fmt_ratio(ratio(py, ns(&c, "bpfmaps_rs.Lpm.lookup_many"))),
                fmt_ratio(ratio(py, ns(&c, "bpfmaps_rs.Lpm.lookup_many(str)"))),
                fmt_ratio(ratio(
                    ns(&c, "py-radix.search_best"),
                    ns(&c, "bpfmaps_rs.Lpm.get"),
                )),
            ]);
        }
        let mut hash = Table::new(
            "python: hash map from Python, ns per key",
            &["operation", "bpfmaps", "other", "other/bpfmaps (speed)"],
        )
        .with_note("Target (issue 14): items_lookup_batch at least 10x a `for k in table` walk.");
        let pairs = [
            ("hash,op=lookup", "bpfmaps_rs.Table[k]", "dict[k]"),
            ("hash,op=lookup", "bpfmaps_rs.Table.lookup_many", "dict[k]"),
            (
                "hash,op=read_all",
                "for k, v in table.items_lookup_batch()",
                "for k in table",
            ),
            (
                "hash,op=read_all",
                "list(table.items_lookup_batch())",
                "for k in table",
            ),
            (
                "hash,op=read_all",
                "for k, v in table.items_lookup_batch()",
                "for k in table: table[k]",
            ),
            (
                "hash,op=read_all",
                "for k, v in table.items()",
                "for k in table: table[k]",
            ),
            (
                "hash,op=read_all",
                "bpfmaps_rs.Table.items_many",
                "for k in table",
            ),
        ];
        // A row of `ours` against `other` in case `c`: both times, the
        // speed.
        let versus = |c: &str, ours: &str, other: &str| {
            let (a, o) = (ns(c, ours), ns(c, other));
            let cell = |r: Option<&Record>| r.map_or("-".into(), |r| format!("{:.0}", r.value));
            vec![
                format!("{ours} vs {other}"),
                cell(a),
                cell(o),
                fmt_ratio(ratio(o, a)),
            ]
        };
        for (c, ours, other) in pairs {
            hash.push(versus(c, ours, other));
        }
        let mut wildcard = Table::new(
            "python: wildcard map from Python (acl1_10k, or generated rules), ns per packet",
            &["form", "bpfmaps", "other", "other/bpfmaps (speed)"],
        )
        .with_note(
            "Packets drawn inside random rules: as text one at a time, as numpy rows of field \
             values, as headers' bytes (network order).",
        );
        let forms = [
            ("Wildcard.classify_many_keys", "Wildcard.classify(text)"),
            ("Wildcard.classify_many", "Wildcard.classify(text)"),
            ("Wildcard.classify_many_keys", "Wildcard.classify_many"),
        ];
        for (ours, other) in forms {
            wildcard.push(versus("wildcard,op=classify", ours, other));
        }
        vec![lpm, hash, wildcard]
    }
}
