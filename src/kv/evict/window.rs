//! `window[:size=W,sinks=S]`: a sliding window of the `W` newest tokens plus the first `S`
//! tokens, the attention sinks (StreamingLLM, Xiao et al. 2023, arXiv 2309.17453, §3.2 finds 4
//! sinks enough). Bookkeeping: a u32 position per slot.

use std::fmt;

use super::contract::{GpuEvict, Policy, PolicySpec};
use crate::kv::formats::gpu::EVICT_WINDOW;
use crate::kv::params::Params;

/// Default sliding-window size (tokens).
pub const DEFAULT_WINDOW: usize = 256;
/// Default attention sinks for `window` (StreamingLLM §3.2 finds 4 sink tokens enough).
pub const DEFAULT_SINKS: usize = 4;

/// The `window` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Newest tokens kept (≥ 1).
    pub size: usize,
    /// First tokens always kept.
    pub sinks: usize,
}

impl PolicySpec for Window {
    const NAMES: &'static [&'static str] = &["window"];
    const HELP: &'static str = "window[:size=W,sinks=S]";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        let (mut size, mut sinks) = (DEFAULT_WINDOW, DEFAULT_SINKS);
        for &(k, v) in &p.pairs {
            match k {
                "size" => size = p.num(k, v)?,
                "sinks" => sinks = p.num(k, v)?,
                _ => return Err(p.unknown(k, "size=W,sinks=S")),
            }
        }
        if size == 0 {
            return Err("window size must be ≥ 1".into());
        }
        Ok(Window { size, sinks })
    }
}

impl Policy for Window {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "window:size={},sinks={}", self.size, self.sinks)
    }

    fn held_tokens(&self, seen: usize) -> usize {
        seen.min(self.size + self.sinks)
    }

    fn victims(&self, pos: &[u32], _score: &[f32], seen: usize) -> Vec<usize> {
        (0..pos.len())
            .filter(|&s| {
                let p = pos[s] as usize;
                p >= self.sinks && p + self.size < seen
            })
            .collect()
    }

    fn gpu(&self) -> GpuEvict {
        GpuEvict {
            mode: EVICT_WINDOW,
            size: self.size as i32,
            sinks: self.sinks as i32,
            budget_tokens: 0,
            ratio: 0.0,
            recent: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Window 3 with 1 sink after 7 tokens: keep position 0 and 4, 5, 6; drop slots of 1, 2, 3.
    #[test]
    fn victims_by_hand() {
        let w = Window { size: 3, sinks: 1 };
        assert_eq!(w.victims(&[0, 1, 2, 3, 4, 5, 6], &[], 7), vec![1, 2, 3]);
        assert_eq!(w.held_tokens(7), 4);
        assert_eq!(w.held_tokens(2), 2);
    }
}
