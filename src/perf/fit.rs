//! Fitting a device profile to measurements (`kvbench calibrate`): the rates each term class
//! reaches on the machine, from timed prefills and decode steps of a real model, then peaks and
//! efficiencies so that the performance model ([`super::PerfModel`]) reproduces them.
//!
//! The measured path adds memory traffic and arithmetic within an op (a CPU: `overlap =
//! false`), so each timing is a sum of terms linear in the unknown inverse rates:
//! - prefill of T tokens: `W_p/R_w + 2·N·T/R_mm + 2·q·d·L·(T² + T)/R_attn + o` — least squares
//!   on (1, T, T²) gives the matmul and attention rates from the slope and the curvature;
//! - decode step of b sequences at a short context: `W_d/R_w + 2·N·b/R_dm + o` — least squares
//!   on (1, b) gives the decode matmul rate; with prefill's intercept (other weights, W_p ≠
//!   W_d) the two intercepts give the weight-read rate R_w and the fixed cost o;
//! - a decode step per scheme at a long context: what is left after the above is the scheme's
//!   K/V read, `b·(held + 1)·bytes_per_token / R_kv[scheme]`.
//!
//! Peaks are then the largest of the probes (a STREAM-like read, a GEMM) and the rates seen,
//! and each efficiency a rate over its peak, so every efficiency lies in (0, 1].

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::kv::KvScheme;

use super::profile::{DeviceProfile, Efficiency, Overhead};
use super::{ModelShape, PerfModel};

/// What `kvbench calibrate` measured, seconds per timing.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Samples {
    /// The read-bandwidth probe's best, GB/s.
    pub probe_bw_gb_s: f64,
    /// The GEMM probe's best, TFLOP/s.
    pub probe_tflops: f64,
    /// `(tokens, s)`: one sequence's prefill with nothing cached.
    pub prefill: Vec<(usize, f64)>,
    /// `(batch, context, s)`: one decode step with the baseline (fp16) cache at a short
    /// context, each sequence having seen `context` tokens.
    pub decode: Vec<(usize, usize, f64)>,
    /// `(scheme, batch, context, s)`: one decode step with each scheme's cache at a long
    /// context.
    pub scheme_steps: Vec<(KvScheme, usize, usize, f64)>,
}

/// One timing against what the fitted profile predicts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FitPoint {
    /// What was timed (`prefill 128`, `decode fp16 b4 c32`).
    pub what: String,
    /// Measured, ms.
    pub measured_ms: f64,
    /// The fitted profile's prediction, ms.
    pub predicted_ms: f64,
}

impl FitPoint {
    /// `predicted / measured − 1`, %.
    pub fn error_pct(&self) -> f64 {
        100.0 * (self.predicted_ms / self.measured_ms - 1.0)
    }
}

/// Least squares `y ≈ X·β` for a few columns (normal equations, Gaussian elimination with
/// partial pivoting). Errors: too few points or a singular system.
fn least_squares(rows: &[Vec<f64>], y: &[f64]) -> Result<Vec<f64>> {
    let k = rows.first().map_or(0, Vec::len);
    if rows.len() < k || k == 0 {
        return Err(bad(format!("{} timings cannot fit {k} terms", rows.len())));
    }
    let mut a = vec![vec![0.0; k + 1]; k];
    for (r, &yi) in rows.iter().zip(y) {
        for i in 0..k {
            for j in 0..k {
                a[i][j] += r[i] * r[j];
            }
            a[i][k] += r[i] * yi;
        }
    }
    for c in 0..k {
        let p = (c..k)
            .max_by(|&x, &y| a[x][c].abs().total_cmp(&a[y][c].abs()))
            .expect("rows");
        a.swap(c, p);
        if a[c][c].abs() < 1e-300 {
            return Err(bad(
                "the timings do not separate the terms (singular fit)".into()
            ));
        }
        for r in 0..k {
            if r != c {
                let f = a[r][c] / a[c][c];
                for j in c..=k {
                    a[r][j] -= f * a[c][j];
                }
            }
        }
    }
    Ok((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

fn bad(reason: String) -> Error {
    Error::InvalidArgument {
        name: "kvbench calibrate".into(),
        reason,
    }
}

/// A rate from a fitted inverse rate (`1/R`), refusing a non-positive one with `what`.
fn rate(inv: f64, what: &str) -> Result<f64> {
    if inv.is_finite() && inv > 0.0 {
        Ok(1.0 / inv)
    } else {
        Err(bad(format!(
            "the {what} term came out {inv:.3e} s per unit: the timings are too noisy or too \
             few to separate it (rerun on an idle machine, with more repeats)"
        )))
    }
}

/// The profile of the machine that produced `samples` for a model of `shape` (K/V per token of
/// each scheme from its own accounting): `name`, with every efficiency fitted. Also each
/// timing against the profile's prediction. Errors: [`Error::InvalidArgument`] when the
/// timings cannot be fitted (too few, or a term that comes out non-positive).
pub fn fit(
    name: &str,
    description: &str,
    shape: &ModelShape,
    samples: &Samples,
) -> Result<(DeviceProfile, Vec<FitPoint>)> {
    let (n, l) = (shape.params as f64, shape.layers as f64);
    let qdl = (shape.q_heads * shape.head_dim) as f64 * l;
    // Prefill: y = a + s·T + q·T².
    let rows: Vec<Vec<f64>> = samples
        .prefill
        .iter()
        .map(|&(t, _)| vec![1.0, t as f64, (t * t) as f64])
        .collect();
    let y: Vec<f64> = samples.prefill.iter().map(|p| p.1).collect();
    let [a_p, s_p, q_p] = least_squares(&rows, &y)?[..] else {
        unreachable!("three columns")
    };
    let (a_p, r_mm, r_attn) = if q_p > 0.0 {
        let r_attn = rate(q_p / (2.0 * qdl), "prefill attention")?;
        // The slope holds the matmul and attention's linear part (2·q·d·L·T).
        let r_mm = rate((s_p - 2.0 * qdl / r_attn) / (2.0 * n), "prefill matmul")?;
        (a_p, r_mm, r_attn)
    } else {
        // The prompts are too short for attention's T² to stand out of the noise: attention's
        // arithmetic is taken to run at the matmuls' rate, and the line refitted.
        let rows: Vec<Vec<f64>> = rows.iter().map(|r| r[..2].to_vec()).collect();
        let [a, s] = least_squares(&rows, &y)?[..] else {
            unreachable!("two columns")
        };
        let r = rate(s / (2.0 * n + 2.0 * qdl), "prefill matmul")?;
        (a, r, r)
    };
    // Decode at a short context: y = a + s·b (the short cache's reads are in the slope).
    let rows: Vec<Vec<f64>> = samples
        .decode
        .iter()
        .map(|&(b, _, _)| vec![1.0, b as f64])
        .collect();
    let y: Vec<f64> = samples.decode.iter().map(|d| d.2).collect();
    let [a_d, s_d] = least_squares(&rows, &y)?[..] else {
        unreachable!("two columns")
    };
    let r_dm = rate(s_d / (2.0 * n), "decode matmul")?;
    // Two intercepts, two unknowns: W_p/R_w + o = a_p, W_d/R_w + o = a_d.
    let (w_p, w_d) = (
        shape.prefill_weight_bytes as f64,
        shape.decode_weight_bytes as f64,
    );
    let (r_w, o) = match (a_p - a_d) / (w_p - w_d) {
        inv if inv.is_finite() && inv > 0.0 && a_d - w_d * inv >= 0.0 => {
            (1.0 / inv, a_d - w_d * inv)
        }
        // Not separable (the same weights in both phases, or noise): all intercept is weights.
        _ => (rate(a_d / w_d, "weight read")?, 0.0),
    };
    let fp16_decode = |b: f64| a_d + s_d * b;
    let mut r_kv: BTreeMap<String, f64> = BTreeMap::new();
    for &(scheme, b, c, t) in &samples.scheme_steps {
        let held = (scheme.held_tokens(c) + 1) as f64 * b as f64;
        let geom = crate::kv::CacheGeometry {
            layers: shape.layers,
            kv_heads: shape.kv_heads,
            q_heads: shape.q_heads,
            head_dim: shape.head_dim,
        };
        let bytes = held * scheme.bytes_per_token(&geom) as f64;
        let rest = t - fp16_decode(b as f64) - 4.0 * qdl * held / r_attn;
        // A scheme whose reads vanish in the noise (an eviction window's few tokens) is read
        // as fast as the weights.
        let r = if rest > 0.0 { bytes / rest } else { r_w };
        r_kv.entry(scheme.to_string())
            .and_modify(|x| *x = x.min(r))
            .or_insert(r);
    }
    let bw = r_kv
        .values()
        .fold(samples.probe_bw_gb_s * 1e9, |m, &r| m.max(r))
        .max(r_w);
    let peak = [r_mm, r_dm, r_attn]
        .iter()
        .fold(samples.probe_tflops * 1e12, |m, &r| m.max(r));
    let default_kv = r_kv.get("fp16").copied().unwrap_or(r_w);
    let profile = DeviceProfile {
        name: name.into(),
        description: description.into(),
        calibrated: true,
        overlap: false,
        memory_gib: crate::util::memory::total_bytes().unwrap_or(1 << 30) as f64
            / (1u64 << 30) as f64,
        mem_bw_gb_s: bw / 1e9,
        matmul_tflops: peak / 1e12,
        weights_dtype: None,
        prefill_weights_dtype: None,
        link: None,
        efficiency: Efficiency {
            weights: r_w / bw,
            matmul: r_mm / peak,
            decode_matmul: Some(r_dm / peak),
            kv_read: default_kv / bw,
            kv_read_by_scheme: r_kv.iter().map(|(k, v)| (k.clone(), v / bw)).collect(),
            kv_write: r_w / bw,
            attention: r_attn / peak,
            allreduce: 1.0,
        },
        overhead: Overhead {
            step_us: o * 1e6,
            layer_us: 0.0,
        },
        sources: BTreeMap::new(),
    };
    profile.validate()?;
    let points = check(&profile, shape, samples)?;
    Ok((profile, points))
}

/// Every timing of `samples` against `profile`'s prediction.
fn check(profile: &DeviceProfile, shape: &ModelShape, samples: &Samples) -> Result<Vec<FitPoint>> {
    let model = |s: KvScheme| PerfModel::new(profile.clone(), shape.clone(), s, 1);
    let base = model(KvScheme::FP16)?;
    let point = |what: String, measured: f64, predicted: f64| FitPoint {
        what,
        measured_ms: measured * 1e3,
        predicted_ms: predicted * 1e3,
    };
    let mut out = Vec::new();
    for &(t, y) in &samples.prefill {
        out.push(point(
            format!("prefill {t}"),
            y,
            base.seconds(&base.prefill(t, 0)),
        ));
    }
    for &(b, c, y) in &samples.decode {
        let p = base.seconds(&base.decode(&vec![c; b]));
        out.push(point(format!("decode fp16 b{b} c{c}"), y, p));
    }
    for &(s, b, c, y) in &samples.scheme_steps {
        let m = model(s)?;
        let p = m.seconds(&m.decode(&vec![c; b]));
        out.push(point(format!("decode {s} b{b} c{c}"), y, p));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ModelShape {
        ModelShape {
            layers: 30,
            q_heads: 9,
            kv_heads: 3,
            head_dim: 64,
            params: 134_515_008,
            decode_weight_bytes: 143_000_000,
            prefill_weight_bytes: 538_000_000,
        }
    }

    /// Timings made by hand from known rates — weights read at 20 GB/s, prefill GEMM at 50
    /// GFLOP/s, decode matmuls at 30 GFLOP/s, attention arithmetic at 10 GFLOP/s, fp16 K/V at
    /// 15 GB/s and int4's at 5 GB/s, 1 ms fixed per step — fit back to those rates, and the
    /// fitted profile predicts every timing.
    #[test]
    fn known_rates_fit_back() {
        let s = shape();
        let (n, qdl) = (s.params as f64, (9 * 64 * 30) as f64);
        let geom = crate::kv::CacheGeometry {
            layers: 30,
            kv_heads: 3,
            q_heads: 9,
            head_dim: 64,
        };
        let int4: KvScheme = "int4".parse().unwrap();
        let prefill =
            |t: f64| 538e6 / 20e9 + 2.0 * n * t / 50e9 + 2.0 * qdl * (t * t + t) / 10e9 + 1e-3;
        let decode = |sch: KvScheme, b: f64, c: f64, kv_rate: f64| {
            let held = b * (c + 1.0);
            143e6 / 20e9
                + 2.0 * n * b / 30e9
                + held * sch.bytes_per_token(&geom) as f64 / kv_rate
                + 4.0 * qdl * held / 10e9
                + 1e-3
        };
        let samples = Samples {
            probe_bw_gb_s: 10.0,
            probe_tflops: 0.01,
            prefill: [32usize, 128, 256, 384]
                .iter()
                .map(|&t| (t, prefill(t as f64)))
                .collect(),
            // At a context of 0 the short-context reads vanish, as the fit assumes.
            decode: [1usize, 2, 4, 8]
                .iter()
                .map(|&b| {
                    (
                        b,
                        0,
                        decode(KvScheme::FP16, b as f64, 0.0, 15e9)
                            - 4.0 * qdl * b as f64 / 10e9
                            - b as f64 * KvScheme::FP16.bytes_per_token(&geom) as f64 / 15e9,
                    )
                })
                .collect(),
            scheme_steps: vec![
                (
                    KvScheme::FP16,
                    4,
                    1023,
                    decode(KvScheme::FP16, 4.0, 1023.0, 15e9),
                ),
                (int4, 4, 1023, decode(int4, 4.0, 1023.0, 5e9)),
            ],
        };
        let (p, points) = fit("cpu", "test", &s, &samples).unwrap();
        let close = |x: f64, want: f64| (x / want - 1.0).abs() < 1e-6;
        let bw = p.mem_bw_gb_s * 1e9;
        let peak = p.matmul_tflops * 1e12;
        assert!(close(bw, 20e9), "{bw}");
        assert!(close(peak, 50e9), "{peak}");
        assert!(close(p.efficiency.weights * bw, 20e9));
        assert!(close(p.efficiency.decode_matmul.unwrap() * peak, 30e9));
        assert!(close(p.efficiency.attention * peak, 10e9));
        assert!(close(p.efficiency.kv_read_by_scheme["int4"] * bw, 5e9));
        assert!(close(p.efficiency.kv_read_by_scheme["fp16"] * bw, 15e9));
        assert!(close(p.overhead.step_us, 1000.0), "{}", p.overhead.step_us);
        assert!(!p.overlap && p.calibrated);
        for pt in &points {
            assert!(pt.error_pct().abs() < 0.1, "{pt:?}");
        }
    }
}
