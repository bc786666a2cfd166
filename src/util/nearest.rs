//! Nearest valid names for a misspelt one ("did you mean …?"), for every list kvbench refuses
//! an unknown name from: scheme names (`kv::spec`), suite keys (`measure::settings`) and the
//! flags users bring from vLLM (`cli`). Levenshtein distance from the `strsim` crate (the one
//! clap uses for its own flag suggestions).

/// At most this many names are suggested.
pub const MAX_SUGGESTIONS: usize = 3;

/// The candidates nearest to `input` by Levenshtein distance (case-insensitive), closest first
/// and, among equals, in the order given; only those within `max(2, len/3)` edits of `input`
/// (len in characters), at most [`MAX_SUGGESTIONS`], each once. Empty when nothing is that
/// close (then a suggestion would only mislead).
pub fn nearest<'a>(input: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let input = input.to_ascii_lowercase();
    let limit = (input.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, usize, &'a str)> = Vec::new();
    for (i, c) in candidates.into_iter().enumerate() {
        if scored.iter().any(|&(_, _, s)| s == c) {
            continue;
        }
        let d = strsim::levenshtein(&input, &c.to_ascii_lowercase());
        if d <= limit {
            scored.push((d, i, c));
        }
    }
    scored.sort_by_key(|&(d, i, _)| (d, i));
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, _, c)| c)
        .collect()
}

/// `"; did you mean `a`, `b`?"` for [`nearest`]'s answer, or `""` when it has none: to append
/// to an error's reason, before the full list of valid names.
pub fn did_you_mean<'a>(input: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let near = nearest(input, candidates);
    if near.is_empty() {
        return String::new();
    }
    let list: Vec<String> = near.iter().map(|n| format!("`{n}`")).collect();
    format!("; did you mean {}?", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distances by hand: `int9` is one substitution from int8, int4 and int2 (in the order
    /// given), two from `in` and four from `fp16` (beyond the limit of 2).
    #[test]
    fn nearest_names_by_hand() {
        let names = ["fp16", "int8", "int4", "in", "int2", "int3"];
        assert_eq!(nearest("int9", names), ["int8", "int4", "int2"]);
        assert_eq!(nearest("INT9", names), ["int8", "int4", "int2"]);
        assert_eq!(nearest("fp61", ["fp16", "fp8"]), ["fp16", "fp8"]);
        assert!(nearest("zzzzzz", names).is_empty());
        assert_eq!(did_you_mean("zzzzzz", names), "");
        assert_eq!(
            did_you_mean("batch_sizes", ["seq-lens", "batch-sizes", "gen"]),
            "; did you mean `batch-sizes`?"
        );
    }
}
