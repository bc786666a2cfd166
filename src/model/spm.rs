//! SentencePiece (Kudo & Richardson 2018) tokenizers from GGUF metadata
//! (`tokenizer.ggml.model = llama`: Llama 1/2, Gemma), rebuilt with the `tokenizers` crate the
//! way Hugging Face converts a SentencePiece BPE model (`SentencePieceExtractor` in
//! `transformers/convert_slow_tokenizer.py`): every split of a piece into two pieces of the
//! vocabulary is a merge ranked by the piece's score (highest first), so byte-pair merging
//! with those ranks picks, at each step, the adjacent pair whose merged piece scores highest —
//! what llama.cpp's `llm_tokenizer_spm` does (`llama-vocab.cpp`) — and characters outside the
//! vocabulary fall back to `<0xXX>` byte tokens.
//!
//! Around the model: spaces become `▁` (U+2581) and, when `tokenizer.ggml.add_space_prefix` is
//! true (the default in llama.cpp), a `▁` is prepended (Gemma 3 sets it false); control (type 3)
//! and user-defined (type 4) tokens are matched in the raw text first, as llama.cpp's
//! special-token partition does (Gemma's runs of newlines, spaces and tabs, HTML tags). BOS per
//! `tokenizer.ggml.add_bos_token` (default true for SentencePiece, as in llama.cpp).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::Sequence as NormalizerSequence;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, Tokenizer};

use super::gguf::GgufFile;
use super::tokenizer::TextTokenizer;
use crate::error::{Error, Result};

/// GGUF token type of a control token (`<bos>`, `<start_of_turn>`).
const CONTROL: i32 = 3;
/// GGUF token type of a user-defined token (matched in raw text before SentencePiece).
const USER_DEFINED: i32 = 4;
/// GGUF token type of a byte-fallback token `<0xXX>`.
const BYTE: i32 = 6;

/// The merges a SentencePiece BPE vocabulary implies: for every piece (in descending score
/// order; ties by id) each split `(left, right)` with both halves in the vocabulary, halves
/// ordered by their ids — Hugging Face's `SentencePieceExtractor.extract`. Byte tokens take no
/// part. `tokens[i]`, `scores[i]`, `types[i]`: id `i`'s piece, score and GGUF type.
pub fn merges_from_scores(
    tokens: &[String],
    scores: &[f32],
    types: &[i32],
) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types.get(*i) != Some(&BYTE))
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut order: Vec<usize> = (0..tokens.len())
        .filter(|&i| types.get(i) != Some(&BYTE))
        .collect();
    // Stable: equal scores keep id order.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let mut merges = Vec::new();
    for i in order {
        let piece = &tokens[i];
        let mut local: Vec<(usize, usize, &str, &str)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some((*ids.get(l)?, *ids.get(r)?, l, r))
            })
            .collect();
        local.sort_unstable();
        merges.extend(
            local
                .into_iter()
                .map(|(_, _, l, r)| (l.to_string(), r.to_string())),
        );
    }
    merges
}

/// Builds the tokenizer from `tokenizer.ggml.{tokens, scores, token_type, bos_token_id,
/// eos_token_id, unknown_token_id, add_bos_token, add_space_prefix}` of a GGUF whose
/// `tokenizer.ggml.model` is `llama`. Errors: [`Error::Unsupported`] for another tokenizer
/// model; [`Error::ModelFormat`] for missing or inconsistent arrays; [`Error::Tokenizer`] when
/// the `tokenizers` crate refuses the vocabulary.
pub fn from_gguf<R: std::io::Read + std::io::Seek>(
    f: &GgufFile<R>,
    path: &Path,
) -> Result<TextTokenizer> {
    let bad = |reason: String| Error::ModelFormat {
        path: path.to_path_buf(),
        reason,
    };
    let model = match f.meta("tokenizer.ggml.model")? {
        Value::String(s) => s.as_str(),
        v => return Err(bad(format!("tokenizer.ggml.model is {v:?}"))),
    };
    if model != "llama" {
        return Err(Error::Unsupported(format!(
            "GGUF tokenizer model `{model}` in {}: this builder reads SentencePiece (`llama`)",
            path.display()
        )));
    }
    let array = |key: &str| -> Result<&Vec<Value>> {
        match f.meta(key)? {
            Value::Array(v) => Ok(v),
            v => Err(bad(format!(
                "metadata `{key}` is {:?}, not an array",
                v.value_type()
            ))),
        }
    };
    let tokens: Vec<String> = array("tokenizer.ggml.tokens")?
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(bad("tokenizer.ggml.tokens holds a non-string".into())),
        })
        .collect::<Result<_>>()?;
    let scores: Vec<f32> = array("tokenizer.ggml.scores")?
        .iter()
        .map(|v| match v {
            Value::F32(x) => Ok(*x),
            _ => Err(bad("tokenizer.ggml.scores holds a non-f32".into())),
        })
        .collect::<Result<_>>()?;
    let types: Vec<i32> = match f.meta("tokenizer.ggml.token_type") {
        Ok(Value::Array(v)) => v
            .iter()
            .map(|t| match t {
                Value::I32(x) => Ok(*x),
                Value::U32(x) => Ok(*x as i32),
                _ => Err(bad("tokenizer.ggml.token_type holds a non-integer".into())),
            })
            .collect::<Result<_>>()?,
        _ => vec![1; tokens.len()],
    };
    if scores.len() != tokens.len() || types.len() != tokens.len() {
        return Err(bad(format!(
            "{} tokens but {} scores and {} token types",
            tokens.len(),
            scores.len(),
            types.len()
        )));
    }
    let id = |key: &str| -> Option<u32> {
        match f.meta(key).ok()? {
            Value::U32(x) => Some(*x),
            Value::I32(x) => u32::try_from(*x).ok(),
            _ => None,
        }
        .filter(|&i| (i as usize) < tokens.len())
    };
    let flag = |key: &str, default: bool| -> bool {
        match f.meta(key) {
            Ok(Value::Bool(b)) => *b,
            _ => default,
        }
    };
    let (bos, eos) = (
        id("tokenizer.ggml.bos_token_id"),
        id("tokenizer.ggml.eos_token_id"),
    );
    let unk = id("tokenizer.ggml.unknown_token_id");
    let add_bos = flag("tokenizer.ggml.add_bos_token", true);
    let space_prefix = flag("tokenizer.ggml.add_space_prefix", true);
    let inner = build(&tokens, &scores, &types, unk, space_prefix)?;
    Ok(TextTokenizer::from_parts(
        inner,
        bos,
        eos,
        add_bos,
        format!(
            "gguf SentencePiece (BPE merges from scores, byte fallback), add_space_prefix {space_prefix}"
        ),
    ))
}

/// The `tokenizers` pipeline: normalizer (prepend `▁` if `space_prefix`, spaces → `▁`), no
/// pre-tokenizer, BPE with merges from scores and byte fallback, control and user-defined
/// tokens as special tokens matched in the raw text; the decoder undoes `▁` and byte tokens.
fn build(
    tokens: &[String],
    scores: &[f32],
    types: &[i32],
    unk: Option<u32>,
    space_prefix: bool,
) -> Result<Tokenizer> {
    let tk = |e: tokenizers::Error| Error::Tokenizer(e.to_string());
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = merges_from_scores(tokens, scores, types);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk {
        builder = builder.unk_token(tokens[u as usize].clone());
    }
    let bpe = builder.build().map_err(tk)?;
    let mut inner = Tokenizer::new(bpe);
    let mut norms: Vec<NormalizerWrapper> = Vec::new();
    if space_prefix {
        norms.push(Prepend::new("▁".into()).into());
    }
    norms.push(Replace::new(" ", "▁").map_err(tk)?.into());
    inner
        .with_normalizer(Some(NormalizerSequence::new(norms)))
        .map_err(tk)?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ").map_err(tk)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    let specials: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, &t)| t == CONTROL || t == USER_DEFINED)
        .map(|(s, _)| AddedToken::from(s.clone(), true))
        .collect();
    inner.add_special_tokens(specials).map_err(tk)?;
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A five-piece vocabulary by hand: "ab" scores above "bc", so "abc" is "ab" + "c", and
    /// "cab" is "c" + "ab"; an unknown "é" becomes its two UTF-8 bytes.
    #[test]
    fn merges_follow_scores() {
        let mut tokens: Vec<String> = ["<unk>", "a", "b", "c", "ab", "bc", "▁", "▁a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut scores = vec![0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0];
        let mut types = vec![2, 1, 1, 1, 1, 1, 1, 1];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(BYTE);
        }
        let m = merges_from_scores(&tokens, &scores, &types);
        assert_eq!(
            m,
            vec![
                ("a".to_string(), "b".to_string()),
                ("b".to_string(), "c".to_string()),
                ("▁".to_string(), "a".to_string())
            ]
        );
        let t = build(&tokens, &scores, &types, Some(0), false).unwrap();
        let ids = |s: &str| t.encode(s, false).unwrap().get_ids().to_vec();
        assert_eq!(ids("abc"), vec![4, 3]);
        assert_eq!(ids("cab"), vec![3, 4]);
        assert_eq!(ids(" a"), vec![7]);
        // é = C3 A9: byte tokens 8 + 0xC3, 8 + 0xA9.
        assert_eq!(ids("é"), vec![8 + 0xC3, 8 + 0xA9]);
        assert_eq!(t.decode(&[7, 8 + 0xC3, 8 + 0xA9], false).unwrap(), " aé");
    }
}
