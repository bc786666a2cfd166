//! Checks a model's stated geometry against its weight tensors' shapes before any weight is
//! read, and its scalar hyper-parameters and norm weights for values that would make every
//! logit NaN. A file whose header disagrees with its weights (a wrong head count, key length or
//! block count) is refused at load with the tensor and both shapes named, instead of loading
//! and failing every point with "shape mismatch".
//!
//! Shapes are `[out, in]` as candle holds them (GGUF's innermost-first `ne` reversed; safetensors
//! as stored), the layout of Llama-family checkpoints in transformers' `modeling_llama.py`.

use std::path::Path;

use candle_core::Tensor;

use super::ModelConfig;
use crate::error::{Error, Result};

/// Most tokens of context a model may declare (2^24 ≈ 16.8 M, above any released model): the
/// RoPE tables are sized from it, so a damaged value must not size an allocation.
pub const MAX_CONTEXT: usize = 1 << 24;

/// How a file names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// llama.cpp's GGUF names (`blk.0.attn_q.weight`).
    Gguf,
    /// transformers' names (`model.layers.0.self_attn.q_proj.weight`).
    HuggingFace,
}

impl Naming {
    fn embed(self) -> &'static str {
        match self {
            Naming::Gguf => "token_embd.weight",
            Naming::HuggingFace => "model.embed_tokens.weight",
        }
    }
    fn norm(self) -> &'static str {
        match self {
            Naming::Gguf => "output_norm.weight",
            Naming::HuggingFace => "model.norm.weight",
        }
    }
    fn head(self) -> &'static str {
        match self {
            Naming::Gguf => "output.weight",
            Naming::HuggingFace => "lm_head.weight",
        }
    }
    fn layer_prefix(self, i: usize) -> String {
        match self {
            Naming::Gguf => format!("blk.{i}."),
            Naming::HuggingFace => format!("model.layers.{i}."),
        }
    }
    /// `(name within the layer, role)` of each per-layer weight.
    fn layer_weights(self) -> [(&'static str, Role); 9] {
        match self {
            Naming::Gguf => [
                ("attn_norm.weight", Role::Norm),
                ("attn_q.weight", Role::Q),
                ("attn_k.weight", Role::Kv),
                ("attn_v.weight", Role::Kv),
                ("attn_output.weight", Role::O),
                ("ffn_norm.weight", Role::Norm),
                ("ffn_gate.weight", Role::Up),
                ("ffn_up.weight", Role::Up),
                ("ffn_down.weight", Role::Down),
            ],
            Naming::HuggingFace => [
                ("input_layernorm.weight", Role::Norm),
                ("self_attn.q_proj.weight", Role::Q),
                ("self_attn.k_proj.weight", Role::Kv),
                ("self_attn.v_proj.weight", Role::Kv),
                ("self_attn.o_proj.weight", Role::O),
                ("post_attention_layernorm.weight", Role::Norm),
                ("mlp.gate_proj.weight", Role::Up),
                ("mlp.up_proj.weight", Role::Up),
                ("mlp.down_proj.weight", Role::Down),
            ],
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Role {
    Norm,
    Q,
    Kv,
    O,
    Up,
    Down,
}

fn bad(path: &Path, reason: String) -> Error {
    Error::ModelFormat {
        path: path.to_path_buf(),
        reason,
    }
}

/// Checks the scalar hyper-parameters: non-zero geometry within bounds, query heads a multiple
/// of kv heads, an even head size (RoPE rotates pairs), ε finite and in (0, 1), RoPE base finite
/// and > 1, context in 1..=[`MAX_CONTEXT`], sliding windows that one window size and layer
/// split describe ([`ModelConfig::check_windows`]). Errors: [`Error::ModelFormat`] naming the
/// value.
pub fn check_config(cfg: &ModelConfig, path: &Path) -> Result<()> {
    let c = cfg;
    if c.layers == 0
        || c.q_heads == 0
        || c.kv_heads == 0
        || c.head_dim == 0
        || c.hidden == 0
        || c.intermediate == 0
        || c.vocab == 0
    {
        return Err(bad(path, format!("degenerate geometry {c:?}")));
    }
    if !c.q_heads.is_multiple_of(c.kv_heads) {
        return Err(bad(
            path,
            format!(
                "{} query heads are not a multiple of {} kv heads",
                c.q_heads, c.kv_heads
            ),
        ));
    }
    if !c.head_dim.is_multiple_of(2) {
        return Err(bad(
            path,
            format!(
                "head size (key length) {} is odd; rotary embeddings rotate pairs",
                c.head_dim
            ),
        ));
    }
    if !(c.rms_eps.is_finite() && c.rms_eps > 0.0 && c.rms_eps < 1.0) {
        return Err(bad(
            path,
            format!(
                "RMSNorm epsilon {} is not a number in (0, 1) (typically 1e-5 or 1e-6)",
                c.rms_eps
            ),
        ));
    }
    if !(c.rope_theta.is_finite() && c.rope_theta > 1.0) {
        return Err(bad(
            path,
            format!(
                "RoPE base (rope_theta / rope.freq_base) {} is not a number > 1 (typically \
                 10000 or 500000)",
                c.rope_theta
            ),
        ));
    }
    if c.max_ctx == 0 || c.max_ctx > MAX_CONTEXT {
        return Err(bad(
            path,
            format!(
                "context length {} is outside 1..={MAX_CONTEXT} tokens",
                c.max_ctx
            ),
        ));
    }
    if let Err(e) = c.check_windows() {
        return Err(bad(path, crate::error::first_line(&e)));
    }
    // Products used to size activations must not overflow.
    let q = c.q_heads.checked_mul(c.head_dim);
    let emb = c.vocab.checked_mul(c.hidden);
    if q.is_none() || emb.is_none() || c.layers > 1 << 16 {
        return Err(bad(path, format!("geometry {c:?} is out of range")));
    }
    Ok(())
}

/// Checks every weight the decoder uses against the shape `cfg` implies: embedding `[vocab,
/// hidden]`, per layer Q `[q_heads·head_dim, hidden]`, K/V `[kv_heads·head_dim, hidden]`, O
/// `[hidden, q_heads·head_dim]`, gate/up `[intermediate, hidden]`, down `[hidden,
/// intermediate]`, norms `[hidden]`, an untied head `[vocab, hidden]`, and biases where present;
/// and that no tensor belongs to a layer past `cfg.layers`. `shape(name)` gives a tensor's
/// `[out, in]` dimensions or `None` when absent; `names` lists every tensor in the file.
///
/// Errors: [`Error::ModelFormat`] naming the first tensor that is missing or disagrees, with
/// both shapes.
pub fn check_shapes<'a>(
    cfg: &ModelConfig,
    naming: Naming,
    shape: impl Fn(&str) -> Option<Vec<usize>>,
    names: impl Iterator<Item = &'a str>,
    path: &Path,
) -> Result<()> {
    check_config(cfg, path)?;
    let c = cfg;
    let want = |name: &str, expect: &[usize], required: bool| -> Result<()> {
        match shape(name) {
            Some(got) if got == expect => Ok(()),
            Some(got) => Err(bad(
                path,
                format!(
                    "tensor `{name}` has shape {got:?}, but the model's settings ({} layers, \
                     hidden {}, {} heads, {} kv heads, head size {}, intermediate {}, vocab {}) \
                     need {expect:?}",
                    c.layers, c.hidden, c.q_heads, c.kv_heads, c.head_dim, c.intermediate, c.vocab
                ),
            )),
            None if required => Err(bad(path, format!("tensor `{name}` is missing"))),
            None => Ok(()),
        }
    };
    let qd = c.q_heads * c.head_dim;
    let kvd = c.kv_heads * c.head_dim;
    want(naming.embed(), &[c.vocab, c.hidden], true)?;
    want(naming.norm(), &[c.hidden], true)?;
    want(naming.head(), &[c.vocab, c.hidden], false)?;
    for i in 0..c.layers {
        let p = naming.layer_prefix(i);
        for (w, role) in naming.layer_weights() {
            let (out, inp) = match role {
                Role::Norm => {
                    want(&format!("{p}{w}"), &[c.hidden], true)?;
                    continue;
                }
                Role::Q => (qd, c.hidden),
                Role::Kv => (kvd, c.hidden),
                Role::O => (c.hidden, qd),
                Role::Up => (c.intermediate, c.hidden),
                Role::Down => (c.hidden, c.intermediate),
            };
            let name = format!("{p}{w}");
            want(&name, &[out, inp], true)?;
            want(&name.replace(".weight", ".bias"), &[out], false)?;
        }
    }
    let beyond = naming.layer_prefix(c.layers);
    if let Some(extra) = names.into_iter().find(|n| n.starts_with(&beyond)) {
        return Err(bad(
            path,
            format!(
                "tensor `{extra}` belongs to layer {} but the model declares {} layers; the \
                 block count is wrong",
                c.layers, c.layers
            ),
        ));
    }
    Ok(())
}

/// Fails unless every element of `t` is finite. Errors: [`Error::ModelFormat`] naming the
/// tensor (NaN or infinite norm weights make every logit NaN).
pub fn check_finite(t: &Tensor, name: &str, path: &Path) -> Result<()> {
    let sum = t
        .to_dtype(candle_core::DType::F32)?
        .abs()?
        .sum_all()?
        .to_scalar::<f32>()?;
    // Σ|x| is NaN or infinite when any element is (an overflow of finite norm weights to
    // infinity would need values near 3e38 / len, themselves a damaged file).
    if !sum.is_finite() {
        return Err(bad(
            path,
            format!("tensor `{name}` holds NaN or infinite values"),
        ));
    }
    Ok(())
}
