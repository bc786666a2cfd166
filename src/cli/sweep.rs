//! `kvbench sweep`: the main job. Every KV scheme × batch size × prompt length timed (TTFT,
//! TPOT, ITL, tokens/s, KV bytes, peak RSS) and each scheme's quality measured (perplexity, KL
//! and agreement with the fp16 cache, ROUGE, passkey), into a run folder. The work is
//! [`crate::app::sweep::run`].

pub use crate::app::sweep::SweepArgs;
pub use crate::measure::settings::{parse_schemes, SchemeList};

/// Runs `kvbench sweep` (`matches`: the subcommand's, to tell flags given from defaults).
pub fn run(args: SweepArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    crate::app::sweep::run(args.settings, args.run, args.shard, matches)
}
