//! `bloom`: hash map lookups of mostly absent keys with and without a bloom
//! filter in front, as the kernel's `bench_bloom_filter_map.c`
//! (`hashmap-without-bloom` and `hashmap-with-bloom`).
//!
//! Varies: entries, value size, the filter's hashing. As in the kernel
//! bench, the value size (`--value_size`) is both the filter's value and the
//! hash map's key; the map's value is 8 bytes. Holds fixed: a full
//! `bpfmaps::hashtab::HashMap` with default options (`max_entries` =
//! entries), a `BloomFilter` sized for the entries with 5 hash functions
//! (the map type's default; the kernel bench's `--nr_hash_funcs` defaults
//! to 3), and 2^18 probe keys of which one in 16 is present, the rest
//! distinct absent keys, in a shuffled order laid out contiguously.
//!
//! `hashmap` looks every probe up in the map. `bloom+hashmap` asks the
//! filter first (`contains`, the kernel's `bpf_map_peek_elem`) and looks up
//! only keys it calls maybe-present; `bloom(xxh3)+hashmap` is the same with
//! `BloomHash::Xxh3` (one xxh3_128 per probe instead of 5 jhash calls).
//! Lookups pin one guard per batch of 256 probes, as `hash-sweep` does.
//! In each case the map and every filter are built first and kept; their
//! lookup loops are then timed in interleaved turns. The timing
//! starts after bpfmaps' reaper thread has freed the maps of the previous
//! case, so it does not share the CPU with those frees.
//! The false-positive rate is counted in an untimed pass over the probes:
//! map misses after a "maybe", per absent key.

use std::hint::black_box;

use bpfmaps::bloom::{BloomFilter, BloomHash};
use bpfmaps::hashtab::HashMap;
use bpfmaps::{BPF_NOEXIST, Map};
use clap::{Args, value_parser};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::alloc::MemProbe;
use crate::keys::{KeySet, for_batch};
use crate::measure::{rate_samples_interleaved, settle_reaper};
use crate::plot::LinePlot;
use crate::record::{
    FALSE_POSITIVE_RATE, LOOKUPS_PER_SEC, MEM_BYTES_HELD, MEM_REPORTED, Record, case, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite, fmt_bytes};
use crate::table::{Table, fmt_mops, fmt_ratio};

/// The suite.
pub struct Bloom;

/// `bloom` options; empty lists mean the defaults for the mode.
#[derive(Debug, Args)]
pub struct Opts {
    /// Entries in the map and the filter [quick: 10000,1000000; full: 10000,100000,1000000].
    #[arg(long, value_delimiter = ',')]
    entries: Vec<u32>,
    /// Value sizes in bytes: the filter's value and the map's key [4,8,16,40].
    #[arg(long, value_delimiter = ',')]
    value_sizes: Vec<usize>,
    /// Hash functions of the filter (1..=15).
    #[arg(long, default_value_t = 5, value_parser = value_parser!(u32).range(1..=15))]
    nr_hashes: u32,
    /// One probe in this many is a key the map holds.
    #[arg(long, default_value_t = 16, value_parser = value_parser!(u32).range(1..))]
    hit_every: u32,
    /// Skip the `BloomHash::Xxh3` filter.
    #[arg(long)]
    no_xxh3: bool,
}

const VALUE_SIZES: [usize; 4] = [4, 8, 16, 40];
/// The hash map's value size.
const MAP_VALUE_SIZE: usize = 8;
/// Probe keys, cycled through by the timed loops.
const PROBES: usize = 1 << 18;
/// Seed of the probe sequence (which present keys, and the order).
const PROBE_SEED: u64 = 0xb100_f11e;

const HASHMAP: &str = "hashmap";
/// The filters' hashings, in report order.
const HASHES: [BloomHash; 2] = [BloomHash::Jhash, BloomHash::Xxh3];

fn bloom_name(h: BloomHash) -> &'static str {
    match h {
        BloomHash::Jhash => "bloom+hashmap",
        BloomHash::Xxh3 => "bloom(xxh3)+hashmap",
    }
}

/// The value stored for key `i`.
fn value_of(i: usize) -> u64 {
    (i as u64) << 8 | 0xb1
}

#[inline]
fn read_u64(v: &[u8]) -> u64 {
    u64::from_ne_bytes(v[..8].try_into().expect("8-byte values"))
}

fn case_of(n: u32, vs: usize, k: u32, hit_every: u32) -> String {
    case(&[
        ("n", &n),
        ("vs", &vs),
        ("k", &k),
        ("hits", &format!("1/{hit_every}")),
    ])
}

/// Key numbers to probe: every `hit_every`-th a random present key
/// (`< n`), the others distinct absent keys (`n, n + 1, ...`); shuffled.
/// Returns the numbers and how many are present.
fn probe_indices(n: u32, hit_every: u32) -> (Vec<u32>, usize) {
    assert!(
        u64::from(n) + PROBES as u64 <= u64::from(u32::MAX),
        "too many entries for distinct absent keys"
    );
    let mut rng = StdRng::seed_from_u64(PROBE_SEED ^ u64::from(n));
    let (mut absent, mut present) = (n, 0);
    let mut v: Vec<u32> = (0..PROBES)
        .map(|j| {
            if j % hit_every as usize == 0 {
                present += 1;
                rng.random_range(0..n)
            } else {
                absent += 1;
                absent - 1
            }
        })
        .collect();
    v.shuffle(&mut rng);
    (v, present)
}

/// A lookup loop over the probes, boxed (one dynamic call per batch of
/// [`BATCH`] probes, the probes' loop monomorphic): every probe passing
/// `filter` is looked up in `map`.
fn lookups<'a>(
    map: &'a HashMap,
    probes: &'a KeySet,
    filter: impl Fn(&[u8]) -> bool + 'a,
) -> Box<dyn FnMut() -> u64 + 'a> {
    let mut cursor = 0;
    Box::new(move || {
        let guard = bpfmaps::pin();
        let (mut acc, mut found) = (0u64, 0u64);
        for_batch(probes, &mut cursor, BATCH, |k| {
            let k = black_box(k);
            if filter(k)
                && let Some(v) = map.get(k, &guard)
            {
                acc = acc.wrapping_add(read_u64(v));
                found += 1;
            }
        });
        black_box((acc, found));
        BATCH as u64
    })
}

/// One untimed pass: (present keys found, absent keys, absent keys the
/// filter called maybe-present). Panics on a false negative.
fn count_pass(map: &HashMap, bloom: Option<&BloomFilter>, probes: &KeySet) -> (u64, u64, u64) {
    let (mut found, mut absent, mut false_pos) = (0, 0, 0);
    for chunk in probes
        .slice(0..probes.len())
        .chunks(BATCH * probes.key_size())
    {
        let guard = bpfmaps::pin();
        for k in chunk.chunks_exact(probes.key_size()) {
            let maybe = bloom.is_none_or(|b| b.contains(k));
            if map.get(k, &guard).is_some() {
                assert!(maybe, "bloom filter false negative");
                found += 1;
            } else {
                absent += 1;
                false_pos += u64::from(maybe);
            }
        }
    }
    (found, absent, false_pos)
}

/// Everything one (entries, value size) case needs.
struct Cell<'a> {
    ctx: &'a Ctx,
    n: u32,
    keys: &'a KeySet,
    probes: &'a KeySet,
    present: usize,
    case: String,
}

/// The map, built, with its memory.
struct Built {
    map: HashMap,
    held: usize,
}

/// A filter in front of the map, built, with its false-positive rate.
struct Filter {
    hash: BloomHash,
    bloom: BloomFilter,
    held: usize,
    fpp: f64,
}

impl Cell<'_> {
    /// The map, full; checks that the present probes all hit.
    fn hashmap(&self) -> Built {
        let probe = MemProbe::start();
        let map =
            HashMap::new(self.keys.key_size(), MAP_VALUE_SIZE, self.n).expect("creating the map");
        for (i, k) in self.keys.iter().enumerate() {
            map.update(k, &value_of(i).to_ne_bytes(), BPF_NOEXIST)
                .expect("inserting a new key");
        }
        let held = probe.held();
        let (found, _, _) = count_pass(&map, None, self.probes);
        assert_eq!(found, self.present as u64, "present probes must all hit");
        self.ctx.step();
        Built { map, held }
    }

    /// The filter with `hash`, of the map's keys; its memory is the
    /// filter's alone, its false-positive rate counted in front of `map`.
    fn bloom(&self, map: &HashMap, hash: BloomHash, nr_hashes: u32) -> Filter {
        let probe = MemProbe::start();
        let bloom = BloomFilter::with_hash(
            self.keys.key_size(),
            self.n,
            nr_hashes,
            rand::random(),
            hash,
        )
        .expect("creating the filter");
        for k in self.keys.iter() {
            bloom.push(k).expect("pushing a value");
        }
        let held = probe.held();
        let (found, absent, false_pos) = count_pass(map, Some(&bloom), self.probes);
        assert_eq!(found, self.present as u64, "present probes must all hit");
        self.ctx.step();
        Filter {
            hash,
            bloom,
            held,
            fpp: false_pos as f64 / absent.max(1) as f64,
        }
    }

    /// Times the map alone and each filter in front of it, in turns; the
    /// records of all of them, the map's first.
    fn measure(&self, built: &Built, filters: &[Filter]) -> Vec<Record> {
        // The maps of the previous case may still be being freed.
        settle_reaper();
        let map = &built.map;
        let rates = {
            let mut loops = vec![lookups(map, self.probes, |_| true)];
            loops.extend(
                filters
                    .iter()
                    .map(|f| lookups(map, self.probes, |k| f.bloom.contains(k))),
            );
            rate_samples_interleaved(self.ctx.plan(), &mut loops)
        };
        let mut rates = rates.iter().map(|r| Stats::from_samples(r));
        let (c, s) = (&self.case, self.ctx.suite());
        let mut recs = vec![
            Record::stats(
                s,
                c,
                HASHMAP,
                &LOOKUPS_PER_SEC,
                rates.next().expect("the map's rate"),
            ),
            Record::single(s, c, HASHMAP, &MEM_BYTES_HELD, built.held as f64),
            Record::single(s, c, HASHMAP, &MEM_REPORTED, map.memory_usage() as f64),
        ];
        for (f, rate) in filters.iter().zip(rates) {
            let name = bloom_name(f.hash);
            recs.extend([
                Record::stats(s, c, name, &LOOKUPS_PER_SEC, rate),
                Record::single(s, c, name, &FALSE_POSITIVE_RATE, f.fpp),
                Record::single(s, c, name, &MEM_BYTES_HELD, f.held as f64),
                Record::single(s, c, name, &MEM_REPORTED, f.bloom.memory_usage() as f64),
            ]);
        }
        self.ctx.step();
        recs
    }
}

impl Suite for Bloom {
    type Opts = Opts;
    const NAME: &'static str = "bloom";
    const ABOUT: &'static str =
        "HashMap lookups/s of mostly absent keys with and without a BloomFilter in front";

    const DESCRIBE: &'static str = "The kernel's `bench_bloom_filter_map.c` hashmap-with/without-bloom \
         question, on generated data: a full `HashMap` (default options) of N \
         kernel-bench keys and 8-byte values, and a `BloomFilter` of the same \
         keys sized for N with 5 hash functions. As in the kernel bench the \
         value size (`vs`) is both the filter's value and the map's key. \
         2^18 probes, one in 16 a present key and the rest distinct absent \
         keys, shuffled. `hashmap` looks every probe up; `bloom+hashmap` \
         (kernel hashing: 5 jhash calls) and `bloom(xxh3)+hashmap` (one \
         xxh3_128, Kirsch-Mitzenmacher) look up only probes the filter calls \
         maybe-present. One guard is pinned per 256 probes. In each case the \
         map and the filters are built first and kept; then their \
         lookup loops are timed in turns (interleaved): one repetition of \
         each at a time, the one going first rotating, each turn after an \
         untimed quarter-length warm-up of its own, so that load drifting \
         on the machine falls on all of them alike. `fpp` is the \
         measured false-positive rate (map misses after a maybe, per absent \
         key); memory of a bloom row is the filter's alone (counting \
         allocator; `reported` is `memory_usage()`).";

    const BASELINE: &'static str = HASHMAP;

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let entries = ctx.list_or(
            opts.entries,
            &[10_000, 1_000_000],
            &[10_000, 100_000, 1_000_000],
        );
        let value_sizes = ctx.list_or(opts.value_sizes, &VALUE_SIZES, &VALUE_SIZES);
        let hashes: &[BloomHash] = if opts.no_xxh3 { &HASHES[..1] } else { &HASHES };
        // Per case: the map's build, each filter's, then the timing.
        ctx.set_steps((entries.len() * value_sizes.len() * (2 + hashes.len())) as u64);

        let mut all = Vec::new();
        for &n in &entries {
            let (indices, present) = probe_indices(n, opts.hit_every);
            for &vs in &value_sizes {
                let keys = KeySet::kernel(n as usize, vs);
                let probes = KeySet::kernel_indices(&indices, vs);
                let cell = Cell {
                    ctx,
                    n,
                    keys: &keys,
                    probes: &probes,
                    present,
                    case: case_of(n, vs, opts.nr_hashes, opts.hit_every),
                };
                // The map and every filter built and kept, then their
                // lookups timed in turns.
                let built = cell.hashmap();
                let filters: Vec<Filter> = hashes
                    .iter()
                    .map(|&h| cell.bloom(&built.map, h, opts.nr_hashes))
                    .collect();
                let recs = cell.measure(&built, &filters);
                ctx.print(&recs);
                all.extend(recs);
            }
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let entries = values(records, "n");
        let sizes = values(records, "vs");
        let get = |n: usize, vs: usize, imp: &str, metric: &str| {
            let (n, vs) = (n.to_string(), vs.to_string());
            records.iter().find(|r| {
                r.param("n") == Some(n.as_str())
                    && r.param("vs") == Some(vs.as_str())
                    && r.impl_name == imp
                    && r.metric == metric
            })
        };
        let speedup = |n, vs, h| {
            ratio(
                get(n, vs, bloom_name(h), LOOKUPS_PER_SEC.name),
                get(n, vs, HASHMAP, LOOKUPS_PER_SEC.name),
            )
        };
        let mut tables = Vec::new();
        for h in HASHES {
            let name = bloom_name(h);
            if !records.iter().any(|r| r.impl_name == name) {
                continue;
            }
            let headers: Vec<String> = std::iter::once("entries".to_string())
                .chain(sizes.iter().map(|vs| format!("vs {vs} B")))
                .collect();
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            let mut t = Table::new(format!("bloom: speedup of {name} over hashmap"), &headers)
                .with_note(
                    "Lookups per second with the filter in front / without, mostly absent keys; above 1 the filter pays.",
                );
            for &n in &entries {
                let mut row = vec![n.to_string()];
                row.extend(sizes.iter().map(|&vs| fmt_ratio(speedup(n, vs, h))));
                t.push(row);
            }
            tables.push(t);
        }

        let mut d = Table::new(
            "bloom: lookups, false positives and memory",
            &[
                "entries",
                "vs",
                "hashmap M/s",
                "bloom M/s",
                "bloom(xxh3) M/s",
                "bloom/hashmap",
                "bloom(xxh3)/hashmap",
                "fpp",
                "fpp xxh3",
                "bloom mem",
                "map mem",
            ],
        )
        .with_note(
            "Millions of probes per second; fpp is the measured false-positive rate (percent of absent keys); memory held after building (counting allocator).",
        );
        let pct = |r: Option<&Record>| r.map_or("-".into(), |r| format!("{:.2}%", r.value * 100.0));
        let mem = |r: Option<&Record>| r.map_or("-".into(), |r| fmt_bytes(r.value));
        for &n in &entries {
            for &vs in &sizes {
                let jh = bloom_name(BloomHash::Jhash);
                let xx = bloom_name(BloomHash::Xxh3);
                let rate = |imp| fmt_mops(get(n, vs, imp, LOOKUPS_PER_SEC.name).map(|r| r.value));
                d.push(vec![
                    n.to_string(),
                    vs.to_string(),
                    rate(HASHMAP),
                    rate(jh),
                    rate(xx),
                    fmt_ratio(speedup(n, vs, BloomHash::Jhash)),
                    fmt_ratio(speedup(n, vs, BloomHash::Xxh3)),
                    pct(get(n, vs, jh, FALSE_POSITIVE_RATE.name)),
                    pct(get(n, vs, xx, FALSE_POSITIVE_RATE.name)),
                    mem(get(n, vs, jh, MEM_BYTES_HELD.name)),
                    mem(get(n, vs, HASHMAP, MEM_BYTES_HELD.name)),
                ]);
            }
        }
        tables.push(d);
        tables
    }

    fn plots(&self, records: &[Record]) -> Vec<LinePlot> {
        let mut plots = Vec::new();
        for h in HASHES {
            let name = bloom_name(h);
            let mut p = LinePlot::new(
                format!(
                    "bloom-speedup-{}",
                    if h == BloomHash::Jhash {
                        "jhash"
                    } else {
                        "xxh3"
                    }
                ),
                format!("Speedup of {name} over hashmap, mostly absent keys"),
                "entries (log scale)",
                "lookups/s with filter / without",
            );
            p.log_x = true;
            for vs in values(records, "vs") {
                let vs_s = vs.to_string();
                let pts = records
                    .iter()
                    .filter(|r| {
                        r.impl_name == name
                            && r.metric == LOOKUPS_PER_SEC.name
                            && r.param("vs") == Some(vs_s.as_str())
                    })
                    .filter_map(|r| {
                        let base = find(records, &r.case, HASHMAP, LOOKUPS_PER_SEC.name);
                        Some((r.param("n")?.parse().ok()?, ratio(Some(r), base)?))
                    })
                    .collect();
                p.add(format!("{vs} B"), pts);
            }
            if !p.is_empty() {
                plots.push(p);
            }
        }
        plots
    }
}

/// Distinct values of numeric parameter `key`, sorted.
fn values(records: &[Record], key: &str) -> Vec<usize> {
    let mut v: Vec<usize> = records
        .iter()
        .filter_map(|r| r.param(key)?.parse().ok())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_mix_present_and_distinct_absent_keys() {
        let (v, present) = probe_indices(1000, 16);
        assert_eq!(v.len(), PROBES);
        assert_eq!(present, PROBES / 16);
        assert_eq!(v.iter().filter(|&&i| i < 1000).count(), present);
        let mut absent: Vec<u32> = v.iter().copied().filter(|&i| i >= 1000).collect();
        absent.sort_unstable();
        absent.dedup();
        assert_eq!(absent.len(), PROBES - present);
        assert_eq!(probe_indices(1000, 16).0, v, "deterministic");
    }
}
