//! The contract between a decoder layer and its KV cache, whatever device holds it.

use crate::error::{Error, Result};

/// What a decoder layer's attention needs from a KV cache, whatever device holds it: the CPU
/// [`KvCache`] or, with the `cuda` feature, `cuda::CudaKvCache`. Tensors live on the cache's
/// device.
pub trait AttentionCache {
    /// Tokens sequence `b` has written (its next position).
    fn seen(&self, b: usize) -> usize;
    /// Stores `n_new` tokens of keys and values for every sequence of `layer`: `k`, `v`
    /// `[batch, kv_heads, n_new, head_dim]` f32 (RoPE applied to `k`). Errors: a tensor on
    /// another device or of another shape ([`Error::InvalidArgument`]), a device error.
    fn append_tensors(
        &mut self,
        layer: usize,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
    ) -> Result<()>;
    /// Causal attention of queries `q` (`[batch, q_heads, n_q, head_dim]` f32, RoPE applied)
    /// over everything `layer` holds (call after [`append_tensors`](Self::append_tensors)),
    /// then the scheme's eviction. Returns `[batch, q_heads, n_q, head_dim]` f32. Errors as
    /// `append_tensors`.
    fn attend_tensor(
        &mut self,
        layer: usize,
        q: &candle_core::Tensor,
    ) -> Result<candle_core::Tensor>;
    /// Gives layers a sliding attention window (Gemma 2/3 local layers): `windows[l] = Some(w)`
    /// means a query of layer `l` may see only keys fewer than `w` positions back, so the layer
    /// keeps at most `w − 1` tokens between calls (the `w` newest during attention). The caller
    /// must not attend more than `w` tokens at once on such a layer (one query per call once
    /// `w − 1` are held). Calling again with the same windows is a no-op. The default
    /// implementation accepts only "no windows" and refuses the rest with
    /// [`Error::Unsupported`]: a cache that cannot evict per layer would silently attend too far.
    fn set_layer_windows(&mut self, windows: &[Option<usize>]) -> Result<()> {
        if windows.iter().all(Option::is_none) {
            return Ok(());
        }
        Err(Error::Unsupported(
            "this KV cache cannot keep per-layer sliding windows (models such as Gemma 3 need \
             them); run on the CPU cache (--device cpu)"
                .into(),
        ))
    }
}
