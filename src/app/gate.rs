//! `kvbench gate` end to end: the results of a run against a baseline's, sweep results on
//! perplexity, KL and TPOT ([`crate::report::gate`]), serving results on goodput, SLO
//! attainment and TTFT/TPOT p95 ([`crate::report::serve_gate`]); or, with `--vs SCHEME`, each
//! scheme of one sweep against that scheme in the same run. The verdict is printed as Markdown
//! or JSON (`--format json`), the Markdown appended to `$GITHUB_STEP_SUMMARY`; exit 3 on a
//! regression, 2 on unusable input or runs measured under different protocols.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::report::gate::{self, Limits, Results};
use crate::report::meta::RunKind;
use crate::report::run_dir::kind_of;
use crate::report::serve_gate::{self, ServeLimits, ServeResults};

/// Arguments of `kvbench gate`.
#[derive(Debug, clap::Args)]
pub struct GateArgs {
    /// Baseline results: a results.csv or a run folder. Not needed with --vs, which compares
    /// within --current.
    #[arg(long, required_unless_present = "vs", conflicts_with = "vs")]
    pub baseline: Option<PathBuf>,

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

    /// Compare each scheme of --current with this scheme of the same run, at the same batch
    /// size and prompt length (e.g. `fp16`), instead of with a baseline run. With
    /// --significant it must be fp16 (the paired interval columns are relative to fp16).
    #[arg(long, value_name = "SCHEME")]
    pub vs: Option<String>,

    /// Gate only these schemes, comma-separated (`--dtypes` syntax; aliases such as `int8`
    /// select the scheme they name). Each must be in the results.
    #[arg(long, value_name = "SCHEMES")]
    pub schemes: Option<String>,

    /// How the verdict is printed on stdout: a Markdown table, or one JSON object (kind,
    /// baseline, current, vs, limits, passed, points). `$GITHUB_STEP_SUMMARY` gets the
    /// Markdown either way.
    #[arg(long, value_enum, default_value_t = GateFormat::Markdown)]
    pub format: GateFormat,
}

/// `--format` of `kvbench gate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GateFormat {
    /// A Markdown table and a one-line result.
    Markdown,
    /// One JSON object (the `GateReport` type).
    Json,
}

/// `kvbench gate --format json`: the whole verdict, one JSON object on stdout.
#[derive(Debug, serde::Serialize)]
pub struct GateReport<'a, L: serde::Serialize, V: serde::Serialize> {
    /// `sweep` or `serve`.
    pub kind: RunKind,
    /// The baseline path; absent with `vs`.
    pub baseline: Option<&'a std::path::Path>,
    /// The current results' path.
    pub current: &'a std::path::Path,
    /// The scheme each is compared with inside `current` (`--vs`), as kvbench prints it.
    pub vs: Option<String>,
    /// The limits checked (percent, nats or percentage points as each field names; `null`
    /// unchecked).
    pub limits: &'a L,
    /// Whether every point passed (the exit code is 0 when true, 3 when false).
    pub passed: bool,
    /// One verdict per compared point.
    pub points: &'a [V],
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

/// Prints the verdict (Markdown or JSON; the Markdown also appended to
/// `$GITHUB_STEP_SUMMARY` when set) and returns exit code 3 when a point regresses, 0 when all
/// pass; unusable input is an error (exit 2), and so are two run folders whose `meta.json`
/// record different protocols ([`gate::protocol_differences`]). Sweep results and serving
/// results are gated alike, each on its own limits.
pub fn run(a: &GateArgs) -> anyhow::Result<ExitCode> {
    let (md, json, passed) = match &a.baseline {
        None => within_gate(a)?,
        Some(baseline) => {
            let protocol = gate::protocol_differences(baseline, &a.current)?;
            if !protocol.is_empty() {
                return Err(crate::Error::InvalidArgument {
                    name: "kvbench gate".into(),
                    reason: format!(
                        "{} and {} were measured under different protocols ({}); gate runs \
                         measured alike, or compare schemes within one run with --vs",
                        baseline.display(),
                        a.current.display(),
                        protocol.join("; ")
                    ),
                }
                .into());
            }
            match (kind_of(baseline)?, kind_of(&a.current)?) {
                (RunKind::Serve, RunKind::Serve) => serve_gate(a, baseline)?,
                (RunKind::Sweep, RunKind::Sweep) => sweep_gate(a, baseline)?,
                (b, c) => {
                    return Err(crate::Error::InvalidArgument {
                        name: "kvbench gate".into(),
                        reason: format!(
                            "the baseline {} is a `kvbench {b}` run and the current {} a \
                             `kvbench {c}` run; gate like against like",
                            baseline.display(),
                            a.current.display()
                        ),
                    }
                    .into())
                }
            }
        }
    };
    match a.format {
        GateFormat::Markdown => print!("{md}"),
        GateFormat::Json => println!("{json}"),
    }
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

/// `--schemes` as a list of specs (each checked to parse, so a typo is named with its nearest
/// names). Errors: [`crate::Error::UnknownScheme`] for the first bad entry.
fn scheme_filter(a: &GateArgs) -> crate::Result<Option<Vec<String>>> {
    a.schemes
        .as_deref()
        .map(|list| {
            crate::kv::parse_scheme_list(list).map(|v| v.iter().map(|s| s.to_string()).collect())
        })
        .transpose()
}

/// The `(Markdown, JSON, passed)` of a verdict list.
fn rendered<L: serde::Serialize, V: serde::Serialize>(
    report: GateReport<'_, L, V>,
    md: String,
) -> anyhow::Result<(String, String, bool)> {
    let passed = report.passed;
    Ok((md, serde_json::to_string_pretty(&report)?, passed))
}

/// `--vs`: every scheme of the current sweep against the named one of the same run.
fn within_gate(a: &GateArgs) -> anyhow::Result<(String, String, bool)> {
    let vs = a.vs.as_deref().expect("clap requires --baseline or --vs");
    let vs_scheme: crate::kv::KvScheme = vs.parse()?;
    if kind_of(&a.current)? != RunKind::Sweep {
        return Err(crate::Error::InvalidArgument {
            name: "--vs".into(),
            reason: format!(
                "{} is a `kvbench serve` run; --vs compares the schemes of one sweep: gate \
                 serving runs against a --baseline",
                a.current.display()
            ),
        }
        .into());
    }
    let limits = sweep_limits(a)?;
    let mut current = Results::read(&a.current)?;
    if let Some(mut names) = scheme_filter(a)? {
        names.push(vs_scheme.to_string());
        current = current.only_schemes(&names, "--schemes")?;
    }
    let verdicts = gate::compare_within(&current, vs, &limits)?;
    let md = format!(
        "Each scheme against `{vs_scheme}` at the same batch and prompt length in {} \
         (columns \"base\": `{vs_scheme}`).\n\n{}",
        a.current.display(),
        gate::markdown(&verdicts, &limits)
    );
    let report = GateReport {
        kind: RunKind::Sweep,
        baseline: None,
        current: &a.current,
        vs: Some(vs_scheme.to_string()),
        limits: &limits,
        passed: verdicts.iter().all(|v| v.passed()),
        points: &verdicts,
    };
    rendered(report, md)
}

/// The serving gate's Markdown, JSON and whether every point passed.
fn serve_gate(a: &GateArgs, baseline: &std::path::Path) -> anyhow::Result<(String, String, bool)> {
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
    let (mut base, mut cur) = (
        ServeResults::read(baseline)?,
        ServeResults::read(&a.current)?,
    );
    if let Some(names) = scheme_filter(a)? {
        for r in [&mut base, &mut cur] {
            r.rows
                .retain(|row| names.contains(&gate::canonical_scheme(&row.scheme)));
        }
    }
    let v = serve_gate::compare(&base, &cur, &limits)?;
    let report = GateReport {
        kind: RunKind::Serve,
        baseline: Some(baseline),
        current: &a.current,
        vs: None,
        limits: &limits,
        passed: v.iter().all(|v| v.passed()),
        points: &v,
    };
    rendered(report, serve_gate::markdown(&v, &limits))
}

/// The sweep limits from the flags. Errors: [`crate::Error::InvalidArgument`] when a serving
/// limit is given or no limit is.
fn sweep_limits(a: &GateArgs) -> anyhow::Result<Limits> {
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
    Ok(limits)
}

/// The sweep gate's Markdown, JSON and whether every point passed.
fn sweep_gate(a: &GateArgs, baseline: &std::path::Path) -> anyhow::Result<(String, String, bool)> {
    let limits = sweep_limits(a)?;
    let (mut base, mut cur) = (Results::read(baseline)?, Results::read(&a.current)?);
    if let Some(names) = scheme_filter(a)? {
        base = base.only_schemes(&names, "--schemes")?;
        cur = cur.only_schemes(&names, "--schemes")?;
    }
    let verdicts = gate::compare(&base, &cur, &limits)?;
    let report = GateReport {
        kind: RunKind::Sweep,
        baseline: Some(baseline),
        current: &a.current,
        vs: None,
        limits: &limits,
        passed: verdicts.iter().all(|v| v.passed()),
        points: &verdicts,
    };
    rendered(report, gate::markdown(&verdicts, &limits))
}
