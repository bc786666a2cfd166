//! `q4_0`: ggml's `Q4_0` block layout and rounding (`quantize_row_q4_0_ref` in ggml-quants.c):
//! blocks of 32, an f16 scale `d = m / −8` where `m` is the value of largest magnitude, codes
//! `min(15, trunc(x/d + 8.5))`; byte `j` holds element `j` (low nibble) and `j + 16` (high
//! nibble); value = `(q − 8) · d`. 18 bytes per 32 values. Attention can score keys on the codes
//! ([`crate::kv::intdot`]).

use std::fmt;

use half::f16;

use super::gpu::{self, GpuFormat};
use super::contract::{Format, FormatSpec};
use crate::kv::codec::RowCodec;
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};

/// The `q4_0` format (no parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q4_0;

impl FormatSpec for Q4_0 {
    const NAMES: &'static [&'static str] = &["q4_0"];
    const HELP: &'static str = "q4_0";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        p.none().map(|_| Q4_0)
    }
}

impl Format for Q4_0 {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q4_0")
    }
    fn validate(&self, d: usize) -> Result<(), String> {
        super::q8_0::ggml_blocks(d)
    }
    fn row_bytes(&self, d: usize) -> usize {
        d / 32 * 18
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(RowStream::new(Q4_0Row, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        Some(GpuFormat::per_token(gpu::Q4_0, 32, 2, 4))
    }
}

/// ggml `Q4_0` rows: per block of 32 an f16 scale and 16 bytes of nibbles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q4_0Row;

impl RowCodec for Q4_0Row {
    fn int_keys(&self) -> Option<crate::kv::intdot::IntKeys> {
        Some(crate::kv::intdot::IntKeys::Q4_0)
    }

    fn code_values(&self) -> Option<crate::kv::codeaxpy::CodeValues> {
        Some(crate::kv::codeaxpy::CodeValues::Q4_0)
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
            crate::kv::simd::q4_0_to_f32(&b[2..], d, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One block by hand: max-magnitude value 1.27 → d = −0.15875; codes trunc(x/d + 8.5):
    /// 1.27 → 0 (value (0−8)·d = 1.27), −0.635 → 12 (value −0.635), 0.01 → 8 (value 0).
    #[test]
    fn q4_0_block_hand_values() {
        let mut x = [0f32; 32];
        x[0] = 1.27;
        x[1] = -0.635;
        x[16] = 0.01;
        let mut b = [0u8; 18];
        Q4_0Row.encode(&x, &mut b);
        let mut y = [0f32; 32];
        Q4_0Row.decode(&b, &mut y);
        let d4 = f16::from_f32(-0.15875).to_f32();
        assert_eq!(y[0], -8.0 * d4);
        assert_eq!(y[1], 4.0 * d4);
        assert_eq!(y[16], 0.0);
    }
}
