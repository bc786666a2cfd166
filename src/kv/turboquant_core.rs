//! What remains of the former TurboQuant core (now [`super::quant`] and
//! [`super::formats::turboquant`]): vLLM's preset table, which `kv::spec` states too, and the
//! path of [`SplitMix64`] that `quality` and `measure` still name.

use std::fmt;
use std::str::FromStr;

use super::quant::bits::packed_bytes;
use super::quant::mse::TurboQuantMse;
use super::{Fp8Kind, Fp8Scale, Quant};
use crate::error::{Error, Result};
/// Re-exported from [`crate::util::noise`], its home: `quality::paired` and `measure::sweep`
/// still name it by this path.
pub use crate::util::noise::SplitMix64;

/// How a TurboQuant preset stores keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TqKeys {
    /// FP8 E4M3 without a scale, `d` bytes (vLLM's `key_quant_bits = 8`; kvbench's
    /// `fp8:scale=none`).
    Fp8,
    /// [`TurboQuantMse`] at `bits`, with or without norm correction.
    Mse { bits: u8, norm_correction: bool },
}

/// vLLM's named TurboQuant KV-cache presets (`--kv-cache-dtype`, read from vLLM's
/// `quantization/turboquant/config.py` `TQ_PRESETS`): keys as [`TqKeys`], values
/// [`UniformGroupRow`] with one group per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TurboQuantPreset {
    /// `turboquant_k8v4`: FP8 keys, 4-bit values, no norm correction.
    K8V4,
    /// `turboquant_4bit_nc`: 4-bit MSE keys with norm correction, 4-bit values.
    FourBitNc,
    /// `turboquant_k3v4_nc`: 3-bit MSE keys with norm correction, 4-bit values.
    K3V4Nc,
    /// `turboquant_3bit_nc`: 3-bit MSE keys with norm correction, 3-bit values.
    ThreeBitNc,
}

impl TurboQuantPreset {
    /// Every preset, in vLLM's order.
    pub const ALL: [TurboQuantPreset; 4] = [
        TurboQuantPreset::K8V4,
        TurboQuantPreset::FourBitNc,
        TurboQuantPreset::K3V4Nc,
        TurboQuantPreset::ThreeBitNc,
    ];

    /// The preset's name as vLLM spells it.
    pub fn name(self) -> &'static str {
        match self {
            TurboQuantPreset::K8V4 => "turboquant_k8v4",
            TurboQuantPreset::FourBitNc => "turboquant_4bit_nc",
            TurboQuantPreset::K3V4Nc => "turboquant_k3v4_nc",
            TurboQuantPreset::ThreeBitNc => "turboquant_3bit_nc",
        }
    }

    /// Key storage.
    pub fn keys(self) -> TqKeys {
        match self {
            TurboQuantPreset::K8V4 => TqKeys::Fp8,
            TurboQuantPreset::FourBitNc => TqKeys::Mse {
                bits: 4,
                norm_correction: true,
            },
            TurboQuantPreset::K3V4Nc | TurboQuantPreset::ThreeBitNc => TqKeys::Mse {
                bits: 3,
                norm_correction: true,
            },
        }
    }

    /// The FP8 key format as kvbench's existing [`Quant`] when keys are FP8.
    pub fn fp8_keys_quant(self) -> Option<Quant> {
        (self.keys() == TqKeys::Fp8).then_some(Quant::Fp8 {
            kind: Fp8Kind::E4M3,
            scale: Fp8Scale::None,
        })
    }

    /// Value bits.
    pub fn value_bits(self) -> u8 {
        match self {
            TurboQuantPreset::ThreeBitNc => 3,
            _ => 4,
        }
    }

    /// Bytes of one key row of `head_dim` values: `d` (FP8) or `ceil(d·b/8) + 2`.
    pub fn key_row_bytes(self, head_dim: usize) -> usize {
        match self.keys() {
            TqKeys::Fp8 => head_dim,
            TqKeys::Mse { bits, .. } => TurboQuantMse::row_bytes_for(head_dim, bits),
        }
    }

    /// Bytes of one value row: `ceil(d·b/8) + 4`.
    pub fn value_row_bytes(self, head_dim: usize) -> usize {
        packed_bytes(head_dim, self.value_bits()) + 4
    }

    /// Bytes per token per kv head per layer, K + V (vLLM's `slot_size`, before its rounding
    /// up to an even number).
    pub fn slot_bytes(self, head_dim: usize) -> usize {
        self.key_row_bytes(head_dim) + self.value_row_bytes(head_dim)
    }
}

impl fmt::Display for TurboQuantPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TurboQuantPreset {
    type Err = Error;

    /// Parses vLLM's preset names. Errors: [`Error::UnknownScheme`] listing the four names.
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::UnknownScheme {
                input: s.into(),
                reason: "not a TurboQuant preset".into(),
                valid: Self::ALL.map(|p| p.name()).join(", "),
            })
    }
}

#[cfg(test)]
mod tests;
