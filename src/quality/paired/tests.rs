//! Tests against hand computations and values computed independently with Python's standard
//! library (`statistics`, `math`), quoted with each test.

use super::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

/// NLL (1, 2, 3, 4): x̄ = 2.5, ppl = e^2.5 = 12.182494; mean(x²) − x̄² = 7.5 − 6.25 = 1.25,
/// SE = √(1.25/3) = 0.645497, ppl_se = 12.182494·0.645497 = 7.863766.
#[test]
fn ppl_se_as_llama_cpp_prints_it() {
    let e = ppl_estimate(&[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(e.n, 4);
    assert!(close(e.ppl, 12.182_493_960_703_473, 1e-12));
    assert!(
        close(e.ppl_se, 7.863_766_037_512_831, 1e-12),
        "{}",
        e.ppl_se
    );
    assert!(ppl_estimate(&[2.0]).unwrap().ppl_se.is_nan());
    assert!(ppl_estimate(&[]).is_err());
    let e = ppl_estimate(&[1.0, f64::NAN]).unwrap_err().to_string();
    assert!(e.contains("NLL[1]"), "{e}");
}

/// Windows: scheme (3.0, 3.1, 3.3, 3.2), reference (2.9, 3.0, 3.1, 3.15). Differences
/// (0.1, 0.1, 0.2, 0.05): d̄ = 0.1125, s = 0.0629153, SE = 0.0314576; t₀.₉₇₅,₃ = 3.182446
/// (printed t tables) → d ∈ [0.0123877, 0.2126123]; ΔPPL = 11.9072 % in [1.24648, 23.6905] %;
/// PPL_ref = e^3.0375 = 20.853045, ΔPPL = 2.483019 in [0.259929, 4.940190].
/// (Python: statistics.mean/stdev, math.exp.)
#[test]
fn paired_t_interval_by_hand() {
    let s = [3.0, 3.1, 3.3, 3.2];
    let r = [2.9, 3.0, 3.1, 3.15];
    let d = paired_delta(&s, &r, CiMethod::StudentT).unwrap();
    assert_eq!(d.n, 4);
    assert!(close(d.mean_diff, 0.1125, 1e-12));
    assert!(close(d.diff_se, 0.031_457_643_480_294_68, 1e-12));
    assert!(
        close(d.diff_ci[0], 0.012_387_738_733_186_66, 1e-6),
        "{:?}",
        d.diff_ci
    );
    assert!(close(d.diff_ci[1], 0.212_612_261_266_813_43, 1e-6));
    assert!(close(d.delta_pct, 11.907_225_691_278_068, 1e-10));
    assert!(close(d.delta_pct_ci[0], 1.246_478_458_123_423_4, 1e-5));
    assert!(close(d.delta_pct_ci[1], 23.690_496_228_946_657, 1e-6));
    assert!(close(d.ppl_ref, 20.853_045_401_483_406, 1e-12));
    assert!(close(d.ppl, 23.336_064_580_942_71, 1e-12));
    assert!(close(d.delta_ppl, 2.483_019_179_459_305, 1e-10));
    assert!(close(d.delta_ppl_ci[0], 0.259_928_718_792_187_8, 1e-5));
    assert!(close(d.delta_ppl_ci[1], 4.940_189_934_458_96, 1e-6));
    // The gate: the interval lies above 1 % but not above 2 %; its half-width (11.2 pp) dwarfs
    // a 1 % threshold. Per-window SD = 11.222·√4 / t₀.₉₇₅(3) = 11.222·2 / 3.18245 = 7.0524 pp;
    // the smallest m with t₀.₉₇₅(m−1)·7.0524/√m ≤ 1 is 194 (t quantiles by Simpson integration
    // of the t density in Python, independent of statrs): about 194 windows.
    assert!(d.significantly_above(1.0) && !d.significantly_above(2.0));
    assert!(close(d.resolution_pct(), 11.222_008_885_411_617, 1e-6));
    let w = d.too_few_windows(1.0).unwrap();
    assert!(
        w.contains("about 194 windows") && w.contains("--ppl-windows"),
        "{w}"
    );
    assert!(d.too_few_windows(20.0).is_none());
}

/// [`windows_needed`] against t quantiles computed independently (Simpson integration of the
/// Student-t density and bisection, in Python): the CI suite's 2-window intervals (±36.40 % →
/// 66 windows for 1 %, ±1.21 % → 3) and the degenerate inputs.
#[test]
fn windows_needed_by_hand() {
    use WindowsNeeded::About;
    assert_eq!(windows_needed(2, 36.40, 1.0), Some(About(66)));
    assert_eq!(windows_needed(2, 53.61, 1.0), Some(About(140)));
    assert_eq!(windows_needed(2, 1.21, 1.0), Some(About(3)));
    assert_eq!(windows_needed(8, 2.5, 1.0), Some(About(37)));
    // Already narrow enough: the answer never exceeds n.
    assert!(matches!(windows_needed(32, 0.5, 1.0), Some(About(m)) if m <= 32));
    assert_eq!(windows_needed(1, 3.0, 1.0), None);
    assert_eq!(windows_needed(4, f64::NAN, 1.0), None);
    assert_eq!(windows_needed(4, 3.0, 0.0), None);
    assert_eq!(windows_needed(4, 3.0, f64::INFINITY), None);
    assert_eq!(windows_needed(4, -3.0, 1.0), None);
}

/// Issue 25: `gate --max-ppl-delta 0.0001%` on a 2-window result hung (the search stepped m up
/// from ~10⁸, where statrs' t quantile does not return). By hand: n = 2, ±1 % gives a per-window
/// SD of 1·√2 / t₀.₉₇₅(1) = 1.41421 / tan(0.475π) = 1.41421 / 12.70620 = 0.111301 %. For a
/// 0.0005 % target, the smallest m with t₀.₉₇₅(m−1)·0.111301/√m ≤ 0.0005 is 190,354 (bisection
/// in Python with the t quantile from the Cornish–Fisher expansion, A&S 26.7.5, t₀.₉₇₅(190353)
/// = 1.959968); for 0.0001 %, (1.96·0.111301 / 0.0001)² = 4.76·10⁶ is past the cap.
#[test]
fn gate_tiny_ppl_delta_answers_at_once() {
    assert_eq!(
        windows_needed(2, 1.0, 5e-4),
        Some(WindowsNeeded::About(190_354))
    );
    let more = Some(WindowsNeeded::MoreThan(MAX_WINDOWS_NEEDED));
    assert_eq!(windows_needed(2, 1.0, 1e-4), more);
    assert_eq!(windows_needed(2, 1.0, 1e-300), more);
    let w = too_few_windows(2, 1.0, 1e-4).unwrap();
    assert!(
        w.contains("more than 1000000 windows") && w.contains("raise the limit"),
        "{w}"
    );
}

/// Issue 25: an interval of ±1e300 or a huge window count hung the same search (the normal
/// start saturated to usize::MAX and `m += 1` wrapped). Both answer "more than" the cap: with
/// ±10³⁰⁰ the SD is ~10²⁹⁹ %; with n = usize::MAX (1.8·10¹⁹) windows at ±2 % the SD is
/// 2·√(1.8·10¹⁹)/1.96 ≈ 4.4·10⁹ %, and even 10⁶ windows leave ±8.6·10⁶ %.
#[test]
fn gate_huge_interval_or_window_count_answers_at_once() {
    let more = Some(WindowsNeeded::MoreThan(MAX_WINDOWS_NEEDED));
    assert_eq!(windows_needed(2, 1e300, 1.0), more);
    assert_eq!(windows_needed(2, f64::MAX, 1e-300), more);
    assert_eq!(windows_needed(usize::MAX, 2.0, 1.0), more);
    // A huge n with a narrow interval: already enough, answered as a small count.
    assert_eq!(
        windows_needed(usize::MAX, 0.0, 1.0),
        Some(WindowsNeeded::About(2))
    );
    assert!(too_few_windows(2, 1e300, 1.0)
        .unwrap()
        .contains("more than 1000000"));
}

/// For per-token input the paired SE equals llama.cpp's `ln(PPL(Q)/PPL(base))` uncertainty,
/// `sqrt(se_q² + se_b² − 2·cov)` with its `mean_and_uncertainty` and `covariance` lambdas
/// (population moments divided by n − 1), written out here independently.
#[test]
fn paired_se_is_llama_cpp_log_ratio_uncertainty() {
    let q: Vec<f64> = (0..50)
        .map(|i| 2.0 + ((i * 37) % 11) as f64 * 0.3)
        .collect();
    let b: Vec<f64> = q
        .iter()
        .enumerate()
        .map(|(i, x)| x - 0.05 + ((i * 13) % 7) as f64 * 0.02)
        .collect();
    let n = q.len() as f64;
    let mu = |v: &[f64]| {
        let f = v.iter().sum::<f64>() / n;
        let df = v.iter().map(|x| x * x).sum::<f64>() / n - f * f;
        (f, (df / (n - 1.0)).sqrt())
    };
    let ((fq, sq), (fb, sb)) = (mu(&q), mu(&b));
    let cov = (q.iter().zip(&b).map(|(x, y)| x * y).sum::<f64>() / n - fq * fb) / (n - 1.0);
    let llama = (sq * sq + sb * sb - 2.0 * cov).sqrt();
    let d = paired_delta(&q, &b, CiMethod::StudentT).unwrap();
    assert!(close(d.diff_se, llama, 1e-9), "{} vs {llama}", d.diff_se);
    assert!(close(d.mean_diff, fq - fb, 1e-12));
}

/// Bootstrap: constant differences give a zero-width interval at the point; on 400 smooth
/// differences its width is within 15 % of the t interval's (both estimate the same normal
/// sampling distribution); the same seed repeats, another seed differs.
#[test]
fn bootstrap_interval_behaves() {
    let r: Vec<f64> = (0..20).map(|i| 3.0 + i as f64 * 0.01).collect();
    let s: Vec<f64> = r.iter().map(|x| x + 0.25).collect();
    let m = CiMethod::Bootstrap {
        resamples: 2000,
        seed: 1,
    };
    let d = paired_delta(&s, &r, m).unwrap();
    assert!(close(d.diff_ci[0], 0.25, 1e-12) && close(d.diff_ci[1], 0.25, 1e-12));

    let r: Vec<f64> = (0..400).map(|i| 3.0 + (i % 17) as f64 * 0.1).collect();
    let s: Vec<f64> = r
        .iter()
        .enumerate()
        .map(|(i, x)| x + 0.02 + ((i * 7919) % 101) as f64 / 100.0 * 0.1 - 0.05)
        .collect();
    let t = paired_delta(&s, &r, CiMethod::StudentT).unwrap();
    let b = paired_delta(
        &s,
        &r,
        CiMethod::Bootstrap {
            resamples: 4000,
            seed: 7,
        },
    )
    .unwrap();
    let (wt, wb) = (t.diff_ci[1] - t.diff_ci[0], b.diff_ci[1] - b.diff_ci[0]);
    assert!((wb / wt - 1.0).abs() < 0.15, "{wb} vs {wt}");
    assert!(b.diff_ci[0] < b.mean_diff && b.mean_diff < b.diff_ci[1]);
    let b2 = paired_delta(
        &s,
        &r,
        CiMethod::Bootstrap {
            resamples: 4000,
            seed: 7,
        },
    )
    .unwrap();
    assert_eq!(b.diff_ci, b2.diff_ci);
    let b3 = paired_delta(
        &s,
        &r,
        CiMethod::Bootstrap {
            resamples: 4000,
            seed: 8,
        },
    )
    .unwrap();
    assert_ne!(b.diff_ci, b3.diff_ci);
}

#[test]
fn paired_rejects_bad_input() {
    let e = paired_delta(&[1.0, 2.0], &[1.0], CiMethod::StudentT)
        .unwrap_err()
        .to_string();
    assert!(e.contains("same windows"), "{e}");
    assert!(paired_delta(&[1.0], &[1.0], CiMethod::StudentT).is_err());
    assert!(paired_delta(&[], &[], CiMethod::StudentT).is_err());
    assert!(paired_delta(&[1.0, f64::INFINITY], &[1.0, 1.0], CiMethod::StudentT).is_err());
    let m = CiMethod::Bootstrap {
        resamples: 10,
        seed: 0,
    };
    assert!(paired_delta(&[1.0, 2.0], &[1.0, 1.5], m).is_err());
}

/// Window means by hand: (1, 2, 3, 5, 7, 9) in windows of 3 → (2, 7).
#[test]
fn window_means_by_hand() {
    assert_eq!(
        window_means(&[1.0, 2.0, 3.0, 5.0, 7.0, 9.0], 3).unwrap(),
        [2.0, 7.0]
    );
    assert!(window_means(&[1.0, 2.0, 3.0], 2).is_err());
    assert!(window_means(&[1.0], 0).is_err());
}

/// KL values: 2000 of the form ((i·7919) mod 1000)/1000·0.01 plus three outliers 0.5, 1.25,
/// 3.0. Python's `statistics.quantiles(kl, n=1000, method='inclusive')` (type 7) gives
/// p99.9 = 0.49901998, p99 = 0.0099098, p95 = 0.009509, p90 = 0.009008;
/// `statistics.median` = 0.005, `statistics.mean` = 0.007358961557663505.
#[test]
fn kl_percentiles_match_python() {
    let mut kl: Vec<f64> = (0..2000)
        .map(|i| ((i * 7919) % 1000) as f64 / 1000.0 * 0.01)
        .collect();
    kl.extend([0.5, 1.25, 3.0]);
    let k = kl_stats(&kl).unwrap();
    assert_eq!(k.n, 2003);
    assert!(close(k.p99_9, 0.499_019_98, 1e-9), "{}", k.p99_9);
    assert!(close(k.p99, 0.009_909_8, 1e-9));
    assert!(close(k.p95, 0.009_509, 1e-9));
    assert!(close(k.p90, 0.009_008, 1e-9));
    assert!(close(k.median, 0.005, 1e-12));
    assert!(close(k.mean, 0.007_358_961_557_663_505, 1e-12));
    assert_eq!(k.max, 3.0);
    assert!(kl_stats(&[]).is_err());
    assert!(kl_stats(&[0.1, f64::NAN]).is_err());
}

/// Same top p by hand: (1, 2, 3, 4) vs (1, 2, 0, 4) → 3/4, SE = √(0.75·0.25/3) = 0.25.
/// top1 takes the first maximum (llama.cpp's strict `>` scan) and skips NaN.
#[test]
fn same_top_p_by_hand() {
    let s = same_top(&[1, 2, 3, 4], &[1, 2, 0, 4]).unwrap();
    assert_eq!((s.n, s.same), (4, 3));
    assert_eq!(s.p, 0.75);
    assert!(close(s.se, 0.25, 1e-15));
    assert!(same_top(&[1], &[1, 2]).is_err());
    assert!(same_top(&[], &[]).is_err());
    assert_eq!(top1(&[1.0, 3.0, 3.0, -1.0]), Some(1));
    assert_eq!(top1(&[f32::NAN, -2.0, -1.0]), Some(2));
    assert_eq!(top1(&[]), None);
}

/// Noise floor by hand: perplexities (10, 10.2, 9.9): mean 10.03333, sd √(0.046667/2) =
/// 0.152753, spread 0.3/10.03333 = 2.9900 %.
#[test]
fn noise_floor_by_hand() {
    let f = noise_floor(&[10.0, 10.2, 9.9]).unwrap();
    assert_eq!(f.runs, 3);
    assert!(close(f.mean, 10.033_333_333_333_333, 1e-12));
    assert!(close(f.sd, 0.152_752_523_165_195, 1e-9), "{}", f.sd);
    assert_eq!((f.min, f.max), (9.9, 10.2));
    assert!(
        close(f.spread_pct, 2.990_033_222_591_36, 1e-9),
        "{}",
        f.spread_pct
    );
    assert!(noise_floor(&[]).is_err());
}

/// Each finite value moves by exactly one ulp (to its f32 neighbour, checked through the bit
/// patterns), about half up; the same seed repeats; infinities stay.
#[test]
fn perturbation_is_one_ulp() {
    let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.37).collect();
    let mut y = x.clone();
    perturb_rounding(&mut y, &mut SplitMix64::new(3));
    let mut ups = 0;
    for (a, b) in x.iter().zip(&y) {
        let (ua, ub) = (a.to_bits() as i64, b.to_bits() as i64);
        // Same sign: neighbours differ by 1 in the bit pattern; 0 steps to ±the smallest
        // subnormal.
        if *a == 0.0 {
            assert!(b.abs() == f32::from_bits(1));
        } else {
            assert_eq!((ua - ub).abs(), 1, "{a} → {b}");
        }
        ups += (b > a) as usize;
    }
    assert!((400..600).contains(&ups), "{ups}");
    let mut z = x.clone();
    perturb_rounding(&mut z, &mut SplitMix64::new(3));
    assert_eq!(y, z);
    let mut w = [f32::INFINITY, f32::NEG_INFINITY];
    perturb_rounding(&mut w, &mut SplitMix64::new(3));
    assert_eq!(w, [f32::INFINITY, f32::NEG_INFINITY]);
}
