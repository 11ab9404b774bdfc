//! The writer's side: one writer at a time (the trie's mutex) changes a
//! node by building new blocks and publishing each with one release
//! store, or writes a stored prefix's new payload in place; what it
//! replaces is retired to the epoch collector.

use std::ops::Range;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::{Located, LpmTrie, Pos, position};
use crate::core::arena::Arena;
use crate::core::error::{Error, Result, check_len};
use crate::core::flags::UpdateFlag;
use crate::core::reclaim::{Guard, drop_in_background, pin};
use crate::lpm::bits::Bits;
use crate::lpm::direct::Change;
use crate::lpm::node::{
    ChildBlock, Children, DataBlock, Entry, Leaf, Node, Skip, free_subtree, index_range,
};
use crate::lpm::routes::{RouteAlloc, RouteStore};

/// What `clear` leaves behind: the old tree and its routes, given back to
/// the arena and the route store on the reaper thread once the grace period
/// is over, so no reader or writer pays for walking it.
pub(super) struct ClearJob {
    pub arena: Arc<Arena>,
    pub children: *mut ChildBlock,
    pub data: *mut DataBlock,
    /// Route slots to give back with the tree.
    pub routes: Vec<u32>,
    pub store: Arc<RouteStore>,
}
// SAFETY: nobody else can reach a detached tree.
unsafe impl Send for ClearJob {}
impl Drop for ClearJob {
    fn drop(&mut self) {
        // SAFETY: detached and past its grace period.
        unsafe { free_subtree(&self.arena, self.children, self.data) };
        self.routes.drain(..).for_each(|r| self.store.release(r));
    }
}

impl LpmTrie {
    /// The payload for `value`: the value itself up to 4 bytes, else a
    /// route slot. Called unpinned when it can be: waiting for slots, a
    /// writer's own pin would hold back the grace periods it waits for.
    #[inline]
    pub(super) fn payload_of(&self, alloc: &mut RouteAlloc, value: &[u8]) -> Result<[u8; 4]> {
        if self.inline_values {
            // The value itself (up to 4 bytes; a loop, not a memcpy call).
            let mut payload = [0u8; 4];
            payload.iter_mut().zip(value).for_each(|(p, v)| *p = *v);
            return Ok(payload);
        }
        self.route_payload(alloc, value)
    }

    /// A route slot holding `value` (over 4 bytes), as its payload.
    fn route_payload(&self, alloc: &mut RouteAlloc, value: &[u8]) -> Result<[u8; 4]> {
        // With every slot live or in its grace period, push the grace
        // periods along (readers pin and unpin all the time, but one may
        // be descheduled while pinned) for a while before giving up with
        // EBUSY: only a reader pinned throughout keeps them back.
        let deadline = std::time::Instant::now() + Self::ROUTE_WAIT;
        loop {
            match self.routes.alloc(alloc, value) {
                Err(Error::Busy) if std::time::Instant::now() < deadline => {
                    pin().flush();
                    std::thread::yield_now();
                }
                r => return Ok(r?.to_ne_bytes()),
            }
        }
    }

    /// Gives back a payload that was never published.
    pub(super) fn unused_payload(&self, payload: [u8; 4]) {
        if !self.inline_values {
            self.routes.release(u32::from_ne_bytes(payload));
        }
    }

    /// How long `insert` tries to reclaim route slots before `EBUSY`.
    const ROUTE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

    /// Stores `value` for the prefix `data/prefixlen` (host bits ignored)
    /// under update `flags`. A new value for a stored prefix is written in
    /// place; a new prefix rebuilds its node's blocks. `E2BIG` when the map
    /// holds `max_entries` prefixes; `EBUSY` (map unchanged) when a value
    /// over 4 bytes finds no free route slot because `max_entries` replaced
    /// values still wait out a grace period behind a reader pinned all
    /// along.
    pub fn insert(&self, data: &[u8], prefixlen: u32, value: &[u8], flags: u64) -> Result<()> {
        let flag = UpdateFlag::from_bits(flags)?;
        check_len("value", value.len(), self.value_size)?;
        self.check_prefix(data, prefixlen)?;
        let mut alloc = self.writer.lock();
        // Before pinning (see `payload_of`); given back if unused.
        let payload = self.payload_of(&mut alloc, value)?;
        let guard = &pin();
        let (depth, idx) = position(data, prefixlen);
        let path = &data[..depth];
        let found = self.locate(path, guard);
        let old = found.as_ref().and_then(|f| f.data.prefix(idx));
        if let Err(e) = flag.check(old.is_some()) {
            self.unused_payload(payload);
            return Err(e);
        }
        if let (Some(found), Some(old)) = (found, old) {
            self.replace_payload(found, idx, Leaf { payload, prefixlen }, guard);
            self.retire_payload(old, guard);
            return Ok(());
        }
        if self.len.load(Ordering::Relaxed) >= self.max_entries as usize {
            self.unused_payload(payload);
            return Err(Error::Full);
        }
        let node = self.ensure_path(path, guard);
        self.set_prefix(node, Pos::of(path), idx, Some(payload), guard);
        self.len.fetch_add(1, Ordering::Relaxed);
        self.maybe_build_direct(guard);
        self.maybe_compact(guard);
        Ok(())
    }

    /// Removes the exact prefix `data/prefixlen`, copying its value into
    /// `out` if given. `ENOENT` if it is not stored.
    pub fn remove(&self, data: &[u8], prefixlen: u32, out: Option<&mut [u8]>) -> Result<()> {
        if let Some(out) = &out {
            check_len("value", out.len(), self.value_size)?;
        }
        self.check_prefix(data, prefixlen)?;
        let guard = &pin();
        let _writer = self.writer.lock();
        let (depth, idx) = position(data, prefixlen);
        let path = &data[..depth];
        let node = self.node_at(path, guard).ok_or(Error::NotFound)?;
        let payload = node.data(guard).prefix(idx).ok_or(Error::NotFound)?;
        if let Some(out) = out {
            out.copy_from_slice(&self.value(payload, guard));
        }
        self.set_prefix(node, Pos::of(path), idx, None, guard);
        self.prune(path, guard);
        self.retire_payload(payload, guard);
        self.len.fetch_sub(1, Ordering::Relaxed);
        self.maybe_compact(guard);
        Ok(())
    }

    /// Removes every prefix. The old tree is freed on the reaper thread
    /// after a grace period, so this returns at once.
    pub fn clear(&self) {
        let guard = &pin();
        let _writer = self.writer.lock();
        let mut routes = Vec::new();
        if !self.inline_values {
            self.for_each_payload(guard, |_, _, p| routes.push(u32::from_ne_bytes(p)));
        }
        let empty = DataBlock::empty(&self.arena, Leaf::NONE);
        let job = ClearJob {
            arena: Arc::clone(&self.arena),
            children: self.root.children.swap(ptr::null_mut(), Ordering::AcqRel),
            data: self.root.data.swap(empty.as_ptr(), Ordering::AcqRel),
            routes,
            store: Arc::clone(&self.routes),
        };
        self.mirror(&self.root, Pos::ROOT, Change::ALL, guard);
        self.len.store(0, Ordering::Relaxed);
        guard.defer(move || drop_in_background(job));
        // The blocks retired before come back with the tree.
        self.arena.flush_retired(guard);
    }

    /// The node at depth `path.len()` along `path`, created if missing:
    /// below depth 2 a new node takes a compressed edge over every byte
    /// left (up to `Skip::MAX`), and an edge that skips past the wanted
    /// depth or away from the path is split.
    fn ensure_path<'g>(&'g self, path: &[u8], guard: &'g Guard) -> &'g Node {
        let (mut node, mut pos) = (&self.root, Pos::ROOT);
        while pos.depth < path.len() {
            let b = path[pos.depth];
            let rest = &path[pos.depth + 1..];
            (node, pos) = match node.child(b, guard) {
                None => {
                    // Depths 1 and 2 stay uncompressed: the direct index
                    // mirrors them.
                    let skip = if pos.depth >= 2 {
                        Skip::new(&rest[..rest.len().min(Skip::MAX)])
                    } else {
                        Skip::NONE
                    };
                    (
                        self.add_child(node, pos, b, skip, guard),
                        pos.child(b, skip),
                    )
                }
                Some(child) => {
                    let common = child.skip.common_prefix(rest);
                    if common < child.skip.len() {
                        let head = child.skip.head(common);
                        (
                            self.split_child(node, pos, b, common, guard),
                            pos.child(b, head),
                        )
                    } else {
                        (child, pos.child(b, child.skip))
                    }
                }
            };
        }
        node
    }

    /// Replaces `node`'s child block by one with `bits` and `entries`,
    /// changed at byte `b`; refills the direct index and retires the old
    /// block.
    fn publish_children<'g>(
        &self,
        node: &'g Node,
        pos: Pos,
        b: u8,
        bits: Bits<4>,
        entries: &[Entry],
        guard: &'g Guard,
    ) -> Option<Children<'g>> {
        let new = if entries.is_empty() {
            ptr::null_mut()
        } else {
            ChildBlock::alloc(&self.arena, bits, entries).as_ptr()
        };
        let old = node.children.swap(new, Ordering::AcqRel);
        self.mirror(node, pos, Change::Child(b), guard);
        self.retire_child_block(old, guard);
        node.children(guard)
    }

    /// Adds an empty child at `b` of `node` (at `pos`) whose edge skips
    /// `skip`.
    fn add_child<'g>(
        &self,
        node: &'g Node,
        pos: Pos,
        b: u8,
        skip: Skip,
        guard: &'g Guard,
    ) -> &'g Node {
        let inherit = node.data(guard).leaf(b);
        let data = DataBlock::empty(&self.arena, inherit);
        let (mut bits, mut entries) = match node.children(guard) {
            Some(block) => (block.bits, block.entries()),
            None => (Bits::default(), Vec::new()),
        };
        let at = bits.rank(b as usize);
        bits.set_raw(b as usize);
        bits.fix_ranks();
        entries.insert(at, (ptr::null_mut(), data.as_ptr(), skip));
        let block = self
            .publish_children(node, pos, b, bits, &entries, guard)
            .expect("not empty");
        // SAFETY: `at` < len.
        unsafe { block.node(at) }
    }

    /// Splits the edge to the child at `b` of `node` (at `pos`) after
    /// `common` of its skipped bytes: a new node without prefixes there,
    /// whose one child is the old node with the rest of the skip. Readers
    /// see the old edge or the new pair, which answer alike. Returns the
    /// new node.
    fn split_child<'g>(
        &self,
        node: &'g Node,
        pos: Pos,
        b: u8,
        common: usize,
        guard: &'g Guard,
    ) -> &'g Node {
        let block = node.children(guard).expect("child exists");
        let at = block.bits.rank(b as usize);
        let mut entries = block.entries();
        let (c, d, skip) = entries[at];
        let mut bits = Bits::default();
        bits.set_raw(skip.byte(common) as usize);
        bits.fix_ranks();
        let below = ChildBlock::alloc(&self.arena, bits, &[(c, d, skip.tail(common + 1))]);
        let inherit = node.data(guard).leaf(b);
        let data = DataBlock::empty(&self.arena, inherit);
        entries[at] = (below.as_ptr(), data.as_ptr(), skip.head(common));
        let block = self
            .publish_children(node, pos, b, block.bits, &entries, guard)
            .expect("not empty");
        // SAFETY: `at` < len.
        unsafe { block.node(at) }
    }

    /// Removes the (empty) child at `b` of `parent` (at `pos`).
    fn remove_child(&self, parent: &Node, pos: Pos, b: u8, guard: &Guard) {
        let block = parent.children(guard).expect("child exists");
        let at = block.bits.rank(b as usize);
        let mut bits = block.bits;
        bits.clear_raw(b as usize);
        bits.fix_ranks();
        // The parent's leaf for `b` already answers without the child.
        let mut entries = block.entries();
        let (_, child_data, _) = entries.remove(at);
        self.publish_children(parent, pos, b, bits, &entries, guard);
        self.retire_data(child_data, guard);
    }

    /// After a removal at the node at depth `path.len()`: removes nodes
    /// left empty along `path`, deepest first, then merges a node left
    /// with no prefixes and one child into that child's edge, so the trie
    /// keeps the shape a fresh build would give.
    fn prune(&self, path: &[u8], guard: &Guard) {
        let mut chain: SmallVec<[_; 8]> = self.along(path, guard).collect();
        while chain.len() >= 2 {
            let (node, _) = chain.pop().expect("len >= 2");
            let &(parent, ppos) = chain.last().expect("len >= 1");
            let b = path[ppos.depth];
            let (children, data) = (node.children(guard), node.data(guard));
            if !data.has_no_prefixes() {
                return;
            }
            match children {
                None => self.remove_child(parent, ppos, b, guard),
                Some(only) if only.len() == 1 && ppos.depth >= 2 => {
                    self.merge_child(parent, ppos, b, guard);
                    return;
                }
                Some(_) => return,
            }
        }
    }

    /// Replaces the child at `b` of `parent` (at `pos`), which has no
    /// prefixes and one child, by that child on a longer edge (if the
    /// joined skip fits).
    fn merge_child(&self, parent: &Node, pos: Pos, b: u8, guard: &Guard) {
        let block = parent.children(guard).expect("child exists");
        let at = block.bits.rank(b as usize);
        let mut entries = block.entries();
        let (mid_children, mid_data, mid_skip) = entries[at];
        // SAFETY: `at` < len (the bit for `b` is set).
        let mid = unsafe { block.node(at) };
        let only = mid.children(guard).expect("the merged node has one child");
        let below_byte = only.bits.ones().next().expect("one child") as u8;
        let (c, d, skip) = only.entries()[0];
        let Some(joined) = mid_skip.join(below_byte, skip) else {
            return;
        };
        entries[at] = (c, d, joined);
        self.publish_children(parent, pos, b, block.bits, &entries, guard);
        self.retire_child_block(mid_children, guard);
        self.retire_data(mid_data, guard);
    }

    /// Sets (`Some`) or clears (`None`) the prefix at `idx` of `node` (at
    /// `pos`), then pushes the change down to the children below it.
    fn set_prefix(
        &self,
        node: &Node,
        pos: Pos,
        idx: usize,
        payload: Option<[u8; 4]>,
        guard: &Guard,
    ) {
        let old = node.data(guard);
        let new = old.with_prefix(&self.arena, pos.depth, idx, payload);
        let (_, lo, hi) = index_range(idx);
        self.publish_data(node, pos, new, lo..hi, guard);
        self.push_down(node, pos, lo, hi, guard);
    }

    /// Gives the stored prefix at `idx` of the node `found` (the prefix is
    /// `new.prefixlen` bits long) a new payload in place, without
    /// rebuilding a block: one word store into each of the node's runs it
    /// wins (or its hidden slot), and into the defaults and runs of the
    /// children that inherit it. A lookup reads one of those words, whole:
    /// the old payload or the new one; once this returns, only the new.
    fn replace_payload(&self, found: Located<'_>, idx: usize, new: Leaf, guard: &Guard) {
        found.data.set_prefix_payload(idx, new.payload);
        let Some(node) = found.node else {
            return; // A node without children, found through its slot.
        };
        let (_, lo, hi) = index_range(idx);
        self.mirror_payload(node, found.pos, lo..hi, guard);
        self.inherit_payload(node, found.pos, lo..hi, new, guard);
    }

    /// After payloads of `node` (at `pos`) changed in place: the direct
    /// index copies the leaves of the root and depth-1 nodes, so refill
    /// it from them; below, its slots hold pointers, which stay.
    fn mirror_payload(&self, node: &Node, pos: Pos, bytes: Range<usize>, guard: &Guard) {
        if pos.depth < 2 {
            self.mirror(node, pos, Change::Leaves(bytes), guard);
        }
    }

    /// The new payload of a prefix (`new`: its length and new payload)
    /// into the children of `node` (at `pos`) in `bytes` that inherit it,
    /// and on down. A child whose default is another prefix inherits a
    /// longer one, which hides this one in its whole subtree.
    fn inherit_payload(
        &self,
        node: &Node,
        pos: Pos,
        bytes: Range<usize>,
        new: Leaf,
        guard: &Guard,
    ) {
        let Some(children) = node.children(guard) else {
            return;
        };
        for b in bytes.filter(|&b| children.bits.get(b)) {
            // SAFETY: the bit is set.
            let child = unsafe { children.node(children.bits.rank(b)) };
            let data = child.data(guard);
            if data.default.load().prefixlen != new.prefixlen {
                continue;
            }
            data.set_inherited_payload(new.payload);
            let at = pos.child(b as u8, child.skip);
            self.mirror_payload(child, at, 0..256, guard);
            self.inherit_payload(child, at, 0..256, new, guard);
        }
    }

    /// Children in bytes `lo..hi` of `node` (at `pos`) re-inherit their
    /// default from `node`'s current data; changed ones are rebuilt,
    /// recursively.
    fn push_down(&self, node: &Node, pos: Pos, lo: usize, hi: usize, guard: &Guard) {
        let Some(block) = node.children(guard) else {
            return;
        };
        let data = node.data(guard);
        for b in lo..hi {
            if !block.bits.get(b) {
                continue;
            }
            // SAFETY: the bit is set.
            let child = unsafe { block.node(block.bits.rank(b)) };
            let inherit = data.leaf(b as u8);
            let cd = child.data(guard);
            if cd.default.load() != inherit {
                let at = pos.child(b as u8, child.skip);
                let rebuilt = DataBlock::build(&self.arena, at.depth, &cd.prefixes(), inherit);
                self.publish_data(child, at, rebuilt, 0..256, guard);
                self.push_down(child, at, 0, 256, guard);
            }
        }
    }

    /// Replaces `node`'s data block by `new`, whose leaves differ from
    /// the old one's only in `bytes`.
    fn publish_data(
        &self,
        node: &Node,
        pos: Pos,
        new: NonNull<DataBlock>,
        bytes: Range<usize>,
        guard: &Guard,
    ) {
        let old = node.data.swap(new.as_ptr(), Ordering::AcqRel);
        self.mirror(node, pos, Change::Leaves(bytes), guard);
        self.retire_data(old, guard);
    }

    fn retire_data(&self, old: *mut DataBlock, guard: &Guard) {
        // SAFETY: the block was in the tree until now.
        self.retire_block(old.cast(), unsafe { &*old }.size(), guard);
    }

    /// Retires a child block, not the blocks its nodes point to: those
    /// live on in the replacement.
    fn retire_child_block(&self, old: *mut ChildBlock, guard: &Guard) {
        if !old.is_null() {
            // SAFETY: the block was in the tree until now.
            self.retire_block(old.cast(), unsafe { ChildBlock::size_at(old) }, guard);
        }
    }

    /// Gives an unreachable block of `size` bytes back to the arena after
    /// the grace period.
    fn retire_block(&self, block: *mut u8, size: usize, guard: &Guard) {
        // SAFETY: unreachable for new readers; released after the grace
        // period.
        unsafe { self.arena.retire(block, size, guard) };
    }

    /// A replaced payload: its route slot (if any) is reused after the
    /// grace period.
    fn retire_payload(&self, payload: [u8; 4], guard: &Guard) {
        if !self.inline_values {
            let store = Arc::clone(&self.routes);
            guard.defer(move || store.release(u32::from_ne_bytes(payload)));
        }
    }
}
