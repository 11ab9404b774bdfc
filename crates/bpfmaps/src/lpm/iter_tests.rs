//! Iteration through the byte contract: `get_next_key` from any key
//! against a model of the post-order, walks interleaved with changes (in
//! turns and from another thread), and the kernel port's walk as the
//! oracle of order.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;

use super::key::{encode_key, mask_host_bits};
use super::{KernelLpmTrie, LpmTrie};
use crate::core::flags::BPF_ANY;
use crate::{Error, Map};

/// A prefix: masked data and length.
type Prefix = (Vec<u8>, u32);

/// Where a prefix comes in post-order: its last address, then longer
/// first.
fn post_key((data, len): &Prefix) -> (Vec<u8>, Reverse<u32>) {
    let mut last = data.clone();
    for i in *len as usize..8 * data.len() {
        last[i / 8] |= 0x80 >> (i % 8);
    }
    (last, Reverse(*len))
}

fn masked(mut data: Vec<u8>, len: u32) -> Prefix {
    mask_host_bits(&mut data, len);
    (data, len)
}

/// The model: the stored prefixes in post-order.
#[derive(Default)]
struct Model(BTreeMap<(Vec<u8>, Reverse<u32>), Prefix>);

impl Model {
    fn insert(&mut self, p: &Prefix) {
        self.0.insert(post_key(p), p.clone());
    }

    fn remove(&mut self, p: &Prefix) -> bool {
        self.0.remove(&post_key(p)).is_some()
    }

    /// The first stored prefix after `cursor` (stored or not) in
    /// post-order; the first of all for `None`.
    fn next_after(&self, cursor: Option<&Prefix>) -> Option<Prefix> {
        let from = cursor.map_or(Unbounded, |c| Excluded(post_key(&masked(c.0.clone(), c.1))));
        self.0
            .range((from, Unbounded))
            .next()
            .map(|(_, p)| p.clone())
    }

    fn all(&self) -> Vec<Prefix> {
        self.0.values().cloned().collect()
    }
}

/// One `get_next_key` through the byte contract: the key after `cursor`,
/// or `None` at `ENOENT`.
fn next_key(map: &impl Map, n: usize, cursor: Option<&Prefix>) -> Option<Prefix> {
    let key = cursor.map(|(d, l)| encode_key(*l, d));
    let mut next = vec![0u8; 4 + n];
    match map.get_next_key(key.as_deref(), &mut next) {
        Ok(_) => Some((
            next[4..].to_vec(),
            u32::from_ne_bytes(next[..4].try_into().unwrap()),
        )),
        Err(Error::NotFound) => None,
        Err(e) => panic!("get_next_key: {e}"),
    }
}

/// A whole walk through the byte contract, from no key to `ENOENT`.
fn walk(map: &impl Map, n: usize) -> Vec<Prefix> {
    std::iter::successors(next_key(map, n, None), |p| next_key(map, n, Some(p))).collect()
}

/// A prefix of `n` bytes, biased toward a few byte values so that
/// prefixes nest, share nodes and fill runs.
fn arb_prefix(n: usize) -> impl Strategy<Value = Prefix> {
    (
        prop::collection::vec(
            prop_oneof![Just(0u8), Just(0x7f), Just(0x80), Just(0xff), any::<u8>()],
            n,
        ),
        0..=(8 * n as u32),
    )
        .prop_map(|(d, l)| masked(d, l))
}

/// A key size, and prefixes and probes of it.
fn sets(count: usize) -> impl Strategy<Value = (usize, Vec<Prefix>, Vec<Prefix>)> {
    prop_oneof![Just(1usize), Just(2), Just(4), Just(16)].prop_flat_map(move |n| {
        (
            Just(n),
            prop::collection::vec(arb_prefix(n), 0..count),
            prop::collection::vec(arb_prefix(n), 0..16),
        )
    })
}

fn trie_of(n: usize, prefixes: &[Prefix]) -> (LpmTrie, Model) {
    let t = LpmTrie::new(n, 4, 1 << 16).unwrap();
    let mut model = Model::default();
    for (i, p) in prefixes.iter().enumerate() {
        t.insert(&p.0, p.1, &(i as u32).to_ne_bytes(), BPF_ANY)
            .unwrap();
        model.insert(p);
    }
    (t, model)
}

/// A change made during a walk.
#[derive(Debug, Clone)]
enum Change {
    Insert(Prefix),
    /// Removes the stored prefix picked by the index.
    Remove(usize),
    /// Removes the key the walk just returned.
    RemoveCursor,
}

fn changes(n: usize) -> impl Strategy<Value = Vec<Vec<Change>>> {
    let change = prop_oneof![
        arb_prefix(n).prop_map(Change::Insert),
        any::<usize>().prop_map(Change::Remove),
        Just(Change::RemoveCursor),
    ];
    // Per step of the walk: up to two changes.
    prop::collection::vec(prop::collection::vec(change, 0..3), 0..crate::scaled(80, 6))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(96, 1) as u32))]

    /// From no key, from every stored key and from keys that are not
    /// stored, `get_next_key` gives the model's next prefix in
    /// post-order; a whole walk is the model's order and the kernel
    /// port's.
    #[test]
    fn get_next_key_from_any_key_is_the_models_next(
        (n, prefixes, probes) in sets(crate::scaled(80, 10)),
    ) {
        let (t, model) = trie_of(n, &prefixes);
        let kernel = KernelLpmTrie::new(n, 4, 1 << 16).unwrap();
        for (i, p) in prefixes.iter().enumerate() {
            kernel.insert_data(&p.0, p.1, &(i as u32).to_ne_bytes(), BPF_ANY).unwrap();
        }
        prop_assert_eq!(next_key(&t, n, None), model.next_after(None));
        for cursor in model.all().iter().chain(&probes) {
            prop_assert_eq!(
                next_key(&t, n, Some(cursor)),
                model.next_after(Some(cursor)),
                "after {:?}", cursor
            );
        }
        // Host bits in the key are ignored, as for every key.
        for (d, l) in &probes {
            let mut noisy = d.clone();
            noisy.iter_mut().for_each(|b| *b |= 0x55);
            let noisy = (noisy, *l);
            prop_assert_eq!(next_key(&t, n, Some(&noisy)), model.next_after(Some(&noisy)));
        }
        let all = walk(&t, n);
        prop_assert_eq!(&all, &model.all());
        prop_assert_eq!(&walk(&kernel, n), &all);
    }

    /// A walk that inserts and removes prefixes between its steps (the key
    /// it just got among them) gets, at each step, the model's next prefix
    /// after its cursor at that moment; so every prefix stored throughout
    /// comes exactly once, in order.
    #[test]
    fn walks_interleaved_with_changes_see_every_stable_key_once(
        ((n, prefixes, _), steps) in sets(crate::scaled(80, 10))
            .prop_flat_map(|s| { let n = s.0; (Just(s), changes(n)) }),
    ) {
        let (t, mut model) = trie_of(n, &prefixes);
        // Prefixes stored throughout: those of the start not removed yet.
        let mut stable: BTreeSet<_> = model.0.keys().cloned().collect();
        let mut seen = Vec::new();
        let mut cursor = None;
        let mut steps = steps.into_iter();
        loop {
            let next = next_key(&t, n, cursor.as_ref());
            prop_assert_eq!(&next, &model.next_after(cursor.as_ref()), "after {:?}", cursor);
            let Some(next) = next else { break };
            seen.push(post_key(&next));
            for change in steps.next().unwrap_or_default() {
                let gone = match change {
                    Change::Insert(p) => {
                        t.insert(&p.0, p.1, &[1; 4], BPF_ANY).unwrap();
                        model.insert(&p);
                        continue;
                    }
                    Change::Remove(i) if !model.0.is_empty() => {
                        model.all()[i % model.0.len()].clone()
                    }
                    Change::Remove(_) => continue,
                    Change::RemoveCursor => next.clone(),
                };
                let want = if model.remove(&gone) { Ok(()) } else { Err(Error::NotFound) };
                prop_assert_eq!(t.remove(&gone.0, gone.1, None), want);
                stable.remove(&post_key(&gone));
            }
            cursor = Some(next);
        }
        prop_assert!(seen.is_sorted_by(|a, b| a < b), "out of order: {:?}", seen);
        let seen: BTreeSet<_> = seen.into_iter().collect();
        prop_assert!(stable.is_subset(&seen), "missed {:?}", stable.difference(&seen).collect::<Vec<_>>());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(96, 1) as u32))]

    /// `for_each` gives every prefix with its value in prefix order
    /// (address, then length), and `covered` the part inside a prefix;
    /// values over 4 bytes (route slots) too.
    #[test]
    fn pre_order_gives_every_prefix_with_its_value(
        (n, prefixes, probes) in sets(crate::scaled(80, 10)),
        wide in any::<bool>(),
    ) {
        let value_size = if wide { 8 } else { 4 };
        let t = LpmTrie::new(n, value_size, 1 << 16).unwrap();
        let value = |i: usize| (i as u64 * 0x0101_0101_0101 + 1).to_ne_bytes()[..value_size].to_vec();
        let mut want = BTreeMap::new();
        for (i, p) in prefixes.iter().enumerate() {
            t.insert(&p.0, p.1, &value(i), BPF_ANY).unwrap();
            want.insert(p.clone(), value(i));
        }
        let guard = crate::pin();
        let mut got = vec![];
        t.for_each(&guard, |d, l, v| got.push(((d.to_vec(), l), v.to_vec())));
        prop_assert_eq!(&got, &want.clone().into_iter().collect::<Vec<_>>());
        for (d, l) in &probes {
            let inside: Vec<_> = want
                .iter()
                .filter(|(p, _)| p.1 >= *l && super::key::prefix_contains(d, *l, &p.0))
                .map(|(p, v)| (p.clone(), v.clone()))
                .collect();
            let got: Vec<_> = t
                .covered(d, *l, &guard)
                .unwrap()
                .into_iter()
                .map(|f| {
                    let v = t.value_of(&f, &guard).to_vec();
                    ((f.data, f.prefixlen), v)
                })
                .collect();
            prop_assert_eq!(got, inside, "inside {:?}/{}", d, l);
        }
    }
}

/// Deleting each key as the walk returns it, the kernel's documented way
/// to empty a map, empties it, in post-order.
#[test]
fn deleting_each_key_as_it_comes_empties_the_map_in_order() {
    let mut prefixes = vec![];
    for a in [0u8, 10, 127, 128, 192, 255] {
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 24, 31, 32] {
            prefixes.push(masked(vec![a, a ^ 0x5a, 0xff, 1], len));
        }
    }
    let (t, model) = trie_of(4, &prefixes);
    let mut seen = vec![];
    let mut cursor: Option<Prefix> = None;
    while let Some(next) = next_key(&t, 4, cursor.as_ref()) {
        t.remove(&next.0, next.1, None).unwrap();
        seen.push(next.clone());
        cursor = Some(next);
    }
    assert_eq!(seen, model.all());
    assert_eq!(t.len(), 0);
}

/// A reader walking beside a writer that keeps inserting and removing
/// other prefixes sees every prefix the writer never touches exactly
/// once per walk, and every answer in post-order after the one before.
#[test]
fn a_walk_beside_a_writer_sees_every_stable_key_once_in_order() {
    let n = 4;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut random = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut prefix = || {
        let r = random();
        // Few first bytes, so stable and churned prefixes share nodes.
        let data = vec![(r % 5) as u8 * 50, (r >> 8) as u8, (r >> 16) as u8, 0];
        masked(data, (r >> 32) as u32 % 33)
    };
    let count = crate::scaled(3000, 12);
    let mut stable = BTreeSet::new();
    let mut churn = BTreeSet::new();
    for i in 0..2 * count {
        let p = prefix();
        if !stable.contains(&p) && !churn.contains(&p) {
            if i % 2 == 0 { &mut stable } else { &mut churn }.insert(p);
        }
    }
    let t = Arc::new(LpmTrie::new(n, 4, 1 << 16).unwrap());
    for p in stable.iter().chain(&churn) {
        t.insert(&p.0, p.1, &[1; 4], BPF_ANY).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (t, stop) = (t.clone(), stop.clone());
        let churn: Vec<_> = churn.iter().cloned().collect();
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) || rounds == 0 {
                for p in &churn {
                    t.remove(&p.0, p.1, None).unwrap();
                }
                for p in &churn {
                    t.insert(&p.0, p.1, &[2; 4], BPF_ANY).unwrap();
                }
                rounds += 1;
            }
        })
    };
    let want: BTreeSet<_> = stable.iter().map(post_key).collect();
    for _ in 0..crate::scaled(20, 1) {
        let seen: Vec<_> = walk(&*t, n).iter().map(post_key).collect();
        assert!(seen.is_sorted_by(|a, b| a < b), "a walk out of order");
        let stable_seen: Vec<_> = seen.iter().filter(|k| want.contains(k)).collect();
        assert_eq!(stable_seen.len(), want.len(), "a stable prefix missed");
        assert!(
            seen.iter()
                .all(|k| want.contains(k) || churn.iter().any(|p| post_key(p) == *k))
        );
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

/// The kernel port's walk is the oracle of order: on the real tables,
/// both walks give every prefix in the same order.
#[test]
#[cfg_attr(miri, ignore = "the real table: a million prefixes")]
fn walks_match_the_kernel_port_on_the_real_tables() {
    for (file, n) in [
        ("prefixes_ipv4.txt.gz", 4usize),
        ("prefixes_ipv6.txt.gz", 16),
    ] {
        let Some(prefixes) = super::tests::shared_prefixes(file) else {
            return;
        };
        let t = LpmTrie::new(n, 4, prefixes.len() as u32).unwrap();
        let kernel = KernelLpmTrie::new(n, 4, prefixes.len() as u32).unwrap();
        for (i, (d, l)) in prefixes.iter().enumerate() {
            t.insert(d, *l, &(i as u32).to_ne_bytes(), BPF_ANY).unwrap();
            kernel
                .insert_data(d, *l, &(i as u32).to_ne_bytes(), BPF_ANY)
                .unwrap();
        }
        let ours = walk(&t, n);
        assert_eq!(ours.len(), prefixes.len(), "{file}");
        assert!(ours == walk(&kernel, n), "{file}: the walks differ");
        // Pre-order: sorted by address, then length.
        let mut sorted = prefixes.clone();
        sorted.sort();
        let guard = crate::pin();
        let mut pre = Vec::with_capacity(prefixes.len());
        t.for_each(&guard, |d, l, _| pre.push((d.to_vec(), l)));
        assert!(pre == sorted, "{file}: for_each out of order");
    }
}
