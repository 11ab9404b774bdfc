//! Direct pointing for the top 16 bits (poptrie's name for it): one array
//! slot per value of the first two key bytes, so a lookup skips the root
//! and depth-1 nodes and starts at depth 2 with a single load.
//!
//! ```text
//! slot[b0 << 8 | b1] = one word (8 B; 512 KiB in all)
//!   ..01  the leaf that answers for b0.b1 (no depth-2 node there: from
//!         the depth-1 node or the root), packed with its tag
//!   ..00  the depth-2 node's data block (a node without children)
//!   ..10  the depth-2 node itself (a node with children)
//! ```
//!
//! So a lookup in a /16 that holds nothing longer ends with one load, and
//! one in a /16 with a childless node (nearly all of them in IPv4) reads
//! the node's data block straight away. One word per slot keeps the index
//! half the size of a two-pointer slot, so more of it stays in L2.
//!
//! The slots mirror the tree; the tree stays the writer's source of truth
//! (queries and iteration walk it). After every store into a node at depth
//! 0, 1 or 2 the writer re-points or re-fills the slots that node answers
//! for, before it retires the replaced block: a reader that loaded a slot
//! is pinned, so the blocks (or the node) it points at outlive its lookup,
//! exactly as for a tree pointer. A node reached through its slot is read
//! as in the tree, children first, then data.
//!
//! The array is 512 KiB, so a trie gets one only once it holds enough
//! prefixes for the saved levels to matter (see `LpmTrie`).

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};

use super::node::{Answer, DataBlock, Hit, Leaf, NONE_BLOCK, Node};
use crate::core::prefetch::prefetch;
use crate::core::reclaim::Guard;

/// Lookups `start_group` (and so `LpmTrie::get_many`) runs side by side.
pub(super) const GROUP: usize = 32;

/// Slots in the index: one per 16-bit key prefix.
const SLOTS: usize = 1 << 16;

/// Tag of a packed leaf (bit 0); pointers have it clear (blocks are 16-byte
/// aligned, nodes 8-byte).
const LEAF_TAG: u64 = 1;
/// Tag of a node pointer (bit 1, with bit 0 clear).
const NODE_TAG: u64 = 2;

/// Both tag bits: a slot word is a leaf (01), a node (10) or a block (00).
const TAGS: u64 = LEAF_TAG | NODE_TAG;

/// A leaf packed in a word: payload in the high half, prefix length + 1 (0
/// for no match; lengths are at most 2048) above the two tag bits.
fn pack(leaf: Leaf) -> u64 {
    u64::from(u32::from_ne_bytes(leaf.payload)) << 32
        | u64::from(leaf.prefixlen.wrapping_add(1) & 0xffff) << 2
        | LEAF_TAG
}

#[inline(always)]
fn unpack(word: u64) -> Leaf {
    Leaf {
        payload: ((word >> 32) as u32).to_ne_bytes(),
        prefixlen: (((word >> 2) & 0xffff) as u32).wrapping_sub(1),
    }
}

/// An answer from a packed leaf.
pub(super) trait FromSlot: Answer {
    fn from_slot(word: u64) -> Self;
}

impl FromSlot for Leaf {
    #[inline(always)]
    fn from_slot(word: u64) -> Self {
        unpack(word)
    }
}

impl FromSlot for Hit {
    /// The payload to the low half, the length + 1 to bit 34 and up.
    #[inline(always)]
    fn from_slot(word: u64) -> Self {
        Hit::from_bits(word.rotate_right(32))
    }
}

/// A depth-2 node as its slot shows it (`DirectIndex::at_depth2`).
pub(super) enum Depth2<'g> {
    /// A node with children.
    Node(&'g Node),
    /// The data block of a node without children.
    Childless(&'g DataBlock),
    /// No node.
    Absent,
}

/// What a store into a node changed, for `DirectIndex::mirror`.
#[derive(Clone, Debug)]
pub(super) enum Change {
    /// A new data block whose leaves may differ in these bytes.
    Leaves(std::ops::Range<usize>),
    /// A new child block that added or removed the child at this byte.
    Child(u8),
}

impl Change {
    /// A new data block, any of whose leaves may differ.
    pub const ALL: Change = Change::Leaves(0..256);
}

/// One slot: the leaf answering for its /16, or the depth-2 node's data
/// block or the node itself.
type Slot = AtomicU64;

/// The direct index of a trie with keys of at least 3 bytes.
pub(super) struct DirectIndex {
    /// The `SLOTS` slots of a leaked `Box<[Slot]>` (freed by `Drop`). A raw
    /// base, so that reaching a slot borrows that slot alone: through the
    /// box each access would borrow the whole 512 KiB array, which costs
    /// nothing compiled but milliseconds a slot under Miri's Tree Borrows
    /// (minutes a build, against seconds this way).
    slots: NonNull<Slot>,
}

// SAFETY: the index owns its slots, atomics, as a `Box<[Slot]>` would.
unsafe impl Send for DirectIndex {}
// SAFETY: as above; every access to a slot is atomic.
unsafe impl Sync for DirectIndex {}

impl Drop for DirectIndex {
    fn drop(&mut self) {
        let slots = ptr::slice_from_raw_parts_mut(self.slots.as_ptr(), SLOTS);
        // SAFETY: `build` leaked this box of `SLOTS` slots, and nothing
        // borrows the index while it drops.
        drop(unsafe { Box::from_raw(slots) });
    }
}

impl DirectIndex {
    /// An index mirroring the tree under `root` (writer only, before the
    /// index is published). Its slots are written as they are made, with
    /// the words `refresh_b0` would store, not stored atomically after:
    /// under Miri, which keeps state for every location stored to
    /// atomically, that halved the direct index test (docs/testing.md).
    pub fn build(root: &Node, guard: &Guard) -> Self {
        let mut slots = Vec::with_capacity(SLOTS);
        for b0 in 0..=255u8 {
            words_b0(root, b0, guard, |_, word| slots.push(AtomicU64::new(word)));
        }
        let slots: Box<[Slot]> = slots.into_boxed_slice();
        DirectIndex {
            slots: NonNull::from(Box::leak(slots)).cast(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        size_of::<Self>() + SLOTS * size_of::<Slot>()
    }

    #[inline(always)]
    fn slot(&self, b0: u8, b1: u8) -> &Slot {
        self.slot_at((b0 as usize) << 8 | b1 as usize)
    }

    #[inline(always)]
    fn slot_at(&self, i: usize) -> &Slot {
        debug_assert!(i < SLOTS);
        // SAFETY: every caller's `i` is below SLOTS (2^16: two key bytes).
        unsafe { self.slots.add(i).as_ref() }
    }

    /// Where the lookup of `addr` (3 bytes or more) continues: the depth-2
    /// node (one with children: the tree walk goes on from it), or the leaf
    /// that answers.
    #[inline(always)]
    pub fn start<'g, R: FromSlot>(&'g self, addr: &[u8], guard: &'g Guard) -> Result<&'g Node, R> {
        let word = self.slot(addr[0], addr[1]).load(Ordering::Acquire);
        match node_of(word, guard) {
            Some(node) => Ok(node),
            None => {
                let block = block_of(word, guard);
                Err(answer(word, R::from_run(block, block.run_of(addr[2]))))
            }
        }
    }

    /// What the slot of `b0.b1` points at, for the writer: the depth-2
    /// node there (one with children), its data block (one without), or
    /// nothing (the slot holds a leaf: there is no depth-2 node).
    pub fn at_depth2<'g>(&'g self, b0: u8, b1: u8, guard: &'g Guard) -> Depth2<'g> {
        let word = self.slot(b0, b1).load(Ordering::Acquire);
        match node_of(word, guard) {
            Some(node) => Depth2::Node(node),
            None if word & LEAF_TAG == 0 => Depth2::Childless(block_of(word, guard)),
            None => Depth2::Absent,
        }
    }

    /// `start` for each of `addrs` (all of 3 bytes or more) into `out`
    /// (as long), in stages over the whole group so that their loads
    /// overlap: prefetch every slot; read the slots and prefetch the blocks
    /// they point at; rank each key byte in its block's header and prefetch
    /// its run's payload and code; read the runs.
    pub fn start_group<'g, A: AsRef<[u8]>, R: FromSlot>(
        &'g self,
        addrs: &[A],
        guard: &'g Guard,
        out: &mut [Result<&'g Node, R>],
    ) {
        const N: usize = GROUP;
        debug_assert!(addrs.len() <= N && out.len() == addrs.len());
        let slot = |a: &A| {
            let a = a.as_ref();
            self.slot(a[0], a[1])
        };
        for a in addrs {
            prefetch(slot(a));
        }
        let mut words = [0u64; N];
        let mut blocks: [&DataBlock; N] = [NONE_BLOCK.block(); N];
        for ((w, blk), a) in words.iter_mut().zip(blocks.iter_mut()).zip(addrs) {
            *w = slot(a).load(Ordering::Acquire);
            *blk = block_of(*w, guard);
            prefetch(ptr::from_ref(*blk));
        }
        let mut runs = [0usize; N];
        for ((run, blk), a) in runs.iter_mut().zip(&blocks).zip(addrs) {
            *run = blk.run_of(a.as_ref()[2]);
            for p in blk.run_addresses(*run) {
                prefetch(p);
            }
        }
        for (((o, &w), blk), &run) in out.iter_mut().zip(&words).zip(&blocks).zip(&runs) {
            *o = match node_of(w, guard) {
                Some(node) => Ok(node),
                None => Err(answer(w, R::from_run(blk, run))),
            };
        }
    }

    /// Re-points the slots of the node at `depth` reached by `top` (its
    /// first key bytes) after a store into it. Writer only; call before
    /// retiring what the node pointed at. Only the slots that `change`
    /// can reach are refilled: a new data block's leaves change in its
    /// bytes, a depth-1 node's new child block adds or removes one child
    /// and moves the others (slots point at the depth-2 nodes inside it).
    pub fn mirror(
        &self,
        root: &Node,
        at: (usize, [u8; 2]),
        node: &Node,
        change: Change,
        guard: &Guard,
    ) {
        let (depth, top) = at;
        match (depth, change) {
            // The root's leaves answer for every b0 without a depth-1 node.
            (0, Change::Leaves(bytes)) => {
                for b0 in bytes.map(|b| b as u8) {
                    if root.child(b0, guard).is_none() {
                        self.refresh_b0(root, b0, guard);
                    }
                }
            }
            // Today's write paths never need this one: a new depth-1
            // node starts empty and one is removed only once empty, so
            // its leaves are the root's leaf for `b0`, which the slots
            // already hold (the tests pass without it). A subtree built
            // apart and linked whole would need it.
            (0, Change::Child(b0)) => self.refresh_b0(root, b0, guard),
            (1, Change::Leaves(bytes)) => {
                let (data, children) = (node.data(guard), node.children(guard));
                for b1 in bytes.map(|b| b as u8) {
                    if children.as_ref().is_none_or(|c| !c.bits.get(b1 as usize)) {
                        self.slot(top[0], b1)
                            .store(pack(data.leaf(b1)), Ordering::Release);
                    }
                }
            }
            (1, Change::Child(b1)) => {
                let children = node.children(guard);
                if children.as_ref().is_none_or(|c| !c.bits.get(b1 as usize)) {
                    let leaf = node.data(guard).leaf(b1);
                    self.slot(top[0], b1).store(pack(leaf), Ordering::Release);
                }
                if let Some(c) = &children {
                    for (i, b) in c.bits.ones().enumerate() {
                        // SAFETY: `i` < len: the `i`th set bit.
                        self.copy_node(self.slot(top[0], b as u8), unsafe { c.node(i) });
                    }
                }
            }
            (2, _) => self.copy_node(self.slot(top[0], top[1]), node),
            _ => {}
        }
    }

    /// Refills every slot from the tree under `root` (writer only).
    pub fn refresh_all(&self, root: &Node, guard: &Guard) {
        for b0 in 0..=255 {
            self.refresh_b0(root, b0, guard);
        }
    }

    /// Refills the 256 slots under key byte `b0` from the tree (see
    /// `words_b0`).
    fn refresh_b0(&self, root: &Node, b0: u8, guard: &Guard) {
        words_b0(root, b0, guard, |b1, word| {
            self.slot(b0, b1).store(word, Ordering::Release);
        });
    }

    /// Whether every slot holds what `refresh_b0` would store now: the
    /// mirror never fell behind the tree (for tests).
    #[cfg(test)]
    pub fn matches_tree(&self, root: &Node, guard: &Guard) -> bool {
        let mut all = true;
        for b0 in 0..=255 {
            words_b0(root, b0, guard, |b1, word| {
                all &= self.slot(b0, b1).load(Ordering::Relaxed) == word;
            });
        }
        all
    }

    /// Points `slot` at `node` (see `node_word`).
    fn copy_node(&self, slot: &Slot, node: &Node) {
        slot.store(node_word(node), Ordering::Release);
    }
}

/// The slot word for a depth-2 node: its data block while it has no
/// children, else the node itself (whose two pointers the tree keeps
/// current).
fn node_word(node: &Node) -> u64 {
    let word = if node.children.load(Ordering::Relaxed).is_null() {
        node.data.load(Ordering::Relaxed) as u64
    } else {
        ptr::from_ref(node) as u64 | NODE_TAG
    };
    debug_assert_eq!(word & LEAF_TAG, 0);
    word
}

/// The words of the 256 slots under key byte `b0`, as `f(b1, word)`:
/// each is the depth-2 node there, else the leaf of the deepest node
/// above that answers for it (without a depth-1 node, the root's one
/// leaf for `b0`, found once).
fn words_b0(root: &Node, b0: u8, guard: &Guard, mut f: impl FnMut(u8, u64)) {
    let Some(n1) = root.child(b0, guard) else {
        let word = pack(root.data(guard).leaf(b0));
        (0..=255).for_each(|b1| f(b1, word));
        return;
    };
    let data = n1.data(guard);
    let children = n1.children(guard);
    // The children in byte order: the next one's index in the block.
    let mut next = 0;
    for b1 in 0..=255 {
        match &children {
            Some(c) if c.bits.get(b1 as usize) => {
                // SAFETY: a set bit below b1 counts one node each.
                f(b1, node_word(unsafe { c.node(next) }));
                next += 1;
            }
            _ => f(b1, pack(data.leaf(b1))),
        }
    }
}

/// The node a slot word (loaded under `guard`) points at, if it is a node.
/// A node and the blocks a slot points at live until a grace period after
/// the slot stops pointing at them (the writer re-points slots before it
/// retires anything), so they outlive the guard.
#[inline(always)]
fn node_of(word: u64, _guard: &Guard) -> Option<&Node> {
    // SAFETY: a node-tagged word points at a live node (above).
    (word & TAGS == NODE_TAG).then(|| unsafe { &*((word & !NODE_TAG) as *const Node) })
}

/// The data block a slot word (loaded under `guard`) points at, else the
/// static one-run block. Whether a /16 has a block is unpredictable for
/// random keys, and a mispredicted branch throws away the lookups in
/// flight behind it, so every word gets a block to read its leaf from,
/// without a branch.
#[inline(always)]
fn block_of(word: u64, _guard: &Guard) -> &DataBlock {
    let none = ptr::from_ref(NONE_BLOCK.block());
    let block = std::hint::select_unpredictable(word & TAGS == 0, word as *const DataBlock, none);
    // SAFETY: a block-tagged word points at a live block (as in
    // `node_of`), and the static block lives forever.
    unsafe { &*block }
}

/// The answer of a slot word that is not a node: from its packed leaf,
/// else `from_block`, the answer its block gave (chosen without a branch).
#[inline(always)]
fn answer<R: FromSlot>(word: u64, from_block: R) -> R {
    std::hint::select_unpredictable(word & LEAF_TAG != 0, R::from_slot(word), from_block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_leaves_round_trip() {
        for leaf in [
            Leaf::NONE,
            Leaf {
                payload: [1, 2, 3, 4],
                prefixlen: 0,
            },
            Leaf {
                payload: [0xff; 4],
                prefixlen: 2048,
            },
        ] {
            assert_eq!(unpack(pack(leaf)), leaf);
            assert_eq!(pack(leaf) & TAGS, LEAF_TAG);
            let (hit, want) = (Hit::from_slot(pack(leaf)), Hit::from_leaf(leaf));
            assert_eq!(
                (hit.is_none(), hit.payload()),
                (want.is_none(), want.payload())
            );
        }
    }
}
