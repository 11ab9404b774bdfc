//! A bucket's rules as a probe reads them: one flat array of words per
//! bucket, each rule's priority, lower bounds, upper bounds, exit bound
//! (in most layouts), value and entry address back to back, in words as
//! narrow as the schema's widest field allows (32 bits for a 5-tuple). A probe that matches
//! reads no other memory, and a bucket of ClassBench rules takes a
//! quarter of the cache lines `u128` words would. The writer changes a
//! bucket by copying its words with the change made: a rule update
//! reads the bucket's chain and the entry it changes, not every entry
//! of the bucket.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crossbeam_epoch::{Owned, Pointer};

use super::schema::{MAX_FIELDS, Rule, Schema};
use crate::core::arena::{HUGE_PAGE, advise_huge_pages};

/// A rule and its value, shared by the chains that hold it.
pub(super) struct Entry {
    pub(super) rule: Rule,
    /// Held in the entry up to [`INLINE_VALUE`] bytes (ClassBench's and
    /// Cilium's 4): an update allocates and frees one block fewer, 7-11 %
    /// of a cold update's time (docs/benchmarks.md, "A hash index of
    /// rules").
    pub(super) value: smallvec::SmallVec<[u8; INLINE_VALUE]>,
    /// Its exit bound, as its chains' words hold it (`exits.rs`): its
    /// priority until a load works out a better one. The writer's copy,
    /// which it writes into each chain it makes; readers read the words.
    pub(super) exit: AtomicU32,
}

/// The most bytes of a value an [`Entry`] holds in itself.
pub(super) const INLINE_VALUE: usize = 8;

impl Entry {
    /// Bytes a value of `size` takes outside its entry.
    pub(super) fn value_bytes_outside(size: usize) -> usize {
        if size > INLINE_VALUE { size } else { 0 }
    }

    /// A shared entry of copies of `rule` and `value`.
    pub(super) fn shared(rule: &Rule, value: &[u8]) -> Arc<Entry> {
        Arc::new(Entry {
            rule: rule.clone(),
            value: value.into(),
            exit: AtomicU32::new(rule.priority),
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
    /// The big-endian word at `at`, unaligned.
    ///
    /// # Safety
    /// `at` points to a word's bytes.
    unsafe fn read_be(at: *const u8) -> Self;
    /// `(self >> shift) & mask` (`shift` under the word's width): a
    /// field's bits out of a word read around it (`match_key.rs`).
    fn field(self, shift: u32, mask: u128) -> Self;
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
            #[inline(always)]
            unsafe fn read_be(at: *const u8) -> Self {
                // SAFETY: the caller's.
                <$t>::from_be(unsafe { at.cast::<$t>().read_unaligned() })
            }
            #[inline(always)]
            fn field(self, shift: u32, mask: u128) -> Self {
                (self >> shift) & mask as $t
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
    #[inline(always)]
    unsafe fn read_be(at: *const u8) -> Self {
        // SAFETY: the caller's.
        u128::from_be(unsafe { at.cast::<u128>().read_unaligned() })
    }
    #[inline(always)]
    fn field(self, shift: u32, mask: u128) -> Self {
        (self >> shift) & mask
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
    /// A word's bytes.
    pub(super) fn bytes(self) -> usize {
        match self {
            Width::W32 => 4,
            Width::W64 => 8,
            Width::W128 => 16,
        }
    }

    pub(super) fn of(schema: &Schema) -> Width {
        match schema.fields().iter().map(|f| f.size).max().unwrap_or(0) {
            0..=4 => Width::W32,
            5..=8 => Width::W64,
            _ => Width::W128,
        }
    }
}

/// Where a rule's parts sit among its words: the priority at 0, the
/// fields' lower bounds from 1 (field `i`'s at `1 + i`), their upper
/// bounds after them (at `1 + fields + i`), its exit bound at
/// [`exit_word`] (`1 + 2 * fields`) if the layout has one, the value's
/// bytes from byte `value`, the entry's address from byte `addr`;
/// `stride` words in all. Bounds of a kind side by side, so a probe
/// tests every field with two vector compares of contiguous words and no
/// shuffles. The value and the address are counted in bytes: a probe's
/// answer reads them from a match's address, whatever its word.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) addr: usize,
    pub(super) value: usize,
    pub(super) stride: usize,
    /// Whether a rule's words hold its exit bound.
    pub(super) exit: bool,
}

impl Layout {
    /// The entry's address is aligned in every rule (the words start
    /// 16-byte aligned and the stride is a whole number of addresses):
    /// an aligned read, and leak checkers, which scan memory for aligned
    /// pointers only, see the entry held (LeakSanitizer called the
    /// entries of chains still waiting for their grace period at exit
    /// leaked when the address sat at 4 bytes past an 8).
    ///
    /// The exit bound's word is left out where it would take a chain of
    /// one rule onto one more cache line: Cilium's key (four fields of
    /// 4 bytes or fewer, a 4-byte value) fills a line exactly, and its
    /// exact rules (one table, where no probe stops early anyway) took
    /// 1.5x the time in bursts at 100K rules with the word
    /// (docs/benchmarks.md, "Exit bounds").
    pub(super) fn new<W: Word>(fields: usize, value_size: usize) -> Layout {
        let with = Self::laid::<W>(fields, value_size, true);
        let without = Self::laid::<W>(fields, value_size, false);
        let lines = |l: &Layout| (HEAD + l.stride * size_of::<W>()).div_ceil(64);
        if lines(&with) == lines(&without) {
            with
        } else {
            without
        }
    }

    /// The layout with or without an exit word.
    fn laid<W: Word>(fields: usize, value_size: usize, exit: bool) -> Layout {
        let w = size_of::<W>();
        let addr_words = size_of::<usize>().div_ceil(w);
        // The value before the address: the padding that aligns the
        // address then mostly falls inside the value's last word.
        let value = exit_word(fields) + usize::from(exit);
        let addr = (value + value_size.div_ceil(w)).next_multiple_of(addr_words);
        Layout {
            addr: addr * w,
            value: value * w,
            stride: addr + addr_words,
            exit,
        }
    }

    /// [`new`](Self::new) for words of `width`.
    pub(super) fn of(width: Width, fields: usize, value_size: usize) -> Layout {
        match width {
            Width::W32 => Layout::new::<u32>(fields, value_size),
            Width::W64 => Layout::new::<u64>(fields, value_size),
            Width::W128 => Layout::new::<u128>(fields, value_size),
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
/// width))`, or as an edited copy of another ([`Chain::edited`]). It
/// owns one count of each entry's `Arc`, through the address in the
/// entry's words, until an edited copy takes them over.
#[repr(C)]
pub(super) struct Chain {
    /// Rules it holds.
    rules: u32,
    /// Bytes per rule (its [`Layout::stride`] words).
    stride: u16,
    /// The byte in a rule where its entry's address starts.
    addr: u16,
    /// Which entries' counts it owns: [`OWNS_ALL`] as made; once an
    /// [edited](Chain::edited) copy replaces it, [`OWNS_NONE`] or the
    /// index of the one rule the edit took out. Written by the writer
    /// while readers may still read the chain (they never read this).
    owned: AtomicU32,
    /// Bytes from the start of the block this chain was carved from to
    /// the chain ([`Chain::carve`]), or 0 for a chain allocated alone.
    block: u32,
    /// The rules' words, in storage aligned for any width.
    words: [u128],
}

/// The `u128` words that hold `rules` rules of `stride` bytes.
fn words_for(rules: usize, stride: usize) -> usize {
    (rules * stride).div_ceil(size_of::<u128>())
}

/// The header's bytes before the words (`rules`, `stride`, `addr`,
/// `owned`, `block`).
const HEAD: usize = 16;

/// The head of a block of chains carved from one allocation
/// ([`Chain::carve`]): how many of them are alive, and the allocation's
/// bytes. The chains follow it, from the next cache line (where a
/// block's homes start, [`Placement`]).
#[repr(C, align(64))]
struct Block {
    live: AtomicUsize,
    size: usize,
}

/// A chain owns a count of every entry it holds.
const OWNS_ALL: u32 = u32::MAX;
/// A chain whose counts all passed to its edited copy.
const OWNS_NONE: u32 = u32::MAX - 1;

/// A change to one bucket's rules, made by [`Chain::edited`].
pub(super) enum Edit {
    /// A new rule (not held) goes in at its place in rule order.
    Insert(Arc<Entry>),
    /// The rule at this index leaves.
    Remove(usize),
    /// The rule at this index gets a new entry (the same rule, a new
    /// value).
    Replace(usize, Arc<Entry>),
}

/// Bytes of a chain's home: a cache line.
pub(super) const HOME: usize = 64;

/// Buckets a table holds before its chains get homes: 2^20, those of
/// more than 262,144 rules, whose buckets and chains (tens of MiB)
/// outgrow the L3.
///
/// Why homes: a probe reads a bucket and then the chain the bucket
/// points to, two misses one after the other in a table that outgrows
/// the cache. A block with homes keeps a line for every bucket, in
/// bucket order, and puts a chain at its bucket's line where it fits:
/// the probe asks for that line while it reads the bucket, and the two
/// misses overlap. It costs a line a bucket, empty ones too: 80-110
/// bytes a rule more at a million rules. With Cilium's rules at a
/// million, one at a time, 1.5x the speed for exact rules, 1.26x for
/// mixed ones, about the same for wildcard ones (docs/benchmarks.md,
/// "Chains at their bucket's line"). At 100K rules, where the tables
/// fit the L3 without homes, homes on every table made walks over
/// several tables slower (Cilium's mixed rules in bursts, 2.93x the six
/// lookups' speed -> 2.38x; "A neighbour on the cache"); a map's only
/// table has them from fewer rules ([`LONE_HOMED_RULES`]).
pub(super) const HOMED_SLOTS: usize = 1 << 20;

/// Rules a map's only table holds, at most, before its chains get homes
/// (when it is built): 32,768, past which it keeps two buckets a rule in
/// 2^17 buckets or more (`DENSE_SLOTS_PER_RULE`), whose buckets (a MiB)
/// and chains outgrow a core's L2. A table keeps the homes it was built
/// with until it is rebuilt, alone or not; a table grown by inserts is
/// rebuilt at 16,385 rules and then at 65,537, so it has homes from the
/// second.
///
/// Why lower than [`HOMED_SLOTS`]: a probe of the only table reads one
/// bucket and then one chain, and the homes' overlap of those two
/// misses is most of what it can save. A walk over several tables
/// already overlaps one table's misses with the next's, and there homes
/// cost more than they save (Cilium's mixed rules in bursts, above).
/// Why counted in rules: at four buckets a rule (16,385 to 32,768 rules
/// in 2^17 buckets) homes doubled the bytes a rule and made Cilium's
/// exact rules slower (20K: 1.06x the six lookups -> 0.98x). Past it,
/// on a 2 MiB-L2 Xeon, one at a time against the six lookups: 50K
/// 0.96x -> 1.06x, 100K 1.12x -> 1.27x, ahead in each of 8 paired
/// rounds; 1.6x -> 1.5x in bursts, and 323 -> 434 bytes a rule
/// (docs/benchmarks.md, "Homes for a lone table").
pub(super) const LONE_HOMED_RULES: usize = 1 << 15;

/// Where a block's chains go: each chain's offset from the block's
/// head, the block's bytes, and whether it has homes.
#[derive(Debug, PartialEq)]
struct Placement {
    at: Vec<usize>,
    size: usize,
    homes: bool,
}

impl Placement {
    /// Chains of `bytes` for the buckets `buckets` (in ascending order)
    /// of a table of `slots` buckets, with `homes` or not (the map's
    /// choice: from [`HOMED_SLOTS`] buckets).
    ///
    /// Without homes, one after another after the head. With them, a
    /// home of [`HOME`] bytes for every bucket after the head: a chain
    /// goes at its bucket's home when it ends before the next held
    /// bucket's home (a longer chain takes the homes of the empty
    /// buckets after its own); the others go one after another after
    /// the homes. One after another, a chain that would cross more line
    /// boundaries than its size needs starts on the next line
    /// ([`on_fewest_lines`]).
    fn of(buckets: &[usize], bytes: &[usize], slots: usize, homes: bool) -> Placement {
        let head = size_of::<Block>();
        let mut end = if homes { head + slots * HOME } else { head };
        let at = bytes
            .iter()
            .enumerate()
            .map(|(k, &b)| {
                let next = buckets.get(k + 1).copied().unwrap_or(slots);
                if homes && buckets[k] + b.div_ceil(HOME) <= next {
                    return head + buckets[k] * HOME;
                }
                let at = on_fewest_lines(end, b);
                end = at + b;
                at
            })
            .collect();
        Placement {
            at,
            size: end,
            homes,
        }
    }
}

/// Where a chain of `bytes` goes at or after offset `end` of a block
/// (whose head starts a line): at `end`, unless it would then span more
/// lines than `bytes` needs, and then at the next line's start. A probe
/// reads its chain's lines: from one after another, three one-rule
/// chains of Cilium's key (64 bytes) in four straddled two lines where
/// a chain of two rules came before them.
fn on_fewest_lines(end: usize, bytes: usize) -> usize {
    if (end % HOME + bytes).div_ceil(HOME) > bytes.div_ceil(HOME) {
        end.next_multiple_of(HOME)
    } else {
        end
    }
}

/// Chains carved from one block ([`Chain::carve`]), in their buckets'
/// order, and the address of the block's first home (0: no homes).
pub(super) struct Carved {
    pub(super) chains: Vec<Owned<Chain>>,
    pub(super) homes: usize,
}

impl Carved {
    fn empty() -> Carved {
        Carved {
            chains: Vec::new(),
            homes: 0,
        }
    }
}

impl Block {
    /// A block of `size` bytes for `chains` chains, its head written:
    /// the address its chains start `size_of::<Block>()` bytes after.
    ///
    /// # Safety
    /// `size` is at least the head's, and the caller carves exactly
    /// `chains` chains from it, each freed through `Pointable::drop`.
    unsafe fn alloc(size: usize, chains: usize) -> *mut u8 {
        let alloc = Self::layout(size);
        // SAFETY: the layout's size is not zero (the head).
        let base = unsafe { std::alloc::alloc(alloc) };
        if base.is_null() {
            std::alloc::handle_alloc_error(alloc);
        }
        advise_huge_pages(base, size);
        // SAFETY: `base` is the block's allocation, aligned for its head.
        unsafe {
            base.cast::<Block>().write(Block {
                live: AtomicUsize::new(chains),
                size,
            })
        };
        base
    }

    /// The allocation of a block of `size` bytes: a big one (a table
    /// with homes spreads its probes over all of it) aligned for huge
    /// pages, where the kernel gives them, so that its probes do not
    /// miss the TLB as well.
    fn layout(size: usize) -> std::alloc::Layout {
        let align = if size >= HUGE_PAGE {
            HUGE_PAGE
        } else {
            align_of::<Block>()
        };
        std::alloc::Layout::from_size_align(size, align).expect("a block's size fits")
    }
}

impl Chain {
    /// The allocation of a chain of `words` words.
    fn alloc_layout(words: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(HEAD + words * size_of::<u128>(), align_of::<u128>())
            .expect("a chain's size fits")
    }

    /// Each rule's words, in rule order (the tests' reading; a probe
    /// reads them through [`rules_at`](Self::rules_at)).
    #[cfg(test)]
    pub(super) fn rules<W: Word>(&self, layout: &Layout) -> impl Iterator<Item = &[W]> {
        self.strided(layout.stride)
    }

    /// The rules of the published chain at `addr`, `stride` words of `W`
    /// each, in rule order, read from the header's count alone: a
    /// probe's reading. Forming the chain (`&Chain`) first computes its
    /// words from the header, and a bounds-checked walk checks the rules
    /// against them: a dozen instructions every probe that finds a chain
    /// (4-5 % of a packet's on the ClassBench and Cilium sets).
    ///
    /// # Safety
    /// `addr` is a live chain's (not null, no tag) whose rules are
    /// `stride` words of `W`, and the chain outlives `'a` (a published
    /// chain read under a pinned guard that does).
    #[inline(always)]
    pub(super) unsafe fn rules_at<'a, W: Word>(
        addr: usize,
        stride: usize,
    ) -> impl Iterator<Item = &'a [W]> {
        let header = std::ptr::with_exposed_provenance::<u8>(addr);
        // SAFETY: the caller's: a live chain, its header then its words,
        // `rules * stride` of them (as `alloc` sized them), aligned for
        // any width.
        let (rules, words) = unsafe {
            (
                header.cast::<u32>().read() as usize,
                header.add(HEAD).cast::<W>(),
            )
        };
        // SAFETY: rule `k < rules` is the `stride` words at `k * stride`.
        (0..rules)
            .map(move |k| unsafe { std::slice::from_raw_parts(words.add(k * stride), stride) })
    }

    /// Each rule's words, `stride` of them a rule (the writer's reading,
    /// bounds checked).
    fn strided<W: Word>(&self, stride: usize) -> impl Iterator<Item = &[W]> {
        let words: &[W] = bytemuck::cast_slice(&self.words);
        words[..self.rules as usize * stride].chunks_exact(stride)
    }

    /// Each rule's entry, in rule order.
    fn entry_ptrs(&self) -> impl Iterator<Item = *const Entry> + '_ {
        (0..self.rules as usize).map(|k| self.entry_ptr(k))
    }

    /// Rule `k`'s entry.
    fn entry_ptr(&self, k: usize) -> *const Entry {
        let bytes: &[u8] = bytemuck::cast_slice(&self.words);
        entry_at(&bytes[k * usize::from(self.stride) + usize::from(self.addr)..])
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

    /// Rules it holds.
    pub(super) fn len(&self) -> usize {
        self.rules as usize
    }

    /// Bytes it holds.
    pub(super) fn bytes(&self) -> usize {
        HEAD + size_of_val(&self.words)
    }

    /// The address and bytes of the block it was carved from, if it was
    /// ([`carve`](Chain::carve)): its bytes stay held while any of its
    /// chains lives, the replaced ones' too.
    pub(super) fn carved_from(&self) -> Option<(usize, usize)> {
        if self.block == 0 {
            return None;
        }
        let head = (&raw const *self).cast::<u8>().expose_provenance() - self.block as usize;
        // SAFETY: a carved chain's block lives while the chain does, its
        // head `block` bytes before it (`carve`).
        let size = unsafe { (*std::ptr::with_exposed_provenance::<Block>(head)).size };
        Some((head, size))
    }
}

impl crossbeam_epoch::Pointable for Chain {
    const ALIGN: usize = align_of::<u128>();

    /// The entries (all of one schema and value size, at least one) in
    /// rule order, and the width of the words.
    type Init = (Vec<Arc<Entry>>, Width);

    unsafe fn init((entries, width): Self::Init) -> usize {
        let first = entries.first().expect("a chain holds a rule");
        let (layout, stride, addr) = Self::shape(first, width);
        let (ptr, chain) = Self::alloc(entries.len(), stride, addr);
        match width {
            Width::W32 => fill::<u32>(&mut chain.words, &layout, entries),
            Width::W64 => fill::<u64>(&mut chain.words, &layout, entries),
            Width::W128 => fill::<u128>(&mut chain.words, &layout, entries),
        }
        ptr
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
        let owned = chain.owned.load(Ordering::Relaxed);
        let drop_count = |e: *const Entry| {
            // SAFETY: a count the chain owns (`init`, or kept through
            // `edited`).
            drop(unsafe { Arc::from_raw(e) });
        };
        match owned {
            OWNS_ALL => chain.entry_ptrs().for_each(drop_count),
            OWNS_NONE => {}
            // An edited chain's one count: its entry read alone, not the
            // chain walked to it.
            k => drop_count(chain.entry_ptr(k as usize)),
        }
        if chain.block == 0 {
            let alloc = Self::alloc_layout(chain.words.len());
            // SAFETY: allocated alone (`alloc_unwritten`) with this layout.
            unsafe { std::alloc::dealloc(ptr as *mut u8, alloc) };
            return;
        }
        let head = std::ptr::with_exposed_provenance_mut::<Block>(ptr - chain.block as usize);
        // SAFETY: carved from the block at `head` (`carve`), which
        // counts its live chains; the last one frees it. The release
        // orders this chain's last use before the free; the acquire, the
        // other chains' uses.
        unsafe {
            if (*head).live.fetch_sub(1, Ordering::Release) == 1 {
                std::sync::atomic::fence(Ordering::Acquire);
                let size = (*head).size;
                std::alloc::dealloc(head.cast(), Block::layout(size));
            }
        }
    }
}

impl Chain {
    /// The layout of chains of `first`'s schema and value size in words
    /// of `width`, with a rule's bytes and where its entry's address
    /// starts in them, as a chain's header keeps them.
    fn shape(first: &Entry, width: Width) -> (Layout, u16, u16) {
        let (fields, value_size) = (first.rule.bounds().len(), first.value.len());
        let layout = Layout::of(width, fields, value_size);
        let stride = u16::try_from(layout.stride * width.bytes()).expect("a rule's bytes fit u16");
        let addr = u16::try_from(layout.addr).expect("within a rule");
        (layout, stride, addr)
    }

    /// Chains holding each of `buckets` (a bucket's index among the
    /// table's `slots` and its entries, at least one, in rule order; the
    /// buckets in ascending order), in order, carved from one
    /// allocation: a table built at once (a rebuild, a split's new
    /// table; a load's through [`carve_copies`](Chain::carve_copies))
    /// finds its chains in one run of memory, however the heap's free
    /// space lies in pieces after earlier maps (a table of chains
    /// allocated one by one after a freed map of a million rules took
    /// 1.6-1.8x the time a packet: docs/benchmarks.md, "Each table's
    /// chains in one block"), and a `homed` table finds them at their
    /// buckets' homes ([`HOMED_SLOTS`]). Each chain is freed on its own
    /// as before (an edit replaces it with a copy allocated alone); the
    /// block goes with the last of them, so until then the chains an
    /// edit replaced keep their bytes.
    pub(super) fn carve(
        buckets: Vec<(usize, Vec<Arc<Entry>>)>,
        slots: usize,
        homed: bool,
        width: Width,
    ) -> Carved {
        let Some(first) = buckets.first().and_then(|(_, b)| b.first()) else {
            return Carved::empty();
        };
        let (layout, stride, addr) = Self::shape(first, width);
        let bytes = |rules: usize| HEAD + words_for(rules, usize::from(stride)) * size_of::<u128>();
        let (indices, sizes): (Vec<usize>, Vec<usize>) =
            buckets.iter().map(|(i, b)| (*i, bytes(b.len()))).unzip();
        let place = Placement::of(&indices, &sizes, slots, homed);
        if u32::try_from(place.size).is_err() {
            // Past what `block` can reach: each alone.
            let chains = buckets
                .into_iter()
                .map(|(_, b)| Owned::<Chain>::init((b, width)))
                .collect();
            return Carved { chains, homes: 0 };
        }
        // SAFETY: `size` holds the head and the chains where `place` put
        // them, as `bytes` sizes them.
        let base = unsafe { Block::alloc(place.size, buckets.len()) };
        let mut chains = Vec::with_capacity(buckets.len());
        for ((_, entries), &at) in buckets.into_iter().zip(&place.at) {
            let rules = entries.len();
            let words = words_for(rules, usize::from(stride));
            // SAFETY: the block holds this chain's bytes at `at`, aligned
            // (the head, homes and every chain's bytes are multiples of
            // 16), and no other chain's; with the header written and the
            // words zeroed, a valid chain, which `fill` then writes.
            let chain = unsafe {
                let ptr = base.add(at);
                Self::write_head(ptr, words, rules, stride, addr, at as u32);
                ptr.add(HEAD).write_bytes(0, words * size_of::<u128>());
                &mut *Self::fat(ptr.expose_provenance(), words).cast_mut()
            };
            match width {
                Width::W32 => fill::<u32>(&mut chain.words, &layout, entries),
                Width::W64 => fill::<u64>(&mut chain.words, &layout, entries),
                Width::W128 => fill::<u128>(&mut chain.words, &layout, entries),
            }
            // SAFETY: a chain written whole, as `Pointable::init` makes
            // them; `drop` frees it through its block.
            chains.push(unsafe { Owned::from_usize(base.add(at).expose_provenance()) });
        }
        Carved {
            chains,
            homes: Self::homes_of(base, &place),
        }
    }

    /// The address of the first home of a block at `base` placed by
    /// `place`, 0 without homes.
    fn homes_of(base: *mut u8, place: &Placement) -> usize {
        if place.homes {
            base.expose_provenance() + size_of::<Block>()
        } else {
            0
        }
    }

    /// Copies of `chains` (each with its bucket's index among the
    /// table's `slots`, in ascending order), in order, carved from one
    /// block as [`carve`](Chain::carve) places them, their words copied
    /// as they are (no entry read). Each copy takes over its original's
    /// counts of its entries, as an [edited](Chain::edited) copy does:
    /// the caller publishes the copies in the originals' places and
    /// retires the originals, which then drop none. `None` past what a
    /// block can reach (4 GiB).
    ///
    /// The writer's, once per chain (a chain already edited or copied
    /// panics).
    pub(super) fn carve_copies(
        chains: &[(usize, &Chain)],
        slots: usize,
        homed: bool,
    ) -> Option<Carved> {
        let (indices, sizes): (Vec<usize>, Vec<usize>) =
            chains.iter().map(|(i, c)| (*i, c.bytes())).unzip();
        let place = Placement::of(&indices, &sizes, slots, homed);
        u32::try_from(place.size).ok()?;
        // The counts pass before the block is made (a chain copied twice
        // panics with nothing allocated).
        for (_, chain) in chains {
            chain
                .owned
                .compare_exchange(OWNS_ALL, OWNS_NONE, Ordering::Relaxed, Ordering::Relaxed)
                .expect("a chain is copied once");
        }
        // SAFETY: `size` holds the head and a copy of each chain where
        // `place` put it.
        let base = unsafe { Block::alloc(place.size, chains.len()) };
        let mut copies = Vec::with_capacity(chains.len());
        for ((_, chain), &at) in chains.iter().zip(&place.at) {
            let words = chain.words.len();
            // SAFETY: the block holds this copy's bytes at `at`, aligned,
            // and no other chain's; the header is written and every word
            // copied from a chain of the same size.
            unsafe {
                let ptr = base.add(at);
                Self::write_head(
                    ptr,
                    words,
                    chain.rules as usize,
                    chain.stride,
                    chain.addr,
                    at as u32,
                );
                ptr.add(HEAD).copy_from_nonoverlapping(
                    chain.words.as_ptr().cast(),
                    size_of_val(&chain.words),
                );
                copies.push(Owned::from_usize(ptr.expose_provenance()));
            }
        }
        Some(Carved {
            chains: copies,
            homes: Self::homes_of(base, &place),
        })
    }

    /// A fresh, zeroed chain of `rules` rules of `stride` bytes, the
    /// entry's address at byte `addr` of each, owning all its entries'
    /// counts (once its caller writes them): its address and the chain.
    fn alloc<'a>(rules: usize, stride: u16, addr: u16) -> (usize, &'a mut Chain) {
        let (ptr, words) = Self::alloc_unwritten(rules, stride, addr);
        // SAFETY: `ptr`'s allocation holds its header, written, then
        // `words` words; once they are zeroed, a valid chain.
        let chain = unsafe {
            ptr.add(HEAD).write_bytes(0, words * size_of::<u128>());
            &mut *Self::fat(ptr as usize, words).cast_mut()
        };
        (ptr as usize, chain)
    }

    /// The allocation of a chain of `rules` rules of `stride` bytes, the
    /// entry's address at byte `addr` of each: its header written
    /// (owning all its entries' counts), its words not, but for the last,
    /// zeroed (the padding after the rules' bytes). By `malloc`, not
    /// `calloc`: glibc's `calloc` skips the thread's cache of freed
    /// chunks and searches the arena's bins, and an edited copy writes
    /// every byte anyway (docs/benchmarks.md, "A hash index of rules").
    /// Its address and its words.
    fn alloc_unwritten(rules: usize, stride: u16, addr: u16) -> (*mut u8, usize) {
        let words = words_for(rules, usize::from(stride));
        let alloc = Self::alloc_layout(words);
        // SAFETY: the layout's size is not zero (HEAD).
        let ptr = unsafe { std::alloc::alloc(alloc) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(alloc);
        }
        // SAFETY: the allocation, sized for the header and `words` words.
        unsafe {
            Self::write_head(ptr, words, rules, stride, addr, 0);
            if words > 0 {
                ptr.add(HEAD + (words - 1) * size_of::<u128>())
                    .write_bytes(0, size_of::<u128>());
            }
        }
        (ptr, words)
    }

    /// Writes the header of a chain at `ptr` of `rules` rules of
    /// `stride` bytes (`words` words), the entry's address at byte `addr`
    /// of each, owning all its entries' counts, `block` bytes into its
    /// block (0: alone).
    ///
    /// # Safety
    /// `ptr` holds a chain's header and `words` words, aligned for them,
    /// and nothing reads them yet.
    unsafe fn write_head(
        ptr: *mut u8,
        words: usize,
        rules: usize,
        stride: u16,
        addr: u16,
        block: u32,
    ) {
        let chain = Self::fat(ptr as usize, words).cast_mut();
        // SAFETY: the caller's; the fields are written through raw
        // pointers, nothing read.
        unsafe {
            (&raw mut (*chain).rules)
                .write(u32::try_from(rules).expect("a bucket's rules fit u32"));
            (&raw mut (*chain).stride).write(stride);
            (&raw mut (*chain).addr).write(addr);
            (&raw mut (*chain).owned).write(AtomicU32::new(OWNS_ALL));
            (&raw mut (*chain).block).write(block);
        }
    }

    /// Its rules' bytes, each `stride` long, in rule order.
    fn rule_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.rules as usize * usize::from(self.stride)]
    }

    /// The index of `rule` among its rules (a chain of `width` words),
    /// found by their words (a rule's identity, its priority and bounds,
    /// is its first words); the entries are not read.
    pub(super) fn find(&self, width: Width, rule: &Rule) -> Option<usize> {
        match width {
            Width::W32 => self.find_as::<u32>(rule),
            Width::W64 => self.find_as::<u64>(rule),
            Width::W128 => self.find_as::<u128>(rule),
        }
    }

    fn find_as<W: Word>(&self, rule: &Rule) -> Option<usize> {
        let (key, n) = rule_words::<W>(rule);
        // The priority first: one compare a rule, not a call.
        self.word_rules::<W>()
            .position(|r| r[0] == key[0] && r[..n] == key[..n])
    }

    /// How many of its rules come before `rule` in rule order (read
    /// from their words). Chains of `W` words.
    fn rank<W: Word>(&self, rule: &Rule) -> usize {
        let (key, _) = rule_words::<W>(rule);
        let n = rule.bounds().len();
        self.word_rules::<W>()
            .position(|r| rule_order(r, &key, n).is_ge())
            .unwrap_or(self.rules as usize)
    }

    /// Each rule's words, `W` words wide, from the header's stride.
    fn word_rules<W: Word>(&self) -> impl Iterator<Item = &[W]> {
        self.strided(usize::from(self.stride) / size_of::<W>())
    }

    /// A copy of this chain with `edit` made (`None` if it leaves no
    /// rule), its words copied as they are: the rules it keeps are not
    /// read, and their entries not touched (a bucket's update then reads
    /// the chain and the entry it changes, where a rebuild from the
    /// entries missed the cache on every entry when the writer was
    /// cold). Their counts pass to the copy; this chain keeps only the
    /// count of the entry the edit takes out, which it drops when it is
    /// freed, after the readers that may still reach it through this
    /// chain. Chains of `W` words.
    ///
    /// The writer's, once per chain (a second edit panics): the copy
    /// replaces this chain in its bucket, and this one is retired.
    pub(super) fn edited(&self, width: Width, edit: Edit) -> Option<Owned<Chain>> {
        match width {
            Width::W32 => self.edited_as::<u32>(edit),
            Width::W64 => self.edited_as::<u64>(edit),
            Width::W128 => self.edited_as::<u128>(edit),
        }
    }

    fn edited_as<W: Word>(&self, edit: Edit) -> Option<Owned<Chain>> {
        let stride = usize::from(self.stride);
        let old = self.rule_bytes();
        let rules = self.rules as usize;
        let (at, entry, gone, kept) = match edit {
            Edit::Insert(e) => (self.rank::<W>(&e.rule), Some(e), 0, rules),
            Edit::Remove(k) => (k, None, 1, rules - 1),
            Edit::Replace(k, e) => (k, Some(e), 1, rules - 1),
        };
        assert!(at + gone <= rules, "an edit of a rule the chain holds");
        let n = kept + usize::from(entry.is_some());
        // The counts pass once: a second copy of one chain would own them
        // twice.
        let kept_here = if gone == 1 { at as u32 } else { OWNS_NONE };
        self.owned
            .compare_exchange(OWNS_ALL, kept_here, Ordering::Relaxed, Ordering::Relaxed)
            .expect("a chain is edited once");
        if n == 0 {
            return None;
        }
        // Every byte is written once: the header and the padding after
        // the rules by `alloc_unwritten`, the kept rules' bytes copied,
        // the new rule's written on zeros (its padding).
        let (ptr, _) = Self::alloc_unwritten(n, self.stride, self.addr);
        let kept_after = (rules - at - gone) * stride;
        // SAFETY: `ptr` holds HEAD then `n * stride` bytes (and the
        // zeroed tail); the copies stay inside both chains' rule bytes,
        // and the new rule's `stride` bytes, aligned for `W` (HEAD and
        // `stride` are multiples of its size), are zeroed before they
        // are borrowed.
        unsafe {
            let words = ptr.add(HEAD);
            words.copy_from_nonoverlapping(old.as_ptr(), at * stride);
            let mut next = words.add(at * stride);
            if let Some(e) = entry {
                next.write_bytes(0, stride);
                let mine =
                    std::slice::from_raw_parts_mut(next.cast::<W>(), stride / size_of::<W>());
                let layout = Layout::new::<W>(e.rule.bounds().len(), e.value.len());
                write_rule(mine, &layout, e);
                next = next.add(stride);
            }
            next.copy_from_nonoverlapping(old[(at + gone) * stride..].as_ptr(), kept_after);
        }
        // SAFETY: a chain written whole, as `Pointable::init` makes them.
        Some(unsafe { Owned::from_usize(ptr as usize) })
    }

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
        words_for(rules, stride)
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
        write_rule(key, layout, e);
    }
}

/// Writes one rule's words (`layout.stride` of them, zeroed) for `e`,
/// taking its count.
fn write_rule<W: Word>(key: &mut [W], layout: &Layout, e: Arc<Entry>) {
    let (words, n) = rule_words::<W>(&e.rule);
    key[..n].copy_from_slice(&words[..n]);
    if layout.exit {
        key[n] = W::of(u128::from(e.exit.load(Ordering::Relaxed)));
    }
    let bytes = bytemuck::cast_slice_mut::<W, u8>(key);
    bytes[layout.value..][..e.value.len()].copy_from_slice(&e.value);
    let addr = Arc::into_raw(e).expose_provenance().to_ne_bytes();
    bytes[layout.addr..][..addr.len()].copy_from_slice(&addr);
}

/// The word of a rule of `fields` fields that holds its exit bound
/// (after its priority and bounds, [`Layout`]).
#[inline(always)]
pub(super) const fn exit_word(fields: usize) -> usize {
    1 + 2 * fields
}

/// A rule's first words, as a chain holds them (its priority, its
/// fields' lower bounds, then their upper bounds), and how many there
/// are.
fn rule_words<W: Word>(rule: &Rule) -> ([W; 1 + 2 * MAX_FIELDS], usize) {
    let n = rule.bounds().len();
    let mut words = [W::of(0); 1 + 2 * MAX_FIELDS];
    words[0] = W::of(u128::from(rule.priority));
    for (i, &(lo, hi)) in rule.bounds().iter().enumerate() {
        words[1 + i] = W::of(lo);
        words[1 + n + i] = W::of(hi);
    }
    (words, 1 + 2 * n)
}

/// How two rules' first words (as [`rule_words`] lays them out, `n`
/// fields) order as their rules do: by priority, then by each field's
/// interval in turn (lower bound, then upper).
#[inline(always)]
pub(super) fn rule_order<W: Word>(a: &[W], b: &[W], n: usize) -> std::cmp::Ordering {
    a[0].cmp(&b[0]).then_with(|| {
        (0..n)
            .map(|i| (a[1 + i], a[1 + n + i]).cmp(&(b[1 + i], b[1 + n + i])))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    })
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

/// A probe's match: the address of its rule's words in a published
/// chain, valid while the guard of `'g` is pinned.
#[derive(Clone, Copy)]
pub(super) struct Hit<'g>(NonNull<u8>, PhantomData<&'g [u8]>);

impl<'g> Hit<'g> {
    /// The match of `words`, a rule's in a chain.
    #[inline(always)]
    pub(super) fn of<W: Word>(words: &'g [W]) -> Hit<'g> {
        Hit(NonNull::from(words).cast(), PhantomData)
    }
}

/// The entry and the value bytes of a match, without bounds checks (a
/// probe's answer: they were 14 instructions of the 118 of a one-table
/// classification).
///
/// # Safety
/// `hit` is a rule's words laid out by `layout` for values of
/// `value_size` bytes, in a published chain read under a pinned guard
/// that outlives `'a`: the chain owns an `Arc` of the entry, and is
/// freed only after the grace period of its replacement.
#[inline(always)]
pub(super) unsafe fn answer_of<'a>(
    hit: Hit<'a>,
    layout: &Layout,
    value_size: usize,
) -> (&'a Entry, &'a [u8]) {
    debug_assert!(layout.value + value_size <= layout.addr);
    let base = hit.0.as_ptr().cast_const();
    // SAFETY: the caller's: the address's bytes end the rule's words and
    // the value's lie before them (`Layout::new`); `fill` exposed the
    // address.
    unsafe {
        let addr = base.add(layout.addr).cast::<usize>().read_unaligned();
        let entry = &*std::ptr::with_exposed_provenance::<Entry>(addr);
        let value = std::slice::from_raw_parts(base.add(layout.value), value_size);
        (entry, value)
    }
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
                    let at = |k: usize| HEAD + k * l.stride * w + l.addr;
                    assert!((0..4).all(|k| at(k) % align_of::<usize>() == 0));
                    assert!(l.value > 2 * fields * w && l.value + value_size <= l.addr);
                    assert!(l.stride * w >= l.addr + size_of::<usize>());
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
                // A probe's reading of the chain, from its address, is
                // the chain's own.
                let addr = (&raw const *chain).cast::<u8>().expose_provenance();
                // SAFETY: the chain lives until it is dropped below; its
                // rules are `layout.stride` words of `u64`.
                let probed: Vec<&[u64]> =
                    unsafe { Chain::rules_at::<u64>(addr, layout.stride) }.collect();
                assert_eq!(probed, chain.rules::<u64>(&layout).collect::<Vec<_>>());
                for (i, key) in probed.into_iter().enumerate() {
                    assert_eq!(key[0], i as u64, "priority");
                    assert_eq!((key[1], key[3]), (10 * i as u64, 10 * i as u64 + 5));
                    assert_eq!((key[2], key[4]), (i as u64, i as u64));
                    // SAFETY: the chain is alive and owns the entry.
                    let (entry, value) = unsafe { answer_of(Hit::of(key), &layout, 3) };
                    assert_eq!(value, [i as u8; 3]);
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

    /// An edited copy holds the edited rules in rule order, found by
    /// their words; it takes the kept entries' counts, and the chain it
    /// replaces keeps (and drops) only the count of the entry taken out,
    /// at every width.
    #[test]
    fn an_edited_copy_takes_the_counts_and_the_old_chain_keeps_the_one_taken_out() {
        fn check<W: Word>(width: Width) {
            let schema = Schema::new(vec![Field::exact("a", 4), Field::exact("b", 1)]).unwrap();
            let entry = |p: u32, v: u8| {
                let rule = schema.parse_rule(&format!("a {p}, b 1"), p).unwrap();
                Entry::shared(&rule, &[v; 3])
            };
            let held: Vec<Arc<Entry>> = [0, 2, 4, 6].map(|p| entry(p, p as u8)).to_vec();
            let fresh = entry(3, 3);
            let counts =
                |es: &[&Arc<Entry>]| es.iter().map(|e| Arc::strong_count(e)).collect::<Vec<_>>();
            let order = |c: &Chain| c.entry_refs().map(|e| e.rule.priority).collect::<Vec<_>>();
            let values = |c: &Chain| {
                let layout = Layout::new::<W>(2, 3);
                // SAFETY: the chain is alive and owns its entries.
                c.rules::<W>(&layout)
                    .map(|k| unsafe { answer_of(Hit::of(k), &layout, 3) }.1[0])
                    .collect::<Vec<_>>()
            };

            let c0 = Owned::<Chain>::init((held.clone(), width));
            assert_eq!(c0.rank::<W>(&fresh.rule), 2);
            assert_eq!(c0.find(width, &fresh.rule), None);
            let c1 = c0.edited(width, Edit::Insert(Arc::clone(&fresh))).unwrap();
            assert_eq!(order(&c1), [0, 2, 3, 4, 6]);
            assert_eq!(values(&c1), [0, 2, 3, 4, 6]);
            drop(c0);
            assert_eq!(
                counts(&[&held[0], &held[1], &held[2], &held[3], &fresh]),
                [2; 5]
            );

            assert_eq!(c1.find(width, &held[1].rule), Some(1));
            let c2 = c1.edited(width, Edit::Remove(1)).unwrap();
            assert_eq!(order(&c2), [0, 3, 4, 6]);
            assert_eq!(counts(&[&held[1]]), [2], "the old chain still owns it");
            drop(c1);
            assert_eq!(
                counts(&[&held[0], &held[1], &held[2], &held[3], &fresh]),
                [2, 1, 2, 2, 2]
            );

            let again = entry(3, 9);
            let at = c2.find(width, &again.rule).unwrap();
            let c3 = c2
                .edited(width, Edit::Replace(at, Arc::clone(&again)))
                .unwrap();
            assert_eq!(values(&c3), [0, 9, 4, 6]);
            drop(c2);
            assert_eq!(counts(&[&fresh, &again]), [1, 2]);

            let twice = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                c3.edited(width, Edit::Remove(0))
            }));
            drop(twice.expect("a first edit").expect("rules left"));
            let again_twice = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                c3.edited(width, Edit::Remove(0))
            }));
            assert!(again_twice.is_err(), "a chain's counts pass once");
            let one = Owned::<Chain>::init((vec![Arc::clone(&held[1])], width));
            assert!(one.edited(width, Edit::Remove(0)).is_none());
            drop(one);
            drop(c3);
            assert!(
                held.iter()
                    .chain([&fresh, &again])
                    .all(|e| Arc::strong_count(e) == 1)
            );
        }
        check::<u32>(Width::W32);
        check::<u64>(Width::W64);
        check::<u128>(Width::W128);
    }

    /// The carving tests' rule of priority `p` (field `a` exact at `a`,
    /// `b` the range `p..=p + 10`), with a 5-byte value of `a`.
    fn carving_entry(a: u32, p: u32) -> Arc<Entry> {
        let schema = Schema::new(vec![Field::exact("a", 4), Field::range("b", 2)]).unwrap();
        let rule = schema
            .parse_rule(&format!("a {a}, b {p}-{}", p + 10), p)
            .unwrap();
        Entry::shared(&rule, &[a as u8; 5])
    }

    /// Chains carved from one block are each the chain `init` would
    /// make, one after another in order; the block counts them, each frees
    /// its own counts when it goes (an edited copy of one is allocated
    /// alone), and the last of them frees the block, at every width.
    #[test]
    fn carved_chains_are_whole_chains_and_the_last_frees_their_block() {
        fn check<W: Word>(width: Width) {
            let entry = carving_entry;
            // Buckets of 1, 3 and 2 rules, in rule order.
            let buckets: Vec<Vec<Arc<Entry>>> = vec![
                vec![entry(1, 0)],
                vec![entry(2, 0), entry(2, 1), entry(2, 7)],
                vec![entry(3, 2), entry(3, 4)],
            ];
            let all: Vec<Arc<Entry>> = buckets.iter().flatten().cloned().collect();
            let chains = Chain::carve(indexed(buckets.clone()), 3, false, width).chains;
            assert_eq!(chains.len(), 3);
            let layout = Layout::new::<W>(2, 5);
            let addr = |c: &Owned<Chain>| (&raw const **c).cast::<u8>().expose_provenance();
            for (c, b) in chains.iter().zip(&buckets) {
                let alone = Owned::<Chain>::init((b.clone(), width));
                assert_eq!(c.len(), b.len());
                assert_eq!(c.bytes(), alone.bytes());
                assert!(c.rules::<W>(&layout).eq(alone.rules::<W>(&layout)));
                assert!(c.entry_refs().zip(b).all(|(e, f)| std::ptr::eq(e, &**f)));
                assert_ne!(c.block, 0);
                assert_eq!(alone.block, 0);
            }
            // One after another, in order, after the block's head, each
            // on the fewest lines it can take.
            let head = addr(&chains[0]) - chains[0].block as usize;
            assert_eq!(head + size_of::<Block>(), addr(&chains[0]));
            for pair in chains.windows(2) {
                let end = addr(&pair[0]) + pair[0].bytes() - head;
                assert_eq!(head + on_fewest_lines(end, pair[1].bytes()), addr(&pair[1]));
                let lines = |c: &Owned<Chain>| (addr(c) % HOME + c.bytes()).div_ceil(HOME);
                assert_eq!(lines(&pair[1]), pair[1].bytes().div_ceil(HOME));
            }
            let last = &chains[2];
            let size = addr(last) + last.bytes() - head;
            assert!(chains.iter().all(|c| c.carved_from() == Some((head, size))));
            // SAFETY: the block lives while any of its chains does.
            let live = || unsafe {
                (*std::ptr::with_exposed_provenance::<Block>(head))
                    .live
                    .load(Ordering::Relaxed)
            };
            assert_eq!(live(), 3);
            drop(buckets);
            assert!(all.iter().all(|e| Arc::strong_count(e) == 2));
            let mut chains = chains.into_iter();
            let first = chains.next().unwrap();
            // An edit's copy is allocated alone; the carved chain keeps
            // the count of the entry it takes out until it goes.
            let copy = first
                .edited(width, Edit::Replace(0, entry(1, 0)))
                .expect("a rule left");
            assert_eq!((copy.block, copy.carved_from()), (0, None));
            drop(first);
            assert_eq!(live(), 2);
            assert_eq!(
                Arc::strong_count(&all[0]),
                1,
                "replaced, and its chain gone"
            );
            drop(chains.next());
            assert_eq!(live(), 1);
            assert!(all[1..4].iter().all(|e| Arc::strong_count(e) == 1));
            // The last one frees the block (Miri checks the free).
            drop(chains.next());
            assert!(all.iter().all(|e| Arc::strong_count(e) == 1));
            drop(copy);
            assert!(Chain::carve(Vec::new(), 1, false, width).chains.is_empty());
        }
        check::<u32>(Width::W32);
        check::<u64>(Width::W64);
        check::<u128>(Width::W128);
    }

    /// Copies carved from one block hold their originals' words and
    /// take over their counts: the originals, retired, drop none; the
    /// copies give them back, and the last of them frees the block. A
    /// chain is copied once.
    #[test]
    fn carved_copies_take_over_their_originals_counts() {
        let entry = carving_entry;
        let width = Width::W32;
        let layout = Layout::new::<u32>(2, 5);
        let alone = Owned::<Chain>::init((vec![entry(1, 0), entry(1, 3)], width));
        let mut carved = Chain::carve(
            indexed(vec![vec![entry(2, 0)], vec![entry(3, 1)]]),
            2,
            false,
            width,
        )
        .chains
        .into_iter();
        let (first, second) = (carved.next().unwrap(), carved.next().unwrap());
        let all: Vec<Arc<Entry>> = [&alone, &first, &second]
            .iter()
            .flat_map(|c| c.entries())
            .collect();
        assert!(all.iter().all(|e| Arc::strong_count(e) == 2));
        let copies = Chain::carve_copies(&[(0, &alone), (1, &second)], 2, false)
            .expect("a small block")
            .chains;
        for (copy, original) in copies.iter().zip([&alone, &second]) {
            assert!(
                copy.rules::<u32>(&layout)
                    .eq(original.rules::<u32>(&layout))
            );
            assert!(
                copy.entry_refs()
                    .zip(original.entry_refs())
                    .all(|(a, b)| std::ptr::eq(a, b))
            );
            assert!(copy.carved_from().is_some());
            assert_eq!(original.owned.load(Ordering::Relaxed), OWNS_NONE);
        }
        assert_eq!(copies[0].carved_from(), copies[1].carved_from());
        let twice = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Chain::carve_copies(&[(0, &second)], 1, false)
        }));
        assert!(twice.is_err(), "a chain's counts pass once");
        // The originals go, and drop no count: the copies hold them.
        drop((alone, second));
        assert!(all.iter().all(|e| Arc::strong_count(e) == 2));
        drop(copies);
        assert_eq!(
            all.iter().map(Arc::strong_count).collect::<Vec<_>>(),
            [1, 1, 2, 1],
            "the copied chains' counts gone, the uncopied chain's kept"
        );
        drop(first);
        assert!(all.iter().all(|e| Arc::strong_count(e) == 1));
    }

    /// Buckets `0..` for `buckets`, in order.
    fn indexed(buckets: Vec<Vec<Arc<Entry>>>) -> Vec<(usize, Vec<Arc<Entry>>)> {
        buckets.into_iter().enumerate().collect()
    }

    /// Without homes chains go one after another, each on the fewest
    /// lines it can take; with them each at its bucket's home where it
    /// ends before the next held bucket's, the others one after another
    /// after the homes.
    #[test]
    fn a_big_tables_chains_go_at_their_buckets_homes_where_they_fit() {
        let head = size_of::<Block>();
        assert_eq!(head % HOME, 0, "homes start on a line");
        // One after another: the third (one line) would straddle two at
        // 176, so it starts the next line; the fourth spans two lines
        // wherever it starts, so it follows at once.
        let small = Placement::of(&[0, 1, 5, 6], &[64, 112, 64, 80], HOMED_SLOTS, false);
        assert_eq!(
            small,
            Placement {
                at: vec![head, head + 64, head + 192, head + 256],
                size: head + 336,
                homes: false,
            }
        );
        let slots = HOMED_SLOTS;
        let homes_end = head + slots * HOME;
        let home = |i: usize| head + i * HOME;
        // Bucket 0's two lines fit before bucket 2; bucket 2's do not
        // (bucket 3 is held), so it goes after the homes; bucket 3's one
        // line fits; the last bucket's two lines run past the table, and
        // go on the line after bucket 2's (at 112 they would span three).
        let big = Placement::of(&[0, 2, 3, slots - 1], &[112, 112, 64, 112], slots, true);
        assert_eq!(
            big,
            Placement {
                at: vec![home(0), homes_end, home(3), homes_end + 128],
                size: homes_end + 240,
                homes: true,
            }
        );
        assert_eq!(
            Placement::of(&[], &[], slots, true).size,
            homes_end,
            "the homes whether held or not"
        );
    }

    /// A big table's carved chains sit at their homes (copies too) and
    /// are whole chains; their blocks, aligned for huge pages, are freed
    /// with the layout they were made with (Miri checks the frees).
    #[test]
    fn carved_chains_of_a_big_table_sit_at_their_homes() {
        let entry = carving_entry;
        let width = Width::W32;
        let layout = Layout::new::<u32>(2, 5);
        let slots = HOMED_SLOTS;
        // Bucket 7's three rules need more than its line, and bucket 8
        // is held: they go after the homes.
        let buckets = vec![
            (7, vec![entry(2, 0), entry(2, 1), entry(2, 7)]),
            (8, vec![entry(1, 0)]),
            (slots - 1, vec![entry(3, 2)]),
        ];
        let carved = Chain::carve(buckets.clone(), slots, true, width);
        assert_ne!(carved.homes, 0);
        let addr = |c: &Chain| (&raw const *c).cast::<u8>().expose_provenance();
        let at: Vec<usize> = carved.chains.iter().map(|c| addr(c)).collect();
        assert!(carved.chains[0].bytes() > HOME);
        assert_eq!(at[0], carved.homes + slots * HOME);
        assert_eq!(at[1], carved.homes + 8 * HOME);
        assert_eq!(at[2], carved.homes + (slots - 1) * HOME);
        for (c, (_, b)) in carved.chains.iter().zip(&buckets) {
            let alone = Owned::<Chain>::init((b.clone(), width));
            assert!(c.rules::<u32>(&layout).eq(alone.rules::<u32>(&layout)));
        }
        let held: Vec<(usize, &Chain)> = buckets
            .iter()
            .map(|(i, _)| *i)
            .zip(carved.chains.iter().map(|c| &**c))
            .collect();
        let copies = Chain::carve_copies(&held, slots, true).expect("a block under 4 GiB");
        assert_ne!(copies.homes, carved.homes);
        assert_eq!(addr(&copies.chains[1]), copies.homes + 8 * HOME);
        for (copy, (_, original)) in copies.chains.iter().zip(&held) {
            assert!(
                copy.rules::<u32>(&layout)
                    .eq(original.rules::<u32>(&layout))
            );
        }
        // Each block goes with its last chain.
        drop(carved);
        drop(copies);
        drop(buckets);
    }
}
