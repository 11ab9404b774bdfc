//! The suite registry: one file per suite, listed in [`ALL`].
//!
//! To add a suite: write `NAME.rs` with a unit struct implementing
//! [`Suite`](crate::Suite), then add `mod NAME;` below and the struct to
//! [`ALL`]. The CLI subcommand, `--json`, the report section and its plots
//! come from the trait. New metric names go in
//! [`record::METRICS`](crate::record::METRICS) and `METRICS.md`.

use bpfmaps::HashPolicy;

use crate::suite::DynSuite;

mod bloom;
pub mod capi;
mod concurrency;
mod hash_sweep;
mod hashfn;
mod lpm_churn;
mod lpm_data;
mod lpm_free;
mod lpm_kernel_bench;
mod lpm_real;
mod lpm_scale;
mod lpm_updates;
mod maple_kernel;
mod maple_readers;
mod maple_scale;
mod maple_vma;
mod python;
mod stackmap;
mod strmap_common;
mod strmap_real;
mod strmap_synthetic;
mod strmap_threads;
pub mod wildcard_cilium;
pub mod wildcard_classbench;
mod wildcard_geoip;

/// Every suite, in the order `report` runs them.
pub const ALL: &[&dyn DynSuite] = &[
    &hashfn::HashFn,
    &hash_sweep::HashSweep,
    &concurrency::Concurrency,
    &bloom::Bloom,
    &stackmap::StackMap,
    &lpm_kernel_bench::LpmKernelBench,
    &lpm_scale::LpmScale,
    &lpm_real::LpmReal,
    &lpm_updates::LpmUpdates,
    &lpm_free::LpmFree,
    &strmap_real::StrmapReal,
    &strmap_synthetic::StrmapSynthetic,
    &strmap_threads::StrmapThreads,
    &maple_scale::MapleScale,
    &maple_vma::MapleVma,
    &maple_readers::MapleReaders,
    &maple_kernel::MapleKernel,
    &wildcard_classbench::WildcardClassbench,
    &wildcard_cilium::WildcardCilium,
    &wildcard_geoip::WildcardGeoip,
    &capi::Capi,
    &python::Python,
];

/// The suite named `name`.
pub fn by_name(name: &str) -> Option<&'static dyn DynSuite> {
    ALL.iter().copied().find(|s| s.name() == name)
}

/// Parses a [`HashPolicy`] by its short name, for suite options.
pub fn parse_policy(s: &str) -> Result<HashPolicy, String> {
    HashPolicy::ALL
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("unknown hash policy {s:?} (jhash, xxh3, hybrid)"))
}

/// Runs suite `name` with `args`, quick, one repetition, reading data
/// from `data_dir`; returns its records (for the suites' tests).
#[cfg(test)]
pub(crate) fn run_quick(
    name: &str,
    args: &[&str],
    data_dir: std::path::PathBuf,
) -> Vec<crate::Record> {
    use clap::Command;
    let suite = by_name(name).unwrap();
    let matches = suite
        .args(Command::new(suite.name()).no_binary_name(true))
        .try_get_matches_from(args)
        .unwrap();
    let opts = crate::RunOptions {
        quick: true,
        reps: Some(1),
        data_dir,
    };
    suite.run(&crate::Ctx::new(suite, opts, matches))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::default_matches;

    #[test]
    fn names_are_unique_and_options_have_defaults() {
        for (i, s) in ALL.iter().enumerate() {
            assert!(
                ALL[..i].iter().all(|o| o.name() != s.name()),
                "{}",
                s.name()
            );
            assert!(by_name(s.name()).is_some());
            default_matches(*s);
        }
        assert_eq!(parse_policy("hybrid"), Ok(HashPolicy::Hybrid));
        assert!(parse_policy("crc32").is_err());
    }

    /// Runs `name` with `args`, quick, one repetition, without data files
    /// (so on generated prefixes); returns its records.
    fn run_small(name: &str, args: &[&str]) -> Vec<crate::Record> {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let records = run_quick(name, args, no_data);
        assert!(!records.is_empty(), "{name} produced nothing");
        assert!(
            records
                .iter()
                .filter(|r| r.metric == crate::record::LPM_DISAGREEMENTS.name)
                .all(|r| r.value == 0.0),
            "{name}: implementations disagree"
        );
        for r in &records {
            assert!(crate::record::metric(&r.metric).is_some(), "{}", r.metric);
        }
        let suite = by_name(name).unwrap();
        suite.summaries(&records);
        suite.plots(&records);
        records
    }

    #[test]
    fn lpm_suites_run_on_generated_prefixes() {
        let r = run_small(
            "lpm-kernel-bench",
            &["--entries", "300", "--free-builds", "1"],
        );
        assert_eq!(
            r.iter().filter(|r| r.param("op") == Some("free")).count(),
            4
        );
        let r = run_small("lpm-scale", &["--entries", "1,500", "--addrs", "256"]);
        assert!(r.iter().any(|r| r.param("n") == Some("500")));
        let r = run_small(
            "lpm-free",
            &[
                "--entries",
                "3000",
                "--reader-entries",
                "200",
                "--tail-ms",
                "1",
            ],
        );
        assert!(r.iter().any(|r| r.param("op") == Some("clear")));
    }
}
