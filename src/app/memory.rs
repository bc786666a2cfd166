//! The memory plan ([`crate::measure::memory_plan`]) for a model location, made from its
//! header alone (GGUF tensor infos, or the safetensors headers and `config.json`) before any
//! weight is read; printed and recorded by sweep, serve and calibrate.

use candle_core::quantized::GgmlDType;
use candle_core::Device;

use crate::error::Result;
use crate::kv::KvScheme;
use crate::measure::memory_plan::{self, MemoryAsk, MemoryPlan, PhaseAsk, TensorSize};
use crate::model::{ModelConfig, ModelLocation};

/// The largest point a run holds at once.
#[derive(Debug, Clone, PartialEq)]
pub struct PeakLoad {
    /// Schemes of the run (the costliest one's KV counts).
    pub schemes: Vec<KvScheme>,
    /// Largest batch.
    pub batch: usize,
    /// Longest prompt, tokens.
    pub prompt: usize,
    /// Generated tokens per sequence.
    pub gen: usize,
    /// Perplexity window, tokens (0: no perplexity).
    pub ppl_ctx: usize,
    /// KV bytes when the run fixes them itself (serve's `--kv-budget`), instead of the
    /// schemes' bytes at the largest point.
    pub kv_bytes: Option<u64>,
}

/// The plan for a run of two phases (decode in `decode`, prefill as `prefill` asks; serve and
/// calibrate): [`plan_weights`] with no perplexity.
pub fn plan_decode_prefill(
    location: &ModelLocation,
    device: &Device,
    decode: crate::model::WeightDtype,
    prefill: memory_plan::WeightChoice,
    peak: &PeakLoad,
) -> Result<MemoryPlan> {
    let phases = vec![
        PhaseAsk {
            phase: "decode",
            flag: "--weights",
            choice: memory_plan::WeightChoice::Fixed(decode),
            runs: true,
        },
        PhaseAsk {
            phase: "prefill",
            flag: "--prefill-weights",
            choice: prefill,
            runs: true,
        },
    ];
    plan_weights(location, device, phases, peak)
}

/// The model's config and tensors (name, stored format, elements, bytes, matrix or not), and
/// whether its file is mapped on `device`. Errors: the loaders' header errors.
fn header(
    location: &ModelLocation,
    device: &Device,
) -> Result<(ModelConfig, Vec<TensorSize>, bool)> {
    match location {
        ModelLocation::Gguf(path) => {
            let f = crate::model::gguf::GgufFile::open(path)?;
            let tensors = f
                .tensor_infos()
                .into_iter()
                .map(|(name, dtype, dims, bytes)| TensorSize {
                    matrix: dims.len() == 2,
                    elems: dims.iter().product::<usize>() as u64,
                    name,
                    dtype,
                    stored_bytes: bytes,
                })
                .collect();
            let cfg = if crate::model::gemma3::is_gemma3(&f) {
                crate::model::gemma3::config(&f, path)?.0
            } else {
                f.config()?
            };
            Ok((cfg, tensors, device.is_cpu()))
        }
        ModelLocation::Safetensors {
            config, weights, ..
        } => {
            let (cfg, _) = crate::model::safetensors::read_config(config)?;
            // SAFETY: mapped read-only to read the headers; nothing writes the files.
            let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(weights) }
                .map_err(|e| crate::Error::ModelFormat {
                    path: weights.first().cloned().unwrap_or_default(),
                    reason: format!("safetensors: {}", crate::error::first_line(&e)),
                })?;
            let tensors = st
                .tensors()
                .into_iter()
                .map(|(name, v)| {
                    let elems = v.shape().iter().product::<usize>() as u64;
                    let bytes = v.data().len() as u64;
                    TensorSize {
                        // Only the size matters for the plan: 2-byte types as f16.
                        dtype: if bytes == elems * 4 {
                            GgmlDType::F32
                        } else {
                            GgmlDType::F16
                        },
                        matrix: v.shape().len() == 2,
                        name: if name == "model.embed_tokens.weight" {
                            "token_embd.weight".into()
                        } else if name == "lm_head.weight" {
                            "output.weight".into()
                        } else {
                            name
                        },
                        elems,
                        stored_bytes: bytes,
                    }
                })
                .collect();
            Ok((cfg, tensors, false))
        }
    }
}

/// Makes the plan for `phases` (decode first) at `peak` on `device`, against the memory
/// available now ([`memory_plan::available_now`]; on a GPU the host side is planned, the
/// device's memory is checked by the loader). Prints its notes. Errors: the header's, and
/// [`memory_plan::plan`]'s refusals (exit 2).
pub fn plan_weights(
    location: &ModelLocation,
    device: &Device,
    phases: Vec<PhaseAsk>,
    peak: &PeakLoad,
) -> Result<MemoryPlan> {
    let (cfg, tensors, mapped) = header(location, device)?;
    let geom = cfg.cache_geometry();
    let held = peak.prompt + peak.gen;
    let kv = peak.kv_bytes.unwrap_or_else(|| {
        peak.schemes
            .iter()
            .map(|s| {
                (s.bytes_for(&geom, peak.batch, held) as u64).max(s.bytes_for(
                    &geom,
                    1,
                    peak.ppl_ctx,
                ) as u64)
            })
            .max()
            .unwrap_or(0)
    });
    let ask = MemoryAsk {
        tensors,
        mapped,
        phases,
        kv_bytes: if device.is_cpu() { kv } else { 0 },
        activation_bytes: memory_plan::activation_bytes(
            cfg.hidden,
            cfg.intermediate,
            cfg.vocab,
            cfg.q_heads,
            peak.batch,
            peak.prompt,
            peak.ppl_ctx,
        ),
        available: memory_plan::available_now(),
    };
    let plan = memory_plan::plan(&ask)?;
    for n in &plan.notes {
        eprintln!("note: {n}");
    }
    Ok(plan)
}
