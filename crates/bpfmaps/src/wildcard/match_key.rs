//! A concrete key's bytes read straight into a probe's words: the
//! fields back to back, each in network order, as a packet's header
//! carries them ([`Schema::key_size`] bytes; 8 for Cilium's policy key,
//! 13 for a 5-tuple), where a [`Packet`](super::Packet) holds every field
//! in 16 bytes (144 in all). A classifier that reads its packets from
//! memory then streams a ninth to a twentieth of the bytes.
//!
//! Each field is one unaligned big-endian load of a word, a shift and a
//! mask: the load reads a whole word that ends where the field ends (the
//! bytes before it are masked off), or, for a field that ends inside the
//! key's first word, the key's first word (the bytes after it shifted
//! out), so that it never reads outside the key.

use super::chain::Word;
use super::schema::{MAX_FIELDS, Schema};

/// Where a field sits in a key: the word-wide big-endian window at byte
/// `start`, shifted right by `shift` bits (the bytes after the field)
/// and masked by `mask` (its bytes), is the field's value.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    start: usize,
    shift: u32,
    mask: u128,
}

/// How to read a schema's keys into words of one width.
#[derive(Clone, Debug)]
pub(super) struct KeyReader {
    windows: [Window; MAX_FIELDS],
    /// A key's bytes.
    len: usize,
    /// The bytes the windows lie in: the key's, or a word's when the key
    /// is shorter than a word (read from a zero-padded copy).
    span: usize,
    /// For a key of 8 to 16 bytes in 32-bit words: per byte of the
    /// first four words, then of the next four, the byte of the key's
    /// first 8 then last 8 that it takes (0x80: none, a zero). Read
    /// only where SSSE3 is enabled at compile time (as by the workspace's
    /// `x86-64-v2`).
    #[cfg_attr(
        not(all(target_arch = "x86_64", target_feature = "ssse3")),
        allow(dead_code)
    )]
    shuffle: Option<[[u8; 16]; 2]>,
}

impl KeyReader {
    /// The reader of `schema`'s keys into words of `word` bytes, as wide
    /// as its widest field or wider.
    pub(super) fn new(schema: &Schema, word: usize) -> KeyReader {
        let len = schema.key_size();
        let span = len.max(word);
        let mut windows = [Window::default(); MAX_FIELDS];
        let mut at = 0;
        for (w, f) in windows.iter_mut().zip(schema.fields()) {
            debug_assert!(f.size <= word, "the word holds every field");
            let end = at + f.size;
            // The word ending where the field ends, or the first word.
            let start = end.saturating_sub(word);
            *w = Window {
                start,
                shift: 8 * (start + word - end) as u32,
                mask: u128::MAX >> (128 - 8 * f.size),
            };
            at = end;
        }
        let fields = schema.fields();
        let shuffle = (word == 4 && fields.len() <= 8 && (8..=16).contains(&len)).then(|| {
            let mut shuffle = [[0x80; 16]; 2];
            let mut at = 0;
            for (lane, f) in shuffle.as_flattened_mut().chunks_exact_mut(4).zip(fields) {
                // The field's last byte is its word's lowest.
                for (b, out) in lane[..f.size].iter_mut().enumerate() {
                    let byte = at + f.size - 1 - b;
                    *out = if byte < 8 { byte } else { byte + 16 - len } as u8;
                }
                at += f.size;
            }
            shuffle
        });
        KeyReader {
            windows,
            len,
            span,
            shuffle,
        }
    }

    /// A key's bytes.
    pub(super) fn key_size(&self) -> usize {
        self.len
    }

    /// The first `N` fields of `key` (of [`key_size`](Self::key_size)
    /// bytes) as words of `W`, the reader's width.
    #[inline(always)]
    pub(super) fn read<W: Word, const N: usize>(&self, key: &[u8]) -> [W; N] {
        debug_assert_eq!(key.len(), self.len);
        #[cfg(all(target_arch = "x86_64", target_feature = "ssse3"))]
        if N <= 8
            && size_of::<W>() == 4
            && let Some(shuffle) = &self.shuffle
        {
            return read_shuffled(key, shuffle);
        }
        if self.span > self.len {
            return self.read_padded(key);
        }
        self.read_span(key)
    }

    /// [`read`](Self::read) for a batch's loop: the shuffle inlined, the
    /// other two ways out of line. With all three inlined, the loop grew
    /// past what LLVM keeps branch-free (ipc1_10k's keys in bursts of 32:
    /// 1.9x the mispredicted branches of the same packets'); with all
    /// three out of line, Cilium's exact rules at 1K in bursts took 12.9
    /// ns a key against 8.7 a packet.
    #[inline(always)]
    pub(super) fn read_in_batch<W: Word, const N: usize>(&self, key: &[u8]) -> [W; N] {
        #[cfg(all(target_arch = "x86_64", target_feature = "ssse3"))]
        if N <= 8
            && size_of::<W>() == 4
            && let Some(shuffle) = &self.shuffle
        {
            return read_shuffled(key, shuffle);
        }
        self.read_apart(key)
    }

    /// [`read`](Self::read) out of line.
    #[inline(never)]
    fn read_apart<W: Word, const N: usize>(&self, key: &[u8]) -> [W; N] {
        self.read(key)
    }

    /// [`read`](Self::read) of a key shorter than a word, from a
    /// zero-padded copy (out of line: a rare schema's path).
    #[cold]
    #[inline(never)]
    fn read_padded<W: Word, const N: usize>(&self, key: &[u8]) -> [W; N] {
        let mut padded = [0u8; 16];
        padded[..key.len()].copy_from_slice(key);
        self.read_span(&padded)
    }

    /// The fields from `bytes`, which hold the span.
    #[inline(always)]
    fn read_span<W: Word, const N: usize>(&self, bytes: &[u8]) -> [W; N] {
        debug_assert!(bytes.len() >= self.span);
        std::array::from_fn(|i| {
            let w = self.windows[i];
            debug_assert!(w.start + size_of::<W>() <= self.span);
            // SAFETY: `bytes` holds `span` bytes and every window lies in
            // them (`new`: it starts at or after 0 and ends at its field's
            // end, or at a word, within the span).
            unsafe { W::read_be(bytes.as_ptr().add(w.start)) }.field(w.shift, w.mask)
        })
    }
}

/// [`KeyReader::read`] of a key of 8 to 16 bytes into (up to eight)
/// 32-bit words `W`, by its reader's `shuffle`.
#[cfg(all(target_arch = "x86_64", target_feature = "ssse3"))]
#[inline(always)]
fn read_shuffled<W: Word, const N: usize>(key: &[u8], shuffle: &[[u8; 16]; 2]) -> [W; N] {
    use std::arch::x86_64::*;
    debug_assert!((8..=16).contains(&key.len()) && N <= 8 && size_of::<W>() == 4);
    let mut words = [0u32; 8];
    // SAFETY: both 8-byte loads lie in the key (8 bytes or more), the
    // shuffles' 16 bytes and the 32 of `words` are whole; SSSE3 is
    // enabled at compile time.
    unsafe {
        let first = _mm_loadl_epi64(key.as_ptr().cast());
        let last = _mm_loadl_epi64(key.as_ptr().add(key.len() - 8).cast());
        let bytes = _mm_unpacklo_epi64(first, last);
        let order = _mm_loadu_si128(shuffle[0].as_ptr().cast());
        _mm_storeu_si128(words.as_mut_ptr().cast(), _mm_shuffle_epi8(bytes, order));
        if N > 4 {
            let order = _mm_loadu_si128(shuffle[1].as_ptr().cast());
            let next = _mm_shuffle_epi8(bytes, order);
            _mm_storeu_si128(words.as_mut_ptr().add(4).cast(), next);
        }
    }
    std::array::from_fn(|i| W::of(u128::from(words[i])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wildcard::chain::Width;
    use crate::wildcard::schema::{Field, FieldKind};
    use proptest::prelude::*;

    fn read_all(schema: &Schema, key: &[u8]) -> Vec<u128> {
        /// The first `n` fields, read as a probe of `n` fields reads them
        /// (up to eight: the shuffled read's), or of all of them.
        fn of<W: Word + Into<u128>>(r: &KeyReader, key: &[u8], n: usize) -> Vec<u128> {
            fn first<W: Word + Into<u128>, const N: usize>(r: &KeyReader, key: &[u8]) -> Vec<u128> {
                let words: [W; N] = r.read(key);
                words.iter().map(|&w| w.into()).collect()
            }
            let all = match n {
                1 => first::<W, 1>(r, key),
                2 => first::<W, 2>(r, key),
                3 => first::<W, 3>(r, key),
                4 => first::<W, 4>(r, key),
                5 => first::<W, 5>(r, key),
                6 => first::<W, 6>(r, key),
                7 => first::<W, 7>(r, key),
                8 => first::<W, 8>(r, key),
                _ => first::<W, MAX_FIELDS>(r, key),
            };
            all[..n].to_vec()
        }
        let width = Width::of(schema);
        let r = KeyReader::new(schema, width.bytes());
        let n = schema.fields().len();
        match width {
            Width::W32 => of::<u32>(&r, key, n),
            Width::W64 => of::<u64>(&r, key, n),
            Width::W128 => of::<u128>(&r, key, n),
        }
    }

    #[test]
    fn reads_cilium_s_key() {
        let schema = Schema::new(vec![
            Field::wildcard("id", 4),
            Field::range("dport", 2),
            Field::wildcard("proto", 1),
            Field::exact("dir", 1),
        ])
        .unwrap();
        let key = [0x00, 0x12, 0x34, 0x56, 0x01, 0xbb, 6, 1];
        assert_eq!(read_all(&schema, &key), vec![0x123456, 443, 6, 1]);
    }

    #[test]
    fn reads_a_key_shorter_than_its_word() {
        // Two fields of 1 and 5 bytes: 64-bit words, a 6-byte key.
        let schema = Schema::new(vec![
            Field::exact("a", 1),
            Field::new("b", FieldKind::Range, 5),
        ])
        .unwrap();
        let key = [0xfe, 1, 2, 3, 4, 5];
        assert_eq!(read_all(&schema, &key), vec![0xfe, 0x0102030405]);
    }

    #[test]
    fn reads_a_five_tuple_s_key() {
        let schema = crate::wildcard::classbench::schema();
        let key = [10, 0, 0, 1, 192, 168, 1, 2, 0x30, 0x39, 0, 80, 6];
        let values = vec![0x0a00_0001, 0xc0a8_0102, 12345, 80, 6];
        assert_eq!(read_all(&schema, &key), values);
    }

    /// Schemas of fields of up to `widest` bytes, and a key of each.
    fn schema_and_key_of(widest: usize) -> impl Strategy<Value = (Schema, Vec<u8>)> {
        prop::collection::vec(1usize..=widest, 1..=MAX_FIELDS).prop_flat_map(|sizes| {
            let len: usize = sizes.iter().sum();
            let schema = Schema::new(
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| Field::exact(&format!("f{i}"), s))
                    .collect(),
            )
            .unwrap();
            (Just(schema), prop::collection::vec(any::<u8>(), len))
        })
    }

    /// `key`'s fields read as `Schema::packet_from_bytes` reads them.
    fn reads_as_parsed(schema: &Schema, key: &[u8]) -> Result<(), TestCaseError> {
        let packet = schema.packet_from_bytes(key).unwrap();
        let n = schema.fields().len();
        prop_assert_eq!(read_all(schema, key), packet.values[..n].to_vec());
        Ok(())
    }

    proptest! {
        // 32 cases under Miri, where 256 took over 90 s of wall time a
        // test (docs/testing.md, Miri).
        #![proptest_config(ProptestConfig::with_cases(crate::scaled(256, 32) as u32))]

        /// Every schema's fields read as `Schema::packet_from_bytes`
        /// reads them, a byte at a time.
        #[test]
        fn reads_as_the_bytewise_parse((schema, key) in schema_and_key_of(16)) {
            reads_as_parsed(&schema, &key)?;
        }

        /// So do keys of fields in 32-bit words (read by shuffles when
        /// they are 8 to 16 bytes).
        #[test]
        fn reads_narrow_fields_as_the_bytewise_parse((schema, key) in schema_and_key_of(4)) {
            reads_as_parsed(&schema, &key)?;
        }
    }
}
