//! The Lloyd–Max scalar quantizer of a Gaussian (Lloyd 1957/1982; Max 1960, "Quantizing for
//! minimum distortion", IRE Trans. IT-6), solved from the Gaussian's closed-form cell moments
//! (no numerical quadrature). TurboQuant (Zandieh et al. 2025, arXiv 2504.19874, §3.1, Thm 1)
//! quantizes each coordinate of a randomly rotated unit vector with the codebook of N(0, 1/d),
//! the coordinates' limiting distribution ([`Codebook::for_head_dim`]).

use std::collections::HashMap;
use std::f64::consts::{FRAC_1_SQRT_2, PI};
use std::sync::{Arc, Mutex, OnceLock};

use statrs::function::erf::erfc;

use crate::error::{Error, Result};

/// Bit widths [`Codebook`] solves (1–4: 2 to 16 levels).
pub const CODEBOOK_BITS: std::ops::RangeInclusive<u8> = 1..=4;

/// Standard normal density φ(x).
fn phi(x: f64) -> f64 {
    if x.is_infinite() {
        0.0
    } else {
        (-0.5 * x * x).exp() / (2.0 * PI).sqrt()
    }
}

/// Standard normal CDF Φ(x) = erfc(−x/√2)/2 (erfc keeps the tails accurate).
fn big_phi(x: f64) -> f64 {
    if x == f64::INFINITY {
        1.0
    } else if x == f64::NEG_INFINITY {
        0.0
    } else {
        0.5 * erfc(-x * FRAC_1_SQRT_2)
    }
}

/// `x·φ(x)`, 0 at ±∞.
fn x_phi(x: f64) -> f64 {
    if x.is_infinite() {
        0.0
    } else {
        x * phi(x)
    }
}

/// Moments of the standard normal on the cell `(a, b)`: probability `P = Φ(b) − Φ(a)`, first
/// moment `∫x φ = φ(a) − φ(b)`, second moment `∫x² φ = P − (bφ(b) − aφ(a))`.
fn cell_moments(a: f64, b: f64) -> (f64, f64, f64) {
    let p = big_phi(b) - big_phi(a);
    let m1 = phi(a) - phi(b);
    let m2 = p - (x_phi(b) - x_phi(a));
    (p, m1, m2)
}

/// The Lloyd–Max (minimum mean-squared error) scalar quantizer of N(0, σ²) at `bits` bits:
/// `2^bits` sorted centroids and the `2^bits − 1` decision boundaries between them.
///
/// Method: Lloyd's alternation (Lloyd 1957/1982; Max 1960, "Quantizing for minimum
/// distortion", IRE Trans. IT-6) on the standard normal — boundaries at the midpoints of
/// neighbouring centroids, each centroid the conditional mean of its cell,
/// `E[X | a < X < b] = (φ(a) − φ(b)) / (Φ(b) − Φ(a))` — iterated until no centroid moves by
/// more than 1e-12, then scaled by σ. For N(0, 1) it reproduces Max's Table I (1 bit ±0.7979,
/// 2 bits ±0.4528 ±1.5104, …; see the tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Codebook {
    bits: u8,
    sigma: f64,
    /// `[2^bits]` reconstruction levels, ascending, in units of x (σ applied).
    centroids: Vec<f32>,
    /// `[2^bits − 1]` decision thresholds, ascending: value `y` maps to the number of
    /// thresholds below or equal to it.
    boundaries: Vec<f32>,
    /// Mean-squared error per coordinate for N(0, 1) (multiply by σ² for x's units).
    mse_unit: f64,
}

impl Codebook {
    /// Solves the Lloyd–Max codebook of N(0, `sigma`²) at `bits` bits.
    /// Errors: [`Error::InvalidArgument`] for `bits` outside 1–4 or `sigma` not finite and
    /// positive.
    pub fn lloyd_max_gaussian(bits: u8, sigma: f64) -> Result<Self> {
        if !CODEBOOK_BITS.contains(&bits) {
            return Err(Error::InvalidArgument {
                name: "codebook bits".into(),
                reason: format!("{bits} is not supported; use 1, 2, 3 or 4"),
            });
        }
        if !(sigma.is_finite() && sigma > 0.0) {
            return Err(Error::InvalidArgument {
                name: "codebook sigma".into(),
                reason: format!("{sigma} must be a finite positive standard deviation"),
            });
        }
        let levels = 1usize << bits;
        // Start from evenly spaced levels over ±2.5σ; Lloyd's map is a contraction for the
        // Gaussian (log-concave density: Fleischer 1964), so the fixed point is unique.
        let mut c: Vec<f64> = (0..levels)
            .map(|i| -2.5 + 5.0 * (i as f64 + 0.5) / levels as f64)
            .collect();
        let mut t = vec![0f64; levels - 1];
        for _ in 0..1_000_000 {
            for i in 0..levels - 1 {
                t[i] = 0.5 * (c[i] + c[i + 1]);
            }
            let mut moved = 0f64;
            for i in 0..levels {
                let a = if i == 0 { f64::NEG_INFINITY } else { t[i - 1] };
                let b = if i == levels - 1 { f64::INFINITY } else { t[i] };
                let (p, m1, _) = cell_moments(a, b);
                let new = m1 / p;
                moved = moved.max((new - c[i]).abs());
                c[i] = new;
            }
            if moved < 1e-12 {
                break;
            }
        }
        for i in 0..levels - 1 {
            t[i] = 0.5 * (c[i] + c[i + 1]);
        }
        // MSE = Σ over cells of ∫(x − c)² φ = Σ (m2 − 2c·m1 + c²·p).
        let mse_unit = (0..levels)
            .map(|i| {
                let a = if i == 0 { f64::NEG_INFINITY } else { t[i - 1] };
                let b = if i == levels - 1 { f64::INFINITY } else { t[i] };
                let (p, m1, m2) = cell_moments(a, b);
                m2 - 2.0 * c[i] * m1 + c[i] * c[i] * p
            })
            .sum();
        Ok(Self {
            bits,
            sigma,
            centroids: c.iter().map(|&v| (v * sigma) as f32).collect(),
            boundaries: t.iter().map(|&v| (v * sigma) as f32).collect(),
            mse_unit,
        })
    }

    /// TurboQuant's codebook for rotated unit vectors of dimension `head_dim`: N(0, 1/d).
    /// Errors: as [`Self::lloyd_max_gaussian`], and `head_dim` 0.
    pub fn for_head_dim(bits: u8, head_dim: usize) -> Result<Self> {
        if head_dim == 0 {
            return Err(Error::InvalidArgument {
                name: "head_dim".into(),
                reason: "must be at least 1".into(),
            });
        }
        Self::lloyd_max_gaussian(bits, 1.0 / (head_dim as f64).sqrt())
    }

    /// [`for_head_dim`](Self::for_head_dim), solved once per `(bits, head_dim)` in the process
    /// and shared: every stream of a cache (layers × sequences × kv heads) uses the same
    /// codebook, and Lloyd's iteration at 4 bits takes thousands of steps.
    pub fn shared(bits: u8, head_dim: usize) -> Result<Arc<Self>> {
        type Solved = HashMap<(u8, usize), Arc<Codebook>>;
        static CACHE: OnceLock<Mutex<Solved>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        if let Some(c) = cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(bits, head_dim))
        {
            return Ok(c.clone());
        }
        let c = Arc::new(Self::for_head_dim(bits, head_dim)?);
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((bits, head_dim), c.clone());
        Ok(c)
    }

    /// Bits per index.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Standard deviation the codebook was solved for.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// `[2^bits]` reconstruction levels, ascending.
    pub fn centroids(&self) -> &[f32] {
        &self.centroids
    }

    /// `[2^bits − 1]` decision thresholds, ascending.
    pub fn boundaries(&self) -> &[f32] {
        &self.boundaries
    }

    /// Expected squared error per coordinate for X ~ N(0, σ²), in x's units squared.
    pub fn mse(&self) -> f64 {
        self.mse_unit * self.sigma * self.sigma
    }

    /// Index of the level nearest to `y` (ties go up; NaN maps to level 0).
    #[inline]
    pub fn index(&self, y: f32) -> u8 {
        self.boundaries.partition_point(|&t| t <= y) as u8
    }

    /// Bytes of the codebook if stored (f32 levels): `2^bits · 4`.
    pub fn bytes(&self) -> usize {
        self.centroids.len() * 4
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;

    /// Max (1960), Table I, optimum levels of the N(0, 1) quantizer (positive half; symmetric),
    /// and the resulting mean-squared error.
    pub(crate) const MAX_1960: [(&[f64], f64); 4] = [
        (&[0.7979], 0.3634),
        (&[0.4528, 1.5104], 0.1175),
        (&[0.2451, 0.7560, 1.3440, 2.1520], 0.03454),
        (
            &[
                0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326,
            ],
            0.009497,
        ),
    ];

    #[test]
    fn lloyd_max_matches_max_1960() {
        for (b, (pos, mse)) in (1u8..=4).zip(MAX_1960) {
            let cb = Codebook::lloyd_max_gaussian(b, 1.0).unwrap();
            let c = cb.centroids();
            assert_eq!(c.len(), 1 << b);
            let half = c.len() / 2;
            for (i, &p) in pos.iter().enumerate() {
                // Table values are rounded to 4 decimals, and Max's last digit is off by up to 1e-4
                // at 3–4 bits (converged: 1.3439, 2.1519, 0.3880, …; scripts/quality_reference.py).
                assert!(
                    (c[half + i] as f64 - p).abs() < 1.5e-4,
                    "b={b} level {i}: {}",
                    c[half + i]
                );
                assert!(
                    (c[half - 1 - i] as f64 + p).abs() < 1.5e-4,
                    "b={b} level -{i}"
                );
            }
            assert!(
                (cb.mse() - mse).abs() / mse < 2e-3,
                "b={b} mse {}",
                cb.mse()
            );
        }
        // Max's 2-bit thresholds: 0, ±0.9816.
        let t = Codebook::lloyd_max_gaussian(2, 1.0).unwrap();
        let t = t.boundaries();
        assert!(
            t[1].abs() < 1e-6 && (t[2] - 0.9816).abs() < 1.5e-4 && (t[0] + 0.9816).abs() < 1.5e-4
        );
    }

    /// The N(0, 1/d) codebook is Max's scaled by 1/√d, and its MSE by 1/d.
    #[test]
    fn codebook_scales_with_sigma_and_maps_to_nearest_level() {
        let cb = Codebook::for_head_dim(2, 64).unwrap();
        let unit = Codebook::lloyd_max_gaussian(2, 1.0).unwrap();
        for (a, b) in cb.centroids().iter().zip(unit.centroids()) {
            assert!((a - b / 8.0).abs() < 1e-7);
        }
        assert!((cb.mse() - unit.mse() / 64.0).abs() < 1e-12);
        // Levels ±0.4528/8 = ±0.0566, ±1.5104/8 = ±0.1888; thresholds 0, ±0.1227.
        assert_eq!(cb.index(-1.0), 0);
        assert_eq!(cb.index(-0.1), 1);
        assert_eq!(cb.index(0.05), 2);
        assert_eq!(cb.index(0.2), 3);
        assert_eq!(cb.bytes(), 16);
    }

    #[test]
    fn codebook_rejects_bad_input() {
        for b in [0u8, 5] {
            let e = Codebook::lloyd_max_gaussian(b, 1.0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("use 1, 2, 3 or 4"), "{e}");
        }
        assert!(Codebook::lloyd_max_gaussian(2, 0.0).is_err());
        assert!(Codebook::lloyd_max_gaussian(2, f64::NAN).is_err());
        assert!(Codebook::for_head_dim(2, 0).is_err());
    }

    /// One codebook per (bits, head_dim) in the process.
    #[test]
    fn codebooks_are_shared() {
        let a = Codebook::shared(3, 64).unwrap();
        let b = Codebook::shared(3, 64).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*a, Codebook::for_head_dim(3, 64).unwrap());
        assert!(Codebook::shared(9, 64).is_err());
    }
}
