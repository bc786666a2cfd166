//! Round axis ticks and their labels (pure functions on numbers): steps of 1, 2 or 5 × 10^k on
//! decimal axes, powers of two on token and batch axes, and a label precision chosen from the
//! step so that neighbouring labels always differ (Heckbert, "Nice numbers for graph labels",
//! Graphics Gems, 1990).

/// How an axis's ticks are chosen and labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ticks {
    /// Steps of 1, 2 or 5 × 10^k (latency in ms, rates, throughput, percentages); a log axis
    /// ticks at powers of ten (and 2 and 5 times them when it spans less than two decades).
    /// Labels are plain decimals; `1.5M` = 1.5 × 10⁶.
    Decimal,
    /// Steps of 2^k with k ≥ 0 (token counts, batch sizes, sequences: whole numbers); a log
    /// axis ticks at powers of two. Labels use k = 1024 (`4k` = 4096 tokens, `1M` = 2²⁰).
    Binary,
}

/// At most this many intervals between linear ticks (at least half as many).
const MAX_INTERVALS: f64 = 8.0;
/// At most this many ticks on a log axis before every second (third, …) power is skipped.
const MAX_LOG_TICKS: usize = 9;

/// The round step for a linear axis spanning `span` (> 0) units: the smallest 1, 2 or 5 ×
/// 10^k ([`Ticks::Decimal`]) or 2^k, k ≥ 0 ([`Ticks::Binary`]) that cuts `span` into at most
/// `MAX_INTERVALS` (8) intervals. A non-positive or non-finite `span` gets step 1.
pub fn step(span: f64, kind: Ticks) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / MAX_INTERVALS;
    match kind {
        Ticks::Binary => raw.log2().ceil().max(0.0).exp2(),
        Ticks::Decimal => {
            let p = 10f64.powf(raw.log10().floor());
            [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * p)
                .find(|&s| s >= raw * (1.0 - 1e-9))
                .unwrap_or(10.0 * p)
        }
    }
}

/// The ticks of a linear axis over `lo..=hi` (data units): every multiple of
/// [`step`]`(hi − lo)` inside the range, and that step. Empty for an empty range.
pub fn linear(lo: f64, hi: f64, kind: Ticks) -> (Vec<f64>, f64) {
    let s = step(hi - lo, kind);
    if !(lo.is_finite() && hi.is_finite() && hi > lo) {
        return (Vec::new(), s);
    }
    let tol = 1e-9 * s;
    let (first, last) = (
        ((lo - tol) / s).ceil() as i64,
        ((hi + tol) / s).floor() as i64,
    );
    ((first..=last).map(|i| i as f64 * s).collect(), s)
}

/// The range of a log axis holding values `min..=max` (both > 0), data units: out to whole
/// powers of two ([`Ticks::Binary`]) or ten ([`Ticks::Decimal`]); a single value `v` (or
/// `min == max`) gets `v / 2 ..= 2v`, so it sits in the middle.
pub fn log_range(min: f64, max: f64, kind: Ticks) -> (f64, f64) {
    if max <= min {
        return (min / 2.0, min * 2.0);
    }
    let base: f64 = if kind == Ticks::Binary { 2.0 } else { 10.0 };
    let (a, b) = (min.log(base), max.log(base));
    // Snap values that are powers already (log10(1000) = 2.9999999999999996).
    let snap = |x: f64| {
        if (x - x.round()).abs() < 1e-9 {
            x.round()
        } else {
            x
        }
    };
    (base.powf(snap(a).floor()), base.powf(snap(b).ceil()))
}

/// The ticks of a log axis over `lo..=hi` (data units, `0 < lo < hi`): powers of two
/// ([`Ticks::Binary`]) or of ten ([`Ticks::Decimal`], with 2 and 5 × 10^k added when fewer
/// than three powers fall inside); every second, third, … power when more than
/// `MAX_LOG_TICKS` (9) would be drawn, keeping the exponents that are multiples of the stride.
pub fn log(lo: f64, hi: f64, kind: Ticks) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return Vec::new();
    }
    let base: f64 = if kind == Ticks::Binary { 2.0 } else { 10.0 };
    let (k0, k1) = (
        (lo.log(base) - 1e-9).ceil() as i32,
        (hi.log(base) + 1e-9).floor() as i32,
    );
    let count = (k1 - k0 + 1).max(0) as usize;
    if kind == Ticks::Decimal && count < 3 {
        let inside = |v: &f64| *v >= lo * (1.0 - 1e-9) && *v <= hi * (1.0 + 1e-9);
        return (k0 - 1..=k1)
            .flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k)))
            .filter(inside)
            .collect();
    }
    let stride = count.div_ceil(MAX_LOG_TICKS).max(1) as i32;
    (k0..=k1)
        .filter(|k| k.rem_euclid(stride) == 0)
        .map(|k| base.powi(k))
        .collect()
}

/// Decimal places that show every multiple of `step` exactly (`0.05` → 2, `0.2` → 1, `5` → 0).
fn decimals(step: f64) -> usize {
    if !(step.is_finite() && step > 0.0) {
        return 0;
    }
    (-step.log10() - 1e-9).ceil().max(0.0) as usize
}

/// The label of tick `v` on an axis whose neighbouring ticks are `step` apart (on a log axis,
/// pass the tick itself): [`Ticks::Decimal`] prints as many decimals as `step` needs (ticks
/// 0, 0.05, 0.1 read `0.00`, `0.05`, `0.10`) and `M` for 10⁶ from a million on;
/// [`Ticks::Binary`] prints `512`, `1k`, `1.5k`, `128k`, `2M` (k = 1024, M = 2²⁰).
pub fn label(v: f64, step: f64, kind: Ticks) -> String {
    let v = if v.abs() < 1e-9 * step.abs() { 0.0 } else { v };
    let trim = |x: String| {
        if x.contains('.') {
            x.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            x
        }
    };
    match kind {
        Ticks::Decimal if v.abs() >= 1e6 => {
            format!("{:.*}M", decimals(step / 1e6), v / 1e6)
        }
        Ticks::Decimal => format!("{:.*}", decimals(step), v),
        Ticks::Binary if v.abs() >= 1024.0 * 1024.0 => {
            format!("{}M", trim(format!("{:.3}", v / (1024.0 * 1024.0))))
        }
        Ticks::Binary if v.abs() >= 1024.0 => format!("{}k", trim(format!("{:.3}", v / 1024.0))),
        Ticks::Binary => trim(format!("{:.*}", decimals(step), v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps worked out by hand: a span of 15 000 (the defect's 4.9k/9.8k/14.6k axis) takes a
    /// step of 2000 (7.5 intervals), 3900 takes 500, 0.3 takes 0.05; a binary span of 8192
    /// takes 1024, of 3 takes 1 (never half a sequence).
    #[test]
    fn round_steps() {
        assert_eq!(step(15_000.0, Ticks::Decimal), 2000.0);
        assert_eq!(step(3900.0, Ticks::Decimal), 500.0);
        assert!((step(0.3, Ticks::Decimal) - 0.05).abs() < 1e-15);
        assert_eq!(step(8.0, Ticks::Decimal), 1.0);
        assert_eq!(step(8192.0, Ticks::Binary), 1024.0);
        assert_eq!(step(9000.0, Ticks::Binary), 2048.0);
        assert_eq!(step(3.0, Ticks::Binary), 1.0);
    }

    #[test]
    fn linear_ticks_are_multiples_of_the_step() {
        let (t, s) = linear(0.0, 4100.0, Ticks::Decimal);
        assert_eq!(s, 1000.0);
        assert_eq!(t, vec![0.0, 1000.0, 2000.0, 3000.0, 4000.0]);
        let (t, _) = linear(64.0, 192.0, Ticks::Binary);
        assert_eq!(
            t,
            vec![64.0, 80.0, 96.0, 112.0, 128.0, 144.0, 160.0, 176.0, 192.0]
        );
    }

    /// Issue #26: a goodput axis 0–0.3 read `0.00` six times; its labels must all differ.
    #[test]
    fn small_decimal_labels_differ_issue_26() {
        let (t, s) = linear(0.0, 0.3, Ticks::Decimal);
        let labels: Vec<String> = t.iter().map(|&v| label(v, s, Ticks::Decimal)).collect();
        assert_eq!(
            labels,
            ["0.00", "0.05", "0.10", "0.15", "0.20", "0.25", "0.30"]
        );
        let (t, s) = linear(0.0, 0.0012, Ticks::Decimal);
        let mut labels: Vec<String> = t.iter().map(|&v| label(v, s, Ticks::Decimal)).collect();
        let n = labels.len();
        labels.dedup();
        assert_eq!(labels.len(), n, "{labels:?}");
    }

    #[test]
    fn labels_by_hand() {
        assert_eq!(label(2000.0, 1000.0, Ticks::Decimal), "2000");
        assert_eq!(label(2_500_000.0, 500_000.0, Ticks::Decimal), "2.5M");
        assert_eq!(label(4096.0, 1024.0, Ticks::Binary), "4k");
        assert_eq!(label(1536.0, 512.0, Ticks::Binary), "1.5k");
        assert_eq!(label(131072.0, 131072.0, Ticks::Binary), "128k");
        assert_eq!(label(3.0 * 1048576.0, 1048576.0, Ticks::Binary), "3M");
        assert_eq!(label(250.0, 50.0, Ticks::Binary), "250");
        assert_eq!(label(-0.0, 0.1, Ticks::Decimal), "0.0");
    }

    /// 128…8192 tokens on a log axis: every power of two from 128 to 8k; 16…1M: every second
    /// (4^k); decimal 3…2000 sequences: 1, 10, 100, 1000, 10000.
    #[test]
    fn log_ticks() {
        let (lo, hi) = log_range(128.0, 8192.0, Ticks::Binary);
        assert_eq!((lo, hi), (128.0, 8192.0));
        let t = log(lo, hi, Ticks::Binary);
        assert_eq!(t, vec![128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0]);
        let (lo, hi) = log_range(3.0, 2000.0, Ticks::Decimal);
        assert_eq!((lo, hi), (1.0, 10000.0));
        assert_eq!(
            log(lo, hi, Ticks::Decimal),
            vec![1.0, 10.0, 100.0, 1000.0, 10000.0]
        );
        let t = log(16.0, 1048576.0, Ticks::Binary);
        assert_eq!(t.len(), 9);
        assert_eq!((t[0], t[1]), (16.0, 64.0));
        assert_eq!(
            log_range(32768.0, 32768.0, Ticks::Binary),
            (16384.0, 65536.0)
        );
        assert_eq!(log(50.0, 200.0, Ticks::Decimal), vec![50.0, 100.0, 200.0]);
    }
}
