//! Property tests: every quantizer's round-trip error stays within its theoretical bound, on
//! 2,000 seeded random rows each (magnitudes 2⁻³ … 2⁵, so outliers and tiny rows both occur).
//! Plain seeded loops rather than a property-testing crate: its dependency tree would force a
//! second build of candle for the tests (6 minutes of CI), and a failure prints its seed.

use kvbench::kv::format::{
    F16Row, Fp8Row, Int4GroupRow, Int8TokenRow, Mxfp4Row, Nvfp4Row, Q4_0Row, Q8_0Row, RowCodec,
};
use kvbench::kv::Fp8Kind;
use kvbench::util::noise::Noise;

const CASES: u64 = 2000;

fn roundtrip<C: RowCodec>(c: C, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = vec![0u8; c.row_bytes(x.len())];
    c.encode(x, &mut bytes);
    let mut out = vec![0f32; x.len()];
    c.decode(&bytes, &mut out);
    (bytes, out)
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Row `seed`: 64 values spanning the magnitudes seen in K/V activations.
fn row(seed: u64) -> Vec<f32> {
    let mut n = Noise::new(seed);
    let s = 2f32.powi((seed % 9) as i32 - 3);
    (0..64).map(|_| n.uniform() * s).collect()
}

/// int8 per-token absmax: |x − x̂| ≤ scale / 2, scale = absmax/127 rounded up to f16, so
/// also ≤ absmax/254 · (1 + 2⁻¹⁰).
#[test]
fn int8_token_error_within_half_step() {
    for seed in 0..CASES {
        let x = row(seed);
        let (bytes, y) = roundtrip(Int8TokenRow, &x);
        let scale = f16_at(&bytes, 0);
        let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale >= absmax / 127.0);
        assert!(scale <= absmax / 127.0 * (1.0 + 1.0 / 1024.0) + 1e-7);
        for (a, b) in x.iter().zip(&y) {
            assert!(
                (a - b).abs() <= scale / 2.0 * (1.0 + 1e-5) + 1e-9,
                "seed {seed}: {a} vs {b}"
            );
        }
    }
}

/// int4 asymmetric, group 8–64: per group |x − x̂| ≤ d / 2 with d ≥ (max − min)/15, and d no
/// larger than the exact step by more than the f16 rounding of scale and minimum.
#[test]
fn int4_group_error_within_half_step() {
    for seed in 0..CASES {
        let x = row(seed);
        let group = [8usize, 16, 32, 64][(seed % 4) as usize];
        let c = Int4GroupRow { group };
        let (bytes, y) = roundtrip(c, &x);
        let block = 4 + group / 2;
        for (g, (xs, ys)) in x.chunks(group).zip(y.chunks(group)).enumerate() {
            let d = f16_at(&bytes, g * block);
            let m = f16_at(&bytes, g * block + 2);
            let lo = xs.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert!(m <= lo);
            assert!(m + 15.0 * d >= hi * (1.0 - 1e-6) - 1e-6);
            assert!(d <= (hi - lo) / 15.0 * 1.01 + 1e-4);
            for (a, b) in xs.iter().zip(ys) {
                assert!(
                    (a - b).abs() <= d / 2.0 * (1.0 + 1e-4) + 1e-6,
                    "seed {seed}: {a} vs {b}"
                );
            }
        }
    }
}

/// fp16: relative error ≤ 2⁻¹¹ for normal values.
#[test]
fn f16_error_within_half_ulp() {
    for seed in 0..CASES {
        let x = row(seed);
        let (_, y) = roundtrip(F16Row, &x);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= a.abs() / 2048.0 + 6e-8, "seed {seed}");
        }
    }
}

/// ggml Q8_0: codes round(x/d) with the f32 d, values decoded with the f16 d: error ≤ d/2 plus
/// 127·|d − d_f16|.
#[test]
fn q8_0_error_within_half_step() {
    for seed in 0..CASES {
        let x = row(seed);
        let (_, y) = roundtrip(Q8_0Row, &x);
        for (xs, ys) in x.chunks(32).zip(y.chunks(32)) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let dh = half::f16::from_f32(d).to_f32();
            for (a, b) in xs.iter().zip(ys) {
                assert!(
                    (a - b).abs() <= d / 2.0 + 127.0 * (d - dh).abs() + 1e-6,
                    "seed {seed}"
                );
            }
        }
    }
}

/// ggml Q4_0: the code for the largest-magnitude value's sign side is clamped to 15, so the
/// bound is one full step |d| (plus the f16 rounding of d over 8 steps).
#[test]
fn q4_0_error_within_one_step() {
    for seed in 0..CASES {
        let x = row(seed);
        let (_, y) = roundtrip(Q4_0Row, &x);
        for (xs, ys) in x.chunks(32).zip(y.chunks(32)) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 8.0;
            let dh = half::f16::from_f32(d).to_f32();
            for (a, b) in xs.iter().zip(ys) {
                assert!(
                    (a - b).abs() <= d + 8.0 * (d - dh).abs() + 1e-6,
                    "seed {seed}"
                );
            }
        }
    }
}

/// FP8 per-token scale (absmax/448 rounded up): relative error ≤ 2⁻⁴ for values above the
/// subnormal range of the scaled format, never saturating, never NaN; E5M2 ≤ 2⁻³.
#[test]
fn fp8_per_token_error_within_half_ulp() {
    for (kind, rel) in [(Fp8Kind::E4M3, 1.0 / 16.0), (Fp8Kind::E5M2, 1.0 / 8.0)] {
        let c = Fp8Row { kind, scale: None };
        for seed in 0..CASES {
            let x = row(seed);
            let mut bytes = vec![0u8; c.row_bytes(64)];
            assert_eq!(c.encode(&x, &mut bytes), 0);
            let mut y = vec![0f32; 64];
            c.decode(&bytes, &mut y);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in x.iter().zip(&y) {
                assert!(b.is_finite());
                // Below 2⁻⁶·scale values are subnormal in E4M3: absolute step 2⁻⁹·scale.
                let floor =
                    amax / kind.max() * 2f32.powi(if kind == Fp8Kind::E4M3 { -9 } else { -16 });
                assert!(
                    (a - b).abs() <= a.abs() * rel + floor,
                    "{kind:?} seed {seed}: {a} vs {b}"
                );
            }
        }
    }
}

/// E2M1 magnitudes (OCP MX v1.0 §5.3.3), written out here rather than read from the crate.
const E2M1_GRID: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Checks that `got` is a nearest point of `scale` × {0, ±0.5, …, ±6} to `x` (either side of a
/// tie; beyond ±6·scale the nearest is ±6·scale, i.e. saturation), up to f32 rounding.
fn assert_nearest_fp4(x: f32, got: f32, scale: f64, what: &str) {
    let x = x as f64;
    let best = E2M1_GRID
        .iter()
        .flat_map(|&v| [v, -v])
        .map(|v| (x - scale * v).abs())
        .fold(f64::INFINITY, f64::min);
    let err = (x - got as f64).abs();
    assert!(
        err <= best + 1e-6 * scale.max(f64::MIN_POSITIVE),
        "{what}: {x} stored as {got}, a grid point {best} away exists (scale {scale})"
    );
}

/// MXFP4 (MX v1.0 §6.3): each block's E8M0 scale is 2^(⌊log2 amax⌋ − 2), computed here with
/// f64 `log2` (2⁻¹²⁷, byte 0, for an all-zero block), and every element decodes to a nearest
/// point of its scaled E2M1 grid.
#[test]
fn mxfp4_scale_is_the_specs_and_elements_are_nearest() {
    for seed in 0..CASES {
        let x = row(seed);
        let (b, y) = roundtrip(Mxfp4Row, &x);
        for blk in 0..2 {
            let xs = &x[32 * blk..32 * (blk + 1)];
            let amax = xs.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
            let want = if amax == 0.0 {
                -127
            } else {
                amax.log2().floor() as i32 - 2
            };
            assert_eq!(b[17 * blk] as i32 - 127, want, "seed {seed} block {blk}");
            let scale = 2f64.powi(want);
            for i in 0..32 {
                let at = 32 * blk + i;
                assert_nearest_fp4(x[at], y[at], scale, &format!("seed {seed} elt {at}"));
            }
        }
    }
}

/// NVFP4 (arXiv 2509.25149 §2, kvbench's per-row second-level scale): the row scale is
/// amax / (6·448); each block's E4M3 scale is within E4M3's half-ulp of bmax / (6·g) (2⁻⁴
/// relative for normals, 2⁻¹⁰ absolute for subnormals); every element decodes to a nearest
/// point of its block's scaled E2M1 grid.
#[test]
fn nvfp4_scales_are_the_specs_and_elements_are_nearest() {
    for seed in 0..CASES {
        let x = row(seed);
        let (b, y) = roundtrip(Nvfp4Row, &x);
        let amax = x.iter().fold(0f32, |m, &v| m.max(v.abs()));
        let g = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(g, amax / 2688.0, "seed {seed}");
        for blk in 0..4 {
            let xs = &x[16 * blk..16 * (blk + 1)];
            let bmax = xs.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
            let t = bmax / (6.0 * g as f64);
            let sb = float8::F8E4M3::from_bits(b[4 + 9 * blk]).to_f32() as f64;
            assert!(
                (sb - t).abs() <= (t / 16.0).max(2f64.powi(-10)) * (1.0 + 1e-6),
                "seed {seed} block {blk}: E4M3 scale {sb} for {t}"
            );
            let scale = sb * g as f64;
            for i in 0..16 {
                let at = 16 * blk + i;
                assert_nearest_fp4(x[at], y[at], scale, &format!("seed {seed} elt {at}"));
            }
        }
    }
}

/// Stored sizes by hand for head_dim 64: fp16 128 bytes; int8 64 codes + 2-byte scale = 66;
/// int4 group 32: 2 groups × (2 scale + 2 zero-point + 16 packed) = 40.
#[test]
fn row_bytes_by_hand() {
    assert_eq!(F16Row.row_bytes(64), 128);
    assert_eq!(Int8TokenRow.row_bytes(64), 66);
    assert_eq!(Int4GroupRow { group: 32 }.row_bytes(64), 40);
    assert_eq!(Int4GroupRow { group: 64 }.row_bytes(128), 2 * (4 + 32));
}
