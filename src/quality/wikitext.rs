//! WikiText-2 raw test split, embedded in the binary (see `datasets/README.md` for source and
//! licence).

/// The raw file's bytes as shipped (1,290,590 bytes, sha256 `173c87a5…7dd08`).
pub const WIKITEXT2_TEST_RAW: &str = include_str!("../../datasets/wikitext-2-raw/wiki.test.raw");

/// The text llama.cpp's `llama-perplexity` tokenizes: the file minus its final newline.
pub fn wikitext2_test_text() -> &'static str {
    WIKITEXT2_TEST_RAW
        .strip_suffix('\n')
        .unwrap_or(WIKITEXT2_TEST_RAW)
}

/// Name recorded in `meta.json`.
pub const DATASET_NAME: &str = "wikitext-2-raw-v1 test (wiki.test.raw, minus final newline)";
