//! Read sections: read-side protection cheaper than an epoch pin, for
//! readers that copy what they read out before they return (the maple
//! tree's [`get`](crate::maple::MapleTree::get), the C library's calls).
//!
//! A reader announces itself in its thread's record (one plain store on
//! entry, one on exit) and then reads. Whoever frees memory such a reader
//! may have reached first waits for a *grace period*: every read section
//! that was open when the memory became unreachable has closed. The wait
//! reads each thread's record; a record that shows a section open is
//! watched until it shows anything else (every section stores a new
//! number, so a thread that opens another at once still lets it go).
//!
//! Why not the epoch pin: on x86 a pin is a locked instruction, which
//! keeps one lookup's cache misses from overlapping the next's (about
//! 4 ns of a maple tree `load`'s 12, docs/benchmarks.md, "What a guard
//! costs"). Here the fence a reader needs between its announcement and
//! its loads is paid by the waiter instead:
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every running
//! thread of the process pass a full barrier, so a reader needs only a
//! compiler fence (the asymmetric fence of liburcu's `urcu-memb`, which
//! is what `rcu_read_lock` costs the kernel's own maple tree harness).
//! Where the call is refused (an old kernel, Miri) readers fence after
//! announcing, and waiters fence too: slower, equally correct.
//!
//! The waits run on bpfmaps' reaper thread, never on the thread that
//! frees: [`free_after`] returns at once, and a free asked for inside a
//! read section cannot wait for itself. Frees asked for while the reaper
//! waits share its next wait, so a writer retiring memory fast costs one
//! wait per batch of frees, not one per free.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, compiler_fence, fence};

use parking_lot::Mutex;

/// One thread's announcement: `IDLE`, or the number of the read section
/// it is in (odd, new for every section). Its own cache line, as it is
/// written by its thread on every section and read by waiters.
#[repr(align(128))]
struct Record {
    section: AtomicU64,
    /// The number the next section gets (odd; written only by the
    /// holder). Kept here, not in the thread, so that a thread taking over
    /// a record goes on from its numbers: a waiter never mistakes a new
    /// section for the one it waits on.
    next: AtomicU64,
    /// Held by a live thread; a finished thread's record is taken over
    /// by the next new thread, so records number at most the threads
    /// that ever ran at once.
    taken: AtomicBool,
}

impl Record {
    /// Announces a read section: a new number in `section`, ordered before
    /// the reader's loads that follow.
    #[inline(always)]
    fn announce(&self) {
        let number = self.next.load(Ordering::Relaxed);
        self.next.store(number.wrapping_add(2), Ordering::Relaxed); // odd, never IDLE
        self.section.store(number, Ordering::Relaxed);
        if ASYMMETRIC.get() == Some(&true) {
            // The waiter's membarrier orders the store before the loads
            // that follow, as a fence here would.
            compiler_fence(Ordering::SeqCst);
        } else {
            // Pairs with the fence in `wait_for_readers`: the two sides
            // of a store-buffering pattern, each fenced.
            fence(Ordering::SeqCst);
        }
    }

    /// Gives the record up (its thread is gone, or its one section is
    /// over).
    fn release(&self) {
        self.section.store(IDLE, Ordering::Release);
        self.taken.store(false, Ordering::Release);
    }
}

const IDLE: u64 = 0;

/// Every record ever made. Records are never freed (leaked, reachable
/// from here), so a waiter may read any of them at any time.
static RECORDS: Mutex<Vec<&'static Record>> = Mutex::new(Vec::new());

/// Whether readers may announce with a plain store: set, once, by
/// [`init`], which whatever readers read calls before a reader can
/// reach it (so every reader that reaches it, and every waiter, sees it).
static ASYMMETRIC: OnceLock<bool> = OnceLock::new();

/// Registers the process for expedited membarriers (once). Call it
/// before publishing anything that readers will read in sections (a
/// maple tree's creation, a C handle's).
pub fn init() {
    ASYMMETRIC.get_or_init(register_membarrier);
}

#[cfg(all(target_os = "linux", not(miri)))]
fn register_membarrier() -> bool {
    // SAFETY: the membarrier syscall takes (cmd, flags, cpu_id) and
    // touches no memory of ours.
    let registered = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        )
    };
    registered == 0 && heavy_barrier_call()
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn register_membarrier() -> bool {
    false
}

/// Makes every running thread of the process pass a full barrier.
#[cfg(all(target_os = "linux", not(miri)))]
fn heavy_barrier_call() -> bool {
    // SAFETY: as in `register_membarrier`.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED,
            0,
            0,
        ) == 0
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn heavy_barrier_call() -> bool {
    false
}

/// The thread's record and its section depth (sections nest: a C call
/// that reads a maple tree; only the outermost announces).
struct Local {
    record: Cell<Option<&'static Record>>,
    depth: Cell<u32>,
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(record) = self.record.get() {
            record.release();
        }
    }
}

thread_local! {
    static LOCAL: Local = const { Local { record: Cell::new(None), depth: Cell::new(0) } };
}

fn take_record() -> &'static Record {
    let mut records = RECORDS.lock();
    for record in records.iter() {
        if !record.taken.load(Ordering::Acquire) {
            record.taken.store(true, Ordering::Release);
            return record;
        }
    }
    let record: &'static Record = Box::leak(Box::new(Record {
        section: AtomicU64::new(IDLE),
        next: AtomicU64::new(1),
        taken: AtomicBool::new(true),
    }));
    records.push(record);
    record
}

/// Runs `f` in a read section: what it reaches is not freed before `f`
/// returns, if its freer goes through [`free_after`] once it is
/// unreachable.
#[inline(always)]
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    let _section = enter();
    f()
}

/// An open read section ([`enter`]); it closes when dropped (also on
/// unwinding). Tied to its thread.
pub struct Section {
    local: Option<&'static Local>,
    /// The record of a section opened without thread-locals.
    own: Option<&'static Record>,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Opens a read section on this thread: until the [`Section`] is
/// dropped, what the thread reaches is not freed, if its freer goes
/// through [`free_after`] once it is unreachable. Sections nest; only
/// the outermost announces (a nested one is protected by it).
///
/// A guard rather than only a closure ([`run`]), so that the thread-local
/// access is all a reader's call inlines: the closure form left the
/// read in a call of its own, its answer returned through memory.
#[inline(always)]
pub fn enter() -> Section {
    // SAFETY: the thread-local lives until the thread's destructors run;
    // `Section` is not `Send`, and one made in a destructor after
    // `LOCAL`'s has run takes the other path (`try_with` fails).
    match LOCAL.try_with(|local| unsafe { &*(local as *const Local) }) {
        Ok(local) => {
            let depth = local.depth.get();
            local.depth.set(depth + 1);
            if depth == 0 {
                local.record().announce();
            }
            Section {
                local: Some(local),
                own: None,
                _not_send: std::marker::PhantomData,
            }
        }
        Err(_) => enter_without_local(),
    }
}

impl Local {
    /// The thread's record, taken on its first section.
    #[inline(always)]
    fn record(&self) -> &'static Record {
        match self.record.get() {
            Some(record) => record,
            None => {
                let record = take_record();
                self.record.set(Some(record));
                record
            }
        }
    }
}

impl Drop for Section {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(local) = self.local {
            let depth = local.depth.get() - 1;
            local.depth.set(depth);
            if depth == 0
                && let Some(record) = local.record.get()
            {
                // Release: the section's reads happen before a waiter
                // that sees the record idle frees what they read.
                record.section.store(IDLE, Ordering::Release);
            }
        } else if let Some(record) = self.own {
            record.release();
        }
    }
}

/// A section on a thread whose thread-locals are gone (a read from
/// another thread-local's destructor): a record of its own for it.
#[cold]
fn enter_without_local() -> Section {
    let record = take_record();
    record.announce();
    Section {
        local: None,
        own: Some(record),
        _not_send: std::marker::PhantomData,
    }
}

/// Waits until every read section open now has closed. Must not be
/// called inside a section (it would wait for itself): the reaper thread
/// runs it.
fn wait_for_readers() {
    let records: Vec<&'static Record> = RECORDS.lock().clone();
    if records.is_empty() {
        // No thread has ever announced; one that does from now on takes
        // the lock after this, so it reads only what is reachable now.
        return;
    }
    if ASYMMETRIC.get() == Some(&true) {
        heavy_barrier_call();
    }
    fence(Ordering::SeqCst);
    for record in records {
        let seen = record.section.load(Ordering::Acquire);
        if seen == IDLE {
            continue;
        }
        let mut rounds = 0u32;
        while record.section.load(Ordering::Acquire) == seen {
            rounds += 1;
            if rounds < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}

/// Frees waiting for the reaper's next wait.
static PENDING: Mutex<Vec<Box<dyn Send>>> = Mutex::new(Vec::new());

/// Frees `value`, already unreachable for new readers, once the read
/// sections open now have closed: on the reaper thread, so that neither
/// the caller nor any reader waits for the wait or the free.
pub fn free_after<T: Send + 'static>(value: T) {
    let mut pending = PENDING.lock();
    let first = pending.is_empty();
    pending.push(Box::new(value));
    drop(pending);
    if first {
        // The reaper takes everything pending when it gets to this, so
        // one wait covers the frees asked for until then.
        crate::core::reclaim::drop_in_background(AfterReaders);
    }
}

/// On the reaper: waits for the readers, then frees what was pending.
struct AfterReaders;

impl Drop for AfterReaders {
    fn drop(&mut self) {
        let pending = std::mem::take(&mut *PENDING.lock());
        if !pending.is_empty() {
            wait_for_readers();
            drop(pending);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    /// A value freed while a call that could reach it is still running
    /// would be a use after free: the free waits for the call.
    #[test]
    fn a_free_waits_for_the_read_sections_open() {
        init();
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let freed = Arc::new(AtomicUsize::new(0));
        let (inside, go_on) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let caller = {
            let (inside, go_on) = (inside.clone(), go_on.clone());
            std::thread::spawn(move || {
                run(|| {
                    inside.store(true, Ordering::SeqCst);
                    while !go_on.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                })
            })
        };
        while !inside.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        free_after(Counted(freed.clone()));
        // Time for the reaper to free it, if it did not wait.
        for _ in 0..if cfg!(miri) { 20 } else { 200 } {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        assert_eq!(
            freed.load(Ordering::SeqCst),
            0,
            "freed during a read section"
        );
        go_on.store(true, Ordering::SeqCst);
        caller.join().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while freed.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(freed.load(Ordering::SeqCst), 1, "never freed");
    }

    /// Sections nest (a C call that reads a maple tree): the outer one
    /// stays announced until it closes.
    #[test]
    fn nested_sections_announce_once() {
        init();
        run(|| {
            let number = LOCAL.with(|l| l.record.get().unwrap().section.load(Ordering::SeqCst));
            assert_ne!(number, IDLE);
            run(|| ());
            let after = LOCAL.with(|l| l.record.get().unwrap().section.load(Ordering::SeqCst));
            assert_eq!(after, number);
        });
        let idle = LOCAL.with(|l| l.record.get().unwrap().section.load(Ordering::SeqCst));
        assert_eq!(idle, IDLE);
    }
}
