//! Every setting of `kvbench serve` that changes a number, in one schema: at once its flags,
//! a suite's keys (`suites/serve.toml`) and `meta.json`'s `settings` (the
//! [`crate::measure::settings::Settings`] contract). The groups every measuring command shares
//! (model, schemes, weights, seed, threads) are the sweep's own; the serving groups follow
//! vLLM's `bench serve` and engine arguments (`--request-rate` → `--rate`, `--max-num-seqs`,
//! `--block-size`).
//!
//! [`ServePlan::build`] checks the settings once, before any model is loaded, and turns them
//! into the points of the run; [`ServePlan::check_model`] adds what needs the model (context,
//! head size, whether one request fits the budget).

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme};
use crate::measure::settings::{
    check_threads, dedup_with_note, ModelArgs, SchemeArgs, SeedArgs, Settings, ThreadArgs,
    WeightArgs,
};
use crate::util::size::ByteSize;

use super::metrics::Slo;
use super::pool::BlockSizer;
use super::workload::{self, Arrival, ArrivalProcess, LenDist, Rate};

/// The schemes `kvbench serve` compares when `--dtypes` is not given: the sweep's three and an
/// eviction scheme, whose blocks stop growing at its window.
pub const DEFAULT_SCHEMES: &str = "fp16,int8,int4,window:size=128,sinks=4";

/// `--kv-budget`, `--block-size`, `--max-num-seqs`: the paged block pool and the batch.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PoolArgs {
    /// KV budget for the block pool, bytes (e.g. 24MiB): each scheme gets ⌊budget / its block
    /// bytes⌋ blocks.
    #[arg(long, default_value = "24MiB")]
    pub kv_budget: ByteSize,
    /// Tokens per KV block (vLLM's default 16).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most sequences running at once (vLLM's max_num_seqs).
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
}

/// `--rate`/`--arrival` or `--concurrency`, `--num-requests`, the lengths and the shared
/// prefix: the requests a point serves.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LoadArgs {
    /// Open-loop request rates, requests/s, comma-separated (`inf`: all at once); vLLM's
    /// `--request-rate`.
    #[arg(
        long,
        visible_alias = "request-rate",
        value_delimiter = ',',
        default_value = "1,2,4"
    )]
    pub rate: Vec<Rate>,
    /// Arrival process for `--rate`: poisson (exponential gaps) or constant.
    #[arg(long, value_enum, default_value = "poisson")]
    pub arrival: ArrivalProcess,
    /// With poisson arrivals: gamma-distributed gaps of this shape instead (vLLM's `bench
    /// serve --burstiness`): below 1 burstier than Poisson, above 1 more even; 1 is Poisson.
    #[arg(long, default_value_t = 1.0)]
    #[serde(default = "one_f64")]
    pub burstiness: f64,
    /// Closed loop instead of `--rate`: this many clients, comma-separated for several loads.
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Requests per point (the same seeded requests for every scheme).
    #[arg(long, default_value_t = 48)]
    pub num_requests: usize,
    /// Prompt length after the shared prefix: 256 (fixed), 128..384 (uniform) or
    /// xsum:64..512 (the shipped XSum articles' token lengths, clamped).
    #[arg(long, default_value = "128..384")]
    pub input_len: LenDist,
    /// Tokens generated per request (end-of-sequence ignored): fixed, uniform or xsum:LO..HI
    /// (the XSum reference summaries' lengths).
    #[arg(long, default_value = "32..64")]
    pub output_len: LenDist,
    /// Tokens of a system prompt common to every request (0: none). Each scheme then runs with
    /// prefix caching on and off, so the memory and TTFT it saves are measured.
    #[arg(long, default_value_t = 0)]
    pub shared_prefix: usize,
}

/// `--slo`: what a request must meet to count towards goodput.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct SloArgs {
    /// Goodput objectives, ms: ttft=…,tpot=…,e2e=… (any subset).
    #[arg(long, default_value = "ttft=2000,tpot=250")]
    #[serde(with = "crate::util::serde_text")]
    pub slo: Slo,
}

/// `--simulate` and what it needs: the device, the tensor-parallel group, the memory share.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SimArgs {
    /// Simulate instead of measuring: the same scheduler, block pool and requests on a virtual
    /// clock whose steps cost what the performance model says for this device profile (a
    /// shipped one — h100-sxm, h200, a100-80gb, l40s, b200 — or a profile file, e.g. from
    /// `kvbench calibrate`). `--model` then needs only its geometry (an alias such as
    /// llama-3-70b is enough).
    #[arg(long, value_name = "PROFILE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulate: Option<String>,
    /// With --simulate: GPUs one replica is split across (weights, KV heads and the block pool
    /// per GPU, two all-reduces per layer).
    #[arg(long, default_value_t = 1)]
    #[serde(default = "one")]
    pub tensor_parallel: usize,
    /// With --simulate and no --kv-budget: the share of device memory the engine may use
    /// (vLLM's --gpu-memory-utilization); the KV budget per GPU is that, less the weights per
    /// GPU and the engine's reserve (--non-kv-reserve).
    #[arg(long, default_value_t = 0.9)]
    #[serde(default = "util")]
    pub gpu_memory_utilization: f64,
    /// With --simulate and no --kv-budget: memory per GPU kept beside weights and KV (vLLM's
    /// profile-run activation peak plus non-torch memory), e.g. the sum an engine logs. Without
    /// it, modelled from the geometry and --tensor-parallel (`kvbench::serve::capacity`).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_kv_reserve: Option<ByteSize>,
    /// With --simulate and no --kv-budget: tokens of vLLM's profile-run batch
    /// (--max-num-batched-tokens), which sizes the activation reserve. Default: vLLM's,
    /// max(context, 2048) up to a 32,768-token context, else 2048 (chunked prefill).
    #[arg(long, value_name = "TOKENS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<usize>,
    /// With --simulate: the fp16 blocks (of --block-size tokens) each GPU holds, as vLLM logs them
    /// (`# GPU blocks: N`, or its `--num-gpu-blocks-override`): the KV budget per GPU is then
    /// N × the fp16 block's bytes for every scheme, the most faithful way to match an engine.
    #[arg(long, value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_gpu_blocks_override: Option<u64>,
    /// With --simulate on a profile `kvbench calibrate` wrote on this machine: a measured serving
    /// run's folder (the same points) whose speed probes set the simulation's speed — prefills
    /// scaled by the run's median probe prefill ÷ the profile's, decode steps by its median
    /// probe step ÷ the profile's — so the simulation is compared with the measurement at the
    /// speed the machine had when it ran (a shared VM drifts 10–30 % in half an hour).
    #[arg(long, value_name = "MEASURED_RUN_DIR")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_from: Option<std::path::PathBuf>,
}

fn one_f64() -> f64 {
    1.0
}

fn one() -> usize {
    1
}

fn util() -> f64 {
    0.9
}

/// Every setting of `kvbench serve` that changes a number (see the module docs).
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[command(mut_arg("dtypes", |a| a.default_value(DEFAULT_SCHEMES)))]
pub struct ServeSettings {
    /// `--model`.
    #[command(flatten)]
    #[serde(flatten)]
    pub model: ModelArgs,
    /// `--dtypes` (alias `--schemes`).
    #[command(flatten)]
    #[serde(flatten)]
    pub schemes: SchemeArgs,
    /// `--kv-budget`, `--block-size`, `--max-num-seqs`.
    #[command(flatten)]
    #[serde(flatten)]
    pub pool: PoolArgs,
    /// `--rate`, `--arrival`, `--concurrency`, `--num-requests`, `--input-len`,
    /// `--output-len`, `--shared-prefix`.
    #[command(flatten)]
    #[serde(flatten)]
    pub load: LoadArgs,
    /// `--slo`.
    #[command(flatten)]
    #[serde(flatten)]
    pub slo: SloArgs,
    /// `--weights`, `--prefill-weights`.
    #[command(flatten)]
    #[serde(flatten)]
    pub weights: WeightArgs,
    /// `--seed`: arrivals, lengths and prompt offsets.
    #[command(flatten)]
    #[serde(flatten)]
    pub seed: SeedArgs,
    /// `--threads`.
    #[command(flatten)]
    #[serde(flatten)]
    pub threads: ThreadArgs,
    /// `--simulate`, `--tensor-parallel`, `--gpu-memory-utilization`, `--non-kv-reserve`,
    /// `--max-num-batched-tokens`, `--num-gpu-blocks-override`.
    #[command(flatten)]
    #[serde(flatten)]
    pub sim: SimArgs,
}

impl Default for ServeSettings {
    /// The flags' defaults, as `kvbench serve` with no flag has them.
    fn default() -> Self {
        Self::defaults()
    }
}

impl Settings for ServeSettings {
    const COMMAND: &'static str = "serve";
    fn threads_mut(&mut self) -> &mut Option<usize> {
        &mut self.threads.threads
    }
}

/// Most requests per point: the prompts are built before the first arrival, and 100,000
/// requests at 2 req/s already take 14 hours.
pub const MAX_NUM_REQUESTS: usize = 100_000;

/// Longest expected arrival span of an open-loop point, seconds (one day): `--num-requests /
/// --rate` past it is a typo (`--rate 1e-12` would wait 10^12 s for its first request).
pub const MAX_ARRIVAL_SPAN_S: f64 = 86_400.0;

/// What identifies a point of a serving run: the scheme, the load, and whether the shared
/// prefix is cached.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PointKey {
    /// The scheme's printed name.
    pub scheme: String,
    /// Arrival process and load.
    pub arrival: Arrival,
    /// Whether the shared prefix's blocks are stored once and shared.
    pub prefix_caching: bool,
}

/// A serving run's settings, checked, as the points it serves.
#[derive(Debug, Clone)]
pub struct ServePlan {
    /// The settings it was built from (duplicates dropped).
    pub settings: ServeSettings,
    /// KV budget, bytes.
    pub budget: u64,
    /// Loads, in the order given.
    pub loads: Vec<Arrival>,
    /// Prefix caching off, and on when there is a shared prefix.
    pub arms: Vec<bool>,
}

fn usage(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

impl ServePlan {
    /// Checks `settings` before anything is loaded or allocated — schemes, `--kv-budget` (at
    /// most this machine's memory, where the CPU cache lives), block size, request count,
    /// loads (each open-loop rate spreads the requests over at most a day), the shared prefix,
    /// `--threads` — and drops repeated schemes and loads with a note. Errors:
    /// [`Error::InvalidArgument`] naming the flag, the value and the bound.
    pub fn build(settings: &ServeSettings) -> Result<ServePlan> {
        let mut s = settings.clone();
        check_threads(s.threads.threads)?;
        if s.schemes.dtypes.0.is_empty() {
            return Err(usage(
                "--dtypes",
                "names no scheme; give one or more, e.g. fp16,int8,int4".into(),
            ));
        }
        dedup_with_note("--dtypes", &mut s.schemes.dtypes.0);
        let budget = s.pool.kv_budget.bytes;
        check_pool(&s.pool, s.sim.simulate.is_none())?;
        check_sim(&s.sim)?;
        check_requests(&s.load)?;
        let loads = loads(&mut s.load)?;
        let arms = if s.load.shared_prefix > 0 {
            vec![false, true]
        } else {
            vec![false]
        };
        Ok(ServePlan {
            settings: s,
            budget,
            loads,
            arms,
        })
    }

    /// The plan with a KV budget of `bytes` per device (what `--simulate` derives from the
    /// profile when no `--kv-budget` is given), recorded in its settings.
    pub fn with_budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self.settings.pool.kv_budget = ByteSize::from_bytes(bytes);
        self
    }

    /// The schemes, in the order given.
    pub fn schemes(&self) -> &[KvScheme] {
        &self.settings.schemes.dtypes.0
    }

    /// Every point of the run: loads × schemes × prefix-caching arms, in that order. Eviction
    /// schemes rewrite old blocks, so they never run with prefix caching (vLLM disables it).
    pub fn points(&self) -> Vec<PointKey> {
        let mut points = Vec::new();
        for &arrival in &self.loads {
            for s in self.schemes() {
                for &arm in &self.arms {
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
        points
    }

    /// The longest request: prefix + longest prompt + longest output, tokens (each at most
    /// [`workload::MAX_LEN_TOKENS`], so the sum cannot overflow).
    pub fn longest(&self) -> usize {
        let l = &self.settings.load;
        l.shared_prefix + l.input_len.max() + l.output_len.max()
    }

    /// The cache geometry one device's block pool holds: the model's, with its KV heads divided
    /// among `--tensor-parallel` GPUs (at least one each, as vLLM).
    pub fn pool_geometry(&self, model: CacheGeometry) -> CacheGeometry {
        let tp = self.settings.sim.tensor_parallel.max(1);
        CacheGeometry {
            kv_heads: (model.kv_heads / tp).max(1),
            q_heads: model.q_heads / tp,
            ..model
        }
    }

    /// How `scheme`'s bytes map to blocks of `--block-size` tokens for `geom`.
    pub fn sizer(&self, scheme: KvScheme, geom: CacheGeometry) -> BlockSizer {
        BlockSizer {
            scheme,
            geom,
            block_tokens: self.settings.pool.block_size,
        }
    }

    /// The checks that need the model: the longest request within its context `max_ctx`,
    /// every scheme valid at its head size, and the budget holding one request at its largest
    /// (a per-channel format's residual rows peak before each group is quantized), else every
    /// request would be rejected. Errors: [`Error::InvalidArgument`] naming `--output-len`,
    /// `--input-len` or `--kv-budget` with the sizes; a scheme's own for the head size.
    pub fn check_model(&self, geom: CacheGeometry, max_ctx: usize) -> Result<()> {
        let geom = self.pool_geometry(geom);
        let l = &self.settings.load;
        let longest = self.longest();
        if longest > max_ctx {
            return Err(usage(
                if l.output_len.max() > max_ctx {
                    "--output-len"
                } else {
                    "--input-len"
                },
                format!(
                    "prefix {} + prompt {} + output {} reach {longest} tokens, past the model's \
                     context of {max_ctx}; give shorter --input-len/--output-len/--shared-prefix",
                    l.shared_prefix,
                    l.input_len.max(),
                    l.output_len.max(),
                ),
            ));
        }
        for s in self.schemes() {
            s.validate(geom.head_dim)?;
            let sizer = self.sizer(*s, geom);
            let one = sizer.peak_blocks(longest) as u64;
            let blocks = self.budget / sizer.block_bytes();
            if blocks < one {
                return Err(usage(
                    "--kv-budget",
                    format!(
                        "{} bytes hold {blocks} blocks of {} bytes in {s}, but the longest \
                         request needs {one}; give at least {} bytes or shorter requests",
                        self.budget,
                        sizer.block_bytes(),
                        one * sizer.block_bytes()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `--simulate`'s companions: a tensor-parallel size of 1 or more (and only with
/// `--simulate`), `--speed-from` only with `--simulate`, a memory share in (0, 1], a profile
/// batch of at least one token.
fn check_sim(s: &SimArgs) -> Result<()> {
    if s.tensor_parallel == 0 {
        return Err(usage("--tensor-parallel", "must be at least 1".into()));
    }
    if s.speed_from.is_some() && s.simulate.is_none() {
        return Err(usage(
            "--speed-from",
            "scales a simulation to a measured run's speed probes; give --simulate PROFILE too"
                .into(),
        ));
    }
    if s.tensor_parallel > 1 && s.simulate.is_none() {
        return Err(usage(
            "--tensor-parallel",
            "measured serving runs on one device; tensor parallelism is for --simulate".into(),
        ));
    }
    let u = s.gpu_memory_utilization;
    if !(u.is_finite() && u > 0.0 && u <= 1.0) {
        return Err(usage(
            "--gpu-memory-utilization",
            format!("{u} is not a share in (0, 1], e.g. 0.9"),
        ));
    }
    if s.max_num_batched_tokens == Some(0) {
        return Err(usage(
            "--max-num-batched-tokens",
            "must be at least 1 (vLLM's default for an 8,192-token context is 8192)".into(),
        ));
    }
    Ok(())
}

/// The pool's bounds: a budget the machine can hold (`in_ram`: the cache lives here, not in a
/// simulated device), a block size within 1 to [`crate::plan::MAX_BLOCK_TOKENS`], at least one
/// running sequence.
fn check_pool(p: &PoolArgs, in_ram: bool) -> Result<()> {
    // On the CPU the cache lives in RAM: a budget past the machine's memory cannot be held,
    // and its block table alone would exhaust memory before the first request.
    if let (true, Some(mem)) = (in_ram, crate::util::memory::total_bytes()) {
        if p.kv_budget.bytes > mem {
            return Err(usage(
                "--kv-budget",
                format!(
                    "{} ({} bytes) is more than this machine's {mem} bytes of memory, where \
                     the KV cache is held; give at most {}MiB",
                    p.kv_budget,
                    p.kv_budget.bytes,
                    mem >> 20
                ),
            ));
        }
    }
    if p.block_size == 0 {
        return Err(usage("--block-size", "must be at least 1".into()));
    }
    if p.block_size > crate::plan::MAX_BLOCK_TOKENS {
        return Err(usage(
            "--block-size",
            format!(
                "{} tokens per block is past any context; give at most {} (vLLM uses 16)",
                p.block_size,
                crate::plan::MAX_BLOCK_TOKENS
            ),
        ));
    }
    if p.max_num_seqs == 0 {
        return Err(usage("--max-num-seqs", "must be at least 1".into()));
    }
    Ok(())
}

/// The request count within 1 to [`MAX_NUM_REQUESTS`], the shared prefix within
/// [`workload::MAX_LEN_TOKENS`].
fn check_requests(l: &LoadArgs) -> Result<()> {
    if l.num_requests == 0 {
        return Err(usage("--num-requests", "must be at least 1".into()));
    }
    if l.num_requests > MAX_NUM_REQUESTS {
        return Err(usage(
            "--num-requests",
            format!(
                "{} requests per point is more than {MAX_NUM_REQUESTS} (at 2 req/s those take \
                 14 hours); give at most {MAX_NUM_REQUESTS}",
                l.num_requests
            ),
        ));
    }
    if l.shared_prefix > workload::MAX_LEN_TOKENS {
        return Err(usage(
            "--shared-prefix",
            format!(
                "{} tokens is past any model's context; give at most {}",
                l.shared_prefix,
                workload::MAX_LEN_TOKENS
            ),
        ));
    }
    Ok(())
}

/// The loads: closed-loop client counts when `--concurrency` is given, else the open-loop
/// rates under `--arrival`; repeated entries dropped with a note. Errors:
/// [`Error::InvalidArgument`] naming `--concurrency` (0 clients) or `--rate` (none given, or
/// a rate spreading the requests over more than [`MAX_ARRIVAL_SPAN_S`]).
fn loads(l: &mut LoadArgs) -> Result<Vec<Arrival>> {
    if !l.concurrency.is_empty() {
        if l.concurrency.contains(&0) {
            return Err(usage("--concurrency", "clients must be at least 1".into()));
        }
        dedup_with_note("--concurrency", &mut l.concurrency);
        return Ok(l
            .concurrency
            .iter()
            .map(|&clients| Arrival::Closed { clients })
            .collect());
    }
    if l.rate.is_empty() {
        return Err(usage(
            "--rate",
            "give at least one rate or --concurrency".into(),
        ));
    }
    dedup_with_note("--rate", &mut l.rate);
    for r in &l.rate {
        let span = l.num_requests as f64 / r.0;
        if span > MAX_ARRIVAL_SPAN_S {
            return Err(usage(
                "--rate",
                format!(
                    "{} req/s spreads {} requests over {span:.3e} s, more than a day; give at \
                     least {:.3e} req/s (or fewer --num-requests)",
                    r.0,
                    l.num_requests,
                    l.num_requests as f64 / MAX_ARRIVAL_SPAN_S
                ),
            ));
        }
    }
    if !(l.burstiness.is_finite() && l.burstiness > 0.0) {
        return Err(usage(
            "--burstiness",
            format!(
                "{} is not a gamma shape; give a number > 0 (1 = Poisson)",
                l.burstiness
            ),
        ));
    }
    if l.burstiness != 1.0 && l.arrival == ArrivalProcess::Constant {
        return Err(usage(
            "--burstiness",
            "shapes poisson arrivals; with --arrival constant leave it at 1".into(),
        ));
    }
    Ok(l.rate
        .iter()
        .map(|&r| l.arrival.at(r, l.burstiness))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The defaults are the flags' documented ones (read off the `#[arg]`s by hand), and the
    /// shipped suite lays its values over them into settings that pass the checks.
    #[test]
    fn defaults_and_the_shipped_suite_parse() {
        let d = ServeSettings::default();
        let names: Vec<String> = d.schemes.dtypes.0.iter().map(|s| s.to_string()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert_eq!((d.pool.kv_budget.bytes, d.pool.block_size), (24 << 20, 16));
        assert_eq!(d.load.rate, [Rate(1.0), Rate(2.0), Rate(4.0)]);
        assert_eq!((d.load.num_requests, d.threads.threads), (48, None));
        ServePlan::build(&d).unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites/serve.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let a = ServeSettings::parse_suite(&text, &path).unwrap();
        assert_eq!(a.load.shared_prefix, 0);
        ServePlan::build(&a).unwrap();
        let text = format!(
            "{}\nthreads = 3\nconcurrency = [2]\n",
            text.replace("rate = [1, 2, 4]", "rate = [1, inf]")
        );
        let a = ServeSettings::parse_suite(&text, &path).unwrap();
        assert_eq!(
            (a.threads.threads, a.load.concurrency.clone()),
            (Some(3), vec![2])
        );
        assert_eq!(a.load.rate, [Rate(1.0), Rate(f64::INFINITY)]);
        let e = ServeSettings::parse_suite("rate = [true]\n", &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rate"), "{e}");
        let e = ServeSettings::parse_suite("rates = [1]\n", &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rates") && e.contains("serve.toml"), "{e}");
        // A suite's integer length and the old `schemes` key read as the flags do.
        let a = ServeSettings::parse_suite("input-len = 256\nschemes = \"fp16\"\n", &path).unwrap();
        assert_eq!(a.load.input_len, LenDist::Fixed(256));
        assert_eq!(a.schemes.dtypes.0, [KvScheme::FP16]);
    }

    /// The settings a serve run of kvbench 0.1.0 recorded in meta.json (strings for the
    /// rates, the budget and the SLO; the scheme list under `schemes`) read back as meant.
    #[test]
    fn settings_recorded_before_typed_settings_read() {
        let old = serde_json::json!({
            "model": "default", "schemes": "fp16,int4", "kv-budget": "4MiB", "block-size": 16,
            "rate": ["1", "inf"], "arrival": "constant", "concurrency": [], "num-requests": 8,
            "input-len": "60", "output-len": "4", "shared-prefix": 0, "max-num-seqs": 8,
            "slo": "ttft=2000,tpot=250", "weights": "q8_0", "prefill-weights": "f32",
            "seed": 0, "threads": null
        });
        let s = ServeSettings::default()
            .overlay(old.as_object().unwrap(), "meta.json", |_| false)
            .unwrap();
        assert_eq!(s.pool.kv_budget.bytes, 4 << 20);
        assert_eq!(s.load.rate, [Rate(1.0), Rate(f64::INFINITY)]);
        assert_eq!(s.load.arrival, ArrivalProcess::Constant);
        assert_eq!(s.slo.slo.ttft_ms, Some(2000.0));
        assert_eq!(s.load.input_len, LenDist::Fixed(60));
        // And what this kvbench records reads back to the same settings.
        let v = serde_json::to_value(s.recorded(2)).unwrap();
        assert_eq!(v["rate"], serde_json::json!([1.0, "inf"]));
        let back = ServeSettings::default()
            .overlay(v.as_object().unwrap(), "meta.json", |_| false)
            .unwrap();
        assert_eq!(back, s.recorded(2));
    }

    /// Bounds named by flag: an arrival span past a day, 0 clients, no scheme.
    #[test]
    fn plan_refuses_what_cannot_be_meant() {
        let mut s = ServeSettings::default();
        s.load.rate = vec![Rate(1e-12)];
        let e = ServePlan::build(&s).unwrap_err().to_string();
        assert!(e.contains("--rate") && e.contains("more than a day"), "{e}");
        let mut s = ServeSettings::default();
        s.load.concurrency = vec![0];
        assert!(ServePlan::build(&s)
            .unwrap_err()
            .to_string()
            .contains("--concurrency"));
        let mut s = ServeSettings::default();
        s.schemes.dtypes.0.clear();
        assert!(ServePlan::build(&s)
            .unwrap_err()
            .to_string()
            .contains("--dtypes"));
        // 3 loads × 4 schemes, prefix off only; with a prefix the window scheme runs once.
        let p = ServePlan::build(&ServeSettings::default()).unwrap();
        assert_eq!(p.points().len(), 12);
        let mut s = ServeSettings::default();
        s.load.shared_prefix = 32;
        assert_eq!(
            ServePlan::build(&s).unwrap().points().len(),
            3 * (3 * 2 + 1)
        );
    }
}
