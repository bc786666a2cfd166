//! `kvbench attn-bench`: time the decode step's cache work (append + attention over every
//! layer) per scheme at one or more context lengths, on synthetic K/V with the model's geometry,
//! with the step's floors (bytes moved, FLOPs; see [`crate::measure::floors`]) and the bandwidth
//! achieved against them.

use candle_core::Device;

use crate::kv::AnyCache;
use crate::measure::stats::summarize;
use crate::measure::{device, floors, synthetic};
use crate::model::device::DeviceSpec;
use crate::model::hub;

/// Arguments of `kvbench attn-bench`.
#[derive(Debug, clap::Args)]
pub struct AttnBenchArgs {
    /// Model whose geometry to use: only its header/config is read; an alias with shipped
    /// geometry (llama-3-8b, mistral-7b, …, see `kvbench plan --help`) needs no download.
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,
    /// KV-cache schemes, comma-separated (see `kvbench sweep --help`).
    #[arg(long = "dtypes", visible_alias = "schemes", default_value = "fp16,int8,int4,q8_0,q4_0,fp8",
          value_parser = super::sweep::parse_schemes)]
    pub schemes: super::sweep::SchemeList,
    /// Context lengths the cache is filled to before timing, comma-separated (one table each).
    #[arg(long = "seq-len", value_delimiter = ',', default_value = "8192")]
    pub seq_lens: Vec<usize>,
    /// Sequences.
    #[arg(long, default_value_t = 1)]
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
    /// Peak memory bandwidth of the machine in GB/s (10^9 bytes/s), e.g. 4800 for an H200's
    /// HBM3e; adds a `% of peak` column for the achieved bandwidth.
    #[arg(long, value_parser = parse_gbps)]
    pub peak_bandwidth: Option<f64>,
}

/// `"4800"` → 4800.0 (GB/s); refuses anything but a finite number > 0.
fn parse_gbps(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(_) => Err(format!("`{s}` must be a bandwidth in GB/s > 0, e.g. 4800")),
        Err(_) => Err(format!("`{s}` is not a number of GB/s, e.g. 4800 or 51.2")),
    }
}

/// Runs the benchmark and prints a table.
pub fn run(a: AttnBenchArgs) -> anyhow::Result<()> {
    // Geometry only: aliases (llama-3-8b, …) need no download.
    let g = crate::model::geometry::for_model_arg(&a.model)?.cache();
    let dev = a.device.open()?;
    check_sizes(&a, &g, &dev)?;
    for &seq_len in &a.seq_lens {
        table(&a, &g, seq_len, &dev)?;
    }
    Ok(())
}

/// Refuses, before any cache is allocated: `--steps 0`, `--batch 0`, and a batch × context whose
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
            "--batch",
            "0 sequences measure nothing; give 1 or more".into(),
        ));
    }
    if a.seq_lens.is_empty() {
        return Err(bad("--seq-len", "give one or more context lengths".into()));
    }
    let avail = match device::device_mem_free(dev) {
        Ok(Some(free)) => Some(free),
        _ => crate::measure::memory::available_bytes(),
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
                    "--batch",
                    format!(
                        "{scheme} at batch {} × context {seq_len} needs {} of KV cache, {} \
                         available; lower --batch or --seq-len",
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
        a.peak_bandwidth
            .map_or(String::new(), |p| format!(", peak bandwidth {p} GB/s"))
    );
    print!(
        "{:<28} {:>12} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10}",
        "scheme", "KV MiB", "MiB/step", "GFLOP/step", "p50 ms", "p95 ms", "vs fp16", "GB/s"
    );
    println!(
        "{}",
        if a.peak_bandwidth.is_some() {
            format!(" {:>9}", "% of peak")
        } else {
            String::new()
        }
    );
    let mut fp16_ms = None;
    for scheme in &a.schemes.0 {
        scheme.validate(g.head_dim)?;
        let timed = (|| -> crate::Result<(AnyCache, Vec<f64>)> {
            let cap = seq_len + a.steps + 2;
            let mut cache = AnyCache::new(*scheme, *g, a.batch, cap, dev)?;
            let c = cache.as_attention();
            synthetic::fill_on(c, g, a.batch, scheme.evicts(), seq_len, a.seed, dev)?;
            synthetic::time_decode_steps_on(c, g, a.batch, 1, a.seed, dev)?;
            let ms = synthetic::time_decode_steps_on(c, g, a.batch, a.steps, a.seed + 1, dev)?;
            Ok((cache, ms))
        })();
        let (cache, ms) = match timed {
            Ok(t) => t,
            Err(e) => {
                println!(
                    "{:<28} {}",
                    scheme.to_string(),
                    crate::error::first_line(&e)
                );
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
            a.peak_bandwidth
                .map_or(String::new(), |p| format!(" {:>9.1}", 100.0 * gbps / p))
        );
    }
    Ok(())
}
