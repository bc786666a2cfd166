//! `kvbench attn-bench`: time the decode step's cache work (append + attention over every
//! layer) per scheme at one or more context lengths, on synthetic K/V with the model's
//! geometry. The work is [`crate::app::attn_bench::run`].

pub use crate::app::attn_bench::{AttnBenchArgs, AttnFormat, Peak};

/// Runs `kvbench attn-bench`.
pub fn run(a: AttnBenchArgs) -> anyhow::Result<()> {
    crate::app::attn_bench::run(a)
}
