//! `hashfn`: nanoseconds per hash call against key size.
//!
//! Varies the function and the key size; holds the keys (64 kernel-bench
//! keys of the size, cycled so no call can be hoisted) and the seed fixed.
//! Calls are independent (throughput, not latency).

use std::hint::black_box;

use bpfmaps::HashPolicy;
use bpfmaps::hash::{jhash, kernel_htab_hash, xxh3};
use clap::{Args, Command};

use crate::keys::KeySet;
use crate::measure::ns_per_op;
use crate::plot::LinePlot;
use crate::record::{NS_PER_HASH, Record, case, find, ratio};
use crate::suite::{Ctx, Suite};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct HashFn;

/// `hashfn` options.
#[derive(Debug, Args)]
struct Opts {
    /// Key sizes to measure (comma-separated); default: 1..=64 then up to 512.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
}

/// Functions in report order; the first is the baseline.
const FUNCTIONS: [&str; 4] = ["jhash", "jhash-bytes", "xxh3", "hybrid"];

/// Keys hashed in rotation.
const ROTATION: usize = 64;

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

/// Times `f` over the rotating keys; ns per call.
fn time_fn(ctx: &Ctx, keys: &KeySet, f: impl Fn(&[u8], u32) -> u32) -> crate::stats::Stats {
    let plan = ctx.plan().scaled(0.4);
    ns_per_op(plan, || {
        let mut acc = 0u32;
        for key in keys.iter() {
            acc ^= f(black_box(key), black_box(0x5eed));
        }
        black_box(acc);
        keys.len() as u64
    })
}

impl Suite for HashFn {
    fn name(&self) -> &'static str {
        "hashfn"
    }

    fn about(&self) -> &'static str {
        "ns per hash call vs key size: kernel jhash, plain jhash, xxh3, hybrid"
    }

    fn describe(&self) -> &'static str {
        "Each function hashes 64 kernel-bench keys of one size in rotation \
         (independent calls, so this is throughput). `jhash` is the kernel's \
         `htab_map_hash()`: `jhash2` over words when the size is a multiple of \
         4, else `jhash` over bytes; `jhash-bytes` is plain `jhash`; `hybrid` \
         is `HashPolicy::Hybrid` (`jhash2` for word-multiple keys under 32 \
         bytes, xxh3 otherwise)."
    }

    fn baseline(&self) -> &'static str {
        "jhash"
    }

    fn args(&self, cmd: Command) -> Command {
        Opts::augment_args(cmd)
    }

    fn run(&self, ctx: &Ctx) -> Vec<Record> {
        let opts: Opts = ctx.options();
        let sizes = if opts.sizes.is_empty() {
            default_sizes(ctx.quick())
        } else {
            opts.sizes
        };
        ctx.set_steps((sizes.len() * FUNCTIONS.len()) as u64);
        let mut all = Vec::new();
        for &size in &sizes {
            let keys = KeySet::kernel(ROTATION, size);
            let c = case(&[("ks", &size)]);
            let mut recs = Vec::new();
            for name in FUNCTIONS {
                let s = match name {
                    "jhash" => time_fn(ctx, &keys, kernel_htab_hash),
                    "jhash-bytes" => time_fn(ctx, &keys, jhash),
                    "xxh3" => time_fn(ctx, &keys, xxh3),
                    _ => time_fn(ctx, &keys, |k, s| HashPolicy::Hybrid.hash(k, s)),
                };
                recs.push(Record::stats(self.name(), &c, name, &NS_PER_HASH, s));
                ctx.step();
            }
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
        for f in FUNCTIONS {
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
