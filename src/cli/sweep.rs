//! `kvbench sweep`: the main job.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use crate::kv::KvScheme;
use crate::measure::shard::{self, Selection, Shard, ShardRecord, TaskLoad};
use crate::measure::sweep::{
    run_sweep, work_units, PhaseModels, Progress, QualityTasks, SweepSpec, SweepText, Work,
};
use crate::model::{self, hub, DeviceSpec, ModelLocation, WeightDtype};
use crate::quality::passkey::{self, PasskeySpec};
use crate::quality::perplexity::PplProtocol;
use crate::quality::wikitext;
use crate::quality::xsum::{self, RougeTask};
use crate::report::meta::{self, Machine, RunMeta, RunMode, RunStatus};
use crate::report::{table, RawRecords, ResultRow, RowContext, RunSink, CSV_COLUMNS};

use super::checks;
use super::suite;
use crate::measure::settings::SweepSettings;

/// Arguments of `kvbench sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// Read settings from a suite file (e.g. suites/quick.toml); flags given here override it.
    #[arg(long)]
    pub suite: Option<PathBuf>,

    /// Continue an interrupted sweep in this run folder with the settings it started with
    /// (from its meta.json); finished points are kept, the rest run.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,

    /// Every setting that changes a number (shared groups; also a suite's keys and
    /// `meta.json`'s `settings`).
    #[command(flatten)]
    pub settings: SweepSettings,

    /// Run folder (default: reports/<run-id>). A folder that already holds files is refused
    /// unless --resume continues it or --force moves it aside.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// With --out: move an existing, non-empty run folder aside to `<out>.old-<time>` and start
    /// a new run there.
    #[arg(long)]
    pub force: bool,

    /// Run only shard I of N (0-based: 0/4 … 3/4) of the sweep's work, split by estimated cost;
    /// `kvbench merge` joins the shards' folders. Default: Slurm's SLURM_ARRAY_TASK_ID of
    /// SLURM_ARRAY_TASK_COUNT inside a job array, else the whole sweep.
    #[arg(long, value_name = "I/N", conflicts_with = "shards")]
    pub shard: Option<Shard>,

    /// Split the sweep into N shards and run the one whose index is in JOB_COMPLETION_INDEX
    /// (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID.
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,
}

pub use crate::measure::settings::{parse_schemes, SchemeList};

/// Everything recorded in `meta.json`.
#[derive(serde::Serialize)]
struct Meta<'a> {
    /// What every run records, typed (read back by `report`, `--resume`, `merge`).
    #[serde(flatten)]
    run: RunMeta,
    model: ModelMeta,
    tokenizer: TokenizerMeta,
    sweep: &'a SweepSpec,
    perplexity: Option<PerplexityMeta<'a>>,
    generation_tasks: GenerationMeta,
    csv_columns: &'a [&'a str],
}

/// The generation tasks' fixed prompts and settings.
#[derive(serde::Serialize)]
struct GenerationMeta {
    weights: WeightDtype,
    decoding: &'static str,
    stop_tokens: Vec<u32>,
    rouge: Option<serde_json::Value>,
    passkey: Option<serde_json::Value>,
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

/// Settings from `--suite` or, with `--resume`, from the run folder's `meta.json`; flags given
/// on the command line win over a suite. Returns the points a resumed run already finished and
/// the earlier `meta.json`.
fn resolve_settings(
    args: &mut SweepArgs,
    matches: Option<&clap::ArgMatches>,
) -> anyhow::Result<(RawRecords, Option<serde_json::Value>)> {
    let from_cli = |id: &str| suite::given_on_cli(matches, id);
    if let Some(dir) = args.resume.clone() {
        if matches.is_some() {
            let cmd = <SweepArgs as clap::Args>::augment_args(clap::Command::new("sweep"));
            let extra: Vec<String> = cmd
                .get_arguments()
                .map(|a| a.get_id().as_str().to_string())
                .filter(|id| !["resume", "threads"].contains(&id.as_str()) && from_cli(id))
                .collect();
            if !extra.is_empty() {
                return Err(crate::Error::InvalidArgument {
                    name: "--resume".into(),
                    reason: format!(
                        "a resumed sweep keeps the settings it started with (in {}/meta.json); \
                         drop {}",
                        dir.display(),
                        extra
                            .iter()
                            .map(|id| format!("--{}", id.replace('_', "-")))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
                .into());
            }
        }
        let run = crate::report::summary::Run::read(&dir)?;
        refuse_merged(&dir, &run.meta)?;
        let recorded =
            run.meta["settings"]
                .as_object()
                .ok_or_else(|| crate::Error::InvalidArgument {
                    name: "--resume".into(),
                    reason: format!("{}/meta.json has no `settings`", dir.display()),
                })?;
        args.settings = args
            .settings
            .overlay(
                recorded,
                &format!("--resume: {}/meta.json", dir.display()),
                |id| id == "threads" && from_cli(id),
            )
            .map_err(|e| crate::Error::InvalidArgument {
                name: "--resume".into(),
                reason: format!("{}/meta.json has no usable settings: {e}", dir.display()),
            })?;
        args.out = Some(dir.clone());
        let done = crate::report::read_records(&dir)?;
        return Ok((done, Some(run.meta)));
    }
    if let Some(path) = &args.suite {
        suite::apply(&mut args.settings, path, from_cli)?;
    }
    Ok((RawRecords::default(), None))
}

/// `--resume` continues one sweep's (or one shard's) folder. A `kvbench merge` output is not
/// one: resumed, it ran the missing units as a whole sweep of its own and dropped `merged_from`
/// and `missing`, so the merged folder no longer said where its rows came from. The unfinished
/// shards are resumed instead, then merged again. Errors: [`crate::Error::InvalidArgument`]
/// (`--resume`) naming the folder, the shard folders to resume and the merge to re-run.
fn refuse_merged(dir: &std::path::Path, meta: &serde_json::Value) -> Result<(), crate::Error> {
    let Some(from) = meta.get("merged_from").and_then(|m| m.as_array()) else {
        return Ok(());
    };
    let shard_dirs: Vec<&str> = from.iter().filter_map(|s| s["dir"].as_str()).collect();
    let missing: Vec<&str> = meta["missing"]
        .as_array()
        .map(|m| m.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    Err(crate::Error::InvalidArgument {
        name: "--resume".into(),
        reason: format!(
            "{} was written by `kvbench merge` (status {}{}), not by a sweep: resume the shard \
             folders that did not finish (`kvbench sweep --resume <shard folder>`; run a missing \
             shard with `kvbench sweep --shard I/N`), then merge again with `kvbench merge \
             <every shard folder> --out {} --force` (merged here: {})",
            dir.display(),
            meta["status"].as_str().unwrap_or("unknown"),
            if missing.is_empty() {
                String::new()
            } else {
                format!("; missing: {}", missing.join("; "))
            },
            dir.display(),
            if shard_dirs.is_empty() {
                "unrecorded".to_string()
            } else {
                shard_dirs.join(" ")
            },
        ),
    })
}

/// Runs the sweep: `raw.jsonl` and `results.csv` grow as points finish; at the end
/// `summary.md` and `plots/` are written and the table printed.
pub fn run(mut args: SweepArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    let (done, earlier_meta) = resolve_settings(&mut args, matches)?;
    check_settings(&mut args)?;
    if earlier_meta.is_none() {
        if let Some(out) = &args.out {
            checks::prepare_out(out, args.force)?;
        }
    }
    if let Some(n) = args.settings.device.threads {
        // candle's CPU kernels size their pools from RAYON_NUM_THREADS; set it before any use.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .ok();
    }
    let device = args.settings.device.device.open()?;
    if args.settings.device.synthetic {
        return run_synthetic(args, done, earlier_meta);
    }
    let started_at = crate::util::time::now_rfc3339();
    let location = hub::resolve(&args.settings.model.model)?;
    let model_files = match &location {
        ModelLocation::Gguf(p) => vec![p.clone()],
        ModelLocation::Safetensors { weights, .. } => weights.clone(),
    };
    let sha256 = model_files
        .iter()
        .map(|f| model::fetch::sha256_file(f))
        .collect::<Result<Vec<_>, _>>()?;
    if let (Some(m), Some(dir)) = (&earlier_meta, &args.resume) {
        checks::check_resume(dir, m, &checks::resume_identity(sha256.clone()))?;
    }
    // One load per distinct weight dtype; phases that share a dtype share the model.
    let mut loaded: HashMap<WeightDtype, model::LoadedModel> = HashMap::new();
    for dtype in [
        args.settings.weights.weights,
        args.settings.weights.prefill_weights,
        args.settings.weights.ppl_weights,
    ] {
        if let std::collections::hash_map::Entry::Vacant(e) = loaded.entry(dtype) {
            let m = model::load_location_on(&args.settings.model.model, &location, dtype, &device)
                .with_context(|| {
                    format!(
                        "loading model `{}` with {dtype} weights on {}",
                        args.settings.model.model, args.settings.device.device
                    )
                })?;
            e.insert(m);
        }
    }
    let timing = &loaded[&args.settings.weights.weights];
    let models = PhaseModels {
        prefill: &loaded[&args.settings.weights.prefill_weights].model,
        decode: &timing.model,
        quality: &loaded[&args.settings.weights.ppl_weights].model,
    };
    let cfg = timing.model.config.clone();
    let tokens = timing.tokenizer.encode(wikitext::wikitext2_test_text())?;
    let available_windows = tokens.len() / args.settings.perplexity.ctx.max(1);
    if args.settings.perplexity.ppl_windows > available_windows && available_windows > 0 {
        eprintln!(
            "note: --ppl-windows {}: the text holds {available_windows} windows of {} tokens; \
             perplexity uses those {available_windows}",
            args.settings.perplexity.ppl_windows, args.settings.perplexity.ctx
        );
    }

    let ppl = (args.settings.perplexity.ppl_windows > 0).then_some(PplProtocol {
        mode: args.settings.perplexity.ppl_mode,
        batch: args.settings.perplexity.ppl_batch,
        ctx: args.settings.perplexity.ctx,
        windows: Some(args.settings.perplexity.ppl_windows),
        scoring: args.settings.perplexity.ppl_score,
        bos: timing.tokenizer.add_bos,
        exact_attention: true,
    });
    if let Some(p) = &ppl {
        p.validate(cfg.max_ctx, tokens.len())?;
    }
    let spec = SweepSpec {
        schemes: baseline_first(args.settings.schemes.dtypes.0.clone()),
        batch_sizes: args.settings.grid.batch_sizes.clone(),
        seq_lens: args.settings.grid.seq_lens.clone(),
        gen: args.settings.grid.gen,
        ppl: ppl.clone(),
        seed: args.settings.timing.seed,
        warmup: args.settings.timing.warmup,
        repeats: args.settings.timing.repeats,
        min_time_s: args.settings.timing.min_time,
        kl: !args.settings.perplexity.no_kl,
        rouge_samples: args.settings.rouge.rouge_samples,
        passkey: (!args.settings.passkey.passkey_lengths.is_empty()).then(|| PasskeySpec {
            lengths: args.settings.passkey.passkey_lengths.clone(),
            depths: args.settings.passkey.passkey_depths.clone(),
            trials: args.settings.passkey.passkey_trials,
            seed: args.settings.timing.seed,
        }),
        ppl_noise_floor: args.settings.perplexity.ppl_noise_floor,
    };
    spec.validate(cfg.max_ctx, tokens.len())?;
    for s in &spec.schemes {
        s.validate(cfg.head_dim)?;
    }
    let quality_tok = &loaded[&args.settings.weights.ppl_weights].tokenizer;
    let tasks = QualityTasks {
        tokenizer: quality_tok,
        stop: quality_tok.stop_tokens(),
        rouge: (args.settings.rouge.rouge_samples > 0)
            .then(|| {
                RougeTask::new(
                    quality_tok,
                    args.settings.rouge.rouge_samples,
                    args.settings.rouge.rouge_doc_tokens,
                    args.settings.rouge.rouge_max_new,
                )
            })
            .transpose()?,
        passkey: match &spec.passkey {
            Some(p) => passkey::prompts(quality_tok, p)?,
            None => Vec::new(),
        },
    };
    if let Some(max) = tasks.passkey.iter().map(|p| p.tokens.len()).max() {
        if max + 8 > cfg.max_ctx {
            return Err(crate::Error::InvalidArgument {
                name: "--passkey-lengths".into(),
                reason: format!("{max} tokens exceed the model's context {}", cfg.max_ctx),
            }
            .into());
        }
    }

    let load = TaskLoad {
        prompt_tokens: tasks
            .rouge
            .iter()
            .flat_map(|r| &r.prompts)
            .map(Vec::len)
            .sum::<usize>()
            + tasks.passkey.iter().map(|p| p.tokens.len()).sum::<usize>(),
        new_tokens: tasks
            .rouge
            .as_ref()
            .map_or(0, |r| r.prompts.len() * r.max_new)
            + tasks.passkey.len() * 8,
    };
    let has_quality = ppl.is_some() || tasks.units() > 0;
    let sharding = sharded(&args, earlier_meta.as_ref(), &spec, has_quality, load)?;

    let label = model_label(&args.settings.model.model, &location);
    let folder = RunFolder::open(
        &started_at,
        label.trim_end_matches(".gguf"),
        &args.out,
        earlier_meta.as_ref(),
    )?;

    let geom = cfg.cache_geometry();
    let row_ctx = RowContext {
        run_id: folder.run_id.clone(),
        model: label,
        prefill_weight_dtype: args.settings.weights.prefill_weights.to_string(),
        decode_weight_dtype: args.settings.weights.weights.to_string(),
        ppl_weight_dtype: args.settings.weights.ppl_weights.to_string(),
        ppl_ctx: ppl.as_ref().map(|p| p.ctx),
        ppl_ci: args.settings.perplexity.ppl_ci,
        geometry: geom,
        decode_weight_bytes: Some(loaded[&args.settings.weights.weights].model.weight_bytes()),
    };
    let mut meta = Meta {
        run: RunMeta {
            format: meta::META_FORMAT,
            kvbench: meta::version(),
            run_id: folder.run_id.clone(),
            mode: RunMode::Model,
            command: super::command_line(),
            started_at: folder.started_at.clone(),
            finished_at: None,
            status: Some(RunStatus::Running),
            machine: Machine::probe(),
            resumed_at: folder.resumed_at.clone(),
            shard: sharding.1.clone(),
            settings: args.settings.recorded(checks::logical_cpus()),
            report_context: row_ctx.clone(),
            details: Default::default(),
        },
        model: ModelMeta {
            source: timing.source.clone(),
            sha256,
            config: cfg.clone(),
            weight_dtype_prefill: args.settings.weights.prefill_weights,
            weight_dtype_decode: args.settings.weights.weights,
            weight_dtype_perplexity: args.settings.weights.ppl_weights,
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
        generation_tasks: GenerationMeta {
            weights: args.settings.weights.ppl_weights,
            decoding: "greedy, batch 1, K/V in the scheme under test",
            stop_tokens: tasks.stop.clone(),
            rouge: tasks.rouge.as_ref().map(|r| {
                serde_json::json!({
                    "dataset": "XSum test (datasets/xsum/xsum_test_100.jsonl), first N pairs",
                    "samples": r.prompts.len(),
                    "prompt": xsum::PROMPT,
                    "chat_template": quality_tok.chat_template.is_some(),
                    "document_tokens": args.settings.rouge.rouge_doc_tokens,
                    "max_new_tokens": r.max_new,
                    "scorer": "rouge-score 0.1.2 semantics, use_stemmer=True",
                })
            }),
            passkey: spec.passkey.as_ref().map(|p| {
                serde_json::json!({
                    "spec": p,
                    "prefix": passkey::PREFIX,
                    "filler": passkey::FILLER,
                    "needle": passkey::NEEDLE,
                    "question": passkey::QUESTION,
                    "max_new_tokens": 8,
                    "correct": "first integer of the continuation equals the key",
                })
            }),
        },
        csv_columns: CSV_COLUMNS,
    };
    let meta_path = folder.dir.join(crate::report::META_FILE);
    meta::write_json(&meta_path, &meta)?;

    let bar = progress_bar(work_units(
        sharding.0.units(),
        args.settings.perplexity.ppl_windows + tasks.units(),
    ));
    let mut sink =
        RunSink::create(&folder.dir, row_ctx.clone(), done.clone())?.on_row(print_row(bar.clone()));
    let result = run_sweep(
        models,
        SweepText {
            tokens: &tokens,
            bos: timing.tokenizer.bos,
            tasks: Some(&tasks),
        },
        &spec,
        Work {
            selection: &sharding.0,
            done: &done.points,
            done_quality: &done.quality,
        },
        &mut sink,
        &BarProgress::new(bar.clone()),
    );
    bar.finish_and_clear();
    meta.run.finished_at = Some(crate::util::time::now_rfc3339());
    let all_failed = sink.tally().all_failed();
    meta.run.status = Some(if result.is_ok() && !all_failed {
        RunStatus::Finished
    } else {
        RunStatus::Failed
    });
    meta::write_json(&meta_path, &meta)?;
    result?;
    finish(&folder.dir, "kvbench sweep")?;
    every_point_failed(sink.tally())
}

/// A sweep in which no point succeeded is a failure (exit 1), whatever was written.
fn every_point_failed(tally: &crate::report::Tally) -> anyhow::Result<()> {
    match &tally.first_failure {
        Some((scheme, batch, seq, status)) if tally.all_failed() => anyhow::bail!(
            "every point of the sweep failed ({} of {}); the first: {scheme} batch {batch} seq \
             {seq}: {status}",
            tally.failed,
            tally.points,
        ),
        _ => Ok(()),
    }
}

/// The checks `kvbench sweep` makes on its settings before anything slow (fetching, loading):
/// [`check_args`], whether this build can hold the caches on the device ([`kv_caches_on`]),
/// and the sweep spec's bounds ([`SweepSpec::validate`] without a model; the model's context
/// and the text's length are checked once it is loaded). `kvbench slurm` runs the same checks
/// before it writes or submits anything. Errors: [`crate::Error::InvalidArgument`] naming the
/// flag.
pub(crate) fn check_settings(args: &mut SweepArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let s = &args.settings;
    kv_caches_on(&s.device.device, s.device.synthetic)?;
    let mut spec = SweepSpec::timing_only(
        s.schemes.dtypes.0.clone(),
        s.grid.batch_sizes.clone(),
        s.grid.seq_lens.clone(),
        s.grid.gen,
        s.timing.seed,
    );
    // Checked for a synthetic sweep too, though it times one repeat: every value is recorded
    // in meta.json, which must read back (a NaN `--min-time` was written as null and the
    // folder could not be reported or resumed).
    spec.warmup = s.timing.warmup;
    spec.repeats = s.timing.repeats;
    spec.min_time_s = s.timing.min_time;
    spec.ppl_noise_floor = s.perplexity.ppl_noise_floor;
    spec.validate(usize::MAX, usize::MAX)?;
    Ok(())
}

/// Checks and normalizes the flags before anything slow: `--threads` bounded, `--memory-limit`
/// only with `--synthetic`, repeated list entries merged with a note, warm-up and repeat counts
/// bounded. Errors: [`crate::Error::InvalidArgument`] naming the flag.
fn check_args(args: &mut SweepArgs) -> anyhow::Result<()> {
    checks::check_threads(args.settings.device.threads)?;
    if args.settings.device.memory_limit.is_some() && !args.settings.device.synthetic {
        return Err(crate::Error::InvalidArgument {
            name: "--memory-limit".into(),
            reason: "applies to --synthetic sweeps only (a model sweep records a point that \
                     does not fit in the memory available as `oom`); drop it or add --synthetic"
                .into(),
        }
        .into());
    }
    if let Some(m) = &args.settings.device.memory_limit {
        crate::plan::parse_bytes(m).map_err(|_| crate::Error::InvalidArgument {
            name: "--memory-limit".into(),
            reason: format!("`{m}` is not a size like 16GiB or 512MiB"),
        })?;
    }
    checks::dedup_with_note("--batch-sizes", &mut args.settings.grid.batch_sizes);
    checks::dedup_with_note("--seq-lens", &mut args.settings.grid.seq_lens);
    checks::dedup_with_note("--dtypes", &mut args.settings.schemes.dtypes.0);
    let points = args.settings.schemes.dtypes.0.len()
        * args.settings.grid.batch_sizes.len()
        * args.settings.grid.seq_lens.len();
    checks::check_repeats(
        args.settings.timing.warmup,
        args.settings.timing.repeats,
        points,
        args.settings.grid.gen,
    )?;
    Ok(())
}

/// Whether this build can hold the sweep's KV caches on `device`: every cache the sweep makes
/// (timing points, perplexity, generation) is a [`crate::kv::AnyCache`] on the model's device,
/// CUDA caches only in a build with the `cuda` feature; `--synthetic` sweeps are CPU-only
/// (use `kvbench attn-bench --device cuda:N` for attention-only GPU timings).
///
/// Errors: [`crate::Error::InvalidArgument`] (`--device`) otherwise.
fn kv_caches_on(device: &DeviceSpec, synthetic: bool) -> Result<(), crate::Error> {
    match device {
        DeviceSpec::Cpu => Ok(()),
        DeviceSpec::Cuda(_) if !cfg!(feature = "cuda") => Err(crate::Error::InvalidArgument {
            name: "--device".into(),
            reason: format!(
                "`{device}` needs a kvbench built with CUDA support; rebuild with \
                 `cargo build --release --features cuda`, or pass --device cpu"
            ),
        }),
        DeviceSpec::Cuda(_) if synthetic => Err(crate::Error::InvalidArgument {
            name: "--device".into(),
            reason: format!(
                "`{device}` with --synthetic: the synthetic sweep runs on the CPU; for \
                 attention-only timings on the GPU use `kvbench attn-bench --device {device}`"
            ),
        }),
        DeviceSpec::Cuda(_) => Ok(()),
    }
}

/// The units this process runs: one shard's (from `--shard`, `--shards` with the scheduler's
/// index, a Slurm array's environment, or, when resuming, the folder's `meta.json`) with the
/// record for `meta.json`, or all of them.
fn sharded(
    args: &SweepArgs,
    earlier_meta: Option<&serde_json::Value>,
    spec: &SweepSpec,
    quality: bool,
    load: TaskLoad,
) -> anyhow::Result<(Selection, Option<ShardRecord>)> {
    let shard = match earlier_meta {
        // A resumed shard stays the shard it was, whatever the environment says now.
        Some(m) => serde_json::from_value::<Option<ShardRecord>>(m["shard"].clone())
            .ok()
            .flatten()
            .map(|r| r.shard()),
        None => Shard::resolve(args.shard, args.shards, |k| std::env::var(k).ok())?,
    };
    let units = shard::plan(spec, quality);
    let Some(shard) = shard else {
        return Ok((Selection::new(units), None));
    };
    let costs: Vec<f64> = units.iter().map(|u| shard::cost(u, spec, load)).collect();
    let plan = shard::assign(&units, &costs, shard.count)?;
    let mine: Vec<_> = plan
        .iter()
        .filter(|a| a.shard == shard.index)
        .map(|a| a.unit)
        .collect();
    eprintln!(
        "shard {shard}: {} of the sweep's {} units (timing points and per-scheme quality)",
        mine.len(),
        units.len()
    );
    let record = ShardRecord {
        index: shard.index,
        count: shard.count,
        host: Machine::probe().hostname,
        plan,
    };
    Ok((Selection::new(mine), Some(record)))
}

/// Renders the finished run folder (the same code as `kvbench report`) and prints its table.
pub(crate) fn finish(dir: &std::path::Path, title: &str) -> anyhow::Result<()> {
    let run = crate::report::summary::Run::read(dir)?;
    let about = crate::report::summary::about(&run);
    let summary = crate::report::summary::write_report(
        dir,
        &format!("{title} — {}", run.caption().model),
        &about,
        &run.rows,
        &run.passkey,
        &run.caption(),
    )?;
    print!("{}", table::render(&run.rows));
    for line in &about {
        println!("{line}");
    }
    for w in crate::report::summary::warnings(&run.rows) {
        eprintln!("warning: {w}");
    }
    println!(
        "wrote {} ({}, {}, {}, {}/)",
        dir.display(),
        crate::report::RAW_FILE,
        crate::report::CSV_FILE,
        summary
            .file_name()
            .map_or("".into(), |f| f.to_string_lossy()),
        crate::report::PLOTS_DIR
    );
    Ok(())
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("static template"),
    );
    bar
}

/// Prints each finished point above the progress bar (or to stderr when the bar is hidden, as
/// in CI logs, where it would swallow the line).
fn print_row(printer: ProgressBar) -> impl FnMut(&ResultRow) + 'static {
    move |r| {
        let line = format!(
            "{:<12} batch {:>3} seq {:>5}: {}",
            r.scheme,
            r.batch_size,
            r.seq_len,
            match r.tpot.mean {
                Some(tpot) => format!(
                    "{}TPOT {tpot:.2} ms, {:.1} tokens/s",
                    r.ttft
                        .p50
                        .map_or(String::new(), |t| format!("TTFT {t:.1} ms, ")),
                    r.decode_tokens_per_s.unwrap_or(f64::NAN)
                ),
                None => r.status.to_string(),
            }
        );
        if printer.is_hidden() {
            eprintln!("{line}");
        } else {
            printer.println(line);
        }
    }
}

/// `--synthetic`: geometry only, attention + append timed on synthetic K/V.
fn run_synthetic(
    args: SweepArgs,
    done: RawRecords,
    earlier_meta: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    let started_at = crate::util::time::now_rfc3339();
    let model = crate::model::geometry::for_model_arg(&args.settings.model.model)?;
    let geom = model.cache();
    if let (Some(m), Some(dir)) = (&earlier_meta, &args.resume) {
        checks::check_resume(dir, m, &checks::resume_identity(Vec::new()))?;
    }
    let memory_limit = match &args.settings.device.memory_limit {
        Some(m) => crate::plan::parse_bytes(m)?,
        None => crate::util::memory::available_bytes().unwrap_or(u64::MAX),
    };
    let spec = SweepSpec::timing_only(
        baseline_first(args.settings.schemes.dtypes.0.clone()),
        args.settings.grid.batch_sizes.clone(),
        args.settings.grid.seq_lens.clone(),
        args.settings.grid.gen,
        args.settings.timing.seed,
    );
    spec.validate(usize::MAX, usize::MAX)?;
    let sharding = sharded(
        &args,
        earlier_meta.as_ref(),
        &spec,
        false,
        TaskLoad::default(),
    )?;
    let folder = RunFolder::open(
        &started_at,
        &format!("synthetic-{}", model.name),
        &args.out,
        earlier_meta.as_ref(),
    )?;
    let row_ctx = RowContext {
        run_id: folder.run_id.clone(),
        model: format!("{} (synthetic)", model.name),
        prefill_weight_dtype: "none".into(),
        decode_weight_dtype: "none".into(),
        ppl_weight_dtype: "none".into(),
        ppl_ctx: None,
        ppl_ci: Default::default(),
        geometry: geom,
        decode_weight_bytes: None,
    };
    let details = serde_json::json!({
        "mode_description": "attention + append only, synthetic K/V (outlier key channels), no weights",
        "model_geometry": model,
        "memory_limit_bytes": memory_limit,
        "sweep": spec,
        "csv_columns": CSV_COLUMNS,
    });
    let mut meta_value = RunMeta {
        format: meta::META_FORMAT,
        kvbench: meta::version(),
        run_id: folder.run_id.clone(),
        mode: RunMode::Synthetic,
        command: super::command_line(),
        started_at: folder.started_at.clone(),
        finished_at: None,
        status: Some(RunStatus::Running),
        machine: Machine::probe(),
        resumed_at: folder.resumed_at.clone(),
        shard: sharding.1.clone(),
        settings: args.settings.recorded(checks::logical_cpus()),
        report_context: row_ctx.clone(),
        details: match details {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("a JSON object"),
        },
    };
    let meta_path = folder.dir.join(crate::report::META_FILE);
    meta::write_json(&meta_path, &meta_value)?;
    let bar = progress_bar(work_units(sharding.0.units(), 0));
    let mut sink =
        RunSink::create(&folder.dir, row_ctx, done.clone())?.on_row(print_row(bar.clone()));
    let result = crate::measure::synthetic::run_synthetic(
        &geom,
        &spec,
        memory_limit,
        &sharding.0,
        &done.points,
        &mut sink,
        &BarProgress::new(bar.clone()),
    );
    bar.finish_and_clear();
    // As a model sweep: where the run stands, so `merge` can tell a finished shard (issue #25:
    // a synthetic meta.json had no status, and one edited to `running` merged).
    meta_value.finished_at = Some(crate::util::time::now_rfc3339());
    meta_value.status = Some(if result.is_ok() && !sink.tally().all_failed() {
        RunStatus::Finished
    } else {
        RunStatus::Failed
    });
    meta::write_json(&meta_path, &meta_value)?;
    result?;
    finish(&folder.dir, "kvbench sweep --synthetic")?;
    every_point_failed(sink.tally())?;
    println!(
        "model geometry {} ({} layers × {} kv heads × {}), synthetic K/V, TPOT = append + attention only, memory limit {:.2} GiB, {} threads",
        model.name, geom.layers, geom.kv_heads, geom.head_dim,
        memory_limit as f64 / (1u64 << 30) as f64, rayon::current_num_threads()
    );
    Ok(())
}

/// A run folder: its id, when it started, when it was resumed, and the path.
struct RunFolder {
    run_id: String,
    started_at: String,
    resumed_at: Vec<String>,
    dir: PathBuf,
    /// This process's claim on the folder, released when the sweep ends.
    _lock: crate::report::run_dir::FolderLock,
}

impl RunFolder {
    /// A new folder (`--out`, else `reports/<run id>`, run id `<UTC time>-<label>`), or, when
    /// resuming, the existing one with its original id and start time.
    fn open(
        now: &str,
        label: &str,
        out: &Option<PathBuf>,
        earlier: Option<&serde_json::Value>,
    ) -> anyhow::Result<RunFolder> {
        if let (Some(m), Some(dir)) = (earlier, out) {
            let mut resumed_at: Vec<String> =
                serde_json::from_value(m["resumed_at"].clone()).unwrap_or_default();
            resumed_at.push(now.to_string());
            return Ok(RunFolder {
                run_id: m["run_id"].as_str().unwrap_or(label).to_string(),
                started_at: m["started_at"].as_str().unwrap_or(now).to_string(),
                resumed_at,
                dir: dir.clone(),
                _lock: crate::report::run_dir::FolderLock::acquire(dir, "--resume")?,
            });
        }
        let (run_id, dir) = run_folder(now, label, out)?;
        let lock = crate::report::run_dir::FolderLock::acquire_empty(&dir, "--out")?;
        Ok(RunFolder {
            run_id,
            started_at: now.to_string(),
            resumed_at: Vec::new(),
            dir,
            _lock: lock,
        })
    }
}

/// The run id (`<UTC time>-<label>`) and its folder (`--out`, else `reports/<run id>`),
/// created.
fn run_folder(
    started_at: &str,
    label: &str,
    out: &Option<PathBuf>,
) -> anyhow::Result<(String, PathBuf)> {
    let run_id = crate::util::time::run_id(started_at, label);
    let dir = out
        .clone()
        .unwrap_or_else(|| PathBuf::from("reports").join(&run_id));
    // `--out` was checked (and with --force emptied) at start; files there now were written
    // by another process meanwhile: two runs must not share a folder.
    if out.is_some() && checks::non_empty(&dir) {
        return Err(crate::Error::InvalidArgument {
            name: "--out".into(),
            reason: format!(
                "{} received files after this run checked it at start: another kvbench run is \
                 writing there; give each run its own --out",
                dir.display()
            ),
        }
        .into());
    }
    // A default folder taken meanwhile.
    checks::prepare_out(&dir, false)?;
    checks::create_out(&dir)?;
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

/// The progress bar on a terminal; without one (CI logs, `nohup`, a pipe) plain lines on
/// stderr: one when a unit of work starts, and at most every [`PLAIN_PROGRESS_EVERY`] while it
/// runs, with the units done and an estimate of the time left.
struct BarProgress(ProgressBar, std::sync::Mutex<Option<std::time::Instant>>);

impl BarProgress {
    fn new(bar: ProgressBar) -> Self {
        BarProgress(bar, std::sync::Mutex::new(None))
    }

    fn plain_line(&self, what: &str) {
        let (pos, len) = (self.0.position(), self.0.length().unwrap_or(0));
        let elapsed = self.0.elapsed();
        let left = if pos > 0 && len > pos {
            let s = elapsed.as_secs_f64() / pos as f64 * (len - pos) as f64;
            format!(
                ", about {} left",
                humantime::format_duration(std::time::Duration::from_secs(s as u64))
            )
        } else {
            String::new()
        };
        eprintln!(
            "progress: {pos}/{len} units, {} elapsed{left}{}{what}",
            humantime::format_duration(std::time::Duration::from_secs(elapsed.as_secs())),
            if what.is_empty() { "" } else { ": " }
        );
        if let Ok(mut last) = self.1.lock() {
            *last = Some(std::time::Instant::now());
        }
    }
}

/// How often a long unit of work prints a plain progress line when there is no terminal.
const PLAIN_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl Progress for BarProgress {
    fn start(&self, what: &str) {
        self.0.set_message(what.to_string());
        if self.0.is_hidden() {
            self.plain_line(what);
        }
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
        if self.0.is_hidden() {
            let due = self
                .1
                .lock()
                .map(|l| l.is_none_or(|t| t.elapsed() >= PLAIN_PROGRESS_EVERY))
                .unwrap_or(false);
            if due {
                self.plain_line(&self.0.message());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `--out` folder that another process filled after this run's start-up check (two runs
    /// given the same folder) is refused with that cause, not with advice to pass `--force`.
    #[test]
    fn out_filled_after_the_start_check_is_refused() {
        let dir = std::env::temp_dir().join(format!("kvbench-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("raw.jsonl"), "{}\n").unwrap();
        let e = run_folder("2026-12-01T00:00:00Z", "m", &Some(dir.clone()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("another kvbench run") && !e.contains("--force"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
