//! Capacity planning: how many concurrent sequences of a given context fit in a memory budget,
//! per KV scheme, after the weights and a reserve — the question vLLM answers at start-up with
//! its max-concurrency line, across schemes and contexts.
//!
//! Bytes come from the same accounting the cache uses ([`KvScheme::bytes_for_held`]): scales,
//! zero-points, residual full-precision rows, eviction caps and bookkeeping, with allocation in
//! blocks of `block` tokens per sequence as vLLM's PagedAttention (Kwon et al. 2023, §4.1; 16
//! tokens by default), so the last block's unused slots are counted as waste.

use crate::error::{Error, Result};
use crate::kv::KvScheme;
use crate::model::geometry::ModelGeometry;

/// What is being planned.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanInput {
    /// Model geometry and parameter count.
    pub model: ModelGeometry,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Share of memory kept free (activations, fragmentation), 0–1.
    pub reserve: f64,
    /// Bytes the weights occupy.
    pub weight_bytes: u64,
    /// Tokens per KV block (paged allocation).
    pub block: usize,
}

impl PlanInput {
    /// Bytes left for the KV cache. Errors: [`Error::InvalidArgument`] when the weights and
    /// reserve leave nothing.
    pub fn kv_budget(&self) -> Result<u64> {
        let usable = (self.memory_bytes as f64 * (1.0 - self.reserve)).floor() as u64;
        usable
            .checked_sub(self.weight_bytes)
            .filter(|b| *b > 0)
            .ok_or_else(|| Error::InvalidArgument {
                name: "--memory".into(),
                reason: format!(
                    "{:.2} GiB of weights do not fit in {:.2} GiB after a {:.0} % reserve",
                    gib(self.weight_bytes),
                    gib(usable),
                    self.reserve * 100.0
                ),
            })
    }

    /// KV bytes one sequence of `ctx` tokens occupies: (held tokens rounded up to whole blocks)
    /// and the part of that which is rounding waste.
    pub fn seq_bytes(&self, scheme: &KvScheme, ctx: usize) -> (u64, u64) {
        let g = self.model.cache();
        let held = scheme.held_tokens(ctx);
        let paged = held.div_ceil(self.block) * self.block;
        let exact = scheme.bytes_for_held(&g, 1, held) as u64;
        let total = scheme.bytes_for_held(&g, 1, paged) as u64;
        (total, total - exact)
    }
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanRow {
    /// Model name.
    pub model: String,
    /// Scheme spec.
    pub scheme: String,
    /// Context per sequence, tokens.
    pub ctx: usize,
    /// Tokens held per sequence (eviction schemes cap this).
    pub held_tokens: usize,
    /// Long-run KV bytes per held token, whole model.
    pub bytes_per_token: usize,
    /// KV bytes per sequence with paged allocation.
    pub kv_bytes_per_seq: u64,
    /// Of which unused slots of the last block, bytes.
    pub paging_waste_bytes: u64,
    /// Bytes available for KV after weights and reserve.
    pub kv_budget_bytes: u64,
    /// Concurrent sequences that fit.
    pub max_concurrency: u64,
}

/// Max concurrency for every scheme × context.
pub fn plan(input: &PlanInput, schemes: &[KvScheme], ctxs: &[usize]) -> Result<Vec<PlanRow>> {
    let budget = input.kv_budget()?;
    let g = input.model.cache();
    Ok(schemes
        .iter()
        .flat_map(|s| {
            ctxs.iter().map(move |&ctx| {
                let (per_seq, waste) = input.seq_bytes(s, ctx);
                PlanRow {
                    model: input.model.name.clone(),
                    scheme: s.to_string(),
                    ctx,
                    held_tokens: s.held_tokens(ctx),
                    bytes_per_token: s.bytes_per_token(&g),
                    kv_bytes_per_seq: per_seq,
                    paging_waste_bytes: waste,
                    kv_budget_bytes: budget,
                    max_concurrency: budget / per_seq.max(1),
                }
            })
        })
        .collect())
}

/// The longest context (tokens) at which `concurrency` sequences fit, searched up to `limit`.
pub fn max_context(
    input: &PlanInput,
    scheme: &KvScheme,
    concurrency: u64,
    limit: usize,
) -> Result<usize> {
    let budget = input.kv_budget()?;
    let fits = |ctx: usize| input.seq_bytes(scheme, ctx).0 * concurrency <= budget;
    if !fits(1) {
        return Ok(0);
    }
    let (mut lo, mut hi) = (1usize, limit);
    if fits(hi) {
        return Ok(hi);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid
        } else {
            hi = mid
        }
    }
    Ok(lo)
}

/// Parses `80GiB`, `80G`, `64GB`, `512MiB`, `1e9` into bytes (binary units for `G`/`GiB`/`M`/
/// `MiB`/`K`/`KiB`, decimal for `GB`/`MB`/`KB`). Errors: [`Error::InvalidArgument`].
pub fn parse_bytes(s: &str) -> Result<u64> {
    const MAX_BYTES: u64 = 1 << 60;
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => f64::NAN,
    };
    match num.trim().parse::<f64>() {
        // Above 1 EiB (2^60 bytes) a size is a typo, not a machine: refuse it rather than
        // clamp it silently to u64::MAX.
        Ok(n) if mult.is_finite() && n > 0.0 && n * mult > MAX_BYTES as f64 => {
            Err(Error::InvalidArgument {
                name: "size".into(),
                reason: format!(
                    "`{s}` is {:.3e} bytes, more than 1 EiB; give a size like 80GiB",
                    n * mult
                ),
            })
        }
        Ok(n) if mult.is_finite() && n > 0.0 && n * mult >= 1.0 => Ok((n * mult) as u64),
        _ => Err(Error::InvalidArgument {
            name: "size".into(),
            reason: format!("`{s}` is not a size like 80GiB, 64GB or 512MiB"),
        }),
    }
}

/// Parses token counts like `4k`, `32k`, `128k` (k = 1024) or `4096`.
pub fn parse_tokens(s: &str) -> Result<usize> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => (t.as_str(), 1),
    };
    num.parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .map(|n| n * mult)
        .ok_or_else(|| Error::InvalidArgument {
            name: "--seq-lens".into(),
            reason: format!("`{s}` is not a token count like 4k, 32k or 4096"),
        })
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::geometry::geometry;

    fn input(model: &str, mem: &str, reserve: f64) -> PlanInput {
        let m = geometry(model).unwrap();
        PlanInput {
            weight_bytes: m.params * 2,
            model: m,
            memory_bytes: parse_bytes(mem).unwrap(),
            reserve,
            block: 16,
        }
    }

    /// The seeds' figures: Llama-3-70B with an fp16 cache holds 2·80·8·128·2 = 327,680 bytes per
    /// token, 128k tokens = 40 GiB exactly; an fp8 cache with one scale per layer halves it.
    #[test]
    fn llama3_70b_bytes_per_token_and_128k() {
        let i = input("llama-3-70b", "80GiB", 0.0);
        let g = i.model.cache();
        assert_eq!(KvScheme::FP16.bytes_per_token(&g), 327_680);
        let (bytes, waste) = i.seq_bytes(&KvScheme::FP16, 131_072);
        assert_eq!(bytes, 40 << 30);
        assert_eq!(waste, 0);
        let fp8: KvScheme = "fp8:scale=tensor".parse().unwrap();
        assert_eq!(fp8.bytes_per_token(&g), 163_840);
    }

    /// Bytes per token for every scheme on Llama-3-8B (32 layers × 8 kv heads × K and V = 512
    /// rows of head_dim 128 per token), by hand from each row layout.
    #[test]
    fn llama3_8b_bytes_per_token_by_hand() {
        let g = geometry("llama-3-8b").unwrap().cache();
        for (spec, row_k, row_v) in [
            ("fp16", 256, 256),
            ("int8-token", 130, 130),
            ("int4", 80, 80),
            ("fp8", 130, 130),
            ("fp8:scale=tensor", 128, 128),
            ("q8_0", 136, 136),
            ("q4_0", 72, 72),
            ("int8-channel", 136, 130),
            ("int4-channel", 80, 80),
        ] {
            let s: KvScheme = spec.parse().unwrap();
            assert_eq!(s.bytes_per_token(&g), 256 * (row_k + row_v), "{spec}");
        }
    }

    /// 80 GiB, 10 % reserve, Llama-3-8B bf16 weights (8,030,261,248 × 2 bytes): the KV budget is
    /// 77,309,411,328 − 16,060,522,496 = 61,248,888,832 bytes; a 4k fp16 sequence takes
    /// 4096 × 131,072 = 536,870,912 bytes → 114 sequences; int4 (40,960 bytes/token) → 365.
    #[test]
    fn llama3_8b_on_80gib_by_hand() {
        let i = input("llama-3-8b", "80GiB", 0.1);
        assert_eq!(i.kv_budget().unwrap(), 61_248_888_832);
        let rows = plan(&i, &[KvScheme::FP16, "int4".parse().unwrap()], &[4096]).unwrap();
        assert_eq!(rows[0].max_concurrency, 114);
        assert_eq!(rows[1].max_concurrency, 61_248_888_832 / (4096 * 40_960));
        // Paged rounding: 4,100 tokens occupy 257 blocks of 16 = 4,112 slots; 12 slots are waste.
        let (_, waste) = i.seq_bytes(&KvScheme::FP16, 4100);
        assert_eq!(waste, 12 * 131_072);
        // Max context at 114 sequences is at least 4k and below what 113 would allow.
        let c = max_context(&i, &KvScheme::FP16, 114, 1 << 20).unwrap();
        assert!((4096..4096 + 16 * 3).contains(&c), "{c}");
    }

    /// Eviction caps the held tokens: a 1,024-token window plus 4 sinks holds 1,028 tokens
    /// whatever the context, so its concurrency does not fall with context.
    #[test]
    fn eviction_caps_bytes() {
        let i = input("llama-3-8b", "80GiB", 0.1);
        let w: KvScheme = "window:size=1024,sinks=4".parse().unwrap();
        let r = plan(&i, &[w], &[32_768, 131_072]).unwrap();
        assert_eq!(r[0].held_tokens, 1028);
        assert_eq!(r[0].max_concurrency, r[1].max_concurrency);
    }

    #[test]
    fn weights_that_do_not_fit_are_an_error() {
        let i = input("llama-3-70b", "80GiB", 0.1);
        let e = i.kv_budget().unwrap_err().to_string();
        assert!(e.contains("do not fit"), "{e}");
        assert!(parse_bytes("80 parsecs").is_err());
        assert_eq!(parse_tokens("128k").unwrap(), 131_072);
        assert_eq!(parse_bytes("64GB").unwrap(), 64_000_000_000);
    }
}
