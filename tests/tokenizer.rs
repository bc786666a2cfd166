//! The tokenizer rebuilt from GGUF metadata against independent references.

mod common;

use kvbench::quality::wikitext::wikitext2_test_text;

/// Round trip is exact on ASCII, accented Latin, CJK, emoji, digits and whitespace runs.
#[test]
fn round_trip_ascii_accented_cjk() {
    let tok = &common::smollm_f32().tokenizer;
    for text in [
        "The quick brown fox jumps over the lazy dog. 1234567890!",
        "Crème brûlée, smörgåsbord, naïve façade — Ærøskøbing.",
        "日本語のテキストと中文文本，한국어 텍스트도。",
        "emoji 🦀🚀 and\ttabs\n\n  double  spaces   ",
    ] {
        let ids = tok.encode(text).unwrap();
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
}

/// Digits are split one per token (SmolLM's `Digits(individual_digits)` pre-tokenizer), and the
/// control token `<|im_start|>` is one id (1 in the GGUF vocabulary).
#[test]
fn digits_and_control_tokens() {
    let tok = &common::smollm_f32().tokenizer;
    let ids = tok.encode("2024").unwrap();
    assert_eq!(ids.len(), 4, "{ids:?}");
    let ids = tok.encode("<|im_start|>user").unwrap();
    assert_eq!(ids[0], 1, "{ids:?}");
    assert!(!tok.add_bos, "SmolLM2's GGUF says add_bos_token = false");
}

/// WikiText-2 test (minus the final newline): 303,415 tokens and the first 64 ids equal those of
/// llama.cpp's tokenizer (tests/data/wikitext2_test_tokens.json).
#[test]
fn wikitext2_tokens_match_reference() {
    let tok = &common::smollm_f32().tokenizer;
    let ids = tok.encode(wikitext2_test_text()).unwrap();
    let (n, first) = common::reference_tokens();
    assert_eq!(ids.len(), n);
    assert_eq!(&ids[..64], &first[..]);
}
