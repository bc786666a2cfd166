//! A bounds-checked first pass over a GGUF header, run before candle's reader sees the file.
//!
//! Layout as the GGUF spec gives it (ggml `docs/gguf.md`): magic `GGUF`, version (u32),
//! tensor count and metadata count (u64 since version 2), the metadata key/value pairs (key:
//! u64 length + bytes; value type u32; value), the tensor infos (name, `n_dims` u32, `n_dims`
//! u64 dimensions innermost first, ggml type u32, offset u64 relative to the data section), then
//! padding up to `general.alignment` (default 32) and the tensor data.
//!
//! Every count and length read here is checked against the bytes left in the file before
//! anything is allocated, and every size computed from one uses checked arithmetic, so a damaged
//! or hostile file gives an error, never an allocation abort or an overflow. It also refuses what
//! candle's reader accepts silently: a metadata key or tensor name given twice (the later value
//! would win), version 1 (32-bit lengths, pre-August 2023), a zero or odd `general.alignment`
//! (candle divides by it), tensors whose bytes lie outside the file.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};

/// Longest metadata key accepted, bytes (the spec's limit, 2^16 − 1).
pub const MAX_KEY_LEN: u64 = 65_535;
/// Longest tensor name accepted, bytes (ggml's `GGML_MAX_NAME` is 64; some writers go longer).
pub const MAX_TENSOR_NAME_LEN: u64 = 4096;
/// Deepest nesting of arrays in a metadata value (real files use 1).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most dimensions of a tensor (`GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Largest `general.alignment` accepted, bytes.
pub const MAX_ALIGNMENT: u64 = 1 << 24;
/// Largest string or array length candle's reader accepts (`GGUF_MAX_STRING_LENGTH`).
const CANDLE_MAX_LEN: u64 = 1 << 30;

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedTensor {
    /// Tensor name.
    pub name: String,
    /// Dimensions as stored (innermost first, ggml's `ne`).
    pub dims: Vec<u64>,
    /// ggml type id.
    pub ggml_type: u32,
    /// Start of the tensor's bytes relative to the data section.
    pub offset: u64,
    /// Bytes the tensor occupies (`elements / block size × block bytes`).
    pub bytes: u64,
}

/// What the scan learned: enough to size everything before reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedHeader {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata keys in file order.
    pub keys: Vec<String>,
    /// Tensor infos in file order.
    pub tensors: Vec<ScannedTensor>,
    /// Alignment of the data section and of every tensor offset, bytes.
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    /// File length, bytes.
    pub file_len: u64,
}

/// `(elements per block, bytes per block)` of a ggml type id, for the types candle reads
/// (ggml-common.h's block layouts), or `None` for any other id.
pub fn ggml_block(type_id: u32) -> Option<(u64, u64)> {
    Some(match type_id {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0: f16 scale + 16 bytes of nibbles
        3 => (32, 20),    // Q4_1: f16 scale, f16 min + 16 bytes
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0: f16 scale + 32 int8
        9 => (32, 36),    // Q8_1: f16 scale, f16 sum + 32 int8
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K: f32 scale + 256 int8 + 16 i16 sums
        30 => (1, 2),     // BF16
        _ => return None,
    })
}

struct Cursor<'r, R> {
    r: &'r mut R,
    pos: u64,
    len: u64,
}

impl<R: Read> Cursor<'_, R> {
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        if self.left() < N as u64 {
            return Err(format!(
                "the file ends at byte {} inside {what}; is it truncated?",
                self.len
            ));
        }
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| format!("reading {what} at byte {}: {e}", self.pos))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes::<4>(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes::<8>(what)?))
    }

    /// Skips `n` bytes that must lie inside the file.
    fn skip(&mut self, n: u64, what: &str) -> Result<(), String> {
        if n > self.left() {
            return Err(format!(
                "{what} needs {n} bytes at byte {}, only {} left in the file",
                self.pos,
                self.left()
            ));
        }
        // Read through (the header is read sequentially from a buffered reader).
        let copied = std::io::copy(&mut (&mut *self.r).take(n), &mut std::io::sink())
            .map_err(|e| format!("reading {what}: {e}"))?;
        if copied != n {
            return Err(format!("the file ends inside {what}; is it truncated?"));
        }
        self.pos += n;
        Ok(())
    }

    /// A length-prefixed string of at most `max` bytes (lossy UTF-8, trailing NULs dropped as
    /// candle drops them).
    fn string(&mut self, max: u64, what: &str) -> Result<String, String> {
        let n = self.u64(what)?;
        if n > max || n > self.left() {
            return Err(format!(
                "{what} claims {n} bytes (at byte {}; {} left in the file, at most {max} \
                 allowed); is the file truncated?",
                self.pos,
                self.left()
            ));
        }
        let mut v = vec![0u8; n as usize];
        self.r
            .read_exact(&mut v)
            .map_err(|e| format!("reading {what}: {e}"))?;
        self.pos += n;
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// Skips one metadata value of type `ty`, checking it; returns the value when it is a u32
    /// (for `general.alignment`).
    fn value(&mut self, ty: u32, depth: usize, key: &str) -> Result<Option<u32>, String> {
        let fixed = |ty: u32| -> Option<u64> {
            match ty {
                0 | 1 | 7 => Some(1),
                2 | 3 => Some(2),
                4..=6 => Some(4),
                10..=12 => Some(8),
                _ => None,
            }
        };
        match ty {
            4 => return Ok(Some(self.u32(key)?)),
            7 => {
                let [b] = self.bytes::<1>(key)?;
                if b > 1 {
                    return Err(format!(
                        "metadata `{key}`: boolean byte {b} is neither 0 nor 1"
                    ));
                }
            }
            8 => {
                self.string(CANDLE_MAX_LEN, &format!("metadata `{key}` (a string)"))?;
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "metadata `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let elem = self.u32(key)?;
                let n = self.u64(key)?;
                let min = match elem {
                    8 => 8,
                    9 => 12,
                    t => fixed(t).ok_or_else(|| {
                        format!("metadata `{key}`: unknown array element type {t}")
                    })?,
                };
                if n > CANDLE_MAX_LEN || n.checked_mul(min).is_none_or(|b| b > self.left()) {
                    return Err(format!(
                        "metadata `{key}`: an array of {n} elements cannot fit in the {} bytes \
                         left in the file",
                        self.left()
                    ));
                }
                match fixed(elem) {
                    Some(size) => self.skip(n * size, &format!("metadata `{key}`"))?,
                    None => {
                        for _ in 0..n {
                            self.value(elem, depth + 1, key)?;
                        }
                    }
                }
            }
            t => match fixed(t) {
                Some(size) => self.skip(size, &format!("metadata `{key}`"))?,
                None => return Err(format!("metadata `{key}`: unknown value type {t}")),
            },
        }
        Ok(None)
    }
}

impl<R: Read + Seek> Cursor<'_, R> {
    /// The version (2 or 3) and the metadata and tensor counts after the magic number, each
    /// count checked against the bytes left. Errors: as [`scan`].
    fn counts(&mut self) -> Result<(u32, u64, u64), String> {
        let version = self.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(
                    "GGUF version 1 (written by llama.cpp before August 2023) is not \
                     supported; convert the model again with a current llama.cpp \
                     (convert_hf_to_gguf.py) to get version 3"
                        .into(),
                )
            }
            v => {
                return Err(format!(
                    "GGUF version {v} is not supported (kvbench reads versions 2 and 3)"
                ))
            }
        }
        let n_tensors = self.u64("the tensor count")?;
        let n_kv = self.u64("the metadata count")?;
        // Smallest entries: a key/value is 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8.
        let fits = |n: u64, each: u64, left: u64| n.checked_mul(each).is_some_and(|b| b <= left);
        if !fits(n_kv, 14, self.left()) {
            return Err(format!(
                "the header claims {n_kv} metadata entries, more than the {} bytes after it can hold; is the file truncated?",
                self.left()
            ));
        }
        if !fits(n_tensors, 33, self.left()) {
            return Err(format!(
                "the header claims {n_tensors} tensors, more than the {} bytes after it can hold; is the file truncated?",
                self.left()
            ));
        }
        Ok((version, n_kv, n_tensors))
    }

    /// The `n_kv` metadata entries: their keys in file order (each once) and the data alignment
    /// (`general.alignment`, a power of two up to [`MAX_ALIGNMENT`]; 32 when absent).
    /// Errors: as [`scan`].
    fn metadata(&mut self, n_kv: u64) -> Result<(Vec<String>, u64), String> {
        let mut keys = Vec::with_capacity(n_kv as usize);
        let mut seen = HashSet::new();
        let mut alignment = None;
        for i in 0..n_kv {
            let key = self.string(MAX_KEY_LEN, &format!("metadata key #{i}"))?;
            if !seen.insert(key.clone()) {
                return Err(format!(
                    "metadata key `{key}` appears twice; a GGUF file names each key once (which \
                     value is meant is unknown)"
                ));
            }
            let ty = self.u32(&key)?;
            let v = self.value(ty, 0, &key)?;
            if key == "general.alignment" {
                let a = v.ok_or_else(|| {
                    format!("metadata `general.alignment` has value type {ty}, not u32 (4)")
                })?;
                let a = u64::from(a);
                if !a.is_power_of_two() || a > MAX_ALIGNMENT {
                    return Err(format!(
                        "`general.alignment` is {a}; it must be a power of two up to {MAX_ALIGNMENT}"
                    ));
                }
                alignment = Some(a);
            }
            keys.push(key);
        }
        let alignment = alignment.unwrap_or(32);
        Ok((keys, alignment))
    }

    /// Tensor info `#i`: name (not in `names` yet; added), dimensions, ggml type and offset (a
    /// multiple of `alignment`), with its byte size from the ggml block table. Errors: as
    /// [`scan`].
    fn tensor_info(
        &mut self,
        i: u64,
        alignment: u64,
        names: &mut HashSet<String>,
    ) -> Result<ScannedTensor, String> {
        let name = self.string(MAX_TENSOR_NAME_LEN, &format!("the name of tensor #{i}"))?;
        if !names.insert(name.clone()) {
            return Err(format!("tensor `{name}` appears twice"));
        }
        let n_dims = self.u32(&name)?;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(format!(
                "tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64(&name)?);
        }
        let ggml_type = self.u32(&name)?;
        let offset = self.u64(&name)?;
        let (block, block_bytes) = ggml_block(ggml_type)
            .ok_or_else(|| format!("tensor `{name}` has unknown ggml type {ggml_type}"))?;
        let elems = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d).filter(|_| d > 0))
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| {
                format!("tensor `{name}` has dimensions {dims:?}: empty, or too many elements")
            })?;
        if !dims[0].is_multiple_of(block) {
            return Err(format!(
                "tensor `{name}`: its rows of {} elements are not whole blocks of {block}",
                dims[0]
            ));
        }
        let bytes = (elems / block)
            .checked_mul(block_bytes)
            .ok_or_else(|| format!("tensor `{name}` has dimensions {dims:?}: too large"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor `{name}`: offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        Ok(ScannedTensor {
            name,
            dims,
            ggml_type,
            offset,
            bytes,
        })
    }
}

/// Scans the header of the GGUF file `r` (read from its start, `len` bytes long). Errors: a
/// message naming what is wrong and where (the caller adds the path).
pub fn scan<R: Read + Seek>(r: &mut R) -> Result<ScannedHeader, String> {
    let len = r
        .seek(SeekFrom::End(0))
        .map_err(|e| format!("cannot seek: {e}"))?;
    r.seek(SeekFrom::Start(0))
        .map_err(|e| format!("cannot seek: {e}"))?;
    let mut c = Cursor { r, pos: 0, len };
    let magic = c
        .bytes::<4>("the magic number")
        .map_err(|_| format!("not a GGUF file: {len} bytes, too short for a GGUF header"))?;
    if &magic != b"GGUF" {
        return Err(format!(
            "not a GGUF file: it starts with bytes {:02x} {:02x} {:02x} {:02x}, not `GGUF`",
            magic[0], magic[1], magic[2], magic[3]
        ));
    }
    let (version, n_kv, n_tensors) = c.counts()?;
    let (keys, alignment) = c.metadata(n_kv)?;
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        tensors.push(c.tensor_info(i, alignment, &mut names)?);
    }
    let data_offset = c
        .pos
        .checked_next_multiple_of(alignment)
        .ok_or("the header is too long")?;
    let data_len = len.saturating_sub(data_offset);
    for t in &tensors {
        if t.offset
            .checked_add(t.bytes)
            .is_none_or(|end| end > data_len)
        {
            return Err(format!(
                "tensor `{}` ({} bytes at offset {}) lies past the end of the file ({} data \
                 bytes); is the file truncated?",
                t.name, t.bytes, t.offset, data_len
            ));
        }
    }
    Ok(ScannedHeader {
        version,
        keys,
        tensors,
        alignment,
        data_offset,
        file_len: len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType as G;

    /// The block table agrees with candle's own (which reads the data).
    #[test]
    fn block_sizes_match_candle() {
        for (id, t) in [
            (0, G::F32),
            (1, G::F16),
            (2, G::Q4_0),
            (3, G::Q4_1),
            (6, G::Q5_0),
            (7, G::Q5_1),
            (8, G::Q8_0),
            (9, G::Q8_1),
            (10, G::Q2K),
            (11, G::Q3K),
            (12, G::Q4K),
            (13, G::Q5K),
            (14, G::Q6K),
            (15, G::Q8K),
            (30, G::BF16),
        ] {
            assert_eq!(
                ggml_block(id),
                Some((t.block_size() as u64, t.type_size() as u64)),
                "{t:?}"
            );
        }
    }
}
