//! KV-cache schemes and the cache that attention reads.
//!
//! The contract: the model hands each layer's new keys and values (`[batch, kv_heads, n_new,
//! head_dim]` f32, RoPE already applied to keys) to [`KvCache::append`], which quantizes them into
//! the scheme's stored form; [`KvCache::attend`] then computes causal attention for the new
//! queries by reading the stored form directly. Memory figures come from what is stored:
//! [`KvCache::kv_bytes`] counts every byte held (codes, scales, zero-points).

pub mod attention;
pub mod format;

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;

use crate::error::{Error, Result};
use format::{F16Row, Int4GroupRow, Int8TokenRow, RowCodec};

/// Default group size of [`KvScheme::Int4`] along head_dim (KIVI's and ggml's 32).
pub const DEFAULT_INT4_GROUP: usize = 32;

/// A KV-cache scheme, parsed from the same string the CLI takes and the CSV prints.
///
/// | spec | stored form | bytes per (token, kv head), head_dim = d |
/// |---|---|---|
/// | `fp16` | IEEE binary16 | `2d` |
/// | `int8-token` (alias `int8`) | i8 codes, one f16 absmax scale per (token, kv head) | `d + 2` |
/// | `int4[:group=G]` | 4-bit codes, f16 scale and f16 zero-point per group of G (default 32) | `d/G · (4 + G/2)` |
///
/// Parsing errors ([`Error::UnknownScheme`]) list the valid schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvScheme {
    /// FP16 baseline.
    Fp16,
    /// Symmetric int8, absmax scale per (token, kv head).
    Int8Token,
    /// Asymmetric int4, group-wise along head_dim with scale and zero-point per group.
    Int4 {
        /// Elements per group (even, divides head_dim).
        group: usize,
    },
}

/// The scheme specs `FromStr` accepts, for error messages and `--help`.
pub const VALID_SCHEMES: &str =
    "fp16, int8-token (alias int8), int4[:group=G] (G even, divides head_dim; default 32)";

impl KvScheme {
    /// Bytes one (token, kv head) row occupies for the given head_dim, scales included.
    pub fn row_bytes(&self, head_dim: usize) -> usize {
        match *self {
            KvScheme::Fp16 => F16Row.row_bytes(head_dim),
            KvScheme::Int8Token => Int8TokenRow.row_bytes(head_dim),
            KvScheme::Int4 { group } => Int4GroupRow { group }.row_bytes(head_dim),
        }
    }

    /// Exact KV bytes per token of context for a model: K and V, every layer and kv head.
    pub fn bytes_per_token(&self, geom: &CacheGeometry) -> usize {
        2 * geom.layers * geom.kv_heads * self.row_bytes(geom.head_dim)
    }

    /// Checks the scheme against a model's head_dim before anything is allocated.
    ///
    /// Errors: [`Error::InvalidArgument`] when the int4 group does not divide head_dim.
    pub fn validate(&self, head_dim: usize) -> Result<()> {
        if let KvScheme::Int4 { group } = *self {
            if group == 0 || group % 2 != 0 || head_dim % group != 0 {
                return Err(Error::InvalidArgument {
                    name: format!("scheme {self}"),
                    reason: format!(
                        "group size {group} must be even and divide the model's head_dim {head_dim}"
                    ),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for KvScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KvScheme::Fp16 => write!(f, "fp16"),
            KvScheme::Int8Token => write!(f, "int8-token"),
            KvScheme::Int4 { group } if group == DEFAULT_INT4_GROUP => write!(f, "int4"),
            KvScheme::Int4 { group } => write!(f, "int4:group={group}"),
        }
    }
}

impl serde::Serialize for KvScheme {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for KvScheme {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let unknown = |reason: String| Error::UnknownScheme {
            input: s.to_string(),
            reason,
            valid: VALID_SCHEMES.to_string(),
        };
        let (name, params) = match s.trim().split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s.trim(), None),
        };
        let params: Vec<(&str, &str)> = match params {
            None => vec![],
            Some(p) => p
                .split(',')
                .map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.trim(), v.trim()))
                        .ok_or_else(|| unknown(format!("parameter `{kv}` is not key=value")))
                })
                .collect::<Result<_>>()?,
        };
        let no_params = |scheme: KvScheme| {
            if params.is_empty() {
                Ok(scheme)
            } else {
                Err(unknown(format!("`{name}` takes no parameters")))
            }
        };
        match name.to_ascii_lowercase().as_str() {
            "fp16" | "f16" => no_params(KvScheme::Fp16),
            "int8" | "int8-token" => no_params(KvScheme::Int8Token),
            "int4" => {
                let mut group = DEFAULT_INT4_GROUP;
                for (k, v) in params {
                    match k {
                        "group" => {
                            group = v.parse().map_err(|_| {
                                unknown(format!("group `{v}` is not a positive integer"))
                            })?;
                            if group == 0 || group % 2 != 0 {
                                return Err(unknown(format!("group {group} must be even and > 0")));
                            }
                        }
                        other => {
                            return Err(unknown(format!(
                                "int4 has no parameter `{other}` (it takes group=G)"
                            )))
                        }
                    }
                }
                Ok(KvScheme::Int4 { group })
            }
            _ => Err(unknown(format!("no scheme is called `{name}`"))),
        }
    }
}

/// The cache-relevant shape of a decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheGeometry {
    /// Decoder layers.
    pub layers: usize,
    /// Key/value heads (GQA groups).
    pub kv_heads: usize,
    /// Query heads (a multiple of `kv_heads`).
    pub q_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// One layer's stored K and V: a byte buffer per (sequence, kv head), rows appended in order.
#[derive(Debug, Default, Clone)]
struct LayerStore {
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
    len: usize,
}

/// A KV cache for `batch` sequences of equal length, storing every layer in one scheme.
///
/// Shapes: inputs to [`append`](Self::append) are `[batch, kv_heads, n_new, head_dim]` f32;
/// queries to [`attend`](Self::attend) are `[batch, q_heads, n_new, head_dim]` f32. Query head `h`
/// reads kv head `h / (q_heads / kv_heads)` (grouped-query attention).
#[derive(Debug, Clone)]
pub struct KvCache {
    scheme: KvScheme,
    geom: CacheGeometry,
    batch: usize,
    layers: Vec<LayerStore>,
}

impl KvCache {
    /// An empty cache. Errors: [`Error::InvalidArgument`] for a scheme that does not fit the
    /// geometry (see [`KvScheme::validate`]) or a zero batch.
    pub fn new(scheme: KvScheme, geom: CacheGeometry, batch: usize) -> Result<Self> {
        scheme.validate(geom.head_dim)?;
        if batch == 0 {
            return Err(Error::InvalidArgument {
                name: "batch size".into(),
                reason: "must be at least 1".into(),
            });
        }
        let n = batch * geom.kv_heads;
        let layer = LayerStore {
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
            len: 0,
        };
        Ok(Self {
            scheme,
            geom,
            batch,
            layers: vec![layer; geom.layers],
        })
    }

    /// The scheme this cache stores.
    pub fn scheme(&self) -> KvScheme {
        self.scheme
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens held per sequence in `layer` (all layers agree between forward passes).
    pub fn len(&self, layer: usize) -> usize {
        self.layers[layer].len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(|l| l.len == 0)
    }

    /// Bytes of K/V held (codes, scales and zero-points), over all layers and sequences.
    pub fn kv_bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.k.iter().chain(&l.v))
            .map(Vec::len)
            .sum()
    }

    /// Bytes the cache has allocated (buffer capacity, ≥ `kv_bytes`).
    pub fn reserved_bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.k.iter().chain(&l.v))
            .map(Vec::capacity)
            .sum()
    }

    /// Drops every cached token but keeps the allocations (as a serving engine reuses blocks).
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            l.k.iter_mut().chain(l.v.iter_mut()).for_each(Vec::clear);
            l.len = 0;
        }
    }

    /// Quantizes and stores `n_new` tokens of keys and values for every sequence of `layer`.
    /// `k`, `v`: `[batch, kv_heads, n_new, head_dim]` f32.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32], n_new: usize) {
        let d = self.geom.head_dim;
        let rb = self.scheme.row_bytes(d);
        let scheme = self.scheme;
        let store = &mut self.layers[layer];
        let per_head = n_new * d;
        debug_assert_eq!(k.len(), store.k.len() * per_head);
        let encode = |buf: &mut Vec<u8>, x: &[f32]| {
            let start = buf.len();
            buf.resize(start + n_new * rb, 0);
            for (row, out) in x.chunks_exact(d).zip(buf[start..].chunks_exact_mut(rb)) {
                match scheme {
                    KvScheme::Fp16 => F16Row.encode(row, out),
                    KvScheme::Int8Token => Int8TokenRow.encode(row, out),
                    KvScheme::Int4 { group } => Int4GroupRow { group }.encode(row, out),
                }
            }
        };
        store
            .k
            .par_iter_mut()
            .zip(k.par_chunks(per_head))
            .chain(store.v.par_iter_mut().zip(v.par_chunks(per_head)))
            .for_each(|(buf, x)| encode(buf, x));
        store.len += n_new;
    }

    /// Causal attention of the newest `n_q` tokens of `layer` over everything cached there
    /// (call after [`append`](Self::append)). `q`: `[batch, q_heads, n_q, head_dim]` f32,
    /// RoPE applied; returns `[batch, q_heads, n_q, head_dim]` f32. See [`attention::attend`].
    pub fn attend(&self, layer: usize, q: &[f32], n_q: usize) -> Vec<f32> {
        let g = self.geom;
        let store = &self.layers[layer];
        let shape = attention::AttnShape {
            batch: self.batch,
            kv_heads: g.kv_heads,
            group: g.q_heads / g.kv_heads,
            n_q,
            n_keys: store.len,
            head_dim: g.head_dim,
        };
        let (k, v) = (&store.k, &store.v);
        match self.scheme {
            KvScheme::Fp16 => attention::attend(F16Row, k, v, q, shape),
            KvScheme::Int8Token => attention::attend(Int8TokenRow, k, v, q, shape),
            KvScheme::Int4 { group } => attention::attend(Int4GroupRow { group }, k, v, q, shape),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_strings_round_trip() {
        for (s, want) in [
            ("fp16", KvScheme::Fp16),
            ("int8", KvScheme::Int8Token),
            ("int8-token", KvScheme::Int8Token),
            ("int4", KvScheme::Int4 { group: 32 }),
            ("int4:group=64", KvScheme::Int4 { group: 64 }),
        ] {
            let got: KvScheme = s.parse().unwrap();
            assert_eq!(got, want);
            assert_eq!(got.to_string().parse::<KvScheme>().unwrap(), want);
        }
    }

    #[test]
    fn unknown_scheme_lists_valid_ones() {
        let err = "int3".parse::<KvScheme>().unwrap_err().to_string();
        assert!(
            err.contains("int3") && err.contains("int8-token") && err.contains("int4"),
            "{err}"
        );
        assert!("int4:group=7".parse::<KvScheme>().is_err());
        assert!("int4:size=32".parse::<KvScheme>().is_err());
        assert!("fp16:group=2".parse::<KvScheme>().is_err());
    }

    /// Bytes per token by hand for SmolLM2-135M (30 layers, 3 kv heads, head_dim 64):
    /// fp16 2·30·3·128 = 23040; int8 2·30·3·66 = 11880; int4 2·30·3·(2·(4+16)) = 7200.
    #[test]
    fn bytes_per_token_by_hand() {
        let g = CacheGeometry {
            layers: 30,
            kv_heads: 3,
            q_heads: 9,
            head_dim: 64,
        };
        assert_eq!(KvScheme::Fp16.bytes_per_token(&g), 23040);
        assert_eq!(KvScheme::Int8Token.bytes_per_token(&g), 11880);
        assert_eq!(KvScheme::Int4 { group: 32 }.bytes_per_token(&g), 7200);
        let mut c = KvCache::new(KvScheme::Int4 { group: 32 }, g, 2).unwrap();
        let x = vec![0.5f32; 2 * 3 * 5 * 64];
        for l in 0..30 {
            c.append(l, &x, &x, 5);
        }
        assert_eq!(c.kv_bytes(), 2 * 5 * 7200);
        assert!(KvCache::new(KvScheme::Int4 { group: 48 }, g, 1).is_err());
    }
}
