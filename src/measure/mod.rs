//! Measurement: memory probes, latency summaries and the sweep runner.

pub mod memory;
pub mod stats;
pub mod sweep;
pub mod synthetic;
