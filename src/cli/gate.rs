//! `kvbench gate`: a CI regression gate against a baseline run — perplexity, KL and TPOT for
//! sweeps; goodput, SLO attainment, TTFT and TPOT p95 for serving runs. The work is
//! [`crate::app::gate::run`].

use std::process::ExitCode;

pub use crate::app::gate::{GateArgs, MAX_KL_LIMIT, MAX_PCT_LIMIT};

/// Runs `kvbench gate`: exit 0 pass, 3 regression, 2 unusable input.
pub fn run(a: GateArgs) -> anyhow::Result<ExitCode> {
    crate::app::gate::run(&a)
}
