//! `kvbench serve` end to end: settings (a suite, or a resumed folder's) → [`ServePlan`] →
//! run folder → the model and the workload → [`crate::serve::run`] over the points still to
//! run, writing through [`ServeLog`] → `meta.json` finished → [`render`].

use std::path::PathBuf;

use anyhow::Context;

use crate::model::{self, hub, WeightDtype};
use crate::quality::{wikitext, xsum};
use crate::report::meta::{self, RunKind, RunMode};
use crate::report::run_dir::{check_resume, prepare_out, resume_identity, RunDir, RunDirArgs};
use crate::report::serve::{
    finished, read_raw, render, ServeContext, ServeLog, ServeMeta, ServeRun,
};
use crate::serve::backend::ModelBackend;
use crate::serve::engine::Backend;
use crate::serve::run::{plan_geometry, Workload};
use crate::serve::settings::{ServePlan, ServeSettings};

use super::{model_files, print_above, progress_bar, resolve_settings, set_threads, BarProgress};

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
    let now = crate::util::time::now_rfc3339();
    let dir = run.out.clone().unwrap_or_else(|| {
        PathBuf::from("reports").join(format!("serve-{}", crate::util::time::compact(&now)))
    });
    let folder = match &resumed {
        Some(r) => {
            let m = &r.meta;
            RunDir::resume(
                dir,
                m["run_id"]
                    .as_str()
                    .map_or_else(|| run_id(&now, &settings), str::to_string),
                m["started_at"].as_str().unwrap_or(&now).to_string(),
                serde_json::from_value(m["resumed_at"].clone()).unwrap_or_default(),
                &now,
            )?
        }
        None => {
            prepare_out(&dir, run.force)?;
            RunDir::create(dir, run.out.is_some(), run_id(&now, &settings), &now)?
        }
    };
    let location = hub::resolve(&settings.model.model)?;
    let (files, sha256) = model_files(&location)?;
    if let Some(r) = &resumed {
        // Format 0 kept the sha256 at the top level; later formats under `model`.
        let mut m = r.meta.clone();
        if m["model"]["sha256"].is_null() && !m["model_sha256"].is_null() {
            m["model"]["sha256"] = m["model_sha256"].clone();
        }
        check_resume(&folder.dir, &m, &resume_identity(sha256.clone()))?;
    }
    let load = |dtype: WeightDtype| {
        model::load_location(&settings.model.model, &location, dtype).with_context(|| {
            format!(
                "loading model `{}` with {dtype} weights",
                settings.model.model
            )
        })
    };
    let decode = load(settings.weights.weights)?;
    let prefill = if settings.weights.prefill_weights == settings.weights.weights {
        None
    } else {
        Some(load(settings.weights.prefill_weights)?)
    };
    let prefill_model = prefill.as_ref().map_or(&decode.model, |m| &m.model);
    let cfg = decode.model.config.clone();
    let geom = cfg.cache_geometry();
    plan.check_model(geom, cfg.max_ctx)?;
    let text = decode.tokenizer.encode(wikitext::wikitext2_test_text())?;
    let work = Workload::build(&plan, &text, || {
        let (mut ti, mut to) = (Vec::new(), Vec::new());
        for s in xsum::samples(100)? {
            ti.push(decode.tokenizer.encode(&s.document)?.len());
            to.push(decode.tokenizer.encode(&s.summary)?.len());
        }
        Ok((ti, to))
    })?;
    let ctx = ServeContext {
        run_id: folder.run_id.clone(),
        model: settings.model.model.clone(),
        kv_budget_bytes: plan.budget,
        mean_context_tokens: work.mean_ctx,
    };
    let (earlier, done) = match &resumed {
        Some(_) => finished(read_raw(&folder.dir)?),
        None => (Vec::new(), Vec::new()),
    };
    let mut meta: ServeMeta = folder.meta(
        RunKind::Serve,
        RunMode::Model,
        &plan.settings,
        ctx.clone(),
        details(&settings.model.model, &files, &cfg, &sha256),
    );
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
    let bar = progress_bar((todo.len() * settings.load.num_requests) as u64);
    let printer = bar.clone();
    let mut log = ServeLog::open(&folder.dir, ctx, settings.slo.slo, &earlier)?
        .on_row(move |r| print_above(&printer, crate::report::serve::point_line(r)));
    let model_geom = plan_geometry(&settings.model.model, geom, cfg.max_ctx);
    let result = crate::serve::run::run(
        &plan,
        &model_geom,
        &work,
        &todo,
        &mut |scheme| {
            Ok(
                Box::new(ModelBackend::new(prefill_model, &decode.model, scheme))
                    as Box<dyn Backend>,
            )
        },
        &mut log,
        &BarProgress::new(bar.clone()),
    );
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

/// A serving run's id: `<UTC start>-serve-<model>`.
fn run_id(now: &str, s: &ServeSettings) -> String {
    let model = std::path::Path::new(&s.model.model)
        .file_stem()
        .map_or(s.model.model.clone(), |f| f.to_string_lossy().into_owned());
    crate::util::time::run_id(now, &format!("serve-{model}"))
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
    });
    match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("a JSON object"),
    }
}
