//! The contract every format file implements ([`Format`], [`FormatSpec`]) and the small types
//! it speaks in ([`ScaleScope`]). A leaf of `formats/`: it names no format and not the registry
//! ([`Quant`](super::Quant), in `mod.rs`), so each format file imports it without reaching back
//! to the registry that lists that file.

use std::fmt;

use super::gpu::GpuFormat;
use crate::kv::params::Params;
use crate::kv::stream::Stream;

/// Where a format's external scale lives (fp8 with `scale=head` or `scale=tensor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleScope {
    /// One scale per (sequence, kv head, layer), counted in that stream's bytes.
    Head,
    /// One scale per layer (K and V apart), counted once per layer.
    Tensor,
}

/// What every format file implements (object-safe: [`Quant::with`](super::Quant::with) hands
/// out `&dyn Format`).
/// `d` is head_dim; byte counts are exact, as the CPU cache stores them.
pub trait Format: fmt::Debug {
    /// Writes the spec string (the inverse of [`FormatSpec::parse`]; defaults omitted).
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    /// Checks the format against a model's head_dim; `Err` is the reason and what to change.
    fn validate(&self, _d: usize) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Whether a refusal by [`Self::validate`] should go on to name the formats that do store
    /// that head_dim (the registry appends them, nearest in row bytes first, so the advice is
    /// always valid there); `false`: the reason already says what to change.
    fn suggests_alternatives(&self) -> bool {
        false
    }
    /// Bytes one stored row of `d` elements takes (formats whose cost depends on the token
    /// count report their per-row part and override [`Self::stream_bytes`]).
    fn row_bytes(&self, d: usize) -> usize;
    /// Exact bytes one (sequence, kv head, K or V) stream holds after `n` tokens.
    fn stream_bytes(&self, d: usize, n: usize) -> usize {
        n * self.row_bytes(d)
    }
    /// Bytes per layer (K or V) outside the streams once anything is written (a per-tensor
    /// scale), else 0.
    fn layer_bytes(&self) -> usize {
        0
    }
    /// Tokens quantized together (KIVI's token group), else 1.
    fn token_group(&self) -> usize {
        1
    }
    /// Whether the format quantizes along tokens per channel (keys only; no eviction).
    fn per_channel(&self) -> bool {
        false
    }
    /// The value format a spec naming only this key format pairs it with (KIVI: per-channel
    /// keys, per-token values of the same width), as the registry name it parses with default
    /// parameters (e.g. `"int4"`); `None`: values use the same format.
    fn value_partner(&self) -> Option<&'static str> {
        None
    }
    /// Where the external scale lives, for formats that need one before the first write.
    fn external_scale(&self) -> Option<ScaleScope> {
        None
    }
    /// The external scale for the first write `x` (formats with [`Self::external_scale`]).
    fn calibrate(&self, _x: &[f32]) -> f32 {
        1.0
    }
    /// A new, empty CPU stream for rows of `d` elements.
    fn new_stream(&self, d: usize) -> Box<dyn Stream>;
    /// The CUDA kernels' form of this format; `None`: CPU only.
    fn gpu(&self) -> Option<GpuFormat> {
        None
    }
}

/// The names and parser of a format (the static half of [`Format`]).
pub trait FormatSpec: Format + Sized {
    /// The names this format answers to (aliases included), e.g. `["int8", "int8-token"]`.
    const NAMES: &'static [&'static str];
    /// Its entry in [`crate::kv::VALID_SCHEMES`], e.g. `int4[:group=G]`.
    const HELP: &'static str;
    /// Parses `name[:k=v,…]` (`p.name` is one of [`Self::NAMES`]); `Err` is the reason.
    fn parse(p: &Params<'_>) -> std::result::Result<Self, String>;
}

/// A format writes its own spec string: `format!("{}", fmt as &dyn Format)` is what the
/// registry's `Display` prints for it, for a format file that must name itself in a message.
impl fmt::Display for dyn Format + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f)
    }
}
