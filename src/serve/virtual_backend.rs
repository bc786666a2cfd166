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
    /// step's token).
    fn decode_s(&self, contexts: &[usize]) -> f64;
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
    fn decode_s(&self, contexts: &[usize]) -> f64 {
        self.step_s + self.step_seq_s * contexts.len() as f64
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
        Ok(s)
    }
    fn admit(&mut self, tokens: &[u32], after_prefix: bool) -> Result<u32> {
        let before = if after_prefix { self.prefix } else { 0 };
        self.clock += self.cost.prefill_s(tokens.len(), before);
        self.seen.push(tokens.len() + before);
        Ok(1)
    }
    fn step(&mut self, last: &[u32]) -> Result<Vec<u32>> {
        self.clock += self.cost.decode_s(&self.seen);
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
