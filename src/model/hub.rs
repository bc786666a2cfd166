//! Resolving `--model`: the embedded default, a local GGUF file, a local safetensors folder, or a
//! Hugging Face repo id / alias through hf-hub and its cache (`HF_HOME`, `HF_TOKEN`,
//! `HF_HUB_OFFLINE`), as `transformers` and vLLM resolve them.

use std::path::Path;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo};

use super::{fetch, safetensors, ModelLocation};
use crate::error::{Error, Result};

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
/// 2. an existing `.gguf` file, or a folder with `config.json` + `tokenizer.json` + safetensors;
/// 3. an alias from [`ALIASES`] or an `org/name` repo id: the hf-hub cache first, then a download
///    unless `HF_HUB_OFFLINE=1`.
///
/// Errors: [`Error::ModelNotFound`] naming the input, with what to pass instead.
pub fn resolve(spec: &str) -> Result<ModelLocation> {
    if spec == DEFAULT_MODEL || spec.is_empty() {
        return Ok(ModelLocation::Gguf(fetch::ensure_default_model()?));
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
        .with_progress(true)
        .build()
        .map_err(|e| not_found(format!("the hub client could not start ({e})")))?;
    let api_repo = api.model(repo_id.to_string());
    let fetch = |f: &str| {
        api_repo
            .get(f)
            .map_err(|e| not_found(format!("the hub is unreachable or refused `{f}` ({e})")))
    };
    let config = fetch("config.json")?;
    fetch("tokenizer.json")?;
    match api_repo.get("model.safetensors.index.json") {
        Ok(index) => {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let mut files: Vec<String> = v["weight_map"]
                .as_object()
                .map(|m| {
                    m.values()
                        .filter_map(|f| f.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            files.dedup();
            for f in files {
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
