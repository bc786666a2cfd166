//! The terminal summary: one line per point, schemes grouped, deltas against the fp16 baseline.

use super::ResultRow;

/// Renders rows as an aligned plain-text table (one cell per header column; the test below
/// pins the layout).
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
        "KL",
        "top-1 %",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed result renders to exactly this text (snapshot written by hand from the row).
    #[test]
    fn renders_aligned_snapshot() {
        let row = ResultRow {
            run_id: "r".into(),
            model: "m".into(),
            prefill_weight_dtype: "f32".into(),
            decode_weight_dtype: "q8_0".into(),
            scheme: "int8-token".into(),
            batch_size: 1,
            seq_len: 512,
            gen_tokens: 32,
            status: "ok".into(),
            ttft_ms: Some(2205.2),
            prefill_tokens_per_s: None,
            tpot_ms_mean: None,
            tpot_ms_p50: Some(23.932),
            tpot_ms_p95: Some(25.28),
            decode_tokens_per_s: Some(41.6),
            kv_tokens: Some(543),
            kv_bytes: Some(6450840),
            kv_bytes_predicted: Some(6450840),
            kv_bytes_per_token: None,
            kv_ratio_vs_fp16: Some(0.515625),
            kv_reserved_bytes: None,
            peak_rss_bytes: None,
            saturated_values: Some(0),
            ppl: Some(24.51274),
            ppl_delta_pct: Some(0.0587),
            ppl_mean_nll: None,
            kl_mean: Some(0.00071),
            kl_p99: None,
            kl_q1: None,
            kl_q2: None,
            kl_q3: None,
            kl_q4: None,
            top1_agree_pct: Some(97.25),
            mean_abs_dp_top: None,
            ppl_mode: None,
            ppl_windows: None,
            ppl_ctx: None,
            ppl_weight_dtype: "f32".into(),
        };
        let want = "\
scheme      batch  seq  TTFT ms  TPOT p50 ms  TPOT p95 ms  decode tok/s  KV MiB  KV vs fp16      PPL  ΔPPL %      KL  top-1 %  status
-------------------------------------------------------------------------------------------------------------------------------------
int8-token      1  512   2205.2        23.93        25.28          41.6    6.15      0.516×  24.5127   +0.06  0.0007     97.2  ok
";
        assert_eq!(render(&[row]), want);
    }
}
