//! `kvbench plan`: max concurrent sequences per KV scheme × context in a memory budget. The
//! work is [`crate::app::plan::run`].

pub use crate::app::plan::PlanArgs;

/// Runs `kvbench plan`.
pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    crate::app::plan::run(a)
}
