//! Hash functions and the per-map hash policy.
//!
//! The kernel hashes every hash-map key with jhash (jhash2 for keys that are
//! whole 32-bit words). xxh3 is much faster on long keys; a hybrid policy
//! (`jhash2` for word-multiple keys under 32 bytes, xxh3 otherwise) was
//! proposed upstream and never merged. bpfmaps offers all three per map.
//!
//! The default is xxh3: the `hash-sweep` benchmark (100K entries, key
//! sizes 4..256) measured it fastest, or within noise of fastest, at every
//! key size, including the small word-multiple keys where the proposal
//! keeps jhash2: in userspace xxh3's short-key path is cheaper than jhash2's
//! final mix. See `docs/benchmarks.md`.

mod jhash;

pub use jhash::{JHASH_INITVAL, jhash, jhash2, jhash2_bytes};

/// xxh3 (64-bit, seeded), one-shot. Truncated to 32 bits for bucket indexing.
#[inline]
pub fn xxh3(key: &[u8], seed: u32) -> u32 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, seed as u64) as u32
}

/// Which hash function a map uses for its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HashPolicy {
    /// The kernel today: `jhash2` when the key is whole words, else `jhash`.
    Jhash,
    /// xxh3 for every key size.
    #[default]
    Xxh3,
    /// The upstream proposal: `jhash2` for word-multiple keys under 32
    /// bytes, xxh3 otherwise.
    Hybrid,
}

impl HashPolicy {
    /// Every policy, for sweeps.
    pub const ALL: [HashPolicy; 3] = [HashPolicy::Jhash, HashPolicy::Xxh3, HashPolicy::Hybrid];

    /// Short name for tables and plots.
    pub fn name(self) -> &'static str {
        match self {
            HashPolicy::Jhash => "jhash",
            HashPolicy::Xxh3 => "xxh3",
            HashPolicy::Hybrid => "hybrid",
        }
    }

    /// Hashes `key` with `seed` under this policy.
    #[inline]
    pub fn hash(self, key: &[u8], seed: u32) -> u32 {
        match self {
            HashPolicy::Jhash => kernel_htab_hash(key, seed),
            HashPolicy::Xxh3 => xxh3(key, seed),
            HashPolicy::Hybrid => {
                if key.len().is_multiple_of(4) && key.len() < 32 {
                    jhash2_bytes(key, seed)
                } else {
                    xxh3(key, seed)
                }
            }
        }
    }
}

/// The kernel's `htab_map_hash()`.
#[inline]
pub fn kernel_htab_hash(key: &[u8], seed: u32) -> u32 {
    if key.len().is_multiple_of(4) {
        jhash2_bytes(key, seed)
    } else {
        jhash(key, seed)
    }
}

/// A random seed, or 0 when `BPF_F_ZERO_SEED` is set.
pub(crate) fn seed_for(flags: u32) -> u32 {
    if flags & crate::core::flags::BPF_F_ZERO_SEED != 0 {
        0
    } else {
        rand::random()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_follows_the_proposed_rule() {
        let key = [7u8; 64];
        for len in 0..=64 {
            let k = &key[..len];
            let want = if len % 4 == 0 && len < 32 {
                jhash2_bytes(k, 3)
            } else {
                xxh3(k, 3)
            };
            assert_eq!(HashPolicy::Hybrid.hash(k, 3), want, "len={len}");
        }
    }

    #[test]
    fn jhash_policy_is_the_kernels() {
        assert_eq!(
            HashPolicy::Jhash.hash(&[1, 0, 0, 0], 0),
            jhash2(&[u32::from_ne_bytes([1, 0, 0, 0])], 0)
        );
        assert_eq!(HashPolicy::Jhash.hash(b"abc", 0), jhash(b"abc", 0));
    }

    #[test]
    fn seeds_change_hashes() {
        for p in HashPolicy::ALL {
            assert_ne!(
                p.hash(b"0123456789abcdef", 1),
                p.hash(b"0123456789abcdef", 2),
                "{p:?}"
            );
        }
    }
}
