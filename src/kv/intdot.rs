//! Attention scores computed on the stored codes: queries quantized to int8 once per call, then
//! integer dot products against int8 and 4-bit keys (AVX2 `maddubs`/`madd`, AVX-VNNI's
//! `vpdpbusd`, or AVX-512 VNNI's on two blocks at once: [`avx::avx512`]), so a key row is
//! never widened to f32. The method of llama.cpp's CPU backend for quantized K (`vec_dot_type`
//! Q8_0 for the query, `ggml_vec_dot_q4_0_q8_0` and friends in ggml-cpu/arch/x86/quants.c),
//! here with one scale per query row.
//!
//! For a query `q` (`head_dim` f32) the codes are `c = round(q / sq)`, `sq = max|q| / 127`
//! (ties to even); per 32-element block the code sum `Σc` is kept. Then, per key format
//! (`k` codes, block scale `dk`, zero-point `mk`):
//! - int8-token (`k = sk · code`, one scale per row): `score = sq · sk · Σ c·code`;
//! - Q8_0 (`k = dk · code` per block of 32): `score = sq · Σ_b dk_b · Σ c·code`;
//! - Q4_0 (`k = dk · (nib − 8)`): `score = sq · Σ_b dk_b · (Σ c·nib − 8 · Σc)`;
//! - int4 (`k = dk · nib + mk`, groups of 32, pairs of elements per byte): `score =
//!   sq · Σ_b (dk_b · Σ c·nib + mk_b · Σc)`, the query's codes reordered to the nibble order.
//! - NVFP4 / MXFP4 (`k = s_b · e2m1(nib)`, E2M1 values 0, ±0.5, …, ±6): each nibble is looked
//!   up in a 16-entry table of twice its value (the integers 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12,
//!   [`super::formats::fp4::E2M1_X2`]; a byte shuffle on AVX2), so `score = sq · ½ · Σ_b s_b ·
//!   Σ c·2e2m1(nib)` with the block scale factored out of the block's integer sum (NVFP4's
//!   per-row f32 scale multiplies the whole sum once).
//!
//! - a 16-level codebook (TurboQuant_mse 4-bit keys, `k = ‖k‖ · centroid[nib]` in the rotated
//!   basis): the centroids rounded to int8 in units of a step `ts` go through the same byte
//!   shuffle, `score = sq · ts · ‖k‖ · Σ c·round(centroid/ts)[nib]`, the query rotated first;
//!   8- and 4-level codebooks (3- and 2-bit indices) the same way after unpacking to bytes.
//! - QJL sign bits (`k = n·γ·(±1)`, TurboQuant_prod's sketch): 0/1 codes per element,
//!   `score = sq · n·γ · (2·Σ c·bit − Σc)`.
//!
//! The only error against the exact f32 path is the query's rounding, at most `sq/2` per
//! element (and for a codebook, its rounding to the table, at most `ts/2` per centroid);
//! [`super::KvCache::set_exact_attention`] keeps the f32 path where that matters.

use half::f16;

use crate::util::simd::simd_dispatch;

/// Elements per integer block.
const B: usize = 32;

/// Queries `[nq, d]` quantized to int8 with one scale per query.
#[derive(Debug, Clone)]
pub struct QueryI8 {
    nq: usize,
    d: usize,
    /// `[nq, d]` codes in element order.
    codes: Vec<i8>,
    /// `[nq, d]` codes per block of 32 reordered to even elements then odd (the order of
    /// [`super::format::Int4GroupRow`]'s low and high nibbles).
    pairs: Vec<i8>,
    /// `[nq]` scales `sq`.
    scale: Vec<f32>,
    /// `[nq, d/32]` code sums per block (small integers, exact in f32; kept as f32 so the
    /// kernel adds them without an int→float conversion per block).
    bsum: Vec<f32>,
}

impl QueryI8 {
    /// Quantizes `qs` (`[nq, d]`, `d` a multiple of 32).
    pub fn quantize(qs: &[f32], d: usize) -> Self {
        let nq = qs.len() / d;
        let nb = d / B;
        let mut codes = vec![0i8; nq * d];
        let mut pairs = vec![0i8; nq * d];
        let mut scale = vec![0f32; nq];
        let mut bsum = vec![0f32; nq * nb];
        for j in 0..nq {
            let q = &qs[j * d..(j + 1) * d];
            let cj = &mut codes[j * d..(j + 1) * d];
            scale[j] = super::simd::quantize_absmax_i8(q, cj);
            // Per block: the code sum (integers, exact in either order) and the pair order.
            for (b, (cb, pb)) in cj
                .chunks_exact(B)
                .zip(pairs[j * d..(j + 1) * d].chunks_exact_mut(B))
                .enumerate()
            {
                bsum[j * nb + b] = cb.iter().map(|&c| c as i32).sum::<i32>() as f32;
                for k in 0..B / 2 {
                    pb[k] = cb[2 * k];
                    pb[B / 2 + k] = cb[2 * k + 1];
                }
            }
        }
        Self {
            nq,
            d,
            codes,
            pairs,
            scale,
            bsum,
        }
    }
}

/// A call's queries (`[nq, d]` f32, `d` a multiple of 32) and their [`QueryI8`], quantized
/// on the first [`get`](Self::get): formats that score on their own transform of the queries
/// (the per-channel key formats fold their scales in, TurboQuant rotates them) never pay for
/// the quantization and its four allocations, which `attn-bench` at 1k tokens (default model,
/// batch 1: 12 calls per layer) found among the step's larger fixed costs.
#[derive(Debug)]
pub struct LazyQueryI8<'a> {
    qs: &'a [f32],
    d: usize,
    q: std::cell::OnceCell<QueryI8>,
}

impl<'a> LazyQueryI8<'a> {
    /// Wraps `qs` (`[nq, d]`); nothing is quantized yet.
    pub fn new(qs: &'a [f32], d: usize) -> Self {
        Self {
            qs,
            d,
            q: std::cell::OnceCell::new(),
        }
    }

    /// The quantized queries ([`QueryI8::quantize`] on the first call, then the same ones).
    pub fn get(&self) -> &QueryI8 {
        self.q.get_or_init(|| QueryI8::quantize(self.qs, self.d))
    }
}

/// Key formats with an integer path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntKeys {
    /// f16 scale then `d` i8 codes.
    Int8Token,
    /// ggml Q8_0 blocks: f16 d, 32 i8.
    Q8_0,
    /// ggml Q4_0 blocks: f16 d, 16 bytes (element j low nibble, j + 16 high nibble).
    Q4_0,
    /// int4 groups of 32: f16 d, f16 m, 16 bytes (element 2j low nibble, 2j + 1 high).
    Int4G32,
    /// int2 groups of 32 (`int2`, KIVI's 2-bit per-token rows): f16 step d, f16 minimum m,
    /// 8 bytes (element 4j + i at bits 2i..2i+2 of byte j); `k = m + d·code`, scored as
    /// `d·Σ c·code + m·Σc` like [`Self::Int4G32`], the codes unpacked to element order.
    Int2G32,
    /// int4 with one group per row (`int4-row`, `int4:group=d`): f16 d, f16 m, then `d/2`
    /// bytes in [`Self::Int4G32`]'s nibble order; every block takes the row's d and m.
    Int4Row,
    /// int3 groups of 32 (`int3`): f16 step d, f16 minimum m, 12 bytes (element e at bits
    /// 3e..3e+3, LSB first, as [`super::quant::bits`] packs them); `k = m + d·code`, scored
    /// as [`Self::Int2G32`], the codes unpacked to element order.
    Int3G32,
    /// int3 with one group per row (`int3:group=row`, TurboQuant's 3-bit values as vLLM
    /// stores them: `value_packed_size = ceil(3d/8) + 4`): f16 d, f16 m, then `3d/8` bytes in
    /// [`Self::Int3G32`]'s bit order; every block of 32 takes the row's d and m.
    Int3Row,
    /// NVFP4 rows: f32 row scale, then blocks of 16: E4M3 scale, 8 bytes (element j low
    /// nibble, j + 8 high) ([`super::formats::nvfp4`]).
    Nvfp4,
    /// MXFP4 blocks of 32: E8M0 scale, 16 bytes (element j low nibble, j + 16 high)
    /// ([`super::formats::mxfp4`]).
    Mxfp4,
    /// Rows of 4-bit indices into a 16-level codebook (TurboQuant_mse keys, Zandieh et al.
    /// 2025, arXiv 2504.19874, §3.1; [`super::formats::turboquant`]): f16 row factor, then `d/2`
    /// bytes (element 2j low nibble, 2j + 1 high, as [`Self::Int4G32`]). Each index is looked up
    /// in this 16-entry int8 table (a byte shuffle on AVX2, as the FP4 formats' E2M1 table), so
    /// `score = sq · factor · Σ c·table[nib]`; a table holding the codebook in units of a step
    /// `ts` gives the score divided by `ts`, which the caller multiplies back in.
    Lut4([i8; 16]),
    /// Rows of 3-bit indices into an 8-level codebook (TurboQuant_mse 3-bit keys, the keys of
    /// vLLM's `turboquant_3bit_nc` and `turboquant_k3v4_nc`): f16 row factor, then `3d/8` bytes
    /// (element e at bits 3e..3e+3, LSB first, as [`Self::Int3G32`]); scored as
    /// [`Self::Lut4`] through the first 8 entries of this table.
    Lut3([i8; 16]),
    /// Rows of 2-bit indices into a 4-level codebook (TurboQuant_mse 2-bit keys, and the MSE
    /// stage of 3-bit TurboQuant_prod keys): f16 row factor, then `d/4` bytes (element e at
    /// bits 2e..2e+2, LSB first, as [`Self::Int2G32`]); scored as [`Self::Lut4`] through the
    /// first 4 entries of this table.
    Lut2([i8; 16]),
    /// Rows of 1-bit indices into a 2-level codebook (TurboQuant_mse 1-bit keys, and the MSE
    /// stage of 2-bit TurboQuant_prod keys): f16 row factor, then `d/8` bytes (element e at
    /// bit e mod 8 of byte e/8, as [`Self::Signs`]); `score = sq · factor · Σ c·table[bit]`
    /// through the first 2 entries of this table, computed as `factor·(table[0]·Σc +
    /// (table[1] − table[0])·Σ bit·c)` (the unsigned-code form of [`Self::Signs`]).
    Lut1([i8; 16]),
    /// 1-bit signs `z ∈ {±1}^d` (TurboQuant_prod's QJL sketch, Zandieh et al. 2025, arXiv
    /// 2504.19874, §3.2; QJL, Zandieh et al. 2024, arXiv 2406.03482): f16 `n` at byte 0 (the
    /// row's norm), f16 `γ` at `off − 2` (the residual's norm), then `d/8` bytes of bits from
    /// `off` (element e at bit e mod 8 of byte e/8, set for +1). Scored as `n·γ·Σ ±c_e`: with a
    /// 0/1 code per element, `n·γ·(2·Σ code·c − Σc)` (the unsigned-code form of
    /// [`Self::Int2G32`], step `2·n·γ`, offset `−n·γ`). The caller multiplies by QJL's
    /// `√(π/2)/d`.
    Signs {
        /// Byte offset of the sign bits in a row (`γ` sits just before).
        off: usize,
    },
}

impl IntKeys {
    /// Bytes a row of `d` elements (a multiple of 32) occupies in this format: the least row
    /// stride [`scores`] accepts.
    pub fn row_bytes(self, d: usize) -> usize {
        let nb = d / B;
        match self {
            IntKeys::Int8Token => 2 + d,
            IntKeys::Q8_0 => 34 * nb,
            IntKeys::Q4_0 => 18 * nb,
            IntKeys::Int4G32 => 20 * nb,
            IntKeys::Int4Row => 4 + 16 * nb,
            IntKeys::Int2G32 => 12 * nb,
            IntKeys::Int3G32 => 16 * nb,
            IntKeys::Int3Row => 4 + 12 * nb,
            IntKeys::Nvfp4 => 4 + 18 * nb,
            IntKeys::Mxfp4 => 17 * nb,
            IntKeys::Lut4(_) => 2 + 16 * nb,
            IntKeys::Lut3(_) => 2 + 12 * nb,
            IntKeys::Lut2(_) => 2 + 8 * nb,
            IntKeys::Lut1(_) => 2 + 4 * nb,
            IntKeys::Signs { off } => off + 4 * nb,
        }
    }
}

/// `out[(t − t0)·nq + j] = q_j · key_t` for rows `t0..t1` of `data` (rows of `rb` bytes in
/// format `f`), computed on the codes. Panics (a caller's bug, not input) when `rb` is shorter
/// than [`IntKeys::row_bytes`] (for [`IntKeys::Int4Row`], other than it), for
/// [`IntKeys::Signs`] with `off < 4`, or when a slice is shorter than the shapes say.
pub fn scores(
    f: IntKeys,
    data: &[u8],
    rb: usize,
    t0: usize,
    t1: usize,
    q: &QueryI8,
    out: &mut [f32],
) {
    let n = t1 - t0;
    assert!(out.len() >= n * q.nq && data.len() >= t1 * rb && q.d.is_multiple_of(B));
    assert!(
        rb >= f.row_bytes(q.d),
        "{f:?} rows of {rb} bytes hold no {} values",
        q.d
    );
    // The sign rows' γ sits before the bits and after the norm.
    assert!(
        !matches!(f, IntKeys::Signs { off } if off < 4),
        "{f:?}: γ would overlap the norm"
    );
    // One group per row: a longer row holds more groups than the kernel reads headers for.
    assert!(
        !matches!(f, IntKeys::Int4Row | IntKeys::Int3Row) || rb == f.row_bytes(q.d),
        "{f:?} rows of {rb} bytes are not one group of {}",
        q.d
    );
    simd_dispatch!(["avx512f", "avx512bw", "avx512vnni", "avx2", "fma"], {
        if q.d.is_multiple_of(64) {
            // SAFETY: as below; the AVX-512 kernel reads the same rows and blocks.
            return unsafe { avx::avx512::scores(f, data, rb, t0, t1, q, out) };
        }
    });
    simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: features enabled at compile time; every row read is inside `data` (asserted).
        unsafe { avx::scores(f, data, rb, t0, t1, q, out) },
        scalar_scores(f, data, rb, t0, t1, q, out)
    )
}

/// The little-endian f16 at byte `at` of `b`, as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `Σ_i (k_i as i8) · c_i` over the shorter of `k` and `c`: the integer dot product of int8
/// codes stored as bytes (an int8-token key row, a Q8_0 block) with int8 query or activation
/// codes. Exact: each product is within ±127·128, far from i32's range for a row.
#[inline(always)]
pub(crate) fn dot_i8(k: &[u8], c: &[i8]) -> i32 {
    k.iter()
        .zip(c)
        .map(|(&k, &c)| k as i8 as i32 * c as i32)
        .sum()
}

/// `Σ_{i<16} (n_i & 15) · c_i + (n_i >> 4) · c_{16+i}`: 16 bytes of nibbles `n` against 32
/// codes `c` whose first half pairs with the low nibbles and second half with the high ones
/// (ggml's Q4_0/Q4_1 block order; int4 keys reach it through the reordered query codes).
#[inline(always)]
pub(crate) fn dot_nibbles(n: &[u8], c: &[i8]) -> i32 {
    (0..16)
        .map(|i| (n[i] & 15) as i32 * c[i] as i32 + (n[i] >> 4) as i32 * c[16 + i] as i32)
        .sum()
}

/// `Σ_{i<h} 2e2m1(n_i & 15) · c_i + 2e2m1(n_i >> 4) · c_{h+i}`, `h = n.len()`: one FP4 block's
/// packed E2M1 codes `n` against the query codes `c` of its `2h` elements, in integers (each
/// term within ±12·127, exact in i32).
#[inline(always)]
pub(crate) fn dot_e2m1(n: &[u8], c: &[i8]) -> i32 {
    use super::formats::fp4::E2M1_X2;
    let h = n.len();
    (0..h)
        .map(|i| {
            E2M1_X2[(n[i] & 15) as usize] as i32 * c[i] as i32
                + E2M1_X2[(n[i] >> 4) as usize] as i32 * c[h + i] as i32
        })
        .sum()
}

/// `Σ code_e · c_e` over the `c.len()` codes of `bits` (2 or 3) bits packed LSB first at `p`
/// (element e at bits `bits·e..`), each read by [`super::quant::bits::code_at`].
fn dot_packed(p: &[u8], bits: u8, c: &[i8]) -> i32 {
    let code = |e| super::quant::bits::code_at(p, bits, e) as i32;
    c.iter().enumerate().map(|(e, &c)| code(e) * c as i32).sum()
}

/// The same integer arithmetic in scalar code: the path without AVX2 and the reference the
/// SIMD kernel is tested against.
pub fn scalar_scores(
    f: IntKeys,
    data: &[u8],
    rb: usize,
    t0: usize,
    t1: usize,
    q: &QueryI8,
    out: &mut [f32],
) {
    let (d, nq, nb) = (q.d, q.nq, q.d / B);
    for t in t0..t1 {
        let row = &data[t * rb..(t + 1) * rb];
        for j in 0..nq {
            let c = &q.codes[j * d..(j + 1) * d];
            let cp = &q.pairs[j * d..(j + 1) * d];
            let mut acc = 0f32;
            match f {
                IntKeys::Int8Token => {
                    acc = f16_at(row, 0) * dot_i8(&row[2..2 + d], c) as f32;
                }
                IntKeys::Q8_0 => {
                    for b in 0..nb {
                        let blk = &row[b * 34..(b + 1) * 34];
                        let dot = dot_i8(&blk[2..], &c[b * B..(b + 1) * B]);
                        acc += f16_at(blk, 0) * dot as f32;
                    }
                }
                IntKeys::Q4_0 => {
                    for b in 0..nb {
                        let blk = &row[b * 18..(b + 1) * 18];
                        let dot = dot_nibbles(&blk[2..], &c[b * B..(b + 1) * B]);
                        acc += f16_at(blk, 0) * (dot as f32 - 8.0 * q.bsum[j * nb + b]);
                    }
                }
                IntKeys::Int4G32 => {
                    for b in 0..nb {
                        let blk = &row[b * 20..(b + 1) * 20];
                        let dot = dot_nibbles(&blk[4..], &cp[b * B..(b + 1) * B]);
                        acc += f16_at(blk, 0) * dot as f32 + f16_at(blk, 2) * q.bsum[j * nb + b];
                    }
                }
                IntKeys::Int2G32 => {
                    for b in 0..nb {
                        let blk = &row[b * 12..(b + 1) * 12];
                        let dot = dot_packed(&blk[4..], 2, &c[b * B..(b + 1) * B]);
                        acc += f16_at(blk, 0) * dot as f32 + f16_at(blk, 2) * q.bsum[j * nb + b];
                    }
                }
                IntKeys::Int3G32 => {
                    for b in 0..nb {
                        let blk = &row[b * 16..(b + 1) * 16];
                        let dot = dot_packed(&blk[4..], 3, &c[b * B..(b + 1) * B]);
                        acc += f16_at(blk, 0) * dot as f32 + f16_at(blk, 2) * q.bsum[j * nb + b];
                    }
                }
                IntKeys::Int3Row => {
                    for b in 0..nb {
                        let dot = dot_packed(&row[4 + 12 * b..], 3, &c[b * B..(b + 1) * B]);
                        acc += f16_at(row, 0) * dot as f32 + f16_at(row, 2) * q.bsum[j * nb + b];
                    }
                }
                IntKeys::Int4Row => {
                    for b in 0..nb {
                        let dot = dot_nibbles(&row[4 + 16 * b..], &cp[b * B..(b + 1) * B]);
                        acc += f16_at(row, 0) * dot as f32 + f16_at(row, 2) * q.bsum[j * nb + b];
                    }
                }
                IntKeys::Nvfp4 => {
                    use super::formats::fp4::e4m3_to_f32;
                    let g = f32::from_le_bytes([row[0], row[1], row[2], row[3]]);
                    for b in 0..d / 16 {
                        let blk = &row[4 + b * 9..4 + (b + 1) * 9];
                        let dot = dot_e2m1(&blk[1..], &c[b * 16..(b + 1) * 16]);
                        acc += e4m3_to_f32(blk[0]) * dot as f32;
                    }
                    acc *= 0.5 * g;
                }
                IntKeys::Mxfp4 => {
                    for b in 0..nb {
                        let blk = &row[b * 17..(b + 1) * 17];
                        let dot = dot_e2m1(&blk[1..], &c[b * B..(b + 1) * B]);
                        acc += super::formats::fp4::e8m0_to_f32(blk[0]) * dot as f32;
                    }
                    acc *= 0.5;
                }
                IntKeys::Lut4(lut) => {
                    let mut dot = 0i32;
                    for b in 0..nb {
                        let n = &row[2 + b * 16..2 + (b + 1) * 16];
                        let c = &cp[b * B..(b + 1) * B];
                        dot += (0..16)
                            .map(|i| {
                                lut[(n[i] & 15) as usize] as i32 * c[i] as i32
                                    + lut[(n[i] >> 4) as usize] as i32 * c[16 + i] as i32
                            })
                            .sum::<i32>();
                    }
                    acc = f16_at(row, 0) * dot as f32;
                }
                IntKeys::Signs { off } => {
                    let bit = |e: usize| (row[off + e / 8] >> (e % 8)) & 1 == 1;
                    let dot: i32 = (0..d)
                        .map(|e| if bit(e) { c[e] as i32 } else { -(c[e] as i32) })
                        .sum();
                    acc = f16_at(row, 0) * f16_at(row, off - 2) * dot as f32;
                }
                IntKeys::Lut3(lut) | IntKeys::Lut2(lut) | IntKeys::Lut1(lut) => {
                    // The table's values for the codes, then the plain dot product.
                    let bits = match f {
                        IntKeys::Lut3(_) => 3,
                        IntKeys::Lut2(_) => 2,
                        _ => 1,
                    };
                    let code = |e| super::quant::bits::code_at(&row[2..], bits, e);
                    let dot: i32 = (0..d).map(|e| lut[code(e)] as i32 * c[e] as i32).sum();
                    acc = f16_at(row, 0) * dot as f32;
                }
            }
            out[(t - t0) * nq + j] = q.scale[j] * acc;
        }
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
pub(crate) mod avx {
    use super::{IntKeys, QueryI8, B};
    use crate::kv::formats::fp4::{e4m3_to_f32, e8m0_to_f32, E2M1_X2};
    use crate::kv::simd::avx::{crumbs, dot_u8_i8, f16_at as f16p, nibbles, nibbles8, triplets};
    use crate::util::simd::query_groups;
    use std::arch::x86_64::*;

    /// The E2M1 table ×2 in both 128-bit lanes (for `_mm256_shuffle_epi8`).
    #[inline(always)]
    unsafe fn e2m1_lut() -> __m256i {
        let t = _mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i);
        _mm256_set_m128i(t, t)
    }

    /// Lane r of the result = Σ lanes of `v[r]`, for eight vectors.
    #[inline(always)]
    pub(crate) unsafe fn hsum8(v: &[__m256; 8]) -> __m256 {
        let a = _mm256_hadd_ps(v[0], v[1]);
        let b = _mm256_hadd_ps(v[2], v[3]);
        let c = _mm256_hadd_ps(v[4], v[5]);
        let d = _mm256_hadd_ps(v[6], v[7]);
        let ab = _mm256_hadd_ps(a, b); // lanes: r0 r1 r2 r3 (low half) | r0 r1 r2 r3 (high half)
        let cd = _mm256_hadd_ps(c, d);
        let lo = _mm256_permute2f128_ps(ab, cd, 0x20);
        let hi = _mm256_permute2f128_ps(ab, cd, 0x31);
        _mm256_add_ps(lo, hi)
    }

    /// One block of 32 key elements unpacked once for every query that scores it: `u` the
    /// unsigned operand of the u8 × i8 dot (`maddubs`/`vpdpbusd`), `k` the signed codes whose signs move onto the query's
    /// codes (formats with signed codes), `s` the block's scale per lane, `side` the
    /// coefficient of the query's block code sum (Q4_0's −8·d, int4's minimum, the sign bits'
    /// −n·γ; else 0).
    struct Blk {
        u: __m256i,
        k: __m256i,
        s: __m256,
        side: f32,
    }

    /// What a format's blocks need from the query: `(signed codes, the pair-ordered query
    /// codes, a zero-point term)`.
    #[inline(always)]
    fn kind(f: IntKeys) -> (bool, bool, bool) {
        match f {
            IntKeys::Int8Token | IntKeys::Q8_0 | IntKeys::Nvfp4 | IntKeys::Mxfp4 => {
                (true, false, false)
            }
            IntKeys::Q4_0
            | IntKeys::Int2G32
            | IntKeys::Int3G32
            | IntKeys::Int3Row
            | IntKeys::Signs { .. }
            | IntKeys::Lut1(_) => (false, false, true),
            IntKeys::Int4G32 | IntKeys::Int4Row => (false, true, true),
            IntKeys::Lut4(_) => (true, true, false),
            IntKeys::Lut3(_) | IntKeys::Lut2(_) => (true, false, false),
        }
    }

    /// The 16-entry byte table a format's nibbles go through (in both 128-bit lanes), or zero.
    #[inline(always)]
    unsafe fn table(f: IntKeys) -> __m256i {
        match f {
            IntKeys::Nvfp4 | IntKeys::Mxfp4 => e2m1_lut(),
            IntKeys::Lut4(lut) | IntKeys::Lut3(lut) | IntKeys::Lut2(lut) => {
                let t = _mm_loadu_si128(lut.as_ptr() as *const __m128i);
                _mm256_set_m128i(t, t)
            }
            _ => _mm256_setzero_si256(),
        }
    }

    /// The factor a row's block sums are multiplied by (its f16 scale for int8-token and the
    /// codebook, NVFP4's ½·f32 tensor scale, MXFP4's ½; 1 where the scales are per block).
    #[inline(always)]
    unsafe fn row_factor(f: IntKeys, row: *const u8) -> f32 {
        match f {
            IntKeys::Int8Token | IntKeys::Lut4(_) | IntKeys::Lut3(_) | IntKeys::Lut2(_) => {
                f16p(row)
            }
            IntKeys::Nvfp4 => 0.5 * (row as *const f32).read_unaligned(),
            IntKeys::Mxfp4 => 0.5,
            IntKeys::Q8_0
            | IntKeys::Q4_0
            | IntKeys::Int4G32
            | IntKeys::Int4Row
            | IntKeys::Int2G32
            | IntKeys::Int3G32
            | IntKeys::Int3Row
            | IntKeys::Signs { .. }
            | IntKeys::Lut1(_) => 1.0,
        }
    }

    /// Block `b` of the key row at `row`.
    #[inline(always)]
    unsafe fn unpack(f: IntKeys, row: *const u8, b: usize, tab: __m256i) -> Blk {
        let signed = |k: __m256i, s: __m256| Blk {
            u: _mm256_sign_epi8(k, k),
            k,
            s,
            side: 0.0,
        };
        // Unsigned codes with a group header at `head`: f16 step, then f16 minimum (the
        // zero-point term `m·Σc`).
        let asym = |u: __m256i, head: *const u8| Blk {
            u,
            k: _mm256_setzero_si256(),
            s: _mm256_set1_ps(f16p(head)),
            side: f16p(head.add(2)),
        };
        match f {
            IntKeys::Int8Token => signed(
                _mm256_loadu_si256(row.add(2 + b * B) as *const __m256i),
                _mm256_set1_ps(1.0),
            ),
            IntKeys::Q8_0 => {
                let blk = row.add(b * 34);
                signed(
                    _mm256_loadu_si256(blk.add(2) as *const __m256i),
                    _mm256_set1_ps(f16p(blk)),
                )
            }
            IntKeys::Q4_0 => {
                let blk = row.add(b * 18);
                let dk = f16p(blk);
                Blk {
                    u: nibbles(blk.add(2)),
                    k: _mm256_setzero_si256(),
                    s: _mm256_set1_ps(dk),
                    side: -8.0 * dk,
                }
            }
            IntKeys::Int4G32 => {
                let blk = row.add(b * 20);
                asym(nibbles(blk.add(4)), blk)
            }
            IntKeys::Int2G32 => {
                let blk = row.add(b * 12);
                asym(crumbs(blk.add(4)), blk)
            }
            IntKeys::Int4Row => asym(nibbles(row.add(4 + 16 * b)), row),
            IntKeys::Int3G32 => {
                let blk = row.add(b * 16);
                asym(triplets(blk.add(4)), blk)
            }
            IntKeys::Int3Row => asym(triplets(row.add(4 + 12 * b)), row),
            IntKeys::Nvfp4 => {
                // Two blocks of 16 per 32 query codes: lanes 0–3 hold block 2b's sum, 4–7 block
                // 2b + 1's, each multiplied by its own E4M3 scale.
                let b0 = row.add(4 + 18 * b);
                let b1 = b0.add(9);
                let nib = _mm256_set_m128i(nibbles8(b1.add(1)), nibbles8(b0.add(1)));
                signed(
                    _mm256_shuffle_epi8(tab, nib),
                    _mm256_set_m128(_mm_set1_ps(e4m3_to_f32(*b1)), _mm_set1_ps(e4m3_to_f32(*b0))),
                )
            }
            IntKeys::Mxfp4 => {
                let blk = row.add(b * 17);
                signed(
                    _mm256_shuffle_epi8(tab, nibbles(blk.add(1))),
                    _mm256_set1_ps(e8m0_to_f32(*blk)),
                )
            }
            IntKeys::Lut4(_) => signed(
                _mm256_shuffle_epi8(tab, nibbles(row.add(2 + 16 * b))),
                _mm256_set1_ps(1.0),
            ),
            IntKeys::Lut3(_) => signed(
                _mm256_shuffle_epi8(tab, triplets(row.add(2 + 12 * b))),
                _mm256_set1_ps(1.0),
            ),
            IntKeys::Lut2(_) => signed(
                _mm256_shuffle_epi8(tab, crumbs(row.add(2 + 8 * b))),
                _mm256_set1_ps(1.0),
            ),
            IntKeys::Signs { off } => {
                // Per block, so the offset term takes the row's factor too (`store` adds the
                // side terms unscaled).
                let g = f16p(row) * f16p(row.add(off - 2));
                Blk {
                    u: bits01(row.add(off + 4 * b)),
                    k: _mm256_setzero_si256(),
                    s: _mm256_set1_ps(2.0 * g),
                    side: -g,
                }
            }
            IntKeys::Lut1(lut) => {
                // As the sign bits: `factor·(t0 + (t1 − t0)·bit)` per element, the row's
                // factor taken per block.
                let g = f16p(row);
                Blk {
                    u: bits01(row.add(2 + 4 * b)),
                    k: _mm256_setzero_si256(),
                    s: _mm256_set1_ps((lut[1] as f32 - lut[0] as f32) * g),
                    side: lut[0] as f32 * g,
                }
            }
        }
    }

    /// 4 bytes of bits at `p` → 32 bytes, lane e = bit e mod 8 of byte e/8 (0 or 1): each byte
    /// broadcast to 8 lanes by one shuffle, its bits selected by a mask and compared.
    #[inline(always)]
    unsafe fn bits01(p: *const u8) -> __m256i {
        let x = _mm256_set1_epi32((p as *const i32).read_unaligned());
        // Both 128-bit lanes hold the 4 bytes: the low lane spreads bytes 0–1, the high 2–3.
        let idx = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let y = _mm256_and_si256(_mm256_shuffle_epi8(x, idx), sel);
        _mm256_and_si256(_mm256_cmpeq_epi8(y, sel), _mm256_set1_epi8(1))
    }

    /// Scores of `n ≤ 8` rows from `t` against queries `j0..j0 + Q`: each block of a row is
    /// unpacked once and dotted with every query's codes while in registers (the rows' sums
    /// reduced eight at a time), so a GQA group's query heads share one pass over the keys.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the call's coordinates; a struct would only rename them
    unsafe fn rows8<const Q: usize>(
        f: IntKeys,
        data: &[u8],
        rb: usize,
        t: usize,
        n: usize,
        q: &QueryI8,
        j0: usize,
        o: *mut f32,
    ) {
        let (d, nb) = (q.d, q.d / B);
        let (signed, pairs, side_on) = kind(f);
        let tab = table(f);
        let cb = if pairs {
            q.pairs.as_ptr()
        } else {
            q.codes.as_ptr()
        }
        .add(j0 * d);
        let bs = q.bsum.as_ptr().add(j0 * nb);
        let mut acc = [[_mm256_setzero_ps(); 8]; Q];
        let mut side = [[0f32; 8]; Q];
        let mut g = [0f32; 8];
        for r in 0..n {
            if j0 == 0 {
                crate::kv::simd::prefetch_ahead(data, (t + r) * rb, rb);
            }
            let row = data.as_ptr().add((t + r) * rb);
            g[r] = row_factor(f, row);
            let mut a = [_mm256_setzero_ps(); Q];
            let mut sd = [0f32; Q];
            for b in 0..nb {
                let k = unpack(f, row, b, tab);
                for j in 0..Q {
                    let mut cv = _mm256_loadu_si256(cb.add(j * d + b * B) as *const __m256i);
                    if signed {
                        cv = _mm256_sign_epi8(cv, k.k);
                    }
                    let p = dot_u8_i8(k.u, cv);
                    a[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), k.s, a[j]);
                    if side_on {
                        sd[j] += k.side * *bs.add(j * nb + b);
                    }
                }
            }
            for j in 0..Q {
                acc[j][r] = a[j];
                side[j][r] = sd[j];
            }
        }
        store::<Q>(&acc, &side, &g, q, j0, n, o);
    }

    /// The scores of `n ≤ 8` rows for queries `j0..j0 + Q` from each row's per-lane sums
    /// `acc[j][r]`, zero-point terms `side[j][r]` and row factors `g[r]`: `sq · (Σlanes · g +
    /// side)`, written to `o[r·nq + j0 + j]`.
    #[inline(always)]
    unsafe fn store<const Q: usize>(
        acc: &[[__m256; 8]; Q],
        side: &[[f32; 8]; Q],
        g: &[f32; 8],
        q: &QueryI8,
        j0: usize,
        n: usize,
        o: *mut f32,
    ) {
        let gv = _mm256_loadu_ps(g.as_ptr());
        for j in 0..Q {
            let sums = _mm256_fmadd_ps(hsum8(&acc[j]), gv, _mm256_loadu_ps(side[j].as_ptr()));
            let mut v = [0f32; 8];
            _mm256_storeu_ps(
                v.as_mut_ptr(),
                _mm256_mul_ps(sums, _mm256_set1_ps(q.scale[j0 + j])),
            );
            for (r, &x) in v.iter().enumerate().take(n) {
                *o.add(r * q.nq + j0 + j) = x;
            }
        }
    }

    /// `$body` compiled once per key format, with `$g` the format as a constant: the kernels
    /// are `#[inline(always)]`, so every `match` on the format inside them folds away (a
    /// runtime format in the row loop cost branches and spills per row).
    macro_rules! per_format {
        ($f:expr, $g:ident => $body:expr) => {
            match $f {
                IntKeys::Int8Token => {
                    let $g = IntKeys::Int8Token;
                    $body
                }
                IntKeys::Q8_0 => {
                    let $g = IntKeys::Q8_0;
                    $body
                }
                IntKeys::Q4_0 => {
                    let $g = IntKeys::Q4_0;
                    $body
                }
                IntKeys::Int4G32 => {
                    let $g = IntKeys::Int4G32;
                    $body
                }
                IntKeys::Int4Row => {
                    let $g = IntKeys::Int4Row;
                    $body
                }
                IntKeys::Int2G32 => {
                    let $g = IntKeys::Int2G32;
                    $body
                }
                IntKeys::Int3G32 => {
                    let $g = IntKeys::Int3G32;
                    $body
                }
                IntKeys::Int3Row => {
                    let $g = IntKeys::Int3Row;
                    $body
                }
                IntKeys::Nvfp4 => {
                    let $g = IntKeys::Nvfp4;
                    $body
                }
                IntKeys::Mxfp4 => {
                    let $g = IntKeys::Mxfp4;
                    $body
                }
                IntKeys::Lut4(t) => {
                    let $g = IntKeys::Lut4(t);
                    $body
                }
                IntKeys::Lut3(t) => {
                    let $g = IntKeys::Lut3(t);
                    $body
                }
                IntKeys::Lut2(t) => {
                    let $g = IntKeys::Lut2(t);
                    $body
                }
                IntKeys::Signs { off } => {
                    let $g = IntKeys::Signs { off };
                    $body
                }
                IntKeys::Lut1(t) => {
                    let $g = IntKeys::Lut1(t);
                    $body
                }
            }
        };
    }

    pub unsafe fn scores(
        f: IntKeys,
        data: &[u8],
        rb: usize,
        t0: usize,
        t1: usize,
        q: &QueryI8,
        out: &mut [f32],
    ) {
        per_format!(f, g => drive::<false>(g, data, rb, t0, t1, q, out, &[]))
    }

    /// The row loop of both widths: `WIDE` takes [`avx512::rows8`] (where compiled, with its
    /// lane corrections `corr`), else [`rows8`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn drive<const WIDE: bool>(
        f: IntKeys,
        data: &[u8],
        rb: usize,
        t0: usize,
        t1: usize,
        q: &QueryI8,
        out: &mut [f32],
        corr: &[__m512i],
    ) {
        let nq = q.nq;
        let o = out.as_mut_ptr();
        let mut t = t0;
        while t < t1 {
            let n = (t1 - t).min(8);
            let ot = o.add((t - t0) * nq);
            // Queries four at a time (a GQA group of 3 in one pass, 7 in two).
            query_groups!(
                nq,
                Q,
                j,
                rows_of::<Q, WIDE>(f, data, rb, t, n, q, j, ot, corr)
            );
            t += n;
        }
    }

    /// [`avx512::rows8`] when `WIDE` (and compiled), else [`rows8`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_of<const Q: usize, const WIDE: bool>(
        f: IntKeys,
        data: &[u8],
        rb: usize,
        t: usize,
        n: usize,
        q: &QueryI8,
        j0: usize,
        o: *mut f32,
        corr: &[__m512i],
    ) {
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        if WIDE {
            return avx512::rows8::<Q>(f, data, rb, t, n, q, j0, o, corr);
        }
        let _ = corr;
        rows8::<Q>(f, data, rb, t, n, q, j0, o)
    }

    /// The same kernel with 512-bit registers (AVX-512 BW + VNNI): two blocks of 32 per
    /// `vpdpbusd`. Signed key codes enter as the unsigned operand offset by 128 (`k ⊕ 0x80 =
    /// k + 128`, one XOR per pair of blocks instead of a sign transfer per query, which AVX-512
    /// has no single instruction for), and each lane's `128 · Σc` over its four query codes is
    /// subtracted by starting the lane's sum at it — the s8s8 compensation oneDNN uses (Q4_0's
    /// `8 · Σc` the same way, for its `nib − 8`). The integer sums per block are the AVX2
    /// kernel's, exactly; the block sums are added in another order, and for int8-token and the
    /// codebook (one scale per row) as integers, converted once per row (AVX2 converts each
    /// block's sum and adds in f32), so scores may differ from AVX2's in the last bits.
    #[cfg(all(
        target_feature = "avx512f",
        target_feature = "avx512bw",
        target_feature = "avx512vnni"
    ))]
    pub(crate) mod avx512 {
        use super::*;
        use crate::kv::simd::avx512::{fold, join, join_ps, offset_correction};

        /// [`super::rows8`] on pairs of blocks; `corr` (`[nq, d/64]`) holds each lane's
        /// `−128 · Σc` for the signed formats and `−8 · Σc` for Q4_0 (unused for int4).
        #[inline(always)]
        #[allow(clippy::too_many_arguments)] // the call's coordinates, as in `super::rows8`
        pub(super) unsafe fn rows8<const Q: usize>(
            f: IntKeys,
            data: &[u8],
            rb: usize,
            t: usize,
            n: usize,
            q: &QueryI8,
            j0: usize,
            o: *mut f32,
            corr: &[__m512i],
        ) {
            let (d, nb) = (q.d, q.d / B);
            let nc = nb / 2;
            let (signed, pairs, side_on) = kind(f);
            // Q4_0's `−8 · Σc` per block enters each lane's start too (`corr` holds −8 · the
            // lane's four codes): no side term per block and query.
            let q4 = f == IntKeys::Q4_0;
            let side_on = side_on && !q4;
            // One scale per row (int8-token, the codebook): the lanes' integer sums add up
            // exactly, converted once per row.
            let unit = matches!(
                f,
                IntKeys::Int8Token | IntKeys::Lut4(_) | IntKeys::Lut3(_) | IntKeys::Lut2(_)
            );
            let tab = table(f);
            let cb = if pairs {
                q.pairs.as_ptr()
            } else {
                q.codes.as_ptr()
            }
            .add(j0 * d);
            let bs = q.bsum.as_ptr().add(j0 * nb);
            let flip = _mm512_set1_epi8(-128);
            let mut acc = [[_mm256_setzero_ps(); 8]; Q];
            let mut side = [[0f32; 8]; Q];
            let mut g = [0f32; 8];
            for r in 0..n {
                if j0 == 0 {
                    crate::kv::simd::prefetch_ahead(data, (t + r) * rb, rb);
                }
                let row = data.as_ptr().add((t + r) * rb);
                g[r] = row_factor(f, row);
                let mut a = [_mm512_setzero_ps(); Q];
                let mut ai = [_mm512_setzero_si512(); Q];
                let mut sd = [0f32; Q];
                for c in 0..nc {
                    let (k0, k1) = (unpack(f, row, 2 * c, tab), unpack(f, row, 2 * c + 1, tab));
                    let u = if signed {
                        _mm512_xor_si512(join(k0.k, k1.k), flip)
                    } else {
                        join(k0.u, k1.u)
                    };
                    let s = join_ps(k0.s, k1.s);
                    for j in 0..Q {
                        let cv = _mm512_loadu_si512(cb.add(j * d + 64 * c) as *const __m512i);
                        let init = if signed || q4 {
                            corr[(j0 + j) * nc + c]
                        } else {
                            _mm512_setzero_si512()
                        };
                        if unit {
                            ai[j] = _mm512_add_epi32(ai[j], _mm512_dpbusd_epi32(init, u, cv));
                        } else {
                            let p = _mm512_dpbusd_epi32(init, u, cv);
                            a[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, a[j]);
                        }
                        if side_on {
                            sd[j] += k0.side * *bs.add(j * nb + 2 * c);
                            sd[j] += k1.side * *bs.add(j * nb + 2 * c + 1);
                        }
                    }
                }
                for j in 0..Q {
                    acc[j][r] = fold(if unit {
                        _mm512_cvtepi32_ps(ai[j])
                    } else {
                        a[j]
                    });
                    side[j][r] = sd[j];
                }
            }
            store::<Q>(&acc, &side, &g, q, j0, n, o);
        }

        /// [`super::scores`] for `d` a multiple of 64 (pairs of blocks).
        pub unsafe fn scores(
            f: IntKeys,
            data: &[u8],
            rb: usize,
            t0: usize,
            t1: usize,
            q: &QueryI8,
            out: &mut [f32],
        ) {
            per_format!(f, g => {
                let corr = corrections(g, q);
                super::drive::<true>(g, data, rb, t0, t1, q, out, &corr)
            })
        }

        /// Each lane's `−z · Σc` over its four query codes, per query and pair of blocks (`[nq,
        /// d/64]`): the offset z of the unsigned operand (128 for signed codes, Q4_0's 8);
        /// empty for int4, which has none.
        #[inline(always)]
        unsafe fn corrections(f: IntKeys, q: &QueryI8) -> Vec<__m512i> {
            let (signed, pairs, _) = kind(f);
            let codes = if pairs { &q.pairs } else { &q.codes };
            let z = _mm512_set1_epi8(if f == IntKeys::Q4_0 { 8 } else { -128 });
            let used = signed || f == IntKeys::Q4_0;
            codes[..if used { codes.len() } else { 0 }]
                .chunks_exact(64)
                .map(|c| offset_correction(z, _mm512_loadu_si512(c.as_ptr() as *const __m512i)))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::format::{
        Int4GroupRow, Int8TokenRow, Mxfp4Row, Nvfp4Row, Q4_0Row, Q8_0Row, RowCodec,
    };

    fn rows<C: RowCodec>(c: C, n: usize, d: usize) -> (Vec<u8>, Vec<f32>) {
        let rb = c.row_bytes(d);
        let mut data = vec![0u8; n * rb];
        let mut dec = vec![0f32; n * d];
        for t in 0..n {
            let x: Vec<f32> = (0..d)
                .map(|i| ((t * d + i) as f32 * 0.61).sin() * (1.0 + (i % 5) as f32) + 0.3)
                .collect();
            c.encode(&x, &mut data[t * rb..(t + 1) * rb]);
            c.decode(&data[t * rb..(t + 1) * rb], &mut dec[t * d..(t + 1) * d]);
        }
        (data, dec)
    }

    /// `n` rows of `d` codebook indices of `bits` bits by hand: an f16 factor `fac(t)`, then
    /// element e's `code(t, e)` at bits `bits·e..bits·e + bits`, packed here bit by bit; decoded
    /// value `factor · lut[code]`. Returns (rows, decoded `[n, d]`, row bytes).
    fn lut_rows(
        bits: usize,
        lut: &[i8; 16],
        n: usize,
        d: usize,
        fac: impl Fn(usize) -> f32,
        code: impl Fn(usize, usize) -> usize,
    ) -> (Vec<u8>, Vec<f32>, usize) {
        let rb = 2 + bits * d / 8;
        let (mut data, mut dec) = (vec![0u8; n * rb], vec![0f32; n * d]);
        for t in 0..n {
            let f = f16::from_f32(fac(t));
            data[t * rb..t * rb + 2].copy_from_slice(&f.to_le_bytes());
            for e in 0..d {
                let c = code(t, e);
                for k in 0..bits {
                    let bit = bits * e + k;
                    data[t * rb + 2 + bit / 8] |= (((c >> k) & 1) as u8) << (bit % 8);
                }
                dec[t * d + e] = f.to_f32() * lut[c] as f32;
            }
        }
        (data, dec, rb)
    }

    /// Against f64 dot products of the decoded keys with the exact queries: the only error is
    /// the query rounding, `|err| ≤ Σ_i |k_i| · sq/2` (plus f32 accumulation slack).
    /// Every compiled kernel runs: `scores` dispatches to the widest one (AVX-512 where the
    /// build has it and `d` is a multiple of 64), and the AVX2 kernel is called directly too.
    #[test]
    fn integer_scores_match_decoded_keys_within_query_rounding() {
        for d in [32usize, 64, 96, 128, 192, 256] {
            for nq in [1usize, 2, 3, 5, 7] {
                let n = 19; // two groups of 8 and a tail
                let qs: Vec<f32> = (0..nq * d).map(|i| (i as f32 * 0.23).cos() * 2.0).collect();
                let q = QueryI8::quantize(&qs, d);
                let cases: Vec<(IntKeys, Vec<u8>, Vec<f32>, usize)> = vec![
                    {
                        let (a, b) = rows(Int8TokenRow, n, d);
                        (IntKeys::Int8Token, a, b, Int8TokenRow.row_bytes(d))
                    },
                    {
                        let (a, b) = rows(Q8_0Row, n, d);
                        (IntKeys::Q8_0, a, b, Q8_0Row.row_bytes(d))
                    },
                    {
                        let (a, b) = rows(Q4_0Row, n, d);
                        (IntKeys::Q4_0, a, b, Q4_0Row.row_bytes(d))
                    },
                    {
                        let c = Int4GroupRow { group: 32 };
                        let (a, b) = rows(c, n, d);
                        (IntKeys::Int4G32, a, b, c.row_bytes(d))
                    },
                    {
                        // int2 groups of 32, decoded by the uniform codec's table.
                        let c = crate::kv::formats::uniform::UniformGroupRow::new(2, 32).unwrap();
                        let (a, b) = rows(c, n, d);
                        (IntKeys::Int2G32, a, b, c.row_bytes(d))
                    },
                    {
                        // int3 groups of 32 and int3 with one group per row (d multiple of
                        // 32), decoded by the uniform codec.
                        let c = crate::kv::formats::uniform::UniformGroupRow::new(3, 32).unwrap();
                        let (a, b) = rows(c, n, d);
                        (IntKeys::Int3G32, a, b, c.row_bytes(d))
                    },
                    {
                        let c = crate::kv::formats::uniform::UniformGroupRow::new(3, d).unwrap();
                        let (a, b) = rows(c, n, d);
                        (IntKeys::Int3Row, a, b, c.row_bytes(d))
                    },
                    {
                        // int4-row: one group per row, decoded by the uniform codec.
                        let c = crate::kv::formats::uniform::UniformGroupRow::new(4, d).unwrap();
                        let (a, b) = rows(c, n, d);
                        (IntKeys::Int4Row, a, b, c.row_bytes(d))
                    },
                    {
                        let (a, b) = rows(Nvfp4Row, n, d);
                        (IntKeys::Nvfp4, a, b, Nvfp4Row.row_bytes(d))
                    },
                    {
                        let (a, b) = rows(Mxfp4Row, n, d);
                        (IntKeys::Mxfp4, a, b, Mxfp4Row.row_bytes(d))
                    },
                    {
                        // A 16-level codebook by hand (TurboQuant_mse's key layout): an f16
                        // factor, then element 2j in byte j's low nibble, 2j + 1 in its high
                        // one; value = factor · table[nibble].
                        let lut: [i8; 16] = [
                            -100, -77, -51, -30, -17, -9, -4, -1, 1, 4, 9, 17, 30, 51, 77, 100,
                        ];
                        let rb = 2 + d / 2;
                        let (mut data, mut dec) = (vec![0u8; n * rb], vec![0f32; n * d]);
                        for t in 0..n {
                            let fac = f16::from_f32(0.01 + 0.003 * t as f32);
                            data[t * rb..t * rb + 2].copy_from_slice(&fac.to_le_bytes());
                            for j in 0..d / 2 {
                                let b = ((t * 31 + j * 7) % 256) as u8;
                                data[t * rb + 2 + j] = b;
                                dec[t * d + 2 * j] = fac.to_f32() * lut[(b & 15) as usize] as f32;
                                dec[t * d + 2 * j + 1] =
                                    fac.to_f32() * lut[(b >> 4) as usize] as f32;
                            }
                        }
                        (IntKeys::Lut4(lut), data, dec, rb)
                    },
                    {
                        // An 8-level codebook by hand (TurboQuant_mse 3-bit keys): an f16
                        // factor, then element e at bits 3e..3e+3 (packed here bit by bit);
                        // value = factor · table[code]. The table's upper half is never read.
                        let lut: [i8; 16] = [
                            -127, -70, -33, -9, 9, 33, 70, 127, 99, 99, 99, 99, 99, 99, 99, 99,
                        ];
                        let fac = |t: usize| 0.02 + 0.001 * t as f32;
                        let code = |t: usize, e: usize| (t * 5 + e * 3 + e / 7) % 8;
                        let (data, dec, rb) = lut_rows(3, &lut, n, d, fac, code);
                        (IntKeys::Lut3(lut), data, dec, rb)
                    },
                    {
                        // A 4-level codebook by hand (TurboQuant_mse 2-bit keys): an f16
                        // factor, then element e at bits 2e..2e+2 (packed here bit by bit);
                        // value = factor · table[code]. Entries past the fourth are never read.
                        let lut: [i8; 16] = [
                            -127, -38, 38, 127, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99,
                        ];
                        let fac = |t: usize| 0.03 + 0.002 * t as f32;
                        let code = |t: usize, e: usize| (t * 7 + e * 5 + e / 3) % 4;
                        let (data, dec, rb) = lut_rows(2, &lut, n, d, fac, code);
                        (IntKeys::Lut2(lut), data, dec, rb)
                    },
                    {
                        // A 2-level codebook by hand (TurboQuant_mse 1-bit keys), asymmetric
                        // so the `table[0]·Σc` side term counts: an f16 factor, then element
                        // e at bit e mod 8 of byte e/8; value = factor · table[bit].
                        let mut lut = [99i8; 16];
                        lut[..2].copy_from_slice(&[-90, 127]);
                        let fac = |t: usize| 0.04 + 0.002 * t as f32;
                        let code = |t: usize, e: usize| (t * 3 + e * 5 + e / 7) % 3 % 2;
                        let (data, dec, rb) = lut_rows(1, &lut, n, d, fac, code);
                        (IntKeys::Lut1(lut), data, dec, rb)
                    },
                    {
                        // QJL sign bits by hand (TurboQuant_prod's key layout past its MSE
                        // stage): an f16 norm at 0, two bytes never read, an f16 γ at 4, the
                        // bits from 6 (element e at bit e mod 8 of byte e/8, set for +1);
                        // value = norm · γ · (±1).
                        let off = 6;
                        let rb = off + d / 8;
                        let (mut data, mut dec) = (vec![0u8; n * rb], vec![0f32; n * d]);
                        for t in 0..n {
                            let norm = f16::from_f32(1.5 + 0.1 * t as f32);
                            let gamma = f16::from_f32(0.02 + 0.003 * t as f32);
                            let r = &mut data[t * rb..(t + 1) * rb];
                            r[..2].copy_from_slice(&norm.to_le_bytes());
                            r[2..4].copy_from_slice(&[0xAB, 0xCD]);
                            r[4..6].copy_from_slice(&gamma.to_le_bytes());
                            for e in 0..d {
                                let plus = (t * 3 + e * 5 + e / 9) % 3 != 0;
                                r[off + e / 8] |= (plus as u8) << (e % 8);
                                let v = norm.to_f32() * gamma.to_f32();
                                dec[t * d + e] = if plus { v } else { -v };
                            }
                        }
                        (IntKeys::Signs { off }, data, dec, rb)
                    },
                ];
                for (f, data, dec, rb) in cases {
                    let mut dispatched = vec![0f32; n * nq];
                    scores(f, &data, rb, 0, n, &q, &mut dispatched);
                    #[allow(unused_mut)]
                    let mut kernels = vec![dispatched];
                    #[cfg(all(
                        target_arch = "x86_64",
                        target_feature = "avx2",
                        target_feature = "fma"
                    ))]
                    {
                        let mut v = vec![0f32; n * nq];
                        // SAFETY: features compiled in; the slices hold n rows of rb bytes.
                        unsafe { avx::scores(f, &data, rb, 0, n, &q, &mut v) };
                        kernels.push(v);
                    }
                    let mut reference = vec![0f32; n * nq];
                    scalar_scores(f, &data, rb, 0, n, &q, &mut reference);
                    for got in &kernels {
                        for t in 0..n {
                            for j in 0..nq {
                                let k = &dec[t * d..(t + 1) * d];
                                let qj = &qs[j * d..(j + 1) * d];
                                let exact: f64 =
                                    k.iter().zip(qj).map(|(&a, &b)| a as f64 * b as f64).sum();
                                let sq = qj.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                                let bound = k.iter().map(|&a| a.abs() as f64).sum::<f64>() * sq
                                    / 2.0
                                    + 1e-4 * (1.0 + exact.abs());
                                let g = got[t * nq + j] as f64;
                                assert!(
                                    (g - exact).abs() <= bound,
                                    "{f:?} d={d} nq={nq} t={t} j={j}: {g} vs {exact}"
                                );
                                let r = reference[t * nq + j];
                                assert!(
                                    (got[t * nq + j] - r).abs() <= 1e-4 * (1.0 + r.abs()),
                                    "{f:?} simd vs scalar"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Query quantization by hand: max 127 gives scale 1, codes are the values rounded with
    /// ties to even, block sums add them, and the pair order puts even elements first.
    #[test]
    fn query_codes_by_hand() {
        let mut q = vec![0f32; 32];
        q[0] = 127.0;
        q[1] = 2.5;
        q[2] = -1.5;
        q[3] = 0.4;
        let z = QueryI8::quantize(&q, 32);
        assert_eq!(z.scale[0], 1.0);
        assert_eq!(&z.codes[..4], &[127, 2, -2, 0]);
        assert_eq!(z.bsum[0], 127.0);
        assert_eq!(z.pairs[0], 127); // element 0
        assert_eq!(z.pairs[1], -2); // element 2
        assert_eq!(z.pairs[16], 2); // element 1
        assert_eq!(z.pairs[17], 0); // element 3
    }
}
