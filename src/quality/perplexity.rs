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
use crate::kv::{KvCache, KvScheme};
use crate::model::Model;

/// Which targets of a window are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// The second half of each window (llama.cpp's `llama-perplexity`).
    Half,
    /// Every token after the first.
    All,
}

/// How windows go through the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
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

/// Result of a perplexity run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
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
    /// KV bytes held at the end of one window (codes, scales, zero-points).
    pub kv_bytes_per_window: usize,
    /// The mode actually used.
    pub mode: PplMode,
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
    mut on_window: impl FnMut(usize, usize),
) -> Result<PplResult> {
    proto.validate(model.config.max_ctx, tokens.len())?;
    let available = tokens.len() / proto.ctx;
    let n_windows = proto.windows.map_or(available, |w| w.min(available));
    let windows: Vec<Vec<u32>> = (0..n_windows)
        .map(|w| {
            let mut win = tokens[w * proto.ctx..(w + 1) * proto.ctx].to_vec();
            if let (true, Some(b)) = (proto.bos, bos) {
                win[0] = b;
            }
            win
        })
        .collect();
    let mode = proto.mode.resolve(&scheme);
    let geom = model.config.cache_geometry();
    let first = proto.first_scored();
    let mut window_nll = Vec::with_capacity(n_windows);
    let mut kv_bytes = 0;
    match mode {
        PplMode::Decode => {
            for group in windows.chunks(proto.batch) {
                let b = group.len();
                let mut cache = KvCache::new(scheme, geom, b)?;
                let mut sums = vec![0f64; b];
                for t in 0..proto.ctx - 1 {
                    let step: Vec<u32> = group.iter().map(|w| w[t]).collect();
                    let hidden = model.forward_hidden(&step, b, Some(&mut cache))?;
                    if t >= first {
                        let logits = model.logits(&hidden.squeeze(1)?)?;
                        let targets: Vec<u32> = group.iter().map(|w| w[t + 1]).collect();
                        for (s, nll) in sums.iter_mut().zip(token_nll(&logits, &targets)?) {
                            *s += nll;
                        }
                    }
                }
                kv_bytes = cache.kv_bytes() / b;
                for s in sums {
                    window_nll.push(s / (proto.ctx - 1 - first) as f64);
                    on_window(window_nll.len(), n_windows);
                }
            }
        }
        PplMode::Chunked | PplMode::Auto => {
            let mut cache = KvCache::new(scheme, geom, 1)?;
            for win in &windows {
                cache.clear();
                let hidden = model.forward_hidden(win, 1, Some(&mut cache))?;
                kv_bytes = cache.kv_bytes();
                // Logits at positions first..ctx-1 predict tokens first+1..ctx.
                let h = hidden.squeeze(0)?.narrow(0, first, proto.ctx - 1 - first)?;
                let nll = token_nll(&model.logits(&h)?, &win[first + 1..])?;
                window_nll.push(nll.iter().sum::<f64>() / nll.len() as f64);
                on_window(window_nll.len(), n_windows);
            }
        }
    }
    let mean_nll = finite_mean(&window_nll, &scheme)?;
    Ok(PplResult {
        perplexity: mean_nll.exp(),
        mean_nll,
        scored_tokens: n_windows * (proto.ctx - 1 - first),
        windows: n_windows,
        window_nll,
        kv_bytes_per_window: kv_bytes,
        mode,
    })
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
        .map(|(row, &t)| {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            lse - row[t as usize] as f64
        })
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
        assert!(finite_mean(&[1.0, f64::NAN], &KvScheme::FP16)
            .unwrap_err()
            .to_string()
            .contains("window 1"));
        assert!((nll[0] - 4f64.ln()).abs() < 1e-12);
        // p(0) = 2 / (2 + 1 + 1 + 1) = 0.4
        assert!((nll[1] - (-(0.4f64).ln())).abs() < 1e-7);
    }
}
