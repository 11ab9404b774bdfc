//! A node's prefixes and children read in place, in the two orders
//! iteration gives them: post-order for `get_next_key` (the first unit
//! after a place, found from a few runs around it) and pre-order for
//! `for_each` and `covered` (one pass over the runs marks the stored
//! indices on the stack). Neither decodes the node's whole prefix set
//! (`DataBlock::prefixes`), which would cost a pass and 2 KiB per visit
//! however little of the node a call needs.

use super::leaf::{code_of, winner_of};
use super::runs::runs_overlapping;
use super::{Children, DataBlock, Node, index_range, prefix_index};
use crate::lpm::bits::{Bits, Ones};

/// One unit of a node in iteration order: a stored prefix (its index and
/// payload), or the child at a byte.
#[derive(Clone, Copy)]
pub(crate) enum Unit<'g> {
    Prefix(usize, [u8; 4]),
    Child(u8, &'g Node),
}

/// The child at byte `c` of `children`, if any.
fn child_at<'g>(children: Option<Children<'g>>, c: usize) -> Option<&'g Node> {
    let ch = children.filter(|ch| ch.bits.get(c))?;
    // SAFETY: the bit says the entry exists.
    Some(unsafe { ch.node(ch.bits.rank(c)) })
}

/// A unit's place in post-order inside its node, as one number: the last
/// byte it covers times 16, plus `9 - l` for a prefix of `l` bits and 0
/// for the child at that byte. So longer prefixes come before the
/// shorter ones that contain them, and a child's subtree (all longer)
/// before the node's prefixes that contain its byte.
pub(crate) fn post_key(idx: usize) -> u16 {
    let (l, _, hi) = index_range(idx);
    ((hi - 1) << 4) as u16 | (9 - l) as u16
}

/// The post-order key of the child at byte `c` (see [`post_key`]).
pub(crate) fn child_post_key(c: u8) -> u16 {
    u16::from(c) << 4
}

/// The first unit of the node (`data`, `children`) whose post-order key
/// is `from` or more (0: the first of all), with its key. Reads the
/// child bits and the runs from byte `from / 16` on until the answer is
/// known: the units wholly after that byte come first in address order
/// (only nesting reorders them, at most 9 deep), and the prefixes that
/// cover it are checked one level at a time, longest first, while they
/// could still come first.
pub(crate) fn next_post<'g>(
    data: &DataBlock,
    children: Option<Children<'g>>,
    from: u16,
) -> Option<(u16, Unit<'g>)> {
    let (e, r) = (usize::from(from >> 4), u32::from(from & 15));
    if r == 0
        && let Some(child) = child_at(children, e)
    {
        return Some((from, Unit::Child(e as u8, child)));
    }
    // The first unit wholly after byte `e`: the first child there, unless
    // a prefix inside `e + 1..` ends before it.
    let mut best = children
        .and_then(|ch| ch.bits.first_one_from(e + 1))
        .and_then(|c| {
            Some((
                child_post_key(c as u8),
                Unit::Child(c as u8, child_at(children, c)?),
            ))
        });
    let limit = best.map_or(u16::MAX, |(key, _)| key);
    if let Some((key, idx, payload)) = data.first_prefix_from(e + 1, limit) {
        best = Some((key, Unit::Prefix(idx, payload)));
    }
    // A prefix covering `e` comes first if it ends before that unit. The
    // longer, the sooner: the first stored one from level `9 - r` down.
    let limit = best.map_or(u16::MAX, |(key, _)| key);
    let Some(top) = 9u32.checked_sub(r) else {
        return best;
    };
    for l in (0..=top.min(8)).rev() {
        let idx = prefix_index(l, e as u8);
        let key = post_key(idx);
        if key >= limit {
            break;
        }
        if let Some(payload) = data.covering_payload(idx, e) {
            return Some((key, Unit::Prefix(idx, payload)));
        }
    }
    best
}

impl DataBlock {
    /// Of the stored prefixes that start at byte `a` or later, the one
    /// first in post-order (the first to end; the longest on a tie), if
    /// its key is below `limit`: its key, index and payload. A hidden
    /// prefix is never that one: the byte it ends with is won by a longer
    /// prefix inside it, which ends no later; so only the runs are read.
    fn first_prefix_from(&self, a: usize, mut limit: u16) -> Option<(u16, usize, [u8; 4])> {
        if a >= 256 {
            return None;
        }
        let mut best = None;
        for (run, start) in runs_overlapping(&self.run_bits, a, 256) {
            // A prefix winning this run or a later one ends at `start` or
            // after, so its key is above `start * 16`.
            if (start << 4) >= usize::from(limit) {
                break;
            }
            if let Some(idx) = winner_of(self.code(run), start) {
                let key = post_key(idx);
                if index_range(idx).1 >= a && key < limit {
                    limit = key;
                    best = Some((key, idx, self.payload(run)));
                }
            }
        }
        best
    }

    /// The payload of the prefix at `idx`, which covers byte `e`, if
    /// stored. `next_post` asks only when no longer stored prefix covers
    /// `e + 1` (it asks the longest first, and those longer than its
    /// bound end by `e`) and none starts inside `idx` after `e`: then if
    /// `idx` ends after `e`, it is stored exactly when it wins byte
    /// `e + 1`, one run to read.
    fn covering_payload(&self, idx: usize, e: usize) -> Option<[u8; 4]> {
        let (l, _, hi) = index_range(idx);
        if self.levels & (1 << l) == 0 {
            return None;
        }
        if hi - 1 > e {
            let run = self.run_of((e + 1) as u8);
            return (self.code(run) == code_of(l)).then(|| self.payload(run));
        }
        self.prefix(idx)
    }

    /// The payload of the stored prefix at `idx`, which starts at byte
    /// `at`: in the run holding `at` unless a longer prefix starts there
    /// too.
    fn stored_payload(&self, idx: usize, at: usize) -> [u8; 4] {
        let run = self.run_of(at as u8);
        if self.code(run) == code_of(index_range(idx).0) {
            return self.payload(run);
        }
        self.prefix(idx).expect("a stored prefix")
    }
}

/// The units under index `root` of a node in pre-order: a prefix before
/// the longer ones inside it, which come in address order, and the child
/// at a byte after the node's prefixes that start there.
pub(crate) struct PreOrder<'g> {
    data: &'g DataBlock,
    children: Option<Children<'g>>,
    /// The stored indices under `root`: marked from the winners of the
    /// runs and the hidden list, so no prefix is looked for in vain.
    stored: Bits<8>,
    /// The bytes where a stored prefix under `root` or a child starts.
    starts: Ones<4>,
    /// The byte whose units come next, and the next level to try there
    /// (9: the child; 10: the byte is done).
    at: usize,
    level: u32,
    min_level: u32,
}

impl<'g> PreOrder<'g> {
    /// The walk of the units under `root` (1: the whole node).
    pub fn new(data: &'g DataBlock, children: Option<Children<'g>>, root: usize) -> Self {
        let (min_level, lo, hi) = index_range(root);
        let mut stored = Bits::<8>::EMPTY;
        let mut starts = Bits::<4>::EMPTY;
        let mut mark = |idx: usize| {
            let (l, at, _) = index_range(idx);
            if l >= min_level && (lo..hi).contains(&at) {
                stored.set_raw(idx);
                starts.set_raw(at);
            }
        };
        for (run, start) in runs_overlapping(&data.run_bits, lo, hi) {
            if let Some(idx) = winner_of(data.code(run), start) {
                mark(idx);
            }
        }
        for &i in data.hidden().0 {
            mark(usize::from(i));
        }
        if let Some(ch) = children {
            starts.or_words(&ch.bits.words_in(lo, hi));
        }
        PreOrder {
            data,
            children,
            stored,
            starts: starts.ones(),
            at: 0,
            level: 10,
            min_level,
        }
    }
}

impl<'g> Iterator for PreOrder<'g> {
    type Item = Unit<'g>;

    fn next(&mut self) -> Option<Unit<'g>> {
        loop {
            if self.level <= 8 {
                let idx = prefix_index(self.level, self.at as u8);
                self.level += 1;
                if self.stored.get(idx) {
                    let payload = self.data.stored_payload(idx, self.at);
                    return Some(Unit::Prefix(idx, payload));
                }
            } else if self.level == 9 {
                self.level = 10;
                if let Some(child) = child_at(self.children, self.at) {
                    return Some(Unit::Child(self.at as u8, child));
                }
            } else {
                self.at = self.starts.next()?;
                // Prefixes start at `at` from the level whose ranges are
                // as aligned as `at` (level 0 at byte 0).
                let aligned = (self.at as u8).trailing_zeros();
                self.level = (8 - aligned).max(self.min_level);
            }
        }
    }
}
