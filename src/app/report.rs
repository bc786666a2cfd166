//! `kvbench report` end to end: run folders of any kind re-rendered from their raw data
//! (`raw.jsonl`), alone into their own folder or side by side into a comparison folder.

use std::path::{Path, PathBuf};

use crate::report::meta::{self, RunKind};
use crate::report::serve::{self as serve_report, ServeRun};
use crate::report::summary::{self, Run};
use crate::report::table;

/// Re-renders the run folders `dirs` (a folder given twice, under any spelling of its path,
/// once): one folder into itself (or `out`), several side by side into `out` (default
/// `reports/compare-<time>`). Sweep and serve folders are each rendered by their own report;
/// several folders must be of one kind. Errors: [`crate::Error::InvalidArgument`] (exit 2) for
/// a folder that is not a run folder, has no finished point, or is of another kind than the
/// others, and for an `out` that is one of the compared folders; the renderers' I/O errors.
///
/// `labels` name the runs in order (empty: the folder names; otherwise exactly one per
/// folder, else [`crate::Error::InvalidArgument`] naming `--label`).
pub fn run(dirs: &[PathBuf], out: Option<&Path>, labels: &[String]) -> anyhow::Result<()> {
    let dirs = distinct(dirs);
    check_out(&dirs, out)?;
    let labels = run_labels(&dirs, labels)?;
    let mut kinds = Vec::new();
    for d in &dirs {
        let value = meta::read_value(&d.join(crate::report::META_FILE))?;
        kinds.push(RunKind::of(&value));
    }
    match kinds.as_slice() {
        k if k.iter().all(|k| *k == RunKind::Sweep) => sweeps(&dirs, out, &labels),
        k if k.iter().all(|k| *k == RunKind::Serve) => serves(&dirs, out, &labels),
        _ => Err(crate::Error::InvalidArgument {
            name: "kvbench report".into(),
            reason: format!(
                "{} mixes sweep and serve folders ({}); report each kind on its own",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                kinds
                    .iter()
                    .map(|k| k.command())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
        .into()),
    }
}

/// The runs' names: `given` (one per folder) or the folder names.
fn run_labels(dirs: &[PathBuf], given: &[String]) -> Result<Vec<String>, crate::Error> {
    if given.is_empty() {
        return Ok(dirs
            .iter()
            .map(|d| {
                d.file_name().map_or(d.display().to_string(), |f| {
                    f.to_string_lossy().into_owned()
                })
            })
            .collect());
    }
    if given.len() != dirs.len() {
        return Err(crate::Error::InvalidArgument {
            name: "--label".into(),
            reason: format!(
                "{} labels for {} run folders; give one per folder, in order (e.g. --label \
                 before,after)",
                given.len(),
                dirs.len()
            ),
        });
    }
    Ok(given.to_vec())
}

/// A run folder without a finished point: re-rendering would overwrite `results.csv` with a
/// header only.
fn nothing_finished(dir: &Path, command: &str) -> crate::Error {
    let raw = dir.join(crate::report::RAW_FILE);
    crate::Error::InvalidArgument {
        name: dir.display().to_string(),
        reason: format!(
            "{} is {}: no finished point to report (its results.csv is left as it is); finish \
             the run with `kvbench {command} --resume {}`",
            raw.display(),
            if raw.exists() { "empty" } else { "missing" },
            dir.display()
        ),
    }
}

/// When several folders are compared, an `out` that is one of them is refused: the comparison
/// would overwrite that run's files.
fn check_out(dirs: &[PathBuf], out: Option<&Path>) -> Result<(), crate::Error> {
    let (Some(out), true) = (out, dirs.len() > 1) else {
        return Ok(());
    };
    let same = |p: &Path| match (std::fs::canonicalize(p), std::fs::canonicalize(out)) {
        (Ok(x), Ok(y)) => x == y,
        _ => p == out,
    };
    match dirs.iter().find(|d| same(d)) {
        Some(d) => Err(crate::Error::InvalidArgument {
            name: "--out".into(),
            reason: format!(
                "{} is one of the runs being compared; writing the comparison there would \
                 overwrite its results. Pass another --out (default: reports/compare-<time>)",
                d.display()
            ),
        }),
        None => Ok(()),
    }
}

/// Serve folders: one re-rendered into itself (or `out`); several side by side into `out`,
/// each point labelled with its run folder's name.
fn serves(dirs: &[PathBuf], out: Option<&Path>, labels: &[String]) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for d in dirs {
        let r = ServeRun::read(d)?;
        if r.rows.is_empty() {
            return Err(nothing_finished(d, "serve").into());
        }
        runs.push(r);
    }
    let mut first = runs.remove(0);
    let target = match (out, runs.is_empty()) {
        (Some(o), _) => o.to_path_buf(),
        (None, true) => first.dir.clone(),
        (None, false) => {
            PathBuf::from("reports").join(format!("compare-{}", crate::util::time::now_compact()))
        }
    };
    crate::report::run_dir::create_out(&target)?;
    if !runs.is_empty() {
        relabel(&mut first, &labels[0]);
        for (mut r, label) in runs.into_iter().zip(&labels[1..]) {
            relabel(&mut r, label);
            first.rows.extend(r.rows);
            first.traces.extend(r.traces);
        }
    }
    first.dir = target;
    print!("{}", serve_report::render(&first)?);
    println!("wrote {}", first.dir.display());
    Ok(())
}

/// Prefixes every scheme of `run` with `label` (side-by-side charts and tables).
fn relabel(run: &mut ServeRun, label: &str) {
    for r in &mut run.rows {
        r.scheme = format!("{label} · {}", r.scheme);
    }
    for (p, _) in &mut run.traces {
        p.scheme = format!("{label} · {}", p.scheme);
    }
}

/// Sweep folders: rebuilds rows from each folder's `raw.jsonl` (a folder given twice, under any spelling of its
/// path, once) and writes `results.csv`, `summary.md` and
/// `plots/` (one run: into its folder; several: side by side, one table per run, charts with a
/// series per run and scheme).
fn sweeps(dirs: &[PathBuf], out: Option<&Path>, labels: &[String]) -> anyhow::Result<()> {
    let runs = dirs
        .iter()
        .map(|d| Run::read(d))
        .collect::<Result<Vec<_>, _>>()?;
    for r in &runs {
        if r.rows.is_empty() {
            return Err(nothing_finished(&r.dir, "sweep").into());
        }
    }
    let out = match (out, runs.as_slice()) {
        (Some(o), _) => o.to_path_buf(),
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
    if runs.len() > 1 {
        compare_runs(&out, &runs, labels)?;
    }
    for w in summary::warnings(&rows) {
        eprintln!("warning: {w}");
    }
    println!("wrote {} (results.csv, plots/)", path.display());
    Ok(())
}

/// Every run after the first compared with the first point by point: printed, and written to
/// `comparison.md` and `comparison.json` in `out`. Errors: [`crate::Error::Io`].
fn compare_runs(out: &Path, runs: &[Run], labels: &[String]) -> anyhow::Result<()> {
    use crate::report::compare;
    let mut md = String::new();
    let mut json = Vec::new();
    for (r, label) in runs.iter().zip(labels).skip(1) {
        let d = compare::compare(&runs[0].rows, &r.rows);
        md.push_str(&compare::render(&d, &labels[0], label));
        md.push('\n');
        json.push(serde_json::json!({"a": labels[0], "b": label, "points": d}));
    }
    print!("{md}");
    let p = out.join("comparison.md");
    std::fs::write(&p, &md).map_err(|e| crate::Error::io(&p, e))?;
    let p = out.join("comparison.json");
    let text = serde_json::to_string_pretty(&json)?;
    std::fs::write(&p, text).map_err(|e| crate::Error::io(&p, e))?;
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
