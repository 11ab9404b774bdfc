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
/// `i`'s interval at `1 + 2i` and `2 + 2i`, the value's bytes from
/// `value`, the entry's address from `addr`; `stride` words in all.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) addr: usize,
    pub(super) value: usize,
    pub(super) stride: usize,
}

impl Layout {
    /// The entry's address is aligned in every rule (the words start
    /// 16-byte aligned and the stride is a whole number of addresses):
    /// an aligned read, and leak checkers, which scan memory for aligned
    /// pointers only, see the entry held (LeakSanitizer called the
    /// entries of chains still waiting for their grace period at exit
    /// leaked when the address sat at 4 bytes past an 8).
    pub(super) fn new<W: Word>(fields: usize, value_size: usize) -> Layout {
        let w = size_of::<W>();
        let addr_words = size_of::<usize>().div_ceil(w);
        // The value before the address: the padding that aligns the
        // address then mostly falls inside the value's last word.
        let value = 1 + 2 * fields;
        let addr = (value + value_size.div_ceil(w)).next_multiple_of(addr_words);
        Layout {
            addr,
            value,
            stride: addr + addr_words,
        }
    }
}

/// One bucket's rules, in rule order ([`Layout`]), in one allocation: a
/// short header, then the words. A probe's load of the bucket's pointer
/// is followed by one miss, not two (a header pointing to words held
/// elsewhere); a chain of one rule of four 4-byte-or-narrower fields
/// and a 4-byte value (Cilium's) takes 64 bytes.
/// Immutable once published: a change publishes a new chain.
///
/// A dynamically sized type (its words are a slice's tail), allocated
/// through crossbeam's [`Pointable`]: `Owned::<Chain>::init((entries,
/// width))`. It owns one count of each entry's `Arc`, through the
/// address in the entry's words.
#[repr(C)]
pub(super) struct Chain {
    /// Rules it holds.
    rules: u32,
    /// Bytes per rule (its [`Layout::stride`] words).
    stride: u16,
    /// The byte in a rule where its entry's address starts.
    addr: u16,
    /// The rules' words, in storage aligned for any width.
    words: [u128],
}

/// The header's bytes before the words (`rules`, `stride`, `addr`,
/// padded to the words' alignment).
const HEAD: usize = 16;

impl Chain {
    /// The allocation of a chain of `words` words.
    fn alloc_layout(words: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(HEAD + words * size_of::<u128>(), align_of::<u128>())
            .expect("a chain's size fits")
    }

    /// Each rule's words, in rule order. (Bounds checked once: checked
    /// per rule, or through `chunks_exact`, the compiler divides by the
    /// stride, a division per probe on the lookup path; splitting one
    /// stride off at a time measured slower.)
    #[inline]
    pub(super) fn rules<W: Word>(&self, layout: &Layout) -> impl Iterator<Item = &[W]> {
        let words: &[W] = bytemuck::cast_slice(&self.words);
        let stride = layout.stride;
        let rules = self.rules as usize;
        assert!(
            rules * stride <= words.len(),
            "a chain's words hold its rules"
        );
        // SAFETY: rule `k < rules` ends at `(k + 1) * stride`, within
        // the words (the assertion).
        (0..rules).map(move |k| unsafe { words.get_unchecked(k * stride..(k + 1) * stride) })
    }

    /// Each rule's entry, in rule order.
    fn entry_ptrs(&self) -> impl Iterator<Item = *const Entry> + '_ {
        let bytes: &[u8] = bytemuck::cast_slice(&self.words);
        (0..self.rules as usize)
            .map(move |k| entry_at(&bytes[k * usize::from(self.stride) + usize::from(self.addr)..]))
    }

    /// Its entries, in rule order (new counts of their `Arc`s).
    pub(super) fn entries(&self) -> Vec<Arc<Entry>> {
        self.entry_ptrs()
            .map(|e| {
                // SAFETY: the chain owns a count of each entry's `Arc`
                // (`Pointable::init`), alive while it is.
                unsafe {
                    Arc::increment_strong_count(e);
                    Arc::from_raw(e)
                }
            })
            .collect()
    }

    /// Each entry, borrowed for as long as the chain.
    pub(super) fn entry_refs(&self) -> impl Iterator<Item = &Entry> + '_ {
        // SAFETY: as in `entries`.
        self.entry_ptrs().map(|e| unsafe { &*e })
    }

    /// Bytes it holds.
    pub(super) fn bytes(&self) -> usize {
        HEAD + size_of_val(&self.words)
    }
}

impl crossbeam_epoch::Pointable for Chain {
    const ALIGN: usize = align_of::<u128>();

    /// The entries (all of one schema and value size, at least one) in
    /// rule order, and the width of the words.
    type Init = (Vec<Arc<Entry>>, Width);

    unsafe fn init((entries, width): Self::Init) -> usize {
        let first = entries.first().expect("a chain holds a rule");
        let (fields, value_size) = (first.rule.bounds().len(), first.value.len());
        let (layout, w) = match width {
            Width::W32 => (Layout::new::<u32>(fields, value_size), 4),
            Width::W64 => (Layout::new::<u64>(fields, value_size), 8),
            Width::W128 => (Layout::new::<u128>(fields, value_size), 16),
        };
        let words = (entries.len() * layout.stride * w).div_ceil(size_of::<u128>());
        let alloc = Self::alloc_layout(words);
        // SAFETY: the layout's size is not zero (HEAD).
        let ptr = unsafe { std::alloc::alloc_zeroed(alloc) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(alloc);
        }
        // SAFETY: `ptr` is a fresh, zeroed allocation of `alloc`, whose
        // tail holds `words` words; a zeroed chain is a valid one.
        let chain = unsafe { &mut *Self::fat(ptr as usize, words).cast_mut() };
        debug_assert_eq!(
            size_of_val(chain),
            alloc.size(),
            "HEAD is the header's size"
        );
        chain.rules = u32::try_from(entries.len()).expect("a bucket's rules fit u32");
        chain.stride = u16::try_from(layout.stride * w).expect("a rule's bytes fit u16");
        chain.addr = u16::try_from(layout.addr * w).expect("within a rule");
        match width {
            Width::W32 => fill::<u32>(&mut chain.words, &layout, entries),
            Width::W64 => fill::<u64>(&mut chain.words, &layout, entries),
            Width::W128 => fill::<u128>(&mut chain.words, &layout, entries),
        }
        ptr as usize
    }

    unsafe fn deref<'a>(ptr: usize) -> &'a Self {
        // SAFETY: the caller's: `ptr` is a live chain's.
        unsafe { &*Self::fat(ptr, Self::words_at(ptr)) }
    }

    unsafe fn deref_mut<'a>(ptr: usize) -> &'a mut Self {
        // SAFETY: the caller's: `ptr` is a live chain's, not shared.
        unsafe { &mut *Self::fat(ptr, Self::words_at(ptr)).cast_mut() }
    }

    unsafe fn drop(ptr: usize) {
        // SAFETY: the caller's: `ptr` is a live chain's, its last use.
        let chain = unsafe { Self::deref(ptr) };
        for e in chain.entry_ptrs() {
            // SAFETY: the count `init` took from the `Arc`.
            drop(unsafe { Arc::from_raw(e) });
        }
        let alloc = Self::alloc_layout(chain.words.len());
        // SAFETY: allocated by `init` with this layout.
        unsafe { std::alloc::dealloc(ptr as *mut u8, alloc) };
    }
}

impl Chain {
    /// The words a chain at `ptr` holds, from its header (rules times
    /// the bytes of each, in whole `u128`s, as `init` allocated them).
    ///
    /// # Safety
    /// `ptr` is a live chain's.
    unsafe fn words_at(ptr: usize) -> usize {
        // SAFETY: the caller's.
        let (rules, stride) = unsafe {
            let p = ptr as *const u8;
            (
                p.cast::<u32>().read() as usize,
                p.add(4).cast::<u16>().read() as usize,
            )
        };
        (rules * stride).div_ceil(size_of::<u128>())
    }

    /// A pointer to the chain at `ptr` holding `words` words.
    fn fat(ptr: usize, words: usize) -> *const Chain {
        std::ptr::slice_from_raw_parts(std::ptr::with_exposed_provenance::<u128>(ptr), words)
            as *const Chain
    }
}

/// Writes `entries`' words into `words`, taking their counts.
fn fill<W: Word>(storage: &mut [u128], layout: &Layout, entries: Vec<Arc<Entry>>) {
    let words: &mut [W] = bytemuck::cast_slice_mut(storage);
    for (e, key) in entries
        .into_iter()
        .zip(words.chunks_exact_mut(layout.stride))
    {
        key[0] = W::of(u128::from(e.rule.priority));
        for (i, &(lo, hi)) in e.rule.bounds().iter().enumerate() {
            key[1 + 2 * i] = W::of(lo);
            key[2 + 2 * i] = W::of(hi);
        }
        bytemuck::cast_slice_mut::<W, u8>(&mut key[layout.value..])[..e.value.len()]
            .copy_from_slice(&e.value);
        let addr = Arc::into_raw(e).expose_provenance().to_ne_bytes();
        bytemuck::cast_slice_mut::<W, u8>(&mut key[layout.addr..])[..addr.len()]
            .copy_from_slice(&addr);
    }
}

/// The entry of a rule's words.
///
/// # Safety
/// `key` is a rule's words in a published chain, read under a pinned
/// guard that outlives the borrow: the chain owns an `Arc` of the entry,
/// and is freed only after the grace period of its replacement.
#[inline]
pub(super) unsafe fn entry_of<'a, W: Word>(key: &'a [W], layout: &Layout) -> &'a Entry {
    // SAFETY: the caller's; `fill` exposed the address.
    unsafe { &*entry_at(bytemuck::cast_slice(&key[layout.addr..])) }
}

/// The entry whose address `bytes` starts with (as `fill` wrote it).
#[inline]
fn entry_at(bytes: &[u8]) -> *const Entry {
    let addr = usize::from_ne_bytes(
        bytes[..size_of::<usize>()]
            .try_into()
            .expect("an address's bytes"),
    );
    std::ptr::with_exposed_provenance::<Entry>(addr)
}

/// The value bytes of a rule's words.
#[inline]
pub(super) fn value_of<'a, W: Word>(key: &'a [W], layout: &Layout, value_size: usize) -> &'a [u8] {
    &bytemuck::cast_slice::<W, u8>(&key[layout.value..])[..value_size]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wildcard::Field;
    use crossbeam_epoch::Owned;

    /// Every rule's entry address is aligned, whatever the width, fields
    /// and value size (leak checkers find only aligned pointers).
    #[test]
    fn entry_addresses_are_aligned_in_every_rule() {
        fn check<W: Word>() {
            let w = size_of::<W>();
            for fields in 1..=9 {
                for value_size in 1..=40 {
                    let l = Layout::new::<W>(fields, value_size);
                    let at = |k: usize| HEAD + (k * l.stride + l.addr) * w;
                    assert!((0..4).all(|k| at(k) % align_of::<usize>() == 0));
                    assert!(l.value > 2 * fields && l.value * w + value_size <= l.addr * w);
                    assert!(l.stride * w >= l.addr * w + size_of::<usize>());
                }
            }
        }
        check::<u32>();
        check::<u64>();
        check::<u128>();
    }

    /// A chain holds one count of each entry while it lives, hands out
    /// the entries and their words in rule order, and gives the counts
    /// back when it is dropped, at every width.
    #[test]
    fn a_chain_owns_its_entries_counts_and_returns_them() {
        for (size, width) in [(4, Width::W32), (8, Width::W64), (16, Width::W128)] {
            // Ranges are up to 8 bytes wide; a 16-byte field matches exactly.
            let (a, hi) = match size {
                16 => (Field::exact("a", size), 0),
                _ => (Field::range("a", size), 5),
            };
            let schema = Schema::new(vec![a, Field::exact("b", 1)]).unwrap();
            let entries: Vec<Arc<Entry>> = (0..3u32)
                .map(|i| {
                    let a = match hi {
                        0 => format!("{}", 10 * i),
                        _ => format!("{}-{}", 10 * i, 10 * i + hi),
                    };
                    let rule = schema.parse_rule(&format!("a {a}, b {i}"), i).unwrap();
                    Entry::shared(&rule, &[i as u8; 3])
                })
                .collect();
            let chain = Owned::<Chain>::init((entries.clone(), width));
            assert!(entries.iter().all(|e| Arc::strong_count(e) == 2));
            let got = chain.entries();
            assert!(got.iter().zip(&entries).all(|(a, b)| Arc::ptr_eq(a, b)));
            assert!(entries.iter().all(|e| Arc::strong_count(e) == 3));
            drop(got);
            let layout = Layout::new::<u64>(2, 3);
            if width == Width::W64 {
                for (i, key) in chain.rules::<u64>(&layout).enumerate() {
                    assert_eq!(key[0], i as u64, "priority");
                    assert_eq!((key[1], key[2]), (10 * i as u64, 10 * i as u64 + 5));
                    assert_eq!(value_of(key, &layout, 3), [i as u8; 3]);
                    // SAFETY: the chain is alive and owns the entry.
                    let entry = unsafe { entry_of(key, &layout) };
                    assert!(std::ptr::eq(entry, &*entries[i]));
                }
            }
            assert_eq!(chain.entry_refs().count(), 3);
            drop(chain);
            assert!(
                entries.iter().all(|e| Arc::strong_count(e) == 1),
                "{width:?}"
            );
        }
    }
}
