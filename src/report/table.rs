//! The terminal summary: one line per point, schemes grouped, deltas against the fp16 baseline.

use super::ResultRow;

/// Renders rows as an aligned plain-text table.
pub fn render(rows: &[ResultRow]) -> String {
    let header = [
        "scheme",
        "batch",
        "seq",
        "TTFT ms",
        "TPOT p50 ms",
        "TPOT p95 ms",
        "decode tok/s",
        "KV MiB",
        "KV vs fp16",
        "PPL",
        "ΔPPL %",
        "status",
    ];
    let f = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        cells.push(vec![
            r.scheme.clone(),
            r.batch_size.to_string(),
            r.seq_len.to_string(),
            f(r.ttft_ms, 1),
            f(r.tpot_ms_p50, 2),
            f(r.tpot_ms_p95, 2),
            f(r.decode_tokens_per_s, 1),
            f(r.kv_bytes.map(|b| b as f64 / (1u64 << 20) as f64), 2),
            r.kv_ratio_vs_fp16
                .map_or("-".into(), |x| format!("{x:.3}×")),
            f(r.ppl, 4),
            r.ppl_delta_pct.map_or("-".into(), |x| format!("{x:+.2}")),
            r.kl_mean.map_or("-".into(), |x| format!("{x:.4}")),
            f(r.top1_agree_pct, 1),
            if r.status.len() > 40 {
                format!(
                    "{}…",
                    &r.status[..r
                        .status
                        .char_indices()
                        .nth(39)
                        .map_or(r.status.len(), |c| c.0)]
                )
            } else {
                r.status.clone()
            },
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
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
                let pad = w - s.chars().count();
                // Text columns left-aligned, numbers right-aligned.
                if c == 0 || c == header.len() - 1 {
                    format!("{s}{}", " ".repeat(pad))
                } else {
                    format!("{}{s}", " ".repeat(pad))
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
