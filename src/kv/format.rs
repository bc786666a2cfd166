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
use half::slice::HalfFloatSliceExt;

/// One stored K or V row format. `encode` and `decode` work on exactly `head_dim` values.
pub trait RowCodec: Copy + Send + Sync + 'static {
    /// Bytes one row of `head_dim` elements occupies, scales and zero-points included.
    fn row_bytes(&self, head_dim: usize) -> usize;
    /// Quantizes `x` (`head_dim` f32 values) into `out` (`row_bytes(head_dim)` bytes).
    fn encode(&self, x: &[f32], out: &mut [u8]);
    /// Dequantizes one stored row into `out` (`head_dim` f32 values).
    fn decode(&self, row: &[u8], out: &mut [f32]);
}

/// IEEE binary16 storage: the FP16 baseline. 2 bytes per element, round-to-nearest-even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct F16Row;

impl RowCodec for F16Row {
    fn row_bytes(&self, head_dim: usize) -> usize {
        2 * head_dim
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) {
        for (o, &v) in out.chunks_exact_mut(2).zip(x) {
            o.copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }

    #[inline]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        // Aligned rows (the usual case: buffers come from the allocator, rows are 2·head_dim
        // bytes) convert with half's slice routine, which uses F16C 8-wide where available.
        match bytemuck::try_cast_slice::<u8, f16>(row) {
            Ok(h) => h.convert_to_f32_slice(out),
            Err(_) => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
        }
    }
}

/// Symmetric int8 with one absmax scale per (token, kv head): `head_dim + 2` bytes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int8TokenRow;

impl RowCodec for Int8TokenRow {
    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim + 2
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) {
        let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = f16_round_up(absmax / 127.0);
        out[..2].copy_from_slice(&scale.to_le_bytes());
        let s = scale.to_f32();
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        for (o, &v) in out[2..].iter_mut().zip(x) {
            *o = (v * inv).round().clamp(-127.0, 127.0) as i8 as u8;
        }
    }

    #[inline]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        let s = f16::from_le_bytes([row[0], row[1]]).to_f32();
        for (o, &q) in out.iter_mut().zip(&row[2..]) {
            *o = (q as i8) as f32 * s;
        }
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
    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim / self.group * (4 + self.group / 2)
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) {
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
    }

    #[inline]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        let block = 4 + self.group / 2;
        for (b, o) in row
            .chunks_exact(block)
            .zip(out.chunks_exact_mut(self.group))
        {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
            for (pair, &byte) in o.chunks_exact_mut(2).zip(&b[4..]) {
                pair[0] = m + (byte & 0x0f) as f32 * d;
                pair[1] = m + (byte >> 4) as f32 * d;
            }
        }
    }
}

/// The smallest f16 that is `>= v`, saturating at f16's maximum.
fn f16_round_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() < v && h != f16::MAX {
        next_toward_inf(h)
    } else {
        h
    }
}

/// The largest f16 that is `<= v`, saturating at f16's minimum.
fn f16_round_down(v: f32) -> f16 {
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
        assert_eq!(d, 0.2000732421875);
        assert_eq!(m, -1.0);
        // (x+1)/d: 0, 14.995 → 15, 4.998 → 5, 7.497 → 7, 9.996 → 10, 0.4998 → 0, 14.495 → 14,
        // 5.498 → 5
        let codes: Vec<u8> = bytes[4..].iter().flat_map(|b| [b & 0x0f, b >> 4]).collect();
        assert_eq!(codes, vec![0, 15, 5, 7, 10, 0, 14, 5]);
        let y = roundtrip(c, &x);
        assert!((y[1] - (-1.0 + 15.0 * d)).abs() < 1e-6);
    }

    #[test]
    fn zero_rows_stay_zero() {
        let x = [0f32; 64];
        assert_eq!(roundtrip(Int8TokenRow, &x), x.to_vec());
        assert_eq!(roundtrip(Int4GroupRow { group: 32 }, &x), x.to_vec());
        assert_eq!(roundtrip(F16Row, &x), x.to_vec());
    }
}
