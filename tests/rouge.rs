//! ROUGE against Google's `rouge-score` 0.1.2 (tests/data/rouge_pairs.jsonl: 10 target/prediction
//! pairs, with and without the Porter stemmer, values rounded to 6 decimals).

use kvbench::quality::rouge::{score, Score};

/// Largest error the reference's 6-decimal rounding allows, plus float slack.
const TOLERANCE: f64 = 5e-7 + 1e-12;

/// Every precision, recall and F-measure of ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum equals
/// rouge-score's to within its rounding, for all 20 reference rows.
#[test]
fn matches_rouge_score_reference() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/rouge_pairs.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut rows = 0;
    let mut max_err = 0.0f64;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let field = |key: &str| {
            row[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} in {line}"))
        };
        let target = row["target"].as_str().unwrap();
        let prediction = row["prediction"].as_str().unwrap();
        let use_stemmer = row["use_stemmer"].as_bool().unwrap();
        let ours = score(target, prediction, use_stemmer);
        let variants: [(&str, Score); 4] = [
            ("rouge1", ours.rouge1),
            ("rouge2", ours.rouge2),
            ("rougeL", ours.rouge_l),
            ("rougeLsum", ours.rouge_lsum),
        ];
        for (name, s) in variants {
            for (part, value) in [
                ("precision", s.precision),
                ("recall", s.recall),
                ("fmeasure", s.fmeasure),
            ] {
                let key = format!("{name}_{part}");
                let reference = field(&key);
                let err = (value - reference).abs();
                max_err = max_err.max(err);
                assert!(
                    err <= TOLERANCE,
                    "pair {} stemmer={use_stemmer} {key}: ours {value} vs rouge-score {reference}",
                    row["pair"]
                );
            }
        }
        rows += 1;
    }
    assert_eq!(rows, 20, "expected 20 reference rows");
    eprintln!("max |ours - rouge-score| = {max_err:.3e} over {rows} rows");
}

/// `kvbench rouge --format jsonl` on the single-line reference pairs gives rouge-score's values
/// (one object per pair, by line number), with and without the stemmer.
#[test]
fn rouge_subcommand_matches_reference() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/rouge_pairs.jsonl");
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| {
            !r["target"].as_str().unwrap().contains('\n')
                && !r["prediction"].as_str().unwrap().contains('\n')
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("kvbench-rouge-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for stem in [false, true] {
        let sel: Vec<&serde_json::Value> = rows
            .iter()
            .filter(|r| r["use_stemmer"].as_bool() == Some(stem))
            .collect();
        assert!(sel.len() >= 8);
        let write = |name: &str, key: &str| {
            let p = dir.join(name);
            let text: Vec<&str> = sel.iter().map(|r| r[key].as_str().unwrap()).collect();
            std::fs::write(&p, text.join("\n") + "\n").unwrap();
            p
        };
        let (t, p) = (write("t.txt", "target"), write("p.txt", "prediction"));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"));
        cmd.args(["rouge", "--format", "jsonl", "--predictions"])
            .arg(&p)
            .arg("--references")
            .arg(&t);
        if stem {
            cmd.arg("--stemmer");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(got.len(), sel.len());
        // `--format json`: the means of rouge-score's per-pair values.
        let mut json_cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"));
        json_cmd
            .args(["rouge", "--format", "json", "--predictions"])
            .arg(&p)
            .arg("--references")
            .arg(&t);
        if stem {
            json_cmd.arg("--stemmer");
        }
        let out = json_cmd.output().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["pairs"], sel.len());
        for v in ["rouge1", "rouge2", "rougeL", "rougeLsum"] {
            for m in ["precision", "recall", "fmeasure"] {
                let k = format!("{v}_{m}");
                let mean =
                    sel.iter().map(|r| r[&k].as_f64().unwrap()).sum::<f64>() / sel.len() as f64;
                let err = (json[v][m].as_f64().unwrap() - mean).abs();
                assert!(err <= TOLERANCE, "{k}: {} vs {mean}", json[v][m]);
            }
        }
        for (g, r) in got.iter().zip(&sel) {
            for v in ["rouge1", "rouge2", "rougeL", "rougeLsum"] {
                for m in ["precision", "recall", "fmeasure"] {
                    let k = format!("{v}_{m}");
                    let err = (g[&k].as_f64().unwrap() - r[&k].as_f64().unwrap()).abs();
                    assert!(err <= TOLERANCE, "pair {} {k}: {g} vs {r}", r["pair"]);
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Regression: `kvbench rouge` on one 20,000-word line pair needed the full LCS table for
/// ROUGE-Lsum, 20,001² × 8 bytes = 3.2 GB (30k words took ~7 GB). It now finishes under a 2 GB
/// address-space limit (`ulimit -v`), which the quadratic table alone would exceed, and scores
/// identical texts 1.
#[cfg(target_os = "linux")]
#[test]
fn rouge_on_a_20k_word_line_pair_fits_in_linear_memory() {
    let dir = std::env::temp_dir().join(format!("kvbench-rouge-long-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"];
    let text = |k: usize| -> String {
        (0..20_000)
            .map(|i| words[(i * k + i / 7) % words.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (t, p) = (dir.join("t.txt"), dir.join("p.txt"));
    std::fs::write(&t, text(3) + "\n" + &text(3) + "\n").unwrap();
    std::fs::write(&p, text(5) + "\n" + &text(3) + "\n").unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 2000000 && exec {} rouge --format jsonl --predictions {} --references {}",
            env!("CARGO_BIN_EXE_kvbench"),
            p.display(),
            t.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    let f = rows[0]["rougeLsum_fmeasure"].as_f64().unwrap();
    assert!(f > 0.0 && f < 1.0, "{f}");
    for k in ["rougeL_fmeasure", "rougeLsum_fmeasure"] {
        assert_eq!(rows[1][k].as_f64(), Some(1.0), "{k}: {}", rows[1]);
    }
    std::fs::remove_dir_all(&dir).ok();
}
