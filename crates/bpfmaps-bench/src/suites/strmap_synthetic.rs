//! `strmap-synthetic`: string-key maps on the generated key sets of the
//! 2022 BPF ternary-search-tree and qp-trie benchmarks
//! ([`crate::strings::Synthetic`]): path-like keys with long shared
//! prefixes and flat random keys, each with varied and with equal lengths,
//! from 1K to 1M keys. Bytes per key (keys included) and lookups of every
//! key in random order, for every structure of [`crate::str_tables`].
//!
//! Varies: the set's shape, its lengths, its size and the implementation.
//! Holds fixed per set: the keys (drawn from a fixed seed; key `i` has
//! value `i`) and the lookup order (every key once, in another random
//! order), shared by every implementation. As in `strmap-real`
//! ([`super::strmap_common`]), all implementations of a set are built
//! first and kept, then their lookups are timed in turns.

use clap::Args;

use crate::plot::LinePlot;
use crate::record::{LOOKUPS_PER_SEC, Record, case, case_param, find};
use crate::str_tables::{BASELINE, str_table_names};
use crate::strings::{LEVELS, NAME_MAX, PREFIX_MAX, SYNTH_MAX, Synthetic, hit_order};
use crate::suite::{Ctx, Suite};
use crate::suites::strmap_common::{KeySetRun, LookupSet, bases, memory, plot_memory_and_lookups};
use crate::table::{Table, fmt_mops};

/// The suite.
pub struct StrmapSynthetic;

/// `strmap-synthetic` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Key sets (comma-separated) [default: all: hier-varied, hier-equal,
    /// flat-varied, flat-equal].
    #[arg(long, value_delimiter = ',')]
    sets: Vec<String>,
    /// Keys per set (comma-separated) [quick: 1000,10000; full:
    /// 1000,10000,100000,1000000].
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Every structure runs on sets up to this many keys; larger sets run
    /// only bpfmaps' maps and `btreemap` (the full report's time budget).
    #[arg(long, default_value_t = 100_000)]
    all_peers_up_to: usize,
    /// Timed builds per implementation.
    #[arg(long, default_value_t = 1)]
    builds: usize,
}

/// Seed of the keys; the lookup order's is the next one.
const SEED: u64 = 0x7379_6e74;

/// Lookups checked per set (the first ones in lookup order).
const CHECKED: usize = 1 << 16;

/// Whether `name` runs on sets larger than `--all-peers-up-to`: bpfmaps'
/// own maps (the fixed-key hash among them) and the ordered std map.
/// libhat-trie is not among them: it took 27-48 µs per insert of the 1M
/// path-like keys in a run here (75 s of the suite's 255 s).
fn in_large_subset(name: &str) -> bool {
    name.starts_with("bpfmaps-") || name == "btreemap"
}

/// `1K`, `10K`, `1M`, `1500`.
fn short_n(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}K", n / 1000)
    } else {
        n.to_string()
    }
}

impl Suite for StrmapSynthetic {
    type Opts = Opts;
    const NAME: &'static str = "strmap-synthetic";
    const ABOUT: &'static str = "string-key maps on the 2022 BPF benchmark's generated sets (path-like and flat keys, varied and equal lengths, 1K-1M keys): bytes per key, lookups M/s and ns";

    const DESCRIBE: &'static str = "Generated key sets after the 2022 BPF \
         ternary-search-tree and qp-trie benchmarks, drawn from a fixed seed \
         (`src/strings.rs`, `Synthetic`). `keys=hier`: path-like keys, a \
         directory prefix of up to 191 bytes made of 4 components (each \
         ending in `/`, bytes from `[a-z0-9_.-]`) from a complete tree of \
         directories sized for about 32 keys per last-level directory, then \
         a base name of up to 64 bytes; `keys=flat`: random printable bytes \
         (`!` to `~`), up to 255. `len=equal`: every component and name at \
         its longest, so every key is 255 bytes and keys of one directory \
         share 191; `len=varied`: each component, name or flat key length \
         drawn uniformly from 1 to its longest. Keys are distinct; key `i` \
         gets value `i` (a `u64`) and they are inserted in the order drawn. \
         `mem_bytes_per_key` is what the building thread holds afterwards per \
         key, keys included (libhat-trie: its own account); \
         `build_ns_per_key` the inserts' time per key. `lookup=hit` looks up \
         every key once in another random order, cycled through in batches \
         of 256 (`ns_per_lookup`, and `lookups_per_sec` of the one thread); \
         the first 65,536 answers are checked (`strmap_disagreements`). The \
         implementations of a set are built first and kept, then timed in \
         turns, the first rotating. Sets above `--all-peers-up-to` keys \
         (100K by default, so the 1M sets) run only bpfmaps' maps (the \
         fixed-key hash among them) and `btreemap`, which keeps the suite \
         within 4 minutes of the full report on a 2-core machine \
         (libhat-trie alone took 27-48 µs per insert of the 1M path-like \
         keys); the output says which were left out. \
         The baseline `bpfmaps-hash` has `key_size` 255 on every set (the \
         longest key), keys zero-padded.";

    const BASELINE: &'static str = BASELINE;

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let sets: Vec<Synthetic> = Synthetic::ALL
            .into_iter()
            .filter(|s| opts.sets.is_empty() || opts.sets.contains(&s.name()))
            .collect();
        for name in &opts.sets {
            if !Synthetic::ALL.iter().any(|s| s.name() == *name) {
                ctx.note(&format!("{}: no key set {name:?}", ctx.suite()));
            }
        }
        let sizes = ctx.list_or(
            opts.sizes,
            &[1000, 10_000],
            &[1000, 10_000, 100_000, 1_000_000],
        );
        let impls = str_table_names().len();
        ctx.set_steps((sets.len() * sizes.len() * (impls + 1)) as u64);
        // Quick: a quarter of a quick repetition, so that 8 sets of 7 or
        // more structures take a few seconds.
        let plan = if ctx.quick() {
            ctx.plan().scaled(0.25)
        } else {
            ctx.plan()
        };
        let large: Vec<&str> = str_table_names()
            .into_iter()
            .filter(|n| in_large_subset(n))
            .collect();
        if sizes.iter().any(|&n| n > opts.all_peers_up_to) {
            ctx.note(&format!(
                "{}: sets above {} keys run only {} (--all-peers-up-to)",
                ctx.suite(),
                opts.all_peers_up_to,
                large.join(", ")
            ));
        }
        let mut all = Vec::new();
        for set in &sets {
            for &n in &sizes {
                let keys = set.generate(n, SEED);
                let order = hit_order(&keys, SEED + 1);
                let base = case(&[
                    ("keys", &set.shape_name()),
                    ("len", &set.len_name()),
                    ("n", &n),
                    ("mean_len", &format!("{:.1}", keys.mean_len())),
                ]);
                ctx.note(&format!(
                    "{}: {base}: longest key {} bytes, {} bytes of keys",
                    ctx.suite(),
                    keys.max_len(),
                    keys.total_len()
                ));
                let leave_out = |name: &'static str| {
                    (n > opts.all_peers_up_to && !in_large_subset(name)).then(|| {
                        format!(
                            "sets above {} keys run only the subset (--all-peers-up-to)",
                            opts.all_peers_up_to
                        )
                    })
                };
                let mut run = KeySetRun {
                    ctx,
                    base,
                    lookups: vec![LookupSet {
                        kind: "hit",
                        expect: order.iter().map(|&i| Some(u64::from(i))).collect(),
                        probes: keys.permuted(&order),
                    }],
                    keys,
                    builds: opts.builds,
                    checked: CHECKED,
                    leave_out: &leave_out,
                    lookups_per_sec: true,
                };
                let mut kept = run.build_all();
                run.time_lookups(&mut kept, plan);
                all.extend(kept.into_iter().flat_map(|k| k.recs));
            }
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let bases = bases(records);
        let names = str_table_names();
        let mut tables = Vec::new();
        for (shape, len) in set_names(&bases) {
            let of_set = of_set(&bases, shape, len);
            let mut cols = vec!["impl".to_string()];
            for b in &of_set {
                let n = case_param(b, "n").and_then(|n| n.parse().ok()).unwrap_or(0);
                cols.push(format!("{} B/key", short_n(n)));
                cols.push(format!("{} M lookups/s", short_n(n)));
            }
            let mut t = Table::new(
                format!("strmap-synthetic keys={shape},len={len}"),
                &cols.iter().map(String::as_str).collect::<Vec<_>>(),
            )
            .with_note(format!(
                "Bytes per key include the keys (* = the structure's own account); lookups \
                 of every key in random order, one thread, medians. `-`: not run at that \
                 size (see --all-peers-up-to) or the keys refused. Hierarchical keys: \
                 {LEVELS} directory components, prefix up to {PREFIX_MAX} bytes, base name \
                 up to {NAME_MAX}; flat keys up to {SYNTH_MAX} bytes."
            ));
            for imp in &names {
                if !of_set.iter().any(|b| memory(records, b, imp).is_some()) {
                    continue;
                }
                let mut row = vec![imp.to_string()];
                for b in &of_set {
                    row.push(memory(records, b, imp).map_or("-".into(), |(r, own)| {
                        format!("{:.1}{}", r.value, if own { "*" } else { "" })
                    }));
                    let hit = find(
                        records,
                        &format!("{b},lookup=hit"),
                        imp,
                        LOOKUPS_PER_SEC.name,
                    );
                    row.push(fmt_mops(hit.map(|r| r.value)));
                }
                t.push(row);
            }
            tables.push(t);
        }
        tables
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let bases = bases(records);
        let mut plots = Vec::new();
        for (shape, len) in set_names(&bases) {
            let of_set = of_set(&bases, shape, len);
            let x = |b: &str| case_param(b, "n")?.parse::<f64>().ok();
            let mut mem = LinePlot::new(
                format!("strmap-synthetic-{shape}-{len}-memory"),
                format!("keys={shape}, len={len}: bytes per key, keys included"),
                "keys in the set (log scale)",
                "bytes per key",
            );
            let mut hit = LinePlot::new(
                format!("strmap-synthetic-{shape}-{len}-lookup"),
                format!("keys={shape}, len={len}: lookup of every key in random order"),
                "keys in the set (log scale)",
                "ns per lookup",
            );
            mem.log_x = true;
            hit.log_x = true;
            plot_memory_and_lookups(records, &of_set, x, &mut mem, &mut hit);
            plots.push(mem);
            plots.push(hit);
        }
        plots.retain(|p| !p.is_empty());
        plots
    }
}

/// The (`keys`, `len`) pairs of `bases`, in run order.
fn set_names<'a>(bases: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    for b in bases {
        if let (Some(shape), Some(len)) = (case_param(b, "keys"), case_param(b, "len"))
            && !out.contains(&(shape, len))
        {
            out.push((shape, len));
        }
    }
    out
}

/// The cases of one key set (`keys=shape,len=len`), every size.
fn of_set<'a>(bases: &[&'a str], shape: &str, len: &str) -> Vec<&'a str> {
    bases
        .iter()
        .copied()
        .filter(|b| case_param(b, "keys") == Some(shape) && case_param(b, "len") == Some(len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{NS_PER_LOOKUP, STRMAP_DISAGREEMENTS};
    use crate::suites::by_name;

    /// Runs quick on two small sizes of two sets, the larger above
    /// `--all-peers-up-to`: every implementation answers right, the larger
    /// size runs only the subset, and every table and chart is there.
    #[test]
    fn runs_small_sets_with_the_large_subset() {
        let no_data = std::env::temp_dir().join("bpfmaps-bench-no-such-data");
        let args = [
            "--sets",
            "hier-varied,flat-equal",
            "--sizes",
            "300,900",
            "--all-peers-up-to",
            "500",
        ];
        let records = crate::suites::run_quick("strmap-synthetic", &args, no_data);
        for r in &records {
            assert!(crate::record::metric(&r.metric).is_some(), "{}", r.metric);
            if r.metric == STRMAP_DISAGREEMENTS.name {
                assert_eq!(r.value, 0.0, "{} {}", r.case, r.impl_name);
            }
        }
        let bases = bases(&records);
        assert_eq!(bases.len(), 4);
        let names = str_table_names();
        for base in &bases {
            let large = case_param(base, "n") == Some("900");
            for imp in &names {
                let ran = memory(&records, base, imp).is_some();
                assert_eq!(ran, !large || in_large_subset(imp), "{base} {imp}");
                let hit = format!("{base},lookup=hit");
                for m in [NS_PER_LOOKUP.name, LOOKUPS_PER_SEC.name] {
                    assert_eq!(find(&records, &hit, imp, m).is_some(), ran, "{base} {imp}");
                }
            }
        }
        let suite = by_name("strmap-synthetic").unwrap();
        let tables = suite.summaries(&records);
        assert_eq!(tables.len(), 2);
        assert_eq!(tables[0].rows.len(), names.len());
        assert_eq!(suite.plots(&records).len(), 4);
        assert_eq!(short_n(1_000_000), "1M");
        assert_eq!(short_n(10_000), "10K");
        assert_eq!(short_n(1500), "1500");
    }
}
