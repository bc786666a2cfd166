//! `meta.json`: every choice that changes a number, so a result can be traced and reproduced.

use std::path::Path;

use crate::error::{Error, Result};
use crate::measure::settings::Settings;
use crate::measure::shard::ShardRecord;
use crate::util::memory;

use serde::Deserialize as _;

/// The `meta.json` format this kvbench writes. 0: folders written before the format was
/// versioned (kvbench 0.1.0 up to 084d7a437093: no `format`, a synthetic run's `mode` a
/// sentence, quality repeated on every point of `raw.jsonl` or in `quality.jsonl`; a serve
/// folder's `command` the string `"serve"`); 1: typed [`RunMeta`] for sweeps, quality as its
/// own `raw.jsonl` record (serve folders: `format`, `status`, the model's sha256); 2: one
/// [`RunMeta`] for every command, its [`RunKind`] in `kind`, serve folders with a run id and a
/// `report_context`. All are read.
pub const META_FORMAT: u32 = 2;

/// Which command wrote a run folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunKind {
    /// `kvbench sweep` (model or synthetic).
    #[default]
    Sweep,
    /// `kvbench serve`.
    Serve,
}

impl RunKind {
    /// The subcommand's name.
    pub fn command(self) -> &'static str {
        match self {
            Self::Sweep => "sweep",
            Self::Serve => "serve",
        }
    }

    /// The kind a `meta.json` records: its `kind`, else (formats 0 and 1) `serve` when its
    /// `command` is the string `"serve"`, else `sweep`.
    pub fn of(meta: &serde_json::Value) -> RunKind {
        match meta["kind"].as_str() {
            Some("serve") => RunKind::Serve,
            Some(_) => RunKind::Sweep,
            None if meta["command"] == "serve" => RunKind::Serve,
            None => RunKind::Sweep,
        }
    }
}

impl std::fmt::Display for RunKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.command())
    }
}

/// What every row of a kind of run repeats (`meta.json`'s `report_context`), with how to
/// rebuild it from a folder written before it was recorded.
pub trait ReportContext: serde::Serialize + serde::de::DeserializeOwned {
    /// The context of an older `meta.json` that lacks `report_context`, from its other fields
    /// (`None`: it cannot be rebuilt).
    fn from_legacy(_meta: &serde_json::Value) -> Option<Self> {
        None
    }
}

/// What kind of run a folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunMode {
    /// `kvbench sweep` on a model: prefill and decode timed, quality measured.
    #[default]
    Model,
    /// `kvbench sweep --synthetic`: attention + append only on synthetic K/V, no weights.
    Synthetic,
    /// `kvbench serve --simulate`: the scheduler on a virtual clock whose steps cost what the
    /// performance model says (`crate::perf`); nothing was measured.
    Simulated,
}

impl<'de> serde::Deserialize<'de> for RunMode {
    /// `model`, `synthetic`, and format 0's sentence (`synthetic: attention + append only, …`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "model" => Ok(RunMode::Model),
            "simulated" => Ok(RunMode::Simulated),
            m if m == "synthetic" || m.starts_with("synthetic:") => Ok(RunMode::Synthetic),
            other => Err(serde::de::Error::custom(format!(
                "unknown run mode `{other}` (this kvbench knows `model`, `synthetic` and `simulated`)"
            ))),
        }
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Started, not finished (or interrupted).
    Running,
    /// Every selected unit ran.
    Finished,
    /// The sweep stopped on an error, or every point failed.
    Failed,
    /// Stopped by Ctrl-C or SIGTERM ([`crate::cli::interrupt`]); `--resume` continues it.
    Interrupted,
    /// A merge of shard folders with some shards or units missing
    /// (`kvbench merge --allow-partial`; `missing` lists them).
    Partial,
}

impl RunStatus {
    /// Whether the run has ended and wrote its last `meta.json` (finished, failed or a partial
    /// merge): a later signal must not relabel it ([`crate::cli::interrupt::mark_interrupted`]).
    pub fn has_ended(self) -> bool {
        matches!(self, Self::Finished | Self::Failed | Self::Partial)
    }
}

/// `meta.json`: every choice that changes a number, typed where kvbench reads it back
/// (`report`, `--resume`, `merge`, `gate`), for any command: `S` its settings
/// (`SweepSettings`, `ServeSettings`), `C` what every row repeats; the command's own
/// sections (model and tokenizer, sweep spec, perplexity protocol, scheduler …) are kept as
/// written in [`RunMeta::details`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(bound(deserialize = "S: Settings, C: ReportContext"))]
pub struct RunMeta<S, C> {
    /// [`META_FORMAT`] when written; 0 when absent (older folders).
    #[serde(default)]
    pub format: u32,
    /// kvbench version and git revision that wrote the run ([`version`]).
    pub kvbench: String,
    /// Which command wrote the folder.
    #[serde(default)]
    pub kind: RunKind,
    /// The run id (`<UTC start time>-<label>`).
    pub run_id: String,
    /// Model sweep or synthetic (attention-only) sweep; `model` for serving runs.
    #[serde(default)]
    pub mode: RunMode,
    /// The command line that started the run.
    #[serde(default)]
    pub command: Vec<String>,
    /// UTC start time, RFC 3339.
    pub started_at: String,
    /// UTC end time, RFC 3339, once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Where the run stands (absent in format-0 synthetic runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    /// The machine it ran on.
    pub machine: Machine,
    /// When `--resume` continued it (UTC, RFC 3339).
    #[serde(default)]
    pub resumed_at: Vec<String>,
    /// Which shard of a sharded sweep it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardRecord>,
    /// Every setting, as the flags name them (`--resume` reads these), laid over the flags'
    /// defaults when read, so a setting added since a folder was written reads as its default.
    #[serde(deserialize_with = "settings_over_defaults")]
    pub settings: S,
    /// What every row repeats, for rebuilding `results.csv` from `raw.jsonl`.
    pub report_context: C,
    /// The command's own sections, as written.
    #[serde(flatten)]
    pub details: serde_json::Map<String, serde_json::Value>,
}

/// Recorded settings laid over the flags' defaults.
fn settings_over_defaults<'de, D: serde::Deserializer<'de>, S: Settings>(
    d: D,
) -> std::result::Result<S, D::Error> {
    let m = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
    S::defaults()
        .overlay(&m, "meta.json settings", |_| false)
        .map_err(serde::de::Error::custom)
}

/// Reads `path` (a run folder's `meta.json`) as JSON with its format checked. Errors:
/// [`Error::InvalidArgument`] naming the file: unreadable or not JSON; a `format` that is not a
/// number, or newer than [`META_FORMAT`] (naming both and the version that wrote it).
pub fn read_value(path: &Path) -> Result<serde_json::Value> {
    let text = crate::util::read_regular(path).map_err(|e| Error::InvalidArgument {
        name: path.display().to_string(),
        reason: format!("not a kvbench run folder: {e}"),
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::InvalidArgument {
            name: path.display().to_string(),
            reason: format!("not valid JSON: {e}"),
        })?;
    let writer = writer(&value);
    let format = match &value["format"] {
        serde_json::Value::Null => 0,
        v => v.as_u64().ok_or_else(|| Error::InvalidArgument {
            name: path.display().to_string(),
            reason: format!(
                "`format` is {v}, not a format number (0 to {META_FORMAT}): the file was \
                 edited or damaged; re-run it"
            ),
        })?,
    };
    if format > META_FORMAT as u64 {
        return Err(Error::InvalidArgument {
            name: path.display().to_string(),
            reason: format!(
                "meta.json format {format}, written by kvbench {writer}, is newer than this \
                 kvbench {} reads (formats 0 to {META_FORMAT}); re-render it with kvbench \
                 {writer} or newer",
                version()
            ),
        });
    }
    Ok(value)
}

fn writer(value: &serde_json::Value) -> String {
    value["kvbench"]
        .as_str()
        .unwrap_or("an unknown version")
        .to_string()
}

impl<S, C> RunMeta<S, C> {
    /// Records how the run ended: `finished_at` now, `status` finished when `ok`, else failed
    /// (the loop stopped on an error, or every point failed).
    pub fn finish(&mut self, ok: bool) {
        self.finished_at = Some(crate::util::time::now_rfc3339());
        self.status = Some(if ok {
            RunStatus::Finished
        } else {
            RunStatus::Failed
        });
    }
}

impl<S: Settings, C: ReportContext> RunMeta<S, C> {
    /// The kind of run this type reads.
    fn kind() -> RunKind {
        if S::COMMAND == "serve" {
            RunKind::Serve
        } else {
            RunKind::Sweep
        }
    }

    /// Reads a run folder's `meta.json` (`path`) of this kind, with the JSON as written.
    /// Folders of formats 0 and 1 are read as meant (a serve folder's `command` string, its
    /// missing run id — the folder's name — and `report_context`). Errors:
    /// [`Error::InvalidArgument`] naming the file: as [`read_value`]; a folder of another kind
    /// (naming the command that reads it); missing what a report needs (naming the field and
    /// the version that wrote it).
    pub fn read(path: &Path) -> Result<(Self, serde_json::Value)> {
        let value = read_value(path)?;
        let kind = RunKind::of(&value);
        if kind != Self::kind() {
            return Err(Error::InvalidArgument {
                name: path.display().to_string(),
                reason: format!(
                    "a `kvbench {kind}` run folder, where a `kvbench {}` one is needed: \
                     `kvbench report`, `gate` and `merge` read both kinds; resume it with \
                     `kvbench {kind} --resume`",
                    Self::kind()
                ),
            });
        }
        let meta = Self::from_value(value.clone(), path)?;
        Ok((meta, value))
    }

    /// [`Self::read`] on JSON already read (`path` names it in errors).
    pub fn from_value(mut value: serde_json::Value, path: &Path) -> Result<Self> {
        let writer = writer(&value);
        let format = value["format"].as_u64().unwrap_or(0);
        if let Some(m) = value.as_object_mut() {
            if m.get("command").is_some_and(|c| c.is_string()) {
                m.insert("kind".into(), "serve".into());
                m.insert("command".into(), serde_json::Value::Array(Vec::new()));
            }
            if !m.contains_key("run_id") {
                let name = path
                    .parent()
                    .and_then(|d| d.file_name())
                    .map_or(String::new(), |n| n.to_string_lossy().into_owned());
                m.insert("run_id".into(), name.into());
            }
        }
        if value.get("report_context").is_none() {
            if let Some(c) = C::from_legacy(&value) {
                if let Ok(c) = serde_json::to_value(c) {
                    value["report_context"] = c;
                }
            }
        }
        serde_json::from_value(value).map_err(|e| Error::InvalidArgument {
            name: path.display().to_string(),
            reason: format!(
                "meta.json format {format} written by kvbench {writer} cannot be read by \
                 kvbench {} ({e}); re-render it with kvbench {writer}, or re-run it",
                version()
            ),
        })
    }
}

/// kvbench's version and the git revision it was built from (`-dirty` if uncommitted changes).
pub fn version() -> String {
    format!(
        "{} ({})",
        env!("CARGO_PKG_VERSION"),
        env!("KVBENCH_GIT_REV")
    )
}

/// The machine a run happened on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    /// CPU model name (`/proc/cpuinfo`).
    pub cpu: String,
    /// Logical CPUs visible to the process.
    pub logical_cpus: usize,
    /// Worker threads kvbench used (rayon pool; candle's matmuls use the same count).
    pub threads: usize,
    /// Total memory, bytes.
    pub memory_bytes: Option<u64>,
    /// SIMD features the binary was compiled to use.
    #[serde(default)]
    pub simd: Vec<String>,
    /// Operating system and architecture.
    #[serde(default)]
    pub os: String,
    /// Host name.
    #[serde(default)]
    pub hostname: String,
}

impl Machine {
    /// Probes the current machine.
    pub fn probe() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let mut simd: Vec<String> = Vec::new();
        if cfg!(target_feature = "avx2") {
            simd.push("avx2".into());
        }
        if cfg!(target_feature = "fma") {
            simd.push("fma".into());
        }
        if cfg!(target_feature = "f16c") {
            simd.push("f16c".into());
        }
        if cfg!(target_feature = "avx512f") {
            simd.push("avx512f".into());
        }
        if cfg!(target_feature = "neon") {
            simd.push("neon".into());
        }
        Machine {
            cpu,
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads: rayon::current_num_threads(),
            memory_bytes: memory::total_bytes(),
            simd,
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        }
    }
}

/// Writes `value` as pretty JSON to `path` (atomically: temp file, then rename).
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::io(path, e.into()))?;
    // A failed write (disk full) or rename leaves no stray temp file behind.
    let result = std::fs::write(&tmp, text + "\n")
        .map_err(|e| Error::io(&tmp, e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
