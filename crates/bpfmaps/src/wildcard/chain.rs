//! A bucket's rules as a probe reads them: one flat array of words per
//! bucket, each rule's priority, intervals, entry address and value back
//! to back, in words as narrow as the schema's widest field allows (32
//! bits for a 5-tuple). A probe that matches reads no other memory, and a
//! bucket of ClassBench rules takes a quarter of the cache lines `u128`
//! words would.

use std::sync::Arc;

use super::schema::{Rule, Schema};

/// A rule and its value, shared by the chains that hold it.
pub(super) struct Entry {
    pub(super) rule: Rule,
    pub(super) value: Box<[u8]>,
}

impl Entry {
    /// A shared entry of copies of `rule` and `value`.
    pub(super) fn shared(rule: &Rule, value: &[u8]) -> Arc<Entry> {
        Arc::new(Entry {
            rule: rule.clone(),
            value: value.into(),
        })
    }
}

/// A word of a chain: wide enough for every field of the schema.
pub(super) trait Word: bytemuck::Pod + Ord {
    /// `v`, which fits.
    fn of(v: u128) -> Self;
    /// The largest value.
    const MAX: u128;
    /// What a table's hash mixes in for this value's bits under `mask`
    /// (its leading bits, which fit the word): the same number whatever
    /// the word's width.
    fn masked_lane(self, mask: u128) -> u64;
}

macro_rules! narrow_word {
    ($($t:ty),*) => {$(
        impl Word for $t {
            #[inline(always)]
            fn of(v: u128) -> Self {
                v as $t
            }
            const MAX: u128 = <$t>::MAX as u128;
            #[inline(always)]
            fn masked_lane(self, mask: u128) -> u64 {
                u64::from(self & mask as $t)
            }
        }
    )*};
}
narrow_word!(u32, u64);

impl Word for u128 {
    #[inline(always)]
    fn of(v: u128) -> Self {
        v
    }
    const MAX: u128 = u128::MAX;
    #[inline(always)]
    fn masked_lane(self, mask: u128) -> u64 {
        let v = self & mask;
        v as u64 ^ ((v >> 64) as u64).rotate_left(29)
    }
}

/// The word a map's chains use: the narrowest that holds its widest
/// field and a priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Width {
    W32,
    W64,
    W128,
}

impl Width {
    pub(super) fn of(schema: &Schema) -> Width {
        match schema.fields().iter().map(|f| f.size).max().unwrap_or(0) {
            0..=4 => Width::W32,
            5..=8 => Width::W64,
            _ => Width::W128,
        }
    }
}

/// Where a rule's parts sit among its words: the priority at 0, field
/// `i`'s interval at `1 + 2i` and `2 + 2i`, the entry's address from
/// `addr`, the value's bytes from `value`; `stride` words in all.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) addr: usize,
    pub(super) value: usize,
    pub(super) stride: usize,
}

impl Layout {
    pub(super) fn new<W: Word>(fields: usize, value_size: usize) -> Layout {
        let w = size_of::<W>();
        let addr = 1 + 2 * fields;
        let value = addr + size_of::<usize>().div_ceil(w);
        Layout {
            addr,
            value,
            stride: value + value_size.div_ceil(w),
        }
    }
}

/// One bucket's rules, in rule order ([`Layout`]). Immutable once
/// published: a change publishes a new chain.
pub(super) struct Chain {
    /// The rules' words, in storage aligned for any width.
    words: Box<[u128]>,
    /// Owns the entries whose addresses `words` holds.
    pub(super) entries: Box<[Arc<Entry>]>,
}

impl Chain {
    /// A chain of `entries` (all of one schema and value size) in words
    /// of `width`.
    pub(super) fn new(entries: impl Into<Box<[Arc<Entry>]>>, width: Width) -> Self {
        let entries = entries.into();
        let words = match width {
            Width::W32 => words_of::<u32>(&entries),
            Width::W64 => words_of::<u64>(&entries),
            Width::W128 => words_of::<u128>(&entries),
        };
        Chain { words, entries }
    }

    /// Each rule's words, in rule order. (Not `chunks_exact`: it divides
    /// by the stride, a division per probe on the lookup path.)
    #[inline]
    pub(super) fn rules<W: Word>(&self, layout: &Layout) -> impl Iterator<Item = &[W]> {
        let words: &[W] = bytemuck::cast_slice(&self.words);
        let stride = layout.stride;
        (0..self.entries.len()).map(move |k| &words[k * stride..][..stride])
    }

    /// Bytes it holds.
    pub(super) fn bytes(&self) -> usize {
        size_of::<Self>() + size_of_val(&*self.words) + size_of_val(&*self.entries)
    }
}

fn words_of<W: Word>(entries: &[Arc<Entry>]) -> Box<[u128]> {
    let Some(first) = entries.first() else {
        return Box::new([]);
    };
    let layout = Layout::new::<W>(first.rule.bounds().len(), first.value.len());
    let len = (entries.len() * layout.stride * size_of::<W>()).div_ceil(16);
    let mut storage = vec![0u128; len].into_boxed_slice();
    let words: &mut [W] = bytemuck::cast_slice_mut(&mut storage);
    for (e, key) in entries.iter().zip(words.chunks_exact_mut(layout.stride)) {
        key[0] = W::of(u128::from(e.rule.priority));
        for (i, &(lo, hi)) in e.rule.bounds().iter().enumerate() {
            key[1 + 2 * i] = W::of(lo);
            key[2 + 2 * i] = W::of(hi);
        }
        let addr = Arc::as_ptr(e).expose_provenance().to_ne_bytes();
        bytemuck::cast_slice_mut::<W, u8>(&mut key[layout.addr..layout.value])[..addr.len()]
            .copy_from_slice(&addr);
        bytemuck::cast_slice_mut::<W, u8>(&mut key[layout.value..])[..e.value.len()]
            .copy_from_slice(&e.value);
    }
    storage
}

/// The entry of a rule's words.
///
/// # Safety
/// `key` is a rule's words in a published chain, read under a pinned
/// guard that outlives the borrow: the chain owns an `Arc` of the entry,
/// and is freed only after the grace period of its replacement.
#[inline]
pub(super) unsafe fn entry_of<'a, W: Word>(key: &'a [W], layout: &Layout) -> &'a Entry {
    let bytes: &[u8] = bytemuck::cast_slice(&key[layout.addr..layout.value]);
    let addr = usize::from_ne_bytes(
        bytes[..size_of::<usize>()]
            .try_into()
            .expect("an address's bytes"),
    );
    // SAFETY: the caller's; `words_of` exposed the address.
    unsafe { &*std::ptr::with_exposed_provenance::<Entry>(addr) }
}

/// The value bytes of a rule's words.
#[inline]
pub(super) fn value_of<'a, W: Word>(key: &'a [W], layout: &Layout, value_size: usize) -> &'a [u8] {
    &bytemuck::cast_slice::<W, u8>(&key[layout.value..])[..value_size]
}
