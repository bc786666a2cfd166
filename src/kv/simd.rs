//! The two inner loops of attention over decoded rows, with AVX2/FMA kernels where the build
//! targets them (`.cargo/config.toml` builds for the native CPU) and portable fallbacks.
//!
//! - [`dot_many`]: `out[j] = q_j · row` for several queries at once, so one decoded key row is
//!   loaded once per 8 lanes for all queries of a GQA group.
//! - [`axpy_many`]: `acc_j += w_j · row` for several queries.
//! - [`dot`]: one f32 dot product in portable code the compiler vectorizes (TurboQuant's keys,
//!   scored in the rotated basis).

use crate::util::simd::simd_dispatch;

/// Little-endian IEEE binary16 values (`src`: `2·dst.len()` bytes) to f32, with F16C where
/// the build targets it.
#[inline(always)]
pub fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    assert!(src.len() >= 2 * dst.len());
    simd_dispatch!(
        ["f16c", "avx2"],
        unsafe {
            use std::arch::x86_64::*;
            let n = dst.len() - dst.len() % 8;
            let mut i = 0;
            while i < n {
                let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
                i += 8;
            }
            for i in n..dst.len() {
                dst[i] = half::f16::from_le_bytes([src[2 * i], src[2 * i + 1]]).to_f32();
            }
        },
        for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
    )
}

/// Bytes ahead of the row being read that [`prefetch_ahead`] asks for: 2 KiB, about 16 fp16
/// rows of 64 elements, far enough to cover a DRAM miss (~100 ns) at a few ns per row.
pub const PREFETCH_AHEAD: usize = 2048;

/// Software prefetch of the `len` bytes that start [`PREFETCH_AHEAD`] bytes after `at` in
/// `data` (into L1, `_MM_HINT_T0`); nothing past `data`'s end. The hardware's stride
/// prefetcher stops at every 4 KiB page, which a cache stream of one (sequence, kv head)
/// crosses every 32 fp16 rows; a software prefetch crosses it. No effect on any result.
#[inline(always)]
pub fn prefetch_ahead(data: &[u8], at: usize, len: usize) {
    prefetch_range(data, at + PREFETCH_AHEAD, len);
}

/// Software prefetch of `data[from..from + len]` (into L1, `_MM_HINT_T0`), one request per
/// 64-byte line; nothing past `data`'s end. No effect on any result.
#[inline(always)]
pub fn prefetch_range(data: &[u8], from: usize, len: usize) {
    let to = from.saturating_add(len).min(data.len());
    simd_dispatch!(["sse"], {
        let mut o = from;
        while o < to {
            // SAFETY: `o < data.len()`; a prefetch only hints the cache and cannot fault.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    data.as_ptr().add(o) as *const i8,
                )
            };
            o += 64;
        }
    });
    let _ = to;
}

/// `dst[i] = (src[i] as i8) · scale`.
#[inline(always)]
pub fn i8_to_f32(src: &[u8], scale: f32, dst: &mut [f32]) {
    assert!(src.len() >= dst.len());
    // Elements the vector loop converted: whole groups of 8 with AVX2, none without.
    let done = simd_dispatch!(
        ["avx2", "fma"],
        unsafe {
            use std::arch::x86_64::*;
            let s = _mm256_set1_ps(scale);
            let mut i = 0;
            while i + 8 <= dst.len() {
                let b = _mm_loadl_epi64(src.as_ptr().add(i) as *const __m128i);
                let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_mul_ps(x, s));
                i += 8;
            }
            i
        },
        0
    );
    for k in done..dst.len() {
        dst[k] = (src[k] as i8) as f32 * scale;
    }
}

/// 4-bit codes, element `2j` in the low and `2j+1` in the high nibble of byte `j`:
/// `dst[i] = m + q_i · d`.
#[inline(always)]
pub fn u4_pairs_to_f32(src: &[u8], d: f32, m: f32, dst: &mut [f32]) {
    assert!(2 * src.len() >= dst.len());
    let mut i = 0;
    simd_dispatch!(["avx2", "fma"], unsafe {
        use std::arch::x86_64::*;
        let (dv, mv, mask) = (_mm256_set1_ps(d), _mm256_set1_ps(m), _mm_set1_epi16(0x0f));
        while i + 16 <= dst.len() {
            let b = _mm_cvtepu8_epi16(_mm_loadl_epi64(src.as_ptr().add(i / 2) as *const __m128i));
            let (lo, hi) = (_mm_and_si128(b, mask), _mm_srli_epi16(b, 4));
            let (p0, p1) = (_mm_unpacklo_epi16(lo, hi), _mm_unpackhi_epi16(lo, hi));
            for (k, p) in [p0, p1].into_iter().enumerate() {
                let x = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(p));
                _mm256_storeu_ps(dst.as_mut_ptr().add(i + 8 * k), _mm256_fmadd_ps(x, dv, mv));
            }
            i += 16;
        }
    });
    while i < dst.len() {
        let b = src[i / 2];
        dst[i] = m + (b & 0x0f) as f32 * d;
        if i + 1 < dst.len() {
            dst[i + 1] = m + (b >> 4) as f32 * d;
        }
        i += 2;
    }
}

/// ggml Q4_0 block body: 16 bytes, element `j` low nibble and `j + 16` high nibble of byte `j`:
/// `dst[i] = (q_i − 8) · d` for 32 values.
#[inline(always)]
pub fn q4_0_to_f32(src: &[u8], d: f32, dst: &mut [f32]) {
    assert!(src.len() >= 16 && dst.len() >= 32);
    simd_dispatch!(
        ["avx2", "fma"],
        unsafe {
            use std::arch::x86_64::*;
            let dv = _mm256_set1_ps(d);
            let eight = _mm256_set1_epi32(8);
            for h in 0..2 {
                let b = _mm_loadl_epi64(src.as_ptr().add(8 * h) as *const __m128i);
                let w = _mm256_cvtepu8_epi32(b);
                let lo = _mm256_sub_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x0f)), eight);
                let hi = _mm256_sub_epi32(_mm256_srli_epi32(w, 4), eight);
                _mm256_storeu_ps(
                    dst.as_mut_ptr().add(8 * h),
                    _mm256_mul_ps(_mm256_cvtepi32_ps(lo), dv),
                );
                _mm256_storeu_ps(
                    dst.as_mut_ptr().add(16 + 8 * h),
                    _mm256_mul_ps(_mm256_cvtepi32_ps(hi), dv),
                );
            }
        },
        for j in 0..16 {
            dst[j] = ((src[j] & 0x0f) as i32 - 8) as f32 * d;
            dst[j + 16] = ((src[j] >> 4) as i32 - 8) as f32 * d;
        }
    )
}

/// FP8 codes to f32 times `scale`, by widening to IEEE binary16 bits and F16C: E5M2 is the top
/// byte of an f16; E4M3 (bias 7, no infinities) becomes f16 bits `sign | (byte & 0x7f) << 7`,
/// which reads as the same value divided by 2⁸ (normals and subnormals alike), so the scale is
/// multiplied by 256. Codes 0x7f and 0xff (E4M3 NaN) are never stored: encoding saturates.
#[inline(always)]
pub fn fp8_to_f32(src: &[u8], e4m3: bool, scale: f32, dst: &mut [f32]) {
    assert!(src.len() >= dst.len());
    // Elements the vector loop converted: whole groups of 8 with AVX2, FMA and F16C, none
    // without.
    let done = simd_dispatch!(
        ["avx2", "fma", "f16c"],
        unsafe {
            use std::arch::x86_64::*;
            let s = _mm256_set1_ps(if e4m3 { scale * 256.0 } else { scale });
            let mut i = 0;
            while i + 8 <= dst.len() {
                let b = _mm_loadl_epi64(src.as_ptr().add(i) as *const __m128i);
                let h = if e4m3 {
                    avx::fp8_half::<true>(b)
                } else {
                    avx::fp8_half::<false>(b)
                };
                _mm256_storeu_ps(
                    dst.as_mut_ptr().add(i),
                    _mm256_mul_ps(_mm256_cvtph_ps(h), s),
                );
                i += 8;
            }
            i
        },
        0
    );
    for k in done..dst.len() {
        let b = src[k] as u16;
        let bits = if e4m3 {
            ((b & 0x80) << 8) | ((b & 0x7f) << 7)
        } else {
            b << 8
        };
        let f = half::f16::from_bits(bits).to_f32();
        dst[k] = f * if e4m3 { scale * 256.0 } else { scale };
    }
}

/// `max_i |x_i|` (0 for an empty slice) with eight running maxima, so the compiler emits packed
/// max instructions (one chain of dependent `max` cost ~4 cycles an element). Exact: the
/// maximum does not depend on the order (no NaN is ever passed: queries are finite).
#[inline]
pub fn absmax(x: &[f32]) -> f32 {
    let mut m = [0f32; 8];
    let c = x.chunks_exact(8);
    let r = c.remainder();
    for v in c {
        for k in 0..8 {
            m[k] = m[k].max(v[k].abs());
        }
    }
    r.iter()
        .fold(m.iter().fold(0f32, |a, &b| a.max(b)), |a, v| a.max(v.abs()))
}

/// f32 dot product with eight independent accumulators, so the compiler emits packed FMAs.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] = x[k].mul_add(y[k], acc[k]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `out[j] = Σ_c qs[j·d + c] · row[c]`, `d = row.len()`, for `j < out.len()`.
#[inline(always)]
pub fn dot_many(row: &[f32], qs: &[f32], out: &mut [f32]) {
    assert!(qs.len() >= out.len() * row.len());
    simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: the target features are enabled at compile time; bounds asserted above.
        unsafe { avx::dot_many(row, qs, out) },
        {
            let d = row.len();
            for (j, o) in out.iter_mut().enumerate() {
                *o = qs[j * d..(j + 1) * d]
                    .iter()
                    .zip(row)
                    .map(|(a, b)| a * b)
                    .sum();
            }
        }
    )
}

/// `acc[j·d + c] += w[j] · row[c]` for every `j` with `w[j] ≠ 0`, `d = row.len()`.
#[inline(always)]
pub fn axpy_many(w: &[f32], row: &[f32], acc: &mut [f32]) {
    assert!(acc.len() >= w.len() * row.len());
    simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: as above.
        unsafe { avx::axpy_many(w, row, acc) },
        {
            let d = row.len();
            for (j, &a) in w.iter().enumerate() {
                if a != 0.0 {
                    for (y, &x) in acc[j * d..(j + 1) * d].iter_mut().zip(row) {
                        *y = a.mul_add(x, *y);
                    }
                }
            }
        }
    )
}

/// `out[i] += Σ_k cols[k·d + i]·v[k]` for `d = out.len()`, `cols` `[v.len(), d]` (the columns
/// of a `[d, v.len()]` matrix, one after another: a matrix–vector product over the transpose).
/// Each product is rounded, then added to `out[i]` in k order, with no fused multiply-add:
/// every entry is the plain sequential sum `(((out[i] + p₀) + p₁) + …)` to the bit (start
/// from −0.0 for `Iterator::sum`'s). With AVX2, 64
/// entries at a time advance together in eight vector accumulators held in registers over all
/// k (the same operations per lane), instead of one chain of dependent scalar additions per
/// entry; entries past the last multiple of 64 run the scalar loop. Panics (a caller's bug)
/// when `cols` holds fewer than `v.len()·d` values.
pub fn cols_matvec(cols: &[f32], v: &[f32], out: &mut [f32]) {
    let d = out.len();
    assert!(
        cols.len() >= v.len() * d,
        "{} values hold no [{}, {d}]",
        cols.len(),
        v.len()
    );
    let done = simd_dispatch!(
        ["avx2"],
        // SAFETY: AVX2 enabled at compile time; reads inside `cols` (asserted above) and `v`,
        // writes inside `out`.
        unsafe { avx::cols_matvec64(cols, v, out) },
        0
    );
    for (i, o) in out.iter_mut().enumerate().skip(done) {
        for (k, &vk) in v.iter().enumerate() {
            *o += cols[k * d + i] * vk;
        }
    }
}

/// Whether the fused row kernels ([`row_dots`], [`row_axpy`]) run 16 lanes wide: where the
/// build has the AVX-512 primitives ([`avx512`]). Same products, same order per lane, so the
/// same results to the bit as the AVX2 kernels (tests assert it), in half the FMAs and
/// widenings: fp16 attention 5–7 % faster (`attn-bench`, default shapes, 1,024 and 8,192
/// tokens, Intel Xeon VM, three interleaved pairs). The f32 tile kernels stay 8 lanes wide
/// ([`avx::tile_dots`] says why).
const WIDE: bool = cfg!(all(
    target_arch = "x86_64",
    target_feature = "avx512f",
    target_feature = "avx512bw",
    target_feature = "avx512vnni"
));

/// Dots of a decoded tile of rows with several queries: `out[r·nq + j] = tile_r · q_j` for
/// `tile`: `[rows, d]`, `qs`: `[nq, d]`, `out`: `[rows, nq]`. Eight rows share each query load
/// and are reduced together, so no per-row horizontal sum is paid.
#[inline(always)]
pub fn tile_dots(tile: &[f32], qs: &[f32], d: usize, out: &mut [f32]) {
    let rows = tile.len() / d;
    let nq = qs.len() / d;
    assert!(out.len() >= rows * nq && tile.len() == rows * d);
    simd_dispatch!(
        ["avx2", "fma"],
        if d.is_multiple_of(8) {
            // SAFETY: target features enabled at compile time; shapes asserted above.
            unsafe { avx::tile_dots(tile, qs, d, out) };
            return;
        }
    );
    for r in 0..rows {
        dot_many(
            &tile[r * d..(r + 1) * d],
            qs,
            &mut out[r * nq..(r + 1) * nq],
        );
    }
}

/// `acc_j += Σ_r w[r·nq + j] · tile_r` for `tile`: `[rows, d]`, `w`: `[rows, nq]`, `acc`:
/// `[nq, d]`; accumulators stay in registers across the tile's rows.
#[inline(always)]
pub fn tile_axpy(w: &[f32], tile: &[f32], d: usize, acc: &mut [f32]) {
    let rows = tile.len() / d;
    let nq = acc.len() / d;
    assert!(w.len() >= rows * nq && tile.len() == rows * d);
    simd_dispatch!(
        ["avx2", "fma"],
        if d.is_multiple_of(8) {
            // SAFETY: as above.
            unsafe { avx::tile_axpy(w, tile, d, acc) };
            return;
        }
    );
    for r in 0..rows {
        axpy_many(&w[r * nq..(r + 1) * nq], &tile[r * d..(r + 1) * d], acc);
    }
}

/// Rows per tile of the decode path (`kv::stream`, rows decoded to f32 and used at once) and
/// per step of the fused row kernels (prefetched together; [`row_axpy`] skips a step whose
/// weights are all zero): one constant, so both group rows alike and give the same result to
/// the bit.
pub const TILE_ROWS: usize = 32;
const ROW_STEP: usize = TILE_ROWS;

/// How the fused row kernels ([`row_dots`], [`row_axpy`]) read a stored row: widened to f32 in
/// registers, never through a decoded tile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Widen {
    /// `d` little-endian IEEE binary16 values (`fp16`).
    F16,
    /// `d` FP8 codes (OCP FP8: E4M3 where `e4m3`, else E5M2) times a scale: `None`, a
    /// little-endian f16 scale in the row's first two bytes before the codes (per token);
    /// `Some(s)`, one scale for every row (per head or per tensor). Widened as [`fp8_to_f32`].
    Fp8 {
        /// E4M3 (else E5M2).
        e4m3: bool,
        /// The external scale, or `None` for a per-token f16 scale stored in the row.
        scale: Option<f32>,
    },
}

impl Widen {
    /// Bytes a row of `d` elements needs at least.
    pub fn row_bytes(self, d: usize) -> usize {
        match self {
            Widen::F16 => 2 * d,
            Widen::Fp8 { scale: None, .. } => d + 2,
            Widen::Fp8 { .. } => d,
        }
    }

    /// Decodes one stored row into `out` (`d` f32): the values the fused kernels use. Panics
    /// (a caller's bug) when `row` is shorter than [`row_bytes`](Self::row_bytes)`(d)`.
    #[inline(always)]
    pub fn decode(self, row: &[u8], out: &mut [f32]) {
        match self {
            Widen::F16 => f16_to_f32(row, out),
            Widen::Fp8 { e4m3, scale: None } => {
                let s = half::f16::from_le_bytes([row[0], row[1]]).to_f32();
                fp8_to_f32(&row[2..], e4m3, s, out)
            }
            Widen::Fp8 {
                e4m3,
                scale: Some(s),
            } => fp8_to_f32(row, e4m3, s, out),
        }
    }
}

/// `out[(t − t0)·nq + j] = q_j · row_t` for the rows `t0..t1` of `data` (rows of `rb` bytes in
/// the layout `kind` names; `qs`: `[nq, d]` f32) widened in registers (F16C): the products and
/// order of [`Widen::decode`] into a tile then [`tile_dots`], so the same result to the bit,
/// without the tile's stores and loads. Returns `false`, writing nothing, where the build has
/// no AVX2/FMA/F16C or `d` is not a multiple of 8.
pub fn row_dots(
    kind: Widen,
    data: &[u8],
    rb: usize,
    (t0, t1): (usize, usize),
    qs: &[f32],
    d: usize,
    out: &mut [f32],
) -> bool {
    let nq = qs.len() / d.max(1);
    assert!(data.len() >= t1 * rb && rb >= kind.row_bytes(d) && out.len() >= (t1 - t0) * nq);
    simd_dispatch!(
        ["avx2", "fma", "f16c"],
        if d.is_multiple_of(8) {
            let mut t = t0;
            while t < t1 {
                let n = (t1 - t).min(ROW_STEP);
                for r in t..t + n {
                    prefetch_ahead(data, r * rb, rb);
                }
                let full = n - n % 4;
                let o = &mut out[(t - t0) * nq..(t - t0 + n) * nq];
                // SAFETY: features enabled at compile time; rows t..t + full lie in `data`
                // and their outputs in `o` (asserted above).
                unsafe { avx::row_dots::<WIDE>(kind, data, rb, t, full, qs, d, o.as_mut_ptr()) };
                let mut row = vec![0f32; if full < n { d } else { 0 }];
                for r in full..n {
                    kind.decode(&data[(t + r) * rb..], &mut row);
                    dot_many(&row, qs, &mut o[r * nq..(r + 1) * nq]);
                }
                t += n;
            }
            return true;
        }
    );
    let _ = (t0, t1, qs, out);
    false
}

/// `acc_j += Σ_t w[(t − t0)·nq + j] · row_t` for the rows `t0..t1` of `data` (as in
/// [`row_dots`]; `acc`: `[nq, d]`), widened in registers: the same result to the bit as
/// [`Widen::decode`] into a tile then [`tile_axpy`]; steps of [`ROW_STEP`] rows whose weights
/// are all zero are not read. Returns `false`, changing nothing, where the build has no
/// AVX2/FMA/F16C or `d` is not a multiple of 32.
pub fn row_axpy(
    kind: Widen,
    data: &[u8],
    rb: usize,
    (t0, t1): (usize, usize),
    w: &[f32],
    d: usize,
    acc: &mut [f32],
) -> bool {
    let nq = acc.len() / d.max(1);
    assert!(data.len() >= t1 * rb && rb >= kind.row_bytes(d) && w.len() >= (t1 - t0) * nq);
    simd_dispatch!(
        ["avx2", "fma", "f16c"],
        if d.is_multiple_of(32) {
            let mut t = t0;
            while t < t1 {
                let n = (t1 - t).min(ROW_STEP);
                let wt = &w[(t - t0) * nq..(t - t0 + n) * nq];
                if wt.iter().any(|&x| x != 0.0) {
                    for r in t..t + n {
                        prefetch_ahead(data, r * rb, rb);
                    }
                    // SAFETY: features enabled at compile time; rows t..t + n lie in `data`,
                    // their weights in `wt` (asserted above).
                    unsafe { avx::row_axpy::<WIDE>(kind, data, rb, (t, n), wt.as_ptr(), d, acc) };
                }
                t += n;
            }
            return true;
        }
    );
    let _ = (t0, t1, w, acc);
    false
}

/// `e^x` for f32, accurate to about 2 ulp where the result is a normal float; `x < −87.33`
/// (including −∞: the causal mask) gives 0 and `x > 88` gives `e^88` (softmax only ever asks
/// for `x ≤ 0`). Range reduction
/// `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, with `ln 2` split in two constants (Cody–Waite), and a
/// degree-6 polynomial for `e^r` (the Cephes `expf` coefficients, Moshier 1992), scaled by `2^n`
/// through the exponent bits. The scalar fallback is `f32::exp`.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    simd_dispatch!(
        ["avx2", "fma"],
        unsafe {
            use std::arch::x86_64::*;
            let mut o = [0f32; 8];
            _mm256_storeu_ps(o.as_mut_ptr(), avx::exp8(_mm256_set1_ps(x)));
            o[0]
        },
        x.exp()
    )
}

/// Softmax pieces of one attention partial over `rows` slots × `nq` queries, slot-major
/// (`w[t·nq + j]`): returns the per-query maximum of `w` (−∞ for a query whose every slot is
/// −∞, i.e. masked). Eight lanes at a time: `8·nq` values are a whole number of slot rows, so
/// lane `l` of vector `v` in every such chunk belongs to query `(8v + l) mod nq`.
pub fn max_per_query(w: &[f32], nq: usize, max: &mut [f32]) {
    assert!(max.len() == nq && w.len().is_multiple_of(nq));
    max.iter_mut().for_each(|m| *m = f32::NEG_INFINITY);
    simd_dispatch!(["avx2", "fma"], {
        let chunk = 8 * nq;
        let body = w.len() - w.len() % chunk;
        if nq <= 8 && body > 0 {
            // SAFETY: features enabled at compile time; every load is inside `w[..body]`.
            unsafe {
                use std::arch::x86_64::*;
                let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); 8];
                let p = w.as_ptr();
                let mut i = 0;
                while i < body {
                    for (v, a) in acc.iter_mut().enumerate().take(nq) {
                        *a = _mm256_max_ps(*a, _mm256_loadu_ps(p.add(i + 8 * v)));
                    }
                    i += chunk;
                }
                avx::fold_lanes(&acc[..nq], nq, |j, x| max[j] = max[j].max(x));
            }
            for (k, &x) in w[body..].iter().enumerate() {
                max[k % nq] = max[k % nq].max(x);
            }
            return;
        }
    });
    // Many queries (a prefill block): each slot row is `nq` values, vectorized along the row.
    for row in w.chunks_exact(nq) {
        for (m, &x) in max.iter_mut().zip(row) {
            *m = m.max(x);
        }
    }
}

/// `w[t·nq + j] ← e^(w[t·nq + j] − max[j])` in place and `sum[j] += Σ_t` of the new values;
/// a query whose max is −∞ (fully masked) gets zeros. Vectorized as [`max_per_query`].
pub fn exp_sub_sum(w: &mut [f32], nq: usize, max: &[f32], sum: &mut [f32]) {
    assert!(max.len() == nq && sum.len() == nq && w.len().is_multiple_of(nq));
    // A fully masked query subtracts 0 from −∞ scores: e^−∞ = 0, never NaN.
    let m: Vec<f32> = max
        .iter()
        .map(|&m| if m == f32::NEG_INFINITY { 0.0 } else { m })
        .collect();
    simd_dispatch!(["avx2", "fma"], {
        let chunk = 8 * nq;
        let body = w.len() - w.len() % chunk;
        if nq <= 8 && body > 0 {
            // SAFETY: as in `max_per_query`.
            unsafe {
                use std::arch::x86_64::*;
                let mut pattern = [0f32; 64];
                for (k, x) in pattern[..chunk].iter_mut().enumerate() {
                    *x = m[k % nq];
                }
                let mut mv = [_mm256_setzero_ps(); 8];
                let mut acc = [_mm256_setzero_ps(); 8];
                for (v, x) in mv.iter_mut().enumerate().take(nq) {
                    *x = _mm256_loadu_ps(pattern.as_ptr().add(8 * v));
                }
                let p = w.as_mut_ptr();
                let mut i = 0;
                while i < body {
                    for (v, (a, m)) in acc.iter_mut().zip(&mv).enumerate().take(nq) {
                        let x = _mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8 * v)), *m);
                        let e = avx::exp8(x);
                        _mm256_storeu_ps(p.add(i + 8 * v), e);
                        *a = _mm256_add_ps(*a, e);
                    }
                    i += chunk;
                }
                avx::fold_lanes(&acc[..nq], nq, |j, x| sum[j] += x);
            }
            for (k, x) in w[body..].iter_mut().enumerate() {
                *x = exp_f32(*x - m[k % nq]);
                sum[k % nq] += *x;
            }
            return;
        }
    });
    // Many queries (a prefill block): vectorized along each slot row of `nq` values.
    for row in w.chunks_exact_mut(nq) {
        // The vector loop's reach: every whole 8 lanes with AVX2, none without.
        let body = simd_dispatch!(
            ["avx2", "fma"],
            {
                let body = nq - nq % 8;
                // SAFETY: features enabled at compile time; loads and stores inside `row`, `m`,
                // `sum`.
                unsafe {
                    use std::arch::x86_64::*;
                    let mut j = 0;
                    while j < body {
                        let x = _mm256_sub_ps(
                            _mm256_loadu_ps(row.as_ptr().add(j)),
                            _mm256_loadu_ps(m.as_ptr().add(j)),
                        );
                        let e = avx::exp8(x);
                        _mm256_storeu_ps(row.as_mut_ptr().add(j), e);
                        let s = _mm256_add_ps(_mm256_loadu_ps(sum.as_ptr().add(j)), e);
                        _mm256_storeu_ps(sum.as_mut_ptr().add(j), s);
                        j += 8;
                    }
                }
                body
            },
            0
        );
        for j in body..nq {
            row[j] = exp_f32(row[j] - m[j]);
            sum[j] += row[j];
        }
    }
}

/// Symmetric int8 quantization of one row with one step (llama.cpp's Q8_0 rule, per row or
/// block: `step = max|x|/127`, `out[i] = round_ties_even(x[i]/step)` by [`quantize_i8`]);
/// returns `step` (0 for an all-zero row, whose codes are 0). `x` must be finite. Panics when
/// `out` is shorter than `x`.
#[inline(always)]
pub fn quantize_absmax_i8(x: &[f32], out: &mut [i8]) -> f32 {
    let step = absmax(x) / 127.0;
    quantize_i8(x, if step > 0.0 { 1.0 / step } else { 0.0 }, out);
    step
}

/// `out[i] = round_ties_even(x[i] · inv)` as i8, the quantization step of every int8 query
/// (`inv = 127 / max|x|`, so `|x[i]·inv| ≤ 127` and nothing saturates): with AVX2, 32 values
/// per iteration by `vcvtps2dq` (round to nearest even under the default MXCSR, as
/// [`f32::round_ties_even`]) and two saturating packs, the same codes as the scalar loop to the
/// bit. `x` must be finite (a NaN or ±∞ element gives 0 or ±127 in the scalar loop, −128 in
/// the vector one); an infinite `inv` runs the scalar loop.
/// Panics when `out` is shorter than `x`.
#[inline(always)]
pub fn quantize_i8(x: &[f32], inv: f32, out: &mut [i8]) {
    assert!(
        out.len() >= x.len(),
        "quantize_i8: output shorter than input"
    );
    // Elements the vector loop quantized: whole groups of 32 with AVX2, none without (nor for
    // an infinite `inv`, a step that underflowed, where `vcvtps2dq` would give −128 for every
    // element and the scalar loop saturates as `as i8` does).
    let vector = inv.is_finite();
    let done = simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: AVX2 enabled at compile time; every load reads x[i..i + 32] and every store
        // writes out[i..i + 32] with i + 32 ≤ x.len() ≤ out.len().
        unsafe {
            use std::arch::x86_64::*;
            let s = _mm256_set1_ps(inv);
            // packs interleave the 128-bit lanes; this puts the 32-bit groups back in order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let mut i = 0;
            while vector && i + 32 <= x.len() {
                let p = x.as_ptr().add(i);
                let q =
                    |k: usize| _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), s));
                let ab = _mm256_packs_epi32(q(0), q(1));
                let cd = _mm256_packs_epi32(q(2), q(3));
                let v = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
                _mm256_storeu_si256(out.as_mut_ptr().add(i) as *mut __m256i, v);
                i += 32;
            }
            i
        },
        {
            let _ = vector;
            0
        }
    );
    for (o, &v) in out[done..x.len()].iter_mut().zip(&x[done..]) {
        *o = (v * inv).round_ties_even() as i8;
    }
}

/// `x ← a · x`.
#[inline(always)]
pub fn scale_in_place(x: &mut [f32], a: f32) {
    for v in x.iter_mut() {
        *v *= a;
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
pub(crate) mod avx {
    //! AVX2 primitives shared by attention ([`super`], [`super::super::intdot`]) and the
    //! decode matmul (`crate::model::qmatmul`).
    use crate::util::simd::query_groups;
    use std::arch::x86_64::*;

    /// Little-endian f16 at `p` to f32 (F16C).
    #[inline(always)]
    pub unsafe fn f16_at(p: *const u8) -> f32 {
        half::f16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32()
    }

    /// 32 unsigned × signed byte products, adjacent pairs summed (i16, no overflow for
    /// `|u·s| ≤ 2·127·127`), then pairs of those summed to 8 i32 lanes (`maddubs`, `madd`).
    #[inline(always)]
    pub unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
        // AVX-VNNI does both steps in one instruction (`vpdpbusd`), without the i16
        // saturation, which the operands here (|u·s| ≤ 2·127·127 per pair) never reach.
        #[cfg(target_feature = "avxvnni")]
        {
            _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
        }
        #[cfg(not(target_feature = "avxvnni"))]
        {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
        }
    }

    /// 16 bytes of nibbles at `p` → 32 bytes: the low nibbles, then the high nibbles.
    #[inline(always)]
    pub unsafe fn nibbles(p: *const u8) -> __m256i {
        let b = _mm_loadu_si128(p as *const __m128i);
        let m = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m))
    }

    /// 8 bytes of 2-bit codes at `p` (an `int2` group of 32: element `4j + i` at bits
    /// `2i..2i+2` of byte `j`) → 32 bytes in element order: each shift of the bytes by 2i
    /// masked to its low two bits, then the four interleaved back (bytes, then pairs).
    #[inline(always)]
    pub unsafe fn crumbs(p: *const u8) -> __m256i {
        let v = _mm_loadl_epi64(p as *const __m128i);
        let m = _mm_set1_epi8(3);
        let a0 = _mm_and_si128(v, m);
        let a1 = _mm_and_si128(_mm_srli_epi16(v, 2), m);
        let a2 = _mm_and_si128(_mm_srli_epi16(v, 4), m);
        let a3 = _mm_and_si128(_mm_srli_epi16(v, 6), m);
        let (e01, e23) = (_mm_unpacklo_epi8(a0, a1), _mm_unpacklo_epi8(a2, a3));
        _mm256_set_m128i(_mm_unpackhi_epi16(e01, e23), _mm_unpacklo_epi16(e01, e23))
    }

    /// 12 bytes of 3-bit codes at `p` (an `int3` group of 32: element `e` at bits `3e..3e+3`,
    /// LSB first) → 32 bytes in element order. The 12 bytes are read exactly (8, then 4) into
    /// both 128-bit lanes; a byte shuffle puts each code's two bytes in a 16-bit lane (codes
    /// 0–15 in one register, 16–31 in another), a multiply by `2^(8 − 3e mod 8)` lifts its three
    /// bits to bits 8..11, a shift and a mask keep them, and a pack and a lane permute bring the
    /// 32 codes back to bytes in order.
    #[inline(always)]
    pub unsafe fn triplets(p: *const u8) -> __m256i {
        let x = _mm_insert_epi32(
            _mm_loadl_epi64(p as *const __m128i),
            (p.add(8) as *const i32).read_unaligned(),
            2,
        );
        let v = _mm256_set_m128i(x, x);
        let seven = _mm256_set1_epi16(7);
        let half = |shuffle: &[i8; 32], mult: &[i16; 16]| {
            let w = _mm256_shuffle_epi8(v, _mm256_loadu_si256(shuffle.as_ptr() as *const __m256i));
            let w = _mm256_mullo_epi16(w, _mm256_loadu_si256(mult.as_ptr() as *const __m256i));
            _mm256_and_si256(_mm256_srli_epi16(w, 8), seven)
        };
        let (a, b) = (
            half(&TRIPLET_BYTES[0], &TRIPLET_MULT[0]),
            half(&TRIPLET_BYTES[1], &TRIPLET_MULT[1]),
        );
        // packus: lane 0 = codes 0–7, 16–23; lane 1 = 8–15, 24–31 → quarters (0, 2, 1, 3).
        _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0b11_01_10_00)
    }

    /// [`triplets`]' byte shuffles: 16-bit lane `i` of register `r` holds code `e = 16r + i`'s
    /// bytes `3e/8` and `3e/8 + 1` (past the 12th byte: zero, `-128`).
    static TRIPLET_BYTES: [[i8; 32]; 2] = [triplet_bytes(0), triplet_bytes(16)];
    /// [`triplets`]' multipliers: `2^(8 − 3e mod 8)` for code `e = 16r + i` in lane `i`.
    static TRIPLET_MULT: [[i16; 16]; 2] = [triplet_mult(0), triplet_mult(16)];

    const fn triplet_bytes(first: usize) -> [i8; 32] {
        let mut t = [0i8; 32];
        let mut i = 0;
        while i < 16 {
            let b = 3 * (first + i) / 8;
            t[2 * i] = b as i8;
            t[2 * i + 1] = if b + 1 < 12 { (b + 1) as i8 } else { -128 };
            i += 1;
        }
        t
    }

    const fn triplet_mult(first: usize) -> [i16; 16] {
        let mut t = [0i16; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = 1 << (8 - (3 * (first + i)) % 8);
            i += 1;
        }
        t
    }

    /// 8 bytes of nibbles at `p` (an NVFP4 block's) → 16 bytes: the low nibbles (elements
    /// 0..8), then the high nibbles (8..16); [`nibbles`] for half a block of 16 bytes.
    #[inline(always)]
    pub unsafe fn nibbles8(p: *const u8) -> __m128i {
        let x = _mm_loadl_epi64(p as *const __m128i);
        let m = _mm_set1_epi8(0x0f);
        _mm_unpacklo_epi64(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m))
    }

    /// Eight `e^x` at once; see [`super::exp_f32`] for the method and range.
    #[inline(always)]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        // Below −87.33 e^x is subnormal or 0: flush to 0 (this covers −∞, the causal mask).
        let under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.336_55), _CMP_LT_OQ);
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_55));
        let n = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        // r = x − n·ln2, ln2 = 0.693359375 − 2.12194440e−4 (Cephes' split).
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166_666_65));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        let r2 = _mm256_mul_ps(r, r);
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
        // 2^n through the exponent bits: n ∈ [−126, 127] after the clamps above.
        let pow = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        ));
        let out = _mm256_mul_ps(y, pow);
        _mm256_andnot_ps(under, out)
    }

    /// Hands every lane of `acc` (`nq` vectors, lane `l` of vector `v` belonging to query
    /// `(8v + l) mod nq`: the interleaved layout of [`super::max_per_query`]) to `f(query, x)`.
    #[inline(always)]
    pub unsafe fn fold_lanes(acc: &[__m256], nq: usize, mut f: impl FnMut(usize, f32)) {
        let mut lanes = [0f32; 8];
        for (v, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(lanes.as_mut_ptr(), *a);
            for (l, &x) in lanes.iter().enumerate() {
                f((8 * v + l) % nq, x);
            }
        }
    }

    /// Sum of the 8 lanes.
    #[inline(always)]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Lane i of the result = Σ lanes of v[i], for four vectors.
    #[inline(always)]
    unsafe fn hsum4(v: &[__m256; 4]) -> __m128 {
        let a = _mm256_hadd_ps(v[0], v[1]);
        let b = _mm256_hadd_ps(v[2], v[3]);
        let ab = _mm256_hadd_ps(a, b);
        _mm_add_ps(_mm256_castps256_ps128(ab), _mm256_extractf128_ps(ab, 1))
    }

    /// Where the row kernels below read their rows: elements `c..c + 8` of row `r` as f32
    /// ([`Rows::ld`]; an f32 tile, or f16 storage widened in registers), and for the 16-lane
    /// kernels ([`super::avx512`] builds) 8 elements of rows `r` and `r + 1` in one register
    /// ([`Rows::ld_pair`], row `r` in lanes 0–7) or elements `c..c + 16` of row `r`
    /// ([`Rows::ld16`]).
    pub(super) trait Rows: Copy {
        unsafe fn ld(self, r: usize, c: usize) -> __m256;
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        #[inline(always)]
        unsafe fn ld_pair(self, r: usize, c: usize) -> __m512 {
            super::avx512::join_ps(self.ld(r, c), self.ld(r + 1, c))
        }
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        #[inline(always)]
        unsafe fn ld16(self, r: usize, c: usize) -> __m512 {
            super::avx512::join_ps(self.ld(r, c), self.ld(r, c + 8))
        }
    }

    /// Rows of `d` f32 at `p`.
    #[derive(Clone, Copy)]
    struct F32Rows {
        p: *const f32,
        d: usize,
    }

    impl Rows for F32Rows {
        #[inline(always)]
        unsafe fn ld(self, r: usize, c: usize) -> __m256 {
            _mm256_loadu_ps(self.p.add(r * self.d + c))
        }
    }

    /// Rows of little-endian f16 at `p`, `rb` bytes apart, widened in registers (F16C, or
    /// AVX-512F's 16-lane `vcvtph2ps`).
    #[derive(Clone, Copy)]
    struct F16Rows {
        p: *const u8,
        rb: usize,
    }

    impl Rows for F16Rows {
        #[inline(always)]
        unsafe fn ld(self, r: usize, c: usize) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(
                self.p.add(r * self.rb + 2 * c) as *const __m128i
            ))
        }
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        #[inline(always)]
        unsafe fn ld_pair(self, r: usize, c: usize) -> __m512 {
            let a = _mm_loadu_si128(self.p.add(r * self.rb + 2 * c) as *const __m128i);
            let b = _mm_loadu_si128(self.p.add((r + 1) * self.rb + 2 * c) as *const __m128i);
            _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1))
        }
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        #[inline(always)]
        unsafe fn ld16(self, r: usize, c: usize) -> __m512 {
            _mm512_cvtph_ps(_mm256_loadu_si256(
                self.p.add(r * self.rb + 2 * c) as *const __m256i
            ))
        }
    }

    /// FP8 codes at `p`, rows `rb` bytes apart, widened in registers: each code's sign,
    /// exponent and mantissa moved into an f16 bit pattern (E5M2 is f16's upper byte; E4M3's
    /// 4 exponent bits and 3 mantissa bits sit one bit lower, so its value is that f16 times
    /// 2^8, subnormals included — the bias difference 15 − 7), F16C's `vcvtph2ps`, then one
    /// multiply by the row's scale (with E4M3's 256 folded in). `TOKEN`: the scale is the f16
    /// in the row's first two bytes and the codes follow it; otherwise `s` for every row. The
    /// same operations, in the same order, as [`super::fp8_to_f32`], so the same f32 values.
    #[derive(Clone, Copy)]
    pub(super) struct Fp8Rows<const E4M3: bool, const TOKEN: bool> {
        pub(super) p: *const u8,
        pub(super) rb: usize,
        /// The external scale, times 256 for E4M3 (unused with `TOKEN`).
        pub(super) s: f32,
    }

    impl<const E4M3: bool, const TOKEN: bool> Fp8Rows<E4M3, TOKEN> {
        /// Row `r`'s scale, E4M3's 2^8 folded in.
        #[inline(always)]
        unsafe fn scale(self, r: usize) -> f32 {
            if TOKEN {
                let s = f16_at(self.p.add(r * self.rb));
                if E4M3 {
                    s * 256.0
                } else {
                    s
                }
            } else {
                self.s
            }
        }

        /// Row `r`'s code `c`.
        #[inline(always)]
        unsafe fn code(self, r: usize, c: usize) -> *const u8 {
            self.p.add(r * self.rb + 2 * TOKEN as usize + c)
        }
    }

    /// The eight FP8 codes in the low 8 bytes of `b` as f16 bit patterns ([`Fp8Rows`]): E5M2
    /// is the f16's upper byte; E4M3 is sign-extended and shifted left by 7, which puts the
    /// sign in bits 15 and 14 and exponent and mantissa in bits 13–7, and the mask clears
    /// bit 14.
    #[inline(always)]
    pub unsafe fn fp8_half<const E4M3: bool>(b: __m128i) -> __m128i {
        if E4M3 {
            let h = _mm_slli_epi16(_mm_cvtepi8_epi16(b), 7);
            _mm_and_si128(h, _mm_set1_epi16(0xbfff_u16 as i16))
        } else {
            _mm_slli_epi16(_mm_cvtepu8_epi16(b), 8)
        }
    }

    impl<const E4M3: bool, const TOKEN: bool> Rows for Fp8Rows<E4M3, TOKEN> {
        #[inline(always)]
        unsafe fn ld(self, r: usize, c: usize) -> __m256 {
            let b = _mm_loadl_epi64(self.code(r, c) as *const __m128i);
            let x = _mm256_cvtph_ps(fp8_half::<E4M3>(b));
            _mm256_mul_ps(x, _mm256_set1_ps(self.scale(r)))
        }
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        #[inline(always)]
        unsafe fn ld_pair(self, r: usize, c: usize) -> __m512 {
            let a = _mm_loadl_epi64(self.code(r, c) as *const __m128i);
            let b = _mm_loadl_epi64(self.code(r + 1, c) as *const __m128i);
            let x = _mm512_cvtph_ps(fp8_half16::<E4M3>(_mm_unpacklo_epi64(a, b)));
            let s = if TOKEN {
                super::avx512::join_ps(
                    _mm256_set1_ps(self.scale(r)),
                    _mm256_set1_ps(self.scale(r + 1)),
                )
            } else {
                _mm512_set1_ps(self.s)
            };
            _mm512_mul_ps(x, s)
        }
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        #[inline(always)]
        unsafe fn ld16(self, r: usize, c: usize) -> __m512 {
            let b = _mm_loadu_si128(self.code(r, c) as *const __m128i);
            let x = _mm512_cvtph_ps(fp8_half16::<E4M3>(b));
            _mm512_mul_ps(x, _mm512_set1_ps(self.scale(r)))
        }
    }

    /// Sixteen FP8 codes (bytes) as f16 bit patterns, as [`fp8_half`].
    #[cfg(all(
        target_feature = "avx512f",
        target_feature = "avx512bw",
        target_feature = "avx512vnni"
    ))]
    #[inline(always)]
    unsafe fn fp8_half16<const E4M3: bool>(b: __m128i) -> __m256i {
        if E4M3 {
            let h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
            _mm256_and_si256(h, _mm256_set1_epi16(0xbfff_u16 as i16))
        } else {
            _mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8)
        }
    }

    /// Q queries × rows `r0..r0 + 4` of `ld`: each row load feeds Q FMAs, each query load
    /// feeds 4. With `WIDE` (where compiled) two rows share a register
    /// ([`Rows::ld_pair`]) and each query's 8 elements are broadcast to both halves: every
    /// lane forms the AVX2 kernel's products and sums them in its order, and the halves are
    /// reduced as the AVX2 kernel reduces its four registers, so the scores are equal to the
    /// bit, in half the FMAs.
    #[inline(always)]
    unsafe fn dot_block<const Q: usize, const WIDE: bool>(
        ld: impl Rows,
        r0: usize,
        q: *const f32,
        d: usize,
        nq: usize,
        o: *mut f32,
    ) {
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        if WIDE {
            use super::avx512::{lower, upper};
            let mut acc = [[_mm512_setzero_ps(); 2]; Q];
            let mut c = 0;
            while c < d {
                let rows = [ld.ld_pair(r0, c), ld.ld_pair(r0 + 2, c)];
                for (j, aj) in acc.iter_mut().enumerate() {
                    let qv = _mm256_castps_pd(_mm256_loadu_ps(q.add(j * d + c)));
                    let qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(qv));
                    aj[0] = _mm512_fmadd_ps(rows[0], qv, aj[0]);
                    aj[1] = _mm512_fmadd_ps(rows[1], qv, aj[1]);
                }
                c += 8;
            }
            for (j, aj) in acc.iter().enumerate() {
                let four = [lower(aj[0]), upper(aj[0]), lower(aj[1]), upper(aj[1])];
                store4(hsum4(&four), o.add(j), nq);
            }
            return;
        }
        let mut acc = [[_mm256_setzero_ps(); 4]; Q];
        let mut c = 0;
        while c < d {
            let rows = [
                ld.ld(r0, c),
                ld.ld(r0 + 1, c),
                ld.ld(r0 + 2, c),
                ld.ld(r0 + 3, c),
            ];
            for (j, aj) in acc.iter_mut().enumerate() {
                let qv = _mm256_loadu_ps(q.add(j * d + c));
                for r in 0..4 {
                    aj[r] = _mm256_fmadd_ps(rows[r], qv, aj[r]);
                }
            }
            c += 8;
        }
        for (j, aj) in acc.iter().enumerate() {
            store4(hsum4(aj), o.add(j), nq);
        }
    }

    /// The four lanes of `s` to `o`, `nq` apart (4 rows' scores of one query).
    #[inline(always)]
    unsafe fn store4(s: __m128, o: *mut f32, nq: usize) {
        let mut sums = [0f32; 4];
        _mm_storeu_ps(sums.as_mut_ptr(), s);
        for (r, &s) in sums.iter().enumerate() {
            *o.add(r * nq) = s;
        }
    }

    /// Rows `0..full` (a multiple of 4) against every query, 4 rows at a time; `ld` as in
    /// [`dot_block`].
    #[inline(always)]
    unsafe fn dots4<const WIDE: bool>(
        ld: impl Rows,
        full: usize,
        qs: &[f32],
        d: usize,
        out: *mut f32,
    ) {
        let nq = qs.len() / d;
        let q = qs.as_ptr();
        let mut r0 = 0;
        while r0 < full {
            let or = out.add(r0 * nq);
            query_groups!(
                nq,
                Q,
                j,
                dot_block::<Q, WIDE>(ld, r0, q.add(j * d), d, nq, or.add(j))
            );
            r0 += 4;
        }
    }

    /// [`super::tile_dots`]. 8 lanes wide on every build: rows decoded into a tile come from
    /// AVX2 integer code, and 512-bit FMAs next to it slowed int2 and the KIVI channel formats
    /// by 3–5 % (`attn-bench`, Intel Xeon VM, three interleaved pairs; likely cause: port 1's
    /// vector ALUs close while 512-bit operations are in flight).
    #[inline(always)]
    pub unsafe fn tile_dots(tile: &[f32], qs: &[f32], d: usize, out: &mut [f32]) {
        let rows = tile.len() / d;
        let nq = qs.len() / d;
        let (t, q, o) = (tile.as_ptr(), qs.as_ptr(), out.as_mut_ptr());
        let full = rows - rows % 4;
        dots4::<false>(F32Rows { p: t, d }, full, qs, d, o);
        for r in full..rows {
            for j in 0..nq {
                dot_n::<1>(t.add(r * d), q.add(j * d), d, o.add(r * nq + j));
            }
        }
    }

    /// Q queries × 32 channels of accumulators in registers over all rows of the tile; `ld`
    /// as in [`dot_block`]. With `WIDE` (where compiled) 16 channels per register
    /// ([`Rows::ld16`]): each lane's FMAs are the AVX2 kernel's, so the sums are equal to the
    /// bit.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the block's coordinates; a struct would only rename them
    unsafe fn axpy_block<const Q: usize, const WIDE: bool>(
        w: *const f32,
        ld: impl Rows,
        rows: usize,
        d: usize,
        nq: usize,
        a: *mut f32,
        c0: usize,
    ) {
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        if WIDE {
            let mut acc = [[_mm512_setzero_ps(); 2]; Q];
            for (j, aj) in acc.iter_mut().enumerate() {
                for (k, r) in aj.iter_mut().enumerate() {
                    *r = _mm512_loadu_ps(a.add(j * d + c0 + 16 * k));
                }
            }
            for r in 0..rows {
                let x = [ld.ld16(r, c0), ld.ld16(r, c0 + 16)];
                for (j, aj) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*w.add(r * nq + j));
                    aj[0] = _mm512_fmadd_ps(wv, x[0], aj[0]);
                    aj[1] = _mm512_fmadd_ps(wv, x[1], aj[1]);
                }
            }
            for (j, aj) in acc.iter().enumerate() {
                for (k, r) in aj.iter().enumerate() {
                    _mm512_storeu_ps(a.add(j * d + c0 + 16 * k), *r);
                }
            }
            return;
        }
        let mut acc = [[_mm256_setzero_ps(); 4]; Q];
        for (j, aj) in acc.iter_mut().enumerate() {
            for (k, r) in aj.iter_mut().enumerate() {
                *r = _mm256_loadu_ps(a.add(j * d + c0 + 8 * k));
            }
        }
        for r in 0..rows {
            let x = [
                ld.ld(r, c0),
                ld.ld(r, c0 + 8),
                ld.ld(r, c0 + 16),
                ld.ld(r, c0 + 24),
            ];
            for (j, aj) in acc.iter_mut().enumerate() {
                let wv = _mm256_broadcast_ss(&*w.add(r * nq + j));
                for k in 0..4 {
                    aj[k] = _mm256_fmadd_ps(wv, x[k], aj[k]);
                }
            }
        }
        for (j, aj) in acc.iter().enumerate() {
            for (k, r) in aj.iter().enumerate() {
                _mm256_storeu_ps(a.add(j * d + c0 + 8 * k), *r);
            }
        }
    }

    /// Every query's accumulators over `rows` rows (weights `w`: `[rows, nq]`), for channels
    /// `0..body` 32 at a time (`body` a multiple of 32, `≤ d`); `ld` as in [`dot_block`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the block's coordinates; a struct would only rename them
    unsafe fn axpy32<const WIDE: bool>(
        ld: impl Rows,
        rows: usize,
        w: *const f32,
        d: usize,
        body: usize,
        nq: usize,
        a: *mut f32,
    ) {
        let mut c0 = 0;
        while c0 < body {
            query_groups!(
                nq,
                Q,
                j,
                axpy_block::<Q, WIDE>(w.add(j), ld, rows, d, nq, a.add(j * d), c0)
            );
            c0 += 32;
        }
    }

    /// [`super::tile_axpy`]; 8 lanes wide, as [`tile_dots`].
    #[inline(always)]
    pub unsafe fn tile_axpy(w: &[f32], tile: &[f32], d: usize, acc: &mut [f32]) {
        let rows = tile.len() / d;
        let nq = acc.len() / d;
        let (wp, t, a) = (w.as_ptr(), tile.as_ptr(), acc.as_mut_ptr());
        let body = d - d % 32;
        axpy32::<false>(F32Rows { p: t, d }, rows, wp, d, body, nq, a);
        if body < d {
            for r in 0..rows {
                for j in 0..nq {
                    let wr = *wp.add(r * nq + j);
                    for c in body..d {
                        *a.add(j * d + c) += wr * *t.add(r * d + c);
                    }
                }
            }
        }
    }

    /// The kernels' row reader for `kind` as `$ld` in `$body` (one monomorphized copy per
    /// layout: f16, and FP8 E4M3/E5M2 with a per-token or an external scale).
    macro_rules! with_rows {
        ($kind:expr, $p:expr, $rb:expr, $ld:ident => $body:expr) => {{
            let (p, rb) = ($p, $rb);
            match $kind {
                super::Widen::F16 => {
                    let $ld = F16Rows { p, rb };
                    $body
                }
                super::Widen::Fp8 {
                    e4m3: true,
                    scale: None,
                } => {
                    let $ld = Fp8Rows::<true, true> { p, rb, s: 0.0 };
                    $body
                }
                super::Widen::Fp8 {
                    e4m3: false,
                    scale: None,
                } => {
                    let $ld = Fp8Rows::<false, true> { p, rb, s: 0.0 };
                    $body
                }
                super::Widen::Fp8 {
                    e4m3: true,
                    scale: Some(s),
                } => {
                    let $ld = Fp8Rows::<true, false> {
                        p,
                        rb,
                        s: s * 256.0,
                    };
                    $body
                }
                super::Widen::Fp8 {
                    e4m3: false,
                    scale: Some(s),
                } => {
                    let $ld = Fp8Rows::<false, false> { p, rb, s };
                    $body
                }
            }
        }};
    }

    /// [`super::row_dots`] on rows `t0..t0 + full` (`full` a multiple of 4); `WIDE`: 16
    /// lanes where compiled ([`super::WIDE`]).
    #[allow(clippy::too_many_arguments)] // the rows' coordinates; a struct would only rename them
    pub unsafe fn row_dots<const WIDE: bool>(
        kind: super::Widen,
        data: &[u8],
        rb: usize,
        t0: usize,
        full: usize,
        qs: &[f32],
        d: usize,
        out: *mut f32,
    ) {
        with_rows!(kind, data.as_ptr().add(t0 * rb), rb, rows => {
            dots4::<WIDE>(rows, full, qs, d, out)
        })
    }

    /// [`super::row_axpy`] on rows `t0..t0 + rows` (`d` a multiple of 32); `WIDE` as in
    /// [`row_dots`].
    pub unsafe fn row_axpy<const WIDE: bool>(
        kind: super::Widen,
        data: &[u8],
        rb: usize,
        (t0, rows): (usize, usize),
        w: *const f32,
        d: usize,
        acc: &mut [f32],
    ) {
        with_rows!(kind, data.as_ptr().add(t0 * rb), rb, ld => {
            axpy32::<WIDE>(ld, rows, w, d, d, acc.len() / d, acc.as_mut_ptr())
        })
    }
    #[inline(always)]
    unsafe fn dot_n<const N: usize>(row: *const f32, qs: *const f32, d: usize, out: *mut f32) {
        let mut acc = [_mm256_setzero_ps(); N];
        let body = d - d % 8;
        let mut c = 0;
        while c < body {
            let r = _mm256_loadu_ps(row.add(c));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(qs.add(j * d + c)), r, *a);
            }
            c += 8;
        }
        for (j, a) in acc.iter().enumerate() {
            let mut s = hsum(*a);
            for c in body..d {
                s += *qs.add(j * d + c) * *row.add(c);
            }
            *out.add(j) = s;
        }
    }

    #[inline(always)]
    pub unsafe fn dot_many(row: &[f32], qs: &[f32], out: &mut [f32]) {
        let d = row.len();
        let (r, q, o) = (row.as_ptr(), qs.as_ptr(), out.as_mut_ptr());
        let mut j = 0;
        while out.len() - j >= 4 {
            dot_n::<4>(r, q.add(j * d), d, o.add(j));
            j += 4;
        }
        match out.len() - j {
            3 => dot_n::<3>(r, q.add(j * d), d, o.add(j)),
            2 => dot_n::<2>(r, q.add(j * d), d, o.add(j)),
            1 => dot_n::<1>(r, q.add(j * d), d, o.add(j)),
            _ => {}
        }
    }

    /// [`super::cols_matvec`] for the entries below the last multiple of 64 of `out.len()`
    /// (returned): eight accumulators of 8 lanes over all of `v`, a product and a sum (no
    /// FMA) per lane and k.
    pub unsafe fn cols_matvec64(cols: &[f32], v: &[f32], out: &mut [f32]) -> usize {
        let d = out.len();
        let body = d - d % 64;
        for i0 in (0..body).step_by(64) {
            let mut acc: [__m256; 8] =
                std::array::from_fn(|r| _mm256_loadu_ps(out.as_ptr().add(i0 + 8 * r)));
            for (k, &vk) in v.iter().enumerate() {
                let (col, vv) = (cols.as_ptr().add(k * d + i0), _mm256_set1_ps(vk));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_loadu_ps(col.add(8 * r)), vv));
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(i0 + 8 * r), *a);
            }
        }
        body
    }

    #[inline(always)]
    pub unsafe fn axpy_many(w: &[f32], row: &[f32], acc: &mut [f32]) {
        let d = row.len();
        let body = d - d % 8;
        let (r, a) = (row.as_ptr(), acc.as_mut_ptr());
        for (j, &wj) in w.iter().enumerate() {
            if wj == 0.0 {
                continue;
            }
            let wv = _mm256_set1_ps(wj);
            let dst = a.add(j * d);
            let mut c = 0;
            while c < body {
                let y = _mm256_fmadd_ps(wv, _mm256_loadu_ps(r.add(c)), _mm256_loadu_ps(dst.add(c)));
                _mm256_storeu_ps(dst.add(c), y);
                c += 8;
            }
            for c in body..d {
                *dst.add(c) += wj * *r.add(c);
            }
        }
    }
}

/// AVX-512 primitives shared by attention's key scoring ([`super::intdot`]) and the decode
/// matmul (`crate::model::qmatmul`): pairs of 32-byte blocks in one register, and the lane
/// correction that lets `vpdpbusd` take signed codes as its unsigned operand.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx512f",
    target_feature = "avx512bw",
    target_feature = "avx512vnni"
))]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// Two 256-bit halves as one 512-bit register (`lo` in lanes 0–7).
    #[inline(always)]
    pub unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
    }

    /// [`join`] for f32 lanes (AVX512F only: `insertf32x8` needs DQ).
    #[inline(always)]
    pub unsafe fn join_ps(lo: __m256, hi: __m256) -> __m512 {
        let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
        _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(hi), 1))
    }

    /// Lanes 0–7 of `x`.
    #[inline(always)]
    pub unsafe fn lower(x: __m512) -> __m256 {
        _mm512_castps512_ps256(x)
    }

    /// Lanes 8–15 of `x` (`extractf64x4` is AVX512F; `extractf32x8` would need DQ).
    #[inline(always)]
    pub unsafe fn upper(x: __m512) -> __m256 {
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))
    }

    /// The sum of a register's two 256-bit halves.
    #[inline(always)]
    pub unsafe fn fold(x: __m512) -> __m256 {
        _mm256_add_ps(lower(x), upper(x))
    }

    /// Each i32 lane's `−z · (c₀ + c₁ + c₂ + c₃)` over its four signed bytes of `c` (`z`
    /// broadcast as unsigned bytes): started from it, `vpdpbusd` of `k + z` (the signed codes
    /// `k` offset into the unsigned operand) with `c` sums `Σ k·c` exactly — the s8s8
    /// compensation oneDNN uses (`z` = 128 for any i8 `k`, `k ⊕ 0x80`; 8 for Q4_0's
    /// `nib − 8`).
    #[inline(always)]
    pub unsafe fn offset_correction(z: __m512i, c: __m512i) -> __m512i {
        let zero = _mm512_setzero_si512();
        _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, z, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cols_matvec` against the sequential sums written out (`o += c·v` in k order, from the
    /// value `out` held), compared to the bit: by hand (d = 2, two columns: (1, 2)·3 + (4, 5)·
    /// 0.5 added to (10, 20) → (15, 28.5)), and on pseudo-random values at d 16 (scalar only),
    /// 64, 128 and 80 (a 64-entry vector block plus a scalar tail).
    #[test]
    fn cols_matvec_is_the_sequential_sum_to_the_bit() {
        let mut out = [10f32, 20.0];
        cols_matvec(&[1.0, 2.0, 4.0, 5.0], &[3.0, 0.5], &mut out);
        assert_eq!(out, [15.0, 28.5]);
        for (d, n) in [(16usize, 16usize), (64, 64), (128, 40), (80, 33)] {
            let val = |i: usize| ((i as f32 * 0.754_877_7).fract() - 0.5) * (1.0 + (i % 7) as f32);
            let cols: Vec<f32> = (0..n * d).map(val).collect();
            let v: Vec<f32> = (0..n).map(|k| val(7919 * k + 3)).collect();
            let start: Vec<f32> = (0..d).map(|i| val(31 * i + 1)).collect();
            let mut got = start.clone();
            cols_matvec(&cols, &v, &mut got);
            for i in 0..d {
                let mut want = start[i];
                for k in 0..n {
                    want += cols[k * d + i] * v[k];
                }
                assert_eq!(got[i].to_bits(), want.to_bits(), "d={d} entry {i}");
            }
        }
    }

    /// By hand: codes (1, 2, 3, 4, 5, 6, 7, 0) pack LSB first into 0xD1, 0x58, 0x1F (byte 0 =
    /// 1 | 2<<3 | (3&3)<<6, byte 1 = 3>>2 | 4<<1 | 5<<4 | (6&1)<<7, byte 2 = 6>>1 | 7<<2);
    /// groups of 8 codes take 3 bytes each, so code `e + 8k` of four such groups shifted by `k`
    /// — (1..7, 0), (2..7, 0, 1), ... — packs the same way per group: a permutation of the
    /// quarters or a code read from the wrong byte shows. Bytes past the 12 are not read (the
    /// 13th here is 0xFF and must not leak into code 31).
    #[test]
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    fn triplets_by_hand() {
        let pack8 = |c: [u8; 8]| -> [u8; 3] {
            let bits = c
                .iter()
                .enumerate()
                .fold(0u32, |a, (i, &v)| a | (v as u32) << (3 * i));
            [bits as u8, (bits >> 8) as u8, (bits >> 16) as u8]
        };
        assert_eq!(pack8([1, 2, 3, 4, 5, 6, 7, 0]), [0xD1, 0x58, 0x1F]);
        let mut bytes = vec![0u8; 13];
        let mut want = [0u8; 32];
        for k in 0..4 {
            let c: [u8; 8] = std::array::from_fn(|i| ((i + 1 + k) % 8) as u8);
            bytes[3 * k..3 * k + 3].copy_from_slice(&pack8(c));
            want[8 * k..8 * k + 8].copy_from_slice(&c);
        }
        bytes[12] = 0xFF;
        let mut got = [0u8; 32];
        // SAFETY: AVX2 compiled in; 12 bytes readable at the pointer.
        unsafe {
            use std::arch::x86_64::*;
            _mm256_storeu_si256(
                got.as_mut_ptr() as *mut __m256i,
                avx::triplets(bytes.as_ptr()),
            );
        }
        assert_eq!(got, want);
    }

    /// By hand: the largest magnitude wherever it sits (a full lane of 8, the tail, a
    /// negative value), 0 for an empty slice.
    #[test]
    fn absmax_by_hand() {
        assert_eq!(absmax(&[]), 0.0);
        assert_eq!(absmax(&[0.5, -3.0, 2.0]), 3.0);
        let mut x: Vec<f32> = (0..19).map(|i| i as f32 * 0.25).collect();
        assert_eq!(absmax(&x), 4.5);
        x[4] = -7.25;
        assert_eq!(absmax(&x), 7.25);
        x[17] = 9.0;
        assert_eq!(absmax(&x), 9.0);
    }

    /// By hand: element `i` of 70 (two vector blocks and a tail of 6) is `i − 35 + 0.5` for
    /// even `i` (ties: −34.5 → −34, −33.5 → −34 … even neighbours) and `i − 35` for odd `i`;
    /// with `inv = 1` the code is that value rounded half to even, in element order, which a
    /// lane interleaving left in the packs would scramble.
    #[test]
    fn quantize_i8_by_hand() {
        let x: Vec<f32> = (0..70)
            .map(|i| i as f32 - 35.0 + if i % 2 == 0 { 0.5 } else { 0.0 })
            .collect();
        let mut out = vec![0i8; 70];
        quantize_i8(&x, 1.0, &mut out);
        for (i, &c) in out.iter().enumerate() {
            let v = i as i32 - 35;
            // v + ½ rounds to whichever of v and v + 1 is even.
            let want = if i % 2 == 1 {
                v
            } else if v % 2 == 0 {
                v
            } else {
                v + 1
            };
            assert_eq!(c as i32, want, "element {i} ({})", x[i]);
        }
        // Through the vector loop with inv ≠ 1 and ties rounding both ways: x = (2k + 1)/4,
        // k = i − 35, times 2 is k + ½ (exact), which goes to k for even k and k + 1 for odd.
        let x: Vec<f32> = (0..70)
            .map(|i| (2.0 * (i as f32 - 35.0) + 1.0) / 4.0)
            .collect();
        quantize_i8(&x, 2.0, &mut out);
        for (i, &c) in out.iter().enumerate() {
            let k = i as i32 - 35;
            assert_eq!(
                c as i32,
                if k % 2 == 0 { k } else { k + 1 },
                "element {i} ({})",
                x[i]
            );
        }
        // inv scales before rounding (all exact in f32): 254 → 127, −127 → −63.5 → −64,
        // 5 → 2.5 → 2.
        let mut o = [0i8; 3];
        quantize_i8(&[254.0, -127.0, 5.0], 0.5, &mut o);
        assert_eq!(o, [127, -64, 2]);
    }

    /// Against plain sums, for every query count 1..9 and a head_dim with a tail (20).
    #[test]
    fn kernels_match_plain_loops() {
        for d in [8usize, 20, 64] {
            let row: Vec<f32> = (0..d).map(|c| (c as f32 * 0.37).sin()).collect();
            for n in 1..9 {
                let qs: Vec<f32> = (0..n * d).map(|i| (i as f32 * 0.11).cos()).collect();
                let mut out = vec![0f32; n];
                dot_many(&row, &qs, &mut out);
                for j in 0..n {
                    let want: f32 = (0..d).map(|c| qs[j * d + c] * row[c]).sum();
                    assert!((out[j] - want).abs() < 1e-4, "d={d} n={n} j={j}");
                }
                let w: Vec<f32> = (0..n)
                    .map(|j| if j == 1 { 0.0 } else { j as f32 + 0.5 })
                    .collect();
                let mut acc = vec![1f32; n * d];
                axpy_many(&w, &row, &mut acc);
                for j in 0..n {
                    for c in 0..d {
                        assert!((acc[j * d + c] - (1.0 + w[j] * row[c])).abs() < 1e-5);
                    }
                }
            }
        }
    }

    /// Every FP8 code decodes through the f16 trick exactly as the `float8` crate decodes it.
    #[test]
    fn fp8_widening_matches_float8_crate() {
        let codes: Vec<u8> = (0..=255u8).filter(|&b| b & 0x7f != 0x7f).collect();
        let mut out = vec![0f32; codes.len()];
        fp8_to_f32(&codes, true, 1.0, &mut out);
        for (&b, &y) in codes.iter().zip(&out) {
            assert_eq!(y, float8::F8E4M3::from_bits(b).to_f32(), "E4M3 {b:#04x}");
        }
        let codes: Vec<u8> = (0..=255u8).filter(|&b| b & 0x7c != 0x7c).collect();
        let mut out = vec![0f32; codes.len()];
        fp8_to_f32(&codes, false, 2.0, &mut out);
        for (&b, &y) in codes.iter().zip(&out) {
            assert_eq!(
                y,
                2.0 * float8::F8E5M2::from_bits(b).to_f32(),
                "E5M2 {b:#04x}"
            );
        }
    }

    #[test]
    fn int_decoders_match_scalar() {
        let src: Vec<u8> = (0..40u32).map(|i| (i * 37 % 256) as u8).collect();
        let mut a = vec![0f32; 40];
        i8_to_f32(&src, 0.5, &mut a);
        for i in 0..40 {
            assert_eq!(a[i], (src[i] as i8) as f32 * 0.5);
        }
        let mut b = vec![0f32; 36];
        u4_pairs_to_f32(&src, 0.25, -1.0, &mut b);
        for i in 0..36 {
            let q = if i % 2 == 0 {
                src[i / 2] & 15
            } else {
                src[i / 2] >> 4
            };
            assert_eq!(b[i], -1.0 + q as f32 * 0.25);
        }
        let mut c = vec![0f32; 32];
        q4_0_to_f32(&src, 0.5, &mut c);
        for j in 0..16 {
            assert_eq!(c[j], ((src[j] & 15) as i32 - 8) as f32 * 0.5);
            assert_eq!(c[j + 16], ((src[j] >> 4) as i32 - 8) as f32 * 0.5);
        }
    }

    /// The dispatched fused row kernels, every [`Widen`] layout (f16; FP8 E4M3 and E5M2 with a
    /// per-token and an external scale; 16 lanes where the build has AVX-512) against the AVX2
    /// kernels called directly: equal to the bit, as [`WIDE`]'s doc claims (the exact quality
    /// path runs them, so its numbers must not move with the machine's vector width). Random
    /// values spread over six binades, so a changed summation order shows in the last bits;
    /// head_dim 32–256, 1–8 queries, row counts with a partial group of 4, a padded row
    /// stride. Where the build has no AVX-512 both sides are the AVX2 kernel.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    #[test]
    fn wide_kernels_equal_the_avx2_kernels_to_the_bit() {
        let mut seed = 0x9e37_79b9_u32;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let m = (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            m * 2f32.powi((seed % 6) as i32 - 2)
        };
        let layouts = [
            Widen::F16,
            Widen::Fp8 {
                e4m3: true,
                scale: None,
            },
            Widen::Fp8 {
                e4m3: false,
                scale: None,
            },
            Widen::Fp8 {
                e4m3: true,
                scale: Some(0.3),
            },
            Widen::Fp8 {
                e4m3: false,
                scale: Some(0.3),
            },
        ];
        for kind in layouts {
            for (d, rows) in [(32usize, 37usize), (64, 70), (96, 12), (128, 33), (256, 9)] {
                let rb = kind.row_bytes(d) + 6;
                let mut data = vec![0u8; rows * rb];
                for t in 0..rows {
                    let row = &mut data[t * rb..(t + 1) * rb];
                    match kind {
                        Widen::F16 => {
                            for c in 0..d {
                                let h = half::f16::from_f32(rand());
                                row[2 * c..2 * c + 2].copy_from_slice(&h.to_le_bytes());
                            }
                        }
                        Widen::Fp8 { scale, .. } => {
                            let at = if scale.is_none() {
                                let h = half::f16::from_f32(rand().abs() + 1e-3);
                                row[..2].copy_from_slice(&h.to_le_bytes());
                                2
                            } else {
                                0
                            };
                            for c in 0..d {
                                // Finite codes of either encoding (exponent field not all ones).
                                row[at + c] = (rand().to_bits() >> 7) as u8 & 0xbb;
                            }
                        }
                    }
                }
                for nq in 1..=8usize {
                    let qs: Vec<f32> = (0..nq * d).map(|_| rand()).collect();
                    let w: Vec<f32> = (0..rows * nq).map(|_| rand().abs()).collect();
                    let acc0: Vec<f32> = (0..nq * d).map(|_| rand()).collect();
                    let ctx = format!("{kind:?} d={d} rows={rows} nq={nq}");

                    let full = rows - rows % 4;
                    let (mut got, mut want) = (vec![0f32; rows * nq], vec![0f32; rows * nq]);
                    assert!(row_dots(kind, &data, rb, (0, rows), &qs, d, &mut got));
                    // SAFETY: features compiled in (cfg above); rows 0..full lie in `data`,
                    // their scores in `want`.
                    unsafe {
                        avx::row_dots::<false>(kind, &data, rb, 0, full, &qs, d, want.as_mut_ptr())
                    };
                    assert_eq!(got[..full * nq], want[..full * nq], "row_dots {ctx}");

                    let n = rows.min(TILE_ROWS);
                    let (mut got, mut want) = (acc0.clone(), acc0.clone());
                    assert!(row_axpy(kind, &data, rb, (0, n), &w, d, &mut got));
                    // SAFETY: as above.
                    unsafe {
                        avx::row_axpy::<false>(kind, &data, rb, (0, n), w.as_ptr(), d, &mut want)
                    };
                    assert_eq!(got, want, "row_axpy {ctx}");
                }
            }
        }
    }

    /// Tile kernels against plain loops, for tiles with a partial 8-row group.
    #[test]
    fn tile_kernels_match_plain_loops() {
        for (rows, d, nq) in [
            (16usize, 64usize, 3usize),
            (13, 32, 5),
            (8, 128, 1),
            (3, 20, 2),
        ] {
            let tile: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.013).sin()).collect();
            let qs: Vec<f32> = (0..nq * d).map(|i| (i as f32 * 0.07).cos()).collect();
            let mut out = vec![0f32; rows * nq];
            tile_dots(&tile, &qs, d, &mut out);
            for r in 0..rows {
                for j in 0..nq {
                    let want: f32 = (0..d).map(|c| tile[r * d + c] * qs[j * d + c]).sum();
                    assert!(
                        (out[r * nq + j] - want).abs() < 1e-3,
                        "rows={rows} d={d} r={r} j={j}"
                    );
                }
            }
            let w: Vec<f32> = (0..rows * nq).map(|i| (i % 4) as f32 * 0.25).collect();
            let mut acc = vec![0.5f32; nq * d];
            tile_axpy(&w, &tile, d, &mut acc);
            for j in 0..nq {
                for c in 0..d {
                    let want = 0.5
                        + (0..rows)
                            .map(|r| w[r * nq + j] * tile[r * d + c])
                            .sum::<f32>();
                    assert!((acc[j * d + c] - want).abs() < 1e-3);
                }
            }
        }
    }

    /// The fused row kernels (f16; FP8 E4M3 and E5M2 with a per-token f16 scale and with an
    /// external one) against f64 sums of the rows' values — f16 widened by `half`, FP8 codes by
    /// the `float8` crate times the scale, exact in f64 (the scales are chosen so the f32
    /// product is exact too); bound: f32 accumulation, Higham §3.1, `γ_{d+2}·Σ|q·k|` and
    /// `γ_{n+2}·Σ|w·v|` — and to the bit against decoding into a tile first, as their docs
    /// claim; rows of 70 (a 32-row step, 4-row groups and a tail), a row stride with padding,
    /// nq 1–7, a step of zero weights (skipped, so its rows may hold anything).
    #[test]
    fn row_kernels_match_f64_and_the_tile_path() {
        use crate::kv::stream::{axpy_rows_with, dot_rows_with};
        let (n, t0) = (70usize, 3usize);
        let layouts = [
            Widen::F16,
            Widen::Fp8 {
                e4m3: true,
                scale: None,
            },
            Widen::Fp8 {
                e4m3: false,
                scale: None,
            },
            Widen::Fp8 {
                e4m3: true,
                scale: Some(0.375),
            },
            Widen::Fp8 {
                e4m3: false,
                scale: Some(0.375),
            },
        ];
        for kind in layouts {
            for (d, pad) in [(64usize, 0usize), (128, 6), (32, 2)] {
                let rb = kind.row_bytes(d) + pad;
                let mut data = vec![0u8; (t0 + n) * rb];
                let mut vals = vec![0f64; (t0 + n) * d];
                for t in 0..t0 + n {
                    let row = &mut data[t * rb..(t + 1) * rb];
                    let x = |c: usize| ((t * d + c) as f32 * 0.37).sin() * 3.0;
                    match kind {
                        Widen::F16 => {
                            for c in 0..d {
                                let h = half::f16::from_f32(x(c));
                                row[2 * c..2 * c + 2].copy_from_slice(&h.to_le_bytes());
                                vals[t * d + c] = h.to_f64();
                            }
                        }
                        Widen::Fp8 { e4m3, scale } => {
                            let (s, codes) = match scale {
                                Some(s) => (s as f64, &mut row[..]),
                                None => {
                                    let h = half::f16::from_f32(0.01 + 0.003 * t as f32);
                                    row[..2].copy_from_slice(&h.to_le_bytes());
                                    (h.to_f64(), &mut row[2..])
                                }
                            };
                            for c in 0..d {
                                // Every finite code in turn (NaN and ±∞ never stored).
                                let mut b = ((t * d + c) * 37 + 11) as u8;
                                let special = if e4m3 {
                                    b & 0x7f == 0x7f
                                } else {
                                    b & 0x7c == 0x7c
                                };
                                if special {
                                    b ^= 0x41;
                                }
                                codes[c] = b;
                                let v = if e4m3 {
                                    float8::F8E4M3::from_bits(b).to_f64()
                                } else {
                                    float8::F8E5M2::from_bits(b).to_f64()
                                };
                                vals[t * d + c] = v * s;
                            }
                        }
                    }
                }
                for nq in [1usize, 3, 4, 7] {
                    let ctx = format!("{kind:?} d={d} nq={nq}");
                    let qs: Vec<f32> = (0..nq * d).map(|i| (i as f32 * 0.11).cos()).collect();
                    let mut got = vec![0f32; n * nq];
                    if !row_dots(kind, &data, rb, (t0, t0 + n), &qs, d, &mut got) {
                        return; // no F16C/FMA in this build: the callers decode rows instead
                    }
                    let mut tiled = vec![0f32; n * nq];
                    dot_rows_with(t0, t0 + n, &qs, &mut tiled, d, |t, r| {
                        kind.decode(&data[t * rb..], r)
                    });
                    assert_eq!(got, tiled, "{ctx}: dots differ from the tile path");
                    let u = 2f64.powi(-24);
                    for t in 0..n {
                        for j in 0..nq {
                            let terms =
                                (0..d).map(|c| qs[j * d + c] as f64 * vals[(t0 + t) * d + c]);
                            let exact: f64 = terms.clone().sum();
                            let g = (d + 2) as f64 * u / (1.0 - (d + 2) as f64 * u);
                            let bound = g * terms.map(f64::abs).sum::<f64>() + 1e-30;
                            let e = (got[t * nq + j] as f64 - exact).abs();
                            assert!(e <= bound, "{ctx} t={t} j={j}: {e} > {bound}");
                        }
                    }
                    let mut w: Vec<f32> = (0..n * nq).map(|i| (i % 5) as f32 * 0.2).collect();
                    w[32 * nq..64 * nq].iter_mut().for_each(|x| *x = 0.0);
                    let mut acc = vec![0.5f32; nq * d];
                    assert!(row_axpy(kind, &data, rb, (t0, t0 + n), &w, d, &mut acc));
                    let mut tiled = vec![0.5f32; nq * d];
                    axpy_rows_with(t0, t0 + n, &w, &mut tiled, d, |t, r| {
                        kind.decode(&data[t * rb..], r)
                    });
                    assert_eq!(acc, tiled, "{ctx}: P·V differs from the tile path");
                    for j in 0..nq {
                        for c in 0..d {
                            let terms =
                                (0..n).map(|t| w[t * nq + j] as f64 * vals[(t0 + t) * d + c]);
                            let exact = 0.5 + terms.clone().sum::<f64>();
                            let g = (n + 2) as f64 * u / (1.0 - (n + 2) as f64 * u);
                            let bound = g * (0.5 + terms.map(f64::abs).sum::<f64>());
                            let e = (acc[j * d + c] as f64 - exact).abs();
                            assert!(e <= bound, "{ctx} j={j} c={c}: {e} > {bound}");
                        }
                    }
                }
            }
        }
    }

    /// The vectorized exp against f64's `exp` (an independent reference), relative error in
    /// ulp-sized units, over the range softmax uses and beyond; −∞ and deep underflow give 0.
    #[test]
    fn exp_matches_f64_reference() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "worst relative error {worst:e}"
        );
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(0.0), 1.0);
    }

    /// Max, exp and sums per query against plain loops over `t·nq + j`, for query counts on
    /// both paths (≤ 8 interleaved lanes, > 8 along rows), row counts with and without a tail,
    /// and fully masked queries (−∞ everywhere: zeros, sum 0, no NaN).
    #[test]
    fn softmax_pieces_match_plain_loops() {
        for nq in [1usize, 2, 3, 5, 8, 9, 15, 16, 24] {
            for rows in [1usize, 7, 8, 33] {
                let mut w: Vec<f32> = (0..rows * nq)
                    .map(|i| ((i as f32) * 0.7).sin() * 9.0)
                    .collect();
                // Query 1 (when present) masked on every row; query 0 masked on the last row.
                for t in 0..rows {
                    if nq > 1 {
                        w[t * nq + 1] = f32::NEG_INFINITY;
                    }
                }
                if rows > 1 {
                    w[(rows - 1) * nq] = f32::NEG_INFINITY;
                }
                let mut want_max = vec![f32::NEG_INFINITY; nq];
                for (k, &x) in w.iter().enumerate() {
                    want_max[k % nq] = want_max[k % nq].max(x);
                }
                let mut max = vec![0f32; nq];
                max_per_query(&w, nq, &mut max);
                assert_eq!(max, want_max, "nq={nq} rows={rows}");
                let mut want_w = w.clone();
                let mut want_sum = vec![0f64; nq];
                for (k, x) in want_w.iter_mut().enumerate() {
                    let m = want_max[k % nq];
                    let e = if *x == f32::NEG_INFINITY {
                        0.0
                    } else {
                        ((*x - m) as f64).exp()
                    };
                    *x = e as f32;
                    want_sum[k % nq] += e;
                }
                let mut sum = vec![0f32; nq];
                exp_sub_sum(&mut w, nq, &max, &mut sum);
                for (k, (&a, &b)) in w.iter().zip(&want_w).enumerate() {
                    assert!(
                        (a - b).abs() <= 4e-7 * b.max(1e-30),
                        "nq={nq} rows={rows} k={k}"
                    );
                }
                for j in 0..nq {
                    assert!(
                        (sum[j] as f64 - want_sum[j]).abs() <= 1e-5 * want_sum[j].max(1e-30),
                        "nq={nq} rows={rows} j={j}: {} vs {}",
                        sum[j],
                        want_sum[j]
                    );
                }
                if nq > 1 {
                    assert_eq!(sum[1], 0.0);
                }
            }
        }
    }
}
