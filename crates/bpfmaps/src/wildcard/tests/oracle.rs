//! The map against the brute-force oracle: random schemas, rules and
//! operations (proptest), and every shipped ClassBench set and trace.

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(u32, Vec<u64>, u64),
    /// A [`WildcardMap::load`] of rules (priority, seeds) under flags.
    Load(Vec<(u32, Vec<u64>)>, u64),
    Remove(usize),
    /// A rule removed before, inserted again (as a policy toggles one).
    PutBack(usize),
    Classify(Vec<u64>),
}

/// Up to `most` operations.
fn arb_ops(most: usize) -> impl Strategy<Value = Vec<Op>> {
    let seeds = || prop::collection::vec(any::<u64>(), 4);
    prop::collection::vec(
        prop_oneof![
            4 => (0..8u32, seeds(), 0..3u64).prop_map(|(p, s, f)| Op::Insert(p, s, f)),
            1 => (prop::collection::vec((0..8u32, seeds()), 0..30), 0..3u64)
                .prop_map(|(rules, f)| Op::Load(rules, f)),
            1 => any::<usize>().prop_map(Op::Remove),
            1 => any::<usize>().prop_map(Op::PutBack),
            4 => seeds().prop_map(Op::Classify),
        ],
        1..most,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(96, 2) as u32))]

    /// Random schemas, rules and packets against the brute-force oracle:
    /// every insert's and removal's result, every classification, exact
    /// lookups and the rule list; a collision limit of 1 to 3, so that
    /// tables split often; homes in tables from 1 or 8 buckets, in a
    /// lone table only past 8 rules, or (as the map makes them) none
    /// this small.
    /// (Under Miri, up to 40 operations: with 120, its two cases took
    /// over 5 minutes of wall time.)
    #[test]
    fn matches_the_brute_force_oracle(
        schema in arb_schema(),
        ops in arb_ops(crate::scaled(120, 40)),
        limit in 1..4usize,
        (homes_from, lone) in prop::sample::select(vec![(1usize, usize::MAX), (8, usize::MAX), (usize::MAX, 8), (usize::MAX, usize::MAX)]),
    ) {
        let m = WildcardMap::with_collision_limit(schema.clone(), 4, 40, limit)
            .unwrap()
            .with_homes_from(homes_from)
            .with_lone_homes_over(lone);
        against_the_oracle(&m, &schema, &ops)?;
    }

    /// One load of many rules into a map with the default collision
    /// limit, so that its tables crowd (their rules are drawn around a few
    /// values) and the load ends by splitting them; then the operations.
    /// Homes as above.
    #[test]
    fn a_crowded_load_matches_the_brute_force_oracle(
        schema in arb_schema(),
        rules in prop::collection::vec((0..8u32, prop::collection::vec(any::<u64>(), 4)), 1..crate::scaled(120, 40)),
        ops in arb_ops(crate::scaled(60, 12)),
        (homes_from, lone) in prop::sample::select(vec![(1usize, usize::MAX), (16, usize::MAX), (usize::MAX, 16), (usize::MAX, usize::MAX)]),
    ) {
        let m = WildcardMap::new(schema.clone(), 4, 200)
            .unwrap()
            .with_homes_from(homes_from)
            .with_lone_homes_over(lone);
        let mut all = vec![Op::Load(rules, BPF_ANY)];
        all.extend(ops);
        against_the_oracle(&m, &schema, &all)?;
    }

    /// The engine of one-prefix-field schemas (an LPM trie of each
    /// prefix's best rule among its own and its ancestors'), the same
    /// way: nested prefixes from /0 to full length with random
    /// priorities, so a short prefix's rule often beats longer ones.
    #[test]
    fn one_prefix_field_matches_the_brute_force_oracle(
        size in prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        // Fewer under Miri, where each step's structure check (every
        // prefix looked up in both tries) is slow.
        ops in arb_ops(crate::scaled(120, 24)),
    ) {
        let schema = Schema::new(vec![Field::prefix("dst", size)]).unwrap();
        let m = WildcardMap::new(schema.clone(), 4, 40).unwrap();
        against_the_oracle(&m, &schema, &ops)?;
        prop_assert!(m.tables() <= 1, "the prefix engine, not tables");
    }
}

/// Inserts `rule` with `value` under `flags` into `m` and the oracle
/// `o`: the map's result is the one the oracle's rules call for, and a
/// new rule joins `held`.
fn insert_both(
    m: &WildcardMap,
    o: &mut BruteForce,
    held: &mut Vec<Rule>,
    rule: Rule,
    flags: u64,
    value: [u8; 4],
) -> Result<(), TestCaseError> {
    let there = o.get(&rule).is_some();
    let want = match (flags, there) {
        (BPF_NOEXIST, true) => Err(Error::Exists),
        (BPF_EXIST, false) => Err(Error::NotFound),
        (_, false) if o.len() >= m.max_entries() as usize => Err(Error::Full),
        _ => Ok(()),
    };
    prop_assert_eq!(m.insert(&rule, &value, flags), want.clone());
    if want.is_ok() {
        o.insert(rule.clone(), &value);
        if !there {
            held.push(rule);
        }
    }
    Ok(())
}

/// Runs `ops` on `m` and on the brute-force oracle: every insert's and
/// removal's result, every classification, exact lookups and the rule
/// list agree, and the map's structure checks out after every step.
fn against_the_oracle(m: &WildcardMap, schema: &Schema, ops: &[Op]) -> Result<(), TestCaseError> {
    {
        let schema = schema.clone();
        let mut o = BruteForce::new();
        let mut held: Vec<Rule> = Vec::new();
        // Rules removed.
        let mut taken: Vec<Rule> = Vec::new();
        // The last packets classified, classified again together.
        let mut recent: Vec<Packet> = Vec::new();
        let guard = pin();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Insert(prio, seeds, flags) => {
                    let rule = rule_from(&schema, *prio, seeds);
                    insert_both(m, &mut o, &mut held, rule, *flags, v(i as u32))?;
                }
                Op::Load(batch, flags) => {
                    // What inserts in turn would check, before anything
                    // changes: the model of `load`'s errors.
                    let items: Vec<(Rule, [u8; 4])> = batch
                        .iter()
                        .enumerate()
                        .map(|(j, (prio, seeds))| {
                            (rule_from(&schema, *prio, seeds), v((i * 100 + j) as u32))
                        })
                        .collect();
                    let mut given: BTreeMap<Rule, [u8; 4]> = BTreeMap::new();
                    let mut want = Ok(());
                    for (rule, value) in &items {
                        let again = given.insert(rule.clone(), *value).is_some();
                        if again && *flags == BPF_NOEXIST {
                            want = Err(Error::Exists);
                            break;
                        }
                    }
                    if want.is_ok() {
                        for rule in given.keys() {
                            match (*flags, o.get(rule).is_some()) {
                                (BPF_NOEXIST, true) => want = Err(Error::Exists),
                                (BPF_EXIST, false) => want = Err(Error::NotFound),
                                _ => continue,
                            }
                            break;
                        }
                    }
                    let fresh = given.keys().filter(|r| o.get(r).is_none()).count();
                    if want.is_ok() && o.len() + fresh > m.max_entries() as usize {
                        want = Err(Error::Full);
                    }
                    prop_assert_eq!(m.load(items, *flags), want.clone());
                    if want.is_ok() {
                        for (rule, value) in given {
                            if o.get(&rule).is_none() {
                                held.push(rule.clone());
                            }
                            o.insert(rule, &value);
                        }
                    }
                }
                Op::Remove(k) => {
                    if held.is_empty() {
                        continue;
                    }
                    let rule = held.swap_remove(k % held.len());
                    prop_assert_eq!(m.take(&rule), Ok(o.remove(&rule).unwrap()));
                    prop_assert_eq!(m.remove(&rule), Err(Error::NotFound));
                    taken.push(rule);
                }
                Op::PutBack(k) => {
                    if taken.is_empty() {
                        continue;
                    }
                    // `EEXIST` if it was inserted again since.
                    let rule = taken.swap_remove(k % taken.len());
                    insert_both(m, &mut o, &mut held, rule, BPF_NOEXIST, v(i as u32))?;
                }
                Op::Classify(seeds) => {
                    let values: Vec<u128> = schema
                        .fields()
                        .iter()
                        .zip(seeds)
                        .map(|(f, &s)| near(f, s) ^ u128::from(s >> 60 & 1))
                        .collect();
                    let p = schema.packet(&values).unwrap();
                    let want = oracle_answer(&o, &p);
                    let value = want
                        .as_ref()
                        .map(|(_, v)| <[u8; 4]>::try_from(&v[..]).unwrap());
                    prop_assert_eq!(m.classify_as::<[u8; 4]>(&p, &guard), value);
                    prop_assert_eq!(m.classify_as::<u64>(&p, &guard), None);
                    prop_assert_eq!(answer(m, &p), want.clone());
                    let by_key = m.classify_key(&schema.packet_key(&p), &guard).unwrap();
                    prop_assert_eq!(by_key.map(|(r, v)| (r.clone(), v.to_vec())), want);
                    // `classify_many`'s pipeline: each packet's answer in
                    // its place, over the rules held now.
                    recent.push(p);
                    if recent.len() > 5 {
                        recent.remove(0);
                    }
                    let sentinel = rule_from(&schema, 0, &[0; 4]);
                    let mut out = vec![None; recent.len() + 1];
                    out[recent.len()] = Some((&sentinel, &[7u8][..]));
                    m.classify_many(&recent, &guard, &mut out).unwrap();
                    for (q, got) in recent.iter().zip(&out) {
                        let got = got.map(|(r, v)| (r.clone(), v.to_vec()));
                        prop_assert_eq!(got, oracle_answer(&o, q));
                    }
                    prop_assert_eq!(
                        out[recent.len()].unwrap().1,
                        &[7u8][..],
                        "past the packets, untouched"
                    );
                    // And `classify_many_keys`' of their keys.
                    let keys: Vec<u8> = recent.iter().flat_map(|q| schema.packet_key(q)).collect();
                    let mut by_keys = out.clone();
                    m.classify_many_keys(&keys, &guard, &mut by_keys).unwrap();
                    prop_assert_eq!(by_keys, out);
                }
            }
            prop_assert_eq!(m.len(), o.len());
            check_after(m, i, ops.len());
        }
        for rule in &held {
            prop_assert_eq!(m.get(rule, &guard), o.get(rule));
        }
        let want: Vec<(Rule, Vec<u8>)> = o.iter().map(|(r, v)| (r.clone(), v.to_vec())).collect();
        prop_assert_eq!(m.rules(), want);
        let mut walked = Vec::new();
        let mut at = None;
        while let Some(r) = m.next_rule(at.as_ref()) {
            walked.push(r.clone());
            at = Some(r);
        }
        prop_assert_eq!(walked, o.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>());
    }
    Ok(())
}

/// The shared ClassBench sets (`../shared/data/classbench/`), if this
/// checkout has them: every rule set loaded, and every packet of its
/// trace (or of one generated inside its rules, and uniformly) classified
/// as the oracle does.
#[test]
#[cfg_attr(miri, ignore = "reads files; minutes of interpreted time")]
fn classbench_sets_classify_as_the_oracle_does() {
    use std::io::Read;
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/classbench");
    let read = |name: &str| -> Option<String> {
        let path = dir.join(name);
        let mut text = String::new();
        if name.ends_with(".gz") {
            let file = std::fs::File::open(path).ok()?;
            flate2::read::GzDecoder::new(file)
                .read_to_string(&mut text)
                .ok()?;
        } else {
            text = std::fs::read_to_string(path).ok()?;
        }
        Some(text)
    };
    let sets = [
        ("acl1_1k", None),
        ("fw1_1k", None),
        ("ipc1_1k", None),
        ("acl1_10k.gz", None),
        ("fw1_10k.gz", None),
        ("ipc1_10k.gz", None),
        ("cutsplit/acl_1k.gz", Some("cutsplit/acl_1k_trace.gz")),
        ("cutsplit/fw_1k.gz", Some("cutsplit/fw_1k_trace.gz")),
        ("cutsplit/ipc_1k.gz", Some("cutsplit/ipc_1k_trace.gz")),
        ("cutsplit/fw_10k.gz", Some("cutsplit/fw_10k_trace.gz")),
    ];
    let s = five_tuple();
    let mut checked = 0;
    for (rules_file, trace_file) in sets {
        let Some(text) = read(rules_file) else {
            eprintln!("{rules_file}: absent, skipped");
            continue;
        };
        let rules = classbench::parse_rules(&s, &text).unwrap();
        let m = WildcardMap::new(s.clone(), 4, rules.len() as u32).unwrap();
        let mut o = BruteForce::new();
        for (i, r) in rules.iter().enumerate() {
            // Rule files repeat a few rules; the first copy wins.
            if o.get(r).is_none() {
                m.insert(r, &v(r.priority), BPF_NOEXIST).unwrap();
                o.insert(r.clone(), &v(r.priority));
            }
            // The books checked as the tables split (not after every
            // insert: that would be quadratic).
            if i.is_power_of_two() || i % 1000 == 0 {
                m.check_structure();
            }
        }
        m.check_structure();
        // The same set loaded at once (scrambled, whole-table splits).
        let loaded = WildcardMap::new(s.clone(), 4, rules.len() as u32).unwrap();
        loaded
            .load(rules.iter().map(|r| (r, v(r.priority))), BPF_ANY)
            .unwrap();
        loaded.check_structure();
        assert_eq!(loaded.rules(), m.rules(), "{rules_file}: the rules loaded");
        let mut packets = classbench::generate_trace(&s, &rules, 3000, 0.9, 7);
        if let Some(trace) = trace_file.and_then(read) {
            packets.extend(
                classbench::parse_trace(&s, &trace)
                    .unwrap()
                    .into_iter()
                    .step_by(3),
            );
        }
        let guard = pin();
        let mut in_bursts = vec![None; packets.len()];
        loaded
            .classify_many(&packets, &guard, &mut in_bursts)
            .unwrap();
        let keys: Vec<u8> = packets.iter().flat_map(|p| s.packet_key(p)).collect();
        let mut by_keys = vec![None; packets.len()];
        loaded
            .classify_many_keys(&keys, &guard, &mut by_keys)
            .unwrap();
        assert!(by_keys == in_bursts, "{rules_file}: classify_many_keys");
        for (i, p) in packets.iter().enumerate() {
            let want = o.classify(p).map(|(r, _)| r);
            let got = in_bursts[i].map(|(r, _)| r);
            assert_eq!(
                got, want,
                "{rules_file}, loaded, classify_many: packet {i} {p:?}"
            );
            let got = m.classify(p, &guard).map(|(r, _)| r);
            assert_eq!(got, want, "{rules_file}: packet {i} {p:?}");
            let got = loaded.classify(p, &guard).map(|(r, _)| r);
            assert_eq!(got, want, "{rules_file}, loaded: packet {i} {p:?}");
            let key = s.packet_key(p);
            let got = loaded.classify_key(&key, &guard).unwrap().map(|(r, _)| r);
            assert_eq!(got, want, "{rules_file}, loaded, by key: packet {i} {p:?}");
        }
        // Every tenth rule out of the loaded map, then back in (the
        // bounds the load worked out still hold for those put back):
        // every packet as the oracle classifies it, both times.
        let churned: Vec<Rule> = o.iter().map(|(r, _)| r.clone()).step_by(10).collect();
        let shape = |m: &WildcardMap| {
            let probed: usize = (packets.iter())
                .map(|p| m.classify_counting(p, &guard).1)
                .sum();
            (m.tables(), probed)
        };
        let loaded_shape = shape(&loaded);
        for phase in ["out", "back"] {
            for r in &churned {
                if phase == "out" {
                    loaded.remove(r).unwrap();
                    o.remove(r).unwrap();
                } else {
                    loaded.insert(r, &v(r.priority), BPF_NOEXIST).unwrap();
                    o.insert(r.clone(), &v(r.priority));
                }
            }
            loaded.check_structure();
            for (i, p) in packets.iter().enumerate() {
                let want = o.classify(p).map(|(r, _)| r);
                let got = loaded.classify(p, &guard).map(|(r, _)| r);
                assert_eq!(got, want, "{rules_file}, a tenth {phase}: packet {i} {p:?}");
            }
        }
        // Each rule back in its table with its bound: the tables and the
        // probes the load made.
        assert_eq!(shape(&loaded), loaded_shape, "{rules_file}: put back");
        eprintln!(
            "{rules_file}: {} rules in {} tables ({} loaded at once), {} packets agree",
            m.len(),
            m.tables(),
            loaded.tables(),
            packets.len()
        );
        checked += 1;
    }
    if checked == 0 {
        eprintln!("no ClassBench set in {}: nothing checked", dir.display());
    }
}
