//! Range maps: the kernel's maple tree (`lib/maple_tree.c`) in
//! userspace. Non-overlapping inclusive ranges of `u64` indices, each
//! holding a value, in a B-tree of wide nodes; loads, ordered walks from
//! a cursor, free-range search and allocation, and readers that never
//! wait for the writer.
//!
//! - [`MapleTree`]: the typed tree (`store_range`, `insert_range`,
//!   `load`, `erase`, `find`, `iter`/`range` both ways, `cursor`,
//!   `empty_area`/`empty_area_rev`, `alloc_range`/`alloc_rrange`,
//!   `alloc_cyclic`).
//! - [`Exclusive`]: the same tree borrowed `&mut`, whose writes edit its
//!   nodes in place (the kernel's tree outside RCU mode).
//! - [`MapleMap`]: its byte contract, through the registry as
//!   [`MapType::MAPLE_TREE`](crate::MapType::MAPLE_TREE).
//!
//! Why not the kernel's node format: see `maple/node.rs` (a range takes
//! one slot, not two, when it has free space beside it), and
//! docs/design.md ("Range maps") for the node sizes.

mod contract;
mod cursor;
mod exclusive;
mod node;
mod tree;

#[cfg(test)]
mod tests;

pub use contract::{MAPLE_TREE_FAMILY, MapleMap};
pub use cursor::{Cursor, Iter};
pub use exclusive::Exclusive;
pub use node::{BRANCH_SLOTS, LEAF_SLOTS};
pub use tree::{Entry, MapleTree};
