//! The sweep: for every KV scheme × batch size × sequence length, prefill real tokens, decode
//! greedily, and time it; per scheme, perplexity through the cache. Each finished point goes to a
//! [`PointSink`] at once, so an interrupted sweep keeps what finished.
//!
//! Definitions (as vLLM's `benchmark_serving` defines them for one request):
//! - TTFT: wall time from the start of prefill to the first generated token (prefill forward +
//!   greedy pick), ms.
//! - TPOT: time per output token after the first: each later decode step's wall time, ms; with a
//!   batch every step yields one token per sequence.
//! - decode tokens/s: `batch × (gen − 1)` / Σ decode-step time — throughput over the batch.
//! - prefill tokens/s: `batch × seq_len` / TTFT.

use std::time::Instant;

use rand::{Rng, SeedableRng};

use super::memory;
use super::stats::{summarize, Summary};
use crate::error::{Error, Result};
use crate::kv::{KvCache, KvScheme};
use crate::model::{argmax_rows, Model};
use crate::quality::perplexity::{perplexity_vs, PplProtocol, PplResult};

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
    /// Untimed runs of the first point before measuring (page-in, thread start-up).
    pub warmup: usize,
    /// Compare every scheme's next-token distributions with the fp16 cache's in lockstep
    /// (KL divergence, top-1 agreement); doubles perplexity time for non-baseline schemes.
    pub kl: bool,
}

impl SweepSpec {
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
        if self.gen < 2 {
            return bad(
                "--gen",
                format!("{} leaves no decode step to time; use ≥ 2", self.gen),
            );
        }
        for &l in &self.seq_lens {
            if l + self.gen > model_ctx {
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

/// Timings of one sweep point.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PointTiming {
    /// Time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Decode-step times after the first token, ms.
    pub tpot_ms: Summary,
    /// Prompt tokens processed per second over the batch.
    pub prefill_tokens_per_s: Option<f64>,
    /// Generated tokens per second over the batch (decode steps only).
    pub decode_tokens_per_s: f64,
    /// Tokens held per sequence at the end.
    pub kv_tokens: usize,
    /// Bytes of K/V held at the end (codes, scales, zero-points), all sequences.
    pub kv_bytes: usize,
    /// Bytes the cache had allocated at the end (capacity).
    pub kv_reserved_bytes: usize,
    /// Peak RSS of the process during this point alone, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Values saturated by fixed fp8 scales during this point.
    pub saturated_values: u64,
    /// Greedy tokens of the first sequence (for agreement checks).
    pub generated: Vec<u32>,
}

/// One finished point, as it reaches the sink.
#[derive(Debug, Clone)]
pub struct PointOutcome {
    /// The scheme.
    pub scheme: KvScheme,
    /// Batch size.
    pub batch: usize,
    /// Prompt length.
    pub seq_len: usize,
    /// Timings, or why the point failed (`oom: ...`, `error: ...`).
    pub timing: std::result::Result<PointTiming, String>,
    /// The scheme's perplexity result, if measured.
    pub ppl: Option<PplResult>,
    /// The fp16 baseline's perplexity, if measured.
    pub baseline_ppl: Option<f64>,
}

/// Receives results as they finish.
pub trait PointSink {
    /// Called once per finished point (successful or not).
    fn point(&mut self, outcome: &PointOutcome) -> Result<()>;
}

/// Progress reporting hooks; all default to no-ops.
pub trait Progress {
    /// A unit of work started (`what` describes it).
    fn start(&self, _what: &str) {}
    /// `n` units of work finished.
    fn advance(&self, _n: u64) {}
}

impl Progress for () {}

/// Units of work a sweep reports to [`Progress`]: perplexity windows plus timing points.
pub fn work_units(spec: &SweepSpec, ppl_windows: usize) -> u64 {
    let points = spec.batch_sizes.len() * spec.seq_lens.len();
    (spec.schemes.len() * (points + ppl_windows)) as u64
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
pub fn run_sweep(
    models: PhaseModels<'_>,
    tokens: &[u32],
    bos: Option<u32>,
    spec: &SweepSpec,
    sink: &mut dyn PointSink,
    progress: &dyn Progress,
) -> Result<()> {
    let cfg = &models.decode.config;
    spec.validate(cfg.max_ctx, tokens.len())?;
    for s in &spec.schemes {
        s.validate(cfg.head_dim)?;
    }
    if spec.warmup > 0 {
        progress.start("warm-up");
        let (b, l) = (spec.batch_sizes[0], spec.seq_lens[0]);
        let prompts = prompts(tokens, b, l, spec.seed);
        for _ in 0..spec.warmup {
            time_point(models, spec.schemes[0], b, l, spec.gen.min(4), &prompts)?;
        }
    }
    let mut baseline_ppl = None;
    for &scheme in &spec.schemes {
        let ppl = match &spec.ppl {
            Some(proto) => {
                progress.start(&format!("{scheme}: perplexity"));
                let baseline = spec.kl.then_some(KvScheme::FP16);
                let r = perplexity_vs(
                    models.quality,
                    tokens,
                    scheme,
                    baseline,
                    proto,
                    bos,
                    |_, _| progress.advance(1),
                )?;
                if scheme.is_baseline() {
                    baseline_ppl = Some(r.perplexity);
                }
                Some(r)
            }
            None => None,
        };
        for &batch in &spec.batch_sizes {
            for &seq_len in &spec.seq_lens {
                progress.start(&format!("{scheme}: batch {batch} × {seq_len} tokens"));
                let prompts = prompts(tokens, batch, seq_len, spec.seed);
                let timing = guarded_point(models, scheme, batch, seq_len, spec.gen, &prompts);
                sink.point(&PointOutcome {
                    scheme,
                    batch,
                    seq_len,
                    timing,
                    ppl: ppl.clone(),
                    baseline_ppl,
                })?;
                progress.advance(1);
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

/// Runs `f`, turning an error or a panic into an `error: …` status so a sweep goes on.
pub fn catch_point(
    f: impl FnOnce() -> Result<PointTiming>,
) -> std::result::Result<PointTiming, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!("error: {e}")),
        Err(p) => Err(format!(
            "error: panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("unknown")
        )),
    }
}

/// A point that cannot take the process down: predicted memory beyond what is available is
/// recorded as `oom` without running, and an error or panic inside is recorded as `error`.
fn guarded_point(
    models: PhaseModels<'_>,
    scheme: KvScheme,
    batch: usize,
    seq_len: usize,
    gen: usize,
    prompts: &[u32],
) -> std::result::Result<PointTiming, String> {
    let c = &models.decode.config;
    let g = c.cache_geometry();
    let kv = (scheme.bytes_per_token(&g) * batch * (seq_len + gen)) as u64;
    // Prefill activations: logits-free hidden states, q/k/v, and attention scores per task.
    let act = (batch * seq_len * (4 * c.hidden + 3 * c.intermediate + c.vocab / seq_len.max(1)) * 4)
        as u64;
    if let Some(avail) = memory::available_bytes() {
        if kv + act > avail {
            return Err(format!(
                "oom: needs ~{:.2} GiB (KV {:.2} GiB), {:.2} GiB available",
                (kv + act) as f64 / GIB,
                kv as f64 / GIB,
                avail as f64 / GIB
            ));
        }
    }
    catch_point(|| time_point(models, scheme, batch, seq_len, gen, prompts))
}

const GIB: f64 = (1u64 << 30) as f64;

/// Prefill `prompts` (`[batch, seq_len]`) with `models.prefill`, then decode `gen − 1` more
/// tokens greedily with `models.decode`, timing each.
pub fn time_point(
    models: PhaseModels<'_>,
    scheme: KvScheme,
    batch: usize,
    seq_len: usize,
    gen: usize,
    prompts: &[u32],
) -> Result<PointTiming> {
    let mut cache = KvCache::new(scheme, models.decode.config.cache_geometry(), batch)?;
    memory::reset_peak_rss();
    let t0 = Instant::now();
    let logits = models.prefill.forward_last(prompts, batch, &mut cache)?;
    let mut next = argmax_rows(&logits)?;
    let ttft = t0.elapsed().as_secs_f64();
    let mut generated = vec![next[0]];
    let mut steps = Vec::with_capacity(gen - 1);
    for _ in 1..gen {
        let t = Instant::now();
        let logits = models.decode.forward_last(&next, batch, &mut cache)?;
        next = argmax_rows(&logits)?;
        steps.push(t.elapsed().as_secs_f64());
        generated.push(next[0]);
    }
    let decode_s: f64 = steps.iter().sum();
    let steps_ms: Vec<f64> = steps.iter().map(|s| s * 1e3).collect();
    Ok(PointTiming {
        ttft_ms: Some(ttft * 1e3),
        tpot_ms: summarize(&steps_ms).expect("gen ≥ 2 gives at least one step"),
        prefill_tokens_per_s: Some((batch * seq_len) as f64 / ttft),
        decode_tokens_per_s: (batch * (gen - 1)) as f64 / decode_s,
        kv_tokens: cache.seen(0),
        kv_bytes: cache.kv_bytes(),
        kv_reserved_bytes: cache.reserved_bytes(),
        peak_rss_bytes: memory::peak_rss_bytes(),
        saturated_values: cache.saturated(),
        generated,
    })
}
