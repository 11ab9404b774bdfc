//! The suite over every registered family, and over planted bugs it must
//! catch (so that none of its checks is one that cannot fail).

use super::toy::{Bug, Buggy};
use super::*;
use crate::registry::FAMILIES;

#[test]
fn every_registered_family_keeps_the_contract() {
    for family in FAMILIES {
        if let Err(e) = check_family(family) {
            panic!("{e}");
        }
    }
}

#[test]
fn the_toy_family_is_registered_by_its_table_line() {
    let map = crate::create(&MapSpec::new(crate::MapType::TOY, 4, 4, 4)).unwrap();
    assert_eq!(map.map_type().name(), Some("toy"));
}

/// Each planted bug is caught, by the check meant for it.
#[test]
fn planted_bugs_are_caught() {
    for (bug, says) in [
        (Bug::ModifiesBeforeEinval, "contents after update with"),
        (Bug::AcceptsUnknownFlags, "update with flags"),
        (Bug::EndlessIteration, "get_next_key"),
    ] {
        let family = Buggy::family(bug);
        let err = check_family(&family).expect_err(&format!("{bug:?} went unnoticed"));
        assert!(
            err.0.contains(says),
            "{bug:?} was caught by another check: {err}"
        );
    }
}

/// The differential run alone catches a wrong answer (a toy whose
/// `BPF_EXIST` conflicts are taken as success would pass the bad-input
/// checks only by luck; here the model sees it).
#[test]
fn the_differential_run_compares_answers() {
    let family = Buggy::family(Bug::AcceptsUnknownFlags);
    let err = (0..4)
        .map(|seed| differential(&family, seed, 300))
        .find_map(Result::err)
        .expect("a run with unknown flags");
    assert!(err.0.contains("Update"), "{err}");
}

#[test]
fn ops_decode_from_any_bytes() {
    let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let mut rest = &bytes[..];
    let mut n = 0;
    while Op::decode(&mut rest).is_some() {
        n += 1;
    }
    assert!(n > 50 && rest.len() < 8);
}

mod never_panics {
    use proptest::prelude::*;

    use crate::registry::FAMILIES;
    use crate::{BPF_ANY, MapSpec};

    #[derive(Debug, Clone)]
    enum Call {
        Lookup(usize, usize),
        Update(usize, usize, u64),
        Delete(usize),
        LookupAndDelete(usize, usize),
        NextKey(Option<usize>, usize),
        Push(usize, u64),
        Peek(usize),
        Batch(usize, usize),
    }

    fn call() -> impl Strategy<Value = Call> {
        let size = prop_oneof![0usize..12, 250usize..262];
        prop_oneof![
            (size.clone(), size.clone()).prop_map(|(k, v)| Call::Lookup(k, v)),
            (
                size.clone(),
                size.clone(),
                prop_oneof![0u64..4, Just(1 << 10), Just(u64::MAX)]
            )
                .prop_map(|(k, v, f)| Call::Update(k, v, f)),
            size.clone().prop_map(Call::Delete),
            (size.clone(), size.clone()).prop_map(|(k, v)| Call::LookupAndDelete(k, v)),
            (prop::option::of(size.clone()), size.clone()).prop_map(|(k, n)| Call::NextKey(k, n)),
            (size.clone(), 0u64..3).prop_map(|(v, f)| Call::Push(v, f)),
            size.clone().prop_map(Call::Peek),
            (0usize..40, 0usize..80).prop_map(|(k, v)| Call::Batch(k, v)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::scaled(1000, 8) as u32))]

        /// Any spec of any registered family, and any calls with buffers
        /// of any size: errors, never a panic, and a length within the
        /// capacity for every map but the bloom filter (which counts
        /// pushes).
        #[test]
        fn any_spec_and_any_calls_never_panic(
            family in 0..FAMILIES.len(),
            key_size in prop_oneof![Just(0u32), Just(4), Just(8), 0u32..10, 250u32..262],
            value_size in prop_oneof![Just(8u32), Just(16), 0u32..12, 1016u32..1020],
            max_entries in 0u32..40,
            flags in prop_oneof![3 => Just(0u32), 1 => Just(1), 1 => Just(64), 1 => 0u32..2048],
            extra in prop_oneof![3 => Just(0u64), 1 => 0u64..40],
            calls in prop::collection::vec(call(), 0..60),
        ) {
            let spec = MapSpec { map_type: FAMILIES[family].map_type, key_size, value_size, max_entries, flags, extra, hash: None };
            let Ok(map) = crate::create(&spec) else { return Ok(()) };
            let bytes = |n: usize, seed: usize| -> Vec<u8> { (0..n).map(|i| (i * 31 + seed) as u8).collect() };
            for (i, c) in calls.into_iter().enumerate() {
                let _ = match c {
                    Call::Lookup(k, v) => map.lookup(&bytes(k, i), &mut bytes(v, 0)),
                    Call::Update(k, v, f) => map.update(&bytes(k, i % 7), &bytes(v, i), f),
                    Call::Delete(k) => map.delete(&bytes(k, i % 7)),
                    Call::LookupAndDelete(k, v) => map.lookup_and_delete(&bytes(k, i % 7), &mut bytes(v, 0)),
                    Call::NextKey(k, n) => map.get_next_key(k.map(|k| bytes(k, i % 7)).as_deref(), &mut bytes(n, 0)).map(drop),
                    Call::Push(v, f) => map.push(&bytes(v, i), f),
                    Call::Peek(v) => map.peek(&mut bytes(v, i)),
                    Call::Batch(k, v) => {
                        let _ = map.lookup_batch(None, &mut bytes(k, 0), &mut bytes(v, 0));
                        let _ = map.update_batch(&bytes(k, i), &bytes(v, i), BPF_ANY);
                        let _ = map.lookup_and_delete_batch(&mut bytes(k, 0), &mut bytes(v, 0));
                        map.delete_batch(&bytes(k, i)).map(drop).map_err(|e| e.error)
                    }
                };
                if !map.caps().contains(crate::Caps::PUSH_PEEK) {
                    prop_assert!(map.len() <= map.max_entries() as usize);
                }
            }
            let _ = map.memory_usage();
        }
    }
}
