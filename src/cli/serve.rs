//! `kvbench serve`: a load test under a KV budget, in process. For every load (request rate or
//! closed-loop clients) × KV scheme (× prefix caching on/off with `--shared-prefix`) it serves
//! the same seeded requests with continuous batching over a paged block pool
//! ([`crate::serve`]), and writes the run folder as `sweep` does: `raw.jsonl` (each request as it
//! finishes, then the point's trace and summary), `results.csv`, `summary.md`, charts and
//! `meta.json`; `--resume` keeps finished points.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::parser::ValueSource;
use indicatif::{ProgressBar, ProgressStyle};

use crate::kv::{KvScheme, VALID_SCHEMES};
use crate::measure::contention::{Contention, CpuSample};
use crate::model::{self, hub, ModelLocation, WeightDtype};
use crate::quality::{wikitext, xsum};
use crate::report::chart::{LineChart, Series};
use crate::report::meta::{self, Machine};
use crate::report::run_dir::FolderLock;
use crate::serve::backend::ModelBackend;
use crate::serve::engine::{serve, RequestRecord, SchedConfig, ServeOutcome, StepSample};
use crate::serve::metrics::{summarize, ServeStats, Slo};
use crate::serve::pool::BlockSizer;
use crate::serve::workload::{self, Arrival, LenDist};

use super::checks;

/// Arguments of `kvbench serve` (also the `settings` kept in meta.json for `--resume`).
#[derive(Debug, Clone, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServeArgs {
    /// Read settings from a suite file (e.g. suites/serve.toml); flags given here override it.
    #[arg(long)]
    #[serde(skip)]
    pub suite: Option<PathBuf>,
    /// Continue an interrupted run in this folder with its settings (meta.json); finished
    /// points are kept, the rest run.
    #[arg(long, value_name = "RUN_DIR")]
    #[serde(skip)]
    pub resume: Option<PathBuf>,
    /// Model: `default` (SmolLM2-135M-Instruct), a .gguf file, a safetensors folder, an alias
    /// or a Hugging Face repo id (as `sweep --model`).
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,
    /// KV-cache schemes, comma-separated.
    #[arg(long, default_value = "fp16,int8,int4,window:size=128,sinks=4",
          help = format!("KV-cache schemes, comma-separated: {VALID_SCHEMES}"))]
    pub schemes: String,
    /// KV budget for the block pool, bytes (e.g. 24MiB): each scheme gets ⌊budget / its block
    /// bytes⌋ blocks.
    #[arg(long, default_value = "24MiB")]
    pub kv_budget: String,
    /// Tokens per KV block (vLLM's default 16).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Open-loop request rates, requests/s, comma-separated (`inf`: all at once).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub rate: Vec<String>,
    /// Arrival process for `--rate`: poisson (exponential gaps) or constant.
    #[arg(long, default_value = "poisson")]
    pub arrival: String,
    /// Closed loop instead of `--rate`: this many clients, comma-separated for several loads.
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Requests per point (the same seeded requests for every scheme).
    #[arg(long, default_value_t = 48)]
    pub num_requests: usize,
    /// Prompt length after the shared prefix: 256 (fixed), 128..384 (uniform) or
    /// xsum:64..512 (the shipped XSum articles' token lengths, clamped).
    #[arg(long, default_value = "128..384")]
    pub input_len: String,
    /// Tokens generated per request (end-of-sequence ignored): fixed, uniform or xsum:LO..HI
    /// (the XSum reference summaries' lengths).
    #[arg(long, default_value = "32..64")]
    pub output_len: String,
    /// Tokens of a system prompt common to every request (0: none). Each scheme then runs with
    /// prefix caching on and off, so the memory and TTFT it saves are measured.
    #[arg(long, default_value_t = 0)]
    pub shared_prefix: usize,
    /// Most sequences running at once (vLLM's max_num_seqs).
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Goodput objectives, ms: ttft=…,tpot=…,e2e=… (any subset).
    #[arg(long, default_value = "ttft=2000,tpot=250")]
    pub slo: String,
    /// Weights during decode steps: q8_0 (fast), f32 or native.
    #[arg(long, default_value = "q8_0")]
    pub weights: WeightDtype,
    /// Weights during prefill: f32 runs candle's gemm, faster on long prompts.
    #[arg(long, default_value = "f32")]
    pub prefill_weights: WeightDtype,
    /// Seed for arrivals, lengths and prompt offsets.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: all logical CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Run folder (default: reports/serve-<time>).
    #[arg(long)]
    #[serde(skip)]
    pub out: Option<PathBuf>,
    /// Move a non-empty --out aside first instead of refusing it.
    #[arg(long)]
    #[serde(skip)]
    pub force: bool,
}

/// A suite file for `serve`: the flags' own names; command-line flags win.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServeSuite {
    description: Option<String>,
    model: Option<String>,
    schemes: Option<StrOrList>,
    kv_budget: Option<String>,
    block_size: Option<usize>,
    rate: Option<Vec<toml::Value>>,
    arrival: Option<String>,
    concurrency: Option<Vec<usize>>,
    num_requests: Option<usize>,
    input_len: Option<toml::Value>,
    output_len: Option<toml::Value>,
    shared_prefix: Option<usize>,
    max_num_seqs: Option<usize>,
    slo: Option<String>,
    weights: Option<String>,
    prefill_weights: Option<String>,
    seed: Option<u64>,
    threads: Option<usize>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum StrOrList {
    Str(String),
    List(Vec<String>),
}

impl ServeSuite {
    fn apply(self, a: &mut ServeArgs, m: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
        let cli = |id: &str| {
            m.is_some_and(|m| {
                m.try_get_raw(id).is_ok() && m.value_source(id) == Some(ValueSource::CommandLine)
            })
        };
        let _ = self.description;
        macro_rules! set {
            ($field:ident, $id:literal, $conv:expr) => {
                if let Some(v) = self.$field {
                    if !cli($id) {
                        a.$field = $conv(v)?;
                    }
                }
            };
        }
        fn id<T>(x: T) -> anyhow::Result<T> {
            Ok(x)
        }
        set!(model, "model", id);
        set!(schemes, "schemes", |v: StrOrList| anyhow::Ok(match v {
            StrOrList::Str(s) => s,
            StrOrList::List(l) => l.join(","),
        }));
        set!(kv_budget, "kv_budget", id);
        set!(block_size, "block_size", id);
        set!(rate, "rate", |v: Vec<toml::Value>| v
            .iter()
            .map(|x| value_str("rate", x))
            .collect::<anyhow::Result<Vec<_>>>());
        set!(arrival, "arrival", id);
        set!(concurrency, "concurrency", id);
        set!(num_requests, "num_requests", id);
        set!(input_len, "input_len", |v: toml::Value| value_str(
            "input-len",
            &v
        ));
        set!(output_len, "output_len", |v: toml::Value| value_str(
            "output-len",
            &v
        ));
        set!(shared_prefix, "shared_prefix", id);
        set!(max_num_seqs, "max_num_seqs", id);
        set!(slo, "slo", id);
        set!(weights, "weights", |v: String| v
            .parse::<WeightDtype>()
            .map_err(anyhow::Error::from));
        set!(prefill_weights, "prefill_weights", |v: String| v
            .parse::<WeightDtype>()
            .map_err(anyhow::Error::from));
        set!(seed, "seed", id);
        if let Some(t) = self.threads {
            if !cli("threads") {
                a.threads = Some(t);
            }
        }
        Ok(())
    }
}

/// The validated plan of a run.
struct Plan {
    schemes: Vec<KvScheme>,
    budget: u64,
    loads: Vec<Arrival>,
    input: LenDist,
    output: LenDist,
    slo: Slo,
    arms: Vec<bool>,
}

fn usage(name: &str, reason: String) -> crate::Error {
    crate::Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

/// Most requests per point: the prompts are built before the first arrival, and 100,000
/// requests at 2 req/s already take 14 hours.
pub const MAX_NUM_REQUESTS: usize = 100_000;

/// Longest expected arrival span of an open-loop point, seconds (one day): `--num-requests /
/// --rate` past it is a typo (`--rate 1e-12` would wait 10^12 s for its first request).
pub const MAX_ARRIVAL_SPAN_S: f64 = 86_400.0;

fn validate(a: &ServeArgs) -> anyhow::Result<Plan> {
    let mut schemes = crate::kv::parse_scheme_list(&a.schemes)?;
    if schemes.is_empty() {
        anyhow::bail!(usage(
            "--schemes",
            format!(
                "`{}` names no scheme; give one or more, e.g. fp16,int8,int4",
                a.schemes
            )
        ));
    }
    checks::dedup_with_note("--schemes", &mut schemes);
    let budget = crate::plan::parse_bytes(&a.kv_budget).map_err(|_| {
        usage(
            "--kv-budget",
            format!("`{}` is not a size like 24MiB or 64MB", a.kv_budget),
        )
    })?;
    // On the CPU the cache lives in RAM: a budget past the machine's memory cannot be held,
    // and its block table alone would exhaust memory before the first request.
    if let Some(mem) = crate::util::memory::total_bytes() {
        if budget > mem {
            anyhow::bail!(usage(
                "--kv-budget",
                format!(
                    "{} ({budget} bytes) is more than this machine's {mem} bytes of memory, where \
                     the KV cache is held; give at most {}MiB",
                    a.kv_budget,
                    mem >> 20
                )
            ));
        }
    }
    if a.block_size == 0 {
        anyhow::bail!(usage("--block-size", "must be at least 1".into()));
    }
    if a.block_size > crate::plan::MAX_BLOCK_TOKENS {
        anyhow::bail!(usage(
            "--block-size",
            format!(
                "{} tokens per block is past any context; give at most {} (vLLM uses 16)",
                a.block_size,
                crate::plan::MAX_BLOCK_TOKENS
            )
        ));
    }
    if a.num_requests == 0 {
        anyhow::bail!(usage("--num-requests", "must be at least 1".into()));
    }
    if a.num_requests > MAX_NUM_REQUESTS {
        anyhow::bail!(usage(
            "--num-requests",
            format!(
                "{} requests per point is more than {MAX_NUM_REQUESTS} (at 2 req/s those take \
                 14 hours); give at most {MAX_NUM_REQUESTS}",
                a.num_requests
            )
        ));
    }
    if a.shared_prefix > workload::MAX_LEN_TOKENS {
        anyhow::bail!(usage(
            "--shared-prefix",
            format!(
                "{} tokens is past any model's context; give at most {}",
                a.shared_prefix,
                workload::MAX_LEN_TOKENS
            )
        ));
    }
    if a.max_num_seqs == 0 {
        anyhow::bail!(usage("--max-num-seqs", "must be at least 1".into()));
    }
    let mut loads: Vec<Arrival> = if !a.concurrency.is_empty() {
        if a.concurrency.contains(&0) {
            anyhow::bail!(usage("--concurrency", "clients must be at least 1".into()));
        }
        a.concurrency
            .iter()
            .map(|&clients| Arrival::Closed { clients })
            .collect()
    } else {
        let rates = a
            .rate
            .iter()
            .map(|r| workload::parse_rate(r))
            .collect::<Result<Vec<_>, _>>()?;
        match a.arrival.as_str() {
            "poisson" => rates
                .into_iter()
                .map(|rate| Arrival::Poisson { rate })
                .collect(),
            "constant" => rates
                .into_iter()
                .map(|rate| Arrival::Constant { rate })
                .collect(),
            other => anyhow::bail!(usage(
                "--arrival",
                format!("`{other}` is not poisson or constant")
            )),
        }
    };
    if loads.is_empty() {
        anyhow::bail!(usage(
            "--rate",
            "give at least one rate or --concurrency".into()
        ));
    }
    for l in &loads {
        if let Arrival::Poisson { rate } | Arrival::Constant { rate } = *l {
            let span = a.num_requests as f64 / rate;
            if span > MAX_ARRIVAL_SPAN_S {
                anyhow::bail!(usage(
                    "--rate",
                    format!(
                        "{rate} req/s spreads {} requests over {span:.3e} s, more than a day; \
                         give at least {:.3e} req/s (or fewer --num-requests)",
                        a.num_requests,
                        a.num_requests as f64 / MAX_ARRIVAL_SPAN_S
                    )
                ));
            }
        }
    }
    checks::dedup_with_note(
        if a.concurrency.is_empty() {
            "--rate"
        } else {
            "--concurrency"
        },
        &mut loads,
    );
    let len = |name: &str, s: &str| {
        s.parse::<LenDist>().map_err(|e| match e {
            crate::Error::InvalidArgument { reason, .. } => usage(name, reason),
            e => e,
        })
    };
    let arms = if a.shared_prefix > 0 {
        vec![false, true]
    } else {
        vec![false]
    };
    Ok(Plan {
        schemes,
        budget,
        loads,
        input: len("--input-len", &a.input_len)?,
        output: len("--output-len", &a.output_len)?,
        slo: a.slo.parse()?,
        arms,
    })
}

/// One results row (results.csv): a point's settings, what `plan` predicts and what was
/// measured. Times ms, rates per second, memory bytes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServeRow {
    /// KV scheme.
    pub scheme: String,
    /// Arrival process and load, e.g. `poisson 2 req/s`.
    pub arrival: String,
    /// Request rate (req/s; `inf`: every request at once) or closed-loop clients.
    #[serde(with = "crate::serve::workload::load_serde")]
    pub load: f64,
    /// Whether the shared prefix was cached (stored once, prefilled once).
    pub prefix_caching: bool,
    /// `ok`, or why the point failed.
    pub status: String,
    /// KV budget, bytes.
    pub kv_budget_bytes: u64,
    /// Bytes per block for this scheme.
    pub block_bytes: u64,
    /// Blocks in the pool.
    pub total_blocks: usize,
    /// `kvbench plan`'s max concurrency at this budget for a sequence of the mean length
    /// (prefix + mean prompt + mean output tokens).
    pub predicted_max_concurrency: u64,
    /// Requests sent.
    pub requests: usize,
    /// Requests completed.
    pub completed: usize,
    /// Largest decode batch measured.
    pub running_max: usize,
    /// Decode batch averaged over time.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub running_mean: f64,
    /// Preemptions (recompute).
    pub preemptions: usize,
    /// Completed requests per second.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub request_throughput: f64,
    /// Generated tokens per second.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub output_tokens_per_s: f64,
    /// Requests per second meeting the SLO.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub goodput: f64,
    /// Share of requests meeting the SLO.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub slo_attainment: f64,
    /// TTFT percentiles, ms.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub ttft_ms_p50: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub ttft_ms_p95: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub ttft_ms_p99: f64,
    /// TPOT percentiles (per request), ms.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub tpot_ms_p50: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub tpot_ms_p95: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub tpot_ms_p99: f64,
    /// ITL percentiles (all gaps), ms.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub itl_ms_p50: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub itl_ms_p95: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub itl_ms_p99: f64,
    /// End-to-end latency percentiles, ms.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub e2e_ms_p50: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub e2e_ms_p95: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub e2e_ms_p99: f64,
    /// Mean and max share of blocks in use.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub block_util_mean: f64,
    #[allow(missing_docs)]
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub block_util_max: f64,
    /// Mean internal fragmentation (share of held block bytes not holding K/V).
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub fragmentation_mean: f64,
    /// Bytes the shared prefix saved, mean and max over time.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub prefix_saved_bytes_mean: f64,
    #[allow(missing_docs)]
    pub prefix_saved_bytes_max: u64,
    /// The one prefill of the shared prefix (prefix caching), ms.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub prefix_prefill_ms: f64,
    /// Seconds the point ran.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub duration_s: f64,
    /// Cores other processes used meanwhile (see `measure::contention`).
    pub other_cores: Option<f64>,
}

impl ServeRow {
    fn new(p: &PointKey, budget: u64, predicted: u64, o: &ServeOutcome, s: &ServeStats) -> Self {
        ServeRow {
            scheme: p.scheme.clone(),
            arrival: p.arrival.label(),
            load: p.arrival.load(),
            prefix_caching: p.prefix_caching,
            status: "ok".into(),
            kv_budget_bytes: budget,
            block_bytes: o.block_bytes,
            total_blocks: o.total_blocks,
            predicted_max_concurrency: predicted,
            requests: s.requests,
            completed: s.completed,
            running_max: s.running_max,
            running_mean: s.running_mean,
            preemptions: s.preemptions,
            request_throughput: s.request_throughput,
            output_tokens_per_s: s.output_tokens_per_s,
            goodput: s.goodput,
            slo_attainment: s.slo_attainment,
            ttft_ms_p50: s.ttft_ms.p50,
            ttft_ms_p95: s.ttft_ms.p95,
            ttft_ms_p99: s.ttft_ms.p99,
            tpot_ms_p50: s.tpot_ms.p50,
            tpot_ms_p95: s.tpot_ms.p95,
            tpot_ms_p99: s.tpot_ms.p99,
            itl_ms_p50: s.itl_ms.p50,
            itl_ms_p95: s.itl_ms.p95,
            itl_ms_p99: s.itl_ms.p99,
            e2e_ms_p50: s.e2e_ms.p50,
            e2e_ms_p95: s.e2e_ms.p95,
            e2e_ms_p99: s.e2e_ms.p99,
            block_util_mean: s.block_util_mean,
            block_util_max: s.block_util_max,
            fragmentation_mean: s.fragmentation_mean,
            prefix_saved_bytes_mean: s.prefix_saved_bytes_mean,
            prefix_saved_bytes_max: s.prefix_saved_bytes_max,
            prefix_prefill_ms: o.prefix_prefill_s * 1e3,
            duration_s: s.duration_s,
            other_cores: None,
        }
    }
}

/// What identifies a point.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct PointKey {
    scheme: String,
    arrival: Arrival,
    prefix_caching: bool,
}

/// A line of raw.jsonl.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum RawLine {
    /// A request, written as it finishes.
    Request {
        #[serde(flatten)]
        point: PointKey,
        #[serde(flatten)]
        record: RequestRecord,
    },
    /// A finished point: its row and the scheduler's trace.
    Point {
        #[serde(flatten)]
        point: PointKey,
        row: ServeRow,
        steps: Vec<StepSample>,
        contention: Option<Contention>,
    },
}

/// Raw file name (one JSON object a line).
const RAW: &str = crate::report::RAW_FILE;

/// `meta.json` format `serve` writes: 0 for folders written before it was recorded (no
/// `format` field), 1 with `format`, `status` and the model's sha256 under `model`.
pub const SERVE_META_FORMAT: u64 = 1;

/// `--resume DIR`: the settings recorded in `DIR/meta.json` (every flag but `--threads`, which
/// must then equal the recorded count, is refused beside it, as `sweep --resume` does) and the
/// earlier meta. Errors: [`crate::Error::InvalidArgument`] (`--resume`) naming the file: missing,
/// unreadable, cut short, written by a newer kvbench, or without usable settings; or naming
/// the flags given with `--resume`.
fn resume_settings(
    dir: &Path,
    a: &ServeArgs,
    matches: Option<&clap::ArgMatches>,
) -> anyhow::Result<(ServeArgs, serde_json::Value)> {
    let extra: Vec<String> = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"))
        .get_arguments()
        .map(|x| x.get_id().as_str().to_string())
        .filter(|id| !["resume", "threads"].contains(&id.as_str()))
        .filter(|id| super::suite::given_on_cli(matches, id))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect();
    if !extra.is_empty() {
        anyhow::bail!(usage(
            "--resume",
            format!(
                "a resumed run keeps the settings it started with (in {}/meta.json); drop {}",
                dir.display(),
                extra.join(", ")
            )
        ));
    }
    let path = dir.join(crate::report::META_FILE);
    let text = crate::util::read_regular(&path).map_err(|e| {
        usage(
            "--resume",
            format!(
                "{} cannot be read ({e}): not a serve run folder",
                path.display()
            ),
        )
    })?;
    let m: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        usage(
            "--resume",
            format!(
                "{} is not valid JSON ({e}); it was cut short or edited: start a new run",
                path.display()
            ),
        )
    })?;
    if m["command"] != "serve" {
        anyhow::bail!(usage(
            "--resume",
            format!(
                "{} is not a `kvbench serve` run (resume a sweep with `kvbench sweep --resume`)",
                path.display()
            )
        ));
    }
    let format = m["format"].as_u64().unwrap_or(0);
    if format > SERVE_META_FORMAT {
        anyhow::bail!(usage(
            "--resume",
            format!(
                "{} has format {format}, written by kvbench {}; this kvbench {} reads formats 0 \
                 to {SERVE_META_FORMAT}: resume it with that kvbench or newer",
                path.display(),
                m["kvbench"].as_str().unwrap_or("(unknown)"),
                meta::version()
            )
        ));
    }
    let mut s: ServeArgs = serde_json::from_value(m["settings"].clone()).map_err(|e| {
        usage(
            "--resume",
            format!("{}: its settings cannot be read ({e})", path.display()),
        )
    })?;
    s.resume = Some(dir.to_path_buf());
    s.out = Some(dir.to_path_buf());
    if a.threads.is_some() {
        s.threads = a.threads;
    }
    Ok((s, m))
}

/// Reads raw.jsonl's lines. A last line that does not parse was cut short (kill -9, a full
/// disk) and is dropped with a note; any other line that does not parse is an error naming the
/// file and the line. Errors: [`crate::Error::Io`] (unreadable), [`crate::Error::InvalidArgument`]
/// (`--resume`) for a damaged line.
fn read_raw(path: &Path) -> anyhow::Result<Vec<RawLine>> {
    let text = match crate::util::read_regular(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(crate::Error::io(path, e).into()),
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, l) in lines.iter().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<RawLine>(l) {
            Ok(r) => out.push(r),
            Err(_) if i + 1 == lines.len() => eprintln!(
                "note: {} ends in a line cut short (an interrupted write); it is dropped and \
                 its point runs again",
                path.display()
            ),
            Err(e) => anyhow::bail!(usage(
                "--resume",
                format!(
                    "{} line {} is damaged ({e}); start a new run",
                    path.display(),
                    i + 1
                )
            )),
        }
    }
    Ok(out)
}

/// A serve suite's value as the flag's text. Errors: [`crate::Error::InvalidArgument`] naming
/// the key for a value that is neither a string nor a number (a table, a boolean…).
fn value_str(key: &str, v: &toml::Value) -> anyhow::Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) if f.is_infinite() => "inf".into(),
        toml::Value::Float(f) => f.to_string(),
        other => anyhow::bail!(usage(
            "--suite",
            format!(
                "`{key}` is a {}, not a number or a string (e.g. {key} = \"128..384\")",
                other.type_str()
            )
        )),
    })
}

/// Lays a serve suite's text (read from `path`) over `a`, except for the flags `matches` says
/// were given on the command line. Errors: [`crate::Error::InvalidArgument`] (`--suite`) naming
/// the file when the text is not TOML, has a key `serve` does not know or a value of the wrong
/// form; a weights value that is not a weight dtype.
fn apply_suite(
    text: &str,
    path: &Path,
    a: &mut ServeArgs,
    matches: Option<&clap::ArgMatches>,
) -> anyhow::Result<()> {
    let suite: ServeSuite =
        toml::from_str(text).map_err(|e| usage("--suite", format!("{}: {e}", path.display())))?;
    suite.apply(a, matches)
}

/// `kvbench serve`'s settings with every flag at its default, as `kvbench serve` given no flag
/// parses them.
pub fn default_args() -> ServeArgs {
    let cmd = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
    let m = cmd
        .try_get_matches_from(["serve"])
        .expect("every serve flag has a default or is optional");
    <ServeArgs as clap::FromArgMatches>::from_arg_matches(&m)
        .expect("the defaults parse into ServeArgs")
}

/// A serve suite's text (as `--suite` reads it; `path` only names it in errors) laid over the
/// defaults ([`default_args`]). Errors: those of `--suite` — [`crate::Error::InvalidArgument`]
/// naming the file for text that is not TOML, a key `serve` does not know, or a value of the
/// wrong form.
pub fn parse_suite(text: &str, path: &Path) -> anyhow::Result<ServeArgs> {
    let mut a = default_args();
    apply_suite(text, path, &mut a, None)?;
    Ok(a)
}

/// The checks `kvbench serve` makes of its settings before it loads the model or writes
/// anything: schemes, `--kv-budget` (a size, at most this machine's memory), block size,
/// request count, loads (`--rate`/`--arrival`/`--concurrency`), lengths and SLOs. Errors:
/// [`crate::Error::InvalidArgument`] naming the flag.
pub fn check_settings(a: &ServeArgs) -> anyhow::Result<()> {
    validate(a).map(|_| ())
}

/// What `kvbench serve --resume DIR` (with no other flag) reads of `DIR/meta.json`: the
/// recorded settings (with `resume` and `out` set to `dir`) and the whole meta. Errors: those
/// of `--resume` — [`crate::Error::InvalidArgument`] naming the file when it is missing,
/// unreadable, not JSON, not a serve run, written in a newer format than
/// [`SERVE_META_FORMAT`], or without usable settings.
pub fn read_resume_meta(dir: &Path) -> anyhow::Result<(ServeArgs, serde_json::Value)> {
    resume_settings(dir, &default_args(), None)
}

/// A serve run folder's `raw.jsonl`, read back as `--resume` and the renderer read it.
#[derive(Debug, Clone)]
pub struct RawLog {
    /// Request lines (of finished and unfinished points).
    pub requests: usize,
    /// The rows of the finished points, in file order.
    pub rows: Vec<ServeRow>,
}

/// Reads the serve `raw.jsonl` at `path` ([`RawLog`]); a missing file is an empty log, a last
/// line cut short is dropped with a note. Errors: [`crate::Error::Io`] (unreadable),
/// [`crate::Error::InvalidArgument`] (`--resume`) naming the file and line of any other line
/// that does not parse.
pub fn read_raw_log(path: &Path) -> anyhow::Result<RawLog> {
    let mut log = RawLog {
        requests: 0,
        rows: Vec::new(),
    };
    for l in read_raw(path)? {
        match l {
            RawLine::Request { .. } => log.requests += 1,
            RawLine::Point { row, .. } => log.rows.push(row),
        }
    }
    Ok(log)
}

/// Runs `kvbench serve`.
pub fn run(mut a: ServeArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    let earlier: Option<serde_json::Value> = match a.resume.clone() {
        Some(dir) => {
            let (s, m) = resume_settings(&dir, &a, matches)?;
            a = s;
            Some(m)
        }
        None => None,
    };
    if earlier.is_none() {
        if let Some(path) = a.suite.clone() {
            let text = crate::measure::settings::read_suite_file(&path)?;
            apply_suite(&text, &path, &mut a, matches)?;
        }
    }
    let plan = validate(&a)?;
    checks::check_threads(a.threads)?;
    if let Some(n) = a.threads {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .ok();
    }
    let dir = match &a.out {
        Some(d) => d.clone(),
        None => {
            PathBuf::from("reports").join(format!("serve-{}", crate::util::time::now_compact()))
        }
    };
    if earlier.is_none() {
        checks::prepare_out(&dir, a.force)?;
    }
    checks::create_out(&dir)?;
    // One writer per folder: a second run given the same --out is refused, not interleaved.
    let _lock = match &earlier {
        Some(_) => FolderLock::acquire(&dir, "--resume")?,
        None => FolderLock::acquire_empty(&dir, "--out")?,
    };

    let location = hub::resolve(&a.model)?;
    let files = match &location {
        ModelLocation::Gguf(p) => vec![p.clone()],
        ModelLocation::Safetensors { weights, .. } => weights.clone(),
    };
    let sha256 = files
        .iter()
        .map(|f| model::fetch::sha256_file(f))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(m) = &earlier {
        // Format 0 kept the sha256 at the top level; format 1 under `model` as `sweep` does.
        let mut m = m.clone();
        if m["model"]["sha256"].is_null() && !m["model_sha256"].is_null() {
            m["model"]["sha256"] = m["model_sha256"].clone();
        }
        checks::check_resume(&dir, &m, &checks::resume_identity(sha256.clone()))?;
    }
    let load = |dtype: WeightDtype| {
        model::load_location(&a.model, &location, dtype)
            .with_context(|| format!("loading model `{}` with {dtype} weights", a.model))
    };
    let decode = load(a.weights)?;
    let prefill = if a.prefill_weights == a.weights {
        None
    } else {
        Some(load(a.prefill_weights)?)
    };
    let prefill_model = prefill.as_ref().map_or(&decode.model, |m| &m.model);
    let cfg = decode.model.config.clone();
    let geom = cfg.cache_geometry();
    // Lengths are bounded by workload::MAX_LEN_TOKENS, so the sum cannot overflow.
    let longest = a.shared_prefix + plan.input.max() + plan.output.max();
    if longest > cfg.max_ctx {
        anyhow::bail!(usage(
            if plan.output.max() > cfg.max_ctx {
                "--output-len"
            } else {
                "--input-len"
            },
            format!(
                "prefix {} + prompt {} + output {} reach {longest} tokens, past the model's \
                 context of {}; give shorter --input-len/--output-len/--shared-prefix",
                a.shared_prefix,
                plan.input.max(),
                plan.output.max(),
                cfg.max_ctx
            )
        ));
    }
    for s in &plan.schemes {
        s.validate(geom.head_dim)?;
        let sizer = BlockSizer {
            scheme: *s,
            geom,
            block_tokens: a.block_size,
        };
        // A pool without room for one whole request, at its largest (a per-channel format's
        // residual rows peak before each group is quantized), would reject every request.
        let one = sizer.peak_blocks(longest);
        if plan.budget / sizer.block_bytes() < one as u64 {
            anyhow::bail!(usage(
                "--kv-budget",
                format!(
                    "{} bytes hold {} blocks of {} bytes in {s}, but the longest request needs {one}; \
                     give at least {} bytes or shorter requests",
                    plan.budget,
                    plan.budget / sizer.block_bytes(),
                    sizer.block_bytes(),
                    one as u64 * sizer.block_bytes()
                )
            ));
        }
    }
    let text = decode.tokenizer.encode(wikitext::wikitext2_test_text())?;
    let needs_trace =
        matches!(plan.input, LenDist::Xsum(..)) || matches!(plan.output, LenDist::Xsum(..));
    let (trace_in, trace_out) = if needs_trace {
        let mut ti = Vec::new();
        let mut to = Vec::new();
        for s in xsum::samples(100)? {
            ti.push(decode.tokenizer.encode(&s.document)?.len());
            to.push(decode.tokenizer.encode(&s.summary)?.len());
        }
        (ti, to)
    } else {
        (Vec::new(), Vec::new())
    };
    let prefix: Vec<u32> = text[..a.shared_prefix.min(text.len())].to_vec();
    let requests = workload::requests(
        a.num_requests,
        &plan.input,
        &plan.output,
        &text,
        a.shared_prefix,
        (&trace_in, &trace_out),
        a.seed,
    )?;
    let mean_ctx = a.shared_prefix
        + (plan.input.mean(&trace_in) + plan.output.mean(&trace_out)).round() as usize;
    let predicted = |s: &KvScheme| -> anyhow::Result<u64> {
        let g = crate::model::geometry::ModelGeometry {
            name: a.model.clone(),
            layers: geom.layers,
            q_heads: geom.q_heads,
            kv_heads: geom.kv_heads,
            head_dim: geom.head_dim,
            max_ctx: cfg.max_ctx,
            params: 0,
            weight_dtype: "gguf".into(),
            source: "loaded model".into(),
        };
        let input = crate::plan::PlanInput {
            model: g,
            memory_bytes: plan.budget,
            reserve: 0.0,
            weight_bytes: 0,
            block: a.block_size,
            tensor_parallel: 1,
        };
        Ok(crate::plan::plan(&input, &[*s], &[mean_ctx])?[0].max_concurrency)
    };

    // Resume: finished points stay; requests of an unfinished point are dropped.
    let raw_path = dir.join(RAW);
    let mut done: Vec<RawLine> = Vec::new();
    if earlier.is_some() && raw_path.exists() {
        let lines = read_raw(&raw_path)?;
        let finished: Vec<PointKey> = lines
            .iter()
            .filter_map(|l| match l {
                RawLine::Point { point, .. } => Some(point.clone()),
                _ => None,
            })
            .collect();
        done = lines
            .into_iter()
            .filter(|l| match l {
                RawLine::Request { point, .. } | RawLine::Point { point, .. } => {
                    finished.contains(point)
                }
            })
            .collect();
        // Rewritten through a temporary file: an interruption now loses nothing.
        let tmp = raw_path.with_extension("jsonl.tmp");
        let mut text = String::new();
        for l in &done {
            text.push_str(&serde_json::to_string(l)?);
            text.push('\n');
        }
        std::fs::write(&tmp, text).map_err(|e| crate::Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &raw_path).map_err(|e| crate::Error::io(&raw_path, e))?;
    }
    let machine = Machine::probe();
    let started_at = crate::util::time::now_rfc3339();
    let mut resumed_at: Vec<serde_json::Value> = earlier
        .as_ref()
        .and_then(|m| m["resumed_at"].as_array().cloned())
        .unwrap_or_default();
    if earlier.is_some() {
        resumed_at.push(started_at.clone().into());
    }
    let meta_path = dir.join(crate::report::META_FILE);
    let mut meta_json = serde_json::json!({
            "format": SERVE_META_FORMAT,
            "kvbench": meta::version(),
            "command": "serve",
            "status": "running",
            "started_at": earlier.as_ref().map_or(serde_json::Value::from(started_at.clone()), |m| m["started_at"].clone()),
            "resumed_at": resumed_at,
            "settings": a,
            "model": { "spec": a.model, "files": files, "config": cfg, "sha256": sha256 },
            "model_sha256": sha256,
            "machine": machine,
            "dataset": wikitext::DATASET_NAME,
            "kv_budget_bytes": plan.budget,
            "mean_context_tokens": mean_ctx,
            "scheduler": "continuous batching; whole-prompt prefill one request at a time, then one decode step for the running batch; FCFS admission when the prompt's blocks are free; recompute preemption, newest first",
            "prefix_sharing": "prefix caching shares whole blocks of the prefix by reference in the pool; the CPU cache copies the prefix rows into each sequence (no model forward); eviction schemes never share (their blocks are not immutable)",
    });
    meta::write_json(&meta_path, &meta_json)?;

    let mut points: Vec<PointKey> = Vec::new();
    for &arrival in &plan.loads {
        for s in &plan.schemes {
            for &arm in &plan.arms {
                // Eviction schemes rewrite old blocks: no prefix caching (as vLLM disables it).
                if arm && s.evicts() {
                    continue;
                }
                points.push(PointKey {
                    scheme: s.to_string(),
                    arrival,
                    prefix_caching: arm,
                });
            }
        }
    }
    let finished: Vec<PointKey> = done
        .iter()
        .filter_map(|l| match l {
            RawLine::Point { point, .. } => Some(point.clone()),
            _ => None,
        })
        .collect();
    let todo: Vec<&PointKey> = points.iter().filter(|p| !finished.contains(p)).collect();
    if !finished.is_empty() {
        eprintln!(
            "resuming {}: {} points done, {} to run",
            dir.display(),
            finished.len(),
            todo.len()
        );
    }
    let bar = ProgressBar::new((todo.len() * a.num_requests) as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("static template"),
    );
    let mut raw = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&raw_path)
        .with_context(|| format!("opening {}", raw_path.display()))?;
    let write_line = |f: &mut std::fs::File, l: &RawLine| -> crate::Result<()> {
        let s = serde_json::to_string(l).map_err(|e| crate::Error::io(&raw_path, e.into()))?;
        writeln!(f, "{s}").map_err(|e| crate::Error::io(&raw_path, e))?;
        f.flush().map_err(|e| crate::Error::io(&raw_path, e))
    };
    for p in todo {
        let scheme: KvScheme = p.scheme.parse()?;
        bar.set_message(format!("{} · {}", p.scheme, p.arrival.label()));
        let sizer = BlockSizer {
            scheme,
            geom,
            block_tokens: a.block_size,
        };
        let sched = SchedConfig {
            sizer,
            kv_budget: plan.budget,
            max_num_seqs: a.max_num_seqs,
            prefix_tokens: a.shared_prefix,
            prefix_caching: p.prefix_caching,
        };
        let predicted = predicted(&scheme)?;
        let mut backend = ModelBackend::new(prefill_model, &decode.model, scheme);
        let before = CpuSample::now();
        let result = serve(
            &mut backend,
            &sched,
            &requests,
            p.arrival,
            &prefix,
            a.seed,
            &mut |r| {
                bar.inc(1);
                write_line(
                    &mut raw,
                    &RawLine::Request {
                        point: p.clone(),
                        record: r.clone(),
                    },
                )
            },
        );
        let contention = before
            .zip(CpuSample::now())
            .and_then(|(x, y)| Contention::between(&x, &y));
        drop(backend);
        let (row, steps) = match result {
            Ok(o) => {
                let s = summarize(&o, &plan.slo);
                let mut row = ServeRow::new(p, plan.budget, predicted, &o, &s);
                row.other_cores = contention.map(|c| c.other_cores);
                (row, o.steps)
            }
            Err(e) => {
                let mut row = ServeRow::new(
                    p,
                    plan.budget,
                    predicted,
                    &ServeOutcome {
                        requests: Vec::new(),
                        steps: Vec::new(),
                        total_blocks: 0,
                        block_bytes: sizer.block_bytes(),
                        prefix_blocks: 0,
                        prefix_prefill_s: 0.0,
                    },
                    &summarize(
                        &ServeOutcome {
                            requests: Vec::new(),
                            steps: Vec::new(),
                            total_blocks: 0,
                            block_bytes: 0,
                            prefix_blocks: 0,
                            prefix_prefill_s: 0.0,
                        },
                        &plan.slo,
                    ),
                );
                row.status = format!("error: {e}");
                (row, Vec::new())
            }
        };
        let line = format!(
            "{:<28} {:<22} prefix-cache {:<5}: {}",
            row.scheme,
            row.arrival,
            row.prefix_caching,
            if row.status == "ok" {
                format!(
                    "max running {} (plan {}), {:.2} req/s, E2E p95 {:.0} ms, TTFT p95 {:.0} ms, {} preemptions",
                    row.running_max,
                    row.predicted_max_concurrency,
                    row.request_throughput,
                    row.e2e_ms_p95,
                    row.ttft_ms_p95,
                    row.preemptions
                )
            } else {
                row.status.clone()
            }
        );
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
        if let Some(c) = contention.filter(Contention::contended) {
            eprintln!(
                "warning: other processes used {:.2} cores on average while this point ran (load \
                 {:.1}); its latencies describe a shared machine — rerun on an idle one",
                c.other_cores, c.load_1m
            );
        }
        write_line(
            &mut raw,
            &RawLine::Point {
                point: p.clone(),
                row,
                steps,
                contention,
            },
        )?;
    }
    bar.finish_and_clear();
    let rows = read_raw(&raw_path)?;
    let points: Vec<&ServeRow> = rows
        .iter()
        .filter_map(|l| match l {
            RawLine::Point { row, .. } => Some(row),
            RawLine::Request { .. } => None,
        })
        .collect();
    let failed: Vec<&&ServeRow> = points.iter().filter(|r| r.status != "ok").collect();
    let all_failed = !points.is_empty() && failed.len() == points.len();
    meta_json["status"] = if all_failed { "failed" } else { "finished" }.into();
    meta_json["finished_at"] = crate::util::time::now_rfc3339().into();
    meta::write_json(&meta_path, &meta_json)?;
    render(&dir, &a, &plan, mean_ctx)?;
    if all_failed {
        let first = failed[0];
        anyhow::bail!(
            "every point failed ({} of {}); the first: {} {}: {}",
            failed.len(),
            points.len(),
            first.scheme,
            first.arrival,
            first.status
        );
    }
    Ok(())
}

/// Writes results.csv, summary.md and the charts from raw.jsonl.
fn render(dir: &Path, a: &ServeArgs, plan: &Plan, mean_ctx: usize) -> anyhow::Result<()> {
    let mut rows: Vec<ServeRow> = Vec::new();
    let mut traces: Vec<(PointKey, Vec<StepSample>)> = Vec::new();
    for l in read_raw(&dir.join(RAW))? {
        if let RawLine::Point {
            point, row, steps, ..
        } = l
        {
            rows.push(row);
            traces.push((point, steps));
        }
    }
    let mut w = csv::Writer::from_path(dir.join(crate::report::CSV_FILE))?;
    for r in &rows {
        w.serialize(r)?;
    }
    w.flush()?;

    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut md = String::new();
    md.push_str(&format!(
        "# kvbench serve — {}\n\nKV budget {:.1} MiB, blocks of {} tokens; {} requests per point, \
         prompts {} tokens{} (WikiText-2 text), outputs {} tokens; SLO {}; max {} running; \
         seed {}. Predicted concurrency: `kvbench plan` at this budget for a sequence of the mean \
         length ({mean_ctx} tokens).\n\n",
        a.model,
        mib(plan.budget),
        a.block_size,
        a.num_requests,
        a.input_len,
        if a.shared_prefix > 0 {
            format!(" after a shared prefix of {}", a.shared_prefix)
        } else {
            String::new()
        },
        a.output_len,
        plan.slo,
        a.max_num_seqs,
        a.seed
    ));
    md.push_str("| scheme | load | prefix cache | blocks | plan max seqs | max running | mean running | preempt | req/s | out tok/s | goodput req/s | TTFT p95 ms | TPOT p95 ms | E2E p95 ms | block util | frag | prefix saved MiB | status |\n");
    md.push_str(
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} | {:.2} | {:.1} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} % | {:.1} % | {:.1} | {} |\n",
            r.scheme,
            r.arrival,
            if r.prefix_caching { "on" } else { "off" },
            r.total_blocks,
            r.predicted_max_concurrency,
            r.running_max,
            r.running_mean,
            r.preemptions,
            r.request_throughput,
            r.output_tokens_per_s,
            r.goodput,
            r.ttft_ms_p95,
            r.tpot_ms_p95,
            r.e2e_ms_p95,
            r.block_util_mean * 100.0,
            r.fragmentation_mean * 100.0,
            mib(r.prefix_saved_bytes_mean as u64),
            r.status
        ));
    }
    md.push_str(
        "\nplan max seqs counts sequences at their full mean length; a running batch mixes \
         sequences early in their lives (fewer blocks), so the measured maximum can exceed it \
         until they grow and preemptions bring it back. Prefix saved: pool accounting of what \
         shared blocks save (the CPU cache copies the prefix rows).\n",
    );
    if a.shared_prefix > 0 {
        md.push_str(&format!(
            "\n## Prefix sharing ({} shared tokens)\n\n| scheme | load | TTFT p50 off ms | TTFT p50 on ms | TTFT saved ms | prefix prefill ms | memory saved MiB (mean / max) |\n|---|---|---:|---:|---:|---:|---:|\n",
            a.shared_prefix
        ));
        for on in rows.iter().filter(|r| r.prefix_caching) {
            if let Some(off) = rows
                .iter()
                .find(|r| !r.prefix_caching && r.scheme == on.scheme && r.arrival == on.arrival)
            {
                md.push_str(&format!(
                    "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} / {:.2} |\n",
                    on.scheme,
                    on.arrival,
                    off.ttft_ms_p50,
                    on.ttft_ms_p50,
                    off.ttft_ms_p50 - on.ttft_ms_p50,
                    on.prefix_prefill_ms,
                    mib(on.prefix_saved_bytes_mean as u64),
                    mib(on.prefix_saved_bytes_max)
                ));
            }
        }
        md.push_str(
            "\nEviction schemes run without prefix caching (their blocks are not immutable). \
             Memory saved is the block pool's accounting; the CPU cache holds a copy of the \
             prefix rows per sequence.\n",
        );
    }
    let contended: Vec<&ServeRow> = rows
        .iter()
        .filter(|r| {
            r.other_cores
                .is_some_and(|c| c > crate::measure::contention::CONTENDED_CORES)
        })
        .collect();
    if !contended.is_empty() {
        md.push_str(&format!(
            "\n**Warning:** {} point(s) ran while other processes used more than {} cores; their \
             latencies describe a shared machine.\n",
            contended.len(),
            crate::measure::contention::CONTENDED_CORES
        ));
    }
    let plots = dir.join(crate::report::PLOTS_DIR);
    std::fs::create_dir_all(&plots)?;
    let label = |r: &ServeRow| {
        if a.shared_prefix > 0 {
            format!(
                "{} (prefix cache {})",
                r.scheme,
                if r.prefix_caching { "on" } else { "off" }
            )
        } else {
            r.scheme.clone()
        }
    };
    let mut names: Vec<String> = Vec::new();
    for r in &rows {
        if !names.contains(&label(r)) {
            names.push(label(r));
        }
    }
    let closed = plan
        .loads
        .iter()
        .any(|l| matches!(l, Arrival::Closed { .. }));
    let x_label = if closed {
        "concurrent clients (closed loop)"
    } else {
        "request rate (requests/s)"
    };
    let caption = format!(
        "{} · KV budget {:.1} MiB · {} requests, prompts {}, outputs {} · kvbench {}",
        a.model,
        mib(plan.budget),
        a.num_requests,
        a.input_len,
        a.output_len,
        env!("CARGO_PKG_VERSION")
    );
    let series = |f: &dyn Fn(&ServeRow) -> f64| -> Vec<Series> {
        names
            .iter()
            .map(|n| {
                let mut pts: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|r| &label(r) == n && r.status == "ok" && r.load.is_finite())
                    .map(|r| (r.load, f(r)))
                    .collect();
                pts.sort_by(|x, y| x.0.total_cmp(&y.0));
                Series::line(n.clone(), pts)
            })
            .collect()
    };
    let charts = [
        (
            "p95_latency_vs_rate",
            "E2E latency p95 vs load",
            "E2E latency p95 (ms)",
            series(&|r| r.e2e_ms_p95),
        ),
        (
            "ttft_p95_vs_rate",
            "TTFT p95 vs load",
            "TTFT p95 (ms)",
            series(&|r| r.ttft_ms_p95),
        ),
        (
            "goodput_vs_rate",
            "Goodput vs load",
            "goodput (requests/s meeting the SLO)",
            series(&|r| r.goodput),
        ),
    ];
    for (stem, title, y, s) in charts {
        LineChart {
            title: title.into(),
            caption: caption.clone(),
            x_label: x_label.into(),
            y_label: y.into(),
            log_x: false,
            series: s,
        }
        .render(&plots, stem)?;
    }
    // Running sequences over time at the highest load.
    let top = plan
        .loads
        .iter()
        .map(Arrival::load)
        .fold(f64::NEG_INFINITY, f64::max);
    let running: Vec<Series> = traces
        .iter()
        .filter(|(p, _)| p.arrival.load() == top)
        .map(|(p, steps)| {
            let name = if a.shared_prefix > 0 {
                format!(
                    "{} (prefix cache {})",
                    p.scheme,
                    if p.prefix_caching { "on" } else { "off" }
                )
            } else {
                p.scheme.clone()
            };
            Series::line(
                name,
                steps.iter().map(|s| (s.t_s, s.running as f64)).collect(),
            )
        })
        .collect();
    LineChart {
        title: format!(
            "Running sequences over time ({})",
            plan.loads
                .iter()
                .find(|l| l.load() == top)
                .map_or(String::new(), Arrival::label)
        ),
        caption,
        x_label: "time since the first arrival (s)".into(),
        y_label: "sequences in the decode batch".into(),
        log_x: false,
        series: running,
    }
    .render(&plots, "running_over_time")?;
    md.push_str("\n![p95 latency vs load](plots/p95_latency_vs_rate.png)\n![goodput vs load](plots/goodput_vs_rate.png)\n![running sequences](plots/running_over_time.png)\n");
    std::fs::write(dir.join(crate::report::SUMMARY_FILE), &md)?;
    print!("{md}");
    println!("wrote {}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults are the flags' documented ones, and the shipped suite lays its values over
    /// them (keys it leaves out keep the defaults) into settings that pass the checks.
    #[test]
    fn defaults_and_the_shipped_suite_parse() {
        let d = default_args();
        assert_eq!(
            (d.schemes.as_str(), d.kv_budget.as_str(), d.rate.clone()),
            (
                "fp16,int8,int4,window:size=128,sinks=4",
                "24MiB",
                vec!["1".into(), "2".into(), "4".into()]
            )
        );
        assert_eq!((d.num_requests, d.block_size, d.threads), (48, 16, None));
        check_settings(&d).unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites/serve.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let a = parse_suite(&text, &path).unwrap();
        assert_eq!(a.shared_prefix, 0);
        check_settings(&a).unwrap();
        let text = format!("{text}\nthreads = 3\nconcurrency = [2]\n");
        let a = parse_suite(&text, &path).unwrap();
        assert_eq!((a.threads, a.concurrency.clone()), (Some(3), vec![2]));
        let e = parse_suite("rate = [true]\n", &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rate") && e.contains("boolean"), "{e}");
        let e = parse_suite("rates = [1]\n", &path).unwrap_err().to_string();
        assert!(e.contains("rates") && e.contains("serve.toml"), "{e}");
    }

    /// `read_resume_meta` reads what a serve run recorded, and refuses a folder without a
    /// serve meta.json, naming the file.
    #[test]
    fn resume_meta_reads_recorded_settings() {
        let dir = std::env::temp_dir().join(format!("kvbench-serve-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = default_args();
        s.num_requests = 7;
        let meta =
            serde_json::json!({ "format": SERVE_META_FORMAT, "command": "serve", "settings": s });
        std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
        let (got, m) = read_resume_meta(&dir).unwrap();
        assert_eq!(
            (got.num_requests, got.out.as_deref()),
            (7, Some(dir.as_path()))
        );
        assert_eq!(m["command"], "serve");
        std::fs::write(dir.join("meta.json"), r#"{"command": ["sweep"]}"#).unwrap();
        let e = read_resume_meta(&dir).unwrap_err().to_string();
        assert!(
            e.contains("not a `kvbench serve` run") && e.contains("meta.json"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
