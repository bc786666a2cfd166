//! The sweep: for every KV scheme × batch size × sequence length, prefill real tokens, decode
//! greedily, and time it; per scheme, perplexity through the cache. Each finished point goes to a
//! [`PointSink`] at once, so an interrupted sweep keeps what finished.
//!
//! Definitions (as vLLM's `benchmarks/benchmark_serving.py` defines them per request; a batch is
//! `batch` requests that start together and share every step):
//! - TTFT: wall time from the start of prefill to the first generated token (prefill forward +
//!   greedy pick), ms; one sample per repeat.
//! - ITL (inter-token latency): the wall time of each decode step after the first token, ms; every
//!   step yields one token per sequence. All steps of all repeats are samples.
//! - TPOT (time per output token): `(E2E − TTFT) / (gen − 1)` per request, i.e. the mean ITL of
//!   one repeat; one sample per repeat.
//! - E2E latency: TTFT + Σ ITL of a repeat, ms.
//! - decode tokens/s: `batch × steps` / Σ decode-step time over all repeats (memory-bound);
//!   prefill tokens/s: `batch × seq_len` / mean TTFT (compute-bound). Reported separately.
//!
//! Stages, in order: quality once per scheme (perplexity, KL, ROUGE, passkey; fp16 first), then
//! timing point by point. At each (batch, prompt length) every scheme still to run is timed
//! together, interleaved: `warmup` untimed repeats each (short: 4 tokens), then rounds in which
//! every scheme runs one timed repeat, in a seeded random order per round (Google Benchmark's
//! `--benchmark_enable_random_interleaving`), until each has `repeats` (more while its timed
//! total is under `min_time_s`, optimum-benchmark's `duration`), each with a fresh cache. A
//! drifting machine then spreads over every scheme instead of posing as one scheme's effect;
//! each repeat's place in the point's run order is recorded, and so is what other processes
//! did meanwhile ([`super::contention`]).

use rand::{Rng, SeedableRng};

use super::unit::{Selection, Unit};
use crate::error::{Error, Result};
use crate::kv::{AnyCache, KvScheme};
use crate::model::tokenizer::TextTokenizer;
use crate::model::{argmax_rows, Model};
use crate::quality::generate::greedy;
use crate::quality::passkey::{
    first_integer, PasskeyPrompt, PasskeyResult, PasskeySpec, PasskeyTrial,
};
use crate::quality::perplexity::{perplexity_vs, PplMode, PplProtocol, PplResult};
use crate::quality::xsum::{RougeResult, RougeTask};
use crate::stats::summarize;
use crate::util::memory;

/// What to sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SweepSpec {
    /// KV schemes, in run order.
    pub schemes: Vec<KvScheme>,
    /// Sequences decoded together.
    pub batch_sizes: Vec<usize>,
    /// Prompt tokens per sequence.
    pub seq_lens: Vec<usize>,
    /// Tokens generated per sequence (the first comes from prefill; TPOT covers the rest).
    pub gen: usize,
    /// Perplexity protocol; `None` skips perplexity.
    pub ppl: Option<PplProtocol>,
    /// Seed for choosing prompt offsets in the token stream.
    pub seed: u64,
    /// Untimed repeats before each point (page-in, thread start-up, allocator warm-up).
    pub warmup: usize,
    /// Timed repeats per point (at least).
    pub repeats: usize,
    /// Keep repeating a point until its timed total reaches this many seconds (0: off).
    pub min_time_s: f64,
    /// Compare every scheme's next-token distributions with the fp16 cache's in lockstep
    /// (KL divergence, top-1 agreement); doubles perplexity time for non-baseline schemes.
    pub kl: bool,
    /// XSum articles summarized per scheme for ROUGE (0: none).
    pub rouge_samples: usize,
    /// Passkey retrieval lengths, depths and trials; `None` skips it.
    pub passkey: Option<PasskeySpec>,
    /// Perplexity reruns per scheme with rounding-level perturbation for the noise floor
    /// (`--ppl-noise-floor`; rerun k seeded by `seed + k`); 0: off.
    pub ppl_noise_floor: usize,
}

/// `r` with its noise floor when `spec.ppl_noise_floor` ≥ 2: the perplexity of `scheme` rerun K
/// times (no fp16 lockstep) on a model whose layer inputs are perturbed at rounding level,
/// rerun k seeded by `spec.seed + k` ([`rounding_perturbed`]), summarized by
/// [`crate::quality::paired::noise_floor`]. The unperturbed result itself is left as it was.
fn with_noise_floor(
    mut r: PplResult,
    spec: &SweepSpec,
    model: &Model,
    tokens: &[u32],
    scheme: KvScheme,
    proto: &PplProtocol,
    bos: Option<u32>,
) -> Result<PplResult> {
    if spec.ppl_noise_floor < 2 {
        return Ok(r);
    }
    let ppls = (0..spec.ppl_noise_floor as u64)
        .map(|k| {
            let m = rounding_perturbed(model, spec.seed.wrapping_add(k));
            perplexity_vs(&m, tokens, scheme, None, proto, bos, |_, _| {}).map(|p| p.perplexity)
        })
        .collect::<Result<Vec<f64>>>()?;
    r.noise_floor = Some(crate::quality::paired::noise_floor(&ppls)?);
    Ok(r)
}

/// `model` with every layer input moved one ulp up or down at random
/// ([`crate::quality::paired::perturb_rounding`]), the SplitMix64 stream seeded by `seed` and
/// advancing with every forward call: the same seed and calls give the same numbers.
pub fn rounding_perturbed(model: &Model, seed: u64) -> Model {
    let rng = std::sync::Mutex::new(crate::util::noise::SplitMix64::new(seed));
    model.with_layer_input_hook(crate::model::LayerInputHook(std::sync::Arc::new(
        move |x: &mut [f32]| {
            // A poisoned lock only means another thread panicked mid-stream; the state is plain.
            let mut g = rng.lock().unwrap_or_else(|e| e.into_inner());
            crate::quality::paired::perturb_rounding(x, &mut g);
        },
    )))
}

/// What a sweep reads: the token stream that supplies the perplexity text and the prompts, the
/// BOS policy, and the generation tasks (if any).
#[derive(Debug, Clone, Copy)]
pub struct SweepText<'a> {
    /// WikiText-2 test tokens.
    pub tokens: &'a [u32],
    /// BOS id when the model expects one.
    pub bos: Option<u32>,
    /// XSum and passkey prompts.
    pub tasks: Option<&'a QualityTasks<'a>>,
}

/// The generation tasks of a sweep, tokenized once: XSum prompts and passkey prompts, with the
/// tokenizer that turns generated ids back into text.
#[derive(Debug, Clone)]
pub struct QualityTasks<'a> {
    /// Decodes generated ids.
    pub tokenizer: &'a TextTokenizer,
    /// Tokens that end a generated turn.
    pub stop: Vec<u32>,
    /// XSum summarization prompts, if ROUGE is measured.
    pub rouge: Option<RougeTask>,
    /// Passkey prompts (empty: not measured).
    pub passkey: Vec<PasskeyPrompt>,
}

impl QualityTasks<'_> {
    /// Work items per scheme: one per generated summary and per passkey prompt.
    pub fn units(&self) -> usize {
        self.rouge.as_ref().map_or(0, |r| r.prompts.len()) + self.passkey.len()
    }

    /// Estimated cost of one scheme's generation tasks, in [`STEP_TOKENS`]' unit: each XSum
    /// prompt's tokens plus its new tokens' decode steps, each passkey prompt plus its 8.
    pub fn cost(&self) -> u64 {
        self.rouge.as_ref().map_or(0, |r| {
            r.prompts
                .iter()
                .map(|p| prompt_cost(p.len(), r.max_new))
                .sum()
        }) + self
            .passkey
            .iter()
            .map(|p| prompt_cost(p.tokens.len(), PASSKEY_NEW_TOKENS))
            .sum::<u64>()
    }
}

/// What the progress display counts: estimated cost in prompt-token forwards, a decode step
/// of batch b costing `STEP_TOKENS + b` of them (the step reads every weight once, which on
/// CPUs costs about as much as the forward of 10–30 prompt tokens: ~30 for the default model
/// on 2 cores, where a step takes ~10 ms and a prompt token ~0.3 ms; fewer for 8B shapes).
/// An estimate for a time-left figure, not a measurement; it keeps a unit of 512-token
/// perplexity from counting like a point that decodes 4 × 32 tokens four times.
pub const STEP_TOKENS: u64 = 16;

/// Greedy tokens a passkey trial generates at most.
const PASSKEY_NEW_TOKENS: usize = 8;

/// Estimated cost of generating `new` tokens after a `prompt`-token prompt, batch 1.
fn prompt_cost(prompt: usize, new: usize) -> u64 {
    prompt as u64 + new as u64 * (STEP_TOKENS + 1)
}

impl SweepSpec {
    /// Estimated cost of timing point `batch` × `seq_len` ([`STEP_TOKENS`]' unit): warm-up and
    /// timed repeats (at least `repeats`; `min_time_s` may add more), each a prefill of
    /// `batch × seq_len` tokens and `gen` decode steps of the batch.
    pub fn point_cost(&self, batch: usize, seq_len: usize) -> u64 {
        let (b, l, g) = (batch as u64, seq_len as u64, self.gen as u64);
        (self.warmup + self.repeats).max(1) as u64 * (b * l + g * (STEP_TOKENS + b))
    }

    /// Estimated cost of one perplexity window for `scheme` ([`STEP_TOKENS`]' unit): `ctx`
    /// prompt tokens chunked, or `ctx` decode steps shared by the protocol's batch of
    /// windows; twice that with the fp16 cache run in lockstep (KL), and once more per
    /// noise-floor rerun. 0 without perplexity.
    pub fn window_cost(&self, scheme: &KvScheme) -> u64 {
        self.window_pass_cost(scheme) + self.ppl_noise_floor as u64 * self.window_once(scheme)
    }

    /// [`Self::window_cost`] without the noise-floor reruns.
    pub fn window_pass_cost(&self, scheme: &KvScheme) -> u64 {
        let lockstep = if self.kl && !scheme.is_baseline() {
            2
        } else {
            1
        };
        lockstep * self.window_once(scheme)
    }

    /// One window through `scheme`'s cache alone.
    fn window_once(&self, scheme: &KvScheme) -> u64 {
        let Some(p) = &self.ppl else { return 0 };
        let ctx = p.ctx as u64;
        match p.mode.resolve(scheme) {
            PplMode::Decode => ctx + ctx * STEP_TOKENS / p.batch.max(1) as u64,
            _ => ctx,
        }
    }

    /// Estimated cost of `unit` ([`STEP_TOKENS`]' unit): [`Self::point_cost`] for a timing
    /// point; every perplexity window plus `tasks`' [`QualityTasks::cost`] for a quality unit.
    pub fn unit_cost(&self, unit: &Unit, tasks: Option<&QualityTasks<'_>>) -> u64 {
        match unit {
            Unit::Timing { batch, seq_len, .. } => self.point_cost(*batch, *seq_len),
            Unit::Quality { scheme } => {
                let windows = self.ppl.as_ref().map_or(0, |p| p.windows.unwrap_or(0)) as u64;
                windows * self.window_cost(scheme) + tasks.map_or(0, |t| t.cost())
            }
        }
    }

    /// A timing-only spec (no perplexity, no generation tasks, one repeat, no warm-up), as
    /// attention-only synthetic sweeps use.
    pub fn timing_only(
        schemes: Vec<KvScheme>,
        batch_sizes: Vec<usize>,
        seq_lens: Vec<usize>,
        gen: usize,
        seed: u64,
    ) -> Self {
        SweepSpec {
            schemes,
            batch_sizes,
            seq_lens,
            gen,
            ppl: None,
            seed,
            warmup: 0,
            repeats: 1,
            min_time_s: 0.0,
            kl: false,
            rouge_samples: 0,
            passkey: None,
            ppl_noise_floor: 0,
        }
    }

    /// Checks the spec against a model before any work. Errors: [`Error::InvalidArgument`]
    /// naming the offending flag.
    pub fn validate(&self, model_ctx: usize, n_tokens: usize) -> Result<()> {
        let bad = |name: &str, reason: String| {
            Err(Error::InvalidArgument {
                name: name.into(),
                reason,
            })
        };
        if self.schemes.is_empty() {
            return bad("--dtypes", "no scheme given".into());
        }
        if self.batch_sizes.is_empty() || self.batch_sizes.contains(&0) {
            return bad("--batch-sizes", "give one or more sizes ≥ 1".into());
        }
        if self.seq_lens.is_empty() || self.seq_lens.contains(&0) {
            return bad("--seq-lens", "give one or more lengths ≥ 1".into());
        }
        if self.repeats == 0 {
            return bad("--repeats", "give 1 or more timed repeats".into());
        }
        if !(self.min_time_s.is_finite() && self.min_time_s >= 0.0) {
            return bad(
                "--min-time",
                format!("{} is not a duration ≥ 0 s", self.min_time_s),
            );
        }
        if self.min_time_s > MAX_MIN_TIME_S {
            return bad(
                "--min-time",
                format!(
                    "{} s of timed repeats per point would run for days; give at most \
                     {MAX_MIN_TIME_S} s",
                    self.min_time_s
                ),
            );
        }
        if self.ppl_noise_floor == 1 {
            return bad(
                "--ppl-noise-floor",
                "one rerun has no spread; use 0 (off) or K ≥ 2".into(),
            );
        }
        if self.ppl_noise_floor > MAX_PPL_NOISE_FLOOR {
            return bad(
                "--ppl-noise-floor",
                format!(
                    "{} reruns of every scheme's perplexity would run for days; give at most \
                     {MAX_PPL_NOISE_FLOOR} (3 to 5 show the spread)",
                    self.ppl_noise_floor
                ),
            );
        }
        if self.gen < 2 {
            return bad(
                "--gen",
                format!("{} leaves no decode step to time; use ≥ 2", self.gen),
            );
        }
        for &b in &self.batch_sizes {
            for &l in &self.seq_lens {
                let tokens = l.checked_add(self.gen).and_then(|t| t.checked_mul(b));
                if tokens.is_none_or(|t| t > MAX_POINT_TOKENS) {
                    // Name the flag that is out of range on its own, if one is.
                    let flag = if self.gen > MAX_POINT_TOKENS {
                        "--gen"
                    } else if l > MAX_POINT_TOKENS {
                        "--seq-lens"
                    } else {
                        "--batch-sizes"
                    };
                    return bad(
                        flag,
                        format!(
                            "batch {b} × ({l} + {}) tokens is beyond any machine's memory \
                             (at most {MAX_POINT_TOKENS} tokens per point)",
                            self.gen
                        ),
                    );
                }
            }
        }
        for &l in &self.seq_lens {
            if l.saturating_add(self.gen) > model_ctx {
                return bad(
                    "--seq-lens",
                    format!(
                        "{l} prompt + {} generated tokens exceed the model's context length {model_ctx}",
                        self.gen
                    ),
                );
            }
            if l >= n_tokens {
                return bad(
                    "--seq-lens",
                    format!("{l} is longer than the prompt text ({n_tokens} tokens)"),
                );
            }
        }
        Ok(())
    }
}

/// Most tokens one point may hold (`batch × (seq_len + gen)`, 2^40): a bound that keeps every
/// size computed from the flags far from overflow; what fits is decided per point by memory.
pub const MAX_POINT_TOKENS: usize = 1 << 40;

/// Longest `--min-time` per point, seconds (an hour).
pub const MAX_MIN_TIME_S: f64 = 3600.0;

/// Most perplexity reruns `--ppl-noise-floor` takes: each is a full perplexity pass per scheme.
pub const MAX_PPL_NOISE_FLOOR: usize = 100;

/// Raw samples and memory of one sweep point. Summaries are computed from these when a report
/// is rendered, so `raw.jsonl` holds everything needed to re-render.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PointTiming {
    /// TTFT of each timed repeat, ms (empty when nothing is prefilled, e.g. synthetic sweeps).
    pub ttft_ms: Vec<f64>,
    /// Inter-token latencies of each timed repeat, ms: `[repeat][decode step]`.
    pub itl_ms: Vec<Vec<f64>>,
    /// Tokens held per sequence at the end.
    pub kv_tokens: usize,
    /// Bytes of K/V held at the end (codes, scales, zero-points), all sequences.
    pub kv_bytes: usize,
    /// Bytes the cache had allocated at the end (capacity).
    pub kv_reserved_bytes: usize,
    /// Peak RSS of the process during this point's timed repeats alone, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// GPU runs: device memory in use at its highest sample during the timed repeats, bytes
    /// (`cuMemGetInfo` total − free after the prefill and after every decode step: weights,
    /// KV cache, activations, the CUDA context and anything else on the GPU). None on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_peak_bytes: Option<u64>,
    /// Values saturated by fixed fp8 scales during the last repeat.
    pub saturated_values: u64,
    /// Greedy tokens of the first sequence of the last repeat (for agreement checks).
    pub generated: Vec<u32>,
    /// For each timed repeat, its position in the point's run order (all schemes timed at
    /// this batch × prompt length, interleaved; 0-based). Empty in runs made before
    /// interleaving.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_order: Vec<usize>,
    /// Other processes' CPU use during this scheme's timed repeats (Linux only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<super::contention::Contention>,
    /// For each timed repeat, the attention kernels' time per decode step, all layers, ms
    /// ([`crate::kv::AttentionMeter`]: scores, softmax and P·V, not the projections). Empty on
    /// CUDA and in runs made before it was measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attn_step_ms: Vec<f64>,
    /// For each timed repeat, the K/V bytes the decode steps' attention read over its time,
    /// GB/s (10⁹ bytes/s). Empty where `attn_step_ms` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attn_gb_s: Vec<f64>,
}

impl PointTiming {
    /// TPOT of each repeat, ms: its mean inter-token latency.
    pub fn tpot_ms(&self) -> Vec<f64> {
        self.itl_ms
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| r.iter().sum::<f64>() / r.len() as f64)
            .collect()
    }

    /// Every inter-token latency of every repeat, ms.
    pub fn itl_all_ms(&self) -> Vec<f64> {
        self.itl_ms.iter().flatten().copied().collect()
    }

    /// End-to-end latency of each repeat (TTFT + Σ ITL), ms; empty without TTFT samples.
    pub fn e2e_ms(&self) -> Vec<f64> {
        self.ttft_ms
            .iter()
            .zip(&self.itl_ms)
            .map(|(t, r)| t + r.iter().sum::<f64>())
            .collect()
    }

    /// Decode throughput over a batch of `batch` sequences, tokens/s.
    pub fn decode_tokens_per_s(&self, batch: usize) -> Option<f64> {
        let steps: usize = self.itl_ms.iter().map(Vec::len).sum();
        let ms: f64 = self.itl_ms.iter().flatten().sum();
        (steps > 0 && ms > 0.0).then(|| (batch * steps) as f64 / (ms * 1e-3))
    }

    /// Prefill throughput over `batch × seq_len` prompt tokens, tokens/s (mean TTFT).
    pub fn prefill_tokens_per_s(&self, batch: usize, seq_len: usize) -> Option<f64> {
        let t = summarize(&self.ttft_ms)?.mean;
        Some((batch * seq_len) as f64 / (t * 1e-3))
    }
}

/// How a point ended: `ok`, or why it has no timing. In `raw.jsonl` and `results.csv` it is
/// the string `ok`, `oom: <what>` or `error: <what>` ([`std::fmt::Display`] /
/// [`std::str::FromStr`], which round-trip), so files written before the type existed read
/// alike; in code it is matched, never compared as text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PointStatus {
    /// Timed.
    #[default]
    Ok,
    /// The point did not fit: predicted from its size, or the device/allocator ran out of
    /// memory ([`crate::Error::is_out_of_memory`]). The text says how much was needed.
    Oom(String),
    /// Any other failure (a kernel error, a panic), with its message.
    Error(String),
}

impl PointStatus {
    /// Whether the point was timed.
    pub fn is_ok(&self) -> bool {
        matches!(self, PointStatus::Ok)
    }

    /// Whether the point ran out of memory.
    pub fn is_oom(&self) -> bool {
        matches!(self, PointStatus::Oom(_))
    }
}

impl std::fmt::Display for PointStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PointStatus::Ok => f.write_str("ok"),
            PointStatus::Oom(m) => write!(f, "oom: {m}"),
            PointStatus::Error(m) => write!(f, "error: {m}"),
        }
    }
}

impl std::str::FromStr for PointStatus {
    type Err = std::convert::Infallible;
    /// `ok`, `oom: …`, `error: …`; any other text (none is written) reads as an error with
    /// that text, so no old file is refused over its status.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(if s == "ok" {
            PointStatus::Ok
        } else if let Some(m) = s.strip_prefix("oom: ") {
            PointStatus::Oom(m.to_string())
        } else if s == "oom" {
            PointStatus::Oom(String::new())
        } else if let Some(m) = s.strip_prefix("error: ") {
            PointStatus::Error(m.to_string())
        } else {
            PointStatus::Error(s.to_string())
        })
    }
}

impl serde::Serialize for PointStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PointStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(text
            .parse()
            .unwrap_or_else(|e: std::convert::Infallible| match e {}))
    }
}

/// One finished timing point, as it reaches the sink; one line of `raw.jsonl` (serialized with
/// a `status` field and `timing` present only when ok). Quality results are not repeated here:
/// each scheme's are one [`QualityOutcome`] record of their own, joined to the points when a
/// report is rendered.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(into = "RawPoint", try_from = "RawPoint")]
pub struct PointOutcome {
    /// The scheme.
    pub scheme: KvScheme,
    /// Batch size.
    pub batch: usize,
    /// Prompt length.
    pub seq_len: usize,
    /// Timings, or why the point failed (never [`PointStatus::Ok`]).
    pub timing: std::result::Result<PointTiming, PointStatus>,
}

impl PointOutcome {
    /// The point's status.
    pub fn status(&self) -> PointStatus {
        match &self.timing {
            Ok(_) => PointStatus::Ok,
            Err(s) => s.clone(),
        }
    }
}

/// The on-disk form of [`PointOutcome`]. Lines written before quality had its own record also
/// carry `ppl`, `baseline_ppl`, `rouge` and `passkey`; they are ignored here and read by
/// `crate::report`'s reader, which turns them into [`QualityOutcome`]s.
#[derive(serde::Serialize, serde::Deserialize)]
struct RawPoint {
    scheme: KvScheme,
    batch: usize,
    seq_len: usize,
    status: PointStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timing: Option<PointTiming>,
}

impl From<PointOutcome> for RawPoint {
    fn from(o: PointOutcome) -> Self {
        let (status, timing) = match o.timing {
            Ok(t) => (PointStatus::Ok, Some(t)),
            Err(e) => (e, None),
        };
        RawPoint {
            scheme: o.scheme,
            batch: o.batch,
            seq_len: o.seq_len,
            status,
            timing,
        }
    }
}

impl TryFrom<RawPoint> for PointOutcome {
    type Error = String;
    fn try_from(r: RawPoint) -> std::result::Result<Self, String> {
        let timing = match (r.status, r.timing) {
            (PointStatus::Ok, Some(t)) => Ok(t),
            (PointStatus::Ok, None) => return Err("status `ok` without `timing`".into()),
            (failed, _) => Err(failed),
        };
        Ok(PointOutcome {
            scheme: r.scheme,
            batch: r.batch,
            seq_len: r.seq_len,
            timing,
        })
    }
}

/// Receives results as they finish.
pub trait PointSink {
    /// Called once per finished point (successful or not).
    fn point(&mut self, outcome: &PointOutcome) -> Result<()>;

    /// Called once per scheme whose quality unit this process ran (before its points), so a
    /// shard that holds a scheme's quality but none of its timing points still keeps it.
    fn quality(&mut self, _outcome: &QualityOutcome) -> Result<()> {
        Ok(())
    }
}

/// A scheme's quality results, measured once per scheme: one record of `raw.jsonl`
/// (`"record": "quality"`), joined to the scheme's timing points when a report is rendered and
/// by `kvbench merge` across shards.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QualityOutcome {
    /// The scheme.
    pub scheme: KvScheme,
    /// Perplexity (with KL vs the fp16 cache when measured), if measured.
    #[serde(default)]
    pub ppl: Option<PplResult>,
    /// ROUGE on XSum summaries, if measured (`rouge_l_vs_fp16` only when the fp16 summaries
    /// were made by the same process; `kvbench merge` fills it in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge: Option<RougeResult>,
    /// Passkey trials, if measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passkey: Option<PasskeyResult>,
}

/// What one process of a sweep runs: the selected units (all of them, or one shard's; see
/// [`super::shard`]), and what an earlier, interrupted run of the same folder finished
/// (`--resume`): its points and its quality results.
#[derive(Debug, Clone, Copy)]
pub struct Work<'a> {
    /// Units to run (others are skipped).
    pub selection: &'a Selection,
    /// Points finished earlier.
    pub done: &'a [PointOutcome],
    /// Quality results finished earlier.
    pub done_quality: &'a [QualityOutcome],
}

impl Work<'_> {
    /// The earlier quality results of `scheme` (older folders' forms are converted when read,
    /// see `crate::report::read_records`).
    fn earlier_quality(&self, scheme: KvScheme) -> Option<QualityOutcome> {
        self.done_quality
            .iter()
            .find(|q| q.scheme == scheme)
            .cloned()
    }
}

/// Progress reporting hooks; all default to no-ops.
pub trait Progress {
    /// A unit of work started (`what` describes it).
    fn start(&self, _what: &str) {}
    /// `n` units of work finished.
    fn advance(&self, _n: u64) {}
}

impl Progress for () {}

/// The schemes of timing point `batch` × `seq_len` still to run: those `selection` holds that
/// `done` (a resumed run's finished points) lacks, in `spec` order; the selected ones already
/// done count as progress at once.
pub fn pending_at(
    spec: &SweepSpec,
    selection: &Selection,
    done: &[PointOutcome],
    batch: usize,
    seq_len: usize,
    progress: &dyn Progress,
) -> Vec<KvScheme> {
    let selected: Vec<KvScheme> = spec
        .schemes
        .iter()
        .copied()
        .filter(|&s| selection.has_timing(s, batch, seq_len))
        .collect();
    let todo: Vec<KvScheme> = selected
        .iter()
        .copied()
        .filter(|&s| !is_done(done, s, batch, seq_len))
        .collect();
    progress.advance((selected.len() - todo.len()) as u64 * spec.point_cost(batch, seq_len));
    todo
}

/// Whether `done` holds the point `scheme` × `batch` × `seq_len`.
fn is_done(done: &[PointOutcome], scheme: KvScheme, batch: usize, seq_len: usize) -> bool {
    done.iter()
        .any(|o| o.scheme == scheme && o.batch == batch && o.seq_len == seq_len)
}

/// Hands a timed (or failed) point of `spec` to `sink` and counts its cost as progress.
pub fn emit_point(
    sink: &mut dyn PointSink,
    progress: &dyn Progress,
    spec: &SweepSpec,
    scheme: KvScheme,
    batch: usize,
    seq_len: usize,
    timing: std::result::Result<PointTiming, PointStatus>,
) -> Result<()> {
    sink.point(&PointOutcome {
        scheme,
        batch,
        seq_len,
        timing,
    })?;
    progress.advance(spec.point_cost(batch, seq_len));
    Ok(())
}

/// The model in the weight dtype each phase runs with. All three share one set of files and one
/// geometry; they differ only in how the linear layers compute (candle's f32 gemm is ~3× faster
/// than its Q8_0 kernels for prefill, its Q8_0 kernels ~2× faster for memory-bound decode), as
/// serving engines pick different kernels for prefill and decode.
#[derive(Debug, Clone, Copy)]
pub struct PhaseModels<'a> {
    /// Runs the prompt (TTFT).
    pub prefill: &'a Model,
    /// Runs the decode steps (TPOT).
    pub decode: &'a Model,
    /// Computes perplexity (f32 by default, so quality numbers are exact).
    pub quality: &'a Model,
}

/// Runs the sweep over `tokens`, which supply both the perplexity text and the prompts.
///
/// Only the units in `work.selection` run (a shard's share, or all; see [`super::shard`]); a
/// point not selected is skipped, and a scheme whose quality unit is elsewhere gets rows without
/// quality columns (`kvbench merge` joins them). `work.done` holds points finished by an
/// earlier, interrupted run of the same spec (`--resume`): they are skipped, and a scheme's
/// quality results found in `work.done_quality` or among them are reused rather than measured
/// again. Errors: [`SweepSpec::validate`]'s, perplexity failures, and the sink's I/O errors; a
/// failing timing point is recorded (`error: …`, `oom: …`) and the sweep goes on.
pub fn run_sweep(
    models: PhaseModels<'_>,
    text: SweepText<'_>,
    spec: &SweepSpec,
    work: Work<'_>,
    sink: &mut dyn PointSink,
    progress: &dyn Progress,
) -> Result<()> {
    let cfg = &models.decode.config;
    spec.validate(cfg.max_ctx, text.tokens.len())?;
    for s in &spec.schemes {
        s.validate(cfg.head_dim)?;
    }
    quality_stage(models, text, spec, work, sink, progress)?;
    timing_stage(models, text.tokens, spec, work, sink, progress)
}

/// Stage 1 of [`run_sweep`]: quality, once per scheme whose quality unit runs here, in `spec`
/// order (the baseline's ROUGE summaries serve the schemes after it). A scheme is skipped
/// when it has no timing point left to run and its quality unit is elsewhere or already done
/// (a done unit still counts as progress); otherwise its perplexity ([`scheme_perplexity`]) and
/// generation tasks ([`scheme_tasks`]) are measured or taken from the earlier run, and results
/// measured here go to `sink`. Errors: perplexity and generation failures, the sink's.
fn quality_stage(
    models: PhaseModels<'_>,
    text: SweepText<'_>,
    spec: &SweepSpec,
    work: Work<'_>,
    sink: &mut dyn PointSink,
    progress: &dyn Progress,
) -> Result<()> {
    let fp16_earlier = work.earlier_quality(KvScheme::FP16);
    let mut baseline_rouge: Option<Vec<String>> = fp16_earlier
        .as_ref()
        .and_then(|q| q.rouge.as_ref().map(|r| r.predictions.clone()));
    for &scheme in &spec.schemes {
        let todo = points_to_run(spec, work, scheme);
        // This process runs the scheme's quality unit (sharded runs: maybe without any of its
        // points); an earlier run's results are reused rather than measured again.
        let quality_here = work.selection.has_quality(scheme);
        let earlier = work.earlier_quality(scheme);
        if todo == 0 && (!quality_here || earlier.is_some()) {
            if quality_here {
                progress.advance(spec.unit_cost(&Unit::Quality { scheme }, text.tasks));
            }
            continue;
        }
        let ppl = scheme_perplexity(
            models.quality,
            text,
            spec,
            scheme,
            quality_here,
            earlier.as_ref(),
            progress,
        )?;
        let (rouge, passkey) = match text.tasks {
            Some(t) => scheme_tasks(
                models.quality,
                t,
                scheme,
                quality_here,
                earlier.as_ref(),
                &mut baseline_rouge,
                progress,
            )?,
            None => (None, None),
        };
        if quality_here && !work.done_quality.iter().any(|q| q.scheme == scheme) {
            sink.quality(&QualityOutcome {
                scheme,
                ppl,
                rouge,
                passkey,
            })?;
        }
    }
    Ok(())
}

/// Timing points of `scheme` this process still runs: selected and not done earlier.
fn points_to_run(spec: &SweepSpec, work: Work<'_>, scheme: KvScheme) -> usize {
    spec.batch_sizes
        .iter()
        .flat_map(|&b| spec.seq_lens.iter().map(move |&l| (b, l)))
        .filter(|&(b, l)| {
            work.selection.has_timing(scheme, b, l) && !is_done(work.done, scheme, b, l)
        })
        .count()
}

/// `scheme`'s perplexity when `spec` asks for it: the `earlier` run's result (its windows count
/// as progress at once), else measured on `model` when the quality unit runs here (with KL vs
/// fp16 when `spec.kl`, and the noise floor when asked for; one progress unit per window),
/// else none. Errors: [`perplexity_vs`]'s and [`with_noise_floor`]'s.
fn scheme_perplexity(
    model: &Model,
    text: SweepText<'_>,
    spec: &SweepSpec,
    scheme: KvScheme,
    quality_here: bool,
    earlier: Option<&QualityOutcome>,
    progress: &dyn Progress,
) -> Result<Option<PplResult>> {
    let earlier_ppl = earlier.and_then(|q| q.ppl.clone());
    Ok(match (&spec.ppl, earlier_ppl) {
        (Some(proto), Some(r)) => {
            progress.advance(proto.windows.unwrap_or(0) as u64 * spec.window_cost(&scheme));
            Some(r)
        }
        (Some(proto), None) if quality_here => {
            progress.start(&format!("{scheme}: perplexity"));
            let baseline = spec.kl.then_some(KvScheme::FP16);
            let window = spec.window_pass_cost(&scheme);
            let r = perplexity_vs(
                model,
                text.tokens,
                scheme,
                baseline,
                proto,
                text.bos,
                |_, _| progress.advance(window),
            )?;
            let r = with_noise_floor(r, spec, model, text.tokens, scheme, proto, text.bos)?;
            // The noise-floor reruns count once they are done.
            let windows = proto.windows.unwrap_or(0) as u64;
            progress.advance(windows * (spec.window_cost(&scheme) - window));
            Some(r)
        }
        _ => None,
    })
}

/// `scheme`'s generation tasks `t`: ROUGE on XSum (when asked for) and passkey retrieval (when
/// it has prompts), each the `earlier` run's result (counted as progress at once), else
/// measured on `model` when the quality unit runs here, else none. ROUGE is scored against
/// `baseline_rouge`, the fp16 summaries, which the baseline scheme itself sets (to none when it
/// has no summaries). Errors: generation failures.
fn scheme_tasks(
    model: &Model,
    t: &QualityTasks<'_>,
    scheme: KvScheme,
    quality_here: bool,
    earlier: Option<&QualityOutcome>,
    baseline_rouge: &mut Option<Vec<String>>,
    progress: &dyn Progress,
) -> Result<(Option<RougeResult>, Option<PasskeyResult>)> {
    let earlier_rouge = earlier.and_then(|o| o.rouge.clone());
    let rouge = match (&t.rouge, earlier_rouge) {
        (Some(task), Some(r)) => {
            let cost = task
                .prompts
                .iter()
                .map(|p| prompt_cost(p.len(), task.max_new));
            progress.advance(cost.sum());
            Some(r)
        }
        (Some(task), None) if quality_here => {
            let base = baseline_rouge.as_deref().filter(|_| !scheme.is_baseline());
            Some(summarize_xsum(model, scheme, task, t, base, progress)?)
        }
        _ => None,
    };
    if scheme.is_baseline() {
        *baseline_rouge = rouge.as_ref().map(|r| r.predictions.clone());
    }
    let passkey = match earlier.and_then(|o| o.passkey.clone()) {
        Some(p) => {
            let cost = t
                .passkey
                .iter()
                .map(|p| prompt_cost(p.tokens.len(), PASSKEY_NEW_TOKENS));
            progress.advance(cost.sum());
            Some(p)
        }
        None if quality_here && !t.passkey.is_empty() => {
            Some(passkey_trials(model, scheme, t, progress)?)
        }
        None => None,
    };
    Ok((rouge, passkey))
}

/// Stage 2 of [`run_sweep`]: timing, point by point (this process's points, those done earlier
/// skipped), the schemes of a point timed together with their repeats interleaved; prompts
/// come from `tokens` at seeded offsets, and none are built when every scheme is predicted out
/// of memory. Each point goes to `sink` as it finishes. Errors: the sink's only (a failing point
/// is recorded as such).
fn timing_stage(
    models: PhaseModels<'_>,
    tokens: &[u32],
    spec: &SweepSpec,
    work: Work<'_>,
    sink: &mut dyn PointSink,
    progress: &dyn Progress,
) -> Result<()> {
    for &batch in &spec.batch_sizes {
        for &seq_len in &spec.seq_lens {
            let schemes = pending_at(spec, work.selection, work.done, batch, seq_len, progress);
            if schemes.is_empty() {
                continue;
            }
            progress.start(&format!(
                "batch {batch} × {seq_len} tokens: {} scheme{} interleaved",
                schemes.len(),
                if schemes.len() == 1 { "" } else { "s" }
            ));
            // The memory check comes before the prompts are built: they alone can be too big.
            let all_oom = schemes
                .iter()
                .all(|&s| predicted_oom(models, s, batch, seq_len, spec).is_some());
            let prompts = if all_oom {
                Vec::new()
            } else {
                prompts(tokens, batch, seq_len, spec.seed)
            };
            let order_seed = spec.seed ^ ((batch as u64) << 32 | seq_len as u64);
            let timings =
                interleaved_point(models, &schemes, batch, seq_len, spec, &prompts, order_seed);
            for (&scheme, timing) in schemes.iter().zip(timings) {
                emit_point(sink, progress, spec, scheme, batch, seq_len, timing)?;
            }
        }
    }
    Ok(())
}

/// `batch` prompts of `seq_len` real tokens, each from a seeded random offset in `tokens`,
/// concatenated row-major (`[batch, seq_len]`).
pub fn prompts(tokens: &[u32], batch: usize, seq_len: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let span = tokens.len() - seq_len;
    (0..batch)
        .flat_map(|_| {
            let start = rng.random_range(0..span);
            tokens[start..start + seq_len].iter().copied()
        })
        .collect()
}

/// Runs `f`, turning an error or a panic into a status so a sweep goes on:
/// [`PointStatus::Oom`] when the device ran out of memory ([`crate::Error::is_out_of_memory`]:
/// CUDA's `CUDA_ERROR_OUT_OF_MEMORY`, a cuBLAS allocation failure), else
/// [`PointStatus::Error`].
pub fn catch_point<T>(f: impl FnOnce() -> Result<T>) -> std::result::Result<T, PointStatus> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) if e.is_out_of_memory() => Err(PointStatus::Oom(crate::error::first_line(&e))),
        Ok(Err(e)) => Err(PointStatus::Error(e.to_string())),
        Err(p) => Err(PointStatus::Error(format!(
            "panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("unknown")
        ))),
    }
}

/// The [`PointStatus::Oom`] of a point whose predicted memory (KV cache, prefill activations and the
/// prompt tokens, in f64 so no product overflows) exceeds what is available, else `None`.
fn predicted_oom(
    models: PhaseModels<'_>,
    scheme: KvScheme,
    batch: usize,
    seq_len: usize,
    spec: &SweepSpec,
) -> Option<PointStatus> {
    let c = &models.decode.config;
    let g = c.cache_geometry();
    let (b, l) = (batch as f64, seq_len as f64);
    let kv = scheme.bytes_per_token(&g) as f64 * b * (l + spec.gen as f64);
    // Prefill activations: logits-free hidden states, q/k/v, and attention scores per task;
    // plus the prompt tokens themselves (u32).
    let act = b * l * (4.0 * c.hidden as f64 + 3.0 * c.intermediate as f64 + 1.0) * 4.0
        + b * c.vocab as f64 * 4.0;
    // On a GPU the point lives in device memory: compare with what the driver reports free.
    let avail = match super::device::device_mem_free(models.decode.device()) {
        Ok(Some(free)) => Some(free),
        _ => memory::available_bytes(),
    }? as f64;
    (kv + act > avail).then(|| {
        PointStatus::Oom(format!(
            "needs ~{:.2} GiB (KV {:.2} GiB), {:.2} GiB available",
            (kv + act) / GIB,
            kv / GIB,
            avail / GIB
        ))
    })
}

/// One scheme's samples while its point is being timed.
#[derive(Default)]
struct Samples {
    ttft_ms: Vec<f64>,
    itl_ms: Vec<Vec<f64>>,
    run_order: Vec<usize>,
    contention: Vec<super::contention::Contention>,
    measured_s: f64,
    peak_rss: Option<u64>,
    vram_peak: Option<u64>,
    attn_step_ms: Vec<f64>,
    attn_gb_s: Vec<f64>,
    last: Option<PointTiming>,
}

/// Times `schemes` at one (batch, prompt length), interleaved: warm-up repeats of each, then
/// rounds in which every scheme not yet finished runs one timed repeat, in a random order per
/// round drawn from `order_seed`. A scheme stops at `repeats` timed repeats once its timed
/// total reaches `min_time_s` (at most 100 × `repeats`). Returns each scheme's timing, or why
/// it failed (`oom: …` predicted or raised, `error: …`; one scheme's failure does not stop the
/// others).
pub fn interleaved_point(
    models: PhaseModels<'_>,
    schemes: &[KvScheme],
    batch: usize,
    seq_len: usize,
    spec: &SweepSpec,
    prompts: &[u32],
    order_seed: u64,
) -> Vec<std::result::Result<PointTiming, PointStatus>> {
    use rand::seq::SliceRandom;
    let mut state: Vec<std::result::Result<Samples, PointStatus>> = schemes
        .iter()
        .map(|&s| match predicted_oom(models, s, batch, seq_len, spec) {
            Some(oom) => Err(oom),
            None => Ok(Samples::default()),
        })
        .collect();
    for _ in 0..spec.warmup {
        for (i, &scheme) in schemes.iter().enumerate() {
            if state[i].is_ok() {
                if let Err(e) = catch_point(|| {
                    run_once(models, scheme, batch, spec.gen.min(4), prompts).map(|_| ())
                }) {
                    state[i] = Err(e);
                }
            }
        }
    }
    let cap = spec.repeats.max(1) * 100;
    let finished = |s: &Samples| {
        let n = s.ttft_ms.len();
        (n >= spec.repeats.max(1) && s.measured_s >= spec.min_time_s) || n >= cap
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(order_seed);
    let mut slot = 0;
    loop {
        let mut round: Vec<usize> = (0..schemes.len())
            .filter(|&i| matches!(&state[i], Ok(s) if !finished(s)))
            .collect();
        if round.is_empty() {
            break;
        }
        round.shuffle(&mut rng);
        for i in round {
            let scheme = schemes[i];
            memory::reset_peak_rss();
            let before = super::contention::CpuSample::now();
            let run = catch_point(|| {
                let run = run_once(models, scheme, batch, spec.gen, prompts)?;
                Ok(run.into_timing())
            });
            let after = super::contention::CpuSample::now();
            let Ok(s) = state[i].as_mut() else {
                continue;
            };
            match run {
                Ok(t) => {
                    if let Some(c) = before
                        .zip(after)
                        .and_then(|(a, b)| super::contention::Contention::between(&a, &b))
                    {
                        s.contention.push(c);
                    }
                    s.measured_s += (t.ttft_ms.iter().sum::<f64>()
                        + t.itl_ms.iter().flatten().sum::<f64>())
                        * 1e-3;
                    s.ttft_ms.extend(&t.ttft_ms);
                    s.itl_ms.extend(t.itl_ms.iter().cloned());
                    s.attn_step_ms.extend(&t.attn_step_ms);
                    s.attn_gb_s.extend(&t.attn_gb_s);
                    s.run_order.push(slot);
                    s.peak_rss = s.peak_rss.max(memory::peak_rss_bytes());
                    s.vram_peak = s.vram_peak.max(t.vram_peak_bytes);
                    s.last = Some(t);
                }
                Err(e) => state[i] = Err(e),
            }
            slot += 1;
        }
    }
    state
        .into_iter()
        .map(|st| {
            let s = st?;
            let mut t = s
                .last
                .ok_or_else(|| PointStatus::Error("no timed repeat ran".into()))?;
            t.ttft_ms = s.ttft_ms;
            t.itl_ms = s.itl_ms;
            t.attn_step_ms = s.attn_step_ms;
            t.attn_gb_s = s.attn_gb_s;
            t.run_order = s.run_order;
            t.peak_rss_bytes = s.peak_rss;
            t.vram_peak_bytes = s.vram_peak;
            t.contention = super::contention::Contention::combine(&s.contention);
            Ok(t)
        })
        .collect()
}

const GIB: f64 = (1u64 << 30) as f64;

/// One timed request: the cache it filled, TTFT and each ITL (ms), the first sequence's tokens,
/// the device memory high-water (GPU only) and the decode steps' attention alone (CPU only).
struct Run {
    cache: AnyCache,
    ttft_ms: f64,
    itl_ms: Vec<f64>,
    generated: Vec<u32>,
    vram_peak_bytes: Option<u64>,
    decode_attention: Option<crate::kv::AttentionMeter>,
}

impl Run {
    /// This one run as a point's timing (one repeat; the caller joins repeats).
    fn into_timing(mut self) -> PointTiming {
        let steps = self.itl_ms.len();
        let attn = self
            .decode_attention
            .filter(|a| steps > 0 && a.seconds > 0.0);
        PointTiming {
            ttft_ms: vec![self.ttft_ms],
            itl_ms: vec![self.itl_ms],
            kv_tokens: self.cache.seen(0),
            kv_bytes: self.cache.kv_bytes(),
            kv_reserved_bytes: self.cache.reserved_bytes(),
            peak_rss_bytes: None,
            vram_peak_bytes: self.vram_peak_bytes,
            saturated_values: self.cache.saturated(),
            generated: std::mem::take(&mut self.generated),
            run_order: Vec::new(),
            contention: None,
            attn_step_ms: attn
                .map(|a| a.seconds * 1e3 / steps as f64)
                .into_iter()
                .collect(),
            attn_gb_s: attn.and_then(|a| a.gb_s()).into_iter().collect(),
        }
    }
}

/// Prefill `prompts` (`[batch, seq_len]`) with `models.prefill` into a fresh cache on the
/// model's device, then decode `gen − 1` more tokens greedily with `models.decode`, timing each
/// ([`super::device::time_ms`]: wall clock on the CPU, CUDA events on a GPU; each step ends
/// with the argmax copied to the host, as a server's sampler needs it). On a GPU the device
/// memory in use is sampled after the prefill and after every step (outside the timed spans).
fn run_once(
    models: PhaseModels<'_>,
    scheme: KvScheme,
    batch: usize,
    gen: usize,
    prompts: &[u32],
) -> Result<Run> {
    let dev = models.decode.device();
    let geom = models.decode.config.cache_geometry();
    let capacity = prompts.len() / batch.max(1) + gen;
    // Timed: int8/4-bit keys scored on their codes (quality runs use the exact path).
    let mut cache = AnyCache::new(scheme, geom, batch, capacity, dev)?.exact_attention(false);
    let mut vram = super::device::device_mem_used(dev)?;
    let (mut next, ttft_ms) = super::device::time_ms(dev, || {
        let logits = models
            .prefill
            .forward_last(prompts, batch, cache.as_attention())?;
        argmax_rows(&logits)
    })?;
    let sample = |vram: &mut Option<u64>| -> Result<()> {
        if let Some(now) = super::device::device_mem_used(dev)? {
            *vram = Some(vram.map_or(now, |v| v.max(now)));
        }
        Ok(())
    };
    sample(&mut vram)?;
    cache.take_attention_meter(); // the prefill's attention: not the decode steps'
    let mut generated = vec![next[0]];
    let mut itl_ms = Vec::with_capacity(gen.saturating_sub(1));
    for _ in 1..gen {
        let (n, ms) = super::device::time_ms(dev, || {
            let logits = models
                .decode
                .forward_last(&next, batch, cache.as_attention())?;
            argmax_rows(&logits)
        })?;
        next = n;
        itl_ms.push(ms);
        sample(&mut vram)?;
        generated.push(next[0]);
    }
    let decode_attention = cache.take_attention_meter();
    Ok(Run {
        cache,
        ttft_ms,
        itl_ms,
        generated,
        vram_peak_bytes: vram,
        decode_attention,
    })
}

/// Greedy summaries of the XSum prompts with K/V in `scheme`, scored with ROUGE (stemmed) and,
/// given the fp16 cache's summaries, against those.
fn summarize_xsum(
    model: &Model,
    scheme: KvScheme,
    task: &RougeTask,
    t: &QualityTasks<'_>,
    baseline: Option<&[String]>,
    progress: &dyn Progress,
) -> Result<RougeResult> {
    progress.start(&format!("{scheme}: XSum summaries"));
    let mut predictions = Vec::with_capacity(task.prompts.len());
    for prompt in &task.prompts {
        let ids = greedy(model, scheme, prompt, task.max_new, &t.stop)?;
        predictions.push(t.tokenizer.decode(&ids)?.trim().to_string());
        progress.advance(prompt_cost(prompt.len(), task.max_new));
    }
    Ok(RougeResult::score(task, predictions, baseline))
}

/// Passkey trials with K/V in `scheme`: up to 8 greedy tokens after each prompt.
fn passkey_trials(
    model: &Model,
    scheme: KvScheme,
    t: &QualityTasks<'_>,
    progress: &dyn Progress,
) -> Result<PasskeyResult> {
    progress.start(&format!("{scheme}: passkey retrieval"));
    let mut trials = Vec::with_capacity(t.passkey.len());
    for p in &t.passkey {
        let ids = greedy(model, scheme, &p.tokens, PASSKEY_NEW_TOKENS, &t.stop)?;
        let answer = t.tokenizer.decode(&ids)?;
        trials.push(PasskeyTrial {
            length: p.length,
            depth_pct: p.depth_pct,
            key: p.key,
            correct: first_integer(&answer) == Some(p.key as u64),
            answer,
        });
        progress.advance(prompt_cost(p.tokens.len(), PASSKEY_NEW_TOKENS));
    }
    Ok(PasskeyResult { trials })
}

#[cfg(test)]
mod cost_tests {
    use super::*;

    /// Progress weights by hand (issue #26), `STEP_TOKENS` = 16: a point of batch 4 × 512
    /// with gen 32, 1 warm-up and 3 repeats costs 4 × (4·512 + 32·(16 + 4)) = 4 × 2,688 =
    /// 10,752; a chunked 512-token window 512, 1,024 with KL's fp16 run in lockstep (not for
    /// fp16 itself), plus 512 per noise-floor rerun; in decode mode with 4 windows batched
    /// 512 + 512·16/4 = 2,560; a quality unit of 4 windows = 4 × the window.
    #[test]
    fn costs_by_hand() {
        let int4: KvScheme = "int4".parse().unwrap();
        let h2o: KvScheme = "h2o:ratio=0.5".parse().unwrap();
        let mut spec =
            SweepSpec::timing_only(vec![KvScheme::FP16, int4], vec![4], vec![512], 32, 0);
        spec.warmup = 1;
        spec.repeats = 3;
        assert_eq!(spec.point_cost(4, 512), 10_752);
        assert_eq!(spec.window_cost(&int4), 0, "no perplexity");
        spec.ppl = Some(PplProtocol {
            mode: PplMode::Auto,
            batch: 4,
            ctx: 512,
            windows: Some(4),
            scoring: crate::quality::perplexity::Scoring::Half,
            bos: false,
            exact_attention: true,
        });
        assert_eq!(spec.window_cost(&int4), 512);
        spec.kl = true;
        assert_eq!(spec.window_cost(&int4), 1024);
        assert_eq!(spec.window_cost(&KvScheme::FP16), 512);
        spec.ppl_noise_floor = 2;
        assert_eq!(spec.window_cost(&int4), 1024 + 2 * 512);
        assert_eq!(spec.window_pass_cost(&int4), 1024);
        spec.ppl_noise_floor = 0;
        assert_eq!(
            spec.window_cost(&h2o),
            2 * 2_560,
            "eviction: decode mode, KL"
        );
        let unit = Unit::Quality { scheme: int4 };
        assert_eq!(spec.unit_cost(&unit, None), 4 * 1024);
    }
}

#[cfg(test)]
mod oom_tests {
    use super::*;

    /// The messages cudarc gives for a failed device allocation become `oom`; other device
    /// errors stay `error`. (The texts are cudarc's `DriverError` Debug form and cuBLAS's
    /// status name.)
    #[test]
    fn device_out_of_memory_is_recorded_as_oom() {
        let err = |m: &str| -> Result<PointTiming> {
            Err(crate::Error::Candle(candle_core::Error::Msg(m.into())))
        };
        let oom = catch_point(|| err("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"));
        assert!(oom.as_ref().unwrap_err().is_oom(), "{oom:?}");
        let blas = catch_point(|| err("cublas error CUBLAS_STATUS_ALLOC_FAILED"));
        assert!(blas.unwrap_err().is_oom());
        let other = catch_point(|| {
            err("DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access\")")
        });
        assert!(matches!(other, Err(PointStatus::Error(_))), "{other:?}");
        let typed = catch_point(|| -> Result<()> {
            Err(crate::Error::cuda(
                "cuMemAlloc",
                "DriverError(CUDA_ERROR_OUT_OF_MEMORY)",
            ))
        });
        assert!(typed.unwrap_err().is_oom());
    }

    /// The status strings of `raw.jsonl`/`results.csv` round-trip through the type, and the
    /// strings older files hold read as the statuses they meant.
    #[test]
    fn point_status_text_round_trips() {
        for (text, status) in [
            ("ok", PointStatus::Ok),
            (
                "oom: needs ~9.00 GiB",
                PointStatus::Oom("needs ~9.00 GiB".into()),
            ),
            (
                "error: panicked: x",
                PointStatus::Error("panicked: x".into()),
            ),
        ] {
            assert_eq!(text.parse::<PointStatus>().unwrap(), status);
            assert_eq!(status.to_string(), text);
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{text}\""));
        }
    }
}
