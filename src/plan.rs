//! Capacity planning: how many concurrent sequences of a given context fit in a memory budget,
//! per KV scheme, after the weights and a reserve — the question vLLM answers at start-up with
//! its max-concurrency line, across schemes and contexts.
//!
//! Bytes come from the same accounting the cache uses ([`KvScheme::bytes_for_held`]): scales,
//! zero-points, residual full-precision rows, eviction caps and bookkeeping, with allocation in
//! blocks of `block` tokens per sequence as vLLM's PagedAttention (Kwon et al. 2023, §4.1; 16
//! tokens by default), so the last block's unused slots are counted as waste.
//!
//! Hybrid models (Gemma 2 and 3, Mistral 7B v0.1; [`crate::kv::SlidingWindow`]) are counted
//! per layer type: a window layer holds `min(n, window)` tokens and a global layer `n`, so a
//! sequence's KV is `(window_layers · min(n, window) + global_layers · n) · bytes per layer
//! token` (Gemma 3 report, arXiv 2503.19786, §2.2). Paged, a window layer keeps the blocks
//! vLLM's `SlidingWindowManager` keeps (at most `⌈window / block⌉ + 1`,
//! [`crate::kv::SlidingWindow::blocks_held`]); a global layer `⌈n / block⌉`.

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme};
use crate::model::geometry::ModelGeometry;

/// What is being planned.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanInput {
    /// Model geometry and parameter count.
    pub model: ModelGeometry,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Share of memory kept free (activations, fragmentation), 0–1.
    pub reserve: f64,
    /// Bytes the weights occupy.
    pub weight_bytes: u64,
    /// Tokens per KV block (paged allocation).
    pub block: usize,
    /// GPUs one model replica is split across (tensor parallelism; 1 = one GPU). Weights and
    /// KV heads are divided among them; with more GPUs than KV heads each GPU holds one
    /// (replicated) KV head, as vLLM (`num_kv_heads // tp`, at least 1).
    pub tensor_parallel: usize,
}

impl PlanInput {
    /// Checks the tensor-parallel size against the model as vLLM does: query heads must
    /// divide evenly, and KV heads either divide evenly among the GPUs or are replicated
    /// (GPUs a multiple of KV heads). Errors: [`Error::InvalidArgument`] naming
    /// `--tensor-parallel` with the head counts.
    pub fn validate_tp(&self) -> Result<()> {
        let (tp, q, kv) = (
            self.tensor_parallel,
            self.model.q_heads,
            self.model.kv_heads,
        );
        if tp == 0 || !q.is_multiple_of(tp) || !(kv.is_multiple_of(tp) || tp.is_multiple_of(kv)) {
            return Err(Error::InvalidArgument {
                name: "--tensor-parallel".into(),
                reason: format!(
                    "{tp} GPUs cannot split {} ({q} query heads, {kv} KV heads): the query \
                     heads must divide evenly and the KV heads divide evenly or be replicated",
                    self.model.name
                ),
            });
        }
        Ok(())
    }

    /// KV heads each GPU of the tensor-parallel group stores: `max(1, kv_heads / tp)`.
    pub fn kv_heads_per_gpu(&self) -> usize {
        (self.model.kv_heads / self.tensor_parallel.max(1)).max(1)
    }

    /// The cache geometry one GPU of the tensor-parallel group holds (its share of the KV and
    /// query heads, every layer).
    pub fn gpu_cache(&self) -> CacheGeometry {
        let g = self.model.cache();
        let tp = self.tensor_parallel.max(1);
        CacheGeometry {
            kv_heads: self.kv_heads_per_gpu(),
            q_heads: (g.q_heads / tp).max(1),
            ..g
        }
    }

    /// Bytes left for the KV cache on each GPU (weights split evenly over the
    /// tensor-parallel group). Errors: [`Error::InvalidArgument`] when the weights and
    /// reserve leave nothing.
    pub fn kv_budget(&self) -> Result<u64> {
        let usable = (self.memory_bytes as f64 * (1.0 - self.reserve)).floor() as u64;
        usable
            .checked_sub(
                self.weight_bytes
                    .div_ceil(self.tensor_parallel.max(1) as u64),
            )
            .filter(|b| *b > 0)
            .ok_or_else(|| Error::InvalidArgument {
                name: "--memory".into(),
                reason: format!(
                    "{:.2} GiB of weights per GPU do not fit in {:.2} GiB after a {:.0} % \
                     reserve; add GPUs with --tensor-parallel or lower --reserve",
                    gib(self
                        .weight_bytes
                        .div_ceil(self.tensor_parallel.max(1) as u64)),
                    gib(usable),
                    self.reserve * 100.0
                ),
            })
    }

    /// KV bytes one sequence of `ctx` tokens occupies on each GPU: (held tokens rounded up to
    /// whole blocks) and the part of that which is rounding waste.
    pub fn seq_bytes(&self, scheme: &KvScheme, ctx: usize) -> (u64, u64) {
        let b = self.seq_bytes_by_layer_type(scheme, ctx);
        let total = b.window_paged + b.global_paged;
        (total, total - b.window - b.global)
    }

    /// [`Self::seq_bytes`] per layer type: exact and paged bytes of the window layers and of
    /// the global layers, on each GPU. Window layers hold `min(held, window)` tokens in the
    /// blocks [`crate::kv::SlidingWindow::blocks_held`] leaves (never more slots than a global
    /// layer's); global layers `held` tokens in `⌈held / block⌉` blocks.
    pub fn seq_bytes_by_layer_type(&self, scheme: &KvScheme, ctx: usize) -> SeqBytes {
        let g = self.gpu_cache();
        let held = scheme.held_tokens(ctx);
        let paged = held.div_ceil(self.block) * self.block;
        let t = g.tokens_held(held);
        let window_paged = g.window.map_or(paged, |w| {
            (w.blocks_held(ctx, self.block) * self.block).min(paged)
        });
        let exact = scheme.bytes_by_layer_type(&g, 1, t.window, t.global);
        let total = scheme.bytes_by_layer_type(&g, 1, window_paged, paged);
        SeqBytes {
            window: exact.window as u64,
            global: exact.global as u64,
            window_paged: total.window as u64,
            global_paged: total.global as u64,
        }
    }

    /// What one sequence of `ctx` tokens would take with every layer global (the count that
    /// ignores sliding windows), paged, on each GPU.
    pub fn naive_seq_bytes(&self, scheme: &KvScheme, ctx: usize) -> u64 {
        let g = self.gpu_cache().without_window();
        let held = scheme.held_tokens(ctx);
        scheme.bytes_for_held(&g, 1, held.div_ceil(self.block) * self.block) as u64
    }
}

/// One sequence's KV bytes per layer type (each GPU's share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqBytes {
    /// Window layers, exact.
    pub window: u64,
    /// Global layers, exact.
    pub global: u64,
    /// Window layers, in whole blocks.
    pub window_paged: u64,
    /// Global layers, in whole blocks.
    pub global_paged: u64,
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanRow {
    /// Model name.
    pub model: String,
    /// Scheme spec.
    pub scheme: String,
    /// Context per sequence, tokens.
    pub ctx: usize,
    /// Tokens held per sequence (eviction schemes cap this).
    pub held_tokens: usize,
    /// Long-run KV bytes per held token, whole model (on each GPU of a tensor-parallel group:
    /// its share of the KV heads).
    pub bytes_per_token: usize,
    /// KV bytes per sequence with paged allocation (window layers + global layers).
    pub kv_bytes_per_seq: u64,
    /// Of which the sliding-window layers' (0 without a window), paged: each holds
    /// `min(context, window)` tokens.
    pub kv_bytes_window_layers: u64,
    /// Of which the global layers' (every layer without a window), paged: each holds the
    /// whole context.
    pub kv_bytes_global_layers: u64,
    /// KV bytes per sequence were every layer global (paged), the count that ignores sliding
    /// windows; equals `kv_bytes_per_seq` without a window.
    pub kv_bytes_all_global: u64,
    /// Of which unused slots of the last block, bytes.
    pub paging_waste_bytes: u64,
    /// Bytes available for KV after weights and reserve.
    pub kv_budget_bytes: u64,
    /// Concurrent sequences that fit (in one tensor-parallel group).
    pub max_concurrency: u64,
    /// GPUs per model replica.
    pub tensor_parallel: usize,
    /// KV heads stored per GPU (`max(1, kv_heads / tensor_parallel)`).
    pub kv_heads_per_gpu: usize,
    /// Model replicas (`gpus / tensor_parallel`, data parallel).
    pub replicas: usize,
    /// Concurrent sequences over every replica (`replicas × max_concurrency`).
    pub total_concurrency: u64,
}

/// Most tokens per KV block `--block-size` takes (2^16): engines use 16 to 256, and past this
/// the block arithmetic (tokens × bytes per token) could overflow (issue #25: a block size of
/// 10^16 wrapped to 512-byte blocks).
pub const MAX_BLOCK_TOKENS: usize = 1 << 16;

/// Max concurrency for every scheme × context, on one replica (tensor-parallel group); see
/// [`plan_gpus`] for several replicas. Errors: [`PlanInput::validate_tp`]'s and
/// [`PlanInput::kv_budget`]'s, and [`Error::InvalidArgument`] naming `--block-size` outside
/// 1 to [`MAX_BLOCK_TOKENS`].
pub fn plan(input: &PlanInput, schemes: &[KvScheme], ctxs: &[usize]) -> Result<Vec<PlanRow>> {
    plan_gpus(input, schemes, ctxs, input.tensor_parallel.max(1))
}

/// [`plan`] for `gpus` GPUs: `gpus / tensor_parallel` replicas, each a tensor-parallel group
/// with its own copy of the weights and its own KV budget. Errors: [`plan`]'s, and
/// [`Error::InvalidArgument`] naming `--gpus` when it is not a multiple of the group size.
pub fn plan_gpus(
    input: &PlanInput,
    schemes: &[KvScheme],
    ctxs: &[usize],
    gpus: usize,
) -> Result<Vec<PlanRow>> {
    input.validate_tp()?;
    if input.block == 0 || input.block > MAX_BLOCK_TOKENS {
        return Err(Error::InvalidArgument {
            name: "--block-size".into(),
            reason: format!(
                "{} tokens per block: give 1 to {MAX_BLOCK_TOKENS} (vLLM uses 16)",
                input.block
            ),
        });
    }
    let tp = input.tensor_parallel;
    if gpus > MAX_GPUS {
        return Err(Error::InvalidArgument {
            name: "--gpus".into(),
            reason: format!("{gpus} GPUs: give at most {MAX_GPUS}"),
        });
    }
    if gpus == 0 || !gpus.is_multiple_of(tp) {
        return Err(Error::InvalidArgument {
            name: "--gpus".into(),
            reason: format!("{gpus} GPUs do not form whole tensor-parallel groups of {tp}"),
        });
    }
    let replicas = gpus / tp;
    let budget = input.kv_budget()?;
    let g = input.gpu_cache();
    Ok(schemes
        .iter()
        .flat_map(|s| {
            ctxs.iter().map(move |&ctx| {
                let (per_seq, waste) = input.seq_bytes(s, ctx);
                let split = input.seq_bytes_by_layer_type(s, ctx);
                PlanRow {
                    model: input.model.name.clone(),
                    scheme: s.to_string(),
                    ctx,
                    held_tokens: s.held_tokens(ctx),
                    bytes_per_token: s.bytes_per_token(&g),
                    kv_bytes_per_seq: per_seq,
                    kv_bytes_window_layers: split.window_paged,
                    kv_bytes_global_layers: split.global_paged,
                    kv_bytes_all_global: input.naive_seq_bytes(s, ctx),
                    paging_waste_bytes: waste,
                    kv_budget_bytes: budget,
                    max_concurrency: budget / per_seq.max(1),
                    tensor_parallel: tp,
                    kv_heads_per_gpu: input.kv_heads_per_gpu(),
                    replicas,
                    total_concurrency: (replicas as u64).saturating_mul(budget / per_seq.max(1)),
                }
            })
        })
        .collect())
}

/// The longest context (tokens) at which `concurrency` sequences fit, searched up to `limit`.
pub fn max_context(
    input: &PlanInput,
    scheme: &KvScheme,
    concurrency: u64,
    limit: usize,
) -> Result<usize> {
    let budget = input.kv_budget()?;
    let fits = |ctx: usize| input.seq_bytes(scheme, ctx).0 * concurrency <= budget;
    if !fits(1) {
        return Ok(0);
    }
    let (mut lo, mut hi) = (1usize, limit);
    if fits(hi) {
        return Ok(hi);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid
        } else {
            hi = mid
        }
    }
    Ok(lo)
}

pub use crate::util::size::{parse_bytes, ByteSize};

/// Parses token counts like `4k`, `32k`, `128k` (k = 1024) or `4096`.
pub fn parse_tokens(s: &str) -> Result<usize> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => (t.as_str(), 1),
    };
    let n = num
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::InvalidArgument {
            name: "--seq-lens".into(),
            reason: format!("`{s}` is not a token count like 4k, 32k or 4096"),
        })?;
    match n.checked_mul(mult) {
        Some(t) if t <= MAX_CONTEXT_TOKENS => Ok(t),
        _ => Err(Error::InvalidArgument {
            name: "--seq-lens".into(),
            reason: format!(
                "`{s}` is past any model's context; give at most {MAX_CONTEXT_TOKENS} tokens \
                 (16384k)"
            ),
        }),
    }
}

/// Longest context `plan` takes, tokens (2^24 = 16,384k, past every model's window): the byte
/// arithmetic per sequence then stays far from overflow (issue #25: 2^64 − 1 tokens wrapped to
/// 0.000 GiB per sequence).
pub const MAX_CONTEXT_TOKENS: usize = 1 << 24;

/// Most GPUs `--gpus` takes (2^20): replicas × sequences then cannot overflow.
pub const MAX_GPUS: usize = 1 << 20;

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::geometry::geometry;

    fn input(model: &str, mem: &str, reserve: f64) -> PlanInput {
        let m = geometry(model).unwrap();
        PlanInput {
            weight_bytes: m.params * 2,
            model: m,
            memory_bytes: parse_bytes(mem).unwrap(),
            reserve,
            block: 16,
            tensor_parallel: 1,
        }
    }

    /// The seeds' figures: Llama-3-70B with an fp16 cache holds 2·80·8·128·2 = 327,680 bytes per
    /// token, 128k tokens = 40 GiB exactly; an fp8 cache with one scale per layer halves it.
    #[test]
    fn llama3_70b_bytes_per_token_and_128k() {
        let i = input("llama-3-70b", "80GiB", 0.0);
        let g = i.model.cache();
        assert_eq!(KvScheme::FP16.bytes_per_token(&g), 327_680);
        let (bytes, waste) = i.seq_bytes(&KvScheme::FP16, 131_072);
        assert_eq!(bytes, 40 << 30);
        assert_eq!(waste, 0);
        let fp8: KvScheme = "fp8:scale=tensor".parse().unwrap();
        assert_eq!(fp8.bytes_per_token(&g), 163_840);
    }

    /// Bytes per token for every scheme on Llama-3-8B (32 layers × 8 kv heads × K and V = 512
    /// rows of head_dim 128 per token), by hand from each row layout.
    #[test]
    fn llama3_8b_bytes_per_token_by_hand() {
        let g = geometry("llama-3-8b").unwrap().cache();
        for (spec, row_k, row_v) in [
            ("fp16", 256, 256),
            ("int8-token", 130, 130),
            ("int4", 80, 80),
            ("fp8", 130, 130),
            ("fp8:scale=tensor", 128, 128),
            ("q8_0", 136, 136),
            ("q4_0", 72, 72),
            ("int8-channel", 136, 130),
            ("int4-channel", 80, 80),
        ] {
            let s: KvScheme = spec.parse().unwrap();
            assert_eq!(s.bytes_per_token(&g), 256 * (row_k + row_v), "{spec}");
        }
    }

    /// 80 GiB, 10 % reserve, Llama-3-8B bf16 weights (8,030,261,248 × 2 bytes): the KV budget is
    /// 77,309,411,328 − 16,060,522,496 = 61,248,888,832 bytes; a 4k fp16 sequence takes
    /// 4096 × 131,072 = 536,870,912 bytes → 114 sequences; int4 (40,960 bytes/token) → 365.
    #[test]
    fn llama3_8b_on_80gib_by_hand() {
        let i = input("llama-3-8b", "80GiB", 0.1);
        assert_eq!(i.kv_budget().unwrap(), 61_248_888_832);
        let rows = plan(&i, &[KvScheme::FP16, "int4".parse().unwrap()], &[4096]).unwrap();
        assert_eq!(rows[0].max_concurrency, 114);
        assert_eq!(rows[1].max_concurrency, 61_248_888_832 / (4096 * 40_960));
        // Paged rounding: 4,100 tokens occupy 257 blocks of 16 = 4,112 slots; 12 slots are waste.
        let (_, waste) = i.seq_bytes(&KvScheme::FP16, 4100);
        assert_eq!(waste, 12 * 131_072);
        // Max context at 114 sequences is at least 4k and below what 113 would allow.
        let c = max_context(&i, &KvScheme::FP16, 114, 1 << 20).unwrap();
        assert!((4096..4096 + 16 * 3).contains(&c), "{c}");
    }

    /// Eviction caps the held tokens: a 1,024-token window plus 4 sinks holds 1,028 tokens
    /// whatever the context, so its concurrency does not fall with context.
    #[test]
    fn eviction_caps_bytes() {
        let i = input("llama-3-8b", "80GiB", 0.1);
        let w: KvScheme = "window:size=1024,sinks=4".parse().unwrap();
        let r = plan(&i, &[w], &[32_768, 131_072]).unwrap();
        assert_eq!(r[0].held_tokens, 1028);
        assert_eq!(r[0].max_concurrency, r[1].max_concurrency);
    }

    #[test]
    fn weights_that_do_not_fit_are_an_error() {
        let i = input("llama-3-70b", "80GiB", 0.1);
        let e = i.kv_budget().unwrap_err().to_string();
        assert!(e.contains("do not fit"), "{e}");
        assert!(parse_bytes("80 parsecs").is_err());
        assert_eq!(parse_tokens("128k").unwrap(), 131_072);
        assert_eq!(parse_bytes("64GB").unwrap(), 64_000_000_000);
    }

    /// Issue #16's figures, by hand. Llama-3-70B (80 layers, 8 KV heads of 128): per-GPU fp16
    /// bytes per token at TP 4 = 2·80·(8/4)·128·2 = 81,920; at TP 16 the 8 heads are replicated,
    /// one per GPU: 2·80·1·128·2 = 40,960. fp8 (one scale per layer) halves them.
    #[test]
    fn tensor_parallel_bytes_by_hand() {
        let mut i = input("llama-3-70b", "80GiB", 0.0);
        let fp8: KvScheme = "fp8:scale=tensor".parse().unwrap();
        i.tensor_parallel = 4;
        assert_eq!(KvScheme::FP16.bytes_per_token(&i.gpu_cache()), 81_920);
        assert_eq!(fp8.bytes_per_token(&i.gpu_cache()), 40_960);
        i.tensor_parallel = 16;
        assert_eq!(i.kv_heads_per_gpu(), 1);
        assert_eq!(KvScheme::FP16.bytes_per_token(&i.gpu_cache()), 40_960);
        i.tensor_parallel = 3;
        assert!(i.validate_tp().is_err());
    }

    /// "Llama-3-70B, fp8 KV, TP 4 on 80 GiB GPUs", by hand: bf16 weights 70,553,706,496 × 2 =
    /// 141,107,412,992 bytes, 35,276,853,248 per GPU; 80 GiB × 0.9 = 77,309,411,328 usable →
    /// 42,032,558,080 bytes of KV per GPU. A 4k sequence in fp8 (scale=tensor) takes
    /// 4096 × 40,960 + 80 layers × 2 scales × 4 bytes = 167,772,800 bytes per GPU → 250
    /// sequences; with 8 GPUs (2 replicas) 500. On one GPU the weights do not fit.
    #[test]
    fn llama3_70b_tp4_fp8_by_hand() {
        let mut i = input("llama-3-70b", "80GiB", 0.1);
        assert_eq!(i.weight_bytes, 141_107_412_992);
        assert!(i.kv_budget().is_err());
        i.tensor_parallel = 4;
        assert_eq!(i.kv_budget().unwrap(), 42_032_558_080);
        let fp8: KvScheme = "fp8:scale=tensor".parse().unwrap();
        let r = plan_gpus(&i, &[fp8], &[4096], 8).unwrap();
        assert_eq!(i.seq_bytes(&fp8, 4096).0, 167_772_800);
        assert_eq!(r[0].max_concurrency, 42_032_558_080 / 167_772_800);
        assert_eq!(r[0].max_concurrency, 250);
        assert_eq!((r[0].replicas, r[0].total_concurrency), (2, 500));
        assert!(plan_gpus(&i, &[fp8], &[4096], 6).is_err());
    }

    /// The per-layer-type formula by hand, Gemma 3 27B (google/gemma-3-27b-it config.json:
    /// 62 layers, 16 KV heads of 128, window 1024, every 6th layer global → 10 global, 52
    /// window layers) at 128k tokens in fp16: (10 · 131,072 + 52 · 1024) layer-tokens ·
    /// 2 (K, V) · 16 · 128 · 2 bytes = 1,363,968 · 8192 = 11,173,625,856 bytes (10.41 GiB),
    /// against 62 · 131,072 · 8192 = 66,571,993,088 (62 GiB) counted all-global: 5.96×.
    #[test]
    fn gemma3_27b_128k_by_layer_type() {
        let i = input("gemma-3-27b", "141GiB", 0.1);
        let f = KvScheme::FP16;
        let rows = plan(&i, &[f], &[131_072]).unwrap();
        let r = &rows[0];
        // (10 · 131,072 + 52 · 1024) · 8192 + 52 · 1024 · 16 · 4 (window positions).
        let want = 11_177_033_728u64;
        assert!(
            (r.kv_bytes_per_seq as f64 - want as f64).abs() <= 0.01 * want as f64,
            "{}",
            r.kv_bytes_per_seq
        );
        // 131,072 is a whole number of blocks and the window ends on a block edge: exact.
        assert_eq!(r.kv_bytes_per_seq, want);
        assert_eq!(r.kv_bytes_global_layers, 10 * 131_072 * 8192);
        assert_eq!(r.kv_bytes_window_layers, 52 * 1024 * (8192 + 64));
        assert_eq!(r.kv_bytes_all_global, 62 * 131_072 * 8192);
        assert_eq!(r.paging_waste_bytes, 0);
        // The budget: ⌊141 GiB · 0.9⌋ = 136,257,837,465 bytes less 2 · 27,432,406,640 of bf16
        // weights = 81,393,024,185 → 7 sequences (all-global: 1).
        assert_eq!(r.kv_budget_bytes, 81_393_024_185);
        assert_eq!(r.max_concurrency, 7);
        assert_eq!(r.kv_budget_bytes / r.kv_bytes_all_global, 1);
    }

    /// Below the window every layer holds every token: 512 tokens of Gemma 3 27B take
    /// 62 · 512 · 8192 = 260,046,848 bytes, the all-global count, plus the window layers'
    /// positions 52 · 512 · 16 · 4 = 1,703,936: 261,750,784.
    #[test]
    fn gemma3_27b_below_window_equals_naive() {
        let i = input("gemma-3-27b", "141GiB", 0.1);
        let r = &plan(&i, &[KvScheme::FP16], &[512]).unwrap()[0];
        assert_eq!(r.kv_bytes_per_seq, 261_750_784);
        assert_eq!(r.kv_bytes_all_global, 62 * 512 * 8192);
        assert_eq!(r.kv_bytes_window_layers, 52 * 512 * (8192 + 64));
    }

    /// A window that straddles a block edge keeps one block more (vLLM frees only whole
    /// blocks): Gemma 3 27B at 131,073 tokens, blocks of 16 — global layers ⌈131,073 / 16⌉ =
    /// 8193 blocks, window layers 8193 − ⌊130,050 / 16⌋ = 65 blocks; exact bytes hold 131,073
    /// and 1024 tokens.
    #[test]
    fn gemma3_27b_window_blocks() {
        let i = input("gemma-3-27b", "141GiB", 0.1);
        let b = i.seq_bytes_by_layer_type(&KvScheme::FP16, 131_073);
        assert_eq!(b.global_paged, 10 * 8193 * 16 * 8192);
        assert_eq!(b.window_paged, 52 * 65 * 16 * (8192 + 64));
        assert_eq!(b.global, 10 * 131_073 * 8192);
        assert_eq!(b.window, 52 * 1024 * (8192 + 64));
    }

    /// Mistral 7B v0.1 keeps a 4096-token window on all 32 layers (config.json
    /// `sliding_window: 4096`, no global layer): 32k tokens cost what 4k do,
    /// 32 · 4096 · (2 · 8 · 128 · 2 + 8 · 4 positions) = 541,065,216 bytes.
    #[test]
    fn mistral_all_sliding() {
        let i = input("mistral-7b", "80GiB", 0.1);
        let r = plan(&i, &[KvScheme::FP16], &[4096, 32_768]).unwrap();
        assert_eq!(r[0].kv_bytes_per_seq, 541_065_216);
        assert_eq!(r[1].kv_bytes_per_seq, 541_065_216);
        assert_eq!(r[1].kv_bytes_global_layers, 0);
        assert_eq!(r[1].kv_bytes_all_global, 8 * 536_870_912);
    }
}
