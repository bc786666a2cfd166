//! [`KvScheme`]: optional eviction, K and V formats, optional rotation — and the exact byte
//! accounting the cache, the planner and the reports share. Every per-format and per-policy
//! number comes from its own file ([`super::formats`], [`super::evict`]); the spec string is
//! [`super::spec`]'s.

use super::evict::Eviction;
use super::formats::Quant;
use super::window::{SlidingWindow, TokensHeld};
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
    /// Hybrid attention: the sliding window and which layers attend globally (`None`: every
    /// layer global, a plain Llama). Absent in run folders made before it existed.
    #[serde(default)]
    pub window: Option<SlidingWindow>,
}

impl CacheGeometry {
    /// Layers that attend globally and so hold every token: all of them without a window.
    pub fn global_layers(&self) -> usize {
        self.window
            .map_or(self.layers, |w| w.global_layers(self.layers))
    }

    /// Layers that keep only the sliding window (0 without one).
    pub fn window_layers(&self) -> usize {
        self.layers - self.global_layers()
    }

    /// Whether layer `l` (0-based) keeps only the window.
    pub fn is_window_layer(&self, l: usize) -> bool {
        self.window.is_some_and(|w| !w.is_global(l))
    }

    /// Tokens each layer type holds per (sequence, kv head) once `held` tokens are cached:
    /// window layers `min(held, window)`, global layers `held` (without a window both `held`).
    pub fn tokens_held(&self, held: usize) -> TokensHeld {
        TokensHeld {
            window: self.window.map_or(held, |w| held.min(w.window)),
            global: held,
        }
    }

    /// Tokens held summed over layers after `held` tokens (one sequence, one kv head):
    /// `window_layers · min(held, window) + global_layers · held`. Gemma 3 27B at 131,072:
    /// 52 · 1024 + 10 · 131,072 = 1,363,968; the same model counted all-global holds
    /// 62 · 131,072 = 8,126,464 (5.96× more).
    pub fn layer_tokens(&self, held: usize) -> usize {
        let t = self.tokens_held(held);
        self.window_layers() * t.window + self.global_layers() * t.global
    }

    /// The same shape with every layer global (the naive count, and what kvbench's own
    /// [`super::KvCache`] stores until it applies windows at run time).
    pub fn without_window(&self) -> Self {
        CacheGeometry {
            window: None,
            ..*self
        }
    }
}

/// Exact KV bytes split by layer type (see [`KvScheme::bytes_by_layer_type`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct LayerBytes {
    /// Bytes of the sliding-window layers (0 without a window).
    pub window: usize,
    /// Bytes of the global layers (every layer without a window).
    pub global: usize,
}

impl LayerBytes {
    /// Both together.
    pub fn total(&self) -> usize {
        self.window + self.global
    }
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
    /// With a sliding window ([`CacheGeometry::window`]) window layers hold
    /// `min(held, window)` tokens and global layers `held` (see [`Self::bytes_by_layer_type`]).
    pub fn bytes_for(&self, geom: &CacheGeometry, batch: usize, seen: usize) -> usize {
        self.bytes_for_held(geom, batch, self.held_tokens(seen))
    }

    /// Exact KV bytes of a whole cache holding `held` tokens per (sequence, kv head) on its
    /// global layers and `min(held, window)` on its window layers — the same accounting as
    /// [`Self::bytes_for`] without the eviction cap.
    pub fn bytes_for_held(&self, geom: &CacheGeometry, batch: usize, held: usize) -> usize {
        let t = geom.tokens_held(held);
        self.bytes_by_layer_type(geom, batch, t.window, t.global)
            .total()
    }

    /// Exact KV bytes split by layer type, with `window_held` tokens per (sequence, kv head) on
    /// each window layer and `global_held` on each global layer (paged planning passes the
    /// block-rounded counts). Per layer: `batch · kv_heads · (K stream + V stream + bookkeeping)`
    /// plus the per-layer fp8 scales of a layer holding anything. The per-layer-type formula of
    /// hybrid models (Gemma 3 report, arXiv 2503.19786, §2.2 and Fig. 5): fp16 Gemma 3 27B after
    /// 131,072 tokens holds `(10 · 131,072 + 52 · 1024) · 2 (K, V) · 16 heads · 128 · 2 bytes`,
    /// plus on each window layer the position kvbench's cache keeps per held token to drop what
    /// leaves the window ([`Self::window_bookkeeping_bytes_per_token`]: `52 · 1024 · 16 · 4`).
    pub fn bytes_by_layer_type(
        &self,
        geom: &CacheGeometry,
        batch: usize,
        window_held: usize,
        global_held: usize,
    ) -> LayerBytes {
        let positions =
            batch * geom.kv_heads * window_held * self.window_bookkeeping_bytes_per_token();
        LayerBytes {
            window: geom.window_layers() * (self.layer_bytes(geom, batch, window_held) + positions),
            global: geom.global_layers() * self.layer_bytes(geom, batch, global_held),
        }
    }

    /// Bytes per held token and kv head a sliding-window layer keeps beyond
    /// [`Self::bookkeeping_bytes_per_token`]: the u32 absolute position the cache evicts by
    /// (`KvCache::set_layer_windows`; llama.cpp's KV cells keep a position per token too), 4
    /// bytes, unless the scheme's own eviction already keeps one (0).
    pub fn window_bookkeeping_bytes_per_token(&self) -> usize {
        if self.evicts() {
            0
        } else {
            4
        }
    }

    /// Bytes of one layer holding `held` tokens per (sequence, kv head).
    fn layer_bytes(&self, geom: &CacheGeometry, batch: usize, held: usize) -> usize {
        let d = geom.head_dim;
        let per_head = self.k.stream_bytes(d, held)
            + self.v.stream_bytes(d, held)
            + held * self.bookkeeping_bytes_per_token();
        let scales = if held > 0 {
            self.k.layer_bytes() + self.v.layer_bytes()
        } else {
            0
        };
        batch * geom.kv_heads * per_head + scales
    }

    /// Eviction bookkeeping per held token and kv head: u32 position (+ f32 score for H2O).
    pub fn bookkeeping_bytes_per_token(&self) -> usize {
        self.evict.map_or(0, |e| e.bookkeeping_bytes_per_token())
    }

    /// Bytes per token of context on every layer without eviction caps (a token inside every
    /// layer's window, so sliding windows do not apply): the marginal cost of one more token
    /// once every fixed cost (residual rows, per-head scales) is paid, i.e.
    /// `(bytes(n + K) − bytes(n)) / K` for a large `n` and `K` a multiple of every token group.
    pub fn bytes_per_token(&self, geom: &CacheGeometry) -> usize {
        let plain = KvScheme {
            evict: None,
            ..*self
        };
        let geom = geom.without_window();
        let k = self.k.token_group() * self.v.token_group();
        let n = 1 << 20;
        (plain.bytes_for(&geom, 1, n + k) - plain.bytes_for(&geom, 1, n)) / k
    }

    /// [`Self::bytes_per_token`] of one layer (every layer stores the same rows):
    /// `bytes_per_token / layers`. Bytes a decode step reads are this times
    /// [`CacheGeometry::layer_tokens`].
    pub fn bytes_per_layer_token(&self, geom: &CacheGeometry) -> f64 {
        self.bytes_per_token(geom) as f64 / geom.layers.max(1) as f64
    }
}
