//! Quantizer building blocks shared by the K/V formats ([`super::formats`]): pure functions and
//! codecs on rows of `head_dim` f32 values that know nothing of caches, layers or the CLI.
//!
//! - [`bits`]: LSB-first bit packing of codes (TurboQuant's indices, QJL's sign bits, 2/3-bit
//!   uniform codes);
//! - [`codebook`]: the Lloyd–Max quantizer of a Gaussian (Max 1960), TurboQuant's N(0, 1/d)
//!   codebook;
//! - [`rotation`]: the normalized Walsh–Hadamard transform (QuaRot §3, `+rot`) and TurboQuant's
//!   randomized Hadamard rotation with seeded sign flips;
//! - [`mse`], [`prod`]: TurboQuant_mse and TurboQuant_prod (Zandieh et al. 2025, arXiv
//!   2504.19874, §3.1 Alg. 1 and §3.2 Alg. 2; the latter with QJL, arXiv 2406.03482);
//! - [`asym`]: asymmetric min/max parameters with outward f16 rounding (KIVI's per-channel keys
//!   and the b-bit uniform value rows).
//!
//! Every random choice (rotation signs, the QJL matrix) comes from
//! [`crate::util::noise::SplitMix64`] seeded by the caller, so a seed recorded in a run's
//! metadata reproduces the same quantizer on any build.
//!
//! Imports run one way: `mse` uses `bits`, `codebook`, `rotation`; `prod` uses those and `mse`;
//! no file here imports this module's re-exports or anything from [`super::formats`].

pub mod asym;
pub mod bits;
pub mod codebook;
pub mod mse;
pub mod prod;
pub mod rotation;

pub use codebook::{Codebook, CODEBOOK_BITS};
pub use mse::TurboQuantMse;
pub use prod::{ProdQuery, TurboQuantProd};
pub use rotation::{hadamard, RandomizedHadamard};
