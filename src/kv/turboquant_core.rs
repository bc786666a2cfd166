//! TurboQuant's building blocks (Zandieh et al. 2025, arXiv 2504.19874) and the b-bit
//! asymmetric row codec its values and 2-bit KIVI need. Pure, self-contained cores: nothing here
//! knows about caches, layers or the CLI; the cache formats wrap them.
//!
//! - [`Codebook`]: the Lloyd–Max scalar quantizer of N(0, σ²) at 1–4 bits (Max 1960), solved
//!   here from the Gaussian's closed-form cell moments (no numerical quadrature). TurboQuant
//!   (§3.1, Thm 1) quantizes each coordinate of a randomly rotated unit vector with the
//!   codebook of N(0, 1/d), the coordinates' limiting distribution.
//! - [`RandomizedHadamard`]: the rotation `x ↦ H·D·x / √d` with `D` a seeded diagonal of random
//!   signs, as vLLM's TurboQuant (the paper uses a dense random orthogonal matrix; the Hadamard
//!   form is the `O(d log d)` stand-in every implementation ships, QuaRot §3).
//! - [`TurboQuantMse`]: one key (or value) row: `‖x‖` as f16, then the codebook index of every
//!   rotated coordinate of `x/‖x‖`, packed at `b` bits: `ceil(d·b/8) + 2` bytes, as vLLM's
//!   `key_packed_size`. Optional norm correction (vLLM's `_nc` presets): the decoded centroid
//!   vector is rescaled to unit norm before the inverse rotation.
//! - [`TurboQuantProd`]: the paper's inner-product quantizer (Alg. 2, TurboQuant_prod): `b − 1`
//!   bits of MSE quantization plus a 1-bit QJL sketch of the residual, `sign(S·r)` with `S` a
//!   d×d standard Gaussian matrix, and `‖r‖`; `⟨q, x⟩` is estimated without bias.
//! - [`UniformGroupRow`]: asymmetric (min/max) uniform quantization at 2, 3 or 4 bits per group
//!   along head_dim (f16 scale and f16 minimum per group): TurboQuant's values (vLLM: one group
//!   = the whole row, `ceil(d·b/8) + 4` bytes) and KIVI's 2-bit per-token values. At 4 bits it
//!   stores exactly the bytes of [`super::format::Int4GroupRow`].
//! - [`TurboQuantPreset`]: vLLM's named presets (`turboquant_k8v4`, `turboquant_4bit_nc`,
//!   `turboquant_k3v4_nc`, `turboquant_3bit_nc`) with their byte formulas.
//!
//! Every random choice (signs, `S`) comes from [`SplitMix64`] seeded by the caller, so a seed
//! recorded in a run's metadata reproduces the same rotation on any build (the `rand` crate's
//! `StdRng` does not promise a stable stream across versions).
//!
//! Bit packing ([`pack_bits`]) is little-endian and LSB-first: code `i` occupies bits
//! `i·b .. (i+1)·b` of the byte string, so at 4 bits element `2j` is the low nibble of byte `j`
//! (the layout of [`super::format::Int4GroupRow`] and KIVI's 4-bit channel blocks), and a 3-bit
//! code may straddle two bytes.

use std::collections::HashMap;
use std::f64::consts::{FRAC_1_SQRT_2, PI};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

use half::f16;
use statrs::function::erf::erfc;

use super::codec::{f16_round_down, f16_round_up, RowCodec};
use super::{Fp8Kind, Fp8Scale, Quant};
use crate::error::{Error, Result};
/// Re-exported from [`crate::util::noise`], its home: `quality::paired` and `measure::sweep`
/// still name it by this path.
pub use crate::util::noise::SplitMix64;

/// Bit widths [`Codebook`] solves (1–4: 2 to 16 levels).
pub const CODEBOOK_BITS: std::ops::RangeInclusive<u8> = 1..=4;

fn invalid(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

// ---------------------------------------------------------------------------------------------
// Lloyd–Max codebook of a Gaussian
// ---------------------------------------------------------------------------------------------

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
            return Err(invalid(
                "codebook bits",
                format!("{bits} is not supported; use 1, 2, 3 or 4"),
            ));
        }
        if !(sigma.is_finite() && sigma > 0.0) {
            return Err(invalid(
                "codebook sigma",
                format!("{sigma} must be a finite positive standard deviation"),
            ));
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
            return Err(invalid("head_dim", "must be at least 1".into()));
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

// ---------------------------------------------------------------------------------------------
// Seeded randomness and the rotation
// ---------------------------------------------------------------------------------------------

/// The randomized Hadamard rotation `R x = H·D·x / √d` (`D` = diagonal of ±1 signs, `H` the
/// Sylvester–Hadamard matrix), applied in place to rows of `d` f32 values; `R⁻¹ = D·H/√d`.
/// Orthogonal, so norms and inner products are preserved. Source: vLLM's TurboQuant (Hadamard
/// with random signs), QuaRot §3; kvbench's [`super::stream::hadamard`] does the transform.
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
            return Err(invalid(
                "head_dim",
                format!("TurboQuant's Hadamard rotation needs a power of two, got {d}"),
            ));
        }
        if let Some(s) = signs.iter().find(|&&s| s != 1.0 && s != -1.0) {
            return Err(invalid("rotation signs", format!("{s} is not ±1")));
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
        super::stream::hadamard(x, self.dim());
    }

    /// `x ← D·H·x/√d`, the inverse of [`forward`](Self::forward).
    pub fn inverse(&self, x: &mut [f32]) {
        assert_eq!(x.len(), self.dim(), "rotation of a row of the wrong length");
        super::stream::hadamard(x, self.dim());
        x.iter_mut().zip(&self.signs).for_each(|(v, s)| *v *= s);
    }
}

// ---------------------------------------------------------------------------------------------
// Bit packing
// ---------------------------------------------------------------------------------------------

/// Bytes `n` codes of `bits` bits take packed: `ceil(n·bits/8)`.
pub const fn packed_bytes(n: usize, bits: u8) -> usize {
    (n * bits as usize).div_ceil(8)
}

/// Packs `codes` (each `< 2^bits`, `bits` 1–8) LSB-first into `out`
/// (`packed_bytes(codes.len(), bits)` bytes; overwritten). Panics on a wrong `out` length
/// (a caller's sizing bug, not user input).
pub fn pack_bits(codes: &[u8], bits: u8, out: &mut [u8]) {
    assert_eq!(
        out.len(),
        packed_bytes(codes.len(), bits),
        "packed buffer size"
    );
    out.fill(0);
    let mask = ((1u16 << bits) - 1) as u8;
    for (i, &c) in codes.iter().enumerate() {
        let bit = i * bits as usize;
        let v = ((c & mask) as u16) << (bit % 8);
        out[bit / 8] |= v as u8;
        if bit % 8 + bits as usize > 8 {
            out[bit / 8 + 1] |= (v >> 8) as u8;
        }
    }
}

/// Unpacks `out.len()` codes of `bits` bits from `packed` (the inverse of [`pack_bits`]).
/// Panics when `packed` is shorter than `packed_bytes(out.len(), bits)`.
#[inline]
pub fn unpack_bits(packed: &[u8], bits: u8, out: &mut [u8]) {
    assert!(
        packed.len() >= packed_bytes(out.len(), bits),
        "packed buffer size"
    );
    let mask = (1u16 << bits) - 1;
    for (i, o) in out.iter_mut().enumerate() {
        let bit = i * bits as usize;
        let lo = packed[bit / 8] as u16;
        let hi = if bit % 8 + bits as usize > 8 {
            (packed[bit / 8 + 1] as u16) << 8
        } else {
            0
        };
        *o = (((lo | hi) >> (bit % 8)) & mask) as u8;
    }
}

/// Code `i` of a packed string (see [`pack_bits`]).
#[inline]
fn code_at(packed: &[u8], bits: u8, i: usize) -> usize {
    let bit = i * bits as usize;
    let lo = packed[bit / 8] as u16;
    let hi = if bit % 8 + bits as usize > 8 {
        (packed[bit / 8 + 1] as u16) << 8
    } else {
        0
    };
    (((lo | hi) >> (bit % 8)) & ((1u16 << bits) - 1)) as usize
}

// ---------------------------------------------------------------------------------------------
// TurboQuant_mse rows
// ---------------------------------------------------------------------------------------------

/// Stores `v` as f16, saturating at ±65504 instead of overflowing; returns whether it saturated.
fn f16_saturating(v: f32) -> (f16, bool) {
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
/// in the N(0, 1/d) [`Codebook`], optionally rescales that vector to unit norm
/// (`norm_correction`, vLLM's `_nc` presets), rotates back and multiplies by `‖x‖`.
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

    /// Whether decoding rescales the centroid vector to unit norm.
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

    /// Quantizes `x` (`[d]` f32) into `out` (`row_bytes()` bytes). Returns 1 when `‖x‖`
    /// exceeded f16's range and was saturated, else 0.
    pub fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let d = self.head_dim();
        assert_eq!(x.len(), d, "row length");
        let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        let (n16, sat) = f16_saturating(norm);
        out[..2].copy_from_slice(&n16.to_le_bytes());
        let mut codes = vec![0u8; d];
        if norm > 0.0 && norm.is_finite() {
            let mut y: Vec<f32> = x.iter().map(|v| v / norm).collect();
            self.rot.forward(&mut y);
            for (c, &v) in codes.iter_mut().zip(&y) {
                *c = self.codebook.index(v);
            }
        }
        pack_bits(&codes, self.bits(), &mut out[2..]);
        sat as usize
    }

    /// The stored norm of a row.
    pub fn norm(&self, row: &[u8]) -> f32 {
        f16::from_le_bytes([row[0], row[1]]).to_f32()
    }

    /// The unit-norm direction in the rotated basis, `ŷ` (`[d]`): centroids, rescaled to unit
    /// norm with norm correction.
    fn rotated_direction(&self, row: &[u8], out: &mut [f32]) {
        let (bits, c) = (self.bits(), self.codebook.centroids());
        for (i, o) in out.iter_mut().enumerate() {
            *o = c[code_at(&row[2..], bits, i)];
        }
        if self.norm_correction {
            let n = out.iter().map(|v| v * v).sum::<f32>().sqrt();
            if n > 0.0 {
                out.iter_mut().for_each(|v| *v /= n);
            }
        }
    }

    /// The row in the rotated basis, `‖x‖·ŷ` (`[d]`): score it against a query rotated with
    /// [`rotate_query`](Self::rotate_query) — `⟨R q, ‖x‖ŷ⟩ = ⟨q, x̂⟩` — so attention never
    /// applies the inverse rotation per key.
    pub fn decode_rotated(&self, row: &[u8], out: &mut [f32]) {
        self.rotated_direction(row, out);
        let n = self.norm(row);
        out.iter_mut().for_each(|v| *v *= n);
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

// ---------------------------------------------------------------------------------------------
// TurboQuant_prod: MSE + 1-bit QJL of the residual
// ---------------------------------------------------------------------------------------------

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
            return Err(invalid(
                "TurboQuant_prod bits",
                format!("{bits} is not supported; use 2–5 (1–4 MSE bits + 1 QJL bit)"),
            ));
        }
        let d = rot.dim();
        if s.len() != d * d || s.iter().any(|v| !v.is_finite()) {
            return Err(invalid(
                "QJL matrix",
                format!("needs {} finite values ({d}×{d}), got {}", d * d, s.len()),
            ));
        }
        Ok(Self {
            mse: TurboQuantMse::with_rotation(rot, bits - 1, false)?,
            s,
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

    /// Bytes of the fixed QJL matrix if held as f32 (`d²·4`), once per quantizer.
    pub fn matrix_bytes(&self) -> usize {
        self.s.len() * 4
    }

    /// `S·v` (`[d]`).
    fn sketch(&self, v: &[f32]) -> Vec<f32> {
        self.s
            .chunks_exact(self.head_dim())
            .map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum())
            .collect()
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
            self.mse.rot.inverse(&mut u_hat);
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
        self.mse.rot.forward(&mut rotated);
        ProdQuery {
            rotated,
            sketched: self.sketch(q),
        }
    }

    /// The unbiased estimate of `⟨q, x⟩` from a stored row:
    /// `‖x‖·(⟨R q, ŷ⟩ + γ·√(π/2)/d·⟨S q, z⟩)` with `z ∈ {±1}^d`.
    pub fn score(&self, q: &ProdQuery, row: &[u8]) -> f32 {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        // ⟨R q, ŷ⟩ straight from the indices (no norm correction in the MSE stage, so ŷ is the
        // centroid vector itself): no scratch buffer on the scoring path.
        let (bits, c) = (self.mse.bits(), self.mse.codebook.centroids());
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
        self.mse.rot.inverse(out);
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

impl TurboQuantProd {
    /// Adds `w · x̃` of one stored row to a weighted sum kept in two parts, so the d×d QJL
    /// matrix is applied once per sum instead of once per row: `racc` (`[d]`) gathers
    /// `w·‖x‖·ŷ` in the rotated basis and `zacc` (`[d]`) gathers `w·‖x‖·γ·√(π/2)/d·z` in the
    /// sketch basis. [`finish_sum`](Self::finish_sum) turns them into `Σ w·x̃` — the same
    /// value as summing [`decode`](Self::decode)d rows, by linearity (up to float rounding).
    pub fn accumulate(&self, row: &[u8], w: f32, racc: &mut [f32], zacc: &mut [f32]) {
        let d = self.head_dim();
        let m = self.mse.row_bytes();
        let wn = w * self.mse.norm(row);
        let (bits, c) = (self.mse.bits(), self.mse.codebook.centroids());
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

    /// Adds the sum gathered by [`accumulate`](Self::accumulate) to `out` (`[d]`):
    /// `R⁻¹·racc + Sᵀ·zacc`. `racc` is rotated in place (scratch afterwards).
    pub fn finish_sum(&self, racc: &mut [f32], zacc: &[f32], out: &mut [f32]) {
        let d = self.head_dim();
        self.mse.rot.inverse(racc);
        out.iter_mut().zip(racc.iter()).for_each(|(o, r)| *o += r);
        for (srow, &zi) in self.s.chunks_exact(d).zip(zacc) {
            if zi != 0.0 {
                out.iter_mut().zip(srow).for_each(|(o, s)| *o += zi * s);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// b-bit asymmetric uniform rows (TurboQuant values, 2-bit KIVI values)
// ---------------------------------------------------------------------------------------------

/// Asymmetric uniform parameters for values in `[lo, hi]` at `bits` bits: the f16 minimum `m`
/// rounded down and the f16 step `s = (hi − m)/(2^bits − 1)` rounded up, so every value of the
/// range maps inside `[0, 2^bits − 1]` and `|x − (m + q·s)| ≤ s/2`. The same rounding as
/// [`super::format::Int4GroupRow`] and KIVI's 4-bit channel blocks (KIVI §3.1), for any width:
/// what a 2-bit per-channel block needs per channel.
pub fn asym_params(lo: f32, hi: f32, bits: u8) -> (f16, f16) {
    let m = f16_round_down(lo);
    let s = f16_round_up((hi - m.to_f32()) / ((1u32 << bits) - 1) as f32);
    (s, m)
}

/// The code of `v` under [`asym_params`]' `(scale, min)`: `round((v − m)/s)` clamped to
/// `[0, 2^bits − 1]` (0 when the step is 0).
#[inline]
pub fn asym_code(v: f32, scale: f16, min: f16, bits: u8) -> u8 {
    let s = scale.to_f32();
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    ((v - min.to_f32()) * inv)
        .round()
        .clamp(0.0, ((1u32 << bits) - 1) as f32) as u8
}

/// Asymmetric uniform quantization at 2, 3 or 4 bits per group of `group` elements along
/// head_dim: per group an f16 scale, an f16 minimum, then `group` codes packed at `bits`
/// (LSB-first): `head_dim/group · (4 + group·bits/8)` bytes per row.
///
/// - TurboQuant values (vLLM: `value_packed_size = ceil(d·b/8) + 4`, one group = the row):
///   `UniformGroupRow { bits, group: head_dim }`.
/// - KIVI's 2-bit per-token values (KIVI §3.2, group 32): `UniformGroupRow { bits: 2, group: 32 }`.
/// - At 4 bits the bytes equal [`super::format::Int4GroupRow`]'s for the same group.
///
/// Round trip: `|x − x̂| ≤ s/2` per element with `s` the group's stored step (plus f32
/// rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniformGroupRow {
    bits: u8,
    group: usize,
}

impl UniformGroupRow {
    /// A codec at `bits` (2–4) with `group` elements per group.
    /// Errors: [`Error::InvalidArgument`] for other widths, a zero group or one whose codes do
    /// not fill whole bytes (`group·bits` not a multiple of 8).
    pub fn new(bits: u8, group: usize) -> Result<Self> {
        if !(2..=4).contains(&bits) {
            return Err(invalid(
                "uniform bits",
                format!("{bits} is not supported; use 2, 3 or 4"),
            ));
        }
        if group == 0 || !(group * bits as usize).is_multiple_of(8) {
            return Err(invalid(
                "group",
                format!("{group} elements × {bits} bits must be a positive whole number of bytes"),
            ));
        }
        Ok(Self { bits, group })
    }

    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Elements per group.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Checks a head_dim against the group. Errors: `head_dim` not a multiple of the group.
    pub fn validate(&self, head_dim: usize) -> Result<()> {
        if head_dim == 0 || !head_dim.is_multiple_of(self.group) {
            return Err(invalid(
                "head_dim",
                format!("{head_dim} must be a multiple of the group {}", self.group),
            ));
        }
        Ok(())
    }

    fn block(&self) -> usize {
        4 + packed_bytes(self.group, self.bits)
    }
}

impl RowCodec for UniformGroupRow {
    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim / self.group * self.block()
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let mut codes = vec![0u8; self.group];
        for (xs, o) in x
            .chunks_exact(self.group)
            .zip(out.chunks_exact_mut(self.block()))
        {
            let (lo, hi) = xs
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            let (s, m) = asym_params(lo, hi, self.bits);
            o[..2].copy_from_slice(&s.to_le_bytes());
            o[2..4].copy_from_slice(&m.to_le_bytes());
            for (c, &v) in codes.iter_mut().zip(xs) {
                *c = asym_code(v, s, m, self.bits);
            }
            pack_bits(&codes, self.bits, &mut o[4..]);
        }
        0
    }

    fn decode(&self, row: &[u8], out: &mut [f32]) {
        for (b, o) in row
            .chunks_exact(self.block())
            .zip(out.chunks_exact_mut(self.group))
        {
            let s = f16::from_le_bytes([b[0], b[1]]).to_f32();
            let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
            for (i, v) in o.iter_mut().enumerate() {
                *v = m + code_at(&b[4..], self.bits, i) as f32 * s;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A stream of TurboQuant rows (what the cache's K or V of one head holds)
// ---------------------------------------------------------------------------------------------

/// Which TurboQuant row format a [`TurboQuantStream`] holds; shared (`Arc`) by every stream of a
/// layer so the rotation, codebook and QJL matrix exist once.
#[derive(Debug, Clone)]
pub enum TqCodec {
    /// [`TurboQuantMse`] rows (keys or values).
    Mse(Arc<TurboQuantMse>),
    /// [`TurboQuantProd`] rows (keys: the estimator targets ⟨q, k⟩).
    Prod(Arc<TurboQuantProd>),
}

impl TqCodec {
    fn head_dim(&self) -> usize {
        match self {
            TqCodec::Mse(c) => c.head_dim(),
            TqCodec::Prod(c) => c.head_dim(),
        }
    }

    fn row_bytes(&self) -> usize {
        match self {
            TqCodec::Mse(c) => c.row_bytes(),
            TqCodec::Prod(c) => c.row_bytes(),
        }
    }
}

/// The stored TurboQuant rows of one (sequence, kv head, K or V), read by attention in their
/// stored form: [`Stream::dot_rows`] rotates the queries once (`R q`) and scores each key on
/// its centroids (`‖k‖·⟨R q, ŷ⟩`, no inverse rotation per key); [`Stream::axpy_rows`]
/// accumulates `Σ w·‖v‖ŷ` in the rotated basis and rotates the sum back once. QJL rows score
/// with the unbiased estimator ([`TurboQuantProd::score`]). `bytes()` = rows × row bytes.
#[derive(Debug, Clone)]
pub struct TurboQuantStream {
    codec: TqCodec,
    rb: usize,
    data: Vec<u8>,
}

impl TurboQuantStream {
    /// An empty stream of `codec` rows.
    pub fn new(codec: TqCodec) -> Self {
        Self {
            rb: codec.row_bytes(),
            codec,
            data: Vec::new(),
        }
    }

    fn row(&self, slot: usize) -> &[u8] {
        &self.data[slot * self.rb..(slot + 1) * self.rb]
    }
}

impl super::stream::Stream for TurboQuantStream {
    fn push(&mut self, rows: &[f32]) -> usize {
        let d = self.codec.head_dim();
        let start = self.data.len();
        self.data.resize(start + rows.len() / d * self.rb, 0);
        let out = &mut self.data[start..];
        rows.chunks_exact(d)
            .zip(out.chunks_exact_mut(self.rb))
            .map(|(x, o)| match &self.codec {
                TqCodec::Mse(c) => c.encode(x, o),
                TqCodec::Prod(c) => c.encode(x, o),
            })
            .sum()
    }

    fn decode(&self, slot: usize, out: &mut [f32]) {
        match &self.codec {
            TqCodec::Mse(c) => c.decode(self.row(slot), out),
            TqCodec::Prod(c) => c.decode(self.row(slot), out),
        }
    }

    fn dot_rows(&self, t0: usize, t1: usize, qs: &[f32], out: &mut [f32]) {
        let d = self.codec.head_dim();
        let nq = qs.len() / d;
        match &self.codec {
            TqCodec::Mse(c) => {
                let mut rq = qs.to_vec();
                rq.chunks_exact_mut(d).for_each(|q| c.rotate_query(q));
                let mut y = vec![0f32; d];
                for t in t0..t1 {
                    c.decode_rotated(self.row(t), &mut y);
                    for (j, q) in rq.chunks_exact(d).enumerate() {
                        out[(t - t0) * nq + j] = super::attention::dot(&y, q);
                    }
                }
            }
            TqCodec::Prod(c) => {
                let pq: Vec<ProdQuery> = qs.chunks_exact(d).map(|q| c.prepare_query(q)).collect();
                for t in t0..t1 {
                    for (j, q) in pq.iter().enumerate() {
                        out[(t - t0) * nq + j] = c.score(q, self.row(t));
                    }
                }
            }
        }
    }

    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let d = self.codec.head_dim();
        let nq = acc.len() / d;
        let mut y = vec![0f32; d];
        match &self.codec {
            TqCodec::Mse(c) => {
                let mut racc = vec![0f32; nq * d];
                for t in t0..t1 {
                    let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
                    if wt.iter().all(|&x| x == 0.0) {
                        continue;
                    }
                    c.decode_rotated(self.row(t), &mut y);
                    for (a, &wj) in racc.chunks_exact_mut(d).zip(wt) {
                        a.iter_mut().zip(&y).for_each(|(a, v)| *a += wj * v);
                    }
                }
                for (a, r) in acc.chunks_exact_mut(d).zip(racc.chunks_exact_mut(d)) {
                    c.rotation().inverse(r);
                    a.iter_mut().zip(r.iter()).for_each(|(a, v)| *a += v);
                }
            }
            TqCodec::Prod(c) => {
                // Two running sums per query head; the QJL matrix is applied once at the end
                // (O(d) per row instead of O(d²)).
                let (mut racc, mut zacc) = (vec![0f32; nq * d], vec![0f32; nq * d]);
                for t in t0..t1 {
                    let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
                    for ((r, z), &wj) in racc
                        .chunks_exact_mut(d)
                        .zip(zacc.chunks_exact_mut(d))
                        .zip(wt)
                    {
                        if wj != 0.0 {
                            c.accumulate(self.row(t), wj, r, z);
                        }
                    }
                }
                for ((a, r), z) in acc
                    .chunks_exact_mut(d)
                    .zip(racc.chunks_exact_mut(d))
                    .zip(zacc.chunks_exact(d))
                {
                    c.finish_sum(r, z, a);
                }
            }
        }
    }

    fn len(&self) -> usize {
        self.data.len() / self.rb
    }

    fn bytes(&self) -> usize {
        self.data.len()
    }

    fn reserved(&self) -> usize {
        self.data.capacity()
    }

    fn swap_remove(&mut self, slot: usize) {
        super::stream::swap_remove_row(&mut self.data, self.rb, slot);
    }

    fn clear(&mut self) {
        self.data.clear();
    }
}

// ---------------------------------------------------------------------------------------------
// vLLM's presets
// ---------------------------------------------------------------------------------------------

/// How a TurboQuant preset stores keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TqKeys {
    /// FP8 E4M3 without a scale, `d` bytes (vLLM's `key_quant_bits = 8`; kvbench's
    /// `fp8:scale=none`).
    Fp8,
    /// [`TurboQuantMse`] at `bits`, with or without norm correction.
    Mse { bits: u8, norm_correction: bool },
}

/// vLLM's named TurboQuant KV-cache presets (`--kv-cache-dtype`, read from vLLM's
/// `quantization/turboquant/config.py` `TQ_PRESETS`): keys as [`TqKeys`], values
/// [`UniformGroupRow`] with one group per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TurboQuantPreset {
    /// `turboquant_k8v4`: FP8 keys, 4-bit values, no norm correction.
    K8V4,
    /// `turboquant_4bit_nc`: 4-bit MSE keys with norm correction, 4-bit values.
    FourBitNc,
    /// `turboquant_k3v4_nc`: 3-bit MSE keys with norm correction, 4-bit values.
    K3V4Nc,
    /// `turboquant_3bit_nc`: 3-bit MSE keys with norm correction, 3-bit values.
    ThreeBitNc,
}

impl TurboQuantPreset {
    /// Every preset, in vLLM's order.
    pub const ALL: [TurboQuantPreset; 4] = [
        TurboQuantPreset::K8V4,
        TurboQuantPreset::FourBitNc,
        TurboQuantPreset::K3V4Nc,
        TurboQuantPreset::ThreeBitNc,
    ];

    /// The preset's name as vLLM spells it.
    pub fn name(self) -> &'static str {
        match self {
            TurboQuantPreset::K8V4 => "turboquant_k8v4",
            TurboQuantPreset::FourBitNc => "turboquant_4bit_nc",
            TurboQuantPreset::K3V4Nc => "turboquant_k3v4_nc",
            TurboQuantPreset::ThreeBitNc => "turboquant_3bit_nc",
        }
    }

    /// Key storage.
    pub fn keys(self) -> TqKeys {
        match self {
            TurboQuantPreset::K8V4 => TqKeys::Fp8,
            TurboQuantPreset::FourBitNc => TqKeys::Mse {
                bits: 4,
                norm_correction: true,
            },
            TurboQuantPreset::K3V4Nc | TurboQuantPreset::ThreeBitNc => TqKeys::Mse {
                bits: 3,
                norm_correction: true,
            },
        }
    }

    /// The FP8 key format as kvbench's existing [`Quant`] when keys are FP8.
    pub fn fp8_keys_quant(self) -> Option<Quant> {
        (self.keys() == TqKeys::Fp8).then_some(Quant::Fp8 {
            kind: Fp8Kind::E4M3,
            scale: Fp8Scale::None,
        })
    }

    /// Value bits.
    pub fn value_bits(self) -> u8 {
        match self {
            TurboQuantPreset::ThreeBitNc => 3,
            _ => 4,
        }
    }

    /// Bytes of one key row of `head_dim` values: `d` (FP8) or `ceil(d·b/8) + 2`.
    pub fn key_row_bytes(self, head_dim: usize) -> usize {
        match self.keys() {
            TqKeys::Fp8 => head_dim,
            TqKeys::Mse { bits, .. } => TurboQuantMse::row_bytes_for(head_dim, bits),
        }
    }

    /// Bytes of one value row: `ceil(d·b/8) + 4`.
    pub fn value_row_bytes(self, head_dim: usize) -> usize {
        packed_bytes(head_dim, self.value_bits()) + 4
    }

    /// Bytes per token per kv head per layer, K + V (vLLM's `slot_size`, before its rounding
    /// up to an even number).
    pub fn slot_bytes(self, head_dim: usize) -> usize {
        self.key_row_bytes(head_dim) + self.value_row_bytes(head_dim)
    }
}

impl fmt::Display for TurboQuantPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TurboQuantPreset {
    type Err = Error;

    /// Parses vLLM's preset names. Errors: [`Error::UnknownScheme`] listing the four names.
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::UnknownScheme {
                input: s.into(),
                reason: "not a TurboQuant preset".into(),
                valid: Self::ALL.map(|p| p.name()).join(", "),
            })
    }
}

#[cfg(test)]
mod tests;
