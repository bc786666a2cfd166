//! Text ↔ token ids: a `tokenizers` tokenizer plus the BOS policy the model file states.
//!
//! From GGUF, the tokenizer is rebuilt from `tokenizer.ggml.*` metadata as Hugging Face's
//! byte-level BPE (GPT-2, Radford et al. 2019 §2.2): vocabulary and merges, the pre-tokenizer
//! named by `tokenizer.ggml.pre` (the regexes llama.cpp's `llama-vocab.cpp` uses for that name),
//! and control tokens as special tokens.

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Error, Result};

/// Llama 3's pre-tokenizer regex (`tokenizer.ggml.pre = llama-bpe`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer regex (`tokenizer.ggml.pre = qwen2`): single digits.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A tokenizer with the model's BOS policy.
#[derive(Debug, Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Beginning-of-sequence id, if the vocabulary has one.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Whether the model expects a BOS at the start of a sequence (GGUF
    /// `tokenizer.ggml.add_bos_token`; for tokenizer.json, whether its post-processor adds one).
    pub add_bos: bool,
    /// Where the tokenizer came from (`gguf:<pre>` or the tokenizer.json path), for `meta.json`.
    pub description: String,
    /// The model's chat template (Jinja, as in GGUF `tokenizer.chat_template` or
    /// `tokenizer_config.json`), if it has one.
    pub chat_template: Option<String>,
}

impl TextTokenizer {
    /// Builds byte-level BPE from GGUF vocabulary arrays.
    ///
    /// `tokens[i]` is the string of id `i`; `merges` are `"left right"` pairs in priority order;
    /// `types` are GGUF token types (3 = control, 4 = user-defined: both matched as special
    /// tokens). Errors: [`Error::Unsupported`] for a `pre` kvbench has no regex for.
    pub fn from_gguf_vocab(
        tokens: &[String],
        merges: &[String],
        types: &[i32],
        pre: &str,
        bos: Option<u32>,
        eos: Option<u32>,
        add_bos: bool,
    ) -> Result<Self> {
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges: Vec<(String, String)> = merges
            .iter()
            .filter_map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect();
        let tk = |e: tokenizers::Error| Error::Tokenizer(e.to_string());
        let mut builder = BPE::builder().vocab_and_merges(vocab, merges);
        if pre == "llama-bpe" {
            builder = builder.ignore_merges(true);
        }
        let bpe = builder.build().map_err(tk)?;
        let split = |re: &str| -> Result<PreTokenizerWrapper> {
            Ok(Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(tk)?
            .into())
        };
        let pre_tok: PreTokenizerWrapper = match pre {
            // GPT-2's own regex inside ByteLevel.
            "default" | "gpt2" | "gpt-2" => ByteLevel::new(false, true, true).into(),
            // StarCoder-family (SmolLM): each digit alone, then GPT-2's regex.
            "smollm" | "starcoder" | "refact" => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            "llama-bpe" | "llama3" => Sequence::new(vec![
                split(LLAMA3_REGEX)?,
                ByteLevel::new(false, true, false).into(),
            ])
            .into(),
            "qwen2" => Sequence::new(vec![
                split(QWEN2_REGEX)?,
                ByteLevel::new(false, true, false).into(),
            ])
            .into(),
            other => {
                return Err(Error::Unsupported(format!(
                    "GGUF pre-tokenizer `{other}` (supported: default, gpt2, smollm, starcoder, \
                     refact, llama-bpe, qwen2); pass a folder with tokenizer.json instead"
                )))
            }
        };
        let mut inner = Tokenizer::new(bpe);
        if pre == "qwen2" {
            inner.with_normalizer(Some(NFC)).map_err(tk)?;
        }
        inner.with_pre_tokenizer(Some(pre_tok));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|(_, &t)| t == 3 || t == 4)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        inner.add_special_tokens(specials).map_err(tk)?;
        Ok(Self {
            inner,
            bos,
            eos,
            add_bos,
            description: format!("gguf byte-level BPE, pre-tokenizer `{pre}`"),
            chat_template: None,
        })
    }

    /// Wraps a tokenizer built elsewhere (e.g. SentencePiece from GGUF, [`super::spm`]) with its
    /// BOS/EOS policy; `description` is recorded in `meta.json`. No chat template.
    pub fn from_parts(
        inner: Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
        add_bos: bool,
        description: String,
    ) -> Self {
        Self {
            inner,
            bos,
            eos,
            add_bos,
            description,
            chat_template: None,
        }
    }

    /// Loads a `tokenizer.json`. The BOS policy is read from its post-processor: if encoding the
    /// empty string with special tokens yields a leading token, that token is the BOS.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = Tokenizer::from_file(path).map_err(|e| Error::ModelFormat {
            path: path.to_path_buf(),
            reason: format!("not a readable tokenizer.json ({e})"),
        })?;
        let probe = inner
            .encode("", true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let bos = probe.get_ids().first().copied();
        Ok(Self {
            inner,
            bos,
            eos: None,
            add_bos: bos.is_some(),
            description: path.display().to_string(),
            chat_template: path
                .parent()
                .map(|d| d.join("tokenizer_config.json"))
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v["chat_template"].as_str().map(str::to_string)),
        })
    }

    /// Token ids of `text`, without BOS or other added tokens (special-token strings in the text
    /// are matched as their ids).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec())
    }

    /// The prompt for one user turn: the chat template rendered (minijinja, as mistral.rs and
    /// llama.cpp's Jinja mode do) with `messages = [{role: "user", content: user}]` and
    /// `add_generation_prompt = true`; without a template, `user` itself. Errors:
    /// [`Error::Tokenizer`] when the template does not render, with minijinja's message.
    pub fn chat_prompt(&self, user: &str) -> Result<String> {
        let Some(template) = &self.chat_template else {
            return Ok(user.to_string());
        };
        let mut env = minijinja::Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        let tok = |id: Option<u32>| {
            id.and_then(|i| self.inner.id_to_token(i))
                .unwrap_or_default()
        };
        env.render_str(
            template,
            minijinja::context! {
                messages => vec![minijinja::context! { role => "user", content => user }],
                add_generation_prompt => true,
                bos_token => tok(self.bos),
                eos_token => tok(self.eos),
            },
        )
        .map_err(|e| Error::Tokenizer(format!("chat template: {e}")))
    }

    /// Ids that end a generated turn: EOS and the end-of-turn tokens of common chat formats
    /// (`<|im_end|>`, `<|eot_id|>`, `<|end|>`, `</s>`, `<|endoftext|>`) that are in the vocabulary.
    pub fn stop_tokens(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos.into_iter().collect();
        for t in [
            "<|im_end|>",
            "<|eot_id|>",
            "<|end|>",
            "</s>",
            "<|endoftext|>",
        ] {
            if let Some(id) = self.inner.token_to_id(t) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    /// Text of `ids` (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Writes the tokenizer as a `tokenizer.json` (e.g. to turn a GGUF into a safetensors folder).
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner
            .save(path, false)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
