//! `kvbench attn-bench`: time the decode step's cache work (append + attention over every
//! layer) per scheme at a given context length, on synthetic K/V with the model's geometry.

use crate::kv::KvCache;
use crate::measure::stats::summarize;
use crate::measure::synthetic;
use crate::model::{gguf::GgufFile, hub, ModelLocation};

/// Arguments of `kvbench attn-bench`.
#[derive(Debug, clap::Args)]
pub struct AttnBenchArgs {
    /// Model whose geometry to use (only its header/config is read).
    #[arg(long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,
    /// KV-cache schemes, comma-separated (see `kvbench sweep --help`).
    #[arg(long = "dtypes", visible_alias = "schemes", default_value = "fp16,int8,int4,q8_0,q4_0,fp8",
          value_parser = super::sweep::parse_schemes)]
    pub schemes: super::sweep::SchemeList,
    /// Context length the cache is filled to before timing.
    #[arg(long, default_value_t = 8192)]
    pub seq_len: usize,
    /// Sequences.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Timed decode steps per scheme (after one untimed step).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Seed of the synthetic K/V.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs the benchmark and prints a table.
pub fn run(a: AttnBenchArgs) -> anyhow::Result<()> {
    let cfg = match hub::resolve(&a.model)? {
        ModelLocation::Gguf(p) => GgufFile::open(&p)?.config()?,
        ModelLocation::Safetensors { config, .. } => {
            crate::model::safetensors::read_config(&config)?.0
        }
    };
    let g = cfg.cache_geometry();
    println!(
        "decode-step cache work (append + attention, {} layers), batch {}, context {} tokens, {} threads, model geometry {} ({} kv heads × {} head_dim)",
        g.layers, a.batch, a.seq_len, rayon::current_num_threads(), a.model, g.kv_heads, g.head_dim
    );
    println!(
        "{:<28} {:>12} {:>10} {:>10} {:>9} {:>10}",
        "scheme", "KV MiB", "p50 ms", "p95 ms", "vs fp16", "GB/s read"
    );
    let mut fp16_ms = None;
    for scheme in &a.schemes.0 {
        scheme.validate(g.head_dim)?;
        let mut cache = KvCache::new(*scheme, g, a.batch)?;
        synthetic::fill(&mut cache, &g, a.seq_len, a.seed);
        synthetic::time_decode_steps(&mut cache, &g, 1, a.seed);
        let ms = synthetic::time_decode_steps(&mut cache, &g, a.steps, a.seed + 1);
        let s = summarize(&ms).expect("steps ≥ 1");
        let bytes = cache.kv_bytes() as f64;
        if scheme.is_baseline() {
            fp16_ms = Some(s.p50);
        }
        println!(
            "{:<28} {:>12.2} {:>10.3} {:>10.3} {:>9} {:>10.2}",
            scheme.to_string(),
            bytes / (1u64 << 20) as f64,
            s.p50,
            s.p95,
            fp16_ms.map_or("-".into(), |f| format!("{:.2}×", s.p50 / f)),
            bytes / (s.p50 * 1e-3) / 1e9
        );
    }
    Ok(())
}
