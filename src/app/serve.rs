//! `kvbench serve` end to end: settings (a suite, or a resumed folder's) → [`ServePlan`] →
//! run folder → the model and the workload → [`crate::serve::run`] over the points still to
//! run, writing through [`ServeLog`] → `meta.json` finished → [`render`].

use std::path::PathBuf;

use anyhow::Context;

use crate::measure::settings::Settings;
use crate::model::{self, hub, WeightDtype};
use crate::perf::{DeviceProfile, ModelShape, PerfModel};
use crate::quality::{wikitext, xsum};
use crate::report::meta::{self, RunKind, RunMode};
use crate::report::run_dir::{check_resume, prepare_out, resume_identity, RunDir, RunDirArgs};
use crate::report::serve::{
    finished, read_raw, render, ServeContext, ServeLog, ServeMeta, ServeRun,
};
use crate::serve::backend::ModelBackend;
use crate::serve::calibrate::speed_probe;
use crate::serve::run::{plan_geometry, PointBackend, Workload};
use crate::serve::settings::{ServePlan, ServeSettings};
use crate::serve::virtual_backend::{Scaled, VirtualBackend};

use super::{
    model_files, open_folder, print_above, progress_bar, resolve_settings, set_threads, BarProgress,
};

/// Arguments of `kvbench serve`: the run folder's flags and the settings (also a suite's keys
/// and `meta.json`'s `settings`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// `--suite`, `--resume`, `--out`, `--force`.
    #[command(flatten)]
    pub run: RunDirArgs,
    /// Every setting that changes a number.
    #[command(flatten)]
    pub settings: ServeSettings,
}

/// What the scheduler does, in words, for `meta.json`.
const SCHEDULER: &str = "continuous batching; whole-prompt prefill one request at a time, then \
    one decode step for the running batch; FCFS admission when the prompt's blocks are free; \
    recompute preemption, newest first";

/// Decode steps of the untimed request each measured point's backend serves before its clock
/// starts ([`ModelBackend::warmed_up`]).
const WARM_UP_STEPS: usize = 4;

/// The measured run's warm-up, in words, for `meta.json`.
fn warm_up_text() -> String {
    format!(
        "before each point's clock starts, its backend serves the first request's prompt and \
         {WARM_UP_STEPS} decode steps (fewer if the request generates fewer), untimed, then \
         drops the sequence"
    )
}

/// How prefix caching shares memory, for `meta.json`.
const PREFIX_SHARING: &str = "prefix caching shares whole blocks of the prefix by reference in \
    the pool; the CPU cache copies the prefix rows into each sequence (no model forward); \
    eviction schemes never share (their blocks are not immutable)";

/// Runs `kvbench serve` with `settings` into the folder `run` chooses (`matches`: the
/// subcommand's, to tell flags given from defaults). Errors: usage errors
/// ([`crate::Error::InvalidArgument`], exit 2) for bad settings, folders and models; runtime
/// errors for I/O, and when every point failed.
pub fn run(
    mut settings: ServeSettings,
    mut run: RunDirArgs,
    matches: Option<&clap::ArgMatches>,
) -> anyhow::Result<()> {
    let resumed = resolve_settings(&mut settings, &mut run, matches)?;
    let plan = ServePlan::build(&settings)?;
    set_threads(settings.threads.threads)?;
    if let (None, Some(out)) = (&resumed, &run.out) {
        prepare_out(out, run.force)?;
    }
    if let Some(profile) = settings.sim.simulate.clone() {
        // The budget a run records is the one it used: derived once, kept on --resume.
        let budget_given = resumed.is_some()
            || super::given(matches).iter().any(|g| g == "kv_budget")
            || run.suite.as_ref().is_some_and(|p| {
                ServeSettings::read_suite(p).is_ok_and(|t| t.contains_key("kv-budget"))
            });
        return simulate(plan, &run, resumed.as_ref(), &profile, budget_given);
    }
    let location = hub::resolve(&settings.model.model)?;
    let (files, sha256) = model_files(&location)?;
    let label = std::path::Path::new(&settings.model.model)
        .file_stem()
        .map_or(settings.model.model.clone(), |f| {
            f.to_string_lossy().into_owned()
        });
    let folder = open_folder(
        &run,
        resumed.as_ref().map(|r| &r.meta),
        &format!("serve-{label}"),
    )?;
    if let Some(r) = &resumed {
        // Format 0 kept the sha256 at the top level; later formats under `model`.
        let mut m = r.meta.clone();
        if m["model"]["sha256"].is_null() && !m["model_sha256"].is_null() {
            m["model"]["sha256"] = m["model_sha256"].clone();
        }
        check_resume(&folder.dir, &m, &resume_identity(sha256.clone()))?;
    }
    let (decode, prefill) = load_models(&settings, &location)?;
    let prefill_model = prefill.as_ref().map_or(&decode.model, |m| &m.model);
    let cfg = decode.model.config.clone();
    plan.check_model(cfg.cache_geometry(), cfg.max_ctx)?;
    let work = workload(&plan, &decode.tokenizer)?;
    let ctx = ServeContext {
        run_id: folder.run_id.clone(),
        model: settings.model.model.clone(),
        kv_budget_bytes: plan.budget,
        mean_context_tokens: work.mean_ctx,
        mode: "measured".into(),
        profile: String::new(),
    };
    let details = details(&settings.model.model, &files, &cfg, &sha256);
    let meta = folder.meta(RunKind::Serve, RunMode::Model, &plan.settings, ctx, details);
    let model = plan_geometry(&settings.model.model, cfg.cache_geometry(), cfg.max_ctx);
    // Each point's backend serves the first request once, untimed, before its clock starts:
    // its prompt and at most as many decode steps as the request itself runs (so the warm-up
    // stays inside the context the request was checked against).
    let warm = work.requests.first().map(|r| {
        (
            r.prompt.clone(),
            WARM_UP_STEPS.min(r.output_len.saturating_sub(1)),
        )
    });
    // Then the speed probe, right before the point's backend is made and warmed: how fast the
    // machine runs now, for `serve --simulate --speed-from` (README, "Calibration"). The first
    // probe of a process ran 10–30 % slow (the first point's: 393 ms per prefill against a
    // median of 307 in one run, AMD EPYC, 2026-12-06): one untimed probe before any point (its
    // failure, a damaged model say, fails each point's own probe in turn: the points fail, as
    // their warm-up would, and the run goes on).
    let _ = speed_probe(prefill_model, &decode.model);
    execute(folder, meta, &plan, &model, &work, &mut |scheme| {
        let probe = speed_probe(prefill_model, &decode.model)?;
        let mut b = ModelBackend::new(prefill_model, &decode.model, scheme);
        if let Some((prompt, steps)) = &warm {
            b = b.warmed_up(prompt, *steps)?;
        }
        Ok(PointBackend {
            backend: Box::new(b),
            probe: Some(probe),
        })
    })
}

/// `--simulate`: the run on a virtual clock whose steps cost what [`PerfModel`] says for
/// `profile` (no weights loaded; the model's geometry only), the KV budget per device derived
/// from the profile's memory unless `budget_given`. Errors: as [`run`], and the profile's.
fn simulate(
    mut plan: ServePlan,
    run: &RunDirArgs,
    resumed: Option<&super::Resumed>,
    profile: &str,
    budget_given: bool,
) -> anyhow::Result<()> {
    let device = DeviceProfile::load(profile)?;
    let s = plan.settings.clone();
    let geom = crate::model::geometry::for_model_arg(&s.model.model)?;
    let tp = s.sim.tensor_parallel;
    let shape = model_shape(
        &geom,
        device.weights_dtype.as_deref(),
        device.prefill_weights_dtype.as_deref(),
    )?;
    if let Some(n) = s.sim.num_gpu_blocks_override {
        let fp16 = plan.sizer(crate::kv::KvScheme::FP16, plan.pool_geometry(geom.cache()));
        plan = plan.with_budget(n * fp16.block_bytes());
    } else if !budget_given {
        plan = plan.with_budget(device_kv_budget(
            &device,
            &s,
            &geom,
            shape.decode_weight_bytes,
        )?);
    }
    plan.check_model(geom.cache(), geom.max_ctx)?;
    for scheme in plan.schemes() {
        PerfModel::new(device.clone(), shape.clone(), *scheme, tp)?;
    }
    if [&s.load.input_len, &s.load.output_len]
        .iter()
        .any(|l| matches!(l, crate::serve::workload::LenDist::Xsum(..)))
    {
        return Err(crate::Error::InvalidArgument {
            name: "--input-len".into(),
            reason: "--simulate takes fixed or uniform lengths (128..384); the XSum trace needs                      the model's tokenizer"
                .into(),
        }
        .into());
    }
    // Token ids do not matter on a virtual clock, only lengths: a counting "text".
    let text: Vec<u32> =
        (0..(s.load.shared_prefix + 4 * s.load.input_len.max() + 4096) as u32).collect();
    let work = Workload::build(&plan, &text, || unreachable!("no XSum trace (checked)"))?;
    // A resumed run keeps the speed it started at (`meta.json`'s `speed_from`), whatever the
    // measured folder holds now (`--rerun-contended` changes it).
    let kept = resumed.and_then(|r| {
        serde_json::from_value::<crate::perf::SpeedProbe>(r.meta["speed_from"]["probe"].clone())
            .ok()
    });
    let speed = match (&s.sim.speed_from, kept, device.probe) {
        (Some(_), Some(probe), Some(base)) => Some((probe, base)),
        (Some(dir), _, _) => Some(measured_speed(dir, &plan, &device)?),
        (None, ..) => None,
    };
    let label = format!("sim-{}-{}", device.name, geom.name.replace('/', "_"));
    let folder = open_folder(run, resumed.map(|r| &r.meta), &label)?;
    let ctx = ServeContext {
        run_id: folder.run_id.clone(),
        model: s.model.model.clone(),
        kv_budget_bytes: plan.budget,
        mean_context_tokens: work.mean_ctx,
        mode: "simulated".into(),
        profile: device.label(),
    };
    let mut details = serde_json::Map::new();
    details.insert("profile".into(), serde_json::to_value(&device)?);
    details.insert("model_geometry".into(), serde_json::to_value(&geom)?);
    details.insert("scheduler".into(), SCHEDULER.into());
    if let (Some(dir), Some((probe, base))) = (&s.sim.speed_from, speed) {
        let (prefill, decode) = probe.slowdown(&base);
        details.insert(
            "speed_from".into(),
            serde_json::json!({
                "dir": std::path::absolute(dir).unwrap_or_else(|_| dir.clone()),
                "probe": probe,
                "profile_probe": base,
                "prefill_factor": prefill,
                "decode_factor": decode,
            }),
        );
    }
    let meta = folder.meta(
        RunKind::Serve,
        RunMode::Simulated,
        &plan.settings,
        ctx,
        details,
    );
    let model = crate::model::geometry::ModelGeometry {
        name: s.model.model.clone(),
        ..geom
    };
    let sizer_geom = plan.pool_geometry(model.cache());
    execute(folder, meta, &plan, &model, &work, &mut |scheme| {
        let perf = PerfModel::new(device.clone(), shape.clone(), scheme, tp)?;
        let sizer = plan.sizer(scheme, sizer_geom);
        let Some((probe, base)) = speed else {
            return Ok(PointBackend {
                backend: Box::new(VirtualBackend::new(perf, sizer)),
                probe: None,
            });
        };
        let (prefill, decode) = probe.slowdown(&base);
        let cost = Scaled {
            cost: perf,
            prefill,
            decode,
        };
        Ok(PointBackend {
            backend: Box::new(VirtualBackend::new(cost, sizer)),
            probe: Some(probe),
        })
    })
}

/// The factors `--speed-from` may scale a simulation by: a measured run this much faster or
/// slower than its calibration ran other work (another model, weights or thread count).
const SPEED_FACTORS: (f64, f64) = (0.5, 2.0);

/// `--speed-from`: the measured serving run at `dir`'s speed probe — the median over its
/// points, prefill and step apart — and the profile's, which it is scaled against. One pair of
/// factors for the whole run, not one per point: a probe of 2.5 s spreads ±7 % around the
/// speed of the minute a point runs (AMD EPYC VM, 2026-12-06: the probe's ratio to the
/// calibration's and the point's own steps' ratio to the model agreed less than the steps
/// alone varied), while the run's median tracks the drift between the calibration and the
/// run (the validation of that day: 17 of 24 points within target at the run's speed, 12 with
/// a factor per point, 5 at the calibration's). Errors: [`crate::Error::InvalidArgument`]
/// (`--speed-from`) when the profile has no probe (a shipped one, or one calibrated before
/// kvbench took it); the folder is not a measured `kvbench serve` run, lacks a point of the
/// plan (another suite) or that point's probe (measured before kvbench took it); or a factor
/// falls outside [`SPEED_FACTORS`] (the run and the calibration timed other work).
fn measured_speed(
    dir: &std::path::Path,
    plan: &ServePlan,
    device: &DeviceProfile,
) -> crate::Result<(crate::perf::SpeedProbe, crate::perf::SpeedProbe)> {
    let bad = |reason: String| crate::Error::InvalidArgument {
        name: "--speed-from".into(),
        reason,
    };
    let base = device.probe.ok_or_else(|| {
        bad(format!(
            "profile `{}` has no speed probe to scale against; use a profile `kvbench calibrate` \
             wrote on the machine that measured the run",
            device.name
        ))
    })?;
    let meta_path = dir.join(crate::report::META_FILE);
    if !meta_path.is_file() {
        return Err(bad(format!(
            "{}: not a run folder (no {}); give the folder a measured `kvbench serve` wrote",
            dir.display(),
            crate::report::META_FILE
        )));
    }
    let meta = meta::read_value(&meta_path).map_err(|e| bad(e.to_string()))?;
    let kind = RunKind::of(&meta);
    if kind != RunKind::Serve {
        return Err(bad(format!(
            "{} is a `kvbench {kind}` run; give the folder a measured `kvbench serve` wrote",
            dir.display()
        )));
    }
    let rows: Vec<_> = read_raw(dir)?
        .into_iter()
        .filter_map(|l| match l {
            crate::report::serve::RawLine::Point { point, row, .. } => Some((point, row)),
            crate::report::serve::RawLine::Request { .. } => None,
        })
        .collect();
    let mut probes = Vec::new();
    for key in plan.points() {
        let label = format!("{} {}", key.scheme, key.arrival.label());
        let (_, row) = rows.iter().find(|(k, _)| *k == key).ok_or_else(|| {
            bad(format!(
                "{}: no point {label}; give the measured run of the same suite or flags",
                dir.display()
            ))
        })?;
        if row.mode != "measured" {
            return Err(bad(format!(
                "{}: a {} run; give a measured one",
                dir.display(),
                row.mode
            )));
        }
        probes.push(row.probe().ok_or_else(|| {
            bad(format!(
                "{}: point {label} has no speed probe (measured by a kvbench before \
                 2026-12-06, or it failed); measure it again",
                dir.display()
            ))
        })?);
    }
    let probe = crate::perf::SpeedProbe::median(&probes).ok_or_else(|| {
        bad(format!(
            "{}: the simulation has no points to take a speed for",
            dir.display()
        ))
    })?;
    let (prefill, decode) = probe.slowdown(&base);
    let (lo, hi) = SPEED_FACTORS;
    if ![prefill, decode].iter().all(|f| (lo..=hi).contains(f)) {
        return Err(bad(format!(
            "{}: its speed probe ran {:.1} ms per prefill and {:.2} ms per step against the \
             profile's {:.1} and {:.2} ({prefill:.2}× and {decode:.2}×, outside {lo}–{hi}×): the \
             run and the calibration timed other work — another model, weights or --threads; \
             calibrate with the run's",
            dir.display(),
            probe.prefill_ms,
            probe.step_ms,
            base.prefill_ms,
            base.step_ms
        )));
    }
    Ok((probe, base))
}

/// The model as the performance model sees it: its geometry and parameters, its weights at
/// `decode` dtype's nominal bytes per parameter (None: the model's own dtype) for decode steps
/// and at `prefill`'s (None: as decode) for prefills — the profile's `weights_dtype` and
/// `prefill_weights_dtype` when simulating, the dtypes timed when `kvbench calibrate` fits a
/// profile, so the weight-read rate it fits applies to the same bytes a simulation charges.
/// Errors: a dtype kvbench does not know.
pub(super) fn model_shape(
    geom: &crate::model::geometry::ModelGeometry,
    decode: Option<&str>,
    prefill: Option<&str>,
) -> crate::Result<ModelShape> {
    let bytes = |dtype: Option<&str>| -> crate::Result<u64> {
        let d = dtype.unwrap_or(geom.weight_dtype.as_str());
        if d == "gguf" {
            return Ok(std::fs::metadata(&geom.name).map_or(0, |m| m.len()));
        }
        Ok((geom.params as f64 * crate::model::geometry::weight_bytes_per_param(d)?) as u64)
    };
    let (decode, prefill) = match (bytes(decode)?, prefill) {
        (d, Some(p)) => (d, bytes(Some(p))?),
        (d, None) => (d, d),
    };
    Ok(ModelShape {
        layers: geom.layers,
        q_heads: geom.q_heads,
        kv_heads: geom.kv_heads,
        head_dim: geom.head_dim,
        params: geom.params,
        window: geom.window,
        decode_weight_bytes: decode,
        prefill_weight_bytes: prefill,
    })
}

/// The KV budget of one device, bytes, as vLLM sizes it
/// ([`crate::serve::capacity::kv_memory`]): its memory × `--gpu-memory-utilization`, less the
/// weights it holds (`weight_bytes` over `--tensor-parallel` GPUs), the profile run's
/// activation peak for `geom` (a batch of `--max-num-batched-tokens` over `--max-num-seqs`
/// sequences) and non-torch memory by tensor-parallel degree, or `--non-kv-reserve` in place
/// of those two. Errors: [`crate::Error::InvalidArgument`] when nothing is left.
fn device_kv_budget(
    device: &DeviceProfile,
    s: &ServeSettings,
    geom: &crate::model::geometry::ModelGeometry,
    weight_bytes: u64,
) -> crate::Result<u64> {
    use crate::serve::capacity;
    let engine = capacity::EngineMemory {
        total_bytes: device.memory_bytes(),
        gpu_memory_utilization: s.sim.gpu_memory_utilization,
        tensor_parallel: s.sim.tensor_parallel,
        weight_bytes,
        max_num_batched_tokens: s
            .sim
            .max_num_batched_tokens
            .unwrap_or_else(|| capacity::default_max_num_batched_tokens(geom.max_ctx)),
        max_num_seqs: s.pool.max_num_seqs,
    };
    let reserve = s.sim.non_kv_reserve.as_ref().map(|r| r.bytes);
    Ok(capacity::kv_memory(geom, &engine, reserve)?.kv)
}

/// The model in the decode weights, and in the prefill weights when they differ. Errors: the
/// loader's, naming the model and the dtype.
fn load_models(
    s: &ServeSettings,
    location: &model::ModelLocation,
) -> anyhow::Result<(model::LoadedModel, Option<model::LoadedModel>)> {
    let load = |dtype: WeightDtype| {
        model::load_location(&s.model.model, location, dtype)
            .with_context(|| format!("loading model `{}` with {dtype} weights", s.model.model))
    };
    // The prefill of one prompt at a time (up to 2,048 tokens) beside the KV budget.
    let peak = super::memory::PeakLoad {
        schemes: Vec::new(),
        batch: 1,
        prompt: 2048,
        gen: 0,
        ppl_ctx: 0,
        kv_bytes: Some(s.pool.kv_budget.bytes),
    };
    let plan = super::memory::plan_decode_prefill(
        location,
        &candle_core::Device::Cpu,
        s.weights.weights,
        s.weights.prefill_weights,
        &peak,
    )?;
    let decode = load(plan.dtype("decode"))?;
    let prefill = if plan.dtype("prefill") == plan.dtype("decode") {
        None
    } else {
        Some(load(plan.dtype("prefill"))?)
    };
    Ok((decode, prefill))
}

/// The run's requests, prompts cut from WikiText-2 with the model's tokenizer (and the XSum
/// pairs' token lengths when a length follows that trace). Errors: the tokenizer's, the
/// dataset's, [`Workload::build`]'s.
fn workload(plan: &ServePlan, tok: &model::TextTokenizer) -> crate::Result<Workload> {
    let text = tok.encode(wikitext::wikitext2_test_text())?;
    Workload::build(plan, &text, || {
        let (mut ti, mut to) = (Vec::new(), Vec::new());
        for s in xsum::samples(100)? {
            ti.push(tok.encode(&s.document)?.len());
            to.push(tok.encode(&s.summary)?.len());
        }
        Ok((ti, to))
    })
}

/// Serves the points `plan` has that the folder has not finished, on the backends `backend`
/// makes, then records how the run ended in `meta.json`, renders the report and prints it.
/// Errors: the loop's and the sink's I/O; every point failed.
pub fn execute<'m>(
    folder: RunDir,
    mut meta: ServeMeta,
    plan: &ServePlan,
    model: &crate::model::geometry::ModelGeometry,
    work: &Workload,
    backend: &mut dyn FnMut(crate::kv::KvScheme) -> crate::Result<PointBackend<'m>>,
) -> anyhow::Result<()> {
    let (earlier, done) = finished(read_raw(&folder.dir)?, folder.rerun_contended);
    let meta_path = folder.dir.join(crate::report::META_FILE);
    meta::write_json(&meta_path, &meta)?;
    let todo: Vec<_> = plan
        .points()
        .into_iter()
        .filter(|p| !done.contains(p))
        .collect();
    if !done.is_empty() {
        eprintln!(
            "resuming {}: {} points done, {} to run",
            folder.dir.display(),
            done.len(),
            todo.len()
        );
    }
    let bar = progress_bar((todo.len() * plan.settings.load.num_requests) as u64);
    let printer = bar.clone();
    let slo = plan.settings.slo.slo;
    let mut log = ServeLog::open(&folder.dir, meta.report_context.clone(), slo, &earlier)?
        .on_row(move |r| print_above(&printer, crate::report::serve::point_line(r)));
    let progress = BarProgress::new(bar.clone());
    let result = crate::serve::run::run(plan, model, work, &todo, backend, &mut log, &progress);
    bar.finish_and_clear();
    meta.finish(result.is_ok() && !log.all_failed());
    meta::write_json(&meta_path, &meta)?;
    result?;
    print!("{}", render(&ServeRun::read(&folder.dir)?)?);
    println!("wrote {}", folder.dir.display());
    if log.all_failed() {
        anyhow::bail!(
            "every point failed ({} of {}); the first: {}",
            log.tally.1,
            log.tally.0,
            log.tally.2.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

/// `meta.json`'s serve sections: the model (spec, files, config, sha256), the text, and the
/// scheduler and prefix sharing in words.
fn details(
    spec: &str,
    files: &[PathBuf],
    cfg: &model::ModelConfig,
    sha256: &[String],
) -> serde_json::Map<String, serde_json::Value> {
    let v = serde_json::json!({
        "model": { "spec": spec, "files": files, "config": cfg, "sha256": sha256 },
        "dataset": wikitext::DATASET_NAME,
        "scheduler": SCHEDULER,
        "prefix_sharing": PREFIX_SHARING,
        "warm_up": warm_up_text(),
    });
    match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("a JSON object"),
    }
}
