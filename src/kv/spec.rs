//! KV-cache scheme specs: the strings `--dtypes` takes and the CSV prints — only the grammar
//! that composes formats and policies; each format's and policy's own `name[:k=v,…]` is parsed
//! and printed by its file ([`super::formats`], [`super::evict`]).
//!
//! Grammar (whitespace-free):
//!
//! ```text
//! scheme  := [evict '@'] store ['+rot']         e.g. window:size=1024@int8, q4_0+rot
//! store   := quant | quant '/' quant            K and V formats, e.g. int4-channel/int4
//! evict   := a policy of kv::evict              h2o[:budget=N|ratio=r,recent=M] | window[:…]
//! quant   := a format of kv::formats            fp16 | int8-token | int4[:group=G] | …
//! ```
//!
//! A lone policy stores fp16; a lone key-only format (per-channel) implies its value partner
//! (KIVI's pairing: keys per-channel, values per-token at the same bit width). A preset name
//! ([`PRESETS`]) stands for its K/V pair and is how that pair prints. vLLM's
//! `--kv-cache-dtype` names ([`VLLM_ALIASES`]) are accepted wherever a format is, as input
//! only: each parses to the scheme it names and prints under kvbench's name for it.

use std::fmt;
use std::str::FromStr;

use super::evict::Eviction;
use super::formats::Quant;
use super::params::Params;
use super::scheme::KvScheme;
use crate::error::{Error, Result};

pub use super::evict::h2o::{Budget, DEFAULT_H2O_RATIO, DEFAULT_H2O_RECENT};
pub use super::evict::window::{DEFAULT_SINKS, DEFAULT_WINDOW};
pub use super::formats::channel::{DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL};
pub use super::formats::fp8::{Fp8Kind, Fp8Scale};
pub use super::formats::int4::DEFAULT_INT4_GROUP;

/// How schemes compose, after the list of formats and policies in [`VALID_SCHEMES`]; the
/// presets follow, written from [`PRESETS`].
const COMPOSE: &str = "; compose as EVICT@K/V+rot, e.g. window:size=1024@int8, int4-channel/int4, \
                       q4_0+rot; presets: ";

/// Named K/V pairs, stated once here: `(name, expansion)`, the expansion being the `K/V` spec
/// the name stands for. A spec that is only a preset name parses to its pair, a scheme storing
/// that pair prints as the name, and `--help` lists `name = expansion`.
///
/// - `k4v2`, `k2v4`: KIVI-style per-channel keys with per-token values at different widths
///   (KV-AdaQuant, arXiv 2502.15075, finds keys need the bits: K4V2 ≫ K2V4).
/// - `turboquant_*`: vLLM's TurboQuant presets (`--kv-cache-dtype`, vLLM's
///   `quantization/turboquant/config.py` `TQ_PRESETS`): FP8 (E4M3, no scale) or TurboQuant_mse
///   keys with norm correction, and uniform values with one group per row (the tests check the
///   pairs against vLLM's key/value bits and byte formulas).
pub const PRESETS: &[(&str, &str)] = &[
    ("k4v2", "int4-channel/int2"),
    ("k2v4", "int2-channel/int4"),
    ("turboquant_k8v4", "fp8:scale=none/int4-row"),
    ("turboquant_4bit_nc", "turboquant-nc/int4-row"),
    ("turboquant_k3v4_nc", "turboquant-nc:bits=3/int4-row"),
    ("turboquant_3bit_nc", "turboquant-nc:bits=3/int3:group=row"),
];

/// vLLM's `--kv-cache-dtype` values, accepted wherever a format is (alone, as K or V of a pair,
/// under eviction) and never printed: `(vLLM name, kvbench spec, what differs)`. Each parses to
/// the kvbench spec it names, which then prints under kvbench's name (`fp8_e4m3` prints as
/// `fp8:scale=tensor`), so committed results keep their names. Unlike [`PRESETS`], an alias is
/// not how any scheme prints. Sources: vLLM's `vllm/config/cache.py` (`CacheDType`), its
/// `docs/features/quantization/quantized_kvcache.md` (per-tensor k/v scales; 1.0 without
/// checkpoint scales or `calculate_kv_scales`), and `kv::formats::fp8` for kvbench's scales.
///
/// vLLM's `fp8` (E4M3 with one per-tensor scale) is **not** an alias: kvbench's own `fp8`
/// scales per (token, kv head) and keeps that meaning, so committed baselines keep theirs;
/// vLLM's `fp8` is the `fp8_e4m3` alias here. Mind the spelling: `fp8-e4m3` (hyphen) is
/// kvbench's name for its per-token `fp8`; `fp8_e4m3` (underscore) is vLLM's.
pub const VLLM_ALIASES: &[(&str, &str, &str)] = &[
    (
        "auto",
        "fp16",
        "vLLM stores the model's dtype; kvbench's unquantized cache is fp16",
    ),
    (
        "bfloat16",
        "fp16",
        "kvbench stores 16-bit K/V as IEEE fp16 (10 mantissa bits), not bf16 (7): bf16's \
         rounding is not modelled",
    ),
    (
        "fp8_e4m3",
        "fp8:scale=tensor",
        "E4M3 with one f32 scale per layer for K and one for V, from the first write's absmax \
         (vLLM's calculate_kv_scales); vLLM without checkpoint scales uses scale 1.0: that is \
         fp8:scale=none",
    ),
    (
        "fp8_e5m2",
        "fp8-e5m2:scale=none",
        "vLLM casts to E5M2 without a scale",
    ),
];

/// The kvbench spec a vLLM name in [`VLLM_ALIASES`] stands for, or `None` when `name` is not
/// one (case-sensitive: the parser lower-cases its input first).
pub fn vllm_alias(name: &str) -> Option<&'static str> {
    VLLM_ALIASES
        .iter()
        .find(|(alias, _, _)| *alias == name)
        .map(|&(_, spec, _)| spec)
}

/// Every name a scheme may start with, for "did you mean": each format's and policy's
/// registered names, the presets and the vLLM aliases, in that order.
fn scheme_names() -> impl Iterator<Item = &'static str> {
    let formats = super::formats::PARSERS.iter().flat_map(|(n, _)| n.iter());
    let policies = super::evict::PARSERS.iter().flat_map(|(n, _)| n.iter());
    formats
        .chain(policies)
        .copied()
        .chain(PRESETS.iter().map(|(n, _)| *n))
        .chain(VLLM_ALIASES.iter().map(|(n, _, _)| *n))
}

/// [`PRESETS`] parsed: `(name, keys, values)`, in the same order (parsed once per process).
/// Panics if an expansion does not parse or names a preset (the tests parse every one).
pub fn preset_pairs() -> &'static [(&'static str, Quant, Quant)] {
    static PAIRS: std::sync::OnceLock<Vec<(&'static str, Quant, Quant)>> =
        std::sync::OnceLock::new();
    PAIRS.get_or_init(|| {
        PRESETS
            .iter()
            .map(|&(name, expansion)| {
                assert!(
                    PRESETS.iter().all(|(n, _)| *n != expansion),
                    "preset {name}'s expansion is a preset name"
                );
                let s = Parser { input: expansion }
                    .scheme()
                    .unwrap_or_else(|e| panic!("preset {name}: {e}"));
                (name, s.k, s.v)
            })
            .collect()
    })
}

/// Every accepted spec, for error messages and `--help`: each registered format's and policy's
/// help entry (from its file), how they compose, the presets as `name = expansion`, then the
/// vLLM aliases as `name = spec`.
pub const VALID_SCHEMES: &str = {
    const LEN: usize = valid_schemes(&mut []);
    const BYTES: [u8; LEN] = {
        let mut out = [0u8; LEN];
        valid_schemes(&mut out);
        out
    };
    match std::str::from_utf8(&BYTES) {
        Ok(s) => s,
        Err(_) => panic!("help entries are UTF-8"),
    }
};

/// Writes [`VALID_SCHEMES`] into `out` when it is long enough (else only counts); returns its
/// length in bytes.
const fn valid_schemes(out: &mut [u8]) -> usize {
    const PARTS: [&[&str]; 2] = [super::formats::HELP, super::evict::HELP];
    let (mut at, mut i) = (0, 0);
    while i < PARTS.len() {
        let mut j = 0;
        while j < PARTS[i].len() {
            if at > 0 {
                at = put(out, at, ", ");
            }
            at = put(out, at, PARTS[i][j]);
            j += 1;
        }
        i += 1;
    }
    at = put(out, at, COMPOSE);
    let mut p = 0;
    while p < PRESETS.len() {
        if p > 0 {
            at = put(out, at, ", ");
        }
        at = put(out, at, PRESETS[p].0);
        at = put(out, at, " = ");
        at = put(out, at, PRESETS[p].1);
        p += 1;
    }
    at = put(out, at, VLLM_NOTE);
    let mut a = 0;
    while a < VLLM_ALIASES.len() {
        if a > 0 {
            at = put(out, at, ", ");
        }
        at = put(out, at, VLLM_ALIASES[a].0);
        at = put(out, at, " = ");
        at = put(out, at, VLLM_ALIASES[a].1);
        a += 1;
    }
    at
}

/// Introduces the vLLM aliases in [`VALID_SCHEMES`].
const VLLM_NOTE: &str = "; vLLM --kv-cache-dtype names (vLLM's fp8 is fp8_e4m3; kvbench's fp8 \
                         scales per token): ";

/// Copies `s` into `out` at `at` when it fits (a counting pass passes an empty `out`); returns
/// the position after it.
const fn put(out: &mut [u8], at: usize, s: &str) -> usize {
    let s = s.as_bytes();
    if out.len() >= at + s.len() {
        let mut k = 0;
        while k < s.len() {
            out[at + k] = s[k];
            k += 1;
        }
    }
    at + s.len()
}

impl fmt::Display for KvScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = self.evict {
            write!(f, "{e}")?;
        }
        let implied_pair = self.k.per_channel() && self.v == self.k.value_partner();
        let preset = preset_pairs()
            .iter()
            .find(|&&(_, k, v)| (k, v) == (self.k, self.v));
        let store = if let Some((name, _, _)) = preset {
            name.to_string()
        } else if self.k == self.v || implied_pair {
            self.k.to_string()
        } else {
            format!("{}/{}", self.k, self.v)
        };
        match (self.evict.is_some(), store.as_str()) {
            (true, "fp16") => {}
            (true, s) => write!(f, "@{s}")?,
            (false, s) => write!(f, "{s}")?,
        }
        if self.rotate {
            write!(f, "+rot")?;
        }
        Ok(())
    }
}

struct Parser<'a> {
    input: &'a str,
}

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> Error {
        Error::UnknownScheme {
            input: self.input.to_string(),
            reason: reason.into(),
            valid: VALID_SCHEMES.to_string(),
        }
    }

    /// `name[:k=v,...]` → its [`Params`].
    fn split<'s>(&self, s: &'s str) -> Result<Params<'s>> {
        let (name, params) = match s.split_once(':') {
            Some((n, p)) => (n, p),
            None => (s, ""),
        };
        let pairs: Vec<(&str, &str)> = params
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|kv| {
                kv.split_once('=')
                    .ok_or_else(|| self.err(format!("parameter `{kv}` is not key=value")))
            })
            .collect::<Result<_>>()?;
        // A repeated key would silently let the last one win: refuse it here, once, for every
        // format and policy.
        for (i, &(key, _)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|&(k, _)| k == key) {
                return Err(self.err(format!(
                    "parameter `{key}` of `{name}` is given twice; give it once"
                )));
            }
        }
        Ok(Params { name, pairs })
    }

    fn quant(&self, s: &str) -> Result<Quant> {
        let p = self.split(s)?;
        if p.name.is_empty() {
            return Err(self.err("empty scheme"));
        }
        if let Some(spec) = vllm_alias(p.name) {
            if !p.pairs.is_empty() {
                return Err(self.err(format!(
                    "`{}` is vLLM's name for `{spec}` and takes no parameters; write kvbench's \
                     spec with yours instead (e.g. `fp8:scale=head`)",
                    p.name
                )));
            }
            return self.quant(spec);
        }
        match Quant::parse(&p) {
            Ok(Some(q)) => Ok(q),
            Ok(None) => Err(self.err(format!(
                "no scheme is called `{}`{}",
                p.name,
                crate::util::nearest::did_you_mean(p.name, scheme_names())
            ))),
            Err(reason) => Err(self.err(reason)),
        }
    }

    /// `Ok(None)` when `s` does not name a policy; its parameters are read only when it does
    /// (a whole K/V store such as `turboquant:seed=7/turboquant-nc:seed=7` is not one part).
    fn eviction(&self, s: &str) -> Result<Option<Eviction>> {
        let name = s.split_once(':').map_or(s, |(n, _)| n);
        let known = super::evict::PARSERS
            .iter()
            .any(|(names, _)| names.contains(&name));
        if !known {
            return Ok(None);
        }
        Eviction::parse(&self.split(s)?).map_err(|reason| self.err(reason))
    }

    fn scheme(&self) -> Result<KvScheme> {
        let mut s = self.input.trim().to_ascii_lowercase();
        let rotate = s.ends_with("+rot");
        if rotate {
            s.truncate(s.len() - 4);
        }
        let (evict, store) = match s.split_once('@') {
            Some((e, st)) => match self.eviction(e)? {
                Some(ev) => (Some(ev), st.to_string()),
                None => {
                    let names: Vec<&str> = super::evict::PARSERS
                        .iter()
                        .flat_map(|(n, _)| n.iter().copied())
                        .collect();
                    let near = crate::util::nearest::did_you_mean(e, names.iter().copied());
                    return Err(self.err(format!(
                        "`{e}` before `@` is not {}{near}",
                        names.join(" or ")
                    )));
                }
            },
            None => match self.eviction(&s)? {
                Some(ev) => (Some(ev), "fp16".to_string()),
                None => (None, s.clone()),
            },
        };
        // The name table first: parsing the expansions (inside `preset_pairs`) never asks for
        // the parsed pairs.
        let preset = match PRESETS.iter().any(|(name, _)| *name == store) {
            true => preset_pairs().iter().find(|(name, _, _)| *name == store),
            false => None,
        };
        let (k, v) = match store.split_once('/') {
            _ if preset.is_some() => {
                let &(_, k, v) = preset.expect("checked");
                (k, v)
            }
            Some((k, v)) => {
                let (k, v) = (self.quant(k)?, self.quant(v)?);
                if v.per_channel() {
                    return Err(self.err(
                        "per-channel quantization is for keys (KIVI §3.2); give values a per-token \
                         format, e.g. int4-channel/int4",
                    ));
                }
                (k, v)
            }
            None => {
                let k = self.quant(&store)?;
                (k, k.value_partner())
            }
        };
        if evict.is_some() && k.per_channel() {
            return Err(self.err(
                "eviction cannot be combined with per-channel keys (evicting single tokens breaks \
                 their token groups); use a per-token format under eviction",
            ));
        }
        Ok(KvScheme {
            evict,
            k,
            v,
            rotate,
        })
    }
}

impl FromStr for KvScheme {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Parser { input: s }.scheme()
    }
}

impl serde::Serialize for KvScheme {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        crate::util::serde_text::serialize(self, s)
    }
}

impl<'de> serde::Deserialize<'de> for KvScheme {
    /// Parses the spec string, with the same error text as `--dtypes`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        crate::util::serde_text::deserialize(d)
    }
}

/// Splits a `--dtypes` list: commas separate schemes, except before the `key=value`
/// parameters of the previous scheme. A scheme always starts with a name (a format, a policy
/// or a preset), never with `key=`; a part that does continues the one before, whatever follows
/// its value: `window:size=16,sinks=4@int8-channel:group=32,residual=64,fp16` → two schemes,
/// `window:size=16,sinks=4@int8-channel:group=32,residual=64` and `fp16`. Every printed scheme
/// name therefore splits back as one entry. Empty parts are dropped.
pub fn split_scheme_list(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in list.split(',') {
        match out.last_mut() {
            Some(prev) if starts_with_key(part) => {
                prev.push(',');
                prev.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// Whether a comma-part of a list begins with `key=` (a bare word, then `=`): a parameter of the
/// scheme before it. `sinks=4@int8` does; `int8-channel:group=32` and `fp16` do not.
fn starts_with_key(part: &str) -> bool {
    match part.split_once('=') {
        Some((key, _)) => {
            let key = key.trim();
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        }
        None => false,
    }
}

/// Parses a `--dtypes` list. Errors: [`Error::UnknownScheme`] for the first bad entry.
pub fn parse_scheme_list(list: &str) -> Result<Vec<KvScheme>> {
    split_scheme_list(list).iter().map(|s| s.parse()).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every registered format and policy is listed in the help (by its first name), and the
    /// list reads as written by hand.
    #[test]
    fn valid_schemes_lists_every_registered_name() {
        let firsts = super::super::formats::PARSERS
            .iter()
            .map(|(n, _)| n[0])
            .chain(super::super::evict::PARSERS.iter().map(|(n, _)| n[0]));
        for name in firsts {
            assert!(
                VALID_SCHEMES.contains(name),
                "{name} missing from {VALID_SCHEMES}"
            );
        }
        assert_eq!(
            VALID_SCHEMES,
            "fp16, int8-token (alias int8), int4[:group=G], int8-channel[:group=G,residual=R], \
             int4-channel[:group=G,residual=R], int2-channel[:group=G,residual=R], \
             fp8[:scale=token|head|tensor|none], fp8-e5m2[:scale=...], q8_0, q4_0, \
             int2[:group=G|row], int3[:group=G|row], int4-row, turboquant[:bits=1..4,seed=S], \
             turboquant-nc[:bits=1..4,seed=S], turboquant-prod[:bits=2..5,seed=S], nvfp4, \
             mxfp4, h2o[:budget=N|ratio=r,recent=M], window[:size=W,sinks=S]; compose as \
             EVICT@K/V+rot, e.g. window:size=1024@int8, int4-channel/int4, q4_0+rot; presets: \
             k4v2 = int4-channel/int2, k2v4 = int2-channel/int4, \
             turboquant_k8v4 = fp8:scale=none/int4-row, turboquant_4bit_nc = turboquant-nc/int4-row, \
             turboquant_k3v4_nc = turboquant-nc:bits=3/int4-row, \
             turboquant_3bit_nc = turboquant-nc:bits=3/int3:group=row; vLLM --kv-cache-dtype \
             names (vLLM's fp8 is fp8_e4m3; kvbench's fp8 scales per token): auto = fp16, \
             bfloat16 = fp16, fp8_e4m3 = fp8:scale=tensor, fp8_e5m2 = fp8-e5m2:scale=none"
        );
    }

    #[test]
    fn specs_round_trip_through_display() {
        for s in [
            "fp16",
            "int8-token",
            "int4",
            "int4:group=64",
            "int8-channel",
            "int8-channel:group=16,residual=64",
            "fp8",
            "fp8:scale=head",
            "fp8-e5m2:scale=tensor",
            "fp8:scale=none",
            "q8_0",
            "q4_0+rot",
            "h2o:ratio=0.2,recent=32",
            "h2o:budget=128,recent=16@int8-token",
            "window:size=1024,sinks=4@q8_0/q4_0",
            "int4-channel/q4_0+rot",
            "int2-channel",
            "int2-channel:group=16,residual=32",
            "int2",
            "int2:group=16",
            "int3:group=row",
            "int4-row",
            "nvfp4",
            "mxfp4",
            "int4-channel/nvfp4",
            "int2-channel/int3:group=64",
            "turboquant",
            "turboquant:bits=3",
            "turboquant-nc:bits=3,seed=7",
            "turboquant-prod",
            "turboquant-prod:bits=3",
            "turboquant:bits=3/int4-row",
            "window:size=64,sinks=4@turboquant-nc",
            "turboquant+rot",
            "k4v2",
            "k2v4",
            "turboquant_k8v4",
            "turboquant_4bit_nc",
            "turboquant_k3v4_nc",
            "turboquant_3bit_nc",
            "h2o:ratio=0.2,recent=32@turboquant_3bit_nc",
        ] {
            let k: KvScheme = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(k.to_string(), s, "display of {s}");
            assert_eq!(k.to_string().parse::<KvScheme>().unwrap(), k);
        }
        assert_eq!(
            "int8".parse::<KvScheme>().unwrap().to_string(),
            "int8-token"
        );
        assert_eq!(
            "h2o".parse::<KvScheme>().unwrap().to_string(),
            "h2o:ratio=0.2,recent=32"
        );
        assert_eq!(
            "window".parse::<KvScheme>().unwrap().to_string(),
            "window:size=256,sinks=4"
        );
        // KIVI's pairing prints as the channel spec alone.
        assert_eq!(
            "int4-channel/int4".parse::<KvScheme>().unwrap().to_string(),
            "int4-channel"
        );
        let kivi: KvScheme = "int8-channel".parse().unwrap();
        assert_eq!(kivi.v, Quant::Int8Token);
        // KIVI-2: a lone int2-channel stores int2 values (group 32); the K≠V pairs print as
        // their preset names.
        let kivi2: KvScheme = "int2-channel".parse().unwrap();
        assert_eq!(kivi2.v, Quant::Uniform { bits: 2, group: 32 });
        assert_eq!(
            "int2-channel/int2".parse::<KvScheme>().unwrap().to_string(),
            "int2-channel"
        );
        assert_eq!(
            "int4-channel/int2".parse::<KvScheme>().unwrap().to_string(),
            "k4v2"
        );
        assert_eq!(
            "int2-channel/int4".parse::<KvScheme>().unwrap().to_string(),
            "k2v4"
        );
        assert_eq!(
            "turboquant-nc:bits=3/int3:group=row"
                .parse::<KvScheme>()
                .unwrap()
                .to_string(),
            "turboquant_3bit_nc"
        );
        assert_eq!(
            "turboquant:seed=6085896238561062516"
                .parse::<KvScheme>()
                .unwrap()
                .to_string(),
            "turboquant"
        );
    }

    /// vLLM's TurboQuant presets as its `quantization/turboquant/config.py` `TQ_PRESETS` states
    /// them: `(name, key bits, value bits)`, key bits 8 meaning FP8 E4M3 without a scale, else
    /// TurboQuant_mse with norm correction; values uniform with one group per row.
    const VLLM_TQ_PRESETS: [(&str, u8, u8); 4] = [
        ("turboquant_k8v4", 8, 4),
        ("turboquant_4bit_nc", 4, 4),
        ("turboquant_k3v4_nc", 3, 4),
        ("turboquant_3bit_nc", 3, 3),
    ];

    /// vLLM's slot size (bytes per token, kv head and layer, K + V, before its rounding up to an
    /// even number) from its formulas: keys `d` (FP8) or `key_packed_size = ceil(d·b/8) + 2`,
    /// values `value_packed_size = ceil(d·b/8) + 4`.
    fn vllm_slot_bytes(d: usize, key_bits: u8, value_bits: u8) -> usize {
        let packed = |b: u8| (d * b as usize).div_ceil(8);
        let key = if key_bits == 8 {
            d
        } else {
            packed(key_bits) + 2
        };
        key + packed(value_bits) + 4
    }

    /// The presets the help text writes out are the ones [`PRESETS`] holds, and the vLLM ones
    /// match vLLM's table ([`VLLM_TQ_PRESETS`]: key kind and bits, value bits, and the slot
    /// size by vLLM's formulas).
    #[test]
    fn presets_match_help_and_vllm() {
        use crate::kv::formats::turboquant::TqKind;
        let listed = VALID_SCHEMES.split("presets: ").nth(1).unwrap();
        let listed = listed.split("; vLLM").next().unwrap();
        let pairs: Vec<(&str, &str)> = listed
            .split(", ")
            .map(|p| p.split_once(" = ").unwrap())
            .collect();
        assert_eq!(pairs.len(), PRESETS.len());
        for ((name, expansion), &(pname, k, v)) in pairs.iter().zip(preset_pairs()) {
            assert_eq!(*name, pname);
            let s: KvScheme = expansion.parse().unwrap();
            assert_eq!((s.k, s.v), (k, v), "{name}");
            assert_eq!(name.parse::<KvScheme>().unwrap(), s, "{name}");
        }
        for (p, key_bits, value_bits) in VLLM_TQ_PRESETS {
            let s: KvScheme = p.parse().unwrap();
            match (key_bits, s.k) {
                (8, k) => assert_eq!(
                    k,
                    Quant::Fp8 {
                        kind: Fp8Kind::E4M3,
                        scale: Fp8Scale::None
                    }
                ),
                (
                    bits,
                    Quant::TurboQuant {
                        kind: TqKind::MseNc,
                        bits: b,
                        ..
                    },
                ) => assert_eq!(bits, b, "{p}"),
                other => panic!("{p}: {other:?}"),
            }
            assert_eq!(
                s.v,
                Quant::Uniform {
                    bits: value_bits,
                    group: 0
                },
                "{p}"
            );
            for d in [64, 128] {
                assert_eq!(
                    s.k.row_bytes(d) + s.v.row_bytes(d),
                    vllm_slot_bytes(d, key_bits, value_bits),
                    "{p} d={d}"
                );
            }
        }
        // d = 64 by hand: 4bit_nc K 32 + 2, V 32 + 4 → 70; k3v4_nc K 24 + 2 → 62; 3bit_nc
        // V 24 + 4 → 54; k8v4 K 64 → 100.
        for (name, want) in [
            ("turboquant_4bit_nc", 70),
            ("turboquant_k3v4_nc", 62),
            ("turboquant_3bit_nc", 54),
            ("turboquant_k8v4", 100),
        ] {
            let s: KvScheme = name.parse().unwrap();
            assert_eq!(s.k.row_bytes(64) + s.v.row_bytes(64), want, "{name}");
        }
    }

    /// vLLM's byte formulas by hand for d = 128: FP8 keys 128 B; MSE keys 128·b/8 + 2; values
    /// 128·b/8 + 4. k8v4 = 128 + 68 = 196 (512/196 = 2.6×, vLLM's figure); 4bit_nc = 66 + 68 = 134
    /// (3.8×, vLLM's figure); k3v4_nc = 50 + 68 = 118; 3bit_nc = 50 + 52 = 102. Each name prints
    /// as itself, and an unknown one is refused naming the presets.
    #[test]
    fn presets_parse_and_count_bytes() {
        let want = [196, 134, 118, 102];
        for ((p, key_bits, value_bits), w) in VLLM_TQ_PRESETS.into_iter().zip(want) {
            let s: KvScheme = p.parse().unwrap();
            assert_eq!(s.to_string(), p);
            assert_eq!(vllm_slot_bytes(128, key_bits, value_bits), w, "{p}");
            assert_eq!(s.k.row_bytes(128) + s.v.row_bytes(128), w, "{p}");
        }
        assert!((512.0 / 196.0f64 - 2.6).abs() < 0.05 && (512.0 / 134.0f64 - 3.8).abs() < 0.05);
        let e = "turboquant_2bit"
            .parse::<KvScheme>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("turboquant_k8v4") && e.contains("turboquant_3bit_nc"),
            "{e}"
        );
    }

    #[test]
    fn nonsense_is_rejected_with_the_valid_list() {
        for bad in [
            "int5",
            "int4:group=7",
            "int4:size=32",
            "fp16:group=2",
            "fp8:scale=row",
            "h2o:budget=8,recent=16",
            "window:size=64@int8-channel",
            "int8/int4-channel",
            "foo@int8",
            "h2o:ratio=1.5",
            "window:size=64@k4v2",
            "int4/int2-channel",
            "turboquant:bits=0",
            "turboquant_k8v4:bits=3",
            "int2:group=2",
        ] {
            let e = bad.parse::<KvScheme>().unwrap_err().to_string();
            assert!(e.contains("valid schemes"), "{bad}: {e}");
        }
    }

    #[test]
    fn list_splitting_keeps_parameters_with_their_scheme() {
        assert_eq!(
            split_scheme_list("fp16,int8-channel:group=16,residual=64,h2o:budget=64,recent=8,int4"),
            vec![
                "fp16",
                "int8-channel:group=16,residual=64",
                "h2o:budget=64,recent=8",
                "int4"
            ]
        );
        // Issue 25: a part starting with `key=` continues the scheme before it, even when a
        // store follows its value (`sinks=4@int8-token`).
        assert_eq!(
            split_scheme_list(
                "window:size=16,sinks=4@int8-channel:group=32,residual=64,fp16,\
                 h2o:ratio=0.2,recent=32@q4_0,window:size=16,sinks=2@int8,\
                 turboquant-nc:bits=3,seed=7+rot,h2o:budget=64,recent=8@q8_0/q4_0"
            ),
            vec![
                "window:size=16,sinks=4@int8-channel:group=32,residual=64",
                "fp16",
                "h2o:ratio=0.2,recent=32@q4_0",
                "window:size=16,sinks=2@int8",
                "turboquant-nc:bits=3,seed=7+rot",
                "h2o:budget=64,recent=8@q8_0/q4_0",
            ]
        );
        // A list cannot start with a parameter: it stays its own (refused) entry.
        assert_eq!(split_scheme_list("sinks=4,fp16"), vec!["sinks=4", "fp16"]);
        assert!(parse_scheme_list("sinks=4,fp16").is_err());
    }

    /// Issue 25: the printed names of eviction-over-store schemes, by hand (defaults from
    /// h2o.rs: ratio 0.2, recent 32; window.rs: size 256, sinks 4), and each parses back, alone
    /// and in a list.
    #[test]
    fn eviction_over_store_names_by_hand() {
        for (given, printed) in [
            ("h2o@int8", "h2o:ratio=0.2,recent=32@int8-token"),
            ("h2o:ratio=0.2@q4_0", "h2o:ratio=0.2,recent=32@q4_0"),
            ("window:size=16@int8", "window:size=16,sinks=4@int8-token"),
            (
                "window:size=16,sinks=2@int8",
                "window:size=16,sinks=2@int8-token",
            ),
            (
                "window@turboquant_k8v4",
                "window:size=256,sinks=4@turboquant_k8v4",
            ),
            ("h2o:budget=64+rot", "h2o:budget=64,recent=32+rot"),
            (
                "window:sinks=0@int4:group=16/q8_0+rot",
                "window:size=256,sinks=0@int4:group=16/q8_0+rot",
            ),
        ] {
            let s: KvScheme = given.parse().unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(s.to_string(), printed, "{given}");
            assert_eq!(printed.parse::<KvScheme>().unwrap(), s, "{printed}");
        }
        let list = parse_scheme_list(
            "window:size=16,sinks=4@int8-token,h2o:ratio=0.2,recent=32@int8-token,\
             h2o:ratio=0.2,recent=32@q4_0",
        )
        .unwrap();
        let want = parse_scheme_list("window:size=16@int8,h2o@int8,h2o:ratio=0.2@q4_0").unwrap();
        assert_eq!(list, want);
        assert_eq!(list.len(), 3);
    }

    /// Every format (each registered name bare, and with every parameter set from a shared
    /// table that it accepts), every policy likewise, every preset; K/V pairs, `+rot` and
    /// eviction@store compositions built from those registries, so a new format or policy is
    /// covered without editing this test.
    pub(crate) fn every_scheme() -> Vec<KvScheme> {
        // Tried on every name; each name keeps the ones it accepts.
        const FORMAT_PARAMS: &[&str] = &[
            "",
            ":group=16",
            ":group=64",
            ":group=row",
            ":group=16,residual=64",
            ":residual=32",
            ":scale=head",
            ":scale=tensor",
            ":scale=none",
            ":bits=3",
            ":bits=2,seed=7",
            ":seed=7",
        ];
        const POLICY_PARAMS: &[&str] = &[
            "",
            ":size=16",
            ":size=16,sinks=2",
            ":sinks=0",
            ":budget=64",
            ":budget=100,recent=8",
            ":ratio=0.5",
            ":ratio=0.25,recent=4",
        ];
        // `help`: the registry entry's help text; a name it shows with `[` takes parameters.
        let expand = |names: &[&str], params: &[&str], help: &str| -> Vec<String> {
            let mut out = Vec::new();
            for name in names {
                let takes_params = help.contains(&format!("{name}["));
                let ok: Vec<String> = params
                    .iter()
                    .map(|p| format!("{name}{p}"))
                    .filter(|s| s.parse::<KvScheme>().is_ok())
                    .collect();
                assert!(ok.contains(&name.to_string()), "{name} bare is refused");
                if takes_params {
                    assert!(ok.len() > 1, "no parameter set in the table fits {name}");
                }
                out.extend(ok);
            }
            out
        };
        let mut quants: Vec<Quant> = Vec::new();
        let formats = super::super::formats::PARSERS.iter();
        for ((names, _), help) in formats.zip(super::super::formats::HELP) {
            for s in expand(names, FORMAT_PARAMS, help) {
                let q = s.parse::<KvScheme>().unwrap().k;
                if !quants.contains(&q) {
                    quants.push(q);
                }
            }
        }
        let mut policies: Vec<Eviction> = Vec::new();
        let evicts = super::super::evict::PARSERS.iter();
        for ((names, _), help) in evicts.zip(super::super::evict::HELP) {
            for s in expand(names, POLICY_PARAMS, help) {
                let e = s.parse::<KvScheme>().unwrap().evict.unwrap();
                if !policies.contains(&e) {
                    policies.push(e);
                }
            }
        }
        // Stores: every (K, V) with per-token values, the presets' pairs among them.
        let mut stores: Vec<(Quant, Quant)> = Vec::new();
        for &k in &quants {
            for &v in quants.iter().filter(|v| !v.per_channel()) {
                stores.push((k, v));
            }
        }
        for &(name, k, v) in preset_pairs() {
            assert!(stores.contains(&(k, v)), "preset {name} outside the grid");
        }
        let mut out = Vec::new();
        for &(k, v) in &stores {
            let evicts = std::iter::once(None).chain(
                policies
                    .iter()
                    .copied()
                    .map(Some)
                    .filter(|_| !k.per_channel()),
            );
            for evict in evicts {
                for rotate in [false, true] {
                    out.push(KvScheme {
                        evict,
                        k,
                        v,
                        rotate,
                    });
                }
            }
        }
        out
    }

    /// Issue 25: every scheme's printed name parses back to the same scheme, alone and in the
    /// whole list joined with commas.
    #[test]
    fn every_printed_name_parses_back() {
        let all = every_scheme();
        assert!(all.len() > 1000, "{}", all.len());
        let names: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        for (s, name) in all.iter().zip(&names) {
            let back: KvScheme = name.parse().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&back, s, "{name}");
        }
        // The first entry that differs, so a failure names one scheme, not thousands.
        fn same<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T]) {
            if let Some(i) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) {
                panic!("entry {i}: got {:?}, want {:?}", got.get(i), want.get(i));
            }
        }
        let joined = names.join(",");
        same(&split_scheme_list(&joined), &names);
        same(&parse_scheme_list(&joined).unwrap(), &all);
        // Every preset name appears as printed.
        for (name, _) in PRESETS {
            assert!(names.iter().any(|n| n == name), "{name}");
        }
        // meta.json's `SchemeList` round trip: `measure::settings`' tests (kv cannot reach up).
    }

    /// Defect 10: a parameter given twice is refused naming it (it used to let the last one
    /// win), and so is h2o's budget given both as tokens and as a ratio.
    #[test]
    fn repeated_parameters_are_refused() {
        for (bad, names) in [
            (
                "int4:group=32,group=64",
                "parameter `group` of `int4` is given twice",
            ),
            (
                "window:size=8,size=16@int8",
                "parameter `size` of `window` is given twice",
            ),
            (
                "fp8:scale=head,scale=none",
                "parameter `scale` of `fp8` is given twice",
            ),
            (
                "h2o:recent=8,ratio=0.2,recent=16",
                "parameter `recent` of `h2o` is given twice",
            ),
            (
                "h2o:budget=64,ratio=0.2",
                "h2o takes `budget=N` (tokens) or `ratio=r` (share of tokens seen), not both",
            ),
            (
                "h2o:ratio=0.5,budget=64@int8",
                "h2o takes `budget=N` (tokens) or `ratio=r` (share of tokens seen), not both",
            ),
        ] {
            let e = bad.parse::<KvScheme>().unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
            match &e {
                Error::UnknownScheme { input, reason, .. } => {
                    assert_eq!(input, bad);
                    assert!(reason.starts_with(names), "{bad}: {reason}");
                }
                other => panic!("{bad}: {other:?}"),
            }
            // The same through a list, where the repeat is a continuation.
            assert!(parse_scheme_list(&format!("fp16,{bad}")).is_err(), "{bad}");
        }
    }

    /// Issue 26: every vLLM `--kv-cache-dtype` alias parses to the scheme it names, stated here
    /// independently of [`VLLM_ALIASES`] (vLLM's `config/cache.py` names; the formats and
    /// scales from `kv::formats::fp8`), prints under kvbench's name, composes like a format,
    /// and refuses parameters. kvbench's own `fp8` keeps its per-token scale.
    #[test]
    fn vllm_aliases_parse_to_the_scheme_they_name() {
        let fp8 = |kind, scale| Quant::Fp8 { kind, scale };
        let want = [
            ("auto", Quant::Fp16, "fp16"),
            ("bfloat16", Quant::Fp16, "fp16"),
            (
                "fp8_e4m3",
                fp8(Fp8Kind::E4M3, Fp8Scale::Tensor),
                "fp8:scale=tensor",
            ),
            (
                "fp8_e5m2",
                fp8(Fp8Kind::E5M2, Fp8Scale::None),
                "fp8-e5m2:scale=none",
            ),
        ];
        assert_eq!(
            VLLM_ALIASES.len(),
            want.len(),
            "a new alias needs a row here"
        );
        for (alias, q, printed) in want {
            for given in [alias.to_string(), alias.to_ascii_uppercase()] {
                let s: KvScheme = given.parse().unwrap_or_else(|e| panic!("{given}: {e}"));
                assert_eq!(
                    (s.k, s.v, s.evict, s.rotate),
                    (q, q, None, false),
                    "{given}"
                );
                assert_eq!(s.to_string(), printed, "{given}");
            }
            // Composed: as K of a pair, under eviction, rotated.
            let pair: KvScheme = format!("{alias}/int4").parse().unwrap();
            assert_eq!((pair.k, pair.v), (q, Quant::Int4 { group: 32 }), "{alias}");
            let evicted: KvScheme = format!("window:size=16@{alias}+rot").parse().unwrap();
            assert_eq!((evicted.k, evicted.rotate), (q, true), "{alias}");
            assert!(evicted.evict.is_some());
            let e = format!("{alias}:scale=head")
                .parse::<KvScheme>()
                .unwrap_err()
                .to_string();
            assert!(e.contains("takes no parameters"), "{alias}: {e}");
        }
        // kvbench's fp8 and fp8-e4m3 (hyphen) keep the per-token scale; vLLM's plain `fp8`
        // is not an alias.
        for own in ["fp8", "fp8-e4m3"] {
            let s: KvScheme = own.parse().unwrap();
            assert_eq!(s.k, fp8(Fp8Kind::E4M3, Fp8Scale::Token), "{own}");
            assert_eq!(s.to_string(), "fp8");
        }
        // No alias is a preset or a registered name (it would change how a scheme prints).
        for (alias, spec, _) in VLLM_ALIASES {
            assert!(PRESETS.iter().all(|(p, _)| p != alias), "{alias}");
            assert!(
                super::super::formats::PARSERS
                    .iter()
                    .all(|(names, _)| !names.contains(alias)),
                "{alias}"
            );
            assert_eq!(vllm_alias(alias), Some(*spec));
        }
    }

    /// Issue 26: an unknown name is answered with the nearest valid names first (Levenshtein
    /// distance by hand: `int9` is one substitution from `int8`, `int4`, `int2`; `fp61` two from
    /// `fp16`; `winodw` two from `window`; `fp8_e4m4` one from `fp8_e4m3`, two from `fp8-e4m3`
    /// and `fp8_e5m2`, three from `fp8-e5m2`), the full list after.
    #[test]
    fn unknown_names_suggest_the_nearest() {
        for (bad, near) in [
            ("int9", "did you mean `int8`, `int4`, `int2`?"),
            ("fp61", "did you mean `fp16`"),
            (
                "fp8_e4m4",
                "did you mean `fp8_e4m3`, `fp8-e4m3`, `fp8_e5m2`?",
            ),
            ("winodw@int8", "did you mean `window`?"),
            ("k4v3", "did you mean `k4v2`"),
        ] {
            let e = bad.parse::<KvScheme>().unwrap_err().to_string();
            let (first, rest) = e.split_once("valid schemes").unwrap();
            assert!(first.contains(near), "{bad}: {e}");
            assert!(rest.contains("turboquant_3bit_nc"), "{bad}: {e}");
        }
        let e = "zzzzzzzz".parse::<KvScheme>().unwrap_err().to_string();
        assert!(!e.contains("did you mean"), "{e}");
    }
}
