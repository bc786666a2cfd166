//! `h2o[:budget=N|ratio=r,recent=M]`: Heavy-Hitter Oracle (Zhang et al. 2023, arXiv 2306.14048,
//! Alg. 1). Every slot accumulates the attention probability it receives (per kv head, summed
//! over its query heads); after each step, while more than the budget is held, the slot with
//! the lowest accumulated score outside the `recent` newest (the newest token always protected)
//! is dropped, ties to the oldest. Bookkeeping: a u32 position and an f32 score per slot.

use std::fmt;

use super::contract::{GpuEvict, Policy, PolicySpec};
use crate::kv::formats::gpu::EVICT_H2O;
use crate::kv::params::Params;

/// Default H2O budget as a share of tokens seen (H2O §5: 20 % heavy hitters + recent).
pub const DEFAULT_H2O_RATIO: f32 = 0.2;
/// Default H2O recent window (tokens).
pub const DEFAULT_H2O_RECENT: usize = 32;

/// H2O cache budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// A fixed number of tokens.
    Tokens(usize),
    /// A share of the tokens seen so far (rounded up), as in the H2O paper's KV budget %.
    Ratio(f32),
}

/// The `h2o` policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct H2o {
    /// Tokens kept per (sequence, kv head).
    pub budget: Budget,
    /// Newest tokens never evicted.
    pub recent: usize,
}

/// H2O's budget after `seen` tokens: at least the recent window plus one heavy hitter.
pub fn h2o_budget(budget: Budget, recent: usize, seen: usize) -> usize {
    let b = match budget {
        Budget::Tokens(n) => n,
        Budget::Ratio(r) => (r as f64 * seen as f64).ceil() as usize,
    };
    b.max(recent + 1)
}

impl PolicySpec for H2o {
    const NAMES: &'static [&'static str] = &["h2o"];
    const HELP: &'static str = "h2o[:budget=N|ratio=r,recent=M]";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        let (mut budget, mut recent) = (Budget::Ratio(DEFAULT_H2O_RATIO), DEFAULT_H2O_RECENT);
        // budget and ratio are two spellings of one setting: with both, one would silently win.
        let keys = |k: &str| p.pairs.iter().any(|&(key, _)| key == k);
        if keys("budget") && keys("ratio") {
            return Err(
                "h2o takes `budget=N` (tokens) or `ratio=r` (share of tokens seen), not both; \
                 give one"
                    .into(),
            );
        }
        for &(k, v) in &p.pairs {
            match k {
                "budget" => budget = Budget::Tokens(p.num(k, v)?),
                "ratio" => {
                    let r: f32 = p.num(k, v)?;
                    if !(r > 0.0 && r <= 1.0) {
                        return Err(format!("h2o ratio {r} must be in (0, 1]"));
                    }
                    budget = Budget::Ratio(r)
                }
                "recent" => recent = p.num(k, v)?,
                _ => return Err(p.unknown(k, "budget=N or ratio=r, recent=M")),
            }
        }
        if let Budget::Tokens(n) = budget {
            if n <= recent {
                return Err(format!(
                    "h2o budget {n} must exceed the recent window {recent}"
                ));
            }
        }
        Ok(H2o { budget, recent })
    }
}

impl Policy for H2o {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.budget {
            Budget::Tokens(n) => write!(f, "h2o:budget={n}")?,
            Budget::Ratio(r) => write!(f, "h2o:ratio={r}")?,
        }
        write!(f, ",recent={}", self.recent)
    }

    fn held_tokens(&self, seen: usize) -> usize {
        seen.min(h2o_budget(self.budget, self.recent, seen))
    }

    fn keeps_scores(&self) -> bool {
        true
    }

    fn victims(&self, pos: &[u32], score: &[f32], seen: usize) -> Vec<usize> {
        let cap = h2o_budget(self.budget, self.recent, seen);
        let excess = pos.len().saturating_sub(cap);
        if excess == 0 {
            return Vec::new();
        }
        // Candidates: everything outside the recent window (the newest token is always
        // protected, even with recent = 0); lowest accumulated attention goes first.
        let protect = self.recent.max(1);
        let mut cand: Vec<usize> = (0..pos.len())
            .filter(|&s| pos[s] as usize + protect < seen)
            .collect();
        // Ties (e.g. all-zero scores) evict the oldest first.
        cand.sort_by(|&a, &b| score[a].total_cmp(&score[b]).then(pos[a].cmp(&pos[b])));
        cand.truncate(excess);
        cand
    }

    fn gpu(&self) -> GpuEvict {
        let (budget_tokens, ratio) = match self.budget {
            Budget::Tokens(n) => (n as i32, 0f32),
            Budget::Ratio(r) => (0, r),
        };
        GpuEvict {
            mode: EVICT_H2O,
            size: 0,
            sinks: 0,
            budget_tokens,
            ratio,
            recent: self.recent as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Budget 3, recent 1, 5 tokens seen (positions 0..5): 2 must go; position 4 is protected;
    /// scores 0.5, 0.1, 0.1, 0.9 for positions 0..4 drop the lowest two, the tie (positions 1
    /// and 2 at 0.1) both lowest.
    #[test]
    fn victims_by_hand() {
        let p = H2o {
            budget: Budget::Tokens(3),
            recent: 1,
        };
        let mut v = p.victims(&[0, 1, 2, 3, 4], &[0.5, 0.1, 0.1, 0.9, 0.0], 5);
        v.sort_unstable();
        assert_eq!(v, vec![1, 2]);
        // Ratio 0.5 of 10 seen = 5 ≥ recent + 1 = 3.
        assert_eq!(h2o_budget(Budget::Ratio(0.5), 2, 10), 5);
        assert_eq!(h2o_budget(Budget::Ratio(0.1), 2, 10), 3);
    }
}
