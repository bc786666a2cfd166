//! Streams: the stored K (or V) rows of one (sequence, kv head) in one format.
//!
//! [`RowStream`] holds fixed-size rows (every per-token format). [`ChannelStream`] holds KIVI's
//! per-channel keys: blocks of `group` tokens quantized per channel, plus a full-precision (f16)
//! residual of the newest tokens.

use super::format::{f16_round_down, f16_round_up, F16Row, RowCodec};

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
    /// the same queries as `qs`); formats without an integer path use `qs` and the f32 path.
    fn dot_rows_int(
        &self,
        t0: usize,
        t1: usize,
        qs: &[f32],
        _q: &super::intdot::QueryI8,
        out: &mut [f32],
    ) {
        self.dot_rows(t0, t1, qs, out)
    }
    /// Weighted sums of rows `t0..t1`: `acc_j += Σ_t w[(t − t0)·nq + j] · row_t`, `acc`:
    /// `[nq, head_dim]`; rows whose weights are all zero are not read.
    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let nq = w.len() / (t1 - t0).max(1);
        axpy_rows_with(t0, t1, w, acc, acc.len() / nq.max(1), |t, r| {
            self.decode(t, r)
        });
    }
    /// Bytes held: codes, scales, zero-points.
    fn bytes(&self) -> usize;
    /// Bytes allocated (capacity).
    fn reserved(&self) -> usize;
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
const TILE: usize = 32;

/// Shared loop of [`Stream::dot_rows`]: decode a tile of rows once, dot it with every query.
#[inline(always)]
fn dot_rows_with(
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
fn axpy_rows_with(
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
}

impl RowStream<super::format::Fp8Row> {
    /// An fp8 stream whose scale is set at the first write; `counted`: its 4 bytes belong to
    /// this stream (per-head scales) rather than to the layer (per-tensor).
    pub fn fp8_external(kind: super::spec::Fp8Kind, head_dim: usize, counted: bool) -> Self {
        let codec = super::format::Fp8Row {
            kind,
            scale: Some(1.0),
        };
        Self {
            codec,
            rb: codec.row_bytes(head_dim),
            head_dim,
            data: Vec::new(),
            scale_state: ScaleState::Pending { counted },
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
        dot_rows_with(t0, t1, qs, out, self.head_dim, |t, r| {
            codec.decode(&data[t * rb..(t + 1) * rb], r)
        });
    }

    fn int_keys(&self) -> bool {
        self.codec.int_keys().is_some()
    }

    fn dot_rows_int(
        &self,
        t0: usize,
        t1: usize,
        qs: &[f32],
        q: &super::intdot::QueryI8,
        out: &mut [f32],
    ) {
        match self.codec.int_keys() {
            Some(f) => super::intdot::scores(f, &self.data, self.rb, t0, t1, q, out),
            None => self.dot_rows(t0, t1, qs, out),
        }
    }

    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let (codec, rb, data) = (self.codec, self.rb, &self.data);
        axpy_rows_with(t0, t1, w, acc, self.head_dim, |t, r| {
            codec.decode(&data[t * rb..(t + 1) * rb], r)
        });
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

    fn swap_remove(&mut self, slot: usize) {
        let last = self.len() - 1;
        if slot != last {
            self.data
                .copy_within(last * self.rb..(last + 1) * self.rb, slot * self.rb);
        }
        self.data.truncate(last * self.rb);
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

/// KIVI's key format (Liu et al. 2024, arXiv 2402.02750, §3.2 and Alg. 1): per-channel
/// quantization over groups of `group` tokens, the newest tokens kept in f16 until `residual`
/// plus a full group have arrived, then the oldest `group` of them are quantized together.
///
/// - 8-bit: symmetric, one f16 absmax scale per channel per block; codes `[group, d]` i8.
/// - 4-bit: asymmetric, f16 scale and f16 minimum per channel per block; codes `[group, d/2]`
///   bytes (channel `2j` low nibble, `2j+1` high nibble).
#[derive(Debug, Clone)]
pub struct ChannelStream {
    bits: u8,
    group: usize,
    residual: usize,
    d: usize,
    /// Quantized blocks: per block, params (`d` f16 scales, then for 4-bit `d` f16 minimums)
    /// followed by codes.
    blocks: Vec<u8>,
    n_blocks: usize,
    /// f16 rows of the newest tokens.
    resid: Vec<u8>,
}

impl ChannelStream {
    /// An empty stream.
    pub fn new(bits: u8, group: usize, residual: usize, head_dim: usize) -> Self {
        Self {
            bits,
            group,
            residual,
            d: head_dim,
            blocks: Vec::new(),
            n_blocks: 0,
            resid: Vec::new(),
        }
    }

    fn params_bytes(&self) -> usize {
        self.d * if self.bits == 8 { 2 } else { 4 }
    }

    fn code_row_bytes(&self) -> usize {
        self.d * self.bits as usize / 8
    }

    fn block_bytes(&self) -> usize {
        self.params_bytes() + self.group * self.code_row_bytes()
    }

    fn resid_rows(&self) -> usize {
        self.resid.len() / (2 * self.d)
    }

    /// Quantizes the oldest `group` residual rows into one block.
    fn quantize_oldest_group(&mut self) {
        let (d, g) = (self.d, self.group);
        let mut x = vec![0f32; g * d];
        for t in 0..g {
            F16Row.decode(
                &self.resid[t * 2 * d..(t + 1) * 2 * d],
                &mut x[t * d..(t + 1) * d],
            );
        }
        let mut block = vec![0u8; self.block_bytes()];
        let (params, codes) = block.split_at_mut(self.params_bytes());
        let crb = self.code_row_bytes();
        for c in 0..d {
            let col = (0..g).map(|t| x[t * d + c]);
            if self.bits == 8 {
                let absmax = col.fold(0f32, |m, v| m.max(v.abs()));
                let s = f16_round_up(absmax / 127.0);
                params[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
                let inv = if s.to_f32() > 0.0 {
                    1.0 / s.to_f32()
                } else {
                    0.0
                };
                for t in 0..g {
                    codes[t * crb + c] =
                        (x[t * d + c] * inv).round().clamp(-127.0, 127.0) as i8 as u8;
                }
            } else {
                let (lo, hi) = col.fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), v| {
                    (l.min(v), h.max(v))
                });
                let m = f16_round_down(lo);
                let s = f16_round_up((hi - m.to_f32()) / 15.0);
                params[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
                params[2 * d + 2 * c..2 * d + 2 * c + 2].copy_from_slice(&m.to_le_bytes());
                let inv = if s.to_f32() > 0.0 {
                    1.0 / s.to_f32()
                } else {
                    0.0
                };
                for t in 0..g {
                    let q = ((x[t * d + c] - m.to_f32()) * inv).round().clamp(0.0, 15.0) as u8;
                    codes[t * crb + c / 2] |= if c % 2 == 0 { q } else { q << 4 };
                }
            }
        }
        self.blocks.extend_from_slice(&block);
        self.n_blocks += 1;
        self.resid.drain(..g * 2 * d);
    }
}

/// The f32 scales (and, for 4-bit, minimums) of the block last decoded.
#[derive(Debug, Default)]
struct BlockParams {
    block: Option<usize>,
    scale: Vec<f32>,
    min: Vec<f32>,
}

impl ChannelStream {
    /// Dequantizes the row in `slot`, reusing `params` when the slot's block is the one decoded
    /// last (rows are read in order, so each block's parameters are decoded once).
    #[inline]
    fn decode_with(&self, slot: usize, out: &mut [f32], params: &mut BlockParams) {
        let (d, g) = (self.d, self.group);
        let quantized = self.n_blocks * g;
        if slot >= quantized {
            let r = slot - quantized;
            return F16Row.decode(&self.resid[r * 2 * d..(r + 1) * 2 * d], out);
        }
        let b = slot / g;
        let block = &self.blocks[b * self.block_bytes()..][..self.block_bytes()];
        let (raw, codes) = block.split_at(self.params_bytes());
        if params.block != Some(b) {
            params.scale.resize(d, 0.0);
            F16Row.decode(&raw[..2 * d], &mut params.scale);
            if self.bits == 4 {
                params.min.resize(d, 0.0);
                F16Row.decode(&raw[2 * d..4 * d], &mut params.min);
            }
            params.block = Some(b);
        }
        let crb = self.code_row_bytes();
        let row = &codes[(slot % g) * crb..][..crb];
        if self.bits == 8 {
            for ((o, &c), &s) in out.iter_mut().zip(row).zip(&params.scale) {
                *o = (c as i8) as f32 * s;
            }
        } else {
            for (c2, (o, (m, s))) in out
                .chunks_exact_mut(2)
                .zip(params.min.chunks_exact(2).zip(params.scale.chunks_exact(2)))
                .enumerate()
            {
                let byte = row[c2];
                o[0] = m[0] + (byte & 0x0f) as f32 * s[0];
                o[1] = m[1] + (byte >> 4) as f32 * s[1];
            }
        }
    }
}

impl Stream for ChannelStream {
    fn push(&mut self, rows: &[f32]) -> usize {
        let start = self.resid.len();
        let n = rows.len() / self.d;
        self.resid.resize(start + n * 2 * self.d, 0);
        for (x, out) in rows
            .chunks_exact(self.d)
            .zip(self.resid[start..].chunks_exact_mut(2 * self.d))
        {
            F16Row.encode(x, out);
        }
        while self.resid_rows() >= self.residual + self.group {
            self.quantize_oldest_group();
        }
        0
    }

    fn decode(&self, slot: usize, out: &mut [f32]) {
        self.decode_with(slot, out, &mut BlockParams::default());
    }

    // A block's per-channel scales (and minimums) are decoded once per block, not per row.
    fn dot_rows(&self, t0: usize, t1: usize, qs: &[f32], out: &mut [f32]) {
        let mut params = BlockParams::default();
        dot_rows_with(t0, t1, qs, out, self.d, |t, r| {
            self.decode_with(t, r, &mut params)
        });
    }

    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let mut params = BlockParams::default();
        axpy_rows_with(t0, t1, w, acc, self.d, |t, r| {
            self.decode_with(t, r, &mut params)
        });
    }

    fn len(&self) -> usize {
        self.n_blocks * self.group + self.resid_rows()
    }

    fn bytes(&self) -> usize {
        self.blocks.len() + self.resid.len()
    }

    fn reserved(&self) -> usize {
        self.blocks.capacity() + self.resid.capacity()
    }

    fn swap_remove(&mut self, _slot: usize) {
        unreachable!("KvScheme::from_str rejects eviction over per-channel keys")
    }

    fn clear(&mut self) {
        self.blocks.clear();
        self.resid.clear();
        self.n_blocks = 0;
    }
}

/// In-place normalized Walsh–Hadamard transform of each block of `block` values (a power of
/// two): `x ← H x / √block`. Orthogonal and its own inverse, so rotating Q and K preserves
/// every q·k, and rotating V is undone by rotating the attention output (QuaRot §3).
pub fn hadamard(x: &mut [f32], block: usize) {
    let norm = 1.0 / (block as f32).sqrt();
    for b in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < block {
            for i in (0..block).step_by(2 * h) {
                for j in i..i + h {
                    let (a, c) = (b[j], b[j + h]);
                    b[j] = a + c;
                    b[j + h] = a - c;
                }
            }
            h *= 2;
        }
        b.iter_mut().for_each(|v| *v *= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// H₄/2 by hand: (1,0,0,0) → (½,½,½,½); (1,2,3,4) → (5, −1, −2, 0); applying twice restores.
    #[test]
    fn hadamard_by_hand() {
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        hadamard(&mut x, 4);
        assert_eq!(x, [0.5; 4]);
        let mut y = [1.0f32, 2.0, 3.0, 4.0];
        hadamard(&mut y, 4);
        assert_eq!(y, [5.0, -1.0, -2.0, 0.0]);
        hadamard(&mut y, 4);
        assert_eq!(y, [1.0, 2.0, 3.0, 4.0]);
    }

    /// KIVI stream: 8 tokens, group 4, residual 2 → after 8 pushes, one block of 4 quantized
    /// and 4 rows in f16 (4 < residual + group = 6 would trigger again only at 6... here 8 − 4 = 4
    /// rows remain, under 6). Channel scales by hand: channel 0 holds 1..4 → scale 4/127.
    #[test]
    fn channel_stream_groups_by_hand() {
        let d = 2;
        let mut s = ChannelStream::new(8, 4, 2, d);
        for t in 0..8 {
            s.push(&[(t + 1) as f32, -((t + 1) as f32) * 0.5]);
        }
        assert_eq!(s.n_blocks, 1);
        assert_eq!(s.len(), 8);
        // bytes: block = 2 channels × 2 (f16 scale) + 4 tokens × 2 codes = 12; resid 4 × 4 = 16.
        assert_eq!(s.bytes(), 12 + 16);
        assert_eq!(
            s.bytes(),
            super::super::spec::KvScheme::stream_bytes(
                super::super::spec::Quant::Channel {
                    bits: 8,
                    group: 4,
                    residual: 2
                },
                d,
                8
            )
        );
        let mut out = [0f32; 2];
        s.decode(3, &mut out); // token 4: channel 0 = 4 = 127 · scale exactly
        let scale = f16_round_up(4.0 / 127.0).to_f32();
        assert_eq!(out[0], 127.0 * scale);
        s.decode(7, &mut out); // residual, exact in f16
        assert_eq!(out, [8.0, -4.0]);
    }
}
