//! A fixed classification workload for instruction counts: callgrind on
//! the benchmark suites counts loops that run for a time, so their
//! packet mix, and the instructions a packet, vary from run to run.
//! This classifies each packet once:
//! - `exact`: 1,000 exact rules of Cilium's key (one table), each
//!   packet a rule's key;
//! - a ClassBench rule file (`.gz`): the set loaded, then 20,000 packets
//!   drawn inside its rules (`classbench::generate_trace`, seed 7).
//!
//! `cargo build --release -p bpfmaps-bench --example wildcard_probe_once`,
//! then `valgrind --tool=callgrind --toggle-collect='*classify_once*'
//! target/release/examples/wildcard_probe_once exact` (or
//! `../shared/data/classbench/acl1_10k.gz`): the total over the
//! packets, each a call of `classify` and the read of its answer
//! (docs/benchmarks.md, "One table, probed alone"; before the
//! thirty-seventh session the toggle was the map's own
//! `'bpfmaps::wildcard::map::WildcardMap::classify_in*'`, without the
//! call and the answer).
//!
//! - `cilium:SHAPE:N`: the `wildcard-cilium` suite's case of `N` rules
//!   of `SHAPE` (`exact`, `wildcard`, `mixed`) and 20,000 of its packets
//!   inside the rules, through `classify_key` on the six lookups' 8-byte
//!   keys (collect `'*classify_key_once*'`); with a second argument
//!   `six`, through the six lookups (collect `'*six_lookups_once*'`).
//!
//! With a second argument `many` (a ClassBench file or `cilium:SHAPE:N`),
//! the packets go through `classify_many` in bursts of 32 (collect
//! `'*classify_many_once*'`); with `many-keys`, their keys' bytes
//! through `classify_many_keys` in bursts of 32 (collect
//! `'*classify_keys_once*'`).
//!
//! With a second argument `key`, each packet goes through
//! `classify_key` as its key's bytes (collect `'*classify_key_once*'`); with
//! `contract`, through the byte contract's lookup of its concrete key,
//! on a copy of the map made by `create()` (collect `'*map_lookup_elem*'`);
//! with `hash` (`exact` only), as the first of Cilium's six lookups, in
//! the foundation's hash map of 8-byte keys (collect `'*lookup_once*'`).

use std::io::Read;

use bpfmaps::wildcard::{Field, Packet, Rule, Schema, WildcardMap, classbench};
use bpfmaps::{BPF_ANY, BPF_NOEXIST, MapSpec, MapType};
use bpfmaps_bench::suites::wildcard_cilium;

/// 1,000 exact rules of Cilium's key and a packet matching each.
fn exact() -> (WildcardMap, Vec<Packet>) {
    let schema = Schema::new(vec![
        Field::exact("id", 4),
        Field::range("dport", 2),
        Field::exact("proto", 1),
        Field::exact("dir", 1),
    ])
    .expect("a schema");
    let map = WildcardMap::new(schema.clone(), 4, 1000).expect("a map");
    let mut packets = Vec::new();
    for i in 0..1000u32 {
        let values = [
            u128::from(i * 7919 % 100_000),
            u128::from(i % 1000),
            6,
            u128::from(i % 2),
        ];
        let rule = schema
            .rule(0)
            .exact("id", values[0])
            .range("dport", values[1], values[1])
            .exact("proto", values[2])
            .exact("dir", values[3])
            .build()
            .expect("a rule");
        map.insert(&rule, &i.to_ne_bytes(), BPF_ANY)
            .expect("room for the rule");
        let mut packet = Packet::default();
        packet.values[..4].copy_from_slice(&values);
        packets.push(packet);
    }
    (map, packets)
}

/// The ClassBench set at `path` and 20,000 packets inside its rules.
fn classbench_set(path: &str) -> (WildcardMap, Vec<Packet>) {
    let schema = classbench::schema();
    let mut text = String::new();
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let rules: Vec<Rule> = classbench::parse_rules(&schema, &text).expect("a rule file");
    let map = WildcardMap::new(schema.clone(), 4, rules.len() as u32).expect("a map");
    map.load(
        rules.iter().map(|r| (r, r.priority.to_ne_bytes())),
        BPF_NOEXIST,
    )
    .expect("distinct rules");
    let packets = classbench::generate_trace(&schema, &rules, 20_000, 1.0, 7);
    (map, packets)
}

/// One classification of a packet (its own function, for callgrind's
/// toggle: it counts the answer's rule and value too).
#[inline(never)]
fn classify_once(map: &WildcardMap, packet: &Packet, guard: &bpfmaps::Guard) -> bool {
    map.classify(packet, guard).is_some()
}

/// One classification of a key's bytes (as [`classify_once`]).
#[inline(never)]
fn classify_key_once(map: &WildcardMap, key: &[u8], guard: &bpfmaps::Guard) -> bool {
    map.classify_key(key, guard).expect("a key").is_some()
}

/// One call of `classify_many` on a burst of packets (as
/// [`classify_once`]): how many matched.
#[inline(never)]
fn classify_many_once(map: &WildcardMap, packets: &[Packet], guard: &bpfmaps::Guard) -> usize {
    let mut out = [None; 32];
    map.classify_many(packets, guard, &mut out).expect("room");
    out[..packets.len()].iter().flatten().count()
}

/// One call of `classify_many_keys` on a burst of keys of `size` bytes
/// (as [`classify_many_once`]).
#[inline(never)]
fn classify_keys_once(
    map: &WildcardMap,
    keys: &[u8],
    size: usize,
    guard: &bpfmaps::Guard,
) -> usize {
    let mut out = [None; 32];
    map.classify_many_keys(keys, guard, &mut out)
        .expect("whole keys, room");
    out[..keys.len() / size].iter().flatten().count()
}

/// Keys of `size` bytes back to back, through [`classify_keys_once`] 32
/// at a time: how many matched.
fn keys_in_bursts(map: &WildcardMap, keys: &[u8], size: usize, guard: &bpfmaps::Guard) -> usize {
    keys.chunks(32 * size)
        .map(|burst| classify_keys_once(map, burst, size, guard))
        .sum()
}

/// One lookup of the hash map (its own function, for callgrind's toggle).
#[inline(never)]
fn lookup_once(
    hash: &bpfmaps::hashtab::TypedHashMap<[u8; 8], u32>,
    key: &[u8; 8],
    guard: &bpfmaps::Guard,
) -> bool {
    hash.get(key, guard).is_some()
}

/// The `wildcard-cilium` case `SHAPE:N`, each of 20,000 packets
/// classified once by the map or, with `six`, by the six lookups.
fn cilium(case: &str, how: Option<&str>) {
    let (shape, n) = case.split_once(':').expect("cilium:SHAPE:N");
    let n = n.parse().expect("a rule count");
    let (map, hash, keys) = wildcard_cilium::workload(shape, n, 20_000);
    let guard = bpfmaps::pin();
    let matched = if how == Some("six") {
        keys.iter()
            .filter(|k| wildcard_cilium::six_lookups_once(&hash, k, &guard))
            .count()
    } else if how == Some("many") {
        let packets: Vec<Packet> = keys
            .iter()
            .map(|k| {
                let mut p = Packet::default();
                p.values[..4].copy_from_slice(&[
                    u128::from(u32::from_be_bytes([k[0], k[1], k[2], k[3]])),
                    u128::from(u16::from_be_bytes([k[4], k[5]])),
                    u128::from(k[6]),
                    u128::from(k[7]),
                ]);
                p
            })
            .collect();
        packets
            .chunks(32)
            .map(|burst| classify_many_once(&map, burst, &guard))
            .sum()
    } else if how == Some("many-keys") {
        keys_in_bursts(&map, &keys.concat(), 8, &guard)
    } else {
        keys.iter()
            .filter(|k| classify_key_once(&map, &k[..], &guard))
            .count()
    };
    println!("{matched} of {} packets matched", keys.len());
}

fn main() {
    let what = std::env::args()
        .nth(1)
        .expect("`exact`, `cilium:SHAPE:N` or a ClassBench rule file");
    if let Some(case) = what.strip_prefix("cilium:") {
        return cilium(case, std::env::args().nth(2).as_deref());
    }
    let (map, packets) = if what == "exact" {
        exact()
    } else {
        classbench_set(&what)
    };
    let guard = bpfmaps::pin();
    let how = std::env::args().nth(2);
    let matched = if how.as_deref() == Some("hash") {
        // The six lookups' first probe, which finds an exact rule.
        let hash = bpfmaps::hashtab::TypedHashMap::<[u8; 8], u32>::new(1 << 20).expect("a map");
        let keys: Vec<[u8; 8]> = packets
            .iter()
            .map(|p| map.schema().packet_key(p).try_into().expect("8 bytes"))
            .collect();
        for (i, k) in keys.iter().enumerate() {
            hash.update(k, &(i as u32), BPF_ANY).expect("room");
        }
        keys.iter()
            .filter(|k| lookup_once(&hash, k, &guard))
            .count()
    } else if how.as_deref() == Some("contract") {
        let schema = map.schema();
        let spec = MapSpec::new(MapType::WILDCARD, schema.rule_key_size() as u32, 4, 1 << 20)
            .extra(schema.map_extra());
        let copy = bpfmaps::create(&spec).expect("a map through the contract");
        for (rule, value) in map.rules() {
            copy.update(&schema.rule_key(&rule), &value, BPF_NOEXIST)
                .expect("room for the rule");
        }
        let keys: Vec<Vec<u8>> = packets.iter().map(|p| schema.match_key(p)).collect();
        let mut value = [0u8; 4];
        keys.iter()
            .filter(|k| copy.lookup(k, &mut value).is_ok())
            .count()
    } else if how.as_deref() == Some("many") {
        packets
            .chunks(32)
            .map(|burst| classify_many_once(&map, burst, &guard))
            .sum()
    } else if how.as_deref() == Some("many-keys") {
        let schema = map.schema();
        let keys: Vec<u8> = packets.iter().flat_map(|p| schema.packet_key(p)).collect();
        keys_in_bursts(&map, &keys, schema.key_size(), &guard)
    } else if how.as_deref() == Some("key") {
        let keys: Vec<Vec<u8>> = packets.iter().map(|p| map.schema().packet_key(p)).collect();
        keys.iter()
            .filter(|k| classify_key_once(&map, k, &guard))
            .count()
    } else {
        packets
            .iter()
            .filter(|p| classify_once(&map, p, &guard))
            .count()
    };
    println!("{matched} of {} packets matched", packets.len());
}
