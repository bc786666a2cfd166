//! `kvbench serve`: a load test under a KV budget, in process. For every load (request rate or
//! closed-loop clients) × KV scheme (× prefix caching on/off with `--shared-prefix`) it serves
//! the same seeded requests with continuous batching over a paged block pool
//! ([`crate::serve`]), and writes the run folder as `sweep` does. The work is
//! [`crate::app::serve::run`].

pub use crate::app::serve::ServeArgs;

/// Runs `kvbench serve` (`matches`: the subcommand's, to tell flags given from defaults).
pub fn run(a: ServeArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    crate::app::serve::run(a.settings, a.run, matches)
}
