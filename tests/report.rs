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
    let csv = std::fs::read_to_string(cut.join("results.csv")).unwrap();
    assert!(
        csv.contains("12345.5"),
        "the finished point was kept, not re-run"
    );
    assert_eq!(
        std::fs::read_to_string(cut.join("raw.jsonl"))
            .unwrap()
            .lines()
            .count(),
        4
    );

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
