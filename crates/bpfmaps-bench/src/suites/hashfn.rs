//! `hashfn`: nanoseconds per hash call against key size.
//!
//! Varies the function and the key size; holds the keys (64 kernel-bench
//! keys of the size, cycled so no call can be hoisted) and the seed fixed.
//! Calls are independent (throughput, not latency). At each key size the
//! functions are timed in interleaved turns.

use std::hint::black_box;

use bpfmaps::HashPolicy;
use bpfmaps::hash::{jhash, kernel_htab_hash, xxh3};
use clap::Args;

use crate::keys::KeySet;
use crate::measure::rate_samples_interleaved;
use crate::plot::LinePlot;
use crate::record::{NS_PER_HASH, Record, case, find, ratio};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct HashFn;

/// `hashfn` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Key sizes to measure (comma-separated); default: 1..=64 then up to 512.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
}

/// A function's timed loop over the rotating keys, boxed: one dynamic
/// call per batch of [`BATCH`] hash calls, the calls themselves direct.
type HashLoop<'a> = Box<dyn FnMut() -> u64 + 'a>;

/// Makes a function's [`HashLoop`] over the given keys.
type MakeLoop = for<'a> fn(&'a KeySet) -> HashLoop<'a>;

/// The functions in report order, each with its loop; the first is the
/// baseline.
const FUNCTIONS: [(&str, MakeLoop); 4] = [
    ("jhash", |keys| hash_loop(keys, kernel_htab_hash)),
    ("jhash-bytes", |keys| hash_loop(keys, jhash)),
    ("xxh3", |keys| hash_loop(keys, xxh3)),
    ("hybrid", |keys| {
        hash_loop(keys, |k, s| HashPolicy::Hybrid.hash(k, s))
    }),
];

/// Keys hashed in rotation.
const ROTATION: usize = 64;
const _: () = assert!(BATCH.is_multiple_of(ROTATION), "a batch is whole rotations");

const LARGE: [usize; 11] = [80, 96, 128, 160, 192, 240, 256, 320, 384, 448, 512];

fn default_sizes(quick: bool) -> Vec<usize> {
    let small: Vec<usize> = if quick {
        vec![
            1, 2, 3, 4, 6, 8, 12, 15, 16, 20, 24, 28, 31, 32, 33, 40, 48, 56, 63, 64,
        ]
    } else {
        (1..=64).collect()
    };
    small.into_iter().chain(LARGE).collect()
}

/// The batch loop of `f` over the rotating keys: each call hashes every
/// key [`BATCH`] / [`ROTATION`] times and returns the calls made.
fn hash_loop<'a>(keys: &'a KeySet, f: impl Fn(&[u8], u32) -> u32 + 'a) -> HashLoop<'a> {
    assert_eq!(keys.len(), ROTATION, "the rotation's keys");
    Box::new(move || {
        let mut acc = 0u32;
        for _ in 0..BATCH / ROTATION {
            for key in keys.iter() {
                acc ^= f(black_box(key), black_box(0x5eed));
            }
        }
        black_box(acc);
        BATCH as u64
    })
}

impl Suite for HashFn {
    type Opts = Opts;
    const NAME: &'static str = "hashfn";
    const ABOUT: &'static str =
        "ns per hash call vs key size: kernel jhash, plain jhash, xxh3, hybrid";

    const DESCRIBE: &'static str = "Each function hashes 64 kernel-bench keys of one size in rotation \
         (independent calls, so this is throughput). `jhash` is the kernel's \
         `htab_map_hash()`: `jhash2` over words when the size is a multiple of \
         4, else `jhash` over bytes; `jhash-bytes` is plain `jhash`; `hybrid` \
         is `HashPolicy::Hybrid` (`jhash2` for word-multiple keys under 32 \
         bytes, xxh3 otherwise). A timed batch is 256 calls (the 64 keys \
         four times). At each key size the functions are timed in turns \
         (interleaved): one repetition of each function at a time, the one \
         going first rotating, each turn after an untimed quarter-length \
         warm-up of its own, so that load drifting on the machine falls on \
         all of them alike.";

    const BASELINE: &'static str = "jhash";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let sizes = ctx.list_or(opts.sizes, &default_sizes(true), &default_sizes(false));
        ctx.set_steps(sizes.len() as u64);
        let plan = ctx.plan().scaled(0.4);
        let mut all = Vec::new();
        for &size in &sizes {
            let keys = KeySet::kernel(ROTATION, size);
            let c = case(&[("ks", &size)]);
            let mut loops: Vec<HashLoop> = FUNCTIONS.iter().map(|(_, l)| l(&keys)).collect();
            let rates = rate_samples_interleaved(plan, &mut loops);
            let recs: Vec<Record> = FUNCTIONS
                .iter()
                .zip(rates)
                .map(|((name, _), samples)| {
                    Record::stats(
                        Self::NAME,
                        &c,
                        name,
                        &NS_PER_HASH,
                        Stats::inverse_of(&samples, 1e9),
                    )
                })
                .collect();
            ctx.step();
            ctx.print(&recs);
            all.extend(recs);
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "hashfn: speed relative to the kernel's jhash",
            &[
                "key bytes",
                "jhash ns",
                "xxh3 ns",
                "hybrid ns",
                "xxh3/jhash",
                "hybrid/jhash",
                "jhash-bytes/jhash",
            ],
        )
        .with_note(
            "Speed ratios (baseline time / time): above 1 is faster than the kernel's hash.",
        );
        let mut sizes: Vec<usize> = records
            .iter()
            .filter_map(|r| r.param("ks")?.parse().ok())
            .collect();
        sizes.dedup();
        for ks in sizes {
            let c = case(&[("ks", &ks)]);
            let get = |f: &str| find(records, &c, f, NS_PER_HASH.name);
            let ns = |f: &str| get(f).map_or("-".into(), |r| format!("{:.2}", r.value));
            let speed = |f: &str| fmt_ratio(ratio(get("jhash"), get(f)));
            t.push(vec![
                ks.to_string(),
                ns("jhash"),
                ns("xxh3"),
                ns("hybrid"),
                speed("xxh3"),
                speed("hybrid"),
                speed("jhash-bytes"),
            ]);
        }
        vec![t]
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut p = LinePlot::new(
            "hashfn",
            "Hash cost vs key size",
            "key size (bytes, log scale)",
            "ns per hash",
        );
        p.log_x = true;
        for (f, _) in FUNCTIONS {
            let pts = records
                .iter()
                .filter(|r| r.impl_name == f && r.metric == NS_PER_HASH.name)
                .filter_map(|r| Some((r.param("ks")?.parse().ok()?, r.value)))
                .collect();
            p.add(f, pts);
        }
        vec![p]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_has_one_loop_of_a_batch() {
        let keys = KeySet::kernel(ROTATION, 12);
        for (i, (name, make)) in FUNCTIONS.iter().enumerate() {
            assert!(
                FUNCTIONS[..i].iter().all(|(n, _)| n != name),
                "{name} twice"
            );
            assert_eq!(make(&keys)(), BATCH as u64, "{name}");
        }
        assert_eq!(FUNCTIONS[0].0, HashFn::BASELINE);
    }
}
