//! Tests of both hash maps: every operation and flag, a model-based property
//! test and concurrency stress (bad input: the contract suite,
//! `crate::conformance`).

use std::collections::HashMap as Model;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;

use super::*;
use crate::core::flags::{BPF_ANY, BPF_EXIST, BPF_NOEXIST};
use crate::{Map, MapSpec, create};

fn k(i: u32) -> [u8; 4] {
    i.to_ne_bytes()
}
fn v(i: u64) -> [u8; 8] {
    i.to_ne_bytes()
}
fn get(map: &dyn Map, key: u32) -> Option<u64> {
    let mut out = [0u8; 8];
    map.lookup(&k(key), &mut out)
        .ok()
        .map(|()| u64::from_ne_bytes(out))
}

fn both(max: u32) -> Vec<Box<dyn Map>> {
    let opts = HashOptions {
        seed: Some(1),
        ..HashOptions::default()
    };
    vec![
        Box::new(HashMap::with_options(4, 8, max, opts).unwrap()),
        Box::new(
            HashMap::with_options(
                4,
                8,
                max,
                HashOptions {
                    prealloc: false,
                    ..opts
                },
            )
            .unwrap(),
        ),
        Box::new(LruHashMap::with_options(4, 8, max, opts).unwrap()),
    ]
}

#[test]
fn update_flags_follow_the_kernel() {
    for map in both(16) {
        assert_eq!(map.update(&k(1), &v(10), BPF_EXIST), Err(Error::NotFound));
        map.update(&k(1), &v(10), BPF_NOEXIST).unwrap();
        assert_eq!(map.update(&k(1), &v(11), BPF_NOEXIST), Err(Error::Exists));
        assert_eq!(get(&*map, 1), Some(10));
        map.update(&k(1), &v(12), BPF_EXIST).unwrap();
        assert_eq!(get(&*map, 1), Some(12));
        map.update(&k(1), &v(13), BPF_ANY).unwrap();
        map.update(&k(2), &v(20), BPF_ANY).unwrap();
        assert_eq!(
            (get(&*map, 1), get(&*map, 2), map.len()),
            (Some(13), Some(20), 2)
        );
        assert_eq!(map.update(&k(3), &v(0), 4).unwrap_err().errno(), 22);
        assert_eq!(map.len(), 2);
    }
}

#[test]
fn delete_and_lookup_and_delete() {
    for map in both(16) {
        map.update(&k(1), &v(10), BPF_ANY).unwrap();
        map.update(&k(2), &v(20), BPF_ANY).unwrap();
        map.delete(&k(1)).unwrap();
        assert_eq!(map.delete(&k(1)), Err(Error::NotFound));
        assert_eq!(get(&*map, 1), None);
        let mut out = [0u8; 8];
        map.lookup_and_delete(&k(2), &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 20);
        assert_eq!(map.lookup_and_delete(&k(2), &mut out), Err(Error::NotFound));
        assert!(map.is_empty());
    }
}

#[test]
fn hash_map_is_full_at_max_entries() {
    for prealloc in [true, false] {
        let map = HashMap::with_options(
            4,
            8,
            100,
            HashOptions {
                prealloc,
                ..Default::default()
            },
        )
        .unwrap();
        for i in 0..100 {
            map.update(&k(i), &v(i as u64), BPF_ANY).unwrap();
        }
        assert_eq!(map.update(&k(100), &v(0), BPF_ANY), Err(Error::Full));
        // Replacing an existing key still works when full.
        map.update(&k(5), &v(55), BPF_ANY).unwrap();
        assert_eq!(get(&map, 5), Some(55));
        map.delete(&k(0)).unwrap();
        map.update(&k(100), &v(100), BPF_NOEXIST).unwrap();
        assert_eq!(map.len(), 100);
    }
}

#[test]
fn many_replacements_do_not_exhaust_a_full_preallocated_map() {
    // Replaced elements wait out a grace period before reuse; the slab must
    // cope (grow a little) rather than fail.
    let map = HashMap::new(4, 8, 64).unwrap();
    for i in 0..64 {
        map.update(&k(i), &v(0), BPF_ANY).unwrap();
    }
    let rounds = crate::scaled(200, 10) as u64;
    for round in 0..rounds {
        for i in 0..64 {
            map.update(&k(i), &v(round), BPF_ANY).unwrap();
        }
    }
    assert!((0..64).all(|i| get(&map, i) == Some(rounds - 1)));
}

#[test]
fn lru_evicts_instead_of_failing_and_keeps_hot_keys() {
    let map = LruHashMap::new(4, 8, 64).unwrap();
    for i in 0..64 {
        map.update(&k(i), &v(i as u64), BPF_ANY).unwrap();
    }
    let guard = pin();
    for round in 0..10 {
        // Keys 0..8 are hot: looked up between every batch of inserts.
        for hot in 0..8 {
            assert!(
                map.get(&k(hot), &guard).is_some(),
                "hot key {hot} evicted in round {round}"
            );
        }
        for i in 0..8 {
            map.update(&k(1000 + round * 8 + i), &v(0), BPF_ANY)
                .unwrap();
        }
        assert_eq!(map.len(), 64);
    }
    // BPF_NOEXIST on a full LRU map also evicts.
    map.update(&k(5000), &v(1), BPF_NOEXIST).unwrap();
    assert!(map.contains_key(&k(5000)));
}

#[test]
fn lru_refuses_no_prealloc() {
    let spec = MapSpec::new(MapType::LRU_HASH, 4, 8, 10).flags(BPF_F_NO_PREALLOC);
    assert_eq!(create(&spec).err(), Some(Error::Unsupported));
}

#[test]
fn get_next_key_visits_every_key_once() {
    for map in both(1000) {
        let mut first = [0u8; 4];
        assert_eq!(map.get_next_key(None, &mut first), Err(Error::NotFound));
        let n = crate::scaled(700, 40) as u32;
        for i in 0..n {
            map.update(&k(i * 7), &v(0), BPF_ANY).unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        let mut prev: Option<[u8; 4]> = None;
        let mut next = [0u8; 4];
        while map
            .get_next_key(prev.as_ref().map(|p| &p[..]), &mut next)
            .is_ok()
        {
            assert!(seen.insert(u32::from_ne_bytes(next)), "key seen twice");
            prev = Some(next);
        }
        assert_eq!(seen, (0..n).map(|i| i * 7).collect());
        // An unknown key restarts from the first key, as the kernel.
        map.get_next_key(None, &mut first).unwrap();
        map.get_next_key(Some(&k(3)), &mut next).unwrap();
        assert_eq!(next, first);
    }
}

#[test]
fn batch_operations() {
    for map in both(100) {
        let keys: Vec<u8> = (0..50u32).flat_map(|i| i.to_ne_bytes()).collect();
        let values: Vec<u8> = (0..50u64).flat_map(|i| (i * 3).to_ne_bytes()).collect();
        assert_eq!(map.update_batch(&keys, &values, BPF_ANY), Ok(50));
        let err = map.update_batch(&keys, &values, BPF_NOEXIST).unwrap_err();
        assert_eq!((err.processed, err.error), (0, Error::Exists));

        let mut seen = Model::new();
        let (mut kbuf, mut vbuf) = (vec![0u8; 4 * 16], vec![0u8; 8 * 16]);
        let mut after: Option<Vec<u8>> = None;
        loop {
            let n = map
                .lookup_batch(after.as_deref(), &mut kbuf, &mut vbuf)
                .unwrap();
            for i in 0..n {
                let key = u32::from_ne_bytes(kbuf[4 * i..4 * i + 4].try_into().unwrap());
                let value = u64::from_ne_bytes(vbuf[8 * i..8 * i + 8].try_into().unwrap());
                assert!(seen.insert(key, value).is_none());
            }
            if n < 16 {
                break;
            }
            after = Some(kbuf[4 * (n - 1)..4 * n].to_vec());
        }
        assert_eq!(seen, (0..50u32).map(|i| (i, i as u64 * 3)).collect());

        assert_eq!(map.delete_batch(&keys[..40]), Ok(10));
        let err = map.delete_batch(&keys[..8]).unwrap_err();
        assert_eq!((err.processed, err.error), (0, Error::NotFound));
        let n = map.lookup_and_delete_batch(&mut kbuf, &mut vbuf).unwrap();
        assert_eq!((n, map.len()), (16, 24));
        assert_eq!(
            map.lookup_and_delete_batch(&mut vec![0; 400], &mut vec![0; 800]),
            Ok(24)
        );
        assert!(map.is_empty());
    }
}

#[test]
fn every_policy_and_odd_key_sizes_work() {
    for policy in HashPolicy::ALL {
        let sizes: &[usize] = if cfg!(miri) {
            &[1, 5, 32, 100]
        } else {
            &[1, 3, 4, 5, 12, 31, 32, 64, 100, 256]
        };
        for &key_size in sizes {
            let opts = HashOptions {
                policy,
                ..Default::default()
            };
            let map =
                HashMap::with_options(key_size, 3, crate::scaled(300, 16) as u32, opts).unwrap();
            let key = |i: usize| {
                (0..key_size)
                    .map(|b| (i * 31 + b * 7) as u8)
                    .collect::<Vec<_>>()
            };
            let n = crate::scaled(200, 12).min(1 << (8 * key_size.min(2)));
            for i in 0..n {
                map.update(&key(i), &[i as u8; 3], BPF_ANY).unwrap();
            }
            let guard = pin();
            for i in 0..n {
                assert_eq!(
                    map.get(&key(i), &guard),
                    Some(&[i as u8; 3][..]),
                    "{policy:?} {key_size}"
                );
            }
        }
    }
}

#[test]
fn zero_seed_is_reproducible() {
    let spec = MapSpec::new(MapType::HASH, 4, 8, 64).flags(crate::BPF_F_ZERO_SEED);
    let order = || {
        let map = create(&spec).unwrap();
        (0..40).for_each(|i| map.update(&k(i), &v(0), BPF_ANY).unwrap());
        let (mut out, mut prev, mut keys) = ([0u8; 4], None::<[u8; 4]>, vec![]);
        while map
            .get_next_key(prev.as_ref().map(|p| &p[..]), &mut out)
            .is_ok()
        {
            keys.push(out);
            prev = Some(out);
        }
        keys
    };
    assert_eq!(order(), order());
}

#[test]
fn typed_maps_borrow_values_in_place() {
    #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Flow {
        packets: u64,
        bytes: u64,
    }
    let map: TypedHashMap<[u8; 6], Flow> = TypedHashMap::new(10).unwrap();
    map.insert(
        &[1; 6],
        &Flow {
            packets: 1,
            bytes: 60,
        },
    )
    .unwrap();
    let guard = pin();
    assert_eq!(
        map.get(&[1; 6], &guard),
        Some(&Flow {
            packets: 1,
            bytes: 60
        })
    );
    assert_eq!(
        map.remove(&[1; 6]),
        Ok(Flow {
            packets: 1,
            bytes: 60
        })
    );
    assert_eq!(map.get_copy(&[1; 6]), None);
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C, align(16))]
    struct Wide([u8; 16]);
    assert!(TypedHashMap::<u32, Wide>::new(4).is_err());
}

#[test]
fn memory_usage_counts_preallocation() {
    let n = crate::scaled(10_000, 1_000);
    let pre = HashMap::new(4, 8, n as u32).unwrap();
    let lazy = HashMap::with_options(
        4,
        8,
        n as u32,
        HashOptions {
            prealloc: false,
            ..Default::default()
        },
    )
    .unwrap();
    // n elements of 32 bytes are held up front only when preallocated
    // (beside a head of 8 bytes per bucket).
    assert!(pre.memory_usage() >= n * 32 + n.next_power_of_two() * 8);
    assert!(lazy.memory_usage() < pre.memory_usage() / 2);
}

#[derive(Debug, Clone)]
enum Op {
    Update(u8, u64, u64),
    Delete(u8),
    LookupAndDelete(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<u64>(), 0u64..4).prop_map(|(k, v, f)| Op::Update(k, v, f)),
        2 => any::<u8>().prop_map(Op::Delete),
        1 => any::<u8>().prop_map(Op::LookupAndDelete),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(64, 2) as u32))]

    /// Random operation sequences agree with a std HashMap model, including
    /// errors (flags, fullness at 100 entries).
    #[test]
    fn hash_map_matches_model(ops in prop::collection::vec(op(), 1..crate::scaled(400, 40)), prealloc: bool) {
        let map = HashMap::with_options(1, 8, 100, HashOptions { prealloc, ..Default::default() }).unwrap();
        let mut model: Model<u8, u64> = Model::new();
        for op in ops {
            match op {
                Op::Update(key, value, flags) => {
                    let want = match (flags, model.contains_key(&key)) {
                        (3, _) => Err(22),
                        (1, true) => Err(Error::Exists.errno()),
                        (2, false) => Err(Error::NotFound.errno()),
                        (_, false) if model.len() == 100 => Err(Error::Full.errno()),
                        _ => { model.insert(key, value); Ok(()) }
                    };
                    prop_assert_eq!(map.update(&[key], &v(value), flags).map_err(|e| e.errno()), want);
                }
                Op::Delete(key) => {
                    let want = model.remove(&key).map(|_| ()).ok_or(Error::NotFound);
                    prop_assert_eq!(map.delete(&[key]), want);
                }
                Op::LookupAndDelete(key) => {
                    let mut out = [0u8; 8];
                    let got = map.lookup_and_delete(&[key], &mut out).map(|()| u64::from_ne_bytes(out));
                    prop_assert_eq!(got, model.remove(&key).ok_or(Error::NotFound));
                }
            }
            prop_assert_eq!(map.len(), model.len());
        }
        let guard = pin();
        for key in 0..=255u8 {
            prop_assert_eq!(map.get(&[key], &guard).map(|b| u64::from_ne_bytes(b.try_into().unwrap())), model.get(&key).copied());
        }
        let mut seen = 0;
        map.for_each(&guard, |_, _| seen += 1);
        prop_assert_eq!(seen, model.len());
    }

    /// The LRU map never exceeds max_entries, never fails an update for lack
    /// of room, and holds only values that were written for their key.
    #[test]
    fn lru_map_holds_only_written_values(keys in prop::collection::vec(any::<u16>(), 1..crate::scaled(600, 60))) {
        let map = LruHashMap::new(2, 8, 50).unwrap();
        let mut last: Model<u16, u64> = Model::new();
        for (i, key) in keys.into_iter().enumerate() {
            map.update(&key.to_ne_bytes(), &v(i as u64), BPF_ANY).unwrap();
            last.insert(key, i as u64);
            prop_assert!(map.len() <= 50);
            // The key just written is present with its value.
            let guard = pin();
            prop_assert_eq!(map.get(&key.to_ne_bytes(), &guard), Some(&v(i as u64)[..]));
        }
        let guard = pin();
        map.for_each(&guard, |key, value| {
            let key = u16::from_ne_bytes(key.try_into().unwrap());
            assert_eq!(u64::from_ne_bytes(value.try_into().unwrap()), last[&key]);
        });
    }
}

/// The byte contract's lookup reads short keys and values without a pin,
/// falling back to a pinned walk when writers keep interrupting it, and
/// pins for longer ones: all give what `get` gives, for every size class
/// the word-wise compare and copy treat apart (which bytes they compare
/// and copy: `slab::tests`).
#[test]
fn unpinned_and_pinned_lookups_agree() {
    let sizes = [
        (1, 1),
        (4, 8),
        (7, 5),
        (8, 16),
        (12, 20),
        (16, 3),
        (4, 64),
        (9, 61),
    ];
    let pinned_only = [(17, 8), (33, 9), (8, 65)];
    for (ks, vs) in sizes.into_iter().chain(pinned_only) {
        let map = HashMap::new(ks, vs, 64).unwrap();
        assert_eq!(map.table.reads_unpinned(), ks <= 16 && vs <= 64);
        let key = |i: u8| -> Vec<u8> {
            (0..ks)
                .map(|j| i.wrapping_mul(37) ^ (j as u8).wrapping_mul(11))
                .collect()
        };
        for i in 0..crate::scaled(40, 16) as u8 {
            let value: Vec<u8> = (0..vs).map(|j| i ^ j as u8).collect();
            map.update(&key(i), &value, BPF_ANY).unwrap();
        }
        let guard = crate::pin();
        for i in 0..crate::scaled(48, 20) as u8 {
            let want = map.get(&key(i), &guard).map(<[u8]>::to_vec);
            let mut out = vec![0xaa; vs];
            let looked = map.lookup(&key(i), &mut out).ok().map(|()| out);
            assert_eq!(looked, want, "Map::lookup, ks={ks} vs={vs} key {i}");
            if map.table.reads_unpinned() {
                for walks in [0, 4] {
                    let mut out = vec![0xaa; vs];
                    let found = map.table.read_unpinned_or_pin(&key(i), &mut out, walks);
                    let found = found.map(|_| out);
                    assert_eq!(found, want, "ks={ks} vs={vs} key {i} walks={walks}");
                }
            }
        }
    }
}

/// Readers race one writer that rewrites and deletes keys. Each value
/// encodes (key, version) in every byte-group, so a torn read shows; each
/// reader also checks it never goes back to an older version of a key once
/// the writer has published a newer one before the read started, and never
/// misses a key that is only ever replaced (every fourth), while the keys
/// around it are deleted and their elements recycled. The readers use
/// `Map::lookup`, which reads without a pin (`RawTable::read_unpinned`).
#[test]
fn concurrent_readers_see_whole_fresh_values() {
    const VALUE_WORDS: usize = 8;
    let keys = crate::scaled(512, 16) as u32;
    let versions = crate::scaled(60, 3) as u32;
    let encode = |key: u32, version: u32| -> Vec<u8> {
        let word = ((key as u64) << 32) | version as u64;
        (0..VALUE_WORDS).flat_map(|_| word.to_ne_bytes()).collect()
    };
    for lru in [false, true] {
        let map: Arc<dyn Map> = if lru {
            Arc::new(LruHashMap::new(4, 8 * VALUE_WORDS, keys).unwrap())
        } else {
            Arc::new(HashMap::new(4, 8 * VALUE_WORDS, keys).unwrap())
        };
        // Published[key] = the newest version whose update has completed.
        let published: Arc<Vec<std::sync::atomic::AtomicU32>> = Arc::new(
            (0..keys)
                .map(|_| std::sync::atomic::AtomicU32::new(0))
                .collect(),
        );
        for key in 0..keys {
            map.update(&k(key), &encode(key, 0), BPF_ANY).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        // Readers are running (each has looked up once) before the writer
        // starts: a fast writer could otherwise finish before any read
        // overlaps it, and a loaded machine may be slow to schedule them.
        let looking = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (map, published, stop, looking) = (
                    map.clone(),
                    published.clone(),
                    stop.clone(),
                    looking.clone(),
                );
                std::thread::spawn(move || {
                    let mut out = vec![0u8; 8 * VALUE_WORDS];
                    let mut reads = 0u64;
                    let mut i = r as u32;
                    while !stop.load(Ordering::Relaxed) {
                        crate::reader_pause();
                        let key = i.wrapping_mul(2654435761) % keys;
                        i += 1;
                        let floor = published[key as usize].load(Ordering::Acquire);
                        let stable = key.is_multiple_of(4);
                        match map.lookup(&k(key), &mut out) {
                            Ok(()) => {
                                let first = u64::from_ne_bytes(out[..8].try_into().unwrap());
                                assert!(out.chunks(8).all(|c| c == &out[..8]), "torn value");
                                assert_eq!((first >> 32) as u32, key, "value of another key");
                                // Odd versions are deleted-then-reinserted keys;
                                // the version read is never older than published.
                                assert!(first as u32 >= floor, "stale: {} < {floor}", first as u32);
                            }
                            Err(Error::NotFound) => assert!(!stable, "missed stable key {key}"),
                            Err(e) => panic!("lookup failed: {e}"),
                        }
                        if reads == 0 {
                            looking.fetch_add(1, Ordering::Release);
                        }
                        reads += 1;
                    }
                })
            })
            .collect();
        while looking.load(Ordering::Acquire) < 2 {
            std::thread::yield_now();
        }
        let writer = {
            let (map, published) = (map.clone(), published.clone());
            std::thread::spawn(move || {
                for version in 1..=versions {
                    for key in 0..keys {
                        if !key.is_multiple_of(4) && (key + version) % 7 == 0 {
                            map.delete(&k(key)).unwrap();
                        }
                        map.update(&k(key), &encode(key, version), BPF_ANY).unwrap();
                        published[key as usize].store(version, Ordering::Release);
                    }
                }
            })
        };
        writer.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        // Nothing lost: every key holds its last version.
        let mut out = vec![0u8; 8 * VALUE_WORDS];
        for key in 0..keys {
            map.lookup(&k(key), &mut out).unwrap();
            assert_eq!(out, encode(key, versions));
        }
        assert_eq!(map.len(), keys as usize);
    }
}

/// Two writers on disjoint keys plus a reader: nothing lost, len exact.
#[test]
fn concurrent_writers_lose_nothing() {
    let per_writer = crate::scaled(10_000, 100) as u64;
    let map = Arc::new(
        HashMap::with_options(
            8,
            8,
            2 * per_writer as u32,
            HashOptions {
                prealloc: false,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let map = map.clone();
            std::thread::spawn(move || {
                for i in 0..per_writer {
                    let key = (i * 2 + w).to_ne_bytes();
                    map.update(&key, &v(i), BPF_NOEXIST).unwrap();
                    if i % 3 == 0 {
                        map.delete(&key).unwrap();
                        map.update(&key, &v(i), BPF_NOEXIST).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(map.len(), 2 * per_writer as usize);
    let guard = pin();
    for i in 0..2 * per_writer {
        assert_eq!(map.get(&i.to_ne_bytes(), &guard), Some(&v(i / 2)[..]));
    }
    assert_eq!(
        map.update(&u64::MAX.to_ne_bytes(), &v(0), BPF_ANY),
        Err(Error::Full)
    );
}

/// Whole-map batch walks beside a writer that inserts, rewrites and
/// deletes other keys in the same buckets: every key the writer never
/// touches comes out exactly once with its value, and each key it
/// touches at most once with a value it wrote, never torn. The walk reads
/// its windows of bucket heads ahead of their copies and renews its guard
/// between windows (`RawTable::lookup_batch`), both under the writer here.
#[test]
fn batch_walks_beside_a_writer_see_every_stable_key_once() {
    use std::collections::HashSet;
    let (stable, churned) = if cfg!(miri) { (60, 20) } else { (3000, 1000) };
    let rounds = crate::scaled(200, 3);
    let max = stable + churned;
    let map = Arc::new(HashMap::new(4, 8, max).unwrap());
    for i in 0..stable {
        map.update(&k(i), &v(u64::from(i) * 7), BPF_NOEXIST)
            .unwrap();
    }
    // A churned key's value: its key in the high half, the round in the
    // low half, so a value of another key or a torn one shows.
    let stamp = |key: u32, round: u64| (u64::from(key) << 32) | round;
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (map, done) = (map.clone(), done.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !done.load(Ordering::Relaxed) {
                round += 1;
                for key in stable..max {
                    match (u64::from(key) + round) % 3 {
                        0 => drop(map.delete(&k(key))),
                        _ => map.update(&k(key), &v(stamp(key, round)), BPF_ANY).unwrap(),
                    }
                }
            }
        })
    };
    let room = max as usize;
    let (mut keys, mut values) = (vec![0u8; 4 * room], vec![0u8; 8 * room]);
    for _ in 0..rounds {
        let n = map.lookup_batch(None, &mut keys, &mut values).unwrap();
        let mut seen = HashSet::new();
        for i in 0..n {
            let key = u32::from_ne_bytes(keys[4 * i..][..4].try_into().unwrap());
            let value = u64::from_ne_bytes(values[8 * i..][..8].try_into().unwrap());
            assert!(seen.insert(key), "key {key} twice in one walk");
            if key < stable {
                assert_eq!(value, u64::from(key) * 7, "stable key {key}");
            } else {
                assert!(key < max, "a key never written: {key}");
                assert_eq!(value >> 32, u64::from(key), "torn value of key {key}");
            }
        }
        assert!(
            (0..stable).all(|key| seen.contains(&key)),
            "a stable key missed"
        );
    }
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

#[test]
fn lru_under_concurrent_inserts_stays_within_capacity() {
    let map = Arc::new(LruHashMap::new(4, 8, 256).unwrap());
    let threads: Vec<_> = (0..2u32)
        .map(|t| {
            let map = map.clone();
            std::thread::spawn(move || {
                // Under Miri, just enough keys (320) to overfill the map.
                for i in 0..crate::scaled(20_000, 160) as u32 {
                    let key = i * 2 + t;
                    map.update(&k(key), &v(key as u64), BPF_ANY).unwrap();
                    let mut out = [0u8; 8];
                    if map.lookup(&k(key), &mut out).is_ok() {
                        assert_eq!(u64::from_ne_bytes(out), key as u64);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(map.len() <= 256 && map.len() > 200, "len {}", map.len());
}

#[test]
#[cfg_attr(miri, ignore = "a million entries")]
fn dropping_a_big_map_is_quick() {
    let map = HashMap::new(8, 8, 1_000_000).unwrap();
    for i in 0..1_000_000u64 {
        map.update(&i.to_ne_bytes(), &v(i), BPF_ANY).unwrap();
    }
    let start = std::time::Instant::now();
    drop(map);
    // Not a timing assertion of performance: the free happens on the reaper
    // thread, so even a debug build returns at once. Generous bound.
    assert!(start.elapsed() < std::time::Duration::from_millis(500));
}

/// Every batch of `room` entries of `map` from `after` on, walked to the
/// end, through `batch`.
fn batches(
    (ks, vs): (usize, usize),
    room: usize,
    after: Option<Vec<u8>>,
    mut batch: impl FnMut(Option<&[u8]>, &mut [u8], &mut [u8]) -> usize,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let (mut out, mut after) = (Vec::new(), after);
    loop {
        let (mut keys, mut values) = (vec![0u8; ks * room], vec![0u8; vs * room]);
        let n = batch(after.as_deref(), &mut keys, &mut values);
        out.extend((0..n).map(|i| {
            (
                keys[ks * i..][..ks].to_vec(),
                values[vs * i..][..vs].to_vec(),
            )
        }));
        if n < room {
            return out;
        }
        assert!(out.len() < 100_000, "a walk that does not end");
        after = Some(keys[ks * (n - 1)..][..ks].to_vec());
    }
}

/// Entry `i`'s key (`ks` bytes, distinct for every `i` below 2^24) and
/// value (`vs` bytes).
fn sized_entry(i: u32, (ks, vs): (usize, usize)) -> (Vec<u8>, Vec<u8>) {
    let mut key = i.wrapping_mul(2_654_435_761).to_ne_bytes().to_vec();
    key.resize(ks, 0x5a);
    let mut value = (u64::from(i) * 5).to_ne_bytes().to_vec();
    value.resize(vs, 0xa5);
    (key, value)
}

/// The hash maps' own `lookup_batch` (straight from the chains) gives
/// what the generic walk (`get_next_key` and `lookup`, entry by entry)
/// gives: the same entries in the same order, from the start, from a
/// stored key, and from a key not stored (a restart, as `get_next_key`'s),
/// in tables crowded enough for long chains; for sizes the walk is
/// compiled for and sizes it reads at run time.
#[test]
fn lookup_batch_matches_the_generic_walk() {
    use crate::core::contract::lookup_each;
    let opts = HashOptions {
        seed: Some(3),
        ..HashOptions::default()
    };
    // As full under Miri (40 entries of 56), where a map of 1,000
    // preallocated entries took most of two minutes of wall time.
    let (n, max) = if cfg!(miri) { (40, 56) } else { (700, 1000) };
    let sizes: &[(usize, usize)] = if cfg!(miri) {
        &[(4, 8), (3, 5)]
    } else {
        &[(4, 8), (8, 16), (16, 4), (3, 5), (12, 24)]
    };
    let rooms: &[usize] = if cfg!(miri) {
        &[3, 1000]
    } else {
        &[1, 3, 64, 65, 700, 1000]
    };
    fn agree<T: MapOps>(map: &T, size: (usize, usize), room: usize, after: Option<Vec<u8>>) {
        let ours = batches(size, room, after.clone(), |a, k, v| {
            map.lookup_batch(a, k, v).unwrap()
        });
        let generic = batches(size, room, after.clone(), |a, k, v| {
            lookup_each(map, a, k, v, room).unwrap()
        });
        assert_eq!(ours, generic, "{size:?}: room {room}, after {after:?}");
    }
    for &size in sizes {
        let (ks, vs) = size;
        let hash = HashMap::with_options(ks, vs, max, opts).unwrap();
        let lru = LruHashMap::with_options(ks, vs, max, opts).unwrap();
        for i in 0..n as u32 {
            let (k, v) = sized_entry(i, size);
            hash.update(&k, &v, BPF_ANY).unwrap();
            lru.update(&k, &v, BPF_ANY).unwrap();
        }
        let stored = Some(sized_entry(17, size).0);
        let missing = Some(vec![0xff; size.0]);
        for &room in rooms {
            for after in [None, stored.clone(), missing.clone()] {
                agree(&hash, size, room, after.clone());
                agree(&lru, size, room, after);
            }
            let mut got = batches(size, room, None, |a, k, v| {
                hash.lookup_batch(a, k, v).unwrap()
            });
            let mut want: Vec<_> = (0..n as u32).map(|i| sized_entry(i, size)).collect();
            got.sort();
            want.sort();
            assert_eq!(
                got, want,
                "{size:?}: room {room}: every entry once, with its value"
            );
        }
    }
}
