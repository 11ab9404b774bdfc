//! `TstMap`: the string maps' shared tests ([`super::common_tests`]) with
//! the shape checked after them, then the patch's example, the shape
//! after removals, the deepest path, a model-based run against a
//! `BTreeMap`, and readers beside a writer.

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::sync::Arc;

use proptest::prelude::*;

use super::TstMap;
use super::common_tests::{self as common, Model, StringMap, get, v, walked};
use crate::core::flags::{BPF_ANY, BPF_NOEXIST};
use crate::{Error, pin};

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
        m.keys(),
        [&b"he"[..], b"hello", b"tea", b"team", b"test"].map(<[u8]>::to_vec)
    );
}

#[test]
fn keys_that_are_prefixes_of_each_other_and_nul_bytes() {
    let m = common::keys_that_are_prefixes_of_each_other_and_nul_bytes::<TstMap>();
    assert_eq!(m.check_shape(), 9);
}

#[test]
fn update_flags_follow_the_kernel() {
    let m = common::update_flags_follow_the_kernel::<TstMap>();
    assert_eq!(m.check_shape(), 4);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    common::bad_input_is_refused_and_changes_nothing(|m: &TstMap| {
        (m.live_nodes(), m.memory_usage())
    });
}

#[test]
fn the_longest_keys_and_remove_with_out() {
    // The largest key size a map takes (smaller under Miri: comparing
    // 4,096-byte keys byte by byte is most of the test's time there).
    let m = common::the_longest_keys_and_remove_with_out::<TstMap>(crate::scaled(4096, 300));
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
    assert_eq!(m.keys(), [b"he".to_vec()]);
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
    assert_eq!(m.keys(), Vec::<Vec<u8>>::new());
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
    assert_eq!(m.keys(), want);
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
    common::next_key_walks_in_order_past_deleted_keys::<TstMap>();
}

/// A path as deep as the longest key: the walk and the frees use
/// explicit stacks; `remove` recurses once per node on the path.
#[test]
fn a_path_as_deep_as_the_longest_key() {
    common::a_path_as_deep_as_the_longest_key::<TstMap>(|_| {});
}

#[test]
fn clear_empties_the_map_and_gives_the_memory_back() {
    common::clear_empties_the_map_and_gives_the_memory_back::<TstMap>();
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

/// Keys from [`common::key_byte`]'s alphabet, so that keys collide, share
/// prefixes and are prefixes of each other; some at the map's longest.
fn arb_key(max: usize) -> impl Strategy<Value = Vec<u8>> {
    let byte = common::key_byte();
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
    common::ops_of(op)
}

proptest! {
    #![proptest_config(common::model_cases())]

    /// Every operation's result against a `BTreeMap`, an error leaving
    /// the nodes as they were, the shape's invariants, then lookups,
    /// order, next keys and ranges.
    #[test]
    fn matches_a_btreemap((ops, probes, cap) in common::model_input(arb_ops(6), arb_key(7))) {
        let m = TstMap::new(6, 8, cap as u32).unwrap();
        let mut model = Model::new();
        for op in &ops {
            match op {
                Op::Insert(k, val, f) => {
                    let want = common::insert_result(&model, k, *f, cap);
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
                Op::NextKey(k) => common::check_next_key(&m, &model, k.as_ref())?,
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
        common::check_probes(&m, &model, &probes)?;
        common::check_ranges(&m, &model, &probes, |_, _, _| Ok(()))?;
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
/// and walk the map, with `for_each` and with `next_key` in turns
/// (strictly increasing, so no key twice, and every stable key seen).
#[test]
fn readers_beside_a_writer_always_find_the_stable_keys() {
    let m = Arc::new(TstMap::new(16, 8, 100_000).unwrap());
    let n = crate::scaled(200, 4) as u64;
    let stable: Vec<Vec<u8>> = (0..n)
        .flat_map(|i| [format!("s{i}x"), format!("t{}", i * 7), format!("{i}")])
        .map(String::into_bytes)
        .collect();
    let stable_set: BTreeSet<&[u8]> = stable.iter().map(Vec::as_slice).collect();
    let write = || {
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
    };
    let walk = |m: &TstMap, n: usize| {
        if n.is_multiple_of(2) {
            m.keys()
        } else {
            walked(m)
        }
    };
    common::readers_beside_writers(&m, &stable, |i, r| i % 8 == r, 2, walk, write);
    assert_eq!(m.check_shape(), stable.len());
}

#[test]
fn updates_are_never_stale_or_torn() {
    common::updates_are_never_stale_or_torn::<TstMap>();
}
