//! `nvfp4`: NVIDIA's NVFP4 (E2M1 values, one FP8 E4M3 scale per 16 consecutive values along
//! head_dim, and an f32 second-level scale), per token.
//!
//! The format (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149 §2;
//! Transformer Engine's NVFP4 recipe documentation; TensorRT-Model-Optimizer's `NVFP4QTensor`):
//! `x ≈ e2m1 · s_block · s_global`, where the f32 `s_global = amax / (6 · 448)` maps the block
//! scales `block_amax / (6 · s_global)` into E4M3's range (the largest block scale lands on
//! 448), and the elements are `x / (s_block · s_global)` rounded to E2M1.
//!
//! **Where the f32 scale lives (kvbench's choice).** NVIDIA computes `s_global` per tensor from
//! its amax: offline for weights, from calibration for activations, and vLLM's NVFP4 KV cache
//! takes static per-layer K/V scales from the checkpoint (ModelOpt calibration). A KV cache
//! grows token by token, so a per-tensor amax is not known when the first row is written, and a
//! fixed one either clips later outliers or wastes E4M3 range. kvbench takes the amax **per
//! row** (one token of one kv head, the granularity of its fp8 and int8 caches): each row
//! carries its own f32 `s_global`, nothing is calibrated, nothing saturates beyond E2M1's own
//! rounding, and rows never need re-encoding when later tokens are larger. The cost is 4 bytes
//! per row (0.5 bit per element at head_dim 64, 0.25 at 128) on top of NVFP4's 4.5 bits, and
//! the quality is an upper bound on what a calibrated per-tensor scale gives (whose block scales
//! sit lower in E4M3 and round more coarsely).
//!
//! Row layout (`4 + 9·d/16` bytes): `s_global` (f32 LE), then per block of 16 one E4M3 byte
//! and 8 bytes of codes (element `j` low nibble, `j + 8` high; see [`super::fp4`]).
//!
//! Non-finite input (E2M1 has no Inf or NaN): a row holding a NaN or ±Inf is stored with
//! `s_global = NaN` and zero codes, so it decodes to NaN (the bad value stays visible rather
//! than being saturated into a plausible number). An all-zero row stores `s_global = 0`.

use std::fmt;

use super::contract::{Format, FormatSpec};
use super::fp4::{e2m1_code, e4m3_code, e4m3_to_f32, unpack_block, E2M1_MAX};
use super::gpu::{self, GpuFormat};
use crate::kv::codec::RowCodec;
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};

/// Elements per NVFP4 block (one E4M3 scale each).
pub const NVFP4_BLOCK: usize = 16;
/// Bytes per block: the E4M3 scale and 8 bytes of codes.
pub const NVFP4_BLOCK_BYTES: usize = 1 + NVFP4_BLOCK / 2;
/// Largest E4M3 magnitude.
const E4M3_MAX: f32 = 448.0;

/// The `nvfp4` format (no parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvfp4;

impl FormatSpec for Nvfp4 {
    const NAMES: &'static [&'static str] = &["nvfp4"];
    const HELP: &'static str = "nvfp4";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        p.none().map(|_| Nvfp4)
    }
}

impl Format for Nvfp4 {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nvfp4")
    }
    /// Refuses a head_dim that blocks of 16 do not divide (no partial blocks are stored).
    fn validate(&self, d: usize) -> Result<(), String> {
        if d.is_multiple_of(NVFP4_BLOCK) && d > 0 {
            Ok(())
        } else {
            Err(format!(
                "nvfp4 blocks of {NVFP4_BLOCK} need head_dim divisible by {NVFP4_BLOCK} \
                 (model: {d})"
            ))
        }
    }
    fn suggests_alternatives(&self) -> bool {
        true
    }
    fn row_bytes(&self, d: usize) -> usize {
        Nvfp4Row.row_bytes(d)
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(RowStream::new(Nvfp4Row, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        Some(GpuFormat {
            head: 4,
            ..GpuFormat::per_token(gpu::NVFP4, NVFP4_BLOCK, 1, 4)
        })
    }
}

/// NVFP4 rows: `s_global` (f32), then per block of 16 an E4M3 scale byte and 8 code bytes.
/// `4 + 9 · head_dim / 16` bytes per row (head_dim a multiple of 16, see [`Nvfp4::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvfp4Row;

impl Nvfp4Row {
    /// `s_global` for a row whose largest magnitude is `amax` (finite): `amax / (6 · 448)`.
    pub fn global_scale(amax: f32) -> f32 {
        amax / (E2M1_MAX * E4M3_MAX)
    }
}

impl RowCodec for Nvfp4Row {
    fn int_keys(&self) -> Option<crate::kv::intdot::IntKeys> {
        Some(crate::kv::intdot::IntKeys::Nvfp4)
    }

    fn code_values(&self) -> Option<crate::kv::codeaxpy::CodeValues> {
        Some(crate::kv::codeaxpy::CodeValues::Nvfp4)
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        4 + head_dim / NVFP4_BLOCK * NVFP4_BLOCK_BYTES
    }

    /// Encodes `x` (`head_dim` f32). Returns how many elements exceeded ±6 after division by
    /// their (E4M3-rounded) block scale and were saturated to ±6 (a block scale rounded down
    /// by E4M3 can push the block's largest element just past 6).
    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let (head, blocks) = out.split_at_mut(4);
        if x.iter().any(|v| !v.is_finite()) {
            head.copy_from_slice(&f32::NAN.to_le_bytes());
            blocks.fill(0);
            return 0;
        }
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let g = Self::global_scale(amax);
        head.copy_from_slice(&g.to_le_bytes());
        let mut saturated = 0;
        for (xs, o) in x
            .chunks_exact(NVFP4_BLOCK)
            .zip(blocks.chunks_exact_mut(NVFP4_BLOCK_BYTES))
        {
            let bmax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sb = if g > 0.0 {
                e4m3_code(bmax / (E2M1_MAX * g))
            } else {
                0
            };
            o[0] = sb;
            let denom = e4m3_to_f32(sb) * g;
            let half = NVFP4_BLOCK / 2;
            for j in 0..half {
                let mut code = |v: f32| {
                    if denom == 0.0 {
                        return 0;
                    }
                    let y = v / denom;
                    saturated += (y.abs() > E2M1_MAX) as usize;
                    e2m1_code(y)
                };
                let lo = code(xs[j]);
                o[1 + j] = lo | (code(xs[j + half]) << 4);
            }
        }
        saturated
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        let g = f32::from_le_bytes([row[0], row[1], row[2], row[3]]);
        for (b, o) in row[4..]
            .chunks_exact(NVFP4_BLOCK_BYTES)
            .zip(out.chunks_exact_mut(NVFP4_BLOCK))
        {
            unpack_block(&b[1..], e4m3_to_f32(b[0]) * g, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(x: &[f32]) -> (Vec<u8>, usize) {
        let mut b = vec![0u8; Nvfp4Row.row_bytes(x.len())];
        let sat = Nvfp4Row.encode(x, &mut b);
        (b, sat)
    }

    fn decode(b: &[u8], d: usize) -> Vec<f32> {
        let mut y = vec![0f32; d];
        Nvfp4Row.decode(b, &mut y);
        y
    }

    /// Nibbles of a block in element order (element j low nibble of byte j, j + 8 high).
    fn codes(b: &[u8]) -> Vec<u8> {
        let mut c = vec![0u8; 16];
        for j in 0..8 {
            c[j] = b[j] & 15;
            c[j + 8] = b[j] >> 4;
        }
        c
    }

    /// Byte counts by hand: d = 64 → 4 + 4·9 = 40; d = 128 → 4 + 8·9 = 76; head_dim 80 is
    /// stored (5 blocks, 49 bytes), 72 is refused with the reason.
    #[test]
    fn bytes_and_head_dims_by_hand() {
        assert_eq!(Nvfp4.row_bytes(64), 40);
        assert_eq!(Nvfp4.row_bytes(128), 76);
        assert_eq!(Nvfp4.row_bytes(80), 49);
        assert!(Nvfp4.validate(80).is_ok());
        let e = Nvfp4.validate(72).unwrap_err();
        assert!(e.contains("divisible by 16") && e.contains("72"), "{e}");
    }

    /// Two blocks by hand (d = 32). Row amax 2.625 = 2688 · 2⁻¹⁰ → s_global = 2⁻¹⁰ exactly.
    /// Block 0 (amax 2.625): block scale 2.625 / (6 · 2⁻¹⁰) = 448 (E4M3 0x7E: 1.75·2⁸, its max), the
    /// element 2.625 → 2.625 / (448 · 2⁻¹⁰) = 6 exactly (code 7), −1.3125 → −3 (code 0xD),
    /// 0.4375 → 1 (code 2). Block 1 (amax 0.375): scale 0.375 · 1024 / 6 = 64 (E4M3 0x68: 1.0·2⁶),
    /// so y = x · 16: 0.375 → 6 (7), 0.09375 → 1.5 (3), and the ties 0.015625 → 0.25 → 0,
    /// 0.046875 → 0.75 → 1 (2), 0.078125 → 1.25 → 1 (2), 0.109375 → 1.75 → 2 (4),
    /// 0.15625 → 2.5 → 2 (4), 0.21875 → 3.5 → 4 (6), 0.3125 → 5 → 4 (6), −0.1875 → −3 (0xD).
    #[test]
    fn two_blocks_by_hand() {
        let mut x = [0f32; 32];
        x[0] = 2.625;
        x[1] = -1.3125;
        x[9] = 0.4375;
        let b1 = [
            0.375, 0.09375, 0.015625, 0.046875, 0.078125, 0.109375, 0.15625, 0.21875, 0.3125,
            -0.1875,
        ];
        x[16..26].copy_from_slice(&b1);
        let (b, sat) = encode(&x);
        assert_eq!(sat, 0);
        assert_eq!(b.len(), 4 + 18);
        assert_eq!(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), 2f32.powi(-10));
        assert_eq!(b[4], 0x7E);
        let mut want0 = [0u8; 16];
        want0[0] = 7;
        want0[1] = 0xD;
        want0[9] = 2;
        assert_eq!(codes(&b[5..13]), want0);
        assert_eq!(b[13], 0x68);
        let mut want1 = [0u8; 16];
        want1[..10].copy_from_slice(&[7, 3, 0, 2, 2, 4, 4, 6, 6, 0xD]);
        assert_eq!(codes(&b[14..22]), want1);
        let y = decode(&b, 32);
        assert_eq!(y[0], 2.625);
        assert_eq!(y[1], -1.3125);
        assert_eq!(&y[16..26], &[0.375, 0.09375, 0.0, 0.0625, 0.0625, 0.125, 0.125, 0.25, 0.25, -0.1875]);
    }

    /// A block scale E4M3 rounds down pushes the block's max past 6: row amax 2.625
    /// (s_global 2⁻¹⁰), block amax 0.33 → 0.33 · 1024 / 6 = 56.32 → E4M3 56 (0x66: 1.75·2⁵);
    /// 0.33 / (56 · 2⁻¹⁰) = 6.034 → saturated to 6 and counted. Block amax 0.3 → 51.2 → 52
    /// (0x65: 1.625·2⁵, up), 0.3 → 5.908 → 6, not counted.
    #[test]
    fn saturation_after_block_scale_rounding() {
        let mut x = [0f32; 48];
        x[0] = 2.625;
        x[16] = 0.33;
        x[32] = 0.3;
        let (b, sat) = encode(&x);
        assert_eq!(sat, 1);
        assert_eq!(b[4 + 9], 0x66);
        assert_eq!(b[4 + 10] & 15, 7);
        assert_eq!(b[4 + 18], 0x65);
        assert_eq!(b[4 + 19] & 15, 7);
        let y = decode(&b, 48);
        assert_eq!(y[16], 6.0 * 56.0 / 1024.0);
        assert_eq!(y[32], 6.0 * 52.0 / 1024.0);
    }

    /// All zeros: s_global 0, scales 0, codes 0, decoded zeros. NaN or Inf anywhere: the row
    /// decodes to NaN (s_global NaN), never to a finite stand-in.
    #[test]
    fn zero_and_non_finite_rows() {
        let (b, sat) = encode(&[0f32; 16]);
        assert_eq!((sat, b), (0, vec![0u8; 13]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = [1f32; 16];
            x[3] = bad;
            let (b, _) = encode(&x);
            assert!(f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_nan());
            assert!(decode(&b, 16).iter().all(|v| v.is_nan()), "{bad}");
        }
    }
}
