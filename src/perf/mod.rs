//! A performance model of LLM decoding: what a prefill or a decode step of a model geometry
//! costs with a KV scheme on a device, as the sum of terms, each a speed of light (bytes over
//! bandwidth, FLOPs over peak) divided by the efficiency the device reaches for that term class
//! — the form of AIConfigurator's and LLMServingSim's operator models (time = roofline bound ÷
//! measured efficiency), with the KV scheme's stored bytes in the attention term, so a smaller
//! cache reads faster exactly as far as the device is bandwidth-bound.
//!
//! A step's terms (per GPU of a tensor-parallel group of `tp`):
//! - **linear layers**: max(weight bytes / (B · e_weights), 2 · params / tp · tokens /
//!   (P · e_matmul)) — the matrix products read every weight once per step, and are
//!   compute-bound only for many tokens (prefill, very large batches);
//! - **attention**: max(K/V bytes read / (B · e_kv[scheme]), attention FLOPs / (P ·
//!   e_attention)), K/V bytes in the scheme's stored form ([`KvScheme::bytes_per_token`],
//!   eviction caps applied), attention FLOPs `4 · q_heads/tp · head_dim` per (query, key) pair
//!   per layer;
//! - **K/V writes**: new tokens' stored bytes / (B · e_kv_write);
//! - **all-reduce** (tp > 1): two per layer (after attention and after the MLP, Megatron-LM,
//!   Shoeybi et al. 2019, §3), each a ring all-reduce of `tokens · hidden · 2` bytes:
//!   latency + 2(tp − 1)/tp · bytes / (link · e_allreduce);
//! - **overhead**: per step + per layer, and on a decode step right after a prefill the
//!   profile's extra for the longest prompt prefilled (`after_prefill_by_prompt`, else
//!   `after_prefill_us`: a CPU's last-level cache refilled with the decode weights), and per
//!   token written the scheme's extra encoding work (`kv_encode_us_by_scheme`).
//!
//! B is the profile's memory bandwidth, P its matmul peak ([`DeviceProfile`]).

pub mod fit;
pub mod profile;

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme, SlidingWindow};

pub use profile::{DeviceProfile, SpeedProbe};

/// The model as the cost model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Parameters (matrix products cost 2 FLOPs per parameter per token).
    pub params: u64,
    /// Hybrid attention's sliding window (`None`: every layer global): window layers read and
    /// attend over at most `window` tokens.
    pub window: Option<SlidingWindow>,
    /// Bytes the weights a decode step reads occupy (all GPUs together).
    pub decode_weight_bytes: u64,
    /// Bytes the weights a prefill reads occupy (all GPUs together).
    pub prefill_weight_bytes: u64,
}

impl ModelShape {
    /// The hidden size, `q_heads · head_dim` (Llama-family models).
    pub fn hidden(&self) -> usize {
        self.q_heads * self.head_dim
    }
}

/// One step's cost by term, seconds (each already divided by its efficiency).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Terms {
    /// Reading the weights.
    pub weights_s: f64,
    /// The matrix products' arithmetic.
    pub matmul_s: f64,
    /// Reading cached K/V.
    pub kv_read_s: f64,
    /// Attention's arithmetic.
    pub attention_s: f64,
    /// Writing new K/V.
    pub kv_write_s: f64,
    /// Tensor-parallel all-reduces.
    pub allreduce_s: f64,
    /// Fixed per-step and per-layer costs.
    pub overhead_s: f64,
}

impl Terms {
    /// The step's time: the linear layers (weights and arithmetic), attention (K/V bytes and
    /// arithmetic), then writes, all-reduces and overhead, in sequence. `overlap`: within an
    /// op, memory traffic and arithmetic overlap (the larger bound counts, as on GPUs) or add
    /// up (as kvbench's CPU kernels measure).
    pub fn total_s(&self, overlap: bool) -> f64 {
        let op = |a: f64, b: f64| if overlap { a.max(b) } else { a + b };
        op(self.weights_s, self.matmul_s)
            + op(self.kv_read_s, self.attention_s)
            + self.kv_write_s
            + self.allreduce_s
            + self.overhead_s
    }
}

/// A model, a scheme and a device: what its steps cost.
#[derive(Debug, Clone)]
pub struct PerfModel {
    /// The device.
    pub profile: DeviceProfile,
    /// The model.
    pub shape: ModelShape,
    /// The KV scheme.
    pub scheme: KvScheme,
    /// GPUs one replica is split across (1: no tensor parallelism).
    pub tp: usize,
}

impl PerfModel {
    /// A model of `shape` with `scheme` on `profile` split over `tp` GPUs. Errors:
    /// [`Error::InvalidArgument`] (`--tensor-parallel`) for tp 0, tp > 1 on a profile without a
    /// link, or query heads that do not divide evenly (as vLLM requires).
    pub fn new(
        profile: DeviceProfile,
        shape: ModelShape,
        scheme: KvScheme,
        tp: usize,
    ) -> Result<Self> {
        let bad = |reason: String| Error::InvalidArgument {
            name: "--tensor-parallel".into(),
            reason,
        };
        if tp == 0 {
            return Err(bad("must be at least 1".into()));
        }
        if tp > 1 && profile.link.is_none() {
            return Err(bad(format!(
                "{} has no link between devices in its profile; tensor parallelism {tp} \
                 cannot be modelled there",
                profile.name
            )));
        }
        if !shape.q_heads.is_multiple_of(tp) {
            return Err(bad(format!(
                "{} query heads do not split evenly over {tp} GPUs",
                shape.q_heads
            )));
        }
        Ok(PerfModel {
            profile,
            shape,
            scheme,
            tp,
        })
    }

    /// The cache geometry one GPU holds: KV heads divided among the GPUs (at least one each,
    /// replicated when there are more GPUs than KV heads, as vLLM).
    pub fn gpu_geometry(&self) -> CacheGeometry {
        CacheGeometry {
            layers: self.shape.layers,
            kv_heads: (self.shape.kv_heads / self.tp).max(1),
            q_heads: self.shape.q_heads / self.tp,
            head_dim: self.shape.head_dim,
            window: self.shape.window,
        }
    }

    fn bw(&self) -> f64 {
        self.profile.mem_bw_gb_s * 1e9
    }

    fn peak(&self) -> f64 {
        self.profile.matmul_tflops * 1e12
    }

    fn kv_efficiency(&self) -> f64 {
        let e = &self.profile.efficiency;
        e.kv_read_by_scheme
            .get(&self.scheme.to_string())
            .copied()
            .unwrap_or(e.kv_read)
    }

    /// The profile's extra per token written in this scheme, seconds
    /// (`overhead.kv_encode_us_by_scheme`, 0 where the scheme is not listed).
    fn encode_s(&self) -> f64 {
        let e = &self.profile.overhead.kv_encode_us_by_scheme;
        e.get(&self.scheme.to_string()).copied().unwrap_or(0.0) * 1e-6
    }

    /// The step's time, seconds ([`Terms::total_s`] with the profile's `overlap`).
    pub fn seconds(&self, t: &Terms) -> f64 {
        t.total_s(self.profile.overlap)
    }

    /// The linear layers, K/V writes, all-reduces and overhead of a forward pass over `tokens`
    /// new tokens, reading `weight_bytes` (whole model) with matmul efficiency `e_mm`.
    fn common(&self, tokens: usize, weight_bytes: u64, e_mm: f64) -> Terms {
        let p = &self.profile;
        let e = &p.efficiency;
        let tp = self.tp as f64;
        let n = tokens as f64;
        let layers = self.shape.layers as f64;
        let bpt = self.scheme.bytes_per_token(&self.gpu_geometry()) as f64;
        let allreduce_s = match (&p.link, self.tp) {
            (Some(l), t) if t > 1 => {
                let bytes = n * self.shape.hidden() as f64 * 2.0;
                let one = l.latency_us * 1e-6
                    + 2.0 * (tp - 1.0) / tp * bytes / (l.bw_gb_s * 1e9 * e.allreduce);
                2.0 * layers * one
            }
            _ => 0.0,
        };
        Terms {
            weights_s: weight_bytes as f64 / tp / (self.bw() * e.weights),
            matmul_s: 2.0 * self.shape.params as f64 / tp * n / (self.peak() * e_mm),
            kv_write_s: n * bpt / (self.bw() * e.kv_write),
            allreduce_s,
            overhead_s: (p.overhead.step_us + layers * p.overhead.layer_us) * 1e-6,
            ..Default::default()
        }
    }

    /// Attention over `layer_pairs` (query, key) pairs summed over layers, reading
    /// `layer_tokens` cached tokens summed over layers (per GPU, each at the scheme's
    /// [`KvScheme::bytes_per_layer_token`]).
    fn attention(&self, cost: &mut Terms, layer_pairs: f64, layer_tokens: f64) {
        let g = self.gpu_geometry();
        let bpt = self.scheme.bytes_per_layer_token(&g);
        let flops = 4.0 * (g.q_heads * g.head_dim) as f64 * layer_pairs;
        cost.kv_read_s = layer_tokens * bpt / (self.bw() * self.kv_efficiency());
        cost.attention_s = flops / (self.peak() * self.profile.efficiency.attention);
    }

    /// One decode step of a batch whose sequences have seen `contexts` tokens each (before the
    /// step's token): each attends over what it holds (eviction caps applied) plus its new
    /// token — on a window layer over at most `window` of them
    /// ([`CacheGeometry::layer_tokens`]).
    pub fn decode(&self, contexts: &[usize]) -> Terms {
        let e = &self.profile.efficiency;
        let e_mm = e.decode_matmul_at(contexts.len());
        let mut c = self.common(contexts.len(), self.shape.decode_weight_bytes, e_mm);
        let g = self.gpu_geometry();
        let read: f64 = contexts
            .iter()
            .map(|&s| g.layer_tokens(self.scheme.held_tokens(s) + 1) as f64)
            .sum();
        self.attention(&mut c, read, read);
        c.overhead_s += contexts.len() as f64 * self.encode_s();
        c
    }

    /// [`decode`](Self::decode) of a step that directly follows prefills whose longest
    /// prompt was `prompt` tokens (0: none): the profile's extra after such a prefill
    /// ([`Overhead::after_prefill_s`](profile::Overhead::after_prefill_s); 0 on GPU profiles)
    /// added to its overhead.
    pub fn decode_after_prefill(&self, contexts: &[usize], prompt: usize) -> Terms {
        let mut c = self.decode(contexts);
        c.overhead_s += self.profile.overhead.after_prefill_s(prompt);
        c
    }

    /// Prefilling `tokens` new tokens of one sequence after `context` cached ones: causal
    /// attention over the cached tokens and the new ones before each (on a window layer over
    /// the last `window` of them: new token `q` of the sequence attends `min(q, window)` keys),
    /// reading the cached ones once per layer (`min(context, window)` on a window layer).
    pub fn prefill(&self, tokens: usize, context: usize) -> Terms {
        let e_mm = self.profile.efficiency.prefill_matmul_at(tokens);
        let mut c = self.common(tokens, self.shape.prefill_weight_bytes, e_mm);
        let g = self.gpu_geometry();
        let ctx = self.scheme.held_tokens(context);
        let (t, ctx_f) = (tokens as f64, ctx as f64);
        let global = t * ctx_f + t * (t + 1.0) / 2.0;
        let windowed = match g.window {
            Some(w) => sum_min(ctx + 1, ctx + tokens, w.window),
            None => global,
        };
        let pairs = g.global_layers() as f64 * global + g.window_layers() as f64 * windowed;
        self.attention(&mut c, pairs, g.layer_tokens(ctx) as f64);
        c.overhead_s += tokens as f64 * self.encode_s();
        c
    }
}

/// `Σ_{q=a}^{b} min(q, w)` (0 when `b < a`): the keys new tokens at positions `a..=b` (1-based)
/// attend on a window layer of `w` tokens.
fn sum_min(a: usize, b: usize, w: usize) -> f64 {
    if b < a {
        return 0.0;
    }
    let tri = |lo: usize, hi: usize| (lo + hi) as f64 * (hi - lo + 1) as f64 / 2.0;
    if b <= w {
        tri(a, b)
    } else if a > w {
        (b - a + 1) as f64 * w as f64
    } else {
        tri(a, w) + (b - w) as f64 * w as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device with round numbers: 1,000 GB/s, 100 TFLOP/s, link 100 GB/s with 10 µs latency,
    /// every efficiency 0.5 (kv_read 0.25 for int4), overhead 10 µs + 1 µs per layer.
    fn device() -> DeviceProfile {
        DeviceProfile::parse(
            r#"
name = "round"
description = "round numbers"
calibrated = true
memory_gib = 80
mem_bw_gb_s = 1000
matmul_tflops = 100
[link]
bw_gb_s = 100
latency_us = 10
[efficiency]
weights = 0.5
matmul = 0.5
kv_read = 0.5
kv_write = 0.5
attention = 0.5
allreduce = 0.5
[efficiency.kv_read_by_scheme]
int4 = 0.25
[overhead]
step_us = 10
layer_us = 1
"#,
            "round.toml",
        )
        .unwrap()
    }

    /// 2 layers, 4 query heads, 2 KV heads of 32: fp16 holds K and V · 2 layers · 2 heads ·
    /// 32 · 2 bytes = 512 bytes per token; 1e9 parameters in 2e9 bytes.
    fn shape() -> ModelShape {
        ModelShape {
            layers: 2,
            q_heads: 4,
            kv_heads: 2,
            head_dim: 32,
            params: 1_000_000_000,
            window: None,
            decode_weight_bytes: 2_000_000_000,
            prefill_weight_bytes: 2_000_000_000,
        }
    }

    /// Every term by hand for a decode step of two sequences at 999 and 1,999 tokens.
    #[test]
    fn decode_terms_by_hand() {
        let m = PerfModel::new(device(), shape(), KvScheme::FP16, 1).unwrap();
        let c = m.decode(&[999, 1999]);
        // 2e9 bytes / (1e12 B/s · 0.5) = 4 ms; 2 · 1e9 · 2 tokens / (1e14 · 0.5) = 80 µs.
        assert!((c.weights_s - 4e-3).abs() < 1e-12);
        assert!((c.matmul_s - 8e-5).abs() < 1e-12);
        // 3,000 tokens held · 512 bytes / (1e12 · 0.5) = 3.072 µs.
        assert!((c.kv_read_s - 3.072e-6).abs() < 1e-15);
        // 4 · 4 heads · 32 · 2 layers · 3,000 pairs = 3,072,000 FLOPs / 5e13 = 61.44 ns.
        assert!((c.attention_s - 6.144e-8).abs() < 1e-18);
        // 2 new tokens · 512 bytes / 5e11.
        assert!((c.kv_write_s - 2.048e-9).abs() < 1e-18);
        assert_eq!(c.allreduce_s, 0.0);
        assert!((c.overhead_s - 12e-6).abs() < 1e-15);
        let total = 4e-3 + 3.072e-6 + 2.048e-9 + 12e-6;
        assert!((c.total_s(true) - total).abs() < 1e-12);
        // Without overlap the arithmetic adds: + 80 µs + 61.44 ns.
        assert!((c.total_s(false) - (total + 8e-5 + 6.144e-8)).abs() < 1e-12);
        // int4, one group of 32 per head-row: 16 bytes of codes + an f16 scale and minimum =
        // 20 bytes; K and V · 2 layers · 2 heads · 20 = 160 bytes per token, read at 0.25.
        let int4: KvScheme = "int4".parse().unwrap();
        let m4 = PerfModel::new(device(), shape(), int4, 1).unwrap();
        assert!((m4.decode(&[999, 1999]).kv_read_s - 3000.0 * 160.0 / 2.5e11).abs() < 1e-15);
    }

    /// Tensor parallelism 2: weights and KV heads halve (256 bytes per token per GPU); two
    /// all-reduces per layer of 2 tokens × hidden 128 × 2 bytes = 512 bytes: 10 µs +
    /// (2·1/2)·512 / 5e10 each, four in all.
    #[test]
    fn tensor_parallel_terms_by_hand() {
        let m = PerfModel::new(device(), shape(), KvScheme::FP16, 2).unwrap();
        let c = m.decode(&[999, 1999]);
        assert!((c.weights_s - 2e-3).abs() < 1e-12);
        assert!((c.kv_read_s - 1.536e-6).abs() < 1e-15);
        let one = 10e-6 + 512.0 / 5e10;
        assert!((c.allreduce_s - 4.0 * one).abs() < 1e-15);
        assert!(PerfModel::new(device(), shape(), KvScheme::FP16, 3).is_err());
    }

    /// Prefill of 100 tokens after 50: compute-bound linear layers (2·1e9·100 / 5e13 = 4 ms
    /// equals the weight read, 4 ms), attention over 100·50 + 100·101/2 = 10,050 pairs.
    #[test]
    fn prefill_terms_by_hand() {
        let m = PerfModel::new(device(), shape(), KvScheme::FP16, 1).unwrap();
        let c = m.prefill(100, 50);
        assert!((c.matmul_s - 4e-3).abs() < 1e-12);
        let flops = 4.0 * 4.0 * 32.0 * 2.0 * 10_050.0;
        assert!((c.attention_s - flops / 5e13).abs() < 1e-18);
        assert!((c.kv_read_s - 50.0 * 512.0 / 5e11).abs() < 1e-18);
    }

    /// The same 2-layer shape with layer 0 on a 100-token window and layer 1 global (Gemma
    /// 2's 1:1 split), 256 bytes per layer token in fp16. Decode at 999 and 1,999 tokens:
    /// window layer reads 100 + 100, global layer 1000 + 2000 tokens → 3,200 · 256 / 5e11;
    /// attention 4 · 4 · 32 · 3,200 FLOPs. Prefill of 100 after 50: the window layer attends
    /// Σ_{q=51}^{150} min(q, 100) = 3,775 + 5,000 = 8,775 keys, the global one 10,050, and
    /// reads 50 + 50 cached tokens.
    #[test]
    fn window_layers_read_at_most_the_window() {
        let hybrid = ModelShape {
            window: Some(SlidingWindow::every(100, 2)),
            ..shape()
        };
        let m = PerfModel::new(device(), hybrid, KvScheme::FP16, 1).unwrap();
        let c = m.decode(&[999, 1999]);
        assert!((c.kv_read_s - 3200.0 * 256.0 / 5e11).abs() < 1e-18);
        assert!((c.attention_s - 4.0 * 4.0 * 32.0 * 3200.0 / 5e13).abs() < 1e-18);
        let p = m.prefill(100, 50);
        assert!((p.attention_s - 4.0 * 4.0 * 32.0 * (8775.0 + 10_050.0) / 5e13).abs() < 1e-18);
        assert!((p.kv_read_s - 100.0 * 256.0 / 5e11).abs() < 1e-18);
        // Every layer windowed at 100 (Mistral-style): 200 tokens read per layer.
        let all = ModelShape {
            window: Some(SlidingWindow {
                window: 100,
                global: crate::kv::GlobalLayers::None,
            }),
            ..shape()
        };
        let m = PerfModel::new(device(), all, KvScheme::FP16, 1).unwrap();
        assert!((m.decode(&[999, 1999]).kv_read_s - 400.0 * 256.0 / 5e11).abs() < 1e-18);
    }
}
