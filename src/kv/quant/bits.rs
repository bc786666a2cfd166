//! Bit packing of quantization codes, little-endian and LSB-first: code `i` of `b` bits
//! occupies bits `i·b .. (i+1)·b` of the byte string, so at 4 bits element `2j` is the low
//! nibble of byte `j` (the layout of [`crate::kv::format::Int4GroupRow`] and KIVI's 4-bit
//! channel blocks, KIVI §3.1), and a 3-bit code may straddle two bytes. TurboQuant's indices
//! (Zandieh et al. 2025, arXiv 2504.19874, §3) and QJL's sign bits (Zandieh et al. 2024,
//! arXiv 2406.03482) are stored this way, as vLLM's TurboQuant packs them.

use crate::util::simd::simd_dispatch;

/// Bytes `n` codes of `bits` bits take packed: `ceil(n·bits/8)`.
pub const fn packed_bytes(n: usize, bits: u8) -> usize {
    (n * bits as usize).div_ceil(8)
}

/// Packs `codes` (each `< 2^bits`, `bits` 1–8) LSB-first into `out`
/// (`packed_bytes(codes.len(), bits)` bytes; overwritten). Panics on a wrong `out` length
/// (a caller's sizing bug, not user input).
pub fn pack_bits(codes: &[u8], bits: u8, out: &mut [u8]) {
    assert_eq!(
        out.len(),
        packed_bytes(codes.len(), bits),
        "packed buffer size"
    );
    out.fill(0);
    let mask = ((1u16 << bits) - 1) as u8;
    for (i, &c) in codes.iter().enumerate() {
        let bit = i * bits as usize;
        let v = ((c & mask) as u16) << (bit % 8);
        out[bit / 8] |= v as u8;
        if bit % 8 + bits as usize > 8 {
            out[bit / 8 + 1] |= (v >> 8) as u8;
        }
    }
}

/// Unpacks `out.len()` codes of `bits` bits from `packed` (the inverse of [`pack_bits`]).
/// Panics when `packed` is shorter than `packed_bytes(out.len(), bits)`.
#[inline]
pub fn unpack_bits(packed: &[u8], bits: u8, out: &mut [u8]) {
    assert!(
        packed.len() >= packed_bytes(out.len(), bits),
        "packed buffer size"
    );
    // Eight codes of `b` bits fill exactly `b` bytes: read them as one integer and shift
    // (no per-code branch for codes that straddle a byte); the tail code by code.
    let b = bits as usize;
    let whole = out.len() / 8;
    for (o, p) in out[..whole * 8]
        .chunks_exact_mut(8)
        .zip(packed.chunks_exact(b))
    {
        let mut v = 0u64;
        for (k, &x) in p.iter().enumerate() {
            v |= (x as u64) << (8 * k);
        }
        let m = (1u64 << b) - 1;
        for (i, o) in o.iter_mut().enumerate() {
            *o = ((v >> (b * i)) & m) as u8;
        }
    }
    let mask = (1u16 << bits) - 1;
    for (i, o) in out.iter_mut().enumerate().skip(whole * 8) {
        let bit = i * bits as usize;
        let lo = packed[bit / 8] as u16;
        let hi = if bit % 8 + bits as usize > 8 {
            (packed[bit / 8 + 1] as u16) << 8
        } else {
            0
        };
        *o = (((lo | hi) >> (bit % 8)) & mask) as u8;
    }
}

/// Code `i` of a packed string (see [`pack_bits`]).
#[inline]
pub(crate) fn code_at(packed: &[u8], bits: u8, i: usize) -> usize {
    let bit = i * bits as usize;
    let lo = packed[bit / 8] as u16;
    let hi = if bit % 8 + bits as usize > 8 {
        (packed[bit / 8 + 1] as u16) << 8
    } else {
        0
    };
    (((lo | hi) >> (bit % 8)) & ((1u16 << bits) - 1)) as usize
}

/// The `b` bytes (≤ 4) of eight `b`-bit codes starting at byte `at`, little-endian in a u32
/// (bits above `8·b` may hold the next bytes: every reader masks them away). One unaligned
/// 4-byte load where `src` extends that far, else byte by byte.
#[inline(always)]
fn eight_codes(src: &[u8], at: usize, b: usize) -> u32 {
    match src.get(at..at + 4) {
        Some(w) => u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
        None => src[at..at + b]
            .iter()
            .enumerate()
            .fold(0, |x, (k, &v)| x | (v as u32) << (8 * k)),
    }
}

/// `dst[i] = table[code_i] · scale` for the first `dst.len()` codes of `bits` bits (1–4)
/// packed LSB-first in `src` ([`pack_bits`]'s layout: TurboQuant's
/// codebook indices, Zandieh et al. 2025, arXiv 2504.19874, §3, as vLLM packs them). With AVX2,
/// eight codes a step: their `bits` bytes broadcast into eight lanes, each shifted by its
/// code's offset (`vpsrlvd`), masked, and looked up by a register permute (`vpermps`; 16
/// entries: two permutes and a blend on bit 3), one multiply (no FMA): the scalar tail's
/// `table[code] · scale`, bit for bit. Panics (a caller's bug) when `table` holds fewer than
/// `2^bits` entries or `src` fewer than the codes need.
#[inline(always)]
pub fn codes_to_f32(src: &[u8], bits: u8, table: &[f32], scale: f32, dst: &mut [f32]) {
    let b = bits as usize;
    assert!((1..=4).contains(&b) && table.len() >= 1 << b);
    assert!(src.len() * 8 >= dst.len() * b, "packed codes");
    let done = simd_dispatch!(
        ["avx2"],
        unsafe {
            use std::arch::x86_64::*;
            // The table padded to 16 entries (unused entries 0).
            let mut t = [0f32; 16];
            t[..1 << b].copy_from_slice(&table[..1 << b]);
            let (lo, hi) = (
                _mm256_loadu_ps(t.as_ptr()),
                _mm256_loadu_ps(t.as_ptr().add(8)),
            );
            let shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let shifts = _mm256_mullo_epi32(shifts, _mm256_set1_epi32(bits as i32));
            let mask = _mm256_set1_epi32((1 << b) - 1);
            let sv = _mm256_set1_ps(scale);
            let mut i = 0;
            // Eight codes fill exactly `b` bytes, read as one integer (≤ 4 bytes).
            while i + 8 <= dst.len() {
                let x = eight_codes(src, i / 8 * b, b);
                let idx =
                    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x as i32), shifts), mask);
                let v = if b == 4 {
                    let pick = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
                    _mm256_blendv_ps(
                        _mm256_permutevar8x32_ps(lo, idx),
                        _mm256_permutevar8x32_ps(hi, idx),
                        pick,
                    )
                } else {
                    _mm256_permutevar8x32_ps(lo, idx)
                };
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_mul_ps(v, sv));
                i += 8;
            }
            i
        },
        0
    );
    for (i, o) in dst.iter_mut().enumerate().skip(done) {
        *o = table[code_at(src, bits, i)] * scale;
    }
}

/// `dst[i] = m + code_i · s` for the first `dst.len()` codes of `bits` bits (1–4) packed
/// LSB-first in `src` (asymmetric uniform groups: KIVI's and TurboQuant's value rows,
/// [`crate::kv::formats::uniform`]). With AVX2 eight codes a step (their `bits` bytes broadcast,
/// shifted per lane by `vpsrlvd`, masked, converted), then a multiply and an add (no FMA): the
/// scalar tail's `m + code · s`, bit for bit. Panics (a caller's bug) when `src` holds fewer
/// bits than the codes need.
#[inline(always)]
pub fn affine_codes_to_f32(src: &[u8], bits: u8, s: f32, m: f32, dst: &mut [f32]) {
    let b = bits as usize;
    assert!(
        (1..=4).contains(&b) && src.len() * 8 >= dst.len() * b,
        "packed codes"
    );
    let done = simd_dispatch!(
        ["avx2"],
        unsafe {
            use std::arch::x86_64::*;
            let shifts = _mm256_mullo_epi32(
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                _mm256_set1_epi32(bits as i32),
            );
            let mask = _mm256_set1_epi32((1 << b) - 1);
            let (sv, mv) = (_mm256_set1_ps(s), _mm256_set1_ps(m));
            let mut i = 0;
            while i + 8 <= dst.len() {
                let x = eight_codes(src, i / 8 * b, b);
                let c =
                    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x as i32), shifts), mask);
                let v = _mm256_add_ps(mv, _mm256_mul_ps(_mm256_cvtepi32_ps(c), sv));
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
                i += 8;
            }
            i
        },
        0
    );
    for (i, o) in dst.iter_mut().enumerate().skip(done) {
        *o = m + code_at(src, bits, i) as f32 * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LSB-first packing by hand. 2 bits (0,1,2,3) → 0b11_10_01_00 = 0xE4. 3 bits
    /// (1,2,3,4,5,6,7,0): byte 0 = 1 | 2<<3 | (3&3)<<6 = 0xD1; byte 1 = (3>>2) | 4<<1 | 5<<4 |
    /// (6&1)<<7 = 0x58; byte 2 = 6>>1 | 7<<2 | 0<<5 = 0x1F. 4 bits (1, 2) → 0x21.
    #[test]
    fn bit_packing_by_hand() {
        let mut out = [0u8; 1];
        pack_bits(&[0, 1, 2, 3], 2, &mut out);
        assert_eq!(out, [0xE4]);
        let mut out3 = [0u8; 3];
        let codes = [1u8, 2, 3, 4, 5, 6, 7, 0];
        pack_bits(&codes, 3, &mut out3);
        assert_eq!(out3, [0xD1, 0x58, 0x1F]);
        let mut back = [0u8; 8];
        unpack_bits(&out3, 3, &mut back);
        assert_eq!(back, codes);
        pack_bits(&[1, 2], 4, &mut out);
        assert_eq!(out, [0x21]);
        assert_eq!(packed_bytes(64, 3), 24);
        assert_eq!(packed_bytes(5, 3), 2);
        // Codes to table values: 3 bits (1, 2, 3, 4, 5, 6, 7, 0) packed above, table[k] = 10k,
        // times 0.5 → 5, 10, …, 35, 0.
        let table: Vec<f32> = (0..16).map(|k| 10.0 * k as f32).collect();
        let mut v = [0f32; 8];
        codes_to_f32(&out3, 3, &table, 0.5, &mut v);
        assert_eq!(v, [5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 0.0]);
        // Every width 1–4 and lengths with tails, against `code_at` (SIMD and tail alike).
        for bits in 1..=4u8 {
            for n in [5usize, 8, 13, 24, 64, 67] {
                let codes: Vec<u8> = (0..n).map(|i| ((i * 5 + 1) % (1 << bits)) as u8).collect();
                let mut p = vec![0u8; packed_bytes(n, bits)];
                pack_bits(&codes, bits, &mut p);
                let mut got = vec![0f32; n];
                codes_to_f32(&p, bits, &table, -1.5, &mut got);
                for (i, &g) in got.iter().enumerate() {
                    assert_eq!(
                        g,
                        table[code_at(&p, bits, i)] * -1.5,
                        "bits {bits} n {n} i {i}"
                    );
                    assert_eq!(g, 10.0 * codes[i] as f32 * -1.5);
                }
            }
        }
        // Affine decode: m + code·s against code_at, every width, tails included; by hand
        // 3 bits (1, …, 7, 0) with s = 0.5, m = −1 → −0.5, 0, …, 2.5, −1.
        let mut v = [0f32; 8];
        affine_codes_to_f32(&out3, 3, 0.5, -1.0, &mut v);
        assert_eq!(v, [-0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, -1.0]);
        for bits in 1..=4u8 {
            for n in [3usize, 8, 16, 21, 64] {
                let codes: Vec<u8> = (0..n).map(|i| ((i * 3 + 2) % (1 << bits)) as u8).collect();
                let mut p = vec![0u8; packed_bytes(n, bits)];
                pack_bits(&codes, bits, &mut p);
                let mut got = vec![0f32; n];
                affine_codes_to_f32(&p, bits, 0.37, -2.1, &mut got);
                for (i, &g) in got.iter().enumerate() {
                    assert_eq!(g, -2.1 + codes[i] as f32 * 0.37, "bits {bits} n {n} i {i}");
                }
            }
        }
        // Odd lengths round trip at every width.
        for bits in 1..=8u8 {
            let codes: Vec<u8> = (0..13).map(|i| ((i * 7 + 3) % (1 << bits)) as u8).collect();
            let mut p = vec![0u8; packed_bytes(13, bits)];
            pack_bits(&codes, bits, &mut p);
            let mut u = vec![0u8; 13];
            unpack_bits(&p, bits, &mut u);
            assert_eq!(u, codes, "bits {bits}");
        }
    }
}
