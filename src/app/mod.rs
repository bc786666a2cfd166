//! The measuring commands end to end, as library entries the CLI calls (hyperfine's
//! scheduler): each takes its parsed settings and runs settings → plan → run folder → loop →
//! rendered outputs, with the stages in the floors below — settings and checks in
//! [`crate::measure::settings`] and [`crate::serve::settings`], loops in
//! [`crate::measure::sweep`] and [`crate::serve::run`], folders and rendering in
//! [`crate::report`]. What every command shares is here: settings from a suite or a resumed
//! folder, the thread pool, the model files' hashes, the progress display.

pub mod attn_bench;
pub mod calibrate;
pub mod gate;
pub mod memory;
pub mod merge;
pub mod plan;
pub mod report;
pub mod serve;
pub mod slurm;
pub mod sweep;

use std::path::PathBuf;

use clap::parser::ValueSource;
use indicatif::{ProgressBar, ProgressStyle};

use crate::error::{Error, Result};
use crate::measure::settings::{check_threads, Settings};
use crate::measure::sweep::Progress;
use crate::model::ModelLocation;
use crate::report::meta::{self, RunKind};
use crate::report::run_dir::{RunDir, RunDirArgs};

/// A folder `--resume` continues: where, and its `meta.json` as written.
#[derive(Debug, Clone)]
pub struct Resumed {
    /// The run folder.
    pub dir: PathBuf,
    /// Its `meta.json`.
    pub meta: serde_json::Value,
}

/// The flags given on the command line (clap ids), from the subcommand's matches. The groups
/// clap's derive makes of each flattened struct (named after the type, `RunDirArgs`; an
/// argument's id is its snake_case field name) are not flags.
pub(crate) fn given(matches: Option<&clap::ArgMatches>) -> Vec<String> {
    let Some(m) = matches else {
        return Vec::new();
    };
    m.ids()
        .map(|id| id.as_str().to_string())
        .filter(|id| !id.chars().any(|c| c.is_ascii_uppercase()))
        .filter(|id| m.value_source(id) == Some(ValueSource::CommandLine))
        .collect()
}

/// The settings a run uses: with `--resume DIR`, those recorded in `DIR/meta.json` (every
/// other flag but `--threads`, which must then equal the recorded count, is refused beside it,
/// and `out` becomes `DIR`); else `--suite`'s laid over the defaults, flags given on the
/// command line winning (`matches`: the subcommand's). Returns the resumed folder. Errors:
/// [`Error::InvalidArgument`] (`--resume`) naming the flags given beside it, or the file when it
/// is missing, damaged, of a newer format, of another command or without usable settings;
/// (`--suite`) as [`Settings::read_suite`] and [`Settings::overlay`].
pub fn resolve_settings<S: Settings>(
    settings: &mut S,
    run: &mut RunDirArgs,
    matches: Option<&clap::ArgMatches>,
) -> Result<Option<Resumed>> {
    let cli = given(matches);
    let from_cli = |id: &str| cli.iter().any(|g| g == id);
    let Some(dir) = run.resume.clone() else {
        if let Some(path) = &run.suite {
            let table = S::read_suite(path)?;
            *settings =
                settings.overlay(&table, &format!("--suite {}", path.display()), from_cli)?;
        }
        return Ok(None);
    };
    let extra: Vec<String> = cli
        .iter()
        .filter(|id| !["resume", "threads", "rerun_contended"].contains(&id.as_str()))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect();
    let bad = |reason: String| Error::InvalidArgument {
        name: "--resume".into(),
        reason,
    };
    if !extra.is_empty() {
        return Err(bad(format!(
            "a resumed {} keeps the settings it started with (in {}/meta.json); drop {}",
            S::COMMAND,
            dir.display(),
            extra.join(", ")
        )));
    }
    let path = dir.join(crate::report::META_FILE);
    let value = meta::read_value(&path).map_err(|e| bad(e.to_string()))?;
    let kind = RunKind::of(&value);
    if kind.command() != S::COMMAND {
        return Err(bad(format!(
            "{} is a `kvbench {kind}` run; resume it with `kvbench {kind} --resume {}`",
            dir.display(),
            dir.display()
        )));
    }
    let recorded = value["settings"]
        .as_object()
        .ok_or_else(|| bad(format!("{} has no `settings`", path.display())))?;
    *settings = settings
        .overlay(recorded, &format!("--resume: {}", path.display()), |id| {
            id == "threads" && from_cli(id)
        })
        .map_err(|e| bad(format!("{} has no usable settings: {e}", path.display())))?;
    run.out = Some(dir.clone());
    Ok(Some(Resumed { dir, meta: value }))
}

/// The run folder: a resumed run's (its id and start time kept), else a new one (`--out`, else
/// `reports/<run id>`, run id `<UTC time>-<label>`). Errors: as [`RunDir::create`] and
/// [`RunDir::resume`].
pub fn open_folder(
    run: &RunDirArgs,
    earlier: Option<&serde_json::Value>,
    label: &str,
) -> Result<RunDir> {
    let now = crate::util::time::now_rfc3339();
    if let (Some(m), Some(dir)) = (earlier, &run.out) {
        let mut folder = RunDir::resume(
            dir.clone(),
            m["run_id"].as_str().unwrap_or(label).to_string(),
            m["started_at"].as_str().unwrap_or(&now).to_string(),
            serde_json::from_value(m["resumed_at"].clone()).unwrap_or_default(),
            &now,
        )?;
        folder.rerun_contended = run.rerun_contended;
        return Ok(folder);
    }
    let run_id = crate::util::time::run_id(&now, label);
    let dir = run
        .out
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("reports").join(&run_id));
    RunDir::create(dir, run.out.is_some(), run_id, &now)
}

/// Sizes the thread pool candle and kvbench share: `RAYON_NUM_THREADS` (candle's CPU kernels
/// size their pools from it) and rayon's global pool, before any use; `None` keeps the
/// default (all logical CPUs). Errors: as [`check_threads`].
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    check_threads(threads)?;
    if let Some(n) = threads {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .ok();
    }
    Ok(())
}

/// The files of a model and each one's sha256 (what `meta.json` records and `--resume`
/// checks; cached per file version, see [`crate::model::digest`]). Errors: [`Error::Io`] naming
/// a file that cannot be read.
pub fn model_files(location: &ModelLocation) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let files = match location {
        ModelLocation::Gguf(p) => vec![p.clone()],
        ModelLocation::Safetensors { weights, .. } => weights.clone(),
    };
    let sha = files
        .iter()
        .map(|f| crate::model::digest::sha256_cached(f))
        .collect::<Result<Vec<_>>>()?;
    Ok((files, sha))
}

/// A progress bar of `len` units (hidden without a terminal).
pub fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {percent:>3}% · about {eta} left · {msg}",
        )
        .expect("static template"),
    );
    bar
}

/// Prints `line` above the progress bar, or to stderr when the bar is hidden (CI logs, where
/// it would swallow the line).
pub fn print_above(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// The progress bar on a terminal; without one (CI logs, `nohup`, a pipe) plain lines on
/// stderr: one when a unit of work starts, and at most every [`PLAIN_PROGRESS_EVERY`] while it
/// runs, with the units done and an estimate of the time left.
pub struct BarProgress(ProgressBar, std::sync::Mutex<Option<std::time::Instant>>);

impl BarProgress {
    /// Reports to `bar`.
    pub fn new(bar: ProgressBar) -> Self {
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
            "progress: {:.0} % of the estimated work, {} elapsed{left}{}{what}",
            if len > 0 {
                100.0 * pos as f64 / len as f64
            } else {
                0.0
            },
            humantime::format_duration(std::time::Duration::from_secs(elapsed.as_secs())),
            if what.is_empty() { "" } else { ": " }
        );
        if let Ok(mut last) = self.1.lock() {
            *last = Some(std::time::Instant::now());
        }
    }
}

/// How often a long unit of work prints a plain progress line when there is no terminal.
pub const PLAIN_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

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
