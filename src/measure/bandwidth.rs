//! The machine's memory read bandwidth, measured in the same run as the kernels compared with
//! it (`attn-bench --peak-bandwidth auto`).
//!
//! Method: STREAM's idea (McCalpin 1995, "Memory Bandwidth and Machine Balance in Current High
//! Performance Computers", IEEE TCCA Newsletter), reduced to the read-only kernel decode
//! attention is: sum a buffer several times larger than the last-level cache, split over the
//! same thread pool kvbench's attention and matmuls use (candle's), and report the best of a
//! few passes as bytes read / seconds (10⁹ bytes/s). The buffer is written first, so its pages
//! are resident before any pass is timed. The sum is kept, so the reads cannot be elided.

use std::time::Instant;

/// A measured read bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ReadBandwidth {
    /// Best pass, GB/s (10⁹ bytes/s).
    pub best_gb_s: f64,
    /// Median pass, GB/s.
    pub median_gb_s: f64,
    /// Bytes read per pass.
    pub bytes: usize,
    /// Threads that read (candle's pool workers + the caller).
    pub threads: usize,
}

/// Bytes the standard probe reads per pass: 16× a 32 MiB last-level cache.
pub const PROBE_BYTES: usize = 512 << 20;

/// Timed passes of the standard probe; the best is the peak (~0.3 s in all at 20 GB/s).
pub const PROBE_PASSES: usize = 10;

/// The standard probe every command uses (`attn-bench --peak-bandwidth auto`, the sweep's
/// `tpot_vs_floor`, `calibrate`): [`measure_read`] of [`PROBE_BYTES`], [`PROBE_PASSES`] times.
pub fn probe() -> Option<ReadBandwidth> {
    measure_read(PROBE_BYTES, PROBE_PASSES)
}

/// Reads a `bytes`-long buffer `passes` times (after one untimed pass) on candle's CPU pool.
/// `bytes` is rounded down to whole 32-byte vectors; use at least 4× the last-level cache
/// (e.g. 512 MiB on a 32 MiB L3). Returns `None` for `bytes < 32` or `passes == 0`.
pub fn measure_read(bytes: usize, passes: usize) -> Option<ReadBandwidth> {
    let n = bytes / 8;
    if n < 4 || passes == 0 {
        return None;
    }
    let buf: Vec<u64> = (0..n as u64).collect();
    let pool = candle_core::utils::barrier_pool();
    let threads = pool.n_workers() + 1;
    let chunks = threads * 16;
    let per = n.div_ceil(chunks);
    let mut sink = 0u64;
    let mut rates = Vec::with_capacity(passes);
    for pass in 0..=passes {
        let total = std::sync::atomic::AtomicU64::new(0);
        let t = Instant::now();
        pool.execute_chunked(chunks, |range| {
            let mut s = 0u64;
            for c in range {
                let lo = (c * per).min(n);
                let hi = ((c + 1) * per).min(n);
                s = s.wrapping_add(sum(&buf[lo..hi]));
            }
            total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
        let secs = t.elapsed().as_secs_f64();
        sink = sink.wrapping_add(total.into_inner());
        if pass > 0 && secs > 0.0 {
            rates.push((n * 8) as f64 / secs / 1e9);
        }
    }
    std::hint::black_box(sink);
    rates.sort_by(f64::total_cmp);
    Some(ReadBandwidth {
        best_gb_s: *rates.last()?,
        median_gb_s: rates[rates.len() / 2],
        bytes: n * 8,
        threads,
    })
}

/// The best f32 matrix-product rate candle reaches on the CPU, TFLOP/s: `passes` timed
/// products of two `n × n` matrices (after one untimed one), 2·n³ FLOPs each. The peak the
/// calibrated performance model's arithmetic efficiencies are relative to. Errors: candle's.
pub fn measure_gemm(n: usize, passes: usize) -> crate::Result<f64> {
    use candle_core::{Device, Tensor};
    let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
    std::hint::black_box(a.matmul(&b)?);
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        std::hint::black_box(a.matmul(&b)?);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(2.0 * (n as f64).powi(3) / best / 1e12)
}

/// Wrapping sum of `x`, written as the plain fold LLVM turns into a vectorized reduction with
/// several independent accumulators (AVX2: 4 × u64 per add, AVX-512: 8), so the loop is bound
/// by loads. Not an array of lane accumulators: LLVM vectorizes that across chunks with
/// shuffles, and it read 2.4–3.2 GB/s on one core where this reads 13–17 GB/s and a C/OpenMP
/// STREAM-like read 14 GB/s (AMD EPYC, 2026-12-02; issue #24: the probe printed fp16 attention
/// at "199.7 % of peak").
#[inline(never)]
fn sum(x: &[u64]) -> u64 {
    x.iter().fold(0u64, |a, &b| a.wrapping_add(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sum is right (so the kernel reads every element): Σ 0..n = n(n−1)/2.
    #[test]
    fn sum_reads_every_element() {
        let x: Vec<u64> = (0..1001).collect();
        assert_eq!(sum(&x), 1001 * 1000 / 2);
    }

    /// A small probe returns a positive, finite rate and refuses empty input.
    #[test]
    fn probe_returns_a_rate() {
        let r = measure_read(1 << 20, 2).unwrap();
        assert!(r.best_gb_s.is_finite() && r.best_gb_s > 0.0);
        assert!(r.median_gb_s <= r.best_gb_s);
        assert_eq!(r.bytes, 1 << 20);
        assert!(measure_read(16, 1).is_none());
        assert!(measure_read(1 << 20, 0).is_none());
    }
}
