//! The row-codec contract every per-token format implements, and the outward f16 rounding the
//! quantizers share.
//!
//! Every per-token scheme stores rows of a fixed number of bytes, so a sequence's keys (or
//! values) for one kv head are a flat byte buffer of `n_tokens * row_bytes`
//! ([`super::stream::RowStream`]). The attention kernel ([`super::attention`]) decodes one row at
//! a time into a small f32 buffer and uses it at once (fused dequantize + dot product), so no f32
//! copy of the cache is ever made. The codecs themselves live with their format, one file each
//! under [`super::formats`].
//!
//! Scales and zero-points are rounded to f16 *outward* (scale up, minimum down) before the codes
//! are computed, so every element stays inside the representable range and the round-trip error
//! is at most half a quantization step: `|x − x̂| ≤ scale / 2` (plus f32 rounding).

use half::f16;

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
    /// The row layout when attention can widen rows in registers ([`super::simd::row_dots`],
    /// [`super::simd::row_axpy`]: `fp16`, and `fp8` with any scale) instead of decoding them
    /// into a buffer first; the same values as [`decode`](Self::decode), so the exact path
    /// takes it too. `None` decodes.
    fn widen(&self) -> Option<super::simd::Widen> {
        None
    }
    /// The code form of this format when attention accumulates its value rows on the codes
    /// ([`super::codeaxpy`]); `None` decodes each row to f32 first.
    fn code_values(&self) -> Option<super::codeaxpy::CodeValues> {
        None
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

    #[test]
    fn f16_rounding_is_outward() {
        for v in [0.1f32, 1.0 / 3.0, 7.77e-3, 65000.0, 1e-7] {
            assert!(f16_round_up(v).to_f32() >= v, "{v}");
            assert!(f16_round_down(v).to_f32() <= v, "{v}");
            assert!(f16_round_down(-v).to_f32() <= -v, "{v}");
        }
    }
}
