//! kvbench's own CPU matrix product for quantized linear layers during decode steps:
//! `y = x Wᵀ` with `W: [out, in]` in a ggml block format (Q8_0, Q4_0, Q4_1; blocks of 32 along
//! `in`) and `x: [m, in]` f32, `m` = the sequences of a batched decode step.
//!
//! Why our own: a decode step is bound by reading the weights once (143 MB of Q8_0 for
//! SmolLM2-135M, about 11 ms at this machine's ~13 GB/s), so batched decode only raises
//! throughput if each weight block is read once for all sequences and the arithmetic per
//! sequence stays small. Here every block is loaded once and dotted with the `m` activation
//! rows while it is in registers, and the file's own 4-bit formats run without being widened to
//! Q8_0 first (Q4_1 is 20 bytes per 32 weights against Q8_0's 34).
//!
//! Method (as llama.cpp's CPU backend, `ggml_vec_dot_q4_1_q8_1` and `quantize_row_q8_1` in
//! ggml-cpu/arch/x86/quants.c): each activation row is quantized per block of 32 to int8 with
//! an absmax scale `dx = max|x|/127` (rounding to nearest, ties to even, as its AVX2 path) and
//! the block sum `sx = dx · Σ codes`; a block's dot product is computed in integers with AVX2
//! `maddubs`/`madd` (unsigned × signed bytes, pairs summed to i16, then to i32):
//! - Q8_0 (`w = dw · q`, `q ∈ [−128, 127]`): `dw · dx · Σ q·c` (signs moved onto `c` so the
//!   unsigned operand is `|q|`);
//! - Q4_1 (`w = dw · q + mw`, `q ∈ [0, 15]`): `dw · dx · Σ q·c + mw · sx`;
//! - Q4_0 (`w = dw · (q − 8)`): `dw · dx · Σ q·c − 8 · dw · sx`.
//!
//! Where the build targets AVX-512BW and AVX512-VNNI (Xeons since Cascade Lake, AMD since
//! Zen 4), Q8_0 in ggml's layout (a file's own blocks: the "pair kernel") takes two blocks per
//! 512-bit register instead. The activations are regrouped
//! once per product (`Pairs`: per pass of up to 8 rows and per block pair, codes offset to
//! unsigned `c + 128`, and the pair's two scales), so per activation row and block pair the
//! inner loop is a load of 64 codes, one `vpdpbusd` (weights as the signed operand; `128 · Σq`,
//! computed once per weight pair, seeds the accumulator negated), a conversion, the two scales
//! loaded and widened to their lanes, a multiply by `dx` and an FMA by `dw` — the same
//! per-block arithmetic, in about two thirds of the AVX2 kernel's instructions. (The shift
//! by 128 with a per-weight compensation term is how oneDNN runs `s8 × s8` products on VNNI,
//! its "s8s8 compensation".)
//!
//! Q8_0 weights kvbench converts at load ([`QMatrix::relaid`]: the timing path's default, the
//! default model's Q4_1 requantized) are re-laid once, where that kernel is compiled; a file's
//! own Q8_0 blocks, mapped or read, keep ggml's layout and the pair kernel, so a model computes
//! the same whichever way it was loaded. The layout: per weight row and chunk of 16 blocks, byte
//! group `g` (codes `4g..4g+4`) of the 16 blocks side by side in one 64-byte line, offset to
//! unsigned (`q + 128`); the blocks past the last whole chunk as they were (32 codes each, offset
//! the same; the kernel takes them two to a register); and every row's f16 scales after all
//! rows' codes — the same 34 bytes per block.
//! One `vpdpbusd` per line then adds four products of each of 16 blocks into that block's own
//! i32 lane, so the 8 lines of a chunk leave every block's whole dot product in one lane with
//! no horizontal sum, and the scales apply as one vector: per activation row and 16 blocks, 8
//! `vpdpbusd` (and their 8 activation loads), a subtraction of `128 · Σc` per block (the
//! offset, computed once per product from the activation codes), a conversion, a multiply by
//! `dx` and an FMA by `dw`, against 8 instructions per pair of blocks (64) in the pair kernel.
//! Measured (README, "Q8_0 weights re-laid for VNNI"): 1.23–1.39× the pair kernel's rate at 8
//! activation rows on weights in cache, 1.08–1.11× at one; a decode step's matmuls at batch 8
//! 15–17 % faster, at batch 1 no faster (bound by the weight stream). (The interleaving is llama.cpp's
//! "repack" idea — `ggml-cpu/repack.cpp`, `block_q8_0x4` and friends — with our own grouping
//! for VNNI.)
//!
//! Each weight row's bytes [`PREFETCH_AHEAD`](crate::kv::simd::PREFETCH_AHEAD) ahead are
//! prefetched in software as the row starts: a mapped file's pages are 4 KiB, and the hardware
//! prefetcher stops at each page boundary (a Q8_0 row of 4,096 inputs is 4,352 bytes, so every
//! row crosses one). On the 8B-shaped file (Intel Xeon VM, 2 threads) the large products read
//! 16–19 GB/s with it against 12–13 without.
//!
//! Without AVX2 the same arithmetic runs in scalar integer code. Results differ from the f32
//! product only by the activation rounding (at most `dx/2` per element).

use crate::kv::intdot::{dot_i8, dot_nibbles, f16_at};
use crate::kv::simd::{prefetch_ahead, prefetch_range, PREFETCH_AHEAD};
use crate::util::simd::simd_dispatch;

use super::mapped::WeightBytes;

/// Elements per block.
pub const BLOCK: usize = 32;

/// A weight block format this module computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// ggml Q8_0: f16 `d`, 32 × i8. 34 bytes.
    Q8_0,
    /// ggml Q4_0: f16 `d`, 16 bytes of nibbles (element `j` low, `j + 16` high). 18 bytes.
    Q4_0,
    /// ggml Q4_1: f16 `d`, f16 `m`, 16 bytes of nibbles. 20 bytes.
    Q4_1,
}

impl BlockFormat {
    /// Bytes per block of 32 weights.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
        }
    }

    /// The format of a candle/ggml dtype, when this module computes in it.
    pub fn of(dtype: candle_core::quantized::GgmlDType) -> Option<Self> {
        use candle_core::quantized::GgmlDType as G;
        match dtype {
            G::Q8_0 => Some(BlockFormat::Q8_0),
            G::Q4_0 => Some(BlockFormat::Q4_0),
            G::Q4_1 => Some(BlockFormat::Q4_1),
            _ => None,
        }
    }
}

/// A quantized weight matrix `[rows = out, cols = in]` in ggml's row-major block layout (row
/// `i` is `cols / 32` consecutive blocks), as stored in a GGUF file — or, built by
/// [`QMatrix::relaid`], Q8_0 in the interleaved layout of the module docs.
#[derive(Debug, Clone)]
pub struct QMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    data: WeightBytes,
    /// Whether `data` is Q8_0 re-laid for the interleaved kernel (see the module docs and
    /// [`interleave_q8`]) rather than ggml's blocks.
    interleaved: bool,
}

impl QMatrix {
    /// Blocks kvbench converted at load (a layer requantized to Q8_0 from another format or
    /// from f32): as [`Self::new`], then Q8_0 re-laid for the interleaved kernel where it is
    /// compiled (the same number of bytes; see the module docs). A file's own blocks go
    /// through [`Self::new`] whether mapped or read into memory, so a model computes the same
    /// whichever way it was loaded. Returns `None` as [`Self::new`].
    pub fn relaid(format: BlockFormat, rows: usize, cols: usize, data: Vec<u8>) -> Option<Self> {
        let mut q = Self::new(format, rows, cols, data)?;
        if AVX512_Q8 && format == BlockFormat::Q8_0 {
            q.data = interleave_q8(&q.data, rows, cols / BLOCK).into();
            q.interleaved = true;
        }
        Some(q)
    }

    /// Wraps ggml block bytes (owned, or a mapped file's: see [`WeightBytes`]) as they are:
    /// Q8_0 runs the pair kernel. Returns `None` when `cols` is not a multiple of 32 or `data`
    /// is not `rows · cols/32` blocks (the caller then keeps candle's path).
    pub fn new(
        format: BlockFormat,
        rows: usize,
        cols: usize,
        data: impl Into<WeightBytes>,
    ) -> Option<Self> {
        let data = data.into();
        let ok = cols > 0
            && cols.is_multiple_of(BLOCK)
            && rows.checked_mul(cols / BLOCK * format.block_bytes()) == Some(data.len());
        ok.then_some(Self {
            format,
            rows,
            cols,
            data,
            interleaved: false,
        })
    }

    /// Output features (rows of `W`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns of `W`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the blocks.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether the blocks are a mapped file's pages (no copy of their own).
    pub fn is_mapped(&self) -> bool {
        self.data.is_mapped()
    }

    /// Whether the bytes are Q8_0 re-laid for the interleaved kernel (see the module docs).
    pub fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// `out[r·rows + i] = Σ_c x[r·cols + c] · W[i, c]` for `m = x.len() / cols` rows of `x`,
    /// on candle's CPU thread pool (the one its own kernels and kvbench's attention use).
    /// `out`: `[m, rows]`. Panics if the lengths disagree (a caller bug, not input).
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) {
        let m = x.len() / self.cols;
        assert!(x.len() == m * self.cols && out.len() == m * self.rows);
        let mut act = Activations::quantize(x, self.cols);
        if self.interleaved {
            act.interleave();
        } else if self.format == BlockFormat::Q8_0 {
            act.pack_pairs();
        }
        // Work items: groups of weight rows; every item handles all activation rows.
        let group = 16;
        let items = self.rows.div_ceil(group);
        let out_ptr = out.as_mut_ptr() as usize;
        let work = |range: std::ops::Range<usize>| {
            for item in range {
                let i0 = item * group;
                let i1 = (i0 + group).min(self.rows);
                // SAFETY: each item writes only columns i0..i1 of every output row, and the
                // items' column ranges are disjoint.
                unsafe { self.rows_into(&act, i0, i1, out_ptr as *mut f32) };
            }
        };
        // Small products (k/v projections of one sequence) are not worth a parallel join.
        if self.rows * self.cols * m < 64 * 1024 {
            work(0..items);
        } else {
            candle_core::utils::barrier_pool().execute_chunked(items, work);
        }
    }

    /// Computes weight rows `i0..i1` for every activation row into `out` (`[m, rows]`).
    ///
    /// # Safety
    /// `out` must point to `m · rows` f32 that no other thread writes in columns `i0..i1`.
    unsafe fn rows_into(&self, act: &Activations, i0: usize, i1: usize, out: *mut f32) {
        let nb = self.cols / BLOCK;
        let bb = self.format.block_bytes();
        let mut r0 = 0;
        while r0 < act.m {
            let mr = (act.m - r0).min(MAX_M);
            let mut i = i0;
            while i < i1 {
                // An interleaved row's codes (32 bytes a block; its scales follow all rows').
                let rb = if self.interleaved {
                    nb * BLOCK
                } else {
                    nb * bb
                };
                let w = &self.data[i * rb..(i + 1) * rb];
                if r0 == 0 {
                    // Rows (codes, re-laid) are consecutive: one row's worth of bytes from 2 KiB
                    // ahead (the rest of this row, the start of the next), across the 4 KiB
                    // page boundaries where the hardware prefetcher stops (mapped file pages
                    // are 4 KiB). Once per weight row, not per pass over activation rows.
                    prefetch_ahead(&self.data, i * rb, rb);
                    if self.interleaved {
                        // The scales' stream (after all rows' codes) as many rows ahead.
                        let sb = nb * 2;
                        let ahead = PREFETCH_AHEAD.div_ceil(rb);
                        prefetch_range(&self.data, self.rows * rb + (i + ahead) * sb, sb);
                    }
                }
                let mut sums = [0f32; MAX_M];
                if self.interleaved {
                    let sc = &self.data[self.rows * rb + i * nb * 2..][..nb * 2];
                    dot_rows_interleaved(w, sc, nb, act, r0, mr, &mut sums);
                } else {
                    dot_rows(self.format, w, nb, act, r0, mr, &mut sums);
                }
                for (r, &s) in sums[..mr].iter().enumerate() {
                    *out.add((r0 + r) * self.rows + i) = s;
                }
                i += 1;
            }
            r0 += mr;
        }
    }
}

/// Activation rows dotted with a weight block while it is in registers.
const MAX_M: usize = 8;

/// Activations quantized per block of 32: codes `[m, cols]` i8, scales and block sums
/// `[m, cols/32]` f32.
#[derive(Debug)]
pub struct Activations {
    m: usize,
    nb: usize,
    codes: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    /// The AVX-512 Q8_0 kernel's layout (empty unless [`Activations::pack_pairs`] ran).
    pairs: Pairs,
    /// The interleaved Q8_0 kernel's layout (empty unless [`Activations::interleave`] ran).
    inter: Interleaved,
}

/// Blocks per chunk of the interleaved Q8_0 layout (one i32 lane of a 512-bit register each).
const CHUNK: usize = 16;

/// Re-lays Q8_0 blocks (`rows` rows of `nb` ggml blocks: f16 `d`, 32 × i8) for the interleaved
/// kernel, in the same `rows · nb · 34` bytes: first every row's codes, `nb · 32` bytes a row,
/// each offset to unsigned (`q + 128`) — per whole chunk `k` of 16 blocks at byte `512k` of
/// the row, line `g` (0..8) at `64g` holding codes `4g..4g+4` of blocks `0..16` in order; the
/// `nb mod 16` blocks past the last whole chunk (the tail) as they were, 32 codes each — then
/// every row's `nb` f16 scales (`[rows, nb]`, at byte `rows · nb · 32`). Two sequential
/// streams, each read in order. Source: the module docs.
fn interleave_q8(src: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    let whole = nb / CHUNK * CHUNK;
    let mut out = vec![0u8; rows * nb * 34];
    let (codes, scales) = out.split_at_mut(rows * nb * BLOCK);
    for (i, s) in src.chunks_exact(nb * 34).enumerate() {
        let row = &mut codes[i * nb * BLOCK..][..nb * BLOCK];
        for b in 0..nb {
            let blk = &s[b * 34..][..34];
            scales[2 * (i * nb + b)..][..2].copy_from_slice(&blk[..2]);
            for (e, &q) in blk[2..].iter().enumerate() {
                let at = if b < whole {
                    (b - b % CHUNK) * BLOCK + 4 * (CHUNK * (e / 4) + b % CHUNK) + e % 4
                } else {
                    b * BLOCK + e
                };
                row[at] = q ^ 0x80;
            }
        }
    }
    out
}

/// Activations for the interleaved Q8_0 kernel, per row. Whole chunks of 16 blocks: `codes`
/// `[m, chunks, 8, 16, 4]` i8 — line `g` holds codes `4g..4g+4` of the chunk's 16 blocks, as
/// the weights' lines — `dx` `[m, chunks · 16]` the blocks' scales and `corr` `[m, chunks ·
/// 16]` `128 · Σc` per block (what the weights' offset of 128 adds to each block's dot
/// product). The tail, in pairs of blocks as the pair kernel takes them (a last odd block
/// padded with zeros): `tcodes` `[m, pairs, 64]`, and per i32 lane (4 codes of one block)
/// `tdx` `[m, pairs, 16]` its block's scale and `tcorr` `[m, pairs, 16]` `128 ·` its 4 codes'
/// sum.
#[derive(Debug, Default)]
#[allow(dead_code)] // read by the AVX-512 kernel only, as `Pairs`
struct Interleaved {
    codes: Vec<i8>,
    dx: Vec<f32>,
    corr: Vec<i32>,
    chunks: usize,
    tcodes: Vec<i8>,
    tdx: Vec<f32>,
    tcorr: Vec<i32>,
    pairs: usize,
}

/// Whether the build has the AVX-512 Q8_0 kernel (`avx::avx512`; its `cfg` attributes name the
/// same three features).
const AVX512_Q8: bool = cfg!(all(
    target_feature = "avx512f",
    target_feature = "avx512bw",
    target_feature = "avx512vnni"
));

/// Activations regrouped for the AVX-512 Q8_0 kernel, per group of `rows = min(m, MAX_M)`
/// activation rows (one pass of [`QMatrix::rows_into`]) and per pair of blocks: `u` `[groups,
/// nb/2, rows, 64]` the codes offset to unsigned (`c + 128`, so `vpdpbusd` takes them as its
/// unsigned operand with the weights signed, and `128 · Σq` is subtracted once per weight
/// pair), `dx` `[groups, nb/2, rows, 2]` the pair's two scales. One pointer per pass and fixed
/// offsets per row, so no per-row sign fix-up; rows past `m` in the last group are zero and
/// never read. (The scales stay 2 floats, widened in registers: 16 floats per pair and row made
/// the activations of an 8-row pass overflow L1 at 4,096 inputs, and prefill slower.)
#[derive(Debug, Default)]
#[cfg_attr(
    not(all(
        target_feature = "avx512f",
        target_feature = "avx512bw",
        target_feature = "avx512vnni"
    )),
    allow(dead_code)
)]
struct Pairs {
    u: Vec<u8>,
    dx: Vec<f32>,
    rows: usize,
}

impl Activations {
    /// Quantizes `x` (`[m, cols]`, `cols` a multiple of 32): per block `d = max|x|/127`,
    /// `c = round(x/d)` (ties to even), `s = d · Σ c`.
    pub fn quantize(x: &[f32], cols: usize) -> Self {
        let m = x.len() / cols;
        let nb = cols / BLOCK;
        let mut codes = vec![0i8; m * cols];
        let mut d = vec![0f32; m * nb];
        let mut s = vec![0f32; m * nb];
        for ((xb, cb), (db, sb)) in x
            .chunks_exact(BLOCK)
            .zip(codes.chunks_exact_mut(BLOCK))
            .zip(d.iter_mut().zip(s.iter_mut()))
        {
            // Vectorized (the same codes as a scalar `round_ties_even` per value): a decode
            // step quantizes every matmul's input on the calling thread while the pool waits.
            let scale = crate::kv::simd::quantize_absmax_i8(xb, cb);
            let sum: i32 = cb.iter().map(|&c| c as i32).sum();
            *db = scale;
            *sb = scale * sum as f32;
        }
        Self {
            m,
            nb,
            codes,
            d,
            s,
            pairs: Pairs::default(),
            inter: Interleaved::default(),
        }
    }

    /// Builds [`Interleaved`] (for a matrix [`interleave_q8`] re-laid).
    fn interleave(&mut self) {
        let (chunks, tail) = (self.nb / CHUNK, self.nb % CHUNK);
        let (lanes, pairs) = (chunks * CHUNK, tail.div_ceil(2));
        let mut v = Interleaved {
            codes: vec![0i8; self.m * lanes * BLOCK],
            dx: vec![0f32; self.m * lanes],
            corr: vec![0i32; self.m * lanes],
            chunks,
            tcodes: vec![0i8; self.m * pairs * 2 * BLOCK],
            tdx: vec![0f32; self.m * pairs * 16],
            tcorr: vec![0i32; self.m * pairs * 16],
            pairs,
        };
        for row in 0..self.m {
            for b in 0..self.nb {
                let src = self.block(row, b);
                let d = self.d[row * self.nb + b];
                // Four codes as one word, and 128 times their sum.
                let word = |g: usize| {
                    let q: [i8; 4] = src[4 * g..][..4].try_into().unwrap();
                    let sum = q.iter().map(|&c| c as i32).sum::<i32>();
                    (q, 128 * sum)
                };
                if b < lanes {
                    let base = (row * chunks + b / CHUNK) * CHUNK * BLOCK + 4 * (b % CHUNK);
                    let mut corr = 0;
                    for g in 0..8 {
                        let (q, c) = word(g);
                        v.codes[base + 4 * CHUNK * g..][..4].copy_from_slice(&q);
                        corr += c;
                    }
                    v.dx[row * lanes + b] = d;
                    v.corr[row * lanes + b] = corr;
                } else {
                    // Lane `8·(t mod 2) + g` of pair `t / 2`, `t` the block's place in the tail.
                    let t = b - lanes;
                    let lane = (row * pairs + t / 2) * 16 + 8 * (t % 2);
                    v.tcodes[lane * 4..][..BLOCK].copy_from_slice(src);
                    for g in 0..8 {
                        v.tdx[lane + g] = d;
                        v.tcorr[lane + g] = word(g).1;
                    }
                }
            }
        }
        self.inter = v;
    }

    /// Builds [`Pairs`] (where the AVX-512 Q8_0 kernel is compiled; a no-op elsewhere).
    fn pack_pairs(&mut self) {
        if !AVX512_Q8 || self.nb < 2 || self.m == 0 {
            return;
        }
        let (np, rows) = (self.nb / 2, self.m.min(MAX_M));
        let groups = self.m.div_ceil(rows);
        let mut u = vec![0u8; groups * np * rows * 64];
        let mut dx = vec![0f32; groups * np * rows * 2];
        for row in 0..self.m {
            let (g, r) = (row / rows, row % rows);
            for p in 0..np {
                let at = (g * np + p) * rows + r;
                let src = &self.codes[(row * self.nb + 2 * p) * BLOCK..][..2 * BLOCK];
                for (o, &c) in u[at * 64..][..64].iter_mut().zip(src) {
                    *o = (c as u8) ^ 0x80;
                }
                dx[at * 2..][..2].copy_from_slice(&self.d[row * self.nb + 2 * p..][..2]);
            }
        }
        self.pairs = Pairs { u, dx, rows };
    }

    fn block(&self, r: usize, b: usize) -> &[i8] {
        &self.codes[(r * self.nb + b) * BLOCK..][..BLOCK]
    }
}

/// `sums[r] = Σ_blocks` of weight row `w` (`nb` blocks) against activation rows `r0..r0+mr`.
#[inline(always)]
fn dot_rows(
    format: BlockFormat,
    w: &[u8],
    nb: usize,
    act: &Activations,
    r0: usize,
    mr: usize,
    sums: &mut [f32; MAX_M],
) {
    simd_dispatch!(
        ["avx2", "fma"],
        // SAFETY: features enabled at compile time; every block read is inside `w`/`act`.
        unsafe { avx::dot_rows(format, w, nb, act, r0, mr, sums) },
        scalar_dot_rows(format, w, nb, act, r0, mr, sums)
    )
}

/// [`dot_rows`] for a weight row [`interleave_q8`] re-laid, `w` its codes and `scales` its
/// f16 scales (only built where the AVX-512 Q8_0 kernel is compiled).
#[inline(always)]
fn dot_rows_interleaved(
    w: &[u8],
    scales: &[u8],
    nb: usize,
    act: &Activations,
    r0: usize,
    mr: usize,
    sums: &mut [f32; MAX_M],
) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx512f",
        target_feature = "avx512bw",
        target_feature = "avx512vnni"
    ))]
    // SAFETY: features enabled at compile time; the kernel reads `w`'s `nb · 32` bytes,
    // `scales`' `nb · 2` and the activations' rows `r0..r0 + mr`, all inside their buffers.
    unsafe {
        use avx::avx512::q8_interleaved as k;
        match mr {
            1 => k::<1>(w, scales, nb, act, r0, sums),
            2 => k::<2>(w, scales, nb, act, r0, sums),
            3 => k::<3>(w, scales, nb, act, r0, sums),
            4 => k::<4>(w, scales, nb, act, r0, sums),
            5 => k::<5>(w, scales, nb, act, r0, sums),
            6 => k::<6>(w, scales, nb, act, r0, sums),
            7 => k::<7>(w, scales, nb, act, r0, sums),
            _ => k::<8>(w, scales, nb, act, r0, sums),
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx512f",
        target_feature = "avx512bw",
        target_feature = "avx512vnni"
    )))]
    {
        let _ = (w, scales, nb, act, r0, mr, sums);
        unreachable!("interleaved Q8_0 only where the AVX-512 kernel is compiled");
    }
}

/// The same arithmetic in scalar integer code: the reference the SIMD kernel is tested
/// against, and the path without AVX2.
#[allow(dead_code)]
fn scalar_dot_rows(
    format: BlockFormat,
    w: &[u8],
    nb: usize,
    act: &Activations,
    r0: usize,
    mr: usize,
    sums: &mut [f32; MAX_M],
) {
    let bb = format.block_bytes();
    for (r, sum) in sums.iter_mut().enumerate().take(mr) {
        let mut acc = 0f32;
        for b in 0..nb {
            let blk = &w[b * bb..(b + 1) * bb];
            let x = act.block(r0 + r, b);
            let (dx, sx) = (act.d[(r0 + r) * act.nb + b], act.s[(r0 + r) * act.nb + b]);
            let dw = f16_at(blk, 0);
            match format {
                BlockFormat::Q8_0 => {
                    acc += dw * dx * dot_i8(&blk[2..], x) as f32;
                }
                BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
                    let dot = dot_nibbles(&blk[bb - 16..], x);
                    let min = if format == BlockFormat::Q4_1 {
                        f16_at(blk, 2)
                    } else {
                        -8.0 * dw
                    };
                    acc += dw * dx * dot as f32 + min * sx;
                }
            }
        }
        *sum = acc;
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx {
    use super::{Activations, BlockFormat, BLOCK, MAX_M};
    use crate::kv::simd::avx::{dot_u8_i8 as dot_i32, f16_at as f16_ptr, hsum, nibbles};
    use std::arch::x86_64::*;

    /// [`dot_i32`] as 8 f32 partial sums.
    #[inline(always)]
    unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(dot_i32(u, s))
    }

    #[inline(always)]
    pub unsafe fn dot_rows(
        format: BlockFormat,
        w: &[u8],
        nb: usize,
        act: &Activations,
        r0: usize,
        mr: usize,
        sums: &mut [f32; MAX_M],
    ) {
        match (format, mr) {
            (BlockFormat::Q8_0, 1) => q8::<1>(w, nb, act, r0, sums),
            (BlockFormat::Q8_0, 2) => q8::<2>(w, nb, act, r0, sums),
            (BlockFormat::Q8_0, 3) => q8::<3>(w, nb, act, r0, sums),
            (BlockFormat::Q8_0, 4) => q8::<4>(w, nb, act, r0, sums),
            (BlockFormat::Q8_0, 5) => q8::<5>(w, nb, act, r0, sums),
            (BlockFormat::Q8_0, 6) => q8::<6>(w, nb, act, r0, sums),
            (BlockFormat::Q8_0, 7) => q8::<7>(w, nb, act, r0, sums),
            (BlockFormat::Q8_0, _) => q8::<8>(w, nb, act, r0, sums),
            (f, 1) => q4::<1>(f, w, nb, act, r0, sums),
            (f, 2) => q4::<2>(f, w, nb, act, r0, sums),
            (f, 3) => q4::<3>(f, w, nb, act, r0, sums),
            (f, 4) => q4::<4>(f, w, nb, act, r0, sums),
            (f, 5) => q4::<5>(f, w, nb, act, r0, sums),
            (f, 6) => q4::<6>(f, w, nb, act, r0, sums),
            (f, 7) => q4::<7>(f, w, nb, act, r0, sums),
            (f, _) => q4::<8>(f, w, nb, act, r0, sums),
        }
    }

    /// One Q8_0 block (`blk`: f16 d, 32 × i8) against `M` activation rows' block `b`, into
    /// `acc[r]`.
    #[inline(always)]
    unsafe fn q8_block<const M: usize>(
        blk: *const u8,
        b: usize,
        act: &Activations,
        r0: usize,
        acc: &mut [__m256; M],
    ) {
        let dw = _mm256_set1_ps(f16_ptr(blk));
        let q = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        let aq = _mm256_sign_epi8(q, q);
        let (codes, d) = (act.codes.as_ptr(), act.d.as_ptr());
        for (r, a) in acc.iter_mut().enumerate() {
            let row = (r0 + r) * act.nb + b;
            let c = _mm256_loadu_si256(codes.add(row * BLOCK) as *const __m256i);
            let f = dot_u8_i8(aq, _mm256_sign_epi8(c, q));
            let t = _mm256_mul_ps(f, _mm256_broadcast_ss(&*d.add(row)));
            *a = _mm256_fmadd_ps(t, dw, *a);
        }
    }

    /// One Q4_0/Q4_1 block against `M` activation rows' block `b`: nibbles are the unsigned
    /// operand directly; the zero-point term (`mw · sx`, or `−8·dw · sx`) goes to `side[r]`.
    #[inline(always)]
    unsafe fn q4_block<const M: usize, const Q41: bool>(
        blk: *const u8,
        b: usize,
        act: &Activations,
        r0: usize,
        acc: &mut [__m256; M],
        side: &mut [f32; M],
    ) {
        let dws = f16_ptr(blk);
        let (mw, qs) = if Q41 {
            (f16_ptr(blk.add(2)), blk.add(4))
        } else {
            (-8.0 * dws, blk.add(2))
        };
        let dw = _mm256_set1_ps(dws);
        let q = nibbles(qs);
        let (codes, d, sx) = (act.codes.as_ptr(), act.d.as_ptr(), act.s.as_ptr());
        for r in 0..M {
            let row = (r0 + r) * act.nb + b;
            let c = _mm256_loadu_si256(codes.add(row * BLOCK) as *const __m256i);
            let f = dot_u8_i8(q, c);
            let t = _mm256_mul_ps(f, _mm256_broadcast_ss(&*d.add(row)));
            acc[r] = _mm256_fmadd_ps(t, dw, acc[r]);
            side[r] = mw.mul_add(*sx.add(row), side[r]);
        }
    }

    /// Q8_0 weights; blocks in pairs into two accumulator sets, so no row waits on a single
    /// FMA chain and every accumulator stays in a register.
    #[inline(always)]
    unsafe fn q8<const M: usize>(
        w: &[u8],
        nb: usize,
        act: &Activations,
        r0: usize,
        sums: &mut [f32; MAX_M],
    ) {
        #[cfg(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni"
        ))]
        if !act.pairs.u.is_empty() {
            return avx512::q8::<M>(w, nb, act, r0, sums);
        }
        let (mut a0, mut a1) = ([_mm256_setzero_ps(); M], [_mm256_setzero_ps(); M]);
        let wp = w.as_ptr();
        let mut b = 0;
        while b + 2 <= nb {
            q8_block::<M>(wp.add(b * 34), b, act, r0, &mut a0);
            // Past 4 rows the rows already give independent chains, and two sets would spill.
            let second = if M > 4 { &mut a0 } else { &mut a1 };
            q8_block::<M>(wp.add((b + 1) * 34), b + 1, act, r0, second);
            b += 2;
        }
        if b < nb {
            q8_block::<M>(wp.add(b * 34), b, act, r0, &mut a0);
        }
        for r in 0..M {
            sums[r] = hsum(_mm256_add_ps(a0[r], a1[r]));
        }
    }

    /// Q8_0 with 512-bit registers (AVX-512BW + AVX512-VNNI): a pair of consecutive blocks
    /// per register, so every per-row instruction of [`q8_block`] covers 64 weights instead of
    /// 32. The same per-block arithmetic (`(dot · dx) · dw` fused into the accumulator), block
    /// `b` of a pair in lanes 0..8 and `b + 1` in lanes 8..16.
    #[cfg(all(
        target_feature = "avx512f",
        target_feature = "avx512bw",
        target_feature = "avx512vnni"
    ))]
    pub(super) mod avx512 {
        use super::super::{Activations, BLOCK, CHUNK, MAX_M};
        use super::{hsum, q8_block};
        use crate::kv::simd::avx512::{fold, join, offset_correction};
        use std::arch::x86_64::*;

        /// Lanes 0..8 take element 0 of `x`, lanes 8..16 element 1: a pair of blocks' scales
        /// widened to their lanes.
        #[inline(always)]
        unsafe fn widen_pair(x: __m128) -> __m512 {
            let halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(x))
        }

        /// [`widen_pair`] of two f16 scales, `bits` the first in its low half.
        #[inline(always)]
        unsafe fn f16_pair(bits: u32) -> __m512 {
            widen_pair(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }

        /// `sums[r]` for activation rows `r0..r0 + M` (`r0` a multiple of the pass size) against
        /// weight row `w`: block pairs on [`super::super::Pairs`], an odd last block on the
        /// 256-bit [`q8_block`].
        #[inline(always)]
        pub unsafe fn q8<const M: usize>(
            w: &[u8],
            nb: usize,
            act: &Activations,
            r0: usize,
            sums: &mut [f32; MAX_M],
        ) {
            let (np, rows) = (nb / 2, act.pairs.rows);
            debug_assert!(r0.is_multiple_of(rows) && M <= rows);
            let u = act.pairs.u.as_ptr().add(r0 * np * 64);
            let dx = act.pairs.dx.as_ptr().add(r0 * np * 2);
            let k128 = _mm512_set1_epi8(-128);
            let mut acc = [_mm512_setzero_ps(); M];
            let wp = w.as_ptr();
            for p in 0..np {
                let blk = wp.add(2 * p * 34);
                let d0 = u16::from_le_bytes([*blk, *blk.add(1)]) as u32;
                let d1 = u16::from_le_bytes([*blk.add(34), *blk.add(35)]) as u32;
                let dw = f16_pair(d0 | d1 << 16);
                let q = join(
                    _mm256_loadu_si256(blk.add(2) as *const __m256i),
                    _mm256_loadu_si256(blk.add(36) as *const __m256i),
                );
                // Σ (c + 128)·q − 128·Σq = Σ c·q, exactly (i32, no saturation in vpdpbusd).
                let corr = offset_correction(k128, q);
                let (up, dp) = (u.add(p * rows * 64), dx.add(p * rows * 2));
                for (r, a) in acc.iter_mut().enumerate() {
                    let c = _mm512_loadu_si512(up.add(r * 64) as *const __m512i);
                    let f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr, c, q));
                    let dxs = _mm_castsi128_ps(_mm_loadl_epi64(dp.add(r * 2) as *const __m128i));
                    let dx = widen_pair(dxs);
                    *a = _mm512_fmadd_ps(_mm512_mul_ps(f, dx), dw, *a);
                }
            }
            let mut tail = [_mm256_setzero_ps(); M];
            if nb % 2 == 1 {
                q8_block::<M>(wp.add((nb - 1) * 34), nb - 1, act, r0, &mut tail);
            }
            for r in 0..M {
                sums[r] = hsum(_mm256_add_ps(fold(acc[r]), tail[r]));
            }
        }

        /// `sums[r]` for activation rows `r0..r0 + M` against a weight row re-laid by
        /// [`super::super::interleave_q8`] (`nb` blocks; `w` its codes, `scales` its f16
        /// scales), on [`super::super::Interleaved`]
        /// activations. Per whole chunk of 16 blocks the 8 weight lines are loaded once and,
        /// per row, 8 `vpdpbusd` in two chains leave block `j`'s `Σ (q + 128)·c` in lane `j`;
        /// minus `128 · Σc`, times `dx`, fused by `dw` into the row's 16-lane accumulator. Per
        /// pair of tail blocks (a last odd one alone, its upper lanes zero) one `vpdpbusd`,
        /// with the pair's scales widened to their lanes as the pair kernel does.
        #[inline(always)]
        pub unsafe fn q8_interleaved<const M: usize>(
            w: &[u8],
            scales: &[u8],
            nb: usize,
            act: &Activations,
            r0: usize,
            sums: &mut [f32; MAX_M],
        ) {
            let v = &act.inter;
            let (chunks, pairs) = (v.chunks, v.pairs);
            debug_assert!(chunks == nb / CHUNK && pairs == (nb % CHUNK).div_ceil(2));
            debug_assert!(w.len() == nb * BLOCK && scales.len() == nb * 2);
            let wp = w.as_ptr();
            let sp = scales.as_ptr() as *const u16;
            let (codes, dx, corr) = (v.codes.as_ptr(), v.dx.as_ptr(), v.corr.as_ptr());
            let mut acc = [_mm512_setzero_ps(); M];
            for k in 0..chunks {
                let base = wp.add(k * CHUNK * BLOCK);
                let mut wv = [_mm512_setzero_si512(); 8];
                for (g, x) in wv.iter_mut().enumerate() {
                    *x = _mm512_loadu_si512(base.add(64 * g) as *const __m512i);
                }
                let sw = _mm512_cvtph_ps(_mm256_loadu_si256(sp.add(k * CHUNK) as *const __m256i));
                for (r, a) in acc.iter_mut().enumerate() {
                    let lane = ((r0 + r) * chunks + k) * CHUNK;
                    let c = codes.add(lane * BLOCK) as *const __m512i;
                    let z = _mm512_setzero_si512();
                    let mut s0 = _mm512_dpbusd_epi32(z, wv[0], _mm512_loadu_si512(c));
                    let mut s1 = _mm512_dpbusd_epi32(z, wv[1], _mm512_loadu_si512(c.add(1)));
                    s0 = _mm512_dpbusd_epi32(s0, wv[2], _mm512_loadu_si512(c.add(2)));
                    s1 = _mm512_dpbusd_epi32(s1, wv[3], _mm512_loadu_si512(c.add(3)));
                    s0 = _mm512_dpbusd_epi32(s0, wv[4], _mm512_loadu_si512(c.add(4)));
                    s1 = _mm512_dpbusd_epi32(s1, wv[5], _mm512_loadu_si512(c.add(5)));
                    s0 = _mm512_dpbusd_epi32(s0, wv[6], _mm512_loadu_si512(c.add(6)));
                    s1 = _mm512_dpbusd_epi32(s1, wv[7], _mm512_loadu_si512(c.add(7)));
                    let s = _mm512_sub_epi32(
                        _mm512_add_epi32(s0, s1),
                        _mm512_loadu_si512(corr.add(lane) as *const __m512i),
                    );
                    let f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(dx.add(lane)));
                    *a = _mm512_fmadd_ps(f, sw, *a);
                }
            }
            let (tcodes, tdx, tcorr) = (v.tcodes.as_ptr(), v.tdx.as_ptr(), v.tcorr.as_ptr());
            let first = chunks * CHUNK;
            for p in 0..pairs {
                let b = first + 2 * p;
                let (q, d) = if b + 1 < nb {
                    let q = _mm512_loadu_si512(wp.add(b * BLOCK) as *const __m512i);
                    (
                        q,
                        sp.add(b).read_unaligned() as u32
                            | (sp.add(b + 1).read_unaligned() as u32) << 16,
                    )
                } else {
                    let q = _mm512_maskz_loadu_epi32(0xff, wp.add(b * BLOCK) as *const i32);
                    (q, sp.add(b).read_unaligned() as u32)
                };
                let dw = f16_pair(d);
                for (r, a) in acc.iter_mut().enumerate() {
                    let lane = ((r0 + r) * pairs + p) * 16;
                    let c = _mm512_loadu_si512(tcodes.add(lane * 4) as *const __m512i);
                    let s = _mm512_sub_epi32(
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, c),
                        _mm512_loadu_si512(tcorr.add(lane) as *const __m512i),
                    );
                    let f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(tdx.add(lane)));
                    *a = _mm512_fmadd_ps(f, dw, *a);
                }
            }
            for r in 0..M {
                sums[r] = _mm512_reduce_add_ps(acc[r]);
            }
        }
    }

    /// Q4_0 / Q4_1 weights, blocks in pairs as [`q8`].
    #[inline(always)]
    unsafe fn q4<const M: usize>(
        format: BlockFormat,
        w: &[u8],
        nb: usize,
        act: &Activations,
        r0: usize,
        sums: &mut [f32; MAX_M],
    ) {
        if format == BlockFormat::Q4_1 {
            q4_rows::<M, true>(w, nb, act, r0, sums)
        } else {
            q4_rows::<M, false>(w, nb, act, r0, sums)
        }
    }

    #[inline(always)]
    unsafe fn q4_rows<const M: usize, const Q41: bool>(
        w: &[u8],
        nb: usize,
        act: &Activations,
        r0: usize,
        sums: &mut [f32; MAX_M],
    ) {
        let bb = if Q41 { 20 } else { 18 };
        let (mut a0, mut a1) = ([_mm256_setzero_ps(); M], [_mm256_setzero_ps(); M]);
        let mut side = [0f32; M];
        let wp = w.as_ptr();
        let mut b = 0;
        while b + 2 <= nb {
            q4_block::<M, Q41>(wp.add(b * bb), b, act, r0, &mut a0, &mut side);
            let second = if M > 4 { &mut a0 } else { &mut a1 };
            q4_block::<M, Q41>(wp.add((b + 1) * bb), b + 1, act, r0, second, &mut side);
            b += 2;
        }
        if b < nb {
            q4_block::<M, Q41>(wp.add(b * bb), b, act, r0, &mut a0, &mut side);
        }
        for r in 0..M {
            sums[r] = hsum(_mm256_add_ps(a0[r], a1[r])) + side[r];
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    /// ggml blocks built by hand from integer codes, so the exact f32 product is known; as
    /// [`QMatrix::relaid`] holds them (Q8_0 interleaved where that kernel is compiled).
    fn matrix(format: BlockFormat, rows: usize, cols: usize, seed: u32) -> (QMatrix, Vec<f32>) {
        let (data, dense) = blocks(format, rows, cols, seed);
        (QMatrix::relaid(format, rows, cols, data).unwrap(), dense)
    }

    /// The ggml bytes of [`matrix`] and their dequantized values `[rows, cols]`.
    fn blocks(format: BlockFormat, rows: usize, cols: usize, seed: u32) -> (Vec<u8>, Vec<f32>) {
        let nb = cols / BLOCK;
        let bb = format.block_bytes();
        let mut data = vec![0u8; rows * nb * bb];
        let mut dense = vec![0f32; rows * cols];
        let mut h = seed;
        let mut next = || {
            h = h.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            h >> 8
        };
        for i in 0..rows {
            for b in 0..nb {
                let blk = &mut data[(i * nb + b) * bb..][..bb];
                let d = f16::from_f32(0.001 + (next() % 1000) as f32 * 1e-5);
                blk[..2].copy_from_slice(&d.to_le_bytes());
                let m = f16::from_f32((next() % 200) as f32 * 1e-4 - 0.01);
                for j in 0..BLOCK {
                    let col = b * BLOCK + j;
                    let v = match format {
                        BlockFormat::Q8_0 => {
                            // −128 too: ggml never writes it, other writers may.
                            let q = (next() % 256) as i32 - 128;
                            blk[2 + j] = q as i8 as u8;
                            d.to_f32() * q as f32
                        }
                        BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
                            let q = (next() % 16) as u8;
                            let byte = &mut blk[bb - 16 + j % 16];
                            *byte |= if j < 16 { q } else { q << 4 };
                            if format == BlockFormat::Q4_1 {
                                d.to_f32() * q as f32 + m.to_f32()
                            } else {
                                d.to_f32() * (q as f32 - 8.0)
                            }
                        }
                    };
                    dense[i * cols + col] = v;
                }
                if format == BlockFormat::Q4_1 {
                    blk[2..4].copy_from_slice(&m.to_le_bytes());
                }
            }
        }
        (data, dense)
    }

    /// Against the exact f32 product of the dequantized weights (an independent computation
    /// in f64): the only error allowed is the activation rounding, at most `dx/2` per element,
    /// so `|err| ≤ Σ_c |W[i,c]| · dx_block(c) / 2` (plus f32 accumulation slack).
    #[test]
    fn matches_dense_product_within_activation_rounding() {
        for format in [BlockFormat::Q8_0, BlockFormat::Q4_0, BlockFormat::Q4_1] {
            // Block counts below, at and past the interleaved layout's chunk of 16 (576:
            // SmolLM2's width, 16 + 2 blocks; 1,024: two whole chunks).
            for (rows, cols, m) in [
                (5usize, 64usize, 1usize),
                (37, 96, 3),
                (16, 32, 8),
                (9, 160, 11),
                (7, 576, 9),
                (3, 1024, 2),
            ] {
                let (q, dense) = matrix(format, rows, cols, rows as u32 * 7 + m as u32);
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 7) as f32))
                    .collect();
                let mut out = vec![0f32; m * rows];
                q.matmul(&x, &mut out);
                for r in 0..m {
                    for i in 0..rows {
                        let xr = &x[r * cols..(r + 1) * cols];
                        let wi = &dense[i * cols..(i + 1) * cols];
                        let exact: f64 =
                            xr.iter().zip(wi).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let bound: f64 = xr
                            .chunks(BLOCK)
                            .zip(wi.chunks(BLOCK))
                            .map(|(xb, wb)| {
                                let dx = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                                wb.iter().map(|&w| w.abs() as f64).sum::<f64>() * dx / 2.0
                            })
                            .sum::<f64>()
                            + 1e-4 * (1.0 + exact.abs());
                        let got = out[r * rows + i] as f64;
                        assert!(
                            (got - exact).abs() <= bound,
                            "{format:?} rows={rows} cols={cols} m={m} r={r} i={i}: {got} vs {exact} (bound {bound})"
                        );
                    }
                }
            }
        }
    }

    /// The SIMD kernel against the scalar integer reference, which performs the same integer
    /// arithmetic: equal up to f32 summation order.
    #[test]
    fn simd_equals_scalar_reference() {
        for format in [BlockFormat::Q8_0, BlockFormat::Q4_0, BlockFormat::Q4_1] {
            // Even and odd block counts; one pass, several passes, a partial last pass.
            for cols in [64usize, 96, 160, 256] {
                let (data, _) = blocks(format, 3, cols, 11 + cols as u32);
                let q = QMatrix::new(format, 3, cols, data).unwrap();
                for m in [1usize, 3, 8, 9, 11, 16, 17] {
                    let x: Vec<f32> = (0..m * cols)
                        .map(|i| ((i as f32) * 0.113).cos() * 3.0)
                        .collect();
                    let act = Activations::quantize(&x, cols);
                    let mut packed = Activations::quantize(&x, cols);
                    packed.pack_pairs();
                    // The AVX-512 layout is built (and so tested) wherever it is compiled.
                    assert_eq!(!packed.pairs.u.is_empty(), AVX512_Q8, "{format:?} m={m}");
                    let nb = cols / BLOCK;
                    let bb = format.block_bytes();
                    for i in 0..3 {
                        let w = &q.data[i * nb * bb..(i + 1) * nb * bb];
                        for r0 in (0..m).step_by(MAX_M) {
                            let mr = (m - r0).min(MAX_M);
                            let (mut a, mut b, mut c) =
                                ([0f32; MAX_M], [0f32; MAX_M], [0f32; MAX_M]);
                            dot_rows(format, w, nb, &act, r0, mr, &mut a);
                            scalar_dot_rows(format, w, nb, &act, r0, mr, &mut b);
                            // Q8_0 on the AVX-512 layout where it is compiled (else as `a`).
                            dot_rows(format, w, nb, &packed, r0, mr, &mut c);
                            for r in 0..mr {
                                for got in [a[r], c[r]] {
                                    assert!(
                                        (got - b[r]).abs() <= 1e-5 * (1.0 + b[r].abs()),
                                        "{format:?} cols={cols} m={m} r0={r0} r={r}: {got} vs {}",
                                        b[r]
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The interleaved Q8_0 layout against ggml's (which `simd_equals_scalar_reference` ties to
    /// the scalar reference): the same integer dot per block, so equal up to f32 summation
    /// order, for block counts below, at and past a chunk (2, 3, 16, 17, 18, 32, 33) and for
    /// one pass of activation rows, several and a partial one; the re-laid bytes are as many
    /// as ggml's and hold the scale and codes (`q + 128`) of three sampled blocks per shape (first,
    /// last, middle) where the layout says (whole
    /// chunks interleaved, the tail in order).
    #[test]
    fn interleaved_q8_equals_ggml_layout() {
        for nb in [2usize, 3, 16, 17, 18, 32, 33] {
            let (rows, cols) = (5, nb * BLOCK);
            let (data, _) = blocks(BlockFormat::Q8_0, rows, cols, 5 + nb as u32);
            let re = interleave_q8(&data, rows, nb);
            assert_eq!(re.len(), data.len());
            for (i, b) in [(0, 0), (rows - 1, nb - 1), (2, nb / 2)] {
                let (src, row) = (&data[(i * nb + b) * 34..][..34], &re[i * nb * 32..]);
                let scale = &re[rows * nb * 32 + 2 * (i * nb + b)..][..2];
                assert_eq!(scale, &src[..2], "nb={nb} scale {i},{b}");
                let (k, j) = (b / CHUNK, b % CHUNK);
                for e in 0..32 {
                    let at = if b < nb / CHUNK * CHUNK {
                        k * 512 + 64 * (e / 4) + 4 * j + e % 4
                    } else {
                        32 * b + e
                    };
                    assert_eq!(row[at], src[2 + e] ^ 0x80, "nb={nb} code {i},{b},{e}");
                }
            }
            let ggml = QMatrix::new(BlockFormat::Q8_0, rows, cols, data.clone()).unwrap();
            let q = QMatrix::relaid(BlockFormat::Q8_0, rows, cols, data).unwrap();
            assert_eq!(q.interleaved, AVX512_Q8);
            for m in [1usize, 3, 8, 9, 17] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| ((i as f32) * 0.291).sin() * (1.0 + (i % 5) as f32))
                    .collect();
                let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
                ggml.matmul(&x, &mut a);
                q.matmul(&x, &mut b);
                for (i, (&u, &v)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (u - v).abs() <= 1e-5 * (1.0 + u.abs()),
                        "nb={nb} m={m} out {i}: {v} vs ggml layout {u}"
                    );
                }
            }
        }
    }

    /// An empty product (no activation rows) writes nothing and does not panic.
    #[test]
    fn empty_product() {
        let (q, _) = matrix(BlockFormat::Q8_0, 4, 64, 3);
        let mut out = vec![];
        q.matmul(&[], &mut out);
    }

    /// Activation quantization by hand: block max 127 → d = 1 exactly, so codes are x rounded
    /// to nearest with ties to even (1.5 → 2, 2.5 → 2, −63.5 → −64), block sum s = d · Σ codes.
    #[test]
    fn activation_quantization_by_hand() {
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = -63.5;
        x[2] = 1.5;
        x[3] = 2.5;
        x[4] = 0.49;
        let a = Activations::quantize(&x, 32);
        assert_eq!(a.d[0], 1.0);
        assert_eq!(&a.codes[..5], &[127, -64, 2, 2, 0]);
        assert_eq!(a.s[0], (127 - 64 + 2 + 2) as f32);
    }

    #[test]
    fn refuses_bad_shapes() {
        assert!(QMatrix::new(BlockFormat::Q8_0, 2, 33, vec![0; 68]).is_none());
        assert!(QMatrix::new(BlockFormat::Q8_0, 2, 32, vec![0; 67]).is_none());
        assert!(QMatrix::new(BlockFormat::Q4_1, 2, 64, vec![0; 80]).is_some());
        assert!(QMatrix::relaid(BlockFormat::Q8_0, 2, 32, vec![0; 67]).is_none());
    }
}
