//! Longest-prefix-match maps: `BPF_MAP_TYPE_LPM_TRIE`.
//!
//! [`LpmTrie`] is a multibit trie: 8-bit strides, popcount-compressed
//! child and leaf arrays, leaf pushing (each leaf already holds the
//! longest match, so lookups never backtrack), blocks replaced whole
//! (copy-on-write) with epoch reclamation so lookups are lock-free.
//! See `node.rs` for the layout and `trie.rs` for the algorithms.

mod bits;
mod ip;
pub mod key;
#[cfg(test)]
pub(crate) mod model;
mod node;
mod routes;
#[cfg(test)]
mod tests;
mod trie;

pub use ip::{IpLpm, IpPrefix, Ipv4Lpm, Ipv6Lpm};
pub use trie::{Found, LpmTrie};
