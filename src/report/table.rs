//! The summary table, shared by the terminal and `summary.md`: one row per point, schemes
//! grouped, deltas against the fp16 baseline at the same batch size and prompt length.

use super::ResultRow;

/// Header of the summary table.
const HEADER: [&str; 15] = [
    "scheme",
    "batch",
    "seq",
    "TTFT ms",
    "TPOT ms",
    "±95% CI",
    "ΔTPOT %",
    "ITL p95 ms",
    "decode tok/s",
    "KV MiB",
    "KV vs fp16",
    "PPL",
    "ΔPPL %",
    "KL",
    "status",
];

/// The table's cells, header first. TTFT is the median, TPOT the mean over repeats with its
/// 95 % confidence half-width, ΔTPOT the change against the fp16 row of the same run, batch
/// and prompt length; `-` where a value was not measured.
pub fn cells(rows: &[ResultRow]) -> Vec<Vec<String>> {
    let f = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
    // Generation-task columns appear only when some row has them.
    let rouge = rows.iter().any(|r| r.rouge_l_f1.is_some());
    let passkey = rows.iter().any(|r| r.passkey_accuracy_pct.is_some());
    // GPU runs: device memory high-water and achieved decode bandwidth.
    let vram = rows.iter().any(|r| r.vram_peak_bytes.is_some());
    let mut header: Vec<String> = HEADER[..HEADER.len() - 1]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if vram {
        header.extend(["VRAM MiB".to_string(), "GB/s".to_string()]);
    }
    if rouge {
        header.extend(["ROUGE-L F1".to_string(), "RL vs fp16".to_string()]);
    }
    if passkey {
        header.push("passkey %".into());
    }
    header.push(HEADER[HEADER.len() - 1].into());
    let mut out: Vec<Vec<String>> = vec![header];
    let multi_run = rows.iter().any(|r| r.run_id != rows[0].run_id);
    for r in rows {
        let base = rows.iter().find(|b| {
            b.scheme == "fp16"
                && b.run_id == r.run_id
                && b.batch_size == r.batch_size
                && b.seq_len == r.seq_len
        });
        let dtpot = base
            .and_then(|b| b.tpot.mean)
            .zip(r.tpot.mean)
            .filter(|_| r.scheme != "fp16")
            .map(|(b, x)| 100.0 * (x / b - 1.0));
        out.push(vec![
            if multi_run {
                format!("{} · {}", super::plots::short_run(&r.run_id), r.scheme)
            } else {
                r.scheme.clone()
            },
            r.batch_size.to_string(),
            r.seq_len.to_string(),
            f(r.ttft.p50, 1),
            f(r.tpot.mean, 2),
            r.tpot.ci95.map_or("-".into(), |x| format!("±{x:.2}")),
            dtpot.map_or("-".into(), |x| format!("{x:+.1}")),
            f(r.itl.p95, 2),
            f(r.decode_tokens_per_s, 1),
            f(r.kv_bytes.map(|b| b as f64 / (1u64 << 20) as f64), 2),
            r.kv_ratio_vs_fp16
                .map_or("-".into(), |x| format!("{x:.3}×")),
            f(r.ppl, 4),
            match (r.ppl_delta_pct, r.delta_ppl_pct_lo.zip(r.delta_ppl_pct_hi)) {
                (Some(x), Some((lo, hi))) => format!("{x:+.2} [{lo:+.2}, {hi:+.2}]"),
                (Some(x), None) => format!("{x:+.2}"),
                _ => "-".into(),
            },
            r.kl_mean.map_or("-".into(), |x| format!("{x:.4}")),
        ]);
        let row = out.last_mut().expect("just pushed");
        if vram {
            row.push(f(
                r.vram_peak_bytes.map(|b| b as f64 / (1u64 << 20) as f64),
                0,
            ));
            row.push(f(r.decode_gb_s, 0));
        }
        if rouge {
            row.push(f(r.rouge_l_f1, 4));
            row.push(f(r.rouge_l_vs_fp16, 3));
        }
        if passkey {
            row.push(f(r.passkey_accuracy_pct, 0));
        }
        row.push(if r.contended == Some(true) {
            format!("{}, contended", truncate(&r.status.to_string(), 28))
        } else {
            truncate(&r.status.to_string(), 40)
        });
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n - 1) {
        Some((i, _)) if s.chars().count() > n => format!("{}…", &s[..i]),
        _ => s.to_string(),
    }
}

/// Renders rows as an aligned plain-text table for the terminal: text columns left-aligned,
/// numbers right-aligned, a rule under the header.
pub fn render(rows: &[ResultRow]) -> String {
    let cells = cells(rows);
    let ncol = cells[0].len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, row) in cells.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (s, &w))| {
                let pad = " ".repeat(w - s.chars().count());
                if c == 0 || c == ncol - 1 {
                    format!("{s}{pad}")
                } else {
                    format!("{pad}{s}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

/// Renders rows as a GitHub-flavoured Markdown table (numbers right-aligned).
pub fn render_markdown(rows: &[ResultRow]) -> String {
    let cells = cells(rows);
    let mut out = String::new();
    for (i, row) in cells.iter().enumerate() {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
        if i == 0 {
            let align: Vec<&str> = (0..row.len())
                .map(|c| {
                    if c == 0 || c == row.len() - 1 {
                        "---"
                    } else {
                        "---:"
                    }
                })
                .collect();
            out.push_str(&format!("| {} |\n", align.join(" | ")));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::Latency;

    /// Two points of one run: fp16 and int8-token at batch 1, 512 tokens.
    pub(crate) fn fixed_rows() -> Vec<ResultRow> {
        let base = ResultRow {
            run_id: "r".into(),
            model: "m.gguf".into(),
            prefill_weight_dtype: "f32".into(),
            decode_weight_dtype: "q8_0".into(),
            ppl_weight_dtype: "f32".into(),
            batch_size: 1,
            seq_len: 512,
            gen_tokens: 32,
            status: crate::measure::sweep::PointStatus::Ok,
            repeats: Some(3),
            ..Default::default()
        };
        vec![
            ResultRow {
                scheme: "fp16".into(),
                ttft: Latency {
                    p50: Some(2201.04),
                    ..Default::default()
                },
                tpot: Latency {
                    mean: Some(25.0),
                    ci95: Some(0.5),
                    ..Default::default()
                },
                itl: Latency {
                    p95: Some(26.2),
                    ..Default::default()
                },
                decode_tokens_per_s: Some(40.0),
                kv_bytes: Some(12_509_184),
                kv_ratio_vs_fp16: Some(1.0),
                ppl: Some(24.49834),
                ppl_delta_pct: Some(0.0),
                ..base.clone()
            },
            ResultRow {
                scheme: "int8-token".into(),
                ttft: Latency {
                    p50: Some(2205.2),
                    ..Default::default()
                },
                tpot: Latency {
                    mean: Some(23.932),
                    ci95: Some(0.4),
                    ..Default::default()
                },
                itl: Latency {
                    p95: Some(25.28),
                    ..Default::default()
                },
                decode_tokens_per_s: Some(41.6),
                kv_bytes: Some(6_450_840),
                kv_ratio_vs_fp16: Some(0.515625),
                ppl: Some(24.51274),
                ppl_delta_pct: Some(0.0587),
                kl_mean: Some(0.00071),
                ..base
            },
        ]
    }

    /// A fixed result renders to exactly this text (snapshot written by hand from the rows:
    /// ΔTPOT = 23.932 / 25 − 1 = −4.27 %, KV MiB = 6,450,840 / 2²⁰ = 6.15).
    #[test]
    fn renders_aligned_snapshot() {
        let want = "\
scheme      batch  seq  TTFT ms  TPOT ms  ±95% CI  ΔTPOT %  ITL p95 ms  decode tok/s  KV MiB  KV vs fp16      PPL  ΔPPL %      KL  status
-----------------------------------------------------------------------------------------------------------------------------------------
fp16            1  512   2201.0    25.00    ±0.50        -       26.20          40.0   11.93      1.000×  24.4983   +0.00       -  ok
int8-token      1  512   2205.2    23.93    ±0.40     -4.3       25.28          41.6    6.15      0.516×  24.5127   +0.06  0.0007  ok
";
        assert_eq!(render(&fixed_rows()), want);
    }

    #[test]
    fn renders_markdown_snapshot() {
        let want = "\
| scheme | batch | seq | TTFT ms | TPOT ms | ±95% CI | ΔTPOT % | ITL p95 ms | decode tok/s | KV MiB | KV vs fp16 | PPL | ΔPPL % | KL | status |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |
| fp16 | 1 | 512 | 2201.0 | 25.00 | ±0.50 | - | 26.20 | 40.0 | 11.93 | 1.000× | 24.4983 | +0.00 | - | ok |
| int8-token | 1 | 512 | 2205.2 | 23.93 | ±0.40 | -4.3 | 25.28 | 41.6 | 6.15 | 0.516× | 24.5127 | +0.06 | 0.0007 | ok |
";
        assert_eq!(render_markdown(&fixed_rows()), want);
    }
}
