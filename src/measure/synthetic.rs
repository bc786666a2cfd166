//! Attention-only measurements on synthetic K/V: fill a cache to a target length and time the
//! decode step's cache work (append one token + attention over everything held) for every layer.
//! No weights are needed, so model geometries of any size can be timed on a CPU.
//!
//! Keys get the structure KIVI (arXiv 2402.02750, §3.1, Fig. 2) and KVQuant (arXiv 2401.18079,
//! §3.1) report in real models: a few outlier channels with large magnitude and a fixed offset;
//! values are plain Gaussian-like noise.

use std::time::Instant;

use crate::kv::{CacheGeometry, KvCache};

/// Deterministic noise in [−1, 1) (xorshift64*); synthetic data needs no RNG crate.
pub struct Noise(u64);

impl Noise {
    /// A stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Noise(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next value in [−1, 1).
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Approximately standard-normal value (sum of four uniforms, variance-matched).
    pub fn gauss(&mut self) -> f32 {
        (self.next() + self.next() + self.next() + self.next()) * 0.866
    }
}

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
    let batch = cache.batch();
    let mut noise = Noise::new(seed);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(512);
        let (k, v) = kv_rows(g, batch, n, &mut noise);
        let q: Vec<f32> = (0..batch * g.q_heads * n * g.head_dim)
            .map(|_| noise.gauss())
            .collect();
        for l in 0..g.layers {
            cache.append(l, &k, &v, n);
            if cache.scheme().evicts() {
                cache.attend(l, &q, n);
            }
        }
        done += n;
    }
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
    let mut noise = Noise::new(seed ^ 0xDEC0DE);
    (0..steps)
        .map(|_| {
            let (k, v) = kv_rows(g, batch, 1, &mut noise);
            let q: Vec<f32> = (0..batch * g.q_heads * g.head_dim)
                .map(|_| noise.gauss())
                .collect();
            let t = Instant::now();
            for l in 0..g.layers {
                cache.append(l, &k, &v, 1);
                std::hint::black_box(cache.attend(l, &q, 1));
            }
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}
