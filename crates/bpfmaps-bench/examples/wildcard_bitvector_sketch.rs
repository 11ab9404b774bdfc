//! A sketch, not a map: would a bit-vector classifier (Lakshman and
//! Stiliadis's, with aggregated bit vectors, Baboescu and Varghese's)
//! meet the Cilium target of 3x the six lookups on the `wildcard-cilium`
//! suite's wildcard rules, where TupleMerge's tables cannot (at least
//! 1.57 tables a packet; docs/benchmarks.md, "What Cilium's 3x would
//! need")?
//!
//! Built once from the rules a `WildcardMap` of the suite's case holds:
//! the rules ranked in rule order (priority, then the map's tie-break),
//! and per field the elementary intervals its rules' bounds cut the
//! field into, each with the bitmap of the rules that hold it (bit `r`:
//! the rule of rank `r`) and a first word with one bit per nonzero word
//! (the aggregate). A field of 16 bits or fewer finds its interval in a
//! table of every value; a field whose rules are each one value or all
//! values, in a hash of the values; any other by binary search. A
//! packet's answer: the first rule in every field's bitmap, the words
//! read where every aggregate has a bit. No updates (a rebuild each).
//!
//! Checks every packet's answer against the map's, then times, in
//! turns (`measure::in_turns`: each round starts one path later), over
//! the suite's packets (medians and ranges of `--rounds`): the sketch's finders alone (each field's interval and
//! aggregate word, no bitmap scanned), the sketch one packet at a time
//! and in bursts of 32 (every packet's bitmaps asked for, then each
//! scanned), the map's `classify_key` and its bursts of 32
//! (`classify_many_keys`), and the six lookups.
//!
//! `cargo run --release -p bpfmaps-bench --example
//! wildcard_bitvector_sketch -- [SHAPE] [RULES] [--rounds N]` (default
//! `wildcard 1000`, 11 rounds).

use std::hint::black_box;
use std::time::Instant;

use bpfmaps::wildcard::{Rule, Schema, WildcardMap};
use bpfmaps_bench::measure::in_turns;
use bpfmaps_bench::stats::Stats;
use bpfmaps_bench::suites::wildcard_cilium;

/// How a field finds the interval a value falls in.
enum Finder {
    /// Every value's interval (fields of 16 bits or fewer).
    Table(Vec<u16>),
    /// Rules of one value or all values: the values' intervals in an
    /// open-addressed table of `(value, interval)`, `other` for the rest.
    Points {
        slots: Vec<(u64, u32)>,
        shift: u32,
        other: u32,
    },
    /// Intervals' starts, ascending.
    Search(Vec<u128>),
}

const EMPTY: u64 = u64::MAX;

impl Finder {
    #[inline(always)]
    fn find(&self, v: u128) -> usize {
        match self {
            Finder::Table(t) => t[v as usize] as usize,
            Finder::Points {
                slots,
                shift,
                other,
            } => {
                let mut i = ((v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize;
                loop {
                    let (k, at) = slots[i];
                    if k == v as u64 {
                        return at as usize;
                    }
                    if k == EMPTY {
                        return *other as usize;
                    }
                    i = (i + 1) & (slots.len() - 1);
                }
            }
            Finder::Search(starts) => starts.partition_point(|&s| s <= v) - 1,
        }
    }
}

/// One field: its finder and its intervals' bitmaps, `stride` words
/// each (the aggregate, then the rules' words).
struct FieldBits {
    finder: Finder,
    bits: Vec<u64>,
}

/// Cilium's 8-byte key as the four fields' values.
fn fields_of(key: &[u8; 8]) -> [u128; 4] {
    [
        u128::from(u32::from_be_bytes([key[0], key[1], key[2], key[3]])),
        u128::from(u16::from_be_bytes([key[4], key[5]])),
        u128::from(key[6]),
        u128::from(key[7]),
    ]
}

struct Sketch {
    fields: Vec<FieldBits>,
    stride: usize,
    values: Vec<u32>,
}

impl Sketch {
    fn new(schema: &Schema, mut rules: Vec<(Rule, Vec<u8>)>) -> Sketch {
        rules.sort_by(|a, b| a.0.cmp(&b.0));
        let words = rules.len().div_ceil(64);
        assert!(words <= 64, "one aggregate word: at most 4,096 rules");
        let stride = 1 + words;
        let fields = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(f, field)| {
                let max = field.max();
                let mut starts = vec![0u128];
                for (r, _) in &rules {
                    let (lo, hi) = r.bounds()[f];
                    starts.push(lo);
                    if hi < max {
                        starts.push(hi + 1);
                    }
                }
                starts.sort_unstable();
                starts.dedup();
                let mut bits = vec![0u64; starts.len() * stride];
                for (rank, (r, _)) in rules.iter().enumerate() {
                    let (lo, hi) = r.bounds()[f];
                    let first = starts.partition_point(|&s| s < lo);
                    let last = starts.partition_point(|&s| s <= hi);
                    for i in first..last {
                        bits[i * stride + 1 + rank / 64] |= 1 << (rank % 64);
                        bits[i * stride] |= 1 << (rank / 64);
                    }
                }
                let points = rules.iter().all(|(r, _)| {
                    let (lo, hi) = r.bounds()[f];
                    lo == hi || (lo == 0 && hi == max)
                });
                let finder = if field.bits() <= 16 {
                    let mut t = vec![0u16; max as usize + 1];
                    for (i, w) in starts.windows(2).enumerate() {
                        t[w[0] as usize..w[1] as usize].fill(i as u16);
                    }
                    let last = *starts.last().expect("0");
                    t[last as usize..].fill((starts.len() - 1) as u16);
                    Finder::Table(t)
                } else if points && field.bits() <= 63 {
                    let held: Vec<(u128, usize)> = (starts.iter().enumerate())
                        .filter(|&(i, &s)| {
                            starts.get(i + 1).is_some_and(|&n| n == s + 1)
                                && rules.iter().any(|(r, _)| r.bounds()[f] == (s, s))
                        })
                        .map(|(i, &s)| (s, i))
                        .collect();
                    // Every value not held: in the interval of a value
                    // no rule names (all its rules are the full ones).
                    let other = (0..starts.len())
                        .find(|i| !held.iter().any(|&(_, h)| h == *i))
                        .expect("an interval no point holds");
                    let cap = (2 * held.len()).next_power_of_two().max(2);
                    let shift = 64 - cap.trailing_zeros();
                    let mut slots = vec![(EMPTY, 0u32); cap];
                    for &(v, i) in &held {
                        let mut at =
                            ((v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize;
                        while slots[at].0 != EMPTY {
                            at = (at + 1) & (cap - 1);
                        }
                        slots[at] = (v as u64, i as u32);
                    }
                    Finder::Points {
                        slots,
                        shift,
                        other: other as u32,
                    }
                } else {
                    Finder::Search(starts)
                };
                FieldBits { finder, bits }
            })
            .collect();
        let values = rules
            .iter()
            .map(|(_, v)| u32::from_ne_bytes(v[..4].try_into().expect("4 bytes")))
            .collect();
        Sketch {
            fields,
            stride,
            values,
        }
    }

    /// Only each field's interval and its aggregate word (the part of
    /// [`classify`](Self::classify) before the bitmaps' words): a floor
    /// under what the sketch can take.
    #[inline(always)]
    fn find_only(&self, key: &[u8; 8]) -> u32 {
        let values = fields_of(key);
        let s = self.stride;
        let at: [u64; 4] = std::array::from_fn(|f| {
            let i = self.fields[f].finder.find(values[f]);
            self.fields[f].bits[i * s]
        });
        (at[0] & at[1] & at[2] & at[3]) as u32
    }

    /// Each key's four bitmaps' offsets, asked for, then each answered.
    fn classify_burst(&self, keys: &[[u8; 8]], out: &mut [Option<u32>]) {
        let s = self.stride;
        let mut at = [[0usize; 4]; 32];
        for (k, at) in keys.iter().zip(&mut at) {
            let values = fields_of(k);
            for f in 0..4 {
                at[f] = self.fields[f].finder.find(values[f]) * s;
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a prefetch never faults, whatever the address.
                unsafe {
                    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                    _mm_prefetch::<_MM_HINT_T0>(self.fields[f].bits[at[f]..].as_ptr().cast());
                }
            }
        }
        for (at, o) in at.iter().zip(out.iter_mut()).take(keys.len()) {
            let b: [&[u64]; 4] = std::array::from_fn(|f| &self.fields[f].bits[at[f]..at[f] + s]);
            let mut agg = b[0][0] & b[1][0] & b[2][0] & b[3][0];
            *o = None;
            while agg != 0 {
                let w = agg.trailing_zeros() as usize;
                let x = b[0][1 + w] & b[1][1 + w] & b[2][1 + w] & b[3][1 + w];
                if x != 0 {
                    *o = Some(self.values[w * 64 + x.trailing_zeros() as usize]);
                    break;
                }
                agg &= agg - 1;
            }
        }
    }

    /// The value of the first rule matching Cilium's 8-byte key.
    #[inline(always)]
    fn classify(&self, key: &[u8; 8]) -> Option<u32> {
        let values = fields_of(key);
        let s = self.stride;
        let at: [&[u64]; 4] = std::array::from_fn(|f| {
            let i = self.fields[f].finder.find(values[f]);
            &self.fields[f].bits[i * s..(i + 1) * s]
        });
        let mut agg = at[0][0] & at[1][0] & at[2][0] & at[3][0];
        while agg != 0 {
            let w = agg.trailing_zeros() as usize;
            let x = at[0][1 + w] & at[1][1 + w] & at[2][1 + w] & at[3][1 + w];
            if x != 0 {
                return Some(self.values[w * 64 + x.trailing_zeros() as usize]);
            }
            agg &= agg - 1;
        }
        None
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut shape, mut rules, mut rounds) = ("wildcard".to_string(), 1000usize, 11usize);
    let mut positional = 0;
    while let Some(a) = args.next() {
        if a == "--rounds" {
            rounds = args.next().and_then(|n| n.parse().ok()).expect("a number");
        } else {
            match positional {
                0 => shape = a,
                _ => rules = a.parse().expect("a rule count"),
            }
            positional += 1;
        }
    }
    let (map, hash, keys) = wildcard_cilium::workload(&shape, rules, 100_000);
    let started = Instant::now();
    let sketch = Sketch::new(map.schema(), map.rules());
    let build = started.elapsed();
    let bytes: usize = sketch
        .fields
        .iter()
        .map(|f| {
            8 * f.bits.len()
                + match &f.finder {
                    Finder::Table(t) => 2 * t.len(),
                    Finder::Points { slots, .. } => 16 * slots.len(),
                    Finder::Search(s) => 16 * s.len(),
                }
        })
        .sum();
    let guard = bpfmaps::pin();
    let answer = |m: &WildcardMap, k: &[u8; 8]| {
        (m.classify_key(k, &guard).expect("8 bytes"))
            .map(|(_, v)| u32::from_ne_bytes(v[..4].try_into().expect("4 bytes")))
    };
    let wrong = keys
        .iter()
        .filter(|k| sketch.classify(k) != answer(&map, k))
        .count();
    println!(
        "{shape} {} rules: built in {:.2} ms, {} KiB ({} words a bitmap); \
         {wrong} of {} answers differ from the map's",
        map.len(),
        build.as_secs_f64() * 1e3,
        bytes / 1024,
        sketch.stride,
        keys.len()
    );
    assert_eq!(wrong, 0, "the sketch answers as the map");
    let flat: Vec<u8> = keys.concat();
    let names = [
        "finders",
        "bit vectors",
        "bv bursts",
        "classify_key",
        "bursts of 32",
        "six lookups",
    ];
    let mut out = [None; 32];
    // In turns, each round starting one path later (`measure::in_turns`).
    let ns = in_turns(names.len(), rounds, |which| {
        let started = Instant::now();
        let mut acc = 0u32;
        match which {
            0 => (keys.iter()).for_each(|k| acc ^= sketch.find_only(k)),
            1 => (keys.iter()).for_each(|k| acc ^= sketch.classify(k).unwrap_or(u32::MAX)),
            2 => {
                let mut o = [None; 32];
                for burst in keys.chunks(32) {
                    sketch.classify_burst(burst, &mut o);
                    for a in &o[..burst.len()] {
                        acc ^= a.unwrap_or(u32::MAX);
                    }
                }
            }
            3 => (keys.iter()).for_each(|k| acc ^= answer(&map, k).unwrap_or(u32::MAX)),
            4 => {
                for burst in flat.chunks(8 * 32) {
                    let n = burst.len() / 8;
                    map.classify_many_keys(burst, &guard, &mut out[..n])
                        .expect("whole keys");
                    for o in &out[..n] {
                        acc ^= o.map_or(u32::MAX, |(_, v)| v[0].into());
                    }
                }
            }
            _ => (keys.iter()).for_each(|k| {
                acc ^= u32::from(wildcard_cilium::six_lookups_once(&hash, k, &guard))
            }),
        }
        black_box(acc);
        started.elapsed().as_nanos() as f64 / keys.len() as f64
    });
    let six = Stats::from_samples(&ns[5]).median;
    for (name, samples) in names.iter().zip(&ns) {
        let s = Stats::from_samples(samples);
        println!(
            "{name:>14}: {:6.2} ns a packet [{:.2}..{:.2}], {:.2}x the six lookups' speed",
            s.median,
            s.min,
            s.max,
            six / s.median
        );
    }
}
