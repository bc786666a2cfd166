//! Floors of one decode step of attention over the KV cache: the bytes a kernel must move, the
//! FLOPs it must do, their ratio (arithmetic intensity) and the time below which no kernel can
//! go on a machine with a given peak bandwidth and peak FLOP/s.
//!
//! Method: the roofline model (Williams, Waterman & Patterson 2009, "Roofline: an insightful
//! visual performance model for multicore architectures", CACM 52(4), 65–76): a kernel takes at
//! least `max(bytes / peak bandwidth, FLOPs / peak FLOP/s)`. Decode attention has one query
//! token per sequence, so each cached K/V byte serves only the query heads of its GQA group: a
//! few FLOP per byte (about the group size for fp16, see the tests), far left of the ridge point
//! of CPUs and GPUs, so the bandwidth term is the floor. That decode attention is bound by reading
//! the cache is what FlashAttention's IO-aware analysis (Dao et al. 2022, arXiv 2205.14135)
//! and Flash-Decoding (Dao, Haziza, Massa & Sizov 2023, "Flash-Decoding for long-context
//! inference", which splits the keys so the whole GPU streams the cache) work from. Achieved
//! bandwidth against [`DecodeStepFloor::bytes`] is therefore the figure of merit for a decode
//! attention kernel.
//!
//! Shapes come from [`CacheGeometry`]; cache bytes from the cache's own accounting
//! ([`KvScheme::bytes_for_held`], [`KvScheme::row_bytes`]), so formats are not re-derived here.

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme};

/// Bytes of one f32 element (queries read and outputs written are f32 in kvbench's attention).
const F32_BYTES: u64 = 4;

/// FLOPs counted per score for the softmax: running max (1 compare), subtract the max (1),
/// exp (1, though it costs several instructions), add to the sum (1), and the 1/√head_dim
/// scaling of the score (1). The final division of the output by the sum (head_dim multiplies
/// per query head, independent of the context length) is not counted.
pub const SOFTMAX_FLOPS_PER_SCORE: u64 = 5;

/// The minimum work of one decode step (one new query token per sequence, every layer) of
/// attention over a cache holding `held` tokens per (sequence, kv head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeStepFloor {
    /// Bytes of every stored K/V row (codes, scales, zero-points, residual rows), eviction
    /// bookkeeping and per-layer scales, for all layers, kv heads and sequences: every byte the
    /// cache holds, read once. Bytes.
    pub kv_read_bytes: u64,
    /// f32 queries read: `layers × batch × q_heads × head_dim × 4`. Bytes.
    pub query_read_bytes: u64,
    /// f32 attention outputs written: `layers × batch × q_heads × head_dim × 4`. Bytes.
    pub output_write_bytes: u64,
    /// The new token's K and V rows written in the scheme's stored size, plus its eviction
    /// bookkeeping: `layers × batch × kv_heads × (row_k + row_v + bookkeeping)`. Bytes.
    pub append_write_bytes: u64,
    /// Floating-point operations: `layers × batch × q_heads × (4·head_dim·held +
    /// 5·held)` (QKᵀ and P·V at 2 FLOP per multiply-add, softmax as
    /// [`SOFTMAX_FLOPS_PER_SCORE`]); dequantization of stored rows is not counted. FLOP.
    pub flops: u64,
}

/// The two terms of the roofline bound for one step, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Roofline {
    /// Bytes moved / peak bandwidth. Seconds.
    pub memory_s: f64,
    /// FLOPs / peak FLOP/s. Seconds.
    pub compute_s: f64,
}

impl Roofline {
    /// The time floor, `max(memory_s, compute_s)`. Seconds.
    pub fn seconds(&self) -> f64 {
        self.memory_s.max(self.compute_s)
    }

    /// Whether the bandwidth term is the larger one (memory-bound), ties counted as memory.
    pub fn memory_bound(&self) -> bool {
        self.memory_s >= self.compute_s
    }
}

impl DecodeStepFloor {
    /// Total bytes moved: K/V read + queries read + outputs written + new row written. Bytes.
    pub fn bytes(&self) -> u64 {
        self.kv_read_bytes
            + self.query_read_bytes
            + self.output_write_bytes
            + self.append_write_bytes
    }

    /// Arithmetic intensity, [`flops`](Self::flops) / [`bytes`](Self::bytes). FLOP/byte.
    pub fn intensity(&self) -> f64 {
        self.flops as f64 / self.bytes() as f64
    }

    /// Roofline bound for a machine with `peak_bandwidth` (bytes/s) and `peak_flops` (FLOP/s).
    /// Errors: [`Error::InvalidArgument`] when either peak is not a finite number > 0.
    pub fn roofline(&self, peak_bandwidth: f64, peak_flops: f64) -> Result<Roofline> {
        for (name, v) in [
            ("peak bandwidth", peak_bandwidth),
            ("peak FLOP/s", peak_flops),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::InvalidArgument {
                    name: name.into(),
                    reason: format!("{v} is not a finite number > 0"),
                });
            }
        }
        Ok(Roofline {
            memory_s: self.bytes() as f64 / peak_bandwidth,
            compute_s: self.flops as f64 / peak_flops,
        })
    }

    /// The time floor `max(bytes / peak_bandwidth, flops / peak_flops)` in seconds, for
    /// `peak_bandwidth` in bytes/s and `peak_flops` in FLOP/s. Errors as
    /// [`roofline`](Self::roofline).
    pub fn time_floor_s(&self, peak_bandwidth: f64, peak_flops: f64) -> Result<f64> {
        Ok(self.roofline(peak_bandwidth, peak_flops)?.seconds())
    }
}

/// Floors of one decode step of `batch` sequences over a cache in `scheme` holding `held`
/// tokens per (sequence, kv head) during the step — the new token included, as attention runs
/// after the append (so its row is counted once written and once read; a fused kernel could
/// keep it in registers, a difference of 1/`held`). For eviction schemes pass the capped count
/// the cache holds while it attends. Per-channel (KIVI) keys: the new row is written to the
/// fp16 residual; the occasional quantization of a full token group is not counted. With a
/// sliding window ([`CacheGeometry::window`]) window layers read and score `min(held, window)`
/// tokens, global layers `held`.
pub fn decode_step(
    scheme: &KvScheme,
    geom: &CacheGeometry,
    batch: usize,
    held: usize,
) -> DecodeStepFloor {
    let (layers, batch64) = (geom.layers as u64, batch as u64);
    let (kvh, qh, d) = (
        geom.kv_heads as u64,
        geom.q_heads as u64,
        geom.head_dim as u64,
    );
    let qo = layers * batch64 * qh * d * F32_BYTES;
    let row = KvScheme::row_bytes(scheme.k, geom.head_dim)
        + KvScheme::row_bytes(scheme.v, geom.head_dim)
        + scheme.bookkeeping_bytes_per_token();
    // Keys scored per query head, summed over layers: `layers · held`, or with a sliding
    // window `window_layers · min(held, window) + global_layers · held`.
    let scored = geom.layer_tokens(held) as u64;
    DecodeStepFloor {
        kv_read_bytes: scheme.bytes_for_held(geom, batch, held) as u64,
        query_read_bytes: qo,
        output_write_bytes: qo,
        append_write_bytes: layers * batch64 * kvh * row as u64,
        flops: batch64 * qh * (4 * d + SOFTMAX_FLOPS_PER_SCORE) * scored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::Quant;

    const SMOLLM2: CacheGeometry = CacheGeometry {
        layers: 30,
        kv_heads: 3,
        q_heads: 9,
        head_dim: 64,
        window: None,
    };
    const LLAMA3_8B: CacheGeometry = CacheGeometry {
        layers: 32,
        kv_heads: 8,
        q_heads: 32,
        head_dim: 128,
        window: None,
    };

    // SmolLM2-135M, batch 1, 8192 tokens held, shared by the fp16 and int8 tests.
    // Queries: 30 layers × 9 q heads × 64 × 4 B = 69,120 B; outputs the same.
    // FLOPs per (layer, q head): QKᵀ 2·64·8192 = 1,048,576, P·V 1,048,576, softmax 5·8192 =
    // 40,960 → 2,138,112; × 9 heads × 30 layers = 577,290,240 FLOP.
    const SMOL_QO: u64 = 69_120;
    const SMOL_FLOPS: u64 = 577_290_240;

    #[test]
    fn floors_smollm2_fp16_8k() {
        // K and V: 30 layers × 3 kv heads × 2 (K, V) × 64 elements × 2 B = 23,040 B per token;
        // × 8192 = 188,743,680 B. New row: 30 × 3 × (128 + 128) = 23,040 B.
        // Total: 188,743,680 + 69,120 + 69,120 + 23,040 = 188,904,960 B.
        let f = decode_step(&KvScheme::FP16, &SMOLLM2, 1, 8192);
        assert_eq!(f.kv_read_bytes, 188_743_680);
        assert_eq!(f.query_read_bytes, SMOL_QO);
        assert_eq!(f.output_write_bytes, SMOL_QO);
        assert_eq!(f.append_write_bytes, 23_040);
        assert_eq!(f.bytes(), 188_904_960);
        assert_eq!(f.flops, SMOL_FLOPS);
        // GQA group 3: each 2-byte K or V element serves 3 q heads × 2 FLOP → 3 FLOP/byte,
        // plus the softmax: 577,290,240 / 188,904,960 = 3.05598…
        assert!(
            (f.intensity() - 3.055_982).abs() < 1e-5,
            "{}",
            f.intensity()
        );
    }

    #[test]
    fn floors_smollm2_int8_token_8k() {
        // int8-token row: 64 codes + 2 B f16 scale = 66 B (format.rs Int8TokenRow).
        // K and V: 30 × 3 × 2 × 66 = 11,880 B per token; × 8192 = 97,320,960 B.
        // New row: 30 × 3 × 132 = 11,880 B. Total: 97,320,960 + 138,240 + 11,880 = 97,471,080 B.
        let f = decode_step(&KvScheme::plain(Quant::Int8Token), &SMOLLM2, 1, 8192);
        assert_eq!(f.kv_read_bytes, 97_320_960);
        assert_eq!(f.append_write_bytes, 11_880);
        assert_eq!(f.bytes(), 97_471_080);
        assert_eq!(f.flops, SMOL_FLOPS, "dequantization is not counted");
        assert!(
            (f.intensity() - 5.922_682).abs() < 1e-5,
            "{}",
            f.intensity()
        );
    }

    #[test]
    fn floors_llama3_8b_fp16_32k_is_4gib_and_memory_bound() {
        // K and V: 32 layers · 2 · 8 kv heads · 128 · 2 B · 32768 = 4,294,967,296 B (4 GiB).
        // Queries: 32 × 32 × 128 × 4 = 524,288 B; outputs the same; new row 32 × 8 × 512 =
        // 131,072 B. Total 4,296,146,944 B.
        // FLOPs per (layer, q head): 4·128·32768 + 5·32768 = 16,941,056; × 32 × 32 =
        // 17,347,641,344 FLOP. Intensity 4.0380 FLOP/byte (GQA group 4: 4 heads × 2 FLOP per
        // 2-byte element, plus the softmax).
        let f = decode_step(&KvScheme::FP16, &LLAMA3_8B, 1, 32768);
        assert_eq!(f.kv_read_bytes, 4 << 30);
        assert_eq!(f.query_read_bytes, 524_288);
        assert_eq!(f.output_write_bytes, 524_288);
        assert_eq!(f.append_write_bytes, 131_072);
        assert_eq!(f.bytes(), 4_296_146_944);
        assert_eq!(f.flops, 17_347_641_344);
        assert!(
            (f.intensity() - 4.037_953).abs() < 1e-5,
            "{}",
            f.intensity()
        );

        // 1 TB/s and 10 TFLOP/s: memory 4.296146944 ms, compute 1.7347641344 ms → memory.
        let r = f.roofline(1e12, 1e13).unwrap();
        assert!((r.memory_s - 4.296_146_944e-3).abs() < 1e-15);
        assert!((r.compute_s - 1.734_764_134_4e-3).abs() < 1e-15);
        assert!(r.memory_bound());
        assert_eq!(f.time_floor_s(1e12, 1e13).unwrap(), r.memory_s);
        // An H200 (4.8 TB/s HBM3e, ~67 TFLOP/s FP32): 0.8950 ms, still the bandwidth term.
        let h200 = f.time_floor_s(4.8e12, 67e12).unwrap();
        assert!((h200 - 0.895_030_613e-3).abs() < 1e-12, "{h200}");
        // A machine with 1 GFLOP/s would be compute-bound: 17.347641344 s.
        let slow = f.roofline(1e12, 1e9).unwrap();
        assert!(!slow.memory_bound());
        assert!((slow.seconds() - 17.347_641_344).abs() < 1e-9);
    }

    #[test]
    fn floors_scale_with_batch() {
        let one = decode_step(&KvScheme::FP16, &SMOLLM2, 1, 8192);
        let four = decode_step(&KvScheme::FP16, &SMOLLM2, 4, 8192);
        assert_eq!(four.bytes(), 4 * one.bytes());
        assert_eq!(four.flops, 4 * one.flops);
    }

    #[test]
    fn floors_refuse_non_positive_peaks() {
        let f = decode_step(&KvScheme::FP16, &SMOLLM2, 1, 8);
        for (bw, fl) in [
            (0.0, 1e12),
            (1e12, -1.0),
            (f64::NAN, 1e12),
            (1e12, f64::INFINITY),
        ] {
            let e = f.roofline(bw, fl).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        }
    }
}
