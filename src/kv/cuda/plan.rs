//! The CUDA cache's host side as a pure plan: every allocation, copy and kernel launch
//! `CudaKvCache` makes (capacity growth, split-K splits, grid and block sizes, argument
//! packing), with the host mirror of how many tokens each sequence has seen and holds. No CUDA
//! here, so it compiles and is unit-tested in every build; two executors run its [`Step`]s:
//! the device cache (`super::device`, feature `cuda`) and the CPU emulator
//! (kernels/emu/harness.cpp, driven by tests/kernels_emulated.rs through [`script`]), so the
//! emulator checks the very launch sequence the GPU runs.
//!
//! Attention is split-sequence decode attention (FlashDecoding, Dao et al. 2023): enough splits
//! of the held tokens that `splits · bh · query tiles` blocks give each of the device's
//! multiprocessors [`BLOCKS_PER_SM`], at most one split per [`SPLIT_TOKENS`] tokens;
//! `kv_attn_combine` merges the splits
//! (online softmax, Milakov & Gimelshein 2018, arXiv 1805.02867).

use std::fmt;

use crate::error::{Error, Result};
use crate::kv::evict::Eviction;
use crate::kv::formats::GpuFormat;
use crate::kv::scheme::{CacheGeometry, KvScheme};

/// Query rows per attention block (`QT` in kernels/kv_cache.cu).
pub const QT: usize = 4;
/// Warps per attention block (`WARPS` in kernels/kv_cache.cu).
pub const WARPS: u32 = 4;
/// Head dims with an attention kernel (`kv_attn_partial_d{64,128,256}`).
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Smallest capacity allocated (rows per bh).
pub const MIN_CAPACITY: usize = 64;
/// Held tokens per attention split that cap the split count (`⌈len / 128⌉` splits at most;
/// `KVBENCH_CUDA_SPLIT_TOKENS` overrides it). 128 = `WARPS` × 32: a split of a full chunk gives
/// each of its block's warps a tile of 32 slots (at 64, at 8k tokens on the H200, half of every
/// block's warps had none and 1,056 blocks ran as two waves). With chunks of `⌈len / splits⌉`
/// the last splits can be short or, past a few thousand tokens, empty: an empty split writes max
/// −∞, which the combine skips.
pub const SPLIT_TOKENS: usize = 128;
/// Threads of a `kv_attn_combine` block (`COMBINE_WARPS` × 32 in kernels/kv_cache.cu).
pub const COMBINE_THREADS: u32 = 256;
/// Attention blocks per multiprocessor the split count aims for (`KVBENCH_CUDA_BLOCKS_PER_SM`
/// overrides it). On an H200 (2026-12-04, results/h200-2026-12-04/NOTES.md) the partial kernel
/// was latency-bound — then one key row per warp at a time, two blocks of 4 warps per SM: 193
/// GB/s of fp16 K/V at 32k tokens, 4.8 % of the 4,027 GB/s the card reads — so time should fall
/// with the warps in flight until the bytes bind. Eight (32 warps per SM) is the prediction to
/// time next; shared memory (~10 KiB a block) allows it, registers are unchecked (no `ptxas -v`
/// report yet): above 64 per thread fewer blocks are resident.
pub const BLOCKS_PER_SM: usize = 8;

/// What one buffer holds (its element type follows: [`Kind::elem_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Codes plane `[bh, cap, code_bytes]` u8 of K (`value = false`) or V.
    Codes(bool),
    /// Scales/zero-points plane `[bh, cap, meta_bytes]` u8.
    Meta(bool),
    /// KIVI f16 residual ring `[bh, residual + group, d]` u16.
    Resid(bool),
    /// KIVI per-block channel scales `[bh, cap / group, d]` u16.
    ChanScales(bool),
    /// Absolute position per slot `[bh, cap]` u32 (eviction schemes).
    Pos,
    /// Accumulated attention per slot `[bh, cap]` f32 (H2O).
    Score,
    /// Rows held per bh `[bh]` u32.
    Lens,
    /// Tokens seen per sequence `[batch]` u32 (one for the cache).
    Seen,
    /// Attention partial outputs `[splits, bh, rows, d]` f32.
    PartO,
    /// Attention partial (max, sum) `[splits, bh, rows, 2]` f32.
    PartMl,
    /// Attention output `[batch, q_heads, n_q, d]` f32.
    Out,
    /// H2O logits `[bh, rows, cap]` f32.
    Logits,
    /// H2O combined (max, sum) `[bh, rows, 2]` f32.
    Ml,
    /// The caller's keys `[batch, kv_heads, n_new, d]` f32.
    InK,
    /// The caller's values, as `InK`.
    InV,
    /// The caller's queries `[batch, q_heads, n_q, d]` f32.
    InQ,
}

impl Kind {
    /// Bytes per element.
    pub fn elem_bytes(self) -> usize {
        match self {
            Kind::Codes(_) | Kind::Meta(_) => 1,
            Kind::Resid(_) | Kind::ChanScales(_) => 2,
            _ => 4,
        }
    }
}

/// One buffer of the plan: what it holds, its layer (0 for per-cache buffers), and whether it
/// is the fresh copy being filled while the cache grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buf {
    /// What it holds.
    pub kind: Kind,
    /// Decoder layer (0 for buffers not per layer).
    pub layer: usize,
    /// The larger copy a growth step fills before it replaces the old buffer.
    pub fresh: bool,
}

impl Buf {
    fn at(kind: Kind, layer: usize) -> Self {
        Buf {
            kind,
            layer,
            fresh: false,
        }
    }
    fn one(kind: Kind) -> Self {
        Self::at(kind, 0)
    }
    fn fresh(self) -> Self {
        Buf {
            fresh: true,
            ..self
        }
    }
}

impl fmt::Display for Buf {
    /// `L<layer>.<what>[.new]`, e.g. `L1.K.codes`, `L0.pos.new`, `seen`, `out`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kv = |v: bool| if v { "V" } else { "K" };
        let l = self.layer;
        match self.kind {
            Kind::Codes(v) => write!(f, "L{l}.{}.codes", kv(v))?,
            Kind::Meta(v) => write!(f, "L{l}.{}.meta", kv(v))?,
            Kind::Resid(v) => write!(f, "L{l}.{}.resid", kv(v))?,
            Kind::ChanScales(v) => write!(f, "L{l}.{}.chan_scales", kv(v))?,
            Kind::Pos => write!(f, "L{l}.pos")?,
            Kind::Score => write!(f, "L{l}.score")?,
            Kind::Lens => write!(f, "L{l}.lens")?,
            Kind::Seen => write!(f, "seen")?,
            Kind::PartO => write!(f, "part_o")?,
            Kind::PartMl => write!(f, "part_ml")?,
            Kind::Out => write!(f, "out")?,
            Kind::Logits => write!(f, "logits")?,
            Kind::Ml => write!(f, "ml")?,
            Kind::InK => write!(f, "in.K")?,
            Kind::InV => write!(f, "in.V")?,
            Kind::InQ => write!(f, "in.Q")?,
        }
        if self.fresh {
            write!(f, ".new")?;
        }
        Ok(())
    }
}

/// How a new buffer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// All zero bytes (`alloc_zeros`).
    Zero,
    /// f32 NaN everywhere (poison mode: an element the kernels never write shows up).
    Nan,
    /// Unspecified (every element is written before it is read).
    Uninit,
}

/// The kernel's `Stream` struct (field order and types match kernels/kv_cache.cu) with its
/// pointers named by buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamArg {
    /// Codes plane.
    pub codes: Buf,
    /// Scales/zero-points plane.
    pub meta: Buf,
    /// KIVI residual ring, if any.
    pub resid: Option<Buf>,
    /// KIVI channel scales, if any.
    pub chan_scales: Option<Buf>,
    /// The kernel's format id.
    pub fmt: i32,
    /// int4: elements per group; KIVI: tokens per group; else 0.
    pub group: i32,
    /// KIVI: f16 rows kept unquantized; else 0.
    pub residual: i32,
    /// Code bytes per row.
    pub code_bytes: i32,
    /// Meta bytes per row.
    pub meta_bytes: i32,
    /// Rows allocated per bh.
    pub cap: i32,
}

/// One kernel argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A device pointer to the start of a buffer, or null.
    Ptr(Option<Buf>),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
    /// A `Stream` struct by value.
    Stream(StreamArg),
}

/// One kernel launch: grid `(x, y, z)` of blocks of `block` threads, no dynamic shared memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Kernel name in kernels/kv_cache.cu.
    pub kernel: String,
    /// Grid dimensions.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: u32,
    /// Arguments in the kernel's order.
    pub args: Vec<Arg>,
}

/// One host-side action, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A new buffer of `count` elements (`count ≥ 1`).
    Alloc {
        /// The buffer.
        buf: Buf,
        /// Elements of [`Kind::elem_bytes`] bytes.
        count: usize,
        /// Initial contents.
        fill: Fill,
    },
    /// Device-to-device copy of `bytes` bytes between byte offsets.
    Copy {
        /// Source buffer.
        src: Buf,
        /// Destination buffer.
        dst: Buf,
        /// Byte offset in `src`.
        src_off: usize,
        /// Byte offset in `dst`.
        dst_off: usize,
        /// Bytes copied.
        bytes: usize,
    },
    /// `dst` is dropped and `src` (a fresh buffer) takes its place and name.
    Replace {
        /// The buffer replaced.
        dst: Buf,
        /// Its fresh, larger copy.
        src: Buf,
    },
    /// Sets every byte of a buffer to zero.
    Zero(Buf),
    /// The caller's input tensor `buf` (`count` f32) is read from here on.
    Input {
        /// `InK`, `InV` or `InQ`.
        buf: Buf,
        /// f32 elements.
        count: usize,
    },
    /// A kernel launch.
    Launch(Launch),
    /// `buf` is handed to the caller (the attention output).
    Output(Buf),
    /// `buf` is dropped.
    Free(Buf),
}

/// The host mirror and launch planner of one CUDA KV cache (see the module docs).
#[derive(Debug, Clone)]
pub struct Planner {
    scheme: KvScheme,
    geom: CacheGeometry,
    batch: usize,
    kf: GpuFormat,
    vf: GpuFormat,
    sms: usize,
    blocks_per_sm: usize,
    split_tokens: usize,
    poison: bool,
    /// Rows allocated per bh (a multiple of the KIVI token group).
    cap: usize,
    /// Tokens each sequence has seen (as counted on the device after a forward).
    seen: Vec<usize>,
    /// Rows held per sequence (same for every layer and kv head), mirrored from the scheme.
    held: Vec<usize>,
    /// Tokens of the forward in progress (appended to layer 0, not yet counted as seen).
    pending: usize,
}

impl Planner {
    /// The planner of an empty cache with room for `capacity` tokens per sequence before it
    /// grows, on a device with `sms` multiprocessors, and the steps that allocate it.
    ///
    /// Errors: [`Error::InvalidArgument`] when the scheme has no CUDA form (see
    /// [`crate::kv::Quant::gpu`]; `+rot`), `head_dim` is not 64/128/256, the batch is 0, or
    /// the scheme does not fit the geometry ([`KvScheme::validate`]).
    pub fn new(
        scheme: KvScheme,
        geom: CacheGeometry,
        batch: usize,
        capacity: usize,
        sms: usize,
    ) -> Result<(Self, Vec<Step>)> {
        scheme.validate(geom.head_dim)?;
        if scheme.rotate {
            return Err(Error::InvalidArgument {
                name: "--dtypes".into(),
                reason: format!("`{scheme}`: +rot has no CUDA kernels yet; use --device cpu"),
            });
        }
        if !HEAD_DIMS.contains(&geom.head_dim) {
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
        let (kf, vf) = (scheme.k.gpu()?, scheme.v.gpu()?);
        let mut p = Planner {
            scheme,
            geom,
            batch,
            kf,
            vf,
            sms: sms.max(1),
            blocks_per_sm: BLOCKS_PER_SM,
            split_tokens: SPLIT_TOKENS,
            poison: false,
            cap: 0,
            seen: vec![0; batch],
            held: vec![0; batch],
            pending: 0,
        };
        let cap = p.round_cap(capacity.max(MIN_CAPACITY));
        let mut steps = vec![alloc(Buf::one(Kind::Seen), batch, Fill::Zero)];
        for layer in 0..geom.layers {
            for value in [false, true] {
                p.plane(&mut steps, layer, value, cap, false, true);
            }
            if scheme.evicts() {
                steps.push(alloc(Buf::at(Kind::Pos, layer), p.bhs() * cap, Fill::Zero));
            }
            if p.h2o() {
                steps.push(alloc(
                    Buf::at(Kind::Score, layer),
                    p.bhs() * cap,
                    Fill::Zero,
                ));
            }
            steps.push(alloc(Buf::at(Kind::Lens, layer), p.bhs(), Fill::Zero));
        }
        p.cap = cap;
        Ok((p, steps))
    }

    /// Fill the attention buffers with NaN instead of leaving them uninitialized (tests: every
    /// element written).
    pub fn poison_outputs(&mut self, on: bool) {
        self.poison = on;
    }

    /// The scheme planned for.
    pub fn scheme(&self) -> KvScheme {
        self.scheme
    }

    /// Sequences × kv heads.
    pub fn bhs(&self) -> usize {
        self.batch * self.geom.kv_heads
    }

    /// Rows allocated per bh.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The GPU form of K (`value = false`) or V.
    pub fn format(&self, value: bool) -> GpuFormat {
        if value {
            self.vf
        } else {
            self.kf
        }
    }

    /// Tokens sequence `b` has written, counting a forward whose last layer has not attended.
    pub fn seen(&self, b: usize) -> usize {
        self.seen[b] + self.pending
    }

    /// Tokens held per kv head of sequence `b` after the last complete forward.
    pub fn held(&self, b: usize) -> usize {
        self.held[b]
    }

    fn h2o(&self) -> bool {
        self.scheme.evict.is_some_and(Eviction::keeps_scores)
    }

    /// `n` rounded up to a whole number of KIVI token groups (capacities are).
    pub fn round_cap(&self, n: usize) -> usize {
        let g = self.kf.token_group;
        n.div_ceil(g) * g
    }

    /// Allocation steps of one K or V plane with `cap` rows per bh (the KIVI ring only when
    /// `with_resid`: its size does not depend on the capacity, so growth keeps it).
    fn plane(
        &self,
        steps: &mut Vec<Step>,
        layer: usize,
        value: bool,
        cap: usize,
        fresh: bool,
        with_resid: bool,
    ) {
        let (f, d, bhs) = (self.format(value), self.geom.head_dim, self.bhs());
        let b = |k: Kind| {
            let b = Buf::at(k, layer);
            if fresh {
                b.fresh()
            } else {
                b
            }
        };
        if f.token_group > 1 {
            if with_resid {
                let n = bhs * (f.residual + f.group) * d;
                steps.push(alloc(b(Kind::Resid(value)), n, Fill::Zero));
            }
            let n = bhs * (cap / f.group) * d;
            steps.push(alloc(b(Kind::ChanScales(value)), n, Fill::Zero));
        }
        steps.push(alloc(
            b(Kind::Codes(value)),
            bhs * cap * f.code_bytes(d),
            Fill::Zero,
        ));
        steps.push(alloc(
            b(Kind::Meta(value)),
            bhs * cap * f.meta_bytes(d),
            Fill::Zero,
        ));
    }

    /// The `Stream` argument of K (`value = false`) or V of `layer`.
    pub fn stream_arg(&self, layer: usize, value: bool) -> StreamArg {
        let (f, d) = (self.format(value), self.geom.head_dim);
        let kivi = f.token_group > 1;
        StreamArg {
            codes: Buf::at(Kind::Codes(value), layer),
            meta: Buf::at(Kind::Meta(value), layer),
            resid: kivi.then(|| Buf::at(Kind::Resid(value), layer)),
            chan_scales: kivi.then(|| Buf::at(Kind::ChanScales(value), layer)),
            fmt: f.id,
            group: f.group as i32,
            residual: f.residual as i32,
            code_bytes: f.code_bytes(d) as i32,
            meta_bytes: f.meta_bytes(d) as i32,
            cap: self.cap as i32,
        }
    }

    /// Steps that grow every layer to hold at least `need` rows per bh, copying the rows held
    /// (capacity at least doubles, so appends cost amortized O(1) copies).
    fn grow(&mut self, steps: &mut Vec<Step>, need: usize) {
        if need <= self.cap {
            return;
        }
        let new_cap = self.round_cap(need.max(2 * self.cap));
        let (old_cap, d, bhs) = (self.cap, self.geom.head_dim, self.bhs());
        let held: Vec<usize> = (0..bhs)
            .map(|bh| self.held[bh / self.geom.kv_heads])
            .collect();
        // Rows 0..n of each bh, `per_row` bytes each, from capacity `from` to `to`.
        let copy = |steps: &mut Vec<Step>,
                    b: Buf,
                    from: usize,
                    to: usize,
                    rows: &dyn Fn(usize) -> usize,
                    per_row: usize| {
            for (bh, _) in held.iter().enumerate() {
                let n = rows(bh);
                if n == 0 || per_row == 0 {
                    continue;
                }
                steps.push(Step::Copy {
                    src: b,
                    dst: b.fresh(),
                    src_off: bh * from * per_row,
                    dst_off: bh * to * per_row,
                    bytes: n * per_row,
                });
            }
        };
        for layer in 0..self.geom.layers {
            for value in [false, true] {
                let f = self.format(value);
                self.plane(steps, layer, value, new_cap, true, false);
                let rows = |bh: usize| held[bh];
                copy(
                    steps,
                    Buf::at(Kind::Codes(value), layer),
                    old_cap,
                    new_cap,
                    &rows,
                    f.code_bytes(d),
                );
                copy(
                    steps,
                    Buf::at(Kind::Meta(value), layer),
                    old_cap,
                    new_cap,
                    &rows,
                    f.meta_bytes(d),
                );
                let mut kinds = vec![Kind::Codes(value), Kind::Meta(value)];
                if f.token_group > 1 {
                    let g = f.group;
                    let groups = |bh: usize| held[bh] / g;
                    copy(
                        steps,
                        Buf::at(Kind::ChanScales(value), layer),
                        old_cap / g,
                        new_cap / g,
                        &groups,
                        2 * d,
                    );
                    kinds.push(Kind::ChanScales(value));
                }
                for k in kinds {
                    let b = Buf::at(k, layer);
                    steps.push(Step::Replace {
                        dst: b,
                        src: b.fresh(),
                    });
                }
            }
            let rows = |bh: usize| held[bh];
            for (on, k) in [(self.scheme.evicts(), Kind::Pos), (self.h2o(), Kind::Score)] {
                if on {
                    let b = Buf::at(k, layer);
                    steps.push(alloc(b.fresh(), bhs * new_cap, Fill::Zero));
                    copy(steps, b, old_cap, new_cap, &rows, 4);
                    steps.push(Step::Replace {
                        dst: b,
                        src: b.fresh(),
                    });
                }
            }
        }
        self.cap = new_cap;
    }

    /// Counts the pending forward's tokens as seen (on the device too) and updates the held
    /// counts: after eviction (`evicted`) the scheme's cap, else every token is still held.
    fn finish_forward(&mut self, steps: &mut Vec<Step>, evicted: bool) {
        if self.pending == 0 {
            return;
        }
        steps.push(Step::Launch(Launch {
            kernel: "kv_advance_seen".into(),
            grid: ((self.batch as u32).div_ceil(128), 1, 1),
            block: 128,
            args: vec![
                Arg::Ptr(Some(Buf::one(Kind::Seen))),
                Arg::I32(self.batch as i32),
                Arg::I32(self.pending as i32),
            ],
        }));
        for b in 0..self.batch {
            self.seen[b] += self.pending;
            self.held[b] = if evicted {
                self.scheme.held_tokens(self.seen[b])
            } else {
                self.held[b] + self.pending
            };
        }
        self.pending = 0;
    }

    /// Steps that append `n_new` tokens of keys and values (`InK`, `InV`: `[batch, kv_heads,
    /// n_new, head_dim]` f32) to `layer`: quantize on write (`kv_append`, or for KIVI keys
    /// `kv_chan_quantize` + `kv_chan_resid`), then `kv_advance` (row counts, positions, scores).
    /// Layer 0 starts a forward: the previous one is counted and the cache grown first.
    pub fn append(&mut self, layer: usize, n_new: usize) -> Vec<Step> {
        let mut steps = Vec::new();
        let g = self.geom;
        if layer == 0 {
            // A forward whose last layer ran no attention (prefill without eviction) ends here.
            self.finish_forward(&mut steps, false);
            let need = self.held.iter().max().copied().unwrap_or(0) + n_new;
            self.grow(&mut steps, need);
            self.pending = n_new;
        }
        let (bhs, d) = (self.bhs(), g.head_dim);
        let count = bhs * n_new * d;
        let lens = Arg::Ptr(Some(Buf::at(Kind::Lens, layer)));
        for (value, input) in [(false, Kind::InK), (true, Kind::InV)] {
            let x = Buf::one(input);
            steps.push(Step::Input { buf: x, count });
            let sa = self.stream_arg(layer, value);
            let args = vec![
                Arg::Stream(sa),
                Arg::Ptr(Some(x)),
                lens,
                Arg::I32(n_new as i32),
                Arg::I32(d as i32),
            ];
            let f = self.format(value);
            let launch = |kernel: &str, grid, block| {
                Step::Launch(Launch {
                    kernel: kernel.into(),
                    grid,
                    block,
                    args: args.clone(),
                })
            };
            if f.token_group > 1 {
                let groups = (n_new / f.group + 2) as u32;
                steps.push(launch(
                    "kv_chan_quantize",
                    (groups, bhs as u32, 1),
                    d as u32,
                ));
                steps.push(launch("kv_chan_resid", (n_new as u32, bhs as u32, 1), 128));
            } else {
                steps.push(launch("kv_append", (n_new as u32, bhs as u32, 1), 32));
            }
        }
        let opt = |on: bool, k: Kind| Arg::Ptr(on.then(|| Buf::at(k, layer)));
        steps.push(Step::Launch(Launch {
            kernel: "kv_advance".into(),
            grid: ((bhs as u32).div_ceil(128), 1, 1),
            block: 128,
            args: vec![
                lens,
                Arg::Ptr(Some(Buf::one(Kind::Seen))),
                opt(self.scheme.evicts(), Kind::Pos),
                opt(self.h2o(), Kind::Score),
                Arg::I32(self.cap as i32),
                Arg::I32(g.kv_heads as i32),
                Arg::I32(bhs as i32),
                Arg::I32(n_new as i32),
            ],
        }));
        steps.push(Step::Free(Buf::one(Kind::InK)));
        steps.push(Step::Free(Buf::one(Kind::InV)));
        steps
    }

    /// Attention blocks per multiprocessor the split count aims for (default
    /// [`BLOCKS_PER_SM`]; at least 1). Changes no result, only how the key range is divided.
    pub fn set_blocks_per_sm(&mut self, n: usize) {
        self.blocks_per_sm = n.max(1);
    }

    /// Held tokens per split that cap the split count (default [`SPLIT_TOKENS`]; at least 1).
    /// Changes no result, only how the key range is divided.
    pub fn set_split_tokens(&mut self, n: usize) {
        self.split_tokens = n.max(1);
    }

    /// The split count for attention over `len` held tokens with `rows` query rows per bh:
    /// enough blocks for `blocks_per_sm` per multiprocessor, at most one split per
    /// `split_tokens` ([`SPLIT_TOKENS`]) tokens, at least 1.
    pub fn splits(&self, rows: usize, len: usize) -> usize {
        let qtiles = rows.div_ceil(QT);
        (self.blocks_per_sm * self.sms)
            .div_ceil(self.bhs() * qtiles)
            .clamp(1, len.div_ceil(self.split_tokens).max(1))
    }

    /// Steps of causal attention of `n_q` queries (`InQ`: `[batch, q_heads, n_q, head_dim]`
    /// f32) over everything `layer` holds, then the scheme's eviction; the output (`Out`,
    /// `[batch, q_heads, n_q, head_dim]` f32) is handed over by an [`Step::Output`]. After the
    /// last layer the `n_q` tokens count as seen.
    pub fn attend(&mut self, layer: usize, n_q: usize) -> Vec<Step> {
        let mut steps = Vec::new();
        let g = self.geom;
        let (d, bhs, cap) = (g.head_dim, self.bhs(), self.cap);
        let group = g.q_heads / g.kv_heads;
        let rows = group * n_q;
        // Longest held (before eviction) decides the split.
        let len = self.held.iter().max().copied().unwrap_or(0) + self.pending;
        let qtiles = rows.div_ceil(QT);
        let splits = self.splits(rows, len);
        let chunk = len.div_ceil(splits);
        let h2o = self.h2o();
        let fill = if self.poison { Fill::Nan } else { Fill::Uninit };
        let q = Buf::one(Kind::InQ);
        steps.push(Step::Input {
            buf: q,
            count: self.batch * g.q_heads * n_q * d,
        });
        let (part_o, part_ml, out) = (
            Buf::one(Kind::PartO),
            Buf::one(Kind::PartMl),
            Buf::one(Kind::Out),
        );
        let (logits, ml) = (
            h2o.then(|| Buf::one(Kind::Logits)),
            h2o.then(|| Buf::one(Kind::Ml)),
        );
        steps.push(alloc(part_o, splits * bhs * rows * d, fill));
        steps.push(alloc(part_ml, splits * bhs * rows * 2, fill));
        steps.push(alloc(out, self.batch * g.q_heads * n_q * d, fill));
        if let (Some(logits), Some(ml)) = (logits, ml) {
            steps.push(alloc(logits, bhs * rows * cap, fill));
            steps.push(alloc(ml, bhs * rows * 2, fill));
        }
        let (ka, va) = (self.stream_arg(layer, false), self.stream_arg(layer, true));
        let lens = Arg::Ptr(Some(Buf::at(Kind::Lens, layer)));
        let (kvh, grp, nq) = (
            Arg::I32(g.kv_heads as i32),
            Arg::I32(group as i32),
            Arg::I32(n_q as i32),
        );
        steps.push(Step::Launch(Launch {
            kernel: format!("kv_attn_partial_d{d}"),
            grid: (splits as u32, bhs as u32, qtiles as u32),
            block: WARPS * 32,
            args: vec![
                Arg::Ptr(Some(q)),
                Arg::Stream(ka),
                Arg::Stream(va),
                lens,
                kvh,
                grp,
                nq,
                Arg::F32(1.0 / (d as f32).sqrt()),
                Arg::I32(chunk as i32),
                Arg::Ptr(Some(part_o)),
                Arg::Ptr(Some(part_ml)),
                Arg::Ptr(logits),
            ],
        }));
        steps.push(Step::Launch(Launch {
            kernel: "kv_attn_combine".into(),
            grid: (rows as u32, bhs as u32, 1),
            block: COMBINE_THREADS,
            args: vec![
                Arg::Ptr(Some(part_o)),
                Arg::Ptr(Some(part_ml)),
                Arg::I32(splits as i32),
                kvh,
                grp,
                nq,
                Arg::I32(d as i32),
                Arg::Ptr(Some(out)),
                Arg::Ptr(ml),
            ],
        }));
        self.push_eviction(&mut steps, layer, n_q, logits.zip(ml));
        if layer + 1 == g.layers {
            let evicts = self.scheme.evicts();
            self.finish_forward(&mut steps, evicts);
        }
        for b in [Some(q), Some(part_o), Some(part_ml), logits, ml]
            .into_iter()
            .flatten()
        {
            steps.push(Step::Free(b));
        }
        steps.push(Step::Output(out));
        steps
    }

    /// The launches after [`attend`](Self::attend)'s combine: H2O's score accumulation (with
    /// `h2o`: the `Logits` and `Ml` buffers of the partial pass) and the scheme's eviction, for
    /// `layer` after `n_q` new queries.
    fn push_eviction(
        &self,
        steps: &mut Vec<Step>,
        layer: usize,
        n_q: usize,
        h2o: Option<(Buf, Buf)>,
    ) {
        let g = self.geom;
        let (bhs, cap) = (self.bhs(), self.cap);
        let rows = g.q_heads / g.kv_heads * n_q;
        let (ka, va) = (self.stream_arg(layer, false), self.stream_arg(layer, true));
        let lens = Arg::Ptr(Some(Buf::at(Kind::Lens, layer)));
        let (kvh, nq) = (Arg::I32(g.kv_heads as i32), Arg::I32(n_q as i32));
        let score = h2o.map(|_| Buf::at(Kind::Score, layer));
        if let (Some((logits, ml)), Some(score)) = (h2o, score) {
            steps.push(Step::Launch(Launch {
                kernel: "kv_h2o_scores".into(),
                grid: ((cap as u32).div_ceil(256), bhs as u32, 1),
                block: 256,
                args: vec![
                    Arg::Ptr(Some(logits)),
                    Arg::Ptr(Some(ml)),
                    lens,
                    Arg::I32(rows as i32),
                    Arg::I32(cap as i32),
                    Arg::Ptr(Some(score)),
                ],
            }));
        }
        if let Some(ev) = self.scheme.evict {
            let e = ev.gpu();
            steps.push(Step::Launch(Launch {
                kernel: "kv_evict".into(),
                grid: (bhs as u32, 1, 1),
                block: 256,
                args: vec![
                    Arg::Stream(ka),
                    Arg::Stream(va),
                    Arg::Ptr(Some(Buf::at(Kind::Pos, layer))),
                    Arg::Ptr(score),
                    lens,
                    Arg::Ptr(Some(Buf::one(Kind::Seen))),
                    kvh,
                    Arg::I32(e.mode),
                    Arg::I32(e.size),
                    Arg::I32(e.sinks),
                    Arg::I32(e.budget_tokens),
                    Arg::F32(e.ratio),
                    Arg::I32(e.recent),
                    nq,
                ],
            }));
        }
    }

    /// Steps that drop every cached token but keep the allocations.
    pub fn clear(&mut self) -> Vec<Step> {
        let mut steps: Vec<Step> = (0..self.geom.layers)
            .map(|l| Step::Zero(Buf::at(Kind::Lens, l)))
            .collect();
        steps.push(Step::Zero(Buf::one(Kind::Seen)));
        self.seen.iter_mut().for_each(|s| *s = 0);
        self.held.iter_mut().for_each(|s| *s = 0);
        self.pending = 0;
        steps
    }
}

fn alloc(buf: Buf, count: usize, fill: Fill) -> Step {
    Step::Alloc {
        buf,
        count: count.max(1),
        fill,
    }
}

/// The rows of one bh in the CPU row layout of [`crate::kv::format`] (the row-level head, then
/// per block: meta, then codes), from its slice of the codes and meta planes (`n` rows from the bh's start).
pub fn rows_from_planes(
    f: GpuFormat,
    d: usize,
    codes: &[u8],
    meta: &[u8],
    n: usize,
) -> Vec<Vec<u8>> {
    let (cb, mb) = (f.code_bytes(d), f.meta_bytes(d));
    let (nb, bm, bc) = f.blocks(d);
    (0..n)
        .map(|t| {
            let mut r = Vec::with_capacity(cb + mb);
            r.extend_from_slice(&meta[t * mb..][..f.head]);
            for k in 0..nb {
                r.extend_from_slice(&meta[t * mb + f.head + k * bm..][..bm]);
                r.extend_from_slice(&codes[t * cb + k * bc..][..bc]);
            }
            r
        })
        .collect()
}

/// The text form of `steps` that kernels/emu/harness.cpp executes, one step per line:
///
/// ```text
/// alloc BUF ELEM_BYTES COUNT zero|nan|uninit
/// copy SRC DST SRC_OFF DST_OFF BYTES
/// replace DST SRC          zero BUF        free BUF        output BUF
/// input BUF COUNT          (COUNT f32 from the inputs file, in order)
/// launch KERNEL GX GY GZ BLOCK ARG…    ARG: p:BUF | p:- | i:INT | f:F32_BITS |
///        s:CODES,META,RESID|-,CHAN_SCALES|-,FMT,GROUP,RESIDUAL,CODE_BYTES,META_BYTES,CAP
/// ```
pub fn script(steps: &[Step]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let opt = |b: Option<Buf>| b.map_or("-".to_string(), |b| b.to_string());
    for step in steps {
        match step {
            Step::Alloc { buf, count, fill } => {
                let fill = match fill {
                    Fill::Zero => "zero",
                    Fill::Nan => "nan",
                    Fill::Uninit => "uninit",
                };
                writeln!(s, "alloc {buf} {} {count} {fill}", buf.kind.elem_bytes())
            }
            Step::Copy {
                src,
                dst,
                src_off,
                dst_off,
                bytes,
            } => writeln!(s, "copy {src} {dst} {src_off} {dst_off} {bytes}"),
            Step::Replace { dst, src } => writeln!(s, "replace {dst} {src}"),
            Step::Zero(b) => writeln!(s, "zero {b}"),
            Step::Input { buf, count } => writeln!(s, "input {buf} {count}"),
            Step::Output(b) => writeln!(s, "output {b}"),
            Step::Free(b) => writeln!(s, "free {b}"),
            Step::Launch(l) => {
                let (x, y, z) = l.grid;
                write!(s, "launch {} {x} {y} {z} {}", l.kernel, l.block).unwrap();
                for a in &l.args {
                    match a {
                        Arg::Ptr(b) => write!(s, " p:{}", opt(*b)),
                        Arg::I32(v) => write!(s, " i:{v}"),
                        Arg::F32(v) => write!(s, " f:{}", v.to_bits()),
                        Arg::Stream(a) => write!(
                            s,
                            " s:{},{},{},{},{},{},{},{},{},{}",
                            a.codes,
                            a.meta,
                            opt(a.resid),
                            opt(a.chan_scales),
                            a.fmt,
                            a.group,
                            a.residual,
                            a.code_bytes,
                            a.meta_bytes,
                            a.cap
                        ),
                    }
                    .unwrap();
                }
                writeln!(s)
            }
        }
        .unwrap();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(layers: usize, kv_heads: usize, q_heads: usize, head_dim: usize) -> CacheGeometry {
        CacheGeometry {
            layers,
            kv_heads,
            q_heads,
            head_dim,
            window: None,
        }
    }

    fn planner(scheme: &str, g: CacheGeometry, batch: usize) -> (Planner, Vec<Step>) {
        Planner::new(scheme.parse().unwrap(), g, batch, 32, 132).unwrap()
    }

    fn launches(steps: &[Step]) -> Vec<&Launch> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Launch(l) => Some(l),
                _ => None,
            })
            .collect()
    }

    fn b(kind: Kind, layer: usize) -> Buf {
        Buf::at(kind, layer)
    }

    /// KIVI keys with token groups of 48, d = 64, batch 2, one kv head: capacity 32 → 64 →
    /// rounded to 96 (two groups); buffer sizes by hand; after 70 tokens held, 60 more grow it
    /// to max(130, 2·96) = 192 rows, copying 70 rows (one whole key group of scales) per bh.
    #[test]
    fn capacity_and_growth_by_hand() {
        let (mut p, steps) = planner("int8-channel:group=48,residual=32", geom(1, 1, 2, 64), 2);
        assert_eq!(p.cap(), 96);
        let count = |buf: Buf| {
            steps.iter().find_map(|s| match s {
                Step::Alloc { buf: x, count, .. } if *x == buf => Some(*count),
                _ => None,
            })
        };
        assert_eq!(count(Buf::one(Kind::Seen)), Some(2));
        assert_eq!(count(b(Kind::Resid(false), 0)), Some(2 * (32 + 48) * 64));
        assert_eq!(count(b(Kind::ChanScales(false), 0)), Some(2 * 2 * 64));
        assert_eq!(count(b(Kind::Codes(false), 0)), Some(2 * 96 * 64));
        assert_eq!(count(b(Kind::Meta(false), 0)), Some(1)); // 0 bytes, allocated as 1
        assert_eq!(count(b(Kind::Meta(true), 0)), Some(2 * 96 * 2)); // int8-token values
        assert_eq!(count(b(Kind::Pos, 0)), None);
        assert!(p
            .append(0, 70)
            .iter()
            .all(|s| !matches!(s, Step::Copy { .. })));
        p.attend(0, 70);
        assert_eq!((p.held(0), p.seen(1)), (70, 70));
        let steps = p.append(0, 60);
        assert_eq!(p.cap(), 192);
        let copies: Vec<(Buf, usize, usize, usize)> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Copy {
                    src,
                    src_off,
                    dst_off,
                    bytes,
                    ..
                } => Some((*src, *src_off, *dst_off, *bytes)),
                _ => None,
            })
            .collect();
        let kc = b(Kind::Codes(false), 0);
        let ks = b(Kind::ChanScales(false), 0);
        let vm = b(Kind::Meta(true), 0);
        assert_eq!(
            copies,
            vec![
                (kc, 0, 0, 70 * 64),
                (kc, 96 * 64, 192 * 64, 70 * 64),
                (ks, 0, 0, 128),
                (ks, 2 * 128, 4 * 128, 128),
                (b(Kind::Codes(true), 0), 0, 0, 70 * 64),
                (b(Kind::Codes(true), 0), 96 * 64, 192 * 64, 70 * 64),
                (vm, 0, 0, 140),
                (vm, 96 * 2, 192 * 2, 140),
            ]
        );
        // The KIVI ring keeps its size: no fresh one, and the fresh planes replace the old.
        assert!(!steps
            .iter()
            .any(|s| matches!(s, Step::Alloc { buf, .. } if buf.kind == Kind::Resid(false))));
        assert!(steps.contains(&Step::Replace {
            dst: kc,
            src: kc.fresh()
        }));
    }

    /// FlashDecoding splits by hand: 2 sequences × 1 kv head (2 bh), 2 query heads, 132 SMs,
    /// 8 blocks per SM = 1,056 blocks wanted. A 300-token prefill has 600 query rows = 150
    /// tiles per bh: ⌈1056 / 300⌉ = 4 splits, capped at ⌈300/128⌉ = 3, chunks of 100. The next
    /// decode step (2 rows, 1 tile, 301 tokens) wants ⌈1056 / 2⌉ = 528 splits, capped at
    /// ⌈301/128⌉ = 3, chunks of ⌈301/3⌉ = 101. At 2 blocks per SM (the first GPU run's 264
    /// blocks) the prefill is one split and the decode step still 3; at 64 tokens per split
    /// the decode step is ⌈301/64⌉ = 5 splits.
    #[test]
    fn attention_splits_and_grids_by_hand() {
        let (mut p, _) = planner("q4_0", geom(1, 1, 2, 64), 2);
        p.append(0, 300);
        let steps = p.attend(0, 300);
        let l = launches(&steps);
        assert_eq!(l[0].kernel, "kv_attn_partial_d64");
        assert_eq!((l[0].grid, l[0].block), ((3, 2, 150), 128));
        assert_eq!(l[0].args[8], Arg::I32(100));
        p.append(0, 1);
        let steps = p.attend(0, 1);
        let l = launches(&steps);
        assert_eq!((l[0].grid, l[0].args[8]), ((3, 2, 1), Arg::I32(101)));
        assert_eq!(l[0].args[7], Arg::F32(0.125)); // 1/√64
        assert_eq!(l[1].kernel, "kv_attn_combine");
        assert_eq!((l[1].grid, l[1].block), ((2, 2, 1), 256));
        assert_eq!(l[1].args[2], Arg::I32(3));
        assert_eq!(l[2].kernel, "kv_advance_seen"); // last layer: the step counts as seen
        assert_eq!(p.seen(0), 301);
        p.set_blocks_per_sm(2);
        assert_eq!((p.splits(600, 300), p.splits(2, 301)), (1, 3));
        p.set_split_tokens(64);
        assert_eq!(p.splits(2, 301), 5);
    }

    /// `Stream` packing by hand for d = 64: int4 with groups of 16 is 4 blocks of (4 meta, 8
    /// code) bytes; Q4_0 2 blocks of (2, 16).
    #[test]
    fn stream_args_by_hand() {
        let (p, _) = planner("int4:group=16/q4_0", geom(2, 1, 1, 64), 1);
        let k = p.stream_arg(1, false);
        assert_eq!(
            (
                k.fmt,
                k.group,
                k.residual,
                k.code_bytes,
                k.meta_bytes,
                k.cap
            ),
            (4, 16, 0, 32, 16, 64)
        );
        assert_eq!(k.codes, b(Kind::Codes(false), 1));
        assert_eq!((k.resid, k.chan_scales), (None, None));
        let v = p.stream_arg(0, true);
        assert_eq!((v.fmt, v.group, v.code_bytes, v.meta_bytes), (6, 0, 32, 4));
        // NVFP4 keys: 32 code bytes, meta = the f32 row scale + 4 E4M3 block scales = 8;
        // MXFP4 values: 32 code bytes, 2 E8M0 scales.
        let (p, _) = planner("nvfp4/mxfp4", geom(2, 1, 1, 64), 1);
        let k = p.stream_arg(0, false);
        assert_eq!((k.fmt, k.group, k.code_bytes, k.meta_bytes), (8, 0, 32, 8));
        let v = p.stream_arg(0, true);
        assert_eq!((v.fmt, v.group, v.code_bytes, v.meta_bytes), (9, 0, 32, 2));
    }

    /// The CPU row layout rebuilt from the planes by hand for NVFP4 at d = 32: the 4-byte row
    /// scale first, then per block its scale byte and its 8 code bytes.
    #[test]
    fn nvfp4_rows_from_planes_by_hand() {
        let f = crate::kv::Quant::Nvfp4.gpu().unwrap();
        let codes: Vec<u8> = (100..116).collect();
        let meta = [1, 2, 3, 4, 50, 60];
        let rows = rows_from_planes(f, 32, &codes, &meta, 1);
        let mut want = vec![1, 2, 3, 4, 50];
        want.extend(100..108);
        want.push(60);
        want.extend(108..116);
        assert_eq!(rows, vec![want]);
    }

    /// H2O: after attention come the score update and eviction with the policy's arguments;
    /// a window evicts without scores; the host mirror holds the policy's cap.
    #[test]
    fn eviction_launches_by_hand() {
        let (mut p, _) = planner("h2o:budget=48,recent=16", geom(1, 2, 4, 128), 1);
        let steps = p.append(0, 70);
        let adv = launches(&steps)[2];
        assert_eq!(adv.kernel, "kv_advance");
        assert_eq!(adv.args[2], Arg::Ptr(Some(b(Kind::Pos, 0))));
        assert_eq!(adv.args[3], Arg::Ptr(Some(b(Kind::Score, 0))));
        let steps = p.attend(0, 70);
        let names: Vec<&str> = launches(&steps).iter().map(|l| l.kernel.as_str()).collect();
        assert_eq!(
            names,
            [
                "kv_attn_partial_d128",
                "kv_attn_combine",
                "kv_h2o_scores",
                "kv_evict",
                "kv_advance_seen"
            ]
        );
        let ev = launches(&steps)[3];
        assert_eq!(
            ev.args[7..13],
            [
                Arg::I32(1),
                Arg::I32(0),
                Arg::I32(0),
                Arg::I32(48),
                Arg::F32(0.0),
                Arg::I32(16)
            ]
        );
        assert_eq!(p.held(0), 48);
        let (mut w, _) = planner("window:size=40,sinks=4", geom(1, 2, 4, 128), 1);
        w.append(0, 70);
        let steps = w.attend(0, 70);
        let l = launches(&steps);
        assert_eq!(l[2].kernel, "kv_evict");
        assert_eq!(l[2].args[3], Arg::Ptr(None)); // no scores
        assert_eq!(l[2].args[7..10], [Arg::I32(0), Arg::I32(40), Arg::I32(4)]);
        assert_eq!(w.held(0), 44);
    }

    /// The harness's text by hand for one launch and the buffer steps.
    #[test]
    fn script_by_hand() {
        let steps = [
            alloc(Buf::one(Kind::Seen), 2, Fill::Zero),
            Step::Launch(Launch {
                kernel: "kv_advance_seen".into(),
                grid: (1, 1, 1),
                block: 128,
                args: vec![
                    Arg::Ptr(Some(Buf::one(Kind::Seen))),
                    Arg::I32(2),
                    Arg::F32(1.0),
                    Arg::Ptr(None),
                ],
            }),
            Step::Replace {
                dst: b(Kind::Pos, 1),
                src: b(Kind::Pos, 1).fresh(),
            },
        ];
        assert_eq!(
            script(&steps),
            "alloc seen 4 2 zero\nlaunch kv_advance_seen 1 1 1 128 p:seen i:2 f:1065353216 p:-\n\
             replace L1.pos L1.pos.new\n"
        );
    }

    /// What the CUDA path does not implement is refused before anything is allocated.
    #[test]
    fn unsupported_schemes_are_refused() {
        for (s, g, batch) in [
            ("q4_0+rot", geom(1, 1, 1, 64), 1),
            ("fp8:scale=head", geom(1, 1, 1, 64), 1),
            ("int4-channel", geom(1, 1, 1, 64), 1),
            ("fp16", geom(1, 1, 1, 96), 1),
            ("fp16", geom(1, 1, 1, 64), 0),
        ] {
            let e = Planner::new(s.parse().unwrap(), g, batch, 32, 132).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{s}: {e}");
        }
    }
}
