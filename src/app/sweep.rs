//! `kvbench sweep` end to end: settings (a suite, or a resumed folder's) → [`SweepPlan`] → the
//! model in each phase's weights → the generation tasks → the shard's units → run folder and
//! `meta.json` → [`run_sweep`] (or the synthetic runner) writing through [`RunSink`] →
//! `meta.json` finished → the report rendered and printed.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use crate::measure::memory_plan::{MemoryPlan, PhaseAsk, WeightChoice};
use crate::measure::plan::SweepPlan;
use crate::measure::settings::SweepSettings;
use crate::measure::shard::{Shard, ShardArgs, ShardRecord, TaskLoad};
use crate::measure::sweep::{run_sweep, PhaseModels, QualityTasks, SweepSpec, SweepText, Work};
use crate::model::{self, hub, ModelLocation, WeightDtype};
use crate::quality::passkey;
use crate::quality::wikitext;
use crate::quality::xsum::RougeTask;
use crate::report::meta::{self, Machine, RunKind, RunMode};
use crate::report::run_dir::{check_resume, prepare_out, resume_identity, RunDir, RunDirArgs};
use crate::report::SweepMeta;
use crate::report::{read_records, table, RawRecords, ResultRow, RowContext, RunSink, Tally};

use super::memory::{self, PeakLoad};
use super::{
    model_files, open_folder, print_above, progress_bar, resolve_settings, set_threads, BarProgress,
};

/// Arguments of `kvbench sweep`: the run folder's flags, the settings (also a suite's keys and
/// `meta.json`'s `settings`) and the shard to run.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// `--suite`, `--resume`, `--out`, `--force`.
    #[command(flatten)]
    pub run: RunDirArgs,
    /// Every setting that changes a number.
    #[command(flatten)]
    pub settings: SweepSettings,
    /// `--shard`, `--shards`.
    #[command(flatten)]
    pub shard: ShardArgs,
}

/// What a run continues from: the resumed folder's `meta.json` and finished records.
struct Earlier {
    meta: Option<serde_json::Value>,
    done: RawRecords,
}

/// Runs `kvbench sweep` with `settings` into the folder `run` chooses, the shard `shard` names
/// (`matches`: the subcommand's, to tell flags given from defaults). `raw.jsonl` and
/// `results.csv` grow as points finish; at the end `summary.md` and `plots/` are written and
/// the table printed. Errors: usage errors ([`crate::Error::InvalidArgument`], exit 2) for bad
/// settings, folders and models; runtime errors for I/O, and when every point failed.
pub fn run(
    mut settings: SweepSettings,
    mut run: RunDirArgs,
    shard: ShardArgs,
    matches: Option<&clap::ArgMatches>,
) -> anyhow::Result<()> {
    let resumed = resolve_settings(&mut settings, &mut run, matches)?;
    if let Some(r) = &resumed {
        refuse_merged(&r.dir, &r.meta)?;
    }
    let plan = SweepPlan::check(&settings)?;
    if resumed.is_none() {
        if let Some(out) = &run.out {
            prepare_out(out, run.force)?;
        }
    }
    set_threads(plan.settings.threads.threads)?;
    let device = plan.settings.device.device.open()?;
    let shard = match &resumed {
        // A resumed shard stays the shard it was, whatever the environment says now.
        Some(r) => serde_json::from_value::<Option<ShardRecord>>(r.meta["shard"].clone())
            .ok()
            .flatten()
            .map(|r| r.shard()),
        None => Shard::resolve(shard.shard, shard.shards, |k| std::env::var(k).ok())?,
    };
    let earlier = Earlier {
        done: match &resumed {
            Some(r) => finished_records(&r.dir, run.rerun_contended)?,
            None => RawRecords::default(),
        },
        meta: resumed.map(|r| r.meta),
    };
    if plan.settings.synthetic.synthetic {
        return synthetic(&plan, &run, earlier, shard);
    }
    let location = hub::resolve(&plan.settings.model.model)?;
    let weights = plan_weights(&location, &device, &plan)?;
    let (_, sha256) = model_files(&location)?;
    let models = load_models(&plan.settings, &weights, &location, &device)?;
    let m = Models::new(&weights, &models);
    let cfg = m.timing.model.config.clone();
    let tokens = m.timing.tokenizer.encode(wikitext::wikitext2_test_text())?;
    // llama-perplexity's stream starts with BOS for models that add one (see `cut_windows`).
    let bos_lead = usize::from(m.timing.tokenizer.add_bos && m.timing.tokenizer.bos.is_some());
    note_windows(&plan.settings, tokens.len() + bos_lead);
    let spec = plan.for_model(
        cfg.max_ctx,
        cfg.head_dim,
        tokens.len(),
        m.timing.tokenizer.add_bos,
    )?;
    let tasks = quality_tasks(&plan.settings, &spec, m.quality, cfg.max_ctx)?;
    let quality = spec.ppl.is_some() || tasks.units() > 0;
    let (selection, record) = SweepPlan::select(
        &spec,
        shard,
        quality,
        task_load(&tasks),
        Machine::probe().hostname,
    )?;
    let label = model_label(&plan.settings.model.model, &location);
    let folder = open_folder(&run, earlier.meta.as_ref(), label.trim_end_matches(".gguf"))?;
    if let Some(meta) = &earlier.meta {
        check_resume(&folder.dir, meta, &resume_identity(sha256.clone()))?;
    }
    let row_ctx = RowContext {
        run_id: folder.run_id.clone(),
        model: label,
        prefill_weight_dtype: weights.dtype("prefill").to_string(),
        decode_weight_dtype: weights.dtype("decode").to_string(),
        ppl_weight_dtype: weights.dtype("perplexity").to_string(),
        ppl_ctx: spec.ppl.as_ref().map(|p| p.ctx),
        ppl_ci: plan.settings.perplexity.ppl_ci,
        geometry: cfg.cache_geometry(),
        decode_weight_bytes: Some(m.timing.model.weight_bytes()),
        read_gb_s: probe_read_bandwidth(&device),
    };
    let run_meta = run_meta(&folder, &plan.settings, RunMode::Model, record, row_ctx);
    let details = details::model(
        &plan.settings,
        &spec,
        &m,
        &tasks,
        (sha256, &weights),
        tokens.len(),
    );
    let cost = selection
        .units()
        .iter()
        .map(|u| spec.unit_cost(u, Some(&tasks)));
    let bar = progress_bar(cost.sum());
    let mut exec = Execution::start(folder, run_meta, details, &earlier.done, &bar)?;
    let result = run_sweep(
        PhaseModels {
            prefill: &m.prefill.model,
            decode: &m.timing.model,
            quality: &m.quality.model,
        },
        SweepText {
            tokens: &tokens,
            bos: m.timing.tokenizer.bos,
            tasks: Some(&tasks),
        },
        &spec,
        Work {
            selection: &selection,
            done: &earlier.done.points,
            done_quality: &earlier.done.quality,
        },
        &mut exec.sink,
        &BarProgress::new(bar.clone()),
    );
    bar.finish_and_clear();
    exec.finish(result, "kvbench sweep")
}

/// The read bandwidth the CPU gives kvbench's thread pool now, GB/s (the standard probe,
/// [`crate::measure::bandwidth::probe`]), printed as a note; `None` on a GPU, where the floor
/// is the device's.
fn probe_read_bandwidth(device: &candle_core::Device) -> Option<f64> {
    if !device.is_cpu() {
        return None;
    }
    let r = crate::measure::bandwidth::probe()?;
    eprintln!(
        "note: read bandwidth {:.1} GB/s (best of {} passes over {} MiB on {} \
         threads, median {:.1}): each point's tpot_vs_floor is its median TPOT over (decode \
         weights + KV held) ÷ this rate",
        r.best_gb_s,
        crate::measure::bandwidth::PROBE_PASSES,
        r.bytes >> 20,
        r.threads,
        r.median_gb_s
    );
    Some(r.best_gb_s)
}

/// The finished records of the resumed folder `dir`, less its contended points when
/// `rerun_contended` (`--rerun-contended`: they run again). Errors: as [`read_records`].
fn finished_records(dir: &Path, rerun_contended: bool) -> crate::Result<RawRecords> {
    let mut done = read_records(dir)?;
    if rerun_contended {
        let n = done.drop_contended();
        eprintln!(
            "--rerun-contended: {n} finished point(s) of {} were timed on a busy machine; \
             measuring them again",
            dir.display()
        );
    }
    Ok(done)
}

/// `--resume` continues one sweep's (or one shard's) folder. A `kvbench merge` output is not
/// one: resumed, it ran the missing units as a whole sweep of its own and dropped `merged_from`
/// and `missing`, so the merged folder no longer said where its rows came from. The unfinished
/// shards are resumed instead, then merged again. Errors: [`crate::Error::InvalidArgument`]
/// (`--resume`) naming the folder, the shard folders to resume and the merge to re-run.
fn refuse_merged(dir: &Path, meta: &serde_json::Value) -> Result<(), crate::Error> {
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

/// The memory plan for the sweep's phases at its largest point (see [`memory::plan_weights`]):
/// decode in `--weights`, prefill and perplexity as asked or `auto`; perplexity runs when there
/// are windows or generation tasks. Errors: its refusals (exit 2).
fn plan_weights(
    location: &ModelLocation,
    device: &candle_core::Device,
    plan: &SweepPlan,
) -> anyhow::Result<MemoryPlan> {
    let s = &plan.settings;
    let quality = s.perplexity.ppl_windows > 0
        || s.rouge.rouge_samples > 0
        || !s.passkey.passkey_lengths.is_empty();
    let phase = |phase, flag, choice, runs| PhaseAsk {
        phase,
        flag,
        choice,
        runs,
    };
    let phases = vec![
        phase(
            "decode",
            "--weights",
            WeightChoice::Fixed(s.weights.weights),
            true,
        ),
        phase(
            "prefill",
            "--prefill-weights",
            s.weights.prefill_weights,
            true,
        ),
        phase(
            "perplexity",
            "--ppl-weights",
            s.perplexity.ppl_weights,
            quality,
        ),
    ];
    let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
    let peak = PeakLoad {
        schemes: plan.spec.schemes.clone(),
        batch: max(&s.grid.batch_sizes),
        prompt: max(&s.grid.seq_lens).max(max(&s.passkey.passkey_lengths)),
        gen: s.grid.gen,
        ppl_ctx: if quality { s.perplexity.ctx } else { 0 },
        kv_bytes: None,
    };
    Ok(memory::plan_weights(location, device, phases, &peak)?)
}

/// The model loaded once per distinct weight dtype of the plan's phases (phases that share a
/// dtype share the model; models of one file share its mapped pages). Errors: the loader's,
/// with the model, dtype and device named.
fn load_models(
    s: &SweepSettings,
    weights: &MemoryPlan,
    location: &ModelLocation,
    device: &candle_core::Device,
) -> anyhow::Result<HashMap<WeightDtype, model::LoadedModel>> {
    let mut loaded = HashMap::new();
    for (_, dtype) in &weights.weights {
        if let std::collections::hash_map::Entry::Vacant(e) = loaded.entry(*dtype) {
            let m = model::load_location_on(&s.model.model, location, *dtype, device)
                .with_context(|| {
                    format!(
                        "loading model `{}` with {dtype} weights on {}",
                        s.model.model, s.device.device
                    )
                })?;
            e.insert(m);
        }
    }
    Ok(loaded)
}

/// Says so when `--ppl-windows` asks for more windows than the text holds.
fn note_windows(s: &SweepSettings, n_tokens: usize) {
    let p = &s.perplexity;
    let available = n_tokens / p.ctx.max(1);
    if p.ppl_windows > available && available > 0 {
        eprintln!(
            "note: --ppl-windows {}: the text holds {available} windows of {} tokens; \
             perplexity uses those {available}",
            p.ppl_windows, p.ctx
        );
    }
}

/// The generation tasks, tokenized once with the quality model's tokenizer: XSum prompts for
/// ROUGE and passkey prompts. Errors: the dataset's or tokenizer's; a passkey prompt past the
/// model's context `max_ctx` ([`crate::Error::InvalidArgument`], `--passkey-lengths`).
fn quality_tasks<'a>(
    s: &SweepSettings,
    spec: &SweepSpec,
    quality: &'a model::LoadedModel,
    max_ctx: usize,
) -> anyhow::Result<QualityTasks<'a>> {
    let tok = &quality.tokenizer;
    let r = &s.rouge;
    let tasks = QualityTasks {
        tokenizer: tok,
        stop: tok.stop_tokens(),
        rouge: (r.rouge_samples > 0)
            .then(|| RougeTask::new(tok, r.rouge_samples, r.rouge_doc_tokens, r.rouge_max_new))
            .transpose()?,
        passkey: match &spec.passkey {
            Some(p) => passkey::prompts(tok, p)?,
            None => Vec::new(),
        },
    };
    if let Some(max) = tasks.passkey.iter().map(|p| p.tokens.len()).max() {
        if max + 8 > max_ctx {
            return Err(crate::Error::InvalidArgument {
                name: "--passkey-lengths".into(),
                reason: format!("{max} tokens exceed the model's context {max_ctx}"),
            }
            .into());
        }
    }
    Ok(tasks)
}

/// The generation tasks' size, for the shard planner's costs.
fn task_load(tasks: &QualityTasks<'_>) -> TaskLoad {
    let rouge = tasks.rouge.as_ref();
    TaskLoad {
        prompt_tokens: rouge
            .iter()
            .flat_map(|r| &r.prompts)
            .map(Vec::len)
            .sum::<usize>()
            + tasks.passkey.iter().map(|p| p.tokens.len()).sum::<usize>(),
        new_tokens: rouge.map_or(0, |r| r.prompts.len() * r.max_new) + tasks.passkey.len() * 8,
    }
}

/// What every sweep's `meta.json` records, with status `running`.
fn run_meta(
    folder: &RunDir,
    s: &SweepSettings,
    mode: RunMode,
    shard: Option<ShardRecord>,
    row_ctx: RowContext,
) -> SweepMeta {
    let mut m = folder.meta(RunKind::Sweep, mode, s, row_ctx, Default::default());
    m.shard = shard;
    m
}

/// A sweep under way: its folder, `meta.json` and the sink its results go to.
struct Execution {
    folder: RunDir,
    meta: SweepMeta,
    sink: RunSink,
}

impl Execution {
    /// Writes `meta.json` (status `running`, `details` its sections) and opens the sink,
    /// rewriting `raw.jsonl` to the records of `done`; each finished point is printed above
    /// `bar`. Errors: [`crate::Error::Io`].
    fn start(
        folder: RunDir,
        mut meta: SweepMeta,
        details: serde_json::Map<String, serde_json::Value>,
        done: &RawRecords,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<Execution> {
        meta.details = details;
        meta::write_json(&folder.dir.join(crate::report::META_FILE), &meta)?;
        let printer = bar.clone();
        let sink = RunSink::create(&folder.dir, meta.report_context.clone(), done.clone())?
            .on_row(move |r| print_above(&printer, point_line(r)));
        Ok(Execution { folder, meta, sink })
    }

    /// Records how the run ended in `meta.json`, renders and prints the report, and fails when
    /// the loop did or when every point failed.
    fn finish(mut self, result: crate::Result<()>, title: &str) -> anyhow::Result<()> {
        self.meta
            .finish(result.is_ok() && !self.sink.tally().all_failed());
        meta::write_json(&self.folder.dir.join(crate::report::META_FILE), &self.meta)?;
        result?;
        finish(&self.folder.dir, title)?;
        every_point_failed(self.sink.tally())
    }
}

/// `--synthetic`: geometry only, attention + append timed on synthetic K/V.
fn synthetic(
    plan: &SweepPlan,
    run: &RunDirArgs,
    earlier: Earlier,
    shard: Option<Shard>,
) -> anyhow::Result<()> {
    let model = crate::model::geometry::for_model_arg(&plan.settings.model.model)?;
    // kvbench's cache applies no sliding window at run time: it stores (and times attention
    // over) every token on every layer, so the points are measured and predicted all-global;
    // the per-layer-type split of a windowed cache goes to meta.json and the closing lines.
    let geom = model.cache().without_window();
    let memory_limit = match &plan.settings.synthetic.memory_limit {
        Some(m) => crate::util::size::parse_bytes(m)?,
        None => crate::util::memory::available_bytes().unwrap_or(u64::MAX),
    };
    let spec = plan.synthetic_spec();
    let host = Machine::probe().hostname;
    let (selection, record) = SweepPlan::select(&spec, shard, false, TaskLoad::default(), host)?;
    let folder = open_folder(
        run,
        earlier.meta.as_ref(),
        &format!("synthetic-{}", model.name),
    )?;
    if let Some(meta) = &earlier.meta {
        check_resume(&folder.dir, meta, &resume_identity(Vec::new()))?;
    }
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
        read_gb_s: None,
    };
    let run_meta = run_meta(&folder, &plan.settings, RunMode::Synthetic, record, row_ctx);
    let by_layer_type = crate::measure::synthetic::layer_type_bytes(&model.cache(), &spec);
    let details = details::synthetic(&model, memory_limit, &spec, &by_layer_type);
    let bar = progress_bar(
        selection
            .units()
            .iter()
            .map(|u| spec.unit_cost(u, None))
            .sum(),
    );
    let mut exec = Execution::start(folder, run_meta, details, &earlier.done, &bar)?;
    let result = crate::measure::synthetic::run(
        &geom,
        &spec,
        memory_limit,
        &selection,
        &earlier.done.points,
        &mut exec.sink,
        &BarProgress::new(bar.clone()),
    );
    bar.finish_and_clear();
    exec.finish(result, "kvbench sweep --synthetic")?;
    println!(
        "model geometry {} ({} layers × {} kv heads × {}), synthetic K/V, TPOT = append + attention only, memory limit {:.2} GiB, {} threads",
        model.name, geom.layers, geom.kv_heads, geom.head_dim,
        memory_limit as f64 / (1u64 << 30) as f64, rayon::current_num_threads()
    );
    if let Some(w) = model.window {
        let g = model.cache();
        println!(
            "{} has a sliding window ({w}: {} window + {} global layers); the cache measured \
             holds every token on every layer. A windowed cache would hold, per point:",
            model.name,
            g.window_layers(),
            g.global_layers()
        );
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        for r in &by_layer_type {
            println!(
                "  {} batch {} × {} tokens: window layers {:.3} GiB + global layers {:.3} GiB = \
                 {:.3} GiB (all layers global: {:.3} GiB)",
                r.scheme,
                r.batch,
                r.tokens,
                gib(r.window_layers_bytes),
                gib(r.global_layers_bytes),
                gib(r.window_layers_bytes + r.global_layers_bytes),
                gib(r.all_global_bytes)
            );
        }
    }
    Ok(())
}

/// A sweep in which no point succeeded is a failure (exit 1), whatever was written.
fn every_point_failed(tally: &Tally) -> anyhow::Result<()> {
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

/// Renders the finished run folder (the same code as `kvbench report`) and prints its table.
/// Errors: the report's.
pub fn finish(dir: &Path, title: &str) -> anyhow::Result<()> {
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

/// The line printed as a point finishes.
fn point_line(r: &ResultRow) -> String {
    format!(
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
    )
}

/// A model's label in the run id and the rows: the GGUF's file name, the repo id, or the
/// safetensors folder's name.
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

mod details;

use details::Models;
