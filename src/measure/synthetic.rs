//! Attention-only measurements on synthetic K/V: fill a cache to a target length and time the
//! decode step's cache work (append one token + attention over everything held) for every layer.
//! No weights are needed, so model geometries of any size can be timed on a CPU.
//!
//! Keys get the structure KIVI (arXiv 2402.02750, §3.1, Fig. 2) and KVQuant (arXiv 2401.18079,
//! §3.1) report in real models: a few outlier channels with large magnitude and a fixed offset;
//! values are plain Gaussian-like noise.

use candle_core::{Device, Tensor};

use crate::kv::{AttentionCache, CacheGeometry, KvCache, KvScheme};
use crate::util::noise::Noise;

/// Synthetic K and V for `n` tokens: `[batch, kv_heads, n, head_dim]` each. Every 16th channel
/// of the keys (from channel 3) is an outlier channel: 8× magnitude plus an offset of 4.
pub fn kv_rows(
    g: &CacheGeometry,
    batch: usize,
    n: usize,
    noise: &mut Noise,
) -> (Vec<f32>, Vec<f32>) {
    let total = batch * g.kv_heads * n * g.head_dim;
    let mut k = Vec::with_capacity(total);
    for i in 0..total {
        let c = i % g.head_dim;
        let x = noise.gauss();
        k.push(if c % 16 == 3 { 8.0 * x + 4.0 } else { x });
    }
    let v = (0..total).map(|_| noise.gauss()).collect();
    (k, v)
}

/// Appends `len` synthetic tokens per sequence to every layer in chunks of up to 512, running
/// attention for each chunk so eviction schemes evict as they would during prefill.
pub fn fill(cache: &mut KvCache, g: &CacheGeometry, len: usize, seed: u64) {
    let (batch, evicts) = (cache.batch(), cache.scheme().evicts());
    fill_on(cache, g, batch, evicts, len, seed, &Device::Cpu)
        .expect("CPU tensors of the cache's own shapes");
}

/// [`fill`] for a cache on any device, through [`AttentionCache`] (tensors on `device`).
/// `evicts`: run attention after each chunk (eviction schemes), as [`fill`].
/// Errors: tensor or device errors (CUDA out of memory included).
pub fn fill_on(
    cache: &mut dyn AttentionCache,
    g: &CacheGeometry,
    batch: usize,
    evicts: bool,
    len: usize,
    seed: u64,
    device: &Device,
) -> crate::Result<()> {
    let mut noise = Noise::new(seed);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(512);
        let (k, v) = kv_rows(g, batch, n, &mut noise);
        let shape = (batch, g.kv_heads, n, g.head_dim);
        let (k, v) = (
            Tensor::from_vec(k, shape, device)?,
            Tensor::from_vec(v, shape, device)?,
        );
        let q: Vec<f32> = (0..batch * g.q_heads * n * g.head_dim)
            .map(|_| noise.gauss())
            .collect();
        let q = Tensor::from_vec(q, (batch, g.q_heads, n, g.head_dim), device)?;
        for l in 0..g.layers {
            cache.append_tensors(l, &k, &v)?;
            if evicts {
                cache.attend_tensor(l, &q)?;
            }
        }
        done += n;
    }
    Ok(())
}

/// Times `steps` decode steps of cache work (every layer: append one token, attend one query
/// per sequence and head). Returns each step's wall time in ms.
pub fn time_decode_steps(
    cache: &mut KvCache,
    g: &CacheGeometry,
    steps: usize,
    seed: u64,
) -> Vec<f64> {
    let batch = cache.batch();
    time_decode_steps_on(cache, g, batch, steps, seed, &Device::Cpu)
        .expect("CPU tensors of the cache's own shapes")
        .into_iter()
        .map(|(ms, _)| ms)
        .collect()
}

/// [`time_decode_steps`] for a cache on any device: per step `(ms, host_ms)` — its time, from
/// CUDA events on a GPU (see [`super::device::time_ms`]), and the host's wall time to issue it
/// (on a GPU the launches' enqueue: when it is close to `ms`, the host, not the device, sets
/// the pace; on the CPU the two are one clock). The step's inputs are made before the clock
/// starts. Errors: tensor or device errors.
pub fn time_decode_steps_on(
    cache: &mut dyn AttentionCache,
    g: &CacheGeometry,
    batch: usize,
    steps: usize,
    seed: u64,
    device: &Device,
) -> crate::Result<Vec<(f64, f64)>> {
    let mut noise = Noise::new(seed ^ 0xDEC0DE);
    (0..steps)
        .map(|_| {
            let (k, v) = kv_rows(g, batch, 1, &mut noise);
            let shape = (batch, g.kv_heads, 1, g.head_dim);
            let (k, v) = (
                Tensor::from_vec(k, shape, device)?,
                Tensor::from_vec(v, shape, device)?,
            );
            let q: Vec<f32> = (0..batch * g.q_heads * g.head_dim)
                .map(|_| noise.gauss())
                .collect();
            let q = Tensor::from_vec(q, (batch, g.q_heads, 1, g.head_dim), device)?;
            super::device::synchronize(device)?;
            let (host_ms, ms) = super::device::time_ms(device, || {
                let t = std::time::Instant::now();
                for l in 0..g.layers {
                    cache.append_tensors(l, &k, &v)?;
                    std::hint::black_box(cache.attend_tensor(l, &q)?);
                }
                Ok(t.elapsed().as_secs_f64() * 1e3)
            })?;
            Ok((ms, host_ms))
        })
        .collect()
}

/// Attention-only sweep at a model's real shapes, no weights: for every scheme × batch × length,
/// fill a cache with synthetic K/V to `seq_len` tokens, then time `gen − 1` decode steps of
/// cache work (TPOT of the cache alone). A point whose predicted bytes exceed `memory_limit` is
/// recorded as `oom` without allocating, and the sweep goes on; errors and panics inside a
/// point are recorded as `error`. Only points in `selection` run (a shard's, or all); points in
/// `done` (a resumed run's) are skipped.
pub fn run(
    geom: &CacheGeometry,
    spec: &super::sweep::SweepSpec,
    memory_limit: u64,
    selection: &super::unit::Selection,
    done: &[super::sweep::PointOutcome],
    sink: &mut dyn super::sweep::PointSink,
    progress: &dyn super::sweep::Progress,
) -> crate::Result<()> {
    for &scheme in &spec.schemes {
        scheme.validate(geom.head_dim)?;
    }
    // Point by point, every scheme at a point in turn: the order a model sweep writes rows in.
    for &batch in &spec.batch_sizes {
        for &seq_len in &spec.seq_lens {
            let todo = super::sweep::pending_at(spec, selection, done, batch, seq_len, progress);
            for scheme in todo {
                progress.start(&format!(
                    "{scheme}: batch {batch} × {seq_len} tokens (synthetic)"
                ));
                let predicted = scheme.bytes_for(geom, batch, seq_len + spec.gen - 1) as u64;
                let timing = if predicted > memory_limit {
                    Err(super::sweep::PointStatus::Oom(format!(
                        "KV needs {:.2} GiB, limit {:.2} GiB",
                        predicted as f64 / (1u64 << 30) as f64,
                        memory_limit as f64 / (1u64 << 30) as f64
                    )))
                } else {
                    super::sweep::catch_point(|| {
                        point(geom, scheme, batch, seq_len, spec.gen, spec.seed)
                    })
                };
                super::sweep::emit_point(sink, progress, spec, scheme, batch, seq_len, timing)?;
            }
        }
    }
    Ok(())
}

fn point(
    geom: &CacheGeometry,
    scheme: crate::kv::KvScheme,
    batch: usize,
    seq_len: usize,
    gen: usize,
    seed: u64,
) -> crate::Result<super::sweep::PointTiming> {
    let mut cache = KvCache::new(scheme, *geom, batch)?;
    cache.set_exact_attention(false); // timed as the sweep's decode steps are
    cache.reserve(seq_len + gen); // as the sweep's cache (`AnyCache::new`)
    crate::util::memory::reset_peak_rss();
    fill(&mut cache, geom, seq_len, seed);
    cache.take_attention_meter();
    let before = super::contention::CpuSample::now();
    let steps = time_decode_steps(&mut cache, geom, gen - 1, seed);
    let after = super::contention::CpuSample::now();
    let attn = Some(cache.take_attention_meter()).filter(|a| !steps.is_empty() && a.seconds > 0.0);
    Ok(super::sweep::PointTiming {
        ttft_ms: Vec::new(),
        kv_tokens: cache.seen(0),
        kv_bytes: cache.kv_bytes(),
        kv_reserved_bytes: cache.reserved_bytes(),
        peak_rss_bytes: crate::util::memory::peak_rss_bytes(),
        vram_peak_bytes: None,
        saturated_values: cache.saturated(),
        generated: Vec::new(),
        run_order: Vec::new(),
        contention: before
            .zip(after)
            .and_then(|(a, b)| super::contention::Contention::between(&a, &b)),
        attn_step_ms: attn
            .map(|a| a.seconds * 1e3 / steps.len() as f64)
            .into_iter()
            .collect(),
        attn_gb_s: attn.and_then(|a| a.gb_s()).into_iter().collect(),
        itl_ms: vec![steps],
    })
}

/// KV bytes of one synthetic point split by layer type, for a geometry with a sliding window:
/// what a windowed cache holds after the point's `seq_len + gen − 1` tokens per sequence
/// ([`KvScheme::bytes_by_layer_type`]: window layers `min(n, window)` tokens, global layers
/// `n`), next to every layer holding `n` (what kvbench's [`KvCache`] stores: it applies no
/// window at run time, so the point's measured `kv_bytes` is `all_global_bytes`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LayerTypeBytes {
    /// Scheme spec.
    pub scheme: String,
    /// Sequences.
    pub batch: usize,
    /// Prompt tokens per sequence.
    pub seq_len: usize,
    /// Tokens per sequence the bytes are counted at (`seq_len + gen − 1`).
    pub tokens: usize,
    /// The window layers' bytes, all sequences.
    pub window_layers_bytes: usize,
    /// The global layers' bytes, all sequences.
    pub global_layers_bytes: usize,
    /// Every layer holding every token (the naive count), all sequences.
    pub all_global_bytes: usize,
}

/// [`LayerTypeBytes`] for every scheme × batch × length of `spec`, in the sweep's order;
/// empty when `geom` has no window.
pub fn layer_type_bytes(
    geom: &CacheGeometry,
    spec: &super::sweep::SweepSpec,
) -> Vec<LayerTypeBytes> {
    if geom.window.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for &batch in &spec.batch_sizes {
        for &seq_len in &spec.seq_lens {
            for scheme in &spec.schemes {
                let tokens = seq_len + spec.gen.max(1) - 1;
                let t = geom.tokens_held(scheme.held_tokens(tokens));
                let b = scheme.bytes_by_layer_type(geom, batch, t.window, t.global);
                out.push(LayerTypeBytes {
                    scheme: scheme.to_string(),
                    batch,
                    seq_len,
                    tokens,
                    window_layers_bytes: b.window,
                    global_layers_bytes: b.global,
                    all_global_bytes: KvScheme::bytes_for(
                        scheme,
                        &geom.without_window(),
                        batch,
                        tokens,
                    ),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::sweep::{PointOutcome, PointSink, SweepSpec};

    struct Collect(Vec<PointOutcome>);
    impl PointSink for Collect {
        fn point(&mut self, o: &PointOutcome) -> crate::Result<()> {
            self.0.push(o.clone());
            Ok(())
        }
    }

    /// Gemma 3 27B's split at 2048 + 2 − 1 = 2049 tokens, batch 1, fp16: 10 global layers ×
    /// 2049 and 52 window layers × 1024 tokens, at 2 · 16 · 128 · 2 = 8192 bytes per layer
    /// token (plus 16 · 4 = 64 bytes of positions on a window layer): 167,854,080 and
    /// 52 · 1024 · 8256 = 439,615,488 bytes; every layer global 62 · 2049 · 8192 =
    /// 1,040,695,296.
    #[test]
    fn layer_type_bytes_gemma3_by_hand() {
        let g = crate::model::geometry::geometry("gemma-3-27b")
            .unwrap()
            .cache();
        let spec = SweepSpec::timing_only(vec![KvScheme::FP16], vec![1], vec![2048], 2, 1);
        let r = layer_type_bytes(&g, &spec);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].tokens, 2049);
        assert_eq!(r[0].global_layers_bytes, 167_854_080);
        assert_eq!(r[0].window_layers_bytes, 439_615_488);
        assert_eq!(r[0].all_global_bytes, 1_040_695_296);
        assert!(layer_type_bytes(&g.without_window(), &spec).is_empty());
    }

    /// Measured bytes equal the formula at every point, and a point over the memory limit is
    /// recorded as `oom` while the next point still runs.
    #[test]
    fn synthetic_sweep_bytes_and_oom() {
        let g = CacheGeometry {
            layers: 2,
            kv_heads: 2,
            q_heads: 4,
            head_dim: 64,
            window: None,
        };
        let spec = SweepSpec::timing_only(
            vec![
                "fp16".parse().unwrap(),
                "int8-channel".parse().unwrap(),
                "h2o:budget=64,recent=8@q4_0".parse().unwrap(),
            ],
            vec![2],
            vec![300, 5000, 200],
            3,
            1,
        );
        // fp16 at 5002 tokens × 2 sequences: 2·2·2·2·128·5002 ≈ 10.2 MB > the 4 MB limit.
        let limit = 4_000_000;
        let mut sink = Collect(Vec::new());
        let all = crate::measure::shard::Selection::new(crate::measure::shard::plan(&spec, false));
        run(&g, &spec, limit, &all, &[], &mut sink, &()).unwrap();
        assert_eq!(sink.0.len(), 9);
        for o in &sink.0 {
            let predicted = o.scheme.bytes_for(&g, 2, o.seq_len + 2);
            match &o.timing {
                Ok(t) => assert_eq!(t.kv_bytes, predicted, "{} {}", o.scheme, o.seq_len),
                Err(e) => {
                    assert!(e.is_oom(), "{e}");
                    assert!(predicted as u64 > limit);
                }
            }
        }
        // Rows point by point (seq 300, 5000, 200), the three schemes at each.
        assert_eq!(sink.0[3].seq_len, 5000);
        assert!(sink.0[3].timing.is_err(), "fp16 × 5000 should be oom");
        assert!(sink.0[6].timing.is_ok(), "a later point still runs");
        assert!(
            sink.0[5].timing.is_ok(),
            "h2o caps its bytes: 5000 tokens fit"
        );
    }
}
