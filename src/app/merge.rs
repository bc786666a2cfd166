//! `kvbench merge` end to end: the run folders of a sharded sweep joined into one, as one
//! machine would have written it, or serving runs of one experiment joined into one serving
//! run; checked before anything is written.

use std::path::PathBuf;

use anyhow::Context;

use crate::report::merge::{merge, ShardFolder};
use crate::report::meta::{self, RunKind};
use crate::report::serve::{merge_runs, render, ServeRun};
use crate::report::{RowContext, RunSink};

/// Arguments of `kvbench merge`.
#[derive(Debug, Clone, clap::Args)]
pub struct MergeArgs {
    /// Run folders of `kvbench sweep --shard I/N` (one per shard, any order), or of
    /// `kvbench serve` runs that differ only in their schemes and loads.
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,

    /// Folder for the merged run (raw.jsonl, results.csv, summary.md, meta.json,
    /// plots/).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// Merge what exists when shards are missing or unfinished, and say what is missing
    /// (meta.json `status: partial`, `missing`).
    #[arg(long)]
    pub allow_partial: bool,

    /// Move an existing, non-empty --out (an earlier merge) aside to `<out>.old-<time>` and
    /// merge into a fresh folder; without it such an --out is refused.
    #[arg(long)]
    pub force: bool,
}

/// Reads the shards, checks they form one sweep (every shard's `meta.json` format included),
/// and only then writes the merged folder and renders it. Errors: a usage error (exit 2) for an
/// `--out` that is one of the shards, or already holds files without `--force`; those of
/// [`ShardFolder::read`] and [`merge`], naming the shard or field.
pub fn run(args: &MergeArgs) -> anyhow::Result<()> {
    for d in &args.dirs {
        if same_dir(d, &args.out) {
            return Err(crate::Error::InvalidArgument {
                name: "--out".into(),
                reason: format!(
                    "{} is one of the shards being merged; give a new folder",
                    args.out.display()
                ),
            }
            .into());
        }
        if within(d, &args.out) {
            // --force would move the shard aside with it.
            return Err(crate::Error::InvalidArgument {
                name: "--out".into(),
                reason: format!(
                    "{} holds the shard {}; give a folder beside the shards (e.g. {})",
                    args.out.display(),
                    d.display(),
                    args.out.join("merged").display()
                ),
            }
            .into());
        }
    }
    // Refused before anything is read; moved aside (--force) only once the merge has succeeded.
    if args.out.exists() && !args.out.is_dir() {
        return Err(crate::Error::InvalidArgument {
            name: "--out".into(),
            reason: format!("{} exists and is not a folder", args.out.display()),
        }
        .into());
    }
    if !args.force && crate::report::run_dir::non_empty(&args.out) {
        return Err(crate::Error::InvalidArgument {
            name: "--out".into(),
            reason: format!(
                "{} already holds files (an earlier merge or run?); pass --force to move it \
                 aside to {}.old-<time>, or another --out",
                args.out.display(),
                args.out.display()
            ),
        }
        .into());
    }
    let mut kinds = Vec::new();
    for d in &args.dirs {
        kinds.push(RunKind::of(&meta::read_value(
            &d.join(crate::report::META_FILE),
        )?));
    }
    if kinds.iter().all(|k| *k == RunKind::Serve) {
        return serves(args);
    }
    if kinds.contains(&RunKind::Serve) {
        return Err(crate::Error::InvalidArgument {
            name: "kvbench merge".into(),
            reason: "the folders mix sweep and serve runs; merge each kind on its own".into(),
        }
        .into());
    }
    let shards = args
        .dirs
        .iter()
        .map(|d| ShardFolder::read(d))
        .collect::<Result<Vec<_>, _>>()?;
    let mut merged = merge(&shards, args.allow_partial)?;
    for m in &merged.missing {
        eprintln!("warning: {m}");
    }
    // Each shard probed the read bandwidth of its own machine: one figure cannot serve every
    // row, so `tpot_vs_floor` stays empty unless the shards agree exactly (e.g. none probed).
    let probes: Vec<&serde_json::Value> = shards
        .iter()
        .map(|s| &s.meta["report_context"]["read_gb_s"])
        .collect();
    if probes.iter().any(|p| *p != probes[0]) {
        merged.meta["report_context"]["read_gb_s"] = serde_json::Value::Null;
        eprintln!(
            "note: the shards probed different read bandwidths (each its own machine); the \
             merged results leave tpot_vs_floor empty — each shard's own folder has it"
        );
    }
    let ctx: RowContext = serde_json::from_value(merged.meta["report_context"].clone())
        .context("the shards' meta.json has no usable report_context")?;
    if let Some(m) = merged.meta.as_object_mut() {
        m.insert("command".into(), crate::util::command_line().into());
        m.insert("merged_at".into(), crate::util::time::now_rfc3339().into());
    }
    // Every shard has been read and checked: now the earlier --out may go aside.
    crate::report::run_dir::prepare_out(&args.out, args.force)?;
    crate::report::run_dir::create_out(&args.out)?;
    meta::write_json(&args.out.join(crate::report::META_FILE), &merged.meta)?;
    let points = merged.points.len();
    let records = crate::report::RawRecords {
        points: std::mem::take(&mut merged.points),
        quality: std::mem::take(&mut merged.quality),
    };
    drop(RunSink::create(&args.out, ctx, records)?);
    crate::app::sweep::finish(&args.out, "kvbench merge")?;
    merged_note(
        &format!("{} shard folders ({points} points)", shards.len()),
        &args.out,
        merged.missing.len(),
    );
    Ok(())
}

/// Serving runs of one experiment joined ([`merge_runs`]), written and rendered.
fn serves(args: &MergeArgs) -> anyhow::Result<()> {
    let runs = args
        .dirs
        .iter()
        .map(|d| ServeRun::read(d))
        .collect::<Result<Vec<_>, _>>()?;
    let mut merged = merge_runs(&runs, args.allow_partial)?;
    for m in &merged.missing {
        eprintln!("warning: {m}");
    }
    let now = crate::util::time::now_rfc3339();
    merged.meta.run_id = crate::util::time::run_id(&now, "merged-serve");
    merged.meta.report_context.run_id = merged.meta.run_id.clone();
    merged.meta.command = crate::util::command_line();
    merged.meta.details.insert("merged_at".into(), now.into());
    crate::report::run_dir::prepare_out(&args.out, args.force)?;
    crate::report::run_dir::create_out(&args.out)?;
    meta::write_json(&args.out.join(crate::report::META_FILE), &merged.meta)?;
    let mut log = crate::report::run_dir::RawLog::open(&args.out, &[])?;
    for l in &merged.lines {
        log.append(l)?;
    }
    print!("{}", render(&ServeRun::read(&args.out)?)?);
    merged_note(
        &format!("{} serve folders", runs.len()),
        &args.out,
        merged.missing.len(),
    );
    Ok(())
}

/// The closing line: what was merged into `out`, and how much is missing.
fn merged_note(what: &str, out: &std::path::Path, missing: usize) {
    eprintln!(
        "merged {what} into {}{}",
        out.display(),
        if missing == 0 {
            String::new()
        } else {
            format!(" — partial: {missing} missing")
        }
    );
}

/// Whether `dir` lies inside `parent` (both resolved when they exist).
fn within(dir: &std::path::Path, parent: &std::path::Path) -> bool {
    match (dir.canonicalize(), parent.canonicalize()) {
        (Ok(d), Ok(p)) => d != p && d.starts_with(p),
        _ => false,
    }
}

fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
