//! `int8-channel[:group=G,residual=R]`, `int4-channel[:…]` and `int2-channel[:…]`: KIVI's
//! per-channel keys (Liu et al. 2024, arXiv 2402.02750, §3.2 and Alg. 1; 2 bits is KIVI-2). Keys are quantized per channel over groups of
//! `G` tokens; the newest tokens stay f16 until `R` plus a full group have arrived, then the
//! oldest `G` of them are quantized together. A lone `int8-channel` means KIVI's pairing: keys
//! per-channel, values per-token at the same bit width (int8-token / int4 / int2). Keys only, and no
//! eviction (evicting single tokens would break the token groups). The CUDA kernels implement
//! the 8-bit form (`CHAN8`).

use std::fmt;

use super::contract::{Format, FormatSpec};
use super::gpu::{self, GpuFormat};
use crate::kv::codec::{f16_round_down, f16_round_up, RowCodec};
use crate::kv::formats::fp16::F16Row;
use crate::kv::params::Params;
use crate::kv::stream::{axpy_rows_with, dot_rows_with, Stream};
use crate::kv::quant::asym::{asym_code, asym_params};

/// Default token-group size of per-channel key quantization (KIVI §4: G = 32).
pub const DEFAULT_CHANNEL_GROUP: usize = 32;
/// Default full-precision residual of per-channel key quantization (KIVI uses R = 128; we keep
/// the same so short prompts are not quantized at all, as in KIVI).
pub const DEFAULT_RESIDUAL: usize = 128;

/// The per-channel key formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channel {
    /// Code width: 8 (symmetric, f16 absmax scale per channel and block) or 4 or 2
    /// (asymmetric, f16 scale and minimum per channel and block).
    pub bits: u8,
    /// Tokens per quantized group (> 0; even for 4-bit).
    pub group: usize,
    /// Newest tokens kept in f16 before a group is quantized.
    pub residual: usize,
}

impl FormatSpec for Channel {
    const NAMES: &'static [&'static str] = &["int8-channel", "int4-channel", "int2-channel"];
    const HELP: &'static str = "int8-channel[:group=G,residual=R], \
                                int4-channel[:group=G,residual=R], \
                                int2-channel[:group=G,residual=R]";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        let bits = match p.name {
            "int8-channel" => 8,
            "int4-channel" => 4,
            _ => 2,
        };
        let (mut group, mut residual) = (DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL);
        for &(k, v) in &p.pairs {
            match k {
                "group" => group = p.num(k, v)?,
                "residual" => residual = p.num(k, v)?,
                _ => return Err(p.unknown(k, "group=G,residual=R")),
            }
        }
        if group == 0 || (bits == 4 && group % 2 != 0) {
            return Err(format!("token group {group} must be > 0 (even for int4)"));
        }
        Ok(Channel {
            bits,
            group,
            residual,
        })
    }
}

impl Format for Channel {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "int{}-channel", self.bits)?;
        if (self.group, self.residual) != (DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL) {
            write!(f, ":group={},residual={}", self.group, self.residual)?;
        }
        Ok(())
    }
    fn validate(&self, d: usize) -> Result<(), String> {
        if self.bits == 4 && !d.is_multiple_of(2) {
            return Err(format!("4-bit codes need an even head_dim (model: {d})"));
        }
        if self.bits == 2 && !d.is_multiple_of(4) {
            return Err(format!(
                "2-bit codes need head_dim a multiple of 4 (model: {d}); use int4-channel"
            ));
        }
        Ok(())
    }
    /// The residual rows' f16 size; quantized blocks are counted in [`Self::stream_bytes`].
    fn row_bytes(&self, d: usize) -> usize {
        2 * d
    }
    fn stream_bytes(&self, d: usize, n: usize) -> usize {
        let Channel {
            bits,
            group,
            residual,
        } = *self;
        let quantized = if n >= residual + group {
            (n - residual) / group * group
        } else {
            0
        };
        let blocks = quantized / group;
        let codes = group * d * bits as usize / 8;
        let params = d * if bits == 8 { 2 } else { 4 };
        blocks * (codes + params) + (n - quantized) * 2 * d
    }
    fn token_group(&self) -> usize {
        self.group
    }
    fn per_channel(&self) -> bool {
        true
    }
    /// KIVI's values: per-token at the same width, default groups (`int8` is int8-token,
    /// `int4` groups of 32, `int2` groups of 32).
    fn value_partner(&self) -> Option<&'static str> {
        Some(match self.bits {
            8 => "int8",
            4 => "int4",
            _ => "int2",
        })
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(ChannelStream::new(self.bits, self.group, self.residual, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        (self.bits == 8).then_some(GpuFormat {
            id: gpu::CHAN8,
            group: self.group,
            residual: self.residual,
            block: 0,
            meta: 0,
            head: 0,
            bits: 8,
            token_group: self.group,
        })
    }
}

/// KIVI's key format (Liu et al. 2024, arXiv 2402.02750, §3.2 and Alg. 1): per-channel
/// quantization over groups of `group` tokens, the newest tokens kept in f16 until `residual`
/// plus a full group have arrived, then the oldest `group` of them are quantized together.
///
/// - 8-bit: symmetric, one f16 absmax scale per channel per block; codes `[group, d]` i8.
/// - 4-bit: asymmetric, f16 scale and f16 minimum per channel per block; codes `[group, d/2]`
///   bytes (channel `2j` low nibble, `2j+1` high nibble).
/// - 2-bit: as 4-bit with 4 levels ([`asym_params`], [`asym_code`]); codes `[group, d/4]` bytes
///   packed LSB-first (as [`crate::kv::quant::bits::pack_bits`]: channel `4j + i` at bits `2i..2i+2` of byte `j`).
#[derive(Debug, Clone)]
pub struct ChannelStream {
    bits: u8,
    group: usize,
    residual: usize,
    d: usize,
    /// Quantized blocks: per block, params (`d` f16 scales, then for 4-bit `d` f16 minimums)
    /// followed by codes.
    blocks: Vec<u8>,
    n_blocks: usize,
    /// f16 rows of the newest tokens.
    resid: Vec<u8>,
}

impl ChannelStream {
    /// An empty stream.
    pub fn new(bits: u8, group: usize, residual: usize, head_dim: usize) -> Self {
        Self {
            bits,
            group,
            residual,
            d: head_dim,
            blocks: Vec::new(),
            n_blocks: 0,
            resid: Vec::new(),
        }
    }

    fn params_bytes(&self) -> usize {
        self.d * if self.bits == 8 { 2 } else { 4 }
    }

    fn code_row_bytes(&self) -> usize {
        self.d * self.bits as usize / 8
    }

    fn block_bytes(&self) -> usize {
        self.params_bytes() + self.group * self.code_row_bytes()
    }

    fn resid_rows(&self) -> usize {
        self.resid.len() / (2 * self.d)
    }

    /// Quantizes the oldest `group` residual rows into one block.
    fn quantize_oldest_group(&mut self) {
        let (d, g) = (self.d, self.group);
        let mut x = vec![0f32; g * d];
        for t in 0..g {
            F16Row.decode(
                &self.resid[t * 2 * d..(t + 1) * 2 * d],
                &mut x[t * d..(t + 1) * d],
            );
        }
        let mut block = vec![0u8; self.block_bytes()];
        let (params, codes) = block.split_at_mut(self.params_bytes());
        let crb = self.code_row_bytes();
        for c in 0..d {
            let col = (0..g).map(|t| x[t * d + c]);
            if self.bits == 8 {
                let absmax = col.fold(0f32, |m, v| m.max(v.abs()));
                let s = f16_round_up(absmax / 127.0);
                params[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
                let inv = if s.to_f32() > 0.0 {
                    1.0 / s.to_f32()
                } else {
                    0.0
                };
                for t in 0..g {
                    codes[t * crb + c] =
                        (x[t * d + c] * inv).round().clamp(-127.0, 127.0) as i8 as u8;
                }
            } else if self.bits == 2 {
                let (lo, hi) = col.fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), v| {
                    (l.min(v), h.max(v))
                });
                let (s, m) = asym_params(lo, hi, 2);
                params[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
                params[2 * d + 2 * c..2 * d + 2 * c + 2].copy_from_slice(&m.to_le_bytes());
                for t in 0..g {
                    let q = asym_code(x[t * d + c], s, m, 2);
                    codes[t * crb + c / 4] |= q << (2 * (c % 4));
                }
            } else {
                let (lo, hi) = col.fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), v| {
                    (l.min(v), h.max(v))
                });
                let m = f16_round_down(lo);
                let s = f16_round_up((hi - m.to_f32()) / 15.0);
                params[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
                params[2 * d + 2 * c..2 * d + 2 * c + 2].copy_from_slice(&m.to_le_bytes());
                let inv = if s.to_f32() > 0.0 {
                    1.0 / s.to_f32()
                } else {
                    0.0
                };
                for t in 0..g {
                    let q = ((x[t * d + c] - m.to_f32()) * inv).round().clamp(0.0, 15.0) as u8;
                    codes[t * crb + c / 2] |= if c % 2 == 0 { q } else { q << 4 };
                }
            }
        }
        self.blocks.extend_from_slice(&block);
        self.n_blocks += 1;
        self.resid.drain(..g * 2 * d);
    }
}

/// The f32 scales (and, for 4-bit, minimums) of the block last decoded.
#[derive(Debug, Default)]
struct BlockParams {
    block: Option<usize>,
    scale: Vec<f32>,
    min: Vec<f32>,
}

impl ChannelStream {
    /// Dequantizes the row in `slot`, reusing `params` when the slot's block is the one decoded
    /// last (rows are read in order, so each block's parameters are decoded once).
    #[inline]
    fn decode_with(&self, slot: usize, out: &mut [f32], params: &mut BlockParams) {
        let (d, g) = (self.d, self.group);
        let quantized = self.n_blocks * g;
        if slot >= quantized {
            let r = slot - quantized;
            return F16Row.decode(&self.resid[r * 2 * d..(r + 1) * 2 * d], out);
        }
        let b = slot / g;
        let block = &self.blocks[b * self.block_bytes()..][..self.block_bytes()];
        let (raw, codes) = block.split_at(self.params_bytes());
        if params.block != Some(b) {
            params.scale.resize(d, 0.0);
            F16Row.decode(&raw[..2 * d], &mut params.scale);
            if self.bits != 8 {
                params.min.resize(d, 0.0);
                F16Row.decode(&raw[2 * d..4 * d], &mut params.min);
            }
            params.block = Some(b);
        }
        let crb = self.code_row_bytes();
        let row = &codes[(slot % g) * crb..][..crb];
        if self.bits == 8 {
            for ((o, &c), &s) in out.iter_mut().zip(row).zip(&params.scale) {
                *o = (c as i8) as f32 * s;
            }
        } else if self.bits == 2 {
            for (c, o) in out.iter_mut().enumerate() {
                let q = (row[c / 4] >> (2 * (c % 4))) & 3;
                *o = params.min[c] + q as f32 * params.scale[c];
            }
        } else {
            for (c2, (o, (m, s))) in out
                .chunks_exact_mut(2)
                .zip(params.min.chunks_exact(2).zip(params.scale.chunks_exact(2)))
                .enumerate()
            {
                let byte = row[c2];
                o[0] = m[0] + (byte & 0x0f) as f32 * s[0];
                o[1] = m[1] + (byte >> 4) as f32 * s[1];
            }
        }
    }
}

impl ChannelStream {
    /// Position of channel `c` in the order the SIMD unpacking yields a code row's channels
    /// ("lane order"): 8-bit: `c`; 4-bit, per 32 channels: the even ones (low nibbles of 16
    /// bytes), then the odd ones; 2-bit, per 64 channels (16 bytes): bits 0–1 of every byte
    /// (channels 4j), then bits 2–3 (4j + 1), 4–5, 6–7.
    fn lane_of(&self, c: usize) -> usize {
        match self.bits {
            8 => c,
            4 => {
                let (b, k) = (c / 32, c % 32);
                32 * b + if k % 2 == 0 { k / 2 } else { 16 + k / 2 }
            }
            _ => {
                let (b, k) = (c / 64, c % 64);
                64 * b + (k % 4) * 16 + k / 4
            }
        }
    }
}

/// `out[lane] = codes[channel_of_lane[lane]]`: a query's codes from channel order into the
/// lane order of [`ChannelStream::lane_of`] (4-bit: per 32 channels the even ones, then the odd
/// ones; 2-bit: per 64 channels, channel `4m + i` to lane `16i + m`). With AVX2 (`d` a multiple
/// of 32 at 4 bits, 64 at 2, as [`Stream::int_keys`] requires) by byte shuffles within 128-bit
/// lanes and a 64-bit (4-bit) or 32-bit (2-bit, a 4 × 4 transpose) regrouping; otherwise by the
/// table. Panics when the slices' lengths differ.
fn to_lane_order(bits: u8, codes: &[i8], channel_of_lane: &[usize], out: &mut [i8]) {
    let d = codes.len();
    assert!(out.len() == d && channel_of_lane.len() == d);
    // Channels the vector code placed: all of them with AVX2 when `d` suits, none otherwise.
    let done = crate::util::simd::simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: AVX2 enabled at compile time; every 16- or 32-byte access lies inside
        // `codes`/`out` (`i + 32 ≤ d` at 4 bits, `i + 64 ≤ d` at 2), both `d` bytes long.
        unsafe {
            use std::arch::x86_64::*;
            let (src, dst) = (codes.as_ptr(), out.as_mut_ptr());
            match bits {
                4 if d.is_multiple_of(32) => {
                    let evens_odds = _mm256_setr_epi8(
                        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                        12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                    );
                    for i in (0..d).step_by(32) {
                        let v = _mm256_loadu_si256(src.add(i) as *const __m256i);
                        // qwords: evens 0–14, odds 1–15, evens 16–30, odds 17–31.
                        let v = _mm256_shuffle_epi8(v, evens_odds);
                        let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(v);
                        _mm256_storeu_si256(dst.add(i) as *mut __m256i, v);
                    }
                    d
                }
                2 if d.is_multiple_of(64) => {
                    let by_residue =
                        _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
                    for i in (0..d).step_by(64) {
                        // Chunk k (channels 16k..16k + 16) → dword r = its channels ≡ r mod 4.
                        let ld = |k: usize| {
                            _mm_shuffle_epi8(
                                _mm_loadu_si128(src.add(i + 16 * k) as *const __m128i),
                                by_residue,
                            )
                        };
                        let (a, b, c, e) = (ld(0), ld(1), ld(2), ld(3));
                        // Transpose: output r = dword r of chunks 0, 1, 2, 3.
                        let ab_lo = _mm_unpacklo_epi32(a, b);
                        let ab_hi = _mm_unpackhi_epi32(a, b);
                        let ce_lo = _mm_unpacklo_epi32(c, e);
                        let ce_hi = _mm_unpackhi_epi32(c, e);
                        let rows = [
                            _mm_unpacklo_epi64(ab_lo, ce_lo),
                            _mm_unpackhi_epi64(ab_lo, ce_lo),
                            _mm_unpacklo_epi64(ab_hi, ce_hi),
                            _mm_unpackhi_epi64(ab_hi, ce_hi),
                        ];
                        for (r, row) in rows.iter().enumerate() {
                            _mm_storeu_si128(dst.add(i + 16 * r) as *mut __m128i, *row);
                        }
                    }
                    d
                }
                _ => 0,
            }
        },
        {
            let _ = bits;
            0
        }
    );
    for (o, &c) in out[done..].iter_mut().zip(&channel_of_lane[done..]) {
        *o = codes[c];
    }
}

/// A block's queries with the per-channel scales folded in (KIVI §3.2's per-channel scales
/// factored out of the dot product): `q'_c = q_c·s_c` quantized to int8 with one step per
/// query, `sq = max|q'|/127`, in lane order; the minimums' term `Σ_c q_c·m_c` kept in f32.
struct BlockQueries {
    /// `[nq, d]` int8 codes of `q'` in lane order.
    q8: Vec<i8>,
    /// `[nq]` steps `sq`.
    sq: Vec<f32>,
    /// `[nq]` `Σ_c q_c·m_c` (0 for 8-bit, which has no minimum).
    bias: Vec<f32>,
    /// Scratch reused from block to block (no allocation per block): `[d]` scales,
    /// minimums, `q'`, `q'`'s codes in channel order, and the channel each lane holds
    /// (empty for 8-bit, whose lane order is the channel order).
    scale: Vec<f32>,
    min: Vec<f32>,
    qp: Vec<f32>,
    codes: Vec<i8>,
    channel_of_lane: Vec<usize>,
}

/// `out[(t − r0)·nq + j] = sq_j · Σ_c q8_j[lane(c)]·code_tc + bias_j` for code rows `r0..r1`
/// of one block (`codes`: rows of `crb` bytes, `bits` 8/4/2, layouts of [`ChannelStream`]).
fn block_scores(bits: u8, codes: &[u8], crb: usize, r0: usize, r1: usize, q: &BlockQueries, out: &mut [f32]) {
    let nq = q.sq.len();
    let d = q.q8.len() / nq.max(1);
    assert!(codes.len() >= r1 * crb && out.len() >= (r1 - r0) * nq);
    crate::util::simd::simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: features enabled at compile time; rows r0..r1 lie inside `codes` (asserted),
        // and d is a multiple of 32 (8/4-bit) or 64 (2-bit) wherever this is called
        // (`int_keys`), so every 16- or 32-byte load stays inside a row.
        unsafe { chan_avx::block_scores(bits, codes, crb, d, r0, r1, q, out) },
        scalar_block_scores(bits, codes, crb, d, r0, r1, q, out)
    )
}

/// [`block_scores`] in scalar code: the path without AVX2 and the reference the SIMD kernel is
/// tested against.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(
    all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"),
    allow(dead_code) // with AVX2 only the tests call it
)]
fn scalar_block_scores(
    bits: u8,
    codes: &[u8],
    crb: usize,
    d: usize,
    r0: usize,
    r1: usize,
    q: &BlockQueries,
    out: &mut [f32],
) {
    let nq = q.sq.len();
    for r in r0..r1 {
        let row = &codes[r * crb..(r + 1) * crb];
        for j in 0..nq {
            let c = &q.q8[j * d..(j + 1) * d];
            let dot: i32 = match bits {
                8 => row.iter().zip(c).map(|(&k, &c)| k as i8 as i32 * c as i32).sum(),
                4 => (0..d / 32)
                    .map(|b| {
                        (0..16)
                            .map(|m| {
                                let k = row[16 * b + m];
                                (k & 15) as i32 * c[32 * b + m] as i32
                                    + (k >> 4) as i32 * c[32 * b + 16 + m] as i32
                            })
                            .sum::<i32>()
                    })
                    .sum(),
                _ => (0..d / 64)
                    .map(|b| {
                        (0..4)
                            .flat_map(|i| (0..16).map(move |m| (i, m)))
                            .map(|(i, m)| {
                                ((row[16 * b + m] >> (2 * i)) & 3) as i32
                                    * c[64 * b + 16 * i + m] as i32
                            })
                            .sum::<i32>()
                    })
                    .sum(),
            };
            out[(r - r0) * nq + j] = q.sq[j] * dot as f32 + q.bias[j];
        }
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod chan_avx {
    use super::BlockQueries;
    use crate::kv::intdot::avx::hsum8;
    use crate::kv::simd::avx::{dot_u8_i8, hsum, nibbles};
    use std::arch::x86_64::*;

    /// One code row against one query's lane-ordered int8 codes `c`: 8 i32 partial sums.
    #[inline(always)]
    unsafe fn row_dot(bits: u8, row: *const u8, c: *const i8, d: usize) -> __m256i {
        let mut acc = _mm256_setzero_si256();
        match bits {
            8 => {
                for b in 0..d / 32 {
                    let k = _mm256_loadu_si256(row.add(32 * b) as *const __m256i);
                    let cv = _mm256_loadu_si256(c.add(32 * b) as *const __m256i);
                    let p = dot_u8_i8(_mm256_sign_epi8(k, k), _mm256_sign_epi8(cv, k));
                    acc = _mm256_add_epi32(acc, p);
                }
            }
            4 => {
                for b in 0..d / 32 {
                    let cv = _mm256_loadu_si256(c.add(32 * b) as *const __m256i);
                    acc = _mm256_add_epi32(acc, dot_u8_i8(nibbles(row.add(16 * b)), cv));
                }
            }
            _ => {
                let m = _mm_set1_epi8(3);
                for b in 0..d / 64 {
                    let x = _mm_loadu_si128(row.add(16 * b) as *const __m128i);
                    let u0 = _mm_and_si128(x, m);
                    let u1 = _mm_and_si128(_mm_srli_epi16(x, 2), m);
                    let u2 = _mm_and_si128(_mm_srli_epi16(x, 4), m);
                    let u3 = _mm_and_si128(_mm_srli_epi16(x, 6), m);
                    let c0 = _mm256_loadu_si256(c.add(64 * b) as *const __m256i);
                    let c1 = _mm256_loadu_si256(c.add(64 * b + 32) as *const __m256i);
                    let p0 = dot_u8_i8(_mm256_set_m128i(u1, u0), c0);
                    let p1 = dot_u8_i8(_mm256_set_m128i(u3, u2), c1);
                    acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
                }
            }
        }
        acc
    }

    #[allow(clippy::too_many_arguments)]
    pub unsafe fn block_scores(
        bits: u8,
        codes: &[u8],
        crb: usize,
        d: usize,
        r0: usize,
        r1: usize,
        q: &BlockQueries,
        out: &mut [f32],
    ) {
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        if d.is_multiple_of(64) && bits == 8 {
            // 8-bit only: `attn-bench` (interleaved builds, Intel Xeon VM, 8k) measured
            // int8-channel 13.0 → 11.4 ms, int4-channel 11.7 → 11.0, but int2-channel 10.4 →
            // 11.3 (a broadcast and a variable shift per row) and `k4v2` (int4-channel keys,
            // int2 values on 256-bit code) 11.5 → 11.9: 512-bit keys beside 256-bit value
            // kernels slow the latter.
            return wide::block_scores(codes, crb, d, r0, r1, q, out);
        }
        for j in 0..q.sq.len() {
            let c = q.q8.as_ptr().add(j * d);
            column(codes, crb, (r0, r1), q, j, out, |row| row_dot(bits, row, c, d));
        }
    }

    /// Query `j`'s scores over code rows `r0..r1`, `out[(r − r0)·nq + j] = sq_j·Σ + bias_j`
    /// with `dot(row)` a row's 8 i32 partial sums: eight rows per horizontal reduction, then the
    /// rows left one at a time. Shared by the 256- and 512-bit kernels, so both finish the
    /// integer sums with the same f32 steps.
    #[inline(always)]
    pub(super) unsafe fn column(
        codes: &[u8],
        crb: usize,
        (r0, r1): (usize, usize),
        q: &BlockQueries,
        j: usize,
        out: &mut [f32],
        dot: impl Fn(*const u8) -> __m256i,
    ) {
        let nq = q.sq.len();
        let mut r = r0;
        while r + 8 <= r1 {
            let mut acc = [_mm256_setzero_ps(); 8];
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_cvtepi32_ps(dot(codes.as_ptr().add((r + k) * crb)));
            }
            let v = _mm256_fmadd_ps(
                hsum8(&acc),
                _mm256_set1_ps(q.sq[j]),
                _mm256_set1_ps(q.bias[j]),
            );
            let mut s = [0f32; 8];
            _mm256_storeu_ps(s.as_mut_ptr(), v);
            for (k, &x) in s.iter().enumerate() {
                *out.get_unchecked_mut((r + k - r0) * nq + j) = x;
            }
            r += 8;
        }
        while r < r1 {
            let d = hsum(_mm256_cvtepi32_ps(dot(codes.as_ptr().add(r * crb))));
            *out.get_unchecked_mut((r - r0) * nq + j) = q.sq[j] * d + q.bias[j];
            r += 1;
        }
    }

    /// [`block_scores`] for 8-bit codes, 64 channels a register (`d` a multiple of 64): each
    /// row's codes offset by 128 (`k ⊕ 0x80`, unsigned) and dotted with the query's codes by
    /// one AVX-512 `vpdpbusd` per 64, the sum started from `−128·Σc` ([`offset_correction`],
    /// oneDNN's s8s8 compensation), so every sum is the same integer as the AVX2 kernel's and
    /// the same f32 steps follow: the same scores to the bit.
    #[cfg(all(
        target_feature = "avx512f",
        target_feature = "avx512bw",
        target_feature = "avx512vnni"
    ))]
    mod wide {
        use super::super::BlockQueries;
        use crate::kv::simd::avx512::offset_correction;
        use std::arch::x86_64::*;

        /// Channels `64b..64b + 64` of an 8-bit code row, offset by 128 into unsigned bytes.
        #[inline(always)]
        unsafe fn codes64(row: *const u8, b: usize) -> __m512i {
            _mm512_xor_si512(
                _mm512_loadu_si512(row.add(64 * b) as *const _),
                _mm512_set1_epi8(-128),
            )
        }

        /// One code row against one query's codes `c` (`d / 64` registers) from `start` (the
        /// offset's correction): 8 i32 partial sums.
        #[inline(always)]
        unsafe fn row_dot(row: *const u8, c: &[__m512i], start: __m512i) -> __m256i {
            let mut acc = start;
            for (b, &cv) in c.iter().enumerate() {
                acc = _mm512_dpbusd_epi32(acc, codes64(row, b), cv);
            }
            _mm256_add_epi32(
                _mm512_castsi512_si256(acc),
                _mm512_extracti64x4_epi64(acc, 1),
            )
        }

        #[allow(clippy::too_many_arguments)]
        pub unsafe fn block_scores(
            codes: &[u8],
            crb: usize,
            d: usize,
            r0: usize,
            r1: usize,
            q: &BlockQueries,
            out: &mut [f32],
        ) {
            let nq = q.sq.len();
            let chunks = d / 64;
            // Up to 256 channels in registers; wider heads read the query from memory.
            let mut c = [_mm512_setzero_si512(); 4];
            let mut cv = vec![_mm512_setzero_si512(); if chunks > 4 { chunks } else { 0 }];
            for j in 0..nq {
                let qc = q.q8.as_ptr().add(j * d);
                let mut start = _mm512_setzero_si512();
                let cs: &mut [__m512i] = if chunks <= 4 {
                    &mut c[..chunks]
                } else {
                    &mut cv
                };
                for (b, x) in cs.iter_mut().enumerate() {
                    *x = _mm512_loadu_si512(qc.add(64 * b) as *const _);
                    let z = _mm512_set1_epi8(-128);
                    start = _mm512_add_epi32(start, offset_correction(z, *x));
                }
                let cs = &*cs;
                super::column(codes, crb, (r0, r1), q, j, out, |row| row_dot(row, cs, start));
            }
        }
    }
}

impl ChannelStream {
    /// [`BlockQueries`] of block `b` for the queries `qs` (`[nq, d]`).
    #[cfg(test)]
    fn block_queries(&self, b: usize, qs: &[f32]) -> BlockQueries {
        let mut bq = self.empty_block_queries(qs.len() / self.d);
        self.fill_block_queries(b, qs, &mut bq);
        bq
    }

    /// Buffers for [`fill_block_queries`](Self::fill_block_queries) with `nq` queries.
    fn empty_block_queries(&self, nq: usize) -> BlockQueries {
        let d = self.d;
        BlockQueries {
            q8: vec![0i8; nq * d],
            sq: vec![0f32; nq],
            bias: vec![0f32; nq],
            scale: vec![0f32; d],
            min: vec![0f32; d],
            qp: vec![0f32; d],
            codes: vec![0i8; d],
            // Only the integer path ([`Stream::int_keys`]: d a multiple of 32, of 64 at 2 bits)
            // reorders queries; `lane_of` is a permutation of 0..d only there.
            channel_of_lane: if self.bits == 8 || !self.int_keys() {
                Vec::new()
            } else {
                let mut ch = vec![0; d];
                for c in 0..d {
                    ch[self.lane_of(c)] = c;
                }
                ch
            },
        }
    }

    /// Fills `bq` with the [`BlockQueries`] of block `b` for the queries `qs` (`[nq, d]`).
    fn fill_block_queries(&self, b: usize, qs: &[f32], bq: &mut BlockQueries) {
        let d = self.d;
        let block = &self.blocks[b * self.block_bytes()..][..self.block_bytes()];
        let raw = &block[..self.params_bytes()];
        F16Row.decode(&raw[..2 * d], &mut bq.scale);
        if self.bits != 8 {
            F16Row.decode(&raw[2 * d..4 * d], &mut bq.min);
        }
        for (j, q) in qs.chunks_exact(d).enumerate() {
            for ((p, &a), &s) in bq.qp.iter_mut().zip(q).zip(&bq.scale) {
                *p = a * s;
            }
            let q8 = &mut bq.q8[j * d..(j + 1) * d];
            bq.sq[j] = if self.bits == 8 {
                crate::kv::simd::quantize_absmax_i8(&bq.qp, q8)
            } else {
                let s = crate::kv::simd::quantize_absmax_i8(&bq.qp, &mut bq.codes);
                to_lane_order(self.bits, &bq.codes, &bq.channel_of_lane, q8);
                s
            };
            bq.bias[j] = if self.bits == 8 {
                0.0
            } else {
                crate::kv::simd::dot(q, &bq.min)
            };
        }
    }
}

impl Stream for ChannelStream {
    fn push(&mut self, rows: &[f32]) -> usize {
        let start = self.resid.len();
        let n = rows.len() / self.d;
        self.resid.resize(start + n * 2 * self.d, 0);
        for (x, out) in rows
            .chunks_exact(self.d)
            .zip(self.resid[start..].chunks_exact_mut(2 * self.d))
        {
            F16Row.encode(x, out);
        }
        while self.resid_rows() >= self.residual + self.group {
            self.quantize_oldest_group();
        }
        0
    }

    fn decode(&self, slot: usize, out: &mut [f32]) {
        self.decode_with(slot, out, &mut BlockParams::default());
    }

    // A block's per-channel scales (and minimums) are decoded once per block, not per row; the
    // f16 residual rows go through fp16's kernel (widened in registers: the same products and
    // order as decoding them into a tile, so the same scores to the bit).
    fn dot_rows(&self, t0: usize, t1: usize, qs: &[f32], out: &mut [f32]) {
        let (d, quantized) = (self.d, self.n_blocks * self.group);
        if t1 > t0 && t0 >= quantized {
            let rows = (t0 - quantized, t1 - quantized);
            let rb = 2 * d;
            let f16 = crate::kv::simd::Widen::F16;
            if crate::kv::simd::row_dots(f16, &self.resid, rb, rows, qs, d, out) {
                return;
            }
        }
        let mut params = BlockParams::default();
        dot_rows_with(t0, t1, qs, out, self.d, |t, r| {
            self.decode_with(t, r, &mut params)
        });
    }

    /// Quantized blocks score on their codes when `d` suits the unpacking (a multiple of 32;
    /// of 64 at 2 bits); the f16 residual rows use [`dot_rows`](Stream::dot_rows).
    fn int_keys(&self) -> bool {
        self.d.is_multiple_of(if self.bits == 2 { 64 } else { 32 })
    }

    /// Per block and query, the channel scales fold into the query (`q'_c = q_c·s_c`, KIVI
    /// §3.2's per-channel factor) and the minimums into one term (`Σ_c q_c·m_c`), so a key is
    /// `Σ_c q'_c·code_c + Σ_c q_c·m_c`; `q'` is quantized to int8 (step `sq = max|q'|/127`) and
    /// dotted with the codes as integers. Error against [`dot_rows`](Stream::dot_rows): at most
    /// `sq/2 · Σ_c code_c` per key (`|code|` for 8-bit), plus f32 rounding. The `q` passed in
    /// (quantized without the scales) is not used.
    fn dot_rows_int(
        &self,
        t0: usize,
        t1: usize,
        qs: &[f32],
        _q: &crate::kv::intdot::LazyQueryI8<'_>,
        out: &mut [f32],
    ) {
        if !self.int_keys() {
            return self.dot_rows(t0, t1, qs, out);
        }
        let (d, g) = (self.d, self.group);
        let nq = qs.len() / d;
        let tq = t1.min(self.n_blocks * g).max(t0);
        let crb = self.code_row_bytes();
        let mut q = self.empty_block_queries(nq);
        let mut t = t0;
        while t < tq {
            let b = t / g;
            let end = ((b + 1) * g).min(tq);
            self.fill_block_queries(b, qs, &mut q);
            let block = &self.blocks[b * self.block_bytes()..][..self.block_bytes()];
            let codes = &block[self.params_bytes()..];
            let o = &mut out[(t - t0) * nq..(end - t0) * nq];
            block_scores(self.bits, codes, crb, t - b * g, end - b * g, &q, o);
            t = end;
        }
        if tq < t1 {
            self.dot_rows(tq, t1, qs, &mut out[(tq - t0) * nq..(t1 - t0) * nq]);
        }
    }

    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let mut params = BlockParams::default();
        axpy_rows_with(t0, t1, w, acc, self.d, |t, r| {
            self.decode_with(t, r, &mut params)
        });
    }

    fn len(&self) -> usize {
        self.n_blocks * self.group + self.resid_rows()
    }

    fn bytes(&self) -> usize {
        self.blocks.len() + self.resid.len()
    }

    fn reserved(&self) -> usize {
        self.blocks.capacity() + self.resid.capacity()
    }

    /// The quantized blocks only (the f16 residual rows are quantized a group at a time as they
    /// arrive, and keep their own buffer).
    fn reserve(&mut self, rows: usize) {
        let bytes = rows / self.group * self.block_bytes();
        crate::kv::stream::reserve_buffer(&mut self.blocks, bytes);
    }

    fn swap_remove(&mut self, _slot: usize) {
        unreachable!("KvScheme::from_str rejects eviction over per-channel keys")
    }

    fn clear(&mut self) {
        self.blocks.clear();
        self.resid.clear();
        self.n_blocks = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shuffles put every channel where [`ChannelStream::lane_of`] (the layout the score
    /// kernels unpack codes into) says, for distinct codes at several head dims.
    #[test]
    fn lane_order_matches_lane_of() {
        for bits in [4u8, 2] {
            for d in [64usize, 128, 256] {
                let s = ChannelStream::new(bits, 32, 128, d);
                let codes: Vec<i8> = (0..d).map(|c| (c as u8).wrapping_mul(37) as i8).collect();
                let bq = s.empty_block_queries(1);
                let mut out = vec![0i8; d];
                to_lane_order(bits, &codes, &bq.channel_of_lane, &mut out);
                for c in 0..d {
                    assert_eq!(out[s.lane_of(c)], codes[c], "bits {bits} d {d} channel {c}");
                }
            }
        }
    }

    /// KIVI stream: 8 tokens, group 4, residual 2 → after 8 pushes, one block of 4 quantized
    /// and 4 rows in f16 (4 < residual + group = 6 would trigger again only at 6... here 8 − 4 = 4
    /// rows remain, under 6). Channel scales by hand: channel 0 holds 1..4 → scale 4/127.
    #[test]
    fn channel_stream_groups_by_hand() {
        let d = 2;
        let mut s = ChannelStream::new(8, 4, 2, d);
        for t in 0..8 {
            s.push(&[(t + 1) as f32, -((t + 1) as f32) * 0.5]);
        }
        assert_eq!(s.n_blocks, 1);
        assert_eq!(s.len(), 8);
        // bytes: block = 2 channels × 2 (f16 scale) + 4 tokens × 2 codes = 12; resid 4 × 4 = 16.
        assert_eq!(s.bytes(), 12 + 16);
        assert_eq!(
            s.bytes(),
            Channel {
                bits: 8,
                group: 4,
                residual: 2
            }
            .stream_bytes(d, 8)
        );
        let mut out = [0f32; 2];
        s.decode(3, &mut out); // token 4: channel 0 = 4 = 127 · scale exactly
        let scale = f16_round_up(4.0 / 127.0).to_f32();
        assert_eq!(out[0], 127.0 * scale);
        s.decode(7, &mut out); // residual, exact in f16
        assert_eq!(out, [8.0, -4.0]);
    }

    /// KIVI-2 block by hand: d = 4, group 4, residual 0, so 4 tokens make one block. Channel 0
    /// holds 0, 1, 2, 3 → min 0, step 3/3 = 1 (exact in f16), codes 0..3, decoded exactly;
    /// channel 1 holds −1, 0, 0.4, 2 → min −1, step 1, codes 0, 1, 1 (1.4 rounds to 1), 3 →
    /// −1, 0, 0, 2 (error 0.4 ≤ step/2); channels 2 and 3 are 0 → step 0, code 0. Token 3's
    /// code byte: channel 0 code 3 in bits 0–1, channel 1 code 3 in bits 2–3 → 0b1111. Bytes:
    /// 4 channels × (f16 step + f16 min) = 16, plus 4 tokens × 1 code byte = 20.
    #[test]
    fn two_bit_channel_block_by_hand() {
        let mut s = ChannelStream::new(2, 4, 0, 4);
        let ch1 = [-1.0, 0.0, 0.4, 2.0];
        for (t, &c1) in ch1.iter().enumerate() {
            s.push(&[t as f32, c1, 0.0, 0.0]);
        }
        assert_eq!(s.n_blocks, 1);
        assert_eq!(s.bytes(), 20);
        let fmt = Channel {
            bits: 2,
            group: 4,
            residual: 0,
        };
        assert_eq!(fmt.stream_bytes(4, 4), 20);
        assert_eq!(s.blocks[16 + 3], 0b1111);
        let mut out = [0f32; 4];
        for (t, want) in [
            [0.0, -1.0, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0],
            [2.0, 0.0, 0.0, 0.0],
            [3.0, 2.0, 0.0, 0.0],
        ]
        .iter()
        .enumerate()
        {
            s.decode(t, &mut out);
            assert_eq!(&out, want, "token {t}");
        }
        assert!(Channel {
            bits: 2,
            group: 32,
            residual: 128
        }
        .validate(6)
        .is_err());
    }

    /// `n·d` values, a sum of two uniforms each, the first `outliers` channels of each row 8×
    /// larger (keys after RoPE have such channels: KIVI §3.1's reason for per-channel keys).
    fn random_rows(
        rng: &mut rand::rngs::StdRng,
        n: usize,
        d: usize,
        outliers: usize,
    ) -> Vec<f32> {
        use rand::Rng;
        (0..n * d)
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

    /// Per (key, query) bound of the integer path against exact dot products: in block `b` a
    /// key is `k_c = m_c + code_c·s_c`, so `q·k = Σ_c q'_c·code_c + Σ_c q_c·m_c` with
    /// `q'_c = q_c·s_c`; the fast path replaces `q'_c` by `sq·round(q'_c/sq)`, off by at most
    /// `sq/2` each (`sq = max_c|q'_c|/127`), so the score is off by at most
    /// `sq/2·Σ_c|code_c| ≤ sq/2·d·code_max` (`code_max` = 2^bits − 1, 127 for 8-bit), plus f32
    /// rounding, taken as `1e-4·(1 + Σ_c|q_c·k_c|)`. Residual (f16) rows: the f32 slack only.
    /// The scales `s_c` are read from the stored block's f16 parameters.
    fn key_bound(s: &ChannelStream, t: usize, q: &[f32], k: &[f32]) -> f64 {
        let d = s.d;
        let slack = 1e-4 * (1.0 + q.iter().zip(k).map(|(a, b)| (a * b).abs() as f64).sum::<f64>());
        if t >= s.n_blocks * s.group {
            return slack;
        }
        let block = &s.blocks[t / s.group * s.block_bytes()..];
        let mut scale = vec![0f32; d];
        F16Row.decode(&block[..2 * d], &mut scale);
        let sq = q
            .iter()
            .zip(&scale)
            .fold(0f64, |m, (a, b)| m.max((a * b).abs() as f64))
            / 127.0;
        let code_max = if s.bits == 8 { 127.0 } else { ((1 << s.bits) - 1) as f64 };
        sq / 2.0 * d as f64 * code_max + slack
    }

    /// KIVI keys scored on their codes (`dot_rows_int`) against f64 dot products of the exact
    /// queries with the rows as `decode` returns them, 8/4/2 bits, d 64/128, 1–8 queries, a
    /// range that starts inside a block and runs into the f16 residual; bound: [`key_bound`].
    /// The SIMD block kernel also equals the scalar one within f32 rounding.
    #[test]
    fn channel_scores_on_codes_within_query_rounding() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(2402_02750);
        for bits in [8u8, 4, 2] {
            for d in [64usize, 128, 192, 320] {
                for nq in [1usize, 3, 8] {
                    let n = 150;
                    let mut s = ChannelStream::new(bits, 32, 16, d);
                    s.push(&random_rows(&mut rng, n, d, 3));
                    assert!(s.int_keys() && s.n_blocks >= 3 && s.len() == n);
                    let qs = random_rows(&mut rng, nq, d, 0);
                    let q8 = crate::kv::intdot::LazyQueryI8::new(&qs, d);
                    let (t0, t1) = (5, n);
                    let mut got = vec![0f32; (t1 - t0) * nq];
                    s.dot_rows_int(t0, t1, &qs, &q8, &mut got);
                    let mut k = vec![0f32; d];
                    for t in t0..t1 {
                        s.decode(t, &mut k);
                        for j in 0..nq {
                            let q = &qs[j * d..(j + 1) * d];
                            let exact: f64 =
                                k.iter().zip(q).map(|(&a, &b)| a as f64 * b as f64).sum();
                            let bound = key_bound(&s, t, q, &k);
                            let g = got[(t - t0) * nq + j] as f64;
                            assert!(
                                (g - exact).abs() <= bound,
                                "bits={bits} d={d} nq={nq} t={t} j={j}: {g} vs {exact} ({bound})"
                            );
                        }
                    }
                    // SIMD against scalar on block 1.
                    let bq = s.block_queries(1, &qs);
                    let codes = &s.blocks[s.block_bytes() + s.params_bytes()..2 * s.block_bytes()];
                    let crb = s.code_row_bytes();
                    let (mut a, mut b) = (vec![0f32; 32 * nq], vec![0f32; 32 * nq]);
                    block_scores(bits, codes, crb, 0, 32, &bq, &mut a);
                    scalar_block_scores(bits, codes, crb, d, 0, 32, &bq, &mut b);
                    for (x, y) in a.iter().zip(&b) {
                        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
                    }
                }
            }
        }
        // 2-bit needs d a multiple of 64 for the SIMD unpacking.
        assert!(!ChannelStream::new(2, 32, 16, 32).int_keys());
        assert!(ChannelStream::new(4, 32, 16, 32).int_keys());
    }

    /// Whole attention over KIVI keys (f16 values), fast path (keys on the codes) against the
    /// exact path (keys decoded to f32), GQA groups 1, 3 and 4, decode and a prefill block.
    /// Derived bound: each logit (score/√d) moves by at most E = max over keys of
    /// [`key_bound`]/√d; logits moved by at most E move every softmax weight by a factor
    /// within [e^−2E, e^2E], so each output moves by at most (e^2E − 1)·max|v| (the value path
    /// is shared), plus f32 slack.
    #[test]
    fn channel_fast_attention_matches_exact() {
        use crate::kv::attention::{fast_and_exact, HeadView};
        use crate::kv::stream::RowStream;
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        for bits in [8u8, 4, 2] {
            for (group, n_q) in [(1usize, 1usize), (3, 1), (4, 5)] {
                let (n, d) = (120, 64);
                let mut ks = ChannelStream::new(bits, 32, 16, d);
                let mut vs = RowStream::new(F16Row, d);
                ks.push(&random_rows(&mut rng, n, d, 3));
                vs.push(&random_rows(&mut rng, n, d, 0));
                let q = random_rows(&mut rng, group * n_q, d, 0);
                let head = HeadView { k: &ks, v: &vs };
                let (fast, exact) = fast_and_exact(head, &q, group, n_q, d);
                let (mut k, mut v) = (vec![0f32; d], vec![0f32; d]);
                let mut vmax = 0f64;
                for t in 0..n {
                    vs.decode(t, &mut v);
                    vmax = v.iter().fold(vmax, |m, &a| m.max(a.abs() as f64));
                }
                for (r, qr) in q.chunks_exact(d).enumerate() {
                    let mut e = 0f64;
                    for t in 0..n {
                        ks.decode(t, &mut k);
                        e = e.max(key_bound(&ks, t, qr, &k) / (d as f64).sqrt());
                    }
                    let bound = ((2.0 * e).exp() - 1.0) * vmax + 1e-4 * vmax;
                    for i in 0..d {
                        let diff = (fast[r * d + i] - exact[r * d + i]).abs() as f64;
                        assert!(
                            diff <= bound,
                            "bits={bits} group={group} n_q={n_q} row {r}: {diff} > {bound}"
                        );
                    }
                }
            }
        }
    }
}
