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

/// A scheme context at or below the short one leaves no K/V difference to fit: refused before
/// any model loads, naming both flags and the values given.
#[test]
fn calibrate_refuses_a_long_context_not_above_the_short_one() {
    let (code, _, err) = kvbench(&["calibrate", "--long-ctx", "20", "--scheme-batch", "8"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--long-ctx")
            && err.contains("--scheme-batch")
            && err.contains("got 8 and 20"),
        "{err}"
    );
}

/// The serving trace's lengths take one length or a range; an XSum trace (which needs the
/// pairs' lengths), a client count of 0: refused before any model loads, naming the flag.
#[test]
fn calibrate_refuses_a_trace_it_cannot_run() {
    for (args, flag) in [
        (["--trace-input-len", "xsum:32..64"], "--trace-input-len"),
        (["--trace-output-len", "xsum:8..64"], "--trace-output-len"),
        (["--trace-clients", "0,4"], "--trace-clients"),
    ] {
        let mut a = vec!["calibrate"];
        a.extend(args);
        let (code, _, err) = kvbench(&a);
        assert_eq!(code, 2, "{flag}: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
    }
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

/// Issue 26: `kvbench completions bash` prints a bash script naming subcommands and flags;
/// an unknown shell is a usage error (exit 2) listing the shells.
#[test]
fn completions_print_a_script_per_shell() {
    // Each script names subcommands and flags the CLI has, in its shell's spelling (bash and
    // zsh `--dtypes`, fish `-l dtypes`), with its shell's marker.
    for (shell, marker, long) in [
        ("bash", "complete -F _kvbench", "--"),
        ("zsh", "#compdef kvbench", "--"),
        ("fish", "complete -c kvbench", "-l "),
    ] {
        let (code, out, err) = kvbench(&["completions", shell]);
        assert_eq!(code, 0, "{err}");
        let (dtypes, suite) = (format!("{long}dtypes"), format!("{long}suite"));
        for want in [marker, "sweep", "serve", "attn-bench", &dtypes, &suite] {
            assert!(out.contains(want), "{shell} script lacks `{want}`");
        }
    }
    let (code, _, err) = kvbench(&["completions", "powershell"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("bash") && err.contains("zsh") && err.contains("fish"),
        "{err}"
    );
}

/// Issue 26: `attn-bench --out DIR --format json` writes DIR/results.csv and prints a JSON
/// array of the same rows: every cell of the CSV equals the JSON's value (numbers compared as
/// numbers, an empty cell as null). Pinned independently: SmolLM2-135M's geometry (30 layers,
/// 3 kv heads, head_dim 64) and fp16's 1,681,920 bytes per median step at context 64 with 2
/// steps (worked out in `attn_bench_prints_floors_per_context_and_percent_of_peak`).
#[test]
fn attn_bench_out_csv_carries_the_json_values() {
    let dir = std::env::temp_dir().join(format!("kvbench-attn26-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out_dir = dir.to_string_lossy().into_owned();
    let run = || {
        kvbench(&[
            "attn-bench",
            "--dtypes",
            "fp16,int8",
            "--seq-len",
            "64",
            "--steps",
            "2",
            "--peak-bandwidth",
            "10",
            "--out",
            &out_dir,
            "--format",
            "json",
        ])
    };
    let (code, out, err) = run();
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("stdout is one JSON document");
    let rows = json.as_array().expect("a JSON array");
    assert_eq!(rows.len(), 2, "{out}");
    let mut csv = csv::Reader::from_path(dir.join("results.csv")).unwrap();
    let header = csv.headers().unwrap().clone();
    let records: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), rows.len());
    for (rec, row) in records.iter().zip(rows) {
        let obj = row.as_object().unwrap();
        assert_eq!(obj.len(), header.len(), "the same columns in both");
        for (col, cell) in header.iter().zip(rec.iter()) {
            let v = &obj[col];
            match v {
                serde_json::Value::Null => assert_eq!(cell, "", "{col}"),
                serde_json::Value::String(s) => assert_eq!(cell, s, "{col}"),
                serde_json::Value::Number(n) => {
                    // The same digits in both files; serde_json's default (fast) float parser
                    // may land 1 ulp off when reading them back, so the parsed values are
                    // compared to a few ulp and the text exactly.
                    let (c, j) = (cell.parse::<f64>().unwrap(), n.as_f64().unwrap());
                    assert!(
                        (c - j).abs() <= 4.0 * f64::EPSILON * c.abs(),
                        "{col}: {c} vs {j}"
                    );
                    assert!(out.contains(&format!("\"{col}\": {cell}")), "{col}: {cell}");
                }
                other => panic!("{col}: unexpected {other}"),
            }
        }
    }
    let fp16 = &rows[0];
    assert_eq!(fp16["scheme"], "fp16");
    assert_eq!(fp16["seq_len"], 64);
    assert_eq!(fp16["steps"], 2);
    assert_eq!(fp16["layers"], 30);
    assert_eq!(fp16["kv_heads"], 3);
    assert_eq!(fp16["head_dim"], 64);
    assert_eq!(fp16["bytes_per_step"], 1_681_920);
    assert_eq!(fp16["peak_gb_s"], 10.0);
    let pct = fp16["pct_of_peak"].as_f64().unwrap();
    let gb_s = fp16["gb_s"].as_f64().unwrap();
    assert!(
        (pct - 10.0 * gb_s).abs() < 1e-9 * pct.max(1.0),
        "{pct} vs {gb_s}"
    );
    assert_eq!(rows[1]["scheme"], "int8-token"); // `int8` prints as its full name
    assert_eq!(rows[1]["error"], "");
    // A second run into the same folder is refused rather than overwriting it.
    let (code, _, err) = run();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("results.csv already exists"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 26: `--suite ci` is a built-in suite, found from a folder without `suites/` (the
/// binary run in an empty temporary folder); `kvbench slurm --dry-run` applies the suite as a
/// sweep would and writes nothing. An unknown name is a usage error naming the built-ins and
/// the nearest one.
#[test]
fn builtin_suite_resolves_outside_the_repository() {
    let dir = std::env::temp_dir().join(format!("kvbench-suite26-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(args)
            .current_dir(&dir)
            .env_remove("SLURM_ARRAY_TASK_ID")
            .env_remove("SLURM_ARRAY_TASK_COUNT")
            .env_remove("JOB_COMPLETION_INDEX")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&["slurm", "--dry-run", "--shards", "2", "--suite", "ci"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--suite ci"), "{out}");
    let (code, _, err) = run(&["slurm", "--dry-run", "--shards", "2", "--suite", "qiuck"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("did you mean `quick`?"), "{err}");
    assert!(
        err.contains("quick, ci, capacity, quality, long-context, serve, serve-decode"),
        "{err}"
    );
    let (code, _, err) = run(&["sweep", "--suite", "serve"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("kvbench serve --suite serve"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #26: each built-in suite parses as its command's settings: sweep suites as `SweepSettings`, serve
/// suites as `ServeSettings` (so `command` is right).
#[test]
fn builtins_parse_as_their_commands_settings() {
    use kvbench::measure::settings::{suite_table, Settings, SweepSettings};
    use kvbench::measure::suites::{resolve, BUILTIN};
    use kvbench::serve::settings::ServeSettings;
    use std::path::Path;
    for s in BUILTIN {
        let (text, source) = resolve(Path::new(s.name), s.command).unwrap();
        assert_eq!(text, s.text);
        assert_eq!(source, format!("suites/{}.toml (built in)", s.name));
        let table = suite_table(&text, Path::new(&source)).unwrap();
        let ok = match s.command {
            "sweep" => SweepSettings::defaults()
                .overlay(&table, &source, |_| false)
                .map(|_| ()),
            "serve" => ServeSettings::defaults()
                .overlay(&table, &source, |_| false)
                .map(|_| ()),
            other => panic!("unknown command {other}"),
        };
        ok.unwrap_or_else(|e| panic!("{}: {e}", s.name));
    }
}

/// Issue #22 item 5: `kvbench plan --model gemma-3-27b --seq-lens 128k` counts KV per layer
/// type. By hand (config.json: 10 global and 52 window layers of 16 KV heads × 128, window
/// 1024): (10 · 131,072 + 52 · 1024) · 2 · 16 · 128 · 2 = 11,173,625,856 bytes of K and V per
/// fp16 sequence plus the window layers' positions 52 · 1024 · 16 · 4 = 3,407,872 (kvbench's
/// cache keeps one per token there): 11,177,033,728, against 62 · 131,072 · 8192 =
/// 66,571,993,088 counted all-global; the row is within 1 % of the formula (exact here: whole
/// blocks, the window ends on a block edge).
#[test]
fn plan_gemma3_27b_counts_window_layers() {
    let dir = std::env::temp_dir().join(format!("kvbench-plan-g3-{}", std::process::id()));
    let (code, out, err) = kvbench(&[
        "plan",
        "--model",
        "gemma-3-27b",
        "--seq-lens",
        "128k",
        "--dtypes",
        "fp16",
        "--format",
        "json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = &v["plans"][0]["rows"][0];
    let want = 11_177_033_728.0;
    let got = row["kv_bytes_per_seq"].as_f64().unwrap();
    assert!((got - want).abs() <= 0.01 * want, "{got}");
    assert_eq!(row["kv_bytes_all_global"].as_u64(), Some(66_571_993_088));
    assert_eq!(row["kv_bytes_global_layers"].as_u64(), Some(10_737_418_240));
    assert_eq!(row["kv_bytes_window_layers"].as_u64(), Some(439_615_488));
}
