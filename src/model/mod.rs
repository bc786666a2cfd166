//! A Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM) built from candle ops, whose
//! attention reads and writes a KV cache passed in from outside (any [`AttentionCache`]: the CPU
//! [`KvCache`](crate::kv::KvCache) or a device-side one), and the loaders that build it from a
//! GGUF file, a safetensors folder or a Hugging Face repo, on any candle [`Device`] (see
//! [`DeviceSpec`]).
//!
//! Architecture as in Touvron et al. 2023 (Llama 2, §2.2): pre-norm RMSNorm, rotary position
//! embeddings (RoFormer, Su et al. 2021), grouped-query attention (Ainslie et al. 2023), SwiGLU MLP.
//! Qwen2 adds biases to the q/k/v projections. Gemma 3 ([`gemma3`]) runs through the same
//! [`Model`] with its own forward pass ([`DecoderVariant`]) and a SentencePiece tokenizer
//! ([`spm`]).

pub mod decoder;
pub mod device;
pub mod digest;
pub mod fetch;
pub mod gemma3;
pub mod geometry;
pub mod gguf;
pub mod gguf_scan;
pub mod hub;
pub mod linear;
pub mod load;
pub mod mapped;
pub mod qmatmul;
pub mod safetensors;
pub mod shapes;
pub mod spm;
pub mod tokenizer;

pub use decoder::{
    argmax_rows, Block, DecoderVariant, LayerInputFn, LayerInputHook, Model, ModelConfig,
    ModelSource, RopeStyle,
};
pub use device::DeviceSpec;
pub use hub::ModelLocation;
pub use linear::{Embedding, Linear, StoredTensor, WeightDtype};
pub use load::{load, load_location, load_location_on, load_on, LoadedModel};
pub use tokenizer::TextTokenizer;
