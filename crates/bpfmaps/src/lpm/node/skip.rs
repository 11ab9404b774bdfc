//! A compressed edge's skipped key bytes, packed in one word.

/// Key bytes a compressed edge skips: up to [`Skip::MAX`], packed with
/// their count in the top byte (all zero: no skip).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Skip(u64);

impl Skip {
    /// Longest skip: seven bytes and the count fit one word.
    pub const MAX: usize = 7;
    pub const NONE: Skip = Skip(0);

    /// The skip over `bytes` (at most `MAX`).
    pub fn new(bytes: &[u8]) -> Skip {
        debug_assert!(bytes.len() <= Self::MAX);
        let mut word = (bytes.len() as u64) << 56;
        for (i, &b) in bytes.iter().enumerate() {
            word |= u64::from(b) << (8 * i);
        }
        Skip(word)
    }

    #[inline(always)]
    pub fn len(self) -> usize {
        (self.0 >> 56) as usize
    }

    #[inline(always)]
    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    #[inline(always)]
    pub fn byte(self, i: usize) -> u8 {
        (self.0 >> (8 * i)) as u8
    }

    /// The skipped bytes.
    pub fn bytes(self) -> impl Iterator<Item = u8> {
        (0..self.len()).map(move |i| self.byte(i))
    }

    /// How many leading skipped bytes `key` repeats.
    pub fn common_prefix(self, key: &[u8]) -> usize {
        self.bytes().zip(key).take_while(|(a, b)| a == *b).count()
    }

    /// Whether `key` starts with the skipped bytes. One word compare when
    /// 8 key bytes are there to load (a byte loop's varying trip count
    /// mispredicts on lookups that cross edges of different lengths).
    #[inline(always)]
    pub fn matches(self, key: &[u8]) -> bool {
        let n = self.len();
        match key.first_chunk::<8>() {
            Some(head) => (u64::from_le_bytes(*head) ^ self.0) & ((1 << (8 * n)) - 1) == 0,
            None => key.len() >= n && (0..n).all(|i| key[i] == self.byte(i)),
        }
    }

    /// The skipped bytes packed in the low 56 bits, first byte lowest.
    fn packed(self) -> u64 {
        self.0 & ((1 << 56) - 1)
    }

    /// The first `n` bytes (`n <= len`).
    pub fn head(self, n: usize) -> Skip {
        Skip(self.packed() & ((1u64 << (8 * n)) - 1) | (n as u64) << 56)
    }

    /// The bytes from `n` on (`n <= len`).
    pub fn tail(self, n: usize) -> Skip {
        Skip(self.packed() >> (8 * n) | ((self.len() - n) as u64) << 56)
    }

    /// `self`, then `b`, then `next`: the skip of a child whose parent
    /// edge and own edge merge; `None` if that is over `MAX`.
    pub fn join(self, b: u8, next: Skip) -> Option<Skip> {
        let n = self.len();
        let len = n + 1 + next.len();
        (len <= Self::MAX).then(|| {
            Skip(
                self.packed()
                    | u64::from(b) << (8 * n)
                    | next.packed() << (8 * (n + 1))
                    | (len as u64) << 56,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_match_what_starts_with_their_bytes() {
        let bytes = [3u8, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8];
        for n in 0..=Skip::MAX {
            let skip = Skip::new(&bytes[..n]);
            for len in 0..=bytes.len() {
                // Flip no byte (flip == len), or one of them.
                for flip in 0..=len {
                    let mut key = bytes[..len].to_vec();
                    if flip < len {
                        key[flip] ^= 0x80;
                    }
                    let want = key.starts_with(&bytes[..n]);
                    assert_eq!(skip.matches(&key), want, "n {n} key {key:?}");
                }
            }
        }
    }

    #[test]
    fn skips_split_and_join_like_byte_strings() {
        let s = Skip::new(&[1, 2, 3, 4, 5]);
        let bytes = |s: Skip| s.bytes().collect::<Vec<_>>();
        assert_eq!(bytes(s.head(0)), []);
        assert_eq!(bytes(s.head(2)), [1, 2]);
        assert_eq!(bytes(s.tail(2)), [3, 4, 5]);
        assert_eq!(bytes(s.tail(5)), []);
        assert_eq!(s.tail(5), Skip::NONE);
        assert_eq!(s.head(2).join(3, s.tail(3)), Some(s));
        assert_eq!(Skip::NONE.join(9, Skip::NONE), Some(Skip::new(&[9])));
        assert_eq!(
            s.join(6, Skip::new(&[7])),
            Some(Skip::new(&[1, 2, 3, 4, 5, 6, 7]))
        );
        assert_eq!(s.join(6, Skip::new(&[7, 8])), None);
        assert_eq!(s.common_prefix(&[1, 2, 9]), 2);
    }
}
