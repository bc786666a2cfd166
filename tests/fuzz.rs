//! Seeded mutation fuzzing of the parsers that read files a user hands kvbench: the GGUF reader
//! (header scan, candle's reader, config, geometry checks, tokenizer, tensor reads), the
//! safetensors header and geometry check, suites (TOML) and gate CSVs.
//!
//! Seeds are real files: the default GGUF's header region, a tiny GGUF with the same metadata
//! keys, a safetensors file written by candle, `suites/*.toml`, `suites/baselines/*.csv`. Each
//! execution mutates a seed (bit flips, byte sets to boundary values, u32/u64 fields set to
//! boundary values, cuts, duplicated or deleted spans, splices between seeds) and runs the
//! parser; an execution "crashes" when it panics (caught here and counted) or aborts the
//! process (an allocation the parser let through). `cargo test` runs a short bounded loop; the
//! ignored `gguf_reader_one_million_executions` runs `KVBENCH_FUZZ_EXECS` (default 1,000,000)
//! executions of the GGUF reader and prints the counts.

#[path = "support/gguf.rs"]
mod gguf;

use std::io::Cursor;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Boundary values a mutation writes into an integer field.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX / 2,
];

/// One random mutation of `seed` (possibly several stacked), AFL-style.
fn mutate(rng: &mut StdRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    let rounds = 1 + rng.random_range(0..4);
    for _ in 0..rounds {
        if v.is_empty() {
            v.push(0);
        }
        let len = v.len();
        // Mutations near the start hit the header fields; bias there half the time.
        let pos = if rng.random_bool(0.5) {
            rng.random_range(0..len.min(256))
        } else {
            rng.random_range(0..len)
        };
        match rng.random_range(0..8) {
            0 => v[pos] ^= 1 << rng.random_range(0..8),
            1 => v[pos] = [0u8, 1, 0x7f, 0x80, 0xff][rng.random_range(0..5)],
            2 if pos + 4 <= len => {
                let x = INTERESTING[rng.random_range(0..INTERESTING.len())] as u32;
                v[pos..pos + 4].copy_from_slice(&x.to_le_bytes());
            }
            3 if pos + 8 <= len => {
                let x = INTERESTING[rng.random_range(0..INTERESTING.len())];
                v[pos..pos + 8].copy_from_slice(&x.to_le_bytes());
            }
            4 => v.truncate(pos),
            5 => {
                let n = rng.random_range(1..=64.min(len - pos));
                let span: Vec<u8> = v[pos..pos + n].to_vec();
                let at = rng.random_range(0..=len);
                v.splice(at..at, span);
            }
            6 => {
                let n = rng.random_range(1..=64.min(len - pos));
                v.drain(pos..pos + n);
            }
            _ if !other.is_empty() => {
                let from = rng.random_range(0..other.len());
                let n = rng.random_range(1..=64.min(other.len() - from));
                let end = (pos + n).min(len);
                v.splice(pos..end, other[from..from + n].iter().copied());
            }
            _ => v[pos] = rng.random(),
        }
    }
    v
}

/// Runs `parse` on `count` mutations of `seeds` (seeded); returns (executions, crashes), a crash
/// being a panic (printed once per kind).
fn fuzz(name: &str, seeds: &[Vec<u8>], count: u64, seed: u64, parse: impl Fn(&[u8])) -> (u64, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut crashes = 0;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for i in 0..count {
        let s = &seeds[rng.random_range(0..seeds.len())];
        let o = &seeds[rng.random_range(0..seeds.len())];
        let input = mutate(&mut rng, s, o);
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(&input))) {
            crashes += 1;
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            if crashes <= 5 {
                let file = std::env::temp_dir().join(format!("kvbench-fuzz-{name}-{i}.bin"));
                std::fs::write(&file, &input).ok();
                eprintln!(
                    "{name}: execution {i} panicked: {msg} (input saved to {})",
                    file.display()
                );
            }
        }
    }
    std::panic::set_hook(hook);
    (count, crashes)
}

/// How far GGUF mutants got: opened (header read), config and geometry accepted, tokenizer built.
static GGUF_STAGES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// The GGUF reader end to end on bytes in memory: header scan and candle's reader, hyper-
/// parameters and geometry against the tensors, tokenizer, and (for small files) every tensor.
fn read_gguf(bytes: &[u8]) {
    let path = Path::new("fuzz.gguf");
    let Ok(mut f) = kvbench::model::gguf::GgufFile::from_reader(path, Cursor::new(bytes)) else {
        return;
    };
    GGUF_STAGES[0].fetch_add(1, Ordering::Relaxed);
    let _ = f.parameter_count();
    let Ok(cfg) = f.config() else { return };
    GGUF_STAGES[1].fetch_add(1, Ordering::Relaxed);
    if f.tokenizer().is_ok() {
        GGUF_STAGES[2].fetch_add(1, Ordering::Relaxed);
    }
    if bytes.len() < 1 << 20 {
        for name in [
            "token_embd.weight",
            "blk.0.attn_q.weight",
            "output_norm.weight",
        ] {
            let _ = f.tensor(name);
        }
    }
    let _ = cfg.cache_geometry();
}

fn gguf_seeds() -> Vec<Vec<u8>> {
    let path = kvbench::model::fetch::ensure_default_model().unwrap();
    let real = gguf::Gguf::read(&path);
    let bytes = std::fs::read(&path).unwrap();
    // The default model's header region (metadata, the start of the vocabulary), and a tiny
    // model with the same keys whose every part parses.
    vec![bytes[..64 << 10].to_vec(), gguf::tiny_model(&real).bytes()]
}

/// Safetensors: candle's reader of the header, then the geometry check against a config.
fn read_safetensors(bytes: &[u8]) {
    let Ok(st) = candle_core::safetensors::SliceSafetensors::new(bytes) else {
        return;
    };
    let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    let cfg = kvbench::model::ModelConfig {
        arch: "llama".into(),
        layers: 1,
        hidden: 8,
        intermediate: 16,
        q_heads: 2,
        kv_heads: 1,
        head_dim: 4,
        vocab: 10,
        rope_theta: 10000.0,
        rope_style: kvbench::model::RopeStyle::Half,
        rms_eps: 1e-5,
        max_ctx: 64,
    };
    let ok = kvbench::model::shapes::check_shapes(
        &cfg,
        kvbench::model::shapes::Naming::HuggingFace,
        |n| st.get(n).ok().map(|v| v.shape().to_vec()),
        names.iter().map(String::as_str),
        Path::new("fuzz.safetensors"),
    );
    if ok.is_ok() {
        for n in &names {
            let _ = st.load(n, &candle_core::Device::Cpu);
        }
    }
}

fn safetensors_seed() -> Vec<u8> {
    use candle_core::{Device, Tensor};
    let dev = Device::Cpu;
    let t = |shape: &[usize]| Tensor::ones(shape, candle_core::DType::F32, &dev).unwrap();
    let mut m = std::collections::HashMap::new();
    m.insert("model.embed_tokens.weight".to_string(), t(&[10, 8]));
    m.insert("model.norm.weight".to_string(), t(&[8]));
    let p = "model.layers.0";
    for (n, s) in [
        ("input_layernorm", vec![8]),
        ("post_attention_layernorm", vec![8]),
        ("self_attn.q_proj", vec![8, 8]),
        ("self_attn.k_proj", vec![4, 8]),
        ("self_attn.v_proj", vec![4, 8]),
        ("self_attn.o_proj", vec![8, 8]),
        ("mlp.gate_proj", vec![16, 8]),
        ("mlp.up_proj", vec![16, 8]),
        ("mlp.down_proj", vec![8, 16]),
    ] {
        m.insert(format!("{p}.{n}.weight"), t(&s));
    }
    let file =
        std::env::temp_dir().join(format!("kvbench-fuzz-{}.safetensors", std::process::id()));
    candle_core::safetensors::save(&m, &file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).ok();
    bytes
}

fn read_suite(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let _ = kvbench::measure::settings::SweepSettings::parse_suite(&text, Path::new("fuzz.toml"));
}

fn suite_seeds() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/suites");
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        // serve.toml holds `kvbench serve` settings, not a sweep suite.
        .filter(|p| p.file_name().is_some_and(|n| n != "serve.toml"))
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

fn read_gate(bytes: &[u8], base: &kvbench::report::gate::Results) {
    use kvbench::report::gate::{compare, markdown, Limits, Results};
    let Ok(cur) = Results::from_reader(Path::new("fuzz.csv"), bytes) else {
        return;
    };
    let limits = Limits {
        max_ppl_delta_pct: Some(1.0),
        max_kl: Some(0.01),
        max_tpot_regression_pct: Some(5.0),
        significant: false,
    };
    for (b, c) in [(base, &cur), (&cur, base), (&cur, &cur)] {
        if let Ok(v) = compare(b, c, &limits) {
            let _ = markdown(&v, &limits);
        }
    }
}

fn gate_seeds() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/suites/baselines");
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// The seeds parse (so mutations start from valid files).
#[test]
fn fuzz_seeds_are_valid_files() {
    let tiny = &gguf_seeds()[1];
    let mut f =
        kvbench::model::gguf::GgufFile::from_reader(Path::new("tiny.gguf"), Cursor::new(tiny))
            .unwrap();
    assert_eq!(f.config().unwrap().layers, 2);
    f.tensor("blk.1.ffn_down.weight").unwrap();
    assert!(!gate_seeds().is_empty() && !suite_seeds().is_empty());
    for s in suite_seeds() {
        kvbench::measure::settings::SweepSettings::parse_suite(
            std::str::from_utf8(&s).unwrap(),
            Path::new("s.toml"),
        )
        .unwrap();
    }
}

/// A short bounded run of every fuzz target (a few seconds): no panic, no abort.
#[test]
fn fuzzed_model_suite_and_gate_files_never_crash() {
    let g = fuzz("gguf", &gguf_seeds(), 3000, 1, read_gguf);
    let s = fuzz(
        "safetensors",
        &[safetensors_seed()],
        3000,
        2,
        read_safetensors,
    );
    let t = fuzz("suite", &suite_seeds(), 3000, 3, read_suite);
    let base_bytes = gate_seeds().remove(0);
    let base = kvbench::report::gate::Results::from_reader(Path::new("base.csv"), &base_bytes[..])
        .unwrap();
    let c = fuzz("gate", &gate_seeds(), 3000, 4, |b| read_gate(b, &base));
    for (name, (n, crashes)) in [("gguf", g), ("safetensors", s), ("suite", t), ("gate", c)] {
        assert_eq!(crashes, 0, "{name}: {crashes} of {n} executions panicked");
    }
}

/// ≥ 1 M executions of the GGUF reader (`cargo test --release --test fuzz -- --ignored
/// --nocapture`; `KVBENCH_FUZZ_EXECS` and `KVBENCH_FUZZ_SEED` change the count and seed).
#[test]
#[ignore]
fn gguf_reader_one_million_executions() {
    let n: u64 = std::env::var("KVBENCH_FUZZ_EXECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let seed: u64 = std::env::var("KVBENCH_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(14);
    let t = Instant::now();
    let (execs, crashes) = fuzz("gguf", &gguf_seeds(), n, seed, read_gguf);
    let stage = |i: usize| GGUF_STAGES[i].load(Ordering::Relaxed);
    println!(
        "GGUF reader fuzz: {execs} executions, {crashes} crashes, {:.1} s (seed {seed}); \
         header read {}, config + geometry accepted {}, tokenizer built {}",
        t.elapsed().as_secs_f64(),
        stage(0),
        stage(1),
        stage(2)
    );
    assert_eq!(crashes, 0);
}
