//! `int2[:group=G|row]`, `int3[:group=G|row]` and `int4-row`: asymmetric uniform quantization
//! along head_dim at 2, 3 or 4 bits ([`UniformGroupRow`]): per group of `G` elements an f16
//! scale, an f16 minimum and `G` codes packed LSB-first, `x ≈ m + q·s`, `q ∈ [0, 2^B − 1]`.
//!
//! - `int2` (default group 32): KIVI's 2-bit per-token values (Liu et al. 2024, arXiv
//!   2402.02750, §3.2 and §4: group 32); `d/32 · (4 + 8)` bytes per row.
//! - `int3:group=row`, `int4-row`: one group per row, TurboQuant's values as vLLM stores them
//!   (`value_packed_size = ceil(d·B/8) + 4`); `int4-row` has the bytes of `int4:group=d`.
//!
//! `group·B` must be a whole number of bytes and `G` must divide head_dim. Round trip:
//! `|x − x̂| ≤ s/2` per element. CPU only: no CUDA kernels yet.

use std::fmt;

use half::f16;

use super::contract::{Format, FormatSpec};
use crate::error::Error;
use crate::kv::codec::RowCodec;
use crate::kv::params::Params;
use crate::kv::quant::asym::{asym_code, asym_params};
use crate::kv::quant::bits::{affine_codes_to_f32, pack_bits, packed_bytes};
use crate::kv::stream::{RowStream, Stream};

/// Default group of `int2` and `int3` (KIVI's 32).
pub const DEFAULT_UNIFORM_GROUP: usize = 32;

/// The b-bit uniform per-token formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Uniform {
    /// Bits per code: 2, 3 or 4.
    pub bits: u8,
    /// Elements per group along head_dim; 0: one group per row.
    pub group: usize,
}

impl Uniform {
    /// The codec for rows of `d` elements.
    pub fn codec(&self, d: usize) -> Result<UniformGroupRow, String> {
        let g = if self.group == 0 { d } else { self.group };
        UniformGroupRow::new(self.bits, g).map_err(|e| e.to_string())
    }
}

impl FormatSpec for Uniform {
    const NAMES: &'static [&'static str] = &["int2", "int3", "int4-row"];
    const HELP: &'static str = "int2[:group=G|row], int3[:group=G|row], int4-row";
    fn parse(p: &Params<'_>) -> Result<Self, String> {
        if p.name == "int4-row" {
            p.none()?;
            return Ok(Uniform { bits: 4, group: 0 });
        }
        let bits = if p.name == "int2" { 2 } else { 3 };
        let mut group = DEFAULT_UNIFORM_GROUP;
        for &(k, v) in &p.pairs {
            match k {
                "group" if v == "row" => group = 0,
                "group" => {
                    group = p.num(k, v)?;
                    if group == 0 {
                        return Err(format!("{} group must be > 0 (or `row`)", p.name));
                    }
                }
                _ => return Err(p.unknown(k, "group=G|row")),
            }
        }
        if group != 0 && !(group * bits as usize).is_multiple_of(8) {
            return Err(format!(
                "{} group {group} must be > 0 with group × {bits} bits a whole number of bytes \
                 (a multiple of {})",
                p.name,
                if bits == 2 { 4 } else { 8 }
            ));
        }
        Ok(Uniform { bits, group })
    }
}

impl Format for Uniform {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.bits, self.group) {
            (4, _) => write!(f, "int4-row"),
            (b, DEFAULT_UNIFORM_GROUP) => write!(f, "int{b}"),
            (b, 0) => write!(f, "int{b}:group=row"),
            (b, g) => write!(f, "int{b}:group={g}"),
        }
    }
    fn validate(&self, d: usize) -> Result<(), String> {
        let c = self.codec(d)?;
        c.validate(d).map_err(|e| format!("int{}: {e}", self.bits))
    }
    /// `d/G · (4 + G·B/8)`.
    fn row_bytes(&self, d: usize) -> usize {
        let g = if self.group == 0 { d } else { self.group };
        d / g * (4 + g * self.bits as usize / 8)
    }
    fn new_stream(&self, d: usize) -> Box<dyn Stream> {
        let c = self
            .codec(d)
            .unwrap_or_else(|e| panic!("validated before use: {e}"));
        debug_assert_eq!(c.row_bytes(d), self.row_bytes(d));
        Box::new(RowStream::new(c, d))
    }
}

/// Asymmetric uniform quantization at 2, 3 or 4 bits per group of `group` elements along
/// head_dim: per group an f16 scale, an f16 minimum, then `group` codes packed at `bits`
/// (LSB-first): `head_dim/group · (4 + group·bits/8)` bytes per row.
///
/// - TurboQuant values (vLLM: `value_packed_size = ceil(d·b/8) + 4`, one group = the row):
///   `UniformGroupRow { bits, group: head_dim }`.
/// - KIVI's 2-bit per-token values (KIVI §3.2, group 32): `UniformGroupRow { bits: 2, group: 32 }`.
/// - At 4 bits the bytes equal [`super::int4::Int4GroupRow`]'s for the same group.
///
/// Round trip: `|x − x̂| ≤ s/2` per element with `s` the group's stored step (plus f32
/// rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniformGroupRow {
    bits: u8,
    group: usize,
}

impl UniformGroupRow {
    /// A codec at `bits` (2–4) with `group` elements per group.
    /// Errors: [`Error::InvalidArgument`] for other widths, a zero group or one whose codes do
    /// not fill whole bytes (`group·bits` not a multiple of 8).
    pub fn new(bits: u8, group: usize) -> crate::error::Result<Self> {
        if !(2..=4).contains(&bits) {
            return Err(Error::InvalidArgument { name: "uniform bits".into(), reason: format!("{bits} is not supported; use 2, 3 or 4") });
        }
        if group == 0 || !(group * bits as usize).is_multiple_of(8) {
            return Err(Error::InvalidArgument { name: "group".into(), reason: format!("{group} elements × {bits} bits must be a positive whole number of bytes") });
        }
        Ok(Self { bits, group })
    }

    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Elements per group.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Checks a head_dim against the group. Errors: `head_dim` not a multiple of the group.
    pub fn validate(&self, head_dim: usize) -> crate::error::Result<()> {
        if head_dim == 0 || !head_dim.is_multiple_of(self.group) {
            return Err(Error::InvalidArgument { name: "head_dim".into(), reason: format!("{head_dim} must be a multiple of the group {}", self.group) });
        }
        Ok(())
    }

    fn block(&self) -> usize {
        4 + packed_bytes(self.group, self.bits)
    }
}

impl RowCodec for UniformGroupRow {
    fn row_bytes(&self, head_dim: usize) -> usize {
        head_dim / self.group * self.block()
    }

    fn encode(&self, x: &[f32], out: &mut [u8]) -> usize {
        let mut codes = vec![0u8; self.group];
        for (xs, o) in x
            .chunks_exact(self.group)
            .zip(out.chunks_exact_mut(self.block()))
        {
            let (lo, hi) = xs
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            let (s, m) = asym_params(lo, hi, self.bits);
            o[..2].copy_from_slice(&s.to_le_bytes());
            o[2..4].copy_from_slice(&m.to_le_bytes());
            for (c, &v) in codes.iter_mut().zip(xs) {
                *c = asym_code(v, s, m, self.bits);
            }
            pack_bits(&codes, self.bits, &mut o[4..]);
        }
        0
    }

    /// `int2` with groups of 32 (KIVI's values) accumulates on its codes, and so do `int3`
    /// with groups of 32 or one group per row (`int3:group=row`, TurboQuant's 3-bit values); at
    /// 4 bits the bytes are [`super::int4::Int4GroupRow`]'s, and so is the code path
    /// (`int4-row`: one group per row).
    fn code_values(&self) -> Option<crate::kv::codeaxpy::CodeValues> {
        use crate::kv::codeaxpy::CodeValues;
        match (self.bits, self.group) {
            (2, 32) => Some(CodeValues::Int2G32),
            (3, 32) => Some(CodeValues::Int3G32),
            // One group per row (the stream checks the row bytes: two groups of 64 are not it).
            (3, g) if g.is_multiple_of(32) => Some(CodeValues::Int3Row),
            (4, g) => super::int4::int4_code_values(g),
            _ => None,
        }
    }

    /// `int2` and `int3` with groups of 32, and `int3` with one group per row, score on their
    /// codes; at 4 bits, [`super::int4::Int4GroupRow`]'s integer key path (same bytes).
    fn int_keys(&self) -> Option<crate::kv::intdot::IntKeys> {
        use crate::kv::intdot::IntKeys;
        match (self.bits, self.group) {
            (2, 32) => Some(IntKeys::Int2G32),
            (3, 32) => Some(IntKeys::Int3G32),
            // One group per row (the stream checks the row bytes: two groups of 64 are not it).
            (3, g) if g.is_multiple_of(32) => Some(IntKeys::Int3Row),
            (4, g) => super::int4::int4_int_keys(g),
            _ => None,
        }
    }

    fn decode(&self, row: &[u8], out: &mut [f32]) {
        for (b, o) in row
            .chunks_exact(self.block())
            .zip(out.chunks_exact_mut(self.group))
        {
            let s = f16::from_le_bytes([b[0], b[1]]).to_f32();
            let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
            // Every width (2-bit rows included, which had a table of their own: `code·s` is
            // exact, so either way `m + code·s` rounds once and the values are the same).
            affine_codes_to_f32(&b[4..], self.bits, s, m, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::kv::formats::int4::Int4GroupRow;
    use crate::kv::KvScheme;

    /// Row bytes by hand, d = 64: int2 g32: 2 × (4 + 8) = 24; int3 row: 24 + 4 = 28;
    /// int4-row: 32 + 4 = 36 (= int4:group=64); int2 g16: 4 × (4 + 4) = 32.
    #[test]
    fn row_bytes_by_hand() {
        let q = |s: &str| s.parse::<KvScheme>().unwrap().k;
        assert_eq!(q("int2").row_bytes(64), 24);
        assert_eq!(q("int3:group=row").row_bytes(64), 28);
        assert_eq!(q("int4-row").row_bytes(64), 36);
        assert_eq!(
            q("int4-row").row_bytes(64),
            q("int4:group=64").row_bytes(64)
        );
        assert_eq!(q("int2:group=16").row_bytes(64), 32);
        for bad in [
            "int2:group=6",
            "int3:group=4",
            "int4-row:group=8",
            "int2:group=0",
        ] {
            assert!(bad.parse::<KvScheme>().is_err(), "{bad}");
        }
        let s: KvScheme = "int2:group=32".parse().unwrap();
        assert!(s.validate(48).is_err());
    }

    /// 2-bit round trip by hand, one group of 4: x = (0, 1, 2, 3) → m = 0, s = 1 (exact in
    /// f16), codes 0..3 → decoded exactly; x = (−1, 0, 0.4, 2) → s = 1, codes (0, 1, 1, 3)
    /// ((0.4+1)/1 = 1.4 → 1) → (−1, 0, 0, 2), error 0.4 ≤ s/2.
    #[test]
    fn two_bit_round_trip_by_hand() {
        let c = UniformGroupRow::new(2, 4).unwrap();
        let mut b = vec![0u8; c.row_bytes(4)];
        let mut y = [0f32; 4];
        c.encode(&[0.0, 1.0, 2.0, 3.0], &mut b);
        c.decode(&b, &mut y);
        assert_eq!(y, [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(b[4], 0b11_10_01_00);
        c.encode(&[-1.0, 0.0, 0.4, 2.0], &mut b);
        c.decode(&b, &mut y);
        assert_eq!(y, [-1.0, 0.0, 0.0, 2.0]);
    }

    /// 2 bits, group 4, x = (0, 1, 2, 3): m = 0, s = 3/3 = 1 (f16 0x3C00), codes 0..3 → 0xE4;
    /// 3 bits, group 8, x = 0..7: s = 1, codes 0..7 → 0x88, 0xC6, 0xFA (LSB-first by hand:
    /// byte 0 = 1<<3 | (2&3)<<6; byte 1 = (2>>2) | 3<<1 | 4<<4 | (5&1)<<7; byte 2 = 5>>1 | 6<<2 | 7<<5).
    #[test]
    fn uniform_rows_by_hand() {
        let c = UniformGroupRow::new(2, 4).unwrap();
        assert_eq!(c.row_bytes(8), 2 * 5);
        let mut row = [0u8; 5];
        c.encode(&[0.0, 1.0, 2.0, 3.0], &mut row);
        assert_eq!(row, [0x00, 0x3C, 0x00, 0x00, 0xE4]);
        let mut out = [0f32; 4];
        c.decode(&row, &mut out);
        assert_eq!(out, [0.0, 1.0, 2.0, 3.0]);
        let c3 = UniformGroupRow::new(3, 8).unwrap();
        let mut row = [0u8; 7];
        let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
        c3.encode(&x, &mut row);
        assert_eq!(row, [0x00, 0x3C, 0x00, 0x00, 0x88, 0xC6, 0xFA]);
        // vLLM's value row: ceil(d·b/8) + 4 for one group per row.
        assert_eq!(UniformGroupRow::new(3, 128).unwrap().row_bytes(128), 48 + 4);
        assert!(UniformGroupRow::new(5, 32).is_err());
        assert!(UniformGroupRow::new(3, 4).is_err());
        assert!(UniformGroupRow::new(2, 0).is_err());
        assert!(UniformGroupRow::new(2, 32).unwrap().validate(48).is_err());
    }

    /// Round-trip error ≤ s/2 per element (s the group's stored step) at 2, 3, 4 bits on random
    /// rows, with s recomputed here from the group's min/max: (max − min)/(2^b − 1), up to f16's
    /// outward rounding (≤ 2⁻¹⁰ relative, plus the min's rounding).
    #[test]
    fn uniform_rows_error_bound() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for bits in 2..=4u8 {
            let c = UniformGroupRow::new(bits, 32).unwrap();
            for _ in 0..200 {
                let x: Vec<f32> = (0..64).map(|_| rng.random_range(-3.0..5.0)).collect();
                let mut row = vec![0u8; c.row_bytes(64)];
                c.encode(&x, &mut row);
                let mut out = vec![0f32; 64];
                c.decode(&row, &mut out);
                for (xs, os) in x.chunks(32).zip(out.chunks(32)) {
                    let lo = xs.iter().cloned().fold(f32::INFINITY, f32::min);
                    let hi = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let step = (hi - lo) / ((1 << bits) - 1) as f32;
                    let slack = step * 2e-3 + lo.abs() * 2e-3;
                    for (a, b) in xs.iter().zip(os) {
                        assert!(
                            (a - b).abs() <= step / 2.0 + slack,
                            "bits {bits}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    /// The decode (eight codes a step) gives `m + code·s` with each code read by `code_at` (the bit reader checked by hand in `quant::bits`), bit for bit,
    /// for groups of 8, 32 and whole rows of 64.
    #[test]
    fn unpacked_decode_equals_code_at() {
        use crate::kv::quant::bits::code_at;
        let mut rng = rand::rngs::StdRng::seed_from_u64(33);
        for bits in [2u8, 3, 4] {
            for group in [8usize, 32, 64] {
                let c = UniformGroupRow::new(bits, group).unwrap();
                let x: Vec<f32> = (0..64).map(|_| rng.random_range(-3.0..2.0)).collect();
                let mut row = vec![0u8; c.row_bytes(64)];
                c.encode(&x, &mut row);
                let mut got = vec![0f32; 64];
                c.decode(&row, &mut got);
                let blk = 4 + group * bits as usize / 8;
                for (i, &g) in got.iter().enumerate() {
                    let b = &row[i / group * blk..];
                    let s = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                    let want = m + code_at(&b[4..], bits, i % group) as f32 * s;
                    assert_eq!(g.to_bits(), want.to_bits(), "bits {bits} group {group} i {i}");
                }
            }
        }
    }

    /// At 4 bits the generic codec stores exactly Int4GroupRow's bytes (same rounding, same
    /// nibble order), so swapping it in later keeps every baseline number.
    #[test]
    fn uniform_four_bit_is_int4_group_bytes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for group in [32usize, 64] {
            let (a, b) = (
                UniformGroupRow::new(4, group).unwrap(),
                Int4GroupRow { group },
            );
            assert_eq!(a.row_bytes(64), b.row_bytes(64));
            for _ in 0..100 {
                let x: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
                let (mut ra, mut rb) = (vec![0u8; a.row_bytes(64)], vec![0u8; 64]);
                rb.truncate(b.row_bytes(64));
                a.encode(&x, &mut ra);
                b.encode(&x, &mut rb);
                assert_eq!(ra, rb);
            }
        }
    }
}
