//! `BPF_MAP_TYPE_BLOOM_FILTER`: a lock-free bloom filter with the kernel's
//! semantics (`kernel/bpf/bloom_filter.c`).
//!
//! # What
//! A set that answers "certainly absent" or "maybe present". Values are
//! pushed (`bpf_map_push_elem`) and tested (`bpf_map_peek_elem`); nothing is
//! ever removed, there are no keys (`key_size` is 0) and no iteration.
//!
//! # Layout
//! One array of `m` bits, `m` a power of two, stored as 64-bit words:
//!
//! ```text
//!  words (8 B each)            bit b lives in word b / 64, bit b % 64
//!  +--------+--------+-----+--------+
//!  | w0     | w1     | ... | w(m/64-1)
//!  +--------+--------+-----+--------+
//! ```
//!
//! Sizing follows the kernel exactly. The optimal `m` for `n = max_entries`
//! values and `k` hash functions is `n * k / ln 2`; the kernel approximates
//! `1 / ln 2` by `7 / 5`, computes `(n * k) / 5 * 7` in `u32` and rounds up to
//! a power of two, with a floor of 64 bits. If the product overflows or
//! exceeds 2^31 the array gets the full 2^32 bits (512 MiB), the kernel's cap.
//! The array is allocated zeroed (`alloc_zeroed`), so untouched pages of a
//! big filter cost nothing until written.
//!
//! # Hashing
//! Bit `i` (for `i` in `0..k`) of a value is, as in the kernel's `hash()`,
//! `jhash2(value, value_size / 4, seed + i) & (m - 1)` when the value is whole
//! 32-bit words, else `jhash(value, value_size, seed + i) & (m - 1)`: `k` full
//! hashes per operation. [`BloomHash::Xxh3`] instead takes one
//! `xxh3_128(value, seed)`, splits it into halves `h1`, `h2` and derives bit
//! `i` as `(h1 + i * h2) & (m - 1)` (Kirsch and Mitzenmacher, "Less hashing,
//! same performance: building a better bloom filter", ESA 2006), one hash per
//! operation whatever `k`. `h2` is forced odd so that the `k` probes are
//! distinct modulo the power-of-two `m`.
//!
//! # Invariants
//! 1. A bit, once set, is never cleared for the filter's lifetime.
//! 2. After `push(v)` returns, all `k` bits of `v` are set; hence no false
//!    negatives for a `contains(v)` that happens after the push.
//!
//! # Concurrency
//! No locks at all. `push` sets bits with `fetch_or(Relaxed)`: concurrent
//! pushes to the same word never lose each other's bits. `contains` reads
//! words with `Relaxed` loads. A `contains` racing a `push` of the same value
//! may see some of its bits and not others and answer "absent"; any
//! `contains` ordered after the push's return (same thread, a join, a
//! channel, any happens-before edge) answers "maybe present". That is the
//! kernel's guarantee too (it uses plain `set_bit`/`test_bit`).
//!
//! # Differences from the kernel
//! - [`Map::len`](crate::Map::len) counts pushes (duplicates included);
//!   the kernel has no notion of length.
//! - Hashing: the default is [`BloomHash::Xxh3`] (one xxh3_128, double
//!   hashing), which the `bloom` benchmark measured faster than the kernel's
//!   `k` jhash calls at every size; [`BloomHash::Jhash`] (or a spec with
//!   `HashPolicy::Jhash`) gives the kernel's bit positions exactly.
//! - Batch operations all answer `EOPNOTSUPP`.
//!
//! # Example
//! ```
//! use bpfmaps::bloom::BloomFilter;
//!
//! let filter = BloomFilter::with_seed(4, 1000, 5, 0).unwrap();
//! filter.push(&42u32.to_ne_bytes()).unwrap();
//! assert!(filter.contains(&42u32.to_ne_bytes()));
//! assert_eq!(filter.bit_count(), 8192); // 1000 * 5 / 5 * 7 = 7000, rounded up
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::core::contract::{Caps, MapInfo, MapOps, MapSpec, MapType};
use crate::core::error::{Error, Result, check_len};
use crate::core::family::{Family, KeyKind, SizeRule};
use crate::core::flags::{BPF_F_ZERO_SEED, UpdateFlag};
use crate::hash::{HashPolicy, jhash, jhash2_bytes, seed_for};

impl MapType {
    /// `BPF_MAP_TYPE_BLOOM_FILTER`.
    pub const BLOOM_FILTER: MapType = MapType(30);
}

/// Values of 1 byte to 1 MiB.
const VALUE_SIZE: SizeRule = SizeRule::between(1, 1 << 20);

/// `BPF_MAP_TYPE_BLOOM_FILTER`, for the registry: no keys; `map_extra`
/// holds the number of hash functions in its low 4 bits (0: 5).
pub const BLOOM_FILTER_FAMILY: Family = Family {
    map_type: MapType::BLOOM_FILTER,
    name: "bloom_filter",
    map_flags: BPF_F_ZERO_SEED,
    map_extra: 0xF,
    key_size: SizeRule::exactly(0),
    value_size: VALUE_SIZE,
    keys: KeyKind::None,
    sample_layout: None,
    build: |spec| Ok(Box::new(BloomFilter::from_spec(spec)?)),
};

/// Hash functions used when `nr_hashes` is given as 0, as the kernel.
pub const DEFAULT_NR_HASHES: u32 = 5;
/// Most hash functions a filter may use: the kernel keeps the count in the
/// low 4 bits of `map_extra`.
pub const MAX_NR_HASHES: u32 = 15;

/// Fewest bits in a filter (the kernel's `BITS_PER_LONG`).
const MIN_BITS: u64 = 64;
/// Most bits in a filter: 2^32, the kernel's cap (512 MiB).
const MAX_BITS: u64 = 1 << 32;
/// Bits per storage word.
const WORD_BITS: u32 = u64::BITS;
/// `log2(WORD_BITS)`: a bit index shifted right by this is its word.
const WORD_SHIFT: u32 = WORD_BITS.trailing_zeros();
/// A bit index masked with this is its position in the word.
const BIT_MASK: u64 = WORD_BITS as u64 - 1;

/// How a bloom filter derives its `k` bit positions from a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BloomHash {
    /// The kernel: `k` independent `jhash2`/`jhash` calls, seeds `seed + i`.
    Jhash,
    /// One `xxh3_128` call; probe `i` is `h1 + i * h2` (Kirsch-Mitzenmacher).
    /// The default: the `bloom` benchmark measured it faster than the
    /// kernel's hashing at every size (see `docs/benchmarks.md`), with the
    /// same false-positive rate.
    #[default]
    Xxh3,
}

impl BloomHash {
    /// The bloom hashing a map-wide [`HashPolicy`] asks for: `Jhash` is the
    /// kernel's, `Xxh3` the double-hashing variant, and `Hybrid` picks the
    /// kernel's for word-multiple values under 32 bytes, xxh3 otherwise.
    pub fn from_policy(policy: HashPolicy, value_size: usize) -> Self {
        match policy {
            HashPolicy::Jhash => BloomHash::Jhash,
            HashPolicy::Xxh3 => BloomHash::Xxh3,
            HashPolicy::Hybrid if value_size.is_multiple_of(4) && value_size < 32 => {
                BloomHash::Jhash
            }
            HashPolicy::Hybrid => BloomHash::Xxh3,
        }
    }
}

/// `BPF_MAP_TYPE_BLOOM_FILTER`: lock-free pushes and membership tests.
pub struct BloomFilter {
    /// The bit array, `mask + 1` bits.
    words: Box<[AtomicU64]>,
    /// `bit_count() - 1`; a hash masked with it is a bit index.
    mask: u64,
    seed: u32,
    nr_hashes: u32,
    hash: BloomHash,
    info: MapInfo,
    /// Successful pushes, duplicates included.
    pushes: AtomicUsize,
}

impl std::fmt::Debug for BloomFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BloomFilter")
            .field("value_size", &self.info.value_size)
            .field("max_entries", &self.info.max_entries)
            .field("nr_hashes", &self.nr_hashes)
            .field("bit_count", &self.bit_count())
            .field("hash", &self.hash)
            .field("pushes", &self.pushes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The kernel's bit-array size for `max_entries` values and `nr_hashes`
/// hash functions (see the module docs).
fn kernel_nr_bits(max_entries: u32, nr_hashes: u32) -> u64 {
    match max_entries
        .checked_mul(nr_hashes)
        .and_then(|n| (n / 5).checked_mul(7))
    {
        Some(n) if u64::from(n) <= 1 << 31 => u64::from(n).max(MIN_BITS).next_power_of_two(),
        _ => MAX_BITS,
    }
}

impl BloomFilter {
    /// A filter for `max_entries` values of `value_size` bytes, with
    /// `nr_hashes` hash functions (0 means the default, 5; at most 15) and a
    /// random seed.
    ///
    /// ```
    /// use bpfmaps::bloom::BloomFilter;
    ///
    /// assert_eq!(BloomFilter::new(8, 100, 0).unwrap().nr_hashes(), 5);
    /// assert_eq!(BloomFilter::new(8, 100, 16).unwrap_err().errno(), 22);
    /// ```
    pub fn new(value_size: usize, max_entries: u32, nr_hashes: u32) -> Result<Self> {
        Self::with_seed(value_size, max_entries, nr_hashes, rand::random())
    }

    /// As [`new`](Self::new) with a fixed seed (reproducible bit patterns).
    pub fn with_seed(
        value_size: usize,
        max_entries: u32,
        nr_hashes: u32,
        seed: u32,
    ) -> Result<Self> {
        Self::with_hash(
            value_size,
            max_entries,
            nr_hashes,
            seed,
            BloomHash::default(),
        )
    }

    /// As [`with_seed`](Self::with_seed) with a choice of hashing.
    ///
    /// ```
    /// use bpfmaps::bloom::{BloomFilter, BloomHash};
    ///
    /// let filter = BloomFilter::with_hash(16, 1000, 7, 1, BloomHash::Xxh3).unwrap();
    /// filter.push(&[9u8; 16]).unwrap();
    /// assert!(filter.contains(&[9u8; 16]));
    /// ```
    pub fn with_hash(
        value_size: usize,
        max_entries: u32,
        nr_hashes: u32,
        seed: u32,
        hash: BloomHash,
    ) -> Result<Self> {
        if !u32::try_from(value_size).is_ok_and(|n| VALUE_SIZE.allows(n)) {
            return Err(Error::invalid(format!(
                "bloom filter value_size {value_size}: 1..={}",
                VALUE_SIZE.max
            )));
        }
        if max_entries == 0 {
            return Err(Error::invalid("bloom filter max_entries must be non-zero"));
        }
        let nr_hashes = match nr_hashes {
            0 => DEFAULT_NR_HASHES,
            1..=MAX_NR_HASHES => nr_hashes,
            _ => {
                return Err(Error::invalid(format!(
                    "bloom filter nr_hashes {nr_hashes}: at most {MAX_NR_HASHES}"
                )));
            }
        };
        let nr_bits = kernel_nr_bits(max_entries, nr_hashes);
        let nr_words = usize::try_from(nr_bits >> WORD_SHIFT).map_err(|_| Error::NoMemory)?;
        let words =
            bytemuck::try_zeroed_slice_box::<AtomicU64>(nr_words).map_err(|()| Error::NoMemory)?;
        Ok(BloomFilter {
            words,
            mask: nr_bits - 1,
            seed,
            nr_hashes,
            hash,
            info: MapInfo {
                map_type: MapType::BLOOM_FILTER,
                key_size: 0,
                value_size: value_size as u32,
                max_entries,
                map_flags: if seed == 0 { BPF_F_ZERO_SEED } else { 0 },
                map_extra: u64::from(nr_hashes),
            },
            pushes: AtomicUsize::new(0),
        })
    }

    /// Builds from a spec that passed [`BLOOM_FILTER_FAMILY`]'s checks, as
    /// the kernel's `bloom_map_alloc`: `extra` holds the number of hash
    /// functions (0: 5). `spec.hash` picks the hashing through
    /// [`BloomHash::from_policy`]; `None` is the default.
    fn from_spec(spec: &MapSpec) -> Result<Self> {
        let value_size = spec.value_size as usize;
        let hash = spec.hash.map_or(BloomHash::default(), |p| {
            BloomHash::from_policy(p, value_size)
        });
        let mut filter = Self::with_hash(
            value_size,
            spec.max_entries,
            spec.extra as u32,
            seed_for(spec.flags),
            hash,
        )?;
        filter.info = spec.info();
        Ok(filter)
    }

    /// Adds `value` to the set. Lock-free; `EINVAL` if `value` is not
    /// `value_size` bytes (and then the filter is unchanged).
    pub fn push(&self, value: &[u8]) -> Result<()> {
        check_len("value", value.len(), self.info.value_size as usize)?;
        self.for_each_bit(value, |word, bit| {
            // Relaxed: bits are independent facts; ordering with other
            // memory is the caller's business (see the module docs).
            word.fetch_or(bit, Ordering::Relaxed);
            true
        });
        self.pushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `value` may have been pushed: `false` means certainly not.
    /// Lock-free. A value of the wrong size is never present.
    #[inline]
    pub fn contains(&self, value: &[u8]) -> bool {
        value.len() == self.info.value_size as usize
            && self.for_each_bit(value, |word, bit| word.load(Ordering::Relaxed) & bit != 0)
    }

    /// Number of hash functions (bits per value).
    pub fn nr_hashes(&self) -> u32 {
        self.nr_hashes
    }

    /// Size of the bit array, in bits (a power of two).
    pub fn bit_count(&self) -> u64 {
        self.mask + 1
    }

    /// Bits currently set. Walks the whole array: O(`bit_count() / 64`).
    pub fn bits_set(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// The false-positive rate the current fill gives: `(set / m) ^ k`.
    /// Walks the whole array.
    pub fn estimated_fpp(&self) -> f64 {
        (self.bits_set() as f64 / self.bit_count() as f64).powi(self.nr_hashes as i32)
    }

    /// The hashing in use.
    pub fn hash(&self) -> BloomHash {
        self.hash
    }

    /// Calls `f(word, bit_in_word)` for each of the value's `k` bits until
    /// `f` returns `false`; returns whether every call returned `true`.
    #[inline]
    fn for_each_bit(&self, value: &[u8], mut f: impl FnMut(&AtomicU64, u64) -> bool) -> bool {
        let mut probe = |index: u64| {
            let index = index & self.mask;
            // `index <= mask < words.len() * 64`, so the index is in bounds.
            let word = &self.words[(index >> WORD_SHIFT) as usize];
            f(word, 1 << (index & BIT_MASK))
        };
        match self.hash {
            BloomHash::Jhash => {
                let words = value.len().is_multiple_of(4);
                (0..self.nr_hashes).all(|i| {
                    let seed = self.seed.wrapping_add(i);
                    let h = if words {
                        jhash2_bytes(value, seed)
                    } else {
                        jhash(value, seed)
                    };
                    probe(u64::from(h))
                })
            }
            BloomHash::Xxh3 => {
                let h = xxhash_rust::xxh3::xxh3_128_with_seed(value, u64::from(self.seed));
                let (h1, h2) = (h as u64, (h >> 64) as u64 | 1);
                (0..u64::from(self.nr_hashes)).all(|i| probe(h1.wrapping_add(i.wrapping_mul(h2))))
            }
        }
    }
}

/// The kernel's `bloom_filter_map_ops`: push and peek only; through the
/// byte contract `update` pushes and `lookup` peeks, as the syscall does.
impl MapOps for BloomFilter {
    const CAPS: Caps = Caps::PUSH_PEEK;
    fn map_info(&self) -> MapInfo {
        self.info
    }
    /// Number of successful pushes, duplicates included (a bloom filter
    /// cannot tell how many distinct values it holds).
    fn map_len(&self) -> usize {
        self.pushes.load(Ordering::Relaxed)
    }
    /// The struct plus the bit array (the kernel's `bloom_map_mem_usage`).
    fn map_mem_usage(&self) -> usize {
        size_of::<Self>() + size_of_val::<[AtomicU64]>(&self.words)
    }
    /// `bpf_map_push_elem`: `flags` must be `BPF_ANY`, else `EINVAL`.
    fn map_push_elem(&self, value: &[u8], flag: UpdateFlag) -> Result<()> {
        if flag != UpdateFlag::Any {
            return Err(Error::invalid(format!(
                "bloom filter push flag {flag:?}: only BPF_ANY (0)"
            )));
        }
        BloomFilter::push(self, value)
    }
    /// `bpf_map_peek_elem`: `Ok` if `value` may be present, `ENOENT` if it
    /// certainly is not.
    fn map_peek_elem(&self, value: &mut [u8]) -> Result<()> {
        if self.contains(value) {
            Ok(())
        } else {
            Err(Error::NotFound)
        }
    }
}

impl Drop for BloomFilter {
    fn drop(&mut self) {
        // A big array is freed on the reaper thread (see `core::reclaim`).
        if self.words.len() >= 1 << 16 {
            crate::core::reclaim::drop_in_background(std::mem::take(&mut self.words));
        }
    }
}

#[cfg(test)]
mod tests;
