//! Generation-based quality tasks on the default model: the chat template, the passkey
//! generator's placement, and retrieval through a full and an evicting cache.

mod common;

use kvbench::quality::generate::greedy;
use kvbench::quality::passkey::{self, first_integer, PasskeySpec};

/// SmolLM2's GGUF template rendered for one user turn equals the ChatML text written out by
/// hand from the template (its default system prompt, then the user turn, then the assistant
/// header), and `<|im_end|>` ends a turn.
#[test]
fn chat_template_renders_chatml() {
    let tok = &common::smollm_f32().tokenizer;
    let got = tok.chat_prompt("Hi").unwrap();
    let want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(got, want);
    let im_end = tok.encode("<|im_end|>").unwrap();
    assert_eq!(im_end.len(), 1);
    assert!(tok.stop_tokens().contains(&im_end[0]));
}

/// Every prompt of a length has the same number of tokens (≤ the length); the needle starts at
/// prefix + round(d·n) filler units, decodes to the key sentence, and sits at the stated depth
/// of the haystack to within one filler unit.
#[test]
fn passkey_needle_at_the_stated_depth() {
    let tok = &common::smollm_f32().tokenizer;
    let spec = PasskeySpec {
        lengths: vec![256, 1024],
        depths: vec![0.0, 25.0, 50.0, 75.0, 100.0],
        trials: 2,
        seed: 7,
    };
    let prompts = passkey::prompts(tok, &spec).unwrap();
    assert_eq!(prompts.len(), 2 * 5 * 2);
    let prefix = tok.encode(passkey::PREFIX).unwrap().len();
    let unit = tok.encode(passkey::FILLER).unwrap().len();
    for p in &prompts {
        let same_len = prompts.iter().filter(|q| q.length == p.length);
        assert!(same_len.clone().all(|q| q.tokens.len() == p.tokens.len()));
        assert!(p.tokens.len() <= p.length);
        let (before, n) = p.units;
        assert_eq!(before, (p.depth_pct / 100.0 * n as f64).round() as usize);
        assert_eq!(p.needle_at, prefix + before * unit);
        let depth = (p.needle_at - prefix) as f64 / (n * unit) as f64;
        assert!(
            (depth - p.depth_pct / 100.0).abs() <= 1.0 / n as f64,
            "{depth} vs {}",
            p.depth_pct
        );
        let text = tok
            .decode(&p.tokens[p.needle_at..p.needle_at + 12])
            .unwrap();
        assert!(
            text.starts_with(&format!(" The pass key is {}", p.key)),
            "{text}"
        );
        assert!((10_000..100_000).contains(&p.key));
    }
    assert!(passkey::prompts(
        tok,
        &PasskeySpec {
            lengths: vec![40],
            ..spec.clone()
        }
    )
    .unwrap_err()
    .to_string()
    .contains("--passkey-lengths"));
}

/// The fp16 cache retrieves a key from the middle of a 512-token haystack; a 64-token sliding
/// window (4 sinks) cannot, because the key was evicted, but still retrieves one placed last.
#[test]
fn retrieval_through_full_and_evicting_caches() {
    let m = common::smollm_f32();
    let spec = PasskeySpec {
        lengths: vec![512],
        depths: vec![50.0, 100.0],
        trials: 1,
        seed: 3,
    };
    let prompts = passkey::prompts(&m.tokenizer, &spec).unwrap();
    let stop = m.tokenizer.stop_tokens();
    let answer = |scheme: &str, p: &passkey::PasskeyPrompt| {
        let ids = greedy(&m.model, scheme.parse().unwrap(), &p.tokens, 8, &stop).unwrap();
        first_integer(&m.tokenizer.decode(&ids).unwrap())
    };
    assert_eq!(answer("fp16", &prompts[0]), Some(prompts[0].key as u64));
    assert_ne!(
        answer("window:size=64,sinks=4", &prompts[0]),
        Some(prompts[0].key as u64)
    );
    assert_eq!(
        answer("window:size=64,sinks=4", &prompts[1]),
        Some(prompts[1].key as u64)
    );
}
