//! CPU attention that reads a cache's stored rows directly: each K/V row is decoded into a
//! `head_dim` f32 buffer inside the loop and used at once by every query that needs it (fused
//! dequantize + dot product, f32 accumulation), so no f32 copy of the cache is ever made — the
//! structure of llama.cpp's CPU flash-attention path over quantized K/V.
//!
//! Parallel work: one task per (sequence, kv head, block of up to [`QUERY_BLOCK`] query
//! positions); all query heads of a GQA group share the task, so each stored row is decoded once
//! per task. When that gives fewer tasks than threads (batch-1 decode), the key range is split
//! into chunks whose partial softmax results are merged exactly (log-sum-exp), as in
//! flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference").

use rayon::prelude::*;

use super::format::RowCodec;

/// Query positions handled by one task (bounds its score buffer at `group × QUERY_BLOCK × keys`).
pub const QUERY_BLOCK: usize = 32;
/// Smallest key chunk worth a task of its own when splitting a decode step over threads.
pub const MIN_KEY_CHUNK: usize = 256;

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Sequences.
    pub batch: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query heads per kv head (GQA group size).
    pub group: usize,
    /// New query positions per sequence (the newest `n_q` cached tokens).
    pub n_q: usize,
    /// Tokens cached per sequence (including the new ones).
    pub n_keys: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// Partial attention of some queries over a key range: running max and sum of exp(score − max)
/// per query, and the unnormalized weighted sum of values.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

/// Causal scaled-dot-product attention over stored rows for every (sequence, query head).
///
/// - `keys[b * kv_heads + h]`, `values[..]`: `n_keys` stored rows of `codec.row_bytes(head_dim)`
///   bytes for sequence `b`, kv head `h`.
/// - `q`: `[batch, kv_heads * group, n_q, head_dim]` f32, RoPE applied. Query `i` sits at
///   absolute position `n_keys − n_q + i` and sees keys `0..=` that position. Query head `hq`
///   reads kv head `hq / group`.
/// - returns `[batch, kv_heads * group, n_q, head_dim]` f32:
///   `softmax(q·Kᵀ / √head_dim) · V`.
pub fn attend<C: RowCodec>(
    codec: C,
    keys: &[Vec<u8>],
    values: &[Vec<u8>],
    q: &[f32],
    s: AttnShape,
) -> Vec<f32> {
    let d = s.head_dim;
    let q_blocks = s.n_q.div_ceil(QUERY_BLOCK);
    let base_tasks = s.batch * s.kv_heads * q_blocks;
    let threads = rayon::current_num_threads();
    // Split keys only when there are too few tasks to keep every thread busy.
    let key_chunks = if base_tasks >= threads {
        1
    } else {
        (2 * threads)
            .div_ceil(base_tasks)
            .min(s.n_keys / MIN_KEY_CHUNK)
            .max(1)
    };
    let tasks: Vec<(usize, usize, usize)> = (0..s.batch * s.kv_heads)
        .flat_map(|bh| {
            (0..q_blocks).flat_map(move |qb| (0..key_chunks).map(move |kc| (bh, qb, kc)))
        })
        .collect();
    let first_pos = s.n_keys - s.n_q;
    let partials: Vec<Partial> = tasks
        .par_iter()
        .map(|&(bh, qb, kc)| {
            let (b, h) = (bh / s.kv_heads, bh % s.kv_heads);
            let i0 = qb * QUERY_BLOCK;
            let i1 = (i0 + QUERY_BLOCK).min(s.n_q);
            // Keys this block can see: up to its last query's position.
            let visible = first_pos + i1;
            let chunk = visible.div_ceil(key_chunks);
            let (t0, t1) = ((kc * chunk).min(visible), ((kc + 1) * chunk).min(visible));
            // Gather the block's queries: [group × (i1 − i0), d], head-major.
            let mut qs = Vec::with_capacity(s.group * (i1 - i0) * d);
            let mut pos = Vec::with_capacity(s.group * (i1 - i0));
            for g in 0..s.group {
                let hq = h * s.group + g;
                let base = ((b * s.kv_heads * s.group + hq) * s.n_q) * d;
                qs.extend_from_slice(&q[base + i0 * d..base + i1 * d]);
                pos.extend((i0..i1).map(|i| first_pos + i));
            }
            partial(codec, &keys[bh], &values[bh], t0, t1, &qs, &pos, d)
        })
        .collect();
    // Merge key chunks and scatter into [batch, q_heads, n_q, d].
    let mut out = vec![0f32; q.len()];
    for (t, parts) in partials.chunks(key_chunks).enumerate() {
        let (bh, qb, _) = tasks[t * key_chunks];
        let (b, h) = (bh / s.kv_heads, bh % s.kv_heads);
        let i0 = qb * QUERY_BLOCK;
        let i1 = (i0 + QUERY_BLOCK).min(s.n_q);
        let nb = i1 - i0;
        for j in 0..s.group * nb {
            let m = parts
                .iter()
                .map(|p| p.max[j])
                .fold(f32::NEG_INFINITY, f32::max);
            let (g, i) = (j / nb, i0 + j % nb);
            let hq = h * s.group + g;
            let o = &mut out[((b * s.kv_heads * s.group + hq) * s.n_q + i) * d..][..d];
            let mut sum = 0f32;
            for p in parts.iter().filter(|p| p.max[j] > f32::NEG_INFINITY) {
                let w = (p.max[j] - m).exp();
                sum += p.sum[j] * w;
                axpy(w, &p.acc[j * d..(j + 1) * d], o);
            }
            let inv = 1.0 / sum;
            o.iter_mut().for_each(|x| *x *= inv);
        }
    }
    out
}

/// Attention of queries `qs` (`[J, d]`, absolute positions `pos`) over stored keys `t0..t1`,
/// unnormalized. Each K and V row is decoded once and used by all J queries.
#[allow(clippy::too_many_arguments)]
fn partial<C: RowCodec>(
    codec: C,
    keys: &[u8],
    values: &[u8],
    t0: usize,
    t1: usize,
    qs: &[f32],
    pos: &[usize],
    d: usize,
) -> Partial {
    let nq = pos.len();
    let rb = codec.row_bytes(d);
    let scale = 1.0 / (d as f32).sqrt();
    let mut row = vec![0f32; d];
    let n = t1 - t0;
    // scores[(t − t0) · nq + j], key-major so a decoded key row is used by every query in turn.
    let mut scores = vec![f32::NEG_INFINITY; n * nq];
    let mut max = vec![f32::NEG_INFINITY; nq];
    for t in t0..t1 {
        codec.decode(&keys[t * rb..(t + 1) * rb], &mut row);
        let sc = &mut scores[(t - t0) * nq..(t - t0 + 1) * nq];
        for j in 0..nq {
            if t <= pos[j] {
                let v = dot(&qs[j * d..(j + 1) * d], &row) * scale;
                sc[j] = v;
                max[j] = max[j].max(v);
            }
        }
    }
    let mut sum = vec![0f32; nq];
    for sc in scores.chunks_exact_mut(nq) {
        for j in 0..nq {
            let e = (sc[j] - max[j]).exp(); // masked: exp(−∞) = 0
            sc[j] = e;
            sum[j] += e;
        }
    }
    let mut acc = vec![0f32; nq * d];
    for t in t0..t1 {
        let p = &scores[(t - t0) * nq..(t - t0 + 1) * nq];
        if p.iter().all(|&x| x == 0.0) {
            continue;
        }
        codec.decode(&values[t * rb..(t + 1) * rb], &mut row);
        for j in 0..nq {
            if p[j] != 0.0 {
                axpy(p[j], &row, &mut acc[j * d..(j + 1) * d]);
            }
        }
    }
    Partial { max, sum, acc }
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

    fn store(rows: &[[f32; 2]]) -> Vec<u8> {
        let mut b = vec![0u8; rows.len() * 4];
        for (t, r) in rows.iter().enumerate() {
            F16Row.encode(r, &mut b[t * 4..(t + 1) * 4]);
        }
        b
    }

    fn shape(n_q: usize, n_keys: usize) -> AttnShape {
        AttnShape {
            batch: 1,
            kv_heads: 1,
            group: 1,
            n_q,
            n_keys,
            head_dim: 2,
        }
    }

    /// Two keys, one query, head_dim 2, values exact in f16: hand-computed softmax.
    #[test]
    fn hand_computed_two_keys() {
        let k = vec![store(&[[1.0, 0.0], [0.0, 1.0]])];
        let v = vec![store(&[[1.0, 2.0], [3.0, 4.0]])];
        // q = (ln 3 · √2, 0): scores (ln 3, 0) → weights (3/4, 1/4).
        let q = [(3f32).ln() * 2f32.sqrt(), 0.0];
        let out = attend(F16Row, &k, &v, &q, shape(1, 2));
        assert!((out[0] - (0.75 * 1.0 + 0.25 * 3.0)).abs() < 1e-3, "{out:?}");
        assert!((out[1] - (0.75 * 2.0 + 0.25 * 4.0)).abs() < 1e-3, "{out:?}");
        // Causal mask: with two queries the first sees only key 0, so it returns v0 exactly.
        let out2 = attend(F16Row, &k, &v, &[1.0, 1.0, 1.0, 1.0], shape(2, 2));
        assert_eq!(&out2[..2], &[1.0, 2.0]);
        assert!((out2[2] - 2.0).abs() < 1e-3 && (out2[3] - 3.0).abs() < 1e-3);
    }

    /// Splitting the keys into chunks and merging must equal one pass: 1000 keys whose value is
    /// their index, uniform scores → the mean index 499.5.
    #[test]
    fn key_chunks_merge_exactly() {
        let n = 1000;
        let k = vec![store(&vec![[0.0, 0.0]; n])];
        let rows: Vec<[f32; 2]> = (0..n).map(|t| [t as f32, 1.0]).collect();
        let v = vec![store(&rows)];
        let out = attend(F16Row, &k, &v, &[0.3, -0.2], shape(1, n));
        assert!((out[0] - 499.5).abs() < 1e-2, "{out:?}");
        assert!((out[1] - 1.0).abs() < 1e-5);
    }
}
