//! The string-key maps the `strmap-*` suites compare, behind one trait
//! ([`StrTable`], with the object-safe view [`AnyStr`] to keep several
//! built side by side), and the one list the suites iterate
//! ([`each_str_table`], [`str_table_names`]).
//!
//! | name | type | lookup | ordered walk |
//! |---|---|---|---|
//! | `bpfmaps-qp-trie` | [`bpfmaps::strmap::QpTrieMap`], `key_size` = the longest key, built one key at a time and then `compact()`ed (in the build's time) | `get(key, &guard)`, one guard per batch | `for_each` |
//! | `bpfmaps-qp-trie-many` | the same map | `get_many`, groups of 16 keys side by side | - (the walk is `bpfmaps-qp-trie`'s) |
//! | `bpfmaps-tst` | [`bpfmaps::strmap::TstMap`] (the 2022 ternary search tree, the baseline), `key_size` = the longest key | `get(key, &guard)`, one guard per batch | `for_each` |
//! | `btreemap` | `BTreeMap<Box<[u8]>, u64>` | `get` | `iter` |
//! | `std-hashmap` | `std::collections::HashMap<Box<[u8]>, u64>` (SipHash, `RandomState`) | `get` | - |
//! | `bpfmaps-hash` | `bpfmaps::hashtab::HashMap`, `key_size` = the longest key, keys zero-padded | `get(padded, &guard)`, one guard per batch | - |
//! | `qp-trie` | `qp_trie::Trie<Box<[u8]>, u64>` | `get` | - (its `iter` is in nibble order, low nibble first: not byte order) |
//! | `patricia_tree` | `patricia_tree::PatriciaMap<u64>` | `get` | `iter` (builds each key) |
//! | `radix_trie` | `radix_trie::Trie<Vec<u8>, u64>` | `get` | `iter` |
//! | `judysl` | JudySL from libJudy (C), where `libjudy-dev` is installed | `JudySLGet` on the key in place | `JudySLFirst`/`JudySLNext` |
//! | `hat-trie` | libhat-trie (C), where `libhat-trie-dev` is installed | `hattrie_tryget` | sorted iterator (sorts each leaf table) |
//!
//! Key `i` of a set is stored with value `i` (`u64`; a word for the C
//! peers). Every structure stores its own copy of the keys, and its memory
//! counts them. `bpfmaps-hash` is what BPF users do today with string
//! keys: a hash map whose `key_size` is the longest key, each key copied
//! into a zeroed buffer of that size before an update or lookup (as a BPF
//! program reads a string into a zeroed `char[N]`); it is preallocated for
//! the set (the kernel's default).
//!
//! `blart` (an adaptive radix tree) is not in the list: it takes no key
//! that is a proper prefix of another (`try_insert` refuses it), and every
//! real set has such keys (`strmap-real` prints how many).
//!
//! Adding a structure: an impl of [`StrTable`] and one line in
//! `visit_all`.

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::ops::Range;

use bpfmaps::strmap::{LOOKUP_GROUP, QpTrieMap, TstMap};
use bpfmaps::{BPF_ANY, Map};
use radix_trie::TrieCommon;

use crate::alloc::MemProbe;
use crate::lpm_tables::fold_digest;
use crate::strings::Keys;

pub use crate::suite::BATCH;

/// A map from byte strings to `u64`, as the string suites drive it.
pub trait StrTable: Sized {
    /// Implementation name in records.
    const NAME: &'static str;
    /// Why it cannot hold `keys` as they are, if it cannot (checked
    /// before building; the suite then says so and leaves it out).
    fn refuses(_keys: &Keys) -> Option<String> {
        None
    }
    /// Key `i` of `keys` with value `i`, inserted in the order given.
    fn build(keys: &Keys) -> Self;
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Option<u64>;
    /// Sum of the values found for the keys `range` of `probes` (0 per
    /// miss): one batch of a lookup loop.
    #[inline]
    fn sum_batch(&self, probes: &Keys, range: Range<usize>) -> u64 {
        let mut acc = 0u64;
        for i in range {
            acc = acc.wrapping_add(self.get(black_box(probes.key(i))).unwrap_or(0));
        }
        acc
    }
    /// Keys held.
    fn len(&self) -> usize;
    /// Whether it holds no keys.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether it walks its keys in byte order
    /// ([`StrTable::for_each_ordered`]).
    const ORDERED: bool = false;
    /// Calls `f` with every key and value in byte order; only called
    /// where [`StrTable::ORDERED`].
    fn for_each_ordered(&self, _f: impl FnMut(&[u8], u64)) {
        unimplemented!("{} keeps no order", Self::NAME)
    }
    /// The structure's own account of its memory, for a native peer whose
    /// allocations the counting allocator does not see.
    fn reported(&self) -> Option<usize> {
        None
    }
    /// Whether the counting allocator sees its memory.
    const COUNTED: bool = true;
}

/// A built structure and what building it cost.
pub struct Built<T> {
    /// The structure.
    pub table: T,
    /// Time of the inserts, in nanoseconds per key.
    pub ns_per_key: f64,
    /// Bytes the building thread holds afterwards (counting allocator).
    pub held: usize,
}

/// Builds `T` from `keys`, timing the inserts and counting what it holds.
pub fn build<T: StrTable>(keys: &Keys) -> Built<T> {
    // Garbage other epoch-reclaimed maps left is freed by whichever thread
    // pins next: not inside this count, if it can be helped.
    drain_epoch_garbage();
    let probe = MemProbe::start();
    let start = std::time::Instant::now();
    let table = T::build(keys);
    let elapsed = start.elapsed();
    // What the build replaced (bpfmaps' copy-on-write nodes) is freed
    // now, so that what is counted is what the structure holds.
    drain_epoch_garbage();
    Built {
        table,
        ns_per_key: elapsed.as_secs_f64() * 1e9 / keys.len().max(1) as f64,
        held: probe.held(),
    }
}

/// Runs the epoch collector until this thread's retired garbage is freed
/// (each flush moves the local bag on and tries to advance the epoch).
fn drain_epoch_garbage() {
    for _ in 0..8 {
        bpfmaps::pin().flush();
    }
}

/// A lookup loop over `probes`, one batch of [`BATCH`] keys per call,
/// cycling through them; returns the lookups it did.
pub fn lookup_batches<'a, T: StrTable>(t: &'a T, probes: &'a Keys) -> impl FnMut() -> u64 + 'a {
    assert!(!probes.is_empty(), "no keys to look up");
    let mut cursor = 0;
    move || {
        let end = (cursor + BATCH).min(probes.len());
        black_box(t.sum_batch(probes, cursor..end));
        let done = end - cursor;
        cursor = if end == probes.len() { 0 } else { end };
        done as u64
    }
}

/// What an ordered walk does with each key it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkUse {
    /// Touches its length and value only (`walk=iter`): a structure that
    /// keeps each key behind a pointer (`BTreeMap<Box<[u8]>, _>`) never
    /// reads it.
    Length,
    /// Reads every byte of it too (`walk=read`), as a caller that prints,
    /// compares or hashes the keys does.
    Bytes,
}

/// One whole ordered walk; returns the keys seen.
fn walk_once<T: StrTable>(t: &T, with: WalkUse) -> u64 {
    let (mut count, mut sum) = (0u64, 0u64);
    match with {
        WalkUse::Length => t.for_each_ordered(|k, v| {
            count += 1;
            sum = sum.wrapping_add(v + k.len() as u64);
        }),
        WalkUse::Bytes => t.for_each_ordered(|k, v| {
            count += 1;
            let bytes = k.iter().fold(0u64, |a, &b| a.wrapping_add(u64::from(b)));
            sum = sum.wrapping_add(v + bytes);
        }),
    }
    black_box(sum);
    count
}

/// Lookups of the first `expect.len()` keys of `probes` that did not
/// answer what `expect` says.
pub fn wrong_answers<T: StrTable>(t: &T, probes: &Keys, expect: &[Option<u64>]) -> usize {
    expect
        .iter()
        .enumerate()
        .filter(|&(i, e)| t.get(probes.key(i)) != *e)
        .count()
}

/// A [`StrTable`] behind one type, so that a suite keeps several built
/// side by side and times them in turns.
pub trait AnyStr {
    /// [`StrTable::NAME`].
    fn name(&self) -> &'static str;
    /// [`lookup_batches`] over `probes`.
    fn lookups<'a>(&'a self, probes: &'a Keys) -> Box<dyn FnMut() -> u64 + 'a>;
    /// One whole ordered walk per call (returning the keys seen), if the
    /// structure is ordered.
    fn walk(&self, with: WalkUse) -> Option<Box<dyn FnMut() -> u64 + '_>>;
    /// [`wrong_answers`].
    fn wrong_answers(&self, probes: &Keys, expect: &[Option<u64>]) -> usize;
    /// The keys an ordered walk sees and a digest of them in order.
    fn walk_digest(&self) -> Option<(u64, u64)>;
    /// [`StrTable::len`].
    fn len(&self) -> usize;
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: StrTable> AnyStr for T {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn lookups<'a>(&'a self, probes: &'a Keys) -> Box<dyn FnMut() -> u64 + 'a> {
        Box::new(lookup_batches(self, probes))
    }
    fn walk(&self, with: WalkUse) -> Option<Box<dyn FnMut() -> u64 + '_>> {
        T::ORDERED.then(|| Box::new(move || walk_once(self, with)) as Box<dyn FnMut() -> u64>)
    }
    fn wrong_answers(&self, probes: &Keys, expect: &[Option<u64>]) -> usize {
        wrong_answers(self, probes, expect)
    }
    fn walk_digest(&self) -> Option<(u64, u64)> {
        if !T::ORDERED {
            return None;
        }
        let (mut count, mut digest) = (0u64, 0u64);
        self.for_each_ordered(|k, v| {
            count += 1;
            digest = fold_digest(fold_digest(digest, k), &v.to_le_bytes());
        });
        Some((count, digest))
    }
    fn len(&self) -> usize {
        StrTable::len(self)
    }
}

/// What a suite does with one implementation, generic over its type so
/// that the timed loops are monomorphic.
pub trait StrStep {
    /// What the step gives per implementation.
    type Out;
    /// Runs the step on `T`.
    fn step<T: StrTable + 'static>(&mut self) -> Self::Out;
}

/// Called once per implementation of the list, in report order.
trait Visit {
    fn visit<T: StrTable + 'static>(&mut self);
}

/// Every string map, in report order: the one list every string suite
/// iterates. Adding one is an impl of [`StrTable`] and one line here.
fn visit_all(v: &mut impl Visit) {
    v.visit::<QpTrieMap>();
    v.visit::<QpTrieGroups>();
    v.visit::<TstMap>();
    v.visit::<BTreeMap<Box<[u8]>, u64>>();
    v.visit::<HashMap<Box<[u8]>, u64>>();
    v.visit::<FixedKeyHash>();
    v.visit::<qp_trie::Trie<Box<[u8]>, u64>>();
    v.visit::<patricia_tree::PatriciaMap<u64>>();
    v.visit::<radix_trie::Trie<Vec<u8>, u64>>();
    #[cfg(native_judy)]
    v.visit::<crate::native::judy::JudySl>();
    #[cfg(native_hat_trie)]
    v.visit::<crate::native::hat_trie::HatTrie>();
}

/// Runs `step` on every implementation, in report order.
pub fn each_str_table<S: StrStep>(step: &mut S) -> Vec<S::Out> {
    struct Each<'a, S: StrStep>(&'a mut S, Vec<S::Out>);
    impl<S: StrStep> Visit for Each<'_, S> {
        fn visit<T: StrTable + 'static>(&mut self) {
            let out = self.0.step::<T>();
            self.1.push(out);
        }
    }
    let mut each = Each(step, Vec::new());
    visit_all(&mut each);
    each.1
}

/// The implementations' names, in report order.
pub fn str_table_names() -> Vec<&'static str> {
    struct Names(Vec<&'static str>);
    impl Visit for Names {
        fn visit<T: StrTable + 'static>(&mut self) {
            self.0.push(T::NAME);
        }
    }
    let mut names = Names(Vec::new());
    visit_all(&mut names);
    names.0
}

/// The name of the baseline: the fixed-key hash map BPF users have today.
pub const BASELINE: &str = FixedKeyHash::NAME;

impl StrTable for BTreeMap<Box<[u8]>, u64> {
    const NAME: &'static str = "btreemap";
    fn build(keys: &Keys) -> Self {
        let mut m = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            m.insert(k.into(), i as u64);
        }
        m
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        BTreeMap::get(self, key).copied()
    }
    fn len(&self) -> usize {
        BTreeMap::len(self)
    }
    const ORDERED: bool = true;
    fn for_each_ordered(&self, mut f: impl FnMut(&[u8], u64)) {
        for (k, v) in self {
            f(k, *v);
        }
    }
}

impl StrTable for HashMap<Box<[u8]>, u64> {
    const NAME: &'static str = "std-hashmap";
    fn build(keys: &Keys) -> Self {
        let mut m = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            m.insert(k.into(), i as u64);
        }
        m
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        HashMap::get(self, key).copied()
    }
    fn len(&self) -> usize {
        HashMap::len(self)
    }
}

/// bpfmaps' string maps: keys of any length up to the set's longest, one
/// guard per batch of lookups, walks by `for_each`. They share this API,
/// so one definition serves them; `then m` names a method the build calls
/// after its inserts (part of the build's time).
macro_rules! bpfmaps_str_table {
    ($($(#[$doc:meta])* $map:ident => $name:literal $(then $after:ident)?,)*) => {$(
        $(#[$doc])*
        impl StrTable for $map {
            const NAME: &'static str = $name;
            const ORDERED: bool = true;
            fn refuses(keys: &Keys) -> Option<String> {
                (keys.max_len() > bpfmaps::strmap::MAX_KEY_SIZE).then(|| {
                    format!(
                        "its longest key ({} bytes) is past the map's limit",
                        keys.max_len()
                    )
                })
            }
            fn build(keys: &Keys) -> Self {
                let entries = u32::try_from(keys.len()).expect("entries fit u32");
                let map =
                    $map::new(keys.max_len().max(1), 8, entries.max(1)).expect("creating the map");
                for (i, k) in keys.iter().enumerate() {
                    map.insert(k, &(i as u64).to_ne_bytes(), BPF_ANY)
                        .expect("insert");
                }
                $(map.$after();)?
                map
            }
            fn get(&self, key: &[u8]) -> Option<u64> {
                $map::get(self, key, &bpfmaps::pin()).map(read_u64)
            }
            #[inline]
            fn sum_batch(&self, probes: &Keys, range: Range<usize>) -> u64 {
                let guard = bpfmaps::pin();
                let mut acc = 0u64;
                for i in range {
                    let v = $map::get(self, black_box(probes.key(i)), &guard);
                    acc = acc.wrapping_add(v.map_or(0, read_u64));
                }
                acc
            }
            fn len(&self) -> usize {
                $map::len(self)
            }
            fn reported(&self) -> Option<usize> {
                Some(self.memory_usage())
            }
            fn for_each_ordered(&self, mut f: impl FnMut(&[u8], u64)) {
                let guard = bpfmaps::pin();
                self.for_each(&guard, |k, v| {
                    f(k, read_u64(v));
                    std::ops::ControlFlow::Continue(())
                });
            }
        }
    )*};
}

bpfmaps_str_table! {
    /// The qp-trie map, compacted after its inserts (as a bulk load is:
    /// its walks then read memory in order).
    QpTrieMap => "bpfmaps-qp-trie" then compact,
    /// The ternary search tree map of 2022, bpfmaps' baseline for the
    /// qp-trie.
    TstMap => "bpfmaps-tst",
}

/// The same map looked up through `get_many`: a caller with many keys at
/// once (a batch of packets, of stack addresses' symbols) gives them in
/// groups of [`LOOKUP_GROUP`], whose cache misses overlap.
pub struct QpTrieGroups(QpTrieMap);

impl StrTable for QpTrieGroups {
    const NAME: &'static str = "bpfmaps-qp-trie-many";
    fn refuses(keys: &Keys) -> Option<String> {
        <QpTrieMap as StrTable>::refuses(keys)
    }
    fn build(keys: &Keys) -> Self {
        QpTrieGroups(<QpTrieMap as StrTable>::build(keys))
    }
    fn get(&self, key: &[u8]) -> Option<u64> {
        <QpTrieMap as StrTable>::get(&self.0, key)
    }
    #[inline]
    fn sum_batch(&self, probes: &Keys, range: Range<usize>) -> u64 {
        let guard = bpfmaps::pin();
        let mut acc = 0u64;
        let (mut keys, mut out) = ([&[][..]; LOOKUP_GROUP], [None; LOOKUP_GROUP]);
        let mut at = range.start;
        while at < range.end {
            let n = LOOKUP_GROUP.min(range.end - at);
            for (j, key) in keys[..n].iter_mut().enumerate() {
                *key = black_box(probes.key(at + j));
            }
            self.0
                .get_many(&keys[..n], &guard, &mut out)
                .expect("room for every answer");
            for v in &out[..n] {
                acc = acc.wrapping_add(v.map_or(0, read_u64));
            }
            at += n;
        }
        acc
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn reported(&self) -> Option<usize> {
        Some(self.0.memory_usage())
    }
}

/// bpfmaps' `HashMap` with `key_size` the longest key of the set, keys
/// zero-padded to it.
pub struct FixedKeyHash {
    map: bpfmaps::hashtab::HashMap,
    key_size: usize,
}

/// The largest `key_size` a bpfmaps hash map takes (the kernel's
/// `MAX_BPF_STACK`).
const MAX_KEY_SIZE: usize = 512;

/// A `u64` value as the maps store it (native byte order).
#[inline(always)]
pub fn read_u64(v: &[u8]) -> u64 {
    u64::from_ne_bytes(v.try_into().expect("8-byte values"))
}

/// `key` zero-padded to `buf.len()` bytes in `buf`.
#[inline(always)]
fn padded<'a>(buf: &'a mut [u8], key: &[u8]) -> &'a [u8] {
    buf[..key.len()].copy_from_slice(key);
    buf[key.len()..].fill(0);
    buf
}

/// The same map through `&self`, for the concurrent suite
/// (`strmap-threads`).
impl FixedKeyHash {
    /// An empty, preallocated map for keys of up to `key_size` bytes (1 to
    /// 512), `max_entries` of them.
    pub fn with_capacity(key_size: usize, max_entries: u32) -> Self {
        let map =
            bpfmaps::hashtab::HashMap::new(key_size, 8, max_entries).expect("creating the map");
        FixedKeyHash { map, key_size }
    }

    /// Stores `value` under `key` (zero-padded), as `Map::update` with
    /// `flags`.
    pub fn insert(&self, key: &[u8], value: u64, flags: u64) -> bpfmaps::Result<()> {
        let mut buf = [0u8; MAX_KEY_SIZE];
        let key = padded(&mut buf[..self.key_size], key);
        self.map.update(key, &value.to_ne_bytes(), flags)
    }

    /// Removes `key` (zero-padded), as `Map::delete`.
    pub fn remove(&self, key: &[u8]) -> bpfmaps::Result<()> {
        let mut buf = [0u8; MAX_KEY_SIZE];
        self.map.delete(padded(&mut buf[..self.key_size], key))
    }

    /// Calls `f(i, value)` for each key `i` of `range` of `probes`, under
    /// one guard and with one padding buffer, as [`StrTable::sum_batch`]
    /// does.
    #[inline]
    pub fn get_each(
        &self,
        probes: &Keys,
        range: Range<usize>,
        mut f: impl FnMut(usize, Option<u64>),
    ) {
        let guard = bpfmaps::pin();
        let mut buf = [0u8; MAX_KEY_SIZE];
        let buf = &mut buf[..self.key_size];
        for i in range {
            let key = probes.key(i);
            let v = if key.len() > buf.len() {
                None // longer than any stored key: a miss
            } else {
                self.map.get(padded(buf, key), &guard).map(read_u64)
            };
            f(i, v);
        }
    }
}

impl StrTable for FixedKeyHash {
    const NAME: &'static str = "bpfmaps-hash";
    fn refuses(keys: &Keys) -> Option<String> {
        if keys.max_len() > MAX_KEY_SIZE {
            Some(format!(
                "its longest key ({} bytes) is past a hash map's key_size limit ({MAX_KEY_SIZE})",
                keys.max_len()
            ))
        } else if keys.has_nul() {
            Some("a key holds a NUL byte, so zero-padding could merge two keys".into())
        } else {
            None
        }
    }
    fn build(keys: &Keys) -> Self {
        let entries = u32::try_from(keys.len()).expect("entries fit u32");
        let t = FixedKeyHash::with_capacity(keys.max_len(), entries);
        for (i, k) in keys.iter().enumerate() {
            t.insert(k, i as u64, BPF_ANY).expect("update");
        }
        t
    }
    fn get(&self, key: &[u8]) -> Option<u64> {
        let mut buf = vec![0u8; self.key_size];
        (key.len() <= self.key_size)
            .then(|| {
                self.map
                    .get(padded(&mut buf, key), &bpfmaps::pin())
                    .map(read_u64)
            })
            .flatten()
    }
    #[inline]
    fn sum_batch(&self, probes: &Keys, range: Range<usize>) -> u64 {
        let guard = bpfmaps::pin();
        let mut buf = [0u8; MAX_KEY_SIZE];
        let buf = &mut buf[..self.key_size];
        let mut acc = 0u64;
        for i in range {
            let key = black_box(probes.key(i));
            if key.len() > buf.len() {
                continue; // longer than any stored key: a miss
            }
            if let Some(v) = self.map.get(padded(buf, key), &guard) {
                acc = acc.wrapping_add(read_u64(v));
            }
        }
        acc
    }
    fn len(&self) -> usize {
        Map::len(&self.map)
    }
}

impl StrTable for qp_trie::Trie<Box<[u8]>, u64> {
    const NAME: &'static str = "qp-trie";
    fn build(keys: &Keys) -> Self {
        let mut t = qp_trie::Trie::new();
        for (i, k) in keys.iter().enumerate() {
            t.insert(k.into(), i as u64);
        }
        t
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        qp_trie::Trie::get(self, key).copied()
    }
    fn len(&self) -> usize {
        self.count()
    }
    // Not ORDERED: it branches on a byte's low nibble before its high
    // one, so its iterator does not give byte order (0x10 before 0x01).
}

impl StrTable for patricia_tree::PatriciaMap<u64> {
    const NAME: &'static str = "patricia_tree";
    fn build(keys: &Keys) -> Self {
        let mut t = patricia_tree::PatriciaMap::new();
        for (i, k) in keys.iter().enumerate() {
            t.insert(k, i as u64);
        }
        t
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        patricia_tree::PatriciaMap::get(self, key).copied()
    }
    fn len(&self) -> usize {
        patricia_tree::PatriciaMap::len(self)
    }
    const ORDERED: bool = true;
    fn for_each_ordered(&self, mut f: impl FnMut(&[u8], u64)) {
        // Its iterator builds each key from the labels on the path.
        for (k, v) in self.iter() {
            f(&k, *v);
        }
    }
}

impl StrTable for radix_trie::Trie<Vec<u8>, u64> {
    const NAME: &'static str = "radix_trie";
    fn build(keys: &Keys) -> Self {
        let mut t = radix_trie::Trie::new();
        for (i, k) in keys.iter().enumerate() {
            t.insert(k.to_vec(), i as u64);
        }
        t
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        radix_trie::Trie::get(self, key).copied()
    }
    fn len(&self) -> usize {
        TrieCommon::len(self)
    }
    const ORDERED: bool = true;
    fn for_each_ordered(&self, mut f: impl FnMut(&[u8], u64)) {
        for (k, v) in TrieCommon::iter(self) {
            f(k, *v);
        }
    }
}

/// JudySL (`judysl`), a C peer from `libjudy-dev`: its blocks come from
/// Rust's global allocator ([`crate::native::judy`]), so its memory is
/// counted as the Rust maps' is. It takes C strings, so a set with a NUL
/// in a key is refused; lookups pass each key in place with the NUL that
/// [`Keys`] lays after it.
#[cfg(native_judy)]
impl StrTable for crate::native::judy::JudySl {
    const NAME: &'static str = "judysl";
    fn refuses(keys: &Keys) -> Option<String> {
        keys.has_nul()
            .then(|| "it takes C strings and a key holds a NUL byte".into())
    }
    fn build(keys: &Keys) -> Self {
        let mut t = Self::new();
        for i in 0..keys.len() {
            t.insert(keys.key_with_nul(i), i);
        }
        t
    }
    fn get(&self, key: &[u8]) -> Option<u64> {
        let mut k = key.to_vec();
        k.push(0);
        Self::get(self, &k).map(|v| v as u64)
    }
    #[inline]
    fn sum_batch(&self, probes: &Keys, range: Range<usize>) -> u64 {
        let mut acc = 0u64;
        for i in range {
            let v = Self::get(self, black_box(probes.key_with_nul(i)));
            acc = acc.wrapping_add(v.unwrap_or(0) as u64);
        }
        acc
    }
    fn len(&self) -> usize {
        Self::len(self)
    }
    const ORDERED: bool = true;
    fn for_each_ordered(&self, mut f: impl FnMut(&[u8], u64)) {
        self.for_each(|k, v| f(k, v as u64));
    }
}

/// libhat-trie (`hat-trie`), a C peer from `libhat-trie-dev`. It calls
/// `malloc` itself, so its memory is its own account (`hattrie_sizeof`)
/// rather than the counting allocator's. Its ordered walk sorts each leaf
/// table as it reaches it.
#[cfg(native_hat_trie)]
impl StrTable for crate::native::hat_trie::HatTrie {
    const NAME: &'static str = "hat-trie";
    const COUNTED: bool = false;
    fn refuses(keys: &Keys) -> Option<String> {
        let max = crate::native::hat_trie::MAX_KEY;
        (keys.max_len() > max).then(|| format!("a key is longer than its {max}-byte limit"))
    }
    fn build(keys: &Keys) -> Self {
        let mut t = Self::new();
        for (i, k) in keys.iter().enumerate() {
            t.insert(k, i);
        }
        t
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        Self::get(self, key).map(|v| v as u64)
    }
    fn len(&self) -> usize {
        Self::len(self)
    }
    const ORDERED: bool = true;
    fn for_each_ordered(&self, mut f: impl FnMut(&[u8], u64)) {
        self.for_each_sorted(|k, v| f(k, v as u64));
    }
    fn reported(&self) -> Option<usize> {
        Some(self.memory())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strings::{hit_order, misses, shuffled};

    /// Keys that are prefixes of one another, share long prefixes, and
    /// hold 0xff bytes.
    fn sample() -> Keys {
        let mut words: Vec<Vec<u8>> = Vec::new();
        for i in 0..3000u32 {
            words.push(format!("sym_{}", i * 13).into_bytes());
            words.push(format!("drivers/net/eth{}/main.c", i % 97).into_bytes());
        }
        words.extend([b"s".to_vec(), b"sy".to_vec(), vec![0xff, 1], vec![0xff]]);
        shuffled(crate::strings::dedup(words), 3)
    }

    /// Every implementation answers every hit with its index and every
    /// miss with nothing, and the ordered ones walk the keys in byte
    /// order.
    #[test]
    fn every_implementation_agrees() {
        let keys = sample();
        let order = hit_order(&keys, 4);
        let hits = keys.permuted(&order);
        let hit_expect: Vec<_> = order.iter().map(|&i| Some(u64::from(i))).collect();
        let miss = misses(&keys, 5);
        let mut sorted: Vec<(&[u8], u64)> = keys.iter().zip(0..).collect();
        sorted.sort();
        let (mut count, mut digest) = (0u64, 0u64);
        for (k, v) in &sorted {
            count += 1;
            digest = fold_digest(fold_digest(digest, k), &v.to_le_bytes());
        }

        struct Check<'a> {
            keys: &'a Keys,
            hits: &'a Keys,
            hit_expect: &'a [Option<u64>],
            miss: &'a Keys,
            ordered: (u64, u64),
        }
        impl StrStep for Check<'_> {
            type Out = (&'static str, bool);
            fn step<T: StrTable + 'static>(&mut self) -> (&'static str, bool) {
                assert_eq!(T::refuses(self.keys), None, "{}", T::NAME);
                let b = build::<T>(self.keys);
                let t = &b.table;
                assert_eq!(StrTable::len(t), self.keys.len(), "{}", T::NAME);
                // (bpfmaps' maps also report: in a test process another
                // test's epoch garbage may be freed on this thread.)
                assert!(
                    b.held > 0 || !T::COUNTED || t.reported().is_some(),
                    "{}",
                    T::NAME
                );
                assert!(T::COUNTED || t.reported().is_some(), "{}", T::NAME);
                assert_eq!(
                    t.wrong_answers(self.hits, self.hit_expect),
                    0,
                    "{}",
                    T::NAME
                );
                let none = vec![None; self.miss.len()];
                assert_eq!(t.wrong_answers(self.miss, &none), 0, "{}", T::NAME);
                let mut lookups = AnyStr::lookups(t, self.hits);
                let mut done = 0;
                while done < self.hits.len() as u64 {
                    done += lookups();
                }
                assert_eq!(done, self.hits.len() as u64, "whole passes");
                if let Some(walk) = t.walk_digest() {
                    assert_eq!(walk, self.ordered, "{}: order", T::NAME);
                    for with in [WalkUse::Length, WalkUse::Bytes] {
                        assert_eq!(t.walk(with).unwrap()(), self.ordered.0);
                    }
                }
                (T::NAME, t.walk_digest().is_some())
            }
        }
        let out = each_str_table(&mut Check {
            keys: &keys,
            hits: &hits,
            hit_expect: &hit_expect,
            miss: &miss,
            ordered: (count, digest),
        });
        let names: Vec<_> = out.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, str_table_names());
        let native = usize::from(cfg!(native_judy)) + usize::from(cfg!(native_hat_trie));
        assert_eq!(names.len(), 9 + native);
        let unordered: Vec<_> = out.iter().filter(|(_, o)| !o).map(|(n, _)| *n).collect();
        assert_eq!(
            unordered,
            [
                "bpfmaps-qp-trie-many",
                "std-hashmap",
                "bpfmaps-hash",
                "qp-trie"
            ]
        );
    }

    #[test]
    fn refusals() {
        let nul = Keys::new([&b"a\0b"[..], b"c"]);
        assert!(FixedKeyHash::refuses(&nul).is_some());
        assert!(FixedKeyHash::refuses(&Keys::new([&[b'x'; 513][..]])).is_some());
        assert!(FixedKeyHash::refuses(&Keys::new([&[b'x'; 512][..]])).is_none());
        #[cfg(native_judy)]
        assert!(crate::native::judy::JudySl::refuses(&nul).is_some());
    }
}
