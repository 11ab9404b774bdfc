//! `hash-sweep`: map lookups per second for `bpfmaps::hashtab::HashMap`
//! under each [`HashPolicy`], against std, hashbrown and dashmap (boxed
//! and fixed-array keys) hashing with the same policy and seed, and the
//! native JudyHS where `libjudy-dev` is installed.
//!
//! Varies: hash policy, key size, fullness (k/16 of `max_entries`),
//! `max_entries`. Holds fixed: value size 8, kernel-bench keys, every
//! lookup a hit, keys probed in a shuffled order laid out contiguously (so
//! the loop measures the map, not fetching the key).
//!
//! At each fullness level below the top, the bpfmaps maps of every policy
//! are timed in interleaved turns; at the top level, every implementation
//! of [`crate::hash_impls`] under every policy is, so that ratios compare
//! loops that shared the machine's good and bad seconds alike.

use bpfmaps::HashPolicy;
use clap::Args;

use crate::alloc::MemProbe;
use crate::hash_impls::{HashEntry, HashImpl, Probes, hash_impl, hash_impls};
use crate::hasher::PolicyBuildHasher;
use crate::keys::KeySet;
use crate::measure::rate_samples_interleaved;
use crate::plot::LinePlot;
use crate::record::{LOOKUPS_PER_SEC, MEM_BYTES_HELD, MEM_REPORTED, Record, case, find, ratio};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::suites::parse_policy;
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct HashSweep;

/// `hash-sweep` options; empty lists mean the defaults for the mode.
#[derive(Debug, Args)]
pub struct Opts {
    /// `max_entries` values [quick: 100000; full: 10000,100000].
    #[arg(long, value_delimiter = ',')]
    entries: Vec<u32>,
    /// Key sizes in bytes [quick: 8,16,64; full: 4,8,16,32,64,128; 12, 24, 48 and 256 were dropped to keep the main job in its 25 minutes].
    #[arg(long, value_delimiter = ',')]
    key_sizes: Vec<usize>,
    /// Fullness levels in sixteenths [8,16; 4 and 12 were dropped to keep the main job in its 25 minutes].
    #[arg(long, value_delimiter = ',')]
    fullness: Vec<u32>,
    /// Hash policies [jhash,xxh3,hybrid].
    #[arg(long, value_delimiter = ',', value_parser = parse_policy)]
    policies: Vec<HashPolicy>,
    /// Skip the peers (std, hashbrown, dashmap).
    #[arg(long)]
    no_peers: bool,
}

fn case_of(n: u32, ks: usize, fill: u32) -> String {
    case(&[("n", &n), ("ks", &ks), ("fill", &format!("{fill}/16"))])
}

/// The peers that hash with the policy, each with a fixed-array variant.
const PEERS: [&str; 3] = ["std", "hashbrown", "dashmap"];
/// The native peers, which hash their own way (named without a policy).
const NATIVE: [&str; 1] = ["judy"];

/// An implementation's name in records: `std[16](xxh3)`.
fn impl_name(name: &str, p: HashPolicy) -> String {
    format!("{name}({})", p.name())
}

/// One implementation under one policy, built, with the probe set its
/// lookup loop walks.
struct Loop {
    name: String,
    map: Box<dyn HashImpl>,
    held: usize,
}

/// Everything one (n, key size) cell of the sweep needs.
struct Cell<'a> {
    ctx: &'a Ctx,
    n: u32,
    keys: KeySet,
    seed: u32,
}

impl Cell<'_> {
    fn hasher(&self, p: HashPolicy) -> PolicyBuildHasher {
        PolicyBuildHasher::new(p, self.seed)
    }

    /// `entry` under `p`, holding the first `count` keys; its memory as the
    /// building thread holds it afterwards.
    fn build(&self, entry: &HashEntry, p: HashPolicy, count: usize) -> Loop {
        let probe = MemProbe::start();
        let map = entry.filled(&self.keys, count, self.hasher(p));
        Loop {
            name: if entry.own_hash {
                entry.name.to_string()
            } else {
                impl_name(entry.name, p)
            },
            map,
            held: probe.held(),
        }
    }

    /// Times `loops`' lookups of the first `count` keys (shuffled), in
    /// turns; one lookup-rate record per loop, every lookup a hit.
    fn time(&self, loops: &[&Loop], count: usize, fill: u32) -> Vec<Record> {
        let probes = self.keys.shuffled_prefix(count, u64::from(fill));
        let ids = crate::keys::shuffled_indices(count, u64::from(fill));
        let ks = self.keys.key_size();
        let (probes, ids) = (&probes, &ids);
        let mut batches: Vec<_> = loops
            .iter()
            .map(|l| {
                let mut cursor = 0;
                move || {
                    let end = (cursor + BATCH).min(count);
                    let c = l.map.read_batch(Probes {
                        keys: probes.slice(cursor..end),
                        key_size: ks,
                        ids: &ids[cursor..end],
                    });
                    assert_eq!(
                        (c.missing, c.bad),
                        (0, 0),
                        "{}: every lookup must hit",
                        l.name
                    );
                    cursor = if end == count { 0 } else { end };
                    c.found
                }
            })
            .collect();
        let rates = rate_samples_interleaved(self.ctx.plan(), &mut batches);
        let c = case_of(self.n, ks, fill);
        loops
            .iter()
            .zip(rates)
            .map(|(l, r)| {
                Record::stats(
                    self.ctx.suite(),
                    &c,
                    &l.name,
                    &LOOKUPS_PER_SEC,
                    Stats::from_samples(&r),
                )
            })
            .collect()
    }

    /// Memory records of `l` at `fill`.
    fn memory(&self, l: &Loop, fill: u32) -> Vec<Record> {
        let c = case_of(self.n, self.keys.key_size(), fill);
        let s = self.ctx.suite();
        let mut v = vec![Record::single(
            s,
            &c,
            &l.name,
            &MEM_BYTES_HELD,
            l.held as f64,
        )];
        if let Some(reported) = l.map.reported() {
            v.push(Record::single(
                s,
                &c,
                &l.name,
                &MEM_REPORTED,
                reported as f64,
            ));
        }
        v
    }

    /// The whole cell: bpfmaps under every policy at each fullness level
    /// below the top, then every implementation at the top.
    fn run(&self, policies: &[HashPolicy], fullness: &[u32], peers: bool) -> Vec<Record> {
        let (&top, below) = fullness.split_last().expect("a fullness level");
        let count = |fill: u32| self.n as usize * fill as usize / 16;
        let ks = self.keys.key_size();
        let mut out = Vec::new();
        let bpfmaps = hash_impl(ks, "bpfmaps");
        for &fill in below {
            // Each level's maps are built for it: a prealloc map's memory
            // does not depend on how full it is, and its lookups only on
            // what it holds.
            let loops: Vec<Loop> = policies
                .iter()
                .map(|&p| self.build(&bpfmaps, p, count(fill)))
                .collect();
            let recs = self.time(&loops.iter().collect::<Vec<_>>(), count(fill), fill);
            self.ctx.print(&recs);
            out.extend(recs);
            self.ctx.step();
        }
        let loops: Vec<Loop> = hash_impls(ks)
            .iter()
            .filter(|e| peers || !e.peer)
            .flat_map(|e| {
                // A map with its own hash is the same map under any policy.
                let policies = if e.own_hash { &policies[..1] } else { policies };
                policies.iter().map(|&p| self.build(e, p, count(top)))
            })
            .collect();
        let mut recs = self.time(&loops.iter().collect::<Vec<_>>(), count(top), top);
        recs.extend(loops.iter().flat_map(|l| self.memory(l, top)));
        recs.sort_by(|a, b| a.impl_name.cmp(&b.impl_name));
        self.ctx.print(&recs);
        out.extend(recs);
        self.ctx.step();
        out
    }
}

impl Suite for HashSweep {
    type Opts = Opts;
    const NAME: &'static str = "hash-sweep";
    const ABOUT: &'static str = "HashMap lookups/s per hash policy, key size and fullness, vs std/hashbrown/dashmap at equal hash";

    const DESCRIBE: &'static str = "Keys are the kernel benches' (word 0 = i+1, other words = \
         2654435761*i, truncated for sizes not a multiple of 4); value size 8; \
         every lookup hits, in a shuffled order. bpfmaps is timed at each \
         fullness level (k/16 of `max_entries`), its policies in interleaved \
         turns; at the top level every implementation is, in turns. bpfmaps \
         pins one guard per 256 lookups (`get(key, &guard)`); \
         `bpfmaps-lookup(...)` is the byte contract `Map::lookup` (a copy \
         per call; no pin for keys up to 16 bytes and values up to 64, a pin \
         per call beyond); `bpfmaps-lookup-guarded(...)` the same calls with \
         each batch of 256 inside one outer guard, so that a call's pin, \
         where it takes one, is a nested one (a counter, no fence). Peers (`std`, `hashbrown`, `dashmap` 6) come with \
         boxed keys and with fixed-array keys (`std[N]`: \
         `HashMap<[u8; N], u64>`, what a user who knows the key size writes); \
         the targets compare bpfmaps with the faster of the two. They hash \
         with the same policy and seed through a `BuildHasher`, so the \
         comparison is between table designs at equal hash, and are sized up \
         front. `judy` is JudyHS, the C library from Debian's `libjudy-dev` \
         (when installed at build time): it hashes with its own function, so \
         it is built once, and grows as it fills. Memory is measured by the counting allocator after building; \
         `reported` is the map's `memory_usage()`.";

    const BASELINE: &'static str = "bpfmaps(jhash)";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let entries = ctx.list_or(opts.entries, &[100_000], &[10_000, 100_000]);
        let key_sizes = ctx.list_or(opts.key_sizes, &[8, 16, 64], &[4, 8, 16, 32, 64, 128]);
        let mut fullness = ctx.list_or(opts.fullness, &[8, 16], &[8, 16]);
        fullness.retain(|&f| (1..=16).contains(&f));
        fullness.sort_unstable();
        fullness.dedup();
        let policies = ctx.list_or(opts.policies, &HashPolicy::ALL, &HashPolicy::ALL);
        if fullness.is_empty() {
            ctx.note("hash-sweep: no fullness level in 1..=16; nothing to do");
            return Vec::new();
        }
        ctx.set_steps((entries.len() * key_sizes.len() * fullness.len()) as u64);
        let seed: u32 = rand::random();
        let mut all = Vec::new();
        for &n in &entries {
            for &ks in &key_sizes {
                let cell = Cell {
                    ctx,
                    n,
                    keys: KeySet::kernel(n as usize, ks),
                    seed,
                };
                all.extend(cell.run(&policies, &fullness, !opts.no_peers));
            }
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut tables = Vec::new();
        for (n, top) in sizes_and_top_fill(records) {
            let key_sizes = param_values(records, n, "ks");
            let fill = format!("{top}/16");
            let at = |ks: usize| case_of(n, ks, top);
            let get = |ks: usize, imp: &str| find(records, &at(ks), imp, LOOKUPS_PER_SEC.name);

            let mut a = Table::new(
                format!("hash-sweep n={n}, fill {fill}: hash policies"),
                &["key bytes", "jhash M/s", "xxh3 M/s", "hybrid M/s", "xxh3/jhash", "hybrid/jhash"],
            )
            .with_note("bpfmaps HashMap lookups per second (millions, medians) and their ratios; above 1 is faster than the kernel's jhash.");
            for &ks in &key_sizes {
                let m = |p: HashPolicy| get(ks, &impl_name("bpfmaps", p));
                a.push(vec![
                    ks.to_string(),
                    fmt_mops(m(HashPolicy::Jhash).map(|r| r.value)),
                    fmt_mops(m(HashPolicy::Xxh3).map(|r| r.value)),
                    fmt_mops(m(HashPolicy::Hybrid).map(|r| r.value)),
                    fmt_ratio(ratio(m(HashPolicy::Xxh3), m(HashPolicy::Jhash))),
                    fmt_ratio(ratio(m(HashPolicy::Hybrid), m(HashPolicy::Jhash))),
                ]);
            }
            tables.push(a);

            for p in HashPolicy::ALL {
                // The faster of each peer's boxed and fixed-array variants.
                let best = |ks: usize, peer: &str| {
                    [impl_name(peer, p), impl_name(&format!("{peer}[{ks}]"), p)]
                        .into_iter()
                        .filter_map(|name| get(ks, &name))
                        .max_by(|a, b| a.value.total_cmp(&b.value))
                };
                if !key_sizes.iter().any(|&ks| best(ks, "std").is_some()) {
                    continue;
                }
                // Native peers hash their own way: one row whatever the policy.
                let native = NATIVE
                    .iter()
                    .copied()
                    .filter(|&peer| key_sizes.iter().any(|&ks| get(ks, peer).is_some()))
                    .collect::<Vec<_>>();
                let mut cols = vec!["key bytes".to_string(), "bpfmaps M/s".into()];
                cols.extend(PEERS.iter().chain(&native).map(|p| format!("{p} M/s")));
                cols.extend(PEERS.iter().chain(&native).map(|p| format!("bpfmaps/{p}")));
                cols.extend(["Map::lookup/get", "in one guard/get"].map(String::from));
                let mut b = Table::new(
                    format!("hash-sweep n={n}, fill {fill}: bpfmaps vs peers, all hashing with {}", p.name()),
                    &cols.iter().map(String::as_str).collect::<Vec<_>>(),
                )
                .with_note("Lookups per second (millions, medians) at equal hash; each peer's faster variant, boxed or fixed-array keys (`[N]` when fixed); native C peers (judy) hash their own way, so their ratios compare the hash too; bpfmaps/X above 1 means bpfmaps is faster; `Map::lookup/get` is the byte contract (a copy per call; no pin up to 16-byte keys and 64-byte values, a pin per call beyond) over `get` under one guard per 256 lookups, `in one guard/get` the byte contract with its calls inside such a guard.");
                for &ks in &key_sizes {
                    let ours = get(ks, &impl_name("bpfmaps", p));
                    let cell = |peer: &str| {
                        best(ks, peer).map_or("-".to_string(), |r| {
                            let fixed = if r.impl_name.contains('[') {
                                " [N]"
                            } else {
                                ""
                            };
                            format!("{}{fixed}", fmt_mops(Some(r.value)))
                        })
                    };
                    let mut row = vec![ks.to_string(), fmt_mops(ours.map(|r| r.value))];
                    row.extend(PEERS.iter().map(|peer| cell(peer)));
                    row.extend(
                        native
                            .iter()
                            .map(|&peer| fmt_mops(get(ks, peer).map(|r| r.value))),
                    );
                    row.extend(
                        PEERS
                            .iter()
                            .map(|peer| fmt_ratio(ratio(ours, best(ks, peer)))),
                    );
                    row.extend(
                        native
                            .iter()
                            .map(|&peer| fmt_ratio(ratio(ours, get(ks, peer)))),
                    );
                    for api in ["bpfmaps-lookup", "bpfmaps-lookup-guarded"] {
                        row.push(fmt_ratio(ratio(get(ks, &impl_name(api, p)), ours)));
                    }
                    b.push(row);
                }
                tables.push(b);
            }

            let mut cols = [
                "key bytes",
                "bpfmaps held",
                "bpfmaps reported",
                "std held",
                "std[N] held",
                "hashbrown held",
                "dashmap held",
            ]
            .map(String::from)
            .to_vec();
            cols.extend(NATIVE.map(|p| format!("{p} held")));
            let mut m = Table::new(
                format!("hash-sweep n={n}, fill {fill}: memory"),
                &cols.iter().map(String::as_str).collect::<Vec<_>>(),
            )
            .with_note("Bytes held after building (counting allocator), hash policy jhash; bpfmaps preallocates max_entries elements.");
            for &ks in &key_sizes {
                let mem = |imp: &str, metric: &str| {
                    find(records, &at(ks), &impl_name(imp, HashPolicy::Jhash), metric)
                        .map_or("-".into(), |r| crate::suite::fmt_bytes(r.value))
                };
                let mut row = vec![
                    ks.to_string(),
                    mem("bpfmaps", MEM_BYTES_HELD.name),
                    mem("bpfmaps", MEM_REPORTED.name),
                    mem("std", MEM_BYTES_HELD.name),
                    mem(&format!("std[{ks}]"), MEM_BYTES_HELD.name),
                    mem("hashbrown", MEM_BYTES_HELD.name),
                    mem("dashmap", MEM_BYTES_HELD.name),
                ];
                row.extend(NATIVE.map(|peer| {
                    find(records, &at(ks), peer, MEM_BYTES_HELD.name)
                        .map_or("-".into(), |r| crate::suite::fmt_bytes(r.value))
                }));
                m.push(row);
            }
            tables.push(m);
        }
        tables
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut plots = Vec::new();
        let lookups = |imp: &str, n: u32| -> Vec<&Record> {
            let n = n.to_string();
            records
                .iter()
                .filter(|r| {
                    r.impl_name == imp
                        && r.metric == LOOKUPS_PER_SEC.name
                        && r.param("n") == Some(n.as_str())
                })
                .collect()
        };
        let num = |r: &Record, key: &str| -> Option<f64> {
            r.param(key)?.split('/').next()?.parse().ok()
        };
        let peer_policy = HashPolicy::default();
        for (n, top) in sizes_and_top_fill(records) {
            let fill = format!("{top}/16");
            let mut by_ks = LinePlot::new(
                format!("hash-sweep-n{n}-keysize"),
                format!(
                    "Lookups/s vs key size, max_entries {n}, fill {fill} (peers hash with {})",
                    peer_policy.name()
                ),
                "key size (bytes, log scale)",
                "million lookups per second",
            );
            by_ks.log_x = true;
            let mut names: Vec<String> = HashPolicy::ALL
                .iter()
                .map(|&p| impl_name("bpfmaps", p))
                .collect();
            names.push(impl_name("bpfmaps-lookup", peer_policy));
            names.extend(PEERS.map(|p| impl_name(p, peer_policy)));
            names.extend(NATIVE.map(String::from));
            for name in &names {
                let pts = lookups(name, n)
                    .into_iter()
                    .filter(|r| r.param("fill") == Some(fill.as_str()))
                    .filter_map(|r| Some((num(r, "ks")?, r.value / 1e6)))
                    .collect();
                by_ks.add(name.as_str(), pts);
            }
            // The fixed-array variants: one line per peer across sizes.
            for peer in PEERS {
                let pts = records
                    .iter()
                    .filter(|r| {
                        r.metric == LOOKUPS_PER_SEC.name
                            && r.param("n") == Some(n.to_string().as_str())
                            && r.param("fill") == Some(fill.as_str())
                            && r.param("ks").is_some_and(|ks| {
                                r.impl_name == impl_name(&format!("{peer}[{ks}]"), peer_policy)
                            })
                    })
                    .filter_map(|r| Some((num(r, "ks")?, r.value / 1e6)))
                    .collect();
                by_ks.add(format!("{peer}[N]({})", peer_policy.name()), pts);
            }
            plots.push(by_ks);

            let mut by_fill = LinePlot::new(
                format!("hash-sweep-n{n}-fullness"),
                format!("Lookups/s vs fullness, max_entries {n}"),
                "fullness (sixteenths of max_entries)",
                "million lookups per second",
            );
            for ks in [16, 64] {
                for p in HashPolicy::ALL {
                    let pts = lookups(&impl_name("bpfmaps", p), n)
                        .into_iter()
                        .filter(|r| r.param("ks") == Some(&ks.to_string()))
                        .filter_map(|r| Some((num(r, "fill")?, r.value / 1e6)))
                        .collect();
                    by_fill.add(format!("{} {ks} B", p.name()), pts);
                }
            }
            plots.push(by_fill);
        }
        plots.retain(|p| !p.is_empty());
        plots
    }
}

/// The `max_entries` values in the records, each with its largest fill.
fn sizes_and_top_fill(records: &[Record]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for r in records {
        let (Some(n), Some(fill)) = (
            r.param("n").and_then(|v| v.parse().ok()),
            r.param("fill")
                .and_then(|v| v.split('/').next()?.parse().ok()),
        ) else {
            continue;
        };
        match out.iter_mut().find(|(m, _)| *m == n) {
            Some(e) => e.1 = e.1.max(fill),
            None => out.push((n, fill)),
        }
    }
    out
}

/// Distinct values of numeric parameter `key` among records with `n`.
fn param_values(records: &[Record], n: u32, key: &str) -> Vec<usize> {
    let n = n.to_string();
    let mut v: Vec<usize> = records
        .iter()
        .filter(|r| r.param("n") == Some(n.as_str()))
        .filter_map(|r| r.param(key)?.parse().ok())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
