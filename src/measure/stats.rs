//! Summaries of latency samples: pure functions, no knowledge of benchmarks.

use statrs::statistics::{Data, OrderStatistics, Statistics};

/// Mean, median, p95 and extremes of a sample, same unit as the input.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// 50th percentile.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
}

/// Summarizes `xs` with statrs (its `percentile`, the median-unbiased R-8 estimator of Hyndman &
/// Fan 1996). Returns `None` for an empty sample.
pub fn summarize(xs: &[f64]) -> Option<Summary> {
    if xs.is_empty() {
        return None;
    }
    let mut d = Data::new(xs.to_vec());
    Some(Summary {
        n: xs.len(),
        mean: xs.mean(),
        p50: d.percentile(50),
        p95: d.percentile(95),
        min: xs.min(),
        max: xs.max(),
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
        assert!(summarize(&[]).is_none());
        // Type 7 by hand: n = 10, p99 → h = 9·0.99 = 8.91 → 9 + 0.91·(10 − 9) = 9.91.
        let mut v = vec![1.0, 5.0, 3.0, 4.0, 10.0, 9.0, 6.0, 7.0, 8.0, 2.0];
        assert!((percentile(&mut v, 99.0) - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&mut v, 50.0), 5.5);
    }
}
