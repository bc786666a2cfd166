//! One results row per scheme × load: the serving metrics vLLM's `bench serve` reports
//! (request throughput, output tokens/s, TTFT/TPOT/ITL/E2E percentiles, goodput under an SLO —
//! Zhong et al. 2024, DistServe, §2.2) plus the scheduler's and the block pool's view (running
//! sequences, preemptions, utilisation, internal fragmentation, prefix sharing).

use std::str::FromStr;

use super::engine::{RequestRecord, ServeOutcome, StepSample};
use crate::error::{Error, Result};
use crate::stats::percentile;
use crate::util::record::csv_record;

/// Service-level objectives a request must meet to count towards goodput, ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Slo {
    /// Most time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Most time per output token, ms.
    pub tpot_ms: Option<f64>,
    /// Most end-to-end latency, ms.
    pub e2e_ms: Option<f64>,
}

impl FromStr for Slo {
    type Err = Error;
    /// `ttft=2000,tpot=200` (ms; keys ttft, tpot, e2e). Errors: [`Error::InvalidArgument`]
    /// naming `--slo`.
    fn from_str(s: &str) -> Result<Self> {
        let mut slo = Slo::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || {
                Error::InvalidArgument {
                name: "--slo".into(),
                reason: format!(
                    "`{part}` is not KEY=MS with KEY one of ttft, tpot, e2e (e.g. ttft=2000,tpot=200)"
                ),
            }
            };
            let (k, v) = part.split_once('=').ok_or_else(bad)?;
            let v: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|x: &f64| *x > 0.0)
                .ok_or_else(bad)?;
            match k.trim() {
                "ttft" => slo.ttft_ms = Some(v),
                "tpot" => slo.tpot_ms = Some(v),
                "e2e" => slo.e2e_ms = Some(v),
                _ => return Err(bad()),
            }
        }
        Ok(slo)
    }
}

impl std::fmt::Display for Slo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = [
            ("ttft", self.ttft_ms),
            ("tpot", self.tpot_ms),
            ("e2e", self.e2e_ms),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect();
        write!(f, "{}", parts.join(","))
    }
}

impl Slo {
    /// Whether `r` met every objective (a one-token output has no TPOT and meets that one).
    pub fn met(&self, r: &RequestRecord) -> bool {
        r.status == "ok"
            && self.ttft_ms.is_none_or(|m| r.ttft_ms() <= m)
            && self.e2e_ms.is_none_or(|m| r.e2e_ms() <= m)
            && self
                .tpot_ms
                .is_none_or(|m| r.tpot_ms().is_none_or(|t| t <= m))
    }
}

/// p50, p95, p99 of a sample (none when it is empty), ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Pcts {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

fn pcts(mut xs: Vec<f64>) -> Pcts {
    let mut p = |q: f64| Some(percentile(&mut xs, q)).filter(|v| v.is_finite());
    Pcts {
        p50: p(50.0),
        p95: p(95.0),
        p99: p(99.0),
    }
}

csv_record! {
    /// What one point (scheme × load) measured — at once its columns of a serving run's
    /// `results.csv` (a new metric is one field here and its line in the renderer). Times in
    /// ms, rates per second, memory in bytes; a value with nothing to measure (no request
    /// completed, no decode step) is none.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct ServeStats {
        /// Requests sent.
        pub requests: usize,
        /// Requests served to the end.
        pub completed: usize,
        /// Requests rejected (could never fit the pool).
        pub rejected: usize,
        /// Largest decode batch.
        pub running_max: usize,
        /// Decode-batch size averaged over time (each step weighted by its duration).
        pub running_mean: Option<f64>,
        /// Preemptions (recompute), all requests.
        pub preemptions: usize,
        /// Completed requests per second.
        pub request_throughput: Option<f64>,
        /// Generated tokens per second (completed requests).
        pub output_tokens_per_s: Option<f64>,
        /// Requests per second that met the SLO.
        pub goodput: Option<f64>,
        /// Share of requests that met the SLO, 0–1.
        pub slo_attainment: f64,
        /// Time to first token, ms.
        pub ttft_ms: Pcts { ttft_ms_p50: p50, ttft_ms_p95: p95, ttft_ms_p99: p99 },
        /// Time per output token after the first, per request, ms.
        pub tpot_ms: Pcts { tpot_ms_p50: p50, tpot_ms_p95: p95, tpot_ms_p99: p99 },
        /// Gaps between consecutive tokens, all requests pooled, ms.
        pub itl_ms: Pcts { itl_ms_p50: p50, itl_ms_p95: p95, itl_ms_p99: p99 },
        /// End-to-end latency, ms.
        pub e2e_ms: Pcts { e2e_ms_p50: p50, e2e_ms_p95: p95, e2e_ms_p99: p99 },
        /// Blocks in use / blocks in the pool, averaged over time, 0–1.
        pub block_util_mean: Option<f64>,
        /// Largest blocks-in-use share, 0–1.
        pub block_util_max: f64,
        /// Share of the running sequences' block bytes not holding K/V (the last block's empty
        /// slots; vLLM's internal fragmentation), averaged over time, 0–1.
        pub fragmentation_mean: Option<f64>,
        /// Bytes the shared prefix saved (blocks the same sequences would take unshared, minus
        /// blocks in use), averaged over time.
        pub prefix_saved_bytes_mean: Option<f64>,
        /// Largest bytes saved by the shared prefix.
        pub prefix_saved_bytes_max: u64,
        /// From the first arrival to the last completion, s.
        pub duration_s: f64,
    }
}

/// Summarises a finished point against `slo`.
pub fn summarize(o: &ServeOutcome, slo: &Slo) -> ServeStats {
    let ok: Vec<&RequestRecord> = o.requests.iter().filter(|r| r.status == "ok").collect();
    let end = ok
        .iter()
        .map(|r| r.token_s.last().copied().unwrap_or(r.first_token_s))
        .fold(0.0, f64::max);
    let start = o
        .requests
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let duration_s = if ok.is_empty() {
        0.0
    } else {
        end - start.min(end)
    };
    let per_s = |n: f64| (duration_s > 0.0).then(|| n / duration_s);
    let good = ok.iter().filter(|r| slo.met(r)).count();
    let weights = step_weights(&o.steps);
    let wmean = |f: &dyn Fn(&StepSample) -> f64| -> Option<f64> {
        let w: f64 = weights.iter().sum();
        (w > 0.0).then(|| {
            o.steps
                .iter()
                .zip(&weights)
                .map(|(s, w)| f(s) * w)
                .sum::<f64>()
                / w
        })
    };
    let total = o.total_blocks.max(1) as f64;
    let bb = o.block_bytes as f64;
    let saved =
        |s: &StepSample| s.table_blocks.saturating_sub(s.used_blocks) as u64 * o.block_bytes;
    ServeStats {
        requests: o.requests.len(),
        completed: ok.len(),
        rejected: o.requests.len() - ok.len(),
        duration_s,
        request_throughput: per_s(ok.len() as f64),
        output_tokens_per_s: per_s(ok.iter().map(|r| r.output_tokens as f64).sum()),
        ttft_ms: pcts(ok.iter().map(|r| r.ttft_ms()).collect()),
        tpot_ms: pcts(ok.iter().filter_map(|r| r.tpot_ms()).collect()),
        itl_ms: pcts(ok.iter().flat_map(|r| r.itl_ms()).collect()),
        e2e_ms: pcts(ok.iter().map(|r| r.e2e_ms()).collect()),
        goodput: per_s(good as f64),
        slo_attainment: good as f64 / o.requests.len().max(1) as f64,
        running_mean: wmean(&|s| s.running as f64),
        running_max: o.steps.iter().map(|s| s.running).max().unwrap_or(0),
        preemptions: o.requests.iter().map(|r| r.preemptions).sum(),
        block_util_mean: wmean(&|s| s.used_blocks as f64 / total),
        block_util_max: o
            .steps
            .iter()
            .map(|s| s.used_blocks as f64 / total)
            .fold(0.0, f64::max),
        fragmentation_mean: wmean(&|s| {
            let held = s.table_blocks as f64 * bb;
            if held > 0.0 {
                (held - s.accounted_bytes as f64) / held
            } else {
                0.0
            }
        }),
        prefix_saved_bytes_mean: wmean(&|s| saved(s) as f64),
        prefix_saved_bytes_max: o.steps.iter().map(saved).max().unwrap_or(0),
    }
}

/// Each step's weight: the time since the previous sample (the first: since time 0).
fn step_weights(steps: &[StepSample]) -> Vec<f64> {
    let mut prev = 0.0;
    steps
        .iter()
        .map(|s| {
            let w = (s.t_s - prev).max(0.0);
            prev = s.t_s;
            w
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(arrival: f64, first: f64, tokens: &[f64]) -> RequestRecord {
        RequestRecord {
            id: 0,
            prompt_tokens: 10,
            output_tokens: tokens.len() + 1,
            arrival_s: arrival,
            first_token_s: first,
            token_s: tokens.to_vec(),
            preemptions: 0,
            status: "ok".into(),
        }
    }

    /// Two requests by hand. A: arrives 0, first token 0.5 s, then 0.6, 0.8 → TTFT 500 ms,
    /// TPOT (0.8 − 0.5)/2 = 150 ms, ITL 100 and 200 ms, E2E 800 ms. B: arrives 1, first 1.1,
    /// then 1.5 → TTFT 100, TPOT 400, E2E 500. Duration 1.5 s: 2/1.5 req/s, 5/1.5 tokens/s.
    /// SLO tpot=200 keeps A only: goodput 1/1.5.
    #[test]
    fn metrics_by_hand() {
        let o = ServeOutcome {
            requests: vec![rec(0.0, 0.5, &[0.6, 0.8]), rec(1.0, 1.1, &[1.5])],
            steps: vec![
                StepSample {
                    t_s: 1.0,
                    running: 1,
                    waiting: 0,
                    used_blocks: 2,
                    table_blocks: 2,
                    accounted_bytes: 150,
                    stored_bytes: 150,
                    step_s: 0.1,
                    attention_s: f64::NAN,
                    context_tokens: 10,
                    prefill_s: 0.0,
                    prefill_tokens: 0,
                    prefill_longest: 0,
                },
                StepSample {
                    t_s: 1.5,
                    running: 2,
                    waiting: 0,
                    used_blocks: 4,
                    table_blocks: 4,
                    accounted_bytes: 300,
                    stored_bytes: 300,
                    step_s: 0.1,
                    attention_s: f64::NAN,
                    context_tokens: 10,
                    prefill_s: 0.0,
                    prefill_tokens: 0,
                    prefill_longest: 0,
                },
            ],
            total_blocks: 8,
            block_bytes: 100,
            prefix_blocks: 0,
            prefix_prefill_s: 0.0,
        };
        let s = summarize(&o, &"tpot=200".parse().unwrap());
        let near = |x: Option<f64>, want: f64| (x.unwrap() - want).abs() < 1e-9;
        assert!((s.duration_s - 1.5).abs() < 1e-12);
        assert!(near(s.request_throughput, 2.0 / 1.5));
        assert!(near(s.output_tokens_per_s, 5.0 / 1.5));
        assert!(near(s.ttft_ms.p50, 300.0));
        assert!(near(s.e2e_ms.p95, 500.0 + 0.95 * 300.0));
        assert!(near(s.tpot_ms.p50, 275.0));
        // ITL pooled: 100, 200, 400 → median 200.
        assert!(near(s.itl_ms.p50, 200.0));
        assert!(near(s.goodput, 1.0 / 1.5));
        assert_eq!(s.slo_attainment, 0.5);
        // Time-weighted: 1 running for 1 s, 2 for 0.5 s → 4/3.
        assert!(near(s.running_mean, 4.0 / 3.0));
        assert_eq!(s.running_max, 2);
        assert!((s.block_util_max - 0.5).abs() < 1e-12);
        // Fragmentation: (200 − 150)/200 = 0.25 in both samples.
        assert!(near(s.fragmentation_mean, 0.25));
        // Nothing served: no rates, no percentiles (empty cells, not NaN).
        let none = summarize(
            &ServeOutcome {
                requests: Vec::new(),
                steps: Vec::new(),
                ..o
            },
            &Slo::default(),
        );
        assert_eq!(
            (none.goodput, none.ttft_ms.p95, none.running_mean),
            (None, None, None)
        );
    }

    #[test]
    fn slo_parses() {
        let s: Slo = "ttft=2000, tpot=200".parse().unwrap();
        assert_eq!(
            (s.ttft_ms, s.tpot_ms, s.e2e_ms),
            (Some(2000.0), Some(200.0), None)
        );
        assert_eq!(s.to_string(), "ttft=2000,tpot=200");
        for bad in ["ttft", "ttft=-1", "latency=3"] {
            assert!(bad.parse::<Slo>().is_err(), "{bad}");
        }
    }
}
