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

use super::stream::Stream;

/// Query positions handled by one task (bounds its score buffer at `group × QUERY_BLOCK × keys`).
pub const QUERY_BLOCK: usize = 32;
/// Smallest key chunk worth a task of its own when splitting a decode step over threads.
pub const MIN_KEY_CHUNK: usize = 256;
/// Row × query visits below which a call stays on one thread (about 65 µs of work at the
/// ~16 ns a visit of a 64-element row costs on a 2-thread Xeon). It was 32 × 1024 (taken for
/// ~0.1 ms, in fact 0.5 ms there): a decode step of 16 sequences × 216 tokens then ran its
/// attention on one thread (15.3 ms per step) while 16 × 266 tokens, above it, took 9.7 ms
/// on two — serving's contexts mostly lie below 256 tokens, the calibration's long one above.
pub const PARALLEL_WORK: usize = 4 * 1024;

/// One (sequence, kv head) as attention sees it.
#[derive(Clone, Copy)]
pub struct HeadView<'a> {
    /// Stored keys (RoPE applied before storing).
    pub k: &'a dyn Stream,
    /// Stored values.
    pub v: &'a dyn Stream,
}

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Sequences.
    pub batch: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query heads per kv head (GQA group size).
    pub group: usize,
    /// New query positions per sequence.
    pub n_q: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Score int8 and 4-bit keys in f32 after widening each row (the reference path) instead
    /// of on their codes with int8-quantized queries ([`super::intdot`]).
    pub exact: bool,
}

/// Partial attention of some queries over a slot range: per query the running max and sum of
/// exp(score − max), and the unnormalized weighted sum of values; optionally the exp-weights
/// per (slot, query) for attention-score accounting (H2O).
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
    weights: Option<Vec<f32>>,
    slots: (usize, usize),
}

/// Output of [`attend`].
pub struct Attention {
    /// `[batch, kv_heads·group, n_q, head_dim]` f32.
    pub out: Vec<f32>,
    /// With `want_scores`: for each (sequence, kv head), the attention probability each slot
    /// received, summed over the group's query heads and the new queries.
    pub slot_scores: Option<Vec<Vec<f32>>>,
}

/// `items.iter().map(f).collect()`, run on candle's CPU thread pool (the barrier pool its
/// matmuls use), so attention and the linear layers of a decode step share one set of threads.
/// A second pool (rayon's) would compete with candle's workers, which spin for a while after
/// every matmul waiting for the next: on 2 cores that halved the attention's share of the CPU.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let slots: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
        for i in range {
            let r = f(&items[i]);
            *slots[i].lock().expect("no panic while holding the slot") = Some(r);
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .expect("no panic while holding the slot")
                .expect("every item ran")
        })
        .collect()
}

/// Tests' shared check: one head's attention (`batch` 1, one kv head, `group` query heads,
/// `n_q` positions, `head_dim` elements) on the timed path (codes, `exact: false`) and on the
/// exact f32 path, `(fast, exact)`, each `[group · n_q, head_dim]` f32.
#[cfg(test)]
pub(crate) fn fast_and_exact(
    head: HeadView<'_>,
    q: &[f32],
    group: usize,
    n_q: usize,
    head_dim: usize,
) -> (Vec<f32>, Vec<f32>) {
    let shape = |exact| AttnShape {
        batch: 1,
        kv_heads: 1,
        group,
        n_q,
        head_dim,
        exact,
    };
    (
        attend(&[head], q, shape(false), false).out,
        attend(&[head], q, shape(true), false).out,
    )
}

/// Causal scaled-dot-product attention over stored rows for every (sequence, query head).
///
/// - `heads[b * kv_heads + h]`: the stored K/V of sequence `b`, kv head `h`.
/// - `q`: `[batch, kv_heads·group, n_q, head_dim]` f32, RoPE applied, for the `n_q` tokens just
///   appended (the last `n_q` slots of every head); new token `i` sees every older slot and new
///   tokens `0..=i`. Query head `hq` reads kv head `hq / group`.
/// - output: `softmax(q·Kᵀ / √head_dim) · V` per query.
pub fn attend(heads: &[HeadView<'_>], q: &[f32], s: AttnShape, want_scores: bool) -> Attention {
    let d = s.head_dim;
    let q_blocks = s.n_q.div_ceil(QUERY_BLOCK);
    let base_tasks = s.batch * s.kv_heads * q_blocks;
    let threads = candle_core::utils::barrier_pool().n_workers() + 1;
    let work: usize = heads.iter().map(|h| h.k.len()).sum::<usize>() * s.group * s.n_q;
    let max_slots = heads.iter().map(|h| h.k.len()).max().unwrap_or(0);
    // Split slots when there are too few tasks to balance every thread (at least 4 per thread).
    // The pool hands each thread an equal share of the tasks, so their count is rounded up to
    // a multiple of the threads where the keys allow (3 kv heads on 2 threads: 12 tasks, not
    // 9, whose 5 : 4 split left one thread idle for a ninth of the step).
    let chunks = if base_tasks >= 4 * threads || work < PARALLEL_WORK {
        1
    } else {
        let most = (max_slots / MIN_KEY_CHUNK).max(1);
        let mut c = (4 * threads).div_ceil(base_tasks).min(most);
        // Timed path only: the exact path keeps its key split, so quality numbers do not move.
        while !s.exact && c < most && !(base_tasks * c).is_multiple_of(threads) {
            c += 1;
        }
        c
    };
    let tasks: Vec<(usize, usize, usize)> = (0..s.batch * s.kv_heads)
        .flat_map(|bh| (0..q_blocks).flat_map(move |qb| (0..chunks).map(move |c| (bh, qb, c))))
        .collect();
    // Small calls (short-context decode) run on the calling thread: a parallel join costs more
    // than the work, and on a loaded machine each join can wait a whole scheduler slice for a
    // preempted worker (seen as 25× slower decode steps when another process shared the cores).
    let run = |&(bh, qb, c): &(usize, usize, usize)| {
        let (b, h) = (bh / s.kv_heads, bh % s.kv_heads);
        let head = &heads[bh];
        let i0 = qb * QUERY_BLOCK;
        let i1 = (i0 + QUERY_BLOCK).min(s.n_q);
        let n = head.k.len();
        let per = n.div_ceil(chunks);
        let slots = ((c * per).min(n), ((c + 1) * per).min(n));
        // Gather the block's queries: [group × (i1 − i0), d], head-major.
        let mut qs = Vec::with_capacity(s.group * (i1 - i0) * d);
        let mut qi = Vec::with_capacity(s.group * (i1 - i0));
        for g in 0..s.group {
            let hq = h * s.group + g;
            let off = ((b * s.kv_heads * s.group + hq) * s.n_q) * d;
            qs.extend_from_slice(&q[off + i0 * d..off + i1 * d]);
            qi.extend(i0..i1);
        }
        partial(head, slots, n - s.n_q, &qs, &qi, d, want_scores, s.exact)
    };
    let partials: Vec<Partial> = if work >= PARALLEL_WORK {
        par_map(&tasks, run)
    } else {
        tasks.iter().map(run).collect()
    };
    // Merge slot chunks, scatter into [batch, q_heads, n_q, d], and sum slot scores.
    let mut out = vec![0f32; q.len()];
    let mut slot_scores: Option<Vec<Vec<f32>>> =
        want_scores.then(|| heads.iter().map(|h| vec![0f32; h.k.len()]).collect());
    for (t, parts) in partials.chunks(chunks).enumerate() {
        let (bh, qb, _) = tasks[t * chunks];
        let (b, h) = (bh / s.kv_heads, bh % s.kv_heads);
        let i0 = qb * QUERY_BLOCK;
        let nb = (i0 + QUERY_BLOCK).min(s.n_q) - i0;
        let nq = s.group * nb;
        for j in 0..nq {
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
            if let Some(scores) = slot_scores.as_mut() {
                for p in parts.iter().filter(|p| p.max[j] > f32::NEG_INFINITY) {
                    let w = (p.max[j] - m).exp() * inv;
                    let e = p
                        .weights
                        .as_ref()
                        .expect("weights kept when scores are wanted");
                    for (k, slot) in (p.slots.0..p.slots.1).enumerate() {
                        scores[bh][slot] += e[k * nq + j] * w;
                    }
                }
            }
        }
    }
    Attention { out, slot_scores }
}

/// Attention of queries `qs` (`[J, d]`, query-block offsets `qi`: query `j` is new token
/// `qi[j]` of this call) over slots `slots.0..slots.1`, unnormalized. Visibility needs no
/// positions: the call's `n_q` new tokens are the last `n_q` slots in order (eviction only runs
/// after attention), and everything before them is older than every query, so slot `t` is
/// visible to new token `i` iff `t ≤ base + i`, `base = slots − n_q`.
#[allow(clippy::too_many_arguments)] // the task's coordinates; a struct would only rename them
fn partial(
    head: &HeadView<'_>,
    slots: (usize, usize),
    base: usize,
    qs: &[f32],
    qi: &[usize],
    d: usize,
    keep_weights: bool,
    exact: bool,
) -> Partial {
    let nq = qi.len();
    let scale = 1.0 / (d as f32).sqrt();
    let last_visible = base + qi.iter().copied().max().unwrap_or(0); // inclusive
    let (t0, t1) = (slots.0, slots.1.min(last_visible + 1).max(slots.0));
    let n = t1 - t0;
    // w[(t − t0) · nq + j], slot-major so a decoded key row is used by every query in turn.
    // Unless the caller keeps the weights, the buffer is the thread's own, reused from call to
    // call: at short contexts the allocations per call were a visible share of a decode step.
    let mut w = if keep_weights {
        Vec::new()
    } else {
        WEIGHTS.with(|c| c.take())
    };
    w.clear();
    w.resize(n * nq, 0.0);
    let mut max = vec![f32::NEG_INFINITY; nq];
    let mut sum = vec![0f32; nq];
    let mut acc = vec![0f32; nq * d];
    if n > 0 {
        if !exact && head.k.int_keys() && d.is_multiple_of(32) {
            let q = super::intdot::LazyQueryI8::new(qs, d);
            head.k.dot_rows_int(t0, t1, qs, &q, &mut w);
        } else {
            head.k.dot_rows(t0, t1, qs, &mut w);
        }
        super::simd::scale_in_place(&mut w, scale);
        // Only the newest slots can be masked (a prefill block's later tokens).
        let first_masked = base + qi.iter().copied().min().unwrap_or(0) + 1;
        for t in first_masked.max(t0)..t1 {
            for (j, &i) in qi.iter().enumerate() {
                if t > base + i {
                    w[(t - t0) * nq + j] = f32::NEG_INFINITY;
                }
            }
        }
        if exact {
            // The reference path keeps libm's exp and a sequential sum per query, so quality
            // numbers are bit-identical to what they were before the vectorized softmax.
            for sc in w.chunks_exact(nq) {
                for j in 0..nq {
                    max[j] = max[j].max(sc[j]);
                }
            }
            for sc in w.chunks_exact_mut(nq) {
                for j in 0..nq {
                    let e = if sc[j] == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (sc[j] - max[j]).exp()
                    };
                    sc[j] = e;
                    sum[j] += e;
                }
            }
        } else {
            super::simd::max_per_query(&w, nq, &mut max);
            super::simd::exp_sub_sum(&mut w, nq, &max, &mut sum);
        }
        if exact {
            head.v.axpy_rows(t0, t1, &w, &mut acc);
        } else {
            head.v.axpy_rows_fast(t0, t1, &w, &mut acc);
        }
    }
    let weights = if keep_weights {
        Some(w)
    } else {
        // A prefill block over a long context can need tens of MB: not kept past 4 MiB.
        if w.capacity() <= 1 << 20 {
            WEIGHTS.with(|c| c.replace(w));
        }
        None
    };
    Partial {
        max,
        sum,
        acc,
        weights,
        slots: (t0, t1),
    }
}

thread_local! {
    /// Each thread's attention-weight buffer ([`partial`]'s `w`), kept between calls.
    static WEIGHTS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
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
    use crate::kv::stream::{RowStream, Stream};

    fn store(rows: &[[f32; 2]]) -> RowStream<F16Row> {
        let mut s = RowStream::new(F16Row, 2);
        for r in rows {
            s.push(r);
        }
        s
    }

    fn run(k: &RowStream<F16Row>, v: &RowStream<F16Row>, q: &[f32], n_q: usize) -> Attention {
        let head = HeadView { k, v };
        let shape = AttnShape {
            batch: 1,
            kv_heads: 1,
            group: 1,
            n_q,
            head_dim: 2,
            exact: true,
        };
        attend(&[head], q, shape, true)
    }

    /// Two keys, one query, head_dim 2, values exact in f16: hand-computed softmax.
    #[test]
    fn hand_computed_two_keys() {
        let k = store(&[[1.0, 0.0], [0.0, 1.0]]);
        let v = store(&[[1.0, 2.0], [3.0, 4.0]]);
        // q = (ln 3 · √2, 0): scores (ln 3, 0) → weights (3/4, 1/4).
        let a = run(&k, &v, &[(3f32).ln() * 2f32.sqrt(), 0.0], 1);
        assert!(
            (a.out[0] - (0.75 * 1.0 + 0.25 * 3.0)).abs() < 1e-3,
            "{:?}",
            a.out
        );
        assert!(
            (a.out[1] - (0.75 * 2.0 + 0.25 * 4.0)).abs() < 1e-3,
            "{:?}",
            a.out
        );
        let sc = &a.slot_scores.unwrap()[0];
        assert!(
            (sc[0] - 0.75).abs() < 1e-3 && (sc[1] - 0.25).abs() < 1e-3,
            "{sc:?}"
        );
        // Causal mask: with two queries the first sees only key 0, so it returns v0 exactly.
        let a2 = run(&k, &v, &[1.0, 1.0, 1.0, 1.0], 2);
        assert_eq!(&a2.out[..2], &[1.0, 2.0]);
        assert!((a2.out[2] - 2.0).abs() < 1e-3 && (a2.out[3] - 3.0).abs() < 1e-3);
    }

    /// Splitting the keys into chunks and merging must equal one pass: 1000 keys whose value is
    /// their index, uniform scores → the mean index 499.5; each slot's score is 1/1000.
    #[test]
    fn key_chunks_merge_exactly() {
        let n = 1000;
        let k = store(&vec![[0.0, 0.0]; n]);
        let rows: Vec<[f32; 2]> = (0..n).map(|t| [t as f32, 1.0]).collect();
        let v = store(&rows);
        let a = run(&k, &v, &[0.3, -0.2], 1);
        assert!((a.out[0] - 499.5).abs() < 1e-2, "{:?}", a.out);
        assert!((a.out[1] - 1.0).abs() < 1e-5);
        let sc = &a.slot_scores.unwrap()[0];
        assert!(sc.iter().all(|&x| (x - 1e-3).abs() < 1e-6));
    }
}
