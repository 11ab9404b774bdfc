//! The engine of one-field prefix schemas (geoIP, routing by priority):
//! an [`LpmTrie`] whose every stored prefix answers with the best rule
//! among its own and its ancestors'.
//!
//! A packet matches exactly the rules whose prefix contains its address:
//! the rules of the stored prefixes on one path from the root. If each
//! stored prefix holds the best rule of its own and of every stored
//! prefix above it ("its best"), the longest stored prefix containing
//! the address holds the answer, and a classification is one LPM lookup.
//! With priorities that favour longer prefixes (geoIP's `bits - length`)
//! a prefix's best is its own; with any others a short prefix's rule may
//! be the best of a whole subtree, and the index holds that too.
//!
//! What the trie holds for a prefix, in its value: the best rule's entry
//! (a pointer), the prefix's own rules (a pointer, for exact-rule
//! lookups) and the best rule's value bytes, so that a classification
//! reads no memory past the trie's route slot. That slot is one more
//! cache miss after the trie's walk (most of a lookup's time in a table
//! of a million prefixes), so with values of up to 4 bytes a second trie
//! holds only the best rule's value, inline in its leaves, for
//! [`classify_as`](PrefixIndex::classify_as): a geoIP lookup is then an
//! LPM lookup.
//!
//! Updates: one writer (a mutex), which keeps every stored prefix's own
//! rules in a `BTreeMap` ordered by (address, length), where a prefix
//! comes before everything under it. A change to a prefix's rules walks
//! its subtree in that order with a stack of the bests above, rewriting
//! each prefix whose best changed and skipping every subtree whose root's
//! best did not. Its cost is the prefixes whose answer changed: one, for
//! a rule that beats nothing below it. Readers take no lock: each
//! rewrite is one value swap in the trie, so a classification sees each
//! prefix's answer as before the update or as after it; entries and
//! rule lists are freed after the epoch's grace period.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::Arc;

use parking_lot::Mutex;

use super::chain::Entry;
use super::map::{Placed, count_fresh};
use super::schema::{Field, Packet, Rule};
use crate::core::error::{Error, Result};
use crate::core::flags::UpdateFlag;
use crate::core::reclaim::{Guard, drop_in_background, pin};
use crate::lpm::{LpmTrie, Value};

/// A stored prefix: its address (host bits zero) and length.
type Key = (u128, u8);

/// Addresses a batch's lookups hand the trie at once (its own group).
const GROUP: usize = 32;

/// Bytes before the value in the trie's: the best entry's address, the
/// rule list's address and length.
const HEADER: usize = 24;

/// A stored prefix as the writer keeps it.
struct Prefix {
    /// Its rules, best first (rule order). Never empty.
    rules: Arc<[Arc<Entry>]>,
    /// The best of its rules and its ancestors' that the trie holds;
    /// `None` before it is first published.
    best: Option<Arc<Entry>>,
    /// Its rules changed since the trie's value was written.
    dirty: bool,
}

#[derive(Default)]
struct Writer {
    prefixes: BTreeMap<Key, Prefix>,
    /// Every rule, in rule order (`next_rule`, flags).
    placed: BTreeSet<Placed>,
}

/// Entries and rule lists no reader can reach once an update is done.
#[derive(Default)]
struct Retired {
    entries: Vec<Arc<Entry>>,
    lists: Vec<Arc<[Arc<Entry>]>>,
}

impl Retired {
    /// Frees them after the grace period of the readers pinned now.
    fn defer(self) {
        if !self.entries.is_empty() || !self.lists.is_empty() {
            pin().defer(move || drop(self));
        }
    }
}

pub(super) struct PrefixIndex {
    bits: u32,
    bytes: usize,
    value_size: usize,
    trie: LpmTrie,
    /// Each prefix's best value alone, when values fit a trie's leaves.
    values: Option<LpmTrie>,
    writer: Mutex<Writer>,
}

impl PrefixIndex {
    /// An index for rules on `field` (a prefix field) with values of
    /// `value_size` bytes, up to `max_entries` of them.
    pub(super) fn new(field: &Field, value_size: usize, max_entries: u32) -> Result<Self> {
        // A rewrite takes a new route slot and frees the old one a grace
        // period later; the trie keeps as many slots again as prefixes for
        // that, so even an update that rewrites every prefix finds room.
        let trie = LpmTrie::new(field.size, HEADER + value_size, max_entries)?;
        let values = (value_size <= 4)
            .then(|| LpmTrie::new(field.size, value_size, max_entries))
            .transpose()?;
        Ok(PrefixIndex {
            bits: field.bits(),
            bytes: field.size,
            value_size,
            trie,
            values,
            writer: Mutex::default(),
        })
    }

    /// The field's value as the trie's key bytes (network order): the
    /// bytes of the result from the index returned.
    fn data(&self, value: u128) -> ([u8; 16], usize) {
        (value.to_be_bytes(), 16 - self.bytes)
    }

    /// A packet's value as [`data`](Self::data) does, or `None` when it
    /// is wider than the field (it matches no rule).
    #[inline(always)]
    fn address(&self, value: u128) -> Option<([u8; 16], usize)> {
        (value >> (self.bits - 1) >> 1 == 0).then(|| self.data(value))
    }

    /// The stored prefix whose key bytes (the field's size) are `data`.
    fn key_at(&self, data: &[u8], prefixlen: u32) -> Key {
        let mut addr = [0u8; 16];
        addr[16 - self.bytes..].copy_from_slice(data);
        (u128::from_be_bytes(addr), prefixlen as u8)
    }

    /// What the trie holds for exactly `key`.
    fn stored<'g>(&'g self, key: Key, guard: &'g Guard) -> Option<Value<'g>> {
        let (buf, at) = self.data(key.0);
        self.trie.exact(&buf[at..], u32::from(key.1), guard)
    }

    fn key_of(&self, rule: &Rule) -> Key {
        let (lo, hi) = rule.bounds()[0];
        let host_bits = 128 - (lo ^ hi).leading_zeros();
        (lo, (self.bits - host_bits) as u8)
    }

    /// The last address under `key`.
    fn end_of(&self, key: Key) -> u128 {
        let host_bits = self.bits - u32::from(key.1);
        key.0 | u128::MAX.checked_shr(128 - host_bits).unwrap_or(0)
    }

    /// The best rule matching `value`, with its value.
    #[inline]
    pub(super) fn classify<'g>(
        &self,
        value: u128,
        guard: &'g Guard,
    ) -> Option<(&'g Rule, &'g [u8])> {
        let (buf, at) = self.address(value)?;
        Self::answer(self.trie.get(&buf[at..], guard)?)
    }

    /// [`classify`](Self::classify) of each packet's value into `out`
    /// (as long or longer), [`GROUP`] at a time through
    /// [`classify_group`](Self::classify_group).
    pub(super) fn classify_many<'g>(
        &self,
        packets: &[Packet],
        guard: &'g Guard,
        out: &mut [Option<(&'g Rule, &'g [u8])>],
    ) {
        let mut bufs = [[0u8; 16]; GROUP];
        for (group, outs) in packets.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
            let mut addrs: [&[u8]; GROUP] = [&[]; GROUP];
            for ((addr, buf), p) in addrs.iter_mut().zip(&mut bufs).zip(group) {
                // A value wider than the field keeps an empty address,
                // which the trie answers with `None`.
                if let Some((data, at)) = self.address(p.values[0]) {
                    *buf = data;
                    *addr = &buf[at..];
                }
            }
            self.classify_group(&addrs[..group.len()], guard, outs);
        }
    }

    /// [`classify_many`](Self::classify_many) of keys: the field's bytes,
    /// `keys.len()` a multiple of its size.
    pub(super) fn classify_many_keys<'g>(
        &self,
        keys: &[u8],
        guard: &'g Guard,
        out: &mut [Option<(&'g Rule, &'g [u8])>],
    ) {
        for (group, outs) in keys.chunks(GROUP * self.bytes).zip(out.chunks_mut(GROUP)) {
            let mut addrs: [&[u8]; GROUP] = [&[]; GROUP];
            let n = group.len() / self.bytes;
            for (addr, key) in addrs.iter_mut().zip(group.chunks_exact(self.bytes)) {
                *addr = key;
            }
            self.classify_group(&addrs[..n], guard, outs);
        }
    }

    /// Up to [`GROUP`] addresses through the trie's staged `get_many`:
    /// the lookups overlap their cache misses, where a loop of
    /// `classify` overlaps what the CPU's reorder window holds.
    #[inline(always)]
    fn classify_group<'g>(
        &self,
        addrs: &[&[u8]],
        guard: &'g Guard,
        out: &mut [Option<(&'g Rule, &'g [u8])>],
    ) {
        let mut found = [None; GROUP];
        let found = &mut found[..addrs.len()];
        self.trie
            .get_many(addrs, guard, found)
            .expect("room for each answer");
        for (o, f) in out.iter_mut().zip(found.iter()) {
            *o = f.and_then(Self::answer);
        }
    }

    /// The best rule and its value from what the trie holds for a
    /// prefix: its route slot (`None` for anything else), for as long as
    /// the caller's guard (`'g`), where the trie lends it for as long as
    /// the trie's borrow.
    #[inline(always)]
    fn answer<'g>(found: Value<'_>) -> Option<(&'g Rule, &'g [u8])> {
        let Value::Slot(bytes) = found else {
            return None;
        };
        let best = std::ptr::with_exposed_provenance::<Entry>(word(bytes, 0));
        let value = &bytes[HEADER..];
        // SAFETY: the trie's value names a live entry (retired a grace
        // period after no value names it) and the guard is pinned; the
        // route slot is the trie's and lives as long (a replaced slot is
        // reused only after the grace period).
        unsafe {
            Some((
                &(*best).rule,
                std::slice::from_raw_parts(value.as_ptr(), value.len()),
            ))
        }
    }

    /// The best matching rule's value, copied out as a `V` of the value
    /// size (the caller checks it): from the trie of values when there is
    /// one, without the route slot's load.
    #[inline(always)]
    pub(super) fn classify_as<V: bytemuck::Pod>(&self, value: u128, guard: &Guard) -> Option<V> {
        let Some(values) = &self.values else {
            return self
                .classify(value, guard)
                .map(|(_, v)| bytemuck::pod_read_unaligned(v));
        };
        let (buf, at) = self.address(value)?;
        values.get_as(&buf[at..], guard)
    }

    /// The value of exactly `rule`.
    pub(super) fn get<'g>(&self, rule: &Rule, guard: &'g Guard) -> Option<&'g [u8]> {
        let bytes = self.stored(self.key_of(rule), guard)?;
        let list = std::ptr::slice_from_raw_parts(
            std::ptr::with_exposed_provenance::<Arc<Entry>>(word(&bytes, 8)),
            word(&bytes, 16),
        );
        // SAFETY: as in `classify`: a list the trie names is retired a
        // grace period after no value names it.
        let rules: &'g [Arc<Entry>] = unsafe { &*list };
        rules.iter().find(|e| e.rule == *rule).map(|e| &*e.value)
    }

    /// The first rule after `after` in rule order (`None`: the first).
    pub(super) fn next_rule(&self, after: Option<&Rule>) -> Option<Rule> {
        let w = self.writer.lock();
        let lower = after.map_or(Unbounded, Excluded);
        w.placed
            .range::<Rule, _>((lower, Unbounded))
            .next()
            .map(|p| p.0.rule.clone())
    }

    /// Every rule with its value, in rule order.
    pub(super) fn rules(&self) -> Vec<(Rule, Vec<u8>)> {
        let w = self.writer.lock();
        w.placed
            .iter()
            .map(|p| (p.0.rule.clone(), p.0.value.to_vec()))
            .collect()
    }

    /// Stores `value` for `rule` under `flag`; `E2BIG` past `max_entries`
    /// rules. True when the rule is new.
    pub(super) fn insert(
        &self,
        rule: &Rule,
        value: &[u8],
        flag: UpdateFlag,
        max_entries: usize,
    ) -> Result<bool> {
        let mut w = self.writer.lock();
        let held = w.placed.contains(rule);
        flag.check(held)?;
        if !held && w.placed.len() >= max_entries {
            return Err(Error::Full);
        }
        let mut retired = Retired::default();
        let key = self.key_of(rule);
        w.put(key, Entry::shared(rule, value), &mut retired);
        self.refresh(&mut w, key);
        drop(w);
        retired.defer();
        Ok(!held)
    }

    /// Stores every entry of `given` (in rule order, a rule once) under
    /// `flag`, all or nothing ([`count_fresh`]); readers see them appear
    /// one prefix at a time. Returns how many were new.
    pub(super) fn load(
        &self,
        given: Vec<Arc<Entry>>,
        flag: UpdateFlag,
        max_entries: usize,
    ) -> Result<usize> {
        let mut w = self.writer.lock();
        let fresh = count_fresh(
            given.iter().map(|e| &e.rule),
            flag,
            |r| w.placed.contains(r),
            w.placed.len(),
            max_entries,
        )?;
        let mut retired = Retired::default();
        let mut touched = BTreeSet::new();
        for entry in given {
            let key = self.key_of(&entry.rule);
            w.put(key, entry, &mut retired);
            touched.insert(key);
        }
        // In (address, length) order a prefix's ancestors are refreshed
        // before it, so each refresh starts from their final bests.
        for key in touched {
            self.refresh(&mut w, key);
        }
        drop(w);
        retired.defer();
        Ok(fresh)
    }

    /// Removes `rule` and returns its value; `ENOENT` if it is not held.
    pub(super) fn take(&self, rule: &Rule) -> Result<Vec<u8>> {
        let mut w = self.writer.lock();
        let placed = w.placed.take(rule).ok_or(Error::NotFound)?;
        let key = self.key_of(rule);
        let mut retired = Retired::default();
        let prefix = w.prefixes.get_mut(&key).expect("a placed rule's prefix");
        let rules: Vec<Arc<Entry>> = prefix
            .rules
            .iter()
            .filter(|e| e.rule != *rule)
            .cloned()
            .collect();
        retired.entries.push(Arc::clone(&placed.0));
        if rules.is_empty() {
            let gone = w.prefixes.remove(&key).expect("the prefix");
            retired.lists.push(gone.rules);
            let (buf, at) = self.data(key.0);
            for trie in std::iter::once(&self.trie).chain(&self.values) {
                trie.remove(&buf[at..], u32::from(key.1), None)
                    .expect("a stored prefix is in the tries");
            }
        } else {
            let old = std::mem::replace(&mut prefix.rules, rules.into());
            retired.lists.push(old);
            prefix.dirty = true;
        }
        self.refresh(&mut w, key);
        drop(w);
        retired.defer();
        Ok(placed.0.value.to_vec())
    }

    /// Removes every rule; `then` runs before the writer lock is let go.
    pub(super) fn clear(&self, then: impl FnOnce()) {
        let mut w = self.writer.lock();
        self.trie.clear();
        if let Some(values) = &self.values {
            values.clear();
        }
        let old = std::mem::take(&mut *w);
        then();
        drop(w);
        // A huge map's books are freed on the reaper thread, after the
        // readers that may still hold their entries.
        pin().defer(move || drop_in_background(old));
    }

    /// Bytes held: the trie, the writer's books, the entries (an estimate
    /// from sizes, not the allocator's count).
    pub(super) fn memory_usage(&self) -> usize {
        use std::mem::size_of;
        let w = self.writer.lock();
        let rules = w.placed.len();
        let prefixes = w.prefixes.len();
        // A B-tree's entry (key and value, about 1.5 slots a key), a rule
        // list (its header and pointers), an entry (its header, rule
        // intervals and value).
        let per_prefix = 3 * size_of::<(Key, Prefix)>() / 2 + 16 + size_of::<usize>();
        let per_rule = size_of::<Arc<Entry>>()
            + 16
            + size_of::<Entry>()
            + 32
            + Entry::value_bytes_outside(self.value_size)
            + 3 * size_of::<Placed>() / 2;
        let values = self.values.as_ref().map_or(0, LpmTrie::memory_usage);
        self.trie.memory_usage() + values + prefixes * per_prefix + rules * per_rule
    }

    /// Rewrites what the trie holds for `key` and under it where the best
    /// changed (or the rules of a `dirty` prefix did).
    fn refresh(&self, w: &mut Writer, key: Key) {
        let inherited = self.inherited(w, key);
        let end = self.end_of(key);
        // The bests of the refreshed prefixes above the current one, with
        // the last address under each.
        let mut above: Vec<(u128, Arc<Entry>)> = Vec::new();
        let mut from = Included(key);
        while let Some((&k, prefix)) = w
            .prefixes
            .range_mut((from, Included((end, u8::MAX))))
            .next()
        {
            while above.last().is_some_and(|&(last, _)| k.0 > last) {
                above.pop();
            }
            let parent = above.last().map(|(_, e)| e).or(inherited.as_ref());
            let best = best_of(&prefix.rules, parent);
            let changed = !prefix.best.as_ref().is_some_and(|b| Arc::ptr_eq(b, &best));
            if changed || prefix.dirty {
                self.publish(k, &prefix.rules, &best);
                prefix.dirty = false;
                prefix.best = Some(Arc::clone(&best));
            }
            let last = self.end_of(k);
            if changed {
                above.push((last, best));
                from = Excluded(k);
            } else {
                // Nothing under it changes: its best is theirs to inherit.
                from = Excluded((last, u8::MAX));
            }
        }
    }

    /// The best of the nearest stored prefix above `key`.
    fn inherited(&self, w: &Writer, key: Key) -> Option<Arc<Entry>> {
        if key.1 == 0 {
            return None;
        }
        let (buf, at) = self.data(key.0);
        let guard = &pin();
        let above = self
            .trie
            .covering(&buf[at..], u32::from(key.1) - 1, guard)
            .expect("a valid prefix")
            .pop()?;
        w.prefixes[&self.key_at(&above.data, above.prefixlen)]
            .best
            .clone()
    }

    /// Writes the trie's value for `key`: `best` and `rules`.
    fn publish(&self, key: Key, rules: &Arc<[Arc<Entry>]>, best: &Arc<Entry>) {
        let mut value = Vec::with_capacity(HEADER + self.value_size);
        value.extend_from_slice(&to_word(Arc::as_ptr(best).expose_provenance()));
        value.extend_from_slice(&to_word(
            Arc::as_ptr(rules).cast::<Arc<Entry>>().expose_provenance(),
        ));
        value.extend_from_slice(&to_word(rules.len()));
        value.extend_from_slice(&best.value);
        let (buf, at) = self.data(key.0);
        loop {
            // `EBUSY`: every route slot is live or waits out a grace
            // period behind a reader pinned all along; wait for it, as
            // `synchronize_rcu` would (only the writer waits).
            match self.trie.insert(&buf[at..], u32::from(key.1), &value, 0) {
                Err(Error::Busy) => std::thread::yield_now(),
                r => break r.expect("the trie has room for every prefix"),
            }
        }
        if let Some(values) = &self.values {
            values
                .insert(&buf[at..], u32::from(key.1), &best.value, 0)
                .expect("the trie of values has room for every prefix");
        }
    }

    /// Checks the index against its books: every prefix's trie value is
    /// its best (recomputed here from its ancestors), its rules and its
    /// best's value; every rule placed once.
    #[cfg(test)]
    pub(super) fn check_structure(&self, len: usize) {
        let w = self.writer.lock();
        let guard = &pin();
        let mut above: Vec<(u128, Arc<Entry>)> = Vec::new();
        let mut rules = 0;
        for (&k, prefix) in &w.prefixes {
            while above.last().is_some_and(|&(last, _)| k.0 > last) {
                above.pop();
            }
            assert!(!prefix.rules.is_empty(), "an empty prefix kept");
            assert!(prefix.rules.windows(2).all(|p| p[0].rule < p[1].rule));
            assert!(prefix.rules.iter().all(|e| self.key_of(&e.rule) == k));
            rules += prefix.rules.len();
            let best = best_of(&prefix.rules, above.last().map(|(_, e)| e));
            let bytes = self.stored(k, guard).expect("a stored prefix in the trie");
            assert_eq!(word(&bytes, 0), Arc::as_ptr(&best).addr(), "a stale best");
            assert_eq!(
                word(&bytes, 8),
                Arc::as_ptr(&prefix.rules).cast::<Arc<Entry>>().addr()
            );
            assert_eq!(word(&bytes, 16), prefix.rules.len());
            assert_eq!(&bytes[HEADER..], &*best.value);
            assert!(!prefix.dirty);
            above.push((self.end_of(k), best));
        }
        assert_eq!((rules, w.placed.len()), (len, len), "rules counted");
        let mut stored = 0;
        self.trie.for_each(guard, |_, _, _| stored += 1);
        assert_eq!(stored, w.prefixes.len(), "prefixes in the trie");
        if let Some(values) = &self.values {
            let mut stored = 0;
            values.for_each(guard, |data, len, value| {
                let prefix = &w.prefixes[&self.key_at(data, len)];
                let best = prefix.best.as_ref().expect("a published prefix");
                assert_eq!(value, &*best.value, "the trie of values");
                stored += 1;
            });
            assert_eq!(stored, w.prefixes.len(), "prefixes in the trie of values");
        }
    }
}

impl Writer {
    /// Puts `entry` among its prefix's rules (in place of its rule's
    /// entry if held) and marks the prefix dirty; the old entry and list
    /// go to `retired`.
    fn put(&mut self, key: Key, entry: Arc<Entry>, retired: &mut Retired) {
        if let Some(old) = self.placed.replace(Placed(Arc::clone(&entry))) {
            retired.entries.push(old.0);
        }
        match self.prefixes.get_mut(&key) {
            Some(prefix) => {
                let mut rules: Vec<Arc<Entry>> = prefix.rules.to_vec();
                match rules.binary_search_by(|e| e.rule.cmp(&entry.rule)) {
                    Ok(i) => rules[i] = entry,
                    Err(i) => rules.insert(i, entry),
                }
                retired
                    .lists
                    .push(std::mem::replace(&mut prefix.rules, rules.into()));
                prefix.dirty = true;
            }
            None => {
                self.prefixes.insert(
                    key,
                    Prefix {
                        rules: Arc::new([entry]),
                        best: None,
                        dirty: true,
                    },
                );
            }
        }
    }
}

/// The best of a prefix's own `rules` (best first) and `inherited`, the
/// best of the stored prefixes above it.
fn best_of(rules: &[Arc<Entry>], inherited: Option<&Arc<Entry>>) -> Arc<Entry> {
    let own = &rules[0];
    match inherited {
        Some(p) if p.rule < own.rule => Arc::clone(p),
        _ => Arc::clone(own),
    }
}

/// The word at byte `at` of a trie value (an address or a length).
#[inline(always)]
fn word(bytes: &[u8], at: usize) -> usize {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize
}

/// An address or length as a trie value holds it.
fn to_word(x: usize) -> [u8; 8] {
    (x as u64).to_ne_bytes()
}
