//! Compaction: once churn leaves the arena holding much more than the
//! trie uses (`Arena::fragmented`), the writer copies every block into a
//! new generation of chunks, publishing each copy as it would a rebuilt
//! block, and the old chunks go back to the system a grace period later
//! (`core::arena`). Readers never wait: one in an old block reads it
//! whole, as after any copy-on-write update.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::LpmTrie;
use crate::core::arena::Arena;
use crate::core::reclaim::{Guard, pin};
use crate::lpm::node::{ChildBlock, Node};

impl LpmTrie {
    /// Compacts if the arena is fragmented, looking every
    /// `COMPACT_CHECK` writes. Writer only.
    ///
    /// Each compaction's old chunks wait for a grace period, and only a
    /// few may wait at once. At that limit the writer does not wait (it
    /// is pinned: waiting would hold back the very grace periods it waits
    /// for); it looks again after `COMPACT_BACKOFF` more writes, so a
    /// stalled reader costs memory, as it would anyway, and no write a
    /// wait.
    pub(super) fn maybe_compact(&self, guard: &Guard) {
        let countdown = self.compact_countdown.load(Ordering::Relaxed);
        if countdown > 0 {
            self.compact_countdown
                .store(countdown - 1, Ordering::Relaxed);
            return;
        }
        let gave_up = self.arena.fragmented() && !self.compact(guard);
        let next = if gave_up {
            Self::COMPACT_BACKOFF
        } else {
            Self::COMPACT_CHECK
        };
        self.compact_countdown.store(next, Ordering::Relaxed);
    }

    /// Writes between looks at the arena.
    const COMPACT_CHECK: u32 = 64;
    /// Writes before looking again after a compaction could not start.
    const COMPACT_BACKOFF: u32 = 1024;

    /// Copies every block into a new generation of the arena; the old one
    /// is freed once the readers that may be in it have moved on. Writer
    /// only. `false` (nothing done) while too many earlier compactions'
    /// old chunks still wait for their grace periods.
    fn compact(&self, guard: &Guard) -> bool {
        let Some(generation) = self.arena.start_generation() else {
            return false;
        };
        let moved = self.relocate(&self.root, guard);
        // Once, after the whole tree moved (and before the originals are
        // retired below): every slot to the copies.
        self.refresh_direct(guard);
        self.compactions.fetch_add(1, Ordering::Relaxed);
        let arena = Arc::clone(&self.arena);
        // SAFETY: the copies replaced every block of the old generation
        // the tree held (`moved` bytes); after the grace period no reader
        // is in one, and none is retired on its own.
        guard.defer(move || unsafe { arena.release_relocated(generation, moved) });
        // Hand the retired blocks to the collector now, so the old
        // generation drains without waiting for a batch or the bag to fill.
        self.arena.flush_retired(guard);
        guard.flush();
        true
    }

    /// Publishes copies of `node`'s blocks, then of its children's, in
    /// the arena's current generation; returns the bytes of the blocks
    /// replaced. The direct index still points at the originals, which
    /// stay until a grace period after `compact` refills it.
    fn relocate(&self, node: &Node, guard: &Guard) -> usize {
        let data = node.data(guard);
        let mut moved = Arena::block_bytes(data.size());
        let copy = data.copy_to(&self.arena);
        node.data.store(copy.as_ptr(), Ordering::Release);
        let Some(children) = node.children(guard) else {
            return moved;
        };
        moved += Arena::block_bytes(children.size());
        let copy = ChildBlock::alloc(&self.arena, children.bits, &children.entries());
        node.children.store(copy.as_ptr(), Ordering::Release);
        let children = node.children(guard).expect("just stored");
        for i in 0..children.len() {
            // SAFETY: i < len.
            moved += self.relocate(unsafe { children.node(i) }, guard);
        }
        moved
    }

    /// How many times the trie has compacted its memory (by itself or on
    /// `shrink_to_fit`).
    pub fn compactions(&self) -> u64 {
        self.compactions.load(Ordering::Relaxed)
    }

    /// Compacts the trie's memory now: every block is copied into fresh
    /// chunks sized to what is live, and the old chunks go back to the
    /// system once readers have moved on. Writes compact by themselves
    /// when enough of the arena lies free (`Arena::fragmented`); this is
    /// for a table that shrank and then stopped changing. May first wait
    /// (up to a second, unpinned, then gives up) for earlier compactions'
    /// grace periods.
    pub fn shrink_to_fit(&self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.arena.at_generation_limit() && Instant::now() < deadline {
            // A guard pinned only to push the collector along.
            pin().flush();
            std::thread::yield_now();
        }
        let guard = &pin();
        let _writer = self.writer.lock();
        self.compact(guard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::flags::BPF_ANY;

    // Memory after churn: tests/lpm_churn.rs, in a process of its own
    // (other tests' pinned readers would hold its grace periods back).

    /// Readers look up addresses while the writer churns prefixes and
    /// compacts every few writes, with and without the direct index:
    /// every answer contains the address and is no shorter than the
    /// longest stable prefix (present throughout) that does; afterwards
    /// the index mirrors the tree.
    #[test]
    fn readers_never_miss_a_stable_route_during_compactions() {
        use crate::Map;
        use crate::lpm::tests::{self_value, spread_ipv4, stable_ipv4_routes, with_ipv4_readers};

        let encode = self_value;
        let stable = stable_ipv4_routes();
        let churn = spread_ipv4(crate::scaled(3000, 8), 0);
        let directs: &[bool] = if cfg!(miri) { &[false] } else { &[false, true] };
        for &direct in directs {
            let t = LpmTrie::new(4, 8, 10_000)
                .unwrap()
                .with_direct_index_from(if direct { 0 } else { usize::MAX });
            for (d, l) in &stable {
                t.insert(d, *l, &encode(d, *l), BPF_ANY).unwrap();
            }
            with_ipv4_readers(&t, &stable, || {
                for round in 0..crate::scaled(4, 2) {
                    for (i, (d, l)) in churn.iter().enumerate() {
                        if round % 2 == 0 {
                            t.insert(d, *l, &encode(d, *l), BPF_ANY).unwrap();
                        } else {
                            t.remove(d, *l, None).unwrap();
                        }
                        if i % crate::scaled(64, 8) == 0 {
                            t.shrink_to_fit();
                        }
                    }
                }
            });
            assert_eq!(t.len(), stable.len());
            assert!(t.direct_index_matches_tree());
        }
    }
}
