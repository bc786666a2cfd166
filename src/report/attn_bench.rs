//! `kvbench attn-bench`'s table: per scheme the cache's size, the median step's floors (bytes
//! moved, FLOPs), p50/p95 step time, the ratio to fp16, the bandwidth achieved and, with a peak
//! given, its share of the peak.

use crate::measure::attn_bench::AttnTable;

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
    s.push_str(&format!(
        "{:<28} {:>12} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10}{}\n",
        "scheme",
        "KV MiB",
        "MiB/step",
        "GFLOP/step",
        "p50 ms",
        "p95 ms",
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
            "{:<28} {:>12.2} {:>10.2} {:>10.3} {:>10.3} {:>10.3} {:>9} {:>10.2}{}\n",
            r.scheme,
            mib(r.kv_bytes as f64),
            mib(r.bytes_per_step as f64),
            r.flops_per_step as f64 / 1e9,
            r.p50_ms,
            r.p95_ms,
            r.vs_fp16.map_or("-".into(), |f| format!("{f:.2}×")),
            r.gb_s,
            h.peak_gb_s
                .map_or(String::new(), |p| format!(" {:>9.1}", 100.0 * r.gb_s / p))
        ));
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
