//! `wildcard-cilium`: the Cilium firewall's policy lookup, one
//! `WildcardMap` classification against the six exact lookups Cilium
//! makes in a hash map to cover its wildcards.
//!
//! Varies: the rules' shapes (all exact, all wildcards, mixed) and their
//! number; the traffic (packets inside random rules, their wildcards
//! filled at random: what the policy allows; and uniform packets, which
//! no exact rule matches: what such a policy denies, where the six
//! lookups all miss).
//! Holds fixed: the key (security identity u32, destination port u16,
//! protocol u8, direction u8), the pools values are drawn from, one
//! seed. Every packet must get the same rule from both.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use bpfmaps::hashtab::TypedHashMap;
use bpfmaps::wildcard::{Field, Packet, Rule, Schema, WildcardMap};
use bpfmaps::{BPF_NOEXIST, Guard};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::alloc::MemProbe;
use crate::lpm_tables::{flush_deferred, value_u32};
use crate::measure::{Neighbour, answer_loop, rate_samples_interleaved};
use crate::record::{
    BUILD_MS, MEM_BYTES_PER_KEY, NS_PER_LOOKUP, Record, TABLES, TABLES_PROBED,
    WILDCARD_DISAGREEMENTS, case, cases, cell, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct WildcardCilium;

/// `wildcard-cilium` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Rule counts [quick: 1000,100000; full: 1000,50000,100000,1000000].
    #[arg(long, value_delimiter = ',')]
    rules: Vec<usize>,
    /// Rule shapes: exact, wildcard, mixed [all three].
    #[arg(long, value_delimiter = ',')]
    shapes: Vec<String>,
    /// Packets classified per case.
    #[arg(long, default_value_t = 1 << 16)]
    packets: usize,
    /// MiB a neighbour thread reads round and round while the lookups
    /// are timed (`measure::Neighbour`: a slow window's noisy tenant,
    /// on the other core) [default: 0, none].
    #[arg(long, default_value_t = 0)]
    neighbour_mib: usize,
}

const SEED: u64 = 0x6369_6c69;
/// The map through `classify_key`, on the emulation's 8-byte keys.
const MAP: &str = "bpfmaps-wildcard";
/// The map through `classify`, on [`Packet`]s (a field to 16 bytes).
const MAP_PACKETS: &str = "bpfmaps-wildcard-packet";
const EMULATION: &str = "6-lookup-hash";
/// The map through `classify_many_keys`, bursts of [`BURST`] of the
/// emulation's 8-byte keys (before the sixty-third session,
/// `classify_many` on [`Packet`]s).
const MAP_BURSTS: &str = "bpfmaps-wildcard-bursts";
/// Keys a burst hands `classify_many_keys`: a dataplane's receive batch.
pub(super) const BURST: usize = 32;
const SHAPES: [&str; 3] = ["exact", "wildcard", "mixed"];
const PROTOS: [u8; 4] = [6, 17, 1, 132];

/// Cilium's lookups in order, most specific first: which of identity,
/// port and protocol each leaves out (`true`: wildcard, stored as 0).
const PATTERNS: [(bool, bool, bool); 6] = [
    (false, false, false),
    (true, false, false),
    (false, true, false),
    (true, true, false),
    (false, true, true),
    (true, true, true),
];

/// One policy rule: `None` fields are wildcards; the port a range of one
/// or an aligned block of up to 16 ports.
#[derive(Debug, Clone, Copy)]
struct Policy {
    pattern: usize,
    id: Option<u32>,
    ports: Option<(u16, u16)>,
    proto: Option<u8>,
    dir: u8,
}

impl Policy {
    /// Its hash keys in the emulation: one per port of its range.
    fn hash_keys(&self) -> impl Iterator<Item = [u8; 8]> + '_ {
        let (lo, hi) = self.ports.unwrap_or((0, 0));
        (lo..=hi).map(move |port| {
            key(
                self.id.unwrap_or(0),
                port,
                self.proto.unwrap_or(0),
                self.dir,
            )
        })
    }

    /// Its rule: priority is the pattern's place in Cilium's order.
    fn rule(&self, schema: &Schema) -> Rule {
        let mut b = schema.rule(self.pattern as u32);
        b = b.exact("id", u128::from(self.id.unwrap_or(0)));
        b = match self.ports {
            Some((lo, hi)) => b.range("dport", u128::from(lo), u128::from(hi)),
            None => b.any("dport"),
        };
        b.exact("proto", u128::from(self.proto.unwrap_or(0)))
            .exact("dir", u128::from(self.dir))
            .build()
            .expect("a policy rule")
    }
}

/// The emulation's key: identity, port (network order), protocol,
/// direction.
fn key(id: u32, port: u16, proto: u8, dir: u8) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&id.to_be_bytes());
    k[4..6].copy_from_slice(&port.to_be_bytes());
    k[6] = proto;
    k[7] = dir;
    k
}

/// The schema: identity and protocol match exactly or anything (0),
/// the port is a range, the direction exact.
fn schema() -> Schema {
    Schema::new(vec![
        Field::wildcard("id", 4),
        Field::range("dport", 2),
        Field::wildcard("proto", 1),
        Field::exact("dir", 1),
    ])
    .expect("the Cilium schema")
}

/// Up to `n` rules of `shape` whose hash keys are all distinct (so no two
/// rules of one pattern overlap and each packet has one answer), and the
/// identity pool.
fn policies(shape: &str, n: usize, rng: &mut StdRng) -> (Vec<Policy>, Vec<u32>) {
    let ids: Vec<u32> = (0..(n / 8).max(16))
        .map(|_| rng.random_range(1..1 << 24))
        .collect();
    let mut taken = HashSet::new();
    let mut out = Vec::with_capacity(n);
    for _ in 0..4 * n {
        if out.len() == n {
            break;
        }
        let pattern = match shape {
            "exact" => 0,
            "wildcard" => rng.random_range(1..6),
            _ => {
                if rng.random_bool(0.5) {
                    0
                } else {
                    rng.random_range(1..6)
                }
            }
        };
        let (any_id, any_port, any_proto) = PATTERNS[pattern];
        let ports = (!any_port).then(|| {
            if shape != "exact" && rng.random_bool(0.3) {
                let width = 1u16 << rng.random_range(1..=4);
                let lo = rng.random_range(1..65535 / width) * width;
                (lo, lo + width - 1)
            } else {
                let p = rng.random_range(1..=65535);
                (p, p)
            }
        });
        let p = Policy {
            pattern,
            id: (!any_id).then(|| ids[rng.random_range(0..ids.len())]),
            ports,
            proto: (!any_proto).then(|| PROTOS[rng.random_range(0..PROTOS.len())]),
            dir: rng.random_range(0..2),
        };
        let keys: Vec<[u8; 8]> = p.hash_keys().collect();
        if keys.iter().all(|k| !taken.contains(k)) {
            taken.extend(keys);
            out.push(p);
        }
    }
    (out, ids)
}

/// A packet inside `p`, its wildcards filled from the pools: as the
/// map's packet and as the emulation's key.
fn packet(p: &Policy, ids: &[u32], rng: &mut StdRng) -> (Packet, [u8; 8]) {
    let id = p.id.unwrap_or_else(|| ids[rng.random_range(0..ids.len())]);
    let port = match p.ports {
        Some((lo, hi)) => rng.random_range(lo..=hi),
        None => rng.random_range(1..=65535),
    };
    let proto = p
        .proto
        .unwrap_or_else(|| PROTOS[rng.random_range(0..PROTOS.len())]);
    packet_of(id, port, proto, p.dir)
}

/// `n` packets, each inside a random one of `rules` ([`packet`]).
fn inside_packets(
    rules: &[Policy],
    ids: &[u32],
    n: usize,
    rng: &mut StdRng,
) -> (Vec<Packet>, Vec<[u8; 8]>) {
    (0..n)
        .map(|_| packet(&rules[rng.random_range(0..rules.len())], ids, rng))
        .unzip()
}

/// A packet of uniform traffic: an identity from the pool, any port,
/// protocol and direction. No exact rule matches one (what a policy of
/// exact rules denies); the rules that leave out identity, port and
/// protocol match them all.
fn uniform_packet(ids: &[u32], rng: &mut StdRng) -> (Packet, [u8; 8]) {
    let id = ids[rng.random_range(0..ids.len())];
    let port = rng.random_range(1..=65535);
    let proto = PROTOS[rng.random_range(0..PROTOS.len())];
    packet_of(id, port, proto, rng.random_range(0..2))
}

/// The header's fields as the map's packet and as the emulation's key.
fn packet_of(id: u32, port: u16, proto: u8, dir: u8) -> (Packet, [u8; 8]) {
    let mut packet = Packet::default();
    packet.values[..4].copy_from_slice(&[
        u128::from(id),
        u128::from(port),
        u128::from(proto),
        u128::from(dir),
    ]);
    (packet, key(id, port, proto, dir))
}

/// Classifies `keys` (keys of `size` bytes back to back) in turn,
/// [`BURST`] at a time through `classify_many_keys`, as [`answer_loop`]
/// does one at a time.
pub(super) fn burst_loop<'a>(
    map: &'a WildcardMap,
    keys: &'a [u8],
    size: usize,
) -> Box<dyn FnMut() -> u64 + 'a> {
    let n = keys.len() / size;
    let mut at = 0;
    Box::new(move || {
        let guard = bpfmaps::pin();
        let mut out = [None; BURST];
        let (mut acc, mut done) = (0u32, 0);
        for _ in 0..crate::suite::BATCH / BURST {
            if at + BURST > n {
                at = 0;
            }
            let end = (at + BURST).min(n);
            let burst = &keys[at * size..end * size];
            map.classify_many_keys(burst, &guard, &mut out)
                .expect("whole keys and room for each answer");
            for &o in &out[..end - at] {
                acc ^= answer_of(o);
            }
            done += end - at;
            at = end;
        }
        std::hint::black_box(acc);
        done as u64
    })
}

/// The rule index a map's answer holds (its 4-byte value), `u32::MAX`
/// for none, as the six lookups answer.
fn answer_of(answer: Option<(&Rule, &[u8])>) -> u32 {
    answer.map_or(u32::MAX, |(_, v)| value_u32(v))
}

/// Cilium's lookup: the six keys in order, the first hit wins.
#[inline]
fn six_lookups(h: &TypedHashMap<[u8; 8], u32>, k: &[u8; 8], guard: &Guard) -> Option<u32> {
    for (any_id, any_port, any_proto) in PATTERNS {
        let mut probe = *k;
        if any_id {
            probe[..4].fill(0);
        }
        if any_port {
            probe[4..6].fill(0);
        }
        if any_proto {
            probe[6] = 0;
        }
        if let Some(v) = h.get(&probe, guard) {
            return Some(*v);
        }
    }
    None
}

/// `key count, ...` for each key of `m` in order.
fn counts<K: Ord>(m: &BTreeMap<K, usize>, key: impl Fn(&K) -> String) -> String {
    m.iter()
        .map(|(k, v)| format!("{} {v}", key(k)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The map holding `rules` (each rule's value its index).
fn build_map(schema: &Schema, rules: &[Policy]) -> WildcardMap {
    let map = WildcardMap::new(schema.clone(), 4, rules.len() as u32).expect("a map");
    map.load(
        rules
            .iter()
            .enumerate()
            .map(|(i, p)| (p.rule(schema), (i as u32).to_ne_bytes())),
        BPF_NOEXIST,
    )
    .expect("distinct rules, room for each");
    map
}

/// The six lookups' hash map holding `rules` (a port range expanded).
fn build_emulation(rules: &[Policy]) -> TypedHashMap<[u8; 8], u32> {
    let keys: usize = rules.iter().map(|p| p.hash_keys().count()).sum();
    let hash = TypedHashMap::new(keys.max(1) as u32).expect("a hash map");
    for (i, p) in rules.iter().enumerate() {
        for k in p.hash_keys() {
            hash.update(&k, &(i as u32), BPF_NOEXIST)
                .expect("distinct keys, room for each");
        }
    }
    hash
}

/// One case's map, the six lookups' hash map and the keys of its
/// packets inside the rules, as the suite makes them (`shape`, `n`
/// rules, `n_packets` packets, the suite's seed): for counting a
/// classification's instructions (`examples/wildcard_probe_once.rs`).
pub fn workload(
    shape: &str,
    n: usize,
    n_packets: usize,
) -> (WildcardMap, TypedHashMap<[u8; 8], u32>, Vec<[u8; 8]>) {
    let mut rng = StdRng::seed_from_u64(SEED ^ n as u64);
    let (rules, ids) = policies(shape, n, &mut rng);
    let (map, hash) = (build_map(&schema(), &rules), build_emulation(&rules));
    let (_, keys) = inside_packets(&rules, &ids, n_packets, &mut rng);
    (map, hash, keys)
}

/// Cilium's lookup in the emulation's hash map: its six keys in turn,
/// the first hit wins (the suite's own loop, out of line for an
/// instruction count's toggle); whether one hit.
#[inline(never)]
pub fn six_lookups_once(h: &TypedHashMap<[u8; 8], u32>, k: &[u8; 8], guard: &Guard) -> bool {
    six_lookups(h, k, guard).is_some()
}

fn one_case(
    ctx: &Ctx,
    shape: &str,
    n: usize,
    n_packets: usize,
    neighbour_mib: usize,
) -> Vec<Record> {
    let suite = WildcardCilium::NAME;
    let schema = schema();
    let mut rng = StdRng::seed_from_u64(SEED ^ n as u64);
    let (rules, ids) = policies(shape, n, &mut rng);
    let hash_keys: usize = rules.iter().map(|p| p.hash_keys().count()).sum();
    let c = case(&[("shape", &shape), ("rules", &rules.len())]);
    // A rule's pattern is its priority (Cilium's order).
    let mut rules_by_priority = BTreeMap::<usize, usize>::new();
    for r in &rules {
        *rules_by_priority.entry(r.pattern).or_default() += 1;
    }

    flush_deferred();
    let probe = MemProbe::start();
    let started = Instant::now();
    let map = build_map(&schema, &rules);
    let map_build = started.elapsed();
    flush_deferred();
    let map_bytes = probe.held();

    let probe = MemProbe::start();
    let started = Instant::now();
    let hash = build_emulation(&rules);
    let hash_build = started.elapsed();
    flush_deferred();
    let hash_bytes = probe.held();

    let inside = inside_packets(&rules, &ids, n_packets, &mut rng);
    let uniform: (Vec<Packet>, Vec<[u8; 8]>) = (0..n_packets)
        .map(|_| uniform_packet(&ids, &mut rng))
        .unzip();
    let by_map = |k: &[u8; 8], g: &Guard| {
        answer_of(map.classify_key(k, g).expect("a key of the schema's size"))
    };
    let by_packet = |p: &Packet, g: &Guard| answer_of(map.classify(p, g));
    let by_hash = |k: &[u8; 8], g: &Guard| six_lookups(&hash, k, g).unwrap_or(u32::MAX);
    let mut recs = Vec::new();
    // Packets inside the rules (what the policy allows), then uniform
    // traffic (mostly what it denies: the six lookups all miss).
    for (traffic, (packets, keys)) in [("inside", inside), ("uniform", uniform)] {
        let c = if traffic == "inside" {
            c.clone()
        } else {
            case(&[
                ("shape", &shape),
                ("rules", &rules.len()),
                ("packets", &traffic),
            ])
        };
        let (mut wrong, mut probed, mut matched) = (0, 0, 0);
        // Packets by the priority of their answer (`None`: no rule), and
        // by the tables probed for them; the six lookups' probes.
        let mut by_priority = BTreeMap::<Option<u32>, usize>::new();
        let mut by_probed = BTreeMap::<usize, usize>::new();
        let mut six_probes = 0;
        let guard = bpfmaps::pin();
        for (p, k) in packets.iter().zip(&keys) {
            let answer = by_map(k, &guard);
            wrong += usize::from(answer != by_hash(k, &guard));
            wrong += usize::from(by_packet(p, &guard) != answer);
            matched += usize::from(answer != u32::MAX);
            let (hit, n) = map.classify_counting(p, &guard);
            probed += n;
            *by_priority.entry(hit.map(|(r, _)| r.priority)).or_default() += 1;
            *by_probed.entry(n).or_default() += 1;
            // Cilium's order: a rule's pattern is its priority, and the
            // lookups up to it are made.
            six_probes += rules
                .get(answer as usize)
                .map_or(PATTERNS.len(), |r| r.pattern + 1);
        }
        if traffic == "inside" {
            ctx.note(&format!(
                "wildcard-cilium {shape} {}: rules by priority: {}; packets by their answer's \
                 priority: {}; by the tables probed: {}; the six lookups' probes a packet {:.2}",
                rules.len(),
                counts(&rules_by_priority, usize::to_string),
                counts(&by_priority, |p| p.map_or("none".into(), |p| p.to_string())),
                counts(&by_probed, usize::to_string),
                six_probes as f64 / packets.len() as f64
            ));
        }
        // The bursts' answers, checked too: of packets, and of keys.
        let flat: Vec<u8> = keys.concat();
        let mut out = vec![None; packets.len()];
        let mut by_keys = vec![None; packets.len()];
        map.classify_many(&packets, &guard, &mut out)
            .expect("room for each answer");
        map.classify_many_keys(&flat, &guard, &mut by_keys)
            .expect("whole keys and room for each answer");
        for ((&o, &b), k) in out.iter().zip(&by_keys).zip(&keys) {
            let right = by_hash(k, &guard);
            wrong += usize::from(answer_of(o) != right || answer_of(b) != right);
        }
        drop((out, by_keys));
        drop(guard);
        let mut loops = vec![
            answer_loop(&keys, by_map),
            answer_loop(&keys, by_hash),
            burst_loop(&map, &flat, 8),
            answer_loop(&packets, by_packet),
        ];
        let neighbour = Neighbour::reading(neighbour_mib);
        let rates = rate_samples_interleaved(ctx.plan(), &mut loops);
        drop((neighbour, loops));
        let names = [MAP, EMULATION, MAP_BURSTS, MAP_PACKETS];
        for (name, samples) in names.into_iter().zip(&rates) {
            recs.push(Record::stats(
                suite,
                &c,
                name,
                &NS_PER_LOOKUP,
                Stats::inverse_of(samples, 1e9),
            ));
        }
        recs.extend([
            Record::single(
                suite,
                &c,
                MAP,
                &TABLES_PROBED,
                probed as f64 / packets.len() as f64,
            ),
            Record::single(suite, &c, MAP, &WILDCARD_DISAGREEMENTS, wrong as f64),
        ]);
        if traffic == "uniform" {
            ctx.note(&format!(
                "wildcard-cilium {shape} {}: {:.1}% of the uniform packets matched a rule",
                rules.len(),
                100.0 * matched as f64 / packets.len() as f64
            ));
        }
    }

    let per_rule = |b: usize| b as f64 / rules.len() as f64;
    recs.extend([
        Record::single(suite, &c, MAP, &BUILD_MS, map_build.as_secs_f64() * 1e3),
        Record::single(
            suite,
            &c,
            EMULATION,
            &BUILD_MS,
            hash_build.as_secs_f64() * 1e3,
        ),
        Record::single(suite, &c, MAP, &MEM_BYTES_PER_KEY, per_rule(map_bytes)),
        Record::single(
            suite,
            &c,
            EMULATION,
            &MEM_BYTES_PER_KEY,
            per_rule(hash_bytes),
        ),
        Record::single(suite, &c, MAP, &TABLES, map.tables() as f64),
    ]);
    if rules.len() < n {
        ctx.note(&format!(
            "wildcard-cilium {shape}: {} distinct rules of the {n} asked for (the shape's key \
             space ran out)",
            rules.len()
        ));
    }
    ctx.note(&format!(
        "wildcard-cilium {shape} {}: the emulation holds {hash_keys} hash keys (port ranges \
         expanded)",
        rules.len()
    ));
    recs
}

impl Suite for WildcardCilium {
    type Opts = Opts;
    const NAME: &'static str = "wildcard-cilium";
    const ABOUT: &'static str =
        "Cilium's policy lookup: one WildcardMap classification vs 6 hash lookups";
    const DESCRIBE: &'static str = "Policy rules of (security identity, destination port or port \
         range, protocol, direction), the Cilium firewall's key, in three shapes: all exact; all \
         wildcards (identity, port or protocol left out, in the five combinations Cilium looks \
         up); mixed (half exact). The `WildcardMap` holds each rule once (identity and protocol \
         wildcard matches, the port a range, priority the rule's place in Cilium's order); the \
         emulation holds it in the foundation's hash map (`TypedHashMap<[u8; 8], u32>`) with 0 \
         for a wildcard and a port range expanded to one key per port (aligned blocks of 2 to 16 \
         ports, 30% of the rules that name a port outside the exact shape), and looks a packet \
         up as Cilium does: (id, port, proto), (*, port, proto), (id, *, proto), (*, *, proto), \
         (id, *, *), (*, *, *), the first hit wins. Rules are drawn from pools (identities: one \
         per 8 rules, at least 16; ports 1-65535; protocols TCP, UDP, ICMP, SCTP) so that no two \
         rules' keys collide; packets lie inside a random rule with its wildcards filled from \
         the pools (traffic the policy allows), and, in the cases marked \
         `packets=uniform`, are uniform (an identity from the pool, any port, protocol and \
         direction: no exact rule matches one, so with exact rules it is traffic the policy \
         denies and the six lookups all miss; the rules that leave out identity, port and \
         protocol match every one). Both are timed in interleaved turns on the same 8-byte \
         keys (the map through `classify_key`), a batch under one guard, and the map also \
         through `classify_many` in bursts of 32 packets (a dataplane's receive batch: the map \
         asks for a burst's buckets at once) and through `classify` on typed `Packet`s; every \
         packet must get the same rule from each.";
    const BASELINE: &'static str = EMULATION;

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let counts = ctx.list_or(
            opts.rules,
            &[1000, 100_000],
            &[1000, 50_000, 100_000, 1_000_000],
        );
        let shapes: Vec<String> = SHAPES.iter().map(|s| s.to_string()).collect();
        let shapes = ctx.list_or(opts.shapes, &shapes, &shapes);
        ctx.set_steps((counts.len() * shapes.len()) as u64);
        if opts.neighbour_mib > 0 {
            ctx.note(&format!(
                "wildcard-cilium: a neighbour thread read {} MiB round and round while the \
                 lookups were timed",
                opts.neighbour_mib
            ));
        }
        let mut all = Vec::new();
        for shape in &shapes {
            for &n in &counts {
                let recs = one_case(
                    ctx,
                    shape,
                    n.max(1),
                    opts.packets.max(1),
                    opts.neighbour_mib,
                );
                ctx.step();
                ctx.print(&recs);
                all.extend(recs);
            }
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "wildcard-cilium: one WildcardMap lookup vs Cilium's 6 hash lookups",
            &[
                "shape",
                "rules",
                "wildcard ns",
                "6-lookup ns",
                "speed vs 6 lookups",
                "bursts ns",
                "bursts vs 6 lookups",
                "packet ns",
                "wildcard B/rule",
                "hash B/rule",
                "build ms",
                "hash build ms",
                "tables",
                "probed",
                "wrong",
            ],
        )
        .with_note(
            "Medians of ns per packet; `wildcard ns`: the map's `classify_key` on the six \
             lookups' own 8-byte keys; `speed vs 6 lookups` above 1 means the wildcard map is \
             faster (the issue's targets: at least 3x with wildcard rules, at least 1x with \
             exact ones, on packets inside the rules); rows with `packets=uniform` time \
             uniform traffic on the same maps; `bursts`: the map through `classify_many_keys`, 32 \
             of the same keys a call (the six lookups still one packet at a time); `packet ns`: \
             `classify` one packet at a time on typed `Packet`s (16 bytes a field); bytes per rule held \
             after the build (the hash map's rules expand to one key per port of a range); \
             `wrong`: the map's answers, one at a time and in bursts, that differ from the six \
             lookups'.",
        );
        for c in cases(records) {
            let get = |i: &str, m: &str| find(records, c, i, m);
            let val = |i: &str, m: &str, prec: usize| cell(records, c, i, m, prec);
            let shape = crate::record::case_value(c, "shape");
            t.push(vec![
                match crate::record::case_param(c, "packets") {
                    Some(traffic) => format!("{shape} ({traffic})"),
                    None => shape.to_string(),
                },
                crate::record::case_value(c, "rules").to_string(),
                val(MAP, NS_PER_LOOKUP.name, 1),
                val(EMULATION, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(EMULATION, NS_PER_LOOKUP.name),
                    get(MAP, NS_PER_LOOKUP.name),
                )),
                val(MAP_BURSTS, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(EMULATION, NS_PER_LOOKUP.name),
                    get(MAP_BURSTS, NS_PER_LOOKUP.name),
                )),
                val(MAP_PACKETS, NS_PER_LOOKUP.name, 1),
                val(MAP, MEM_BYTES_PER_KEY.name, 0),
                val(EMULATION, MEM_BYTES_PER_KEY.name, 0),
                val(MAP, BUILD_MS.name, 0),
                val(EMULATION, BUILD_MS.name, 0),
                val(MAP, TABLES.name, 0),
                val(MAP, TABLES_PROBED.name, 1),
                val(MAP, WILDCARD_DISAGREEMENTS.name, 0),
            ]);
        }
        vec![t]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two lookups agree on every shape, and rules never share a key.
    #[test]
    fn the_map_and_the_six_lookups_agree() {
        let schema = schema();
        for shape in SHAPES {
            let mut rng = StdRng::seed_from_u64(1);
            let (rules, ids) = policies(shape, 400, &mut rng);
            assert!(rules.len() > 300, "{shape}: {}", rules.len());
            let map = WildcardMap::new(schema.clone(), 4, 400).unwrap();
            let hash: TypedHashMap<[u8; 8], u32> = TypedHashMap::new(400 * 16).unwrap();
            for (i, p) in rules.iter().enumerate() {
                map.insert(&p.rule(&schema), &(i as u32).to_ne_bytes(), BPF_NOEXIST)
                    .unwrap();
                for k in p.hash_keys() {
                    hash.update(&k, &(i as u32), BPF_NOEXIST).unwrap();
                }
            }
            let guard = bpfmaps::pin();
            let by_packet = |p: &Packet| map.classify(p, &guard).map(|(_, v)| value_u32(v));
            // The packet and its key (the six lookups' too) give one answer.
            let classify = |p: &Packet| {
                let k = &schema.packet_key(p);
                let by_key = map.classify_key(k, &guard).unwrap();
                let got = by_packet(p);
                assert_eq!(by_key.map(|(_, v)| value_u32(v)), got);
                got
            };
            for _ in 0..2000 {
                let (p, k) = packet(&rules[rng.random_range(0..rules.len())], &ids, &mut rng);
                assert_eq!(schema.packet_key(&p), k, "the schema's key is Cilium's");
                let got = classify(&p);
                assert_eq!(got, six_lookups(&hash, &k, &guard), "{shape}");
                assert!(got.is_some());
            }
            // Uniform traffic: mostly no rule; the same answers.
            let mut missed = 0;
            for _ in 0..2000 {
                let (p, k) = uniform_packet(&ids, &mut rng);
                let got = classify(&p);
                assert_eq!(got, six_lookups(&hash, &k, &guard), "{shape}, uniform");
                missed += usize::from(got.is_none());
            }
            // (With wildcards, the rules that leave out identity, port and
            // protocol match every packet of their direction.)
            if shape == "exact" {
                assert!(
                    missed > 1900,
                    "{shape}: {missed} of 2000 uniform packets missed"
                );
            }
        }
    }
}
