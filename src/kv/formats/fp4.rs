//! The FP4 element codec shared by [`super::nvfp4`] and [`super::mxfp4`]: E2M1 codes, their
//! nibble packing, and the two scale encodings (E4M3 for NVFP4, E8M0 for MX).
//!
//! E2M1 (OCP Microscaling Formats (MX) Specification v1.0, §5.3.3): 1 sign bit, 2 exponent bits
//! (bias 1), 1 mantissa bit, no Inf or NaN; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 for the codes
//! 0–7, bit 3 the sign. Conversion from f32 ([`e2m1_code`]) rounds to nearest, ties to even
//! (the code with mantissa bit 0), and saturates finite values beyond ±6 to ±6 (MX v1.0 §6.3:
//! "values are rounded … and clamped to the element format's maximum normal").
//!
//! Packing (kvbench's layout; the MX spec leaves it to the implementation): a block of `B`
//! elements is `B / 2` bytes, byte `j` holding element `j` in its low nibble and element
//! `j + B/2` in its high nibble — ggml's Q4_0 order, so unpacking the low nibbles then the high
//! ones gives the elements in order (what [`crate::kv::intdot`]'s AVX2 path relies on).

/// The value of each E2M1 code (`[16]`, index = the 4-bit code).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Twice each E2M1 code's value (`[16]` i8: 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12): the integers the
/// integer attention path multiplies query codes with ([`crate::kv::intdot`]); the factor ½ is
/// folded into the block scale.
pub const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// The E2M1 code of a finite `y` (a value already divided by its scale): round to nearest,
/// ties to even, finite values beyond ±6 saturated to ±6; the sign bit is `y`'s (so `-0.1`
/// becomes −0, code 8). The midpoints between neighbours (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5)
/// go to the neighbour whose mantissa bit is 0 (the even code). Callers handle NaN/Inf before.
#[inline]
pub fn e2m1_code(y: f32) -> u8 {
    let a = y.abs();
    let m = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    ((y.is_sign_negative() as u8) << 3) | m
}

/// Packs the codes of one block (`x.len()` = `B` values, each divided by `scale`) into
/// `out` (`B / 2` bytes, element `j` low nibble, `j + B/2` high nibble). `scale == 0` stores
/// zeros. Returns how many `|x / scale|` exceeded 6 and were saturated.
pub fn pack_block(x: &[f32], scale: f32, out: &mut [u8]) -> usize {
    let half = x.len() / 2;
    let mut saturated = 0;
    let mut code = |v: f32| {
        if scale == 0.0 {
            return 0;
        }
        let y = v / scale;
        saturated += (y.abs() > E2M1_MAX) as usize;
        e2m1_code(y)
    };
    for j in 0..half {
        let lo = code(x[j]);
        out[j] = lo | (code(x[j + half]) << 4);
    }
    saturated
}

/// Decodes one packed block (`codes`: `out.len() / 2` bytes) times `scale` into `out`.
#[inline(always)]
pub fn unpack_block(codes: &[u8], scale: f32, out: &mut [f32]) {
    let half = out.len() / 2;
    for j in 0..half {
        let b = codes[j];
        out[j] = E2M1[(b & 15) as usize] * scale;
        out[j + half] = E2M1[(b >> 4) as usize] * scale;
    }
}

/// The value of an E8M0 scale byte (MX v1.0 §5.4.1): `2^(b − 127)` for `b` in 0..=254
/// (`b = 0` is 2⁻¹²⁷, an f32 subnormal), NaN for 0xFF.
#[inline(always)]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        b => f32::from_bits((b as u32) << 23),
    }
}

/// The E8M0 scale byte MX v1.0 §6.3 gives a block whose largest magnitude is `amax` (finite,
/// ≥ 0) for E2M1 elements: `X = 2^(floor(log2 amax) − 2)` (`emax_elem = 2`, 6 = 1.5·2²), its
/// exponent clamped to E8M0's range; `amax = 0` (and every `amax < 2⁻¹²⁵`) gives the smallest
/// scale 2⁻¹²⁷ (byte 0), as the clamp does. `floor(log2 amax)` is read exactly from the f32
/// exponent field (subnormal `amax` is below 2⁻¹²⁶ and clamps anyway).
#[inline]
pub fn e8m0_for_amax(amax: f32) -> u8 {
    let biased = (amax.to_bits() >> 23) & 0xff; // floor(log2 amax) + 127 for normal amax
    biased.saturating_sub(2) as u8
}

/// The E4M3 byte of `v` (OCP FP8 E4M3FN), rounded to nearest even and saturated to ±448, as
/// CUDA's `__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)`.
#[inline]
pub fn e4m3_code(v: f32) -> u8 {
    float8::F8E4M3::from_f32(v).to_bits()
}

/// The value of an E4M3 byte (never 0x7F/0xFF, the NaNs, when written by [`e4m3_code`] from a
/// finite value), from a 256-entry table (the float8 crate's conversion is a branchy software
/// path; the attention kernels call this once per block of 16 or 32 values).
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    E4M3_VALUES[b as usize]
}

/// Every E4M3 byte's value, filled from the float8 crate's `F8E4M3::to_f32` (an independent
/// implementation of OCP FP8 E4M3FN) at first use.
static E4M3_VALUES: std::sync::LazyLock<[f32; 256]> = std::sync::LazyLock::new(|| {
    std::array::from_fn(|b| float8::F8E4M3::from_bits(b as u8).to_f32())
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Every E2M1 code by hand (MX v1.0 table of E2M1 values), each value round-trips to its
    /// code, and the ties go to the even code: 0.25 → 0, 0.75 → 1.0, 1.25 → 1.0, 1.75 → 2,
    /// 2.5 → 2, 3.5 → 4, 5 → 4; beyond 6 saturates to 6.
    #[test]
    fn e2m1_codes_by_hand() {
        for (c, &v) in E2M1.iter().enumerate() {
            assert_eq!(e2m1_code(v), c as u8, "{v}");
            assert_eq!(E2M1_X2[c] as f32, 2.0 * v);
        }
        let ties = [
            (0.25, 0x0),
            (0.75, 0x2),
            (1.25, 0x2),
            (1.75, 0x4),
            (2.5, 0x4),
            (3.5, 0x6),
            (5.0, 0x6),
            (-0.75, 0xA),
            (-5.0, 0xE),
        ];
        for (v, c) in ties {
            assert_eq!(e2m1_code(v), c, "{v}");
        }
        // Just off the midpoints: the nearer neighbour.
        assert_eq!(e2m1_code(0.2500001), 0x1);
        assert_eq!(e2m1_code(4.9999), 0x6);
        assert_eq!(e2m1_code(5.0001), 0x7);
        assert_eq!(e2m1_code(7.9), 0x7);
        assert_eq!(e2m1_code(-1e30), 0xF);
        assert_eq!(e2m1_code(-0.1), 0x8);
    }

    /// E8M0 by hand: byte 127 = 1, 130 = 8, 0 = 2⁻¹²⁷, 0xFF = NaN; the MX scale of amax 6 is
    /// 2^(2 − 2) = 1 (byte 127), of 7 also 1, of 8 is 2 (byte 128), of 0.375 = 1.5·2⁻² is 2⁻⁴
    /// (byte 123); amax 0 gives byte 0.
    #[test]
    fn e8m0_by_hand() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(130), 8.0);
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert!(e8m0_to_f32(255).is_nan());
        assert_eq!(e8m0_for_amax(6.0), 127);
        assert_eq!(e8m0_for_amax(7.0), 127);
        assert_eq!(e8m0_for_amax(8.0), 128);
        assert_eq!(e8m0_for_amax(0.375), 123);
        assert_eq!(e8m0_for_amax(0.0), 0);
        assert_eq!(e8m0_for_amax(f32::MAX), 252);
    }
}
