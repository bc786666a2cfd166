//! Loading `--model`: a resolved location ([`ModelLocation`], from [`super::hub::resolve`])
//! read by the GGUF or safetensors loader into a [`Model`] and its tokenizer, on any candle
//! [`Device`] (see [`super::DeviceSpec`]).

use candle_core::Device;

use super::decoder::{Model, ModelSource};
use super::hub::{self, ModelLocation};
use super::linear::WeightDtype;
use super::tokenizer::TextTokenizer;
use super::{gguf, safetensors};
use crate::error::Result;

/// A model and its tokenizer, loaded from whatever `--model` named.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// The decoder.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: TextTokenizer,
    /// Where it came from.
    pub source: ModelSource,
}

/// Resolves `spec` (see [`hub::resolve`]) and loads it on the CPU with linear layers in `dtype`
/// ([`load_on`] with [`Device::Cpu`]).
///
/// Errors: [`crate::Error::ModelNotFound`] (missing path, uncached repo with the hub unreachable),
/// [`crate::Error::ModelFormat`] (truncated or malformed files), [`crate::Error::Unsupported`] (architecture or
/// tokenizer kvbench does not implement), [`crate::Error::Fetch`] (default model download failed).
pub fn load(spec: &str, dtype: WeightDtype) -> Result<LoadedModel> {
    load_on(spec, dtype, &Device::Cpu)
}

/// Resolves `spec` and loads it with every weight on `device` (open one with
/// [`DeviceSpec::open`]). Errors: [`load`]'s, and [`crate::Error::Candle`] when the device runs out of
/// memory or cannot run a weight format.
pub fn load_on(spec: &str, dtype: WeightDtype, device: &Device) -> Result<LoadedModel> {
    load_location_on(spec, &hub::resolve(spec)?, dtype, device)
}

/// Loads an already resolved location on the CPU (resolution is separate so the sweep can load
/// the same files twice, in two weight dtypes, without resolving twice).
pub fn load_location(spec: &str, loc: &ModelLocation, dtype: WeightDtype) -> Result<LoadedModel> {
    load_location_on(spec, loc, dtype, &Device::Cpu)
}

/// [`load_location`] with every weight on `device`. Errors: [`load_on`]'s.
pub fn load_location_on(
    spec: &str,
    loc: &ModelLocation,
    dtype: WeightDtype,
    device: &Device,
) -> Result<LoadedModel> {
    let (model, tokenizer, mut source) = match loc {
        ModelLocation::Gguf(path) if super::gemma3::is_gemma3_file(path)? => {
            super::gemma3::load(path, dtype, device)?
        }
        ModelLocation::Gguf(path) => gguf::load(path, dtype, device)?,
        ModelLocation::Safetensors {
            config,
            tokenizer,
            weights,
            repo,
        } => safetensors::load(config, tokenizer, weights, repo.clone(), dtype, device)?,
    };
    source.spec = spec.to_string();
    Ok(LoadedModel {
        model,
        tokenizer,
        source,
    })
}
