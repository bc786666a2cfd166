//! `turboquant[:bits=B,seed=S]`, `turboquant-nc[:…]` and `turboquant-prod[:bits=B,seed=S]`:
//! TurboQuant (Zandieh et al. 2025, arXiv 2504.19874) rows, data-oblivious (no calibration).
//!
//! - `turboquant` (TurboQuant_mse, §3.1 Alg. 1): `‖x‖` as f16, then the Lloyd–Max N(0, 1/d)
//!   codebook index of every coordinate of the randomly rotated unit row, packed at `B` bits
//!   (1–4, default 4): `ceil(d·B/8) + 2` bytes per row (vLLM's `key_packed_size`; d = 64: 26 B
//!   at 3 bits, 34 B at 4).
//! - `turboquant-nc`: the same layout with vLLM's norm correction (the centroid vector rescaled
//!   to unit norm), folded in at encode: the f16 norm field holds `‖x‖/‖centroid vector‖`, so
//!   the rows decode as `turboquant`'s.
//! - `turboquant-prod` (TurboQuant_prod, §3.2 Alg. 2): `B − 1` MSE bits plus a 1-bit QJL sketch
//!   of the residual and its f16 norm (`B` 2–5, default 4): `ceil(d·(B−1)/8) + 4 + ceil(d/8)`
//!   bytes per row; attention scores keys with the unbiased QJL estimator.
//!
//! The rotation signs (and QJL's d×d Gaussian matrix) are drawn from `seed` by SplitMix64
//! ([`crate::util::noise::SplitMix64`]); the spec string carries a non-default seed, so
//! it identifies the stored form exactly. One codec per (head_dim, kind, bits, seed) is built
//! and shared by every layer, kv head and sequence; it is a constant of the format (a function
//! of the spec and head_dim, like fp8's code table), not cache contents, so `kv_bytes` counts
//! only the rows (codebook: 2^B f32; signs: d; QJL matrix: d² f32 — see the README).
//! Attention reads the stored form ([`TurboQuantStream`], in `turboquant/stream.rs`). The
//! quantizers themselves are [`crate::kv::quant`]'s. CPU only: no CUDA kernels yet.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use super::contract::{Format, FormatSpec};
use crate::kv::params::Params;
use crate::kv::quant::mse::TurboQuantMse;
use crate::kv::quant::prod::TurboQuantProd;
use crate::kv::stream::Stream;

mod stream;
pub use stream::{TqCodec, TurboQuantStream};

/// Default rotation seed ("TurboQnt" in ASCII): every run without `seed=` uses the same
/// rotation, so results are reproducible across runs and builds.
pub const DEFAULT_TQ_SEED: u64 = 0x5475_7262_6F51_6E74;
/// Default bits per coordinate.
pub const DEFAULT_TQ_BITS: u8 = 4;

/// Which TurboQuant quantizer a row uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TqKind {
    /// TurboQuant_mse (no norm correction).
    Mse,
    /// TurboQuant_mse with vLLM's norm correction (`_nc`).
    MseNc,
    /// TurboQuant_prod: MSE at `bits − 1` plus 1-bit QJL on the residual.
    Prod,
}

/// The TurboQuant formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TurboQuant {
    /// The quantizer.
    pub kind: TqKind,
    /// Bits per coordinate in total (MSE: 1–4; prod: 2–5, the QJL bit included).
    pub bits: u8,
    /// Seed of the rotation signs (and the QJL matrix).
    pub seed: u64,
}

impl TurboQuant {
    fn name(&self) -> &'static str {
        match self.kind {
            TqKind::Mse => "turboquant",
            TqKind::MseNc => "turboquant-nc",
            TqKind::Prod => "turboquant-prod",
        }
    }

    fn bits_range(kind: TqKind) -> std::ops::RangeInclusive<u8> {
        match kind {
            TqKind::Prod => 2..=5,
            _ => 1..=4,
        }
    }

    /// The shared codec for rows of `d` values. Errors: `d` not a power of two (the Hadamard
    /// rotation's requirement), as text.
    pub fn codec(&self, d: usize) -> Result<TqCodec, String> {
        type Codecs = HashMap<(usize, TurboQuant), TqCodec>;
        static CACHE: OnceLock<Mutex<Codecs>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(&(d, *self)) {
            return Ok(c.clone());
        }
        let c = match self.kind {
            TqKind::Mse | TqKind::MseNc => {
                TurboQuantMse::new(d, self.bits, self.kind == TqKind::MseNc, self.seed)
                    .map(|c| TqCodec::Mse(Arc::new(c)))
            }
            TqKind::Prod => {
                TurboQuantProd::new(d, self.bits, self.seed).map(|c| TqCodec::Prod(Arc::new(c)))
            }
        }
        .map_err(|e| format!("{}: {e}", self as &dyn Format))?;
        map.insert((d, *self), c.clone());
        Ok(c)
    }
}

impl FormatSpec for TurboQuant {
    const NAMES: &'static [&'static str] = &["turboquant", "turboquant-nc", "turboquant-prod"];
    const HELP: &'static str = "turboquant[:bits=1..4,seed=S], turboquant-nc[:bits=1..4,seed=S], \
                                turboquant-prod[:bits=2..5,seed=S]";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        let kind = match p.name {
            "turboquant" => TqKind::Mse,
            "turboquant-nc" => TqKind::MseNc,
            _ => TqKind::Prod,
        };
        let (mut bits, mut seed) = (DEFAULT_TQ_BITS, DEFAULT_TQ_SEED);
        for &(k, v) in &p.pairs {
            match k {
                "bits" => bits = p.num(k, v)?,
                "seed" => seed = p.num(k, v)?,
                _ => return Err(p.unknown(k, "bits=B,seed=S")),
            }
        }
        let range = Self::bits_range(kind);
        if !range.contains(&bits) {
            return Err(format!(
                "`{}` takes bits={}..={} (got {bits})",
                p.name,
                range.start(),
                range.end()
            ));
        }
        Ok(TurboQuant { kind, bits, seed })
    }
}

impl Format for TurboQuant {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        let mut sep = ':';
        if self.bits != DEFAULT_TQ_BITS {
            write!(f, "{sep}bits={}", self.bits)?;
            sep = ',';
        }
        if self.seed != DEFAULT_TQ_SEED {
            write!(f, "{sep}seed={}", self.seed)?;
        }
        Ok(())
    }
    fn validate(&self, d: usize) -> Result<(), String> {
        if !d.is_power_of_two() {
            return Err(format!(
                "TurboQuant's Hadamard rotation needs head_dim a power of two (model: {d})"
            ));
        }
        Ok(())
    }
    /// No parameter fixes the head_dim: the registry names the formats that do store it.
    fn suggests_alternatives(&self) -> bool {
        true
    }
    /// MSE: `ceil(d·B/8) + 2`; prod: `ceil(d·(B−1)/8) + 4 + ceil(d/8)`.
    fn row_bytes(&self, d: usize) -> usize {
        match self.kind {
            TqKind::Prod => TurboQuantProd::row_bytes_for(d, self.bits),
            _ => TurboQuantMse::row_bytes_for(d, self.bits),
        }
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        // KvScheme::validate ran before any stream is made, so `d` is a power of two here.
        let codec = self
            .codec(d)
            .unwrap_or_else(|e| panic!("validated before use: {e}"));
        Box::new(TurboQuantStream::new(codec))
    }
}

#[cfg(test)]
mod tests {
    use crate::kv::KvScheme;

    /// Row bytes by hand (vLLM's `key_packed_size` for MSE): d = 64 at 3 bits: 24 + 2 = 26;
    /// at 4 bits: 32 + 2 = 34; prod at 4 bits: 3 MSE bits 24 + 2 norm + 2 γ + 8 sign bytes = 36;
    /// d = 128 at 3 bits: 48 + 2 = 50.
    #[test]
    fn row_bytes_by_hand() {
        let q = |s: &str| s.parse::<KvScheme>().unwrap().k;
        assert_eq!(q("turboquant:bits=3").row_bytes(64), 26);
        assert_eq!(q("turboquant").row_bytes(64), 34);
        assert_eq!(q("turboquant-nc:bits=3").row_bytes(128), 50);
        assert_eq!(q("turboquant-prod").row_bytes(64), 36);
        assert_eq!(q("turboquant-prod:bits=2").row_bytes(64), 8 + 4 + 8);
    }

    /// Bad parameters and head_dims are refused with the reason.
    #[test]
    fn refusals() {
        for bad in [
            "turboquant:bits=5",
            "turboquant-prod:bits=1",
            "turboquant:group=4",
        ] {
            assert!(bad.parse::<KvScheme>().is_err(), "{bad}");
        }
        let s: KvScheme = "turboquant".parse().unwrap();
        let e = s.validate(96).unwrap_err().to_string();
        assert!(e.contains("power of two"), "{e}");
    }

    /// Issue 25: at head_dim 80 the advice used to be int4 or q4_0, both refused there (int4's
    /// group 32 and q4_0's blocks of 32 do not divide 80). It now names formats that validate:
    /// by hand at d = 80, TurboQuant 4-bit rows take 40 + 2 = 42 bytes; int4-row 40 + 4 = 44,
    /// nvfp4 4 + 5·9 = 49, int8-token 80 + 2 = 82, fp8 82 (int2/int3 groups and mxfp4 blocks of
    /// 32 do not divide 80 either).
    #[test]
    fn head_dim_80_suggests_schemes_valid_there() {
        for old in ["int4", "q4_0"] {
            let s: KvScheme = old.parse().unwrap();
            assert!(s.validate(80).is_err(), "{old} at 80");
        }
        let s: KvScheme = "turboquant".parse().unwrap();
        let e = s.validate(80).unwrap_err().to_string();
        assert!(
            e.contains(
                "needs head_dim a power of two (model: 80); use `int4-row`, `nvfp4` or \
                 `int8-token` for this model"
            ),
            "{e}"
        );
        // At any head_dim TurboQuant refuses, every scheme the advice names validates there.
        for d in [40, 48, 80, 96, 100, 112, 160, 200] {
            for spec in ["turboquant", "turboquant-prod:bits=2", "turboquant_4bit_nc"] {
                let s: KvScheme = spec.parse().unwrap();
                let e = s.validate(d).unwrap_err().to_string();
                let named: Vec<&str> = e.split('`').skip(1).step_by(2).collect();
                assert!(!named.is_empty(), "{spec} at {d}: {e}");
                for n in named {
                    let q: KvScheme = n.parse().unwrap_or_else(|x| panic!("{n}: {x}"));
                    assert!(q.validate(d).is_ok(), "{spec} at {d} advises {n}: {e}");
                }
            }
        }
    }
}
