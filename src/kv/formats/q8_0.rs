//! `q8_0`: ggml's `Q8_0` block layout and rounding (`quantize_row_q8_0_ref` in ggml-quants.c):
//! blocks of 32 along head_dim, each an f16 scale `d = absmax/127` then 32 i8 codes
//! `round(x/d)` (computed with the f32 `d`, stored with the f16 one): 34 bytes per 32 values.
//! Attention can score keys on the codes ([`crate::kv::intdot`]).

use std::fmt;

use half::f16;

use super::gpu::{self, GpuFormat};
use super::contract::{Format, FormatSpec};
use crate::kv::codec::RowCodec;
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};

/// The `q8_0` format (no parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q8_0;

impl FormatSpec for Q8_0 {
    const NAMES: &'static [&'static str] = &["q8_0"];
    const HELP: &'static str = "q8_0";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        p.none().map(|_| Q8_0)
    }
}

impl Format for Q8_0 {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q8_0")
    }
    fn validate(&self, d: usize) -> Result<(), String> {
        ggml_blocks(d)
    }
    fn row_bytes(&self, d: usize) -> usize {
        d / 32 * 34
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(RowStream::new(Q8_0Row, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        Some(GpuFormat::per_token(gpu::Q8_0, 32, 2, 8))
    }
}

/// ggml's blocks of 32 need head_dim divisible by 32 (shared with [`super::q4_0`]).
pub(super) fn ggml_blocks(d: usize) -> Result<(), String> {
    if d.is_multiple_of(32) {
        Ok(())
    } else {
        Err(format!(
            "ggml blocks of 32 need head_dim divisible by 32 (model: {d})"
        ))
    }
}

/// ggml `Q8_0` rows: per block of 32 an f16 scale and 32 i8 codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q8_0Row;

impl RowCodec for Q8_0Row {
    fn int_keys(&self) -> Option<crate::kv::intdot::IntKeys> {
        Some(crate::kv::intdot::IntKeys::Q8_0)
    }

    fn code_values(&self) -> Option<crate::kv::codeaxpy::CodeValues> {
        Some(crate::kv::codeaxpy::CodeValues::Q8_0)
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
            crate::kv::simd::i8_to_f32(&b[2..], d, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One block by hand: d = 0.01 (f16 0.0099945068...), codes 127, −64 (−63.5 rounds away
    /// from zero), 1.
    #[test]
    fn q8_0_block_hand_values() {
        let mut x = [0f32; 32];
        x[0] = 1.27;
        x[1] = -0.635;
        x[16] = 0.01;
        let mut b = [0u8; 34];
        Q8_0Row.encode(&x, &mut b);
        let mut y = [0f32; 32];
        Q8_0Row.decode(&b, &mut y);
        let d = f16::from_f32(0.01).to_f32();
        assert_eq!(y[0], 127.0 * d);
        assert_eq!(y[1], -64.0 * d);
        assert_eq!(y[16], d);
    }
}
