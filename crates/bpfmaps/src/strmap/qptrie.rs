//! [`QpTrieMap`]: variable-length byte keys in a path-compressed trie of
//! byte-labelled nodes ([`block`](super::block)), 256 subtrees by first
//! byte, each with its own writer lock; readers take no lock.
//!
//! A key's first byte picks its subtree; below, each node holds the bytes
//! its keys share (skip), the value of a key ending there, and one child
//! per next byte. A key with no sibling below some node is a leaf of that
//! node: the rest of the key and the value, inline. A subtree of few
//! enough keys is a bucket: their common prefix, then each key's rest and
//! value as sorted records, found by a one-byte hash tag. So every key
//! byte is stored once, and a lookup reads one node per branching point
//! above the buckets, then one bucket.
//!
//! Writers copy what they change: a new node is built and published with
//! one release store into its parent's slot (or the subtree's root), and
//! the nodes it replaced are freed after the epoch's grace period. A
//! reader sees each node whole, old or new. The shape is canonical: a set
//! of keys is a bucket when it fits one, and below the root every other
//! node has at least two entries (an end value or children), so removals
//! restore what a fresh build of the same keys has.

use std::cmp::Ordering as CmpOrdering;
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::block::{
    self, BUCKET_BYTES, BUCKET_KEYS, Child, ChildSpec, Node, Record, Slab, Spec, Step,
};
use super::limits::{Counts, Limits, string_map_methods};
use crate::core::bytes;
use crate::core::error::{Error, Result, check_len};
use crate::core::flags::UpdateFlag;
use crate::core::reclaim::{Guard, drop_in_background, pin, synchronize};

/// Longest tail a leaf keeps inside its parent node; a longer one gets a
/// node of its own. Every write copies the node it changes, inline leaves
/// included, so without a bound a node above many long keys costs all
/// their bytes to copy on each insert. No leaf of the real key sets
/// (symbols, BTF strings, paths, domains, words) has a tail this long.
pub const MAX_INLINE_TAIL: usize = 64;

/// Longest key a map may be created for.
pub const MAX_KEY_SIZE: usize = 4096;

/// A map from byte strings (1 to `max_key_size` bytes, any byte values;
/// `b"ab"` and `b"ab\0"` are different keys) to fixed-size values, in
/// lexicographic byte order (a key before its extensions).
///
/// ```
/// use bpfmaps::strmap::QpTrieMap;
/// use bpfmaps::{BPF_ANY, pin};
///
/// let m = QpTrieMap::new(64, 8, 1000).unwrap();
/// m.insert(b"vfs_read", &1u64.to_ne_bytes(), BPF_ANY).unwrap();
/// m.insert(b"vfs_readv", &2u64.to_ne_bytes(), BPF_ANY).unwrap();
/// let guard = pin();
/// assert_eq!(m.get(b"vfs_read", &guard), Some(&1u64.to_ne_bytes()[..]));
/// assert_eq!(m.longest_prefix_of(b"vfs_readahead", &guard).unwrap().0, b"vfs_read");
/// ```
pub struct QpTrieMap {
    roots: Box<[Root]>,
    limits: Limits,
    /// Creation flags, for `MapInfo`.
    pub(super) map_flags: u32,
    counts: Counts,
    buckets: BucketLimits,
}

/// How many keys, and bytes of records, a bucket may hold
/// ([`block::BUCKET_KEYS`] and [`block::BUCKET_BYTES`]; tests use small
/// ones, so that small key sets burst and collapse buckets).
#[derive(Clone, Copy)]
pub(super) struct BucketLimits {
    pub keys: usize,
    pub bytes: usize,
}

/// Lookups [`QpTrieMap::get_many`] runs side by side.
pub const LOOKUP_GROUP: usize = 16;

/// A subtree: the keys starting with one byte.
struct Root {
    /// The subtree's top node, 0 when it is empty.
    top: AtomicU64,
    writer: Mutex<Packing>,
}

/// What a subtree's writer keeps besides its nodes: the slabs its packed
/// nodes live in ([`QpTrieMap::compact`]).
#[derive(Default)]
struct Packing {
    /// By address, each with its count of nodes not yet retired.
    slabs: Vec<Slab>,
    /// Whether a node was built since the last compaction.
    changed: bool,
}

/// What a write below a node asks of the node's parent. On every change
/// but `Keep` the parent retires the node once it has published the
/// change; the write below retires only what it unlinks further down.
enum Change {
    /// Nothing: the write was published further down, or failed.
    Keep,
    /// Publish this node in place of the old one.
    Swap(u64),
    /// The node holds no key any more: drop it.
    Gone,
    /// The node holds one key: the parent holds it as a leaf.
    Leaf { tail: Vec<u8>, value: Vec<u8> },
}

/// One write's bookkeeping: nodes to retire once it is published.
struct Write<'a> {
    map: &'a QpTrieMap,
    packing: &'a mut Packing,
    retired: Vec<u64>,
}

impl Write<'_> {
    /// A key's leaf below its parent: inline when its tail is at most
    /// [`MAX_INLINE_TAIL`] bytes, else a node of its own that holds just
    /// that key (its skip the tail, its end the value), so that a node
    /// with many long keys below it stays small to copy on every write.
    fn leaf(&mut self, tail: &[u8], value: &[u8]) -> ChildSpec {
        if tail.len() <= MAX_INLINE_TAIL {
            return ChildSpec::Leaf {
                tail: tail.to_vec(),
                value: value.to_vec(),
            };
        }
        ChildSpec::Node(self.build(&Spec {
            skip: tail.to_vec(),
            end: Some(value.to_vec()),
            children: Vec::new(),
        }))
    }

    fn build(&mut self, spec: &Spec) -> u64 {
        let (word, size) = spec.build();
        self.built(word, size)
    }

    fn built(&mut self, word: u64, size: usize) -> u64 {
        self.packing.changed = true;
        self.map
            .counts
            .node_bytes
            .fetch_add(size, Ordering::Relaxed);
        word
    }

    /// What a node whose keys are now `entries` (sorted) asks of its
    /// parent: nothing left, one key (a leaf), or the canonical node.
    fn small(&mut self, entries: &[Entry<'_>]) -> Change {
        match entries {
            [] => Change::Gone,
            [(tail, value)] => Change::Leaf {
                tail: tail.to_vec(),
                value: value.to_vec(),
            },
            _ => Change::Swap(self.node_of(entries)),
        }
    }

    /// A subtree of `entries` (one or more, sorted, spelled from the
    /// subtree's place on) below its parent's label: a leaf for one key,
    /// else [`node_of`](Self::node_of).
    fn subtree(&mut self, entries: &[Entry<'_>]) -> ChildSpec {
        match entries {
            [(tail, value)] => self.leaf(tail, value),
            _ => ChildSpec::Node(self.node_of(entries)),
        }
    }

    /// The canonical node of `entries` (one or more, sorted): one key is a
    /// node of its own (its skip the key, its end the value); keys that
    /// fit one bucket are a bucket; more are a node where they part, its
    /// children canonical in turn.
    fn node_of(&mut self, entries: &[Entry<'_>]) -> u64 {
        if let [(key, value)] = entries {
            return self.build(&Spec {
                skip: key.to_vec(),
                end: Some(value.to_vec()),
                children: Vec::new(),
            });
        }
        let common = common_prefix(entries[0].0, entries[entries.len() - 1].0);
        let skip = &entries[0].0[..common];
        if fits(entries, self.map.buckets) {
            let rests: Vec<_> = entries
                .iter()
                .map(|(k, v)| Record::new(&k[common..], v))
                .collect();
            let (word, size) = block::build_bucket(skip, &rests);
            return self.built(word, size);
        }
        let mut spec = Spec {
            skip: skip.to_vec(),
            end: None,
            children: Vec::new(),
        };
        let mut rest = entries;
        if entries[0].0.len() == common {
            spec.end = Some(entries[0].1.to_vec());
            rest = &entries[1..];
        }
        while let Some(((key, _), _)) = rest.split_first() {
            let label = key[common];
            // Sorted: the keys under one label are next to each other.
            let n = rest.partition_point(|(k, _)| k[common] == label);
            let group: Vec<Entry<'_>> = rest[..n]
                .iter()
                .map(|(k, v)| (&k[common + 1..], *v))
                .collect();
            let child = self.subtree(&group);
            spec.children.push((label, child));
            rest = &rest[n..];
        }
        self.build(&spec)
    }

    /// Frees the replaced nodes after the grace period (their
    /// replacements are published by now); a packed node, by freeing its
    /// slab once it was the slab's last.
    fn finish(self, guard: &Guard) {
        for word in self.retired {
            let bytes = Arc::clone(&self.map.counts.node_bytes);
            match self.packing.retire(word) {
                Retire::Node => {
                    let node = SendWord(word);
                    guard.defer(move || {
                        let node = node;
                        // SAFETY: unlinked before this was deferred, past
                        // its grace period now; freed once.
                        let size = unsafe { block::free(node.0) };
                        bytes.fetch_sub(size, Ordering::Relaxed);
                    });
                }
                Retire::Kept => {}
                Retire::Slab(slab) => guard.defer(move || {
                    bytes.fetch_sub(slab.size(), Ordering::Relaxed);
                    drop(slab);
                }),
            }
        }
    }
}

/// What retiring a node frees after the grace period.
enum Retire {
    /// The node itself (a heap node).
    Node,
    /// Nothing: it is packed, and its slab holds live nodes still.
    Kept,
    /// Its slab: it was the last live node there.
    Slab(Slab),
}

impl Packing {
    /// Retires `word`, an unlinked node of this subtree: a packed one
    /// counted out of its slab.
    fn retire(&mut self, word: u64) -> Retire {
        // SAFETY: a node just unlinked, still allocated.
        if !unsafe { Node::from_word(word) }.is_packed() {
            return Retire::Node;
        }
        let i = self.slabs.partition_point(|s| s.start() <= word as usize) - 1;
        debug_assert!(self.slabs[i].holds(word));
        if self.slabs[i].retire_one() {
            Retire::Slab(self.slabs.remove(i))
        } else {
            Retire::Kept
        }
    }
}

/// What a compaction replaced, freed in one deferred call.
struct Replaced {
    nodes: Vec<u64>,
    slabs: Vec<Slab>,
    bytes: Arc<AtomicUsize>,
}

// SAFETY: nodes are plain memory; only this batch frees them.
unsafe impl Send for Replaced {}

impl Drop for Replaced {
    fn drop(&mut self) {
        let mut freed = self.slabs.iter().map(Slab::size).sum::<usize>();
        self.slabs.clear();
        for &word in &self.nodes {
            // SAFETY: unlinked before this was deferred, past its grace
            // period now; freed once.
            freed += unsafe { block::free(word) };
        }
        self.bytes.fetch_sub(freed, Ordering::Relaxed);
    }
}

/// A node's word moved into a deferred free.
struct SendWord(u64);
// SAFETY: a node is plain memory; only its last owner frees it.
unsafe impl Send for SendWord {}

impl QpTrieMap {
    /// A map of keys up to `max_key_size` bytes (1 to 4096) and values of
    /// `value_size` bytes (at least 1), holding at most `max_entries`.
    pub fn new(max_key_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
        let limits = Limits::new(max_key_size, value_size, max_entries)?;
        Ok(QpTrieMap {
            roots: (0..256)
                .map(|_| Root {
                    top: AtomicU64::new(0),
                    writer: Mutex::new(Packing::default()),
                })
                .collect(),
            limits,
            map_flags: 0,
            counts: Counts::default(),
            buckets: BucketLimits {
                keys: BUCKET_KEYS,
                bytes: BUCKET_BYTES,
            },
        })
    }

    string_map_methods!();

    /// The same map with buckets of at most `keys` keys whose records
    /// (each key's rest past the bucket's skip, and its value) take at
    /// most `bytes` bytes; `keys` below 2 means no buckets (a node per
    /// branching point down to the leaves, as before buckets). The
    /// defaults are [`BUCKET_KEYS`] and [`BUCKET_BYTES`]: a write to a
    /// bucket copies it, so smaller buckets make writes cheaper and
    /// lookups slower. `EINVAL` past 255 keys or 65,535 bytes, or once
    /// the map holds keys.
    ///
    /// ```
    /// use bpfmaps::strmap::QpTrieMap;
    ///
    /// let churned = QpTrieMap::new(64, 8, 1_000_000).unwrap().with_buckets(32, 512).unwrap();
    /// assert_eq!(churned.bucket_limits(), (32, 512));
    /// ```
    pub fn with_buckets(mut self, keys: usize, bytes: usize) -> Result<Self> {
        if keys > 255 || bytes > usize::from(u16::MAX) {
            return Err(Error::invalid(format!(
                "buckets of {keys} keys and {bytes} bytes: at most 255 and 65535"
            )));
        }
        if !self.is_empty() {
            return Err(Error::invalid("buckets are sized before any key is stored"));
        }
        self.buckets = BucketLimits { keys, bytes };
        Ok(self)
    }

    /// The most keys, and bytes of records, a bucket holds.
    pub fn bucket_limits(&self) -> (usize, usize) {
        (self.buckets.keys, self.buckets.bytes)
    }

    /// The buckets `map_extra` asks for (0: the defaults; else bits 0-7
    /// the keys, bits 8-23 the bytes).
    pub(super) fn with_map_extra(self, extra: u64) -> Result<Self> {
        if extra == 0 {
            return Ok(self);
        }
        self.with_buckets((extra & 0xff) as usize, (extra >> 8 & 0xffff) as usize)
    }

    /// The `map_extra` it was created with.
    pub(super) fn map_extra(&self) -> u64 {
        if self.bucket_limits() == (BUCKET_KEYS, BUCKET_BYTES) {
            0
        } else {
            self.buckets.keys as u64 | (self.buckets.bytes as u64) << 8
        }
    }

    /// Bytes held: the map itself and its nodes (with those waiting out a
    /// grace period).
    pub fn memory_usage(&self) -> usize {
        size_of::<Self>()
            + self.roots.len() * size_of::<Root>()
            + self.counts.node_bytes.load(Ordering::Relaxed)
    }

    #[inline]
    fn top<'g>(&self, first: u8, _guard: &'g Guard) -> Option<Node<'g>> {
        let word = self.roots[first as usize].top.load(Ordering::Acquire);
        // SAFETY: a published top node, read under the guard.
        (word != 0).then(|| unsafe { Node::from_word(word) })
    }

    /// The value of `key`.
    #[inline]
    pub fn get<'g>(&'g self, key: &[u8], guard: &'g Guard) -> Option<&'g [u8]> {
        let (&first, mut rest) = key.split_first()?;
        let mut node = self.top(first, guard)?;
        loop {
            match node.step(rest, self.limits.value_size) {
                Step::Down(next, after) => {
                    // A small packed subtree is asked for whole on the way in
                    // (its nodes are back to back, and the lookup ends in
                    // it), so its nodes' misses overlap; any other node's
                    // second line too, while the first is on its way. (A
                    // heap node a write has put below since the compaction
                    // is outside the span: its lines are only not asked for.)
                    if !prefetched(node) {
                        match next.span_lines() {
                            lines @ 1..=PREFETCH_SUBTREE_LINES => next.prefetch_subtree(lines),
                            _ => next.prefetch(),
                        }
                    }
                    (node, rest) = (next, after)
                }
                Step::Done(value) => return value,
            }
        }
    }

    /// The values of `keys`, into `out[i]` for `keys[i]`: lookups run
    /// side by side in groups of [`LOOKUP_GROUP`], one node of each per round,
    /// so that the cache misses of different keys overlap (a lone lookup
    /// waits for one miss per node on its path). `EINVAL` if `out` is
    /// shorter than `keys`.
    ///
    /// ```
    /// use bpfmaps::strmap::QpTrieMap;
    /// use bpfmaps::{BPF_ANY, pin};
    ///
    /// let m = QpTrieMap::new(16, 4, 100).unwrap();
    /// m.insert(b"tcp", &6u32.to_ne_bytes(), BPF_ANY).unwrap();
    /// m.insert(b"udp", &17u32.to_ne_bytes(), BPF_ANY).unwrap();
    /// let guard = pin();
    /// let mut out = [None; 3];
    /// m.get_many(&[&b"udp"[..], b"icmp", b"tcp"], &guard, &mut out).unwrap();
    /// assert_eq!(out, [Some(&17u32.to_ne_bytes()[..]), None, Some(&6u32.to_ne_bytes()[..])]);
    /// ```
    pub fn get_many<'g, K: AsRef<[u8]>>(
        &'g self,
        keys: &[K],
        guard: &'g Guard,
        out: &mut [Option<&'g [u8]>],
    ) -> Result<()> {
        if out.len() < keys.len() {
            return Err(Error::invalid(format!(
                "{} keys but room for {} answers",
                keys.len(),
                out.len()
            )));
        }
        for (keys, out) in keys.chunks(LOOKUP_GROUP).zip(out.chunks_mut(LOOKUP_GROUP)) {
            self.get_group(keys, guard, out);
        }
        Ok(())
    }

    /// Up to [`LOOKUP_GROUP`] lookups in rounds: each round takes every lookup
    /// still going one node down and prefetches the node it reaches, which
    /// the next round reads.
    #[inline]
    fn get_group<'g, K: AsRef<[u8]>>(
        &'g self,
        keys: &[K],
        guard: &'g Guard,
        out: &mut [Option<&'g [u8]>],
    ) {
        let mut at: [Option<(Node<'g>, &[u8])>; LOOKUP_GROUP] = [None; LOOKUP_GROUP];
        for ((at, key), out) in at.iter_mut().zip(keys).zip(out.iter_mut()) {
            *out = None;
            if let Some((&first, rest)) = key.as_ref().split_first()
                && let Some(top) = self.top(first, guard)
            {
                top.prefetch();
                *at = Some((top, rest));
            }
        }
        let mut going = true;
        while going {
            going = false;
            for (at, out) in at.iter_mut().zip(out.iter_mut()) {
                let Some((node, rest)) = *at else { continue };
                match node.step(rest, self.limits.value_size) {
                    Step::Down(next, after) => {
                        next.prefetch();
                        *at = Some((next, after));
                        going = true;
                    }
                    Step::Done(value) => {
                        *out = value;
                        *at = None;
                    }
                }
            }
        }
    }

    /// The longest stored key that is a prefix of `key` (or `key` itself),
    /// with its value.
    pub fn longest_prefix_of<'k, 'g>(
        &'g self,
        key: &'k [u8],
        guard: &'g Guard,
    ) -> Option<(&'k [u8], &'g [u8])> {
        let (&first, mut rest) = key.split_first()?;
        let mut node = self.top(first, guard)?;
        let mut best = None;
        loop {
            let Some(after_skip) = bytes::strip_prefix(rest, node.skip()) else {
                return best;
            };
            rest = after_skip;
            let done = key.len() - rest.len();
            if node.is_bucket() {
                // Sorted: of the records that are prefixes of `rest`, each
                // extends the one before; the last is the longest.
                let mut found = best;
                for (tail, value) in node.bucket_entries(self.limits.value_size) {
                    if rest.starts_with(tail) {
                        found = Some((&key[..done + tail.len()], value));
                    }
                }
                return found;
            }
            if let Some(value) = node.end_value(self.limits.value_size) {
                best = Some((&key[..done], value));
            }
            let Some((&label, after)) = rest.split_first() else {
                return best;
            };
            let Some(i) = node.find(label) else {
                return best;
            };
            match node.child(i, self.limits.value_size) {
                Child::Node(next) => {
                    node = next;
                    rest = after;
                }
                Child::Leaf { tail, value } => {
                    return match after.strip_prefix(tail) {
                        Some(_) => Some((&key[..done + 1 + tail.len()], value)),
                        None => best,
                    };
                }
            }
        }
    }

    /// Stores `value` for `key` under update `flags` (`BPF_ANY`,
    /// `BPF_NOEXIST`, `BPF_EXIST`). `E2BIG` when a new key finds the map
    /// holding `max_entries`.
    pub fn insert(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
        let flag = UpdateFlag::from_bits(flags)?;
        self.check_key(key)?;
        check_len("value", value.len(), self.limits.value_size)?;
        let root = &self.roots[key[0] as usize];
        let mut packing = root.writer.lock();
        let guard = &pin();
        let mut write = Write {
            map: self,
            packing: &mut packing,
            retired: Vec::new(),
        };
        let top = root.top.load(Ordering::Acquire);
        let change = if top == 0 {
            flag.check(false)?;
            self.reserve()?;
            let spec = Spec {
                skip: key[1..].to_vec(),
                end: Some(value.to_vec()),
                children: Vec::new(),
            };
            Change::Swap(write.build(&spec))
        } else {
            // SAFETY: the published top, under the writer lock and guard.
            let node = unsafe { Node::from_word(top) };
            self.insert_at(&mut write, node, &key[1..], value, flag)?
        };
        if let Change::Swap(word) = change {
            root.top.store(word, Ordering::Release);
            if top != 0 {
                write.retired.push(top);
            }
        }
        write.finish(guard);
        Ok(())
    }

    /// Stores `rest` (the key after `node`'s place) in `node`'s subtree.
    fn insert_at(
        &self,
        write: &mut Write<'_>,
        node: Node<'_>,
        rest: &[u8],
        value: &[u8],
        flag: UpdateFlag,
    ) -> Result<Change> {
        if node.is_small() {
            return self.insert_small(write, node, rest, value, flag);
        }
        let skip = node.skip();
        let common = common_prefix(skip, rest);
        if common < skip.len() {
            // The key leaves the skip: a new node where they part, with
            // this one (shortened) and the key's leaf as children. (This
            // node's keys fill more than a bucket, so theirs and the new
            // key do too.)
            flag.check(false)?;
            self.reserve()?;
            let mut lower = Spec::of(node, self.limits.value_size);
            lower.skip.drain(..=common);
            let lower = ChildSpec::Node(write.build(&lower));
            let mut split = Spec {
                skip: skip[..common].to_vec(),
                end: None,
                children: vec![(skip[common], lower)],
            };
            match rest.get(common) {
                None => split.end = Some(value.to_vec()),
                Some(&label) => split.set_child(label, write.leaf(&rest[common + 1..], value)),
            }
            return Ok(Change::Swap(write.build(&split)));
        }
        let rest = &rest[common..];
        let Some((&label, after)) = rest.split_first() else {
            flag.check(node.has_end())?;
            if !node.has_end() {
                self.reserve()?;
            }
            let mut spec = Spec::of(node, self.limits.value_size);
            spec.end = Some(value.to_vec());
            return Ok(self.replaced(write, &spec));
        };
        let Some(i) = node.find(label) else {
            flag.check(false)?;
            self.reserve()?;
            let mut spec = Spec::of(node, self.limits.value_size);
            spec.set_child(label, write.leaf(after, value));
            return Ok(self.replaced(write, &spec));
        };
        match node.child(i, self.limits.value_size) {
            Child::Node(child) => {
                if let Change::Swap(word) = self.insert_at(write, child, after, value, flag)? {
                    node.slot(i).store(word, Ordering::Release);
                    write.retired.push(child.word());
                }
                Ok(Change::Keep)
            }
            Child::Leaf { tail, .. } if tail == after => {
                flag.check(true)?;
                let mut spec = Spec::of(node, self.limits.value_size);
                spec.set_child(label, write.leaf(after, value));
                Ok(self.replaced(write, &spec))
            }
            Child::Leaf { tail, value: old } => {
                // Two keys below `label`: a bucket (or a node where they
                // part, if they are too long for one).
                flag.check(false)?;
                self.reserve()?;
                let mut pair = [(tail, old), (after, value)];
                pair.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut spec = Spec::of(node, self.limits.value_size);
                spec.set_child(label, ChildSpec::Node(write.node_of(&pair)));
                Ok(self.replaced(write, &spec))
            }
        }
    }

    /// [`insert_at`](Self::insert_at) into a bucket or a node of one key:
    /// its keys with this one, rebuilt canonical (a bucket while they fit
    /// one, else a node above smaller buckets).
    fn insert_small(
        &self,
        write: &mut Write<'_>,
        node: Node<'_>,
        rest: &[u8],
        value: &[u8],
        flag: UpdateFlag,
    ) -> Result<Change> {
        if node.is_bucket()
            && let Some(change) = self.bucket_insert(write, node, rest, value, flag)?
        {
            return Ok(change);
        }
        let owned = self.entries_of(node, Vec::new());
        let mut entries = owned.entries();
        match entries.binary_search_by(|(k, _)| (*k).cmp(rest)) {
            Ok(i) => {
                flag.check(true)?;
                entries[i].1 = value;
            }
            Err(i) => {
                flag.check(false)?;
                self.reserve()?;
                entries.insert(i, (rest, value));
            }
        }
        Ok(Change::Swap(write.node_of(&entries)))
    }

    /// [`insert_small`](Self::insert_small) into a bucket that still fits
    /// its keys with this one: the new bucket is built from the old one's
    /// records, none copied out. `None` when they no longer fit one.
    fn bucket_insert(
        &self,
        write: &mut Write<'_>,
        node: Node<'_>,
        rest: &[u8],
        value: &[u8],
        flag: UpdateFlag,
    ) -> Result<Option<Change>> {
        let value_size = self.limits.value_size;
        let skip = node.skip();
        let common = common_prefix(skip, rest);
        // Every old key's rest gains what of the skip the new key does
        // not share; the new key's rest is what it has past the rest.
        let (head, new) = (&skip[common..], &rest[common..]);
        let bucket = node.bucket(value_size);
        let at = if head.is_empty() {
            bucket.search(new)
        } else if new < head {
            Err(0)
        } else {
            Err(bucket.len())
        };
        let count = bucket.len() + usize::from(at.is_err());
        let bytes = bucket.records_bytes()
            + bucket.len() * head.len()
            + at.map_or(new.len() + value_size, |_| 0);
        match at {
            Ok(_) => flag.check(true)?,
            Err(_) => flag.check(false)?,
        }
        if count > self.buckets.keys || bytes > self.buckets.bytes {
            return Ok(None);
        }
        if at.is_err() {
            self.reserve()?;
        }
        if head.is_empty() {
            let (at, removed) = match at {
                Ok(i) => (i, 1),
                Err(i) => (i, 0),
            };
            let (word, size) =
                block::splice_bucket(node, at, removed, Some((new, value)), value_size);
            return Ok(Some(Change::Swap(write.built(word, size))));
        }
        // The new key parts from the skip: every old rest gains the part
        // of the skip it does not share.
        let mut entries: Vec<Record<'_>> = (0..bucket.len())
            .map(|i| {
                let (tail, value) = bucket.record(i);
                Record { head, tail, value }
            })
            .collect();
        match at {
            Ok(i) => entries[i].value = value,
            Err(i) => entries.insert(i, Record::new(new, value)),
        }
        let (word, size) = block::build_bucket(&rest[..common], &entries);
        Ok(Some(Change::Swap(write.built(word, size))))
    }

    /// The keys of `node`'s subtree spelled from `prefix` on (the node's
    /// skip next), with their values, in order.
    fn entries_of(&self, node: Node<'_>, mut prefix: Vec<u8>) -> Keys {
        let mut out = Keys::default();
        collect(node, &mut prefix, self.limits.value_size, &mut out);
        out
    }

    /// `node` rebuilt as `spec`: the parent publishes it (and retires
    /// `node`, as on every change but `Keep`).
    fn replaced(&self, write: &mut Write<'_>, spec: &Spec) -> Change {
        Change::Swap(write.build(spec))
    }

    /// Removes `key`, copying its value into `out` if given. `ENOENT` if
    /// it is not stored.
    pub fn remove(&self, key: &[u8], out: Option<&mut [u8]>) -> Result<()> {
        self.check_key(key)?;
        if let Some(out) = &out {
            check_len("value", out.len(), self.limits.value_size)?;
        }
        let root = &self.roots[key[0] as usize];
        let mut packing = root.writer.lock();
        let guard = &pin();
        let top = root.top.load(Ordering::Acquire);
        if top == 0 {
            return Err(Error::NotFound);
        }
        let mut write = Write {
            map: self,
            packing: &mut packing,
            retired: Vec::new(),
        };
        // SAFETY: the published top, under the writer lock and guard.
        let node = unsafe { Node::from_word(top) };
        let word = match self.remove_at(&mut write, node, &key[1..], out)? {
            Change::Keep => None,
            Change::Swap(word) => Some(word),
            Change::Gone => Some(0),
            // A top node is never a leaf: it holds the key as its end.
            Change::Leaf { tail, value } => Some(write.build(&Spec {
                skip: tail,
                end: Some(value),
                children: Vec::new(),
            })),
        };
        if let Some(word) = word {
            root.top.store(word, Ordering::Release);
            write.retired.push(top);
        }
        self.counts.keys.fetch_sub(1, Ordering::Relaxed);
        write.finish(guard);
        Ok(())
    }

    fn remove_at(
        &self,
        write: &mut Write<'_>,
        node: Node<'_>,
        rest: &[u8],
        out: Option<&mut [u8]>,
    ) -> Result<Change> {
        if node.is_small() {
            return self.remove_small(write, node, rest, out);
        }
        let change = self.remove_below(write, node, rest, out)?;
        Ok(self.collapse(write, node, change))
    }

    /// [`remove_at`](Self::remove_at) from a bucket or a node of one key.
    fn remove_small(
        &self,
        write: &mut Write<'_>,
        node: Node<'_>,
        rest: &[u8],
        out: Option<&mut [u8]>,
    ) -> Result<Change> {
        if node.is_bucket() {
            return self.bucket_remove(write, node, rest, out);
        }
        let owned = self.entries_of(node, Vec::new());
        let mut entries = owned.entries();
        let i = entries
            .binary_search_by(|(k, _)| (*k).cmp(rest))
            .map_err(|_| Error::NotFound)?;
        let (_, value) = entries.remove(i);
        if let Some(out) = out {
            out.copy_from_slice(value);
        }
        Ok(write.small(&entries))
    }

    /// [`remove_small`](Self::remove_small) from a bucket: the rest of its
    /// records, their common prefix moved into the skip, or a leaf when
    /// one key is left.
    fn bucket_remove(
        &self,
        write: &mut Write<'_>,
        node: Node<'_>,
        rest: &[u8],
        out: Option<&mut [u8]>,
    ) -> Result<Change> {
        let skip = node.skip();
        let rest = bytes::strip_prefix(rest, skip).ok_or(Error::NotFound)?;
        let value_size = self.limits.value_size;
        let bucket = node.bucket(value_size);
        let i = bucket.search(rest).map_err(|_| Error::NotFound)?;
        if let Some(out) = out {
            out.copy_from_slice(bucket.record(i).1);
        }
        let n = bucket.len();
        if n == 2 {
            let (tail, value) = bucket.record(1 - i);
            return Ok(Change::Leaf {
                tail: [skip, tail].concat(),
                value: value.to_vec(),
            });
        }
        // The keys left may share more than the skip: it grows, and their
        // rests change; else the bucket is copied around the gap.
        let first = bucket.record(usize::from(i == 0)).0;
        let last = bucket.record(if i == n - 1 { n - 2 } else { n - 1 }).0;
        let extra = common_prefix(first, last);
        if extra == 0 {
            let (word, size) = block::splice_bucket(node, i, 1, None, value_size);
            return Ok(Change::Swap(write.built(word, size)));
        }
        let entries: Vec<Record<'_>> = (0..n)
            .filter(|&j| j != i)
            .map(|j| {
                let (r, v) = bucket.record(j);
                Record::new(&r[extra..], v)
            })
            .collect();
        let (word, size) = block::build_bucket(&[skip, &first[..extra]].concat(), &entries);
        Ok(Change::Swap(write.built(word, size)))
    }

    /// After a removal below `node` (`change` is what it asks of its
    /// parent): the subtree as one bucket if its keys now fit one, so the
    /// shape stays what a fresh build of the same keys has.
    fn collapse(&self, write: &mut Write<'_>, node: Node<'_>, change: Change) -> Change {
        let now = match change {
            Change::Keep => node,
            // SAFETY: just built, unpublished; this writer's own.
            Change::Swap(word) => unsafe { Node::from_word(word) },
            _ => return change,
        };
        if now.is_small() {
            return change;
        }
        // Cheap test first: a child that is a full node holds more keys
        // than a bucket does.
        let mut count = usize::from(now.has_end());
        for i in 0..now.len() {
            count += match now.child(i, self.limits.value_size) {
                Child::Leaf { .. } => 1,
                Child::Node(child) if child.is_small() => count_keys(child, self.limits.value_size),
                Child::Node(_) => return change,
            };
            if count > self.buckets.keys {
                return change;
            }
        }
        let owned = self.entries_of(now, Vec::new());
        let entries = owned.entries();
        if !fits(&entries, self.buckets) {
            return change;
        }
        for i in 0..now.len() {
            if let Some(child) = now.node_child(i) {
                write.retired.push(child.word());
            }
        }
        if let Change::Swap(word) = change {
            write.retired.push(word);
        }
        Change::Swap(write.node_of(&entries))
    }

    /// [`remove_at`](Self::remove_at) in a node with children.
    fn remove_below(
        &self,
        write: &mut Write<'_>,
        node: Node<'_>,
        rest: &[u8],
        out: Option<&mut [u8]>,
    ) -> Result<Change> {
        let rest = bytes::strip_prefix(rest, node.skip()).ok_or(Error::NotFound)?;
        let spec = match rest.split_first() {
            None => {
                let value = node
                    .end_value(self.limits.value_size)
                    .ok_or(Error::NotFound)?;
                if let Some(out) = out {
                    out.copy_from_slice(value);
                }
                let mut spec = Spec::of(node, self.limits.value_size);
                spec.end = None;
                spec
            }
            Some((&label, after)) => {
                let i = node.find(label).ok_or(Error::NotFound)?;
                match node.child(i, self.limits.value_size) {
                    Child::Node(child) => match self.remove_at(write, child, after, out)? {
                        Change::Keep => return Ok(Change::Keep),
                        Change::Swap(word) => {
                            node.slot(i).store(word, Ordering::Release);
                            write.retired.push(child.word());
                            return Ok(Change::Keep);
                        }
                        Change::Gone => {
                            write.retired.push(child.word());
                            let mut spec = Spec::of(node, self.limits.value_size);
                            spec.remove_child(label);
                            spec
                        }
                        Change::Leaf { tail, value } => {
                            write.retired.push(child.word());
                            let mut spec = Spec::of(node, self.limits.value_size);
                            spec.set_child(label, write.leaf(&tail, &value));
                            return Ok(self.replaced(write, &spec));
                        }
                    },
                    Child::Leaf { tail, value } => {
                        if tail != after {
                            return Err(Error::NotFound);
                        }
                        if let Some(out) = out {
                            out.copy_from_slice(value);
                        }
                        let mut spec = Spec::of(node, self.limits.value_size);
                        spec.remove_child(label);
                        spec
                    }
                }
            }
        };
        Ok(self.canonical(write, spec))
    }

    /// `spec` (a node that lost an entry) in canonical form: gone when
    /// empty, a leaf of its parent when it holds one key, merged into its
    /// only child when it has no end value.
    fn canonical(&self, write: &mut Write<'_>, mut spec: Spec) -> Change {
        match (spec.end.take(), spec.children.len()) {
            (None, 0) => Change::Gone,
            (Some(value), 0) => Change::Leaf {
                tail: spec.skip,
                value,
            },
            (None, 1) => {
                let (label, only) = spec.children.pop().expect("one child");
                let mut joined = spec.skip;
                joined.push(label);
                match only {
                    ChildSpec::Leaf { tail, value } => {
                        joined.extend_from_slice(&tail);
                        Change::Leaf {
                            tail: joined,
                            value,
                        }
                    }
                    ChildSpec::Node(word) => {
                        // SAFETY: a live child of the node being replaced.
                        let child = unsafe { Node::from_word(word) };
                        write.retired.push(word);
                        if child.is_small() {
                            let owned = self.entries_of(child, joined);
                            return write.small(&owned.entries());
                        }
                        let mut merged = Spec::of(child, self.limits.value_size);
                        joined.extend_from_slice(&merged.skip);
                        merged.skip = joined;
                        Change::Swap(write.build(&merged))
                    }
                }
            }
            (end, _) => {
                spec.end = end;
                Change::Swap(write.build(&spec))
            }
        }
    }

    /// Calls `f` with every key in `range` (byte order) and its value, in
    /// order, until it breaks.
    pub fn for_each_in<'g>(
        &'g self,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        guard: &'g Guard,
        mut f: impl FnMut(&[u8], &'g [u8]) -> ControlFlow<()>,
    ) {
        let mut key = KeyBuf::new(self.limits.max_key_size);
        let first = match range.0 {
            Bound::Included(k) | Bound::Excluded(k) => k.first().copied().unwrap_or(0),
            Bound::Unbounded => 0,
        };
        let whole = matches!(range, (Bound::Unbounded, Bound::Unbounded));
        for b in first..=255u8 {
            let Some(top) = self.top(b, guard) else {
                continue;
            };
            key.len = 0;
            key.push(b);
            let flow = if whole {
                self.walk::<false>(top, &mut key, range, &mut f)
            } else {
                self.walk::<true>(top, &mut key, range, &mut f)
            };
            if flow.is_break() {
                return;
            }
        }
    }

    /// Visits the keys of `node`'s subtree (whose path is `key`) in
    /// `range`, in order. `BOUNDED` false: the range is everything (no
    /// checks compiled in, for whole walks).
    fn walk<'g, const BOUNDED: bool>(
        &self,
        node: Node<'g>,
        key: &mut KeyBuf,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        f: &mut impl FnMut(&[u8], &'g [u8]) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        let at = key.len;
        let parts = node.parts(self.limits.value_size);
        key.extend(parts.skip);
        let (mut lower, upper) = range;
        if BOUNDED {
            // Where the subtree stands against the lower bound: all of it
            // below (skip it), all of it above (no more checks), or the
            // bound runs through it.
            match bound_vs_prefix(lower, key.get()) {
                Side::Below => {
                    key.len = at;
                    return ControlFlow::Continue(());
                }
                Side::Above => lower = Bound::Unbounded,
                Side::Inside => {}
            }
        }
        if node.is_bucket() {
            // The records are sorted: where the lower bound runs through
            // the bucket, a binary search finds the first not below it,
            // and none after it is.
            let mut first = 0;
            if let (true, Bound::Included(b) | Bound::Excluded(b)) = (BOUNDED, lower)
                && b.len() >= key.len
            {
                let bucket = node.bucket(self.limits.value_size);
                first = match bucket.search(&b[key.len..]) {
                    Ok(i) => i + usize::from(matches!(lower, Bound::Excluded(_))),
                    Err(i) => i,
                };
                lower = Bound::Unbounded;
            }
            for (rest, value) in node.bucket_entries_from(self.limits.value_size, first) {
                let before = key.len;
                key.extend(rest);
                visit::<BOUNDED, _>(key.get(), value, (lower, upper), f)?;
                key.len = before;
            }
            key.len = at;
            return ControlFlow::Continue(());
        }
        // A packed subtree is read front to back: the hardware prefetcher
        // is ahead of the walk there.
        let scattered = !node.is_packed();
        if scattered {
            node.prefetch_children();
        }
        if let Some(value) = parts.end {
            visit::<BOUNDED, _>(key.get(), value, (lower, upper), f)?;
        }
        // Where the lower bound runs through this node, the children
        // whose label is below its next byte hold only keys below it:
        // a seek (`get_next_key`, a walk going on from a key) starts at
        // the first child that can pass it instead of visiting each.
        let first = if BOUNDED {
            first_child_from(lower, key.len, parts.labels)
        } else {
            0
        };
        for (i, &label) in parts.labels.iter().enumerate().skip(first) {
            // The next child node's children, asked for a subtree ahead:
            // entering a node, the walk goes straight to its first child,
            // too soon for that node's own prefetch to help.
            if scattered && let Some(next) = node.node_child(i + 1) {
                next.prefetch_children();
            }
            key.push(label);
            match parts.child(i) {
                Child::Node(child) => self.walk::<BOUNDED>(child, key, (lower, upper), f)?,
                Child::Leaf { tail, value } => {
                    let before = key.len;
                    key.extend(tail);
                    visit::<BOUNDED, _>(key.get(), value, (lower, upper), f)?;
                    key.len = before;
                }
            }
            key.len -= 1;
        }
        key.len = at;
        ControlFlow::Continue(())
    }

    /// Every key and value, in order (copied keys; [`for_each`](Self::for_each)
    /// copies none).
    pub fn iter<'g>(&'g self, guard: &'g Guard) -> impl Iterator<Item = (Vec<u8>, &'g [u8])> {
        self.range::<&[u8]>(.., guard)
    }

    /// The keys in `range` with their values, in order.
    pub fn range<'g, K: AsRef<[u8]>>(
        &'g self,
        range: impl std::ops::RangeBounds<K>,
        guard: &'g Guard,
    ) -> impl Iterator<Item = (Vec<u8>, &'g [u8])> {
        let lower = range.start_bound().map(|k| k.as_ref().to_vec());
        let upper = range.end_bound().map(|k| k.as_ref().to_vec());
        Chunks {
            map: self,
            guard,
            lower,
            upper,
            buffered: std::collections::VecDeque::new(),
            done: false,
        }
    }

    /// The keys that start with `prefix`, with their values, in order.
    pub fn prefix<'g>(
        &'g self,
        prefix: &[u8],
        guard: &'g Guard,
    ) -> impl Iterator<Item = (Vec<u8>, &'g [u8])> {
        let upper = prefix_end(prefix);
        let lower = Bound::Included(prefix.to_vec());
        Chunks {
            map: self,
            guard,
            lower,
            upper: upper.map_or(Bound::Unbounded, Bound::Excluded),
            buffered: std::collections::VecDeque::new(),
            done: false,
        }
    }

    /// Removes every key. The nodes are freed on the reaper thread after a
    /// grace period, so this returns at once.
    pub fn clear(&self) {
        let guard = &pin();
        for root in self.roots.iter() {
            let mut packing = root.writer.lock();
            let top = root.top.swap(0, Ordering::AcqRel);
            if top == 0 {
                continue;
            }
            // SAFETY: just unlinked.
            let n = unsafe { count_keys(Node::from_word(top), self.limits.value_size) };
            self.counts.keys.fetch_sub(n, Ordering::Relaxed);
            let job = SubtreeFree {
                top,
                slabs: std::mem::take(&mut packing.slabs),
                value_size: self.limits.value_size,
                bytes: Arc::clone(&self.counts.node_bytes),
            };
            guard.defer(move || drop_in_background(job));
        }
    }

    /// Lays each subtree changed since its last compaction out again in
    /// one allocation, its nodes in the order an ordered walk reads them,
    /// so that the walk reads memory front to back instead of one
    /// scattered node after another (the nodes of a build one key at a
    /// time are as scattered as its inserts). Call it after a bulk load.
    /// Readers go on throughout (each subtree is copied and published
    /// whole, under its writer lock). It returns once the old nodes are
    /// freed: it waits for the readers that might hold them, as
    /// `synchronize_rcu()` does, and frees them itself, so a reader never
    /// pays for the free (called with a guard pinned, it cannot wait, and
    /// they are freed on the reaper thread after the grace period).
    /// Later writes allocate their nodes outside the slab,
    /// and a slab is freed when its last node is replaced, so a map
    /// rewritten since holds the slab's replaced nodes until then:
    /// compacting again returns them.
    ///
    /// ```
    /// use bpfmaps::strmap::QpTrieMap;
    /// use bpfmaps::{BPF_ANY, pin};
    ///
    /// let m = QpTrieMap::new(16, 1, 100).unwrap();
    /// for (i, k) in ["vfs_read", "vfs_write", "vfs_readv"].iter().enumerate() {
    ///     m.insert(k.as_bytes(), &[i as u8], BPF_ANY).unwrap();
    /// }
    /// m.compact();
    /// let keys: Vec<_> = m.iter(&pin()).map(|(k, _)| k).collect();
    /// assert_eq!(keys, [&b"vfs_read"[..], b"vfs_readv", b"vfs_write"]);
    /// ```
    pub fn compact(&self) {
        let mut replaced = Replaced {
            nodes: Vec::new(),
            slabs: Vec::new(),
            bytes: Arc::clone(&self.counts.node_bytes),
        };
        let guard = pin();
        for root in self.roots.iter() {
            let mut packing = root.writer.lock();
            let top = root.top.load(Ordering::Acquire);
            if top == 0 || !packing.changed {
                continue;
            }
            // SAFETY: the published top, under the writer lock and guard.
            let top_node = unsafe { Node::from_word(top) };
            let mut old = Vec::new();
            let words = subtree_nodes(top_node, &mut old);
            let mut slab = Slab::new(words, old.len());
            let mut at = 0;
            // SAFETY: the slab has room for every node of the subtree,
            // whose slots only this writer changes.
            let packed = unsafe { self.pack(top_node, &mut slab, &mut at) };
            debug_assert_eq!(at, words);
            self.counts
                .node_bytes
                .fetch_add(slab.size(), Ordering::Relaxed);
            root.top.store(packed, Ordering::Release);
            for word in old {
                match packing.retire(word) {
                    Retire::Node => replaced.nodes.push(word),
                    Retire::Kept => {}
                    Retire::Slab(slab) => replaced.slabs.push(slab),
                }
            }
            let i = packing.slabs.partition_point(|s| s.start() < slab.start());
            packing.slabs.insert(i, slab);
            packing.changed = false;
        }
        drop(guard);
        // The replaced nodes are freed here, on the caller's time, once
        // the readers that might hold them are gone; inside a pinned
        // caller, which cannot wait, on the reaper thread after the
        // grace period (never inside whichever reader runs a deferred
        // call).
        if !synchronize() {
            pin().defer(move || drop_in_background(replaced));
        }
    }

    /// Copies `node`'s subtree into `slab` from word `at` on, each node
    /// before its children and the children in order; returns the copy's
    /// word.
    ///
    /// # Safety
    /// The slab has room for the subtree from `at` on; the caller holds
    /// the subtree's writer lock.
    unsafe fn pack(&self, node: Node<'_>, slab: &mut Slab, at: &mut usize) -> u64 {
        // SAFETY: room for it (caller); no slot changes (writer lock).
        let word = unsafe { node.copy_packed(slab.at(*at)) };
        let start = *at;
        *at += node.size() / 8;
        // SAFETY: just written, unpublished.
        let copy = unsafe { Node::from_word(word) };
        for i in 0..node.len() {
            if let Some(child) = node.node_child(i) {
                // SAFETY: as above.
                let child = unsafe { self.pack(child, slab, at) };
                copy.slot(i).store(child, Ordering::Relaxed);
            }
        }
        // SAFETY: as above.
        unsafe { copy.set_span((*at - start) * 8) };
        word
    }
}

#[cfg(test)]
impl QpTrieMap {
    /// Every node reachable now, each subtree in walk order.
    fn all_nodes(&self, guard: &Guard) -> Vec<u64> {
        let mut all = Vec::new();
        for top in (0..=255u8).filter_map(|b| self.top(b, guard)) {
            subtree_nodes(top, &mut all);
        }
        all
    }

    /// Buckets reachable now, and the keys they hold.
    pub(super) fn bucket_keys(&self) -> (usize, usize) {
        let guard = &pin();
        // SAFETY: reachable nodes, under the guard.
        let buckets: Vec<_> = self
            .all_nodes(guard)
            .into_iter()
            .map(|w| unsafe { Node::from_word(w) })
            .filter(|n| n.is_bucket())
            .collect();
        (buckets.len(), buckets.iter().map(|n| n.bucket_len()).sum())
    }
    /// Bytes of the nodes reachable now (for tests of the shape).
    pub(super) fn live_bytes(&self) -> usize {
        fn sum(node: Node<'_>, value_size: usize) -> usize {
            node.size()
                + (0..node.len())
                    .map(|i| match node.child(i, value_size) {
                        Child::Node(child) => sum(child, value_size),
                        Child::Leaf { .. } => 0,
                    })
                    .sum::<usize>()
        }
        let guard = &pin();
        (0..=255u8)
            .filter_map(|b| self.top(b, guard))
            .map(|top| sum(top, self.limits.value_size))
            .sum()
    }

    /// Each subtree's nodes in walk order (each before its children):
    /// their addresses and whether they are packed.
    pub(super) fn node_words_in_walk_order(&self) -> Vec<Vec<(u64, bool)>> {
        let guard = &pin();
        (0..=255u8)
            .filter_map(|b| self.top(b, guard))
            .map(|top| {
                let mut words = Vec::new();
                subtree_nodes(top, &mut words);
                // SAFETY: reachable nodes, under the guard.
                let packed = |w: u64| unsafe { Node::from_word(w) }.is_packed();
                words.into_iter().map(|w| (w, packed(w))).collect()
            })
            .collect()
    }

    /// Reachable nodes whose recorded subtree span is wrong: a packed
    /// node whose subtree is all packed must have it back to back from its
    /// start, and its header must give that size in lines (0 past
    /// `MAX_SPAN_LINES`); a heap node's gives 0. (A write since the
    /// compaction may have put a heap node under a packed one, whose span
    /// is then a stale hint: it asks for lines no longer on the path.)
    pub(super) fn wrong_spans(&self) -> usize {
        let guard = &pin();
        self.all_nodes(guard)
            .into_iter()
            .filter(|&word| {
                // SAFETY: reachable nodes, under the guard.
                let node = unsafe { Node::from_word(word) };
                let mut below = Vec::new();
                let words = subtree_nodes(node, &mut below);
                let packed = |w: u64| {
                    // SAFETY: as above.
                    unsafe { Node::from_word(w) }.is_packed()
                };
                if !below.iter().all(|&w| packed(w)) {
                    return node.span_lines() != 0 && !node.is_packed();
                }
                let end = below.iter().map(|&w| {
                    // SAFETY: as above.
                    w + unsafe { Node::from_word(w) }.size() as u64
                });
                let back_to_back = end.max() == Some(word + 8 * words as u64);
                let lines = (words * 8).div_ceil(64);
                let want = if node.is_packed() && lines <= block::MAX_SPAN_LINES {
                    lines
                } else {
                    0
                };
                node.span_lines() != want || (node.is_packed() && !back_to_back)
            })
            .count()
    }

    /// Keys reachable now, counted in the nodes.
    pub(super) fn counted_keys(&self) -> usize {
        let guard = &pin();
        (0..=255u8)
            .filter_map(|b| self.top(b, guard))
            .map(|top| count_keys(top, self.limits.value_size))
            .sum()
    }
}

/// Iterates a range in chunks: each refill walks from the last key seen
/// (O(depth) to get back there) and buffers up to a chunk of keys.
struct Chunks<'a, 'g> {
    map: &'a QpTrieMap,
    guard: &'g Guard,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    buffered: std::collections::VecDeque<(Vec<u8>, &'g [u8])>,
    done: bool,
}

const CHUNK: usize = 64;

impl<'g> Iterator for Chunks<'g, 'g> {
    type Item = (Vec<u8>, &'g [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.buffered.is_empty() && !self.done {
            let upper = self.upper.as_ref().map(Vec::as_slice);
            let lower = self.lower.as_ref().map(Vec::as_slice);
            let buffered = &mut self.buffered;
            self.map.for_each_in((lower, upper), self.guard, |k, v| {
                buffered.push_back((k.to_vec(), v));
                if buffered.len() == CHUNK {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            match self.buffered.back() {
                Some((last, _)) if self.buffered.len() == CHUNK => {
                    self.lower = Bound::Excluded(last.clone());
                }
                _ => self.done = true,
            }
        }
        self.buffered.pop_front()
    }
}

/// A detached subtree, freed whole (after its grace period): its own
/// nodes one by one, then the slabs that hold its packed ones.
struct SubtreeFree {
    top: u64,
    slabs: Vec<Slab>,
    value_size: usize,
    bytes: Arc<AtomicUsize>,
}

impl Drop for SubtreeFree {
    fn drop(&mut self) {
        // SAFETY: detached and past its grace period (or the map is
        // dropped); each node is freed once.
        let mut freed = unsafe { free_subtree(self.top, self.value_size) };
        freed += self.slabs.iter().map(Slab::size).sum::<usize>();
        self.slabs.clear();
        self.bytes.fetch_sub(freed, Ordering::Relaxed);
    }
}

impl Drop for QpTrieMap {
    fn drop(&mut self) {
        for root in self.roots.iter_mut() {
            let top = *root.top.get_mut();
            if top != 0 {
                drop_in_background(SubtreeFree {
                    top,
                    slabs: std::mem::take(&mut root.writer.get_mut().slabs),
                    value_size: self.limits.value_size,
                    bytes: Arc::clone(&self.counts.node_bytes),
                });
            }
        }
    }
}

/// Frees a subtree's nodes but the packed ones (their slabs are freed
/// whole); returns the bytes freed.
///
/// # Safety
/// No reader can reach it, and it is freed once.
unsafe fn free_subtree(word: u64, value_size: usize) -> usize {
    // SAFETY: caller.
    let node = unsafe { Node::from_word(word) };
    let mut freed = 0;
    for i in 0..node.len() {
        if let Child::Node(child) = node.child(i, value_size) {
            // SAFETY: a child of a detached subtree.
            freed += unsafe { free_subtree(child.word(), value_size) };
        }
    }
    if !node.is_packed() {
        // SAFETY: caller.
        freed += unsafe { block::free(word) };
    }
    freed
}

/// The words `node`'s subtree takes; pushes its nodes' words to `nodes`,
/// each node before its children (walk order).
fn subtree_nodes(node: Node<'_>, nodes: &mut Vec<u64>) -> usize {
    nodes.push(node.word());
    let mut words = node.size() / 8;
    for i in 0..node.len() {
        if let Some(child) = node.node_child(i) {
            words += subtree_nodes(child, nodes);
        }
    }
    words
}

fn count_keys(node: Node<'_>, value_size: usize) -> usize {
    if node.is_bucket() {
        return node.bucket_len();
    }
    usize::from(node.has_end())
        + (0..node.len())
            .map(|i| match node.child(i, value_size) {
                Child::Node(child) => count_keys(child, value_size),
                Child::Leaf { .. } => 1,
            })
            .sum::<usize>()
}

/// A key below some node as a writer handles it: its rest from that
/// node's place on, and its value.
type Entry<'a> = (&'a [u8], &'a [u8]);

/// Keys a writer took out of a subtree, with their values: their bytes
/// in one buffer (a burst or a collapse handles up to a bucket's worth,
/// one allocation each would cost more than the rebuild).
#[derive(Default)]
struct Keys {
    bytes: Vec<u8>,
    /// Each key's start, length and its value's length.
    spans: Vec<(usize, usize, usize)>,
}

impl Keys {
    fn push(&mut self, key: &[&[u8]], value: &[u8]) {
        let start = self.bytes.len();
        for piece in key {
            self.bytes.extend_from_slice(piece);
        }
        let key_len = self.bytes.len() - start;
        self.bytes.extend_from_slice(value);
        self.spans.push((start, key_len, value.len()));
    }

    fn entries(&self) -> Vec<Entry<'_>> {
        self.spans
            .iter()
            .map(|&(start, key, value)| self.bytes[start..start + key + value].split_at(key))
            .collect()
    }
}

/// Whether `entries` (sorted) make one bucket: few enough keys, and few
/// enough bytes past their common prefix.
fn fits(entries: &[Entry<'_>], limits: BucketLimits) -> bool {
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
        return false;
    };
    let common = common_prefix(first.0, last.0);
    entries.len() <= limits.keys
        && entries
            .iter()
            .map(|(k, v)| k.len() - common + v.len())
            .sum::<usize>()
            <= limits.bytes
}

/// Appends the keys of `node`'s subtree to `out`, each spelled from
/// `prefix` (the node's skip next), with their values, in order.
fn collect(node: Node<'_>, prefix: &mut Vec<u8>, value_size: usize, out: &mut Keys) {
    let at = prefix.len();
    prefix.extend_from_slice(node.skip());
    if node.is_bucket() {
        for (rest, value) in node.bucket_entries(value_size) {
            out.push(&[prefix, rest], value);
        }
    } else {
        if let Some(end) = node.end_value(value_size) {
            out.push(&[prefix], end);
        }
        for (i, &label) in node.labels().iter().enumerate() {
            prefix.push(label);
            match node.child(i, value_size) {
                Child::Node(child) => collect(child, prefix, value_size, out),
                Child::Leaf { tail, value } => out.push(&[prefix, tail], value),
            }
            prefix.pop();
        }
    }
    prefix.truncate(at);
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The first key after every key that starts with `prefix` (`None`: no
/// such key, the prefix is all 0xff).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The key a walk is at, spelled out of its path: a buffer as long as
/// the longest key, so that appending is a copy (`bytes::copy`, no
/// `memcpy` call for short pieces) and no capacity check.
struct KeyBuf {
    bytes: Box<[u8]>,
    len: usize,
}

impl KeyBuf {
    fn new(max_key_size: usize) -> Self {
        KeyBuf {
            bytes: vec![0; max_key_size].into_boxed_slice(),
            len: 0,
        }
    }

    #[inline(always)]
    fn get(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    #[inline(always)]
    fn push(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    #[inline(always)]
    fn extend(&mut self, piece: &[u8]) {
        let end = self.len + piece.len();
        bytes::copy(&mut self.bytes[self.len..end], piece);
        self.len = end;
    }
}

/// Largest packed subtree a lookup asks for whole on entering it, in
/// cache lines. Chosen by timings of lookups of the shared key sets in a
/// scratch program: 16 lines took English words from 325-349 to 293-339
/// ns per lookup and left kernel symbols and paths within the noise (8
/// lines gained less; 32 and 64 no more).
const PREFETCH_SUBTREE_LINES: usize = 16;

/// Whether a lookup asked for `node`'s subtree whole on its way in, so
/// every node below it is on its way already.
#[inline(always)]
fn prefetched(node: Node<'_>) -> bool {
    (1..=PREFETCH_SUBTREE_LINES).contains(&node.span_lines())
}

/// `f` of a key the walk reached, if it is in `range` (`BOUNDED` false:
/// the range is everything); breaks past its upper bound.
#[inline(always)]
fn visit<'g, const BOUNDED: bool, F>(
    key: &[u8],
    value: &'g [u8],
    (lower, upper): (Bound<&[u8]>, Bound<&[u8]>),
    f: &mut F,
) -> ControlFlow<()>
where
    F: FnMut(&[u8], &'g [u8]) -> ControlFlow<()>,
{
    if BOUNDED {
        if above(key, upper) {
            return ControlFlow::Break(());
        }
        if below(key, lower) {
            return ControlFlow::Continue(());
        }
    }
    f(key, value)
}

/// The index of the first of a node's sorted `labels` (at byte `depth` of
/// its keys) that can lead to a key not below `lower`, where `lower` runs
/// through the node (its path is `lower`'s first `depth` bytes) or is
/// behind it.
fn first_child_from(lower: Bound<&[u8]>, depth: usize, labels: &[u8]) -> usize {
    match lower {
        Bound::Included(b) | Bound::Excluded(b) if b.len() > depth => {
            labels.partition_point(|&label| label < b[depth])
        }
        _ => 0,
    }
}

/// Whether `key` is before the `lower` bound.
fn below(key: &[u8], lower: Bound<&[u8]>) -> bool {
    match lower {
        Bound::Included(b) => key < b,
        Bound::Excluded(b) => key <= b,
        Bound::Unbounded => false,
    }
}

/// Whether `key` is past the `upper` bound.
fn above(key: &[u8], upper: Bound<&[u8]>) -> bool {
    match upper {
        Bound::Included(b) => key > b,
        Bound::Excluded(b) => key >= b,
        Bound::Unbounded => false,
    }
}

/// Where every key that starts with `prefix` stands against a lower bound.
enum Side {
    Below,
    Above,
    Inside,
}

fn bound_vs_prefix(lower: Bound<&[u8]>, prefix: &[u8]) -> Side {
    let b = match lower {
        Bound::Included(b) | Bound::Excluded(b) => b,
        Bound::Unbounded => return Side::Above,
    };
    let n = prefix.len().min(b.len());
    match prefix[..n].cmp(&b[..n]) {
        CmpOrdering::Less => Side::Below,
        CmpOrdering::Greater => Side::Above,
        // The prefix extends the bound: every key here is longer than it.
        CmpOrdering::Equal if prefix.len() > b.len() => Side::Above,
        CmpOrdering::Equal => Side::Inside,
    }
}
