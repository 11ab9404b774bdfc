//! `QpTrieMap`: the string maps' shared tests ([`super::common_tests`]),
//! then get_many, longest prefixes, the shape after removals, a
//! model-based run against a `BTreeMap` with ranges and prefixes, and
//! readers beside writers in disjoint and shared subtrees.

use std::sync::Arc;

use proptest::prelude::*;

use super::block::{BUCKET_BYTES, BUCKET_KEYS};
use super::common_tests::{self as common, Model, StringMap, v};
use super::{MAX_INLINE_TAIL, QpTrieMap};
use crate::core::contract::{MapSpec, MapType};
use crate::core::flags::{BPF_ANY, BPF_NOEXIST};
use crate::{Error, create, pin};

#[test]
fn keys_that_are_prefixes_of_each_other_and_nul_bytes() {
    common::keys_that_are_prefixes_of_each_other_and_nul_bytes::<QpTrieMap>();
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
    common::update_flags_follow_the_kernel::<QpTrieMap>();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    common::bad_input_is_refused_and_changes_nothing(QpTrieMap::live_bytes);
}

/// The largest key size a map takes, under Miri too.
#[test]
fn the_longest_keys_and_remove_with_out() {
    common::the_longest_keys_and_remove_with_out::<QpTrieMap>(4096);
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
    assert_eq!(m.keys(), fresh.keys());
}

#[test]
fn next_key_walks_in_order_past_deleted_keys() {
    common::next_key_walks_in_order_past_deleted_keys::<QpTrieMap>();
}

#[test]
fn clear_empties_the_map_and_gives_the_memory_back() {
    common::clear_empties_the_map_and_gives_the_memory_back::<QpTrieMap>();
}

/// An operation of the model-based test.
#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u8>, u64, u64),
    Remove(Vec<u8>),
    /// `compact()`: later writes then replace packed nodes.
    Compact,
}

/// Keys of 1 to `max` bytes from [`common::key_byte`]'s alphabet.
fn arb_key(max: usize) -> impl Strategy<Value = Vec<u8>> + Clone {
    prop::collection::vec(common::key_byte(), 1..=max)
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
        1 => Just(Op::Compact),
    ];
    common::ops_of(op)
}

fn arb_ops(max_key: usize) -> impl Strategy<Value = Vec<Op>> {
    arb_ops_of(arb_key(max_key))
}

proptest! {
    #![proptest_config(common::model_cases())]

    /// Every operation's result and every query against a `BTreeMap`:
    /// lookups, order, ranges, prefixes, longest prefixes, next keys, and
    /// the shape (the nodes of a fresh build of the same keys).
    #[test]
    fn matches_a_btreemap((ops, probes, cap) in common::model_input(arb_ops(6), arb_key(7))) {
        matches_the_model(&ops, &probes, cap, 6)?;
    }

    /// The same with long keys: leaves past `MAX_INLINE_TAIL` bytes.
    #[test]
    fn matches_a_btreemap_with_long_keys(
        (ops, probes, cap) in common::model_input(arb_ops_of(arb_long_key()), arb_long_key()),
    ) {
        matches_the_model(&ops, &probes, cap, 4 * (MAX_INLINE_TAIL + 1))?;
    }
}

/// Every operation's result and every query against a `BTreeMap` (see
/// `matches_a_btreemap`), for keys of at most `max_key` bytes (`probes`
/// may be longer): with the default buckets, and with buckets of at most
/// 3 keys and 40 bytes, which these small key sets fill, burst and empty.
fn matches_the_model(
    ops: &[Op],
    probes: &[Vec<u8>],
    cap: usize,
    max_key: usize,
) -> Result<(), TestCaseError> {
    for (keys, bytes) in [(BUCKET_KEYS, BUCKET_BYTES), (3, 40)] {
        let new = || {
            QpTrieMap::new(max_key, 8, cap as u32)
                .unwrap()
                .with_buckets(keys, bytes)
                .unwrap()
        };
        let m = new();
        let mut model = Model::new();
        for op in ops {
            match op {
                Op::Insert(k, val, f) => {
                    let want = common::insert_result(&model, k, *f, cap);
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
                Op::Compact => m.compact(),
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
        common::check_probes(&m, &model, probes)?;
        for p in probes {
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
        }
        // Every key starts with the empty prefix.
        prop_assert_eq!(
            m.prefix(&[], &guard).map(|(k, _)| k).collect::<Vec<_>>(),
            model.keys().cloned().collect::<Vec<_>>()
        );
        // `range` as well as `for_each_in`.
        common::check_ranges(&m, &model, probes, |l, h, want| {
            let got: Vec<_> = m
                .range::<Vec<u8>>((l.cloned(), h.cloned()), &guard)
                .map(|(k, _)| k)
                .collect();
            prop_assert_eq!(&got, want);
            Ok(())
        })?;
        let fresh = new();
        for (k, val) in &model {
            fresh.insert(k, &v(*val), BPF_NOEXIST).unwrap();
        }
        prop_assert_eq!(m.live_bytes(), fresh.live_bytes());
        prop_assert_eq!(m.bucket_keys(), fresh.bucket_keys());
    }
    Ok(())
}

/// Writers insert and remove keys in their own subtrees and in a shared
/// one, while readers look up stable keys (present throughout: always
/// found, with their value) and walk the map with its iterator (every key
/// once, in order, every stable key seen).
#[test]
fn readers_and_writers_in_disjoint_and_shared_subtrees() {
    let m = Arc::new(QpTrieMap::new(12, 8, 100_000).unwrap());
    let n = crate::scaled(300, 6) as u64;
    let stable: Vec<Vec<u8>> = (0..n)
        .flat_map(|i| [format!("a{i}"), format!("s{i}"), format!("b{i}x")])
        .map(String::into_bytes)
        .collect();
    // Writer 0 churns keys below and beside the stable ones in subtree
    // `a`, writer 1 in `b`; both churn the shared subtree `s`.
    let write = || {
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
    };
    common::readers_beside_writers(&m, &stable, |i, _| i % 16 == 0, 0, |m, _| m.keys(), write);
}

/// `compact` copies every subtree into one slab in walk order (each node
/// before its children, siblings in order), keeps every key, leaves an
/// unchanged subtree alone, and its memory account is exact: after the
/// grace period the map holds its live nodes and nothing else, and a
/// slab whose nodes were all replaced is freed.
#[test]
fn compact_lays_subtrees_out_in_walk_order_and_frees_what_it_replaced() {
    let n = crate::scaled(3000, 40) as u64;
    // Even keys in subtree `a`, odd in `b` (`n` even: `i + n` too).
    let key =
        |i: u64| format!("{}{}_{}", ["a", "b"][i as usize % 2], i * 7919 % 1000, i).into_bytes();
    let m = QpTrieMap::new(16, 8, 10_000).unwrap();
    let empty = m.memory_usage();
    let exact = |m: &QpTrieMap| m.memory_usage() == empty + m.live_bytes();
    for i in 0..n {
        m.insert(&key(i), &v(i), BPF_NOEXIST).unwrap();
    }
    let before = m.keys();
    m.compact();
    assert_eq!(m.keys(), before);
    for i in 0..n {
        assert_eq!(common::get(&m, &key(i)), Some(i));
    }
    let layout = m.node_words_in_walk_order();
    assert!(layout.iter().flatten().all(|&(_, packed)| packed));
    for subtree in &layout {
        assert!(subtree.windows(2).all(|w| w[0].0 < w[1].0), "walk order");
    }
    assert_eq!(m.wrong_spans(), 0);
    assert!(crate::core::reclaim::wait_for_grace(|| exact(&m)));

    // Nothing changed: nothing copied.
    m.compact();
    assert_eq!(m.node_words_in_walk_order(), layout);

    // Writes (in subtree `a`) replace packed nodes with heap ones; the
    // slab stays until its last node goes, and compacting again gives the
    // replaced ones back.
    for i in (0..n).step_by(2) {
        m.remove(&key(i), None).unwrap();
        m.insert(&key(i + n), &v(i), BPF_NOEXIST).unwrap();
    }
    let mixed = m.node_words_in_walk_order();
    assert!(mixed.iter().flatten().any(|&(_, packed)| packed));
    assert!(mixed.iter().flatten().any(|&(_, packed)| !packed));
    assert_eq!(m.wrong_spans(), 0);
    assert!(m.memory_usage() > empty + m.live_bytes());
    m.compact();
    assert!(crate::core::reclaim::wait_for_grace(|| exact(&m)));
    let want: Vec<_> = (0..n)
        .map(|i| if i % 2 == 0 { key(i + n) } else { key(i) })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(m.keys(), want);

    // Removing every key frees every slab.
    for k in &want {
        m.remove(k, None).unwrap();
    }
    assert!(crate::core::reclaim::wait_for_grace(
        || m.memory_usage() == empty
    ));

    // So does `clear`, and dropping a compacted map frees its slabs (Miri
    // checks both frees).
    for i in 0..n {
        m.insert(&key(i), &v(i), BPF_NOEXIST).unwrap();
    }
    m.compact();
    m.clear();
    assert!(crate::core::reclaim::wait_for_grace(
        || m.memory_usage() == empty
    ));
    // A caller with a guard pinned cannot wait for the grace period: its
    // compaction leaves the free to the reaper.
    m.insert(b"k1", &v(1), BPF_NOEXIST).unwrap();
    {
        let guard = pin();
        m.compact();
        assert_eq!(m.get(b"k1", &guard), Some(&v(1)[..]));
    }
    assert!(crate::core::reclaim::wait_for_grace(|| exact(&m)));
}

/// Readers look up and walk while two writers churn and a third thread
/// compacts over and over: every stable key found, walks in order.
#[test]
fn readers_beside_writers_and_compaction() {
    let m = Arc::new(QpTrieMap::new(12, 8, 100_000).unwrap());
    let n = crate::scaled(300, 6) as u64;
    let stable: Vec<Vec<u8>> = (0..n)
        .flat_map(|i| [format!("a{i}"), format!("b{i}x")])
        .map(String::into_bytes)
        .collect();
    let write = || {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let compactor = {
            let (m, done) = (m.clone(), done.clone());
            std::thread::spawn(move || {
                // Under Miri a few compactions, spread over the writes
                // (each is interpreted in full, with its grace period).
                let mut left = crate::scaled(usize::MAX, 3);
                while left > 0 && !done.load(std::sync::atomic::Ordering::Relaxed) {
                    m.compact();
                    left -= 1;
                    std::thread::yield_now();
                    crate::reader_pause();
                }
            })
        };
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for round in 0..crate::scaled(6, 2) as u64 {
                        let churn = |i: u64| format!("{}{i}y{round}", ["a", "b"][w as usize]);
                        for i in 0..n {
                            m.insert(churn(i).as_bytes(), &v(u64::MAX), BPF_NOEXIST)
                                .unwrap();
                        }
                        for i in 0..n {
                            m.remove(churn(i).as_bytes(), None).unwrap();
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        compactor.join().unwrap();
    };
    common::readers_beside_writers(&m, &stable, |i, _| i % 16 == 0, 0, |m, _| m.keys(), write);
    m.compact();
    let empty = QpTrieMap::new(12, 8, 100_000).unwrap().memory_usage();
    assert!(crate::core::reclaim::wait_for_grace(
        || m.memory_usage() == empty + m.live_bytes()
    ));
}

#[test]
fn updates_are_never_stale_or_torn() {
    common::updates_are_never_stale_or_torn::<QpTrieMap>();
}

/// A subtree past `BUCKET_KEYS` keys bursts into a node over buckets;
/// removed down to a bucket's worth, it is one bucket again, as a fresh
/// build of the keys left is.
///
/// Under Miri the buckets hold 16 keys: every insert copies its bucket,
/// and filling buckets of 255 took two minutes of the interpreter.
#[test]
fn buckets_burst_and_collapse() {
    let bucket = crate::scaled(BUCKET_KEYS, 16);
    let (total, kept) = (4 * bucket, bucket / 2);
    let m = QpTrieMap::new(8, 8, 10_000)
        .unwrap()
        .with_buckets(bucket, BUCKET_BYTES)
        .unwrap();
    let key = |i: usize| format!("k{i:04}").into_bytes();
    for i in 0..bucket {
        m.insert(&key(i), &v(i as u64), BPF_NOEXIST).unwrap();
    }
    assert_eq!(m.bucket_keys(), (1, bucket));
    for i in bucket..total {
        m.insert(&key(i), &v(i as u64), BPF_NOEXIST).unwrap();
    }
    let (buckets, held) = m.bucket_keys();
    assert!(
        buckets > 1 && held == total,
        "{buckets} buckets holding {held} keys"
    );
    for i in kept..total {
        m.remove(&key(i), None).unwrap();
    }
    assert_eq!(m.bucket_keys(), (1, kept));
    let guard = pin();
    for i in 0..total {
        let want = (i < kept).then(|| v(i as u64));
        assert_eq!(m.get(&key(i), &guard), want.as_ref().map(|w| &w[..]));
    }
}

/// Bucket sizes: set before any key, at most 255 keys and 65,535 bytes,
/// through `map_extra` as through the typed call; below 2 keys, none.
#[test]
fn bucket_limits_are_checked_and_reach_the_contract() {
    let m = || QpTrieMap::new(8, 8, 100).unwrap();
    assert!(matches!(m().with_buckets(256, 100), Err(Error::Invalid(_))));
    assert!(matches!(
        m().with_buckets(8, 65_536),
        Err(Error::Invalid(_))
    ));
    let full = m();
    full.insert(b"a", &v(1), BPF_ANY).unwrap();
    assert!(matches!(full.with_buckets(8, 100), Err(Error::Invalid(_))));
    let none = m().with_buckets(0, 0).unwrap();
    for k in [&b"ab"[..], b"ac", b"ad"] {
        none.insert(k, &v(1), BPF_ANY).unwrap();
    }
    assert_eq!(none.bucket_keys(), (0, 0));

    let spec = |extra| MapSpec::new(MapType::QP_TRIE, 8, 8, 100).extra(extra);
    let small = create(&spec(3 | 40 << 8)).unwrap();
    assert_eq!(small.info().map_extra, 3 | 40 << 8);
    assert_eq!(create(&spec(0)).unwrap().info().map_extra, 0);
    assert!(matches!(create(&spec(1 << 24)), Err(Error::Invalid(_))));
}

/// A path as deep as the longest key, compacted halfway.
#[test]
fn a_path_as_deep_as_the_longest_key() {
    common::a_path_as_deep_as_the_longest_key::<QpTrieMap>(|m| m.compact());
}
