//! The stored TurboQuant rows of one (sequence, kv head, K or V) and how attention reads them
//! without decoding to the original basis: keys are scored against rotated queries (TurboQuant,
//! Zandieh et al. 2025, arXiv 2504.19874, §3.1: `⟨R q, ‖k‖ŷ⟩ = ⟨q, k̂⟩`), QJL rows with the
//! unbiased estimator (§3.2), and weighted value sums are gathered in the rotated basis and
//! rotated back once.

use std::sync::Arc;

use crate::kv::codeaxpy;
use crate::kv::intdot::{self, IntKeys, LazyQueryI8, QueryI8};
use crate::kv::quant::mse::TurboQuantMse;
use crate::kv::quant::prod::{ProdQuery, TurboQuantProd};
use crate::kv::simd::{dot, scale_in_place};
use crate::kv::stream::{axpy_rows_with, dot_rows_with, swap_remove_row, Stream};

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

    /// The quantizer when the rows are 4-bit TurboQuant_mse (with or without norm correction)
    /// and `d` is a multiple of 32: the layout whose code path ([`codeaxpy::axpy_centroids4`]
    /// without `fused`) gives the exact path's sums bit for bit.
    fn mse4(&self) -> Option<&TurboQuantMse> {
        match &self.codec {
            TqCodec::Mse(c) if c.bits() == 4 && c.head_dim().is_multiple_of(32) => Some(c),
            _ => None,
        }
    }
}

impl TurboQuantStream {
    /// The MSE stage's centroid count (2, 4, 8 or 16) when the rows are TurboQuant_prod with a
    /// 1- to 4-bit MSE stage (2 to 5 bits in all): the layouts the code paths read.
    fn prod_lut(&self) -> Option<usize> {
        match &self.codec {
            TqCodec::Prod(c) => {
                Some(c.mse().codebook().centroids().len()).filter(|&n| matches!(n, 2 | 4 | 8 | 16))
            }
            TqCodec::Mse(_) => None,
        }
    }
}

/// The centroids (16 at 4 bits, 8 at 3, 4 at 2, 2 at 1) rounded to int8 in units of `ts = max|c|/127`:
/// `(round(c/ts), ts)`, each entry within `ts/2` of `c/ts·ts` and inside ±127, the entries
/// past the centroids 0 (the byte-shuffle table of [`intdot::IntKeys::Lut4`], `Lut3` and
/// `Lut2`; `Lut1` reads the first two entries).
fn int8_table(cent: &[f32]) -> ([i8; 16], f32) {
    let ts = cent.iter().fold(0f32, |m, c| m.max(c.abs())) / 127.0;
    let mut t = [0i8; 16];
    if ts > 0.0 {
        for (t, c) in t.iter_mut().zip(cent) {
            *t = (c / ts).round().clamp(-127.0, 127.0) as i8;
        }
    }
    (t, ts)
}

/// The integer key format of rows whose indices go through `table`: 4-bit indices for 16
/// centroids, 3-bit for 8, 2-bit for 4, 1-bit for 2 (`None` for other codebooks).
fn lut_keys(centroids: usize, table: [i8; 16]) -> Option<IntKeys> {
    match centroids {
        16 => Some(IntKeys::Lut4(table)),
        8 => Some(IntKeys::Lut3(table)),
        4 => Some(IntKeys::Lut2(table)),
        2 => Some(IntKeys::Lut1(table)),
        _ => None,
    }
}

impl TurboQuantStream {
    /// `acc += Σ_t w_t·‖v_t‖·R⁻¹(centroid[codes_t])` for rows of any width on their codes
    /// ([`codeaxpy::axpy_codebook`]; with `fused`, the timed path's fused form), rotated back
    /// once per query. `d` must be a multiple of 32.
    fn axpy_codes(
        &self,
        c: &TurboQuantMse,
        t0: usize,
        t1: usize,
        w: &[f32],
        acc: &mut [f32],
        fused: bool,
    ) {
        let d = c.head_dim();
        let mut racc = vec![0f32; acc.len()];
        let (data, rb, cent) = (&self.data, self.rb, c.codebook().centroids());
        codeaxpy::axpy_codebook(cent, data, rb, d, t0, t1, w, &mut racc, fused);
        for (a, r) in acc.chunks_exact_mut(d).zip(racc.chunks_exact_mut(d)) {
            c.rotation().inverse(r);
            a.iter_mut().zip(r.iter()).for_each(|(a, v)| *a += v);
        }
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

    /// Every TurboQuant row has a timed path of its own ([`dot_rows_int`](Stream::dot_rows_int)):
    /// TurboQuant_mse keys of every width (1–4 bits, norm-corrected or not) and TurboQuant_prod
    /// keys (a 1- to 4-bit MSE stage) on their codes ([`intdot::IntKeys::Lut1`] to `Lut4`, QJL
    /// on its sign bits, [`intdot::IntKeys::Signs`]), where head_dim is a multiple of 32.
    /// Attention calls `dot_rows_int` only there; at other head sizes (16) it times the exact
    /// `dot_rows`, and `dot_rows_int` itself (called directly) decodes a tile at a time.
    fn int_keys(&self) -> bool {
        true
    }

    /// The query is rotated once per call (`R q`), quantized to int8 ([`QueryI8`]; the `q`
    /// passed in, quantized before the rotation, is not used), and scored against each key's
    /// 4-, 3-, 2- or 1-bit indices through the int8-rounded codebook: `n · ts · sq · Σ
    /// c_i·table[code_i]`, `n` the stored norm (norm correction is folded into it at encode).
    /// Error against [`dot_rows`](Stream::dot_rows): at most `n·(sq/2·Σ|ŷ_i| + ts/2·Σ|sq·c_i|)`
    /// (see the tests), plus f32 rounding; TurboQuant_prod adds its sketched query's rounding
    /// to int8 (steps `ssq`), at most `n·γ·√(π/2)/d·d·ssq/2`.
    fn dot_rows_int(
        &self,
        t0: usize,
        t1: usize,
        qs: &[f32],
        _q: &LazyQueryI8<'_>,
        out: &mut [f32],
    ) {
        if let TqCodec::Prod(c) = &self.codec {
            let d = c.head_dim();
            if let Some(lut) = self.prod_lut().filter(|_| d.is_multiple_of(32)) {
                // TurboQuant_prod on its codes: the MSE part as the 1- to 4-bit TurboQuant
                // keys (the rotated query in int8 against the int8-rounded codebook), the QJL
                // part ⟨S q, z⟩ as an integer dot product of the sketched query in int8 with
                // the sign bits ([`IntKeys::Signs`]: `n·γ·Σ ±c`), then
                // `‖x‖·mse + √(π/2)/d·that`.
                let nq = qs.len() / d;
                let pq: Vec<ProdQuery> =
                    qs.chunks_exact(d).map(|q| c.prepare_query(q)).collect();
                let rq: Vec<f32> = pq.iter().flat_map(|p| p.rotated().to_vec()).collect();
                let sk: Vec<f32> = pq.iter().flat_map(|p| p.sketched().to_vec()).collect();
                let (table, ts) = int8_table(c.mse().codebook().centroids());
                let keys = lut_keys(lut, table).expect("prod_lut: 2, 4, 8 or 16 centroids");
                let n = (t1 - t0) * nq;
                let qi = QueryI8::quantize(&rq, d);
                intdot::scores(keys, &self.data, self.rb, t0, t1, &qi, out);
                let mut z = vec![0f32; n];
                let signs = IntKeys::Signs {
                    off: c.mse().row_bytes() + 2,
                };
                let si = QueryI8::quantize(&sk, d);
                intdot::scores(signs, &self.data, self.rb, t0, t1, &si, &mut z);
                let k = c.qjl_factor();
                for (o, z) in out[..n].iter_mut().zip(&z) {
                    *o = *o * ts + k * z;
                }
                return;
            }
            // Other widths: each row unpacked once into [‖x‖ŷ, ‖x‖γ√(π/2)/d·z] and scored
            // against every [R q, S q] by the tiled f32 kernel (f32 throughout; only the
            // order of the sums differs from `dot_rows`).
            let qcat: Vec<f32> = qs
                .chunks_exact(d)
                .flat_map(|q| c.prepare_query(q).concat())
                .collect();
            return dot_rows_with(t0, t1, &qcat, out, 2 * d, |t, r| {
                c.decode_split(self.row(t), r)
            });
        }
        let TqCodec::Mse(c) = &self.codec else {
            unreachable!("TurboQuant_prod returned above")
        };
        let d = c.head_dim();
        let mut rq = qs.to_vec();
        rq.chunks_exact_mut(d).for_each(|q| c.rotate_query(q));
        let cent = c.codebook().centroids();
        let (table, ts) = int8_table(cent);
        if let Some(keys) = lut_keys(cent.len(), table).filter(|_| d.is_multiple_of(32)) {
            // Rows on their codes: the codes unpacked and looked up in the int8-rounded
            // codebook (`IntKeys::Lut4`, `Lut3`, `Lut2`, `Lut1`).
            let qi = QueryI8::quantize(&rq, d);
            let n = (t1 - t0) * (qs.len() / d);
            intdot::scores(keys, &self.data, self.rb, t0, t1, &qi, out);
            scale_in_place(&mut out[..n], ts);
            return;
        }
        // Other widths: a tile of rows decoded in the rotated basis
        // ([`TurboQuantMse::decode_rotated_fast`]), scored against every rotated query by the
        // tiled f32 kernel (the exact path's sums up to f32 rounding).
        dot_rows_with(t0, t1, &rq, out, d, |t, r| {
            c.decode_rotated_fast(self.row(t), r)
        })
    }

    /// Rows of every width on their codes where `d` is a multiple of 32
    /// ([`codeaxpy::axpy_codebook`]): 4-bit rows by the fused code kernel
    /// ([`codeaxpy::axpy_centroids4`] with `fused`: the norm in the weight, one FMA per
    /// element), so plain 4-bit rows are no longer bit for bit `axpy_rows`'s sums, only up to
    /// f32 rounding; 3- and 2-bit rows by [`codeaxpy::axpy_centroids_packed`], 1-bit rows by
    /// [`codeaxpy::axpy_signs`] (the same sums up to f32 rounding); other head sizes a tile of
    /// decoded rows at a time. TurboQuant_prod rows here too: with a 1- to 4-bit MSE stage on
    /// their codes (those kernels for `racc`, [`codeaxpy::axpy_signs`] for `zacc`), otherwise each row unpacked
    /// once into `[‖x‖ŷ, ‖x‖γ√(π/2)/d·z]` ([`TurboQuantProd::decode_split`]) and accumulated
    /// by the tiled f32 kernel into `[racc, zacc]`; either finished per query as on the exact
    /// path ([`TurboQuantProd::finish_sum`]); the same sums up to f32 rounding.
    fn axpy_rows_fast(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        if let TqCodec::Prod(c) = &self.codec {
            let d = c.head_dim();
            let nq = acc.len() / d;
            if self.prod_lut().is_some() && d.is_multiple_of(32) {
                // On the codes: the MSE part by the centroid kernels (rotated basis),
                // the QJL part as ±(w·‖x‖·γ·√(π/2)/d) per sign bit, finished once per query.
                let cent = c.mse().codebook().centroids();
                let (mut racc, mut zacc) = (vec![0f32; nq * d], vec![0f32; nq * d]);
                let (data, rb) = (&self.data, self.rb);
                codeaxpy::axpy_codebook(cent, data, rb, d, t0, t1, w, &mut racc, true);
                // Each row's QJL factor ‖x‖·γ·√(π/2)/d (`qjl_scale`'s product, its constant
                // formed once per call), times each query's weight in the signs' kernel.
                let m = c.mse().row_bytes();
                let kq = c.qjl_factor();
                let f: Vec<f32> = data[t0 * rb..t1 * rb]
                    .chunks_exact(rb)
                    .map(|row| {
                        let f16 = |i: usize| half::f16::from_le_bytes([row[i], row[i + 1]]).to_f32();
                        f16(0) * f16(m) * kq
                    })
                    .collect();
                codeaxpy::axpy_signs(data, rb, m + 2, d, t0, t1, w, &f, &mut zacc);
                for ((a, r), z) in acc
                    .chunks_exact_mut(d)
                    .zip(racc.chunks_exact_mut(d))
                    .zip(zacc.chunks_exact(d))
                {
                    c.finish_sum(r, z, a);
                }
                return;
            }
            let mut split = vec![0f32; nq * 2 * d];
            axpy_rows_with(t0, t1, w, &mut split, 2 * d, |t, r| {
                c.decode_split(self.row(t), r)
            });
            for (a, rz) in acc.chunks_exact_mut(d).zip(split.chunks_exact_mut(2 * d)) {
                let (r, z) = rz.split_at_mut(d);
                c.finish_sum(r, z, a);
            }
            return;
        }
        let TqCodec::Mse(c) = &self.codec else {
            unreachable!("TurboQuant_prod returned above")
        };
        let d = c.head_dim();
        if d.is_multiple_of(32) {
            // On the codes, every width ([`codeaxpy::axpy_codebook`]).
            return self.axpy_codes(c, t0, t1, w, acc, true);
        }
        // Other head sizes: tiles of rows decoded in the rotated basis, summed by the tiled
        // f32 kernel, rotated back once per query.
        let mut racc = vec![0f32; acc.len()];
        axpy_rows_with(t0, t1, w, &mut racc, d, |t, r| {
            c.decode_rotated_fast(self.row(t), r)
        });
        for (a, r) in acc.chunks_exact_mut(d).zip(racc.chunks_exact_mut(d)) {
            c.rotation().inverse(r);
            a.iter_mut().zip(r.iter()).for_each(|(a, v)| *a += v);
        }
    }

    fn axpy_rows(&self, t0: usize, t1: usize, w: &[f32], acc: &mut [f32]) {
        let d = self.codec.head_dim();
        let nq = acc.len() / d;
        let mut y = vec![0f32; d];
        if let Some(c) = self.mse4() {
            // The same sums as the loop below, on the codes.
            return self.axpy_codes(c, t0, t1, w, acc, false);
        }
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
                let mut codes = vec![0u8; d];
                for t in t0..t1 {
                    let wt = &w[(t - t0) * nq..(t - t0 + 1) * nq];
                    if wt.iter().any(|&x| x != 0.0) {
                        c.accumulate_many(self.row(t), wt, &mut racc, &mut zacc, &mut codes);
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

    fn reserve(&mut self, rows: usize) {
        crate::kv::stream::reserve_buffer(&mut self.data, rows * self.rb);
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

    /// Weighted value sums (`sums`: name and `[nq, d]` each) against f64 sums of the stream's
    /// rows `0..n` decoded to the original basis (`decode`), with weights `w` (`[n, nq]`),
    /// within the bound derived in `tq4_values_on_codes_match_decoded_rows`:
    /// `4·(n + 2·log₂d + 4 + extra)·u·√d·Σ_t w_t·mass(t, row_t)` per element (`mass`: the
    /// decoded row's norm, or a bound of a sum's terms where more than the row is summed).
    fn assert_sums_match_decoded(
        s: &TurboQuantStream,
        n: usize,
        w: &[f32],
        sums: &[(&str, &[f32])],
        extra: usize,
        mass: impl Fn(usize, &[f32]) -> f64,
    ) {
        let d = s.codec.head_dim();
        let nq = w.len() / n;
        let mut dec = vec![0f32; n * d];
        for t in 0..n {
            s.decode(t, &mut dec[t * d..(t + 1) * d]);
        }
        let u = 2f64.powi(-24);
        let steps = (n + 2 * d.trailing_zeros() as usize + 4 + extra) as f64;
        for j in 0..nq {
            let m: f64 = (0..n)
                .map(|t| w[t * nq + j] as f64 * mass(t, &dec[t * d..(t + 1) * d]))
                .sum();
            let bound = steps * u * (d as f64).sqrt() * m * 4.0 + 1e-30;
            for i in 0..d {
                let exact: f64 = (0..n).map(|t| w[t * nq + j] as f64 * dec[t * d + i] as f64).sum();
                for (name, got) in sums {
                    let e = (got[j * d + i] as f64 - exact).abs();
                    assert!(e <= bound, "{name} d={d} nq={nq} {j},{i}: {e} > {bound}");
                }
            }
        }
    }

    /// A decoded row's norm (the default `mass` of [`assert_sums_match_decoded`]).
    fn row_norm(_: usize, v: &[f32]) -> f64 {
        v.iter().map(|x| (x * x) as f64).sum::<f64>().sqrt()
    }

    /// Keys: `n` rows, a sum of two uniforms per element, the first 3 channels 8× larger (as
    /// K after RoPE). Queries: the same without outliers.
    fn random_rows(rng: &mut rand::rngs::StdRng, n: usize, d: usize, outliers: usize) -> Vec<f32> {
        (0..n * d)
            .map(|i| {
                let x: f32 = rng.random_range(-1.0..1.0) + rng.random_range(-1.0..1.0);
                if i % d < outliers {
                    8.0 * x
                } else {
                    x
                }
            })
            .collect()
    }

    /// TurboQuant_mse keys of every width (4 to 1 bits) scored on their codes (`dot_rows_int`: rotated
    /// query quantized to int8, centroids rounded to int8) against f64 dot products of the
    /// exact query with the rows decoded to the original basis (`decode`, which shares none of
    /// the integer path), d 32/64/128, 1–8 queries, with and without norm correction.
    ///
    /// Bound. The exact score is `N·Σ_i r_i·y_i` (`r = R q`, `y` the centroids, `N = ‖k‖`
    /// as stored). The fast path computes `N·sq·ts·Σ c_i·t_i` with `r_i = sq·c_i + e_i`,
    /// `|e_i| ≤ sq/2` (query rounding, `sq = max|r|/127`) and `y_i = ts·t_i + f_i`,
    /// `|f_i| ≤ ts/2` (table rounding, `ts = max|centroid|/127`). Then
    /// `r_i·y_i − sq·c_i·ts·t_i = e_i·y_i + sq·c_i·f_i`, so the error is at most
    /// `N·(sq/2·Σ|y_i| + ts/2·Σ|sq·c_i|)` ≤ `N·(sq/2·Σ|y_i| + ts/2·(Σ|r_i| + d·sq/2))`,
    /// plus f32 rounding (1e-4 relative to `N·‖q‖`). The SIMD kernel also equals the scalar
    /// one ([`intdot::scalar_scores`]) within f32 rounding.
    #[test]
    fn tq4_scores_on_codes_within_rounding_bound() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2504);
        let cases = [(32usize, false), (64, false), (128, false), (64, true), (128, true)];
        for (bits, (d, nc)) in [4u8, 3, 2, 1].into_iter().flat_map(|b| cases.map(|c| (b, c))) {
            for nq in [1usize, 3, 8] {
                let n = 45;
                let c = Arc::new(TurboQuantMse::new(d, bits, nc, 7 + d as u64).unwrap());
                let mut s = TurboQuantStream::new(TqCodec::Mse(c.clone()));
                s.push(&random_rows(&mut rng, n, d, 3));
                let qs = random_rows(&mut rng, nq, d, 0);
                assert!(s.int_keys());
                let q8 = LazyQueryI8::new(&qs, d);
                let (t0, t1) = (2, n);
                let mut got = vec![0f32; (t1 - t0) * nq];
                s.dot_rows_int(t0, t1, &qs, &q8, &mut got);
                // The scalar kernel on the same rotated, quantized queries.
                let cent = c.codebook().centroids().to_vec();
                let (table, ts) = int8_table(&cent);
                let mut rq = qs.clone();
                rq.chunks_exact_mut(d).for_each(|q| c.rotate_query(q));
                let mut scalar = vec![0f32; (t1 - t0) * nq];
                let qi = QueryI8::quantize(&rq, d);
                let f = lut_keys(cent.len(), table).unwrap();
                intdot::scalar_scores(f, &s.data, s.rb, t0, t1, &qi, &mut scalar);
                let (mut k, mut y) = (vec![0f32; d], vec![0f32; d]);
                for t in t0..t1 {
                    s.decode(t, &mut k);
                    c.decode_rotated(s.row(t), &mut y); // N·y
                    // The factor the integer sum is multiplied by: the stored norm N (with norm
                    // correction ‖k‖/‖centroid vector‖, folded in at encode).
                    let norm = c.norm(s.row(t)) as f64;
                    let nysum: f64 = y.iter().map(|v| v.abs() as f64).sum();
                    for j in 0..nq {
                        let q = &qs[j * d..(j + 1) * d];
                        let r = &rq[j * d..(j + 1) * d];
                        let exact: f64 = k.iter().zip(q).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let sq = r.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                        let rsum: f64 = r.iter().map(|v| v.abs() as f64).sum();
                        let qn = q.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt();
                        let bound = sq / 2.0 * nysum
                            + norm * ts as f64 / 2.0 * (rsum + d as f64 * sq / 2.0)
                            + 1e-4 * (1.0 + norm * qn);
                        let g = got[(t - t0) * nq + j] as f64;
                        assert!(
                            (g - exact).abs() <= bound,
                            "bits={bits} d={d} nq={nq} t={t} j={j}: {g} vs {exact} (bound {bound})"
                        );
                        let sc = scalar[(t - t0) * nq + j] as f64 * ts as f64;
                        assert!((g - sc).abs() <= 1e-5 * (1.0 + g.abs()), "simd {g} vs scalar {sc}");
                    }
                }
            }
        }
    }

    /// 3-, 2- and 1-bit TurboQuant_mse values on their codes (`axpy_rows_fast` →
    /// [`codeaxpy::axpy_codebook`]: the SIMD [`codeaxpy::axpy_centroids_packed`], and its scalar
    /// loop, for 3 and 2 bits; [`codeaxpy::axpy_signs`] for 1), d 32/64/128, with and without
    /// norm correction, 1–8 queries (four-query blocks and every remainder), some rows' weights
    /// zero. In the rotated basis the kernels against f64 sums of `decode_rotated` rows
    /// (`codes_to_f32`, which shares none of the unpacking): each sums n terms in order, one
    /// rounding of `w·N` and one of each product and sum, so per element at most
    /// `γ_{n+2}·Σ_t w_t·|N_t·y_ti|` (Higham §3.1, `u = 2⁻²⁴`; checked with a factor 2 of
    /// margin). At 1 bit the sum is formed as `Σ_t c_t·(±1) + Σ_t w_t·N_t·(c₀ + c₁)/2` with
    /// `c_t = w_t·N_t·(c₁ − c₀)/2` (two roundings per coefficient, `γ_2`) and the signed sum as
    /// `2·Σ c·z − Σ c` (two sums of n terms, the first doubled, their difference and the add to
    /// `acc`): at most `(3γ_n + γ_2 + 2u)·Σ_t|c_t|`, plus the reference's own rounding of
    /// `N·c` (`u` per term) and `γ_{n+1}·Σ_t w_t·N_t·|c₀ + c₁|/2` for the midpoint; checked
    /// against `4·γ_{n+3}·Σ_t w_t·N_t·max|c|` (`|c_t| ≤ w_t·N_t·max|c|`; ~1.4× margin at
    /// n = 37). In the
    /// original basis the timed path against f64 sums of `decode`d rows within the bound of
    /// `tq4_values_on_codes_match_decoded_rows`.
    #[test]
    fn tq3_values_on_codes_match_decoded_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1988);
        let u = 2f64.powi(-24);
        let cases = [(32usize, false), (64, false), (128, false), (64, true), (128, true)];
        for (bits, (d, nc)) in [3u8, 2, 1].into_iter().flat_map(|b| cases.map(|c| (b, c))) {
            for nq in [1usize, 2, 3, 5, 8] {
                let n = 37;
                let c = Arc::new(TurboQuantMse::new(d, bits, nc, 3).unwrap());
                let mut s = TurboQuantStream::new(TqCodec::Mse(c.clone()));
                s.push(&random_rows(&mut rng, n, d, 0));
                let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
                w[4 * nq..5 * nq].fill(0.0);
                let cent = c.codebook().centroids();
                assert_eq!(cent.len(), 1 << bits);
                let mut simd = vec![0f32; nq * d];
                codeaxpy::axpy_codebook(cent, &s.data, s.rb, d, 0, n, &w, &mut simd, true);
                let mut kernels = vec![("simd", simd)];
                if bits > 1 {
                    let mut scalar = vec![0f32; nq * d];
                    codeaxpy::scalar_axpy_centroids_packed(cent, &s.data, s.rb, d, 0, n, &w, &mut scalar);
                    kernels.push(("scalar", scalar));
                }
                let mut y = vec![0f32; n * d];
                for t in 0..n {
                    c.decode_rotated(s.row(t), &mut y[t * d..(t + 1) * d]);
                }
                let cmax = cent.iter().fold(0f32, |m, c| m.max(c.abs())) as f64;
                let g = |k: usize| k as f64 * u / (1.0 - k as f64 * u);
                for j in 0..nq {
                    for i in 0..d {
                        let terms = (0..n).map(|t| w[t * nq + j] as f64 * y[t * d + i] as f64);
                        let exact: f64 = terms.clone().sum();
                        let bound = if bits > 1 {
                            2.0 * g(n + 2) * terms.map(f64::abs).sum::<f64>()
                        } else {
                            let wn: f64 = (0..n)
                                .map(|t| w[t * nq + j] as f64 * c.norm(s.row(t)) as f64)
                                .sum();
                            4.0 * g(n + 3) * wn * cmax
                        } + 1e-30;
                        for (name, got) in &kernels {
                            let e = (got[j * d + i] as f64 - exact).abs();
                            assert!(
                                e <= bound,
                                "{name} bits={bits} d={d} nc={nc} nq={nq} {j},{i}: {e} > {bound}"
                            );
                        }
                    }
                }
                // The timed path in the original basis.
                let mut fast = vec![0f32; nq * d];
                s.axpy_rows_fast(0, n, &w, &mut fast);
                assert_sums_match_decoded(&s, n, &w, &[("fast", &fast)], 0, row_norm);
            }
        }
    }

    /// Head sizes that are not a multiple of 32 (16 here; every width, norm-corrected or not)
    /// take the tiled f32 path when timed: scores (`dot_rows_int`) and value sums
    /// (`axpy_rows_fast`) against the exact path's (`dot_rows`, `axpy_rows`), which decode row by
    /// row. Both sum the same products in another order: per score `|err| ≤ 2γ_{d+4}·Σ_i|r_i·y_i|` (Higham §3.1,
    /// `γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`, y the decoded rotated key, r the rotated query);
    /// per value element the bound of `tq4_values_on_codes_match_decoded_rows`.
    #[test]
    fn tq_other_widths_timed_path_matches_exact() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        let u = 2f64.powi(-24);
        for (d, bits, nc) in [(16usize, 1u8, false), (16, 2, true), (16, 3, false), (16, 4, true)] {
            let c = Arc::new(TurboQuantMse::new(d, bits, nc, 5).unwrap());
            let mut s = TurboQuantStream::new(TqCodec::Mse(c.clone()));
            let (n, nq) = (37, 3);
            s.push(&random_rows(&mut rng, n, d, 2));
            assert!(s.int_keys());
            let qs = random_rows(&mut rng, nq, d, 0);
            let (mut fast, mut exact) = (vec![0f32; n * nq], vec![0f32; n * nq]);
            s.dot_rows_int(0, n, &qs, &LazyQueryI8::new(&qs, d), &mut fast);
            s.dot_rows(0, n, &qs, &mut exact);
            let mut rq = qs.clone();
            rq.chunks_exact_mut(d).for_each(|q| c.rotate_query(q));
            let mut y = vec![0f32; d];
            let g = |k: usize| k as f64 * u / (1.0 - k as f64 * u);
            for t in 0..n {
                c.decode_rotated(s.row(t), &mut y);
                for j in 0..nq {
                    let mass: f64 = y
                        .iter()
                        .zip(&rq[j * d..(j + 1) * d])
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    let (f, e) = (fast[t * nq + j] as f64, exact[t * nq + j] as f64);
                    let bound = 2.0 * g(d + 4) * mass + 1e-30;
                    assert!((f - e).abs() <= bound, "d={d} bits={bits} nc={nc} t={t}: {f} vs {e}");
                }
            }
            let w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
            let (mut fa, mut ea) = (vec![0.25f32; nq * d], vec![0.25f32; nq * d]);
            s.axpy_rows_fast(0, n, &w, &mut fa);
            s.axpy_rows(0, n, &w, &mut ea);
            let mut v = vec![0f32; d];
            let steps = (n + 2 * d.trailing_zeros() as usize + 4) as f64;
            for j in 0..nq {
                let mass: f64 = (0..n)
                    .map(|t| {
                        s.decode(t, &mut v);
                        w[t * nq + j] as f64 * v.iter().map(|x| (x * x) as f64).sum::<f64>().sqrt()
                    })
                    .sum();
                let bound = steps * u * (d as f64).sqrt() * mass * 4.0 + 1e-30;
                for i in 0..d {
                    let e = (fa[j * d + i] - ea[j * d + i]).abs() as f64;
                    assert!(e <= bound, "d={d} bits={bits} nc={nc} j={j} i={i}: {e} > {bound}");
                }
            }
        }
    }

    /// TurboQuant_prod keys on the fast path (`dot_rows_int`) against the estimator
    /// `‖x‖·(Σ_i r_i·c[code_i] + γ·√(π/2)/d·Σ_i ±s_i)` (TurboQuant §3.2) evaluated here in f64
    /// from the stored bits (read with `code_at`, not the unpacking under test), r, s from
    /// `prepare_query`. d 16/32/64/128, bits 2–5, 1–8 queries. Bounds (Higham §3.1, `u = 2⁻²⁴`,
    /// `γ_k = k·u/(1 − k·u)`):
    /// - d = 16 (split rows, tiled f32 dot products of 2d terms, each entry and product
    ///   rounded once): `|err| ≤ γ_{2d+2}·Σ|terms|`;
    /// - d a multiple of 32 (a 1- to 4-bit MSE stage, on the codes): the MSE part as in
    ///   `tq4_scores_on_codes_within_rounding_bound` (`‖x‖·(sq/2·Σ|c_i| + ts/2·(Σ|r_i| +
    ///   d·sq/2))`, query and table rounding) plus 1e-4 of f32 slack; the QJL part on the sign
    ///   bits ([`IntKeys::Signs`]) with `S q` rounded to int8 in steps `ssq = max|S q|/127`:
    ///   each of the d terms `±(S q)_i` off by at most `ssq/2`, so `‖x‖·k·d·ssq/2`, plus 1e-4
    ///   of f32 slack (the timed path's `R q` and `S q` are `prepare_query`'s, bit for bit).
    #[test]
    fn prod_scores_match_the_estimator() {
        use crate::kv::quant::bits::code_at;
        let mut rng = rand::rngs::StdRng::seed_from_u64(2406);
        let u = 2f64.powi(-24);
        let gam = |k: usize| k as f64 * u / (1.0 - k as f64 * u);
        for d in [16usize, 32, 64, 128] {
            for bits in [2u8, 3, 4, 5] {
                let on_codes = d.is_multiple_of(32);
                let nq = [1usize, 3, 8][(d + bits as usize) % 3];
                let c = Arc::new(TurboQuantProd::new(d, bits, 9).unwrap());
                let mut s = TurboQuantStream::new(TqCodec::Prod(c.clone()));
                let n = 40;
                s.push(&random_rows(&mut rng, n, d, 3));
                assert!(s.int_keys());
                let qs = random_rows(&mut rng, nq, d, 0);
                let mut got = vec![0f32; n * nq];
                s.dot_rows_int(0, n, &qs, &LazyQueryI8::new(&qs, d), &mut got);
                let cent = c.mse().codebook().centroids();
                let ts = cent.iter().fold(0f32, |m, c| m.max(c.abs())) as f64 / 127.0;
                let m = TurboQuantMse::row_bytes_for(d, bits - 1);
                for t in 0..n {
                    let row = s.row(t);
                    let norm = half::f16::from_le_bytes([row[0], row[1]]).to_f32() as f64;
                    let gamma = half::f16::from_le_bytes([row[m], row[m + 1]]).to_f32() as f64;
                    let k = gamma * (std::f64::consts::PI / 2.0).sqrt() / d as f64;
                    for j in 0..nq {
                        let rs = c.prepare_query(&qs[j * d..(j + 1) * d]).concat();
                        let (r, sk) = rs.split_at(d);
                        let (mut exact, mut mass_a, mut mass_b) = (0f64, 0f64, 0f64);
                        let (mut csum, mut rsum) = (0f64, 0f64);
                        for i in 0..d {
                            let ci = cent[code_at(&row[2..m], bits - 1, i)] as f64;
                            let a = norm * r[i] as f64 * ci;
                            let sign = if code_at(&row[m + 2..], 1, i) == 1 { 1.0 } else { -1.0 };
                            let b = norm * k * sign * sk[i] as f64;
                            exact += a + b;
                            mass_a += a.abs();
                            mass_b += b.abs();
                            csum += ci.abs();
                            rsum += (r[i] as f64).abs();
                        }
                        let bound = if on_codes {
                            let sq = r.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                            let ssq = sk.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                            norm * (sq / 2.0 * csum + ts / 2.0 * (rsum + d as f64 * sq / 2.0))
                                + 1e-4 * (1.0 + mass_a)
                                + norm * k * d as f64 * ssq / 2.0
                                + 1e-4 * (1.0 + mass_b)
                        } else {
                            gam(2 * d + 2) * (mass_a + mass_b) + 1e-30
                        };
                        let e = (got[t * nq + j] as f64 - exact).abs();
                        assert!(e <= bound, "d={d} bits={bits} t={t}: {e} > {bound}");
                    }
                }
            }
        }
    }

    /// TurboQuant_prod values on the fast path (`axpy_rows_fast`: on the codes where d is a
    /// multiple of 32, split rows at d = 16) against f64 sums of the rows decoded to the original
    /// basis (`decode`: the MSE part, then `Sᵀz` row by row), d 16–128, bits 2–5, 1–8 queries, a
    /// row's weights zero. Bound per element: the bound of
    /// `tq4_values_on_codes_match_decoded_rows` with both halves' mass, `Σ_t w_t·‖x_t‖·(1 +
    /// γ_t·√(π/2)/d·4d)` (the sketch half, `Sᵀ·zacc`, sums 2d more terms per element; 4d stands
    /// for a column's `Σ_r|S_ri|`, whose mean is 0.8d).
    #[test]
    fn prod_values_match_decoded_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2407);
        for d in [16usize, 32, 64, 128] {
            for bits in [2u8, 3, 4, 5] {
                let nq = [1usize, 3, 8][(d + bits as usize) % 3];
                let c = Arc::new(TurboQuantProd::new(d, bits, 9).unwrap());
                let mut s = TurboQuantStream::new(TqCodec::Prod(c.clone()));
                let n = 37;
                s.push(&random_rows(&mut rng, n, d, 0));
                let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
                w[4 * nq..5 * nq].fill(0.0);
                let mut fast = vec![0f32; nq * d];
                s.axpy_rows_fast(0, n, &w, &mut fast);
                let m = TurboQuantMse::row_bytes_for(d, bits - 1);
                let mass = |t: usize, _: &[f32]| {
                    let row = s.row(t);
                    let norm = half::f16::from_le_bytes([row[0], row[1]]).to_f32() as f64;
                    let g = half::f16::from_le_bytes([row[m], row[m + 1]]).to_f32() as f64;
                    norm * (1.0 + g * (std::f64::consts::PI / 2.0).sqrt() / d as f64 * 4.0 * d as f64)
                };
                assert_sums_match_decoded(&s, n, &w, &[("fast", &fast)], 2 * d, mass);
            }
        }
    }

    /// The 4-bit value paths (`axpy_rows` through [`codeaxpy::axpy_centroids4`], and
    /// `axpy_rows_fast` through its fused form: two roundings fewer per
    /// term, inside the same bound) against f64
    /// sums of the rows decoded to the original basis, d 32/64/128, 1–8 queries, some rows'
    /// weights zero; and the SIMD kernel equals the scalar one bit for bit (the same products
    /// and sums per element). Bound, per element: the rotated-basis sum of n terms differs from
    /// the exact one by at most `γ_{n+1}·Σ_t w_t·|y_ti| ≤ γ_{n+1}·Σ_t w_t‖v_t‖` (Higham,
    /// "Accuracy and Stability of Numerical Algorithms" §3.1, `γ_k = k·u/(1 − k·u)`,
    /// `u = 2⁻²⁴`; `|y_ti| ≤ ‖y_t‖ ≈ ‖v_t‖`, the centroid vector's norm within a few % of 1);
    /// rotating that sum back (log₂d butterfly stages, then a scaling: each output a ±-sum of
    /// d inputs over √d) adds at most `γ_{log₂d+1}·Σ_i|racc_i|/√d ≤ γ_{log₂d+1}·Σ_t w_t‖v_t‖`,
    /// and the reference's own decode (the same rotation per row) as much again. Checked
    /// against `4·(n + 2·log₂d + 4)·u·√d·Σ_t w_t‖v_t‖` (a factor √d·4 of margin for the
    /// approximations). Norm-corrected rows (vLLM's `_nc`) too: their correction is in the
    /// stored norm, so both paths read them as plain rows.
    #[test]
    fn tq4_values_on_codes_match_decoded_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1987);
        for (d, nc) in [(32usize, false), (64, false), (128, false), (64, true), (128, true)] {
            for nq in [1usize, 2, 3, 8] {
                let n = 37;
                let c = Arc::new(TurboQuantMse::new(d, 4, nc, 3).unwrap());
                let mut s = TurboQuantStream::new(TqCodec::Mse(c.clone()));
                s.push(&random_rows(&mut rng, n, d, 0));
                let mut w: Vec<f32> = (0..n * nq).map(|_| rng.random_range(0.0..1.0)).collect();
                w[4 * nq..5 * nq].fill(0.0);
                // The timed path (the fused kernel, `axpy_centroids4(…, fused: true)`) and the
                // exact path on the codes.
                let mut fast = vec![0f32; nq * d];
                s.axpy_rows_fast(0, n, &w, &mut fast);
                let mut got = vec![0f32; nq * d];
                s.axpy_rows(0, n, &w, &mut got);
                let cent: [f32; 16] = c.codebook().centroids().try_into().unwrap();
                let (mut a1, mut a2) = (vec![0f32; nq * d], vec![0f32; nq * d]);
                codeaxpy::axpy_centroids4(&cent, &s.data, s.rb, d, 0, n, &w, &mut a1, false);
                codeaxpy::scalar_axpy_centroids4(&cent, &s.data, s.rb, d, 0, n, &w, &mut a2);
                assert_eq!(a1, a2, "d={d} nq={nq}: SIMD and scalar differ");
                assert_sums_match_decoded(&s, n, &w, &[("fast", &fast), ("exact", &got)], 0, row_norm);
            }
        }
    }

    /// Whole attention over 4-bit TurboQuant_mse keys and values, fast path (keys on the codes)
    /// against the exact path (keys scored in f32 on rotated queries), random inputs, head_dim
    /// 32/64/128, GQA groups 1, 3 and 4, decode and a prefill block. Derived bound: each logit
    /// (score/√d) moves by at most E = (the per-key bound of
    /// [`tq4_scores_on_codes_within_rounding_bound`], maximized over keys)/√d; logits moved by
    /// at most E move every softmax weight by a factor within [e^−2E, e^2E], so each output
    /// moves by at most (e^2E − 1)·max|v| (the value path is shared), plus f32 slack.
    /// Norm-corrected rows (vLLM's `_nc`) at head_dim 64 too: their stored norm is
    /// ‖k‖/‖centroid vector‖.
    #[test]
    fn tq4_fast_attention_matches_exact() {
        use crate::kv::attention::{fast_and_exact, HeadView};
        let mut rng = rand::rngs::StdRng::seed_from_u64(19874);
        for (d, nc) in [(32usize, false), (64, false), (128, false), (64, true)] {
            for (group, n_q) in [(1usize, 1usize), (3, 1), (4, 5)] {
                let n = 60;
                let c = Arc::new(TurboQuantMse::new(d, 4, nc, 11).unwrap());
                let mut ks = TurboQuantStream::new(TqCodec::Mse(c.clone()));
                let mut vs = TurboQuantStream::new(TqCodec::Mse(c.clone()));
                ks.push(&random_rows(&mut rng, n, d, 3));
                vs.push(&random_rows(&mut rng, n, d, 0));
                let q = random_rows(&mut rng, group * n_q, d, 0);
                let head = HeadView { k: &ks, v: &vs };
                let (fast, exact) = fast_and_exact(head, &q, group, n_q, d);
                let cent: [f32; 16] = c.codebook().centroids().try_into().unwrap();
                let ts = int8_table(&cent).1 as f64;
                let (mut y, mut v) = (vec![0f32; d], vec![0f32; d]);
                let mut vmax = 0f64;
                // Per key: (Σ|N·y_i|, N).
                let mut keys = Vec::with_capacity(n);
                for t in 0..n {
                    c.decode_rotated(ks.row(t), &mut y);
                    let nysum: f64 = y.iter().map(|x| x.abs() as f64).sum();
                    // The factor the integer sum is multiplied by: the stored norm N.
                    keys.push((nysum, c.norm(ks.row(t)) as f64));
                    vs.decode(t, &mut v);
                    vmax = v.iter().fold(vmax, |m, &a| m.max(a.abs() as f64));
                }
                for (r, qr) in q.chunks_exact(d).enumerate() {
                    let mut rq = qr.to_vec();
                    c.rotate_query(&mut rq);
                    let sq = rq.iter().fold(0f32, |m, a| m.max(a.abs())) as f64 / 127.0;
                    let rsum: f64 = rq.iter().map(|x| x.abs() as f64).sum();
                    let per_key = keys
                        .iter()
                        .map(|&(nysum, norm)| {
                            sq / 2.0 * nysum + norm * ts / 2.0 * (rsum + d as f64 * sq / 2.0)
                        })
                        .fold(0f64, f64::max);
                    let e = (per_key + 1e-4) / (d as f64).sqrt();
                    let bound = ((2.0 * e).exp() - 1.0) * vmax + 1e-4 * vmax;
                    for i in 0..d {
                        let diff = (fast[r * d + i] - exact[r * d + i]).abs() as f64;
                        assert!(
                            diff <= bound,
                            "d={d} group={group} n_q={n_q} row {r}: {diff} > {bound}"
                        );
                    }
                }
            }
        }
    }
}
