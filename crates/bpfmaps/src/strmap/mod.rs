//! String and byte-string keys: maps whose keys are byte strings of any
//! length up to a maximum, stored once inside the structure (a BPF hash
//! map pads every key to the longest), in lexicographic byte order.
//!
//! - [`QpTrieMap`]: a path-compressed byte trie whose small subtrees are
//!   buckets (a subtree's keys as sorted records, found by a one-byte
//!   hash tag), one writer lock per first byte, lock-free readers.
//! - [`TstMap`]: the ternary search tree map proposed for BPF in 2022
//!   (path-compressed fragments, `lo`/`eq`/`hi` children, one writer
//!   lock), completed with delete and `get_next_key` and given lock-free
//!   readers: the baseline `QpTrieMap` is measured against.

mod block;
#[cfg(test)]
mod common_tests;
mod contract;
mod limits;
mod qptrie;
#[cfg(test)]
mod tests;
mod tst;
#[cfg(test)]
mod tst_tests;

pub use block::{BUCKET_BYTES, BUCKET_KEYS};
pub use contract::{QP_TRIE_BUCKET_EXTRA_BITS, QP_TRIE_FAMILY, TST_FAMILY};
pub use qptrie::{LOOKUP_GROUP, MAX_INLINE_TAIL, MAX_KEY_SIZE, QpTrieMap};
pub use tst::TstMap;
