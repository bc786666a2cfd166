//! KV caches on a CUDA GPU (feature `cuda`): the same schemes, stored forms and eviction rules as
//! the CPU [`KvCache`](crate::kv::KvCache), written and read by our kernels in
//! `kernels/kv_cache.cu`.
//!
//! This file only executes: every allocation, copy and launch comes from the pure
//! [`Planner`](super::plan::Planner) (capacity growth, split-K splits, grid sizes, argument
//! packing, host mirror), which the CPU emulator executes too. Each layer keeps, per K and V
//! stream, a plane of codes `[bh, cap, code_bytes]` and a plane of scales/zero-points
//! `[bh, cap, meta_bytes]` (`bh = sequence · kv_heads + kv_head`); the row formats and their
//! rounding are those of [`crate::kv::formats`], so a row the GPU wrote is byte-for-byte the row
//! the CPU encoder writes ([`CudaKvCache::download_rows`] returns it in the CPU layout for the
//! tests). KIVI's per-channel int8 keys keep their quantized token groups as codes plus
//! per-block channel scales and the unquantized residual as an f16 ring.
//!
//! Per step: [`append`](CudaKvCache::append) quantizes on write (`kv_append`, or for KIVI keys
//! `kv_chan_quantize` + `kv_chan_resid`); [`attend`](CudaKvCache::attend) runs split-sequence
//! decode attention (`kv_attn_partial_d{64,128,256}` + `kv_attn_combine`: FlashDecoding, Dao et
//! al. 2023; online softmax, Milakov & Gimelshein 2018, arXiv 1805.02867) that dequantizes inside
//! the dot products and accumulates in f32; H2O adds each slot's attention probability to its
//! score on the GPU (`kv_h2o_scores`) and both eviction policies pick and swap-remove victims on
//! the GPU (`kv_evict`), so no step copies cache state to the host.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    sys::CUdevice_attribute, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg,
};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Device, Storage, Tensor};

use super::plan::{self, Arg, Buf, Fill, Kind, Planner, Step, StreamArg};
use crate::error::{Error, Result};
use crate::kv::contract::AttentionCache;
use crate::kv::scheme::{CacheGeometry, KvScheme};

/// PTX of `kernels/kv_cache.cu`, compiled by build.rs with nvcc for `sm_$CUDA_COMPUTE_CAP`.
pub const KV_CACHE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_cache.ptx"));
const MODULE: &str = "kvbench_kv_cache";

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

/// One device buffer, typed as the plan's [`Kind::elem_bytes`] says.
enum DevBuf {
    U8(CudaSlice<u8>),
    U16(CudaSlice<u16>),
    U32(CudaSlice<u32>),
    F32(CudaSlice<f32>),
}

/// Runs `$body` with `$s` bound to the typed slice of `$buf`.
macro_rules! typed {
    ($buf:expr, |$s:ident| $body:expr) => {
        match $buf {
            DevBuf::U8($s) => $body,
            DevBuf::U16($s) => $body,
            DevBuf::U32($s) => $body,
            DevBuf::F32($s) => $body,
        }
    };
}

impl DevBuf {
    fn ptr(&self, stream: &CudaStream) -> u64 {
        typed!(self, |s| s.device_ptr(stream).0)
    }

    fn num_bytes(&self) -> usize {
        typed!(self, |s| s.num_bytes())
    }
}

/// A kernel argument ready to push.
enum Val {
    U64(u64),
    I32(i32),
    F32(f32),
    Stream(StreamArgs),
}

/// A KV cache for `batch` sequences on one CUDA device (see the module docs).
///
/// Shapes: [`append`](Self::append) takes K and V `[batch, kv_heads, n_new, head_dim]` f32 on
/// the cache's device; [`attend`](Self::attend) takes queries `[batch, q_heads, n_q, head_dim]`
/// f32 and returns the same shape. `head_dim` must be 64, 128 or 256.
pub struct CudaKvCache {
    plan: Planner,
    geom: CacheGeometry,
    batch: usize,
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    bufs: HashMap<Buf, DevBuf>,
    /// Each kernel looked up once (candle's lookup calls `cuModuleGetFunction` every time).
    funcs: HashMap<String, CudaFunction>,
}

impl std::fmt::Debug for CudaKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKvCache")
            .field("scheme", &self.plan.scheme().to_string())
            .field("batch", &self.batch)
            .field("cap", &self.plan.cap())
            .finish()
    }
}

/// The f32 device pointer of contiguous tensor `t` (from its start offset). `t` must outlive
/// the launches that use it.
fn f32_ptr(t: &Tensor, stream: &CudaStream) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        return Err(Error::InvalidArgument {
            name: "tensor".into(),
            reason: format!("expected a CUDA tensor, got one on {:?}", t.device()),
        });
    };
    let s = cs.as_cuda_slice::<f32>()?;
    let v = s.slice(layout.start_offset()..layout.start_offset() + t.elem_count());
    let p = v.device_ptr(stream).0;
    Ok(p)
}

impl CudaKvCache {
    /// An empty cache with room for `capacity` tokens per sequence before it grows.
    ///
    /// Errors: [`Error::InvalidArgument`] when `device` is not CUDA or the scheme has no CUDA
    /// form ([`Planner::new`]: `+rot`, fp8 scales other than per-token, int4 per-channel keys,
    /// head_dim not 64/128/256, batch 0); a CUDA error (out of memory included) from allocation.
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
        let stream = dev.cuda_stream();
        let sms = stream
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_or(132, |n| n.max(1) as usize);
        let (mut plan, steps) = Planner::new(scheme, geom, batch, capacity, sms)?;
        if let Some(n) = split_override("KVBENCH_CUDA_BLOCKS_PER_SM", 64, plan::BLOCKS_PER_SM)? {
            plan.set_blocks_per_sm(n);
        }
        if let Some(n) = split_override("KVBENCH_CUDA_SPLIT_TOKENS", 65_536, plan::SPLIT_TOKENS)? {
            plan.set_split_tokens(n);
        }
        let mut cache = Self {
            plan,
            geom,
            batch,
            dev: dev.clone(),
            stream,
            bufs: HashMap::new(),
            funcs: HashMap::new(),
        };
        cache.run(&steps, &[])?;
        Ok(cache)
    }

    fn alloc(&self, kind: Kind, count: usize, fill: Fill) -> Result<DevBuf> {
        let s = &self.stream;
        let e = |e| Error::cuda("alloc", e);
        Ok(match (kind.elem_bytes(), fill) {
            (_, Fill::Nan) => DevBuf::F32(s.clone_htod(&vec![f32::NAN; count]).map_err(e)?),
            (1, Fill::Zero) => DevBuf::U8(s.alloc_zeros::<u8>(count).map_err(e)?),
            (2, Fill::Zero) => DevBuf::U16(s.alloc_zeros::<u16>(count).map_err(e)?),
            (_, Fill::Zero) if kind_is_f32(kind) => {
                DevBuf::F32(s.alloc_zeros::<f32>(count).map_err(e)?)
            }
            (_, Fill::Zero) => DevBuf::U32(s.alloc_zeros::<u32>(count).map_err(e)?),
            // SAFETY: the plan writes every element of an uninitialized buffer before any
            // kernel reads it (the poisoned test mode, Fill::Nan, proves it).
            (_, Fill::Uninit) => DevBuf::F32(unsafe { s.alloc::<f32>(count) }.map_err(e)?),
        })
    }

    fn buf(&self, b: Buf) -> Result<&DevBuf> {
        self.bufs.get(&b).ok_or_else(|| Error::InvalidArgument {
            name: "CUDA launch plan".into(),
            reason: format!("buffer {b} used before it is allocated"),
        })
    }

    fn ptr(&self, b: Option<Buf>, inputs: &[(Kind, u64)]) -> Result<u64> {
        let Some(b) = b else { return Ok(0) };
        if let Some((_, p)) = inputs.iter().find(|(k, _)| *k == b.kind) {
            return Ok(*p);
        }
        Ok(self.buf(b)?.ptr(&self.stream))
    }

    fn stream_args(&self, a: &StreamArg) -> Result<StreamArgs> {
        Ok(StreamArgs {
            codes: self.ptr(Some(a.codes), &[])?,
            meta: self.ptr(Some(a.meta), &[])?,
            resid: self.ptr(a.resid, &[])?,
            chan_scales: self.ptr(a.chan_scales, &[])?,
            fmt: a.fmt,
            group: a.group,
            residual: a.residual,
            code_bytes: a.code_bytes,
            meta_bytes: a.meta_bytes,
            cap: a.cap,
        })
    }

    /// Executes plan steps; `inputs`: device pointers of the caller's tensors by kind. Returns
    /// the buffer an [`Step::Output`] handed over, if any.
    fn run(&mut self, steps: &[Step], inputs: &[(Kind, u64)]) -> Result<Option<CudaSlice<f32>>> {
        let mut output = None;
        for step in steps {
            match step {
                Step::Alloc { buf, count, fill } => {
                    let b = self.alloc(buf.kind, *count, *fill)?;
                    self.bufs.insert(*buf, b);
                }
                Step::Copy {
                    src,
                    dst,
                    src_off,
                    dst_off,
                    bytes,
                } => {
                    let e = src.kind.elem_bytes();
                    let (a, n, b) = (src_off / e, bytes / e, dst_off / e);
                    let mut to = self
                        .bufs
                        .remove(dst)
                        .ok_or_else(|| Error::InvalidArgument {
                            name: "CUDA launch plan".into(),
                            reason: format!("copy into {dst} before it is allocated"),
                        })?;
                    let from = self.buf(*src)?;
                    let r = match (from, &mut to) {
                        (DevBuf::U8(f), DevBuf::U8(t)) => self
                            .stream
                            .memcpy_dtod(&f.slice(a..a + n), &mut t.slice_mut(b..b + n)),
                        (DevBuf::U16(f), DevBuf::U16(t)) => self
                            .stream
                            .memcpy_dtod(&f.slice(a..a + n), &mut t.slice_mut(b..b + n)),
                        (DevBuf::U32(f), DevBuf::U32(t)) => self
                            .stream
                            .memcpy_dtod(&f.slice(a..a + n), &mut t.slice_mut(b..b + n)),
                        (DevBuf::F32(f), DevBuf::F32(t)) => self
                            .stream
                            .memcpy_dtod(&f.slice(a..a + n), &mut t.slice_mut(b..b + n)),
                        _ => {
                            return Err(Error::InvalidArgument {
                                name: "CUDA launch plan".into(),
                                reason: format!("copy between {src} and {dst} of different types"),
                            })
                        }
                    };
                    r.map_err(|e| Error::cuda("copy", e))?;
                    self.bufs.insert(*dst, to);
                }
                Step::Replace { dst, src } => {
                    let fresh = self
                        .bufs
                        .remove(src)
                        .ok_or_else(|| Error::InvalidArgument {
                            name: "CUDA launch plan".into(),
                            reason: format!("{src} replaces {dst} before it is allocated"),
                        })?;
                    self.bufs.insert(*dst, fresh);
                }
                Step::Zero(b) => {
                    let stream = self.stream.clone();
                    let buf = self.bufs.get_mut(b).ok_or_else(|| Error::InvalidArgument {
                        name: "CUDA launch plan".into(),
                        reason: format!("zeroing {b} before it is allocated"),
                    })?;
                    typed!(buf, |s| stream.memset_zeros(s))
                        .map_err(|e| Error::cuda("memset", e))?;
                }
                Step::Input { .. } => {}
                Step::Free(b) => {
                    self.bufs.remove(b);
                }
                Step::Output(b) => match self.bufs.remove(b) {
                    Some(DevBuf::F32(s)) => output = Some(s),
                    _ => {
                        return Err(Error::InvalidArgument {
                            name: "CUDA launch plan".into(),
                            reason: format!("output {b} is not an f32 buffer"),
                        })
                    }
                },
                Step::Launch(l) => self.launch(l, inputs)?,
            }
        }
        Ok(output)
    }

    fn launch(&mut self, l: &plan::Launch, inputs: &[(Kind, u64)]) -> Result<()> {
        let vals: Vec<Val> = l
            .args
            .iter()
            .map(|a| {
                Ok(match a {
                    Arg::Ptr(b) => Val::U64(self.ptr(*b, inputs)?),
                    Arg::I32(v) => Val::I32(*v),
                    Arg::F32(v) => Val::F32(*v),
                    Arg::Stream(s) => Val::Stream(self.stream_args(s)?),
                })
            })
            .collect::<Result<_>>()?;
        if !self.funcs.contains_key(&l.kernel) {
            let f = self
                .dev
                .get_or_load_custom_func(&l.kernel, MODULE, KV_CACHE_PTX)?;
            self.funcs.insert(l.kernel.clone(), (*f).clone());
        }
        let mut b = self.stream.launch_builder(&self.funcs[&l.kernel]);
        for v in &vals {
            match v {
                Val::U64(x) => b.arg(x),
                Val::I32(x) => b.arg(x),
                Val::F32(x) => b.arg(x),
                Val::Stream(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: (l.block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the plan's argument lists match the kernels' signatures in
        // kernels/kv_cache.cu (the CPU emulator type-checks each against the kernel), and every
        // buffer is sized from the same geometry the kernels index with.
        unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(&l.kernel, e))?;
        Ok(())
    }

    /// Drops every cached token but keeps the allocations (as [`crate::kv::KvCache::clear`]).
    /// Errors: CUDA errors.
    pub fn clear(&mut self) -> Result<()> {
        let steps = self.plan.clear();
        self.run(&steps, &[])?;
        Ok(())
    }

    /// Fills attention outputs with NaN before the kernels run, so a test can prove every
    /// element was written.
    pub fn poison_outputs(&mut self, on: bool) {
        self.plan.poison_outputs(on);
    }

    /// The scheme this cache stores.
    pub fn scheme(&self) -> KvScheme {
        self.plan.scheme()
    }

    /// Tokens sequence `b` has written (its next position), counting a forward whose last
    /// layer has not attended yet.
    pub fn seen(&self, b: usize) -> usize {
        self.plan.seen(b)
    }

    /// Tokens held per kv head of sequence `b` (≤ seen under eviction).
    pub fn held(&self, b: usize) -> usize {
        self.plan.held(b)
    }

    /// Bytes of K/V held: the same accounting as [`KvScheme::bytes_for_held`] (codes, scales,
    /// zero-points, KIVI residual rows, eviction bookkeeping), per sequence at its held count.
    pub fn kv_bytes(&self) -> usize {
        (0..self.batch)
            .map(|b| {
                self.plan
                    .scheme()
                    .bytes_for_held(&self.geom, 1, self.plan.held(b))
            })
            .sum()
    }

    /// Bytes of device memory the cache has allocated (capacity, fixed rings and bookkeeping).
    pub fn reserved_bytes(&self) -> usize {
        self.bufs.values().map(DevBuf::num_bytes).sum()
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
        let (k, v) = (k.contiguous()?, v.contiguous()?);
        let inputs = [
            (Kind::InK, f32_ptr(&k, &self.stream)?),
            (Kind::InV, f32_ptr(&v, &self.stream)?),
        ];
        let steps = self.plan.append(layer, n_new);
        self.run(&steps, &inputs)?;
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
        let inputs = [(Kind::InQ, f32_ptr(&q, &self.stream)?)];
        let steps = self.plan.attend(layer, n_q);
        let out = self
            .run(&steps, &inputs)?
            .ok_or_else(|| Error::InvalidArgument {
                name: "CUDA launch plan".into(),
                reason: "attention handed over no output".into(),
            })?;
        Ok(Tensor::from_storage(
            Storage::Cuda(CudaStorage::wrap_cuda_slice(out, self.dev.clone())),
            (b, hq, n_q, d),
            BackpropOp::none(),
            false,
        ))
    }

    fn download<T: DeviceRepr + Default + Clone>(
        &self,
        s: &CudaSlice<T>,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<T>> {
        if range.is_empty() {
            return Ok(Vec::new());
        }
        self.stream
            .clone_dtoh(&s.slice(range))
            .map_err(|e| Error::cuda("copy", e))
    }

    /// The rows held for (sequence `b`, kv head `h`) of `layer`, K (`value = false`) or V, each
    /// in the CPU row layout of [`crate::kv::format`] (per block: scales/zero-point, then codes),
    /// in slot order; with their absolute positions for eviction schemes (else `0..held`).
    /// For tests. Errors: KIVI keys (no per-row layout), CUDA copy errors.
    pub fn download_rows(
        &self,
        layer: usize,
        b: usize,
        h: usize,
        value: bool,
    ) -> Result<(Vec<Vec<u8>>, Vec<usize>)> {
        let f = self.plan.format(value);
        if f.token_group > 1 {
            return Err(Error::InvalidArgument {
                name: "download_rows".into(),
                reason: "per-channel keys have no per-row layout".into(),
            });
        }
        let (d, cap) = (self.geom.head_dim, self.plan.cap());
        let bh = b * self.geom.kv_heads + h;
        let n = self.plan.held(b);
        let at = |k: Kind| Buf {
            kind: k,
            layer,
            fresh: false,
        };
        let DevBuf::U32(lens) = self.buf(at(Kind::Lens))? else {
            return Err(mistyped(at(Kind::Lens)));
        };
        let lens = self.download(lens, 0..lens.len())?;
        if lens[bh] as usize != n {
            return Err(Error::InvalidArgument {
                name: "download_rows".into(),
                reason: format!("device holds {} rows, host expects {n}", lens[bh]),
            });
        }
        let plane = |k: Kind, per: usize| -> Result<Vec<u8>> {
            let DevBuf::U8(s) = self.buf(at(k))? else {
                return Err(mistyped(at(k)));
            };
            self.download(s, bh * cap * per..(bh * cap + n) * per)
        };
        let codes = plane(Kind::Codes(value), f.code_bytes(d))?;
        let meta = plane(Kind::Meta(value), f.meta_bytes(d))?;
        let rows = plan::rows_from_planes(f, d, &codes, &meta, n);
        let pos = match self.bufs.get(&at(Kind::Pos)) {
            Some(DevBuf::U32(pos)) => self
                .download(pos, bh * cap..bh * cap + n)?
                .into_iter()
                .map(|x| x as usize)
                .collect(),
            _ => (0..n).collect(),
        };
        Ok((rows, pos))
    }
}

/// A split-count override from the environment, for timing split counts against each other (the
/// results do not change, only how the key range is divided): `KVBENCH_CUDA_BLOCKS_PER_SM`, the
/// attention blocks per multiprocessor the split count aims for ([`plan::BLOCKS_PER_SM`] when
/// unset, 1 to 64), or `KVBENCH_CUDA_SPLIT_TOKENS`, the held tokens per split that cap it
/// ([`plan::SPLIT_TOKENS`], 1 to 65,536). `None` when unset. Errors:
/// [`Error::InvalidArgument`] naming the variable when it is not a whole number in its range.
fn split_override(var: &str, max: usize, default: usize) -> Result<Option<usize>> {
    let Ok(v) = std::env::var(var) else {
        return Ok(None);
    };
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
        _ => Err(Error::InvalidArgument {
            name: var.into(),
            reason: format!(
                "`{v}` is not a whole number from 1 to {max}; unset it for the default ({default})"
            ),
        }),
    }
}

/// The error for a plan buffer of an unexpected element type (a plan bug).
fn mistyped(b: Buf) -> Error {
    Error::InvalidArgument {
        name: "CUDA launch plan".into(),
        reason: format!("buffer {b} has an unexpected element type"),
    }
}

/// Whether buffers of `kind` hold f32 (the rest of the 4-byte kinds hold u32).
fn kind_is_f32(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Score
            | Kind::PartO
            | Kind::PartMl
            | Kind::Out
            | Kind::Logits
            | Kind::Ml
            | Kind::InK
            | Kind::InV
            | Kind::InQ
    )
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
