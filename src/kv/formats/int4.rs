//! `int4[:group=G]` (alias `int4-token`): asymmetric 4-bit along head_dim, per group of `G`
//! elements an f16 scale `d`, an f16 zero-point `m` (the group minimum) and `G / 2` bytes of two
//! codes each (element `2j` low nibble, `2j+1` high): `x ≈ m + q · d`, `q ∈ [0, 15]` — KIVI's
//! group-wise quantization (arXiv 2402.02750 §3.1) in ggml's `Q4_1` block layout.
//! `head_dim / G · (4 + G / 2)` bytes per row.

use std::fmt;

use half::f16;

use super::gpu::{self, GpuFormat};
use super::contract::{Format, FormatSpec};
use crate::kv::codec::{f16_round_down, f16_round_up, RowCodec};
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};

/// Default int4 group size along head_dim (KIVI's and ggml's 32).
pub const DEFAULT_INT4_GROUP: usize = 32;

/// The `int4` format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int4 {
    /// Elements per group along head_dim (even, > 0; must divide head_dim).
    pub group: usize,
}

impl FormatSpec for Int4 {
    const NAMES: &'static [&'static str] = &["int4", "int4-token"];
    const HELP: &'static str = "int4[:group=G]";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        let mut group = DEFAULT_INT4_GROUP;
        for &(k, v) in &p.pairs {
            match k {
                "group" => group = p.num(k, v)?,
                _ => return Err(p.unknown(k, "group=G")),
            }
        }
        if group == 0 || !group.is_multiple_of(2) {
            return Err(format!("int4 group {group} must be even and > 0"));
        }
        Ok(Int4 { group })
    }
}

impl Format for Int4 {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.group {
            DEFAULT_INT4_GROUP => write!(f, "int4"),
            g => write!(f, "int4:group={g}"),
        }
    }
    fn validate(&self, d: usize) -> Result<(), String> {
        let group = self.group;
        if d.is_multiple_of(group) {
            Ok(())
        } else {
            Err(format!(
                "int4 group {group} must divide the model's head_dim {d}"
            ))
        }
    }
    fn row_bytes(&self, d: usize) -> usize {
        d / self.group * (4 + self.group / 2)
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(RowStream::new(Int4GroupRow { group: self.group }, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        Some(GpuFormat {
            group: self.group,
            ..GpuFormat::per_token(gpu::INT4, self.group, 4, 4)
        })
    }
}

/// Asymmetric 4-bit, group-wise along head_dim: per group an f16 scale, an f16 zero-point (the
/// group minimum) and `group / 2` packed bytes. `head_dim / group * (4 + group / 2)` bytes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int4GroupRow {
    /// Elements per group along head_dim (even; divides head_dim). Default 32.
    pub group: usize,
}

/// The integer key path of int4 rows with groups of `group`: groups of 32, or one group per
/// row (a multiple of 32 — the stream takes it only where a row is exactly one group, its
/// row bytes [`IntKeys::row_bytes`](crate::kv::intdot::IntKeys::row_bytes)).
pub(crate) fn int4_int_keys(group: usize) -> Option<crate::kv::intdot::IntKeys> {
    use crate::kv::intdot::IntKeys;
    match group {
        32 => Some(IntKeys::Int4G32),
        g if g.is_multiple_of(32) => Some(IntKeys::Int4Row),
        _ => None,
    }
}

/// The value code path of int4 rows with groups of `group` (as [`int4_int_keys`]).
pub(crate) fn int4_code_values(group: usize) -> Option<crate::kv::codeaxpy::CodeValues> {
    use crate::kv::codeaxpy::CodeValues;
    match group {
        32 => Some(CodeValues::Int4G32),
        g if g.is_multiple_of(32) => Some(CodeValues::Int4Row),
        _ => None,
    }
}

impl RowCodec for Int4GroupRow {
    fn int_keys(&self) -> Option<crate::kv::intdot::IntKeys> {
        int4_int_keys(self.group)
    }

    fn code_values(&self) -> Option<crate::kv::codeaxpy::CodeValues> {
        int4_code_values(self.group)
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
            crate::kv::simd::u4_pairs_to_f32(&b[4..], d, m, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut y = [0f32; 8];
        c.decode(&bytes, &mut y);
        assert!((y[1] - (-1.0 + 15.0 * d)).abs() < 1e-6);
    }
}
