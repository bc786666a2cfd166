//! `kvbench sweep`: the main job. Every KV scheme × batch size × prompt length timed (TTFT,
//! TPOT, ITL, tokens/s, KV bytes, peak RSS) and each scheme's quality measured (perplexity, KL
//! and agreement with the fp16 cache, ROUGE, passkey), into a run folder. The work is
//! [`crate::app::sweep::run`].

use crate::measure::settings::SweepSettings;
use crate::measure::shard::ShardArgs;
use crate::report::run_dir::RunDirArgs;

pub use crate::measure::settings::{parse_schemes, SchemeList};

/// Arguments of `kvbench sweep`: the run folder's flags, the settings (also a suite's keys and
/// `meta.json`'s `settings`) and the shard to run.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// `--suite`, `--resume`, `--out`, `--force`.
    #[command(flatten)]
    pub run: RunDirArgs,
    /// Every setting that changes a number.
    #[command(flatten)]
    pub settings: SweepSettings,
    /// `--shard`, `--shards`.
    #[command(flatten)]
    pub shard: ShardArgs,
}

/// Runs `kvbench sweep` (`matches`: the subcommand's, to tell flags given from defaults).
pub fn run(args: SweepArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    crate::app::sweep::run(args.settings, args.run, args.shard, matches)
}
