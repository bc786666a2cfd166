//! The decoder: a Llama-family transformer (Llama 2/3, Mistral, Qwen2, SmolLM) built from
//! candle ops, whose attention reads and writes a KV cache passed in from outside (any
//! [`AttentionCache`]), its configuration, and its linear layers in each weight dtype.
//!
//! Architecture as in Touvron et al. 2023 (Llama 2, §2.2): pre-norm RMSNorm, rotary position
//! embeddings (RoFormer, Su et al. 2021), grouped-query attention (Ainslie et al. 2023), SwiGLU MLP.
//! Qwen2 adds biases to the q/k/v projections.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, D};

use super::linear::tensor_bytes;
use super::linear::{Embedding, Linear, WeightDtype};
use crate::error::{Error, Result};
use crate::kv::{AttentionCache, CacheGeometry};

/// How rotary embeddings pair up the elements of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: GGUF Llama files, whose converter permutes Q/K rows for it.
    Interleaved,
    /// Halves `(i, i + d/2)`: Hugging Face checkpoints and GGUF Qwen2 ("NeoX" style).
    Half,
}

/// Hyper-parameters of a Llama-family decoder, read from GGUF metadata or `config.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    /// Architecture name as the file states it (`llama`, `qwen2`, `mistral`).
    pub arch: String,
    /// Decoder layers.
    pub layers: usize,
    /// Residual stream width.
    pub hidden: usize,
    /// SwiGLU inner width.
    pub intermediate: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// RoPE base frequency θ.
    pub rope_theta: f32,
    /// RoPE pairing.
    pub rope_style: RopeStyle,
    /// RMSNorm ε.
    pub rms_eps: f64,
    /// Context length the model was trained for (tokens).
    pub max_ctx: usize,
    /// Sliding attention window per layer, in tokens: `Some(w)` — the layer's queries see only
    /// keys at most `w − 1` positions back (Gemma 2/3 local layers; Longformer-style sliding
    /// window, Beltagy et al. 2020 §3.1) and its cache holds at most `w` tokens; `None` — global
    /// causal attention. Empty (Llama, Qwen2, Mistral files) means every layer is global.
    #[serde(skip_serializing_if = "no_windows")]
    pub layer_windows: Vec<Option<usize>>,
}

/// Whether no layer has a sliding window (the field is then left out of `meta.json`).
fn no_windows(w: &[Option<usize>]) -> bool {
    w.iter().all(Option::is_none)
}

impl ModelConfig {
    /// The geometry the KV cache needs, with the sliding windows of [`Self::layer_windows`]
    /// (Gemma 3: window 512 or 1024, every 6th layer global), so that every KV figure counted
    /// from it ([`crate::kv::KvScheme::bytes_for`]: a sweep's `kv_bytes_predicted`, the memory
    /// plan) holds `min(n, window)` tokens on a window layer. Windows that one
    /// [`crate::kv::SlidingWindow`] cannot describe (different sizes, more than 128 layers
    /// without a period; refused when a model is loaded, see [`Self::check_windows`]) count
    /// every layer as global, the upper bound.
    pub fn cache_geometry(&self) -> CacheGeometry {
        CacheGeometry {
            layers: self.layers,
            kv_heads: self.kv_heads,
            q_heads: self.q_heads,
            head_dim: self.head_dim,
            window: self.check_windows().unwrap_or(None),
        }
    }

    /// [`Self::layer_windows`] as one [`crate::kv::SlidingWindow`] (`None`: every layer global).
    /// Errors: [`Error::InvalidArgument`] naming `layer windows` for a window of 0 tokens,
    /// windows of different sizes, more windows than layers, or more than 128 layers whose
    /// global ones follow no period ([`crate::kv::window::from_layer_windows`]).
    pub fn check_windows(&self) -> Result<Option<crate::kv::SlidingWindow>> {
        crate::kv::window::from_layer_windows(&self.layer_windows, self.layers)
    }

    /// The sliding window of `layer` in tokens, `None` for a global layer (see
    /// [`Self::layer_windows`]).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.layer_windows.get(layer).copied().flatten()
    }
}

/// A decoder whose forward pass differs from the Llama one (Gemma 3: QK-norm, four norms per
/// block, GELU MLP, per-layer RoPE base and sliding windows) but shares [`Model`]'s weights
/// (embedding, [`Block`]s, output norm, head) and cache contract. Implemented in the variant's
/// own file (e.g. `gemma3.rs`), which names this file, never the other way round.
pub trait DecoderVariant: std::fmt::Debug + Send + Sync {
    /// [`Model::forward_hidden`] for this architecture: same arguments, shapes and errors.
    fn forward_hidden(
        &self,
        model: &Model,
        tokens: &[u32],
        batch: usize,
        cache: Option<&mut dyn AttentionCache>,
    ) -> Result<Tensor>;
    /// Applied to the head's logits `[..., vocab]` (final logit soft-capping); identity by
    /// default.
    fn finish_logits(&self, logits: Tensor) -> Result<Tensor> {
        Ok(logits)
    }
    /// Bytes of the weights the variant holds beyond [`Model`]'s (extra norms), as stored.
    fn extra_weight_bytes(&self) -> usize;
}

/// One decoder block's weights.
#[derive(Debug, Clone)]
pub struct Block {
    pub attn_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub ffn_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// Where a model came from, recorded in `meta.json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelSource {
    /// What the user passed to `--model`.
    pub spec: String,
    /// `gguf`, `safetensors` or `hf-hub`.
    pub format: String,
    /// Weight files read.
    pub files: Vec<PathBuf>,
    /// Hugging Face repo id, when resolved through hf-hub.
    pub repo: Option<String>,
}

/// The function a [`LayerInputHook`] holds: called with one layer's input hidden state
/// (`[batch, tokens, hidden]`, flattened to f32) to change it in place.
pub type LayerInputFn = dyn Fn(&mut [f32]) + Send + Sync;

/// A function applied in place to every decoder layer's input hidden state
/// ([`Model::with_layer_input_hook`]).
#[derive(Clone)]
pub struct LayerInputHook(pub std::sync::Arc<LayerInputFn>);

impl std::fmt::Debug for LayerInputHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LayerInputHook")
    }
}

/// A loaded Llama-family decoder.
#[derive(Debug, Clone)]
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Dtype of the linear layers.
    pub weight_dtype: WeightDtype,
    /// Where every weight lives and the forward pass runs.
    device: Device,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    /// A hook applied to each layer's input hidden state (noise-floor reruns,
    /// [`Model::with_layer_input_hook`]); `None` — the default — leaves the forward alone.
    perturb: Option<LayerInputHook>,
    /// The architecture's own forward pass, when it is not Llama's ([`Model::with_variant`]).
    variant: Option<std::sync::Arc<dyn DecoderVariant>>,
}

impl Model {
    /// Assembles a model from loaded weights. `embed`: `[vocab, hidden]`, a dense f32 tensor or
    /// the stored rows ([`Embedding`]). The model runs on `embed`'s device (the CPU for stored
    /// rows); every other weight must be on it too.
    pub fn new(
        config: ModelConfig,
        weight_dtype: WeightDtype,
        embed: impl Into<Embedding>,
        blocks: Vec<Block>,
        norm: Tensor,
        lm_head: Linear,
    ) -> Result<Self> {
        let embed = embed.into();
        let device = embed.device();
        let (cos, sin) = rope_tables(config.max_ctx, config.head_dim, config.rope_theta)?;
        let (cos, sin) = (cos.to_device(&device)?, sin.to_device(&device)?);
        Ok(Self {
            config,
            weight_dtype,
            device,
            embed,
            blocks,
            norm,
            lm_head,
            cos,
            sin,
            perturb: None,
            variant: None,
        })
    }

    /// This model with `variant`'s forward pass ([`DecoderVariant`]) instead of Llama's; the
    /// weights [`Model::new`] took stay where they are and the variant reads them through
    /// [`Self::embedding`], [`Self::blocks`] and [`Self::output_norm`].
    pub fn with_variant(mut self, variant: std::sync::Arc<dyn DecoderVariant>) -> Model {
        self.variant = Some(variant);
        self
    }

    /// Token embedding `[vocab, hidden]` (dense f32, or the stored rows: see [`Embedding`]).
    pub fn embedding(&self) -> &Embedding {
        &self.embed
    }

    /// The decoder blocks, in order.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Final RMSNorm weight `[hidden]` f32.
    pub fn output_norm(&self) -> &Tensor {
        &self.norm
    }

    /// RoPE cos/sin tables `[max_ctx, head_dim/2]` for base [`ModelConfig::rope_theta`].
    pub fn rope_tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    /// A layer's input hidden state through the layer-input hook, if one is set
    /// ([`Self::with_layer_input_hook`]); the identity otherwise.
    pub fn layer_input(&self, x: Tensor) -> Result<Tensor> {
        self.perturbed(x)
    }

    /// A copy of this model (weights shared, not copied) whose forward passes each decoder
    /// layer's input hidden state (`[batch, n, hidden]`, flattened row-major to f32, before the
    /// attention norm) through `hook` in place — the perplexity noise floor
    /// (`--ppl-noise-floor`) moves every element one ulp at random with
    /// `crate::quality::paired::perturb_rounding`. Calls run in layer order, so a seeded hook
    /// gives the same numbers every time. The plain model is unaffected.
    pub fn with_layer_input_hook(&self, hook: LayerInputHook) -> Model {
        let mut m = self.clone();
        m.perturb = Some(hook);
        m
    }

    /// [`Self::with_layer_input_hook`]'s step on one layer input; the identity when off.
    fn perturbed(&self, x: Tensor) -> Result<Tensor> {
        let Some(hook) = &self.perturb else {
            return Ok(x);
        };
        let shape = x.shape().clone();
        let mut v = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        (hook.0)(&mut v);
        Ok(Tensor::from_vec(v, shape, &self.device)?.to_dtype(x.dtype())?)
    }

    /// The device the weights live on and the forward pass runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes the weights occupy as stored, all layers together: quantized linear layers at
    /// their block storage size (e.g. Q8_0: 34 bytes per 32 weights), dense tensors (the f32
    /// embedding table, norms, f32 linear layers, biases) at element count × dtype size; a
    /// tensor shared by two layers (tied embeddings from safetensors) counts once. Excludes the
    /// RoPE tables, any padding a device allocator adds, and the repacked copies candle's CPU
    /// kernels may build lazily for their SIMD paths.
    pub fn weight_bytes(&self) -> usize {
        let mut seen = Vec::new();
        let mut n = self.embed.weight_bytes(&mut seen) + tensor_bytes(&self.norm, &mut seen);
        for b in &self.blocks {
            n += tensor_bytes(&b.attn_norm, &mut seen) + tensor_bytes(&b.ffn_norm, &mut seen);
            for l in [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down] {
                n += l.weight_bytes(&mut seen);
            }
        }
        n + self.lm_head.weight_bytes(&mut seen)
            + self.variant.as_ref().map_or(0, |v| v.extra_weight_bytes())
    }

    /// Of [`Self::weight_bytes`], the bytes that are the model file's mapped pages (shared with
    /// every other model of the same file in this process, and with the page cache); the rest
    /// are this model's own allocations.
    pub fn mapped_weight_bytes(&self) -> usize {
        let mut n = self.embed.mapped_bytes() + self.lm_head.mapped_bytes();
        for b in &self.blocks {
            for l in [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down] {
                n += l.mapped_bytes();
            }
        }
        n
    }

    /// Runs `tokens` (`[batch, n]`, row-major, `n` new tokens per sequence) through the decoder,
    /// appending their K/V to `cache` and attending over everything cached. Returns the final
    /// hidden states after the output norm, `[batch, n, hidden]` f32, on the model's device.
    ///
    /// `cache` is any [`AttentionCache`] whose tensors live on the model's device (the CPU
    /// [`KvCache`](crate::kv::KvCache) for a CPU model). With `cache = None` attention is
    /// computed by plain candle ops over the f32 K/V of this call only (no cache): the reference
    /// path the cached one is tested against.
    ///
    /// Errors: [`Error::InvalidArgument`] when the position would pass the model's context length
    /// or the cache returns tensors on another device than the model's; the cache's own errors.
    pub fn forward_hidden(
        &self,
        tokens: &[u32],
        batch: usize,
        mut cache: Option<&mut dyn AttentionCache>,
    ) -> Result<Tensor> {
        if let Some(v) = &self.variant {
            return v.forward_hidden(self, tokens, batch, cache);
        }
        let c = &self.config;
        let (n, pos0) = start_positions(cache.as_deref(), c, tokens, batch)?;
        let mut x = self
            .embed
            .lookup(tokens)?
            .to_device(&self.device)?
            .reshape((batch, n, c.hidden))?;
        let (cos, sin) = (
            table_rows(&self.cos, &pos0, n)?,
            table_rows(&self.sin, &pos0, n)?,
        );
        let rope = |t: Tensor| -> Result<Tensor> {
            Ok(match c.rope_style {
                RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&t, &cos, &sin)?,
                RopeStyle::Half => candle_nn::rotary_emb::rope(&t, &cos, &sin)?,
            })
        };
        let heads = |t: Tensor, h: usize| -> Result<Tensor> {
            Ok(t.reshape((batch, n, h, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        for (layer, blk) in self.blocks.iter().enumerate() {
            x = self.perturbed(x)?;
            let h = candle_nn::ops::rms_norm(&x, &blk.attn_norm, c.rms_eps as f32)?;
            let q = rope(heads(blk.q.forward(&h)?, c.q_heads)?)?;
            let k = rope(heads(blk.k.forward(&h)?, c.kv_heads)?)?;
            let v = heads(blk.v.forward(&h)?, c.kv_heads)?;
            let attn = match cache.as_deref_mut() {
                Some(cache) => {
                    cache.append_tensors(layer, &k, &v)?;
                    on_device(cache.attend_tensor(layer, &q)?, &self.device)?
                }
                None => reference_attention(&q, &k, &v, c)?,
            };
            let attn = attn
                .transpose(1, 2)?
                .reshape((batch, n, c.q_heads * c.head_dim))?;
            x = (x + blk.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &blk.ffn_norm, c.rms_eps as f32)?;
            let act = (candle_nn::ops::silu(&blk.gate.forward(&h)?)? * blk.up.forward(&h)?)?;
            x = (x + blk.down.forward(&act)?)?;
        }
        Ok(candle_nn::ops::rms_norm(&x, &self.norm, c.rms_eps as f32)?)
    }

    /// Logits for hidden states: `[..., hidden]` → `[..., vocab]` f32.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let logits = self.lm_head.forward(&hidden.contiguous()?)?;
        match &self.variant {
            Some(v) => v.finish_logits(logits),
            None => Ok(logits),
        }
    }

    /// Full forward: logits for every position, `[batch, n, vocab]` f32 (see
    /// [`forward_hidden`](Self::forward_hidden) for the arguments and errors).
    pub fn forward(
        &self,
        tokens: &[u32],
        batch: usize,
        cache: Option<&mut dyn AttentionCache>,
    ) -> Result<Tensor> {
        let h = self.forward_hidden(tokens, batch, cache)?;
        self.logits(&h)
    }

    /// Forward that returns only the last position's logits, `[batch, vocab]`: what prefill and
    /// decode steps need.
    pub fn forward_last(
        &self,
        tokens: &[u32],
        batch: usize,
        cache: &mut dyn AttentionCache,
    ) -> Result<Tensor> {
        let h = self.forward_hidden(tokens, batch, Some(cache))?;
        let n = h.dim(1)?;
        self.logits(&h.narrow(1, n - 1, 1)?.squeeze(1)?)
    }
}

/// softmax(QKᵀ/√d + causal mask)·V in f32 with candle ops; `q: [b, hq, n, d]`, `k, v: [b, hkv,
/// n, d]`. GQA by repeating each kv head `hq / hkv` times (as Hugging Face's `repeat_kv`).
fn reference_attention(q: &Tensor, k: &Tensor, v: &Tensor, c: &ModelConfig) -> Result<Tensor> {
    let (b, _, n, d) = q.dims4()?;
    let rep = c.q_heads / c.kv_heads;
    let expand = |t: &Tensor| -> Result<Tensor> {
        Ok(t.unsqueeze(2)?
            .expand((b, c.kv_heads, rep, n, d))?
            .reshape((b, c.q_heads, n, d))?)
    };
    let (k, v) = (expand(k)?, expand(v)?);
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| (0..n).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    let mask = Tensor::from_vec(mask, (n, n), q.device())?;
    let p = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
    Ok(p.matmul(&v.contiguous()?)?)
}

/// cos/sin tables `[max_ctx, head_dim/2]` f32 on the CPU for RoPE base `base`: θ_i =
/// base^(−2i/d), angle = pos · θ_i (RoFormer, Su et al. 2021, §3.4.2). Computed on the CPU for
/// every device, so positions are encoded identically everywhere. Errors:
/// [`Error::InvalidArgument`] when the tables would take more than half the available memory.
pub(crate) fn rope_tables(max_ctx: usize, head_dim: usize, base: f32) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    // Two f32 tables of max_ctx × half (max_ctx ≤ shapes::MAX_CONTEXT): refuse a size the
    // machine cannot hold instead of letting the allocation abort.
    let bytes = (max_ctx as u64)
        .saturating_mul(half as u64)
        .saturating_mul(8);
    if let Some(avail) = crate::util::memory::available_bytes() {
        if bytes > avail / 2 {
            return Err(Error::InvalidArgument {
                name: "model context length".into(),
                reason: format!(
                    "{max_ctx} tokens need {:.1} GiB of RoPE tables, more than half the {:.1} GiB \
                     available; is the model's context length right?",
                    bytes as f64 / (1u64 << 30) as f64,
                    avail as f64 / (1u64 << 30) as f64
                ),
            });
        }
    }
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / base.powf(2.0 * i as f32 / head_dim as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, half), &Device::Cpu)?;
    let pos = Tensor::arange(0u32, max_ctx as u32, &Device::Cpu)?
        .to_dtype(DType::F32)?
        .reshape((max_ctx, 1))?;
    let ang = pos.broadcast_mul(&inv)?;
    Ok((ang.cos()?, ang.sin()?))
}

/// Rows `pos0[b] .. pos0[b] + n` of a `[max_ctx, d/2]` table: `[n, d/2]` when every sequence
/// starts at the same position, else `[batch, n, d/2]`. Errors: [`Error::Candle`].
pub(crate) fn table_rows(t: &Tensor, pos0: &[usize], n: usize) -> Result<Tensor> {
    if pos0.iter().all(|&p| p == pos0[0]) {
        return Ok(t.narrow(0, pos0[0], n)?);
    }
    let rows = pos0
        .iter()
        .map(|&p| t.narrow(0, p, n))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Tensor::stack(&rows, 0)?)
}

/// Tokens per sequence of a forward over `tokens` (`[batch, n]`) and each sequence's first
/// position (what `cache` has seen; 0 without one: prompts of different lengths continue from
/// their own). Errors: [`Error::InvalidArgument`] when the tokens do not split into `batch`
/// rows or a sequence would pass the model's context length.
pub(crate) fn start_positions(
    cache: Option<&dyn AttentionCache>,
    c: &ModelConfig,
    tokens: &[u32],
    batch: usize,
) -> Result<(usize, Vec<usize>)> {
    if batch == 0 || tokens.is_empty() || !tokens.len().is_multiple_of(batch) {
        return Err(Error::InvalidArgument {
            name: "tokens".into(),
            reason: format!(
                "{} tokens do not split into {batch} sequences",
                tokens.len()
            ),
        });
    }
    let n = tokens.len() / batch;
    let pos0: Vec<usize> = match cache {
        Some(k) => (0..batch).map(|b| k.seen(b)).collect(),
        None => vec![0; batch],
    };
    if let Some(&p) = pos0.iter().max() {
        if p + n > c.max_ctx {
            return Err(Error::InvalidArgument {
                name: "sequence length".into(),
                reason: format!(
                    "{} tokens exceed the model's context length {}",
                    p + n,
                    c.max_ctx
                ),
            });
        }
    }
    Ok((n, pos0))
}

/// `out` when it lives on `device`. Errors: [`Error::InvalidArgument`] naming the KV cache
/// that returned attention on another device than the model's.
pub(crate) fn on_device(out: Tensor, device: &Device) -> Result<Tensor> {
    if out.device().same_device(device) {
        return Ok(out);
    }
    Err(Error::InvalidArgument {
        name: "KV cache".into(),
        reason: format!(
            "it returned attention on {:?}, but the model runs on {:?}; use a cache on the \
             model's device",
            out.device().location(),
            device.location()
        ),
    })
}

/// Index of the largest value in each row of `[rows, vocab]` logits (greedy decoding).
///
/// Errors: [`Error::NonFinite`] when a row holds NaN or an infinity (damaged weights, an
/// overflow): its argmax would be an arbitrary token, and a point built on it must fail rather
/// than report `ok`. (A row's sum is finite exactly when every element is, short of an overflow
/// of finite logits near 3·10^38, itself a failure.)
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    let sums = logits.sum(D::Minus1)?.to_vec1::<f32>()?;
    if let Some(row) = sums.iter().position(|s| !s.is_finite()) {
        return Err(Error::NonFinite(format!(
            "the logits of row {row} hold NaN or infinite values (damaged weights or an \
             overflow); the generated token would be meaningless"
        )));
    }
    Ok(logits.argmax(D::Minus1)?.to_vec1::<u32>()?)
}
