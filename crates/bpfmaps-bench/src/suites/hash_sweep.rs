//! `hash-sweep`: map lookups per second for `bpfmaps::hashtab::HashMap`
//! under each [`HashPolicy`], against std, hashbrown and dashmap hashing
//! with the same policy and seed.
//!
//! Varies: hash policy, key size, fullness (k/16 of `max_entries`),
//! `max_entries`. Holds fixed: value size 8, kernel-bench keys, every
//! lookup a hit, keys probed in a shuffled order laid out contiguously (so
//! the loop measures the map, not fetching the key).
//!
//! bpfmaps lookups pin one guard per batch of 256 (`map.get(key, &guard)`),
//! as a BPF program runs its lookups under one RCU read section; the
//! byte-contract path `Map::lookup`, which pins per call and copies the
//! value out, is reported at full fill as `bpfmaps-lookup(POLICY)`. Peers
//! store `Box<[u8]>` keys and `u64` values, are sized for the entry count
//! up front (as preallocation does), and are measured at the largest fill.

use std::collections::HashMap as StdHashMap;
use std::hint::black_box;

use bpfmaps::hashtab::{HashMap, HashOptions};
use bpfmaps::{BPF_NOEXIST, HashPolicy, Map};
use clap::{Args, Command};
use dashmap::DashMap;

use crate::alloc::MemProbe;
use crate::hasher::PolicyBuildHasher;
use crate::keys::{KeySet, for_batch};
use crate::measure::rate;
use crate::plot::LinePlot;
use crate::record::{LOOKUPS_PER_SEC, MEM_BYTES_HELD, MEM_REPORTED, Record, case, find, ratio};
use crate::suite::{Ctx, Suite};
use crate::suites::parse_policy;
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct HashSweep;

/// `hash-sweep` options; empty lists mean the defaults for the mode.
#[derive(Debug, Args)]
struct Opts {
    /// `max_entries` values [quick: 100000; full: 10000,100000].
    #[arg(long, value_delimiter = ',')]
    entries: Vec<u32>,
    /// Key sizes in bytes [4,8,12,16,24,32,48,64,128,240,256].
    #[arg(long, value_delimiter = ',')]
    key_sizes: Vec<usize>,
    /// Fullness levels in sixteenths [quick: 4,8,12,16; full: 1..=16].
    #[arg(long, value_delimiter = ',')]
    fullness: Vec<u32>,
    /// Hash policies [jhash,xxh3,hybrid].
    #[arg(long, value_delimiter = ',', value_parser = parse_policy)]
    policies: Vec<HashPolicy>,
    /// Skip std, hashbrown and dashmap.
    #[arg(long)]
    no_peers: bool,
}

const KEY_SIZES: [usize; 11] = [4, 8, 12, 16, 24, 32, 48, 64, 128, 240, 256];
const VALUE_SIZE: usize = 8;
/// Lookups per pinned guard and per clock check.
const BATCH: usize = 256;

/// The value stored for key `i`.
fn value_of(i: usize) -> u64 {
    (i as u64) << 8 | 0x5a
}

#[inline]
fn read_u64(v: &[u8]) -> u64 {
    u64::from_ne_bytes(v[..8].try_into().expect("8-byte values"))
}

fn case_of(n: u32, ks: usize, fill: u32) -> String {
    case(&[("n", &n), ("ks", &ks), ("fill", &format!("{fill}/16"))])
}

fn bpfmaps_name(p: HashPolicy) -> String {
    format!("bpfmaps({})", p.name())
}

fn lookup_name(p: HashPolicy) -> String {
    format!("bpfmaps-lookup({})", p.name())
}

/// A userspace map compared with bpfmaps at equal hash.
trait Peer: Sized {
    const NAME: &'static str;
    fn with_capacity(count: usize, hasher: PolicyBuildHasher) -> Self;
    /// Inserts; the previous value, if any.
    fn put(&mut self, key: Box<[u8]>, value: u64) -> Option<u64>;
    fn get(&self, key: &[u8]) -> Option<u64>;

    /// The map of the first `count` keys (distinct by construction).
    fn build(keys: &KeySet, count: usize, hasher: PolicyBuildHasher) -> Self {
        let mut m = Self::with_capacity(count, hasher);
        for i in 0..count {
            assert!(
                m.put(keys.key(i).into(), value_of(i)).is_none(),
                "duplicate key"
            );
        }
        m
    }
}

impl Peer for StdHashMap<Box<[u8]>, u64, PolicyBuildHasher> {
    const NAME: &'static str = "std";
    fn with_capacity(count: usize, hasher: PolicyBuildHasher) -> Self {
        Self::with_capacity_and_hasher(count, hasher)
    }
    fn put(&mut self, key: Box<[u8]>, value: u64) -> Option<u64> {
        self.insert(key, value)
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        StdHashMap::get(self, key).copied()
    }
}

impl Peer for hashbrown::HashMap<Box<[u8]>, u64, PolicyBuildHasher> {
    const NAME: &'static str = "hashbrown";
    fn with_capacity(count: usize, hasher: PolicyBuildHasher) -> Self {
        Self::with_capacity_and_hasher(count, hasher)
    }
    fn put(&mut self, key: Box<[u8]>, value: u64) -> Option<u64> {
        self.insert(key, value)
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        hashbrown::HashMap::get(self, key).copied()
    }
}

impl Peer for DashMap<Box<[u8]>, u64, PolicyBuildHasher> {
    const NAME: &'static str = "dashmap";
    fn with_capacity(count: usize, hasher: PolicyBuildHasher) -> Self {
        Self::with_capacity_and_hasher(count, hasher)
    }
    fn put(&mut self, key: Box<[u8]>, value: u64) -> Option<u64> {
        self.insert(key, value)
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        DashMap::get(self, key).map(|r| *r)
    }
}

/// Everything one (n, key size) cell of the sweep needs.
struct Cell<'a> {
    ctx: &'a Ctx,
    n: u32,
    keys: &'a KeySet,
    seed: u32,
}

impl Cell<'_> {
    fn suite(&self) -> &'static str {
        self.ctx.suite()
    }

    /// bpfmaps under `policy` at every fullness level (inserting as it
    /// goes), plus the `Map::lookup` path at the last level.
    fn bpfmaps(&self, policy: HashPolicy, fullness: &[u32]) -> Vec<Record> {
        let ks = self.keys.key_size();
        let probe = MemProbe::start();
        let options = HashOptions {
            prealloc: true,
            policy,
            seed: Some(self.seed),
        };
        let map = HashMap::with_options(ks, VALUE_SIZE, self.n, options).expect("creating the map");
        let mut out = Vec::new();
        let mut inserted = 0usize;
        for (level, &fill) in fullness.iter().enumerate() {
            let target = self.n as usize * fill as usize / 16;
            for i in inserted..target {
                map.update(self.keys.key(i), &value_of(i).to_ne_bytes(), BPF_NOEXIST)
                    .expect("inserting a new key");
            }
            inserted = target;
            let held = probe.held();
            let reported = map.memory_usage();
            let c = case_of(self.n, ks, fill);
            let probe_keys = self.keys.shuffled_prefix(target, u64::from(fill));
            let mut cursor = 0;
            let s = rate(self.ctx.plan(), || {
                let guard = bpfmaps::pin();
                let (mut acc, mut miss) = (0u64, 0usize);
                for_batch(&probe_keys, &mut cursor, BATCH, |k| {
                    match map.get(black_box(k), &guard) {
                        Some(v) => acc = acc.wrapping_add(read_u64(v)),
                        None => miss += 1,
                    }
                });
                assert_eq!(miss, 0, "every lookup must hit");
                black_box(acc);
                BATCH as u64
            });
            let mut recs = vec![
                Record::stats(self.suite(), &c, &bpfmaps_name(policy), &LOOKUPS_PER_SEC, s),
                Record::single(
                    self.suite(),
                    &c,
                    &bpfmaps_name(policy),
                    &MEM_BYTES_HELD,
                    held as f64,
                ),
                Record::single(
                    self.suite(),
                    &c,
                    &bpfmaps_name(policy),
                    &MEM_REPORTED,
                    reported as f64,
                ),
            ];
            self.ctx.step();
            if level + 1 == fullness.len() {
                let mut cursor = 0;
                let mut value = [0u8; VALUE_SIZE];
                let s = rate(self.ctx.plan(), || {
                    let mut acc = 0u64;
                    for_batch(&probe_keys, &mut cursor, BATCH, |k| {
                        map.lookup(black_box(k), &mut value)
                            .expect("every lookup must hit");
                        acc = acc.wrapping_add(u64::from_ne_bytes(value));
                    });
                    black_box(acc);
                    BATCH as u64
                });
                recs.push(Record::stats(
                    self.suite(),
                    &c,
                    &lookup_name(policy),
                    &LOOKUPS_PER_SEC,
                    s,
                ));
                self.ctx.step();
            }
            self.ctx.print(&recs);
            out.extend(recs);
        }
        out
    }

    /// Peer `P` holding the first `count` keys, hashing with `policy`.
    fn peer<P: Peer>(&self, policy: HashPolicy, fill: u32, probe_keys: &KeySet) -> Vec<Record> {
        let count = probe_keys.len();
        let probe = MemProbe::start();
        let map = P::build(self.keys, count, PolicyBuildHasher::new(policy, self.seed));
        let held = probe.held();
        let mut cursor = 0;
        let s = rate(self.ctx.plan(), || {
            let (mut acc, mut miss) = (0u64, 0usize);
            for_batch(probe_keys, &mut cursor, BATCH, |k| {
                match map.get(black_box(k)) {
                    Some(v) => acc = acc.wrapping_add(v),
                    None => miss += 1,
                }
            });
            assert_eq!(miss, 0, "every lookup must hit");
            black_box(acc);
            BATCH as u64
        });
        drop(map);
        let c = case_of(self.n, self.keys.key_size(), fill);
        let name = format!("{}({})", P::NAME, policy.name());
        let recs = vec![
            Record::stats(self.suite(), &c, &name, &LOOKUPS_PER_SEC, s),
            Record::single(self.suite(), &c, &name, &MEM_BYTES_HELD, held as f64),
        ];
        self.ctx.step();
        self.ctx.print(&recs);
        recs
    }
}

impl Suite for HashSweep {
    fn name(&self) -> &'static str {
        "hash-sweep"
    }

    fn about(&self) -> &'static str {
        "HashMap lookups/s per hash policy, key size and fullness, vs std/hashbrown/dashmap at equal hash"
    }

    fn describe(&self) -> &'static str {
        "Keys are the kernel benches' (word 0 = i+1, other words = \
         2654435761*i, truncated for sizes not a multiple of 4); value size 8; \
         every lookup hits, in a shuffled order. The map is filled to k/16 of \
         `max_entries` step by step and measured at each step. bpfmaps pins \
         one guard per 256 lookups (`get(key, &guard)`); \
         `bpfmaps-lookup(...)` is the byte contract `Map::lookup` (a pin and a \
         copy per call), at full fill. Peers (`std`, `hashbrown`, `dashmap` \
         6) hash with the same policy and seed through a `BuildHasher`, so \
         the comparison is between table designs at equal hash; they are \
         sized up front and measured at the largest fill. Memory is measured \
         by the counting allocator after building; `reported` is the map's \
         `memory_usage()`."
    }

    fn baseline(&self) -> &'static str {
        "bpfmaps(jhash)"
    }

    fn args(&self, cmd: Command) -> Command {
        Opts::augment_args(cmd)
    }

    fn run(&self, ctx: &Ctx) -> Vec<Record> {
        let opts: Opts = ctx.options();
        let quick = ctx.quick();
        let or = |v: Vec<u32>, quick_default: &[u32], full_default: &[u32]| {
            if !v.is_empty() {
                v
            } else if quick {
                quick_default.to_vec()
            } else {
                full_default.to_vec()
            }
        };
        let entries = or(opts.entries, &[100_000], &[10_000, 100_000]);
        let all_levels: Vec<u32> = (1..=16).collect();
        let mut fullness = or(opts.fullness, &[4, 8, 12, 16], &all_levels);
        fullness.retain(|&f| (1..=16).contains(&f));
        fullness.sort_unstable();
        fullness.dedup();
        let key_sizes = if opts.key_sizes.is_empty() {
            KEY_SIZES.to_vec()
        } else {
            opts.key_sizes
        };
        let policies = if opts.policies.is_empty() {
            HashPolicy::ALL.to_vec()
        } else {
            opts.policies
        };
        let Some(&top) = fullness.last() else {
            ctx.note("hash-sweep: no fullness level in 1..=16; nothing to do");
            return Vec::new();
        };
        let peers = if opts.no_peers { 0 } else { 3 };
        let per_cell = policies.len() * (fullness.len() + 1 + peers);
        ctx.set_steps((entries.len() * key_sizes.len() * per_cell) as u64);

        let seed: u32 = rand::random();
        let mut all = Vec::new();
        for &n in &entries {
            for &ks in &key_sizes {
                let keys = KeySet::kernel(n as usize, ks);
                let cell = Cell {
                    ctx,
                    n,
                    keys: &keys,
                    seed,
                };
                for &p in &policies {
                    all.extend(cell.bpfmaps(p, &fullness));
                }
                if peers > 0 {
                    let probe_keys =
                        keys.shuffled_prefix(n as usize * top as usize / 16, u64::from(top));
                    for &p in &policies {
                        all.extend(cell.peer::<StdHashMap<Box<[u8]>, u64, PolicyBuildHasher>>(
                            p,
                            top,
                            &probe_keys,
                        ));
                        all.extend(
                            cell.peer::<hashbrown::HashMap<Box<[u8]>, u64, PolicyBuildHasher>>(
                                p,
                                top,
                                &probe_keys,
                            ),
                        );
                        all.extend(cell.peer::<DashMap<Box<[u8]>, u64, PolicyBuildHasher>>(
                            p,
                            top,
                            &probe_keys,
                        ));
                    }
                }
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
            .with_note("bpfmaps HashMap lookups per second (millions) and their ratios; above 1 is faster than the kernel's jhash.");
            for &ks in &key_sizes {
                let m = |p: HashPolicy| get(ks, &bpfmaps_name(p));
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
                let peer = |ks: usize, name: &str| get(ks, &format!("{name}({})", p.name()));
                if !key_sizes.iter().any(|&ks| peer(ks, "std").is_some()) {
                    continue;
                }
                let mut b = Table::new(
                    format!("hash-sweep n={n}, fill {fill}: bpfmaps vs peers, all hashing with {}", p.name()),
                    &[
                        "key bytes",
                        "bpfmaps M/s",
                        "std M/s",
                        "hashbrown M/s",
                        "dashmap M/s",
                        "bpfmaps/std",
                        "bpfmaps/hashbrown",
                        "bpfmaps/dashmap",
                        "Map::lookup/get",
                    ],
                )
                .with_note("Lookups per second (millions) at equal hash and their ratios; bpfmaps/X above 1 means bpfmaps is faster.");
                for &ks in &key_sizes {
                    let ours = get(ks, &bpfmaps_name(p));
                    b.push(vec![
                        ks.to_string(),
                        fmt_mops(ours.map(|r| r.value)),
                        fmt_mops(peer(ks, "std").map(|r| r.value)),
                        fmt_mops(peer(ks, "hashbrown").map(|r| r.value)),
                        fmt_mops(peer(ks, "dashmap").map(|r| r.value)),
                        fmt_ratio(ratio(ours, peer(ks, "std"))),
                        fmt_ratio(ratio(ours, peer(ks, "hashbrown"))),
                        fmt_ratio(ratio(ours, peer(ks, "dashmap"))),
                        fmt_ratio(ratio(get(ks, &lookup_name(p)), ours)),
                    ]);
                }
                tables.push(b);
            }

            let mut m = Table::new(
                format!("hash-sweep n={n}, fill {fill}: memory"),
                &["key bytes", "bpfmaps held", "bpfmaps reported", "std held", "hashbrown held", "dashmap held"],
            )
            .with_note("Bytes held after building (counting allocator), hash policy jhash; bpfmaps preallocates max_entries elements.");
            for &ks in &key_sizes {
                let mem = |imp: &str, metric: &str| {
                    find(records, &at(ks), imp, metric)
                        .map_or("-".into(), |r| crate::suite::fmt_bytes(r.value))
                };
                m.push(vec![
                    ks.to_string(),
                    mem("bpfmaps(jhash)", MEM_BYTES_HELD.name),
                    mem("bpfmaps(jhash)", MEM_REPORTED.name),
                    mem("std(jhash)", MEM_BYTES_HELD.name),
                    mem("hashbrown(jhash)", MEM_BYTES_HELD.name),
                    mem("dashmap(jhash)", MEM_BYTES_HELD.name),
                ]);
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
        let peer_policy = HashPolicy::default().name();
        for (n, top) in sizes_and_top_fill(records) {
            let fill = format!("{top}/16");
            let mut by_ks = LinePlot::new(
                format!("hash-sweep-n{n}-keysize"),
                format!(
                    "Lookups/s vs key size, max_entries {n}, fill {fill} (peers hash with {peer_policy})"
                ),
                "key size (bytes, log scale)",
                "million lookups per second",
            );
            by_ks.log_x = true;
            let mut names: Vec<String> = HashPolicy::ALL.iter().map(|&p| bpfmaps_name(p)).collect();
            names.push(format!("bpfmaps-lookup({peer_policy})"));
            names.extend(["std", "hashbrown", "dashmap"].map(|p| format!("{p}({peer_policy})")));
            for name in &names {
                let pts = lookups(name, n)
                    .into_iter()
                    .filter(|r| r.param("fill") == Some(fill.as_str()))
                    .filter_map(|r| Some((num(r, "ks")?, r.value / 1e6)))
                    .collect();
                by_ks.add(name.as_str(), pts);
            }
            plots.push(by_ks);

            let mut by_fill = LinePlot::new(
                format!("hash-sweep-n{n}-fullness"),
                format!("Lookups/s vs fullness, max_entries {n}"),
                "fullness (sixteenths of max_entries)",
                "million lookups per second",
            );
            for ks in [32, 64] {
                for p in HashPolicy::ALL {
                    let pts = lookups(&bpfmaps_name(p), n)
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
