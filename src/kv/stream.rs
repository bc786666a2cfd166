//! Streams: the stored K (or V) rows of one (sequence, kv head) in one format.
//!
//! [`RowStream`] holds fixed-size rows (every per-token format); formats with another layout
//! bring their own stream (KIVI's per-channel keys: [`super::formats::channel::ChannelStream`]).

use super::codec::RowCodec;

/// The stored rows of one (sequence, kv head, K or V).
pub trait Stream: Send + Sync + std::fmt::Debug {
    /// Appends rows (`[n, head_dim]` f32). Returns how many values saturated.
    fn push(&mut self, rows: &[f32]) -> usize;
    /// Dequantizes the row in `slot` into `out` (`head_dim` f32).
    fn decode(&self, slot: usize, out: &mut [f32]);
    /// Rows held.
    fn len(&self) -> usize;
    /// Whether no row is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Raw dot products of rows `t0..t1` with `nq` queries (`qs`: `[nq, head_dim]`):
    /// `out[(t − t0)·nq + j] = q_j · row_t`.
    fn dot_rows(&self, t0: usize, t1: usize, qs: &[f32], out: &mut [f32]) {
        let nq = out.len() / (t1 - t0).max(1);
        dot_rows_with(t0, t1, qs, out, qs.len() / nq.max(1), |t, r| {
            self.decode(t, r)
        });
    }
    /// Whether [`dot_rows_int`](Self::dot_rows_int) scores on the stored codes (int8 and
    /// 4-bit key formats) rather than falling back to [`dot_rows`](Self::dot_rows).
    fn int_keys(&self) -> bool {
        false
    }
    /// [`dot_rows`](Self::dot_rows) on the stored codes with queries quantized to int8 (`q`,
    /// the same queries as `qs`, quantized when first asked for); formats without an integer
    /// path use `qs` and the f32 path.
    fn dot_rows_int(
        &self,
        t0: usize,
        t1: usize,
        qs: &[f32],
        _q: &super::intdot::LazyQueryI8<'_>,
        out: &mut [f32],
    ) {
        self.dot_rows(t0, t1, qs, out)
    }
    /// Weighted sums of rows `t0..t1`: `acc_j += Σ_t w[(t − t0)·nq + j] · row_t`, `acc`:
    /// `[nq, head_dim]`; rows whose weights are all zero may be skipped unread (the code
    /// kernels skip such rows, the decoded and f16 paths whole 32-row tiles of them).
    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let nq = w.len() / (t1 - t0).max(1);
        axpy_rows_with(t0, t1, w, acc, acc.len() / nq.max(1), |t, r| {
            self.decode(t, r)
        });
    }
    /// [`axpy_rows`](Self::axpy_rows) as attention runs it when timed: on the codes where the
    /// format has a code path ([`super::codeaxpy`]) that the exact path does not take (the
    /// same sums up to f32 rounding); formats without one use `axpy_rows`.
    fn axpy_rows_fast(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        self.axpy_rows(t0, t1, w, acc)
    }
    /// Bytes held: codes, scales, zero-points.
    fn bytes(&self) -> usize;
    /// Bytes allocated (capacity).
    fn reserved(&self) -> usize;
    /// Allocates room for `rows` rows in all (held ones included) up front, so pushes up to
    /// that many never reallocate: a growing buffer that doubles copies the whole stream in
    /// the push that crosses its capacity, and on the first decode step after a prefill that
    /// filled the buffer exactly, every (layer, sequence, head) stream did it at once (fp16,
    /// batch 8 × 512 tokens: 95 MB copied, that step 2–6× a steady one, inside TPOT). On an
    /// empty stream the buffer is replaced by one of exactly that room (so it also shrinks).
    /// Changes no row; formats whose buffers are not one row per slot may keep growing on
    /// demand.
    fn reserve(&mut self, rows: usize) {
        let _ = rows;
    }
    /// Drops the row in `slot`, moving the last row into its place (eviction).
    fn swap_remove(&mut self, slot: usize);
    /// Drops every row, keeping allocations.
    fn clear(&mut self);
    /// Whether an external scale must be set before the first push (fp8 per-head/per-tensor).
    fn needs_scale(&self) -> bool {
        false
    }
    /// Sets the external scale.
    fn set_scale(&mut self, _scale: f32) {}
}

/// Rows decoded per tile: 32 rows × head_dim f32 stay in L1 while every query uses them.
const TILE: usize = super::simd::TILE_ROWS;

/// Shared loop of [`Stream::dot_rows`]: decode a tile of rows once, dot it with every query.
#[inline(always)]
pub(crate) fn dot_rows_with(
    t0: usize,
    t1: usize,
    qs: &[f32],
    out: &mut [f32],
    d: usize,
    mut decode: impl FnMut(usize, &mut [f32]),
) {
    let nq = qs.len() / d;
    let mut tile = vec![0f32; TILE * d];
    let mut t = t0;
    while t < t1 {
        let n = (t1 - t).min(TILE);
        for r in 0..n {
            decode(t + r, &mut tile[r * d..(r + 1) * d]);
        }
        let o = &mut out[(t - t0) * nq..(t - t0 + n) * nq];
        super::simd::tile_dots(&tile[..n * d], qs, d, o);
        t += n;
    }
}

/// Shared loop of [`Stream::axpy_rows`]; tiles whose weights are all zero are not read.
#[inline(always)]
pub(crate) fn axpy_rows_with(
    t0: usize,
    t1: usize,
    w: &[f32],
    acc: &mut [f32],
    d: usize,
    mut decode: impl FnMut(usize, &mut [f32]),
) {
    let nq = acc.len() / d;
    let mut tile = vec![0f32; TILE * d];
    let mut t = t0;
    while t < t1 {
        let n = (t1 - t).min(TILE);
        let wt = &w[(t - t0) * nq..(t - t0 + n) * nq];
        if wt.iter().any(|&x| x != 0.0) {
            for r in 0..n {
                decode(t + r, &mut tile[r * d..(r + 1) * d]);
            }
            super::simd::tile_axpy(wt, &tile[..n * d], d, acc);
        }
        t += n;
    }
}

/// Capacity for `bytes` in `data` ([`Stream::reserve`]): a fresh buffer of exactly that
/// room when `data` is empty, else at least that much.
pub(crate) fn reserve_buffer(data: &mut Vec<u8>, bytes: usize) {
    if data.is_empty() {
        *data = Vec::with_capacity(bytes);
    } else {
        data.reserve_exact(bytes.saturating_sub(data.len()));
    }
}

/// Fixed-size rows in a flat byte buffer.
#[derive(Debug, Clone)]
pub struct RowStream<C: RowCodec> {
    codec: C,
    rb: usize,
    head_dim: usize,
    data: Vec<u8>,
    /// Whether `codec` still waits for its external scale, and whether one is counted in bytes.
    scale_state: ScaleState,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ScaleState {
    /// The codec needs no external scale.
    NotNeeded,
    /// An external scale must be set; `counted` says whether it belongs to this stream's bytes
    /// (per-head) or to the layer (per-tensor).
    Pending { counted: bool },
    /// Set.
    Set { counted: bool },
}

impl<C: RowCodec> RowStream<C> {
    /// An empty stream.
    pub fn new(codec: C, head_dim: usize) -> Self {
        Self {
            codec,
            rb: codec.row_bytes(head_dim),
            head_dim,
            data: Vec::new(),
            scale_state: ScaleState::NotNeeded,
        }
    }

    /// An empty stream whose codec's external scale is set at the first write (fp8 with
    /// per-head or per-tensor scales); `counted`: its 4 bytes belong to this stream (per-head)
    /// rather than to the layer (per-tensor).
    pub fn with_pending_scale(codec: C, head_dim: usize, counted: bool) -> Self {
        Self {
            scale_state: ScaleState::Pending { counted },
            ..Self::new(codec, head_dim)
        }
    }
}

impl<C: RowCodec + std::fmt::Debug> Stream for RowStream<C> {
    fn push(&mut self, rows: &[f32]) -> usize {
        let n = rows.len() / self.head_dim;
        let start = self.data.len();
        self.data.resize(start + n * self.rb, 0);
        rows.chunks_exact(self.head_dim)
            .zip(self.data[start..].chunks_exact_mut(self.rb))
            .map(|(x, out)| self.codec.encode(x, out))
            .sum()
    }

    #[inline]
    fn decode(&self, slot: usize, out: &mut [f32]) {
        self.codec
            .decode(&self.data[slot * self.rb..(slot + 1) * self.rb], out)
    }

    // Monomorphized per codec: the row decode inlines into the loop (no call per row).
    fn dot_rows(&self, t0: usize, t1: usize, qs: &[f32], out: &mut [f32]) {
        let (codec, rb, data) = (self.codec, self.rb, &self.data);
        let d = self.head_dim;
        if let Some(k) = codec.widen() {
            if super::simd::row_dots(k, data, rb, (t0, t1), qs, d, out) {
                return;
            }
        }
        dot_rows_with(t0, t1, qs, out, self.head_dim, |t, r| {
            super::simd::prefetch_ahead(data, t * rb, rb);
            codec.decode(&data[t * rb..(t + 1) * rb], r)
        });
    }

    fn int_keys(&self) -> bool {
        self.int_format().is_some()
    }

    fn dot_rows_int(
        &self,
        t0: usize,
        t1: usize,
        qs: &[f32],
        q: &super::intdot::LazyQueryI8<'_>,
        out: &mut [f32],
    ) {
        match self.int_format() {
            Some(f) => super::intdot::scores(f, &self.data, self.rb, t0, t1, q.get(), out),
            None => self.dot_rows(t0, t1, qs, out),
        }
    }

    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        self.axpy_rows_on(t0, t1, w, acc, true)
    }

    fn axpy_rows_fast(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        self.axpy_rows_on(t0, t1, w, acc, false)
    }

    fn len(&self) -> usize {
        self.data.len() / self.rb
    }

    fn bytes(&self) -> usize {
        let scale = matches!(self.scale_state, ScaleState::Set { counted: true }) as usize * 4;
        self.data.len() + scale
    }

    fn reserved(&self) -> usize {
        self.data.capacity()
            + matches!(self.scale_state, ScaleState::Set { counted: true }) as usize * 4
    }

    fn reserve(&mut self, rows: usize) {
        reserve_buffer(&mut self.data, rows * self.rb);
    }

    fn swap_remove(&mut self, slot: usize) {
        swap_remove_row(&mut self.data, self.rb, slot);
    }

    fn clear(&mut self) {
        self.data.clear();
        if let ScaleState::Set { counted } = self.scale_state {
            self.scale_state = ScaleState::Pending { counted };
        }
    }

    fn needs_scale(&self) -> bool {
        matches!(self.scale_state, ScaleState::Pending { .. })
    }

    fn set_scale(&mut self, scale: f32) {
        if let ScaleState::Pending { counted } = self.scale_state {
            self.codec.set_scale(scale);
            self.scale_state = ScaleState::Set { counted };
        }
    }
}

impl<C: RowCodec> RowStream<C> {
    /// The codec's integer key form where its layout is the stored one (int4 with two groups
    /// per row has longer rows than `int4-row`'s one group, and keeps the f32 path).
    fn int_format(&self) -> Option<super::intdot::IntKeys> {
        self.codec
            .int_keys()
            .filter(|f| self.head_dim.is_multiple_of(32) && f.row_bytes(self.head_dim) == self.rb)
    }

    /// P·V over rows `t0..t1` ([`Stream::axpy_rows`]): on the codes when the format has a
    /// code path and `head_dim` is a multiple of 32, for the exact path only where
    /// [`super::codeaxpy::CodeValues::exact`] says so; otherwise on rows decoded to f32.
    fn axpy_rows_on(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32], exact: bool) {
        let (codec, rb, data) = (self.codec, self.rb, &self.data);
        if let Some(k) = codec.widen() {
            if super::simd::row_axpy(k, data, rb, (t0, t1), w, self.head_dim, acc) {
                return;
            }
        }
        if let Some(f) = codec.code_values().filter(|f| f.exact() || !exact) {
            // The kernel's layout must be the stored one (int4 with two groups per row has
            // longer rows than `int4-row`'s one group).
            if self.head_dim.is_multiple_of(32) && f.row_bytes(self.head_dim) == rb {
                let d = self.head_dim;
                return if exact {
                    super::codeaxpy::axpy_codes(f, data, rb, d, t0, t1, w, acc)
                } else {
                    super::codeaxpy::axpy_codes_timed(f, data, rb, d, t0, t1, w, acc)
                };
            }
        }
        axpy_rows_with(t0, t1, w, acc, self.head_dim, |t, r| {
            super::simd::prefetch_ahead(data, t * rb, rb);
            codec.decode(&data[t * rb..(t + 1) * rb], r)
        });
    }
}

/// Removes row `slot` from `data` (rows of `row_bytes` bytes) by moving the last row into its
/// place (eviction's O(1) removal; row order is not kept). Panics on an empty buffer or a slot
/// out of range (a caller's bookkeeping bug).
pub(crate) fn swap_remove_row(data: &mut Vec<u8>, row_bytes: usize, slot: usize) {
    let last = data.len() / row_bytes - 1;
    assert!(slot <= last, "slot {slot} of {} rows", last + 1);
    if slot != last {
        data.copy_within(last * row_bytes..(last + 1) * row_bytes, slot * row_bytes);
    }
    data.truncate(last * row_bytes);
}
