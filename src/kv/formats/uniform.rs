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

use super::{Format, FormatSpec};
use crate::kv::codec::RowCodec;
use crate::kv::params::Params;
use crate::kv::stream::{RowStream, Stream};
use crate::kv::turboquant_core::UniformGroupRow;

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
        if group != 0 && (group * bits as usize) % 8 != 0 {
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

#[cfg(test)]
mod tests {
    use super::*;
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
}
