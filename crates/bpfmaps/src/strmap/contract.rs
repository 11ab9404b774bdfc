//! The string maps' byte contract: their family entries and
//! `bpf_map_ops`. Keys are 1 to `key_size` bytes, the slice's length being
//! the key's (the kernel qp-trie patch passed them as dynptrs; the TST
//! patch took NUL-terminated strings, see [`TstMap`]); batches lay each
//! key out as its length and the key, zero-padded ([`crate::BatchKeys`]).

use super::qptrie::{MAX_KEY_SIZE, QpTrieMap};
use super::tst::TstMap;
use crate::core::contract::{
    BATCH_PIN_CHUNK, BatchError, BatchKeys, Caps, MapInfo, MapOps, MapType,
};
use crate::core::error::{Error, Result};
use crate::core::family::{Family, KeyKind, SizeRule};
use crate::core::flags::{BPF_F_NO_PREALLOC, UpdateFlag};
use crate::core::reclaim::{Guard, pin};

impl MapType {
    /// The qp-trie string map (not in the kernel: a private number).
    pub const QP_TRIE: MapType = MapType(MapType::PRIVATE + 1);
    /// The ternary search tree string map (the 2022 `BPF_MAP_TYPE_TST`
    /// patch was never merged: a private number).
    pub const TST: MapType = MapType(MapType::PRIVATE + 2);
}

/// A string map's family entry and its `bpf_map_ops`: both maps have the
/// API the contract needs (`new`, `get`, `insert`, `remove`,
/// `with_next_key`, `len`, `memory_usage`), so one definition serves them.
macro_rules! string_map_family {
    ($(#[$doc:meta])* $family:ident: $map:ident, $map_type:expr, $name:literal,
     extra: $extra:expr, sample: $sample:expr) => {
        $(#[$doc])*
        pub const $family: Family = Family {
            map_type: $map_type,
            name: $name,
            map_flags: BPF_F_NO_PREALLOC,
            map_extra: $extra,
            key_size: SizeRule::between(1, MAX_KEY_SIZE as u32),
            value_size: SizeRule::between(1, u16::MAX as u32),
            keys: KeyKind::Bytes,
            sample_layout: $sample,
            build: |spec| {
                let mut map = $map::new(
                    spec.key_size as usize,
                    spec.value_size as usize,
                    spec.max_entries,
                )?
                .with_map_extra(spec.extra)?;
                map.map_flags = spec.flags;
                Ok(Box::new(map))
            },
        };

        impl MapOps for $map {
            const CAPS: Caps = Caps::LOOKUP
                .union(Caps::UPDATE)
                .union(Caps::DELETE)
                .union(Caps::LOOKUP_AND_DELETE)
                .union(Caps::NEXT_KEY)
                .union(Caps::BATCH)
                .union(Caps::VAR_KEYS);

            fn map_info(&self) -> MapInfo {
                MapInfo {
                    map_type: $map_type,
                    key_size: self.max_key_size() as u32,
                    value_size: self.value_size() as u32,
                    max_entries: self.max_entries(),
                    map_flags: self.map_flags,
                    map_extra: self.map_extra(),
                }
            }

            fn map_len(&self) -> usize {
                self.len()
            }

            fn map_mem_usage(&self) -> usize {
                self.memory_usage()
            }

            fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
                value.copy_from_slice(self.get(key, guard).ok_or(Error::NotFound)?);
                Ok(())
            }

            fn map_update_elem(
                &self,
                key: &[u8],
                value: &[u8],
                flag: UpdateFlag,
                _: &Guard,
            ) -> Result<()> {
                self.insert(key, value, flag.bits())
            }

            fn map_delete_elem(&self, key: &[u8], _: &Guard) -> Result<()> {
                self.remove(key, None)
            }

            fn map_lookup_and_delete_elem(
                &self,
                key: &[u8],
                value: &mut [u8],
                _: &Guard,
            ) -> Result<()> {
                self.remove(key, Some(value))
            }

            /// Straight from the tree in order: up to `BATCH_PIN_CHUNK` (64)
            /// keys a walk under one guard, each walk going on after the
            /// last key copied, rather than a seek from the root for every
            /// key (the generic walk's `get_next_key`). A missing `after`
            /// goes on from the first stored key after it, as there.
            fn map_lookup_batch(
                &self,
                after: Option<&[u8]>,
                keys: &mut [u8],
                values: &mut [u8],
                room: usize,
            ) -> Result<usize, BatchError> {
                use ::std::ops::{Bound, ControlFlow};
                let layout = BatchKeys::of(self);
                let vs = self.map_info().value_size as usize;
                let mut last = after.map(<[u8]>::to_vec);
                let mut copied = 0;
                while copied < room {
                    let guard = pin();
                    let (before, mut failed) = (copied, None);
                    let lower = last.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                    self.for_each_in((lower, Bound::Unbounded), &guard, |k, v| {
                        let put = layout.put(keys, copied, |slot| {
                            slot[..k.len()].copy_from_slice(k);
                            Ok(k.len())
                        });
                        if let Err(e) = put {
                            failed = Some(e);
                            return ControlFlow::Break(());
                        }
                        values[copied * vs..][..vs].copy_from_slice(v);
                        copied += 1;
                        if copied == room || copied - before == BATCH_PIN_CHUNK {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        }
                    });
                    if let Some(error) = failed {
                        return Err(BatchError { processed: copied, error });
                    }
                    if copied == before {
                        break; // past the last key
                    }
                    let key = layout.key(keys, copied - 1).map_err(|error| BatchError {
                        processed: copied,
                        error,
                    })?;
                    last = Some(key.to_vec());
                }
                Ok(copied)
            }

            /// Byte order, a key before its extensions. A key that is not
            /// stored gives the first stored key after it (the qp-trie
            /// patch restarted from the first key; the TST patch had no
            /// `get_next_key`), so a walk survives deletes of its cursor.
            fn map_get_next_key(
                &self,
                key: Option<&[u8]>,
                next: &mut [u8],
                guard: &Guard,
            ) -> Result<usize> {
                let mut len = 0;
                self.with_next_key(key, guard, |k| {
                    next[..k.len()].copy_from_slice(k);
                    len = k.len();
                })?;
                Ok(len)
            }
        }
    };
}

string_map_family! {
    /// The qp-trie map, for the registry: keys of 1 to `key_size` bytes
    /// (`key_size` up to 4096), flags 0 or `BPF_F_NO_PREALLOC` (nodes are
    /// always allocated as keys come; the flag changes nothing).
    /// `map_extra` sizes its buckets ([`QpTrieMap::with_buckets`]): 0 for
    /// the defaults, else bits 0-7 the most keys in a bucket (below 2: no
    /// buckets) and bits 8-23 the most bytes of their records. The
    /// contract tests and the fuzz target use buckets of 3 keys and 40
    /// bytes, so that their few keys fill, burst and empty buckets.
    QP_TRIE_FAMILY: QpTrieMap, MapType::QP_TRIE, "qp_trie",
    extra: QP_TRIE_BUCKET_EXTRA_BITS, sample: Some((8, 3 | 40 << 8))
}

/// The bits of `map_extra` a qp-trie map reads: a bucket's most keys (bits
/// 0-7) and most bytes of records (bits 8-23).
pub const QP_TRIE_BUCKET_EXTRA_BITS: u64 = 0xff_ffff;

string_map_family! {
    /// The ternary search tree map, for the registry: keys of 1 to
    /// `key_size` bytes (`key_size` up to 4096), flags 0 or
    /// `BPF_F_NO_PREALLOC` (the patch required the flag; nodes are always
    /// allocated as keys come, so here it changes nothing).
    TST_FAMILY: TstMap, MapType::TST, "tst",
    extra: 0, sample: None
}

/// The conformance suite runs over this family with every other
/// (`conformance::tests`); here, what is particular to variable keys.
#[cfg(test)]
mod tests {
    use crate::core::contract::{BatchKeys, MapSpec, MapType};
    use crate::{BPF_ANY, Error};

    /// Batches of keys of every length, `ab` beside `ab\0`: in order, in
    /// pages, and a bad length stopping a batch where it stands.
    #[test]
    fn batches_of_variable_length_keys() {
        let map = crate::create(&MapSpec::new(MapType::QP_TRIE, 4, 1, 16)).unwrap();
        let layout = BatchKeys::of(&*map);
        assert_eq!(layout.stride(), 8);
        let keys: [&[u8]; 5] = [b"ab\0", b"b", b"ab", b"abcd", b"\xff"];
        let slots = layout.encode(&keys).unwrap();
        assert_eq!(
            &slots[..8],
            &[&3u32.to_ne_bytes()[..], b"ab\0\0"].concat()[..]
        );
        assert_eq!(map.update_batch(&slots, &[1, 2, 3, 4, 5], BPF_ANY), Ok(5));
        let mut walked = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let (mut keys, mut values) = (vec![0; 2 * 8], vec![0; 2]);
            let n = map
                .lookup_batch(after.as_deref(), &mut keys, &mut values)
                .unwrap();
            for (i, &value) in values.iter().enumerate().take(n) {
                walked.push((layout.key(&keys, i).unwrap().to_vec(), value));
            }
            if n < 2 {
                break;
            }
            after = Some(layout.key(&keys, 1).unwrap().to_vec());
        }
        let want: Vec<(Vec<u8>, u8)> = vec![
            (b"ab".to_vec(), 3),
            (b"ab\0".to_vec(), 1),
            (b"abcd".to_vec(), 4),
            (b"b".to_vec(), 2),
            (b"\xff".to_vec(), 5),
        ];
        assert_eq!(walked, want);
        // A slot whose length is 0 or past key_size stops the batch there.
        for bad in [0u32, 5] {
            let mut slots = layout.encode(&[b"zz", b"zy"]).unwrap();
            slots[8..12].copy_from_slice(&bad.to_ne_bytes());
            let err = map.update_batch(&slots, &[7, 7], BPF_ANY).unwrap_err();
            assert_eq!(
                (err.processed, matches!(err.error, Error::Invalid(_))),
                (1, true)
            );
            let err = map.delete_batch(&slots).unwrap_err();
            assert_eq!(
                (err.processed, matches!(err.error, Error::Invalid(_))),
                (1, true)
            );
        }
        assert!(layout.encode(&[b"abcde"]).is_err());
        // A fixed-size layout takes only keys of exactly key_size bytes.
        let hash = crate::create(&MapSpec::new(MapType::HASH, 4, 1, 4)).unwrap();
        let fixed = BatchKeys::of(&*hash);
        assert_eq!(fixed.encode(&[b"abcd"]).unwrap(), b"abcd");
        assert!(fixed.encode(&[b"abc"]).is_err() && fixed.encode(&[b"abcde"]).is_err());
        let (mut keys, mut values) = (vec![0; 16 * 8], vec![0; 16]);
        assert_eq!(map.lookup_and_delete_batch(&mut keys, &mut values), Ok(5));
        assert_eq!(layout.key(&keys, 1).unwrap(), b"ab\0");
        assert_eq!(map.len(), 0);
    }

    /// The string maps' own `lookup_batch` (walks of the tree) gives what
    /// the generic walk (`get_next_key` and `lookup`, key by key) gives:
    /// the same entries in the same order, from the start, from a stored
    /// key and from one not stored, in batches smaller and larger than a
    /// walk's [`BATCH_PIN_CHUNK`](crate::core::contract::BATCH_PIN_CHUNK).
    #[test]
    fn lookup_batch_matches_the_generic_walk() {
        use super::{QpTrieMap, TstMap};
        use crate::core::contract::{Map, MapOps, lookup_each};
        let n = if cfg!(miri) { 24 } else { 600 };
        // Keys sharing prefixes, a key beside its extensions (`k1`, `k1\0`,
        // `k10`), lengths 1 to 12.
        let stored: Vec<Vec<u8>> = (0..n)
            .map(|i: u32| match i % 4 {
                0 => format!("k{i}").into_bytes(),
                1 => format!("k{}\0", i - 1).into_bytes(),
                2 => i.wrapping_mul(2_654_435_761).to_be_bytes()[..1 + i as usize % 4].to_vec(),
                _ => format!("sym_{i:x}_x").into_bytes(),
            })
            .collect();
        let qp = QpTrieMap::new(12, 4, 1000)
            .unwrap()
            .with_map_extra(3 | 40 << 8)
            .unwrap();
        let tst = TstMap::new(12, 4, 1000).unwrap();
        for (i, k) in stored.iter().enumerate() {
            let v = (i as u32).to_ne_bytes();
            qp.update(k, &v, BPF_ANY).unwrap();
            tst.update(k, &v, BPF_ANY).unwrap();
        }
        /// One read of a batch: `(after, keys, values)` to how many.
        type Read<'a> = &'a dyn Fn(Option<&[u8]>, &mut [u8], &mut [u8]) -> usize;
        /// The whole walk from `after` in batches of `room`.
        fn batches(room: usize, after: Option<&[u8]>, read: Read<'_>) -> Vec<(Vec<u8>, u32)> {
            let layout = BatchKeys::of(&TstMap::new(12, 4, 1).unwrap());
            let (mut walked, mut after) = (Vec::new(), after.map(<[u8]>::to_vec));
            loop {
                let mut keys = vec![0; room * layout.stride()];
                let mut values = vec![0; room * 4];
                let got = read(after.as_deref(), &mut keys, &mut values);
                for (i, v) in values.chunks(4).enumerate().take(got) {
                    let key = layout.key(&keys, i).unwrap().to_vec();
                    walked.push((key, u32::from_ne_bytes(v.try_into().unwrap())));
                }
                if got < room {
                    return walked;
                }
                after = Some(walked.last().unwrap().0.clone());
            }
        }
        fn agree<T: MapOps>(map: &T, room: usize, after: Option<&[u8]>) -> usize {
            let ours = batches(room, after, &|a, k, v| map.lookup_batch(a, k, v).unwrap());
            let generic = batches(room, after, &|a, k, v| {
                lookup_each(map, a, k, v, room).unwrap()
            });
            assert_eq!(ours, generic, "room {room}, after {after:?}");
            ours.len()
        }
        // Under Miri, one room: several batches of the few keys.
        let rooms: &[usize] = if cfg!(miri) {
            &[7]
        } else {
            &[1, 3, 64, 65, 200, 1000]
        };
        for &room in rooms {
            for after in [
                None,
                Some(&b"k17"[..]),
                Some(&b"k17\x01"[..]),
                Some(&b"\xff\xff"[..]),
            ] {
                agree(&qp, room, after);
                agree(&tst, room, after);
            }
            assert_eq!(agree(&qp, room, None), n as usize);
        }
    }

    #[test]
    fn keys_of_every_length_through_the_contract() {
        let map = crate::create(&MapSpec::new(MapType::QP_TRIE, 8, 4, 16)).unwrap();
        for len in 1..=8 {
            map.update(&b"abcdefgh"[..len], &(len as u32).to_ne_bytes(), 0)
                .unwrap();
        }
        let mut next = [0u8; 8];
        let n = map.get_next_key(Some(b"abc"), &mut next).unwrap();
        assert_eq!(&next[..n], b"abcd");
        let mut value = [0u8; 4];
        map.lookup(b"abcdef", &mut value).unwrap();
        assert_eq!(u32::from_ne_bytes(value), 6);
        assert!(map.lookup(b"", &mut value).is_err());
        assert!(map.lookup(b"abcdefghi", &mut value).is_err());
    }

    #[test]
    fn the_tst_through_the_contract() {
        let map = crate::create(&MapSpec::new(MapType::TST, 8, 4, 16)).unwrap();
        assert_eq!(map.map_type().name(), Some("tst"));
        let qp = crate::create(&MapSpec::new(MapType::QP_TRIE, 8, 4, 16)).unwrap();
        assert_eq!(map.caps(), qp.caps());
        for len in (1..=8).rev() {
            map.update(&b"abcdefgh"[..len], &(len as u32).to_ne_bytes(), 0)
                .unwrap();
        }
        let mut next = [0u8; 8];
        let n = map.get_next_key(Some(b"abc"), &mut next).unwrap();
        assert_eq!(&next[..n], b"abcd");
        map.delete(b"abcd").unwrap();
        let n = map.get_next_key(Some(b"abcd"), &mut next).unwrap();
        assert_eq!(&next[..n], b"abcde");
        let mut value = [0u8; 4];
        map.lookup_and_delete(b"abcdef", &mut value).unwrap();
        assert_eq!((u32::from_ne_bytes(value), map.len()), (6, 6));
        assert!(map.lookup(b"", &mut value).is_err());
        assert!(map.lookup(b"abcdefghi", &mut value).is_err());
    }
}
