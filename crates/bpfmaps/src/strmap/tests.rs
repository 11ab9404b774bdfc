use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;

use super::{MAX_INLINE_TAIL, QpTrieMap};
use crate::core::flags::{BPF_ANY, BPF_EXIST, BPF_NOEXIST};
use crate::{Error, pin};

fn v(i: u64) -> [u8; 8] {
    i.to_ne_bytes()
}

fn get(m: &QpTrieMap, key: &[u8]) -> Option<u64> {
    m.get(key, &pin())
        .map(|v| u64::from_ne_bytes(v.try_into().unwrap()))
}

fn keys(m: &QpTrieMap) -> Vec<Vec<u8>> {
    m.iter(&pin()).map(|(k, _)| k).collect()
}

#[test]
fn keys_that_are_prefixes_of_each_other_and_nul_bytes() {
    let m = QpTrieMap::new(16, 8, 100).unwrap();
    let set: [&[u8]; 8] = [
        b"ab",
        b"ab\0",
        b"a",
        b"abc",
        b"b",
        b"\0",
        b"\xff\xff",
        b"ab\xff",
    ];
    for (i, k) in set.iter().enumerate() {
        m.insert(k, &v(i as u64), BPF_NOEXIST).unwrap();
    }
    for (i, k) in set.iter().enumerate() {
        assert_eq!(get(&m, k), Some(i as u64), "{k:?}");
    }
    assert_eq!(
        (get(&m, b"abd"), get(&m, b"ab\0\0"), get(&m, b"c")),
        (None, None, None)
    );
    let mut sorted: Vec<Vec<u8>> = set.iter().map(|k| k.to_vec()).collect();
    sorted.sort();
    assert_eq!(keys(&m), sorted);
    assert_eq!(m.len(), 8);
}

#[test]
fn get_many_wants_room_for_every_answer() {
    let m = QpTrieMap::new(8, 8, 10).unwrap();
    m.insert(b"k", &v(1), BPF_ANY).unwrap();
    let guard = pin();
    let mut out = [None; 1];
    assert!(matches!(
        m.get_many(&[b"k", b"k"], &guard, &mut out),
        Err(Error::Invalid(_))
    ));
    m.get_many(&[b"k"], &guard, &mut out).unwrap();
    assert_eq!(out[0], Some(&v(1)[..]));
}

#[test]
fn update_flags_follow_the_kernel() {
    let m = QpTrieMap::new(8, 8, 10).unwrap();
    assert_eq!(m.insert(b"k", &v(1), BPF_EXIST), Err(Error::NotFound));
    m.insert(b"k", &v(1), BPF_NOEXIST).unwrap();
    assert_eq!(m.insert(b"k", &v(2), BPF_NOEXIST), Err(Error::Exists));
    m.insert(b"k", &v(3), BPF_EXIST).unwrap();
    m.insert(b"k", &v(4), BPF_ANY).unwrap();
    m.insert(b"kk", &v(5), BPF_ANY).unwrap();
    assert_eq!(m.insert(b"kkk", &v(6), BPF_EXIST), Err(Error::NotFound));
    assert_eq!(m.insert(b"kk", &v(6), BPF_NOEXIST), Err(Error::Exists));
    assert!(matches!(m.insert(b"k", &v(7), 4), Err(Error::Invalid(_))));
    assert_eq!(
        (get(&m, b"k"), get(&m, b"kk"), m.len()),
        (Some(4), Some(5), 2)
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    assert!(QpTrieMap::new(0, 8, 10).is_err());
    assert!(QpTrieMap::new(4097, 8, 10).is_err());
    assert!(QpTrieMap::new(8, 0, 10).is_err());
    assert!(QpTrieMap::new(8, 8, 0).is_err());
    let m = QpTrieMap::new(4, 8, 3).unwrap();
    for k in [&b"a"[..], b"ab", b"abc"] {
        m.insert(k, &v(1), BPF_ANY).unwrap();
    }
    let before = (keys(&m), m.live_bytes());
    let invalid = |r: crate::Result<()>| assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    invalid(m.insert(b"", &v(1), BPF_ANY));
    invalid(m.insert(b"abcde", &v(1), BPF_ANY));
    invalid(m.insert(b"x", &[0; 7], BPF_ANY));
    invalid(m.remove(b"", None));
    invalid(m.remove(b"a", Some(&mut [0; 9])));
    assert_eq!(m.insert(b"abcd", &v(1), BPF_ANY), Err(Error::Full));
    assert_eq!(m.insert(b"x", &v(1), BPF_NOEXIST), Err(Error::Full));
    assert_eq!(m.remove(b"abcd", None), Err(Error::NotFound));
    assert_eq!(m.remove(b"b", None), Err(Error::NotFound));
    assert_eq!((keys(&m), m.live_bytes()), before);
    // A full map still takes new values for stored keys.
    m.insert(b"ab", &v(9), BPF_EXIST).unwrap();
    assert_eq!((get(&m, b"ab"), m.len()), (Some(9), 3));
}

#[test]
fn the_longest_keys_and_remove_with_out() {
    let m = QpTrieMap::new(4096, 8, 10).unwrap();
    let long: Vec<u8> = (0..4096).map(|i| (i * 7) as u8).collect();
    let mut longer_sibling = long.clone();
    longer_sibling[4000] ^= 1;
    m.insert(&long, &v(1), BPF_ANY).unwrap();
    m.insert(&longer_sibling, &v(2), BPF_ANY).unwrap();
    m.insert(&long[..1], &v(3), BPF_ANY).unwrap();
    assert_eq!(
        (get(&m, &long), get(&m, &longer_sibling)),
        (Some(1), Some(2))
    );
    let mut out = [0; 8];
    m.remove(&long, Some(&mut out)).unwrap();
    assert_eq!((out, get(&m, &long), m.len()), (v(1), None, 2));
}

#[test]
fn longest_prefix_of_finds_the_longest_stored_prefix() {
    let m = QpTrieMap::new(32, 8, 100).unwrap();
    for (i, k) in [&b"/"[..], b"/usr", b"/usr/lib", b"/usr/lib/x"]
        .iter()
        .enumerate()
    {
        m.insert(k, &v(i as u64), BPF_ANY).unwrap();
    }
    let guard = pin();
    let lp = |k: &[u8]| m.longest_prefix_of(k, &guard).map(|(p, _)| p.to_vec());
    assert_eq!(lp(b"/usr/lib/xy"), Some(b"/usr/lib/x".to_vec()));
    assert_eq!(lp(b"/usr/lib/"), Some(b"/usr/lib".to_vec()));
    assert_eq!(lp(b"/usr/li"), Some(b"/usr".to_vec()));
    assert_eq!(lp(b"/etc"), Some(b"/".to_vec()));
    assert_eq!(lp(b"usr"), None);
}

#[test]
fn removals_restore_the_nodes_of_a_fresh_build() {
    let keep: Vec<&[u8]> = vec![b"vfs_read", b"vfs_write", b"vmalloc", b"v", b"x"];
    let extra: Vec<&[u8]> = vec![
        b"vfs_readv",
        b"vfs_",
        b"vm",
        b"vfs_read\0",
        b"vz",
        b"xx",
        b"y",
    ];
    let fresh = QpTrieMap::new(16, 8, 100).unwrap();
    let m = QpTrieMap::new(16, 8, 100).unwrap();
    for k in &keep {
        fresh.insert(k, &v(1), BPF_ANY).unwrap();
        m.insert(k, &v(1), BPF_ANY).unwrap();
    }
    for k in &extra {
        m.insert(k, &v(2), BPF_ANY).unwrap();
    }
    for k in extra.iter().rev() {
        m.remove(k, None).unwrap();
    }
    assert_eq!((m.len(), m.live_bytes()), (fresh.len(), fresh.live_bytes()));
    assert_eq!(keys(&m), keys(&fresh));
}

#[test]
fn next_key_walks_in_order_past_deleted_keys() {
    let m = QpTrieMap::new(8, 8, 100).unwrap();
    for k in [&b"b"[..], b"ba", b"bb", b"c", b"a\xff"] {
        m.insert(k, &v(0), BPF_ANY).unwrap();
    }
    let mut next = Vec::new();
    m.next_key(None, &mut next).unwrap();
    assert_eq!(next, b"a\xff");
    m.next_key(Some(b"ba"), &mut next).unwrap();
    assert_eq!(next, b"bb");
    m.remove(b"bb", None).unwrap();
    m.next_key(Some(b"bb"), &mut next).unwrap();
    assert_eq!(next, b"c");
    assert_eq!(m.next_key(Some(b"c"), &mut next), Err(Error::NotFound));
}

#[test]
fn clear_empties_the_map_and_gives_the_memory_back() {
    let m = QpTrieMap::new(8, 8, 1000).unwrap();
    let empty = m.memory_usage();
    for i in 0..crate::scaled(500, 40) as u64 {
        m.insert(&i.to_be_bytes()[5..], &v(i), BPF_ANY).unwrap();
    }
    assert!(m.memory_usage() > empty);
    m.clear();
    assert_eq!((m.len(), keys(&m).len(), m.live_bytes()), (0, 0, 0));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while m.memory_usage() > empty {
        assert!(
            std::time::Instant::now() < deadline,
            "memory never came back"
        );
        pin().flush();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// An operation of the model-based test.
#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u8>, u64, u64),
    Remove(Vec<u8>),
}

/// Keys from a small alphabet, with the bytes that order specially (0,
/// 0xff), so that keys share prefixes and are prefixes of each other.
fn arb_key(max: usize) -> impl Strategy<Value = Vec<u8>> + Clone {
    prop::collection::vec(
        prop::sample::select(vec![0u8, 1, b'a', b'b', 0x7f, 0xff]),
        1..=max,
    )
}

/// Keys of up to four pieces, each a byte or a run of `MAX_INLINE_TAIL + 1`
/// bytes: long keys sharing prefixes, so that long leaves (nodes of their
/// own) split, merge and go back inline.
fn arb_long_key() -> impl Strategy<Value = Vec<u8>> + Clone {
    prop::collection::vec(
        prop::sample::select(vec![0u8, b'a', b'b', b'r', 0xff]),
        1..=4,
    )
    .prop_map(|pieces| {
        let mut key = Vec::new();
        for p in pieces {
            match p {
                b'r' => key.extend(std::iter::repeat_n(b'r', MAX_INLINE_TAIL + 1)),
                b => key.push(b),
            }
        }
        key
    })
}

fn arb_ops_of(key: impl Strategy<Value = Vec<u8>> + Clone) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (key.clone(), any::<u64>(), 0..3u64).prop_map(|(k, v, f)| Op::Insert(k, v, f)),
        2 => key.prop_map(Op::Remove),
    ];
    prop::collection::vec(op, 1..crate::scaled(200, 24))
}

fn arb_ops(max_key: usize) -> impl Strategy<Value = Vec<Op>> {
    arb_ops_of(arb_key(max_key))
}

fn bound(b: Bound<&Vec<u8>>) -> Bound<&[u8]> {
    b.map(Vec::as_slice)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(128, 2) as u32))]

    /// Every operation's result and every query against a `BTreeMap`:
    /// lookups, order, ranges, prefixes, longest prefixes, next keys, and
    /// the shape (the nodes of a fresh build of the same keys).
    #[test]
    fn matches_a_btreemap(
        ops in arb_ops(6),
        probes in prop::collection::vec(arb_key(7), 1..crate::scaled(24, 4)),
        cap in 4..64usize,
    ) {
        matches_the_model(&ops, &probes, cap, 6)?;
    }

    /// The same with long keys: leaves past `MAX_INLINE_TAIL` bytes.
    #[test]
    fn matches_a_btreemap_with_long_keys(
        ops in arb_ops_of(arb_long_key()),
        probes in prop::collection::vec(arb_long_key(), 1..crate::scaled(24, 4)),
        cap in 4..64usize,
    ) {
        matches_the_model(&ops, &probes, cap, 4 * (MAX_INLINE_TAIL + 1))?;
    }
}

/// Every operation's result and every query against a `BTreeMap` (see
/// `matches_a_btreemap`), for keys of at most `max_key` bytes (`probes`
/// may be longer).
fn matches_the_model(
    ops: &[Op],
    probes: &[Vec<u8>],
    cap: usize,
    max_key: usize,
) -> Result<(), TestCaseError> {
    {
        let m = QpTrieMap::new(max_key, 8, cap as u32).unwrap();
        let mut model: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(k, val, f) => {
                    let want = match (*f, model.contains_key(k)) {
                        (BPF_NOEXIST, true) => Err(Error::Exists),
                        (BPF_EXIST, false) => Err(Error::NotFound),
                        (_, false) if model.len() == cap => Err(Error::Full),
                        _ => Ok(()),
                    };
                    prop_assert_eq!(m.insert(k, &v(*val), *f), want.clone());
                    if want.is_ok() {
                        model.insert(k.clone(), *val);
                    }
                }
                Op::Remove(k) => {
                    let mut out = [0u8; 8];
                    let got = m.remove(k, Some(&mut out));
                    match model.remove(k) {
                        Some(val) => prop_assert_eq!((got, out), (Ok(()), v(val))),
                        None => prop_assert_eq!(got, Err(Error::NotFound)),
                    }
                }
            }
            prop_assert_eq!(m.len(), model.len());
        }
        let guard = pin();
        let all: Vec<(Vec<u8>, u64)> = m
            .iter(&guard)
            .map(|(k, v)| (k, u64::from_ne_bytes(v.try_into().unwrap())))
            .collect();
        prop_assert_eq!(&all, &model.clone().into_iter().collect::<Vec<_>>());
        prop_assert_eq!(m.counted_keys(), model.len());
        // get_many in groups (over LOOKUP_GROUP keys), with stored keys,
        // missing and over-long ones, and an empty key.
        let many: Vec<&[u8]> = probes
            .iter()
            .map(Vec::as_slice)
            .chain(model.keys().map(Vec::as_slice))
            .chain([&b""[..]])
            .collect();
        let mut out = vec![Some(&[0u8][..]); many.len()];
        m.get_many(&many, &guard, &mut out).unwrap();
        for (k, got) in many.iter().zip(&out) {
            prop_assert_eq!(
                got.map(|v| u64::from_ne_bytes(v.try_into().unwrap())),
                model.get(*k).copied()
            );
        }
        for p in probes {
            prop_assert_eq!(get(&m, p), model.get(p).copied());
            let want = model
                .keys()
                .filter(|k| p.starts_with(k))
                .max_by_key(|k| k.len());
            prop_assert_eq!(
                m.longest_prefix_of(p, &guard).map(|(k, _)| k.to_vec()),
                want.cloned()
            );
            let want: Vec<_> = model.keys().filter(|k| k.starts_with(p)).cloned().collect();
            prop_assert_eq!(
                m.prefix(p, &guard).map(|(k, _)| k).collect::<Vec<_>>(),
                want
            );
            let mut next = Vec::new();
            match model
                .range::<Vec<u8>, _>((Bound::Excluded(p), Bound::Unbounded))
                .next()
            {
                Some((k, _)) => {
                    prop_assert_eq!(m.next_key(Some(p), &mut next), Ok(()));
                    prop_assert_eq!(&next, k);
                }
                None => prop_assert_eq!(m.next_key(Some(p), &mut next), Err(Error::NotFound)),
            }
        }
        for pair in probes.windows(2) {
            let (lo, hi) = (&pair[0], &pair[1]);
            for (l, h) in [
                (Bound::Included(lo), Bound::Excluded(hi)),
                (Bound::Excluded(lo), Bound::Included(hi)),
                (Bound::Included(lo), Bound::Unbounded),
                (Bound::Unbounded, Bound::Included(hi)),
            ] {
                if lo > hi && !matches!((l, h), (_, Bound::Unbounded) | (Bound::Unbounded, _)) {
                    continue;
                }
                let want: Vec<_> = model
                    .range::<Vec<u8>, _>((l, h))
                    .map(|(k, _)| k.clone())
                    .collect();
                let got: Vec<_> = m
                    .range::<Vec<u8>>((l.cloned(), h.cloned()), &guard)
                    .map(|(k, _)| k)
                    .collect();
                prop_assert_eq!(&got, &want);
                let mut walked = Vec::new();
                m.for_each_in((bound(l), bound(h)), &guard, |k, _| {
                    walked.push(k.to_vec());
                    ControlFlow::Continue(())
                });
                prop_assert_eq!(walked, want);
            }
        }
        let fresh = QpTrieMap::new(max_key, 8, cap as u32).unwrap();
        for (k, val) in &model {
            fresh.insert(k, &v(*val), BPF_NOEXIST).unwrap();
        }
        prop_assert_eq!(m.live_bytes(), fresh.live_bytes());
    }
    Ok(())
}

/// Writers insert and remove keys in their own subtrees and in a shared
/// one, while readers look up stable keys (present throughout: always
/// found, with their value) and walk the map (every key once, in order,
/// every stable key seen).
#[test]
fn readers_and_writers_in_disjoint_and_shared_subtrees() {
    let m = Arc::new(QpTrieMap::new(12, 8, 100_000).unwrap());
    let n = crate::scaled(300, 12) as u64;
    let stable: Vec<Vec<u8>> = (0..n)
        .flat_map(|i| [format!("a{i}"), format!("s{i}"), format!("b{i}x")])
        .map(String::into_bytes)
        .collect();
    for (i, k) in stable.iter().enumerate() {
        m.insert(k, &v(i as u64), BPF_ANY).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let looked = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (m, stop, stable, looked) =
                (m.clone(), stop.clone(), stable.clone(), looked.clone());
            std::thread::spawn(move || {
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 7) % stable.len();
                    assert_eq!(
                        get(&m, &stable[i]),
                        Some(i as u64),
                        "stable {:?}",
                        stable[i]
                    );
                    if i % 16 == 0 {
                        let guard = pin();
                        let mut prev: Option<Vec<u8>> = None;
                        let mut seen = BTreeSet::new();
                        for (k, _) in m.iter(&guard) {
                            assert!(prev.as_ref().is_none_or(|p| *p < k), "order");
                            prev = Some(k.clone());
                            seen.insert(k);
                        }
                        assert!(
                            stable.iter().all(|k| seen.contains(k)),
                            "a stable key missed"
                        );
                    }
                    looked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    while looked.load(Ordering::Relaxed) < 2 {
        std::thread::yield_now();
    }
    // Writer 0 churns keys below and beside the stable ones in subtree
    // `a`, writer 1 in `b`; both churn the shared subtree `s`.
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let m = m.clone();
            std::thread::spawn(move || {
                let own = if w == 0 { 'a' } else { 'b' };
                for round in 0..crate::scaled(6, 2) as u64 {
                    let churn = |i: u64| [format!("{own}{i}y{round}"), format!("s{i}-{w}")];
                    for i in 0..n {
                        for k in churn(i) {
                            m.insert(k.as_bytes(), &v(u64::MAX), BPF_NOEXIST).unwrap();
                        }
                    }
                    for i in 0..n {
                        for k in churn(i) {
                            m.remove(k.as_bytes(), None).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(m.len(), stable.len());
    assert_eq!(
        keys(&m),
        stable
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
}

/// A writer gives every key a new value per round (16 bytes: the round
/// twice); readers never see a value from before the last completed
/// round, nor one torn between two.
#[test]
fn updates_are_never_stale_or_torn() {
    let m = Arc::new(QpTrieMap::new(8, 16, 1000).unwrap());
    let keys: Vec<Vec<u8>> = (0..crate::scaled(200, 10))
        .map(|i| format!("k{}", i * 7919 % 1000).into_bytes())
        .collect();
    let value = |round: u64| [round.to_ne_bytes(), round.to_ne_bytes()].concat();
    for k in &keys {
        m.insert(k, &value(0), BPF_NOEXIST).unwrap();
    }
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (m, keys, done, stop) = (m.clone(), keys.clone(), done.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 13) % keys.len();
                    let before = done.load(Ordering::Acquire) as u64;
                    let guard = pin();
                    let got = m.get(&keys[i], &guard).expect("a stored key");
                    let (lo, hi) = got.split_at(8);
                    assert_eq!(lo, hi, "torn value");
                    let round = u64::from_ne_bytes(lo.try_into().unwrap());
                    assert!(
                        round >= before,
                        "round {round} after round {before} was done"
                    );
                }
            })
        })
        .collect();
    for round in 1..=crate::scaled(50, 2) as u64 {
        for k in &keys {
            m.insert(k, &value(round), BPF_EXIST).unwrap();
        }
        done.store(round as usize, Ordering::Release);
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
}
