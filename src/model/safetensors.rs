//! Loading a Hugging Face checkpoint: `config.json`, `tokenizer.json` and one or more
//! `*.safetensors` shards (memory-mapped with candle), tensor names as in transformers'
//! `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM`.

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use super::tokenizer::TextTokenizer;
use super::{Block, Linear, Model, ModelConfig, ModelSource, RopeStyle, WeightDtype};
use crate::error::{Error, Result};

/// The `config.json` fields kvbench reads.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f32>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_scaling: Option<serde_json::Value>,
}

const SUPPORTED_TYPES: &[&str] = &["llama", "mistral", "qwen2"];

/// Parses `config.json` into a [`ModelConfig`]. Errors: [`Error::ModelFormat`] for unreadable
/// JSON or missing fields, [`Error::Unsupported`] for other model types or RoPE scaling.
pub fn read_config(path: &Path) -> Result<(ModelConfig, bool)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::ModelNotFound {
        model: path.display().to_string(),
        reason: format!("cannot read it ({e}); check that it exists and is readable"),
    })?;
    let hf: HfConfig = serde_json::from_str(&text).map_err(|e| Error::ModelFormat {
        path: path.to_path_buf(),
        reason: format!("config.json: {e}"),
    })?;
    let arch = hf.model_type.clone().unwrap_or_else(|| "llama".into());
    if !SUPPORTED_TYPES.contains(&arch.as_str()) {
        return Err(Error::Unsupported(format!(
            "model_type `{arch}` in {} (supported: {})",
            path.display(),
            SUPPORTED_TYPES.join(", ")
        )));
    }
    if let Some(s) = hf.rope_scaling.as_ref().filter(|s| !s.is_null()) {
        return Err(Error::Unsupported(format!(
            "rope_scaling {s} in {}: kvbench implements unscaled RoPE only",
            path.display()
        )));
    }
    let cfg = ModelConfig {
        arch,
        layers: hf.num_hidden_layers,
        hidden: hf.hidden_size,
        intermediate: hf.intermediate_size,
        q_heads: hf.num_attention_heads,
        kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim: hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1)),
        vocab: hf.vocab_size,
        rope_theta: hf.rope_theta.unwrap_or(10_000.0),
        rope_style: RopeStyle::Half,
        rms_eps: hf.rms_norm_eps,
        max_ctx: hf.max_position_embeddings,
        layer_windows: Vec::new(),
    };
    super::shapes::check_config(&cfg, path)?;
    Ok((cfg, hf.tie_word_embeddings))
}

/// Loads the model from `config.json`, `tokenizer.json` and safetensors shards, every weight on
/// `device` (read and converted to f32 on the CPU, then copied).
pub fn load(
    config: &Path,
    tokenizer: &Path,
    weights: &[PathBuf],
    repo: Option<String>,
    dtype: WeightDtype,
    device: &Device,
) -> Result<(Model, TextTokenizer, ModelSource)> {
    let (cfg, tied) = read_config(config)?;
    let tokenizer = TextTokenizer::from_file(tokenizer)?;
    // SAFETY: the files are memory-mapped read-only; kvbench does not modify them while loaded.
    let st = unsafe { MmapedSafetensors::multi(weights) }.map_err(|e| Error::ModelFormat {
        path: weights.first().cloned().unwrap_or_default(),
        reason: format!("safetensors: {}", crate::error::first_line(&e)),
    })?;
    // Every weight's shape against config.json before any is read.
    let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    super::shapes::check_shapes(
        &cfg,
        super::shapes::Naming::HuggingFace,
        |name| st.get(name).ok().map(|v| v.shape().to_vec()),
        names.iter().map(String::as_str),
        weights.first().map_or(config, |p| p.as_path()),
    )?;
    let dev = Device::Cpu;
    // Dense f32 on the CPU (`Linear::from_dense` quantizes from there and copies to `device`).
    let get_cpu = |name: &str| -> Result<Tensor> {
        st.load(name, &dev)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|e| Error::ModelFormat {
                path: weights.first().cloned().unwrap_or_default(),
                reason: format!("tensor `{name}`: {}", crate::error::first_line(&e)),
            })
    };
    // On `device` (a no-op for the CPU).
    let get = |name: &str| -> Result<Tensor> { Ok(get_cpu(name)?.to_device(device)?) };
    let has = |name: &str| st.get(name).is_ok();
    let lin = |prefix: &str| -> Result<Linear> {
        let bias = format!("{prefix}.bias");
        let b = if has(&bias) { Some(get(&bias)?) } else { None };
        Linear::from_dense(get_cpu(&format!("{prefix}.weight"))?, b, dtype, device)
    };
    let mut blocks = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let p = format!("model.layers.{i}");
        blocks.push(Block {
            attn_norm: get(&format!("{p}.input_layernorm.weight"))?,
            q: lin(&format!("{p}.self_attn.q_proj"))?,
            k: lin(&format!("{p}.self_attn.k_proj"))?,
            v: lin(&format!("{p}.self_attn.v_proj"))?,
            o: lin(&format!("{p}.self_attn.o_proj"))?,
            ffn_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
            gate: lin(&format!("{p}.mlp.gate_proj"))?,
            up: lin(&format!("{p}.mlp.up_proj"))?,
            down: lin(&format!("{p}.mlp.down_proj"))?,
        });
    }
    let embed = get("model.embed_tokens.weight")?;
    let head = if tied || !has("lm_head.weight") {
        embed.clone()
    } else {
        get_cpu("lm_head.weight")?
    };
    let lm_head = Linear::from_dense(head, None, dtype, device)?;
    let norm = get("model.norm.weight")?;
    // NaN or infinite norm weights make every logit NaN: refuse them here.
    let first = weights.first().map_or(config, |p| p.as_path());
    super::shapes::check_finite(&norm, "model.norm.weight", first)?;
    for (i, b) in blocks.iter().enumerate() {
        let p = format!("model.layers.{i}");
        super::shapes::check_finite(&b.attn_norm, &format!("{p}.input_layernorm.weight"), first)?;
        super::shapes::check_finite(
            &b.ffn_norm,
            &format!("{p}.post_attention_layernorm.weight"),
            first,
        )?;
    }
    let model = Model::new(cfg, dtype, embed, blocks, norm, lm_head)?;
    let source = ModelSource {
        spec: config.parent().unwrap_or(config).display().to_string(),
        format: if repo.is_some() {
            "hf-hub"
        } else {
            "safetensors"
        }
        .into(),
        files: weights.to_vec(),
        repo,
    };
    Ok((model, tokenizer, source))
}

/// The shard files a sharded checkpoint's index (`model.safetensors.index.json`, as
/// `transformers` writes it: `{"weight_map": {tensor name: shard file name}}`) names: the
/// `weight_map` values, sorted, each once; none when there is no `weight_map` object (values
/// that are not strings are skipped). Errors: the JSON parser's, when `text` is not JSON.
pub fn index_shard_names(text: &str) -> serde_json::Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(text)?;
    let mut files: Vec<String> = v["weight_map"]
        .as_object()
        .map(|m| {
            m.values()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.dedup();
    Ok(files)
}

/// The safetensors shards of a folder: `model.safetensors.index.json`'s files, else every
/// `*.safetensors`, sorted.
pub fn shards_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let files = index_shard_names(&text).map_err(|e| Error::ModelFormat {
            path: index.clone(),
            reason: e.to_string(),
        })?;
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::ModelNotFound {
            model: dir.display().to_string(),
            reason: "the folder has no *.safetensors files".into(),
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: three tensors in two shards, listed out of order, give the two shard names
    /// sorted and once each; a non-string value is skipped; no `weight_map` gives none; text
    /// that is not JSON is an error.
    #[test]
    fn index_shard_names_by_hand() {
        let index = r#"{"metadata": {"total_size": 12},
            "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                           "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                           "model.norm.weight": "model-00002-of-00002.safetensors",
                           "odd": 7}}"#;
        assert_eq!(
            index_shard_names(index).unwrap(),
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        assert!(index_shard_names(r#"{"metadata": {}}"#).unwrap().is_empty());
        assert!(index_shard_names("{not json").is_err());
    }
}
