//! `fp16` (alias `f16`): IEEE binary16 rows, the baseline every quality figure is measured
//! against. 2 bytes per element, round-to-nearest-even; the GPU stores the same bytes.

use std::fmt;

use half::f16;

use super::gpu::{self, GpuFormat};
use super::contract::{Format, FormatSpec};
use crate::kv::codec::RowCodec;
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};

/// The `fp16` format (no parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp16;

impl FormatSpec for Fp16 {
    const NAMES: &'static [&'static str] = &["fp16", "f16"];
    const HELP: &'static str = "fp16";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        p.none().map(|_| Fp16)
    }
}

impl Format for Fp16 {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fp16")
    }
    fn row_bytes(&self, d: usize) -> usize {
        2 * d
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(RowStream::new(F16Row, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        Some(GpuFormat::per_token(gpu::F16, 0, 0, 16))
    }
}

/// IEEE binary16 storage: `head_dim` values, 2 bytes each (little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct F16Row;

impl RowCodec for F16Row {
    fn row_bytes(&self, head_dim: usize) -> usize {
        2 * head_dim
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        for (o, &v) in out.chunks_exact_mut(2).zip(x) {
            o.copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
        0
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        crate::kv::simd::f16_to_f32(row, out);
    }

    fn widen(&self) -> Option<crate::kv::simd::Widen> {
        Some(crate::kv::simd::Widen::F16)
    }
}
