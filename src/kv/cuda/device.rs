//! KV caches on a CUDA GPU (feature `cuda`): the same schemes, stored forms and eviction rules as
//! the CPU [`KvCache`](super::KvCache), written and read by our kernels in `kernels/kv_cache.cu`.
//!
//! Each layer keeps, per K and V stream, a plane of codes `[bh, cap, code_bytes]` and a plane of
//! scales/zero-points `[bh, cap, meta_bytes]` (`bh = sequence · kv_heads + kv_head`); the row
//! formats and their rounding are those of [`super::format`] (F16, int8 per token, FP8 E4M3/E5M2
//! with a per-token scale, int4 group-wise with zero-point, ggml `Q8_0`/`Q4_0`), so a row the GPU
//! wrote is byte-for-byte the row the CPU encoder writes ([`CudaKvCache::download_rows`] returns
//! it in the CPU layout for the tests). KIVI's per-channel int8 keys keep their quantized token
//! groups as codes plus per-block channel scales and the unquantized residual as an f16 ring.
//!
//! Per step: [`append`](CudaKvCache::append) quantizes on write (`kv_append`, or for KIVI keys
//! `kv_chan_quantize` + `kv_chan_resid`); [`attend`](CudaKvCache::attend) runs split-sequence
//! decode attention (`kv_attn_partial_d{64,128,256}` + `kv_attn_combine`: FlashDecoding, Dao et
//! al. 2023; online softmax, Milakov & Gimelshein 2018, arXiv 1805.02867) that dequantizes inside
//! the dot products and accumulates in f32; H2O adds each slot's attention probability to its
//! score on the GPU (`kv_h2o_scores`) and both eviction policies pick and swap-remove victims on
//! the GPU (`kv_evict`), so no step copies cache state to the host. The host only mirrors how many
//! tokens each sequence has seen and holds (a deterministic function of the scheme), to size
//! buffers and count bytes.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    sys::CUdevice_attribute, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Device, Storage, Tensor};

use super::spec::{Eviction, Fp8Kind, Fp8Scale, KvScheme, Quant};
use super::{AttentionCache, Budget, CacheGeometry};
use crate::error::{Error, Result};

/// PTX of `kernels/kv_cache.cu`, compiled by build.rs with nvcc for `sm_$CUDA_COMPUTE_CAP`.
pub const KV_CACHE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_cache.ptx"));
const MODULE: &str = "kvbench_kv_cache";
/// Query rows per attention block and warps per block (QT and WARPS in the kernel).
const QT: usize = 4;
const WARPS: u32 = 4;

/// How one K or V stream is stored on the GPU (the kernel's `fmt` codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuFormat {
    /// IEEE binary16, 2 bytes per element.
    F16,
    /// int8 codes + one f16 absmax scale per (token, kv head).
    Int8Token,
    /// FP8 codes (E4M3 when true, else E5M2) + one f16 scale per (token, kv head).
    Fp8 {
        /// E4M3 (true) or E5M2.
        e4m3: bool,
    },
    /// 4-bit codes, per group of `group` elements an f16 scale and an f16 minimum.
    Int4 {
        /// Elements per group along head_dim.
        group: usize,
    },
    /// ggml Q8_0: blocks of 32, f16 scale.
    Q8_0,
    /// ggml Q4_0: blocks of 32, f16 scale, codes offset by 8.
    Q4_0,
    /// KIVI per-channel int8 keys: token groups of `group`, `residual` f16 rows.
    Chan8 {
        /// Tokens per quantized group.
        group: usize,
        /// Newest rows kept in f16.
        residual: usize,
    },
}

impl GpuFormat {
    /// The GPU form of `q`. Errors: [`Error::InvalidArgument`] for formats the CUDA path does not
    /// implement yet (FP8 with a per-head/per-tensor/no scale, int4 per-channel keys).
    pub fn of(q: Quant) -> Result<Self> {
        Ok(match q {
            Quant::Fp16 => Self::F16,
            Quant::Int8Token => Self::Int8Token,
            Quant::Fp8 {
                kind,
                scale: Fp8Scale::Token,
            } => Self::Fp8 {
                e4m3: kind == Fp8Kind::E4M3,
            },
            Quant::Int4 { group } => Self::Int4 { group },
            Quant::Q8_0 => Self::Q8_0,
            Quant::Q4_0 => Self::Q4_0,
            Quant::Channel {
                bits: 8,
                group,
                residual,
            } => Self::Chan8 { group, residual },
            other => {
                return Err(Error::InvalidArgument {
                    name: "--dtypes".into(),
                    reason: format!(
                        "`{other}` has no CUDA kernels yet (fp8 with scale=token, int8-channel and \
                         every per-token format do); run it with --device cpu"
                    ),
                })
            }
        })
    }

    fn id(self) -> i32 {
        match self {
            Self::F16 => 0,
            Self::Int8Token => 1,
            Self::Fp8 { e4m3: true } => 2,
            Self::Fp8 { e4m3: false } => 3,
            Self::Int4 { .. } => 4,
            Self::Q8_0 => 5,
            Self::Q4_0 => 6,
            Self::Chan8 { .. } => 7,
        }
    }

    /// `(blocks per row, meta bytes per block, code bytes per block)`: the CPU row layout is
    /// the concatenation over blocks of (meta, codes); the GPU keeps the two in separate planes.
    fn blocks(self, d: usize) -> (usize, usize, usize) {
        match self {
            Self::F16 => (1, 0, 2 * d),
            Self::Int8Token | Self::Fp8 { .. } => (1, 2, d),
            Self::Int4 { group } => (d / group, 4, group / 2),
            Self::Q8_0 => (d / 32, 2, 32),
            Self::Q4_0 => (d / 32, 2, 16),
            Self::Chan8 { .. } => (1, 0, d),
        }
    }

    fn code_bytes(self, d: usize) -> usize {
        let (n, _, c) = self.blocks(d);
        n * c
    }

    fn meta_bytes(self, d: usize) -> usize {
        let (n, m, _) = self.blocks(d);
        n * m
    }

    /// Token group of KIVI keys (1 for per-token formats): capacities are multiples of it.
    fn token_group(self) -> usize {
        match self {
            Self::Chan8 { group, .. } => group,
            _ => 1,
        }
    }
}

/// Launches kernel `$name` of kv_cache.cu with grid `$grid`, `$block` threads and arguments.
macro_rules! launch {
    ($cache:expr, $name:expr, $grid:expr, $block:expr, [$($a:expr),* $(,)?]) => {{
        let name: &str = $name;
        let f = $cache.dev.get_or_load_custom_func(name, MODULE, KV_CACHE_PTX)?;
        let mut b = f.builder();
        $( b.arg($a); )*
        let cfg = LaunchConfig { grid_dim: $grid, block_dim: ($block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: argument lists match the kernels' signatures in kernels/kv_cache.cu, and every
        // buffer is sized from the same geometry the kernels index with.
        unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(name, e))?;
    }};
}

/// The kernel's `Stream` struct (field order and types must match kernels/kv_cache.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StreamArgs {
    codes: u64,
    meta: u64,
    resid: u64,
    chan_scales: u64,
    fmt: i32,
    group: i32,
    residual: i32,
    code_bytes: i32,
    meta_bytes: i32,
    cap: i32,
}

// SAFETY: plain old data with the C layout the kernel expects.
unsafe impl DeviceRepr for StreamArgs {}

/// One K or V stream of one layer.
struct Plane {
    fmt: GpuFormat,
    codes: CudaSlice<u8>,
    meta: CudaSlice<u8>,
    /// KIVI: f16 ring `[bh, residual + group, d]` and block scales `[bh, cap / group, d]`.
    resid: Option<CudaSlice<u16>>,
    chan_scales: Option<CudaSlice<u16>>,
}

struct Layer {
    k: Plane,
    v: Plane,
    /// Absolute position per slot `[bh, cap]` (eviction schemes).
    pos: Option<CudaSlice<u32>>,
    /// Accumulated attention per slot `[bh, cap]` (H2O).
    score: Option<CudaSlice<f32>>,
    /// Rows held per bh.
    lens: CudaSlice<u32>,
}

/// A KV cache for `batch` sequences on one CUDA device (see the module docs).
///
/// Shapes: [`append`](Self::append) takes K and V `[batch, kv_heads, n_new, head_dim]` f32 on
/// the cache's device; [`attend`](Self::attend) takes queries `[batch, q_heads, n_q, head_dim]`
/// f32 and returns the same shape. `head_dim` must be 64, 128 or 256.
pub struct CudaKvCache {
    scheme: KvScheme,
    geom: CacheGeometry,
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    batch: usize,
    /// Rows allocated per bh (a multiple of the KIVI token group).
    cap: usize,
    layers: Vec<Layer>,
    /// Tokens each sequence has seen, on the device and mirrored here.
    seen_dev: CudaSlice<u32>,
    seen: Vec<usize>,
    /// Rows held per sequence (same for every layer and kv head), mirrored from the scheme.
    held: Vec<usize>,
    /// Tokens of the forward in progress (appended to layer 0, not yet counted as seen).
    pending: usize,
    /// Fill attention outputs with NaN before the kernels run (tests: every element written).
    poison: bool,
    sms: usize,
}

impl std::fmt::Debug for CudaKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKvCache")
            .field("scheme", &self.scheme.to_string())
            .field("batch", &self.batch)
            .field("cap", &self.cap)
            .finish()
    }
}

fn args(p: &Plane, cap: usize, d: usize, stream: &CudaStream) -> StreamArgs {
    let ptr = |s: &CudaSlice<u8>| s.device_ptr(stream).0;
    let ptr16 = |s: &Option<CudaSlice<u16>>| s.as_ref().map_or(0, |s| s.device_ptr(stream).0);
    let (group, residual) = match p.fmt {
        GpuFormat::Int4 { group } => (group, 0),
        GpuFormat::Chan8 { group, residual } => (group, residual),
        _ => (0, 0),
    };
    StreamArgs {
        codes: ptr(&p.codes),
        meta: ptr(&p.meta),
        resid: ptr16(&p.resid),
        chan_scales: ptr16(&p.chan_scales),
        fmt: p.fmt.id(),
        group: group as i32,
        residual: residual as i32,
        code_bytes: p.fmt.code_bytes(d) as i32,
        meta_bytes: p.fmt.meta_bytes(d) as i32,
        cap: cap as i32,
    }
}

impl CudaKvCache {
    /// An empty cache with room for `capacity` tokens per sequence before it grows.
    ///
    /// Errors: [`Error::InvalidArgument`] when `device` is not CUDA, the scheme has no CUDA form
    /// (see [`GpuFormat::of`]; `+rot` and fp8 scales other than per-token), `head_dim` is not
    /// 64/128/256, or the batch is 0; a CUDA error (out of memory included) from allocation.
    pub fn new(
        scheme: KvScheme,
        geom: CacheGeometry,
        batch: usize,
        capacity: usize,
        device: &Device,
    ) -> Result<Self> {
        scheme.validate(geom.head_dim)?;
        let Device::Cuda(dev) = device else {
            return Err(Error::InvalidArgument {
                name: "device".into(),
                reason: "a CUDA KV cache needs a CUDA device (--device cuda:N)".into(),
            });
        };
        if scheme.rotate {
            return Err(Error::InvalidArgument {
                name: "--dtypes".into(),
                reason: format!("`{scheme}`: +rot has no CUDA kernels yet; use --device cpu"),
            });
        }
        if ![64, 128, 256].contains(&geom.head_dim) {
            return Err(Error::InvalidArgument {
                name: "model".into(),
                reason: format!(
                    "head_dim {} has no CUDA attention kernel (64, 128 and 256 do); use --device cpu",
                    geom.head_dim
                ),
            });
        }
        if batch == 0 {
            return Err(Error::InvalidArgument {
                name: "batch size".into(),
                reason: "must be at least 1".into(),
            });
        }
        let (kf, vf) = (GpuFormat::of(scheme.k)?, GpuFormat::of(scheme.v)?);
        let stream = dev.cuda_stream();
        let sms = stream
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_or(132, |n| n.max(1) as usize);
        let mut cache = Self {
            scheme,
            geom,
            dev: dev.clone(),
            stream: stream.clone(),
            batch,
            cap: 0,
            layers: Vec::new(),
            seen_dev: stream
                .alloc_zeros::<u32>(batch)
                .map_err(|e| Error::cuda("alloc", e))?,
            seen: vec![0; batch],
            held: vec![0; batch],
            pending: 0,
            poison: false,
            sms,
        };
        let cap = cache.round_cap(capacity.max(64));
        for _ in 0..geom.layers {
            let l = Layer {
                k: cache.plane(kf, cap)?,
                v: cache.plane(vf, cap)?,
                pos: cache.alloc_opt::<u32>(scheme.evicts(), cap)?,
                score: cache
                    .alloc_opt::<f32>(matches!(scheme.evict, Some(Eviction::H2o { .. })), cap)?,
                lens: cache.zeros::<u32>(cache.bhs())?,
            };
            cache.layers.push(l);
        }
        cache.cap = cap;
        Ok(cache)
    }

    fn bhs(&self) -> usize {
        self.batch * self.geom.kv_heads
    }

    fn round_cap(&self, n: usize) -> usize {
        let g = GpuFormat::of(self.scheme.k)
            .map(GpuFormat::token_group)
            .unwrap_or(1);
        n.div_ceil(g) * g
    }

    fn zeros<T: DeviceRepr + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| Error::cuda("alloc", e))
    }

    fn alloc_opt<T: DeviceRepr + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits>(
        &self,
        on: bool,
        cap: usize,
    ) -> Result<Option<CudaSlice<T>>> {
        on.then(|| self.zeros::<T>(self.bhs() * cap)).transpose()
    }

    fn plane(&self, fmt: GpuFormat, cap: usize) -> Result<Plane> {
        let (d, bhs) = (self.geom.head_dim, self.bhs());
        let (resid, chan_scales) = match fmt {
            GpuFormat::Chan8 { group, residual } => (
                Some(self.zeros::<u16>(bhs * (residual + group) * d)?),
                Some(self.zeros::<u16>(bhs * (cap / group) * d)?),
            ),
            _ => (None, None),
        };
        Ok(Plane {
            fmt,
            codes: self.zeros::<u8>(bhs * cap * fmt.code_bytes(d))?,
            meta: self.zeros::<u8>(bhs * cap * fmt.meta_bytes(d))?,
            resid,
            chan_scales,
        })
    }

    /// Grows every layer to hold at least `need` rows per bh, copying the held rows.
    fn grow(&mut self, need: usize) -> Result<()> {
        if need <= self.cap {
            return Ok(());
        }
        let new_cap = self.round_cap(need.max(2 * self.cap));
        let (old_cap, d, bhs) = (self.cap, self.geom.head_dim, self.bhs());
        let held: Vec<usize> = (0..bhs)
            .map(|bh| self.held[bh / self.geom.kv_heads])
            .collect();
        let mut layers = std::mem::take(&mut self.layers);
        for l in &mut layers {
            for p in [&mut l.k, &mut l.v] {
                let mut fresh = self.plane(p.fmt, new_cap)?;
                let (cb, mb) = (p.fmt.code_bytes(d), p.fmt.meta_bytes(d));
                for (bh, &n) in held.iter().enumerate() {
                    self.copy_rows(&p.codes, &mut fresh.codes, bh, old_cap, new_cap, n, cb)?;
                    self.copy_rows(&p.meta, &mut fresh.meta, bh, old_cap, new_cap, n, mb)?;
                    if let (Some(a), Some(b), GpuFormat::Chan8 { group, .. }) =
                        (&p.chan_scales, &mut fresh.chan_scales, p.fmt)
                    {
                        self.copy_rows(a, b, bh, old_cap / group, new_cap / group, n / group, d)?;
                    }
                }
                // The KIVI residual ring has a fixed size: keep it.
                fresh.resid = p.resid.take();
                *p = fresh;
            }
            if let Some(pos) = &mut l.pos {
                let mut fresh = self.zeros::<u32>(bhs * new_cap)?;
                for (bh, &n) in held.iter().enumerate() {
                    self.copy_rows(pos, &mut fresh, bh, old_cap, new_cap, n, 1)?;
                }
                *pos = fresh;
            }
            if let Some(score) = &mut l.score {
                let mut fresh = self.zeros::<f32>(bhs * new_cap)?;
                for (bh, &n) in held.iter().enumerate() {
                    self.copy_rows(score, &mut fresh, bh, old_cap, new_cap, n, 1)?;
                }
                *score = fresh;
            }
        }
        self.layers = layers;
        self.cap = new_cap;
        Ok(())
    }

    /// Copies rows `0..n` of head `bh` (`per_row` elements each) between two capacities.
    #[allow(clippy::too_many_arguments)]
    fn copy_rows<T: DeviceRepr>(
        &self,
        from: &CudaSlice<T>,
        to: &mut CudaSlice<T>,
        bh: usize,
        from_cap: usize,
        to_cap: usize,
        n: usize,
        per_row: usize,
    ) -> Result<()> {
        if n == 0 || per_row == 0 {
            return Ok(());
        }
        let src = from.slice(bh * from_cap * per_row..(bh * from_cap + n) * per_row);
        let mut dst = to.slice_mut(bh * to_cap * per_row..(bh * to_cap + n) * per_row);
        self.stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| Error::cuda("copy", e))
    }

    /// Counts the pending forward's tokens as seen (on the device too) and updates the held
    /// counts: after eviction (`evicted`) the scheme's cap, else every token is still held.
    fn finish_forward(&mut self, evicted: bool) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        let (batch_i, n) = (self.batch as i32, self.pending as i32);
        launch!(
            self,
            "kv_advance_seen",
            ((self.batch as u32).div_ceil(128), 1, 1),
            128,
            [&self.seen_dev, &batch_i, &n]
        );
        for b in 0..self.batch {
            self.seen[b] += self.pending;
            self.held[b] = if evicted {
                self.scheme.held_tokens(self.seen[b])
            } else {
                self.held[b] + self.pending
            };
        }
        self.pending = 0;
        Ok(())
    }

    /// Drops every cached token but keeps the allocations (as [`super::KvCache::clear`]).
    /// Errors: CUDA errors.
    pub fn clear(&mut self) -> Result<()> {
        for l in &mut self.layers {
            self.stream
                .memset_zeros(&mut l.lens)
                .map_err(|e| Error::cuda("memset", e))?;
        }
        self.stream
            .memset_zeros(&mut self.seen_dev)
            .map_err(|e| Error::cuda("memset", e))?;
        self.seen.iter_mut().for_each(|s| *s = 0);
        self.held.iter_mut().for_each(|s| *s = 0);
        self.pending = 0;
        Ok(())
    }

    /// Fills attention outputs with NaN before the kernels run, so a test can prove every
    /// element was written.
    pub fn poison_outputs(&mut self, on: bool) {
        self.poison = on;
    }

    /// The scheme this cache stores.
    pub fn scheme(&self) -> KvScheme {
        self.scheme
    }

    /// Tokens sequence `b` has written (its next position), counting a forward whose last
    /// layer has not attended yet.
    pub fn seen(&self, b: usize) -> usize {
        self.seen[b] + self.pending
    }

    /// Tokens held per kv head of sequence `b` (≤ seen under eviction).
    pub fn held(&self, b: usize) -> usize {
        self.held[b]
    }

    /// Bytes of K/V held: the same accounting as [`KvScheme::bytes_for_held`] (codes, scales,
    /// zero-points, KIVI residual rows, eviction bookkeeping), per sequence at its held count.
    pub fn kv_bytes(&self) -> usize {
        self.held
            .iter()
            .map(|&h| self.scheme.bytes_for_held(&self.geom, 1, h))
            .sum()
    }

    /// Bytes of device memory the cache has allocated (capacity, fixed rings and bookkeeping).
    pub fn reserved_bytes(&self) -> usize {
        let p = |p: &Plane| {
            p.codes.num_bytes()
                + p.meta.num_bytes()
                + p.resid.as_ref().map_or(0, |s| s.num_bytes())
                + p.chan_scales.as_ref().map_or(0, |s| s.num_bytes())
        };
        self.layers
            .iter()
            .map(|l| {
                p(&l.k)
                    + p(&l.v)
                    + l.pos.as_ref().map_or(0, |s| s.num_bytes())
                    + l.score.as_ref().map_or(0, |s| s.num_bytes())
                    + l.lens.num_bytes()
            })
            .sum::<usize>()
            + self.seen_dev.num_bytes()
    }

    /// Appends `[batch, kv_heads, n_new, head_dim]` f32 keys and values to `layer`
    /// (quantize on write). Errors: tensors not on this device / not f32 / wrong shape
    /// ([`Error::InvalidArgument`]); CUDA errors (out of memory when the cache grows).
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let g = self.geom;
        let dims = k.dims4()?;
        let n_new = dims.2;
        if dims != (self.batch, g.kv_heads, n_new, g.head_dim) || v.dims4()? != dims {
            return Err(Error::InvalidArgument {
                name: "K/V".into(),
                reason: format!(
                    "expected [{}, {}, n, {}], got {:?} and {:?}",
                    self.batch,
                    g.kv_heads,
                    g.head_dim,
                    k.dims(),
                    v.dims()
                ),
            });
        }
        if layer == 0 {
            // A forward whose last layer ran no attention (prefill without eviction) ends here.
            self.finish_forward(false)?;
            let need = self.held.iter().max().copied().unwrap_or(0) + n_new;
            self.grow(need)?;
            self.pending = n_new;
        }
        let (k, v) = (k.contiguous()?, v.contiguous()?);
        let (bhs, d, cap) = (self.bhs(), g.head_dim, self.cap);
        let stream = self.stream.clone();
        with_f32(&k, |kx| {
            with_f32(&v, |vx| {
                let l = &self.layers[layer];
                for (p, x) in [(&l.k, kx), (&l.v, vx)] {
                    let sa = args(p, cap, d, &stream);
                    let (n, d_i) = (n_new as i32, d as i32);
                    if let GpuFormat::Chan8 { group, .. } = p.fmt {
                        let groups = (n_new / group + 2) as u32;
                        launch!(
                            self,
                            "kv_chan_quantize",
                            (groups, bhs as u32, 1),
                            d as u32,
                            [&sa, x, &l.lens, &n, &d_i]
                        );
                        launch!(
                            self,
                            "kv_chan_resid",
                            (n_new as u32, bhs as u32, 1),
                            128,
                            [&sa, x, &l.lens, &n, &d_i]
                        );
                    } else {
                        launch!(
                            self,
                            "kv_append",
                            (n_new as u32, bhs as u32, 1),
                            32,
                            [&sa, x, &l.lens, &n, &d_i]
                        );
                    }
                }
                Ok(())
            })
        })?;
        let l = &self.layers[layer];
        let pos = l.pos.as_ref().map_or(0, |s| s.device_ptr(&stream).0);
        let score = l.score.as_ref().map_or(0, |s| s.device_ptr(&stream).0);
        let (cap_i, kvh, bhs_i, n) = (cap as i32, g.kv_heads as i32, bhs as i32, n_new as i32);
        launch!(
            self,
            "kv_advance",
            ((bhs as u32).div_ceil(128), 1, 1),
            128,
            [
                &l.lens,
                &self.seen_dev,
                &pos,
                &score,
                &cap_i,
                &kvh,
                &bhs_i,
                &n
            ]
        );
        Ok(())
    }

    /// Causal attention of `q` (`[batch, q_heads, n_q, head_dim]` f32) over everything `layer`
    /// holds, then the scheme's eviction; returns `[batch, q_heads, n_q, head_dim]` f32 on the
    /// device. After the last layer the cache counts the `n_q` tokens as seen.
    /// Errors: as [`append`](Self::append).
    pub fn attend(&mut self, layer: usize, q: &Tensor) -> Result<Tensor> {
        let g = self.geom;
        let (b, hq, n_q, d) = q.dims4()?;
        if (b, hq, d) != (self.batch, g.q_heads, g.head_dim) {
            return Err(Error::InvalidArgument {
                name: "queries".into(),
                reason: format!(
                    "expected [{}, {}, n, {}], got {:?}",
                    self.batch,
                    g.q_heads,
                    g.head_dim,
                    q.dims()
                ),
            });
        }
        let q = q.contiguous()?;
        let group = g.q_heads / g.kv_heads;
        let rows = group * n_q;
        let bhs = self.bhs();
        let cap = self.cap;
        // Longest held (before eviction) decides the split: enough blocks for two waves.
        let len = self.held.iter().max().copied().unwrap_or(0) + self.pending;
        let qtiles = rows.div_ceil(QT);
        let splits = (2 * self.sms)
            .div_ceil(bhs * qtiles)
            .clamp(1, len.div_ceil(256).max(1));
        let chunk = len.div_ceil(splits);
        let h2o = matches!(self.scheme.evict, Some(Eviction::H2o { .. }));
        let stream = self.stream.clone();
        let alloc = |n: usize| -> Result<CudaSlice<f32>> {
            if self.poison {
                stream
                    .clone_htod(&vec![f32::NAN; n])
                    .map_err(|e| Error::cuda("alloc", e))
            } else {
                // SAFETY: every element is written by the kernels before it is read (the
                // poisoned test mode proves it).
                unsafe { stream.alloc::<f32>(n.max(1)) }.map_err(|e| Error::cuda("alloc", e))
            }
        };
        let part_o = alloc(splits * bhs * rows * d)?;
        let part_ml = alloc(splits * bhs * rows * 2)?;
        let out = alloc(b * hq * n_q * d)?;
        let logits = if h2o {
            Some(alloc(bhs * rows * cap)?)
        } else {
            None
        };
        let ml = if h2o {
            Some(alloc(bhs * rows * 2)?)
        } else {
            None
        };
        let scale = 1.0 / (d as f32).sqrt();
        let l = &self.layers[layer];
        let (ka, va) = (args(&l.k, cap, d, &stream), args(&l.v, cap, d, &stream));
        let (kvh, grp, nq_i, chunk_i) = (g.kv_heads as i32, group as i32, n_q as i32, chunk as i32);
        let logits_ptr = logits.as_ref().map_or(0, |s| s.device_ptr(&stream).0);
        with_f32(&q, |qx| {
            launch!(
                self,
                &format!("kv_attn_partial_d{d}"),
                (splits as u32, bhs as u32, qtiles as u32),
                WARPS * 32,
                [
                    qx,
                    &ka,
                    &va,
                    &l.lens,
                    &kvh,
                    &grp,
                    &nq_i,
                    &scale,
                    &chunk_i,
                    &part_o,
                    &part_ml,
                    &logits_ptr
                ]
            );
            Ok(())
        })?;
        let (splits_i, d_i) = (splits as i32, d as i32);
        let ml_ptr = ml.as_ref().map_or(0, |s| s.device_ptr(&stream).0);
        launch!(
            self,
            "kv_attn_combine",
            (rows as u32, bhs as u32, 1),
            d as u32,
            [&part_o, &part_ml, &splits_i, &kvh, &grp, &nq_i, &d_i, &out, &ml_ptr]
        );
        if let (Some(logits), Some(ml), Some(score)) = (&logits, &ml, &l.score) {
            let (rows_i, cap_i) = (rows as i32, cap as i32);
            launch!(
                self,
                "kv_h2o_scores",
                ((cap as u32).div_ceil(256), bhs as u32, 1),
                256,
                [logits, ml, &l.lens, &rows_i, &cap_i, score]
            );
        }
        if let Some(ev) = self.scheme.evict {
            let (mode, size, sinks, budget, ratio, recent) = match ev {
                Eviction::Window { size, sinks } => (0i32, size as i32, sinks as i32, 0, 0f32, 0),
                Eviction::H2o { budget, recent } => {
                    let (t, r) = match budget {
                        Budget::Tokens(n) => (n as i32, 0f32),
                        Budget::Ratio(r) => (0, r),
                    };
                    (1, 0, 0, t, r, recent as i32)
                }
            };
            let score_ptr = l.score.as_ref().map_or(0, |s| s.device_ptr(&stream).0);
            let pos = l.pos.as_ref().expect("eviction schemes keep positions");
            launch!(
                self,
                "kv_evict",
                (bhs as u32, 1, 1),
                256,
                [
                    &ka,
                    &va,
                    pos,
                    &score_ptr,
                    &l.lens,
                    &self.seen_dev,
                    &kvh,
                    &mode,
                    &size,
                    &sinks,
                    &budget,
                    &ratio,
                    &recent,
                    &nq_i
                ]
            );
        }
        if layer + 1 == g.layers {
            self.finish_forward(self.scheme.evicts())?;
        }
        let shape = (b, hq, n_q, d);
        Ok(Tensor::from_storage(
            Storage::Cuda(CudaStorage::wrap_cuda_slice(out, self.dev.clone())),
            shape,
            BackpropOp::none(),
            false,
        ))
    }

    /// The rows held for (sequence `b`, kv head `h`) of `layer`, K (`value = false`) or V, each
    /// in the CPU row layout of [`super::format`] (per block: scales/zero-point, then codes), in
    /// slot order; with their absolute positions for eviction schemes (else `0..held`).
    /// For tests. Errors: KIVI keys (no per-row layout), CUDA copy errors.
    pub fn download_rows(
        &self,
        layer: usize,
        b: usize,
        h: usize,
        value: bool,
    ) -> Result<(Vec<Vec<u8>>, Vec<usize>)> {
        let l = &self.layers[layer];
        let p = if value { &l.v } else { &l.k };
        if matches!(p.fmt, GpuFormat::Chan8 { .. }) {
            return Err(Error::InvalidArgument {
                name: "download_rows".into(),
                reason: "per-channel keys have no per-row layout".into(),
            });
        }
        let d = self.geom.head_dim;
        let bh = b * self.geom.kv_heads + h;
        let n = self.held[b];
        let lens: Vec<u32> = self
            .stream
            .clone_dtoh(&l.lens)
            .map_err(|e| Error::cuda("copy", e))?;
        if lens[bh] as usize != n {
            return Err(Error::InvalidArgument {
                name: "download_rows".into(),
                reason: format!("device holds {} rows, host expects {n}", lens[bh]),
            });
        }
        let (cb, mb) = (p.fmt.code_bytes(d), p.fmt.meta_bytes(d));
        let get = |s: &CudaSlice<u8>, per: usize| -> Result<Vec<u8>> {
            if per == 0 {
                return Ok(Vec::new());
            }
            let v: CudaView<'_, u8> = s.slice(bh * self.cap * per..(bh * self.cap + n) * per);
            self.stream.clone_dtoh(&v).map_err(|e| Error::cuda("copy", e))
        };
        let (codes, meta) = (get(&p.codes, cb)?, get(&p.meta, mb)?);
        let (nb, bm, bc) = p.fmt.blocks(d);
        let rows = (0..n)
            .map(|t| {
                let mut r = Vec::with_capacity(cb + mb);
                for k in 0..nb {
                    r.extend_from_slice(&meta[t * mb + k * bm..][..bm]);
                    r.extend_from_slice(&codes[t * cb + k * bc..][..bc]);
                }
                r
            })
            .collect();
        let pos = match &l.pos {
            Some(pos) => {
                let v = pos.slice(bh * self.cap..bh * self.cap + n);
                let p: Vec<u32> = self
                    .stream
                    .clone_dtoh(&v)
                    .map_err(|e| Error::cuda("copy", e))?;
                p.into_iter().map(|x| x as usize).collect()
            }
            None => (0..n).collect(),
        };
        Ok((rows, pos))
    }
}

/// Runs `f` on the f32 device buffer of contiguous tensor `t` (from its start offset).
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&CudaView<'_, f32>) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        return Err(Error::InvalidArgument {
            name: "tensor".into(),
            reason: format!("expected a CUDA tensor, got one on {:?}", t.device()),
        });
    };
    let s = cs.as_cuda_slice::<f32>()?;
    let v = s.slice(layout.start_offset()..layout.start_offset() + t.elem_count());
    f(&v)
}

impl AttentionCache for CudaKvCache {
    fn seen(&self, b: usize) -> usize {
        CudaKvCache::seen(self, b)
    }

    fn append_tensors(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.append(layer, k, v)
    }

    fn attend_tensor(&mut self, layer: usize, q: &Tensor) -> Result<Tensor> {
        self.attend(layer, q)
    }
}
