//! kvbench: measures what KV-cache quantization and eviction cost and save when serving LLMs.
//!
//! Layers: [`kv`] (cache schemes and attention over their stored form) → [`model`] (a
//! Llama-family decoder whose attention takes the cache from outside) → [`quality`] (perplexity
//! through the cache) and [`measure`] (the sweep runner) → [`report`] (CSV, JSON, tables).

pub mod app;
pub mod cli;
pub mod error;
pub mod kv;
pub mod measure;
pub mod model;
pub mod perf;
pub mod plan;
pub mod quality;
pub mod report;
pub mod serve;
pub mod stats;
pub mod util;

pub use error::{Error, Result};
