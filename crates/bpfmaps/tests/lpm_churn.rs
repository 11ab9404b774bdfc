//! Memory after churn, in a process of its own: a compaction's old chunks
//! go back after a grace period, and other tests' readers, pinned now and
//! then on a machine with two cores, would hold those back for a while.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bpfmaps::lpm::LpmTrie;
use bpfmaps::{BPF_ANY, pin};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// IPv4 longest match by hashing every length, longest first: the
/// brute-force oracle's answers at a speed that suits a million prefixes.
#[derive(Default)]
struct ByLength(HashMap<(u32, u32), u32>);

fn mask(len: u32) -> u32 {
    u32::MAX.checked_shl(32 - len).unwrap_or(0)
}

impl ByLength {
    fn key(data: &[u8], len: u32) -> (u32, u32) {
        (
            u32::from_be_bytes(data.try_into().unwrap()) & mask(len),
            len,
        )
    }

    fn longest_match(&self, addr: &[u8]) -> Option<u32> {
        (0..=32)
            .rev()
            .find_map(|len| self.0.get(&Self::key(addr, len)).copied())
    }
}

/// Waits, pinning so that epochs advance, until the memory held stops
/// changing: compacted-away chunks are back with the system.
fn settle(trie: &LpmTrie) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut last, mut same) = (trie.memory_usage(), 0);
    while same < 50 && Instant::now() < deadline {
        pin().flush();
        std::thread::sleep(Duration::from_millis(1));
        let now = trie.memory_usage();
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
}

fn build(prefixes: &[(Vec<u8>, u32)], value: impl Fn(usize) -> u32) -> LpmTrie {
    let trie = LpmTrie::new(4, 4, prefixes.len() as u32).unwrap();
    for (i, (d, l)) in prefixes.iter().enumerate() {
        trie.insert(d, *l, &value(i).to_ne_bytes(), BPF_ANY)
            .unwrap();
    }
    settle(&trie);
    trie
}

fn answer(trie: &LpmTrie, addr: &[u8]) -> Option<u32> {
    trie.get(addr, &pin())
        .map(|v| u32::from_ne_bytes((*v).try_into().unwrap()))
}

/// Rounds of removing a random fifth of `prefixes` and inserting it again
/// (with new values): after each, memory held is within 1.15x of a fresh
/// build of the same set, and the trie answers as the oracle for every
/// churned prefix's first and last address and for random addresses.
fn churn_rounds(prefixes: &[(Vec<u8>, u32)], rounds: u32, random_lookups: usize) {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let trie = build(prefixes, |i| i as u32);
    let mut oracle = ByLength::default();
    for (i, (d, l)) in prefixes.iter().enumerate() {
        oracle.0.insert(ByLength::key(d, *l), i as u32);
    }
    let mut order: Vec<usize> = (0..prefixes.len()).collect();
    for round in 1..=rounds {
        order.shuffle(&mut rng);
        let fifth = &order[..prefixes.len() / 5];
        for &i in fifth {
            let (d, l) = &prefixes[i];
            trie.remove(d, *l, None).unwrap();
        }
        let value = |i: usize| i as u32 ^ round << 24;
        for &i in fifth {
            let (d, l) = &prefixes[i];
            trie.insert(d, *l, &value(i).to_ne_bytes(), BPF_ANY)
                .unwrap();
            oracle.0.insert(ByLength::key(d, *l), value(i));
        }
        settle(&trie);
        let fresh = build(prefixes, |_| 0);
        let (held, want) = (trie.memory_usage(), fresh.memory_usage());
        eprintln!(
            "round {round}: held {held} (live {}, {} compactions so far), a fresh build {want} (live {}, {} compactions)",
            trie.memory_live(),
            trie.compactions(),
            fresh.memory_live(),
            fresh.compactions()
        );
        assert!(
            held as f64 <= 1.15 * want as f64,
            "round {round}: {held} bytes held, a fresh build {want}"
        );
        // And what compaction promises (a fresh build may hold as much
        // without it): at most an eighth of the live bytes, or a huge-page
        // chunk, more.
        let live = trie.memory_live();
        assert!(
            held <= live + (live / 8).max((2 << 20) + (64 << 10)),
            "round {round}: {held} bytes held for {live} live"
        );
        for &i in fifth {
            let (d, l) = &prefixes[i];
            let first = u32::from_be_bytes(d[..].try_into().unwrap());
            let last = (first | !mask(*l)).to_be_bytes();
            for addr in [&d[..], &last] {
                assert_eq!(
                    answer(&trie, addr),
                    oracle.longest_match(addr),
                    "round {round}: {addr:?}"
                );
            }
        }
        for _ in 0..random_lookups {
            let addr = rng.random::<u32>().to_be_bytes();
            assert_eq!(
                answer(&trie, &addr),
                oracle.longest_match(&addr),
                "round {round}: {addr:?}"
            );
        }
    }
}

/// Distinct random IPv4 prefixes, mostly /16 to /24 as in real tables.
fn synthetic(n: usize) -> Vec<(Vec<u8>, u32)> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut seen = HashSet::new();
    std::iter::repeat_with(|| {
        let len = [8, 12, 16, 19, 20, 22, 23, 24, 24, 24, 28, 32][rng.random_range(0..12)];
        let addr = rng.random::<u32>() & mask(len);
        (addr.to_be_bytes().to_vec(), len)
    })
    .filter(|p| seen.insert(p.clone()))
    .take(n)
    .collect()
}

/// The real IPv4 table (`../shared/data/lpm`), if this checkout has it
/// next door.
fn real_ipv4() -> Option<Vec<(Vec<u8>, u32)>> {
    use std::io::BufRead;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/lpm/prefixes_ipv4.txt.gz");
    let Ok(f) = std::fs::File::open(&path) else {
        eprintln!("skipping the real table: {} not found", path.display());
        return None;
    };
    let lines = std::io::BufReader::new(flate2::read::GzDecoder::new(f)).lines();
    Some(
        lines
            .map(|l| {
                let net: ipnet::Ipv4Net = l.unwrap().trim().parse().unwrap();
                (net.addr().octets().to_vec(), u32::from(net.prefix_len()))
            })
            .collect(),
    )
}

/// One test, so that its parts do not hold each other's grace periods
/// back either.
#[test]
fn memory_after_churn_stays_near_a_fresh_build() {
    churn_rounds(&synthetic(50_000), 5, 20_000);
    if let Some(real) = real_ipv4() {
        churn_rounds(&real, 5, 200_000);
    }

    // A table that shrank to a quarter gives its chunks back on
    // `shrink_to_fit`.
    let prefixes = synthetic(40_000);
    let trie = build(&prefixes, |i| i as u32);
    let full = trie.memory_usage();
    let (kept, gone) = prefixes.split_at(prefixes.len() / 4);
    for (d, l) in gone {
        trie.remove(d, *l, None).unwrap();
    }
    trie.shrink_to_fit();
    settle(&trie);
    let fresh = build(kept, |i| i as u32);
    let held = trie.memory_usage();
    assert!(
        held as f64 <= 1.15 * fresh.memory_usage() as f64,
        "{held} held after shrinking from {full}, a fresh build {}",
        fresh.memory_usage()
    );
    let mut oracle = ByLength::default();
    for (i, (d, l)) in kept.iter().enumerate() {
        oracle.0.insert(ByLength::key(d, *l), i as u32);
    }
    for (d, _) in prefixes.iter() {
        assert_eq!(answer(&trie, d), oracle.longest_match(d), "{d:?}");
    }
}
