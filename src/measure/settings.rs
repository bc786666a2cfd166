//! Every setting of a sweep, written once: [`SweepSettings`] is at the same time the
//! `kvbench sweep` flags (clap `Args`, flattened groups), a suite file's keys (`suites/*.toml`,
//! the flags' own kebab-case names), `meta.json`'s `settings` (serde), and what `--resume`
//! reads back. Subcommands that share a setting flatten the same group ([`ModelArgs`],
//! [`SchemeArgs`], [`GridArgs`], [`DeviceArgs`], …), so a flag has one name everywhere; old
//! spellings stay as aliases (`--schemes` for `--dtypes`, `schemes` in a suite).
//!
//! Layering (ripgrep's low/high args): clap defaults ← a suite's keys ← flags given on the
//! command line; [`Settings::overlay`] does the middle step generically through serde for any
//! settings type (`SweepSettings` here, `crate::serve::settings::ServeSettings`), so a new flag
//! is one field in one group, and a suite, a `meta.json` and `--resume` know it at once.

use std::path::Path;

use super::memory_plan::WeightChoice;
use crate::error::{Error, Result};
use crate::kv::KvScheme;
use crate::model::{hub, DeviceSpec, WeightDtype};
use crate::quality::paired::CiMethod;
use crate::quality::perplexity::{PplMode, Scoring};

/// A parsed `--dtypes` list. Serialized (meta.json's `settings.dtypes`) as a list of spec
/// strings, each a scheme's printed name. Read back from a list of strings (each entry parsed on
/// its own, never joined with its neighbours, so a name's own commas stay its parameters; an
/// entry may itself be a comma-separated list) or from one comma-separated string (a suite's
/// `dtypes = "fp16,int8"`). Errors: the first bad entry's [`Error::UnknownScheme`] text.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemeList(pub Vec<KvScheme>);

impl serde::Serialize for SchemeList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for SchemeList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Form {
            One(String),
            Many(Vec<String>),
        }
        let entries = match Form::deserialize(d)? {
            Form::One(s) => vec![s],
            Form::Many(v) => v,
        };
        let mut schemes = Vec::new();
        for entry in &entries {
            let parsed = crate::kv::parse_scheme_list(entry).map_err(serde::de::Error::custom)?;
            schemes.extend(parsed);
        }
        Ok(SchemeList(schemes))
    }
}

/// Parses a comma-separated scheme list (`fp16,int8-channel:group=32,h2o`). Errors:
/// [`Error::InvalidArgument`] naming the bad spec and listing the valid ones.
pub fn parse_schemes(s: &str) -> Result<SchemeList> {
    crate::kv::parse_scheme_list(s).map(SchemeList)
}

pub use super::suites::{read_suite_file, MAX_SUITE_BYTES};

/// `--model`.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ModelArgs {
    /// Model: `default` (SmolLM2-135M-Instruct, fetched on first use), `gemma-3-270m` (Gemma 3
    /// 270M Q4_K_M, fetched on first use), a .gguf file, a folder
    /// with config.json + tokenizer.json + *.safetensors, an alias (llama-3-8b,
    /// llama-3-8b-instruct, llama-2-7b, mistral-7b, qwen2.5-0.5b, qwen2.5-7b, smollm2-135m) or a
    /// Hugging Face repo id.
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,
}

/// `--dtypes` (alias `--schemes`): the KV-cache schemes.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct SchemeArgs {
    /// KV-cache schemes, comma-separated.
    #[arg(long = "dtypes", visible_alias = "schemes", default_value = "fp16,int8,int4",
          value_parser = parse_schemes,
          help = format!("KV-cache schemes, comma-separated: {}", crate::kv::VALID_SCHEMES))]
    #[serde(alias = "schemes")]
    pub dtypes: SchemeList,
}

/// `--batch-sizes`, `--seq-lens`, `--gen`: the points of the grid.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct GridArgs {
    /// Batch sizes (sequences decoded together), comma-separated.
    #[arg(
        long,
        visible_alias = "batch",
        value_delimiter = ',',
        default_value = "1,4"
    )]
    pub batch_sizes: Vec<usize>,
    /// Prompt lengths in tokens, comma-separated.
    #[arg(
        long,
        visible_alias = "seq-len",
        value_delimiter = ',',
        default_value = "128,512"
    )]
    pub seq_lens: Vec<usize>,
    /// Tokens generated per sequence (greedy); TPOT is measured over the last gen−1.
    #[arg(long, default_value_t = 32)]
    pub gen: usize,
}

/// How each point is timed.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TimingArgs {
    /// Untimed warm-up repeats before each point (4 tokens each).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed repeats per point, each with a fresh cache (TTFT and TPOT samples); the schemes'
    /// repeats at one point run interleaved, in a seeded random order per round.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Keep repeating each point until its timed total reaches this many seconds.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    pub min_time: f64,
}

/// `--seed`: every seeded choice of a run (prompt offsets in the text, the interleaving order,
/// a serving run's arrivals and lengths).
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct SeedArgs {
    /// Seed for every random choice of the run (prompt offsets, interleaving order, arrivals,
    /// lengths).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `--threads`.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct ThreadArgs {
    /// Worker threads (default: all logical CPUs).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

/// Perplexity and KL divergence on WikiText-2.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PerplexityArgs {
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
    /// Windows decoded together in decode mode.
    #[arg(long, default_value_t = 8)]
    pub ppl_batch: usize,
    /// Skip the lockstep comparison with the fp16 cache (KL divergence, top-1 agreement), which
    /// doubles perplexity time for every other scheme.
    #[arg(long)]
    pub no_kl: bool,
    /// Paired 95 % interval of ΔPPL against the fp16 cache over per-window NLL differences:
    /// `t` (Student t) or `bootstrap[:B[:seed]]` (percentile bootstrap, B resamples, default
    /// 10000, seed 0). Recorded in the `ci_method` column.
    #[arg(long, default_value = "t", value_name = "t|bootstrap[:B[:SEED]]")]
    #[serde(default)]
    pub ppl_ci: CiMethod,
    /// Rerun each scheme's perplexity K more times with every layer's input hidden state moved
    /// one ulp up or down at random (seeded by `--seed` + k) and report the spread
    /// (`noise_floor_*` columns): below it two schemes cannot be told apart. 0: off; K ≥ 2
    /// otherwise. Costs K extra perplexity runs per scheme.
    #[arg(long, default_value_t = 0, value_name = "K")]
    #[serde(default)]
    pub ppl_noise_floor: usize,
    /// Weights during perplexity (and the generation tasks): f32 keeps quality numbers exact;
    /// auto takes f32 when the memory plan fits, else the decode weights (said and recorded).
    #[arg(long, default_value = "auto", value_name = "auto|f32|q8_0|native")]
    pub ppl_weights: WeightChoice,
}

/// ROUGE on XSum summaries.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RougeArgs {
    /// XSum articles to summarize per scheme (greedy, the model's chat template) for ROUGE;
    /// 0 skips it.
    #[arg(long, default_value_t = 0)]
    pub rouge_samples: usize,
    /// Article tokens kept in each summarization prompt.
    #[arg(long, default_value_t = 768)]
    pub rouge_doc_tokens: usize,
    /// Most tokens generated per summary.
    #[arg(long, default_value_t = 64)]
    pub rouge_max_new: usize,
}

/// Passkey retrieval.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PasskeyArgs {
    /// Passkey retrieval prompt lengths in tokens, comma-separated (e.g. 512,1024,2048); empty
    /// skips it.
    #[arg(long, value_delimiter = ',')]
    pub passkey_lengths: Vec<usize>,
    /// Depths of the pass key in the haystack, %.
    #[arg(long, value_delimiter = ',', default_value = "0,25,50,75,100")]
    pub passkey_depths: Vec<f64>,
    /// Passkey trials (different keys) per length × depth.
    #[arg(long, default_value_t = 1)]
    pub passkey_trials: usize,
}

/// How the linear layers compute in the timed phases (decode steps and prefill); perplexity's
/// are [`PerplexityArgs::ppl_weights`].
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WeightArgs {
    /// Weights during decode steps (TPOT): q8_0 (candle's fastest memory-bound kernel here),
    /// f32 (exact) or native (as stored in the file).
    #[arg(long, default_value = "q8_0")]
    pub weights: WeightDtype,
    /// Weights during prefill (TTFT): f32 runs candle's gemm, ~3× faster than its Q8_0 kernels
    /// on long prompts; auto takes f32 when the memory plan fits, else the decode weights.
    #[arg(long, default_value = "auto", value_name = "auto|f32|q8_0|native")]
    pub prefill_weights: WeightChoice,
}

/// `--device`: where the model (or the cache) runs.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct DeviceArgs {
    /// Device the model runs on: cpu, or cuda / cuda:N (the N-th NVIDIA GPU; needs a build with
    /// `--features cuda`).
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda:N")]
    pub device: DeviceSpec,
}

/// `--synthetic` and its `--memory-limit`: a sweep of the cache work alone.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SyntheticArgs {
    /// Attention-only sweep at the model's real shapes with synthetic K/V: no weights needed,
    /// so any geometry (e.g. --model llama-3-8b) can be timed on a CPU; no perplexity.
    #[arg(long)]
    pub synthetic: bool,
    /// With --synthetic: points whose predicted KV bytes exceed this (e.g. 16GiB) are recorded
    /// as `oom` and skipped (default: the memory available now).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
}

/// Every setting of `kvbench sweep` that changes a number: the flags, a suite's keys and
/// `meta.json`'s `settings`, in one schema (see the module docs).
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct SweepSettings {
    /// `--model`.
    #[command(flatten)]
    #[serde(flatten)]
    pub model: ModelArgs,
    /// `--dtypes`.
    #[command(flatten)]
    #[serde(flatten)]
    pub schemes: SchemeArgs,
    /// `--batch-sizes`, `--seq-lens`, `--gen`.
    #[command(flatten)]
    #[serde(flatten)]
    pub grid: GridArgs,
    /// `--warmup`, `--repeats`, `--min-time`.
    #[command(flatten)]
    #[serde(flatten)]
    pub timing: TimingArgs,
    /// `--seed`.
    #[command(flatten)]
    #[serde(flatten)]
    pub seed: SeedArgs,
    /// `--ctx`, `--ppl-*`, `--no-kl`.
    #[command(flatten)]
    #[serde(flatten)]
    pub perplexity: PerplexityArgs,
    /// `--rouge-*`.
    #[command(flatten)]
    #[serde(flatten)]
    pub rouge: RougeArgs,
    /// `--passkey-*`.
    #[command(flatten)]
    #[serde(flatten)]
    pub passkey: PasskeyArgs,
    /// `--weights`, `--prefill-weights`.
    #[command(flatten)]
    #[serde(flatten)]
    pub weights: WeightArgs,
    /// `--threads`.
    #[command(flatten)]
    #[serde(flatten)]
    pub threads: ThreadArgs,
    /// `--device`.
    #[command(flatten)]
    #[serde(flatten)]
    pub device: DeviceArgs,
    /// `--synthetic`, `--memory-limit`.
    #[command(flatten)]
    #[serde(flatten)]
    pub synthetic: SyntheticArgs,
}

impl Default for SweepSettings {
    /// The flags' defaults (clap's), as `kvbench sweep` with no flag has them.
    fn default() -> Self {
        Self::defaults()
    }
}

impl Settings for SweepSettings {
    const COMMAND: &'static str = "sweep";
    fn threads_mut(&mut self) -> &mut Option<usize> {
        &mut self.threads.threads
    }
}

/// Keys a suite may hold besides the settings.
const SUITE_ONLY_KEYS: &[&str] = &["description", "run-time"];

/// A settings type of a measuring command: at once its flags (clap `Args`, flattened groups), a
/// suite file's keys (the flags' long names), and `meta.json`'s `settings` (serde), which
/// `--resume` reads back. Every method has a default built on those three views, so a settings
/// type only names its command and where its thread count lives.
pub trait Settings:
    Sized + Clone + serde::Serialize + serde::de::DeserializeOwned + clap::Args + clap::FromArgMatches
{
    /// The subcommand (`sweep`, `serve`), for messages.
    const COMMAND: &'static str;

    /// `--threads`, which `meta.json` records filled in ([`Settings::recorded`]).
    fn threads_mut(&mut self) -> &mut Option<usize>;

    /// The flags' defaults (clap's), as `kvbench <command>` with no flag has them.
    fn defaults() -> Self {
        let cmd = Self::augment_args(clap::Command::new(Self::COMMAND).no_binary_name(true));
        let m = cmd
            .try_get_matches_from(Vec::<String>::new())
            .expect("every setting has a default or is optional");
        Self::from_arg_matches(&m).expect("the defaults parse")
    }

    /// The canonical keys (suite files, `meta.json`): the flags' long names without `--`.
    fn keys() -> Vec<String> {
        Self::augment_args(clap::Command::new(Self::COMMAND))
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect()
    }

    /// Other spellings a key may take in a suite or `meta.json`, with the canonical key:
    /// only the names earlier versions wrote (`schemes` for `dtypes`). A flag's other
    /// command-line aliases (`--seq-len`) are not keys: a file holds each setting under one
    /// name, so a near miss is refused as unknown rather than read.
    fn key_aliases() -> Vec<(String, String)> {
        vec![("schemes".into(), "dtypes".into())]
    }

    /// The clap id of a key (`batch-sizes` → `batch_sizes`), to ask whether it was given on
    /// the command line.
    fn arg_id(key: &str) -> String {
        key.replace('-', "_")
    }

    /// These settings with `table`'s values laid over them, except for keys where
    /// `keep(arg_id)` says the current value wins (a flag given on the command line). `source`
    /// names the table in errors (`--suite suites/ci.toml`, `run/meta.json`).
    ///
    /// Errors: [`Error::InvalidArgument`] naming `source` for an unknown key (the nearest keys
    /// first, "did you mean `batch-sizes`?", then every key allowed) or a value of the wrong form (serde's message names the key).
    fn overlay(
        &self,
        table: &serde_json::Map<String, serde_json::Value>,
        source: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Self> {
        let keys = Self::keys();
        let aliases = Self::key_aliases();
        let bad = |reason: String| Error::InvalidArgument {
            name: source.to_string(),
            reason,
        };
        let serde_json::Value::Object(mut merged) =
            serde_json::to_value(self).map_err(|e| bad(e.to_string()))?
        else {
            unreachable!("a struct serializes to an object")
        };
        for (key, value) in table {
            if SUITE_ONLY_KEYS.contains(&key.as_str()) {
                continue;
            }
            let key = aliases
                .iter()
                .find(|(old, _)| old == key)
                .map_or(key.as_str(), |(_, new)| new.as_str());
            if !keys.iter().any(|k| k == key) {
                let near = crate::util::nearest::did_you_mean(
                    key,
                    keys.iter()
                        .map(String::as_str)
                        .chain(SUITE_ONLY_KEYS.iter().copied()),
                );
                return Err(bad(format!(
                    "unknown key `{key}`{near}; the keys are {} (each the `kvbench {}` flag of \
                     the same name)",
                    keys.join(", "),
                    Self::COMMAND
                )));
            }
            if keep(&Self::arg_id(key)) {
                continue;
            }
            // Checked one key at a time so the error names it (serde's flattened structs
            // report the type only).
            let mut one = merged.clone();
            one.insert(key.to_string(), value.clone());
            serde_json::from_value::<Self>(serde_json::Value::Object(one))
                .map_err(|e| bad(format!("{source}: key `{key}`: {e}")))?;
            merged.insert(key.to_string(), value.clone());
        }
        serde_json::from_value(serde_json::Value::Object(merged))
            .map_err(|e| bad(format!("{source}: {e}")))
    }

    /// Reads a suite (TOML, the flags' names as keys) into a table for [`Settings::overlay`]:
    /// the file at `path`, or, where no such path exists, the built-in suite of that name
    /// ([`super::suites::resolve`]). Errors: [`Error::InvalidArgument`] as `resolve` (an
    /// unreadable file, an unknown name listing the built-ins, another command's suite), or
    /// naming the file with the TOML parser's message (line, column).
    fn read_suite(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
        let (text, source) = super::suites::resolve(path, Self::COMMAND)?;
        suite_table(&text, Path::new(&source))
    }

    /// A suite's text laid over the defaults (`path` names it in errors): what
    /// `kvbench <command> --suite` with no other flag runs. Errors: as [`Settings::overlay`]
    /// and [`Settings::read_suite`].
    fn parse_suite(text: &str, path: &Path) -> Result<Self> {
        let table = suite_table(text, path)?;
        Self::defaults().overlay(&table, &format!("--suite {}", path.display()), |_| false)
    }

    /// The settings as recorded in `meta.json`: `threads` filled in with the count used
    /// (`logical_cpus` when not given), so `--resume` can check it.
    fn recorded(&self, logical_cpus: usize) -> Self {
        let mut s = self.clone();
        let t = s.threads_mut();
        *t = Some(t.unwrap_or(logical_cpus));
        s
    }
}

/// A suite's text as a table (`path` names it in errors). TOML's `inf` and `nan` floats become
/// the strings `"inf"`/`"nan"` (JSON has no infinity; a rate of `inf` means "all at once").
/// Errors: [`Error::InvalidArgument`] naming the file, with the TOML parser's message (line,
/// column).
pub fn suite_table(text: &str, path: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    let table: toml::Table = toml::from_str(text).map_err(|e| Error::InvalidArgument {
        name: format!("--suite {}", path.display()),
        reason: format!("{}: {}", path.display(), e.to_string().trim_end()),
    })?;
    Ok(table
        .into_iter()
        .map(|(k, v)| (k, toml_to_json(v)))
        .collect())
}

/// A TOML value as JSON; non-finite floats as strings (`inf`, `-inf`, `nan`).
fn toml_to_json(v: toml::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        toml::Value::String(s) => J::String(s),
        toml::Value::Integer(i) => J::from(i),
        toml::Value::Float(f) if f.is_finite() => J::from(f),
        toml::Value::Float(f) => J::String(f.to_string()),
        toml::Value::Boolean(b) => J::Bool(b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(a) => J::Array(a.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => {
            J::Object(t.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect())
        }
    }
}

// Checks every command makes of its settings before anything slow runs.

fn invalid(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

/// Most worker threads accepted per logical CPU: more only oversubscribes the machine.
pub const MAX_THREADS_PER_CPU: usize = 4;
/// Most untimed warm-up repeats per point.
pub const MAX_WARMUP: usize = 1000;
/// Most timed repeats per point.
pub const MAX_REPEATS: usize = 100_000;

/// Logical CPUs visible to the process.
pub fn logical_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `--threads`: 1 to [`MAX_THREADS_PER_CPU`] × logical CPUs. Errors:
/// [`Error::InvalidArgument`] naming the value and the bound.
pub fn check_threads(threads: Option<usize>) -> Result<()> {
    let cpus = logical_cpus();
    match threads {
        Some(0) => Err(invalid(
            "--threads",
            "0 threads cannot run anything; give 1 or more (default: all logical CPUs)".into(),
        )),
        Some(n) if n > MAX_THREADS_PER_CPU * cpus => Err(invalid(
            "--threads",
            format!(
                "{n} is more than {MAX_THREADS_PER_CPU} × the {cpus} logical CPUs; give at most {}",
                MAX_THREADS_PER_CPU * cpus
            ),
        )),
        _ => Ok(()),
    }
}

/// `--warmup` and `--repeats` within [`MAX_WARMUP`] and [`MAX_REPEATS`]; the message estimates
/// the forward passes asked for (`points × repeats × tokens`).
pub fn check_repeats(warmup: usize, repeats: usize, points: usize, gen: usize) -> Result<()> {
    if warmup > MAX_WARMUP {
        return Err(invalid(
            "--warmup",
            format!(
                "{warmup} untimed repeats per point ({:.3e} forward passes over {points} points) \
                 would run for days; give at most {MAX_WARMUP} (1 to 3 is plenty)",
                warmup as f64 * points as f64 * 4.0
            ),
        ));
    }
    if repeats > MAX_REPEATS {
        return Err(invalid(
            "--repeats",
            format!(
                "{repeats} timed repeats per point ({:.3e} forward passes over {points} points) \
                 would run for days; give at most {MAX_REPEATS}, or use --min-time",
                repeats as f64 * points as f64 * gen as f64
            ),
        ));
    }
    Ok(())
}

/// Drops repeated entries of a list flag, keeping the first of each, and says so on stderr.
pub fn dedup_with_note<T: PartialEq + Clone + std::fmt::Display>(flag: &str, v: &mut Vec<T>) {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    let mut dropped = Vec::new();
    for x in v.drain(..) {
        if out.contains(&x) {
            dropped.push(x.to_string());
        } else {
            out.push(x);
        }
    }
    if !dropped.is_empty() {
        eprintln!(
            "note: {flag} lists {} more than once; each point is measured once",
            dropped.join(", ")
        );
    }
    *v = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(toml_text: &str) -> serde_json::Map<String, serde_json::Value> {
        let t: toml::Table = toml::from_str(toml_text).unwrap();
        match serde_json::to_value(t).unwrap() {
            serde_json::Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    /// The defaults are the flags' documented defaults (read off the `#[arg]`s above by hand).
    #[test]
    fn defaults_are_the_flags() {
        let d = SweepSettings::default();
        assert_eq!(d.grid.batch_sizes, [1, 4]);
        assert_eq!(d.grid.seq_lens, [128, 512]);
        assert_eq!((d.grid.gen, d.timing.repeats, d.timing.warmup), (32, 3, 1));
        assert_eq!((d.perplexity.ctx, d.perplexity.ppl_windows), (512, 4));
        assert_eq!(d.schemes.dtypes.0.len(), 3);
        assert_eq!(d.threads.threads, None);
    }

    /// An unknown key is an error that names the key and the source and lists the keys.
    #[test]
    fn unknown_key_names_key_and_source() {
        let e = SweepSettings::default()
            .overlay(
                &table("gen = 8\nbatch-size = [1]\n"),
                "--suite bad.toml",
                |_| false,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch-size") && e.contains("bad.toml"), "{e}");
        assert!(e.contains("batch-sizes"), "lists the allowed keys: {e}");
        // Issue 26: the nearest keys come first (`batch-size` is one edit from `batch-sizes`;
        // `seq_lens` one from `seq-lens`; `pplwindows` one from `ppl-windows`).
        for (bad, near) in [
            ("batch-size", "`batch-size`; did you mean `batch-sizes`?"),
            ("seq_lens", "`seq_lens`; did you mean `seq-lens`?"),
            ("pplwindows", "`pplwindows`; did you mean `ppl-windows`?"),
        ] {
            let e = SweepSettings::default()
                .overlay(&table(&format!("{bad} = 1\n")), "--suite bad.toml", |_| {
                    false
                })
                .unwrap_err()
                .to_string();
            let (first, rest) = e.split_once("the keys are").unwrap();
            assert!(first.contains(near), "{e}");
            assert!(rest.contains("dtypes"), "{e}");
        }
        let e = SweepSettings::default()
            .overlay(&table("gen = \"eight\"\n"), "--suite bad.toml", |_| false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.toml"), "{e}");
    }

    /// Schemes as a list or as one comma-separated string parse alike, under the canonical key
    /// and the old one; a key kept (given on the command line) is not overwritten.
    #[test]
    fn overlay_applies_aliases_and_keeps_cli() {
        let d = SweepSettings::default();
        let a = d
            .overlay(
                &table("dtypes = [\"fp16\", \"int8-channel:group=32,residual=64\"]"),
                "a",
                |_| false,
            )
            .unwrap();
        let b = d
            .overlay(
                &table("schemes = \"fp16,int8-channel:group=32,residual=64\""),
                "b",
                |_| false,
            )
            .unwrap();
        assert_eq!(a.schemes, b.schemes);
        assert_eq!(a.schemes.dtypes.0.len(), 2);
        let c = d
            .overlay(
                &table("gen = 8\nrepeats = 2\ndescription = \"x\""),
                "c",
                |id| id == "gen",
            )
            .unwrap();
        assert_eq!((c.grid.gen, c.timing.repeats), (32, 2));
    }

    /// Issue 25: every scheme kvbench can name (`kv::spec`'s registry-built list) goes through
    /// meta.json's `SchemeList` and back unchanged, as a list and as one comma-joined string.
    #[test]
    fn every_scheme_round_trips_through_meta_json() {
        let all = crate::kv::spec::tests::every_scheme();
        let list = SchemeList(all.clone());
        let json = serde_json::to_string(&list).unwrap();
        assert!(
            json.starts_with("[\"fp16\",\"fp16+rot\","),
            "{}",
            &json[..40]
        );
        let back: SchemeList = serde_json::from_str(&json).unwrap();
        assert!(back.0 == all, "a scheme changed through JSON");
        // One comma-joined string (a suite's form) reads the same.
        let joined = all
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let one: SchemeList = serde_json::from_value(serde_json::Value::String(joined)).unwrap();
        assert!(one.0 == all, "a scheme changed through the joined form");
    }

    /// Issue 25: meta.json's `settings.dtypes` lists printed names whose own commas are
    /// parameters (`window:size=16,sinks=4@int8-token`); each entry reads on its own, so they
    /// read back as the schemes written, and an entry never merges into its neighbour.
    #[test]
    fn scheme_list_entries_read_on_their_own() {
        let list: SchemeList = serde_json::from_str(
            r#"["window:size=16,sinks=4@int8-token", "h2o:ratio=0.2,recent=32@q4_0", "fp16,int4"]"#,
        )
        .unwrap();
        let want = parse_schemes("window:size=16@int8,h2o:ratio=0.2@q4_0,fp16,int4").unwrap();
        assert_eq!(list, want);
        assert_eq!(
            serde_json::to_string(&list).unwrap(),
            r#"["window:size=16,sinks=4@int8-token","h2o:ratio=0.2,recent=32@q4_0","fp16","int4"]"#
        );
        // A bare parameter as its own entry used to be glued onto the entry before it.
        let e = serde_json::from_str::<SchemeList>(r#"["window:size=16", "sinks=2@int8"]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sinks=2@int8"), "{e}");
    }

    /// What `meta.json` records reads back to the same settings (the `--resume` path), and the
    /// `settings` of a run folder written by kvbench 0.1.0 (084d7a437093) reads as it meant.
    #[test]
    fn recorded_settings_round_trip_and_old_meta_reads() {
        let mut s = SweepSettings::default();
        s.grid.gen = 5;
        let v = serde_json::to_value(s.recorded(7)).unwrap();
        assert_eq!(v["threads"], 7);
        let back = SweepSettings::default()
            .overlay(v.as_object().unwrap(), "meta.json", |_| false)
            .unwrap();
        assert_eq!(back, s.recorded(7));
        let old: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/run-v0-model/meta.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let o = SweepSettings::default()
            .overlay(old["settings"].as_object().unwrap(), "meta.json", |_| false)
            .unwrap();
        assert_eq!(o.grid.seq_lens, [16]);
        assert_eq!(o.grid.gen, 3);
        assert_eq!(o.perplexity.ctx, 64);
        assert_eq!(o.passkey.passkey_lengths, [128]);
        assert_eq!(o.threads.threads, Some(1));
        let names: Vec<String> = o.schemes.dtypes.0.iter().map(|k| k.to_string()).collect();
        assert_eq!(names, ["fp16", "int8-token"]);
    }

    #[test]
    fn duplicate_list_entries_are_merged() {
        let mut v = vec![1usize, 4, 1, 4, 8];
        dedup_with_note("--batch-sizes", &mut v);
        assert_eq!(v, vec![1, 4, 8]);
    }

    #[test]
    fn threads_far_past_the_cpus_are_refused() {
        let cpus = logical_cpus();
        assert!(check_threads(Some(MAX_THREADS_PER_CPU * cpus)).is_ok());
        let e = check_threads(Some(MAX_THREADS_PER_CPU * cpus + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--threads"), "{e}");
        assert!(check_threads(Some(0)).is_err());
        assert!(check_threads(None).is_ok());
    }
}
