//! `kvbench serve`: a load test under a KV budget, in process. For every load (request rate or
//! closed-loop clients) × KV scheme (× prefix caching on/off with `--shared-prefix`) it serves
//! the same seeded requests with continuous batching over a paged block pool
//! ([`crate::serve`]), and writes the run folder as `sweep` does: `raw.jsonl` (each request as it
//! finishes, then the point's trace and row), `results.csv`, `summary.md`, charts and
//! `meta.json`; `--resume` keeps finished points. The work is [`crate::app::serve::run`].

use crate::report::run_dir::RunDirArgs;
use crate::serve::settings::ServeSettings;

/// Arguments of `kvbench serve`: the run folder's flags and the settings (also a suite's keys
/// and `meta.json`'s `settings`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// `--suite`, `--resume`, `--out`, `--force`.
    #[command(flatten)]
    pub run: RunDirArgs,
    /// Every setting that changes a number.
    #[command(flatten)]
    pub settings: ServeSettings,
}

/// Runs `kvbench serve` (`matches`: the subcommand's, to tell flags given from defaults).
pub fn run(a: ServeArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    crate::app::serve::run(a.settings, a.run, matches)
}
