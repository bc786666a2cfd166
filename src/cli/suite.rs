//! Sweep suites: `suites/*.toml` files holding `kvbench sweep` settings under the flags' own
//! names (`batch-sizes = [1, 4]`). Flags given on the command line override the suite; keys the
//! sweep does not know are errors naming the key and the file. The same form, with every value
//! filled in, is kept in `meta.json` as `settings`, which is what `--resume` reads.

use std::path::Path;

use clap::parser::ValueSource;

use super::sweep::{SchemeList, SweepArgs};
use crate::error::{Error, Result};
use crate::model::{DeviceSpec, WeightDtype};
use crate::quality::perplexity::{PplMode, Scoring};

/// Every setting a suite may hold; each one is the `kvbench sweep` flag of the same name.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Suite {
    /// What the suite is for (free text, shown nowhere else).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `--model`.
    pub model: Option<String>,
    /// `--dtypes`: a list or one comma-separated string.
    #[serde(alias = "schemes")]
    pub dtypes: Option<SchemeList>,
    /// `--batch-sizes`.
    pub batch_sizes: Option<Vec<usize>>,
    /// `--seq-lens`.
    pub seq_lens: Option<Vec<usize>>,
    /// `--gen`.
    pub gen: Option<usize>,
    /// `--repeats`.
    pub repeats: Option<usize>,
    /// `--warmup`.
    pub warmup: Option<usize>,
    /// `--min-time`, seconds.
    pub min_time: Option<f64>,
    /// `--ctx`.
    pub ctx: Option<usize>,
    /// `--ppl-windows`.
    pub ppl_windows: Option<usize>,
    /// `--ppl-score`.
    pub ppl_score: Option<Scoring>,
    /// `--ppl-mode`.
    pub ppl_mode: Option<PplMode>,
    /// `--ppl-batch`.
    pub ppl_batch: Option<usize>,
    /// `--rouge-samples`.
    pub rouge_samples: Option<usize>,
    /// `--rouge-doc-tokens`.
    pub rouge_doc_tokens: Option<usize>,
    /// `--rouge-max-new`.
    pub rouge_max_new: Option<usize>,
    /// `--passkey-lengths`.
    pub passkey_lengths: Option<Vec<usize>>,
    /// `--passkey-depths`.
    pub passkey_depths: Option<Vec<f64>>,
    /// `--passkey-trials`.
    pub passkey_trials: Option<usize>,
    /// `--no-kl`.
    pub no_kl: Option<bool>,
    /// `--weights`.
    pub weights: Option<WeightDtype>,
    /// `--prefill-weights`.
    pub prefill_weights: Option<WeightDtype>,
    /// `--ppl-weights`.
    pub ppl_weights: Option<WeightDtype>,
    /// `--seed`.
    pub seed: Option<u64>,
    /// `--threads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// `--device`: `cpu`, `cuda`, `cuda:N`.
    pub device: Option<DeviceSpec>,
    /// `--synthetic`.
    pub synthetic: Option<bool>,
    /// `--memory-limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
}

impl Suite {
    /// Reads a suite file. Errors: [`Error::InvalidArgument`] naming the file, with the TOML
    /// parser's message (line, column, and for an unknown key the key and the keys allowed).
    pub fn read(path: &Path) -> Result<Suite> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::InvalidArgument {
            name: "--suite".into(),
            reason: format!("cannot read {}: {e}", path.display()),
        })?;
        Self::parse(&text, path)
    }

    /// Parses a suite's text (`path` names it in errors). Errors: as [`Suite::read`].
    pub fn parse(text: &str, path: &Path) -> Result<Suite> {
        toml::from_str(text).map_err(|e| Error::InvalidArgument {
            name: format!("--suite {}", path.display()),
            reason: format!("{}: {}", path.display(), e.to_string().trim_end()),
        })
    }

    /// The settings a sweep actually ran with, every value filled in (for `meta.json`).
    pub fn from_args(a: &SweepArgs) -> Suite {
        Suite {
            description: None,
            model: Some(a.model.clone()),
            dtypes: Some(a.schemes.clone()),
            batch_sizes: Some(a.batch_sizes.clone()),
            seq_lens: Some(a.seq_lens.clone()),
            gen: Some(a.gen),
            repeats: Some(a.repeats),
            warmup: Some(a.warmup),
            min_time: Some(a.min_time),
            ctx: Some(a.ctx),
            ppl_windows: Some(a.ppl_windows),
            ppl_score: Some(a.ppl_score),
            ppl_mode: Some(a.ppl_mode),
            ppl_batch: Some(a.ppl_batch),
            rouge_samples: Some(a.rouge_samples),
            rouge_doc_tokens: Some(a.rouge_doc_tokens),
            rouge_max_new: Some(a.rouge_max_new),
            passkey_lengths: Some(a.passkey_lengths.clone()),
            passkey_depths: Some(a.passkey_depths.clone()),
            passkey_trials: Some(a.passkey_trials),
            no_kl: Some(a.no_kl),
            weights: Some(a.weights),
            prefill_weights: Some(a.prefill_weights),
            ppl_weights: Some(a.ppl_weights),
            seed: Some(a.seed),
            // The effective count (all logical CPUs by default), so --resume can check it.
            threads: Some(a.threads.unwrap_or_else(super::checks::logical_cpus)),
            device: Some(a.device),
            synthetic: Some(a.synthetic),
            memory_limit: a.memory_limit.clone(),
        }
    }

    /// Sets every value of this suite on `args`, except where `from_cli(id)` says the flag with
    /// clap id `id` (the field name) was given on the command line.
    pub fn apply(&self, args: &mut SweepArgs, from_cli: impl Fn(&str) -> bool) {
        macro_rules! take {
            ($($key:ident => $field:ident),* $(,)?) => {$(
                if let Some(v) = &self.$key {
                    if !from_cli(stringify!($field)) {
                        args.$field = v.clone();
                    }
                }
            )*};
        }
        take!(
            model => model,
            dtypes => schemes,
            batch_sizes => batch_sizes,
            seq_lens => seq_lens,
            gen => gen,
            repeats => repeats,
            warmup => warmup,
            min_time => min_time,
            ctx => ctx,
            ppl_windows => ppl_windows,
            ppl_score => ppl_score,
            ppl_mode => ppl_mode,
            ppl_batch => ppl_batch,
            rouge_samples => rouge_samples,
            rouge_doc_tokens => rouge_doc_tokens,
            rouge_max_new => rouge_max_new,
            passkey_lengths => passkey_lengths,
            passkey_depths => passkey_depths,
            passkey_trials => passkey_trials,
            no_kl => no_kl,
            weights => weights,
            prefill_weights => prefill_weights,
            ppl_weights => ppl_weights,
            seed => seed,
            device => device,
            synthetic => synthetic,
        );
        if self.threads.is_some() && !from_cli("threads") {
            args.threads = self.threads;
        }
        if self.memory_limit.is_some() && !from_cli("memory_limit") {
            args.memory_limit = self.memory_limit.clone();
        }
    }
}

/// Whether the flag with clap id `id` was given on the command line (not defaulted).
pub fn given_on_cli(matches: Option<&clap::ArgMatches>, id: &str) -> bool {
    matches.is_some_and(|m| {
        m.try_get_raw(id).is_ok() && m.value_source(id) == Some(ValueSource::CommandLine)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unknown key is an error that names the key and the file.
    #[test]
    fn unknown_key_names_key_and_file() {
        let dir = std::env::temp_dir().join(format!("kvbench-suite-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bad.toml");
        std::fs::write(&p, "gen = 8\nbatch-size = [1]\n").unwrap();
        let msg = Suite::read(&p).unwrap_err().to_string();
        assert!(msg.contains("batch-size"), "{msg}");
        assert!(msg.contains("bad.toml"), "{msg}");
        assert!(msg.contains("batch-sizes"), "lists the allowed keys: {msg}");
        std::fs::write(&p, "gen = \"eight\"\n").unwrap();
        let msg = Suite::read(&p).unwrap_err().to_string();
        assert!(msg.contains("gen") && msg.contains("bad.toml"), "{msg}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Schemes as a list or as one comma-separated string parse alike.
    #[test]
    fn dtypes_list_or_string() {
        let a: Suite =
            toml::from_str("dtypes = [\"fp16\", \"int8-channel:group=32,residual=64\"]").unwrap();
        let b: Suite =
            toml::from_str("dtypes = \"fp16,int8-channel:group=32,residual=64\"").unwrap();
        let names = |s: &Suite| {
            s.dtypes
                .as_ref()
                .unwrap()
                .0
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&a), names(&b));
        assert_eq!(names(&a).len(), 2);
    }
}
