//! Passkey retrieval by depth: a haystack of filler text with a random 5-digit pass key at a
//! chosen depth, followed by the question; a trial is correct when the first integer of the
//! greedy continuation equals the key. The format is the one of Landmark Attention
//! (Mohtashami & Jaggi 2023, arXiv 2305.16300, §4.2) and LongLoRA (Chen et al. 2023, arXiv
//! 2309.12307, §4.2). Eviction schemes lose keys they evict; this is where that shows.

use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};
use crate::model::tokenizer::TextTokenizer;

/// Text before the haystack.
pub const PREFIX: &str = "There is an important info hidden inside a lot of irrelevant text. \
Find it and memorize it. I will quiz you about the important information there.\n";
/// One unit of filler, repeated.
pub const FILLER: &str =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
/// The needle; `{key}` is the pass key.
pub const NEEDLE: &str = " The pass key is {key}. Remember it. {key} is the pass key.";
/// The question after the haystack; the model continues it.
pub const QUESTION: &str = "\nWhat is the pass key? The pass key is";

/// Lengths, depths and trials of a passkey run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PasskeySpec {
    /// Prompt lengths, tokens (each prompt is at most this long).
    pub lengths: Vec<usize>,
    /// Depths of the needle in the haystack, % (0 = right after the prefix, 100 = just before
    /// the question).
    pub depths: Vec<f64>,
    /// Trials (different keys) per length × depth.
    pub trials: usize,
    /// Seed for the keys.
    pub seed: u64,
}

/// One prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PasskeyPrompt {
    /// Target length, tokens.
    pub length: usize,
    /// Depth, %.
    pub depth_pct: f64,
    /// The 5-digit key.
    pub key: u32,
    /// Token ids (pieces tokenized separately and concatenated, so every depth of a length
    /// has exactly the same number of tokens).
    pub tokens: Vec<u32>,
    /// Index in `tokens` where the needle starts.
    pub needle_at: usize,
    /// Filler units before the needle, and in all.
    pub units: (usize, usize),
}

/// Builds every prompt of `spec`. Errors: [`Error::InvalidArgument`] naming `--passkey-lengths`
/// when a length leaves no room for filler, or `--passkey-depths` for a depth outside 0–100.
pub fn prompts(tok: &TextTokenizer, spec: &PasskeySpec) -> Result<Vec<PasskeyPrompt>> {
    let prefix = tok.encode(PREFIX)?;
    let filler = tok.encode(FILLER)?;
    let question = tok.encode(QUESTION)?;
    let bos: Vec<u32> = tok.bos.filter(|_| tok.add_bos).into_iter().collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mut out = Vec::new();
    for &d in &spec.depths {
        if !(0.0..=100.0).contains(&d) {
            return Err(Error::InvalidArgument {
                name: "--passkey-depths".into(),
                reason: format!("{d} is not a depth in % between 0 and 100"),
            });
        }
    }
    for &length in &spec.lengths {
        for _ in 0..spec.trials {
            for &depth_pct in &spec.depths {
                let key: u32 = rng.random_range(10_000..100_000);
                let needle = tok.encode(&NEEDLE.replace("{key}", &key.to_string()))?;
                let fixed = bos.len() + prefix.len() + needle.len() + question.len();
                let n = length.saturating_sub(fixed) / filler.len();
                if n < 2 {
                    return Err(Error::InvalidArgument {
                        name: "--passkey-lengths".into(),
                        reason: format!(
                            "{length} tokens leave no room for a haystack; use ≥ {}",
                            fixed + 2 * filler.len()
                        ),
                    });
                }
                let before = (depth_pct / 100.0 * n as f64).round() as usize;
                let mut tokens = bos.clone();
                tokens.extend(&prefix);
                for _ in 0..before {
                    tokens.extend(&filler);
                }
                let needle_at = tokens.len();
                tokens.extend(&needle);
                for _ in before..n {
                    tokens.extend(&filler);
                }
                tokens.extend(&question);
                out.push(PasskeyPrompt {
                    length,
                    depth_pct,
                    key,
                    tokens,
                    needle_at,
                    units: (before, n),
                });
            }
        }
    }
    Ok(out)
}

/// The first run of ASCII digits in `text`, as a number.
pub fn first_integer(text: &str) -> Option<u64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let digits: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// One scored trial.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PasskeyTrial {
    /// Target length, tokens.
    pub length: usize,
    /// Depth, %.
    pub depth_pct: f64,
    /// The key.
    pub key: u32,
    /// The greedy continuation.
    pub answer: String,
    /// Whether its first integer equals the key.
    pub correct: bool,
}

/// All trials of one scheme.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PasskeyResult {
    /// Every trial, in prompt order.
    pub trials: Vec<PasskeyTrial>,
}

impl PasskeyResult {
    /// Correct trials, % of all.
    pub fn accuracy_pct(&self) -> f64 {
        100.0 * self.trials.iter().filter(|t| t.correct).count() as f64
            / self.trials.len().max(1) as f64
    }

    /// Accuracy % per `(length, depth)` cell, in first-seen order.
    pub fn cells(&self) -> Vec<(usize, f64, f64)> {
        let mut cells: Vec<(usize, f64, usize, usize)> = Vec::new();
        for t in &self.trials {
            match cells
                .iter_mut()
                .find(|c| c.0 == t.length && c.1 == t.depth_pct)
            {
                Some(c) => {
                    c.2 += t.correct as usize;
                    c.3 += 1;
                }
                None => cells.push((t.length, t.depth_pct, t.correct as usize, 1)),
            }
        }
        cells
            .into_iter()
            .map(|(l, d, k, n)| (l, d, 100.0 * k as f64 / n as f64))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_integer_of_answers() {
        assert_eq!(first_integer(" 68194. Remember"), Some(68194));
        assert_eq!(first_integer(" is 7 or 8"), Some(7));
        assert_eq!(first_integer(" unknown"), None);
    }
}
