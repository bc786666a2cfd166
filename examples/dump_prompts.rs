//! Prints the prompts `kvbench sweep` times, as token ids, so another engine can be timed on the
//! very same tokens (`scripts/compare-llamacpp.sh` feeds them to llama.cpp).
//!
//! ```text
//! cargo run --release --example dump_prompts -- MODEL SEED BATCHxSEQ_LEN...
//! cargo run --release --example dump_prompts -- default 0 1x512 4x512 8x512 1x4096
//! ```
//!
//! `MODEL` is what `kvbench sweep --model` takes, `SEED` its `--seed`. The prompts are
//! [`kvbench::measure::sweep::prompts`] over the WikiText-2 test text tokenized by the model's own
//! tokenizer, exactly as the sweep builds them (no BOS: the sweep prepends none). Output on
//! stdout, one JSON object:
//! `{"model", "seed", "prompts": [{"batch", "seq_len", "tokens": [[u32; seq_len]; batch]}]}`.
//! Exit codes: 0 ok, 1 the model or tokenizer failed to load, 2 bad arguments.

use kvbench::measure::sweep::prompts;
use kvbench::model::{self, WeightDtype};
use kvbench::quality::wikitext::wikitext2_test_text;

const USAGE: &str = "usage: dump_prompts MODEL SEED BATCHxSEQ_LEN... (e.g. default 0 1x512 4x512)";

/// `"4x512"` → `(4, 512)`; both ≥ 1.
fn parse_point(s: &str) -> Option<(usize, usize)> {
    let (b, l) = s.split_once('x')?;
    let (b, l) = (b.parse().ok()?, l.parse().ok()?);
    (b >= 1 && l >= 1).then_some((b, l))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bad = |msg: String| -> ! {
        eprintln!("dump_prompts: {msg}\n{USAGE}");
        std::process::exit(2)
    };
    if args.len() < 3 {
        bad("give a model, a seed and at least one point".into());
    }
    let seed: u64 = args[1]
        .parse()
        .unwrap_or_else(|_| bad(format!("seed `{}` is not an unsigned integer", args[1])));
    let points: Vec<(usize, usize)> = args[2..]
        .iter()
        .map(|p| {
            parse_point(p)
                .unwrap_or_else(|| bad(format!("point `{p}` is not BATCHxSEQ_LEN with both ≥ 1")))
        })
        .collect();
    let loaded = model::load(&args[0], WeightDtype::Native).unwrap_or_else(|e| {
        eprintln!("dump_prompts: loading model `{}`: {e}", args[0]);
        std::process::exit(1)
    });
    let tokens = loaded
        .tokenizer
        .encode(wikitext2_test_text())
        .unwrap_or_else(|e| {
            eprintln!("dump_prompts: tokenizing WikiText-2: {e}");
            std::process::exit(1)
        });
    let mut out = Vec::with_capacity(points.len());
    for (batch, seq_len) in points {
        if seq_len >= tokens.len() {
            bad(format!(
                "seq_len {seq_len} is longer than the prompt text ({} tokens)",
                tokens.len()
            ));
        }
        let flat = prompts(&tokens, batch, seq_len, seed);
        let rows: Vec<&[u32]> = flat.chunks(seq_len).collect();
        out.push(serde_json::json!({"batch": batch, "seq_len": seq_len, "tokens": rows}));
    }
    let doc = serde_json::json!({"model": args[0], "seed": seed, "prompts": out});
    println!("{doc}");
}
