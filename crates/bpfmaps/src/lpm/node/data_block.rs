//! Data blocks: a node's runs (every byte's best match), hidden prefixes
//! and inherited default, built whole and replaced copy-on-write.

use std::alloc::Layout;
use std::ops::Range;
use std::ptr::{self, NonNull};

use smallvec::SmallVec;

use super::leaf::{
    INHERITED, NO_MATCH, PayloadCell, code_of, default_code, load_payload, own_bits, same_winner,
    store_payload, winner_of,
};
use super::prefixes::in_subtree;
use super::runs::{Runs, Splice, copy_runs, run_offsets, runs_bytes, runs_overlapping, write_run};
use super::{Leaf, LeafCell, Prefixes, index_range, prefix_index};
use crate::core::arena::Arena;
use crate::lpm::bits::Bits;

/// Header of a data block. Then, in order: the runs, in groups of four
/// (their four codes, then their four payloads: 20 B, so a run's code and
/// payload nearly always share a cache line, and the runs a lookup reads
/// sit right after the bits it just read), and the hidden prefixes: their
/// indices (2 B each) and payloads (4 B each). A hidden prefix is one that
/// no byte answers with (longer prefixes of the node cover it all); every
/// other prefix's payload is in the runs it wins, so it is stored once.
/// Everything but the payloads (the default's, the runs' and the hidden
/// prefixes', which `LpmTrie` may replace in place) is fixed once
/// published.
#[repr(C)]
pub(crate) struct DataBlock {
    pub run_bits: Bits<4>,
    pub default: LeafCell,
    n_runs: u16,
    /// Prefixes stored in the node, hidden ones included.
    n_prefixes: u16,
    /// At most 255: only prefixes shorter than 8 bits inside the byte hide.
    n_hidden: u8,
    /// The node's depth: an own run of code `c` answers with a prefix of
    /// `8 * depth + c - 1` bits.
    depth: u8,
    /// Bit `l` set if the node may store a prefix of `l` bits inside the
    /// byte (exact after a full build; removals leave bits set), so a
    /// rebuild knows when no prefix can lie above the changed one.
    pub(super) levels: u16,
}

/// A block's hidden prefixes while it is built: few or none, so on the
/// stack.
type Hidden = SmallVec<[(u16, [u8; 4]); 16]>;

/// Where a stored prefix keeps its payload (`DataBlock::cells_of`).
#[derive(Clone, Copy)]
enum Cells {
    /// Hidden slot `i`.
    Hidden(usize),
    /// Every run in `first..=last` with `code`, `first` among them.
    Runs { first: usize, last: usize, code: u8 },
}

/// A data block of one run holding `Leaf::NONE`, never freed: lets a
/// reader load "some block's leaf" without a branch (see `direct.rs`).
#[repr(C)]
pub(crate) struct StaticBlock {
    header: DataBlock,
    /// The run's group: its code and three unused ones.
    code: [u8; 4],
    payload: PayloadCell,
}

pub(crate) static NONE_BLOCK: StaticBlock = StaticBlock {
    header: DataBlock {
        run_bits: Bits::FIRST,
        default: LeafCell::new(Leaf::NONE),
        n_runs: 1,
        n_prefixes: 0,
        n_hidden: 0,
        depth: 0,
        levels: 0,
    },
    code: [0; 4],
    payload: PayloadCell::new(0),
};

impl StaticBlock {
    /// The block.
    pub fn block(&'static self) -> &'static DataBlock {
        debug_assert_eq!(
            (
                std::mem::offset_of!(StaticBlock, payload),
                std::mem::offset_of!(StaticBlock, code)
            ),
            (RUNS_OFFSET + 4, RUNS_OFFSET),
            "the run sits where a block's runs are"
        );
        &self.header
    }
}

/// Where the runs start in a data block (what `layout` gives).
pub(super) const RUNS_OFFSET: usize = size_of::<DataBlock>();
const _: () = assert!(RUNS_OFFSET.is_multiple_of(align_of::<PayloadCell>()));

impl DataBlock {
    /// Layout and the offsets of (hidden indices, hidden payloads), by
    /// plain arithmetic (a block is built per write: `Layout::extend`'s
    /// checks showed in profiles); debug builds check it against
    /// `Layout::extend`'s.
    #[inline]
    fn layout(n_runs: usize, n_hidden: usize) -> (Layout, [usize; 2]) {
        let offsets = Self::offsets(n_runs, n_hidden);
        let align = align_of::<DataBlock>();
        let size = (offsets[1] + 4 * n_hidden).next_multiple_of(align);
        #[cfg(debug_assertions)]
        {
            let (checked, at) = Self::layout_checked(n_runs, n_hidden);
            assert_eq!(
                (checked.size(), checked.align(), at),
                (size, align, offsets)
            );
        }
        // SAFETY: the alignment is a type's; the size is at most a few KiB.
        (
            unsafe { Layout::from_size_align_unchecked(size, align) },
            offsets,
        )
    }

    /// `layout` by `Layout::extend`.
    #[cfg(debug_assertions)]
    fn layout_checked(n_runs: usize, n_hidden: usize) -> (Layout, [usize; 2]) {
        let runs =
            Layout::from_size_align(runs_bytes(n_runs), align_of::<PayloadCell>()).expect("runs");
        let (l, at_runs) = Layout::new::<DataBlock>().extend(runs).expect("layout");
        debug_assert_eq!(at_runs, RUNS_OFFSET);
        let (l, hidden) = l
            .extend(Layout::array::<u16>(n_hidden).expect("hidden"))
            .expect("layout");
        let (l, hidden_payloads) = l
            .extend(Layout::array::<PayloadCell>(n_hidden).expect("hidden payloads"))
            .expect("layout");
        (l.pad_to_align(), [hidden, hidden_payloads])
    }

    /// The offsets `layout` gives, by plain arithmetic.
    fn offsets(n_runs: usize, n_hidden: usize) -> [usize; 2] {
        let hidden = RUNS_OFFSET + runs_bytes(n_runs);
        [hidden, (hidden + 2 * n_hidden).next_multiple_of(4)]
    }

    /// Builds the block of a node at `depth` storing `prefixes` under
    /// `default`. Every byte gets its true run, those with a child too: a
    /// reader that loaded the child block before the child was added may
    /// read this block's run for it.
    pub fn build(
        arena: &Arena,
        depth: usize,
        prefixes: &Prefixes,
        default: Leaf,
    ) -> NonNull<DataBlock> {
        /// From this many prefixes on, painting the bytes beats cutting.
        const PAINT_FROM: usize = 8;
        let n_prefixes = prefixes.len();
        let mut runs = Runs::new();
        let winners = if n_prefixes >= PAINT_FROM {
            let winners = runs.paint(prefixes, default);
            runs.finish();
            winners
        } else {
            runs.fill(prefixes, default, 0, 256);
            runs.finish();
            runs.winners_in(0, 256)
        };
        // The winners are prefixes of the node: any others are hidden.
        let hidden: Hidden = if winners.count() == n_prefixes {
            Hidden::new()
        } else {
            prefixes
                .bits
                .ones()
                .filter(|&i| !winners.get(i))
                .map(|i| (i as u16, prefixes.get(i).expect("stored")))
                .collect()
        };
        let levels = prefixes.levels();
        Self::assemble(arena, depth, default, &runs, &hidden, n_prefixes, levels)
    }

    /// The block of the same node (at `depth`) with the prefix at `idx`
    /// stored with `payload` (`Some`) or removed (`None`). Only what the
    /// change can touch is recomputed: the runs in `idx`'s byte range, and
    /// whether `idx`, the prefixes inside its range and the longest one
    /// above it win any byte; the other runs and hidden prefixes are
    /// copied.
    pub fn with_prefix(
        &self,
        arena: &Arena,
        depth: usize,
        idx: usize,
        payload: Option<[u8; 4]>,
    ) -> NonNull<DataBlock> {
        if let Some(block) = self.with_spliced_prefix(arena, depth, idx, payload) {
            return block;
        }
        let (_, lo, hi) = index_range(idx);
        let default = self.default.load();
        let mut near = Prefixes::new();
        let above = self.prefixes_around(idx, &mut near);
        let had = near.get(idx).is_some();
        near.set(idx, payload);
        let n_prefixes =
            self.n_prefixes as usize + usize::from(payload.is_some()) - usize::from(had);

        let mut runs = Runs::new();
        runs.copy_old(self, 0, lo);
        runs.fill(&near, default, lo, hi);
        if hi < 256 {
            // The old run holding `hi` up to the next old run, then those.
            let run = self.run_of(hi as u8);
            runs.push(hi, self.payload(run), self.code(run));
            runs.copy_old(self, hi + 1, 256);
        }
        runs.finish();

        let touched = |i: usize| in_subtree(i, idx) || Some(i) == above;
        let (old_hidden, slots) = self.hidden();
        let mut hidden: Hidden = old_hidden
            .iter()
            .zip(slots)
            .filter(|(i, _)| !touched(**i as usize))
            .map(|(&i, slot)| (i, load_payload(slot)))
            .collect();
        let winners = runs.winners_in(lo, hi);
        for i in near.bits.ones() {
            // Bytes outside `lo..hi` keep their runs: only the prefix
            // above can win some of them.
            let wins_outside = Some(i) == above && self.wins_outside(i, lo, hi);
            if !winners.get(i) && !wins_outside {
                hidden.push((i as u16, near.get(i).expect("stored")));
            }
        }
        hidden.sort_unstable_by_key(|&(i, _)| i);
        let levels = self.levels | u16::from(payload.is_some()) << index_range(idx).0;
        Self::assemble(arena, depth, default, &runs, &hidden, n_prefixes, levels)
    }

    /// `with_prefix` for the commonest changes: a prefix stored new or
    /// removed where no prefix becomes hidden or visible. Within the
    /// prefix's bytes `lo..hi`, the runs that change are known without
    /// decoding the node: on a store, those won by the default or by the
    /// longest prefix above it (the only shorter prefix that can win a
    /// byte there) go to the new prefix; on a removal, the prefix's runs
    /// go to the longest prefix above it that is stored, else the
    /// default. The new block is spliced from the old one (`spliced`),
    /// or, when `lo..hi` is one run that stays one (a /24 or host route
    /// whose byte's neighbours keep other winners), it is the old one's
    /// bytes with that run's code and payload changed (`patched`). `None`
    /// when the change is not of this kind.
    fn with_spliced_prefix(
        &self,
        arena: &Arena,
        depth: usize,
        idx: usize,
        payload: Option<[u8; 4]>,
    ) -> Option<NonNull<DataBlock>> {
        // A hidden prefix changed (rare): the long path.
        if self.n_hidden != 0 && self.hidden().0.binary_search(&(idx as u16)).is_ok() {
            return None;
        }
        let (l, lo, hi) = index_range(idx);
        let own = code_of(l);
        let (first, last) = (self.run_of(lo as u8), self.run_of((hi - 1) as u8));
        // Only this prefix has its length inside its own range.
        let stored = (first..=last).any(|run| self.code(run) == own);
        // A run in `lo..hi` with code `c` changes: on a store, if won by a
        // shorter prefix or the default; on a removal, if won by this one.
        let shorter = |c: u8| own_bits(c).is_none_or(|ol| ol < l);
        let changes = |c: u8| {
            if payload.is_some() {
                shorter(c)
            } else {
                c == own
            }
        };
        // The winner they get.
        let (code, new_payload) = match payload {
            // A new value for a stored prefix: the writer stores it in place.
            Some(_) if stored => return None,
            Some(p) => {
                let mut wins = false;
                let mut above = None;
                for run in first..=last {
                    let c = self.code(run);
                    if shorter(c) {
                        wins = true;
                        above = above.or(own_bits(c));
                    }
                }
                // The new prefix, or the one above it, would win no byte.
                let above_hides =
                    above.is_some_and(|ol| !self.wins_outside(prefix_index(ol, lo as u8), lo, hi));
                if !wins || above_hides {
                    return None;
                }
                (own, p)
            }
            None if !stored => return None,
            None => {
                let above = (0..l)
                    .rev()
                    .filter(|ol| self.levels & 1 << ol != 0)
                    .find_map(|ol| Some((ol, self.cells_of(prefix_index(ol, lo as u8))?)));
                match above {
                    Some((ol, Cells::Runs { first, .. })) => (code_of(ol), self.payload(first)),
                    // A hidden prefix would win bytes again: the long path.
                    Some((_, Cells::Hidden(_))) => return None,
                    None => {
                        let default = self.default.load();
                        (default_code(default), default.payload)
                    }
                }
            }
        };
        let n_prefixes = self.n_prefixes as usize + usize::from(payload.is_some())
            - usize::from(payload.is_none());
        let levels = self.levels | u16::from(payload.is_some()) << l;
        // One run exactly over `lo..hi` keeps its place if its neighbours
        // keep other winners.
        let one_run =
            first == last && self.run_bits.get(lo) && (hi == 256 || self.run_bits.get(hi));
        let continues =
            |run: usize, start: usize| self.code(run) == code && same_winner(code, start, lo);
        let joins = || {
            (lo > 0
                && continues(
                    first - 1,
                    self.run_bits.last_one_upto(lo - 1).expect("bit 0"),
                ))
                || (hi < 256 && continues(last + 1, hi))
        };
        if one_run && !joins() {
            return Some(self.patched(arena, depth, first, code, new_payload, n_prefixes, levels));
        }
        // The new runs from the start of run `first` to the end of run
        // `last`: the old ones with the changed ones' winner replaced,
        // those with the same winner joined.
        let first_start = self.run_bits.last_one_upto(lo).expect("bit 0 is set");
        let end = self.run_bits.first_one_from(hi).unwrap_or(256);
        let mut mid = Splice::new();
        if first_start < lo {
            mid.push(first_start, self.code(first), self.payload(first));
        }
        for (run, start) in runs_overlapping(&self.run_bits, lo, hi) {
            let c = self.code(run);
            if changes(c) {
                mid.push(start.max(lo), code, new_payload);
            } else {
                mid.push(start.max(lo), c, self.payload(run));
            }
        }
        if end > hi {
            mid.push(hi, self.code(last), self.payload(last));
        }
        let (runs, span) = (first..last + 1, first_start..end);
        Some(self.spliced(arena, depth, runs, span, &mid, n_prefixes, levels))
    }

    /// This block with old runs `runs` (over bytes `span`) replaced by
    /// `mid`, the new runs over the same bytes, written straight into the
    /// new block: the runs before as they are (whole groups at once),
    /// `mid`, then the runs after; a new run at either edge joins its old
    /// neighbour when they have the same winner.
    #[allow(clippy::too_many_arguments)]
    fn spliced(
        &self,
        arena: &Arena,
        depth: usize,
        runs: Range<usize>,
        span: Range<usize>,
        mid: &Splice,
        n_prefixes: usize,
        levels: u16,
    ) -> NonNull<DataBlock> {
        let n_old = self.n_runs as usize;
        let (first, mut after) = (runs.start, runs.end);
        let mut mid = mid.runs();
        let mut bits = self.run_bits;
        bits.clear_range(span.start, span.end);
        // The run before the ones after `runs`, as (start, code).
        let mut prev = (first > 0).then(|| {
            let start = self
                .run_bits
                .last_one_upto(span.start - 1)
                .expect("bit 0 is set");
            (start, self.code(first - 1))
        });
        if let (Some((ps, pc)), Some(&(s, c, _))) = (prev, mid.first())
            && pc == c
            && same_winner(c, ps, s)
        {
            mid = &mid[1..];
        }
        for &(s, c, _) in mid {
            bits.set_raw(s);
            prev = Some((s, c));
        }
        // Run `after` starts at `span.end` (its bit still set).
        if let Some((ps, pc)) = prev
            && after < n_old
            && self.code(after) == pc
            && same_winner(pc, ps, span.end)
        {
            bits.clear_raw(span.end);
            after += 1;
        }
        bits.fix_ranks();
        let n_new = first + mid.len() + (n_old - after);
        let n_hidden = self.n_hidden as usize;
        let (layout, [at_hidden, at_hidden_payloads]) = Self::layout(n_new, n_hidden);
        let p = arena.alloc(layout).as_ptr();
        let block = NonNull::new(p.cast::<DataBlock>()).expect("arena block");
        let [old_hidden, old_hidden_payloads] = self.offsets_here();
        // SAFETY: a fresh allocation of the layout for `n_new` runs and
        // this block's hidden prefixes; the runs written are below
        // `n_new`, those read below `n_old`.
        unsafe {
            block.as_ptr().write(DataBlock {
                run_bits: bits,
                default: LeafCell::new(self.default.load()),
                n_runs: n_new as u16,
                n_prefixes: n_prefixes as u16,
                n_hidden: n_hidden as u8,
                depth: depth as u8,
                levels,
            });
            let (src, dst) = (self.at(RUNS_OFFSET), p.add(RUNS_OFFSET));
            copy_runs(src, 0, dst, 0, first);
            for (i, &(_, c, payload)) in mid.iter().enumerate() {
                write_run(dst, first + i, c, payload);
            }
            copy_runs(src, after, dst, first + mid.len(), n_old - after);
            for run in n_new..n_new.next_multiple_of(4) {
                dst.add(run_offsets(run)[0]).write(NO_MATCH);
            }
            ptr::copy_nonoverlapping(self.at(old_hidden), p.add(at_hidden), 2 * n_hidden);
            ptr::copy_nonoverlapping(
                self.at(old_hidden_payloads),
                p.add(at_hidden_payloads),
                4 * n_hidden,
            );
        }
        block
    }

    /// A copy of this block whose run `run` has `code` and `payload`.
    #[allow(clippy::too_many_arguments)]
    fn patched(
        &self,
        arena: &Arena,
        depth: usize,
        run: usize,
        code: u8,
        payload: [u8; 4],
        n_prefixes: usize,
        levels: u16,
    ) -> NonNull<DataBlock> {
        let copy = self.copy_to(arena);
        // SAFETY: a fresh copy of this block, unpublished: ours to write;
        // `run` < n_runs, so its code and payload lie inside it.
        unsafe {
            let block = copy.as_ptr();
            (*block).n_prefixes = n_prefixes as u16;
            (*block).levels = levels;
            // (A node's first block, `empty`'s, says depth 0.)
            (*block).depth = depth as u8;
            let [at_code, at_payload] = (*block).run_addresses(run);
            at_code.cast_mut().write(code);
            at_payload.cast_mut().cast::<[u8; 4]>().write(payload);
        }
        copy
    }

    /// Puts into `out` (empty) the prefixes inside `idx`'s byte range
    /// (`idx` included) and the longest prefix above it, which wins the
    /// bytes of the range that none inside wins: what a rebuild of the
    /// range reads. Returns the index of the one above.
    fn prefixes_around(&self, idx: usize, out: &mut Prefixes) -> Option<usize> {
        let (l_idx, lo, hi) = index_range(idx);
        let mut above: Option<(usize, [u8; 4])> = None;
        // Sorts a stored prefix: inside the range, above it, or neither.
        let take = |i: usize, payload: [u8; 4], out: &mut Prefixes, above: &mut Option<_>| {
            let li = index_range(i).0;
            if in_subtree(i, idx) {
                out.put(i, payload);
            } else if li < l_idx && idx >> (l_idx - li) == i && above.is_none_or(|(a, _)| a < i) {
                *above = Some((i, payload));
            }
        };
        // Takes the prefixes that win bytes in `lo..hi`; true if one of
        // those bytes inherits the default (no prefix covers it).
        let scan = |lo: usize, hi: usize, out: &mut Prefixes, above: &mut Option<_>| {
            let mut inherits = false;
            for (run, start) in runs_overlapping(&self.run_bits, lo, hi) {
                match winner_of(self.code(run), start) {
                    Some(i) => take(i, self.payload(run), out, above),
                    None => inherits = true,
                }
            }
            inherits
        };
        // Whether the longest visible prefix above is known: found, or
        // none can exist (a byte of its range inherits the default, or the
        // node stores nothing that short).
        let mut settled = self.levels & ((1 << l_idx) - 1) == 0;
        settled |= scan(lo, hi, out, &mut above);
        // One above that wins no byte in the range wins some in the range
        // of a shorter one: look in ever larger ranges, one sibling half
        // at a time (a longer one above, if visible, wins there first).
        let mut level = l_idx;
        while !settled && above.is_none() && level > 0 {
            let (_, slo, shi) = index_range((idx >> (l_idx - level)) ^ 1);
            settled |= scan(slo, shi, out, &mut above);
            level -= 1;
        }
        // Hidden ones, last: one above may be longer than the visible one.
        let (hidden, slots) = self.hidden();
        for (&i, slot) in hidden.iter().zip(slots) {
            take(i as usize, load_payload(slot), out, &mut above);
        }
        out.bits.fix_ranks();
        if let Some((a, payload)) = above {
            out.set(a, Some(payload));
        }
        above.map(|(a, _)| a)
    }

    /// Whether the node's prefix at `i`, which covers `lo..hi`, wins a byte
    /// of its range outside `lo..hi`.
    fn wins_outside(&self, i: usize, lo: usize, hi: usize) -> bool {
        let (l, alo, ahi) = index_range(i);
        let code = code_of(l);
        let left = (alo < lo).then(|| self.run_of(alo as u8)..=self.run_of((lo - 1) as u8));
        let right = (hi < ahi).then(|| self.run_of(hi as u8)..=self.run_of((ahi - 1) as u8));
        left.into_iter()
            .chain(right)
            .flatten()
            .any(|run| self.code(run) == code)
    }

    /// Allocates and fills a block: `runs` (finished), then `hidden`
    /// (ascending indices).
    fn assemble(
        arena: &Arena,
        depth: usize,
        default: Leaf,
        runs: &Runs,
        hidden: &[(u16, [u8; 4])],
        n_prefixes: usize,
        levels: u16,
    ) -> NonNull<DataBlock> {
        let (layout, [at_hidden, at_hidden_payloads]) = Self::layout(runs.n, hidden.len());
        let p = arena.alloc(layout).as_ptr();
        let block = NonNull::new(p.cast::<DataBlock>()).expect("arena block");
        // SAFETY: fresh allocation of the right layout; offsets from
        // `layout`. A payload cell holds a payload's bytes.
        unsafe {
            block.as_ptr().write(DataBlock {
                run_bits: runs.bits,
                default: LeafCell::new(default),
                n_runs: runs.n as u16,
                n_prefixes: n_prefixes as u16,
                n_hidden: hidden.len() as u8,
                depth: depth as u8,
                levels,
            });
            let bytes = runs.bytes();
            ptr::copy_nonoverlapping(bytes.as_ptr().cast::<u8>(), p.add(RUNS_OFFSET), bytes.len());
            let (at_idx, at_payload) = (
                p.add(at_hidden).cast::<u16>(),
                p.add(at_hidden_payloads).cast::<[u8; 4]>(),
            );
            for (i, &(idx, payload)) in hidden.iter().enumerate() {
                at_idx.add(i).write(idx);
                at_payload.add(i).write(payload);
            }
        }
        block
    }

    /// A block with no prefixes: every byte maps to `default` (what
    /// `build` gives for no prefixes, written directly: every new node
    /// starts with one).
    pub fn empty(arena: &Arena, default: Leaf) -> NonNull<DataBlock> {
        let (layout, _) = Self::layout(1, 0);
        let p = arena.alloc(layout).as_ptr();
        let block = NonNull::new(p.cast::<DataBlock>()).expect("arena block");
        // SAFETY: a fresh allocation of the layout for one run, whose
        // group of four codes is written whole.
        unsafe {
            block.as_ptr().write(DataBlock {
                run_bits: Bits::FIRST,
                default: LeafCell::new(default),
                n_runs: 1,
                n_prefixes: 0,
                n_hidden: 0,
                depth: 0,
                levels: 0,
            });
            let runs = p.add(RUNS_OFFSET);
            write_run(runs, 0, default_code(default), default.payload);
            (1..4).for_each(|run| runs.add(run_offsets(run)[0]).write(NO_MATCH));
        }
        block
    }

    #[inline(always)]
    fn at(&self, offset: usize) -> *const u8 {
        // SAFETY: offsets come from `layout` for this block's counts.
        unsafe { ptr::from_ref(self).cast::<u8>().add(offset) }
    }

    #[inline(always)]
    fn offsets_here(&self) -> [usize; 2] {
        Self::offsets(self.n_runs as usize, self.n_hidden as usize)
    }

    /// Number of runs (for tests).
    #[cfg(test)]
    fn n_runs(&self) -> usize {
        self.n_runs as usize
    }

    /// Where run `run`'s code and payload are (to prefetch, then load).
    #[inline(always)]
    pub fn run_addresses(&self, run: usize) -> [*const u8; 2] {
        run_offsets(run).map(|offset| self.at(RUNS_OFFSET + offset))
    }

    /// Run `run`'s payload cell (`run < n_runs`).
    #[inline(always)]
    fn payload_cell(&self, run: usize) -> &PayloadCell {
        debug_assert!(run < self.n_runs as usize);
        // SAFETY: run < n_runs: written by `build` at this offset.
        unsafe { &*self.run_addresses(run)[1].cast::<PayloadCell>() }
    }

    /// Run `run`'s payload.
    #[inline(always)]
    pub(super) fn payload(&self, run: usize) -> [u8; 4] {
        load_payload(self.payload_cell(run))
    }

    /// Run `run`'s code (`run < n_runs`).
    #[inline(always)]
    pub(super) fn code(&self, run: usize) -> u8 {
        debug_assert!(run < self.n_runs as usize);
        // SAFETY: run < n_runs: written by `build` at this offset.
        unsafe { *self.run_addresses(run)[0] }
    }

    /// The hidden prefixes' indices (ascending) and payloads.
    pub(super) fn hidden(&self) -> (&[u16], &[PayloadCell]) {
        let [at_hidden, at_payloads] = self.offsets_here();
        let n = self.n_hidden as usize;
        // SAFETY: n hidden indices and payloads at these offsets.
        unsafe {
            (
                std::slice::from_raw_parts(self.at(at_hidden).cast::<u16>(), n),
                std::slice::from_raw_parts(self.at(at_payloads).cast::<PayloadCell>(), n),
            )
        }
    }

    /// The run holding byte `b`.
    #[inline(always)]
    pub fn run_of(&self, b: u8) -> usize {
        // Bit 0 is always set, so the rank is at least 1.
        self.run_bits.rank_incl(b as usize) - 1
    }

    /// The leaf of run `run` (`run < n_runs`): its payload, and the
    /// length its code gives (chosen without a branch: whether a run is
    /// inherited is unpredictable for random keys).
    #[inline(always)]
    pub fn leaf_at(&self, run: usize) -> Leaf {
        let (payload, code) = (self.payload(run), self.code(run));
        let own = (u32::from(self.depth) << 3).wrapping_add(u32::from(code).wrapping_sub(1));
        // The default's length, or no match (`u32::MAX`) for NO_MATCH.
        let inherited = self.default.load().prefixlen;
        Leaf {
            payload,
            prefixlen: std::hint::select_unpredictable(
                code == NO_MATCH || code == INHERITED,
                inherited,
                own,
            ),
        }
    }

    /// The leaf for byte `b`: the longest prefix of this node covering
    /// `b`, else the inherited default. For a byte with a child, that is
    /// what the child inherits.
    #[inline(always)]
    pub fn leaf(&self, b: u8) -> Leaf {
        self.leaf_at(self.run_of(b))
    }

    /// Where the stored prefix at `idx` keeps its payload, if it is
    /// stored: its hidden slot, else the runs of its byte range that carry
    /// its code (only this prefix has its length inside its own range, so
    /// a run there with that code is one it wins).
    #[inline]
    fn cells_of(&self, idx: usize) -> Option<Cells> {
        if self.n_hidden > 0
            && let Ok(i) = self.hidden().0.binary_search(&(idx as u16))
        {
            return Some(Cells::Hidden(i));
        }
        let (l, lo, hi) = index_range(idx);
        let code = code_of(l);
        let last = self.run_of((hi - 1) as u8);
        let first = (self.run_of(lo as u8)..=last).find(|&run| self.code(run) == code)?;
        Some(Cells::Runs { first, last, code })
    }

    /// Writer: the stored prefix at `idx` gets the new `payload` (nothing
    /// happens if it is not stored).
    pub fn set_prefix_payload(&self, idx: usize, payload: [u8; 4]) {
        match self.cells_of(idx) {
            Some(Cells::Hidden(i)) => store_payload(&self.hidden().1[i], payload),
            Some(Cells::Runs { first, last, code }) => {
                for run in (first..=last).filter(|&run| self.code(run) == code) {
                    store_payload(self.payload_cell(run), payload);
                }
            }
            None => {}
        }
    }

    /// Writer: the inherited default (the same prefix) gets the new
    /// `payload`, and so does every run that inherits it.
    pub fn set_inherited_payload(&self, payload: [u8; 4]) {
        self.default.set_payload(payload);
        for run in (0..self.n_runs as usize).filter(|&run| self.code(run) == INHERITED) {
            store_payload(self.payload_cell(run), payload);
        }
    }

    /// The prefixes stored in this node, with their payloads.
    pub fn prefixes(&self) -> Prefixes {
        let mut out = Prefixes::new();
        for (run, start) in self.run_bits.ones().enumerate() {
            if let Some(idx) = winner_of(self.code(run), start) {
                out.put(idx, self.payload(run));
            }
        }
        let (hidden, slots) = self.hidden();
        for (&idx, slot) in hidden.iter().zip(slots) {
            out.put(idx as usize, load_payload(slot));
        }
        out.bits.fix_ranks();
        out
    }

    /// Payload of the prefix at `idx`, if stored.
    #[inline]
    pub fn prefix(&self, idx: usize) -> Option<[u8; 4]> {
        Some(match self.cells_of(idx)? {
            Cells::Hidden(i) => load_payload(&self.hidden().1[i]),
            Cells::Runs { first, .. } => self.payload(first),
        })
    }

    /// Number of hidden prefixes (for tests).
    #[cfg(test)]
    pub fn hidden_len(&self) -> usize {
        self.n_hidden as usize
    }

    /// Whether the node stores no prefixes.
    pub fn has_no_prefixes(&self) -> bool {
        self.n_prefixes == 0
    }

    /// Bytes of the block.
    pub fn size(&self) -> usize {
        Self::layout(self.n_runs as usize, self.n_hidden as usize)
            .0
            .size()
    }

    /// A copy of the block from `arena` (to compact it). Writer only: no
    /// payload may change while it is copied.
    pub fn copy_to(&self, arena: &Arena) -> NonNull<DataBlock> {
        let layout = Self::layout(self.n_runs as usize, self.n_hidden as usize).0;
        let p = arena.alloc(layout);
        let from = ptr::from_ref(self).cast::<u8>();
        // SAFETY: the block's bytes are ours to read (as `at` reads them),
        // the new block is fresh and as long.
        unsafe { ptr::copy_nonoverlapping(from, p.as_ptr(), layout.size()) };
        p.cast()
    }

    /// Gives the block back to the arena.
    ///
    /// # Safety
    /// No one can reach the block any more.
    pub unsafe fn free(arena: &Arena, block: *mut DataBlock) {
        // SAFETY: allocated by `build` from this arena with these counts.
        unsafe {
            let (n, h) = ((*block).n_runs as usize, (*block).n_hidden as usize);
            arena.release(block.cast(), Self::layout(n, h).0.size())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lpm::node::prefix_index;

    #[test]
    fn data_block_paints_longest_prefix_per_byte() {
        let mut prefixes = Prefixes::new();
        prefixes.set(prefix_index(1, 0x00), Some([7; 4])); // 0xxxxxxx -> 7
        prefixes.set(prefix_index(8, 0x10), Some([9; 4])); // 00010000 -> 9
        prefixes.set(prefix_index(2, 0xc0), Some([5; 4])); // 11xxxxxx -> 5, hidden:
        prefixes.set(prefix_index(3, 0xc0), Some([6; 4])); // 110xxxxx
        prefixes.set(prefix_index(3, 0xe0), Some([8; 4])); // 111xxxxx
        let leaf = |x: u8, prefixlen| Leaf {
            payload: [x; 4],
            prefixlen,
        };
        let arena = Arena::new();
        let block = DataBlock::build(&arena, 1, &prefixes, leaf(3, 4));
        // SAFETY: just built, private.
        let d = unsafe { block.as_ref() };
        let got: Vec<Leaf> = [0, 0x10, 0x11, 0x7f, 0x80, 0xbf, 0xc0, 0xff]
            .iter()
            .map(|&b| d.leaf(b))
            .collect();
        assert_eq!(
            got,
            vec![
                leaf(7, 9),
                leaf(9, 16),
                leaf(7, 9),
                leaf(7, 9),
                leaf(3, 4),
                leaf(3, 4),
                leaf(6, 11),
                leaf(8, 11),
            ]
        );
        assert_eq!((d.n_runs, d.n_hidden, d.n_prefixes), (6, 1, 5));
        assert_eq!(d.levels, 1 << 1 | 1 << 2 | 1 << 3 | 1 << 8);
        assert_eq!(
            (
                d.prefix(prefix_index(8, 0x10)),
                d.prefix(prefix_index(2, 0xc0)),
                d.prefix(3)
            ),
            (Some([9; 4]), Some([5; 4]), None)
        );
        assert_eq!(d.prefixes(), prefixes);
        // New payloads in place: a visible prefix, a hidden one, the default.
        d.set_prefix_payload(prefix_index(1, 0x00), [1; 4]);
        d.set_prefix_payload(prefix_index(2, 0xc0), [2; 4]);
        d.set_inherited_payload([4; 4]);
        assert_eq!(
            (d.leaf(0x11), d.leaf(0x10), d.leaf(0x80), d.default.load()),
            (leaf(1, 9), leaf(9, 16), leaf(4, 4), leaf(4, 4))
        );
        prefixes.set(prefix_index(1, 0x00), Some([1; 4]));
        prefixes.set(prefix_index(2, 0xc0), Some([2; 4]));
        assert_eq!(d.prefixes(), prefixes);
        // SAFETY: private.
        unsafe { DataBlock::free(&arena, block.as_ptr()) };
    }

    /// Removing a prefix whose range is all its own: the bytes go to the
    /// longest prefix above, found outside the range (here past a hidden
    /// shorter one), as a full build gives them.
    #[test]
    fn a_removal_uncovers_the_longest_prefix_above() {
        let arena = Arena::new();
        let mut set = Prefixes::new();
        set.set(prefix_index(1, 0x00), Some([1; 4])); // hidden by the two below
        set.set(prefix_index(2, 0x00), Some([2; 4]));
        set.set(prefix_index(2, 0x40), Some([3; 4]));
        set.set(prefix_index(8, 0x00), Some([4; 4]));
        let before = DataBlock::build(&arena, 0, &set, Leaf::NONE);
        // SAFETY: private blocks.
        let after = unsafe { before.as_ref() }.with_prefix(&arena, 0, prefix_index(8, 0x00), None);
        set.set(prefix_index(8, 0x00), None);
        let full = DataBlock::build(&arena, 0, &set, Leaf::NONE);
        // SAFETY: private blocks.
        let (after, full) = unsafe { (after.as_ref(), full.as_ref()) };
        assert_eq!(after.leaf(0x00).payload, [2; 4]);
        assert_eq!(
            (0..=255).map(|b| after.leaf(b)).collect::<Vec<_>>(),
            (0..=255).map(|b| full.leaf(b)).collect::<Vec<_>>()
        );
        assert_eq!(after.prefixes(), set);
    }

    /// `empty` writes what `build` gives for no prefixes.
    #[test]
    fn empty_blocks_are_builds_of_nothing() {
        let arena = Arena::new();
        for default in [Leaf::NONE, default_leaf()] {
            let (empty, built) = (
                DataBlock::empty(&arena, default),
                DataBlock::build(&arena, 0, &Prefixes::new(), default),
            );
            // SAFETY: private blocks of the same size, freed below.
            unsafe {
                let size = built.as_ref().size();
                assert_eq!(empty.as_ref().size(), size);
                let bytes = |b: NonNull<DataBlock>| {
                    std::slice::from_raw_parts(b.as_ptr().cast::<u8>(), size)
                };
                assert_eq!(bytes(empty), bytes(built));
                DataBlock::free(&arena, empty.as_ptr());
                DataBlock::free(&arena, built.as_ptr());
            }
        }
    }

    #[test]
    fn the_static_block_answers_none() {
        let d = NONE_BLOCK.block();
        assert_eq!((d.leaf(0), d.leaf(255)), (Leaf::NONE, Leaf::NONE));
        assert_eq!(d.prefixes(), Prefixes::new());
    }

    use proptest::prelude::*;

    /// Prefix indices of a node, each with a payload from a few values
    /// (so neighbours of the same length often share one).
    fn node_contents() -> impl Strategy<Value = Vec<(usize, u8)>> {
        prop::collection::vec((2usize..512, 0u8..3), 0..40)
    }

    fn prefixes_of(idxs: &[(usize, u8)]) -> Prefixes {
        let mut p = Prefixes::new();
        for &(i, v) in idxs {
            p.set(i, Some([v; 4]));
        }
        p
    }

    fn default_leaf() -> Leaf {
        Leaf {
            payload: [1; 4],
            prefixlen: 3,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::scaled(256, 3) as u32))]

        /// A chain of changes, each rebuilding only the changed prefix's
        /// byte range from the block before, gives the same runs, leaves,
        /// hidden prefixes and counts as a full build of the same prefixes,
        /// and the block gives back the prefixes it holds.
        #[test]
        fn incremental_builds_match_full(
            idxs in node_contents(),
            changes in prop::collection::vec((1usize..512, prop::option::of(0u8..3)), 1..crate::scaled(12, 4)),
            no_default in any::<bool>(),
        ) {
            let changes = changes.into_iter().map(|(idx, v)| (idx, v.map(|v| [v; 4])));
            changes_match_full_builds(prefixes_of(&idxs), no_default, changes)?;
        }

        /// The same for dense nodes of whole-byte prefixes (host routes)
        /// with a few shorter ones, changed mostly one whole byte at a
        /// time, the others a few bytes: the changes `with_prefix` makes by
        /// patching or splicing a copy.
        #[test]
        fn spliced_changes_match_full_builds(
            bytes in any::<[u64; 4]>(),
            shorter in prop::collection::vec((2usize..256, 0u8..3), 0..4),
            changes in prop::collection::vec(
                (5u32..12, any::<u8>(), prop::option::of(0u8..3)),
                1..crate::scaled(24, 3),
            ),
            no_default in any::<bool>(),
        ) {
            let mut set = prefixes_of(&shorter);
            // Each byte stored with probability 1/2 (a bit of `bytes`).
            for b in (0..256).filter(|&b| bytes[b / 64] >> (b % 64) & 1 == 1) {
                set.set(prefix_index(8, b as u8), Some([b as u8 % 3; 4]));
            }
            set.bits.fix_ranks();
            let changes = changes
                .into_iter()
                .map(|(l, b, v)| (prefix_index(l.min(8), b), v.map(|v| [v; 4])));
            changes_match_full_builds(set, no_default, changes)?;
        }
    }

    /// Applies `changes` one by one with `with_prefix`, each from the
    /// block before, and checks each block against a full build of the
    /// same prefixes: runs, leaves, hidden prefixes, counts, size, and the
    /// prefixes it gives back.
    fn changes_match_full_builds(
        mut set: Prefixes,
        no_default: bool,
        changes: impl Iterator<Item = (usize, Option<[u8; 4]>)>,
    ) -> Result<(), TestCaseError> {
        let arena = Arena::new();
        let default = if no_default {
            Leaf::NONE
        } else {
            default_leaf()
        };
        let mut block = DataBlock::build(&arena, 2, &set, default);
        let mut blocks = vec![block];
        for (idx, payload) in changes {
            set.set(idx, payload);
            // SAFETY: private blocks.
            block = unsafe { block.as_ref() }.with_prefix(&arena, 2, idx, payload);
            let full = DataBlock::build(&arena, 2, &set, default);
            blocks.extend([block, full]);
            // SAFETY: private blocks.
            let (inc, full) = unsafe { (block.as_ref(), full.as_ref()) };
            // Under Miri, a sample: the builds are what it checks.
            for byte in (0..=255u8).step_by(crate::scaled(1, 15)) {
                prop_assert_eq!(inc.leaf(byte), full.leaf(byte), "byte {}", byte);
            }
            prop_assert_eq!(inc.run_bits, full.run_bits);
            prop_assert_eq!(inc.hidden().0, full.hidden().0);
            prop_assert_eq!((inc.n_prefixes, inc.size()), (full.n_prefixes, full.size()));
            prop_assert_eq!(inc.prefixes(), set.clone());
            for i in (1..512).step_by(crate::scaled(1, 17)) {
                prop_assert_eq!(inc.prefix(i), set.get(i), "idx {}", i);
            }
        }
        // SAFETY: private blocks.
        unsafe {
            blocks
                .iter()
                .for_each(|p| DataBlock::free(&arena, p.as_ptr()))
        };
        Ok(())
    }

    /// Host-route churn in a full block of them (the kernel's LPM bench
    /// shape), removals that join runs, an insert that cuts one, and a
    /// shorter prefix stored and removed over them all take the short path
    /// and give what a full build gives; a prefix that would be hidden
    /// does not.
    #[test]
    fn spliced_changes_take_the_short_path() {
        let arena = Arena::new();
        let mut set = Prefixes::new();
        for b in 0..=255u8 {
            set.set(prefix_index(8, b), Some([b % 2; 4]));
        }
        set.bits.fix_ranks();
        let mut blocks = vec![DataBlock::build(&arena, 3, &set, Leaf::NONE)];
        // (prefix length, byte, new payload, runs after or `None` for the
        // long path): 7 out and back in (patched copies), out again; 8
        // and 6 out (runs joined); 7 back in (a run of three bytes cut in
        // three); 5 out (joined with 6); a /6 of the node over bytes 4..8
        // wins 5 and 6, then goes; one over bytes 12..16, all taken, would
        // be hidden.
        let steps = [
            (8, 7, None, Some(256)),
            (8, 7, Some([1; 4]), Some(256)),
            (8, 7, None, Some(256)),
            (8, 8, None, Some(255)),
            (8, 6, None, Some(254)),
            (8, 7, Some([3; 4]), Some(256)),
            (8, 5, None, Some(255)),
            (6, 4, Some([2; 4]), Some(255)),
            (6, 4, None, Some(255)),
            (6, 12, Some([2; 4]), None),
        ];
        for (l, b, payload, n_runs) in steps {
            let idx = prefix_index(l, b);
            set.set(idx, payload);
            // SAFETY: private blocks, freed below.
            let last = unsafe { blocks.last().expect("one").as_ref() };
            let Some(next) = last.with_spliced_prefix(&arena, 3, idx, payload) else {
                assert_eq!(n_runs, None, "the short path for /{l} at {b}");
                continue;
            };
            assert!(n_runs.is_some(), "the long path for /{l} at {b}");
            let full = DataBlock::build(&arena, 3, &set, Leaf::NONE);
            blocks.extend([full, next]); // `next` last, for the next step
            // SAFETY: private blocks.
            let (next, full) = unsafe { (next.as_ref(), full.as_ref()) };
            assert_eq!(next.prefixes(), set);
            assert_eq!((next.run_bits, next.size()), (full.run_bits, full.size()));
            // Under Miri, a sample: the builds are what it checks.
            let sample = (0..=255u8).step_by(crate::scaled(1, 15));
            assert!(sample.into_iter().all(|x| next.leaf(x) == full.leaf(x)));
            assert_eq!(Some(next.n_runs()), n_runs);
        }
        // SAFETY: private blocks.
        unsafe {
            blocks
                .iter()
                .for_each(|p| DataBlock::free(&arena, p.as_ptr()))
        };
    }
}
