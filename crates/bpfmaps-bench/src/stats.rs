//! Mean and sample standard deviation over repetitions.

/// Summary of repeated measurements of one quantity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n - 1 denominator); 0 for one sample.
    pub stddev: f64,
    /// Number of samples.
    pub n: usize,
}

impl Stats {
    /// Summarises `samples`. Panics on an empty slice: a measurement with no
    /// repetitions is a bug in the suite.
    ///
    /// ```
    /// use bpfmaps_bench::stats::Stats;
    /// let s = Stats::from_samples(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
    /// assert_eq!(s.mean, 5.0);
    /// assert!((s.stddev - 2.138).abs() < 1e-3);
    /// ```
    pub fn from_samples(samples: &[f64]) -> Stats {
        assert!(!samples.is_empty(), "no samples");
        let n = samples.len();
        let mean = samples.iter().sum::<f64>() / n as f64;
        let stddev = if n < 2 {
            0.0
        } else {
            let ss: f64 = samples.iter().map(|x| (x - mean) * (x - mean)).sum();
            (ss / (n - 1) as f64).sqrt()
        };
        Stats { mean, stddev, n }
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
    fn mean_and_sample_stddev() {
        let s = Stats::from_samples(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(s.mean, 2.5);
        // Sample variance: (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3.
        assert!((s.stddev - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(s.n, 4);
    }

    #[test]
    fn one_sample_has_no_spread() {
        let s = Stats::from_samples(&[7.5]);
        assert_eq!((s.mean, s.stddev), (7.5, 0.0));
    }

    #[test]
    fn constant_samples_have_zero_stddev() {
        assert_eq!(Stats::from_samples(&[3.0; 5]).stddev, 0.0);
    }

    #[test]
    fn inverse_is_per_sample() {
        let s = Stats::inverse_of(&[1e9, 2e9], 1e9);
        assert_eq!(s.mean, 0.75);
    }

    #[test]
    #[should_panic(expected = "no samples")]
    fn empty_panics() {
        Stats::from_samples(&[]);
    }
}
