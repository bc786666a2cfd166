//! `kvbench attn-bench`: time the decode step's cache work (append + attention over every
//! layer) per scheme at one or more context lengths, on synthetic K/V with the model's geometry,
//! with the step's floors (bytes moved, FLOPs; see [`crate::measure::floors`]) and the bandwidth
//! achieved against them.

use candle_core::Device;

use crate::kv::AnyCache;
use crate::measure::{bandwidth, device, floors, synthetic};
use crate::model::device::DeviceSpec;
use crate::model::hub;
use crate::stats::summarize;

/// Arguments of `kvbench attn-bench`.
#[derive(Debug, clap::Args)]
pub struct AttnBenchArgs {
    /// Model whose geometry to use: only its header/config is read; an alias with shipped
    /// geometry (llama-3-8b, mistral-7b, …, see `kvbench plan --help`) needs no download.
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,
    /// KV-cache schemes, comma-separated (see `kvbench sweep --help`).
    #[arg(long = "dtypes", visible_alias = "schemes", default_value = "fp16,int8,int4,q8_0,q4_0,fp8",
          value_parser = crate::measure::settings::parse_schemes)]
    pub schemes: crate::measure::settings::SchemeList,
    /// Context lengths the cache is filled to before timing, comma-separated (one table each).
    #[arg(
        long = "seq-lens",
        visible_alias = "seq-len",
        value_delimiter = ',',
        default_value = "8192"
    )]
    pub seq_lens: Vec<usize>,
    /// Sequences decoded together (one batch size; `kvbench sweep --batch-sizes` takes a list).
    #[arg(long = "batch-size", visible_alias = "batch", default_value_t = 1)]
    pub batch: usize,
    /// Timed decode steps per scheme (after one untimed step).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Seed of the synthetic K/V.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the cache lives and attention runs: `cpu` or `cuda:N` (our kernels; needs a build
    /// with `--features cuda`). On CUDA each step is timed with CUDA events.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// Peak memory bandwidth in GB/s (10^9 bytes/s), e.g. 4800 for an H200's HBM3e, or `auto`
    /// to measure this machine's read bandwidth first (a STREAM-like read of 512 MiB on the
    /// same threads; CPU only); adds a `% of peak` column for the achieved bandwidth.
    #[arg(long, value_parser = parse_peak)]
    pub peak_bandwidth: Option<Peak>,
}

/// What `--peak-bandwidth` names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Peak {
    /// Measure the CPU's read bandwidth in this run ([`bandwidth::measure_read`]).
    Auto,
    /// A given figure, GB/s.
    GbS(f64),
}

/// `"4800"` → 4800 GB/s, `"auto"` → measure; refuses anything but a finite number > 0.
fn parse_peak(s: &str) -> Result<Peak, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(Peak::Auto);
    }
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Peak::GbS(v)),
        Ok(_) => Err(format!(
            "`{s}` must be a bandwidth in GB/s > 0, e.g. 4800, or `auto`"
        )),
        Err(_) => Err(format!(
            "`{s}` is not a number of GB/s (e.g. 4800 or 51.2) or `auto`"
        )),
    }
}

/// Bytes the `auto` probe reads per pass: 16× a 32 MiB last-level cache.
const PROBE_BYTES: usize = 512 << 20;

/// Runs the benchmark and prints a table.
pub fn run(a: AttnBenchArgs) -> anyhow::Result<()> {
    // Geometry only: aliases (llama-3-8b, …) need no download.
    let g = crate::model::geometry::for_model_arg(&a.model)?.cache();
    let dev = a.device.open()?;
    check_sizes(&a, &g, &dev)?;
    let peak = match a.peak_bandwidth {
        None => None,
        Some(Peak::GbS(p)) => Some(p),
        Some(Peak::Auto) if dev.is_cpu() => {
            let r = bandwidth::measure_read(PROBE_BYTES, 5)
                .ok_or_else(|| anyhow::anyhow!("the bandwidth probe read nothing"))?;
            println!(
                "measured read bandwidth: {:.1} GB/s best, {:.1} GB/s median of 5 passes over {} MiB on {} threads (STREAM-like sum)",
                r.best_gb_s,
                r.median_gb_s,
                r.bytes >> 20,
                r.threads
            );
            Some(r.best_gb_s)
        }
        Some(Peak::Auto) => anyhow::bail!(
            "--peak-bandwidth auto measures the CPU's memory; for {} give the device's peak in GB/s (e.g. 4800 for an H200)",
            device::describe(&dev)
        ),
    };
    for &seq_len in &a.seq_lens {
        table(&a, &g, seq_len, &dev, peak)?;
    }
    Ok(())
}

/// Refuses, before any cache is allocated: `--steps 0`, `--batch-size 0`, and a batch × context whose
/// predicted KV bytes (f64, so no product overflows) exceed the memory available on the device.
/// Errors: [`crate::Error::InvalidArgument`] naming the flag and the sizes.
fn check_sizes(
    a: &AttnBenchArgs,
    g: &crate::kv::CacheGeometry,
    dev: &Device,
) -> Result<(), crate::Error> {
    let bad = |name: &str, reason: String| crate::Error::InvalidArgument {
        name: name.into(),
        reason,
    };
    if a.steps == 0 {
        return Err(bad(
            "--steps",
            "0 timed steps measure nothing; give 1 or more".into(),
        ));
    }
    if a.batch == 0 {
        return Err(bad(
            "--batch-size",
            "0 sequences measure nothing; give 1 or more".into(),
        ));
    }
    if a.seq_lens.is_empty() {
        return Err(bad("--seq-lens", "give one or more context lengths".into()));
    }
    let avail = match device::device_mem_free(dev) {
        Ok(Some(free)) => Some(free),
        _ => crate::util::memory::available_bytes(),
    };
    for &seq_len in &a.seq_lens {
        let per_seq = seq_len as f64 + a.steps as f64 + 2.0;
        let tokens = per_seq * a.batch as f64;
        for scheme in &a.schemes.0 {
            // One sequence's bytes with eviction applied (exact, no overflow below 2^40 tokens),
            // times the batch in f64.
            let need = if tokens > crate::measure::sweep::MAX_POINT_TOKENS as f64 {
                f64::INFINITY
            } else {
                scheme.bytes_for(g, 1, per_seq as usize) as f64 * a.batch as f64
            };
            if avail.map_or(need.is_infinite(), |m| need > m as f64) {
                return Err(bad(
                    "--batch-size",
                    format!(
                        "{scheme} at batch {} × context {seq_len} needs {} of KV cache, {} \
                         available; lower --batch-size or --seq-lens",
                        a.batch,
                        if need.is_finite() {
                            format!("{:.2} GiB", need / (1u64 << 30) as f64)
                        } else {
                            "more than 2^40 tokens".into()
                        },
                        avail.map_or("unknown".into(), |m| format!(
                            "{:.2} GiB",
                            m as f64 / (1u64 << 30) as f64
                        ))
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Times every scheme at one context length and prints its table block. Bytes moved and FLOPs
/// are the floors of the median timed step (the cache holds `seq_len` + 1 warm-up token + the
/// steps before it); GB/s = those bytes / the p50 step time.
/// A scheme whose cache cannot be built or run on the device (no CUDA kernel, out of memory)
/// prints its error in its row and the table goes on.
fn table(
    a: &AttnBenchArgs,
    g: &crate::kv::CacheGeometry,
    seq_len: usize,
    dev: &Device,
    peak: Option<f64>,
) -> anyhow::Result<()> {
    println!(
        "decode-step cache work (append + attention, {} layers), batch {}, context {} tokens, {}, model geometry {} ({} kv heads × {} head_dim){}",
        g.layers,
        a.batch,
        seq_len,
        device::describe(dev),
        a.model,
        g.kv_heads,
        g.head_dim,
        peak.map_or(String::new(), |p| {
            format!(", peak bandwidth {} GB/s", (p * 10.0).round() / 10.0)
        })
    );
    print!(
        "{:<28} {:>12} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10}",
        "scheme", "KV MiB", "MiB/step", "GFLOP/step", "p50 ms", "p95 ms", "vs fp16", "GB/s"
    );
    println!(
        "{}",
        if peak.is_some() {
            format!(" {:>9}", "% of peak")
        } else {
            String::new()
        }
    );
    // Every scheme's cache is built and filled first; then the timed steps run in rounds, one
    // step of each scheme per round in a seeded random order, so machine drift spreads over
    // all schemes instead of posing as a difference between them. Memory: all caches at once.
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    if a.steps == 0 {
        anyhow::bail!("--steps must be at least 1");
    }
    let mut caches: Vec<std::result::Result<AnyCache, crate::Error>> = Vec::new();
    for scheme in &a.schemes.0 {
        scheme.validate(g.head_dim)?;
        caches.push((|| -> crate::Result<AnyCache> {
            let cap = seq_len + a.steps + 2;
            // int8/4-bit keys scored on their codes, as the sweep times decode steps.
            let mut cache = AnyCache::new(*scheme, *g, a.batch, cap, dev)?.exact_attention(false);
            let c = cache.as_attention();
            synthetic::fill_on(c, g, a.batch, scheme.evicts(), seq_len, a.seed, dev)?;
            synthetic::time_decode_steps_on(c, g, a.batch, 1, a.seed, dev)?;
            Ok(cache)
        })());
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); caches.len()];
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let before = crate::measure::contention::CpuSample::now();
    for step in 0..a.steps {
        let mut order: Vec<usize> = (0..caches.len()).filter(|&i| caches[i].is_ok()).collect();
        order.shuffle(&mut rng);
        for i in order {
            let Ok(cache) = caches[i].as_mut() else {
                continue;
            };
            let seed = a.seed + 1 + step as u64;
            match synthetic::time_decode_steps_on(cache.as_attention(), g, a.batch, 1, seed, dev) {
                Ok(ms) => times[i].extend(ms),
                Err(e) => caches[i] = Err(e),
            }
        }
    }
    let contention = crate::measure::contention::CpuSample::now()
        .zip(before)
        .and_then(|(b, a)| crate::measure::contention::Contention::between(&a, &b));
    let mut fp16_ms = None;
    let mut first_failure: Option<String> = None;
    let total = caches.len();
    let failed = caches.iter().filter(|c| c.is_err()).count();
    for ((scheme, cache), ms) in a.schemes.0.iter().zip(caches).zip(times) {
        let cache = match cache {
            Ok(c) => c,
            Err(e) => {
                let line = crate::error::first_line(&e);
                println!("{:<28} {line}", scheme.to_string());
                first_failure.get_or_insert(format!("{scheme}: {line}"));
                continue;
            }
        };
        let Some(s) = summarize(&ms) else {
            anyhow::bail!("--steps must be at least 1");
        };
        // The median timed step brings the cache to `seen` tokens, then attends over what is
        // held after its append (eviction runs after attention).
        let seen = seq_len + 1 + a.steps.div_ceil(2);
        let floor = floors::decode_step(scheme, g, a.batch, scheme.held_tokens(seen - 1) + 1);
        let gbps = floor.bytes() as f64 / (s.p50 * 1e-3) / 1e9;
        if scheme.is_baseline() {
            fp16_ms = Some(s.p50);
        }
        print!(
            "{:<28} {:>12.2} {:>10.2} {:>10.3} {:>10.3} {:>10.3} {:>9} {:>10.2}",
            scheme.to_string(),
            cache.kv_bytes() as f64 / (1u64 << 20) as f64,
            floor.bytes() as f64 / (1u64 << 20) as f64,
            floor.flops as f64 / 1e9,
            s.p50,
            s.p95,
            fp16_ms.map_or("-".into(), |f| format!("{:.2}×", s.p50 / f)),
            gbps
        );
        println!(
            "{}",
            peak.map_or(String::new(), |p| format!(" {:>9.1}", 100.0 * gbps / p))
        );
    }
    if let Some(c) = contention.filter(|c| c.contended()) {
        println!(
            "warning: other processes used {:.2} cores while this table was timed (load {:.1}); \
             the step times describe a shared machine — stop them and rerun",
            c.other_cores, c.load_1m
        );
    }
    // A table in which no scheme ran measured nothing: exit 1, as a sweep whose every point failed.
    if failed == total {
        anyhow::bail!(
            "every scheme failed at {seq_len} tokens ({failed} of {total}); the first: {}",
            first_failure.unwrap_or_default()
        );
    }
    Ok(())
}
