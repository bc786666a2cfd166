//! `kvbench attn-bench` end to end: the model's geometry, the device, the peak bandwidth (given,
//! or measured with `auto`), then per context length [`AttnBench::run`] and its table
//! ([`crate::report::attn_bench`]); with `--out DIR` also `DIR/results.csv`, with
//! `--format json` a JSON array of the same rows on stdout instead of the tables.

use std::path::PathBuf;

use crate::measure::attn_bench::AttnBench;
use crate::measure::bandwidth;
use crate::measure::device;
use crate::measure::settings::{DeviceArgs, ModelArgs, SchemeArgs, SeedArgs};
use crate::report::attn_bench::{self as report, table, AttnBenchRow, AttnHeader};

/// Arguments of `kvbench attn-bench`: the shared `--model` (only its geometry is read: an
/// alias with shipped geometry such as llama-3-8b needs no download), `--dtypes` (default
/// fp16,int8,int4,q8_0,q4_0,fp8), `--seed` and `--device`, and what to time.
#[derive(Debug, clap::Args)]
#[command(mut_arg("dtypes", |a| a.default_value("fp16,int8,int4,q8_0,q4_0,fp8")))]
pub struct AttnBenchArgs {
    /// `--model`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// `--dtypes`.
    #[command(flatten)]
    pub schemes: SchemeArgs,
    /// Context lengths the cache is filled to before timing, comma-separated (one table each).
    #[arg(
        long = "seq-lens",
        visible_alias = "seq-len",
        value_delimiter = ',',
        default_value = "8192"
    )]
    pub seq_lens: Vec<usize>,
    /// Sequences decoded together (one batch size; `kvbench sweep --batch-sizes` takes a list).
    #[arg(long = "batch-size", visible_alias = "batch", default_value_t = 1)]
    pub batch: usize,
    /// Timed decode steps per scheme (after one untimed step).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// `--seed` (of the synthetic K/V).
    #[command(flatten)]
    pub seed: SeedArgs,
    /// `--device`: where the cache lives and attention runs (`cuda:N`: our kernels, each step
    /// timed with CUDA events; needs a build with `--features cuda`).
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Peak memory bandwidth in GB/s (10^9 bytes/s), e.g. 4800 for an H200's HBM3e, or `auto`
    /// to measure this machine's read bandwidth first (a STREAM-like read of 512 MiB on the
    /// same threads; CPU only); adds a `% of peak` column for the achieved bandwidth.
    #[arg(long, value_parser = parse_peak)]
    pub peak_bandwidth: Option<Peak>,
    /// Also write the results to DIR/results.csv (created; one row per scheme and context
    /// length, rewritten after each length). Refused when DIR/results.csv already exists.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// What stdout gets: `table` (one table per context length) or `json` (an array of the
    /// rows results.csv holds, printed when every length ran).
    #[arg(long, value_enum, default_value_t = AttnFormat::Table)]
    pub format: AttnFormat,
}

/// `--format` of `kvbench attn-bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttnFormat {
    /// Human-readable tables, one per context length.
    Table,
    /// A JSON array of [`AttnBenchRow`]s.
    Json,
}

/// What `--peak-bandwidth` names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Peak {
    /// Measure the CPU's read bandwidth in this run ([`bandwidth::measure_read`]).
    Auto,
    /// A given figure, GB/s.
    GbS(f64),
}

/// `"4800"` → 4800 GB/s, `"auto"` → measure; refuses anything but a finite number > 0.
fn parse_peak(s: &str) -> Result<Peak, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(Peak::Auto);
    }
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Peak::GbS(v)),
        Ok(_) => Err(format!(
            "`{s}` must be a bandwidth in GB/s > 0, e.g. 4800, or `auto`"
        )),
        Err(_) => Err(format!(
            "`{s}` is not a number of GB/s (e.g. 4800 or 51.2) or `auto`"
        )),
    }
}

/// Runs the benchmark and prints a table per context length (or, with `--format json`, the
/// rows as JSON), writing `--out`'s results.csv after each length. Errors:
/// [`crate::Error::InvalidArgument`] for sizes that cannot run ([`AttnBench::check`]),
/// `--peak-bandwidth auto` off the CPU, or an `--out` that already holds results.csv; an I/O
/// error naming the folder or file; a runtime error when every scheme failed at a length.
pub fn run(a: AttnBenchArgs) -> anyhow::Result<()> {
    let json = a.format == AttnFormat::Json;
    // Geometry only: aliases (llama-3-8b, …) need no download.
    // kvbench's cache stores every token on every layer (no sliding window at run time), so
    // a windowed geometry (Gemma) is timed, and its bytes counted, all-global.
    let g = crate::model::geometry::for_model_arg(&a.model.model)?
        .cache()
        .without_window();
    let dev = a.device.device.open()?;
    let bench = AttnBench {
        schemes: a.schemes.dtypes.0.clone(),
        batch: a.batch,
        steps: a.steps,
        seed: a.seed.seed,
    };
    bench.check(&g, &a.seq_lens, &dev)?;
    let csv_path = a
        .out
        .as_ref()
        .map(|d| d.join(crate::report::run_dir::CSV_FILE));
    if let (Some(dir), Some(path)) = (&a.out, &csv_path) {
        if path.exists() {
            return Err(crate::Error::InvalidArgument {
                name: "--out".into(),
                reason: format!(
                    "{} already exists; give another folder or move it aside",
                    path.display()
                ),
            }
            .into());
        }
        std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
    }
    let peak = match a.peak_bandwidth {
        None => None,
        Some(Peak::GbS(p)) => Some(p),
        Some(Peak::Auto) if dev.is_cpu() => {
            let r = bandwidth::probe()
                .ok_or_else(|| anyhow::anyhow!("the bandwidth probe read nothing"))?;
            // On stderr under --format json, so stdout stays one JSON document.
            let line = format!(
                "measured read bandwidth: {:.1} GB/s best, {:.1} GB/s median of {} passes over {} MiB on {} threads (STREAM-like sum)",
                r.best_gb_s,
                r.median_gb_s,
                bandwidth::PROBE_PASSES,
                r.bytes >> 20,
                r.threads
            );
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
            Some(r.best_gb_s)
        }
        Some(Peak::Auto) => anyhow::bail!(
            "--peak-bandwidth auto measures the CPU's memory; for {} give the device's peak in GB/s (e.g. 4800 for an H200)",
            device::describe(&dev)
        ),
    };
    let header = AttnHeader {
        layers: g.layers,
        batch: a.batch,
        device: device::describe(&dev),
        model: a.model.model.clone(),
        kv_heads: g.kv_heads,
        head_dim: g.head_dim,
        peak_gb_s: peak,
    };
    let mut all: Vec<AttnBenchRow> = Vec::new();
    for &seq_len in &a.seq_lens {
        let t = bench.run(&g, seq_len, &dev)?;
        if !json {
            print!("{}", table(&header, &t));
        }
        all.extend(report::rows(&header, &t, bench.steps, bench.seed));
        // Rewritten after every length, so a crash keeps what finished.
        if let Some(path) = &csv_path {
            report::write_csv(path, &all)?;
        }
        // A table in which no scheme ran measured nothing: exit 1, as a sweep whose every point
        // failed.
        if t.rows.iter().all(|(_, r)| r.is_err()) {
            anyhow::bail!(
                "every scheme failed at {seq_len} tokens ({} of {}); the first: {}",
                t.rows.len(),
                t.rows.len(),
                t.rows.first().map_or(String::new(), |(s, r)| format!(
                    "{s}: {}",
                    r.as_ref().err().cloned().unwrap_or_default()
                ))
            );
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}
