//! The timings `kvbench calibrate` fits a device profile to ([`crate::perf::fit`]), taken on
//! the path `kvbench serve` measures — the model backend's own prefill (`admit`) and decode
//! steps (`step`) — so the profile describes what a serving run on this machine experiences:
//! prefills of several lengths, decode steps of several batch sizes at a short context, and a
//! decode step per scheme at a long context. Each timing is the median of `repeats`, after one
//! untimed run.

use std::time::Instant;

use crate::error::Result;
use crate::kv::KvScheme;
use crate::measure::bandwidth;
use crate::measure::sweep::Progress;
use crate::model::Model;
use crate::perf::fit::Samples;

use super::backend::ModelBackend;
use super::engine::Backend;

/// What to time.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibrationSpec {
    /// Prompt lengths of the prefills, tokens.
    pub prefill_lens: Vec<usize>,
    /// Batch sizes of the short-context decode steps.
    pub batches: Vec<usize>,
    /// Context of the short-context decode steps, tokens.
    pub short_ctx: usize,
    /// Schemes timed at the long context.
    pub schemes: Vec<KvScheme>,
    /// Batch size of the long-context steps.
    pub scheme_batch: usize,
    /// Context of the long-context steps, tokens.
    pub long_ctx: usize,
    /// Timed runs per timing (the median is kept).
    pub repeats: usize,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Times everything `spec` asks for with `prefill` and `decode` (the model in each phase's
/// weights), prompts cut from `text`, and probes the machine's read bandwidth and GEMM rate.
/// Errors: the model's and the cache's; a text shorter than a prompt.
pub fn measure(
    prefill: &Model,
    decode: &Model,
    text: &[u32],
    spec: &CalibrationSpec,
    progress: &dyn Progress,
) -> Result<Samples> {
    let repeats = spec.repeats.max(1);
    let prompt = |i: usize, len: usize| -> Result<&[u32]> {
        let at = (i * 997) % text.len().saturating_sub(len).max(1);
        text.get(at..at + len)
            .ok_or_else(|| crate::Error::InvalidArgument {
                name: "kvbench calibrate".into(),
                reason: format!(
                    "the text holds {} tokens, fewer than a {len}-token prompt",
                    text.len()
                ),
            })
    };
    progress.start("probes: read bandwidth, GEMM");
    let bw = bandwidth::probe().map_or(0.0, |r| r.best_gb_s);
    let tflops = bandwidth::measure_gemm(1024, 5)?;
    let mut samples = Samples {
        probe_bw_gb_s: bw,
        probe_tflops: tflops,
        ..Default::default()
    };
    for &t in &spec.prefill_lens {
        progress.start(&format!("prefill {t} tokens"));
        let mut times = Vec::new();
        for r in 0..=repeats {
            let mut b = ModelBackend::new(prefill, decode, KvScheme::FP16);
            let p = prompt(r, t)?;
            let t0 = Instant::now();
            b.admit(p, false)?;
            if r > 0 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        samples.prefill.push((t, median(times)));
        progress.advance(1);
    }
    for &batch in &spec.batches {
        progress.start(&format!("decode steps, batch {batch}"));
        let s = steps(
            prefill,
            decode,
            KvScheme::FP16,
            batch,
            spec.short_ctx,
            repeats,
            &prompt,
        )?;
        samples
            .decode
            .push((batch, spec.short_ctx + repeats / 2 + 1, s));
        progress.advance(1);
    }
    for &scheme in &spec.schemes {
        progress.start(&format!("decode steps, {scheme}, {} tokens", spec.long_ctx));
        let (b, c) = (spec.scheme_batch, spec.long_ctx);
        let s = steps(prefill, decode, scheme, b, c, repeats, &prompt)?;
        samples
            .scheme_steps
            .push((scheme, b, c + repeats / 2 + 1, s));
        progress.advance(1);
    }
    Ok(samples)
}

/// The median of `repeats` decode steps (after one untimed) of `batch` sequences of `ctx`
/// prompt tokens each, K/V in `scheme`.
fn steps<'t>(
    prefill: &Model,
    decode: &Model,
    scheme: KvScheme,
    batch: usize,
    ctx: usize,
    repeats: usize,
    prompt: &dyn Fn(usize, usize) -> Result<&'t [u32]>,
) -> Result<f64> {
    let mut b = ModelBackend::new(prefill, decode, scheme);
    let mut last = Vec::with_capacity(batch);
    for i in 0..batch {
        last.push(b.admit(prompt(i, ctx)?, false)?);
    }
    let mut times = Vec::new();
    for r in 0..=repeats {
        let t0 = Instant::now();
        last = b.step(&last)?;
        if r > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}
