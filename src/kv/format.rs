//! Row codecs: how one K or V vector (one token, one kv head: `head_dim` f32 values) is stored.
//!
//! Every cache scheme stores rows of a fixed number of bytes, so a sequence's keys (or values) for
//! one kv head are a flat byte buffer of `n_tokens * row_bytes`. The attention kernel
//! ([`super::attention`]) decodes one row at a time into a small f32 buffer and uses it at once
//! (fused dequantize + dot product), so no f32 copy of the cache is ever made.
//!
//! Layouts (all little-endian):
//! - [`F16Row`]: `head_dim` IEEE binary16 values: 2 bytes per element.
//! - [`Int8TokenRow`]: one f16 scale, then `head_dim` i8 values: symmetric absmax quantization per
//!   (token, kv head), `x ≈ q · scale`, `q ∈ [-127, 127]` (as in LLM.int8()'s row-wise absmax,
//!   Dettmers et al. 2022 §3.1, and vLLM's per-token int8 KV).
//! - [`Int4GroupRow`]: per group of `group` elements along head_dim, an f16 scale `d`, an f16
//!   zero-point `m` (the group minimum) and `group / 2` bytes holding two 4-bit codes each (element
//!   `2j` in the low nibble, `2j+1` in the high nibble): `x ≈ m + q · d`, `q ∈ [0, 15]` — asymmetric
//!   group-wise quantization as in KIVI (arXiv 2402.02750 §3.1) and ggml's `Q4_1` block layout.
//!
//! Scales and zero-points are rounded to f16 *outward* (scale up, minimum down) before the codes are
//! computed, so every element stays inside the representable range and the round-trip error is at
//! most half a quantization step: `|x − x̂| ≤ scale / 2` (plus f32 rounding).

use half::f16;

use super::spec::Fp8Kind;

/// One stored K or V row format. `encode` and `decode` work on exactly `head_dim` values.
pub trait RowCodec: Copy + Send + Sync + 'static {
    /// Bytes one row of `head_dim` elements occupies, scales and zero-points included.
    fn row_bytes(&self, head_dim: usize) -> usize;
    /// Quantizes `x` (`head_dim` f32 values) into `out` (`row_bytes(head_dim)` bytes). Returns
    /// how many values fell outside the representable range and were saturated (only formats
    /// with a fixed external scale can saturate).
    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize;
    /// Dequantizes one stored row into `out` (`head_dim` f32 values).
    fn decode(&self, row: &[u8], out: &mut [f32]);
    /// Installs an external scale (only fp8 with per-head or per-tensor scales has one).
    fn set_scale(&mut self, _scale: f32) {}
    /// The integer-dot form of this format when it is a key format attention can score on its
    /// codes ([`super::intdot`]); `None` keeps the f32 path.
    fn int_keys(&self) -> Option<super::intdot::IntKeys> {
        None
    }
}

/// IEEE binary16 storage: the FP16 baseline. 2 bytes per element, round-to-nearest-even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct F16Row;

impl RowCodec for F16Row {
    fn row_bytes(&self, head_dim: usize) -> usize {
        2 * head_dim
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        for (o, &v) in out.chunks_exact_mut(2).zip(x) {
            o.copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
        0
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        super::simd::f16_to_f32(row, out);
    }
}

/// Symmetric int8 with one absmax scale per (token, kv head): `head_dim + 2` bytes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int8TokenRow;

impl RowCodec for Int8TokenRow {
    fn int_keys(&self) -> Option<super::intdot::IntKeys> {
        Some(super::intdot::IntKeys::Int8Token)
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim + 2
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = f16_round_up(absmax / 127.0);
        out[..2].copy_from_slice(&scale.to_le_bytes());
        let s = scale.to_f32();
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        for (o, &v) in out[2..].iter_mut().zip(x) {
            *o = (v * inv).round().clamp(-127.0, 127.0) as i8 as u8;
        }
        0
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        let s = f16::from_le_bytes([row[0], row[1]]).to_f32();
        super::simd::i8_to_f32(&row[2..], s, out);
    }
}

/// Asymmetric 4-bit, group-wise along head_dim: per group an f16 scale, an f16 zero-point (the
/// group minimum) and `group / 2` packed bytes. `head_dim / group * (4 + group / 2)` bytes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int4GroupRow {
    /// Elements per group along head_dim (even; divides head_dim). Default 32.
    pub group: usize,
}

impl RowCodec for Int4GroupRow {
    fn int_keys(&self) -> Option<super::intdot::IntKeys> {
        (self.group == 32).then_some(super::intdot::IntKeys::Int4G32)
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim / self.group * (4 + self.group / 2)
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let block = 4 + self.group / 2;
        for (xs, o) in x.chunks_exact(self.group).zip(out.chunks_exact_mut(block)) {
            let (lo, hi) = xs
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            let m = f16_round_down(lo);
            let d = f16_round_up((hi - m.to_f32()) / 15.0);
            o[..2].copy_from_slice(&d.to_le_bytes());
            o[2..4].copy_from_slice(&m.to_le_bytes());
            let (mf, df) = (m.to_f32(), d.to_f32());
            let inv = if df > 0.0 { 1.0 / df } else { 0.0 };
            let code = |v: f32| ((v - mf) * inv).round().clamp(0.0, 15.0) as u8;
            for (byte, pair) in o[4..].iter_mut().zip(xs.chunks_exact(2)) {
                *byte = code(pair[0]) | (code(pair[1]) << 4);
            }
        }
        0
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        let block = 4 + self.group / 2;
        for (b, o) in row
            .chunks_exact(block)
            .zip(out.chunks_exact_mut(self.group))
        {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
            super::simd::u4_pairs_to_f32(&b[4..], d, m, o);
        }
    }
}

/// FP8 (E4M3 or E5M2) with a scale: per token (f16, stored in the row, absmax/max so nothing
/// saturates) or external (per head or per layer, fixed at the first write; values beyond
/// ±max·scale saturate to ±max and are counted). Conversion rounds to nearest even and saturates
/// to the largest finite value, as CUDA's `__nv_cvt_float_to_fp8(…, __NV_SATFINITE, …)` (via the
/// `float8` crate), so no NaN or Inf is ever stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Row {
    /// E4M3 or E5M2.
    pub kind: Fp8Kind,
    /// `None`: per-token scale stored in each row. `Some(s)`: every value is stored as `x / s`.
    pub scale: Option<f32>,
}

impl Fp8Row {
    fn code(&self, v: f32) -> u8 {
        match self.kind {
            Fp8Kind::E4M3 => float8::F8E4M3::from_f32(v).to_bits(),
            Fp8Kind::E5M2 => float8::F8E5M2::from_f32(v).to_bits(),
        }
    }
}

impl RowCodec for Fp8Row {
    fn set_scale(&mut self, scale: f32) {
        self.scale = Some(scale);
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim + if self.scale.is_none() { 2 } else { 0 }
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let max = self.kind.max();
        let (s, codes) = match self.scale {
            None => {
                let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = f16_round_up(absmax / max);
                out[..2].copy_from_slice(&s.to_le_bytes());
                (s.to_f32(), &mut out[2..])
            }
            Some(s) => (s, &mut out[..]),
        };
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        let mut saturated = 0;
        for (o, &v) in codes.iter_mut().zip(x) {
            let y = v * inv;
            if y.abs() > max {
                saturated += 1;
            }
            *o = self.code(y);
        }
        saturated
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        let (s, codes) = match self.scale {
            None => (f16::from_le_bytes([row[0], row[1]]).to_f32(), &row[2..]),
            Some(s) => (s, row),
        };
        super::simd::fp8_to_f32(codes, self.kind == Fp8Kind::E4M3, s, out);
    }
}

/// ggml's `Q8_0` block layout and rounding (`quantize_row_q8_0_ref` in ggml-quants.c): blocks of
/// 32 along head_dim, each an f16 scale `d = absmax/127` then 32 i8 codes `round(x/d)`
/// (computed with the f32 `d`, stored with the f16 one): 34 bytes per 32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q8_0Row;

impl RowCodec for Q8_0Row {
    fn int_keys(&self) -> Option<super::intdot::IntKeys> {
        Some(super::intdot::IntKeys::Q8_0)
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim / 32 * 34
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        for (xs, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            o[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
            for (q, &v) in o[2..].iter_mut().zip(xs) {
                *q = (v * id).round() as i8 as u8;
            }
        }
        0
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        for (b, o) in row.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            super::simd::i8_to_f32(&b[2..], d, o);
        }
    }
}

/// ggml's `Q4_0` block layout and rounding (`quantize_row_q4_0_ref`): blocks of 32, an f16
/// scale `d = m / −8` where `m` is the value of largest magnitude, codes
/// `min(15, trunc(x/d + 8.5))`; byte `j` holds element `j` (low nibble) and `j + 16` (high
/// nibble); value = `(q − 8) · d`. 18 bytes per 32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q4_0Row;

impl RowCodec for Q4_0Row {
    fn int_keys(&self) -> Option<super::intdot::IntKeys> {
        Some(super::intdot::IntKeys::Q4_0)
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim / 32 * 18
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        for (xs, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(18)) {
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in xs {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            o[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
            let code = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
            for j in 0..16 {
                o[2 + j] = code(xs[j]) | (code(xs[j + 16]) << 4);
            }
        }
        0
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        for (b, o) in row.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            super::simd::q4_0_to_f32(&b[2..], d, o);
        }
    }
}

/// The smallest f16 that is `>= v`, saturating at f16's maximum.
pub(crate) fn f16_round_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() < v && h != f16::MAX {
        next_toward_inf(h)
    } else {
        h
    }
}

/// The largest f16 that is `<= v`, saturating at f16's minimum.
pub(crate) fn f16_round_down(v: f32) -> f16 {
    -f16_round_up(-v)
}

/// The next f16 toward +∞ (finite, non-NaN input).
fn next_toward_inf(h: f16) -> f16 {
    let bits = h.to_bits();
    if bits == 0x8000 {
        f16::from_bits(0x0001)
    } else if bits & 0x8000 == 0 {
        f16::from_bits(bits + 1)
    } else {
        f16::from_bits(bits - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<C: RowCodec>(c: C, x: &[f32]) -> Vec<f32> {
        let mut bytes = vec![0u8; c.row_bytes(x.len())];
        c.encode(x, &mut bytes);
        let mut out = vec![0f32; x.len()];
        c.decode(&bytes, &mut out);
        out
    }

    #[test]
    fn f16_rounding_is_outward() {
        for v in [0.1f32, 1.0 / 3.0, 7.77e-3, 65000.0, 1e-7] {
            assert!(f16_round_up(v).to_f32() >= v, "{v}");
            assert!(f16_round_down(v).to_f32() <= v, "{v}");
            assert!(f16_round_down(-v).to_f32() <= -v, "{v}");
        }
    }

    /// Hand computation: absmax 2.54 → scale 0.02 (f16 rounds it up to 0.020004272...),
    /// codes round(x / scale).
    #[test]
    fn int8_token_hand_values() {
        let x = [2.54f32, -1.27, 0.0, 0.01, -2.54, 1.0, 0.5, -0.5];
        let c = Int8TokenRow;
        let mut bytes = vec![0u8; c.row_bytes(8)];
        c.encode(&x, &mut bytes);
        let scale = f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
        assert_eq!(scale, 0.020004272); // nearest f16 above 0.02
        let codes: Vec<i8> = bytes[2..].iter().map(|&b| b as i8).collect();
        // 2.54/0.020004272 = 126.97 → 127; -1.27/s = -63.49 → -63; 0.01/s = 0.4999 → 0;
        // 1.0/s = 49.99 → 50; 0.5/s = 24.99 → 25.
        assert_eq!(codes, vec![127, -63, 0, 0, -127, 50, 25, -25]);
    }

    /// Hand computation for one group of 8: min -1 (exact in f16), max 2 → d = 3/15 = 0.2,
    /// rounded up to the f16 0.2000732421875; codes round((x + 1) / d).
    #[test]
    fn int4_group_hand_values() {
        let x = [-1.0f32, 2.0, 0.0, 0.5, 1.0, -0.9, 1.9, 0.1];
        let c = Int4GroupRow { group: 8 };
        let mut bytes = vec![0u8; c.row_bytes(8)];
        assert_eq!(bytes.len(), 8);
        c.encode(&x, &mut bytes);
        let d = f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
        let m = f16::from_le_bytes([bytes[2], bytes[3]]).to_f32();
        assert_eq!(d, 0.200_073_24);
        assert_eq!(m, -1.0);
        // (x+1)/d: 0, 14.995 → 15, 4.998 → 5, 7.497 → 7, 9.996 → 10, 0.4998 → 0, 14.495 → 14,
        // 5.498 → 5
        let codes: Vec<u8> = bytes[4..].iter().flat_map(|b| [b & 0x0f, b >> 4]).collect();
        assert_eq!(codes, vec![0, 15, 5, 7, 10, 0, 14, 5]);
        let y = roundtrip(c, &x);
        assert!((y[1] - (-1.0 + 15.0 * d)).abs() < 1e-6);
    }

    /// E4M3 codes by hand (OCP FP8 spec table): 1.0 = 0x38, −2.5 = 0xC2, 448 = 0x7E (max
    /// finite), 0.0 = 0x00; with external scale 1 a value of 1000 saturates to 448 and is counted,
    /// never NaN.
    #[test]
    fn fp8_e4m3_hand_values_and_saturation() {
        let c = Fp8Row {
            kind: Fp8Kind::E4M3,
            scale: Some(1.0),
        };
        let x = [1.0f32, -2.5, 448.0, 0.0, 1000.0, -1e9, 0.3, 17.0];
        let mut b = vec![0u8; 8];
        assert_eq!(c.encode(&x, &mut b), 2);
        assert_eq!(&b[..4], &[0x38, 0xC2, 0x7E, 0x00]);
        let y = roundtrip(c, &x);
        assert_eq!(&y[..6], &[1.0, -2.5, 448.0, 0.0, 448.0, -448.0]);
        // 0.3 → nearest E4M3 is 0.3125 (1.25·2⁻²); 17 → 16 (ties-to-even between 16 and 18).
        assert_eq!(y[6], 0.3125);
        assert_eq!(y[7], 16.0);
        assert!(y.iter().all(|v| v.is_finite()));
    }

    /// ggml Q8_0 and Q4_0 on one block by hand.
    #[test]
    fn ggml_block_hand_values() {
        let mut x = [0f32; 32];
        x[0] = 1.27;
        x[1] = -0.635;
        x[16] = 0.01;
        let y = roundtrip(Q8_0Row, &x);
        // d = 0.01 (f16 0.0099945068...), codes 127, −64 (−63.5 rounds away from zero), 1
        let d = f16::from_f32(0.01).to_f32();
        assert_eq!(y[0], 127.0 * d);
        assert_eq!(y[1], -64.0 * d);
        assert_eq!(y[16], d);
        // Q4_0: max-magnitude value 1.27 → d = −0.15875; codes trunc(x/d + 8.5):
        // 1.27 → 0 (value (0−8)·d = 1.27), −0.635 → 12 (value −0.635), 0.01 → 8 (value 0).
        let y = roundtrip(Q4_0Row, &x);
        let d4 = f16::from_f32(-0.15875).to_f32();
        assert_eq!(y[0], -8.0 * d4);
        assert_eq!(y[1], 4.0 * d4);
        assert_eq!(y[16], 0.0);
    }

    #[test]
    fn zero_rows_stay_zero() {
        let x = [0f32; 64];
        assert_eq!(roundtrip(Int8TokenRow, &x), x.to_vec());
        assert_eq!(roundtrip(Int4GroupRow { group: 32 }, &x), x.to_vec());
        assert_eq!(roundtrip(F16Row, &x), x.to_vec());
    }
}
