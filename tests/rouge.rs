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
