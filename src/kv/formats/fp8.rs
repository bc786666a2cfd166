//! `fp8[:scale=token|head|tensor|none]` (alias `fp8-e4m3`) and `fp8-e5m2[:scale=…]`: FP8 codes
//! with a scale per token (f16 in the row, absmax/max, nothing saturates), per (sequence, kv
//! head, layer) or per layer (f32, from the first write's absmax; later values beyond ±max·scale
//! saturate and are counted), or none (vLLM's uncalibrated `fp8` cache). Conversion rounds to
//! nearest even and saturates to the largest finite value, as CUDA's
//! `__nv_cvt_float_to_fp8(…, __NV_SATFINITE, …)` (via the `float8` crate), so no NaN or Inf is
//! ever stored. The CUDA kernels implement the per-token scale.

use std::fmt;

use super::gpu::{self, GpuFormat};
use super::contract::{Format, FormatSpec, ScaleScope};
use crate::kv::codec::{f16_round_up, RowCodec};
use crate::kv::params::Params;
use crate::kv::simd::Widen;
use crate::kv::stream::{RowStream, Stream};

/// Which FP8 encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Kind {
    /// 4 exponent bits, 3 mantissa bits, max ±448 (OCP FP8 spec, "E4M3FN").
    E4M3,
    /// 5 exponent bits, 2 mantissa bits, max ±57344.
    E5M2,
}

impl Fp8Kind {
    /// Largest finite magnitude.
    pub fn max(self) -> f32 {
        match self {
            Fp8Kind::E4M3 => 448.0,
            Fp8Kind::E5M2 => 57344.0,
        }
    }
}

/// Granularity of FP8 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Scale {
    /// One f16 absmax scale per (token, kv head), stored with the row.
    Token,
    /// One f32 scale per (sequence, kv head, layer), set from the absmax of the first write
    /// (the prompt); later values beyond ±max·scale saturate and are counted.
    Head,
    /// One f32 scale per layer (K and V separately), set from the first write.
    Tensor,
    /// No scale: values cast to FP8 as they are (vLLM's `fp8` cache without calibration).
    None,
}

/// The `fp8` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8 {
    /// E4M3 or E5M2.
    pub kind: Fp8Kind,
    /// Scale granularity.
    pub scale: Fp8Scale,
}

impl FormatSpec for Fp8 {
    const NAMES: &'static [&'static str] = &["fp8", "fp8-e4m3", "fp8-e5m2"];
    const HELP: &'static str = "fp8[:scale=token|head|tensor|none], fp8-e5m2[:scale=...]";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        let kind = if p.name == "fp8-e5m2" {
            Fp8Kind::E5M2
        } else {
            Fp8Kind::E4M3
        };
        let mut scale = Fp8Scale::Token;
        for &(k, v) in &p.pairs {
            scale = match (k, v) {
                ("scale", "token") => Fp8Scale::Token,
                ("scale", "head") => Fp8Scale::Head,
                ("scale", "tensor") => Fp8Scale::Tensor,
                ("scale", "none") => Fp8Scale::None,
                ("scale", other) => {
                    return Err(format!(
                        "fp8 scale `{other}`: use token, head, tensor or none"
                    ))
                }
                _ => return Err(p.unknown(k, "scale=token|head|tensor|none")),
            };
        }
        Ok(Fp8 { kind, scale })
    }
}

impl Format for Fp8 {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Fp8Kind::E4M3 => write!(f, "fp8")?,
            Fp8Kind::E5M2 => write!(f, "fp8-e5m2")?,
        }
        match self.scale {
            Fp8Scale::Token => Ok(()),
            Fp8Scale::Head => write!(f, ":scale=head"),
            Fp8Scale::Tensor => write!(f, ":scale=tensor"),
            Fp8Scale::None => write!(f, ":scale=none"),
        }
    }
    fn row_bytes(&self, d: usize) -> usize {
        d + if self.scale == Fp8Scale::Token { 2 } else { 0 }
    }
    fn stream_bytes(&self, d: usize, n: usize) -> usize {
        // A per-head scale is one f32 per stream.
        n * self.row_bytes(d) + if self.scale == Fp8Scale::Head { 4 } else { 0 }
    }
    fn layer_bytes(&self) -> usize {
        if self.scale == Fp8Scale::Tensor {
            4
        } else {
            0
        }
    }
    fn external_scale(&self) -> Option<ScaleScope> {
        match self.scale {
            Fp8Scale::Head => Some(ScaleScope::Head),
            Fp8Scale::Tensor => Some(ScaleScope::Tensor),
            Fp8Scale::Token | Fp8Scale::None => None,
        }
    }
    /// absmax / fp8 max over `x`, or 1 for all-zero input.
    fn calibrate(&self, x: &[f32]) -> f32 {
        let a = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        if a > 0.0 {
            a / self.kind.max()
        } else {
            1.0
        }
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        let kind = self.kind;
        match self.scale {
            Fp8Scale::Token => Box::new(RowStream::new(Fp8Row { kind, scale: None }, d)),
            Fp8Scale::None => Box::new(RowStream::new(
                Fp8Row {
                    kind,
                    scale: Some(1.0),
                },
                d,
            )),
            s => Box::new(RowStream::with_pending_scale(
                Fp8Row {
                    kind,
                    scale: Some(1.0),
                },
                d,
                s == Fp8Scale::Head,
            )),
        }
    }
    fn gpu(&self) -> Option<GpuFormat> {
        let id = match self.kind {
            Fp8Kind::E4M3 => gpu::FP8_E4M3,
            Fp8Kind::E5M2 => gpu::FP8_E5M2,
        };
        (self.scale == Fp8Scale::Token).then_some(GpuFormat::per_token(id, 0, 2, 8))
    }
}

/// FP8 (E4M3 or E5M2) rows with a scale: per token (f16, stored in the row) or external (set
/// once; values beyond ±max·scale saturate to ±max and are counted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Row {
    /// E4M3 or E5M2.
    pub kind: Fp8Kind,
    /// `None`: per-token scale stored in each row. `Some(s)`: every value is stored as `x / s`.
    pub scale: Option<f32>,
}

impl Fp8Row {
    /// The stored row's layout: codes after an f16 scale (per token) or codes alone.
    fn layout(&self) -> Widen {
        Widen::Fp8 {
            e4m3: self.kind == Fp8Kind::E4M3,
            scale: self.scale,
        }
    }

    fn code(&self, v: f32) -> u8 {
        match self.kind {
            Fp8Kind::E4M3 => float8::F8E4M3::from_f32(v).to_bits(),
            Fp8Kind::E5M2 => float8::F8E5M2::from_f32(v).to_bits(),
        }
    }
}

impl RowCodec for Fp8Row {
    fn set_scale(&mut self, scale: f32) {
        self.scale = Some(scale);
    }

    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim + if self.scale.is_none() { 2 } else { 0 }
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let max = self.kind.max();
        let (s, codes) = match self.scale {
            None => {
                let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = f16_round_up(absmax / max);
                out[..2].copy_from_slice(&s.to_le_bytes());
                (s.to_f32(), &mut out[2..])
            }
            Some(s) => (s, &mut out[..]),
        };
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        let mut saturated = 0;
        for (o, &v) in codes.iter_mut().zip(x) {
            let y = v * inv;
            if y.abs() > max {
                saturated += 1;
            }
            *o = self.code(y);
        }
        saturated
    }

    #[inline(always)]
    fn decode(&self, row: &[u8], out: &mut [f32]) {
        self.layout().decode(row, out)
    }

    fn widen(&self) -> Option<Widen> {
        Some(self.layout())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E4M3 codes by hand (OCP FP8 spec table): 1.0 = 0x38, −2.5 = 0xC2, 448 = 0x7E (max
    /// finite), 0.0 = 0x00; with external scale 1 a value of 1000 saturates to 448 and is counted,
    /// never NaN.
    #[test]
    fn fp8_e4m3_hand_values_and_saturation() {
        let c = Fp8Row {
            kind: Fp8Kind::E4M3,
            scale: Some(1.0),
        };
        let x = [1.0f32, -2.5, 448.0, 0.0, 1000.0, -1e9, 0.3, 17.0];
        let mut b = vec![0u8; 8];
        assert_eq!(c.encode(&x, &mut b), 2);
        assert_eq!(&b[..4], &[0x38, 0xC2, 0x7E, 0x00]);
        let mut y = [0f32; 8];
        c.decode(&b, &mut y);
        assert_eq!(&y[..6], &[1.0, -2.5, 448.0, 0.0, 448.0, -448.0]);
        // 0.3 → nearest E4M3 is 0.3125 (1.25·2⁻²); 17 → 16 (ties-to-even between 16 and 18).
        assert_eq!(y[6], 0.3125);
        assert_eq!(y[7], 16.0);
        assert!(y.iter().all(|v| v.is_finite()));
    }
}
