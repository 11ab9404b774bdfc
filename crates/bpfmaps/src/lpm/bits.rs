//! Fixed-size bitmaps with a per-word rank cache, for popcount-compressed
//! node arrays: the index of the entry for position `i` is the number of set
//! bits below `i` (one cached count plus one `popcnt`).

/// A bitmap of `64 * W` bits with cached ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(super) struct Bits<const W: usize> {
    words: [u64; W],
    /// `rank[w]` = number of set bits in `words[..w]`.
    ranks: [u16; W],
}

impl<const W: usize> Default for Bits<W> {
    fn default() -> Self {
        Bits {
            words: [0; W],
            ranks: [0; W],
        }
    }
}

impl<const W: usize> Bits<W> {
    /// No bits set.
    pub const EMPTY: Self = Bits {
        words: [0; W],
        ranks: [0; W],
    };

    /// Only bit 0 set.
    pub const FIRST: Self = {
        let mut words = [0; W];
        words[0] = 1;
        let mut ranks = [1; W];
        ranks[0] = 0;
        Bits { words, ranks }
    };

    /// Whether bit `i` is set.
    #[inline(always)]
    pub fn get(&self, i: usize) -> bool {
        (self.words[i >> 6] >> (i & 63)) & 1 != 0
    }

    /// Number of set bits strictly below `i`.
    #[inline(always)]
    pub fn rank(&self, i: usize) -> usize {
        let w = i >> 6;
        let below = self.words[w] & ((1u64 << (i & 63)) - 1);
        self.ranks[w] as usize + below.count_ones() as usize
    }

    /// Number of set bits at or below `i`.
    #[inline(always)]
    pub fn rank_incl(&self, i: usize) -> usize {
        let w = i >> 6;
        let upto = self.words[w] & (2u64 << (i & 63)).wrapping_sub(1);
        self.ranks[w] as usize + upto.count_ones() as usize
    }

    /// Sets bit `i` (call `fix_ranks` after a run of changes).
    pub fn set_raw(&mut self, i: usize) {
        self.words[i >> 6] |= 1 << (i & 63);
    }

    /// Clears bit `i` (call `fix_ranks` after a run of changes).
    pub fn clear_raw(&mut self, i: usize) {
        self.words[i >> 6] &= !(1 << (i & 63));
    }

    /// Clears the bits in `lo..hi` (call `fix_ranks` after).
    #[inline]
    pub fn clear_range(&mut self, lo: usize, hi: usize) {
        let inside = self.words_in(lo, hi);
        self.words
            .iter_mut()
            .zip(inside)
            .for_each(|(a, b)| *a &= !b);
    }

    /// The bits in `lo..hi`, as words.
    #[inline]
    pub fn words_in(&self, lo: usize, hi: usize) -> [u64; W] {
        let mut out = [0; W];
        if lo >= hi {
            return out;
        }
        let (first, last) = (lo >> 6, (hi - 1) >> 6);
        out[first..=last].copy_from_slice(&self.words[first..=last]);
        out[first] &= u64::MAX << (lo & 63);
        out[last] &= u64::MAX >> (63 - ((hi - 1) & 63));
        out
    }

    /// The bitmap of `words` (call `fix_ranks` before ranking).
    pub fn from_words(words: [u64; W]) -> Self {
        Bits {
            words,
            ranks: [0; W],
        }
    }

    /// The bits, as words.
    #[inline(always)]
    pub fn words(&self) -> &[u64; W] {
        &self.words
    }

    /// Sets every bit set in `words` (call `fix_ranks` after).
    pub fn or_words(&mut self, words: &[u64; W]) {
        self.words.iter_mut().zip(words).for_each(|(a, b)| *a |= b);
    }

    /// Recomputes the rank cache.
    pub fn fix_ranks(&mut self) {
        let mut acc = 0u16;
        for w in 0..W {
            self.ranks[w] = acc;
            acc += self.words[w].count_ones() as u16;
        }
    }

    /// Number of set bits.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The highest set bit at or below `i`, if any.
    pub fn last_one_upto(&self, i: usize) -> Option<usize> {
        let w = i >> 6;
        let upto = self.words[w] & (2u64 << (i & 63)).wrapping_sub(1);
        std::iter::once((w, upto))
            .chain((0..w).rev().map(|v| (v, self.words[v])))
            .find(|&(_, word)| word != 0)
            .map(|(v, word)| 64 * v + 63 - word.leading_zeros() as usize)
    }

    /// The lowest set bit at or above `i`, if any.
    #[inline]
    pub fn first_one_from(&self, i: usize) -> Option<usize> {
        let mut w = i >> 6;
        if w >= W {
            return None;
        }
        let mut word = self.words[w] & (u64::MAX << (i & 63));
        loop {
            if word != 0 {
                return Some(64 * w + word.trailing_zeros() as usize);
            }
            w += 1;
            if w == W {
                return None;
            }
            word = self.words[w];
        }
    }

    /// Set bits in increasing order.
    pub fn ones(&self) -> Ones<W> {
        Ones::of(self.words)
    }

    /// The set bits in `lo..hi`, in increasing order.
    pub fn ones_in(&self, lo: usize, hi: usize) -> Ones<W> {
        if lo >= hi {
            return Ones::of([0; W]);
        }
        Ones::of(self.words_in(lo, hi))
    }
}

/// Iterator over the set bits of a [`Bits`] (a copy of its words).
pub(super) struct Ones<const W: usize> {
    words: [u64; W],
    w: usize,
    rest: u64,
}

impl<const W: usize> Ones<W> {
    fn of(words: [u64; W]) -> Self {
        Ones {
            words,
            w: 0,
            rest: words[0],
        }
    }
}

impl<const W: usize> Iterator for Ones<W> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        while self.rest == 0 {
            self.w += 1;
            if self.w == W {
                return None;
            }
            self.rest = self.words[self.w];
        }
        let bit = self.rest.trailing_zeros() as usize;
        self.rest &= self.rest - 1;
        Some(self.w * 64 + bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_counts_bits_below() {
        let mut b = Bits::<4>::default();
        for i in [0, 5, 63, 64, 100, 255] {
            b.set_raw(i);
        }
        b.fix_ranks();
        assert_eq!(b.count(), 6);
        assert_eq!(
            (b.rank(0), b.rank(1), b.rank(64), b.rank(65), b.rank(255)),
            (0, 1, 3, 4, 5)
        );
        assert!(b.get(100) && !b.get(101));
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![0, 5, 63, 64, 100, 255]);
        let mut only = Bits::<4>::default();
        only.or_words(&b.words_in(5, 101));
        only.fix_ranks();
        assert_eq!(only.ones().collect::<Vec<_>>(), vec![5, 63, 64, 100]);
        assert_eq!(b.words_in(7, 7), [0; 4]);
        assert_eq!(b.ones_in(5, 101).collect::<Vec<_>>(), vec![5, 63, 64, 100]);
        assert_eq!(b.ones_in(6, 63).count(), 0);
        assert_eq!(
            [0, 4, 5, 6, 64, 99, 255].map(|i| b.last_one_upto(i)),
            [
                Some(0),
                Some(0),
                Some(5),
                Some(5),
                Some(64),
                Some(64),
                Some(255)
            ]
        );
        assert_eq!(
            [0, 1, 6, 64, 65, 101, 255, 256].map(|i| b.first_one_from(i)),
            [
                Some(0),
                Some(5),
                Some(63),
                Some(64),
                Some(100),
                Some(255),
                Some(255),
                None
            ]
        );
        b.clear_raw(5);
        b.fix_ranks();
        assert_eq!(b.rank(64), 2);
    }
}
