//! `meta.json`: every choice that changes a number, so a result can be traced and reproduced.

use std::path::Path;

use crate::error::{Error, Result};
use crate::measure::settings::SweepSettings;
use crate::measure::shard::ShardRecord;
use crate::util::memory;

use super::RowContext;
use serde::Deserialize as _;

/// The `meta.json` format this kvbench writes. 0: folders written before the format was
/// versioned (kvbench 0.1.0 up to 084d7a437093: no `format`, a synthetic run's `mode` a
/// sentence, quality repeated on every point of `raw.jsonl` or in `quality.jsonl`); 1: typed
/// [`RunMeta`], quality as its own `raw.jsonl` record. Both are read.
pub const META_FORMAT: u32 = 1;

/// What kind of run a folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunMode {
    /// `kvbench sweep` on a model: prefill and decode timed, quality measured.
    #[default]
    Model,
    /// `kvbench sweep --synthetic`: attention + append only on synthetic K/V, no weights.
    Synthetic,
}

impl<'de> serde::Deserialize<'de> for RunMode {
    /// `model`, `synthetic`, and format 0's sentence (`synthetic: attention + append only, …`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "model" => Ok(RunMode::Model),
            m if m == "synthetic" || m.starts_with("synthetic:") => Ok(RunMode::Synthetic),
            other => Err(serde::de::Error::custom(format!(
                "unknown run mode `{other}` (this kvbench knows `model` and `synthetic`)"
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

/// `meta.json`: every choice that changes a number, typed where kvbench reads it back
/// (`report`, `--resume`, `merge`); the mode's own sections (model and tokenizer, sweep spec,
/// perplexity protocol, generation tasks, synthetic geometry …) are kept as written in
/// [`RunMeta::details`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunMeta {
    /// [`META_FORMAT`] when written; 0 when absent (older folders).
    #[serde(default)]
    pub format: u32,
    /// kvbench version and git revision that wrote the run ([`version`]).
    pub kvbench: String,
    /// The run id (`<UTC start time>-<label>`).
    pub run_id: String,
    /// Model sweep or synthetic (attention-only) sweep.
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
    /// Every setting, as the flags name them (`--resume` reads these).
    #[serde(deserialize_with = "settings_over_defaults")]
    pub settings: SweepSettings,
    /// What every row repeats, for rebuilding `results.csv` from `raw.jsonl`.
    pub report_context: RowContext,
    /// The mode's own sections, as written.
    #[serde(flatten)]
    pub details: serde_json::Map<String, serde_json::Value>,
}

/// Recorded settings laid over the flags' defaults, so a setting added since a folder was
/// written reads as its default.
fn settings_over_defaults<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<SweepSettings, D::Error> {
    let m = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
    SweepSettings::default()
        .overlay(&m, "meta.json settings", |_| false)
        .map_err(serde::de::Error::custom)
}

impl RunMeta {
    /// Reads a run folder's `meta.json` (`path`). Errors: [`Error::InvalidArgument`] naming the
    /// file: unreadable or not JSON; written by a newer kvbench (a `format` above
    /// [`META_FORMAT`]: the message names both and says to re-render with the writer); or
    /// missing what a report needs (naming the field and the version that wrote it).
    pub fn read(path: &Path) -> Result<(RunMeta, serde_json::Value)> {
        let text = crate::util::read_regular(path).map_err(|e| Error::InvalidArgument {
            name: path.display().to_string(),
            reason: format!("not a kvbench run folder: {e}"),
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::InvalidArgument {
                name: path.display().to_string(),
                reason: format!("not valid JSON: {e}"),
            })?;
        let writer = value["kvbench"]
            .as_str()
            .unwrap_or("an unknown version")
            .to_string();
        if value["command"] == "serve" {
            return Err(Error::InvalidArgument {
                name: path.display().to_string(),
                reason: "a `kvbench serve` run folder: its results.csv and summary.md are \
                         written by serve itself (`kvbench serve --resume` re-renders them); \
                         report, gate, merge and `sweep --resume` read sweep folders"
                    .into(),
            });
        }
        let format = match &value["format"] {
            serde_json::Value::Null => 0,
            v => v.as_u64().ok_or_else(|| Error::InvalidArgument {
                name: path.display().to_string(),
                reason: format!(
                    "`format` is {v}, not a format number (0 to {META_FORMAT}): the file was \
                     edited or damaged; re-run the sweep"
                ),
            })?,
        };
        if format > META_FORMAT as u64 {
            return Err(Error::InvalidArgument {
                name: path.display().to_string(),
                reason: format!(
                    "meta.json format {format}, written by kvbench {writer}, is newer than this kvbench {} reads (formats 0 to {META_FORMAT}); re-render it with kvbench {writer} or newer",
                    version()
                ),
            });
        }
        let meta: RunMeta =
            serde_json::from_value(value.clone()).map_err(|e| Error::InvalidArgument {
                name: path.display().to_string(),
                reason: format!(
                    "meta.json format {format} written by kvbench {writer} cannot be read by kvbench {} ({e}); re-render it with kvbench {writer}, or re-run the sweep",
                    version()
                ),
            })?;
        Ok((meta, value))
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
