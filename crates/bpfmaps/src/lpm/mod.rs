//! Longest-prefix-match maps: `BPF_MAP_TYPE_LPM_TRIE`.

pub mod kernel;
#[cfg(test)]
mod kernel_tests;
pub mod key;
#[cfg(test)]
pub(crate) mod model;

pub use kernel::KernelLpmTrie;
