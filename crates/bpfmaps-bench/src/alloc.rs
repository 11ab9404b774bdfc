//! A counting global allocator: memory numbers are measured, not estimated.
//!
//! [`CountingAlloc`] wraps [`Under`] (the system's allocator unless the
//! `mimalloc` feature is on) and keeps two counters:
//! - the process-wide bytes currently allocated ([`current`]), one relaxed
//!   atomic add per allocation and per free;
//! - the *calling thread's* net bytes (allocated minus freed by this
//!   thread), a plain thread-local cell.
//!
//! [`MemProbe`] reports the thread-local difference. That is what a suite
//! wants for "bytes held after building": bpfmaps frees dropped maps on a
//! background thread, so a process-wide difference taken while an earlier
//! map is still being freed would be too small, even negative. The cost of
//! the thread view: memory a structure allocates on *other* threads is not
//! seen (none of the structures benchmarked here do so while being built).
//!
//! Sizes are the bytes requested (`Layout::size`); malloc's own headers
//! and rounding are not included.
//!
//! Under it, the system's allocator (glibc's `malloc` on Linux), or with
//! the crate's `mimalloc` feature, mimalloc: a map's updates allocate and
//! free as they run, and what the allocator costs them is part of what a
//! user sees, so the allocator is a condition a figure names
//! (docs/benchmarks.md, "The allocator's share of an update").

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The allocator: [`Under`] plus byte counters.
pub struct CountingAlloc;

/// The allocator under the counters: mimalloc (the `mimalloc` feature).
#[cfg(feature = "mimalloc")]
pub use mimalloc::MiMalloc as Under;
/// The allocator under the counters: the system's.
#[cfg(not(feature = "mimalloc"))]
pub use std::alloc::System as Under;

/// Which allocator [`Under`] is, for the report's machine table and the
/// examples' output.
pub const UNDER: &str = if cfg!(feature = "mimalloc") {
    "mimalloc (the `mimalloc` feature)"
} else {
    "system malloc"
};

/// Installed for the whole binary (and this crate's tests).
#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

static CURRENT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialised and without a destructor: using it from inside the
    // allocator neither allocates nor fails during thread teardown.
    static THREAD_NET: Cell<isize> = const { Cell::new(0) };
}

#[inline]
fn on_alloc(size: usize) {
    CURRENT.fetch_add(size, Ordering::Relaxed);
    let _ = THREAD_NET.try_with(|c| c.set(c.get().wrapping_add(size as isize)));
}

#[inline]
fn on_free(size: usize) {
    CURRENT.fetch_sub(size, Ordering::Relaxed);
    let _ = THREAD_NET.try_with(|c| c.set(c.get().wrapping_sub(size as isize)));
}

// SAFETY: every method forwards to `Under` with the caller's arguments
// unchanged, so its guarantees carry over; the counters only observe.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        let p = unsafe { Under.alloc(layout) };
        if !p.is_null() {
            on_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { Under.alloc_zeroed(layout) };
        if !p.is_null() {
            on_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (hence from `Under`) with
        // `layout`, as the caller guarantees.
        unsafe { Under.dealloc(ptr, layout) };
        on_free(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        let p = unsafe { Under.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            on_free(layout.size());
            on_alloc(new_size);
        }
        p
    }
}

/// Bytes currently allocated by the whole process.
pub fn current() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// Net bytes allocated by the calling thread since it started.
pub fn thread_net() -> isize {
    THREAD_NET.with(Cell::get)
}

/// Measures the bytes the calling thread holds between two points.
///
/// ```
/// let probe = bpfmaps_bench::alloc::MemProbe::start();
/// let v = vec![0u8; 1 << 20];
/// assert!(probe.held() >= 1 << 20);
/// drop(v);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MemProbe {
    thread_start: isize,
}

impl MemProbe {
    /// Starts measuring now.
    pub fn start() -> Self {
        MemProbe {
            thread_start: thread_net(),
        }
    }

    /// Bytes allocated and not freed by this thread since [`start`](Self::start)
    /// (0 if it freed more than it allocated).
    pub fn held(&self) -> usize {
        thread_net().saturating_sub(self.thread_start).max(0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    #[test]
    fn counts_allocations_and_frees() {
        let probe = MemProbe::start();
        let v: Vec<u8> = black_box(Vec::with_capacity(3 << 20));
        let held = probe.held();
        assert!(
            (3 << 20..(3 << 20) + 4096).contains(&held),
            "held {held} for a 3 MiB vector"
        );
        assert!(current() >= 3 << 20);
        drop(v);
        assert!(probe.held() < 4096, "after drop: {}", probe.held());
    }

    #[test]
    fn counts_reallocation() {
        let probe = MemProbe::start();
        let mut v: Vec<u64> = Vec::with_capacity(16);
        v.extend(0..100_000u64);
        let held = probe.held();
        assert!(held >= 800_000, "held {held}");
        drop(black_box(v));
        assert!(probe.held() < 4096);
    }

    #[test]
    fn other_threads_do_not_disturb_the_probe() {
        let probe = MemProbe::start();
        let kept = std::thread::spawn(|| vec![1u8; 1 << 20]).join().unwrap();
        // Allocated on the other thread: not ours.
        assert!(probe.held() < 4096);
        drop(kept);
    }
}
