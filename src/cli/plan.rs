//! `kvbench plan`: max concurrent sequences per KV scheme × context in a memory budget.

use std::path::PathBuf;

use crate::model::geometry::{geometry, weight_bytes_per_param};
use crate::plan::{max_context, parse_bytes, parse_tokens, plan_gpus, PlanInput};
use crate::report::meta;

/// Arguments of `kvbench plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Model: an alias with shipped geometry (llama-3-8b, llama-3-70b, llama-2-7b, mistral-7b,
    /// qwen2.5-7b, qwen2.5-0.5b, smollm2-135m), a config.json (or its folder), or a GGUF file.
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// Device memory, e.g. 80GiB, 24GB.
    #[arg(long, default_value = "80GiB")]
    pub memory: String,
    /// KV-cache schemes, comma-separated (see `kvbench sweep --help`).
    #[arg(long = "dtypes", visible_alias = "schemes", default_value = "fp16,fp8,int4",
          value_parser = crate::measure::settings::parse_schemes)]
    pub schemes: crate::measure::settings::SchemeList,
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
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel: usize,
    /// GPUs in all (a multiple of --tensor-parallel): `gpus / tensor-parallel` replicas, each
    /// with its own weights and KV budget (default: one replica).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Also print the longest context that fits at this many concurrent sequences.
    #[arg(long)]
    pub concurrency: Option<u64>,
    /// Folder for plan.csv (default: reports/plan-<time>-<model>).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the planner, prints the table, writes `plan.csv` and `plan.json`.
pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    let model = geometry(&a.model)?;
    let dtype = a
        .weights_dtype
        .clone()
        .unwrap_or_else(|| model.weight_dtype.clone());
    if a.tensor_parallel == 0 {
        anyhow::bail!(crate::Error::InvalidArgument {
            name: "--tensor-parallel".into(),
            reason: "must be at least 1 GPU".into()
        });
    }
    let bytes_per_param = if dtype == "gguf" {
        None
    } else {
        Some(weight_bytes_per_param(&dtype)?)
    };
    let weight_bytes = match bytes_per_param {
        Some(b) => (model.params as f64 * b) as u64,
        None => std::fs::metadata(&a.model).map(|m| m.len()).unwrap_or(0),
    };
    let reserve = parse_fraction(&a.reserve)?;
    if a.concurrency == Some(0) {
        anyhow::bail!(crate::Error::InvalidArgument {
            name: "--concurrency".into(),
            reason: "0 sequences need no memory; give 1 or more".into()
        });
    }
    if a.block_size == 0 {
        anyhow::bail!(crate::Error::InvalidArgument {
            name: "--block-size".into(),
            reason: "must be at least 1".into()
        });
    }
    let ctxs = a
        .ctx
        .iter()
        .map(|c| parse_tokens(c))
        .collect::<Result<Vec<_>, _>>()?;
    let input = PlanInput {
        model: model.clone(),
        memory_bytes: parse_bytes(&a.memory)?,
        reserve,
        weight_bytes,
        block: a.block_size,
        tensor_parallel: a.tensor_parallel,
    };
    let gpus = a.gpus.unwrap_or(a.tensor_parallel);
    let rows = plan_gpus(&input, &a.schemes.0, &ctxs, gpus)?;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "{} ({} layers, {} kv heads × {}), weights {} = {:.2} GiB, memory {:.2} GiB, reserve {:.0} %, KV budget {:.2} GiB, blocks of {} tokens",
        model.name, model.layers, model.kv_heads, model.head_dim, dtype, gib(weight_bytes),
        gib(input.memory_bytes), reserve * 100.0, gib(rows.first().map_or(0, |r| r.kv_budget_bytes)),
        a.block_size
    );
    let tp = a.tensor_parallel > 1 || gpus > 1;
    if tp {
        println!(
            "tensor parallel {} ({} KV heads per GPU{}), {gpus} GPUs = {} replicas; memory, weights \
             and bytes are per GPU, max seqs per replica",
            a.tensor_parallel,
            input.kv_heads_per_gpu(),
            if a.tensor_parallel > model.kv_heads { ", replicated" } else { "" },
            gpus / a.tensor_parallel
        );
    }
    println!(
        "{:<28} {:>8} {:>12} {:>14} {:>12} {:>12}{}",
        "scheme",
        "context",
        "bytes/token",
        "GiB/sequence",
        "waste MiB",
        "max seqs",
        if tp {
            format!(" {:>4} {:>9} {:>12}", "TP", "KV h/GPU", "total seqs")
        } else {
            String::new()
        }
    );
    for r in &rows {
        println!(
            "{:<28} {:>8} {:>12} {:>14.3} {:>12.2} {:>12}{}",
            r.scheme,
            r.ctx,
            r.bytes_per_token,
            gib(r.kv_bytes_per_seq),
            r.paging_waste_bytes as f64 / (1u64 << 20) as f64,
            r.max_concurrency,
            if tp {
                format!(
                    " {:>4} {:>9} {:>12}",
                    r.tensor_parallel, r.kv_heads_per_gpu, r.total_concurrency
                )
            } else {
                String::new()
            }
        );
    }
    for &c in ctxs.iter().filter(|&&c| c > model.max_ctx) {
        println!(
            "note: context {c} exceeds {}'s trained context of {} tokens (it needs RoPE scaling there)",
            model.name, model.max_ctx
        );
    }
    if let Some(n) = a.concurrency {
        for s in &a.schemes.0 {
            let c = max_context(&input, s, n, 1 << 24)?;
            println!("{s}: longest context for {n} concurrent sequences: {c} tokens");
        }
    }
    let dir = a.out.clone().unwrap_or_else(|| {
        let t = crate::util::time::now_compact();
        PathBuf::from("reports").join(format!("plan-{}-{}", t, model.name.replace('/', "_")))
    });
    crate::report::run_dir::create_out(&dir)?;
    let mut w = csv::Writer::from_path(dir.join("plan.csv"))?;
    for r in &rows {
        w.serialize(r)?;
    }
    w.flush()?;
    meta::write_json(
        &dir.join("plan.json"),
        &serde_json::json!({
            "kvbench": meta::version(),
            "input": input,
            "weights_dtype": dtype,
            "rows": rows,
        }),
    )?;
    let machine = meta::Machine::probe();
    let chart = crate::report::chart::LineChart {
        title: format!("Max concurrent sequences vs context — {}", model.name),
        caption: format!(
            "{:.0} GiB memory, {} weights {:.1} GiB, {:.0} % reserve, KV blocks of {} tokens · kvbench {} · planned on {}",
            gib(input.memory_bytes),
            dtype,
            gib(weight_bytes),
            reserve * 100.0,
            a.block_size,
            env!("CARGO_PKG_VERSION"),
            machine.hostname
        ),
        x_label: "context per sequence (tokens, log scale)".into(),
        y_label: "max concurrent sequences".into(),
        log_x: ctxs.len() > 1 && ctxs.iter().max() > ctxs.iter().min().map(|m| m * 2).as_ref(),
        series: a
            .schemes
            .0
            .iter()
            .map(|s| {
                crate::report::chart::Series::line(
                    s.to_string(),
                    rows.iter()
                        .filter(|r| r.scheme == s.to_string())
                        .map(|r| (r.ctx as f64, r.max_concurrency as f64))
                        .collect(),
                )
            })
            .collect(),
    };
    chart.render(&dir, "concurrency_vs_context")?;
    println!(
        "wrote {}, {} and {}",
        dir.join("plan.csv").display(),
        dir.join("concurrency_vs_context.png").display(),
        dir.join("concurrency_vs_context.svg").display()
    );
    Ok(())
}

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
