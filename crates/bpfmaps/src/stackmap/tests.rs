use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use proptest::prelude::*;

use super::*;
use crate::core::flags::BPF_ANY;
use crate::{Map, create};

const ALL_HASHES: [StackHash; 3] = [StackHash::Jhash2, StackHash::Xxh3, StackHash::SipHash];

fn key(id: u32) -> [u8; 4] {
    id.to_ne_bytes()
}

/// `lookup` decoded back to frames, padding included.
fn lookup_frames(map: &StackTraceMap, id: u32) -> Result<Vec<u64>> {
    let mut value = vec![0u8; map.value_size()];
    map.lookup(&key(id), &mut value)?;
    Ok(value
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect())
}

/// Two different stacks of `len` frames that land in the same bucket, with
/// different full hashes.
fn same_bucket_pair(map: &StackTraceMap, len: usize) -> (Vec<u64>, Vec<u64>) {
    let mask = map.bucket_count() - 1;
    let stack = |i: u64| (0..len as u64).map(|j| 0x1000 * i + j).collect::<Vec<_>>();
    let mut first_by_bucket: HashMap<u32, Vec<u64>> = HashMap::new();
    for i in 1.. {
        let s = stack(i);
        let h = map.stack_hash(&s);
        if let Some(prev) = first_by_bucket.get(&(h & mask)) {
            if map.stack_hash(prev) != h {
                return (prev.clone(), s);
            }
        } else {
            first_by_bucket.insert(h & mask, s);
        }
    }
    unreachable!()
}

/// Two different stacks with the same full 32-bit hash (birthday search:
/// ~2^16 candidates).
fn full_hash_collision(map: &StackTraceMap) -> (Vec<u64>, Vec<u64>) {
    let mut by_hash: HashMap<u32, u64> = HashMap::new();
    for i in 1u64.. {
        let frames = [i, 0xffff_ffff_8100_0000];
        if let Some(&j) = by_hash.get(&map.stack_hash(&frames)) {
            return (vec![j, frames[1]], frames.to_vec());
        }
        by_hash.insert(map.stack_hash(&frames), i);
    }
    unreachable!()
}

#[test]
fn same_stack_same_id_and_lookup_is_zero_padded() {
    for hash in ALL_HASHES {
        let map = StackTraceMap::with_hash(8, 1024, hash).unwrap();
        let frames = [0xffff_ffff_8123_4567, 0x7f00_0000_1000, 42];
        let id = map.get_stackid(&frames, 0).unwrap();
        assert_eq!(id, map.stack_hash(&frames) & 1023);
        assert_eq!(map.get_stackid(&frames, 0), Ok(id));
        assert_eq!(map.get_stackid(&frames, BPF_F_FAST_STACK_CMP), Ok(id));
        assert_eq!(map.get_stackid(&frames, BPF_F_REUSE_STACKID), Ok(id));
        assert_eq!(map.stacks(), 1);
        let mut want = frames.to_vec();
        want.resize(8, 0);
        assert_eq!(lookup_frames(&map, id).unwrap(), want);
        assert_eq!(map.get(id, &pin()), Some(&frames[..]));
        assert_eq!(map.collisions(), 0);
    }
}

#[test]
fn jhash2_is_the_kernels() {
    let map = StackTraceMap::new(4, 64).unwrap();
    let frames = [0x1122_3344_5566_7788u64, 0x99aa_bbcc_ddee_ff00];
    let words: Vec<u32> = frames
        .iter()
        .flat_map(|f| {
            f.to_ne_bytes()
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(map.stack_hash(&frames), jhash2(&words, 0));
    assert_eq!(map.get_stackid(&frames, 0), Ok(jhash2(&words, 0) & 63));
}

#[test]
fn collision_is_eexist_unless_reuse() {
    for hash in ALL_HASHES {
        let map = StackTraceMap::with_hash(4, 4, hash).unwrap();
        let (a, b) = same_bucket_pair(&map, 3);
        let id = map.get_stackid(&a, 0).unwrap();
        assert_eq!(map.get_stackid(&b, 0), Err(Error::Exists));
        assert_eq!(
            map.get_stackid(&b, BPF_F_FAST_STACK_CMP),
            Err(Error::Exists)
        );
        assert_eq!(map.collisions(), 2);
        // Unchanged by the failures.
        assert_eq!(map.get(id, &pin()), Some(&a[..]));
        // REUSE replaces.
        assert_eq!(map.get_stackid(&b, BPF_F_REUSE_STACKID), Ok(id));
        assert_eq!(map.get(id, &pin()), Some(&b[..]));
        assert_eq!(map.stacks(), 1);
        assert_eq!(map.get_stackid(&a, 0), Err(Error::Exists));
        assert_eq!(map.collisions(), 3);
    }
}

#[test]
#[cfg_attr(miri, ignore = "a birthday search over ~2^16 stacks")]
fn fast_stack_cmp_trusts_the_hash() {
    for hash in [StackHash::Jhash2, StackHash::Xxh3] {
        let map = StackTraceMap::with_hash(2, 1 << 10, hash).unwrap();
        let (a, b) = full_hash_collision(&map);
        assert_ne!(a, b);
        let id = map.get_stackid(&a, 0).unwrap();
        // Same hash, different frames: the slow compare sees the difference...
        assert_eq!(map.get_stackid(&b, 0), Err(Error::Exists));
        // ...the fast one answers the existing id without storing b.
        assert_eq!(map.get_stackid(&b, BPF_F_FAST_STACK_CMP), Ok(id));
        assert_eq!(map.get(id, &pin()), Some(&a[..]));
        assert_eq!(map.collisions(), 1);
    }
}

#[test]
fn skip_and_truncation_follow_the_kernel() {
    let map = StackTraceMap::new(3, 64).unwrap();
    let id = map.get_stackid(&[1, 2, 3, 4, 5], 0).unwrap();
    assert_eq!(map.get(id, &pin()), Some(&[1, 2, 3][..]));
    assert_eq!(map.get_stackid(&[7, 7, 1, 2, 3], 2), Ok(id));
    assert_eq!(map.get_stackid(&[1, 2, 3], BPF_F_USER_STACK), Ok(id));
    assert_eq!(map.get_stackid(&[1, 2], 2).unwrap_err().errno(), 22);
    assert_eq!(map.get_stackid(&[], 0).unwrap_err().errno(), 22);
    assert_eq!(map.stacks(), 1);
}

#[test]
fn get_next_key_visits_every_id_once() {
    let map = StackTraceMap::new(4, 256).unwrap();
    let mut ids = BTreeSet::new();
    for i in 0..100u64 {
        if let Ok(id) = map.get_stackid(&[i, i * 3], 0) {
            ids.insert(id);
        }
    }
    assert_eq!(map.len(), ids.len());
    let mut seen = Vec::new();
    let mut next = [0u8; 4];
    let mut prev: Option<[u8; 4]> = None;
    loop {
        match map.get_next_key(prev.as_ref().map(|k| &k[..]), &mut next) {
            Ok(_) => {
                seen.push(u32::from_ne_bytes(next));
                prev = Some(next);
            }
            Err(e) => {
                assert_eq!(e, Error::NotFound);
                break;
            }
        }
    }
    assert_eq!(seen, ids.iter().copied().collect::<Vec<_>>()); // increasing, each once
    // An id that is not stored (or out of range) restarts from the first.
    let empty = (0..256).find(|id| !ids.contains(id)).unwrap();
    let first = *ids.first().unwrap();
    map.get_next_key(Some(&key(empty)), &mut next).unwrap();
    assert_eq!(u32::from_ne_bytes(next), first);
    map.get_next_key(Some(&key(1 << 20)), &mut next).unwrap();
    assert_eq!(u32::from_ne_bytes(next), first);
    // Batch lookups ride on it.
    let mut keys = vec![0u8; 4 * 200];
    let mut values = vec![0u8; 32 * 200];
    assert_eq!(
        map.lookup_batch(None, &mut keys, &mut values),
        Ok(ids.len())
    );
}

#[test]
fn delete_and_lookup_and_delete() {
    let map = StackTraceMap::new(4, 16).unwrap();
    let id = map.get_stackid(&[5, 6], 0).unwrap();
    let before = map.memory_usage();
    assert_eq!(map.delete(&key(id)), Ok(()));
    assert_eq!(map.delete(&key(id)), Err(Error::NotFound));
    assert_eq!(map.delete(&key(16)), Err(Error::Full)); // E2BIG, as the kernel
    assert_eq!(lookup_frames(&map, id), Err(Error::NotFound));
    assert!(map.is_empty());
    assert_eq!(before - map.memory_usage(), size_of::<Stack>() + 16);
    assert_eq!(map.get_next_key(None, &mut [0; 4]), Err(Error::NotFound));

    let id = map.get_stackid(&[5, 6, 7], 0).unwrap();
    let mut value = [0xffu8; 32];
    map.lookup_and_delete(&key(id), &mut value).unwrap();
    assert_eq!(&value[..8], &5u64.to_ne_bytes());
    assert_eq!(&value[24..], &[0; 8]);
    assert_eq!(
        map.lookup_and_delete(&key(id), &mut value),
        Err(Error::NotFound)
    );
    assert_eq!(
        map.lookup_and_delete(&key(99), &mut value),
        Err(Error::NotFound)
    );
    assert!(map.is_empty());
    // Deleting frees the bucket for another stack.
    assert_eq!(map.get_stackid(&[5, 6, 7], 0), Ok(id));
}

#[test]
fn max_entries_caps_stored_stacks() {
    // 3 entries -> 4 buckets, but at most 3 stacks (ENOMEM after).
    let map = StackTraceMap::new(1, 3).unwrap();
    assert_eq!(map.bucket_count(), 4);
    let mut by_bucket = HashMap::new();
    for i in 0u64.. {
        by_bucket.entry(map.stack_hash(&[i]) & 3).or_insert(i);
        if by_bucket.len() == 4 {
            break;
        }
    }
    let mut results: Vec<_> = (0..4)
        .map(|b| map.get_stackid(&[by_bucket[&b]], 0))
        .collect();
    results.sort_by_key(|r| r.is_err());
    assert!(results[..3].iter().all(Result::is_ok));
    assert_eq!(results[3], Err(Error::NoMemory));
    assert_eq!(map.stacks(), 3);
    assert_eq!(map.collisions(), 0);
}

/// What the contract suite cannot reach (it cannot store a stack through
/// the byte contract): `get_stackid`'s flags, and errors on a map holding
/// a stack. Sizes and creation are the suite's (`crate::conformance`).
#[test]
fn bad_get_stackid_flags_and_contract_errors_change_nothing() {
    let map = StackTraceMap::new(4, 16).unwrap();
    let id = map.get_stackid(&[1, 2], 0).unwrap();
    let snapshot = |map: &StackTraceMap| {
        (0..16)
            .map(|i| lookup_frames(map, i).ok())
            .collect::<Vec<_>>()
    };
    let before = snapshot(&map);
    for flags in [1 << 11, 1 << 63, BPF_F_REUSE_STACKID | 1 << 12] {
        assert_eq!(map.get_stackid(&[3, 4], flags).unwrap_err().errno(), 22);
    }
    assert_eq!(
        map.update(&key(id), &[0; 32], BPF_ANY).unwrap_err().errno(),
        22
    );
    assert_eq!(map.lookup(&key(id), &mut [0; 16]).unwrap_err().errno(), 22);
    assert_eq!(map.delete(&[0; 3]).unwrap_err().errno(), 22);
    assert_eq!(map.delete(&key(16)).unwrap_err().errno(), 7); // beyond the buckets
    assert_eq!(snapshot(&map), before);
    assert_eq!((map.stacks(), map.collisions()), (1, 0));

    assert_eq!(StackTraceMap::new(0, 16).unwrap_err().errno(), 22);
    assert_eq!(StackTraceMap::new(128, 16).unwrap_err().errno(), 22);
    assert_eq!(StackTraceMap::new(4, 0).unwrap_err().errno(), 22);
    assert_eq!(StackTraceMap::new(4, (1 << 31) + 1).unwrap_err().errno(), 7);
}

#[test]
fn create_round_trip() {
    let map = create(&MapSpec::new(MapType::STACK_TRACE, 4, 8 * 5, 100)).unwrap();
    assert_eq!(map.map_type(), MapType::STACK_TRACE);
    assert_eq!(
        (map.key_size(), map.value_size(), map.max_entries()),
        (4, 40, 100)
    );
    // The byte contract cannot store stacks; the typed one can.
    assert_eq!(
        map.update(&key(0), &[0; 40], BPF_ANY).unwrap_err().errno(),
        22
    );
    assert_eq!(map.push(&[0; 40], BPF_ANY), Err(Error::Unsupported));
    assert_eq!(map.get_next_key(None, &mut [0; 4]), Err(Error::NotFound));
    assert!(map.is_empty());
    let base = map.memory_usage();
    assert!(base >= 128 * 8);

    let typed = StackTraceMap::new(5, 100).unwrap();
    let id = typed.get_stackid(&[1, 2, 3], 0).unwrap();
    let map: Box<dyn Map> = Box::new(typed);
    let mut v = [0u8; 40];
    map.lookup(&key(id), &mut v).unwrap();
    assert_eq!(&v[16..24], &3u64.to_ne_bytes());
    assert_eq!(map.len(), 1);
    assert_eq!(map.memory_usage(), base + size_of::<Stack>() + 24);
}

#[test]
fn concurrent_get_stackid_and_lookup_never_tear() {
    // 8 buckets, 64 stacks of different lengths whose frames all encode
    // their stack number: a reader seeing a mix of two would find frames
    // from two stacks, or a length that does not match.
    const STACKS: u64 = 64;
    let stack = |s: u64| -> Vec<u64> { (0..1 + s % 16).map(|j| (s << 32) | j).collect() };
    let map = Arc::new(StackTraceMap::new(16, 8).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (map, done) = (Arc::clone(&map), Arc::clone(&done));
        std::thread::spawn(move || {
            for round in 0..crate::scaled(4000, 100) as u64 {
                let s = round.wrapping_mul(0x9e37_79b9) % STACKS;
                let flags = if round % 3 == 0 {
                    0
                } else {
                    BPF_F_REUSE_STACKID
                };
                match map.get_stackid(&stack(s), flags) {
                    Ok(id) => assert_eq!(id, map.stack_hash(&stack(s)) & 7),
                    Err(e) => assert_eq!(e, Error::Exists),
                }
                if round % 97 == 0 {
                    let _ = map.delete(&key((round % 8) as u32));
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut reads = 0u64;
    let mut value = vec![0u8; map.value_size()];
    while !done.load(Ordering::Acquire) || reads < crate::scaled(1000, 20) as u64 {
        crate::reader_pause();
        for id in 0..8u32 {
            {
                let guard = pin();
                if let Some(frames) = map.get(id, &guard) {
                    let s = frames[0] >> 32;
                    assert_eq!(frames, &stack(s)[..], "torn stack in bucket {id}");
                    assert_eq!(map.stack_hash(frames) & 7, id);
                }
            }
            if map.lookup(&key(id), &mut value).is_ok() {
                let frames: Vec<u64> = value
                    .chunks_exact(8)
                    .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                    .collect();
                let s = frames[0] >> 32;
                let mut want = stack(s);
                want.resize(16, 0);
                assert_eq!(frames, want, "torn lookup in bucket {id}");
            }
            reads += 1;
        }
    }
    writer.join().unwrap();
    assert!(map.stacks() <= 8);
    let occupied = (0..8).filter(|&id| map.get(id, &pin()).is_some()).count();
    assert_eq!(map.stacks(), occupied);
}

#[test]
fn concurrent_writers_agree_on_ids() {
    // Two threads intern the same stacks; every id either got must name
    // that stack at the end (nobody overwrites without REUSE).
    let map = Arc::new(StackTraceMap::new(4, 1024).unwrap());
    let results: Vec<Vec<(u64, Result<u32>)>> = (0..2)
        .map(|t| {
            let map = Arc::clone(&map);
            std::thread::spawn(move || {
                let n = crate::scaled(2000, 60) as u64;
                (0..n)
                    .map(|i| {
                        let s = if t == 0 { i } else { n - 1 - i };
                        (s, map.get_stackid(&[s, !s], 0))
                    })
                    .collect()
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    let guard = pin();
    let mut exists = 0;
    for (s, r) in results.into_iter().flatten() {
        match r {
            Ok(id) => assert_eq!(map.get(id, &guard), Some(&[s, !s][..])),
            Err(e) => {
                assert_eq!(e, Error::Exists);
                exists += 1;
            }
        }
    }
    assert_eq!(map.collisions(), exists);
}

/// Ops for the model test.
#[derive(Debug, Clone)]
enum Op {
    /// `get_stackid` of stack `n` from a small pool, with REUSE or not.
    Get { n: u8, reuse: bool },
    /// Delete bucket `id`.
    Delete { id: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, any::<bool>()).prop_map(|(n, reuse)| Op::Get { n, reuse }),
        1 => (0u8..16).prop_map(|id| Op::Delete { id }),
    ]
}

/// Stack `n` of the pool: 1 to 6 frames.
fn pool_stack(n: u8) -> Vec<u64> {
    (0..1 + u64::from(n) % 6)
        .map(|j| 0x400_000 + 0x10 * u64::from(n) + j)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(128, 3) as u32))]

    /// Against a `HashMap<u32, Vec<u64>>` model of the buckets.
    #[test]
    fn prop_matches_model(ops in proptest::collection::vec(op(), 1..80), depth in 1u32..8) {
        let map = StackTraceMap::new(depth, 16).unwrap();
        let mut model: HashMap<u32, Vec<u64>> = HashMap::new();
        let mut collisions = 0;
        for op in ops {
            match op {
                Op::Get { n, reuse } => {
                    let mut frames = pool_stack(n);
                    frames.truncate(depth as usize);
                    let id = map.stack_hash(&frames) & 15;
                    let flags = if reuse { BPF_F_REUSE_STACKID } else { 0 };
                    let got = map.get_stackid(&pool_stack(n), flags);
                    let want = match model.get(&id) {
                        Some(old) if *old != frames && !reuse => {
                            collisions += 1;
                            Err(Error::Exists)
                        }
                        _ => {
                            model.insert(id, frames);
                            Ok(id)
                        }
                    };
                    prop_assert_eq!(got, want);
                }
                Op::Delete { id } => {
                    let want = if model.remove(&u32::from(id)).is_some() {
                        Ok(())
                    } else {
                        Err(Error::NotFound)
                    };
                    prop_assert_eq!(map.delete(&key(u32::from(id))), want);
                }
            }
            prop_assert_eq!(map.len(), model.len());
        }
        prop_assert_eq!(map.collisions(), collisions);
        for id in 0..16u32 {
            let want = model.get(&id).map(|f| {
                let mut f = f.clone();
                f.resize(depth as usize, 0);
                f
            });
            prop_assert_eq!(lookup_frames(&map, id).ok(), want);
        }
        let mut ids = Vec::new();
        let mut next = [0u8; 4];
        let mut prev = None;
        while map.get_next_key(prev.as_ref().map(|k: &[u8; 4]| &k[..]), &mut next).is_ok() {
            ids.push(u32::from_ne_bytes(next));
            prev = Some(next);
        }
        let mut want: Vec<u32> = model.keys().copied().collect();
        want.sort_unstable();
        prop_assert_eq!(ids, want);
    }
}
