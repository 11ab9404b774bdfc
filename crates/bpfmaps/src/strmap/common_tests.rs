//! The tests both string maps pass, each written once: `tests.rs` runs
//! them for `QpTrieMap` and `tst_tests.rs` for `TstMap`, each adding what
//! only its map has (the qp-trie's ranges, prefixes and longest prefixes,
//! the TST's shape checks). The maps are driven through [`StringMap`],
//! their inherent API, which they spell alike.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;

use super::{QpTrieMap, TstMap};
use crate::core::flags::{BPF_ANY, BPF_EXIST, BPF_NOEXIST};
use crate::core::reclaim::Guard;
use crate::{Error, Result, pin};

/// A string map as the shared tests drive it: the inherent methods of the
/// same names, and two ways of looking at the whole map.
pub(super) trait StringMap: Sized + Send + Sync + 'static {
    fn new(max_key_size: usize, value_size: usize, max_entries: u32) -> Result<Self>;
    fn get<'g>(&'g self, key: &[u8], guard: &'g Guard) -> Option<&'g [u8]>;
    fn insert(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()>;
    fn remove(&self, key: &[u8], out: Option<&mut [u8]>) -> Result<()>;
    fn next_key(&self, key: Option<&[u8]>, next: &mut Vec<u8>) -> Result<()>;
    fn for_each_in<'g>(
        &'g self,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        guard: &'g Guard,
        f: impl FnMut(&[u8], &'g [u8]) -> ControlFlow<()>,
    );
    fn len(&self) -> usize;
    fn memory_usage(&self) -> usize;
    fn clear(&self);
    /// Every key, in order, as the map's own tests list them.
    fn keys(&self) -> Vec<Vec<u8>>;
    /// Bytes of the nodes reachable now.
    fn live_bytes(&self) -> usize;
}

/// [`StringMap`] for `$map` by its inherent methods, with `keys` and
/// `live_bytes` as given.
macro_rules! string_map {
    ($map:ident { $($own:tt)* }) => {
        impl StringMap for $map {
            fn new(max_key_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
                $map::new(max_key_size, value_size, max_entries)
            }

            fn get<'g>(&'g self, key: &[u8], guard: &'g Guard) -> Option<&'g [u8]> {
                $map::get(self, key, guard)
            }

            fn insert(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
                $map::insert(self, key, value, flags)
            }

            fn remove(&self, key: &[u8], out: Option<&mut [u8]>) -> Result<()> {
                $map::remove(self, key, out)
            }

            fn next_key(&self, key: Option<&[u8]>, next: &mut Vec<u8>) -> Result<()> {
                $map::next_key(self, key, next)
            }

            fn for_each_in<'g>(
                &'g self,
                range: (Bound<&[u8]>, Bound<&[u8]>),
                guard: &'g Guard,
                f: impl FnMut(&[u8], &'g [u8]) -> ControlFlow<()>,
            ) {
                $map::for_each_in(self, range, guard, f)
            }

            fn len(&self) -> usize {
                $map::len(self)
            }

            fn memory_usage(&self) -> usize {
                $map::memory_usage(self)
            }

            fn clear(&self) {
                $map::clear(self)
            }

            $($own)*
        }
    };
}

string_map!(QpTrieMap {
    /// Through the iterator.
    fn keys(&self) -> Vec<Vec<u8>> {
        self.iter(&pin()).map(|(k, _)| k).collect()
    }

    fn live_bytes(&self) -> usize {
        QpTrieMap::live_bytes(self)
    }
});

string_map!(TstMap {
    /// Through `for_each`.
    fn keys(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.for_each(&pin(), |k, _| {
            out.push(k.to_vec());
            ControlFlow::Continue(())
        });
        out
    }

    fn live_bytes(&self) -> usize {
        self.live_nodes().0
    }
});

pub(super) fn v(i: u64) -> [u8; 8] {
    i.to_ne_bytes()
}

pub(super) fn get(m: &impl StringMap, key: &[u8]) -> Option<u64> {
    m.get(key, &pin())
        .map(|v| u64::from_ne_bytes(v.try_into().unwrap()))
}

/// A path as deep as the longest key (every prefix a key): inserts,
/// lookups, the walk, a next key, `between` (a map's own step, such as a
/// compaction) and removals go down it. The writers recurse once per node
/// on a key's path (at most one per key byte): a release build takes well
/// under a test thread's 2 MiB for 4,096 levels, a debug build several
/// (about 5 KB a level of the qp-trie's `insert_at`), so this runs on a
/// thread with room for them (docs/design.md, "String keys").
pub(super) fn a_path_as_deep_as_the_longest_key<M: StringMap>(between: fn(&M)) {
    let deep = move || {
        let n = crate::scaled(4096, 24);
        let m = M::new(n, 8, n as u32).unwrap();
        for len in (1..=n).rev().step_by(2).chain((1..=n).step_by(2)) {
            m.insert(&vec![b'a'; len], &v(len as u64), BPF_NOEXIST)
                .unwrap();
        }
        assert_eq!(m.len(), n);
        assert_eq!(get(&m, &vec![b'a'; n]), Some(n as u64));
        let all = m.keys();
        assert_eq!(all.len(), n);
        assert!(all.iter().enumerate().all(|(i, k)| k.len() == i + 1));
        let mut next = Vec::new();
        m.next_key(Some(&vec![b'a'; n / 2]), &mut next).unwrap();
        assert_eq!(next.len(), n / 2 + 1);
        between(&m);
        for len in (1..=n).step_by(3) {
            m.remove(&vec![b'a'; len], None).unwrap();
        }
        assert_eq!(m.keys().len(), m.len());
    };
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(deep)
        .unwrap()
        .join()
        .unwrap();
}

/// The keys as `get_next_key` walks them, from no key.
pub(super) fn walked(m: &impl StringMap) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut next = Vec::new();
    while m.next_key(out.last().map(Vec::as_slice), &mut next).is_ok() {
        out.push(next.clone());
    }
    out
}

/// Keys that are prefixes of each other, with NUL and 0xff bytes: each
/// found with its value, near misses not found, every key listed and
/// walked in byte order. Returns the map, for checks of its own.
pub(super) fn keys_that_are_prefixes_of_each_other_and_nul_bytes<M: StringMap>() -> M {
    let m = M::new(16, 8, 100).unwrap();
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
    assert_eq!(m.keys(), sorted);
    assert_eq!(walked(&m), sorted);
    assert_eq!(m.len(), 9);
    m
}

/// `BPF_ANY`, `BPF_NOEXIST` and `BPF_EXIST` as the kernel has them, on
/// keys that end inside or leave a stored key's bytes too; other flags
/// refused. Returns the map, for checks of its own.
pub(super) fn update_flags_follow_the_kernel<M: StringMap>() -> M {
    let m = M::new(8, 8, 10).unwrap();
    assert_eq!(m.insert(b"k", &v(1), BPF_EXIST), Err(Error::NotFound));
    m.insert(b"k", &v(1), BPF_NOEXIST).unwrap();
    assert_eq!(m.insert(b"k", &v(2), BPF_NOEXIST), Err(Error::Exists));
    m.insert(b"k", &v(3), BPF_EXIST).unwrap();
    assert_eq!(get(&m, b"k"), Some(3));
    m.insert(b"k", &v(4), BPF_ANY).unwrap();
    m.insert(b"kk", &v(5), BPF_ANY).unwrap();
    // A key ending inside a stored one, and one leaving it: new keys,
    // which `BPF_EXIST` refuses.
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
    m
}

/// Sizes no string map takes, keys and values of the wrong size and
/// unknown flags are `EINVAL`; a new key in a full map is `E2BIG`; a
/// missing key is `ENOENT`; none of them changes the keys or `state` (what
/// the map's nodes look like).
pub(super) fn bad_input_is_refused_and_changes_nothing<M: StringMap, S: PartialEq + Debug>(
    state: impl Fn(&M) -> S,
) {
    assert!(M::new(0, 8, 10).is_err());
    assert!(M::new(4097, 8, 10).is_err());
    assert!(M::new(8, 0, 10).is_err());
    assert!(M::new(8, 65536, 10).is_err());
    assert!(M::new(8, 8, 0).is_err());
    let m = M::new(4, 8, 3).unwrap();
    for k in [&b"a"[..], b"ab", b"abc"] {
        m.insert(k, &v(1), BPF_ANY).unwrap();
    }
    let before = (m.keys(), state(&m));
    let invalid = |r: Result<()>| assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    invalid(m.insert(b"", &v(1), BPF_ANY));
    invalid(m.insert(b"abcde", &v(1), BPF_ANY));
    invalid(m.insert(b"x", &[0; 7], BPF_ANY));
    invalid(m.insert(b"x", &[0; 9], BPF_ANY));
    invalid(m.insert(b"a", &v(1), 3));
    invalid(m.remove(b"", None));
    invalid(m.remove(b"abcde", None));
    invalid(m.remove(b"a", Some(&mut [0; 9])));
    // Full: a new key is E2BIG, whether it would extend a stored key, end
    // inside one, leave one or start on a first byte of its own.
    for k in [&b"abcd"[..], b"ax", b"b", b"\0", b"x"] {
        assert_eq!(m.insert(k, &v(1), BPF_ANY), Err(Error::Full), "{k:?}");
        assert_eq!(m.insert(k, &v(1), BPF_NOEXIST), Err(Error::Full), "{k:?}");
    }
    assert_eq!(m.remove(b"abcd", None), Err(Error::NotFound));
    assert_eq!(m.remove(b"b", None), Err(Error::NotFound));
    assert_eq!(m.remove(b"ac", None), Err(Error::NotFound));
    assert_eq!(m.get(b"", &pin()), None);
    assert_eq!((m.keys(), state(&m)), before);
    assert_eq!(m.len(), 3);
    // A full map still takes new values for stored keys.
    m.insert(b"ab", &v(9), BPF_EXIST).unwrap();
    m.insert(b"abc", &v(8), BPF_ANY).unwrap();
    assert_eq!(
        (get(&m, b"ab"), get(&m, b"abc"), m.len()),
        (Some(9), Some(8), 3)
    );
}

/// Keys of `max` bytes (and `max - 1`, and 1) sharing all but a few
/// bytes: found, listed and walked in order; one removed with its value
/// copied out. Returns the map (3 keys), for checks of its own.
pub(super) fn the_longest_keys_and_remove_with_out<M: StringMap>(max: usize) -> M {
    let m = M::new(max, 8, 10).unwrap();
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
    assert_eq!(m.keys(), expect);
    assert_eq!(walked(&m), expect);
    let mut out = [0; 8];
    m.remove(&long, Some(&mut out)).unwrap();
    assert_eq!((out, get(&m, &long), m.len()), (v(1), None, 3));
    m
}

/// `next_key` from no key, from stored keys, from keys that are not
/// stored (below, inside and past the stored ones) and from a removed
/// one; `ENOENT` after the last key and in an empty map.
pub(super) fn next_key_walks_in_order_past_deleted_keys<M: StringMap>() {
    let m = M::new(8, 8, 100).unwrap();
    for k in [&b"b"[..], b"ba", b"bb", b"c", b"a\xff"] {
        m.insert(k, &v(0), BPF_ANY).unwrap();
    }
    let mut next = Vec::new();
    m.next_key(None, &mut next).unwrap();
    assert_eq!(next, b"a\xff");
    m.next_key(Some(b"ba"), &mut next).unwrap();
    assert_eq!(next, b"bb");
    // An extension comes before the next sibling.
    m.insert(b"bab", &v(0), BPF_ANY).unwrap();
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
    let empty = M::new(8, 8, 1).unwrap();
    assert_eq!(empty.next_key(None, &mut next), Err(Error::NotFound));
}

/// `clear` leaves no key and no node, the map still works, and the memory
/// comes back once the grace period is over.
pub(super) fn clear_empties_the_map_and_gives_the_memory_back<M: StringMap>() {
    let m = M::new(8, 8, 1000).unwrap();
    let empty = m.memory_usage();
    for i in 0..crate::scaled(500, 40) as u64 {
        m.insert(&i.to_be_bytes()[5..], &v(i), BPF_ANY).unwrap();
    }
    assert!(m.memory_usage() > empty);
    m.clear();
    assert_eq!((m.len(), m.keys().len(), m.live_bytes()), (0, 0, 0));
    m.insert(b"again", &v(1), BPF_NOEXIST).unwrap();
    m.remove(b"again", None).unwrap();
    assert!(
        crate::core::reclaim::wait_for_grace(|| m.memory_usage() <= empty),
        "memory never came back"
    );
}

/// The model-based tests' cases (2 under Miri).
pub(super) fn model_cases() -> ProptestConfig {
    ProptestConfig::with_cases(crate::scaled(128, 2) as u32)
}

/// Key bytes from a small alphabet, with the bytes that order specially
/// (0, 0xff), so that keys share prefixes and are prefixes of each other.
pub(super) fn key_byte() -> impl Strategy<Value = u8> + Clone {
    prop::sample::select(vec![0u8, 1, b'a', b'b', 0x7f, 0xff])
}

/// The operations of a model-based run: 1 to 200 (24 under Miri).
pub(super) fn ops_of<O: Debug>(op: impl Strategy<Value = O>) -> impl Strategy<Value = Vec<O>> {
    prop::collection::vec(op, 1..crate::scaled(200, 24))
}

/// A model-based run's input: its operations, then the keys it probes
/// (1 to 24, 4 under Miri), and the map's capacity (4 to 63 keys, so that
/// runs fill it).
pub(super) fn model_input<O: Debug>(
    ops: impl Strategy<Value = Vec<O>>,
    probe: impl Strategy<Value = Vec<u8>>,
) -> impl Strategy<Value = (Vec<O>, Vec<Vec<u8>>, usize)> {
    (
        ops,
        prop::collection::vec(probe, 1..crate::scaled(24, 4)),
        4..64usize,
    )
}

/// The model of a map: what it should hold.
pub(super) type Model = BTreeMap<Vec<u8>, u64>;

/// What inserting `key` under `flags` should answer, by the model, in a
/// map of `cap` keys.
pub(super) fn insert_result(model: &Model, key: &[u8], flags: u64, cap: usize) -> Result<()> {
    match (flags, model.contains_key(key)) {
        (BPF_NOEXIST, true) => Err(Error::Exists),
        (BPF_EXIST, false) => Err(Error::NotFound),
        (_, false) if model.len() == cap => Err(Error::Full),
        _ => Ok(()),
    }
}

/// `next_key` from `key` (`None`: the first key) against the model.
pub(super) fn check_next_key(
    m: &impl StringMap,
    model: &Model,
    key: Option<&Vec<u8>>,
) -> Result<(), TestCaseError> {
    let lower = key.map_or(Bound::Unbounded, Bound::Excluded);
    let mut next = Vec::new();
    match model.range::<Vec<u8>, _>((lower, Bound::Unbounded)).next() {
        Some((k, _)) => {
            prop_assert_eq!(m.next_key(key.map(Vec::as_slice), &mut next), Ok(()));
            prop_assert_eq!(&next, k);
        }
        None => prop_assert_eq!(
            m.next_key(key.map(Vec::as_slice), &mut next),
            Err(Error::NotFound)
        ),
    }
    Ok(())
}

/// Each probe's lookup and next key against the model.
pub(super) fn check_probes(
    m: &impl StringMap,
    model: &Model,
    probes: &[Vec<u8>],
) -> Result<(), TestCaseError> {
    for p in probes {
        prop_assert_eq!(get(m, p), model.get(p).copied());
        check_next_key(m, model, Some(p))?;
    }
    Ok(())
}

/// `for_each_in` over ranges between consecutive probes (inclusive and
/// exclusive ends, open on either side) against the model; `also` checks
/// more of the map against the same range and the keys it should hold.
pub(super) fn check_ranges(
    m: &impl StringMap,
    model: &Model,
    probes: &[Vec<u8>],
    mut also: impl FnMut(Bound<&Vec<u8>>, Bound<&Vec<u8>>, &[Vec<u8>]) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let guard = pin();
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
            also(l, h, &want)?;
            let mut walked = Vec::new();
            m.for_each_in((bound(l), bound(h)), &guard, |k, _| {
                walked.push(k.to_vec());
                ControlFlow::Continue(())
            });
            prop_assert_eq!(walked, want);
        }
    }
    Ok(())
}

fn bound(b: Bound<&Vec<u8>>) -> Bound<&[u8]> {
    b.map(Vec::as_slice)
}

/// Readers beside writers. The `stable` keys are stored first (key `i`
/// with value `i`); then two readers look them up in turn (always found,
/// with their value), and whenever `walk_at(i, reader)` holds for the
/// index `i` looked up, list the whole map with `walk` (the reader's
/// `n`th walk): keys strictly increasing (so none twice), every stable key
/// among them. `write` runs once both readers have started; they stop
/// when it has returned and each has walked `min_walks` times. The map
/// then holds the stable keys alone.
pub(super) fn readers_beside_writers<M: StringMap>(
    m: &Arc<M>,
    stable: &[Vec<u8>],
    walk_at: fn(usize, usize) -> bool,
    min_walks: usize,
    walk: fn(&M, usize) -> Vec<Vec<u8>>,
    write: impl FnOnce(),
) {
    for (i, k) in stable.iter().enumerate() {
        m.insert(k, &v(i as u64), BPF_ANY).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let looked = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (m, stop, stable, looked) =
                (m.clone(), stop.clone(), stable.to_vec(), looked.clone());
            std::thread::spawn(move || {
                let mut i = r;
                let mut walks = 0;
                while !stop.load(Ordering::Relaxed) || walks < min_walks {
                    crate::reader_pause();
                    i = (i + 7) % stable.len();
                    assert_eq!(
                        get(&*m, &stable[i]),
                        Some(i as u64),
                        "stable {:?}",
                        stable[i]
                    );
                    if walk_at(i, r) {
                        let keys = walk(&m, walks);
                        assert!(keys.windows(2).all(|w| w[0] < w[1]), "order");
                        let seen: BTreeSet<Vec<u8>> = keys.into_iter().collect();
                        assert!(
                            stable.iter().all(|k| seen.contains(k)),
                            "a stable key missed"
                        );
                        walks += 1;
                    }
                    looked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    while looked.load(Ordering::Relaxed) < 2 {
        std::thread::yield_now();
    }
    write();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(m.len(), stable.len());
    let want: Vec<_> = stable
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(m.keys(), want);
}

/// A writer gives every key a new value per round (16 bytes: the round
/// twice); readers never see a value from before the last completed
/// round, nor one torn between two.
pub(super) fn updates_are_never_stale_or_torn<M: StringMap>() {
    let m = Arc::new(M::new(8, 16, 1000).unwrap());
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
                    crate::reader_pause();
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
