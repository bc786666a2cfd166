//! Statistics on samples: pure functions, no knowledge of benchmarks, KV caches or models (the
//! ground floor: every layer may use it, it uses nothing of kvbench's).
//!
//! One percentile estimator serves everything, latency summaries and quality tails alike:
//! [`percentile`], linear interpolation between order statistics (Hyndman & Fan 1996, type 7;
//! NumPy's and criterion.rs's default). The 95 % confidence interval of the mean is Student's t
//! (`mean ± t₀.₉₇₅,ₙ₋₁ · s/√n`, statrs); outliers are flagged with Tukey's fences (Tukey 1977,
//! *Exploratory Data Analysis*, §2: below Q1 − 1.5·IQR or above Q3 + 1.5·IQR, quartiles by
//! [`percentile`]), as criterion.rs classifies its samples.

use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::Statistics;

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
    /// 95th percentile ([`percentile`], type 7).
    pub p95: f64,
    /// 99th percentile ([`percentile`], type 7).
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

/// Degrees of freedom above which [`t_quantile`] uses the Cornish–Fisher expansion instead of
/// statrs' inverse CDF, whose search is already off at 10^6 (1.959848, below the normal
/// quantile) and never returns near 10^8 (issue #25: the gate hung).
pub const T_EXPANSION_DF: usize = 10_000;

/// The `p` quantile of Student's t with `df` degrees of freedom, e.g. `t_quantile(0.975, n −
/// 1)` for a two-sided 95 % interval of a mean of `n` samples: statrs' inverse CDF up to
/// [`T_EXPANSION_DF`], above it the Cornish–Fisher expansion in 1/ν about the normal quantile z
/// (Abramowitz & Stegun 26.7.5): t ≈ z + (z³ + z)/(4ν) + (5z⁵ + 16z³ + 3z)/(96ν²), whose next
/// term is below 10^-12 there. `None` for `df = 0`.
pub fn t_quantile(p: f64, df: usize) -> Option<f64> {
    if df > T_EXPANSION_DF {
        let z = statrs::distribution::Normal::new(0.0, 1.0)
            .ok()?
            .inverse_cdf(p);
        let nu = df as f64;
        let g1 = (z.powi(3) + z) / 4.0;
        let g2 = (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / 96.0;
        return Some(z + g1 / nu + g2 / (nu * nu));
    }
    StudentsT::new(0.0, 1.0, df as f64)
        .ok()
        .filter(|_| df > 0)
        .map(|d| d.inverse_cdf(p))
}

/// Weighted isotonic regression, non-decreasing: the `z` that minimizes `Σ wᵢ·(zᵢ − yᵢ)²`
/// subject to `z₁ ≤ z₂ ≤ … ≤ zₙ`, by the Pool Adjacent Violators algorithm (Ayer et al. 1955,
/// *Ann. Math. Statist.* 26:641; Barlow, Bartholomew, Bremner & Brunk 1972, *Statistical
/// Inference under Order Restrictions*, §1.2; de Leeuw, Hornik & Mair 2009, *J. Stat. Softw.*
/// 32(5), §2; scikit-learn's `IsotonicRegression` is a reference implementation): scan left to
/// right, and whenever a value falls below the block before it, pool the two blocks into their
/// weighted mean, repeating backwards until the blocks rise. Values already non-decreasing
/// come back unchanged; `[3, 1, 2]` with equal weights gives `[2, 2, 2]`. `y` and `w` in any
/// unit, same length; `w` is each value's weight (e.g. the number of timed runs behind a
/// median). `None` when the lengths differ or a value is not finite or a weight is not finite
/// and > 0. O(n).
pub fn isotonic_increasing(y: &[f64], w: &[f64]) -> Option<Vec<f64>> {
    if y.len() != w.len()
        || y.iter().any(|v| !v.is_finite())
        || w.iter().any(|v| !(v.is_finite() && *v > 0.0))
    {
        return None;
    }
    // Blocks as (weighted mean, total weight, members).
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(y.len());
    for (&yi, &wi) in y.iter().zip(w) {
        blocks.push((yi, wi, 1));
        while blocks.len() > 1 && blocks[blocks.len() - 2].0 > blocks[blocks.len() - 1].0 {
            let (m1, w1, n1) = blocks.pop().expect("two blocks");
            let (m0, w0, n0) = blocks.pop().expect("two blocks");
            blocks.push(((m0 * w0 + m1 * w1) / (w0 + w1), w0 + w1, n0 + n1));
        }
    }
    Some(
        blocks
            .into_iter()
            .flat_map(|(m, _, n)| std::iter::repeat_n(m, n))
            .collect(),
    )
}

/// Summarizes `xs` (any unit; the summary keeps it). Returns `None` for an empty sample.
pub fn summarize(xs: &[f64]) -> Option<Summary> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len();
    let mut sorted = xs.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| percentile_sorted(&sorted, p);
    let std = if n > 1 { xs.std_dev() } else { f64::NAN };
    let ci95 = if n > 1 {
        t_quantile(0.975, n - 1).expect("n − 1 ≥ 1 degrees of freedom") * std / (n as f64).sqrt()
    } else {
        f64::NAN
    };
    let (q1, q3) = (q(25.0), q(75.0));
    let iqr = q3 - q1;
    let (lo, hi) = (q1 - 1.5 * iqr, q3 + 1.5 * iqr);
    Some(Summary {
        n,
        mean: xs.mean(),
        std,
        p50: q(50.0),
        p95: q(95.0),
        p99: q(99.0),
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
    percentile_sorted(xs, p)
}

/// [`percentile`] of an already ascending, non-empty sample.
fn percentile_sorted(xs: &[f64], p: f64) -> f64 {
    let h = (xs.len() - 1) as f64 * p.clamp(0.0, 100.0) / 100.0;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    xs[lo] + (h - lo as f64) * (xs[hi] - xs[lo])
}

/// A distribution-free 95 % confidence interval of the `p`-th percentile (0–100) from the
/// order statistics of `xs` (Conover 1999, *Practical Nonparametric Statistics*, §3.2; Hahn &
/// Meeker 1991, §5.2): with B ~ Binomial(n, p/100), the interval is [x₍ᵣ₎, x₍ₛ₎] where r − 1 is
/// the largest k with P(B ≤ k) ≤ 0.025 and s the smallest with P(B ≤ s − 1) ≥ 0.975 (1-based
/// ranks), so it covers the percentile with probability ≥ 95 % whatever the distribution.
/// When the sample is too small for a rank on one side (e.g. fewer than 72 samples for the
/// 95th percentile's upper end) that end is the sample's extreme and the coverage is lower;
/// the returned flag says so (`true` = a full 95 % interval). Sorts `xs`. `None` for an empty
/// sample or `p` outside 0–100.
pub fn percentile_ci95(xs: &mut [f64], p: f64) -> Option<((f64, f64), bool)> {
    use statrs::distribution::{Binomial, DiscreteCDF};
    let n = xs.len();
    if n == 0 || !(0.0..=100.0).contains(&p) {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let b = Binomial::new(p / 100.0, n as u64).ok()?;
    // P(B ≤ k) for k = −1 … n.
    let cdf = |k: i64| if k < 0 { 0.0 } else { b.cdf(k as u64) };
    let below = (-1..n as i64).rev().find(|&k| cdf(k) <= 0.025);
    let above = (0..=n as i64).find(|&k| cdf(k) >= 0.975);
    // r − 1 = `below` (r ≥ 1 needs below ≥ 0); s − 1 = `above` (s ≤ n needs above < n).
    let (r, full_lo) = match below {
        Some(k) if k >= 0 => (k as usize + 1, true),
        _ => (1, false),
    };
    let (s, full_hi) = match above {
        Some(k) if (k as usize) < n => (k as usize + 1, true),
        _ => (n, false),
    };
    Some(((xs[r - 1], xs[s - 1]), full_lo && full_hi))
}

/// The Wilson score 95 % interval of a proportion: `k` successes in `n` trials, as
/// (centre ± z·√(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n) with z = 1.959964 (Wilson 1927, *JASA*
/// 22:209; Brown, Cai & DasGupta 2001 recommend it over the Wald interval for small n). Stays
/// within [0, 1]. `None` for `n = 0` or `k > n`.
pub fn wilson_ci95(k: usize, n: usize) -> Option<(f64, f64)> {
    if n == 0 || k > n {
        return None;
    }
    let (z, nf) = (1.959_963_984_540_054, n as f64);
    let ph = k as f64 / nf;
    let d = 1.0 + z * z / nf;
    let c = ph + z * z / (2.0 * nf);
    let h = z * (ph * (1.0 - ph) / nf + z * z / (4.0 * nf * nf)).sqrt();
    // At k = 0 and k = n the ends are exactly 0 and 1 (the formula's rounding aside).
    let lo = if k == 0 { 0.0 } else { ((c - h) / d).max(0.0) };
    let hi = if k == n { 1.0 } else { ((c + h) / d).min(1.0) };
    Some((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The median of 10 samples: the textbook interval [x₍₂₎, x₍₉₎] (Conover §3.2: P(2 ≤ B ≤ 8)
    /// for B ~ Bin(10, ½) = 1 − 2·11/1024 = 0.9785); the 95th percentile of 100: by hand
    /// P(B ≤ 89) = 0.0115 ≤ 0.025 < P(B ≤ 90) = 0.0282 and P(B ≤ 98) = 0.9629 < 0.975 ≤
    /// P(B ≤ 99) = 0.9941 for B ~ Bin(100, 0.95), so [x₍₉₀₎, x₍₁₀₀₎]; of 20 samples the upper
    /// rank does not exist (P(B ≤ 19) = 1 − 0.95²⁰ = 0.642): the maximum, flagged.
    #[test]
    fn percentile_intervals_from_order_statistics() {
        let mut ten: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(percentile_ci95(&mut ten, 50.0), Some(((2.0, 9.0), true)));
        let mut hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(
            percentile_ci95(&mut hundred, 95.0),
            Some(((90.0, 100.0), true))
        );
        let mut twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        let ((lo, hi), full) = percentile_ci95(&mut twenty, 95.0).unwrap();
        assert_eq!((hi, full), (20.0, false));
        assert!(lo < 19.0, "{lo}");
        assert_eq!(percentile_ci95(&mut [], 95.0), None);
        assert_eq!(percentile_ci95(&mut [1.0], 101.0), None);
    }

    /// Wilson's interval for 8 of 10: (0.4902, 0.9434) by hand (p̂ = 0.8, z² = 3.8415:
    /// centre 0.99208 / 1.38415 = 0.71674, half-width 1.96 × 0.16001 / 1.38415 = 0.22657);
    /// 0 of 10 starts at 0 and 10 of 10 ends at 1.
    #[test]
    fn wilson_interval_by_hand() {
        let (lo, hi) = wilson_ci95(8, 10).unwrap();
        assert!(
            (lo - 0.4902).abs() < 1e-4 && (hi - 0.9434).abs() < 1e-4,
            "{lo} {hi}"
        );
        assert_eq!(wilson_ci95(0, 10).unwrap().0, 0.0);
        assert_eq!(wilson_ci95(10, 10).unwrap().1, 1.0);
        assert_eq!(wilson_ci95(1, 0), None);
    }

    /// Past 10^4 degrees of freedom: R's `qt(0.975, 10001)` = 1.9602012 and the expansion by
    /// hand at 10^6 (z = 1.959963985: z + (z³+z)/(4·10^6) = 1.9599664); it answers at once even
    /// at 10^12 (statrs' search never returned near 10^8), and stays above the normal quantile.
    #[test]
    fn t_quantile_for_huge_degrees_of_freedom_answers_at_once() {
        assert!((t_quantile(0.975, 10_001).unwrap() - 1.960_201_2).abs() < 1e-6);
        assert!((t_quantile(0.975, 1_000_000).unwrap() - 1.959_966_4).abs() < 1e-6);
        let far = t_quantile(0.975, 1_000_000_000_000).unwrap();
        assert!(far > 1.959_963_98 && far < 1.959_964_0, "{far}");
        // Continuous across the switch to the expansion.
        let (a, b) = (
            t_quantile(0.975, T_EXPANSION_DF).unwrap(),
            t_quantile(0.975, T_EXPANSION_DF + 1).unwrap(),
        );
        assert!((a - b).abs() < 1e-6, "{a} {b}");
    }

    /// Published two-sided 95 % t table values (e.g. NIST/SEMATECH e-Handbook, Table 1.4.2.7.6):
    /// df 1 → 12.706, 3 → 3.182, 31 → 2.040; no degrees of freedom → None.
    #[test]
    fn t_quantile_matches_the_table() {
        for (df, want) in [(1, 12.706), (3, 3.182), (31, 2.040)] {
            let got = t_quantile(0.975, df).unwrap();
            assert!((got - want).abs() < 5e-4, "df {df}: {got}");
        }
        assert_eq!(t_quantile(0.975, 0), None);
    }

    /// Hand computation with type 7: for n = 10 the 95th percentile sits at 0-based rank
    /// h = 9·0.95 = 8.55, between 9 and 10: 9 + 0.55 = 9.55; the median is (5 + 6) / 2.
    #[test]
    fn summary_by_hand() {
        let s = summarize(&[1.0, 5.0, 3.0, 4.0, 10.0, 9.0, 6.0, 7.0, 8.0, 2.0]).unwrap();
        assert_eq!(s.mean, 5.5);
        assert_eq!(s.p50, 5.5);
        assert!((s.p95 - 9.55).abs() < 1e-12, "{}", s.p95);
        assert!((s.p99 - 9.91).abs() < 1e-12, "{}", s.p99);
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

    /// Tukey's fences by hand: 1..=8 and 50. Type-7 quartiles of 9 values sit at 0-based
    /// ranks 8·0.25 = 2 and 8·0.75 = 6: Q1 = 3, Q3 = 7, IQR = 4, fences −3 and 13: only 50 is
    /// outside; with 12.9 instead of 50 nothing is, with 13.1 it is.
    #[test]
    fn tukey_fences_flag_the_straggler() {
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 50.0]).unwrap();
        assert_eq!(s.outliers, 1);
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 12.9]).unwrap();
        assert_eq!(s.outliers, 0);
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 13.1]).unwrap();
        assert_eq!(s.outliers, 1);
    }

    /// PAV by hand: `[3, 1, 2]` with equal weights pools into their mean `[2, 2, 2]`; with
    /// weights `[1, 3, 1]` the first two pool to (3 + 3)/4 = 1.5, below 2, so `[1.5, 1.5, 2]`;
    /// a rising sequence comes back unchanged; `[1, 3, 2, 4]` pools the middle pair to 2.5;
    /// the result never falls; bad input is refused.
    #[test]
    fn isotonic_by_hand() {
        assert_eq!(
            isotonic_increasing(&[3.0, 1.0, 2.0], &[1.0; 3]).unwrap(),
            vec![2.0, 2.0, 2.0]
        );
        assert_eq!(
            isotonic_increasing(&[3.0, 1.0, 2.0], &[1.0, 3.0, 1.0]).unwrap(),
            vec![1.5, 1.5, 2.0]
        );
        assert_eq!(
            isotonic_increasing(&[1.0, 2.0, 5.0], &[1.0; 3]).unwrap(),
            vec![1.0, 2.0, 5.0]
        );
        assert_eq!(
            isotonic_increasing(&[1.0, 3.0, 2.0, 4.0], &[1.0; 4]).unwrap(),
            vec![1.0, 2.5, 2.5, 4.0]
        );
        let y = [5.0, 4.0, 9.0, 1.0, 7.0, 7.5, 2.0, 8.0];
        let z = isotonic_increasing(&y, &[2.0, 1.0, 1.0, 3.0, 1.0, 1.0, 2.0, 1.0]).unwrap();
        assert!(z.windows(2).all(|p| p[0] <= p[1]), "{z:?}");
        // Pooling keeps each block's weighted sum, so the whole sum:
        // Σ w·z = Σ w·y = 10 + 4 + 9 + 3 + 7 + 7.5 + 4 + 8 = 52.5.
        let w = [2.0, 1.0, 1.0, 3.0, 1.0, 1.0, 2.0, 1.0];
        let sum: f64 = z.iter().zip(&w).map(|(a, b)| a * b).sum();
        assert!((sum - 52.5).abs() < 1e-9, "{sum}");
        assert_eq!(isotonic_increasing(&[], &[]), Some(vec![]));
        assert_eq!(isotonic_increasing(&[1.0, 2.0], &[1.0]), None);
        assert_eq!(isotonic_increasing(&[1.0, 2.0], &[1.0, 0.0]), None);
        assert_eq!(isotonic_increasing(&[f64::NAN, 2.0], &[1.0, 1.0]), None);
    }
}
