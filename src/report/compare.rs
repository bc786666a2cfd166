//! Two sweeps compared point by point (`kvbench report A B --label a,b`): for every (scheme,
//! batch, prompt) point both runs finished, the relative change of TTFT, TPOT and decode
//! tokens/s from run A to run B with an interval, and per scheme the change of perplexity.
//!
//! Interval of a relative change of means (the delta method for a ratio of independent means,
//! as criterion.rs's `change` estimate reports a % change with its interval): with each run's
//! 95 % half-width `h` of its mean, `Δ% = (b / a − 1) · 100` and its half-width
//! `100 · (b/a) · √((h_a/a)² + (h_b/b)²)`. A change whose interval excludes 0 is marked
//! significant. Runs timed on a busy machine (`contended`) are marked, not dropped.

use super::ResultRow;

/// One point's change from run A to run B.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PointDelta {
    /// Scheme spec.
    pub scheme: String,
    /// Batch size.
    pub batch_size: usize,
    /// Prompt length, tokens.
    pub seq_len: usize,
    /// TTFT change, % (`None`: not in both runs).
    pub ttft_pct: Option<Change>,
    /// TPOT change, %.
    pub tpot_pct: Option<Change>,
    /// Decode tokens/s change, % (no interval: the rows carry none).
    pub decode_tps_pct: Option<f64>,
    /// Perplexity change from A to B, % (the scheme's, repeated on each of its points).
    pub ppl_pct: Option<f64>,
    /// Whether either run's point was timed on a busy machine.
    pub contended: bool,
}

/// A relative change with its 95 % half-width, %.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Change {
    /// `(b / a − 1) · 100`.
    pub pct: f64,
    /// Half-width of its 95 % interval, % (`None` when a run has no interval).
    pub ci95: Option<f64>,
}

impl Change {
    /// The change of mean `b` (half-width `hb`) from mean `a` (half-width `ha`); `None` when
    /// `a` is not a positive finite number.
    pub fn of(a: f64, ha: Option<f64>, b: f64, hb: Option<f64>) -> Option<Change> {
        if !(a > 0.0 && a.is_finite() && b.is_finite()) {
            return None;
        }
        let r = b / a;
        let ci95 = ha
            .zip(hb)
            .map(|(ha, hb)| 100.0 * r * ((ha / a).powi(2) + (hb / b).powi(2)).sqrt());
        Some(Change {
            pct: (r - 1.0) * 100.0,
            ci95,
        })
    }

    /// Whether the interval excludes 0.
    pub fn significant(&self) -> bool {
        self.ci95.is_some_and(|h| self.pct.abs() > h)
    }
}

/// The points of `b` that `a` also finished, in `b`'s order, with their changes.
pub fn compare(a: &[ResultRow], b: &[ResultRow]) -> Vec<PointDelta> {
    let ok = |r: &&ResultRow| r.status.is_ok();
    let ppl = |rows: &[ResultRow], scheme: &str| {
        rows.iter()
            .filter(|r| r.scheme == scheme)
            .find_map(|r| r.ppl)
    };
    b.iter()
        .filter(ok)
        .filter_map(|rb| {
            let ra = a.iter().filter(ok).find(|r| {
                (r.scheme.as_str(), r.batch_size, r.seq_len)
                    == (rb.scheme.as_str(), rb.batch_size, rb.seq_len)
            })?;
            let lat = |x: &super::Latency, y: &super::Latency| {
                Change::of(x.mean?, x.ci95, y.mean?, y.ci95)
            };
            Some(PointDelta {
                scheme: rb.scheme.clone(),
                batch_size: rb.batch_size,
                seq_len: rb.seq_len,
                ttft_pct: lat(&ra.ttft, &rb.ttft),
                tpot_pct: lat(&ra.tpot, &rb.tpot),
                decode_tps_pct: ra
                    .decode_tokens_per_s
                    .zip(rb.decode_tokens_per_s)
                    .and_then(|(x, y)| Change::of(x, None, y, None))
                    .map(|c| c.pct),
                ppl_pct: ppl(a, &rb.scheme)
                    .zip(ppl(b, &rb.scheme))
                    .and_then(|(x, y)| Change::of(x, None, y, None))
                    .map(|c| c.pct),
                contended: ra.contended == Some(true) || rb.contended == Some(true),
            })
        })
        .collect()
}

/// The comparison as a Markdown table headed by the two labels; `*` marks a change whose 95 %
/// interval excludes 0, `(busy)` a point timed while the machine was contended.
pub fn render(deltas: &[PointDelta], label_a: &str, label_b: &str) -> String {
    let change = |c: &Option<Change>| match c {
        Some(c) => format!(
            "{:+.1} %{}{}",
            c.pct,
            c.ci95.map_or(String::new(), |h| format!(" ± {h:.1}")),
            if c.significant() { " *" } else { "" }
        ),
        None => "—".into(),
    };
    let plain = |v: &Option<f64>| v.map_or("—".into(), |v| format!("{v:+.2} %"));
    let mut out = format!(
        "## {label_b} vs {label_a}, point by point\n\n\
         Change from {label_a} to {label_b} (± 95 % interval of the change; * the interval \
         excludes 0; (busy) timed on a contended machine).\n\n\
         | scheme | batch | prompt | TTFT | TPOT | decode tokens/s | perplexity |\n\
         |---|---:|---:|---:|---:|---:|---:|\n"
    );
    for d in deltas {
        out.push_str(&format!(
            "| {}{} | {} | {} | {} | {} | {} | {} |\n",
            d.scheme,
            if d.contended { " (busy)" } else { "" },
            d.batch_size,
            d.seq_len,
            change(&d.ttft_pct),
            change(&d.tpot_pct),
            plain(&d.decode_tps_pct),
            plain(&d.ppl_pct),
        ));
    }
    if deltas.is_empty() {
        out.push_str("\n(no point finished in both runs)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Latency;

    fn row(scheme: &str, tpot: (f64, f64), ppl: f64) -> ResultRow {
        ResultRow {
            scheme: scheme.into(),
            batch_size: 1,
            seq_len: 128,
            status: crate::measure::sweep::PointStatus::Ok,
            tpot: Latency {
                mean: Some(tpot.0),
                ci95: Some(tpot.1),
                ..Default::default()
            },
            decode_tokens_per_s: Some(1000.0 / tpot.0),
            ppl: Some(ppl),
            ..Default::default()
        }
    }

    /// By hand: TPOT 10 ± 0.5 → 8 ± 0.4 ms is −20 % ± 100·0.8·√(0.05² + 0.05²) = ±5.657 %
    /// (significant); 10 ± 1 → 10.5 ± 1 is +5 % ± 100·1.05·√(0.1² + (1/10.5)²) = ±14.5 %
    /// (not); tokens/s 100 → 125 is +25 %; perplexity 20 → 20.2 is +1 %.
    #[test]
    fn changes_by_hand() {
        let a = vec![
            row("fp16", (10.0, 0.5), 20.0),
            row("int4", (10.0, 1.0), 22.0),
        ];
        let b = vec![
            row("fp16", (8.0, 0.4), 20.2),
            row("int4", (10.5, 1.0), 22.0),
            row("int8", (9.0, 0.1), 21.0),
        ];
        let d = compare(&a, &b);
        assert_eq!(d.len(), 2, "int8 is only in B");
        let t = d[0].tpot_pct.unwrap();
        assert!((t.pct + 20.0).abs() < 1e-9 && (t.ci95.unwrap() - 5.656854).abs() < 1e-5);
        assert!(t.significant());
        let t = d[1].tpot_pct.unwrap();
        let want = 105.0 * (0.01f64 + (1.0f64 / 10.5).powi(2)).sqrt();
        assert!((t.pct - 5.0).abs() < 1e-9 && (t.ci95.unwrap() - want).abs() < 1e-9);
        assert!((want - 14.5).abs() < 0.05 && !t.significant());
        assert!((d[0].decode_tps_pct.unwrap() - 25.0).abs() < 1e-9);
        assert!((d[0].ppl_pct.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(d[1].ppl_pct, Some(0.0));
        let md = render(&d, "old", "new");
        assert!(
            md.contains("| fp16 | 1 | 128 | — | -20.0 % ± 5.7 * | +25.00 % | +1.00 % |"),
            "{md}"
        );
        assert!(md.contains("+5.0 % ± 14.5 |"), "{md}");
    }
}
