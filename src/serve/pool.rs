//! The paged KV block pool the serving scheduler obeys: a fixed number of equal blocks carved
//! out of `--kv-budget`, a free list, one block table per sequence, and reference counts so a
//! shared prefix is stored once (vLLM's block manager and automatic prefix caching: Kwon et al.
//! 2023, "Efficient Memory Management for LLM Serving with PagedAttention", §4.1–4.4; vLLM
//! `vllm/v1/core/kv_cache_manager.py`).
//!
//! The pool only does the bookkeeping; the K/V data lives in [`crate::kv::KvCache`]. Sizes come
//! from the cache's own accounting ([`KvScheme::bytes_for`]), so the pool and the cache agree
//! by construction: a block holds `block_tokens` tokens at the scheme's long-run cost per token
//! ([`BlockSizer::block_bytes`]), and a sequence that has written `seen` tokens holds
//! `⌈bytes_for(seen) / block_bytes⌉` blocks. For the row formats (fp16, int8, int4, fp8, q8_0,
//! q4_0) that is exactly `⌈held / block_tokens⌉` blocks, as in vLLM; formats with a per-sequence
//! tail (KIVI's full-precision residual rows) take the extra blocks their tail needs; eviction
//! schemes hold only their capped tokens (vLLM frees the blocks a sliding window has left).
//!
//! Hybrid models ([`crate::kv::SlidingWindow`]: Gemma 2 and 3, Mistral 7B v0.1) are one pool
//! of bytes as vLLM's hybrid KV cache manager makes them (`vllm/v1/core/kv_cache_manager.py`
//! with one `SingleTypeKVCacheManager` per layer group, `single_type_kv_cache_manager.py`): a
//! global layer's table grows by a block every `block_tokens` tokens; a window layer's stops
//! at the blocks `SlidingWindowManager.remove_skipped_blocks` leaves — at most
//! `⌈window / block_tokens⌉ + 1` ([`crate::kv::SlidingWindow::blocks_held`]). A sequence's bytes
//! are the window layers' (capped) plus the global layers' ([`BlockSizer::paged_bytes`]), in
//! blocks of `block_tokens` tokens of every layer.

use crate::error::{Error, Result};
use crate::kv::{CacheGeometry, KvScheme};

/// Turns a scheme's stored bytes into whole blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockSizer {
    /// The scheme stored.
    pub scheme: KvScheme,
    /// The model's cache geometry.
    pub geom: CacheGeometry,
    /// Tokens per block (vLLM's default 16).
    pub block_tokens: usize,
}

impl BlockSizer {
    /// Bytes of one block: `block_tokens` tokens at the scheme's long-run bytes per token for
    /// the whole model ([`KvScheme::bytes_per_token`]) plus eviction bookkeeping (a u32 position,
    /// and an f32 score for H2O, per token and kv head and layer) and the position a window
    /// layer keeps per token and kv head
    /// ([`KvScheme::window_bookkeeping_bytes_per_token`]). For SmolLM2-135M (30 layers, 3 kv
    /// heads, head_dim 64) in fp16: 16 · 2·30·3·64·2 = 368,640 bytes.
    pub fn block_bytes(&self) -> u64 {
        let g = &self.geom;
        let per_token = self.scheme.bytes_per_token(g)
            + self.scheme.bookkeeping_bytes_per_token() * g.layers * g.kv_heads
            + self.scheme.window_bookkeeping_bytes_per_token() * g.window_layers() * g.kv_heads;
        (per_token * self.block_tokens) as u64
    }

    /// Bytes one sequence's cache stores after `seen` tokens ([`KvScheme::bytes_for`], batch 1).
    pub fn seq_bytes(&self, seen: usize) -> u64 {
        self.scheme.bytes_for(&self.geom, 1, seen) as u64
    }

    /// Bytes one sequence's block tables cover after `seen` tokens: without a window
    /// [`Self::seq_bytes`]; with one, the window layers at the slots of the blocks vLLM keeps
    /// ([`crate::kv::SlidingWindow::blocks_held`] × `block_tokens`, never more than the tokens
    /// held) plus the global layers at every held token. Gemma 3 27B (10 global + 52 window
    /// layers of 16 KV heads × 128) in fp16 with blocks of 16, after 4,097 tokens: window
    /// layers keep 257 − ⌊3074 / 16⌋ = 65 blocks = 1,040 slots, so 52 · 1,040 · 8192 +
    /// 10 · 4,097 · 8192 bytes.
    pub fn paged_bytes(&self, seen: usize) -> u64 {
        let g = &self.geom;
        let held = self.scheme.held_tokens(seen);
        let Some(w) = g.window else {
            return self.seq_bytes(seen);
        };
        let slots = (w.blocks_held(seen, self.block_tokens) * self.block_tokens).min(held);
        self.scheme
            .bytes_by_layer_type(g, 1, slots.max(held.min(w.window)), held)
            .total() as u64
    }

    /// Blocks one sequence needs after `seen` tokens: `⌈paged_bytes(seen) / block_bytes⌉`
    /// (`⌈seq_bytes(seen) / block_bytes⌉` without a window).
    pub fn blocks_for(&self, seen: usize) -> usize {
        self.paged_bytes(seen).div_ceil(self.block_bytes().max(1)) as usize
    }

    /// The most blocks one sequence holds at any point of a life of `seen` tokens:
    /// `max_{s ≤ seen} blocks_for(s)`. For the row formats that is `blocks_for(seen)`; the
    /// per-channel formats (KIVI) hold up to `residual + group − 1` full-precision rows just
    /// before each group is quantized, so a sequence can need more blocks in mid-life than at
    /// its end (issue #25: an `int8-channel` request passed the budget check at its final
    /// length, then failed for want of a block). Within one period of the formats' token
    /// groups the bytes only grow, and each period's peak exceeds the one before, so the maximum
    /// is in the last `k group × v group` tokens: those are the only ones evaluated.
    /// With a sliding window the window layers' blocks rise and fall by one every
    /// `block_tokens` tokens (a block is freed as the window leaves it), so the last
    /// `groups × block_tokens` tokens are evaluated.
    pub fn peak_blocks(&self, seen: usize) -> usize {
        let period = self.scheme.k.token_group()
            * self.scheme.v.token_group()
            * if self.geom.window.is_some() {
                self.block_tokens.max(1)
            } else {
                1
            };
        (seen.saturating_sub(period)..=seen)
            .map(|s| self.blocks_for(s))
            .max()
            .unwrap_or(0)
    }
}

/// Identifies a sequence in the pool (the scheduler's request id).
pub type SeqId = usize;

/// Fixed-size blocks with a free list, block tables and reference counts.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_bytes: u64,
    /// Free block ids; allocation pops from the end (LIFO, as vLLM's free queue reuses the most
    /// recently freed block first).
    free: Vec<u32>,
    /// References per block: 0 free, 1 owned by one table, more when shared.
    refs: Vec<u32>,
    /// Block table per sequence (ids in token order); shared prefix blocks come first.
    tables: std::collections::BTreeMap<SeqId, Vec<u32>>,
    /// Blocks of the shared prefix, held by the pool itself while prefix caching is on.
    prefix: Vec<u32>,
}

impl BlockPool {
    /// `⌊budget_bytes / block_bytes⌋` blocks. Errors: [`Error::InvalidArgument`] naming
    /// `--kv-budget` when the budget holds no block, or `--block-size` for empty blocks.
    pub fn new(budget_bytes: u64, block_bytes: u64) -> Result<Self> {
        if block_bytes == 0 {
            return Err(Error::InvalidArgument {
                name: "--block-size".into(),
                reason: "a block must hold at least one token".into(),
            });
        }
        let n = budget_bytes / block_bytes;
        if n == 0 {
            return Err(Error::InvalidArgument {
                name: "--kv-budget".into(),
                reason: format!(
                    "{budget_bytes} bytes hold no block of {block_bytes} bytes; give a larger budget"
                ),
            });
        }
        let n = u32::try_from(n).map_err(|_| Error::InvalidArgument {
            name: "--kv-budget".into(),
            reason: format!("{n} blocks are more than this pool can index; use larger blocks"),
        })?;
        Ok(Self {
            block_bytes,
            free: (0..n).rev().collect(),
            refs: vec![0; n as usize],
            tables: Default::default(),
            prefix: Vec::new(),
        })
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks on the free list.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Blocks in use (referenced at least once).
    pub fn used(&self) -> usize {
        self.total() - self.free()
    }

    /// Blocks of the shared prefix (0 without prefix caching).
    pub fn prefix_blocks(&self) -> usize {
        self.prefix.len()
    }

    /// Blocks in `seq`'s table (shared ones included), 0 for an unknown sequence.
    pub fn table_len(&self, seq: SeqId) -> usize {
        self.tables.get(&seq).map_or(0, Vec::len)
    }

    /// Sequences holding a block table.
    pub fn sequences(&self) -> usize {
        self.tables.len()
    }

    /// Table entries over all sequences: the blocks the same sequences would hold without
    /// sharing. While a prefix is referenced, `table_entries() − used()` blocks are saved by
    /// sharing (saturating: a held prefix no sequence uses saves nothing).
    pub fn table_entries(&self) -> usize {
        self.tables.values().map(Vec::len).sum::<usize>()
    }

    /// Allocates `n` blocks for the shared prefix, held by the pool (reference 1) until
    /// [`drop_prefix`](Self::drop_prefix). Errors: [`Error::InvalidArgument`] naming
    /// `--shared-prefix` when they do not fit, or when a prefix is already held.
    pub fn hold_prefix(&mut self, n: usize) -> Result<()> {
        if !self.prefix.is_empty() {
            return Err(Error::InvalidArgument {
                name: "--shared-prefix".into(),
                reason: "a shared prefix is already held".into(),
            });
        }
        if n > self.free.len() {
            return Err(Error::InvalidArgument {
                name: "--shared-prefix".into(),
                reason: format!(
                    "the prefix needs {n} blocks but the pool has {}; give a larger --kv-budget \
                     or a shorter prefix",
                    self.free.len()
                ),
            });
        }
        self.prefix = self.pop(n);
        Ok(())
    }

    /// Releases the pool's own reference to the prefix blocks.
    pub fn drop_prefix(&mut self) {
        for b in std::mem::take(&mut self.prefix) {
            self.unref(b);
        }
    }

    /// Whether `seq` (new, or holding a table) can grow to `blocks` table entries, the first
    /// `shared` of them being the prefix's (only for a new sequence), with the blocks free now.
    pub fn can_grow(&self, seq: SeqId, blocks: usize, shared: usize) -> bool {
        self.new_blocks(seq, blocks, shared) <= self.free.len()
    }

    /// Blocks that growing `seq` to `blocks` entries would take from the free list.
    pub fn new_blocks(&self, seq: SeqId, blocks: usize, shared: usize) -> usize {
        match self.tables.get(&seq) {
            Some(t) => blocks.saturating_sub(t.len()),
            None => blocks.saturating_sub(shared.min(self.prefix.len())),
        }
    }

    /// Grows (or shrinks, freeing the tail, as a sliding window frees what it left) `seq`'s
    /// table to `blocks` entries. A new sequence starts with the first `shared` prefix blocks
    /// (reference counts +1), then private blocks. Errors: [`Error::InvalidArgument`] when the
    /// free list is short (callers check [`can_grow`](Self::can_grow) and preempt first).
    pub fn grow(&mut self, seq: SeqId, blocks: usize, shared: usize) -> Result<()> {
        let need = self.new_blocks(seq, blocks, shared);
        if need > self.free.len() {
            return Err(Error::InvalidArgument {
                name: "block pool".into(),
                reason: format!(
                    "sequence {seq} needs {need} blocks, {} are free",
                    self.free.len()
                ),
            });
        }
        if !self.tables.contains_key(&seq) {
            let s = shared.min(self.prefix.len()).min(blocks);
            let head: Vec<u32> = self.prefix[..s].to_vec();
            for &b in &head {
                self.refs[b as usize] += 1;
            }
            self.tables.insert(seq, head);
        }
        let fresh = self.pop(need);
        let table = self.tables.get_mut(&seq).expect("inserted above");
        table.extend(fresh);
        while table.len() > blocks {
            let b = table.pop().expect("len > blocks ≥ 0");
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                self.free.push(b);
            }
        }
        Ok(())
    }

    /// Frees `seq`'s table (a finished or preempted sequence); shared blocks lose a reference.
    pub fn release(&mut self, seq: SeqId) {
        if let Some(t) = self.tables.remove(&seq) {
            for b in t {
                self.unref(b);
            }
        }
    }

    fn pop(&mut self, n: usize) -> Vec<u32> {
        let out = self.free.split_off(self.free.len() - n);
        for &b in &out {
            self.refs[b as usize] = 1;
        }
        out
    }

    fn unref(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm() -> CacheGeometry {
        CacheGeometry {
            layers: 30,
            kv_heads: 3,
            q_heads: 9,
            head_dim: 64,
            window: None,
        }
    }

    /// Issue 25, by hand: int8-channel keys (groups of 32, 128 residual rows) with int8-token
    /// values on SmolLM2-135M. Long run per (layer, kv head) and token: keys 32 · 64 codes +
    /// 64 f16 scales per 32 tokens = 68 bytes, values 64 + 2 = 66: a 16-token block is
    /// 16 · 90 · 134 = 192,960 bytes. At 160 tokens one group is quantized: keys 2,176 +
    /// 128 · 128 = 18,560, values 160 · 66 = 10,560, × 90 = 2,620,800 bytes = 13.6 → 14 blocks;
    /// at 159 none is: keys 159 · 128 = 20,352, values 10,494, × 90 = 2,776,140 = 14.4 → 15.
    /// A 160-token life peaks at 15 blocks, one more than its end needs.
    #[test]
    fn per_channel_residual_peaks_before_its_end() {
        let s = BlockSizer {
            scheme: "int8-channel".parse().unwrap(),
            geom: smollm(),
            block_tokens: 16,
        };
        assert_eq!(s.block_bytes(), 192_960);
        assert_eq!(s.seq_bytes(160), 2_620_800);
        assert_eq!(s.seq_bytes(159), 2_776_140);
        assert_eq!(s.blocks_for(160), 14);
        assert_eq!(s.peak_blocks(160), 15);
        // Row formats only grow: the peak is the end.
        let f = BlockSizer {
            scheme: "fp16".parse().unwrap(),
            ..s
        };
        assert_eq!(f.peak_blocks(160), f.blocks_for(160));
        assert_eq!(f.blocks_for(160), 10);
    }

    /// Block bytes by hand for SmolLM2-135M, 16 tokens: fp16 rows are 128 bytes, int8-token
    /// 64 + 2 = 66, int4 (groups of 32: 2 × (4 + 16)) 40; 2 (K, V) × 30 layers × 3 kv heads =
    /// 180 rows per token. A window adds a u32 position per row.
    #[test]
    fn block_bytes_by_hand() {
        for (spec, row) in [("fp16", 128), ("int8-token", 66), ("int4", 40)] {
            let s = BlockSizer {
                scheme: spec.parse().unwrap(),
                geom: smollm(),
                block_tokens: 16,
            };
            assert_eq!(s.block_bytes(), 16 * 180 * row, "{spec}");
        }
        let w = BlockSizer {
            scheme: "window:size=64,sinks=4".parse().unwrap(),
            geom: smollm(),
            block_tokens: 16,
        };
        // 16 tokens × (180 fp16 rows of 128 bytes + 90 (layer, head) positions of 4 bytes).
        assert_eq!(w.block_bytes(), 16 * (180 * 128 + 90 * 4));
        // The window holds 68 tokens at most: 5 blocks, however long the sequence.
        assert_eq!(w.blocks_for(1000), 5);
        assert_eq!(w.blocks_for(33), 3);
    }

    /// Row formats need exactly ⌈seen / 16⌉ blocks, as vLLM.
    #[test]
    fn row_formats_take_ceil_blocks() {
        for spec in ["fp16", "int8-token", "int4", "q8_0", "q4_0"] {
            let s = BlockSizer {
                scheme: spec.parse().unwrap(),
                geom: smollm(),
                block_tokens: 16,
            };
            for (seen, blocks) in [(0, 0), (1, 1), (16, 1), (17, 2), (256, 16), (257, 17)] {
                assert_eq!(s.blocks_for(seen), blocks, "{spec} {seen}");
            }
        }
    }

    /// A budget of 10 blocks; sequences of 3 blocks: three fit (9 blocks), a fourth does not;
    /// releasing one lets it in; shrinking frees the tail.
    #[test]
    fn admission_and_release_by_hand() {
        let mut p = BlockPool::new(10 * 1000 + 999, 1000).unwrap();
        assert_eq!(p.total(), 10);
        for id in 0..3 {
            assert!(p.can_grow(id, 3, 0));
            p.grow(id, 3, 0).unwrap();
        }
        assert_eq!((p.used(), p.free()), (9, 1));
        assert!(!p.can_grow(3, 3, 0));
        assert!(p.grow(3, 3, 0).is_err());
        assert!(p.can_grow(0, 4, 0)); // one more block for sequence 0
        p.release(1);
        assert_eq!(p.free(), 4);
        p.grow(3, 3, 0).unwrap();
        p.grow(3, 1, 0).unwrap();
        assert_eq!((p.table_len(3), p.free()), (1, 3));
        assert!(BlockPool::new(999, 1000).is_err());
    }

    /// A prefix of 2 blocks shared by 3 sequences of 5 blocks: 2 + 3 × 3 = 11 blocks in use
    /// instead of 15; 4 saved. The prefix stays while the pool holds it, then goes with the
    /// last sequence.
    #[test]
    fn shared_prefix_is_stored_once() {
        let mut p = BlockPool::new(20_000, 1000).unwrap();
        p.hold_prefix(2).unwrap();
        for id in 0..3 {
            assert_eq!(p.new_blocks(id, 5, 2), 3);
            p.grow(id, 5, 2).unwrap();
        }
        assert_eq!(p.used(), 11);
        assert_eq!(p.table_entries() - p.used(), 4);
        p.drop_prefix();
        for id in 0..3 {
            p.release(id);
        }
        assert_eq!(p.used(), 0);
        assert_eq!(p.free(), 20);
    }

    /// Gemma 3 27B (62 layers: 10 global, 52 with a 1024-token window; 16 KV heads × 128) in
    /// fp16, blocks of 16: a layer token is 2 · 16 · 128 · 2 = 8192 bytes, plus 16 · 4 = 64 of
    /// positions on a window layer, so a block is 16 · (62 · 8192 + 52 · 64) = 8,179,712 bytes.
    /// At 512 tokens every layer holds 512 → 32 blocks; at 131,072 the window layers keep 64
    /// blocks (1024 slots) and the global ones 8192: 52 · 1024 · 8256 + 10 · 131,072 · 8192 =
    /// 11,177,033,728 bytes / 8,179,712 = 1366.4 → 1367 blocks, against 8192 counted
    /// all-global. At 131,073 the window straddles a block edge: 52 · 1040 · 8256 +
    /// 10 · 131,073 · 8192 = 11,183,984,640 → 1367.3 → 1368 blocks.
    #[test]
    fn gemma3_window_blocks_by_hand() {
        let g = crate::model::geometry::geometry("gemma-3-27b")
            .unwrap()
            .cache();
        let s = BlockSizer {
            scheme: KvScheme::FP16,
            geom: g,
            block_tokens: 16,
        };
        assert_eq!(s.block_bytes(), 8_179_712);
        assert_eq!(s.blocks_for(512), 32);
        assert_eq!(s.blocks_for(131_072), 1367);
        assert_eq!(s.blocks_for(131_073), 1368);
        assert_eq!(s.seq_bytes(131_072), 11_177_033_728);
        let naive = BlockSizer {
            geom: g.without_window(),
            ..s
        };
        assert_eq!(naive.blocks_for(131_072), 8192);
        // At 131,087 the window layers are back to 64 blocks (8193 − ⌊130,064 / 16⌋ = 8129):
        // 52 · 1024 · 8256 + 10 · 131,087 · 8192 = 11,178,262,528 / 8,179,712 → 1367 blocks;
        // the peak of the last 16 tokens is at 131,086 (65 window blocks): 52 · 1040 · 8256 +
        // 10 · 131,086 · 8192 = 11,185,049,600 → 1368.
        assert_eq!(s.blocks_for(131_087), 1367);
        assert_eq!(s.peak_blocks(131_087), 1368);
    }
}
