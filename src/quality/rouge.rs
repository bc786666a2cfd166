//! ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum, computed exactly as Google's `rouge-score` 0.1.2
//! (`rouge_score/rouge_scorer.py`, `tokenize.py`, `scoring.py`) computes them with its default
//! tokenizer, so scores compare directly with papers and tools that use that package.
//!
//! The measures are those of Lin (2004), "ROUGE: A Package for Automatic Evaluation of
//! Summaries": ROUGE-N from clipped n-gram overlap (§2), ROUGE-L from the longest common
//! subsequence of the two token sequences (§3.1), and ROUGE-Lsum from the summary-level union LCS
//! over sentences (§3.2), with ROUGE-1.5.5's guard against counting a token more often than it
//! occurs. Every score is a fraction in [0, 1]; F-measure is `2PR / (P + R)` (0 when both are 0).
//!
//! With a stemmer, tokens longer than three characters go through the Porter (1980) stemmer in
//! NLTK's default mode (`nltk.stem.porter.PorterStemmer()`, `NLTK_EXTENSIONS`), which is what
//! `rouge-score` uses; [`porter_stem`] re-implements that mode.

use std::collections::HashMap;

/// Precision, recall and F-measure of one ROUGE variant, each a fraction in [0, 1].
///
/// Precision divides the matches by the prediction's count (n-grams or tokens), recall by the
/// target's; `fmeasure` is their harmonic mean `2PR / (P + R)`, or 0 when `P + R` is 0
/// (`rouge_score/scoring.py`).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Score {
    /// Matches over the prediction's n-grams (or tokens, for the LCS variants).
    pub precision: f64,
    /// Matches over the target's n-grams (or tokens, for the LCS variants).
    pub recall: f64,
    /// Harmonic mean of precision and recall; 0 when both are 0.
    pub fmeasure: f64,
}

impl Score {
    const ZERO: Score = Score {
        precision: 0.0,
        recall: 0.0,
        fmeasure: 0.0,
    };

    /// The score for `matches` out of `prediction_len` and `target_len` (both non-zero).
    fn from_counts(matches: usize, prediction_len: usize, target_len: usize) -> Score {
        let precision = matches as f64 / prediction_len as f64;
        let recall = matches as f64 / target_len as f64;
        // Same operation order as `scoring.fmeasure`, so results agree to the last bit.
        let fmeasure = if precision + recall > 0.0 {
            2.0 * precision * recall / (precision + recall)
        } else {
            0.0
        };
        Score {
            precision,
            recall,
            fmeasure,
        }
    }
}

/// The four variants `rouge-score` users report: `rouge1`, `rouge2`, `rougeL`, `rougeLsum`.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct RougeScores {
    /// ROUGE-1: unigram overlap (Lin 2004, §2).
    pub rouge1: Score,
    /// ROUGE-2: bigram overlap (Lin 2004, §2).
    pub rouge2: Score,
    /// ROUGE-L: LCS of the two whole token sequences, newlines ignored (Lin 2004, §3.1).
    pub rouge_l: Score,
    /// ROUGE-Lsum: summary-level union LCS over newline-separated sentences (Lin 2004, §3.2).
    pub rouge_lsum: Score,
}

/// ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum of `prediction` against `target` (the reference),
/// as `rouge_score.rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"],
/// use_stemmer=use_stemmer).score(target, prediction)` in rouge-score 0.1.2.
///
/// Both texts go through [`tokenize`]. ROUGE-Lsum splits each text into sentences on `"\n"` only
/// (no sentence splitter: put one sentence per line), drops empty lines, and tokenizes each line
/// on its own. A variant whose target or prediction has no tokens scores 0 throughout (ROUGE-N
/// divides by `max(count, 1)`, the LCS variants return 0).
pub fn score(target: &str, prediction: &str, use_stemmer: bool) -> RougeScores {
    let target_tokens = tokenize(target, use_stemmer);
    let prediction_tokens = tokenize(prediction, use_stemmer);
    let sentences = |text: &str| -> Vec<Vec<String>> {
        text.split('\n')
            .filter(|line| !line.is_empty())
            .map(|line| tokenize(line, use_stemmer))
            .collect()
    };
    RougeScores {
        rouge1: score_ngrams(&target_tokens, &prediction_tokens, 1),
        rouge2: score_ngrams(&target_tokens, &prediction_tokens, 2),
        rouge_l: score_lcs(&target_tokens, &prediction_tokens),
        rouge_lsum: summary_level_lcs(&sentences(target), &sentences(prediction)),
    }
}

/// `rouge-score`'s default tokenizer (`rouge_score/tokenize.py`): lowercase (Unicode, like
/// Python's `str.lower`), turn every run of characters outside `[a-z0-9]` into a space, split,
/// and, with `use_stemmer`, replace each token longer than 3 characters by its [`porter_stem`].
/// Empty tokens are dropped. So `"U.S.-based"` gives `["u", "s", "based"]`.
pub fn tokenize(text: &str, use_stemmer: bool) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|t| !t.is_empty())
        .map(|t| {
            if use_stemmer && t.len() > 3 {
                porter_stem(t)
            } else {
                t.to_owned()
            }
        })
        // rouge-score's final `^[a-z0-9]+$` check; stems of such tokens always pass it.
        .filter(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
        .collect()
}

/// Porter's (1980) suffix-stripping stemmer ("An algorithm for suffix stripping", Program 14(3),
/// 130–137) in NLTK's default `NLTK_EXTENSIONS` mode (`nltk/stem/porter.py`), the stemmer
/// `rouge-score` uses.
///
/// The word is lowercased first. NLTK's departures from the paper are kept: a table of irregular
/// forms (`skies` → `sky`, `dying` → `die`, `news`, `proceed`, …) bypasses the rules; words of at
/// most 2 characters are only lowercased; `-ies`/`-ied` give `-ie` for 4-letter words
/// (`ties` → `tie`) and `-i` otherwise; `y` → `i` only after a consonant that is not the
/// word's first letter (`happy` → `happi`, `enjoy` unchanged); the `*o` test also accepts a
/// 2-letter vowel–consonant stem; step 2 maps `-bli` → `-ble`, applies `-alli` → `-al` first and
/// re-runs the step, and adds `-fulli` → `-ful` and `-logi` → `-log` (measure of the stem with
/// its `l`).
pub fn porter_stem(word: &str) -> String {
    porter::stem(word)
}

/// Clipped n-gram overlap (`_score_ngrams`): matches = Σ over target n-grams of
/// min(target count, prediction count).
fn score_ngrams(target: &[String], prediction: &[String], n: usize) -> Score {
    let target_counts = ngram_counts(target, n);
    let prediction_counts = ngram_counts(prediction, n);
    let matches: usize = target_counts
        .iter()
        .map(|(gram, &count)| count.min(prediction_counts.get(gram).copied().unwrap_or(0)))
        .sum();
    let target_total = target.len().saturating_sub(n - 1);
    let prediction_total = prediction.len().saturating_sub(n - 1);
    Score::from_counts(matches, prediction_total.max(1), target_total.max(1))
}

fn ngram_counts(tokens: &[String], n: usize) -> HashMap<&[String], usize> {
    let mut counts = HashMap::new();
    for gram in tokens.windows(n) {
        *counts.entry(gram).or_insert(0) += 1;
    }
    counts
}

/// ROUGE-L (`_score_lcs`): LCS length over the prediction's and the target's token counts.
fn score_lcs(target: &[String], prediction: &[String]) -> Score {
    if target.is_empty() || prediction.is_empty() {
        return Score::ZERO;
    }
    let mut previous = vec![0usize; prediction.len() + 1];
    let mut current = vec![0usize; prediction.len() + 1];
    for t in target {
        for (j, p) in prediction.iter().enumerate() {
            current[j + 1] = if t == p {
                previous[j] + 1
            } else {
                previous[j + 1].max(current[j])
            };
        }
        std::mem::swap(&mut previous, &mut current);
    }
    Score::from_counts(previous[prediction.len()], prediction.len(), target.len())
}

/// ROUGE-Lsum (`_summary_level_lcs`): for each target sentence, the union of the token positions
/// of one LCS with each prediction sentence; a token there is a hit while both texts still have
/// an unmatched occurrence of it (ROUGE-1.5.5's guard against double counting). Precision and
/// recall divide the hits by the prediction's and the target's total token counts.
fn summary_level_lcs(target: &[Vec<String>], prediction: &[Vec<String>]) -> Score {
    let m: usize = target.iter().map(Vec::len).sum();
    let n: usize = prediction.iter().map(Vec::len).sum();
    if m == 0 || n == 0 {
        return Score::ZERO;
    }
    let mut left_target: HashMap<&str, usize> = HashMap::new();
    let mut left_prediction: HashMap<&str, usize> = HashMap::new();
    for t in target.iter().flatten() {
        *left_target.entry(t.as_str()).or_insert(0) += 1;
    }
    for t in prediction.iter().flatten() {
        *left_prediction.entry(t.as_str()).or_insert(0) += 1;
    }
    let mut hits = 0;
    for sentence in target {
        let mut union = vec![false; sentence.len()];
        for other in prediction {
            for i in lcs_positions(sentence, other) {
                union[i] = true;
            }
        }
        for (token, _) in sentence
            .iter()
            .zip(&union)
            .filter(|(_, &in_union)| in_union)
        {
            let t = token.as_str();
            let (Some(ct), Some(cp)) = (left_target.get_mut(t), left_prediction.get_mut(t)) else {
                continue;
            };
            if *ct > 0 && *cp > 0 {
                hits += 1;
                *ct -= 1;
                *cp -= 1;
            }
        }
    }
    Score::from_counts(hits, n, m)
}

/// Positions in `a` of one longest common subsequence of `a` and `b`, chosen as `rouge-score`'s
/// `lcs_ind` / `_backtrack_norec` choose it (the union in ROUGE-Lsum depends on the choice):
/// walking back from the end, take a match when the tokens are equal, else step back in `b`
/// only when that keeps a strictly longer LCS than stepping back in `a`. Positions come in
/// decreasing order.
///
/// rouge-score keeps the whole `(|a|+1) × (|b|+1)` table; here memory is linear: the walk is
/// split by rows as in Hirschberg (1975), "A linear space algorithm for computing maximal common
/// subsequences" — the row where the walk crosses the middle of a band is recomputed from the
/// band's first row, the lower half walked first, then the upper half from where it left — and
/// a band small enough ([`LCS_BLOCK_CELLS`]) is walked on a full table. The table values, and so
/// every choice of the walk, are those of the full table: the result is the same positions.
/// Memory O(|b| log |a| + block), time O(|a| |b| log |a|) at worst.
fn lcs_positions(a: &[String], b: &[String]) -> Vec<usize> {
    lcs_positions_blocked(a, b, LCS_BLOCK_CELLS)
}

/// Table cells (u32) walked on a full table at once: 4 Mi cells, 16 MiB.
const LCS_BLOCK_CELLS: usize = 1 << 22;

/// [`lcs_positions`] with full tables of at most `block` cells (≥ 1).
fn lcs_positions_blocked(a: &[String], b: &[String], block: usize) -> Vec<usize> {
    // Tokens as small integers: comparisons in the inner loop are then one instruction.
    let mut ids: HashMap<&str, u32> = HashMap::new();
    let (mut ia, mut ib) = (Vec::with_capacity(a.len()), Vec::with_capacity(b.len()));
    for (src, dst) in [(a, &mut ia), (b, &mut ib)] {
        for t in src {
            let n = ids.len() as u32;
            dst.push(*ids.entry(t.as_str()).or_insert(n));
        }
    }
    let (a, b) = (ia, ib);
    let mut positions = Vec::new();
    let base = vec![0u32; b.len() + 1];
    lcs_walk(
        &a,
        &b,
        0,
        a.len(),
        b.len(),
        &base,
        block.max(1),
        &mut positions,
    );
    positions
}

/// Row `hi` of the LCS table over columns `0..=j`, from row `lo` (`base`, `j + 1` values):
/// `T[i][c] = T[i−1][c−1] + 1` when `a[i−1] = b[c−1]`, else `max(T[i−1][c], T[i][c−1])`.
fn lcs_row(a: &[u32], b: &[u32], lo: usize, hi: usize, base: &[u32]) -> Vec<u32> {
    let mut prev = base.to_vec();
    let mut cur = vec![0u32; base.len()];
    for &x in &a[lo..hi] {
        cur[0] = 0;
        for c in 1..base.len() {
            cur[c] = if x == b[c - 1] {
                prev[c - 1] + 1
            } else {
                prev[c].max(cur[c - 1])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev
}

/// Walks back from `(hi, j)` until row `lo` or column 0, given row `lo` of the table over
/// columns `0..=j` (`base`); pushes the positions (in `a`) of the matches taken and returns the
/// column where the walk reached row `lo` (0 when it reached column 0 first).
#[allow(clippy::too_many_arguments)]
fn lcs_walk(
    a: &[u32],
    b: &[u32],
    lo: usize,
    hi: usize,
    j: usize,
    base: &[u32],
    block: usize,
    out: &mut Vec<usize>,
) -> usize {
    if hi == lo || j == 0 {
        return j;
    }
    let cols = j + 1;
    if (hi - lo).saturating_mul(cols) <= block || hi - lo == 1 {
        // The band's table, rows lo..=hi, columns 0..=j.
        let mut t = vec![0u32; (hi - lo + 1) * cols];
        t[..cols].copy_from_slice(&base[..cols]);
        for r in 1..=hi - lo {
            let x = a[lo + r - 1];
            for c in 1..cols {
                t[r * cols + c] = if x == b[c - 1] {
                    t[(r - 1) * cols + c - 1] + 1
                } else {
                    t[(r - 1) * cols + c].max(t[r * cols + c - 1])
                };
            }
        }
        let (mut r, mut c) = (hi - lo, j);
        while r > 0 && c > 0 {
            if a[lo + r - 1] == b[c - 1] {
                out.push(lo + r - 1);
                r -= 1;
                c -= 1;
            } else if t[r * cols + c - 1] > t[(r - 1) * cols + c] {
                c -= 1;
            } else {
                r -= 1;
            }
        }
        return c;
    }
    let mid = lo + (hi - lo) / 2;
    let mid_row = lcs_row(a, &b[..j], lo, mid, &base[..cols]);
    let j2 = lcs_walk(a, b, mid, hi, j, &mid_row, block, out);
    drop(mid_row);
    lcs_walk(a, b, lo, mid, j2, &base[..j2 + 1], block, out)
}

/// The Porter stemmer in NLTK's `NLTK_EXTENSIONS` mode, on `char`s (Python indexes code points).
mod porter {
    type Word = Vec<char>;

    /// NLTK's irregular forms: (form, stem), bypassing the rules.
    const IRREGULAR: [(&str, &str); 16] = [
        ("sky", "sky"),
        ("skies", "sky"),
        ("dying", "die"),
        ("lying", "lie"),
        ("tying", "tie"),
        ("news", "news"),
        ("innings", "inning"),
        ("inning", "inning"),
        ("outings", "outing"),
        ("outing", "outing"),
        ("cannings", "canning"),
        ("canning", "canning"),
        ("howe", "howe"),
        ("proceed", "proceed"),
        ("exceed", "exceed"),
        ("succeed", "succeed"),
    ];

    pub(super) fn stem(word: &str) -> String {
        let lower = word.to_lowercase();
        if let Some((_, s)) = IRREGULAR.iter().find(|(form, _)| *form == lower) {
            return (*s).to_owned();
        }
        // NLTK tests the length of the word as given, before lowercasing.
        if word.chars().count() <= 2 {
            return lower;
        }
        let mut w: Word = lower.chars().collect();
        for step in [step1a, step1b, step1c, step2, step3, step4, step5a, step5b] {
            w = step(&w);
        }
        w.into_iter().collect()
    }

    fn is_vowel(c: char) -> bool {
        matches!(c, 'a' | 'e' | 'i' | 'o' | 'u')
    }

    /// Consonant flags: not a vowel, and `y` only at the start or after a vowel.
    fn consonants(w: &[char]) -> Vec<bool> {
        let mut flags: Vec<bool> = Vec::with_capacity(w.len());
        for (i, &c) in w.iter().enumerate() {
            let cons = match c {
                'y' => i == 0 || !flags[i - 1],
                c => !is_vowel(c),
            };
            flags.push(cons);
        }
        flags
    }

    fn is_consonant(w: &[char], i: usize) -> bool {
        consonants(&w[..=i])[i]
    }

    /// Porter's measure m in `[C](VC){m}[V]`: the number of vowel→consonant transitions.
    fn measure(w: &[char]) -> usize {
        consonants(w).windows(2).filter(|p| !p[0] && p[1]).count()
    }

    fn contains_vowel(w: &[char]) -> bool {
        consonants(w).iter().any(|&c| !c)
    }

    /// `*d`: ends with a double consonant.
    fn ends_double_consonant(w: &[char]) -> bool {
        let n = w.len();
        n >= 2 && w[n - 1] == w[n - 2] && is_consonant(w, n - 1)
    }

    /// `*o`: ends consonant–vowel–consonant, the last not `w`, `x` or `y`; NLTK also accepts a
    /// whole 2-letter word vowel–consonant.
    fn ends_cvc(w: &[char]) -> bool {
        let n = w.len();
        let c = consonants(w);
        (n >= 3 && c[n - 3] && !c[n - 2] && c[n - 1] && !matches!(w[n - 1], 'w' | 'x' | 'y'))
            || (n == 2 && !c[0] && c[1])
    }

    fn ends_with(w: &[char], suffix: &str) -> bool {
        let s: Word = suffix.chars().collect();
        w.ends_with(&s)
    }

    /// `w` without its last `k` chars, followed by `add`.
    fn replace_tail(w: &[char], k: usize, add: &str) -> Word {
        let mut out = w[..w.len() - k].to_vec();
        out.extend(add.chars());
        out
    }

    type Cond<'a> = &'a dyn Fn(&[char]) -> bool;

    /// NLTK's `_apply_rule_list`: the first rule whose suffix matches decides; its condition,
    /// tested on the word without the suffix, says whether the replacement happens.
    fn apply_rules(w: &[char], rules: &[(&str, &str, Cond)]) -> Word {
        for (suffix, replacement, cond) in rules {
            if ends_with(w, suffix) {
                let stem = &w[..w.len() - suffix.chars().count()];
                return if cond(stem) {
                    replace_tail(w, suffix.chars().count(), replacement)
                } else {
                    w.to_vec()
                };
            }
        }
        w.to_vec()
    }

    fn always(_: &[char]) -> bool {
        true
    }

    fn m_gt0(stem: &[char]) -> bool {
        measure(stem) > 0
    }

    fn m_gt1(stem: &[char]) -> bool {
        measure(stem) > 1
    }

    /// Step 1a: plurals. NLTK: a 4-letter `-ies` word gives `-ie`.
    fn step1a(w: &[char]) -> Word {
        if ends_with(w, "ies") && w.len() == 4 {
            return replace_tail(w, 3, "ie");
        }
        apply_rules(
            w,
            &[
                ("sses", "ss", &always),
                ("ies", "i", &always),
                ("ss", "ss", &always),
                ("s", "", &always),
            ],
        )
    }

    /// Step 1b: `-eed`, `-ed`, `-ing`, then tidying. NLTK: `-ied` gives `-ie` (4 letters) or `-i`.
    fn step1b(w: &[char]) -> Word {
        if ends_with(w, "ied") {
            return replace_tail(w, 3, if w.len() == 4 { "ie" } else { "i" });
        }
        if ends_with(w, "eed") {
            return if measure(&w[..w.len() - 3]) > 0 {
                replace_tail(w, 1, "")
            } else {
                w.to_vec()
            };
        }
        let stem = ["ed", "ing"]
            .into_iter()
            .filter(|s| ends_with(w, s))
            .map(|s| &w[..w.len() - s.len()])
            .find(|stem| contains_vowel(stem));
        let Some(stem) = stem else {
            return w.to_vec();
        };
        if ends_with(stem, "at") || ends_with(stem, "bl") || ends_with(stem, "iz") {
            return replace_tail(stem, 0, "e");
        }
        if ends_double_consonant(stem) {
            let last = stem[stem.len() - 1];
            return if matches!(last, 'l' | 's' | 'z') {
                stem.to_vec()
            } else {
                replace_tail(stem, 1, "")
            };
        }
        if measure(stem) == 1 && ends_cvc(stem) {
            return replace_tail(stem, 0, "e");
        }
        stem.to_vec()
    }

    /// Step 1c, NLTK's rule: `y` → `i` after a consonant, when more than that consonant precedes.
    fn step1c(w: &[char]) -> Word {
        let cond = |stem: &[char]| stem.len() > 1 && is_consonant(stem, stem.len() - 1);
        apply_rules(w, &[("y", "i", &cond)])
    }

    /// Step 2: double suffixes (m > 0), with NLTK's `-bli`, `-alli` (first, then re-run),
    /// `-fulli` and `-logi` rules.
    fn step2(w: &[char]) -> Word {
        if ends_with(w, "alli") && m_gt0(&w[..w.len() - 4]) {
            return step2(&replace_tail(w, 4, "al"));
        }
        // `-logi` keeps its `l` with the stem for the measure test.
        let logi = |_: &[char]| w.len() >= 3 && m_gt0(&w[..w.len() - 3]);
        apply_rules(
            w,
            &[
                ("ational", "ate", &m_gt0),
                ("tional", "tion", &m_gt0),
                ("enci", "ence", &m_gt0),
                ("anci", "ance", &m_gt0),
                ("izer", "ize", &m_gt0),
                ("bli", "ble", &m_gt0),
                ("alli", "al", &m_gt0),
                ("entli", "ent", &m_gt0),
                ("eli", "e", &m_gt0),
                ("ousli", "ous", &m_gt0),
                ("ization", "ize", &m_gt0),
                ("ation", "ate", &m_gt0),
                ("ator", "ate", &m_gt0),
                ("alism", "al", &m_gt0),
                ("iveness", "ive", &m_gt0),
                ("fulness", "ful", &m_gt0),
                ("ousness", "ous", &m_gt0),
                ("aliti", "al", &m_gt0),
                ("iviti", "ive", &m_gt0),
                ("biliti", "ble", &m_gt0),
                ("fulli", "ful", &m_gt0),
                ("logi", "log", &logi),
            ],
        )
    }

    /// Step 3: `-icate`, `-ative`, `-alize`, `-iciti`, `-ical`, `-ful`, `-ness` (m > 0).
    fn step3(w: &[char]) -> Word {
        apply_rules(
            w,
            &[
                ("icate", "ic", &m_gt0),
                ("ative", "", &m_gt0),
                ("alize", "al", &m_gt0),
                ("iciti", "ic", &m_gt0),
                ("ical", "ic", &m_gt0),
                ("ful", "", &m_gt0),
                ("ness", "", &m_gt0),
            ],
        )
    }

    /// Step 4: single suffixes removed when m > 1 (`-ion` only after `s` or `t`).
    fn step4(w: &[char]) -> Word {
        let ion = |stem: &[char]| m_gt1(stem) && matches!(stem.last(), Some('s' | 't'));
        apply_rules(
            w,
            &[
                ("al", "", &m_gt1),
                ("ance", "", &m_gt1),
                ("ence", "", &m_gt1),
                ("er", "", &m_gt1),
                ("ic", "", &m_gt1),
                ("able", "", &m_gt1),
                ("ible", "", &m_gt1),
                ("ant", "", &m_gt1),
                ("ement", "", &m_gt1),
                ("ment", "", &m_gt1),
                ("ent", "", &m_gt1),
                ("ion", "", &ion),
                ("ou", "", &m_gt1),
                ("ism", "", &m_gt1),
                ("ate", "", &m_gt1),
                ("iti", "", &m_gt1),
                ("ous", "", &m_gt1),
                ("ive", "", &m_gt1),
                ("ize", "", &m_gt1),
            ],
        )
    }

    /// Step 5a: final `e` removed when m > 1, or m = 1 and not `*o`.
    fn step5a(w: &[char]) -> Word {
        if let Some((&'e', stem)) = w.split_last() {
            let m = measure(stem);
            if m > 1 || (m == 1 && !ends_cvc(stem)) {
                return stem.to_vec();
            }
        }
        w.to_vec()
    }

    /// Step 5b: `-ll` → `-l` when m > 1 (measured with one `l`).
    fn step5b(w: &[char]) -> Word {
        if ends_with(w, "ll") && m_gt1(&w[..w.len() - 1]) {
            return replace_tail(w, 1, "");
        }
        w.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(text: &str, stem: bool) -> Vec<String> {
        tokenize(text, stem)
    }

    #[test]
    fn tokenizer_lowercases_and_splits_on_non_alphanumerics() {
        assert_eq!(
            toks("Hello, World! It's 3.5%-ish.", false),
            ["hello", "world", "it", "s", "3", "5", "ish"]
        );
        assert_eq!(
            toks("  U.S.-based\tco-op\n\n", false),
            ["u", "s", "based", "co", "op"]
        );
        // Non-ASCII letters are separators; Unicode lowercasing happens first (K = Kelvin sign).
        assert_eq!(
            toks("Crème brûlée \u{212A}g", false),
            ["cr", "me", "br", "l", "e", "kg"]
        );
        assert!(toks("—…!?", false).is_empty());
    }

    #[test]
    fn tokenizer_stems_only_tokens_longer_than_three() {
        // "runs" (4) is stemmed; "ran"/"was" (3) are not; "cats" → "cat".
        assert_eq!(
            toks("Cats ran, runs was", true),
            ["cat", "ran", "run", "was"]
        );
        assert_eq!(
            toks("Cats ran, runs was", false),
            ["cats", "ran", "runs", "was"]
        );
    }

    #[test]
    fn porter_stemmer_paper_and_nltk_examples() {
        // Porter (1980) examples, steps 1–5, with NLTK's departures where they differ.
        for (word, stem) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "tie"), // NLTK: 4-letter -ies → -ie (paper: "ti")
            ("caress", "caress"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("bled", "bled"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("troubled", "troubl"),
            ("sized", "size"),
            ("hopping", "hop"),
            ("tanned", "tan"),
            ("falling", "fall"),
            ("hissing", "hiss"),
            ("fizzed", "fizz"),
            ("failing", "fail"),
            ("filing", "file"),
            ("happy", "happi"),
            ("enjoy", "enjoy"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("rational", "ration"),
            ("generalization", "gener"),
            ("running", "run"),
            ("sky", "sky"),
            ("skies", "sky"),
            ("dying", "die"),
            ("news", "news"),
            ("proceed", "proceed"),
            ("spied", "spi"),
            ("died", "die"),
            ("flies", "fli"),
            ("probate", "probat"),
            ("rate", "rate"),
            ("cease", "ceas"),
            ("controlling", "control"),
            ("roll", "roll"),
            ("a", "a"),
            ("is", "is"),
            ("Running", "run"),
        ] {
            assert_eq!(porter_stem(word), stem, "{word}");
        }
    }

    #[test]
    fn rouge_l_hand_computed() {
        // Target "police killed the gunman" (4 tokens), prediction "the gunman was shot dead by
        // police" (7): LCS = "the gunman" = 2, so P = 2/7, R = 2/4, F = 2PR/(P+R) = 4/11.
        let s = score(
            "police killed the gunman",
            "the gunman was shot dead by police",
            false,
        );
        assert!((s.rouge_l.precision - 2.0 / 7.0).abs() < 1e-15);
        assert!((s.rouge_l.recall - 0.5).abs() < 1e-15);
        assert!((s.rouge_l.fmeasure - 4.0 / 11.0).abs() < 1e-15);
        // Unigrams: police, the, gunman match 3 of 4 target and 3 of 7 prediction tokens.
        assert!((s.rouge1.recall - 0.75).abs() < 1e-15);
        assert!((s.rouge1.precision - 3.0 / 7.0).abs() < 1e-15);
    }

    #[test]
    fn rouge_n_clips_repeated_ngrams() {
        // "the" twice in the prediction but once in the target counts once.
        let s = score("the cat", "the the the", false);
        assert_eq!(s.rouge1.precision, 1.0 / 3.0);
        assert_eq!(s.rouge1.recall, 0.5);
        assert_eq!(s.rouge2, Score::ZERO);
    }

    #[test]
    fn rouge_lsum_unions_lcs_across_sentences_and_ignores_blank_lines() {
        // Target sentence "a b c d" against prediction sentences "c d", "x" and "a b": the union
        // of the LCS covers all four target tokens, so Lsum R = 1 and P = 4/5, while plain
        // ROUGE-L over "c d x a b" finds an LCS of 2 (P = 2/5, R = 1/2).
        let s = score("a b c d", "c d\n\nx\na b", false);
        assert_eq!(
            s.rouge_lsum,
            Score {
                precision: 0.8,
                recall: 1.0,
                fmeasure: 2.0 * 0.8 / 1.8
            }
        );
        assert_eq!((s.rouge_l.precision, s.rouge_l.recall), (0.4, 0.5));
        // Blank and whitespace-only lines add no tokens.
        let blank = score("a b\n\n \nc", "a b c", false).rouge_lsum;
        assert_eq!(
            blank,
            Score {
                precision: 1.0,
                recall: 1.0,
                fmeasure: 1.0
            }
        );
        // The union is over positions in the target sentence: both one-token prediction lines
        // match the same (last) "a", so only one hit (rouge-score gives P = R = 0.5 here).
        let s = score("a a", "a\na", false).rouge_lsum;
        assert_eq!(
            s,
            Score {
                precision: 0.5,
                recall: 0.5,
                fmeasure: 0.5
            }
        );
        // A token is counted at most as often as it occurs in each text.
        let s = score("a\na", "a", false).rouge_lsum;
        assert_eq!((s.precision, s.recall), (1.0, 0.5));
    }

    #[test]
    fn empty_inputs_score_zero() {
        assert_eq!(score("", "something", true), RougeScores::default());
        assert_eq!(score("something", "...", false), RougeScores::default());
    }

    /// rouge-score's `_lcs_table` + `_backtrack_norec` as written there: the full table, then
    /// the walk back. The reference the linear-space walk must reproduce exactly.
    fn reference_lcs_positions(a: &[String], b: &[String]) -> Vec<usize> {
        let cols = b.len() + 1;
        let mut table = vec![0usize; (a.len() + 1) * cols];
        for i in 1..=a.len() {
            for j in 1..=b.len() {
                table[i * cols + j] = if a[i - 1] == b[j - 1] {
                    table[(i - 1) * cols + j - 1] + 1
                } else {
                    table[(i - 1) * cols + j].max(table[i * cols + j - 1])
                };
            }
        }
        let (mut i, mut j) = (a.len(), b.len());
        let mut positions = Vec::new();
        while i > 0 && j > 0 {
            if a[i - 1] == b[j - 1] {
                positions.push(i - 1);
                i -= 1;
                j -= 1;
            } else if table[i * cols + j - 1] > table[(i - 1) * cols + j] {
                j -= 1;
            } else {
                i -= 1;
            }
        }
        positions
    }

    /// The linear-space walk chooses the same LCS positions as the full table, on random token
    /// sequences over small alphabets (many ties) and lengths 0–60, with full-table bands from
    /// 1 cell (every band split down to single rows) to whole tables.
    #[test]
    fn linear_space_lcs_chooses_rouge_scores_positions() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        for case in 0..3000 {
            let alphabet = rng.random_range(1..6u8);
            let mut seq = |n: usize| -> Vec<String> {
                (0..n)
                    .map(|_| ((b'a' + rng.random_range(0..alphabet)) as char).to_string())
                    .collect()
            };
            let (m, n) = (case % 61, (case * 7) % 53);
            let (a, b) = (seq(m), seq(n));
            let want = reference_lcs_positions(&a, &b);
            for block in [1, 7, 64, 1 << 22] {
                assert_eq!(
                    lcs_positions_blocked(&a, &b, block),
                    want,
                    "block {block}: {a:?} vs {b:?}"
                );
            }
        }
    }
}
