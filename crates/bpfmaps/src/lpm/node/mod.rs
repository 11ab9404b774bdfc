//! Trie nodes and their two kinds of blocks, immutable but for payloads.
//!
//! A node covers one byte (8 bits) of the key. It is two atomic pointers,
//! each to an immutable, popcount-compressed block that a writer replaces
//! whole (copy-on-write). The one exception: a prefix's payload, wherever
//! a block holds it, is an atomic word that the writer may overwrite in
//! place when the prefix gets a new value:
//!
//! ```text
//! Node (24 B) = { children: *ChildBlock, data: *DataBlock, skip }
//!
//! ChildBlock = [ child bits: 256 + ranks (40 B) | len | Node x len ]
//!                 bit b set <=> a child node exists for key byte b
//!
//! DataBlock  = [ run bits (40 B) | default leaf (8 B) | counts, depth,
//!                levels (8 B) | runs, in groups of 4: 4 codes (1 B each),
//!                then their 4 payloads (4 B each) |
//!                hidden prefix index x h (2 B) | hidden payload x h (4 B) ]
//! ```
//!
//! * Prefixes: a prefix with `l` bits inside the node's byte (1..=8, or 0
//!   for `/0` at the root) and bit pattern `p` has index `(1 << l) | p`, a
//!   complete binary tree over the byte.
//! * Runs: for every byte value `b`, the longest prefix at this node or
//!   above that covers `b` ("leaf pushing", as in poptrie) wins `b`.
//!   Run-length encoded: run bit `b` is set where a new winner starts,
//!   and the run holding `b` is entry `rank(bits <= b) - 1`. A run holds
//!   its winner's payload (the value itself when values fit in 4 bytes)
//!   and a code: `l + 1` for the node's prefix of `l` bits, else
//!   `INHERITED` (the default, a match) or `NO_MATCH` (0), so whether a
//!   run matched is its code alone. The code and the run's first byte
//!   name the prefix, so the runs are also the node's set of prefixes:
//!   only those that win no byte (longer prefixes of the node cover them
//!   all) are listed apart, as hidden. Each payload is stored once, at 5
//!   bytes per run (`docs/design.md` compares the layouts measured). A
//!   lookup reads a run's code and payload, nearly always from one cache
//!   line.
//!   Bytes that have a child get their true run too: a reader that loaded
//!   the child block before the child existed reads it.
//! * Default: the route this node inherits from above (the parent's best
//!   match for the byte leading here), painted under this node's prefixes.
//!
//! Children are stored inline in their block, so a lookup moves down one
//! level with one pointer load plus one `popcnt`.
//!
//! * Skip (path compression): a node below depth 2 may sit at the end of a
//!   compressed edge that skips up to 7 key bytes, where the uncompressed
//!   trie would have a chain of nodes with one child and no prefixes (the
//!   sparse lower levels of an IPv6 table). A lookup entering the node
//!   compares those bytes with the key; on a mismatch the answer is the
//!   node's default (nothing is stored along the skipped bytes). The skip
//!   is part of the node's entry in its parent's child block, so it costs
//!   no extra load.

mod child_block;
mod data_block;
mod leaf;
mod order;
mod prefixes;
mod runs;
mod skip;

pub(super) use child_block::{ChildBlock, Children, Entry, Node, free_subtree};
pub(super) use data_block::{DataBlock, NONE_BLOCK};
pub(super) use leaf::{Answer, Hit, Leaf, LeafCell};
pub(super) use order::{PreOrder, Unit, child_post_key, next_post, post_key};
pub(super) use prefixes::{Prefixes, index_range, prefix_index};
pub(super) use skip::Skip;
