//! The continuous-batching scheduler (Yu et al. 2022, Orca, §3: iteration-level scheduling;
//! vLLM's scheduler, Kwon et al. 2023, §4.5) over a [`Backend`] that runs the model.
//!
//! Each iteration: requests whose arrival time has passed join the waiting queue; waiting
//! requests are admitted first-come first-served while the [`BlockPool`] has the blocks their
//! whole prompt needs and fewer than `max_num_seqs` run (each admitted prompt is prefilled
//! whole, one at a time, and yields its first token); then one decode step runs for every
//! running sequence. Before the step every sequence must hold the blocks for one more token;
//! when the free list is short the newest running sequence is preempted (its blocks freed, its
//! cache dropped) and put at the front of the queue, to be recomputed — prompt and the tokens
//! it already generated prefilled again — when blocks free up (vLLM's recompute preemption,
//! newest first). Finished sequences free their blocks at once. Prefill is not chunked and not
//! mixed into the decode batch (vLLM v0's behaviour; v1 mixes chunks into decode steps).
//!
//! Times are the backend's clock: the real wall clock for the model backend (arrivals are
//! waited for in real time, so the load is open loop), a virtual clock in tests.

use std::collections::VecDeque;

use super::pool::{BlockPool, BlockSizer};
use super::workload::{Arrival, Request};
use crate::error::{Error, Result};

/// What the scheduler needs from whatever runs the model. Sequence indices are positions in
/// the running batch, in admission order.
pub trait Backend {
    /// Seconds since the run began.
    fn now(&self) -> f64;
    /// Waits until `t` seconds (returns at once when `t` has passed).
    fn wait_until(&mut self, t: f64);
    /// Prefills the shared prefix once (prefix caching); returns the seconds it took.
    fn prepare_prefix(&mut self, prefix: &[u32]) -> Result<f64>;
    /// Prefills `tokens` as a new sequence appended to the running batch — after a copy of the
    /// shared prefix's cache when `after_prefix` — and returns its first generated token.
    fn admit(&mut self, tokens: &[u32], after_prefix: bool) -> Result<u32>;
    /// One decode step: feeds `last[i]` to running sequence `i`, returns each one's next token.
    fn step(&mut self, last: &[u32]) -> Result<Vec<u32>>;
    /// Drops running sequence `i` and its cache; later sequences move down by one.
    fn remove(&mut self, i: usize) -> Result<()>;
    /// Bytes of K/V the running batch's caches store ([`crate::kv::KvCache::kv_bytes`]).
    fn kv_bytes(&self) -> usize;
}

/// Scheduler settings.
#[derive(Debug, Clone, Copy)]
pub struct SchedConfig {
    /// How the scheme's bytes map to blocks.
    pub sizer: BlockSizer,
    /// KV budget, bytes (the pool holds `⌊budget / block bytes⌋` blocks).
    pub kv_budget: u64,
    /// Most sequences running at once (vLLM's `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Tokens of the shared prefix every prompt starts with (0: none).
    pub prefix_tokens: usize,
    /// Store the prefix's full blocks once, shared by reference (vLLM's automatic prefix
    /// caching), and prefill it once; otherwise every request prefills and stores it.
    pub prefix_caching: bool,
}

/// What happened to one request. Times in seconds from the start of the run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RequestRecord {
    /// Request index.
    pub id: usize,
    /// Prompt tokens, shared prefix included.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub output_tokens: usize,
    /// When it arrived, s.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub arrival_s: f64,
    /// When its first token was ready (end of its first prefill), s.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub first_token_s: f64,
    /// When each later token was ready, s (`output_tokens − 1` entries).
    pub token_s: Vec<f64>,
    /// Times it was preempted and recomputed.
    pub preemptions: usize,
    /// `ok`, or why it was not served (`rejected: …` when it can never fit the pool).
    pub status: String,
}

impl RequestRecord {
    /// Time to first token, ms.
    pub fn ttft_ms(&self) -> f64 {
        (self.first_token_s - self.arrival_s) * 1e3
    }
    /// End-to-end latency, ms.
    pub fn e2e_ms(&self) -> f64 {
        (self.token_s.last().copied().unwrap_or(self.first_token_s) - self.arrival_s) * 1e3
    }
    /// Time per output token after the first, ms (`None` for one-token outputs).
    pub fn tpot_ms(&self) -> Option<f64> {
        let last = *self.token_s.last()?;
        Some((last - self.first_token_s) * 1e3 / self.token_s.len() as f64)
    }
    /// Gaps between consecutive tokens, ms.
    pub fn itl_ms(&self) -> Vec<f64> {
        std::iter::once(self.first_token_s)
            .chain(self.token_s.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| (w[1] - w[0]) * 1e3)
            .collect()
    }
}

/// The scheduler's state after one iteration.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepSample {
    /// End of the iteration, s.
    #[serde(deserialize_with = "crate::serve::workload::f64_or_nan")]
    pub t_s: f64,
    /// Sequences in the decode batch.
    pub running: usize,
    /// Requests arrived but not running.
    pub waiting: usize,
    /// Blocks in use.
    pub used_blocks: usize,
    /// Blocks the running sequences' tables list (shared blocks once per sequence).
    pub table_blocks: usize,
    /// What the running sequences' K/V take by the cache's accounting
    /// ([`BlockSizer::seq_bytes`] summed; the shared prefix once per sequence), bytes.
    pub accounted_bytes: u64,
    /// What the backend's caches hold ([`Backend::kv_bytes`]), bytes.
    pub stored_bytes: u64,
}

/// A finished point: every request's record and the scheduler's trace.
#[derive(Debug, Clone)]
pub struct ServeOutcome {
    /// Per request, in completion order.
    pub requests: Vec<RequestRecord>,
    /// One sample per decode step.
    pub steps: Vec<StepSample>,
    /// Blocks in the pool.
    pub total_blocks: usize,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Blocks the shared prefix holds once (prefix caching), else 0.
    pub prefix_blocks: usize,
    /// Seconds the one prefill of the shared prefix took (prefix caching), else 0.
    pub prefix_prefill_s: f64,
}

struct Running {
    req: usize,
    seen: usize,
    last: u32,
}

struct State {
    record: RequestRecord,
    generated: Vec<u32>,
}

/// Serves `requests` arriving as `arrival` (open-loop arrival times from `times`, seeded by
/// the caller) on `backend` under `cfg`; `on_finish` sees each record as its request finishes
/// (raw.jsonl is written from it). Errors: the pool's ([`BlockPool::new`], the prefix not
/// fitting), the backend's.
pub fn serve(
    backend: &mut dyn Backend,
    cfg: &SchedConfig,
    requests: &[Request],
    arrival: Arrival,
    prefix: &[u32],
    seed: u64,
    on_finish: &mut dyn FnMut(&RequestRecord) -> Result<()>,
) -> Result<ServeOutcome> {
    if cfg.max_num_seqs == 0 {
        return Err(Error::InvalidArgument {
            name: "--max-num-seqs".into(),
            reason: "must be at least 1".into(),
        });
    }
    let sizer = cfg.sizer;
    let mut pool = BlockPool::new(cfg.kv_budget, sizer.block_bytes())?;
    let caching = cfg.prefix_caching && cfg.prefix_tokens > 0;
    // Only whole blocks are shared (vLLM hashes full blocks): the rest is in every sequence.
    let shared = if caching {
        sizer.blocks_for(cfg.prefix_tokens / sizer.block_tokens * sizer.block_tokens)
    } else {
        0
    };
    let mut prefix_prefill_s = 0.0;
    if caching {
        pool.hold_prefix(shared)?;
        prefix_prefill_s = backend.prepare_prefix(prefix)?;
    }
    let n = requests.len();
    let mut arrivals: VecDeque<(f64, usize)> = match arrival.times(n, seed) {
        Some(t) => t.into_iter().zip(0..n).collect(),
        None => {
            let clients = match arrival {
                Arrival::Closed { clients } => clients,
                _ => unreachable!("open-loop arrivals have times"),
            };
            (0..clients.min(n)).map(|i| (0.0, i)).collect()
        }
    };
    let mut next_closed = match arrival {
        Arrival::Closed { clients } => clients.min(n),
        _ => n,
    };
    let offset = backend.now();
    let mut states: Vec<Option<State>> = (0..n).map(|_| None).collect();
    let mut waiting: VecDeque<usize> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut done = Vec::with_capacity(n);
    let mut steps = Vec::new();
    let mut finished = 0;
    while finished < n {
        let now = backend.now() - offset;
        while arrivals.front().is_some_and(|&(t, _)| t <= now) {
            let (t, i) = arrivals.pop_front().expect("checked");
            states[i] = Some(State {
                record: RequestRecord {
                    id: requests[i].id,
                    prompt_tokens: cfg.prefix_tokens + requests[i].prompt.len(),
                    output_tokens: 0,
                    arrival_s: t,
                    first_token_s: f64::NAN,
                    token_s: Vec::new(),
                    preemptions: 0,
                    status: "ok".into(),
                },
                generated: Vec::new(),
            });
            waiting.push_back(i);
        }
        // Admission, first come first served.
        let mut just_finished: Vec<usize> = Vec::new();
        while let Some(&i) = waiting.front() {
            if running.len() >= cfg.max_num_seqs {
                break;
            }
            let req = &requests[i];
            let st = states[i].as_mut().expect("arrived");
            let total = cfg.prefix_tokens + req.prompt.len() + st.generated.len();
            let need = sizer.blocks_for(total);
            // A request whose whole life cannot fit an empty pool would wait forever.
            let lifetime = sizer.peak_blocks(cfg.prefix_tokens + req.prompt.len() + req.output_len);
            if lifetime.saturating_sub(shared) + shared > pool.total() {
                waiting.pop_front();
                st.record.status = format!(
                    "rejected: needs {lifetime} blocks, the pool has {}",
                    pool.total()
                );
                just_finished.push(i);
                continue;
            }
            if !pool.can_grow(i, need, shared) {
                break;
            }
            waiting.pop_front();
            pool.grow(i, need, shared)?;
            let mut tokens: Vec<u32> = Vec::with_capacity(total);
            if !caching {
                tokens.extend_from_slice(prefix);
            }
            tokens.extend_from_slice(&req.prompt);
            tokens.extend_from_slice(&st.generated);
            let tok = backend.admit(&tokens, caching)?;
            let t = backend.now() - offset;
            if st.generated.is_empty() {
                st.record.first_token_s = t;
            } else {
                st.record.token_s.push(t);
            }
            st.generated.push(tok);
            running.push(Running {
                req: i,
                seen: total,
                last: tok,
            });
            if st.generated.len() >= req.output_len {
                just_finished.push(i);
            }
        }
        retire(&mut running, &just_finished, backend, &mut pool)?;
        if running.is_empty() {
            for &i in &just_finished {
                finished += 1;
                finish(states[i].take(), &mut done, on_finish)?;
                if next_closed < n {
                    arrivals.push_back((backend.now() - offset, next_closed));
                    next_closed += 1;
                }
            }
            if finished >= n {
                break;
            }
            if waiting.is_empty() {
                match arrivals.front() {
                    Some(&(t, _)) => backend.wait_until(t + offset),
                    None => {
                        return Err(Error::InvalidArgument {
                            name: "serve".into(),
                            reason: "no request is running, waiting or due".into(),
                        })
                    }
                }
            }
            continue;
        }
        // Blocks for one more token each; preempt the newest until they fit.
        loop {
            let need: usize = running
                .iter()
                .map(|r| pool.new_blocks(r.req, sizer.blocks_for(r.seen + 1), shared))
                .sum();
            if need <= pool.free() || running.len() <= 1 {
                break;
            }
            let r = running.pop().expect("len > 1");
            pool.release(r.req);
            backend.remove(running.len())?;
            let st = states[r.req].as_mut().expect("running");
            st.record.preemptions += 1;
            waiting.push_front(r.req);
        }
        for r in &running {
            pool.grow(r.req, sizer.blocks_for(r.seen + 1), shared)?;
        }
        let last: Vec<u32> = running.iter().map(|r| r.last).collect();
        let next = backend.step(&last)?;
        let t = backend.now() - offset;
        let mut ended = Vec::new();
        for (r, tok) in running.iter_mut().zip(next) {
            r.seen += 1;
            r.last = tok;
            let st = states[r.req].as_mut().expect("running");
            st.generated.push(tok);
            st.record.token_s.push(t);
            if st.generated.len() >= requests[r.req].output_len {
                ended.push(r.req);
            }
        }
        steps.push(StepSample {
            t_s: t,
            running: running.len(),
            waiting: waiting.len(),
            used_blocks: pool.used(),
            table_blocks: pool.table_entries(),
            accounted_bytes: running.iter().map(|r| sizer.seq_bytes(r.seen)).sum(),
            stored_bytes: backend.kv_bytes() as u64,
        });
        ended.extend(just_finished);
        retire(&mut running, &ended, backend, &mut pool)?;
        for i in ended {
            finished += 1;
            finish(states[i].take(), &mut done, on_finish)?;
            if next_closed < n {
                arrivals.push_back((backend.now() - offset, next_closed));
                next_closed += 1;
            }
        }
    }
    Ok(ServeOutcome {
        requests: done,
        steps,
        total_blocks: pool.total(),
        block_bytes: pool.block_bytes(),
        prefix_blocks: pool.prefix_blocks(),
        prefix_prefill_s,
    })
}

/// Removes finished requests `ids` from the running batch (backend and pool).
fn retire(
    running: &mut Vec<Running>,
    ids: &[usize],
    backend: &mut dyn Backend,
    pool: &mut BlockPool,
) -> Result<()> {
    for idx in (0..running.len()).rev() {
        if ids.contains(&running[idx].req) {
            let r = running.remove(idx);
            pool.release(r.req);
            backend.remove(idx)?;
        }
    }
    Ok(())
}

fn finish(
    st: Option<State>,
    done: &mut Vec<RequestRecord>,
    on_finish: &mut dyn FnMut(&RequestRecord) -> Result<()>,
) -> Result<()> {
    if let Some(mut st) = st {
        st.record.output_tokens = st.generated.len();
        on_finish(&st.record)?;
        done.push(st.record);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kv::CacheGeometry;

    use crate::serve::virtual_backend::{FixedCost, VirtualBackend};

    /// The scheduler's tests' clock: prefill costs 1 ms per token, a decode step 10 ms + 1 ms
    /// per sequence.
    pub(crate) fn mock(sizer: BlockSizer) -> VirtualBackend<FixedCost> {
        VirtualBackend::new(
            FixedCost {
                prefill_token_s: 1e-3,
                step_s: 0.010,
                step_seq_s: 0.001,
            },
            sizer,
        )
    }

    pub(crate) fn fp16_sizer() -> BlockSizer {
        BlockSizer {
            scheme: crate::kv::KvScheme::FP16,
            geom: CacheGeometry {
                layers: 30,
                kv_heads: 3,
                q_heads: 9,
                head_dim: 64,
            },
            block_tokens: 16,
        }
    }

    fn reqs(n: usize, prompt: usize, out: usize) -> Vec<Request> {
        (0..n)
            .map(|id| Request {
                id,
                prompt: vec![7; prompt],
                output_len: out,
            })
            .collect()
    }

    fn run(cfg: SchedConfig, r: &[Request], prefix: &[u32]) -> ServeOutcome {
        let mut m = mock(cfg.sizer);
        serve(
            &mut m,
            &cfg,
            r,
            Arrival::Poisson {
                rate: f64::INFINITY,
            },
            prefix,
            0,
            &mut |_| Ok(()),
        )
        .unwrap()
    }

    /// A pool of 10 blocks (16 tokens each), 4 requests of 40 prompt tokens (3 blocks) and 10
    /// output tokens, all at once. By hand: r0, r1, r2 are admitted (9 blocks, 1 free); r3 waits.
    /// After 8 steps they hold 48 tokens; the 9th step needs a 4th block each (3 > 1 free), so
    /// r2 — the newest — is preempted (4 free; r0 and r1 take 2); r0 and r1 finish at that step.
    /// r2 is recomputed (40 + 9 tokens: 4 blocks), which yields its 10th token and finishes; r3
    /// runs alone. Max 3 running, 1 preemption, 4 completions, 10 tokens each.
    #[test]
    fn tiny_budget_by_hand() {
        let s = fp16_sizer();
        let cfg = SchedConfig {
            sizer: s,
            kv_budget: 10 * s.block_bytes() + 5,
            max_num_seqs: 64,
            prefix_tokens: 0,
            prefix_caching: false,
        };
        let o = run(cfg, &reqs(4, 40, 10), &[]);
        assert_eq!(o.total_blocks, 10);
        assert_eq!(o.steps.iter().map(|x| x.running).max(), Some(3));
        assert_eq!(o.requests.iter().map(|r| r.preemptions).sum::<usize>(), 1);
        assert_eq!(o.requests.len(), 4);
        assert!(o
            .requests
            .iter()
            .all(|r| r.output_tokens == 10 && r.status == "ok"));
        let order: Vec<usize> = o.requests.iter().map(|r| r.id).collect();
        assert_eq!(order, vec![0, 1, 2, 3]);
        assert_eq!(o.requests[2].preemptions, 1);
        for st in &o.steps {
            // The pool's accounting matches what the caches hold, and never exceeds the blocks.
            assert_eq!(st.accounted_bytes, st.stored_bytes);
            assert!(st.stored_bytes <= st.table_blocks as u64 * o.block_bytes);
            assert!(st.used_blocks <= 10);
        }
    }

    /// A shared prefix of 32 tokens (2 full blocks) + 8-token prompts, 8 output tokens: each
    /// sequence holds 40..47 tokens = 3 blocks, 2 of them shared. 10 blocks: with prefix caching
    /// the prefix takes 2 and each sequence 1 more → 8 run at once; without, 3 blocks each → 3.
    #[test]
    fn prefix_sharing_by_hand() {
        let s = fp16_sizer();
        let cfg = SchedConfig {
            sizer: s,
            kv_budget: 10 * s.block_bytes(),
            max_num_seqs: 64,
            prefix_tokens: 32,
            prefix_caching: true,
        };
        let prefix = vec![5u32; 32];
        let o = run(cfg, &reqs(10, 8, 8), &prefix);
        assert_eq!(o.prefix_blocks, 2);
        assert_eq!(o.steps.iter().map(|x| x.running).max(), Some(8));
        assert!(o.steps.iter().any(|x| x.table_blocks - x.used_blocks == 14));
        let off = run(
            SchedConfig {
                prefix_caching: false,
                ..cfg
            },
            &reqs(10, 8, 8),
            &prefix,
        );
        assert_eq!(off.steps.iter().map(|x| x.running).max(), Some(3));
        assert!(off.requests.iter().all(|r| r.prompt_tokens == 40));
    }

    /// A request that cannot fit an empty pool is rejected, not waited on forever.
    #[test]
    fn too_long_is_rejected() {
        let s = fp16_sizer();
        let cfg = SchedConfig {
            sizer: s,
            kv_budget: 2 * s.block_bytes(),
            max_num_seqs: 4,
            prefix_tokens: 0,
            prefix_caching: false,
        };
        let o = run(cfg, &reqs(2, 40, 2), &[]);
        assert!(o.requests.iter().all(|r| r.status.starts_with("rejected")));
    }

    /// Closed loop with 2 clients: never more than 2 running.
    #[test]
    fn closed_loop_caps_concurrency() {
        let s = fp16_sizer();
        let cfg = SchedConfig {
            sizer: s,
            kv_budget: 100 * s.block_bytes(),
            max_num_seqs: 64,
            prefix_tokens: 0,
            prefix_caching: false,
        };
        let mut m = mock(s);
        let o = serve(
            &mut m,
            &cfg,
            &reqs(6, 20, 5),
            Arrival::Closed { clients: 2 },
            &[],
            0,
            &mut |_| Ok(()),
        )
        .unwrap();
        assert_eq!(o.requests.len(), 6);
        assert_eq!(o.steps.iter().map(|x| x.running).max(), Some(2));
    }
}
