//! `kvbench gate` on serving runs: a run's serving results against a baseline's, point by point
//! (scheme × load × prefix caching), with limits on what a serving regression is — goodput
//! falling, SLO attainment falling, TTFT or TPOT p95 rising — as vLLM's and SGLang's benchmark
//! dashboards track them. A point that served in the baseline and failed now regresses; a
//! baseline point missing now fails. Exit codes as the sweep gate: 0 pass, 3 regression,
//! 2 unusable input.

use std::path::Path;

use super::serve::{ServeRow, ServeRun};
use crate::error::{Error, Result};

/// Limits on a serving run's change against its baseline; `None` leaves a metric unchecked.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ServeLimits {
    /// Largest allowed goodput decrease, % of the baseline's (relative).
    pub max_goodput_drop_pct: Option<f64>,
    /// Largest allowed SLO-attainment decrease, percentage points.
    pub max_slo_drop_pp: Option<f64>,
    /// Largest allowed TTFT p95 increase, % (relative).
    pub max_ttft_regression_pct: Option<f64>,
    /// Largest allowed TPOT p95 increase, % (relative).
    pub max_tpot_regression_pct: Option<f64>,
}

impl ServeLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        *self != ServeLimits::default()
    }
}

/// A serving run's rows: from a serve run folder or its `results.csv`.
#[derive(Debug, Clone)]
pub struct ServeResults {
    /// Where they were read from.
    pub path: std::path::PathBuf,
    /// One row per point.
    pub rows: Vec<ServeRow>,
}

impl ServeResults {
    /// Reads a serve run folder's points, or a serve `results.csv`. Errors:
    /// [`Error::InvalidArgument`] naming the path when it cannot be read as either.
    pub fn read(path: &Path) -> Result<ServeResults> {
        let rows = if path.is_dir() {
            ServeRun::read(path)?.rows
        } else {
            let f = crate::util::open_regular(path).map_err(|e| Error::io(path, e))?;
            csv::Reader::from_reader(f)
                .deserialize()
                .collect::<std::result::Result<Vec<ServeRow>, _>>()
                .map_err(|e| Error::InvalidArgument {
                    name: path.display().to_string(),
                    reason: format!("not a `kvbench serve` results.csv: {e}"),
                })?
        };
        Ok(ServeResults {
            path: path.to_path_buf(),
            rows,
        })
    }
}

/// One compared point (`--format json` writes it as is: each pair as `[baseline, current]`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ServeVerdict {
    /// Scheme.
    pub scheme: String,
    /// Arrival process and load.
    pub arrival: String,
    /// Prefix caching on.
    pub prefix_caching: bool,
    /// `(baseline, current)` goodput, requests/s.
    pub goodput: (Option<f64>, Option<f64>),
    /// `(baseline, current)` SLO attainment, 0–1.
    pub slo: (Option<f64>, Option<f64>),
    /// `(baseline, current)` TTFT p95, ms.
    pub ttft_p95: (Option<f64>, Option<f64>),
    /// `(baseline, current)` TPOT p95, ms.
    pub tpot_p95: (Option<f64>, Option<f64>),
    /// Why it fails; empty when it passes.
    pub failures: Vec<String>,
    /// Notes that do not fail it (a point measured on a busy machine).
    pub warnings: Vec<String>,
}

impl ServeVerdict {
    /// Whether every checked limit holds.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// `100·(now/base − 1)`, % (0 when both are 0).
fn change_pct(base: f64, now: f64) -> f64 {
    if base == 0.0 && now == 0.0 {
        0.0
    } else {
        100.0 * (now / base - 1.0)
    }
}

/// Compares every baseline point that served (`status` ok) with the current point of the same
/// scheme, load and prefix arm. Errors: [`Error::InvalidArgument`] when no limit is set or no
/// point of the baseline served (naming the file).
pub fn compare(
    baseline: &ServeResults,
    current: &ServeResults,
    limits: &ServeLimits,
) -> Result<Vec<ServeVerdict>> {
    if !limits.any() {
        return Err(Error::InvalidArgument {
            name: "kvbench gate".into(),
            reason: "no serving limit given; pass --max-goodput-drop, --max-slo-drop, \
                     --max-ttft-regression and/or --max-tpot-regression"
                .into(),
        });
    }
    let served: Vec<&ServeRow> = baseline.rows.iter().filter(|r| r.status.is_ok()).collect();
    if served.is_empty() {
        return Err(Error::InvalidArgument {
            name: baseline.path.display().to_string(),
            reason: "no point of the baseline served (every status is an error, or the run is \
                     empty); gate against a finished serving run"
                .into(),
        });
    }
    Ok(served
        .into_iter()
        .map(|b| verdict(b, current, limits))
        .collect())
}

fn verdict(b: &ServeRow, current: &ServeResults, limits: &ServeLimits) -> ServeVerdict {
    let now = current.rows.iter().find(|r| {
        r.scheme == b.scheme && r.arrival == b.arrival && r.prefix_caching == b.prefix_caching
    });
    let mut v = ServeVerdict {
        scheme: b.scheme.clone(),
        arrival: b.arrival.clone(),
        prefix_caching: b.prefix_caching,
        goodput: (b.stats.goodput, now.and_then(|r| r.stats.goodput)),
        slo: (
            Some(b.stats.slo_attainment),
            now.map(|r| r.stats.slo_attainment),
        ),
        ttft_p95: (b.stats.ttft_ms.p95, now.and_then(|r| r.stats.ttft_ms.p95)),
        tpot_p95: (b.stats.tpot_ms.p95, now.and_then(|r| r.stats.tpot_ms.p95)),
        failures: Vec::new(),
        warnings: Vec::new(),
    };
    let Some(now) = now else {
        v.failures.push("missing from the current results".into());
        return v;
    };
    if !now.status.is_ok() {
        v.failures
            .push(format!("served in the baseline, now {}", now.status));
        return v;
    }
    let pairs = [
        ("goodput", limits.max_goodput_drop_pct, v.goodput, -1.0, "%"),
        (
            "TTFT p95",
            limits.max_ttft_regression_pct,
            v.ttft_p95,
            1.0,
            "%",
        ),
        (
            "TPOT p95",
            limits.max_tpot_regression_pct,
            v.tpot_p95,
            1.0,
            "%",
        ),
    ];
    for (name, lim, (base, cur), sign, unit) in pairs {
        let Some(lim) = lim else { continue };
        match (base, cur) {
            // A baseline without the value (nothing measured there) checks nothing.
            (None, _) => {}
            (Some(_), None) => v.failures.push(format!("{name}: no value now")),
            (Some(b), Some(c)) => {
                let change = sign * change_pct(b, c);
                if change > lim {
                    let s = if sign < 0.0 { '−' } else { '+' };
                    v.failures.push(format!(
                        "{name} {s}{change:.1}{unit} (limit {s}{lim}{unit})"
                    ));
                }
            }
        }
    }
    if let Some(lim) = limits.max_slo_drop_pp {
        let drop = 100.0 * (b.stats.slo_attainment - now.stats.slo_attainment);
        if drop > lim {
            v.failures.push(format!(
                "SLO attainment −{drop:.1} points (limit −{lim} points)"
            ));
        }
    }
    for (which, r) in [("baseline", b), ("current", now)] {
        if r.contended() {
            v.warnings.push(format!(
                "the {which} point ran while other processes used {:.2} cores: its latencies \
                 describe a shared machine",
                r.other_cores.unwrap_or(f64::NAN)
            ));
        }
    }
    v
}

/// The verdicts as a Markdown table, with a one-line result.
pub fn markdown(verdicts: &[ServeVerdict], limits: &ServeLimits) -> String {
    let f = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.0} %", 100.0 * v));
    let mut s = String::from(
        "| scheme | load | prefix cache | goodput base | goodput now | SLO base | SLO now | TTFT p95 base ms | TTFT p95 now ms | TPOT p95 base ms | TPOT p95 now ms | result |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for v in verdicts {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.scheme,
            v.arrival,
            if v.prefix_caching { "on" } else { "off" },
            f(v.goodput.0, 2),
            f(v.goodput.1, 2),
            pct(v.slo.0),
            pct(v.slo.1),
            f(v.ttft_p95.0, 0),
            f(v.ttft_p95.1, 0),
            f(v.tpot_p95.0, 0),
            f(v.tpot_p95.1, 0),
            if v.passed() {
                "pass".to_string()
            } else {
                format!("**FAIL**: {}", v.failures.join("; "))
            }
        ));
    }
    for v in verdicts {
        for w in &v.warnings {
            s.push_str(&format!("\nwarning: {} {}: {w}", v.scheme, v.arrival));
        }
    }
    let lim = |x: Option<f64>, u: &str| x.map_or("unchecked".to_string(), |v| format!("{v}{u}"));
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    s.push_str(&format!(
        "\n\nLimits: goodput −{}, SLO attainment −{}, TTFT p95 +{}, TPOT p95 +{}. {}\n",
        lim(limits.max_goodput_drop_pct, "%"),
        lim(limits.max_slo_drop_pp, " points"),
        lim(limits.max_ttft_regression_pct, "%"),
        lim(limits.max_tpot_regression_pct, "%"),
        if failed == 0 {
            format!("All {} points pass.", verdicts.len())
        } else {
            format!("{failed} of {} points regress.", verdicts.len())
        }
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::sweep::PointStatus;

    fn row(scheme: &str, goodput: f64, slo: f64, ttft: f64, tpot: f64) -> ServeRow {
        let mut r = ServeRow {
            scheme: scheme.into(),
            arrival: "poisson 2 req/s".into(),
            status: PointStatus::Ok,
            ..Default::default()
        };
        r.stats.goodput = Some(goodput);
        r.stats.slo_attainment = slo;
        r.stats.ttft_ms.p95 = Some(ttft);
        r.stats.tpot_ms.p95 = Some(tpot);
        r
    }

    fn results(rows: Vec<ServeRow>) -> ServeResults {
        ServeResults {
            path: "x".into(),
            rows,
        }
    }

    /// By hand: goodput 2.0 → 1.7 is −15 % (fails a 10 % limit, passes 20 %); SLO 0.9 → 0.8 is
    /// −10 points; TTFT p95 100 → 130 ms is +30 %; a point failed now, or missing, fails.
    #[test]
    fn serving_regressions_by_hand() {
        let base = results(vec![
            row("fp16", 2.0, 0.9, 100.0, 50.0),
            row("int4", 2.0, 0.9, 100.0, 50.0),
        ]);
        let mut failed = row("int4", 0.0, 0.0, 1.0, 1.0);
        failed.stats = Default::default();
        failed.status = PointStatus::Error("boom".into());
        let now = results(vec![row("fp16", 1.7, 0.8, 130.0, 50.0), failed]);
        let lim = ServeLimits {
            max_goodput_drop_pct: Some(10.0),
            ..Default::default()
        };
        let v = compare(&base, &now, &lim).unwrap();
        assert!(
            v[0].failures[0].contains("goodput −15.0%"),
            "{:?}",
            v[0].failures
        );
        assert!(
            v[1].failures[0].contains("now error: boom"),
            "{:?}",
            v[1].failures
        );
        let lim = ServeLimits {
            max_goodput_drop_pct: Some(20.0),
            max_slo_drop_pp: Some(10.5),
            max_ttft_regression_pct: Some(31.0),
            max_tpot_regression_pct: Some(0.0),
        };
        assert!(compare(&base, &now, &lim).unwrap()[0].passed());
        let lim = ServeLimits {
            max_slo_drop_pp: Some(9.5),
            max_ttft_regression_pct: Some(29.0),
            ..Default::default()
        };
        let v = compare(&base, &now, &lim).unwrap();
        assert_eq!(v[0].failures.len(), 2, "{:?}", v[0].failures);
        let v = compare(&base, &results(vec![]), &lim).unwrap();
        assert!(v
            .iter()
            .all(|v| v.failures == ["missing from the current results"]));
        assert!(compare(&base, &now, &ServeLimits::default()).is_err());
        assert!(
            markdown(&v, &lim).contains("0 of 2 points")
                || markdown(&v, &lim).contains("2 of 2 points regress")
        );
    }
}
