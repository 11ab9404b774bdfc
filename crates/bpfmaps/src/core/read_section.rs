//! Read sections: read-side protection cheaper than an epoch pin, for
//! readers that copy what they read out before they return (the maple
//! tree's [`get`](crate::maple::MapleTree::get) and
//! [`find_cloned`](crate::maple::MapleTree::find_cloned), the C
//! library's calls, which find their map in a handle's slot).
//!
//! A reader announces itself in its thread's record (one plain store on
//! entry, one on exit) and then reads. Whoever frees memory such a reader
//! may have reached first waits for a *grace period*: every read section
//! that was open when the memory became unreachable has closed. The wait
//! reads each thread's record; a record that shows a section open is
//! watched until it shows anything else (every section has a number of
//! its own, so a thread that opens another at once still lets it go).
//!
//! Why not the epoch pin: on x86 a pin is a locked instruction, 5.7 ns
//! of a maple tree `load`'s 15 on an AMD EPYC VM (docs/benchmarks.md,
//! "What a guard costs"). Here the fence a reader needs between its
//! announcement and its loads is paid by the freer instead:
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every running
//! thread of the process pass a full barrier, so a reader needs only a
//! compiler fence (the asymmetric fence of liburcu's `urcu-memb`, which
//! is what `rcu_read_lock` costs the kernel's own maple tree harness).
//! Where the call is refused (an old kernel, Miri) readers fence after
//! announcing, and freers fence too: slower, equally correct.
//!
//! What a free costs the writer, who frees after crossbeam's grace
//! period ([`free_after`] from a deferred call):
//! - no other thread has ever read in a section (or every one that did
//!   has ended): nothing, the free runs at once, as before sections;
//! - other threads have: the free is parked until 64 share one
//!   `membarrier` and one look at the records (a barrier interrupts
//!   every running reader), then runs at once if none is in a section;
//!   frees still parked a millisecond later go to the reaper;
//! - one is: the frees go to bpfmaps' reaper thread, which waits for
//!   it, so neither the writer nor any reader waits. Frees asked for
//!   while the reaper waits share its next wait.
//!
//! (The thirty-second session sent every free through the reaper, and
//! copy-on-write stores took 1.5-2.3x as long: the blocks came back on
//! another core, docs/benchmarks.md, "Loads in a read section".)

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, compiler_fence, fence};

use parking_lot::Mutex;

use super::reclaim::drop_in_background;

/// One thread's announcement: a number that goes up by one at each
/// section's start and end, odd while the thread is in a section (so
/// every section has a number of its own, and a waiter never mistakes a
/// new section for the one it waits on). Its own cache line, as it is
/// written by its thread on every section and read by freers.
#[repr(align(128))]
struct Record {
    /// Written only by the thread holding the record; a thread taking
    /// the record over goes on from its number.
    section: AtomicU64,
    /// Held by a live thread; a finished thread's record is taken over
    /// by the next new thread, so records number at most the threads
    /// that ever ran at once.
    taken: AtomicBool,
}

impl Record {
    /// Announces a section, `idle` being the record's (even) number now:
    /// the next number, ordered before the reader's loads that follow.
    #[inline(always)]
    fn announce(&self, idle: u64) {
        self.section.store(idle.wrapping_add(1), Ordering::Relaxed);
        if ASYMMETRIC.load(Ordering::Relaxed) {
            // The freer's membarrier orders the store before the loads
            // that follow, as a fence here would.
            compiler_fence(Ordering::SeqCst);
        } else {
            // Pairs with the fences in `others_idle_after_barrier` and
            // `wait_for_readers`: the two sides of a store-buffering
            // pattern, each fenced.
            fence(Ordering::SeqCst);
        }
    }

    /// Ends the section [`announce`](Self::announce) started.
    #[inline(always)]
    fn end(&self) {
        // Only this thread writes the number. Release: the section's
        // reads happen before a freer that sees the record idle frees
        // what they read.
        let number = self.section.load(Ordering::Relaxed);
        self.section
            .store(number.wrapping_add(1), Ordering::Release);
    }

    /// Gives the record up (its thread is gone, or its one section is
    /// over).
    fn release(&self) {
        TAKEN.fetch_sub(1, Ordering::SeqCst);
        self.taken.store(false, Ordering::Release);
    }
}

/// Whether a record's number shows a section.
fn in_section(number: u64) -> bool {
    number & 1 == 1
}

/// Every record ever made. Records are never freed (leaked, reachable
/// from here), so a freer may read any of them at any time.
static RECORDS: Mutex<Vec<&'static Record>> = Mutex::new(Vec::new());

/// Records held by live threads: while it is 0 (or 1, this thread's),
/// no other thread can be in a section, and a free needs no barrier.
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// Whether readers may announce with a plain store: set, once, by
/// [`init`], which whatever readers read calls before a reader can reach
/// it (so every reader that reaches it, and every freer, sees it; a
/// reader that saw it unset would only fence when it need not).
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Registers the process for expedited membarriers (once). Call it
/// before publishing anything that readers will read in sections (a
/// maple tree's creation, a C handle's).
pub fn init() {
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
    /// This thread's record, once it has one. No destructor, so a
    /// section reads it with one load (a thread-local with a destructor
    /// checks its state first).
    static RECORD: Cell<Option<&'static Record>> = const { Cell::new(None) };
    /// Gives the thread's record up when the thread ends; set up with
    /// the record, on the thread's first section.
    static HOLDER: Holder = const { Holder(Cell::new(None)) };
}

/// The record [`RECORD`] names, released when its thread ends.
struct Holder(Cell<Option<&'static Record>>);

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(record) = self.0.take() {
            // A section from a later thread-local destructor must not
            // find a record another thread may have taken over.
            let _ = RECORD.try_with(|r| r.set(None));
            record.release();
        }
    }
}

fn take_record() -> &'static Record {
    let mut records = RECORDS.lock();
    // Counted before the record shows a section, and fenced: a freer
    // that reads the count after its own fence either sees this thread
    // or is seen by its loads (it unlinked before it read the count).
    TAKEN.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    for record in records.iter() {
        if !record.taken.load(Ordering::Acquire) {
            record.taken.store(true, Ordering::Release);
            return record;
        }
    }
    let record: &'static Record = Box::leak(Box::new(Record {
        section: AtomicU64::new(0),
        taken: AtomicBool::new(true),
    }));
    records.push(record);
    record
}

/// An open read section ([`enter`]); it closes when dropped (also on
/// unwinding). Tied to its thread.
pub struct Section {
    /// The record this section announced in (`None` for a nested
    /// section: the outer one protects it).
    record: Option<&'static Record>,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Opens a read section on this thread: until the [`Section`] is
/// dropped, what the thread reaches is not freed, if its freer goes
/// through [`free_after`] once it is unreachable. Sections nest; only
/// the outermost announces (a record that already shows a section is in
/// one).
#[inline(always)]
pub fn enter() -> Section {
    let Some(record) = thread_record() else {
        return enter_without_local();
    };
    let idle = record.section.load(Ordering::Relaxed);
    if in_section(idle) {
        return Section {
            record: None,
            _not_send: std::marker::PhantomData,
        };
    }
    record.announce(idle);
    Section {
        record: Some(record),
        _not_send: std::marker::PhantomData,
    }
}

/// Runs `f` in a read section, as [`enter`] does: the closure form, for
/// a caller whose whole call is the section (the C library's calls).
/// A nested section runs `f` alone, and the outermost closes on one
/// path: 10 instructions fewer a C lookup than the guard's `Option`
/// (callgrind, `capi_lookup_once`: 59 a lookup added to `Map::lookup`'s
/// against 69).
#[inline(always)]
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    let Some(record) = thread_record() else {
        let _section = enter_without_local();
        return f();
    };
    let idle = record.section.load(Ordering::Relaxed);
    if in_section(idle) {
        return f();
    }
    record.announce(idle);
    let _exit = Exit(record);
    f()
}

/// Closes the section [`run`] opened when dropped (also on unwinding).
struct Exit(&'static Record);

impl Drop for Exit {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.end();
    }
}

impl Drop for Section {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(record) = self.record {
            record.end();
        }
    }
}

/// This thread's record (taken on its first section); `None` once its
/// thread-locals are gone.
#[inline(always)]
fn thread_record() -> Option<&'static Record> {
    RECORD.with(Cell::get).or_else(first_record)
}

/// A thread's first section: the thread takes a record (and its holder,
/// which gives the record up when the thread ends); `None` once the
/// thread's thread-locals are gone.
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

/// Records for sections on threads whose thread-locals are gone (a read
/// from another thread-local's destructor): claimed under this lock by
/// whichever such section finds one idle, and never given up, so that a
/// section's close is one store on every path. (A process that ever
/// reads so keeps its frees on the barrier path: a rare case.)
static SOLO: Mutex<Vec<&'static Record>> = Mutex::new(Vec::new());

/// A section on a thread whose thread-locals are gone: an idle solo
/// record, or a new one.
#[cold]
#[inline(never)]
fn enter_without_local() -> Section {
    let mut solo = SOLO.lock();
    // Idle: its last section has closed (only its holder writes it, and
    // holders claim under this lock).
    let idle = solo
        .iter()
        .copied()
        .find(|r| !in_section(r.section.load(Ordering::Acquire)));
    let record = idle.unwrap_or_else(|| {
        let record = take_record();
        solo.push(record);
        record
    });
    record.announce(record.section.load(Ordering::Relaxed));
    Section {
        record: Some(record),
        _not_send: std::marker::PhantomData,
    }
}

/// This thread's record, if it has one, and whether it is in a section.
fn own_record() -> (Option<&'static Record>, bool) {
    let record = RECORD.try_with(Cell::get).ok().flatten();
    let inside = record.is_some_and(|r| in_section(r.section.load(Ordering::Relaxed)));
    (record, inside)
}

/// Whether no other thread holds a record, so none can be in a section
/// that began before the caller's last unlink.
fn no_other_records(own: Option<&'static Record>) -> bool {
    // Pairs with the fence in `take_record`.
    fence(Ordering::SeqCst);
    TAKEN.load(Ordering::SeqCst) <= usize::from(own.is_some())
}

/// Whether, after a barrier on every running thread, no record but this
/// thread's (`own`, not in a section) shows a section: none open now
/// began before the caller's last unlink.
fn others_idle_after_barrier(own: Option<&'static Record>) -> bool {
    reader_fences();
    let records = RECORDS.lock();
    records.iter().all(|r| {
        own.is_some_and(|o| std::ptr::eq(o, *r)) || !in_section(r.section.load(Ordering::Acquire))
    })
}

/// The freer's side of the readers' fence: a barrier on every running
/// thread (or, where readers fence themselves, this thread's fence), so
/// that a record read after it shows any section whose loads could have
/// missed the caller's unlink.
fn reader_fences() {
    if ASYMMETRIC.load(Ordering::Acquire) {
        heavy_barrier_call();
    }
    fence(Ordering::SeqCst);
}

/// Waits until every read section open now has closed. Must not be
/// called inside a section (it would wait for itself): the reaper thread
/// runs it.
fn wait_for_readers() {
    reader_fences();
    let records: Vec<&'static Record> = RECORDS.lock().clone();
    for record in records {
        let seen = record.section.load(Ordering::Acquire);
        if !in_section(seen) {
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

/// Frees `value`, already unreachable for new readers, once the read
/// sections open now have closed: at once on this thread when no other
/// thread holds a record; else parked, and freed on this thread once 64
/// frees (`PARK_BATCH`) share one barrier and none of the sections it
/// shows is open (or on the reaper after its wait when one is, or after
/// a millisecond, `LATE_LOOK`, when no more frees come). For small frees
/// (a batch of blocks, a leaf): a big one would stall the caller.
pub fn free_after<T: Send + 'static>(value: T) {
    let (own, inside) = own_record();
    if inside {
        // This thread may be reading what it frees.
        free_on_reaper_after_readers(Box::new(value));
    } else if no_other_records(own) {
        drop(value);
    } else {
        park(Box::new(value), own);
    }
}

/// [`free_after`] for a big free (a subtree, a closed C handle's map):
/// always on the reaper thread, so that neither the caller nor any
/// reader waits for it.
pub fn free_after_in_background<T: Send + 'static>(value: T) {
    let (own, inside) = own_record();
    if !inside && no_other_records(own) {
        drop_in_background(value);
    } else {
        free_on_reaper_after_readers(Box::new(value));
    }
}

/// Frees that share one barrier: a `membarrier` interrupts every
/// running thread of the process (readers included: on this VM, one a
/// retired batch cut the readers' loads by a fifth to a half,
/// docs/benchmarks.md, "Loads in a read section, again").
const PARK_BATCH: usize = 64;

/// How long parked frees wait for more before the reaper frees them.
const LATE_LOOK: std::time::Duration = std::time::Duration::from_millis(1);

/// Frees parked for a shared barrier, and whether the reaper has been
/// asked for a late look at them.
struct Parked {
    frees: Vec<Box<dyn Send>>,
    late_look_asked: bool,
}

static PARKED: Mutex<Parked> = Mutex::new(Parked {
    frees: Vec::new(),
    late_look_asked: false,
});

fn park(value: Box<dyn Send>, own: Option<&'static Record>) {
    let mut parked = PARKED.lock();
    parked.frees.push(value);
    if parked.frees.len() >= PARK_BATCH {
        let frees = std::mem::take(&mut parked.frees);
        drop(parked);
        if others_idle_after_barrier(own) {
            drop(frees);
        } else {
            free_on_reaper_after_readers(Box::new(frees));
        }
    } else if !parked.late_look_asked {
        parked.late_look_asked = true;
        drop(parked);
        drop_in_background(LateLook);
    }
}

/// On the reaper: after [`LATE_LOOK`], the frees still parked are freed
/// after a wait for the readers, so none is held for ever.
struct LateLook;

impl Drop for LateLook {
    fn drop(&mut self) {
        std::thread::sleep(LATE_LOOK);
        let frees = {
            let mut parked = PARKED.lock();
            parked.late_look_asked = false;
            std::mem::take(&mut parked.frees)
        };
        if !frees.is_empty() {
            wait_for_readers();
            drop(frees);
        }
    }
}

/// Frees waiting for the reaper's next wait.
static PENDING: Mutex<Vec<Box<dyn Send>>> = Mutex::new(Vec::new());

fn free_on_reaper_after_readers(value: Box<dyn Send>) {
    let mut pending = PENDING.lock();
    let first = pending.is_empty();
    pending.push(value);
    drop(pending);
    if first {
        // The reaper takes everything pending when it gets to this, so
        // one wait covers the frees asked for until then.
        drop_in_background(AfterReaders);
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

    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A thread holding a record (in a section if `inside`) until the
    /// returned flag is set; returns once it holds it.
    fn reader_holding(inside: bool) -> (std::thread::JoinHandle<()>, Arc<AtomicBool>) {
        let (holding, go_on) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let reader = {
            let (holding, go_on) = (holding.clone(), go_on.clone());
            std::thread::spawn(move || {
                let section = enter();
                if !inside {
                    drop(section);
                }
                holding.store(true, Ordering::SeqCst);
                while !go_on.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
            })
        };
        while !holding.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        (reader, go_on)
    }

    /// A value freed while a section that could reach it is still open
    /// would be a use after free: the free waits for the section, in
    /// both forms, alone (parked, then the reaper's late look) and with
    /// a batch that shares a barrier.
    #[test]
    fn a_free_waits_for_the_read_sections_open() {
        init();
        for (background, frees) in [(false, 1), (false, PARK_BATCH), (true, 1)] {
            let freed = Arc::new(AtomicUsize::new(0));
            let (reader, go_on) = reader_holding(true);
            for _ in 0..frees {
                let value = Counted(freed.clone());
                if background {
                    free_after_in_background(value);
                } else {
                    free_after(value);
                }
            }
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
            reader.join().unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while freed.load(Ordering::SeqCst) < frees && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            assert_eq!(freed.load(Ordering::SeqCst), frees, "never freed");
        }
    }

    /// With another thread holding a record but in no section, a parked
    /// free is freed without any later free to push it out.
    #[test]
    fn a_parked_free_is_freed_without_more_frees() {
        init();
        let freed = Arc::new(AtomicUsize::new(0));
        let (reader, go_on) = reader_holding(false);
        free_after(Counted(freed.clone()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while freed.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(freed.load(Ordering::SeqCst), 1, "a parked free was held");
        go_on.store(true, Ordering::SeqCst);
        reader.join().unwrap();
    }

    /// A free asked for inside this thread's own section waits for it
    /// (the section may be reading what is freed).
    #[test]
    fn a_free_inside_a_section_waits_for_it() {
        init();
        let freed = Arc::new(AtomicUsize::new(0));
        {
            let _section = enter();
            free_after(Counted(freed.clone()));
            std::thread::sleep(std::time::Duration::from_millis(if cfg!(miri) {
                2
            } else {
                20
            }));
            assert_eq!(freed.load(Ordering::SeqCst), 0, "freed inside the section");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while freed.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(freed.load(Ordering::SeqCst), 1, "never freed");
    }

    /// Sections nest, in both forms: the outer one stays announced until
    /// it closes, and every section gets a number of its own.
    #[test]
    fn nested_sections_announce_once() {
        init();
        let number = || RECORD.with(|r| r.get().unwrap().section.load(Ordering::SeqCst));
        drop(enter());
        for closure in [false, true] {
            let before = number();
            assert!(!in_section(before));
            let outer = || {
                let inside = number();
                assert!(in_section(inside));
                assert_ne!(inside, before);
                drop(enter());
                run(|| ());
                assert_eq!(number(), inside, "a nested section ended the outer one");
            };
            if closure {
                run(outer);
            } else {
                let _outer = enter();
                outer();
            }
            let after = number();
            assert!(!in_section(after));
            assert_ne!(after, before, "two sections, one number");
        }
    }
}
