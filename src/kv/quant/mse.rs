//! TurboQuant_mse (Zandieh et al. 2025, arXiv 2504.19874, §3.1, Alg. 1) for one key or value
//! row: `‖x‖` as f16, then the [`Codebook`] index of every coordinate of the rotated unit row
//! `R·x/‖x‖`, packed at `b` bits: `ceil(d·b/8) + 2` bytes, as vLLM's `key_packed_size`.
//! Optional norm correction (vLLM's `_nc` presets): the decoded centroid vector is rescaled to
//! unit norm, the rescale folded into the stored norm when the row is written (`‖x‖/‖ĉ‖`), so
//! reading a corrected row costs what reading a plain one does.

use std::sync::Arc;

use half::f16;

use super::bits::{codes_to_f32, pack_bits, packed_bytes};
use super::codebook::Codebook;
use super::rotation::RandomizedHadamard;
use crate::error::Result;

/// Stores `v` as f16, saturating at ±65504 instead of overflowing; returns whether it saturated.
pub(super) fn f16_saturating(v: f32) -> (f16, bool) {
    let h = f16::from_f32(v);
    if h.is_infinite() {
        (f16::MAX, true)
    } else {
        (h, false)
    }
}

/// TurboQuant_mse for one row (TurboQuant §3.1, Alg. 1; vLLM's key layout): `x` (`[d]` f32) is
/// stored as `‖x‖` (f16, 2 bytes) followed by `d` codebook indices of `R·x/‖x‖` packed at `bits`
/// bits: [`row_bytes`](Self::row_bytes) = `ceil(d·bits/8) + 2`. Decoding looks the indices up
/// in the N(0, 1/d) [`Codebook`], rotates back and multiplies by the stored norm (with
/// `norm_correction`, vLLM's `_nc` presets, `‖x‖/‖ĉ‖`: the centroid vector rescaled to unit
/// norm, folded in at encode).
///
/// Expected error for a unit vector (Thm 1): `E‖x − x̂‖² ≈ d · mse(N(0,1/d))` = 0.363, 0.117,
/// 0.0345, 0.0095 at 1–4 bits, bounded by `√3·π/2 · 4^−b`. A zero row decodes to zero.
#[derive(Debug, Clone, PartialEq)]
pub struct TurboQuantMse {
    rot: RandomizedHadamard,
    codebook: Arc<Codebook>,
    norm_correction: bool,
}

impl TurboQuantMse {
    /// The quantizer for rows of `head_dim` values at `bits` bits (1–4), rotation signs drawn
    /// from `seed`. Errors: [`Error::InvalidArgument`] for `head_dim` not a power of two or
    /// `bits` outside 1–4.
    pub fn new(head_dim: usize, bits: u8, norm_correction: bool, seed: u64) -> Result<Self> {
        Self::with_rotation(
            RandomizedHadamard::new(head_dim, seed)?,
            bits,
            norm_correction,
        )
    }

    /// As [`new`](Self::new) with a given rotation (tests, or a rotation shared with other
    /// rows). Errors: `bits` outside 1–4.
    pub fn with_rotation(rot: RandomizedHadamard, bits: u8, norm_correction: bool) -> Result<Self> {
        let codebook = Codebook::shared(bits, rot.dim())?;
        Ok(Self {
            rot,
            codebook,
            norm_correction,
        })
    }

    /// Dimension d.
    pub fn head_dim(&self) -> usize {
        self.rot.dim()
    }

    /// Bits per coordinate.
    pub fn bits(&self) -> u8 {
        self.codebook.bits()
    }

    /// Whether rows are stored norm-corrected (`‖x‖/‖ĉ‖`, see [`encode`](Self::encode)).
    pub fn norm_correction(&self) -> bool {
        self.norm_correction
    }

    /// The codebook (N(0, 1/d)).
    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }

    /// The rotation.
    pub fn rotation(&self) -> &RandomizedHadamard {
        &self.rot
    }

    /// Bytes per stored row: `ceil(d·bits/8) + 2`.
    pub fn row_bytes(&self) -> usize {
        Self::row_bytes_for(self.head_dim(), self.bits())
    }

    /// `ceil(head_dim·bits/8) + 2` without building a quantizer.
    pub const fn row_bytes_for(head_dim: usize, bits: u8) -> usize {
        packed_bytes(head_dim, bits) + 2
    }

    /// Quantizes `x` (`[d]` f32) into `out` (`row_bytes()` bytes). With norm correction the
    /// stored norm is `‖x‖/‖ĉ‖`, `ĉ` the row's centroid vector (its squares summed in element
    /// order; `‖x‖` where `‖ĉ‖` is 0), so decoding is the same multiply with or without it.
    /// Returns 1 when the stored norm (with norm correction `‖x‖/‖ĉ‖`, so a row saturates
    /// once `‖x‖ > 65504·‖ĉ‖`) exceeded f16's range and was saturated to 65504, else 0.
    pub fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let d = self.head_dim();
        assert_eq!(x.len(), d, "row length");
        let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        let mut codes = vec![0u8; d];
        let mut stored = norm;
        if norm > 0.0 && norm.is_finite() {
            let mut y: Vec<f32> = x.iter().map(|v| v / norm).collect();
            self.rot.forward(&mut y);
            for (c, &v) in codes.iter_mut().zip(&y) {
                *c = self.codebook.index(v);
            }
            if self.norm_correction {
                let cent = self.codebook.centroids();
                let cn = codes
                    .iter()
                    .map(|&c| cent[c as usize].powi(2))
                    .sum::<f32>()
                    .sqrt();
                if cn > 0.0 {
                    stored = norm / cn;
                }
            }
        }
        let (n16, sat) = f16_saturating(stored);
        out[..2].copy_from_slice(&n16.to_le_bytes());
        pack_bits(&codes, self.bits(), &mut out[2..]);
        sat as usize
    }

    /// The stored norm of a row.
    pub fn norm(&self, row: &[u8]) -> f32 {
        f16::from_le_bytes([row[0], row[1]]).to_f32()
    }

    /// The centroid vector in the rotated basis, `ŷ` (`[d]`): unit norm up to quantization (with
    /// norm correction the stored norm carries the rescale to exactly unit norm).
    pub(super) fn rotated_direction(&self, row: &[u8], out: &mut [f32]) {
        codes_to_f32(&row[2..], self.bits(), self.codebook.centroids(), 1.0, out);
    }

    /// The row in the rotated basis, `n·ŷ` with `n` the stored norm (`[d]`): score it against a
    /// query rotated with [`rotate_query`](Self::rotate_query) — `⟨R q, n·ŷ⟩ = ⟨q, x̂⟩` — so
    /// attention never applies the inverse rotation per key.
    pub fn decode_rotated(&self, row: &[u8], out: &mut [f32]) {
        self.rotated_direction(row, out);
        let n = self.norm(row);
        out.iter_mut().for_each(|v| *v *= n);
    }

    /// [`decode_rotated`](Self::decode_rotated) as attention's timed path computes it: the
    /// centroids times the stored norm in one multiply (the same vector bit for bit).
    pub fn decode_rotated_fast(&self, row: &[u8], out: &mut [f32]) {
        let (bits, c, n) = (self.bits(), self.codebook.centroids(), self.norm(row));
        codes_to_f32(&row[2..], bits, c, n, out)
    }

    /// Rotates a query (`[d]`) into the basis of [`decode_rotated`](Self::decode_rotated).
    pub fn rotate_query(&self, q: &mut [f32]) {
        self.rot.forward(q)
    }

    /// Dequantizes a row to `x̂` (`[d]` f32) in the original basis.
    pub fn decode(&self, row: &[u8], out: &mut [f32]) {
        self.decode_rotated(row, out);
        self.rot.inverse(out);
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::kv::quant::codebook::tests::MAX_1960;

    /// d = 4, 1 bit, no sign flips, x = (2, 0, 0, 0): ‖x‖ = 2 (f16 0x4000), R·x/‖x‖ = (½,½,½,½),
    /// all above the threshold 0 → codes 1111 → byte 0x0F. Decoding: ŷ = 0.7979/2·(1,1,1,1),
    /// H ŷ/2 = (0.7979, 0, 0, 0), × 2 = (1.5958, 0, 0, 0). With norm correction x comes back up
    /// to the f16 rounding of the stored 2/‖ŷ‖.
    #[test]
    fn turboquant_mse_one_bit_by_hand() {
        let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
        let q = TurboQuantMse::with_rotation(rot.clone(), 1, false).unwrap();
        assert_eq!(q.row_bytes(), 3);
        let mut row = [0u8; 3];
        assert_eq!(q.encode(&[2.0, 0.0, 0.0, 0.0], &mut row), 0);
        assert_eq!(row, [0x00, 0x40, 0x0F]);
        let mut out = [0f32; 4];
        q.decode(&row, &mut out);
        let c1 = (2.0 / std::f64::consts::PI).sqrt() as f32; // E|X| = √(2/π) = 0.79788
        assert!((out[0] - 2.0 * c1).abs() < 1e-5 && out[1..].iter().all(|v| v.abs() < 1e-6));
        // Norm correction: ‖ĉ‖ = √(4·(c1/2)²) = c1, stored 2/c1 = 2.50663 → f16 2.505859
        // (exponent 16, mantissa 259: 0x4103); x comes back up to that rounding.
        let nc = TurboQuantMse::with_rotation(rot, 1, true).unwrap();
        nc.encode(&[2.0, 0.0, 0.0, 0.0], &mut row);
        assert_eq!(row, [0x03, 0x41, 0x0F]);
        nc.decode(&row, &mut out);
        assert!((out[0] - 2.505859 * c1).abs() < 1e-5 && (out[0] - 2.0).abs() < 1e-3);
        assert!(out[1..].iter().all(|v| v.abs() < 1e-6));
    }

    /// d = 4, 2 bits, no sign flips, x = (0, 3, 0, 4): ‖x‖ = 5 (f16 0x4500), u = (0, .6, 0, .8),
    /// H u/2 = (0.7, −0.7, −0.1, 0.1). Levels for σ = ½ (Max ×½): ±0.2264, ±0.7552, thresholds 0,
    /// ±0.4908 → codes (3, 0, 1, 2) → 3 | 0<<2 | 1<<4 | 2<<6 = 0x93. Decoding:
    /// ŷ = (a, −a, −c, c) with a = 0.7552, c = 0.2264; Sylvester rows give
    /// H ŷ/2 = (0, (2a − 2c)/2, 0, (2a + 2c)/2) = (0, a − c, 0, a + c); × 5.
    /// Norm correction stores 5/‖ŷ‖ = 5/√(2a² + 2c²) = 5/1.11497 = 4.48443 instead: f16 4.484375
    /// (exponent 17, mantissa 124: 0x447C), the same codes.
    #[test]
    fn turboquant_mse_two_bits_by_hand() {
        let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
        let q = TurboQuantMse::with_rotation(rot.clone(), 2, false).unwrap();
        let mut row = [0u8; 3];
        q.encode(&[0.0, 3.0, 0.0, 4.0], &mut row);
        assert_eq!(row, [0x00, 0x45, 0x93]);
        let (a, c) = (1.5104f32 / 2.0, 0.4528f32 / 2.0);
        let want = [0.0, 5.0 * (a - c), 0.0, 5.0 * (a + c)];
        let mut out = [0f32; 4];
        q.decode(&row, &mut out);
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 5e-4, "{out:?} vs {want:?}");
        }
        let nc = TurboQuantMse::with_rotation(rot, 2, true).unwrap();
        nc.encode(&[0.0, 3.0, 0.0, 4.0], &mut row);
        assert_eq!(row, [0x7C, 0x44, 0x93]);
        nc.decode(&row, &mut out);
        let norm = (2.0 * a * a + 2.0 * c * c).sqrt();
        for (o, w) in out.iter().zip(want) {
            assert!((o - w / norm).abs() < 5e-4, "{out:?}");
        }
        // The rotated-basis decode scores like the decoded row: ⟨R q, ‖x‖ŷ⟩ = ⟨q, x̂⟩.
        let qv = [0.3f32, -1.0, 2.0, 0.5];
        let mut rq = qv;
        nc.rotate_query(&mut rq);
        let mut yr = [0f32; 4];
        nc.decode_rotated(&row, &mut yr);
        let d1: f32 = rq.iter().zip(&yr).map(|(a, b)| a * b).sum();
        let d2: f32 = qv.iter().zip(&out).map(|(a, b)| a * b).sum();
        assert!((d1 - d2).abs() < 1e-5);
    }

    /// Zero rows decode to zero; a norm beyond f16 saturates and is counted.
    #[test]
    fn turboquant_mse_zero_and_huge_rows() {
        let q = TurboQuantMse::new(8, 3, true, 5).unwrap();
        let mut row = vec![0u8; q.row_bytes()];
        assert_eq!(q.row_bytes(), 3 + 2);
        q.encode(&[0.0; 8], &mut row);
        let mut out = [1f32; 8];
        q.decode(&row, &mut out);
        assert_eq!(out, [0.0; 8]);
        assert_eq!(q.encode(&[1e5; 8], &mut row), 1);
        assert_eq!(q.norm(&row), 65504.0);
    }

    /// TurboQuant Thm 1 / Table: for unit vectors, `D_mse = E‖x − x̂‖²` ≈ 0.36, 0.117, 0.03, 0.009
    /// at b = 1..4 and ≤ √3·π/2·4^−b. Checked on 2000 Gaussian-direction unit vectors (d = 128,
    /// a fresh rotation seed per vector); the expected value is Max's MSE (the rotated coordinates
    /// are ≈ N(0, 1/d)), within 4 %.
    #[test]
    fn turboquant_mse_meets_theorem_1() {
        let d = 128;
        let mut rng = rand::rngs::StdRng::seed_from_u64(2504_19874);
        let xs: Vec<Vec<f32>> = (0..2000)
            .map(|_| {
                let v: Vec<f32> = (0..d)
                    .map(|_| {
                        let (u1, u2): (f64, f64) = (rng.random(), rng.random());
                        ((-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos())
                            as f32
                    })
                    .collect();
                let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
                v.iter().map(|a| a / n).collect()
            })
            .collect();
        for (b, (_, max_mse)) in (1u8..=4).zip(MAX_1960) {
            let bound = 3f64.sqrt() * std::f64::consts::PI / 2.0 * 4f64.powi(-(b as i32));
            let mut total = 0f64;
            for (i, x) in xs.iter().enumerate() {
                let q = TurboQuantMse::new(d, b, false, i as u64).unwrap();
                let mut row = vec![0u8; q.row_bytes()];
                q.encode(x, &mut row);
                let mut out = vec![0f32; d];
                q.decode(&row, &mut out);
                total += x
                    .iter()
                    .zip(&out)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum::<f64>();
            }
            let dmse = total / xs.len() as f64;
            assert!(dmse <= bound, "b={b}: {dmse} above the bound {bound}");
            assert!(
                (dmse - max_mse).abs() / max_mse < 0.04,
                "b={b}: {dmse} vs {max_mse}"
            );
        }
    }

    /// Where the Hadamard stand-in departs from the paper's random rotation: a one-hot row
    /// rotates to exactly ±1/√d on every coordinate, not a Gaussian. At 2 bits each maps to
    /// ±1.5104/√d (threshold 0.9816 < 1), so `‖x − x̂‖² = (1.5104 − 1)² = 0.2605` — above Thm 1's
    /// 0.117 (and its bound 0.170). Norm correction rescales (±1.5104/√d)·… back to ±1/√d and
    /// recovers the row exactly.
    #[test]
    fn one_hot_rows_show_the_hadamard_caveat_and_norm_correction_fixes_it() {
        let d = 64;
        let mut x = vec![0f32; d];
        x[5] = 1.0;
        for (nc, want) in [(false, (1.5104f32 - 1.0).powi(2)), (true, 0.0)] {
            let q = TurboQuantMse::new(d, 2, nc, 3).unwrap();
            let mut row = vec![0u8; q.row_bytes()];
            q.encode(&x, &mut row);
            let mut out = vec![0f32; d];
            q.decode(&row, &mut out);
            let err: f32 = x.iter().zip(&out).map(|(a, b)| (a - b).powi(2)).sum();
            assert!((err - want).abs() < 1e-3, "nc={nc}: {err} vs {want}");
        }
    }
}
