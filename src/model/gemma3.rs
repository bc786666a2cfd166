//! Gemma 3 (Gemma Team 2025, "Gemma 3 Technical Report", arXiv 2503.19786) from a GGUF file
//! (`general.architecture = gemma3`), run by kvbench's decoder with the KV cache passed in from
//! outside, as every other model.
//!
//! Differences from Llama, as llama.cpp's `gemma3` graph computes them (`src/models/gemma3.cpp`;
//! candle-transformers' `quantized_gemma3.rs` agrees):
//! - the token embedding is multiplied by √hidden;
//! - four RMSNorms per block: before attention, after it (`post_attention_norm`, applied to the
//!   attention output before the residual add), before the MLP and after it (`post_ffw_norm`);
//!   the weights are used as stored, since llama.cpp's converter already stores Gemma's `1 + w`
//!   (convert_hf_to_gguf.py, `Gemma3Model`, `norm_shift`);
//! - QK-norm: an RMSNorm over each head of q and k (weights `[head_dim]`) before RoPE;
//! - NeoX ("half") RoPE with base `gemma3.rope.freq_base` (10⁶) on global layers and 10⁴ on
//!   sliding layers;
//! - sliding-window attention on 5 of every 6 layers (layer `i` global iff `(i + 1) % 6 == 0`,
//!   llama.cpp's `set_swa_pattern(6)`): a query at position `p` sees keys at `p − w + 1 ..= p`,
//!   `w = gemma3.attention.sliding_window`;
//! - attention scaled by `1/√query_pre_attn_scalar`: `1/√head_dim` for every size but 27B,
//!   where llama.cpp uses `1/√(hidden / heads)` (applied here by scaling q before the cache's
//!   `1/√head_dim`);
//! - MLP `down(gelu_tanh(gate(x)) ⊙ up(x))`;
//! - tied output head (`token_embd`), optional final logit soft-capping
//!   `c · tanh(logits / c)` when `gemma3.final_logit_softcapping` is present (Gemma 3 files
//!   have none).
//!
//! Sliding windows with an outside cache: the cache is told each layer's window
//! ([`AttentionCache::set_layer_windows`]) and keeps at most `w − 1` tokens of a window layer
//! between calls; where a call's new tokens would see more than `w` positions the layer's
//! attention runs one token at a time past that point, so the mask stays exact under any scheme.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::Value;
use candle_core::{Device, Tensor};

use super::decoder::{
    on_device, rope_tables, start_positions, table_rows, DecoderVariant, Model, ModelConfig,
    ModelSource, RopeStyle,
};
use super::gguf::GgufFile;
use super::linear::WeightDtype;
use super::tokenizer::TextTokenizer;
use crate::error::{Error, Result};
use crate::kv::AttentionCache;

/// `general.architecture` of the files this module loads.
pub const ARCH: &str = "gemma3";
/// RoPE base of the sliding (local) layers: fixed in Gemma 3's reference code
/// (`rope_local_base_freq = 10000`) and in llama.cpp (`rope_freq_base_train_swa`); not in the
/// GGUF.
pub const LOCAL_ROPE_BASE: f32 = 10_000.0;
/// Every `SWA_PATTERN`-th layer is global, the rest slide (Gemma 3 §2: 5 local : 1 global).
pub const SWA_PATTERN: usize = 6;

/// The extra weights and hyper-parameters of a Gemma 3 decoder ([`DecoderVariant`]).
#[derive(Debug, Clone)]
pub struct Gemma3 {
    /// Per layer: QK-norm weights `[head_dim]` and the post-attention / post-FFN norm weights
    /// `[hidden]`, f32.
    pub norms: Vec<ExtraNorms>,
    /// RoPE base of each layer (10⁶ global, 10⁴ sliding for Gemma 3).
    pub rope_bases: Vec<f32>,
    /// Multiplier of the token embedding: √hidden.
    pub embed_scale: f64,
    /// Multiplier of q after QK-norm and RoPE so that the cache's `1/√head_dim` becomes
    /// `1/√query_pre_attn_scalar`: `√head_dim / √query_pre_attn_scalar` (1 for 270M).
    pub q_scale: f64,
    /// Final logit soft-cap `c` (`c · tanh(logits / c)`), when the file has one.
    pub final_softcap: Option<f32>,
    /// cos/sin tables `[max_ctx, head_dim/2]` for [`LOCAL_ROPE_BASE`].
    local_cos: Tensor,
    local_sin: Tensor,
}

/// One block's norms beyond Llama's two.
#[derive(Debug, Clone)]
pub struct ExtraNorms {
    /// RMSNorm over each query head, `[head_dim]`.
    pub q_norm: Tensor,
    /// RMSNorm over each key head, `[head_dim]`.
    pub k_norm: Tensor,
    /// RMSNorm of the attention output before the residual add, `[hidden]`.
    pub post_attn: Tensor,
    /// RMSNorm of the MLP output before the residual add, `[hidden]`.
    pub post_ffw: Tensor,
}

/// Whether the GGUF at `path` is a Gemma 3 model (its `general.architecture`). Errors: as
/// [`GgufFile::open`].
pub fn is_gemma3_file(path: &Path) -> Result<bool> {
    Ok(is_gemma3(&GgufFile::open(path)?))
}

/// Whether an opened GGUF is a Gemma 3 model (`general.architecture = gemma3`).
pub fn is_gemma3<R: std::io::Read + std::io::Seek>(f: &GgufFile<R>) -> bool {
    matches!(f.meta("general.architecture"), Ok(Value::String(a)) if a == ARCH)
}

fn bad(f: &Path, reason: String) -> Error {
    Error::ModelFormat {
        path: f.to_path_buf(),
        reason,
    }
}

/// An unsigned integer metadata value (u8..u64 or a non-negative i32/i64).
fn meta_usize<R: std::io::Read + std::io::Seek>(
    f: &GgufFile<R>,
    path: &Path,
    key: &str,
) -> Result<usize> {
    let v = f.meta(key)?;
    let x: Option<u64> = match v {
        Value::U8(x) => Some(*x as u64),
        Value::U16(x) => Some(*x as u64),
        Value::U32(x) => Some(*x as u64),
        Value::U64(x) => Some(*x),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    };
    x.and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| bad(path, format!("metadata `{key}` is {v:?}, not a count")))
}

fn meta_f32<R: std::io::Read + std::io::Seek>(
    f: &GgufFile<R>,
    path: &Path,
    key: &str,
) -> Result<f32> {
    let v = f.meta(key)?;
    match v {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        _ => Err(bad(
            path,
            format!("metadata `{key}` is {v:?}, not a number"),
        )),
    }
}

fn has_meta<R: std::io::Read + std::io::Seek>(f: &GgufFile<R>, key: &str) -> bool {
    f.meta(key).is_ok()
}

/// Hyper-parameters of a Gemma 3 GGUF: the [`ModelConfig`] (with [`ModelConfig::layer_windows`]
/// set for the sliding layers, `rope_theta` the global base) plus the attention scale
/// `1/√query_pre_attn_scalar` and the optional final soft-cap.
///
/// Keys: `gemma3.{block_count, embedding_length, feed_forward_length, attention.head_count,
/// attention.head_count_kv, attention.key_length, attention.value_length, rope.freq_base,
/// attention.layer_norm_rms_epsilon, attention.sliding_window, context_length}`; the vocabulary
/// size from `token_embd`'s rows, read by the loader. Errors: [`Error::Unsupported`] for another
/// architecture or key ≠ value length; [`Error::ModelFormat`] for missing or degenerate values.
pub fn config<R: std::io::Read + std::io::Seek>(
    f: &GgufFile<R>,
    path: &Path,
) -> Result<(ModelConfig, f32, Option<f32>)> {
    let arch = match f.meta("general.architecture")? {
        Value::String(a) => a.clone(),
        v => return Err(bad(path, format!("general.architecture is {v:?}"))),
    };
    if arch != ARCH {
        return Err(Error::Unsupported(format!(
            "{} is a `{arch}` GGUF, not `{ARCH}`",
            path.display()
        )));
    }
    let k = |s: &str| format!("{ARCH}.{s}");
    let layers = meta_usize(f, path, &k("block_count"))?;
    let hidden = meta_usize(f, path, &k("embedding_length"))?;
    let q_heads = meta_usize(f, path, &k("attention.head_count"))?;
    let kv_heads = meta_usize(f, path, &k("attention.head_count_kv"))?;
    let head_dim = meta_usize(f, path, &k("attention.key_length"))?;
    if has_meta(f, &k("attention.value_length")) {
        let vd = meta_usize(f, path, &k("attention.value_length"))?;
        if vd != head_dim {
            return Err(Error::Unsupported(format!(
                "{}: value length {vd} differs from key length {head_dim}",
                path.display()
            )));
        }
    }
    let window = meta_usize(f, path, &k("attention.sliding_window"))?;
    if window == 0 {
        return Err(bad(path, "sliding window of 0 tokens".into()));
    }
    // llama.cpp: f_attention_scale = 1/√(hidden / heads) for 27B, 1/√head_dim otherwise; the
    // files carry no query_pre_attn_scalar key. 27B is the one size with 62 layers.
    let qpas = if has_meta(f, &k("attention.query_pre_attn_scalar")) {
        meta_f32(f, path, &k("attention.query_pre_attn_scalar"))?
    } else if layers == 62 {
        (hidden / q_heads.max(1)) as f32
    } else {
        head_dim as f32
    };
    if !(qpas.is_finite() && qpas > 0.0) {
        return Err(bad(
            path,
            format!("query_pre_attn_scalar {qpas} is not > 0"),
        ));
    }
    let softcap = if has_meta(f, &k("final_logit_softcapping")) {
        let c = meta_f32(f, path, &k("final_logit_softcapping"))?;
        if !(c.is_finite() && c > 0.0) {
            return Err(bad(path, format!("final logit soft-cap {c} is not > 0")));
        }
        Some(c)
    } else {
        None
    };
    let cfg = ModelConfig {
        arch,
        layers,
        hidden,
        intermediate: meta_usize(f, path, &k("feed_forward_length"))?,
        q_heads,
        kv_heads,
        head_dim,
        vocab: 0, // set from token_embd by the loader
        rope_theta: meta_f32(f, path, &k("rope.freq_base")).unwrap_or(1_000_000.0),
        rope_style: RopeStyle::Half,
        rms_eps: meta_f32(f, path, &k("attention.layer_norm_rms_epsilon"))? as f64,
        max_ctx: meta_usize(f, path, &k("context_length"))?,
        layer_windows: (0..layers)
            .map(|i| (!(i + 1).is_multiple_of(SWA_PATTERN)).then_some(window))
            .collect(),
    };
    Ok((cfg, qpas, softcap))
}

impl Gemma3 {
    /// Builds the variant; `norms` one entry per layer, on `device`. Errors: a device error.
    pub fn new(
        cfg: &ModelConfig,
        norms: Vec<ExtraNorms>,
        query_pre_attn_scalar: f32,
        final_softcap: Option<f32>,
        device: &Device,
    ) -> Result<Self> {
        let (cos, sin) = rope_tables(cfg.max_ctx, cfg.head_dim, LOCAL_ROPE_BASE)?;
        Ok(Self {
            norms,
            rope_bases: (0..cfg.layers)
                .map(|i| {
                    if cfg.layer_window(i).is_some() {
                        LOCAL_ROPE_BASE
                    } else {
                        cfg.rope_theta
                    }
                })
                .collect(),
            embed_scale: (cfg.hidden as f64).sqrt(),
            q_scale: (cfg.head_dim as f64).sqrt() / (query_pre_attn_scalar as f64).sqrt(),
            final_softcap,
            local_cos: cos.to_device(device)?,
            local_sin: sin.to_device(device)?,
        })
    }
}

impl DecoderVariant for Gemma3 {
    /// Runs `tokens` (`[batch, n]` row-major) through the Gemma 3 decoder; returns the hidden
    /// states after the final norm, `[batch, n, hidden]` f32. With a cache, each layer appends
    /// its K/V and attends through it (the cache is first told the layer windows); without one,
    /// attention is computed with candle ops over this call's tokens with the causal and sliding
    /// masks. Errors: [`Error::InvalidArgument`] past the context length or for a cache on
    /// another device; [`Error::Unsupported`] for a cache without per-layer windows.
    fn forward_hidden(
        &self,
        model: &Model,
        tokens: &[u32],
        batch: usize,
        mut cache: Option<&mut dyn AttentionCache>,
    ) -> Result<Tensor> {
        let c = &model.config;
        let device = model.device();
        let (n, pos0) = start_positions(cache.as_deref(), c, tokens, batch)?;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(Error::InvalidArgument {
                name: "token id".into(),
                reason: format!("{t} is outside the vocabulary of {} tokens", c.vocab),
            });
        }
        if let Some(k) = cache.as_deref_mut() {
            k.set_layer_windows(&c.layer_windows)?;
        }
        let mut x = (model
            .embedding()
            .lookup(tokens)?
            .to_device(device)?
            .reshape((batch, n, c.hidden))?
            * self.embed_scale)?;
        let (gcos, gsin) = model.rope_tables();
        let global = (table_rows(gcos, &pos0, n)?, table_rows(gsin, &pos0, n)?);
        let local = (
            table_rows(&self.local_cos, &pos0, n)?,
            table_rows(&self.local_sin, &pos0, n)?,
        );
        let heads = |t: Tensor, h: usize| -> Result<Tensor> {
            Ok(t.reshape((batch, n, h, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let eps = c.rms_eps as f32;
        let rms = |t: &Tensor, w: &Tensor| -> Result<Tensor> {
            Ok(candle_nn::ops::rms_norm(&t.contiguous()?, w, eps)?)
        };
        for (layer, (blk, nm)) in model.blocks().iter().zip(&self.norms).enumerate() {
            let window = c.layer_window(layer);
            let (cos, sin) = if window.is_some() { &local } else { &global };
            x = model.layer_input(x)?;
            let h = rms(&x, &blk.attn_norm)?;
            let q = rms(&heads(blk.q.forward(&h)?, c.q_heads)?, &nm.q_norm)?;
            let k = rms(&heads(blk.k.forward(&h)?, c.kv_heads)?, &nm.k_norm)?;
            let mut q = candle_nn::rotary_emb::rope(&q, cos, sin)?;
            if self.q_scale != 1.0 {
                q = (q * self.q_scale)?;
            }
            let k = candle_nn::rotary_emb::rope(&k, cos, sin)?;
            let v = heads(blk.v.forward(&h)?, c.kv_heads)?;
            let attn = match cache.as_deref_mut() {
                Some(cache) => cached_attention(cache, layer, &q, &k, &v, window, &pos0, device)?,
                None => masked_attention(&q, &k, &v, c, window)?,
            };
            let attn = attn
                .transpose(1, 2)?
                .reshape((batch, n, c.q_heads * c.head_dim))?;
            x = (x + rms(&blk.o.forward(&attn)?, &nm.post_attn)?)?;
            let h = rms(&x, &blk.ffn_norm)?;
            let act = (blk.gate.forward(&h)?.gelu()? * blk.up.forward(&h)?)?;
            x = (x + rms(&blk.down.forward(&act)?, &nm.post_ffw)?)?;
        }
        rms(&x, model.output_norm())
    }

    fn finish_logits(&self, logits: Tensor) -> Result<Tensor> {
        Ok(match self.final_softcap {
            Some(cap) => ((logits / cap as f64)?.tanh()? * cap as f64)?,
            None => logits,
        })
    }

    fn extra_weight_bytes(&self) -> usize {
        self.norms
            .iter()
            .map(|n| {
                [&n.q_norm, &n.k_norm, &n.post_attn, &n.post_ffw]
                    .iter()
                    .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                    .sum::<usize>()
            })
            .sum()
    }
}

/// Attention of one layer through the cache. Appends `k`, `v` (`[batch, kv_heads, n, d]`) and
/// attends `q` (`[batch, q_heads, n, d]`); on a window layer whose new tokens would see more
/// than `window` positions in one call, the tokens past the first that fit go one per call (the
/// cache drops what falls out of the window after each), so every query sees exactly its
/// window. Returns `[batch, q_heads, n, d]` on the model's device.
#[allow(clippy::too_many_arguments)] // one layer's tensors and where they start
fn cached_attention(
    cache: &mut dyn AttentionCache,
    layer: usize,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    pos0: &[usize],
    device: &Device,
) -> Result<Tensor> {
    let n = q.dim(2)?;
    // Tokens of the first call: all of them, unless some sequence would see past its window
    // (it holds min(pos, w − 1) tokens before the call).
    let first = match window {
        Some(w) => pos0
            .iter()
            .map(|&p| w - p.min(w - 1))
            .min()
            .unwrap_or(n)
            .min(n),
        None => n,
    };
    let mut outs = Vec::new();
    let mut off = 0;
    while off < n {
        let m = if off == 0 { first } else { 1 };
        cache.append_tensors(layer, &k.narrow(2, off, m)?, &v.narrow(2, off, m)?)?;
        let out = cache.attend_tensor(layer, &q.narrow(2, off, m)?.contiguous()?)?;
        outs.push(on_device(out, device)?);
        off += m;
    }
    Ok(if outs.len() == 1 {
        outs.pop().expect("one chunk")
    } else {
        Tensor::cat(&outs, 2)?
    })
}

/// softmax(q·kᵀ/√d + mask)·v over this call's tokens with candle ops (no cache), f32: the
/// reference the cached path is tested against. `q: [b, hq, n, d]`, `k, v: [b, hkv, n, d]`;
/// key `j` visible to query `i` iff `j ≤ i` and, on a window layer, `i − j < window`.
fn masked_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    c: &ModelConfig,
    window: Option<usize>,
) -> Result<Tensor> {
    let (b, _, n, d) = q.dims4()?;
    let rep = c.q_heads / c.kv_heads;
    let expand = |t: &Tensor| -> Result<Tensor> {
        Ok(t.unsqueeze(2)?
            .expand((b, c.kv_heads, rep, n, d))?
            .reshape((b, c.q_heads, n, d))?)
    };
    let (k, v) = (expand(k)?, expand(v)?);
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let mask = attention_mask(n, window);
    let mask = Tensor::from_vec(mask, (n, n), q.device())?;
    let p = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
    Ok(p.matmul(&v.contiguous()?)?)
}

/// Additive mask `[n, n]` row-major: 0 where key `j` is visible to query `i` (`j ≤ i`, and
/// `i − j < window` when there is one), −∞ elsewhere.
pub fn attention_mask(n: usize, window: Option<usize>) -> Vec<f32> {
    (0..n)
        .flat_map(|i| {
            (0..n).map(move |j| {
                let visible = j <= i && window.is_none_or(|w| i - j < w);
                if visible {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect()
}

/// Loads a Gemma 3 model and its SentencePiece tokenizer ([`super::spm`]) from a GGUF file,
/// linear layers in `dtype`, every weight on `device`. As the Llama path
/// ([`super::gguf::load`]): the file is mapped once and paged in, and on the CPU the layers that
/// compute in the stored format and the token table ([`super::Embedding::Rows`]) read its pages
/// in place. Errors: [`load_from`]'s; [`Error::ModelNotFound`] / [`Error::Io`] when the file
/// cannot be opened.
pub fn load(
    path: &Path,
    dtype: WeightDtype,
    device: &Device,
) -> Result<(Model, TextTokenizer, ModelSource)> {
    let f = GgufFile::open(path)?;
    f.prefault();
    load_from(f, dtype, device)
}

/// [`load`] from an opened file (mapped, or any reader: then every tensor is read into memory).
///
/// Tensors: the ones every GGUF decoder shares (`token_embd` — the tied head —, `output_norm`,
/// per block `attn_norm`, `attn_{q,k,v,output}`, `ffn_norm`, `ffn_{gate,up,down}`; read by
/// [`super::gguf::decoder_weights`]) and Gemma's own per block: `attn_q_norm`, `attn_k_norm`
/// `[head_dim]`, `post_attention_norm`, `post_ffw_norm` `[hidden]`, each checked against the
/// configuration's shape. Errors: [`config`]'s; [`Error::ModelFormat`] for a missing tensor, a
/// wrong shape or non-finite norm weights; the tokenizer's.
pub fn load_from<R: std::io::Read + std::io::Seek>(
    mut f: GgufFile<R>,
    dtype: WeightDtype,
    device: &Device,
) -> Result<(Model, TextTokenizer, ModelSource)> {
    let path = f.path().to_path_buf();
    let path = path.as_path();
    let (mut cfg, qpas, softcap) = config(&f, path)?;
    let tokenizer = super::spm::from_gguf(&f, path)?;
    let dims = f
        .tensor_dims("token_embd.weight")
        .ok_or_else(|| bad(path, "tensor `token_embd.weight` is missing".into()))?;
    let [vocab, hidden] = dims[..] else {
        return Err(bad(path, format!("token_embd has shape {dims:?}")));
    };
    if hidden != cfg.hidden {
        return Err(bad(
            path,
            format!(
                "token_embd is {vocab}×{hidden}, hidden size is {}",
                cfg.hidden
            ),
        ));
    }
    cfg.vocab = vocab;
    f.check_shapes(&cfg)?;
    let norm = |f: &mut GgufFile<R>, name: &str, len: usize| -> Result<Tensor> {
        let t = f.stored(name)?;
        if t.dims != [len] {
            return Err(bad(
                path,
                format!("tensor `{name}` has shape {:?}, expected [{len}]", t.dims),
            ));
        }
        let t = t.dequantize(device)?;
        super::shapes::check_finite(&t, name, path)?;
        Ok(t)
    };
    let mut norms = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        norms.push(ExtraNorms {
            q_norm: norm(&mut f, &p("attn_q_norm"), cfg.head_dim)?,
            k_norm: norm(&mut f, &p("attn_k_norm"), cfg.head_dim)?,
            post_attn: norm(&mut f, &p("post_attention_norm"), cfg.hidden)?,
            post_ffw: norm(&mut f, &p("post_ffw_norm"), cfg.hidden)?,
        });
    }
    let w = super::gguf::decoder_weights(&mut f, &cfg, dtype, device)?;
    let variant = Gemma3::new(&cfg, norms, qpas, softcap, device)?;
    let model = Model::new(cfg, dtype, w.embed, w.blocks, w.norm, w.lm_head)?
        .with_variant(Arc::new(variant));
    Ok((model, tokenizer, super::gguf::source(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sliding mask by hand: window 2 over 4 tokens keeps the diagonal and one step back.
    #[test]
    fn window_mask_by_hand() {
        let m = attention_mask(4, Some(2));
        let vis: Vec<u8> = m.iter().map(|&x| (x == 0.0) as u8).collect();
        #[rustfmt::skip]
        assert_eq!(vis, vec![
            1, 0, 0, 0,
            1, 1, 0, 0,
            0, 1, 1, 0,
            0, 0, 1, 1,
        ]);
        let causal: Vec<u8> = attention_mask(3, None)
            .iter()
            .map(|&x| (x == 0.0) as u8)
            .collect();
        assert_eq!(causal, vec![1, 0, 0, 1, 1, 0, 1, 1, 1]);
    }
}
