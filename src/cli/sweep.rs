//! `kvbench sweep`: the main job.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use crate::kv::{KvScheme, VALID_SCHEMES};
use crate::measure::sweep::{run_sweep, work_units, PhaseModels, Progress, SweepSpec};
use crate::model::{self, hub, ModelLocation, WeightDtype};
use crate::quality::perplexity::{PplMode, PplProtocol, Scoring};
use crate::quality::wikitext;
use crate::report::meta::{self, Machine};
use crate::report::{table, CsvSink, RowContext, CSV_COLUMNS};

/// Arguments of `kvbench sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Model: `default` (SmolLM2-135M-Instruct, fetched on first use), a .gguf file, a folder
    /// with config.json + tokenizer.json + *.safetensors, an alias (llama-3-8b,
    /// llama-3-8b-instruct, llama-2-7b, mistral-7b, qwen2.5-0.5b, qwen2.5-7b, smollm2-135m) or a
    /// Hugging Face repo id.
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,

    /// KV-cache schemes, comma-separated.
    #[arg(long = "dtypes", visible_alias = "schemes", default_value = "fp16,int8,int4",
          value_parser = parse_schemes,
          help = format!("KV-cache schemes, comma-separated: {VALID_SCHEMES}"))]
    pub schemes: SchemeList,

    /// Batch sizes (sequences decoded together), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub batch_sizes: Vec<usize>,

    /// Prompt lengths in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    pub seq_lens: Vec<usize>,

    /// Tokens generated per sequence (greedy); TPOT is measured over the last gen−1.
    #[arg(long, default_value_t = 32)]
    pub gen: usize,

    /// Perplexity window length in tokens (llama.cpp's -c).
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,

    /// Perplexity windows from the start of WikiText-2 test; 0 skips perplexity.
    #[arg(long, default_value_t = 4)]
    pub ppl_windows: usize,

    /// Perplexity scoring: `half` scores the second half of each window (llama.cpp), `all`
    /// every token after the first.
    #[arg(long, value_enum, default_value_t = Scoring::Half)]
    pub ppl_score: Scoring,

    /// Perplexity mode: `decode` feeds windows token by token through the cache (eviction acts
    /// per step), `chunked` runs each window as one prefill (llama.cpp); `auto` = decode for
    /// eviction schemes, chunked otherwise.
    #[arg(long, value_enum, default_value_t = PplMode::Auto)]
    pub ppl_mode: PplMode,

    /// Skip the lockstep comparison with the fp16 cache (KL divergence, top-1 agreement), which
    /// doubles perplexity time for every other scheme.
    #[arg(long)]
    pub no_kl: bool,

    /// Windows decoded together in decode mode.
    #[arg(long, default_value_t = 8)]
    pub ppl_batch: usize,

    /// Weights during decode steps (TPOT): q8_0 (candle's fastest memory-bound kernel here),
    /// f32 (exact) or native (as stored in the file).
    #[arg(long, default_value = "q8_0")]
    pub weights: WeightDtype,

    /// Weights during prefill (TTFT): f32 runs candle's gemm, ~3× faster than its Q8_0 kernels
    /// on long prompts.
    #[arg(long, default_value = "f32")]
    pub prefill_weights: WeightDtype,

    /// Weights during perplexity: f32 keeps quality numbers exact.
    #[arg(long, default_value = "f32")]
    pub ppl_weights: WeightDtype,

    /// Seed for choosing prompt offsets in the text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Untimed warm-up runs before the first point.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,

    /// Worker threads (default: all logical CPUs).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Attention-only sweep at the model's real shapes with synthetic K/V: no weights needed,
    /// so any geometry (e.g. --model llama-3-8b) can be timed on a CPU; no perplexity.
    #[arg(long)]
    pub synthetic: bool,

    /// With --synthetic: points whose predicted KV bytes exceed this (e.g. 16GiB) are recorded
    /// as `oom` and skipped (default: the memory available now).
    #[arg(long)]
    pub memory_limit: Option<String>,

    /// Run folder (default: reports/<run-id>).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// A parsed `--dtypes` list.
#[derive(Debug, Clone)]
pub struct SchemeList(pub Vec<KvScheme>);

pub fn parse_schemes(s: &str) -> Result<SchemeList, crate::Error> {
    crate::kv::parse_scheme_list(s).map(SchemeList)
}

/// Everything recorded in `meta.json`.
#[derive(serde::Serialize)]
struct Meta<'a> {
    kvbench: String,
    run_id: &'a str,
    command: Vec<String>,
    started_at: String,
    finished_at: Option<String>,
    status: &'a str,
    machine: Machine,
    model: ModelMeta,
    tokenizer: TokenizerMeta,
    sweep: &'a SweepSpec,
    perplexity: Option<PerplexityMeta<'a>>,
    csv_columns: &'a [&'a str],
}

#[derive(serde::Serialize)]
struct ModelMeta {
    source: model::ModelSource,
    sha256: Vec<String>,
    config: model::ModelConfig,
    weight_dtype_prefill: WeightDtype,
    weight_dtype_decode: WeightDtype,
    weight_dtype_perplexity: WeightDtype,
    kv_bytes_per_token: Vec<(String, usize)>,
}

#[derive(serde::Serialize)]
struct TokenizerMeta {
    description: String,
    vocab_size: usize,
    add_bos: bool,
    bos: Option<u32>,
}

#[derive(serde::Serialize)]
struct PerplexityMeta<'a> {
    protocol: &'a PplProtocol,
    dataset: &'static str,
    dataset_tokens: usize,
    reference: &'static str,
}

/// Runs the sweep and writes `results.csv` and `meta.json`.
pub fn run(args: SweepArgs) -> anyhow::Result<()> {
    if let Some(n) = args.threads {
        // candle's CPU kernels size their pools from RAYON_NUM_THREADS; set it before any use.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .ok();
    }
    if args.synthetic {
        return run_synthetic(args);
    }
    let started_at = meta::now_rfc3339();
    let location = hub::resolve(&args.model)?;
    // One load per distinct weight dtype; phases that share a dtype share the model.
    let mut loaded: HashMap<WeightDtype, model::LoadedModel> = HashMap::new();
    for dtype in [args.weights, args.prefill_weights, args.ppl_weights] {
        if let std::collections::hash_map::Entry::Vacant(e) = loaded.entry(dtype) {
            let m = model::load_location(&args.model, &location, dtype)
                .with_context(|| format!("loading model `{}` with {dtype} weights", args.model))?;
            e.insert(m);
        }
    }
    let timing = &loaded[&args.weights];
    let models = PhaseModels {
        prefill: &loaded[&args.prefill_weights].model,
        decode: &timing.model,
        quality: &loaded[&args.ppl_weights].model,
    };
    let cfg = timing.model.config.clone();
    let tokens = timing.tokenizer.encode(wikitext::wikitext2_test_text())?;

    let ppl = (args.ppl_windows > 0).then_some(PplProtocol {
        mode: args.ppl_mode,
        batch: args.ppl_batch,
        ctx: args.ctx,
        windows: Some(args.ppl_windows),
        scoring: args.ppl_score,
        bos: timing.tokenizer.add_bos,
    });
    if let Some(p) = &ppl {
        p.validate(cfg.max_ctx, tokens.len())?;
    }
    let spec = SweepSpec {
        schemes: baseline_first(args.schemes.0.clone()),
        batch_sizes: args.batch_sizes.clone(),
        seq_lens: args.seq_lens.clone(),
        gen: args.gen,
        ppl: ppl.clone(),
        seed: args.seed,
        warmup: args.warmup,
        kl: !args.no_kl,
    };
    spec.validate(cfg.max_ctx, tokens.len())?;
    for s in &spec.schemes {
        s.validate(cfg.head_dim)?;
    }

    let label = model_label(&args.model, &location);
    let (run_id, dir) = run_folder(&started_at, label.trim_end_matches(".gguf"), &args.out)?;

    let sha256 = timing
        .source
        .files
        .iter()
        .map(|f| model::fetch::sha256_file(f))
        .collect::<Result<Vec<_>, _>>()?;
    let geom = cfg.cache_geometry();
    let mut meta = Meta {
        kvbench: meta::version(),
        run_id: &run_id,
        command: std::env::args().collect(),
        started_at,
        finished_at: None,
        status: "running",
        machine: Machine::probe(),
        model: ModelMeta {
            source: timing.source.clone(),
            sha256,
            config: cfg.clone(),
            weight_dtype_prefill: args.prefill_weights,
            weight_dtype_decode: args.weights,
            weight_dtype_perplexity: args.ppl_weights,
            kv_bytes_per_token: spec
                .schemes
                .iter()
                .map(|s| (s.to_string(), s.bytes_per_token(&geom)))
                .collect(),
        },
        tokenizer: TokenizerMeta {
            description: timing.tokenizer.description.clone(),
            vocab_size: timing.tokenizer.vocab_size(),
            add_bos: timing.tokenizer.add_bos,
            bos: timing.tokenizer.bos,
        },
        sweep: &spec,
        perplexity: ppl.as_ref().map(|p| PerplexityMeta {
            protocol: p,
            dataset: wikitext::DATASET_NAME,
            dataset_tokens: tokens.len(),
            reference: "llama.cpp llama-perplexity (non-overlapping windows, half scoring)",
        }),
        csv_columns: CSV_COLUMNS,
    };
    let meta_path = dir.join("meta.json");
    meta::write_json(&meta_path, &meta)?;

    let bar = ProgressBar::new(work_units(&spec, args.ppl_windows));
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("static template"),
    );
    let printer = bar.clone();
    let csv_path = dir.join("results.csv");
    let mut sink = CsvSink::create(
        &csv_path,
        RowContext {
            run_id: run_id.clone(),
            model: label,
            prefill_weight_dtype: args.prefill_weights.to_string(),
            decode_weight_dtype: args.weights.to_string(),
            ppl_weight_dtype: args.ppl_weights.to_string(),
            ppl_ctx: ppl.as_ref().map(|p| p.ctx),
            geometry: geom,
        },
    )?
    .on_row(move |r| {
        let line = format!(
            "{:<12} batch {:>3} seq {:>5}: {}",
            r.scheme,
            r.batch_size,
            r.seq_len,
            match (r.ttft_ms, r.tpot_ms_p50) {
                (Some(a), Some(b)) => format!("TTFT {a:.1} ms, TPOT p50 {b:.2} ms"),
                _ => r.status.clone(),
            }
        );
        // Without a terminal (CI logs) the bar is hidden and would swallow the line.
        if printer.is_hidden() {
            eprintln!("{line}");
        } else {
            printer.println(line);
        }
    });
    let progress = BarProgress(bar.clone());
    let result = run_sweep(
        models,
        &tokens,
        timing.tokenizer.bos,
        &spec,
        &mut sink,
        &progress,
    );
    bar.finish_and_clear();
    meta.finished_at = Some(meta::now_rfc3339());
    meta.status = if result.is_ok() { "finished" } else { "failed" };
    meta::write_json(&meta_path, &meta)?;
    result?;
    print!("{}", table::render(&sink.rows));
    println!(
        "model {} · weights: prefill {}, decode {} · perplexity: {} · {} threads",
        meta.model.source.spec,
        args.prefill_weights,
        args.weights,
        ppl.as_ref().map_or("skipped".to_string(), |p| format!(
            "WikiText-2, {} windows × {} tokens, {:?} scoring, {} mode, weights {}",
            p.windows.unwrap_or(0),
            p.ctx,
            p.scoring,
            p.mode,
            args.ppl_weights
        )),
        meta.machine.threads
    );
    println!("wrote {} and {}", csv_path.display(), meta_path.display());
    Ok(())
}

/// `--synthetic`: geometry only, attention + append timed on synthetic K/V.
fn run_synthetic(args: SweepArgs) -> anyhow::Result<()> {
    let started_at = meta::now_rfc3339();
    let geometry_spec = if args.model == hub::DEFAULT_MODEL {
        crate::model::fetch::ensure_default_model()?
            .display()
            .to_string()
    } else {
        args.model.clone()
    };
    let model = crate::model::geometry::geometry(&geometry_spec)?;
    let geom = model.cache();
    let memory_limit = match &args.memory_limit {
        Some(m) => crate::plan::parse_bytes(m)?,
        None => crate::measure::memory::available_bytes().unwrap_or(u64::MAX),
    };
    let spec = SweepSpec {
        schemes: baseline_first(args.schemes.0.clone()),
        batch_sizes: args.batch_sizes.clone(),
        seq_lens: args.seq_lens.clone(),
        gen: args.gen,
        ppl: None,
        seed: args.seed,
        warmup: 0,
        kl: false,
    };
    spec.validate(usize::MAX, usize::MAX)?;
    let (run_id, dir) = run_folder(&started_at, &format!("synthetic-{}", model.name), &args.out)?;
    let meta_value = serde_json::json!({
        "kvbench": meta::version(),
        "run_id": run_id,
        "command": std::env::args().collect::<Vec<_>>(),
        "started_at": started_at,
        "mode": "synthetic: attention + append only, synthetic K/V (outlier key channels), no weights",
        "machine": Machine::probe(),
        "model_geometry": model,
        "memory_limit_bytes": memory_limit,
        "sweep": spec,
        "csv_columns": CSV_COLUMNS,
    });
    meta::write_json(&dir.join("meta.json"), &meta_value)?;
    let bar = ProgressBar::new(work_units(&spec, 0));
    let csv_path = dir.join("results.csv");
    let mut sink = CsvSink::create(
        &csv_path,
        RowContext {
            run_id: run_id.clone(),
            model: format!("{} (synthetic)", model.name),
            prefill_weight_dtype: "none".into(),
            decode_weight_dtype: "none".into(),
            ppl_weight_dtype: "none".into(),
            ppl_ctx: None,
            geometry: geom,
        },
    )?;
    let progress = BarProgress(bar.clone());
    let result =
        crate::measure::synthetic::run_synthetic(&geom, &spec, memory_limit, &mut sink, &progress);
    bar.finish_and_clear();
    result?;
    print!("{}", table::render(&sink.rows));
    println!(
        "model geometry {} ({} layers × {} kv heads × {}), synthetic K/V, TPOT = append + attention only, memory limit {:.2} GiB, {} threads",
        model.name, geom.layers, geom.kv_heads, geom.head_dim,
        memory_limit as f64 / (1u64 << 30) as f64, rayon::current_num_threads()
    );
    println!(
        "wrote {} and {}",
        csv_path.display(),
        dir.join("meta.json").display()
    );
    Ok(())
}

/// The run id (`<UTC time>-<label>`) and its folder (`--out`, else `reports/<run id>`),
/// created.
fn run_folder(
    started_at: &str,
    label: &str,
    out: &Option<PathBuf>,
) -> anyhow::Result<(String, PathBuf)> {
    let time = started_at
        .replace([':', '-'], "")
        .trim_end_matches('Z')
        .replace('T', "-");
    let run_id = format!("{time}-{}", label.replace(['/', ' '], "_"));
    let dir = out
        .clone()
        .unwrap_or_else(|| PathBuf::from("reports").join(&run_id));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok((run_id, dir))
}

/// The fp16 baseline runs first so every later row can carry its perplexity delta.
fn baseline_first(mut schemes: Vec<KvScheme>) -> Vec<KvScheme> {
    schemes.dedup();
    if let Some(i) = schemes.iter().position(|s| *s == KvScheme::FP16) {
        let fp16 = schemes.remove(i);
        schemes.insert(0, fp16);
    }
    schemes
}

fn model_label(spec: &str, loc: &ModelLocation) -> String {
    match loc {
        ModelLocation::Gguf(p) => p
            .file_name()
            .map_or(spec.to_string(), |f| f.to_string_lossy().into_owned()),
        ModelLocation::Safetensors { repo: Some(r), .. } => r.clone(),
        ModelLocation::Safetensors { config, .. } => config
            .parent()
            .and_then(|p| p.file_name())
            .map_or(spec.to_string(), |f| f.to_string_lossy().into_owned()),
    }
}

struct BarProgress(ProgressBar);

impl Progress for BarProgress {
    fn start(&self, what: &str) {
        self.0.set_message(what.to_string());
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
}
