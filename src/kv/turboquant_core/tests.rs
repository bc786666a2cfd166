//! vLLM's preset table by hand.

use super::*;

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
