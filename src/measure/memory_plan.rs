//! The memory plan made before any weight is loaded: what each phase's weights, the KV cache
//! at the largest point and the activations will occupy, against the memory available — so an
//! 8B model on a 24 GiB machine either runs with a lean choice said out loud or is refused
//! with the flag that fixes it, instead of being killed by the OOM killer minutes in.
//!
//! Method, as llama.cpp's loader (`llama_model_loader`: tensors mapped, only converted ones
//! allocated) and vLLM's startup check (weights + activation peak + KV against the memory
//! utilization target, refusing with the flag to change):
//! - **mapped**: a GGUF on the CPU is mapped once and its pages read at load
//!   ([`crate::model::mapped`]): the file's tensor bytes count once, whatever the phases;
//! - **converted**: per distinct weight dtype of the phases that run, each matrix the dtype does
//!   not run in place ([`WeightDtype::converted_bytes`]: f32 4 bytes per weight, Q8_0 34 per
//!   32), plus the norms and biases as f32; phases with the same dtype share one model;
//! - **KV**: the largest cache a point holds (batch × (prompt + generated) tokens, or a
//!   perplexity window), in the costliest scheme of the run;
//! - **activations**: the larger of the prefill's (tokens × (4·hidden + 3·ffn) f32, plus one
//!   layer's attention scores batch × heads × prompt² f32) and perplexity's (window ×
//!   (4·hidden + 3·ffn + 2·vocab) f32: the logits and their log-softmax).
//!
//! `auto` phases (`--prefill-weights auto`, `--ppl-weights auto`, the defaults) take f32 when
//! everything fits, else the decode weights' dtype; the choice and its reason are printed and
//! recorded in `meta.json`. An explicit choice that does not fit is refused (exit 2).

use candle_core::quantized::GgmlDType;

use crate::error::{Error, Result};
use crate::model::WeightDtype;

/// Share of the available memory a plan may fill: the rest is left for the allocator's
/// fragmentation, the tokenizer, the report and whatever else the machine runs (vLLM leaves
/// 10 % by default with `--gpu-memory-utilization 0.9`).
pub const FILL: f64 = 0.9;

/// `--prefill-weights` / `--ppl-weights`: a weight dtype, or `auto` (f32 when the memory plan
/// fits, else the decode weights' dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightChoice {
    /// Decided by the memory plan.
    Auto,
    /// As given.
    Fixed(WeightDtype),
}

impl std::fmt::Display for WeightChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightChoice::Auto => f.write_str("auto"),
            WeightChoice::Fixed(d) => d.fmt(f),
        }
    }
}

impl std::str::FromStr for WeightChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(WeightChoice::Auto);
        }
        s.parse()
            .map(WeightChoice::Fixed)
            .map_err(|_| Error::InvalidArgument {
                name: "weight dtype".into(),
                reason: format!("`{s}` is not one of auto, f32, q8_0, native"),
            })
    }
}

impl serde::Serialize for WeightChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        crate::util::serde_text::serialize(self, s)
    }
}

impl<'de> serde::Deserialize<'de> for WeightChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        crate::util::serde_text::deserialize(d)
    }
}

/// One stored tensor as the plan needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSize {
    /// Name in the file.
    pub name: String,
    /// Stored format.
    pub dtype: GgmlDType,
    /// Elements.
    pub elems: u64,
    /// Bytes in the file.
    pub stored_bytes: u64,
    /// Whether it is a matrix (linear layer or token table) rather than a norm or bias.
    pub matrix: bool,
}

/// A phase of the run and the weights it asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseAsk {
    /// `decode`, `prefill` or `perplexity`.
    pub phase: &'static str,
    /// The flag that sets it (`--weights`, `--prefill-weights`, `--ppl-weights`).
    pub flag: &'static str,
    /// What was asked.
    pub choice: WeightChoice,
    /// Whether the phase runs at all (perplexity with no windows and no tasks does not).
    pub runs: bool,
}

/// What the plan is made for.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryAsk {
    /// The model's tensors.
    pub tensors: Vec<TensorSize>,
    /// Whether the file is mapped (a GGUF on the CPU): its tensor bytes count once, and the
    /// token table and in-place matrices cost nothing more.
    pub mapped: bool,
    /// The phases; the first is decode, whose dtype `auto` falls back to.
    pub phases: Vec<PhaseAsk>,
    /// KV bytes at the largest point.
    pub kv_bytes: u64,
    /// Activation bytes at the largest point.
    pub activation_bytes: u64,
    /// Bytes available (`None`: unknown, no check).
    pub available: Option<u64>,
}

/// The plan: each phase's weight dtype, the bytes by kind, and why `auto` chose what it did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryPlan {
    /// `(phase, dtype)` in the order asked.
    pub weights: Vec<(String, WeightDtype)>,
    /// The mapped file's tensor bytes.
    pub mapped_bytes: u64,
    /// Bytes of converted weights, per distinct dtype.
    pub converted_bytes: Vec<(WeightDtype, u64)>,
    /// KV bytes at the largest point.
    pub kv_bytes: u64,
    /// Activation bytes.
    pub activation_bytes: u64,
    /// The sum.
    pub total_bytes: u64,
    /// Bytes available when planned.
    pub available_bytes: Option<u64>,
    /// What `auto` decided and why (empty when every phase got what it asked).
    pub notes: Vec<String>,
}

impl MemoryPlan {
    /// The dtype `phase` runs in. Panics on a phase the plan was not made for (a caller bug).
    pub fn dtype(&self, phase: &str) -> WeightDtype {
        self.weights
            .iter()
            .find(|(p, _)| p == phase)
            .map(|(_, d)| *d)
            .expect("a phase of the plan")
    }
}

/// Bytes the converted weights of one dtype take: every matrix it does not run in place, the
/// token table (0 when mapped: looked up row by row), the head again when tied (no
/// `output.weight`), norms and biases as f32.
pub fn converted_bytes(ask: &MemoryAsk, dtype: WeightDtype) -> u64 {
    let conv = |t: &TensorSize| {
        if ask.mapped {
            dtype.converted_bytes(t.dtype, t.elems, t.stored_bytes)
        } else {
            // Read into memory: even a format used as stored is a copy.
            dtype
                .converted_bytes(t.dtype, t.elems, t.stored_bytes)
                .max(t.stored_bytes * u64::from(dtype.keeps_stored(t.dtype)))
        }
    };
    let tied = !ask.tensors.iter().any(|t| t.name == "output.weight");
    ask.tensors
        .iter()
        .map(|t| match (t.matrix, t.name.as_str()) {
            (false, _) => t.elems * 4,
            (true, "token_embd.weight") => {
                let table = if ask.mapped { 0 } else { t.elems * 4 };
                table + if tied { conv(t) } else { 0 }
            }
            (true, _) => conv(t),
        })
        .sum()
}

/// Makes the plan: resolves `auto` phases (f32, or the decode dtype when f32 does not fit in
/// [`FILL`] of the available memory) and checks the total. Errors:
/// [`Error::InvalidArgument`] naming the phase, its flag, the bytes and what to pass instead
/// when an explicit choice does not fit, or naming the model when even the leanest choice does
/// not (exit 2).
pub fn plan(ask: &MemoryAsk) -> Result<MemoryPlan> {
    let decode = match ask.phases.first().map(|p| p.choice) {
        Some(WeightChoice::Fixed(d)) => d,
        _ => WeightDtype::Q8_0,
    };
    let resolve = |lean: bool| -> Vec<(String, WeightDtype)> {
        ask.phases
            .iter()
            .map(|p| {
                let d = match p.choice {
                    _ if !p.runs => decode,
                    WeightChoice::Fixed(d) => d,
                    WeightChoice::Auto if lean => decode,
                    WeightChoice::Auto => WeightDtype::F32,
                };
                (p.phase.to_string(), d)
            })
            .collect()
    };
    let mut weights = resolve(false);
    let mut made = make(ask, &weights);
    let budget = ask.available.map(|a| (a as f64 * FILL) as u64);
    let fits = |p: &MemoryPlan| budget.is_none_or(|b| p.total_bytes <= b);
    let mut notes = Vec::new();
    if !fits(&made) && weights != resolve(true) {
        let before = made.total_bytes;
        weights = resolve(true);
        made = make(ask, &weights);
        let moved: Vec<String> = ask
            .phases
            .iter()
            .filter(|p| p.runs && p.choice == WeightChoice::Auto)
            .map(|p| format!("{} ({} auto)", p.phase, p.flag))
            .collect();
        notes.push(format!(
            "memory plan: f32 weights would take {} in all, more than {:.0} % of the {} \
             available; {} take{} {decode} weights instead ({} in all). Quality numbers are then \
             measured through {decode} weights (recorded as weight_dtype_perplexity); pass \
             `--ppl-weights f32` on a machine with more memory for exact ones",
            gb(before),
            FILL * 100.0,
            gb(ask.available.unwrap_or(0)),
            moved.join(" and "),
            if moved.len() == 1 { "s" } else { "" },
            gb(made.total_bytes),
        ));
    }
    // The weights must fit; a point whose KV or activations do not is the sweep's to record
    // as `oom` (it checks each point before building it).
    let weights_fit = |p: &MemoryPlan| {
        budget.is_none_or(|b| p.total_bytes - p.kv_bytes - p.activation_bytes <= b)
    };
    if !weights_fit(&made) {
        let avail = gb(ask.available.unwrap_or(0));
        let heavy = ask
            .phases
            .iter()
            .zip(&weights)
            .filter(|(p, (_, d))| {
                p.runs && *d != decode && matches!(p.choice, WeightChoice::Fixed(_))
            })
            .map(|(p, (_, d))| (p, *d))
            .next();
        let breakdown = breakdown(&made);
        return Err(match heavy {
            Some((p, d)) => Error::InvalidArgument {
                name: p.flag.into(),
                reason: format!(
                    "the {} phase's {d} weights do not fit: the plan needs {} ({breakdown}) and \
                     {:.0} % of the {avail} available is {}; pass {} {decode} (or auto) to run \
                     that phase on the decode weights",
                    p.phase,
                    gb(made.total_bytes),
                    FILL * 100.0,
                    gb(budget.unwrap_or(0)),
                    p.flag
                ),
            },
            None => Error::InvalidArgument {
                name: "--model".into(),
                reason: format!(
                    "the model does not fit even with {decode} weights in every phase: the plan \
                     needs {} ({breakdown}) and {:.0} % of the {avail} available is {}; try \
                     `--weights native` for a smaller quantized file, smaller --batch-sizes / \
                     --seq-lens, a machine with more memory, or `--synthetic` (attention only, \
                     no weights)",
                    gb(made.total_bytes),
                    FILL * 100.0,
                    gb(budget.unwrap_or(0)),
                ),
            },
        });
    }
    made.notes = notes;
    Ok(made)
}

/// The plan for fixed `weights`.
fn make(ask: &MemoryAsk, weights: &[(String, WeightDtype)]) -> MemoryPlan {
    // A phase that does not run already carries the decode dtype ([`plan`]'s resolve).
    let mut dtypes: Vec<WeightDtype> = Vec::new();
    for (_, d) in weights {
        if !dtypes.contains(d) {
            dtypes.push(*d);
        }
    }
    let converted: Vec<(WeightDtype, u64)> = dtypes
        .iter()
        .map(|&d| (d, converted_bytes(ask, d)))
        .collect();
    let mapped_bytes = if ask.mapped {
        ask.tensors.iter().map(|t| t.stored_bytes).sum()
    } else {
        0
    };
    let total_bytes = converted
        .iter()
        .fold(mapped_bytes, |t, (_, b)| t.saturating_add(*b))
        .saturating_add(ask.kv_bytes)
        .saturating_add(ask.activation_bytes);
    MemoryPlan {
        weights: weights.to_vec(),
        mapped_bytes,
        converted_bytes: converted,
        kv_bytes: ask.kv_bytes,
        activation_bytes: ask.activation_bytes,
        total_bytes,
        available_bytes: ask.available,
        notes: Vec::new(),
    }
}

/// `mapped file 8.54 GB + f32 weights 32.12 GB + KV 0.27 GB + activations 0.65 GB`.
pub fn breakdown(p: &MemoryPlan) -> String {
    let mut parts = Vec::new();
    if p.mapped_bytes > 0 {
        parts.push(format!("mapped file {}", gb(p.mapped_bytes)));
    }
    for (d, b) in &p.converted_bytes {
        if *b > 0 {
            parts.push(format!("{d} weights {}", gb(*b)));
        }
    }
    parts.push(format!("KV {}", gb(p.kv_bytes)));
    parts.push(format!("activations {}", gb(p.activation_bytes)));
    parts.join(" + ")
}

/// Activation bytes (see the module docs): prefill of `batch × prompt` tokens, perplexity over
/// `ppl_ctx` tokens (0: none).
pub fn activation_bytes(
    hidden: usize,
    ffn: usize,
    vocab: usize,
    q_heads: usize,
    batch: usize,
    prompt: usize,
    ppl_ctx: usize,
) -> u64 {
    let [hidden, ffn, vocab, q_heads, batch, prompt, ppl_ctx] =
        [hidden, ffn, vocab, q_heads, batch, prompt, ppl_ctx].map(|x| x as u128);
    let per_token = (4 * hidden + 3 * ffn) * 4;
    let prefill = batch * prompt * per_token + batch * q_heads * prompt * prompt * 4;
    let ppl = ppl_ctx * (per_token + 2 * vocab * 4);
    u64::try_from(prefill.max(ppl)).unwrap_or(u64::MAX)
}

/// Memory available to this process: the kernel's `MemAvailable`, capped by a cgroup v2 limit
/// (`memory.max − memory.current`) when the process runs under one (containers, CI, Slurm).
pub fn available_now() -> Option<u64> {
    let mem = crate::util::memory::available_bytes();
    let read = |f: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let cg = match (read("memory.max"), read("memory.current")) {
        (Some(max), Some(cur)) => Some(max.saturating_sub(cur)),
        _ => None,
    };
    match (mem, cg) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Bytes as `12.34 GB` (10⁹, as `ls -l` and the model cards count file sizes).
pub fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-3-8B's shapes as a Q8_0 GGUF, by hand: 32 layers × (2·4096² + 2·1024·4096 +
    /// 3·14336·4096) weights + 2 × 128256·4096 (table and head), Q8_0 at 34 bytes per 32.
    fn llama3_8b_q8() -> Vec<TensorSize> {
        let q8 = |name: &str, rows: u64, cols: u64| TensorSize {
            name: name.into(),
            dtype: GgmlDType::Q8_0,
            elems: rows * cols,
            stored_bytes: rows * cols / 32 * 34,
            matrix: true,
        };
        let mut v = vec![
            q8("token_embd.weight", 128256, 4096),
            q8("output.weight", 128256, 4096),
        ];
        for i in 0..32 {
            for (n, r, c) in [
                ("attn_q", 4096, 4096),
                ("attn_k", 1024, 4096),
                ("attn_v", 1024, 4096),
                ("attn_output", 4096, 4096),
                ("ffn_gate", 14336, 4096),
                ("ffn_up", 14336, 4096),
                ("ffn_down", 4096, 14336),
            ] {
                v.push(q8(&format!("blk.{i}.{n}.weight"), r, c));
            }
            for n in ["attn_norm", "ffn_norm"] {
                v.push(TensorSize {
                    name: format!("blk.{i}.{n}.weight"),
                    dtype: GgmlDType::F32,
                    elems: 4096,
                    stored_bytes: 4096 * 4,
                    matrix: false,
                });
            }
        }
        v
    }

    fn ask(prefill: WeightChoice, ppl: WeightChoice, available: u64) -> MemoryAsk {
        let phase = |phase, flag, choice| PhaseAsk {
            phase,
            flag,
            choice,
            runs: true,
        };
        MemoryAsk {
            tensors: llama3_8b_q8(),
            mapped: true,
            phases: vec![
                phase(
                    "decode",
                    "--weights",
                    WeightChoice::Fixed(WeightDtype::Q8_0),
                ),
                phase("prefill", "--prefill-weights", prefill),
                phase("perplexity", "--ppl-weights", ppl),
            ],
            kv_bytes: 1_000_000_000,
            activation_bytes: 500_000_000,
            available: Some(available),
        }
    }

    // By hand: per layer 218,103,808 weights (2·16,777,216 + 2·4,194,304 + 3·58,720,256);
    // 32 layers 6,979,321,856; table and head 2 × 525,336,576; all 8,029,995,008 weights —
    // with the 65 norms of 4,096 the 8,030,261,248 parameters Meta-Llama-3-8B's card states.
    const MATRIX_WEIGHTS: u64 = 8_029_995_008;
    const NORM_BYTES: u64 = 32 * 2 * 4096 * 4;

    #[test]
    fn llama3_8b_by_hand() {
        let a = ask(WeightChoice::Auto, WeightChoice::Auto, 1 << 50);
        let p = plan(&a).unwrap();
        assert_eq!(p.mapped_bytes, MATRIX_WEIGHTS / 32 * 34 + NORM_BYTES);
        // f32: every matrix but the mapped table (the head is untied), norms as f32.
        let f32_bytes = (MATRIX_WEIGHTS - 525_336_576) * 4 + NORM_BYTES;
        assert_eq!(
            p.converted_bytes,
            vec![
                (WeightDtype::Q8_0, NORM_BYTES),
                (WeightDtype::F32, f32_bytes)
            ]
        );
        assert_eq!(
            p.total_bytes,
            p.mapped_bytes + NORM_BYTES + f32_bytes + 1_500_000_000
        );
        assert_eq!(p.dtype("prefill"), WeightDtype::F32);
        assert!(p.notes.is_empty());
    }

    /// 22 GB available: f32 (30.0 GB) does not fit, so both auto phases take q8_0 and say so;
    /// the plan is then the mapped file + norms + KV + activations (10.04 GB ≤ 19.8 GB).
    #[test]
    fn auto_falls_back_to_the_decode_weights() {
        let p = plan(&ask(WeightChoice::Auto, WeightChoice::Auto, 22_000_000_000)).unwrap();
        assert_eq!(p.dtype("prefill"), WeightDtype::Q8_0);
        assert_eq!(p.dtype("perplexity"), WeightDtype::Q8_0);
        assert_eq!(
            p.total_bytes,
            MATRIX_WEIGHTS / 32 * 34 + 2 * NORM_BYTES + 1_500_000_000
        );
        assert_eq!(p.notes.len(), 1);
        assert!(
            p.notes[0].contains("prefill (--prefill-weights auto) and perplexity"),
            "{}",
            p.notes[0]
        );
    }

    #[test]
    fn an_explicit_choice_that_does_not_fit_is_refused_with_its_flag() {
        let fixed = WeightChoice::Fixed(WeightDtype::F32);
        let e = plan(&ask(fixed, WeightChoice::Auto, 22_000_000_000)).unwrap_err();
        let Error::InvalidArgument { name, reason } = e else {
            panic!()
        };
        assert_eq!(name, "--prefill-weights");
        assert!(reason.contains("prefill phase's f32 weights"), "{reason}");
        assert!(reason.contains("pass --prefill-weights q8_0"), "{reason}");
        let e = plan(&ask(WeightChoice::Auto, fixed, 22_000_000_000)).unwrap_err();
        let Error::InvalidArgument { name, reason } = e else {
            panic!()
        };
        assert_eq!(name, "--ppl-weights");
        assert!(
            reason.contains("perplexity phase's f32 weights"),
            "{reason}"
        );
        // Nothing fits in 4 GB: the model is named, with the ways out.
        let e = plan(&ask(WeightChoice::Auto, WeightChoice::Auto, 4_000_000_000)).unwrap_err();
        let Error::InvalidArgument { name, reason } = e else {
            panic!()
        };
        assert_eq!(name, "--model");
        assert!(reason.contains("--synthetic"), "{reason}");
    }

    /// KV at the largest point beyond the machine: `auto` goes lean, but the run is not
    /// refused — the sweep records each point that does not fit as `oom`.
    #[test]
    fn points_too_large_are_left_to_the_sweep() {
        let mut a = ask(WeightChoice::Auto, WeightChoice::Auto, 22_000_000_000);
        a.kv_bytes = 1 << 50;
        let p = plan(&a).unwrap();
        assert_eq!(p.dtype("prefill"), WeightDtype::Q8_0);
    }

    #[test]
    fn phases_that_do_not_run_cost_nothing() {
        let mut a = ask(
            WeightChoice::Auto,
            WeightChoice::Fixed(WeightDtype::F32),
            1 << 50,
        );
        a.phases[2].runs = false;
        a.phases[1].choice = WeightChoice::Fixed(WeightDtype::Q8_0);
        let p = plan(&a).unwrap();
        assert_eq!(p.converted_bytes, vec![(WeightDtype::Q8_0, NORM_BYTES)]);
        assert_eq!(p.dtype("perplexity"), WeightDtype::Q8_0);
    }

    #[test]
    fn weight_choice_parses_and_prints() {
        assert_eq!("auto".parse::<WeightChoice>().unwrap(), WeightChoice::Auto);
        assert_eq!(
            "q8_0".parse::<WeightChoice>().unwrap(),
            WeightChoice::Fixed(WeightDtype::Q8_0)
        );
        assert_eq!(WeightChoice::Fixed(WeightDtype::F32).to_string(), "f32");
        assert!("f16".parse::<WeightChoice>().is_err());
    }
}
