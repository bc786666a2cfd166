//! The former TurboQuant core's path, kept for what outside `kv` still names by it: its parts
//! now live in [`super::quant`] (quantizers), [`super::formats::turboquant`] (the stream) and
//! [`super::spec::PRESETS`] (vLLM's presets).

/// Re-exported from [`crate::util::noise`], its home: `quality::paired` and `measure::sweep`
/// still name it by this path.
pub use crate::util::noise::SplitMix64;
