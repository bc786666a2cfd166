//! `kvbench plan` end to end: the model's geometry and weights, the memory after a reserve,
//! [`crate::plan`]'s concurrency per scheme × context (per GPU under tensor parallelism), and
//! the table, `plan.csv`, `plan.json` and chart ([`crate::report::plan`]); `--memory` and
//! `--tensor-parallel` take lists and plan every combination.

use std::path::PathBuf;

use crate::measure::settings::{ModelArgs, SchemeArgs};
use crate::model::geometry::{geometry, weight_bytes_per_param};
use crate::plan::{max_context, parse_bytes, parse_tokens, plan_gpus, PlanInput};
use crate::report::plan::{self as render, PlanReport};

/// Arguments of `kvbench plan`: the shared `--model` (an alias with shipped geometry —
/// llama-3-8b, llama-3-70b, llama-2-7b, mistral-7b, qwen2.5-7b, qwen2.5-0.5b, smollm2-135m,
/// gemma-3-270m, gemma-3-4b, gemma-3-27b —,
/// a config.json or its folder, or a GGUF file; default llama-3-8b) and `--dtypes` (default
/// fp16,fp8,int4), and the memory to plan.
#[derive(Debug, clap::Args)]
#[command(mut_arg("model", |a| a.default_value("llama-3-8b")))]
#[command(mut_arg("dtypes", |a| a.default_value("fp16,fp8,int4")))]
pub struct PlanArgs {
    /// `--model`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// `--dtypes`.
    #[command(flatten)]
    pub schemes: SchemeArgs,
    /// Device memory per GPU, e.g. 80GiB, 24GB; a comma list plans each (80GiB,141GiB).
    #[arg(long, value_delimiter = ',', default_value = "80GiB")]
    pub memory: Vec<String>,
    /// Context lengths per sequence (tokens held: prompt + generated), comma-separated
    /// (k = 1024 tokens). Old spelling: `--ctx`.
    #[arg(
        long = "seq-lens",
        visible_alias = "ctx",
        value_delimiter = ',',
        default_value = "4k,32k,128k"
    )]
    pub ctx: Vec<String>,
    /// Weight dtype (default: the checkpoint's, bf16 for shipped aliases).
    #[arg(long)]
    pub weights_dtype: Option<String>,
    /// Memory kept free for activations and fragmentation, e.g. 10% or 0.1.
    #[arg(long, default_value = "10%")]
    pub reserve: String,
    /// Tokens per KV block (paged allocation, vLLM's default 16).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// GPUs one model replica is split across (tensor parallelism): weights and KV heads are
    /// divided among them; with more GPUs than KV heads each holds one replicated KV head.
    /// A comma list (4,8) plans each size.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub tensor_parallel: Vec<usize>,
    /// GPUs in all (a multiple of --tensor-parallel): `gpus / tensor-parallel` replicas, each
    /// with its own weights and KV budget (default: one replica).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Also print the longest context that fits at this many concurrent sequences.
    #[arg(long)]
    pub concurrency: Option<u64>,
    /// Folder for plan.csv (default: reports/plan-<time>-<model>); with several memories or
    /// tensor-parallel sizes, one subfolder per combination (`80GiB-tp4`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// What stdout gets: the table, or one JSON object (`{"kvbench": version, "plans":
    /// [PlanReport…]}`, each plan as `plan.json` holds it plus its folder); the "wrote" lines
    /// then go to stderr.
    #[arg(long, value_enum, default_value_t = PlanFormat::Table)]
    pub format: PlanFormat,
}

/// `--format` of `kvbench plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    /// The table and notes.
    Table,
    /// One JSON object on stdout.
    Json,
}

/// Runs the planner for every `--memory` × `--tensor-parallel` combination (memory outer, in
/// the order given), prints the tables (or the JSON), writes `plan.csv`, `plan.json` and the
/// chart per combination. Errors: [`crate::Error::InvalidArgument`] naming the flag for a
/// model, size, share or count that cannot be planned; the planner's; I/O errors writing the
/// folder.
pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    let model = geometry(&a.model.model)?;
    let usage = |name: &str, reason: &str| crate::Error::InvalidArgument {
        name: name.into(),
        reason: reason.into(),
    };
    if a.tensor_parallel.is_empty() || a.tensor_parallel.contains(&0) {
        return Err(usage("--tensor-parallel", "must be at least 1 GPU").into());
    }
    if a.memory.is_empty() {
        return Err(usage("--memory", "give a size such as 80GiB").into());
    }
    let dir = a.out.clone().unwrap_or_else(|| {
        let t = crate::util::time::now_compact();
        PathBuf::from("reports").join(format!("plan-{}-{}", t, model.name.replace('/', "_")))
    });
    let several = a.memory.len() * a.tensor_parallel.len() > 1;
    let mut plans = Vec::new();
    for memory in &a.memory {
        for &tp in &a.tensor_parallel {
            let report = plan_one(&a, &model, memory, tp)?;
            let (out, title) = match several {
                false => (dir.clone(), String::new()),
                true => (
                    dir.join(format!("{}-tp{tp}", memory.trim().replace(['/', ' '], "_"))),
                    format!(
                        "{}== --memory {} --tensor-parallel {tp} ==\n",
                        if plans.is_empty() { "" } else { "\n" },
                        memory.trim()
                    ),
                ),
            };
            if a.format == PlanFormat::Table {
                print!("{title}{}", render::table(&report));
            }
            let wrote = render::write(&report, &out)?;
            match a.format {
                PlanFormat::Table => println!("{wrote}"),
                PlanFormat::Json => eprintln!("{wrote}"),
            }
            plans.push((report, out));
        }
    }
    if a.format == PlanFormat::Json {
        let plans: Vec<serde_json::Value> = plans
            .iter()
            .map(|(p, out)| {
                let mut v = serde_json::to_value(p)?;
                v["out"] = serde_json::Value::String(out.display().to_string());
                Ok(v)
            })
            .collect::<serde_json::Result<_>>()?;
        let doc = serde_json::json!({
            "kvbench": crate::report::meta::version(),
            "plans": plans,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}

/// One plan: `memory` per GPU and tensor-parallel size `tp`, the other settings from `a`.
/// Errors: as [`run`].
fn plan_one(
    a: &PlanArgs,
    model: &crate::model::geometry::ModelGeometry,
    memory: &str,
    tp: usize,
) -> anyhow::Result<PlanReport> {
    let dtype = a
        .weights_dtype
        .clone()
        .unwrap_or_else(|| model.weight_dtype.clone());
    let usage = |name: &str, reason: &str| crate::Error::InvalidArgument {
        name: name.into(),
        reason: reason.into(),
    };
    if a.concurrency == Some(0) {
        return Err(usage(
            "--concurrency",
            "0 sequences need no memory; give 1 or more",
        )
        .into());
    }
    if a.block_size == 0 {
        return Err(usage("--block-size", "must be at least 1").into());
    }
    let weight_bytes = if dtype == "gguf" {
        std::fs::metadata(&a.model.model)
            .map(|m| m.len())
            .unwrap_or(0)
    } else {
        (model.params as f64 * weight_bytes_per_param(&dtype)?) as u64
    };
    let ctxs = a
        .ctx
        .iter()
        .map(|c| parse_tokens(c))
        .collect::<Result<Vec<_>, _>>()?;
    let input = PlanInput {
        model: model.clone(),
        memory_bytes: parse_bytes(memory)?,
        reserve: parse_fraction(&a.reserve)?,
        weight_bytes,
        block: a.block_size,
        tensor_parallel: tp,
    };
    let gpus = a.gpus.unwrap_or(tp);
    let rows = plan_gpus(&input, &a.schemes.dtypes.0, &ctxs, gpus)?;
    let longest = match a.concurrency {
        Some(n) => a
            .schemes
            .dtypes
            .0
            .iter()
            .map(|s| Ok((s.to_string(), n, max_context(&input, s, n, 1 << 24)?)))
            .collect::<crate::Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    Ok(PlanReport {
        input,
        weights_dtype: dtype,
        gpus,
        schemes: a.schemes.dtypes.0.iter().map(|s| s.to_string()).collect(),
        ctxs,
        rows,
        longest,
    })
}

/// `10%` or `0.1` → 0.1. Errors: [`crate::Error::InvalidArgument`] (`--reserve`) for anything
/// not a share in [0, 1).
fn parse_fraction(s: &str) -> Result<f64, crate::Error> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse::<f64>(),
    };
    v.ok()
        .filter(|x| (0.0..1.0).contains(x))
        .ok_or_else(|| crate::Error::InvalidArgument {
            name: "--reserve".into(),
            reason: format!("`{s}` is not a share like 10% or 0.1"),
        })
}
