//! TurboQuant_prod (Zandieh et al. 2025, arXiv 2504.19874, §3.2, Alg. 2): the unbiased
//! inner-product quantizer, `b − 1` bits of [`TurboQuantMse`] plus a 1-bit QJL sketch of the
//! residual (Zandieh et al. 2024, arXiv 2406.03482), `sign(S·r)` with `S` a d×d standard
//! Gaussian matrix drawn from [`SplitMix64`], and `‖r‖`; `⟨q, x⟩` is estimated without bias.

use std::f64::consts::PI;

use half::f16;

use super::bits::{code_at, pack_bits, packed_bytes};
use super::mse::{f16_saturating, TurboQuantMse};
use super::rotation::RandomizedHadamard;
use crate::error::{Error, Result};
use crate::util::noise::SplitMix64;

/// TurboQuant_prod (TurboQuant §3.2, Alg. 2): an unbiased inner-product quantizer at `bits`
/// bits per coordinate. For a row `x` (`[d]` f32) with `u = x/‖x‖`:
///
/// 1. `u` is quantized with [`TurboQuantMse`] at `bits − 1` bits (no norm correction), `û`;
/// 2. the residual `r = u − û` is sketched with QJL (Zandieh et al. 2024, arXiv 2406.03482):
///    `z = sign(S·r)` (d bits; sign(0) = +1), `S` a d×d matrix of i.i.d. N(0, 1) drawn from
///    the seed, and `γ = ‖r‖` (f16);
/// 3. `⟨q, x⟩ ≈ ‖x‖·(⟨q, û⟩ + γ·√(π/2)/d·⟨S q, z⟩)`, unbiased over `S` because
///    `E[(s·q)·sign(s·r)] = √(2/π)·⟨q, r⟩/‖r‖` for `s ~ N(0, I)`.
///
/// Row layout: the MSE row (f16 `‖x‖`, `bits − 1`-bit indices), then f16 `γ`, then the `d` sign
/// bits LSB-first: [`row_bytes`](Self::row_bytes) = `ceil(d·(bits−1)/8) + 2 + 2 + ceil(d/8)`.
/// vLLM omits this variant (its note: QJL's variance hurts attention through the softmax);
/// kvbench measures it separately.
#[derive(Debug, Clone, PartialEq)]
pub struct TurboQuantProd {
    mse: TurboQuantMse,
    /// `[d, d]` row-major N(0, 1).
    s: Vec<f32>,
    /// `Sᵀ` (`[d, d]` row-major: column k of `S` at `k·d..k·d + d`), so [`Self::sketch`]
    /// advances every entry of `S·v` together.
    st: Vec<f32>,
}

/// A query prepared for scoring [`TurboQuantProd`] rows: `R q` and `S q` (`[d]` each).
#[derive(Debug, Clone, PartialEq)]
pub struct ProdQuery {
    rotated: Vec<f32>,
    sketched: Vec<f32>,
}

impl TurboQuantProd {
    /// The quantizer at `bits` bits in total (2–5: 1–4 MSE bits plus the QJL bit) for rows of
    /// `head_dim` values; rotation and `S` from `seed`.
    /// Errors: [`Error::InvalidArgument`] for `head_dim` not a power of two or `bits` outside
    /// 2–5.
    pub fn new(head_dim: usize, bits: u8, seed: u64) -> Result<Self> {
        let rot = RandomizedHadamard::new(head_dim, seed)?;
        // A second stream for S, so changing d never shifts the signs' draws.
        let mut rng = SplitMix64::new(seed ^ 0x5154_4A4C_5F53_4D41);
        let s = (0..head_dim * head_dim)
            .map(|_| rng.next_gaussian() as f32)
            .collect();
        Self::with_parts(rot, bits, s)
    }

    /// As [`new`](Self::new) with a given rotation and QJL matrix `s` (`[d, d]` row-major).
    /// Errors: `bits` outside 2–5, `s` of the wrong length or not finite.
    pub fn with_parts(rot: RandomizedHadamard, bits: u8, s: Vec<f32>) -> Result<Self> {
        if !(2..=5).contains(&bits) {
            return Err(Error::InvalidArgument {
                name: "TurboQuant_prod bits".into(),
                reason: format!("{bits} is not supported; use 2–5 (1–4 MSE bits + 1 QJL bit)"),
            });
        }
        let d = rot.dim();
        if s.len() != d * d || s.iter().any(|v| !v.is_finite()) {
            return Err(Error::InvalidArgument {
                name: "QJL matrix".into(),
                reason: format!("needs {} finite values ({d}×{d}), got {}", d * d, s.len()),
            });
        }
        let st = (0..d * d).map(|i| s[(i % d) * d + i / d]).collect();
        Ok(Self {
            mse: TurboQuantMse::with_rotation(rot, bits - 1, false)?,
            s,
            st,
        })
    }

    /// Dimension d.
    pub fn head_dim(&self) -> usize {
        self.mse.head_dim()
    }

    /// Bits per coordinate in total (MSE bits + 1).
    pub fn bits(&self) -> u8 {
        self.mse.bits() + 1
    }

    /// Bytes per stored row: `ceil(d·(bits−1)/8) + 4 + ceil(d/8)`.
    pub fn row_bytes(&self) -> usize {
        Self::row_bytes_for(self.head_dim(), self.bits())
    }

    /// The row size without building a quantizer.
    pub const fn row_bytes_for(head_dim: usize, bits: u8) -> usize {
        TurboQuantMse::row_bytes_for(head_dim, bits - 1) + 2 + packed_bytes(head_dim, 1)
    }

    /// The MSE stage (`bits − 1` bits, no norm correction).
    pub fn mse(&self) -> &TurboQuantMse {
        &self.mse
    }

    /// Bytes of the fixed QJL matrix as held, once per quantizer: `S` and its transpose in
    /// f32 (`2·d²·4`).
    pub fn matrix_bytes(&self) -> usize {
        (self.s.len() + self.st.len()) * 4
    }

    /// `S·v` (`[d]`): entry i is `Σ_k S_ik·v_k`, each product rounded, then added in k order
    /// (a plain sequential sum from −0.0, as `Iterator::sum` forms it), computed column by
    /// column of `S` (rows of `Sᵀ`, [`crate::kv::simd::cols_matvec`]) so the entries advance
    /// together in vector lanes: each lane performs the same operations in the same order as
    /// the sequential sum, so the result is the same to the bit, without its chain of d
    /// dependent additions.
    fn sketch(&self, v: &[f32]) -> Vec<f32> {
        let mut out = vec![-0.0f32; self.head_dim()];
        crate::kv::simd::cols_matvec(&self.st, v, &mut out);
        out
    }

    /// Quantizes `x` (`[d]`) into `out` (`row_bytes()` bytes). Returns how many f16 fields
    /// saturated (0 for any realistic key).
    pub fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        let mut sat = self.mse.encode(x, &mut out[..m]);
        let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        // Residual of the unit vector: r = u − û, û decoded from the stored indices.
        let mut r = vec![0f32; d];
        if norm > 0.0 && norm.is_finite() {
            let mut u_hat = vec![0f32; d];
            self.mse.rotated_direction(&out[..m], &mut u_hat);
            self.mse.rotation().inverse(&mut u_hat);
            for ((ri, &xi), &ui) in r.iter_mut().zip(x).zip(&u_hat) {
                *ri = xi / norm - ui;
            }
        }
        let gamma = r.iter().map(|v| v * v).sum::<f32>().sqrt();
        let (g16, s2) = f16_saturating(gamma);
        sat += s2 as usize;
        out[m..m + 2].copy_from_slice(&g16.to_le_bytes());
        let signs: Vec<u8> = self.sketch(&r).iter().map(|&v| (v >= 0.0) as u8).collect();
        pack_bits(&signs, 1, &mut out[m + 2..]);
        sat
    }

    /// Rotates and sketches a query (`[d]`) once for scoring many rows.
    pub fn prepare_query(&self, q: &[f32]) -> ProdQuery {
        let mut rotated = q.to_vec();
        self.mse.rotation().forward(&mut rotated);
        ProdQuery {
            rotated,
            sketched: self.sketch(q),
        }
    }

    /// The QJL matrix `S` (`[d, d]` row-major, N(0, 1) entries).
    pub fn matrix(&self) -> &[f32] {
        &self.s
    }

    /// The unbiased estimate of `⟨q, x⟩` from a stored row:
    /// `‖x‖·(⟨R q, ŷ⟩ + γ·√(π/2)/d·⟨S q, z⟩)` with `z ∈ {±1}^d`.
    pub fn score(&self, q: &ProdQuery, row: &[u8]) -> f32 {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        // ⟨R q, ŷ⟩ straight from the indices (no norm correction in the MSE stage, so ŷ is the
        // centroid vector itself): no scratch buffer on the scoring path.
        let (bits, c) = (self.mse.bits(), self.mse.codebook().centroids());
        let mse_part: f32 = q
            .rotated
            .iter()
            .enumerate()
            .map(|(i, &v)| v * c[code_at(&row[2..m], bits, i)])
            .sum();
        let gamma = f16::from_le_bytes([row[m], row[m + 1]]).to_f32();
        let z = &row[m + 2..];
        let qjl: f32 = q
            .sketched
            .iter()
            .enumerate()
            .map(|(i, &v)| if code_at(z, 1, i) == 1 { v } else { -v })
            .sum();
        let c = (PI / 2.0).sqrt() as f32 / d as f32;
        self.mse.norm(row) * (mse_part + gamma * c * qjl)
    }

    /// Dequantizes a row to `x̃ = ‖x‖·(û + γ·√(π/2)/d·Sᵀz)` (`[d]`), whose dot product with
    /// any `q` equals [`score`](Self::score): the form a generic decode-then-dot attention
    /// path reads.
    pub fn decode(&self, row: &[u8], out: &mut [f32]) {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        self.mse.rotated_direction(&row[..m], out);
        self.mse.rotation().inverse(out);
        let gamma = f16::from_le_bytes([row[m], row[m + 1]]).to_f32();
        let c = gamma * (PI / 2.0).sqrt() as f32 / d as f32;
        let z = &row[m + 2..];
        for (i, srow) in self.s.chunks_exact(d).enumerate() {
            let zi = if code_at(z, 1, i) == 1 { c } else { -c };
            out.iter_mut().zip(srow).for_each(|(o, s)| *o += zi * s);
        }
        let n = self.mse.norm(row);
        out.iter_mut().for_each(|v| *v *= n);
    }
}

/// Byte `b` of sign bits as eight ±1.0 (bit `i` set → +1 at `i`), built once: QJL's `z`
/// eight at a time.
fn sign_table() -> &'static [[f32; 8]; 256] {
    static T: std::sync::OnceLock<[[f32; 8]; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [[0f32; 8]; 256];
        for (b, e) in t.iter_mut().enumerate() {
            for (i, v) in e.iter_mut().enumerate() {
                *v = if (b >> i) & 1 == 1 { 1.0 } else { -1.0 };
            }
        }
        t
    })
}

impl ProdQuery {
    /// The query as one `[2d]` vector `[R q, S q]`: its dot product with
    /// [`TurboQuantProd::decode_split`]'s row is [`TurboQuantProd::score`].
    pub fn concat(&self) -> Vec<f32> {
        [self.rotated.as_slice(), self.sketched.as_slice()].concat()
    }

    /// `R q` (`[d]`).
    pub fn rotated(&self) -> &[f32] {
        &self.rotated
    }

    /// `S q` (`[d]`): the query's QJL sketch.
    pub fn sketched(&self) -> &[f32] {
        &self.sketched
    }
}

impl TurboQuantProd {
    /// A stored row's QJL factor `‖x‖·γ·√(π/2)/d` (the sketch half of the estimator is this
    /// times `⟨S q, z⟩`), as every timed path computes it.
    pub fn qjl_scale(&self, row: &[u8]) -> f32 {
        let m = self.mse.row_bytes();
        let gamma = f16::from_le_bytes([row[m], row[m + 1]]).to_f32();
        self.mse.norm(row) * gamma * (PI / 2.0).sqrt() as f32 / self.head_dim() as f32
    }

    /// QJL's constant `√(π/2)/d` (as an f32): the timed paths multiply a row's `‖x‖·γ` by it
    /// (per call, not per row).
    pub fn qjl_factor(&self) -> f32 {
        (PI / 2.0).sqrt() as f32 / self.head_dim() as f32
    }

    /// A stored row as one `[2d]` vector `[‖x‖·ŷ, ‖x‖·γ·√(π/2)/d·z]` (`z ∈ {±1}^d`), so that
    /// its dot product with [`ProdQuery::concat`] is the estimator of
    /// [`score`](Self::score) (TurboQuant §3.2, Alg. 2) as one plain dot product of 2d terms:
    /// attention's tiled f32 kernels score it without reading bits per query. Panics on a
    /// wrong `out` length (`2d`; a caller's sizing bug).
    pub fn decode_split(&self, row: &[u8], out: &mut [f32]) {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        assert!(out.len() == 2 * d, "split row size");
        let n = self.mse.norm(row);
        let c = self.mse.codebook().centroids();
        super::bits::codes_to_f32(&row[2..m], self.mse.bits(), c, n, &mut out[..d]);
        let k = self.qjl_scale(row);
        let z = &row[m + 2..];
        let (signs, kv) = (sign_table(), [k; 8]);
        for (o, &byte) in out[d..].chunks_exact_mut(8).zip(z) {
            for ((o, &s), &k) in o.iter_mut().zip(&signs[byte as usize]).zip(&kv) {
                *o = s * k; // ±k exactly
            }
        }
        for (i, o) in out[d..].iter_mut().enumerate().skip(d / 8 * 8) {
            *o = if (z[i / 8] >> (i % 8)) & 1 == 1 {
                k
            } else {
                -k
            };
        }
    }

    /// Adds `w · x̃` of one stored row to a weighted sum kept in two parts, so the d×d QJL
    /// matrix is applied once per sum instead of once per row: `racc` (`[d]`) gathers
    /// `w·‖x‖·ŷ` in the rotated basis and `zacc` (`[d]`) gathers `w·‖x‖·γ·√(π/2)/d·z` in the
    /// sketch basis. [`finish_sum`](Self::finish_sum) turns them into `Σ w·x̃` — the same
    /// value as summing [`decode`](Self::decode)d rows, by linearity (up to float rounding).
    pub fn accumulate(&self, row: &[u8], w: f32, racc: &mut [f32], zacc: &mut [f32]) {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        let wn = w * self.mse.norm(row);
        let (bits, c) = (self.mse.bits(), self.mse.codebook().centroids());
        for (i, a) in racc.iter_mut().enumerate() {
            *a += wn * c[code_at(&row[2..m], bits, i)];
        }
        let gamma = f16::from_le_bytes([row[m], row[m + 1]]).to_f32();
        let cz = wn * gamma * (PI / 2.0).sqrt() as f32 / d as f32;
        let z = &row[m + 2..];
        for (i, a) in zacc.iter_mut().enumerate() {
            *a += if code_at(z, 1, i) == 1 { cz } else { -cz };
        }
    }

    /// [`accumulate`](Self::accumulate) for several queries at once: weights `wt` (`[nq]`),
    /// sums `racc`, `zacc` (`[nq, d]`); the row's indices and sign bits are unpacked once
    /// (into the scratch `codes`, `d` bytes) instead of once per query and element, and every
    /// sum gets the same products and additions as `accumulate` (equal bit for bit).
    /// Queries with weight 0 are skipped.
    pub fn accumulate_many(
        &self,
        row: &[u8],
        wt: &[f32],
        racc: &mut [f32],
        zacc: &mut [f32],
        codes: &mut [u8],
    ) {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        let n = self.mse.norm(row);
        super::bits::unpack_bits(&row[2..m], self.mse.bits(), codes);
        let c = self.mse.codebook().centroids();
        let gamma = f16::from_le_bytes([row[m], row[m + 1]]).to_f32();
        let z = &row[m + 2..];
        for ((r, za), &w) in racc
            .chunks_exact_mut(d)
            .zip(zacc.chunks_exact_mut(d))
            .zip(wt)
        {
            if w == 0.0 {
                continue;
            }
            let wn = w * n;
            for (a, &k) in r.iter_mut().zip(codes.iter()) {
                *a += wn * c[k as usize];
            }
            let cz = wn * gamma * (PI / 2.0).sqrt() as f32 / d as f32;
            // ±1 · cz is ±cz exactly: the same additions as `accumulate`, eight at a time.
            let signs = sign_table();
            for (a8, &byte) in za.chunks_exact_mut(8).zip(z) {
                for (a, &sg) in a8.iter_mut().zip(&signs[byte as usize]) {
                    *a += sg * cz;
                }
            }
            for (i, a) in za.iter_mut().enumerate().skip(d / 8 * 8) {
                *a += if (z[i / 8] >> (i % 8)) & 1 == 1 {
                    cz
                } else {
                    -cz
                };
            }
        }
    }

    /// Adds the sum gathered by [`accumulate`](Self::accumulate) to `out` (`[d]`):
    /// `R⁻¹·racc + Sᵀ·zacc`. `racc` is rotated in place (scratch afterwards).
    pub fn finish_sum(&self, racc: &mut [f32], zacc: &[f32], out: &mut [f32]) {
        self.mse.rotation().inverse(racc);
        out.iter_mut().zip(racc.iter()).for_each(|(o, r)| *o += r);
        // `out += Sᵀ·zacc`, rows of S in order (each product rounded, then added; a zero
        // `zacc` entry adds ±0, which leaves every value as it was, a −0.0 sum becoming +0.0).
        crate::kv::simd::cols_matvec(&self.s, zacc, out);
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// The column-by-column sketch equals the plain sequential sum `Σ_k S_ik·v_k` (each
    /// product rounded, added in k order: the definition, written out here) to the bit, for
    /// every entry, on random S and v at d 16/64/128.
    #[test]
    fn sketch_equals_the_sequential_sum_to_the_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3482);
        for d in [16usize, 64, 128] {
            let q = TurboQuantProd::new(d, 3, d as u64).unwrap();
            for _ in 0..5 {
                let v: Vec<f32> = (0..d).map(|_| rng.random_range(-3.0..3.0)).collect();
                let got = q.sketch(&v);
                for (i, row) in q.matrix().chunks_exact(d).enumerate() {
                    let mut want = -0.0f32;
                    for (a, b) in row.iter().zip(&v) {
                        want += a * b;
                    }
                    assert_eq!(got[i].to_bits(), want.to_bits(), "d={d} entry {i}");
                }
            }
        }
    }

    /// QJL by hand with S = I, d = 4, 2 bits (1 MSE bit + QJL), no sign flips, x = (2, 0, 0, 0):
    /// the MSE part is the 1-bit example above, û = (0.79788, 0, 0, 0), r = u − û =
    /// (0.20212, 0, 0, 0), γ = ‖r‖ (stored as f16), S r = r → z = (+, +, +, +) (sign(0) = +1) →
    /// 0x0F. x̃ = 2·(û + γ·√(π/2)/4·(1, 1, 1, 1)); for q = (1, 1, 0, 0): ⟨Sq, z⟩ = 2 and the score
    /// is 2·(0.79788 + γ·√(π/2)/4·2).
    #[test]
    fn qjl_by_hand_with_identity_sketch() {
        let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
        let mut s = vec![0f32; 16];
        for i in 0..4 {
            s[i * 4 + i] = 1.0;
        }
        let p = TurboQuantProd::with_parts(rot, 2, s).unwrap();
        assert_eq!(p.row_bytes(), 3 + 2 + 1);
        assert_eq!(p.bits(), 2);
        let mut row = [0u8; 6];
        p.encode(&[2.0, 0.0, 0.0, 0.0], &mut row);
        let c1 = (2.0 / std::f64::consts::PI).sqrt() as f32;
        let gamma = f16::from_f32(1.0 - c1);
        let g = gamma.to_le_bytes();
        assert_eq!(row, [0x00, 0x40, 0x0F, g[0], g[1], 0x0F]);
        let k = gamma.to_f32() * (std::f64::consts::PI / 2.0).sqrt() as f32 / 4.0;
        let mut out = [0f32; 4];
        p.decode(&row, &mut out);
        let want = [2.0 * (c1 + k), 2.0 * k, 2.0 * k, 2.0 * k];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-5, "{out:?} vs {want:?}");
        }
        let q = p.prepare_query(&[1.0, 1.0, 0.0, 0.0]);
        assert!((p.score(&q, &row) - 2.0 * (c1 + 2.0 * k)).abs() < 1e-5);
    }

    /// The TurboQuant_prod estimate of ⟨q, x⟩ is unbiased (Thm 2): its mean over 4000 seeds
    /// (fresh rotation and S each) lies within 4 standard errors of the true dot product, at
    /// 2 and 3 bits; and `score` equals ⟨q, decode(row)⟩.
    #[test]
    fn qjl_estimator_is_unbiased_over_seeds() {
        let d = 32;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let x: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let qv: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let truth: f64 = x.iter().zip(&qv).map(|(a, b)| (a * b) as f64).sum();
        for bits in [2u8, 3] {
            let n = 4000;
            let mut est = Vec::with_capacity(n);
            for seed in 0..n as u64 {
                let p = TurboQuantProd::new(d, bits, seed).unwrap();
                let mut row = vec![0u8; p.row_bytes()];
                p.encode(&x, &mut row);
                let q = p.prepare_query(&qv);
                let e = p.score(&q, &row);
                if seed < 20 {
                    let mut xt = vec![0f32; d];
                    p.decode(&row, &mut xt);
                    let dd: f32 = xt.iter().zip(&qv).map(|(a, b)| a * b).sum();
                    assert!((dd - e).abs() < 1e-3 * (1.0 + e.abs()), "{dd} vs {e}");
                }
                est.push(e as f64);
            }
            let m = est.iter().sum::<f64>() / n as f64;
            let sd = (est.iter().map(|e| (e - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
            let se = sd / (n as f64).sqrt();
            assert!(
                (m - truth).abs() < 4.0 * se,
                "bits {bits}: mean {m} vs {truth} (se {se})"
            );
            assert!(sd > 0.0);
        }
    }

    /// `accumulate_many` (indices unpacked once per row) gives the sums of `accumulate` (bit
    /// reads per element and query, checked against decoded rows in the stream's tests) bit
    /// for bit, at every width, with a zero weight skipped.
    #[test]
    fn accumulate_many_equals_accumulate() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for (d, bits) in [(32usize, 2u8), (64, 3), (64, 4), (128, 5)] {
            let p = TurboQuantProd::new(d, bits, 1).unwrap();
            let nq = 3;
            let (mut r1, mut z1) = (vec![0f32; nq * d], vec![0f32; nq * d]);
            let (mut r2, mut z2) = (r1.clone(), z1.clone());
            let mut codes = vec![0u8; d];
            let mut row = vec![0u8; p.row_bytes()];
            for t in 0..10 {
                let x: Vec<f32> = (0..d).map(|_| rng.random_range(-2.0..2.0)).collect();
                p.encode(&x, &mut row);
                let w: Vec<f32> = (0..nq)
                    .map(|j| {
                        if j == t % nq {
                            0.0
                        } else {
                            rng.random_range(0.0..1.0)
                        }
                    })
                    .collect();
                p.accumulate_many(&row, &w, &mut r1, &mut z1, &mut codes);
                for (j, &wj) in w.iter().enumerate() {
                    if wj != 0.0 {
                        let (r, z) = (&mut r2[j * d..(j + 1) * d], &mut z2[j * d..(j + 1) * d]);
                        p.accumulate(&row, wj, r, z);
                    }
                }
            }
            assert_eq!((r1, z1), (r2, z2), "d={d} bits={bits}");
        }
    }

    #[test]
    fn prod_rejects_bad_input() {
        assert!(TurboQuantProd::new(16, 1, 0).is_err());
        assert!(TurboQuantProd::new(16, 6, 0).is_err());
        assert!(TurboQuantProd::new(12, 3, 0).is_err());
        let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
        assert!(TurboQuantProd::with_parts(rot, 3, vec![0.0; 15]).is_err());
        assert_eq!(TurboQuantProd::row_bytes_for(128, 4), 48 + 2 + 2 + 16);
    }
}
