//! `TstMap`: every operation and flag, the shape after removals, a
//! model-based run against a `BTreeMap`, and readers beside a writer.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;

use super::TstMap;
use crate::core::flags::{BPF_ANY, BPF_EXIST, BPF_NOEXIST};
use crate::{Error, pin};

fn v(i: u64) -> [u8; 8] {
    i.to_ne_bytes()
}

fn get(m: &TstMap, key: &[u8]) -> Option<u64> {
    m.get(key, &pin())
        .map(|v| u64::from_ne_bytes(v.try_into().unwrap()))
}

fn keys(m: &TstMap) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    m.for_each(&pin(), |k, _| {
        out.push(k.to_vec());
        ControlFlow::Continue(())
    });
    out
}

/// The keys as `get_next_key` walks them, from no key.
fn walked(m: &TstMap) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut next = Vec::new();
    while m.next_key(out.last().map(Vec::as_slice), &mut next).is_ok() {
        out.push(next.clone());
    }
    out
}

/// The patch's own example builds the patch's six nodes.
#[test]
fn the_patch_example_splits_as_the_patch() {
    let m = TstMap::new(16, 8, 100).unwrap();
    let set: [&[u8]; 5] = [b"hello", b"he", b"test", b"tea", b"team"];
    for (i, k) in set.iter().enumerate() {
        m.insert(k, &v(i as u64), BPF_NOEXIST).unwrap();
    }
    for (i, k) in set.iter().enumerate() {
        assert_eq!(get(&m, k), Some(i as u64), "{k:?}");
    }
    for miss in [&b"h"[..], b"hel", b"te", b"tes", b"teams", b"x", b"a"] {
        assert_eq!(get(&m, miss), None, "{miss:?}");
    }
    // [he]* -eq- [llo]*; [he] -hi- [te] -eq- [st]* -lo- [a]* -eq- [m]*.
    assert_eq!(m.live_nodes().1, 6);
    assert_eq!(m.check_shape(), 5);
    assert_eq!(
        keys(&m),
        [&b"he"[..], b"hello", b"tea", b"team", b"test"].map(<[u8]>::to_vec)
    );
}

#[test]
fn keys_that_are_prefixes_of_each_other_and_nul_bytes() {
    let m = TstMap::new(16, 8, 100).unwrap();
    let set: [&[u8]; 9] = [
        b"ab",
        b"ab\0",
        b"a",
        b"abc",
        b"b",
        b"\0",
        b"\xff\xff",
        b"ab\xff",
        b"\xff",
    ];
    for (i, k) in set.iter().enumerate() {
        m.insert(k, &v(i as u64), BPF_NOEXIST).unwrap();
    }
    for (i, k) in set.iter().enumerate() {
        assert_eq!(get(&m, k), Some(i as u64), "{k:?}");
    }
    assert_eq!(
        (
            get(&m, b"abd"),
            get(&m, b"ab\0\0"),
            get(&m, b"c"),
            get(&m, b"\0\0")
        ),
        (None, None, None, None)
    );
    let mut sorted: Vec<Vec<u8>> = set.iter().map(|k| k.to_vec()).collect();
    sorted.sort();
    assert_eq!(keys(&m), sorted);
    assert_eq!(walked(&m), sorted);
    assert_eq!((m.len(), m.check_shape()), (9, 9));
}

#[test]
fn update_flags_follow_the_kernel() {
    let m = TstMap::new(8, 8, 10).unwrap();
    assert_eq!(m.insert(b"k", &v(1), BPF_EXIST), Err(Error::NotFound));
    m.insert(b"k", &v(1), BPF_NOEXIST).unwrap();
    assert_eq!(m.insert(b"k", &v(2), BPF_NOEXIST), Err(Error::Exists));
    m.insert(b"k", &v(3), BPF_EXIST).unwrap();
    assert_eq!(get(&m, b"k"), Some(3));
    m.insert(b"k", &v(4), BPF_ANY).unwrap();
    m.insert(b"kk", &v(5), BPF_ANY).unwrap();
    // A key ending inside a fragment, and one leaving it: splits, which
    // `BPF_EXIST` refuses.
    m.insert(b"xyz", &v(6), BPF_ANY).unwrap();
    assert_eq!(m.insert(b"xy", &v(7), BPF_EXIST), Err(Error::NotFound));
    assert_eq!(m.insert(b"xa", &v(7), BPF_EXIST), Err(Error::NotFound));
    assert_eq!(m.insert(b"kkk", &v(6), BPF_EXIST), Err(Error::NotFound));
    assert_eq!(m.insert(b"kk", &v(6), BPF_NOEXIST), Err(Error::Exists));
    assert_eq!(m.insert(b"xyz", &v(6), BPF_NOEXIST), Err(Error::Exists));
    for bad in [3, 4, 1 << 40] {
        assert!(matches!(m.insert(b"k", &v(7), bad), Err(Error::Invalid(_))));
    }
    m.insert(b"xy", &v(8), BPF_NOEXIST).unwrap();
    m.insert(b"xyz", &v(9), BPF_EXIST).unwrap();
    assert_eq!(
        (
            get(&m, b"k"),
            get(&m, b"kk"),
            get(&m, b"xy"),
            get(&m, b"xyz"),
            m.len()
        ),
        (Some(4), Some(5), Some(8), Some(9), 4)
    );
    assert_eq!(m.check_shape(), 4);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    assert!(TstMap::new(0, 8, 10).is_err());
    assert!(TstMap::new(4097, 8, 10).is_err());
    assert!(TstMap::new(8, 0, 10).is_err());
    assert!(TstMap::new(8, 65536, 10).is_err());
    assert!(TstMap::new(8, 8, 0).is_err());
    let m = TstMap::new(4, 8, 3).unwrap();
    for k in [&b"a"[..], b"ab", b"abc"] {
        m.insert(k, &v(1), BPF_ANY).unwrap();
    }
    let before = (keys(&m), m.live_nodes(), m.memory_usage());
    let invalid = |r: crate::Result<()>| assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    invalid(m.insert(b"", &v(1), BPF_ANY));
    invalid(m.insert(b"abcde", &v(1), BPF_ANY));
    invalid(m.insert(b"x", &[0; 7], BPF_ANY));
    invalid(m.insert(b"x", &[0; 9], BPF_ANY));
    invalid(m.insert(b"a", &v(1), 3));
    invalid(m.remove(b"", None));
    invalid(m.remove(b"abcde", None));
    invalid(m.remove(b"a", Some(&mut [0; 9])));
    // Full: a new key is E2BIG, whether it would split a node, end inside
    // one, hang below one or start a sibling.
    for k in [&b"abcd"[..], b"ax", b"b", b"\0"] {
        assert_eq!(m.insert(k, &v(1), BPF_ANY), Err(Error::Full), "{k:?}");
        assert_eq!(m.insert(k, &v(1), BPF_NOEXIST), Err(Error::Full), "{k:?}");
    }
    assert_eq!(m.remove(b"abcd", None), Err(Error::NotFound));
    assert_eq!(m.remove(b"b", None), Err(Error::NotFound));
    assert_eq!(m.remove(b"ac", None), Err(Error::NotFound));
    assert_eq!(m.get(b"", &pin()), None);
    assert_eq!((keys(&m), m.live_nodes(), m.memory_usage()), before);
    assert_eq!(m.len(), 3);
    // A full map still takes new values for stored keys.
    m.insert(b"ab", &v(9), BPF_EXIST).unwrap();
    m.insert(b"abc", &v(8), BPF_ANY).unwrap();
    assert_eq!(
        (get(&m, b"ab"), get(&m, b"abc"), m.len()),
        (Some(9), Some(8), 3)
    );
}

#[test]
fn the_longest_keys_and_remove_with_out() {
    // The largest key size a map takes (smaller under Miri: comparing
    // 4,096-byte keys byte by byte is most of the test's time there).
    let max = crate::scaled(4096, 300);
    let m = TstMap::new(max, 8, 10).unwrap();
    let long: Vec<u8> = (0..max).map(|i| (i * 7) as u8).collect();
    let mut sibling = long.clone();
    sibling[max - 96] ^= 1;
    m.insert(&long, &v(1), BPF_ANY).unwrap();
    m.insert(&sibling, &v(2), BPF_ANY).unwrap();
    m.insert(&long[..1], &v(3), BPF_ANY).unwrap();
    m.insert(&long[..max - 1], &v(4), BPF_ANY).unwrap();
    assert_eq!((get(&m, &long), get(&m, &sibling)), (Some(1), Some(2)));
    let mut expect = vec![
        long[..1].to_vec(),
        long[..max - 1].to_vec(),
        long.clone(),
        sibling.clone(),
    ];
    expect.sort();
    assert_eq!(keys(&m), expect);
    assert_eq!(walked(&m), expect);
    let mut out = [0; 8];
    m.remove(&long, Some(&mut out)).unwrap();
    assert_eq!((out, get(&m, &long), m.len()), (v(1), None, 3));
    assert_eq!(m.check_shape(), 3);
}

/// Removing a key frees or merges what held it, down to no node at all.
#[test]
fn removals_leave_no_dead_nodes() {
    let m = TstMap::new(16, 8, 100).unwrap();
    m.insert(b"hello", &v(1), BPF_ANY).unwrap();
    m.insert(b"he", &v(2), BPF_ANY).unwrap();
    assert_eq!(m.live_nodes().1, 2);
    // [he] loses its value: merged back with [llo].
    m.remove(b"he", None).unwrap();
    assert_eq!(m.live_nodes().1, 1);
    m.insert(b"he", &v(2), BPF_ANY).unwrap();
    // [llo] goes; [he] keeps its value and no eq child.
    m.remove(b"hello", None).unwrap();
    assert_eq!(m.live_nodes().1, 1);
    assert_eq!(keys(&m), [b"he".to_vec()]);
    // A split node whose new sibling goes: the two halves merge again.
    m.insert(b"hex", &v(3), BPF_ANY).unwrap();
    m.insert(b"hexagon", &v(4), BPF_ANY).unwrap();
    m.insert(b"hexed", &v(5), BPF_ANY).unwrap();
    let with = m.live_nodes().1;
    m.remove(b"hexed", None).unwrap();
    assert_eq!(m.live_nodes().1, with - 1);
    m.remove(b"hex", None).unwrap();
    assert_eq!(m.check_shape(), 2);
    for k in [&b"he"[..], b"hexagon"] {
        m.remove(k, None).unwrap();
    }
    assert_eq!((m.len(), m.live_nodes()), (0, (0, 0)));
    assert_eq!(keys(&m), Vec::<Vec<u8>>::new());
}

/// A node with siblings on both sides gives its place to its in-order
/// successor.
#[test]
fn a_sibling_with_both_sides_gives_way_to_its_successor() {
    let m = TstMap::new(4, 8, 100).unwrap();
    let order: [&[u8]; 8] = [b"m", b"f", b"t", b"p", b"w", b"n", b"o", b"c"];
    for (i, k) in order.iter().enumerate() {
        m.insert(k, &v(i as u64), BPF_ANY).unwrap();
    }
    m.insert(b"nn", &v(99), BPF_ANY).unwrap();
    // "m" is the root with both sides; its successor "n" sits below "t"
    // and "p", with "o" on its hi side and "nn" below it.
    m.remove(b"m", None).unwrap();
    assert_eq!(m.check_shape(), 8);
    assert_eq!(m.live_nodes().1, 8);
    let mut want: Vec<Vec<u8>> = order[1..].iter().map(|k| k.to_vec()).collect();
    want.push(b"nn".to_vec());
    want.sort();
    assert_eq!(keys(&m), want);
    for (i, k) in order.iter().enumerate().skip(1) {
        assert_eq!(get(&m, k), Some(i as u64), "{k:?}");
    }
    assert_eq!(get(&m, b"nn"), Some(99));
    // Then a successor that is the hi child itself, and the rest.
    m.remove(b"n", None).unwrap();
    m.remove(b"f", None).unwrap();
    assert_eq!(m.check_shape(), 6);
    for k in want.iter().filter(|k| !matches!(k.as_slice(), b"n" | b"f")) {
        m.remove(k, None).unwrap();
    }
    assert_eq!((m.len(), m.live_nodes()), (0, (0, 0)));
}

#[test]
fn next_key_walks_in_order_past_deleted_keys() {
    let m = TstMap::new(8, 8, 100).unwrap();
    for k in [&b"b"[..], b"ba", b"bb", b"c", b"a\xff", b"bab"] {
        m.insert(k, &v(0), BPF_ANY).unwrap();
    }
    let mut next = Vec::new();
    m.next_key(None, &mut next).unwrap();
    assert_eq!(next, b"a\xff");
    m.next_key(Some(b"a"), &mut next).unwrap();
    assert_eq!(next, b"a\xff");
    m.next_key(Some(b"a\xff\xff"), &mut next).unwrap();
    assert_eq!(next, b"b");
    m.next_key(Some(b"b"), &mut next).unwrap();
    assert_eq!(next, b"ba");
    m.next_key(Some(b"ba"), &mut next).unwrap();
    assert_eq!(next, b"bab");
    m.next_key(Some(b"ba\0"), &mut next).unwrap();
    assert_eq!(next, b"bab");
    m.remove(b"bb", None).unwrap();
    m.next_key(Some(b"bb"), &mut next).unwrap();
    assert_eq!(next, b"c");
    m.next_key(Some(b"bab"), &mut next).unwrap();
    assert_eq!(next, b"c");
    assert_eq!(m.next_key(Some(b"c"), &mut next), Err(Error::NotFound));
    assert_eq!(m.next_key(Some(b"\xff"), &mut next), Err(Error::NotFound));
    let empty = TstMap::new(8, 8, 1).unwrap();
    assert_eq!(empty.next_key(None, &mut next), Err(Error::NotFound));
}

/// A path as deep as the longest key (every prefix a key): the walk and
/// the frees use explicit stacks.
#[test]
fn a_path_as_deep_as_the_longest_key() {
    let n = crate::scaled(4096, 24);
    let m = TstMap::new(n, 8, n as u32).unwrap();
    for len in (1..=n).rev().step_by(2).chain((1..=n).step_by(2)) {
        m.insert(&vec![b'a'; len], &v(len as u64), BPF_NOEXIST)
            .unwrap();
    }
    assert_eq!(m.len(), n);
    assert_eq!(get(&m, &vec![b'a'; n]), Some(n as u64));
    let all = keys(&m);
    assert_eq!(all.len(), n);
    assert!(all.iter().enumerate().all(|(i, k)| k.len() == i + 1));
    let mut next = Vec::new();
    m.next_key(Some(&vec![b'a'; n / 2]), &mut next).unwrap();
    assert_eq!(next.len(), n / 2 + 1);
    for len in (1..=n).step_by(3) {
        m.remove(&vec![b'a'; len], None).unwrap();
    }
    assert_eq!(keys(&m).len(), m.len());
    drop(m);
}

#[test]
fn clear_empties_the_map_and_gives_the_memory_back() {
    let m = TstMap::new(8, 8, 1000).unwrap();
    let empty = m.memory_usage();
    for i in 0..crate::scaled(500, 40) as u64 {
        m.insert(&i.to_be_bytes()[5..], &v(i), BPF_ANY).unwrap();
    }
    assert!(m.memory_usage() > empty);
    m.clear();
    assert_eq!((m.len(), keys(&m).len(), m.live_nodes()), (0, 0, (0, 0)));
    m.insert(b"again", &v(1), BPF_NOEXIST).unwrap();
    m.remove(b"again", None).unwrap();
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

/// Dropping a big map hands its nodes to the reaper thread: it returns at
/// once.
#[test]
fn dropping_a_big_map_does_not_free_on_the_caller() {
    let n = crate::scaled(200_000, 16) as u64;
    let m = TstMap::new(8, 8, n as u32).unwrap();
    for i in 0..n {
        m.insert(&(i * 0x9E37_79B9).to_be_bytes(), &v(i), BPF_ANY)
            .unwrap();
    }
    let start = std::time::Instant::now();
    drop(m);
    if !cfg!(miri) && !cfg!(debug_assertions) {
        assert!(start.elapsed() < std::time::Duration::from_millis(20));
    }
}

/// An operation of the model-based test.
#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u8>, u64, u64),
    Remove(Vec<u8>, bool),
    Lookup(Vec<u8>),
    NextKey(Option<Vec<u8>>),
}

/// Keys from a small alphabet, with the bytes that order specially (0,
/// 0xff), so that keys collide, share prefixes and are prefixes of each
/// other; some at the map's longest.
fn arb_key(max: usize) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop::sample::select(vec![0u8, 1, b'a', b'b', 0x7f, 0xff]);
    prop_oneof![
        3 => prop::collection::vec(byte.clone(), 1..=max),
        1 => prop::collection::vec(byte, max..=max),
    ]
}

fn arb_ops(max_key: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (arb_key(max_key), any::<u64>(), 0..3u64).prop_map(|(k, v, f)| Op::Insert(k, v, f)),
        3 => (arb_key(max_key), any::<bool>()).prop_map(|(k, out)| Op::Remove(k, out)),
        1 => arb_key(max_key + 1).prop_map(Op::Lookup),
        1 => prop::option::of(arb_key(max_key + 1)).prop_map(Op::NextKey),
    ];
    prop::collection::vec(op, 1..crate::scaled(200, 24))
}

fn bound(b: Bound<&Vec<u8>>) -> Bound<&[u8]> {
    b.map(Vec::as_slice)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(128, 2) as u32))]

    /// Every operation's result against a `BTreeMap`, an error leaving
    /// the nodes as they were, the shape's invariants, then lookups,
    /// order, next keys and ranges.
    #[test]
    fn matches_a_btreemap(
        ops in arb_ops(6),
        probes in prop::collection::vec(arb_key(7), 1..crate::scaled(24, 4)),
        cap in 4..64usize,
    ) {
        let m = TstMap::new(6, 8, cap as u32).unwrap();
        let mut model: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for op in &ops {
            match op {
                Op::Insert(k, val, f) => {
                    let want = match (*f, model.contains_key(k)) {
                        (BPF_NOEXIST, true) => Err(Error::Exists),
                        (BPF_EXIST, false) => Err(Error::NotFound),
                        (_, false) if model.len() == cap => Err(Error::Full),
                        _ => Ok(()),
                    };
                    let before = want.is_err().then(|| m.live_nodes());
                    prop_assert_eq!(m.insert(k, &v(*val), *f), want.clone());
                    if want.is_ok() {
                        model.insert(k.clone(), *val);
                    } else {
                        prop_assert_eq!(Some(m.live_nodes()), before);
                    }
                }
                Op::Remove(k, with_out) => {
                    let mut out = [0u8; 8];
                    let before = m.live_nodes();
                    let got = m.remove(k, with_out.then_some(&mut out[..]));
                    match model.remove(k) {
                        Some(val) if *with_out => prop_assert_eq!((got, out), (Ok(()), v(val))),
                        Some(_) => prop_assert_eq!(got, Ok(())),
                        None => {
                            prop_assert_eq!(got, Err(Error::NotFound));
                            prop_assert_eq!(m.live_nodes(), before);
                        }
                    }
                }
                Op::Lookup(k) => prop_assert_eq!(get(&m, k), model.get(k).copied()),
                Op::NextKey(k) => {
                    let lower = k.as_ref().map_or(Bound::Unbounded, Bound::Excluded);
                    let want = model.range::<Vec<u8>, _>((lower, Bound::Unbounded)).next();
                    let mut next = Vec::new();
                    match want {
                        Some((w, _)) => {
                            prop_assert_eq!(m.next_key(k.as_deref(), &mut next), Ok(()));
                            prop_assert_eq!(&next, w);
                        }
                        None => prop_assert_eq!(m.next_key(k.as_deref(), &mut next), Err(Error::NotFound)),
                    }
                }
            }
            prop_assert_eq!(m.len(), model.len());
        }
        prop_assert_eq!(m.check_shape(), model.len());
        let guard = pin();
        let mut all: Vec<(Vec<u8>, u64)> = Vec::new();
        m.for_each(&guard, |k, v| {
            all.push((k.to_vec(), u64::from_ne_bytes(v.try_into().unwrap())));
            ControlFlow::Continue(())
        });
        prop_assert_eq!(&all, &model.clone().into_iter().collect::<Vec<_>>());
        prop_assert_eq!(walked(&m), model.keys().cloned().collect::<Vec<_>>());
        for p in &probes {
            prop_assert_eq!(get(&m, p), model.get(p).copied());
            let mut next = Vec::new();
            match model.range::<Vec<u8>, _>((Bound::Excluded(p), Bound::Unbounded)).next() {
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
                let want: Vec<_> = model.range::<Vec<u8>, _>((l, h)).map(|(k, _)| k.clone()).collect();
                let mut got = Vec::new();
                m.for_each_in((bound(l), bound(h)), &guard, |k, _| {
                    got.push(k.to_vec());
                    ControlFlow::Continue(())
                });
                prop_assert_eq!(got, want);
            }
        }
        // Removing everything leaves no node.
        for k in model.keys() {
            m.remove(k, None).unwrap();
        }
        prop_assert_eq!((m.len(), m.live_nodes()), (0, (0, 0)));
    }
}

/// A writer inserts and removes keys around stable ones (extensions of
/// them, prefixes of them, siblings: splits and merges next to them),
/// while readers look up the stable keys (always found, with their value)
/// and walk the map, with `for_each` and with `next_key` (strictly
/// increasing, so no key twice, and every stable key seen).
#[test]
fn readers_beside_a_writer_always_find_the_stable_keys() {
    let m = Arc::new(TstMap::new(16, 8, 100_000).unwrap());
    let n = crate::scaled(200, 4) as u64;
    let stable: Vec<Vec<u8>> = (0..n)
        .flat_map(|i| [format!("s{i}x"), format!("t{}", i * 7), format!("{i}")])
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
                let mut rounds = 0;
                while !stop.load(Ordering::Relaxed) || rounds < 2 {
                    i = (i + 7) % stable.len();
                    assert_eq!(get(&m, &stable[i]), Some(i as u64), "{:?}", stable[i]);
                    if i % 8 == r {
                        let mut seen = BTreeSet::new();
                        if rounds % 2 == 0 {
                            let guard = pin();
                            let mut prev: Option<Vec<u8>> = None;
                            m.for_each(&guard, |k, _| {
                                assert!(prev.as_deref().is_none_or(|p| p < k), "order");
                                prev = Some(k.to_vec());
                                seen.insert(k.to_vec());
                                ControlFlow::Continue(())
                            });
                        } else {
                            let mut prev: Option<Vec<u8>> = None;
                            let mut next = Vec::new();
                            while m.next_key(prev.as_deref(), &mut next).is_ok() {
                                assert!(prev.as_ref().is_none_or(|p| *p < next), "order");
                                prev = Some(next.clone());
                                seen.insert(next.clone());
                            }
                        }
                        assert!(
                            stable.iter().all(|k| seen.contains(k)),
                            "a stable key missed"
                        );
                        rounds += 1;
                    }
                    looked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    while looked.load(Ordering::Relaxed) < 2 {
        std::thread::yield_now();
    }
    let stable_set: BTreeSet<&[u8]> = stable.iter().map(Vec::as_slice).collect();
    for round in 0..crate::scaled(6, 1) as u64 {
        let churn = |i: u64| {
            [
                format!("s{i}x{round}"),
                format!("s{i}"),
                format!("t{}y", i * 7),
                format!("t{}", i * 7 + 3),
                format!("{i}{i}"),
                format!("u{i}"),
            ]
        };
        for i in 0..n {
            for k in churn(i) {
                if !stable_set.contains(k.as_bytes()) {
                    m.insert(k.as_bytes(), &v(u64::MAX), BPF_ANY).unwrap();
                }
            }
        }
        for i in (0..n).rev() {
            for k in churn(i) {
                if !stable_set.contains(k.as_bytes()) {
                    let _ = m.remove(k.as_bytes(), None);
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(m.len(), stable.len());
    assert_eq!(m.check_shape(), stable.len());
    let want: Vec<_> = stable
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(keys(&m), want);
}

/// A writer gives every key a new value per round (16 bytes: the round
/// twice); readers never see a value from before the last completed
/// round, nor one torn between two.
#[test]
fn updates_are_never_stale_or_torn() {
    let m = Arc::new(TstMap::new(8, 16, 1000).unwrap());
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
