//! Tests of [`KernelLpmTrie`]: the kernel's selftests
//! (`tools/testing/selftests/bpf/map_tests/lpm_trie_map_basic_ops.c`)
//! ported case by case, the trie's shape through inserts and every kind of
//! delete, a differential property test against the brute-force oracle,
//! refused updates that must leave the shape alone, and readers racing a
//! writer (bad input in general: the contract suite, `crate::conformance`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::kernel::{KernelLpmTrie, longest_prefix_match_bytes};
use super::key::{common_prefix_len, encode_key, mask_host_bits, prefix_contains};
use super::model::BruteForce;
use crate::{BPF_ANY, BPF_EXIST, BPF_NOEXIST, Error, Map, MapSpec, MapType, Result, create, pin};

/// `BPF_F_LOCK`, an update flag the LPM trie does not accept.
const BPF_F_LOCK: u64 = 4;

fn v4(s: &str) -> [u8; 4] {
    s.parse::<Ipv4Addr>().unwrap().octets()
}

fn v6(s: &str) -> [u8; 16] {
    s.parse::<Ipv6Addr>().unwrap().octets()
}

fn key4(prefixlen: u32, addr: &str) -> Vec<u8> {
    encode_key(prefixlen, &v4(addr))
}

fn get_u64(map: &dyn Map, key: &[u8]) -> Result<u64> {
    let mut value = [0u8; 8];
    map.lookup(key, &mut value)
        .map(|()| u64::from_ne_bytes(value))
}

fn get_u32(map: &dyn Map, key: &[u8]) -> Result<u32> {
    let mut value = [0u8; 4];
    map.lookup(key, &mut value)
        .map(|()| u32::from_ne_bytes(value))
}

/// The kernel selftests' map: IPv4 keys, u64 values, 100 entries.
fn ipv4_trie() -> KernelLpmTrie {
    KernelLpmTrie::new(4, 8, 100).unwrap()
}

/// Every key in `get_next_key` order.
fn keys_in_order(map: &dyn Map) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut next = vec![0u8; map.key_size()];
    loop {
        match map.get_next_key(keys.last().map(|k| &k[..]), &mut next) {
            Ok(_) => keys.push(next.clone()),
            Err(Error::NotFound) => return keys,
            Err(e) => panic!("get_next_key: {e}"),
        }
        assert!(keys.len() <= map.len(), "iteration does not end");
    }
}

/// `(prefixlen, data)` of a byte-contract key.
fn split(key: &[u8]) -> (u32, Vec<u8>) {
    (
        u32::from_ne_bytes(key[..4].try_into().unwrap()),
        key[4..].to_vec(),
    )
}

// ---------------------------------------------------------------------------
// The kernel selftests, case by case.
// ---------------------------------------------------------------------------

/// `test_lpm_basic` (there a test of the list oracle; here of the trie, on
/// 2-byte data, with the lookup key's prefixlen limiting the match).
#[test]
fn kernel_lpm_basic() {
    let t = KernelLpmTrie::new(2, 1, 16).unwrap();
    let get = |data: [u8; 2], plen: u32| -> Option<u8> {
        let mut v = [0u8];
        t.lookup(&encode_key(plen, &data), &mut v)
            .ok()
            .map(|()| v[0])
    };

    assert_eq!(get([0xff, 0], 8), None);

    t.update(&encode_key(8, &[0xff, 0]), &[1], BPF_ANY).unwrap();
    assert_eq!(get([0xff, 0], 8), Some(1));
    assert_eq!(get([0xff, 0xff], 16), Some(1));
    assert_eq!(get([0xff, 0x00], 16), Some(1));
    assert_eq!(get([0x7f, 0], 8), None);
    assert_eq!(get([0xfe, 0], 8), None);
    assert_eq!(get([0xff, 0], 7), None);

    t.update(&encode_key(16, &[0xff, 0xff]), &[2], BPF_ANY)
        .unwrap();
    assert_eq!(get([0xff, 0], 8), Some(1));
    assert_eq!(get([0xff, 0xff], 16), Some(2));
    assert_eq!(get([0xff, 0xff], 15), Some(1));
    assert_eq!(get([0x7f, 0xff], 16), None);
    t.check_invariants();

    t.delete(&encode_key(16, &[0xff, 0xff])).unwrap();
    assert_eq!(get([0xff, 0], 8), Some(1));
    assert_eq!(get([0xff, 0xff], 16), Some(1));

    t.delete(&encode_key(8, &[0xff, 0])).unwrap();
    assert_eq!(get([0xff, 0], 8), None);
    assert_eq!(t.len(), 0);
    assert_eq!(t.memory_usage(), 0);
    t.check_invariants();
}

/// `test_lpm_order`: the same random prefixes inserted in opposite orders
/// answer every lookup the same, and (the trie being canonical) iterate the
/// same prefixes in the same order.
#[test]
fn kernel_lpm_order() {
    let mut rng = StdRng::seed_from_u64(0xf00ba1);
    let entries: Vec<([u8; 2], u32)> = (0..crate::scaled(1 << 12, 1 << 6))
        .map(|_| {
            let mut data = [rng.random::<u8>(), rng.random::<u8>()];
            let plen = rng.random_range(1..=16);
            mask_host_bits(&mut data, plen);
            (data, plen)
        })
        .collect();
    // The value names the prefix, so a duplicate writes the same value.
    let value = |data: [u8; 2], plen: u32| [data[0], data[1], plen as u8];

    let t1 = KernelLpmTrie::new(2, 3, 1 << 13).unwrap();
    let t2 = KernelLpmTrie::new(2, 3, 1 << 13).unwrap();
    for &(data, plen) in &entries {
        t1.insert_data(&data, plen, &value(data, plen), BPF_ANY)
            .unwrap();
    }
    for &(data, plen) in entries.iter().rev() {
        t2.insert_data(&data, plen, &value(data, plen), BPF_ANY)
            .unwrap();
    }
    t1.check_invariants();
    t2.check_invariants();
    assert_eq!(t1.len(), t2.len());

    let guard = pin();
    for _ in 0..crate::scaled(1 << 8, 1 << 5) {
        let key = [rng.random::<u8>(), rng.random::<u8>()];
        assert_eq!(t1.lookup_data(&key, &guard), t2.lookup_data(&key, &guard));
    }
    // Intermediate nodes copy the data of the node they split, so the
    // shapes differ in host bits only; the stored prefixes and their order
    // do not.
    assert_eq!(keys_in_order(&t1), keys_in_order(&t2));
}

/// `test_lpm_map(keysize)` for keysize 1..=16: random prefixes (/0 allowed),
/// random full-length lookups against the oracle, then half the prefixes
/// deleted and the lookups run again.
#[test]
fn kernel_lpm_map() {
    let mut rng = StdRng::seed_from_u64(0xf00ba1);
    // Under Miri, key sizes 1, 6, 11 and 16.
    for keysize in (1..=16usize).step_by(crate::scaled(1, 5)) {
        let (n_nodes, n_lookups) = (crate::scaled(1 << 8, 16), crate::scaled(1 << 9, 32));
        let map = KernelLpmTrie::new(keysize, keysize + 1, 4096).unwrap();
        let mut model = BruteForce::default();

        // The value is the data followed by the prefix length.
        for _ in 0..n_nodes {
            let mut value: Vec<u8> = (0..keysize).map(|_| rng.random()).collect();
            let plen = rng.random_range(0..=8 * keysize as u32);
            value.push(plen as u8);
            model.insert(&value[..keysize], plen, &value);
            map.update(&encode_key(plen, &value[..keysize]), &value, 0)
                .unwrap();
        }

        let check = |model: &BruteForce, rng: &mut StdRng| {
            let mut matches = 0;
            let mut value = vec![0u8; keysize + 1];
            for _ in 0..n_lookups {
                let data: Vec<u8> = (0..keysize).map(|_| rng.random()).collect();
                let want = model.longest_match(&data, 8 * keysize as u32);
                let got = map.lookup(&encode_key(8 * keysize as u32, &data), &mut value);
                match want {
                    Some(entry) => {
                        assert_eq!(got, Ok(()));
                        assert_eq!(value, entry.2);
                        matches += 1;
                    }
                    None => assert_eq!(got, Err(Error::NotFound)),
                }
            }
            matches
        };
        check(&model, &mut rng);
        map.check_invariants();
        assert_eq!(map.len(), model.entries.len());

        // Delete half the prefixes, most recently added first.
        let doomed: Vec<_> = model
            .entries
            .iter()
            .rev()
            .take(model.entries.len() / 2)
            .cloned()
            .collect();
        for (data, plen, _) in doomed {
            map.delete(&encode_key(plen, &data)).unwrap();
            assert!(model.remove(&data, plen));
        }
        check(&model, &mut rng);
        map.check_invariants();
        assert_eq!(map.len(), model.entries.len());
    }
}

/// `test_lpm_ipaddr`: real IPv4 and IPv6 ranges.
#[test]
fn kernel_lpm_ipaddr() {
    let map4 = ipv4_trie();
    let map6 = KernelLpmTrie::new(16, 8, 100).unwrap();

    for (value, plen, addr) in [
        (1u64, 16, "192.168.0.0"),
        (2, 24, "192.168.0.0"),
        (3, 24, "192.168.128.0"),
        (5, 24, "192.168.1.0"),
        (4, 23, "192.168.0.0"),
    ] {
        map4.update(&key4(plen, addr), &value.to_ne_bytes(), 0)
            .unwrap();
    }
    let v6key = |plen: u32, addr: &str| encode_key(plen, &v6(addr));
    map6.update(
        &v6key(64, "2a00:1450:4001:814::200e"),
        &0xdeadbeefu64.to_ne_bytes(),
        0,
    )
    .unwrap();

    assert_eq!(get_u64(&map4, &key4(32, "192.168.128.23")), Ok(3));
    assert_eq!(get_u64(&map4, &key4(32, "192.168.0.1")), Ok(2));
    assert_eq!(
        get_u64(&map6, &v6key(128, "2a00:1450:4001:814::")),
        Ok(0xdeadbeef)
    );
    assert_eq!(
        get_u64(&map6, &v6key(128, "2a00:1450:4001:814::1")),
        Ok(0xdeadbeef)
    );

    assert_eq!(get_u64(&map4, &key4(32, "10.0.0.1")), Err(Error::NotFound));
    assert_eq!(
        get_u64(&map4, &key4(32, "11.11.11.11")),
        Err(Error::NotFound)
    );
    assert_eq!(
        get_u64(&map6, &v6key(128, "2a00:ffff::")),
        Err(Error::NotFound)
    );
    map4.check_invariants();
    map6.check_invariants();
}

/// `test_lpm_delete`, with the shape checked at each step.
#[test]
fn kernel_lpm_delete() {
    let map = ipv4_trie();
    //         (1)
    //        /   \
    //     (IM)    (3)
    //    /   \
    //   (2)  (4)
    for (value, plen, addr) in [
        (1u64, 16, "192.168.0.0"),
        (2, 24, "192.168.0.0"),
        (3, 24, "192.168.128.0"),
        (4, 24, "192.168.1.0"),
    ] {
        map.update(&key4(plen, addr), &value.to_ne_bytes(), 0)
            .unwrap();
    }
    assert_eq!(
        map.shape(),
        "192.168.0.0/16(192.168.0.0/23*(192.168.0.0/24,192.168.1.0/24),192.168.128.0/24)"
    );

    // Remove non-existent nodes.
    assert_eq!(get_u64(&map, &key4(32, "10.0.0.1")), Err(Error::NotFound));
    assert_eq!(map.delete(&key4(30, "192.255.0.0")), Err(Error::NotFound));
    assert_eq!(map.delete(&key4(16, "192.255.0.0")), Err(Error::NotFound));
    // The intermediate node is not an entry either.
    assert_eq!(map.delete(&key4(23, "192.168.0.0")), Err(Error::NotFound));

    // Initial lookup.
    assert_eq!(get_u64(&map, &key4(32, "192.168.0.1")), Ok(2));

    // Remove a leaf node: its intermediate parent goes too.
    map.delete(&key4(24, "192.168.0.0")).unwrap();
    assert_eq!(get_u64(&map, &key4(32, "192.168.0.1")), Ok(1));
    assert_eq!(
        map.shape(),
        "192.168.0.0/16(192.168.1.0/24,192.168.128.0/24)"
    );

    // Remove the other leaf.
    map.delete(&key4(24, "192.168.1.0")).unwrap();
    assert_eq!(get_u64(&map, &key4(32, "192.168.1.1")), Ok(1));
    assert_eq!(map.shape(), "192.168.0.0/16(-,192.168.128.0/24)");

    // Remove the root node: its one child takes its place.
    map.delete(&key4(16, "192.168.0.0")).unwrap();
    assert_eq!(get_u64(&map, &key4(32, "192.168.128.1")), Ok(3));
    assert_eq!(map.shape(), "192.168.128.0/24");

    // Remove the last node.
    map.delete(&key4(24, "192.168.128.0")).unwrap();
    assert_eq!(
        get_u64(&map, &key4(32, "192.168.128.1")),
        Err(Error::NotFound)
    );
    assert_eq!(map.shape(), "-");
    assert_eq!((map.len(), map.memory_usage()), (0, 0));
}

/// `test_lpm_get_next_key`: the exact post-order sequences.
#[test]
fn kernel_lpm_get_next_key() {
    let map = KernelLpmTrie::new(4, 4, 100).unwrap();
    let mut key = [0u8; 8];
    let mut next = [0u8; 8];
    let zero = 0u32.to_ne_bytes();
    let p = |k: &[u8; 8]| split(k).0; // prefixlen

    // Empty tree.
    assert_eq!(map.get_next_key(None, &mut key), Err(Error::NotFound));

    // One element: the first key, and nothing after it.
    map.update(&key4(16, "192.168.0.0"), &zero, 0).unwrap();
    assert_eq!(map.get_next_key(None, &mut key), Ok(8));
    assert_eq!(key[..], key4(16, "192.168.0.0")[..]);
    assert_eq!(
        map.get_next_key(Some(&key), &mut next),
        Err(Error::NotFound)
    );

    // No exact matching key gives the first one in post order (the C test
    // passes NULL here).
    assert_eq!(map.get_next_key(None, &mut key), Ok(8));
    assert_eq!(p(&key), 16);

    let walk = |map: &KernelLpmTrie| -> Vec<Vec<u8>> { keys_in_order(map) };

    // Two elements.
    map.update(&key4(24, "192.168.128.0"), &zero, 0).unwrap();
    assert_eq!(
        walk(&map),
        vec![key4(24, "192.168.128.0"), key4(16, "192.168.0.0")]
    );

    // Three.
    map.update(&key4(24, "192.168.0.0"), &zero, 0).unwrap();
    assert_eq!(
        walk(&map),
        vec![
            key4(24, "192.168.0.0"),
            key4(24, "192.168.128.0"),
            key4(16, "192.168.0.0")
        ]
    );

    // Four.
    map.update(&key4(24, "192.168.1.0"), &zero, 0).unwrap();
    assert_eq!(
        walk(&map),
        vec![
            key4(24, "192.168.0.0"),
            key4(24, "192.168.1.0"),
            key4(24, "192.168.128.0"),
            key4(16, "192.168.0.0")
        ]
    );

    // Five.
    map.update(&key4(28, "192.168.1.128"), &zero, 0).unwrap();
    let five = vec![
        key4(24, "192.168.0.0"),
        key4(28, "192.168.1.128"),
        key4(24, "192.168.1.0"),
        key4(24, "192.168.128.0"),
        key4(16, "192.168.0.0"),
    ];
    assert_eq!(walk(&map), five);
    assert_eq!(
        map.get_next_key(Some(&five[4]), &mut next),
        Err(Error::NotFound)
    );

    // A key that is not stored restarts from the first in post order.
    assert_eq!(
        map.get_next_key(Some(&key4(22, "192.168.1.0")), &mut next),
        Ok(8)
    );
    assert_eq!(next[..], five[0][..]);
}

/// `test_lpm_multi_thread`: update, delete, lookup and get_next_key threads
/// on the same four keys; every call succeeds or says ENOENT.
#[test]
fn kernel_lpm_multi_thread() {
    let map = KernelLpmTrie::new(4, 4, 100).unwrap();
    let keys = [
        key4(16, "192.168.0.0"),
        key4(24, "192.168.0.0"),
        key4(24, "192.168.128.0"),
        key4(24, "192.168.1.0"),
    ];
    let iters = crate::scaled(2000, 30);
    std::thread::scope(|s| {
        for cmd in 0..4 {
            let (map, keys) = (&map, &keys);
            s.spawn(move || {
                for iter in 0..iters {
                    for i in 0..keys.len() {
                        // First half forwards, second half backwards.
                        let j = if iter < iters / 2 {
                            i
                        } else {
                            keys.len() - i - 1
                        };
                        let key = &keys[j];
                        match cmd {
                            0 => map.update(key, &(j as u32).to_ne_bytes(), 0).unwrap(),
                            1 => assert!(matches!(map.delete(key), Ok(()) | Err(Error::NotFound))),
                            2 => {
                                let r = get_u32(map, key);
                                assert!(matches!(r, Ok(_) | Err(Error::NotFound)));
                            }
                            _ => {
                                let mut next = [0u8; 8];
                                let r = map.get_next_key(Some(key), &mut next);
                                assert!(matches!(r, Ok(_) | Err(Error::NotFound)));
                            }
                        }
                    }
                }
            });
        }
    });
    map.check_invariants();
}

/// `test_lpm_trie_update_flags`.
#[test]
fn kernel_lpm_trie_update_flags() {
    let map = KernelLpmTrie::new(4, 4, 3).unwrap();
    let key = |plen: u32, data: [u8; 4]| encode_key(plen, &data);
    let v = |x: u32| x.to_ne_bytes();

    // Invalid flags.
    assert_eq!(
        map.update(&key(32, [0; 4]), &v(0), BPF_F_LOCK)
            .unwrap_err()
            .errno(),
        22
    );
    assert_eq!(
        map.update(&key(32, [0; 4]), &v(0), BPF_NOEXIST | BPF_EXIST)
            .unwrap_err()
            .errno(),
        22
    );
    // Overwrite in an empty trie.
    assert_eq!(
        map.update(&key(32, [0; 4]), &v(2), BPF_EXIST),
        Err(Error::NotFound)
    );

    // Add a new node, then again with NOEXIST.
    map.update(&key(16, [0; 4]), &v(1), BPF_NOEXIST).unwrap();
    assert_eq!(get_u32(&map, &key(16, [0; 4])), Ok(1));
    assert_eq!(
        map.update(&key(16, [0; 4]), &v(1), BPF_NOEXIST),
        Err(Error::Exists)
    );

    // Overwrite it with EXIST, then ANY.
    map.update(&key(16, [0; 4]), &v(4), BPF_EXIST).unwrap();
    assert_eq!(get_u32(&map, &key(16, [0; 4])), Ok(4));
    map.update(&key(16, [0; 4]), &v(1), BPF_ANY).unwrap();
    assert_eq!(get_u32(&map, &key(16, [0; 4])), Ok(1));

    // A prefix of the first node: EXIST fails, NOEXIST adds it.
    assert_eq!(
        map.update(&key(8, [0; 4]), &v(2), BPF_EXIST),
        Err(Error::NotFound)
    );
    map.update(&key(8, [0; 4]), &v(2), BPF_NOEXIST).unwrap();
    assert_eq!(get_u32(&map, &key(8, [0; 4])), Ok(2));

    // A sibling of the first node.
    let sibling = key(9, [0, 0x80, 0, 0]);
    map.update(&sibling, &v(5), BPF_NOEXIST).unwrap();
    assert_eq!(get_u32(&map, &sibling), Ok(5));
    map.update(&sibling, &v(3), BPF_ANY).unwrap();
    assert_eq!(get_u32(&map, &sibling), Ok(3));

    // Delete the /8 (two children): it becomes intermediate, and EXIST on
    // it fails.
    map.delete(&key(8, [0; 4])).unwrap();
    assert_eq!(map.shape(), "0.0.0.0/8*(0.0.0.0/16,0.128.0.0/9)");
    assert_eq!(
        map.update(&key(8, [0; 4]), &v(2), BPF_EXIST),
        Err(Error::NotFound)
    );
    map.check_invariants();
}

/// `test_lpm_trie_update_full_map`: a full trie refuses new prefixes
/// (`ENOSPC` in the kernel, `E2BIG` here) and accepts in-place updates.
#[test]
fn kernel_lpm_trie_update_full_map() {
    let map = KernelLpmTrie::new(4, 4, 3).unwrap();
    let key = |plen: u32, data: [u8; 4]| encode_key(plen, &data);
    for (plen, data, value) in [(16, [0; 4], 0u32), (8, [0; 4], 1), (9, [0, 0x80, 0, 0], 2)] {
        map.update(&key(plen, data), &value.to_ne_bytes(), BPF_NOEXIST)
            .unwrap();
        assert_eq!(get_u32(&map, &key(plen, data)), Ok(value));
    }
    assert_eq!(
        map.update(&key(32, [0; 4]), &3u32.to_ne_bytes(), BPF_ANY),
        Err(Error::Full)
    );

    map.update(&key(16, [0; 4]), &4u32.to_ne_bytes(), BPF_EXIST)
        .unwrap();
    assert_eq!(get_u32(&map, &key(16, [0; 4])), Ok(4));
    map.update(&key(9, [0, 0x80, 0, 0]), &5u32.to_ne_bytes(), BPF_ANY)
        .unwrap();
    assert_eq!(get_u32(&map, &key(9, [0, 0x80, 0, 0])), Ok(5));
    map.check_invariants();
}

/// `test_lpm_trie_iterate_strs`: NUL-terminated strings iterate sorted,
/// also when each key is deleted right after it is returned (the deleted key
/// is then unknown, so the next call restarts from the new first key).
#[test]
fn kernel_lpm_trie_iterate_strs() {
    let strs = ["ab", "abO", "abc", "abo", "abS", "abcd"];
    let map = KernelLpmTrie::new(8, 4, strs.len() as u32).unwrap();
    let key_of = |s: &str| {
        let mut data = [0u8; 8];
        data[..s.len()].copy_from_slice(s.as_bytes());
        encode_key((s.len() as u32 + 1) * 8, &data)
    };

    for (i, s) in strs.iter().enumerate() {
        let i = i as u32;
        let flags = if i % 2 == 1 { BPF_NOEXIST } else { BPF_ANY };
        map.update(&key_of(s), &(i + 100).to_ne_bytes(), flags)
            .unwrap();
        assert_eq!(get_u32(&map, &key_of(s)), Ok(i + 100));
        assert_eq!(
            map.update(&key_of(s), &(i + 100).to_ne_bytes(), BPF_NOEXIST),
            Err(Error::Exists)
        );
        let flags = if i % 2 == 1 { BPF_ANY } else { BPF_EXIST };
        map.update(&key_of(s), &i.to_ne_bytes(), flags).unwrap();
        for (j, t) in strs.iter().enumerate().take(i as usize + 1) {
            assert_eq!(get_u32(&map, &key_of(t)), Ok(j as u32));
        }
    }
    assert_eq!(
        map.update(&encode_key(64, &[0; 8]), &0u32.to_ne_bytes(), 0),
        Err(Error::Full)
    );

    let mut sorted = strs;
    sorted.sort();
    let sorted_keys: Vec<Vec<u8>> = sorted.iter().map(|s| key_of(s)).collect();
    assert_eq!(keys_in_order(&map), sorted_keys);

    let mut cur: Option<Vec<u8>> = None;
    let mut next = [0u8; 12];
    for want in &sorted_keys {
        map.get_next_key(cur.as_deref(), &mut next).unwrap();
        assert_eq!(&next[..], &want[..]);
        map.delete(&next).unwrap();
        cur = Some(next.to_vec());
    }
    assert_eq!(
        map.get_next_key(cur.as_deref(), &mut next),
        Err(Error::NotFound)
    );
    map.check_invariants();
}

/// `test_lpm_trie_iterate_ints`: 4096 big-endian /32 integers iterate in
/// order while the smallest is deleted after each step.
#[test]
fn kernel_lpm_trie_iterate_ints() {
    let max_entries = crate::scaled(4096, 64) as u32;
    let map = KernelLpmTrie::new(4, 1, max_entries).unwrap();
    for i in 0..max_entries {
        map.update(&encode_key(32, &i.to_be_bytes()), &[1], BPF_NOEXIST)
            .unwrap();
    }
    let mut cur: Option<[u8; 8]> = None;
    let mut next = [0u8; 8];
    for i in 0..max_entries {
        map.get_next_key(cur.as_ref().map(|k| &k[..]), &mut next)
            .unwrap();
        assert_eq!(next[..], encode_key(32, &i.to_be_bytes())[..]);
        cur = Some(next);
        map.delete(&next).unwrap();
    }
    assert_eq!(
        map.get_next_key(cur.as_ref().map(|k| &k[..]), &mut next),
        Err(Error::NotFound)
    );
    assert_eq!(map.get_next_key(None, &mut next), Err(Error::NotFound));
    assert_eq!((map.len(), map.memory_usage()), (0, 0));
}

// ---------------------------------------------------------------------------
// Shape: intermediate nodes appear and go exactly as in the kernel.
// ---------------------------------------------------------------------------

/// The example at the top of `lpm_trie.c`, then every branch of
/// `trie_delete_elem`.
#[test]
fn intermediate_nodes_come_and_go_as_in_the_kernel() {
    let map = ipv4_trie();
    let put = |plen: u32, addr: &str, value: u64| {
        map.update(&key4(plen, addr), &value.to_ne_bytes(), BPF_NOEXIST)
            .unwrap();
        map.check_invariants();
    };
    let del = |plen: u32, addr: &str| {
        map.delete(&key4(plen, addr)).unwrap();
        map.check_invariants();
    };
    // Real node: 24 B header + 4 B data + 8 B value = 36 -> 40 B; an
    // intermediate one has no value: 28 -> 32 B.
    let (real, im) = (40, 32);

    put(16, "192.168.0.0", 1);
    assert_eq!(map.shape(), "192.168.0.0/16");
    put(24, "192.168.0.0", 2);
    assert_eq!(map.shape(), "192.168.0.0/16(192.168.0.0/24,-)");
    put(24, "192.168.128.0", 3);
    assert_eq!(
        map.shape(),
        "192.168.0.0/16(192.168.0.0/24,192.168.128.0/24)"
    );
    // Diverges from 192.168.0.0/24 after 23 bits: an intermediate /23.
    put(24, "192.168.1.0", 5);
    assert_eq!(
        map.shape(),
        "192.168.0.0/16(192.168.0.0/23*(192.168.0.0/24,192.168.1.0/24),192.168.128.0/24)"
    );
    assert_eq!((map.len(), map.memory_usage()), (4, 4 * real + im));
    assert_eq!(map.kernel_mem_usage(), 4 * (24 + 4 + 8));
    // "(4) would be re-used if 192.168.0.0/23 is added to the trie".
    put(23, "192.168.0.0", 4);
    assert_eq!(
        map.shape(),
        "192.168.0.0/16(192.168.0.0/23(192.168.0.0/24,192.168.1.0/24),192.168.128.0/24)"
    );
    assert_eq!((map.len(), map.memory_usage()), (5, 5 * real));
    assert_eq!(get_u64(&map, &key4(23, "192.168.1.1")), Ok(4));

    // Two children: marked intermediate in place (its allocation stays).
    del(23, "192.168.0.0");
    assert_eq!(
        map.shape(),
        "192.168.0.0/16(192.168.0.0/23*(192.168.0.0/24,192.168.1.0/24),192.168.128.0/24)"
    );
    assert_eq!((map.len(), map.memory_usage()), (4, 5 * real));
    assert_eq!(get_u64(&map, &key4(23, "192.168.1.1")), Ok(1));

    // A leaf under an intermediate parent: both go, the sibling moves up.
    del(24, "192.168.0.0");
    assert_eq!(
        map.shape(),
        "192.168.0.0/16(192.168.1.0/24,192.168.128.0/24)"
    );
    assert_eq!((map.len(), map.memory_usage()), (3, 3 * real));

    // Diverges from the root at bit 0: an intermediate /0 becomes the root.
    put(8, "10.0.0.0", 6);
    assert_eq!(
        map.shape(),
        "192.168.0.0/0*(10.0.0.0/8,192.168.0.0/16(192.168.1.0/24,192.168.128.0/24))"
    );
    // A prefix that contains an existing node is inserted as its parent.
    put(4, "0.0.0.0", 7);
    assert_eq!(
        map.shape(),
        "192.168.0.0/0*(0.0.0.0/4(-,10.0.0.0/8),192.168.0.0/16(192.168.1.0/24,192.168.128.0/24))"
    );

    // One child: the child takes the node's slot.
    del(4, "0.0.0.0");
    assert_eq!(
        map.shape(),
        "192.168.0.0/0*(10.0.0.0/8,192.168.0.0/16(192.168.1.0/24,192.168.128.0/24))"
    );
    put(16, "10.1.0.0", 8);
    del(8, "10.0.0.0");
    assert_eq!(
        map.shape(),
        "192.168.0.0/0*(10.1.0.0/16,192.168.0.0/16(192.168.1.0/24,192.168.128.0/24))"
    );

    // A leaf under a real parent: only its slot is cleared.
    del(24, "192.168.1.0");
    assert_eq!(
        map.shape(),
        "192.168.0.0/0*(10.1.0.0/16,192.168.0.0/16(-,192.168.128.0/24))"
    );

    // Filling the intermediate /0 makes it real (and counts as new).
    put(0, "0.0.0.0", 9);
    assert_eq!(
        map.shape(),
        "0.0.0.0/0(10.1.0.0/16,192.168.0.0/16(-,192.168.128.0/24))"
    );
    assert_eq!(get_u64(&map, &key4(32, "1.2.3.4")), Ok(9));
    assert_eq!(map.len(), 4);
}

// ---------------------------------------------------------------------------
// Kernel behaviours worth pinning down.
// ---------------------------------------------------------------------------

/// A lookup key's prefixlen caps the match: the longest stored prefix no
/// longer than it. Above `max_prefixlen` the kernel finds nothing (ENOENT,
/// not EINVAL).
#[test]
fn lookup_prefixlen_limits_the_match() {
    let map = ipv4_trie();
    for (plen, addr, value) in [
        (8, "10.0.0.0", 1u64),
        (16, "10.1.0.0", 2),
        (24, "10.1.2.0", 3),
    ] {
        map.update(&key4(plen, addr), &value.to_ne_bytes(), BPF_ANY)
            .unwrap();
    }
    let at = |plen: u32| get_u64(&map, &key4(plen, "10.1.2.3"));
    assert_eq!(at(32), Ok(3));
    assert_eq!(at(24), Ok(3));
    assert_eq!(at(23), Ok(2));
    assert_eq!(at(16), Ok(2));
    assert_eq!(at(15), Ok(1));
    assert_eq!(at(8), Ok(1));
    assert_eq!(at(7), Err(Error::NotFound));
    assert_eq!(at(0), Err(Error::NotFound));
    assert_eq!(at(33), Err(Error::NotFound));
    assert_eq!(at(u32::MAX), Err(Error::NotFound));

    map.update(&key4(0, "0.0.0.0"), &9u64.to_ne_bytes(), BPF_ANY)
        .unwrap();
    assert_eq!(at(0), Ok(9));
    assert_eq!(at(7), Ok(9));
    assert_eq!(get_u64(&map, &key4(32, "99.0.0.1")), Ok(9));

    let guard = pin();
    assert_eq!(
        map.lookup_prefix(&v4("10.1.2.3"), 20, &guard),
        Some(&2u64.to_ne_bytes()[..])
    );
    assert_eq!(map.lookup_prefix(&v4("10.1.2.3"), 33, &guard), None);
    assert_eq!(
        map.lookup_data(&v4("10.1.2.3"), &guard),
        Some(&3u64.to_ne_bytes()[..])
    );
    assert_eq!(map.lookup_data(&[10, 1, 2], &guard), None);
}

/// Host bits are never matched but are stored as given, and
/// `get_next_key` hands them back (the kernel copies the whole key).
#[test]
fn host_bits_are_ignored_for_matching_but_echoed_by_get_next_key() {
    let map = ipv4_trie();
    map.update(&key4(8, "10.1.2.3"), &1u64.to_ne_bytes(), BPF_ANY)
        .unwrap();
    assert_eq!(get_u64(&map, &key4(32, "10.200.0.1")), Ok(1));
    assert_eq!(get_u64(&map, &key4(8, "10.0.0.0")), Ok(1));
    assert_eq!(keys_in_order(&map), vec![key4(8, "10.1.2.3")]);

    // Same prefix, other host bits: the same entry.
    assert_eq!(
        map.update(&key4(8, "10.9.9.9"), &2u64.to_ne_bytes(), BPF_NOEXIST),
        Err(Error::Exists)
    );
    map.update(&key4(8, "10.9.9.9"), &2u64.to_ne_bytes(), BPF_EXIST)
        .unwrap();
    assert_eq!(map.len(), 1);
    assert_eq!(keys_in_order(&map), vec![key4(8, "10.9.9.9")]);

    // A stored key with host bits is found by get_next_key as it was
    // returned, and deleted with any host bits.
    let mut next = [0u8; 8];
    assert_eq!(
        map.get_next_key(Some(&key4(8, "10.9.9.9")), &mut next),
        Err(Error::NotFound)
    );
    map.delete(&key4(8, "10.0.0.0")).unwrap();
    assert!(map.is_empty());
}

/// Batch operations come from the generic defaults (as the kernel's
/// `generic_map_*_batch`); lookup-and-delete is not supported at all.
#[test]
fn batch_operations_and_lookup_and_delete() {
    let map = ipv4_trie();
    let keys: Vec<u8> = [
        key4(24, "10.1.2.0"),
        key4(16, "10.1.0.0"),
        key4(8, "10.0.0.0"),
    ]
    .concat();
    let values: Vec<u8> = [1u64, 2, 3].iter().flat_map(|v| v.to_ne_bytes()).collect();
    assert_eq!(map.update_batch(&keys, &values, BPF_NOEXIST), Ok(3));

    let (mut out_keys, mut out_values) = (vec![0u8; 8 * 8], vec![0u8; 8 * 8]);
    assert_eq!(
        map.lookup_batch(None, &mut out_keys, &mut out_values),
        Ok(3)
    );
    // Post-order is the nesting order here.
    assert_eq!(out_keys[..24], keys[..]);
    assert_eq!(out_values[..24], values[..]);

    let mut value = [0u8; 8];
    assert_eq!(
        map.lookup_and_delete(&keys[..8], &mut value),
        Err(Error::Unsupported)
    );
    assert_eq!(
        map.lookup_and_delete_batch(&mut out_keys, &mut out_values)
            .map_err(|e| e.error),
        Err(Error::Unsupported)
    );
    assert_eq!(map.len(), 3);

    assert_eq!(map.delete_batch(&keys), Ok(3));
    assert!(map.is_empty());
    assert_eq!(map.delete_batch(&keys).unwrap_err().error, Error::NotFound);
}

// ---------------------------------------------------------------------------
// Creation, and refused updates: the shape unchanged.
// ---------------------------------------------------------------------------

#[test]
fn creation_checks_sizes() {
    for (ds, vs, max) in [
        (0, 8, 1),
        (257, 8, 1),
        (usize::MAX, 8, 1),
        (4, 0, 1),
        (4, 8, 0),
    ] {
        assert_eq!(
            KernelLpmTrie::new(ds, vs, max).err().map(|e| e.errno()),
            Some(22)
        );
    }
    let map = KernelLpmTrie::new(16, 3, 7).unwrap();
    assert_eq!(
        (
            map.map_type(),
            map.key_size(),
            map.value_size(),
            map.max_entries()
        ),
        (MapType::KERNEL_LPM_TRIE, 20, 3, 7)
    );
    assert_eq!((map.data_size(), map.max_prefixlen()), (16, 128));
    let map = create(&MapSpec::new(MapType::KERNEL_LPM_TRIE, 8, 8, 1)).unwrap();
    assert_eq!(map.map_type().name(), Some("kernel_lpm_trie"));
}

/// What the contract suite cannot see: a refused update of a full trie
/// (one that would need an intermediate node too) leaves its shape, not
/// just its contents, as it was; bad input to the port's own API is
/// refused too.
#[test]
fn refused_updates_leave_the_shape_unchanged() {
    let map = KernelLpmTrie::new(4, 8, 3).unwrap();
    for (plen, addr) in [
        (16, "192.168.0.0"),
        (24, "192.168.0.0"),
        (24, "192.168.1.0"),
    ] {
        map.update(&key4(plen, addr), &1u64.to_ne_bytes(), BPF_ANY)
            .unwrap();
    }
    let snapshot = |map: &KernelLpmTrie| {
        (
            map.shape(),
            keys_in_order(map),
            map.len(),
            map.memory_usage(),
        )
    };
    let before = snapshot(&map);
    let einval = |r: Result<()>| assert_eq!(r.map_err(|e| e.errno()), Err(22));
    let v = 7u64.to_ne_bytes();
    einval(map.update(&key4(u32::MAX, "192.168.0.0"), &v, BPF_ANY));
    einval(map.insert_data(&[192, 168, 0], 16, &v, BPF_ANY));
    einval(map.insert_data(&v4("192.168.0.0"), 33, &v, BPF_ANY));
    einval(map.insert_data(&v4("192.168.0.0"), 16, &v[..4], BPF_ANY));
    einval(map.insert_data(&v4("192.168.0.0"), 16, &v, 3));
    einval(map.remove_data(&[192, 168], 16));
    einval(map.remove_data(&v4("192.168.0.0"), 40));

    // Full: new prefixes (the intermediate /23 included) are refused, with
    // E2BIG; EXIST on a new prefix is ENOENT first, as the kernel checks.
    for (plen, addr) in [(32, "10.0.0.1"), (23, "192.168.0.0"), (0, "0.0.0.0")] {
        let err = map.update(&key4(plen, addr), &v, BPF_ANY).unwrap_err();
        assert_eq!((err.clone(), err.errno()), (Error::Full, 7));
        assert_eq!(
            map.update(&key4(plen, addr), &v, BPF_EXIST),
            Err(Error::NotFound)
        );
    }
    // Deletes of an intermediate prefix and of prefixes never stored.
    assert_eq!(map.delete(&key4(23, "192.168.0.0")), Err(Error::NotFound));
    assert_eq!(map.delete(&key4(8, "192.0.0.0")), Err(Error::NotFound));

    // get_next_key: a too-long prefixlen restarts from the first key.
    let mut next = [0u8; 8];
    map.get_next_key(Some(&key4(40, "192.168.0.0")), &mut next)
        .unwrap();
    assert_eq!(next[..], before.1[0][..]);

    assert_eq!(snapshot(&map), before);
    map.check_invariants();

    // In-place updates still work when full.
    map.update(&key4(16, "192.168.0.0"), &v, BPF_EXIST).unwrap();
    assert_eq!(get_u64(&map, &key4(32, "192.168.7.7")), Ok(7));
    map.check_invariants();
}

// ---------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(256, 4) as u32))]

    /// The kernel's 8/4/2/1-byte loop agrees with the bitwise helper.
    #[test]
    fn word_loop_matches_bitwise_common_prefix(
        ds in 1usize..=20,
        a in prop::collection::vec(any::<u8>(), 20),
        noise in prop::collection::vec(any::<u8>(), 20),
        flip in any::<u32>(),
        how in 0u8..3,
        np in any::<u32>(),
        kp in any::<u32>(),
    ) {
        let max = 8 * ds as u32;
        let b: Vec<u8> = match how {
            0 => a.clone(),
            1 => {
                let mut b = a.clone();
                let bit = (flip % max) as usize;
                b[bit / 8] ^= 0x80 >> (bit % 8);
                b
            }
            _ => noise,
        };
        let (np, kp) = (np % (max + 1), kp % (max + 1));
        prop_assert_eq!(
            longest_prefix_match_bytes(ds, &a, np, &b, kp),
            common_prefix_len(&a[..ds], &b[..ds], np.min(kp))
        );
    }
}

/// An address: one of a few base patterns with its low bits scrambled from
/// bit `shift` of the key on, so prefixes nest and diverge at every depth.
#[derive(Debug, Clone, Copy)]
struct Addr {
    base: usize,
    noise: u128,
    shift: u32,
}

const BASES: [u128; 6] = [
    0,
    u128::MAX,
    1 << 127,
    0x0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f,
    0xc0a8_0100_0000_0000_0000_0000_0000_0000,
    0x0a01_0203_2a00_1450_4001_0814_0000_200e,
];

impl Addr {
    /// The first `ds` bytes.
    fn bytes(self, ds: usize) -> Vec<u8> {
        let bits = 8 * ds as u32;
        let base = BASES[self.base] >> (128 - bits);
        let noise = (self.noise >> (128 - bits))
            .checked_shr(self.shift % (bits + 1))
            .unwrap_or(0);
        (base ^ noise).to_be_bytes()[16 - ds..].to_vec()
    }
}

#[derive(Debug, Clone)]
enum Op {
    Update { addr: Addr, plen: u32, flags: u64 },
    Delete { addr: Addr, plen: u32 },
    Lookup { addr: Addr, plen: u32 },
}

fn addr() -> impl Strategy<Value = Addr> {
    (0..BASES.len(), any::<u128>(), any::<u32>()).prop_map(|(base, noise, shift)| Addr {
        base,
        noise,
        shift,
    })
}

/// Raw prefix lengths; `fit` maps them into `0..=max` with /0 and the host
/// route common.
fn plen() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()]
}

fn fit(plen: u32, max: u32) -> u32 {
    if plen == u32::MAX {
        max
    } else {
        plen % (max + 1)
    }
}

fn op() -> impl Strategy<Value = Op> {
    let flags = prop_oneof![3 => Just(BPF_ANY), 1 => Just(BPF_NOEXIST), 1 => Just(BPF_EXIST)];
    prop_oneof![
        4 => (addr(), plen(), flags).prop_map(|(addr, plen, flags)| Op::Update { addr, plen, flags }),
        2 => (addr(), plen()).prop_map(|(addr, plen)| Op::Delete { addr, plen }),
        3 => (addr(), plen()).prop_map(|(addr, plen)| Op::Lookup { addr, plen }),
    ]
}

/// Runs `ops` on a trie and the oracle side by side, checking every result,
/// the invariants and `len` after each op, and the iteration at the end.
fn run_against_oracle(
    ds: usize,
    max_entries: u32,
    ops: &[Op],
) -> std::result::Result<(), TestCaseError> {
    let trie = KernelLpmTrie::new(ds, 2, max_entries).unwrap();
    let mut model = BruteForce::default();
    let max = 8 * ds as u32;
    let guard = pin();

    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Update { addr, plen, flags } => {
                let (data, plen) = (&addr.bytes(ds)[..], fit(plen, max));
                let exists = model.exact(data, plen).is_some();
                let want = match (exists, flags) {
                    (true, BPF_NOEXIST) => Err(Error::Exists),
                    (false, BPF_EXIST) => Err(Error::NotFound),
                    (false, _) if model.entries.len() == max_entries as usize => Err(Error::Full),
                    _ => Ok(()),
                };
                let value = (i as u16).to_ne_bytes();
                let got = if i % 2 == 0 {
                    trie.update(&encode_key(plen, data), &value, flags)
                } else {
                    trie.insert_data(data, plen, &value, flags)
                };
                prop_assert_eq!(&got, &want, "update {:?}/{}", data, plen);
                if want.is_ok() {
                    model.insert(data, plen, &value);
                }
            }
            Op::Delete { addr, plen } => {
                let (data, plen) = (&addr.bytes(ds)[..], fit(plen, max));
                let want = if model.remove(data, plen) {
                    Ok(())
                } else {
                    Err(Error::NotFound)
                };
                let got = if i % 2 == 0 {
                    trie.delete(&encode_key(plen, data))
                } else {
                    trie.remove_data(data, plen)
                };
                prop_assert_eq!(got, want, "delete {:?}/{}", data, plen);
            }
            Op::Lookup { addr, plen } => {
                let (data, plen) = (&addr.bytes(ds)[..], fit(plen, max));
                let want = model.longest_match(data, plen).map(|e| e.2.clone());
                let mut value = [0u8; 2];
                let got = trie
                    .lookup(&encode_key(plen, data), &mut value)
                    .ok()
                    .map(|()| value.to_vec());
                prop_assert_eq!(&got, &want, "lookup {:?}/{}", data, plen);
                let borrowed = trie.lookup_prefix(data, plen, &guard).map(<[u8]>::to_vec);
                prop_assert_eq!(&borrowed, &want);
                let full = model.longest_match(data, max).map(|e| e.2.clone());
                prop_assert_eq!(trie.lookup_data(data, &guard).map(<[u8]>::to_vec), full);
            }
        }
        trie.check_invariants();
        prop_assert_eq!(trie.len(), model.entries.len());
    }

    // Iteration: every stored prefix once, more specific before the
    // prefixes containing it, disjoint ones in address order.
    let keys: Vec<(u32, Vec<u8>)> = keys_in_order(&trie)
        .iter()
        .map(|k| {
            let (plen, mut data) = split(k);
            mask_host_bits(&mut data, plen);
            (plen, data)
        })
        .collect();
    let mut got: Vec<_> = keys.clone();
    let mut want: Vec<_> = model.entries.iter().map(|e| (e.1, e.0.clone())).collect();
    got.sort();
    want.sort();
    prop_assert_eq!(got, want);
    for (i, (pi, di)) in keys.iter().enumerate() {
        for (pj, dj) in &keys[i + 1..] {
            let i_contains_j = pi < pj && prefix_contains(di, *pi, dj);
            prop_assert!(!i_contains_j, "{:?}/{} before {:?}/{}", di, pi, dj, pj);
            if !prefix_contains(dj, *pj, di) && !i_contains_j {
                prop_assert!(di < dj, "disjoint {:?}/{} before {:?}/{}", di, pi, dj, pj);
            }
        }
    }
    // A key that is not stored restarts from the first.
    if let Some(first) = keys.first() {
        let mut next = vec![0u8; 4 + ds];
        let absent = (0..=max).find(|&p| model.exact(&vec![0xa5; ds], p).is_none());
        if let Some(p) = absent {
            trie.get_next_key(Some(&encode_key(p, &vec![0xa5; ds])), &mut next)
                .unwrap();
            let (plen, mut data) = split(&next);
            mask_host_bits(&mut data, plen);
            prop_assert_eq!(&(plen, data), first);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::scaled(160, 2) as u32))]

    /// Random updates (every flag), deletes that uncover shorter prefixes,
    /// re-inserts, /0 and host routes, at data sizes 1, 3, 4, 6 and 16, with
    /// a roomy map and a tiny one that fills up.
    #[test]
    fn matches_brute_force_oracle(
        ds in prop::sample::select(vec![1usize, 3, 4, 6, 16]),
        tiny in any::<bool>(),
        ops in prop::collection::vec(op(), 1..crate::scaled(120, 40)),
    ) {
        run_against_oracle(ds, if tiny { 5 } else { 1024 }, &ops)?;
    }
}

// ---------------------------------------------------------------------------
// Concurrency.
// ---------------------------------------------------------------------------

/// The value stored for a prefix names it: prefixlen and masked address.
fn prefix_value(plen: u32, data: [u8; 4]) -> u64 {
    let mut masked = data;
    mask_host_bits(&mut masked, plen);
    (u64::from(plen) << 32) | u64::from(u32::from_be_bytes(masked))
}

/// Two readers look up addresses while a writer inserts and deletes
/// prefixes around them. Readers must only see values stored for a prefix
/// that contains the address and is no longer than the lookup's limit, and
/// must never miss the anchor prefixes that are never deleted.
#[test]
fn readers_see_only_stored_values_while_a_writer_churns() {
    let trie = KernelLpmTrie::new(4, 8, 1024).unwrap();
    let bases = [
        "10.1.2.3",
        "10.1.130.7",
        "10.200.2.3",
        "192.168.1.1",
        "192.168.255.254",
    ]
    .map(v4);
    let plens = [0, 1, 7, 8, 9, 12, 16, 17, 23, 24, 25, 31, 32];
    let anchors = [(8, v4("10.0.0.0")), (16, v4("192.168.0.0"))];

    let mut universe: Vec<(u32, [u8; 4])> = Vec::new();
    for base in bases {
        for plen in plens {
            if !universe
                .iter()
                .any(|&(p, d)| prefix_value(p, d) == prefix_value(plen, base))
            {
                universe.push((plen, base)); // host bits kept: stored as given
            }
        }
    }
    let known: Vec<u64> = universe.iter().map(|&(p, d)| prefix_value(p, d)).collect();
    let churn: Vec<(u32, [u8; 4])> = universe
        .iter()
        .copied()
        .filter(|&(p, d)| {
            !anchors
                .iter()
                .any(|&(ap, ad)| prefix_value(ap, ad) == prefix_value(p, d))
        })
        .collect();
    for (plen, data) in anchors {
        trie.insert_data(
            &data,
            plen,
            &prefix_value(plen, data).to_ne_bytes(),
            BPF_NOEXIST,
        )
        .unwrap();
    }

    let done = AtomicBool::new(false);
    let lookups = AtomicUsize::new(0);
    let started = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for r in 0..2u64 {
            let (trie, done, lookups, known, started) = (&trie, &done, &lookups, &known, &started);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(r);
                let mut n = 0;
                started.fetch_add(1, Ordering::Relaxed);
                while !done.load(Ordering::Relaxed) {
                    crate::reader_pause();
                    let guard = pin();
                    for _ in 0..64 {
                        let base = bases[rng.random_range(0..bases.len())];
                        let noise = rng.random::<u32>() >> rng.random_range(0..32);
                        let addr = (u32::from_be_bytes(base) ^ noise).to_be_bytes();
                        let limit = [32, 32, 24, 16, 9][rng.random_range(0..5)];
                        let anchor = anchors
                            .iter()
                            .filter(|&&(p, d)| p <= limit && prefix_contains(&d, p, &addr))
                            .map(|&(p, _)| p)
                            .max();
                        match trie.lookup_prefix(&addr, limit, &guard) {
                            Some(v) => {
                                let v = u64::from_ne_bytes(v.try_into().unwrap());
                                let (plen, data) = ((v >> 32) as u32, (v as u32).to_be_bytes());
                                assert!(known.contains(&v), "never stored: {v:#x}");
                                assert!(plen <= limit);
                                assert!(prefix_contains(&data, plen, &addr));
                                assert!(anchor.is_none_or(|a| plen >= a), "missed an anchor");
                            }
                            None => assert_eq!(anchor, None, "missed an anchor"),
                        }
                        n += 1;
                    }
                    // Now and then a bounded walk with get_next_key: every
                    // key returned was stored at some point.
                    if n % 1024 == 0 {
                        let mut next = [0u8; 8];
                        let mut prev: Option<[u8; 8]> = None;
                        for _ in 0..2 * known.len() {
                            if trie
                                .get_next_key(prev.as_ref().map(|k| &k[..]), &mut next)
                                .is_err()
                            {
                                break;
                            }
                            let (plen, data) = split(&next);
                            assert!(known.contains(&prefix_value(plen, data.try_into().unwrap())));
                            prev = Some(next);
                        }
                    }
                }
                lookups.fetch_add(n, Ordering::Relaxed);
            });
        }

        // Stops the readers even if the writer panics.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stop = StopOnDrop(&done);
        // Readers must be running before the writer starts, or a fast
        // writer could finish before any read overlaps it.
        while started.load(Ordering::Relaxed) < 2 {
            std::thread::yield_now();
        }
        let mut rng = StdRng::seed_from_u64(99);
        let mut present = vec![false; churn.len()];
        for _ in 0..crate::scaled(20_000, 120) {
            let i = rng.random_range(0..churn.len());
            let (plen, data) = churn[i];
            if rng.random_bool(0.5) {
                trie.insert_data(
                    &data,
                    plen,
                    &prefix_value(plen, data).to_ne_bytes(),
                    BPF_ANY,
                )
                .unwrap();
                present[i] = true;
            } else {
                let r = trie.remove_data(&data, plen);
                assert_eq!(r.is_ok(), present[i]);
                present[i] = false;
            }
        }
        drop(stop);
        trie.check_invariants();
        assert_eq!(
            trie.len(),
            anchors.len() + present.iter().filter(|&&p| p).count()
        );
    });
    assert!(lookups.load(Ordering::Relaxed) > 0);
}

/// Dropping a large trie frees it node by node (`trie_free`).
#[test]
fn dropping_a_large_trie() {
    let mut rng = StdRng::seed_from_u64(7);
    let trie = KernelLpmTrie::new(16, 8, 20_000).unwrap();
    for _ in 0..crate::scaled(20_000, 100) {
        let data: [u8; 16] = rng.random();
        let plen = rng.random_range(0..=128);
        trie.insert_data(&data, plen, &[0; 8], BPF_ANY).unwrap();
    }
    assert!(trie.memory_usage() > 0);
    drop(trie);
}
