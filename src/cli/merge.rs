//! `kvbench merge`: join the run folders of a sharded sweep into one.

use std::path::PathBuf;

use anyhow::Context;

use crate::report::merge::{merge, ShardFolder};
use crate::report::{meta, RowContext, RunSink};

/// Arguments of `kvbench merge`.
#[derive(Debug, Clone, clap::Args)]
pub struct MergeArgs {
    /// Run folders of `kvbench sweep --shard I/N` (one per shard, any order).
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
}

/// Reads the shards, checks they form one sweep, writes the merged folder and renders it.
pub fn run(args: MergeArgs) -> anyhow::Result<()> {
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
    }
    let existing = args.out.join(crate::report::META_FILE);
    if let Ok(text) = std::fs::read_to_string(&existing) {
        let m: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if m.get("merged_from").is_none() {
            return Err(crate::Error::InvalidArgument {
                name: "--out".into(),
                reason: format!(
                    "{} holds a sweep's run folder; give a new folder (an earlier merge's \
                     folder may be overwritten)",
                    args.out.display()
                ),
            }
            .into());
        }
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
    let ctx: RowContext = serde_json::from_value(merged.meta["report_context"].clone())
        .context("the shards' meta.json has no usable report_context")?;
    if let Some(m) = merged.meta.as_object_mut() {
        m.insert(
            "command".into(),
            std::env::args().collect::<Vec<_>>().into(),
        );
        m.insert("merged_at".into(), crate::util::time::now_rfc3339().into());
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    for f in [crate::report::RAW_FILE, crate::report::LEGACY_QUALITY_FILE] {
        let p = args.out.join(f);
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    meta::write_json(&args.out.join(crate::report::META_FILE), &merged.meta)?;
    let points = merged.points.len();
    let records = crate::report::RawRecords {
        points: std::mem::take(&mut merged.points),
        quality: std::mem::take(&mut merged.quality),
    };
    drop(RunSink::create(&args.out, ctx, records)?);
    super::sweep::finish(&args.out, "kvbench merge")?;
    eprintln!(
        "merged {} shard folders ({} points) into {}{}",
        shards.len(),
        points,
        args.out.display(),
        if merged.missing.is_empty() {
            String::new()
        } else {
            format!(" — partial: {} missing", merged.missing.len())
        }
    );
    Ok(())
}

fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
