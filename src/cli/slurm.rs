//! `kvbench slurm`: run a sweep as a Slurm job array, one shard per array task, and merge the
//! shards in a job that starts when every task succeeded. The work is
//! [`crate::app::slurm::run`].

pub use crate::app::slurm::SlurmArgs;

/// Runs `kvbench slurm` (`matches`: the subcommand's, to re-emit the sweep flags given).
pub fn run(a: SlurmArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    crate::app::slurm::run(a, matches)
}
