//! TupleMerge's tables: splits, merges, exit bounds, buckets, homes,
//! blocks of chains and batches over them; and an analysis of where a
//! ClassBench set's probes go.

use super::*;

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
    batches_answer_as_one_at_a_time(&m, &packets, &[1, 15, 16, 17, 1_000], &guard);
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
    batches_answer_as_one_at_a_time(&m, &packets, &[1, 2, 15, 16, 17, 1_000], &guard);
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

/// Where a ClassBench set's probes go (docs/benchmarks.md, "Huge pages
/// for big tables, and bursts of keys"): the probe replayed rule by rule
/// on the set loaded as the `wildcard-classbench` suite loads it, 20,000
/// packets of its trace seed. It must probe exactly the tables the map
/// counts; it prints the empty buckets, the chains a priority kept in
/// the bucket would let a probe skip, the rules tested, where answers
/// lie, and what folding one table into a coarser one would do.
///
/// `SET=acl1_10k.gz cargo test --release -p bpfmaps --lib
/// wildcard::tests::tables::where_a_classbench_sets_probes_go -- --ignored
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

/// The first `n` of `packets`, for each `n` of `sizes`, classified in one
/// batch, as packets (`classify_many`) and as their keys' bytes
/// (`classify_many_keys`): each answer is `classify`'s.
fn batches_answer_as_one_at_a_time(
    m: &WildcardMap,
    packets: &[Packet],
    sizes: &[usize],
    guard: &crate::Guard,
) {
    let s = m.schema();
    let keys: Vec<u8> = packets.iter().flat_map(|p| s.packet_key(p)).collect();
    for &n in sizes {
        let mut out = vec![None; n];
        m.classify_many(&packets[..n], guard, &mut out).unwrap();
        for (p, o) in packets.iter().zip(&out) {
            assert_eq!(*o, m.classify(p, guard));
        }
        let mut by_keys = vec![None; n];
        m.classify_many_keys(&keys[..n * s.key_size()], guard, &mut by_keys)
            .unwrap();
        assert_eq!(by_keys, out);
    }
}
