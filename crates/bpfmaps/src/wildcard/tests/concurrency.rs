//! Readers beside a writer: no stable rule missed, no value torn or
//! stale, through churn, splits and growth.

use super::*;

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
