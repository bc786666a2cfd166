//! Bad input gets a clear message and exit code 2, never a panic.

use std::process::Command;

mod common;
use common::kvbench;

#[test]
fn unknown_scheme_lists_valid_ones() {
    let (code, _, err) = kvbench(&["sweep", "--dtypes", "fp16,int3"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("int3") && err.contains("int8-token") && err.contains("int4"),
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
