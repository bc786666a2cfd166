//! A sweep's plan: its settings checked once, before anything slow runs, and turned into the
//! [`SweepSpec`] the runner executes and the units one process runs (all, or one shard's).
//! The checks that need the model (its context, head size, the text's length) are made by
//! [`SweepPlan::for_model`] once it is loaded. `kvbench slurm` runs [`SweepPlan::check`]
//! before it writes or submits anything.

use crate::error::{Error, Result};
use crate::kv::KvScheme;
use crate::model::DeviceSpec;
use crate::quality::passkey::PasskeySpec;
use crate::quality::perplexity::PplProtocol;

use super::settings::{check_repeats, check_threads, dedup_with_note, SweepSettings};
use super::shard::{self, Shard, ShardRecord, TaskLoad};
use super::sweep::SweepSpec;
use super::unit::Selection;

/// A sweep's settings, checked, with the spec they describe (perplexity still unset: it
/// needs the model's tokenizer).
#[derive(Debug, Clone)]
pub struct SweepPlan {
    /// The settings, with repeated list entries dropped.
    pub settings: SweepSettings,
    /// What to sweep: the fp16 baseline first, every bound checked.
    pub spec: SweepSpec,
}

fn invalid(name: &str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason: reason.into(),
    }
}

impl SweepPlan {
    /// Checks `settings` before anything slow (fetching, loading): `--threads`,
    /// `--memory-limit` only with `--synthetic` (and a size), repeated list entries merged with
    /// a note, warm-up and repeat counts, whether this build can hold the caches on `--device`,
    /// and the spec's bounds ([`SweepSpec::validate`] without a model). Errors:
    /// [`Error::InvalidArgument`] naming the flag.
    pub fn check(settings: &SweepSettings) -> Result<SweepPlan> {
        let mut s = settings.clone();
        check_threads(s.threads.threads)?;
        let syn = &s.synthetic;
        if syn.memory_limit.is_some() && !syn.synthetic {
            return Err(invalid(
                "--memory-limit",
                "applies to --synthetic sweeps only (a model sweep records a point that does \
                 not fit in the memory available as `oom`); drop it or add --synthetic",
            ));
        }
        if let Some(m) = &syn.memory_limit {
            crate::util::size::parse_bytes(m).map_err(|_| {
                invalid(
                    "--memory-limit",
                    format!("`{m}` is not a size like 16GiB or 512MiB"),
                )
            })?;
        }
        dedup_with_note("--batch-sizes", &mut s.grid.batch_sizes);
        dedup_with_note("--seq-lens", &mut s.grid.seq_lens);
        dedup_with_note("--dtypes", &mut s.schemes.dtypes.0);
        let points = s.schemes.dtypes.0.len() * s.grid.batch_sizes.len() * s.grid.seq_lens.len();
        check_repeats(s.timing.warmup, s.timing.repeats, points, s.grid.gen)?;
        kv_caches_on(&s.device.device, s.synthetic.synthetic)?;
        // Checked for a synthetic sweep too, though it times one repeat: every value is
        // recorded in meta.json, which must read back (a NaN `--min-time` was written as null
        // and the folder could not be reported or resumed).
        let spec = spec(&s, None);
        spec.validate(usize::MAX, usize::MAX)?;
        Ok(SweepPlan { settings: s, spec })
    }

    /// The spec of a `--synthetic` sweep: the same points, one timed repeat each, no warm-up,
    /// no quality (attention-only timings on synthetic K/V; see [`super::synthetic`]).
    pub fn synthetic_spec(&self) -> SweepSpec {
        SweepSpec::timing_only(
            self.spec.schemes.clone(),
            self.spec.batch_sizes.clone(),
            self.spec.seq_lens.clone(),
            self.spec.gen,
            self.spec.seed,
        )
    }

    /// The perplexity protocol the settings ask for (`None` with `--ppl-windows 0`); `bos`:
    /// whether the model's tokenizer adds a BOS token.
    pub fn ppl_protocol(&self, bos: bool) -> Option<PplProtocol> {
        let p = &self.settings.perplexity;
        (p.ppl_windows > 0).then_some(PplProtocol {
            mode: p.ppl_mode,
            batch: p.ppl_batch,
            ctx: p.ctx,
            windows: Some(p.ppl_windows),
            scoring: p.ppl_score,
            bos,
            exact_attention: true,
        })
    }

    /// The spec for a loaded model with context `max_ctx` and head size `head_dim`, whose
    /// tokenizer turns the text into `n_tokens` (`bos`: it adds a BOS token): perplexity set,
    /// and what the model bounds checked — the protocol and every point within the context and
    /// the text, every scheme valid at the head size. Errors: [`Error::InvalidArgument`]
    /// naming the flag.
    pub fn for_model(
        &self,
        max_ctx: usize,
        head_dim: usize,
        n_tokens: usize,
        bos: bool,
    ) -> Result<SweepSpec> {
        let ppl = self.ppl_protocol(bos);
        if let Some(p) = &ppl {
            p.validate(max_ctx, n_tokens)?;
        }
        let spec = spec(&self.settings, ppl);
        spec.validate(max_ctx, n_tokens)?;
        for s in &spec.schemes {
            s.validate(head_dim)?;
        }
        Ok(spec)
    }

    /// The units this process runs, for the whole sweep (`shard` `None`) or one shard of it,
    /// with the record `meta.json` keeps (`host`: this machine's name). `quality`: whether the
    /// sweep measures quality; `load`: its generation tasks' size, for the costs. Errors:
    /// [`shard::assign`]'s.
    pub fn select(
        spec: &SweepSpec,
        shard: Option<Shard>,
        quality: bool,
        load: TaskLoad,
        host: String,
    ) -> Result<(Selection, Option<ShardRecord>)> {
        let units = shard::plan(spec, quality);
        let Some(shard) = shard else {
            return Ok((Selection::new(units), None));
        };
        let costs: Vec<f64> = units.iter().map(|u| shard::cost(u, spec, load)).collect();
        let plan = shard::assign(&units, &costs, shard.count)?;
        let mine: Vec<_> = plan
            .iter()
            .filter(|a| a.shard == shard.index)
            .map(|a| a.unit)
            .collect();
        eprintln!(
            "shard {shard}: {} of the sweep's {} units (timing points and per-scheme quality)",
            mine.len(),
            units.len()
        );
        let record = ShardRecord {
            index: shard.index,
            count: shard.count,
            host,
            plan,
        };
        Ok((Selection::new(mine), Some(record)))
    }
}

/// The spec `s` describes with perplexity `ppl`: the fp16 baseline first (so every later row
/// can carry its perplexity delta), each scheme once.
pub fn spec(s: &SweepSettings, ppl: Option<PplProtocol>) -> SweepSpec {
    let mut schemes = s.schemes.dtypes.0.clone();
    schemes.dedup();
    if let Some(i) = schemes.iter().position(|x| *x == KvScheme::FP16) {
        let fp16 = schemes.remove(i);
        schemes.insert(0, fp16);
    }
    SweepSpec {
        schemes,
        batch_sizes: s.grid.batch_sizes.clone(),
        seq_lens: s.grid.seq_lens.clone(),
        gen: s.grid.gen,
        ppl,
        seed: s.seed.seed,
        warmup: s.timing.warmup,
        repeats: s.timing.repeats,
        min_time_s: s.timing.min_time,
        kl: !s.perplexity.no_kl,
        rouge_samples: s.rouge.rouge_samples,
        passkey: (!s.passkey.passkey_lengths.is_empty()).then(|| PasskeySpec {
            lengths: s.passkey.passkey_lengths.clone(),
            depths: s.passkey.passkey_depths.clone(),
            trials: s.passkey.passkey_trials,
            seed: s.seed.seed,
        }),
        ppl_noise_floor: s.perplexity.ppl_noise_floor,
    }
}

/// Whether this build can hold the sweep's KV caches on `device`: every cache the sweep makes
/// (timing points, perplexity, generation) is a [`crate::kv::AnyCache`] on the model's device,
/// CUDA caches only in a build with the `cuda` feature; `--synthetic` sweeps are CPU-only
/// (use `kvbench attn-bench --device cuda:N` for attention-only GPU timings).
///
/// Errors: [`Error::InvalidArgument`] (`--device`) otherwise.
fn kv_caches_on(device: &DeviceSpec, synthetic: bool) -> Result<()> {
    match device {
        DeviceSpec::Cpu => Ok(()),
        DeviceSpec::Cuda(_) if !cfg!(feature = "cuda") => Err(invalid(
            "--device",
            format!(
                "`{device}` needs a kvbench built with CUDA support; rebuild with \
                 `cargo build --release --features cuda`, or pass --device cpu"
            ),
        )),
        DeviceSpec::Cuda(_) if synthetic => Err(invalid(
            "--device",
            format!(
                "`{device}` with --synthetic: the synthetic sweep runs on the CPU; for \
                 attention-only timings on the GPU use `kvbench attn-bench --device {device}`"
            ),
        )),
        DeviceSpec::Cuda(_) => Ok(()),
    }
}
