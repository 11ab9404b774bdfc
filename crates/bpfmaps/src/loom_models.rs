//! Loom models of the two publication and reclamation protocols readers
//! rely on, run with crossbeam-epoch's own loom build and the real free
//! list (`core::free_list`):
//!
//! ```sh
//! RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test -p bpfmaps --release --lib loom_models
//! ```
//!
//! Each model is the protocol with the map's data reduced to a few cells:
//! the element or block contents are loom `UnsafeCell`s, so loom reports
//! any read that is not ordered after the write it reads (a block reused
//! while a reader still reads it, a pointer published before the contents
//! it points at) as a causality violation, across every interleaving of a
//! writer and a reader up to loom's preemption bound. The orderings are
//! the real code's, named beside each step; a change to one there must be
//! made here too.
//!
//! What is modelled, and what is not:
//! - the hash map's element replacement (`hashtab::table::RawTable::update`
//!   and `delete`, `Slab::alloc`/`release`): a new element filled, swapped
//!   into the chain with a release store, the old one retired to the epoch
//!   collector and recycled through the free list;
//! - the LPM trie's copy-on-write blocks (`LpmTrie::publish_data`,
//!   `retire_data`) and payloads written in place (`replace_payload`,
//!   `node::leaf::store_payload`/`load_payload`) naming route slots filled
//!   just before (`RouteStore::alloc`), recycled after a grace period;
//! - the hash map's readers without a pin (`RawTable::read_unpinned`,
//!   behind `Map::lookup`): the stripe's unlink count checked after a
//!   read of an element that the writer recycles at once;
//! - the wildcard map's split (`wildcard::map::WildcardMap::split` and
//!   `read_view`): a rule put in a new table, the view with that table
//!   published, the split counted, the rule taken out of the old table;
//!   a reader that probed while it moved finds it, or sees the count
//!   change and probes again;
//! - not modelled: the chain walk over several elements, the LRU clock,
//!   the direct index (it mirrors the tree with the same release stores).

use crossbeam_epoch::{Collector, LocalHandle};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

use crate::core::free_list::{Chain, FreeList, Links, NIL};

/// A pool of entries recycled through the real free list: the owner's
/// chain, the shared list, and the links (loom-tracked, in each entry).
struct Pool {
    links: Vec<UnsafeCell<usize>>,
    free: FreeList,
}

// SAFETY: a link is read back as written.
unsafe impl Links for Pool {
    unsafe fn next(&self, entry: usize) -> usize {
        // SAFETY: loom checks the access.
        self.links[entry].with(|p| unsafe { *p })
    }
    unsafe fn set_next(&self, entry: usize, next: usize) {
        // SAFETY: loom checks the access.
        self.links[entry].with_mut(|p| unsafe { *p = next })
    }
}

impl Pool {
    /// A pool of `n` entries, the first `used` of them in use and the rest
    /// on `chain`.
    fn new(n: usize, used: usize, chain: &mut Chain) -> Pool {
        let pool = Pool {
            links: (0..n).map(|_| UnsafeCell::new(NIL)).collect(),
            free: FreeList::default(),
        };
        for e in (used..n).rev() {
            // SAFETY: the entry is free and ours.
            unsafe { chain.push(&pool, e) };
        }
        pool
    }

    /// An entry for the writer, if one is free: `None` while every entry
    /// is in use or waits out its grace period (the real writers then
    /// grow, or answer `EBUSY`; the model's writer skips that update, and
    /// loom explores both the runs where the grace period was over and
    /// those where it was not).
    fn take(&self, chain: &mut Chain) -> Option<usize> {
        self.free.take(self, chain)
    }
}

/// Pushes the epoch along (each flush tries to advance it) so that
/// deferred releases run within the model.
fn settle(handle: &LocalHandle) {
    for _ in 0..3 {
        handle.pin().flush();
    }
}

/// One hash element: its key and value, written only while the element is
/// private (fresh from the free list).
struct Elem {
    key: UnsafeCell<u64>,
    value: UnsafeCell<u64>,
}

/// The hash map's element replacement: a writer updates key 7 twice
/// (each time a new element swapped in at the chain's head, the old one
/// retired; with two elements, the second update must recycle the first)
/// while a reader looks key 7 up: it must read a whole element whose value
/// belongs to key 7, never one being refilled.
#[test]
fn hash_element_replacement() {
    loom::model(|| {
        let collector = Collector::new();
        let mut chain = Chain::default();
        let pool = Arc::new(Pool::new(2, 1, &mut chain));
        let elems: Arc<Vec<Elem>> = Arc::new(
            (0..2)
                .map(|i| Elem {
                    key: UnsafeCell::new(if i == 0 { 7 } else { 0 }),
                    value: UnsafeCell::new(if i == 0 { 700 } else { 0 }),
                })
                .collect(),
        );
        // The bucket's head: element 0 holds key 7 (`RawTable::heads`).
        let head = Arc::new(AtomicUsize::new(0));

        let reader = {
            let (collector, elems, head) = (collector.clone(), elems.clone(), head.clone());
            loom::thread::spawn(move || {
                let handle = collector.register();
                let _guard = handle.pin();
                // `RawTable::find`: Acquire pairs with the writer's release
                // store of the head.
                let e = &elems[head.load(Ordering::Acquire)];
                // SAFETY: loom checks the accesses.
                let key = e.key.with(|k| unsafe { *k });
                // SAFETY: as above.
                let value = e.value.with(|v| unsafe { *v });
                assert_eq!((key, value / 100), (7, 7), "a torn or foreign element");
            })
        };

        let handle = collector.register();
        for generation in 1..=2u64 {
            let guard = handle.pin();
            // `Slab::alloc`: an element no reader can reach.
            let Some(new) = pool.take(&mut chain) else {
                continue;
            };
            // `ElemPtr::init`: fill it while private.
            // SAFETY: loom checks the accesses.
            elems[new].key.with_mut(|k| unsafe { *k = 7 });
            // SAFETY: as above.
            elems[new]
                .value
                .with_mut(|v| unsafe { *v = 700 + generation });
            // `RawTable::update`: one release store publishes it.
            let old = head.swap(new, Ordering::Release);
            // `RawTable::retire`: back to the slab after the grace period.
            let pool = Arc::clone(&pool);
            // SAFETY: the old element is unlinked; the closure runs once,
            // after the grace period, so the element is then dead.
            unsafe { guard.defer_unchecked(move || pool.free.release(&*pool, old)) };
            drop(guard);
            settle(&handle);
        }
        reader.join().unwrap();
    });
}

/// A hash element as readers without a pin see it: words stored and
/// loaded atomically (`ElemPtr::word`).
struct Words {
    key: AtomicU64,
    value: AtomicU64,
}

/// The hash map's readers without a pin: a writer updates key 7 (a new
/// element swapped in, the old one unlinked and counted), then, having no
/// pinned reader to wait for, refills the old element at once for key 9
/// in another bucket (the worst case of recycling). The reader copies key
/// 7's element and keeps the copy only if the stripe's unlink count did
/// not change meanwhile: a kept copy must be whole and key 7's, and not
/// older than an update that completed before the read began.
#[test]
fn hash_unpinned_reads() {
    loom::model(|| {
        let elems: Arc<Vec<Words>> = Arc::new(
            [(7, 700), (0, 0)]
                .into_iter()
                .map(|(key, value)| Words {
                    key: AtomicU64::new(key),
                    value: AtomicU64::new(value),
                })
                .collect(),
        );
        // Key 7's bucket head, and its stripe's `Stripe::unlinks`.
        let head = Arc::new(AtomicUsize::new(0));
        let unlinks = Arc::new(AtomicU64::new(0));
        let updated = Arc::new(AtomicU64::new(0));

        let reader = {
            let (elems, head, unlinks, updated) = (
                elems.clone(),
                head.clone(),
                unlinks.clone(),
                updated.clone(),
            );
            loom::thread::spawn(move || {
                let floor = 700 + updated.load(Ordering::Acquire);
                loop {
                    // `read_unpinned`: Acquire, so a walk that starts after
                    // an unlink sees the chain without the element.
                    let seen = unlinks.load(Ordering::Acquire);
                    let e = &elems[head.load(Ordering::Acquire)];
                    let key = e.key.load(Ordering::Relaxed);
                    let value = e.value.load(Ordering::Relaxed);
                    fence(Ordering::Acquire);
                    if unlinks.load(Ordering::Relaxed) != seen {
                        continue;
                    }
                    assert_eq!((key, value / 100), (7, 7), "a torn or foreign element");
                    assert!(value >= floor, "stale: {value} after {floor}");
                    break;
                }
            })
        };

        // `ElemPtr::init`: a release fence, then atomic stores (a reader
        // may still be reading the element).
        let init = |e: &Words, key: u64, value: u64| {
            fence(Ordering::Release);
            e.key.store(key, Ordering::Relaxed);
            e.value.store(value, Ordering::Relaxed);
        };
        // `RawTable::update` of key 7: publish the new element, then count
        // the old one's unlink (`Stripe::count_unlink`).
        init(&elems[1], 7, 701);
        head.store(1, Ordering::Release);
        let n = unlinks.load(Ordering::Relaxed);
        unlinks.store(n + 1, Ordering::Release);
        updated.store(1, Ordering::Release);
        // Element 0 reused at once for key 9 (another bucket: no count
        // here, the unlink above is what readers of key 7 check).
        init(&elems[0], 9, 900);
        reader.join().unwrap();
    });
}

/// One LPM data block, reduced to a run's code (fixed once built) and its
/// payload word (which the writer may rewrite in place).
struct Block {
    code: UnsafeCell<u8>,
    payload: AtomicU32,
}

/// The LPM trie's copy-on-write blocks and in-place payloads: a writer
/// replaces the node's block (a new one built privately, published with
/// one release swap, the old one retired and recycled), then gives the
/// prefix a new value over 4 bytes in place (a route slot filled, its id
/// stored into the payload word with a release store, the old slot retired
/// and recycled); a reader reads the node's block and the route slot its
/// payload names: every byte it reads must be ordered after its write.
#[test]
fn lpm_cow_blocks_and_in_place_payloads() {
    loom::model(|| {
        let collector = Collector::new();
        let (mut block_chain, mut slot_chain) = (Chain::default(), Chain::default());
        let blocks_pool = Arc::new(Pool::new(2, 1, &mut block_chain));
        let slots_pool = Arc::new(Pool::new(2, 1, &mut slot_chain));
        let blocks: Arc<Vec<Block>> = Arc::new(
            (0..2)
                .map(|_| Block {
                    code: UnsafeCell::new(1),
                    payload: AtomicU32::new(0),
                })
                .collect(),
        );
        // Route slot contents: a value over 4 bytes (`RouteStore`).
        let slots: Arc<Vec<UnsafeCell<u64>>> =
            Arc::new((0..2).map(|_| UnsafeCell::new(100)).collect());
        // The node's data pointer (`Node::data`): block 0, payload slot 0.
        let node = Arc::new(AtomicUsize::new(0));

        let reader = {
            let (collector, blocks, slots, node) = (
                collector.clone(),
                blocks.clone(),
                slots.clone(),
                node.clone(),
            );
            loom::thread::spawn(move || {
                let handle = collector.register();
                let _guard = handle.pin();
                // `Node::data`: Acquire pairs with `publish_data`'s swap.
                let block = &blocks[node.load(Ordering::Acquire)];
                // SAFETY: loom checks the access.
                let code = block.code.with(|c| unsafe { *c });
                // `load_payload`: Acquire pairs with `store_payload`.
                let slot = block.payload.load(Ordering::Acquire) as usize;
                // `RouteStore::value`.
                // SAFETY: loom checks the access.
                let value = slots[slot].with(|v| unsafe { *v });
                assert_eq!((code, value / 100), (1, 1));
            })
        };

        let handle = collector.register();
        // A copy-on-write rebuild of the node's block.
        {
            let guard = handle.pin();
            let new = blocks_pool
                .take(&mut block_chain)
                .expect("a free block to start with");
            // SAFETY: the new block is private until published.
            blocks[new].code.with_mut(|c| unsafe { *c = 1 });
            let current = blocks[node.load(Ordering::Relaxed)]
                .payload
                .load(Ordering::Relaxed);
            blocks[new].payload.store(current, Ordering::Relaxed);
            // `publish_data`: AcqRel swap; `retire_data`: deferred.
            let old = node.swap(new, Ordering::AcqRel);
            let pool = Arc::clone(&blocks_pool);
            // SAFETY: the old block is unlinked; the closure runs once.
            unsafe { guard.defer_unchecked(move || pool.free.release(&*pool, old)) };
        }
        settle(&handle);
        // Two new values in place, each in a fresh route slot (the second
        // reuses the first's old slot once its grace period is over).
        for value in [101u64, 102] {
            let guard = handle.pin();
            let Some(slot) = slots_pool.take(&mut slot_chain) else {
                continue;
            };
            // `RouteStore::alloc`: the slot is private until its id is
            // stored.
            // SAFETY: loom checks the access.
            slots[slot].with_mut(|v| unsafe { *v = value });
            let block = &blocks[node.load(Ordering::Relaxed)];
            // `store_payload`: Release publishes the slot's bytes.
            let old = block.payload.swap(slot as u32, Ordering::Release) as usize;
            // `retire_payload`.
            let pool = Arc::clone(&slots_pool);
            // SAFETY: the old slot is no longer named; the closure runs once.
            unsafe { guard.defer_unchecked(move || pool.free.release(&*pool, old)) };
            drop(guard);
            settle(&handle);
        }
        reader.join().unwrap();
    });
}

/// The wildcard map's split moving a rule to a new table: the writer puts
/// it in the new table's bucket, publishes the view that has that table,
/// counts the split and takes the rule out of the old table's bucket. A
/// reader reads the count and the view, probes the view's tables, and
/// probes again while the count changed: it must find the rule, which
/// was held throughout. (Without the count, a reader of the old view that
/// reads the old bucket after the removal finds it nowhere.)
#[test]
fn wildcard_split_moves_a_rule_no_reader_misses() {
    loom::model(|| {
        // Buckets hold the rule (1) or not (0); view 0 has the old table
        // only, view 1 both.
        let old_bucket = Arc::new(AtomicUsize::new(1));
        let new_bucket = Arc::new(AtomicUsize::new(0));
        let view = Arc::new(AtomicUsize::new(0));
        let moves = Arc::new(AtomicU64::new(0));

        let reader = {
            let (old_bucket, new_bucket, view, moves) = (
                old_bucket.clone(),
                new_bucket.clone(),
                view.clone(),
                moves.clone(),
            );
            loom::thread::spawn(move || {
                loop {
                    // `view_now`: the count, then the view (Acquire).
                    let count = moves.load(Ordering::Acquire);
                    let tables = view.load(Ordering::Acquire);
                    // `scan_slot`: each bucket's chain (Acquire).
                    let found = (tables == 1 && new_bucket.load(Ordering::Acquire) == 1)
                        || old_bucket.load(Ordering::Acquire) == 1;
                    // `unmoved_since` (Acquire).
                    if moves.load(Ordering::Acquire) == count {
                        assert!(found, "a reader of view {tables} missed the moving rule");
                        return;
                    }
                    loom::thread::yield_now();
                }
            })
        };

        // `split`: into the new table (`chain_insert`'s AcqRel swap),
        // its view published (`publish`, AcqRel swap), the split counted
        // (Release), out of the old table (`publish_chain`, AcqRel swap).
        new_bucket.swap(1, Ordering::AcqRel);
        view.swap(1, Ordering::AcqRel);
        moves.fetch_add(1, Ordering::Release);
        old_bucket.swap(0, Ordering::AcqRel);
        reader.join().unwrap();
    });
}
