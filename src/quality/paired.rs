//! Paired quality statistics: a scheme's perplexity against the fp16-cache reference run on the
//! same windows in lockstep, with the uncertainty that makes a ΔPPL a measurement. Pure functions
//! on per-window (or per-token) negative log-likelihoods, KL divergences and top-1 tokens; they
//! know nothing about models or caches.
//!
//! Why paired: the same text is scored by both caches, so most window-to-window variation (easy
//! vs hard text) cancels in the differences `nll_scheme − nll_ref`; the interval of the mean
//! difference is far narrower than the two runs' separate intervals would suggest, and it is the
//! honest width (llama.cpp's `--kl-divergence` reports `ln(PPL(Q)/PPL(base))` with exactly this
//! paired uncertainty, via the covariance term).
//!
//! Units: NLL in nats. Pass **per-window mean NLLs** for the interval: the windows are disjoint
//! stretches of text and close to independent, whereas neighbouring tokens are correlated, so a
//! per-token interval is too narrow (llama.cpp's per-token ± has the same caveat). With equal
//! window lengths (kvbench scores the same number of targets in every window) the mean of the
//! window means is the token mean, so `exp` of it is the usual perplexity.

use crate::error::{Error, Result};
use crate::stats::percentile;
use crate::util::noise::SplitMix64;

/// Two-sided confidence level of every interval here.
pub const LEVEL: f64 = 0.95;

fn invalid(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

fn check_finite(name: &str, xs: &[f64]) -> Result<()> {
    if xs.is_empty() {
        return Err(invalid(name, "is empty; score at least one window".into()));
    }
    match xs.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(Error::NonFinite(format!("{name}[{i}] = {}", xs[i]))),
        None => Ok(()),
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Standard error of the mean, `sqrt(Σ(x − x̄)² / (n·(n − 1)))`; NaN for n < 2.
fn sem(xs: &[f64]) -> f64 {
    let n = xs.len();
    if n < 2 {
        return f64::NAN;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n * (n - 1)) as f64).sqrt()
}

/// Mean NLL of each window from per-token NLLs (`[n_windows · window]`, window-major).
/// Errors: [`Error::InvalidArgument`] when `window` is 0 or does not divide the length.
pub fn window_means(nll: &[f64], window: usize) -> Result<Vec<f64>> {
    if window == 0 || nll.is_empty() || !nll.len().is_multiple_of(window) {
        return Err(invalid(
            "per-token NLL",
            format!(
                "{} values do not split into windows of {window} scored tokens",
                nll.len()
            ),
        ));
    }
    Ok(nll.chunks_exact(window).map(mean).collect())
}

/// Perplexity with llama.cpp's ± (`tools/perplexity/perplexity.cpp`, `perplexity()` "Final
/// estimate: PPL = … +/- …"): `ppl = exp(x̄)` and `ppl_se = ppl · sqrt((mean(x²) − x̄²)/(n − 1))`,
/// the standard error of the mean NLL carried through `exp` by the delta method.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PplEstimate {
    /// Values averaged (tokens as llama.cpp prints it; or windows).
    pub n: usize,
    /// Mean NLL, nats.
    pub mean_nll: f64,
    /// `exp(mean_nll)`.
    pub ppl: f64,
    /// `ppl · SE(mean NLL)`; NaN when n < 2.
    pub ppl_se: f64,
}

/// [`PplEstimate`] of `nll` (nats, one per scored token for llama.cpp's figure).
/// Errors: empty input ([`Error::InvalidArgument`]), a NaN or infinite value
/// ([`Error::NonFinite`]).
pub fn ppl_estimate(nll: &[f64]) -> Result<PplEstimate> {
    check_finite("NLL", nll)?;
    let m = mean(nll);
    let ppl = m.exp();
    Ok(PplEstimate {
        n: nll.len(),
        mean_nll: m,
        ppl,
        ppl_se: ppl * sem(nll),
    })
}

/// How the paired interval is computed. Written (CLI `--ppl-ci`, suites, `meta.json`, the
/// `ci_method` column) as `t` or `bootstrap:B:seed` ([`FromStr`](std::str::FromStr) also takes
/// `bootstrap` and `bootstrap:B`, with B = 10000 resamples and seed 0 by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(try_from = "String", into = "String")]
pub enum CiMethod {
    /// `d̄ ± t₀.₉₇₅,ₙ₋₁ · s_d/√n` on the paired differences (Student 1908; statrs's t quantile).
    /// Needs n ≥ 2.
    #[default]
    StudentT,
    /// Percentile bootstrap (Efron & Tibshirani 1993, §13.3): `resamples` means of n pairs drawn
    /// with replacement (SplitMix64 from `seed`), the 2.5th and 97.5th percentiles (type 7).
    Bootstrap { resamples: usize, seed: u64 },
}

impl std::fmt::Display for CiMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CiMethod::StudentT => f.write_str("t"),
            CiMethod::Bootstrap { resamples, seed } => write!(f, "bootstrap:{resamples}:{seed}"),
        }
    }
}

impl std::str::FromStr for CiMethod {
    type Err = Error;

    /// `t`, `bootstrap`, `bootstrap:B` or `bootstrap:B:seed`. Errors:
    /// [`Error::InvalidArgument`] naming `--ppl-ci` and the accepted forms.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            invalid(
                "--ppl-ci",
                format!("`{s}` is not an interval method; use `t`, `bootstrap`, `bootstrap:B` or `bootstrap:B:seed`"),
            )
        };
        let mut parts = s.trim().split(':');
        match parts.next() {
            Some("t") if parts.next().is_none() => Ok(CiMethod::StudentT),
            Some("bootstrap") => {
                let resamples = match parts.next() {
                    Some(b) => b.parse().map_err(|_| bad())?,
                    None => 10_000,
                };
                let seed = match parts.next() {
                    Some(x) => x.parse().map_err(|_| bad())?,
                    None => 0,
                };
                if parts.next().is_some() {
                    return Err(bad());
                }
                if resamples < 100 {
                    return Err(invalid(
                        "--ppl-ci",
                        format!("{resamples} bootstrap resamples are too few; use ≥ 1000"),
                    ));
                }
                Ok(CiMethod::Bootstrap { resamples, seed })
            }
            _ => Err(bad()),
        }
    }
}

impl TryFrom<String> for CiMethod {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<CiMethod> for String {
    fn from(m: CiMethod) -> String {
        m.to_string()
    }
}

/// A scheme's perplexity change against the reference on the same windows, with its paired 95 %
/// interval. The interval is computed for the mean NLL difference `d̄ = ln(PPL/PPL_ref)` and
/// mapped through `exp` (monotone, so the mapped interval keeps its coverage): relative
/// `100·(e^d − 1)` %, absolute `PPL_ref·(e^d − 1)` (the reference treated as fixed: both runs
/// saw the same text, the question is what the cache changed).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PairedDelta {
    /// Pairs (windows, or tokens).
    pub n: usize,
    /// Interval method.
    pub method: CiMethod,
    /// Scheme perplexity, `exp(mean NLL)`.
    pub ppl: f64,
    /// Reference (fp16 cache) perplexity.
    pub ppl_ref: f64,
    /// Mean NLL difference `d̄`, nats (= ln(PPL/PPL_ref)).
    pub mean_diff: f64,
    /// Standard error of `d̄`, `s_d/√n`; NaN when n < 2. For per-token input it equals
    /// llama.cpp's `Mean ln(PPL(Q)/PPL(base))` ± (`sqrt(se_q² + se_b² − 2·cov)`).
    pub diff_se: f64,
    /// `[lo, hi]` of `d̄`, nats.
    pub diff_ci: [f64; 2],
    /// `100·(PPL/PPL_ref − 1)`, %.
    pub delta_pct: f64,
    /// Its 95 % interval, %.
    pub delta_pct_ci: [f64; 2],
    /// `PPL − PPL_ref`.
    pub delta_ppl: f64,
    /// Its 95 % interval (`PPL_ref·(e^lo − 1)`, `PPL_ref·(e^hi − 1)`).
    pub delta_ppl_ci: [f64; 2],
}

impl PairedDelta {
    /// Half the width of the relative interval, percentage points: the smallest ΔPPL % these
    /// windows can tell from zero.
    pub fn resolution_pct(&self) -> f64 {
        0.5 * (self.delta_pct_ci[1] - self.delta_pct_ci[0])
    }

    /// Whether the regression exceeds `max_pct` beyond doubt: the whole interval lies above
    /// it (`gate --significant`).
    pub fn significantly_above(&self, max_pct: f64) -> bool {
        self.delta_pct_ci[0] > max_pct
    }

    /// A warning when the interval is too wide for a `max_pct` threshold (its half-width
    /// exceeds the threshold, so a pass or fail says nothing), with the window count that
    /// would resolve it ([`windows_needed`]). `None` when the windows suffice.
    pub fn too_few_windows(&self, max_pct: f64) -> Option<String> {
        too_few_windows(self.n, self.resolution_pct(), max_pct)
    }
}

/// Most windows [`windows_needed`] searches up to. A million windows is far past any evaluation
/// text (WikiText-2 test is ~300 k tokens); a limit that needs more is below what perplexity can
/// resolve, and the advice says "more than" this many instead of searching on.
pub const MAX_WINDOWS_NEEDED: usize = 1_000_000;

/// How many windows [`windows_needed`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowsNeeded {
    /// About this many: the smallest count whose interval reaches the target.
    About(usize),
    /// More than this many ([`MAX_WINDOWS_NEEDED`]): the target is below what any affordable
    /// window count resolves.
    MoreThan(usize),
}

impl std::fmt::Display for WindowsNeeded {
    /// `about 66` or `more than 1000000`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WindowsNeeded::About(m) => write!(f, "about {m}"),
            WindowsNeeded::MoreThan(m) => write!(f, "more than {m}"),
        }
    }
}

/// The windows a Student-t interval needs for its half-width to reach `target_pct`, given that
/// `n` windows gave a half-width of `half_width_pct` (both percentage points of ΔPPL). The
/// per-window SD is recovered as `half_width·√n / t₀.₉₇₅(n−1)` and the answer is the smallest
/// `m ≥ 2` with `t₀.₉₇₅(m−1)·SD/√m ≤ target` — scaling the half-width by `√(n/m)` alone would
/// keep the small-sample t quantile (12.7 at n = 2) and ask for ~40× too many windows.
///
/// The left side falls as m grows, so m is found by bisection from 2 to [`MAX_WINDOWS_NEEDED`]
/// (about 20 quantile evaluations, whatever the input); beyond the cap the answer is
/// [`WindowsNeeded::MoreThan`] ([`crate::stats::t_quantile`] answers at once for any degrees of
/// freedom). `None` for `n < 2`, a
/// non-positive or non-finite target, or a non-finite or negative half-width.
pub fn windows_needed(n: usize, half_width_pct: f64, target_pct: f64) -> Option<WindowsNeeded> {
    if n < 2
        || !(target_pct > 0.0 && target_pct.is_finite())
        || !(half_width_pct >= 0.0 && half_width_pct.is_finite())
    {
        return None;
    }
    let t = |df: usize| crate::stats::t_quantile(0.5 + LEVEL / 2.0, df);
    let sd = half_width_pct * (n as f64).sqrt() / t(n - 1)?;
    let fits = |m: usize| t(m - 1).is_some_and(|q| q * sd / (m as f64).sqrt() <= target_pct);
    if !sd.is_finite() || !fits(MAX_WINDOWS_NEEDED) {
        return Some(WindowsNeeded::MoreThan(MAX_WINDOWS_NEEDED));
    }
    // Invariant: fits(hi); lo = 2 may fit too (checked last).
    let (mut lo, mut hi) = (2, MAX_WINDOWS_NEEDED);
    if fits(lo) {
        return Some(WindowsNeeded::About(lo));
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(WindowsNeeded::About(hi))
}

/// The gate's warning text when `n` windows give a ΔPPL interval of half-width `half_width_pct`
/// wider than `max_pct`; `None` when they suffice or the width is unknown. The count asked for
/// is [`windows_needed`]'s, bounded by [`MAX_WINDOWS_NEEDED`].
pub fn too_few_windows(n: usize, half_width_pct: f64, max_pct: f64) -> Option<String> {
    if half_width_pct.is_nan() || half_width_pct <= max_pct {
        return None;
    }
    let advice = match windows_needed(n, half_width_pct, max_pct) {
        Some(need @ WindowsNeeded::MoreThan(_)) => format!(
            "score {need} windows (--ppl-windows), or raise the limit: one this small is below what \
             perplexity windows can resolve"
        ),
        Some(need) => format!("score {need} windows (--ppl-windows)"),
        None => "score more windows (--ppl-windows)".to_string(),
    };
    // A damaged results file can hold ±1e300, and a limit can be 1e-300: printed in full,
    // each is 300 digits.
    let hw = if half_width_pct < 1e6 {
        format!("{half_width_pct:.2}")
    } else {
        format!("{half_width_pct:.2e}")
    };
    let max = if max_pct == 0.0 || (1e-4..1e6).contains(&max_pct) {
        format!("{max_pct}")
    } else {
        format!("{max_pct:e}")
    };
    Some(format!(
        "{n} windows give a ±{hw} % interval on ΔPPL, wider than the {max} % threshold: the \
         gate cannot tell a pass from noise; {advice}"
    ))
}

/// Pairs `scheme` and `reference` NLLs (nats; one per window, or per token, in the same order
/// — run in lockstep on the same text) into a [`PairedDelta`].
/// Errors: [`Error::InvalidArgument`] for empty or unequal-length inputs, fewer than 2 pairs,
/// or a bootstrap with fewer than 100 resamples; [`Error::NonFinite`] for a NaN/infinite NLL.
pub fn paired_delta(scheme: &[f64], reference: &[f64], method: CiMethod) -> Result<PairedDelta> {
    check_finite("scheme NLL", scheme)?;
    check_finite("reference NLL", reference)?;
    if scheme.len() != reference.len() {
        return Err(invalid(
            "paired NLL",
            format!(
                "the scheme has {} values and the reference {}; score both on the same windows",
                scheme.len(),
                reference.len()
            ),
        ));
    }
    let n = scheme.len();
    if n < 2 {
        return Err(invalid(
            "paired NLL",
            "one window has no spread to build an interval from; score at least 2".into(),
        ));
    }
    let d: Vec<f64> = scheme.iter().zip(reference).map(|(a, b)| a - b).collect();
    let md = mean(&d);
    let se = sem(&d);
    let diff_ci = match method {
        CiMethod::StudentT => {
            let t = crate::stats::t_quantile(0.5 + LEVEL / 2.0, n - 1)
                .ok_or_else(|| invalid("paired NLL", "no degrees of freedom".into()))?;
            [md - t * se, md + t * se]
        }
        CiMethod::Bootstrap { resamples, seed } => {
            if resamples < 100 {
                return Err(invalid(
                    "bootstrap resamples",
                    format!("{resamples} is too few for a 95 % percentile interval; use ≥ 1000"),
                ));
            }
            let mut rng = SplitMix64::new(seed);
            let mut means: Vec<f64> = (0..resamples)
                .map(|_| {
                    (0..n)
                        .map(|_| d[((rng.next_u64() as u128 * n as u128) >> 64) as usize])
                        .sum::<f64>()
                        / n as f64
                })
                .collect();
            let alpha = 100.0 * (1.0 - LEVEL) / 2.0;
            [
                percentile(&mut means, alpha),
                percentile(&mut means, 100.0 - alpha),
            ]
        }
    };
    let ppl_ref = mean(reference).exp();
    let rel = |x: f64| x.exp_m1();
    Ok(PairedDelta {
        n,
        method,
        ppl: mean(scheme).exp(),
        ppl_ref,
        mean_diff: md,
        diff_se: se,
        diff_ci,
        delta_pct: 100.0 * rel(md),
        delta_pct_ci: diff_ci.map(|x| 100.0 * rel(x)),
        delta_ppl: ppl_ref * rel(md),
        delta_ppl_ci: diff_ci.map(|x| ppl_ref * rel(x)),
    })
}

/// The KL-divergence distribution over scored tokens (nats), as llama.cpp's
/// `--kl-divergence` summary prints it: mean ± SE, median, upper percentiles and maximum.
/// Percentiles interpolate linearly between order statistics at `p·(n − 1)` (Hyndman & Fan
/// type 7; llama.cpp's `percentile` lambda, NumPy's default).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct KlStats {
    /// Tokens.
    pub n: usize,
    /// Mean KL.
    pub mean: f64,
    /// Its standard error (NaN for n < 2; llama.cpp prints 0 for n ≤ 10).
    pub mean_se: f64,
    /// Median.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile: the rare tokens where the cache changed the prediction.
    pub p99_9: f64,
    /// Largest KL.
    pub max: f64,
}

/// [`KlStats`] of per-token KL divergences (nats). Errors: empty input, a NaN or infinite value.
pub fn kl_stats(kl: &[f64]) -> Result<KlStats> {
    check_finite("KL", kl)?;
    let mut v = kl.to_vec();
    Ok(KlStats {
        n: kl.len(),
        mean: mean(kl),
        mean_se: sem(kl),
        median: percentile(&mut v, 50.0),
        p90: percentile(&mut v, 90.0),
        p95: percentile(&mut v, 95.0),
        p99: percentile(&mut v, 99.0),
        p99_9: percentile(&mut v, 99.9),
        max: v[v.len() - 1],
    })
}

/// Index of the largest logit, the first one on ties (llama.cpp's `imax` scan with a strict
/// `>`); `None` for an empty slice. NaN logits are never chosen.
pub fn top1(logits: &[f32]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in logits.iter().enumerate() {
        if best.is_none_or(|b| v > logits[b]) && !v.is_nan() {
            best = Some(i);
        }
    }
    best
}

/// llama.cpp's "Same top p": the share of scored positions where the scheme's most likely next
/// token (argmax of its logits) is the reference's (argmax of the fp16 run's), whatever the
/// actual next token; ± `sqrt(p(1 − p)/(n − 1))` (`kl_divergence()` in
/// `tools/perplexity/perplexity.cpp`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SameTop {
    /// Positions compared.
    pub n: usize,
    /// Positions whose top-1 agrees.
    pub same: usize,
    /// `same / n`.
    pub p: f64,
    /// Binomial standard error; NaN when n < 2.
    pub se: f64,
}

/// [`SameTop`] from the top-1 token ids of the scheme and the reference at the same positions.
/// Errors: [`Error::InvalidArgument`] for empty or unequal-length inputs.
pub fn same_top(scheme_top: &[u32], reference_top: &[u32]) -> Result<SameTop> {
    if scheme_top.is_empty() || scheme_top.len() != reference_top.len() {
        return Err(invalid(
            "top-1 tokens",
            format!(
                "the scheme has {} positions and the reference {}; compare the same non-empty set",
                scheme_top.len(),
                reference_top.len()
            ),
        ));
    }
    let n = scheme_top.len();
    let same = scheme_top
        .iter()
        .zip(reference_top)
        .filter(|(a, b)| a == b)
        .count();
    let p = same as f64 / n as f64;
    let se = if n > 1 {
        (p * (1.0 - p) / (n - 1) as f64).sqrt()
    } else {
        f64::NAN
    };
    Ok(SameTop { n, same, p, se })
}

/// Moves every finite value one unit in the last place up or down (a fair coin per value from
/// `rng`): a perturbation at exactly float rounding level, for `--ppl-noise-floor` reruns
/// (apply it to activations, e.g. each layer's input hidden state). Infinite and NaN values are
/// left alone.
pub fn perturb_rounding(x: &mut [f32], rng: &mut SplitMix64) {
    let mut bits = 0u64;
    for (i, v) in x.iter_mut().enumerate() {
        if i % 64 == 0 {
            bits = rng.next_u64();
        }
        if v.is_finite() {
            *v = if bits & 1 == 1 {
                v.next_up()
            } else {
                v.next_down()
            };
        }
        bits >>= 1;
    }
}

/// The spread of one scheme's perplexity over K reruns with activations perturbed at rounding
/// level ([`perturb_rounding`], a different seed per rerun): the noise floor below which two
/// schemes cannot be told apart.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NoiseFloor {
    /// Reruns.
    pub runs: usize,
    /// Mean perplexity.
    pub mean: f64,
    /// Sample standard deviation (n − 1); NaN for one run.
    pub sd: f64,
    /// Smallest perplexity.
    pub min: f64,
    /// Largest perplexity.
    pub max: f64,
    /// `100·(max − min)/mean`, %.
    pub spread_pct: f64,
}

/// [`NoiseFloor`] of the perplexities of K perturbed reruns.
/// Errors: empty input, a NaN or infinite perplexity.
pub fn noise_floor(ppls: &[f64]) -> Result<NoiseFloor> {
    check_finite("noise-floor perplexities", ppls)?;
    let n = ppls.len();
    let m = mean(ppls);
    let sd = if n > 1 {
        (ppls.iter().map(|p| (p - m) * (p - m)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        f64::NAN
    };
    let min = ppls.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ppls.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Ok(NoiseFloor {
        runs: n,
        mean: m,
        sd,
        min,
        max,
        spread_pct: 100.0 * (max - min) / m,
    })
}

#[cfg(test)]
mod tests;
