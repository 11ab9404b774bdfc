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
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, compiler_fence, fence};

use parking_lot::Mutex;

/// One thread's announcement: a number that goes up by one at each
/// call's start and end, odd while the thread is in a call (so every
/// call has a number of its own, and a closer never mistakes a new call
/// for the one it waits on). Its own cache line, as it is written by its
/// thread on every call and read by closers.
#[repr(align(128))]
struct Record {
    /// Written only by the thread holding the record; a thread taking
    /// the record over goes on from its number.
    call: AtomicU64,
    /// Held by a live thread; a finished thread's record is taken over
    /// by the next new thread, so records number at most the threads
    /// that ever ran at once.
    taken: AtomicBool,
}

impl Record {
    /// Announces a call, `idle` being the record's (even) number now:
    /// the next number, ordered before the caller's next load of a slot.
    #[inline(always)]
    fn announce(&self, idle: u64) {
        self.call.store(idle.wrapping_add(1), Ordering::Relaxed);
        if ASYMMETRIC.load(Ordering::Relaxed) {
            // The closer's membarrier orders the store before the load
            // of the slot that follows, as a fence here would.
            compiler_fence(Ordering::SeqCst);
        } else {
            // Pairs with the fence in `wait_for_calls`: the two sides of
            // a store-buffering pattern, each fenced.
            fence(Ordering::SeqCst);
        }
    }

    /// Ends the call [`announce`](Self::announce) started.
    #[inline(always)]
    fn end(&self) {
        // Only this thread writes the number. Release: the call's reads
        // of the map happen before a closer that sees the record idle
        // frees it.
        let number = self.call.load(Ordering::Relaxed);
        self.call.store(number.wrapping_add(1), Ordering::Release);
    }

    /// Gives the record up (its thread is gone, or its one call is over).
    fn release(&self) {
        self.taken.store(false, Ordering::Release);
    }
}

/// Whether a record's number shows a call.
fn in_call(number: u64) -> bool {
    number & 1 == 1
}

/// Every record ever made. Records are never freed (leaked, reachable
/// from here), so a closer may read any of them at any time.
static RECORDS: Mutex<Vec<&'static Record>> = Mutex::new(Vec::new());

/// Whether readers may announce with a plain store: set, once, by the
/// first handle's creation, before any map is in a slot (so every call
/// that finds a map, and every close, sees it; a reader that saw it
/// unset would only fence when it need not).
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Registers the process for expedited membarriers (once). Called when
/// a handle is made, before its map is published.
pub(crate) fn init() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| ASYMMETRIC.store(register_membarrier(), Ordering::Release));
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

thread_local! {
    /// This thread's record, once it has one. No destructor, so a call
    /// reads it with one load (a thread-local with a destructor checks
    /// its state first).
    static RECORD: Cell<Option<&'static Record>> = const { Cell::new(None) };
    /// Gives the thread's record up when the thread ends; set up with
    /// the record, on the thread's first call.
    static HOLDER: Holder = const { Holder(Cell::new(None)) };
}

/// The record [`RECORD`] names, released when its thread ends.
struct Holder(Cell<Option<&'static Record>>);

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(record) = self.0.take() {
            // A call from a later thread-local destructor must not find
            // a record another thread may have taken over.
            let _ = RECORD.try_with(|r| r.set(None));
            record.release();
        }
    }
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
        call: AtomicU64::new(0),
        taken: AtomicBool::new(true),
    }));
    records.push(record);
    record
}

/// Runs `f` as a call in flight: a map it loads from a slot is not freed
/// before `f` returns, even if its handle is closed meanwhile.
///
/// Calls nest (a [`crate::with_map`] closure may call again): only the
/// outermost announces, and a record that already shows a call is in one.
#[inline(always)]
pub(crate) fn call<R>(f: impl FnOnce() -> R) -> R {
    let Some(record) = RECORD.with(Cell::get).or_else(first_record) else {
        return call_without_local(f);
    };
    let idle = record.call.load(Ordering::Relaxed);
    if in_call(idle) {
        return f();
    }
    record.announce(idle);
    let _exit = Exit(record);
    f()
}

/// Ends the call [`call`] announced when dropped (also on unwinding).
struct Exit(&'static Record);

impl Drop for Exit {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A thread's first call: the thread takes a record for its calls (and
/// its holder, which gives the record up when the thread ends); `None`
/// once the thread's thread-locals are gone.
#[cold]
#[inline(never)]
fn first_record() -> Option<&'static Record> {
    HOLDER
        .try_with(|holder| {
            let record = take_record();
            holder.0.set(Some(record));
            RECORD.with(|r| r.set(Some(record)));
            record
        })
        .ok()
}

/// A call from a thread whose thread-locals are gone (a call from
/// another thread-local's destructor): a record of its own for the call.
#[cold]
#[inline(never)]
fn call_without_local<R>(f: impl FnOnce() -> R) -> R {
    struct Release(&'static Record);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.end();
            self.0.release();
        }
    }
    let record = take_record();
    let idle = record.call.load(Ordering::Relaxed);
    record.announce(idle);
    let _release = Release(record);
    f()
}

/// Waits until every call in flight now has returned. Must not be
/// called inside a call (it would wait for itself): the reaper thread
/// runs it.
fn wait_for_calls() {
    if ASYMMETRIC.load(Ordering::Acquire) {
        heavy_barrier_call();
    }
    fence(Ordering::SeqCst);
    let records: Vec<&'static Record> = RECORDS.lock().clone();
    for record in records {
        let seen = record.call.load(Ordering::Acquire);
        if !in_call(seen) {
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
        let number = || RECORD.with(|r| r.get().unwrap().call.load(Ordering::SeqCst));
        call(|| ());
        let before = number();
        assert!(!in_call(before));
        call(|| {
            let inside = number();
            assert!(in_call(inside));
            assert_ne!(inside, before);
            call(|| ());
            assert_eq!(number(), inside, "a nested call ended the outer one");
        });
        let after = number();
        assert!(!in_call(after));
        assert_ne!(after, before, "two calls, one number");
    }
}
