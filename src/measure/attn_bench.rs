//! The decode step's cache work alone, per scheme (`kvbench attn-bench`): every scheme's cache
//! filled with synthetic K/V to a context length, then decode steps (append + attention over
//! every layer) timed in rounds, one step of each scheme per round in a seeded random order,
//! so machine drift spreads over all schemes instead of posing as a difference between them.
//! Each scheme's row carries the step's floors ([`super::floors::decode_step`]: bytes moved,
//! FLOPs) and the bandwidth achieved against them.

use candle_core::Device;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::error::{Error, Result};
use crate::kv::{AnyCache, CacheGeometry, KvScheme};
use crate::stats::summarize;

use super::contention::{Contention, CpuSample};
use super::{device, floors, synthetic};

/// What to time: the schemes, sequences decoded together, timed steps, the synthetic K/V's
/// seed.
#[derive(Debug, Clone)]
pub struct AttnBench {
    /// KV schemes, in the order given.
    pub schemes: Vec<KvScheme>,
    /// Sequences decoded together.
    pub batch: usize,
    /// Timed decode steps per scheme (after one untimed step).
    pub steps: usize,
    /// Seed of the synthetic K/V and of the round order.
    pub seed: u64,
}

/// One scheme's timed steps at one context length.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttnRow {
    /// The scheme's printed name.
    pub scheme: String,
    /// Bytes of K/V the cache held after the steps.
    pub kv_bytes: usize,
    /// Bytes the median step must move (its floor), bytes.
    pub bytes_per_step: u64,
    /// FLOPs of the median step.
    pub flops_per_step: u64,
    /// Median step, ms.
    pub p50_ms: f64,
    /// 95th-percentile step, ms.
    pub p95_ms: f64,
    /// Median step over fp16's (when fp16 ran before it in the list).
    pub vs_fp16: Option<f64>,
    /// Bytes per median step over its time, GB/s (10⁹ bytes/s).
    pub gb_s: f64,
    /// Median host time to issue a step's launches, ms, on a GPU (`None` on the CPU, where a
    /// step runs as it is issued): near `p50_ms`, the host sets the pace, not the device.
    pub host_ms: Option<f64>,
}

/// A context length's results: a row per scheme that ran, why the others failed, and other
/// processes' CPU use while the steps were timed.
#[derive(Debug, Clone)]
pub struct AttnTable {
    /// Context the caches were filled to, tokens.
    pub seq_len: usize,
    /// Per scheme, in the order given: its row, or its failure (first line).
    pub rows: Vec<(String, std::result::Result<AttnRow, String>)>,
    /// Other processes' CPU use meanwhile (`None`: cannot tell).
    pub contention: Option<Contention>,
}

fn invalid(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

impl AttnBench {
    /// Refuses, before any cache is allocated: no steps, no sequences, no context length, and
    /// a batch × context whose predicted KV bytes (f64, so no product overflows) exceed the
    /// memory available on `dev`. Errors: [`Error::InvalidArgument`] naming the flag and the
    /// sizes.
    pub fn check(&self, g: &CacheGeometry, seq_lens: &[usize], dev: &Device) -> Result<()> {
        if self.steps == 0 {
            return Err(invalid(
                "--steps",
                "0 timed steps measure nothing; give 1 or more".into(),
            ));
        }
        if self.batch == 0 {
            return Err(invalid(
                "--batch-size",
                "0 sequences measure nothing; give 1 or more".into(),
            ));
        }
        if seq_lens.is_empty() {
            return Err(invalid(
                "--seq-lens",
                "give one or more context lengths".into(),
            ));
        }
        let avail = match device::device_mem_free(dev) {
            Ok(Some(free)) => Some(free),
            _ => crate::util::memory::available_bytes(),
        };
        let gib = |b: f64| format!("{:.2} GiB", b / (1u64 << 30) as f64);
        for &seq_len in seq_lens {
            let per_seq = seq_len as f64 + self.steps as f64 + 2.0;
            let tokens = per_seq * self.batch as f64;
            for scheme in &self.schemes {
                // One sequence's bytes with eviction applied (exact, no overflow below 2^40
                // tokens), times the batch in f64.
                let need = if tokens > super::sweep::MAX_POINT_TOKENS as f64 {
                    f64::INFINITY
                } else {
                    scheme.bytes_for(g, 1, per_seq as usize) as f64 * self.batch as f64
                };
                if avail.map_or(need.is_infinite(), |m| need > m as f64) {
                    return Err(invalid(
                        "--batch-size",
                        format!(
                            "{scheme} at batch {} × context {seq_len} needs {} of KV cache, {} \
                             available; lower --batch-size or --seq-lens",
                            self.batch,
                            if need.is_finite() {
                                gib(need)
                            } else {
                                "more than 2^40 tokens".into()
                            },
                            avail.map_or("unknown".into(), |m| gib(m as f64))
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Times every scheme at `seq_len` on `dev` (see the module docs). A scheme whose cache
    /// cannot be built or run there (no CUDA kernel, out of memory) gets its failure in its
    /// row and the others go on. Errors: a scheme invalid at the head size.
    pub fn run(&self, g: &CacheGeometry, seq_len: usize, dev: &Device) -> Result<AttnTable> {
        let mut caches: Vec<Result<AnyCache>> = Vec::new();
        for scheme in &self.schemes {
            scheme.validate(g.head_dim)?;
            caches.push(self.filled(*scheme, g, seq_len, dev));
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); caches.len()];
        let mut host: Vec<Vec<f64>> = vec![Vec::new(); caches.len()];
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let before = CpuSample::now();
        for step in 0..self.steps {
            let mut order: Vec<usize> = (0..caches.len()).filter(|&i| caches[i].is_ok()).collect();
            order.shuffle(&mut rng);
            for i in order {
                let Ok(cache) = caches[i].as_mut() else {
                    continue;
                };
                let seed = self.seed + 1 + step as u64;
                let c = cache.as_attention();
                match synthetic::time_decode_steps_on(c, g, self.batch, 1, seed, dev) {
                    Ok(ms) => {
                        times[i].extend(ms.iter().map(|t| t.0));
                        host[i].extend(ms.iter().map(|t| t.1));
                    }
                    Err(e) => caches[i] = Err(e),
                }
            }
        }
        let contention = CpuSample::now()
            .zip(before)
            .and_then(|(b, a)| Contention::between(&a, &b));
        let mut fp16_ms = None;
        let mut rows = Vec::new();
        let on_gpu = !matches!(dev, Device::Cpu);
        for (((scheme, cache), ms), host_ms) in self.schemes.iter().zip(caches).zip(times).zip(host)
        {
            let row = match cache {
                Ok(c) => {
                    let host_p50 = on_gpu.then(|| summarize(&host_ms)).flatten().map(|h| h.p50);
                    self.row(
                        scheme,
                        g,
                        seq_len,
                        c.kv_bytes(),
                        &ms,
                        host_p50,
                        &mut fp16_ms,
                    )
                    .ok_or_else(|| "no timed step".to_string())
                }
                Err(e) => Err(crate::error::first_line(&e)),
            };
            rows.push((scheme.to_string(), row));
        }
        Ok(AttnTable {
            seq_len,
            rows,
            contention,
        })
    }

    /// `scheme`'s cache on `dev` filled to `seq_len` tokens and stepped once, untimed.
    fn filled(
        &self,
        scheme: KvScheme,
        g: &CacheGeometry,
        seq_len: usize,
        dev: &Device,
    ) -> Result<AnyCache> {
        let cap = seq_len + self.steps + 2;
        // int8/4-bit keys scored on their codes, as the sweep times decode steps.
        let mut cache = AnyCache::new(scheme, *g, self.batch, cap, dev)?.exact_attention(false);
        let c = cache.as_attention();
        synthetic::fill_on(c, g, self.batch, scheme.evicts(), seq_len, self.seed, dev)?;
        synthetic::time_decode_steps_on(c, g, self.batch, 1, self.seed, dev)?;
        Ok(cache)
    }

    /// The row of a scheme that ran: the median timed step brings the cache to `seen` tokens,
    /// then attends over what is held after its append (eviction runs after attention);
    /// `host_ms` is the median time to issue a step on a GPU (`None` on the CPU).
    fn row(
        &self,
        scheme: &KvScheme,
        g: &CacheGeometry,
        seq_len: usize,
        kv_bytes: usize,
        ms: &[f64],
        host_ms: Option<f64>,
        fp16_ms: &mut Option<f64>,
    ) -> Option<AttnRow> {
        let s = summarize(ms)?;
        let seen = seq_len + 1 + self.steps.div_ceil(2);
        let floor = floors::decode_step(scheme, g, self.batch, scheme.held_tokens(seen - 1) + 1);
        if scheme.is_baseline() {
            *fp16_ms = Some(s.p50);
        }
        Some(AttnRow {
            scheme: scheme.to_string(),
            kv_bytes,
            bytes_per_step: floor.bytes(),
            flops_per_step: floor.flops,
            p50_ms: s.p50,
            p95_ms: s.p95,
            vs_fp16: fp16_ms.map(|f| s.p50 / f),
            gb_s: floor.bytes() as f64 / (s.p50 * 1e-3) / 1e9,
            host_ms,
        })
    }
}
