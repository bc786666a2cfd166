//! The contract every policy file implements ([`Policy`], [`PolicySpec`]) and the kernel
//! arguments it returns ([`GpuEvict`]). A leaf of `evict/`: it names no policy and not the
//! registry ([`Eviction`](super::Eviction), in `mod.rs`), so each policy file imports it without
//! reaching back to the registry that lists that file.

use std::fmt;

use crate::kv::params::Params;

/// The arguments of kernels/kv_cache.cu's `kv_evict` for one policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuEvict {
    /// `EVICT_WINDOW` or `EVICT_H2O` (kv_formats.h).
    pub mode: i32,
    /// Window size (window).
    pub size: i32,
    /// Sink tokens (window).
    pub sinks: i32,
    /// Fixed budget in tokens, 0 when a ratio is used (H2O).
    pub budget_tokens: i32,
    /// Budget as a share of tokens seen (H2O, when `budget_tokens` is 0).
    pub ratio: f32,
    /// Recent window always kept (H2O).
    pub recent: i32,
}

/// What every policy file implements (object-safe: [`Eviction::with`](super::Eviction::with)
/// hands out `&dyn Policy`).
pub trait Policy: fmt::Debug {
    /// Writes the spec string, e.g. `window:size=256,sinks=4`.
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    /// Tokens held per (sequence, kv head) after `seen` tokens (the cap after eviction).
    fn held_tokens(&self, seen: usize) -> usize;
    /// Bookkeeping bytes per held token and kv head (a u32 position, plus an f32 score for
    /// policies that keep one).
    fn bookkeeping_bytes_per_token(&self) -> usize {
        4 + if self.keeps_scores() { 4 } else { 0 }
    }
    /// Whether each slot accumulates the attention it receives (H2O).
    fn keeps_scores(&self) -> bool {
        false
    }
    /// The slots of one (sequence, kv head) to drop after `seen` tokens, given each slot's
    /// absolute position `pos` and accumulated attention `score` (empty unless
    /// [`Self::keeps_scores`]). Any order; the cache swap-removes them from the highest slot down.
    fn victims(&self, pos: &[u32], score: &[f32], seen: usize) -> Vec<usize>;
    /// `kv_evict`'s arguments for this policy.
    fn gpu(&self) -> GpuEvict;
}

/// The names and parser of a policy (the static half of [`Policy`]).
pub trait PolicySpec: Policy + Sized {
    /// The name before `@` (or alone), e.g. `h2o`.
    const NAMES: &'static [&'static str];
    /// Its entry in [`crate::kv::VALID_SCHEMES`].
    const HELP: &'static str;
    /// Parses `name[:k=v,…]`; `Err` is the reason.
    fn parse(p: &Params<'_>) -> Result<Self, String>;
}
