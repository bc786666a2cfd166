//! A serving run's folder read and rendered: the raw log `kvbench serve` appends to
//! (`raw.jsonl`: each request as it finishes, then each point's row and scheduler trace),
//! [`ServeRow`] — the schema of its `results.csv` —, `summary.md` and the charts. The serve
//! loop ([`crate::serve::run`]) writes through [`ServeLog`]; `kvbench report` re-renders a
//! folder with [`render`], as the run does when it finishes, so both give the same files.

use std::path::{Path, PathBuf};

use super::warnings::{Cause, PointWarning, Warnings, DRIFT_PCT, MIN_DRIFT_POINTS};
use crate::error::{Error, Result};
use crate::measure::contention::{Contention, CONTENDED_CORES};
use crate::measure::sweep::PointStatus;
use crate::serve::engine::{RequestRecord, StepSample};
use crate::serve::metrics::{summarize, ServeStats, Slo};
use crate::serve::run::{PointResult, ServeSink};
use crate::serve::settings::PointKey;
use crate::serve::workload::{Arrival, Load};
use crate::util::record::csv_record;

use super::chart::{Axis, LineChart, Series, Style};
use super::meta::{ReportContext, RunMeta};
use super::run_dir::{read_jsonl, RawLog};

/// A serving run's `meta.json`.
pub type ServeMeta = RunMeta<crate::serve::settings::ServeSettings, ServeContext>;

/// What every row of a serving run repeats (`meta.json`'s `report_context`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServeContext {
    /// The run id (empty in folders written before it was recorded).
    #[serde(default)]
    pub run_id: String,
    /// Model label (`--model` as given).
    pub model: String,
    /// KV budget, bytes.
    pub kv_budget_bytes: u64,
    /// Mean request length (prefix + prompt + output), tokens: the length `kvbench plan`'s
    /// predicted concurrency is for.
    pub mean_context_tokens: usize,
    /// `measured` (the real decode path) or `simulated` (`--simulate`).
    #[serde(default = "measured")]
    pub mode: String,
    /// The device profile a simulated run ran on (`h100-sxm (uncalibrated)`); empty when
    /// measured.
    #[serde(default)]
    pub profile: String,
}

fn measured() -> String {
    "measured".into()
}

impl ReportContext for ServeContext {
    /// Serve folders of formats 0 and 1 kept these at the top level of `meta.json`.
    fn from_legacy(meta: &serde_json::Value) -> Option<Self> {
        Some(ServeContext {
            run_id: meta["run_id"].as_str().unwrap_or_default().to_string(),
            model: meta["settings"]["model"].as_str()?.to_string(),
            kv_budget_bytes: meta["kv_budget_bytes"].as_u64()?,
            mean_context_tokens: meta["mean_context_tokens"].as_u64()? as usize,
            mode: measured(),
            profile: String::new(),
        })
    }
}

csv_record! {
    /// One row of a serving run's `results.csv` (and of its `raw.jsonl`): the point, the pool,
    /// what `plan` predicts, and what was measured ([`ServeStats`], every column of it). Times
    /// ms, rates per second, memory bytes.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct ServeRow {
        /// Run id (`meta.json`); empty in rows written before it was a column.
        pub run_id: String,
        /// Model (`--model` as given).
        pub model: String,
        /// `measured`, or `simulated` (`--simulate`: nothing here was measured).
        pub mode: String,
        /// The device profile of a simulated run; empty when measured.
        pub profile: String,
        /// KV scheme.
        pub scheme: String,
        /// Arrival process and load, e.g. `poisson 2 req/s`.
        pub arrival: String,
        /// Request rate (req/s; `inf`: every request at once) or closed-loop clients.
        pub load: Load,
        /// Whether the shared prefix was cached (stored once, prefilled once).
        pub prefix_caching: bool,
        /// `ok`, or why the point failed (`error: …`).
        pub status: PointStatus,
        /// KV budget, bytes.
        pub kv_budget_bytes: u64,
        /// Bytes per block for this scheme.
        pub block_bytes: u64,
        /// Blocks in the pool.
        pub total_blocks: usize,
        /// `kvbench plan`'s max concurrency at this budget for a sequence of the mean length
        /// (prefix + mean prompt + mean output tokens).
        pub predicted_max_concurrency: u64,
        /// What was measured.
        pub stats: ServeStats { .. },
        /// The one prefill of the shared prefix (prefix caching), ms.
        pub prefix_prefill_ms: f64,
        /// Cores other processes used meanwhile (see `measure::contention`).
        pub other_cores: Option<f64>,
        /// Whether `other_cores` exceeded the contention threshold: the latencies describe a
        /// shared machine.
        pub contended: bool,
        /// The speed probe's prefill ([`crate::perf::SpeedProbe`]), ms: measured right before
        /// the point; in a simulated row under `--speed-from`, the measured run's (the median
        /// over its points), which the simulation's costs were scaled to; empty otherwise.
        pub probe_prefill_ms: Option<f64>,
        /// The speed probe's decode step, ms, as `probe_prefill_ms`.
        pub probe_step_ms: Option<f64>,
    }
}

impl ServeRow {
    /// The row of a finished (or failed) point: its settings, what `plan` predicted, and the
    /// metrics [`summarize`] computes from its records under `slo`.
    pub fn new(ctx: &ServeContext, p: &PointResult<'_>, slo: &Slo) -> Self {
        let (stats, status, o) = match &p.outcome {
            Ok(o) => (summarize(o, slo), PointStatus::Ok, Some(o)),
            Err(e) => (ServeStats::default(), PointStatus::Error(e.clone()), None),
        };
        // A simulated point's times are the model's: other processes cannot stretch them.
        let other_cores = p
            .contention
            .filter(|_| ctx.mode != "simulated")
            .map(|c| c.other_cores);
        ServeRow {
            run_id: ctx.run_id.clone(),
            model: ctx.model.clone(),
            mode: ctx.mode.clone(),
            profile: ctx.profile.clone(),
            scheme: p.key.scheme.clone(),
            arrival: p.key.arrival.label(),
            load: Load(p.key.arrival.load()),
            prefix_caching: p.key.prefix_caching,
            status,
            kv_budget_bytes: ctx.kv_budget_bytes,
            block_bytes: p.block_bytes,
            total_blocks: o.map_or(0, |o| o.total_blocks),
            predicted_max_concurrency: p.predicted_max_concurrency,
            stats,
            prefix_prefill_ms: o.map_or(0.0, |o| o.prefix_prefill_s * 1e3),
            other_cores,
            contended: other_cores.is_some_and(|c| c > CONTENDED_CORES),
            probe_prefill_ms: p.probe.map(|p| p.prefill_ms),
            probe_step_ms: p.probe.map(|p| p.step_ms),
        }
    }

    /// The point's speed probe (`probe_prefill_ms`, `probe_step_ms`), when it has one whose
    /// times are finite and > 0.
    pub fn probe(&self) -> Option<crate::perf::SpeedProbe> {
        let ok = |v: Option<f64>| v.filter(|v| v.is_finite() && *v > 0.0);
        Some(crate::perf::SpeedProbe {
            prefill_ms: ok(self.probe_prefill_ms)?,
            step_ms: ok(self.probe_step_ms)?,
        })
    }

    /// Whether other processes used more than [`CONTENDED_CORES`] while the point ran.
    pub fn contended(&self) -> bool {
        self.other_cores.is_some_and(|c| c > CONTENDED_CORES)
    }
}

/// A line of a serving run's `raw.jsonl`. Rows written before a column existed (`run_id`,
/// `model`, `rejected`, `contended`: kvbench before issue #21) read with that column filled in
/// (empty names — the report fills them from `meta.json` —, requests not completed, contention
/// from `other_cores`).
/// Written and read one line at a time, so the size difference between the variants costs
/// nothing worth a box.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[allow(clippy::large_enum_variant)]
pub enum RawLine {
    /// A request, written as it finishes.
    Request {
        /// Its point.
        #[serde(flatten)]
        point: PointKey,
        /// What happened to it.
        #[serde(flatten)]
        record: RequestRecord,
    },
    /// A finished point: its row and the scheduler's trace.
    Point {
        /// Which point.
        #[serde(flatten)]
        point: PointKey,
        /// Its results row.
        row: ServeRow,
        /// The scheduler's state after every decode step.
        steps: Vec<StepSample>,
        /// Other processes' CPU use meanwhile.
        contention: Option<Contention>,
    },
}

/// A raw line as JSON, with the columns of older rows filled in (see [`RawLine`]).
fn upgrade(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(row) = v.get_mut("row").and_then(|r| r.as_object_mut()) {
        for key in ["run_id", "model", "profile"] {
            row.entry(key).or_insert_with(|| "".into());
        }
        row.entry("mode").or_insert_with(|| "measured".into());
        if !row.contains_key("rejected") {
            let n = |k: &str| row.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            let rejected = n("requests").saturating_sub(n("completed"));
            row.insert("rejected".into(), rejected.into());
        }
        if !row.contains_key("contended") {
            let busy = row
                .get("other_cores")
                .and_then(|c| c.as_f64())
                .is_some_and(|c| c > CONTENDED_CORES);
            row.insert("contended".into(), busy.into());
        }
    }
    v
}

impl RawLine {
    /// The point the line belongs to.
    pub fn point(&self) -> &PointKey {
        match self {
            RawLine::Request { point, .. } | RawLine::Point { point, .. } => point,
        }
    }
}

/// Reads a serving run's `raw.jsonl` in `dir` (missing: no lines; a last line cut short by an
/// interrupted write dropped with a warning). Errors: [`Error::Io`] (unreadable),
/// [`Error::InvalidArgument`] naming the file and line of any other line that does not parse.
pub fn read_raw(dir: &Path) -> Result<Vec<RawLine>> {
    let path = dir.join(super::run_dir::RAW_FILE);
    read_jsonl::<serde_json::Value>(&path, "serve raw")?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value(upgrade(v)).map_err(|e| Error::InvalidArgument {
                name: format!("{}:{}", path.display(), i + 1),
                reason: format!("not a kvbench serve raw line: {e}"),
            })
        })
        .collect()
}

/// The lines of the points that finished, in file order (requests of an unfinished point are
/// dropped: the point runs again on `--resume`), and those points. With `rerun_contended`
/// (`--rerun-contended`) a point timed while other processes used the CPU counts as
/// unfinished too, so it is measured again.
pub fn finished(lines: Vec<RawLine>, rerun_contended: bool) -> (Vec<RawLine>, Vec<PointKey>) {
    let done: Vec<PointKey> = lines
        .iter()
        .filter_map(|l| match l {
            RawLine::Point { row, .. } if rerun_contended && row.contended() => None,
            RawLine::Point { point, .. } => Some(point.clone()),
            RawLine::Request { .. } => None,
        })
        .collect();
    let kept = lines
        .into_iter()
        .filter(|l| done.contains(l.point()))
        .collect();
    (kept, done)
}

/// Called with every row after its line is written.
type RowHook = Box<dyn FnMut(&ServeRow)>;

/// The writer of a serving run's `raw.jsonl` (the [`ServeSink`] the serve loop writes to):
/// one line per request as it finishes, one per point with its row and trace; each flushed at
/// once, so an interrupted run keeps everything finished.
pub struct ServeLog {
    raw: RawLog,
    ctx: ServeContext,
    slo: Slo,
    on_row: Option<RowHook>,
    /// Points written, failed points, and the first failure (`scheme load: status`).
    pub tally: (usize, usize, Option<String>),
}

impl ServeLog {
    /// Opens `dir/raw.jsonl` to append, rewritten first to exactly `earlier` (the lines of the
    /// points a resumed run finished; [`finished`]). Errors: [`Error::Io`] naming the file.
    pub fn open(dir: &Path, ctx: ServeContext, slo: Slo, earlier: &[RawLine]) -> Result<Self> {
        let path = dir.join(super::run_dir::RAW_FILE);
        let keep = earlier
            .iter()
            .map(|l| serde_json::to_string(l).map_err(|e| Error::io(&path, e.into())))
            .collect::<Result<Vec<_>>>()?;
        let mut log = ServeLog {
            raw: RawLog::open(dir, &keep)?,
            ctx,
            slo,
            on_row: None,
            tally: (0, 0, None),
        };
        for l in earlier {
            if let RawLine::Point { row, .. } = l {
                log.count(row);
            }
        }
        Ok(log)
    }

    /// Calls `f` with every row after it is written (e.g. to print it above a progress bar).
    pub fn on_row(mut self, f: impl FnMut(&ServeRow) + 'static) -> Self {
        self.on_row = Some(Box::new(f));
        self
    }

    fn count(&mut self, row: &ServeRow) {
        self.tally.0 += 1;
        if !row.status.is_ok() {
            self.tally.1 += 1;
            if self.tally.2.is_none() {
                self.tally.2 = Some(format!("{} {}: {}", row.scheme, row.arrival, row.status));
            }
        }
    }

    /// Whether there were points and none of them ran.
    pub fn all_failed(&self) -> bool {
        self.tally.0 > 0 && self.tally.1 == self.tally.0
    }
}

impl ServeSink for ServeLog {
    fn request(&mut self, key: &PointKey, record: &RequestRecord) -> Result<()> {
        self.raw.append(&RawLine::Request {
            point: key.clone(),
            record: record.clone(),
        })
    }

    fn point(&mut self, result: PointResult<'_>) -> Result<()> {
        let row = ServeRow::new(&self.ctx, &result, &self.slo);
        let steps = result.outcome.map(|o| o.steps).unwrap_or_default();
        self.raw.append(&RawLine::Point {
            point: result.key.clone(),
            row: row.clone(),
            steps,
            contention: result.contention,
        })?;
        self.count(&row);
        if let Some(f) = self.on_row.as_mut() {
            f(&row);
        }
        Ok(())
    }
}

/// A serving run's folder read back: its `meta.json` and its finished points.
#[derive(Debug)]
pub struct ServeRun {
    /// The folder.
    pub dir: PathBuf,
    /// `meta.json`, typed.
    pub meta: ServeMeta,
    /// `meta.json` as written.
    pub value: serde_json::Value,
    /// One row per finished point, in the order they finished.
    pub rows: Vec<ServeRow>,
    /// Each point's scheduler trace, in the same order.
    pub traces: Vec<(PointKey, Vec<StepSample>)>,
    /// Each point's request records, in the same order (the samples of its percentiles).
    pub requests: Vec<Vec<RequestRecord>>,
}

impl ServeRun {
    /// Reads `dir/meta.json` and `dir/raw.jsonl`. Errors: as [`ServeMeta::read`] and
    /// [`read_raw`].
    pub fn read(dir: &Path) -> Result<ServeRun> {
        let (meta, value) = ServeMeta::read(&dir.join(super::run_dir::META_FILE))?;
        let mut rows = Vec::new();
        let mut traces = Vec::new();
        let mut requests = Vec::new();
        let mut pending: Vec<(PointKey, RequestRecord)> = Vec::new();
        let ctx = &meta.report_context;
        for l in read_raw(dir)? {
            if let RawLine::Request { point, record } = l {
                pending.push((point, record));
            } else if let RawLine::Point {
                point,
                mut row,
                steps,
                ..
            } = l
            {
                let (mine, rest): (Vec<_>, Vec<_>) =
                    pending.into_iter().partition(|(p, _)| *p == point);
                pending = rest;
                requests.push(mine.into_iter().map(|(_, r)| r).collect());
                // Rows written before these were columns.
                if row.run_id.is_empty() {
                    row.run_id = ctx.run_id.clone();
                }
                if row.model.is_empty() {
                    row.model = ctx.model.clone();
                }
                if row.mode != ctx.mode {
                    row.mode = ctx.mode.clone();
                }
                row.contended = row.contended();
                rows.push(row);
                traces.push((point, steps));
            }
        }
        Ok(ServeRun {
            dir: dir.to_path_buf(),
            meta,
            value,
            rows,
            traces,
            requests,
        })
    }

    /// A row's legend label: the scheme, with the prefix-caching arm when there is a prefix.
    fn label(&self, scheme: &str, prefix_caching: bool) -> String {
        if self.meta.settings.load.shared_prefix > 0 {
            format!(
                "{scheme} (prefix cache {})",
                if prefix_caching { "on" } else { "off" }
            )
        } else {
            scheme.to_string()
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// ` (simulated on <profile>)` for a simulated run, else nothing: in every title and caption.
fn simulated_on(ctx: &ServeContext) -> String {
    if ctx.mode == "simulated" {
        format!(" (simulated on {})", ctx.profile)
    } else {
        String::new()
    }
}

/// `x` to `prec` decimals, `-` when there is nothing to show.
fn num(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.prec$}"))
}

/// A share 0–1 as a percentage, `-` when there is nothing to show.
fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.1} %", 100.0 * v))
}

/// Writes `results.csv`, `summary.md` and the charts of `run` into its folder; returns the
/// Markdown. Errors: [`Error::Io`] naming the file.
pub fn render(run: &ServeRun) -> Result<String> {
    let csv_path = run.dir.join(super::run_dir::CSV_FILE);
    let io = |e: csv::Error| Error::io(&csv_path, std::io::Error::other(e.to_string()));
    let mut w = csv::Writer::from_path(&csv_path).map_err(io)?;
    for r in &run.rows {
        w.serialize(r).map_err(io)?;
    }
    w.flush().map_err(|e| Error::io(&csv_path, e))?;
    let mut md = markdown(run);
    charts(run)?;
    md.push_str(
        "\n![p95 latency vs load](plots/p95_latency_vs_rate.png)\n![goodput vs load](plots/goodput_vs_rate.png)\n![running sequences](plots/running_over_time.png)\n",
    );
    let path = run.dir.join(super::run_dir::SUMMARY_FILE);
    std::fs::write(&path, &md).map_err(|e| Error::io(&path, e))?;
    Ok(md)
}

/// `summary.md`'s text (charts' links aside).
fn markdown(run: &ServeRun) -> String {
    let (s, ctx) = (&run.meta.settings, &run.meta.report_context);
    let l = &s.load;
    let mut md = format!(
        "# kvbench serve — {}{}\n\n{}KV budget {:.1} MiB, blocks of {} tokens; {} requests per point, \
         prompts {} tokens{} ({}), outputs {} tokens; SLO {}; max {} running; \
         seed {}. Predicted concurrency: `kvbench plan` at this budget for a sequence of the mean \
         length ({} tokens).\n\n",
        ctx.model,
        simulated_on(ctx),
        if ctx.mode == "simulated" {
            "**Simulated, not measured**: every time below is the performance model's \
             (`crate::perf`) for this device profile, on the same scheduler, block pool and \
             requests as a measured run. "
        } else {
            ""
        },
        mib(ctx.kv_budget_bytes),
        s.pool.block_size,
        l.num_requests,
        l.input_len,
        if l.shared_prefix > 0 {
            format!(" after a shared prefix of {}", l.shared_prefix)
        } else {
            String::new()
        },
        if ctx.mode == "simulated" {
            "lengths only"
        } else {
            "WikiText-2 text"
        },
        l.output_len,
        s.slo.slo,
        s.pool.max_num_seqs,
        s.seed.seed,
        ctx.mean_context_tokens,
    );
    md.push_str("| scheme | load | prefix cache | blocks | plan max seqs | max running | mean running | preempt | req/s | out tok/s | goodput req/s | TTFT p95 ms | TPOT p95 ms | E2E p95 ms | block util | frag | prefix saved MiB | status |\n");
    md.push_str(
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in &run.rows {
        let st = &r.stats;
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scheme,
            r.arrival,
            if r.prefix_caching { "on" } else { "off" },
            r.total_blocks,
            r.predicted_max_concurrency,
            st.running_max,
            num(st.running_mean, 1),
            st.preemptions,
            num(st.request_throughput, 2),
            num(st.output_tokens_per_s, 1),
            num(st.goodput, 2),
            num(st.ttft_ms.p95, 0),
            num(st.tpot_ms.p95, 0),
            num(st.e2e_ms.p95, 0),
            pct(st.block_util_mean),
            pct(st.fragmentation_mean),
            num(st.prefix_saved_bytes_mean.map(|b| b / (1u64 << 20) as f64), 1),
            r.status
        ));
    }
    md.push_str(
        "\nplan max seqs counts sequences at their full mean length; a running batch mixes \
         sequences early in their lives (fewer blocks), so the measured maximum can exceed it \
         until they grow and preemptions bring it back. Prefix saved: pool accounting of what \
         shared blocks save (the CPU cache copies the prefix rows).\n",
    );
    if l.shared_prefix > 0 {
        md.push_str(&prefix_table(run));
    }
    md.push_str(&warnings(&run.rows).markdown());
    md
}

/// The prefix-sharing section: each scheme's TTFT and memory with the prefix cached and not.
fn prefix_table(run: &ServeRun) -> String {
    let mut md = format!(
        "\n## Prefix sharing ({} shared tokens)\n\n| scheme | load | TTFT p50 off ms | TTFT p50 on ms | TTFT saved ms | prefix prefill ms | memory saved MiB (mean / max) |\n|---|---|---:|---:|---:|---:|---:|\n",
        run.meta.settings.load.shared_prefix
    );
    for on in run.rows.iter().filter(|r| r.prefix_caching) {
        if let Some(off) = run
            .rows
            .iter()
            .find(|r| !r.prefix_caching && r.scheme == on.scheme && r.arrival == on.arrival)
        {
            let (a, b) = (off.stats.ttft_ms.p50, on.stats.ttft_ms.p50);
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.0} | {} / {:.2} |\n",
                on.scheme,
                on.arrival,
                num(a, 0),
                num(b, 0),
                num(a.zip(b).map(|(a, b)| a - b), 0),
                on.prefix_prefill_ms,
                num(
                    on.stats
                        .prefix_saved_bytes_mean
                        .map(|b| b / (1u64 << 20) as f64),
                    2
                ),
                mib(on.stats.prefix_saved_bytes_max)
            ));
        }
    }
    md.push_str(
        "\nEviction schemes run without prefix caching (their blocks are not immutable). \
         Memory saved is the block pool's accounting; the CPU cache holds a copy of the \
         prefix rows per sequence.\n",
    );
    md
}

/// The charts: p95 E2E latency, p95 TTFT and goodput against the load, and running sequences
/// over time at the highest load. Errors: [`Error::Io`] naming the file.
fn charts(run: &ServeRun) -> Result<()> {
    let (s, ctx) = (&run.meta.settings, &run.meta.report_context);
    let plots = run.dir.join(super::run_dir::PLOTS_DIR);
    std::fs::create_dir_all(&plots).map_err(|e| Error::io(&plots, e))?;
    let mut names: Vec<String> = Vec::new();
    for r in &run.rows {
        let n = run.label(&r.scheme, r.prefix_caching);
        if !names.contains(&n) {
            names.push(n);
        }
    }
    // Clients are a count (ticks in powers of two); a rate is decimal.
    let x_axis = if s.load.concurrency.is_empty() {
        Axis::decimal("request rate (requests/s)")
    } else {
        Axis::binary("concurrent clients (closed loop)")
    };
    let caption = format!(
        "{}{} · KV budget {:.1} MiB · {} requests, prompts {}, outputs {} · kvbench {}",
        ctx.model,
        simulated_on(ctx),
        mib(ctx.kv_budget_bytes),
        s.load.num_requests,
        s.load.input_len,
        s.load.output_len,
        env!("CARGO_PKG_VERSION")
    );
    // A point timed while other processes kept the machine busy is drawn hollow; every point
    // carries its 95 % interval as a bar ([`intervals`]).
    type Value<'a> = &'a dyn Fn(&ServeRow, &Intervals) -> Option<(f64, (f64, f64))>;
    let series = |f: Value<'_>| -> Vec<Series> {
        names
            .iter()
            .map(|n| {
                let mut pts: Vec<(f64, f64, (f64, f64), bool)> = run
                    .rows
                    .iter()
                    .zip(&run.requests)
                    .filter(|(r, _)| {
                        &run.label(&r.scheme, r.prefix_caching) == n
                            && r.status.is_ok()
                            && r.load.0.is_finite()
                    })
                    .filter_map(|(r, reqs)| {
                        let slo = &run.meta.settings.slo.slo;
                        let (y, bar) = f(r, &intervals(reqs, slo, r.stats.duration_s))?;
                        Some((r.load.0, y, bar, r.contended()))
                    })
                    .collect();
                pts.sort_by(|x, y| x.0.total_cmp(&y.0));
                Series::line(n.clone(), pts.iter().map(|p| (p.0, p.1)).collect())
                    .with_bars(pts.iter().map(|p| p.2).collect())
                    .with_hollow(pts.iter().map(|p| p.3).collect())
            })
            .collect()
    };
    let charts = [
        (
            "p95_latency_vs_rate",
            "E2E latency p95 vs load (bars: 95 % interval of the percentile)",
            "E2E latency p95 (ms)",
            series(&|r, i| Some((r.stats.e2e_ms.p95?, i.e2e_p95))),
        ),
        (
            "ttft_p95_vs_rate",
            "TTFT p95 vs load (bars: 95 % interval of the percentile)",
            "TTFT p95 (ms)",
            series(&|r, i| Some((r.stats.ttft_ms.p95?, i.ttft_p95))),
        ),
        (
            "goodput_vs_rate",
            "Goodput vs load (bars: Wilson 95 % interval)",
            "goodput (requests/s meeting the SLO)",
            series(&|r, i| Some((r.stats.goodput?, i.goodput))),
        ),
    ];
    for (stem, title, y, series) in charts {
        LineChart {
            title: title.into(),
            caption: caption.clone(),
            x: x_axis.clone(),
            y: Axis::decimal(y),
            series,
        }
        .render(&plots, stem)?;
    }
    running_chart(run, &plots, caption)
}

/// The 95 % intervals a serving point's charts draw as bars, `(lo, hi)` in the value's unit
/// (NaN ends: no bar).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Intervals {
    /// E2E latency p95, ms: order statistics of the completed requests'
    /// ([`crate::stats::percentile_ci95`]).
    pub e2e_p95: (f64, f64),
    /// TTFT p95, ms, likewise.
    pub ttft_p95: (f64, f64),
    /// Goodput, requests/s: Wilson's interval of the share of requests that met the SLO
    /// ([`crate::stats::wilson_ci95`]) times requests ÷ the point's duration.
    pub goodput: (f64, f64),
}

/// A point's [`Intervals`] from its request records `reqs` (as `raw.jsonl` holds them), the
/// run's `slo` and the point's `duration_s` (first arrival to last token, s, as
/// [`summarize`] measures it): the samples [`summarize`] takes its percentiles and goodput
/// from, so each bar brackets the value drawn. A point without records (older folders) gets
/// no bars.
pub fn intervals(reqs: &[RequestRecord], slo: &Slo, duration_s: f64) -> Intervals {
    let none = (f64::NAN, f64::NAN);
    let ok: Vec<&RequestRecord> = reqs.iter().filter(|r| r.status == "ok").collect();
    let p95 = |f: &dyn Fn(&RequestRecord) -> f64| {
        let mut xs: Vec<f64> = ok.iter().map(|r| f(r)).collect();
        crate::stats::percentile_ci95(&mut xs, 95.0).map_or(none, |(b, _)| b)
    };
    let good = ok.iter().filter(|r| slo.met(r)).count();
    let goodput = match (crate::stats::wilson_ci95(good, reqs.len()), duration_s) {
        (Some((lo, hi)), d) if d > 0.0 => {
            let per_s = reqs.len() as f64 / d;
            (lo * per_s, hi * per_s)
        }
        _ => none,
    };
    Intervals {
        e2e_p95: p95(&|r| r.e2e_ms()),
        ttft_p95: p95(&|r| r.ttft_ms()),
        goodput,
    }
}

/// Running sequences over time at the highest load, as steps (the count holds between
/// scheduler steps). Errors: [`Error::Io`] naming the file.
fn running_chart(run: &ServeRun, plots: &Path, caption: String) -> Result<()> {
    let top = run
        .traces
        .iter()
        .map(|(p, _)| p.arrival.load())
        .fold(f64::NEG_INFINITY, f64::max);
    let running: Vec<Series> = run
        .traces
        .iter()
        .filter(|(p, _)| p.arrival.load() == top)
        .map(|(p, steps)| {
            Series::line(
                run.label(&p.scheme, p.prefix_caching),
                steps.iter().map(|s| (s.t_s, s.running as f64)).collect(),
            )
            .with_style(Style::Steps)
        })
        .collect();
    let label = run
        .traces
        .iter()
        .map(|(p, _)| p.arrival)
        .find(|a| a.load() == top)
        .map_or(String::new(), |a: Arrival| a.label());
    LineChart {
        title: format!("Running sequences over time ({label})"),
        caption,
        x: Axis::decimal("time since the first arrival (s)"),
        y: Axis::binary("sequences in the decode batch"),
        series: running,
    }
    .render(plots, "running_over_time")
}

/// A serving run's warnings ([`Warnings`], rendered there): points that ran while other
/// processes used the CPU, and measured points whose speed probe ran more than [`DRIFT_PCT`] %
/// off the run's median (judged on [`MIN_DRIFT_POINTS`] or more probed points). Failed rows
/// are skipped.
pub fn warnings(rows: &[ServeRow]) -> Warnings {
    let ok: Vec<&ServeRow> = rows.iter().filter(|r| r.status.is_ok()).collect();
    let name = |r: &ServeRow| {
        format!(
            "{} {}{}",
            r.scheme,
            r.arrival,
            if r.prefix_caching {
                ", prefix cached"
            } else {
                ""
            }
        )
    };
    let mut list: Vec<PointWarning> = ok
        .iter()
        .filter(|r| r.contended())
        .filter_map(|r| {
            Some(PointWarning {
                point: name(r),
                cause: Cause::Contended {
                    other_cores: r.other_cores?,
                },
            })
        })
        .collect();
    // Drift: each measured point's speed probe against its run's median (a simulated row's
    // probe is the measured run's it was scaled to, not a measurement; a merged folder holds
    // several runs, perhaps of several machines, each judged against its own).
    let measured: Vec<(&ServeRow, crate::perf::SpeedProbe)> = ok
        .iter()
        .filter(|r| r.mode != "simulated")
        .filter_map(|r| Some((*r, r.probe()?)))
        .collect();
    let mut runs: Vec<&str> = measured.iter().map(|(r, _)| r.run_id.as_str()).collect();
    runs.sort_unstable();
    runs.dedup();
    for run in runs {
        let own: Vec<_> = measured.iter().filter(|(r, _)| r.run_id == run).collect();
        if own.len() < MIN_DRIFT_POINTS {
            continue;
        }
        let probes: Vec<_> = own.iter().map(|(_, p)| *p).collect();
        let median = crate::perf::SpeedProbe::median(&probes).expect("three or more");
        for (r, p) in own {
            if p.drift(&median) > DRIFT_PCT / 100.0 {
                let (prefill, step) = p.slowdown(&median);
                list.push(PointWarning {
                    point: name(r),
                    cause: Cause::Drifted { prefill, step },
                });
            }
        }
    }
    Warnings {
        command: "serve",
        points: ok.len(),
        list,
    }
}

/// The line printed as a point finishes: scheme, load, prefix arm, and the headline numbers
/// (or the failure), marked when other processes used the CPU meanwhile.
pub fn point_line(r: &ServeRow) -> String {
    let mut line = format!(
        "{:<28} {:<22} prefix-cache {:<5}: {}",
        r.scheme,
        r.arrival,
        r.prefix_caching,
        if r.status.is_ok() {
            format!(
                "max running {} (plan {}), {} req/s, E2E p95 {} ms, TTFT p95 {} ms, {} preemptions",
                r.stats.running_max,
                r.predicted_max_concurrency,
                num(r.stats.request_throughput, 2),
                num(r.stats.e2e_ms.p95, 0),
                num(r.stats.ttft_ms.p95, 0),
                r.stats.preemptions
            )
        } else {
            r.status.to_string()
        }
    );
    if let Some(c) = r.other_cores.filter(|_| r.contended()) {
        // The advice comes once, grouped, in the run's summary (`report::warnings`).
        line.push_str(&format!(" (contended: other processes used {c:.2} cores)"));
    }
    line
}

/// Serving runs joined into one: the points of runs of one experiment — the same settings
/// but for their schemes and loads, the same model file — measured apart (on several machines,
/// or one scheme at a time), as `kvbench merge` joins a sharded sweep.
#[derive(Debug)]
pub struct MergedServe {
    /// The merged run's `meta.json`: the first run's, with the schemes and loads of all, the
    /// runs it came from (`merged_from`) and its status (`finished`, or `partial` when a run
    /// had not finished).
    pub meta: ServeMeta,
    /// Every finished point's lines, run after run.
    pub lines: Vec<RawLine>,
    /// What is missing (unfinished runs), for the warning and `meta.json`.
    pub missing: Vec<String>,
}

/// Joins `runs`. Errors: [`Error::InvalidArgument`] naming the run and the setting that
/// differs (anything but the schemes and loads, the model file's sha256), a point measured by
/// two runs, or a run that did not finish unless `allow_partial`.
pub fn merge_runs(runs: &[ServeRun], allow_partial: bool) -> Result<MergedServe> {
    use super::meta::RunStatus;
    let first = runs.first().ok_or_else(|| Error::InvalidArgument {
        name: "kvbench merge".into(),
        reason: "no run folder given".into(),
    })?;
    let bad = |r: &ServeRun, reason: String| Error::InvalidArgument {
        name: r.dir.display().to_string(),
        reason,
    };
    let experiment = |r: &ServeRun| {
        let mut s = r.meta.settings.clone();
        s.schemes.dtypes.0.clear();
        s.load.rate.clear();
        s.load.concurrency.clear();
        s
    };
    let mut meta = first.meta.clone();
    let mut lines = Vec::new();
    let mut seen: Vec<PointKey> = Vec::new();
    let mut missing = Vec::new();
    for r in runs {
        if experiment(r) != experiment(first) {
            return Err(bad(
                r,
                format!(
                "its settings differ from {}'s in more than the schemes and loads; only runs of \
                 one experiment merge (compare them with `kvbench report A B`)",
                first.dir.display()
            ),
            ));
        }
        if r.value["model"]["sha256"] != first.value["model"]["sha256"] {
            return Err(bad(
                r,
                format!(
                    "it served another model file than {} (sha256 differs)",
                    first.dir.display()
                ),
            ));
        }
        if r.meta.status != Some(RunStatus::Finished) {
            let what = format!(
                "{} has status {} (resume it with `kvbench serve --resume {}`)",
                r.dir.display(),
                r.meta
                    .status
                    .map_or("unknown".into(), |s| format!("{s:?}").to_lowercase()),
                r.dir.display()
            );
            if !allow_partial {
                return Err(bad(r, format!("{what}; or pass --allow-partial")));
            }
            missing.push(what);
        }
        let s = &r.meta.settings;
        for k in &s.schemes.dtypes.0 {
            if !meta.settings.schemes.dtypes.0.contains(k) {
                meta.settings.schemes.dtypes.0.push(*k);
            }
        }
        for x in &s.load.rate {
            if !meta.settings.load.rate.contains(x) {
                meta.settings.load.rate.push(*x);
            }
        }
        for c in &s.load.concurrency {
            if !meta.settings.load.concurrency.contains(c) {
                meta.settings.load.concurrency.push(*c);
            }
        }
        let (kept, done) = finished(read_raw(&r.dir)?, false);
        if let Some(p) = done.iter().find(|p| seen.contains(p)) {
            return Err(bad(
                r,
                format!(
                "its point {} {} was measured by another of the runs too; merge each point once",
                p.scheme,
                p.arrival.label()
            ),
            ));
        }
        seen.extend(done);
        lines.extend(kept);
    }
    meta.status = Some(if missing.is_empty() {
        RunStatus::Finished
    } else {
        RunStatus::Partial
    });
    meta.details.insert(
        "merged_from".into(),
        serde_json::json!(runs
            .iter()
            .map(|r| serde_json::json!({ "dir": r.dir, "run_id": r.meta.run_id }))
            .collect::<Vec<_>>()),
    );
    if !missing.is_empty() {
        meta.details
            .insert("missing".into(), serde_json::json!(missing));
    }
    Ok(MergedServe {
        meta,
        lines,
        missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{CacheGeometry, KvScheme};
    use crate::serve::run::{plan_geometry, run, PointBackend, Workload};
    use crate::serve::settings::{ServePlan, ServeSettings};
    use crate::serve::virtual_backend::{FixedCost, VirtualBackend};
    use crate::serve::workload::{LenDist, Rate};

    fn plan() -> ServePlan {
        let mut s = ServeSettings::default();
        s.schemes.dtypes.0 = vec![KvScheme::FP16, "int4".parse().unwrap()];
        s.load.rate = vec![Rate(f64::INFINITY), Rate(50.0)];
        s.load.num_requests = 6;
        s.load.input_len = LenDist::Uniform(20, 40);
        s.load.output_len = LenDist::Uniform(4, 8);
        s.pool.kv_budget = "2MiB".parse().unwrap();
        ServePlan::build(&s).unwrap()
    }

    const GEOM: CacheGeometry = CacheGeometry {
        layers: 30,
        kv_heads: 3,
        q_heads: 9,
        head_dim: 64,
        window: None,
    };

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("kvbench-serve-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Serves `todo` of `plan` into `dir` on the virtual clock (1 ms per prefilled token,
    /// 10 ms + 1 ms per sequence per decode step), after the lines `earlier`.
    fn serve_into(dir: &Path, plan: &ServePlan, todo: &[PointKey], earlier: &[RawLine]) {
        let text: Vec<u32> = (0..5000).collect();
        let work = Workload::build(plan, &text, || unreachable!("no XSum lengths")).unwrap();
        let ctx = ServeContext {
            run_id: "r".into(),
            model: "m".into(),
            kv_budget_bytes: plan.budget,
            mean_context_tokens: work.mean_ctx,
            mode: "simulated".into(),
            profile: "fixed costs".into(),
        };
        let mut log = ServeLog::open(dir, ctx, plan.settings.slo.slo, earlier).unwrap();
        let model = plan_geometry("m", GEOM, 4096);
        let cost = FixedCost {
            prefill_token_s: 1e-3,
            step_s: 0.010,
            step_seq_s: 0.001,
        };
        run(
            plan,
            &model,
            &work,
            todo,
            &mut |s| {
                Ok(PointBackend {
                    backend: Box::new(VirtualBackend::new(cost, plan.sizer(s, GEOM))),
                    probe: None,
                })
            },
            &mut log,
            &(),
        )
        .unwrap();
    }

    /// The raw log without what depends on the machine (other processes' CPU use).
    fn deterministic(dir: &Path) -> Vec<String> {
        read_raw(dir)
            .unwrap()
            .into_iter()
            .map(|mut l| {
                if let RawLine::Point {
                    row, contention, ..
                } = &mut l
                {
                    (row.other_cores, row.contended, *contention) = (None, false, None);
                }
                serde_json::to_string(&l).unwrap()
            })
            .collect()
    }

    /// Issue #26's error bars, by hand: 10 one-token requests arriving at 0 with TTFT
    /// 100, 200, …, 1000 ms, SLO TTFT ≤ 800 ms (8 met), 1 s long. TTFT p95's interval: for
    /// B ~ Bin(10, 0.95), P(B ≤ 7) = 0.0115 ≤ 0.025 < P(B ≤ 8) = 0.0861, so the lower end is
    /// the 8th value (800 ms); no upper rank exists (P(B ≤ 9) = 0.401), so the maximum
    /// (1000 ms). Goodput: Wilson's (0.4902, 0.9434) for 8 of 10 × 10 requests/s.
    #[test]
    fn serve_bars_by_hand() {
        let reqs: Vec<RequestRecord> = (1..=10)
            .map(|i| RequestRecord {
                id: i,
                prompt_tokens: 8,
                output_tokens: 1,
                arrival_s: 0.0,
                first_token_s: i as f64 * 0.1,
                token_s: Vec::new(),
                preemptions: 0,
                status: "ok".into(),
            })
            .collect();
        let slo: Slo = "ttft=800".parse().unwrap();
        let i = intervals(&reqs, &slo, 1.0);
        assert!((i.ttft_p95.0 - 800.0).abs() < 1e-9 && (i.ttft_p95.1 - 1000.0).abs() < 1e-9);
        assert_eq!(i.e2e_p95, i.ttft_p95, "one-token outputs: E2E = TTFT");
        assert!((i.goodput.0 - 4.902).abs() < 1e-3 && (i.goodput.1 - 9.434).abs() < 1e-3);
        assert!(intervals(&[], &slo, 0.0).goodput.0.is_nan());
    }

    /// Issue #21: a serving run killed mid-point (two points done, part of the third's requests
    /// written, the last line torn) and resumed leaves the same raw log, line for line, as a run
    /// that was never interrupted — on a backend whose step times are known, so every time in
    /// it is exact.
    #[test]
    fn a_resumed_serve_run_equals_an_uninterrupted_one() {
        let plan = plan();
        let points = plan.points();
        assert_eq!(points.len(), 4);
        let whole = tmp("whole");
        serve_into(&whole, &plan, &points, &[]);
        let cut = tmp("cut");
        serve_into(&cut, &plan, &points[..2], &[]);
        // The third point's first requests, then a torn line, as a kill -9 leaves them.
        let third: Vec<String> = read_raw(&whole)
            .unwrap()
            .into_iter()
            .filter(|l| matches!(l, RawLine::Request { .. }) && l.point() == &points[2])
            .take(2)
            .map(|l| serde_json::to_string(&l).unwrap())
            .collect();
        assert!(!third.is_empty());
        let mut raw = std::fs::read_to_string(cut.join("raw.jsonl")).unwrap();
        for l in &third {
            raw.push_str(l);
            raw.push('\n');
        }
        raw.push_str(&third[0][..third[0].len() / 2]);
        std::fs::write(cut.join("raw.jsonl"), raw).unwrap();
        let (earlier, done) = finished(read_raw(&cut).unwrap(), false);
        assert_eq!(done, points[..2]);
        // `--rerun-contended`: the first point marked as timed while others used 0.9 cores
        // no longer counts as finished (its requests go with it); the second still does.
        let marked = || {
            let mut lines = read_raw(&cut).unwrap();
            for l in &mut lines {
                if let RawLine::Point { point, row, .. } = l {
                    if *point == points[0] {
                        row.other_cores = Some(0.9);
                    }
                }
            }
            lines
        };
        let (kept, again) = finished(marked(), true);
        assert_eq!(again, points[1..2]);
        assert!(kept.iter().all(|l| l.point() == &points[1]));
        assert_eq!(finished(marked(), false).1, points[..2]);
        let todo: Vec<PointKey> = points
            .iter()
            .filter(|p| !done.contains(p))
            .cloned()
            .collect();
        serve_into(&cut, &plan, &todo, &earlier);
        let (a, b) = (deterministic(&whole), deterministic(&cut));
        // 4 points × (6 requests + the point's line).
        assert_eq!((a.len(), b.len()), (28, 28));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x, y, "line {i} differs");
        }
        std::fs::remove_dir_all(&whole).ok();
        std::fs::remove_dir_all(&cut).ok();
    }
}
