//! Perplexity through the KV cache, with llama.cpp's `llama-perplexity` protocol by default so
//! numbers compare directly with it:
//!
//! - the whole text is tokenized once;
//! - it is cut into non-overlapping windows of `ctx` tokens from the start (only full windows);
//! - each window starts from an empty cache; if the model asks for a BOS, the window's first token
//!   is replaced by BOS (as llama.cpp does);
//! - the window goes through the model as one prefill chunk: every layer's K/V is quantized into
//!   the scheme's cache and attention reads it back from there, so quantization error reaches
//!   every scored token;
//! - `half` scoring (llama.cpp's default): logits at positions `ctx/2 .. ctx−2` predict tokens
//!   `ctx/2+1 .. ctx−1` (255 targets for ctx 512); `all` scores every token after the first.
//!
//! Perplexity = exp(mean NLL over all scored tokens), NLL in nats, log-softmax in f64.
//!
//! Two modes. `chunked` (above) runs each window as one prefill. `decode` feeds each window
//! token by token through the cache, so per-step eviction decisions (H2O, sliding windows) act
//! on every scored token as they would while generating — the reason vLLM's P3L and
//! StreamingLLM's evaluation decode too. Windows are decoded together as a batch so it stays
//! fast. For per-token quantizers without eviction the two modes store identical rows and agree.

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::kv::{AnyCache, KvScheme};
use crate::model::Model;
use crate::quality::paired::{self, NoiseFloor};

/// Which targets of a window are scored.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// The second half of each window (llama.cpp's `llama-perplexity`).
    Half,
    /// Every token after the first.
    All,
}

/// How windows go through the cache.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum PplMode {
    /// `decode` for eviction schemes, `chunked` otherwise.
    Auto,
    /// One prefill forward per window (llama.cpp's `llama-perplexity`).
    Chunked,
    /// Token by token through the cache, windows batched.
    Decode,
}

impl PplMode {
    /// The mode used for `scheme` (resolving `Auto`).
    pub fn resolve(self, scheme: &KvScheme) -> PplMode {
        match self {
            PplMode::Auto if scheme.evicts() => PplMode::Decode,
            PplMode::Auto => PplMode::Chunked,
            m => m,
        }
    }
}

impl std::fmt::Display for PplMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PplMode::Auto => "auto",
            PplMode::Chunked => "chunked",
            PplMode::Decode => "decode",
        })
    }
}

/// How perplexity is computed; recorded in `meta.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PplProtocol {
    /// Chunked or decode (or auto: decode for eviction schemes).
    pub mode: PplMode,
    /// Windows decoded together in decode mode.
    pub batch: usize,
    /// Window length in tokens.
    pub ctx: usize,
    /// Windows used (from the start of the text); `None` = all full windows.
    pub windows: Option<usize>,
    /// Which targets are scored.
    pub scoring: Scoring,
    /// Whether each window's first token is replaced by BOS.
    pub bos: bool,
    /// Score int8/4-bit keys in f32 (the reference path; `true` in every sweep) rather than on
    /// their codes with int8 queries, the path decode steps are timed with
    /// ([`crate::kv::intdot`]). `false` measures what the fast path costs in quality.
    pub exact_attention: bool,
}

impl PplProtocol {
    /// First position whose logits are scored.
    pub fn first_scored(&self) -> usize {
        match self.scoring {
            Scoring::Half => self.ctx / 2,
            Scoring::All => 0,
        }
    }

    /// Checks the protocol against a model and a token stream before any work.
    /// Errors: [`Error::InvalidArgument`] for a ctx below 4 or above the model's context length,
    /// or a text shorter than one window.
    pub fn validate(&self, model_ctx: usize, n_tokens: usize) -> Result<()> {
        let bad = |reason: String| Error::InvalidArgument {
            name: "--ctx".into(),
            reason,
        };
        if self.ctx < 4 {
            return Err(bad(format!(
                "{} is too small; use at least 4 tokens",
                self.ctx
            )));
        }
        if self.ctx > model_ctx {
            return Err(bad(format!(
                "{} exceeds the model's context length {model_ctx}; pass --ctx {model_ctx} or less",
                self.ctx
            )));
        }
        if n_tokens < self.ctx {
            return Err(bad(format!(
                "the text has only {n_tokens} tokens, fewer than one window of {}",
                self.ctx
            )));
        }
        if self.batch == 0 {
            return Err(Error::InvalidArgument {
                name: "--ppl-batch".into(),
                reason: "must be at least 1".into(),
            });
        }
        if self.windows == Some(0) {
            return Err(Error::InvalidArgument {
                name: "--ppl-windows".into(),
                reason: "must be at least 1".into(),
            });
        }
        Ok(())
    }
}

/// Agreement of a scheme's next-token distributions with the fp16 baseline's on the same scored
/// tokens, computed in lockstep (no logit files), as llama.cpp's `--kl-divergence` reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Agreement {
    /// Mean KL(P_fp16 ‖ P_scheme) per scored token, nats.
    pub kl_mean: f64,
    /// 99th percentile of per-token KL, nats.
    pub kl_p99: f64,
    /// Share of scored tokens whose greedy (top-1) token equals the baseline's, %.
    pub top1_agree_pct: f64,
    /// Mean |p_fp16(t*) − p_scheme(t*)| of the baseline's top token t*.
    pub mean_abs_dp_top: f64,
    /// Mean KL per quarter of the scored span (early → late positions), nats.
    pub kl_by_quarter: [f64; 4],
    /// 99.9th percentile of per-token KL, nats (type 7, [`crate::quality::paired::kl_stats`];
    /// llama.cpp's `--kl-divergence` "99.9%"). Absent in runs made before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_p99_9: Option<f64>,
    /// Largest per-token KL, nats (llama.cpp's "Maximum KLD").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_max: Option<f64>,
    /// Standard error of `kl_mean` over tokens, nats (llama.cpp's "Mean KLD ±"; tokens are
    /// correlated, so it understates the uncertainty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_se: Option<f64>,
    /// Standard error of the same-top share `top1_agree_pct`, percentage points
    /// (`100·sqrt(p(1−p)/(n−1))`, llama.cpp's "Same top p ±";
    /// [`crate::quality::paired::same_top`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_top_p_se: Option<f64>,
}

/// Per-token comparison of two `[n, vocab]` logit rows sets: (KL(P‖Q), top-1 equal, |Δp| of P's
/// top token), with softmax in f64.
pub fn compare_logits(base: &Tensor, other: &Tensor) -> Result<Vec<(f64, bool, f64)>> {
    let (a, b) = (base.to_vec2::<f32>()?, other.to_vec2::<f32>()?);
    Ok(a.iter()
        .zip(&b)
        .map(|(p, q)| {
            let lp = log_softmax(p);
            let lq = log_softmax(q);
            let kl: f64 = lp.iter().zip(&lq).map(|(x, y)| x.exp() * (x - y)).sum();
            let top = |v: &[f64]| {
                v.iter()
                    .enumerate()
                    .fold(
                        (0, f64::NEG_INFINITY),
                        |m, (i, &x)| if x > m.1 { (i, x) } else { m },
                    )
                    .0
            };
            let (tp, tq) = (top(&lp), top(&lq));
            (kl.max(0.0), tp == tq, (lp[tp].exp() - lq[tp].exp()).abs())
        })
        .collect())
}

/// log Σ exp(row), max-shifted, in f64.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    max + row
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let lse = log_sum_exp(row);
    row.iter().map(|&x| x as f64 - lse).collect()
}

fn summarize_agreement(per_token: &[(f64, bool, f64)], span: usize) -> Result<Agreement> {
    let n = per_token.len().max(1) as f64;
    let mut kls: Vec<f64> = per_token.iter().map(|t| t.0).collect();
    let mut quarters = [0f64; 4];
    let mut counts = [0usize; 4];
    for (i, t) in per_token.iter().enumerate() {
        let q = ((i % span) * 4 / span).min(3);
        quarters[q] += t.0;
        counts[q] += 1;
    }
    let kl_mean = kls.iter().sum::<f64>() / n;
    let kl_p99 = crate::stats::percentile(&mut kls, 99.0);
    let ks = paired::kl_stats(&kls)?;
    // same_top compares top tokens; the flags already say which matched (1 vs 1) or not (0 vs 1).
    let flags: Vec<u32> = per_token.iter().map(|t| t.1 as u32).collect();
    let st = paired::same_top(&flags, &vec![1; flags.len()])?;
    let finite = |x: f64| x.is_finite().then_some(x);
    Ok(Agreement {
        kl_mean,
        kl_p99,
        top1_agree_pct: 100.0 * per_token.iter().filter(|t| t.1).count() as f64 / n,
        mean_abs_dp_top: per_token.iter().map(|t| t.2).sum::<f64>() / n,
        kl_by_quarter: std::array::from_fn(|q| quarters[q] / counts[q].max(1) as f64),
        kl_p99_9: finite(ks.p99_9),
        kl_max: finite(ks.max),
        kl_se: finite(ks.mean_se),
        same_top_p_se: finite(100.0 * st.se),
    })
}

/// Result of a perplexity run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PplResult {
    /// exp(mean NLL).
    pub perplexity: f64,
    /// Mean negative log-likelihood per scored token, nats.
    pub mean_nll: f64,
    /// Scored tokens.
    pub scored_tokens: usize,
    /// Windows evaluated.
    pub windows: usize,
    /// Mean NLL of each window, nats (for per-window comparison and confidence intervals).
    pub window_nll: Vec<f64>,
    /// llama.cpp's `Final estimate: PPL = … +/- ppl_se` over every scored token
    /// ([`crate::quality::paired::ppl_estimate`]); absent in older runs or with one token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppl_se: Option<f64>,
    /// Spread of this scheme's perplexity over `--ppl-noise-floor K` reruns with activations
    /// perturbed at float rounding level; absent when not asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_floor: Option<NoiseFloor>,
    /// KV bytes held at the end of one window (codes, scales, zero-points).
    pub kv_bytes_per_window: usize,
    /// The mode actually used.
    pub mode: PplMode,
    /// Agreement with the baseline scheme, when one was given and differs from this scheme.
    pub agreement: Option<Agreement>,
}

/// Perplexity of `tokens` with K/V stored in `scheme`. `on_window(i, n)` is called after each
/// window (for progress bars). Errors: those of [`PplProtocol::validate`] and the model forward,
/// and [`Error::NonFinite`] if any token's NLL is NaN or infinite.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    scheme: KvScheme,
    proto: &PplProtocol,
    bos: Option<u32>,
    on_window: impl FnMut(usize, usize),
) -> Result<PplResult> {
    perplexity_vs(model, tokens, scheme, None, proto, bos, on_window)
}

/// [`perplexity`], plus — when `baseline` is given and differs from `scheme` — the baseline
/// cache run in lockstep over the same windows and mode, for KL divergence and top-1 agreement
/// ([`Agreement`]). The baseline costs one more forward per step.
pub fn perplexity_vs(
    model: &Model,
    tokens: &[u32],
    scheme: KvScheme,
    baseline: Option<KvScheme>,
    proto: &PplProtocol,
    bos: Option<u32>,
    mut on_window: impl FnMut(usize, usize),
) -> Result<PplResult> {
    let baseline = baseline.filter(|b| *b != scheme);
    proto.validate(model.config.max_ctx, tokens.len())?;
    let windows = cut_windows(tokens, proto, bos);
    let run = WindowRun {
        model,
        scheme,
        baseline,
        proto,
        first: proto.first_scored(),
        n_windows: windows.len(),
    };
    let mut scores = Scores {
        window_nll: Vec::with_capacity(run.n_windows),
        all_nll: Vec::with_capacity(run.n_windows * run.scored_per_window()),
        agree: Vec::new(),
        kv_bytes: 0,
    };
    let mode = proto.mode.resolve(&scheme);
    match mode {
        PplMode::Decode => run.decode(&windows, &mut scores, &mut on_window)?,
        PplMode::Chunked | PplMode::Auto => run.chunked(&windows, &mut scores, &mut on_window)?,
    }
    run.result(scores, mode)
}

/// The windows of `tokens` the protocol scores: non-overlapping, `proto.ctx` tokens each from
/// the start, full ones only, at most `proto.windows`.
///
/// When the protocol asks for BOS and the model has one (`add_bos`, e.g. Gemma 3), the token
/// stream is `[bos] ++ tokens`, as `llama-perplexity` tokenizes the text with
/// `common_tokenize(ctx, text, add_special = true)`, and each window's first token is replaced by
/// `bos` (llama.cpp `tools/perplexity/perplexity.cpp`, `perplexity()`): the windows start at the
/// same token offsets as llama.cpp's. Models without BOS (SmolLM2) cut `tokens` unchanged.
fn cut_windows(tokens: &[u32], proto: &PplProtocol, bos: Option<u32>) -> Vec<Vec<u32>> {
    let lead = match (proto.bos, bos) {
        (true, Some(b)) => Some(b),
        _ => None,
    };
    let stream: Vec<u32> = lead.into_iter().chain(tokens.iter().copied()).collect();
    let available = stream.len() / proto.ctx;
    let n_windows = proto.windows.map_or(available, |w| w.min(available));
    (0..n_windows)
        .map(|w| {
            let mut win = stream[w * proto.ctx..(w + 1) * proto.ctx].to_vec();
            if let Some(b) = lead {
                win[0] = b;
            }
            win
        })
        .collect()
}

/// What every window of one perplexity run shares.
struct WindowRun<'a> {
    model: &'a Model,
    /// The scheme measured.
    scheme: KvScheme,
    /// The scheme compared against in lockstep, if any (never `scheme` itself).
    baseline: Option<KvScheme>,
    proto: &'a PplProtocol,
    /// First position whose logits are scored ([`PplProtocol::first_scored`]).
    first: usize,
    /// Windows in the run.
    n_windows: usize,
}

/// What the windows of a run have scored so far.
struct Scores {
    /// Mean NLL of each finished window, nats, in window order.
    window_nll: Vec<f64>,
    /// Every scored token's NLL, nats, in scoring order.
    all_nll: Vec<f64>,
    /// Per scored token vs the baseline: (KL, top-1 equal, |Δp| of the baseline's top token),
    /// window by window.
    agree: Vec<(f64, bool, f64)>,
    /// KV bytes held at the end of the last window (per window, in decode groups), bytes.
    kv_bytes: usize,
}

impl WindowRun<'_> {
    /// Tokens scored per window: logits at positions `first..ctx−1` predict `first+1..ctx`.
    fn scored_per_window(&self) -> usize {
        self.proto.ctx - 1 - self.first
    }

    /// Empty caches for `batch` windows of `ctx` tokens: the scheme's, and the baseline's when
    /// there is one. Errors: [`AnyCache::new`]'s.
    fn caches(&self, batch: usize) -> Result<(AnyCache, Option<AnyCache>)> {
        let geom = self.model.config.cache_geometry();
        let dev = self.model.device();
        let exact = self.proto.exact_attention;
        let cache =
            AnyCache::new(self.scheme, geom, batch, self.proto.ctx, dev)?.exact_attention(exact);
        let base_cache = self
            .baseline
            .map(|s| {
                AnyCache::new(s, geom, batch, self.proto.ctx, dev).map(|c| c.exact_attention(exact))
            })
            .transpose()?;
        Ok((cache, base_cache))
    }

    /// `decode` mode: windows in groups of `proto.batch`, each group fed token by token
    /// through fresh caches ([`WindowRun::decode_group`]); then each window's mean NLL is
    /// recorded and `on_window(done, n_windows)` called. Errors: the caches' and the model's.
    fn decode(
        &self,
        windows: &[Vec<u32>],
        scores: &mut Scores,
        on_window: &mut dyn FnMut(usize, usize),
    ) -> Result<()> {
        for group in windows.chunks(self.proto.batch) {
            let sums = self.decode_group(group, scores)?;
            for s in sums {
                scores.window_nll.push(s / self.scored_per_window() as f64);
                on_window(scores.window_nll.len(), self.n_windows);
            }
        }
        Ok(())
    }

    /// Decodes one group of windows together, step by step through fresh caches (the
    /// baseline's in lockstep), scoring each step from `first` on: every scored token's NLL goes
    /// to `scores` as it is computed (the group's windows interleaved), the comparisons with the
    /// baseline window by window after the group, and the cache's bytes per window. Returns
    /// each window's summed NLL, nats. Errors: the caches' and the model's.
    fn decode_group(&self, group: &[Vec<u32>], scores: &mut Scores) -> Result<Vec<f64>> {
        let model = self.model;
        let b = group.len();
        let (mut cache, mut base_cache) = self.caches(b)?;
        let mut sums = vec![0f64; b];
        let mut group_agree: Vec<Vec<(f64, bool, f64)>> = vec![Vec::new(); b];
        for t in 0..self.proto.ctx - 1 {
            let step: Vec<u32> = group.iter().map(|w| w[t]).collect();
            let hidden = model.forward_hidden(&step, b, Some(cache.as_attention()))?;
            let base_hidden = match base_cache.as_mut() {
                Some(c) => Some(model.forward_hidden(&step, b, Some(c.as_attention()))?),
                None => None,
            };
            if t >= self.first {
                let logits = model.logits(&hidden.squeeze(1)?)?;
                let targets: Vec<u32> = group.iter().map(|w| w[t + 1]).collect();
                for (s, nll) in sums.iter_mut().zip(token_nll(&logits, &targets)?) {
                    *s += nll;
                    scores.all_nll.push(nll);
                }
                if let Some(h) = base_hidden {
                    let bl = model.logits(&h.squeeze(1)?)?;
                    for (w, c) in group_agree.iter_mut().zip(compare_logits(&bl, &logits)?) {
                        w.push(c);
                    }
                }
            }
        }
        scores.agree.extend(group_agree.into_iter().flatten());
        scores.kv_bytes = cache.kv_bytes() / b;
        Ok(sums)
    }

    /// `chunked` mode: each window as one prefill through the cleared caches (the baseline's
    /// too, for the comparison), scoring positions `first..ctx−1`; after each window its mean
    /// NLL is recorded and `on_window(done, n_windows)` called. Errors: the caches' and the
    /// model's.
    fn chunked(
        &self,
        windows: &[Vec<u32>],
        scores: &mut Scores,
        on_window: &mut dyn FnMut(usize, usize),
    ) -> Result<()> {
        let model = self.model;
        let (first, scored) = (self.first, self.scored_per_window());
        let (mut cache, mut base_cache) = self.caches(1)?;
        for win in windows {
            cache.clear()?;
            let hidden = model.forward_hidden(win, 1, Some(cache.as_attention()))?;
            scores.kv_bytes = cache.kv_bytes();
            // Logits at positions first..ctx-1 predict tokens first+1..ctx.
            let h = hidden.squeeze(0)?.narrow(0, first, scored)?;
            let logits = model.logits(&h)?;
            if let Some(c) = base_cache.as_mut() {
                c.clear()?;
                let bh = model.forward_hidden(win, 1, Some(c.as_attention()))?;
                let bh = bh.squeeze(0)?.narrow(0, first, scored)?;
                scores
                    .agree
                    .extend(compare_logits(&model.logits(&bh)?, &logits)?);
            }
            let nll = token_nll(&logits, &win[first + 1..])?;
            scores.all_nll.extend_from_slice(&nll);
            scores
                .window_nll
                .push(nll.iter().sum::<f64>() / nll.len() as f64);
            on_window(scores.window_nll.len(), self.n_windows);
        }
        Ok(())
    }

    /// The run's result from its `scores` in `mode`: perplexity = exp(mean of the windows'
    /// mean NLLs), llama.cpp's standard error over every scored token, and the agreement with
    /// the baseline when there is one. Errors: [`Error::NonFinite`] for a window whose NLL is
    /// NaN or infinite; [`paired::ppl_estimate`]'s and the agreement summary's.
    fn result(&self, scores: Scores, mode: PplMode) -> Result<PplResult> {
        let mean_nll = finite_mean(&scores.window_nll, &self.scheme)?;
        let ppl_se = paired::ppl_estimate(&scores.all_nll)?.ppl_se;
        let agreement = match self.baseline {
            Some(_) => Some(summarize_agreement(
                &scores.agree,
                self.scored_per_window(),
            )?),
            None => None,
        };
        Ok(PplResult {
            perplexity: mean_nll.exp(),
            mean_nll,
            scored_tokens: self.n_windows * self.scored_per_window(),
            windows: self.n_windows,
            window_nll: scores.window_nll,
            ppl_se: ppl_se.is_finite().then_some(ppl_se),
            noise_floor: None,
            kv_bytes_per_window: scores.kv_bytes,
            mode,
            agreement,
        })
    }
}

/// Mean of per-window NLLs; any NaN or infinity is an error naming the window, never averaged.
fn finite_mean(window_nll: &[f64], scheme: &KvScheme) -> Result<f64> {
    if let Some(w) = window_nll.iter().position(|x| !x.is_finite()) {
        return Err(Error::NonFinite(format!(
            "perplexity of scheme {scheme}: window {w} has NLL {} (NaN or infinite logits)",
            window_nll[w]
        )));
    }
    Ok(window_nll.iter().sum::<f64>() / window_nll.len() as f64)
}

/// Negative log-likelihood (nats) of each target under its row of `logits` (`[n, vocab]` f32),
/// computed as `logsumexp(row) − row[target]` in f64.
pub fn token_nll(logits: &Tensor, targets: &[u32]) -> Result<Vec<f64>> {
    let rows = logits.to_vec2::<f32>()?;
    Ok(rows
        .iter()
        .zip(targets)
        .map(|(row, &t)| log_sum_exp(row) - row[t as usize] as f64)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform logits over 4 classes: NLL = ln 4 for any target; a one-hot-ish row by hand.
    #[test]
    fn nll_by_hand() {
        let l = Tensor::new(
            &[[0f32, 0., 0., 0.], [2f32.ln(), 0., 0., 0.]],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let nll = token_nll(&l, &[3, 0]).unwrap();
        // KL of identical distributions is 0; of a hand-made pair: P = (0.5, 0.5), Q = (0.8, 0.2)
        // (logits ln 4, 0) → 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231436.
        let p = Tensor::new(&[[0f32, 0.], [0f32, 0.]], &candle_core::Device::Cpu).unwrap();
        let q = Tensor::new(&[[0f32, 0.], [4f32.ln(), 0.]], &candle_core::Device::Cpu).unwrap();
        let c = compare_logits(&p, &q).unwrap();
        assert!(c[0].0.abs() < 1e-12 && c[0].1);
        assert!((c[1].0 - 0.2231435513).abs() < 1e-7, "{}", c[1].0);
        assert!((c[1].2 - 0.3).abs() < 1e-9);
        assert!(finite_mean(&[1.0, f64::NAN], &KvScheme::FP16)
            .unwrap_err()
            .to_string()
            .contains("window 1"));
        assert!((nll[0] - 4f64.ln()).abs() < 1e-12);
        // p(0) = 2 / (2 + 1 + 1 + 1) = 0.4
        assert!((nll[1] - (-(0.4f64).ln())).abs() < 1e-7);
    }

    /// llama-perplexity's windows by hand: for a BOS model the stream is [BOS] ++ text tokens,
    /// so with ctx 4 over text 10..=18 (9 tokens) the windows are [B,10,11,12] and [B,14,15,16]
    /// (token 13, the stream's 5th, is replaced by BOS); without BOS, [10,11,12,13] and
    /// [14,15,16,17]; a model without a BOS id ignores the protocol's flag.
    #[test]
    fn windows_start_where_llama_perplexity_starts_them() {
        let text: Vec<u32> = (10..=18).collect();
        let proto = |bos| PplProtocol {
            mode: PplMode::Chunked,
            batch: 1,
            ctx: 4,
            windows: None,
            scoring: Scoring::Half,
            bos,
            exact_attention: true,
        };
        assert_eq!(
            cut_windows(&text, &proto(true), Some(2)),
            vec![vec![2, 10, 11, 12], vec![2, 14, 15, 16]]
        );
        assert_eq!(
            cut_windows(&text, &proto(false), Some(2)),
            vec![vec![10, 11, 12, 13], vec![14, 15, 16, 17]]
        );
        assert_eq!(
            cut_windows(&text, &proto(true), None),
            cut_windows(&text, &proto(false), None)
        );
        // One window asked for, and 8 text tokens + BOS hold two full windows of 4.
        let mut one = proto(true);
        one.windows = Some(1);
        assert_eq!(
            cut_windows(&text[..8], &one, Some(2)),
            vec![vec![2, 10, 11, 12]]
        );
        assert_eq!(cut_windows(&text[..8], &proto(true), Some(2)).len(), 2);
    }
}
