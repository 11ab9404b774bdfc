//! `strmap-real`: string-key maps on real key sets: bytes per key (keys
//! included), build time, lookups of every key in random order, misses,
//! and whole ordered walks, for the fixed-key hash map BPF users have
//! today, the std maps and the string-trie peers ([`crate::str_tables`]).
//!
//! Varies: the data set ([`crate::strings::DATA_SETS`]) and the
//! implementation. Holds fixed per set: the keys (deduplicated, in one
//! random build order; key `i` has value `i`), the hit lookups (every key
//! once, in another random order) and the misses (each key with one byte
//! changed), drawn once and shared by every implementation. All
//! implementations are built first and kept; their lookups are then timed
//! in turns (one repetition of each at a time, the first rotating), so
//! that load drifting on the machine falls on all of them alike. Walks are
//! timed the same way, one whole walk per batch: walks that touch each
//! key's length and value, then walks that read every byte of each key.

use clap::Args;

use crate::measure::rate_samples_interleaved;
use crate::plot::LinePlot;
use crate::record::{
    BUILD_NS_PER_KEY, ITER_NS_PER_KEY, NS_PER_LOOKUP, Record, STRMAP_DISAGREEMENTS, case,
    case_param, find, ratio,
};
use crate::stats::Stats;
use crate::str_tables::{AnyStr, BASELINE, WalkUse, str_table_names};
use crate::strings::{DATA_SETS, DataSet, hit_order, misses, shuffled};
use crate::suite::{Ctx, Suite};
use crate::suites::strmap_common::{
    Kept, KeySetRun, LookupSet, bases, memory, plot_memory_and_lookups,
};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct StrmapReal;

/// `strmap-real` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Data sets (comma-separated) [default: kallsyms, btf_strings,
    /// linux_paths, domains_top100k, english_words, then machine-kallsyms
    /// and machine-btf each only if the first or second could not be read].
    #[arg(long, value_delimiter = ',')]
    sets: Vec<String>,
    /// At most this many keys per set, the first in file order (0: all).
    #[arg(long, default_value_t = 0)]
    max_keys: usize,
    /// Timed builds per implementation [quick: 1; full: 3].
    #[arg(long)]
    builds: Option<usize>,
}

/// Seed of the build order, the hit order and the misses.
const SEED: u64 = 0x7374_726d;

/// The lookup sets.
const LOOKUPS: [&str; 2] = ["hit", "miss"];

/// Lookups checked per lookup set with `--quick` (all otherwise): checking
/// every key of every set against every structure would take a fifth of a
/// quick run.
const QUICK_CHECKED: usize = 1 << 16;

/// Times whole ordered walks of every ordered implementation in turns,
/// after checking that each gives the keys, values and order of the first
/// (`btreemap`): walks that touch each key's length (`walk=iter`), then
/// walks that read each key's bytes (`walk=read`).
fn walks(set: &KeySetRun, kept: &[Kept]) -> Vec<Record> {
    let s = set.ctx.suite();
    let ordered: Vec<&dyn AnyStr> = kept
        .iter()
        .map(|k| k.table.as_ref())
        .filter(|t| t.walk(WalkUse::Length).is_some())
        .collect();
    let digests: Vec<_> = ordered.iter().map(|t| t.walk_digest()).collect();
    let bad: Vec<bool> = digests
        .iter()
        .map(|d| *d != digests[0] || d.is_none_or(|(n, _)| n != set.keys.len() as u64))
        .collect();
    for (t, &bad) in ordered.iter().zip(&bad) {
        if bad {
            set.ctx.note(&format!(
                "WARNING: {}'s ordered walk differs from {}'s ({})",
                t.name(),
                ordered[0].name(),
                set.base
            ));
        }
    }
    let mut recs = Vec::new();
    for (name, with) in [("iter", WalkUse::Length), ("read", WalkUse::Bytes)] {
        let c = format!("{},walk={name}", set.base);
        let rates = {
            let mut loops: Vec<_> = ordered
                .iter()
                .map(|t| t.walk(with).expect("ordered"))
                .collect();
            rate_samples_interleaved(set.ctx.plan(), &mut loops)
        };
        let mut these = Vec::new();
        for ((t, samples), &bad) in ordered.iter().zip(rates).zip(&bad) {
            these.push(Record::stats(
                s,
                &c,
                t.name(),
                &ITER_NS_PER_KEY,
                Stats::inverse_of(&samples, 1e9),
            ));
            these.push(Record::single(
                s,
                &c,
                t.name(),
                &STRMAP_DISAGREEMENTS,
                f64::from(u8::from(bad)),
            ));
        }
        set.ctx.step();
        set.ctx.print(&these);
        recs.extend(these);
    }
    recs
}

/// The shared set that makes `d` redundant: the one it stands in for, once
/// read, unless `--sets` (`asked`) named the sets to run.
fn redundant(d: &DataSet, asked: &[String], loaded: &[&str]) -> Option<&'static str> {
    d.stands_in_for()
        .filter(|shared| asked.is_empty() && loaded.contains(shared))
}

impl Suite for StrmapReal {
    type Opts = Opts;
    const NAME: &'static str = "strmap-real";
    const ABOUT: &'static str = "string-key maps on real key sets: bytes per key (keys included), build ns/key, hit and miss lookups ns, ordered walks ns/key";

    const DESCRIBE: &'static str = "Each data set is a list of byte-string keys, \
         deduplicated, empty ones dropped: from the data directory \
         `strings/kallsyms.txt.gz` (kernel symbol names), `btf_strings` (the \
         kernel's BTF strings), `linux_paths` (file paths of a kernel tree), \
         `domains_top100k`, `english_words` (one key per line), and this \
         machine's own `machine-kallsyms` (the names in `/proc/kallsyms`) and \
         `machine-btf` (the string section of `/sys/kernel/btf/vmlinux`), \
         which by default run only in place of `kallsyms` and `btf_strings` \
         when those cannot be read (the same kind of keys; `--sets` names \
         them to run both); a set that cannot be read is skipped with a note. Keys are inserted in \
         one random order (key `i` gets value `i`, a `u64`). \
         `mem_bytes_per_key` is what the building thread holds afterwards \
         (counting allocator) per key, the structure's copies of the keys \
         included; libhat-trie calls `malloc` itself, so its figure is its \
         own account (`hattrie_sizeof`, the bytes it asked for; \
         `mem_reported_per_key`). `build_ns_per_key` is the time of the \
         inserts per key (median of the builds). Lookups \
         (`ns_per_lookup`): `lookup=hit` looks up every key once in another \
         random order, `lookup=miss` each key with one byte changed (at a \
         random position, to a byte of the set's alphabet, never giving a \
         stored key), laid out back to back and cycled through in batches \
         of 256; the answers are checked over the whole set, the first 65,536 \
         with `--quick` (`strmap_disagreements`). `walk=iter` is whole walks in key order \
         (`iter_ns_per_key`) touching each key's length and value, `walk=read` \
         the same walks reading every byte of every key (summing them), \
         for the structures that walk in byte order, \
         whose keys, values and order must match `btreemap`'s (`qp-trie`'s \
         iterator goes by low nibble first, so it has none). All implementations of a set are \
         built first and kept; lookups, then walks, are timed in turns \
         (interleaved): one repetition of each implementation at a time, \
         the one going first rotating. The baseline `bpfmaps-hash` is \
         bpfmaps' `HashMap` with `key_size` the set's longest key, each key \
         copied into a zeroed buffer of that size (what BPF users do today), \
         preallocated; `std-hashmap` hashes with std's SipHash. JudySL takes \
         C strings (looked up in place, with the NUL laid after each key); \
         libhat-trie's walk sorts each leaf table as it reaches it. `blart` \
         (an adaptive radix tree; it builds on stable) is left out: it takes \
         no key that is a proper prefix of another, and every set here has \
         such keys (the run prints how many); changing the keys to suit it \
         would measure other data.";

    const BASELINE: &'static str = BASELINE;

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let sets: Vec<_> = DATA_SETS
            .iter()
            .filter(|d| opts.sets.is_empty() || opts.sets.iter().any(|s| s == d.name))
            .collect();
        for name in &opts.sets {
            if !DATA_SETS.iter().any(|d| d.name == name) {
                ctx.note(&format!("{}: no data set {name:?}", ctx.suite()));
            }
        }
        let impls = str_table_names().len();
        // Per set: each implementation's build, each lookup set, the walks.
        ctx.set_steps((sets.len() * (impls + LOOKUPS.len() + 1)) as u64);
        let builds = opts
            .builds
            .unwrap_or(if ctx.quick() { 1 } else { 3 })
            .max(1);
        let mut all = Vec::new();
        let mut loaded = Vec::new();
        for d in sets {
            let skip = |why: &str| {
                ctx.note(&format!("{}: skipping {}: {why}", ctx.suite(), d.name));
                for _ in 0..impls + LOOKUPS.len() + 1 {
                    ctx.step();
                }
            };
            if let Some(shared) = redundant(d, &opts.sets, &loaded) {
                skip(&format!(
                    "{shared} was read, the same kind of keys (`--sets {}` runs it)",
                    d.name
                ));
                continue;
            }
            let mut keys = match d.load(ctx.data_dir()) {
                Ok(keys) => keys,
                Err(why) => {
                    skip(&why);
                    continue;
                }
            };
            loaded.push(d.name);
            if opts.max_keys > 0 {
                keys.truncate(opts.max_keys);
            }
            let keys = shuffled(keys, SEED);
            let order = hit_order(&keys, SEED + 1);
            let miss = misses(&keys, SEED + 2);
            let base = case(&[
                ("set", &d.name),
                ("n", &keys.len()),
                ("mean_len", &format!("{:.1}", keys.mean_len())),
            ]);
            ctx.note(&format!(
                "{}: {base}: longest key {} bytes, {} bytes of keys, {} keys a proper \
                 prefix of another (blart takes none), {} misses",
                ctx.suite(),
                keys.max_len(),
                keys.total_len(),
                keys.prefix_keys(),
                miss.len()
            ));
            let leave_out = |_: &'static str| None;
            let mut set = KeySetRun {
                ctx,
                base,
                lookups: vec![
                    LookupSet {
                        kind: LOOKUPS[0],
                        expect: order.iter().map(|&i| Some(u64::from(i))).collect(),
                        probes: keys.permuted(&order),
                    },
                    LookupSet {
                        kind: LOOKUPS[1],
                        expect: vec![None; miss.len()],
                        probes: miss,
                    },
                ],
                keys,
                builds,
                checked: if ctx.quick() {
                    QUICK_CHECKED
                } else {
                    usize::MAX
                },
                leave_out: &leave_out,
                lookups_per_sec: false,
            };
            let mut kept = set.build_all();
            set.time_lookups(&mut kept, ctx.plan());
            let walk_recs = walks(&set, &kept);
            all.extend(kept.into_iter().flat_map(|k| k.recs).chain(walk_recs));
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let bases = bases(records);
        let names = str_table_names();
        let mut tables = Vec::new();
        for base in &bases {
            let get = |c: &str, imp: &str, m: &str| find(records, c, imp, m);
            let look = |kind: &str, imp: &str| {
                get(&format!("{base},lookup={kind}"), imp, NS_PER_LOOKUP.name)
            };
            let mut t = Table::new(
                format!("strmap-real {base}"),
                &[
                    "impl",
                    "bytes/key",
                    "build ns/key",
                    "hit ns",
                    "miss ns",
                    "iter ns/key",
                    "read ns/key",
                    &format!("memory vs {BASELINE}"),
                    &format!("hit vs {BASELINE}"),
                    &format!("miss vs {BASELINE}"),
                ],
            )
            .with_note(
                "Medians. Bytes per key include the keys (counting allocator; * = the \
                 structure's own account, hattrie_sizeof). Memory ratios below 1 mean \
                 smaller than the fixed-key hash map, speed ratios above 1 faster.",
            );
            for imp in &names {
                let Some(build) = get(base, imp, BUILD_NS_PER_KEY.name) else {
                    continue;
                };
                let mem = memory(records, base, imp);
                let ns = |r: Option<&Record>| r.map_or("-".into(), |r| format!("{:.0}", r.value));
                t.push(vec![
                    imp.to_string(),
                    mem.map_or("-".into(), |(r, own)| {
                        format!("{:.1}{}", r.value, if own { "*" } else { "" })
                    }),
                    ns(Some(build)),
                    ns(look("hit", imp)),
                    ns(look("miss", imp)),
                    ns(get(&format!("{base},walk=iter"), imp, ITER_NS_PER_KEY.name)),
                    ns(get(&format!("{base},walk=read"), imp, ITER_NS_PER_KEY.name)),
                    fmt_ratio(ratio(
                        mem.map(|m| m.0),
                        memory(records, base, BASELINE).map(|m| m.0),
                    )),
                    fmt_ratio(ratio(look("hit", BASELINE), look("hit", imp))),
                    fmt_ratio(ratio(look("miss", BASELINE), look("miss", imp))),
                ]);
            }
            tables.push(t);
        }
        if !bases.is_empty() {
            tables.push(summary_2022(records, &bases, &names));
        }
        tables
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut mem = LinePlot::new(
            "strmap-real-memory",
            "Bytes per key, keys included, by data set (x: its mean key length)",
            "mean key length of the data set (bytes)",
            "bytes per key",
        );
        let mut hit = LinePlot::new(
            "strmap-real-lookup",
            "Lookup of every key in random order, by data set (x: its mean key length)",
            "mean key length of the data set (bytes)",
            "ns per lookup",
        );
        let x = |base: &str| case_param(base, "mean_len")?.parse::<f64>().ok();
        plot_memory_and_lookups(records, &bases(records), x, &mut mem, &mut hit);
        let mut plots = vec![mem, hit];
        plots.retain(|p| !p.is_empty());
        plots
    }
}

/// The 2022 proposal's table: per data set and structure, the memory of
/// the whole set, the time to insert it and the time to look every key
/// up once.
fn summary_2022(records: &[Record], bases: &[&str], names: &[&str]) -> Table {
    let mut cols = vec!["data set".to_string(), "keys".into()];
    cols.extend(names.iter().map(|n| n.to_string()));
    let mut t = Table::new(
        "strmap-real: memory / update / lookup per structure (the 2022 table's layout)",
        &cols.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .with_note(
        "Each cell: MiB held for the whole set (keys included; * = the structure's own \
         account) / ms to insert every key / ms to look every key up once in random order \
         (medians per key times the keys).",
    );
    for base in bases {
        let n: f64 = case_param(base, "n")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        let mut row = vec![
            case_param(base, "set").unwrap_or(base).to_string(),
            format!("{n:.0}"),
        ];
        for imp in names {
            let build = find(records, base, imp, BUILD_NS_PER_KEY.name);
            let hit = find(
                records,
                &format!("{base},lookup=hit"),
                imp,
                NS_PER_LOOKUP.name,
            );
            let cell = match (memory(records, base, imp), build, hit) {
                (Some((m, own)), Some(b), Some(h)) => format!(
                    "{:.1}{} / {:.0} / {:.1}",
                    m.value * n / (1024.0 * 1024.0),
                    if own { "*" } else { "" },
                    b.value * n / 1e6,
                    h.value * n / 1e6
                ),
                _ => "-".into(),
            };
            row.push(cell);
        }
        t.push(row);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suites::by_name;
    use std::io::Write;

    /// Writes `lines` as `strings/NAME.txt.gz` under `dir`.
    fn write_set(dir: &std::path::Path, name: &str, lines: &[String]) {
        let path = dir.join("strings").join(format!("{name}.txt.gz"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(path).unwrap(),
            flate2::Compression::fast(),
        );
        for l in lines {
            writeln!(gz, "{l}").unwrap();
        }
        gz.finish().unwrap();
    }

    /// This machine's sets run in place of the shared ones they stand in
    /// for, and beside them only when asked for by name.
    #[test]
    fn machine_sets_stand_in_for_shared_ones() {
        let set = |name| DATA_SETS.iter().find(|d| d.name == name).unwrap();
        let machine = set("machine-kallsyms");
        assert_eq!(redundant(machine, &[], &["kallsyms"]), Some("kallsyms"));
        assert_eq!(redundant(machine, &[], &["btf_strings"]), None);
        assert_eq!(
            redundant(set("machine-btf"), &[], &["kallsyms", "btf_strings"]),
            Some("btf_strings")
        );
        let asked = ["kallsyms".to_string(), "machine-kallsyms".to_string()];
        assert_eq!(redundant(machine, &asked, &["kallsyms"]), None);
        assert_eq!(redundant(set("kallsyms"), &[], &["kallsyms"]), None);
        // Each stand-in follows the set it stands in for, which is shared.
        for (i, d) in DATA_SETS.iter().enumerate() {
            if let Some(shared) = d.stands_in_for() {
                let at = DATA_SETS.iter().position(|s| s.name == shared).unwrap();
                assert!(
                    at < i && DATA_SETS[at].stands_in_for().is_none(),
                    "{}",
                    d.name
                );
            }
        }
    }

    /// Runs quick on two small sets written to a temporary data directory
    /// (one absent, which is skipped): every implementation answers right,
    /// and the summaries and plots have every implementation's row.
    #[test]
    fn runs_on_small_sets() {
        let dir = std::env::temp_dir().join(format!("bpfmaps-strmap-{}", std::process::id()));
        let paths: Vec<String> = (0..1500)
            .map(|i| format!("drivers/net/dev{}/file{}.c", i % 31, i))
            .collect();
        write_set(&dir, "linux_paths", &paths);
        let syms: Vec<String> = (0..1200).map(|i| format!("sym_{}", i * 7)).collect();
        write_set(&dir, "kallsyms", &syms);

        let suite = by_name("strmap-real").unwrap();
        let args = [
            "--sets",
            "kallsyms,linux_paths,domains_top100k",
            "--max-keys",
            "1000",
        ];
        let records = crate::suites::run_quick("strmap-real", &args, dir.clone());
        std::fs::remove_dir_all(&dir).unwrap();

        for r in &records {
            assert!(crate::record::metric(&r.metric).is_some(), "{}", r.metric);
            if r.metric == STRMAP_DISAGREEMENTS.name {
                assert_eq!(r.value, 0.0, "{} {}", r.case, r.impl_name);
            }
        }
        let bases = bases(&records);
        let sets: Vec<_> = bases
            .iter()
            .map(|b| (case_param(b, "set").unwrap(), case_param(b, "n").unwrap()))
            .collect();
        assert_eq!(sets, [("kallsyms", "1000"), ("linux_paths", "1000")]);
        let names = str_table_names();
        for base in &bases {
            for imp in &names {
                assert!(memory(&records, base, imp).is_some(), "{base} {imp}");
                let hit = format!("{base},lookup=hit");
                assert!(find(&records, &hit, imp, NS_PER_LOOKUP.name).is_some());
            }
            for walk in ["iter", "read"] {
                let walks = records
                    .iter()
                    .filter(|r| {
                        r.case == format!("{base},walk={walk}") && r.metric == ITER_NS_PER_KEY.name
                    })
                    .count();
                assert_eq!(
                    walks,
                    names.len() - 4,
                    "all but the hash maps, qp-trie and the get_many view"
                );
            }
        }
        let tables = suite.summaries(&records);
        assert_eq!(tables.len(), 3);
        assert_eq!(tables[2].rows.len(), 2);
        assert!(tables[2].rows.iter().all(|r| r.iter().all(|c| c != "-")));
        assert_eq!(suite.plots(&records).len(), 2);
    }
}
