//! `kvbench report`: re-render run folders from their raw data, alone or side by side.

use std::path::PathBuf;

use crate::report::summary::{self, Run};
use crate::report::table;

/// Arguments of `kvbench report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Run folders written by `kvbench sweep` (each with meta.json and raw.jsonl).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,

    /// Output folder. Default: the run folder itself for one run; `reports/compare-<time>` for
    /// several.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Rebuilds rows from each folder's `raw.jsonl` (a folder given twice, under any spelling of its
/// path, once) and writes `results.csv`, `summary.md` and
/// `plots/` (one run: into its folder; several: side by side, one table per run, charts with a
/// series per run and scheme).
pub fn run(a: ReportArgs) -> anyhow::Result<()> {
    let runs = distinct(&a.runs)
        .iter()
        .map(|d| Run::read(d))
        .collect::<Result<Vec<_>, _>>()?;
    check_inputs(&a, &runs)?;
    let out = match (&a.out, runs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) => one.dir.clone(),
        (None, _) => {
            let t = crate::util::time::now_compact();
            PathBuf::from("reports").join(format!("compare-{t}"))
        }
    };
    crate::report::run_dir::create_out(&out)?;
    let rows: Vec<_> = runs.iter().flat_map(|r| r.rows.iter().cloned()).collect();
    let mut about = Vec::new();
    let mut captions = Vec::new();
    for r in &runs {
        if runs.len() > 1 {
            about.push(format!("**{}**", r.dir.display()));
        }
        about.extend(summary::about(r));
        captions.push(r.caption());
    }
    let dedup = |f: fn(&crate::report::plots::Caption) -> &String| {
        let mut v: Vec<&String> = captions.iter().map(f).collect();
        v.dedup();
        v.into_iter().cloned().collect::<Vec<_>>().join(" vs ")
    };
    let caption = crate::report::plots::Caption {
        model: dedup(|c| &c.model),
        machine: dedup(|c| &c.machine),
        settings: dedup(|c| &c.settings),
    };
    let title = if runs.len() > 1 {
        format!("kvbench: {} runs side by side", runs.len())
    } else {
        format!("kvbench sweep — {}", caption.model)
    };
    let multi = runs.len() > 1;
    let passkey: Vec<_> = runs
        .iter()
        .flat_map(|r| {
            r.passkey.iter().map(move |(n, p)| {
                let name = if multi {
                    format!(
                        "{} · {n}",
                        r.dir.file_name().map_or("".into(), |f| f.to_string_lossy())
                    )
                } else {
                    n.clone()
                };
                (name, p.clone())
            })
        })
        .collect();
    let path = summary::write_report(&out, &title, &about, &rows, &passkey, &caption)?;
    for r in &runs {
        if runs.len() > 1 {
            println!("{}", r.dir.display());
        }
        print!("{}", table::render(&r.rows));
    }
    for w in summary::warnings(&rows) {
        eprintln!("warning: {w}");
    }
    println!("wrote {} (results.csv, plots/)", path.display());
    Ok(())
}

/// `dirs` without repeats of one folder (compared by canonical path, so `run` and `./run/` are
/// one), keeping the first spelling; says on stderr which were dropped. Reporting a folder twice
/// doubled every row of the comparison.
fn distinct(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let key = |d: &PathBuf| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut out = Vec::new();
    let mut dropped = Vec::new();
    for d in dirs {
        let k = key(d);
        if seen.contains(&k) {
            dropped.push(d.display().to_string());
        } else {
            seen.push(k);
            out.push(d.clone());
        }
    }
    if !dropped.is_empty() {
        eprintln!(
            "note: {} given more than once; each run folder is reported once",
            dropped.join(", ")
        );
    }
    out
}

/// Refuses what would lose results: a run folder with no points in `raw.jsonl` (missing or
/// empty: re-rendering would overwrite `results.csv` with a header only), and, when several
/// folders are compared, an `--out` that is one of them (the comparison would overwrite that
/// run's files). Errors: [`crate::Error::InvalidArgument`] naming the folder.
fn check_inputs(a: &ReportArgs, runs: &[Run]) -> Result<(), crate::Error> {
    for r in runs {
        if r.rows.is_empty() {
            let raw = r.dir.join(crate::report::RAW_FILE);
            return Err(crate::Error::InvalidArgument {
                name: r.dir.display().to_string(),
                reason: format!(
                    "{} is {}: no finished point to report (its results.csv is left as it is); \
                     finish the run with `kvbench sweep --resume {}`",
                    raw.display(),
                    if raw.exists() { "empty" } else { "missing" },
                    r.dir.display()
                ),
            });
        }
    }
    if let (Some(out), true) = (&a.out, runs.len() > 1) {
        let same =
            |p: &std::path::Path| match (std::fs::canonicalize(p), std::fs::canonicalize(out)) {
                (Ok(x), Ok(y)) => x == y,
                _ => p == out,
            };
        if let Some(r) = runs.iter().find(|r| same(&r.dir)) {
            return Err(crate::Error::InvalidArgument {
                name: "--out".into(),
                reason: format!(
                    "{} is one of the runs being compared; writing the comparison there would \
                     overwrite its results. Pass another --out (default: reports/compare-<time>)",
                    r.dir.display()
                ),
            });
        }
    }
    Ok(())
}
