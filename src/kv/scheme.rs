//! [`KvScheme`]: optional eviction, K and V formats, optional rotation — and the exact byte
//! accounting the cache, the planner and the reports share. Every per-format and per-policy
//! number comes from its own file ([`super::formats`], [`super::evict`]); the spec string is
//! [`super::spec`]'s.

use super::evict::Eviction;
use super::formats::Quant;
use crate::error::{Error, Result};

/// The cache-relevant shape of a decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

    /// Checks the scheme against a model's head_dim before anything is allocated (each format's
    /// own constraint, and `+rot`'s block size).
    /// Errors: [`Error::InvalidArgument`] naming the scheme and what to change.
    pub fn validate(&self, head_dim: usize) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidArgument {
                name: format!("scheme {self}"),
                reason,
            })
        };
        for q in [self.k, self.v] {
            if let Err(reason) = q.check(head_dim) {
                return bad(reason);
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
        q.row_bytes(d)
    }

    /// Exact bytes one (sequence, kv head, K or V) stream in `q` holds after `n` tokens, as the
    /// cache stores them.
    pub fn stream_bytes(q: Quant, d: usize, n: usize) -> usize {
        q.stream_bytes(d, n)
    }

    /// Tokens held per (sequence, kv head) after `seen` tokens (the eviction cap).
    pub fn held_tokens(&self, seen: usize) -> usize {
        match self.evict {
            None => seen,
            Some(e) => e.held_tokens(seen),
        }
    }

    /// Exact KV bytes of a whole cache after `seen` tokens per sequence: K and V, every layer,
    /// kv head and sequence, scales and zero-points included, plus eviction bookkeeping (a u32
    /// position per held token, and an f32 score for H2O) and per-layer fp8 tensor scales.
    pub fn bytes_for(&self, geom: &CacheGeometry, batch: usize, seen: usize) -> usize {
        self.bytes_for_held(geom, batch, self.held_tokens(seen))
    }

    /// Exact KV bytes of a whole cache holding `held` tokens per (sequence, kv head) — the same
    /// accounting as [`Self::bytes_for`] without the eviction cap (paged planning rounds `held`
    /// up to whole blocks first).
    pub fn bytes_for_held(&self, geom: &CacheGeometry, batch: usize, held: usize) -> usize {
        let d = geom.head_dim;
        let per_head = self.k.stream_bytes(d, held)
            + self.v.stream_bytes(d, held)
            + held * self.bookkeeping_bytes_per_token();
        let layer_bytes = if held > 0 {
            self.k.layer_bytes() + self.v.layer_bytes()
        } else {
            0
        };
        geom.layers * (batch * geom.kv_heads * per_head + layer_bytes)
    }

    /// Eviction bookkeeping per held token and kv head: u32 position (+ f32 score for H2O).
    pub fn bookkeeping_bytes_per_token(&self) -> usize {
        self.evict.map_or(0, |e| e.bookkeeping_bytes_per_token())
    }

    /// Bytes per token of context for a whole model without eviction caps: the marginal cost
    /// of one more token once every fixed cost (residual rows, per-head scales) is paid, i.e.
    /// `(bytes(n + K) − bytes(n)) / K` for a large `n` and `K` a multiple of every token group.
    pub fn bytes_per_token(&self, geom: &CacheGeometry) -> usize {
        let plain = KvScheme {
            evict: None,
            ..*self
        };
        let k = self.k.token_group() * self.v.token_group();
        let n = 1 << 20;
        (plain.bytes_for(geom, 1, n + k) - plain.bytes_for(geom, 1, n)) / k
    }
}
