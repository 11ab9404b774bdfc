use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;

use super::*;
use crate::core::error::Error;
use crate::wildcard::schema::{MAX_FIELD_SIZE, MAX_FIELDS};
use crate::{BPF_ANY, BPF_EXIST, BPF_NOEXIST, pin};

fn five_tuple() -> Schema {
    classbench::schema()
}

fn v(x: u32) -> [u8; 4] {
    x.to_ne_bytes()
}

/// A schema of two exact fields, `id` and `port`, whose rule `i`
/// ([`id_port_rule`]) matches id `i` on port `i % 7`: as many rules of
/// one table as a test wants.
fn id_port() -> Schema {
    Schema::new(vec![Field::exact("id", 4), Field::exact("port", 2)]).unwrap()
}

/// Rule `i` of [`id_port`]'s schema.
fn id_port_rule(s: &Schema, i: u32) -> Rule {
    s.rule(1)
        .exact("id", u128::from(i))
        .exact("port", u128::from(i % 7))
        .build()
        .unwrap()
}

/// The packet rule `i` of [`id_port`]'s schema matches.
fn id_port_packet(s: &Schema, i: u32) -> Packet {
    s.packet(&[u128::from(i), u128::from(i % 7)]).unwrap()
}

/// The map's answer for `p`: the rule and its value.
fn answer(m: &WildcardMap, p: &Packet) -> Option<(Rule, Vec<u8>)> {
    let guard = pin();
    m.classify(p, &guard).map(|(r, v)| (r.clone(), v.to_vec()))
}

/// `m`'s structure checked after step `i` of `steps`: after every step
/// natively; under Miri after every fourth and the last, since the check
/// is safe code and was most of those tests' interpreted time.
fn check_after(m: &WildcardMap, i: usize, steps: usize) {
    if !cfg!(miri) || i % 4 == 3 || i + 1 == steps {
        m.check_structure();
    }
}

fn oracle_answer(o: &BruteForce, p: &Packet) -> Option<(Rule, Vec<u8>)> {
    o.classify(p).map(|(r, v)| (r.clone(), v.to_vec()))
}

/// `rules` loaded into `m` (each valued by its priority) and into an
/// oracle, which it returns; `m`'s structure checked.
fn load_both<'a>(m: &WildcardMap, rules: impl IntoIterator<Item = &'a Rule> + Clone) -> BruteForce {
    m.load(
        rules.clone().into_iter().map(|r| (r, v(r.priority))),
        BPF_NOEXIST,
    )
    .unwrap();
    m.check_structure();
    let mut o = BruteForce::new();
    for r in rules {
        o.insert(r.clone(), &v(r.priority));
    }
    o
}

/// Each rule's two corners (every field at its low bound, then its
/// high) classified by `m` as by the oracle `o`.
fn corners_as_the_oracle<'a>(
    m: &WildcardMap,
    o: &BruteForce,
    rules: impl IntoIterator<Item = &'a Rule>,
) {
    for r in rules {
        let (lo, hi): (Vec<u128>, Vec<u128>) = r.bounds().iter().copied().unzip();
        for values in [lo, hi] {
            let p = m.schema().packet(&values).unwrap();
            assert_eq!(answer(m, &p), oracle_answer(o, &p), "{values:?}");
        }
    }
}

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

#[test]
fn overflowing_buckets_split_tables_and_answers_stay_right() {
    // 200 rules that share a /8 source and differ in their /24 source:
    // one relaxed table hashes 8 bits of it, so their bucket overflows
    // until a split hashes more.
    let s = five_tuple();
    let m = WildcardMap::with_collision_limit(s.clone(), 4, 1000, 4).unwrap();
    let mut o = BruteForce::new();
    let n = crate::scaled(200, 24) as u32;
    let rules: Vec<Rule> = (0..n)
        .map(|i| {
            s.rule(i)
                .prefix(
                    "src",
                    0x0a00_0000 | u128::from(i) << 8,
                    if i == 0 { 8 } else { 24 },
                )
                .build()
                .unwrap()
        })
        .collect();
    for (i, r) in rules.iter().enumerate() {
        m.insert(r, &v(i as u32), BPF_NOEXIST).unwrap();
        o.insert(r.clone(), &v(i as u32));
        check_after(&m, i, rules.len());
    }
    assert!(m.tables() >= 2, "{} tables", m.tables());
    let guard = pin();
    for i in 0..n {
        let p = s
            .packet(&[0x0a00_0001 | u128::from(i) << 8, 1, 2, 3, 6])
            .unwrap();
        assert_eq!(answer(&m, &p), oracle_answer(&o, &p), "packet {i}");
        let (_, probed) = m.classify_counting(&p, &guard);
        assert!(probed <= m.tables());
    }
    let removed = rules.len().div_ceil(3);
    for (i, r) in rules.iter().step_by(3).enumerate() {
        m.remove(r).unwrap();
        o.remove(r);
        check_after(&m, i, removed);
    }
    for i in 0..n {
        let p = s
            .packet(&[0x0a00_0001 | u128::from(i) << 8, 1, 2, 3, 6])
            .unwrap();
        assert_eq!(
            answer(&m, &p),
            oracle_answer(&o, &p),
            "packet {i} after removals"
        );
    }
    let want: Vec<(Rule, Vec<u8>)> = o.iter().map(|(r, v)| (r.clone(), v.to_vec())).collect();
    assert_eq!(m.rules(), want);
}

/// A reader that loaded the view before a split (one table) and reads
/// the old table's bucket after the split took its rules out must still
/// find a rule that was held throughout: the split is run in that window
/// (`map::IN_THE_WINDOW`), for each reader of the view.
#[test]
fn a_reader_of_the_view_before_a_split_still_finds_the_rules_it_moved() {
    let s = five_tuple();
    let src = |addr: u128, len: u32, priority: u32| {
        s.rule(priority).prefix("src", addr, len).build().unwrap()
    };
    // Two rules in one bucket of one table (the limit); a third splits
    // it, and the /16 and /24 move to a new table of /16 sources. A rule
    // in another bucket keeps the table from growing (a new table
    // object, which a reader of the old view would read unchanged) at
    // that insert.
    let held = [
        src(0x0a00_0000, 8, 30),
        src(0x0a01_0100, 24, 10),
        src(0x1400_0000, 8, 40),
    ];
    let splitting = src(0x0a01_0000, 16, 20);
    let packet = s.packet(&[0x0a01_0101, 1, 2, 3, 6]).unwrap();
    let fresh = || {
        let m = Arc::new(WildcardMap::with_collision_limit(s.clone(), 4, 10, 2).unwrap());
        for r in &held {
            m.insert(r, &v(r.priority), BPF_NOEXIST).unwrap();
        }
        assert_eq!(m.tables(), 1);
        let (m2, r) = (Arc::clone(&m), splitting.clone());
        map::IN_THE_WINDOW.set(Some(Box::new(move || {
            m2.insert(&r, &v(r.priority), BPF_NOEXIST).unwrap();
            assert_eq!(m2.tables(), 2, "the insert splits the table");
        })));
        m
    };
    let best = Some((held[1].clone(), v(10).to_vec()));
    let owned = |found: Option<(&Rule, &[u8])>| found.map(|(r, v)| (r.clone(), v.to_vec()));
    // The reader ran the split in its window (a reader that skipped the
    // hook would pass without the window opened).
    let split_in_window = |m: &WildcardMap| {
        assert!(map::IN_THE_WINDOW.take().is_none(), "the hook ran");
        assert_eq!(m.tables(), 2);
    };
    // Each reader's miss is named, not the first alone.
    let mut missed = Vec::new();
    let guard = pin();

    let m = fresh();
    if answer(&m, &packet) != best {
        missed.push("classify");
    }
    split_in_window(&m);
    m.check_structure();

    let m = fresh();
    let key = s.packet_key(&packet);
    if owned(m.classify_key(&key, &guard).unwrap()) != best {
        missed.push("classify_key");
    }
    split_in_window(&m);

    let m = fresh();
    let mut out = [None];
    m.classify_many(std::slice::from_ref(&packet), &guard, &mut out)
        .unwrap();
    if owned(out[0]) != best {
        missed.push("classify_many");
    }
    split_in_window(&m);

    let m = fresh();
    let mut out = [None];
    m.classify_many_keys(&key, &guard, &mut out).unwrap();
    if owned(out[0]) != best {
        missed.push("classify_many_keys");
    }
    split_in_window(&m);

    let m = fresh();
    if m.get(&held[1], &guard) != Some(&v(10)[..]) {
        missed.push("get");
    }
    split_in_window(&m);

    let m = fresh();
    let mut all = m.rules();
    all.retain(|(r, _)| *r != splitting);
    // In rule order: the /24 (priority 10) first.
    let want: Vec<_> = [&held[1], &held[0], &held[2]]
        .into_iter()
        .map(|r| (r.clone(), v(r.priority).to_vec()))
        .collect();
    if all != want {
        missed.push("rules");
    }
    split_in_window(&m);
    assert!(missed.is_empty(), "missed a moving rule: {missed:?}");
}

#[test]
fn a_split_on_an_exact_field_hashes_all_its_bits() {
    // A rule of any identity makes a table that hashes the direction
    // alone; identities 1-24 then overflow its bucket. Their rules fix
    // all 32 bits of the identity or none, so the split's table hashes
    // all 32: half of them (the split's step for a prefix) would put
    // every identity under 2^16 in one bucket again.
    let s = Schema::new(vec![Field::wildcard("id", 4), Field::exact("dir", 1)]).unwrap();
    let m = WildcardMap::with_collision_limit(s.clone(), 4, 100, 4).unwrap();
    let mut o = BruteForce::new();
    let rule = |id: u32| {
        s.rule(id)
            .exact("id", id.into())
            .exact("dir", 0)
            .build()
            .unwrap()
    };
    let ids = 25;
    for id in 0..ids {
        m.insert(&rule(id), &v(id), BPF_NOEXIST).unwrap();
        o.insert(rule(id), &v(id));
        check_after(&m, id as usize, ids as usize);
    }
    let tuples = m.tuples();
    assert!(tuples.contains(&vec![32, 8]), "{tuples:?}");
    assert!(tuples.iter().all(|t| t[0] == 0 || t[0] == 32), "{tuples:?}");
    for id in 0..30u32 {
        let p = s.packet(&[id.into(), 0]).unwrap();
        assert_eq!(answer(&m, &p), oracle_answer(&o, &p), "identity {id}");
    }
}

#[test]
fn load_gathers_rules_of_a_tied_priority_that_fit_neither_table() {
    // Cilium's mixed policy (the `wildcard-cilium` suite's): half the
    // rules exact (priority 0), the rest leaving out some of identity,
    // port and protocol (priorities 1-5, in Cilium's order), a third of
    // the ports blocks of 2-16. Rules of one priority can land in
    // tables whose tuples the others do not fit, and every packet they
    // answer probes each such table. After the load no two tables share
    // a best priority, and every answer is the oracle's.
    let s = Schema::new(vec![
        Field::wildcard("id", 4),
        Field::range("dport", 2),
        Field::wildcard("proto", 1),
        Field::exact("dir", 1),
    ])
    .unwrap();
    // A seed whose set, loaded without the gather, left three tables
    // tied at priority 1.
    let mut seed = 1u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // Cilium's lookups' patterns, most specific first: which of
    // identity, port and protocol each leaves out.
    let patterns = [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (true, true, false),
        (false, true, true),
        (true, true, true),
    ];
    let n = crate::scaled(1000, 48) as u64;
    let ids: Vec<u128> = (0..n / 8).map(|_| 1 + u128::from(next(1 << 24))).collect();
    let mut rules = std::collections::BTreeSet::new();
    for i in 0..n {
        let pattern = if i % 2 == 0 { 0 } else { 1 + next(5) as usize };
        let (any_id, any_port, any_proto) = patterns[pattern];
        let mut b = s.rule(pattern as u32).exact("dir", next(2).into());
        if !any_id {
            b = b.exact("id", ids[next(ids.len() as u64) as usize]);
        }
        if !any_port {
            let (lo, hi) = if next(10) < 3 {
                let width = 1u128 << (1 + next(4));
                let lo = (1 + u128::from(next(65535)) / width) * width;
                (lo, (lo + width - 1).min(65535))
            } else {
                let port = 1 + u128::from(next(65535));
                (port, port)
            };
            b = b.range("dport", lo, hi);
        }
        if !any_proto {
            b = b.exact("proto", [6, 17, 1, 132][next(4) as usize]);
        }
        rules.insert(b.build().unwrap());
    }
    let m = WildcardMap::new(s.clone(), 4, rules.len() as u32).unwrap();
    let o = load_both(&m, &rules);
    let bests = m.bests();
    let mut distinct = bests.clone();
    distinct.dedup();
    assert_eq!(bests, distinct, "tables {:?}", m.tuples());
    corners_as_the_oracle(&m, &o, &rules);
}

#[test]
fn load_splits_a_table_whose_buckets_its_tuple_cannot_tell_apart() {
    // acl1's shape: sources from two /24s, each rule its own /16
    // destination. The first rule's table hashes 22 bits of the source
    // and none of the destination (16 bits is more than 4 shorter than
    // the source's 24), so every rule falls in one of two buckets; all
    // fix the same bits, so no bucket's split tells them apart. A few
    // rules of worse priority leave the destination out. After the load
    // the destinations are hashed: no bucket holds more than the wide
    // rules of one source, and every answer is the oracle's.
    let s = Schema::new(vec![Field::prefix("src", 4), Field::prefix("dst", 4)]).unwrap();
    let n = crate::scaled(200, 40) as u32;
    let mut rules = Vec::new();
    for i in 0..n {
        let src = 0x0a00_0000 | ((i % 2) << 8);
        let wide = i % 20 == 19;
        let b = s.rule(if wide { n + i } else { i });
        let b = b.prefix("src", src.into(), 24);
        let b = if wide {
            b
        } else {
            b.prefix("dst", (0xac00_0000 | (i << 16)).into(), 16)
        };
        rules.push(b.build().unwrap());
    }
    let m = WildcardMap::new(s.clone(), 4, n).unwrap();
    let o = load_both(&m, &rules);
    let longest = m.longest_bucket();
    assert!(
        longest <= n as usize / 10,
        "{longest}: tables {:?}",
        m.tuples()
    );
    corners_as_the_oracle(&m, &o, &rules);
}

#[test]
fn load_merges_a_table_into_a_coarser_one_its_rules_fit() {
    // Exact ports, then aligned blocks of 16: inserted in that order, the
    // first rule's table hashes all 16 bits of the port and the blocks,
    // which fix 12, need a table of their own; loaded, the exact ports'
    // table merges into the blocks' (its rules fit it, and its buckets
    // stay short).
    let s = Schema::new(vec![Field::range("dport", 2), Field::exact("proto", 1)]).unwrap();
    let rule = |i: u32| {
        let (lo, hi) = if i.is_multiple_of(2) {
            (i * 64, i * 64)
        } else {
            (i * 64, i * 64 + 15)
        };
        s.rule(i % 3)
            .range("dport", u128::from(lo), u128::from(hi))
            .exact("proto", 6)
            .build()
            .unwrap()
    };
    let n = crate::scaled(200, 24) as u32;
    let rules: Vec<Rule> = (0..n).map(rule).collect();
    let inserted = WildcardMap::new(s.clone(), 4, 1000).unwrap();
    for (i, r) in rules.iter().enumerate() {
        inserted.insert(r, &v(i as u32), BPF_NOEXIST).unwrap();
    }
    assert_eq!(inserted.tables(), 2);
    let loaded = WildcardMap::new(s.clone(), 4, 1000).unwrap();
    loaded
        .load(
            rules.iter().enumerate().map(|(i, r)| (r, v(i as u32))),
            BPF_NOEXIST,
        )
        .unwrap();
    loaded.check_structure();
    assert_eq!(loaded.tables(), 1);
    assert_eq!(loaded.rules(), inserted.rules());
    let guard = pin();
    for port in (0..u128::from(n) * 64 + 20).step_by(crate::scaled(1, 5)) {
        let p = s.packet(&[port, 6]).unwrap();
        assert_eq!(answer(&loaded, &p), answer(&inserted, &p), "port {port}");
        assert_eq!(loaded.classify_counting(&p, &guard).1, 1);
    }
    // Rules that would crowd one bucket stay apart: a block of 4,096
    // ports fixes 4 bits, and a table hashing those holds every exact
    // rule below it in one bucket.
    let wide = s
        .rule(9)
        .range("dport", 0, 4095)
        .exact("proto", 6)
        .build()
        .unwrap();
    loaded.load([(&wide, v(9))], BPF_NOEXIST).unwrap();
    loaded.check_structure();
    assert_eq!(loaded.tables(), 2);
}

#[test]
fn rules_of_a_priority_two_tables_share_move_into_one() {
    // Two tables whose best rules share priority 0: a packet matched at 0
    // in the first probes the second too (a tie goes on to the next
    // table). The first one's rules of priority 0 all fit the second's
    // tuple, so they move there, and such a packet probes one table.
    let s = Schema::new(vec![Field::wildcard("id", 1), Field::range("port", 2)]).unwrap();
    let m = WildcardMap::new(s.clone(), 4, 1000).unwrap();
    let n = crate::scaled(100, 12) as u32;
    let mut o = BruteForce::new();
    let mut add = |r: Rule| {
        let value = v(o.len() as u32);
        m.insert(&r, &value, BPF_NOEXIST).unwrap();
        o.insert(r, &value);
    };
    // By identity (priority 1), then by port (priority 2): two tables.
    for i in 1..=n {
        add(s.rule(1).exact("id", i.into()).any("port").build().unwrap());
    }
    for i in 1..=n {
        add(s
            .rule(2)
            .range("port", (1000 + i).into(), (1000 + i).into())
            .build()
            .unwrap());
    }
    // Exact rules of priority 0 fit both and go to the first in order,
    // the identity table; a rule of priority 0 by port alone fits the
    // port table only.
    for i in 1..=n {
        let port = u128::from(5000 + i);
        add(s
            .rule(0)
            .exact("id", i.into())
            .range("port", port, port)
            .build()
            .unwrap());
    }
    add(s.rule(0).range("port", 999, 999).build().unwrap());
    assert_eq!(m.tables(), 2);
    let guard = pin();
    let exact = |i: u128| s.packet(&[i, 5000 + i]).unwrap();
    assert_eq!(m.classify_counting(&exact(7), &guard).1, 2);
    m.absorb_all();
    m.check_structure();
    assert_eq!(m.tables(), 2);
    for i in 1..=u128::from(n) {
        assert_eq!(
            answer(&m, &exact(i)),
            oracle_answer(&o, &exact(i)),
            "id {i}"
        );
        assert_eq!(m.classify_counting(&exact(i), &guard).1, 1, "id {i}");
    }
    for (id, port) in [(3, 1003), (3, 999), (0, 999), (4, 7), (0, 1050)] {
        let p = s.packet(&[id, port]).unwrap();
        assert_eq!(answer(&m, &p), oracle_answer(&o, &p), "{id} {port}");
    }
}

/// Two one-byte prefix fields, `a` and `b`, for the exit bounds' tests.
fn a_b() -> Schema {
    Schema::new(vec![Field::prefix("a", 1), Field::prefix("b", 1)]).unwrap()
}

/// A rule of [`a_b`] at priority `p`: each field a /8 of its value, or
/// anything.
fn a_b_rule(s: &Schema, p: u32, a: Option<u128>, b: Option<u128>) -> Rule {
    let r = s.rule(p);
    let r = match a {
        Some(a) => r.prefix("a", a, 8),
        None => r.any("a"),
    };
    let r = match b {
        Some(b) => r.prefix("b", b, 8),
        None => r.any("b"),
    };
    r.build().unwrap()
}

/// A map of [`a_b`] loaded with three rules: r1 (`a` 10, best of `a`'s
/// table), r2 (`b` 20, best of `b`'s) and r3 (`a` 30 and `b` 40, in
/// `a`'s table), which nothing of `b`'s table overlaps.
fn a_b_loaded() -> (Schema, WildcardMap, [Rule; 3]) {
    let s = a_b();
    let m = WildcardMap::new(s.clone(), 4, 100).unwrap();
    let rules = [
        a_b_rule(&s, 1, Some(10), None),
        a_b_rule(&s, 2, None, Some(20)),
        a_b_rule(&s, 3, Some(30), Some(40)),
    ];
    let values = [v(1), v(2), v(3)];
    m.load(rules.iter().zip(values), BPF_NOEXIST).unwrap();
    m.check_structure();
    assert_eq!(m.tables(), 2);
    (s, m, rules)
}

/// A load works out exit bounds: a match no rule of a later table can
/// beat stops the probe there. A rule added after voids them (it is
/// not counted in them) until the next load.
#[test]
fn a_loads_exit_bounds_stop_the_probe_and_an_insert_voids_them() {
    let (s, m, _) = a_b_loaded();
    let rule = |p, a, b| a_b_rule(&s, p, a, b);
    let guard = pin();
    let packet = s.packet(&[30, 40]).unwrap();
    let probe = |m: &WildcardMap| {
        let (hit, probed) = m.classify_counting(&packet, &guard);
        (hit.map(|(r, _)| r.priority), probed)
    };
    // Nothing of `b`'s table overlaps r3: one table probed, not two.
    assert_eq!(probe(&m), (Some(3), 1));
    // r4 beats r3 from `b`'s table: the bounds no longer hold.
    let r4 = rule(2, None, Some(40));
    m.insert(&r4, &v(4), BPF_NOEXIST).unwrap();
    m.check_structure();
    assert_eq!(probe(&m), (Some(2), 2));
    // A load (of nothing new) works them out again, r4 counted.
    m.load(Vec::<(Rule, [u8; 4])>::new(), BPF_NOEXIST).unwrap();
    m.check_structure();
    assert_eq!(probe(&m), (Some(2), 2));
    m.remove(&r4).unwrap();
    assert_eq!(
        probe(&m),
        (Some(3), 2),
        "a bound too high only costs a probe"
    );
}

#[test]
fn a_rule_taken_out_and_put_back_keeps_the_exit_bounds() {
    let (s, m, [r1, r2, r3]) = a_b_loaded();
    let rule = |p, a, b| a_b_rule(&s, p, a, b);
    let guard = pin();
    let probe = |m: &WildcardMap, a: u128, b: u128| {
        let (hit, probed) = m.classify_counting(&s.packet(&[a, b]).unwrap(), &guard);
        (hit.map(|(r, v)| (r.priority, v[0])), probed)
    };
    assert_eq!(probe(&m, 30, 40), (Some((3, 3)), 1));
    // r3 out and back: a rule of the set the bounds count, its bound
    // again.
    m.remove(&r3).unwrap();
    assert_eq!(probe(&m, 30, 40), (None, 2));
    m.insert(&r3, &v(33), BPF_NOEXIST).unwrap();
    m.check_structure();
    assert_eq!(probe(&m, 30, 40), (Some((3, 33)), 1));
    // A new value for it keeps its bound too.
    m.insert(&r3, &v(34), BPF_EXIST).unwrap();
    assert_eq!(probe(&m, 30, 40), (Some((3, 34)), 1));
    // r1 and r2 out and back, in the other order.
    m.remove(&r1).unwrap();
    m.remove(&r2).unwrap();
    m.insert(&r2, &v(2), BPF_NOEXIST).unwrap();
    m.insert(&r1, &v(1), BPF_NOEXIST).unwrap();
    m.check_structure();
    assert_eq!(probe(&m, 30, 40), (Some((3, 34)), 1));
    assert_eq!(probe(&m, 10, 20), (Some((1, 1)), 1));
    // A rule of no such set (r4 beats r3 from `b`'s table) voids them,
    // and a rule put back after that finds them void.
    let r4 = rule(2, None, Some(40));
    m.insert(&r4, &v(4), BPF_NOEXIST).unwrap();
    assert_eq!(probe(&m, 30, 40), (Some((2, 4)), 2));
    m.remove(&r3).unwrap();
    m.insert(&r3, &v(3), BPF_NOEXIST).unwrap();
    m.check_structure();
    assert_eq!(probe(&m, 30, 40), (Some((2, 4)), 2));
    // A load works them out again, over the rules held then: r4 removed
    // and put back keeps its own.
    m.load(Vec::<(Rule, [u8; 4])>::new(), BPF_NOEXIST).unwrap();
    m.remove(&r4).unwrap();
    assert_eq!(probe(&m, 30, 40), (Some((3, 3)), 2), "a bound too high");
    m.insert(&r4, &v(4), BPF_NOEXIST).unwrap();
    m.check_structure();
    assert_eq!(probe(&m, 30, 40), (Some((2, 4)), 2));
}

#[test]
#[cfg_attr(miri, ignore = "safe code; its 255 removals take minutes interpreted")]
fn a_map_emptied_rule_by_rule_voids_its_bounds_rather_than_keep_every_rule() {
    let s = a_b();
    let m = WildcardMap::new(s.clone(), 4, 1000).unwrap();
    // A table of `a` (best 1) and one of `b` (best 2), whose rule
    // overlaps none of the rules of `a` after the first.
    let first = a_b_rule(&s, 1, Some(10), None);
    let other = a_b_rule(&s, 2, None, Some(20));
    let filler: Vec<Rule> = (0..=255u32)
        .filter(|&a| a != 10)
        .map(|a| a_b_rule(&s, 100 + a, Some(u128::from(a)), Some(40)))
        .collect();
    let mut all = vec![(first, v(1)), (other, v(2))];
    all.extend(filler.iter().map(|r| (r.clone(), v(r.priority))));
    m.load(all, BPF_NOEXIST).unwrap();
    assert_eq!(m.tables(), 2);
    let guard = pin();
    let probed = |m: &WildcardMap| {
        let packet = s.packet(&[5, 40]).unwrap();
        let (hit, probed) = m.classify_counting(&packet, &guard);
        assert_eq!(hit.map(|(r, _)| r.priority), Some(105));
        probed
    };
    assert_eq!(probed(&m), 1, "rule 105's bound skips `b`'s table");
    // Rules taken out are remembered, up to half the rules held (or
    // 64); then the bounds are voided and the memory let go.
    let mut voided_at = None;
    for (k, r) in filler.iter().filter(|r| r.priority != 105).enumerate() {
        m.remove(r).unwrap();
        if k % 8 == 0 || (80..90).contains(&k) {
            m.check_structure();
        }
        if voided_at.is_none() && probed(&m) == 2 {
            voided_at = Some(k + 1);
        }
    }
    // 257 held at first: the k-th taken out voids them once the k - 1
    // remembered before it reach half the 257 - k left (85 of 171).
    assert_eq!(voided_at, Some(86));
}

#[test]
fn classify_many_answers_each_packet_and_wants_room() {
    let s = five_tuple();
    let m = WildcardMap::new(s.clone(), 4, 10).unwrap();
    m.insert(&s.parse_rule("proto 6/8", 1).unwrap(), &v(6), BPF_ANY)
        .unwrap();
    let tcp = s.packet(&[1, 2, 3, 4, 6]).unwrap();
    let udp = s.packet(&[1, 2, 3, 4, 17]).unwrap();
    let guard = pin();
    let mut out = [None; 2];
    m.classify_many(&[tcp, udp], &guard, &mut out).unwrap();
    assert_eq!(out[0].map(|(_, v)| v), Some(&v(6)[..]));
    assert_eq!(out[1], None);
    assert!(m.classify_many(&[tcp, udp], &guard, &mut out[..1]).is_err());
    // The same by keys; a partial key or too little room is refused.
    let keys = [s.packet_key(&tcp), s.packet_key(&udp)].concat();
    let mut by_keys = [None; 2];
    m.classify_many_keys(&keys, &guard, &mut by_keys).unwrap();
    assert_eq!(by_keys, out);
    for (bytes, room) in [(&keys[..25], 2), (&keys[..], 1)] {
        assert!(matches!(
            m.classify_many_keys(bytes, &guard, &mut by_keys[..room]),
            Err(Error::Invalid(_))
        ));
    }
    m.classify_many_keys(&[], &guard, &mut []).unwrap();
}

/// Past the buckets of 2^14 rules in its first table, `classify_many`
/// asks for a burst's buckets ahead: its answers stay `classify`'s, for
/// every packet of bursts that do not fill, hits and misses alike.
#[test]
#[cfg_attr(miri, ignore = "20,000 rules")]
fn classify_many_in_bursts_answers_as_classify() {
    let s = id_port();
    let m = WildcardMap::new(s.clone(), 4, 20_000).unwrap();
    let rule = |i: u32| id_port_rule(&s, i);
    m.load((0..20_000u32).map(|i| (rule(i), v(i))), BPF_NOEXIST)
        .unwrap();
    assert_eq!(m.tables(), 1);
    assert!(m.first_table_buckets() >= super::map::BURST_TABLE_SLOTS);
    let packets: Vec<Packet> = (0..1_000u32)
        .map(|k| {
            let i = k.wrapping_mul(2_654_435_761) % 40_000;
            let port = if k % 5 == 0 { 9 } else { i % 7 };
            s.packet(&[u128::from(i), u128::from(port)]).unwrap()
        })
        .collect();
    let guard = pin();
    let keys: Vec<u8> = packets.iter().flat_map(|p| s.packet_key(p)).collect();
    for n in [1, 15, 16, 17, 1_000] {
        let mut out = vec![None; n];
        m.classify_many(&packets[..n], &guard, &mut out).unwrap();
        for (p, o) in packets.iter().zip(&out) {
            assert_eq!(*o, m.classify(p, &guard));
        }
        let mut by_keys = vec![None; n];
        m.classify_many_keys(&keys[..n * 6], &guard, &mut by_keys)
            .unwrap();
        assert_eq!(by_keys, out);
    }
    let hits = packets.iter().filter(|p| m.classify(p, &guard).is_some());
    assert!((300..700).contains(&hits.count()), "hits and misses both");
}

/// A table's buckets: a power of two, four a rule up to 2^17 of them,
/// two a rule beyond, and never fewer for more rules (a table that
/// outgrows its buckets is rebuilt with more, never the same number).
#[test]
fn bucket_counts_grow_with_the_rules() {
    let mut counts: Vec<usize> = (0..70_000)
        .step_by(if cfg!(miri) { 997 } else { 7 })
        .collect();
    counts.extend([
        32_767,
        32_768,
        32_769,
        65_536,
        65_537,
        1 << 20,
        (1 << 20) + 1,
    ]);
    counts.sort_unstable();
    let mut last = 0;
    for rules in counts {
        let slots = super::map::slots_for(rules);
        assert!(slots.is_power_of_two() && slots >= 8, "{rules}: {slots}");
        assert!(
            slots >= last,
            "{rules} rules: {slots} buckets, fewer than {last}"
        );
        let per_rule = if rules <= 1 << 15 { 4 } else { 2 };
        assert!(slots >= rules * per_rule, "{rules} rules: {slots} buckets");
        last = slots;
    }
}

/// A map's only table has homes once it holds enough rules
/// ([`LONE_HOMED_RULES`](super::chain::LONE_HOMED_RULES), here 16),
/// where a table among others needs `HOMED_SLOTS` buckets: the same
/// rules load with homes alone and without them beside a second table,
/// and both maps answer every rule.
#[test]
fn only_a_lone_table_has_homes_below_the_homed_size() {
    let s = Schema::new(vec![Field::wildcard("id", 4), Field::exact("port", 2)]).unwrap();
    let n = 64;
    let exact = |i: u32| {
        s.rule(2)
            .exact("id", u128::from(i))
            .exact("port", u128::from(i % 7))
            .build()
            .unwrap()
    };
    let maps = [0, 1].map(|others| {
        let m = WildcardMap::new(s.clone(), 4, 2 * n)
            .unwrap()
            .with_lone_homes_over(16);
        let any_id = (0..others).map(|p| (s.rule(3).exact("port", p).build().unwrap(), v(n + 1)));
        // From id 1: a wildcard field's 0 matches any id.
        m.load((1..=n).map(|i| (exact(i), v(i))).chain(any_id), BPF_NOEXIST)
            .unwrap();
        m
    });
    let [(home, held, true)] = maps[0].chains_at_home()[..] else {
        panic!(
            "one table, its homes probed: {:?}",
            maps[0].chains_at_home()
        );
    };
    assert!(home * 2 > held, "{home} of {held} at home");
    let homes = maps[1].chains_at_home();
    assert_eq!(homes.len(), 2, "{homes:?}");
    assert!(homes.iter().all(|&(home, ..)| home == 0), "{homes:?}");
    let guard = pin();
    for i in 1..=n {
        let p = s.packet(&[u128::from(i), u128::from(i % 7)]).unwrap();
        for m in &maps {
            let got = m.classify(&p, &guard).map(|(_, value)| value.to_vec());
            assert_eq!(got, Some(v(i).to_vec()), "rule {i}");
        }
    }
}

/// A big table's chains sit at their buckets' homes after a load and
/// after a rebuild, where a probe asks for them beside the bucket; edits
/// move chains out of their homes, and every answer stays right.
#[test]
#[cfg_attr(miri, ignore = "half a million rules: hours interpreted")]
fn a_big_tables_chains_sit_at_their_buckets_homes() {
    let s = id_port();
    // More than 262,144 rules: 2^20 buckets.
    let n = 270_000;
    let m = WildcardMap::new(s.clone(), 4, 4 * n).unwrap();
    let check = |from: u32, to: u32| {
        let guard = pin();
        for i in from..to {
            let p = id_port_packet(&s, i);
            let got = m.classify(&p, &guard).map(|(_, value)| value.to_vec());
            assert_eq!(got, Some(v(i).to_vec()), "rule {i}");
        }
    };
    m.load((0..n).map(|i| (id_port_rule(&s, i), v(i))), BPF_NOEXIST)
        .unwrap();
    let [(home, held, true)] = m.chains_at_home()[..] else {
        panic!("one table, its homes probed: {:?}", m.chains_at_home());
    };
    assert!(m.first_table_buckets() >= super::chain::HOMED_SLOTS);
    // Buckets a rule hold about a chain each at four buckets a rule;
    // those that run into the next held bucket go after the homes.
    assert!(home * 10 > held * 9, "{home} of {held} at home");
    check(0, n);
    // Removes and inserts edit chains: their copies are allocated alone.
    for i in 0..n / 4 {
        m.remove(&id_port_rule(&s, i)).unwrap();
    }
    let [(fewer, _, true)] = m.chains_at_home()[..] else {
        panic!("{:?}", m.chains_at_home());
    };
    assert!(fewer < home);
    // Inserts past the table's buckets rebuild it, homes and all.
    let last = 2 * n + n / 4;
    for i in n..last {
        m.insert(&id_port_rule(&s, i), &v(i), BPF_NOEXIST).unwrap();
    }
    let [(home, held, true)] = m.chains_at_home()[..] else {
        panic!("{:?}", m.chains_at_home());
    };
    assert!(m.first_table_buckets() > super::chain::HOMED_SLOTS);
    assert!(
        home * 10 > held * 9,
        "{home} of {held} at home after the rebuild"
    );
    check(n / 4, last);
    // A small table has none.
    let small = WildcardMap::new(s.clone(), 4, 64).unwrap();
    small
        .load((0..64).map(|i| (id_port_rule(&s, i), v(i))), BPF_NOEXIST)
        .unwrap();
    assert_eq!(small.chains_at_home()[0].0, 0);
}

/// A table built at once (a load, a rebuild with more buckets) carves
/// every chain from one block; an edit's copy of a chain is allocated
/// alone, and the block stays while a chain of it lives.
#[test]
fn tables_built_at_once_carve_their_chains_from_one_block() {
    let s = id_port();
    // Under Miri 32: the inserts after the removals still rebuild the
    // table (at 33 rules and at 65), as asserted below.
    let n = crate::scaled(2_000, 32) as u32;
    let m = WildcardMap::new(s.clone(), 4, 4 * n).unwrap();
    m.load((0..n).map(|i| (id_port_rule(&s, i), v(i))), BPF_NOEXIST)
        .unwrap();
    let [(carved, 0, 1)] = m.chain_blocks()[..] else {
        panic!("one table, its chains carved: {:?}", m.chain_blocks());
    };
    assert!(carved > 0);
    // Removes replace or empty their buckets' chains; the block stays.
    for i in 0..n / 2 {
        m.remove(&id_port_rule(&s, i)).unwrap();
    }
    let [(left, _, 1)] = m.chain_blocks()[..] else {
        panic!("the block still held: {:?}", m.chain_blocks());
    };
    assert!(left < carved);
    // Inserts one at a time past the table's buckets rebuild it: its
    // chains carved again, from the new table's one block; the inserts
    // after the last rebuild add chains allocated alone.
    let buckets = m.first_table_buckets();
    for i in n..3 * n {
        m.insert(&id_port_rule(&s, i), &v(i), BPF_NOEXIST).unwrap();
    }
    assert!(m.first_table_buckets() > buckets);
    let [(carved, alone, 1)] = m.chain_blocks()[..] else {
        panic!("the rebuilt table's block: {:?}", m.chain_blocks());
    };
    assert!(carved > 0 && alone > 0);
    let guard = pin();
    for i in n / 2..3 * n {
        let p = id_port_packet(&s, i);
        let got = m.classify(&p, &guard).map(|(_, value)| value.to_vec());
        assert_eq!(got, Some(v(i).to_vec()), "rule {i}");
    }
    drop(guard);
    for i in n / 2..3 * n {
        m.remove(&id_port_rule(&s, i)).unwrap();
    }
    assert!(m.chain_blocks().is_empty());
}

/// Rules inserted one at a time past the point where a table keeps two
/// buckets a rule, not four: the table is rebuilt as it grows, every
/// rule still found, the missing ones not, and removes leave the rest.
#[test]
#[cfg_attr(miri, ignore = "40,000 rules")]
fn a_table_grows_past_its_sparse_buckets() {
    let s = id_port();
    let n = 40_000u32;
    let m = WildcardMap::new(s.clone(), 4, n).unwrap();
    let rule = |i: u32| id_port_rule(&s, i);
    let guard = pin();
    let found = |i: u32| {
        let p = id_port_packet(&s, i);
        m.classify(&p, &guard).map(|(_, value)| value.to_vec())
    };
    for i in 0..n {
        m.insert(&rule(i), &v(i), BPF_NOEXIST).unwrap();
        if i % 4_999 == 0 {
            assert_eq!(found(i), Some(v(i).to_vec()), "rule {i} as it went in");
        }
    }
    assert_eq!(m.tables(), 1);
    assert_eq!(m.first_table_buckets(), super::map::slots_for(n as usize));
    for i in 0..n {
        assert_eq!(found(i), Some(v(i).to_vec()), "rule {i}");
    }
    assert_eq!(found(n), None);
    for i in (0..n).step_by(2) {
        m.remove(&rule(i)).unwrap();
    }
    for i in 0..n {
        let want = (i % 2 == 1).then(|| v(i).to_vec());
        assert_eq!(found(i), want, "rule {i} after the removes");
    }
}

/// The same past 2^14 rules when the map has several tables: each burst
/// asked for in the first, then through the pipeline of the first two.
#[test]
#[cfg_attr(miri, ignore = "20,000 rules")]
fn classify_many_in_bursts_over_several_tables_answers_as_classify() {
    let s = Schema::new(vec![Field::wildcard("id", 4), Field::wildcard("port", 2)]).unwrap();
    let m = WildcardMap::new(s.clone(), 4, 20_100).unwrap();
    // Exact rules first in probe order, then a rule for each port and any
    // identity (a table of its own, of a worse priority).
    let rule = |id: u32, port: u32| {
        s.rule(u32::from(id == 0) + 1)
            .exact("id", u128::from(id))
            .exact("port", u128::from(port))
            .build()
            .unwrap()
    };
    let exact = (1..=20_000u32).map(|i| (rule(i, i % 7 + 1), v(i)));
    let any_id = (1..=7u32).map(|port| (rule(0, port), v(port + 1_000_000)));
    m.load(exact.chain(any_id), BPF_NOEXIST).unwrap();
    assert!(m.tables() >= 2, "{} tables", m.tables());
    assert!(m.first_table_buckets() >= super::map::BURST_TABLE_SLOTS);
    let packets: Vec<Packet> = (0..1_000u32)
        .map(|k| {
            let i = k.wrapping_mul(2_654_435_761) % 40_000 + 1;
            let port = match k % 5 {
                0 => 9,
                1 => k % 7 + 1,
                _ => i % 7 + 1,
            };
            s.packet(&[u128::from(i), u128::from(port)]).unwrap()
        })
        .collect();
    let guard = pin();
    let keys: Vec<u8> = packets.iter().flat_map(|p| s.packet_key(p)).collect();
    for n in [1, 2, 15, 16, 17, 1_000] {
        let mut out = vec![None; n];
        m.classify_many(&packets[..n], &guard, &mut out).unwrap();
        for (p, o) in packets.iter().zip(&out) {
            assert_eq!(*o, m.classify(p, &guard));
        }
        let mut by_keys = vec![None; n];
        m.classify_many_keys(&keys[..n * 6], &guard, &mut by_keys)
            .unwrap();
        assert_eq!(by_keys, out);
    }
    let wildcard_hits = packets
        .iter()
        .filter_map(|p| m.classify(p, &guard))
        .filter(|(r, _)| r.priority == 2)
        .count();
    assert!(
        wildcard_hits > 20,
        "{wildcard_hits} packets answered by the second table"
    );
}

/// A small random schema: 1 to 4 fields of every kind, narrow enough that
/// random rules overlap.
fn arb_schema() -> impl Strategy<Value = Schema> {
    let field = (0..4usize, prop::sample::select(vec![1usize, 2, 4, 8, 16]));
    prop::collection::vec(field, 1..=4).prop_map(|fs| {
        let fields = fs
            .into_iter()
            .enumerate()
            .map(|(i, (kind, size))| {
                let name = format!("f{i}");
                match kind {
                    0 => Field::prefix(&name, size),
                    1 => Field::range(&name, size.min(8)),
                    2 => Field::exact(&name, size),
                    _ => Field::wildcard(&name, size),
                }
            })
            .collect();
        Schema::new(fields).unwrap()
    })
}

/// A value of `field` near the few values rules and packets are drawn
/// around (so that they meet), as the top bits of the field.
fn near(field: &Field, seed: u64) -> u128 {
    let top = u128::from(seed % 4) << (field.bits() - 2);
    let low = u128::from(seed / 4 % 4);
    top | low
}

/// A rule of `schema` from random numbers.
fn rule_from(schema: &Schema, priority: u32, seeds: &[u64]) -> Rule {
    let mut b = schema.rule(priority);
    for (f, &seed) in schema.fields().iter().zip(seeds) {
        let value = near(f, seed);
        b = match (f.kind, seed % 5) {
            (FieldKind::Prefix, k) => {
                let len = [0, 1, 2, f.bits() - 1, f.bits()][k as usize];
                b.prefix(&f.name, value, len)
            }
            (FieldKind::Range, 0) => b.any(&f.name),
            (FieldKind::Range, k) => {
                let hi = value
                    .saturating_add(u128::from(k * (seed % 3)))
                    .min(f.max());
                b.range(&f.name, value, hi)
            }
            (FieldKind::WildcardMatch, 0) => b.exact(&f.name, 0),
            _ => b.exact(&f.name, value),
        };
    }
    b.build().unwrap()
}

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

/// Readers classify while a writer inserts and removes churned rules:
/// every answer matches its packet and is either a churned rule or the
/// packet's best stable rule (stable rules never missed), and its value
/// is its rule's (never torn or stale).
#[test]
fn readers_never_miss_a_stable_rule_while_a_writer_churns() {
    let s = five_tuple();
    let m = WildcardMap::with_collision_limit(s.clone(), 4, 10_000, 3).unwrap();
    readers_under_churn(m, &[1, 80, 443, 6], crate::scaled(3000, 20));
}

/// The same in tables that all have homes: the walk over several tables
/// asks for each one's home line while it reads the bucket, as homes
/// come and go with each table made, split and merged.
#[test]
fn readers_never_miss_a_stable_rule_while_a_writer_churns_tables_with_homes() {
    let s = five_tuple();
    let m = WildcardMap::with_collision_limit(s.clone(), 4, 10_000, 3)
        .unwrap()
        .with_homes_from(1);
    // Under Miri 8 rounds, where the test above runs 20: the walk is
    // that test's but for the homes asked for, and 8 still load,
    // rewrite and remove (its window is 6 there).
    readers_under_churn(m, &[1, 80, 443, 6], crate::scaled(3000, 8));
}

/// The same with the engine of one-prefix-field schemas: readers see
/// each prefix's answer before or after each rewrite of it.
#[test]
fn prefix_engine_readers_never_miss_a_stable_rule_while_a_writer_churns() {
    let s = Schema::new(vec![Field::prefix("src", 4)]).unwrap();
    let m = WildcardMap::new(s, 4, 10_000).unwrap();
    // Fewer rounds under Miri, where each insert's walk of the trie for
    // the prefixes above it made 40 rounds take about 5 minutes of wall
    // time, 16 about 2 (docs/testing.md, Miri). 8 still load, insert,
    // rewrite and remove (the window is 6 there).
    readers_under_churn(m, &[], crate::scaled(3000, 8));
}

/// Readers classify while a writer grows a map of one table (exact rules
/// only) one rule at a time, through every rebuild of its buckets and
/// past the point where it keeps two a rule, then removes what it added:
/// a view of one table is probed through its own copy of the table's
/// buckets, which must be the published table's whenever a reader holds
/// it. Every stable rule is found with its value throughout; an added
/// rule, when found, carries its own value.
#[test]
fn readers_of_one_table_never_miss_a_rule_while_it_grows() {
    let s = id_port();
    let stable = crate::scaled(64, 8) as u32;
    let added = crate::scaled(40_000, 40) as u32;
    let m = WildcardMap::new(s, 4, stable + added).unwrap();
    readers_of_one_table(m, stable, added, false);
}

/// The same with homes in every table (`with_homes_from(1)`), and half
/// the added rules loaded at once, whose copy into a new block with
/// homes replaces every chain: readers, one packet at a time and in
/// bursts, probe a table whose homes come and go (each rebuild and the
/// load's copy make a block; the edits between replace its chains with
/// copies allocated alone, and the last of them frees it).
#[test]
fn readers_of_a_table_with_homes_never_miss_a_rule_while_it_grows() {
    let s = id_port();
    let stable = crate::scaled(64, 8) as u32;
    // Under Miri 24, where the test above adds 40: still two rebuilds
    // (at 9 and 17 rules) before the load.
    let added = crate::scaled(40_000, 24) as u32;
    let m = WildcardMap::new(s, 4, stable + added)
        .unwrap()
        .with_homes_from(1);
    readers_of_one_table(m, stable, added, true);
}

/// [`readers_of_one_table_never_miss_a_rule_while_it_grows`] on `m` (of
/// [`id_port`]'s schema): `stable` rules held throughout, `added` added
/// one at a time (the second half in one load if `load_half`) and then
/// removed. The readers also classify in bursts of the two packets.
fn readers_of_one_table(m: WildcardMap, stable: u32, added: u32, load_half: bool) {
    let s = m.schema().clone();
    let m = Arc::new(m);
    let rule = |i: u32| id_port_rule(&s, i);
    for i in 0..stable {
        m.insert(&rule(i), &v(i), BPF_NOEXIST).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2u32)
        .map(|t| {
            let (m, s, stop) = (m.clone(), s.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut seen, mut i) = (0u64, t);
                while !stop.load(Ordering::Relaxed) || seen < 100 {
                    let guard = pin();
                    let packet = |id: u32| id_port_packet(&s, id);
                    let k = i % stable;
                    let j = stable + i % added;
                    let (_, value) = m.classify(&packet(k), &guard).expect("a stable rule");
                    assert_eq!(value, v(k), "stable rule {k}");
                    if let Some((rule, value)) = m.classify(&packet(j), &guard) {
                        assert_eq!(value, v(j), "added rule {j}: {rule:?}");
                    }
                    let mut out = [None; 2];
                    m.classify_many(&[packet(k), packet(j)], &guard, &mut out)
                        .unwrap();
                    assert_eq!(out[0].expect("a stable rule").1, v(k), "burst, {k}");
                    if let Some((rule, value)) = out[1] {
                        assert_eq!(value, v(j), "burst, added rule {j}: {rule:?}");
                    }
                    seen += 1;
                    i = i.wrapping_add(7919);
                    crate::reader_pause();
                }
                seen
            })
        })
        .collect();
    let half = if load_half { added / 2 } else { added };
    for i in stable..stable + half {
        m.insert(&rule(i), &v(i), BPF_NOEXIST).unwrap();
    }
    if load_half {
        m.load(
            (stable + half..stable + added).map(|i| (rule(i), v(i))),
            BPF_NOEXIST,
        )
        .unwrap();
    }
    assert_eq!(m.tables(), 1);
    assert_eq!(
        m.first_table_buckets(),
        super::map::slots_for((stable + added) as usize)
    );
    if load_half {
        let [(home, held, true)] = m.chains_at_home()[..] else {
            panic!("one table, its homes probed: {:?}", m.chains_at_home());
        };
        assert!(home > 0 && home <= held, "{home} of {held} at home");
    }
    for i in stable..stable + added {
        m.remove(&rule(i)).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() >= 100);
    }
    assert_eq!(m.len(), stable as usize);
}

/// Two readers classify while a writer churns rules of better priority
/// over stable /24s of field `src`: every answer matches, its value is
/// its rule's, and it is the packet's stable rule unless it is a churned
/// one. `rest` are the packets' other fields' values; churned rules use
/// fields `dport` and `proto` when the schema has them. `rounds` of
/// churn, each an insert or a load and a rewrite in place, and from the
/// window's end on a removal.
fn readers_under_churn(m: WildcardMap, rest: &[u128], rounds: usize) {
    let s = m.schema().clone();
    let has = |name: &str| s.fields().iter().any(|f| f.name == name);
    let (ports, proto) = (has("dport"), has("proto"));
    let m = Arc::new(m);
    let n = crate::scaled(64, 8) as u32;
    // Stable: one /24 per `i` at priority 1000 + i, plus a catch-all.
    let value_of = |r: &Rule| -> [u8; 4] { (r.priority ^ (r.bounds()[0].0 as u32)).to_ne_bytes() };
    let mut stable: BTreeMap<u32, Rule> = BTreeMap::new();
    for i in 0..n {
        let r = s
            .rule(1000 + i)
            .prefix("src", 0x0a00_0000 | u128::from(i) << 8, 24)
            .build()
            .unwrap();
        m.insert(&r, &value_of(&r), BPF_NOEXIST).unwrap();
        stable.insert(i, r);
    }
    let catch_all = s.rule(5000).build().unwrap();
    m.insert(&catch_all, &value_of(&catch_all), BPF_NOEXIST)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (m, s, stop) = (m.clone(), s.clone(), stop.clone());
            let (stable, catch_all) = (stable.clone(), catch_all.clone());
            let rest = rest.to_vec();
            std::thread::spawn(move || {
                let mut seen = 0u64;
                let mut i = t;
                while !stop.load(Ordering::Relaxed) || seen < 100 {
                    let k = i % (n + 4);
                    let mut values = vec![0x0a00_0005 | u128::from(k) << 8];
                    values.extend_from_slice(&rest);
                    let p = s.packet(&values).unwrap();
                    let guard = pin();
                    let (rule, value) = m.classify(&p, &guard).expect("the catch-all at least");
                    assert!(rule.matches(&p));
                    assert_eq!(value, value_of(rule), "torn or stale value");
                    let best_stable = stable.get(&k).unwrap_or(&catch_all);
                    assert!(
                        rule.priority < 1000 || rule == best_stable,
                        "packet {k}: got {rule:?}, its stable rule is {best_stable:?}"
                    );
                    seen += 1;
                    i += 7;
                    crate::reader_pause();
                }
                seen
            })
        })
        .collect();
    // Churn: rules at priorities below the stable ones, overlapping them,
    // inserted and removed in windows; values rewritten in place too.
    // Churned rules live: the window (smaller under Miri, so that its
    // few rounds remove rules too).
    let window = crate::scaled(40, 6);
    let mut live = std::collections::VecDeque::new();
    for step in 0..rounds as u32 {
        let i = step % (n + 4);
        let mut r = s.rule(step % 997).prefix(
            "src",
            0x0a00_0000 | u128::from(i) << 8,
            [24, 20, 28][step as usize % 3],
        );
        if ports {
            r = r.range("dport", 400, 500 + u128::from(step % 50));
        }
        let r = r.build().unwrap();
        if step % 8 == 0 {
            // A few rules loaded at once: their splits move whole tables'
            // fitting rules while the readers run.
            let batch: Vec<Rule> = (0..4u32)
                .map(|k| {
                    let b = s.rule((step + 1 + k) % 997).prefix(
                        "src",
                        0x0a00_0000 | u128::from((i + k) % n) << 8,
                        22,
                    );
                    if proto { b.exact("proto", 6) } else { b }.build().unwrap()
                })
                .filter(|r| m.get(r, &pin()).is_none())
                .collect();
            m.load(batch.iter().map(|r| (r, value_of(r))), BPF_NOEXIST)
                .unwrap();
            live.extend(batch);
        } else if m.insert(&r, &value_of(&r), BPF_NOEXIST).is_ok() {
            live.push_back(r);
        }
        while live.len() > window {
            m.remove(&live.pop_front().unwrap()).unwrap();
        }
        if let Some(r) = live.back() {
            m.insert(r, &value_of(r), BPF_EXIST).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert_eq!(m.len(), stable.len() + 1 + live.len());
}

// The byte contract (`contract.rs`).

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

/// Where a ClassBench set's probes go (docs/benchmarks.md, "Huge pages
/// for big tables, and bursts of keys"): the probe replayed rule by rule
/// on the set loaded as the `wildcard-classbench` suite loads it, 20,000
/// packets of its trace seed. It must probe exactly the tables the map
/// counts; it prints the empty buckets, the chains a priority kept in
/// the bucket would let a probe skip, the rules tested, where answers
/// lie, and what folding one table into a coarser one would do.
///
/// `SET=acl1_10k.gz cargo test --release -p bpfmaps --lib
/// wildcard::tests::where_a_classbench_sets_probes_go -- --ignored
/// --nocapture` (needs `../shared/data/classbench/`).
#[test]
#[ignore = "an analysis: reads a shared data set, 30-60 s in release"]
fn where_a_classbench_sets_probes_go() {
    use std::io::Read;
    type Table = (Vec<u8>, Vec<Rule>);
    let name = std::env::var("SET").unwrap_or_else(|_| "acl1_10k.gz".into());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/classbench")
        .join(&name);
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("the shared set"))
        .read_to_string(&mut text)
        .unwrap();
    let s = five_tuple();
    let bits: Vec<u32> = s.fields().iter().map(|f| f.bits()).collect();
    let rules = classbench::parse_rules(&s, &text).unwrap();
    let m = WildcardMap::new(s.clone(), 4, rules.len() as u32).unwrap();
    m.load(rules.iter().map(|r| (r, v(r.priority))), BPF_ANY)
        .unwrap();
    // The suite's seed, all packets inside rules.
    let packets = classbench::generate_trace(&s, &rules, 20_000, 1.0, 0x7475_706c);
    let tables = m.table_rules();
    for (i, (tuple, rs)) in tables.iter().enumerate() {
        let best = rs.iter().map(|r| r.priority).min().unwrap();
        eprintln!(
            "table {i}: tuple {tuple:?}, {} rules, best priority {best}",
            rs.len()
        );
    }
    // A packet's bucket in a table: its rules whose hashed bits are the
    // packet's, in rule order (priority first).
    let bucket = |(tuple, rs): &'_ Table, p: &Packet| -> Vec<Rule> {
        let mut chain: Vec<Rule> = rs
            .iter()
            .filter(|r| {
                (0..bits.len()).all(|f| {
                    let keep = u32::from(tuple[f]);
                    let mask = match keep {
                        0 => 0,
                        _ => (u128::MAX >> (128 - keep)) << (bits[f] - keep),
                    };
                    r.bounds()[f].0 & mask == p.values[f] & mask
                })
            })
            .cloned()
            .collect();
        chain.sort();
        chain
    };
    // Tables probed, empty buckets, buckets whose best rule cannot beat
    // the match in hand, chains scanned, rules tested; and the number of
    // answers each table gave.
    // `bound`: the word a probe's match stops it by (its exit bound, or
    // its priority).
    let replay = |tables: &[Table], bound: &dyn Fn(&Rule) -> u32| -> ([usize; 5], Vec<usize>) {
        let top = |i: usize| tables[i].1.iter().map(|r| r.priority).min();
        let mut order: Vec<usize> = (0..tables.len()).filter(|&i| top(i).is_some()).collect();
        order.sort_by_key(|&i| top(i));
        let mut n = [0; 5];
        let mut answered_in = vec![0; tables.len()];
        for p in &packets {
            let mut best: Option<(u32, usize, u32)> = None;
            for &i in &order {
                if best.is_some_and(|(_, _, exit)| top(i) > Some(exit)) {
                    break;
                }
                n[0] += 1;
                let chain = bucket(&tables[i], p);
                if chain.is_empty() {
                    n[1] += 1;
                    continue;
                }
                if best.is_some_and(|(b, ..)| chain[0].priority > b) {
                    n[2] += 1;
                    continue;
                }
                n[3] += 1;
                for r in &chain {
                    if best.is_some_and(|(b, ..)| r.priority >= b) {
                        break;
                    }
                    n[4] += 1;
                    if r.matches(p) {
                        best = Some((r.priority, i, bound(r)));
                        break;
                    }
                }
            }
            if let Some((_, i, _)) = best {
                answered_in[i] += 1;
            }
        }
        (n, answered_in)
    };
    let per = |x: usize| x as f64 / packets.len() as f64;
    let ([probed, empty, skippable, scanned, tested], answered_in) =
        replay(&tables, &|r| m.exit_bound(r));
    let (without, _) = replay(&tables, &|r| r.priority);
    let guard = pin();
    let counted: usize = packets
        .iter()
        .map(|p| m.classify_counting(p, &guard).1)
        .sum();
    assert_eq!(
        probed, counted,
        "{name}: the replay probes the tables the map does"
    );
    eprintln!(
        "{name}: {} tables, {:.3} probed a packet, {:.3} empty buckets, {:.3} skippable \
         by a bucket's best priority, {:.3} chains scanned, {:.3} rules tested; answers by \
         table {answered_in:?}",
        tables.len(),
        per(probed),
        per(empty),
        per(skippable),
        per(scanned),
        per(tested)
    );
    eprintln!(
        "{name}: without exit bounds, {:.3} probed a packet, {:.3} rules tested",
        per(without[0]),
        per(without[4])
    );
    // Each table folded into a coarser one (its rules all fit; without
    // exit bounds).
    for i in 0..tables.len() {
        for j in (0..tables.len()).filter(|&j| j != i) {
            if tables[i].0.iter().zip(&tables[j].0).all(|(a, b)| a >= b) {
                let mut folded = tables.clone();
                let moved = std::mem::take(&mut folded[i].1);
                folded[j].1.extend(moved);
                let ([probed, .., tested], _) = replay(&folded, &|r| r.priority);
                eprintln!(
                    "table {i} into table {j}: {:.3} probed, {:.3} rules tested",
                    per(probed),
                    per(tested)
                );
            }
        }
    }
}
