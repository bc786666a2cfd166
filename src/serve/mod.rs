//! Serving under a KV budget: a continuous-batching load test over the real decode path, with
//! a paged KV block pool sized by the budget in each scheme's stored format.
//!
//! Layers: [`workload`] (seeded arrivals, lengths, prompts from real text) → [`pool`] (blocks,
//! free list, block tables, reference counts) → [`engine`] (the scheduler: admission,
//! preemption by recompute, decode steps, over a [`engine::Backend`]) with [`backend`] (the
//! model and a batched [`crate::kv::KvCache`]) → [`metrics`] (one row per scheme × load).
//! [`capacity`] sizes a simulated engine's pool per GPU as vLLM does.
//! `kvbench serve` (`crate::cli::serve`) wires them and writes the run folder.

pub mod backend;
pub mod calibrate;
pub mod capacity;
pub mod engine;
pub mod metrics;
pub mod pool;
pub mod run;
pub mod settings;
pub mod virtual_backend;
pub mod workload;
