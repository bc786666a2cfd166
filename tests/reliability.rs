//! Issue 14: no lost or mislabelled result, no crash, hang or silent pass on bad input. Each test
//! reproduces one case found by trying hostile and careless input, and is named after it.

mod common;
#[path = "support/gguf.rs"]
mod gguf;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::Value;
use common::kvbench;
use kvbench::model::{self, WeightDtype};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-rel-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn default_gguf() -> gguf::Gguf {
    gguf::Gguf::read(&model::fetch::ensure_default_model().unwrap())
}

/// Loads `g` written to a file; returns the error message (the load must fail).
fn load_error(g: &gguf::Gguf, dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    g.write(&p);
    match model::load(p.to_str().unwrap(), WeightDtype::F32) {
        Ok(_) => panic!("{name} loaded"),
        Err(e) => {
            assert!(e.is_usage(), "{name}: {e} should be a usage error (exit 2)");
            e.to_string()
        }
    }
}

/// A quick synthetic sweep (geometry only) into `out`, with extra flags.
fn synthetic(out: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "sweep",
        "--synthetic",
        "--dtypes",
        "fp16",
        "--batch-sizes",
        "1",
        "--seq-lens",
        "16",
        "--gen",
        "2",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    kvbench(&args)
}

fn csv_rows(dir: &Path) -> Vec<Vec<String>> {
    let mut r = csv::Reader::from_path(dir.join("results.csv")).unwrap();
    r.records()
        .map(|x| x.unwrap().iter().map(str::to_string).collect())
        .collect()
}

#[test]
fn gguf_context_length_0xffffffff_is_refused_at_load() {
    let dir = tmp("ctx");
    let mut g = default_gguf();
    g.set("llama.context_length", Value::U32(u32::MAX));
    let e = load_error(&g, &dir, "ctx.gguf");
    assert!(e.contains("context length 4294967295"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gguf_geometry_disagreeing_with_its_weights_is_refused() {
    let dir = tmp("geom");
    let base = default_gguf();
    // SmolLM2-135M: 9 heads of 64 → Q is [576, 576]; 3 kv heads → K is [192, 576].
    for (key, v, want) in [
        ("llama.attention.key_length", Value::U32(20), "[576, 576]"),
        ("llama.attention.key_length", Value::U32(63), "odd"),
        (
            "llama.attention.head_count",
            Value::U32(18),
            "blk.0.attn_k.weight",
        ),
        ("llama.block_count", Value::U32(2), "blk.2."),
    ] {
        let mut g = base.clone();
        g.set(key, v.clone());
        let e = load_error(&g, &dir, "geom.gguf");
        assert!(e.contains(want), "{key} = {v:?}: {e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gguf_duplicated_key_is_refused() {
    let dir = tmp("dup");
    let mut g = default_gguf();
    // The same key again, later in the file: candle's reader keeps the later value (2 layers
    // instead of 30).
    g.metadata.push(("llama.block_count".into(), Value::U32(2)));
    let e = load_error(&g, &dir, "dup.gguf");
    assert!(
        e.contains("llama.block_count") && e.contains("twice"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gguf_nan_eps_or_zero_rope_base_is_refused() {
    let dir = tmp("eps");
    let base = default_gguf();
    for (key, v, want) in [
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(f32::NAN),
            "epsilon NaN",
        ),
        ("llama.rope.freq_base", Value::F32(0.0), "RoPE base"),
        (
            "llama.rope.freq_base",
            Value::F32(f32::INFINITY),
            "RoPE base",
        ),
    ] {
        let mut g = base.clone();
        g.set(key, v.clone());
        let e = load_error(&g, &dir, "eps.gguf");
        assert!(e.contains(want), "{key} = {v:?}: {e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gguf_nan_norm_weights_are_refused() {
    let dir = tmp("nannorm");
    let mut g = default_gguf();
    let at = g.tensor_start("blk.3.ffn_norm.weight");
    g.data[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let e = load_error(&g, &dir, "nannorm.gguf");
    assert!(
        e.contains("blk.3.ffn_norm.weight") && e.contains("NaN"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gguf_version_1_is_named_without_raw_bytes() {
    let dir = tmp("v1");
    let mut bytes = std::fs::read(model::fetch::ensure_default_model().unwrap()).unwrap();
    bytes.truncate(1 << 20);
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let p = dir.join("v1.gguf");
    std::fs::write(&p, &bytes).unwrap();
    let (code, _, err) = kvbench(&["sweep", "--model", p.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("GGUF version 1") && err.contains("llama.cpp"),
        "{err}"
    );
    assert!(err.lines().count() <= 2 && err.is_ascii(), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gguf_tensor_dims_whose_byte_size_overflows_are_refused() {
    let dir = tmp("dims");
    let base = default_gguf();
    for ne in [
        vec![576, u64::MAX / 2],
        vec![1 << 40, 1 << 40],
        vec![0, 49152],
    ] {
        let mut g = base.clone();
        g.tensors
            .iter_mut()
            .find(|t| t.name == "token_embd.weight")
            .unwrap()
            .ne = ne.clone();
        let e = load_error(&g, &dir, "dims.gguf");
        assert!(e.contains("token_embd.weight"), "{ne:?}: {e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn safetensors_max_position_embeddings_1e12_is_refused() {
    let dir = tmp("mpe");
    std::fs::write(
        dir.join("config.json"),
        r#"{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 1000000000000}"#,
    )
    .unwrap();
    let e = kvbench::model::safetensors::read_config(&dir.join("config.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("context length 1000000000000"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// An infinite scale in one Q4_1 block of `blk.0.ffn_down` makes the logits NaN: each point
/// is an `error` (never `ok` with tokens [0, 0, …]), and a sweep in which every point failed
/// exits 1.
#[test]
fn nan_logits_fail_the_point_and_an_all_failed_sweep_exits_1() {
    let dir = tmp("naninf");
    let mut g = default_gguf();
    let t = g
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap()
        .clone();
    assert_eq!(t.ty, 3, "Q4_1 expected");
    let at = t.offset as usize;
    g.data[at..at + 2].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
    let p = dir.join("inf.gguf");
    g.write(&p);
    let out = dir.join("run");
    let (code, _, err) = kvbench(&[
        "sweep",
        "--model",
        p.to_str().unwrap(),
        "--dtypes",
        "fp16",
        "--batch-sizes",
        "1",
        "--seq-lens",
        "8",
        "--gen",
        "2",
        "--ppl-windows",
        "0",
        "--warmup",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("every point of the sweep failed"), "{err}");
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 1);
    assert!(rows[0][8].contains("non-finite"), "{:?}", rows[0]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn out_folder_with_existing_run_is_refused() {
    let dir = tmp("out");
    let out = dir.join("run");
    let (code, _, err) = synthetic(&out, &[]);
    assert_eq!(code, 0, "{err}");
    let first: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    let (code, _, err) = synthetic(&out, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--resume") && err.contains("--force"), "{err}");
    assert_eq!(csv_rows(&out).len(), 1, "the first run is untouched");
    // --force moves the first run aside, whole.
    let (code, _, err) = synthetic(&out, &["--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(".old-"), "{err}");
    let aside: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("run.old-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let moved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(aside[0].join("meta.json")).unwrap())
            .unwrap();
    assert_eq!(moved["run_id"], first["run_id"]);
    assert_eq!(csv_rows(&out).len(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn resume_with_other_threads_is_refused_and_threads_are_recorded() {
    let dir = tmp("threads");
    let out = dir.join("run");
    let (code, _, err) = synthetic(&out, &["--threads", "1"]);
    assert_eq!(code, 0, "{err}");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["settings"]["threads"], 1);
    assert_eq!(meta["machine"]["threads"], 1);
    let cpus = std::thread::available_parallelism().unwrap().get();
    let other = (if cpus > 1 { 2 } else { 3 }).to_string();
    let (code, _, err) = kvbench(&[
        "sweep",
        "--resume",
        out.to_str().unwrap(),
        "--threads",
        &other,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--threads 1"), "{err}");
    let (code, _, err) = kvbench(&["sweep", "--resume", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn resume_with_a_changed_model_file_is_refused() {
    let dir = tmp("sha");
    let model = dir.join("m.gguf");
    std::fs::copy(model::fetch::ensure_default_model().unwrap(), &model).unwrap();
    let out = dir.join("run");
    let args = |m: &Path| {
        vec![
            "sweep".to_string(),
            "--model".into(),
            m.display().to_string(),
            "--dtypes".into(),
            "fp16".into(),
            "--batch-sizes".into(),
            "1".into(),
            "--seq-lens".into(),
            "8".into(),
            "--gen".into(),
            "2".into(),
            "--ppl-windows".into(),
            "0".into(),
            "--warmup".into(),
            "0".into(),
            "--out".into(),
            out.display().to_string(),
        ]
    };
    let a = args(&model);
    let (code, _, err) = kvbench(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{err}");
    // Another model file at the same path: bytes appended after the data section.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&model)
        .unwrap();
    std::io::Write::write_all(&mut f, &[0u8; 64]).unwrap();
    drop(f);
    let before = std::fs::read_to_string(out.join("meta.json")).unwrap();
    let (code, _, err) = kvbench(&["sweep", "--resume", out.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("sha256") && err.contains("changed"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("meta.json")).unwrap(),
        before,
        "meta.json keeps the first model's hash"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn report_with_missing_or_empty_raw_results_is_refused() {
    let dir = tmp("report");
    let out = dir.join("run");
    assert_eq!(synthetic(&out, &[]).0, 0);
    let csv_before = std::fs::read_to_string(out.join("results.csv")).unwrap();
    std::fs::write(out.join("raw.jsonl"), "").unwrap();
    let (code, _, err) = kvbench(&["report", out.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("raw.jsonl is empty"), "{err}");
    std::fs::remove_file(out.join("raw.jsonl")).unwrap();
    let (code, _, err) = kvbench(&["report", out.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("raw.jsonl is missing"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("results.csv")).unwrap(),
        csv_before
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn report_comparison_into_one_of_its_runs_is_refused() {
    let dir = tmp("cmp");
    let (a, b) = (dir.join("a"), dir.join("b"));
    assert_eq!(synthetic(&a, &[]).0, 0);
    assert_eq!(synthetic(&b, &["--seq-lens", "32"]).0, 0);
    let before = std::fs::read_to_string(a.join("results.csv")).unwrap();
    let (code, _, err) = kvbench(&[
        "report",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--out",
        a.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--out"), "{err}");
    assert_eq!(
        std::fs::read_to_string(a.join("results.csv")).unwrap(),
        before
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn duplicate_points_are_measured_once() {
    let dir = tmp("dups");
    let out = dir.join("run");
    let (code, _, err) = kvbench(&[
        "sweep",
        "--synthetic",
        "--dtypes",
        "fp16,int8,fp16",
        "--batch-sizes",
        "1,1",
        "--seq-lens",
        "16,16",
        "--gen",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("note: --batch-sizes lists 1"), "{err}");
    assert!(err.contains("note: --dtypes lists fp16"), "{err}");
    let rows = csv_rows(&out);
    let points: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r[4].as_str(), r[5].as_str(), r[6].as_str()))
        .collect();
    assert_eq!(points, [("fp16", "1", "16"), ("int8-token", "1", "16")]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Without a terminal (as here: stderr is a pipe), a sweep prints plain progress lines.
#[test]
fn sweep_without_a_terminal_prints_progress_lines() {
    let dir = tmp("progress");
    let (code, _, err) = synthetic(&dir.join("run"), &["--seq-lens", "16,32"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("progress: 0/2 units") && err.contains("progress: 1/2 units"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gate_nan_infinite_or_negative_kl_limit_is_refused() {
    for bad in ["NaN", "inf", "-0.5"] {
        let arg = format!("--max-kl={bad}");
        let (code, _, err) = kvbench(&["gate", "--baseline", "x", "--current", "y", &arg]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(bad), "{err}");
    }
}

#[test]
fn gate_infinite_or_negative_perplexity_is_refused() {
    let dir = tmp("gate");
    let good = "scheme,batch_size,seq_len,ppl\nfp16,1,64,20.0\n";
    for (base, cur, bad) in [
        ("inf", "25.0", "inf"),
        ("-3", "25.0", "-3"),
        ("20.0", "-1", "-1"),
        ("20.0", "NaN", "NaN"),
    ] {
        let b = dir.join("b.csv");
        let c = dir.join("c.csv");
        std::fs::write(
            &b,
            format!("scheme,batch_size,seq_len,ppl\nfp16,1,64,{base}\n"),
        )
        .unwrap();
        std::fs::write(
            &c,
            format!("scheme,batch_size,seq_len,ppl\nfp16,1,64,{cur}\n"),
        )
        .unwrap();
        let (code, _, err) = kvbench(&[
            "gate",
            "--baseline",
            b.to_str().unwrap(),
            "--current",
            c.to_str().unwrap(),
            "--max-ppl-delta",
            "1%",
        ]);
        assert_eq!(code, 2, "{base} → {cur}: {err}");
        assert!(err.contains(&format!("`{bad}`")), "{err}");
    }
    // A point twice in one file is ambiguous.
    let b = dir.join("b.csv");
    std::fs::write(&b, format!("{good}fp16,1,64,30.0\n")).unwrap();
    let (code, _, err) = kvbench(&[
        "gate",
        "--baseline",
        b.to_str().unwrap(),
        "--current",
        b.to_str().unwrap(),
        "--max-ppl-delta",
        "1%",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("twice"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--batch-sizes 99999999 --seq-lens 4000`: the prompts alone would be 1.6 TB. The point is
/// recorded as `oom` before any prompt is built, and with no point left the sweep exits 1.
#[test]
fn huge_batch_is_recorded_as_oom_before_building_prompts() {
    let dir = tmp("huge");
    let out = dir.join("run");
    let (code, _, err) = kvbench(&[
        "sweep",
        "--dtypes",
        "fp16",
        "--batch-sizes",
        "99999999",
        "--seq-lens",
        "4000",
        "--ppl-windows",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    let rows = csv_rows(&out);
    assert!(rows[0][8].starts_with("oom: needs"), "{:?}", rows[0]);
    // Beyond any machine (2^40 tokens per point): refused at once.
    let (code, _, err) = synthetic(&dir.join("r2"), &["--batch-sizes", "1099511627776"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--batch-sizes"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn attn_bench_huge_zero_batch_or_zero_steps_is_a_usage_error() {
    for args in [
        &["attn-bench", "--batch", "99999999", "--dtypes", "fp16"][..],
        &["attn-bench", "--batch", "0"][..],
        &["attn-bench", "--steps", "0"][..],
    ] {
        let t = Instant::now();
        let (code, out, err) = kvbench(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(t.elapsed() < Duration::from_secs(60));
    }
}

#[test]
fn threads_far_past_the_cpus_are_refused() {
    let (code, _, err) = kvbench(&["sweep", "--threads", "100000"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("100000") && err.contains("logical CPUs"),
        "{err}"
    );
}

#[test]
fn memory_limit_without_synthetic_is_refused() {
    let (code, _, err) = kvbench(&["sweep", "--memory-limit", "nonsense"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--memory-limit") && err.contains("--synthetic"),
        "{err}"
    );
    let dir = tmp("memlim");
    let (code, _, err) = synthetic(&dir.join("run"), &["--memory-limit", "nonsense"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nonsense"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn absurd_warmup_is_refused_with_an_estimate() {
    let (code, _, err) = kvbench(&["sweep", "--warmup", "4294967296"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--warmup") && err.contains("forward passes"),
        "{err}"
    );
}

#[test]
fn plan_zero_concurrency_or_absurd_memory_is_refused() {
    let dir = tmp("plan");
    let out = dir.join("p");
    for args in [
        &["plan", "--concurrency", "0"][..],
        &["plan", "--memory", "100000000000TiB"][..],
    ] {
        let mut a = args.to_vec();
        a.extend(["--out", out.to_str().unwrap()]);
        let (code, _, err) = kvbench(&a);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn out_under_proc_is_a_usage_error() {
    let (code, _, err) = kvbench(&["sweep", "--synthetic", "--out", "/proc/kvbench-run"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/proc/kvbench-run"), "{err}");
}

/// A disk that fills while `meta.json` is written (here: a file-size limit, `ulimit -f`) leaves
/// no `meta.json.tmp` behind.
#[cfg(target_os = "linux")]
#[test]
fn meta_json_tmp_is_removed_when_the_disk_fills() {
    let dir = tmp("full");
    let out = dir.join("run");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f 2 && exec {} sweep --synthetic --dtypes fp16 \
             --batch-sizes 1 --seq-lens 16 --gen 2 --out {}",
            env!("CARGO_BIN_EXE_kvbench"),
            out.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(1), "{err}");
    assert!(err.contains("meta.json"), "{err}");
    assert!(!out.join("meta.json.tmp").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kvbench_home_error_is_printed_once_and_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .arg("fetch")
        .env("KVBENCH_HOME", "/proc/kvbench-home")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("KVBENCH_HOME"), "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");
}

/// `kvbench fetch` checks a cached model's sha256: a damaged copy is named and moved aside
/// (here the fetch again then fails, python3 being off the PATH).
#[test]
fn fetch_detects_a_damaged_cached_model() {
    let home = tmp("fetch");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let target = models.join(kvbench::model::fetch::FILE_NAME);
    std::fs::write(&target, b"GGUF not really").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .arg("fetch")
        .env("KVBENCH_HOME", &home)
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("damaged") && err.contains("sha256"), "{err}");
    assert!(!target.exists());
    assert!(models
        .join(format!("{}.damaged", kvbench::model::fetch::FILE_NAME))
        .exists());
    std::fs::remove_dir_all(&home).ok();
}

/// A model folder whose config.json cannot be read is named as unreadable, not as missing
/// (a symlink loop stands in for a permission error, which root, running CI, does not get).
#[test]
fn unreadable_model_folder_is_not_called_missing() {
    let dir = tmp("perm");
    std::os::unix::fs::symlink(dir.join("config.json"), dir.join("config.json")).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    let (code, _, err) = kvbench(&["sweep", "--model", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot read") && !err.contains("is missing"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A hub endpoint that accepts the connection and never answers: kvbench gives up after
/// KVBENCH_HUB_TIMEOUT seconds without a byte (here 2), exit 2, instead of hanging.
#[test]
fn hub_that_never_answers_times_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().take(16).flatten() {
            held.push(s); // accepted, never answered
        }
        std::thread::sleep(Duration::from_secs(120));
    });
    let home = tmp("hub");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["sweep", "--model", "some-org/some-model"])
        .env("HF_HOME", &home)
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("KVBENCH_HUB_TIMEOUT", "2")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            panic!("kvbench still waiting on a silent hub after 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("sent nothing for 2 s"), "{err}");
    std::fs::remove_dir_all(&home).ok();
}

// Issue 25: gate, merge, report

/// Runs kvbench with `args` and a deadline: (exit code, stdout, stderr). A run still going after
/// `secs` is killed and fails the test, so a hang is a failure, not a stuck CI job.
fn kvbench_within(args: &[&str], secs: u64) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(args)
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("SLURM_ARRAY_TASK_COUNT")
        .env_remove("JOB_COMPLETION_INDEX")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained while it runs, so a full pipe cannot stall it.
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).ok();
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(secs) {
            child.kill().ok();
            child.wait().ok();
            panic!("kvbench {} still running after {secs} s", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(!err.contains("panicked"), "{err}");
    (status.code().unwrap_or(-1), out, err)
}

/// A results file with a real 2-window ΔPPL interval: int4 at ±36.40 % (the CI suite's
/// 2-window int4 interval), fp16 pairing with itself.
const TWO_WINDOWS: &str = "scheme,batch_size,seq_len,ppl,ppl_delta_pct,delta_ppl_pct_lo,\
                           delta_ppl_pct_hi,ppl_windows\n\
                           fp16,1,64,21.374968,0.0,0.0,0.0,2\n\
                           int4,1,64,22.268494,4.18,-32.22,40.58,2\n";

fn gate_files(dir: &Path, base: &str, cur: &str) -> (PathBuf, PathBuf) {
    let (b, c) = (dir.join("base.csv"), dir.join("cur.csv"));
    std::fs::write(&b, base).unwrap();
    std::fs::write(&c, cur).unwrap();
    (b, c)
}

/// `--max-ppl-delta 0.0001%` on a 2-window result hung; `0.001%` answered. Both answer now,
/// passing (the files are equal: +0 %) and warning that more than the cap of 10⁶ windows would
/// be needed — by hand: per-window SD = 36.40·√2/12.706 = 4.051 %, so 0.001 % needs
/// m ≈ (1.96·4.051/0.001)² = 6.3·10⁷ windows and 0.0001 % 6.3·10⁹.
#[test]
fn gate_tiny_ppl_delta_answers_at_once() {
    let dir = tmp("gate-tiny");
    let (b, c) = gate_files(&dir, TWO_WINDOWS, TWO_WINDOWS);
    for limit in ["0.0001%", "0.001%", "1e-300"] {
        let (code, out, err) = kvbench_within(
            &[
                "gate",
                "--baseline",
                b.to_str().unwrap(),
                "--current",
                c.to_str().unwrap(),
                "--max-ppl-delta",
                limit,
            ],
            60,
        );
        assert_eq!(code, 0, "{limit}: {out}{err}");
        assert!(out.contains("All 2 points pass"), "{limit}: {out}");
        assert!(
            out.contains("warning: int4 b1 s64") && out.contains("more than 1000000 windows"),
            "{limit}: {out}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// An interval of ±1e300, or `ppl_windows` of 1e18, hung the same advice; both answer with a
/// "more than" warning, and a limit past its bound (10⁶ %, 10³ nats) is refused.
#[test]
fn gate_huge_interval_or_window_count_answers() {
    let dir = tmp("gate-huge");
    let base = "scheme,batch_size,seq_len,ppl\nint4,1,64,21.0\n";
    for (lo, hi, n) in [("-1e300", "1e300", "2"), ("-3.0", "3.0", "1e18")] {
        let cur = format!(
            "scheme,batch_size,seq_len,ppl,delta_ppl_pct_lo,delta_ppl_pct_hi,ppl_windows\n\
             int4,1,64,21.0,{lo},{hi},{n}\n"
        );
        let (b, c) = gate_files(&dir, base, &cur);
        let (code, out, err) = kvbench_within(
            &[
                "gate",
                "--baseline",
                b.to_str().unwrap(),
                "--current",
                c.to_str().unwrap(),
                "--max-ppl-delta",
                "1%",
            ],
            60,
        );
        assert_eq!(code, 0, "±{hi} over {n}: {out}{err}");
        assert!(out.contains("more than 1000000 windows"), "{out}");
    }
    for (flag, value) in [
        ("--max-ppl-delta", "1e7%"),
        ("--max-tpot-regression", "2000000"),
        ("--max-kl", "1e4"),
    ] {
        let (code, _, err) = kvbench(&["gate", "--baseline", "x", "--current", "y", flag, value]);
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(
            err.contains(value) && err.contains("checks nothing"),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Two synthetic runs have no perplexity or KL at all: `--max-ppl-delta` said "All points
/// pass". It is unusable input now (exit 2) naming both files, the column and `--ppl-windows`.
#[test]
fn gate_without_perplexity_in_either_file_is_unusable() {
    let dir = tmp("gate-noppl");
    let (a, b) = (dir.join("a"), dir.join("b"));
    for d in [&a, &b] {
        let (code, _, err) = synthetic(d, &[]);
        assert_eq!(code, 0, "{err}");
    }
    for (flag, value, col) in [
        ("--max-ppl-delta", "1%", "`ppl`"),
        ("--max-kl", "0.01", "`kl_mean`"),
    ] {
        let (code, out, err) = kvbench(&[
            "gate",
            "--baseline",
            a.to_str().unwrap(),
            "--current",
            b.to_str().unwrap(),
            flag,
            value,
        ]);
        assert_eq!(code, 2, "{flag}: {out}{err}");
        assert!(!out.contains("pass"), "{out}");
        assert!(
            err.contains(flag)
                && err.contains(col)
                && err.contains("neither")
                && err.contains(a.join("results.csv").to_str().unwrap())
                && err.contains(b.join("results.csv").to_str().unwrap())
                && err.contains("--ppl-windows"),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Shard `i` of 2 of a 4-point synthetic sweep (fp16 and int4 at 16 and 24 tokens) into `out`.
fn synthetic_shard(out: &Path, i: usize) -> (i32, String) {
    let shard = format!("{i}/2");
    let (code, _, err) = kvbench(&[
        "sweep",
        "--synthetic",
        "--dtypes",
        "fp16,int4",
        "--batch-sizes",
        "1",
        "--seq-lens",
        "16,24",
        "--gen",
        "2",
        "--shard",
        &shard,
        "--out",
        out.to_str().unwrap(),
    ]);
    (code, err)
}

/// `sweep --resume` on a partial merge ran the missing units as a sweep of its own and dropped
/// `merged_from` and `missing`. It is refused (exit 2) saying to resume the shards and merge
/// again, and the merged folder is left as it was.
#[test]
fn resume_of_a_partial_merge_is_refused() {
    let dir = tmp("resume-merged");
    let s0 = dir.join("shard-0");
    assert_eq!(synthetic_shard(&s0, 0).0, 0);
    let merged = dir.join("merged");
    let (code, _, err) = kvbench(&[
        "merge",
        s0.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
        "--allow-partial",
    ]);
    assert_eq!(code, 0, "{err}");
    let before = std::fs::read_to_string(merged.join("meta.json")).unwrap();
    let m: serde_json::Value = serde_json::from_str(&before).unwrap();
    assert_eq!(m["status"], "partial");
    let rows = csv_rows(&merged).len();
    let (code, _, err) = kvbench(&["sweep", "--resume", merged.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--resume")
            && err.contains("kvbench merge")
            && err.contains("shard 1/2 is missing")
            && err.contains(s0.to_str().unwrap()),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(merged.join("meta.json")).unwrap(),
        before
    );
    assert_eq!(csv_rows(&merged).len(), rows);
    std::fs::remove_dir_all(&dir).ok();
}

/// A shard whose meta.json has a future format was merged, the merged folder written, and the
/// error then named the output. Now it is refused first (exit 2), naming that shard's
/// meta.json, and no --out is created.
#[test]
fn merge_refuses_a_shard_with_a_future_format() {
    let dir = tmp("merge-future");
    let (s0, s1) = (dir.join("shard-0"), dir.join("shard-1"));
    assert_eq!(synthetic_shard(&s0, 0).0, 0);
    assert_eq!(synthetic_shard(&s1, 1).0, 0);
    let meta_path = s1.join("meta.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
    let future = kvbench::report::meta::META_FORMAT + 1;
    m["format"] = future.into();
    std::fs::write(&meta_path, m.to_string()).unwrap();
    let out = dir.join("merged");
    let (code, _, err) = kvbench(&[
        "merge",
        s0.to_str().unwrap(),
        s1.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(meta_path.to_str().unwrap()) && err.contains(&format!("format {future}")),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written");
    std::fs::remove_dir_all(&dir).ok();
}

/// `merge --out` silently overwrote an existing folder (sweep refuses). It is refused (exit 2)
/// naming --force, which moves the earlier folder aside; an --out that holds a shard is refused
/// even with --force (moving it would take the shard along).
#[test]
fn merge_refuses_existing_out() {
    let dir = tmp("merge-out");
    let (s0, s1) = (dir.join("shard-0"), dir.join("shard-1"));
    assert_eq!(synthetic_shard(&s0, 0).0, 0);
    assert_eq!(synthetic_shard(&s1, 1).0, 0);
    let out = dir.join("merged");
    let merge = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "merge",
            s0.to_str().unwrap(),
            s1.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        kvbench(&a)
    };
    let (code, _, err) = merge(&out, &[]);
    assert_eq!(code, 0, "{err}");
    let first = std::fs::read_to_string(out.join("meta.json")).unwrap();
    let (code, _, err) = merge(&out, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--out") && err.contains("--force"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("meta.json")).unwrap(),
        first,
        "the earlier merge is untouched"
    );
    let (code, _, err) = merge(&out, &["--force"]);
    assert_eq!(code, 0, "{err}");
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("merged.old-"))
        .collect();
    assert_eq!(aside.len(), 1, "the earlier merge moved aside");
    assert_eq!(
        std::fs::read_to_string(aside[0].path().join("meta.json")).unwrap(),
        first
    );
    assert_eq!(csv_rows(&out).len(), 4, "2 schemes × 2 lengths");
    let (code, _, err) = merge(&dir, &["--force"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds the shard"), "{err}");
    assert!(s0.join("meta.json").exists() && s1.join("meta.json").exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// `report A A` doubled every row. The same folder given twice (here once as `A/.`) is
/// reported once with a note: one synthetic point, one row.
#[test]
fn report_same_folder_twice_is_not_doubled() {
    let dir = tmp("report-twice");
    let a = dir.join("a");
    let (code, _, err) = synthetic(&a, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(csv_rows(&a).len(), 1);
    let out = dir.join("cmp");
    let again = a.join(".");
    let (code, _, err) = kvbench(&[
        "report",
        a.to_str().unwrap(),
        again.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("more than once"), "{err}");
    assert_eq!(csv_rows(&out).len(), 1);
    std::fs::remove_dir_all(&dir).ok();
}
