//! Bad input gets a clear message and exit code 2, never a panic.

use std::process::Command;

mod common;
use common::kvbench;

#[test]
fn unknown_scheme_lists_valid_ones() {
    let (code, _, err) = kvbench(&["sweep", "--dtypes", "fp16,int5"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("int5") && err.contains("int8-token") && err.contains("int4"),
        "{err}"
    );
}

#[test]
fn missing_model_path_is_named() {
    let (code, _, err) = kvbench(&["sweep", "--model", "/nonexistent/model.gguf"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}

#[test]
fn truncated_gguf_is_a_format_error() {
    let src = kvbench::model::fetch::ensure_default_model().unwrap();
    let dir = std::env::temp_dir().join(format!("kvbench-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(&src).unwrap();
    for (name, len) in [("head.gguf", 1000usize), ("half.gguf", bytes.len() / 2)] {
        let p = dir.join(name);
        std::fs::write(&p, &bytes[..len]).unwrap();
        let (code, _, err) = kvbench(&[
            "sweep",
            "--model",
            p.to_str().unwrap(),
            "--ppl-windows",
            "1",
        ]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains(name) && err.contains("GGUF") || err.contains("truncated"),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ctx_beyond_the_model_is_refused() {
    let (code, _, err) = kvbench(&["sweep", "--ctx", "16384", "--ppl-windows", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("16384") && err.contains("8192"), "{err}");
}

#[test]
fn uncached_repo_offline_names_repo_and_local_path() {
    let home = std::env::temp_dir().join(format!("kvbench-hf-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["sweep", "--model", "llama-3-8b"])
        .env("HF_HOME", &home)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("meta-llama/Meta-Llama-3-8B") && err.contains("--model /path"),
        "{err}"
    );
}

#[test]
fn attn_bench_prints_floors_per_context_and_percent_of_peak() {
    let (code, out, err) = kvbench(&[
        "attn-bench",
        "--dtypes",
        "fp16,int8",
        "--seq-len",
        "64,128",
        "--steps",
        "2",
        "--peak-bandwidth",
        "10",
    ]);
    assert_eq!(code, 0, "{err}");
    for s in [
        "MiB/step",
        "GFLOP/step",
        "GB/s",
        "% of peak",
        "peak bandwidth 10 GB/s",
        "context 64 tokens",
        "context 128 tokens",
    ] {
        assert!(out.contains(s), "missing `{s}` in\n{out}");
    }
    // SmolLM2-135M (30 layers, 3 kv heads, 9 q heads, head_dim 64), context 64, 2 steps: the
    // median step attends over 64 + 1 warm-up + 1 = 66 tokens. fp16 bytes moved: 23,040 B per
    // token × 66 + f32 queries and outputs 2 × 69,120 + new row 23,040 = 1,681,920 B = 1.60 MiB.
    let fp16 = out
        .lines()
        .find(|l| l.starts_with("fp16 "))
        .unwrap_or_else(|| panic!("no fp16 row in\n{out}"));
    let cols: Vec<&str> = fp16.split_whitespace().collect();
    assert_eq!(cols.len(), 9, "{fp16}");
    assert_eq!(cols[2], "1.60", "MiB/step in {fp16}");
}

#[test]
fn attn_bench_peak_bandwidth_must_be_positive() {
    for bad in ["0", "-5", "fast"] {
        let arg = format!("--peak-bandwidth={bad}");
        let (code, _, err) = kvbench(&["attn-bench", &arg]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(bad) && err.contains("GB/s"), "{err}");
    }
}

/// `--device` rejects what it cannot parse, listing the accepted forms.
#[test]
fn unknown_device_lists_accepted_forms() {
    for bad in ["gpu", "cuda:x"] {
        let (code, _, err) = kvbench(&["sweep", "--device", bad]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(bad) && err.contains("cpu") && err.contains("cuda:N"),
            "{err}"
        );
    }
}

/// A CUDA device on a build without CUDA fails at once (before any model is fetched) and says
/// how to rebuild.
#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_device_without_cuda_build_says_how_to_rebuild() {
    for args in [
        &["sweep", "--device", "cuda:0"][..],
        &["sweep", "--device", "cuda", "--synthetic"][..],
    ] {
        let (code, out, err) = kvbench(args);
        assert_eq!(code, 2, "{err}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("--device")
                && err.contains("cuda:0")
                && err.contains("cargo build --release --features cuda"),
            "{err}"
        );
    }
}

/// Issue 26: an unknown scheme names the nearest valid ones first (`int9` is one substitution
/// from int8, int4 and int2), then the full list.
#[test]
fn unknown_scheme_suggests_the_nearest_first() {
    let (code, _, err) = kvbench(&["sweep", "--dtypes", "fp16,int9"]);
    assert_eq!(code, 2, "{err}");
    let (first, rest) = err.split_once("valid schemes").expect("full list kept");
    assert!(
        first.contains("no scheme is called `int9`; did you mean `int8`, `int4`, `int2`?"),
        "{err}"
    );
    assert!(rest.contains("turboquant_3bit_nc"), "{err}");
}

/// Issue 26: vLLM's flags given where kvbench spells them otherwise get a hint naming
/// kvbench's flag or command (exit 2, clap's own error kept).
#[test]
fn vllm_flags_get_a_hint() {
    for (args, hint) in [
        (
            &["sweep", "--request-rate", "4"][..],
            "kvbench serve --request-rate R",
        ),
        (
            &["sweep", "--max-num-seqs=8"][..],
            "kvbench serve --max-num-seqs N",
        ),
        (
            &["sweep", "--kv-cache-dtype", "fp8"][..],
            "vLLM's `fp8` is `fp8_e4m3` there",
        ),
        (
            &["serve", "--kv-cache-dtype", "fp8_e4m3"][..],
            "kvbench's --dtypes",
        ),
    ] {
        let (code, _, err) = kvbench(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(
            err.contains("hint: ") && err.contains(hint),
            "{args:?}: {err}"
        );
    }
    // serve takes --request-rate itself: no hint, the flag parses (a bad value is refused).
    let (code, _, err) = kvbench(&["serve", "--request-rate", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("hint: vLLM"), "{err}");
}

/// Issue 26: vLLM's `--kv-cache-dtype` values are accepted by `--dtypes` and print under
/// kvbench's names (checked through `plan`, which prints each scheme without a model run).
#[test]
fn vllm_dtype_names_work_on_the_command_line() {
    let dir = std::env::temp_dir().join(format!("kvbench-plan26-{}", std::process::id()));
    let (code, out, err) = kvbench(&[
        "plan",
        "--dtypes",
        "auto,fp8_e4m3,fp8_e5m2",
        "--memory",
        "80GiB",
        "--out",
        dir.to_str().unwrap(),
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 0, "{err}");
    for printed in ["fp16", "fp8:scale=tensor", "fp8-e5m2:scale=none"] {
        assert!(out.contains(printed), "{printed}: {out}");
    }
}
