//! Measurement: memory probes, latency summaries, the sweep runner and the roofline floors of a
//! decode step.

pub mod attn_bench;
pub mod bandwidth;
pub mod contention;
pub mod device;
pub mod floors;
pub mod memory_plan;
pub mod plan;
pub mod settings;
pub mod shard;
pub mod suites;
pub mod sweep;
pub mod synthetic;
pub mod unit;
