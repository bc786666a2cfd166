//! Property tests: every quantizer's round-trip error stays within its theoretical bound.

use kvbench::kv::format::{F16Row, Int4GroupRow, Int8TokenRow, RowCodec};
use proptest::prelude::*;

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

/// Rows of 64 values spanning the magnitudes seen in K/V activations (including outliers).
fn rows() -> impl Strategy<Value = Vec<f32>> {
    (prop::collection::vec(-1.0f32..1.0, 64), -3i32..6).prop_map(|(v, e)| {
        let s = 2f32.powi(e);
        v.into_iter().map(|x| x * s).collect()
    })
}

proptest! {
    /// int8 per-token absmax: |x − x̂| ≤ scale / 2, scale = absmax/127 rounded up to f16, so
    /// also ≤ absmax/254 · (1 + 2⁻¹⁰).
    #[test]
    fn int8_token_error_within_half_step(x in rows()) {
        let (bytes, y) = roundtrip(Int8TokenRow, &x);
        let scale = f16_at(&bytes, 0);
        let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        prop_assert!(scale >= absmax / 127.0);
        prop_assert!(scale <= absmax / 127.0 * (1.0 + 1.0 / 1024.0) + 1e-7);
        for (a, b) in x.iter().zip(&y) {
            prop_assert!((a - b).abs() <= scale / 2.0 * (1.0 + 1e-5) + 1e-9, "{} vs {}", a, b);
        }
    }

    /// int4 asymmetric, group 32: per group |x − x̂| ≤ d / 2 with d ≥ (max − min)/15, and d no
    /// larger than the exact step by more than the f16 rounding of scale and minimum.
    #[test]
    fn int4_group_error_within_half_step(x in rows(), group in prop::sample::select(vec![8usize, 16, 32, 64])) {
        let c = Int4GroupRow { group };
        let (bytes, y) = roundtrip(c, &x);
        let block = 4 + group / 2;
        for (g, (xs, ys)) in x.chunks(group).zip(y.chunks(group)).enumerate() {
            let d = f16_at(&bytes, g * block);
            let m = f16_at(&bytes, g * block + 2);
            let lo = xs.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            prop_assert!(m <= lo);
            prop_assert!(m + 15.0 * d >= hi * (1.0 - 1e-6) - 1e-6);
            prop_assert!(d <= (hi - lo) / 15.0 * 1.01 + 1e-4);
            for (a, b) in xs.iter().zip(ys) {
                prop_assert!((a - b).abs() <= d / 2.0 * (1.0 + 1e-4) + 1e-6, "{} vs {}", a, b);
            }
        }
    }

    /// fp16: relative error ≤ 2⁻¹¹ for normal values.
    #[test]
    fn f16_error_within_half_ulp(x in rows()) {
        let (_, y) = roundtrip(F16Row, &x);
        for (a, b) in x.iter().zip(&y) {
            prop_assert!((a - b).abs() <= a.abs() / 2048.0 + 6e-8);
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
