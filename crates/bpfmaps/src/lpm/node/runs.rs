//! The run-length encoder that builds a data block's runs.

use std::mem::MaybeUninit;
use std::ptr;

use smallvec::SmallVec;

use super::leaf::{NO_MATCH, code_of, default_code, same_winner, winner_of};
use super::{DataBlock, Leaf, Prefixes, index_range, prefix_index};
use crate::lpm::bits::Bits;

/// Bytes of `n` runs: whole groups of four codes and four payloads, and a
/// last group with four codes and its payloads.
pub(super) const fn runs_bytes(n: usize) -> usize {
    20 * (n / 4) + [0, 8, 12, 16][n % 4]
}

/// Offsets of run `run`'s code and payload from the start of the runs.
#[inline(always)]
pub(super) const fn run_offsets(run: usize) -> [usize; 2] {
    let group = 20 * (run / 4);
    [group + run % 4, group + 4 + 4 * (run % 4)]
}

/// Run-length encoder for a block's runs: a run is a maximal range of
/// bytes with the same winner (the inherited default, or one prefix). The
/// runs are kept as the block lays them out, so the block gets them with
/// one copy.
pub(super) struct Runs {
    pub(super) bits: Bits<4>,
    /// The first `n` runs are written (no 1 KiB of zeroes per build).
    buf: [MaybeUninit<u8>; runs_bytes(256)],
    pub(super) n: usize,
    /// Where the last run starts, and its code.
    last_start: usize,
    last_code: u8,
}

impl Runs {
    pub(super) fn new() -> Self {
        Runs {
            bits: Bits::default(),
            buf: [MaybeUninit::uninit(); runs_bytes(256)],
            n: 0,
            last_start: 0,
            last_code: 0,
        }
    }

    /// Whether a run starting at `start` with `code` has the last run's
    /// winner, so it continues that run.
    pub(super) fn continues(&self, start: usize, code: u8) -> bool {
        self.n > 0 && self.last_code == code && same_winner(code, self.last_start, start)
    }

    /// Appends a run (its start bit is the caller's).
    pub(super) fn append(&mut self, payload: [u8; 4], code: u8) {
        let [at_code, at_payload] = run_offsets(self.n);
        self.buf[at_code].write(code);
        let cell: &mut [MaybeUninit<u8>; 4] = (&mut self.buf[at_payload..at_payload + 4])
            .try_into()
            .expect("4 bytes");
        *cell = payload.map(MaybeUninit::new);
        self.n += 1;
        self.last_code = code;
    }

    /// Bytes from `start` on are won by the run with `code` and `payload`:
    /// a new run, unless the last run has the same winner.
    pub(super) fn push(&mut self, start: usize, payload: [u8; 4], code: u8) {
        if self.continues(start, code) {
            return;
        }
        self.bits.set_raw(start);
        self.append(payload, code);
        self.last_start = start;
    }

    /// Copies the old runs that start in `a..b` (each ending at the next
    /// start, or `b`); the first folds into ours if it has the same
    /// winner. Whole groups of four are copied at once when old and new
    /// runs line up (always for the runs before a change).
    pub(super) fn copy_old(&mut self, old: &DataBlock, a: usize, b: usize) {
        if a >= b {
            return;
        }
        let mut starts = old.run_bits.words_in(a, b);
        let mut first = old.run_bits.rank(a);
        let mut count: usize = starts.iter().map(|w| w.count_ones() as usize).sum();
        if count == 0 {
            return;
        }
        let w = starts.iter().position(|w| *w != 0).expect("count > 0");
        let first_start = 64 * w + starts[w].trailing_zeros() as usize;
        if self.continues(first_start, old.code(first)) {
            // The first old run continues our last one: drop its start.
            starts[w] &= starts[w] - 1;
            first += 1;
            count -= 1;
            if count == 0 {
                return;
            }
        }
        self.bits.or_words(&starts);
        // SAFETY: the old block holds runs `first..first + count`; our
        // buffer has room for 256 runs, and `n + count` <= 256.
        unsafe {
            copy_runs(
                old.run_addresses(0)[0],
                first,
                self.buf.as_mut_ptr().cast::<u8>(),
                self.n,
                count,
            )
        };
        self.n += count;
        self.last_code = old.code(first + count - 1);
        let w = starts.iter().rposition(|w| *w != 0).expect("count > 0");
        self.last_start = 64 * w + 63 - starts[w].leading_zeros() as usize;
    }

    /// Fresh runs for bytes `lo..hi` from `prefixes` (all those inside
    /// the range, and the longest above it) under `default`: the winner
    /// can change only where a prefix inside the range starts or ends, so
    /// cut there and give each segment the longest prefix covering its
    /// first byte.
    pub(super) fn fill(&mut self, prefixes: &Prefixes, default: Leaf, lo: usize, hi: usize) {
        let prefix_bits = &prefixes.bits;
        // Only the lengths the node stores are looked at.
        let levels = prefixes.levels();
        let best = |b: usize| {
            let mut left = levels;
            while left != 0 {
                let l = u16::BITS - 1 - left.leading_zeros();
                left &= !(1 << l);
                let idx = prefix_index(l, b as u8);
                if prefix_bits.get(idx) {
                    return (prefixes.get(idx).expect("stored"), code_of(l));
                }
            }
            (default.payload, default_code(default))
        };
        if hi - lo == 1 {
            // One byte (a full-byte prefix's range, the most common): one
            // run, no cuts.
            let (payload, code) = best(lo);
            self.push(lo, payload, code);
            return;
        }
        let mut cut_bits = Bits::<5>::default();
        cut_bits.set_raw(lo);
        cut_bits.set_raw(hi);
        let mut cut = |idx: usize| {
            let (_, plo, phi) = index_range(idx);
            cut_bits.set_raw(plo);
            cut_bits.set_raw(phi);
        };
        if (lo, hi) == (0, 256) {
            // A whole block: every prefix is inside.
            prefix_bits.ones().for_each(&mut cut);
        } else {
            // Only prefixes inside lo..hi: at each level, the indices
            // whose byte ranges fall within it.
            for l in (0..=8u32).filter(|l| levels & 1 << l != 0) {
                let shift = 8 - l;
                let (first, end) = (lo.div_ceil(1 << shift), hi >> shift);
                if first < end {
                    let base = 1usize << l;
                    prefix_bits
                        .ones_in(base + first, base + end)
                        .for_each(&mut cut);
                }
            }
        }
        let mut cuts = cut_bits.ones().peekable();
        while let Some(start) = cuts.next() {
            match cuts.peek() {
                Some(_) if start < hi => {
                    let (payload, code) = best(start);
                    self.push(start, payload, code);
                }
                _ => break,
            }
        }
    }

    /// The runs of a whole block (none yet) from `prefixes` under
    /// `default`, by painting: each byte gets the index of the longest
    /// prefix covering it (in index order prefixes come shortest first,
    /// so longer ones paint over shorter), and a run starts wherever that
    /// index changes. Returns the winners, the indices painted. `fill`
    /// cuts at prefix edges instead: cheaper for a few prefixes, dearer
    /// for many.
    pub(super) fn paint(&mut self, prefixes: &Prefixes, default: Leaf) -> Bits<8> {
        debug_assert_eq!(self.n, 0);
        let mut owner = [0u16; 256];
        for idx in prefixes.bits.ones() {
            let (_, lo, hi) = index_range(idx);
            owner[lo..hi].fill(idx as u16);
        }
        // Run starts: byte 0, and every byte whose owner differs from the
        // byte before (a loop the compiler turns into vector compares).
        let mut starts = [0u64; 4];
        for (w, word) in starts.iter_mut().enumerate() {
            for i in 0..64 {
                let b = 64 * w + i;
                let before = if b == 0 { u16::MAX } else { owner[b - 1] };
                *word |= u64::from(owner[b] != before) << i;
            }
        }
        let mut winners = Bits::default();
        for b in Bits::<4>::from_words(starts).ones() {
            self.bits.set_raw(b);
            self.last_start = b;
            let idx = owner[b] as usize;
            if idx == 0 {
                self.append(default.payload, default_code(default));
            } else {
                winners.set_raw(idx);
                let l = index_range(idx).0;
                self.append(prefixes.get(idx).expect("stored"), code_of(l));
            }
        }
        winners
    }

    /// Ends the runs: ranks, and the last group's unused codes.
    pub(super) fn finish(&mut self) {
        self.bits.fix_ranks();
        for run in self.n..self.n.next_multiple_of(4) {
            self.buf[run_offsets(run)[0]].write(NO_MATCH);
        }
    }

    pub(super) fn code(&self, run: usize) -> u8 {
        // SAFETY: the first n runs are written.
        unsafe { self.buf[run_offsets(run)[0]].assume_init() }
    }

    /// The node's prefixes that win a byte in `lo..hi` (after `finish`).
    pub(super) fn winners_in(&self, lo: usize, hi: usize) -> Bits<8> {
        let mut out = Bits::default();
        for (run, start) in runs_overlapping(&self.bits, lo, hi) {
            if let Some(idx) = winner_of(self.code(run), start) {
                out.set_raw(idx);
            }
        }
        out
    }

    /// The runs as the block lays them out (after `finish`).
    pub(super) fn bytes(&self) -> &[MaybeUninit<u8>] {
        &self.buf[..runs_bytes(self.n)]
    }
}

/// The runs of `bits` (run starts, ranks fixed) that overlap bytes
/// `lo..hi`, as (run, its first byte).
pub(super) fn runs_overlapping(
    bits: &Bits<4>,
    lo: usize,
    hi: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let first = bits.rank_incl(lo) - 1;
    let first_start = bits.last_one_upto(lo).expect("bit 0 is set");
    std::iter::once(first_start)
        .chain(bits.ones_in(lo + 1, hi))
        .enumerate()
        .map(move |(i, start)| (first + i, start))
}

/// The new runs of a splice (`DataBlock::spliced`) as (start, code,
/// payload), each pushed run joined with the one before when they have
/// the same winner. Few: those over one prefix's bytes.
pub(super) struct Splice(SmallVec<[(usize, u8, [u8; 4]); 8]>);

impl Splice {
    pub(super) fn new() -> Self {
        Splice(SmallVec::new())
    }

    /// Bytes from `start` on are won by the run with `code` and `payload`.
    pub(super) fn push(&mut self, start: usize, code: u8, payload: [u8; 4]) {
        if let Some(&(s, c, _)) = self.0.last()
            && c == code
            && same_winner(code, s, start)
        {
            return;
        }
        self.0.push((start, code, payload));
    }

    pub(super) fn runs(&self) -> &[(usize, u8, [u8; 4])] {
        &self.0
    }
}

/// Writes run `run`'s code and payload into the runs at `dst`.
///
/// # Safety
/// `dst` is the start of a block's runs with room for run `run`.
pub(super) unsafe fn write_run(dst: *mut u8, run: usize, code: u8, payload: [u8; 4]) {
    let [at_code, at_payload] = run_offsets(run);
    // SAFETY: the caller's.
    unsafe {
        dst.add(at_code).write(code);
        dst.add(at_payload)
            .cast::<[u8; 4]>()
            .write_unaligned(payload);
    }
}

/// Copies `count` runs from run `from` of the runs at `src` to run `to`
/// of those at `dst`: whole groups of four with one copy when both sides
/// line up, the rest one at a time, each run's code and payload bytes as
/// they are, the offsets on both sides stepped along their groups rather
/// than computed per run.
///
/// # Safety
/// `src` is the start of a block's runs holding runs `from..from+count`,
/// `dst` of another's (or a buffer's) with room for runs `to..to+count`,
/// and no one writes the source meanwhile (only the writer, the caller,
/// ever stores into a block).
pub(super) unsafe fn copy_runs(src: *const u8, from: usize, dst: *mut u8, to: usize, count: usize) {
    // A run's group offset and lane.
    let at = |run: usize| (20 * (run / 4), run % 4);
    let step = |(group, lane): (usize, usize)| {
        if lane == 3 {
            (group + 20, 0)
        } else {
            (group, lane + 1)
        }
    };
    let one = |(sg, sl): (usize, usize), (dg, dl): (usize, usize)| {
        // SAFETY: runs in bounds on both sides (the caller's).
        unsafe {
            dst.add(dg + dl).write(*src.add(sg + sl));
            ptr::copy_nonoverlapping(src.add(sg + 4 + 4 * sl), dst.add(dg + 4 + 4 * dl), 4);
        }
    };
    let (mut s, mut d, mut left) = (at(from), at(to), count);
    if s.1 == d.1 {
        while left > 0 && s.1 != 0 {
            one(s, d);
            (s, d, left) = (step(s), step(d), left - 1);
        }
        let groups = left / 4;
        // SAFETY: whole groups on both sides, in bounds (the caller's).
        unsafe { ptr::copy_nonoverlapping(src.add(s.0), dst.add(d.0), 20 * groups) };
        (s.0, d.0, left) = (s.0 + 20 * groups, d.0 + 20 * groups, left - 4 * groups);
    }
    while left > 0 {
        one(s, d);
        (s, d, left) = (step(s), step(d), left - 1);
    }
}
