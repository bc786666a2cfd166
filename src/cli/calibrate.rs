//! `kvbench calibrate`: fit a device profile to this machine's own prefills and decode steps,
//! for `kvbench serve --simulate`. The work is [`crate::app::calibrate::run`].

pub use crate::app::calibrate::CalibrateArgs;

/// Runs `kvbench calibrate`.
pub fn run(a: CalibrateArgs) -> anyhow::Result<()> {
    crate::app::calibrate::run(a)
}
