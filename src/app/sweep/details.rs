//! A sweep's own sections of `meta.json` (kept in [`crate::report::meta::RunMeta::details`]):
//! the model and its tokenizer, the sweep spec, the perplexity protocol, the generation tasks'
//! fixed prompts, the CSV columns — every choice that changes a number.

use crate::measure::memory_plan::MemoryPlan;
use crate::measure::settings::SweepSettings;
use crate::measure::sweep::{QualityTasks, SweepSpec};
use crate::model::{self, WeightDtype};
use crate::quality::passkey;
use crate::quality::perplexity::PplProtocol;
use crate::quality::wikitext;
use crate::quality::xsum;
use crate::report::CSV_COLUMNS;

use std::collections::HashMap;

/// The loaded model of each phase.
pub(super) struct Models<'a> {
    /// Decode steps (TPOT); its tokenizer reads the text.
    pub timing: &'a model::LoadedModel,
    /// Prefill (TTFT).
    pub prefill: &'a model::LoadedModel,
    /// Perplexity and the generation tasks.
    pub quality: &'a model::LoadedModel,
}

impl<'a> Models<'a> {
    pub(super) fn new(
        plan: &MemoryPlan,
        loaded: &'a HashMap<WeightDtype, model::LoadedModel>,
    ) -> Self {
        Models {
            timing: &loaded[&plan.dtype("decode")],
            prefill: &loaded[&plan.dtype("prefill")],
            quality: &loaded[&plan.dtype("perplexity")],
        }
    }
}

/// The sections of a model sweep.
#[derive(serde::Serialize)]
struct ModelSweep<'a> {
    model: ModelMeta,
    tokenizer: TokenizerMeta,
    sweep: &'a SweepSpec,
    perplexity: Option<PerplexityMeta<'a>>,
    generation_tasks: GenerationMeta,
    csv_columns: &'a [&'a str],
}

/// The generation tasks' fixed prompts and settings.
#[derive(serde::Serialize)]
struct GenerationMeta {
    weights: WeightDtype,
    decoding: &'static str,
    stop_tokens: Vec<u32>,
    rouge: Option<serde_json::Value>,
    passkey: Option<serde_json::Value>,
}

#[derive(serde::Serialize)]
struct ModelMeta {
    source: model::ModelSource,
    sha256: Vec<String>,
    config: model::ModelConfig,
    weight_dtype_prefill: WeightDtype,
    weight_dtype_decode: WeightDtype,
    weight_dtype_perplexity: WeightDtype,
    /// Bytes the weights of the decode model hold, and of those the mapped file's pages.
    decode_weight_bytes: usize,
    decode_weight_bytes_mapped: usize,
    kv_bytes_per_token: Vec<(String, usize)>,
    /// The plan made before loading: bytes by kind, available memory, what `auto` chose.
    memory_plan: MemoryPlan,
}

#[derive(serde::Serialize)]
struct TokenizerMeta {
    description: String,
    vocab_size: usize,
    add_bos: bool,
    bos: Option<u32>,
}

#[derive(serde::Serialize)]
struct PerplexityMeta<'a> {
    protocol: &'a PplProtocol,
    dataset: &'static str,
    dataset_tokens: usize,
    reference: &'static str,
}

fn object(v: impl serde::Serialize) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

/// The sections of a model sweep's `meta.json`: the model (`sha256` of its files), tokenizer,
/// spec, perplexity protocol on `dataset_tokens` tokens of WikiText-2, generation tasks.
pub(super) fn model(
    s: &SweepSettings,
    spec: &SweepSpec,
    m: &Models<'_>,
    tasks: &QualityTasks<'_>,
    (sha256, weights): (Vec<String>, &MemoryPlan),
    dataset_tokens: usize,
) -> serde_json::Map<String, serde_json::Value> {
    let cfg = &m.timing.model.config;
    let geom = cfg.cache_geometry();
    let tok = &m.timing.tokenizer;
    object(ModelSweep {
        model: ModelMeta {
            source: m.timing.source.clone(),
            sha256,
            config: cfg.clone(),
            weight_dtype_prefill: weights.dtype("prefill"),
            weight_dtype_decode: weights.dtype("decode"),
            weight_dtype_perplexity: weights.dtype("perplexity"),
            decode_weight_bytes: m.timing.model.weight_bytes(),
            decode_weight_bytes_mapped: m.timing.model.mapped_weight_bytes(),
            memory_plan: weights.clone(),
            kv_bytes_per_token: spec
                .schemes
                .iter()
                .map(|k| (k.to_string(), k.bytes_per_token(&geom)))
                .collect(),
        },
        tokenizer: TokenizerMeta {
            description: tok.description.clone(),
            vocab_size: tok.vocab_size(),
            add_bos: tok.add_bos,
            bos: tok.bos,
        },
        sweep: spec,
        perplexity: spec.ppl.as_ref().map(|p| PerplexityMeta {
            protocol: p,
            dataset: wikitext::DATASET_NAME,
            dataset_tokens,
            reference: "llama.cpp llama-perplexity (non-overlapping windows, half scoring)",
        }),
        generation_tasks: generation(
            s,
            spec,
            tasks,
            (
                weights.dtype("perplexity"),
                m.quality.tokenizer.chat_template.is_some(),
            ),
        ),
        csv_columns: CSV_COLUMNS,
    })
}

/// The generation tasks' section: decoding, stop tokens, the XSum and passkey prompts.
fn generation(
    s: &SweepSettings,
    spec: &SweepSpec,
    tasks: &QualityTasks<'_>,
    (weights, chat_template): (WeightDtype, bool),
) -> GenerationMeta {
    GenerationMeta {
        weights,
        decoding: "greedy, batch 1, K/V in the scheme under test",
        stop_tokens: tasks.stop.clone(),
        rouge: tasks.rouge.as_ref().map(|r| {
            serde_json::json!({
                "dataset": "XSum test (datasets/xsum/xsum_test_100.jsonl), first N pairs",
                "samples": r.prompts.len(),
                "prompt": xsum::PROMPT,
                "chat_template": chat_template,
                "document_tokens": s.rouge.rouge_doc_tokens,
                "max_new_tokens": r.max_new,
                "scorer": "rouge-score 0.1.2 semantics, use_stemmer=True",
            })
        }),
        passkey: spec.passkey.as_ref().map(|p| {
            serde_json::json!({
                "spec": p,
                "prefix": passkey::PREFIX,
                "filler": passkey::FILLER,
                "needle": passkey::NEEDLE,
                "question": passkey::QUESTION,
                "max_new_tokens": 8,
                "correct": "first integer of the continuation equals the key",
            })
        }),
    }
}

/// The sections of a synthetic sweep's `meta.json`: what it times, the geometry, the KV bytes
/// per layer type of a windowed geometry (empty without a window), the memory limit, the spec.
pub(super) fn synthetic(
    model: &crate::model::geometry::ModelGeometry,
    memory_limit: u64,
    spec: &SweepSpec,
    by_layer_type: &[crate::measure::synthetic::LayerTypeBytes],
) -> serde_json::Map<String, serde_json::Value> {
    object(serde_json::json!({
        "mode_description": "attention + append only, synthetic K/V (outlier key channels), no weights",
        "model_geometry": model,
        "kv_bytes_by_layer_type": by_layer_type,
        "memory_limit_bytes": memory_limit,
        "sweep": spec,
        "csv_columns": CSV_COLUMNS,
    }))
}
