//! `KernelLpmTrie`: a faithful userspace port of the kernel's
//! `kernel/bpf/lpm_trie.c`, the baseline next to the fast trie and a second
//! oracle for its tests.
//!
//! Ported from Linux 6.15 (Daniel Mack and David Herrmann, 2016-17; the
//! update-flag, full-map and `get_next_key` exact-match fixes by Hou Tao,
//! 2024). Function names follow the C ones (`trie_lookup_elem` is
//! `KernelLpmTrie::lookup_elem`, and so on) so the two read side by side.
//! Faithfulness matters more than speed here: the algorithm, the node shape
//! and the allocation pattern (one allocation per node) are the kernel's.
//!
//! # Terms
//! - *prefix*: `prefixlen` leading bits of `data` (most significant bit of
//!   `data[0]` first). `max_prefixlen = 8 * data_size`.
//! - *node*: one binary trie node holding one prefix. A *real* node carries
//!   a value; an *intermediate* node (`LPM_TREE_NODE_FLAG_IM`) only marks
//!   where two subtrees diverge and is never returned by a lookup.
//! - *slot*: the pointer that leads to a node (the root, or a parent's
//!   `child[0]`/`child[1]`).
//! - *matchlen*: the number of leading bits a node and a key share, at most
//!   `min(node.prefixlen, key.prefixlen)` (`longest_prefix_match`).
//!
//! # Node layout
//! One allocation per node (the kernel kmalloc'd each until 6.14, and draws
//! each from a `bpf_mem_alloc` cache since):
//!
//! ```text
//!  0          8          16          20        24               24+data_size
//!  +----------+----------+-----------+---------+----------------+-------------------+
//!  | child[0] | child[1] | prefixlen |  flags  | data[data_size]| value[value_size] |
//!  |   8 B    |   8 B    |    4 B    |   4 B   |                | (real nodes only) |
//!  +----------+----------+-----------+---------+----------------+-------------------+
//!  flags: bit 0         LPM_TREE_NODE_FLAG_IM
//!         bits 8..=31   tail length (data + value bytes), fixed at allocation
//!  allocation: round_up(24 + tail, 8) bytes, 8-aligned
//! ```
//!
//! The 24-byte header is the kernel's (since 6.14, when `rcu_head` left the
//! node). The tail length rides in the flags word because crossbeam's
//! `Pointable` must rebuild a node from a thin pointer with no map at hand;
//! the kernel knows it from the map. Intermediate nodes are allocated
//! without value bytes, as `lpm_trie_node_alloc(trie, NULL)` did with
//! kmalloc. Data is stored as given, host bits included (the kernel
//! `memcpy`s the whole key): they never take part in a match, but
//! `get_next_key` hands them back.
//!
//! The kernel's own example (192.168.0.0/16 = 1, 192.168.0.0/24 = 2,
//! 192.168.128.0/24 = 3, 192.168.1.0/24 = 5):
//!
//! ```text
//!                 192.168.0.0/16 (1)
//!                 /               \
//!       192.168.0.0/23 (IM)     192.168.128.0/24 (3)
//!         /          \
//!  192.168.0.0/24 (2)  192.168.1.0/24 (5)
//! ```
//!
//! # Invariants
//! 1. A child's `prefixlen` is larger than its parent's; `child[b]` of `n`
//!    agrees with `n` on its first `n.prefixlen` bits and has bit
//!    `n.prefixlen` equal to `b`.
//! 2. A reachable intermediate node has exactly two children.
//! 3. `n_entries` counts the reachable real nodes and never exceeds
//!    `max_entries`.
//! 4. A published node is never written except for one thing: a delete
//!    that finds two children sets the IM flag in place. `prefixlen`, data
//!    and value are immutable; an update builds a new node and swaps it in.
//! 5. A node unlinked by a writer keeps its child pointers unchanged and is
//!    freed only after an epoch grace period, so a reader standing on it
//!    finishes its walk on a consistent old path.
//!
//! # Concurrency
//! As the kernel: readers (`lookup`, `get_next_key`) are RCU readers, here
//! lock-free under a crossbeam-epoch guard; writers (`update`, `delete`)
//! take the one map-wide lock (`trie->lock`, here a `parking_lot::Mutex`)
//! and publish with release stores (`rcu_assign_pointer`) that pair with
//! the readers' acquire loads (`rcu_dereference`); unlinked nodes are
//! retired with `Guard::defer_destroy` (`bpf_mem_cache_free_rcu`). A lookup
//! racing a delete of the two-children kind may still return the value it
//! read before the IM flag was set, as in the kernel.
//!
//! # Iteration
//! `get_next_key` walks the trie in post-order, children before parents,
//! so more specific prefixes come before the prefixes that contain them;
//! disjoint prefixes come in address order. No key gives the leftmost real
//! node; so does a key that is not in the trie (or whose `prefixlen`
//! exceeds `max_prefixlen`): iteration silently restarts. After the last
//! node it is `ENOENT`.
//!
//! # Complexity
//! Every operation visits at most `max_prefixlen + 1` nodes and compares up
//! to `data_size` bytes at each; `get_next_key` allocates its path stack
//! (`max_prefixlen + 1` pointers) per call, as the kernel does. Dropping
//! the map frees node by node, restarting from the root after each free
//! (`trie_free`), synchronously.
//!
//! # Where this port differs from the kernel
//! - A full map answers [`Error::Full`] (`E2BIG`); the kernel returns
//!   `ENOSPC`, which `Error` has no variant for.
//! - `lookup_and_delete` is [`Error::Unsupported`] (`EOPNOTSUPP`); the
//!   kernel's syscall answers `ENOTSUPP` (524) for this map type.
//! - Its family accepts flags 0 as well as
//!   `BPF_F_NO_PREALLOC`; the kernel insists on `BPF_F_NO_PREALLOC`.
//! - Allocation failure aborts (as `Box` does) instead of `ENOMEM`; the
//!   lock cannot fail (6.15's `rqspinlock` may return `EDEADLK`/`ETIMEDOUT`).
//! - [`Map::memory_usage`](crate::Map::memory_usage) is the sum of the
//!   live node allocations (intermediate nodes included); the kernel's
//!   `trie_mem_usage` is `n_entries * (24 + data_size + value_size)`, see
//!   [`KernelLpmTrie::kernel_mem_usage`].
//!
//! # Example
//! ```
//! use bpfmaps::lpm::KernelLpmTrie;
//! use bpfmaps::lpm::key::encode_key;
//! use bpfmaps::{Map, BPF_ANY};
//!
//! let trie = KernelLpmTrie::new(4, 8, 100).unwrap();
//! trie.update(&encode_key(16, &[192, 168, 0, 0]), &1u64.to_ne_bytes(), BPF_ANY).unwrap();
//! trie.insert_data(&[192, 168, 1, 0], 24, &2u64.to_ne_bytes(), BPF_ANY).unwrap();
//!
//! let guard = bpfmaps::pin();
//! assert_eq!(trie.lookup_data(&[192, 168, 1, 7], &guard), Some(&2u64.to_ne_bytes()[..]));
//! assert_eq!(trie.lookup_data(&[192, 168, 9, 9], &guard), Some(&1u64.to_ne_bytes()[..]));
//! assert_eq!(trie.lookup_data(&[10, 0, 0, 1], &guard), None);
//!
//! // Post-order: the /24 before the /16 that contains it.
//! let mut key = [0u8; 8];
//! trie.get_next_key(None, &mut key).unwrap();
//! assert_eq!(key, encode_key(24, &[192, 168, 1, 0])[..]);
//! ```

use std::alloc::{self, Layout};
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crossbeam_epoch::{self as epoch, Atomic, Owned, Pointable, Shared};
use parking_lot::Mutex;

use super::key::{self, KEY_HEADER, KeyRef};
use crate::core::contract::{Caps, MapInfo, MapOps, MapSpec, MapType};
use crate::core::error::{Error, Result, check_len};
use crate::core::family::{Family, KeyKind};
use crate::core::flags::{BPF_F_NO_PREALLOC, UpdateFlag};
use crate::core::reclaim::{Guard, pin};

impl MapType {
    /// The port of the kernel's LPM trie: `BPF_MAP_TYPE_LPM_TRIE`'s
    /// semantics and algorithm, under a type number of bpfmaps' own so
    /// both tries can be created side by side.
    pub const KERNEL_LPM_TRIE: MapType = MapType(MapType::PRIVATE);
}

/// The kernel LPM port, for the registry: as [`LPM_TRIE_FAMILY`]
/// (`trie_alloc`'s checks).
///
/// [`LPM_TRIE_FAMILY`]: super::trie::LPM_TRIE_FAMILY
pub const KERNEL_LPM_TRIE_FAMILY: Family = Family {
    map_type: MapType::KERNEL_LPM_TRIE,
    name: "kernel_lpm_trie",
    map_flags: BPF_F_NO_PREALLOC,
    map_extra: 0,
    key_size: key::KEY_SIZE,
    value_size: key::VALUE_SIZE,
    keys: KeyKind::LpmPrefix,
    sample_layout: None,
    build: |spec| Ok(Box::new(KernelLpmTrie::from_spec(spec)?)),
};

/// `LPM_TREE_NODE_FLAG_IM`: the node is intermediate (no value).
const LPM_TREE_NODE_FLAG_IM: u32 = 1 << 0;
/// Low bits of `flags` that hold node flags; the rest hold the tail length.
const FLAG_BITS: u32 = 8;
/// Mask of the node-flag bits.
const FLAG_MASK: u32 = (1 << FLAG_BITS) - 1;
/// Where the tail length starts in `flags`.
const TAIL_SHIFT: u32 = FLAG_BITS;
/// Largest tail (data + value bytes) the flags word can record.
const TAIL_MAX: usize = (u32::MAX >> TAIL_SHIFT) as usize;

/// The fixed part of a node: `struct lpm_trie_node` without `data[]`.
#[repr(C)]
struct NodeHead {
    child: [Atomic<Node>; 2],
    prefixlen: u32,
    /// Node flags in the low [`FLAG_BITS`] (only the IM bit changes after
    /// publication, set by a delete under the lock), the tail length above.
    flags: AtomicU32,
}

/// Size of the header; data starts right after it.
const HEAD_SIZE: usize = size_of::<NodeHead>();
const _: () = assert!(HEAD_SIZE == 2 * size_of::<usize>() + 8);
const _: () = assert!(HEAD_SIZE.is_multiple_of(align_of::<NodeHead>()));
const _: () = assert!(key::DATA_SIZE_MAX + key::VALUE_SIZE_MAX <= TAIL_MAX);

/// A trie node: header, then `data_size` data bytes, then (real nodes)
/// `value_size` value bytes. A dynamically sized type, so one allocation
/// holds it all; built and freed through its [`Pointable`] impl.
#[repr(C)]
struct Node {
    head: NodeHead,
    tail: [u8],
}

/// What [`Pointable::init`] needs to allocate a node.
struct NodeInit {
    prefixlen: u32,
    flags: u32,
    tail_len: usize,
}

/// The allocation layout of a node with `tail_len` tail bytes.
fn node_layout(tail_len: usize) -> Layout {
    Layout::from_size_align(HEAD_SIZE + tail_len, align_of::<NodeHead>())
        .expect("node sizes are bounded by TAIL_MAX")
        .pad_to_align()
}

impl Node {
    /// Rebuilds the fat pointer to the node at address `addr`.
    ///
    /// # Safety
    /// `addr` came from [`Node::init`](Pointable::init) and the node has not
    /// been freed.
    unsafe fn fat(addr: usize) -> *mut Node {
        // SAFETY: forwarded from the caller.
        let tail_len = unsafe { Node::tail_len(addr) };
        let head = ptr::with_exposed_provenance_mut::<u8>(addr);
        ptr::slice_from_raw_parts_mut(head, tail_len) as *mut Node
    }

    /// The tail length recorded in the flags of the node at `addr`.
    ///
    /// # Safety
    /// As [`Node::fat`].
    unsafe fn tail_len(addr: usize) -> usize {
        let head = ptr::with_exposed_provenance::<NodeHead>(addr);
        // SAFETY: the caller guarantees a live node, whose header `init`
        // wrote; `flags` is atomic, so this read races with no writer.
        let flags = unsafe { (*head).flags.load(Ordering::Relaxed) };
        (flags >> TAIL_SHIFT) as usize
    }

    #[inline]
    fn prefixlen(&self) -> u32 {
        self.head.prefixlen
    }

    /// Acquire, pairing with `set_im`: a reader that sees the flag sees
    /// the two children the node had when it was set, so it never finds an
    /// intermediate node without children (invariant 2; an intermediate
    /// node's child slots never go back to null).
    #[inline]
    fn is_im(&self) -> bool {
        self.head.flags.load(Ordering::Acquire) & LPM_TREE_NODE_FLAG_IM != 0
    }

    /// Sets the IM flag in place (a delete that finds two children). Only
    /// writers call this, holding the lock, so a load and a store suffice,
    /// as the kernel's plain `flags |= IM`. Release, not the kernel's plain
    /// store: with a relaxed flag a reader could see the flag yet read a
    /// child slot as it was before that child was linked (null), and
    /// `find_leftmost` would end without a node. Miri failed
    /// `kernel_lpm_multi_thread` once with that symptom (not reproduced
    /// since, docs/testing.md). Whether the kernel's own barriers rule it
    /// out there was not examined.
    fn set_im(&self) {
        let flags = self.head.flags.load(Ordering::Relaxed);
        self.head
            .flags
            .store(flags | LPM_TREE_NODE_FLAG_IM, Ordering::Release);
    }

    #[inline]
    fn data(&self, data_size: usize) -> &[u8] {
        &self.tail[..data_size]
    }

    /// The value bytes (empty for a node allocated as intermediate).
    #[inline]
    fn value(&self, data_size: usize) -> &[u8] {
        &self.tail[data_size..]
    }

    /// Bytes this node's allocation takes.
    fn alloc_size(&self) -> usize {
        node_layout(self.tail.len()).size()
    }
}

impl Pointable for Node {
    const ALIGN: usize = align_of::<NodeHead>();

    type Init = NodeInit;

    unsafe fn init(init: NodeInit) -> usize {
        assert!(init.tail_len <= TAIL_MAX, "node tail too large");
        debug_assert_eq!(init.flags & !FLAG_MASK, 0);
        let layout = node_layout(init.tail_len);
        // SAFETY: the layout is at least HEAD_SIZE > 0 bytes.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        if p.is_null() {
            alloc::handle_alloc_error(layout);
        }
        let head = NodeHead {
            child: [Atomic::null(), Atomic::null()],
            prefixlen: init.prefixlen,
            flags: AtomicU32::new(init.flags | ((init.tail_len as u32) << TAIL_SHIFT)),
        };
        // SAFETY: `p` is a fresh allocation, aligned for `NodeHead` and at
        // least HEAD_SIZE bytes long; the tail is zeroed, hence initialised.
        unsafe { p.cast::<NodeHead>().write(head) };
        p.expose_provenance()
    }

    unsafe fn deref<'a>(ptr: usize) -> &'a Node {
        // SAFETY: the caller guarantees a live node (Pointable contract).
        unsafe { &*Node::fat(ptr) }
    }

    unsafe fn deref_mut<'a>(ptr: usize) -> &'a mut Node {
        // SAFETY: the caller guarantees a live node, not aliased.
        unsafe { &mut *Node::fat(ptr) }
    }

    unsafe fn drop(ptr: usize) {
        // SAFETY: the caller guarantees a live node that nobody else uses.
        let layout = node_layout(unsafe { Node::tail_len(ptr) });
        // SAFETY: allocated by `init` with this same layout; the header has
        // no drop glue (`Atomic` does not own what it points to).
        unsafe { alloc::dealloc(ptr::with_exposed_provenance_mut(ptr), layout) };
    }
}

/// `__longest_prefix_match()`: how many leading bits `node` and `key`
/// share, at most `min(node_prefixlen, key_prefixlen)`.
///
/// The kernel's word loop: on 64-bit targets the first 8 bytes as one
/// big-endian `u64`, then 4-byte words, then a 2-byte and a 1-byte step;
/// `N - fls(diff)` is `diff.leading_zeros()`. Both slices hold at least
/// `data_size` bytes.
#[inline(always)]
pub(super) fn longest_prefix_match_bytes(
    data_size: usize,
    node: &[u8],
    node_prefixlen: u32,
    key: &[u8],
    key_prefixlen: u32,
) -> u32 {
    let limit = node_prefixlen.min(key_prefixlen);
    let (a, b) = (&node[..data_size], &key[..data_size]);
    let mut prefixlen = 0u32;
    let mut i = 0usize;

    #[cfg(target_pointer_width = "64")]
    if data_size >= 8 {
        let diff = u64::from_be_bytes(a[..8].try_into().expect("8 bytes"))
            ^ u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
        prefixlen = diff.leading_zeros();
        if prefixlen >= limit {
            return limit;
        }
        if diff != 0 {
            return prefixlen;
        }
        i = 8;
    }

    while data_size >= i + 4 {
        let diff = u32::from_be_bytes(a[i..i + 4].try_into().expect("4 bytes"))
            ^ u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        prefixlen += diff.leading_zeros();
        if prefixlen >= limit {
            return limit;
        }
        if diff != 0 {
            return prefixlen;
        }
        i += 4;
    }

    if data_size >= i + 2 {
        let diff = u16::from_be_bytes(a[i..i + 2].try_into().expect("2 bytes"))
            ^ u16::from_be_bytes(b[i..i + 2].try_into().expect("2 bytes"));
        prefixlen += diff.leading_zeros();
        if prefixlen >= limit {
            return limit;
        }
        if diff != 0 {
            return prefixlen;
        }
        i += 2;
    }

    if data_size > i {
        prefixlen += (a[i] ^ b[i]).leading_zeros();
        if prefixlen >= limit {
            return limit;
        }
    }

    prefixlen
}

/// `__longest_prefix_match()` on a node, inlined into the lookup loop as
/// the kernel forces.
#[inline(always)]
fn longest_prefix_match_inline(data_size: usize, node: &Node, key: &[u8], prefixlen: u32) -> u32 {
    longest_prefix_match_bytes(data_size, &node.tail, node.prefixlen(), key, prefixlen)
}

/// `longest_prefix_match()`: the out-of-line copy the writers and
/// `get_next_key` call.
fn longest_prefix_match(data_size: usize, node: &Node, key: &[u8], prefixlen: u32) -> u32 {
    longest_prefix_match_inline(data_size, node, key, prefixlen)
}

/// `extract_bit()`: bit `index` of `data`, most significant first.
#[inline]
fn extract_bit(data: &[u8], index: u32) -> usize {
    key::bit(data, index as usize) as usize
}

/// `BPF_MAP_TYPE_LPM_TRIE` exactly as the kernel builds it: a binary trie,
/// one allocation per node, lock-free readers, one lock for all writers.
///
/// See the [module docs](self) for the structure, the concurrency contract,
/// the iteration order and where it differs from the kernel.
pub struct KernelLpmTrie {
    root: Atomic<Node>,
    /// `trie->lock`: serialises every writer.
    lock: Mutex<()>,
    /// Real nodes; written by writers under `lock`, read by `len` without.
    n_entries: AtomicUsize,
    /// Bytes of all live node allocations; written under `lock`.
    node_bytes: AtomicUsize,
    data_size: usize,
    value_size: usize,
    max_prefixlen: u32,
    max_entries: u32,
    map_flags: u32,
}

impl KernelLpmTrie {
    /// An empty trie for `data_size`-byte keys (1..=256, the kernel's
    /// `LPM_DATA_SIZE_MIN..=MAX`), `value_size`-byte values and at most
    /// `max_entries` prefixes; `EINVAL` otherwise.
    pub fn new(data_size: usize, value_size: usize, max_entries: u32) -> Result<Self> {
        let data_size = key::check_sizes(
            KEY_HEADER.saturating_add(data_size),
            value_size,
            max_entries,
        )?;
        Ok(KernelLpmTrie {
            root: Atomic::null(),
            lock: Mutex::new(()),
            n_entries: AtomicUsize::new(0),
            node_bytes: AtomicUsize::new(0),
            data_size,
            value_size,
            max_prefixlen: 8 * data_size as u32,
            max_entries,
            map_flags: 0,
        })
    }

    /// Builds from a spec that passed [`KERNEL_LPM_TRIE_FAMILY`]'s checks
    /// (`trie_alloc`); the hash policy is ignored.
    fn from_spec(spec: &MapSpec) -> Result<Self> {
        let mut trie = Self::new(
            spec.key_size as usize - KEY_HEADER,
            spec.value_size as usize,
            spec.max_entries,
        )?;
        trie.map_flags = spec.flags;
        Ok(trie)
    }

    /// Bytes of key data (the key is 4 bytes of `prefixlen` more).
    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// `8 * data_size`: the longest prefix.
    pub fn max_prefixlen(&self) -> u32 {
        self.max_prefixlen
    }

    /// The value of the longest stored prefix containing the full-length
    /// address `data`, borrowed in place while `guard` is pinned; the
    /// kernel's lookup with `prefixlen = max_prefixlen`. Lock-free. `data`
    /// of the wrong length is simply not found.
    ///
    #[inline]
    pub fn lookup_data<'g>(&'g self, data: &[u8], guard: &'g Guard) -> Option<&'g [u8]> {
        self.lookup_prefix(data, self.max_prefixlen, guard)
    }

    /// The value of the longest stored prefix of length at most `prefixlen`
    /// that contains `data`: the kernel's lookup with a key whose
    /// `prefixlen` is shorter than the maximum. `prefixlen` above
    /// `max_prefixlen` finds nothing, as in the kernel.
    ///
    #[inline]
    pub fn lookup_prefix<'g>(
        &'g self,
        data: &[u8],
        prefixlen: u32,
        guard: &'g Guard,
    ) -> Option<&'g [u8]> {
        if data.len() != self.data_size {
            return None;
        }
        self.lookup_elem(data, prefixlen, guard)
            .map(|node| node.value(self.data_size))
    }

    /// Stores `value` under `data/prefixlen` without the byte-key encoding
    /// (`flags` as for [`Map::update`](crate::Map::update)). Host bits are
    /// stored but never matched.
    pub fn insert_data(&self, data: &[u8], prefixlen: u32, value: &[u8], flags: u64) -> Result<()> {
        let flags = UpdateFlag::from_bits(flags)?;
        self.check_data(data, prefixlen)?;
        check_len("value", value.len(), self.value_size)?;
        self.update_elem(data, prefixlen, value, flags)
    }

    /// Removes exactly `data/prefixlen` (`ENOENT` if it is not stored).
    pub fn remove_data(&self, data: &[u8], prefixlen: u32) -> Result<()> {
        self.check_data(data, prefixlen)?;
        self.delete_elem(data, prefixlen)
    }

    /// What the kernel's `trie_mem_usage` reports: `n_entries` times the
    /// size of a real node (24-byte header, data, value).
    pub fn kernel_mem_usage(&self) -> usize {
        (HEAD_SIZE + self.data_size + self.value_size) * self.n_entries.load(Ordering::Relaxed)
    }

    fn check_data(&self, data: &[u8], prefixlen: u32) -> Result<()> {
        if data.len() != self.data_size {
            return Err(Error::invalid(format!(
                "key data is {} bytes, the map expects {}",
                data.len(),
                self.data_size
            )));
        }
        if prefixlen > self.max_prefixlen {
            return Err(Error::invalid(format!(
                "prefixlen {prefixlen} exceeds {} bits of key data",
                self.max_prefixlen
            )));
        }
        Ok(())
    }

    /// `lpm_trie_node_alloc()`: a node with `prefixlen` and `flags`, no
    /// children, zeroed data and, for a real node, a copy of `value`.
    fn node_alloc(&self, prefixlen: u32, flags: u32, value: Option<&[u8]>) -> Owned<Node> {
        let value_len = value.map_or(0, <[u8]>::len);
        let mut node = Owned::<Node>::init(NodeInit {
            prefixlen,
            flags,
            tail_len: self.data_size + value_len,
        });
        if let Some(value) = value {
            node.tail[self.data_size..].copy_from_slice(value);
        }
        node
    }

    /// `trie_lookup_elem()`: walks down from the root remembering the last
    /// real node that matched. Lock-free; `data` is `data_size` bytes.
    #[inline]
    fn lookup_elem<'g>(&self, data: &[u8], prefixlen: u32, guard: &'g Guard) -> Option<&'g Node> {
        if prefixlen > self.max_prefixlen {
            return None;
        }
        let mut found = None;

        // Start walking the trie from the root node ...
        let mut node = self.root.load(Ordering::Acquire, guard);
        // SAFETY: a node reachable from the root under `guard` is freed only
        // after `guard` unpins (invariant 5); so is every child read from it.
        while let Some(n) = unsafe { node.as_ref() } {
            // The longest prefix of `n` that matches the key. If it is the
            // maximum possible prefix, this is an exact match: return it.
            let matchlen = longest_prefix_match_inline(self.data_size, n, data, prefixlen);
            if matchlen == self.max_prefixlen {
                found = Some(n);
                break;
            }
            // Fewer bits match than `n`'s prefix: return the last candidate.
            if matchlen < n.prefixlen() {
                break;
            }
            // A candidate, unless it is an intermediate node.
            if !n.is_im() {
                found = Some(n);
            }
            // Fully matched: try to become more specific.
            let next_bit = extract_bit(data, n.prefixlen());
            node = n.head.child[next_bit].load(Ordering::Acquire, guard);
        }
        found
    }

    /// `trie_check_add_elem()`: a new prefix needs room, and `BPF_EXIST`
    /// wants an old one. Takes the entry if allowed. The caller holds `lock`.
    fn check_add_elem(&self, flags: UpdateFlag) -> Result<()> {
        if flags == UpdateFlag::Exist {
            return Err(Error::NotFound);
        }
        let n = self.n_entries.load(Ordering::Relaxed);
        if n == self.max_entries as usize {
            return Err(Error::Full); // the kernel's ENOSPC
        }
        self.n_entries.store(n + 1, Ordering::Relaxed);
        Ok(())
    }

    /// Adds node bytes. The caller holds `lock` (hence no atomic RMW).
    fn add_bytes(&self, bytes: usize) {
        let b = self.node_bytes.load(Ordering::Relaxed);
        self.node_bytes.store(b + bytes, Ordering::Relaxed);
    }

    /// Subtracts node bytes. The caller holds `lock`.
    fn sub_bytes(&self, bytes: usize) {
        let b = self.node_bytes.load(Ordering::Relaxed);
        self.node_bytes.store(b - bytes, Ordering::Relaxed);
    }

    /// `trie_update_elem()`: inputs already checked (flags decoded, sizes,
    /// `prefixlen <= max_prefixlen`).
    fn update_elem(
        &self,
        data: &[u8],
        prefixlen: u32,
        value: &[u8],
        flags: UpdateFlag,
    ) -> Result<()> {
        let guard = &pin();
        // Allocate and fill the new node before taking the lock (6.14+).
        let mut new_node = Some(self.node_alloc(prefixlen, 0, Some(value)));
        let mut free_node = None;
        let ret = {
            let _locked = self.lock.lock();
            self.update_locked(&mut new_node, &mut free_node, data, prefixlen, flags, guard)
        };
        // Unpublished (an error): freed outside the lock, as the kernel.
        drop(new_node);
        if let Some(old) = free_node {
            // SAFETY: `old` was unlinked under the lock, so no new reader can
            // reach it, and readers already on it hold guards that delay the
            // free; nothing else retires it.
            unsafe { guard.defer_destroy(old) };
        }
        ret
    }

    /// The locked part of `trie_update_elem()`; the caller holds `lock`.
    /// Takes `new_node` out of its option when it publishes it; sets
    /// `free_node` to a node it unlinked, for the caller to retire.
    fn update_locked<'g>(
        &'g self,
        new_node: &mut Option<Owned<Node>>,
        free_node: &mut Option<Shared<'g, Node>>,
        data: &[u8],
        prefixlen: u32,
        flags: UpdateFlag,
        guard: &'g Guard,
    ) -> Result<()> {
        let ds = self.data_size;
        new_node.as_mut().expect("allocated").tail[..ds].copy_from_slice(data);

        // Find a slot to attach the new node: walk from the root matching as
        // many bits as possible until we either find an empty slot or a slot
        // that needs to be replaced by an intermediate node.
        let mut slot: &'g Atomic<Node> = &self.root;
        let mut matchlen = 0;
        let mut node;
        loop {
            node = slot.load(Ordering::Acquire, guard);
            // SAFETY: reachable under the lock, which every retirer holds:
            // nobody can unlink and free it meanwhile.
            let Some(n) = (unsafe { node.as_ref() }) else {
                break;
            };
            matchlen = longest_prefix_match(ds, n, data, prefixlen);
            if n.prefixlen() != matchlen || n.prefixlen() == prefixlen {
                break;
            }
            slot = &n.head.child[extract_bit(data, n.prefixlen())];
        }

        // SAFETY: as above.
        let Some(n) = (unsafe { node.as_ref() }) else {
            // An empty slot (a free child pointer or an empty root): take it.
            self.check_add_elem(flags)?;
            let new = new_node.take().expect("allocated");
            self.add_bytes(new.alloc_size());
            slot.store(new, Ordering::Release);
            return Ok(());
        };

        // The slot holds exactly our prefix: replace that node with the new
        // one, which takes over its children.
        if n.prefixlen() == matchlen {
            if !n.is_im() {
                if flags == UpdateFlag::NoExist {
                    return Err(Error::Exists);
                }
            } else {
                self.check_add_elem(flags)?;
            }
            let new = new_node.take().expect("allocated");
            new.head.child[0].store(
                n.head.child[0].load(Ordering::Relaxed, guard),
                Ordering::Relaxed,
            );
            new.head.child[1].store(
                n.head.child[1].load(Ordering::Relaxed, guard),
                Ordering::Relaxed,
            );
            self.add_bytes(new.alloc_size());
            self.sub_bytes(n.alloc_size());
            slot.store(new, Ordering::Release);
            *free_node = Some(node);
            return Ok(());
        }

        self.check_add_elem(flags)?;

        // The new prefix contains `n`'s: insert it as `n`'s parent.
        if matchlen == prefixlen {
            let new = new_node.take().expect("allocated");
            let next_bit = extract_bit(n.data(ds), matchlen);
            new.head.child[next_bit].store(node, Ordering::Relaxed);
            self.add_bytes(new.alloc_size());
            slot.store(new, Ordering::Release);
            return Ok(());
        }

        // The two diverge after `matchlen` bits: an intermediate node holds
        // both.
        let mut im_node = self.node_alloc(matchlen, LPM_TREE_NODE_FLAG_IM, None);
        im_node.tail.copy_from_slice(n.data(ds));
        let new = new_node.take().expect("allocated");
        self.add_bytes(new.alloc_size() + im_node.alloc_size());
        let new = new.into_shared(guard);
        let (left, right) = if extract_bit(data, matchlen) == 1 {
            (node, new)
        } else {
            (new, node)
        };
        im_node.head.child[0].store(left, Ordering::Relaxed);
        im_node.head.child[1].store(right, Ordering::Relaxed);
        // Finally, publish the intermediate node in the slot.
        slot.store(im_node, Ordering::Release);
        Ok(())
    }

    /// `trie_delete_elem()`: inputs already checked.
    fn delete_elem(&self, data: &[u8], prefixlen: u32) -> Result<()> {
        let guard = &pin();
        let mut free_node = None;
        let mut free_parent = None;
        let ret = {
            let _locked = self.lock.lock();
            self.delete_locked(data, prefixlen, &mut free_node, &mut free_parent, guard)
        };
        for unlinked in [free_parent, free_node].into_iter().flatten() {
            // SAFETY: unlinked under the lock, so no new reader can reach
            // it; readers already on it hold guards that delay the free; each
            // node is retired once.
            unsafe { guard.defer_destroy(unlinked) };
        }
        ret
    }

    /// The locked part of `trie_delete_elem()`; the caller holds `lock` and
    /// retires the nodes it returns in `free_node` and `free_parent`.
    fn delete_locked<'g>(
        &'g self,
        data: &[u8],
        prefixlen: u32,
        free_node: &mut Option<Shared<'g, Node>>,
        free_parent: &mut Option<Shared<'g, Node>>,
        guard: &'g Guard,
    ) -> Result<()> {
        let ds = self.data_size;
        // Walk looking for an exact key/length match, keeping the slot that
        // points to the node (`trim`), its parent and the parent's slot
        // (`trim2`).
        let mut trim: &'g Atomic<Node> = &self.root;
        let mut trim2 = trim;
        let mut parent: Shared<'g, Node> = Shared::null();
        let mut matchlen = 0;
        let mut node;
        loop {
            node = trim.load(Ordering::Acquire, guard);
            // SAFETY: reachable under the lock; only lock holders retire.
            let Some(n) = (unsafe { node.as_ref() }) else {
                break;
            };
            matchlen = longest_prefix_match(ds, n, data, prefixlen);
            if n.prefixlen() != matchlen || n.prefixlen() == prefixlen {
                break;
            }
            parent = node;
            trim2 = trim;
            trim = &n.head.child[extract_bit(data, n.prefixlen())];
        }

        // SAFETY: as above.
        let n = match unsafe { node.as_ref() } {
            Some(n) if n.prefixlen() == prefixlen && n.prefixlen() == matchlen && !n.is_im() => n,
            _ => return Err(Error::NotFound),
        };

        let entries = self.n_entries.load(Ordering::Relaxed);
        self.n_entries.store(entries - 1, Ordering::Relaxed);

        let child0 = n.head.child[0].load(Ordering::Relaxed, guard);
        let child1 = n.head.child[1].load(Ordering::Relaxed, guard);

        // Two children: just mark it intermediate.
        if !child0.is_null() && !child1.is_null() {
            n.set_im();
            return Ok(());
        }

        // A leaf under an intermediate parent: remove the parent too and
        // promote its other child, so that every intermediate node keeps
        // exactly two children (invariant 2).
        // SAFETY: as above.
        if let Some(p) = unsafe { parent.as_ref() }
            && p.is_im()
            && child0.is_null()
            && child1.is_null()
        {
            let p0 = p.head.child[0].load(Ordering::Relaxed, guard);
            let sibling = if node == p0 {
                p.head.child[1].load(Ordering::Relaxed, guard)
            } else {
                p0
            };
            trim2.store(sibling, Ordering::Release);
            self.sub_bytes(p.alloc_size() + n.alloc_size());
            *free_parent = Some(parent);
            *free_node = Some(node);
            return Ok(());
        }

        // Zero or one child: move the child (if any) into the node's slot.
        let replacement = if !child0.is_null() { child0 } else { child1 };
        trim.store(replacement, Ordering::Release);
        self.sub_bytes(n.alloc_size());
        *free_node = Some(node);
        Ok(())
    }

    /// `trie_get_next_key()`: the node after `key` in post-order, or the
    /// leftmost real node when `key` is `None`, too long, or not stored.
    /// Lock-free.
    fn get_next_node<'g>(&self, key: Option<(u32, &[u8])>, guard: &'g Guard) -> Result<&'g Node> {
        let ds = self.data_size;
        // Empty trie.
        let search_root = self.root.load(Ordering::Acquire, guard);
        if search_root.is_null() {
            return Err(Error::NotFound);
        }
        // For an invalid key, find the leftmost node in the trie.
        let (prefixlen, data) = match key {
            Some((prefixlen, data)) if prefixlen <= self.max_prefixlen => (prefixlen, data),
            _ => return find_leftmost(search_root, guard),
        };

        let mut node_stack: Vec<Shared<'g, Node>> =
            Vec::with_capacity(self.max_prefixlen as usize + 1);

        // Try to find the exact node for the given key.
        let mut node = search_root;
        let mut matchlen = 0;
        // SAFETY: reachable under `guard` (invariant 5).
        while let Some(n) = unsafe { node.as_ref() } {
            node_stack.push(node);
            matchlen = longest_prefix_match(ds, n, data, prefixlen);
            if n.prefixlen() != matchlen || n.prefixlen() == prefixlen {
                break;
            }
            node = n.head.child[extract_bit(data, n.prefixlen())].load(Ordering::Acquire, guard);
        }
        // SAFETY: as above.
        match unsafe { node.as_ref() } {
            Some(n) if n.prefixlen() == matchlen && !n.is_im() => {}
            _ => return find_leftmost(search_root, guard),
        }

        // Found: the next node in post-order is the leftmost node of the
        // right sibling subtree if there is one, else the nearest real
        // ancestor.
        let mut node = node_stack.pop().expect("the found node");
        while let Some(&parent_ptr) = node_stack.last() {
            // SAFETY: as above.
            let parent = unsafe { parent_ptr.deref() };
            if parent.head.child[0].load(Ordering::Acquire, guard) == node {
                let right = parent.head.child[1].load(Ordering::Acquire, guard);
                if !right.is_null() {
                    return find_leftmost(right, guard);
                }
            }
            if !parent.is_im() {
                return Ok(parent);
            }
            node = parent_ptr;
            node_stack.pop();
        }

        // Did not find anything.
        Err(Error::NotFound)
    }

    /// Test support: the trie's shape, pre-order, `data/prefixlen` with `*`
    /// for intermediate nodes and `(left,right)` for children (`-` empty).
    #[cfg(test)]
    pub(crate) fn shape(&self) -> String {
        fn walk(out: &mut String, node: Shared<'_, Node>, ds: usize, guard: &Guard) {
            // SAFETY: tests call this with no concurrent writer.
            let Some(n) = (unsafe { node.as_ref() }) else {
                out.push('-');
                return;
            };
            let data: Vec<String> = n.data(ds).iter().map(u8::to_string).collect();
            out.push_str(&format!("{}/{}", data.join("."), n.prefixlen()));
            if n.is_im() {
                out.push('*');
            }
            let c0 = n.head.child[0].load(Ordering::Acquire, guard);
            let c1 = n.head.child[1].load(Ordering::Acquire, guard);
            if !c0.is_null() || !c1.is_null() {
                out.push('(');
                walk(out, c0, ds, guard);
                out.push(',');
                walk(out, c1, ds, guard);
                out.push(')');
            }
        }
        let guard = &pin();
        let mut out = String::new();
        walk(
            &mut out,
            self.root.load(Ordering::Acquire, guard),
            self.data_size,
            guard,
        );
        out
    }

    /// Test support: checks invariants 1-3 and the byte count; panics with
    /// the shape if one fails.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        struct Walk<'a> {
            trie: &'a KernelLpmTrie,
            real: usize,
            bytes: usize,
        }
        impl Walk<'_> {
            fn node(&mut self, node: Shared<'_, Node>, parent: Option<(&Node, usize)>, g: &Guard) {
                let ds = self.trie.data_size;
                // SAFETY: tests call this with no concurrent writer.
                let Some(n) = (unsafe { node.as_ref() }) else {
                    return;
                };
                let shape = || self.trie.shape();
                assert!(n.prefixlen() <= self.trie.max_prefixlen, "{}", shape());
                if let Some((p, b)) = parent {
                    assert!(n.prefixlen() > p.prefixlen(), "invariant 1: {}", shape());
                    assert_eq!(
                        key::common_prefix_len(n.data(ds), p.data(ds), p.prefixlen()),
                        p.prefixlen(),
                        "invariant 1: {}",
                        shape()
                    );
                    assert_eq!(extract_bit(n.data(ds), p.prefixlen()), b, "{}", shape());
                }
                let c0 = n.head.child[0].load(Ordering::Acquire, g);
                let c1 = n.head.child[1].load(Ordering::Acquire, g);
                if n.is_im() {
                    assert!(!c0.is_null() && !c1.is_null(), "invariant 2: {}", shape());
                    assert!(n.tail.len() == ds || n.tail.len() == ds + self.trie.value_size);
                } else {
                    self.real += 1;
                    assert_eq!(n.tail.len(), ds + self.trie.value_size);
                }
                self.bytes += n.alloc_size();
                self.node(c0, Some((n, 0)), g);
                self.node(c1, Some((n, 1)), g);
            }
        }
        let guard = &pin();
        let mut walk = Walk {
            trie: self,
            real: 0,
            bytes: 0,
        };
        walk.node(self.root.load(Ordering::Acquire, guard), None, guard);
        assert_eq!(walk.real, self.map_len(), "invariant 3: {}", self.shape());
        assert!(walk.real <= self.max_entries as usize);
        assert_eq!(walk.bytes, self.map_mem_usage());
    }
}

/// The `find_leftmost` tail of `trie_get_next_key()`: the first real node
/// in post-order under `search_root`.
fn find_leftmost<'g>(search_root: Shared<'g, Node>, guard: &'g Guard) -> Result<&'g Node> {
    // Every intermediate node has two children (invariant 2), so a real
    // node is always found; the kernel relies on it and dereferences NULL
    // otherwise, we answer ENOENT.
    let mut next_node = None;
    let mut node = search_root;
    // SAFETY: reachable under `guard` (invariant 5).
    while let Some(n) = unsafe { node.as_ref() } {
        if n.is_im() {
            node = n.head.child[0].load(Ordering::Acquire, guard);
        } else {
            next_node = Some(n);
            node = n.head.child[0].load(Ordering::Acquire, guard);
            if node.is_null() {
                node = n.head.child[1].load(Ordering::Acquire, guard);
            }
        }
    }
    debug_assert!(next_node.is_some(), "an intermediate node without children");
    next_node.ok_or(Error::NotFound)
}

/// Splits a byte-contract key (size already checked) into prefixlen and data.
fn split_key(key: &[u8]) -> (u32, &[u8]) {
    let prefixlen = u32::from_ne_bytes(key[..KEY_HEADER].try_into().expect("4 bytes"));
    (prefixlen, &key[KEY_HEADER..])
}

/// The kernel's `trie_map_ops`.
impl MapOps for KernelLpmTrie {
    const CAPS: Caps = Caps::KEYED;

    fn map_info(&self) -> MapInfo {
        let (ds, vs) = (self.data_size, self.value_size);
        key::info(
            MapType::KERNEL_LPM_TRIE,
            ds,
            vs,
            self.max_entries,
            self.map_flags,
        )
    }

    fn map_len(&self) -> usize {
        self.n_entries.load(Ordering::Relaxed)
    }

    /// Sum of the live node allocations, intermediate nodes included.
    fn map_mem_usage(&self) -> usize {
        self.node_bytes.load(Ordering::Relaxed)
    }

    /// Longest-prefix match of the key's data among prefixes of length at
    /// most the key's `prefixlen`. A `prefixlen` above `max_prefixlen` is
    /// `ENOENT`, not `EINVAL`: the kernel's lookup just finds nothing.
    fn map_lookup_elem(&self, key: &[u8], value: &mut [u8], guard: &Guard) -> Result<()> {
        let (prefixlen, data) = split_key(key);
        let node = self
            .lookup_elem(data, prefixlen, guard)
            .ok_or(Error::NotFound)?;
        value.copy_from_slice(node.value(self.data_size));
        Ok(())
    }

    /// Stores the exact prefix. A new prefix (an intermediate node's
    /// included) needs room: `E2BIG` (the kernel's `ENOSPC`) when full.
    fn map_update_elem(&self, key: &[u8], value: &[u8], flag: UpdateFlag, _: &Guard) -> Result<()> {
        let key = KeyRef::parse(key, self.data_size)?;
        self.update_elem(key.data, key.prefixlen, value, flag)
    }

    fn map_delete_elem(&self, key: &[u8], _: &Guard) -> Result<()> {
        let key = KeyRef::parse(key, self.data_size)?;
        self.delete_elem(key.data, key.prefixlen)
    }

    /// Post-order (more specific prefixes first). A key that is not stored
    /// restarts from the first key; data comes back with the host bits it
    /// was stored with.
    fn map_get_next_key(
        &self,
        key: Option<&[u8]>,
        next: &mut [u8],
        guard: &Guard,
    ) -> Result<usize> {
        let node = self.get_next_node(key.map(split_key), guard)?;
        key::write_key(next, node.prefixlen(), node.data(self.data_size));
        Ok(next.len())
    }
}

impl Drop for KernelLpmTrie {
    /// `trie_free()`: start at the root, walk down to a node without
    /// children, free it, clear its slot, start over. Synchronous.
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or writer can reach the trie (reads
        // borrow the map for as long as they hold a node), so nodes are freed
        // without a grace period ("no bpf program may access the map").
        let guard = unsafe { epoch::unprotected() };
        loop {
            let mut slot = &self.root;
            loop {
                let node = slot.load(Ordering::Relaxed, guard);
                // SAFETY: reachable, hence not freed yet.
                let Some(n) = (unsafe { node.as_ref() }) else {
                    return;
                };
                if !n.head.child[0].load(Ordering::Relaxed, guard).is_null() {
                    slot = &n.head.child[0];
                    continue;
                }
                if !n.head.child[1].load(Ordering::Relaxed, guard).is_null() {
                    slot = &n.head.child[1];
                    continue;
                }
                // SAFETY: a childless node reachable only through `slot`,
                // which is cleared next; nothing refers to it afterwards.
                drop(unsafe { node.into_owned() });
                slot.store(Shared::null(), Ordering::Relaxed);
                break;
            }
        }
    }
}
