//! ROUGE on XSum summaries: the embedded test pairs, the fixed prompt, and the scored result.

use crate::error::{Error, Result};
use crate::model::tokenizer::TextTokenizer;
use crate::quality::rouge::{self, RougeScores};

/// The first 100 XSum test pairs (`datasets/xsum/`, see its README for source and licence).
const XSUM_TEST: &str = include_str!("../../datasets/xsum/xsum_test_100.jsonl");

/// The user turn sent through the model's chat template; `{document}` is the article, cut to
/// `--rouge-doc-tokens` tokens.
pub const PROMPT: &str = "Summarize the following article in one sentence.\n\n{document}";

/// One XSum pair.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct XsumSample {
    /// XSum's article id.
    pub id: String,
    /// The BBC article.
    pub document: String,
    /// The reference one-sentence summary.
    pub summary: String,
}

/// The first `n` test pairs. Errors: [`Error::InvalidArgument`] naming `--rouge-samples` when
/// `n` exceeds the 100 shipped.
pub fn samples(n: usize) -> Result<Vec<XsumSample>> {
    let all: Vec<XsumSample> = XSUM_TEST
        .lines()
        .map(|l| serde_json::from_str(l).expect("the embedded XSum file is valid JSONL"))
        .collect();
    if n > all.len() {
        return Err(Error::InvalidArgument {
            name: "--rouge-samples".into(),
            reason: format!("{n} exceeds the {} XSum test pairs shipped", all.len()),
        });
    }
    Ok(all.into_iter().take(n).collect())
}

/// Prompts ready to generate from: the chat template applied to [`PROMPT`], tokenized.
#[derive(Debug, Clone)]
pub struct RougeTask {
    /// XSum ids, in order.
    pub ids: Vec<String>,
    /// Prompt token ids per sample.
    pub prompts: Vec<Vec<u32>>,
    /// Reference summaries per sample.
    pub references: Vec<String>,
    /// Most tokens generated per summary.
    pub max_new: usize,
}

impl RougeTask {
    /// Builds `n` prompts; each article is cut to its first `doc_tokens` tokens. Errors: the
    /// tokenizer's, the chat template's, and [`samples`]'.
    pub fn new(tok: &TextTokenizer, n: usize, doc_tokens: usize, max_new: usize) -> Result<Self> {
        let mut task = RougeTask {
            ids: Vec::new(),
            prompts: Vec::new(),
            references: Vec::new(),
            max_new,
        };
        for s in samples(n)? {
            let ids = tok.encode(&s.document)?;
            let doc = tok.decode(&ids[..ids.len().min(doc_tokens)])?;
            let user = PROMPT.replace("{document}", doc.trim());
            let mut prompt: Vec<u32> = tok.bos.filter(|_| tok.add_bos).into_iter().collect();
            prompt.extend(tok.encode(&tok.chat_prompt(&user)?)?);
            task.ids.push(s.id);
            task.prompts.push(prompt);
            task.references.push(s.summary);
        }
        Ok(task)
    }
}

/// Summaries generated with one scheme and their scores.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RougeResult {
    /// Generated summaries (whitespace-trimmed), per sample.
    pub predictions: Vec<String>,
    /// ROUGE of each prediction against its reference, with rouge-score's Porter stemmer
    /// (`use_stemmer=True`, as XSum results are usually reported).
    pub scores: Vec<RougeScores>,
    /// Mean ROUGE-L F1 of each prediction against the fp16 cache's prediction for the same
    /// article (1.0 = the same summaries); `None` for fp16 itself or without a baseline.
    pub rouge_l_vs_fp16: Option<f64>,
}

impl RougeResult {
    /// Scores `predictions` against the task's references and, when given, the baseline's.
    pub fn score(task: &RougeTask, predictions: Vec<String>, baseline: Option<&[String]>) -> Self {
        let scores = task
            .references
            .iter()
            .zip(&predictions)
            .map(|(r, p)| rouge::score(r, p, true))
            .collect();
        let rouge_l_vs_fp16 = baseline.map(|b| rouge_l_vs(b, &predictions));
        RougeResult {
            predictions,
            scores,
            rouge_l_vs_fp16,
        }
    }

    /// This result with `rouge_l_vs_fp16` computed against `baseline` (the fp16 cache's
    /// predictions), as [`RougeResult::score`] would have: `kvbench merge` uses it when the
    /// fp16 summaries were made on another shard.
    pub fn with_baseline(mut self, baseline: &[String]) -> Self {
        self.rouge_l_vs_fp16 = Some(rouge_l_vs(baseline, &self.predictions));
        self
    }

    /// Mean F1 of ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum over samples.
    pub fn mean_f1(&self) -> [f64; 4] {
        let n = self.scores.len().max(1) as f64;
        let mut m = [0.0; 4];
        for s in &self.scores {
            for (k, v) in [s.rouge1, s.rouge2, s.rouge_l, s.rouge_lsum]
                .iter()
                .enumerate()
            {
                m[k] += v.fmeasure / n;
            }
        }
        m
    }
}

/// Mean ROUGE-L F1 (stemmed) of each prediction against the baseline's for the same article.
fn rouge_l_vs(baseline: &[String], predictions: &[String]) -> f64 {
    baseline
        .iter()
        .zip(predictions)
        .map(|(b, p)| rouge::score(b, p, true).rouge_l.fmeasure)
        .sum::<f64>()
        / predictions.len().max(1) as f64
}
