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

use std::cmp::Ordering as Cmp;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytemuck::Pod;
use parking_lot::Mutex;

use super::arena::Arena;
use super::bits::Bits;
use super::direct::{DirectIndex, FromSlot, GROUP};
use super::key::{self, KeyRef, mask_host_bits};
use super::node::{
    Answer, ChildBlock, DataBlock, Entry, Hit, Leaf, Node, Prefixes, Skip, free_subtree,
    index_range, prefix_index,
};
use super::routes::{RouteAlloc, RouteStore};
use crate::core::contract::{Caps, MapInfo, MapOps, MapSpec, MapType};
use crate::core::error::{Error, Result, check_len};
use crate::core::family::{Family, KeyKind};
use crate::core::flags::{BPF_F_NO_PREALLOC, UpdateFlag};
use crate::core::reclaim::{Guard, drop_in_background, pin};

impl MapType {
    /// `BPF_MAP_TYPE_LPM_TRIE`.
    pub const LPM_TRIE: MapType = MapType(11);
}

/// `BPF_MAP_TYPE_LPM_TRIE`, for the registry: `key_size = 4 + data_size`;
/// flags 0 or `BPF_F_NO_PREALLOC` (which the kernel requires; here it
/// changes nothing).
pub const LPM_TRIE_FAMILY: Family = Family {
    map_type: MapType::LPM_TRIE,
    name: "lpm_trie",
    map_flags: BPF_F_NO_PREALLOC,
    map_extra: 0,
    key_size: key::KEY_SIZE,
    value_size: key::VALUE_SIZE,
    keys: KeyKind::LpmPrefix,
    build: |spec| Ok(Box::new(LpmTrie::from_spec(spec)?)),
};

/// A raw pointer moved into a deferred free.
struct Owned<T>(*mut T);
// SAFETY: the pointee is unreachable and owned by the closure that frees it.
unsafe impl<T> Send for Owned<T> {}

/// What `clear` leaves behind: the old tree and its routes, given back to
/// the arena and the route store on the reaper thread once the grace period
/// is over, so no reader or writer pays for walking it.
struct ClearJob {
    arena: Arc<Arena>,
    children: *mut ChildBlock,
    data: *mut DataBlock,
    routes: Vec<u32>,
    store: Arc<RouteStore>,
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
}

/// Prefixes a trie holds before it builds its direct index. The index
/// speeds lookups at any size (`lpm-scale` at 10K real IPv4 prefixes: 14.8
/// ns without it, 9.3 ns with it; docs/benchmarks.md), but its 512 KiB
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
        })
    }

    /// Builds the direct index once the trie holds `prefixes` (0: at once;
    /// `usize::MAX`: never). Keys shorter than 3 bytes never get one.
    pub fn with_direct_index_from(mut self, prefixes: usize) -> Self {
        self.direct_from = prefixes;
        self.maybe_build_direct();
        self
    }

    /// Whether lookups start at the direct index.
    pub fn has_direct_index(&self) -> bool {
        self.direct.get().is_some()
    }

    /// Builds the direct index if it is due (writer, or before sharing).
    fn maybe_build_direct(&self) {
        if self.data_size >= 3
            && self.direct.get().is_none()
            && self.len.load(Ordering::Relaxed) >= self.direct_from
        {
            let _ = self.direct.set(DirectIndex::build(&self.root));
        }
    }

    /// After a store into `node` (at `pos`) of a data block (`child`
    /// `None`) or of a child block that added or removed the child at
    /// `Some(b)`: refill the direct index, before anything the node pointed
    /// at is retired.
    fn mirror(&self, node: &Node, pos: Pos, child: Option<u8>) {
        if let Some(direct) = self.direct.get() {
            direct.mirror(&self.root, pos.depth, pos.top, node, child);
        }
    }

    /// Builds from a spec that passed [`LPM_TRIE_FAMILY`]'s checks.
    fn from_spec(spec: &MapSpec) -> Result<Self> {
        let data_size = spec.key_size as usize - key::KEY_HEADER;
        let mut trie = Self::new(data_size, spec.value_size as usize, spec.max_entries)?;
        trie.map_flags = spec.flags;
        Ok(trie)
    }

    /// Key data size in bytes.
    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// The answer (leaf or hit) of the longest prefix matching `addr`
    /// (full length).
    #[inline(always)]
    fn lookup<R: FromSlot>(&self, addr: &[u8], guard: &Guard) -> R {
        match self.direct.get() {
            // SAFETY: pinned by `guard`; the index exists only for keys of
            // 3 bytes or more.
            Some(direct) => match unsafe { direct.start(addr) } {
                Ok(node) => self.walk(node, 2, addr, guard),
                Err(leaf) => leaf,
            },
            None => self.walk(&self.root, 0, addr, guard),
        }
    }

    /// The lookup of `addr` from `node`, entered at `depth`.
    #[inline(always)]
    fn walk<R: Answer>(&self, mut node: &Node, mut depth: usize, addr: &[u8], _guard: &Guard) -> R {
        loop {
            // `node` was entered at `depth`: first the bytes its edge skips.
            let skip = node.skip;
            if !skip.is_none() {
                if !skip.matches(&addr[depth..]) {
                    // SAFETY: pinned; nothing is stored along a skip.
                    return R::from_leaf(unsafe { node.data() }.default.load());
                }
                depth += skip.len();
            }
            let b = addr[depth];
            // SAFETY: pinned by `_guard`.
            match unsafe { node.child(b) } {
                Some(child) => {
                    node = child;
                    depth += 1;
                }
                None => {
                    // SAFETY: as above; the block outlives the guard.
                    let data = unsafe { node.data() };
                    return R::from_run(data, data.run_of(b));
                }
            }
        }
    }

    /// The values of the longest prefixes matching each of `addrs` into
    /// `out` (`None` for no match, or an address of the wrong length), as
    /// `get` would give them. A loop of `get` overlaps only as many lookups
    /// as the CPU's reorder window holds; this one runs the lookups of a
    /// group of 32 in stages, each fetching what the next one reads (index
    /// slots, then block headers, then runs), so their cache misses
    /// overlap. `EINVAL` if `out` is shorter than `addrs`.
    pub fn get_many<'g, A: AsRef<[u8]>>(
        &self,
        addrs: &[A],
        guard: &'g Guard,
        out: &mut [Option<Value<'g>>],
    ) -> Result<()> {
        self.lookup_many(addrs, guard, out, |hit| self.answer(hit, guard))
    }

    /// `get_many` with each value copied out as a `V`, as `get_as` gives
    /// it (all `None` if `V` is not `value_size` bytes). `EINVAL` if `out`
    /// is shorter than `addrs`.
    pub fn get_many_as<V: Pod, A: AsRef<[u8]>>(
        &self,
        addrs: &[A],
        guard: &Guard,
        out: &mut [Option<V>],
    ) -> Result<()> {
        if size_of::<V>() != self.value_size {
            return self.lookup_many(addrs, guard, out, |_: Hit| None);
        }
        self.lookup_many(addrs, guard, out, |hit| self.answer_as(hit, guard))
    }

    /// The staged lookups behind `get_many` and `get_many_as`: `answer`
    /// turns each hit into an output (an address of the wrong length
    /// gets `answer(Hit::NONE)`).
    #[inline(always)]
    fn lookup_many<A: AsRef<[u8]>, T>(
        &self,
        addrs: &[A],
        guard: &Guard,
        out: &mut [T],
        answer: impl Fn(Hit) -> T,
    ) -> Result<()> {
        if out.len() < addrs.len() {
            return Err(Error::invalid(format!(
                "{} addresses but room for {} answers",
                addrs.len(),
                out.len()
            )));
        }
        let one = |a: &[u8]| {
            answer(if a.len() == self.data_size {
                self.lookup(a, guard)
            } else {
                Hit::NONE
            })
        };
        let Some(direct) = self.direct.get() else {
            for (a, o) in addrs.iter().zip(out.iter_mut()) {
                *o = one(a.as_ref());
            }
            return Ok(());
        };
        let mut starts = [Err(Hit::NONE); GROUP];
        for (group, outs) in addrs.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
            if group.iter().any(|a| a.as_ref().len() != self.data_size) {
                for (a, o) in group.iter().zip(outs.iter_mut()) {
                    *o = one(a.as_ref());
                }
                continue;
            }
            let starts = &mut starts[..group.len()];
            // SAFETY: pinned by `guard`; every address has data_size >= 3
            // bytes (the index exists).
            unsafe { direct.start_group(group, starts) };
            for ((a, start), o) in group.iter().zip(starts.iter()).zip(outs.iter_mut()) {
                *o = answer(match *start {
                    Err(hit) => hit,
                    Ok(node) => self.walk(node, 2, a.as_ref(), guard),
                });
            }
        }
        Ok(())
    }

    /// `get`'s answer from where a lookup ended.
    #[inline(always)]
    fn answer<'g>(&self, hit: Hit, guard: &'g Guard) -> Option<Value<'g>> {
        (!hit.is_none()).then(|| self.value(hit.payload(), guard))
    }

    /// `get_as`'s answer from where a lookup ended (`V` is `value_size`
    /// bytes). Values of up to 4 bytes are made from the payload whether
    /// it matched or not, so the caller's test of the answer can be a
    /// conditional move instead of a branch.
    #[inline(always)]
    fn answer_as<V: Pod>(&self, hit: Hit, guard: &Guard) -> Option<V> {
        if size_of::<V>() <= 4 {
            let value = bytemuck::pod_read_unaligned(&hit.payload()[..size_of::<V>()]);
            (!hit.is_none()).then_some(value)
        } else {
            (!hit.is_none())
                .then(|| bytemuck::pod_read_unaligned(&self.value(hit.payload(), guard)))
        }
    }

    /// The value a payload stands for.
    #[inline(always)]
    fn value<'g>(&self, payload: [u8; 4], _guard: &'g Guard) -> Value<'g> {
        if self.inline_values {
            Value::Inline {
                bytes: payload,
                len: self.value_size as u8,
            }
        } else {
            // SAFETY: a route id reached under the guard stays readable
            // until a grace period after it is replaced.
            Value::Slot(unsafe { self.routes.value(u32::from_ne_bytes(payload)) })
        }
    }

    /// The value of the longest prefix matching `addr` (a full-length
    /// address of `data_size` bytes). Lock-free. An address of the wrong
    /// length matches nothing. To read values of up to 4 bytes in a loop,
    /// `get_as` is faster for random addresses (see there).
    // Always inlined: callers' loops then keep the trie's fields in
    // registers and overlap more lookups (`lpm-real`'s random IPv4 lookups
    // ran about 10% faster once the bench crate's call was inlined).
    #[inline(always)]
    pub fn get<'g>(&self, addr: &[u8], guard: &'g Guard) -> Option<Value<'g>> {
        if addr.len() != self.data_size {
            return None;
        }
        self.answer(self.lookup(addr, guard), guard)
    }

    /// The value of the longest prefix matching `addr`, copied out as a
    /// `V`: a plain-old-data type of the map's `value_size` bytes (`u32`,
    /// `[u8; 6]`, ...). `None` when nothing matches, when `addr` has the
    /// wrong length, or when `V` is not `value_size` bytes. Lock-free.
    ///
    /// ```
    /// use bpfmaps::lpm::LpmTrie;
    ///
    /// let routes = LpmTrie::new(4, 4, 1024)?;
    /// routes.insert(&[10, 0, 0, 0], 8, &7u32.to_ne_bytes(), 0)?;
    /// let guard = bpfmaps::pin();
    /// assert_eq!(routes.get_as::<u32>(&[10, 1, 2, 3], &guard), Some(7));
    /// assert_eq!(routes.get_as::<u32>(&[11, 1, 2, 3], &guard), None);
    /// assert_eq!(routes.get_as::<u64>(&[10, 1, 2, 3], &guard), None); // not 4 bytes
    /// # Ok::<(), bpfmaps::Error>(())
    /// ```
    ///
    /// Why beside `get`: for values of up to 4 bytes the answer is made
    /// from the leaf without branching on whether anything matched, so a
    /// caller's `if let Some(v) = trie.get_as(..)` over many addresses can
    /// compile to a conditional move. Through `get`'s `Value` it stays a
    /// branch, which mispredicts whenever matches and misses mix (random
    /// addresses) and throws away the lookups in flight behind it.
    #[inline(always)]
    pub fn get_as<V: Pod>(&self, addr: &[u8], guard: &Guard) -> Option<V> {
        if addr.len() != self.data_size || size_of::<V>() != self.value_size {
            return None;
        }
        self.answer_as(self.lookup(addr, guard), guard)
    }

    /// The longest prefix matching `addr`: its length and value.
    // Always inlined: callers' loops then keep the trie's fields in
    // registers and overlap more lookups (`lpm-real`'s random IPv4 lookups
    // ran about 10% faster once the bench crate's call was inlined).
    #[inline(always)]
    pub fn longest_match<'g>(&self, addr: &[u8], guard: &'g Guard) -> Option<(u32, Value<'g>)> {
        if addr.len() != self.data_size {
            return None;
        }
        let leaf: Leaf = self.lookup(addr, guard);
        (!leaf.is_none()).then(|| (leaf.prefixlen, self.value(leaf.payload, guard)))
    }

    /// The value of a prefix returned by a query, read under `guard`. (For
    /// values over 4 bytes, a `Found` kept past the guard it came from may
    /// name a recycled slot; the bytes are then those of another route.)
    pub fn value_of<'g>(&self, found: &Found, guard: &'g Guard) -> Value<'g> {
        self.value(found.payload, guard)
    }

    fn payload_of(&self, alloc: &mut RouteAlloc, value: &[u8], guard: &Guard) -> Result<[u8; 4]> {
        if self.inline_values {
            let mut payload = [0u8; 4];
            payload[..value.len()].copy_from_slice(value);
            return Ok(payload);
        }
        // With every slot live or in its grace period, push the grace
        // periods along (readers pin and unpin all the time, but one may
        // be descheduled while pinned) for a while before giving up with
        // EBUSY: only a reader pinned throughout keeps them back.
        let deadline = std::time::Instant::now() + Self::ROUTE_WAIT;
        loop {
            match self.routes.alloc(alloc, value) {
                Err(Error::Busy) if std::time::Instant::now() < deadline => {
                    guard.flush();
                    std::thread::yield_now();
                }
                r => return Ok(r?.to_ne_bytes()),
            }
        }
    }

    /// How long `insert` tries to reclaim route slots before `EBUSY`.
    const ROUTE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

    /// The nodes along `path` from the root with their positions, as far
    /// as the tree has them: up to the node at depth `path.len()`, or the
    /// last one before a missing child or a skip that leaves the path.
    fn along<'a>(&'a self, path: &'a [u8]) -> impl Iterator<Item = (&'a Node, Pos)> + 'a {
        std::iter::successors(Some((&self.root, Pos::ROOT)), move |&(node, pos)| {
            let b = *path.get(pos.depth)?;
            // SAFETY: writer (or pinned reader) walk.
            let child = unsafe { node.child(b) }?;
            let at = pos.child(b, child.skip);
            (at.depth <= path.len() && child.skip.matches(&path[pos.depth + 1..]))
                .then_some((child, at))
        })
    }

    /// The node at depth `path.len()` along `path`, if the tree has one.
    fn node_at<'a>(&'a self, path: &'a [u8]) -> Option<&'a Node> {
        self.along(path)
            .last()
            .filter(|(_, pos)| pos.depth == path.len())
            .map(|(node, _)| node)
    }

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
        let (buf, prefixlen) = self.masked(data, prefixlen)?;
        let data = &buf[..self.data_size];
        let guard = pin();
        let mut alloc = self.writer.lock();
        let (depth, idx) = position(data, prefixlen);
        let path = &data[..depth];
        // SAFETY: writer.
        let old = self
            .node_at(path)
            .and_then(|n| unsafe { n.data() }.prefix(idx));
        flag.check(old.is_some())?;
        if old.is_none() && self.len.load(Ordering::Relaxed) >= self.max_entries as usize {
            return Err(Error::Full);
        }
        let payload = self.payload_of(&mut alloc, value, &guard)?;
        let node = self.ensure_path(path, &guard);
        match old {
            Some(old) => {
                self.replace_payload(node, Pos::of(path), idx, prefixlen, payload);
                self.retire_payload(old, &guard);
            }
            None => {
                self.set_prefix(node, Pos::of(path), idx, Some(payload), &guard);
                self.len.fetch_add(1, Ordering::Relaxed);
                self.maybe_build_direct();
            }
        }
        Ok(())
    }

    /// Removes the exact prefix `data/prefixlen`, copying its value into
    /// `out` if given. `ENOENT` if it is not stored.
    pub fn remove(&self, data: &[u8], prefixlen: u32, out: Option<&mut [u8]>) -> Result<()> {
        if let Some(out) = &out {
            check_len("value", out.len(), self.value_size)?;
        }
        let (buf, prefixlen) = self.masked(data, prefixlen)?;
        let data = &buf[..self.data_size];
        let guard = pin();
        let _writer = self.writer.lock();
        let (depth, idx) = position(data, prefixlen);
        let node = self.node_at(&data[..depth]).ok_or(Error::NotFound)?;
        // SAFETY: writer.
        let payload = unsafe { node.data() }.prefix(idx).ok_or(Error::NotFound)?;
        if let Some(out) = out {
            out.copy_from_slice(&self.value(payload, &guard));
        }
        self.set_prefix(node, Pos::of(&data[..depth]), idx, None, &guard);
        self.prune(&data[..depth], &guard);
        self.retire_payload(payload, &guard);
        self.len.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Removes every prefix. The old tree is freed on the reaper thread
    /// after a grace period, so this returns at once.
    pub fn clear(&self) {
        let guard = pin();
        let _writer = self.writer.lock();
        let mut routes = Vec::new();
        if !self.inline_values {
            self.for_each_payload(&guard, |_, _, p| routes.push(u32::from_ne_bytes(p)));
        }
        let empty = DataBlock::empty(&self.arena, Leaf::NONE);
        let job = ClearJob {
            arena: Arc::clone(&self.arena),
            children: self.root.children.swap(ptr::null_mut(), Ordering::AcqRel),
            data: self.root.data.swap(empty.as_ptr(), Ordering::AcqRel),
            routes,
            store: Arc::clone(&self.routes),
        };
        self.mirror(&self.root, Pos::ROOT, None);
        self.len.store(0, Ordering::Relaxed);
        guard.defer(move || drop_in_background(job));
    }

    /// The node at depth `path.len()` along `path`, created if missing:
    /// below depth 2 a new node takes a compressed edge over every byte
    /// left (up to `Skip::MAX`), and an edge that skips past the wanted
    /// depth or away from the path is split.
    fn ensure_path(&self, path: &[u8], guard: &Guard) -> &Node {
        let (mut node, mut pos) = (&self.root, Pos::ROOT);
        while pos.depth < path.len() {
            let b = path[pos.depth];
            let rest = &path[pos.depth + 1..];
            // SAFETY: writer.
            (node, pos) = match unsafe { node.child(b) } {
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
    fn publish_children<'a>(
        &self,
        node: &'a Node,
        pos: Pos,
        b: u8,
        bits: Bits<4>,
        entries: &[Entry],
        guard: &Guard,
    ) -> Option<&'a ChildBlock> {
        let new = if entries.is_empty() {
            ptr::null_mut()
        } else {
            ChildBlock::alloc(&self.arena, bits, entries).as_ptr()
        };
        let old = node.children.swap(new, Ordering::AcqRel);
        self.mirror(node, pos, Some(b));
        self.retire_child_block(old, guard);
        // SAFETY: we are the writer: it lives until we replace it.
        unsafe { new.as_ref() }
    }

    /// Adds an empty child at `b` of `node` (at `pos`) whose edge skips
    /// `skip`.
    fn add_child<'a>(
        &self,
        node: &'a Node,
        pos: Pos,
        b: u8,
        skip: Skip,
        guard: &Guard,
    ) -> &'a Node {
        // SAFETY: writer.
        let inherit = unsafe { node.data() }.leaf(b);
        let data = DataBlock::empty(&self.arena, inherit);
        // SAFETY: writer.
        let (mut bits, mut entries) = match unsafe { node.children() } {
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
    fn split_child<'a>(
        &self,
        node: &'a Node,
        pos: Pos,
        b: u8,
        common: usize,
        guard: &Guard,
    ) -> &'a Node {
        // SAFETY: writer; the caller saw the child.
        let block = unsafe { node.children() }.expect("child exists");
        let at = block.bits.rank(b as usize);
        let mut entries = block.entries();
        let (c, d, skip) = entries[at];
        let mut bits = Bits::default();
        bits.set_raw(skip.byte(common) as usize);
        bits.fix_ranks();
        let below = ChildBlock::alloc(&self.arena, bits, &[(c, d, skip.tail(common + 1))]);
        // SAFETY: writer.
        let inherit = unsafe { node.data() }.leaf(b);
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
        // SAFETY: writer; the caller saw the child.
        let block = unsafe { parent.children() }.expect("child exists");
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
        let mut chain: Vec<_> = self.along(path).collect();
        while chain.len() >= 2 {
            let (node, _) = chain.pop().expect("len >= 2");
            let &(parent, ppos) = chain.last().expect("len >= 1");
            let b = path[ppos.depth];
            // SAFETY: writer.
            let (children, data) = unsafe { (node.children(), node.data()) };
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
        // SAFETY: writer; the caller saw the child and its one child.
        let block = unsafe { parent.children() }.expect("child exists");
        let at = block.bits.rank(b as usize);
        let mut entries = block.entries();
        let (mid_children, mid_data, mid_skip) = entries[at];
        // SAFETY: as above.
        let only = unsafe { &*mid_children };
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
        // SAFETY: writer.
        let old = unsafe { node.data() };
        let new = old.with_prefix(&self.arena, pos.depth, idx, payload);
        let (_, lo, hi) = index_range(idx);
        self.publish_data(node, pos, new, guard);
        self.push_down(node, pos, lo, hi, guard);
    }

    /// Gives the stored prefix at `idx` of `node` (at `pos`; the prefix is
    /// `prefixlen` bits long) a new payload in place, without rebuilding a
    /// block: one word store into each of the node's runs it wins (or its
    /// hidden slot), and into the defaults and runs of the children that
    /// inherit it; each changed node then refills the direct index, as
    /// after any store into it. A lookup reads one of those words, whole:
    /// the old payload or the new one; once this returns, only the new.
    fn replace_payload(&self, node: &Node, pos: Pos, idx: usize, prefixlen: u32, payload: [u8; 4]) {
        // SAFETY: writer.
        let data = unsafe { node.data() };
        data.set_prefix_payload(idx, payload);
        self.mirror(node, pos, None);
        let (_, lo, hi) = index_range(idx);
        self.inherit_payload(node, pos, lo, hi, prefixlen, payload);
    }

    /// The new payload of a `prefixlen`-bit prefix into the children of
    /// `node` (at `pos`) in bytes `lo..hi` that inherit it, and on down. A
    /// child whose default is another prefix inherits a longer one, which
    /// hides this one in its whole subtree.
    fn inherit_payload(
        &self,
        node: &Node,
        pos: Pos,
        lo: usize,
        hi: usize,
        prefixlen: u32,
        payload: [u8; 4],
    ) {
        // SAFETY: writer.
        let Some(children) = (unsafe { node.children() }) else {
            return;
        };
        for b in (lo..hi).filter(|&b| children.bits.get(b)) {
            // SAFETY: the bit is set.
            let child = unsafe { children.node(children.bits.rank(b)) };
            // SAFETY: writer.
            let data = unsafe { child.data() };
            if data.default.load().prefixlen != prefixlen {
                continue;
            }
            data.set_inherited_payload(payload);
            let at = pos.child(b as u8, child.skip);
            self.mirror(child, at, None);
            self.inherit_payload(child, at, 0, 256, prefixlen, payload);
        }
    }

    /// Children in bytes `lo..hi` of `node` (at `pos`) re-inherit their
    /// default from `node`'s current data; changed ones are rebuilt,
    /// recursively.
    fn push_down(&self, node: &Node, pos: Pos, lo: usize, hi: usize, guard: &Guard) {
        // SAFETY: writer.
        let Some(block) = (unsafe { node.children() }) else {
            return;
        };
        // SAFETY: writer.
        let data = unsafe { node.data() };
        for b in lo..hi {
            if !block.bits.get(b) {
                continue;
            }
            // SAFETY: the bit is set.
            let child = unsafe { block.node(block.bits.rank(b)) };
            let inherit = data.leaf(b as u8);
            // SAFETY: writer.
            let cd = unsafe { child.data() };
            if cd.default.load() != inherit {
                let at = pos.child(b as u8, child.skip);
                let rebuilt = DataBlock::build(&self.arena, at.depth, &cd.prefixes(), inherit);
                self.publish_data(child, at, rebuilt, guard);
                self.push_down(child, at, 0, 256, guard);
            }
        }
    }

    fn publish_data(&self, node: &Node, pos: Pos, new: NonNull<DataBlock>, guard: &Guard) {
        let old = node.data.swap(new.as_ptr(), Ordering::AcqRel);
        self.mirror(node, pos, None);
        self.retire_data(old, guard);
    }

    fn retire_data(&self, old: *mut DataBlock, guard: &Guard) {
        let (arena, old) = (Arc::clone(&self.arena), Owned(old));
        // SAFETY: unreachable for new readers; freed after the grace period.
        guard.defer(move || unsafe { DataBlock::free(&arena, { old }.0) });
    }

    fn retire_child_block(&self, old: *mut ChildBlock, guard: &Guard) {
        if old.is_null() {
            return;
        }
        // Frees the block only: its nodes' blocks live on in the replacement.
        let (arena, old) = (Arc::clone(&self.arena), Owned(old));
        // SAFETY: as in retire_data.
        guard.defer(move || unsafe { ChildBlock::free(&arena, { old }.0) });
    }

    /// A replaced payload: its route slot (if any) is reused after the
    /// grace period.
    fn retire_payload(&self, payload: [u8; 4], guard: &Guard) {
        if !self.inline_values {
            let store = Arc::clone(&self.routes);
            guard.defer(move || store.release(u32::from_ne_bytes(payload)));
        }
    }

    /// Every stored prefix containing `data/prefixlen` (itself included),
    /// shortest first.
    pub fn covering(&self, data: &[u8], prefixlen: u32, _guard: &Guard) -> Result<Vec<Found>> {
        let (buf, prefixlen) = self.masked(data, prefixlen)?;
        let data = &buf[..self.data_size];
        let mut out = Vec::new();
        let mut node = &self.root;
        let mut depth = 0;
        loop {
            // SAFETY: pinned.
            let nd = unsafe { node.data() };
            for l in u32::from(depth > 0)..=8 {
                let plen = 8 * depth as u32 + l;
                if plen > prefixlen {
                    break;
                }
                if let Some(payload) = nd.prefix(prefix_index(l, data[depth])) {
                    let mut d = data.to_vec();
                    mask_host_bits(&mut d, plen);
                    out.push(Found {
                        data: d,
                        prefixlen: plen,
                        payload,
                    });
                }
            }
            if prefixlen <= 8 * (depth as u32 + 1) {
                return Ok(out);
            }
            // SAFETY: pinned.
            let Some(child) = (unsafe { node.child(data[depth]) }) else {
                return Ok(out);
            };
            // The child's prefixes are all longer than its depth's bytes.
            let below = depth + 1 + child.skip.len();
            if prefixlen <= 8 * below as u32 || !child.skip.matches(&data[depth + 1..]) {
                return Ok(out);
            }
            (node, depth) = (child, below);
        }
    }

    /// Every stored prefix inside `data/prefixlen` (itself included), in
    /// prefix order (address, then length).
    pub fn covered(&self, data: &[u8], prefixlen: u32, _guard: &Guard) -> Result<Vec<Found>> {
        let (buf, prefixlen) = self.masked(data, prefixlen)?;
        let data = &buf[..self.data_size];
        let (depth, idx) = position(data, prefixlen);
        let mut out = Vec::new();
        let mut push = |d: &[u8], l, r| {
            out.push(Found {
                data: d.to_vec(),
                prefixlen: l,
                payload: r,
            })
        };
        let path = &data[..depth];
        let (node, pos) = self.along(path).last().expect("the root");
        if pos.depth == depth {
            self.walk_pre(node, &mut path.to_vec(), idx, &mut push);
        } else if pos.depth < depth {
            // A compressed edge may skip past `depth`: then the whole
            // subtree below it is inside the prefix, or none of it is.
            // SAFETY: pinned.
            if let Some(child) = unsafe { node.child(path[pos.depth]) } {
                let mut below = path[..=pos.depth].to_vec();
                below.extend(child.skip.bytes());
                if below.len() > depth && prefix_contains(data, prefixlen, &below) {
                    self.walk_pre(child, &mut below, 1, &mut push);
                }
            }
        }
        Ok(out)
    }

    /// Calls `f(data, prefixlen, value)` for every prefix in prefix order
    /// (address ascending, then length ascending). Weakly consistent under
    /// concurrent updates.
    pub fn for_each(&self, guard: &Guard, mut f: impl FnMut(&[u8], u32, &[u8])) {
        self.for_each_payload(guard, |d, l, p| f(d, l, &self.value(p, guard)));
    }

    fn for_each_payload(&self, _guard: &Guard, mut f: impl FnMut(&[u8], u32, [u8; 4])) {
        let mut path = Vec::with_capacity(self.data_size);
        self.walk_pre(&self.root, &mut path, 1, &mut f);
    }

    /// Pre-order walk of the prefixes under index `idx` of `node`.
    fn walk_pre(&self, node: &Node, path: &mut Vec<u8>, idx: usize, f: Visit<'_>) {
        // SAFETY: pinned.
        let (prefixes, children) = unsafe { (Box::new(node.data().prefixes()), node.children()) };
        self.walk_pre_in(&prefixes, children, path, idx, f);
    }

    /// `walk_pre` inside one node, whose prefixes and child block were
    /// read once, on entry.
    fn walk_pre_in(
        &self,
        prefixes: &Prefixes,
        children: Option<&ChildBlock>,
        path: &mut Vec<u8>,
        idx: usize,
        f: Visit<'_>,
    ) {
        if subtree_empty(prefixes, children, idx) {
            return;
        }
        let (l, lo, _) = index_range(idx);
        if let Some(payload) = prefixes.get(idx) {
            self.emit(path, lo as u8, l, payload, f);
        }
        if l < 8 {
            self.walk_pre_in(prefixes, children, path, 2 * idx, f);
            self.walk_pre_in(prefixes, children, path, 2 * idx + 1, f);
        } else if let Some(child) = children.filter(|c| c.bits.get(lo)) {
            // SAFETY: bit set.
            let child = unsafe { child.node(child.bits.rank(lo)) };
            let depth = path.len();
            path.push(lo as u8);
            path.extend(child.skip.bytes());
            self.walk_pre(child, path, 1, f);
            path.truncate(depth);
        }
    }

    fn emit(&self, path: &[u8], byte: u8, l: u32, payload: [u8; 4], f: Visit<'_>) {
        let mut data = [0u8; key::DATA_SIZE_MAX];
        data[..path.len()].copy_from_slice(path);
        if path.len() < self.data_size {
            data[path.len()] = byte;
        }
        f(&data[..self.data_size], 8 * path.len() as u32 + l, payload);
    }

    /// The first prefix after `after` in post-order (children before their
    /// parents: ascending last address, then longer first); the first of all
    /// for `None`.
    pub fn next_after(&self, after: Option<(&[u8], u32)>, _guard: &Guard) -> Result<Option<Found>> {
        let bound = match after {
            Some((data, len)) => {
                let (mut buf, len) = self.masked(data, len)?;
                set_host_bits(&mut buf[..self.data_size], len);
                Some((buf, len))
            }
            None => None,
        };
        let bound = bound.as_ref().map(|(b, l)| (&b[..self.data_size], *l));
        let mut path = Vec::with_capacity(self.data_size);
        let mut found = None;
        self.next_post(&self.root, &mut path, 1, bound, &mut found);
        Ok(found)
    }

    /// Post-order search for the first prefix beyond `bound` under `idx`.
    /// Returns true once found.
    fn next_post(
        &self,
        node: &Node,
        path: &mut Vec<u8>,
        idx: usize,
        bound: Option<(&[u8], u32)>,
        found: &mut Option<Found>,
    ) -> bool {
        // SAFETY: pinned.
        let (prefixes, children) = unsafe { (Box::new(node.data().prefixes()), node.children()) };
        self.next_post_in(&prefixes, children, path, idx, bound, found)
    }

    /// `next_post` inside one node, whose prefixes and child block were
    /// read once, on entry.
    fn next_post_in(
        &self,
        prefixes: &Prefixes,
        children: Option<&ChildBlock>,
        path: &mut Vec<u8>,
        idx: usize,
        bound: Option<(&[u8], u32)>,
        found: &mut Option<Found>,
    ) -> bool {
        if subtree_empty(prefixes, children, idx) {
            return false;
        }
        let (l, lo, hi) = index_range(idx);
        let plen = 8 * path.len() as u32 + l;
        // Every prefix under idx is at most (last address of idx, plen) in
        // post-order: skip the subtree if that is not beyond the bound.
        let beyond = |bound: Option<(&[u8], u32)>| match bound {
            None => true,
            Some((last, len)) => match cmp_last(path, (hi - 1) as u8, last) {
                Cmp::Less => false,
                Cmp::Greater => true,
                Cmp::Equal => plen < len,
            },
        };
        if !beyond(bound) {
            return false;
        }
        if l < 8 {
            if self.next_post_in(prefixes, children, path, 2 * idx, bound, found)
                || self.next_post_in(prefixes, children, path, 2 * idx + 1, bound, found)
            {
                return true;
            }
        } else if let Some(child) = children.filter(|c| c.bits.get(lo)) {
            // SAFETY: bit set.
            let child = unsafe { child.node(child.bits.rank(lo)) };
            let depth = path.len();
            path.push(lo as u8);
            path.extend(child.skip.bytes());
            let hit = self.next_post(child, path, 1, bound, found);
            path.truncate(depth);
            if hit {
                return true;
            }
        }
        if let Some(payload) = prefixes.get(idx) {
            self.emit(path, lo as u8, l, payload, &mut |d, l, p| {
                *found = Some(Found {
                    data: d.to_vec(),
                    prefixlen: l,
                    payload: p,
                })
            });
            return true;
        }
        false
    }

    fn check_key_data<'k>(&self, key: &'k [u8]) -> Result<KeyRef<'k>> {
        KeyRef::parse(key, self.data_size)
    }

    /// Whether the direct index, if any, mirrors the tree exactly (for
    /// tests).
    #[cfg(test)]
    pub(crate) fn direct_index_matches_tree(&self) -> bool {
        let _writer = self.writer.lock();
        self.direct.get().is_none_or(|d| d.matches_tree(&self.root))
    }

    /// The sum of `f` over every node, the root included (for tests).
    #[cfg(test)]
    fn sum_over_nodes(&self, f: impl Fn(&Node) -> usize + Copy) -> usize {
        fn sum(node: &Node, f: impl Fn(&Node) -> usize + Copy) -> usize {
            // SAFETY: tests call this with no writer running.
            f(node)
                + unsafe { node.children() }.map_or(0, |c| {
                    // SAFETY: i < len.
                    (0..c.len()).map(|i| sum(unsafe { c.node(i) }, f)).sum()
                })
        }
        let _writer = self.writer.lock();
        sum(&self.root, f)
    }

    /// Number of nodes, the root included (for tests of the trie's shape).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.sum_over_nodes(|_| 1)
    }

    /// Number of hidden prefixes over all nodes (for tests).
    #[cfg(test)]
    pub(crate) fn hidden_count(&self) -> usize {
        // SAFETY: no writer runs (see `sum_over_nodes`).
        self.sum_over_nodes(|node| unsafe { node.data() }.hidden_len())
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

/// A visitor of (prefix data, prefix length, payload).
type Visit<'a> = &'a mut dyn FnMut(&[u8], u32, [u8; 4]);

/// Sets every bit from `prefixlen` on: the last address of the prefix.
fn set_host_bits(data: &mut [u8], prefixlen: u32) {
    let len = prefixlen as usize;
    let full = len / 8;
    if full < data.len() {
        data[full] |= 0xffu8.checked_shr((len % 8) as u32).unwrap_or(0);
        data[full + 1..].fill(0xff);
    }
}

/// Compares the last address of the range `path ++ [last_byte] ++ 0xff..`
/// with `last` (a full-length address).
fn cmp_last(path: &[u8], last_byte: u8, last: &[u8]) -> Cmp {
    let depth = path.len();
    path.cmp(&last[..depth]).then_with(|| {
        if depth == last.len() {
            return Cmp::Equal;
        }
        last_byte.cmp(&last[depth]).then_with(|| {
            if last[depth + 1..].iter().all(|&b| b == 0xff) {
                Cmp::Equal
            } else {
                Cmp::Greater
            }
        })
    })
}

/// Whether no prefix and no child lies under index `idx` of a node.
fn subtree_empty(prefixes: &Prefixes, children: Option<&ChildBlock>, idx: usize) -> bool {
    let (l, lo, hi) = index_range(idx);
    if children.is_some_and(|c| c.bits.any_in(lo, hi)) {
        return false;
    }
    (l..=8).all(|level| {
        let shift = level - l;
        !prefixes.bits.any_in(idx << shift, (idx + 1) << shift)
    })
}

/// The kernel's `trie_map_ops`, plus lookup-and-delete.
impl MapOps for LpmTrie {
    const CAPS: Caps = Caps::KEYED.union(Caps::LOOKUP_AND_DELETE);

    fn map_info(&self) -> MapInfo {
        let (ds, vs) = (self.data_size, self.value_size);
        key::info(MapType::LPM_TRIE, ds, vs, self.max_entries, self.map_flags)
    }

    fn map_len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn map_mem_usage(&self) -> usize {
        LpmTrie::memory_usage(self)
    }

    /// Longest match for the key's data among prefixes no longer than the
    /// key's `prefixlen` (as the kernel); full-length keys take the fast path.
    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
        // The kernel's lookup finds nothing, rather than failing, for a
        // prefix length over the data's bits.
        let k = self.check_key_data(key).map_err(|_| Error::NotFound)?;
        if k.prefixlen as usize == 8 * self.data_size {
            value.copy_from_slice(&self.get(k.data, guard).ok_or(Error::NotFound)?);
        } else {
            let best = self
                .covering(k.data, k.prefixlen, guard)?
                .pop()
                .ok_or(Error::NotFound)?;
            value.copy_from_slice(&self.value_of(&best, guard));
        }
        Ok(())
    }

    fn map_update_elem(&self, key: &[u8], value: &[u8], flag: UpdateFlag, _: &Guard) -> Result<()> {
        let k = self.check_key_data(key)?;
        self.insert(k.data, k.prefixlen, value, flag.bits())
    }

    fn map_delete_elem(&self, key: &[u8], _: &Guard) -> Result<()> {
        let k = self.check_key_data(key)?;
        self.remove(k.data, k.prefixlen, None)
    }

    fn map_lookup_and_delete_elem(&self, key: &[u8], value: &mut [u8], _: &Guard) -> Result<()> {
        let k = self.check_key_data(key)?;
        self.remove(k.data, k.prefixlen, Some(value))
    }

    /// Post-order, like the kernel (a prefix comes after every prefix it
    /// contains, so deleting each key as it is returned is safe). Unlike
    /// the kernel, a key that is not stored does not restart the walk: the
    /// next stored prefix after where it would be is returned, so an
    /// iteration survives concurrent deletes of its cursor.
    fn map_get_next_key(
        &self,
        key: Option<&[u8]>,
        next: &mut [u8],
        guard: &Guard,
    ) -> Result<usize> {
        let after = match key {
            Some(key) => {
                let k = self.check_key_data(key)?;
                Some((k.data, k.prefixlen))
            }
            None => None,
        };
        let found = self.next_after(after, guard)?.ok_or(Error::NotFound)?;
        key::write_key(next, found.prefixlen, &found.data);
        Ok(next.len())
    }
}

/// Whether `addr` (at least `prefixlen` bits) lies inside `data/prefixlen`.
fn prefix_contains(data: &[u8], prefixlen: u32, addr: &[u8]) -> bool {
    let mut a = addr.to_vec();
    mask_host_bits(&mut a, prefixlen);
    let n = a.len().min(data.len());
    a[..n] == data[..n]
}
