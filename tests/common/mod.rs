//! Shared test helpers: the default model, fetched through kvbench's own fetch step and loaded
//! once per test binary.
#![allow(dead_code)]

use std::sync::OnceLock;

use candle_core::Tensor;
use kvbench::model::{self, LoadedModel, WeightDtype};

/// Runs the kvbench binary with `args`: (exit code, stdout, stderr). Fails the test on a panic
/// message, since bad input must get an error, never a panic.
pub fn kvbench(args: &[&str]) -> (i32, String, String) {
    // Inside a Slurm job array or a Kubernetes Indexed Job, a sweep would run one shard only.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(args)
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("SLURM_ARRAY_TASK_COUNT")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .expect("running kvbench");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

/// SmolLM2-135M-Instruct with f32 weights (fetched with `kvbench::model::fetch` if missing).
pub fn smollm_f32() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| {
        let path = model::fetch::ensure_default_model().expect("fetching the default model");
        model::load(path.to_str().unwrap(), WeightDtype::F32).expect("loading the default model")
    })
}

/// The first 64 ids and the count of WikiText-2 test tokens, from the independent reference.
pub fn reference_tokens() -> (usize, Vec<u32>) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/wikitext2_test_tokens.json"
    ))
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = v["first_64_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    (v["n_tokens"].as_u64().unwrap() as usize, ids)
}

/// The GGUF file at `path` opened through a plain buffered reader rather than mapped, so a
/// model loaded from it copies every tensor into memory: the "read" side of the mapped-vs-read
/// load tests.
pub fn gguf_read_copy(path: &std::path::Path) -> kvbench::model::gguf::GgufFile {
    let reader = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    kvbench::model::gguf::GgufFile::from_reader(path, reader).unwrap()
}

/// Largest absolute elementwise difference of two tensors of the same shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The bytes the CPU row encoder of `q` (`kvbench::kv::format`) writes for row `x`: the reference
/// the GPU and emulated kernels' stored rows are compared with.
pub fn cpu_row_bytes(q: kvbench::kv::Quant, x: &[f32]) -> Vec<u8> {
    use kvbench::kv::format::{
        F16Row, Fp8Row, Int4GroupRow, Int8TokenRow, Mxfp4Row, Nvfp4Row, Q4_0Row, Q8_0Row, RowCodec,
    };
    use kvbench::kv::Quant;
    fn enc(c: impl RowCodec, x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; c.row_bytes(x.len())];
        c.encode(x, &mut out);
        out
    }
    match q {
        Quant::Fp16 => enc(F16Row, x),
        Quant::Int8Token => enc(Int8TokenRow, x),
        Quant::Int4 { group } => enc(Int4GroupRow { group }, x),
        Quant::Q8_0 => enc(Q8_0Row, x),
        Quant::Q4_0 => enc(Q4_0Row, x),
        Quant::Fp8 { kind, .. } => enc(Fp8Row { kind, scale: None }, x),
        Quant::Nvfp4 => enc(Nvfp4Row, x),
        Quant::Mxfp4 => enc(Mxfp4Row, x),
        other => panic!("no row codec for {other}"),
    }
}

/// Activations as attention sees them: roughly normal, a few outlier channels 10× larger
/// (the channel outliers of keys that KIVI §3 describes).
pub fn activations(rng: &mut rand::rngs::StdRng, n: usize, d: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            use rand::Rng;
            let (u1, u2): (f32, f32) = (rng.random_range(1e-6..1.0), rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
            if i % d % 17 == 3 {
                10.0 * z
            } else {
                z
            }
        })
        .collect()
}
