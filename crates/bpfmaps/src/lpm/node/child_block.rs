//! Nodes and the child blocks that hold them inline.

use std::alloc::Layout;
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};

use super::{DataBlock, Skip};
use crate::core::arena::Arena;
use crate::core::reclaim::Guard;
use crate::lpm::bits::Bits;

/// A child-block entry: the node's (children, data, skip).
pub(crate) type Entry = (*mut ChildBlock, *mut DataBlock, Skip);

/// One trie node: pointers to its current child and data blocks, and the
/// key bytes its edge skips (fixed for the life of the entry).
#[repr(C)]
pub(crate) struct Node {
    pub children: AtomicPtr<ChildBlock>,
    pub data: AtomicPtr<DataBlock>,
    pub skip: Skip,
}

impl Node {
    /// A node holding `data` and no children.
    pub fn new(data: NonNull<DataBlock>) -> Self {
        Node {
            children: AtomicPtr::new(ptr::null_mut()),
            data: AtomicPtr::new(data.as_ptr()),
            skip: Skip::NONE,
        }
    }

    /// The current data block, readable while `guard` is pinned.
    ///
    /// Every node lives in a trie (the root) or in a child block, and the
    /// trie's one writer frees a block only through the epoch collector a
    /// grace period after it replaced it; `guard` pins that collector (only
    /// `bpfmaps::pin()` makes a `Guard`), so the block outlives `'g`.
    #[inline(always)]
    pub fn data<'g>(&'g self, _guard: &'g Guard) -> &'g DataBlock {
        // SAFETY: a node's data pointer is never null; the block outlives
        // the guard (above). Acquire pairs with the writer's release store
        // that published the block, so its contents are visible.
        unsafe { &*self.data.load(Ordering::Acquire) }
    }

    /// The current child block, if any, readable while `guard` is pinned
    /// (as for [`data`](Self::data)).
    #[inline(always)]
    pub fn children<'g>(&'g self, _guard: &'g Guard) -> Option<Children<'g>> {
        // Acquire: as for `data`. The block outlives the guard (as for
        // `data`), which the handle's lifetime stands for.
        NonNull::new(self.children.load(Ordering::Acquire)).map(|block| Children {
            block,
            _guard: PhantomData,
        })
    }

    /// The child for key byte `b`, if any.
    #[inline(always)]
    pub fn child<'g>(&'g self, b: u8, guard: &'g Guard) -> Option<&'g Node> {
        let block = self.children(guard)?;
        // SAFETY: the bit says the entry exists.
        block
            .bits
            .get(b as usize)
            .then(|| unsafe { block.node(block.bits.rank(b as usize)) })
    }
}

/// Header of a child block; `len` nodes follow.
#[repr(C)]
pub(crate) struct ChildBlock {
    pub bits: Bits<4>,
    len: u32,
}

impl ChildBlock {
    fn layout(len: usize) -> (Layout, usize) {
        Layout::new::<ChildBlock>()
            .extend(Layout::array::<Node>(len).expect("child array layout"))
            .expect("child block layout")
    }

    /// Allocates a block for `bits` whose nodes are `entries`, in byte
    /// order.
    pub fn alloc(arena: &Arena, bits: Bits<4>, nodes: &[Entry]) -> NonNull<ChildBlock> {
        debug_assert_eq!(bits.count(), nodes.len());
        let (layout, offset) = Self::layout(nodes.len());
        debug_assert_eq!(
            offset,
            size_of::<ChildBlock>().next_multiple_of(align_of::<Node>())
        );
        let p = arena.alloc(layout).as_ptr();
        let block = NonNull::new(p.cast::<ChildBlock>()).expect("arena block");
        // SAFETY: fresh allocation of the right layout.
        unsafe {
            block.as_ptr().write(ChildBlock {
                bits,
                len: nodes.len() as u32,
            });
            let first = p.add(offset).cast::<Node>();
            for (i, &(c, d, skip)) in nodes.iter().enumerate() {
                first.add(i).write(Node {
                    children: AtomicPtr::new(c),
                    data: AtomicPtr::new(d),
                    skip,
                });
            }
        }
        block
    }

    /// Where node `i` (in byte order) of the block at `block` is, derived
    /// from the pointer to the whole block (see [`Children`]).
    ///
    /// # Safety
    /// `block` points to a live block and `i < len`.
    #[inline(always)]
    unsafe fn node_ptr(block: NonNull<ChildBlock>, i: usize) -> NonNull<Node> {
        const OFFSET: usize = size_of::<ChildBlock>().next_multiple_of(align_of::<Node>());
        // SAFETY: the nodes follow the header at `OFFSET` inside the block
        // (`alloc` lays them out so); i < len.
        unsafe { block.byte_add(OFFSET).cast::<Node>().add(i) }
    }

    /// The entries of every node of the block at `block`, in byte order.
    ///
    /// # Safety
    /// `block` points to a live block.
    unsafe fn entries_of(block: NonNull<ChildBlock>) -> Vec<Entry> {
        // SAFETY: the caller's block is live; its header is never written
        // after `alloc`.
        let len = unsafe { block.as_ref() }.len as usize;
        // Room for one more: adding a child inserts one.
        let mut out = Vec::with_capacity(len + 1);
        out.extend((0..len).map(|i| {
            // SAFETY: i < len, in a live block.
            let n = unsafe { Self::node_ptr(block, i).as_ref() };
            (
                n.children.load(Ordering::Relaxed),
                n.data.load(Ordering::Relaxed),
                n.skip,
            )
        }));
        out
    }

    /// Bytes of the block at `block`.
    ///
    /// # Safety
    /// `block` points to a live block.
    pub unsafe fn size_at(block: *mut ChildBlock) -> usize {
        // SAFETY: the caller's; the header is never written after `alloc`.
        Self::layout(unsafe { (*block).len } as usize).0.size()
    }

    /// Gives the block itself (not the blocks its nodes point to) back to
    /// the arena.
    ///
    /// # Safety
    /// No one can reach the block any more.
    pub unsafe fn free(arena: &Arena, block: *mut ChildBlock) {
        // SAFETY: allocated by `alloc` from this arena with this length.
        unsafe { arena.release(block.cast(), Self::layout((*block).len as usize).0.size()) }
    }
}

/// A node's child block, readable for `'g` (while the guard it was loaded
/// under is pinned; see [`Node::data`]).
///
/// A handle on the pointer to the whole block rather than a
/// `&'g ChildBlock`: the nodes lie past the header, and the writer stores
/// into them (a node's `children` and `data` pointers are replaced in
/// place), so pointers to them must come from the block's own pointer. A
/// pointer derived from a `&ChildBlock` only carries a shared reference's
/// permission for the header (`Bits` and a length, no interior
/// mutability): a write through it, even an atomic one, is undefined
/// behaviour (Miri's Tree Borrows reported the writer's
/// `node.children.swap` through such a pointer). It derefs to the header.
#[derive(Clone, Copy)]
pub(crate) struct Children<'g> {
    block: NonNull<ChildBlock>,
    _guard: PhantomData<&'g ChildBlock>,
}

impl<'g> Children<'g> {
    /// Node `i` (in byte order).
    ///
    /// # Safety
    /// `i < len`.
    #[inline(always)]
    pub unsafe fn node(self, i: usize) -> &'g Node {
        // SAFETY: the block is live for 'g (the guard); i < len.
        unsafe { ChildBlock::node_ptr(self.block, i).as_ref() }
    }

    /// The entries of every node, in byte order.
    pub fn entries(self) -> Vec<Entry> {
        // SAFETY: the block is live for 'g.
        unsafe { ChildBlock::entries_of(self.block) }
    }

    /// Number of children.
    pub fn len(self) -> usize {
        self.len as usize
    }

    /// Bytes of the block.
    pub fn size(self) -> usize {
        ChildBlock::layout(self.len()).0.size()
    }
}

impl Deref for Children<'_> {
    type Target = ChildBlock;

    /// The header (`bits`, the length), never written after `alloc`.
    #[inline(always)]
    fn deref(&self) -> &ChildBlock {
        // SAFETY: the block is live for 'g, which outlives the handle.
        unsafe { self.block.as_ref() }
    }
}

/// Gives a whole subtree back to the arena: every block reachable from
/// `children`/`data`.
///
/// # Safety
/// No one can reach the subtree any more.
pub(crate) unsafe fn free_subtree(arena: &Arena, children: *mut ChildBlock, data: *mut DataBlock) {
    // SAFETY: the caller owns the subtree.
    unsafe {
        if let Some(block) = NonNull::new(children) {
            for (c, d, _) in ChildBlock::entries_of(block) {
                free_subtree(arena, c, d);
            }
            ChildBlock::free(arena, children);
        }
        if !data.is_null() {
            DataBlock::free(arena, data);
        }
    }
}
