//! `wildcard-geoip`: the wildcard map as a geoIP table, every prefix of
//! the real IPv4 and IPv6 tables a one-field prefix rule, beside the LPM
//! tries built for the job.
//!
//! Varies: the address family. Holds fixed: the prefixes (each table
//! whole, prefix `i` with value `i + 1`), the addresses (drawn inside
//! random stored prefixes, one seed), priorities (`bits - length`: the
//! longest prefix wins, as in an LPM lookup). Reads
//! `lpm/prefixes_ipv4.txt.gz` and `lpm/prefixes_ipv6.txt.gz`; without
//! them, generated prefixes. Every table must answer every sampled
//! address as the kernel-style trie does.

use std::hint::black_box;
use std::marker::PhantomData;

use bpfmaps::lpm::{KernelLpmTrie, LpmTrie};
use bpfmaps::wildcard::BPF_WILDCARD_KEY_ELEM;
use bpfmaps::wildcard::{DEFAULT_COLLISION_LIMIT, Field, Packet, Schema, WildcardMap};
use bpfmaps::{BPF_ANY, Guard, Map};
use clap::Args;

use crate::lpm_tables::{Answers, AnyLpm, Built, LpmTable, build, check_agreement, value_u32};
use crate::measure::rate_samples_interleaved;
use crate::prefixes::{Family, IPV4_TABLE, IPV6_TABLE, Prefix, V4, V6, addrs_inside, generate};
use crate::record::{
    BUILD_MS, LPM_DISAGREEMENTS, MEM_BYTES_PER_PREFIX, NS_PER_LOOKUP, Record, TABLES,
    TABLES_PROBED, case, cases, cell, find, ratio,
};
use crate::stats::Stats;
use crate::suite::{BATCH, Ctx, Suite};
use crate::suites::lpm_data::{SEED, generated_ipv4, load};
use crate::suites::wildcard_cilium::BURST;
use crate::table::{Table, fmt_ratio};

/// The suite.
pub struct WildcardGeoip;

/// `wildcard-geoip` options.
#[derive(Debug, Args)]
pub struct Opts {
    /// Addresses looked up per table [quick: 65536; full: 262144].
    #[arg(long)]
    addrs: Option<usize>,
    /// Address families to run.
    #[arg(long, value_delimiter = ',', default_values_t = ["ipv4".to_string(), "ipv6".to_string()])]
    families: Vec<String>,
}

const MAP: &str = "bpfmaps-wildcard";
const TUPLE_MERGE: &str = "bpfmaps-wildcard-tuplemerge";
const WITH_RULE: &str = "bpfmaps-wildcard-classify";
const WITH_KEY: &str = "bpfmaps-wildcard-key";
const CONTRACT: &str = "bpfmaps-wildcard-contract";
const BURSTS: &str = "bpfmaps-wildcard-bursts";

/// How a [`WildcardLpm`] looks an address up: `classify_as` (the value
/// alone), `classify` (the rule and its value), or `classify_key_as` on
/// the address's bytes (the value alone; the byte contract's lookups, and
/// so the C library's and the Python package's, take that way), or the
/// byte contract's `lookup` of a concrete key (as a C caller fills one),
/// or `classify_many_keys` of bursts of [`BURST`] keys (the rule and its
/// value).
const BY_VALUE: u8 = 0;
const BY_RULE: u8 = 1;
const BY_KEY: u8 = 2;
const BY_CONTRACT: u8 = 3;
const BY_BURSTS: u8 = 4;

/// A `WildcardMap` of one prefix field as an LPM table: prefix `p` is the
/// rule `addr p` at priority `bits - len`, looked up as `HOW` says. The
/// map `WildcardMap::new` makes (its prefix engine), or with `TUPLES` the
/// TupleMerge one (`with_collision_limit`), which it used before.
pub struct WildcardLpm<F: Family, const TUPLES: bool = false, const HOW: u8 = BY_VALUE> {
    /// Shared, so that one map can be timed both ways.
    map: std::sync::Arc<WildcardMap>,
    _family: PhantomData<F>,
}

impl<F: Family, const TUPLES: bool, const HOW: u8> WildcardLpm<F, TUPLES, HOW> {
    fn rule(&self, p: &Prefix<F>) -> bpfmaps::wildcard::Rule {
        self.map
            .schema()
            .rule(u32::from(F::BITS - p.len))
            .prefix("addr", be(p.addr.as_ref()), u32::from(p.len))
            .build()
            .expect("a prefix of the family")
    }

    #[inline]
    fn get_pinned(&self, a: &F::Addr, guard: &Guard) -> Option<u32> {
        if HOW == BY_BURSTS {
            let mut found = None;
            self.bursts(std::slice::from_ref(a), guard, |v| found = Some(v));
            return found;
        }
        if HOW == BY_CONTRACT {
            // The concrete key: its type, 4 bytes ignored, the address;
            // a rule key's size (the prefix length's 4 bytes after it).
            let addr = a.as_ref();
            let mut key = [0u8; 8 + 16 + 4];
            key[..4].copy_from_slice(&BPF_WILDCARD_KEY_ELEM.to_ne_bytes());
            key[8..8 + addr.len()].copy_from_slice(addr);
            let mut value = [0u8; 4];
            let found = Map::lookup(&*self.map, &key[..8 + addr.len() + 4], &mut value);
            return found.ok().map(|()| u32::from_ne_bytes(value));
        }
        if HOW == BY_KEY {
            let found = self.map.classify_key_as(a.as_ref(), guard);
            return found.expect("a key of the schema");
        }
        let mut packet = Packet::default();
        packet.values[0] = be(a.as_ref());
        if HOW == BY_RULE {
            self.map.classify(&packet, guard).map(|(_, v)| value_u32(v))
        } else {
            self.map.classify_as(&packet, guard)
        }
    }
}

impl<F: Family, const TUPLES: bool, const HOW: u8> WildcardLpm<F, TUPLES, HOW> {
    /// The same map, looked up as `H` says.
    fn looked_up<const H: u8>(&self) -> WildcardLpm<F, TUPLES, H> {
        WildcardLpm {
            map: self.map.clone(),
            _family: PhantomData,
        }
    }

    /// `found` of each value `classify_many_keys` gives `addrs`, in
    /// bursts of [`BURST`] keys.
    #[inline]
    fn bursts(&self, addrs: &[F::Addr], guard: &Guard, mut found: impl FnMut(u32)) {
        let size = F::BITS as usize / 8;
        let mut keys = [0u8; BURST * 16];
        let mut out = [None; BURST];
        for group in addrs.chunks(BURST) {
            for (key, a) in keys.chunks_exact_mut(size).zip(group) {
                key.copy_from_slice(a.as_ref());
            }
            self.map
                .classify_many_keys(&keys[..group.len() * size], guard, &mut out)
                .expect("whole keys and room for each answer");
            for (_, v) in out[..group.len()].iter().flatten() {
                found(value_u32(v));
            }
        }
    }
}

/// An address's bytes as the big-endian number they are, read as one
/// word, as a caller converts an `Ipv4Addr` or `Ipv6Addr` (a fold a
/// byte at a time took 16 steps an IPv6 address: 67 ns a lookup where the
/// key's two word loads took 51, GK1-GK6).
fn be(bytes: &[u8]) -> u128 {
    match *bytes {
        [a, b, c, d] => u128::from(u32::from_be_bytes([a, b, c, d])),
        _ => match <[u8; 16]>::try_from(bytes) {
            Ok(word) => u128::from_be_bytes(word),
            Err(_) => bytes.iter().fold(0, |v, &b| v << 8 | u128::from(b)),
        },
    }
}

impl<F: Family, const TUPLES: bool, const HOW: u8> LpmTable<F> for WildcardLpm<F, TUPLES, HOW> {
    const NAME: &'static str = match (TUPLES, HOW) {
        (true, _) => TUPLE_MERGE,
        (false, BY_RULE) => WITH_RULE,
        (false, BY_KEY) => WITH_KEY,
        (false, BY_CONTRACT) => CONTRACT,
        (false, BY_BURSTS) => BURSTS,
        (false, _) => MAP,
    };
    fn empty() -> Self {
        let schema = Schema::new(vec![Field::prefix("addr", F::BITS as usize / 8)])
            .expect("a one-field schema");
        let max = crate::lpm_tables::MAX_ENTRIES;
        let map = if TUPLES {
            WildcardMap::with_collision_limit(schema, 4, max, DEFAULT_COLLISION_LIMIT)
        } else {
            WildcardMap::new(schema, 4, max)
        };
        WildcardLpm {
            map: map.expect("a map").into(),
            _family: PhantomData,
        }
    }
    /// The whole table through `WildcardMap::load`, as a rule set is
    /// loaded (the last value of a prefix given twice, as inserts in
    /// turn would leave it).
    fn load(prefixes: &[Prefix<F>]) -> Self {
        let table = Self::empty();
        let rules: Vec<_> = prefixes
            .iter()
            .enumerate()
            .map(|(i, p)| (table.rule(p), crate::lpm_tables::value_of(i).to_ne_bytes()))
            .collect();
        table.map.load(rules, BPF_ANY).expect("room for the table");
        table
    }
    fn insert(&mut self, p: &Prefix<F>, value: u32) {
        let rule = self.rule(p);
        self.map
            .insert(&rule, &value.to_ne_bytes(), BPF_ANY)
            .expect("room for the table");
    }
    fn remove(&mut self, p: &Prefix<F>) -> bool {
        let rule = self.rule(p);
        self.map.remove(&rule).is_ok()
    }
    fn get(&self, a: &F::Addr) -> Option<u32> {
        self.get_pinned(a, &bpfmaps::pin())
    }
    #[inline]
    fn sum_batch(&self, addrs: &[F::Addr]) -> u64 {
        let guard = bpfmaps::pin();
        let mut acc = 0u64;
        if HOW == BY_BURSTS {
            self.bursts(black_box(addrs), &guard, |v| acc += u64::from(v));
            return acc;
        }
        for a in addrs {
            if let Some(v) = self.get_pinned(black_box(a), &guard) {
                acc += u64::from(v);
            }
        }
        acc
    }
    fn count(&self) -> usize {
        self.map.len()
    }
    fn reported(&self) -> Option<usize> {
        Some(self.map.memory_usage())
    }
}

/// One family's table: build each, time lookups in turns, compare.
fn family<F: Family>(
    ctx: &Ctx,
    opts: &Opts,
    rel: &str,
    fallback: impl FnOnce() -> Vec<Prefix<F>>,
) -> Vec<Record> {
    let (prefixes, src) = match load::<F>(ctx, rel) {
        Some(v) => (v, "real"),
        None => {
            let v = fallback();
            ctx.note(&format!(
                "wildcard-geoip: {} generated {} prefixes instead of the real table",
                v.len(),
                F::NAME
            ));
            (v, "generated")
        }
    };
    let suite = WildcardGeoip::NAME;
    let c = case(&[("family", &F::NAME), ("n", &prefixes.len()), ("src", &src)]);
    let count = opts
        .addrs
        .unwrap_or(if ctx.quick() { 1 << 16 } else { 1 << 18 })
        .max(1)
        .div_ceil(BATCH)
        * BATCH;
    let addrs = addrs_inside(&prefixes, count, SEED + 7);
    let n = prefixes.len() as f64;

    let kernel: Built<KernelLpmTrie> = build::<F, KernelLpmTrie>(&prefixes);
    ctx.step();
    let lpm: Built<LpmTrie> = build::<F, LpmTrie>(&prefixes);
    ctx.step();
    let wild: Built<WildcardLpm<F>> = build::<F, WildcardLpm<F>>(&prefixes);
    ctx.step();
    let tuples: Built<WildcardLpm<F, true>> = build::<F, WildcardLpm<F, true>>(&prefixes);
    ctx.step();
    // The same map as `wild`, looked up with `classify`, with
    // `classify_key_as`, through the byte contract and in bursts.
    let with_rule = wild.table.looked_up::<BY_RULE>();
    let with_key = wild.table.looked_up::<BY_KEY>();
    let contract = wild.table.looked_up::<BY_CONTRACT>();
    let bursts = wild.table.looked_up::<BY_BURSTS>();

    let reference = Answers::of::<F, _>(&kernel.table, &addrs);
    let mut recs = Vec::new();
    let builds: [(&'static str, std::time::Duration, usize); 4] = [
        (
            <KernelLpmTrie as LpmTable<F>>::NAME,
            kernel.time,
            kernel.held,
        ),
        (<LpmTrie as LpmTable<F>>::NAME, lpm.time, lpm.held),
        (MAP, wild.time, wild.held),
        (TUPLE_MERGE, tuples.time, tuples.held),
    ];
    for (name, time, held) in builds {
        recs.push(Record::single(
            suite,
            &c,
            name,
            &BUILD_MS,
            time.as_secs_f64() * 1e3,
        ));
        recs.push(Record::single(
            suite,
            &c,
            name,
            &MEM_BYTES_PER_PREFIX,
            held as f64 / n,
        ));
    }
    for (name, answers) in [
        (
            <LpmTrie as LpmTable<F>>::NAME,
            Answers::of::<F, _>(&lpm.table, &addrs),
        ),
        (MAP, Answers::of::<F, _>(&wild.table, &addrs)),
        (WITH_RULE, Answers::of::<F, _>(&with_rule, &addrs)),
        (WITH_KEY, Answers::of::<F, _>(&with_key, &addrs)),
        (CONTRACT, Answers::of::<F, _>(&contract, &addrs)),
        (BURSTS, Answers::of::<F, _>(&bursts, &addrs)),
        (TUPLE_MERGE, Answers::of::<F, _>(&tuples.table, &addrs)),
    ] {
        let wrong = check_agreement(ctx, &c, name, &answers, &reference);
        recs.push(Record::single(
            suite,
            &c,
            name,
            &LPM_DISAGREEMENTS,
            wrong as f64,
        ));
    }
    for (name, map) in [(MAP, &*wild.table.map), (TUPLE_MERGE, &*tuples.table.map)] {
        let probed: usize = {
            let guard = bpfmaps::pin();
            addrs
                .iter()
                .map(|a| {
                    let mut p = Packet::default();
                    p.values[0] = be(a.as_ref());
                    map.classify_counting(&p, &guard).1
                })
                .sum()
        };
        recs.push(Record::single(
            suite,
            &c,
            name,
            &TABLES,
            map.tables() as f64,
        ));
        recs.push(Record::single(
            suite,
            &c,
            name,
            &TABLES_PROBED,
            probed as f64 / addrs.len() as f64,
        ));
    }

    let impls: [&dyn AnyLpm<F>; 8] = [
        &kernel.table,
        &lpm.table,
        &wild.table,
        &with_rule,
        &with_key,
        &contract,
        &bursts,
        &tuples.table,
    ];
    let mut loops: Vec<_> = impls.iter().map(|t| t.lookups(&addrs)).collect();
    let rates = rate_samples_interleaved(ctx.plan(), &mut loops);
    drop(loops);
    for (t, samples) in impls.iter().zip(&rates) {
        recs.push(Record::stats(
            suite,
            &c,
            t.name(),
            &NS_PER_LOOKUP,
            Stats::inverse_of(samples, 1e9),
        ));
    }
    ctx.step();
    ctx.print(&recs);
    recs
}

impl Suite for WildcardGeoip {
    type Opts = Opts;
    const NAME: &'static str = "wildcard-geoip";
    const ABOUT: &'static str =
        "geoIP: the real prefix tables as one-field WildcardMap rules vs the LPM tries";
    const DESCRIBE: &'static str = "Each real prefix table (`lpm/prefixes_ipv4.txt.gz`, \
         `lpm/prefixes_ipv6.txt.gz`; generated prefixes without them) is loaded whole into a \
         `WildcardMap` of one prefix field (prefix `p` a rule at priority `bits - len`, so the \
         longest prefix wins), into the kernel-style LPM trie (the port of \
         `kernel/bpf/lpm_trie.c`) and into bpfmaps' `LpmTrie`, one insert per prefix. The \
         wildcard map is the one `WildcardMap::new` makes (for one prefix field, an LPM trie of \
         each prefix's best rule), looked up with `classify_as` (the value alone), with \
         `classify` (the rule too), with `classify_key_as` (the value alone, from the \
         address's bytes), through the byte contract's `lookup` of a concrete key and with \
         `classify_many_keys` of 32 keys a call, and, beside it, the TupleMerge one it used \
         before. Lookups \
         of addresses drawn inside random stored prefixes are timed in interleaved turns, a \
         batch of lookups under one guard for each; every address's answer must be the kernel \
         trie's. Also the build time, bytes held per prefix, and the tables each wildcard map \
         made and the mean number it probed per lookup.";
    const BASELINE: &'static str = "kernel";

    fn run(&self, ctx: &Ctx, opts: Opts) -> Vec<Record> {
        let run_v4 = opts.families.iter().any(|f| f == "ipv4");
        let run_v6 = opts.families.iter().any(|f| f == "ipv6");
        ctx.set_steps(5 * (u64::from(run_v4) + u64::from(run_v6)));
        let mut all = Vec::new();
        if run_v4 {
            all.extend(family::<V4>(ctx, &opts, IPV4_TABLE, || {
                generated_ipv4(900_000)
            }));
        }
        if run_v6 {
            all.extend(family::<V6>(ctx, &opts, IPV6_TABLE, || {
                generate(160_000, 16..=64, SEED)
            }));
        }
        all
    }

    fn summaries(&self, records: &[Record]) -> Vec<Table> {
        let mut t = Table::new(
            "wildcard-geoip: one-field WildcardMap vs the LPM tries",
            &[
                "table",
                "prefixes",
                "wildcard ns",
                "with the rule ns",
                "from the key ns",
                "contract ns",
                "bursts ns",
                "TupleMerge ns",
                "kernel trie ns",
                "LpmTrie ns",
                "speed vs kernel trie",
                "time vs LpmTrie",
                "TupleMerge time vs LpmTrie",
                "build ms (TupleMerge)",
                "bytes/prefix (TupleMerge)",
                "TupleMerge tables, probed",
                "wrong",
            ],
        )
        .with_note(
            "Medians of ns per lookup; `speed vs kernel trie` above 1 means the wildcard map \
             is faster; `time vs LpmTrie` is the wildcard map's time over the LpmTrie's (the \
             issue's target: at most 3). The wildcard map is `WildcardMap::new`'s (one prefix \
             field: its prefix engine) looked up with `classify_as` (the value alone); `with the \
             rule` the same map through `classify` (the rule and its value), `from the key` \
             through `classify_key_as` on the address's bytes (the value alone), `contract` \
             through the byte contract's `lookup` of a concrete key (as C and Python call it), \
             `bursts` through `classify_many_keys` of 32 keys a call (the rule and its value); TupleMerge the map \
             `with_collision_limit` makes for the same rules, in parentheses where a column \
             shows both. `wrong` counts addresses \
             answered unlike the kernel trie.",
        );
        let kernel = <KernelLpmTrie as LpmTable<V4>>::NAME;
        let trie = <LpmTrie as LpmTable<V4>>::NAME;
        for c in cases(records) {
            let get = |i: &str, m: &str| find(records, c, i, m);
            let val = |i: &str, m: &str, prec: usize| cell(records, c, i, m, prec);
            // The prefix engine's figure, TupleMerge's in parentheses.
            let beside = |m: &str, prec: usize| {
                format!("{} ({})", val(MAP, m, prec), val(TUPLE_MERGE, m, prec))
            };
            t.push(vec![
                format!(
                    "{} ({})",
                    crate::record::case_value(c, "family"),
                    crate::record::case_value(c, "src")
                ),
                crate::record::case_value(c, "n").to_string(),
                val(MAP, NS_PER_LOOKUP.name, 1),
                val(WITH_RULE, NS_PER_LOOKUP.name, 1),
                val(WITH_KEY, NS_PER_LOOKUP.name, 1),
                val(CONTRACT, NS_PER_LOOKUP.name, 1),
                val(BURSTS, NS_PER_LOOKUP.name, 1),
                val(TUPLE_MERGE, NS_PER_LOOKUP.name, 1),
                val(kernel, NS_PER_LOOKUP.name, 1),
                val(trie, NS_PER_LOOKUP.name, 1),
                fmt_ratio(ratio(
                    get(kernel, NS_PER_LOOKUP.name),
                    get(MAP, NS_PER_LOOKUP.name),
                )),
                fmt_ratio(ratio(
                    get(MAP, NS_PER_LOOKUP.name),
                    get(trie, NS_PER_LOOKUP.name),
                )),
                fmt_ratio(ratio(
                    get(TUPLE_MERGE, NS_PER_LOOKUP.name),
                    get(trie, NS_PER_LOOKUP.name),
                )),
                beside(BUILD_MS.name, 0),
                beside(MEM_BYTES_PER_PREFIX.name, 1),
                format!(
                    "{}, {}",
                    val(TUPLE_MERGE, TABLES.name, 0),
                    val(TUPLE_MERGE, TABLES_PROBED.name, 1)
                ),
                beside(LPM_DISAGREEMENTS.name, 0),
            ]);
        }
        vec![t]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefixes::addrs_random;

    /// The one-field wildcard map answers as the kernel trie on generated
    /// prefixes, for addresses inside them and anywhere.
    #[test]
    fn the_wildcard_lpm_answers_as_the_kernel_trie() {
        let prefixes = generate::<V4>(3000, 0..=32, 5);
        let kernel = build::<V4, KernelLpmTrie>(&prefixes).table;
        let wild = build::<V4, WildcardLpm<V4>>(&prefixes).table;
        let tuples = build::<V4, WildcardLpm<V4, true>>(&prefixes).table;
        assert!(tuples.map.tables() > 1, "TupleMerge, not the prefix engine");
        for addrs in [
            addrs_inside(&prefixes, 4096, 1),
            addrs_random::<V4>(4096, 2),
        ] {
            let want = Answers::of::<V4, _>(&kernel, &addrs);
            assert_eq!(Answers::of::<V4, _>(&wild, &addrs), want);
            assert_eq!(Answers::of::<V4, _>(&tuples, &addrs), want);
        }
    }
}
