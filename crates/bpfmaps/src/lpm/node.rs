//! Trie nodes and their two kinds of immutable blocks.
//!
//! A node covers one byte (8 bits) of the key. It is two atomic pointers,
//! each to an immutable, popcount-compressed block that a writer replaces
//! whole (copy-on-write):
//!
//! ```text
//! Node (16 B) = { children: *ChildBlock, data: *DataBlock }
//!
//! ChildBlock = [ child bits: 256 + ranks (40 B) | len | Node x len ]
//!                 bit b set <=> a child node exists for key byte b
//!
//! DataBlock  = [ leaf bits (40 B) | prefix bits: 512 + ranks (80 B) |
//!                default | n_leaves | n_prefixes |
//!                leaf route ids x n_leaves | prefix route ids x n_prefixes ]
//! ```
//!
//! * Prefix bits: the prefixes stored in this node, as a complete binary
//!   tree over the byte: a prefix with `l` bits inside the byte (1..=8, or 0
//!   for `/0` at the root) and bit pattern `p` has index `(1 << l) | p`.
//! * Leaves: for every byte value `b`, the route of the longest prefix at
//!   this node or above that covers `b` ("leaf pushing", as in poptrie), run
//!   length encoded: leaf bit `b` is set where a new run starts, and the run
//!   holding `b` is entry `rank(b + 1) - 1`. Positions that have a child are
//!   never read; they extend the previous run so runs stay few.
//! * Default: the route this node inherits from above (the parent's best
//!   match for the byte leading here), painted under this node's prefixes.
//!
//! Children are stored inline in their block, so a lookup moves down one
//! level with one pointer load plus one `popcnt`.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};

use super::bits::Bits;
use super::routes::NO_ROUTE;

/// One trie node: pointers to its current child and data blocks.
#[repr(C)]
pub(super) struct Node {
    pub children: AtomicPtr<ChildBlock>,
    pub data: AtomicPtr<DataBlock>,
}

impl Node {
    /// A node holding `data` and no children.
    pub fn new(data: NonNull<DataBlock>) -> Self {
        Node { children: AtomicPtr::new(ptr::null_mut()), data: AtomicPtr::new(data.as_ptr()) }
    }

    /// The current data block.
    ///
    /// # Safety
    /// The caller is pinned (or is the writer) for `'a`.
    #[inline(always)]
    pub unsafe fn data<'a>(&self) -> &'a DataBlock {
        // SAFETY: a node's data pointer is never null and blocks live until
        // a grace period after they are replaced.
        unsafe { &*self.data.load(Ordering::Acquire) }
    }

    /// The current child block, if any.
    ///
    /// # Safety
    /// As for `data`.
    #[inline(always)]
    pub unsafe fn children<'a>(&self) -> Option<&'a ChildBlock> {
        // SAFETY: as for data.
        unsafe { self.children.load(Ordering::Acquire).as_ref() }
    }

    /// The child for key byte `b`, if any.
    ///
    /// # Safety
    /// As for `data`.
    #[inline(always)]
    pub unsafe fn child<'a>(&self, b: u8) -> Option<&'a Node> {
        // SAFETY: as for data.
        let block = unsafe { self.children()? };
        // SAFETY: the bit says the entry exists.
        block.bits.get(b as usize).then(|| unsafe { block.node(block.bits.rank(b as usize)) })
    }
}

/// Header of a child block; `len` nodes follow.
#[repr(C)]
pub(super) struct ChildBlock {
    pub bits: Bits<4>,
    len: u32,
}

impl ChildBlock {
    fn layout(len: usize) -> (Layout, usize) {
        Layout::new::<ChildBlock>()
            .extend(Layout::array::<Node>(len).expect("child array layout"))
            .expect("child block layout")
    }

    /// Allocates a block for `bits` whose nodes are `(children, data)`
    /// pointer pairs, in byte order.
    pub fn alloc(bits: Bits<4>, nodes: &[(*mut ChildBlock, *mut DataBlock)]) -> NonNull<ChildBlock> {
        debug_assert_eq!(bits.count(), nodes.len());
        let (layout, offset) = Self::layout(nodes.len());
        // SAFETY: non-zero size (the header alone is 44 bytes).
        let p = unsafe { alloc(layout) };
        let Some(block) = NonNull::new(p.cast::<ChildBlock>()) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: fresh allocation of the right layout.
        unsafe {
            block.as_ptr().write(ChildBlock { bits, len: nodes.len() as u32 });
            let first = p.add(offset).cast::<Node>();
            for (i, &(c, d)) in nodes.iter().enumerate() {
                first.add(i).write(Node { children: AtomicPtr::new(c), data: AtomicPtr::new(d) });
            }
        }
        block
    }

    /// Node `i` (in byte order).
    ///
    /// # Safety
    /// `i < len`.
    #[inline(always)]
    pub unsafe fn node(&self, i: usize) -> &Node {
        let (_, offset) = Self::layout(0);
        // SAFETY: the nodes follow the header at `offset`; i < len.
        unsafe { &*ptr::from_ref(self).cast::<u8>().add(offset).cast::<Node>().add(i) }
    }

    /// The `(children, data)` pointers of every node, in byte order.
    pub fn entries(&self) -> Vec<(*mut ChildBlock, *mut DataBlock)> {
        (0..self.len as usize)
            .map(|i| {
                // SAFETY: i < len.
                let n = unsafe { self.node(i) };
                (n.children.load(Ordering::Relaxed), n.data.load(Ordering::Relaxed))
            })
            .collect()
    }

    /// Bytes this block occupies.
    pub fn size(&self) -> usize {
        Self::layout(self.len as usize).0.size()
    }

    /// Frees the block itself (not the blocks its nodes point to).
    ///
    /// # Safety
    /// No one can reach the block any more.
    pub unsafe fn free(block: *mut ChildBlock) {
        // SAFETY: allocated by `alloc` with this length.
        unsafe { dealloc(block.cast(), Self::layout((*block).len as usize).0) }
    }
}

/// Header of a data block; leaf and prefix route ids follow.
#[repr(C)]
pub(super) struct DataBlock {
    pub leaf_bits: Bits<4>,
    pub prefix_bits: Bits<8>,
    pub default: u32,
    n_leaves: u16,
    n_prefixes: u16,
}

/// Index of the prefix with `l` bits (0..=8) and pattern `p` in a node.
#[inline]
pub(super) fn prefix_index(l: u32, byte: u8) -> usize {
    if l == 0 { 1 } else { (1 << l) | (byte as usize >> (8 - l)) }
}

/// Bits of a prefix index inside its byte: (l, first byte, one past last).
#[inline]
pub(super) fn index_range(idx: usize) -> (u32, usize, usize) {
    let l = usize::BITS - 1 - idx.leading_zeros();
    let p = idx & ((1 << l) - 1);
    (l, p << (8 - l), (p + 1) << (8 - l))
}

impl DataBlock {
    fn layout(n_leaves: usize, n_prefixes: usize) -> (Layout, usize) {
        Layout::new::<DataBlock>()
            .extend(Layout::array::<u32>(n_leaves + n_prefixes).expect("route array"))
            .expect("data block layout")
    }

    /// Builds a block: paints `default` then each prefix (shorter first)
    /// over the 256 byte values, and run-length encodes the result, letting
    /// positions in `child_bits` extend the previous run.
    pub fn build(prefix_bits: Bits<8>, prefix_routes: &[u32], default: u32, child_bits: &Bits<4>) -> NonNull<DataBlock> {
        debug_assert_eq!(prefix_bits.count(), prefix_routes.len());
        let mut paint = [default; 256];
        // Indices increase with prefix length, so longer prefixes paint last.
        for (idx, &route) in prefix_bits.ones().zip(prefix_routes) {
            let (_, lo, hi) = index_range(idx);
            paint[lo..hi].fill(route);
        }
        let mut leaf_bits = Bits::<4>::default();
        let mut leaves: Vec<u32> = Vec::with_capacity(8);
        for b in 0..256 {
            let run_goes_on = b > 0 && (child_bits.get(b) || leaves.last() == Some(&paint[b]));
            if !run_goes_on {
                leaf_bits.set_raw(b);
                leaves.push(paint[b]);
            }
        }
        leaf_bits.fix_ranks();

        let (layout, offset) = Self::layout(leaves.len(), prefix_routes.len());
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout) };
        let Some(block) = NonNull::new(p.cast::<DataBlock>()) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: fresh allocation of the right layout.
        unsafe {
            block.as_ptr().write(DataBlock {
                leaf_bits,
                prefix_bits,
                default,
                n_leaves: leaves.len() as u16,
                n_prefixes: prefix_routes.len() as u16,
            });
            let ids = p.add(offset).cast::<u32>();
            ptr::copy_nonoverlapping(leaves.as_ptr(), ids, leaves.len());
            ptr::copy_nonoverlapping(prefix_routes.as_ptr(), ids.add(leaves.len()), prefix_routes.len());
        }
        block
    }

    /// A block with no prefixes: every byte maps to `default`.
    pub fn empty(default: u32) -> NonNull<DataBlock> {
        Self::build(Bits::default(), &[], default, &Bits::default())
    }

    #[inline(always)]
    fn ids(&self) -> *const u32 {
        let (_, offset) = Self::layout(0, 0);
        // SAFETY: the id arrays follow the header at `offset`.
        unsafe { ptr::from_ref(self).cast::<u8>().add(offset).cast::<u32>() }
    }

    /// The route for byte `b` (`NO_ROUTE` if none). Only meaningful where
    /// there is no child.
    #[inline(always)]
    pub fn leaf(&self, b: u8) -> u32 {
        let run = self.leaf_bits.rank_incl(b as usize) - 1;
        // SAFETY: bit 0 is always set, so 0 <= run < n_leaves.
        unsafe { *self.ids().add(run) }
    }

    /// Route ids of the stored prefixes, in index order.
    pub fn prefix_routes(&self) -> &[u32] {
        // SAFETY: n_prefixes ids follow the leaves.
        unsafe { std::slice::from_raw_parts(self.ids().add(self.n_leaves as usize), self.n_prefixes as usize) }
    }

    /// Route of the prefix at `idx`, if stored.
    pub fn prefix(&self, idx: usize) -> Option<u32> {
        self.prefix_bits.get(idx).then(|| self.prefix_routes()[self.prefix_bits.rank(idx)])
    }

    /// The longest match for byte `b` among this node's prefixes, else the
    /// inherited default: what a child at `b` inherits.
    pub fn best_for(&self, b: u8) -> u32 {
        (0..=8).rev().find_map(|l| self.prefix(prefix_index(l, b))).unwrap_or(self.default)
    }

    /// Whether the node stores no prefixes.
    pub fn has_no_prefixes(&self) -> bool {
        self.n_prefixes == 0
    }

    /// Bytes this block occupies.
    pub fn size(&self) -> usize {
        Self::layout(self.n_leaves as usize, self.n_prefixes as usize).0.size()
    }

    /// Frees the block.
    ///
    /// # Safety
    /// No one can reach the block any more.
    pub unsafe fn free(block: *mut DataBlock) {
        // SAFETY: allocated by `build` with these counts.
        unsafe {
            let (n, m) = ((*block).n_leaves as usize, (*block).n_prefixes as usize);
            dealloc(block.cast(), Self::layout(n, m).0)
        }
    }
}

/// Frees a whole subtree: every block reachable from `children`/`data`.
///
/// # Safety
/// No one can reach the subtree any more.
pub(super) unsafe fn free_subtree(children: *mut ChildBlock, data: *mut DataBlock) {
    // SAFETY: the caller owns the subtree.
    unsafe {
        if !children.is_null() {
            for (c, d) in (*children).entries() {
                free_subtree(c, d);
            }
            ChildBlock::free(children);
        }
        if !data.is_null() {
            DataBlock::free(data);
        }
    }
}

/// "No route", re-exported for the trie.
pub(super) const NONE: u32 = NO_ROUTE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_indices_cover_their_byte_ranges() {
        assert_eq!(prefix_index(0, 0xab), 1);
        assert_eq!(index_range(1), (0, 0, 256));
        assert_eq!(prefix_index(1, 0x80), 3);
        assert_eq!(index_range(3), (1, 128, 256));
        assert_eq!(prefix_index(8, 0x05), 256 + 5);
        assert_eq!(index_range(261), (8, 5, 6));
        assert_eq!(index_range(prefix_index(3, 0b1010_0000)), (3, 0b1010_0000, 0b1100_0000));
    }

    #[test]
    fn data_block_paints_longest_prefix_per_byte() {
        let mut bits = Bits::<8>::default();
        bits.set_raw(prefix_index(1, 0x00)); // 0xxxxxxx -> 7
        bits.set_raw(prefix_index(8, 0x10)); // 00010000 -> 9
        bits.fix_ranks();
        let block = DataBlock::build(bits, &[7, 9], 3, &Bits::default());
        // SAFETY: just built, private.
        let d = unsafe { block.as_ref() };
        assert_eq!((d.leaf(0), d.leaf(0x10), d.leaf(0x11), d.leaf(0x7f), d.leaf(0x80), d.leaf(0xff)), (7, 9, 7, 7, 3, 3));
        assert_eq!((d.best_for(0x10), d.best_for(0x20), d.best_for(0x90)), (9, 7, 3));
        assert_eq!(d.n_leaves, 4);
        // SAFETY: private.
        unsafe { DataBlock::free(block.as_ptr()) };
    }
}
