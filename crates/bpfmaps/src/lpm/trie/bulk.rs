//! Bulk loading: a build from many prefixes at once makes each node's
//! blocks once, from the prefixes sorted, instead of copying a node per
//! insert; the new tree replaces the old one with one store per root
//! pointer, and the old one is freed after a grace period, as `clear`
//! frees it.
//!
//! The shape is the one inserts give, or tighter: a node at depth 1 or 2
//! wherever something lies below it; deeper, an edge skips (up to
//! `Skip::MAX` bytes) every level where the prefixes below store nothing
//! and do not diverge. (Inserts can leave a node that such an edge would
//! skip: one placed before a later prefix split the edge above it.)

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::LpmTrie;
use super::write::ClearJob;
use crate::core::error::{Error, Result, check_len};
use crate::core::reclaim::{drop_in_background, pin};
use crate::lpm::bits::Bits;
use crate::lpm::key::mask_host_bits;
use crate::lpm::node::{ChildBlock, DataBlock, Entry, Leaf, Prefixes, Skip, prefix_index};

/// Prefixes sorted by (data, length), one per prefix, with payloads.
struct Sorted {
    data_size: usize,
    /// `data_size` bytes per prefix, host bits clear.
    keys: Vec<u8>,
    lens: Vec<u32>,
    payloads: Vec<[u8; 4]>,
}

impl Sorted {
    fn key(&self, i: usize) -> &[u8] {
        &self.keys[i * self.data_size..(i + 1) * self.data_size]
    }
}

impl LpmTrie {
    /// Stores every `(data, prefixlen, value)` as `insert` with `BPF_ANY`
    /// would, the last of equal prefixes winning, but builds each node
    /// once: for loading a table, or a large batch into one. Checks every
    /// entry first: on an error (a bad size or length, `E2BIG` past
    /// `max_entries`, `EBUSY` for a route slot) the trie is unchanged.
    ///
    /// ```
    /// use bpfmaps::lpm::LpmTrie;
    ///
    /// let trie = LpmTrie::new(4, 4, 100).unwrap();
    /// let routes = [([10, 0, 0, 0], 8, 1u32), ([10, 1, 0, 0], 16, 2)];
    /// trie.extend(routes.iter().map(|(d, l, v)| (&d[..], *l, v.to_ne_bytes()))).unwrap();
    /// let guard = bpfmaps::pin();
    /// assert_eq!(trie.get_as::<u32>(&[10, 1, 2, 3], &guard), Some(2));
    /// assert_eq!(trie.get_as::<u32>(&[10, 2, 2, 3], &guard), Some(1));
    /// ```
    pub fn extend<D: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        entries: impl IntoIterator<Item = (D, u32, V)>,
    ) -> Result<()> {
        let ds = self.data_size;
        // New entries: masked keys, lengths and values, in order.
        let entries = entries.into_iter();
        let hint = entries.size_hint().0;
        let mut keys = Vec::with_capacity(hint * ds);
        let mut lens = Vec::with_capacity(hint);
        let mut values = Vec::with_capacity(hint * self.value_size);
        for (data, prefixlen, value) in entries {
            let (data, value) = (data.as_ref(), value.as_ref());
            check_len("value", value.len(), self.value_size)?;
            if data.len() != ds || prefixlen as usize > 8 * ds {
                // The same checks and messages as a single insert's.
                self.masked(data, prefixlen)?;
            }
            let at = keys.len();
            keys.extend_from_slice(data);
            mask_host_bits(&mut keys[at..], prefixlen);
            lens.push(prefixlen);
            values.extend_from_slice(value);
        }
        let guard = &pin();
        let mut alloc = self.writer.lock();
        // The stored prefixes come first, so that a new one wins a tie.
        let mut old_payloads = Vec::new();
        let (mut all_keys, mut all_lens) = (Vec::new(), Vec::new());
        self.for_each_payload(guard, |d, l, p| {
            all_keys.extend_from_slice(d);
            all_lens.push(l);
            old_payloads.push(p);
        });
        let stored = all_lens.len();
        all_keys.extend_from_slice(&keys);
        all_lens.extend_from_slice(&lens);
        // Entry i: stored ones 0..stored, then the new ones in order.
        let key = |i: usize| (&all_keys[i * ds..(i + 1) * ds], all_lens[i]);
        let order = build_order(&all_keys, &all_lens, ds);
        let mut winners: Vec<u32> = Vec::with_capacity(order.len());
        let mut replaced = Vec::new();
        for &i in &order {
            match winners.last_mut() {
                Some(last) if key(*last as usize) == key(i as usize) => {
                    if (*last as usize) < stored {
                        replaced.push(old_payloads[*last as usize]);
                    }
                    *last = i;
                }
                _ => winners.push(i),
            }
        }
        if winners.len() > self.max_entries as usize {
            return Err(Error::Full);
        }
        // Payloads: the stored ones kept, a slot (or the bytes) per new one.
        let mut payloads = Vec::with_capacity(winners.len());
        for &i in &winners {
            let i = i as usize;
            if i < stored {
                payloads.push(old_payloads[i]);
                continue;
            }
            let v = (i - stored) * self.value_size;
            match self.payload_of(&mut alloc, &values[v..v + self.value_size]) {
                Ok(p) => payloads.push(p),
                Err(e) => {
                    // Never published: the new slots can go back now.
                    for (&w, &p) in winners.iter().zip(&payloads) {
                        if w as usize >= stored {
                            self.unused_payload(p);
                        }
                    }
                    return Err(e);
                }
            }
        }
        // Loading a sorted table without duplicates, the usual case, the
        // keys are already in place.
        let in_place = winners.iter().enumerate().all(|(at, &i)| at == i as usize);
        let sorted = if in_place {
            Sorted {
                data_size: ds,
                keys: all_keys,
                lens: all_lens,
                payloads,
            }
        } else {
            let mut keys = Vec::with_capacity(winners.len() * ds);
            let mut lens = Vec::with_capacity(winners.len());
            for &i in &winners {
                let (k, l) = key(i as usize);
                keys.extend_from_slice(k);
                lens.push(l);
            }
            Sorted {
                data_size: ds,
                keys,
                lens,
                payloads,
            }
        };
        let (children, data) = self.build_node(&sorted, 0..winners.len(), 0, Leaf::NONE);
        let job = ClearJob {
            arena: Arc::clone(&self.arena),
            children: self.root.children.swap(children, Ordering::AcqRel),
            data: self.root.data.swap(data, Ordering::AcqRel),
            // The replaced values' slots; the others live on in the new tree.
            routes: if self.inline_values {
                Vec::new()
            } else {
                replaced.iter().map(|&p| u32::from_ne_bytes(p)).collect()
            },
            store: Arc::clone(&self.routes),
        };
        self.len.store(winners.len(), Ordering::Relaxed);
        self.refresh_direct(guard);
        self.maybe_build_direct(guard);
        guard.defer(move || drop_in_background(job));
        Ok(())
    }

    /// A trie built from `entries` at once (see [`extend`](Self::extend)).
    pub fn from_prefixes<D: AsRef<[u8]>, V: AsRef<[u8]>>(
        data_size: usize,
        value_size: usize,
        max_entries: u32,
        entries: impl IntoIterator<Item = (D, u32, V)>,
    ) -> Result<Self> {
        let trie = Self::new(data_size, value_size, max_entries)?;
        trie.extend(entries)?;
        Ok(trie)
    }

    /// Builds the blocks of the node at `depth` that holds the prefixes of
    /// `sorted` in `range` longer than `8 * depth` bits (the others there
    /// belong to the nodes above), inheriting `default`: its own prefixes
    /// (up to `8 * depth + 8` bits) into its data block, the rest into
    /// children, one per next key byte. Returns (child block or null, data
    /// block), unpublished.
    fn build_node(
        &self,
        sorted: &Sorted,
        range: std::ops::Range<usize>,
        depth: usize,
        default: Leaf,
    ) -> (*mut ChildBlock, *mut DataBlock) {
        let (lo, hi) = (8 * depth as u32, 8 * depth as u32 + 8);
        let mut prefixes = Prefixes::new();
        // Per next key byte with something below this node: its entries.
        let mut below: Vec<(u8, std::ops::Range<usize>)> = Vec::new();
        for i in range.clone() {
            let l = sorted.lens[i];
            if depth > 0 && l <= lo {
                continue;
            }
            let key = sorted.key(i);
            if l <= hi {
                let idx = if l == 0 {
                    1
                } else {
                    prefix_index(l - lo, key[depth])
                };
                prefixes.put(idx, sorted.payloads[i]);
            } else {
                match below.last_mut() {
                    Some((b, r)) if *b == key[depth] => r.end = i + 1,
                    _ => below.push((key[depth], i..i + 1)),
                }
            }
        }
        prefixes.bits.fix_ranks();
        let data = DataBlock::build(&self.arena, depth, &prefixes, default);
        if below.is_empty() {
            return (ptr::null_mut(), data.as_ptr());
        }
        // SAFETY: just built, and ours alone.
        let block = unsafe { data.as_ref() };
        let mut bits = Bits::<4>::default();
        let entries: Vec<Entry> = below
            .into_iter()
            .map(|(b, r)| {
                bits.set_raw(b as usize);
                let skip = self.skip_below(sorted, r.clone(), depth + 1);
                let child_depth = depth + 1 + skip.len();
                let (c, d) = self.build_node(sorted, r, child_depth, block.leaf(b));
                (c, d, skip)
            })
            .collect();
        bits.fix_ranks();
        (
            ChildBlock::alloc(&self.arena, bits, &entries).as_ptr(),
            data.as_ptr(),
        )
    }

    /// The bytes the edge to a child at `depth` skips: below depth 3 none
    /// (the direct index mirrors depths 1 and 2); else every level where
    /// the child's prefixes (those in `range` longer than `8 * depth`
    /// bits, all sharing the bytes before `depth`) store nothing and agree
    /// on the key byte, up to `Skip::MAX`.
    fn skip_below(&self, sorted: &Sorted, range: std::ops::Range<usize>, depth: usize) -> Skip {
        if depth < 3 {
            return Skip::NONE;
        }
        let lo = 8 * depth as u32;
        let mut deep = range.filter(|&i| sorted.lens[i] > lo);
        let first = deep.next().expect("a prefix below");
        let key = sorted.key(first);
        let mut k = 0;
        // Level depth + k can be skipped if nothing lives there (every
        // prefix longer than its bits) and every key agrees on its byte.
        while k < Skip::MAX
            && sorted.lens[first] > 8 * (depth + k + 1) as u32
            && deep.clone().all(|i| {
                sorted.lens[i] > 8 * (depth + k + 1) as u32
                    && sorted.key(i)[depth + k] == key[depth + k]
            })
        {
            k += 1;
        }
        Skip::new(&key[depth..depth + k])
    }
}

/// The entries' indices sorted by (key bytes, prefix length), equal ones
/// in input order (so the last of them wins). Keys of up to 16 bytes are
/// sorted as integers (big-endian, so in byte order), the length and the
/// index beside them; longer ones as slices.
fn build_order(keys: &[u8], lens: &[u32], ds: usize) -> Vec<u32> {
    let n = lens.len();
    if ds <= 16 {
        let mut packed: Vec<(u128, u64)> = (0..n)
            .map(|i| {
                let key = keys[i * ds..(i + 1) * ds]
                    .iter()
                    .fold(0u128, |acc, &b| acc << 8 | u128::from(b));
                // Left-aligned, so that keys compare in byte order.
                let key = key << (8 * (16 - ds));
                (key, u64::from(lens[i]) << 32 | i as u64)
            })
            .collect();
        if !packed.is_sorted() {
            packed.sort_unstable();
        }
        return packed.iter().map(|&(_, li)| li as u32).collect();
    }
    let key = |i: u32| {
        (
            &keys[i as usize * ds..(i as usize + 1) * ds],
            lens[i as usize],
        )
    };
    let mut order: Vec<u32> = (0..n as u32).collect();
    if !order.is_sorted_by(|&a, &b| key(a) <= key(b)) {
        // Stable: equal prefixes stay in order.
        order.sort_by(|&a, &b| key(a).cmp(&key(b)));
    }
    order
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::core::flags::BPF_ANY;
    use crate::lpm::tests::{self_value, spread_ipv4, stable_ipv4_routes, with_ipv4_readers};

    /// A prefix's data, length and value bytes.
    type Entry = (Vec<u8>, u32, Vec<u8>);

    /// What a reader sees of a trie: answers, the walk, the count.
    type View = (Vec<Option<Vec<u8>>>, Vec<Entry>, usize);

    /// Everything a reader can see of `t`: answers for `probes`, the
    /// whole `get_next_key` walk with values, the count.
    fn view(t: &LpmTrie, probes: &[Vec<u8>]) -> View {
        let guard = pin();
        let answers = probes
            .iter()
            .map(|a| t.get(a, &guard).map(|v| v.to_vec()))
            .collect();
        let mut walk = Vec::new();
        let mut after: Option<(Vec<u8>, u32)> = None;
        while let Some(f) = t
            .next_after(after.as_ref().map(|(d, l)| (&d[..], *l)), &guard)
            .unwrap()
        {
            walk.push((f.data.clone(), f.prefixlen, t.value_of(&f, &guard).to_vec()));
            after = Some((f.data, f.prefixlen));
        }
        (answers, walk, crate::Map::len(t))
    }

    fn bulk_equals_one_by_one(
        n: usize,
        value_size: usize,
        stored: Vec<(Vec<u8>, u32)>,
        batch: Vec<((Vec<u8>, u32), u8)>,
        probes: Vec<Vec<u8>>,
        direct: bool,
    ) -> Result<(), TestCaseError> {
        let value = |x: u8| vec![x; value_size];
        let make = || {
            LpmTrie::new(n, value_size, 10_000)
                .unwrap()
                .with_direct_index_from(if direct { 0 } else { usize::MAX })
        };
        let (bulk, one) = (make(), make());
        for (i, (d, l)) in stored.iter().enumerate() {
            for t in [&bulk, &one] {
                t.insert(d, *l, &value(i as u8), BPF_ANY).unwrap();
            }
        }
        for ((d, l), v) in &batch {
            one.insert(d, *l, &value(*v), BPF_ANY).unwrap();
        }
        bulk.extend(batch.iter().map(|((d, l), v)| (d, *l, value(*v))))
            .unwrap();
        prop_assert_eq!(view(&bulk, &probes), view(&one, &probes));
        // Inserts can leave a node an edge could skip (an edge split after
        // the node below it was placed); a bulk load places each node as
        // deep as it can, so it never has more.
        prop_assert!(bulk.node_count() <= one.node_count());
        prop_assert!(bulk.direct_index_matches_tree());
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::scaled(64, 2) as u32))]

        /// A bulk load, into an empty trie or one holding prefixes, equals
        /// inserting the same entries one by one with `BPF_ANY`
        /// (duplicates included: the last wins): every answer, the whole
        /// walk with its values, the count, and no more nodes; small
        /// values in the runs, larger ones in route slots.
        #[test]
        fn bulk_loads_equal_one_by_one_inserts(
            n in prop_oneof![Just(1usize), Just(4), Just(16)],
            seed in any::<u64>(),
            stored_len in 0..crate::scaled(40, 6),
            batch_len in 0..crate::scaled(120, 8),
            big_values in any::<bool>(),
        ) {
            use rand::{Rng, SeedableRng};
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut prefix = || {
                let mut d: Vec<u8> = (0..n)
                    .map(|_| [0u8, 0x80, 0xff, rng.random()][rng.random_range(0..4)])
                    .collect();
                let l = rng.random_range(0..=8 * n as u32);
                crate::lpm::key::mask_host_bits(&mut d, l);
                (d, l)
            };
            let stored: Vec<_> = (0..stored_len).map(|_| prefix()).collect();
            let mut batch: Vec<_> = (0..batch_len).map(|i| (prefix(), i as u8)).collect();
            // Some duplicates of earlier entries and of stored prefixes.
            for i in 0..batch_len / 4 {
                let dup = if i % 2 == 0 && !stored.is_empty() {
                    stored[i % stored.len()].clone()
                } else {
                    batch[i].0.clone()
                };
                batch.push((dup, 200 + i as u8));
            }
            let probes: Vec<Vec<u8>> = stored.iter().chain(batch.iter().map(|b| &b.0)).map(|p| p.0.clone()).collect();
            let direct = n >= 3 && !cfg!(miri);
            bulk_equals_one_by_one(n, if big_values { 12 } else { 4 }, stored, batch, probes, direct)?;
        }
    }

    /// Bad entries leave the trie as it was: a wrong data size, a length
    /// over the data's bits, a value of the wrong size, more prefixes than
    /// `max_entries`.
    #[test]
    fn a_bad_batch_changes_nothing() {
        let t = LpmTrie::new(4, 4, 3).unwrap();
        t.insert(&[10, 0, 0, 0], 8, &[1; 4], BPF_ANY).unwrap();
        let before = view(&t, &[vec![10, 1, 2, 3]]);
        let good = ([192u8, 168, 0, 0], 16u32, [2u8; 4]);
        let cases: [(Vec<Entry>, Error); 4] = [
            (
                vec![
                    (good.0.to_vec(), good.1, good.2.to_vec()),
                    (vec![1, 2, 3], 8, vec![0; 4]),
                ],
                Error::Invalid("".into()),
            ),
            (
                vec![(good.0.to_vec(), 33, good.2.to_vec())],
                Error::Invalid("".into()),
            ),
            (
                vec![(good.0.to_vec(), good.1, vec![0; 5])],
                Error::Invalid("".into()),
            ),
            (
                (0..3u8)
                    .map(|i| (vec![i, 0, 0, 0], 8, vec![i; 4]))
                    .collect(),
                Error::Full,
            ),
        ];
        for (batch, want) in cases {
            let got = t.extend(batch).unwrap_err();
            assert_eq!(
                std::mem::discriminant(&got),
                std::mem::discriminant(&want),
                "{got:?}"
            );
            assert_eq!(view(&t, &[vec![10, 1, 2, 3]]), before);
        }
    }

    /// Readers look up addresses while bulk loads replace the whole tree
    /// again and again: every answer contains the address and is no
    /// shorter than the longest stable prefix that does.
    #[test]
    fn readers_never_miss_a_stable_route_during_bulk_loads() {
        let stable = stable_ipv4_routes();
        let t = LpmTrie::new(4, 8, 100_000)
            .unwrap()
            .with_direct_index_from(if cfg!(miri) { usize::MAX } else { 0 });
        for (d, l) in &stable {
            t.insert(d, *l, &self_value(d, *l), BPF_ANY).unwrap();
        }
        with_ipv4_readers(&t, &stable, || {
            for round in 0..crate::scaled(20, 1) as u32 {
                let batch = spread_ipv4(crate::scaled(2000, 12), round << 20);
                t.extend(batch.iter().map(|(d, l)| (d, *l, self_value(d, *l))))
                    .unwrap();
            }
        });
        assert!(t.direct_index_matches_tree());
    }

    /// A `BPF_ANY` batch through the byte contract, large enough for the
    /// bulk path (64 or more into an empty trie), gives what one by one
    /// would: every element, or those before a bad key and the error at
    /// it, or, past `max_entries`, the count that fit. (The results, not
    /// the path taken, are what a caller can see.)
    #[test]
    fn a_large_batch_through_the_contract_gives_one_by_ones_results() {
        use crate::lpm::key::encode_key;
        use crate::{BatchError, Map};

        let n = crate::scaled(300, 40);
        let key = |i: usize| encode_key(24, &[10, (i >> 8) as u8, i as u8, 0]);
        let keys: Vec<u8> = (0..n).flat_map(key).collect();
        let values: Vec<u8> = (0..n as u32).flat_map(u32::to_ne_bytes).collect();
        let lookup = |t: &LpmTrie, i: usize| {
            let mut v = [0; 4];
            t.lookup(&key(i), &mut v)
                .ok()
                .map(|()| u32::from_ne_bytes(v))
        };
        // All of them.
        let t = LpmTrie::new(4, 4, 10_000).unwrap();
        assert_eq!(t.update_batch(&keys, &values, BPF_ANY), Ok(n));
        assert!((0..n).all(|i| lookup(&t, i) == Some(i as u32)));
        assert_eq!(Map::len(&t), n);
        // A bad prefix length at element `at`: the ones before it.
        let at = n / 3;
        let mut bad = keys.clone();
        let ks = key(0).len();
        bad[at * ks..][..4].copy_from_slice(&33u32.to_ne_bytes());
        let t = LpmTrie::new(4, 4, 10_000).unwrap();
        let err = t.update_batch(&bad, &values, BPF_ANY).unwrap_err();
        assert_eq!(err.processed, at);
        assert_eq!(Map::len(&t), at);
        assert_eq!(lookup(&t, at - 1), Some(at as u32 - 1));
        assert_eq!(lookup(&t, at + 1), None);
        // Room for fewer: E2BIG where it runs out, as one by one.
        let room = n - n / 4;
        let t = LpmTrie::new(4, 4, room as u32).unwrap();
        let err: BatchError = t.update_batch(&keys, &values, BPF_ANY).unwrap_err();
        assert_eq!((err.processed, err.error), (room, Error::Full));
        assert_eq!(Map::len(&t), room);
    }
}
