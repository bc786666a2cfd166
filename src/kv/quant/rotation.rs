//! The rotations applied before quantizing: the normalized Walsh–Hadamard transform
//! ([`hadamard`], QuaRot §3: Ashkboos et al. 2024, arXiv 2404.00456; kvbench's `+rot`) and
//! TurboQuant's randomized form [`RandomizedHadamard`], `x ↦ H·D·x / √d` with `D` a seeded
//! diagonal of random signs, as vLLM's TurboQuant (TurboQuant, Zandieh et al. 2025, arXiv
//! 2504.19874, uses a dense random orthogonal matrix; the Hadamard form is the `O(d log d)`
//! stand-in every implementation ships). The signs come from [`SplitMix64`], so a seed recorded
//! in a run's metadata reproduces the same rotation on any build.

use crate::error::{Error, Result};
use crate::util::noise::SplitMix64;

/// In-place normalized Walsh–Hadamard transform of each block of `block` values (a power of
/// two): `x ← H x / √block`. Orthogonal and its own inverse, so rotating Q and K preserves
/// every q·k, and rotating V is undone by rotating the attention output (QuaRot §3).
pub fn hadamard(x: &mut [f32], block: usize) {
    let norm = 1.0 / (block as f32).sqrt();
    for b in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < block {
            // Each butterfly pairs the two halves of a span of 2h: written over slices so the
            // stages with h ≥ 8 vectorize (the same sum and difference per element, so the
            // same result bit for bit as one butterfly at a time).
            for span in b.chunks_exact_mut(2 * h) {
                let (lo, hi) = span.split_at_mut(h);
                for (a, c) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (x, y) = (*a, *c);
                    *a = x + y;
                    *c = x - y;
                }
            }
            h *= 2;
        }
        b.iter_mut().for_each(|v| *v *= norm);
    }
}

/// The randomized Hadamard rotation `R x = H·D·x / √d` (`D` = diagonal of ±1 signs, `H` the
/// Sylvester–Hadamard matrix), applied in place to rows of `d` f32 values; `R⁻¹ = D·H/√d`.
/// Orthogonal, so norms and inner products are preserved. Source: vLLM's TurboQuant (Hadamard
/// with random signs), QuaRot §3; [`hadamard`] does the transform.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomizedHadamard {
    /// `[d]` ±1.
    signs: Vec<f32>,
}

impl RandomizedHadamard {
    /// Signs drawn from [`SplitMix64`] with `seed` (one bit per coordinate).
    /// Errors: [`Error::InvalidArgument`] when `head_dim` is not a power of two.
    pub fn new(head_dim: usize, seed: u64) -> Result<Self> {
        let mut rng = SplitMix64::new(seed);
        let signs = (0..head_dim)
            .map(|_| if rng.next_u64() >> 63 == 0 { 1.0 } else { -1.0 })
            .collect();
        Self::from_signs(signs)
    }

    /// A rotation with the given signs (`[d]`, each ±1).
    /// Errors: [`Error::InvalidArgument`] when `d` is not a power of two or a sign is not ±1.
    pub fn from_signs(signs: Vec<f32>) -> Result<Self> {
        let d = signs.len();
        if !d.is_power_of_two() {
            return Err(Error::InvalidArgument {
                name: "head_dim".into(),
                reason: format!("TurboQuant's Hadamard rotation needs a power of two, got {d}"),
            });
        }
        if let Some(s) = signs.iter().find(|&&s| s != 1.0 && s != -1.0) {
            return Err(Error::InvalidArgument {
                name: "rotation signs".into(),
                reason: format!("{s} is not ±1"),
            });
        }
        Ok(Self { signs })
    }

    /// Dimension d.
    pub fn dim(&self) -> usize {
        self.signs.len()
    }

    /// `x ← H·D·x/√d` (`x`: `[d]`).
    pub fn forward(&self, x: &mut [f32]) {
        assert_eq!(x.len(), self.dim(), "rotation of a row of the wrong length");
        x.iter_mut().zip(&self.signs).for_each(|(v, s)| *v *= s);
        hadamard(x, self.dim());
    }

    /// `x ← D·H·x/√d`, the inverse of [`forward`](Self::forward).
    pub fn inverse(&self, x: &mut [f32]) {
        assert_eq!(x.len(), self.dim(), "rotation of a row of the wrong length");
        hadamard(x, self.dim());
        x.iter_mut().zip(&self.signs).for_each(|(v, s)| *v *= s);
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// H₄/2 by hand: (1,0,0,0) → (½,½,½,½); (1,2,3,4) → (5, −1, −2, 0); applying twice restores.
    #[test]
    fn hadamard_by_hand() {
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        hadamard(&mut x, 4);
        assert_eq!(x, [0.5; 4]);
        let mut y = [1.0f32, 2.0, 3.0, 4.0];
        hadamard(&mut y, 4);
        assert_eq!(y, [5.0, -1.0, -2.0, 0.0]);
        hadamard(&mut y, 4);
        assert_eq!(y, [1.0, 2.0, 3.0, 4.0]);
    }

    /// H₄·D·x/2 by hand with D = diag(1, −1, 1, 1), x = (1, 2, 3, 4): D x = (1, −2, 3, 4);
    /// Sylvester rows (1,1,1,1), (1,−1,1,−1), (1,1,−1,−1), (1,−1,−1,1) give (6, 2, −8, 4)/2.
    #[test]
    fn randomized_hadamard_by_hand() {
        let r = RandomizedHadamard::from_signs(vec![1.0, -1.0, 1.0, 1.0]).unwrap();
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        r.forward(&mut x);
        assert_eq!(x, [3.0, 1.0, -4.0, 2.0]);
        r.inverse(&mut x);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        assert!(RandomizedHadamard::from_signs(vec![1.0; 6]).is_err());
        assert!(RandomizedHadamard::from_signs(vec![1.0, 0.5]).is_err());
        assert!(RandomizedHadamard::new(96, 1)
            .unwrap_err()
            .to_string()
            .contains("power of two"));
        // Seeded: same seed, same signs; both signs occur; norms preserved.
        let a = RandomizedHadamard::new(128, 42).unwrap();
        assert_eq!(a, RandomizedHadamard::new(128, 42).unwrap());
        assert_ne!(a, RandomizedHadamard::new(128, 43).unwrap());
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let x: Vec<f32> = (0..128).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut y = x.clone();
        a.forward(&mut y);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x) - n(&y)).abs() < 1e-4 * n(&x));
        a.inverse(&mut y);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5));
    }
}
