//! The median and spread (smallest to largest) of repeated measurements:
//! on a shared, noisy machine a slow outlier moves a mean and a standard
//! deviation, but not the median, and the spread shows the noise as it was.

/// Summary of repeated measurements of one quantity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// The median (the mean of the two middle samples for an even count).
    pub median: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
    /// Number of samples.
    pub n: usize,
}

impl Stats {
    /// Summarises `samples`. Panics on an empty slice: a measurement with no
    /// repetitions is a bug in the suite.
    ///
    /// ```
    /// use bpfmaps_bench::stats::Stats;
    /// let s = Stats::from_samples(&[4.0, 9.0, 2.0, 5.0, 7.0]);
    /// assert_eq!((s.median, s.min, s.max), (5.0, 2.0, 9.0));
    /// ```
    pub fn from_samples(samples: &[f64]) -> Stats {
        assert!(!samples.is_empty(), "no samples");
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Stats {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            n,
        }
    }

    /// The same quantity inverted sample by sample (e.g. ops/s to s/op),
    /// scaled by `scale`: `scale / x` for each sample.
    pub fn inverse_of(samples: &[f64], scale: f64) -> Stats {
        let inv: Vec<f64> = samples.iter().map(|x| scale / x).collect();
        Stats::from_samples(&inv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let s = Stats::from_samples(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
    }

    #[test]
    fn one_sample_has_no_spread() {
        let s = Stats::from_samples(&[7.5]);
        assert_eq!((s.median, s.min, s.max), (7.5, 7.5, 7.5));
    }

    #[test]
    #[should_panic(expected = "no samples")]
    fn empty_panics() {
        Stats::from_samples(&[]);
    }

    #[test]
    fn inverse_inverts_each_sample() {
        let s = Stats::inverse_of(&[1e9, 2e9, 4e9], 1e9);
        assert_eq!((s.median, s.min, s.max), (0.5, 0.25, 1.0));
    }
}
