//! The real [`Backend`]: kvbench's decoder on the CPU with one batched [`KvCache`] for the
//! running sequences, timed by the wall clock.
//!
//! Prefill runs one prompt at a time into a fresh single-sequence cache, which then joins the
//! running batch ([`KvCache::join`]); a finished or preempted sequence leaves it with
//! [`KvCache::take`]. Decode steps run the whole ragged batch in one forward (each sequence at
//! its own position), greedy, with int8/4-bit keys scored on their codes as the sweep's timed
//! decode (`exact_attention(false)`).
//!
//! Prefix caching: the CPU cache cannot share rows between sequences (each (sequence, kv head)
//! owns its streams). So the prefix is prefilled once while its f32 K/V are recorded, and each
//! request that uses it gets a copy: the recorded rows are appended (quantized) into its new
//! cache — no model forward — before its own prompt is prefilled. The TTFT saved is real (the
//! prefix's forward is skipped); the memory saved is the block pool's accounting (what a paged
//! cache with shared blocks saves), not this process's RSS.

use std::time::Instant;

use candle_core::Tensor;

use super::engine::Backend;
use crate::error::Result;
use crate::kv::{AttentionCache, CacheGeometry, KvCache, KvScheme};
use crate::model::{argmax_rows, Model};

/// One layer's recorded K and V (f32, `[1, kv_heads, n, head_dim]` flattened).
type LayerKv = (Vec<f32>, Vec<f32>);

/// The model, the scheme and the running batch.
pub struct ModelBackend<'a> {
    prefill: &'a Model,
    model: &'a Model,
    scheme: KvScheme,
    geom: CacheGeometry,
    batch: Option<KvCache>,
    start: Instant,
    /// Recorded prefix K/V per layer (`[1, kv_heads, n, head_dim]` f32, flattened) and n.
    prefix: Option<(Vec<LayerKv>, usize)>,
    /// Seconds the last decode step spent in attention (NaN before the first).
    attention_s: f64,
}

impl<'a> ModelBackend<'a> {
    /// A backend for `scheme` that prefills with `prefill` and decodes with `model` (the same
    /// weights in two dtypes, as the sweep: f32 prefill, Q8_0 decode; both on the CPU); its
    /// clock starts now.
    pub fn new(prefill: &'a Model, model: &'a Model, scheme: KvScheme) -> Self {
        Self {
            prefill,
            model,
            scheme,
            geom: model.config.cache_geometry(),
            batch: None,
            start: Instant::now(),
            prefix: None,
            attention_s: f64::NAN,
        }
    }

    /// Serves one throwaway request before the clock starts, as an engine is warm before a
    /// benchmark times it (vLLM warms up at start — profile run, CUDA-graph capture — and its
    /// `benchmark_serving` sends an initial test prompt before the timed run): `prompt` is
    /// prefilled, `steps` decode steps run, the sequence leaves and the clock restarts. The
    /// first timed request then pays no first-touch cost that no later one pays (new buffers'
    /// page faults, the thread pool's first wake-up, the decode weights out of cache after
    /// loading), which the simulated run (`serve --simulate`) has no term for: in the
    /// 2026-12-03 validation the first request of every point was 23–66 ms slower measured
    /// than simulated. Errors: the model's and the cache's.
    pub fn warmed_up(mut self, prompt: &[u32], steps: usize) -> Result<Self> {
        debug_assert!(
            self.batch.is_none(),
            "warm-up of a backend that already serves"
        );
        let mut last = self.admit(prompt, false, prompt.len() + steps + 1)?;
        for _ in 0..steps {
            last = self.step(&[last])?[0];
        }
        self.remove(0)?;
        self.attention_s = f64::NAN;
        self.start = Instant::now();
        Ok(self)
    }

    /// Bytes the running batch's cache has allocated (buffer capacity, ≥ its K/V bytes;
    /// [`KvCache::reserved_bytes`]): each admitted sequence reserves its whole lifetime (prefix
    /// + prompt + output tokens) up front, so this does not grow while sequences decode.
    pub fn reserved_bytes(&self) -> usize {
        self.batch.as_ref().map_or(0, KvCache::reserved_bytes)
    }

    fn fresh(&self) -> Result<KvCache> {
        let mut c = KvCache::new(self.scheme, self.geom, 1)?;
        c.set_exact_attention(false);
        Ok(c)
    }
}

/// Forwards to a cache and keeps a copy of every layer's new K/V.
struct Recorder<'c> {
    inner: &'c mut KvCache,
    kv: Vec<(Vec<f32>, Vec<f32>)>,
}

impl AttentionCache for Recorder<'_> {
    fn seen(&self, b: usize) -> usize {
        self.inner.seen(b)
    }
    fn append_tensors(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.kv.push((
            k.flatten_all()?.to_vec1::<f32>()?,
            v.flatten_all()?.to_vec1::<f32>()?,
        ));
        debug_assert_eq!(self.kv.len(), layer + 1);
        self.inner.append_tensors(layer, k, v)
    }
    fn attend_tensor(&mut self, layer: usize, q: &Tensor) -> Result<Tensor> {
        self.inner.attend_tensor(layer, q)
    }
}

impl Backend for ModelBackend<'_> {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn wait_until(&mut self, t: f64) {
        let dt = t - self.now();
        if dt > 0.0 {
            // `--rate` bounds the arrival span; an out-of-range wait still must not panic.
            std::thread::sleep(
                std::time::Duration::try_from_secs_f64(dt).unwrap_or(std::time::Duration::MAX),
            );
        }
    }

    fn prepare_prefix(&mut self, prefix: &[u32]) -> Result<f64> {
        let t0 = Instant::now();
        let mut cache = self.fresh()?;
        let mut rec = Recorder {
            inner: &mut cache,
            kv: Vec::new(),
        };
        let logits = self.prefill.forward_last(prefix, 1, &mut rec)?;
        argmax_rows(&logits)?;
        self.prefix = Some((rec.kv, prefix.len()));
        Ok(t0.elapsed().as_secs_f64())
    }

    fn admit(&mut self, tokens: &[u32], after_prefix: bool, lifetime: usize) -> Result<u32> {
        let mut cache = self.fresh()?;
        cache.reserve(lifetime);
        if after_prefix {
            let (kv, n) = self
                .prefix
                .as_ref()
                .ok_or_else(|| crate::Error::InvalidArgument {
                    name: "--shared-prefix".into(),
                    reason: "prefix caching asked for before the prefix was prefilled".into(),
                })?;
            for (layer, (k, v)) in kv.iter().enumerate() {
                cache.append(layer, k, v, *n);
            }
        }
        let logits = self.prefill.forward_last(tokens, 1, &mut cache)?;
        let tok = argmax_rows(&logits)?[0];
        match &mut self.batch {
            Some(b) => b.join(cache)?,
            None => self.batch = Some(cache),
        }
        Ok(tok)
    }

    fn step(&mut self, last: &[u32]) -> Result<Vec<u32>> {
        let batch = self
            .batch
            .as_mut()
            .ok_or_else(|| crate::Error::InvalidArgument {
                name: "serve".into(),
                reason: "a decode step with no running sequence".into(),
            })?;
        batch.take_attention_meter();
        let logits = self.model.forward_last(last, last.len(), batch)?;
        self.attention_s = batch.take_attention_meter().seconds;
        argmax_rows(&logits)
    }

    fn remove(&mut self, i: usize) -> Result<()> {
        if let Some(b) = &mut self.batch {
            b.take(i)?;
            if b.batch() == 0 {
                self.batch = None;
            }
        }
        Ok(())
    }

    fn kv_bytes(&self) -> usize {
        self.batch.as_ref().map_or(0, KvCache::kv_bytes)
    }

    fn last_attention_s(&self) -> f64 {
        self.attention_s
    }
}

#[cfg(test)]
mod tests {
    use crate::kv::{CacheGeometry, KvCache, KvScheme};

    /// take/join move whole sequences: a batch of lengths 3 and 5 in int4 split into one of 3
    /// and one of 5, whose bytes are `bytes_for` at those lengths and add up to the batch's;
    /// joining them back gives the batch's bytes and lengths in the new order.
    #[test]
    fn take_and_join_move_sequences() {
        let g = CacheGeometry {
            layers: 2,
            kv_heads: 2,
            q_heads: 4,
            head_dim: 64,
            window: None,
        };
        let s: KvScheme = "int4".parse().unwrap();
        let filled = |n: usize| {
            let mut c = KvCache::new(s, g, 1).unwrap();
            let x: Vec<f32> = (0..2 * n * 64).map(|i| (i as f32 * 0.37).sin()).collect();
            for l in 0..2 {
                c.append(l, &x, &x, n);
            }
            c
        };
        let mut b = KvCache::stack(vec![filled(3), filled(5)]).unwrap();
        let total = b.kv_bytes();
        let first = b.take(0).unwrap();
        assert_eq!((first.batch(), first.seen(0)), (1, 3));
        assert_eq!((b.batch(), b.seen(0)), (1, 5));
        assert_eq!(first.kv_bytes(), s.bytes_for(&g, 1, 3));
        assert_eq!(b.kv_bytes(), s.bytes_for(&g, 1, 5));
        assert_eq!(first.kv_bytes() + b.kv_bytes(), total);
        b.join(first).unwrap();
        assert_eq!((b.batch(), b.seen(0), b.seen(1)), (2, 5, 3));
        assert_eq!(b.kv_bytes(), total);
        assert!(b.take(2).is_err());
        let mut other = KvCache::new(KvScheme::FP16, g, 1).unwrap();
        assert!(other.join(KvCache::new(s, g, 1).unwrap()).is_err());
        other.take(0).unwrap();
        assert_eq!(other.batch(), 0);
    }
}
