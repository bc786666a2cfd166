//! Attention's P·V on stored codes: `acc_j += Σ_t p_tj · v_t` computed block by block of 32
//! channels with the block's scale factored out — per (row, block, query) the factor `p_tj · s_b`
//! is formed once and multiplies the block's codes (`Σ_t p·s·c = Σ_t (p·s) · c`), so a value row
//! is never widened to an f32 buffer first. FP4 (NVFP4, MXFP4) codes go through a 16-entry E2M1
//! table; int8-token, Q8_0, Q4_0 and int4 codes are sign- or zero-extended; int2 codes come
//! from a 256-entry table (on the timed 512-bit tile: unpacked to bytes and widened). The
//! SIMD kernel keeps each block's accumulators (four queries × 32 channels) in registers over a tile of 32 rows, so a row costs its FMAs, not a load and a
//! store of every accumulator (llama.cpp's CPU flash attention instead widens each quantized V
//! row to f32 and accumulates it with `ggml_vec_mad_f32`). The keys' counterpart (Q·K on the codes) is
//! [`super::intdot`].
//!
//! TurboQuant_mse 4-, 3- and 2-bit values ([`axpy_centroids4`], [`axpy_centroids_packed`])
//! are gathered the same way from their 16, 8 or 4 f32 centroids, in the rotated basis (the caller
//! rotates the sum back once); TurboQuant_prod's QJL half adds `±c` per sign bit
//! ([`axpy_signs`]), and 1-bit values are that plus the codebook's midpoint; [`axpy_codebook`]
//! picks the kernel for a codebook of any width.
//!
//! The result is the dequantize-then-accumulate result up to f32 rounding (the same products,
//! associated differently): no query or weight is quantized.

use half::f16;

use super::formats::fp4::{e4m3_to_f32, e8m0_to_f32, E2M1};
use crate::util::simd::simd_dispatch;

/// Value formats whose P·V runs on the codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeValues {
    /// NVFP4 rows: f32 row scale, then blocks of 16: E4M3 scale, 8 bytes (element `j` low
    /// nibble, `j + 8` high) ([`super::formats::nvfp4`]).
    Nvfp4,
    /// MXFP4 blocks of 32: E8M0 scale, 16 bytes (element `j` low nibble, `j + 16` high)
    /// ([`super::formats::mxfp4`]).
    Mxfp4,
    /// 2-bit uniform groups of 32 (`int2`, KIVI's per-token values, Liu et al. 2024, arXiv
    /// 2402.02750, §3.2): f16 step `s`, f16 minimum `m`, 8 bytes (element `4j + i` at bits
    /// `2i..2i+2` of byte `j`); `v = m + code·s`, accumulated as `(w·s)·code + w·m`.
    Int2G32,
    /// int8-token rows: f16 scale `s`, then `d` i8 codes; `v = s·code`.
    Int8Token,
    /// ggml Q8_0 blocks of 32: f16 `d`, 32 i8 codes; `v = d·code`.
    Q8_0,
    /// ggml Q4_0 blocks of 32: f16 `d`, 16 bytes (element `j` low nibble, `j + 16` high);
    /// `v = d·(nib − 8)`.
    Q4_0,
    /// int4 groups of 32: f16 step `d`, f16 minimum `m`, 16 bytes (element `2j` low nibble,
    /// `2j + 1` high); `v = m + d·nib`, accumulated as `(w·d)·nib + w·m`.
    Int4G32,
    /// int4 with one group per row (`int4-row`, TurboQuant's values as vLLM stores them:
    /// `value_packed_size = d/2 + 4`; `int4:group=d`): f16 step `d`, f16 minimum `m`, then `d/2`
    /// bytes (element `2j` low nibble, `2j + 1` high); `v = m + d·nib`, as [`Self::Int4G32`]
    /// with the row's step and minimum for every block.
    Int4Row,
    /// int3 groups of 32 (`int3`): f16 step `s`, f16 minimum `m`, 12 bytes (element `e` at
    /// bits `3e..3e+3`, LSB first); `v = m + s·code`, accumulated as [`Self::Int4G32`].
    Int3G32,
    /// int3 with one group per row (`int3:group=row`, TurboQuant's 3-bit values as vLLM
    /// stores them: `value_packed_size = ceil(3d/8) + 4`): f16 step, f16 minimum, then `3d/8`
    /// bytes in [`Self::Int3G32`]'s bit order, every block taking the row's step and minimum.
    Int3Row,
}

impl CodeValues {
    /// Whether the exact (quality) attention path accumulates this format's values on the
    /// codes too. The FP4 formats and int2 have done so since they landed (their published
    /// quality figures include it); the int8 and 4-bit per-token formats keep P·V on decoded
    /// rows there, so their perplexities stay what they were, and take the code path only
    /// when attention is timed ([`super::stream::Stream::axpy_rows_fast`]).
    pub fn exact(self) -> bool {
        matches!(
            self,
            CodeValues::Nvfp4 | CodeValues::Mxfp4 | CodeValues::Int2G32
        )
    }

    /// `(elements per block, bytes per block, bytes before the first block)`.
    fn layout(self) -> (usize, usize, usize) {
        match self {
            CodeValues::Nvfp4 => (16, 9, 4),
            CodeValues::Mxfp4 => (32, 17, 0),
            CodeValues::Int2G32 => (32, 12, 0),
            CodeValues::Int8Token => (32, 32, 2),
            CodeValues::Q8_0 => (32, 34, 0),
            CodeValues::Q4_0 => (32, 18, 0),
            CodeValues::Int4G32 => (32, 20, 0),
            CodeValues::Int4Row => (32, 16, 4),
            CodeValues::Int3G32 => (32, 16, 0),
            CodeValues::Int3Row => (32, 12, 4),
        }
    }

    /// Bytes a row of `d` elements (a multiple of 32) occupies in this format: the only row
    /// stride the kernels read it at (a stream whose rows are longer, e.g. int4 with two
    /// groups per row, is not this format).
    pub fn row_bytes(self, d: usize) -> usize {
        let (blk, bytes, off) = self.layout();
        off + d / blk * bytes
    }

    /// The row-level factor (NVFP4's f32 scale; 1 for MXFP4) of `row`.
    #[inline(always)]
    fn row_scale(self, row: &[u8]) -> f32 {
        match self {
            CodeValues::Nvfp4 => f32::from_le_bytes([row[0], row[1], row[2], row[3]]),
            CodeValues::Int8Token => f16::from_le_bytes([row[0], row[1]]).to_f32(),
            _ => 1.0,
        }
    }

    /// The value of a block's scale byte.
    #[inline(always)]
    fn block_scale(self, b: u8) -> f32 {
        match self {
            CodeValues::Nvfp4 => e4m3_to_f32(b),
            CodeValues::Mxfp4 => e8m0_to_f32(b),
            _ => unreachable!("only the FP4 formats have a one-byte block scale"),
        }
    }

    /// Block `b` of `row` as `(step, offset, the 32 codes)`: element `i` of the block is
    /// `offset + step · codes[i]` (before the row factor, which only NVFP4 and int8-token
    /// have; FP4 formats give their E2M1 values ×2 with half the step). NVFP4's two scales
    /// per block of 32 come back as its first half's; [`scalar_axpy_codes`] reads the second.
    fn block(self, row: &[u8], b: usize) -> (f32, f32, [i32; 32]) {
        let f16_at = |p: &[u8]| f16::from_le_bytes([p[0], p[1]]).to_f32();
        let mut c = [0i32; 32];
        match self {
            CodeValues::Int8Token | CodeValues::Q8_0 => {
                let (step, codes) = if self == CodeValues::Q8_0 {
                    (f16_at(&row[34 * b..]), &row[34 * b + 2..34 * b + 34])
                } else {
                    (1.0, &row[2 + 32 * b..2 + 32 * (b + 1)])
                };
                c.iter_mut()
                    .zip(codes)
                    .for_each(|(c, &x)| *c = x as i8 as i32);
                (step, 0.0, c)
            }
            CodeValues::Q4_0 => {
                let blk = &row[18 * b..18 * (b + 1)];
                for i in 0..16 {
                    c[i] = (blk[2 + i] & 15) as i32 - 8;
                    c[16 + i] = (blk[2 + i] >> 4) as i32 - 8;
                }
                (f16_at(blk), 0.0, c)
            }
            CodeValues::Int4G32 | CodeValues::Int4Row => {
                // The group's header, and where the block's 16 bytes start after it.
                let (head, at) = if self == CodeValues::Int4G32 {
                    (&row[20 * b..], 4)
                } else {
                    (row, 4 + 16 * b)
                };
                for i in 0..16 {
                    c[2 * i] = (head[at + i] & 15) as i32;
                    c[2 * i + 1] = (head[at + i] >> 4) as i32;
                }
                (f16_at(head), f16_at(&head[2..]), c)
            }
            CodeValues::Int2G32 => {
                let p = &row[12 * b..12 * (b + 1)];
                for (e, c) in c.iter_mut().enumerate() {
                    *c = ((p[4 + e / 4] >> (2 * (e % 4))) & 3) as i32;
                }
                (f16_at(p), f16_at(&p[2..]), c)
            }
            CodeValues::Int3G32 | CodeValues::Int3Row => {
                let (head, at) = if self == CodeValues::Int3G32 {
                    (&row[16 * b..], 4)
                } else {
                    (row, 4 + 12 * b)
                };
                for (e, c) in c.iter_mut().enumerate() {
                    *c = crate::kv::quant::bits::code_at(&head[at..], 3, e) as i32;
                }
                (f16_at(head), f16_at(&head[2..]), c)
            }
            CodeValues::Nvfp4 | CodeValues::Mxfp4 => {
                unreachable!("FP4 blocks go through E2M1 in scalar_axpy_codes")
            }
        }
    }
}

/// `acc[j·d..(j+1)·d] += Σ_t w[(t − t0)·nq + j] · row_t` for rows `t0..t1` of `data` (rows of
/// `rb` bytes of `d` elements in format `f`; `acc`: `[nq, d]` f32, `w`: `[(t1 − t0), nq]`), on
/// the codes. Rows whose weights are all zero are not read. Panics (a caller's bug, not input)
/// unless `d` is a multiple of 32 and the slices hold what the shapes say.
#[allow(clippy::too_many_arguments)] // the stream's coordinates; a struct would only rename them
pub fn axpy_codes(
    f: CodeValues,
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    check_code_args(f, data, rb, d, t0, t1, w, acc);
    simd_dispatch!(
        ["avx512f", "avx512bw", "avx2", "fma"],
        // SAFETY: as below; the AVX-512 kernel reads the same rows and blocks.
        unsafe { avx::avx512::axpy_codes(f, data, rb, d, t0, t1, w, acc) },
        simd_dispatch!(
            ["avx2", "fma"],
            // SAFETY: features enabled at compile time; every read is inside `data`, `w` and
            // `acc` (asserted above: rows t0..t1 of rb bytes, each holding d / block blocks).
            unsafe { avx::axpy_codes(f, data, rb, d, t0, t1, w, acc) },
            scalar_axpy_codes(f, data, rb, d, t0, t1, w, acc)
        )
    )
}

/// The shapes [`axpy_codes`] and [`axpy_codes_timed`] need (rows `t0..t1` of `rb` bytes in
/// `data`, `w` `[t1 − t0, nq]`): panics (a caller's bug) otherwise.
#[allow(clippy::too_many_arguments)] // as axpy_codes
fn check_code_args(
    f: CodeValues,
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &[f32],
) {
    let nq = acc.len() / d;
    assert!(d.is_multiple_of(32) && data.len() >= t1 * rb && w.len() >= (t1 - t0) * nq);
    assert!(rb >= f.row_bytes(d));
    // One group per row: a longer row holds more groups than the kernel reads headers for.
    assert!(!matches!(f, CodeValues::Int4Row | CodeValues::Int3Row) || rb == f.row_bytes(d));
}

/// [`axpy_codes`] for attention's timed path ([`super::stream::Stream::axpy_rows_fast`]):
/// the same sums up to f32 rounding. int2 differs: where the build has AVX-512 (F, BW, VNNI:
/// the 512-bit tile's gate) its
/// codes are unpacked to bytes ([`crate::kv::simd::avx::crumbs`]) and widened on the 512-bit
/// tile (two FMAs per query and row for 32 elements, not four), and its offsets `w·m` summed
/// per query over a tile of rows and added once, as int4's (the exact path adds `w·m` to every
/// accumulator per row, as the scalar loop rounds); every other format is [`axpy_codes`].
/// Panics as [`axpy_codes`].
#[allow(clippy::too_many_arguments)] // as axpy_codes
pub fn axpy_codes_timed(
    f: CodeValues,
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    if f == CodeValues::Int2G32 {
        check_code_args(f, data, rb, d, t0, t1, w, acc);
        simd_dispatch!(["avx512f", "avx512bw", "avx2", "fma"], {
            // SAFETY: as in axpy_codes: rows t0..t1 of rb ≥ the format's row bytes (asserted).
            return unsafe { avx::avx512::axpy_int2_timed(data, rb, d, t0, t1, w, acc) };
        });
    }
    axpy_codes(f, data, rb, d, t0, t1, w, acc)
}

/// Byte `b` of 2-bit codes as four f32 values (element `i` = bits `2i..2i+2`): the table the
/// int2 value path loads 4 codes at a time from (256 × 16 bytes, built once).
pub(crate) fn int2_table() -> &'static [[f32; 4]; 256] {
    static T: std::sync::OnceLock<[[f32; 4]; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [[0f32; 4]; 256];
        for (b, e) in t.iter_mut().enumerate() {
            for (i, v) in e.iter_mut().enumerate() {
                *v = ((b >> (2 * i)) & 3) as f32;
            }
        }
        t
    })
}

/// [`axpy_codes`] in scalar code: the path without AVX2 and the reference the SIMD kernel is
/// tested against.
#[allow(clippy::too_many_arguments)]
pub fn scalar_axpy_codes(
    f: CodeValues,
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    let nq = acc.len() / d;
    let (blk, bytes, off) = f.layout();
    let half = blk / 2;
    for t in t0..t1 {
        let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
        if wt.iter().all(|&x| x == 0.0) {
            continue;
        }
        let row = &data[t * rb..(t + 1) * rb];
        if !matches!(f, CodeValues::Nvfp4 | CodeValues::Mxfp4) {
            let g = f.row_scale(row);
            for b in 0..d / 32 {
                let (s, m, c) = f.block(row, b);
                for (j, &wj) in wt.iter().enumerate() {
                    let (ws, wm) = (wj * s * g, wj * m);
                    let a = &mut acc[j * d + 32 * b..j * d + 32 * (b + 1)];
                    for (a, &c) in a.iter_mut().zip(&c) {
                        *a += ws * c as f32 + wm;
                    }
                }
            }
            continue;
        }
        let g = f.row_scale(row);
        for b in 0..d / blk {
            let p = &row[off + b * bytes..off + (b + 1) * bytes];
            let s = f.block_scale(p[0]) * g;
            for (j, &wj) in wt.iter().enumerate() {
                let k = wj * s;
                let a = &mut acc[j * d + b * blk..j * d + (b + 1) * blk];
                for i in 0..half {
                    a[i] += k * E2M1[(p[1 + i] & 15) as usize];
                    a[i + half] += k * E2M1[(p[1 + i] >> 4) as usize];
                }
            }
        }
    }
}

/// `acc[j·d + π(i)] += w[(t − t0)·nq + j] · (n_t · centroids[code_ti])` for rows `t0..t1` of
/// `data`: rows of `rb` bytes, an f16 factor `n_t` (TurboQuant_mse's `‖v‖`) then `d` 4-bit
/// indices packed two per byte (element 2m low nibble, 2m + 1 high; TurboQuant, Zandieh et al.
/// 2025, arXiv 2504.19874, §3.1, as vLLM packs them). `acc` (`[nq, d]` f32) is kept in pair
/// order: per block of 32 elements the 16 even elements, then the 16 odd ones
/// (`π(32b + 2m) = 32b + m`, `π(32b + 2m + 1) = 32b + 16 + m`), the order the nibbles come out
/// of a byte; [`unpair`] restores element order once per call. Rows whose weights are all zero
/// are not read. Without `fused`, the arithmetic per element is that of decoding the row
/// (`n·centroid`, one rounding) then adding `w·value` (a product and a sum, no fused
/// multiply-add), so the result equals the decode-then-accumulate loop's bit for bit.
///
/// With `fused` (attention's timed path) the row factor goes into each query's weight once per
/// row (`(w·n_t) · centroid`, as [`axpy_codes`] folds a block's scale) and each element into
/// the sum by one fused multiply-add, instead of a product `n·centroid`, a product by `w` and a
/// sum: the same sum up to f32 rounding (two roundings fewer per term); without AVX2 both run
/// the scalar loop. Panics (a caller's bug, not input) unless `d` is a multiple of 32 and the
/// slices hold what the shapes say.
#[allow(clippy::too_many_arguments)] // the stream's coordinates; a struct would only rename them
pub fn axpy_centroids4(
    centroids: &[f32; 16],
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
    fused: bool,
) {
    let nq = acc.len() / d;
    assert!(d.is_multiple_of(32) && rb >= 2 + d / 2 && data.len() >= t1 * rb);
    assert!(w.len() >= (t1 - t0) * nq && acc.len() == nq * d);
    simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: features enabled at compile time; every read is inside `data`, `w` and `acc`
        // (asserted above: rows t0..t1 of rb ≥ 2 + d/2 bytes).
        unsafe {
            if fused {
                avx::axpy_centroids4_on::<true>(centroids, data, rb, d, t0, t1, w, acc)
            } else {
                avx::axpy_centroids4_on::<false>(centroids, data, rb, d, t0, t1, w, acc)
            }
        },
        {
            let _ = fused;
            scalar_axpy_centroids4(centroids, data, rb, d, t0, t1, w, acc)
        }
    )
}

/// [`axpy_centroids4`] in scalar code: the path without AVX2 and the reference the SIMD kernel
/// is tested against.
#[allow(clippy::too_many_arguments)]
pub fn scalar_axpy_centroids4(
    centroids: &[f32; 16],
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    let nq = acc.len() / d;
    let mut y = vec![0f32; d];
    for t in t0..t1 {
        let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
        if wt.iter().all(|&x| x == 0.0) {
            continue;
        }
        let row = &data[t * rb..(t + 1) * rb];
        let n = half::f16::from_le_bytes([row[0], row[1]]).to_f32();
        for b in 0..d / 32 {
            for m in 0..16 {
                let byte = row[2 + 16 * b + m];
                y[32 * b + m] = centroids[(byte & 15) as usize] * n;
                y[32 * b + 16 + m] = centroids[(byte >> 4) as usize] * n;
            }
        }
        for (a, &wj) in acc.chunks_exact_mut(d).zip(wt) {
            a.iter_mut().zip(&y).for_each(|(a, v)| *a += wj * v);
        }
    }
}

/// `acc[j·d + i] += (w[(t − t0)·nq + j] · n_t) · centroids[code_ti]` for rows `t0..t1` of
/// `data`: rows of `rb` bytes, an f16 factor `n_t` (TurboQuant_mse's stored norm), then `d`
/// indices of `b` bits packed LSB first (element e at bits `b·e..b·e + b`: TurboQuant, Zandieh
/// et al. 2025, arXiv 2504.19874, §3.1, rows as [`crate::kv::quant::mse::TurboQuantMse`] packs
/// them), `b` = 3 for 8 `centroids` and 2 for 4. `acc` is `[nq, d]` f32 in element order. Rows
/// whose weights (of the queries summed together) are all zero are not read. Attention's timed
/// path, as [`axpy_centroids4`]'s `fused`: the row factor goes into each query's weight, then
/// with AVX2 and FMA per block of 32 elements (12 or 8 bytes) one unpack
/// ([`crate::kv::simd::avx::triplets`] or [`crate::kv::simd::avx::crumbs`]), four 8-entry
/// `vpermps` lookups (two 16-entry ones with AVX-512) and one fused multiply-add per element
/// and query; otherwise [`scalar_axpy_centroids_packed`]. The decode-then-accumulate loop's sum
/// up to f32 rounding. Panics (a caller's bug, not input) unless there are 4 or 8 centroids,
/// `d` is a multiple of 32 and the slices hold what the shapes say.
#[allow(clippy::too_many_arguments)] // the stream's coordinates, as in axpy_centroids4
pub fn axpy_centroids_packed(
    centroids: &[f32],
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    let nq = acc.len() / d;
    let bits = packed_bits(centroids);
    assert!(d.is_multiple_of(32) && rb >= 2 + bits * d / 8 && data.len() >= t1 * rb);
    assert!(w.len() >= (t1 - t0) * nq && acc.len() == nq * d);
    // Padded to 8 entries: the kernels look up 8-lane tables; 2-bit codes reach only 0–3.
    let mut cent = [0f32; 8];
    cent[..centroids.len()].copy_from_slice(centroids);
    simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: features enabled at compile time; every read is inside `data`, `w` and `acc`
        // (asserted above: rows t0..t1 of rb ≥ 2 + bits·d/8 bytes, 4·bits read per block).
        unsafe {
            if bits == 3 {
                avx::axpy_centroids_packed::<3>(&cent, data, rb, d, t0, t1, w, acc)
            } else {
                avx::axpy_centroids_packed::<2>(&cent, data, rb, d, t0, t1, w, acc)
            }
        },
        scalar_axpy_centroids_packed(centroids, data, rb, d, t0, t1, w, acc)
    )
}

/// The code width of a packed codebook: 3 bits for 8 centroids, 2 for 4. Panics otherwise (a
/// caller's bug: the streams pass a codebook of the row's width).
fn packed_bits(centroids: &[f32]) -> usize {
    match centroids.len() {
        8 => 3,
        4 => 2,
        n => panic!("packed centroid tables hold 4 or 8 entries, not {n}"),
    }
}

/// [`axpy_centroids_packed`] in scalar code (a product `(w·n)·c` and a sum per element): the
/// path without AVX2 and the reference the SIMD kernel is tested against.
#[allow(clippy::too_many_arguments)]
pub fn scalar_axpy_centroids_packed(
    centroids: &[f32],
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    let nq = acc.len() / d;
    let bits = packed_bits(centroids) as u8;
    for t in t0..t1 {
        let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
        if wt.iter().all(|&x| x == 0.0) {
            continue;
        }
        let row = &data[t * rb..(t + 1) * rb];
        let n = f16::from_le_bytes([row[0], row[1]]).to_f32();
        for (a, &wj) in acc.chunks_exact_mut(d).zip(wt) {
            let f = wj * n;
            for (e, a) in a.iter_mut().enumerate() {
                *a += f * centroids[crate::kv::quant::bits::code_at(&row[2..], bits, e)];
            }
        }
    }
}

/// `acc[j·d + i] += c_tj · (z_ti ? +1 : −1)`, `c_tj = w[(t − t0)·nq + j] · f[t − t0]`, for rows
/// `t0..t1` of `data` (rows of `rb` bytes, `d` sign bits LSB-first from byte `off` of each
/// row: TurboQuant_prod's QJL sketch, Zandieh et al. 2025, arXiv 2504.19874, §3.2, or 1-bit
/// TurboQuant_mse codes), `acc` `[nq, d]` f32: the QJL half of a weighted value sum, `w` the
/// attention weights `[t1 − t0, nq]`, `f` each row's factor (`‖x‖·γ·√(π/2)/d` for QJL). With
/// AVX2 as `2·Σ_t c_t·z_ti − Σ_t c_t` (a byte of bits spread to a lane mask by one compare,
/// the coefficient masked in and added: four operations per 8 elements and query; AVX-512: one
/// masked add per 16; the accumulators of four queries in registers over all rows, `c` formed
/// per row in the loop and `Σ_t c_t` summed alongside during the first block), otherwise
/// [`scalar_axpy_signs`]; the same sum up to f32 rounding. Panics (a caller's bug, not input)
/// unless `d` is a multiple of 32 and the slices hold what the shapes say.
#[allow(clippy::too_many_arguments)] // the stream's coordinates, as in axpy_centroids4
pub fn axpy_signs(
    data: &[u8],
    rb: usize,
    off: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    f: &[f32],
    acc: &mut [f32],
) {
    let nq = acc.len() / d;
    assert!(d.is_multiple_of(32) && off + d / 8 <= rb && data.len() >= t1 * rb);
    assert!(w.len() >= (t1 - t0) * nq && f.len() >= t1 - t0 && acc.len() == nq * d);
    simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: AVX2 and FMA enabled at compile time; every read is inside `data` (rows
        // t0..t1, bytes off..off + d/8 of each, asserted above), `w`, `f` and `acc`.
        unsafe { avx::axpy_signs(data, rb, off, d, t0, t1, w, f, acc) },
        scalar_axpy_signs(data, rb, off, d, t0, t1, w, f, acc)
    )
}

/// [`axpy_signs`] in scalar code (`±w·f` added per element): the path without AVX2 and the
/// reference the SIMD kernel is tested against.
#[allow(clippy::too_many_arguments)]
pub fn scalar_axpy_signs(
    data: &[u8],
    rb: usize,
    off: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    f: &[f32],
    acc: &mut [f32],
) {
    let nq = acc.len() / d;
    for t in t0..t1 {
        let z = &data[t * rb + off..t * rb + off + d / 8];
        let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
        for (a, &wj) in acc.chunks_exact_mut(d).zip(wt) {
            let cj = wj * f[t - t0];
            for (i, a) in a.iter_mut().enumerate() {
                *a += if (z[i / 8] >> (i % 8)) & 1 == 1 {
                    cj
                } else {
                    -cj
                };
            }
        }
    }
}

/// `acc[j·d + i] += w[(t − t0)·nq + j] · n_t · centroids[code_ti]` for TurboQuant_mse rows of
/// any width on their codes (an f16 factor `n_t`, then `d` indices of `log2(centroids)` bits
/// packed LSB first: TurboQuant, Zandieh et al. 2025, arXiv 2504.19874, §3.1); `acc` `[nq, d]`
/// f32 in element order. 16 centroids: [`axpy_centroids4`] (with `fused` as there; into a
/// scratch buffer kept in pair order, then added); 8 or 4: [`axpy_centroids_packed`]; 2 (1-bit
/// rows, the bits laid out as [`axpy_signs`] reads them): `n·c[bit] = n·(c₀ + c₁)/2 +
/// n·(c₁ − c₀)/2·(±1)`, so [`axpy_signs`] with each row's coefficient `w·n·(c₁ − c₀)/2` and,
/// per query, `Σ_t w·n·(c₀ + c₁)/2` added to every element. The decode-then-accumulate loop's
/// sum up to f32 rounding (bit for bit for 16 centroids without `fused` when `acc` starts at
/// zero: the scratch's sums are then added to zeros). Panics (a caller's
/// bug, not input) for other codebook sizes, unless `d` is a multiple of 32, or where the
/// slices hold less than the shapes say.
#[allow(clippy::too_many_arguments)] // the stream's coordinates, as in axpy_centroids4
pub fn axpy_codebook(
    centroids: &[f32],
    data: &[u8],
    rb: usize,
    d: usize,
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
    fused: bool,
) {
    let nq = acc.len() / d;
    match centroids.len() {
        16 => {
            let cent: &[f32; 16] = centroids.try_into().expect("16 centroids");
            let mut paired = vec![0f32; acc.len()];
            axpy_centroids4(cent, data, rb, d, t0, t1, w, &mut paired, fused);
            unpair(&mut paired, d, &mut vec![0f32; d]);
            acc.iter_mut().zip(&paired).for_each(|(a, p)| *a += p);
        }
        8 | 4 => axpy_centroids_packed(centroids, data, rb, d, t0, t1, w, acc),
        2 => {
            assert!(w.len() >= (t1 - t0) * nq && data.len() >= t1 * rb && rb >= 2);
            let (half_step, mid) = (
                0.5 * (centroids[1] - centroids[0]),
                0.5 * (centroids[0] + centroids[1]),
            );
            let norms: Vec<f32> = data[t0 * rb..t1 * rb]
                .chunks_exact(rb)
                .map(|row| f16::from_le_bytes([row[0], row[1]]).to_f32())
                .collect();
            let f: Vec<f32> = norms.iter().map(|n| n * half_step).collect();
            axpy_signs(data, rb, 2, d, t0, t1, w, &f, acc);
            // The codebook's midpoint (0 for a symmetric one): Σ_t w·n·mid per query.
            if mid != 0.0 && nq > 0 {
                let mut base = vec![0f32; nq];
                for (wt, n) in w.chunks_exact(nq).zip(&norms) {
                    base.iter_mut()
                        .zip(wt)
                        .for_each(|(b, &wj)| *b += wj * n * mid);
                }
                for (a, b) in acc.chunks_exact_mut(d).zip(&base) {
                    a.iter_mut().for_each(|a| *a += b);
                }
            }
        }
        n => panic!("TurboQuant codebooks hold 2, 4, 8 or 16 centroids, not {n}"),
    }
}

/// Restores element order in a `[nq, d]` buffer kept in [`axpy_centroids4`]'s pair order,
/// through the scratch `tmp` (`[d]`).
pub fn unpair(acc: &mut [f32], d: usize, tmp: &mut [f32]) {
    for a in acc.chunks_exact_mut(d) {
        tmp.copy_from_slice(a);
        for b in 0..d / 32 {
            for m in 0..16 {
                a[32 * b + 2 * m] = tmp[32 * b + m];
                a[32 * b + 2 * m + 1] = tmp[32 * b + 16 + m];
            }
        }
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx {
    use super::CodeValues;
    use crate::kv::formats::fp4::E2M1_X2;
    use crate::kv::simd::avx::{crumbs, f16_at, nibbles, nibbles8, triplets};
    use crate::util::simd::query_groups;
    use std::arch::x86_64::*;

    /// Rows per tile: the accumulators of one block of 32 channels stay in registers over a
    /// tile, so each row costs FMAs only, not a load and a store of every accumulator.
    const TILE: usize = 32;

    /// 32 i8 lanes widened to four vectors of 8 f32 (element order).
    #[inline(always)]
    unsafe fn widen(k: __m256i) -> [__m256; 4] {
        let (lo, hi) = (_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))),
        ]
    }

    /// Block `b` (32 elements) of the row at `row` as 32 i8 codes in element order (FP4:
    /// E2M1 values ×2; Q4_0: nibble − 8; int4: the nibbles), the step of the first 16 and of
    /// the last 16 elements (equal except for NVFP4's two scales, the row factor folded in)
    /// and the offset (int4's and int2's minimum). int2 comes here only on the timed 512-bit
    /// tile ([`super::axpy_codes_timed`]); the AVX2 tile looks its codes up in a float table
    /// ([`unpack`]).
    #[inline(always)]
    unsafe fn codes(
        f: CodeValues,
        row: *const u8,
        b: usize,
        lut: __m256i,
    ) -> (__m256i, f32, f32, f32) {
        match f {
            CodeValues::Nvfp4 => {
                // E2M1 values ×2 from the table: half of each scale.
                let g = 0.5 * (row as *const f32).read_unaligned();
                let b0 = row.add(4 + 18 * b);
                let b1 = b0.add(9);
                let nib = _mm256_set_m128i(nibbles8(b1.add(1)), nibbles8(b0.add(1)));
                let k = _mm256_shuffle_epi8(lut, nib);
                (k, f.block_scale(*b0) * g, f.block_scale(*b1) * g, 0.0)
            }
            CodeValues::Mxfp4 => {
                let blk = row.add(17 * b);
                let s = f.block_scale(*blk) * 0.5;
                (_mm256_shuffle_epi8(lut, nibbles(blk.add(1))), s, s, 0.0)
            }
            CodeValues::Int8Token | CodeValues::Q8_0 => {
                let (s, c) = if f == CodeValues::Q8_0 {
                    (f16_at(row.add(34 * b)), row.add(34 * b + 2))
                } else {
                    (f16_at(row), row.add(2 + 32 * b))
                };
                (_mm256_loadu_si256(c as *const __m256i), s, s, 0.0)
            }
            CodeValues::Q4_0 => {
                let blk = row.add(18 * b);
                let k = _mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8));
                let s = f16_at(blk);
                (k, s, s, 0.0)
            }
            CodeValues::Int4G32 | CodeValues::Int4Row => {
                // Element 2j is byte j's low nibble, 2j + 1 its high one: interleave back.
                let (head, at) = if f == CodeValues::Int4G32 {
                    (row.add(20 * b), 4)
                } else {
                    (row, 4 + 16 * b)
                };
                let x = _mm_loadu_si128(head.add(at) as *const __m128i);
                let m = _mm_set1_epi8(0x0f);
                let (lo, hi) = (_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
                let k = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
                let s = f16_at(head);
                (k, s, s, f16_at(head.add(2)))
            }
            CodeValues::Int3G32 | CodeValues::Int3Row => {
                let head = if f == CodeValues::Int3G32 {
                    row.add(16 * b)
                } else {
                    row
                };
                let at = if f == CodeValues::Int3G32 {
                    4
                } else {
                    4 + 12 * b
                };
                let s = f16_at(head);
                (triplets(head.add(at)), s, s, f16_at(head.add(2)))
            }
            // The timed 512-bit tile's int2 (the AVX2 tile looks codes up in a float table).
            CodeValues::Int2G32 => {
                let p = row.add(12 * b);
                let s = f16_at(p);
                (crumbs(p.add(4)), s, s, f16_at(p.add(2)))
            }
        }
    }

    /// Block `b` (32 elements) of the row at `row`: four vectors of codes as f32 (element
    /// order), the step of the first 16 and of the last 16 elements (equal except for NVFP4's
    /// two scales, the row factor folded in) and the offset (int4's and int2's minimum).
    #[inline(always)]
    unsafe fn unpack(
        f: CodeValues,
        row: *const u8,
        b: usize,
        lut: __m256i,
    ) -> ([__m256; 4], f32, f32, f32) {
        match f {
            CodeValues::Nvfp4
            | CodeValues::Mxfp4
            | CodeValues::Q4_0
            | CodeValues::Int4G32
            | CodeValues::Int4Row
            | CodeValues::Int3G32
            | CodeValues::Int3Row => {
                let (k, s0, s1, m) = codes(f, row, b, lut);
                (widen(k), s0, s1, m)
            }
            CodeValues::Int8Token | CodeValues::Q8_0 => {
                let (s, c) = if f == CodeValues::Q8_0 {
                    (f16_at(row.add(34 * b)), row.add(34 * b + 2))
                } else {
                    (f16_at(row), row.add(2 + 32 * b))
                };
                let v = |k: usize| {
                    let x = _mm_loadl_epi64(c.add(8 * k) as *const __m128i);
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x))
                };
                ([v(0), v(1), v(2), v(3)], s, s, 0.0)
            }
            CodeValues::Int2G32 => {
                let tab = super::int2_table().as_ptr() as *const f32;
                let p = row.add(12 * b);
                let c = p.add(4);
                let pair = |k: usize| {
                    _mm256_set_m128(
                        _mm_loadu_ps(tab.add(4 * *c.add(2 * k + 1) as usize)),
                        _mm_loadu_ps(tab.add(4 * *c.add(2 * k) as usize)),
                    )
                };
                let s = f16_at(p);
                ([pair(0), pair(1), pair(2), pair(3)], s, s, f16_at(p.add(2)))
            }
        }
    }

    /// Queries `j0..j0 + Q` over rows `t..t + n` for channels `32b..32b + 32`: the Q × 4
    /// accumulators held in registers over the tile, per row `acc = (w·s)·v + acc`; int2 adds
    /// its offset first (`acc + w·m`, on the exact path as before), int4 (timed path only)
    /// sums `w·m` per query over the tile and adds it once when the tile is stored.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the tile's coordinates; a struct would only rename them
    unsafe fn tile<const Q: usize>(
        f: CodeValues,
        data: &[u8],
        rb: usize,
        (t, n, b): (usize, usize, usize),
        w: *const f32,
        nq: usize,
        j0: usize,
        a: *mut f32,
        d: usize,
        lut: __m256i,
    ) {
        // int2 (on the exact path too) adds `w·m` to every accumulator per row, as the scalar
        // loop rounds; int4 (timed path only) sums `w·m` per query over the tile and adds it
        // once at the end.
        let offset = f == CodeValues::Int2G32;
        let deferred = matches!(
            f,
            CodeValues::Int4G32 | CodeValues::Int4Row | CodeValues::Int3G32 | CodeValues::Int3Row
        );
        let mut off = [0f32; Q];
        let two_scales = f == CodeValues::Nvfp4;
        let mut acc = [[_mm256_setzero_ps(); 4]; Q];
        for (j, aj) in acc.iter_mut().enumerate() {
            for (k, r) in aj.iter_mut().enumerate() {
                *r = _mm256_loadu_ps(a.add(j * d + 32 * b + 8 * k));
            }
        }
        for r in 0..n {
            let wr = w.add(r * nq + j0);
            if (0..Q).all(|j| *wr.add(j) == 0.0) {
                continue;
            }
            if b == 0 && j0 == 0 {
                crate::kv::simd::prefetch_ahead(data, (t + r) * rb, rb);
            }
            let (v, s0, s1, m) = unpack(f, data.as_ptr().add((t + r) * rb), b, lut);
            for (j, aj) in acc.iter_mut().enumerate() {
                let wj = *wr.add(j);
                let f0 = _mm256_set1_ps(wj * s0);
                let f1 = if two_scales {
                    _mm256_set1_ps(wj * s1)
                } else {
                    f0
                };
                if offset {
                    let wm = _mm256_set1_ps(wj * m);
                    aj.iter_mut().for_each(|x| *x = _mm256_add_ps(*x, wm));
                }
                if deferred {
                    off[j] += wj * m;
                }
                aj[0] = _mm256_fmadd_ps(f0, v[0], aj[0]);
                aj[1] = _mm256_fmadd_ps(f0, v[1], aj[1]);
                aj[2] = _mm256_fmadd_ps(f1, v[2], aj[2]);
                aj[3] = _mm256_fmadd_ps(f1, v[3], aj[3]);
            }
        }
        for (j, aj) in acc.iter().enumerate() {
            let o = _mm256_set1_ps(off[j]);
            for (k, r) in aj.iter().enumerate() {
                let r = if deferred { _mm256_add_ps(*r, o) } else { *r };
                _mm256_storeu_ps(a.add(j * d + 32 * b + 8 * k), r);
            }
        }
    }

    /// Tiles of [`TILE`] rows; per tile and block of 32 channels, queries four at a time
    /// ([`tile`]), so each block of a row is unpacked once per four queries (once for a GQA
    /// group of 3 or 4) and every accumulator is loaded and stored once per tile.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn axpy_codes(
        f: CodeValues,
        data: &[u8],
        rb: usize,
        d: usize,
        t0: usize,
        t1: usize,
        w: &[f32],
        acc: &mut [f32],
    ) {
        per_format!(f, g => drive::<false>(g, data, rb, d, t0, t1, w, acc))
    }

    /// `$body` compiled once per value format, with `$g` the format as a constant (the
    /// kernels are `#[inline(always)]`, so every `match` on the format inside them folds).
    macro_rules! per_format {
        ($f:expr, $g:ident => $body:expr) => {
            match $f {
                CodeValues::Nvfp4 => {
                    let $g = CodeValues::Nvfp4;
                    $body
                }
                CodeValues::Mxfp4 => {
                    let $g = CodeValues::Mxfp4;
                    $body
                }
                CodeValues::Int2G32 => {
                    let $g = CodeValues::Int2G32;
                    $body
                }
                CodeValues::Int8Token => {
                    let $g = CodeValues::Int8Token;
                    $body
                }
                CodeValues::Q8_0 => {
                    let $g = CodeValues::Q8_0;
                    $body
                }
                CodeValues::Q4_0 => {
                    let $g = CodeValues::Q4_0;
                    $body
                }
                CodeValues::Int4G32 => {
                    let $g = CodeValues::Int4G32;
                    $body
                }
                CodeValues::Int4Row => {
                    let $g = CodeValues::Int4Row;
                    $body
                }
                CodeValues::Int3G32 => {
                    let $g = CodeValues::Int3G32;
                    $body
                }
                CodeValues::Int3Row => {
                    let $g = CodeValues::Int3Row;
                    $body
                }
            }
        };
    }
    use per_format;

    /// The tile loop of both widths: `WIDE` takes [`avx512::tile`] (where compiled), else
    /// [`tile`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn drive<const WIDE: bool>(
        f: CodeValues,
        data: &[u8],
        rb: usize,
        d: usize,
        t0: usize,
        t1: usize,
        w: &[f32],
        acc: &mut [f32],
    ) {
        let nq = acc.len() / d;
        let t = _mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i);
        let lut = _mm256_set_m128i(t, t);
        let a = acc.as_mut_ptr();
        let mut t = t0;
        while t < t1 {
            let n = (t1 - t).min(TILE);
            let wt = w.as_ptr().add((t - t0) * nq);
            for b in 0..d / 32 {
                query_groups!(
                    nq,
                    Q,
                    j,
                    tile_of::<Q, WIDE>(f, data, rb, (t, n, b), wt, nq, j, a.add(j * d), d, lut)
                );
            }
            t += n;
        }
    }

    /// [`avx512::tile`] when `WIDE` (and compiled), else [`tile`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_of<const Q: usize, const WIDE: bool>(
        f: CodeValues,
        data: &[u8],
        rb: usize,
        at: (usize, usize, usize),
        w: *const f32,
        nq: usize,
        j0: usize,
        a: *mut f32,
        d: usize,
        lut: __m256i,
    ) {
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        if WIDE {
            return avx512::tile::<Q>(f, data, rb, at, w, nq, j0, a, d, lut);
        }
        tile::<Q>(f, data, rb, at, w, nq, j0, a, d, lut)
    }

    /// 32 elements at a time: 32 nibbles (pair order) widened to i32 indices, eight at a time
    /// looked up in the 16 centroids held in two vectors (`permutevar8x32` on each half, the
    /// index's bit 3 choosing between them) — with AVX-512, sixteen at a time by one `vpermps`
    /// of all 16 — times the row factor; then per query
    /// `acc += w · v` as a product and a sum (the scalar loop's roundings). Per block of 32
    /// elements the accumulators of up to four queries stay in registers over all the rows
    /// (each element still sums the rows in order, so the same result to the bit as a row at a
    /// time).
    /// With `FUSED` ([`super::axpy_centroids4`]'s `fused`) the row factor goes into each query's
    /// weight and the element into the sum by one FMA, without the per-element product `n·c`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn axpy_centroids4_on<const FUSED: bool>(
        centroids: &[f32; 16],
        data: &[u8],
        rb: usize,
        d: usize,
        t0: usize,
        t1: usize,
        w: &[f32],
        acc: &mut [f32],
    ) {
        let nq = acc.len() / d;
        let cents = (
            _mm256_loadu_ps(centroids.as_ptr()),
            _mm256_loadu_ps(centroids.as_ptr().add(8)),
        );
        let o = acc.as_mut_ptr();
        let rows = (data, rb, t0, t1);
        for b in 0..d / 32 {
            query_groups!(
                nq,
                Q,
                j,
                centroids_block::<Q, WIDE16, FUSED>(cents, rows, b, w, nq, j, o, d)
            );
        }
    }

    /// [`super::axpy_centroids_packed`] for `BITS`-bit codes (3 or 2; 8 centroids, the last
    /// 4 unused at 2 bits): per block of 32 elements and up to four queries, the accumulators
    /// stay in registers over all the rows ([`centroids_packed_block`]).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn axpy_centroids_packed<const BITS: usize>(
        centroids: &[f32; 8],
        data: &[u8],
        rb: usize,
        d: usize,
        t0: usize,
        t1: usize,
        w: &[f32],
        acc: &mut [f32],
    ) {
        let nq = acc.len() / d;
        let cent = _mm256_loadu_ps(centroids.as_ptr());
        let o = acc.as_mut_ptr();
        let rows = (data, rb, t0, t1);
        for b in 0..d / 32 {
            query_groups!(
                nq,
                Q,
                j,
                centroids_packed_block::<Q, BITS>(cent, rows, b, w, nq, j, o, d)
            );
        }
    }

    /// Block `b` (elements `32b..32b + 32`, bytes `2 + 4·BITS·b..2 + 4·BITS·(b + 1)` of a row)
    /// of [`super::axpy_centroids_packed`] for queries `j0..j0 + Q`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the block's coordinates, as in centroids_block
    unsafe fn centroids_packed_block<const Q: usize, const BITS: usize>(
        cent: __m256,
        (data, rb, t0, t1): (&[u8], usize, usize, usize),
        b: usize,
        w: &[f32],
        nq: usize,
        j0: usize,
        o: *mut f32,
        d: usize,
    ) {
        #[cfg(all(target_feature = "avx512f", target_feature = "avx512bw"))]
        {
            // 16 lookups in one `vpermps` (indices 0–7 reach the 8 centroids in the low half),
            // two FMAs per query and row instead of four: the same products and sums per
            // element as the 8-lane loop below, so the same result to the bit.
            let cents = _mm512_castps256_ps512(cent);
            let mut acc = [[_mm512_setzero_ps(); 2]; Q];
            for (j, aj) in acc.iter_mut().enumerate() {
                for (r, x) in aj.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(o.add((j0 + j) * d + 32 * b + 16 * r));
                }
            }
            for t in t0..t1 {
                let wt = w.get_unchecked((t - t0) * nq + j0..(t - t0) * nq + j0 + Q);
                if wt.iter().all(|&x| x == 0.0) {
                    continue;
                }
                let row = data.as_ptr().add(t * rb);
                let nf = f16_at(row);
                let k = packed_codes::<BITS>(row, b);
                let v = [_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1)]
                    .map(|i| _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(i), cents));
                for (aj, &wj) in acc.iter_mut().zip(wt) {
                    let wv = _mm512_set1_ps(wj * nf);
                    for (x, &vr) in aj.iter_mut().zip(&v) {
                        *x = _mm512_fmadd_ps(wv, vr, *x);
                    }
                }
            }
            for (j, aj) in acc.iter().enumerate() {
                for (r, x) in aj.iter().enumerate() {
                    _mm512_storeu_ps(o.add((j0 + j) * d + 32 * b + 16 * r), *x);
                }
            }
            return;
        }
        #[allow(unreachable_code)]
        let mut acc = [[_mm256_setzero_ps(); 4]; Q];
        for (j, aj) in acc.iter_mut().enumerate() {
            for (r, x) in aj.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(o.add((j0 + j) * d + 32 * b + 8 * r));
            }
        }
        for t in t0..t1 {
            let wt = w.get_unchecked((t - t0) * nq + j0..(t - t0) * nq + j0 + Q);
            if wt.iter().all(|&x| x == 0.0) {
                continue;
            }
            let row = data.as_ptr().add(t * rb);
            let nf = f16_at(row);
            let k = packed_codes::<BITS>(row, b);
            let (k0, k1) = (_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
            let look = |i: __m128i| _mm256_permutevar8x32_ps(cent, _mm256_cvtepu8_epi32(i));
            let v = [
                look(k0),
                look(_mm_srli_si128(k0, 8)),
                look(k1),
                look(_mm_srli_si128(k1, 8)),
            ];
            for (aj, &wj) in acc.iter_mut().zip(wt) {
                let wv = _mm256_set1_ps(wj * nf);
                for (x, &vr) in aj.iter_mut().zip(&v) {
                    *x = _mm256_fmadd_ps(wv, vr, *x);
                }
            }
        }
        for (j, aj) in acc.iter().enumerate() {
            for (r, x) in aj.iter().enumerate() {
                _mm256_storeu_ps(o.add((j0 + j) * d + 32 * b + 8 * r), *x);
            }
        }
    }

    /// Block `b`'s 32 codes of `BITS` bits (3 or 2) after a row's f16 factor, in element order.
    #[inline(always)]
    unsafe fn packed_codes<const BITS: usize>(row: *const u8, b: usize) -> __m256i {
        if BITS == 3 {
            triplets(row.add(2 + 12 * b))
        } else {
            crumbs(row.add(2 + 8 * b))
        }
    }

    /// [`super::axpy_signs`]: per block of 32 elements (4 bytes of bits) and up to four
    /// queries, `Σ_t c_t·z_ti` in registers over all the rows, then `2·that − Σ_t c_t` added;
    /// `Σ_t c_t` (rows in order) summed during block 0 and kept for the others.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn axpy_signs(
        data: &[u8],
        rb: usize,
        off: usize,
        d: usize,
        t0: usize,
        t1: usize,
        w: &[f32],
        f: &[f32],
        acc: &mut [f32],
    ) {
        let nq = acc.len() / d;
        let mut totals = vec![0f32; nq];
        let o = acc.as_mut_ptr();
        let rows = (data, rb, off, t0, t1);
        for b in 0..d / 32 {
            query_groups!(
                nq,
                Q,
                j,
                if b == 0 {
                    signs_block::<Q, true>(rows, b, (w, f), nq, j, &mut totals, o, d)
                } else {
                    signs_block::<Q, false>(rows, b, (w, f), nq, j, &mut totals, o, d)
                }
            );
        }
    }

    /// Block `b` (elements `32b..32b + 32`, bytes `off + 4b..off + 4b + 4` of a row) of
    /// [`axpy_signs`] for queries `j0..j0 + Q`; with `FIRST`, `Σ_t c_t` is summed here (rows in
    /// order, one scalar sum per query) and written to `totals`, otherwise read from it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the block's coordinates, as in centroids_block
    unsafe fn signs_block<const Q: usize, const FIRST: bool>(
        (data, rb, off, t0, t1): (&[u8], usize, usize, usize, usize),
        b: usize,
        (w, f): (&[f32], &[f32]),
        nq: usize,
        j0: usize,
        totals: &mut [f32],
        o: *mut f32,
        d: usize,
    ) {
        #[cfg(all(target_feature = "avx512f", target_feature = "avx512bw"))]
        {
            // Two bytes of bits are a 16-lane mask as they stand (bit i of the little-endian
            // u16 is element 16k + i): one masked add per 16 elements and query, the same sums
            // as the 8-lane loop below (adding 0 leaves a sum as it is), so the same result.
            let mut sum = [[_mm512_setzero_ps(); 2]; Q];
            let mut ts = [0f32; Q];
            for t in t0..t1 {
                let z = data.as_ptr().add(t * rb + off + 4 * b);
                let m: [__mmask16; 2] = [
                    u16::from_le_bytes([*z, *z.add(1)]),
                    u16::from_le_bytes([*z.add(2), *z.add(3)]),
                ];
                let wt = w.get_unchecked((t - t0) * nq + j0..(t - t0) * nq + j0 + Q);
                let ft = *f.get_unchecked(t - t0);
                for ((sj, &wj), tj) in sum.iter_mut().zip(wt).zip(ts.iter_mut()) {
                    let c = wj * ft;
                    let cv = _mm512_set1_ps(c);
                    for (x, &mk) in sj.iter_mut().zip(&m) {
                        *x = _mm512_mask_add_ps(*x, mk, *x, cv);
                    }
                    if FIRST {
                        *tj += c;
                    }
                }
            }
            if FIRST {
                totals[j0..j0 + Q].copy_from_slice(&ts);
            }
            for (jj, sj) in sum.iter().enumerate() {
                let tot = _mm512_set1_ps(totals[j0 + jj]);
                for (k, x) in sj.iter().enumerate() {
                    let p = o.add((j0 + jj) * d + 32 * b + 16 * k);
                    let add = _mm512_sub_ps(_mm512_add_ps(*x, *x), tot);
                    _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), add));
                }
            }
            return;
        }
        #[allow(unreachable_code)]
        let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let mut sum = [[_mm256_setzero_ps(); 4]; Q];
        let mut ts = [0f32; Q];
        for t in t0..t1 {
            let z = data.as_ptr().add(t * rb + off + 4 * b);
            let m: [__m256; 4] = std::array::from_fn(|k| {
                let v = _mm256_and_si256(_mm256_set1_epi32(*z.add(k) as i32), bit);
                _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, bit))
            });
            let wt = w.get_unchecked((t - t0) * nq + j0..(t - t0) * nq + j0 + Q);
            let ft = *f.get_unchecked(t - t0);
            for ((sj, &wj), tj) in sum.iter_mut().zip(wt).zip(ts.iter_mut()) {
                let c = wj * ft;
                let cv = _mm256_set1_ps(c);
                for (x, &mk) in sj.iter_mut().zip(&m) {
                    *x = _mm256_add_ps(*x, _mm256_and_ps(mk, cv));
                }
                if FIRST {
                    *tj += c;
                }
            }
        }
        if FIRST {
            totals[j0..j0 + Q].copy_from_slice(&ts);
        }
        for (jj, sj) in sum.iter().enumerate() {
            let tot = _mm256_set1_ps(totals[j0 + jj]);
            for (k, x) in sj.iter().enumerate() {
                let p = o.add((j0 + jj) * d + 32 * b + 8 * k);
                let add = _mm256_sub_ps(_mm256_add_ps(*x, *x), tot);
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), add));
            }
        }
    }

    /// Whether [`centroids_block`] runs 16 lanes wide (AVX-512 F and BW compiled in).
    const WIDE16: bool = cfg!(all(target_feature = "avx512f", target_feature = "avx512bw"));

    /// Block `b` (elements `32b..32b + 32`) of [`axpy_centroids4`] for queries `j0..j0 + Q`;
    /// with `WIDE` 16 lanes a register.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the block's coordinates; a struct would only rename them
    unsafe fn centroids_block<const Q: usize, const WIDE: bool, const FUSED: bool>(
        (lo, hi): (__m256, __m256),
        (data, rb, t0, t1): (&[u8], usize, usize, usize),
        b: usize,
        w: &[f32],
        nq: usize,
        j0: usize,
        o: *mut f32,
        d: usize,
    ) {
        #[cfg(all(target_feature = "avx512f", target_feature = "avx512bw"))]
        if WIDE {
            // 16 lookups in one `vpermps` of the 16 centroids; the same products and sums per
            // element as the 8-lane loop below, so the same result to the bit.
            let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
            let cents = _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(hi), 1));
            let mut acc = [[_mm512_setzero_ps(); 2]; Q];
            for (j, aj) in acc.iter_mut().enumerate() {
                for (r, x) in aj.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(o.add((j0 + j) * d + 32 * b + 16 * r));
                }
            }
            for t in t0..t1 {
                let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
                if wt.iter().all(|&x| x == 0.0) {
                    continue;
                }
                let row = data.as_ptr().add(t * rb);
                let nf = f16_at(row);
                let n = _mm512_set1_ps(nf);
                let nib = nibbles(row.add(2 + 16 * b));
                let v = [
                    _mm256_castsi256_si128(nib),
                    _mm256_extracti128_si256(nib, 1),
                ]
                .map(|i| {
                    let c = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(i), cents);
                    if FUSED {
                        c
                    } else {
                        _mm512_mul_ps(c, n)
                    }
                });
                for (j, aj) in acc.iter_mut().enumerate() {
                    let wj = *wt.get_unchecked(j0 + j);
                    let wv = _mm512_set1_ps(if FUSED { wj * nf } else { wj });
                    for (x, &vr) in aj.iter_mut().zip(&v) {
                        *x = if FUSED {
                            _mm512_fmadd_ps(wv, vr, *x)
                        } else {
                            _mm512_add_ps(*x, _mm512_mul_ps(wv, vr))
                        };
                    }
                }
            }
            for (j, aj) in acc.iter().enumerate() {
                for (r, x) in aj.iter().enumerate() {
                    _mm512_storeu_ps(o.add((j0 + j) * d + 32 * b + 16 * r), *x);
                }
            }
            return;
        }
        let mut acc = [[_mm256_setzero_ps(); 4]; Q];
        for (j, aj) in acc.iter_mut().enumerate() {
            for (r, x) in aj.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(o.add((j0 + j) * d + 32 * b + 8 * r));
            }
        }
        let look = |i: __m256i, n: __m256| {
            let a = _mm256_permutevar8x32_ps(lo, i);
            let c = _mm256_permutevar8x32_ps(hi, i);
            let m = _mm256_castsi256_ps(_mm256_slli_epi32(i, 28));
            let v = _mm256_blendv_ps(a, c, m);
            if FUSED {
                v
            } else {
                _mm256_mul_ps(v, n)
            }
        };
        for t in t0..t1 {
            let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
            if wt.iter().all(|&x| x == 0.0) {
                continue;
            }
            let row = data.as_ptr().add(t * rb);
            let nf = f16_at(row);
            let n = _mm256_set1_ps(nf);
            let nib = nibbles(row.add(2 + 16 * b));
            let (n0, n1) = (
                _mm256_castsi256_si128(nib),
                _mm256_extracti128_si256(nib, 1),
            );
            let v = [
                look(_mm256_cvtepu8_epi32(n0), n),
                look(_mm256_cvtepu8_epi32(_mm_srli_si128(n0, 8)), n),
                look(_mm256_cvtepu8_epi32(n1), n),
                look(_mm256_cvtepu8_epi32(_mm_srli_si128(n1, 8)), n),
            ];
            for (j, aj) in acc.iter_mut().enumerate() {
                let wj = *wt.get_unchecked(j0 + j);
                let wv = _mm256_set1_ps(if FUSED { wj * nf } else { wj });
                for (x, &vr) in aj.iter_mut().zip(&v) {
                    *x = if FUSED {
                        _mm256_fmadd_ps(wv, vr, *x)
                    } else {
                        _mm256_add_ps(*x, _mm256_mul_ps(wv, vr))
                    };
                }
            }
        }
        for (j, aj) in acc.iter().enumerate() {
            for (r, x) in aj.iter().enumerate() {
                _mm256_storeu_ps(o.add((j0 + j) * d + 32 * b + 8 * r), *x);
            }
        }
    }

    /// The value kernel with 512-bit registers (AVX-512 BW): a block of 32 channels is two
    /// vectors of 16 f32, so a row costs two FMAs per query instead of four; the codes come
    /// from [`codes`] and are widened with one `vpmovsxbd` per 16. Same products, same
    /// order: results equal the AVX2 kernel's bit for bit. int2 stays on the AVX2 kernel in
    /// [`axpy_codes`]; on the timed path ([`axpy_int2_timed`]) it runs here with its offsets
    /// summed per tile (so not bit for bit the AVX2 kernel's sums).
    #[cfg(all(target_feature = "avx512f", target_feature = "avx512bw"))]
    pub(super) mod avx512 {
        use super::*;

        /// [`super::tile`] with two 16-lane accumulators per query.
        #[inline(always)]
        #[allow(clippy::too_many_arguments)] // the tile's coordinates, as in `super::tile`
        pub(super) unsafe fn tile<const Q: usize>(
            f: CodeValues,
            data: &[u8],
            rb: usize,
            (t, n, b): (usize, usize, usize),
            w: *const f32,
            nq: usize,
            j0: usize,
            a: *mut f32,
            d: usize,
            lut: __m256i,
        ) {
            // int2 reaches this tile only from the timed path (`axpy_int2_timed`).
            let deferred = matches!(
                f,
                CodeValues::Int4G32
                    | CodeValues::Int4Row
                    | CodeValues::Int3G32
                    | CodeValues::Int3Row
                    | CodeValues::Int2G32
            );
            let two_scales = f == CodeValues::Nvfp4;
            let mut off = [0f32; Q];
            let mut acc = [[_mm512_setzero_ps(); 2]; Q];
            for (j, aj) in acc.iter_mut().enumerate() {
                for (k, r) in aj.iter_mut().enumerate() {
                    *r = _mm512_loadu_ps(a.add(j * d + 32 * b + 16 * k));
                }
            }
            for r in 0..n {
                let wr = w.add(r * nq + j0);
                if (0..Q).all(|j| *wr.add(j) == 0.0) {
                    continue;
                }
                if b == 0 && j0 == 0 {
                    crate::kv::simd::prefetch_ahead(data, (t + r) * rb, rb);
                }
                let (k, s0, s1, m) = codes(f, data.as_ptr().add((t + r) * rb), b, lut);
                let v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(k)));
                let v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(k, 1)));
                for (j, aj) in acc.iter_mut().enumerate() {
                    let wj = *wr.add(j);
                    let f0 = _mm512_set1_ps(wj * s0);
                    let f1 = if two_scales {
                        _mm512_set1_ps(wj * s1)
                    } else {
                        f0
                    };
                    if deferred {
                        off[j] += wj * m;
                    }
                    aj[0] = _mm512_fmadd_ps(f0, v0, aj[0]);
                    aj[1] = _mm512_fmadd_ps(f1, v1, aj[1]);
                }
            }
            for (j, aj) in acc.iter().enumerate() {
                let o = _mm512_set1_ps(off[j]);
                for (k, r) in aj.iter().enumerate() {
                    let r = if deferred { _mm512_add_ps(*r, o) } else { *r };
                    _mm512_storeu_ps(a.add(j * d + 32 * b + 16 * k), r);
                }
            }
        }

        /// [`super::axpy_codes`] on the 512-bit tile (int2 on the AVX2 one).
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn axpy_codes(
            f: CodeValues,
            data: &[u8],
            rb: usize,
            d: usize,
            t0: usize,
            t1: usize,
            w: &[f32],
            acc: &mut [f32],
        ) {
            if f == CodeValues::Int2G32 {
                return super::axpy_codes(f, data, rb, d, t0, t1, w, acc);
            }
            per_format!(f, g => super::drive::<true>(g, data, rb, d, t0, t1, w, acc))
        }

        /// [`super::super::axpy_codes_timed`]'s int2: the 512-bit tile, offsets deferred.
        pub unsafe fn axpy_int2_timed(
            data: &[u8],
            rb: usize,
            d: usize,
            t0: usize,
            t1: usize,
            w: &[f32],
            acc: &mut [f32],
        ) {
            super::drive::<true>(CodeValues::Int2G32, data, rb, d, t0, t1, w, acc)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QJL sign sums: by hand (d = 32, bits 0 and 31 set, coefficient 2 (weight 0.5 × row factor 4) → +2 there, −2
    /// elsewhere, added to what `acc` held), and on random rows (1–9 queries, some
    /// coefficients 0) the SIMD kernel against the scalar one within the rounding of
    /// `2·Σ c·z − Σ c` (`|err| ≤ 3·γ_{n+1}·Σ_t|c_t|` per element, Higham §3.1).
    #[test]
    fn sign_sums_by_hand_and_against_scalar() {
        let mut acc = vec![1f32; 32];
        axpy_signs(
            &[9, 0x01, 0, 0, 0x80],
            5,
            1,
            32,
            0,
            1,
            &[0.5],
            &[4.0],
            &mut acc,
        );
        for (i, &a) in acc.iter().enumerate() {
            let want = if i == 0 || i == 31 { 3.0 } else { -1.0 };
            assert_eq!(a, want, "element {i}");
        }
        let mut rng = StdRng::seed_from_u64(2406_03482);
        let u = 2f64.powi(-24);
        for (d, nq) in [(32usize, 1usize), (64, 3), (128, 4), (64, 9)] {
            let (n, rb, off) = (29, d / 8 + 6, 4);
            let data: Vec<u8> = (0..n * rb).map(|_| rng.random()).collect();
            let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(-1.0..1.0)).collect();
            w[3 * nq..4 * nq].fill(0.0);
            let f: Vec<f32> = (0..n).map(|_| rng.random_range(0.1..2.0)).collect();
            let c: Vec<f32> = (0..n * nq).map(|i| w[i] * f[i / nq]).collect();
            let start: Vec<f32> = (0..nq * d).map(|_| rng.random_range(-1.0..1.0)).collect();
            let (mut simd, mut scalar) = (start.clone(), start);
            axpy_signs(&data, rb, off, d, 1, n, &w, &f, &mut simd);
            scalar_axpy_signs(&data, rb, off, d, 1, n, &w, &f, &mut scalar);
            let g = n as f64 * u / (1.0 - n as f64 * u);
            for j in 0..nq {
                let mass: f64 = (0..n - 1)
                    .map(|t| (c[t * nq + j] as f64).abs())
                    .sum::<f64>()
                    + 1.0;
                for i in 0..d {
                    let e = (simd[j * d + i] - scalar[j * d + i]).abs() as f64;
                    assert!(e <= 3.0 * g * mass * 2.0, "d={d} nq={nq} {j},{i}: {e}");
                }
            }
        }
    }

    use crate::kv::attention::{fast_and_exact, HeadView};
    use crate::kv::codec::RowCodec;
    use crate::kv::format::{Mxfp4Row, Nvfp4Row};
    use crate::kv::stream::{RowStream, Stream};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Activations: a sum of two uniforms on [−1, 1], with `outliers` channels (the first few
    /// of each row) 8× larger (as K after RoPE).
    fn random_with(rng: &mut StdRng, n: usize, d: usize, outliers: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x: f32 = rng.random_range(-1.0..1.0) + rng.random_range(-1.0..1.0);
                if i % d < outliers {
                    8.0 * x
                } else {
                    x
                }
            })
            .collect()
    }

    fn random(rng: &mut StdRng, n: usize, d: usize) -> Vec<f32> {
        random_with(rng, n, d, 3)
    }

    /// Encodes `n` rows with `c`; returns the bytes and the decoded rows (`[n, d]`).
    fn store<C: RowCodec>(c: C, x: &[f32], d: usize) -> (Vec<u8>, Vec<f32>) {
        let n = x.len() / d;
        let rb = c.row_bytes(d);
        let mut data = vec![0u8; n * rb];
        let mut dec = vec![0f32; n * d];
        for t in 0..n {
            c.encode(&x[t * d..(t + 1) * d], &mut data[t * rb..(t + 1) * rb]);
            c.decode(&data[t * rb..(t + 1) * rb], &mut dec[t * d..(t + 1) * d]);
        }
        (data, dec)
    }

    /// `n` stored rows of `d` elements (`rb` bytes each) and the rows their codec decodes.
    #[derive(Clone, Copy)]
    struct Rows<'a> {
        data: &'a [u8],
        dec: &'a [f32],
        rb: usize,
        d: usize,
        n: usize,
    }

    /// The P·V kernels (the dispatched one, the AVX2 one where compiled, and the scalar one) on
    /// `rows` with weights `w` (`[n, nq]`) against the
    /// f64 sums of the decoded rows: `|err| ≤ γ_{n+k}·Σ_t w_t·(|m_t| + |v_t − m_t|)` (Higham
    /// §3.1, `γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`), `m(t, i)` the element's offset (0 where the
    /// format has none, which leaves `Σ|w·v|`).
    fn assert_matches_decoded(
        f: CodeValues,
        r: Rows<'_>,
        w: &[f32],
        k: usize,
        m: impl Fn(usize, usize) -> f64,
    ) {
        let (d, n) = (r.d, r.n);
        let nq = w.len() / n;
        let mut got = vec![0f32; nq * d];
        axpy_codes(f, r.data, r.rb, d, 0, n, w, &mut got);
        let mut scalar = vec![0f32; nq * d];
        scalar_axpy_codes(f, r.data, r.rb, d, 0, n, w, &mut scalar);
        #[allow(unused_mut)]
        let mut kernels = vec![("dispatched", got), ("scalar", scalar)];
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        {
            let mut v = vec![0f32; nq * d];
            // SAFETY: features compiled in; the slices hold what `axpy_codes` asserts.
            unsafe { avx::axpy_codes(f, r.data, r.rb, d, 0, n, w, &mut v) };
            // The AVX-512 kernel forms the same products in the same order.
            assert_eq!(
                v, kernels[0].1,
                "{f:?}: the AVX2 and dispatched kernels differ"
            );
            kernels.push(("avx2", v));
        }
        let u = 2f64.powi(-24);
        let gamma = (n + k) as f64 * u / (1.0 - (n + k) as f64 * u);
        for j in 0..nq {
            for i in 0..d {
                let (mut exact, mut mass) = (0f64, 0f64);
                for t in 0..n {
                    let (wt, v, m) = (w[t * nq + j] as f64, r.dec[t * d + i] as f64, m(t, i));
                    exact += wt * v;
                    mass += wt * (m.abs() + (v - m).abs());
                }
                let bound = gamma * mass + 1e-30;
                for (name, v) in &kernels {
                    let e = (v[j * d + i] as f64 - exact).abs();
                    assert!(e <= bound, "{f:?} {name} d={d} nq={nq}: {e} > {bound}");
                }
            }
        }
    }

    /// P·V on the codes against f64 sums of the decoded rows, for d 64/128 and nq 1–8 (GQA
    /// groups × new tokens), some weights zero. The bound is f32 rounding of the sum
    /// (Higham, "Accuracy and Stability of Numerical Algorithms" §3.1: a sum of n products
    /// differs from the exact one by at most γ_{n+2}·Σ|w·v|, γ_k = k·u/(1 − k·u), u = 2⁻²⁴),
    /// plus the decoded values' own rounding (one more u).
    #[test]
    fn code_axpy_matches_decoded_rows() {
        let mut rng = StdRng::seed_from_u64(24);
        for d in [64usize, 128] {
            for nq in [1usize, 3, 8] {
                let n = 37;
                let x = random(&mut rng, n * d, d);
                let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
                w[..nq].iter_mut().for_each(|v| *v = 0.0); // row 0 unread
                let cases = [
                    (
                        CodeValues::Nvfp4,
                        store(Nvfp4Row, &x, d),
                        Nvfp4Row.row_bytes(d),
                    ),
                    (
                        CodeValues::Mxfp4,
                        store(Mxfp4Row, &x, d),
                        Mxfp4Row.row_bytes(d),
                    ),
                ];
                for (f, (data, dec), rb) in cases {
                    let rows = Rows {
                        data: &data,
                        dec: &dec,
                        rb,
                        d,
                        n,
                    };
                    assert_matches_decoded(f, rows, &w, 3, |_, _| 0.0);
                }
            }
        }
    }

    /// `int2` (2-bit, groups of 32) P·V on the codes against f64 sums of the decoded rows,
    /// d 32/64/128, nq 1–8, some weights zero; SIMD and scalar kernels both. Bound: each term
    /// is formed as `(w·s)·code + w·m` (three roundings) and added to the running sum (one per
    /// row), and the reference's decoded `m + code·s` carries two, all relative to
    /// `w·(|m| + code·|s|) ≤ w·(|m| + 3|s|)`, not to `|w·v|` (m and code·s may cancel): so
    /// `|err| ≤ γ_{n+5}·Σ_t w_t·(|m_t| + 3|s_t|)` (Higham §3.1, `γ_k = k·u/(1 − k·u)`,
    /// `u = 2⁻²⁴`), with `s`, `m` the element's group parameters as stored (f16); the AVX2
    /// tile rounds its running sum twice per row (`+ w·m`, then the FMA), so the first row's
    /// term sees up to `2n` roundings: checked against `γ_{2n+5}`. The timed path
    /// ([`axpy_codes_timed`]: `(w·s)·code` fused per row, `Σ w·m` per tile of rows added once)
    /// rounds each term fewer times.
    #[test]
    fn int2_code_axpy_matches_decoded_rows() {
        use crate::kv::formats::uniform::UniformGroupRow;
        let mut rng = StdRng::seed_from_u64(2402);
        let c = UniformGroupRow::new(2, 32).unwrap();
        assert_eq!(c.code_values(), Some(CodeValues::Int2G32));
        assert_eq!(UniformGroupRow::new(2, 16).unwrap().code_values(), None);
        for d in [32usize, 64, 128] {
            for nq in [1usize, 3, 8] {
                let n = 41;
                let x = random(&mut rng, n * d, d);
                let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
                w[3 * nq..4 * nq].iter_mut().for_each(|v| *v = 0.0);
                let (data, dec) = store(c, &x, d);
                let rb = c.row_bytes(d);
                let mut got = vec![0f32; nq * d];
                axpy_codes(CodeValues::Int2G32, &data, rb, d, 0, n, &w, &mut got);
                let mut scalar = vec![0f32; nq * d];
                scalar_axpy_codes(CodeValues::Int2G32, &data, rb, d, 0, n, &w, &mut scalar);
                let mut timed = vec![0f32; nq * d];
                axpy_codes_timed(CodeValues::Int2G32, &data, rb, d, 0, n, &w, &mut timed);
                let u = 2f64.powi(-24);
                let gamma = (2 * n + 5) as f64 * u / (1.0 - (2 * n + 5) as f64 * u);
                let f16 = |p: &[u8]| half::f16::from_le_bytes([p[0], p[1]]).to_f32() as f64;
                for j in 0..nq {
                    for i in 0..d {
                        let blk = |t: usize| &data[t * rb + 12 * (i / 32)..];
                        let exact: f64 = (0..n)
                            .map(|t| w[t * nq + j] as f64 * dec[t * d + i] as f64)
                            .sum();
                        let mass: f64 = (0..n)
                            .map(|t| {
                                let p = blk(t);
                                w[t * nq + j] as f64 * (f16(&p[2..]).abs() + 3.0 * f16(p).abs())
                            })
                            .sum();
                        let bound = gamma * mass + 1e-30;
                        for (name, v) in [("simd", &got), ("scalar", &scalar), ("timed", &timed)] {
                            let e = (v[j * d + i] as f64 - exact).abs();
                            assert!(e <= bound, "int2 {name} d={d} nq={nq}: {e} > {bound}");
                        }
                    }
                }
            }
        }
    }

    /// The per-token int8 and 4-bit value formats on the codes (the timed path) against f64
    /// sums of the rows their codec decodes, d 32/64/128, nq 1–8, some weights zero; SIMD
    /// and scalar kernels both. Each term is formed as `(w·s)·code + w·m` (int4's minimum
    /// `m`; 0 for the others) and added to the running sum, the reference's decoded value
    /// carries one rounding: `|err| ≤ γ_{n+5}·Σ_t w_t·(|m_t| + |v_t − m_t|)` (Higham §3.1,
    /// `γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`), `m` read from the stored block by hand.
    #[test]
    fn int_code_axpy_matches_decoded_rows() {
        use crate::kv::format::{Int4GroupRow, Int8TokenRow, Q4_0Row, Q8_0Row};
        let mut rng = StdRng::seed_from_u64(2403);
        for d in [32usize, 64, 128] {
            for nq in [1usize, 2, 3, 4, 8] {
                let n = 43;
                let x = random(&mut rng, n * d, d);
                let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
                w[5 * nq..6 * nq].iter_mut().for_each(|v| *v = 0.0);
                let int4 = Int4GroupRow { group: 32 };
                // int4-row (one group per row), decoded by the uniform codec.
                let int4_row = crate::kv::formats::uniform::UniformGroupRow::new(4, d).unwrap();
                let int3 = crate::kv::formats::uniform::UniformGroupRow::new(3, 32).unwrap();
                let int3_row = crate::kv::formats::uniform::UniformGroupRow::new(3, d).unwrap();
                let cases = [
                    (
                        CodeValues::Int8Token,
                        store(Int8TokenRow, &x, d),
                        Int8TokenRow.row_bytes(d),
                    ),
                    (
                        CodeValues::Q8_0,
                        store(Q8_0Row, &x, d),
                        Q8_0Row.row_bytes(d),
                    ),
                    (
                        CodeValues::Q4_0,
                        store(Q4_0Row, &x, d),
                        Q4_0Row.row_bytes(d),
                    ),
                    (CodeValues::Int4G32, store(int4, &x, d), int4.row_bytes(d)),
                    (
                        CodeValues::Int4Row,
                        store(int4_row, &x, d),
                        int4_row.row_bytes(d),
                    ),
                    (CodeValues::Int3G32, store(int3, &x, d), int3.row_bytes(d)),
                    (
                        CodeValues::Int3Row,
                        store(int3_row, &x, d),
                        int3_row.row_bytes(d),
                    ),
                ];
                assert_eq!(Int8TokenRow.code_values(), Some(CodeValues::Int8Token));
                assert_eq!(Int4GroupRow { group: 16 }.code_values(), None);
                for (f, (data, dec), rb) in cases {
                    assert!(!f.exact(), "{f:?} keeps decoded rows on the exact path");
                    let min = |t: usize, i: usize| match f {
                        CodeValues::Int4G32 => {
                            let p = &data[t * rb + 20 * (i / 32) + 2..];
                            half::f16::from_le_bytes([p[0], p[1]]).to_f32() as f64
                        }
                        CodeValues::Int4Row | CodeValues::Int3Row => {
                            let p = &data[t * rb + 2..];
                            half::f16::from_le_bytes([p[0], p[1]]).to_f32() as f64
                        }
                        CodeValues::Int3G32 => {
                            let p = &data[t * rb + 16 * (i / 32) + 2..];
                            half::f16::from_le_bytes([p[0], p[1]]).to_f32() as f64
                        }
                        _ => 0.0,
                    };
                    let rows = Rows {
                        data: &data,
                        dec: &dec,
                        rb,
                        d,
                        n,
                    };
                    assert_matches_decoded(f, rows, &w, 5, min);
                }
            }
        }
    }

    /// Whole attention, fast path (keys scored on the codes with int8 queries, values
    /// accumulated on the codes) against the exact path (keys decoded to f32), random inputs,
    /// head_dim 64 and 128, GQA groups 1, 3 and 4, prefill and decode. Derived bound: a query
    /// quantized with step sq changes each score by at most E = Σ_i|k_i|·sq/2 / √d (intdot's
    /// bound, scaled); logits moved by at most E move every softmax weight by a factor within
    /// [e^−2E, e^2E], so each output moves by at most (e^2E − 1)·max|v| (plus f32 slack).
    #[test]
    fn fast_attention_matches_exact_within_query_rounding() {
        let mut rng = StdRng::seed_from_u64(4);
        for d in [64usize, 128] {
            for (group, n_q) in [(1usize, 1usize), (3, 1), (4, 5)] {
                for fmt in [
                    "nvfp4",
                    "mxfp4",
                    "int8-token",
                    "q8_0",
                    "q4_0",
                    "int4",
                    "int4-row",
                    "int4:group=64",
                    "int2",
                    "int3",
                    "int3:group=row",
                    "int3:group=64",
                ] {
                    let n = 45;
                    // Keys with outlier channels; queries and values without (a query
                    // outlier would set sq, and so the bound, by itself).
                    let k = random(&mut rng, n * d, d);
                    let v = random_with(&mut rng, n * d, d, 0);
                    let q = random_with(&mut rng, group * n_q * d, d, 0);
                    fn pair<C: RowCodec + std::fmt::Debug>(
                        c: C,
                        d: usize,
                    ) -> (Box<dyn Stream>, Box<dyn Stream>) {
                        (
                            Box::new(RowStream::new(c, d)),
                            Box::new(RowStream::new(c, d)),
                        )
                    }
                    use crate::kv::format::{Int4GroupRow, Int8TokenRow, Q4_0Row, Q8_0Row};
                    use crate::kv::formats::uniform::UniformGroupRow;
                    let (mut ks, mut vs) = match fmt {
                        "nvfp4" => pair(Nvfp4Row, d),
                        "mxfp4" => pair(Mxfp4Row, d),
                        "int8-token" => pair(Int8TokenRow, d),
                        "q8_0" => pair(Q8_0Row, d),
                        "q4_0" => pair(Q4_0Row, d),
                        // One group per row; at d = 128 two groups of 64 per row (the
                        // f32 path: the integer kernels read one group a row).
                        "int4-row" => pair(UniformGroupRow::new(4, d).unwrap(), d),
                        "int4:group=64" => pair(Int4GroupRow { group: 64 }, d),
                        "int2" => pair(UniformGroupRow::new(2, 32).unwrap(), d),
                        // int3: groups of 32, one group per row, and two groups of 64 per row
                        // at d = 128 (the f32 path, as int4:group=64).
                        "int3" => pair(UniformGroupRow::new(3, 32).unwrap(), d),
                        "int3:group=row" => pair(UniformGroupRow::new(3, d).unwrap(), d),
                        "int3:group=64" => pair(UniformGroupRow::new(3, 64).unwrap(), d),
                        _ => pair(Int4GroupRow { group: 32 }, d),
                    };
                    ks.push(&k);
                    vs.push(&v);
                    let head = HeadView { k: &*ks, v: &*vs };
                    let (fast, exact) = fast_and_exact(head, &q, group, n_q, d);
                    let mut kd = vec![0f32; d];
                    let (mut ksum, mut vmax) = (0f64, 0f64);
                    let mut row = vec![0f32; d];
                    for t in 0..n {
                        ks.decode(t, &mut kd);
                        ksum = ksum.max(kd.iter().map(|&a| a.abs() as f64).sum());
                        vs.decode(t, &mut row);
                        vmax = row.iter().fold(vmax, |m, &a| m.max(a.abs() as f64));
                    }
                    for (r, qr) in q.chunks_exact(d).enumerate() {
                        let sq = qr.iter().fold(0f32, |m, a| m.max(a.abs())) as f64 / 127.0;
                        let e = ksum * sq / 2.0 / (d as f64).sqrt();
                        let bound = ((2.0 * e).exp() - 1.0) * vmax + 1e-4 * vmax;
                        for i in 0..d {
                            let diff = (fast[r * d + i] - exact[r * d + i]).abs() as f64;
                            assert!(
                                diff <= bound,
                                "{fmt} d={d} group={group} n_q={n_q} row {r}: {diff} > {bound}"
                            );
                        }
                    }
                }
            }
        }
    }
}
