//! `BPF_MAP_TYPE_BLOOM_FILTER` (in progress).
use crate::core::contract::MapSpec;
use crate::core::error::{Error, Result};

/// Bloom filter map.
pub struct BloomFilter;

impl BloomFilter {
    /// Builds from a `create()` spec.
    pub fn from_spec(_spec: &MapSpec) -> Result<std::convert::Infallible> {
        Err(Error::Unsupported)
    }
}
