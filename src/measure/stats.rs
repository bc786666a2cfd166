//! Summaries of latency samples: pure functions, no knowledge of benchmarks.
//!
//! Percentiles are statrs's (`Data::percentile`, the median-unbiased R-8 estimator of Hyndman
//! & Fan 1996, §4); the 95 % confidence interval of the mean is Student's t
//! (`mean ± t₀.₉₇₅,ₙ₋₁ · s/√n`); outliers are flagged with Tukey's fences (Tukey 1977,
//! *Exploratory Data Analysis*, §2: below Q1 − 1.5·IQR or above Q3 + 1.5·IQR), as criterion.rs
//! classifies its samples.

use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::{Data, OrderStatistics, Statistics};

/// Summary statistics of a sample, same unit as the input (ms for latencies).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1 denominator); NaN when n < 2.
    pub std: f64,
    /// Median (= p50).
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Half-width of the 95 % confidence interval of the mean (Student's t); NaN when n < 2.
    pub ci95: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Samples outside Tukey's fences (Q1 − 1.5·IQR, Q3 + 1.5·IQR).
    pub outliers: usize,
}

/// Summarizes `xs` with statrs. Returns `None` for an empty sample.
pub fn summarize(xs: &[f64]) -> Option<Summary> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len();
    let mut d = Data::new(xs.to_vec());
    let std = if n > 1 { xs.std_dev() } else { f64::NAN };
    let ci95 = if n > 1 {
        let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
            .expect("n − 1 ≥ 1 degrees of freedom")
            .inverse_cdf(0.975);
        t * std / (n as f64).sqrt()
    } else {
        f64::NAN
    };
    let (q1, q3) = (d.lower_quartile(), d.upper_quartile());
    let iqr = q3 - q1;
    let (lo, hi) = (q1 - 1.5 * iqr, q3 + 1.5 * iqr);
    Some(Summary {
        n,
        mean: xs.mean(),
        std,
        p50: d.percentile(50),
        p95: d.percentile(95),
        p99: d.percentile(99),
        ci95,
        min: xs.min(),
        max: xs.max(),
        outliers: if n >= 4 {
            xs.iter().filter(|&&x| x < lo || x > hi).count()
        } else {
            0
        },
    })
}

/// The `p`-th percentile (0–100) of `xs` with linear interpolation between order statistics
/// (NumPy's default, Hyndman & Fan type 7); sorts `xs`. NaN for an empty sample.
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let h = (xs.len() - 1) as f64 * p / 100.0;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    xs[lo] + (h - lo as f64) * (xs[hi] - xs[lo])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand computation with R-8: for n = 10 the 95th percentile sits at rank
    /// h = (n + 1/3)·0.95 + 1/3 = 10.15 > n, so it is the maximum; the median is (5 + 6) / 2.
    #[test]
    fn summary_by_hand() {
        let s = summarize(&[1.0, 5.0, 3.0, 4.0, 10.0, 9.0, 6.0, 7.0, 8.0, 2.0]).unwrap();
        assert_eq!(s.mean, 5.5);
        assert_eq!(s.p50, 5.5);
        assert_eq!(s.p95, 10.0);
        assert_eq!((s.min, s.max), (1.0, 10.0));
        // Σ(x − 5.5)² = 82.5 → s² = 82.5 / 9, s = 3.0276503540974917.
        assert!((s.std - 3.027_650_354_097_491_7).abs() < 1e-12);
        // t₀.₉₇₅,₉ = 2.262157 (printed t tables); half-width = 2.262157·s/√10 = 2.165852.
        assert!((s.ci95 - 2.165_852).abs() < 2e-6, "{}", s.ci95);
        assert_eq!(s.outliers, 0);
        assert!(summarize(&[]).is_none());
        // Type 7 by hand: n = 10, p99 → h = 9·0.99 = 8.91 → 9 + 0.91·(10 − 9) = 9.91.
        let mut v = vec![1.0, 5.0, 3.0, 4.0, 10.0, 9.0, 6.0, 7.0, 8.0, 2.0];
        assert!((percentile(&mut v, 99.0) - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&mut v, 50.0), 5.5);
    }

    /// One sample: no spread, no interval, the value everywhere else.
    #[test]
    fn single_sample() {
        let s = summarize(&[42.0]).unwrap();
        assert_eq!((s.n, s.mean, s.p50, s.p99), (1, 42.0, 42.0, 42.0));
        assert!(s.std.is_nan() && s.ci95.is_nan());
    }

    /// Tukey's fences by hand: 1..=8 and 50. R-8 quartiles of 9 values sit at ranks
    /// (9 + 1/3)·0.25 + 1/3 = 2.6667 and 7.3333: Q1 = 2 + 0.6667·1 = 2.6667, Q3 = 7.3333,
    /// IQR = 4.6667, upper fence = 14.33: only 50 is outside.
    #[test]
    fn tukey_fences_flag_the_straggler() {
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 50.0]).unwrap();
        assert_eq!(s.outliers, 1);
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 14.0]).unwrap();
        assert_eq!(s.outliers, 0);
    }
}
