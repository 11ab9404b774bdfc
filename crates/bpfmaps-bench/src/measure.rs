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

/// Waits until bpfmaps' background reaper thread has freed everything
/// handed to it so far (it frees in order), so that a measurement does not
/// share the CPU with freeing a map dropped just before it.
pub fn settle_reaper() {
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

/// Operations per second, mean ± stddev over the plan's repetitions.
pub fn rate(plan: Plan, batch: impl FnMut() -> u64) -> Stats {
    Stats::from_samples(&rate_samples(plan, batch))
}

/// Nanoseconds per operation, mean ± stddev over repetitions (each
/// repetition's mean time per operation).
pub fn ns_per_op(plan: Plan, batch: impl FnMut() -> u64) -> Stats {
    Stats::inverse_of(&rate_samples(plan, batch), 1e9)
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
        assert!(s.mean > 0.0 && s.mean <= 10_000.0, "{s:?}");
        assert!(calls >= 3 * 5);
    }

    #[test]
    fn settling_waits_for_earlier_background_frees() {
        let big = vec![0u8; 1 << 20];
        bpfmaps::core::reclaim::drop_in_background(big);
        settle_reaper();
        settle_reaper(); // and returns when there is nothing to wait for
    }

    #[test]
    fn ns_per_op_inverts_the_rate() {
        let plan = Plan::new(2, Duration::from_millis(4));
        let s = ns_per_op(plan, || {
            std::thread::sleep(Duration::from_millis(2));
            1
        });
        assert!(s.mean >= 2e6, "{s:?}");
    }
}
