//! The KV cache memory a vLLM engine leaves on each GPU, from the model's geometry, the device's
//! memory and the tensor-parallel degree: what `kvbench serve --simulate` sizes its block pool
//! with when no `--kv-budget` is given.
//!
//! vLLM sizes its pool at start-up (`Worker.determine_num_available_blocks` in the V0 worker of
//! 0.6.x, `determine_available_memory` in the V1 worker; vllm-project/vllm, `vllm/worker/
//! worker.py` and `vllm/v1/worker/gpu_worker.py`): it runs one dummy batch of
//! `max_num_batched_tokens` tokens spread over `max_num_seqs` sequences (`profile_run`), then
//!
//! ```text
//! KV bytes per GPU = total × gpu_memory_utilization − (weights + activation peak + non-torch)
//! ```
//!
//! where the activation peak is PyTorch's peak allocation during that batch beyond the weights
//! and non-torch memory is what the device holds outside PyTorch's allocator (CUDA context,
//! library workspaces, NCCL and custom all-reduce buffers). PR #9352 (Oct 2024) added the
//! non-torch term, PR #10511 (0.6.5) logs the three terms, and the V1 worker of early 2025
//! accounts the same way (torch's peak allocation plus whatever the device holds outside it).
//! Each GPU computes its own figure
//! and the engine keeps the smallest (rank 0, which also runs the sampler, see
//! [`sampler_peak_bytes`]).
//!
//! kvbench models each term from the geometry ([`profile_activation_bytes`],
//! [`non_torch_bytes`]); `--non-kv-reserve` replaces their sum with an engine's logged figure
//! and `--num-gpu-blocks-override` bypasses the computation.

use crate::error::{Error, Result};
use crate::model::geometry::ModelGeometry;

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes per activation element: the profile run's bf16 / fp16 hidden states.
const ACT_BYTES: u64 = 2;

/// Bytes per (sequence, vocabulary entry) live at the sampler's peak in the profile run: the
/// lm_head's bf16 output (2 bytes) and seven fp32-sized buffers of the PyTorch top-k/top-p path
/// (`_apply_top_k_top_p` in `vllm/model_executor/layers/sampler.py`, V0; the V1 sampler's
/// PyTorch fallback sorts the same way): the fp32 logits, the sorted logits, the sort's int64
/// indices (two fp32 sizes), their int64 inverse permutation (two) and the logits gathered back
/// — 2 + 7 × 4 bytes. vLLM's profile run samples with top-k and top-p on, so this path runs.
const SAMPLER_BYTES_PER_LOGIT: u64 = 30;

/// Non-torch memory of one GPU that runs alone, bytes: CUDA context, cuBLAS / cuDNN
/// workspaces and kernel images. vLLM 0.6.5 logs `non_torch_memory 1.79GiB` for Llama-3-8B on
/// one H100 SXM (vllm-project/vllm PR #10511, the memory profiling output). It depends on the
/// driver, CUDA and library versions, not on the model.
pub const NON_TORCH_SINGLE_GPU_GIB: f64 = 1.79;

/// Non-torch memory a GPU adds when it joins a tensor-parallel group, bytes: the NCCL
/// communicators' buffers (vLLM holds two, torch.distributed's and its own PyNccl) and the
/// custom all-reduce's IPC buffers. The same PR #10511 log shows `non_torch_memory 3.58GiB`
/// at TP 2, 1.79 GiB more than at TP 1. Taken as independent of the group's size: NCCL's ring
/// gives each rank buffers for its two neighbours per channel, whatever the number of ranks,
/// and the custom all-reduce buffer has a fixed size (8 MiB by default).
pub const NON_TORCH_PER_GROUP_GIB: f64 = 1.79;

/// What a vLLM engine is started with, for [`kv_memory`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineMemory {
    /// Device memory as CUDA reports it (`torch.cuda.mem_get_info()[1]`), bytes.
    pub total_bytes: u64,
    /// `--gpu-memory-utilization`, a share in (0, 1].
    pub gpu_memory_utilization: f64,
    /// `--tensor-parallel-size`, GPUs (≥ 1).
    pub tensor_parallel: usize,
    /// The whole model's weights, bytes (each GPU holds 1 / `tensor_parallel` of them).
    pub weight_bytes: u64,
    /// `--max-num-batched-tokens`: tokens of the profile run's batch.
    pub max_num_batched_tokens: usize,
    /// `--max-num-seqs`: sequences of the profile run's batch, hence rows of its logits.
    pub max_num_seqs: usize,
}

/// One GPU's memory as vLLM splits it, bytes. `kv` is what the block pool gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KvMemory {
    /// total × gpu_memory_utilization.
    pub usable: u64,
    /// Weights per GPU.
    pub weights: u64,
    /// The profile run's activation peak ([`profile_activation_bytes`]), or the whole
    /// `--non-kv-reserve` when one is given.
    pub activation_peak: u64,
    /// Non-torch memory ([`non_torch_bytes`]); 0 when `--non-kv-reserve` is given.
    pub non_torch: u64,
    /// usable − weights − activation peak − non-torch: the KV cache's share.
    pub kv: u64,
}

/// vLLM's default `max_num_batched_tokens` when chunked prefill is off (V0 up to 0.6, the
/// scheduler config's default): `max(max_model_len, 2048)`, so one prompt of the longest
/// length fits one step; for contexts past 32,768 tokens 0.6 turns chunked prefill on and the
/// V1 engine always chunks, with a budget of 2,048 tokens for `vllm serve` (`arg_utils.py`).
pub fn default_max_num_batched_tokens(max_model_len: usize) -> usize {
    if max_model_len > 32_768 {
        2048
    } else {
        max_model_len.max(2048)
    }
}

/// Peak activation bytes of one GPU in the decoder forward pass of `tokens` tokens at
/// tensor-parallel degree `tp`: the larger of the MLP block — residual and normed input
/// (`tokens × hidden` each), the merged gate/up projection's output (`tokens × 2·inter/tp`)
/// and SwiGLU's output (`tokens × inter/tp`) alive together — and the attention block —
/// residual and input, the QKV projection's output (`tokens × (q + 2·kv)·head_dim / tp`) and
/// the attention output (`tokens × q·head_dim / tp`). Activations are bf16 (2 bytes); layers
/// run one after another, so one layer's tensors are the peak (vLLM's
/// `MergedColumnParallelLinear`, `SiluAndMul`, `QKVParallelLinear` in `vllm/model_executor/
/// models/llama.py`). A KV head count below `tp` is replicated (one head per GPU).
pub fn forward_peak_bytes(g: &ModelGeometry, tp: usize, tokens: usize) -> u64 {
    let tp = tp.max(1);
    let (q, kv) = (g.q_heads.div_ceil(tp), (g.kv_heads / tp).max(1));
    let mlp = 2 * g.hidden + 3 * g.intermediate.div_ceil(tp);
    let attn = 2 * g.hidden + (q + 2 * kv) * g.head_dim + q * g.head_dim;
    (tokens * mlp.max(attn)) as u64 * ACT_BYTES
}

/// Peak bytes of the profile run's sampling step: `seqs` rows of logits over the whole
/// vocabulary (gathered onto rank 0 at any `tp`, so not sharded), each entry holding
/// [`SAMPLER_BYTES_PER_LOGIT`] bytes at the top-k/top-p sort's peak. 0 when the vocabulary is
/// unknown.
pub fn sampler_peak_bytes(g: &ModelGeometry, seqs: usize) -> u64 {
    (seqs * g.vocab) as u64 * SAMPLER_BYTES_PER_LOGIT
}

/// The profile run's activation peak on one GPU, bytes: the larger of the forward pass over
/// `tokens` tokens ([`forward_peak_bytes`]) and the sampler over `seqs` sequences
/// ([`sampler_peak_bytes`]), which runs after the forward pass has freed its tensors.
pub fn profile_activation_bytes(g: &ModelGeometry, tp: usize, tokens: usize, seqs: usize) -> u64 {
    forward_peak_bytes(g, tp, tokens).max(sampler_peak_bytes(g, seqs))
}

/// Non-torch memory of one GPU at tensor-parallel degree `tp`, bytes:
/// [`NON_TORCH_SINGLE_GPU_GIB`], plus [`NON_TORCH_PER_GROUP_GIB`] when `tp` > 1.
pub fn non_torch_bytes(tp: usize) -> u64 {
    let gib = NON_TORCH_SINGLE_GPU_GIB + if tp > 1 { NON_TORCH_PER_GROUP_GIB } else { 0.0 };
    (gib * GIB) as u64
}

/// One GPU's memory split as vLLM splits it for `g` under `e` (see the module docs);
/// `reserve`, when given (`--non-kv-reserve`), replaces the activation peak and non-torch
/// memory. Errors: [`Error::InvalidArgument`] naming `--tensor-parallel` (0 GPUs) or
/// `--gpu-memory-utilization` (outside (0, 1]), and naming `--tensor-parallel` with the terms
/// when less than 1 MiB is left for KV.
pub fn kv_memory(g: &ModelGeometry, e: &EngineMemory, reserve: Option<u64>) -> Result<KvMemory> {
    let bad = |name: &str, reason: String| Error::InvalidArgument {
        name: name.into(),
        reason,
    };
    if e.tensor_parallel == 0 {
        return Err(bad("--tensor-parallel", "must be at least 1".into()));
    }
    let u = e.gpu_memory_utilization;
    if !(u.is_finite() && u > 0.0 && u <= 1.0) {
        return Err(bad(
            "--gpu-memory-utilization",
            format!("{u} is not a share in (0, 1], e.g. 0.9"),
        ));
    }
    let tp = e.tensor_parallel;
    let usable = (e.total_bytes as f64 * u) as u64;
    let weights = e.weight_bytes / tp as u64;
    let (activation_peak, non_torch) = match reserve {
        Some(r) => (r, 0),
        None => (
            profile_activation_bytes(g, tp, e.max_num_batched_tokens, e.max_num_seqs),
            non_torch_bytes(tp),
        ),
    };
    let taken = weights + activation_peak + non_torch;
    if usable < taken + (1 << 20) {
        return Err(bad(
            "--tensor-parallel",
            format!(
                "{:.2} GiB × {u} = {:.2} GiB per GPU, less {:.2} GiB of weights, {:.2} GiB of \
                 activation peak and {:.2} GiB of non-torch memory, leaves no room for KV; use \
                 more GPUs (--tensor-parallel), a larger device or a smaller model",
                e.total_bytes as f64 / GIB,
                usable as f64 / GIB,
                weights as f64 / GIB,
                activation_peak as f64 / GIB,
                non_torch as f64 / GIB
            ),
        ));
    }
    Ok(KvMemory {
        usable,
        weights,
        activation_peak,
        non_torch,
        kv: usable - taken,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::geometry::geometry;

    /// A small geometry whose terms are computed by hand below.
    fn small() -> ModelGeometry {
        ModelGeometry {
            name: "small".into(),
            layers: 2,
            q_heads: 4,
            kv_heads: 2,
            head_dim: 16,
            hidden: 64,
            intermediate: 160,
            vocab: 1000,
            max_ctx: 512,
            window: None,
            params: 0,
            weight_dtype: "bf16".into(),
            source: "test".into(),
        }
    }

    #[test]
    fn small_geometry_by_hand() {
        let g = small();
        // TP 2, 100 tokens. MLP: residual + input 2·64 = 128, gate/up 2·160/2 = 160, SwiGLU
        // 160/2 = 80: 368 elements per token. Attention: 128 + (2 + 2·1)·16 + 2·16 = 224.
        // 100 tokens × 368 × 2 bytes = 73,600.
        assert_eq!(forward_peak_bytes(&g, 2, 100), 73_600);
        // TP 1: 128 + 320 + 160 = 608 → 121,600; attention 128 + 8·16 + 64 = 320 is smaller.
        assert_eq!(forward_peak_bytes(&g, 1, 100), 121_600);
        // 8 sequences × 1,000 logits × 30 bytes = 240,000: the sampler is the peak.
        assert_eq!(sampler_peak_bytes(&g, 8), 240_000);
        assert_eq!(profile_activation_bytes(&g, 2, 100, 8), 240_000);
        // 1 sequence: 30,000 < 73,600, the forward pass is.
        assert_eq!(profile_activation_bytes(&g, 2, 100, 1), 73_600);
        // 16 GiB × 0.5 = 8 GiB = 8,589,934,592; weights 2 GiB / 2 = 1,073,741,824; non-torch
        // (1.79 + 1.79) GiB = ⌊3.58 × 1,073,741,824⌋ = 3,843,995,729; activation 240,000.
        let e = EngineMemory {
            total_bytes: 16 << 30,
            gpu_memory_utilization: 0.5,
            tensor_parallel: 2,
            weight_bytes: 2 << 30,
            max_num_batched_tokens: 100,
            max_num_seqs: 8,
        };
        let m = kv_memory(&g, &e, None).unwrap();
        assert_eq!(m.non_torch, 3_843_995_729);
        assert_eq!(
            m.kv,
            8_589_934_592 - 1_073_741_824 - 3_843_995_729 - 240_000
        );
        // A block of 16 tokens per GPU: 2 layers × 1 KV head × 16 × (K, V) × 2 bytes × 16 =
        // 2,048 bytes; 3,671,957,039 / 2,048 = 1,792,947 blocks.
        assert_eq!(m.kv / 2048, 1_792_947);
        // --non-kv-reserve 1 GiB replaces both terms.
        let r = kv_memory(&g, &e, Some(1 << 30)).unwrap();
        assert_eq!(r.kv, 8_589_934_592 - 1_073_741_824 - 1_073_741_824);
    }

    #[test]
    fn bad_engine_settings_name_the_flag() {
        let g = small();
        let e = EngineMemory {
            total_bytes: 16 << 30,
            gpu_memory_utilization: 0.9,
            tensor_parallel: 1,
            weight_bytes: 20 << 30,
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
        };
        let err = kv_memory(&g, &e, None).unwrap_err().to_string();
        assert!(
            err.contains("--tensor-parallel") && err.contains("no room"),
            "{err}"
        );
        let zero = EngineMemory {
            tensor_parallel: 0,
            ..e
        };
        assert!(kv_memory(&g, &zero, None)
            .unwrap_err()
            .to_string()
            .contains("--tensor-parallel"));
        let over = EngineMemory {
            gpu_memory_utilization: 1.5,
            ..e
        };
        assert!(kv_memory(&g, &over, None)
            .unwrap_err()
            .to_string()
            .contains("--gpu-memory-utilization"));
    }

    #[test]
    fn default_batched_tokens_follow_vllm() {
        assert_eq!(default_max_num_batched_tokens(8192), 8192);
        assert_eq!(default_max_num_batched_tokens(1024), 2048);
        assert_eq!(default_max_num_batched_tokens(131_072), 2048);
    }

    /// fp16 blocks of 16 tokens one GPU holds for `model` as vLLM would size them, with vLLM's
    /// defaults (gpu_memory_utilization 0.9, max_num_seqs 256, max_num_batched_tokens as
    /// [`default_max_num_batched_tokens`]) on a device of `total_gib` as CUDA reports it.
    fn blocks(model: &str, total_gib: f64, tp: usize) -> u64 {
        let g = geometry(model).unwrap();
        let e = EngineMemory {
            total_bytes: (total_gib * GIB) as u64,
            gpu_memory_utilization: 0.9,
            tensor_parallel: tp,
            weight_bytes: g.params * 2,
            max_num_batched_tokens: default_max_num_batched_tokens(g.max_ctx),
            max_num_seqs: 256,
        };
        let kv = kv_memory(&g, &e, None).unwrap().kv;
        let block = 16 * g.layers * (g.kv_heads / tp).max(1) * g.head_dim * 2 * 2;
        kv / block as u64
    }

    fn within(got: u64, logged: u64, pct: f64) -> bool {
        (got as f64 / logged as f64 - 1.0).abs() * 100.0 <= pct
    }

    /// vllm-project/vllm PR #10511 (vLLM 0.6.5): `vllm serve meta-llama/Meta-Llama-3-8B` on one
    /// H100 SXM (79.22 GiB) logs available_kv_cache_memory 53.29 GiB: 53.29 GiB / 2 MiB per
    /// block = 27,284 blocks.
    #[test]
    fn llama3_8b_tp1_h100_pr10511() {
        let n = blocks("llama-3-8b", 79.22, 1);
        assert!(within(n, 27_284, 2.0), "{n} vs 27,284");
    }

    /// The same PR at `-tp 2`: non-torch 3.58 GiB, activation peak 1.26 GiB, weights 7.48 GiB
    /// per GPU: 71.29 − 7.48 − 3.58 − 1.26 = 58.97 GiB / 1 MiB per block = 60,385 blocks.
    #[test]
    fn llama3_8b_tp2_h100_pr10511() {
        let n = blocks("llama-3-8b", 79.22, 2);
        assert!(within(n, 60_385, 2.0), "{n} vs 60,385");
    }

    /// vllm-project/vllm PR #2031 (Dec 2023, 0.2.x, after the fix): Llama-2-7B, one A100
    /// 80GB (79.2 GiB as CUDA reports it), # GPU blocks: 7351.
    #[test]
    fn llama2_7b_tp1_a100_pr2031() {
        let n = blocks("llama-2-7b", 79.2, 1);
        assert!(within(n, 7_351, 2.0), "{n} vs 7,351");
    }

    /// The same PR: Llama-2-70B on 4 × A100 80GB logged 31,615 blocks before the fix and
    /// 20,865 after. The fix counted everything not free on the device after the profile run
    /// (`total − free`), 13.7 GiB per GPU beyond the weights and KV, which neither the
    /// geometry's activations (0.3 GiB at 4,096 tokens) nor later-measured NCCL buffers
    /// (1.8 GiB, PR #10511) explain; kvbench does not reproduce it and lands between the two.
    #[test]
    fn llama2_70b_tp4_a100_pr2031_is_between_before_and_after_the_fix() {
        let n = blocks("llama-2-70b", 79.2, 4);
        assert!(n > 20_865 && n < 31_615, "{n}");
        assert!(
            !within(n, 20_865, 2.0),
            "{n} now matches 20,865: update the README"
        );
    }
}
