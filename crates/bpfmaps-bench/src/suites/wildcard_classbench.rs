//! `wildcard-classbench`: packet classification on the ClassBench rule
//! sets, `WildcardMap` (TupleMerge) beside the brute-force classifier and,
//! where Debian's `dpdk-dev` is installed, DPDK's `rte_acl` (the native
//! peer [`dpdk_acl`], its `dpdk-test-acl` program run as a separate
//! process on the same rules and packets).
//!
//! Varies: the rule set. Holds fixed: the 5-tuple schema (two 4-byte
//! prefixes, two 2-byte port ranges, a 1-byte protocol prefix), the
//! packets (each field drawn uniformly inside a random rule's interval,
//! one seed), priorities by line order. Reads `classbench/NAME` from the
//! data directory; without it, generated rule sets of 1K and 10K rules.
//! Every packet of the brute-force sample must be classified as the
//! brute force classifies it.
//!
//! `rte_acl` takes the rules in the same order of preference: the rule
//! file lists them by priority, first line best, and `dpdk-test-acl` gives
//! each line a priority that falls with the line number (higher wins in
//! `rte_acl`). ClassBench priorities are the line numbers, so no two rules
//! tie (a tie would go by the rules' intervals, bpfmaps' tie rule, see
//! [`dpdk_acl::priority_order`]). Its figures are one timed run (the mean
//! over three passes, timed by the tool) and its build is a whole
//! `rte_acl_build`, which every rule change costs: reported beside
//! bpfmaps' update rate. Which rule it gives each packet comes from a
//! second, untimed run on the brute force's sample.

use std::io::Read;
use std::time::Instant;

use bpfmaps::wildcard::{BruteForce, Packet, Rule, Schema, WildcardMap, classbench};
use bpfmaps::{BPF_ANY, BPF_NOEXIST, Guard};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::alloc::MemProbe;
use crate::lpm_tables::{flush_deferred, value_u32};
use crate::measure::{answer_loop, rate_samples_interleaved};
use crate::native::dpdk_acl;
use crate::record::{
    BUILD_MS, MEM_BYTES_PER_KEY, NS_PER_LOOKUP, RULE_UPDATES_PER_SEC, Record, TABLES,
    TABLES_PROBED, WILDCARD_DISAGREEMENTS, case, cases, cell, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{Ctx, Suite};
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct WildcardClassbench;

/// `wildcard-classbench` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Rule files under `classbench/` [quick: acl1_1k,acl1_10k.gz; full:
    /// the 1K and 10K sets of acl1, fw1, ipc1 and CutSplit's four sets,
    /// `cutsplit/NAME.gz`, each with its own trace].
    #[arg(long, value_delimiter = ',')]
    sets: Vec<String>,
    /// Packets classified per set [quick: 20000; full: 100000].
    #[arg(long)]
    packets: Option<usize>,
    /// Packets the brute-force classifier is timed and checked on (and
    /// rte_acl checked on).
    #[arg(long, default_value_t = 2000)]
    brute_packets: usize,
    /// Leave out DPDK's rte_acl even where dpdk-test-acl is installed.
    #[arg(long)]
    no_rte_acl: bool,
}

const FULL: [&str; 10] = [
    "acl1_1k",
    "fw1_1k",
    "ipc1_1k",
    "acl1_10k.gz",
    "fw1_10k.gz",
    "ipc1_10k.gz",
    "cutsplit/acl_1k.gz",
    "cutsplit/fw_1k.gz",
    "cutsplit/ipc_1k.gz",
    "cutsplit/fw_10k.gz",
];
const QUICK: [&str; 2] = ["acl1_1k", "acl1_10k.gz"];
const SEED: u64 = 0x7475_706c;
const MAP: &str = "bpfmaps-wildcard";
/// The map through `classify_key`, on each packet's 13 header bytes as
/// `rte_acl` reads them (the fields back to back, in network order).
const MAP_KEY: &str = "bpfmaps-wildcard-key";
/// A 5-tuple's key bytes: addresses, ports, protocol.
const KEY_BYTES: usize = 13;
/// The map through `classify` one packet at a time, each `Packet` filled
/// on the stack from the packet's 13 header bytes, as a dataplane that
/// parses each header into one would: where [`MAP`] reads a trace of
/// ready `Packet`s (144 bytes each) from memory, which took acl1_10k
/// 1.27x the time (seventieth session, "Typed packets built a lookup at a
/// time" in docs/benchmarks.md).
const MAP_BUILT: &str = "bpfmaps-wildcard-built";
/// The map through `classify_many_keys`, bursts of 32 keys of 13 bytes
/// (a dataplane's receive batch; `rte_acl` classifies 256 a call;
/// before the sixty-third session, `classify_many` on [`Packet`]s).
const MAP_BURSTS: &str = "bpfmaps-wildcard-bursts";
/// The map after the update passes (the same rules, each tenth taken
/// out and put back): the tables a packet then probes.
const MAP_AFTER_UPDATES: &str = "bpfmaps-wildcard-after-updates";
const BRUTE: &str = "brute-force";
const RTE_ACL: &str = dpdk_acl::NAME;

/// A 5-tuple's `Packet` from its header bytes (addresses, ports,
/// protocol, each in network order), filled on the stack, as a dataplane
/// that knows its header would. Not `Schema::packet_from_bytes`, whose
/// loop over any schema's fields took acl1_10k's built packets from
/// about 55 to about 90 ns (docs/benchmarks.md, "Typed packets built a
/// lookup at a time").
#[inline]
fn packet_of_header(k: &[u8; KEY_BYTES]) -> Packet {
    let be32 = |at: usize| u32::from_be_bytes([k[at], k[at + 1], k[at + 2], k[at + 3]]);
    let be16 = |at: usize| u16::from_be_bytes([k[at], k[at + 1]]);
    let mut p = Packet::default();
    p.values[..5].copy_from_slice(&[
        u128::from(be32(0)),
        u128::from(be32(4)),
        u128::from(be16(8)),
        u128::from(be16(10)),
        u128::from(k[12]),
    ]);
    p
}

/// A rule set: its name, rules, and the packets of its own trace file
/// (`NAME_trace.gz` beside it) if it has one.
struct RuleSet {
    name: String,
    rules: Vec<Rule>,
    trace: Option<Vec<Packet>>,
}

/// A ClassBench file's text, gzipped or not (also the examples').
pub fn read_text(path: &std::path::Path) -> std::io::Result<String> {
    let mut text = String::new();
    let f = std::fs::File::open(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(f).read_to_string(&mut text)?;
    } else {
        std::io::BufReader::new(f).read_to_string(&mut text)?;
    }
    Ok(text)
}

/// The named sets from the data directory, or generated ones.
fn rule_sets(ctx: &Ctx, schema: &Schema, names: &[String]) -> Vec<RuleSet> {
    let mut sets = Vec::new();
    for name in names {
        let Some(path) = ctx.data_file(&format!("classbench/{name}")) else {
            ctx.note(&format!("classbench/{name}: absent"));
            continue;
        };
        let stem = name.trim_end_matches(".gz");
        let trace =
            ctx.data_file(&format!("classbench/{stem}_trace.gz"))
                .and_then(|p| {
                    match read_text(&p).map_err(|e| e.to_string()).and_then(|t| {
                        classbench::parse_trace(schema, &t).map_err(|e| e.to_string())
                    }) {
                        Ok(packets) if !packets.is_empty() => Some(packets),
                        Ok(_) => None,
                        Err(e) => {
                            ctx.note(&format!(
                                "classbench/{stem}_trace.gz: {e}; a generated trace instead"
                            ));
                            None
                        }
                    }
                });
        match read_text(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| classbench::parse_rules(schema, &text).map_err(|e| e.to_string()))
        {
            Ok(rules) => sets.push(RuleSet {
                name: stem.to_string(),
                rules,
                trace,
            }),
            Err(e) => ctx.note(&format!("classbench/{name}: {e}")),
        }
    }
    if sets.is_empty() {
        ctx.note("no ClassBench rule file read: generated rule sets instead");
        for n in [1000, 10_000] {
            sets.push(RuleSet {
                name: format!("generated_{}k", n / 1000),
                rules: generated_rules(schema, n),
                trace: None,
            });
        }
    }
    sets
}

/// `n` 5-tuple rules in the shapes ClassBench's firewall sets have:
/// addresses of /8 to /32 (or any), ports exact, a low or high range, or
/// any, TCP, UDP or any protocol.
fn generated_rules(schema: &Schema, n: usize) -> Vec<Rule> {
    let mut rng = StdRng::seed_from_u64(SEED);
    let prefix = |rng: &mut StdRng| -> (u128, u32) {
        if rng.random_bool(0.2) {
            (0, 0)
        } else {
            (u128::from(rng.random::<u32>()), rng.random_range(8..=32))
        }
    };
    (0..n)
        .map(|i| {
            let (src, sl) = prefix(&mut rng);
            let (dst, dl) = prefix(&mut rng);
            let port = |rng: &mut StdRng| -> (u128, u128) {
                match rng.random_range(0..4) {
                    0 => (0, 65535),
                    1 => (1024, 65535),
                    2 => (0, 1023),
                    _ => {
                        let p = u128::from(rng.random::<u16>());
                        (p, p)
                    }
                }
            };
            let (sp, dp) = (port(&mut rng), port(&mut rng));
            let (proto, pl) = [(6, 8), (17, 8), (0, 0)][rng.random_range(0..3)];
            schema
                .rule(i as u32)
                .prefix("src", src, sl)
                .prefix("dst", dst, dl)
                .range("sport", sp.0, sp.1)
                .range("dport", dp.0, dp.1)
                .prefix("proto", proto, pl)
                .build()
                .expect("a generated rule")
        })
        .collect()
}

/// Tables `map` probes over `packets`, in all.
fn tables_probed(map: &WildcardMap, packets: &[Packet], guard: &Guard) -> usize {
    (packets.iter())
        .map(|p| map.classify_counting(p, guard).1)
        .sum()
}

/// DPDK's `rte_acl` on `set` and `packets` (timed by `dpdk-test-acl`),
/// and checked on `sample` against the brute force: its records, and a
/// note on what ran (or why it did not).
fn rte_acl(
    ctx: &Ctx,
    acl: &dpdk_acl::RteAcl,
    set: &RuleSet,
    packets: &[Packet],
    sample: &[Packet],
    brute: &BruteForce,
    c: &str,
) -> Vec<Record> {
    let suite = WildcardClassbench::NAME;
    let t = match acl.time(&set.rules, packets) {
        Ok(t) => t,
        Err(e) => {
            ctx.note(&format!(
                "rte_acl {}: failed, left out: {}",
                set.name,
                e.lines().take(12).collect::<Vec<_>>().join(" | ")
            ));
            return Vec::new();
        }
    };
    let mut recs = vec![Record::single(
        suite,
        c,
        RTE_ACL,
        &NS_PER_LOOKUP,
        t.ns_per_packet,
    )];
    if let Some(b) = t.build {
        recs.push(Record::single(
            suite,
            c,
            RTE_ACL,
            &BUILD_MS,
            b.as_secs_f64() * 1e3,
        ));
    }
    // Its runtime tables, as `rte_acl_build` logs them (not the rules'
    // copy it keeps to rebuild from, nor its build's temporary memory).
    if let Some(b) = t.runtime_bytes {
        recs.push(Record::single(
            suite,
            c,
            RTE_ACL,
            &MEM_BYTES_PER_KEY,
            b as f64 / set.rules.len() as f64,
        ));
    }
    let checked = match acl.classify(&set.rules, sample, t.alg) {
        Ok(got) => {
            let wrong = sample
                .iter()
                .zip(&got)
                .filter(|(p, g)| {
                    g.map(|i| set.rules[i].priority) != brute.classify(p).map(|(r, _)| r.priority)
                })
                .count();
            recs.push(Record::single(
                suite,
                c,
                RTE_ACL,
                &WILDCARD_DISAGREEMENTS,
                wrong as f64,
            ));
            format!(
                "{wrong} of {} sampled packets unlike the brute force",
                sample.len()
            )
        }
        Err(e) => format!("not checked: {}", e.lines().next().unwrap_or("")),
    };
    let mb = |b: Option<u64>| b.map_or("?".to_string(), |b| format!("{:.0} MB", b as f64 / 1e6));
    ctx.note(&format!(
        "rte_acl {}: --alg={}, {} packets x {} passes, {:.1} ns/packet ({:.1} cycles at {:.3} GHz), \
         build {}, runtime tables {}, build memory {}, peak RSS {}, {:.1} s in all; {checked}",
        set.name,
        t.alg.name(),
        t.packets / u64::from(t.iterations.max(1)),
        t.iterations,
        t.ns_per_packet,
        t.cycles as f64 / t.packets as f64,
        t.tsc_hz / 1e9,
        t.build.map_or("not timed (no stdbuf)".to_string(), |b| format!(
            "{:.1} ms",
            b.as_secs_f64() * 1e3
        )),
        mb(t.runtime_bytes),
        mb(t.build_bytes),
        mb(t.peak_rss_bytes),
        t.wall.as_secs_f64(),
    ));
    recs
}

impl Suite for WildcardClassbench {
    type Opts = Opts;
    const NAME: &'static str = "wildcard-classbench";
    const ABOUT: &'static str = "ClassBench rule sets: WildcardMap (TupleMerge) vs brute force and DPDK's rte_acl, ns per packet, build, updates";
    const DESCRIBE: &'static str = "Each rule set (ClassBench `acl1`, `fw1`, `ipc1` at 1K and 10K \
         rules, and CutSplit's `acl`, `fw`, `ipc` 1K and `fw` 10K sets, from `classbench/` in the \
         data directory; without it, generated sets of 1K and 10K) is loaded into a `WildcardMap` \
         of the 5-tuple schema (line order is priority) and into the brute-force classifier. \
         Packets: the set's own trace where it has one (CutSplit's `NAME_trace.gz`, cycled to the \
         packet count), else each field drawn uniformly inside a random rule's interval (one \
         seed). Classification is timed in interleaved turns, the brute force on a \
         sample of the packets, each answer read as the matched rule's value (its line number, \
         as rte_acl answers with its rule's userdata); every sampled packet must get the brute \
         force's rule. Also: the \
         build (one `load` of the set) and the bytes the map then holds a rule (the allocator's \
         count), rule updates (every tenth rule removed and inserted again, \
         a pass per repetition: the median pass, and the spread with the first, cold one; on a \
         VM whose host stalls the first touch of memory left idle for seconds, as the writer's is \
         during the lookups, those stalls can set the figure: docs/benchmarks.md, \
         \"Updates after idle memory\"), \
         the tables TupleMerge made and the mean number it probed per packet, after the load and \
         again after the update passes (the sample's answers checked again then). Beside DPDK 22.11's \
         `rte_acl` where Debian's `dpdk-dev` is installed: its `dpdk-test-acl` program, run as a \
         separate process on the same rules (in priority order, first line best; no ties) and the \
         same packets, `--alg=avx2` (scalar where AVX2 is refused), 256 packets per \
         `rte_acl_classify` call, three passes timed by the tool (one observation, their mean); \
         the bytes of its runtime tables a rule, as its build logs them; its build (a full \
         `rte_acl_build`, what any rule change costs) and, from a second untimed \
         run, which rule it gave each packet of the brute force's sample. Without the program, a \
         note says so and its columns are empty. Not yet beside the reference TupleMerge (not \
         packaged).";
    const BASELINE: &'static str = BRUTE;

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let schema = classbench::schema();
        let full: Vec<String> = FULL.iter().map(|s| s.to_string()).collect();
        let quick: Vec<String> = QUICK.iter().map(|s| s.to_string()).collect();
        let names = ctx.list_or(opts.sets, &quick, &full);
        let n_packets = opts
            .packets
            .unwrap_or(if ctx.quick() { 20_000 } else { 100_000 });
        let sets = rule_sets(ctx, &schema, &names);
        let acl = if opts.no_rte_acl {
            ctx.note("rte_acl: skipped (--no-rte-acl)");
            None
        } else {
            match dpdk_acl::find() {
                Ok(acl) => Some(acl),
                Err(e) => {
                    ctx.note(&format!("rte_acl: skipped, {e}"));
                    None
                }
            }
        };
        ctx.set_steps(sets.len() as u64);
        let mut all = Vec::new();
        for set in &sets {
            let c = case(&[("set", &set.name), ("rules", &set.rules.len())]);
            let mut brute = BruteForce::new();
            for r in &set.rules {
                brute.insert(r.clone(), &r.priority.to_ne_bytes());
            }
            flush_deferred();
            let probe = MemProbe::start();
            // Rules that share no intervals with the set's (a clone
            // shares them): the map's count then holds its rules'
            // intervals, as it does for rules read from bytes.
            let rules: Vec<Rule> = set.rules.iter().map(Rule::unshared).collect();
            let started = Instant::now();
            let map = WildcardMap::new(schema.clone(), 4, set.rules.len() as u32)
                .expect("a map of the set's size");
            // Each line is a rule of its own priority, so all are distinct.
            map.load(
                rules.into_iter().map(|r| {
                    let value = r.priority.to_ne_bytes();
                    (r, value)
                }),
                BPF_NOEXIST,
            )
            .expect("distinct rules, room for each");
            let build = started.elapsed();
            // What the map holds once the tables it replaced are freed:
            // the allocator's count, tables, chains, entries and the
            // writer's index alike.
            flush_deferred();
            let bytes = probe.held();
            let packets = match &set.trace {
                // The set's own trace, cycled to the packet count.
                Some(trace) => trace.iter().copied().cycle().take(n_packets).collect(),
                None => classbench::generate_trace(&schema, &set.rules, n_packets, 1.0, SEED),
            };
            let sample = &packets[..opts.brute_packets.min(packets.len()).max(1)];
            // The rule's value (its priority), as rte_acl answers with its
            // rule's userdata: read from the chain's words, where the
            // rule's own priority is behind its entry, one more miss.
            let answer = |p: &Packet, guard: &Guard| {
                map.classify(p, guard)
                    .map_or(u32::MAX, |(_, v)| value_u32(v))
            };
            let by_brute =
                |p: &Packet, _: &Guard| brute.classify(p).map_or(u32::MAX, |(r, _)| r.priority);
            let keys: Vec<[u8; KEY_BYTES]> = packets
                .iter()
                .map(|p| {
                    let key = schema.packet_key(p);
                    key.try_into().expect("a 5-tuple's key")
                })
                .collect();
            let flat_keys: Vec<u8> = keys.concat();
            let by_built = |k: &[u8; KEY_BYTES], guard: &Guard| {
                map.classify(&packet_of_header(k), guard)
                    .map_or(u32::MAX, |(_, v)| value_u32(v))
            };
            let by_key = |k: &[u8; KEY_BYTES], guard: &Guard| {
                map.classify_key(k, guard)
                    .expect("a key of the schema's size")
                    .map_or(u32::MAX, |(_, v)| value_u32(v))
            };
            let (wrong, probed) = {
                let guard = bpfmaps::pin();
                let mut in_bursts = vec![None; sample.len()];
                map.classify_many(sample, &guard, &mut in_bursts)
                    .expect("room for each answer");
                let mut by_keys = vec![None; sample.len()];
                map.classify_many_keys(&keys[..sample.len()].concat(), &guard, &mut by_keys)
                    .expect("whole keys and room for each answer");
                let wrong = sample
                    .iter()
                    .zip(&keys)
                    .zip(in_bursts.iter().zip(&by_keys))
                    .filter(|&((p, k), (b, bk))| {
                        let right = by_brute(p, &guard);
                        let value =
                            |a: &Option<(&Rule, &[u8])>| a.map_or(u32::MAX, |(_, v)| value_u32(v));
                        answer(p, &guard) != right
                            || by_key(k, &guard) != right
                            || by_built(k, &guard) != right
                            || value(b) != right
                            || value(bk) != right
                    })
                    .count();
                (wrong, tables_probed(&map, &packets, &guard))
            };
            let mut loops = vec![
                answer_loop(&packets, answer),
                answer_loop(sample, by_brute),
                answer_loop(&keys, by_key),
                super::wildcard_cilium::burst_loop(&map, &flat_keys, KEY_BYTES),
                answer_loop(&keys, by_built),
            ];
            let rates = rate_samples_interleaved(ctx.plan(), &mut loops);
            drop(loops);
            // Updates: every tenth rule out and back in, a pass per
            // repetition (the first, right after the lookups, finds the
            // writer's memory cold and is the slowest).
            let moved: Vec<&Rule> = set.rules.iter().step_by(10).collect();
            let update_rates: Vec<f64> = (0..ctx.reps())
                .map(|_| {
                    let started = Instant::now();
                    let mut updates = 0u64;
                    for r in &moved {
                        if map.remove(r).is_ok() {
                            map.insert(r, &r.priority.to_ne_bytes(), BPF_ANY)
                                .expect("room for a rule just removed");
                            updates += 2;
                        }
                    }
                    updates as f64 / started.elapsed().as_secs_f64()
                })
                .collect();
            // What the updates left (the rules of the load, a tenth of
            // them put back): the tables a packet probes now, and the
            // sample's answers still the brute force's.
            let (wrong_after, probed_after) = {
                let guard = bpfmaps::pin();
                let wrong = (sample.iter())
                    .filter(|p| answer(p, &guard) != by_brute(p, &guard))
                    .count();
                (wrong, tables_probed(&map, &packets, &guard))
            };
            let mut recs = Vec::new();
            let timed = [MAP, BRUTE, MAP_KEY, MAP_BURSTS, MAP_BUILT];
            for (name, samples) in timed.into_iter().zip(&rates) {
                recs.push(Record::stats(
                    Self::NAME,
                    &c,
                    name,
                    &NS_PER_LOOKUP,
                    Stats::inverse_of(samples, 1e9),
                ));
            }
            recs.extend([
                Record::single(Self::NAME, &c, MAP, &BUILD_MS, build.as_secs_f64() * 1e3),
                Record::single(
                    Self::NAME,
                    &c,
                    MAP,
                    &MEM_BYTES_PER_KEY,
                    bytes as f64 / set.rules.len() as f64,
                ),
                Record::stats(
                    Self::NAME,
                    &c,
                    MAP,
                    &RULE_UPDATES_PER_SEC,
                    Stats::from_samples(&update_rates),
                ),
                Record::single(Self::NAME, &c, MAP, &TABLES, map.tables() as f64),
                Record::single(
                    Self::NAME,
                    &c,
                    MAP,
                    &TABLES_PROBED,
                    probed as f64 / packets.len() as f64,
                ),
                Record::single(
                    Self::NAME,
                    &c,
                    MAP_AFTER_UPDATES,
                    &TABLES_PROBED,
                    probed_after as f64 / packets.len() as f64,
                ),
                Record::single(
                    Self::NAME,
                    &c,
                    MAP,
                    &WILDCARD_DISAGREEMENTS,
                    (wrong + wrong_after) as f64,
                ),
            ]);
            if let Some(acl) = &acl {
                recs.extend(rte_acl(ctx, acl, set, &packets, sample, &brute, &c));
            }
            ctx.step();
            ctx.print(&recs);
            all.extend(recs);
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "wildcard-classbench: TupleMerge against the brute force",
            &[
                "set",
                "rules",
                "ns/packet",
                "brute ns/packet",
                "speed vs brute",
                "rte_acl ns/packet",
                "speed vs rte_acl",
                "key ns/packet",
                "key vs rte_acl",
                "built ns/packet",
                "built vs rte_acl",
                "bursts ns/packet",
                "bursts vs rte_acl",
                "B/rule",
                "rte_acl B/rule",
                "build ms",
                "updates/s",
                "rte_acl build ms",
                "tables",
                "probed",
                "probed after updates",
                "wrong",
                "rte_acl wrong",
            ],
        )
        .with_note("Medians; `probed` is the mean number of tables a packet probed, `probed after updates` the same once the update passes are done (the same rules), \
            `wrong` the sampled packets classified unlike the brute force, before the updates and after. \
            rte_acl: DPDK 22.11's `dpdk-test-acl` on the same rules and packets (256 a call, mean of 3 passes, one run; `-` where it is not installed); \
            `speed vs rte_acl` is rte_acl's ns/packet over bpfmaps', above 1 when bpfmaps is faster; \
            `ns/packet` is the map's `classify` on typed `Packet`s (16 bytes a field, 144 a packet), `key ns/packet` its `classify_key` on the packets' 13 header bytes, as rte_acl reads them, \
            `built ns/packet` its `classify` on a `Packet` filled on the stack from those bytes a lookup at a time (as a dataplane parsing each header would; `ns/packet` reads a trace of ready `Packet`s from memory), `bursts ns/packet` its `classify_many_keys` on the same keys, 32 a call; \
            `rte_acl build ms` is a full `rte_acl_build` (rules read and compiled), what each rule change costs it, beside bpfmaps' `updates/s`; \
            `B/rule`: the map's bytes held (the allocator's count after the build) a rule, `rte_acl B/rule` its runtime tables as `rte_acl_build` logs them.");
        for c in cases(records) {
            let get = |i: &str, m: &str| find(records, c, i, m);
            let val = |i: &str, m: &str, prec: usize| cell(records, c, i, m, prec);
            t.push(vec![
                crate::record::case_value(c, "set").to_string(),
                crate::record::case_value(c, "rules").to_string(),
                val(MAP, NS_PER_LOOKUP.name, 1),
                val(BRUTE, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(BRUTE, NS_PER_LOOKUP.name),
                    get(MAP, NS_PER_LOOKUP.name),
                )),
                val(RTE_ACL, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(RTE_ACL, NS_PER_LOOKUP.name),
                    get(MAP, NS_PER_LOOKUP.name),
                )),
                val(MAP_KEY, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(RTE_ACL, NS_PER_LOOKUP.name),
                    get(MAP_KEY, NS_PER_LOOKUP.name),
                )),
                val(MAP_BUILT, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(RTE_ACL, NS_PER_LOOKUP.name),
                    get(MAP_BUILT, NS_PER_LOOKUP.name),
                )),
                val(MAP_BURSTS, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(RTE_ACL, NS_PER_LOOKUP.name),
                    get(MAP_BURSTS, NS_PER_LOOKUP.name),
                )),
                val(MAP, MEM_BYTES_PER_KEY.name, 0),
                val(RTE_ACL, MEM_BYTES_PER_KEY.name, 0),
                val(MAP, BUILD_MS.name, 1),
                val(MAP, RULE_UPDATES_PER_SEC.name, 0),
                val(RTE_ACL, BUILD_MS.name, 1),
                val(MAP, TABLES.name, 0),
                val(MAP, TABLES_PROBED.name, 1),
                val(MAP_AFTER_UPDATES, TABLES_PROBED.name, 1),
                val(MAP, WILDCARD_DISAGREEMENTS.name, 0),
                val(RTE_ACL, WILDCARD_DISAGREEMENTS.name, 0),
            ]);
        }
        vec![t]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_rules_are_distinct_enough_and_classify_as_the_brute_force() {
        let schema = classbench::schema();
        let rules = generated_rules(&schema, 300);
        let map = WildcardMap::new(schema.clone(), 4, 300).unwrap();
        let mut brute = BruteForce::new();
        for r in &rules {
            map.insert(r, &r.priority.to_ne_bytes(), BPF_NOEXIST)
                .unwrap();
            brute.insert(r.clone(), &r.priority.to_ne_bytes());
        }
        let guard = bpfmaps::pin();
        for p in classbench::generate_trace(&schema, &rules, 2000, 0.9, 1) {
            assert_eq!(
                map.classify(&p, &guard).map(|(r, _)| r.priority),
                brute.classify(&p).map(|(r, _)| r.priority)
            );
        }
    }
}
