//! String and byte-string keys: maps whose keys are byte strings of any
//! length up to a maximum, stored once inside the structure (a BPF hash
//! map pads every key to the longest), in lexicographic byte order.
//!
//! - [`QpTrieMap`]: a path-compressed byte trie, one writer lock per
//!   first byte, lock-free readers.

mod block;
mod contract;
mod qptrie;
#[cfg(test)]
mod tests;

pub use contract::QP_TRIE_FAMILY;
pub use qptrie::{LOOKUP_GROUP, MAX_INLINE_TAIL, MAX_KEY_SIZE, QpTrieMap};
