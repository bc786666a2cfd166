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

/// `kvbench sweep --model some-org/some-model` against a hub at 127.0.0.1:`port` with
/// KVBENCH_HUB_TIMEOUT=2 and `home` as HF_HOME (no proxy): (exit code, stderr). Fails the test
/// if it still runs after 60 s (`what` names the server in that message).
fn sweep_against_hub(port: u16, home: &Path, what: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["sweep", "--model", "some-org/some-model"])
        .env("HF_HOME", home)
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
            panic!("kvbench still fetching from {what} after 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.code(), err)
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

// Issue 25: serve as hardened as sweep. Each case reproduces one defect of the issue's list.

/// A small serve run's flags: 2 requests of 16 + 2 tokens, all at once, into `out`; a flag in
/// `extra` replaces its default here.
fn serve_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["serve", "--out", out];
    for (flag, value) in [
        ("--kv-budget", "4MiB"),
        ("--num-requests", "2"),
        ("--input-len", "16"),
        ("--output-len", "2"),
        ("--rate", "inf"),
    ] {
        if !extra.contains(&flag) {
            a.extend([flag, value]);
        }
    }
    a.extend_from_slice(extra);
    a
}

/// The same model with NaN logits (as `nan_logits_fail_the_point_…`): every serve point
/// fails, and a run in which every point failed exits 1, not 0.
#[test]
fn serve_every_point_failed_exits_1() {
    let dir = tmp("serve-nan");
    let mut g = default_gguf();
    let t = g
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap()
        .clone();
    let at = t.offset as usize;
    g.data[at..at + 2].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
    let p = dir.join("inf.gguf");
    g.write(&p);
    let out = dir.join("run");
    let (code, _, err) = kvbench(&serve_args(
        out.to_str().unwrap(),
        &["--model", p.to_str().unwrap(), "--schemes", "fp16"],
    ));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("every point failed"), "{err}");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["status"], "failed");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--schemes ''` names no scheme: exit 2, not a run that measures nothing and exits 0.
#[test]
fn serve_empty_schemes_is_a_usage_error() {
    let dir = tmp("serve-empty");
    let out = dir.join("run");
    let (code, _, err) = kvbench(&serve_args(out.to_str().unwrap(), &["--schemes", ""]));
    assert_eq!(code, 2, "{err}");
    // Named by its one spelling (`--schemes` is its alias, issue #21).
    assert!(
        err.contains("--dtypes") && err.contains("names no scheme"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Sizes past what any run can mean are refused before anything is allocated, naming the
/// flag (each once panicked, aborted on an allocation, or decoded without end).
#[test]
fn serve_unbounded_sizes_are_usage_errors() {
    let dir = tmp("serve-sizes");
    let out = dir.join("run");
    let o = out.to_str().unwrap();
    for (extra, flag) in [
        (vec!["--rate", "1e-30"], "--rate"),
        (vec!["--rate", "1e-12"], "--rate"),
        (vec!["--kv-budget", "1024TiB"], "--kv-budget"),
        (vec!["--num-requests", "100000000"], "--num-requests"),
        (
            vec!["--num-requests", "18446744073709551615"],
            "--num-requests",
        ),
        (vec!["--output-len", "18446744073709551606"], "--output-len"),
        (
            vec!["--input-len", "1..18446744073709551615"],
            "--input-len",
        ),
        (
            vec!["--shared-prefix", "18446744073709551615"],
            "--shared-prefix",
        ),
        (vec!["--block-size", "10408319138811813"], "--block-size"),
    ] {
        let mut extra = extra.clone();
        extra.extend(["--schemes", "fp16"]);
        let (code, _, err) = kvbench(&serve_args(o, &extra));
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(flag), "{extra:?}: {err}");
        assert!(!out.join("raw.jsonl").exists(), "{extra:?} wrote results");
    }
    // The output reaching past the model's context (8,192 tokens) is blamed on the lengths,
    // not on the KV budget.
    let (code, _, err) = kvbench(&serve_args(
        o,
        &["--schemes", "fp16", "--output-len", "9000"],
    ));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--output-len") && err.contains("context"),
        "{err}"
    );
    assert!(!err.contains("--kv-budget"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--rate inf,inf --schemes fp16,fp16` measures one point once, with a note, not two rows
/// with the same key.
#[test]
fn serve_duplicate_rates_and_schemes_run_once() {
    let dir = tmp("serve-dup");
    let out = dir.join("run");
    let (code, _, err) = kvbench(&serve_args(
        out.to_str().unwrap(),
        &["--schemes", "fp16,fp16", "--rate", "inf,inf"],
    ));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--dtypes lists fp16 more than once"), "{err}");
    assert!(err.contains("--rate lists"), "{err}");
    assert_eq!(csv_rows(&out).len(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 25's exact case: int8-channel keys keep up to 128 + 31 full-precision rows before a
/// group of 32 is quantized, so a 160-token request needs 15 blocks of 192,960 bytes at 159
/// tokens but 14 at its end (hand computation in `serve::pool`'s unit test). 2,701,440 bytes
/// hold exactly 14: the old check passed at the final length and the request then failed
/// mid-run with exit 0; now the run is refused up front (exit 2), naming --kv-budget.
#[test]
fn serve_int8_channel_budget_counts_the_residual_window() {
    let dir = tmp("serve-chan");
    let out = dir.join("run");
    let (code, _, err) = kvbench(&[
        "serve",
        "--schemes",
        "int8-channel",
        "--rate",
        "inf",
        "--num-requests",
        "1",
        "--input-len",
        "100",
        "--output-len",
        "60",
        "--kv-budget",
        "2701440",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--kv-budget"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Two serve runs started at once into one empty `--out`: one runs, the other is refused
/// (exit 2) before it writes a line, so raw.jsonl holds one run's rows only.
#[test]
fn serve_two_runs_into_one_out_one_is_refused() {
    let dir = tmp("serve-two");
    let out = dir.join("run");
    let o = out.to_str().unwrap();
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(serve_args(o, &["--schemes", "fp16"]))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let mut codes = [a.status.code(), b.status.code()];
    codes.sort();
    let errs = format!(
        "{}\n{}",
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    assert_eq!(codes, [Some(0), Some(2)], "{errs}");
    assert!(errs.contains("--out"), "{errs}");
    let raw = std::fs::read_to_string(out.join("raw.jsonl")).unwrap();
    assert_eq!(raw.matches("\"kind\":\"request\"").count(), 2, "{raw}");
    assert_eq!(raw.matches("\"kind\":\"point\"").count(), 1, "{raw}");
    assert!(
        !out.join(".kvbench.lock").exists(),
        "the lock outlived the run"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `serve --resume` after a kill -9 mid-write: the torn last line is dropped (its point runs
/// again), not an `EOF while parsing` error; flags beside `--resume` are refused, as are a
/// meta.json cut short (named) and one from a newer kvbench.
#[test]
fn serve_resume_survives_a_torn_line_and_refuses_what_it_cannot_keep() {
    let dir = tmp("serve-resume");
    let out = dir.join("run");
    let o = out.to_str().unwrap();
    let (code, _, err) = kvbench(&serve_args(o, &["--schemes", "fp16,int4"]));
    assert_eq!(code, 0, "{err}");
    let raw_path = out.join("raw.jsonl");
    let raw = std::fs::read_to_string(&raw_path).unwrap();
    // Cut the last line (int4's point) in the middle, as a kill -9 during its write would.
    let cut = raw.trim_end().len() - 40;
    std::fs::write(&raw_path, &raw[..cut]).unwrap();
    for (flags, named) in [
        (vec!["--schemes", "int8"], "--dtypes"),
        (vec!["--rate", "1"], "--rate"),
        (vec!["--num-requests", "9"], "--num-requests"),
        (vec!["--force"], "--force"),
    ] {
        let mut a = vec!["serve", "--resume", o];
        a.extend(flags.iter().copied());
        let (code, _, err) = kvbench(&a);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(
            err.contains(named) && err.contains("drop"),
            "{flags:?}: {err}"
        );
    }
    let (code, _, err) = kvbench(&["serve", "--resume", o]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("cut short"), "{err}");
    assert!(err.contains("1 points done, 1 to run"), "{err}");
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 2);
    let raw = std::fs::read_to_string(&raw_path).unwrap();
    for l in raw.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
    assert_eq!(raw.matches("\"kind\":\"point\"").count(), 2);
    let meta_path = out.join("meta.json");
    let meta = std::fs::read_to_string(&meta_path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(v["status"], "finished");
    assert_eq!(v["resumed_at"].as_array().unwrap().len(), 1);
    std::fs::write(&meta_path, &meta[..meta.len() / 2]).unwrap();
    let (code, _, err) = kvbench(&["serve", "--resume", o]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("meta.json") && err.contains("not valid JSON"),
        "{err}"
    );
    let mut future = v.clone();
    future["format"] = 99.into();
    std::fs::write(&meta_path, future.to_string()).unwrap();
    let (code, _, err) = kvbench(&["serve", "--resume", o]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("format 99"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A `--suite` that is a FIFO is refused at once (it blocked forever), and a serve suite
/// value of the wrong type is named by its key, not printed in Rust debug form.
#[test]
fn suite_fifo_and_wrong_typed_serve_values_are_refused() {
    let dir = tmp("suite-fifo");
    let fifo = dir.join("suite.toml");
    let ok = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(ok.success());
    let out = dir.join("run");
    for cmd in ["sweep", "serve"] {
        let (code, _, err) = kvbench(&[
            cmd,
            "--suite",
            fifo.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("not a regular file"), "{cmd}: {err}");
    }
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "input-len = true\n").unwrap();
    let (code, _, err) = kvbench(&[
        "serve",
        "--suite",
        bad.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`input-len`") && err.contains("boolean"),
        "{err}"
    );
    assert!(!err.contains("Boolean(true)"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `kvbench plan | head -1` and `kvbench rouge … | head -1`: a closed pipe ends the process
/// quietly (SIGPIPE), never a panic (exit 101, "failed printing to stdout").
#[test]
fn closed_pipe_ends_quietly() {
    let dir = tmp("pipe");
    let refs = dir.join("r.txt");
    std::fs::write(&refs, "the cat sat on the mat\n".repeat(5000)).unwrap();
    let out_dir = dir.join("plan");
    for args in [
        vec![
            "plan".to_string(),
            "--model".into(),
            "llama-3-8b".into(),
            "--memory".into(),
            "80GiB".into(),
            "--ctx".into(),
            "1k,2k,4k,8k,16k,32k,64k,128k".into(),
            "--dtypes".into(),
            "fp16,int8,int4,q8_0,q4_0,fp8".into(),
            "--out".into(),
            out_dir.to_str().unwrap().into(),
        ],
        vec![
            "rouge".to_string(),
            "--predictions".into(),
            refs.to_str().unwrap().into(),
            "--references".into(),
            refs.to_str().unwrap().into(),
            "--format".into(),
            "jsonl".into(),
        ],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one line, then close the pipe, as `head -1` does.
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 64];
        let _ = std::io::Read::read(&mut stdout, &mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{}: {err}", args[0]);
        assert_ne!(out.status.code(), Some(101), "{}: {err}", args[0]);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Ctrl-C during a sweep: exit 130 with one line saying where the results are and how to
/// resume, meta.json marked `interrupted` (not left `running`), the lock released; the
/// folder then resumes.
#[test]
fn ctrl_c_exits_130_and_marks_the_run_interrupted() {
    let dir = tmp("sigint");
    let out = dir.join("run");
    let child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "sweep",
            "--synthetic",
            "--dtypes",
            "fp16,int8,int4,q8_0,q4_0",
            "--batch-sizes",
            "1,2,4",
            "--seq-lens",
            "1024,2048,4096",
            "--gen",
            "64",
            "--repeats",
            "5",
            "--out",
            out.to_str().unwrap(),
        ])
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("SLURM_ARRAY_TASK_COUNT")
        .env_remove("JOB_COMPLETION_INDEX")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the run has written its meta.json, then interrupt it.
    let t = Instant::now();
    while !out.join("meta.json").exists() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no meta.json after 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let outp = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&outp.stderr);
    assert_eq!(outp.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted") && err.contains("--resume"),
        "{err}"
    );
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["status"], "interrupted", "{meta}");
    assert!(!out.join(".kvbench.lock").exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// A hub that sends one byte every half second never trips a "nothing received" timeout; the
/// stall rule (64 KiB per KVBENCH_HUB_TIMEOUT) ends it: exit 2 naming the bytes received.
#[test]
fn hub_that_trickles_bytes_times_out() {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().take(16).flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut l = String::new();
                    if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                        break;
                    }
                    head.push_str(&l.to_ascii_lowercase());
                }
                let mut s = s;
                if head.contains("range: bytes=0-0") {
                    let _ = s.write_all(
                        b"HTTP/1.1 206 Partial Content\r\netag: \"e1\"\r\nx-repo-commit: \
                          0123456789abcdef\r\ncontent-range: bytes 0-0/100000\r\n\
                          content-length: 1\r\n\r\nx",
                    );
                } else {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n");
                    for _ in 0..240 {
                        if s.write_all(b"x").is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
            });
        }
    });
    let home = tmp("hub-trickle");
    let (status, err) = sweep_against_hub(port, &home, "a trickling hub");
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("sent only") && err.contains("in 2 s"), "{err}");
    std::fs::remove_dir_all(&home).ok();
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

/// Without a terminal (as here: stderr is a pipe), a sweep prints plain progress lines, the
/// work weighted by its estimated cost (issue #26): a point costs its prompt tokens plus
/// (16 + batch) per decode step, per run, so at batch 1 with gen 2 the 16-token point is
/// 16 + 2·17 = 50 and the 32-token one 32 + 34 = 66: after the first, 50/116 = 43 %.
#[test]
fn sweep_without_a_terminal_prints_progress_lines() {
    let dir = tmp("progress");
    let (code, _, err) = synthetic(&dir.join("run"), &["--seq-lens", "16,32"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("progress: 0 % of the estimated work")
            && err.contains("progress: 43 % of the estimated work"),
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
    let (status, err) = sweep_against_hub(port, &home, "a silent hub");
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("sent nothing for 2 s"), "{err}");
    std::fs::remove_dir_all(&home).ok();
}

// Issue 25: slurm and shards

/// `kvbench slurm --dry-run --shards 2 --dtypes fp16` with `extra` (and an `--out` unless
/// given): (exit code, stdout, stderr).
fn slurm_dry_run(extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["slurm", "--dry-run", "--shards", "2", "--dtypes", "fp16"];
    if !extra.contains(&"--out") {
        args.extend_from_slice(&["--out", "/nonexistent/kvbench-slurm"]);
    }
    args.extend_from_slice(extra);
    kvbench(&args)
}

/// Defect 1: a newline in `--partition` (or any other value written into the batch scripts)
/// ended the `#SBATCH` line, and the next line ran as a command. Refused with exit 2, naming
/// the flag and the value escaped; nothing is printed.
#[test]
fn slurm_newline_in_partition_is_refused() {
    for (flag, value) in [
        ("--partition", "gpu\ntouch /tmp/x"),
        ("--account", "acct\ntouch /tmp/x"),
        ("--time", "1:00:00\ntouch /tmp/x"),
        ("--mem", "16G\rtouch /tmp/x"),
        ("--job-name", "kv\ntouch /tmp/x"),
        ("--sbatch-arg", "--qos=high\ntouch /tmp/x"),
        ("--out", "/nonexistent/a\ntouch /tmp/x"),
    ] {
        let (code, out, err) = slurm_dry_run(&[flag, value]);
        assert_eq!(code, 2, "{flag}: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
        assert!(err.contains(&format!("{value:?}")), "{flag}: {err}");
        assert!(!out.contains("touch"), "{flag}: {out}");
    }
}

/// Defect 1: `--sbatch-arg='-p gpu'` was written `#SBATCH --p gpu` and an empty one
/// `#SBATCH --`; it is written verbatim, and an empty one is refused.
#[test]
fn slurm_sbatch_arg_is_written_verbatim() {
    let (code, out, err) = slurm_dry_run(&["--sbatch-arg=-p gpu", "--sbatch-arg=--qos=high"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l == "#SBATCH -p gpu"), "{out}");
    assert!(out.lines().any(|l| l == "#SBATCH --qos=high"), "{out}");
    let (code, _, err) = slurm_dry_run(&["--sbatch-arg="]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--sbatch-arg"), "{err}");
}

/// Defect 1: values with spaces or `%` went unquoted into `#SBATCH` lines.
#[test]
fn slurm_values_with_spaces_and_percent_are_quoted_for_sbatch() {
    let (code, out, err) = kvbench(&[
        "slurm",
        "--dry-run",
        "--shards",
        "2",
        "--dtypes",
        "fp16",
        "--partition",
        "gpu a",
        "--out",
        "/nonexistent/run 50%",
    ]);
    assert_eq!(code, 0, "{err}");
    for line in [
        "#SBATCH --partition=\"gpu a\"",
        "#SBATCH --output=\"/nonexistent/run 50%%/slurm/shard-%a.log\"",
        "dir='/nonexistent/run 50%'/shard-\"$SLURM_ARRAY_TASK_ID\"",
    ] {
        assert!(out.lines().any(|l| l == line), "{line}\n{out}");
    }
}

/// Defect 4: `slurm --shards 10^12` aborted on a multi-TB allocation; more tasks than Slurm's
/// default MaxArraySize (1001) are refused, naming the flag and the bound.
#[test]
fn slurm_shards_10_pow_12_is_refused() {
    for n in ["1000000000000", "1002"] {
        let mut args = vec!["slurm", "--dry-run", "--dtypes", "fp16", "--shards", n];
        args.extend_from_slice(&["--out", "/nonexistent/kvbench-slurm"]);
        let (code, _, err) = kvbench(&args);
        assert_eq!(code, 2, "{n}: {err}");
        assert!(
            err.contains("--shards") && err.contains("give at most 1001"),
            "{n}: {err}"
        );
    }
}

/// Defect 4: `sweep --shard 0/10^12` (and `--shards 10^12`) aborted on a multi-TB allocation;
/// refused with exit 2 naming the flag and the largest count accepted (100000).
#[test]
fn sweep_shard_0_of_10_pow_12_is_refused() {
    let d = tmp("shard-huge");
    for (extra, flag) in [
        (["--shard", "0/1000000000000"], "--shard"),
        (["--shards", "1000000000000"], "--shards"),
    ] {
        let (code, _, err) = synthetic(&d.join("out"), &extra);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("give at most 100000"),
            "{err}"
        );
    }
}

/// Defect 7: `slurm` accepted settings every task's sweep refuses; it checks them as the sweep
/// does, before writing or submitting anything (exit 2, the folder not created).
#[test]
fn slurm_refuses_what_every_task_would_refuse_before_writing() {
    let d = tmp("slurm-check");
    for (extra, flag) in [
        (&["--ppl-noise-floor", "1"][..], "--ppl-noise-floor"),
        (&["--cpus-per-task", "0"][..], "--cpus-per-task"),
        (&["--gen", "1"][..], "--gen"),
        (&["--threads", "0"][..], "--threads"),
    ] {
        let out = d.join("job");
        let mut args = vec!["slurm", "--shards", "2", "--dtypes", "fp16"];
        args.extend_from_slice(&["--out", out.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let (code, _, err) = kvbench(&args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(flag), "{extra:?}: {err}");
        assert!(!out.exists(), "{extra:?}: {} was written", out.display());
    }
}

/// Defect 10: `--shards 0` suggested `--shard I/0`.
#[test]
fn shards_0_does_not_suggest_shard_i_of_0() {
    let d = tmp("shards-0");
    let (code, _, err) = synthetic(&d.join("out"), &["--shards", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--shards") && !err.contains("I/0"), "{err}");
    let (code, _, err) = kvbench(&["slurm", "--dry-run", "--dtypes", "fp16", "--shards", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--shards") && !err.contains("I/0"), "{err}");
}

// Issue 25: scheme names

/// A synthetic sweep of `dtypes` into `out`: (exit code, stderr).
fn synthetic_with(out: &Path, dtypes: &str) -> (i32, String) {
    let (code, _, err) = kvbench(&[
        "sweep",
        "--synthetic",
        "--dtypes",
        dtypes,
        "--batch-sizes",
        "1",
        "--seq-lens",
        "16",
        "--gen",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    (code, err)
}

/// The schemes meta.json records (`settings.dtypes`).
fn recorded_dtypes(out: &Path) -> Vec<String> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    meta["settings"]["dtypes"]
        .as_array()
        .unwrap_or_else(|| panic!("settings.dtypes: {meta}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Eviction-over-store schemes (the README's `window:size=…@int8` form) measured every point,
/// then exited 2: meta.json's printed name `window:size=16,sinks=4@int8-token` was split at its
/// comma when read back, so no summary.md, and `report` and `--resume` refused the folder. The
/// printed names are also accepted by `--dtypes` as they are.
#[test]
fn eviction_over_store_sweep_reads_back() {
    let dir = tmp("evict-names");
    let out = dir.join("run");
    let (code, err) = synthetic_with(&out, "window:size=16@int8,h2o@int8,h2o:ratio=0.2@q4_0");
    assert_eq!(code, 0, "{err}");
    assert!(out.join("summary.md").is_file(), "no summary.md: {err}");
    let printed = recorded_dtypes(&out);
    assert_eq!(
        printed,
        [
            "window:size=16,sinks=4@int8-token",
            "h2o:ratio=0.2,recent=32@int8-token",
            "h2o:ratio=0.2,recent=32@q4_0"
        ]
    );
    let (code, _, err) = kvbench(&["report", out.to_str().unwrap()]);
    assert_eq!(code, 0, "report: {err}");
    let (code, _, err) = kvbench(&["sweep", "--resume", out.to_str().unwrap()]);
    assert_eq!(code, 0, "--resume: {err}");
    // The printed form, comma-joined, is a valid `--dtypes` naming the same schemes.
    let again = dir.join("again");
    let (code, err) = synthetic_with(&again, &printed.join(","));
    assert_eq!(code, 0, "{err}");
    assert_eq!(recorded_dtypes(&again), printed);
    let (code, err) = synthetic_with(&dir.join("two"), "window:size=16,sinks=2@int8");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        recorded_dtypes(&dir.join("two")),
        ["window:size=16,sinks=2@int8-token"]
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A parameter given twice used to let the last one win; `--dtypes` refuses it naming it
/// (exit 2).
#[test]
fn repeated_scheme_parameter_is_refused_on_the_command_line() {
    let dir = tmp("dup-param");
    for (dtypes, want) in [
        (
            "int4:group=32,group=64",
            "parameter `group` of `int4` is given twice",
        ),
        ("fp16,h2o:budget=64,ratio=0.2@int8", "not both"),
    ] {
        let (code, err) = synthetic_with(&dir.join("run"), dtypes);
        assert_eq!(code, 2, "{dtypes}: {err}");
        assert!(err.contains(want), "{dtypes}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
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

// Issue 25: cases found by this round's own hostile-input pass (~600 cases over every
// subcommand; the closing note has the table).

/// stdout on a full disk (`> /dev/full`): exit 1 naming standard output, not a panic (101).
#[test]
fn stdout_on_a_full_disk_is_an_error_not_a_panic() {
    let dir = tmp("devfull");
    let out = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "plan",
            "--model",
            "llama-3-8b",
            "--memory",
            "80GiB",
            "--out",
            dir.join("plan").to_str().unwrap(),
        ])
        .stdout(out)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A non-UTF-8 `--out` (bytes 0xff): the run records its command line lossily instead of
/// panicking in `std::env::args`.
#[test]
fn non_utf8_argument_does_not_panic() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tmp("nonutf8");
    let mut name = dir.as_os_str().as_bytes().to_vec();
    name.extend_from_slice(b"/o\xff");
    let out = std::ffi::OsStr::from_bytes(&name);
    let o = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "sweep",
            "--synthetic",
            "--dtypes",
            "fp16",
            "--batch-sizes",
            "1",
        ])
        .args(["--seq-lens", "16", "--gen", "2", "--out"])
        .arg(out)
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("SLURM_ARRAY_TASK_COUNT")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--min-time nan` on a synthetic sweep was written to meta.json as null and the folder could
/// not be read back; it is refused up front, like `--min-time 1e308` (days of repeats).
#[test]
fn synthetic_min_time_nan_or_huge_is_refused() {
    let dir = tmp("mintime");
    for v in ["nan", "inf", "1e308"] {
        let (code, _, err) = synthetic(&dir.join("run"), &["--min-time", v]);
        assert_eq!(code, 2, "{v}: {err}");
        assert!(err.contains("--min-time"), "{v}: {err}");
        assert!(!dir.join("run").join("meta.json").exists(), "{v}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A FIFO where `report`, `sweep --resume`, `gate` or `rouge` expects a file is refused at
/// once (each hung until killed).
#[test]
fn fifo_inputs_are_refused_not_waited_on() {
    let dir = tmp("fifos");
    let run = dir.join("run");
    let (code, _, err) = synthetic(&run, &[]);
    assert_eq!(code, 0, "{err}");
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let meta = run.join("meta.json");
    std::fs::remove_file(&meta).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&meta)
        .status()
        .unwrap()
        .success());
    let (r, f) = (run.to_str().unwrap(), fifo.to_str().unwrap());
    let refs = dir.join("refs.txt");
    std::fs::write(&refs, "a b c\n").unwrap();
    for args in [
        vec!["report", r],
        vec!["sweep", "--resume", r],
        vec![
            "gate",
            "--baseline",
            f,
            "--current",
            f,
            "--max-ppl-delta",
            "1%",
        ],
        vec![
            "rouge",
            "--predictions",
            f,
            "--references",
            refs.to_str().unwrap(),
        ],
    ] {
        let (code, _, err) = kvbench_within(&args, 30);
        assert!(code == 1 || code == 2, "{args:?}: {code} {err}");
        assert!(err.contains("not a regular file"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `plan` with sizes that overflowed and printed wrapped numbers with exit 0: a context of
/// 2^64 − 1 tokens (or `…k`), 2^64 − 1 GPUs; and an `--out` that cannot be created is a usage
/// error naming the folder.
#[test]
fn plan_overflowing_sizes_are_refused() {
    let base = ["plan", "--model", "llama-3-8b", "--memory", "80GiB"];
    for (extra, flag) in [
        (vec!["--seq-lens", "18446744073709551615"], "--seq-lens"),
        (vec!["--seq-lens", "18446744073709551615k"], "--seq-lens"),
        (vec!["--gpus", "18446744073709551615"], "--gpus"),
        (vec!["--out", "/proc/self/kvbench-plan"], "--out"),
    ] {
        let mut a = base.to_vec();
        a.extend(extra.iter().copied());
        let (code, _, err) = kvbench(&a);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(flag), "{extra:?}: {err}");
    }
}

/// A raw.jsonl concatenated with itself: `report` keeps each point once (with a warning)
/// instead of writing every row twice, which `gate` would then refuse.
#[test]
fn report_keeps_a_point_recorded_twice_once() {
    let dir = tmp("dup-raw");
    let run = dir.join("run");
    let (code, _, err) = synthetic(&run, &[]);
    assert_eq!(code, 0, "{err}");
    let raw = std::fs::read_to_string(run.join("raw.jsonl")).unwrap();
    std::fs::write(run.join("raw.jsonl"), format!("{raw}{raw}")).unwrap();
    let (code, _, err) = kvbench(&["report", run.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("recorded more than once"), "{err}");
    assert_eq!(csv_rows(&run).len(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// meta.json's `format` edited to a string, and a sweep folder edited to claim it is a serve
/// folder: each refused naming the file (the message said "format 0 … cannot be read by" the
/// same version). `report` reads serve folders since issue #21.
#[test]
fn odd_meta_format_and_serve_folders_are_named() {
    let dir = tmp("meta-format");
    let run = dir.join("run");
    let (code, _, err) = synthetic(&run, &[]);
    assert_eq!(code, 0, "{err}");
    let p = run.join("meta.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["format"] = "1".into();
    std::fs::write(&p, v.to_string()).unwrap();
    let (code, _, err) = kvbench(&["report", run.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a format number"), "{err}");
    v["format"] = 2.into();
    v["kind"] = "serve".into();
    std::fs::write(&p, v.to_string()).unwrap();
    let (code, _, err) = kvbench(&["report", run.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("meta.json"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A finished synthetic sweep records `status: finished` and `finished_at` in meta.json, as a
/// model sweep does (it recorded neither).
#[test]
fn synthetic_sweep_records_its_status() {
    let dir = tmp("syn-status");
    let run = dir.join("run");
    let (code, _, err) = synthetic(&run, &[]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("meta.json")).unwrap()).unwrap();
    assert_eq!(v["status"], "finished", "{v}");
    assert!(
        v["finished_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{v}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
