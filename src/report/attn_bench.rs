//! `kvbench attn-bench`'s table: per scheme the cache's size, the median step's floors (bytes
//! moved, FLOPs), p50/p95 step time, the ratio to fp16, the bandwidth achieved and, with a peak
//! given, its share of the peak. The same results as rows ([`AttnBenchRow`]) for
//! `--out DIR` (`DIR/results.csv`) and `--format json`.

use std::path::Path;

use crate::error::{Error, Result};
use crate::measure::attn_bench::AttnTable;
use crate::util::record::{csv_record, Record};

/// What heads the table: the step, the device and the geometry.
#[derive(Debug, Clone)]
pub struct AttnHeader {
    /// Layers.
    pub layers: usize,
    /// Sequences decoded together.
    pub batch: usize,
    /// The device, described.
    pub device: String,
    /// The model whose geometry was used.
    pub model: String,
    /// KV heads.
    pub kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Peak memory bandwidth, GB/s, when given or measured.
    pub peak_gb_s: Option<f64>,
}

/// The table of one context length, as printed.
pub fn table(h: &AttnHeader, t: &AttnTable) -> String {
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mut s = format!(
        "decode-step cache work (append + attention, {} layers), batch {}, context {} tokens, {}, model geometry {} ({} kv heads × {} head_dim){}\n",
        h.layers,
        h.batch,
        t.seq_len,
        h.device,
        h.model,
        h.kv_heads,
        h.head_dim,
        h.peak_gb_s.map_or(String::new(), |p| {
            format!(", peak bandwidth {} GB/s", (p * 10.0).round() / 10.0)
        })
    );
    // On a GPU: the host's time to issue the median step, beside the device's.
    let host = t
        .rows
        .iter()
        .any(|(_, r)| r.as_ref().is_ok_and(|r| r.host_ms.is_some()));
    s.push_str(&format!(
        "{:<28} {:>12} {:>10} {:>10} {:>10} {:>10}{} {:>9} {:>10}{}\n",
        "scheme",
        "KV MiB",
        "MiB/step",
        "GFLOP/step",
        "p50 ms",
        "p95 ms",
        if host {
            format!(" {:>10}", "host ms")
        } else {
            String::new()
        },
        "vs fp16",
        "GB/s",
        if h.peak_gb_s.is_some() {
            format!(" {:>9}", "% of peak")
        } else {
            String::new()
        }
    ));
    for (scheme, row) in &t.rows {
        let r = match row {
            Ok(r) => r,
            Err(e) => {
                s.push_str(&format!("{scheme:<28} {e}\n"));
                continue;
            }
        };
        s.push_str(&format!(
            "{:<28} {:>12.2} {:>10.2} {:>10.3} {:>10.3} {:>10.3}{} {:>9} {:>10.2}{}\n",
            r.scheme,
            mib(r.kv_bytes as f64),
            mib(r.bytes_per_step as f64),
            r.flops_per_step as f64 / 1e9,
            r.p50_ms,
            r.p95_ms,
            if host {
                r.host_ms
                    .map_or(format!(" {:>10}", "-"), |h| format!(" {h:>10.3}"))
            } else {
                String::new()
            },
            r.vs_fp16.map_or("-".into(), |f| format!("{f:.2}×")),
            r.gb_s,
            h.peak_gb_s
                .map_or(String::new(), |p| format!(" {:>9.1}", 100.0 * r.gb_s / p))
        ));
    }
    if let Some(p) = h.peak_gb_s {
        let over: Vec<&str> = t
            .rows
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok())
            .filter(|r| r.gb_s > p)
            .map(|r| r.scheme.as_str())
            .collect();
        if !over.is_empty() {
            s.push_str(&format!(
                "warning: {} read faster than the peak bandwidth ({p:.1} GB/s): the peak is \
                 wrong (a probe run while the machine was busy, or a figure below this \
                 machine's), or the cache fits in the CPU's caches at this length; the \
                 \"% of peak\" column is not a share of anything\n",
                over.join(", ")
            ));
        }
    }
    if let Some(c) = t.contention.filter(|c| c.contended()) {
        s.push_str(&format!(
            "warning: other processes used {:.2} cores while this table was timed (load {:.1}); \
             the step times describe a shared machine — stop them and rerun\n",
            c.other_cores, c.load_1m
        ));
    }
    s
}

csv_record! {
    /// One scheme at one context length: a row of `kvbench attn-bench --out DIR`'s
    /// `results.csv` and an element of `--format json`'s array (the same fields, the same
    /// values). A scheme that failed has its `error` and no measurements.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct AttnBenchRow {
        /// The model whose geometry was used (`--model` as given).
        pub model: String,
        /// The device, described.
        pub device: String,
        /// Layers.
        pub layers: usize,
        /// KV heads.
        pub kv_heads: usize,
        /// Head size, elements.
        pub head_dim: usize,
        /// Sequences decoded together.
        pub batch: usize,
        /// Context the caches were filled to, tokens.
        pub seq_len: usize,
        /// Timed decode steps (after one untimed step).
        pub steps: usize,
        /// Seed of the synthetic K/V.
        pub seed: u64,
        /// The scheme's printed name (as `--dtypes` takes it).
        pub scheme: String,
        /// Bytes of K/V the cache held after the steps, bytes.
        pub kv_bytes: Option<u64>,
        /// Bytes the median step must move (its floor), bytes.
        pub bytes_per_step: Option<u64>,
        /// FLOPs of the median step.
        pub flops_per_step: Option<u64>,
        /// Median step, ms.
        pub p50_ms: Option<f64>,
        /// 95th-percentile step, ms.
        pub p95_ms: Option<f64>,
        /// Median host time to issue a step's launches, ms (GPU only; empty on the CPU): near
        /// `p50_ms`, the host sets the pace, not the device.
        pub host_ms: Option<f64>,
        /// Median step over fp16's (when fp16 ran before it in the list), ratio.
        pub vs_fp16: Option<f64>,
        /// Bytes per median step over its time, GB/s (10^9 bytes/s).
        pub gb_s: Option<f64>,
        /// Peak memory bandwidth given or measured (`--peak-bandwidth`), GB/s.
        pub peak_gb_s: Option<f64>,
        /// `gb_s` as a share of `peak_gb_s`, percent.
        pub pct_of_peak: Option<f64>,
        /// Cores other processes occupied while this length was timed (`None`: cannot tell).
        pub other_cores: Option<f64>,
        /// Why the scheme failed (first line); empty when it ran.
        pub error: String,
    }
}

/// The rows of one context length's table, in the table's order; `steps` and `seed` as run.
pub fn rows(h: &AttnHeader, t: &AttnTable, steps: usize, seed: u64) -> Vec<AttnBenchRow> {
    t.rows
        .iter()
        .map(|(scheme, r)| {
            let mut row = AttnBenchRow {
                model: h.model.clone(),
                device: h.device.clone(),
                layers: h.layers,
                kv_heads: h.kv_heads,
                head_dim: h.head_dim,
                batch: h.batch,
                seq_len: t.seq_len,
                steps,
                seed,
                scheme: scheme.clone(),
                peak_gb_s: h.peak_gb_s,
                other_cores: t.contention.map(|c| c.other_cores),
                ..AttnBenchRow::default()
            };
            match r {
                Ok(r) => {
                    row.kv_bytes = Some(r.kv_bytes as u64);
                    row.bytes_per_step = Some(r.bytes_per_step);
                    row.flops_per_step = Some(r.flops_per_step);
                    row.p50_ms = Some(r.p50_ms);
                    row.p95_ms = Some(r.p95_ms);
                    row.host_ms = r.host_ms;
                    row.vs_fp16 = r.vs_fp16;
                    row.gb_s = Some(r.gb_s);
                    row.pct_of_peak = h.peak_gb_s.map(|p| 100.0 * r.gb_s / p);
                }
                Err(e) => row.error = e.clone(),
            }
            row
        })
        .collect()
}

/// Writes `rows` as a CSV file at `path`: the header ([`AttnBenchRow`]'s columns) even when
/// there are no rows, then one line per row; an absent value is an empty cell. Replaces the
/// file (the caller refuses an existing one before the run). Errors: [`Error::Io`] naming
/// the file.
pub fn write_csv(path: &Path, rows: &[AttnBenchRow]) -> Result<()> {
    let io = |e: csv::Error| Error::io(path, std::io::Error::other(e.to_string()));
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_path(path)
        .map_err(io)?;
    w.write_record(AttnBenchRow::COLUMNS).map_err(io)?;
    for r in rows {
        w.serialize(r).map_err(io)?;
    }
    w.flush().map_err(|e| Error::io(path, e))
}

/// Reads a `results.csv` that [`write_csv`] wrote. Errors: [`Error::Io`] naming the file
/// (missing, unreadable, a row that does not parse).
pub fn read_csv(path: &Path) -> Result<Vec<AttnBenchRow>> {
    let io = |e: csv::Error| Error::io(path, std::io::Error::other(e.to_string()));
    let f = crate::util::open_regular(path).map_err(|e| Error::io(path, e))?;
    csv::Reader::from_reader(f)
        .deserialize()
        .map(|r| r.map_err(io))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::attn_bench::AttnRow;

    fn row(scheme: &str, gb_s: f64) -> (String, std::result::Result<AttnRow, String>) {
        let r = AttnRow {
            scheme: scheme.into(),
            kv_bytes: 1 << 20,
            bytes_per_step: 1 << 20,
            flops_per_step: 0,
            p50_ms: 1.0,
            p95_ms: 1.0,
            vs_fp16: None,
            gb_s,
            host_ms: None,
        };
        (scheme.into(), Ok(r))
    }

    /// Issue #24: a bandwidth above the peak (fp16 at 20.4 GB/s against a 10.2 GB/s probe:
    /// "200.0 % of peak") is flagged, naming the scheme; below it nothing is said.
    #[test]
    fn above_the_peak_is_flagged() {
        let h = |p| AttnHeader {
            layers: 30,
            batch: 1,
            device: "CPU".into(),
            model: "default".into(),
            kv_heads: 3,
            head_dim: 64,
            peak_gb_s: Some(p),
        };
        let t = AttnTable {
            seq_len: 8192,
            rows: vec![row("fp16", 20.4), row("int4", 9.0)],
            contention: None,
        };
        let out = table(&h(10.2), &t);
        assert!(out.contains("200.0"), "{out}");
        assert!(
            out.contains("warning: fp16 read faster than the peak bandwidth (10.2 GB/s)"),
            "{out}"
        );
        assert!(!table(&h(27.7), &t).contains("warning"));
    }

    /// The H200 run's question, "is the host the bottleneck?": a GPU row's host time gets its
    /// own column beside p50/p95 (3.472 ms of device time, 3.301 issuing: the first run's
    /// window step, host time made up), a row without one shows "-", and a CPU table (no host
    /// times) has no such column. The CSV carries it by name.
    #[test]
    fn host_time_column_only_on_a_gpu() {
        let h = AttnHeader {
            layers: 32,
            batch: 1,
            device: "NVIDIA H200".into(),
            model: "llama-3-8b".into(),
            kv_heads: 8,
            head_dim: 128,
            peak_gb_s: None,
        };
        let (name, mut r) = row("window", 10.26);
        if let Ok(r) = r.as_mut() {
            r.p50_ms = 3.472;
            r.host_ms = Some(3.301);
        }
        let t = AttnTable {
            seq_len: 32768,
            rows: vec![(name, r), row("fp16", 193.3)],
            contention: None,
        };
        let out = table(&h, &t);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].contains("p95 ms    host ms"), "{out}");
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(&cells[4..7], ["3.472", "1.000", "3.301"], "{out}");
        assert_eq!(lines[3].split_whitespace().nth(6), Some("-"), "{out}");
        let cpu = AttnTable {
            rows: vec![row("fp16", 19.4)],
            ..t.clone()
        };
        assert!(!table(&h, &cpu).contains("host ms"));
        let rows = rows(&h, &t, 30, 0);
        assert_eq!((rows[0].host_ms, rows[1].host_ms), (Some(3.301), None));
        assert!(AttnBenchRow::COLUMNS.contains(&"host_ms"));
    }
}
