//! Timing helpers: run a batch closure until a time budget is spent, for
//! several repetitions, and summarise the rates.
//!
//! A *batch* is a closure doing a fixed small amount of work (a few hundred
//! operations) and returning how many operations it did. Checking the clock
//! once per batch keeps the timing overhead far below the work measured.
//! Batches should pass their inputs and results through
//! [`std::hint::black_box`] so the work is neither hoisted nor removed.

use std::time::{Duration, Instant};

use crate::stats::Stats;

/// How long and how often to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Timed repetitions.
    pub reps: usize,
    /// Minimum duration of each repetition.
    pub rep_time: Duration,
    /// Untimed warm-up before the first repetition.
    pub warmup: Duration,
}

impl Plan {
    /// A plan with a warm-up of half a repetition.
    pub fn new(reps: usize, rep_time: Duration) -> Plan {
        Plan {
            reps: reps.max(1),
            rep_time,
            warmup: rep_time / 2,
        }
    }

    /// The same plan with each repetition (and warm-up) scaled by `factor`.
    pub fn scaled(self, factor: f64) -> Plan {
        Plan {
            reps: self.reps,
            rep_time: self.rep_time.mul_f64(factor),
            warmup: self.warmup.mul_f64(factor),
        }
    }
}

/// Runs `batch` for at least `time`; returns (operations, elapsed).
pub fn run_for(time: Duration, batch: &mut impl FnMut() -> u64) -> (u64, Duration) {
    let start = Instant::now();
    let mut ops = 0u64;
    loop {
        ops += batch();
        let elapsed = start.elapsed();
        if elapsed >= time {
            return (ops, elapsed);
        }
    }
}

/// Busy-spins the calling thread for `time`, so the first measurement of a
/// run does not pay for the core leaving a low-power state.
pub fn spin(time: Duration) {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < time {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// A thread that reads a buffer of its own, line by line, until dropped:
/// a neighbour taking the shared last-level cache, as another tenant of
/// the VM's host does in a slow window, made on purpose so that a map's
/// sensitivity to it can be measured rather than waited for.
pub struct Neighbour {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Neighbour {
    /// A neighbour reading `mib` MiB round and round (none for 0).
    pub fn reading(mib: usize) -> Neighbour {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let thread = (mib > 0).then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // Written once, so its pages are real; then read a line
                // at a time in order, the stream a copy or a scan makes
                // (prefetched, so it takes lines at the memory's pace).
                let lines = vec![1u64; mib << 17];
                let (mut sum, mut passes) = (0u64, 0);
                while !stop.load(Ordering::Relaxed) {
                    for line in lines.chunks_exact(8) {
                        sum = sum.wrapping_add(line[0]);
                    }
                    passes += 1;
                }
                std::hint::black_box(sum);
                passes
            })
        });
        Neighbour { stop, thread }
    }

    /// Stops the neighbour: the passes it made over its buffer.
    pub fn stop(mut self) -> u64 {
        self.stopped()
    }

    fn stopped(&mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .map_or(0, |t| t.join().expect("the neighbour thread"))
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        self.stopped();
    }
}

/// Waits until bpfmaps' background reaper thread has freed everything
/// handed to it so far (it frees in order), so that a measurement does not
/// share the CPU with freeing a map dropped just before it. First it
/// waits for a grace period on this thread, which runs the epoch
/// garbage queued so far here (crossbeam runs it in later pins, and a
/// load loop of one guard per call would otherwise pay for the nodes an
/// earlier write loop retired: `maple-kernel`'s `load` took 41 ns a load
/// after the store shapes, 17 alone).
pub fn settle_reaper() {
    bpfmaps::core::reclaim::synchronize();
    struct Marker(std::sync::mpsc::Sender<()>);
    impl Drop for Marker {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    bpfmaps::core::reclaim::drop_in_background(Marker(tx));
    let _ = rx.recv_timeout(Duration::from_secs(60));
}

/// CPU time the calling thread has run.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Per-repetition rates in operations per second.
pub fn rate_samples(plan: Plan, mut batch: impl FnMut() -> u64) -> Vec<f64> {
    if !plan.warmup.is_zero() {
        run_for(plan.warmup, &mut batch);
    }
    (0..plan.reps)
        .map(|_| {
            let (ops, elapsed) = run_for(plan.rep_time, &mut batch);
            ops as f64 / elapsed.as_secs_f64()
        })
        .collect()
}

/// Per-loop, per-repetition rates in operations per second for several
/// batch closures timed *in turns*: after each loop's warm-up, every
/// repetition runs each loop once for `plan.rep_time`, so slow drifts in
/// machine load (other jobs on a shared host) fall on all of them alike
/// instead of on whichever ran during the busy seconds. The loop that goes
/// first rotates with the repetition (`r % n`), so none always runs right
/// after the same other one. Each turn starts with an untimed run of a
/// quarter of `plan.rep_time`, so every loop is timed with its own working
/// set in the caches, as in a run of that loop alone, not with the one the
/// loop before it left there. `result[i]` holds loop `i`'s `plan.reps`
/// rates, as [`rate_samples`] returns them for one loop.
pub fn rate_samples_interleaved<B: FnMut() -> u64>(plan: Plan, loops: &mut [B]) -> Vec<Vec<f64>> {
    if !plan.warmup.is_zero() {
        for batch in loops.iter_mut() {
            run_for(plan.warmup, batch);
        }
    }
    in_turns(loops.len(), plan.reps, |i| {
        run_for(plan.rep_time / 4, &mut loops[i]);
        let (ops, elapsed) = run_for(plan.rep_time, &mut loops[i]);
        ops as f64 / elapsed.as_secs_f64()
    })
}

/// Takes `reps` samples of each of `n` implementations *in turns*:
/// repetition `r` samples every implementation once, starting with
/// `r % n`, so that load drifting on the machine falls on all of them
/// alike and none always runs right after the same other one.
/// `result[i]` holds implementation `i`'s samples in order. For
/// measurements that are not a loop of batches (a replay onto a fresh
/// table, a drop, a run of several threads); [`rate_samples_interleaved`]
/// is this for batch loops.
pub fn in_turns(n: usize, reps: usize, mut sample: impl FnMut(usize) -> f64) -> Vec<Vec<f64>> {
    let mut samples = vec![Vec::with_capacity(reps); n];
    for r in 0..reps {
        for k in 0..n {
            let i = (r + k) % n;
            samples[i].push(sample(i));
        }
    }
    samples
}

/// Operations per second: median and spread over the plan's repetitions.
pub fn rate(plan: Plan, batch: impl FnMut() -> u64) -> Stats {
    Stats::from_samples(&rate_samples(plan, batch))
}

/// Nanoseconds per operation: median and spread over repetitions (each
/// repetition's mean time per operation).
pub fn ns_per_op(plan: Plan, batch: impl FnMut() -> u64) -> Stats {
    Stats::inverse_of(&rate_samples(plan, batch), 1e9)
}

/// A batch loop answering `items` in turn, cycling, `BATCH` per call
/// under one guard (as a BPF program's lookups run in one RCU read
/// section); the answers are folded so none is optimised away. For
/// [`rate_samples`] or [`rate_samples_interleaved`].
pub fn answer_loop<'a, T>(
    items: &'a [T],
    answer: impl Fn(&T, &bpfmaps::Guard) -> u32 + 'a,
) -> Box<dyn FnMut() -> u64 + 'a> {
    assert!(!items.is_empty(), "nothing to answer");
    let mut at = 0;
    Box::new(move || {
        let guard = bpfmaps::pin();
        let mut acc = 0u32;
        for _ in 0..crate::suite::BATCH {
            acc ^= answer(&items[at], &guard);
            at = if at + 1 == items.len() { 0 } else { at + 1 };
        }
        std::hint::black_box(acc);
        crate::suite::BATCH as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    #[test]
    fn rate_counts_what_batches_report() {
        let plan = Plan::new(3, Duration::from_millis(5));
        let mut calls = 0u64;
        let s = rate(plan, || {
            calls += 1;
            std::thread::sleep(Duration::from_millis(1));
            black_box(10)
        });
        assert_eq!(s.n, 3);
        // 10 ops per >= 1 ms: at most 10k ops/s.
        assert!(s.median > 0.0 && s.median <= 10_000.0, "{s:?}");
        // At least one batch per repetition and one for the warm-up (a
        // sleep of 1 ms may take longer on a loaded machine, so a 5 ms
        // repetition can hold fewer than 5).
        assert!(calls > 3, "{calls}");
    }

    #[test]
    fn interleaved_rates_take_turns() {
        let plan = Plan::new(4, Duration::from_millis(3));
        // Which loop each batch call was, in order.
        let order = std::cell::RefCell::new(Vec::new());
        let batch = |i: usize, ops: u64, nap: bool| {
            let order = &order;
            move || {
                order.borrow_mut().push(i);
                if nap {
                    std::thread::sleep(Duration::from_millis(1));
                }
                black_box(ops)
            }
        };
        let (mut a, mut b, mut c) = (batch(0, 10, true), batch(1, 20, true), batch(2, 1, false));
        let mut loops: [&mut dyn FnMut() -> u64; 3] = [&mut a, &mut b, &mut c];
        let rates = rate_samples_interleaved(plan, &mut loops);
        assert_eq!(rates.len(), 3);
        for r in &rates {
            assert_eq!(r.len(), 4);
            assert!(r.iter().all(|&x| x > 0.0 && x.is_finite()), "{r:?}");
        }
        // 10 (20) ops per >= 1 ms: at most 10k (20k) ops/s.
        assert!(rates[0].iter().all(|&x| x <= 10_000.0), "{rates:?}");
        assert!(rates[1].iter().all(|&x| x <= 20_000.0), "{rates:?}");
        let mut runs = order.into_inner();
        // At least one batch per repetition and one for the warm-up.
        for i in 0..3 {
            assert!(runs.iter().filter(|&&x| x == i).count() > 4, "{runs:?}");
        }
        // One run per loop for the warm-up, then the reps, rotating which
        // loop goes first.
        runs.dedup();
        assert_eq!(runs, [0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]);
    }

    #[test]
    fn turns_rotate_which_goes_first() {
        let mut order = Vec::new();
        let samples = in_turns(3, 3, |i| {
            order.push(i);
            (order.len() * 10 + i) as f64
        });
        assert_eq!(order, [0, 1, 2, 1, 2, 0, 2, 0, 1]);
        assert_eq!(samples[0], [10.0, 60.0, 80.0]);
        assert_eq!(samples[2], [32.0, 52.0, 72.0]);
        assert!(in_turns(2, 0, |_| 1.0).iter().all(Vec::is_empty));
    }

    #[test]
    fn settling_waits_for_earlier_background_frees() {
        let big = vec![0u8; 1 << 20];
        bpfmaps::core::reclaim::drop_in_background(big);
        settle_reaper();
        settle_reaper(); // and returns when there is nothing to wait for
    }

    #[test]
    fn a_neighbour_reads_until_stopped() {
        let neighbour = Neighbour::reading(1);
        std::thread::sleep(Duration::from_millis(50));
        // A pass over 1 MiB takes tens of microseconds.
        assert!(neighbour.stop() > 0);
        assert_eq!(Neighbour::reading(0).stop(), 0, "none for 0 MiB");
    }

    #[test]
    fn ns_per_op_inverts_the_rate() {
        let plan = Plan::new(2, Duration::from_millis(4));
        let s = ns_per_op(plan, || {
            std::thread::sleep(Duration::from_millis(2));
            1
        });
        assert!(s.median >= 2e6, "{s:?}");
    }
}
