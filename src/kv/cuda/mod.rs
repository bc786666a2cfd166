//! KV caches on a CUDA GPU: [`plan`], the host side as pure steps (allocations, growth,
//! split-K splits, grid sizes, argument packing and the host mirror of tokens seen and held;
//! compiled and unit-tested in every build), and with the `cuda` feature the device cache that
//! executes those steps with the kernels of kernels/kv_cache.cu. The CPU emulator
//! (kernels/emu/harness.cpp) executes the same steps, so it tests the launch sequence the GPU
//! runs rather than a copy of it.

pub mod plan;

#[cfg(feature = "cuda")]
mod device;

pub use crate::kv::formats::GpuFormat;
#[cfg(feature = "cuda")]
pub use device::{CudaKvCache, KV_CACHE_PTX};
