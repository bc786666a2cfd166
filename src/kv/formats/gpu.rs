//! How a format is laid out on the GPU (the `Stream` struct of kernels/kv_cache.cu): its kernel
//! id, group parameters and block layout. Compiled in every build, so a format that loses or
//! gains CUDA support is checked without `--features cuda`; [`super::Format::gpu`] is each
//! format's own answer.

include!("gpu_ids.rs");

/// kv_formats.h as build.rs wrote it from this table: what kernels/kv_cache.cu includes (the CPU
/// emulator's harness is compiled against this text, see tests/kernels_emulated.rs).
pub const KV_FORMATS_H: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_formats.h"));

/// The CUDA form of one K or V format: the kernel's `fmt` id and the row layout the kernels
/// index with. A row of `head_dim` elements is `head` bytes of row-level scale (NVFP4's f32)
/// then `blocks(head_dim).0` blocks, each `meta` bytes of scales/zero-points followed by codes;
/// the GPU keeps meta (the head, then every block's meta) and codes in separate planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuFormat {
    /// The kernel's format id (see `gpu_ids.rs`).
    pub id: i32,
    /// int4: elements per group along head_dim; KIVI keys: tokens per quantized group; else 0.
    pub group: usize,
    /// KIVI keys: newest rows kept in f16; else 0.
    pub residual: usize,
    /// Elements per block along head_dim; 0: the whole row is one block.
    pub block: usize,
    /// Scale/zero-point bytes per block.
    pub meta: usize,
    /// Row-level scale bytes before the first block (NVFP4's f32 second-level scale), else 0.
    pub head: usize,
    /// Code bits per element (16 for f16).
    pub bits: usize,
    /// Tokens per quantized token group (KIVI keys), else 1: capacities are multiples of it.
    pub token_group: usize,
}

impl GpuFormat {
    /// A per-token format: `block` elements per block (0: the whole row), `meta` bytes and
    /// `bits`-bit codes per block.
    pub const fn per_token(id: i32, block: usize, meta: usize, bits: usize) -> Self {
        Self {
            id,
            group: 0,
            residual: 0,
            block,
            meta,
            head: 0,
            bits,
            token_group: 1,
        }
    }

    /// `(blocks per row, meta bytes per block, code bytes per block)` for rows of `d` elements.
    pub fn blocks(self, d: usize) -> (usize, usize, usize) {
        let block = if self.block == 0 { d } else { self.block };
        (d / block, self.meta, block * self.bits / 8)
    }

    /// Code bytes per row of `d` elements.
    pub fn code_bytes(self, d: usize) -> usize {
        let (n, _, c) = self.blocks(d);
        n * c
    }

    /// Scale/zero-point bytes per row of `d` elements (the row-level head included).
    pub fn meta_bytes(self, d: usize) -> usize {
        let (n, m, _) = self.blocks(d);
        self.head + n * m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header text, by hand for two lines, and ids unique.
    #[test]
    fn header_defines_every_id_once() {
        let h = gpu_header();
        assert!(h.contains("#define F16 0\n"));
        assert!(h.contains("#define CHAN8 7\n"));
        assert!(h.contains("#define EVICT_H2O 1\n"));
        let mut ids: Vec<i32> = GPU_FORMAT_IDS.iter().map(|x| x.1).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), GPU_FORMAT_IDS.len());
        assert_eq!(KV_FORMATS_H, h, "build.rs wrote the header from this table");
    }

    /// Row layouts by hand for d = 64: Q4_0 is 2 blocks of (2 meta, 16 code) bytes; int4 with
    /// groups of 16 is 4 blocks of (4, 8); f16 one block of 128 code bytes.
    #[test]
    fn blocks_by_hand() {
        assert_eq!(GpuFormat::per_token(Q4_0, 32, 2, 4).blocks(64), (2, 2, 16));
        assert_eq!(GpuFormat::per_token(INT4, 16, 4, 4).blocks(64), (4, 4, 8));
        assert_eq!(GpuFormat::per_token(F16, 0, 0, 16).blocks(64), (1, 0, 128));
        assert_eq!(GpuFormat::per_token(INT8_TOKEN, 0, 2, 8).meta_bytes(64), 2);
        // NVFP4 at d = 64: 4 blocks of (1, 8) after a 4-byte f32 head: meta 4 + 4 = 8, codes
        // 32; MXFP4: 2 blocks of (1, 16).
        let nv = GpuFormat {
            head: 4,
            ..GpuFormat::per_token(NVFP4, 16, 1, 4)
        };
        assert_eq!(
            (nv.blocks(64), nv.meta_bytes(64), nv.code_bytes(64)),
            ((4, 1, 8), 8, 32)
        );
        assert_eq!(GpuFormat::per_token(MXFP4, 32, 1, 4).blocks(64), (2, 1, 16));
    }
}
