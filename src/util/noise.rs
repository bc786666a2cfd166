//! The one seeded noise generator: synthetic K/V for attention-only timings and the property
//! tests' random rows. A thin layer over `rand`'s `StdRng` (ChaCha12, reproducible for a seed
//! across platforms), so every stream in kvbench comes from one generator.

use rand::{Rng, SeedableRng};

/// Deterministic noise for a seed.
pub struct Noise(rand::rngs::StdRng);

impl Noise {
    /// A stream seeded with `seed` (the same seed gives the same values on every machine).
    pub fn new(seed: u64) -> Self {
        Noise(rand::rngs::StdRng::seed_from_u64(seed))
    }

    /// Next value, uniform in [−1, 1).
    pub fn uniform(&mut self) -> f32 {
        self.0.random_range(-1.0f32..1.0)
    }

    /// Approximately standard-normal value: the sum of four uniforms on [−1, 1) has variance
    /// 4/3, so it is scaled by √(3/4) ≈ 0.866 (Irwin–Hall; bounded in ±3.46, no heavy tails).
    pub fn gauss(&mut self) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866
    }

    /// The underlying generator, for shuffles and index draws (`rand::seq::SliceRandom`).
    pub fn rng(&mut self) -> &mut rand::rngs::StdRng {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Same seed, same stream; values in range; mean ≈ 0 and variance ≈ 1/3 for the uniform
    /// (1/3 = (b − a)²/12 with b − a = 2), ≈ 1 for `gauss`, over 20,000 draws (standard error of
    /// the variance ≈ 0.004 and 0.015).
    #[test]
    fn reproducible_and_distributed_as_documented() {
        let (mut a, mut b) = (Noise::new(7), Noise::new(7));
        let xs: Vec<f32> = (0..20_000).map(|_| a.uniform()).collect();
        let ys: Vec<f32> = (0..20_000).map(|_| b.uniform()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| (-1.0..1.0).contains(&x)));
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0 / 3.0).abs() < 0.02,
            "{mean} {var}"
        );
        let g: Vec<f64> = (0..20_000).map(|_| a.gauss() as f64).collect();
        let gm = g.iter().sum::<f64>() / g.len() as f64;
        let gv = g.iter().map(|x| (x - gm).powi(2)).sum::<f64>() / g.len() as f64;
        assert!(gm.abs() < 0.03 && (gv - 1.0).abs() < 0.06, "{gm} {gv}");
        assert_ne!(Noise::new(8).uniform(), Noise::new(7).uniform());
    }
}
