//! KV schemes on the real model: decode-exact evaluation and variable-length batches.

mod common;

use kvbench::kv::{KvCache, KvScheme};
use kvbench::quality::perplexity::{perplexity, token_nll, PplMode, PplProtocol, Scoring};
use kvbench::quality::wikitext::wikitext2_test_text;

fn tokens() -> Vec<u32> {
    common::smollm_f32()
        .tokenizer
        .encode(wikitext2_test_text())
        .unwrap()
}

/// For per-token quantizers without eviction, feeding windows token by token (decode mode,
/// windows batched) stores the same rows as one prefill per window, so perplexities agree up to
/// float summation order: relative 1e-4 for fp16. Quantized formats amplify that order noise —
/// a K value that moves by 1e-6 can cross a rounding boundary and change its code by one step —
/// and coarse formats more (measured here: int8 1.1e-3, fp8 4.4e-3, q4_0 1.7e-2 on 94 scored
/// tokens), so the model-level check covers fp16 (1e-4) and int8 (5e-3); that the stored rows
/// themselves do not depend on chunking is checked exactly, for every per-token format, by
/// `kv::tests::per_token_formats_are_chunking_invariant`.
#[test]
fn decode_and_chunked_perplexity_agree_for_per_token_quantizers() {
    let lm = common::smollm_f32();
    let toks = tokens();
    let mut report: Vec<(&str, f64, f64, f64, f64)> = Vec::new();
    for spec in ["fp16", "int8-token"] {
        let s: KvScheme = spec.parse().unwrap();
        let ppl = |mode| {
            let proto = PplProtocol {
                mode,
                batch: 2,
                ctx: 96,
                windows: Some(2),
                scoring: Scoring::Half,
                bos: false,
                exact_attention: true,
            };
            perplexity(&lm.model, &toks, s, &proto, None, |_, _| {}).unwrap()
        };
        let (c, d) = (ppl(PplMode::Chunked), ppl(PplMode::Decode));
        assert_eq!(d.mode, PplMode::Decode);
        let rel = (c.perplexity / d.perplexity - 1.0).abs();
        let tol = if spec == "fp16" { 1e-4 } else { 5e-3 };
        report.push((spec, c.perplexity, d.perplexity, rel, tol));
    }
    for (spec, c, d, rel, tol) in &report {
        assert!(
            rel < tol,
            "{spec}: chunked {c} vs decode {d} (rel {rel:.1e}); all: {report:?}"
        );
    }
}

/// Eviction acts in decode mode: a sliding window shorter than the scored span costs
/// perplexity there, while in chunked mode (one prefill, eviction after it) it cannot.
#[test]
fn eviction_changes_decode_mode_perplexity() {
    let lm = common::smollm_f32();
    let toks = tokens();
    let run = |spec: &str, mode| {
        let proto = PplProtocol {
            mode,
            batch: 2,
            ctx: 128,
            windows: Some(2),
            scoring: Scoring::Half,
            bos: false,
            exact_attention: true,
        };
        perplexity(
            &lm.model,
            &toks,
            spec.parse().unwrap(),
            &proto,
            None,
            |_, _| {},
        )
        .unwrap()
        .perplexity
    };
    let base = run("fp16", PplMode::Chunked);
    let win = "window:size=16,sinks=4";
    assert!((run(win, PplMode::Chunked) / base - 1.0).abs() < 1e-4);
    assert!(run(win, PplMode::Decode) > base * 1.05);
}

/// A batch of different-length prompts (prefilled one at a time, then decoded together) gives
/// the same per-token NLL as each prompt run alone — with an eviction scheme, so per-sequence
/// positions, budgets and scores are all exercised. Tolerance 2e-3 nats: f32 matmuls sum in a
/// different order at batch 2 than at batch 1 (measured ≤ 8e-4 here); a wrong position or a
/// shared budget changes NLLs by far more. (Over int8 storage the same run differs by up to
/// 0.02 nats, because such tiny differences move some int8 codes by one step.)
#[test]
#[allow(clippy::needless_range_loop)] // `i` indexes both the token stream and the NLL record
fn different_length_prompts_batched_equal_one_at_a_time() {
    let m = &common::smollm_f32().model;
    let toks = tokens();
    let scheme: KvScheme = "h2o:budget=24,recent=4".parse().unwrap();
    let geom = m.config.cache_geometry();
    let prompts = [&toks[1000..1020], &toks[3000..3033]];
    let steps = 10;
    let follow = |p: usize, i: usize| toks[[1020, 3033][p] + i];
    // Alone.
    let mut alone = Vec::new();
    for (p, prompt) in prompts.iter().enumerate() {
        let mut c = KvCache::new(scheme, geom, 1).unwrap();
        m.forward_hidden(prompt, 1, Some(&mut c)).unwrap();
        let mut nll = Vec::new();
        for i in 0..steps {
            let h = m.forward_hidden(&[follow(p, i)], 1, Some(&mut c)).unwrap();
            let l = m.logits(&h.squeeze(1).unwrap()).unwrap();
            nll.push(token_nll(&l, &[follow(p, i + 1)]).unwrap()[0]);
        }
        alone.push(nll);
    }
    // Together.
    let parts = prompts
        .iter()
        .map(|prompt| {
            let mut c = KvCache::new(scheme, geom, 1).unwrap();
            m.forward_hidden(prompt, 1, Some(&mut c)).unwrap();
            c
        })
        .collect();
    let mut c = KvCache::stack(parts).unwrap();
    assert_eq!((c.seen(0), c.seen(1)), (20, 33));
    for i in 0..steps {
        let h = m
            .forward_hidden(&[follow(0, i), follow(1, i)], 2, Some(&mut c))
            .unwrap();
        let l = m.logits(&h.squeeze(1).unwrap()).unwrap();
        let nll = token_nll(&l, &[follow(0, i + 1), follow(1, i + 1)]).unwrap();
        for p in 0..2 {
            assert!(
                (nll[p] - alone[p][i]).abs() < 2e-3,
                "prompt {p} step {i}: {} vs {}",
                nll[p],
                alone[p][i]
            );
        }
    }
}

/// What scoring int8/4-bit keys on their codes (int8 queries, the path decode steps are timed
/// with) costs in quality, against the exact f32 path on the same windows: per scheme the
/// change in perplexity and in mean KL against fp16 (lockstep), printed for the README
/// (`--nocapture`). Measured: int8-token −0.11 %, +3.2e-4 nats; q8_0 −0.04 %, +2.2e-4 —
/// more than the 0.02 % / 1e-4 nats a quality number may move, which is why every quality
/// measurement runs the exact path. The 8-bit costs are bounded here (0.5 %, 1e-3 nats: a
/// broken path fails). 4-bit perplexity and KL on two windows move by percents with any
/// float-level change (rounding boundaries amplify it through the layers: replacing libm's exp
/// by a vectorized one moved int4 by −1.8 %), so their costs are printed, not bounded.
/// Issue #24's code paths (KIVI channel keys, 4-bit TurboQuant with its int8-rounded codebook,
/// turboquant-prod's split rows, 2-bit values) are printed the same way; int8-channel, 8-bit,
/// is bounded like the others.
#[test]
fn codes_path_quality_cost_is_small() {
    use kvbench::quality::perplexity::perplexity_vs;
    let lm = common::smollm_f32();
    let toks = tokens();
    for spec in [
        "int8-token",
        "q8_0",
        "int4",
        "q4_0",
        "int8-channel",
        "int4-channel",
        "int2-channel",
        "turboquant",
        "turboquant-prod",
    ] {
        let s: KvScheme = spec.parse().unwrap();
        let run = |exact| {
            let proto = PplProtocol {
                mode: PplMode::Chunked,
                batch: 1,
                ctx: 256,
                windows: Some(2),
                scoring: Scoring::Half,
                bos: false,
                exact_attention: exact,
            };
            perplexity_vs(
                &lm.model,
                &toks,
                s,
                Some(KvScheme::FP16),
                &proto,
                None,
                |_, _| {},
            )
            .unwrap()
        };
        let (e, c) = (run(true), run(false));
        let dppl = 100.0 * (c.perplexity / e.perplexity - 1.0);
        let (ke, kc) = (
            e.agreement.as_ref().unwrap().kl_mean,
            c.agreement.as_ref().unwrap().kl_mean,
        );
        println!(
            "{spec}: ppl exact {:.4} codes {:.4} ({dppl:+.3} %), KL vs fp16 exact {ke:.5} codes {kc:.5} ({:+.1e} nats)",
            e.perplexity,
            c.perplexity,
            kc - ke
        );
        if ["int8-token", "q8_0", "int8-channel"].contains(&spec) {
            assert!(dppl.abs() < 0.5, "{spec}: {dppl} %");
            assert!((kc - ke).abs() < 1e-3, "{spec}: KL {ke} → {kc}");
        }
    }
}

/// Issue #15: the new schemes (TurboQuant's MSE and QJL rows and vLLM's presets, 2-bit KIVI
/// and the K≠V presets) run through the real model and give finite perplexity above 1, and the
/// cache they fill holds exactly their byte formula. Checked against fp16 (the reference): a
/// 2-bit or 3-bit cache cannot beat it by more than float noise (ppl ≥ 0.99 × fp16), and none of
/// them may be wildly off (≤ 10× fp16; the paper's 3.5-bit TurboQuant is quality-neutral on
/// LongBench, 2-bit KIVI within a few percent).
#[test]
fn issue_15_new_schemes_run_through_the_model() {
    let lm = common::smollm_f32();
    let toks = tokens();
    let proto = PplProtocol {
        mode: PplMode::Chunked,
        batch: 1,
        ctx: 192,
        windows: Some(1),
        scoring: Scoring::Half,
        bos: false,
        exact_attention: true,
    };
    let run = |spec: &str| {
        let s: KvScheme = spec.parse().unwrap();
        perplexity(&lm.model, &toks, s, &proto, None, |_, _| {})
            .unwrap()
            .perplexity
    };
    let base = run("fp16");
    for spec in [
        "turboquant_4bit_nc",
        "turboquant_k3v4_nc",
        "turboquant_3bit_nc",
        "turboquant_k8v4",
        "turboquant-prod",
        "int2-channel:group=32,residual=32",
        "k4v2",
        "k2v4",
    ] {
        let p = run(spec);
        println!("{spec}: ppl {p:.4} (fp16 {base:.4})");
        assert!(p.is_finite() && p > 1.0, "{spec}: {p}");
        assert!(p <= 10.0 * base, "{spec}: {p} vs fp16 {base}");
        if spec.contains("3bit") || spec.contains("int2") {
            assert!(p >= 0.99 * base, "{spec}: {p} below fp16 {base}");
        }
    }
    // The cache after a prompt holds exactly the formula.
    let g = lm.model.config.cache_geometry();
    for spec in ["turboquant_3bit_nc", "k2v4"] {
        let s: KvScheme = spec.parse().unwrap();
        let mut c = KvCache::new(s, g, 1).unwrap();
        lm.model.forward_last(&toks[..200], 1, &mut c).unwrap();
        assert_eq!(c.kv_bytes(), s.bytes_for(&g, 1, 200), "{spec}");
    }
}

/// `--ppl-noise-floor`'s rerun (issue #15): a model whose layer inputs are moved one ulp at
/// random gives a perplexity that (a) is the same for the same seed, (b) differs for another
/// seed, so the spread over reruns is above 0, (c) stays within 1 % of the plain one for the
/// fp16 cache (noise at rounding level, not a different model), and (d) leaves the plain model
/// untouched (the hook is off unless asked for).
#[test]
fn noise_floor_rerun_is_seeded_and_nonzero() {
    use kvbench::quality::paired::noise_floor;
    let lm = common::smollm_f32();
    let toks = tokens();
    let proto = PplProtocol {
        mode: PplMode::Chunked,
        batch: 1,
        ctx: 64,
        windows: Some(2),
        scoring: Scoring::Half,
        bos: false,
        exact_attention: true,
    };
    let ppl = |m: &kvbench::model::Model| {
        perplexity(m, &toks, KvScheme::FP16, &proto, None, |_, _| {})
            .unwrap()
            .perplexity
    };
    let plain = ppl(&lm.model);
    let a = ppl(&kvbench::measure::sweep::rounding_perturbed(&lm.model, 7));
    let a2 = ppl(&kvbench::measure::sweep::rounding_perturbed(&lm.model, 7));
    let b = ppl(&kvbench::measure::sweep::rounding_perturbed(&lm.model, 8));
    assert_eq!(a.to_bits(), a2.to_bits(), "same seed, same numbers");
    assert_ne!(
        a.to_bits(),
        b.to_bits(),
        "another seed moves the perplexity"
    );
    let nf = noise_floor(&[a, b]).unwrap();
    assert!(nf.spread_pct > 0.0 && nf.sd > 0.0, "{nf:?}");
    for p in [a, b] {
        assert!(
            (p / plain - 1.0).abs() < 0.01,
            "perturbed {p} vs plain {plain}"
        );
    }
    assert_eq!(
        ppl(&lm.model).to_bits(),
        plain.to_bits(),
        "the plain model is unaffected"
    );
}
