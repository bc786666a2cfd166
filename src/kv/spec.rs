//! KV-cache scheme specs: the strings `--dtypes` takes and the CSV prints.
//!
//! Grammar (whitespace-free):
//!
//! ```text
//! scheme  := [evict '@'] store ['+rot']         e.g. window:size=1024@int8, q4_0+rot
//! store   := quant | quant '/' quant            K and V formats, e.g. int4-channel/int4
//! evict   := h2o[:budget=N|ratio=r,recent=M] | window[:size=W,sinks=S]
//! quant   := fp16 | int8-token (int8) | int8-channel[:group=G,residual=R]
//!          | int4[:group=G] | int4-channel[:group=G,residual=R]
//!          | fp8[:scale=token|head|tensor|none] | fp8-e5m2[:scale=...] | q8_0 | q4_0
//! ```
//!
//! A lone `h2o` or `window` stores fp16; a lone `*-channel` spec means KIVI's pairing (keys
//! per-channel, values per-token at the same bit width).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Default int4 group size along head_dim (KIVI's and ggml's 32).
pub const DEFAULT_INT4_GROUP: usize = 32;
/// Default token-group size of per-channel key quantization (KIVI §4: G = 32).
pub const DEFAULT_CHANNEL_GROUP: usize = 32;
/// Default full-precision residual of per-channel key quantization (KIVI uses R = 128; we keep
/// the same so short prompts are not quantized at all, as in KIVI).
pub const DEFAULT_RESIDUAL: usize = 128;
/// Default H2O budget as a share of tokens seen (H2O §5: 20 % heavy hitters + recent).
pub const DEFAULT_H2O_RATIO: f32 = 0.2;
/// Default H2O recent window (tokens).
pub const DEFAULT_H2O_RECENT: usize = 32;
/// Default sliding-window size (tokens).
pub const DEFAULT_WINDOW: usize = 256;
/// Default attention sinks for `window` (StreamingLLM §3.2 finds 4 sink tokens enough).
pub const DEFAULT_SINKS: usize = 4;

/// Every accepted spec, for error messages and `--help`.
pub const VALID_SCHEMES: &str =
    "fp16, int8-token (alias int8), int8-channel[:group=G,residual=R], \
int4[:group=G], int4-channel[:group=G,residual=R], fp8[:scale=token|head|tensor|none], \
fp8-e5m2[:scale=...], q8_0, q4_0, h2o[:budget=N|ratio=r,recent=M], window[:size=W,sinks=S]; \
compose as EVICT@K/V+rot, e.g. window:size=1024@int8, int4-channel/int4, q4_0+rot";

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

/// How K or V rows are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quant {
    /// IEEE binary16.
    Fp16,
    /// Symmetric int8, f16 absmax scale per (token, kv head).
    Int8Token,
    /// Asymmetric int4 along head_dim: f16 scale and zero-point per group.
    Int4 { group: usize },
    /// Per-channel keys (KIVI): codes per channel with scales over groups of `group` tokens; the
    /// newest tokens stay fp16 until `residual` + a full group have arrived.
    Channel {
        bits: u8,
        group: usize,
        residual: usize,
    },
    /// FP8 with scales at the chosen granularity.
    Fp8 { kind: Fp8Kind, scale: Fp8Scale },
    /// ggml's Q8_0: blocks of 32 along head_dim, symmetric, f16 scale (34 bytes per block).
    Q8_0,
    /// ggml's Q4_0: blocks of 32 along head_dim, symmetric 4-bit, f16 scale (18 bytes per block).
    Q4_0,
}

/// Token eviction policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Eviction {
    /// Heavy-Hitter Oracle (Zhang et al. 2023, arXiv 2306.14048, Alg. 1): keep the tokens with
    /// the largest accumulated attention (per kv head, summed over its query heads) plus the
    /// `recent` newest; at most `budget` tokens per (sequence, kv head).
    H2o { budget: Budget, recent: usize },
    /// Sliding window of the `size` newest tokens plus the first `sinks` tokens (attention sinks,
    /// StreamingLLM, Xiao et al. 2023, arXiv 2309.17453). Keys keep their original RoPE
    /// positions (they are cached after rotation); StreamingLLM re-rotates them to positions
    /// inside the cache instead.
    Window { size: usize, sinks: usize },
}

/// H2O cache budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// A fixed number of tokens.
    Tokens(usize),
    /// A share of the tokens seen so far (rounded up), as in the H2O paper's KV budget %.
    Ratio(f32),
}

/// A KV-cache scheme: optional eviction, K and V storage, optional Hadamard rotation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScheme {
    /// Eviction policy, if any.
    pub evict: Option<Eviction>,
    /// Key storage.
    pub k: Quant,
    /// Value storage.
    pub v: Quant,
    /// Walsh–Hadamard rotation of Q/K/V before storing (QuaRot, arXiv 2404.00456; llama.cpp
    /// rotates quantized caches in blocks of 64).
    pub rotate: bool,
}

impl KvScheme {
    /// The FP16 baseline.
    pub const FP16: KvScheme = KvScheme::plain(Quant::Fp16);

    /// K and V in the same format, no eviction, no rotation.
    pub const fn plain(q: Quant) -> Self {
        KvScheme {
            evict: None,
            k: q,
            v: q,
            rotate: false,
        }
    }

    /// Whether this is the plain fp16 baseline.
    pub fn is_baseline(&self) -> bool {
        *self == KvScheme::FP16
    }

    /// Whether tokens can be dropped (eviction schemes).
    pub fn evicts(&self) -> bool {
        self.evict.is_some()
    }

    /// Checks the scheme against a model's head_dim before anything is allocated.
    /// Errors: [`Error::InvalidArgument`] naming the scheme and what to change.
    pub fn validate(&self, head_dim: usize) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidArgument {
                name: format!("scheme {self}"),
                reason,
            })
        };
        for q in [self.k, self.v] {
            match q {
                Quant::Int4 { group } if !head_dim.is_multiple_of(group) => {
                    return bad(format!(
                        "int4 group {group} must divide the model's head_dim {head_dim}"
                    ))
                }
                Quant::Q8_0 | Quant::Q4_0 if !head_dim.is_multiple_of(32) => {
                    return bad(format!(
                        "ggml blocks of 32 need head_dim divisible by 32 (model: {head_dim})"
                    ))
                }
                Quant::Channel { bits: 4, .. } if !head_dim.is_multiple_of(2) => {
                    return bad(format!(
                        "4-bit codes need an even head_dim (model: {head_dim})"
                    ))
                }
                _ => {}
            }
        }
        if self.rotate && !head_dim.is_power_of_two() && !head_dim.is_multiple_of(64) {
            return bad(format!(
                "+rot needs head_dim a power of two or a multiple of 64 (model: {head_dim})"
            ));
        }
        Ok(())
    }

    /// Bytes one stored row takes in quant `q` (excluding per-head/per-layer fp8 scales and the
    /// channel format, whose cost depends on the token count: see [`Self::bytes_for`]).
    pub fn row_bytes(q: Quant, d: usize) -> usize {
        match q {
            Quant::Fp16 => 2 * d,
            Quant::Int8Token => d + 2,
            Quant::Int4 { group } => d / group * (4 + group / 2),
            Quant::Channel { .. } => 2 * d, // residual rows; blocks counted in bytes_for
            Quant::Fp8 {
                scale: Fp8Scale::Token,
                ..
            } => d + 2,
            Quant::Fp8 { .. } => d,
            Quant::Q8_0 => d / 32 * 34,
            Quant::Q4_0 => d / 32 * 18,
        }
    }

    /// Exact bytes one (sequence, kv head, K or V) stream in `q` holds after `n` tokens, as the
    /// cache stores them.
    pub fn stream_bytes(q: Quant, d: usize, n: usize) -> usize {
        match q {
            Quant::Channel {
                bits,
                group,
                residual,
            } => {
                let quantized = if n >= residual + group {
                    (n - residual) / group * group
                } else {
                    0
                };
                let blocks = quantized / group;
                let codes = group * d * bits as usize / 8;
                let params = d * if bits == 8 { 2 } else { 4 };
                blocks * (codes + params) + (n - quantized) * 2 * d
            }
            Quant::Fp8 {
                scale: Fp8Scale::Head,
                ..
            } => n * d + 4,
            _ => n * Self::row_bytes(q, d),
        }
    }

    /// Tokens held per (sequence, kv head) after `seen` tokens (the eviction cap).
    pub fn held_tokens(&self, seen: usize) -> usize {
        match self.evict {
            None => seen,
            Some(Eviction::Window { size, sinks }) => seen.min(size + sinks),
            Some(Eviction::H2o { budget, recent }) => seen.min(h2o_budget(budget, recent, seen)),
        }
    }

    /// Exact KV bytes of a whole cache after `seen` tokens per sequence: K and V, every layer,
    /// kv head and sequence, scales and zero-points included, plus eviction bookkeeping (a u32
    /// position per held token, and an f32 score for H2O) and per-layer fp8 tensor scales.
    pub fn bytes_for(&self, geom: &super::CacheGeometry, batch: usize, seen: usize) -> usize {
        self.bytes_for_held(geom, batch, self.held_tokens(seen))
    }

    /// Exact KV bytes of a whole cache holding `held` tokens per (sequence, kv head) — the same
    /// accounting as [`Self::bytes_for`] without the eviction cap (paged planning rounds `held`
    /// up to whole blocks first).
    pub fn bytes_for_held(&self, geom: &super::CacheGeometry, batch: usize, held: usize) -> usize {
        let seen = held;
        let d = geom.head_dim;
        let per_head = Self::stream_bytes(self.k, d, held)
            + Self::stream_bytes(self.v, d, held)
            + held * self.bookkeeping_bytes_per_token();
        let tensor_scales = [self.k, self.v]
            .iter()
            .filter(|q| {
                matches!(
                    q,
                    Quant::Fp8 {
                        scale: Fp8Scale::Tensor,
                        ..
                    }
                )
            })
            .count()
            * 4;
        geom.layers * (batch * geom.kv_heads * per_head + if seen > 0 { tensor_scales } else { 0 })
    }

    /// Eviction bookkeeping per held token and kv head: u32 position (+ f32 score for H2O).
    pub fn bookkeeping_bytes_per_token(&self) -> usize {
        match self.evict {
            None => 0,
            Some(Eviction::Window { .. }) => 4,
            Some(Eviction::H2o { .. }) => 8,
        }
    }

    /// Bytes per token of context for a whole model without eviction caps: the marginal cost
    /// of one more token once every fixed cost (residual rows, per-head scales) is paid, i.e.
    /// `(bytes(n + K) − bytes(n)) / K` for a large `n` and `K` a multiple of every token group.
    pub fn bytes_per_token(&self, geom: &super::CacheGeometry) -> usize {
        let plain = KvScheme {
            evict: None,
            ..*self
        };
        let group = |q: Quant| match q {
            Quant::Channel { group, .. } => group,
            _ => 1,
        };
        let k = group(self.k) * group(self.v);
        let n = 1 << 20;
        (plain.bytes_for(geom, 1, n + k) - plain.bytes_for(geom, 1, n)) / k
    }
}

/// H2O's budget after `seen` tokens: at least the recent window plus one heavy hitter.
pub fn h2o_budget(budget: Budget, recent: usize, seen: usize) -> usize {
    let b = match budget {
        Budget::Tokens(n) => n,
        Budget::Ratio(r) => (r as f64 * seen as f64).ceil() as usize,
    };
    b.max(recent + 1)
}

impl fmt::Display for Quant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Quant::Fp16 => write!(f, "fp16"),
            Quant::Int8Token => write!(f, "int8-token"),
            Quant::Int4 { group } if group == DEFAULT_INT4_GROUP => write!(f, "int4"),
            Quant::Int4 { group } => write!(f, "int4:group={group}"),
            Quant::Channel {
                bits,
                group,
                residual,
            } => {
                write!(f, "int{bits}-channel")?;
                if (group, residual) != (DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL) {
                    write!(f, ":group={group},residual={residual}")?;
                }
                Ok(())
            }
            Quant::Fp8 { kind, scale } => {
                write!(
                    f,
                    "{}",
                    if kind == Fp8Kind::E4M3 {
                        "fp8"
                    } else {
                        "fp8-e5m2"
                    }
                )?;
                match scale {
                    Fp8Scale::Token => Ok(()),
                    Fp8Scale::Head => write!(f, ":scale=head"),
                    Fp8Scale::Tensor => write!(f, ":scale=tensor"),
                    Fp8Scale::None => write!(f, ":scale=none"),
                }
            }
            Quant::Q8_0 => write!(f, "q8_0"),
            Quant::Q4_0 => write!(f, "q4_0"),
        }
    }
}

impl fmt::Display for KvScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.evict {
            Some(Eviction::H2o { budget, recent }) => {
                write!(f, "h2o:")?;
                match budget {
                    Budget::Tokens(n) => write!(f, "budget={n}")?,
                    Budget::Ratio(r) => write!(f, "ratio={r}")?,
                }
                write!(f, ",recent={recent}")?;
            }
            Some(Eviction::Window { size, sinks }) => {
                write!(f, "window:size={size},sinks={sinks}")?
            }
            None => {}
        }
        let kivi_pair =
            matches!(self.k, Quant::Channel { bits, .. } if self.v == token_partner(bits));
        let store = if self.k == self.v || kivi_pair {
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

/// The per-token value format KIVI pairs with per-channel keys of `bits` bits.
fn token_partner(bits: u8) -> Quant {
    if bits == 8 {
        Quant::Int8Token
    } else {
        Quant::Int4 {
            group: DEFAULT_INT4_GROUP,
        }
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

    /// `name[:k=v,...]` → (name, params).
    fn split<'s>(&self, s: &'s str) -> Result<(&'s str, Vec<(&'s str, &'s str)>)> {
        let (name, params) = match s.split_once(':') {
            Some((n, p)) => (n, p),
            None => (s, ""),
        };
        let params = params
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|kv| {
                kv.split_once('=')
                    .ok_or_else(|| self.err(format!("parameter `{kv}` is not key=value")))
            })
            .collect::<Result<_>>()?;
        Ok((name, params))
    }

    fn num<T: FromStr>(&self, key: &str, v: &str) -> Result<T> {
        v.parse()
            .map_err(|_| self.err(format!("`{key}={v}` is not a valid number")))
    }

    fn unknown_param(&self, scheme: &str, key: &str, allowed: &str) -> Error {
        self.err(format!(
            "`{scheme}` has no parameter `{key}` (it takes {allowed})"
        ))
    }

    fn quant(&self, s: &str) -> Result<Quant> {
        let (name, params) = self.split(s)?;
        let no_params = |q: Quant| {
            if params.is_empty() {
                Ok(q)
            } else {
                Err(self.err(format!("`{name}` takes no parameters")))
            }
        };
        match name {
            "fp16" | "f16" => no_params(Quant::Fp16),
            "int8" | "int8-token" => no_params(Quant::Int8Token),
            "q8_0" => no_params(Quant::Q8_0),
            "q4_0" => no_params(Quant::Q4_0),
            "int4" | "int4-token" => {
                let mut group = DEFAULT_INT4_GROUP;
                for (k, v) in params {
                    match k {
                        "group" => group = self.num(k, v)?,
                        _ => return Err(self.unknown_param(name, k, "group=G")),
                    }
                }
                if group == 0 || !group.is_multiple_of(2) {
                    return Err(self.err(format!("int4 group {group} must be even and > 0")));
                }
                Ok(Quant::Int4 { group })
            }
            "int8-channel" | "int4-channel" => {
                let bits = if name == "int8-channel" { 8 } else { 4 };
                let (mut group, mut residual) = (DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL);
                for (k, v) in params {
                    match k {
                        "group" => group = self.num(k, v)?,
                        "residual" => residual = self.num(k, v)?,
                        _ => return Err(self.unknown_param(name, k, "group=G,residual=R")),
                    }
                }
                if group == 0 || (bits == 4 && group % 2 != 0) {
                    return Err(
                        self.err(format!("token group {group} must be > 0 (even for int4)"))
                    );
                }
                Ok(Quant::Channel {
                    bits,
                    group,
                    residual,
                })
            }
            "fp8" | "fp8-e4m3" | "fp8-e5m2" => {
                let kind = if name == "fp8-e5m2" {
                    Fp8Kind::E5M2
                } else {
                    Fp8Kind::E4M3
                };
                let mut scale = Fp8Scale::Token;
                for (k, v) in params {
                    match (k, v) {
                        ("scale", "token") => scale = Fp8Scale::Token,
                        ("scale", "head") => scale = Fp8Scale::Head,
                        ("scale", "tensor") => scale = Fp8Scale::Tensor,
                        ("scale", "none") => scale = Fp8Scale::None,
                        ("scale", other) => {
                            return Err(self.err(format!(
                                "fp8 scale `{other}`: use token, head, tensor or none"
                            )))
                        }
                        _ => {
                            return Err(self.unknown_param(name, k, "scale=token|head|tensor|none"))
                        }
                    }
                }
                Ok(Quant::Fp8 { kind, scale })
            }
            "" => Err(self.err("empty scheme")),
            other => Err(self.err(format!("no scheme is called `{other}`"))),
        }
    }

    fn eviction(&self, s: &str) -> Result<Option<Eviction>> {
        let (name, params) = self.split(s)?;
        match name {
            "h2o" => {
                let (mut budget, mut recent) =
                    (Budget::Ratio(DEFAULT_H2O_RATIO), DEFAULT_H2O_RECENT);
                for (k, v) in params {
                    match k {
                        "budget" => budget = Budget::Tokens(self.num(k, v)?),
                        "ratio" => {
                            let r: f32 = self.num(k, v)?;
                            if !(r > 0.0 && r <= 1.0) {
                                return Err(self.err(format!("h2o ratio {r} must be in (0, 1]")));
                            }
                            budget = Budget::Ratio(r)
                        }
                        "recent" => recent = self.num(k, v)?,
                        _ => {
                            return Err(self.unknown_param(
                                name,
                                k,
                                "budget=N or ratio=r, recent=M",
                            ))
                        }
                    }
                }
                if let Budget::Tokens(n) = budget {
                    if n <= recent {
                        return Err(self.err(format!(
                            "h2o budget {n} must exceed the recent window {recent}"
                        )));
                    }
                }
                Ok(Some(Eviction::H2o { budget, recent }))
            }
            "window" => {
                let (mut size, mut sinks) = (DEFAULT_WINDOW, DEFAULT_SINKS);
                for (k, v) in params {
                    match k {
                        "size" => size = self.num(k, v)?,
                        "sinks" => sinks = self.num(k, v)?,
                        _ => return Err(self.unknown_param(name, k, "size=W,sinks=S")),
                    }
                }
                if size == 0 {
                    return Err(self.err("window size must be ≥ 1"));
                }
                Ok(Some(Eviction::Window { size, sinks }))
            }
            _ => Ok(None),
        }
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
                None => return Err(self.err(format!("`{e}` before `@` is not h2o or window"))),
            },
            None => match self.eviction(&s)? {
                Some(ev) => (Some(ev), "fp16".to_string()),
                None => (None, s.clone()),
            },
        };
        let (k, v) = match store.split_once('/') {
            Some((k, v)) => {
                let (k, v) = (self.quant(k)?, self.quant(v)?);
                if matches!(v, Quant::Channel { .. }) {
                    return Err(self.err(
                        "per-channel quantization is for keys (KIVI §3.2); give values a per-token \
                         format, e.g. int4-channel/int4",
                    ));
                }
                (k, v)
            }
            None => match self.quant(&store)? {
                Quant::Channel { bits, .. } => (self.quant(&store)?, token_partner(bits)),
                q => (q, q),
            },
        };
        if evict.is_some() && matches!(k, Quant::Channel { .. }) {
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
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KvScheme {
    /// Parses the spec string, with the same error text as `--dtypes`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Splits a `--dtypes` list: commas separate schemes, except before `key=value` parameters of
/// the previous scheme (`int8-channel:group=32,residual=64,fp16` → two schemes).
pub fn split_scheme_list(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in list.split(',') {
        let is_param = part.contains('=') && !part.contains(':') && !part.contains('@');
        match out.last_mut() {
            Some(prev) if is_param => {
                prev.push(',');
                prev.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// Parses a `--dtypes` list. Errors: [`Error::UnknownScheme`] for the first bad entry.
pub fn parse_scheme_list(list: &str) -> Result<Vec<KvScheme>> {
    split_scheme_list(list).iter().map(|s| s.parse()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn nonsense_is_rejected_with_the_valid_list() {
        for bad in [
            "int3",
            "int4:group=7",
            "int4:size=32",
            "fp16:group=2",
            "fp8:scale=row",
            "h2o:budget=8,recent=16",
            "window:size=64@int8-channel",
            "int8/int4-channel",
            "foo@int8",
            "h2o:ratio=1.5",
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
    }
}
