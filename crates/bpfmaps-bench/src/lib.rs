//! # bpfmaps-bench
//!
//! The benchmark harness for bpfmaps: one CLI, `bpfmaps-bench`, with one
//! *suite* per question, and a `report` command that runs them all and
//! writes Markdown, JSON and SVG charts.
//!
//! ## Layout
//! - [`suite`]: the [`Suite`] trait and the per-run context [`Ctx`]
//!   (options, progress bar, printing).
//! - [`suites`]: the registry, one file per suite.
//! - [`measure`] and [`stats`]: timing over batches, median and spread.
//! - [`alloc`]: the counting global allocator behind every memory number.
//! - [`record`]: the JSON record and the stable metric names.
//! - [`keys`], [`hasher`]: kernel-bench keys, a `BuildHasher` per
//!   [`bpfmaps::HashPolicy`] so peers hash exactly as bpfmaps does.
//! - [`prefixes`], [`lpm_tables`]: IP prefix sets (real tables, the BGP
//!   trace, generated fallbacks, lookup addresses) and the LPM
//!   implementations compared, behind one trait.
//! - [`strings`], [`str_tables`]: string key sets (the shared files,
//!   this machine's kernel symbols and BTF strings, the generated sets of
//!   the 2022 BPF benchmarks, lookup and miss sets) and the string-key
//!   maps compared, behind one trait.
//! - [`native`]: C peers from Debian packages (Judy, libhat-trie).
//! - [`table`], [`plot`], [`report`], [`machine`]: output.
//!
//! ## Adding a suite
//! Write `src/suites/NAME.rs` with a unit struct implementing [`Suite`]
//! (options as a `clap::Args` struct, its [`Suite::Opts`], handed to
//! `run`), then add `mod NAME;` and `&NAME::Struct` to [`suites::ALL`].
//! The CLI subcommand, `--json`, the report section and the plots
//! follow from the trait.
//!
//! ## Method
//! Rates are measured with [`std::time::Instant`] over batches of
//! operations, for several repetitions (5, or 3 with `--quick`) after a
//! short warm-up, implementations compared in one case in interleaved
//! turns (the first rotating); results are the median and spread (min..max)
//! over repetitions.
//! Memory is measured by the counting allocator: bytes requested from the
//! system allocator and not yet freed, by the building thread.

pub mod alloc;
pub mod hash_impls;
pub mod hasher;
pub mod keys;
pub mod lpm_tables;
pub mod machine;
pub mod measure;
pub mod native;
pub mod plot;
pub mod prefixes;
pub mod range_tables;
pub mod record;
pub mod report;
pub mod stats;
pub mod str_tables;
pub mod strings;
pub mod suite;
pub mod suites;
pub mod table;

pub use record::{Metric, Record};
pub use suite::{Ctx, DynSuite, RunOptions, Suite};
