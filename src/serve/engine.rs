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
    /// `lifetime`: the tokens the sequence's cache may hold by its end (prefix, prompt and
    /// output), reserved up front where the backend keeps real caches
    /// ([`crate::kv::KvCache::reserve`], as vLLM allocates a sequence's blocks; 0: none), so
    /// no decode step pays for growing it.
    fn admit(&mut self, tokens: &[u32], after_prefix: bool, lifetime: usize) -> Result<u32>;
    /// One decode step: feeds `last[i]` to running sequence `i`, returns each one's next token.
    fn step(&mut self, last: &[u32]) -> Result<Vec<u32>>;
    /// Drops running sequence `i` and its cache; later sequences move down by one.
    fn remove(&mut self, i: usize) -> Result<()>;
    /// Bytes of K/V the running batch's caches store ([`crate::kv::KvCache::kv_bytes`]).
    fn kv_bytes(&self) -> usize;
    /// Seconds the last decode step spent in the attention kernels
    /// ([`crate::kv::AttentionMeter`]); NaN where the backend does not time them (the default:
    /// a virtual clock, CUDA).
    fn last_attention_s(&self) -> f64 {
        f64::NAN
    }
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
    /// Seconds the decode step itself took ([`Backend::step`], the backend's clock read
    /// before and after it); NaN in runs written before it was recorded.
    #[serde(
        default = "nan",
        deserialize_with = "crate::serve::workload::f64_or_nan"
    )]
    pub step_s: f64,
    /// Seconds of that step inside the attention kernels ([`Backend::last_attention_s`]; NaN
    /// where not timed, and in older runs).
    #[serde(
        default = "nan",
        deserialize_with = "crate::serve::workload::f64_or_nan"
    )]
    pub attention_s: f64,
    /// Tokens the step's sequences held before it (Σ context over the batch: the K/V the
    /// step's attention reads, less its own new token per sequence); 0 in older runs.
    #[serde(default)]
    pub context_tokens: u64,
    /// Seconds of the prefills ([`Backend::admit`]) since the previous sample; NaN in older
    /// runs.
    #[serde(
        default = "nan",
        deserialize_with = "crate::serve::workload::f64_or_nan"
    )]
    pub prefill_s: f64,
    /// Tokens those prefills ran (prompts, and recomputed contexts after preemption); 0 in
    /// older runs.
    #[serde(default)]
    pub prefill_tokens: u64,
    /// The longest of those prefills, tokens (0: none; 0 in runs before 2026-12-05): what the
    /// performance model charges the step after a prefill by
    /// ([`crate::perf::PerfModel::decode_after_prefill`]).
    #[serde(default)]
    pub prefill_longest: u64,
}

fn nan() -> f64 {
    f64::NAN
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
/// (raw.jsonl is written from it). Errors: `--max-num-seqs` 0, the pool's ([`BlockPool::new`],
/// the prefix not fitting), the backend's, `on_finish`'s, and a schedule with nothing left to
/// run or wait for.
pub fn serve(
    backend: &mut dyn Backend,
    cfg: &SchedConfig,
    requests: &[Request],
    arrival: Arrival,
    prefix: &[u32],
    seed: u64,
    on_finish: &mut dyn FnMut(&RequestRecord) -> Result<()>,
) -> Result<ServeOutcome> {
    Scheduler::new(backend, cfg, requests, arrival, prefix, seed, on_finish)?.run()
}

/// The queue of requests not yet arrived, `(arrival time s, request index)` in arrival order,
/// and the index of the next request a closed-loop client sends when one of its requests
/// finishes (`n`, i.e. none, for open loops). Open loops take every time from
/// [`Arrival::times`]; a closed loop of `c` clients starts with `min(c, n)` requests at 0 s.
fn initial_arrivals(arrival: Arrival, n: usize, seed: u64) -> (VecDeque<(f64, usize)>, usize) {
    let arrivals = match arrival.times(n, seed) {
        Some(t) => t.into_iter().zip(0..n).collect(),
        None => {
            let clients = match arrival {
                Arrival::Closed { clients } => clients,
                _ => unreachable!("open-loop arrivals have times"),
            };
            (0..clients.min(n)).map(|i| (0.0, i)).collect()
        }
    };
    let next_closed = match arrival {
        Arrival::Closed { clients } => clients.min(n),
        _ => n,
    };
    (arrivals, next_closed)
}

/// One serving run in progress: the pool, the queues and every request's progress. [`serve`]
/// builds it ([`Scheduler::new`]) and runs it ([`Scheduler::run`]); each iteration is a fixed
/// sequence of the steps below (arrivals, admission, retirement, growth with preemption, one
/// decode step, retirement, completion). Every time it records is the backend's clock minus
/// `offset`, read exactly where a step says it is read.
struct Scheduler<'a> {
    backend: &'a mut dyn Backend,
    cfg: &'a SchedConfig,
    requests: &'a [Request],
    /// The shared prefix's tokens (prefilled with every prompt unless `caching`).
    prefix: &'a [u32],
    on_finish: &'a mut dyn FnMut(&RequestRecord) -> Result<()>,
    pool: BlockPool,
    /// Prefix caching is on and there is a prefix to cache.
    caching: bool,
    /// Blocks of the prefix held once and shared by every sequence (0 without caching).
    shared: usize,
    /// Seconds the one prefill of the shared prefix took (0 without caching).
    prefix_prefill_s: f64,
    /// The backend's clock when the run began, s.
    offset: f64,
    /// Requests not yet arrived, `(arrival s, index)` ([`initial_arrivals`]).
    arrivals: VecDeque<(f64, usize)>,
    /// The request a closed-loop client sends next (`n`: none).
    next_closed: usize,
    /// Per request: its record and tokens so far, from arrival until it finishes.
    states: Vec<Option<State>>,
    /// Arrived requests not running, in admission order (preempted ones at the front).
    waiting: VecDeque<usize>,
    /// The decode batch, in the backend's order (admission order).
    running: Vec<Running>,
    /// Finished requests' records, in completion order.
    done: Vec<RequestRecord>,
    /// One sample per decode step.
    steps: Vec<StepSample>,
    /// Requests finished (served or rejected).
    finished: usize,
    /// Seconds, tokens and the longest prefill's tokens of the prefills since the last
    /// [`StepSample`].
    prefilled: (f64, u64, u64),
}

impl<'a> Scheduler<'a> {
    /// Sets a run up: checks `max_num_seqs`, sizes the pool, holds and prefills the shared
    /// prefix when caching it, queues the arrivals, and takes the backend's clock as time 0.
    /// Errors: [`Error::InvalidArgument`] for `--max-num-seqs` 0, [`BlockPool::new`]'s and
    /// [`BlockPool::hold_prefix`]'s, and [`Backend::prepare_prefix`]'s.
    fn new(
        backend: &'a mut dyn Backend,
        cfg: &'a SchedConfig,
        requests: &'a [Request],
        arrival: Arrival,
        prefix: &'a [u32],
        seed: u64,
        on_finish: &'a mut dyn FnMut(&RequestRecord) -> Result<()>,
    ) -> Result<Self> {
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
        let (arrivals, next_closed) = initial_arrivals(arrival, n, seed);
        let offset = backend.now();
        Ok(Scheduler {
            backend,
            cfg,
            requests,
            prefix,
            on_finish,
            pool,
            caching,
            shared,
            prefix_prefill_s,
            offset,
            arrivals,
            next_closed,
            states: (0..n).map(|_| None).collect(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            done: Vec::with_capacity(n),
            steps: Vec::new(),
            finished: 0,
            prefilled: (0.0, 0, 0),
        })
    }

    /// Runs iterations until every request finished, then returns the outcome. Each
    /// iteration: arrivals join the queue, the queue is admitted, requests done at admission
    /// retire; with nothing running, those complete and the run waits for the next arrival;
    /// otherwise the batch grows by a token each (preempting as needed), one decode step runs,
    /// and everything that finished retires and completes (decoded ones first). Errors: every
    /// step's.
    fn run(mut self) -> Result<ServeOutcome> {
        let n = self.requests.len();
        while self.finished < n {
            self.arrive();
            let just_finished = self.admit()?;
            self.retire(&just_finished)?;
            if self.running.is_empty() {
                self.complete(just_finished)?;
                if self.finished >= n {
                    break;
                }
                if self.waiting.is_empty() {
                    self.wait_for_arrival()?;
                }
                continue;
            }
            self.preempt_until_fits()?;
            self.grow_running()?;
            let mut ended = self.decode_step()?;
            ended.extend(just_finished);
            self.retire(&ended)?;
            self.complete(ended)?;
        }
        Ok(ServeOutcome {
            requests: self.done,
            steps: self.steps,
            total_blocks: self.pool.total(),
            block_bytes: self.pool.block_bytes(),
            prefix_blocks: self.pool.prefix_blocks(),
            prefix_prefill_s: self.prefix_prefill_s,
        })
    }

    /// Seconds since the run began, by the backend's clock (one clock read).
    fn now(&self) -> f64 {
        self.backend.now() - self.offset
    }

    /// Moves every request whose arrival time has passed (reading the clock once) from the
    /// arrival queue to the back of the waiting queue, with a fresh record. Compared in the
    /// backend's own time (`t + offset`, the instant [`Self::wait_for_arrival`] waits for):
    /// `(t + offset) − offset` can round below `t`, and a virtual clock set to exactly
    /// `t + offset` then never let the request in (the run spun with nothing due).
    fn arrive(&mut self) {
        let now = self.backend.now();
        let offset = self.offset;
        while self
            .arrivals
            .front()
            .is_some_and(|&(t, _)| t + offset <= now)
        {
            let (t, i) = self.arrivals.pop_front().expect("checked");
            self.states[i] = Some(State {
                record: RequestRecord {
                    id: self.requests[i].id,
                    prompt_tokens: self.cfg.prefix_tokens + self.requests[i].prompt.len(),
                    output_tokens: 0,
                    arrival_s: t,
                    first_token_s: f64::NAN,
                    token_s: Vec::new(),
                    preemptions: 0,
                    status: "ok".into(),
                },
                generated: Vec::new(),
            });
            self.waiting.push_back(i);
        }
    }

    /// Admission, first come first served: takes requests from the front of the waiting
    /// queue while fewer than `max_num_seqs` run and the pool has the blocks the head's whole
    /// context needs; each is prefilled ([`Scheduler::prefill`]). A head that could never fit
    /// an empty pool is rejected (its status says why). Returns the requests finished here
    /// (rejected, or done after their prefill's token), in that order. Errors: the pool's and
    /// the backend's.
    fn admit(&mut self) -> Result<Vec<usize>> {
        let sizer = self.cfg.sizer;
        let mut just_finished: Vec<usize> = Vec::new();
        while let Some(&i) = self.waiting.front() {
            if self.running.len() >= self.cfg.max_num_seqs {
                break;
            }
            let req = &self.requests[i];
            let st = self.states[i].as_mut().expect("arrived");
            let total = self.cfg.prefix_tokens + req.prompt.len() + st.generated.len();
            let need = sizer.blocks_for(total);
            // A request whose whole life cannot fit an empty pool would wait forever.
            let lifetime =
                sizer.peak_blocks(self.cfg.prefix_tokens + req.prompt.len() + req.output_len);
            if lifetime.saturating_sub(self.shared) + self.shared > self.pool.total() {
                self.waiting.pop_front();
                st.record.status = format!(
                    "rejected: needs {lifetime} blocks, the pool has {}",
                    self.pool.total()
                );
                just_finished.push(i);
                continue;
            }
            if !self.pool.can_grow(i, need, self.shared) {
                break;
            }
            self.waiting.pop_front();
            if self.prefill(i, total, need)? {
                just_finished.push(i);
            }
        }
        Ok(just_finished)
    }

    /// Admits request `i`, whose context (prefix, prompt and the tokens it generated before a
    /// preemption) is `total` tokens in `need` blocks: takes the blocks, prefills the context
    /// on the backend (after the cached prefix when caching), records the token's time (its
    /// first token, or the next one of a recomputed request) and appends it to the running
    /// batch. Returns whether it has all its output tokens now. Errors: the pool's (blocks
    /// short: callers check [`BlockPool::can_grow`] first) and [`Backend::admit`]'s.
    fn prefill(&mut self, i: usize, total: usize, need: usize) -> Result<bool> {
        let req = &self.requests[i];
        let st = self.states[i].as_mut().expect("arrived");
        self.pool.grow(i, need, self.shared)?;
        let mut tokens: Vec<u32> = Vec::with_capacity(total);
        if !self.caching {
            tokens.extend_from_slice(self.prefix);
        }
        tokens.extend_from_slice(&req.prompt);
        tokens.extend_from_slice(&st.generated);
        let t0 = self.backend.now();
        let lifetime = self.cfg.prefix_tokens + req.prompt.len() + req.output_len;
        let tok = self.backend.admit(&tokens, self.caching, lifetime)?;
        let t1 = self.backend.now();
        let t = t1 - self.offset;
        self.prefilled.0 += t1 - t0;
        self.prefilled.1 += tokens.len() as u64;
        self.prefilled.2 = self.prefilled.2.max(tokens.len() as u64);
        if st.generated.is_empty() {
            st.record.first_token_s = t;
        } else {
            st.record.token_s.push(t);
        }
        st.generated.push(tok);
        self.running.push(Running {
            req: i,
            seen: total,
            last: tok,
        });
        Ok(st.generated.len() >= req.output_len)
    }

    /// With nothing running or waiting, waits for the next arrival. Errors:
    /// [`Error::InvalidArgument`] when none is due either (the schedule cannot go on).
    fn wait_for_arrival(&mut self) -> Result<()> {
        let Some(&(t, _)) = self.arrivals.front() else {
            return Err(Error::InvalidArgument {
                name: "serve".into(),
                reason: "no request is running, waiting or due".into(),
            });
        };
        self.backend.wait_until(t + self.offset);
        Ok(())
    }

    /// Before a decode step every running sequence needs the blocks for one more token; while
    /// the free list is short of them, preempts the newest running sequence (vLLM's recompute
    /// preemption): its blocks are freed, its cache dropped, and it goes to the front of the
    /// waiting queue, keeping the tokens it generated. The last running sequence is never
    /// preempted. Errors: [`Backend::remove`]'s.
    fn preempt_until_fits(&mut self) -> Result<()> {
        let sizer = self.cfg.sizer;
        loop {
            let need: usize = self
                .running
                .iter()
                .map(|r| {
                    self.pool
                        .new_blocks(r.req, sizer.blocks_for(r.seen + 1), self.shared)
                })
                .sum();
            if need <= self.pool.free() || self.running.len() <= 1 {
                break;
            }
            let r = self.running.pop().expect("len > 1");
            self.pool.release(r.req);
            self.backend.remove(self.running.len())?;
            let st = self.states[r.req].as_mut().expect("running");
            st.record.preemptions += 1;
            self.waiting.push_front(r.req);
        }
        Ok(())
    }

    /// Gives every running sequence the blocks for one more token, in batch order. Errors:
    /// the pool's, when the blocks are short (a lone sequence that outgrew the pool).
    fn grow_running(&mut self) -> Result<()> {
        let sizer = self.cfg.sizer;
        for r in &self.running {
            self.pool
                .grow(r.req, sizer.blocks_for(r.seen + 1), self.shared)?;
        }
        Ok(())
    }

    /// Runs one decode step over the running batch, records each sequence's new token at the
    /// clock read after the step, and appends the step's [`StepSample`]. Returns the requests
    /// that now have all their output tokens, in batch order. Errors: [`Backend::step`]'s.
    fn decode_step(&mut self) -> Result<Vec<usize>> {
        let last: Vec<u32> = self.running.iter().map(|r| r.last).collect();
        let context_tokens = self.running.iter().map(|r| r.seen as u64).sum();
        let t0 = self.backend.now();
        let next = self.backend.step(&last)?;
        let t1 = self.backend.now();
        let (t, step_s) = (t1 - self.offset, t1 - t0);
        let mut ended = Vec::new();
        for (r, tok) in self.running.iter_mut().zip(next) {
            r.seen += 1;
            r.last = tok;
            let st = self.states[r.req].as_mut().expect("running");
            st.generated.push(tok);
            st.record.token_s.push(t);
            if st.generated.len() >= self.requests[r.req].output_len {
                ended.push(r.req);
            }
        }
        let sizer = self.cfg.sizer;
        self.steps.push(StepSample {
            t_s: t,
            running: self.running.len(),
            waiting: self.waiting.len(),
            used_blocks: self.pool.used(),
            table_blocks: self.pool.table_entries(),
            accounted_bytes: self.running.iter().map(|r| sizer.seq_bytes(r.seen)).sum(),
            stored_bytes: self.backend.kv_bytes() as u64,
            step_s,
            attention_s: self.backend.last_attention_s(),
            context_tokens,
            prefill_s: self.prefilled.0,
            prefill_tokens: self.prefilled.1,
            prefill_longest: self.prefilled.2,
        });
        self.prefilled = (0.0, 0, 0);
        Ok(ended)
    }

    /// Removes finished requests `ids` from the running batch (backend and pool), from the
    /// back of the batch to the front; ids not running are ignored. Errors:
    /// [`Backend::remove`]'s.
    fn retire(&mut self, ids: &[usize]) -> Result<()> {
        for idx in (0..self.running.len()).rev() {
            if ids.contains(&self.running[idx].req) {
                let r = self.running.remove(idx);
                self.pool.release(r.req);
                self.backend.remove(idx)?;
            }
        }
        Ok(())
    }

    /// Completes finished requests `ids`, in order: each record gets its output token count
    /// and goes to `on_finish` and the outcome, and in a closed loop its client sends the next
    /// request, arriving now (one clock read each). Errors: `on_finish`'s.
    fn complete(&mut self, ids: Vec<usize>) -> Result<()> {
        let n = self.requests.len();
        for i in ids {
            self.finished += 1;
            finish(self.states[i].take(), &mut self.done, &mut *self.on_finish)?;
            if self.next_closed < n {
                self.arrivals.push_back((self.now(), self.next_closed));
                self.next_closed += 1;
            }
        }
        Ok(())
    }
}

/// Closes a finished request's record (its output token count), hands it to `on_finish`, then
/// keeps it in `done`. Errors: `on_finish`'s (the record is then not kept).
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
                window: None,
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

    /// A request arriving while nothing runs, after a prefix prefill moved the clock's origin
    /// (offset 0.5 s): at 12.5 req/s the second arrives at t = 0.08, and `(0.08 + 0.5) − 0.5`
    /// is 0.07999999999999996 in floating point. On a virtual clock set to exactly 0.58 the run
    /// waited there forever (found by the scheduler's split, issue #21); now it serves all 3.
    #[test]
    fn an_arrival_after_an_offset_origin_is_let_in() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let s = fp16_sizer();
            let cfg = SchedConfig {
                sizer: s,
                kv_budget: 100 * s.block_bytes(),
                max_num_seqs: 64,
                prefix_tokens: 500,
                prefix_caching: true,
            };
            let mut m = mock(s);
            let o = serve(
                &mut m,
                &cfg,
                &reqs(3, 4, 1),
                Arrival::Constant { rate: 12.5 },
                &[7; 500],
                0,
                &mut |_| Ok(()),
            );
            let _ = tx.send(o.map(|o| o.requests.len()));
        });
        let served = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the scheduler finished (it spun before the fix)");
        assert_eq!(served.unwrap(), 3);
    }

    /// A sliding window frees blocks (vLLM's `SlidingWindowManager`): 2 layers, layer 0 on a
    /// 16-token window, layer 1 global, blocks of 16 tokens of both layers. A request of 200
    /// prompt + 100 output tokens holds, at 300 tokens, 2 window blocks (⌈300/16⌉ −
    /// ⌊285/16⌋ = 19 − 17) = 32 slots on layer 0 and 300 tokens on layer 1: ⌈332 / 32⌉ = 11
    /// pool blocks (the most in its life; 289 tokens: ⌈321 / 32⌉ = 11), so a pool of 12
    /// serves it; counted all-global it needs ⌈300 / 16⌉ = 19 and is refused.
    #[test]
    fn sliding_window_frees_blocks() {
        let sizer = BlockSizer {
            scheme: crate::kv::KvScheme::FP16,
            geom: CacheGeometry {
                layers: 2,
                kv_heads: 1,
                q_heads: 1,
                head_dim: 64,
                window: Some(crate::kv::SlidingWindow::every(16, 2)),
            },
            block_tokens: 16,
        };
        assert_eq!(sizer.blocks_for(300), 11);
        assert_eq!(sizer.peak_blocks(300), 11);
        let cfg = SchedConfig {
            sizer,
            kv_budget: 12 * sizer.block_bytes(),
            max_num_seqs: 4,
            prefix_tokens: 0,
            prefix_caching: false,
        };
        let o = run(cfg, &reqs(1, 200, 100), &[]);
        assert_eq!(o.requests[0].status, "ok");
        assert_eq!(o.requests[0].output_tokens, 100);
        let naive = BlockSizer {
            geom: sizer.geom.without_window(),
            ..sizer
        };
        assert_eq!(naive.peak_blocks(300), 19);
        let o = run(
            SchedConfig {
                sizer: naive,
                kv_budget: 12 * naive.block_bytes(),
                ..cfg
            },
            &reqs(1, 200, 100),
            &[],
        );
        assert_ne!(o.requests[0].status, "ok");
    }

    /// A pool of 10 blocks (16 tokens each), 4 requests of 40 prompt tokens (3 blocks) and 10
    /// output tokens, all at once. By hand: r0, r1, r2 are admitted (9 blocks, 1 free); r3 waits.
    /// After 8 steps they hold 48 tokens; the 9th step needs a 4th block each (3 > 1 free), so
    /// r2 — the newest — is preempted (4 free; r0 and r1 take 2); r0 and r1 finish at that step.
    /// r2 is recomputed (40 + 9 tokens: 4 blocks), which yields its 10th token and finishes; r3
    /// runs alone. Max 3 running, 1 preemption, 4 completions, 10 tokens each.
    ///
    /// The clock by hand (prefill 1 ms per token, a step 10 ms + 1 ms per sequence): first
    /// tokens at 40, 80, 120 ms (three prefills in turn); eight steps of 13 ms → 224 ms; the
    /// ninth step runs r0 and r1 alone (12 ms) → both finish at 236 ms; r2's recompute prefill
    /// of 49 tokens → 285 ms (finished); r3's prefill → first token at 325 ms, then nine steps
    /// of 11 ms → 424 ms.
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
        let ms = |s: f64| (s * 1e6).round() / 1e3;
        let first: Vec<f64> = o.requests.iter().map(|r| ms(r.first_token_s)).collect();
        let done: Vec<f64> = o
            .requests
            .iter()
            .map(|r| ms(*r.token_s.last().unwrap()))
            .collect();
        assert_eq!(first, [40.0, 80.0, 120.0, 325.0]);
        assert_eq!(done, [236.0, 236.0, 285.0, 424.0]);
        // The trace by hand: 18 steps (8 of r0–r2, the 9th of r0 and r1, 9 of r3). The first
        // follows the three prefills (120 tokens, 120 ms) and reads 3 × 40 tokens in 13 ms; the
        // 9th reads 2 × 48 in 12 ms; the 10th follows r2's recompute (49) and r3's prefill (40)
        // and reads 40 in 11 ms. The steps and prefills fill the whole 424 ms (no idle wait).
        assert_eq!(o.steps.len(), 18);
        let row = |i: usize| {
            let x = &o.steps[i];
            let c = (x.running, x.context_tokens, ms(x.step_s));
            (c, ms(x.prefill_s), x.prefill_tokens)
        };
        assert_eq!(row(0), ((3, 120, 13.0), 120.0, 120));
        assert_eq!(row(1), ((3, 123, 13.0), 0.0, 0));
        assert_eq!(row(8), ((2, 96, 12.0), 0.0, 0));
        assert_eq!(row(9), ((1, 40, 11.0), 89.0, 89));
        assert_eq!(row(17), ((1, 48, 11.0), 0.0, 0));
        let busy: f64 = o.steps.iter().map(|x| x.step_s + x.prefill_s).sum();
        assert_eq!(ms(busy), 424.0);
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

    /// The scheduler's tests' backend, recording what `admit` reserves for each sequence and
    /// checking at every step that no running sequence holds more tokens than that.
    struct Reserving {
        inner: VirtualBackend<FixedCost>,
        prefix: usize,
        /// Per running sequence: (tokens held, tokens reserved).
        held: Vec<(usize, usize)>,
        admitted: Vec<(usize, usize)>,
    }

    impl Backend for Reserving {
        fn now(&self) -> f64 {
            self.inner.now()
        }
        fn wait_until(&mut self, t: f64) {
            self.inner.wait_until(t)
        }
        fn prepare_prefix(&mut self, prefix: &[u32]) -> Result<f64> {
            self.prefix = prefix.len();
            self.inner.prepare_prefix(prefix)
        }
        fn admit(&mut self, tokens: &[u32], after_prefix: bool, lifetime: usize) -> Result<u32> {
            let held = tokens.len() + if after_prefix { self.prefix } else { 0 };
            self.held.push((held, lifetime));
            self.admitted.push((tokens.len(), lifetime));
            self.inner.admit(tokens, after_prefix, lifetime)
        }
        fn step(&mut self, last: &[u32]) -> Result<Vec<u32>> {
            for (held, reserved) in &mut self.held {
                *held += 1;
                assert!(
                    *held <= *reserved,
                    "{held} tokens held, {reserved} reserved"
                );
            }
            self.inner.step(last)
        }
        fn remove(&mut self, i: usize) -> Result<()> {
            self.held.remove(i);
            self.inner.remove(i)
        }
        fn kv_bytes(&self) -> usize {
            self.inner.kv_bytes()
        }
    }

    /// Every admission reserves the request's whole life — prefix, prompt and output, by hand
    /// 24 + 6 + 8 = 38 tokens — with prefix caching or without, and a request preempted and
    /// prefilled again (a pool of 5 blocks of 16 for sequences that start in 2 and grow into a
    /// third) reserves the same again; no sequence ever holds more than its reservation.
    #[test]
    fn admission_reserves_each_request_lifetime() {
        let s = fp16_sizer();
        for (caching, blocks) in [(true, 64), (false, 64), (false, 5)] {
            let cfg = SchedConfig {
                sizer: s,
                kv_budget: blocks * s.block_bytes(),
                max_num_seqs: 64,
                prefix_tokens: 24,
                prefix_caching: caching,
            };
            let mut b = Reserving {
                inner: mock(s),
                prefix: 0,
                held: Vec::new(),
                admitted: Vec::new(),
            };
            let r = reqs(6, 6, 8);
            let prefix = vec![5u32; 24];
            let o = serve(
                &mut b,
                &cfg,
                &r,
                Arrival::Poisson {
                    rate: f64::INFINITY,
                },
                &prefix,
                0,
                &mut |_| Ok(()),
            )
            .unwrap();
            assert!(
                o.requests.iter().all(|r| r.status == "ok"),
                "{caching} {blocks}"
            );
            assert!(b.admitted.len() >= 6);
            assert!(b.admitted.iter().all(|&(_, l)| l == 38), "{:?}", b.admitted);
            if blocks == 5 {
                assert!(
                    o.requests.iter().any(|r| r.preemptions > 0),
                    "no preemption"
                );
                assert!(b.admitted.len() > 6);
            }
        }
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
