//! K/V storage formats: one file per format, behind the closed registry [`Quant`].
//!
//! Each file owns its format completely: the parameters (a struct whose fields are the
//! [`Quant`] variant's), its names and parsing ([`FormatSpec`]), `Display`, validation against a
//! model, the byte formula, the stream that stores it with its codec and CPU kernel hooks, and
//! whether (and how) the CUDA kernels store it ([`Format::gpu`]). [`Quant`] is the closed set
//! (mistral.rs-style: a `Copy` enum whose methods delegate), generated with every delegation
//! by the [`formats!`] invocation at the bottom of this file — adding a format is its file plus
//! one line there (see the README's "Layout" section for a worked example).
//!
//! Floors inside this folder (issue #21): `gpu` (the CUDA layout) → `contract` (the traits every
//! format implements) → the format files (a file may use another's codec, never the registry) →
//! the registry here, which names them all.

mod contract;
pub mod fp4;
pub mod gpu;

use std::fmt;

use super::params::Params;
use super::stream::Stream;
use crate::error::{Error, Result};
pub use contract::{Format, FormatSpec, ScaleScope};
pub use gpu::GpuFormat;

/// A parser of the registry: the names it takes and the function.
pub(crate) type Parser = (
    &'static [&'static str],
    fn(&Params<'_>) -> std::result::Result<Quant, String>,
);

/// Generates the closed set [`Quant`] from one line per format (`Variant { fields } =>
/// module::Type;`, the variant's fields being the type's): the `pub mod module;` declaration
/// (file `formats/module.rs`), the variant, [`Quant::with`] (the one delegation every method
/// goes through), `From<Type> for Quant`, the parser table and the help entries.
macro_rules! formats {
    ($(
        $(#[$doc:meta])*
        $variant:ident $({ $($field:ident : $fty:ty),* $(,)? })? => $module:ident :: $ty:ident;
    )*) => {
        $( pub mod $module; )*

        /// How K or V rows are stored: one variant per format file (see [`self`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Quant {
            $( $(#[$doc])* $variant $({ $($field: $fty),* })?, )*
        }

        impl Quant {
            /// Runs `f` on this format's own type (the delegation behind every method).
            pub fn with<R>(self, f: impl FnOnce(&dyn Format) -> R) -> R {
                match self {
                    $( Quant::$variant $({ $($field),* })? => f(&$module::$ty $({ $($field),* })?), )*
                }
            }

            /// The names this format's registry entry answers to (its [`FormatSpec::NAMES`]).
            pub fn names(self) -> &'static [&'static str] {
                match self {
                    $( Quant::$variant { .. } => <$module::$ty as FormatSpec>::NAMES, )*
                }
            }
        }

        $(
            impl From<$module::$ty> for Quant {
                fn from(x: $module::$ty) -> Quant {
                    let $module::$ty $({ $($field),* })? = x;
                    Quant::$variant $({ $($field),* })?
                }
            }
        )*

        /// Every format's names and parser, in registry order.
        pub(crate) const PARSERS: &[Parser] = &[
            $( (<$module::$ty as FormatSpec>::NAMES,
                |p| <$module::$ty as FormatSpec>::parse(p).map(Quant::from)), )*
        ];

        /// Every format's help entry, in registry order.
        pub(crate) const HELP: &[&str] = &[ $( <$module::$ty as FormatSpec>::HELP, )* ];
    };
}

impl Quant {
    /// Parses one format spec (`int4:group=64`). `Ok(None)`: no format has that name.
    pub(crate) fn parse(p: &Params<'_>) -> std::result::Result<Option<Quant>, String> {
        match PARSERS.iter().find(|(names, _)| names.contains(&p.name)) {
            Some((_, parse)) => parse(p).map(Some),
            None => Ok(None),
        }
    }

    /// Per-token formats smaller than fp16 that store rows of `d` elements: every registered
    /// name with its default parameters that passes its own [`Format::validate`] at `d`, the
    /// registry entry named `skip` left out (the format asking), aliases counted once. Ordered
    /// by how far their row (bytes) is from `near` bytes, registry order on ties; at most `n`.
    /// What a format refusing `d` suggests instead (see [`Self::check`]), so the advice is
    /// always valid at that head_dim.
    fn valid_at(d: usize, skip: &[&str], near: usize, n: usize) -> Vec<Quant> {
        let mut found: Vec<Quant> = Vec::new();
        for &(names, parse) in PARSERS.iter().filter(|(names, _)| *names != skip) {
            for &name in names {
                let bare = Params {
                    name,
                    pairs: Vec::new(),
                };
                let Ok(q) = parse(&bare) else { continue };
                let valid = q.with(|f| f.validate(d)).is_ok();
                let fits = !q.per_channel() && valid && q.row_bytes(d) < 2 * d;
                if fits && !found.contains(&q) {
                    found.push(q);
                }
            }
        }
        found.sort_by_key(|q| q.row_bytes(d).abs_diff(near));
        found.truncate(n);
        found
    }

    /// Bytes one stored row of `d` elements takes (see [`Format::row_bytes`]).
    pub fn row_bytes(self, d: usize) -> usize {
        self.with(|f| f.row_bytes(d))
    }

    /// Exact bytes one (sequence, kv head) stream holds after `n` tokens.
    pub fn stream_bytes(self, d: usize, n: usize) -> usize {
        self.with(|f| f.stream_bytes(d, n))
    }

    /// Per-layer bytes outside the streams (a per-tensor fp8 scale), once written.
    pub fn layer_bytes(self) -> usize {
        self.with(|f| f.layer_bytes())
    }

    /// Tokens quantized together (KIVI's token group), else 1.
    pub fn token_group(self) -> usize {
        self.with(|f| f.token_group())
    }

    /// Whether this is a per-channel (KIVI key) format.
    pub fn per_channel(self) -> bool {
        self.with(|f| f.per_channel())
    }

    /// The value format a spec naming only this key format implies (see
    /// [`Format::value_partner`]): that name parsed with its default parameters.
    pub fn value_partner(self) -> Quant {
        let Some(name) = self.with(|f| f.value_partner()) else {
            return self;
        };
        let bare = Params {
            name,
            pairs: Vec::new(),
        };
        match Quant::parse(&bare) {
            Ok(Some(q)) => q,
            // A registry invariant, pinned by the tests below: not an input error.
            _ => panic!("`{self}` pairs with `{name}`, which the registry does not parse"),
        }
    }

    /// Where this format's external scale lives, if it has one.
    pub fn external_scale(self) -> Option<ScaleScope> {
        self.with(|f| f.external_scale())
    }

    /// A new, empty CPU stream for rows of `d` elements.
    pub fn new_stream(self, d: usize) -> Box<dyn Stream> {
        self.with(|f| f.new_stream(d))
    }

    /// Checks this format against head_dim `d`; `Err` is the reason, followed for a format that
    /// [`Format::suggests_alternatives`] by up to three formats that do store `d`, nearest to
    /// its row size first ("; use `a`, `b` or `c` for this model").
    pub fn check(self, d: usize) -> std::result::Result<(), String> {
        let Err(reason) = self.with(|f| f.validate(d)) else {
            return Ok(());
        };
        if !self.with(|f| f.suggests_alternatives()) {
            return Err(reason);
        }
        // Only what stores this head_dim (int4's default group and q4_0's blocks of 32 do not
        // divide 80, say): the formats that validate at `d`, nearest in size.
        let names: Vec<String> = Quant::valid_at(d, self.names(), self.row_bytes(d), 3)
            .iter()
            .map(|q| format!("`{q}`"))
            .collect();
        let advice = match names.as_slice() {
            [] => String::new(),
            [one] => format!("; use {one} for this model"),
            [rest @ .., last] => format!("; use {} or {last} for this model", rest.join(", ")),
        };
        Err(format!("{reason}{advice}"))
    }

    /// The CUDA form of this format. Errors: [`Error::InvalidArgument`] naming the formats the
    /// CUDA path implements, for one it does not.
    pub fn gpu(self) -> Result<GpuFormat> {
        self.with(|f| f.gpu())
            .ok_or_else(|| Error::InvalidArgument {
                name: "--dtypes".into(),
                reason: format!(
                "`{self}` has no CUDA kernels yet (fp16, int8-token, int4, fp8 with scale=token, \
                 q8_0, q4_0, nvfp4, mxfp4 and int8-channel do); run it with --device cpu"
            ),
            })
    }
}

impl fmt::Display for Quant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|x| x.write(f))
    }
}

formats! {
    /// IEEE binary16.
    Fp16 => fp16::Fp16;
    /// Symmetric int8, f16 absmax scale per (token, kv head).
    Int8Token => int8::Int8Token;
    /// Asymmetric int4 along head_dim: f16 scale and zero-point per group.
    Int4 { group: usize } => int4::Int4;
    /// Per-channel keys (KIVI): codes per channel with scales over groups of `group` tokens; the
    /// newest tokens stay fp16 until `residual` + a full group have arrived.
    Channel { bits: u8, group: usize, residual: usize } => channel::Channel;
    /// FP8 with scales at the chosen granularity.
    Fp8 { kind: fp8::Fp8Kind, scale: fp8::Fp8Scale } => fp8::Fp8;
    /// ggml's Q8_0: blocks of 32 along head_dim, symmetric, f16 scale (34 bytes per block).
    Q8_0 => q8_0::Q8_0;
    /// ggml's Q4_0: blocks of 32 along head_dim, symmetric 4-bit, f16 scale (18 bytes per block).
    Q4_0 => q4_0::Q4_0;
    /// Asymmetric 2-, 3- or 4-bit along head_dim per group (0: the whole row): KIVI-2 values,
    /// TurboQuant's values.
    Uniform { bits: u8, group: usize } => uniform::Uniform;
    /// TurboQuant rows (arXiv 2504.19874): rotated, Lloyd–Max codebook, optional QJL residual.
    TurboQuant { kind: turboquant::TqKind, bits: u8, seed: u64 } => turboquant::TurboQuant;
    /// NVIDIA NVFP4: E2M1 values, an E4M3 scale per 16 along head_dim, an f32 scale per row.
    Nvfp4 => nvfp4::Nvfp4;
    /// OCP MXFP4 (MX v1.0): E2M1 values, an E8M0 power-of-two scale per 32 along head_dim.
    Mxfp4 => mxfp4::Mxfp4;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::codec::RowCodec;

    fn roundtrip<C: RowCodec>(c: C, x: &[f32]) -> Vec<f32> {
        let mut bytes = vec![0u8; c.row_bytes(x.len())];
        c.encode(x, &mut bytes);
        let mut out = vec![0f32; x.len()];
        c.decode(&bytes, &mut out);
        out
    }

    #[test]
    fn zero_rows_stay_zero() {
        let x = [0f32; 64];
        assert_eq!(roundtrip(int8::Int8TokenRow, &x), x.to_vec());
        assert_eq!(roundtrip(int4::Int4GroupRow { group: 32 }, &x), x.to_vec());
        assert_eq!(roundtrip(fp16::F16Row, &x), x.to_vec());
    }

    /// KIVI's pairing by hand: a per-channel key format names its value format by registry
    /// name, which parses to per-token values of the same width (default groups); every other
    /// format pairs with itself.
    #[test]
    fn value_partners_by_hand() {
        let q = |s: &str| s.parse::<crate::kv::KvScheme>().unwrap().k;
        assert_eq!(q("int8-channel").value_partner(), Quant::Int8Token);
        assert_eq!(
            q("int4-channel:group=64,residual=0").value_partner(),
            Quant::Int4 { group: 32 }
        );
        assert_eq!(
            q("int2-channel").value_partner(),
            Quant::Uniform { bits: 2, group: 32 }
        );
        for (names, parse) in PARSERS {
            for &name in *names {
                let bare = Params {
                    name,
                    pairs: Vec::new(),
                };
                let k = parse(&bare).unwrap();
                let v = k.value_partner();
                assert_eq!(v == k, !k.per_channel(), "{name}");
                assert!(!v.per_channel(), "{name} pairs with {v}");
            }
        }
    }

    /// The CUDA support table by format, and the registry's names are unique.
    #[test]
    fn gpu_support_by_format() {
        let on_gpu = |s: &str| {
            let q: crate::kv::KvScheme = s.parse().unwrap();
            q.k.gpu().is_ok()
        };
        for s in [
            "fp16",
            "int8",
            "int4:group=16",
            "fp8",
            "fp8-e5m2",
            "q8_0",
            "q4_0",
            "nvfp4",
            "mxfp4",
            "int8-channel",
        ] {
            assert!(on_gpu(s), "{s}");
        }
        for s in [
            "fp8:scale=head",
            "fp8:scale=tensor",
            "fp8:scale=none",
            "int4-channel",
        ] {
            assert!(!on_gpu(s), "{s}");
        }
        let e = Quant::Channel {
            bits: 4,
            group: 32,
            residual: 128,
        }
        .gpu()
        .unwrap_err();
        assert!(e.to_string().contains("--device cpu"), "{e}");
        // The new formats have no kernels yet: refused by name, with what to do.
        for s in [
            "int2-channel",
            "int2",
            "int3:group=row",
            "int4-row",
            "turboquant",
            "turboquant-nc:bits=3",
            "turboquant-prod",
        ] {
            let q: crate::kv::KvScheme = s.parse().unwrap();
            let e = q.k.gpu().unwrap_err().to_string();
            assert!(
                e.contains(&format!("`{}` has no CUDA kernels yet", q.k))
                    && e.contains("--device cpu"),
                "{s}: {e}"
            );
        }
        for s in [
            "k4v2",
            "k2v4",
            "turboquant_k8v4",
            "turboquant_4bit_nc",
            "turboquant_3bit_nc",
        ] {
            let q: crate::kv::KvScheme = s.parse().unwrap();
            assert!(q.k.gpu().is_err() || q.v.gpu().is_err(), "{s}");
        }
        let mut names: Vec<&str> = PARSERS
            .iter()
            .flat_map(|(n, _)| n.iter().copied())
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name registered twice");
    }
}
