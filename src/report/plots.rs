//! The sweep's trade-off charts, built from result rows (they draw, never measure):
//! TPOT vs prompt length, decode tokens/s vs batch size, KV memory vs tokens held, and quality
//! (perplexity delta) vs KV bytes per token with the Pareto frontier marked.

use std::path::{Path, PathBuf};

use super::chart::{Axis, HeatMap, LineChart, Panels, Series, Style};
use super::ResultRow;
use crate::error::Result;

/// Stems of the charts [`charts`] builds, in order.
pub const CHARTS: [&str; 4] = [
    "tpot_vs_seq_len",
    "decode_tps_vs_batch",
    "kv_memory_vs_tokens",
    "quality_vs_kv_bytes",
];

/// Stem of the "which scheme" chart ([`which_scheme`]).
pub const WHICH_SCHEME_CHART: &str = "which_scheme";

/// Most panels the "which scheme" chart draws (slices past these are named in its note).
const MAX_PANELS: usize = 6;

/// Stem of the passkey heat-map.
pub const PASSKEY_CHART: &str = "passkey_heatmap";

/// Where a set of rows came from, for chart captions: model, machine and settings.
#[derive(Debug, Clone, Default)]
pub struct Caption {
    /// Model label(s).
    pub model: String,
    /// CPU model and threads.
    pub machine: String,
    /// Weight dtypes, tokens generated, repeats, seed.
    pub settings: String,
}

impl Caption {
    pub(crate) fn line(&self) -> String {
        [&self.model, &self.machine, &self.settings]
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// One point of a sweep chart: `(x, y)` in the chart's units, its error bar `(lo, hi)` (NaN
/// ends: none) and whether it is drawn hollow.
struct Point {
    x: f64,
    y: f64,
    bar: (f64, f64),
    hollow: bool,
}

impl Point {
    /// A timed quantity of row `r` at `(x, y)`: its bar `y ± ci95` where the row has the
    /// half-width, hollow where the row is `contended`.
    fn timed(r: &ResultRow, x: f64, y: f64, ci95: Option<f64>) -> Point {
        Point {
            x,
            y,
            bar: ci95.map_or((f64::NAN, f64::NAN), |h| (y - h, y + h)),
            hollow: r.contended == Some(true),
        }
    }
}

/// One series per scheme (per run and scheme when rows come from several runs).
fn by_scheme<'a>(rows: &[&'a ResultRow]) -> Vec<(String, Vec<&'a ResultRow>)> {
    let multi_run = rows.iter().any(|r| r.run_id != rows[0].run_id);
    let mut out: Vec<(String, Vec<&ResultRow>)> = Vec::new();
    for r in rows {
        let name = if multi_run {
            format!("{} · {}", short_run(&r.run_id), r.scheme)
        } else {
            r.scheme.clone()
        };
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(r),
            None => out.push((name, vec![r])),
        }
    }
    out
}

/// A run id's distinguishing part (its time stamp) for legends and tables.
pub(crate) fn short_run(run_id: &str) -> &str {
    run_id.get(..15).unwrap_or(run_id)
}

/// Builds the charts for `rows` (failed points are left out). A chart whose data is missing
/// (e.g. no perplexity measured) is omitted. Returns `(stem, chart)` pairs.
pub fn charts(rows: &[ResultRow], caption: &Caption) -> Vec<(&'static str, LineChart)> {
    let ok: Vec<&ResultRow> = rows.iter().filter(|r| r.status.is_ok()).collect();
    if ok.is_empty() {
        return Vec::new();
    }
    let min_batch = ok.iter().map(|r| r.batch_size).min().unwrap_or(1);
    let max_seq = ok.iter().map(|r| r.seq_len).max().unwrap_or(1);
    let cap = caption.line();
    let series = |pick: &dyn Fn(&ResultRow) -> Option<Point>| -> Vec<Series> {
        by_scheme(&ok)
            .into_iter()
            .filter_map(|(name, rs)| {
                let mut pts: Vec<Point> = rs.iter().filter_map(|r| pick(r)).collect();
                pts.sort_by(|a, b| a.x.total_cmp(&b.x));
                (!pts.is_empty()).then(|| {
                    Series::line(name, pts.iter().map(|p| (p.x, p.y)).collect())
                        .with_bars(pts.iter().map(|p| p.bar).collect())
                        .with_hollow(pts.iter().map(|p| p.hollow).collect())
                })
            })
            .collect()
    };
    let mut out = vec![
        (
            CHARTS[0],
            LineChart {
                title: format!("Decode latency (TPOT) vs prompt length, batch {min_batch}"),
                caption: cap.clone(),
                x: Axis::binary("prompt length (tokens)"),
                y: Axis::decimal(if ok.iter().any(|r| r.tpot.ci95.is_some()) {
                    "TPOT, mean over repeats (ms, bars: 95 % CI of the mean)"
                } else {
                    "TPOT, mean over repeats (ms)"
                }),
                series: series(&|r| {
                    let y = r.tpot.mean.filter(|_| r.batch_size == min_batch)?;
                    Some(Point::timed(r, r.seq_len as f64, y, r.tpot.ci95))
                }),
            },
        ),
        (
            CHARTS[1],
            LineChart {
                title: format!("Decode throughput vs batch size, prompt {max_seq} tokens"),
                caption: cap.clone(),
                x: Axis::binary("batch size (sequences)"),
                y: Axis::decimal("decode throughput (tokens/s)"),
                series: series(&|r| {
                    let y = r.decode_tokens_per_s.filter(|_| r.seq_len == max_seq)?;
                    Some(Point::timed(r, r.batch_size as f64, y, None))
                }),
            },
        ),
        (
            CHARTS[2],
            LineChart {
                title: "KV-cache memory per sequence vs tokens held".into(),
                caption: cap.clone(),
                x: Axis::binary("tokens held per sequence"),
                y: Axis::decimal("KV bytes held per sequence (MiB)"),
                series: series(&|r| {
                    let (b, t) = r
                        .kv_bytes
                        .zip(r.kv_tokens)
                        .filter(|_| r.batch_size == min_batch)?;
                    let mib = b as f64 / r.batch_size as f64 / (1u64 << 20) as f64;
                    // Bytes held do not depend on a busy machine: never hollow.
                    Some(Point {
                        x: t as f64,
                        y: mib,
                        bar: (f64::NAN, f64::NAN),
                        hollow: false,
                    })
                }),
            },
        ),
    ];
    out.extend(quality_chart(&ok, cap).map(|c| (CHARTS[3], c)));
    out
}

/// The quality chart: one marker per scheme at (KV bytes per token, ΔPPL %) with its paired
/// 95 % interval as a bar where the row has it, and the Pareto frontier; `None` when no scheme
/// has a perplexity change. `ok`: the rows that finished; `cap`: the caption line.
fn quality_chart(ok: &[&ResultRow], cap: String) -> Option<LineChart> {
    // Quality vs memory: one point per scheme (perplexity does not depend on the timing point).
    // Error bars: the paired 95 % interval of ΔPPL (runs made before it have none).
    // (series name, bytes per token, ΔPPL %, its interval)
    type Quality = (String, f64, f64, Option<(f64, f64)>);
    let mut quality: Vec<Quality> = Vec::new();
    for (name, rs) in by_scheme(ok) {
        if let Some(r) = rs.iter().find(|r| r.ppl_delta_pct.is_some()) {
            if let (Some(b), Some(d)) = (r.kv_bytes_per_token, r.ppl_delta_pct) {
                quality.push((name, b, d, r.delta_ppl_pct_lo.zip(r.delta_ppl_pct_hi)));
            }
        }
    }
    if quality.is_empty() {
        return None;
    }
    let mut s: Vec<Series> = quality
        .iter()
        .map(|(n, b, d, ci)| {
            Series::line(n.clone(), vec![(*b, *d)])
                .with_style(Style::Markers)
                .with_bars(ci.iter().copied().collect())
        })
        .collect();
    s.push(
        Series::line(
            "Pareto frontier",
            pareto_frontier(quality.iter().map(|q| (q.1, q.2)).collect()),
        )
        .with_style(Style::Guide),
    );
    Some(LineChart {
        title: "Quality vs memory: perplexity change vs KV bytes per token".into(),
        caption: cap,
        x: Axis::decimal("KV bytes per token (all layers and kv heads, bytes)"),
        y: Axis::decimal(if quality.iter().any(|q| q.3.is_some()) {
            "perplexity change vs fp16 (%, bars: paired 95 % CI)"
        } else {
            "perplexity change vs fp16 (%)"
        }),
        series: s,
    })
}

/// The "which scheme" chart: for each (batch, prompt) slice a panel with one marker per scheme
/// at (TPOT, ΔPPL vs fp16) — the paired 95 % interval as its bar, KV bytes per token as its
/// size (radius 4 + 8·√(bytes / the largest) pixels), hollow when contended — and the Pareto
/// frontier of the slice (no other scheme is both faster and closer to fp16). `None` without
/// a perplexity change. Every panel lists every scheme (empty where it has no timed point) so
/// a scheme keeps its colour and shape.
pub fn which_scheme(rows: &[ResultRow], caption: &Caption) -> Option<Panels> {
    let ok: Vec<&ResultRow> = rows.iter().filter(|r| r.status.is_ok()).collect();
    let schemes = by_scheme(&ok);
    // Per scheme: ΔPPL %, its interval, bytes per token (scheme-level, from any row).
    type Quality = Option<(f64, Option<(f64, f64)>, f64)>;
    let quality: Vec<Quality> = schemes
        .iter()
        .map(|(_, rs)| {
            let r = rs.iter().find(|r| r.ppl_delta_pct.is_some())?;
            Some((
                r.ppl_delta_pct?,
                r.delta_ppl_pct_lo.zip(r.delta_ppl_pct_hi),
                r.kv_bytes_per_token.unwrap_or(f64::NAN),
            ))
        })
        .collect();
    if quality.iter().all(Option::is_none) {
        return None;
    }
    let max_bytes = quality
        .iter()
        .flatten()
        .map(|q| q.2)
        .filter(|b| b.is_finite())
        .fold(0.0, f64::max);
    let mut slices: Vec<(usize, usize)> = ok.iter().map(|r| (r.batch_size, r.seq_len)).collect();
    slices.sort_unstable();
    slices.dedup();
    let left_out = slices.len().saturating_sub(MAX_PANELS);
    slices.truncate(MAX_PANELS);
    let any_ci = quality.iter().flatten().any(|q| q.1.is_some());
    let panels = slices
        .iter()
        .map(|&(b, n)| {
            let mut frontier = Vec::new();
            let mut series: Vec<Series> = schemes
                .iter()
                .zip(&quality)
                .map(|((name, rs), q)| {
                    let point = q.and_then(|(d, ci, bytes)| {
                        let r = rs.iter().find(|r| r.batch_size == b && r.seq_len == n)?;
                        let t = r.tpot.mean?;
                        let radius = if max_bytes > 0.0 && bytes.is_finite() {
                            4.0 + 8.0 * (bytes / max_bytes).sqrt()
                        } else {
                            6.0
                        };
                        Some((
                            (t, d),
                            ci.unwrap_or((f64::NAN, f64::NAN)),
                            radius,
                            r.contended == Some(true),
                        ))
                    });
                    let s = Series::line(name.clone(), Vec::new()).with_style(Style::Markers);
                    match point {
                        Some((p, bar, radius, hollow)) => {
                            frontier.push(p);
                            Series {
                                points: vec![p],
                                y_bars: vec![bar],
                                sizes: vec![radius],
                                hollow: vec![hollow],
                                ..s
                            }
                        }
                        None => s,
                    }
                })
                .collect();
            series.push(
                Series::line("Pareto frontier", pareto_frontier(frontier)).with_style(Style::Guide),
            );
            let chart = LineChart {
                title: String::new(),
                caption: String::new(),
                x: Axis::decimal("TPOT, mean over repeats (ms)"),
                y: Axis::decimal(if any_ci {
                    "perplexity change vs fp16 (%, bars: paired 95 % CI)"
                } else {
                    "perplexity change vs fp16 (%)"
                }),
                series,
            };
            (format!("batch {b} × prompt {n} tokens"), chart)
        })
        .collect();
    let mut note =
        "marker radius: 4 + 8·√(KV bytes per token\n÷ the largest scheme's) pixels".to_string();
    if left_out > 0 {
        note.push_str(&format!("\n{left_out} more slices in results.csv"));
    }
    Some(Panels {
        title: "Which scheme: perplexity change vs decode latency, per slice".into(),
        caption: caption.line(),
        panels,
        note,
    })
}

/// The points no other point beats on both axes (fewer bytes and lower perplexity change),
/// sorted by bytes: walking up in bytes, a point joins when it is strictly better in quality
/// than every point with fewer bytes.
pub fn pareto_frontier(mut pts: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for p in pts {
        if out.last().is_none_or(|l| p.1 < l.1) {
            out.push(p);
        }
    }
    out
}

/// The passkey heat-map: one panel per scheme with passkey trials (rows: prompt lengths,
/// columns: depths, cells: accuracy %), from the run's raw outcomes; `None` without trials.
pub fn passkey_heatmap(
    outcomes: &[(String, crate::quality::passkey::PasskeyResult)],
    caption: &Caption,
) -> Option<HeatMap> {
    type Cells = Vec<(usize, f64, f64)>;
    let cells: Vec<(String, Cells)> = outcomes
        .iter()
        .map(|(n, p)| (n.clone(), p.cells()))
        .filter(|(_, c)| !c.is_empty())
        .collect();
    if cells.is_empty() {
        return None;
    }
    let mut lengths: Vec<usize> = cells
        .iter()
        .flat_map(|(_, c)| c.iter().map(|x| x.0))
        .collect();
    lengths.sort_unstable();
    lengths.dedup();
    let mut depths: Vec<f64> = cells
        .iter()
        .flat_map(|(_, c)| c.iter().map(|x| x.1))
        .collect();
    depths.sort_by(f64::total_cmp);
    depths.dedup();
    Some(HeatMap {
        title: "Passkey retrieval accuracy by prompt length and depth".into(),
        caption: format!(
            "{} · {} · greedy, generation weights as perplexity's (f32 by default)",
            caption.model, caption.machine
        ),
        row_label: "prompt tokens".into(),
        col_label: "key depth".into(),
        rows: lengths.iter().map(|l| l.to_string()).collect(),
        cols: depths.iter().map(|d| format!("{d}%")).collect(),
        panels: cells
            .into_iter()
            .map(|(name, c)| {
                let grid = lengths
                    .iter()
                    .map(|&l| {
                        depths
                            .iter()
                            .map(|&d| c.iter().find(|x| x.0 == l && x.1 == d).map(|x| x.2))
                            .collect()
                    })
                    .collect();
                (name, grid)
            })
            .collect(),
    })
}

/// Renders every chart into `dir` as PNG and SVG; returns the PNG paths.
/// Errors: [`crate::Error::Io`] naming the file.
pub fn render_all(rows: &[ResultRow], caption: &Caption, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
    let mut written = Vec::new();
    for (stem, chart) in charts(rows, caption) {
        chart.render(dir, stem)?;
        written.push(dir.join(format!("{stem}.png")));
    }
    if let Some(p) = which_scheme(rows, caption) {
        p.render(dir, WHICH_SCHEME_CHART)?;
        written.push(dir.join(format!("{WHICH_SCHEME_CHART}.png")));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Latency;

    /// Hand-made points: (100, 5) and (50, 9) are both optimal; (120, 5) has more bytes for the
    /// same change, (80, 12) more bytes and a worse change than (50, 9).
    #[test]
    fn pareto_by_hand() {
        let f = pareto_frontier(vec![(100.0, 5.0), (50.0, 9.0), (120.0, 5.0), (80.0, 12.0)]);
        assert_eq!(f, vec![(50.0, 9.0), (100.0, 5.0)]);
    }

    fn rows() -> Vec<ResultRow> {
        let mut rows = Vec::new();
        for (scheme, bpt, dppl) in [
            ("fp16", 46080.0, 0.0),
            ("int8-token", 23760.0, 0.06),
            ("int4", 14400.0, 6.5),
        ] {
            for batch in [1, 4] {
                for seq in [128, 512] {
                    rows.push(ResultRow {
                        run_id: "20261129-170000-m".into(),
                        scheme: scheme.into(),
                        batch_size: batch,
                        seq_len: seq,
                        status: crate::measure::sweep::PointStatus::Ok,
                        tpot: Latency {
                            mean: Some(20.0 + seq as f64 / 100.0),
                            ..Default::default()
                        },
                        decode_tokens_per_s: Some(50.0 * batch as f64),
                        kv_tokens: Some(seq + 31),
                        kv_bytes: Some((bpt as usize) * batch * (seq + 31)),
                        kv_bytes_per_token: Some(bpt),
                        ppl_delta_pct: Some(dppl),
                        // int4 carries a paired interval; the others are an older run's rows.
                        delta_ppl_pct_lo: (scheme == "int4").then_some(5.0),
                        delta_ppl_pct_hi: (scheme == "int4").then_some(8.25),
                        ..Default::default()
                    });
                }
            }
        }
        rows.push(ResultRow {
            scheme: "fp8".into(),
            status: crate::measure::sweep::PointStatus::Oom("needs 9 GiB".into()),
            ..rows[0].clone()
        });
        rows
    }

    /// Issue #26: the TPOT chart draws each point's 95 % interval (`tpot_ms_ci95` = 0.5 ms
    /// here: bars mean ± 0.5) and a contended row's points hollow, in the throughput chart
    /// too; the memory chart (bytes, untimed) is never hollow and has no bars.
    #[test]
    fn tpot_bars_and_contended_points_issue_26() {
        let mut rows = rows();
        for r in rows.iter_mut() {
            r.tpot.ci95 = Some(0.5);
            r.contended = Some(r.scheme == "int4" && r.seq_len == 512);
        }
        let charts = charts(&rows, &Caption::default());
        let tpot = &charts[0].1.series;
        // fp16 at batch 1: prompts 128 and 512, TPOT 21.28 and 25.12 ms.
        assert_eq!(tpot[0].points, vec![(128.0, 21.28), (512.0, 25.12)]);
        let want = [(20.78, 21.78), (24.62, 25.62)];
        for (b, w) in tpot[0].y_bars.iter().zip(want) {
            assert!(
                (b.0 - w.0).abs() < 1e-9 && (b.1 - w.1).abs() < 1e-9,
                "{b:?}"
            );
        }
        assert!(charts[0].1.y.label.contains("95 % CI"));
        assert_eq!(
            tpot[2].hollow,
            vec![false, true],
            "int4 at 512 is contended"
        );
        assert_eq!(tpot[0].hollow, vec![false, false]);
        // Throughput at prompt 512: int4's batch 1 and 4 both contended.
        assert_eq!(charts[1].1.series[2].hollow, vec![true, true]);
        let mem = &charts[2].1.series[2];
        assert!(mem.hollow.iter().all(|h| !h));
        assert!(mem.y_bars.iter().all(|b| b.0.is_nan()));
        // Drawn: int4 (series 2, squares) has one hollow point in the TPOT chart.
        let svg = charts[0].1.svg();
        let outlines = crate::report::chart::tests::svg::shapes(&svg, "polyline")
            .into_iter()
            .filter(|(c, p)| c == "#2CA02C" && p.len() == 5)
            .count();
        assert_eq!(outlines, 1);
    }

    /// The "which scheme" chart (issue #26): one panel per (batch, prompt) slice, every scheme
    /// in every panel at (TPOT, ΔPPL) with its paired interval, marker radius from bytes per
    /// token by hand (4 + 8·√(b / 46080): fp16 12, int8-token 9.74, int4 8.47 pixels), the
    /// frontier through all three (each faster one is further from fp16); drawn, the fp16
    /// circle sits at its TPOT's pixel between two labelled ticks.
    #[test]
    fn which_scheme_chart_issue_26() {
        use crate::report::chart::tests::svg;
        let mut rows = rows();
        for r in rows.iter_mut() {
            let f = match r.scheme.as_str() {
                "int8-token" => 0.8,
                "int4" => 0.6,
                _ => 1.0,
            };
            r.tpot.mean = r.tpot.mean.map(|t| t * f);
        }
        let p = which_scheme(&rows, &Caption::default()).unwrap();
        let names: Vec<&str> = p.panels.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "batch 1 × prompt 128 tokens",
                "batch 1 × prompt 512 tokens",
                "batch 4 × prompt 128 tokens",
                "batch 4 × prompt 512 tokens"
            ]
        );
        let s = &p.panels[0].1.series;
        assert_eq!(s.len(), 4, "fp16, int8-token, int4 and the frontier");
        assert_eq!(s[0].points, vec![(21.28, 0.0)]);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-3;
        for (series, want) in s.iter().zip([12.0, 9.7445, 8.4721]) {
            assert!(
                close(series.sizes[0], want),
                "{}: {:?}",
                series.name,
                series.sizes
            );
        }
        assert_eq!(s[2].y_bars, vec![(5.0, 8.25)]);
        let frontier: Vec<f64> = s[3].points.iter().map(|p| p.1).collect();
        assert_eq!(frontier, vec![6.5, 0.06, 0.0]);
        // Drawn: four panels, one 12-pixel fp16 circle each.
        let all = p.svg();
        assert_eq!(all.matches(" r=\"12\"").count(), 4);
        // One slice alone: the circle's x against the axis' own ticks.
        let one: Vec<ResultRow> = rows
            .iter()
            .filter(|r| r.batch_size == 1 && r.seq_len == 128)
            .cloned()
            .collect();
        let svg_text = which_scheme(&one, &Caption::default()).unwrap().svg();
        let ticks = svg::x_ticks(&svg_text);
        let t: Vec<(f64, f64)> = ticks
            .iter()
            .filter_map(|(px, l)| Some((*px, l.parse::<f64>().ok()?)))
            .collect();
        let want = svg::pixel(21.28, t[0], t[t.len() - 1]);
        let fp16 = svg::circles(&svg_text)
            .into_iter()
            .find(|c| c.2 == "#1F77B4" && c.0 < 1000.0)
            .unwrap();
        assert!(
            (fp16.0 - want).abs() <= 1.0,
            "fp16 at {} px, want {want}",
            fp16.0
        );
    }

    /// Every chart is built with one series per scheme that has data (failed points left out),
    /// the quality chart adds the frontier, and every file is written and non-empty.
    #[test]
    fn every_chart_with_expected_series() {
        let rows = rows();
        let charts = charts(&rows, &Caption::default());
        let stems: Vec<&str> = charts.iter().map(|c| c.0).collect();
        assert_eq!(stems, CHARTS);
        for (stem, c) in &charts[..3] {
            assert_eq!(c.series.len(), 3, "{stem}");
            assert!(c.series.iter().all(|s| s.points.len() == 2), "{stem}");
        }
        assert_eq!(charts[3].1.series.len(), 4);
        // fp16 (46080 B, 0 %) is on the frontier, as are int8 and int4.
        assert_eq!(charts[3].1.series[3].points.len(), 3);
        // Error bars only where the rows have the interval.
        let bars: Vec<&Vec<(f64, f64)>> = charts[3].1.series.iter().map(|s| &s.y_bars).collect();
        assert_eq!(bars[2], &vec![(5.0, 8.25)], "int4's interval");
        assert!(bars[0].is_empty() && bars[1].is_empty() && bars[3].is_empty());
        assert!(charts[3].1.y.label.contains("95 % CI"));

        let dir = std::env::temp_dir().join(format!("kvbench-plots-{}", std::process::id()));
        let pngs = render_all(&rows, &Caption::default(), &dir).unwrap();
        assert_eq!(pngs.len(), 5, "the four charts and which_scheme");
        for stem in CHARTS.iter().chain([&WHICH_SCHEME_CHART]) {
            for ext in ["png", "svg"] {
                let len = std::fs::metadata(dir.join(format!("{stem}.{ext}")))
                    .unwrap()
                    .len();
                assert!(len > 2_000, "{stem}.{ext}: {len} bytes");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
