//! The timings `kvbench calibrate` fits a device profile to ([`crate::perf::fit`]), taken on
//! the path `kvbench serve` measures — the model backend's own prefill (`admit`) and decode
//! steps (`step`) — so the profile describes what a serving run on this machine experiences:
//! prefills of several lengths, decode steps of several batch sizes at a short context, a
//! decode step per scheme at a short and a long context, and last a serving trace: the real
//! scheduler serving the calibration's own requests in closed loops ([`TraceSpec`]). Each
//! isolated timing is the median of its repeats, after one untimed run. Each prefill follows
//! decode steps of a running batch, and that batch's next step is timed too, as in serving,
//! where the two phases' weights take turns in the cache.
//!
//! The prefill lengths, the short-context batch sizes and the schemes' steps are timed
//! **interleaved**: each round runs every length (every batch size, every scheme) once,
//! and the median over rounds is kept. Contention
//! on a shared machine (another process compiling for a few seconds) then falls on every size
//! of a round alike instead of on all repeats of one size, which would bend the fitted curve
//! there (the calibration's batch-2 step that came out 13.8 ms, README's validation).
//!
//! The speed probe ([`speed_probe`]) runs before each phase and after the last: the profile
//! keeps its mean, the spread says how far the machine drifted meanwhile, and `kvbench serve`
//! takes the same probe before every measured point, so a simulation can be compared with a
//! measured run at the speed the machine had when each point ran.

use std::time::Instant;

use crate::error::Result;
use crate::kv::KvScheme;
use crate::measure::bandwidth;
use crate::measure::sweep::Progress;
use crate::model::Model;
use crate::perf::fit::Samples;
use crate::perf::SpeedProbe;

use super::backend::ModelBackend;
use super::engine::{self, Backend, SchedConfig};
use super::pool::BlockSizer;
use super::workload::{self, Arrival, LenDist};

/// What to time.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibrationSpec {
    /// Prompt lengths of the prefills, tokens.
    pub prefill_lens: Vec<usize>,
    /// Batch sizes of the short-context decode steps.
    pub batches: Vec<usize>,
    /// Context of the short-context decode steps, tokens.
    pub short_ctx: usize,
    /// Schemes timed at the short and the long context.
    pub schemes: Vec<KvScheme>,
    /// Batch size of the schemes' steps.
    pub scheme_batch: usize,
    /// Context of the schemes' long-context steps, tokens.
    pub long_ctx: usize,
    /// Timed prefills per length (the median is kept; of the steps before and after them, the
    /// mean).
    pub repeats: usize,
    /// Timed decode steps per batch size and per scheme (the median is kept).
    pub step_repeats: usize,
    /// The serving trace run last (None: none).
    pub trace: Option<TraceSpec>,
}

/// A serving trace: the real scheduler ([`super::engine::serve`]) over the model backend,
/// fp16 K/V, no KV budget to preempt for, closed loops of each client count in turn, each
/// serving its own `requests` requests (lengths drawn from `input_len` and `output_len`, seeded
/// by `seed` and the client count). Its decode steps are what a serving run's steps really
/// cost at the batches and contexts serving produces; the fit ([`crate::perf::fit::fit`],
/// step 7) corrects the profile's decode steps by a line in the batch fitted to those that
/// followed no prefill, and its extra after a prefill to those that did; step 8 scales the
/// profile's prefills by the trace's prefills of one request each. The backend of each
/// phase is warmed by one untimed request first, as a measured serving point's is.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpec {
    /// Client counts, one closed-loop phase each (the most sequences running at once).
    pub clients: Vec<usize>,
    /// Requests per phase.
    pub requests: usize,
    /// Prompt lengths, tokens.
    pub input_len: LenDist,
    /// Output lengths, tokens.
    pub output_len: LenDist,
    /// Seed of the lengths and prompt offsets (phase `c` uses `seed + c`).
    pub seed: u64,
}

impl CalibrationSpec {
    /// Units of progress [`measure`] reports: one per prefill round, one for the decode steps,
    /// one per scheme, one per phase of the serving trace.
    pub fn units(&self) -> u64 {
        let phases = self.trace.as_ref().map_or(0, |t| t.clients.len());
        (self.repeats.max(1) + 1 + 1 + self.schemes.len() + phases) as u64
    }
}

/// Sequences of the running batch whose decode steps come before and after each timed prefill.
pub const RUNNING: usize = 4;

/// The median of the timings ([`crate::stats::percentile`], type 7: for an odd count, the
/// default 11 and 33, the middle one).
fn median(mut xs: Vec<f64>) -> f64 {
    crate::stats::percentile(&mut xs, 50.0)
}

/// The mean of the timings.
fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
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
    progress.start("probes: speed, read bandwidth, GEMM");
    // The first probe of a process ran slow (358 ms per prefill against 296–314 for the four
    // after it, AMD EPYC, 2026-12-06; likewise the first measured serving point's): one
    // untimed probe first.
    speed_probe(prefill, decode)?;
    let first = ("prefills".to_string(), speed_probe(prefill, decode)?);
    let bw = bandwidth::probe().map_or(0.0, |r| r.best_gb_s);
    let tflops = bandwidth::measure_gemm(1024, 5)?;
    let mut samples = Samples {
        probe_bw_gb_s: bw,
        probe_tflops: tflops,
        probes: vec![first],
        ..Default::default()
    };
    // Prefills, interleaved: round r prefills every length once (round 0 untimed), each after
    // two untimed decode steps of a running batch of 4 and one timed one, as a serving prefill
    // follows decode steps: the decode weights then hold the cache the prefill's weights need
    // (timed back to back, serving's prefills of 32–64 tokens ran 4–24 % slower than
    // calibrated). The running batch's next step, right after the prefill, is timed too: what
    // it takes beyond the step before the prefill is the extra a step pays after a prompt of
    // that length (on this CPU 2–4 ms after prompts of 16–32 tokens, 10–13 ms after 48 and
    // more).
    let mut running = ModelBackend::new(prefill, decode, KvScheme::FP16);
    let mut last = Vec::with_capacity(RUNNING);
    let n = spec.prefill_lens.len();
    // Room for every step it takes (4 per length and round), as serving reserves a request's.
    let lifetime = spec.short_ctx + 4 * n * (repeats + 1) + 1;
    for i in 0..RUNNING {
        last.push(running.admit(prompt(i, spec.short_ctx)?, false, lifetime)?);
    }
    let (mut prefill_times, mut before, mut after) = (
        vec![Vec::with_capacity(repeats); n],
        vec![Vec::with_capacity(repeats); n],
        vec![Vec::with_capacity(repeats); n],
    );
    let mut timed_step = |last: &mut Vec<u32>| -> Result<f64> {
        let t0 = Instant::now();
        *last = running.step(last)?;
        Ok(t0.elapsed().as_secs_f64())
    };
    for r in 0..=repeats {
        progress.start(&format!("prefill round {r} of {repeats}"));
        for (i, &t) in spec.prefill_lens.iter().enumerate() {
            let mut b = ModelBackend::new(prefill, decode, KvScheme::FP16);
            let p = prompt(r, t)?;
            timed_step(&mut last)?;
            timed_step(&mut last)?;
            let s0 = timed_step(&mut last)?;
            let t0 = Instant::now();
            // Prefilled and dropped: no steps to reserve for.
            b.admit(p, false, 0)?;
            let tp = t0.elapsed().as_secs_f64();
            let s1 = timed_step(&mut last)?;
            if r > 0 {
                prefill_times[i].push(tp);
                before[i].push(s0);
                after[i].push(s1);
            }
        }
        progress.advance(1);
    }
    for (i, &t) in spec.prefill_lens.iter().enumerate() {
        samples.prefill.push((t, median(prefill_times[i].clone())));
        // Means, not medians: the extra falls on some of these steps and not on others, and
        // the model charges its expectation.
        samples
            .after_prefill
            .push((RUNNING, t, mean(&before[i]), mean(&after[i])));
    }
    // Decode steps at the short context, interleaved: every batch size's sequences admitted,
    // then round r steps each batch once (round 0 untimed), so every batch's context grows
    // alike.
    progress.start("decode steps, interleaved batch sizes");
    samples
        .probes
        .push(("decode steps".into(), speed_probe(prefill, decode)?));
    let step_repeats = spec.step_repeats.max(1);
    let runs: Vec<_> = spec
        .batches
        .iter()
        .map(|&b| (KvScheme::FP16, b, spec.short_ctx))
        .collect();
    let times = interleaved_steps(prefill, decode, &runs, step_repeats, &prompt)?;
    for (&(_, batch, _), s) in runs.iter().zip(times) {
        samples
            .decode
            .push((batch, spec.short_ctx + median_context(step_repeats), s));
    }
    progress.advance(1);
    // Each scheme's step at the short and the long context, interleaved the same way: two
    // calibrations 20 minutes apart, timing the schemes one after another, gave int8-token
    // 19.8 and 31.0 ms (README, "Validated here"); in rounds a burst of contention falls on
    // every scheme alike. The K/V cost per cached token is the difference of the two, timed in
    // the same rounds: against the short-context step of the batch-size rounds instead, fp16
    // came out at 3.35 µs per token where serving's steps paid 5.0 (Intel Xeon, 2026-12-03).
    progress.start(&format!(
        "decode steps, {} schemes interleaved, {} and {} tokens",
        spec.schemes.len(),
        spec.short_ctx,
        spec.long_ctx
    ));
    samples
        .probes
        .push(("scheme steps".into(), speed_probe(prefill, decode)?));
    let b = spec.scheme_batch;
    let runs: Vec<_> = spec
        .schemes
        .iter()
        .flat_map(|&k| [(k, b, spec.short_ctx), (k, b, spec.long_ctx)])
        .collect();
    let times = interleaved_steps(prefill, decode, &runs, step_repeats, &prompt)?;
    for (&(scheme, b, c), s) in runs.iter().zip(times) {
        samples
            .scheme_steps
            .push((scheme, b, c + median_context(step_repeats), s));
    }
    progress.advance(spec.schemes.len() as u64);
    if let Some(trace) = &spec.trace {
        progress.start("speed probe");
        samples
            .probes
            .push(("serving trace".into(), speed_probe(prefill, decode)?));
        (samples.trace, samples.trace_prefill) =
            serving_trace(prefill, decode, text, trace, progress)?;
    }
    progress.start("speed probe, last");
    samples
        .probes
        .push(("end".into(), speed_probe(prefill, decode)?));
    Ok(samples)
}

/// Times the speed probe ([`SpeedProbe`]) with `prefill` and `decode` (the model in each
/// phase's weights): a running batch of [`SpeedProbe::BATCH`] fp16 sequences of
/// [`SpeedProbe::RUNNING_PROMPT`]-token prompts, then [`SpeedProbe::ROUNDS`] + 1 rounds, the first untimed, of
/// [`SpeedProbe::STEPS`] decode steps of that batch followed by the prefill of a
/// [`SpeedProbe::PROMPT`]-token prompt on a fresh backend; the medians, ms. The token ids are
/// fixed (a step's time depends on the lengths alone), so every probe of a model runs the same
/// work. About 2.5 s on 2 cores with SmolLM2-135M. Errors: the model's and the cache's (in
/// `kvbench serve` the point then fails, as it would in its own warm-up).
pub fn speed_probe(prefill: &Model, decode: &Model) -> Result<SpeedProbe> {
    let vocab = decode.config.vocab.max(2);
    let tokens = |n: usize, salt: usize| -> Vec<u32> {
        (0..n)
            .map(|i| (1 + (i * 7919 + salt * 104_729) % (vocab - 1)) as u32)
            .collect()
    };
    let mut running = ModelBackend::new(prefill, decode, KvScheme::FP16);
    let mut last = Vec::with_capacity(SpeedProbe::BATCH);
    for i in 0..SpeedProbe::BATCH {
        let lifetime =
            SpeedProbe::RUNNING_PROMPT + (SpeedProbe::ROUNDS + 1) * SpeedProbe::STEPS + 1;
        last.push(running.admit(&tokens(SpeedProbe::RUNNING_PROMPT, i), false, lifetime)?);
    }
    let (mut prefills, mut steps) = (Vec::new(), Vec::new());
    for r in 0..=SpeedProbe::ROUNDS {
        for _ in 0..SpeedProbe::STEPS {
            let t0 = Instant::now();
            last = running.step(&last)?;
            if r > 0 {
                steps.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        let mut b = ModelBackend::new(prefill, decode, KvScheme::FP16);
        let p = tokens(SpeedProbe::PROMPT, SpeedProbe::BATCH + r);
        let t0 = Instant::now();
        b.admit(&p, false, 0)?;
        let fill = t0.elapsed().as_secs_f64();
        if r > 0 {
            prefills.push(fill * 1e3);
        }
    }
    Ok(SpeedProbe {
        prefill_ms: median(prefills),
        step_ms: median(steps),
    })
}

/// Runs `spec`'s serving trace (see [`TraceSpec`]) and returns its decode steps, `(running
/// sequences, Σ context tokens before the step, longest prompt prefilled since the step
/// before (0: none), s)`, and its prefills that admitted one request alone, `(prompt tokens,
/// s)`. Errors: the scheduler's, the model's and the cache's; a text shorter than the longest
/// prompt ([`workload::requests`]).
#[allow(clippy::type_complexity)]
fn serving_trace(
    prefill: &Model,
    decode: &Model,
    text: &[u32],
    spec: &TraceSpec,
    progress: &dyn Progress,
) -> Result<(Vec<(usize, usize, usize, f64)>, Vec<(usize, f64)>)> {
    let sizer = BlockSizer {
        scheme: KvScheme::FP16,
        geom: decode.config.cache_geometry(),
        block_tokens: 16,
    };
    let longest = spec.input_len.max() + spec.output_len.max();
    let (mut steps, mut prefills) = (Vec::new(), Vec::new());
    for &clients in &spec.clients {
        progress.start(&format!(
            "serving trace: {} requests, {clients} clients",
            spec.requests
        ));
        let seed = spec.seed + clients as u64;
        let reqs = workload::requests(
            spec.requests,
            &spec.input_len,
            &spec.output_len,
            text,
            0,
            (&[], &[]),
            seed,
        )?;
        let cfg = SchedConfig {
            sizer,
            // Room for every client's longest request: nothing is ever preempted.
            kv_budget: (clients * sizer.peak_blocks(longest)) as u64 * sizer.block_bytes(),
            max_num_seqs: clients,
            prefix_tokens: 0,
            prefix_caching: false,
        };
        // Warmed by one untimed request, as each measured serving point's backend is
        // (`kvbench serve`): the first request's prompt and up to 4 decode steps.
        let mut backend = ModelBackend::new(prefill, decode, KvScheme::FP16);
        if let Some(r) = reqs.first() {
            backend = backend.warmed_up(&r.prompt, 4.min(r.output_len.saturating_sub(1)))?;
        }
        let out = engine::serve(
            &mut backend,
            &cfg,
            &reqs,
            Arrival::Closed { clients },
            &[],
            seed,
            &mut |_| Ok(()),
        )?;
        steps.extend(
            out.steps
                .iter()
                .filter(|s| s.step_s.is_finite() && s.running > 0)
                .map(|s| {
                    let p = s.prefill_longest as usize;
                    (s.running, s.context_tokens as usize, p, s.step_s)
                }),
        );
        // One prompt prefilled since the step before (its tokens are the longest's): a prefill
        // of one request, nothing cached (no prefix, nothing preempted here).
        prefills.extend(
            out.steps
                .iter()
                .filter(|s| {
                    s.prefill_tokens > 0
                        && s.prefill_tokens == s.prefill_longest
                        && s.prefill_s.is_finite()
                        && s.prefill_s > 0.0
                })
                .map(|s| (s.prefill_tokens as usize, s.prefill_s)),
        );
        progress.advance(1);
    }
    Ok((steps, prefills))
}

/// Tokens each sequence holds beyond its prompt at the median timed step of
/// [`interleaved_steps`] with `repeats` timed rounds: before the timed step of round `r` come
/// `2r + 1` steps (two a round from round 0 on, and its round's untimed one), and the median
/// round is `(repeats + 1) / 2`, so `repeats + 2` (for an even count, the mean of the two
/// middle rounds' contexts).
fn median_context(repeats: usize) -> usize {
    repeats + 2
}

/// Per run `(scheme, batch, ctx)`: the median of `repeats` decode steps (after one untimed
/// round) of `batch` sequences of `ctx` prompt tokens each, K/V in `scheme`. Every run's
/// sequences are admitted first; then each round steps every run twice, in order — an untimed
/// step, then the timed one — so machine drift and contention fall on all runs of a round
/// alike, and each timed step follows a step of its own batch, as serving's steps do. Timed
/// right after another run's step (batch 48's, say), a batch-1 step took 10.4 ms against
/// 6.8 ms in serving's own single-sequence steps, and batches 2–4 25–35 % more (README,
/// "From this machine to a GPU fleet"). Seconds, in the order of `runs`.
/// Errors: the model's and the cache's; `prompt`'s.
fn interleaved_steps<'t>(
    prefill: &Model,
    decode: &Model,
    runs: &[(KvScheme, usize, usize)],
    repeats: usize,
    prompt: &dyn Fn(usize, usize) -> Result<&'t [u32]>,
) -> Result<Vec<f64>> {
    let mut live = Vec::with_capacity(runs.len());
    for &(scheme, batch, ctx) in runs {
        let mut b = ModelBackend::new(prefill, decode, scheme);
        let mut last = Vec::with_capacity(batch);
        for i in 0..batch {
            // Two steps a round, as serving reserves a request's whole life.
            last.push(b.admit(prompt(i, ctx)?, false, ctx + 2 * (repeats + 1) + 1)?);
        }
        live.push((b, last, Vec::with_capacity(repeats)));
    }
    for r in 0..=repeats {
        for (b, last, times) in live.iter_mut() {
            *last = b.step(last)?;
            let t0 = Instant::now();
            *last = b.step(last)?;
            if r > 0 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
    }
    Ok(live.into_iter().map(|(_, _, t)| median(t)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `median_context` against a count of the steps `interleaved_steps` takes: round 0 two
    /// untimed steps, each later round an untimed step then the timed one; the median of the
    /// timed steps' prior counts (the middle one, or the mean of the two middle ones).
    #[test]
    fn median_context_counts_the_steps() {
        for repeats in [1usize, 2, 3, 4, 11, 33] {
            let mut steps = 0;
            let mut before = Vec::new();
            for r in 0..=repeats {
                steps += 1; // untimed
                if r > 0 {
                    before.push(steps);
                }
                steps += 1; // timed (untimed in round 0)
            }
            let m = before.len();
            let median2 = before[(m - 1) / 2] + before[m / 2];
            assert_eq!(2 * median_context(repeats), median2, "repeats {repeats}");
        }
    }
}
