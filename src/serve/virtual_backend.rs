//! A [`Backend`] on a virtual clock: no model runs; each prefill and decode step advances the
//! clock by what a [`StepCost`] says it costs, and the caches' bytes follow the scheme's own
//! accounting ([`BlockSizer::seq_bytes`]). The scheduler, block pool and workload are the same
//! code the measured `kvbench serve` runs, so a schedule on this backend is exactly the one the
//! real decode path would follow if its steps took these times — the ground for simulation
//! and for tests whose step times are known (LLMServingSim and Vidur drive a real scheduler on
//! a cost model the same way).

use super::engine::Backend;
use super::pool::BlockSizer;
use crate::error::Result;

/// What a prefill and a decode step cost, seconds.
pub trait StepCost {
    /// Prefilling `tokens` new tokens after `context` tokens already cached.
    fn prefill_s(&self, tokens: usize, context: usize) -> f64;
    /// One decode step of a batch whose sequences hold `contexts` tokens each (before the
    /// step's token); `after_prefill`: the longest prompt prefilled since the previous step,
    /// tokens (0: none).
    fn decode_s(&self, contexts: &[usize], after_prefill: usize) -> f64;
}

/// Fixed costs: prefill `prefill_token_s` per token; a decode step `step_s` plus
/// `step_seq_s` per sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedCost {
    /// Seconds per prefilled token.
    pub prefill_token_s: f64,
    /// Seconds per decode step.
    pub step_s: f64,
    /// Seconds per sequence in a decode step.
    pub step_seq_s: f64,
}

impl StepCost for FixedCost {
    fn prefill_s(&self, tokens: usize, _context: usize) -> f64 {
        tokens as f64 * self.prefill_token_s
    }
    fn decode_s(&self, contexts: &[usize], _after_prefill: usize) -> f64 {
        self.step_s + self.step_seq_s * contexts.len() as f64
    }
}

/// The performance model as a step cost: what `serve --simulate` runs on.
impl StepCost for crate::perf::PerfModel {
    fn prefill_s(&self, tokens: usize, context: usize) -> f64 {
        self.seconds(&self.prefill(tokens, context))
    }
    fn decode_s(&self, contexts: &[usize], after_prefill: usize) -> f64 {
        self.seconds(&self.decode_after_prefill(contexts, after_prefill))
    }
}

/// A cost at another speed of the same machine: prefills `prefill` times as long, decode
/// steps (their extra after a prefill included) `decode` times — the ratios of a measured
/// run's median speed probe to its profile's (`kvbench serve --simulate --speed-from`,
/// [`crate::perf::SpeedProbe::slowdown`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaled<C> {
    /// The cost at the profile's speed.
    pub cost: C,
    /// Factor on every prefill.
    pub prefill: f64,
    /// Factor on every decode step.
    pub decode: f64,
}

impl<C: StepCost> StepCost for Scaled<C> {
    fn prefill_s(&self, tokens: usize, context: usize) -> f64 {
        self.prefill * self.cost.prefill_s(tokens, context)
    }
    fn decode_s(&self, contexts: &[usize], after_prefill: usize) -> f64 {
        self.decode * self.cost.decode_s(contexts, after_prefill)
    }
}

/// The virtual-clock backend: generated tokens are all `1` (prefill) and `2` (decode), as no
/// model picks them; only their count and timing matter to the scheduler.
#[derive(Debug, Clone)]
pub struct VirtualBackend<C> {
    cost: C,
    sizer: BlockSizer,
    clock: f64,
    seen: Vec<usize>,
    prefix: usize,
    /// The longest prompt prefilled since the last decode step, tokens (0: none).
    prefilled: usize,
}

impl<C: StepCost> VirtualBackend<C> {
    /// A backend whose clock starts at 0, costing steps with `cost`, sizing caches with
    /// `sizer`.
    pub fn new(cost: C, sizer: BlockSizer) -> Self {
        VirtualBackend {
            cost,
            sizer,
            clock: 0.0,
            seen: Vec::new(),
            prefix: 0,
            prefilled: 0,
        }
    }
}

impl<C: StepCost> Backend for VirtualBackend<C> {
    fn now(&self) -> f64 {
        self.clock
    }
    fn wait_until(&mut self, t: f64) {
        self.clock = self.clock.max(t);
    }
    fn prepare_prefix(&mut self, prefix: &[u32]) -> Result<f64> {
        self.prefix = prefix.len();
        let s = self.cost.prefill_s(prefix.len(), 0);
        self.clock += s;
        self.prefilled = self.prefilled.max(prefix.len());
        Ok(s)
    }
    fn admit(&mut self, tokens: &[u32], after_prefix: bool, _lifetime: usize) -> Result<u32> {
        let before = if after_prefix { self.prefix } else { 0 };
        self.clock += self.cost.prefill_s(tokens.len(), before);
        self.prefilled = self.prefilled.max(tokens.len());
        self.seen.push(tokens.len() + before);
        Ok(1)
    }
    fn step(&mut self, last: &[u32]) -> Result<Vec<u32>> {
        self.clock += self.cost.decode_s(&self.seen, self.prefilled);
        self.prefilled = 0;
        self.seen.iter_mut().for_each(|s| *s += 1);
        Ok(vec![2; last.len()])
    }
    fn remove(&mut self, i: usize) -> Result<()> {
        self.seen.remove(i);
        Ok(())
    }
    fn kv_bytes(&self) -> usize {
        self.seen
            .iter()
            .map(|&s| self.sizer.seq_bytes(s) as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{CacheGeometry, KvScheme};
    use crate::perf::{DeviceProfile, ModelShape, PerfModel};
    use crate::serve::engine::{serve, SchedConfig};
    use crate::serve::workload::{Arrival, Request};

    /// Issue #23: five requests on the performance model's clock, scheduled by hand. The device
    /// reads 1e9 bytes of weights in 1 ms and does 2 · 5e8 FLOPs per token in 10 µs, so a
    /// decode step costs 1 ms and a 100-token prefill max(1 ms, 100 · 10 µs) = 1 ms (the K/V
    /// terms of a 1-layer, 2-element head are below a nanosecond). At most 2 run at once; all
    /// arrive at 0 and want 3 tokens (the prefill's, then two decode steps):
    /// r0 prefilled → 1 ms, r1 → 2 ms, steps → 3, 4 ms (both done); r2 → 5, r3 → 6, steps → 7,
    /// 8; r4 → 9, steps → 10, 11 ms.
    ///
    /// With `after_prefill_us = 500` the first step after each admission costs 1.5 ms: r0 → 1,
    /// r1 → 2, steps → 3.5, 4.5; r2 → 5.5, r3 → 6.5, steps → 8, 9; r4 → 10, steps → 11.5, 12.5.
    /// The same with `after_prefill_by_prompt = [[50, 200], [150, 800]]` (100-token prompts:
    /// halfway, 500 µs), which takes the place of `after_prefill_us`; with `[[150, 800],
    /// [250, 900]]` the prompts lie below the first row, so its 800 µs: steps after admissions
    /// 1.8 ms, r2 → 5.8, r3 → 6.8, steps → 8.6, 9.6; r4 → 10.6, steps → 12.4, 13.4.
    #[test]
    fn five_requests_on_the_model_clock_by_hand() {
        let (first, last) = five_requests("after_prefill_us = 0");
        assert_eq!(first, [1.0, 2.0, 5.0, 6.0, 9.0]);
        assert_eq!(last, [4.0, 4.0, 8.0, 8.0, 11.0]);
        for overhead in [
            "after_prefill_us = 500",
            "after_prefill_us = 9999\nafter_prefill_by_prompt = [[50, 200.0], [150, 800.0]]",
        ] {
            let (first, last) = five_requests(overhead);
            assert_eq!(first, [1.0, 2.0, 5.5, 6.5, 10.0], "{overhead}");
            assert_eq!(last, [4.5, 4.5, 9.0, 9.0, 12.5], "{overhead}");
        }
        let (first, last) = five_requests("after_prefill_by_prompt = [[150, 800.0], [250, 900.0]]");
        assert_eq!(first, [1.0, 2.0, 5.8, 6.8, 10.6]);
        assert_eq!(last, [4.8, 4.8, 9.6, 9.6, 13.4]);
    }

    /// The five requests of `five_requests_on_the_model_clock_by_hand` on a machine whose
    /// speed probe ran prefills 2× and decode steps 3× slower than the profile's
    /// (`serve --simulate --speed-from`): a prefill 2 ms, a step 3 ms, with 500 µs after a
    /// prefill 4.5 ms. r0 → 2, r1 → 4, steps → 7, 10; r2 → 12, r3 → 14, steps → 17, 20;
    /// r4 → 22, steps → 25, 28 ms. With the extra: steps → 8.5, 11.5; r2 → 13.5, r3 → 15.5,
    /// steps → 20, 23; r4 → 25, steps → 29.5, 32.5.
    #[test]
    fn five_requests_at_a_probed_speed_by_hand() {
        let (first, last) = five_requests_at("after_prefill_us = 0", Some((2.0, 3.0)));
        assert_eq!(first, [2.0, 4.0, 12.0, 14.0, 22.0]);
        assert_eq!(last, [10.0, 10.0, 20.0, 20.0, 28.0]);
        let (first, last) = five_requests_at("after_prefill_us = 500", Some((2.0, 3.0)));
        assert_eq!(first, [2.0, 4.0, 13.5, 15.5, 25.0]);
        assert_eq!(last, [11.5, 11.5, 23.0, 23.0, 32.5]);
    }

    /// The five requests above, `overhead` the profile's after-prefill lines; each request's
    /// first and last token time, ms, by id.
    fn five_requests(overhead: &str) -> (Vec<f64>, Vec<f64>) {
        five_requests_at(overhead, None)
    }

    /// [`five_requests`] with the costs scaled by `(prefill, decode)` ([`Scaled`]).
    fn five_requests_at(overhead: &str, scale: Option<(f64, f64)>) -> (Vec<f64>, Vec<f64>) {
        let profile = DeviceProfile::parse(
            &format!(
                r#"
name = "hand"
description = "round numbers"
calibrated = true
memory_gib = 1
mem_bw_gb_s = 1000
matmul_tflops = 100
[efficiency]
weights = 1.0
matmul = 1.0
kv_read = 1.0
kv_write = 1.0
attention = 1.0
allreduce = 1.0
[overhead]
step_us = 0
layer_us = 0
{overhead}
"#
            ),
            "hand.toml",
        )
        .unwrap();
        let shape = ModelShape {
            layers: 1,
            q_heads: 1,
            kv_heads: 1,
            head_dim: 2,
            params: 500_000_000,
            window: None,
            decode_weight_bytes: 1_000_000_000,
            prefill_weight_bytes: 1_000_000_000,
        };
        let perf = PerfModel::new(profile, shape, KvScheme::FP16, 1).unwrap();
        let sizer = BlockSizer {
            scheme: KvScheme::FP16,
            geom: CacheGeometry {
                layers: 1,
                kv_heads: 1,
                q_heads: 1,
                head_dim: 2,
                window: None,
            },
            block_tokens: 16,
        };
        let cfg = SchedConfig {
            sizer,
            kv_budget: 1 << 20,
            max_num_seqs: 2,
            prefix_tokens: 0,
            prefix_caching: false,
        };
        let requests: Vec<Request> = (0..5)
            .map(|id| Request {
                id,
                prompt: vec![1; 100],
                output_len: 3,
            })
            .collect();
        let arrival = Arrival::Poisson {
            rate: f64::INFINITY,
        };
        let mut backend: Box<dyn crate::serve::engine::Backend> = match scale {
            None => Box::new(VirtualBackend::new(perf, sizer)),
            Some((prefill, decode)) => Box::new(VirtualBackend::new(
                Scaled {
                    cost: perf,
                    prefill,
                    decode,
                },
                sizer,
            )),
        };
        let o = serve(
            backend.as_mut(),
            &cfg,
            &requests,
            arrival,
            &[],
            0,
            &mut |_| Ok(()),
        )
        .unwrap();
        let mut by_id = o.requests.clone();
        by_id.sort_by_key(|r| r.id);
        let ms = |s: f64| (s * 1e3 * 1e4).round() / 1e4;
        let first: Vec<f64> = by_id.iter().map(|r| ms(r.first_token_s)).collect();
        let last: Vec<f64> = by_id
            .iter()
            .map(|r| ms(*r.token_s.last().unwrap()))
            .collect();
        assert!(by_id
            .iter()
            .all(|r| r.preemptions == 0 && r.output_tokens == 3));
        (first, last)
    }
}
