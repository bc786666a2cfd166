//! CPU attention that reads a cache's stored rows directly: each K/V row is decoded into a
//! `head_dim` f32 buffer inside the loop and used at once (fused dequantize + dot product), f32
//! accumulation throughout, so no f32 copy of the cache is made (the same structure as
//! llama.cpp's CPU flash-attention path over quantized K/V).
//!
//! Work is split over (sequence, query head, block of up to [`QUERY_BLOCK`] queries) with rayon, so
//! both a long prefill and a batch of decode steps use every core.

use rayon::prelude::*;

use super::format::RowCodec;

/// Queries handled by one task: bounds the score buffer at `QUERY_BLOCK × n_keys` f32.
pub const QUERY_BLOCK: usize = 64;

/// Causal scaled-dot-product attention for one sequence and one query head over stored rows.
///
/// - `keys`, `values`: `n_keys` stored rows of `codec.row_bytes(head_dim)` bytes each.
/// - `q`: `[n_q, head_dim]` f32, already RoPE-rotated. Query `i` sits at absolute position
///   `n_keys − n_q + i` (the newest `n_q` keys are its own block) and attends to keys `0..=pos`.
/// - `out`: `[n_q, head_dim]`, overwritten with `softmax(q·Kᵀ / √head_dim) · V`.
pub fn attend_head<C: RowCodec>(
    codec: C,
    keys: &[u8],
    values: &[u8],
    n_keys: usize,
    q: &[f32],
    head_dim: usize,
    out: &mut [f32],
) {
    let n_q = q.len() / head_dim;
    debug_assert!(n_q <= n_keys);
    let first_pos = n_keys - n_q;
    out.par_chunks_mut(QUERY_BLOCK * head_dim)
        .zip(q.par_chunks(QUERY_BLOCK * head_dim))
        .enumerate()
        .for_each(|(blk, (out, q))| {
            let pos0 = first_pos + blk * QUERY_BLOCK;
            attend_block(codec, keys, values, pos0, q, head_dim, out)
        });
}

/// One block of consecutive queries at absolute positions `pos0, pos0+1, ...`.
fn attend_block<C: RowCodec>(
    codec: C,
    keys: &[u8],
    values: &[u8],
    pos0: usize,
    q: &[f32],
    head_dim: usize,
    out: &mut [f32],
) {
    let n_q = q.len() / head_dim;
    let rb = codec.row_bytes(head_dim);
    let n_keys = pos0 + n_q; // keys beyond the last query's position are never read
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut row = vec![0f32; head_dim];
    // scores[t * n_q + i]: key-major so each decoded key row is used by every query in turn.
    let mut scores = vec![f32::NEG_INFINITY; n_keys * n_q];
    for t in 0..n_keys {
        codec.decode(&keys[t * rb..(t + 1) * rb], &mut row);
        let first_i = t.saturating_sub(pos0); // queries with position >= t see key t
        let s = &mut scores[t * n_q..(t + 1) * n_q];
        for i in first_i..n_q {
            s[i] = dot(&q[i * head_dim..(i + 1) * head_dim], &row) * scale;
        }
    }
    // Softmax over keys for each query, in place (f32, max-subtracted).
    let mut max = vec![f32::NEG_INFINITY; n_q];
    for t in 0..n_keys {
        for (m, &s) in max.iter_mut().zip(&scores[t * n_q..(t + 1) * n_q]) {
            *m = m.max(s);
        }
    }
    let mut sum = vec![0f32; n_q];
    for t in 0..n_keys {
        let s = &mut scores[t * n_q..(t + 1) * n_q];
        for i in 0..n_q {
            let e = (s[i] - max[i]).exp(); // exp(-inf) = 0 for masked keys
            s[i] = e;
            sum[i] += e;
        }
    }
    out.fill(0.0);
    for t in 0..n_keys {
        codec.decode(&values[t * rb..(t + 1) * rb], &mut row);
        let first_i = t.saturating_sub(pos0);
        let p = &scores[t * n_q..(t + 1) * n_q];
        for i in first_i..n_q {
            axpy(p[i], &row, &mut out[i * head_dim..(i + 1) * head_dim]);
        }
    }
    for i in 0..n_q {
        let inv = 1.0 / sum[i];
        out[i * head_dim..(i + 1) * head_dim]
            .iter_mut()
            .for_each(|o| *o *= inv);
    }
}

/// f32 dot product with eight independent accumulators, so the compiler emits packed FMAs.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] = x[k].mul_add(y[k], acc[k]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y += a · x`.
#[inline]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = a.mul_add(x, *y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::format::F16Row;

    /// Two keys, one query, head_dim 2, values exact in f16: hand-computed softmax.
    #[test]
    fn hand_computed_two_keys() {
        let d = 2;
        let k = [[1.0f32, 0.0], [0.0, 1.0]];
        let v = [[1.0f32, 2.0], [3.0, 4.0]];
        let mut kb = vec![0u8; 8];
        let mut vb = vec![0u8; 8];
        for t in 0..2 {
            F16Row.encode(&k[t], &mut kb[t * 4..(t + 1) * 4]);
            F16Row.encode(&v[t], &mut vb[t * 4..(t + 1) * 4]);
        }
        // q = (ln 3 · √2, 0): scores (ln 3, 0) → weights (3/4, 1/4).
        let q = [(3f32).ln() * 2f32.sqrt(), 0.0];
        let mut out = [0f32; 2];
        attend_head(F16Row, &kb, &vb, 2, &q, d, &mut out);
        assert!((out[0] - (0.75 * 1.0 + 0.25 * 3.0)).abs() < 1e-3, "{out:?}");
        assert!((out[1] - (0.75 * 2.0 + 0.25 * 4.0)).abs() < 1e-3, "{out:?}");
        // Causal mask: with two queries the first sees only key 0, so it returns v0 exactly.
        let q2 = [1.0f32, 1.0, 1.0, 1.0];
        let mut out2 = [0f32; 4];
        attend_head(F16Row, &kb, &vb, 2, &q2, d, &mut out2);
        assert_eq!(&out2[..2], &[1.0, 2.0]);
        assert!((out2[2] - 2.0).abs() < 1e-3 && (out2[3] - 3.0).abs() < 1e-3);
    }
}
