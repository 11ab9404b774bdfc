//! Longest-prefix-match maps: `BPF_MAP_TYPE_LPM_TRIE`.
//!
//! [`LpmTrie`] is a multibit trie: 8-bit strides, popcount-compressed
//! child and leaf arrays, leaf pushing (each leaf already holds the
//! longest match, so lookups never backtrack), blocks replaced whole
//! (copy-on-write) with epoch reclamation so lookups are lock-free. Big
//! tries add a direct index of the top 16 bits (one slot per first two
//! key bytes), so a lookup starts at depth 2 with one load.
//! See `node.rs` for the layout and `trie.rs` for the algorithms.
//!
//! [`KernelLpmTrie`] is a faithful port of the kernel's
//! `kernel/bpf/lpm_trie.c` (binary nodes, one lock, one allocation per
//! node): the baseline every LPM benchmark shows, and a second test oracle.

mod bits;
mod direct;
mod ip;
#[cfg(test)]
mod iter_tests;
pub mod kernel;
#[cfg(test)]
mod kernel_tests;
pub mod key;
#[cfg(test)]
pub(crate) mod model;
mod node;
mod routes;
#[cfg(test)]
mod tests;
mod trie;

pub use ip::{IpLpm, IpPrefix, Ipv4Lpm, Ipv6Lpm};
pub use kernel::{KERNEL_LPM_TRIE_FAMILY, KernelLpmTrie};
pub use trie::{DIRECT_INDEX_FROM, Found, LPM_TRIE_FAMILY, LpmTrie, Value};
