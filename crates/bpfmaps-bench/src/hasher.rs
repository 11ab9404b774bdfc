//! A [`BuildHasher`] that hashes byte-slice keys exactly as a bpfmaps map
//! does under a [`HashPolicy`], so that peers (std, hashbrown, dashmap)
//! are compared with bpfmaps at equal hash: only the table design differs.
//!
//! The policy yields 32 bits; SwissTables take the bucket from the low bits
//! and a 7-bit tag from the top bits of a 64-bit hash. Zero-extending would
//! give every key the same tag, so the 32 bits are duplicated into both
//! halves: the low half indexes (as in the kernel, `hash & mask`), the high
//! half feeds the tag and dashmap's shard choice.

use std::hash::{BuildHasher, Hasher};

use bpfmaps::HashPolicy;

/// Builds [`PolicyHasher`]s for one policy and seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyBuildHasher {
    /// The hash policy.
    pub policy: HashPolicy,
    /// The seed (a map's `initval`).
    pub seed: u32,
}

impl PolicyBuildHasher {
    /// A builder for `policy` with `seed`.
    pub fn new(policy: HashPolicy, seed: u32) -> Self {
        PolicyBuildHasher { policy, seed }
    }
}

impl BuildHasher for PolicyBuildHasher {
    type Hasher = PolicyHasher;

    fn build_hasher(&self) -> PolicyHasher {
        PolicyHasher {
            policy: self.policy,
            seed: self.seed,
            hash: 0,
        }
    }
}

/// Hashes one byte string with a [`HashPolicy`].
///
/// Meant for `[u8]`, `Vec<u8>` and `Box<[u8]>` keys, whose `Hash` writes a
/// length prefix (ignored here: the policy hash covers the length) and then
/// the bytes in one `write`. Other key types would hash only their last
/// `write`.
#[derive(Debug, Clone)]
pub struct PolicyHasher {
    policy: HashPolicy,
    seed: u32,
    hash: u64,
}

impl Hasher for PolicyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let h = self.policy.hash(bytes, self.seed) as u64;
        self.hash = (h << 32) | h;
    }

    #[inline]
    fn write_usize(&mut self, _len: usize) {}

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_like_the_policy() {
        for policy in HashPolicy::ALL {
            let b = PolicyBuildHasher::new(policy, 99);
            for len in [1usize, 4, 7, 16, 33, 64] {
                let key = vec![0xa5u8; len];
                let h = policy.hash(&key, 99) as u64;
                let want = (h << 32) | h;
                assert_eq!(b.hash_one(&key[..]), want, "{policy:?} {len}");
                assert_eq!(b.hash_one(key.clone().into_boxed_slice()), want);
                assert_eq!(b.hash_one(&key), want);
            }
        }
    }
}
