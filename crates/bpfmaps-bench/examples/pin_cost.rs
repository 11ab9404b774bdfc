//! What a reader's guard costs: pin and unpin around one atomic load,
//! with `crossbeam-epoch` (what bpfmaps uses, `bpfmaps::pin`) and with
//! `seize` (papaya's reclamation, whose guards pair with `membarrier`),
//! beside the bare load. This is the part of the `maple-kernel` suite's
//! `load` shape (a guard per load, as `mtree_load` takes `rcu_read_lock`)
//! that the node search does not explain (docs/benchmarks.md, "What a
//! guard costs").
//!
//! `cargo run --release -p bpfmaps-bench --example pin_cost [REPS]`:
//! ns per load, the median and range of REPS rounds (default 7), each of
//! 20M loads per guard kind, in turns.

use std::hint::black_box;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Instant;

use seize::Guard as _;

const LOADS: u32 = 20_000_000;

fn time(mut f: impl FnMut() -> u64) -> f64 {
    let started = Instant::now();
    let mut sum = 0u64;
    for _ in 0..LOADS {
        sum = sum.wrapping_add(f());
    }
    black_box(sum);
    started.elapsed().as_nanos() as f64 / f64::from(LOADS)
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .map_or(7, |s| s.parse().expect("REPS"));
    let value = Box::into_raw(Box::new(5u64));
    let slot = AtomicPtr::new(value);
    let collector = seize::Collector::new();
    // SAFETY: `value` is never freed while the loops run (and so below).
    let bare = || unsafe { *black_box(&slot).load(Ordering::Acquire) };
    let crossbeam = || {
        let guard = bpfmaps::pin();
        // SAFETY: as above.
        let v = unsafe { *slot.load(Ordering::Acquire) };
        drop(black_box(guard));
        v
    };
    let seize = || {
        let guard = collector.enter();
        // SAFETY: as above.
        let v = unsafe { *guard.protect(&slot, Ordering::Acquire) };
        drop(black_box(guard));
        v
    };
    let names = [
        "bare load",
        "crossbeam-epoch pin + load",
        "seize enter + protect",
    ];
    let mut ns = vec![Vec::new(); names.len()];
    for _ in 0..reps {
        ns[0].push(time(bare));
        ns[1].push(time(crossbeam));
        ns[2].push(time(seize));
    }
    for (name, t) in names.iter().zip(&mut ns) {
        t.sort_by(f64::total_cmp);
        println!(
            "{name:28} {:6.2} ns  [{:.2}..{:.2}]",
            t[t.len() / 2],
            t[0],
            t[t.len() - 1]
        );
    }
    // SAFETY: made by `Box::into_raw` above; no loop runs any more.
    drop(unsafe { Box::from_raw(value) });
}
