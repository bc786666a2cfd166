//! `int8-channel[:group=G,residual=R]`, `int4-channel[:…]` and `int2-channel[:…]`: KIVI's
//! per-channel keys (Liu et al. 2024, arXiv 2402.02750, §3.2 and Alg. 1; 2 bits is KIVI-2). Keys are quantized per channel over groups of
//! `G` tokens; the newest tokens stay f16 until `R` plus a full group have arrived, then the
//! oldest `G` of them are quantized together. A lone `int8-channel` means KIVI's pairing: keys
//! per-channel, values per-token at the same bit width (int8-token / int4 / int2). Keys only, and no
//! eviction (evicting single tokens would break the token groups). The CUDA kernels implement
//! the 8-bit form (`CHAN8`).

use std::fmt;

use super::contract::{Format, FormatSpec};
use super::gpu::{self, GpuFormat};
use crate::kv::codec::{f16_round_down, f16_round_up, RowCodec};
use crate::kv::formats::fp16::F16Row;
use crate::kv::params::Params;
use crate::kv::stream::{axpy_rows_with, dot_rows_with, Stream};
use crate::kv::quant::asym::{asym_code, asym_params};

/// Default token-group size of per-channel key quantization (KIVI §4: G = 32).
pub const DEFAULT_CHANNEL_GROUP: usize = 32;
/// Default full-precision residual of per-channel key quantization (KIVI uses R = 128; we keep
/// the same so short prompts are not quantized at all, as in KIVI).
pub const DEFAULT_RESIDUAL: usize = 128;

/// The per-channel key formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channel {
    /// Code width: 8 (symmetric, f16 absmax scale per channel and block) or 4 or 2
    /// (asymmetric, f16 scale and minimum per channel and block).
    pub bits: u8,
    /// Tokens per quantized group (> 0; even for 4-bit).
    pub group: usize,
    /// Newest tokens kept in f16 before a group is quantized.
    pub residual: usize,
}

impl FormatSpec for Channel {
    const NAMES: &'static [&'static str] = &["int8-channel", "int4-channel", "int2-channel"];
    const HELP: &'static str = "int8-channel[:group=G,residual=R], \
                                int4-channel[:group=G,residual=R], \
                                int2-channel[:group=G,residual=R]";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        let bits = match p.name {
            "int8-channel" => 8,
            "int4-channel" => 4,
            _ => 2,
        };
        let (mut group, mut residual) = (DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL);
        for &(k, v) in &p.pairs {
            match k {
                "group" => group = p.num(k, v)?,
                "residual" => residual = p.num(k, v)?,
                _ => return Err(p.unknown(k, "group=G,residual=R")),
            }
        }
        if group == 0 || (bits == 4 && group % 2 != 0) {
            return Err(format!("token group {group} must be > 0 (even for int4)"));
        }
        Ok(Channel {
            bits,
            group,
            residual,
        })
    }
}

impl Format for Channel {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "int{}-channel", self.bits)?;
        if (self.group, self.residual) != (DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL) {
            write!(f, ":group={},residual={}", self.group, self.residual)?;
        }
        Ok(())
    }
    fn validate(&self, d: usize) -> Result<(), String> {
        if self.bits == 4 && !d.is_multiple_of(2) {
            return Err(format!("4-bit codes need an even head_dim (model: {d})"));
        }
        if self.bits == 2 && !d.is_multiple_of(4) {
            return Err(format!(
                "2-bit codes need head_dim a multiple of 4 (model: {d}); use int4-channel"
            ));
        }
        Ok(())
    }
    /// The residual rows' f16 size; quantized blocks are counted in [`Self::stream_bytes`].
    fn row_bytes(&self, d: usize) -> usize {
        2 * d
    }
    fn stream_bytes(&self, d: usize, n: usize) -> usize {
        let Channel {
            bits,
            group,
            residual,
        } = *self;
        let quantized = if n >= residual + group {
            (n - residual) / group * group
        } else {
            0
        };
        let blocks = quantized / group;
        let codes = group * d * bits as usize / 8;
        let params = d * if bits == 8 { 2 } else { 4 };
        blocks * (codes + params) + (n - quantized) * 2 * d
    }
    fn token_group(&self) -> usize {
        self.group
    }
    fn per_channel(&self) -> bool {
        true
    }
    /// KIVI's values: per-token at the same width, default groups (`int8` is int8-token,
    /// `int4` groups of 32, `int2` groups of 32).
    fn value_partner(&self) -> Option<&'static str> {
        Some(match self.bits {
            8 => "int8",
            4 => "int4",
            _ => "int2",
        })
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        Box::new(ChannelStream::new(self.bits, self.group, self.residual, d))
    }
    fn gpu(&self) -> Option<GpuFormat> {
        (self.bits == 8).then_some(GpuFormat {
            id: gpu::CHAN8,
            group: self.group,
            residual: self.residual,
            block: 0,
            meta: 0,
            head: 0,
            bits: 8,
            token_group: self.group,
        })
    }
}

/// KIVI's key format (Liu et al. 2024, arXiv 2402.02750, §3.2 and Alg. 1): per-channel
/// quantization over groups of `group` tokens, the newest tokens kept in f16 until `residual`
/// plus a full group have arrived, then the oldest `group` of them are quantized together.
///
/// - 8-bit: symmetric, one f16 absmax scale per channel per block; codes `[group, d]` i8.
/// - 4-bit: asymmetric, f16 scale and f16 minimum per channel per block; codes `[group, d/2]`
///   bytes (channel `2j` low nibble, `2j+1` high nibble).
/// - 2-bit: as 4-bit with 4 levels ([`asym_params`], [`asym_code`]); codes `[group, d/4]` bytes
///   packed LSB-first (as [`crate::kv::quant::bits::pack_bits`]: channel `4j + i` at bits `2i..2i+2` of byte `j`).
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
            } else if self.bits == 2 {
                let (lo, hi) = col.fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), v| {
                    (l.min(v), h.max(v))
                });
                let (s, m) = asym_params(lo, hi, 2);
                params[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
                params[2 * d + 2 * c..2 * d + 2 * c + 2].copy_from_slice(&m.to_le_bytes());
                for t in 0..g {
                    let q = asym_code(x[t * d + c], s, m, 2);
                    codes[t * crb + c / 4] |= q << (2 * (c % 4));
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
            if self.bits != 8 {
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
        } else if self.bits == 2 {
            for (c, o) in out.iter_mut().enumerate() {
                let q = (row[c / 4] >> (2 * (c % 4))) & 3;
                *o = params.min[c] + q as f32 * params.scale[c];
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

#[cfg(test)]
mod tests {
    use super::*;

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
            Channel {
                bits: 8,
                group: 4,
                residual: 2
            }
            .stream_bytes(d, 8)
        );
        let mut out = [0f32; 2];
        s.decode(3, &mut out); // token 4: channel 0 = 4 = 127 · scale exactly
        let scale = f16_round_up(4.0 / 127.0).to_f32();
        assert_eq!(out[0], 127.0 * scale);
        s.decode(7, &mut out); // residual, exact in f16
        assert_eq!(out, [8.0, -4.0]);
    }

    /// KIVI-2 block by hand: d = 4, group 4, residual 0, so 4 tokens make one block. Channel 0
    /// holds 0, 1, 2, 3 → min 0, step 3/3 = 1 (exact in f16), codes 0..3, decoded exactly;
    /// channel 1 holds −1, 0, 0.4, 2 → min −1, step 1, codes 0, 1, 1 (1.4 rounds to 1), 3 →
    /// −1, 0, 0, 2 (error 0.4 ≤ step/2); channels 2 and 3 are 0 → step 0, code 0. Token 3's
    /// code byte: channel 0 code 3 in bits 0–1, channel 1 code 3 in bits 2–3 → 0b1111. Bytes:
    /// 4 channels × (f16 step + f16 min) = 16, plus 4 tokens × 1 code byte = 20.
    #[test]
    fn two_bit_channel_block_by_hand() {
        let mut s = ChannelStream::new(2, 4, 0, 4);
        let ch1 = [-1.0, 0.0, 0.4, 2.0];
        for (t, &c1) in ch1.iter().enumerate() {
            s.push(&[t as f32, c1, 0.0, 0.0]);
        }
        assert_eq!(s.n_blocks, 1);
        assert_eq!(s.bytes(), 20);
        let fmt = Channel {
            bits: 2,
            group: 4,
            residual: 0,
        };
        assert_eq!(fmt.stream_bytes(4, 4), 20);
        assert_eq!(s.blocks[16 + 3], 0b1111);
        let mut out = [0f32; 4];
        for (t, want) in [
            [0.0, -1.0, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0],
            [2.0, 0.0, 0.0, 0.0],
            [3.0, 2.0, 0.0, 0.0],
        ]
        .iter()
        .enumerate()
        {
            s.decode(t, &mut out);
            assert_eq!(&out, want, "token {t}");
        }
        assert!(Channel {
            bits: 2,
            group: 32,
            residual: 128
        }
        .validate(6)
        .is_err());
    }
}
