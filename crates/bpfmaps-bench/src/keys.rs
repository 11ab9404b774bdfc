//! Keys built like the kernel's hash map benchmarks.
//!
//! `tools/testing/selftests/bpf/benchs/bench_bpf_hashmap_lookup.c` and
//! `bench_htab_mem.c` use keys made of 32-bit words whose word 0 is `i + 1`
//! in native byte order. Here every other word is `2654435761 * i` (Knuth's
//! multiplicative constant, wrapping), so all words vary with `i`. Keys
//! whose size is not a multiple of 4 are the word image truncated:
//!
//! ```text
//! i = 1, key_size = 10 (native little-endian shown):
//!   word 0 = 2            word 1 = 2654435761    word 2 (truncated)
//!   02 00 00 00           b1 79 37 9e            b1 79
//! ```
//!
//! Keys of 4 bytes or more are distinct for every `i < 2^32 - 1`.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// The kernel benches' multiplier for words after the first.
pub const KEY_MULT: u32 = 2_654_435_761;

/// Writes key number `i` into `out` (`out.len()` is the key size).
pub fn kernel_key(i: u32, out: &mut [u8]) {
    let fill = KEY_MULT.wrapping_mul(i).to_ne_bytes();
    for (w, chunk) in out.chunks_mut(4).enumerate() {
        let word = if w == 0 {
            i.wrapping_add(1).to_ne_bytes()
        } else {
            fill
        };
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Fixed-size keys stored back to back in one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    key_size: usize,
    bytes: Vec<u8>,
}

impl KeySet {
    /// Keys `0..count` of the kernel layout.
    pub fn kernel(count: usize, key_size: usize) -> KeySet {
        assert!(key_size > 0, "zero-sized keys");
        let mut bytes = vec![0u8; count * key_size];
        for (i, key) in bytes.chunks_exact_mut(key_size).enumerate() {
            kernel_key(i as u32, key);
        }
        KeySet { key_size, bytes }
    }

    /// Keys numbered `indices`, in that order: e.g. a probe sequence that
    /// mixes keys a map holds (`i < n`) with keys it does not (`i >= n`).
    pub fn kernel_indices(indices: &[u32], key_size: usize) -> KeySet {
        assert!(key_size > 0, "zero-sized keys");
        let mut bytes = vec![0u8; indices.len() * key_size];
        for (&i, key) in indices.iter().zip(bytes.chunks_exact_mut(key_size)) {
            kernel_key(i, key);
        }
        KeySet { key_size, bytes }
    }

    /// The first `count` keys of `self` in a shuffled order (deterministic
    /// for a given `seed`), copied so that a lookup loop reads them
    /// sequentially and measures the map, not the key fetch.
    pub fn shuffled_prefix(&self, count: usize, seed: u64) -> KeySet {
        let order = shuffled_indices(count, seed);
        let mut bytes = Vec::with_capacity(count * self.key_size);
        for &i in &order {
            bytes.extend_from_slice(self.key(i as usize));
        }
        KeySet {
            key_size: self.key_size,
            bytes,
        }
    }

    /// Key size in bytes.
    pub fn key_size(&self) -> usize {
        self.key_size
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.key_size
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Key number `i`.
    #[inline]
    pub fn key(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.key_size..(i + 1) * self.key_size]
    }

    /// All keys in order.
    pub fn iter(&self) -> std::slice::ChunksExact<'_, u8> {
        self.bytes.chunks_exact(self.key_size)
    }

    /// Keys `range` as one slice, for batched loops.
    pub fn slice(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self.bytes[range.start * self.key_size..range.end * self.key_size]
    }
}

/// `0..count` as `u32` in a random order fixed by `seed`.
pub fn shuffled_indices(count: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..count as u32).collect();
    v.shuffle(&mut StdRng::seed_from_u64(seed));
    v
}

/// Feeds `batch` consecutive keys of `keys` to `f`, wrapping around at the
/// end, starting at `*cursor` (which is advanced). Used by lookup loops so
/// every batch has the same length whatever the key count.
#[inline]
pub fn for_batch(keys: &KeySet, cursor: &mut usize, batch: usize, mut f: impl FnMut(&[u8])) {
    let n = keys.len();
    let mut left = batch;
    while left > 0 {
        let take = left.min(n - *cursor);
        for key in keys
            .slice(*cursor..*cursor + take)
            .chunks_exact(keys.key_size)
        {
            f(key);
        }
        *cursor = (*cursor + take) % n;
        left -= take;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn matches_the_kernel_layout() {
        let mut k = [0u8; 12];
        kernel_key(0, &mut k);
        assert_eq!(k, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);

        kernel_key(1, &mut k);
        let mut want = Vec::new();
        want.extend_from_slice(&2u32.to_ne_bytes());
        want.extend_from_slice(&2_654_435_761u32.to_ne_bytes());
        want.extend_from_slice(&2_654_435_761u32.to_ne_bytes());
        assert_eq!(k.as_slice(), want.as_slice());

        // Not a multiple of 4: the word image truncated.
        let mut short = [0u8; 6];
        kernel_key(7, &mut short);
        let mut image = [0u8; 8];
        kernel_key(7, &mut image);
        assert_eq!(short, image[..6]);
        assert_eq!(
            u32::from_ne_bytes(image[4..8].try_into().unwrap()),
            2_654_435_761u32.wrapping_mul(7)
        );

        let mut one = [0u8; 1];
        kernel_key(4, &mut one);
        assert_eq!(one[0], 5u32.to_ne_bytes()[0]);
    }

    #[test]
    fn keys_are_distinct_and_shuffles_are_permutations() {
        let keys = KeySet::kernel(10_000, 8);
        assert_eq!(keys.len(), 10_000);
        let set: HashSet<&[u8]> = keys.iter().collect();
        assert_eq!(set.len(), 10_000);

        let sh = keys.shuffled_prefix(5_000, 1);
        assert_eq!(sh.len(), 5_000);
        let a: HashSet<&[u8]> = sh.iter().collect();
        let b: HashSet<&[u8]> = (0..5_000).map(|i| keys.key(i)).collect();
        assert_eq!(a, b);
        assert_eq!(sh, keys.shuffled_prefix(5_000, 1), "deterministic");
    }

    #[test]
    fn keys_by_index_match_the_sequence() {
        let all = KeySet::kernel(10, 12);
        let some = KeySet::kernel_indices(&[7, 0, 9, 7], 12);
        assert_eq!(some.len(), 4);
        for (j, &i) in [7usize, 0, 9, 7].iter().enumerate() {
            assert_eq!(some.key(j), all.key(i));
        }
    }

    #[test]
    fn batches_wrap_around() {
        let keys = KeySet::kernel(5, 4);
        let mut cursor = 3;
        let mut seen = Vec::new();
        for_batch(&keys, &mut cursor, 4, |k| seen.push(k[0]));
        assert_eq!(seen, [4, 5, 1, 2]);
        assert_eq!(cursor, 2);
    }
}
