//! `int8-token` (alias `int8`): symmetric int8 with one f16 absmax scale per (token, kv head),
//! `x ≈ q · scale`, `q ∈ [-127, 127]` (LLM.int8()'s row-wise absmax, Dettmers et al. 2022 §3.1;
//! vLLM's per-token int8 KV). Row: the f16 scale, then `head_dim` i8 codes: `head_dim + 2` bytes.
//! Attention can score keys on the codes ([`crate::kv::intdot`]).

use std::fmt;

use half::f16;

use super::gpu::{self, GpuFormat};
use super::contract::{Format, FormatSpec};
use crate::kv::codec::{f16_round_up, RowCodec};
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};

/// The `int8-token` format (no parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int8Token;

impl FormatSpec for Int8Token {
    const NAMES: &'static [&'static str] = &["int8", "int8-token"];
    const HELP: &'static str = "int8-token (alias int8)";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        p.none().map(|_| Int8Token)
    }
}

impl Format for Int8Token {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "int8-token")
    }
    fn row_bytes(&self, d: usize) -> usize {
        d + 2
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(RowStream::new(Int8TokenRow, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        Some(GpuFormat::per_token(gpu::INT8_TOKEN, 0, 2, 8))
    }
}

/// Symmetric int8 with one absmax scale per (token, kv head): `head_dim + 2` bytes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int8TokenRow;

impl RowCodec for Int8TokenRow {
    fn int_keys(&self) -> Option<crate::kv::intdot::IntKeys> {
        Some(crate::kv::intdot::IntKeys::Int8Token)
    }

    fn code_values(&self) -> Option<crate::kv::codeaxpy::CodeValues> {
        Some(crate::kv::codeaxpy::CodeValues::Int8Token)
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
        crate::kv::simd::i8_to_f32(&row[2..], s, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
