//! Longest-prefix-match maps: `BPF_MAP_TYPE_LPM_TRIE`.

pub mod key;
#[cfg(test)]
pub(crate) mod model;
