//! Each field type's edge cases, bad input, update flags, loads, walks
//! and the tie rule.

use super::*;

#[test]
fn prefixes_from_zero_to_full_length() {
    let s = Schema::new(vec![Field::prefix("a", 4)]).unwrap();
    let any = s.rule(0).prefix("a", 0x0a01_0203, 0).build().unwrap();
    assert_eq!(any.bounds(), &[(0, 0xffff_ffff)]);
    let host = s.rule(0).prefix("a", 0x0a01_0203, 32).build().unwrap();
    assert_eq!(host.bounds(), &[(0x0a01_0203, 0x0a01_0203)]);
    // Host bits are ignored: the same rule as 10.0.0.0/8.
    let eight = s.rule(0).prefix("a", 0x0a01_0203, 8).build().unwrap();
    assert_eq!(eight, s.parse_rule("a 10.0.0.0/8", 0).unwrap());
    assert_eq!(eight.bounds(), &[(0x0a00_0000, 0x0aff_ffff)]);
    let in_ = s.packet(&[0x0aff_ffff]).unwrap();
    let out = s.packet(&[0x0b00_0000]).unwrap();
    assert!(eight.matches(&in_) && !eight.matches(&out));
    assert!(any.matches(&out));
    // 16-byte prefixes, /0 and /128.
    let s6 = Schema::new(vec![Field::prefix("a", 16)]).unwrap();
    let all = s6.parse_rule("a ::/0", 0).unwrap();
    assert_eq!(all.bounds(), &[(0, u128::MAX)]);
    let one = s6.parse_rule("a 2001:db8::1/128", 0).unwrap();
    assert!(one.matches(&s6.parse_packet("a 2001:db8::1").unwrap()));
    assert!(!one.matches(&s6.parse_packet("a 2001:db8::2").unwrap()));
    assert_eq!(one.prefix_lengths(&s6)[0], 128);
    assert_eq!(all.prefix_lengths(&s6)[0], 0);
}

#[test]
fn ranges_of_one_value_and_of_everything() {
    let s = Schema::new(vec![Field::range("p", 2)]).unwrap();
    let one = s.parse_rule("p 80", 0).unwrap();
    assert_eq!(one.bounds(), &[(80, 80)]);
    assert!(one.matches(&s.packet(&[80]).unwrap()));
    assert!(!one.matches(&s.packet(&[81]).unwrap()));
    let all = s.parse_rule("p 0-65535", 0).unwrap();
    assert_eq!(all, s.parse_rule("p *", 0).unwrap());
    assert_eq!(all, s.rule(0).build().unwrap());
    let high = s.parse_rule("p 1024-65535", 0).unwrap();
    assert!(high.matches(&s.packet(&[1024]).unwrap()));
    assert!(high.matches(&s.packet(&[65535]).unwrap()));
    assert!(!high.matches(&s.packet(&[1023]).unwrap()));
    // The bits every value shares: 0 for 1024-65535, 6 for 1024-2047.
    assert_eq!(high.prefix_lengths(&s)[0], 0);
    assert_eq!(
        s.parse_rule("p 1024-2047", 0).unwrap().prefix_lengths(&s)[0],
        6
    );
    assert_eq!(one.prefix_lengths(&s)[0], 16);
}

#[test]
fn clones_share_intervals_and_the_map_keeps_a_rule_its_caller_dropped() {
    let s = five_tuple();
    let rule = s
        .parse_rule("src 10.0.0.0/8, dport 1-1024, proto 6", 3)
        .unwrap();
    let clone = rule.clone();
    assert!(std::ptr::eq(rule.bounds(), clone.bounds()));
    let copy = rule.unshared();
    assert_eq!(copy, rule);
    assert!(!std::ptr::eq(rule.bounds(), copy.bounds()));
    // The map's entry shares the caller's intervals, and keeps them
    // once the caller's rule and its clone are gone.
    let m = WildcardMap::new(s.clone(), 4, 8).unwrap();
    m.insert(&rule, &v(9), BPF_NOEXIST).unwrap();
    drop((rule, clone));
    let p = s
        .parse_packet("src 10.1.2.3, dst 10.0.0.2, sport 5, dport 80, proto 6")
        .unwrap();
    assert_eq!(answer(&m, &p), Some((copy.clone(), v(9).to_vec())));
    assert_eq!(m.rules(), vec![(copy.clone(), v(9).to_vec())]);
    m.remove(&copy).unwrap();
    assert_eq!(answer(&m, &p), None);
}

#[test]
fn a_packet_value_wider_than_its_field_matches_nothing() {
    // `Packet::values` are public: a caller can hand in a value wider
    // than the field, and wider than the word the map's chains hold
    // (32 bits for these fields, 64 for an 8-byte one). Cut to the word,
    // such a value would read as a small one and match.
    // With a collision limit of 1 the two rules split into two tables:
    // `classify_many`'s pipeline of several tables, beside its one.
    for (size, word_bits, limit, tables) in
        [(2, 32, 48, 1), (8, 64, 48, 1), (2, 32, 1, 2), (8, 64, 1, 2)]
    {
        let s = Schema::new(vec![Field::range("p", size), Field::exact("proto", 1)]).unwrap();
        let m = WildcardMap::with_collision_limit(s.clone(), 4, 10, limit).unwrap();
        let everything = s.parse_rule("p *, proto 6", 1).unwrap();
        let five = s.parse_rule("p 5, proto 6", 0).unwrap();
        m.insert(&everything, &v(1), BPF_NOEXIST).unwrap();
        m.insert(&five, &v(0), BPF_NOEXIST).unwrap();
        let packet = |p: u128| {
            let mut k = Packet::default();
            k.values[..2].copy_from_slice(&[p, 6]);
            k
        };
        assert_eq!(answer(&m, &packet(5)).unwrap().1, v(0));
        assert_eq!(answer(&m, &packet(7)).unwrap().1, v(1));
        for wide in [(1 << word_bits) + 5, u128::MAX - 250, 1 << (8 * size)] {
            assert_eq!(
                answer(&m, &packet(wide)),
                None,
                "{wide:#x}, {size}-byte field"
            );
        }
        assert_eq!(m.tables(), tables);
        let wide = (1 << word_bits) + 5;
        let mixed = [
            packet(5),
            packet(wide),
            packet(7),
            packet(u128::MAX - 250),
            packet(5),
        ];
        let mut out = [None; 5];
        let guard = pin();
        m.classify_many(&mixed, &guard, &mut out).unwrap();
        let values: Vec<_> = out.iter().map(|o| o.map(|(_, v)| v.to_vec())).collect();
        let (zero, one) = (Some(v(0).to_vec()), Some(v(1).to_vec()));
        assert_eq!(
            values,
            [zero.clone(), None, one, None, zero],
            "{size}-byte field"
        );
    }
}

#[test]
fn wildcard_match_zero_is_anything_and_match_needs_a_value() {
    let s = Schema::new(vec![Field::wildcard("id", 4), Field::exact("proto", 1)]).unwrap();
    let any_id = s.parse_rule("id 0, proto 6", 0).unwrap();
    assert_eq!(any_id.bounds()[0], (0, u32::MAX as u128));
    assert!(any_id.matches(&s.packet(&[12345, 6]).unwrap()));
    assert!(!any_id.matches(&s.packet(&[12345, 17]).unwrap()));
    let one_id = s.parse_rule("id 7, proto 6", 0).unwrap();
    assert!(one_id.matches(&s.packet(&[7, 6]).unwrap()));
    assert!(!one_id.matches(&s.packet(&[8, 6]).unwrap()));
    // An exact-match field left out, or set to anything, is refused.
    assert!(matches!(s.parse_rule("id 7", 0), Err(Error::Invalid(_))));
    assert!(matches!(
        s.parse_rule("id 7, proto *", 0),
        Err(Error::Invalid(_))
    ));
    // Zero is a value for a plain exact match.
    let zero = s.parse_rule("proto 0", 0).unwrap();
    assert!(zero.matches(&s.packet(&[1, 0]).unwrap()));
    assert!(!zero.matches(&s.packet(&[1, 6]).unwrap()));
}

#[test]
fn bad_schemas_rules_and_keys_are_refused() {
    let ok = |n: usize| {
        (0..n)
            .map(|i| Field::exact(&format!("f{i}"), 1))
            .collect::<Vec<_>>()
    };
    assert!(Schema::new(ok(9)).is_ok());
    assert!(Schema::new(ok(10)).is_err());
    assert!(Schema::new(vec![]).is_err());
    assert!(Schema::new(vec![Field::prefix("a", 17)]).is_err());
    assert!(Schema::new(vec![Field::prefix("a", 0)]).is_err());
    assert!(Schema::new(vec![Field::range("a", 9)]).is_err());
    assert!(Schema::new(vec![Field::range("a", 8)]).is_ok());
    assert!(Schema::new(vec![Field::exact("a", 1), Field::exact("a", 2)]).is_err());
    assert!(Schema::new(vec![Field::exact("a b", 1)]).is_err());

    let s = five_tuple();
    for bad in [
        "sport 10-9",      // min > max
        "src 10.0.0.0/33", // prefix too long
        "sport 70000",     // too wide
        "proto 256",       // too wide
        "nosuch 1",        // no such field
        "src",             // no value
        "src ten",         // not a value
        "dport 1-2-3",     // not a range
    ] {
        assert!(
            matches!(s.parse_rule(bad, 0), Err(Error::Invalid(_))),
            "{bad:?} was accepted"
        );
    }
    assert!(
        s.rule(0).range("src", 1, 2).build().is_err(),
        "range on a prefix"
    );
    assert!(
        s.rule(0).prefix("sport", 1, 2).build().is_err(),
        "prefix on a range"
    );
    assert!(s.packet(&[1, 2, 3, 4]).is_err());
    assert!(s.packet(&[1, 2, 3, 4, 256]).is_err());
    assert!(s.packet_from_bytes(&[0; 12]).is_err());
    let p = s
        .packet_from_bytes(&[10, 0, 0, 1, 192, 0, 2, 1, 0, 80, 1, 187, 6])
        .unwrap();
    assert_eq!(
        p,
        s.parse_packet("src 10.0.0.1, dst 192.0.2.1, sport 80, dport 443, proto 6")
            .unwrap()
    );
    let key = [10, 0, 0, 1, 192, 0, 2, 1, 0, 80, 1, 187, 6];
    assert_eq!(s.packet_key(&p), key);
    // Keys of another length than the schema's are refused, whichever
    // engine classifies.
    let m = WildcardMap::new(s.clone(), 4, 10).unwrap();
    let prefix_only = Schema::new(vec![Field::prefix("addr", 4)]).unwrap();
    let geo = WildcardMap::new(prefix_only, 4, 10).unwrap();
    let guard = pin();
    for bad in [&key[..12], &[0; 14][..], &[]] {
        assert!(matches!(
            m.classify_key(bad, &guard),
            Err(Error::Invalid(_))
        ));
    }
    assert_eq!(m.classify_key(&key, &guard), Ok(None));
    assert!(matches!(
        geo.classify_key(&key[..3], &guard),
        Err(Error::Invalid(_))
    ));
    assert_eq!(geo.classify_key(&key[..4], &guard), Ok(None));
}

#[test]
fn update_flags_full_map_and_bad_input_leave_the_map_unchanged() {
    let s = five_tuple();
    let m = WildcardMap::new(s.clone(), 4, 2).unwrap();
    let r1 = s.parse_rule("src 10.0.0.0/8", 1).unwrap();
    let r2 = s.parse_rule("dport 22", 2).unwrap();
    let r3 = s.parse_rule("proto 17/8", 3).unwrap();
    assert_eq!(m.insert(&r1, &v(1), BPF_EXIST), Err(Error::NotFound));
    m.insert(&r1, &v(1), BPF_NOEXIST).unwrap();
    assert_eq!(m.insert(&r1, &v(9), BPF_NOEXIST), Err(Error::Exists));
    m.insert(&r1, &v(11), BPF_EXIST).unwrap();
    m.insert(&r2, &v(2), BPF_ANY).unwrap();
    assert_eq!(m.insert(&r3, &v(3), BPF_ANY), Err(Error::Full));
    // A full map still takes new values for its rules.
    m.insert(&r2, &v(22), BPF_ANY).unwrap();
    assert!(matches!(m.insert(&r3, &v(3), 4), Err(Error::Invalid(_))));
    assert!(matches!(
        m.insert(&r1, &[1, 2, 3], BPF_ANY),
        Err(Error::Invalid(_))
    ));
    let other = Schema::new(vec![Field::prefix("src", 4)]).unwrap();
    let foreign = other.parse_rule("src 10.0.0.0/8", 1).unwrap();
    assert!(matches!(
        m.insert(&foreign, &v(1), BPF_ANY),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(m.remove(&foreign), Err(Error::Invalid(_))));
    assert_eq!(m.remove(&r3), Err(Error::NotFound));
    assert_eq!(m.len(), 2);
    let guard = pin();
    assert_eq!(m.get(&r1, &guard), Some(&v(11)[..]));
    assert_eq!(m.get(&r2, &guard), Some(&v(22)[..]));
    assert_eq!(m.get(&r3, &guard), None);
    assert_eq!(
        m.rules(),
        vec![(r1.clone(), v(11).to_vec()), (r2.clone(), v(22).to_vec())]
    );
    assert_eq!(m.take(&r1), Ok(v(11).to_vec()));
    assert_eq!(m.get(&r1, &guard), None);
    m.insert(&r3, &v(3), BPF_NOEXIST).unwrap();
    m.clear();
    assert!(m.is_empty());
    assert_eq!(m.rules(), vec![]);
    let p = s
        .parse_packet("src 10.0.0.1, dst 1.1.1.1, sport 1, dport 22, proto 17")
        .unwrap();
    assert_eq!(m.classify(&p, &guard), None);
    assert!(WildcardMap::new(s.clone(), 0, 1).is_err());
    assert!(WildcardMap::new(s, 4, 0).is_err());
}

#[test]
fn load_is_all_or_nothing_and_keeps_the_update_flags() {
    let s = five_tuple();
    let m = WildcardMap::new(s.clone(), 4, 3).unwrap();
    let r1 = s.parse_rule("src 10.0.0.0/8", 1).unwrap();
    let r2 = s.parse_rule("dport 22", 2).unwrap();
    let r3 = s.parse_rule("proto 17/8", 3).unwrap();
    let r4 = s.parse_rule("sport 53", 4).unwrap();
    m.insert(&r1, &v(1), BPF_ANY).unwrap();
    let unchanged = |m: &WildcardMap| {
        assert_eq!(m.rules(), vec![(r1.clone(), v(1).to_vec())]);
    };
    // Each refusal leaves the map as it was.
    let some = [(&r2, v(2)), (&r1, v(9))];
    assert_eq!(m.load(some, BPF_NOEXIST), Err(Error::Exists));
    unchanged(&m);
    let twice = [(&r2, v(2)), (&r2, v(3))];
    assert_eq!(m.load(twice, BPF_NOEXIST), Err(Error::Exists));
    unchanged(&m);
    assert_eq!(m.load([(&r2, v(2))], BPF_EXIST), Err(Error::NotFound));
    unchanged(&m);
    let three = [(&r2, v(2)), (&r3, v(3)), (&r4, v(4))];
    assert_eq!(m.load(three, BPF_ANY), Err(Error::Full));
    unchanged(&m);
    assert!(matches!(m.load([(&r2, v(2))], 4), Err(Error::Invalid(_))));
    let short: [(&Rule, &[u8]); 2] = [(&r2, &[2]), (&r3, &[3, 0, 0, 0])];
    assert!(matches!(m.load(short, BPF_ANY), Err(Error::Invalid(_))));
    let other = Schema::new(vec![Field::prefix("src", 4)]).unwrap();
    let foreign = other.parse_rule("src 10.0.0.0/8", 1).unwrap();
    let mixed = [(&r2, v(2)), (&foreign, v(5))];
    assert!(matches!(m.load(mixed, BPF_ANY), Err(Error::Invalid(_))));
    unchanged(&m);
    // Accepted: a rule given twice keeps its last value, a held one
    // takes its new value (with BPF_ANY, and with BPF_EXIST).
    let batch = [(&r2, v(2)), (&r1, v(11)), (&r2, v(22))];
    m.load(batch, BPF_ANY).unwrap();
    assert_eq!(
        m.rules(),
        vec![(r1.clone(), v(11).to_vec()), (r2.clone(), v(22).to_vec())]
    );
    m.load([(&r2, v(7))], BPF_EXIST).unwrap();
    m.load(Vec::<(Rule, [u8; 4])>::new(), BPF_NOEXIST).unwrap();
    m.load([(r3.clone(), v(3))], BPF_NOEXIST).unwrap();
    assert_eq!(m.len(), 3);
    let guard = pin();
    assert_eq!(m.get(&r2, &guard), Some(&v(7)[..]));
    assert_eq!(m.get(&r3, &guard), Some(&v(3)[..]));
}

/// A load into an empty map builds the writer's index of rules after
/// the rules are placed (`Writer::place_all`): the updates after it find
/// each loaded rule, and record their own.
#[test]
fn a_load_into_an_empty_map_leaves_books_the_updates_after_it_use() {
    let s = five_tuple();
    let n = crate::scaled(300, 30) as u32;
    let rule = |i: u32| {
        s.rule(i % 4)
            .prefix("src", u128::from(0x0a00_0000 + ((i % 7) << 8)), 24)
            .exact("dport", u128::from(i))
            .build()
            .unwrap()
    };
    let m = WildcardMap::new(s.clone(), 4, 2 * n).unwrap();
    // And with a collision limit low enough for the load to split.
    let tight = WildcardMap::with_collision_limit(s.clone(), 4, 2 * n, 2).unwrap();
    for m in [&m, &tight] {
        m.load((0..n).map(|i| (rule(i), v(i))), BPF_NOEXIST)
            .unwrap();
        m.check_structure();
        let guard = pin();
        // Each loaded rule found by the index: its value, its removal.
        for i in (0..n).step_by(3) {
            assert_eq!(m.get(&rule(i), &guard), Some(&v(i)[..]));
            assert_eq!(m.take(&rule(i)), Ok(v(i).to_vec()));
        }
        // New rules recorded as they come.
        for i in n..n + 20 {
            m.insert(&rule(i), &v(i), BPF_NOEXIST).unwrap();
        }
        assert_eq!(m.insert(&rule(1), &v(1), BPF_NOEXIST), Err(Error::Exists));
        m.check_structure();
        let mut want: Vec<Rule> = (0..n + 20)
            .filter(|i| i >= &n || i % 3 != 0)
            .map(rule)
            .collect();
        want.sort();
        let held: Vec<Rule> = m.rules().into_iter().map(|(r, _)| r).collect();
        assert_eq!(held, want);
        let mut walked = Vec::new();
        let mut at = None;
        while let Some(next) = m.next_rule(at.as_ref()) {
            walked.push(next.clone());
            at = Some(next);
        }
        assert_eq!(walked, want, "get_next_key's order");
    }
}

/// `get_next_key`'s walk between updates (the rule order is built by a
/// walk and kept beside the updates after it until they wear it out,
/// `order.rs`): each step gives the model's next rule, from any rule,
/// held or not, across inserts, replacements, removals and rebuilds.
/// Not under Miri: the walk is safe code under the writer lock
/// (`order.rs`), and the oracle tests take the updates' unsafe paths
/// there (this test was 74 s of Miri's wall time, docs/testing.md).
#[test]
#[cfg_attr(miri, ignore = "safe code: the rule order under the writer lock")]
fn walks_between_updates_give_the_next_rule_held() {
    use rand::{Rng, SeedableRng};
    use std::ops::Bound::{Excluded, Unbounded};
    let s = five_tuple();
    let pool = crate::scaled(400, 60) as u32;
    let rule = |i: u32| {
        s.rule(i % 5)
            .prefix("src", u128::from(0x0a00_0000 + (i << 8)), 24)
            .build()
            .unwrap()
    };
    let m = WildcardMap::new(s.clone(), 4, pool).unwrap();
    let mut model = BTreeMap::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut at: Option<Rule> = None;
    for step in 0..crate::scaled(6000, 600) as u32 {
        let i = rng.random_range(0..pool);
        match rng.random_range(0..8) {
            0 | 1 => {
                m.insert(&rule(i), &v(step), BPF_ANY).unwrap();
                model.insert(rule(i), step);
            }
            2 | 3 => {
                let want = model.remove(&rule(i)).map(v).map(|x| x.to_vec());
                assert_eq!(m.take(&rule(i)).ok(), want);
            }
            4 => at = rng.random_bool(0.5).then(|| rule(i)),
            _ => {
                let lower = at.as_ref().map_or(Unbounded, Excluded);
                let want = model.range((lower, Unbounded)).next().map(|(r, _)| r);
                let got = m.next_rule(at.as_ref());
                assert_eq!(got.as_ref(), want, "step {step}");
                at = got;
            }
        }
        if step % 61 == 0 {
            m.check_structure();
        }
    }
    m.check_structure();
}

#[test]
fn ties_go_to_the_first_rule_in_rule_order_whatever_the_insert_order() {
    let s = five_tuple();
    let a = s.parse_rule("src 10.0.0.0/8", 5).unwrap();
    let b = s.parse_rule("dst 10.0.0.0/8", 5).unwrap();
    let better = s.parse_rule("sport 1-9", 4).unwrap();
    let p = s
        .parse_packet("src 10.0.0.1, dst 10.0.0.2, sport 5, dport 1, proto 6")
        .unwrap();
    let first = a.clone().min(b.clone());
    for order in [[&a, &b], [&b, &a]] {
        let m = WildcardMap::new(s.clone(), 4, 10).unwrap();
        let mut o = BruteForce::new();
        for (i, r) in order.iter().enumerate() {
            m.insert(r, &v(i as u32), BPF_ANY).unwrap();
            o.insert((*r).clone(), &v(i as u32));
        }
        assert_eq!(answer(&m, &p).unwrap().0, first);
        assert_eq!(answer(&m, &p), oracle_answer(&o, &p));
        m.insert(&better, &v(9), BPF_ANY).unwrap();
        assert_eq!(answer(&m, &p).unwrap().0, better);
    }
}
