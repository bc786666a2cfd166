//! Asymmetric (min/max) uniform quantization parameters at any width, with the scale and
//! minimum rounded outward to f16 ([`crate::kv::codec`]): what KIVI's per-channel key blocks
//! (Liu et al. 2024, arXiv 2402.02750, §3.1) store per channel and the `int2`/`int3`/`int4-row`
//! value rows (TurboQuant's values in vLLM) store per group.

use half::f16;

use crate::kv::codec::{f16_round_down, f16_round_up};

/// Asymmetric uniform parameters for values in `[lo, hi]` at `bits` bits: the f16 minimum `m`
/// rounded down and the f16 step `s = (hi − m)/(2^bits − 1)` rounded up, so every value of the
/// range maps inside `[0, 2^bits − 1]` and `|x − (m + q·s)| ≤ s/2`. The same rounding as
/// [`crate::kv::format::Int4GroupRow`] and KIVI's 4-bit channel blocks (KIVI §3.1), for any width:
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 2-bit per-channel parameters by hand (what a KIVI int2 key block stores per channel):
    /// channel values (−1, 0.5, 2): m = −1, s = 3/3 = 1; codes round((v + 1)/1) = 0, 2 (1.5 rounds
    /// away from zero), 3.
    #[test]
    fn asym_params_two_bits_by_hand() {
        let (s, m) = asym_params(-1.0, 2.0, 2);
        assert_eq!((s.to_f32(), m.to_f32()), (1.0, -1.0));
        let codes: Vec<u8> = [-1.0f32, 0.5, 2.0]
            .iter()
            .map(|&v| asym_code(v, s, m, 2))
            .collect();
        assert_eq!(codes, [0, 2, 3]);
        // Constant channel: step 0, every code 0, decodes to the minimum.
        let (s, m) = asym_params(0.25, 0.25, 2);
        assert_eq!(s.to_f32(), 0.0);
        assert_eq!(asym_code(0.25, s, m, 2), 0);
    }
}
