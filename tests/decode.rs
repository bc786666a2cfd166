//! The decode path as a sweep times it: batched decode against one sequence at a time, the
//! interleaved order of the schemes' repeats, and the contention flag.

mod common;

use std::sync::OnceLock;

use kvbench::kv::{KvCache, KvScheme};
use kvbench::measure::sweep::{interleaved_point, PhaseModels, SweepSpec};
use kvbench::model::{self, argmax_rows, LoadedModel, WeightDtype};

/// The default model with its linear layers as stored (Q4_1: kvbench's own decode kernel).
fn native() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| {
        let path = model::fetch::ensure_default_model().expect("fetching the default model");
        model::load(path.to_str().unwrap(), WeightDtype::Native).expect("loading it")
    })
}

fn text_tokens(m: &LoadedModel, n: usize, skip: usize) -> Vec<u32> {
    let text = kvbench::quality::wikitext::WIKITEXT2_TEST_RAW;
    m.tokenizer.encode(&text[..20_000]).unwrap()[skip..skip + n].to_vec()
}

/// Four prompts decoded together (one batch, each weight block read once for all four) give
/// the logits of the same prompts decoded one at a time, and the same greedy tokens. The
/// tolerance: the rows differ only in float summation order (attention splits its key range
/// differently with one sequence than with four), measured at ~1e-4; 2e-3 leaves room while
/// far below a change in any greedy token (logit gaps here are > 0.05).
#[test]
fn batched_decode_equals_one_at_a_time() {
    let m = native();
    let g = m.model.config.cache_geometry();
    let (batch, len, steps) = (4usize, 24usize, 6usize);
    let prompts: Vec<Vec<u32>> = (0..batch).map(|b| text_tokens(m, len, 97 * b)).collect();
    // One at a time: prefill and decode each prompt alone.
    let mut alone_logits: Vec<Vec<Vec<f32>>> = Vec::new();
    let mut alone_tokens: Vec<Vec<u32>> = Vec::new();
    for p in &prompts {
        let mut cache = KvCache::new(KvScheme::FP16, g, 1).unwrap();
        let mut next = argmax_rows(&m.model.forward_last(p, 1, &mut cache).unwrap()).unwrap();
        let (mut logits, mut toks) = (Vec::new(), vec![next[0]]);
        for _ in 0..steps {
            let l = m.model.forward_last(&next, 1, &mut cache).unwrap();
            logits.push(l.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            next = argmax_rows(&l).unwrap();
            toks.push(next[0]);
        }
        alone_logits.push(logits);
        alone_tokens.push(toks);
    }
    // Together: the same prefills, stacked into one cache, decoded as a batch of 4.
    let mut parts = Vec::new();
    let mut next = Vec::new();
    for p in &prompts {
        let mut cache = KvCache::new(KvScheme::FP16, g, 1).unwrap();
        next.extend(argmax_rows(&m.model.forward_last(p, 1, &mut cache).unwrap()).unwrap());
        parts.push(cache);
    }
    let mut cache = KvCache::stack(parts).unwrap();
    let mut worst = 0f32;
    for step in 0..steps {
        let l = m.model.forward_last(&next, batch, &mut cache).unwrap();
        let rows = l.to_vec2::<f32>().unwrap();
        for b in 0..batch {
            let d = rows[b]
                .iter()
                .zip(&alone_logits[b][step])
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            worst = worst.max(d);
        }
        next = argmax_rows(&l).unwrap();
        for b in 0..batch {
            assert_eq!(
                next[b],
                alone_tokens[b][step + 1],
                "sequence {b}, step {step}"
            );
        }
    }
    assert!(worst < 2e-3, "max |Δlogit| batched vs alone = {worst}");
}

/// Three schemes × three repeats at one point run in rounds: each scheme's repeats take one
/// place in each round of three (places 0–2, 3–5, 6–8), every place is used once, and the
/// order is the same for the same seed.
#[test]
fn interleaved_repeats_record_their_order() {
    let m = native();
    let models = PhaseModels {
        prefill: &m.model,
        decode: &m.model,
        quality: &m.model,
    };
    let schemes: Vec<KvScheme> = ["fp16", "int8", "q4_0"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let mut spec = SweepSpec::timing_only(schemes.clone(), vec![1], vec![16], 3, 0);
    spec.repeats = 3;
    let prompts = text_tokens(m, 16, 5);
    let run = || -> Vec<Vec<usize>> {
        interleaved_point(models, &schemes, 1, 16, &spec, &prompts, 42)
            .into_iter()
            .map(|t| t.expect("every scheme runs").run_order)
            .collect()
    };
    let orders = run();
    let mut all: Vec<usize> = orders.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..9).collect::<Vec<_>>());
    for o in &orders {
        assert_eq!(o.len(), 3);
        for (round, &place) in o.iter().enumerate() {
            assert_eq!(place / 3, round, "{orders:?}");
        }
    }
    assert_eq!(run(), orders, "seeded");
}
