//! # bpfmaps
//!
//! BPF-style maps in userspace: the Linux kernel's map semantics (update
//! flags, errno-style errors, `get_next_key` iteration, `max_entries`,
//! batch operations) over faster designs.
//!
//! ## Layout
//! | module | what |
//! |---|---|
//! | [`core`] | errors, flags, the byte-level [`Map`] contract and the [`MapOps`] every family implements, what a family declares, reclamation |
//! | [`registry`] | every family in one table; [`create`] |
//! | [`hash`] | jhash/jhash2 (as the kernel), xxh3, and the hash policies |
//! | [`hashtab`] | `BPF_MAP_TYPE_HASH` and `BPF_MAP_TYPE_LRU_HASH` |
//! | [`lpm`] | `BPF_MAP_TYPE_LPM_TRIE` |
//! | [`bloom`] | `BPF_MAP_TYPE_BLOOM_FILTER` |
//! | [`stackmap`] | `BPF_MAP_TYPE_STACK_TRACE` |
//! | [`strmap`] | string keys: the qp-trie and TST maps proposed for BPF |
//! | [`maple`] | range maps: the kernel's maple tree |
//! | [`wildcard`] | multi-field classification: the wildcard map proposed for BPF, on TupleMerge |
//!
//! ## Concurrency model
//! Every lookup is lock-free: it pins an epoch ([`pin`]), reads, and
//! unpins, and never waits for a writer. Writers take fine-grained locks
//! (one per bucket). Memory a reader may still see is reclaimed only after
//! every reader pinned at the time has moved on (crossbeam-epoch; see
//! [`core::reclaim`] for why that crate). Large frees run on a background
//! thread so dropping a huge map stalls no one. See `docs/design.md`.
//!
//! ## Example
//! ```
//! use bpfmaps::{create, Map, MapSpec, MapType, Error, BPF_ANY, BPF_NOEXIST};
//!
//! let map = create(&MapSpec::new(MapType::HASH, 4, 4, 2)).unwrap();
//! map.update(&1u32.to_ne_bytes(), &100u32.to_ne_bytes(), BPF_ANY).unwrap();
//! map.update(&2u32.to_ne_bytes(), &200u32.to_ne_bytes(), BPF_ANY).unwrap();
//! assert_eq!(map.update(&3u32.to_ne_bytes(), &1u32.to_ne_bytes(), BPF_ANY), Err(Error::Full));
//! assert_eq!(map.update(&1u32.to_ne_bytes(), &1u32.to_ne_bytes(), BPF_NOEXIST), Err(Error::Exists));
//!
//! let mut key = [0u8; 4];
//! let mut seen = 0;
//! let mut prev: Option<[u8; 4]> = None;
//! while map.get_next_key(prev.as_ref().map(|k| &k[..]), &mut key).is_ok() {
//!     seen += 1;
//!     prev = Some(key);
//! }
//! assert_eq!(seen, 2);
//! ```

pub mod bloom;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod core;
pub mod hash;
pub mod hashtab;
#[cfg(all(test, loom))]
mod loom_models;
pub mod lpm;
pub mod maple;
pub mod registry;
pub mod stackmap;
pub mod strmap;
pub mod wildcard;

pub use crate::core::contract::{
    BatchError, BatchKeys, Caps, Map, MapInfo, MapOps, MapSpec, MapType,
};
pub use crate::core::error::{Error, Result};
pub use crate::core::flags::*;
pub use crate::core::reclaim::{Guard, pin};
pub use crate::hash::HashPolicy;
pub use crate::registry::create;

/// Test sizes: the native one, or a smaller one under Miri, which checks
/// every memory access of the code it runs, a thousand times slower.
#[cfg(any(test, feature = "conformance"))]
pub(crate) const fn scaled(native: usize, miri: usize) -> usize {
    if cfg!(miri) { miri } else { native }
}

/// Called by a stress test's reader after each check. Miri runs one
/// thread at a time, so a reader that spins takes the interpreter from
/// the writer whose steps it checks, and a test's time goes to the
/// readers; there a reader sleeps between checks (about 20,000 basic
/// blocks of the other threads on Miri's virtual clock, which ticks
/// 5 us a block), so reads still interleave with every writer step.
/// Natively it does nothing: the threads run side by side.
#[cfg(test)]
pub(crate) fn reader_pause() {
    if cfg!(miri) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
