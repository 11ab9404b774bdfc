use std::collections::HashSet;
use std::sync::Arc;

use proptest::prelude::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::*;
use crate::{BPF_ANY, Map, create};

fn both_hashes() -> [BloomHash; 2] {
    [BloomHash::Jhash, BloomHash::Xxh3]
}

/// Distinct values of `size` bytes, deterministic for a given `rng`.
fn distinct_values(rng: &mut StdRng, size: usize, n: usize) -> Vec<Vec<u8>> {
    assert!(size >= 8 || n <= 1 << (8 * size), "only {size}-byte values");
    let mut seen = HashSet::new();
    while seen.len() < n {
        let mut v = vec![0u8; size];
        rng.fill(&mut v[..]);
        seen.insert(v);
    }
    seen.into_iter().collect()
}

#[test]
fn sizing_follows_the_kernel() {
    // (max_entries, nr_hashes) -> bits: (n * k) / 5 * 7, floor 64, next pow2.
    let cases = [
        (1, 1, 64),
        (1, 5, 64),
        (9, 5, 64),      // 45 / 5 * 7 = 63
        (10, 5, 128),    // 70
        (1000, 5, 8192), // 7000
        (1 << 20, 5, 1 << 23),
        (u32::MAX, 5, MAX_BITS), // overflow
        (1 << 28, 15, MAX_BITS), // above 2^31
    ];
    for (n, k, bits) in cases {
        assert_eq!(kernel_nr_bits(n, k), bits, "n={n} k={k}");
    }
    let f = BloomFilter::with_seed(4, 1000, 5, 0).unwrap();
    assert_eq!(f.bit_count(), 8192);
    assert_eq!(f.memory_usage(), size_of::<BloomFilter>() + 8192 / 8);
}

#[test]
fn nr_hashes_zero_is_five_and_sixteen_is_invalid() {
    assert_eq!(BloomFilter::new(4, 10, 0).unwrap().nr_hashes(), 5);
    assert_eq!(BloomFilter::new(4, 10, 1).unwrap().nr_hashes(), 1);
    assert_eq!(BloomFilter::new(4, 10, 15).unwrap().nr_hashes(), 15);
    assert_eq!(BloomFilter::new(4, 10, 16).unwrap_err().errno(), 22);
    assert_eq!(BloomFilter::new(0, 10, 5).unwrap_err().errno(), 22);
    assert_eq!(BloomFilter::new(4, 0, 5).unwrap_err().errno(), 22);
}

#[test]
fn one_push_sets_k_distinct_bits() {
    // Catches hashing that sends every index to the same bit.
    for hash in both_hashes() {
        for k in [1, 3, 5, 15] {
            for size in [4, 7, 16] {
                let f = BloomFilter::with_hash(size, 100_000, k, 11, hash).unwrap();
                f.push(&vec![0xa5; size]).unwrap();
                // With 2^20+ bits, k probes collide with odds ~k^2 / 2^21.
                assert_eq!(f.bits_set(), u64::from(k), "{hash:?} k={k} size={size}");
            }
        }
    }
}

#[test]
fn jhash_bits_match_the_kernel_formula() {
    // Whole words: jhash2 with seed + i; otherwise jhash.
    for (size, seed) in [(8usize, 0u32), (5, 77), (4, u32::MAX)] {
        let f = BloomFilter::with_hash(size, 50, 3, seed, BloomHash::Jhash).unwrap();
        let value: Vec<u8> = (1..=size as u8).collect();
        f.push(&value).unwrap();
        let mut want = HashSet::new();
        for i in 0..3u32 {
            let h = if size % 4 == 0 {
                jhash2_bytes(&value, seed.wrapping_add(i))
            } else {
                jhash(&value, seed.wrapping_add(i))
            };
            want.insert(u64::from(h) & (f.bit_count() - 1));
        }
        for bit in 0..f.bit_count() {
            let set = f.words[(bit / 64) as usize].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0;
            assert_eq!(set, want.contains(&bit), "size={size} bit={bit}");
        }
    }
}

#[test]
fn no_false_negatives() {
    let mut rng = StdRng::seed_from_u64(1);
    for hash in both_hashes() {
        for size in [1usize, 4, 6, 8, 64] {
            let f = BloomFilter::with_hash(size, 2000, 0, rng.random(), hash).unwrap();
            // Overfill on purpose: false negatives must not appear even then.
            // (One-byte values: all 256 of them.)
            let n = if size == 1 {
                256
            } else {
                crate::scaled(3000, 100)
            };
            let values = distinct_values(&mut rng, size, n);
            for v in &values {
                f.push(v).unwrap();
            }
            assert!(values.iter().all(|v| f.contains(v)), "{hash:?} size={size}");
            assert_eq!(Map::len(&f), n);
        }
    }
}

#[test]
#[cfg_attr(miri, ignore = "a statistical test: 21,000 values per hashing")]
fn false_positive_rate_is_near_theory() {
    // n = 1000 values in m = 8192 bits with k = 5: theory
    // (1 - e^(-kn/m))^k = 0.0201. Over 20_000 absent probes that is ~400
    // false positives, sd ~20; the bounds are ~10 sd wide, and broken hashing
    // (k probes on one bit: 0.115, or correlated probes) lands far outside.
    let (n, k, probes) = (1000usize, 5u32, 20_000usize);
    for hash in both_hashes() {
        let mut rng = StdRng::seed_from_u64(2);
        let f = BloomFilter::with_hash(8, n as u32, k, 3, hash).unwrap();
        let values = distinct_values(&mut rng, 8, n + probes);
        let (members, others) = values.split_at(n);
        for v in members {
            f.push(v).unwrap();
        }
        let m = f.bit_count() as f64;
        let theory = (1.0 - (-(k as f64) * n as f64 / m).exp()).powi(k as i32);
        let fp = others.iter().filter(|v| f.contains(v)).count() as f64 / probes as f64;
        assert!(
            fp > theory * 0.5 && fp < theory * 1.6,
            "{hash:?}: fp rate {fp:.4}, theory {theory:.4}"
        );
        let est = f.estimated_fpp();
        assert!(
            est > theory * 0.8 && est < theory * 1.25,
            "{hash:?}: est {est}"
        );
    }
}

#[test]
fn concurrent_pushes_lose_no_bits() {
    let mut rng = StdRng::seed_from_u64(3);
    // A small array so the two threads hammer the same words.
    let f = Arc::new(BloomFilter::with_seed(8, 64, 3, 9).unwrap());
    let n = crate::scaled(4000, 200);
    let values = Arc::new(distinct_values(&mut rng, 8, n));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (f, values) = (Arc::clone(&f), Arc::clone(&values));
            std::thread::spawn(move || {
                for v in values.iter().skip(t).step_by(2) {
                    f.push(v).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(values.iter().all(|v| f.contains(v)));
    assert_eq!(Map::len(&*f), n);

    // The same set pushed from one thread gives the same bits.
    let serial = BloomFilter::with_seed(8, 64, 3, 9).unwrap();
    for v in values.iter() {
        serial.push(v).unwrap();
    }
    for (a, b) in f.words.iter().zip(serial.words.iter()) {
        assert_eq!(a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
    }
}

/// A snapshot of the bits.
fn bits(f: &BloomFilter) -> Vec<u64> {
    f.words.iter().map(|w| w.load(Ordering::Relaxed)).collect()
}

/// A filter built through `create()`, as a concrete type.
fn from_spec(spec: &MapSpec) -> Result<BloomFilter> {
    BLOOM_FILTER_FAMILY.check(spec)?;
    BloomFilter::from_spec(spec)
}

#[test]
fn spec_validation_follows_the_kernel() {
    let good = MapSpec::new(MapType::BLOOM_FILTER, 0, 8, 100);
    assert_eq!(from_spec(&good).unwrap().nr_hashes(), 5);
    let bad = [
        MapSpec::new(MapType::BLOOM_FILTER, 4, 8, 100), // key_size
        MapSpec::new(MapType::BLOOM_FILTER, 0, 0, 100), // value_size
        MapSpec::new(MapType::BLOOM_FILTER, 0, 8, 0),   // max_entries
        good.clone().extra(0x10),                       // 16 hashes
        good.clone().extra(1 << 40),                    // high bits
        good.clone().flags(crate::core::flags::BPF_F_NO_PREALLOC), // flag
        good.clone().flags(1 << 3),
    ];
    for spec in bad {
        assert_eq!(create(&spec).err().unwrap().errno(), 22, "{spec:?}");
    }
    // BPF_F_ZERO_SEED: seed 0, so two filters set the same bits.
    let zero = good.clone().flags(BPF_F_ZERO_SEED).extra(7);
    let (a, b) = (from_spec(&zero).unwrap(), from_spec(&zero).unwrap());
    assert_eq!(a.nr_hashes(), 7);
    a.push(&[3; 8]).unwrap();
    b.push(&[3; 8]).unwrap();
    assert_eq!(bits(&a), bits(&b));
    let c = BloomFilter::with_seed(8, 100, 7, 0).unwrap();
    c.push(&[3; 8]).unwrap();
    assert_eq!(bits(&a), bits(&c));
    // Hash policies.
    let xxh = from_spec(&good.clone().hash(HashPolicy::Xxh3)).unwrap();
    assert_eq!(xxh.hash(), BloomHash::Xxh3);
    let hybrid = from_spec(&good.clone().hash(HashPolicy::Hybrid)).unwrap();
    assert_eq!(hybrid.hash(), BloomHash::Jhash);
}

#[test]
fn create_round_trip() {
    let spec = MapSpec::new(MapType::BLOOM_FILTER, 0, 4, 1000)
        .extra(4)
        .flags(BPF_F_ZERO_SEED);
    let map = create(&spec).unwrap();
    assert_eq!(map.map_type(), MapType::BLOOM_FILTER);
    assert_eq!(
        (map.key_size(), map.value_size(), map.max_entries()),
        (0, 4, 1000)
    );
    assert!(map.is_empty());
    for i in 0..100u32 {
        map.push(&i.to_ne_bytes(), BPF_ANY).unwrap();
    }
    for i in 0..100u32 {
        map.peek(&mut i.to_ne_bytes()).unwrap();
    }
    // 1000 * 4 / 5 * 7 = 5600 -> 8192 bits with 100 values and 4 hashes:
    // a false positive among these is possible but this seed has none.
    let absent = (1000..1100u32)
        .filter(|i| map.peek(&mut i.to_ne_bytes()) == Err(Error::NotFound))
        .count();
    assert!(absent > 95, "{absent}");
    assert_eq!(map.len(), 100);
    assert_eq!(map.memory_usage(), size_of::<BloomFilter>() + 8192 / 8);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(64, 2) as u32))]

    /// Against a `HashSet` model: every pushed value is reported present.
    #[test]
    fn prop_no_false_negatives(
        size in 1usize..24,
        k in 0u32..=15,
        max_entries in 1u32..500,
        seed: u32,
        xxh3: bool,
        raw in proptest::collection::vec(any::<u64>(), 0..200),
    ) {
        let hash = if xxh3 { BloomHash::Xxh3 } else { BloomHash::Jhash };
        let f = BloomFilter::with_hash(size, max_entries, k, seed, hash).unwrap();
        let mut model = HashSet::new();
        for (i, r) in raw.iter().enumerate() {
            let mut v = vec![0u8; size];
            let bytes = r.to_ne_bytes();
            for (j, b) in v.iter_mut().enumerate() {
                *b = bytes[j % 8] ^ j as u8;
            }
            f.push(&v).unwrap();
            model.insert(v);
            if i % 16 == 0 {
                prop_assert!(model.iter().all(|v| f.contains(v)));
            }
        }
        prop_assert!(model.iter().all(|v| f.contains(v)));
        prop_assert_eq!(Map::len(&f), raw.len());
        prop_assert!(f.bits_set() <= raw.len() as u64 * u64::from(f.nr_hashes()));
    }
}
