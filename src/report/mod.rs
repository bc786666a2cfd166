//! Turning finished results into bytes: `results.csv` rows, `meta.json`, the terminal table.
//! Nothing here measures anything.

pub mod chart;
pub mod gate;
pub mod merge;
pub mod meta;
pub mod plots;
pub mod summary;
pub mod table;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme};
use crate::stats::summarize;
use crate::measure::sweep::{PointOutcome, PointSink, QualityOutcome};

/// One row of `results.csv`: the output schema. Units are in the field names; every column is
/// documented in the README.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Timed repeats behind the latency columns (each a fresh cache; warm-up excluded).
    pub repeats: Option<usize>,
    /// Time to first token (prefill + first greedy pick), mean over repeats, ms.
    pub ttft_ms_mean: Option<f64>,
    /// Median TTFT, ms.
    pub ttft_ms_p50: Option<f64>,
    /// 95th-percentile TTFT, ms.
    pub ttft_ms_p95: Option<f64>,
    /// 99th-percentile TTFT, ms.
    pub ttft_ms_p99: Option<f64>,
    /// Sample standard deviation of TTFT, ms.
    pub ttft_ms_std: Option<f64>,
    /// Half-width of the 95 % confidence interval of mean TTFT (Student's t), ms.
    pub ttft_ms_ci95: Option<f64>,
    /// Prefill throughput over the batch, tokens/s (`batch × seq_len / TTFT`).
    pub prefill_tokens_per_s: Option<f64>,
    /// Time per output token after the first, `(E2E − TTFT)/(gen − 1)`, mean over repeats, ms.
    pub tpot_ms_mean: Option<f64>,
    /// Median TPOT over repeats, ms.
    pub tpot_ms_p50: Option<f64>,
    /// 95th-percentile TPOT over repeats, ms.
    pub tpot_ms_p95: Option<f64>,
    /// 99th-percentile TPOT over repeats, ms.
    pub tpot_ms_p99: Option<f64>,
    /// Sample standard deviation of TPOT, ms.
    pub tpot_ms_std: Option<f64>,
    /// Half-width of the 95 % confidence interval of mean TPOT, ms.
    pub tpot_ms_ci95: Option<f64>,
    /// Inter-token latency (one decode step), mean over all steps of all repeats, ms.
    pub itl_ms_mean: Option<f64>,
    /// Median ITL, ms.
    pub itl_ms_p50: Option<f64>,
    /// 95th-percentile ITL, ms.
    pub itl_ms_p95: Option<f64>,
    /// 99th-percentile ITL, ms.
    pub itl_ms_p99: Option<f64>,
    /// ITL samples outside Tukey's fences (1.5 × IQR): a count worth a warning when high.
    pub itl_outliers: Option<usize>,
    /// End-to-end latency of one request (TTFT + all ITLs), mean over repeats, ms.
    pub e2e_ms_mean: Option<f64>,
    /// Decode throughput over the batch, tokens/s (`batch × steps / Σ ITL`).
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
    /// GPU runs: device memory in use at its highest sample (after prefill and every decode
    /// step; `cuMemGetInfo` total − free), bytes. Empty on the CPU.
    pub vram_peak_bytes: Option<u64>,
    /// Memory bandwidth a decode step achieves, GB/s: the bytes it must read at the end of the
    /// point (decode weights once + the KV held, [`RowContext::decode_weight_bytes`] +
    /// `kv_bytes`) over the median TPOT. The floor of a memory-bound step is these bytes over
    /// the device's peak bandwidth (roofline; see `crate::measure::floors`).
    pub decode_gb_s: Option<f64>,
    /// Values saturated by an fp8 scale fixed at the first write (0 for other formats).
    pub saturated_values: Option<u64>,
    /// Cores other processes occupied on average during this point's timed repeats (Linux
    /// `/proc`; see `crate::measure::contention`), cores.
    pub other_cpu_cores: Option<f64>,
    /// Whether `other_cpu_cores` exceeded 0.15: the timings are inflated by a shared machine.
    pub contended: Option<bool>,
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
    /// XSum articles summarized (greedy, chat template) for the ROUGE columns.
    pub rouge_samples: Option<usize>,
    /// Mean ROUGE-1 F1 against the XSum references (rouge-score, Porter stemmer).
    pub rouge1_f1: Option<f64>,
    /// Mean ROUGE-2 F1.
    pub rouge2_f1: Option<f64>,
    /// Mean ROUGE-L F1.
    pub rouge_l_f1: Option<f64>,
    /// Mean ROUGE-Lsum F1.
    pub rouge_lsum_f1: Option<f64>,
    /// Mean ROUGE-L F1 of each summary against the fp16 cache's summary of the same article
    /// (1 = identical summaries): agreement with the baseline.
    pub rouge_l_vs_fp16: Option<f64>,
    /// Passkey trials (lengths × depths × trials).
    pub passkey_trials: Option<usize>,
    /// Passkey trials answered correctly, %.
    pub passkey_accuracy_pct: Option<f64>,
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
    "repeats",
    "ttft_ms_mean",
    "ttft_ms_p50",
    "ttft_ms_p95",
    "ttft_ms_p99",
    "ttft_ms_std",
    "ttft_ms_ci95",
    "prefill_tokens_per_s",
    "tpot_ms_mean",
    "tpot_ms_p50",
    "tpot_ms_p95",
    "tpot_ms_p99",
    "tpot_ms_std",
    "tpot_ms_ci95",
    "itl_ms_mean",
    "itl_ms_p50",
    "itl_ms_p95",
    "itl_ms_p99",
    "itl_outliers",
    "e2e_ms_mean",
    "decode_tokens_per_s",
    "kv_tokens",
    "kv_bytes",
    "kv_bytes_predicted",
    "kv_bytes_per_token",
    "kv_ratio_vs_fp16",
    "kv_reserved_bytes",
    "peak_rss_bytes",
    "vram_peak_bytes",
    "decode_gb_s",
    "saturated_values",
    "other_cpu_cores",
    "contended",
    "ppl",
    "ppl_delta_pct",
    "ppl_mean_nll",
    "kl_mean",
    "kl_p99",
    "kl_q1",
    "kl_q2",
    "kl_q3",
    "kl_q4",
    "top1_agree_pct",
    "mean_abs_dp_top",
    "rouge_samples",
    "rouge1_f1",
    "rouge2_f1",
    "rouge_l_f1",
    "rouge_lsum_f1",
    "rouge_l_vs_fp16",
    "passkey_trials",
    "passkey_accuracy_pct",
    "ppl_mode",
    "ppl_windows",
    "ppl_ctx",
    "ppl_weight_dtype",
];

/// Fixed context of a run that every row repeats (kept in `meta.json` as `report_context`, so
/// `kvbench report` can rebuild rows from `raw.jsonl`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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
    /// Bytes the decode model's weights occupy as stored (`Model::weight_bytes`), for the
    /// achieved-bandwidth column; absent in runs made before it was recorded.
    #[serde(default)]
    pub decode_weight_bytes: Option<usize>,
}

impl ResultRow {
    /// Builds the row for a finished point.
    pub fn new(ctx: &RowContext, o: &PointOutcome) -> Self {
        let t = o.timing.as_ref().ok();
        let ttft = t.and_then(|t| summarize(&t.ttft_ms));
        let tpot = t.and_then(|t| summarize(&t.tpot_ms()));
        let itl = t.and_then(|t| summarize(&t.itl_all_ms()));
        let rouge_f1 = o.rouge.as_ref().map(|r| r.mean_f1());
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
            repeats: t.map(|t| t.itl_ms.len()),
            ttft_ms_mean: ttft.map(|s| s.mean),
            ttft_ms_p50: ttft.map(|s| s.p50),
            ttft_ms_p95: ttft.map(|s| s.p95),
            ttft_ms_p99: ttft.map(|s| s.p99),
            ttft_ms_std: ttft.and_then(|s| finite(s.std)),
            ttft_ms_ci95: ttft.and_then(|s| finite(s.ci95)),
            prefill_tokens_per_s: t.and_then(|t| t.prefill_tokens_per_s(o.batch, o.seq_len)),
            tpot_ms_mean: tpot.map(|s| s.mean),
            tpot_ms_p50: tpot.map(|s| s.p50),
            tpot_ms_p95: tpot.map(|s| s.p95),
            tpot_ms_p99: tpot.map(|s| s.p99),
            tpot_ms_std: tpot.and_then(|s| finite(s.std)),
            tpot_ms_ci95: tpot.and_then(|s| finite(s.ci95)),
            itl_ms_mean: itl.map(|s| s.mean),
            itl_ms_p50: itl.map(|s| s.p50),
            itl_ms_p95: itl.map(|s| s.p95),
            itl_ms_p99: itl.map(|s| s.p99),
            itl_outliers: itl.map(|s| s.outliers),
            e2e_ms_mean: t.and_then(|t| summarize(&t.e2e_ms())).map(|s| s.mean),
            decode_tokens_per_s: t.and_then(|t| t.decode_tokens_per_s(o.batch)),
            kv_tokens: t.map(|t| t.kv_tokens),
            kv_bytes: t.map(|t| t.kv_bytes),
            kv_bytes_predicted: t.map(|t| o.scheme.bytes_for(&ctx.geometry, o.batch, t.kv_tokens)),
            kv_bytes_per_token: t.map(|t| t.kv_bytes as f64 / (o.batch * t.kv_tokens) as f64),
            kv_ratio_vs_fp16: t.map(|t| t.kv_bytes as f64 / fp16_bytes(t.kv_tokens)),
            kv_reserved_bytes: t.map(|t| t.kv_reserved_bytes),
            peak_rss_bytes: t.and_then(|t| t.peak_rss_bytes),
            vram_peak_bytes: t.and_then(|t| t.vram_peak_bytes),
            decode_gb_s: t
                .zip(tpot)
                .zip(ctx.decode_weight_bytes)
                .and_then(|((t, s), w)| {
                    (s.p50 > 0.0).then(|| (w + t.kv_bytes) as f64 / (s.p50 * 1e-3) / 1e9)
                }),
            saturated_values: t.map(|t| t.saturated_values),
            other_cpu_cores: t.and_then(|t| t.contention).map(|c| c.other_cores),
            contended: t.and_then(|t| t.contention).map(|c| c.contended()),
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
            rouge_samples: o.rouge.as_ref().map(|r| r.scores.len()),
            rouge1_f1: rouge_f1.map(|m| m[0]),
            rouge2_f1: rouge_f1.map(|m| m[1]),
            rouge_l_f1: rouge_f1.map(|m| m[2]),
            rouge_lsum_f1: rouge_f1.map(|m| m[3]),
            rouge_l_vs_fp16: o.rouge.as_ref().and_then(|r| r.rouge_l_vs_fp16),
            passkey_trials: o.passkey.as_ref().map(|p| p.trials.len()),
            passkey_accuracy_pct: o.passkey.as_ref().map(|p| p.accuracy_pct()),
            ppl_mode: o.ppl.as_ref().map(|p| p.mode.to_string()),
            ppl_windows: o.ppl.as_ref().map(|p| p.windows),
            ppl_ctx: o.ppl.as_ref().and(ctx.ppl_ctx),
            ppl_weight_dtype: ctx.ppl_weight_dtype.clone(),
        }
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// Called with every row after it is written.
type RowHook = Box<dyn FnMut(&ResultRow)>;

/// The files of a run folder, written as points finish: `raw.jsonl` gets one JSON line per
/// point (every sample, [`PointOutcome`]'s serialized form) and `results.csv` one row, both
/// flushed at once, so an interrupted sweep keeps every finished point and `--resume` can go on.
pub struct RunSink {
    raw_path: PathBuf,
    raw: File,
    csv_path: PathBuf,
    csv: csv::Writer<File>,
    ctx: RowContext,
    /// Rows so far (earlier run's first when resuming).
    pub rows: Vec<ResultRow>,
    /// Outcomes so far, in the same order.
    pub outcomes: Vec<PointOutcome>,
    on_row: Option<RowHook>,
    quality_path: PathBuf,
}

impl RunSink {
    /// Opens the run folder `dir`: `raw.jsonl` is rewritten from `earlier` (the points a
    /// resumed run already has) and appended to, `results.csv` rewritten from them.
    /// Errors: [`Error::Io`] naming the file.
    pub fn create(dir: &Path, ctx: RowContext, earlier: Vec<PointOutcome>) -> Result<Self> {
        let raw_path = dir.join(RAW_FILE);
        // A last line cut short (an interrupted write) must go before anything is appended.
        let cut_short =
            std::fs::read(&raw_path).is_ok_and(|b| b.last().is_some_and(|&c| c != b'\n'));
        if !earlier.is_empty() || cut_short {
            // Rewrite the earlier points first (atomically), which drops a line an interruption
            // cut short; serde_json round-trips every f64 exactly.
            let tmp = raw_path.with_extension("jsonl.tmp");
            let mut text = String::new();
            for o in &earlier {
                text.push_str(
                    &serde_json::to_string(o).map_err(|e| Error::io(&raw_path, e.into()))?,
                );
                text.push('\n');
            }
            std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
            std::fs::rename(&tmp, &raw_path).map_err(|e| Error::io(&raw_path, e))?;
        }
        let raw = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&raw_path)
            .map_err(|e| Error::io(&raw_path, e))?;
        let csv_path = dir.join(CSV_FILE);
        let csv = csv_writer(&csv_path)?;
        let mut sink = Self {
            raw_path,
            raw,
            csv_path,
            csv,
            ctx,
            rows: Vec::new(),
            outcomes: Vec::new(),
            on_row: None,
            quality_path: dir.join(QUALITY_FILE),
        };
        for o in earlier {
            let row = ResultRow::new(&sink.ctx, &o);
            sink.write_csv_row(&row)?;
            sink.rows.push(row);
            sink.outcomes.push(o);
        }
        Ok(sink)
    }

    /// Calls `f` with every row after it is written (e.g. to print it above a progress bar).
    pub fn on_row(mut self, f: impl FnMut(&ResultRow) + 'static) -> Self {
        self.on_row = Some(Box::new(f));
        self
    }

    /// Starts `quality.jsonl` afresh with `earlier` (the quality results a resumed run already
    /// has; a line an interruption cut short is dropped); [`PointSink::quality`] appends to it.
    /// Errors: [`Error::Io`] naming the file.
    pub fn with_quality(self, earlier: &[QualityOutcome]) -> Result<Self> {
        let tmp = self.quality_path.with_extension("jsonl.tmp");
        let mut text = String::new();
        for q in earlier {
            text.push_str(
                &serde_json::to_string(q).map_err(|e| Error::io(&self.quality_path, e.into()))?,
            );
            text.push('\n');
        }
        std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &self.quality_path).map_err(|e| Error::io(&self.quality_path, e))?;
        Ok(self)
    }

    /// Path of `results.csv`.
    pub fn csv_path(&self) -> &Path {
        &self.csv_path
    }

    fn write_csv_row(&mut self, row: &ResultRow) -> Result<()> {
        self.csv
            .serialize(row)
            .map_err(|e| Error::io(&self.csv_path, csv_io(e)))?;
        self.csv.flush().map_err(|e| Error::io(&self.csv_path, e))
    }
}

/// A CSV writer whose header is [`CSV_COLUMNS`], written at once; rows then serialize as values
/// only (the test `csv_columns_match_the_row_fields` keeps the two in step).
fn csv_writer(path: &Path) -> Result<csv::Writer<File>> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_path(path)
        .map_err(|e| Error::io(path, csv_io(e)))?;
    w.write_record(CSV_COLUMNS)
        .map_err(|e| Error::io(path, csv_io(e)))?;
    w.flush().map_err(|e| Error::io(path, e))?;
    Ok(w)
}

fn csv_io(e: csv::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl PointSink for RunSink {
    fn quality(&mut self, outcome: &QualityOutcome) -> Result<()> {
        let mut line =
            serde_json::to_string(outcome).map_err(|e| Error::io(&self.quality_path, e.into()))?;
        line.push('\n');
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.quality_path)
            .and_then(|mut f| f.write_all(line.as_bytes()).and_then(|_| f.flush()))
            .map_err(|e| Error::io(&self.quality_path, e))
    }

    fn point(&mut self, outcome: &PointOutcome) -> Result<()> {
        let mut line =
            serde_json::to_string(outcome).map_err(|e| Error::io(&self.raw_path, e.into()))?;
        line.push('\n');
        self.raw
            .write_all(line.as_bytes())
            .and_then(|_| self.raw.flush())
            .map_err(|e| Error::io(&self.raw_path, e))?;
        let row = ResultRow::new(&self.ctx, outcome);
        self.write_csv_row(&row)?;
        if let Some(f) = self.on_row.as_mut() {
            f(&row);
        }
        self.rows.push(row);
        self.outcomes.push(outcome.clone());
        Ok(())
    }
}

/// File names inside a run folder.
pub const RAW_FILE: &str = "raw.jsonl";
/// See [`RAW_FILE`].
pub const CSV_FILE: &str = "results.csv";
/// See [`RAW_FILE`].
pub const META_FILE: &str = "meta.json";
/// See [`RAW_FILE`].
pub const SUMMARY_FILE: &str = "summary.md";
/// See [`RAW_FILE`].
pub const PLOTS_DIR: &str = "plots";
/// One line per scheme whose quality unit a run made ([`QualityOutcome`]).
pub const QUALITY_FILE: &str = "quality.jsonl";

/// Reads `raw.jsonl` (every finished point of a run). A last line cut short by an interrupted
/// write is dropped with a warning on stderr; any other bad line is an error naming the file
/// and line. A missing file reads as no points.
pub fn read_raw(path: &Path) -> Result<Vec<PointOutcome>> {
    read_jsonl(path, "raw result")
}

/// Reads `quality.jsonl` (a run's per-scheme quality results), as [`read_raw`] does.
pub fn read_quality(path: &Path) -> Result<Vec<QualityOutcome>> {
    read_jsonl(path, "quality result")
}

fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str::<T>(line) {
            Ok(o) => out.push(o),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                eprintln!(
                    "warning: {}: dropped an incomplete last line (an interrupted write)",
                    path.display()
                );
            }
            Err(e) => {
                return Err(Error::InvalidArgument {
                    name: format!("{}:{}", path.display(), i + 1),
                    reason: format!("not a kvbench {what} line: {e}"),
                })
            }
        }
    }
    Ok(out)
}

/// Writes `rows` as `results.csv` at `path` (header first). Errors: [`Error::Io`].
pub fn write_csv(path: &Path, rows: &[ResultRow]) -> Result<()> {
    let mut w = csv_writer(path)?;
    for r in rows {
        w.serialize(r).map_err(|e| Error::io(path, csv_io(e)))?;
    }
    w.flush().map_err(|e| Error::io(path, e))
}

/// Reads a `results.csv` back (for tests, `kvbench gate` and re-rendering).
pub fn read_csv(path: &Path) -> Result<Vec<ResultRow>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| Error::io(path, csv_io(e)))?;
    r.deserialize()
        .map(|row| row.map_err(|e| Error::io(path, csv_io(e))))
        .collect()
}
