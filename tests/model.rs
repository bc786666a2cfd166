//! The decoder and perplexity through the cache, against independent references.

mod common;

use candle_core::{IndexOp, Tensor};
use kvbench::kv::{KvCache, KvScheme, Quant};
use kvbench::quality::perplexity::{perplexity, PplMode, PplProtocol, Scoring};
use kvbench::quality::wikitext::wikitext2_test_text;

/// Prefill 32 tokens into an fp16 cache, then decode 16 one at a time: the logits of every
/// position equal those of one uncached forward over all 48 tokens (plain candle attention over
/// f32 K/V). Tolerance: 0.05 absolute on logits of magnitude ~10–30, the error f16 K/V storage
/// introduces (relative 2⁻¹¹ per element); the greedy token must agree at every position.
#[test]
fn fp16_cached_decode_matches_uncached_forward() {
    let m = &common::smollm_f32().model;
    let tokens = &common::smollm_f32()
        .tokenizer
        .encode(wikitext2_test_text())
        .unwrap()[..48];
    let full = m.forward(tokens, 1, None).unwrap().squeeze(0).unwrap();
    let mut cache = KvCache::new(KvScheme::FP16, m.config.cache_geometry(), 1).unwrap();
    let prefill = m
        .forward(&tokens[..32], 1, Some(&mut cache))
        .unwrap()
        .squeeze(0)
        .unwrap();
    let mut rows = vec![prefill];
    for t in 32..48 {
        rows.push(
            m.forward(&tokens[t..t + 1], 1, Some(&mut cache))
                .unwrap()
                .squeeze(0)
                .unwrap(),
        );
    }
    let cached = Tensor::cat(&rows, 0).unwrap();
    let diff = common::max_abs_diff(&full, &cached);
    assert!(diff < 0.05, "max |Δlogit| = {diff}");
    let a = full.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    let b = cached.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    assert_eq!(a, b);
    // The cache holds exactly 48 tokens: 2 (K, V) × 30 layers × 3 kv heads × 128 bytes each.
    assert_eq!(cache.kv_bytes(), 48 * 2 * 30 * 3 * 128);
}

/// Same check for the batch dimension: two different sequences decoded together give the
/// logits each gives alone.
#[test]
fn batched_decode_matches_single_sequences() {
    let m = &common::smollm_f32().model;
    let all = common::smollm_f32()
        .tokenizer
        .encode(wikitext2_test_text())
        .unwrap();
    let (a, b) = (&all[100..120], &all[5000..5020]);
    let both: Vec<u32> = a.iter().chain(b).copied().collect();
    let mut cache = KvCache::new(
        KvScheme::plain(Quant::Int8Token),
        m.config.cache_geometry(),
        2,
    )
    .unwrap();
    let batched = m.forward(&both, 2, Some(&mut cache)).unwrap();
    for (i, seq) in [a, b].iter().enumerate() {
        let mut c1 = KvCache::new(
            KvScheme::plain(Quant::Int8Token),
            m.config.cache_geometry(),
            1,
        )
        .unwrap();
        let single = m
            .forward(seq, 1, Some(&mut c1))
            .unwrap()
            .squeeze(0)
            .unwrap();
        let diff = common::max_abs_diff(&batched.i(i).unwrap(), &single);
        assert!(diff < 1e-3, "sequence {i}: max |Δlogit| = {diff}");
    }
}

/// llama.cpp's `llama-perplexity` protocol on the first 4 windows: 512 tokens, no BOS (the
/// model's setting), the last 255 targets of each window scored, one prefill per window.
fn llama_cpp_protocol() -> PplProtocol {
    PplProtocol {
        mode: PplMode::Chunked,
        batch: 4,
        ctx: 512,
        windows: Some(4),
        scoring: Scoring::Half,
        bos: false,
    }
}

/// FP16-cache perplexity on the first 4 windows of WikiText-2 (llama.cpp protocol: 512-token
/// windows, no BOS, last 255 targets) equals the exact float32 reference with f16 K/V, 22.7453,
/// to well under 0.1 % (we require 0.02 %).
#[test]
fn fp16_perplexity_matches_float32_reference() {
    let lm = common::smollm_f32();
    let tokens = lm.tokenizer.encode(wikitext2_test_text()).unwrap();
    assert!(!lm.tokenizer.add_bos);
    let proto = llama_cpp_protocol();
    let r = perplexity(
        &lm.model,
        &tokens,
        KvScheme::FP16,
        &proto,
        lm.tokenizer.bos,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(r.scored_tokens, 4 * 255);
    let rel = (r.perplexity / 22.7453 - 1.0).abs();
    assert!(
        rel < 2e-4,
        "perplexity {} vs 22.7453 (rel {rel:.2e})",
        r.perplexity
    );
}

/// Quantized caches cost perplexity in the expected order and amount on the same 4 windows:
/// int8 per-token within 0.5 % of fp16 (llama.cpp's q8_0 costs 0.1 %), int4 group-32 between
/// 1 % and 15 % (llama.cpp's symmetric q4_0 without rotation costs 18 %).
#[test]
fn quantized_caches_cost_perplexity_in_order() {
    let lm = common::smollm_f32();
    let tokens = lm.tokenizer.encode(wikitext2_test_text()).unwrap();
    let proto = llama_cpp_protocol();
    let ppl = |s: KvScheme| {
        perplexity(&lm.model, &tokens, s, &proto, None, |_, _| {})
            .unwrap()
            .perplexity
    };
    let base = 22.7453;
    let int8 = ppl(KvScheme::plain(Quant::Int8Token)) / base - 1.0;
    let int4 = ppl(KvScheme::plain(Quant::Int4 { group: 32 })) / base - 1.0;
    assert!(int8.abs() < 0.005, "int8 Δ {int8}");
    assert!((0.01..0.15).contains(&int4), "int4 Δ {int4}");
}
