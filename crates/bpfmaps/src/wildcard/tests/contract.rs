//! The byte contract (`contract.rs`) and keys' bytes: `map_extra`,
//! rule and match keys, batches, `get_next_key`, `classify_key` and
//! `classify_key_as` over every field and value size.

use super::*;

#[test]
fn schemas_round_trip_through_map_extra_and_bad_extras_are_einval() {
    let s = five_tuple();
    let back = Schema::from_map_extra(s.map_extra()).unwrap();
    assert_eq!(back.map_extra(), s.map_extra());
    assert!(
        back.fields()
            .iter()
            .zip(s.fields())
            .all(|(a, b)| (a.kind, a.size) == (b.kind, b.size))
    );
    // The family's sample: one field of each kind, 23-byte rule keys.
    let (key_size, extra) = WILDCARD_FAMILY.sample_layout.unwrap();
    let sample = Schema::new(vec![
        Field::prefix("f0", 4),
        Field::range("f1", 2),
        Field::exact("f2", 1),
        Field::wildcard("f3", 2),
    ])
    .unwrap();
    assert_eq!(sample.map_extra(), extra);
    assert_eq!(sample.rule_key_size(), key_size as usize);
    // No fields, ten, bits past the last field, a 16-byte range.
    for bad in [0, 10, s.map_extra() | 1 << 40, 1 | (1 | 15 << 2) << 4] {
        assert_eq!(
            Schema::from_map_extra(bad).unwrap_err().errno(),
            22,
            "{bad:#x}"
        );
    }
    // The widest schema fits the declared bits.
    let widest = Schema::new(
        (0..9)
            .map(|i| Field::wildcard(&format!("w{i}"), 16))
            .collect(),
    )
    .unwrap();
    assert_eq!(widest.map_extra() & !SCHEMA_EXTRA_BITS, 0);
    assert_eq!(
        Schema::from_map_extra(widest.map_extra())
            .unwrap()
            .key_size(),
        9 * 16
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(64, 2) as u32))]

    /// A rule key names its rule; the key of the rule it names is the
    /// key again; a concrete key carries its packet.
    #[test]
    fn rule_and_match_keys_round_trip(schema in arb_schema(), seeds in prop::collection::vec(any::<u64>(), 4), prio: u32) {
        let rule = rule_from(&schema, prio, &seeds);
        let key = schema.rule_key(&rule);
        prop_assert_eq!(key.len(), schema.rule_key_size());
        prop_assert_eq!(&schema.rule_from_key(&key).unwrap(), &rule);
        let values: Vec<u128> = schema.fields().iter().zip(&seeds).map(|(f, &s)| near(f, s)).collect();
        let p = schema.packet(&values).unwrap();
        prop_assert_eq!(schema.packet_from_match_key(&schema.match_key(&p)).unwrap(), p);
        prop_assert_eq!(schema.rule_from_key(&schema.match_key(&p)).unwrap_err().errno(), 22);
    }

    /// A key of fields of any sizes (1 to 16 bytes, where the shared
    /// round trip above draws 1, 2, 4, 8 and 16) is read field by field
    /// as the big-endian numbers its bytes are, and written back the same.
    #[test]
    fn keys_of_fields_of_any_size_round_trip(
        sizes in prop::collection::vec(1..=16usize, 1..=MAX_FIELDS),
        bytes in prop::collection::vec(any::<u8>(), MAX_FIELDS * MAX_FIELD_SIZE),
    ) {
        let fields = sizes.iter().enumerate().map(|(i, &n)| Field::exact(&format!("f{i}"), n));
        let schema = Schema::new(fields.collect()).unwrap();
        let key = &bytes[..schema.key_size()];
        let p = schema.packet_from_bytes(key).unwrap();
        let mut at = 0;
        for (f, &value) in schema.fields().iter().zip(&p.values) {
            let bytes = &key[at..at + f.size];
            prop_assert_eq!(value, bytes.iter().fold(0u128, |v, &b| v << 8 | u128::from(b)));
            at += f.size;
        }
        prop_assert!(p.values[sizes.len()..].iter().all(|&v| v == 0));
        prop_assert_eq!(schema.packet_key(&p), key.to_vec());
        prop_assert!(schema.packet_from_bytes(&bytes[..schema.key_size() + 1]).is_err());
    }

    /// The order a load sorts its rules in (the priority, then the bounds
    /// packed into one number, `map::pack`) is rule order; rules it ties
    /// are the same rule when their packing is whole (at most 128 bits).
    #[test]
    fn packed_bounds_order_as_rules(
        schema in arb_schema(),
        a in prop::collection::vec(any::<u64>(), 4),
        b in prop::collection::vec(any::<u64>(), 4),
        pa in 0u32..2,
        pb in 0u32..2,
    ) {
        let (x, y) = (rule_from(&schema, pa, &a), rule_from(&schema, pb, &b));
        let key = |r: &Rule| (r.priority, map::pack(schema.fields(), r));
        let whole = schema.fields().iter().map(|f| 2 * f.bits()).sum::<u32>() <= 128;
        match key(&x).cmp(&key(&y)) {
            std::cmp::Ordering::Equal => prop_assert!(!whole || x == y, "{x:?} and {y:?} tie"),
            order => prop_assert_eq!(x.cmp(&y), order),
        }
    }
}

/// A 5-tuple wildcard map built through `create()`.
fn created(max_entries: u32) -> Box<dyn crate::Map> {
    let s = five_tuple();
    let spec = crate::MapSpec::new(
        crate::MapType::WILDCARD,
        s.rule_key_size() as u32,
        4,
        max_entries,
    )
    .extra(s.map_extra());
    crate::create(&spec).unwrap()
}

#[test]
fn create_checks_the_schema_against_the_key_size() {
    let s = five_tuple();
    let spec =
        |ks: u32, extra: u64| crate::MapSpec::new(crate::MapType::WILDCARD, ks, 4, 8).extra(extra);
    let ks = s.rule_key_size() as u32;
    assert_eq!(ks, 8 + (4 + 4) * 2 + 2 * 2 * 2 + 1 + 4);
    assert!(crate::create(&spec(ks, s.map_extra())).is_ok());
    assert_eq!(
        crate::create(&spec(ks + 1, s.map_extra()))
            .unwrap_err()
            .errno(),
        22
    );
    assert_eq!(crate::create(&spec(ks, 0)).unwrap_err().errno(), 22);
    let m = created(8);
    assert_eq!(m.info().map_extra, s.map_extra());
    assert_eq!(m.map_type().name(), Some("wildcard"));
}

#[test]
fn rule_keys_update_and_concrete_keys_classify_through_the_contract() {
    let s = five_tuple();
    let m = created(100);
    let ssh = s
        .parse_rule("src 10.0.0.0/8, dport 22, proto 6", 1)
        .unwrap();
    let low = s.parse_rule("dport 0-1023, proto 6", 5).unwrap();
    m.update(&s.rule_key(&ssh), &v(1), BPF_NOEXIST).unwrap();
    m.update(&s.rule_key(&low), &v(2), BPF_NOEXIST).unwrap();
    let classify = |text: &str| {
        let mut out = [0u8; 4];
        m.lookup(&s.match_key(&s.parse_packet(text).unwrap()), &mut out)
            .map(|()| u32::from_ne_bytes(out))
    };
    let pkt = "src 10.9.9.9, dst 1.1.1.1, sport 5000, dport 22, proto 6";
    assert_eq!(classify(pkt), Ok(1));
    assert_eq!(
        classify("src 11.0.0.1, dst 1.1.1.1, sport 5000, dport 22, proto 6"),
        Ok(2)
    );
    assert_eq!(
        classify("src 11.0.0.1, dst 1.1.1.1, sport 5000, dport 2222, proto 6"),
        Err(Error::NotFound)
    );
    // A concrete key's priority bytes and the bytes past its values are
    // ignored.
    let mut key = s.match_key(&s.parse_packet(pkt).unwrap());
    key[4..8].copy_from_slice(&[9; 4]);
    *key.last_mut().unwrap() = 0xff;
    let mut out = [0u8; 4];
    m.lookup(&key, &mut out).unwrap();
    assert_eq!(out, v(1));
    // A rule key looks up exactly its rule; host bits do not matter.
    m.lookup(&s.rule_key(&low), &mut out).unwrap();
    assert_eq!(out, v(2));
    let mut spelled = s.rule_key(&ssh);
    spelled[9] = 0x77; // 10.119.0.0/8: host bits
    m.lookup(&spelled, &mut out).unwrap();
    assert_eq!(out, v(1));

    // Concrete keys neither update nor delete; unknown types, long
    // prefixes and empty ranges are EINVAL; nothing changes.
    let before = m.len();
    let elem = s.match_key(&s.parse_packet(pkt).unwrap());
    assert_eq!(m.update(&elem, &v(3), BPF_ANY).unwrap_err().errno(), 22);
    assert_eq!(m.delete(&elem).unwrap_err().errno(), 22);
    assert_eq!(
        m.get_next_key(Some(&elem), &mut vec![0; key.len()])
            .unwrap_err()
            .errno(),
        22
    );
    let mut typed = s.rule_key(&ssh);
    typed[..4].copy_from_slice(&7u32.to_ne_bytes());
    assert_eq!(m.lookup(&typed, &mut out).unwrap_err().errno(), 22);
    assert_eq!(m.update(&typed, &v(3), BPF_ANY).unwrap_err().errno(), 22);
    let mut long = s.rule_key(&ssh);
    long[12..16].copy_from_slice(&33u32.to_ne_bytes()); // src /33
    assert_eq!(m.update(&long, &v(3), BPF_ANY).unwrap_err().errno(), 22);
    let mut empty = s.rule_key(&low);
    let dport = 8 + 8 + 8 + 4; // after src, dst (4 + 4 each) and sport
    empty[dport..dport + 4].copy_from_slice(&[0x04, 0x00, 0x00, 0x01]); // 1024-1
    assert_eq!(m.update(&empty, &v(3), BPF_ANY).unwrap_err().errno(), 22);
    assert_eq!(m.len(), before);
    assert_eq!(m.lookup(&s.rule_key(&ssh), &mut out), Ok(()));
    assert_eq!(out, v(1));
}

/// `n` distinct random rules of the 5-tuple schema, priorities 0-99.
fn random_five_tuple_rules(n: usize, seed: u64) -> Vec<Rule> {
    use rand::{Rng, SeedableRng};
    let s = five_tuple();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut rules = std::collections::BTreeSet::new();
    while rules.len() < n {
        let seeds: Vec<u64> = (0..5).map(|_| rng.random()).collect();
        rules.insert(rule_from(&s, rng.random_range(0..100), &seeds));
    }
    // Out of rule order, as a policy's rules come.
    let mut rules: Vec<Rule> = rules.into_iter().collect();
    rules.sort_by_key(|r| r.bounds().first().map(|b| b.0));
    rules
}

/// `rules`' keys back to back, and their values (`v(i)` for the `i`th).
fn batch_of_rules(s: &Schema, rules: &[Rule]) -> (Vec<u8>, Vec<u8>) {
    let keys = rules.iter().flat_map(|r| s.rule_key(r)).collect();
    let values = (0..rules.len() as u32).flat_map(v).collect();
    (keys, values)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe code over `load`, whose unsafe parts the load tests cover; 36 s interpreted"
)]
fn a_big_update_batch_goes_in_as_one_load() {
    use crate::Map;
    let s = five_tuple();
    let n = 400;
    let rules = random_five_tuple_rules(n, 1);
    let (keys, values) = batch_of_rules(&s, &rules);
    let batched = WildcardMap::new(s.clone(), 4, 1000).unwrap();
    assert_eq!(batched.update_batch(&keys, &values, BPF_ANY), Ok(n));
    batched.check_structure();
    let loaded = WildcardMap::new(s.clone(), 4, 1000).unwrap();
    let valued = || rules.iter().zip(0u32..).map(|(r, i)| (r, v(i)));
    loaded.load(valued(), BPF_ANY).unwrap();
    // The load's tables and exit bounds, which updates one by one do not
    // make: some bound here is better than its rule's priority.
    assert_eq!(batched.tuples(), loaded.tuples());
    let bounds = |m: &WildcardMap| rules.iter().map(|r| m.exit_bound(r)).collect::<Vec<_>>();
    assert_eq!(bounds(&batched), bounds(&loaded));
    assert!(rules.iter().any(|r| loaded.exit_bound(r) < r.priority));
    let one_by_one = WildcardMap::new(s.clone(), 4, 1000).unwrap();
    for (r, value) in valued() {
        one_by_one.insert(r, &value, BPF_NOEXIST).unwrap();
    }
    assert_ne!(bounds(&one_by_one), bounds(&loaded));
    // And the answers of the rules given.
    let mut oracle = BruteForce::new();
    for (r, value) in valued() {
        oracle.insert(r.clone(), &value);
    }
    let packets = random_five_tuple_rules(n, 2);
    for p in &packets {
        let packet = s
            .packet(&p.bounds().iter().map(|b| b.0).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(answer(&batched, &packet), oracle_answer(&oracle, &packet));
    }
    // A batch smaller than the map goes in one by one: the bounds no
    // longer hold.
    let more = random_five_tuple_rules(2 * n, 3);
    let fresh: Vec<Rule> = more
        .into_iter()
        .filter(|r| oracle.get(r).is_none())
        .take(n - 1)
        .collect();
    let (keys, values) = batch_of_rules(&s, &fresh);
    assert_eq!(batched.update_batch(&keys, &values, BPF_NOEXIST), Ok(n - 1));
    assert!(rules.iter().all(|r| batched.exit_bound(r) == r.priority));
}

/// What updates one at a time through the contract make of a batch:
/// how many went in, or where and why they stopped.
fn updated_one_by_one(
    m: &dyn crate::Map,
    keys: &[u8],
    values: &[u8],
    flags: u64,
) -> Result<usize, (usize, i32)> {
    let (ks, vs) = (m.info().key_size as usize, m.info().value_size as usize);
    let n = keys.len() / ks;
    for i in 0..n {
        m.update(&keys[i * ks..][..ks], &values[i * vs..][..vs], flags)
            .map_err(|e| (i, e.errno()))?;
    }
    Ok(n)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe code over `load`, whose unsafe parts the load tests cover; 48 s interpreted"
)]
fn a_big_update_batch_stops_where_updates_one_by_one_would() {
    use crate::Map;
    let s = five_tuple();
    // Batches of `10 * k` rules.
    let k = 10;
    let new = || WildcardMap::new(s.clone(), 4, 50 * k as u32).unwrap();
    let (batched, each) = (new(), new());
    let rules = random_five_tuple_rules(70 * k, 4);
    // Each batch below holds at least as many rules as the map: a load.
    let same = |keys: &[u8], values: &[u8], flags, want: Result<usize, (usize, i32)>| {
        assert!(keys.len() / s.rule_key_size() >= batched.len());
        let got = batched
            .update_batch(keys, values, flags)
            .map_err(|e| (e.processed, e.error.errno()));
        assert_eq!(got, updated_one_by_one(&each, keys, values, flags));
        assert_eq!(got, want);
        assert_eq!(batched.rules(), each.rules());
        batched.check_structure();
    };
    // Whether the held rules' exit bounds hold (some is better than its
    // rule's priority): a load's, which a batch one by one would void.
    let bounds_hold = || {
        batched
            .rules()
            .iter()
            .any(|(r, _)| batched.exit_bound(r) < r.priority)
    };
    // A bad key (a /33 prefix) at 7 of 10: the 7 before it go in.
    let (mut keys, values) = batch_of_rules(&s, &rules[..10 * k]);
    let ks = s.rule_key_size();
    keys[7 * k * ks + 12..][..4].copy_from_slice(&33u32.to_ne_bytes());
    same(&keys, &values, BPF_ANY, Err((7 * k, 22)));
    assert!(bounds_hold());
    // BPF_NOEXIST, a held rule at 8 of 10: the load refuses the whole
    // batch, and one by one stops at it.
    let mut given = rules[10 * k..20 * k].to_vec();
    given[8 * k] = rules[5].clone();
    let (keys, values) = batch_of_rules(&s, &given);
    same(&keys, &values, BPF_NOEXIST, Err((8 * k, 17)));
    // BPF_EXIST, the 15 held and a new rule at 14.
    let mut given: Vec<Rule> = batched.rules().into_iter().map(|(r, _)| r).collect();
    given.insert(14 * k, rules[69 * k].clone());
    let (keys, values) = batch_of_rules(&s, &given);
    same(&keys, &values, BPF_EXIST, Err((14 * k, 2)));
    // BPF_ANY, a rule twice: its last value stays.
    let mut given = rules[20 * k..36 * k].to_vec();
    given[16 * k - 1] = rules[20 * k].clone();
    let (keys, values) = batch_of_rules(&s, &given);
    same(&keys, &values, BPF_ANY, Ok(16 * k));
    assert!(bounds_hold());
    // Past max_entries: where the map fills.
    let held = batched.len();
    let (keys, values) = batch_of_rules(&s, &rules[36 * k..36 * k + held + 1]);
    same(&keys, &values, BPF_NOEXIST, Err((50 * k - held, 7)));
    assert_eq!(batched.len(), 50 * k);
}

#[test]
fn get_next_key_walks_rule_order_and_goes_on_past_a_removed_rule() {
    let s = five_tuple();
    let m = created(100);
    let rules: Vec<Rule> = (0..30u32)
        .map(|i| {
            s.parse_rule(
                &format!("src 10.{i}.0.0/16, dport {}-2000, proto 6", i * 7),
                29 - i % 3,
            )
            .unwrap()
        })
        .collect();
    for (i, r) in rules.iter().enumerate() {
        m.update(&s.rule_key(r), &v(i as u32), BPF_NOEXIST).unwrap();
    }
    let mut sorted = rules.clone();
    sorted.sort();
    let walk = |m: &dyn crate::Map| {
        let mut out = Vec::new();
        let mut next = vec![0u8; s.rule_key_size()];
        let mut prev: Option<Vec<u8>> = None;
        while let Ok(n) = m.get_next_key(prev.as_deref(), &mut next) {
            out.push(s.rule_from_key(&next[..n]).unwrap());
            prev = Some(next[..n].to_vec());
        }
        out
    };
    assert_eq!(walk(&*m), sorted);
    // From a rule just removed: the one after it.
    m.delete(&s.rule_key(&sorted[10])).unwrap();
    let mut next = vec![0u8; s.rule_key_size()];
    m.get_next_key(Some(&s.rule_key(&sorted[10])), &mut next)
        .unwrap();
    assert_eq!(s.rule_from_key(&next).unwrap(), sorted[11]);
    m.get_next_key(Some(&s.rule_key(&sorted[29])), &mut next)
        .map(drop)
        .unwrap_err();
}

/// A schema of one prefix field through the byte contract: `create()`
/// builds the prefix engine, and rule keys, concrete keys and
/// `get_next_key` behave as with TupleMerge.
#[test]
fn a_one_prefix_field_map_through_the_contract() {
    let s = Schema::new(vec![Field::prefix("addr", 4)]).unwrap();
    let spec = crate::MapSpec::new(crate::MapType::WILDCARD, s.rule_key_size() as u32, 4, 3)
        .extra(s.map_extra());
    let m = crate::create(&spec).unwrap();
    let rules = [
        s.parse_rule("addr 10.0.0.0/8", 24).unwrap(),
        s.parse_rule("addr 10.9.0.0/16", 16).unwrap(),
        // A short prefix that beats the longer ones under it.
        s.parse_rule("addr 0.0.0.0/0", 1).unwrap(),
    ];
    for (i, r) in rules.iter().enumerate() {
        m.update(&s.rule_key(r), &v(i as u32), BPF_NOEXIST).unwrap();
    }
    let extra = s.parse_rule("addr 192.0.2.0/24", 8).unwrap();
    assert_eq!(
        m.update(&s.rule_key(&extra), &v(9), BPF_ANY),
        Err(Error::Full)
    );
    let classify = |text: &str| {
        let mut out = [0u8; 4];
        m.lookup(&s.match_key(&s.parse_packet(text).unwrap()), &mut out)
            .map(|()| u32::from_ne_bytes(out))
    };
    assert_eq!(classify("addr 10.9.1.1"), Ok(2));
    m.delete(&s.rule_key(&rules[2])).unwrap();
    assert_eq!(classify("addr 10.9.1.1"), Ok(1));
    assert_eq!(classify("addr 10.1.1.1"), Ok(0));
    assert_eq!(classify("addr 11.1.1.1"), Err(Error::NotFound));
    // Rule order: priority first.
    let mut key = vec![0; s.rule_key_size()];
    m.get_next_key(None, &mut key).unwrap();
    assert_eq!(key, s.rule_key(&rules[1]));
    let prev = key.clone();
    m.get_next_key(Some(&prev), &mut key).unwrap();
    assert_eq!(key, s.rule_key(&rules[0]));
    let prev = key.clone();
    assert_eq!(m.get_next_key(Some(&prev), &mut key), Err(Error::NotFound));
    let mut out = [0u8; 4];
    m.lookup(&s.rule_key(&rules[0]), &mut out).unwrap();
    assert_eq!(out, v(0));
    assert_eq!(
        m.lookup(&s.rule_key(&rules[2]), &mut out),
        Err(Error::NotFound)
    );
}

/// A stream of pseudo-random words from `seed` (not 0).
fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// A one-prefix map of every field size (the prefix engine) and a
/// two-field one (TupleMerge) answer a key's bytes through
/// `classify_key`, `classify_key_as` and the contract's `lookup` as the
/// oracle answers its packet, for values of 1 to 6 bytes (the contract
/// reads those of up to 4 through `classify_key_as`); and a batch of
/// them through `classify_many` and `classify_many_keys`.
#[test]
#[cfg_attr(
    miri,
    ignore = "safe code on the probes other tests run; minutes interpreted"
)]
fn keys_classify_as_their_packets_for_every_field_and_value_size() {
    let mut next = xorshift(0x5eed);
    let schemas = (1..=16)
        .map(|size| Schema::new(vec![Field::prefix("addr", size)]).unwrap())
        .chain([Schema::new(vec![Field::prefix("addr", 3), Field::range("port", 2)]).unwrap()]);
    for schema in schemas {
        for value_size in 1..=6 {
            let spec = crate::MapSpec::new(
                crate::MapType::WILDCARD,
                schema.rule_key_size() as u32,
                value_size as u32,
                64,
            )
            .extra(schema.map_extra());
            let contract = crate::create(&spec).unwrap();
            let map = WildcardMap::new(schema.clone(), value_size, 64).unwrap();
            let mut oracle = BruteForce::new();
            // Rules and packets near a few values, so that most match.
            let near = |f: &Field, r: u64| (u128::from(r % 4) << (f.bits() - 2)) & f.max();
            for i in 0..40u32 {
                let mut b = schema.rule(u32::from(next() as u8 % 8));
                for f in schema.fields() {
                    b = match f.kind {
                        FieldKind::Prefix => {
                            b.prefix(&f.name, near(f, next()), next() as u32 % (f.bits() + 1))
                        }
                        _ => b.range(&f.name, u128::from(i % 5), u128::from(i % 5 + 3)),
                    };
                }
                let rule = b.build().unwrap();
                let value: Vec<u8> = (0..value_size).map(|_| next() as u8).collect();
                if map.insert(&rule, &value, BPF_NOEXIST).is_ok() {
                    contract
                        .update(&schema.rule_key(&rule), &value, BPF_NOEXIST)
                        .unwrap();
                    oracle.insert(rule, &value);
                }
            }
            let guard = pin();
            let mut packets = Vec::new();
            for _ in 0..200 {
                let values: Vec<u128> = schema
                    .fields()
                    .iter()
                    .map(|f| (near(f, next()) | u128::from(next() as u8)) & f.max())
                    .collect();
                let packet = schema.packet(&values).unwrap();
                let key = schema.packet_key(&packet);
                let want = oracle.classify(&packet).map(|(_, v)| v.to_vec());
                let got = map
                    .classify_key(&key, &guard)
                    .unwrap()
                    .map(|(_, v)| v.to_vec());
                assert_eq!(
                    got, want,
                    "classify_key, {schema:?}, values of {value_size}"
                );
                let mut out = vec![0; value_size];
                let looked_up = contract.lookup(&schema.match_key(&packet), &mut out);
                assert_eq!(looked_up.ok().map(|()| out), want, "lookup, {schema:?}");
                if value_size == 4 {
                    let as_word = map.classify_key_as::<[u8; 4]>(&key, &guard).unwrap();
                    assert_eq!(as_word.map(|w| w.to_vec()), want, "classify_key_as");
                }
                assert_eq!(map.classify_key_as::<[u8; 7]>(&key, &guard), Ok(None));
                packets.push(packet);
            }
            // The 200 in one batch (groups of 32 and the rest), as
            // packets and as keys.
            let want: Vec<_> = packets.iter().map(|p| oracle.classify(p)).collect();
            let mut out = vec![None; packets.len()];
            map.classify_many(&packets, &guard, &mut out).unwrap();
            assert_eq!(out, want, "classify_many, {schema:?}");
            let keys: Vec<u8> = packets.iter().flat_map(|p| schema.packet_key(p)).collect();
            let mut out = vec![None; packets.len()];
            map.classify_many_keys(&keys, &guard, &mut out).unwrap();
            assert_eq!(out, want, "classify_many_keys, {schema:?}");
            let short = &schema.packet_key(&Packet::default())[1..];
            assert!(map.classify_key_as::<[u8; 4]>(short, &guard).is_err());
        }
    }
}

/// A prefix engine big enough for its trie's direct index (4,096
/// prefixes and more) answers batches through the trie's staged lookups:
/// each answer as `classify` gives it, a packet's value wider than the
/// field none.
#[test]
#[cfg_attr(miri, ignore = "5,000 rules: minutes interpreted")]
fn a_big_prefix_engine_classifies_batches_as_one_at_a_time() {
    let schema = Schema::new(vec![Field::prefix("addr", 4)]).unwrap();
    let map = WildcardMap::new(schema.clone(), 4, 10_000).unwrap();
    let mut next = xorshift(0x9e37_79b9);
    let rules: Vec<_> = (0..5_000u32)
        .map(|i| {
            let len = 8 + (next() % 17) as u32;
            let addr = u128::from(next() as u32 & (u32::MAX << (32 - len)));
            let rule = schema
                .rule(32 - len)
                .prefix("addr", addr, len)
                .build()
                .unwrap();
            (rule, v(i))
        })
        .collect();
    map.load(rules.iter().map(|(r, v)| (r, v)), BPF_ANY)
        .unwrap();
    let mut packets: Vec<Packet> = (0..1_000)
        .map(|_| schema.packet(&[u128::from(next() as u32)]).unwrap())
        .collect();
    packets[7].values[0] = 1 << 32;
    let guard = pin();
    let want: Vec<_> = packets.iter().map(|p| map.classify(p, &guard)).collect();
    assert!(
        want.iter().filter(|a| a.is_some()).count() > 100,
        "most addresses match"
    );
    assert_eq!(want[7], None);
    let mut out = vec![None; packets.len()];
    map.classify_many(&packets, &guard, &mut out).unwrap();
    assert_eq!(out, want);
    let mut fitting = packets.clone();
    fitting.remove(7);
    let keys: Vec<u8> = fitting.iter().flat_map(|p| schema.packet_key(p)).collect();
    let mut out = vec![None; fitting.len()];
    map.classify_many_keys(&keys, &guard, &mut out).unwrap();
    let want: Vec<_> = fitting.iter().map(|p| map.classify(p, &guard)).collect();
    assert_eq!(out, want);
}
