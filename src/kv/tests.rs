//! Cache-level tests: eviction semantics against dense references, byte formulas, GQA scoring.

use super::*;

fn geom(kv_heads: usize, group: usize, d: usize) -> CacheGeometry {
    CacheGeometry {
        layers: 1,
        kv_heads,
        q_heads: kv_heads * group,
        head_dim: d,
        window: None,
    }
}

/// Deterministic pseudo-random values in [−1, 1) (xorshift), so tests need no RNG crate.
fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn f16r(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// Dense reference: softmax(q·kᵀ/√d)·v over the given (f16-rounded) rows.
fn dense(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>]) -> Vec<f32> {
    let d = q.len();
    let s: Vec<f64> = keys
        .iter()
        .map(|k| {
            q.iter()
                .zip(k)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>()
                / (d as f64).sqrt()
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..d)
        .map(|c| {
            (e.iter()
                .zip(vals)
                .map(|(w, v)| w * v[c] as f64)
                .sum::<f64>()
                / z) as f32
        })
        .collect()
}

/// Sliding window at lengths W−1, W, W+1 and 2W, with and without sinks: exactly the right
/// positions are held, and attention equals a dense reference restricted to them.
#[test]
fn window_holds_exact_tokens_and_matches_dense_reference() {
    let (w, d) = (8usize, 8usize);
    for sinks in [0usize, 2] {
        let scheme: KvScheme = format!("window:size={w},sinks={sinks}").parse().unwrap();
        let g = geom(1, 2, d);
        let mut cache = KvCache::new(scheme, g, 1).unwrap();
        let (mut all_k, mut all_v) = (Vec::new(), Vec::new());
        for t in 0..2 * w {
            let (k, v) = (noise(t as u64, d), noise(1000 + t as u64, d));
            all_k.push(f16r(&k));
            all_v.push(f16r(&v));
            cache.append(0, &k, &v, 1);
            let q = noise(5000 + t as u64, 2 * d);
            let out = cache.attend(0, &q, 1);
            let n = t + 1;
            let want: Vec<usize> = (0..n).filter(|&p| p < sinks || p + w >= n).collect();
            if [w - 1, w, w + 1, 2 * w].contains(&n) {
                assert_eq!(cache.held_positions(0, 0, 0), want, "n={n} sinks={sinks}");
            }
            // Attention at this step sees every token before eviction of this step's arrival:
            // eviction runs after attention, and the window then holds `want`.
            let seen_now: Vec<usize> = (0..n).filter(|&p| p < sinks || p + w + 1 >= n).collect();
            for gq in 0..2 {
                let r = dense(
                    &q[gq * d..(gq + 1) * d],
                    &seen_now
                        .iter()
                        .map(|&p| all_k[p].clone())
                        .collect::<Vec<_>>(),
                    &seen_now
                        .iter()
                        .map(|&p| all_v[p].clone())
                        .collect::<Vec<_>>(),
                );
                for c in 0..d {
                    assert!((out[gq * d + c] - r[c]).abs() < 1e-4, "n={n} head {gq}");
                }
            }
        }
        assert_eq!(cache.kv_bytes(), scheme.bytes_for(&g, 1, 2 * w));
    }
}

/// H2O on a GQA model (2 kv heads × 2 query heads): a prompt longer than the budget is cut to
/// the budget, each kv head keeps the tokens *its* query heads attend to, and the newest token is
/// never evicted on arrival.
#[test]
fn h2o_scores_per_kv_head_and_protects_newest() {
    let d = 4;
    let g = geom(2, 2, d);
    let scheme: KvScheme = "h2o:budget=4,recent=1".parse().unwrap();
    let mut cache = KvCache::new(scheme, g, 1).unwrap();
    // Prompt of 10 tokens. Keys: head 0 has a large key at positions 2 and 5, head 1 at 3 and 7.
    let n = 10;
    let mut k = vec![0f32; 2 * n * d];
    for (h, hot) in [(0usize, [2usize, 5]), (1, [3, 7])] {
        for p in hot {
            k[(h * n + p) * d] = 4.0;
        }
    }
    let v = noise(3, 2 * n * d);
    cache.append(0, &k, &v, n);
    // Queries point along channel 0, so attention concentrates on each head's hot keys.
    let mut q = vec![0f32; 4 * n * d];
    for i in 0..4 * n {
        q[i * d] = 2.0;
    }
    cache.attend(0, &q, n);
    let h0 = cache.held_positions(0, 0, 0);
    let h1 = cache.held_positions(0, 0, 1);
    assert_eq!(h0.len(), 4);
    assert!(
        h0.contains(&2) && h0.contains(&5) && h0.contains(&9),
        "{h0:?}"
    );
    assert!(
        h1.contains(&3) && h1.contains(&7) && h1.contains(&9),
        "{h1:?}"
    );
    // Decode steps with all-zero keys (tiny scores): the newest token is always kept.
    for t in n..n + 5 {
        cache.append(0, &vec![0f32; 2 * d], &noise(t as u64, 2 * d), 1);
        cache.attend(0, &noise(99 + t as u64, 4 * d), 1);
        for h in 0..2 {
            let held = cache.held_positions(0, 0, h);
            assert!(held.contains(&t), "step {t} head {h}: {held:?}");
            assert_eq!(held.len(), 4);
        }
    }
    assert_eq!(cache.kv_bytes(), scheme.bytes_for(&g, 1, n + 5));
}

/// The H2O cache never exceeds its budget and always holds the newest token, whatever the
/// budget, recent window and chunking (300 seeded random cases).
#[test]
fn h2o_never_exceeds_budget() {
    for seed in 0..300u64 {
        let r = noise(seed, 12);
        let pick = |i: usize, lo: usize, hi: usize| {
            lo + ((r[i] + 1.0) / 2.0 * (hi - lo) as f32) as usize % (hi - lo)
        };
        let (budget, recent) = (pick(0, 3, 20), pick(1, 0, 3));
        let chunks: Vec<usize> = (0..pick(2, 1, 8)).map(|i| pick(3 + i, 1, 12)).collect();
        let d = 4;
        let g = geom(2, 2, d);
        let scheme = KvScheme {
            evict: Some(Eviction::H2o {
                budget: Budget::Tokens(budget),
                recent,
            }),
            ..KvScheme::FP16
        };
        let mut cache = KvCache::new(scheme, g, 2).unwrap();
        let mut seen = 0;
        for (i, &c) in chunks.iter().enumerate() {
            cache.append(
                0,
                &noise(seed + i as u64, 2 * 2 * c * d),
                &noise(seed + 50 + i as u64, 2 * 2 * c * d),
                c,
            );
            cache.attend(0, &noise(seed + 100 + i as u64, 2 * 4 * c * d), c);
            seen += c;
            for b in 0..2 {
                for h in 0..2 {
                    let held = cache.held_positions(0, b, h);
                    assert!(held.len() <= budget.max(recent + 1), "seed {seed}");
                    assert!(held.contains(&(seen - 1)), "seed {seed}");
                }
            }
        }
    }
}

/// Every scheme is really active: after prompts and decode steps, `kv_bytes` equals the scheme's
/// formula, and formats differ in size as their layouts say.
#[test]
fn kv_bytes_match_formula_for_every_scheme() {
    let g = CacheGeometry {
        layers: 2,
        kv_heads: 2,
        q_heads: 6,
        head_dim: 64,
        window: None,
    };
    let specs = [
        "fp16",
        "int8-token",
        "int4",
        "int4:group=16",
        "int8-channel",
        "int8-channel:group=8,residual=16",
        "int4-channel/int4",
        "fp8",
        "fp8:scale=head",
        "fp8:scale=tensor",
        "fp8:scale=none",
        "fp8-e5m2",
        "q8_0",
        "q4_0",
        "q4_0+rot",
        "h2o",
        "h2o:budget=40,recent=8@q8_0",
        "window:size=32,sinks=4",
        "window:size=50,sinks=0@int4/int8-token",
        "int2-channel",
        "int2-channel:group=8,residual=16",
        "k4v2",
        "k2v4",
        "int2:group=16/int3",
        "turboquant",
        "turboquant:bits=3",
        "turboquant-nc:bits=2",
        "turboquant-prod",
        "turboquant-prod:bits=3,seed=5",
        "turboquant_k8v4",
        "turboquant_4bit_nc",
        "turboquant_k3v4_nc",
        "turboquant_3bit_nc",
        "h2o:budget=40,recent=8@turboquant_3bit_nc",
        "window:size=32,sinks=4@turboquant-prod",
        "nvfp4",
        "mxfp4",
        "h2o:budget=40,recent=8@nvfp4/mxfp4",
    ];
    for spec in specs {
        let s: KvScheme = spec.parse().unwrap();
        let mut c = KvCache::new(s, g, 3).unwrap();
        let mut seen = 0;
        for (i, n) in [70usize, 1, 1, 1, 30, 1].into_iter().enumerate() {
            for l in 0..2 {
                let k = noise(i as u64 * 7 + l as u64, 3 * 2 * n * 64);
                let v = noise(i as u64 * 11 + l as u64, 3 * 2 * n * 64);
                c.append(l, &k, &v, n);
                c.attend(l, &noise(i as u64, 3 * 6 * n * 64), n);
            }
            seen += n;
            assert_eq!(
                c.kv_bytes(),
                s.bytes_for(&g, 3, seen),
                "{spec} after {seen} tokens"
            );
        }
    }
}

/// Bytes per token by hand for SmolLM2-135M (30 layers, 3 kv heads, head_dim 64), K + V:
/// fp16 2·30·3·128 = 23,040; int8 (64 + 2) → 11,880; int4 g32 (2·20) → 7,200; fp8 per-token
/// (64 + 2) → 11,880; q8_0 (2·34) → 12,240; q4_0 (2·18) → 6,480; KIVI int8-channel, long run:
/// K 64 codes + 64 f16 scales per 32 tokens (4 bytes/token) = 68, V int8-token 66 → 12,060;
/// int4-channel: K 32 + 64·4/32 = 40, V int4 40 → 7,200.
#[test]
fn bytes_per_token_by_hand() {
    let g = CacheGeometry {
        layers: 30,
        kv_heads: 3,
        q_heads: 9,
        head_dim: 64,
        window: None,
    };
    for (spec, want) in [
        ("fp16", 23040),
        ("int8", 11880),
        ("int4", 7200),
        ("fp8", 11880),
        ("fp8:scale=head", 11520),
        ("q8_0", 12240),
        ("q4_0", 6480),
        ("int8-channel", 12060),
        ("int4-channel", 7200),
        // KIVI-2: K 16 codes + 64·4/32 = 8 → 24, V int2 g32 2·(4 + 8) = 24 → 48·90 = 4,320;
        // k4v2: 40 + 24 = 64 → 5,760; k2v4: 24 + 40 = 64 → 5,760.
        ("int2-channel", 4320),
        ("k4v2", 5760),
        ("k2v4", 5760),
        // TurboQuant, d = 64: MSE rows 64·b/8 + 2, value rows 64·b/8 + 4, fp8 keys 64:
        // 4bit_nc 34 + 36 = 70 → 6,300; k3v4_nc 26 + 36 = 62 → 5,580; 3bit_nc 26 + 28 = 54 →
        // 4,860; k8v4 64 + 36 = 100 → 9,000; prod 4 bits 24 + 4 + 8 = 36 each → 6,480.
        ("turboquant_4bit_nc", 6300),
        ("turboquant_k3v4_nc", 5580),
        ("turboquant_3bit_nc", 4860),
        ("turboquant_k8v4", 9000),
        ("turboquant-prod", 6480),
        // nvfp4: 4 + 4·(1 + 8) = 40 bytes per row → 80·90 = 7,200; mxfp4: 2·(1 + 16) = 34 →
        // 68·90 = 6,120.
        ("nvfp4", 7200),
        ("mxfp4", 6120),
    ] {
        let s: KvScheme = spec.parse().unwrap();
        assert_eq!(s.bytes_per_token(&g), want, "{spec}");
    }
}

/// Rotation is exact in exact arithmetic: fp16+rot gives the same attention as fp16 up to f16
/// rounding of rotated values.
#[test]
fn rotation_preserves_attention() {
    let d = 64;
    let g = geom(1, 2, d);
    let mut a = KvCache::new(KvScheme::FP16, g, 1).unwrap();
    let mut b = KvCache::new("fp16+rot".parse().unwrap(), g, 1).unwrap();
    let (k, v, q) = (noise(1, 20 * d), noise(2, 20 * d), noise(3, 2 * 20 * d));
    for c in [&mut a, &mut b] {
        c.append(0, &k, &v, 20);
    }
    let (oa, ob) = (a.attend(0, &q, 20), b.attend(0, &q, 20));
    for (x, y) in oa.iter().zip(&ob) {
        assert!((x - y).abs() < 2e-3, "{x} vs {y}");
    }
}

/// fp8 with a per-head scale fixed by the prompt saturates later outliers and counts them.
#[test]
fn fp8_head_scale_saturates_and_counts() {
    let d = 4;
    let g = geom(1, 1, d);
    let mut c = KvCache::new("fp8:scale=head".parse().unwrap(), g, 1).unwrap();
    c.append(0, &[1.0, -1.0, 0.5, 0.0], &[1.0, 1.0, 1.0, 1.0], 1);
    assert_eq!(c.saturated(), 0);
    c.append(0, &[10.0, 0.0, 0.0, 0.0], &[1.0, 1.0, 1.0, 1.0], 1); // 10 > 448 · (1/448)
    assert_eq!(c.saturated(), 1);
    let out = c.attend(0, &[0.0, 0.0, 0.0, 0.0], 1);
    assert!(out.iter().all(|v| v.is_finite()));
}

/// Per-token formats store each row independently of how tokens arrive: 40 tokens appended as
/// one chunk or one at a time give the same bytes held and the same attention output for the
/// newest token (to f32 rounding), which is why chunked and decode perplexity agree for them.
#[test]
fn per_token_formats_are_chunking_invariant() {
    let d = 64;
    let g = geom(2, 3, d);
    for spec in [
        "fp16",
        "int8-token",
        "int4",
        "fp8",
        "fp8:scale=none",
        "fp8-e5m2",
        "q8_0",
        "q4_0",
        "q4_0+rot",
        "int2",
        "int3:group=row",
        "int4-row",
        "turboquant",
        "turboquant-nc:bits=3",
        "turboquant-prod",
        "turboquant_k8v4",
        "turboquant_3bit_nc",
        "nvfp4",
        "mxfp4",
    ] {
        let s: KvScheme = spec.parse().unwrap();
        let n = 40;
        let (k, v) = (noise(1, 2 * n * d), noise(2, 2 * n * d));
        let q = noise(3, 6 * n * d);
        let mut chunked = KvCache::new(s, g, 1).unwrap();
        chunked.append(0, &k, &v, n);
        let out_c = chunked.attend(0, &q, n);
        let mut steps = KvCache::new(s, g, 1).unwrap();
        let mut out_s = Vec::new();
        for t in 0..n {
            let pick = |x: &[f32], heads: usize| -> Vec<f32> {
                (0..heads)
                    .flat_map(|h| x[(h * n + t) * d..(h * n + t + 1) * d].to_vec())
                    .collect()
            };
            steps.append(0, &pick(&k, 2), &pick(&v, 2), 1);
            out_s = steps.attend(0, &pick(&q, 6), 1);
        }
        assert_eq!(chunked.kv_bytes(), steps.kv_bytes(), "{spec}");
        for h in 0..6 {
            for c in 0..d {
                let a = out_c[(h * n + n - 1) * d + c];
                let b = out_s[h * d + c];
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                    "{spec} head {h}: {a} vs {b}"
                );
            }
        }
    }
}

/// Attention over TurboQuant and 2-bit rows reads the stored form and stays close to fp16
/// attention. Rows are uniform noise in [−1, 1] (d = 64, ‖x‖² ≈ 21); causal attention makes the
/// first query's output one decoded value row, so the bound is per element. Bounds by hand:
/// 2-bit uniform, step ≤ 2/3 → value error ≤ 1/3, plus key-score error → 0.4; 4-bit
/// TurboQuant_mse, E‖x − x̂‖² ≈ 0.0095‖x‖² (Thm 1) → per-element RMS ≈ 0.058, bound 0.25
/// (≈ 4.3 σ over 64 × 96 outputs); a wrongly ordered code or a missing inverse rotation moves
/// outputs by O(1) and fails.
#[test]
fn new_formats_attend_close_to_fp16() {
    let d = 64;
    let g = geom(1, 2, d);
    let n = 48;
    let (k, v, q) = (noise(1, n * d), noise(2, n * d), noise(3, 2 * n * d));
    let mut exact = KvCache::new(KvScheme::FP16, g, 1).unwrap();
    exact.append(0, &k, &v, n);
    let want = exact.attend(0, &q, n);
    for (spec, tol) in [
        ("turboquant", 0.25),
        ("turboquant-nc", 0.25),
        ("turboquant_4bit_nc", 0.25),
        ("turboquant-prod:bits=5", 0.25),
        ("int2", 0.4),
        ("int2-channel:group=8,residual=8", 0.4),
    ] {
        let mut c = KvCache::new(spec.parse().unwrap(), g, 1).unwrap();
        c.append(0, &k, &v, n);
        let got = c.attend(0, &q, n);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst.is_finite() && worst <= tol,
            "{spec}: worst |Δ| {worst} > {tol}"
        );
    }
}

/// Gemma 2 9B's 1:1 split (config.json: 42 layers, 8 KV heads of 256, `sliding_window` 4096,
/// layer 0 local): 21 window and 21 global layers. fp16 at 8192 tokens: 21 · 4096 + 21 · 8192
/// = 258,048 layer tokens · 2 · 8 · 256 · 2 = 8192 bytes = 2,113,929,216 bytes, plus the
/// window layers' positions 21 · 4096 · 8 heads · 4 = 2,752,512: 2,116,681,728; all-global
/// 42 · 8192 · 8192 = 2,818,572,288. Below the window (4096) the two differ by the positions
/// only.
#[test]
fn gemma2_one_to_one_by_hand() {
    let g = CacheGeometry {
        layers: 42,
        kv_heads: 8,
        q_heads: 16,
        head_dim: 256,
        window: Some(SlidingWindow::every(4096, 2)),
    };
    assert_eq!((g.window_layers(), g.global_layers()), (21, 21));
    assert!(g.is_window_layer(0) && !g.is_window_layer(1));
    let f = KvScheme::FP16;
    assert_eq!(f.bytes_for(&g, 1, 8192), 2_116_681_728);
    assert_eq!(f.bytes_for(&g.without_window(), 1, 8192), 2_818_572_288);
    let split = f.bytes_by_layer_type(&g, 1, 4096, 8192);
    assert_eq!(
        (split.window, split.global),
        (21 * 4096 * (8192 + 32), 21 * 8192 * 8192)
    );
    assert_eq!(
        f.bytes_for(&g, 1, 4096),
        f.bytes_for(&g.without_window(), 1, 4096) + 21 * 4096 * 32
    );
    // bytes/token stays every layer's: 42 · 8192.
    assert_eq!(f.bytes_per_token(&g), 42 * 8192);
}

/// Every layer windowed (Mistral 7B v0.1: 32 layers, 8 KV heads of 128, window 4096): past
/// the window the cache stops growing at 32 · 4096 · (4096 + 8 · 4 positions) = 541,065,216
/// bytes in fp16; with fp8 `scale=tensor` (128 + 128 bytes per layer token, K and V, and a
/// 4-byte position) plus two f32 scales per layer: 32 · (4096 · 8 · 260 + 8) = 272,630,016.
#[test]
fn all_layers_sliding_by_hand() {
    let g = CacheGeometry {
        layers: 32,
        kv_heads: 8,
        q_heads: 32,
        head_dim: 128,
        window: Some(SlidingWindow {
            window: 4096,
            global: GlobalLayers::None,
        }),
    };
    assert_eq!(g.global_layers(), 0);
    assert_eq!(KvScheme::FP16.bytes_for(&g, 1, 100_000), 541_065_216);
    assert_eq!(g.layer_tokens(100_000), 32 * 4096);
    let fp8: KvScheme = "fp8:scale=tensor".parse().unwrap();
    assert_eq!(fp8.bytes_for(&g, 1, 100_000), 272_630_016);
}

/// Per-layer sliding windows (Gemma 3 local layers): layer 1 of two with window 3, tokens one
/// per call. Layer 0 keeps everything; layer 1 holds the 2 newest between calls, and each
/// query's attention equals the dense reference over the last 3 positions (itself included).
/// With the `window:size=4,sinks=1` scheme on top, layer 1 holds what both keep.
#[test]
fn per_layer_windows_hold_and_attend_the_last_w_tokens() {
    let d = 8;
    let g = CacheGeometry {
        layers: 2,
        kv_heads: 1,
        q_heads: 1,
        head_dim: d,
        window: None,
    };
    let (w, n) = (3usize, 7usize);
    let keys: Vec<Vec<f32>> = (0..n).map(|t| f16r(&noise(10 + t as u64, d))).collect();
    let vals: Vec<Vec<f32>> = (0..n).map(|t| f16r(&noise(50 + t as u64, d))).collect();
    let mut c = KvCache::new(KvScheme::FP16, g, 1).unwrap();
    c.set_layer_windows(&[None, Some(w)]).unwrap();
    c.set_layer_windows(&[None, Some(w)]).unwrap(); // the same again: a no-op
    for t in 0..n {
        let q = noise(90 + t as u64, d);
        for layer in 0..2 {
            c.append(layer, &keys[t], &vals[t], 1);
            let out = c.attend(layer, &q, 1);
            let from = if layer == 1 {
                (t + 1).saturating_sub(w)
            } else {
                0
            };
            let want = dense(&q, &keys[from..=t], &vals[from..=t]);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "layer {layer} token {t}: {a} vs {b}");
            }
        }
        assert_eq!(c.held(0, 0, 0), t + 1);
        assert_eq!(c.held(1, 0, 0), (t + 1).min(w - 1));
    }
    assert_eq!(c.held_positions(1, 0, 0), vec![5, 6]);
    // Changing windows on a cache that holds tokens is refused; so is a wrong length or 0.
    assert!(c.set_layer_windows(&[None, Some(4)]).is_err());
    let mut e = KvCache::new(KvScheme::FP16, g, 1).unwrap();
    assert!(e.set_layer_windows(&[Some(3)]).is_err());
    assert!(e.set_layer_windows(&[None, Some(0)]).is_err());
    // Composed with a window scheme (4 newest + 1 sink): the layer window drops the sink too.
    let s: KvScheme = "window:size=4,sinks=1@fp16".parse().unwrap();
    let mut c = KvCache::new(s, g, 1).unwrap();
    c.set_layer_windows(&[None, Some(w)]).unwrap();
    for t in 0..n {
        let q = noise(90 + t as u64, d);
        for layer in 0..2 {
            c.append(layer, &keys[t], &vals[t], 1);
            c.attend(layer, &q, 1);
        }
    }
    assert_eq!(c.held_positions(0, 0, 0), vec![0, 3, 4, 5, 6]);
    assert_eq!(c.held_positions(1, 0, 0), vec![5, 6]);
}

/// A fresh cache joined with one whose layers have windows takes them; caches holding tokens
/// under different windows are refused.
#[test]
fn join_adopts_layer_windows_of_a_prefilled_cache() {
    let g = CacheGeometry {
        layers: 2,
        kv_heads: 1,
        q_heads: 1,
        head_dim: 8,
        window: None,
    };
    let mut prefilled = KvCache::new(KvScheme::FP16, g, 1).unwrap();
    prefilled.set_layer_windows(&[Some(2), None]).unwrap();
    for layer in 0..2 {
        prefilled.append(layer, &[0.5; 8], &[0.5; 8], 1);
    }
    let mut batch = KvCache::new(KvScheme::FP16, g, 1).unwrap();
    let _ = batch.take(0).unwrap(); // an empty batch of 0 sequences
    batch.join(prefilled).unwrap();
    assert_eq!(batch.layer_window(0), Some(2));
    let mut other = KvCache::new(KvScheme::FP16, g, 1).unwrap();
    for layer in 0..2 {
        other.append(layer, &[0.5; 8], &[0.5; 8], 1);
    }
    assert!(batch.join(other).is_err());
}

/// `reserve`: room for the tokens in every stream up front, counted by hand (fp16 rows of
/// `2·d` bytes; int8-token rows `d + 2`), no reallocation while they arrive (capacity
/// unchanged), a window layer's room capped at its window, none for an evicting scheme, and
/// attention bit for bit that of a cache that grew on demand.
#[test]
fn reserve_gives_every_stream_room_up_front_and_changes_no_result() {
    let d = 16;
    let g = CacheGeometry {
        layers: 2,
        ..geom(2, 2, d)
    };
    let (batch, n) = (2usize, 9usize);
    // 2 layers × 2 sequences × 2 kv heads × (K, V) = 16 streams.
    for (scheme, row) in [(KvScheme::FP16, 2 * d), ("int8".parse().unwrap(), d + 2)] {
        let mut grown = KvCache::new(scheme, g, batch).unwrap();
        let mut fixed = KvCache::new(scheme, g, batch).unwrap();
        fixed.reserve(n);
        assert_eq!(fixed.reserved_bytes(), 16 * n * row, "{scheme}");
        for t in 0..n {
            let k = noise(100 + t as u64, batch * 2 * d);
            let v = noise(200 + t as u64, batch * 2 * d);
            let q = noise(300 + t as u64, batch * 4 * d);
            for layer in 0..2 {
                grown.append(layer, &k, &v, 1);
                fixed.append(layer, &k, &v, 1);
                let (a, b) = (grown.attend(layer, &q, 1), fixed.attend(layer, &q, 1));
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
            assert_eq!(fixed.reserved_bytes(), 16 * n * row, "{scheme} token {t}");
        }
        assert_eq!(fixed.kv_bytes(), 16 * n * row);
    }
    // Layer 1 slides over 4 tokens: its 8 streams get room for 4, layer 0's for all 9
    // (positions are kept per slot on window layers, allocated as they arrive).
    let mut c = KvCache::new(KvScheme::FP16, g, batch).unwrap();
    c.reserve(n);
    c.set_layer_windows(&[None, Some(4)]).unwrap();
    assert_eq!(c.reserved_bytes(), 8 * n * 2 * d + 8 * 4 * 2 * d);
    // An evicting scheme holds at most its budget and reserves nothing.
    let mut e = KvCache::new("window:size=4,sinks=1@fp16".parse().unwrap(), g, batch).unwrap();
    e.reserve(n);
    assert_eq!(e.reserved_bytes(), 0);
}
