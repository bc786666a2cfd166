//! `kvbench gate`: compare a run's results with a baseline's, point by point, against limits on
//! perplexity change, KL-divergence increase and TPOT regression — a CI regression gate.
//!
//! Points match by (`scheme`, `batch_size`, `seq_len`). Each results file is read into typed
//! rows ([`ResultRow`]), but only the columns the gate uses are read, each found by its name in
//! the header ([`COLUMNS`]): a baseline written by an older kvbench works as long as it has the
//! columns a limit needs, whatever its other columns hold. The limits are a table too
//! ([`METRICS`]): the column, the typed field and how a change is measured.

use std::path::{Path, PathBuf};

use super::ResultRow;
use crate::error::{Error, Result};
use crate::quality::paired;

/// The limits; `None` leaves a metric unchecked.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Limits {
    /// Largest allowed perplexity increase against the baseline's same scheme, % (relative).
    pub max_ppl_delta_pct: Option<f64>,
    /// Largest allowed increase of mean KL(P_fp16 ‖ P_scheme) against the baseline's, nats.
    pub max_kl: Option<f64>,
    /// Largest allowed TPOT increase against the baseline's, % (relative).
    pub max_tpot_regression_pct: Option<f64>,
    /// `--significant`: a perplexity regression fails only when it lies outside the current
    /// run's paired 95 % interval — the lower end of the scheme's ΔPPL-vs-fp16 interval
    /// (`delta_ppl_pct_lo`) minus the baseline's ΔPPL (`ppl_delta_pct`) exceeds the limit
    /// (the baseline treated as fixed; [`crate::quality::paired::PairedDelta::significantly_above`]
    /// on the shifted interval). The fp16 rows pair with themselves (a zero-width interval), so
    /// they keep the plain check.
    pub significant: bool,
}

/// A numeric column the gate reads into [`ResultRow`]: its name in `results.csv`, the typed
/// field it fills, and the values it accepts (anything else is refused naming the file, line
/// and text: NaN, infinite or negative values would otherwise pass any limit).
#[derive(Clone, Copy)]
pub struct Column {
    /// Column name (one of [`super::CSV_COLUMNS`]).
    pub name: &'static str,
    /// Stores an accepted value in its typed field.
    pub set: fn(&mut ResultRow, f64),
    /// Whether a finite value is in range.
    pub accepts: fn(f64) -> bool,
    /// The range, for the message.
    pub range: &'static str,
}

/// The numeric columns the gate reads besides the point's key (`scheme`, `batch_size`,
/// `seq_len`), each parsed as a number (so `ppl_windows` may be written `1e18`; it saturates).
pub const COLUMNS: [Column; 7] = [
    Column {
        name: "ppl",
        set: |r, v| r.ppl = Some(v),
        // e^(mean NLL ≥ 0)
        accepts: |v| v >= 1.0,
        range: "≥ 1",
    },
    Column {
        name: "kl_mean",
        set: |r, v| r.kl_mean = Some(v),
        accepts: |v| v >= 0.0,
        range: "≥ 0",
    },
    Column {
        name: "tpot_ms_mean",
        set: |r, v| r.tpot.mean = Some(v),
        accepts: |v| v > 0.0,
        range: "> 0",
    },
    Column {
        name: "ppl_delta_pct",
        set: |r, v| r.ppl_delta_pct = Some(v),
        accepts: |_| true,
        range: "(any sign)",
    },
    Column {
        name: "delta_ppl_pct_lo",
        set: |r, v| r.delta_ppl_pct_lo = Some(v),
        accepts: |_| true,
        range: "(any sign)",
    },
    Column {
        name: "delta_ppl_pct_hi",
        set: |r, v| r.delta_ppl_pct_hi = Some(v),
        accepts: |_| true,
        range: "(any sign)",
    },
    Column {
        name: "ppl_windows",
        set: |r, v| r.ppl_windows = Some(v as usize),
        accepts: |v| v >= 1.0,
        range: "≥ 1",
    },
];

/// How a metric's change from baseline `b` to current `c` is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// `100·(c/b − 1)`, %.
    RelativePct,
    /// `c − b`, in the unit given (with its leading space).
    Absolute(&'static str),
}

impl Change {
    fn of(self, b: f64, c: f64) -> f64 {
        match self {
            Change::RelativePct => 100.0 * (c / b - 1.0),
            Change::Absolute(_) => c - b,
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Change::RelativePct => "%",
            Change::Absolute(u) => u,
        }
    }
}

/// A metric a limit bounds: the flag, the column a file must have for it, the typed field it
/// reads, how a change is measured, and how the value is measured (for the message when no
/// compared point has it).
#[derive(Clone, Copy)]
pub struct Metric {
    /// The `kvbench gate` flag that sets the limit.
    pub flag: &'static str,
    /// Its column in `results.csv`.
    pub column: &'static str,
    /// Its name in a failure (`perplexity +2.0000% > 1%`).
    pub label: &'static str,
    /// The typed field.
    pub value: fn(&ResultRow) -> Option<f64>,
    /// The limit on it.
    pub limit: fn(&Limits) -> Option<f64>,
    /// How its change is measured.
    pub change: Change,
    /// How to get a value measured.
    pub how_to_measure: &'static str,
}

/// Perplexity (`--max-ppl-delta`).
pub const PPL: Metric = Metric {
    flag: "--max-ppl-delta",
    column: "ppl",
    label: "perplexity",
    value: |r| r.ppl,
    limit: |l| l.max_ppl_delta_pct,
    change: Change::RelativePct,
    how_to_measure: "perplexity is measured by a model sweep with --ppl-windows N (N ≥ 1, 2 or \
                     more for its interval; a --synthetic sweep or --ppl-windows 0 measures none)",
};

/// Mean KL vs fp16 (`--max-kl`).
pub const KL: Metric = Metric {
    flag: "--max-kl",
    column: "kl_mean",
    label: "KL",
    value: |r| r.kl_mean,
    limit: |l| l.max_kl,
    change: Change::Absolute(" nats"),
    how_to_measure: "KL vs fp16 is measured in the perplexity pass of a model sweep: run it with \
                     --ppl-windows N (N ≥ 1) and without --no-kl (a --synthetic sweep measures \
                     none; fp16 itself has none)",
};

/// Mean TPOT (`--max-tpot-regression`).
pub const TPOT: Metric = Metric {
    flag: "--max-tpot-regression",
    column: "tpot_ms_mean",
    label: "TPOT",
    value: |r| r.tpot.mean,
    limit: |l| l.max_tpot_regression_pct,
    change: Change::RelativePct,
    how_to_measure: "TPOT is measured at every sweep point that finishes (status `ok`): re-run \
                     the points that failed",
};

/// The metrics, in the order their failures are listed.
pub const METRICS: [Metric; 3] = [PPL, KL, TPOT];

/// One results file: its header, and its records as text until [`compare`] reads them into
/// typed rows.
#[derive(Debug, Clone)]
pub struct Results {
    /// Where it came from.
    pub path: PathBuf,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Results {
    /// Reads `path`: a `results.csv`, or a run folder holding one. Errors:
    /// [`Error::InvalidArgument`] naming the path when it cannot be read as CSV.
    pub fn read(path: &Path) -> Result<Results> {
        let file = if path.is_dir() {
            path.join(super::CSV_FILE)
        } else {
            path.to_path_buf()
        };
        let f = crate::util::open_regular(&file).map_err(|e| Error::InvalidArgument {
            name: file.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_reader(&file, f)
    }

    /// Reads results CSV text from `reader` (`file` names it in errors). Errors: as
    /// [`Results::read`].
    pub fn from_reader(file: &Path, reader: impl std::io::Read) -> Result<Results> {
        let bad = |reason: String| Error::InvalidArgument {
            name: file.display().to_string(),
            reason,
        };
        let mut r = csv::Reader::from_reader(reader);
        let header: Vec<String> = r
            .headers()
            .map_err(|e| bad(e.to_string()))?
            .iter()
            .map(str::to_string)
            .collect();
        let rows = r
            .records()
            .map(|rec| {
                rec.map(|x| x.iter().map(str::to_string).collect())
                    .map_err(|e| bad(e.to_string()))
            })
            .collect::<Result<Vec<Vec<String>>>>()?;
        Ok(Results {
            path: file.to_path_buf(),
            header,
            rows,
        })
    }

    fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// Fails with [`Error::InvalidArgument`] naming the file and the columns it lacks.
    fn require(&self, cols: &[&str]) -> Result<()> {
        let missing: Vec<&str> = cols
            .iter()
            .copied()
            .filter(|c| self.col(c).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            name: self.path.display().to_string(),
            reason: format!(
                "has no column {} (needed by the limits given); is it a kvbench results.csv?",
                missing.join(", ")
            ),
        })
    }

    /// The records as typed rows: the key and the [`COLUMNS`] read, every other field at its
    /// default. An empty cell is a value not measured (`None`). Errors:
    /// [`Error::InvalidArgument`] naming the file, line and value when a point appears twice
    /// (which row is meant is unknown), `batch_size` or `seq_len` is not a whole number, a
    /// value is not a finite number in its column's range, `contended` is not empty, `true` or
    /// `false`, or `delta_ppl_pct_lo` exceeds `delta_ppl_pct_hi`.
    pub fn rows(&self) -> Result<Vec<ResultRow>> {
        let (s, b, l) = (
            self.col("scheme"),
            self.col("batch_size"),
            self.col("seq_len"),
        );
        let columns: Vec<(Column, Option<usize>)> =
            COLUMNS.iter().map(|c| (*c, self.col(c.name))).collect();
        let contended = self.col("contended");
        let mut out: Vec<ResultRow> = Vec::new();
        for (i, cells) in self.rows.iter().enumerate() {
            let bad = |reason: String| Error::InvalidArgument {
                name: format!("{}:{}", self.path.display(), i + 2),
                reason,
            };
            let cell = |c: Option<usize>| c.and_then(|c| cells.get(c)).map_or("", |t| t.as_str());
            let count = |name: &str, c: Option<usize>| {
                let text = cell(c);
                text.trim().parse::<usize>().map_err(|_| {
                    bad(format!(
                        "{name} `{text}` is not a whole number; fix or re-create the results file"
                    ))
                })
            };
            let mut row = ResultRow {
                scheme: cell(s).to_string(),
                batch_size: count("batch_size", b)?,
                seq_len: count("seq_len", l)?,
                ..Default::default()
            };
            if out.iter().any(|r| key(r) == key(&row)) {
                return Err(bad(format!(
                    "point {} appears twice; a results file holds each point once (was a run \
                     folder reused?)",
                    name(&row)
                )));
            }
            for (c, j) in &columns {
                let text = cell(*j);
                if text.trim().is_empty() {
                    continue;
                }
                match text.trim().parse::<f64>() {
                    Ok(v) if v.is_finite() && (c.accepts)(v) => (c.set)(&mut row, v),
                    _ => {
                        return Err(bad(format!(
                            "{} `{text}` is not a finite number {}; fix or re-create the \
                             results file",
                            c.name, c.range
                        )))
                    }
                }
            }
            row.contended = match cell(contended).trim() {
                "" => None,
                "true" => Some(true),
                "false" => Some(false),
                other => {
                    return Err(bad(format!(
                        "contended `{other}` is not true or false; fix or re-create the results \
                         file"
                    )))
                }
            };
            if let (Some(lo), Some(hi)) = (row.delta_ppl_pct_lo, row.delta_ppl_pct_hi) {
                if lo > hi {
                    return Err(bad(format!(
                        "delta_ppl_pct_lo {lo} is above delta_ppl_pct_hi {hi}: not an interval; \
                         fix or re-create the results file"
                    )));
                }
            }
            out.push(row);
        }
        Ok(out)
    }
}

/// A point's key: what matches a baseline point with a current one.
fn key(r: &ResultRow) -> (&str, usize, usize) {
    (&r.scheme, r.batch_size, r.seq_len)
}

/// A point's name in messages: `int4 b1 s64`.
fn name(r: &ResultRow) -> String {
    format!("{} b{} s{}", r.scheme, r.batch_size, r.seq_len)
}

/// A limit that no compared point can be checked against (every baseline point lacks
/// the value, or every current one does) would pass or fail every point by default — an empty
/// `ppl` column passed "All points pass". Errors: [`Error::InvalidArgument`] naming the limit,
/// the file(s) without a value and how to measure it.
fn check_measured(
    m: &Metric,
    (baseline, current): (&Results, &Results),
    pairs: &[(&ResultRow, Option<&ResultRow>)],
) -> Result<()> {
    let compared = || pairs.iter().filter_map(|(b, c)| c.map(|c| (*b, c)));
    let has = |r: &ResultRow| (m.value)(r).is_some();
    if compared().any(|(b, c)| has(b) && has(c)) {
        return Ok(());
    }
    let base_has = compared().any(|(b, _)| has(b));
    let cur_has = compared().any(|(_, c)| has(c));
    let col = m.column;
    let lacking = match (base_has, cur_has) {
        (false, false) if baseline.path == current.path => format!(
            "{} (both --baseline and --current) has no `{col}` value at any point",
            baseline.path.display()
        ),
        (false, false) => format!(
            "neither {} nor {} has a `{col}` value at any compared point",
            baseline.path.display(),
            current.path.display()
        ),
        (false, true) => format!(
            "{} (--baseline) has no `{col}` value at any compared point",
            baseline.path.display()
        ),
        (true, false) => format!(
            "{} (--current) has no `{col}` value at any compared point",
            current.path.display()
        ),
        // Both have values, never at the same point.
        (true, true) => format!(
            "{} and {} have `{col}` values at different points only",
            baseline.path.display(),
            current.path.display()
        ),
    };
    Err(Error::InvalidArgument {
        name: m.flag.into(),
        reason: format!(
            "{lacking}, so the limit checks nothing; {}. Or drop {}",
            m.how_to_measure, m.flag
        ),
    })
}

/// One compared point (`--format json` writes it as is: each pair as `[baseline, current]`,
/// the baseline being the `--vs` scheme's point when gating within one run).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verdict {
    /// Scheme spec.
    pub scheme: String,
    /// Batch size.
    pub batch: usize,
    /// Prompt length, tokens.
    pub seq_len: usize,
    /// `(baseline, current)` perplexity.
    pub ppl: (Option<f64>, Option<f64>),
    /// `(baseline, current)` mean KL vs fp16, nats.
    pub kl: (Option<f64>, Option<f64>),
    /// `(baseline, current)` mean TPOT, ms.
    pub tpot: (Option<f64>, Option<f64>),
    /// Why this point fails; empty when it passes.
    pub failures: Vec<String>,
    /// What makes the verdict weak without failing it (too few perplexity windows for the
    /// limit: the interval is wider than the threshold; a timing measured while other work
    /// used the CPU, `contended`).
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Whether every checked limit holds.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Compares `current` with `baseline` under `limits`: one [`Verdict`] per baseline point (a
/// baseline point missing from the current results fails). Errors: [`Error::InvalidArgument`]
/// when a file lacks a column a limit needs, when a value is unusable ([`Results::rows`]), when
/// no point matches (naming both files' points), or when a limit has no compared point with its
/// value in both files (naming the limit, the file without it and how to measure it).
pub fn compare(baseline: &Results, current: &Results, limits: &Limits) -> Result<Vec<Verdict>> {
    let checked = checked_metrics(limits);
    require_columns(baseline, current, &checked, limits)?;
    let base = baseline.rows()?;
    let cur = current.rows()?;
    let pairs: Vec<(&ResultRow, Option<&ResultRow>)> = base
        .iter()
        .map(|b| (b, cur.iter().find(|c| key(c) == key(b))))
        .collect();
    if pairs.iter().all(|(_, c)| c.is_none()) {
        let list = |rows: &[ResultRow]| rows.iter().map(name).collect::<Vec<_>>().join(", ");
        return Err(Error::InvalidArgument {
            name: "--current".into(),
            reason: format!(
                "no point of {} matches one of {} (by scheme, batch_size, seq_len): baseline has [{}], current has [{}]",
                current.path.display(),
                baseline.path.display(),
                list(&base),
                list(&cur)
            ),
        });
    }
    for m in &checked {
        check_measured(m, (baseline, current), &pairs)?;
    }
    Ok(pairs
        .into_iter()
        .map(|(b, c)| verdict(b, c, limits))
        .collect())
}

/// The metrics `limits` checks, in [`METRICS`] order.
fn checked_metrics(limits: &Limits) -> Vec<&'static Metric> {
    METRICS
        .iter()
        .filter(|m| (m.limit)(limits).is_some())
        .collect()
}

/// Fails with [`Error::InvalidArgument`] when either file lacks a column `checked` needs, or
/// `--significant` is given without a perplexity limit or without the interval columns.
fn require_columns(
    baseline: &Results,
    current: &Results,
    checked: &[&Metric],
    limits: &Limits,
) -> Result<()> {
    let mut cols = vec!["scheme", "batch_size", "seq_len"];
    cols.extend(checked.iter().map(|m| m.column));
    baseline.require(&cols)?;
    current.require(&cols)?;
    if limits.significant {
        if limits.max_ppl_delta_pct.is_none() {
            return Err(Error::InvalidArgument {
                name: "--significant".into(),
                reason: "it qualifies the perplexity limit; pass --max-ppl-delta too".into(),
            });
        }
        baseline.require(&["ppl_delta_pct"])?;
        current
            .require(&["delta_ppl_pct_lo", "delta_ppl_pct_hi"])
            .map_err(|e| Error::InvalidArgument {
                name: "--significant".into(),
                reason: format!(
                    "{e}; the current results have no paired ΔPPL interval (written by a \
                     kvbench before it, or with fewer than 2 perplexity windows): re-run the sweep \
                     with --ppl-windows 2 or more, or drop --significant"
                ),
            })?;
    }
    Ok(())
}

/// A scheme name as kvbench prints it (`int8` → `int8-token`, vLLM's `auto` → `fp16`); a name
/// that does not parse is kept as written.
pub fn canonical_scheme(name: &str) -> String {
    name.parse::<crate::kv::KvScheme>()
        .map_or_else(|_| name.trim().to_string(), |s| s.to_string())
}

impl Results {
    /// These results with only the rows whose scheme is one of `schemes` (compared by
    /// [`canonical_scheme`], so `int8` selects `int8-token`). Errors:
    /// [`Error::InvalidArgument`] naming `flag` and the scheme when one of `schemes` has no row,
    /// listing the schemes the file has.
    pub fn only_schemes(&self, schemes: &[String], flag: &str) -> Result<Results> {
        let Some(col) = self.col("scheme") else {
            self.require(&["scheme"])?;
            unreachable!("require fails without the column")
        };
        let wanted: Vec<String> = schemes.iter().map(|s| canonical_scheme(s)).collect();
        let of = |cells: &Vec<String>| canonical_scheme(cells.get(col).map_or("", |c| c.as_str()));
        let mut have: Vec<String> = self.rows.iter().map(of).collect();
        if let Some(missing) = wanted.iter().find(|w| !have.contains(w)) {
            have.dedup();
            return Err(Error::InvalidArgument {
                name: flag.into(),
                reason: format!(
                    "{} has no `{missing}` point; its schemes are {}",
                    self.path.display(),
                    have.join(", ")
                ),
            });
        }
        Ok(Results {
            path: self.path.clone(),
            header: self.header.clone(),
            rows: self
                .rows
                .iter()
                .filter(|r| wanted.contains(&of(r)))
                .cloned()
                .collect(),
        })
    }
}

/// Gates each scheme of one run against the scheme `vs` of the same run, at the same batch
/// size and prompt length: perplexity and TPOT as relative changes from `vs`'s, KL as the
/// increase over `vs`'s (fp16's KL vs itself is 0 by definition, so with `vs` = fp16 the KL
/// limit bounds each scheme's mean KL). One [`Verdict`] per point of a scheme other than `vs`,
/// its baseline values being `vs`'s; a point without a `vs` point beside it fails.
/// `limits.significant` uses the run's paired ΔPPL interval (`delta_ppl_pct_lo/_hi`, relative
/// to fp16), so it needs `vs` = fp16. Errors: [`Error::InvalidArgument`] as [`compare`], and
/// naming `--vs` when the run has no `vs` point or nothing else to compare, or when
/// `--significant` is given with `vs` other than fp16.
pub fn compare_within(current: &Results, vs: &str, limits: &Limits) -> Result<Vec<Verdict>> {
    let vs = canonical_scheme(vs);
    let checked = checked_metrics(limits);
    require_columns(current, current, &checked, limits)?;
    if limits.significant && vs != "fp16" {
        return Err(Error::InvalidArgument {
            name: "--significant".into(),
            reason: format!(
                "the run's paired ΔPPL interval (delta_ppl_pct_lo/_hi) is relative to fp16, not \
                 `{vs}`: use --vs fp16 with --significant, or drop --significant"
            ),
        });
    }
    let rows = current.rows()?;
    let is_vs = |r: &ResultRow| canonical_scheme(&r.scheme) == vs;
    let mut schemes: Vec<String> = rows.iter().map(|r| r.scheme.clone()).collect();
    schemes.dedup();
    if !rows.iter().any(is_vs) || rows.iter().all(is_vs) {
        let what = match rows.iter().any(is_vs) {
            false => format!("has no `{vs}` point to compare with"),
            true => format!("has no scheme besides `{vs}` to compare"),
        };
        return Err(Error::InvalidArgument {
            name: "--vs".into(),
            reason: format!(
                "{} {what}; its schemes are {}",
                current.path.display(),
                schemes.join(", ")
            ),
        });
    }
    // `vs`'s point under each compared point's name, so the verdict names the scheme.
    let mut bases: Vec<ResultRow> = Vec::new();
    let mut orphans: Vec<&ResultRow> = Vec::new();
    let mut compared: Vec<&ResultRow> = Vec::new();
    for c in rows.iter().filter(|r| !is_vs(r)) {
        let Some(r) = rows
            .iter()
            .find(|r| is_vs(r) && (r.batch_size, r.seq_len) == (c.batch_size, c.seq_len))
        else {
            orphans.push(c);
            continue;
        };
        let mut b = r.clone();
        b.scheme = c.scheme.clone();
        if vs == "fp16" {
            b.kl_mean = b.kl_mean.or(Some(0.0));
            b.ppl_delta_pct = b.ppl_delta_pct.or(Some(0.0));
        }
        bases.push(b);
        compared.push(c);
    }
    let pairs: Vec<(&ResultRow, Option<&ResultRow>)> = bases
        .iter()
        .zip(compared.iter().map(|c| Some(*c)))
        .collect();
    if !pairs.is_empty() {
        for m in &checked {
            check_measured(m, (current, current), &pairs)?;
        }
    }
    let mut out: Vec<Verdict> = pairs
        .into_iter()
        .map(|(b, c)| verdict(b, c, limits))
        .collect();
    for c in orphans {
        let mut v = verdict(c, None, &Limits::default());
        v.failures = vec![format!(
            "no `{vs}` point at batch {} and seq_len {} in this run to compare with",
            c.batch_size, c.seq_len
        )];
        (v.ppl, v.kl, v.tpot) = ((None, v.ppl.0), (None, v.kl.0), (None, v.tpot.0));
        out.push(v);
    }
    Ok(out)
}

/// The `meta.json` settings that define what a sweep measures (`settings.<key>`): perplexity
/// windows, context, scoring, generated tokens, and the weight types of decode, prefill and
/// perplexity. Two runs that differ in one measure different things.
pub const PROTOCOL_KEYS: [&str; 7] = [
    "ppl-windows",
    "ctx",
    "ppl-score",
    "gen",
    "weights",
    "prefill-weights",
    "ppl-weights",
];

/// How the protocols of two run folders differ, one line per difference naming both values:
/// each of [`PROTOCOL_KEYS`] recorded in both `meta.json` files, and the model files' sha256
/// (`model.sha256`, or format 1 serve folders' `model_sha256`). Empty when they agree, or when
/// either side is not a folder with a `meta.json` (a results.csv records no protocol). Errors:
/// [`Error::InvalidArgument`] when a `meta.json` exists but cannot be read.
pub fn protocol_differences(baseline: &Path, current: &Path) -> Result<Vec<String>> {
    let meta = |p: &Path| p.join(super::META_FILE);
    if !(meta(baseline).is_file() && meta(current).is_file()) {
        return Ok(Vec::new());
    }
    let (b, c) = (
        super::meta::read_value(&meta(baseline))?,
        super::meta::read_value(&meta(current))?,
    );
    let mut out = Vec::new();
    let mut differ = |what: &str, x: &serde_json::Value, y: &serde_json::Value| {
        if !x.is_null() && !y.is_null() && x != y {
            out.push(format!("{what}: {x} (--baseline) vs {y} (--current)"));
        }
    };
    for key in PROTOCOL_KEYS {
        differ(key, &b["settings"][key], &c["settings"][key]);
    }
    let sha = |m: &serde_json::Value| match &m["model"]["sha256"] {
        serde_json::Value::Null => m["model_sha256"].clone(),
        v => v.clone(),
    };
    differ("model sha256", &sha(&b), &sha(&c));
    Ok(out)
}

/// The verdict on baseline point `b` and its current point `c` (`None`: missing, a failure).
fn verdict(b: &ResultRow, c: Option<&ResultRow>, limits: &Limits) -> Verdict {
    let pair = |m: &Metric| ((m.value)(b), c.and_then(m.value));
    let mut v = Verdict {
        scheme: b.scheme.clone(),
        batch: b.batch_size,
        seq_len: b.seq_len,
        ppl: pair(&PPL),
        kl: pair(&KL),
        tpot: pair(&TPOT),
        failures: Vec::new(),
        warnings: Vec::new(),
    };
    let Some(c) = c else {
        v.failures.push("missing from the current results".into());
        return v;
    };
    for m in &METRICS {
        let Some(limit) = (m.limit)(limits) else {
            continue;
        };
        let unit = m.change.unit();
        match pair(m) {
            (Some(b), Some(c)) => {
                let d = m.change.of(b, c);
                if d.is_nan() || d > limit {
                    v.failures
                        .push(format!("{} {d:+.4}{unit} > {limit}{unit}", m.label));
                }
            }
            (Some(_), None) => v.failures.push(format!("{} not measured", m.label)),
            (None, _) => {}
        }
    }
    if limits.max_tpot_regression_pct.is_some() {
        let busy: Vec<&str> = [("baseline", b), ("current", c)]
            .into_iter()
            .filter(|(_, r)| r.contended == Some(true))
            .map(|(side, _)| side)
            .collect();
        if !busy.is_empty() {
            v.warnings.push(format!(
                "TPOT of the {} point was measured while other work used the CPU \
                 (contended = true): re-run it on a quiet machine before trusting the TPOT check",
                busy.join(" and the ")
            ));
        }
    }
    let interval = c.delta_ppl_pct_lo.zip(c.delta_ppl_pct_hi);
    if let (Some(max), Some((lo, hi))) = (limits.max_ppl_delta_pct, interval) {
        let n = c.ppl_windows.unwrap_or(0);
        if let Some(w) = paired::too_few_windows(n, 0.5 * (hi - lo), max) {
            v.warnings.push(w);
        }
        let zero_width = hi - lo <= 0.0;
        let is_ppl = |f: &String| f.starts_with("perplexity ") && !f.ends_with("not measured");
        if limits.significant && !zero_width && v.failures.iter().any(is_ppl) {
            // Keep the perplexity failure only beyond doubt.
            let base_delta = b.ppl_delta_pct.unwrap_or(0.0);
            let lower = lo - base_delta;
            if lower <= max {
                v.warnings.push(format!(
                    "perplexity change not significant: ΔPPL vs fp16 interval [{lo:+.2}, \
                     {hi:+.2}] % against the baseline's {base_delta:+.2} % reaches only \
                     {lower:+.2} points at its lower end (limit {max})"
                ));
                v.failures.retain(|f| !is_ppl(f));
            }
        }
    }
    v
}

/// The verdicts as a Markdown table (fit for a CI step summary), with a one-line result.
pub fn markdown(verdicts: &[Verdict], limits: &Limits) -> String {
    let f = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
    let pct = |(b, c): (Option<f64>, Option<f64>)| match (b, c) {
        (Some(b), Some(c)) => format!("{:+.2}%", 100.0 * (c / b - 1.0)),
        _ => "-".into(),
    };
    let mut s = String::from(
        "| scheme | batch | seq | PPL base | PPL now | ΔPPL | KL base | KL now | TPOT base ms | TPOT now ms | ΔTPOT | result |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for v in verdicts {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.scheme,
            v.batch,
            v.seq_len,
            f(v.ppl.0, 4),
            f(v.ppl.1, 4),
            pct(v.ppl),
            f(v.kl.0, 5),
            f(v.kl.1, 5),
            f(v.tpot.0, 2),
            f(v.tpot.1, 2),
            pct(v.tpot),
            if v.passed() {
                "pass".to_string()
            } else {
                format!("**FAIL**: {}", v.failures.join("; "))
            }
        ));
    }
    for v in verdicts {
        for w in &v.warnings {
            s.push_str(&format!(
                "\nwarning: {} b{} s{}: {w}",
                v.scheme, v.batch, v.seq_len
            ));
        }
    }
    if verdicts.iter().any(|v| !v.warnings.is_empty()) {
        s.push('\n');
    }
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    // `{}` prints 1e-300 as 300 digits.
    let short = |v: f64| {
        if v == 0.0 || (1e-4..1e6).contains(&v) {
            format!("{v}")
        } else {
            format!("{v:e}")
        }
    };
    let lim =
        |x: Option<f64>, u: &str| x.map_or("unchecked".into(), |v| format!("+{}{u}", short(v)));
    s.push_str(&format!(
        "\nLimits: perplexity {}, KL {}, TPOT {}. {}\n",
        lim(limits.max_ppl_delta_pct, "%"),
        lim(limits.max_kl, " nats"),
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

    fn results(name: &str, text: &str) -> Results {
        let p =
            std::env::temp_dir().join(format!("kvbench-gate-{}-{name}.csv", std::process::id()));
        std::fs::write(&p, text).unwrap();
        let r = Results::read(&p).unwrap();
        std::fs::remove_file(&p).ok();
        r
    }

    const BASE: &str = "scheme,batch_size,seq_len,ppl,kl_mean,tpot_ms_mean\n\
                        fp16,1,64,20.0,,10.0\n\
                        int4,1,64,21.0,0.05,10.0\n";

    /// Hand-made: int4's perplexity 21 → 21.42 is +2 % (limit 1 %); KL 0.05 → 0.055 is
    /// +0.005 (limit 0.01) and passes; fp16 unchanged passes.
    #[test]
    fn a_regression_fails_and_equal_passes() {
        let limits = Limits {
            max_ppl_delta_pct: Some(1.0),
            max_kl: Some(0.01),
            max_tpot_regression_pct: None,
            significant: false,
        };
        let base = results("base", BASE);
        let same = compare(&base, &results("same", BASE), &limits).unwrap();
        assert!(same.iter().all(Verdict::passed));
        let worse = results(
            "worse",
            "scheme,batch_size,seq_len,ppl,kl_mean,tpot_ms_mean\n\
             fp16,1,64,20.0,,30.0\n\
             int4,1,64,21.42,0.055,10.0\n",
        );
        let v = compare(&base, &worse, &limits).unwrap();
        assert!(v[0].passed(), "TPOT is unchecked");
        assert!(!v[1].passed());
        assert_eq!(v[1].failures.len(), 1, "{:?}", v[1].failures);
        assert!(
            v[1].failures[0].starts_with("perplexity +2.0000%"),
            "{:?}",
            v[1].failures
        );
        assert!(markdown(&v, &limits).contains("**FAIL**"));
    }

    /// A missing column and disjoint points are usage errors naming what is wrong.
    #[test]
    fn unusable_input_is_named() {
        let limits = Limits {
            max_ppl_delta_pct: Some(1.0),
            ..Default::default()
        };
        let base = results("b2", BASE);
        let no_ppl = results("noppl", "scheme,batch_size,seq_len\nfp16,1,64\n");
        let e = compare(&base, &no_ppl, &limits).unwrap_err().to_string();
        assert!(e.contains("ppl") && e.contains("noppl"), "{e}");
        let other = results("other", "scheme,batch_size,seq_len,ppl\nfp16,4,512,20\n");
        let e = compare(&base, &other, &limits).unwrap_err().to_string();
        assert!(
            e.contains("fp16 b1 s64") && e.contains("fp16 b4 s512"),
            "{e}"
        );
    }

    const SIG_BASE: &str = "scheme,batch_size,seq_len,ppl,ppl_delta_pct\n\
                            fp16,1,64,20.0,0.0\n\
                            q4_0,1,64,21.0,5.0\n\
                            int8,1,64,20.1,0.5\n";

    /// `--significant` by hand. Current: q4_0 21.0 → 21.63 is +3 % (limit 1 %) with its ΔPPL-vs-
    /// fp16 interval [7.5, 8.7] %: lower end 7.5 − baseline 5.0 = 2.5 > 1 → fails. int8 20.1 →
    /// 20.502 is +2 % but its interval [−1.0, 4.0] gives −1.0 − 0.5 = −1.5 ≤ 1 → passes with a
    /// note, and its half-width 2.5 % > 1 % warns: per-window SD 2.5·√8 / t₀.₉₇₅(7) = 2.5·2.828 /
    /// 2.3646 = 2.990 %, and the smallest m with t₀.₉₇₅(m−1)·2.990/√m ≤ 1 is 37 (t quantiles by
    /// Simpson integration of the t density in Python, independent of statrs). Without
    /// `--significant` both fail.
    #[test]
    fn significant_fails_only_beyond_the_interval() {
        let base = results("sigb", SIG_BASE);
        let cur = results(
            "sigc",
            "scheme,batch_size,seq_len,ppl,ppl_delta_pct,delta_ppl_pct_lo,delta_ppl_pct_hi,ppl_windows\n\
             fp16,1,64,20.0,0.0,0.0,0.0,8\n\
             q4_0,1,64,21.63,8.15,7.5,8.7,8\n\
             int8,1,64,20.502,2.51,-1.0,4.0,8\n",
        );
        let mut limits = Limits {
            max_ppl_delta_pct: Some(1.0),
            significant: true,
            ..Default::default()
        };
        let v = compare(&base, &cur, &limits).unwrap();
        assert!(v[0].passed());
        assert!(!v[1].passed(), "q4_0's regression is beyond its interval");
        assert!(v[2].passed(), "int8's is inside: {:?}", v[2].failures);
        assert!(
            v[2].warnings.iter().any(|w| w.contains("about 37 windows")),
            "{:?}",
            v[2].warnings
        );
        assert!(
            v[1].warnings.is_empty(),
            "±0.6 % resolves a 1 % limit: {:?}",
            v[1].warnings
        );
        assert!(markdown(&v, &limits).contains("warning: int8 b1 s64"));
        limits.significant = false;
        let v = compare(&base, &cur, &limits).unwrap();
        assert!(!v[1].passed() && !v[2].passed());
        // Still warned without --significant.
        assert!(v[2].warnings.iter().any(|w| w.contains("about 37 windows")));
    }

    /// `--significant` on results without the interval (an old run) is a clear error.
    #[test]
    fn significant_without_interval_columns_is_named() {
        let limits = Limits {
            max_ppl_delta_pct: Some(1.0),
            significant: true,
            ..Default::default()
        };
        let base = results("sigold", SIG_BASE);
        let e = compare(&base, &results("sigold2", SIG_BASE), &limits)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--significant") && e.contains("delta_ppl_pct_lo"),
            "{e}"
        );
        // The baseline itself need not have the interval (suites/baselines CSVs predate it).
        let only_limit = Limits {
            significant: false,
            ..limits
        };
        assert!(compare(&base, &results("sigold3", SIG_BASE), &only_limit).is_ok());
    }

    /// Issue 25: with `--max-ppl-delta` (or `--max-kl`) asked for but no compared point holding
    /// the value in both files, the gate said "All 1 points pass". Now a usage error names the
    /// limit, the file(s) without the value and `--ppl-windows`.
    #[test]
    fn gate_without_perplexity_in_either_file_is_unusable() {
        let empty = "scheme,batch_size,seq_len,ppl,kl_mean,tpot_ms_mean\nint4,1,64,,,10.0\n";
        let with = "scheme,batch_size,seq_len,ppl,kl_mean,tpot_ms_mean\nint4,1,64,21.0,0.05,10.0\n";
        let ppl = Limits {
            max_ppl_delta_pct: Some(1.0),
            ..Default::default()
        };
        let (a, b) = (results("emptya", empty), results("emptyb", empty));
        let e = compare(&a, &b, &ppl).unwrap_err();
        assert!(e.is_usage());
        let e = e.to_string();
        assert!(
            e.contains("--max-ppl-delta")
                && e.contains("neither")
                && e.contains("emptya")
                && e.contains("emptyb")
                && e.contains("`ppl`")
                && e.contains("--ppl-windows"),
            "{e}"
        );
        // Only the current run lacks it: that file is named, as the current one.
        let e = compare(&results("witha", with), &b, &ppl)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("emptyb") && e.contains("(--current)") && !e.contains("witha"),
            "{e}"
        );
        let kl = Limits {
            max_kl: Some(0.01),
            ..Default::default()
        };
        let e = compare(&results("withb", with), &a, &kl)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--max-kl") && e.contains("`kl_mean`") && e.contains("--no-kl"),
            "{e}"
        );
        // One compared point with the value in both files is enough: fp16's empty KL is normal.
        assert!(compare(&results("b3", BASE), &results("b4", BASE), &kl).is_ok());
        // TPOT present: a TPOT limit alone is usable on these files.
        let tpot = Limits {
            max_tpot_regression_pct: Some(10.0),
            ..Default::default()
        };
        assert!(compare(&a, &b, &tpot).unwrap().iter().all(Verdict::passed));
    }

    /// Issue 25: an interval of ±1e300 (with 2 windows, or with 1e300 windows) made the
    /// too-few-windows advice search without end; the verdict now comes back with a "more than"
    /// warning. An interval whose ends are swapped is not one: refused naming file and line.
    #[test]
    fn gate_huge_interval_or_window_count_answers() {
        let base = results("hugeb", "scheme,batch_size,seq_len,ppl\nint4,1,64,21.0\n");
        let limits = Limits {
            max_ppl_delta_pct: Some(1.0),
            ..Default::default()
        };
        for windows in ["2", "1e300"] {
            let cur = results(
                "hugec",
                &format!(
                    "scheme,batch_size,seq_len,ppl,delta_ppl_pct_lo,delta_ppl_pct_hi,ppl_windows\n\
                     int4,1,64,21.0,-1e300,1e300,{windows}\n"
                ),
            );
            let v = compare(&base, &cur, &limits).unwrap();
            assert!(v[0].passed(), "21.0 → 21.0 is +0 %");
            assert!(
                v[0].warnings
                    .iter()
                    .any(|w| w.contains("more than 1000000 windows") && w.contains("±1.00e300 %")),
                "{windows}: {:?}",
                v[0].warnings
            );
        }
        let swapped = results(
            "swapped",
            "scheme,batch_size,seq_len,ppl,delta_ppl_pct_lo,delta_ppl_pct_hi,ppl_windows\n\
             int4,1,64,21.0,3.0,-3.0,2\n",
        );
        let e = compare(&base, &swapped, &limits).unwrap_err().to_string();
        assert!(
            e.contains("swapped") && e.contains(":2") && e.contains("not an interval"),
            "{e}"
        );
    }

    /// The whole Markdown of a regression, by hand: fp16 20 → 20 (+0.00 %), TPOT 10 → 30
    /// (+200.00 %, unchecked); int4 21 → 21.42 is 100·(21.42/21 − 1) = +2.0000 % > 1 %, KL
    /// 0.05 → 0.055 (+0.005 ≤ 0.01).
    #[test]
    fn markdown_of_a_regression_by_hand() {
        let limits = Limits {
            max_ppl_delta_pct: Some(1.0),
            max_kl: Some(0.01),
            ..Default::default()
        };
        let worse = "scheme,batch_size,seq_len,ppl,kl_mean,tpot_ms_mean\n\
                     fp16,1,64,20.0,,30.0\n\
                     int4,1,64,21.42,0.055,10.0\n";
        let v = compare(&results("mdb", BASE), &results("mdc", worse), &limits).unwrap();
        assert_eq!(
            markdown(&v, &limits),
            "| scheme | batch | seq | PPL base | PPL now | ΔPPL | KL base | KL now | TPOT base ms \
             | TPOT now ms | ΔTPOT | result |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n\
             | fp16 | 1 | 64 | 20.0000 | 20.0000 | +0.00% | - | - | 10.00 | 30.00 | +200.00% | pass |\n\
             | int4 | 1 | 64 | 21.0000 | 21.4200 | +2.00% | 0.05000 | 0.05500 | 10.00 | 10.00 \
             | +0.00% | **FAIL**: perplexity +2.0000% > 1% |\n\
             \nLimits: perplexity +1%, KL +0.01 nats, TPOT unchecked. 1 of 2 points regress.\n"
        );
    }

    /// Each column the gate reads lands in the typed field of its name: a hand-written file
    /// with a value per column (and `tpot_ms_p50`, which the gate does not read) gives rows
    /// holding exactly those values; every name is a `results.csv` column.
    #[test]
    fn gate_columns_fill_their_typed_fields() {
        let r = results(
            "typed",
            "scheme,batch_size,seq_len,ppl,kl_mean,tpot_ms_mean,tpot_ms_p50,ppl_delta_pct,\
             delta_ppl_pct_lo,delta_ppl_pct_hi,ppl_windows\n\
             int4,4,512,21.5,0.25,12.5,9.0,-1.5,-3.0,2.0,1e18\n",
        );
        let rows = r.rows().unwrap();
        let row = &rows[0];
        assert_eq!(key(row), ("int4", 4, 512));
        assert_eq!((row.ppl, row.kl_mean), (Some(21.5), Some(0.25)));
        assert_eq!((row.tpot.mean, row.tpot.p50), (Some(12.5), None));
        assert_eq!(
            (
                row.ppl_delta_pct,
                row.delta_ppl_pct_lo,
                row.delta_ppl_pct_hi
            ),
            (Some(-1.5), Some(-3.0), Some(2.0))
        );
        assert_eq!(row.ppl_windows, Some(1e18 as usize));
        let got: Vec<Option<f64>> = METRICS.iter().map(|m| (m.value)(row)).collect();
        assert_eq!(got, [Some(21.5), Some(0.25), Some(12.5)]);
        for name in COLUMNS
            .iter()
            .map(|c| c.name)
            .chain(METRICS.iter().map(|m| m.column))
        {
            assert!(super::super::CSV_COLUMNS.contains(&name), "{name}");
        }
    }

    /// `batch_size` and `seq_len` are numbers: ` 1` and `1` are one point; a value that is no
    /// whole number is refused naming the file, line, column and text.
    #[test]
    fn point_keys_are_numbers() {
        let limits = Limits {
            max_ppl_delta_pct: Some(1.0),
            ..Default::default()
        };
        let base = results("keyb", "scheme,batch_size,seq_len,ppl\nint4,1,64,21.0\n");
        let spaced = results("keyc", "scheme,batch_size,seq_len,ppl\nint4, 1,64,21.0\n");
        assert!(compare(&base, &spaced, &limits).unwrap()[0].passed());
        let bad = results("keyx", "scheme,batch_size,seq_len,ppl\nint4,1,6x4,21.0\n");
        let e = compare(&base, &bad, &limits).unwrap_err();
        assert!(e.is_usage());
        let e = e.to_string();
        assert!(
            e.contains("keyx") && e.contains(":2") && e.contains("seq_len `6x4`"),
            "{e}"
        );
    }
}
