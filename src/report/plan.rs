//! `kvbench plan`'s outputs: the table printed, `plan.csv` (one row per scheme × context),
//! `plan.json` (the input and the rows) and the concurrency-vs-context chart.

use std::path::Path;

use crate::error::{Error, Result};
use crate::plan::{PlanInput, PlanRow};

use super::chart::{Axis, LineChart, Series};
use super::meta;

/// A finished plan, as rendered (`kvbench plan --format json` prints it as is).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanReport {
    /// What was planned.
    pub input: PlanInput,
    /// The weights' dtype (`bf16`, `gguf`, …).
    pub weights_dtype: String,
    /// GPUs in all.
    pub gpus: usize,
    /// The schemes, in the order given.
    pub schemes: Vec<String>,
    /// Contexts per sequence, tokens.
    pub ctxs: Vec<usize>,
    /// One row per scheme × context.
    pub rows: Vec<PlanRow>,
    /// With `--concurrency N`: per scheme, N and the longest context N sequences fit
    /// (`[scheme, sequences, tokens]`).
    pub longest: Vec<(String, u64, usize)>,
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// The table and notes `kvbench plan` prints.
pub fn table(p: &PlanReport) -> String {
    let (m, input) = (&p.input.model, &p.input);
    let hybrid = m.window.is_some();
    let mut s = format!(
        "{} ({} layers{}, {} kv heads × {}), weights {} = {:.2} GiB, memory {:.2} GiB, reserve {:.0} %, KV budget {:.2} GiB, blocks of {} tokens\n",
        m.name, m.layers,
        m.window.map_or(String::new(), |w| {
            let g = m.cache().global_layers();
            format!(": {} window + {g} global, {w}", m.layers - g)
        }),
        m.kv_heads, m.head_dim, p.weights_dtype, gib(input.weight_bytes),
        gib(input.memory_bytes), input.reserve * 100.0,
        gib(p.rows.first().map_or(0, |r| r.kv_budget_bytes)), input.block
    );
    let tp = input.tensor_parallel > 1 || p.gpus > 1;
    if tp {
        s.push_str(&format!(
            "tensor parallel {} ({} KV heads per GPU{}), {} GPUs = {} replicas; memory, weights \
             and bytes are per GPU, max seqs per replica\n",
            input.tensor_parallel,
            input.kv_heads_per_gpu(),
            if input.tensor_parallel > m.kv_heads {
                ", replicated"
            } else {
                ""
            },
            p.gpus,
            p.gpus / input.tensor_parallel
        ));
    }
    s.push_str(&format!(
        "{:<28} {:>8} {:>12} {:>14} {:>12} {:>12}{}{}\n",
        "scheme",
        "context",
        "bytes/token",
        "GiB/sequence",
        "waste MiB",
        "max seqs",
        if hybrid {
            format!(
                " {:>12} {:>12} {:>14} {:>14}",
                "window GiB", "global GiB", "all-global GiB", "all-global seqs"
            )
        } else {
            String::new()
        },
        if tp {
            format!(" {:>4} {:>9} {:>12}", "TP", "KV h/GPU", "total seqs")
        } else {
            String::new()
        }
    ));
    for r in &p.rows {
        s.push_str(&format!(
            "{:<28} {:>8} {:>12} {:>14.3} {:>12.2} {:>12}{}{}\n",
            r.scheme,
            r.ctx,
            r.bytes_per_token,
            gib(r.kv_bytes_per_seq),
            r.paging_waste_bytes as f64 / (1u64 << 20) as f64,
            r.max_concurrency,
            if hybrid {
                format!(
                    " {:>12.3} {:>12.3} {:>14.3} {:>14}",
                    gib(r.kv_bytes_window_layers),
                    gib(r.kv_bytes_global_layers),
                    gib(r.kv_bytes_all_global),
                    r.kv_budget_bytes / r.kv_bytes_all_global.max(1)
                )
            } else {
                String::new()
            },
            if tp {
                format!(
                    " {:>4} {:>9} {:>12}",
                    r.tensor_parallel, r.kv_heads_per_gpu, r.total_concurrency
                )
            } else {
                String::new()
            }
        ));
    }
    if let Some(w) = m.window {
        let g = m.cache().global_layers();
        s.push_str(&format!(
            "note: per layer type, a sequence of n tokens holds {} window layers × min(n, {}) + \
             {g} global layers × n tokens; bytes/token is every layer's (a token inside the \
             window); all-global counts every layer holding n tokens, the figure that ignores \
             the window{}\n",
            m.layers - g,
            w.window,
            p.rows
                .iter()
                .rev()
                .filter(|r| r.kv_bytes_per_seq > 0 && r.kv_bytes_all_global > r.kv_bytes_per_seq)
                .max_by_key(|r| r.ctx)
                .map_or(String::new(), |r| format!(
                    " ({:.2}× too much for {} at {} tokens)",
                    r.kv_bytes_all_global as f64 / r.kv_bytes_per_seq as f64,
                    r.scheme,
                    r.ctx
                ))
        ));
    }
    for &c in p.ctxs.iter().filter(|&&c| c > m.max_ctx) {
        s.push_str(&format!(
            "note: context {c} exceeds {}'s trained context of {} tokens (it needs RoPE scaling there)\n",
            m.name, m.max_ctx
        ));
    }
    for (scheme, n, c) in &p.longest {
        s.push_str(&format!(
            "{scheme}: longest context for {n} concurrent sequences: {c} tokens\n"
        ));
    }
    s
}

/// Writes `plan.csv`, `plan.json` and `concurrency_vs_context.png/.svg` into `dir` (created)
/// and returns the line that says so. Errors: [`Error::InvalidArgument`] (`--out`) for a folder
/// that cannot be made; [`Error::Io`] naming the file.
pub fn write(p: &PlanReport, dir: &Path) -> Result<String> {
    super::run_dir::create_out(dir)?;
    let csv_path = dir.join("plan.csv");
    let io = |e: csv::Error| Error::io(&csv_path, std::io::Error::other(e.to_string()));
    let mut w = csv::Writer::from_path(&csv_path).map_err(io)?;
    for r in &p.rows {
        w.serialize(r).map_err(io)?;
    }
    w.flush().map_err(|e| Error::io(&csv_path, e))?;
    meta::write_json(
        &dir.join("plan.json"),
        &serde_json::json!({
            "kvbench": meta::version(),
            "input": p.input,
            "weights_dtype": p.weights_dtype,
            "rows": p.rows,
        }),
    )?;
    chart(p).render(dir, "concurrency_vs_context")?;
    Ok(format!(
        "wrote {}, {} and {}",
        csv_path.display(),
        dir.join("concurrency_vs_context.png").display(),
        dir.join("concurrency_vs_context.svg").display()
    ))
}

/// Max concurrent sequences against the context, a line per scheme. The x axis is log when
/// the contexts span more than 2×; the y axis when the positive counts span more than 10×
/// (a line at 2000 sequences would flatten one at 3 onto the axis).
fn chart(p: &PlanReport) -> LineChart {
    let input = &p.input;
    let ctxs = &p.ctxs;
    let log_x = ctxs.len() > 1 && ctxs.iter().max() > ctxs.iter().min().map(|m| m * 2).as_ref();
    let counts = p.rows.iter().map(|r| r.max_concurrency).filter(|&c| c > 0);
    let (lo, hi) = counts.fold((u64::MAX, 0), |(a, b), c| (a.min(c), b.max(c)));
    let log_y = hi > lo.saturating_mul(10);
    LineChart {
        title: format!("Max concurrent sequences vs context — {}", input.model.name),
        caption: format!(
            "{:.0} GiB memory, {} weights {:.1} GiB, {:.0} % reserve, KV blocks of {} tokens · kvbench {} · planned on {}",
            gib(input.memory_bytes),
            p.weights_dtype,
            gib(input.weight_bytes),
            input.reserve * 100.0,
            input.block,
            env!("CARGO_PKG_VERSION"),
            meta::Machine::probe().hostname
        ),
        x: Axis::binary(if log_x {
            "context per sequence (tokens, log scale)"
        } else {
            "context per sequence (tokens)"
        })
        .log_if(log_x),
        // Counts: powers of ten on a log axis, else steps of 2^k (never half a sequence).
        y: if log_y {
            Axis::decimal("max concurrent sequences (log scale; 0 not drawn)").log_if(true)
        } else {
            Axis::binary("max concurrent sequences")
        },
        series: p
            .schemes
            .iter()
            .map(|s| {
                Series::line(
                    s.clone(),
                    p.rows
                        .iter()
                        .filter(|r| &r.scheme == s)
                        .map(|r| (r.ctx as f64, r.max_concurrency as f64))
                        .collect(),
                )
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvScheme;
    use crate::report::chart::tests::svg;

    /// Llama-3-8B, fp16 cache, 80 GiB, 10 % reserve: a KV budget of 61,248,888,832 bytes at
    /// 131,072 bytes per token (the figures `plan`'s tests work out by hand).
    fn report(ctxs: &[usize]) -> PlanReport {
        let m = crate::model::geometry::geometry("llama-3-8b").unwrap();
        let input = PlanInput {
            weight_bytes: m.params * 2,
            model: m,
            memory_bytes: 80 << 30,
            reserve: 0.1,
            block: 16,
            tensor_parallel: 1,
        };
        let rows = crate::plan::plan(&input, &[KvScheme::FP16], ctxs).unwrap();
        PlanReport {
            input,
            weights_dtype: "bf16".into(),
            gpus: 1,
            schemes: vec!["fp16".into()],
            ctxs: ctxs.to_vec(),
            rows,
            longest: Vec::new(),
        }
    }

    /// Issue #26: 4k → 128k contexts take 114 → 3 sequences (38×): log x and log y, the y
    /// axis labelled in powers of ten. One context (32k, 14 sequences): linear axes and the
    /// point in the middle of the plot, on its "32k" label.
    #[test]
    fn concurrency_axes_issue_26() {
        let c = chart(&report(&[4096, 16384, 131072]));
        assert!(c.x.log && c.y.log);
        let s = c.svg();
        let y: Vec<String> = svg::y_ticks(&s).into_iter().map(|t| t.1).collect();
        assert_eq!(y, ["1", "10", "100", "1000"]);
        let x: Vec<String> = svg::x_ticks(&s).into_iter().map(|t| t.1).collect();
        assert_eq!(x, ["4k", "8k", "16k", "32k", "64k", "128k"]);

        let c = chart(&report(&[32768]));
        assert!(!c.x.log && !c.y.log);
        assert_eq!(c.series[0].points, vec![(32768.0, 14.0)]);
        let s = c.svg();
        let (left, right) = svg::x_axis(&s);
        let m: Vec<_> = svg::circles(&s)
            .into_iter()
            .filter(|p| p.2 == "#1F77B4" && p.0 < right + 6.0)
            .collect();
        assert_eq!(m.len(), 1);
        assert!(
            (m[0].0 - (left + right) / 2.0).abs() <= 1.0,
            "{m:?} {left} {right}"
        );
        let at = svg::x_ticks(&s).into_iter().find(|t| t.1 == "32k").unwrap();
        assert!((at.0 - m[0].0).abs() <= 1.0);
    }
}
