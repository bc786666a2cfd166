//! Suites, resume and re-rendering through the binary on the default model (tiny points, no
//! perplexity, so each run takes seconds).

use std::path::{Path, PathBuf};

mod common;
use common::kvbench;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

const TINY: &str = r#"
description = "test: two schemes, two lengths, no perplexity"
dtypes = ["fp16", "int8-token"]
batch-sizes = [1]
seq-lens = [16, 24]
gen = 3
repeats = 2
warmup = 0
ppl-windows = 0
"#;

fn csv_points(dir: &Path) -> Vec<(String, String)> {
    let mut r = csv::Reader::from_path(dir.join("results.csv")).unwrap();
    let h = r.headers().unwrap().clone();
    let (s, l) = (
        h.iter().position(|c| c == "scheme").unwrap(),
        h.iter().position(|c| c == "seq_len").unwrap(),
    );
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            (rec[s].to_string(), rec[l].to_string())
        })
        .collect()
}

#[test]
fn suite_with_unknown_key_names_key_and_file() {
    kvbench::model::fetch::ensure_default_model().unwrap();
    let d = tmp("suite-bad");
    let f = d.join("typo.toml");
    std::fs::write(&f, "gen = 4\nseq-len = [64]\n").unwrap();
    let (code, _, err) = kvbench(&["sweep", "--suite", f.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("seq-len") && err.contains("typo.toml"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).ok();
}

/// A suite's values apply, a flag on the command line wins, and an interrupted run (points
/// missing, the last line cut short) resumes without losing or duplicating a point; `report`
/// re-renders the same results.csv from raw data.
#[test]
fn suite_resume_and_report() {
    kvbench::model::fetch::ensure_default_model().unwrap();
    let d = tmp("resume");
    let suite = d.join("tiny.toml");
    std::fs::write(&suite, TINY).unwrap();
    let full = d.join("full");
    let (code, _, err) = kvbench(&[
        "sweep",
        "--suite",
        suite.to_str().unwrap(),
        "--gen",
        "4",
        "--out",
        full.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(full.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["settings"]["gen"], 4, "the flag overrides the suite");
    assert_eq!(meta["settings"]["repeats"], 2, "the suite's value applies");
    let points = csv_points(&full);
    assert_eq!(points.len(), 4);
    for f in [
        "raw.jsonl",
        "summary.md",
        "plots/tpot_vs_seq_len.png",
        "plots/kv_memory_vs_tokens.svg",
    ] {
        assert!(full.join(f).metadata().unwrap().len() > 0, "{f}");
    }
    let raw = std::fs::read_to_string(full.join("raw.jsonl")).unwrap();
    let lines: Vec<&str> = raw.lines().collect();
    assert_eq!(lines.len(), 4);
    let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(
        first["timing"]["ttft_ms"].as_array().unwrap().len(),
        2,
        "2 repeats"
    );
    assert_eq!(
        first["timing"]["itl_ms"][0].as_array().unwrap().len(),
        3,
        "gen 4 → 3 ITLs"
    );

    // An interrupted copy: two finished points (the first doctored, so a re-run would show) and
    // half of a third line.
    let cut = d.join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    std::fs::copy(full.join("meta.json"), cut.join("meta.json")).unwrap();
    let doctored = lines[0]
        .replacen("\"ttft_ms\":[", "\"ttft_ms\":[12345.5,", 1)
        .replacen("\"itl_ms\":[", "\"itl_ms\":[[1.0,1.0,1.0],", 1);
    std::fs::write(
        cut.join("raw.jsonl"),
        format!(
            "{doctored}\n{}\n{}",
            lines[1],
            &lines[2][..lines[2].len() / 2]
        ),
    )
    .unwrap();
    let (code, _, err) = kvbench(&["sweep", "--resume", cut.to_str().unwrap(), "--gen", "5"]);
    assert_eq!(code, 2, "changing settings on resume is refused: {err}");
    assert!(err.contains("--gen"), "{err}");
    let (code, _, err) = kvbench(&["sweep", "--resume", cut.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let mut got = csv_points(&cut);
    let mut want = points.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every point exactly once");
    // The doctored point's TTFT samples are 12345.5 ms and two real ones (~0.1 s): a mean
    // above 4 s is only possible if it was kept, not re-run.
    let (h, rows) = csv_table(&cut.join("results.csv"));
    let mean = h.iter().position(|c| c == "ttft_ms_mean").unwrap();
    assert!(
        rows.iter()
            .any(|r| r[mean].parse::<f64>().unwrap() > 4000.0),
        "the finished point was kept, not re-run: {rows:?}"
    );
    assert_eq!(
        std::fs::read_to_string(cut.join("raw.jsonl"))
            .unwrap()
            .lines()
            .count(),
        4
    );

    // --rerun-contended: two finished points doctored to 12345.5 ms TTFT samples, the first
    // marked as timed while other processes used 1.9 cores, the second on an idle machine
    // (0.0). Resumed with the flag, the first is measured again (its doctored mean is gone)
    // and the second kept as it was; every point still once.
    let busy = d.join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::copy(full.join("meta.json"), busy.join("meta.json")).unwrap();
    let doctor = |line: &str, other_cores: f64| {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        let t = &mut v["timing"];
        t["ttft_ms"] = serde_json::json!([12345.5, 12345.5]);
        t["contention"] =
            serde_json::json!({"other_cores": other_cores, "load_1m": 0.0, "span_s": 1.0});
        v.to_string()
    };
    std::fs::write(
        busy.join("raw.jsonl"),
        format!(
            "{}\n{}\n{}\n{}\n",
            doctor(lines[0], 1.9),
            doctor(lines[1], 0.0),
            lines[2],
            lines[3]
        ),
    )
    .unwrap();
    let (code, _, err) = kvbench(&[
        "sweep",
        "--rerun-contended",
        "--out",
        busy.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "--rerun-contended needs --resume: {err}");
    assert!(err.contains("--resume"), "{err}");
    let (code, _, err) = kvbench(&[
        "sweep",
        "--resume",
        busy.to_str().unwrap(),
        "--rerun-contended",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--rerun-contended: "), "{err}");
    let (h, rows) = csv_table(&busy.join("results.csv"));
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    let key = |i: usize| {
        let v: serde_json::Value = serde_json::from_str(lines[i]).unwrap();
        (
            v["scheme"].as_str().unwrap().to_string(),
            v["seq_len"].to_string(),
        )
    };
    let ttft = |k: &(String, String)| {
        let r: Vec<&Vec<String>> = rows
            .iter()
            .filter(|r| (r[col("scheme")].clone(), r[col("seq_len")].clone()) == *k)
            .collect();
        assert_eq!(r.len(), 1, "{k:?} once: {rows:?}");
        r[0][col("ttft_ms_mean")].parse::<f64>().unwrap()
    };
    assert!(
        ttft(&key(0)) < 4000.0,
        "the contended point was measured again"
    );
    assert_eq!(ttft(&key(1)), 12345.5, "the idle point was kept");
    assert_eq!(rows.len(), 4);

    // Re-rendering from raw data reproduces the CSV the sweep wrote.
    let before = std::fs::read_to_string(full.join("results.csv")).unwrap();
    std::fs::remove_file(full.join("results.csv")).unwrap();
    std::fs::remove_dir_all(full.join("plots")).unwrap();
    let (code, _, err) = kvbench(&["report", full.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(full.join("results.csv")).unwrap(),
        before
    );
    assert!(full.join("plots/decode_tps_vs_batch.png").exists());

    // Side by side: one table per run, legends per run and scheme.
    let both = d.join("both");
    let (code, _, err) = kvbench(&[
        "report",
        full.to_str().unwrap(),
        cut.to_str().unwrap(),
        "--out",
        both.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(csv_points(&both).len(), 8);
    let md = std::fs::read_to_string(both.join("summary.md")).unwrap();
    assert!(md.contains("full") && md.contains("cut"), "{md}");
    std::fs::remove_dir_all(&d).ok();
}

/// `kvbench gate` on the committed CI baseline: equal results pass (exit 0), a doctored file
/// whose int4 perplexity is 5 % worse fails (exit 3, the row marked), a file without the
/// perplexity column is unusable (exit 2, the column named).
#[test]
fn gate_exit_codes() {
    let base = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/suites/baselines/ci-smollm2-135m.csv"
    );
    let d = tmp("gate");
    let gate = |cur: &Path| {
        kvbench(&[
            "gate",
            "--baseline",
            base,
            "--current",
            cur.to_str().unwrap(),
            "--max-ppl-delta",
            "1%",
            "--max-kl",
            "0.01",
        ])
    };
    let (code, out, err) = gate(Path::new(base));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("All 9 points pass"), "{out}");

    let mut r = csv::Reader::from_path(base).unwrap();
    let header = r.headers().unwrap().clone();
    let ppl = header.iter().position(|c| c == "ppl").unwrap();
    let scheme = header.iter().position(|c| c == "scheme").unwrap();
    let mut w = csv::Writer::from_path(d.join("worse.csv")).unwrap();
    w.write_record(&header).unwrap();
    for rec in r.records() {
        let rec = rec.unwrap();
        let mut v: Vec<String> = rec.iter().map(str::to_string).collect();
        if v[scheme] == "int4" {
            v[ppl] = (v[ppl].parse::<f64>().unwrap() * 1.05).to_string();
        }
        w.write_record(&v).unwrap();
    }
    w.flush().unwrap();
    let (code, out, err) = gate(&d.join("worse.csv"));
    assert_eq!(code, 3, "{out}{err}");
    let fail_line = out.lines().find(|l| l.contains("FAIL")).unwrap();
    assert!(fail_line.starts_with("| int4 |"), "{out}");
    assert_eq!(out.matches("FAIL").count(), 1, "{out}");

    std::fs::write(
        d.join("bad.csv"),
        "scheme,batch_size,seq_len,kl_mean\nint4,1,64,0.06\n",
    )
    .unwrap();
    let (code, _, err) = gate(&d.join("bad.csv"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ppl") && err.contains("bad.csv"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

/// Copies a committed fixture folder to a fresh temporary one.
fn fixture_copy(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let dst = tmp(name);
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    dst
}

fn csv_table(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(path).unwrap();
    let h = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r
        .records()
        .map(|x| x.unwrap().iter().map(String::from).collect())
        .collect();
    (h, rows)
}

/// Issue #12: run folders written before quality had its own record (kvbench 0.1.0 at
/// 084d7a437093: quality repeated on every point of raw.jsonl plus quality.jsonl; synthetic
/// runs with `ppl: null` on every point) still re-render with `kvbench report`, to the
/// results.csv that version wrote itself (committed next to them) — except the ITL p95/p99,
/// whose percentile estimator changed (now type 7, checked by hand below).
#[test]
fn old_run_folders_rerender_as_written() {
    for name in ["run-v0-model", "run-v0-synth"] {
        let dir = fixture_copy(name);
        let (h, want) = csv_table(&dir.join("results.csv"));
        std::fs::remove_file(dir.join("results.csv")).unwrap();
        let (code, _, err) = kvbench(&["report", dir.to_str().unwrap()]);
        assert_eq!(code, 0, "{name}: {err}");
        let (h2, got) = csv_table(&dir.join("results.csv"));
        // Issue #15 added the paired-statistics columns; the old ones keep their order and
        // the new ones are empty for a folder that predates them.
        let added = [
            "ppl_se",
            "delta_ppl_pct",
            "delta_ppl_pct_lo",
            "delta_ppl_pct_hi",
            "delta_ppl",
            "delta_ppl_lo",
            "delta_ppl_hi",
            "ci_method",
            "ci_unit",
            "kl_p99_9",
            "kl_max",
            "kl_se",
            "same_top_p_se",
            "noise_floor_runs",
            "noise_floor_sd",
            "noise_floor_spread_pct",
            // Issue #22: the bandwidth floor measured in the run (empty for older folders).
            "tpot_vs_floor",
            // Issue #24: attention alone per point (empty for older folders).
            "attn_step_ms",
            "attn_gb_s",
            "attn_bw_frac",
        ];
        let old_cols: Vec<&String> = h2.iter().filter(|c| !added.contains(&c.as_str())).collect();
        assert_eq!(
            old_cols,
            h.iter().collect::<Vec<_>>(),
            "{name}: the CSV header"
        );
        assert_eq!(got.len(), want.len(), "{name}");
        let changed = ["itl_ms_p95", "itl_ms_p99"];
        for (g, w) in got.iter().zip(&want) {
            for (i, col) in h.iter().enumerate() {
                let j = h2.iter().position(|c| c == col).unwrap();
                if !changed.contains(&col.as_str()) {
                    assert_eq!(g[j], w[i], "{name}: column {col}");
                }
            }
            for col in added {
                let j = h2.iter().position(|c| c == col).unwrap();
                assert_eq!(g[j], "", "{name}: {col} of a folder without the statistics");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
    // Type 7 by hand on the model fixture's first point, ITLs 16.254299 and 16.180821 ms:
    // p95 = 16.180821 + 0.95 × 0.073478 = 16.2506251, p99 = 16.180821 + 0.99 × 0.073478 = 16.25356422.
    let dir = fixture_copy("run-v0-model");
    let (code, _, err) = kvbench(&["report", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (h, rows) = csv_table(&dir.join("results.csv"));
    let col = |c: &str| {
        rows[0][h.iter().position(|x| x == c).unwrap()]
            .parse::<f64>()
            .unwrap()
    };
    assert!(
        (col("itl_ms_p95") - 16.250_625_1).abs() < 1e-9,
        "{}",
        col("itl_ms_p95")
    );
    assert!(
        (col("itl_ms_p99") - 16.253_564_22).abs() < 1e-9,
        "{}",
        col("itl_ms_p99")
    );
    // The quality repeated on old points is one scheme's, read once: ppl of fp16 and int8.
    assert!((col("ppl") - 25.869_277_333_264_51).abs() < 1e-12);
    std::fs::remove_dir_all(&dir).ok();
}

/// A sweep with quality writes each scheme's quality once, as its own raw.jsonl record, and
/// no point line repeats it.
#[test]
fn raw_jsonl_holds_each_schemes_quality_once() {
    kvbench::model::fetch::ensure_default_model().unwrap();
    let d = tmp("quality-once");
    let out = d.join("run");
    let (code, _, err) = kvbench(&[
        "sweep",
        "--dtypes",
        "fp16,int8",
        "--batch-sizes",
        "1",
        "--seq-lens",
        "16,24",
        "--gen",
        "3",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--ppl-windows",
        "1",
        "--ctx",
        "64",
        "--threads",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let raw = std::fs::read_to_string(out.join("raw.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = raw
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let quality: Vec<&serde_json::Value> =
        lines.iter().filter(|v| v["record"] == "quality").collect();
    assert_eq!(quality.len(), 2, "{raw}");
    assert_eq!(quality[0]["scheme"], "fp16", "fp16 first");
    assert_eq!(lines.len(), 2 + 4, "2 quality records and 4 points");
    assert!(lines
        .iter()
        .filter(|v| v["record"].is_null())
        .all(|v| v.get("ppl").is_none()));
    assert!(!out.join("quality.jsonl").exists());
    // Every row still carries its scheme's perplexity (joined at render).
    let (h, rows) = csv_table(&out.join("results.csv"));
    let ppl = h.iter().position(|c| c == "ppl").unwrap();
    assert!(rows.iter().all(|r| !r[ppl].is_empty()), "{rows:?}");
    std::fs::remove_dir_all(&d).ok();
}

/// A folder written by a newer kvbench (a meta.json `format` above this one's) is refused with
/// a message naming the format and the version that wrote it, not misread.
#[test]
fn newer_meta_format_is_refused_naming_the_version() {
    let dir = fixture_copy("run-v0-synth");
    let p = dir.join("meta.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    m["format"] = 99.into();
    m["kvbench"] = "9.9.9 (abcdef)".into();
    std::fs::write(&p, serde_json::to_string(&m).unwrap()).unwrap();
    let (code, _, err) = kvbench(&["report", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("format 99") && err.contains("9.9.9 (abcdef)"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
