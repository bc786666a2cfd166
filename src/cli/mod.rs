//! Command-line interface (clap derive). Exit codes, stable: 0 success, 1 runtime failure,
//! 2 usage error (bad flag value, unknown scheme, missing or unreadable model), 3 a regression
//! found by `kvbench gate`.

pub mod attn_bench;
pub mod calibrate;
pub mod fetch;
pub mod gate;
pub mod interrupt;
pub mod merge;
pub mod plan;
pub mod report;
pub mod rouge;
pub mod serve;
pub mod slurm;
pub mod sweep;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Measures what KV-cache quantization and eviction cost and save when serving LLMs.
#[derive(Debug, Parser)]
#[command(name = "kvbench", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("KVBENCH_GIT_REV"), ")"), about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sweep KV-cache schemes × batch sizes × sequence lengths on a model: TTFT, TPOT, tokens/s,
    /// KV bytes, peak RSS and perplexity, written to reports/<run-id>/.
    Sweep(sweep::SweepArgs),
    /// Time the decode step's cache work (append + attention) per scheme at a context length,
    /// on synthetic K/V with a model's geometry.
    AttnBench(attn_bench::AttnBenchArgs),
    /// Capacity planning: max concurrent sequences per KV scheme × context in a memory budget,
    /// after weights and a reserve, with paged-block accounting.
    Plan(plan::PlanArgs),
    /// Re-render results.csv, summary.md and plots/ of one or more run folders from their raw
    /// data (raw.jsonl) without re-running; several folders go side by side.
    Report(report::ReportArgs),
    /// Score summaries against references with ROUGE-1/2/L/Lsum exactly as Google's
    /// rouge-score 0.1.2 (one text per line, pairs by line number).
    Rouge(rouge::RougeArgs),
    /// CI regression gate: compare results with a baseline's per scheme/batch/seq; prints a
    /// Markdown table; exit 3 on a regression, 2 on unusable input, 0 otherwise.
    Gate(gate::GateArgs),
    /// Join the run folders of a sharded sweep (`sweep --shard I/N`) into one run folder, as
    /// one machine would have written it; refuses shards of different sweeps (exit 2).
    Merge(merge::MergeArgs),
    /// Run a sweep as a Slurm job array (one shard per task) plus a merge job that starts when
    /// every task succeeded; `--dry-run` prints the scripts.
    Slurm(slurm::SlurmArgs),
    /// Serving under a KV budget: continuous batching over a paged block pool at request rates
    /// (or closed-loop clients) per KV scheme; goodput, TTFT/TPOT/E2E percentiles, running
    /// sequences, preemptions; written to reports/serve-<time>/.
    Serve(serve::ServeArgs),
    /// Fit a device profile to this machine's own prefills and decode steps (the serving
    /// path's), for `kvbench serve --simulate <profile.toml>`.
    Calibrate(calibrate::CalibrateArgs),
    /// Fetch the default model (SmolLM2-135M-Instruct Q4_1 GGUF) and print its path.
    Fetch(fetch::FetchArgs),
}

pub use crate::util::command_line;

/// A failed write to stdout (a full disk, `>&-`) ends the run with exit 1 and one line naming
/// it, instead of the panic `println!` raises (exit 101); a closed pipe never gets here
/// (SIGPIPE ends the process, [`interrupt::install`]). Other panics keep the default report.
fn quiet_stdout_failures() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(cause) = msg.strip_prefix("failed printing to stdout: ") {
            eprintln!("error: cannot write to standard output: {cause}");
            std::process::exit(1);
        }
        default(info);
    }));
}

/// Parses the command line, runs it and returns the exit code.
pub fn main() -> ExitCode {
    interrupt::install();
    quiet_stdout_failures();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Sweep(a) => done(sweep::run(a, matches.subcommand_matches("sweep"))),
        Command::Report(a) => done(report::run(a)),
        Command::Rouge(a) => done(rouge::run(a)),
        Command::Gate(a) => gate::run(a),
        Command::Fetch(a) => done(fetch::run(a)),
        Command::Calibrate(a) => done(calibrate::run(a)),
        Command::Serve(a) => done(serve::run(a, matches.subcommand_matches("serve"))),
        Command::AttnBench(a) => done(attn_bench::run(a)),
        Command::Plan(a) => done(plan::run(a)),
        Command::Merge(a) => done(merge::run(a)),
        Command::Slurm(a) => done(slurm::run(a, matches.subcommand_matches("slurm"))),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            let usage = e.chain().any(|c| {
                c.downcast_ref::<crate::Error>()
                    .is_some_and(|k| k.is_usage())
            });
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}
