//! The stored TurboQuant rows of one (sequence, kv head, K or V) and how attention reads them
//! without decoding to the original basis: keys are scored against rotated queries (TurboQuant,
//! Zandieh et al. 2025, arXiv 2504.19874, §3.1: `⟨R q, ‖k‖ŷ⟩ = ⟨q, k̂⟩`), QJL rows with the
//! unbiased estimator (§3.2), and weighted value sums are gathered in the rotated basis and
//! rotated back once.

use std::sync::Arc;

use crate::kv::quant::mse::TurboQuantMse;
use crate::kv::quant::prod::{ProdQuery, TurboQuantProd};
use crate::kv::simd::dot;
use crate::kv::stream::{swap_remove_row, Stream};

/// Which TurboQuant row format a [`TurboQuantStream`] holds; shared (`Arc`) by every stream of a
/// layer so the rotation, codebook and QJL matrix exist once.
#[derive(Debug, Clone)]
pub enum TqCodec {
    /// [`TurboQuantMse`] rows (keys or values).
    Mse(Arc<TurboQuantMse>),
    /// [`TurboQuantProd`] rows (keys: the estimator targets ⟨q, k⟩).
    Prod(Arc<TurboQuantProd>),
}

impl TqCodec {
    fn head_dim(&self) -> usize {
        match self {
            TqCodec::Mse(c) => c.head_dim(),
            TqCodec::Prod(c) => c.head_dim(),
        }
    }

    fn row_bytes(&self) -> usize {
        match self {
            TqCodec::Mse(c) => c.row_bytes(),
            TqCodec::Prod(c) => c.row_bytes(),
        }
    }
}

/// The stored TurboQuant rows of one (sequence, kv head, K or V), read by attention in their
/// stored form: [`Stream::dot_rows`] rotates the queries once (`R q`) and scores each key on
/// its centroids (`‖k‖·⟨R q, ŷ⟩`, no inverse rotation per key); [`Stream::axpy_rows`]
/// accumulates `Σ w·‖v‖ŷ` in the rotated basis and rotates the sum back once. QJL rows score
/// with the unbiased estimator ([`TurboQuantProd::score`]). `bytes()` = rows × row bytes.
#[derive(Debug, Clone)]
pub struct TurboQuantStream {
    codec: TqCodec,
    rb: usize,
    data: Vec<u8>,
}

impl TurboQuantStream {
    /// An empty stream of `codec` rows.
    pub fn new(codec: TqCodec) -> Self {
        Self {
            rb: codec.row_bytes(),
            codec,
            data: Vec::new(),
        }
    }

    fn row(&self, slot: usize) -> &[u8] {
        &self.data[slot * self.rb..(slot + 1) * self.rb]
    }
}

impl Stream for TurboQuantStream {
    fn push(&mut self, rows: &[f32]) -> usize {
        let d = self.codec.head_dim();
        let start = self.data.len();
        self.data.resize(start + rows.len() / d * self.rb, 0);
        let out = &mut self.data[start..];
        rows.chunks_exact(d)
            .zip(out.chunks_exact_mut(self.rb))
            .map(|(x, o)| match &self.codec {
                TqCodec::Mse(c) => c.encode(x, o),
                TqCodec::Prod(c) => c.encode(x, o),
            })
            .sum()
    }

    fn decode(&self, slot: usize, out: &mut [f32]) {
        match &self.codec {
            TqCodec::Mse(c) => c.decode(self.row(slot), out),
            TqCodec::Prod(c) => c.decode(self.row(slot), out),
        }
    }

    fn dot_rows(&self, t0: usize, t1: usize, qs: &[f32], out: &mut [f32]) {
        let d = self.codec.head_dim();
        let nq = qs.len() / d;
        match &self.codec {
            TqCodec::Mse(c) => {
                let mut rq = qs.to_vec();
                rq.chunks_exact_mut(d).for_each(|q| c.rotate_query(q));
                let mut y = vec![0f32; d];
                for t in t0..t1 {
                    c.decode_rotated(self.row(t), &mut y);
                    for (j, q) in rq.chunks_exact(d).enumerate() {
                        out[(t - t0) * nq + j] = dot(&y, q);
                    }
                }
            }
            TqCodec::Prod(c) => {
                let pq: Vec<ProdQuery> = qs.chunks_exact(d).map(|q| c.prepare_query(q)).collect();
                for t in t0..t1 {
                    for (j, q) in pq.iter().enumerate() {
                        out[(t - t0) * nq + j] = c.score(q, self.row(t));
                    }
                }
            }
        }
    }

    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let d = self.codec.head_dim();
        let nq = acc.len() / d;
        let mut y = vec![0f32; d];
        match &self.codec {
            TqCodec::Mse(c) => {
                let mut racc = vec![0f32; nq * d];
                for t in t0..t1 {
                    let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
                    if wt.iter().all(|&x| x == 0.0) {
                        continue;
                    }
                    c.decode_rotated(self.row(t), &mut y);
                    for (a, &wj) in racc.chunks_exact_mut(d).zip(wt) {
                        a.iter_mut().zip(&y).for_each(|(a, v)| *a += wj * v);
                    }
                }
                for (a, r) in acc.chunks_exact_mut(d).zip(racc.chunks_exact_mut(d)) {
                    c.rotation().inverse(r);
                    a.iter_mut().zip(r.iter()).for_each(|(a, v)| *a += v);
                }
            }
            TqCodec::Prod(c) => {
                // Two running sums per query head; the QJL matrix is applied once at the end
                // (O(d) per row instead of O(d²)).
                let (mut racc, mut zacc) = (vec![0f32; nq * d], vec![0f32; nq * d]);
                for t in t0..t1 {
                    let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
                    for ((r, z), &wj) in racc
                        .chunks_exact_mut(d)
                        .zip(zacc.chunks_exact_mut(d))
                        .zip(wt)
                    {
                        if wj != 0.0 {
                            c.accumulate(self.row(t), wj, r, z);
                        }
                    }
                }
                for ((a, r), z) in acc
                    .chunks_exact_mut(d)
                    .zip(racc.chunks_exact_mut(d))
                    .zip(zacc.chunks_exact(d))
                {
                    c.finish_sum(r, z, a);
                }
            }
        }
    }

    fn len(&self) -> usize {
        self.data.len() / self.rb
    }

    fn bytes(&self) -> usize {
        self.data.len()
    }

    fn reserved(&self) -> usize {
        self.data.capacity()
    }

    fn swap_remove(&mut self, slot: usize) {
        swap_remove_row(&mut self.data, self.rb, slot);
    }

    fn clear(&mut self) {
        self.data.clear();
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// The stream reads the stored form: scores on rotated queries equal ⟨q, decode(row)⟩, and the
    /// rotated-basis weighted sum equals Σ w·decode(row) (both recomputed here row by row from
    /// `decode`); a row whose weights are all zero is skipped; bytes are rows × row bytes.
    #[test]
    fn turboquant_stream_scores_and_sums_like_decoded_rows() {
        let (d, n, nq) = (64, 40, 3);
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let rows: Vec<f32> = (0..n * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        let qs: Vec<f32> = (0..nq * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
        w[5 * nq..6 * nq].fill(0.0);
        let codecs = [
            TqCodec::Mse(Arc::new(TurboQuantMse::new(d, 3, true, 1).unwrap())),
            TqCodec::Mse(Arc::new(TurboQuantMse::new(d, 4, false, 2).unwrap())),
            TqCodec::Prod(Arc::new(TurboQuantProd::new(d, 3, 3).unwrap())),
        ];
        for codec in codecs {
            let mut s = TurboQuantStream::new(codec.clone());
            assert_eq!(s.push(&rows[..10 * d]) + s.push(&rows[10 * d..]), 0);
            assert_eq!(s.len(), n);
            assert_eq!(s.bytes(), n * codec.row_bytes());
            let mut dec = vec![0f32; n * d];
            for t in 0..n {
                s.decode(t, &mut dec[t * d..(t + 1) * d]);
            }
            let (t0, t1) = (3, 37);
            let mut out = vec![0f32; (t1 - t0) * nq];
            s.dot_rows(t0, t1, &qs, &mut out);
            let mut acc = vec![0.5f32; nq * d];
            s.axpy_rows(t0, t1, &w[t0 * nq..t1 * nq], &mut acc);
            let mut want_acc = vec![0.5f32; nq * d];
            for t in t0..t1 {
                let k = &dec[t * d..(t + 1) * d];
                for j in 0..nq {
                    let q = &qs[j * d..(j + 1) * d];
                    let want: f32 = k.iter().zip(q).map(|(a, b)| a * b).sum();
                    let got = out[(t - t0) * nq + j];
                    assert!(
                        (got - want).abs() < 1e-3 * (1.0 + want.abs()),
                        "{got} vs {want}"
                    );
                    let wj = w[t * nq + j];
                    for c in 0..d {
                        want_acc[j * d + c] += wj * k[c];
                    }
                }
            }
            for (a, b) in acc.iter().zip(&want_acc) {
                assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "{a} vs {b}");
            }
            // Eviction moves the last row into the hole.
            let mut last = vec![0f32; d];
            s.decode(n - 1, &mut last);
            s.swap_remove(2);
            let mut moved = vec![0f32; d];
            s.decode(2, &mut moved);
            assert_eq!(moved, last);
            assert_eq!(s.len(), n - 1);
            s.clear();
            assert_eq!((s.len(), s.bytes()), (0, 0));
        }
    }
}
