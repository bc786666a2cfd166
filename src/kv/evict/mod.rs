//! Token eviction policies: one file per policy, behind the closed registry [`Eviction`].
//!
//! Each file owns its policy: parameters (a struct whose fields are the [`Eviction`] variant's),
//! names and parsing ([`PolicySpec`]), `Display`, how many tokens it keeps, its bookkeeping
//! bytes, the victim choice the CPU cache applies after each attention step, and the arguments
//! of the GPU's `kv_evict` kernel. Adding a policy is its file plus one line in the
//! [`policies!`] invocation at the bottom of this file.

use std::fmt;

use super::params::Params;

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

/// What every policy file implements (object-safe: [`Eviction::with`] hands out `&dyn Policy`).
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

/// A parser of the registry: the names it takes and the function.
pub(crate) type Parser = (
    &'static [&'static str],
    fn(&Params<'_>) -> Result<Eviction, String>,
);

/// Generates the closed set [`Eviction`] from one line per policy (`Variant { fields } =>
/// module::Type;`): the `pub mod module;` declaration (file `evict/module.rs`), the variant,
/// [`Eviction::with`], `From<Type>`, the parser table and help entries.
macro_rules! policies {
    ($(
        $(#[$doc:meta])*
        $variant:ident { $($field:ident : $fty:ty),* $(,)? } => $module:ident :: $ty:ident;
    )*) => {
        $( pub mod $module; )*

        /// Token eviction policy: one variant per policy file (see [`self`]).
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Eviction {
            $( $(#[$doc])* $variant { $($field: $fty),* }, )*
        }

        impl Eviction {
            /// Runs `f` on this policy's own type (the delegation behind every method).
            pub fn with<R>(self, f: impl FnOnce(&dyn Policy) -> R) -> R {
                match self {
                    $( Eviction::$variant { $($field),* } => f(&$module::$ty { $($field),* }), )*
                }
            }
        }

        $(
            impl From<$module::$ty> for Eviction {
                fn from(x: $module::$ty) -> Eviction {
                    let $module::$ty { $($field),* } = x;
                    Eviction::$variant { $($field),* }
                }
            }
        )*

        /// Every policy's names and parser, in registry order.
        pub(crate) const PARSERS: &[Parser] = &[
            $( (<$module::$ty as PolicySpec>::NAMES,
                |p| <$module::$ty as PolicySpec>::parse(p).map(Eviction::from)), )*
        ];

        /// Every policy's help entry, in registry order.
        pub(crate) const HELP: &[&str] = &[ $( <$module::$ty as PolicySpec>::HELP, )* ];
    };
}

impl Eviction {
    /// Parses one policy spec (`h2o:budget=64`). `Ok(None)`: no policy has that name.
    pub(crate) fn parse(p: &Params<'_>) -> Result<Option<Eviction>, String> {
        match PARSERS.iter().find(|(names, _)| names.contains(&p.name)) {
            Some((_, parse)) => parse(p).map(Some),
            None => Ok(None),
        }
    }

    /// Tokens held per (sequence, kv head) after `seen` tokens.
    pub fn held_tokens(self, seen: usize) -> usize {
        self.with(|p| p.held_tokens(seen))
    }

    /// Bookkeeping bytes per held token and kv head.
    pub fn bookkeeping_bytes_per_token(self) -> usize {
        self.with(|p| p.bookkeeping_bytes_per_token())
    }

    /// Whether slots accumulate attention scores (H2O).
    pub fn keeps_scores(self) -> bool {
        self.with(|p| p.keeps_scores())
    }

    /// The slots to drop (see [`Policy::victims`]).
    pub fn victims(self, pos: &[u32], score: &[f32], seen: usize) -> Vec<usize> {
        self.with(|p| p.victims(pos, score, seen))
    }

    /// `kv_evict`'s arguments.
    pub fn gpu(self) -> GpuEvict {
        self.with(|p| p.gpu())
    }
}

impl fmt::Display for Eviction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|p| p.write(f))
    }
}

policies! {
    /// Heavy-Hitter Oracle (Zhang et al. 2023, arXiv 2306.14048, Alg. 1): keep the tokens with
    /// the largest accumulated attention (per kv head, summed over its query heads) plus the
    /// `recent` newest; at most `budget` tokens per (sequence, kv head).
    H2o { budget: h2o::Budget, recent: usize } => h2o::H2o;
    /// Sliding window of the `size` newest tokens plus the first `sinks` tokens (attention sinks,
    /// StreamingLLM, Xiao et al. 2023, arXiv 2309.17453). Keys keep their original RoPE
    /// positions (they are cached after rotation); StreamingLLM re-rotates them to positions
    /// inside the cache instead.
    Window { size: usize, sinks: usize } => window::Window;
}
