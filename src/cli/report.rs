//! `kvbench report`: re-render run folders (sweep or serve) from their raw data, alone or side
//! by side. The work is [`crate::app::report::run`].

use std::path::PathBuf;

/// Arguments of `kvbench report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Run folders written by `kvbench sweep`, `serve` or `merge` (each with meta.json and
    /// raw.jsonl).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,

    /// Output folder. Default: the run folder itself for one run; `reports/compare-<time>` for
    /// several.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Names for the runs, comma-separated, one per run folder in order (default: the folder
    /// names). With two or more sweep folders each later run is compared with the first point
    /// by point (comparison.md, comparison.json).
    #[arg(long, value_delimiter = ',')]
    pub label: Vec<String>,
}

/// Runs `kvbench report`.
pub fn run(a: ReportArgs) -> anyhow::Result<()> {
    crate::app::report::run(&a.runs, a.out.as_deref(), &a.label)
}
