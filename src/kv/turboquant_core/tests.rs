//! Tests of the TurboQuant cores against independently known values: Max's (1960) published
//! Lloyd–Max tables, the TurboQuant paper's Thm 1 figures, hand-computed Hadamard rotations and
//! bit layouts, and the QJL estimator's expectation
//! checked statistically over seeds.

use half::f16;
use rand::{Rng, SeedableRng};

use super::*;
use crate::kv::format::Int4GroupRow;

/// Max (1960), Table I, optimum levels of the N(0, 1) quantizer (positive half; symmetric),
/// and the resulting mean-squared error.
const MAX_1960: [(&[f64], f64); 4] = [
    (&[0.7979], 0.3634),
    (&[0.4528, 1.5104], 0.1175),
    (&[0.2451, 0.7560, 1.3440, 2.1520], 0.03454),
    (
        &[
            0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326,
        ],
        0.009497,
    ),
];

#[test]
fn lloyd_max_matches_max_1960() {
    for (b, (pos, mse)) in (1u8..=4).zip(MAX_1960) {
        let cb = Codebook::lloyd_max_gaussian(b, 1.0).unwrap();
        let c = cb.centroids();
        assert_eq!(c.len(), 1 << b);
        let half = c.len() / 2;
        for (i, &p) in pos.iter().enumerate() {
            // Table values are rounded to 4 decimals, and Max's last digit is off by up to 1e-4
            // at 3–4 bits (converged: 1.3439, 2.1519, 0.3880, …; scripts/quality_reference.py).
            assert!(
                (c[half + i] as f64 - p).abs() < 1.5e-4,
                "b={b} level {i}: {}",
                c[half + i]
            );
            assert!(
                (c[half - 1 - i] as f64 + p).abs() < 1.5e-4,
                "b={b} level -{i}"
            );
        }
        assert!(
            (cb.mse() - mse).abs() / mse < 2e-3,
            "b={b} mse {}",
            cb.mse()
        );
    }
    // Max's 2-bit thresholds: 0, ±0.9816.
    let t = Codebook::lloyd_max_gaussian(2, 1.0).unwrap();
    let t = t.boundaries();
    assert!(t[1].abs() < 1e-6 && (t[2] - 0.9816).abs() < 1.5e-4 && (t[0] + 0.9816).abs() < 1.5e-4);
}

/// The N(0, 1/d) codebook is Max's scaled by 1/√d, and its MSE by 1/d.
#[test]
fn codebook_scales_with_sigma_and_maps_to_nearest_level() {
    let cb = Codebook::for_head_dim(2, 64).unwrap();
    let unit = Codebook::lloyd_max_gaussian(2, 1.0).unwrap();
    for (a, b) in cb.centroids().iter().zip(unit.centroids()) {
        assert!((a - b / 8.0).abs() < 1e-7);
    }
    assert!((cb.mse() - unit.mse() / 64.0).abs() < 1e-12);
    // Levels ±0.4528/8 = ±0.0566, ±1.5104/8 = ±0.1888; thresholds 0, ±0.1227.
    assert_eq!(cb.index(-1.0), 0);
    assert_eq!(cb.index(-0.1), 1);
    assert_eq!(cb.index(0.05), 2);
    assert_eq!(cb.index(0.2), 3);
    assert_eq!(cb.bytes(), 16);
}

#[test]
fn codebook_rejects_bad_input() {
    for b in [0u8, 5] {
        let e = Codebook::lloyd_max_gaussian(b, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("use 1, 2, 3 or 4"), "{e}");
    }
    assert!(Codebook::lloyd_max_gaussian(2, 0.0).is_err());
    assert!(Codebook::lloyd_max_gaussian(2, f64::NAN).is_err());
    assert!(Codebook::for_head_dim(2, 0).is_err());
}

/// H₄·D·x/2 by hand with D = diag(1, −1, 1, 1), x = (1, 2, 3, 4): D x = (1, −2, 3, 4);
/// Sylvester rows (1,1,1,1), (1,−1,1,−1), (1,1,−1,−1), (1,−1,−1,1) give (6, 2, −8, 4)/2.
#[test]
fn randomized_hadamard_by_hand() {
    let r = RandomizedHadamard::from_signs(vec![1.0, -1.0, 1.0, 1.0]).unwrap();
    let mut x = [1.0f32, 2.0, 3.0, 4.0];
    r.forward(&mut x);
    assert_eq!(x, [3.0, 1.0, -4.0, 2.0]);
    r.inverse(&mut x);
    assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
    assert!(RandomizedHadamard::from_signs(vec![1.0; 6]).is_err());
    assert!(RandomizedHadamard::from_signs(vec![1.0, 0.5]).is_err());
    assert!(RandomizedHadamard::new(96, 1)
        .unwrap_err()
        .to_string()
        .contains("power of two"));
    // Seeded: same seed, same signs; both signs occur; norms preserved.
    let a = RandomizedHadamard::new(128, 42).unwrap();
    assert_eq!(a, RandomizedHadamard::new(128, 42).unwrap());
    assert_ne!(a, RandomizedHadamard::new(128, 43).unwrap());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let x: Vec<f32> = (0..128).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut y = x.clone();
    a.forward(&mut y);
    let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
    assert!((n(&x) - n(&y)).abs() < 1e-4 * n(&x));
    a.inverse(&mut y);
    assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5));
}

/// LSB-first packing by hand. 2 bits (0,1,2,3) → 0b11_10_01_00 = 0xE4. 3 bits
/// (1,2,3,4,5,6,7,0): byte 0 = 1 | 2<<3 | (3&3)<<6 = 0xD1; byte 1 = (3>>2) | 4<<1 | 5<<4 |
/// (6&1)<<7 = 0x58; byte 2 = 6>>1 | 7<<2 | 0<<5 = 0x1F. 4 bits (1, 2) → 0x21.
#[test]
fn bit_packing_by_hand() {
    let mut out = [0u8; 1];
    pack_bits(&[0, 1, 2, 3], 2, &mut out);
    assert_eq!(out, [0xE4]);
    let mut out3 = [0u8; 3];
    let codes = [1u8, 2, 3, 4, 5, 6, 7, 0];
    pack_bits(&codes, 3, &mut out3);
    assert_eq!(out3, [0xD1, 0x58, 0x1F]);
    let mut back = [0u8; 8];
    unpack_bits(&out3, 3, &mut back);
    assert_eq!(back, codes);
    pack_bits(&[1, 2], 4, &mut out);
    assert_eq!(out, [0x21]);
    assert_eq!(packed_bytes(64, 3), 24);
    assert_eq!(packed_bytes(5, 3), 2);
    // Odd lengths round trip at every width.
    for bits in 1..=8u8 {
        let codes: Vec<u8> = (0..13).map(|i| ((i * 7 + 3) % (1 << bits)) as u8).collect();
        let mut p = vec![0u8; packed_bytes(13, bits)];
        pack_bits(&codes, bits, &mut p);
        let mut u = vec![0u8; 13];
        unpack_bits(&p, bits, &mut u);
        assert_eq!(u, codes, "bits {bits}");
    }
}

/// d = 4, 1 bit, no sign flips, x = (2, 0, 0, 0): ‖x‖ = 2 (f16 0x4000), R·x/‖x‖ = (½,½,½,½),
/// all above the threshold 0 → codes 1111 → byte 0x0F. Decoding: ŷ = 0.7979/2·(1,1,1,1),
/// H ŷ/2 = (0.7979, 0, 0, 0), × 2 = (1.5958, 0, 0, 0). With norm correction ŷ/‖ŷ‖ = (½,…)
/// and x comes back exactly.
#[test]
fn turboquant_mse_one_bit_by_hand() {
    let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
    let q = TurboQuantMse::with_rotation(rot.clone(), 1, false).unwrap();
    assert_eq!(q.row_bytes(), 3);
    let mut row = [0u8; 3];
    assert_eq!(q.encode(&[2.0, 0.0, 0.0, 0.0], &mut row), 0);
    assert_eq!(row, [0x00, 0x40, 0x0F]);
    let mut out = [0f32; 4];
    q.decode(&row, &mut out);
    let c1 = (2.0 / std::f64::consts::PI).sqrt() as f32; // E|X| = √(2/π) = 0.79788
    assert!((out[0] - 2.0 * c1).abs() < 1e-5 && out[1..].iter().all(|v| v.abs() < 1e-6));
    let nc = TurboQuantMse::with_rotation(rot, 1, true).unwrap();
    nc.decode(&row, &mut out);
    assert!((out[0] - 2.0).abs() < 1e-6 && out[1..].iter().all(|v| v.abs() < 1e-6));
}

/// d = 4, 2 bits, no sign flips, x = (0, 3, 0, 4): ‖x‖ = 5 (f16 0x4500), u = (0, .6, 0, .8),
/// H u/2 = (0.7, −0.7, −0.1, 0.1). Levels for σ = ½ (Max ×½): ±0.2264, ±0.7552, thresholds 0,
/// ±0.4908 → codes (3, 0, 1, 2) → 3 | 0<<2 | 1<<4 | 2<<6 = 0x93. Decoding:
/// ŷ = (a, −a, −c, c) with a = 0.7552, c = 0.2264; Sylvester rows give
/// H ŷ/2 = (0, (2a − 2c)/2, 0, (2a + 2c)/2) = (0, a − c, 0, a + c); × 5.
/// Norm correction divides by ‖ŷ‖ = √(2a² + 2c²).
#[test]
fn turboquant_mse_two_bits_by_hand() {
    let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
    let q = TurboQuantMse::with_rotation(rot.clone(), 2, false).unwrap();
    let mut row = [0u8; 3];
    q.encode(&[0.0, 3.0, 0.0, 4.0], &mut row);
    assert_eq!(row, [0x00, 0x45, 0x93]);
    let (a, c) = (1.5104f32 / 2.0, 0.4528f32 / 2.0);
    let want = [0.0, 5.0 * (a - c), 0.0, 5.0 * (a + c)];
    let mut out = [0f32; 4];
    q.decode(&row, &mut out);
    for (o, w) in out.iter().zip(want) {
        assert!((o - w).abs() < 5e-4, "{out:?} vs {want:?}");
    }
    let nc = TurboQuantMse::with_rotation(rot, 2, true).unwrap();
    nc.decode(&row, &mut out);
    let norm = (2.0 * a * a + 2.0 * c * c).sqrt();
    for (o, w) in out.iter().zip(want) {
        assert!((o - w / norm).abs() < 5e-4, "{out:?}");
    }
    // The rotated-basis decode scores like the decoded row: ⟨R q, ‖x‖ŷ⟩ = ⟨q, x̂⟩.
    let qv = [0.3f32, -1.0, 2.0, 0.5];
    let mut rq = qv;
    nc.rotate_query(&mut rq);
    let mut yr = [0f32; 4];
    nc.decode_rotated(&row, &mut yr);
    let d1: f32 = rq.iter().zip(&yr).map(|(a, b)| a * b).sum();
    let d2: f32 = qv.iter().zip(&out).map(|(a, b)| a * b).sum();
    assert!((d1 - d2).abs() < 1e-5);
}

/// Zero rows decode to zero; a norm beyond f16 saturates and is counted.
#[test]
fn turboquant_mse_zero_and_huge_rows() {
    let q = TurboQuantMse::new(8, 3, true, 5).unwrap();
    let mut row = vec![0u8; q.row_bytes()];
    assert_eq!(q.row_bytes(), 3 + 2);
    q.encode(&[0.0; 8], &mut row);
    let mut out = [1f32; 8];
    q.decode(&row, &mut out);
    assert_eq!(out, [0.0; 8]);
    assert_eq!(q.encode(&[1e5; 8], &mut row), 1);
    assert_eq!(q.norm(&row), 65504.0);
}

/// TurboQuant Thm 1 / Table: for unit vectors, `D_mse = E‖x − x̂‖²` ≈ 0.36, 0.117, 0.03, 0.009
/// at b = 1..4 and ≤ √3·π/2·4^−b. Checked on 2000 Gaussian-direction unit vectors (d = 128,
/// a fresh rotation seed per vector); the expected value is Max's MSE (the rotated coordinates
/// are ≈ N(0, 1/d)), within 4 %.
#[test]
fn turboquant_mse_meets_theorem_1() {
    let d = 128;
    let mut rng = rand::rngs::StdRng::seed_from_u64(2504_19874);
    let xs: Vec<Vec<f32>> = (0..2000)
        .map(|_| {
            let v: Vec<f32> = (0..d)
                .map(|_| {
                    let (u1, u2): (f64, f64) = (rng.random(), rng.random());
                    ((-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos())
                        as f32
                })
                .collect();
            let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
            v.iter().map(|a| a / n).collect()
        })
        .collect();
    for (b, (_, max_mse)) in (1u8..=4).zip(MAX_1960) {
        let bound = 3f64.sqrt() * std::f64::consts::PI / 2.0 * 4f64.powi(-(b as i32));
        let mut total = 0f64;
        for (i, x) in xs.iter().enumerate() {
            let q = TurboQuantMse::new(d, b, false, i as u64).unwrap();
            let mut row = vec![0u8; q.row_bytes()];
            q.encode(x, &mut row);
            let mut out = vec![0f32; d];
            q.decode(&row, &mut out);
            total += x
                .iter()
                .zip(&out)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum::<f64>();
        }
        let dmse = total / xs.len() as f64;
        assert!(dmse <= bound, "b={b}: {dmse} above the bound {bound}");
        assert!(
            (dmse - max_mse).abs() / max_mse < 0.04,
            "b={b}: {dmse} vs {max_mse}"
        );
    }
}

/// Where the Hadamard stand-in departs from the paper's random rotation: a one-hot row
/// rotates to exactly ±1/√d on every coordinate, not a Gaussian. At 2 bits each maps to
/// ±1.5104/√d (threshold 0.9816 < 1), so `‖x − x̂‖² = (1.5104 − 1)² = 0.2605` — above Thm 1's
/// 0.117 (and its bound 0.170). Norm correction rescales (±1.5104/√d)·… back to ±1/√d and
/// recovers the row exactly.
#[test]
fn one_hot_rows_show_the_hadamard_caveat_and_norm_correction_fixes_it() {
    let d = 64;
    let mut x = vec![0f32; d];
    x[5] = 1.0;
    for (nc, want) in [(false, (1.5104f32 - 1.0).powi(2)), (true, 0.0)] {
        let q = TurboQuantMse::new(d, 2, nc, 3).unwrap();
        let mut row = vec![0u8; q.row_bytes()];
        q.encode(&x, &mut row);
        let mut out = vec![0f32; d];
        q.decode(&row, &mut out);
        let err: f32 = x.iter().zip(&out).map(|(a, b)| (a - b).powi(2)).sum();
        assert!((err - want).abs() < 1e-3, "nc={nc}: {err} vs {want}");
    }
}

/// QJL by hand with S = I, d = 4, 2 bits (1 MSE bit + QJL), no sign flips, x = (2, 0, 0, 0):
/// the MSE part is the 1-bit example above, û = (0.79788, 0, 0, 0), r = u − û =
/// (0.20212, 0, 0, 0), γ = ‖r‖ (stored as f16), S r = r → z = (+, +, +, +) (sign(0) = +1) →
/// 0x0F. x̃ = 2·(û + γ·√(π/2)/4·(1, 1, 1, 1)); for q = (1, 1, 0, 0): ⟨Sq, z⟩ = 2 and the score
/// is 2·(0.79788 + γ·√(π/2)/4·2).
#[test]
fn qjl_by_hand_with_identity_sketch() {
    let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
    let mut s = vec![0f32; 16];
    for i in 0..4 {
        s[i * 4 + i] = 1.0;
    }
    let p = TurboQuantProd::with_parts(rot, 2, s).unwrap();
    assert_eq!(p.row_bytes(), 3 + 2 + 1);
    assert_eq!(p.bits(), 2);
    let mut row = [0u8; 6];
    p.encode(&[2.0, 0.0, 0.0, 0.0], &mut row);
    let c1 = (2.0 / std::f64::consts::PI).sqrt() as f32;
    let gamma = f16::from_f32(1.0 - c1);
    let g = gamma.to_le_bytes();
    assert_eq!(row, [0x00, 0x40, 0x0F, g[0], g[1], 0x0F]);
    let k = gamma.to_f32() * (std::f64::consts::PI / 2.0).sqrt() as f32 / 4.0;
    let mut out = [0f32; 4];
    p.decode(&row, &mut out);
    let want = [2.0 * (c1 + k), 2.0 * k, 2.0 * k, 2.0 * k];
    for (o, w) in out.iter().zip(want) {
        assert!((o - w).abs() < 1e-5, "{out:?} vs {want:?}");
    }
    let q = p.prepare_query(&[1.0, 1.0, 0.0, 0.0]);
    assert!((p.score(&q, &row) - 2.0 * (c1 + 2.0 * k)).abs() < 1e-5);
}

/// The TurboQuant_prod estimate of ⟨q, x⟩ is unbiased (Thm 2): its mean over 4000 seeds
/// (fresh rotation and S each) lies within 4 standard errors of the true dot product, at
/// 2 and 3 bits; and `score` equals ⟨q, decode(row)⟩.
#[test]
fn qjl_estimator_is_unbiased_over_seeds() {
    let d = 32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let x: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
    let qv: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
    let truth: f64 = x.iter().zip(&qv).map(|(a, b)| (a * b) as f64).sum();
    for bits in [2u8, 3] {
        let n = 4000;
        let mut est = Vec::with_capacity(n);
        for seed in 0..n as u64 {
            let p = TurboQuantProd::new(d, bits, seed).unwrap();
            let mut row = vec![0u8; p.row_bytes()];
            p.encode(&x, &mut row);
            let q = p.prepare_query(&qv);
            let e = p.score(&q, &row);
            if seed < 20 {
                let mut xt = vec![0f32; d];
                p.decode(&row, &mut xt);
                let dd: f32 = xt.iter().zip(&qv).map(|(a, b)| a * b).sum();
                assert!((dd - e).abs() < 1e-3 * (1.0 + e.abs()), "{dd} vs {e}");
            }
            est.push(e as f64);
        }
        let m = est.iter().sum::<f64>() / n as f64;
        let sd = (est.iter().map(|e| (e - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
        let se = sd / (n as f64).sqrt();
        assert!(
            (m - truth).abs() < 4.0 * se,
            "bits {bits}: mean {m} vs {truth} (se {se})"
        );
        assert!(sd > 0.0);
    }
}

#[test]
fn prod_rejects_bad_input() {
    assert!(TurboQuantProd::new(16, 1, 0).is_err());
    assert!(TurboQuantProd::new(16, 6, 0).is_err());
    assert!(TurboQuantProd::new(12, 3, 0).is_err());
    let rot = RandomizedHadamard::from_signs(vec![1.0; 4]).unwrap();
    assert!(TurboQuantProd::with_parts(rot, 3, vec![0.0; 15]).is_err());
    assert_eq!(TurboQuantProd::row_bytes_for(128, 4), 48 + 2 + 2 + 16);
}

/// 2 bits, group 4, x = (0, 1, 2, 3): m = 0, s = 3/3 = 1 (f16 0x3C00), codes 0..3 → 0xE4;
/// 3 bits, group 8, x = 0..7: s = 1, codes 0..7 → 0x88, 0xC6, 0xFA (LSB-first by hand:
/// byte 0 = 1<<3 | (2&3)<<6; byte 1 = (2>>2) | 3<<1 | 4<<4 | (5&1)<<7; byte 2 = 5>>1 | 6<<2 | 7<<5).
#[test]
fn uniform_rows_by_hand() {
    let c = UniformGroupRow::new(2, 4).unwrap();
    assert_eq!(c.row_bytes(8), 2 * 5);
    let mut row = [0u8; 5];
    c.encode(&[0.0, 1.0, 2.0, 3.0], &mut row);
    assert_eq!(row, [0x00, 0x3C, 0x00, 0x00, 0xE4]);
    let mut out = [0f32; 4];
    c.decode(&row, &mut out);
    assert_eq!(out, [0.0, 1.0, 2.0, 3.0]);
    let c3 = UniformGroupRow::new(3, 8).unwrap();
    let mut row = [0u8; 7];
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    c3.encode(&x, &mut row);
    assert_eq!(row, [0x00, 0x3C, 0x00, 0x00, 0x88, 0xC6, 0xFA]);
    // vLLM's value row: ceil(d·b/8) + 4 for one group per row.
    assert_eq!(UniformGroupRow::new(3, 128).unwrap().row_bytes(128), 48 + 4);
    assert!(UniformGroupRow::new(5, 32).is_err());
    assert!(UniformGroupRow::new(3, 4).is_err());
    assert!(UniformGroupRow::new(2, 0).is_err());
    assert!(UniformGroupRow::new(2, 32).unwrap().validate(48).is_err());
}

/// Round-trip error ≤ s/2 per element (s the group's stored step) at 2, 3, 4 bits on random
/// rows, with s recomputed here from the group's min/max: (max − min)/(2^b − 1), up to f16's
/// outward rounding (≤ 2⁻¹⁰ relative, plus the min's rounding).
#[test]
fn uniform_rows_error_bound() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for bits in 2..=4u8 {
        let c = UniformGroupRow::new(bits, 32).unwrap();
        for _ in 0..200 {
            let x: Vec<f32> = (0..64).map(|_| rng.random_range(-3.0..5.0)).collect();
            let mut row = vec![0u8; c.row_bytes(64)];
            c.encode(&x, &mut row);
            let mut out = vec![0f32; 64];
            c.decode(&row, &mut out);
            for (xs, os) in x.chunks(32).zip(out.chunks(32)) {
                let lo = xs.iter().cloned().fold(f32::INFINITY, f32::min);
                let hi = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let step = (hi - lo) / ((1 << bits) - 1) as f32;
                let slack = step * 2e-3 + lo.abs() * 2e-3;
                for (a, b) in xs.iter().zip(os) {
                    assert!(
                        (a - b).abs() <= step / 2.0 + slack,
                        "bits {bits}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// At 4 bits the generic codec stores exactly Int4GroupRow's bytes (same rounding, same
/// nibble order), so swapping it in later keeps every baseline number.
#[test]
fn uniform_four_bit_is_int4_group_bytes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for group in [32usize, 64] {
        let (a, b) = (
            UniformGroupRow::new(4, group).unwrap(),
            Int4GroupRow { group },
        );
        assert_eq!(a.row_bytes(64), b.row_bytes(64));
        for _ in 0..100 {
            let x: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
            let (mut ra, mut rb) = (vec![0u8; a.row_bytes(64)], vec![0u8; 64]);
            rb.truncate(b.row_bytes(64));
            a.encode(&x, &mut ra);
            b.encode(&x, &mut rb);
            assert_eq!(ra, rb);
        }
    }
}

/// 2-bit per-channel parameters by hand (what a KIVI int2 key block stores per channel):
/// channel values (−1, 0.5, 2): m = −1, s = 3/3 = 1; codes round((v + 1)/1) = 0, 2 (1.5 rounds
/// away from zero), 3.
#[test]
fn asym_params_two_bits_by_hand() {
    let (s, m) = asym_params(-1.0, 2.0, 2);
    assert_eq!((s.to_f32(), m.to_f32()), (1.0, -1.0));
    let codes: Vec<u8> = [-1.0f32, 0.5, 2.0]
        .iter()
        .map(|&v| asym_code(v, s, m, 2))
        .collect();
    assert_eq!(codes, [0, 2, 3]);
    // Constant channel: step 0, every code 0, decodes to the minimum.
    let (s, m) = asym_params(0.25, 0.25, 2);
    assert_eq!(s.to_f32(), 0.0);
    assert_eq!(asym_code(0.25, s, m, 2), 0);
}

/// vLLM's byte formulas by hand for d = 128: FP8 keys 128 B; MSE keys 128·b/8 + 2; values
/// 128·b/8 + 4. k8v4 = 128 + 68 = 196 (512/196 = 2.6×, vLLM's figure); 4bit_nc = 66 + 68 = 134
/// (3.8×, vLLM's figure); k3v4_nc = 50 + 68 = 118; 3bit_nc = 50 + 52 = 102.
#[test]
fn presets_parse_and_count_bytes() {
    let want = [196, 134, 118, 102];
    for (p, w) in TurboQuantPreset::ALL.into_iter().zip(want) {
        assert_eq!(p.name().parse::<TurboQuantPreset>().unwrap(), p);
        assert_eq!(p.to_string(), p.name());
        assert_eq!(p.slot_bytes(128), w, "{p}");
    }
    assert!((512.0 / 196.0f64 - 2.6).abs() < 0.05 && (512.0 / 134.0f64 - 3.8).abs() < 0.05);
    assert_eq!(
        TurboQuantPreset::K8V4.fp8_keys_quant(),
        Some(Quant::Fp8 {
            kind: Fp8Kind::E4M3,
            scale: Fp8Scale::None
        })
    );
    assert_eq!(TurboQuantPreset::K3V4Nc.fp8_keys_quant(), None);
    assert_eq!(TurboQuantPreset::ThreeBitNc.value_bits(), 3);
    let e = "turboquant_2bit"
        .parse::<TurboQuantPreset>()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("turboquant_k8v4") && e.contains("turboquant_3bit_nc"),
        "{e}"
    );
}

/// The stream reads the stored form: scores on rotated queries equal ⟨q, decode(row)⟩, and the
/// rotated-basis weighted sum equals Σ w·decode(row) (both recomputed here row by row from
/// `decode`); a row whose weights are all zero is skipped; bytes are rows × row bytes.
#[test]
fn turboquant_stream_scores_and_sums_like_decoded_rows() {
    use crate::kv::stream::Stream;
    let (d, n, nq) = (64, 40, 3);
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let rows: Vec<f32> = (0..n * d).map(|_| rng.random_range(-2.0..2.0)).collect();
    let qs: Vec<f32> = (0..nq * d).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
    w[5 * nq..6 * nq].fill(0.0);
    let codecs = [
        TqCodec::Mse(Arc::new(TurboQuantMse::new(d, 3, true, 1).unwrap())),
        TqCodec::Mse(Arc::new(TurboQuantMse::new(d, 4, false, 2).unwrap())),
        TqCodec::Prod(Arc::new(TurboQuantProd::new(d, 3, 3).unwrap())),
    ];
    for codec in codecs {
        let mut s = TurboQuantStream::new(codec.clone());
        assert_eq!(s.push(&rows[..10 * d]) + s.push(&rows[10 * d..]), 0);
        assert_eq!(s.len(), n);
        assert_eq!(s.bytes(), n * codec.row_bytes());
        let mut dec = vec![0f32; n * d];
        for t in 0..n {
            s.decode(t, &mut dec[t * d..(t + 1) * d]);
        }
        let (t0, t1) = (3, 37);
        let mut out = vec![0f32; (t1 - t0) * nq];
        s.dot_rows(t0, t1, &qs, &mut out);
        let mut acc = vec![0.5f32; nq * d];
        s.axpy_rows(t0, t1, &w[t0 * nq..t1 * nq], &mut acc);
        let mut want_acc = vec![0.5f32; nq * d];
        for t in t0..t1 {
            let k = &dec[t * d..(t + 1) * d];
            for j in 0..nq {
                let q = &qs[j * d..(j + 1) * d];
                let want: f32 = k.iter().zip(q).map(|(a, b)| a * b).sum();
                let got = out[(t - t0) * nq + j];
                assert!(
                    (got - want).abs() < 1e-3 * (1.0 + want.abs()),
                    "{got} vs {want}"
                );
                let wj = w[t * nq + j];
                for c in 0..d {
                    want_acc[j * d + c] += wj * k[c];
                }
            }
        }
        for (a, b) in acc.iter().zip(&want_acc) {
            assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "{a} vs {b}");
        }
        // Eviction moves the last row into the hole.
        let mut last = vec![0f32; d];
        s.decode(n - 1, &mut last);
        s.swap_remove(2);
        let mut moved = vec![0f32; d];
        s.decode(2, &mut moved);
        assert_eq!(moved, last);
        assert_eq!(s.len(), n - 1);
        s.clear();
        assert_eq!((s.len(), s.bytes()), (0, 0));
    }
}

/// One codebook per (bits, head_dim) in the process.
#[test]
fn codebooks_are_shared() {
    let a = Codebook::shared(3, 64).unwrap();
    let b = Codebook::shared(3, 64).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(*a, Codebook::for_head_dim(3, 64).unwrap());
    assert!(Codebook::shared(9, 64).is_err());
}
