//! `LpmTrie`: the multibit, leaf-pushed, copy-on-write trie (see `node`).
//!
//! # Lookup
//! 1. Start at the root with `d = 0`; or, once the trie is big enough to
//!    have a direct index (`direct.rs`), at the index slot of the first two
//!    key bytes: it holds the leaf that answers (done), the data block of
//!    a depth-2 node without children (its leaf for key byte 2 answers), or
//!    the depth-2 node (go on at step 2 with `d = 2`).
//! 2. Let `b` be key byte `d`. If the node's child bits have `b`, move to
//!    that child (inline in the child block) and go on with `d + 1`.
//! 3. Otherwise the answer is the node's run for `b`: its payload (the
//!    value, or a route id) and code, already the longest match thanks to
//!    leaf pushing. Done: no backtracking.
//!
//! # Update
//! One writer at a time (a mutex; readers never take it). Changing a
//! node's prefixes builds a new data block and swaps it in with one release
//! store; children whose inherited default changes get new data blocks too,
//! recursively ("push down"). Adding or removing a child builds a new child
//! block. Every replaced block is freed after an epoch grace period. A new
//! value for a stored prefix changes no run boundary, so it is written in
//! place instead: one atomic word store per run, hidden slot and default
//! holding the prefix's payload, down every subtree that inherits it.
//!
//! A reader walks one path and its answer comes from one run. Each block
//! it reads is wholly old or wholly new, and every byte of a data block,
//! those with a child included, holds the node's best match at the time
//! the block was built. So an answer is always a stored route containing
//! the address, and never shorter than a route that was stored during the
//! whole lookup (a child added meanwhile may be missed, as if the lookup
//! had run before the update; a removed one may still be seen, as if it ran
//! before the removal).
//!
//! The code: `lookup.rs` (the reader's walk and the get family),
//! `write.rs` (the one writer: inserts, removals, copy-on-write
//! publication and retirement), `compact.rs` (copying every block into
//! fresh chunks once churn has left the arena fragmented), `iter.rs`
//! (queries and ordered iteration), `contract.rs` (the family's byte
//! contract).

mod bulk;
mod compact;
mod contract;
mod iter;
mod lookup;
mod write;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::direct::{Change, Depth2, DirectIndex};
use super::key::{self, mask_host_bits};
use super::node::{DataBlock, Leaf, Node, Skip, prefix_index};
use super::routes::{RouteAlloc, RouteStore};
use crate::core::arena::Arena;
use crate::core::error::{Error, Result};
use crate::core::reclaim::{Guard, pin};

pub use contract::LPM_TRIE_FAMILY;

/// A prefix found by a query: its data (host bits zero), length and route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Prefix bytes, host bits cleared.
    pub data: Vec<u8>,
    /// Prefix length in bits.
    pub prefixlen: u32,
    payload: [u8; 4],
}

/// A value found by a lookup. Values of up to 4 bytes live in the runs
/// and are copied out, so a lookup returns without one more load (and an
/// answer may live in the direct index, which is rewritten in place); larger
/// values are borrowed from their route slot while the guard is pinned.
/// Derefs to the value's bytes.
#[derive(Clone, Copy)]
pub enum Value<'g> {
    /// A value of `len` <= 4 bytes.
    Inline {
        /// The value, in its first `len` bytes.
        bytes: [u8; 4],
        /// The map's value size.
        len: u8,
    },
    /// A value over 4 bytes, in its route slot.
    Slot(&'g [u8]),
}

impl std::ops::Deref for Value<'_> {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        match self {
            Value::Inline { bytes, len } => &bytes[..*len as usize],
            Value::Slot(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl PartialEq for Value<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl PartialEq<[u8]> for Value<'_> {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

/// `BPF_MAP_TYPE_LPM_TRIE` over byte strings of `data_size` bytes.
///
/// ```
/// use bpfmaps::lpm::LpmTrie;
/// use bpfmaps::BPF_ANY;
///
/// let trie = LpmTrie::new(4, 4, 1000).unwrap();
/// trie.insert(&[10, 0, 0, 0], 8, &1u32.to_ne_bytes(), BPF_ANY).unwrap();
/// trie.insert(&[10, 1, 0, 0], 16, &2u32.to_ne_bytes(), BPF_ANY).unwrap();
/// let guard = bpfmaps::pin();
/// assert_eq!(trie.get(&[10, 1, 2, 3], &guard).as_deref(), Some(&2u32.to_ne_bytes()[..]));
/// assert_eq!(trie.get(&[10, 2, 2, 3], &guard).as_deref(), Some(&1u32.to_ne_bytes()[..]));
/// assert_eq!(trie.get(&[11, 0, 0, 0], &guard), None);
/// ```
pub struct LpmTrie {
    data_size: usize,
    value_size: usize,
    max_entries: u32,
    map_flags: u32,
    root: Node,
    /// Every node block lives here; dropping the trie frees its chunks.
    arena: Arc<Arena>,
    /// Values of up to 4 bytes live in the runs; larger ones in `routes`.
    inline_values: bool,
    routes: Arc<RouteStore>,
    writer: Mutex<RouteAlloc>,
    len: AtomicUsize,
    /// Direct pointing for the top 16 bits, built once the trie holds
    /// `direct_from` prefixes (keys of 3 bytes or more).
    direct: OnceLock<DirectIndex>,
    direct_from: usize,
    /// Writes before the writer looks at the arena again (`compact.rs`).
    compact_countdown: AtomicU32,
    /// Compactions so far.
    compactions: AtomicU64,
}

/// Prefixes a trie holds before it builds its direct index. The index
/// speeds lookups at any size (`docs/benchmarks.md`), but its 512 KiB
/// would be most of a small map's memory: from 4,096 prefixes on it costs
/// 128 B per prefix or less.
pub const DIRECT_INDEX_FROM: usize = 4 << 10;

/// A node's place in the tree, as far as the direct index cares: its depth
/// and its first two key bytes.
#[derive(Clone, Copy)]
struct Pos {
    depth: usize,
    top: [u8; 2],
}

impl Pos {
    const ROOT: Pos = Pos {
        depth: 0,
        top: [0; 2],
    };

    fn of(path: &[u8]) -> Pos {
        let mut top = [0; 2];
        let n = path.len().min(2);
        top[..n].copy_from_slice(&path[..n]);
        Pos {
            depth: path.len(),
            top,
        }
    }

    /// The child at byte `b` whose edge skips `skip` more bytes.
    fn child(self, b: u8, skip: Skip) -> Pos {
        let mut top = self.top;
        if self.depth < 2 {
            top[self.depth] = b;
        }
        Pos {
            depth: self.depth + 1 + skip.len(),
            top,
        }
    }
}

/// A node the writer found (`LpmTrie::locate`): the node, its place and
/// its data block. `node` is `None` for a depth-2 node without children
/// found through the direct index, whose slot holds the data block alone
/// (enough to give a stored prefix a new payload: no child inherits it,
/// and the slot does not change).
struct Located<'g> {
    node: Option<&'g Node>,
    pos: Pos,
    data: &'g DataBlock,
}

/// Where a prefix lives: the node at `depth` (reached by the first `depth`
/// bytes) and the index inside it.
fn position(data: &[u8], prefixlen: u32) -> (usize, usize) {
    if prefixlen == 0 {
        (0, 1)
    } else {
        let depth = ((prefixlen - 1) / 8) as usize;
        (
            depth,
            prefix_index(prefixlen - 8 * depth as u32, data[depth]),
        )
    }
}

impl LpmTrie {
    /// A trie for `data_size`-byte keys (4 for IPv4, 16 for IPv6, 1..=256).
    pub fn new(data_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
        key::check_sizes(key::KEY_HEADER + data_size, value_size, max_entries)?;
        let arena = Arc::new(Arena::new());
        let root_data = DataBlock::empty(&arena, Leaf::NONE);
        Ok(LpmTrie {
            data_size,
            value_size,
            max_entries,
            map_flags: 0,
            root: Node::new(root_data),
            arena,
            inline_values: value_size <= 4,
            routes: Arc::new(RouteStore::new(
                value_size,
                if value_size <= 4 { 0 } else { max_entries },
            )),
            writer: Mutex::new(RouteAlloc::default()),
            len: AtomicUsize::new(0),
            direct: OnceLock::new(),
            direct_from: DIRECT_INDEX_FROM,
            compact_countdown: AtomicU32::new(0),
            compactions: AtomicU64::new(0),
        })
    }

    /// Builds the direct index once the trie holds `prefixes` (0: at once;
    /// `usize::MAX`: never). Keys shorter than 3 bytes never get one.
    pub fn with_direct_index_from(mut self, prefixes: usize) -> Self {
        self.direct_from = prefixes;
        self.maybe_build_direct(&pin());
        self
    }

    /// Whether lookups start at the direct index.
    pub fn has_direct_index(&self) -> bool {
        self.direct.get().is_some()
    }

    /// Builds the direct index if it is due (writer, or before sharing).
    fn maybe_build_direct(&self, guard: &Guard) {
        if self.data_size >= 3
            && self.direct.get().is_none()
            && self.len.load(Ordering::Relaxed) >= self.direct_from
        {
            let _ = self.direct.set(DirectIndex::build(&self.root, guard));
        }
    }

    /// After a store into `node` (at `pos`) that made `change`: refill the
    /// direct index, before anything the node pointed at is retired.
    fn mirror(&self, node: &Node, pos: Pos, change: Change, guard: &Guard) {
        if let Some(direct) = self.direct.get() {
            direct.mirror(&self.root, (pos.depth, pos.top), node, change, guard);
        }
    }

    /// Refills every slot of the direct index, if there is one, from the
    /// tree (after the whole tree changed: a bulk load or a compaction),
    /// before anything the slots pointed at is retired.
    fn refresh_direct(&self, guard: &Guard) {
        if let Some(direct) = self.direct.get() {
            direct.refresh_all(&self.root, guard);
        }
    }

    /// The nodes along `path` from the root with their positions, as far
    /// as the tree has them: up to the node at depth `path.len()`, or the
    /// last one before a missing child or a skip that leaves the path.
    fn along<'a>(
        &'a self,
        path: &'a [u8],
        guard: &'a Guard,
    ) -> impl Iterator<Item = (&'a Node, Pos)> + 'a {
        self.along_from((&self.root, Pos::ROOT), path, guard)
    }

    /// `along` from `start`, a node on `path` at its position.
    fn along_from<'a>(
        &'a self,
        start: (&'a Node, Pos),
        path: &'a [u8],
        guard: &'a Guard,
    ) -> impl Iterator<Item = (&'a Node, Pos)> + 'a {
        std::iter::successors(Some(start), move |&(node, pos)| {
            let b = *path.get(pos.depth)?;
            let child = node.child(b, guard)?;
            let at = pos.child(b, child.skip);
            (at.depth <= path.len() && child.skip.matches(&path[pos.depth + 1..]))
                .then_some((child, at))
        })
    }

    /// The node at depth `path.len()` along `path`, if the tree has one.
    fn node_at<'a>(&'a self, path: &'a [u8], guard: &'a Guard) -> Option<&'a Node> {
        match self.locate(path, guard)? {
            Located {
                node: Some(node), ..
            } => Some(node),
            // A depth-2 node's slot holds its data block: walk to the node.
            Located { node: None, .. } => self
                .along(path, guard)
                .last()
                .filter(|(_, pos)| pos.depth == path.len())
                .map(|(node, _)| node),
        }
    }

    /// The node at depth `path.len()` along `path`, if the tree has one,
    /// found as the writer finds it: through the direct index when the
    /// path reaches depth 2 (one load instead of a walk from the root),
    /// else from the root.
    fn locate<'a>(&'a self, path: &'a [u8], guard: &'a Guard) -> Option<Located<'a>> {
        let start = match self.direct.get() {
            Some(direct) if path.len() >= 2 => {
                let pos = Pos::of(&path[..2]);
                match direct.at_depth2(path[0], path[1], guard) {
                    Depth2::Node(node) => (node, pos),
                    Depth2::Childless(data) => {
                        return (path.len() == 2).then_some(Located {
                            node: None,
                            pos,
                            data,
                        });
                    }
                    Depth2::Absent => return None,
                }
            }
            _ => (&self.root, Pos::ROOT),
        };
        self.along_from(start, path, guard)
            .last()
            .filter(|(_, pos)| pos.depth == path.len())
            .map(|(node, pos)| Located {
                node: Some(node),
                pos,
                data: node.data(guard),
            })
    }

    /// `data/prefixlen` checked: the trie's data size, a length it holds.
    /// The host bits need no clearing for a write: its path is the
    /// prefix's whole bytes, and `position` shifts out the rest.
    fn check_prefix(&self, data: &[u8], prefixlen: u32) -> Result<()> {
        if data.len() != self.data_size || prefixlen as usize > 8 * self.data_size {
            self.masked(data, prefixlen)?;
        }
        Ok(())
    }

    /// `data/prefixlen` checked, with its host bits cleared.
    fn masked(&self, data: &[u8], prefixlen: u32) -> Result<([u8; key::DATA_SIZE_MAX], u32)> {
        if data.len() != self.data_size {
            return Err(Error::invalid(format!(
                "prefix data is {} bytes, the trie expects {}",
                data.len(),
                self.data_size
            )));
        }
        if prefixlen as usize > 8 * self.data_size {
            return Err(Error::invalid(format!(
                "prefixlen {prefixlen} exceeds {} bits",
                8 * self.data_size
            )));
        }
        let mut buf = [0u8; key::DATA_SIZE_MAX];
        buf[..data.len()].copy_from_slice(data);
        mask_host_bits(&mut buf[..data.len()], prefixlen);
        Ok((buf, prefixlen))
    }

    /// Key data size in bytes.
    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// Whether the direct index, if any, mirrors the tree exactly (for
    /// tests).
    #[cfg(test)]
    pub(crate) fn direct_index_matches_tree(&self) -> bool {
        let _writer = self.writer.lock();
        let guard = &pin();
        self.direct
            .get()
            .is_none_or(|d| d.matches_tree(&self.root, guard))
    }

    /// The sum of `f` over every node, the root included (for tests).
    #[cfg(test)]
    fn sum_over_nodes(&self, f: impl Fn(&Node, &Guard) -> usize + Copy) -> usize {
        fn sum(node: &Node, f: impl Fn(&Node, &Guard) -> usize + Copy, guard: &Guard) -> usize {
            f(node, guard)
                + node.children(guard).map_or(0, |c| {
                    // SAFETY: i < len.
                    (0..c.len())
                        .map(|i| sum(unsafe { c.node(i) }, f, guard))
                        .sum()
                })
        }
        let _writer = self.writer.lock();
        sum(&self.root, f, &pin())
    }

    /// Number of nodes, the root included (for tests of the trie's shape).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.sum_over_nodes(|_, _| 1)
    }

    /// Number of hidden prefixes over all nodes (for tests).
    #[cfg(test)]
    pub(crate) fn hidden_count(&self) -> usize {
        self.sum_over_nodes(|node, guard| node.data(guard).hidden_len())
    }

    /// Whether the arena holds released blocks (for tests).
    #[cfg(test)]
    pub(crate) fn arena_has_returned(&self) -> bool {
        self.arena.has_returned()
    }

    /// Bytes in use: live node blocks (not the free or not yet carved part
    /// of the arena's chunks), route slots, the direct index, the struct.
    pub fn memory_live(&self) -> usize {
        size_of::<Self>()
            + self.arena.live_bytes()
            + self.routes.bytes()
            + self.direct.get().map_or(0, DirectIndex::bytes)
    }

    /// Bytes held: node blocks, route slots, the struct.
    pub fn memory_usage(&self) -> usize {
        size_of::<Self>()
            + self.arena.bytes()
            + self.routes.bytes()
            + self.direct.get().map_or(0, DirectIndex::bytes)
    }
}
