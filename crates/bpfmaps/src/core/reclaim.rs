//! Memory reclamation: epoch-based, from `crossbeam-epoch`.
//!
//! A reader pins the current epoch (`pin()`), follows pointers, and unpins.
//! A writer that unlinks an element hands it to `Guard::defer_*`; it is
//! freed only after every thread pinned at unlink time has unpinned, so a
//! reader never touches freed memory and never waits for a writer.
//!
//! Why crossbeam-epoch rather than seize: both are well kept; crossbeam's
//! typed pointers and guard-scoped borrows make the lifetime rules visible
//! in signatures, it is the most used reclamation crate in the ecosystem, and
//! its pin is a thread-local counter plus one fence, cheap enough when a
//! caller pins once per batch of lookups (as a BPF program runs under one
//! RCU read section). seize's batched retirement would matter for
//! write-heavy workloads; we can revisit if the benchmarks ask.
//!
//! Large frees go to a background *reaper* thread instead: the epoch
//! collector runs deferred functions on whichever thread happens to collect,
//! and freeing a million-element map there would stall that thread.

use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

/// A pinned epoch: while it lives, nothing a reader reached through a map
/// is freed, so lookups may borrow values in place for its lifetime.
///
/// Only [`pin`] makes one. That is the point of wrapping crossbeam's
/// guard: maps retire memory to crossbeam's default collector, and a
/// guard pinned on another collector protects nothing, so a map must never
/// accept one. The type rules it out, where a check on every lookup would
/// cost time.
///
/// It derefs to the crossbeam guard, for `defer`, `repin` and crossbeam's
/// atomics.
pub struct Guard(crossbeam_epoch::Guard);

/// Pins the current thread's epoch (cheap when it is already pinned: the
/// guards nest).
#[inline]
pub fn pin() -> Guard {
    Guard(crossbeam_epoch::pin())
}

impl Deref for Guard {
    type Target = crossbeam_epoch::Guard;
    #[inline(always)]
    fn deref(&self) -> &crossbeam_epoch::Guard {
        &self.0
    }
}

impl DerefMut for Guard {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut crossbeam_epoch::Guard {
        &mut self.0
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guard { .. }")
    }
}

type Garbage = Box<dyn Send>;

fn reaper() -> &'static Sender<Garbage> {
    static REAPER: OnceLock<Sender<Garbage>> = OnceLock::new();
    REAPER.get_or_init(|| {
        let (tx, rx) = channel::<Garbage>();
        std::thread::Builder::new()
            .name("bpfmaps-reaper".into())
            .spawn(move || {
                for garbage in rx {
                    drop(garbage);
                }
            })
            .expect("spawning the bpfmaps reaper thread");
        tx
    })
}

/// Frees `value` on the background reaper thread, so that the caller (or a
/// reader that happens to run epoch collection) never pays for it.
pub fn drop_in_background<T: Send + 'static>(value: T) {
    if let Err(e) = reaper().send(Box::new(value)) {
        drop(e.0); // reaper gone (process exiting): free here
    }
}

/// Waits for a grace period, as the kernel's `synchronize_rcu()`: every
/// thread pinned when it is called has unpinned by the time it returns,
/// so what was unlinked before the call can be freed on this thread (a
/// bulk free on the caller's own time, never on a reader's). Returns
/// false at once, without waiting, when this thread is pinned itself:
/// its own pin would hold the epoch back for ever.
pub fn synchronize() -> bool {
    if crossbeam_epoch::is_pinned() {
        return false;
    }
    let passed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let passed = passed.clone();
        let guard = pin();
        guard.defer(move || passed.store(true, std::sync::atomic::Ordering::Release));
        guard.flush();
    }
    let mut rounds = 0u32;
    while !passed.load(std::sync::atomic::Ordering::Acquire) {
        pin().flush();
        rounds += 1;
        if rounds < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
    true
}

/// Pushes the epoch along (and gives the reaper time) until `done`, or
/// until a deadline: a minute natively, an hour of Miri's virtual clock,
/// which runs with the interpreted work. Returns `done()`, for the
/// caller's assertion.
#[cfg(test)]
pub(crate) fn wait_for_grace(done: impl Fn() -> bool) -> bool {
    let wait = if cfg!(miri) { 3600 } else { 60 };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    while !done() && std::time::Instant::now() < deadline {
        pin().flush();
        let pause = crate::scaled(1, 50) as u64;
        std::thread::sleep(std::time::Duration::from_millis(pause));
    }
    done()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn background_drop_runs_on_another_thread() {
        let dropped = Arc::new(AtomicBool::new(false));
        drop_in_background(Flag(dropped.clone()));
        // The reaper is shared: other tests may have handed it big maps to
        // free first, so wait as long as it takes, within reason.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if dropped.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("reaper never dropped the value");
    }
}
