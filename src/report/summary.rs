//! `summary.md` and the re-rendering of a run folder: rows rebuilt from `raw.jsonl` and the
//! `report_context` of `meta.json`, then `results.csv`, `summary.md` and `plots/` written. The
//! sweep calls the same code when it finishes, so a re-render gives the same files.

use std::path::{Path, PathBuf};

use super::plots::{self, Caption};
use super::{read_records, table, write_csv, ResultRow, RowContext};
use crate::error::{Error, Result};
use crate::quality::passkey::PasskeyResult;

/// A run folder read back: its `meta.json` and its rows rebuilt from `raw.jsonl`.
#[derive(Debug, Clone)]
pub struct Run {
    /// The folder.
    pub dir: PathBuf,
    /// `meta.json`, typed.
    pub run_meta: super::SweepMeta,
    /// `meta.json` as written (for `merge` and `--resume`, which carry every section over).
    pub meta: serde_json::Value,
    /// One row per finished point, in the order they finished.
    pub rows: Vec<ResultRow>,
    /// Passkey trials per scheme (first point of each scheme that has them).
    pub passkey: Vec<(String, PasskeyResult)>,
}

impl Run {
    /// Reads `dir/meta.json` and `dir/raw.jsonl`. Errors: [`Error::InvalidArgument`] naming the
    /// folder when it is not a kvbench run folder (no `meta.json`, or one without
    /// `report_context`, as written before raw data was kept).
    pub fn read(dir: &Path) -> Result<Run> {
        let meta_path = dir.join(super::META_FILE);
        if !meta_path.exists() {
            return Err(Error::InvalidArgument {
                name: dir.display().to_string(),
                reason: format!(
                    "not a kvbench run folder ({} is missing)",
                    meta_path.display()
                ),
            });
        }
        let (run_meta, meta) = super::SweepMeta::read(&meta_path)?;
        let ctx: RowContext = run_meta.report_context.clone();
        let records = read_records(dir)?;
        let rows = records.rows(&ctx);
        // In the sweep's scheme order (the points'), then any scheme with quality alone.
        let mut passkey: Vec<(String, PasskeyResult)> = Vec::new();
        let schemes = records
            .points
            .iter()
            .map(|o| o.scheme)
            .chain(records.quality.iter().map(|q| q.scheme));
        for scheme in schemes {
            let name = scheme.to_string();
            if let Some(p) = records.quality_of(scheme).and_then(|q| q.passkey.as_ref()) {
                if !passkey.iter().any(|(n, _)| *n == name) {
                    passkey.push((name, p.clone()));
                }
            }
        }
        Ok(Run {
            dir: dir.to_path_buf(),
            run_meta,
            meta,
            rows,
            passkey,
        })
    }

    /// Chart caption from `meta.json`: model, CPU and threads (and `--device` when not the
    /// CPU), weights, tokens, repeats, seed.
    pub fn caption(&self) -> Caption {
        let m = &self.run_meta;
        let s = &m.settings;
        let mut settings = Vec::new();
        if m.mode == super::meta::RunMode::Synthetic {
            settings.push("synthetic K/V, attention + append only".to_string());
        } else {
            settings.push(format!("decode weights {}", s.weights.weights));
        }
        settings.push(format!("gen {}", s.grid.gen));
        settings.push(format!("repeats {}", s.timing.repeats));
        settings.push(format!("seed {}", s.seed.seed));
        // CPU runs read as before; others name the device.
        let device = match s.device.device {
            crate::model::DeviceSpec::Cpu => String::new(),
            d => format!(", model on {d}"),
        };
        Caption {
            model: m.report_context.model.clone(),
            machine: format!("{}, {} threads{device}", m.machine.cpu, m.machine.threads),
            settings: settings.join(", "),
        }
    }
}

/// Notes a reader must see next to the numbers (noisy points, contended points, single
/// repeats), one line per cause: see [`super::warnings::Warnings`].
pub fn warnings(rows: &[ResultRow]) -> Vec<String> {
    super::warnings::Warnings::of_sweep(rows).lines()
}

/// The Markdown report: title, where the numbers come from, the table, warnings, charts, and
/// what the memory columns mean.
pub fn markdown(title: &str, about: &[String], rows: &[ResultRow], charts: &[PathBuf]) -> String {
    let mut md = format!("# {title}\n\n");
    for line in about {
        md.push_str(&format!("- {line}\n"));
    }
    md.push('\n');
    md.push_str(&table::render_markdown(rows));
    md.push_str(
        "\nTTFT: median over repeats. TPOT: mean over repeats of (E2E − TTFT)/(gen − 1), with \
         the 95 % confidence half-width; ΔTPOT against fp16 at the same batch and prompt \
         length. ITL: one decode step. KV MiB: bytes held (codes, scales, zero-points) at \
         the end of the point. All columns, with units, are in `results.csv`.\n",
    );
    md.push_str(&quality_table(rows));
    md.push_str(&super::warnings::Warnings::of_sweep(rows).markdown());
    if !charts.is_empty() {
        md.push_str("\n## Charts\n\n");
        for c in charts {
            let name = c
                .file_name()
                .map_or(String::new(), |f| f.to_string_lossy().into_owned());
            md.push_str(&format!("![{name}](plots/{name})\n"));
        }
    }
    md
}

/// The per-scheme quality statistics the main table has no room for (issue #15): perplexity ±
/// llama.cpp's SE, ΔPPL against the fp16 cache with its paired 95 % interval, KL mean / p99.9 /
/// max (nats), llama.cpp's "same top p" (%, ± SE) and, with `--ppl-noise-floor`, the spread of
/// the perturbed reruns. One line per scheme (quality is measured once per scheme); empty when
/// no row has a perplexity.
pub fn quality_table(rows: &[ResultRow]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut lines = String::new();
    let f = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
    for r in rows.iter().filter(|r| r.ppl.is_some()) {
        if seen.contains(&r.scheme.as_str()) {
            continue;
        }
        seen.push(&r.scheme);
        let ppl = match (r.ppl, r.ppl_se) {
            (Some(p), Some(se)) => format!("{p:.4} ± {se:.4}"),
            (p, _) => f(p, 4),
        };
        let delta = match (r.delta_ppl_pct, r.delta_ppl_pct_lo, r.delta_ppl_pct_hi) {
            (Some(d), Some(lo), Some(hi)) => format!("{d:+.2} [{lo:+.2}, {hi:+.2}]"),
            (d, _, _) => d.map_or("-".into(), |d| format!("{d:+.2}")),
        };
        let same = match (r.top1_agree_pct, r.same_top_p_se) {
            (Some(a), Some(se)) => format!("{a:.2} ± {se:.2}"),
            (a, _) => f(a, 2),
        };
        let noise = match (r.noise_floor_spread_pct, r.noise_floor_runs) {
            (Some(sp), Some(k)) => format!("{sp:.3} ({k} runs)"),
            _ => "-".into(),
        };
        lines.push_str(&format!(
            "| {} | {} | {ppl} | {delta} | {} | {} | {} | {same} | {noise} |\n",
            r.scheme,
            r.ppl_windows.map_or("-".into(), |n| n.to_string()),
            f(r.kl_mean, 4),
            f(r.kl_p99_9, 4),
            f(r.kl_max, 4),
        ));
    }
    if lines.is_empty() {
        return String::new();
    }
    let method = rows
        .iter()
        .find_map(|r| r.ci_method.clone())
        .unwrap_or_else(|| "t".into());
    format!(
        "\n## Quality\n\n| scheme | windows | PPL ± SE | ΔPPL % [95 % CI] | KL mean | KL p99.9 | \
         KL max | same top p % | noise floor spread % |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n{lines}\n\
         ΔPPL against the fp16 cache run in lockstep on the same windows; the interval is paired \
         ({method}) over per-window NLL differences. KL in nats per scored token. Noise floor: \
         100·(max − min)/mean of the perplexity over the one-ulp-perturbed reruns; ΔPPLs inside \
         it cannot be told apart.\n"
    )
}

/// Writes `results.csv`, `summary.md` and `plots/` for `rows` into `dir`; returns the path of
/// `summary.md`. Errors: [`Error::Io`] naming the file.
pub fn write_report(
    dir: &Path,
    title: &str,
    about: &[String],
    rows: &[ResultRow],
    passkey: &[(String, PasskeyResult)],
    caption: &Caption,
) -> Result<PathBuf> {
    write_csv(&dir.join(super::CSV_FILE), rows)?;
    let plots_dir = dir.join(super::PLOTS_DIR);
    let mut charts = plots::render_all(rows, caption, &plots_dir)?;
    if let Some(h) = plots::passkey_heatmap(passkey, caption) {
        h.render(&plots_dir, plots::PASSKEY_CHART)?;
        charts.push(plots_dir.join(format!("{}.png", plots::PASSKEY_CHART)));
    }
    let path = dir.join(super::SUMMARY_FILE);
    std::fs::write(&path, markdown(title, about, rows, &charts))
        .map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// The "where the numbers come from" lines of a run, from its `meta.json`.
pub fn about(run: &Run) -> Vec<String> {
    let c = run.caption();
    let (m, t) = (&run.meta, &run.run_meta);
    let mut lines = vec![
        format!("model: {}", c.model),
        format!("machine: {}", c.machine),
        format!("settings: {}", c.settings),
        format!(
            "run {} · kvbench {} · started {}",
            t.run_id, t.kvbench, t.started_at
        ),
    ];
    if let Some(p) = m.get("perplexity").filter(|p| !p.is_null()) {
        lines.push(format!(
            "perplexity: {}, windows: {} × {} tokens, {} scoring, weights {}",
            p["dataset"].as_str().unwrap_or("?"),
            p["protocol"]["windows"],
            p["protocol"]["ctx"],
            p["protocol"]["scoring"].as_str().unwrap_or("?"),
            // What ran (the memory plan may have resolved `auto`), else what was asked.
            m["model"]["weight_dtype_perplexity"].as_str().map_or_else(
                || t.settings.perplexity.ppl_weights.to_string(),
                str::to_string
            ),
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: two points of q4_0 (quality is per scheme: one line), one fp16, one timing-only
    /// scheme (no line); the cells are the row's numbers at the stated precision.
    #[test]
    fn quality_table_one_line_per_scheme() {
        let q4 = ResultRow {
            scheme: "q4_0".into(),
            ppl: Some(28.298),
            ppl_se: Some(1.91349),
            delta_ppl_pct: Some(15.5098),
            delta_ppl_pct_lo: Some(10.6432),
            delta_ppl_pct_hi: Some(20.5906),
            ci_method: Some("t".into()),
            kl_mean: Some(0.12646),
            kl_p99_9: Some(1.08878),
            kl_max: Some(1.91948),
            top1_agree_pct: Some(79.2157),
            same_top_p_se: Some(0.8),
            noise_floor_runs: Some(3),
            noise_floor_spread_pct: Some(0.21817),
            ppl_windows: Some(8),
            ..Default::default()
        };
        let rows = vec![
            ResultRow {
                scheme: "fp16".into(),
                ppl: Some(24.4983),
                ppl_windows: Some(8),
                ..Default::default()
            },
            q4.clone(),
            ResultRow {
                batch_size: 4,
                ..q4
            },
            ResultRow {
                scheme: "int8".into(),
                ..Default::default()
            },
        ];
        let t = quality_table(&rows);
        assert!(t.contains("## Quality"), "{t}");
        assert!(
            t.contains(
                "| q4_0 | 8 | 28.2980 ± 1.9135 | +15.51 [+10.64, +20.59] | 0.1265 | 1.0888 | \
                 1.9195 | 79.22 ± 0.80 | 0.218 (3 runs) |"
            ),
            "{t}"
        );
        assert!(t.contains("| fp16 | 8 | 24.4983 | - |"), "{t}");
        assert_eq!(t.matches("| q4_0 |").count(), 1, "{t}");
        assert!(!t.contains("| int8 |"), "{t}");
        assert!(quality_table(&rows[3..]).is_empty());
    }
}
