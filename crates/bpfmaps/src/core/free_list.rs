//! The free list every map's storage recycles through: "push on release,
//! take all".
//!
//! # The problem
//! A map's writer unlinks an element (or a block, or a route slot) while
//! readers may still be looking at it, so it hands it to the epoch
//! collector, which gives it back only once every reader pinned at the
//! time has moved on. The collector runs that release on whichever thread
//! collects: often a *reader*. So releasing must never take a lock, or a
//! lookup could wait for a writer. Allocating, on the other hand, is the
//! writer's business, under a lock it holds anyway.
//!
//! # The protocol
//! - [`FreeList::release`] (any thread, lock-free): pushes the entry on a
//!   shared stack with a compare-and-swap loop (Treiber), linking it
//!   through the entry's own memory, which is dead.
//! - [`FreeList::take`] (the owner, under its own lock): pops from the
//!   owner's private [`Chain`]; when that is empty, takes the *whole*
//!   shared stack with one `swap` and keeps it as its chain.
//!
//! Nobody ever pops a single entry from the shared stack, so the ABA
//! problem of Treiber stacks (a pop that reads `head.next`, stalls, and
//! swings `head` to a stale `next`) cannot happen: a push's CAS only
//! checks that `head` is still what the new entry links to, and the
//! owner's `swap` reads nothing but `head`. No tags or hazard pointers.
//!
//! Ordering: the push is a `Release` CAS, so the link written into the
//! entry (and everything the releaser did to it) happens before the
//! owner's `Acquire` swap that takes it.
//!
//! # Entries and links
//! Entries are `usize` handles: addresses (slab elements, arena blocks)
//! or indices (route slots). A free entry holds its link in its own
//! storage, which the owner reads and writes through [`Links`]. `NIL`
//! (`usize::MAX`) ends a list.
//!
//! The atomics go through `core::sync`, so the loom test at the bottom
//! checks the protocol: `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo
//! test -p bpfmaps --release --lib core::free_list`.

use super::sync::{AtomicUsize, Ordering};

/// The end of a list: no entry has this handle.
pub(crate) const NIL: usize = usize::MAX;

/// Where a free entry keeps the handle of the next one.
///
/// # Safety
/// `next` must return what `set_next` last stored for the same entry, for
/// every handle the owner passes to its free list.
pub(crate) unsafe trait Links {
    /// The link stored in free entry `entry`.
    ///
    /// # Safety
    /// `entry` is free and holds a link.
    unsafe fn next(&self, entry: usize) -> usize;

    /// Stores `next` as the link of free entry `entry`.
    ///
    /// # Safety
    /// `entry` is free: nobody else reads or writes it.
    unsafe fn set_next(&self, entry: usize, next: usize);
}

/// Entries linked through their first word, which must hold a `usize`
/// (any alignment): slab elements and arena blocks, whose handles are
/// their addresses.
pub(crate) struct FirstWord;

// SAFETY: the link is the entry's first word, read back as written.
unsafe impl Links for FirstWord {
    #[inline]
    unsafe fn next(&self, entry: usize) -> usize {
        // SAFETY: the caller's entry is a free block of at least a word.
        unsafe { (entry as *const usize).read_unaligned() }
    }

    #[inline]
    unsafe fn set_next(&self, entry: usize, next: usize) {
        // SAFETY: as above, and nobody else touches the free block.
        unsafe { (entry as *mut usize).write_unaligned(next) }
    }
}

/// The owner's private list of free entries (kept under the owner's lock).
#[derive(Debug)]
pub(crate) struct Chain {
    head: usize,
}

impl Chain {
    pub(crate) const EMPTY: Chain = Chain { head: NIL };
}

impl Default for Chain {
    fn default() -> Self {
        Chain::EMPTY
    }
}

// SAFETY: a chain is only handles; who may touch the entries is the
// owner's lock's business.
unsafe impl Send for Chain {}

impl Chain {
    /// Whether the chain holds no entry.
    pub fn is_empty(&self) -> bool {
        self.head == NIL
    }

    /// Puts a free entry on the chain.
    ///
    /// # Safety
    /// `entry` is free and the owner's.
    pub unsafe fn push(&mut self, links: &impl Links, entry: usize) {
        // SAFETY: the caller's entry is free.
        unsafe { links.set_next(entry, self.head) };
        self.head = entry;
    }

    /// Takes an entry off the chain.
    pub fn pop(&mut self, links: &impl Links) -> Option<usize> {
        let entry = self.head;
        if entry == NIL {
            return None;
        }
        // SAFETY: every entry on a chain is free and holds its link.
        self.head = unsafe { links.next(entry) };
        Some(entry)
    }
}

/// The shared side of a free list: entries released by any thread.
pub(crate) struct FreeList {
    returned: AtomicUsize,
}

impl Default for FreeList {
    fn default() -> Self {
        FreeList {
            returned: AtomicUsize::new(NIL),
        }
    }
}

impl FreeList {
    /// `N` empty lists. An array repeat where it can be: under Miri, `N`
    /// closure calls of `array::from_fn` made every new arena cost
    /// seconds. (loom's atomics have no `const` constructor.)
    pub(crate) fn many<const N: usize>() -> [FreeList; N] {
        #[cfg(not(loom))]
        {
            [const {
                FreeList {
                    returned: AtomicUsize::new(NIL),
                }
            }; N]
        }
        #[cfg(loom)]
        std::array::from_fn(|_| FreeList::default())
    }
}

impl FreeList {
    /// Gives back an entry nobody can reach any more. Lock-free: may run on
    /// any thread, a reader's included.
    ///
    /// # Safety
    /// `entry` is dead (unreachable by readers and writers) and belongs to
    /// the owner whose `links` these are.
    pub unsafe fn release(&self, links: &impl Links, entry: usize) {
        // SAFETY: the caller's; a chain of one entry.
        unsafe { self.release_chain(links, entry, entry) }
    }

    /// Gives back a chain of dead entries, `first` to `last` linked
    /// through `links`, with one atomic update (as
    /// [`release`](Self::release) for each, in one step).
    ///
    /// # Safety
    /// As [`release`](Self::release), for every entry of the chain.
    pub unsafe fn release_chain(&self, links: &impl Links, first: usize, last: usize) {
        let mut head = self.returned.load(Ordering::Relaxed);
        loop {
            // SAFETY: the chain's entries are dead: ours to link.
            unsafe { links.set_next(last, head) };
            // Release: the links (and the entries' last uses) happen
            // before the owner's Acquire swap in `take_all`.
            match self.returned.compare_exchange_weak(
                head,
                first,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Takes every released entry at once (owner only).
    pub fn take_all(&self) -> Chain {
        Chain {
            head: self.returned.swap(NIL, Ordering::Acquire),
        }
    }

    /// An entry for the owner: from its chain, which is refilled with every
    /// released entry when it runs dry; `None` when there are none.
    pub fn take(&self, links: &impl Links, chain: &mut Chain) -> Option<usize> {
        if chain.is_empty() {
            *chain = self.take_all();
        }
        chain.pop(links)
    }

    /// Whether some released entry waits to be taken (for tests).
    #[cfg(test)]
    pub fn has_returned(&self) -> bool {
        self.returned.load(Ordering::Relaxed) != NIL
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Entries `0..n` linked through a table (like route slots).
    struct Table(Vec<std::sync::atomic::AtomicUsize>);

    // SAFETY: a link is read back as stored.
    unsafe impl Links for Table {
        unsafe fn next(&self, entry: usize) -> usize {
            self.0[entry].load(std::sync::atomic::Ordering::Relaxed)
        }
        unsafe fn set_next(&self, entry: usize, next: usize) {
            self.0[entry].store(next, std::sync::atomic::Ordering::Relaxed)
        }
    }

    fn table(n: usize) -> Table {
        Table(
            (0..n)
                .map(|_| std::sync::atomic::AtomicUsize::new(NIL))
                .collect(),
        )
    }

    #[test]
    fn the_owner_takes_its_chain_first_then_everything_released() {
        let links = table(8);
        let list = FreeList::default();
        let mut chain = Chain::default();
        assert_eq!(list.take(&links, &mut chain), None);
        // SAFETY: the entries are ours and free.
        unsafe {
            chain.push(&links, 1);
            list.release(&links, 2);
            list.release(&links, 3);
        }
        assert!(list.has_returned());
        assert_eq!(list.take(&links, &mut chain), Some(1));
        // The chain ran dry: it takes both released ones, newest first.
        assert_eq!(list.take(&links, &mut chain), Some(3));
        assert!(!list.has_returned());
        assert_eq!(list.take(&links, &mut chain), Some(2));
        assert_eq!(list.take(&links, &mut chain), None);
    }

    #[test]
    fn a_released_chain_comes_back_whole_before_what_was_there() {
        let links = table(8);
        let list = FreeList::default();
        // SAFETY: the entries are ours and free; 4 -> 5 -> 6 is linked
        // before it is released.
        unsafe {
            list.release(&links, 1);
            links.set_next(4, 5);
            links.set_next(5, 6);
            list.release_chain(&links, 4, 6);
        }
        let mut chain = Chain::default();
        let taken: Vec<usize> = std::iter::from_fn(|| list.take(&links, &mut chain)).collect();
        assert_eq!(taken, [4, 5, 6, 1]);
    }

    #[test]
    fn first_word_links_unaligned_blocks() {
        let mut bytes = [0u8; 40];
        let base = bytes.as_mut_ptr() as usize;
        let (a, b) = (base + 3, base + 17);
        let list = FreeList::default();
        // SAFETY: both blocks are 8 bytes of `bytes`, free.
        unsafe {
            list.release(&FirstWord, a);
            list.release(&FirstWord, b);
        }
        let mut chain = Chain::default();
        assert_eq!(list.take(&FirstWord, &mut chain), Some(b));
        assert_eq!(list.take(&FirstWord, &mut chain), Some(a));
        assert_eq!(list.take(&FirstWord, &mut chain), None);
    }

    /// Threads releasing while the owner takes: every entry comes back
    /// exactly once.
    #[test]
    fn concurrent_releases_lose_and_duplicate_nothing() {
        let (threads, per) = if cfg!(miri) { (2, 20) } else { (4, 20_000) };
        let links = Arc::new(table(threads * per));
        let list = Arc::new(FreeList::default());
        let releasers: Vec<_> = (0..threads)
            .map(|t| {
                let (links, list) = (Arc::clone(&links), Arc::clone(&list));
                std::thread::spawn(move || {
                    for i in 0..per {
                        // SAFETY: each entry is released once, by one thread.
                        unsafe { list.release(&*links, t * per + i) };
                    }
                })
            })
            .collect();
        let mut seen = vec![false; threads * per];
        let mut chain = Chain::default();
        let mut taken = 0;
        while taken < threads * per {
            match list.take(&*links, &mut chain) {
                Some(e) => {
                    assert!(!seen[e], "entry {e} came back twice");
                    seen[e] = true;
                    taken += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        for r in releasers {
            r.join().unwrap();
        }
        assert_eq!(list.take(&*links, &mut chain), None);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;

    use super::*;

    /// Links in loom-tracked cells, so a link read that races its write is
    /// reported.
    struct Table(Vec<loom::cell::UnsafeCell<usize>>);

    // SAFETY: a link is read back as stored.
    unsafe impl Links for Table {
        unsafe fn next(&self, entry: usize) -> usize {
            // SAFETY: loom checks the access.
            self.0[entry].with(|p| unsafe { *p })
        }
        unsafe fn set_next(&self, entry: usize, next: usize) {
            // SAFETY: loom checks the access.
            self.0[entry].with_mut(|p| unsafe { *p = next })
        }
    }

    /// Two threads release while the owner takes: each entry comes back
    /// exactly once, and no link is read before it was written.
    #[test]
    fn releases_racing_the_owner() {
        loom::model(|| {
            let links = Arc::new(Table(
                (0..3).map(|_| loom::cell::UnsafeCell::new(NIL)).collect(),
            ));
            let list = Arc::new(FreeList::default());
            let threads: Vec<_> = [0usize, 1]
                .into_iter()
                .map(|e| {
                    let (links, list) = (Arc::clone(&links), Arc::clone(&list));
                    loom::thread::spawn(move || {
                        // SAFETY: each entry is released once.
                        unsafe { list.release(&*links, e) }
                    })
                })
                .collect();
            let mut chain = Chain::default();
            // SAFETY: entry 2 is the owner's and free.
            unsafe { chain.push(&*links, 2) };
            let mut seen = [false; 3];
            for _ in 0..2 {
                if let Some(e) = list.take(&*links, &mut chain) {
                    assert!(!seen[e]);
                    seen[e] = true;
                }
            }
            for t in threads {
                t.join().unwrap();
            }
            while let Some(e) = list.take(&*links, &mut chain) {
                assert!(!seen[e]);
                seen[e] = true;
            }
            assert_eq!(seen, [true; 3]);
        });
    }
}
