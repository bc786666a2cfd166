//! `kvbench merge`: join the run folders of a sharded sweep (or the serving runs of one
//! experiment) into one. The work is [`crate::app::merge::run`].

pub use crate::app::merge::MergeArgs;

/// Runs `kvbench merge`.
pub fn run(a: MergeArgs) -> anyhow::Result<()> {
    crate::app::merge::run(&a)
}
