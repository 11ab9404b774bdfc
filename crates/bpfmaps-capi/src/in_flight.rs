//! Calls in flight, and the wait for them that lets a closed handle's
//! map be freed: the C library's own read-side protection, cheaper than
//! an epoch pin.
//!
//! A call announces itself in its thread's record (one plain store on
//! entry, one on exit) and then loads its map from the handle's slot. A
//! close empties the slot and, before the map is freed, waits for a
//! *grace period*: every call that was in flight when the slot emptied
//! has returned. It reads each thread's record; a record that shows a
//! call is watched until it shows anything else (every call stores a new
//! number, so a thread that calls again at once still lets it go).
//!
//! Why not the maps' epoch pin: on x86 a pin is a locked instruction,
//! which keeps one lookup's cache misses from overlapping the next's, and
//! the C call paid it where `Map::lookup` from Rust does not (the hash
//! maps read without a pin): about a third of what the call added
//! (`capi` benchmark, docs/benchmarks.md). Here the fence a reader needs
//! between its announcement and its load is paid by the closer instead:
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every running
//! thread of the process pass a full barrier, so a reader needs only a
//! compiler fence (the asymmetric fence of liburcu's `urcu-memb`, which
//! is what `rcu_read_lock` costs the kernel's own maple tree harness).
//! Where the call is refused (an old kernel, Miri) readers fence after
//! announcing, and closers fence too: slower, equally correct.
//!
//! The closer's wait runs on bpfmaps' reaper thread, never on the thread
//! that closes: a close returns at once, and a close made inside a call
//! (from [`crate::with_map`]'s closure) cannot wait for itself.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, compiler_fence, fence};

use parking_lot::Mutex;

/// One thread's announcement: `IDLE`, or the number of the call it is
/// in (odd, new for every call). Its own cache line, as it is written by
/// its thread on every call and read by closers.
#[repr(align(128))]
struct Record {
    call: AtomicU64,
    /// The number the next call gets (odd; written only by the holder).
    /// Kept here, not in the thread, so that a thread taking over a
    /// record goes on from its numbers: a closer never mistakes a new
    /// call for the one it waits on.
    next: AtomicU64,
    /// Held by a live thread; a finished thread's record is taken over
    /// by the next new thread, so records number at most the threads
    /// that ever ran at once.
    taken: AtomicBool,
}

impl Record {
    /// Announces a call: a new number in `call`, ordered before the
    /// caller's next load of a slot.
    #[inline(always)]
    fn announce(&self) {
        let number = self.next.load(Ordering::Relaxed);
        self.next.store(number.wrapping_add(2), Ordering::Relaxed); // odd, never IDLE
        self.call.store(number, Ordering::Relaxed);
        if ASYMMETRIC.get() == Some(&true) {
            // The closer's membarrier orders the store before the load
            // of the slot that follows, as a fence here would.
            compiler_fence(Ordering::SeqCst);
        } else {
            // Pairs with the fence in `wait_for_calls`: the two sides of
            // a store-buffering pattern, each fenced.
            fence(Ordering::SeqCst);
        }
    }

    /// Gives the record up (its thread is gone, or its one call is over).
    fn release(&self) {
        self.call.store(IDLE, Ordering::Release);
        self.taken.store(false, Ordering::Release);
    }
}

const IDLE: u64 = 0;

/// Every record ever made. Records are never freed (leaked, reachable
/// from here), so a closer may read any of them at any time.
static RECORDS: Mutex<Vec<&'static Record>> = Mutex::new(Vec::new());

/// Whether readers may announce with a plain store: set, once, by the
/// first handle's creation, before any map is in a slot (so every call
/// that finds a map, and every close, sees it).
static ASYMMETRIC: OnceLock<bool> = OnceLock::new();

/// Registers the process for expedited membarriers (once). Called when
/// a handle is made, before its map is published.
pub(crate) fn init() {
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

/// The thread's record and its call depth (calls nest through
/// `with_map`; only the outermost announces).
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
        call: AtomicU64::new(IDLE),
        next: AtomicU64::new(1),
        taken: AtomicBool::new(true),
    }));
    records.push(record);
    record
}

/// Runs `f` as a call in flight: a map it loads from a slot is not freed
/// before `f` returns, even if its handle is closed meanwhile.
#[inline(always)]
pub(crate) fn call<R>(f: impl FnOnce() -> R) -> R {
    let mut f = Some(f);
    // One thread-local access for the call's entry and exit.
    let done = LOCAL.try_with(|local| {
        enter(local);
        let _exit = Exit(local);
        f.take().expect("not run yet")()
    });
    match done {
        Ok(r) => r,
        Err(_) => call_without_local(f.take().expect("not run: no thread-locals")),
    }
}

/// Starts a call on this thread; only the outermost announces (a nested
/// one is protected by it).
#[inline(always)]
fn enter(local: &Local) {
    let depth = local.depth.get();
    local.depth.set(depth + 1);
    if depth > 0 {
        return;
    }
    let record = match local.record.get() {
        Some(record) => record,
        None => {
            let record = take_record();
            local.record.set(Some(record));
            record
        }
    };
    record.announce();
}

/// Ends the call [`enter`] started when dropped (also on unwinding).
struct Exit<'a>(&'a Local);

impl Drop for Exit<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let depth = self.0.depth.get() - 1;
        self.0.depth.set(depth);
        if depth == 0
            && let Some(record) = self.0.record.get()
        {
            // Release: the call's reads of the map happen before a
            // closer that sees the record idle frees it.
            record.call.store(IDLE, Ordering::Release);
        }
    }
}

/// A call from a thread whose thread-locals are gone (a call from
/// another thread-local's destructor): a record of its own for the call.
#[cold]
fn call_without_local<R>(f: impl FnOnce() -> R) -> R {
    struct Release(&'static Record);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.release();
        }
    }
    let record = take_record();
    record.announce();
    let _release = Release(record);
    f()
}

/// Waits until every call in flight now has returned. Must not be
/// called inside a call (it would wait for itself): the reaper thread
/// runs it.
fn wait_for_calls() {
    if ASYMMETRIC.get() == Some(&true) {
        heavy_barrier_call();
    }
    fence(Ordering::SeqCst);
    let records: Vec<&'static Record> = RECORDS.lock().clone();
    for record in records {
        let seen = record.call.load(Ordering::Acquire);
        if seen == IDLE {
            continue;
        }
        let mut rounds = 0u32;
        while record.call.load(Ordering::Acquire) == seen {
            rounds += 1;
            if rounds < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}

/// Frees `value`, taken out of its slot, once the calls in flight have
/// returned: on the reaper thread, so that neither the closer nor any
/// call waits for the wait or the free.
pub(crate) fn free_after_calls<T: Send + 'static>(value: T) {
    struct AfterCalls<T>(T);
    impl<T> Drop for AfterCalls<T> {
        fn drop(&mut self) {
            wait_for_calls();
            // then `self.0` drops
        }
    }
    bpfmaps::core::reclaim::drop_in_background(AfterCalls(value));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    /// A value freed while a call that could reach it is still running
    /// would be a use after free: the free waits for the call.
    #[test]
    fn a_free_waits_for_the_calls_in_flight() {
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
                call(|| {
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
        free_after_calls(Counted(freed.clone()));
        // Time for the reaper to free it, if it did not wait.
        for _ in 0..if cfg!(miri) { 20 } else { 200 } {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        assert_eq!(freed.load(Ordering::SeqCst), 0, "freed during a call");
        go_on.store(true, Ordering::SeqCst);
        caller.join().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while freed.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(freed.load(Ordering::SeqCst), 1, "never freed");
    }

    /// Calls nest (a `with_map` closure that calls again): the outer
    /// call stays announced until it returns.
    #[test]
    fn nested_calls_announce_once() {
        init();
        call(|| {
            let number = LOCAL.with(|l| l.record.get().unwrap().call.load(Ordering::SeqCst));
            assert_ne!(number, IDLE);
            call(|| ());
            let after = LOCAL.with(|l| l.record.get().unwrap().call.load(Ordering::SeqCst));
            assert_eq!(after, number);
        });
        let idle = LOCAL.with(|l| l.record.get().unwrap().call.load(Ordering::SeqCst));
        assert_eq!(idle, IDLE);
    }
}
