//! Turning finished results into bytes: `results.csv` rows, `meta.json`, the terminal table.
//! Nothing here measures anything.

pub mod attn_bench;
pub mod chart;
pub mod compare;
pub mod gate;
pub mod merge;
pub mod meta;
pub mod plan;
pub mod plots;
pub mod run_dir;
pub mod serve;
pub mod serve_gate;
pub mod summary;
pub mod table;
pub mod ticks;
pub mod warnings;

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme};
use crate::measure::sweep::{PointOutcome, PointSink, PointStatus, PointTiming, QualityOutcome};
use crate::quality::paired::{paired_delta, CiMethod};
use crate::quality::passkey::PasskeyResult;
use crate::quality::perplexity::PplResult;
use crate::quality::xsum::RougeResult;
use crate::stats::summarize;
use crate::util::record::{self, Record};

/// A latency summarized over its samples, ms: a group of `results.csv` columns. Which of these
/// statistics a latency writes is listed where [`ResultRow`] declares it (TTFT and TPOT: mean,
/// quantiles, SD, interval; ITL: mean, quantiles, outliers; E2E: mean); the others stay `None`
/// in a row ([`Record::into_columns`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    /// Arithmetic mean, ms.
    pub mean: Option<f64>,
    /// Median, ms ([`crate::stats::percentile`], type 7).
    pub p50: Option<f64>,
    /// 95th percentile, ms.
    pub p95: Option<f64>,
    /// 99th percentile, ms.
    pub p99: Option<f64>,
    /// Sample standard deviation (n − 1), ms; `None` below 2 samples.
    pub std: Option<f64>,
    /// Half-width of the 95 % confidence interval of the mean (Student's t), ms; `None` below
    /// 2 samples.
    pub ci95: Option<f64>,
    /// Samples outside Tukey's fences (1.5 × IQR; none flagged below 4 samples).
    pub outliers: Option<usize>,
}

impl Latency {
    /// Summarizes `samples` (ms) with [`summarize`]: every statistic, `None` throughout for no
    /// samples, and `std` / `ci95` `None` where they are not finite (a single sample).
    pub fn of(samples: &[f64]) -> Latency {
        let Some(s) = summarize(samples) else {
            return Latency::default();
        };
        Latency {
            mean: Some(s.mean),
            p50: Some(s.p50),
            p95: Some(s.p95),
            p99: Some(s.p99),
            std: finite(s.std),
            ci95: finite(s.ci95),
            outliers: Some(s.outliers),
        }
    }
}

/// The median of `xs` ([`crate::stats::percentile`], type 7); `None` for an empty sample.
fn median(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| crate::stats::percentile(&mut xs.to_vec(), 50.0))
}

record::csv_record! {
    /// One row of `results.csv`: the output schema. Its fields are the columns, in order (a group
    /// field is the sub-fields it lists, named as listed; see [`record`]), so a new column is one
    /// field here plus its row in the README's column table (a test checks the table). Units
    /// are in the names. Reading an older file, an `Option` column it lacks is `None`; the
    /// others (names, sizes, `status`, `ppl_weight_dtype`) every version has written.
    #[derive(Debug, Clone, Default, PartialEq)]
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
        /// `ok`, `oom: ...` or `error: ...` ([`PointStatus`]).
        pub status: PointStatus,
        /// Timed repeats behind the latency columns (each a fresh cache; warm-up excluded).
        pub repeats: Option<usize>,
        /// Time to first token (prefill + first greedy pick) over the repeats, ms: mean, median,
        /// 95th/99th percentile, sample SD and the half-width of the 95 % interval of the mean.
        pub ttft: Latency {
            ttft_ms_mean: mean,
            ttft_ms_p50: p50,
            ttft_ms_p95: p95,
            ttft_ms_p99: p99,
            ttft_ms_std: std,
            ttft_ms_ci95: ci95,
        },
        /// Prefill throughput over the batch, tokens/s (`batch × seq_len / TTFT`).
        pub prefill_tokens_per_s: Option<f64>,
        /// Time per output token after the first, `(E2E − TTFT)/(gen − 1)`, one sample per
        /// repeat, ms: the same statistics as TTFT.
        pub tpot: Latency {
            tpot_ms_mean: mean,
            tpot_ms_p50: p50,
            tpot_ms_p95: p95,
            tpot_ms_p99: p99,
            tpot_ms_std: std,
            tpot_ms_ci95: ci95,
        },
        /// Inter-token latency (one decode step) over all steps of all repeats, ms: mean,
        /// median, 95th/99th percentile, and the count of samples outside Tukey's fences (worth
        /// a warning when high).
        pub itl: Latency {
            itl_ms_mean: mean,
            itl_ms_p50: p50,
            itl_ms_p95: p95,
            itl_ms_p99: p99,
            itl_outliers: outliers,
        },
        /// End-to-end latency of one request (TTFT + all ITLs), mean over repeats, ms.
        pub e2e: Latency { e2e_ms_mean: mean },
        /// Decode throughput over the batch, tokens/s (`batch × steps / Σ ITL`).
        pub decode_tokens_per_s: Option<f64>,
        /// Tokens held per sequence when the point ended (`seq_len + gen_tokens − 1`).
        pub kv_tokens: Option<usize>,
        /// Bytes of K/V held at the end, all sequences, scales and zero-points included.
        pub kv_bytes: Option<usize>,
        /// What the scheme's byte formula predicts for `batch_size` sequences of `kv_tokens`
        /// (the same accounting `kvbench plan` uses: a sliding-window layer of the model counts
        /// `min(kv_tokens, window)` tokens); equals `kv_bytes` when the cache is right.
        pub kv_bytes_predicted: Option<usize>,
        /// `kv_bytes / (batch_size × kv_tokens)`: bytes per token of context.
        pub kv_bytes_per_token: Option<f64>,
        /// `kv_bytes` over what fp16 would hold for the same tokens on the same layers (formula,
        /// window layers capped at their window), e.g. 0.516 for int8.
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
        /// The median TPOT over its bandwidth floor: (decode weights + KV held) ÷ the read
        /// bandwidth probed in the same run ([`RowContext::read_gb_s`]), i.e. that bandwidth over
        /// `decode_gb_s`. 1.0 = the step runs at the machine's read rate; CPU runs only.
        pub tpot_vs_floor: Option<f64>,
        /// The attention kernels' time per decode step, all layers, ms: median over the timed
        /// repeats of each repeat's mean ([`crate::kv::AttentionMeter`]: scores, softmax and P·V
        /// over the held K/V; not the projections, the MLP or the query rotation). CPU runs only.
        pub attn_step_ms: Option<f64>,
        /// Attention alone, GB/s: the K/V bytes the decode steps' attention read (every held
        /// row's codes, scales and zero-points, once per step and layer) over the time it
        /// took, median over repeats. A format whose rate sits well below fp16's at the same
        /// point is bound by its arithmetic (dequantization), not by the bytes. CPU runs only.
        pub attn_gb_s: Option<f64>,
        /// `attn_gb_s` over the read bandwidth probed in the same run
        /// ([`RowContext::read_gb_s`]): 1.0 = attention reads at the machine's rate.
        pub attn_bw_frac: Option<f64>,
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
        /// llama.cpp's `PPL = … +/- ppl_se` over all scored tokens (tokens are correlated, so it is
        /// narrower than the truth; prefer the paired interval below for comparisons).
        pub ppl_se: Option<f64>,
        /// ΔPPL against the fp16 cache on the same windows, % (`100·(e^d̄ − 1)`, d̄ the mean
        /// per-window NLL difference; equals `ppl_delta_pct` up to rounding).
        pub delta_ppl_pct: Option<f64>,
        /// Lower end of its paired 95 % interval, %.
        pub delta_ppl_pct_lo: Option<f64>,
        /// Upper end, %.
        pub delta_ppl_pct_hi: Option<f64>,
        /// Absolute ΔPPL, `ppl_fp16·(e^d̄ − 1)`.
        pub delta_ppl: Option<f64>,
        /// Lower end of its paired 95 % interval.
        pub delta_ppl_lo: Option<f64>,
        /// Upper end.
        pub delta_ppl_hi: Option<f64>,
        /// How the interval was computed: `t` (Student t) or `bootstrap:B:seed`.
        pub ci_method: Option<String>,
        /// What one pair is: `window` (per-window mean NLLs).
        pub ci_unit: Option<String>,
        /// 99.9th percentile of per-token KL, nats.
        pub kl_p99_9: Option<f64>,
        /// Largest per-token KL, nats.
        pub kl_max: Option<f64>,
        /// Standard error of `kl_mean` over tokens, nats (llama.cpp's ±).
        pub kl_se: Option<f64>,
        /// Standard error of `top1_agree_pct` (llama.cpp's "same top p" ±), percentage points.
        pub same_top_p_se: Option<f64>,
        /// Perturbed perplexity reruns behind the noise floor (`--ppl-noise-floor`).
        pub noise_floor_runs: Option<usize>,
        /// Standard deviation of the reruns' perplexities.
        pub noise_floor_sd: Option<f64>,
        /// `100·(max − min)/mean` of the reruns' perplexities, %.
        pub noise_floor_spread_pct: Option<f64>,
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
}

/// Columns of `results.csv`, in order: [`ResultRow`]'s (recorded in `meta.json`).
pub const CSV_COLUMNS: &[&str] = <ResultRow as Record>::COLUMNS;

impl meta::ReportContext for RowContext {}

/// A sweep's `meta.json`.
pub type SweepMeta = meta::RunMeta<crate::measure::settings::SweepSettings, RowContext>;

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
    /// Method of the paired ΔPPL interval (`--ppl-ci`); `t` for runs made before it existed.
    #[serde(default)]
    pub ppl_ci: CiMethod,
    /// Geometry, for the fp16 ratio.
    pub geometry: CacheGeometry,
    /// Bytes the decode model's weights occupy as stored (`Model::weight_bytes`), for the
    /// achieved-bandwidth column; absent in runs made before it was recorded.
    #[serde(default)]
    pub decode_weight_bytes: Option<usize>,
    /// Read bandwidth the machine gave at the start of this run, GB/s (10⁹ bytes/s): the
    /// STREAM-like probe of `crate::measure::bandwidth` on the CPU; absent on GPUs and in runs
    /// made before it was measured. The denominator of `tpot_vs_floor`.
    #[serde(default)]
    pub read_gb_s: Option<f64>,
}

impl ResultRow {
    /// Builds the row for a finished point, joined with its scheme's quality results (`q`,
    /// if measured) and the fp16 cache's perplexity result (`baseline`: its perplexity for
    /// `ppl_delta_pct`, its per-window NLLs for the paired interval of `delta_ppl_pct_*`,
    /// computed with `ctx.ppl_ci` by [`paired_delta`]; the interval is left empty when the
    /// windows differ in number or are fewer than 2).
    pub fn new(
        ctx: &RowContext,
        o: &PointOutcome,
        q: Option<&QualityOutcome>,
        baseline: Option<&PplResult>,
    ) -> Self {
        let t = o.timing.as_ref().ok();
        let (ppl, rouge, passkey): (
            Option<&PplResult>,
            Option<&RougeResult>,
            Option<&PasskeyResult>,
        ) = (
            q.and_then(|q| q.ppl.as_ref()),
            q.and_then(|q| q.rouge.as_ref()),
            q.and_then(|q| q.passkey.as_ref()),
        );
        // The delta needs both sides.
        let baseline_ppl = baseline.map(|b| b.perplexity).filter(|_| ppl.is_some());
        let paired = ppl
            .zip(baseline)
            .and_then(|(p, b)| paired_delta(&p.window_nll, &b.window_nll, ctx.ppl_ci).ok());
        let noise = ppl.and_then(|p| p.noise_floor.as_ref());
        let latency = |samples: fn(&PointTiming) -> Vec<f64>| {
            t.map_or_else(Latency::default, |t| Latency::of(&samples(t)))
        };
        let tpot = latency(|t| t.tpot_ms());
        let rouge_f1 = rouge.map(|r| r.mean_f1());
        let agreement = ppl.and_then(|p| p.agreement.as_ref());
        // fp16 on the same geometry: a model's window layers hold min(n, window) there too.
        let fp16_bytes =
            |tokens: usize| KvScheme::FP16.bytes_for(&ctx.geometry, o.batch, tokens) as f64;
        let decode_gb_s = t
            .zip(tpot.p50)
            .zip(ctx.decode_weight_bytes)
            .and_then(|((t, p50), w)| {
                (p50 > 0.0).then(|| (w + t.kv_bytes) as f64 / (p50 * 1e-3) / 1e9)
            });
        let attn_gb_s = t.and_then(|t| median(&t.attn_gb_s));
        ResultRow {
            run_id: ctx.run_id.clone(),
            model: ctx.model.clone(),
            prefill_weight_dtype: ctx.prefill_weight_dtype.clone(),
            decode_weight_dtype: ctx.decode_weight_dtype.clone(),
            scheme: o.scheme.to_string(),
            batch_size: o.batch,
            seq_len: o.seq_len,
            gen_tokens: t.map_or(0, |t| t.kv_tokens + 1 - o.seq_len),
            status: o.status(),
            repeats: t.map(|t| t.itl_ms.len()),
            ttft: latency(|t| t.ttft_ms.clone()),
            prefill_tokens_per_s: t.and_then(|t| t.prefill_tokens_per_s(o.batch, o.seq_len)),
            tpot,
            itl: latency(|t| t.itl_all_ms()),
            e2e: latency(|t| t.e2e_ms()),
            decode_tokens_per_s: t.and_then(|t| t.decode_tokens_per_s(o.batch)),
            kv_tokens: t.map(|t| t.kv_tokens),
            kv_bytes: t.map(|t| t.kv_bytes),
            kv_bytes_predicted: t.map(|t| o.scheme.bytes_for(&ctx.geometry, o.batch, t.kv_tokens)),
            kv_bytes_per_token: t.map(|t| t.kv_bytes as f64 / (o.batch * t.kv_tokens) as f64),
            kv_ratio_vs_fp16: t.map(|t| t.kv_bytes as f64 / fp16_bytes(t.kv_tokens)),
            kv_reserved_bytes: t.map(|t| t.kv_reserved_bytes),
            peak_rss_bytes: t.and_then(|t| t.peak_rss_bytes),
            vram_peak_bytes: t.and_then(|t| t.vram_peak_bytes),
            decode_gb_s,
            tpot_vs_floor: ctx
                .read_gb_s
                .zip(decode_gb_s)
                .and_then(|(bw, d)| (bw > 0.0 && d > 0.0).then(|| bw / d)),
            attn_step_ms: t.and_then(|t| median(&t.attn_step_ms)),
            attn_gb_s,
            attn_bw_frac: ctx
                .read_gb_s
                .zip(attn_gb_s)
                .and_then(|(bw, a)| (bw > 0.0).then(|| a / bw)),
            saturated_values: t.map(|t| t.saturated_values),
            other_cpu_cores: t.and_then(|t| t.contention).map(|c| c.other_cores),
            contended: t.and_then(|t| t.contention).map(|c| c.contended()),
            ppl: ppl.map(|p| p.perplexity),
            ppl_delta_pct: ppl
                .zip(baseline_ppl)
                .map(|(p, b)| 100.0 * (p.perplexity / b - 1.0)),
            ppl_mean_nll: ppl.map(|p| p.mean_nll),
            kl_mean: agreement.map(|a| a.kl_mean),
            kl_p99: agreement.map(|a| a.kl_p99),
            kl_q1: agreement.map(|a| a.kl_by_quarter[0]),
            kl_q2: agreement.map(|a| a.kl_by_quarter[1]),
            kl_q3: agreement.map(|a| a.kl_by_quarter[2]),
            kl_q4: agreement.map(|a| a.kl_by_quarter[3]),
            top1_agree_pct: agreement.map(|a| a.top1_agree_pct),
            mean_abs_dp_top: agreement.map(|a| a.mean_abs_dp_top),
            ppl_se: ppl.and_then(|p| p.ppl_se),
            delta_ppl_pct: paired.map(|d| d.delta_pct),
            delta_ppl_pct_lo: paired.and_then(|d| finite(d.delta_pct_ci[0])),
            delta_ppl_pct_hi: paired.and_then(|d| finite(d.delta_pct_ci[1])),
            delta_ppl: paired.map(|d| d.delta_ppl),
            delta_ppl_lo: paired.and_then(|d| finite(d.delta_ppl_ci[0])),
            delta_ppl_hi: paired.and_then(|d| finite(d.delta_ppl_ci[1])),
            ci_method: paired.map(|d| d.method.to_string()),
            ci_unit: paired.map(|_| "window".to_string()),
            kl_p99_9: agreement.and_then(|a| a.kl_p99_9),
            kl_max: agreement.and_then(|a| a.kl_max),
            kl_se: agreement.and_then(|a| a.kl_se),
            same_top_p_se: agreement.and_then(|a| a.same_top_p_se),
            noise_floor_runs: noise.map(|n| n.runs),
            noise_floor_sd: noise.and_then(|n| finite(n.sd)),
            noise_floor_spread_pct: noise.map(|n| n.spread_pct),
            rouge_samples: rouge.map(|r| r.scores.len()),
            rouge1_f1: rouge_f1.map(|m| m[0]),
            rouge2_f1: rouge_f1.map(|m| m[1]),
            rouge_l_f1: rouge_f1.map(|m| m[2]),
            rouge_lsum_f1: rouge_f1.map(|m| m[3]),
            rouge_l_vs_fp16: rouge.and_then(|r| r.rouge_l_vs_fp16),
            passkey_trials: passkey.map(|p| p.trials.len()),
            passkey_accuracy_pct: passkey.map(|p| p.accuracy_pct()),
            ppl_mode: ppl.map(|p| p.mode.to_string()),
            ppl_windows: ppl.map(|p| p.windows),
            ppl_ctx: ppl.and(ctx.ppl_ctx),
            ppl_weight_dtype: ctx.ppl_weight_dtype.clone(),
        }
        .into_columns()
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// Called with every row after it is written.
type RowHook = Box<dyn FnMut(&ResultRow)>;

/// The records of a run folder's `raw.jsonl`: every finished timing point and each scheme's
/// quality results once. Folders written before quality had its own record are converted when
/// read ([`read_records`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawRecords {
    /// Finished points, in the order they finished.
    pub points: Vec<PointOutcome>,
    /// Quality results, one per scheme at most, in the order they were measured.
    pub quality: Vec<QualityOutcome>,
}

impl RawRecords {
    /// The quality results of `scheme`, if measured.
    pub fn quality_of(&self, scheme: KvScheme) -> Option<&QualityOutcome> {
        self.quality.iter().find(|q| q.scheme == scheme)
    }

    /// Drops the finished points timed while other processes used the CPU (their
    /// [`crate::measure::contention::Contention`] says `contended`), so a resumed run measures
    /// them again (`--rerun-contended`); failed points and quality results stay. Returns how
    /// many were dropped.
    pub fn drop_contended(&mut self) -> usize {
        let before = self.points.len();
        self.points.retain(
            |p| !matches!(&p.timing, Ok(t) if t.contention.as_ref().is_some_and(|c| c.contended())),
        );
        before - self.points.len()
    }

    /// The fp16 cache's perplexity, the baseline of `ppl_delta_pct`.
    pub fn baseline_ppl(&self) -> Option<f64> {
        self.baseline().map(|p| p.perplexity)
    }

    /// The fp16 cache's perplexity result, the reference of the paired ΔPPL interval.
    pub fn baseline(&self) -> Option<&PplResult> {
        self.quality_of(KvScheme::FP16).and_then(|q| q.ppl.as_ref())
    }

    /// The rows of `results.csv`: each point joined with its scheme's quality results.
    pub fn rows(&self, ctx: &RowContext) -> Vec<ResultRow> {
        let base = self.baseline();
        self.points
            .iter()
            .map(|o| ResultRow::new(ctx, o, self.quality_of(o.scheme), base))
            .collect()
    }
}

/// How many points a sink has written, and the first failure (for the sweep's exit status).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// Points written (earlier ones included when resuming).
    pub points: usize,
    /// Points that did not time (`oom`, `error`).
    pub failed: usize,
    /// The first failed point: scheme, batch, prompt length, status.
    pub first_failure: Option<(String, usize, usize, PointStatus)>,
}

impl Tally {
    fn count(&mut self, row: &ResultRow) {
        self.points += 1;
        if !row.status.is_ok() {
            self.failed += 1;
            if self.first_failure.is_none() {
                self.first_failure = Some((
                    row.scheme.clone(),
                    row.batch_size,
                    row.seq_len,
                    row.status.clone(),
                ));
            }
        }
    }

    /// Whether there were points and none of them timed.
    pub fn all_failed(&self) -> bool {
        self.points > 0 && self.failed == self.points
    }
}

/// The files of a run folder, written as results finish: `raw.jsonl` gets one JSON line per
/// point (every sample, [`PointOutcome`]'s serialized form) and one per scheme's quality
/// results (`"record": "quality"`, [`QualityOutcome`]), `results.csv` one row per point (joined
/// with its scheme's quality), all flushed at once, so an interrupted sweep keeps everything
/// finished and `--resume` can go on.
pub struct RunSink {
    raw: run_dir::RawLog,
    csv_path: PathBuf,
    csv: csv::Writer<File>,
    ctx: RowContext,
    /// Quality results so far, for joining the rows written after them.
    quality: Vec<QualityOutcome>,
    tally: Tally,
    on_row: Option<RowHook>,
}

/// A quality record's line in `raw.jsonl`: `{"record":"quality", …QualityOutcome}`.
#[derive(serde::Serialize)]
struct QualityLine<'a> {
    record: &'static str,
    #[serde(flatten)]
    quality: &'a QualityOutcome,
}

/// The `record` value that marks a quality line of `raw.jsonl`.
pub const QUALITY_RECORD: &str = "quality";

fn quality_line(q: &QualityOutcome, path: &Path) -> Result<String> {
    serde_json::to_string(&QualityLine {
        record: QUALITY_RECORD,
        quality: q,
    })
    .map_err(|e| Error::io(path, e.into()))
}

impl RunSink {
    /// Opens the run folder `dir`: `raw.jsonl` is rewritten from `earlier` (what a resumed run
    /// already has, or what a merge joined: quality records first, then points) and appended
    /// to; `results.csv` is rewritten from it. A legacy `quality.jsonl` is removed (its
    /// records are in `earlier`, read by [`read_records`]). Errors: [`Error::Io`] naming the file.
    pub fn create(dir: &Path, ctx: RowContext, earlier: RawRecords) -> Result<Self> {
        let raw_path = dir.join(RAW_FILE);
        // The earlier records first (quality, then points); serde_json round-trips every f64
        // exactly.
        let mut keep = Vec::new();
        for q in &earlier.quality {
            keep.push(quality_line(q, &raw_path)?);
        }
        for o in &earlier.points {
            keep.push(serde_json::to_string(o).map_err(|e| Error::io(&raw_path, e.into()))?);
        }
        let raw = run_dir::RawLog::open(dir, &keep)?;
        let legacy = dir.join(LEGACY_QUALITY_FILE);
        if legacy.exists() {
            std::fs::remove_file(&legacy).map_err(|e| Error::io(&legacy, e))?;
        }
        let csv_path = dir.join(CSV_FILE);
        let csv = csv_writer::<ResultRow>(&csv_path)?;
        let mut sink = Self {
            raw,
            csv_path,
            csv,
            ctx,
            quality: earlier.quality.clone(),
            tally: Tally::default(),
            on_row: None,
        };
        for row in earlier.rows(&sink.ctx) {
            sink.write_csv_row(&row)?;
            sink.tally.count(&row);
        }
        Ok(sink)
    }

    /// Calls `f` with every row after it is written (e.g. to print it above a progress bar).
    pub fn on_row(mut self, f: impl FnMut(&ResultRow) + 'static) -> Self {
        self.on_row = Some(Box::new(f));
        self
    }

    /// Points written so far and how many failed.
    pub fn tally(&self) -> &Tally {
        &self.tally
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

/// A CSV writer whose header is `R`'s columns ([`Record::COLUMNS`]), written at once (so a run
/// without rows still has it); rows then serialize as values only, from the same column list.
fn csv_writer<R: Record>(path: &Path) -> Result<csv::Writer<File>> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_path(path)
        .map_err(|e| Error::io(path, csv_io(e)))?;
    w.write_record(R::COLUMNS)
        .map_err(|e| Error::io(path, csv_io(e)))?;
    w.flush().map_err(|e| Error::io(path, e))?;
    Ok(w)
}

fn csv_io(e: csv::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl PointSink for RunSink {
    fn quality(&mut self, outcome: &QualityOutcome) -> Result<()> {
        self.raw.append(&QualityLine {
            record: QUALITY_RECORD,
            quality: outcome,
        })?;
        self.quality.retain(|q| q.scheme != outcome.scheme);
        self.quality.push(outcome.clone());
        Ok(())
    }

    fn point(&mut self, outcome: &PointOutcome) -> Result<()> {
        self.raw.append(outcome)?;
        let base = self
            .quality
            .iter()
            .find(|q| q.scheme == KvScheme::FP16)
            .and_then(|q| q.ppl.as_ref());
        let q = self.quality.iter().find(|q| q.scheme == outcome.scheme);
        let row = ResultRow::new(&self.ctx, outcome, q, base);
        self.write_csv_row(&row)?;
        if let Some(f) = self.on_row.as_mut() {
            f(&row);
        }
        self.tally.count(&row);
        Ok(())
    }
}

pub use run_dir::{CSV_FILE, LEGACY_QUALITY_FILE, META_FILE, PLOTS_DIR, RAW_FILE, SUMMARY_FILE};

/// The quality fields that lines of `raw.jsonl` written before quality had its own record
/// repeated on every point of a scheme.
#[derive(serde::Deserialize)]
struct LegacyPointQuality {
    #[serde(default)]
    ppl: Option<PplResult>,
    #[serde(default)]
    rouge: Option<RougeResult>,
    #[serde(default)]
    passkey: Option<PasskeyResult>,
}

/// One line of `raw.jsonl`, either kind. Read one line at a time and taken apart at once, so
/// the size difference between the variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum RawLine {
    Point(PointOutcome, Option<QualityOutcome>),
    Quality(QualityOutcome),
}

impl<'de> serde::Deserialize<'de> for RawLine {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let v = serde_json::Value::deserialize(d)?;
        if v.get("record").and_then(|r| r.as_str()) == Some(QUALITY_RECORD) {
            return serde_json::from_value(v)
                .map(RawLine::Quality)
                .map_err(D::Error::custom);
        }
        if let Some(r) = v.get("record") {
            return Err(D::Error::custom(format!(
                "unknown record kind {r} (this kvbench {} knows points and `quality`); re-render it with the kvbench that wrote it",
                meta::version()
            )));
        }
        let legacy: LegacyPointQuality =
            serde_json::from_value(v.clone()).map_err(D::Error::custom)?;
        let point: PointOutcome = serde_json::from_value(v).map_err(D::Error::custom)?;
        let q = (legacy.ppl.is_some() || legacy.rouge.is_some() || legacy.passkey.is_some())
            .then_some(QualityOutcome {
                scheme: point.scheme,
                ppl: legacy.ppl,
                rouge: legacy.rouge,
                passkey: legacy.passkey,
            });
        Ok(RawLine::Point(point, q))
    }
}

/// Reads a run folder's records: `dir/raw.jsonl` (points and quality records). Folders
/// written before quality had its own record are converted: a legacy `quality.jsonl` is read,
/// and quality repeated on points is taken from each scheme's first such point when no record
/// holds it. A last line cut short by an interrupted write is dropped with a warning on
/// stderr; any other bad line is an error naming the file and line. A point recorded more than
/// once is kept once (its first record), with a warning. Missing files read as no records.
pub fn read_records(dir: &Path) -> Result<RawRecords> {
    let mut out = RawRecords::default();
    let mut from_points: Vec<QualityOutcome> = Vec::new();
    let mut duplicates = 0usize;
    for line in read_jsonl::<RawLine>(&dir.join(RAW_FILE), "raw result")? {
        match line {
            RawLine::Quality(q) => {
                out.quality.retain(|o| o.scheme != q.scheme);
                out.quality.push(q);
            }
            RawLine::Point(p, q) => {
                if let Some(q) = q {
                    if !from_points.iter().any(|o| o.scheme == q.scheme) {
                        from_points.push(q);
                    }
                }
                // A point recorded twice (a raw.jsonl concatenated with itself, or edited) is
                // kept once, the first, as `gate` refuses duplicate points (issue #25).
                if out
                    .points
                    .iter()
                    .any(|o| (o.scheme, o.batch, o.seq_len) == (p.scheme, p.batch, p.seq_len))
                {
                    duplicates += 1;
                } else {
                    out.points.push(p);
                }
            }
        }
    }
    if duplicates > 0 {
        eprintln!(
            "warning: {}: {duplicates} point(s) recorded more than once; the first record of \
             each is kept",
            dir.join(RAW_FILE).display()
        );
    }
    for q in read_jsonl::<QualityOutcome>(&dir.join(LEGACY_QUALITY_FILE), "quality result")?
        .into_iter()
        .chain(from_points)
    {
        if out.quality_of(q.scheme).is_none() {
            out.quality.push(q);
        }
    }
    Ok(out)
}

use run_dir::read_jsonl;

/// Writes `rows` as `results.csv` at `path` (header first). Errors: [`Error::Io`].
pub fn write_csv(path: &Path, rows: &[ResultRow]) -> Result<()> {
    let mut w = csv_writer::<ResultRow>(path)?;
    for r in rows {
        w.serialize(r).map_err(|e| Error::io(path, csv_io(e)))?;
    }
    w.flush().map_err(|e| Error::io(path, e))
}

/// Reads a `results.csv` back (for tests, `kvbench gate` and re-rendering).
pub fn read_csv(path: &Path) -> Result<Vec<ResultRow>> {
    let f = crate::util::open_regular(path).map_err(|e| Error::io(path, e))?;
    let mut r = csv::Reader::from_reader(f);
    r.deserialize()
        .map(|row| row.map_err(|e| Error::io(path, csv_io(e))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header of `results.csv` as every kvbench so far wrote it (the hand-kept list this
    /// crate had before the columns were derived from [`ResultRow`]): old run folders, the
    /// committed baseline and `meta.json`'s `csv_columns` depend on it.
    const HEADER: &str = "run_id,model,prefill_weight_dtype,decode_weight_dtype,scheme,\
        batch_size,seq_len,gen_tokens,status,repeats,ttft_ms_mean,ttft_ms_p50,ttft_ms_p95,\
        ttft_ms_p99,ttft_ms_std,ttft_ms_ci95,prefill_tokens_per_s,tpot_ms_mean,tpot_ms_p50,\
        tpot_ms_p95,tpot_ms_p99,tpot_ms_std,tpot_ms_ci95,itl_ms_mean,itl_ms_p50,itl_ms_p95,\
        itl_ms_p99,itl_outliers,e2e_ms_mean,decode_tokens_per_s,kv_tokens,kv_bytes,\
        kv_bytes_predicted,kv_bytes_per_token,kv_ratio_vs_fp16,kv_reserved_bytes,\
        peak_rss_bytes,vram_peak_bytes,decode_gb_s,tpot_vs_floor,attn_step_ms,attn_gb_s,attn_bw_frac,\
        saturated_values,other_cpu_cores,contended,\
        ppl,ppl_delta_pct,ppl_mean_nll,kl_mean,kl_p99,kl_q1,kl_q2,kl_q3,kl_q4,top1_agree_pct,\
        mean_abs_dp_top,ppl_se,delta_ppl_pct,delta_ppl_pct_lo,delta_ppl_pct_hi,delta_ppl,\
        delta_ppl_lo,delta_ppl_hi,ci_method,ci_unit,kl_p99_9,kl_max,kl_se,same_top_p_se,\
        noise_floor_runs,noise_floor_sd,noise_floor_spread_pct,rouge_samples,rouge1_f1,\
        rouge2_f1,rouge_l_f1,rouge_lsum_f1,rouge_l_vs_fp16,passkey_trials,passkey_accuracy_pct,\
        ppl_mode,ppl_windows,ppl_ctx,ppl_weight_dtype";

    /// The columns derived from [`ResultRow`] are the 85 of [`HEADER`], in its order; csv's own
    /// header (from the serialized field names) agrees; and the README's column table documents
    /// exactly these columns, each once (no stale or misspelt name).
    #[test]
    fn csv_columns_match_the_row_fields() {
        let want: Vec<&str> = HEADER.split(',').collect();
        assert_eq!(want.len(), 85);
        assert_eq!(CSV_COLUMNS, want);
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(ResultRow::default()).unwrap();
        let bytes = w.into_inner().unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(text.lines().next().unwrap(), HEADER);
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let documented: Vec<&str> = readme
            .lines()
            .skip_while(|l| !l.starts_with("| column | unit | meaning |"))
            .skip(2)
            .take_while(|l| l.starts_with("| `"))
            .flat_map(|l| l.split('|').nth(1).unwrap_or("").split(','))
            .map(|c| c.trim().trim_matches('`'))
            .collect();
        for c in CSV_COLUMNS {
            let n = documented.iter().filter(|d| *d == c).count();
            assert_eq!(n, 1, "README's column table has `{c}` {n} times");
        }
        for d in &documented {
            assert!(CSV_COLUMNS.contains(d), "README documents `{d}`, no column");
        }
    }

    /// A row with every column set (one empty, `None`, among them) writes the bytes written by
    /// hand below — csv's formatting of each type: `2.0`, `1e-7`, `oom: x`, `false`, empty for
    /// `None` — and reads back as itself.
    #[test]
    fn a_full_row_writes_these_bytes_and_reads_back() {
        let lat = |mean, p50, p95, p99, std, ci95, outliers| Latency {
            mean: Some(mean),
            p50: Some(p50),
            p95: Some(p95),
            p99: Some(p99),
            std,
            ci95,
            outliers,
        };
        let row = ResultRow {
            run_id: "r".into(),
            model: "m.gguf".into(),
            prefill_weight_dtype: "f32".into(),
            decode_weight_dtype: "q8_0".into(),
            scheme: "int4:group=32".into(),
            batch_size: 2,
            seq_len: 64,
            gen_tokens: 8,
            status: PointStatus::Oom("x".into()),
            repeats: Some(3),
            ttft: lat(1.5, 1.25, 2.0, 2.5, Some(0.1), Some(0.125), None),
            prefill_tokens_per_s: Some(100.0),
            tpot: lat(10.0, 9.5, 11.0, 12.0, Some(0.5), Some(0.75), None),
            itl: lat(10.25, 10.0, 13.0, 14.0, None, None, Some(1)),
            e2e: Latency {
                mean: Some(80.0),
                ..Default::default()
            },
            decode_tokens_per_s: Some(200.0),
            kv_tokens: Some(71),
            kv_bytes: Some(7200),
            kv_bytes_predicted: Some(7201),
            kv_bytes_per_token: Some(50.5),
            kv_ratio_vs_fp16: Some(0.3125),
            kv_reserved_bytes: Some(8192),
            peak_rss_bytes: Some(1_000_000),
            vram_peak_bytes: None,
            decode_gb_s: Some(1e-7),
            tpot_vs_floor: Some(1e-7),
            attn_step_ms: Some(2.5),
            attn_gb_s: Some(12.25),
            attn_bw_frac: Some(0.5),
            saturated_values: Some(0),
            other_cpu_cores: Some(0.05),
            contended: Some(false),
            ppl: Some(21.5),
            ppl_delta_pct: Some(-0.25),
            ppl_mean_nll: Some(3.0),
            kl_mean: Some(0.001),
            kl_p99: Some(0.01),
            kl_q1: Some(0.1),
            kl_q2: Some(0.2),
            kl_q3: Some(0.3),
            kl_q4: Some(0.4),
            top1_agree_pct: Some(98.0),
            mean_abs_dp_top: Some(0.02),
            ppl_se: Some(0.5),
            delta_ppl_pct: Some(1.0),
            delta_ppl_pct_lo: Some(-2.0),
            delta_ppl_pct_hi: Some(4.0),
            delta_ppl: Some(0.2),
            delta_ppl_lo: Some(-0.4),
            delta_ppl_hi: Some(0.8),
            ci_method: Some("t".into()),
            ci_unit: Some("window".into()),
            kl_p99_9: Some(0.05),
            kl_max: Some(1.5),
            kl_se: Some(0.0001),
            same_top_p_se: Some(0.8),
            noise_floor_runs: Some(3),
            noise_floor_sd: Some(0.02),
            noise_floor_spread_pct: Some(0.25),
            rouge_samples: Some(10),
            rouge1_f1: Some(0.3),
            rouge2_f1: Some(0.1),
            rouge_l_f1: Some(0.25),
            rouge_lsum_f1: Some(0.26),
            rouge_l_vs_fp16: Some(0.9),
            passkey_trials: Some(5),
            passkey_accuracy_pct: Some(80.0),
            ppl_mode: Some("chunked".into()),
            ppl_windows: Some(2),
            ppl_ctx: Some(512),
            ppl_weight_dtype: "f32".into(),
        };
        let line = "r,m.gguf,f32,q8_0,int4:group=32,2,64,8,oom: x,3,\
            1.5,1.25,2.0,2.5,0.1,0.125,100.0,10.0,9.5,11.0,12.0,0.5,0.75,\
            10.25,10.0,13.0,14.0,1,80.0,200.0,\
            71,7200,7201,50.5,0.3125,8192,1000000,,1e-7,1e-7,2.5,12.25,0.5,0,0.05,false,\
            21.5,-0.25,3.0,0.001,0.01,0.1,0.2,0.3,0.4,98.0,0.02,\
            0.5,1.0,-2.0,4.0,0.2,-0.4,0.8,t,window,0.05,1.5,0.0001,0.8,3,0.02,0.25,\
            10,0.3,0.1,0.25,0.26,0.9,5,80.0,chunked,2,512,f32";
        let path = std::env::temp_dir().join(format!("kvbench-row-{}.csv", std::process::id()));
        write_csv(&path, &[row.clone(), ResultRow::default()]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        // The default row: five empty strings, three zeros, `ok`, then 85 − 9 empty cells.
        let empty = format!(",,,,,0,0,0,ok{}", ",".repeat(76));
        assert_eq!(text, format!("{HEADER}\n{line}\n{empty}\n"));
        assert_eq!(read_csv(&path).unwrap(), vec![row, ResultRow::default()]);
        std::fs::remove_file(&path).ok();
    }

    /// Results files written by older kvbench versions still read: the committed CI baseline
    /// (no `vram_peak_bytes`, interval or ROUGE columns) and the v0 fixture (no `ppl_se`): the
    /// values as the files hold them, the absent columns `None`.
    #[test]
    fn older_results_files_read() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let base = read_csv(&Path::new(dir).join("suites/baselines/ci-smollm2-135m.csv")).unwrap();
        assert_eq!(base.len(), 9);
        let r = &base[0];
        assert_eq!(
            (r.scheme.as_str(), r.batch_size, r.seq_len),
            ("fp16", 1, 64)
        );
        assert_eq!(r.ttft.mean, Some(375.163171));
        assert_eq!((r.ttft.std, r.ttft.ci95), (None, None));
        assert_eq!(r.tpot.mean, Some(25.80201328571429));
        assert_eq!((r.itl.p50, r.itl.outliers), (Some(21.695579), Some(1)));
        assert_eq!(r.e2e.mean, Some(555.7772640000001));
        assert_eq!(r.ppl, Some(21.374968431836315));
        assert_eq!((r.vram_peak_bytes, r.delta_ppl_pct_lo), (None, None));
        assert_eq!(
            (r.ppl_windows, r.ppl_weight_dtype.as_str()),
            (Some(2), "f32")
        );
        let v0 = read_csv(&Path::new(dir).join("tests/data/run-v0-model/results.csv")).unwrap();
        let r = &v0[0];
        assert_eq!(
            (r.seq_len, r.gen_tokens, r.ttft.p50),
            (16, 3, Some(129.613752))
        );
        assert_eq!((r.contended, r.ppl_se), (Some(true), None));
        assert_eq!(
            (r.rouge_samples, r.passkey_accuracy_pct),
            (Some(1), Some(100.0))
        );
    }

    /// [`Latency::of`] by hand: 1, 2, 3, 4, 10 → mean 4, median 3, p95 at rank 4·0.95 = 3.8:
    /// 4 + 0.8·6 = 8.8, p99 at 3.96: 9.76; SD √((9+4+1+0+36)/4) = √12.5; Tukey: Q1 = 2,
    /// Q3 = 4, fences −1 and 7: one outlier. One sample: no SD, no interval; none: all `None`.
    #[test]
    fn latency_by_hand() {
        let l = Latency::of(&[3.0, 1.0, 10.0, 2.0, 4.0]);
        assert!((l.mean.unwrap() - 4.0).abs() < 1e-12, "{:?}", l.mean);
        assert_eq!((l.p50, l.outliers), (Some(3.0), Some(1)));
        assert!((l.p95.unwrap() - 8.8).abs() < 1e-12, "{:?}", l.p95);
        assert!((l.p99.unwrap() - 9.76).abs() < 1e-12, "{:?}", l.p99);
        assert!((l.std.unwrap() - 12.5f64.sqrt()).abs() < 1e-12);
        // t₀.₉₇₅,₄ = 2.776445 (printed t tables) · √12.5 / √5 = 4.389943.
        assert!((l.ci95.unwrap() - 4.389_943).abs() < 1e-5, "{:?}", l.ci95);
        let one = Latency::of(&[7.0]);
        assert_eq!(
            (one.mean, one.p99, one.std, one.ci95),
            (Some(7.0), Some(7.0), None, None)
        );
        assert_eq!(Latency::of(&[]), Latency::default());
    }

    /// A timed point's row holds each latency's listed statistics only (what its CSV holds),
    /// by hand: TTFT 100, 300 → mean 200, SD √20000; ITL steps 10, 30 | 20, 20 → TPOT per
    /// repeat 20, 20 (SD 0), ITL mean 20, no SD column; E2E 100 + 40, 300 + 40 → mean 240.
    #[test]
    fn a_timed_row_holds_only_its_columns() {
        let ctx = RowContext {
            run_id: "r".into(),
            model: "m".into(),
            prefill_weight_dtype: "f32".into(),
            decode_weight_dtype: "f32".into(),
            ppl_weight_dtype: "f32".into(),
            ppl_ctx: None,
            ppl_ci: CiMethod::StudentT,
            geometry: CacheGeometry {
                layers: 1,
                kv_heads: 1,
                q_heads: 1,
                head_dim: 64,
                window: None,
            },
            decode_weight_bytes: None,
            read_gb_s: None,
        };
        let timing = PointTiming {
            ttft_ms: vec![100.0, 300.0],
            itl_ms: vec![vec![10.0, 30.0], vec![20.0, 20.0]],
            kv_tokens: 10,
            kv_bytes: 2560,
            kv_reserved_bytes: 4096,
            peak_rss_bytes: None,
            vram_peak_bytes: None,
            saturated_values: 0,
            generated: vec![],
            run_order: vec![],
            contention: None,
            attn_step_ms: vec![2.0, 4.0, 3.0],
            attn_gb_s: vec![0.05, 0.04, 0.06],
        };
        let o = PointOutcome {
            scheme: KvScheme::FP16,
            batch: 1,
            seq_len: 8,
            timing: Ok(timing),
        };
        let r = ResultRow::new(&ctx, &o, None, None);
        assert_eq!((r.ttft.mean, r.ttft.p50), (Some(200.0), Some(200.0)));
        assert!((r.ttft.std.unwrap() - 20000f64.sqrt()).abs() < 1e-9);
        assert_eq!(r.ttft.outliers, None, "TTFT has no outlier column");
        assert_eq!((r.tpot.mean, r.tpot.std), (Some(20.0), Some(0.0)));
        assert_eq!(
            (r.itl.mean, r.itl.p50, r.itl.outliers),
            (Some(20.0), Some(20.0), Some(0))
        );
        assert_eq!(
            (r.itl.std, r.itl.ci95),
            (None, None),
            "ITL has no SD/interval columns"
        );
        assert_eq!(
            r.e2e,
            Latency {
                mean: Some(240.0),
                ..Default::default()
            }
        );
        assert_eq!((r.repeats, r.gen_tokens), (Some(2), 3));
        assert_eq!(
            (r.decode_gb_s, r.tpot_vs_floor),
            (None, None),
            "no weight bytes, no probe"
        );
        // Attention alone: medians of the repeats (3 of 2/4/3 ms, 0.05 of 0.05/0.04/0.06 GB/s);
        // its share of the probe needs a probe.
        assert_eq!(
            (r.attn_step_ms, r.attn_gb_s, r.attn_bw_frac),
            (Some(3.0), Some(0.05), None)
        );
        // The bandwidth floor by hand: 1,997,440 weight bytes + 2,560 KV bytes = 2 MB read per
        // step in the median TPOT of 20 ms → 0.1 GB/s; a probed 0.08 GB/s puts the floor at
        // 2e6 / 0.08e9 = 25 ms, so TPOT ÷ floor = 20 / 25 = 0.8 (faster than the probe read).
        let probed = RowContext {
            decode_weight_bytes: Some(1_997_440),
            read_gb_s: Some(0.08),
            ..ctx
        };
        let r = ResultRow::new(&probed, &o, None, None);
        assert!((r.decode_gb_s.unwrap() - 0.1).abs() < 1e-12);
        assert!((r.tpot_vs_floor.unwrap() - 0.8).abs() < 1e-12);
        // 0.05 GB/s of attention against the 0.08 GB/s probed: 0.625 of the machine's rate.
        assert!((r.attn_bw_frac.unwrap() - 0.625).abs() < 1e-12);
    }

    /// A row joins its scheme's quality and the fp16 perplexity: the delta by hand,
    /// 100 × (11 / 10 − 1) = 10 %; no quality, no delta.
    #[test]
    fn rows_join_quality_and_baseline() {
        let ctx = RowContext {
            run_id: "r".into(),
            model: "m".into(),
            prefill_weight_dtype: "f32".into(),
            decode_weight_dtype: "q8_0".into(),
            ppl_weight_dtype: "f32".into(),
            ppl_ctx: Some(64),
            ppl_ci: CiMethod::StudentT,
            geometry: CacheGeometry {
                layers: 1,
                kv_heads: 1,
                q_heads: 1,
                head_dim: 64,
                window: None,
            },
            decode_weight_bytes: None,
            read_gb_s: None,
        };
        let ppl = |p: f64| PplResult {
            perplexity: p,
            mean_nll: p.ln(),
            scored_tokens: 1,
            windows: 1,
            window_nll: vec![p.ln()],
            ppl_se: None,
            noise_floor: None,
            kv_bytes_per_window: 0,
            mode: crate::quality::perplexity::PplMode::Chunked,
            agreement: None,
        };
        let point = |scheme: KvScheme| PointOutcome {
            scheme,
            batch: 1,
            seq_len: 8,
            timing: Err(PointStatus::Oom("x".into())),
        };
        let int8: KvScheme = "int8".parse().unwrap();
        let records = RawRecords {
            points: vec![
                point(KvScheme::FP16),
                point(int8),
                point("int4".parse().unwrap()),
            ],
            quality: vec![
                QualityOutcome {
                    scheme: KvScheme::FP16,
                    ppl: Some(ppl(10.0)),
                    rouge: None,
                    passkey: None,
                },
                QualityOutcome {
                    scheme: int8,
                    ppl: Some(ppl(11.0)),
                    rouge: None,
                    passkey: None,
                },
            ],
        };
        let rows = records.rows(&ctx);
        assert_eq!(rows[0].ppl_delta_pct, Some(0.0));
        assert!((rows[1].ppl_delta_pct.unwrap() - 10.0).abs() < 1e-12);
        assert_eq!((rows[2].ppl, rows[2].ppl_delta_pct), (None, None));
        assert_eq!(rows[1].status.to_string(), "oom: x");
        // One window: no interval (and no error).
        assert_eq!(
            (rows[1].delta_ppl_pct_lo, rows[1].ci_method.as_deref()),
            (None, None)
        );
    }

    /// The paired interval joined from the two schemes' per-window NLLs, by hand: differences
    /// d = (0.10, 0.05, 0.15), d̄ = 0.1, s_d = 0.05, SE = 0.05/√3 = 0.0288675,
    /// t₀.₉₇₅,₂ = 4.3026527 → d ∈ [−0.0242109, 0.2242109] → ΔPPL % = 100·(e^d − 1) ∈
    /// [−2.3916249, 25.1329875], point 10.5170918; an fp16 row pairs with itself (0, [0, 0]).
    #[test]
    fn rows_carry_the_paired_interval() {
        let ctx = RowContext {
            run_id: "r".into(),
            model: "m".into(),
            prefill_weight_dtype: "f32".into(),
            decode_weight_dtype: "f32".into(),
            ppl_weight_dtype: "f32".into(),
            ppl_ctx: Some(64),
            ppl_ci: CiMethod::StudentT,
            geometry: CacheGeometry {
                layers: 1,
                kv_heads: 1,
                q_heads: 1,
                head_dim: 64,
                window: None,
            },
            decode_weight_bytes: None,
            read_gb_s: None,
        };
        let ppl = |w: Vec<f64>| {
            let m = w.iter().sum::<f64>() / w.len() as f64;
            PplResult {
                perplexity: m.exp(),
                mean_nll: m,
                scored_tokens: 3,
                windows: w.len(),
                window_nll: w,
                ppl_se: Some(0.5),
                noise_floor: None,
                kv_bytes_per_window: 0,
                mode: crate::quality::perplexity::PplMode::Chunked,
                agreement: None,
            }
        };
        let q4: KvScheme = "q4_0".parse().unwrap();
        let point = |scheme| PointOutcome {
            scheme,
            batch: 1,
            seq_len: 8,
            timing: Err(PointStatus::Oom("x".into())),
        };
        let records = RawRecords {
            points: vec![point(KvScheme::FP16), point(q4)],
            quality: vec![
                QualityOutcome {
                    scheme: KvScheme::FP16,
                    ppl: Some(ppl(vec![1.0, 1.2, 0.8])),
                    rouge: None,
                    passkey: None,
                },
                QualityOutcome {
                    scheme: q4,
                    ppl: Some(ppl(vec![1.1, 1.25, 0.95])),
                    rouge: None,
                    passkey: None,
                },
            ],
        };
        let rows = records.rows(&ctx);
        let r = &rows[1];
        assert!((r.delta_ppl_pct.unwrap() - 10.5170918).abs() < 1e-6);
        assert!(
            (r.delta_ppl_pct_lo.unwrap() - -2.3916249).abs() < 1e-6,
            "{:?}",
            r.delta_ppl_pct_lo
        );
        assert!(
            (r.delta_ppl_pct_hi.unwrap() - 25.1329875).abs() < 1e-6,
            "{:?}",
            r.delta_ppl_pct_hi
        );
        // Absolute: ppl_fp16 = e^1 times the relative change.
        assert!((r.delta_ppl_hi.unwrap() - 1f64.exp() * 0.251329875).abs() < 1e-6);
        assert_eq!(
            (r.ci_method.as_deref(), r.ci_unit.as_deref()),
            (Some("t"), Some("window"))
        );
        assert_eq!(r.ppl_se, Some(0.5));
        assert_eq!(
            (rows[0].delta_ppl_pct_lo, rows[0].delta_ppl_pct_hi),
            (Some(0.0), Some(0.0))
        );
    }
}
