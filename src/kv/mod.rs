//! KV-cache schemes and the cache that attention reads.
//!
//! The contract: the model hands each layer's new keys and values (`[batch, kv_heads, n_new,
//! head_dim]` f32, RoPE already applied to keys) to [`KvCache::append`], which stores them in the
//! scheme's form; [`KvCache::attend`] computes causal attention for the new queries by reading
//! the stored form directly, then applies the scheme's eviction. Memory figures come from what is
//! stored: [`KvCache::kv_bytes`] counts every byte held (codes, scales, zero-points, residual
//! rows, eviction bookkeeping) and equals [`KvScheme::bytes_for`] for a geometry without a
//! sliding window ([`KvCache`] applies no window at run time: every layer holds every token).

//!
//! Layout (lower floors first; a module imports only from those above it in this list, and the
//! whole tree only from `crate::error` and `crate::util`: the seeded generator, the SIMD
//! dispatch):
//! - [`params`], [`simd`], [`intdot`], [`codec`]: parameter parsing helpers, AVX2 primitives,
//!   scoring on codes, the row-codec contract;
//! - [`quant`]: the quantizer building blocks formats share (bit packing, Lloyd–Max codebook,
//!   Hadamard rotations, TurboQuant_mse/prod, asymmetric min/max parameters);
//! - [`stream`]: the stored rows of one (sequence, kv head) — [`stream::RowStream`] for every
//!   per-token format;
//! - [`formats`]: one file per K/V format behind the closed registry [`Quant`] (parameters,
//!   parsing, `Display`, validation, byte formula, codec, stream, GPU form);
//! - [`evict`]: one file per eviction policy behind the closed registry [`Eviction`];
//! - [`window`]: hybrid attention's layer split (sliding-window and global layers, Gemma 2/3,
//!   Mistral 7B v0.1) that the byte accounting counts per layer type;
//! - [`scheme`] ([`KvScheme`] and its byte accounting), [`spec`] (the `evict@K/V+rot` grammar);
//! - [`attention`], this module's [`KvCache`], and [`cuda`] (its launch [`cuda::plan`] is pure
//!   and compiled in every build; the device side needs the `cuda` feature).

pub mod attention;
pub mod codeaxpy;
pub mod codec;
pub mod contract;
pub mod cuda;
pub mod evict;
pub mod format;
pub mod formats;
pub mod intdot;
pub mod params;
pub mod quant;
pub mod scheme;
pub mod simd;
pub mod spec;
pub mod stream;
pub mod window;

use rayon::prelude::*;

use crate::error::{Error, Result};
pub use contract::AttentionCache;
pub use evict::h2o::{h2o_budget, Budget};
pub use evict::Eviction;
pub use formats::fp8::{Fp8Kind, Fp8Scale};
pub use formats::{GpuFormat, Quant, ScaleScope};
use quant::rotation::hadamard;
pub use scheme::{CacheGeometry, KvScheme, LayerBytes};
pub use spec::{parse_scheme_list, split_scheme_list, VALID_SCHEMES};
use stream::Stream;

/// K values appended by one call (`batch · kv_heads · n_new · head_dim`) from which the heads
/// are encoded in parallel on rayon's pool: a prefill's rows, not a decode step's one row per
/// head (a join there costs more than the encoding).
const PARALLEL_APPEND: usize = 32 * 1024;
pub use window::{GlobalLayers, SlidingWindow, TokensHeld};

impl AttentionCache for KvCache {
    fn seen(&self, b: usize) -> usize {
        KvCache::seen(self, b)
    }

    fn append_tensors(
        &mut self,
        layer: usize,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
    ) -> Result<()> {
        let n = k.dim(2)?;
        let kf = k.flatten_all()?.to_vec1::<f32>()?;
        let vf = v.flatten_all()?.to_vec1::<f32>()?;
        self.append(layer, &kf, &vf, n);
        Ok(())
    }

    fn attend_tensor(
        &mut self,
        layer: usize,
        q: &candle_core::Tensor,
    ) -> Result<candle_core::Tensor> {
        let (b, h, n, d) = q.dims4()?;
        let qf = q.flatten_all()?.to_vec1::<f32>()?;
        let out = self.attend(layer, &qf, n);
        Ok(candle_core::Tensor::from_vec(
            out,
            (b, h, n, d),
            &candle_core::Device::Cpu,
        )?)
    }

    fn set_layer_windows(&mut self, windows: &[Option<usize>]) -> Result<()> {
        KvCache::set_layer_windows(self, windows)
    }
}

/// A KV cache on the CPU or, with the `cuda` feature, on a GPU: what a sweep point creates for
/// its `--device`.
#[derive(Debug)]
pub enum AnyCache {
    /// [`KvCache`] in host memory.
    Cpu(KvCache),
    /// `cuda::CudaKvCache` in device memory.
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaKvCache),
}

impl AnyCache {
    /// An empty cache for `batch` sequences on `device`, sized for `capacity` tokens per
    /// sequence (on the CPU, room reserved by [`KvCache::reserve`]; it grows past it on
    /// demand). Errors: as [`KvCache::new`];
    /// on CUDA also a scheme without CUDA kernels and allocation failures (out of memory).
    pub fn new(
        scheme: KvScheme,
        geom: CacheGeometry,
        batch: usize,
        capacity: usize,
        device: &candle_core::Device,
    ) -> Result<Self> {
        match device {
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(_) => Ok(Self::Cuda(cuda::CudaKvCache::new(
                scheme, geom, batch, capacity, device,
            )?)),
            candle_core::Device::Cpu => {
                let mut cache = KvCache::new(scheme, geom, batch)?;
                cache.reserve(capacity);
                Ok(Self::Cpu(cache))
            }
            other => Err(Error::InvalidArgument {
                name: "--device".into(),
                reason: format!("no KV cache for {other:?} in this build"),
            }),
        }
    }

    /// With `exact`, int8 and 4-bit keys are scored in f32 after widening each row (the
    /// reference path, which quality measurements use) instead of on their codes
    /// ([`KvCache::set_exact_attention`]). The CUDA kernels always compute in f32.
    pub fn exact_attention(mut self, exact: bool) -> Self {
        #[allow(irrefutable_let_patterns)] // refutable with the cuda feature
        if let Self::Cpu(c) = &mut self {
            c.set_exact_attention(exact);
        }
        self
    }

    /// The attention interface of whichever cache this is.
    pub fn as_attention(&mut self) -> &mut dyn AttentionCache {
        match self {
            Self::Cpu(c) => c,
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c,
        }
    }

    /// Tokens sequence `b` has written.
    pub fn seen(&self, b: usize) -> usize {
        match self {
            Self::Cpu(c) => c.seen(b),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.seen(b),
        }
    }

    /// Bytes of K/V held (see [`KvCache::kv_bytes`]).
    pub fn kv_bytes(&self) -> usize {
        match self {
            Self::Cpu(c) => c.kv_bytes(),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.kv_bytes(),
        }
    }

    /// Bytes allocated (capacity; on CUDA device memory).
    pub fn reserved_bytes(&self) -> usize {
        match self {
            Self::Cpu(c) => c.reserved_bytes(),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.reserved_bytes(),
        }
    }

    /// Drops every cached token, keeping the allocations. Errors: CUDA errors.
    pub fn clear(&mut self) -> Result<()> {
        match self {
            Self::Cpu(c) => c.clear(),
            #[cfg(feature = "cuda")]
            Self::Cuda(c) => c.clear()?,
        }
        Ok(())
    }

    /// Values saturated by fixed fp8 scales (0 on CUDA, whose fp8 scales are per token).
    pub fn saturated(&self) -> u64 {
        match self {
            Self::Cpu(c) => c.saturated(),
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => 0,
        }
    }

    /// The attention kernels' time and bytes since the last call
    /// ([`KvCache::take_attention_meter`]); `None` on CUDA, whose kernels run asynchronously
    /// (timing them alone would need events around every layer's launch).
    pub fn take_attention_meter(&mut self) -> Option<AttentionMeter> {
        match self {
            Self::Cpu(c) => Some(c.take_attention_meter()),
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => None,
        }
    }
}

/// One (sequence, kv head): its K and V streams and eviction bookkeeping.
#[derive(Debug)]
struct Head {
    k: Box<dyn Stream>,
    v: Box<dyn Stream>,
    /// Absolute position of each slot (eviction schemes only).
    pos: Vec<u32>,
    /// Accumulated attention per slot (H2O only).
    score: Vec<f32>,
}

impl Head {
    fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes() + 4 * self.pos.len() + 4 * self.score.len()
    }

    fn reserved(&self) -> usize {
        self.k.reserved() + self.v.reserved() + 4 * self.pos.capacity() + 4 * self.score.capacity()
    }

    fn swap_remove(&mut self, slot: usize) {
        self.k.swap_remove(slot);
        self.v.swap_remove(slot);
        self.pos.swap_remove(slot);
        if !self.score.is_empty() {
            self.score.swap_remove(slot);
        }
    }
}

#[derive(Debug)]
struct Layer {
    /// `batch × kv_heads`, sequence-major.
    heads: Vec<Head>,
    /// Tokens each sequence has written to this layer.
    seen: Vec<usize>,
    /// Per-layer fp8 scales (K, V) when the scheme uses `scale=tensor`, once set.
    tensor_scales: [Option<f32>; 2],
}

/// A KV cache for `batch` sequences, storing every layer in one scheme.
///
/// Shapes: [`append`](Self::append) takes `[batch, kv_heads, n_new, head_dim]` f32;
/// [`attend`](Self::attend) takes queries `[batch, q_heads, n_new, head_dim]` f32. Query head `h`
/// reads kv head `h / (q_heads / kv_heads)` (grouped-query attention). Sequences may have
/// different lengths ([`stack`](Self::stack) joins separately prefilled ones).
#[derive(Debug)]
pub struct KvCache {
    scheme: KvScheme,
    geom: CacheGeometry,
    layers: Vec<Layer>,
    saturated: u64,
    exact: bool,
    /// Per-layer sliding windows ([`KvCache::set_layer_windows`]); empty: none.
    windows: Vec<Option<usize>>,
    /// Tokens per sequence each stream has room for ([`KvCache::reserve`]); 0: none.
    reserved_tokens: usize,
    /// Time and bytes of the attention kernels since the last [`KvCache::take_attention_meter`].
    meter: AttentionMeter,
}

/// What the attention kernels of a cache did between two reads
/// ([`KvCache::take_attention_meter`]): wall time inside `attention::attend` (scores, softmax
/// and P·V over the held K/V; not the query rotation or eviction around it) and the K/V stream
/// bytes those calls read (codes, scales and zero-points of every held row, once per call).
/// The "attention alone" rate of issue #24: bytes ÷ seconds, against the machine's read
/// bandwidth, says whether a format's attention is bound by memory or by its arithmetic.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttentionMeter {
    /// Seconds spent in the attention kernels.
    pub seconds: f64,
    /// K/V bytes those kernels read.
    pub bytes: u64,
    /// Calls (one per layer per forward).
    pub calls: u64,
}

impl AttentionMeter {
    /// Bytes read per second, GB/s (10⁹ bytes/s); `None` before any timed call.
    pub fn gb_s(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.bytes as f64 / self.seconds / 1e9)
    }
}

impl KvCache {
    /// An empty cache. Errors: [`Error::InvalidArgument`] for a scheme that does not fit the
    /// geometry (see [`KvScheme::validate`]) or a zero batch.
    pub fn new(scheme: KvScheme, geom: CacheGeometry, batch: usize) -> Result<Self> {
        scheme.validate(geom.head_dim)?;
        if batch == 0 {
            return Err(Error::InvalidArgument {
                name: "batch size".into(),
                reason: "must be at least 1".into(),
            });
        }
        let d = geom.head_dim;
        let layers = (0..geom.layers)
            .map(|_| Layer {
                heads: (0..batch * geom.kv_heads)
                    .map(|_| Head {
                        k: scheme.k.new_stream(d),
                        v: scheme.v.new_stream(d),
                        pos: Vec::new(),
                        score: Vec::new(),
                    })
                    .collect(),
                seen: vec![0; batch],
                tensor_scales: [None, None],
            })
            .collect();
        Ok(Self {
            scheme,
            geom,
            layers,
            saturated: 0,
            exact: true,
            windows: Vec::new(),
            reserved_tokens: 0,
            meter: AttentionMeter::default(),
        })
    }

    /// Joins single- or multi-sequence caches of the same scheme into one batch, in order
    /// (e.g. prompts of different lengths prefilled one at a time, then decoded together).
    /// Errors: [`Error::InvalidArgument`] if schemes or geometries differ or `parts` is empty.
    pub fn stack(parts: Vec<KvCache>) -> Result<Self> {
        let mut it = parts.into_iter();
        let mut first = it.next().ok_or_else(|| Error::InvalidArgument {
            name: "cache stack".into(),
            reason: "no caches given".into(),
        })?;
        for p in it {
            if p.scheme != first.scheme || p.geom != first.geom || !first.adopt_windows(&p) {
                return Err(Error::InvalidArgument {
                    name: "cache stack".into(),
                    reason: "caches must share scheme, geometry and layer windows".into(),
                });
            }
            first.saturated += p.saturated;
            for (a, b) in first.layers.iter_mut().zip(p.layers) {
                a.heads.extend(b.heads);
                a.seen.extend(b.seen);
            }
        }
        Ok(first)
    }

    /// Takes sequence `b` out of the batch as a single-sequence cache (what a serving scheduler
    /// does when a request finishes or is preempted); the sequences after it move down by one,
    /// and the batch may become empty (0 sequences: join another before any forward). Per-layer
    /// fp8 tensor scales are copied to both caches; the saturation count stays here. The inverse
    /// of [`join`](Self::join). Errors: [`Error::InvalidArgument`] when `b` is out of range.
    pub fn take(&mut self, b: usize) -> Result<KvCache> {
        if b >= self.batch() {
            return Err(Error::InvalidArgument {
                name: "cache sequence".into(),
                reason: format!("sequence {b} of a batch of {}", self.batch()),
            });
        }
        let kvh = self.geom.kv_heads;
        let layers = self
            .layers
            .iter_mut()
            .map(|l| Layer {
                heads: l.heads.drain(b * kvh..(b + 1) * kvh).collect(),
                seen: vec![l.seen.remove(b)],
                tensor_scales: l.tensor_scales,
            })
            .collect();
        Ok(KvCache {
            scheme: self.scheme,
            geom: self.geom,
            layers,
            saturated: 0,
            exact: self.exact,
            windows: self.windows.clone(),
            reserved_tokens: self.reserved_tokens,
            meter: AttentionMeter::default(),
        })
    }

    /// Appends the sequences of `other` after this batch's (a request admitted into a running
    /// batch after its own prefill), as [`stack`](Self::stack) does for two caches. Fp8 tensor
    /// scales are per layer and batch-wide: this cache's are kept where set. Errors:
    /// [`Error::InvalidArgument`] if schemes or geometries differ.
    pub fn join(&mut self, other: KvCache) -> Result<()> {
        if other.scheme != self.scheme || other.geom != self.geom || !self.adopt_windows(&other) {
            return Err(Error::InvalidArgument {
                name: "cache join".into(),
                reason: "caches must share scheme, geometry and layer windows".into(),
            });
        }
        self.saturated += other.saturated;
        for (a, b) in self.layers.iter_mut().zip(other.layers) {
            a.heads.extend(b.heads);
            a.seen.extend(b.seen);
            for (s, o) in a.tensor_scales.iter_mut().zip(b.tensor_scales) {
                if s.is_none() {
                    *s = o;
                }
            }
        }
        Ok(())
    }

    /// Scores int8 and 4-bit keys in f32 after widening each row (`true`, the default: the
    /// reference path every quality measurement uses) or on their codes with int8-quantized
    /// queries (`false`: what the sweep's decode steps and `attn-bench` are timed with; see
    /// [`intdot`] for the method and its error bound).
    pub fn set_exact_attention(&mut self, exact: bool) {
        self.exact = exact;
    }

    /// Gives layers a sliding attention window (Gemma 2/3 local layers; `windows[l] = Some(w)`,
    /// one entry per layer, or empty for none): after each [`attend`](Self::attend) on such a
    /// layer, every slot `w − 1` or more positions behind the newest token is dropped — the
    /// `window:size=w−1,sinks=0` policy ([`evict::window::Window`]) applied to that layer only,
    /// after the scheme's own eviction if it has one (so a window layer holds what both keep).
    /// Attention itself is causal over what is held: a caller attending `n` new tokens on a
    /// window layer must keep `held + n ≤ w` (one token per call once `w − 1` are held) for the
    /// mask to be exact. Positions are kept per slot on window layers (4 bytes per token, counted
    /// in [`kv_bytes`](Self::kv_bytes)).
    ///
    /// Errors: [`Error::InvalidArgument`] when the list's length is not the layer count, a
    /// window is 0, or the cache already holds tokens under other windows.
    pub fn set_layer_windows(&mut self, windows: &[Option<usize>]) -> Result<()> {
        let windows: Vec<Option<usize>> = if windows.iter().all(Option::is_none) {
            Vec::new()
        } else {
            windows.to_vec()
        };
        if windows == self.windows {
            return Ok(());
        }
        let bad = |reason: String| Error::InvalidArgument {
            name: "layer windows".into(),
            reason,
        };
        if !windows.is_empty() && windows.len() != self.layers.len() {
            return Err(bad(format!(
                "{} windows for a cache of {} layers",
                windows.len(),
                self.layers.len()
            )));
        }
        if windows.contains(&Some(0)) {
            return Err(bad("a sliding window must be at least 1 token".into()));
        }
        if !self.is_empty() {
            return Err(bad(
                "the cache already holds tokens kept under other windows; clear it first".into(),
            ));
        }
        self.windows = windows;
        self.reserve(self.reserved_tokens);
        Ok(())
    }

    /// Gives every K and V stream room for `tokens` tokens per sequence up front
    /// ([`Stream::reserve`]), as a serving engine allocates a sequence's blocks before it
    /// decodes (vLLM's block tables, llama.cpp's `n_ctx` cells), so no append up to that many
    /// reallocates and copies the cache (the first decode step after a prefill did, in every
    /// stream at once, and its time went into TPOT). Memory is reserved, not touched: resident
    /// memory grows as tokens arrive, [`reserved_bytes`](Self::reserved_bytes) counts it at
    /// once. A layer with a sliding window ([`set_layer_windows`](Self::set_layer_windows),
    /// which re-applies this) gets room for its window only; a scheme that evicts, none (it
    /// holds at most its budget and grows to it on demand). Changes no result.
    pub fn reserve(&mut self, tokens: usize) {
        self.reserved_tokens = tokens;
        if tokens == 0 || self.scheme.evicts() {
            return;
        }
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let rows = match self.windows.get(l).copied().flatten() {
                Some(w) => tokens.min(w),
                None => tokens,
            };
            for h in &mut layer.heads {
                h.k.reserve(rows);
                h.v.reserve(rows);
            }
        }
    }

    /// Whether `other`'s layer windows fit this cache's for a [`join`](Self::join) or
    /// [`stack`](Self::stack): equal, or one side has none set yet and holds no tokens (a
    /// fresh batch cache meeting a prefilled request), in which case this cache takes
    /// `other`'s.
    fn adopt_windows(&mut self, other: &KvCache) -> bool {
        if self.windows == other.windows || other.windows.is_empty() && other.is_empty() {
            return true;
        }
        if self.windows.is_empty() && self.is_empty() {
            self.windows = other.windows.clone();
            self.reserve(self.reserved_tokens);
            return true;
        }
        false
    }

    /// The sliding window of `layer` ([`Self::set_layer_windows`]), `None` when global.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }

    /// The scheme this cache stores.
    pub fn scheme(&self) -> KvScheme {
        self.scheme
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.layers[0].seen.len()
    }

    /// Tokens sequence `b` has written (its next position), after the last complete forward.
    pub fn seen(&self, b: usize) -> usize {
        self.layers[self.layers.len() - 1].seen[b]
    }

    /// Tokens held for sequence `b`, kv head `h` of `layer` (≤ seen under eviction).
    pub fn held(&self, layer: usize, b: usize, h: usize) -> usize {
        self.layers[layer].heads[b * self.geom.kv_heads + h].k.len()
    }

    /// Positions held for sequence `b`, kv head `h` of `layer`, ascending.
    pub fn held_positions(&self, layer: usize, b: usize, h: usize) -> Vec<usize> {
        let head = &self.layers[layer].heads[b * self.geom.kv_heads + h];
        let mut p: Vec<usize> = if self.scheme.evicts() || self.layer_window(layer).is_some() {
            head.pos.iter().map(|&x| x as usize).collect()
        } else {
            (0..head.k.len()).collect()
        };
        p.sort_unstable();
        p
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(|l| l.seen.iter().all(|&s| s == 0))
    }

    /// Bytes of K/V held over all layers and sequences: codes, scales, zero-points, residual
    /// rows, eviction bookkeeping and per-layer fp8 scales.
    pub fn kv_bytes(&self) -> usize {
        self.sum_bytes(Head::bytes)
    }

    /// Bytes the cache has allocated (buffer capacity, ≥ `kv_bytes`).
    pub fn reserved_bytes(&self) -> usize {
        self.sum_bytes(Head::reserved)
    }

    /// `per_head` over every (layer, sequence, kv head), plus 4 bytes per per-layer fp8 scale
    /// set.
    fn sum_bytes(&self, per_head: fn(&Head) -> usize) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.heads.iter().map(per_head).sum::<usize>()
                    + 4 * l.tensor_scales.iter().flatten().count()
            })
            .sum()
    }

    /// Values that fell outside an fp8 scale's range and were saturated, so far.
    pub fn saturated(&self) -> u64 {
        self.saturated
    }

    /// The attention kernels' time and bytes since the last call (or since the cache was made),
    /// and starts counting afresh: a sweep takes it after the prefill and again after the
    /// decode steps, so the second reading is the decode steps' attention alone.
    pub fn take_attention_meter(&mut self) -> AttentionMeter {
        std::mem::take(&mut self.meter)
    }

    /// Drops every cached token but keeps the allocations (as a serving engine reuses blocks).
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            for h in &mut l.heads {
                h.k.clear();
                h.v.clear();
                h.pos.clear();
                h.score.clear();
            }
            l.seen.iter_mut().for_each(|s| *s = 0);
            l.tensor_scales = [None, None];
        }
    }

    /// Stores `n_new` tokens of keys and values for every sequence of `layer`.
    /// `k`, `v`: `[batch, kv_heads, n_new, head_dim]` f32.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32], n_new: usize) {
        let d = self.geom.head_dim;
        let kvh = self.geom.kv_heads;
        let per_head = n_new * d;
        let rot = self.scheme.rotate.then(|| rotation_block(d));
        let rotated = |x: &[f32]| -> Vec<f32> {
            let mut x = x.to_vec();
            if let Some(b) = rot {
                hadamard(&mut x, b);
            }
            x
        };
        let (k, v) = (rotated(k), rotated(v));
        let scheme = self.scheme;
        let windowed = self.layer_window(layer).is_some();
        let l = &mut self.layers[layer];
        // Per-tensor external scales (fp8 scale=tensor): one per layer from the first write
        // (K and V apart); per-head ones come from each head's first write below.
        for (i, (q, x)) in [(scheme.k, &k), (scheme.v, &v)].into_iter().enumerate() {
            if q.external_scale() == Some(ScaleScope::Tensor) && l.tensor_scales[i].is_none() {
                l.tensor_scales[i] = Some(q.with(|f| f.calibrate(x)));
            }
        }
        let scales = l.tensor_scales;
        let store = |(bh, head): (usize, &mut Head)| {
            let (kx, vx) = (
                &k[bh * per_head..(bh + 1) * per_head],
                &v[bh * per_head..(bh + 1) * per_head],
            );
            for (i, (stream, x, q)) in [(&mut head.k, kx, scheme.k), (&mut head.v, vx, scheme.v)]
                .into_iter()
                .enumerate()
            {
                if stream.needs_scale() {
                    let s = match q.external_scale() {
                        Some(ScaleScope::Tensor) => scales[i].expect("set above"),
                        _ => q.with(|f| f.calibrate(x)),
                    };
                    stream.set_scale(s);
                }
            }
            head.k.push(kx) + head.v.push(vx)
        };
        // Decode steps append one row per head: not worth a parallel join on rayon's pool.
        let saturated: usize = if k.len() >= PARALLEL_APPEND {
            l.heads.par_iter_mut().enumerate().map(store).sum()
        } else {
            l.heads.iter_mut().enumerate().map(store).sum()
        };
        self.saturated += saturated as u64;
        if scheme.evicts() || windowed {
            for (bh, head) in l.heads.iter_mut().enumerate() {
                let start = l.seen[bh / kvh];
                head.pos.extend((start..start + n_new).map(|p| p as u32));
                if scheme.evict.is_some_and(Eviction::keeps_scores) {
                    head.score.resize(head.pos.len(), 0.0);
                }
            }
        }
        for s in &mut l.seen {
            *s += n_new;
        }
    }

    /// Causal attention of the newest `n_q` tokens of `layer` over everything held there (call
    /// after [`append`](Self::append)), then the scheme's eviction. `q`: `[batch, q_heads, n_q,
    /// head_dim]` f32, RoPE applied; returns `[batch, q_heads, n_q, head_dim]` f32.
    pub fn attend(&mut self, layer: usize, q: &[f32], n_q: usize) -> Vec<f32> {
        let g = self.geom;
        let d = g.head_dim;
        let rot = self.scheme.rotate.then(|| rotation_block(d));
        let mut qr;
        let q = match rot {
            Some(b) => {
                qr = q.to_vec();
                hadamard(&mut qr, b);
                &qr[..]
            }
            None => q,
        };
        let l = &mut self.layers[layer];
        let h2o = self.scheme.evict.is_some_and(Eviction::keeps_scores);
        let views: Vec<attention::HeadView<'_>> = l
            .heads
            .iter()
            .map(|h| attention::HeadView {
                k: h.k.as_ref(),
                v: h.v.as_ref(),
            })
            .collect();
        let read: usize = l.heads.iter().map(|h| h.k.bytes() + h.v.bytes()).sum();
        let shape = attention::AttnShape {
            batch: l.seen.len(),
            kv_heads: g.kv_heads,
            group: g.q_heads / g.kv_heads,
            n_q,
            head_dim: d,
            exact: self.exact,
        };
        let started = std::time::Instant::now();
        let attention::Attention {
            mut out,
            slot_scores,
        } = attention::attend(&views, q, shape, h2o);
        self.meter.seconds += started.elapsed().as_secs_f64();
        self.meter.bytes += read as u64;
        self.meter.calls += 1;
        drop(views);
        if let Some(b) = rot {
            hadamard(&mut out, b); // V was rotated: rotate the output back (H is an involution)
        }
        if let Some(scores) = slot_scores {
            for (h, s) in l.heads.iter_mut().zip(scores) {
                h.score.iter_mut().zip(s).for_each(|(a, b)| *a += b);
            }
        }
        if let Some(ev) = self.scheme.evict {
            for (bh, head) in l.heads.iter_mut().enumerate() {
                evict(head, ev, l.seen[bh / g.kv_heads]);
            }
        }
        if let Some(w) = self.windows.get(layer).copied().flatten() {
            let ev = Eviction::from(evict::window::Window {
                size: w - 1,
                sinks: 0,
            });
            for (bh, head) in l.heads.iter_mut().enumerate() {
                evict(head, ev, l.seen[bh / g.kv_heads]);
            }
        }
        out
    }
}

/// Hadamard block for `+rot`: 64 as llama.cpp (when head_dim is a multiple), else head_dim.
fn rotation_block(d: usize) -> usize {
    if d.is_multiple_of(64) {
        64
    } else {
        d
    }
}

/// Applies an eviction policy to one (sequence, kv head) after `seen` tokens: the policy picks
/// the victims ([`evict::Policy::victims`]), dropped here from the highest slot down.
fn evict(head: &mut Head, ev: Eviction, seen: usize) {
    let mut drop = ev.victims(&head.pos, &head.score, seen);
    drop.sort_unstable_by(|a, b| b.cmp(a));
    for s in drop {
        head.swap_remove(s);
    }
}

#[cfg(test)]
mod tests;
