//! `kvbench rouge`: score existing summaries with kvbench's ROUGE (rouge-score 0.1.2 exactly).

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::quality::rouge::{self, RougeScores, Score};

/// Arguments of `kvbench rouge`.
#[derive(Debug, clap::Args)]
pub struct RougeArgs {
    /// Predicted summaries, one per line.
    #[arg(long)]
    pub predictions: PathBuf,

    /// Reference summaries, one per line, paired with the predictions by line number.
    #[arg(long)]
    pub references: PathBuf,

    /// Stem tokens longer than 3 characters with the Porter stemmer (rouge-score's
    /// `use_stemmer=True`).
    #[arg(long)]
    pub stemmer: bool,

    /// `table` / `json`: mean precision, recall and F1 per variant (aligned text, or one JSON
    /// object); `csv` / `jsonl`: one record per pair.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Means over pairs, aligned.
    Table,
    /// One row per pair.
    Csv,
    /// One JSON object per pair.
    Jsonl,
    /// One JSON object: pairs, stemmer, and per variant the means of the table.
    Json,
}

/// The variants in rouge-score's names, with their scores.
fn variants(s: &RougeScores) -> [(&'static str, Score); 4] {
    [
        ("rouge1", s.rouge1),
        ("rouge2", s.rouge2),
        ("rougeL", s.rouge_l),
        ("rougeLsum", s.rouge_lsum),
    ]
}

/// Per variant, the mean precision, recall and F1 over the pairs (rouge-score's
/// `BootstrapAggregator` mid point without the resampling: the plain mean).
fn means(scores: &[RougeScores]) -> [(&'static str, Score); 4] {
    let n = scores.len().max(1) as f64;
    variants(&scores[0]).map(|(name, _)| {
        let pick = |f: fn(&Score) -> f64| {
            scores
                .iter()
                .map(|s| {
                    let v = variants(s);
                    f(&v.iter().find(|x| x.0 == name).expect("same variants").1)
                })
                .sum::<f64>()
                / n
        };
        (
            name,
            Score {
                precision: pick(|s| s.precision),
                recall: pick(|s| s.recall),
                fmeasure: pick(|s| s.fmeasure),
            },
        )
    })
}

fn read_lines(path: &Path, flag: &str) -> Result<Vec<String>, Error> {
    let text = crate::util::read_regular(path).map_err(|e| Error::InvalidArgument {
        name: flag.into(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    Ok(text.lines().map(str::to_string).collect())
}

/// Scores every (reference, prediction) pair and prints them in the chosen format.
/// Errors: [`Error::InvalidArgument`] (exit 2) when a file is unreadable or the line counts
/// differ, naming both files.
pub fn run(a: RougeArgs) -> anyhow::Result<()> {
    let preds = read_lines(&a.predictions, "--predictions")?;
    let refs = read_lines(&a.references, "--references")?;
    if preds.len() != refs.len() || preds.is_empty() {
        return Err(Error::InvalidArgument {
            name: "--predictions/--references".into(),
            reason: format!(
                "{} has {} lines and {} has {}; give one text per line, paired by line number",
                a.predictions.display(),
                preds.len(),
                a.references.display(),
                refs.len()
            ),
        }
        .into());
    }
    let scores: Vec<RougeScores> = refs
        .iter()
        .zip(&preds)
        .map(|(r, p)| rouge::score(r, p, a.stemmer))
        .collect();
    match a.format {
        Format::Jsonl => {
            for (i, s) in scores.iter().enumerate() {
                let mut obj = serde_json::Map::new();
                obj.insert("pair".into(), i.into());
                obj.insert("use_stemmer".into(), a.stemmer.into());
                for (name, v) in variants(s) {
                    obj.insert(format!("{name}_precision"), v.precision.into());
                    obj.insert(format!("{name}_recall"), v.recall.into());
                    obj.insert(format!("{name}_fmeasure"), v.fmeasure.into());
                }
                println!("{}", serde_json::Value::Object(obj));
            }
        }
        Format::Csv => {
            let mut w = csv::Writer::from_writer(std::io::stdout());
            let mut header = vec!["pair".to_string()];
            for (name, _) in variants(&scores[0]) {
                for m in ["precision", "recall", "fmeasure"] {
                    header.push(format!("{name}_{m}"));
                }
            }
            w.write_record(&header)?;
            for (i, s) in scores.iter().enumerate() {
                let mut rec = vec![i.to_string()];
                for (_, v) in variants(s) {
                    rec.extend([v.precision, v.recall, v.fmeasure].map(|x| x.to_string()));
                }
                w.write_record(&rec)?;
            }
            w.flush()?;
        }
        Format::Json => {
            let means = means(&scores);
            let mut obj = serde_json::Map::new();
            obj.insert("pairs".into(), scores.len().into());
            obj.insert("use_stemmer".into(), a.stemmer.into());
            for (name, m) in means {
                obj.insert(
                    name.into(),
                    serde_json::json!({
                        "precision": m.precision,
                        "recall": m.recall,
                        "fmeasure": m.fmeasure,
                    }),
                );
            }
            println!("{}", serde_json::to_string_pretty(&obj)?);
        }
        Format::Table => {
            println!(
                "{} pairs, stemmer {}",
                scores.len(),
                if a.stemmer { "on" } else { "off" }
            );
            println!(
                "{:<10} {:>10} {:>10} {:>10}",
                "variant", "precision", "recall", "F1"
            );
            for (name, m) in means(&scores) {
                println!(
                    "{name:<10} {:>10.6} {:>10.6} {:>10.6}",
                    m.precision, m.recall, m.fmeasure
                );
            }
        }
    }
    Ok(())
}
