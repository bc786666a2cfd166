//! Token eviction policies: one file per policy, behind the closed registry [`Eviction`].
//!
//! Each file owns its policy: parameters (a struct whose fields are the [`Eviction`] variant's),
//! names and parsing ([`PolicySpec`]), `Display`, how many tokens it keeps, its bookkeeping
//! bytes, the victim choice the CPU cache applies after each attention step, and the arguments
//! of the GPU's `kv_evict` kernel. Adding a policy is its file plus one line in the
//! [`policies!`] invocation at the bottom of this file.
//!
//! Floors inside this folder (issue #21): `contract` (the traits every policy implements and
//! the kernel arguments they return) → the policy files → the registry here, which names them.

mod contract;

use std::fmt;

use super::params::Params;
pub use contract::{GpuEvict, Policy, PolicySpec};

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
