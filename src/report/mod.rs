//! Turning finished results into bytes: `results.csv` rows, `meta.json`, the terminal table.
//! Nothing here measures anything.

pub mod chart;
pub mod meta;
pub mod table;

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme};
use crate::measure::sweep::{PointOutcome, PointSink};

/// One row of `results.csv`: the output schema. Units are in the field names; every column is
/// documented in the README.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResultRow {
    /// Run folder name (timestamp + model).
    pub run_id: String,
    /// Model file or repo (`meta.json` has its sha256).
    pub model: String,
    /// Dtype of the linear layers during prefill (`f32`, `q8_0`, `native`).
    pub prefill_weight_dtype: String,
    /// Dtype of the linear layers during decode steps.
    pub decode_weight_dtype: String,
    /// KV-cache scheme spec (the string `--dtypes` takes).
    pub scheme: String,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// Prompt tokens per sequence.
    pub seq_len: usize,
    /// Tokens generated per sequence (first one from prefill).
    pub gen_tokens: usize,
    /// `ok`, `oom: ...` or `error: ...`.
    pub status: String,
    /// Time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Prefill throughput over the batch, tokens/s.
    pub prefill_tokens_per_s: Option<f64>,
    /// Mean time per output token after the first, ms.
    pub tpot_ms_mean: Option<f64>,
    /// Median TPOT, ms.
    pub tpot_ms_p50: Option<f64>,
    /// 95th-percentile TPOT, ms.
    pub tpot_ms_p95: Option<f64>,
    /// Decode throughput over the batch, tokens/s.
    pub decode_tokens_per_s: Option<f64>,
    /// Tokens held per sequence when the point ended (`seq_len + gen_tokens − 1`).
    pub kv_tokens: Option<usize>,
    /// Bytes of K/V held at the end, all sequences, scales and zero-points included.
    pub kv_bytes: Option<usize>,
    /// What the scheme's byte formula predicts for `batch_size` sequences of `kv_tokens`
    /// (the same accounting `kvbench plan` uses); equals `kv_bytes` when the cache is right.
    pub kv_bytes_predicted: Option<usize>,
    /// `kv_bytes / (batch_size × kv_tokens)`: bytes per token of context.
    pub kv_bytes_per_token: Option<f64>,
    /// `kv_bytes` over what fp16 would hold for the same tokens (formula), e.g. 0.516 for int8.
    pub kv_ratio_vs_fp16: Option<f64>,
    /// Bytes the cache had allocated (capacity ≥ kv_bytes).
    pub kv_reserved_bytes: Option<usize>,
    /// Peak resident set size of the process during this point, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Values saturated by an fp8 scale fixed at the first write (0 for other formats).
    pub saturated_values: Option<u64>,
    /// Perplexity of the scheme on WikiText-2 (protocol in `meta.json`).
    pub ppl: Option<f64>,
    /// `100 × (ppl / ppl_fp16 − 1)`, % (empty when fp16 was not run first).
    pub ppl_delta_pct: Option<f64>,
    /// Mean NLL per scored token, nats.
    pub ppl_mean_nll: Option<f64>,
    /// Mean KL(P_fp16 ‖ P_scheme) per scored token, nats (lockstep with an fp16 cache).
    pub kl_mean: Option<f64>,
    /// 99th percentile of per-token KL, nats.
    pub kl_p99: Option<f64>,
    /// Mean KL over the first … last quarter of each window's scored span, nats.
    pub kl_q1: Option<f64>,
    /// Second quarter.
    pub kl_q2: Option<f64>,
    /// Third quarter.
    pub kl_q3: Option<f64>,
    /// Last quarter.
    pub kl_q4: Option<f64>,
    /// Scored tokens whose greedy token equals the fp16 cache's, %.
    pub top1_agree_pct: Option<f64>,
    /// Mean |Δp| of the fp16 cache's top token.
    pub mean_abs_dp_top: Option<f64>,
    /// `chunked` or `decode`.
    pub ppl_mode: Option<String>,
    /// Windows in the perplexity run.
    pub ppl_windows: Option<usize>,
    /// Tokens per perplexity window.
    pub ppl_ctx: Option<usize>,
    /// Dtype of the linear layers during perplexity.
    pub ppl_weight_dtype: String,
}

/// Columns of `results.csv`, in order, with their meaning (for `--help` and the README).
pub const CSV_COLUMNS: &[&str] = &[
    "run_id",
    "model",
    "prefill_weight_dtype",
    "decode_weight_dtype",
    "scheme",
    "batch_size",
    "seq_len",
    "gen_tokens",
    "status",
    "ttft_ms",
    "prefill_tokens_per_s",
    "tpot_ms_mean",
    "tpot_ms_p50",
    "tpot_ms_p95",
    "decode_tokens_per_s",
    "kv_tokens",
    "kv_bytes",
    "kv_bytes_predicted",
    "kv_bytes_per_token",
    "kv_ratio_vs_fp16",
    "kv_reserved_bytes",
    "peak_rss_bytes",
    "ppl",
    "ppl_delta_pct",
    "ppl_mean_nll",
    "ppl_windows",
    "ppl_ctx",
    "ppl_weight_dtype",
];

/// Fixed context of a run that every row repeats.
#[derive(Debug, Clone)]
pub struct RowContext {
    /// Run id.
    pub run_id: String,
    /// Model label.
    pub model: String,
    /// Prefill weight dtype.
    pub prefill_weight_dtype: String,
    /// Decode weight dtype.
    pub decode_weight_dtype: String,
    /// Perplexity weight dtype.
    pub ppl_weight_dtype: String,
    /// Perplexity window length.
    pub ppl_ctx: Option<usize>,
    /// Geometry, for the fp16 ratio.
    pub geometry: CacheGeometry,
}

impl ResultRow {
    /// Builds the row for a finished point.
    pub fn new(ctx: &RowContext, o: &PointOutcome) -> Self {
        let t = o.timing.as_ref().ok();
        let agreement = o.ppl.as_ref().and_then(|p| p.agreement.as_ref());
        let fp16_bytes = |tokens: usize| {
            (KvScheme::FP16.bytes_per_token(&ctx.geometry) * tokens * o.batch) as f64
        };
        ResultRow {
            run_id: ctx.run_id.clone(),
            model: ctx.model.clone(),
            prefill_weight_dtype: ctx.prefill_weight_dtype.clone(),
            decode_weight_dtype: ctx.decode_weight_dtype.clone(),
            scheme: o.scheme.to_string(),
            batch_size: o.batch,
            seq_len: o.seq_len,
            gen_tokens: t.map_or(0, |t| t.kv_tokens + 1 - o.seq_len),
            status: match &o.timing {
                Ok(_) => "ok".into(),
                Err(e) => e.clone(),
            },
            ttft_ms: t.and_then(|t| t.ttft_ms),
            prefill_tokens_per_s: t.and_then(|t| t.prefill_tokens_per_s),
            tpot_ms_mean: t.map(|t| t.tpot_ms.mean),
            tpot_ms_p50: t.map(|t| t.tpot_ms.p50),
            tpot_ms_p95: t.map(|t| t.tpot_ms.p95),
            decode_tokens_per_s: t.map(|t| t.decode_tokens_per_s),
            kv_tokens: t.map(|t| t.kv_tokens),
            kv_bytes: t.map(|t| t.kv_bytes),
            kv_bytes_predicted: t.map(|t| o.scheme.bytes_for(&ctx.geometry, o.batch, t.kv_tokens)),
            kv_bytes_per_token: t.map(|t| t.kv_bytes as f64 / (o.batch * t.kv_tokens) as f64),
            kv_ratio_vs_fp16: t.map(|t| t.kv_bytes as f64 / fp16_bytes(t.kv_tokens)),
            kv_reserved_bytes: t.map(|t| t.kv_reserved_bytes),
            peak_rss_bytes: t.and_then(|t| t.peak_rss_bytes),
            saturated_values: t.map(|t| t.saturated_values),
            ppl: o.ppl.as_ref().map(|p| p.perplexity),
            ppl_delta_pct: o
                .ppl
                .as_ref()
                .zip(o.baseline_ppl)
                .map(|(p, b)| 100.0 * (p.perplexity / b - 1.0)),
            ppl_mean_nll: o.ppl.as_ref().map(|p| p.mean_nll),
            kl_mean: agreement.map(|a| a.kl_mean),
            kl_p99: agreement.map(|a| a.kl_p99),
            kl_q1: agreement.map(|a| a.kl_by_quarter[0]),
            kl_q2: agreement.map(|a| a.kl_by_quarter[1]),
            kl_q3: agreement.map(|a| a.kl_by_quarter[2]),
            kl_q4: agreement.map(|a| a.kl_by_quarter[3]),
            top1_agree_pct: agreement.map(|a| a.top1_agree_pct),
            mean_abs_dp_top: agreement.map(|a| a.mean_abs_dp_top),
            ppl_mode: o.ppl.as_ref().map(|p| p.mode.to_string()),
            ppl_windows: o.ppl.as_ref().map(|p| p.windows),
            ppl_ctx: o.ppl.as_ref().and(ctx.ppl_ctx),
            ppl_weight_dtype: ctx.ppl_weight_dtype.clone(),
        }
    }
}

/// Called with every row after it is written.
type RowHook = Box<dyn FnMut(&ResultRow)>;

/// Writes `results.csv` row by row (flushed after each, so an interrupted sweep keeps every
/// finished point) and keeps the rows for the summary table.
pub struct CsvSink {
    path: PathBuf,
    writer: csv::Writer<File>,
    ctx: RowContext,
    /// Rows written so far.
    pub rows: Vec<ResultRow>,
    on_row: Option<RowHook>,
}

impl CsvSink {
    /// Creates (truncates) `path` and writes the header.
    pub fn create(path: &Path, ctx: RowContext) -> Result<Self> {
        let writer = csv::Writer::from_path(path).map_err(|e| Error::io(path, csv_io(e)))?;
        Ok(Self {
            path: path.to_path_buf(),
            writer,
            ctx,
            rows: Vec::new(),
            on_row: None,
        })
    }

    /// Calls `f` with every row after it is written (e.g. to print it above a progress bar).
    pub fn on_row(mut self, f: impl FnMut(&ResultRow) + 'static) -> Self {
        self.on_row = Some(Box::new(f));
        self
    }
}

fn csv_io(e: csv::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl PointSink for CsvSink {
    fn point(&mut self, outcome: &PointOutcome) -> Result<()> {
        let row = ResultRow::new(&self.ctx, outcome);
        self.writer
            .serialize(&row)
            .map_err(|e| Error::io(&self.path, csv_io(e)))?;
        self.writer.flush().map_err(|e| Error::io(&self.path, e))?;
        if let Some(f) = self.on_row.as_mut() {
            f(&row);
        }
        self.rows.push(row);
        Ok(())
    }
}

/// Reads a `results.csv` back (for tests and later re-rendering).
pub fn read_csv(path: &Path) -> Result<Vec<ResultRow>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| Error::io(path, csv_io(e)))?;
    r.deserialize()
        .map(|row| row.map_err(|e| Error::io(path, csv_io(e))))
        .collect()
}
