//! `kvbench gate` end to end: the results of a run against a baseline's, sweep results on
//! perplexity, KL and TPOT ([`crate::report::gate`]), serving results on goodput, SLO
//! attainment and TTFT/TPOT p95 ([`crate::report::serve_gate`]); the verdict printed as
//! Markdown (and appended to `$GITHUB_STEP_SUMMARY`), exit 3 on a regression.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::report::gate::{self, Limits, Results};
use crate::report::meta::RunKind;
use crate::report::run_dir::kind_of;
use crate::report::serve_gate::{self, ServeLimits, ServeResults};

/// Arguments of `kvbench gate`.
#[derive(Debug, clap::Args)]
pub struct GateArgs {
    /// Baseline results: a results.csv or a run folder.
    #[arg(long)]
    pub baseline: PathBuf,

    /// Current results: a results.csv or a run folder.
    #[arg(long)]
    pub current: PathBuf,

    /// Largest allowed perplexity increase per scheme against the baseline, % (e.g. `1%`).
    #[arg(long, value_parser = parse_pct)]
    pub max_ppl_delta: Option<f64>,

    /// Largest allowed increase of mean KL divergence vs fp16 per scheme, nats (e.g. `0.01`).
    #[arg(long, value_parser = parse_nats)]
    pub max_kl: Option<f64>,

    /// Largest allowed TPOT increase per point, % (timings are noisy: use on a quiet machine);
    /// for serving runs, of TPOT p95.
    #[arg(long, value_parser = parse_pct)]
    pub max_tpot_regression: Option<f64>,

    /// Serving runs: largest allowed goodput decrease per point (scheme × load), % of the
    /// baseline's.
    #[arg(long, value_parser = parse_pct)]
    pub max_goodput_drop: Option<f64>,

    /// Serving runs: largest allowed SLO-attainment decrease per point, percentage points.
    #[arg(long, value_parser = parse_pct)]
    pub max_slo_drop: Option<f64>,

    /// Serving runs: largest allowed TTFT p95 increase per point, %.
    #[arg(long, value_parser = parse_pct)]
    pub max_ttft_regression: Option<f64>,

    /// Fail a perplexity regression only when it lies outside the current run's paired 95 %
    /// ΔPPL interval (needs `delta_ppl_pct_lo/_hi` in the current results: a sweep with
    /// --ppl-windows ≥ 2). Too few windows for the limit are warned about either way.
    #[arg(long)]
    pub significant: bool,
}

/// Largest `--max-ppl-delta` / `--max-tpot-regression`, %: a 10 000-fold rise. A limit past it
/// checks nothing (likely a typo for a smaller one).
pub const MAX_PCT_LIMIT: f64 = 1e6;

/// Largest `--max-kl`, nats: a mean KL that large means the distributions share nothing (the
/// entropy of a 128 k-token vocabulary is 11.8 nats), so a limit past it checks nothing.
pub const MAX_KL_LIMIT: f64 = 1e3;

/// `"0.01"` → 0.01 (nats); refuses NaN, infinities and negative numbers, which would pass or
/// fail every point, and values above [`MAX_KL_LIMIT`].
fn parse_nats(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=MAX_KL_LIMIT).contains(&v) => Ok(v),
        Ok(v) if v.is_finite() && v > MAX_KL_LIMIT => Err(format!(
            "`{s}` nats is above {MAX_KL_LIMIT}: a mean KL limit that large checks nothing; \
             give one like 0.01"
        )),
        Ok(_) => Err(format!(
            "`{s}` must be a finite number of nats ≥ 0, e.g. 0.01"
        )),
        Err(_) => Err(format!("`{s}` is not a number of nats like 0.01")),
    }
}

/// `"1%"`, `"1"` → 1.0 (percent); refuses NaN, infinities, negative numbers and values above
/// [`MAX_PCT_LIMIT`]. A tiny limit (`0.0001%`) is accepted: the gate then warns that the windows
/// cannot resolve it.
fn parse_pct(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{s}` is not a percentage like 1% or 0.5"))?;
    if !(v.is_finite() && v >= 0.0) {
        Err(format!("`{s}` must be a finite percentage ≥ 0"))
    } else if v > MAX_PCT_LIMIT {
        Err(format!(
            "`{s}` is above {MAX_PCT_LIMIT}%: a limit that large checks nothing; give one like 1%"
        ))
    } else {
        Ok(v)
    }
}

/// Prints the Markdown table (also appended to `$GITHUB_STEP_SUMMARY` when set) and returns
/// exit code 3 when a point regresses, 0 when all pass; unusable input is an error (exit 2).
/// Sweep results and serving results are gated alike, each on its own limits.
pub fn run(a: &GateArgs) -> anyhow::Result<ExitCode> {
    let kinds = (kind_of(&a.baseline)?, kind_of(&a.current)?);
    let (md, passed) = match kinds {
        (RunKind::Serve, RunKind::Serve) => serve_gate(a)?,
        (RunKind::Sweep, RunKind::Sweep) => sweep_gate(a)?,
        (b, c) => {
            return Err(crate::Error::InvalidArgument {
                name: "kvbench gate".into(),
                reason: format!(
                    "the baseline {} is a `kvbench {b}` run and the current {} a `kvbench {c}` \
                     run; gate like against like",
                    a.baseline.display(),
                    a.current.display()
                ),
            }
            .into())
        }
    };
    print!("{md}");
    if let Some(p) = std::env::var_os("GITHUB_STEP_SUMMARY") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(p)
        {
            let _ = writeln!(f, "## kvbench gate\n\n{md}");
        }
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

/// The serving gate's table and whether every point passed.
fn serve_gate(a: &GateArgs) -> anyhow::Result<(String, bool)> {
    if a.max_ppl_delta.is_some() || a.max_kl.is_some() || a.significant {
        return Err(crate::Error::InvalidArgument {
            name: "kvbench gate".into(),
            reason: "serving runs have no perplexity or KL: gate them with --max-goodput-drop, \
                     --max-slo-drop, --max-ttft-regression, --max-tpot-regression"
                .into(),
        }
        .into());
    }
    let limits = ServeLimits {
        max_goodput_drop_pct: a.max_goodput_drop,
        max_slo_drop_pp: a.max_slo_drop,
        max_ttft_regression_pct: a.max_ttft_regression,
        max_tpot_regression_pct: a.max_tpot_regression,
    };
    let v = serve_gate::compare(
        &ServeResults::read(&a.baseline)?,
        &ServeResults::read(&a.current)?,
        &limits,
    )?;
    Ok((
        serve_gate::markdown(&v, &limits),
        v.iter().all(|v| v.passed()),
    ))
}

/// The sweep gate's table and whether every point passed.
fn sweep_gate(a: &GateArgs) -> anyhow::Result<(String, bool)> {
    if a.max_goodput_drop.is_some() || a.max_slo_drop.is_some() || a.max_ttft_regression.is_some() {
        return Err(crate::Error::InvalidArgument {
            name: "kvbench gate".into(),
            reason: "--max-goodput-drop, --max-slo-drop and --max-ttft-regression gate serving \
                     runs (kvbench serve); these are sweep results"
                .into(),
        }
        .into());
    }
    let limits = Limits {
        max_ppl_delta_pct: a.max_ppl_delta,
        max_kl: a.max_kl,
        max_tpot_regression_pct: a.max_tpot_regression,
        significant: a.significant,
    };
    if limits == Limits::default() {
        return Err(crate::Error::InvalidArgument {
            name: "kvbench gate".into(),
            reason: "no limit given; pass --max-ppl-delta, --max-kl and/or --max-tpot-regression"
                .into(),
        }
        .into());
    }
    let verdicts = gate::compare(
        &Results::read(&a.baseline)?,
        &Results::read(&a.current)?,
        &limits,
    )?;
    Ok((
        gate::markdown(&verdicts, &limits),
        verdicts.iter().all(|v| v.passed()),
    ))
}
