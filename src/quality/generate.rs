//! Greedy generation through a KV cache, for the generation-based quality tasks (ROUGE on
//! summaries, passkey retrieval).

use crate::error::Result;
use crate::kv::{AnyCache, KvScheme};
use crate::model::{argmax_rows, Model};

/// Greedy continuation of `prompt` (token ids, batch 1) with K/V stored in `scheme`: one
/// prefill forward, then one decode step per token, stopping after a token in `stop` (not
/// returned) or `max_new` tokens. Eviction schemes act during prefill and every step, as in
/// serving. Errors: the scheme's validation and the model forward's.
pub fn greedy(
    model: &Model,
    scheme: KvScheme,
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
) -> Result<Vec<u32>> {
    let geom = model.config.cache_geometry();
    let mut cache = AnyCache::new(scheme, geom, 1, prompt.len() + max_new, model.device())?;
    let cache = cache.as_attention();
    let mut out = Vec::with_capacity(max_new);
    if max_new == 0 {
        return Ok(out);
    }
    let mut next = argmax_rows(&model.forward_last(prompt, 1, cache)?)?[0];
    while !stop.contains(&next) {
        out.push(next);
        if out.len() == max_new {
            break;
        }
        next = argmax_rows(&model.forward_last(&[next], 1, cache)?)?[0];
    }
    Ok(out)
}
