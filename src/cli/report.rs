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

/// Rebuilds rows from each folder's `raw.jsonl` and writes `results.csv`, `summary.md` and
/// `plots/` (one run: into its folder; several: side by side, one table per run, charts with a
/// series per run and scheme).
pub fn run(a: ReportArgs) -> anyhow::Result<()> {
    let runs = a
        .runs
        .iter()
        .map(|d| Run::read(d))
        .collect::<Result<Vec<_>, _>>()?;
    let out = match (&a.out, runs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) => one.dir.clone(),
        (None, _) => {
            let t = crate::report::meta::now_rfc3339()
                .replace([':', '-'], "")
                .trim_end_matches('Z')
                .replace('T', "-");
            PathBuf::from("reports").join(format!("compare-{t}"))
        }
    };
    std::fs::create_dir_all(&out).map_err(|e| crate::Error::io(&out, e))?;
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
