//! A node's prefixes: their indices (a complete binary tree over the
//! node's byte) and the decoded set the writer rebuilds blocks from.

use std::mem::MaybeUninit;

use crate::lpm::bits::Bits;

/// Index of the prefix with `l` bits (0..=8) and pattern `p` in a node.
#[inline]
pub(crate) fn prefix_index(l: u32, byte: u8) -> usize {
    if l == 0 {
        1
    } else {
        (1 << l) | (byte as usize >> (8 - l))
    }
}

/// Bits of a prefix index inside its byte: (l, first byte, one past last).
#[inline]
pub(crate) fn index_range(idx: usize) -> (u32, usize, usize) {
    let l = usize::BITS - 1 - idx.leading_zeros();
    let p = idx & ((1 << l) - 1);
    (l, p << (8 - l), (p + 1) << (8 - l))
}

/// Whether prefix index `i` lies under index `idx` (or is `idx`).
pub(super) fn in_subtree(i: usize, idx: usize) -> bool {
    let (li, l) = (index_range(i).0, index_range(idx).0);
    li >= l && i >> (li - l) == idx
}

/// The prefixes a node stores, with their payloads: decoded from its data
/// block, for the writer to change and rebuild from, and for iteration.
#[derive(Clone)]
pub(crate) struct Prefixes {
    /// Bit `idx` per stored prefix (see `prefix_index`).
    pub bits: Bits<8>,
    /// The payload of the prefix at each set index (only those are
    /// written: no 2 KiB of zeroes per update).
    payloads: [MaybeUninit<[u8; 4]>; 512],
}

impl Prefixes {
    pub fn new() -> Self {
        Prefixes {
            bits: Bits::EMPTY,
            payloads: [MaybeUninit::uninit(); 512],
        }
    }

    /// The payload of the prefix at `idx`, if stored.
    pub fn get(&self, idx: usize) -> Option<[u8; 4]> {
        // SAFETY: the payloads of set indices are written.
        self.bits
            .get(idx)
            .then(|| unsafe { self.payloads[idx].assume_init() })
    }

    /// Stores (`Some`) or removes (`None`) the prefix at `idx`.
    pub fn set(&mut self, idx: usize, payload: Option<[u8; 4]>) {
        match payload {
            Some(p) => self.put(idx, p),
            None => self.bits.clear_raw(idx),
        }
        self.bits.fix_ranks();
    }

    /// Stores the prefix at `idx` (call `bits.fix_ranks` after a run of
    /// these).
    pub(crate) fn put(&mut self, idx: usize, payload: [u8; 4]) {
        self.bits.set_raw(idx);
        self.payloads[idx].write(payload);
    }

    /// Bit `l` set if some prefix has `l` bits (0..=8).
    #[inline]
    pub fn levels(&self) -> u16 {
        // Level l holds indices 2^l..2^(l+1): levels 0 to 5 share word 0,
        // 6 is word 1, 7 words 2-3, 8 words 4-7.
        let w = self.bits.words();
        let low = (0..6).fold(0, |acc, l| {
            let level = (w[0] >> (1 << l)) & ((1 << (1 << l)) - 1);
            acc | u16::from(level != 0) << l
        });
        low | u16::from(w[1] != 0) << 6
            | u16::from(w[2] | w[3] != 0) << 7
            | u16::from(w[4] | w[5] | w[6] | w[7] != 0) << 8
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.bits.count()
    }
}

impl PartialEq for Prefixes {
    fn eq(&self, other: &Self) -> bool {
        self.bits == other.bits && self.bits.ones().all(|i| self.get(i) == other.get(i))
    }
}

impl std::fmt::Debug for Prefixes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.bits.ones().map(|i| (i, self.get(i))))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_indices_cover_their_byte_ranges() {
        assert_eq!(prefix_index(0, 0xab), 1);
        assert_eq!(index_range(1), (0, 0, 256));
        assert_eq!(prefix_index(1, 0x80), 3);
        assert_eq!(index_range(3), (1, 128, 256));
        assert_eq!(prefix_index(8, 0x05), 256 + 5);
        assert_eq!(index_range(261), (8, 5, 6));
        assert_eq!(
            index_range(prefix_index(3, 0b1010_0000)),
            (3, 0b1010_0000, 0b1100_0000)
        );
    }
}
