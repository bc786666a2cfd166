//! `mxfp4`: OCP MXFP4 (OCP Microscaling Formats (MX) Specification v1.0, §5 and §6.3): blocks
//! of 32 consecutive values along head_dim, each one E8M0 shared scale (a power of two, the
//! exponent byte alone, bias 127, 0xFF = NaN) and 32 E2M1 elements.
//!
//! Quantization (§6.3): `X = 2^(floor(log2 amax) − emax_elem)` with `emax_elem = 2` for E2M1
//! (6 = 1.5·2²), elements `x / X` rounded to nearest even and saturated to ±6 (see
//! [`super::fp4`]). Since `amax / X ∈ [4, 8)`, a block's largest element saturates whenever its
//! mantissa puts it above 6·X (e.g. amax 7 → X = 1 → stored as 6): those are counted as
//! saturated. The exponent is clamped to E8M0's range, so an all-zero block stores byte 0
//! (2⁻¹²⁷) and zero codes.
//!
//! Non-finite input: the spec defines a NaN scale as making the whole block NaN (§5.4.1) and
//! leaves the conversion of Inf/NaN inputs to the implementation; kvbench stores a block holding
//! a NaN or ±Inf with scale 0xFF and zero codes (the block decodes to NaN), as the MX reference
//! library does for such blocks — never a saturated finite value.
//!
//! Row layout (`17·d/32` bytes): per block the E8M0 byte, then 16 bytes of codes (element `j`
//! low nibble, `j + 16` high; see [`super::fp4`]).

use std::fmt;

use super::contract::{Format, FormatSpec};
use super::fp4::{e8m0_for_amax, e8m0_to_f32, pack_block, unpack_block};
use super::gpu::{self, GpuFormat};
use crate::kv::codec::RowCodec;
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};

/// Elements per MX block (MX v1.0 §5: k = 32).
pub const MXFP4_BLOCK: usize = 32;
/// Bytes per block: the E8M0 scale and 16 bytes of codes.
pub const MXFP4_BLOCK_BYTES: usize = 1 + MXFP4_BLOCK / 2;

/// The `mxfp4` format (no parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mxfp4;

impl FormatSpec for Mxfp4 {
    const NAMES: &'static [&'static str] = &["mxfp4"];
    const HELP: &'static str = "mxfp4";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        p.none().map(|_| Mxfp4)
    }
}

impl Format for Mxfp4 {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mxfp4")
    }
    /// Refuses a head_dim that blocks of 32 do not divide (no partial blocks are stored).
    fn validate(&self, d: usize) -> Result<(), String> {
        if d.is_multiple_of(MXFP4_BLOCK) && d > 0 {
            Ok(())
        } else {
            Err(format!(
                "mxfp4 blocks of {MXFP4_BLOCK} need head_dim divisible by {MXFP4_BLOCK} \
                 (model: {d})"
            ))
        }
    }
    fn suggests_alternatives(&self) -> bool {
        true
    }
    fn row_bytes(&self, d: usize) -> usize {
        Mxfp4Row.row_bytes(d)
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(RowStream::new(Mxfp4Row, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        Some(GpuFormat::per_token(gpu::MXFP4, MXFP4_BLOCK, 1, 4))
    }
}

/// MXFP4 rows: per block of 32 an E8M0 byte and 16 code bytes; `17 · head_dim / 32` bytes
/// (head_dim a multiple of 32, see [`Mxfp4::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mxfp4Row;

impl RowCodec for Mxfp4Row {
    fn int_keys(&self) -> Option<crate::kv::intdot::IntKeys> {
        Some(crate::kv::intdot::IntKeys::Mxfp4)
    }

    fn code_values(&self) -> Option<crate::kv::codeaxpy::CodeValues> {
        Some(crate::kv::codeaxpy::CodeValues::Mxfp4)
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim / MXFP4_BLOCK * MXFP4_BLOCK_BYTES
    }

    /// Encodes `x` (`head_dim` f32). Returns how many elements exceeded ±6·X and were
    /// saturated to ±6·X (MX §6.3's clamp).
    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let mut saturated = 0;
        for (xs, o) in x
            .chunks_exact(MXFP4_BLOCK)
            .zip(out.chunks_exact_mut(MXFP4_BLOCK_BYTES))
        {
            if xs.iter().any(|v| !v.is_finite()) {
                o[0] = 0xFF;
                o[1..].fill(0);
                continue;
            }
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            o[0] = e8m0_for_amax(amax);
            saturated += pack_block(xs, e8m0_to_f32(o[0]), &mut o[1..]);
        }
        saturated
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        for (b, o) in row
            .chunks_exact(MXFP4_BLOCK_BYTES)
            .zip(out.chunks_exact_mut(MXFP4_BLOCK))
        {
            unpack_block(&b[1..], e8m0_to_f32(b[0]), o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(x: &[f32]) -> (Vec<u8>, usize) {
        let mut b = vec![0u8; Mxfp4Row.row_bytes(x.len())];
        let sat = Mxfp4Row.encode(x, &mut b);
        (b, sat)
    }

    /// Nibbles of a block in element order (element j low nibble of byte j, j + 16 high).
    fn codes(b: &[u8]) -> Vec<u8> {
        let mut c = vec![0u8; 32];
        for j in 0..16 {
            c[j] = b[j] & 15;
            c[j + 16] = b[j] >> 4;
        }
        c
    }

    /// Byte counts by hand: d = 64 → 2·17 = 34; d = 128 → 68; head_dim 80 is refused.
    #[test]
    fn bytes_and_head_dims_by_hand() {
        assert_eq!(Mxfp4.row_bytes(64), 34);
        assert_eq!(Mxfp4.row_bytes(128), 68);
        let e = Mxfp4.validate(80).unwrap_err();
        assert!(e.contains("divisible by 32") && e.contains("80"), "{e}");
        assert!(Mxfp4.validate(96).is_ok());
    }

    /// Blocks by hand (MX v1.0 §6.3). Block 0: amax 6 → X = 2^(2 − 2) = 1 (byte 127): 6 lands
    /// exactly on 6·X (code 7), −0.5 → 0x9, and the ties 0.25 → 0, 1.25 → 1 (code 2), 2.5 → 2
    /// (4), 3.5 → 4 (6), 5 → 4 (6), −1.75 → −2 (0xC). Block 1: amax 0.375 = 1.5·2⁻² → X = 2⁻⁴
    /// (byte 123), y = 16x: 0.375 → 6 (7), 0.1 → 1.6 → 1.5 (3), −0.03 → −0.48 → −0.5 (9).
    #[test]
    fn two_blocks_by_hand() {
        let mut x = [0f32; 64];
        x[..9].copy_from_slice(&[6.0, -0.5, 0.25, 1.25, 2.5, 3.5, 5.0, -1.75, 0.75]);
        x[32] = 0.375;
        x[50] = 0.1;
        x[63] = -0.03;
        let (b, sat) = encode(&x);
        assert_eq!((b.len(), sat), (34, 0));
        assert_eq!(b[0], 127);
        let mut want = vec![0u8; 32];
        want[..9].copy_from_slice(&[7, 9, 0, 2, 4, 6, 6, 0xC, 2]);
        assert_eq!(codes(&b[1..17]), want);
        assert_eq!(b[17], 123);
        let mut want = vec![0u8; 32];
        want[0] = 7;
        want[18] = 3;
        want[31] = 9;
        assert_eq!(codes(&b[18..34]), want);
        let mut y = [0f32; 64];
        Mxfp4Row.decode(&b, &mut y);
        assert_eq!(&y[..9], &[6.0, -0.5, 0.0, 1.0, 2.0, 4.0, 4.0, -2.0, 1.0]);
        assert_eq!((y[32], y[50], y[63]), (0.375, 0.09375, -0.03125));
    }

    /// Saturation: amax 7 → X = 1 (byte 127), 7 → 6 and −6.5 → −6, both counted; 5.9 → 6 is
    /// rounding, not counted. amax 12 → X = 2 (byte 128): 12 → 6·2 exactly.
    #[test]
    fn saturation_by_hand() {
        let mut x = [0f32; 32];
        x[0] = 7.0;
        x[1] = -6.5;
        x[2] = 5.9;
        let (b, sat) = encode(&x);
        assert_eq!((b[0], sat), (127, 2));
        assert_eq!(codes(&b[1..])[..3], [7, 0xF, 7]);
        x[0] = 12.0;
        let (b, sat) = encode(&x);
        assert_eq!((b[0], sat), (128, 0));
        assert_eq!(codes(&b[1..])[..3], [7, 0xD, 5]); // −6.5/2 = −3.25 → −3; 5.9/2 → 3
    }

    /// All zeros: byte 0 (2⁻¹²⁷, the clamped exponent), zero codes, zeros decoded. NaN or Inf
    /// in a block: scale 0xFF, the block decodes to NaN; the other block (all 1.0: X = 2⁻², byte
    /// 125, codes 4 → 6) is unaffected.
    #[test]
    fn zero_and_non_finite_blocks() {
        let (b, sat) = encode(&[0f32; 32]);
        assert_eq!((sat, b), (0, vec![0u8; 17]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = [1f32; 64];
            x[40] = bad;
            let (b, _) = encode(&x);
            assert_eq!((b[0], b[17]), (125, 0xFF), "{bad}");
            let mut y = [0f32; 64];
            Mxfp4Row.decode(&b, &mut y);
            assert!(y[..32].iter().all(|&v| v == 1.0));
            assert!(y[32..].iter().all(|v| v.is_nan()), "{bad}");
        }
    }
}
