//! Joining the run folders of a sharded sweep (`kvbench sweep --shard I/N`) into the folder one
//! machine would have written: the same points in the planned order, each carrying its scheme's
//! quality results (perplexity, KL, ROUGE, passkey) from whichever shard measured them.
//!
//! Refuses, naming the field: shards of different settings (`settings.*`), model files
//! (`model.sha256`), geometries (`model_geometry`), kvbench versions (`kvbench`) or splits
//! (`shard.count`, `shard.plan`); a shard given twice (`shard.index`); and, unless partial
//! merges are allowed, a missing shard or one that did not finish its units.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::read_records;
use super::SweepMeta;
use crate::error::{Error, Result};
use crate::kv::KvScheme;
use crate::measure::shard::{Assigned, ShardRecord, Unit, MAX_SHARDS};
use crate::measure::sweep::{PointOutcome, QualityOutcome};

/// One shard's run folder, read back.
#[derive(Debug, Clone)]
pub struct ShardFolder {
    /// The folder.
    pub dir: PathBuf,
    /// Its `meta.json`.
    pub meta: Value,
    /// Its `shard` record.
    pub record: ShardRecord,
    /// Its finished points (`raw.jsonl`).
    pub points: Vec<PointOutcome>,
    /// Its quality results (`raw.jsonl`'s quality records; older folders' `quality.jsonl`).
    pub quality: Vec<QualityOutcome>,
}

impl ShardFolder {
    /// Reads `dir/meta.json` ([`RunMeta::read`]: the format check every reader of run folders
    /// makes) and `raw.jsonl` ([`read_records`]), so a shard the merged folder could not be read
    /// back from is refused before anything is written. Errors: [`Error::InvalidArgument`]
    /// naming the folder when it is not a run folder or was not run as a shard, and naming its
    /// `meta.json` when that is not JSON, was written in a newer format than
    /// [`super::meta::META_FORMAT`] or lacks a field a run folder has; [`Error::Io`].
    pub fn read(dir: &Path) -> Result<ShardFolder> {
        let meta_path = dir.join(super::META_FILE);
        if !meta_path.is_file() {
            return Err(Error::InvalidArgument {
                name: dir.display().to_string(),
                reason: format!(
                    "not a kvbench run folder ({} is missing); merge the folders of \
                     `kvbench sweep --shard I/N` runs",
                    meta_path.display()
                ),
            });
        }
        let (_, meta) = SweepMeta::read(&meta_path).map_err(|e| match e {
            Error::InvalidArgument { name, reason } => Error::InvalidArgument {
                name,
                reason: format!(
                    "{reason} (shard {}: merge only folders this kvbench can read, or merge \
                     with the kvbench that wrote it)",
                    dir.display()
                ),
            },
            e => e,
        })?;
        let record: ShardRecord =
            serde_json::from_value(meta["shard"].clone()).map_err(|_| Error::InvalidArgument {
                name: dir.display().to_string(),
                reason: "was not run as a shard (its meta.json has no `shard`); merge the \
                         folders of `kvbench sweep --shard I/N` runs"
                    .into(),
            })?;
        let records = read_records(dir)?;
        Ok(ShardFolder {
            points: records.points,
            quality: records.quality,
            dir: dir.to_path_buf(),
            meta,
            record,
        })
    }

    /// The units the shard was assigned, in planned order.
    fn assigned(&self) -> impl Iterator<Item = &Unit> {
        self.record
            .plan
            .iter()
            .filter(|a| a.shard == self.record.index)
            .map(|a| &a.unit)
    }

    /// Whether the shard holds `unit`'s result.
    fn has(&self, unit: &Unit) -> bool {
        match *unit {
            Unit::Timing {
                scheme,
                batch,
                seq_len,
            } => self
                .points
                .iter()
                .any(|o| o.scheme == scheme && o.batch == batch && o.seq_len == seq_len),
            Unit::Quality { scheme } => self.quality.iter().any(|q| q.scheme == scheme),
        }
    }
}

/// The joined run.
#[derive(Debug, Clone)]
pub struct Merged {
    /// `meta.json` of the merged folder: the lowest shard's, without `shard`, with
    /// `merged_from` (each shard's index, host, folder, run id and times), `status`
    /// (`finished`, or `partial` with `missing`).
    pub meta: Value,
    /// Every point, in planned order, with its scheme's quality results attached.
    pub points: Vec<PointOutcome>,
    /// Every scheme's quality results, in planned order.
    pub quality: Vec<QualityOutcome>,
    /// Units no shard delivered (empty unless partial), described.
    pub missing: Vec<String>,
}

/// Fields that must agree across shards, as JSON pointers into `meta.json` (settings are
/// compared key by key; `threads` may differ, it changes no result).
const SAME: &[&str] = &[
    "/kvbench",
    "/model/sha256",
    "/model_geometry",
    "/shard/count",
];

fn field_name(pointer: &str) -> String {
    pointer.trim_start_matches('/').replace('/', ".")
}

fn shown(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "absent".into(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > 80 {
                format!("{}…", s.chars().take(80).collect::<String>())
            } else {
                s
            }
        }
    }
}

/// Checks that every shard belongs to the same sweep as the first. Errors: [`Error::Shards`]
/// naming the first differing field and both folders.
fn check_same_sweep(shards: &[ShardFolder]) -> Result<()> {
    let first = &shards[0];
    let mut pointers: Vec<String> = SAME.iter().map(|p| p.to_string()).collect();
    let mut keys = BTreeSet::new();
    for s in shards {
        if let Some(o) = s.meta["settings"].as_object() {
            keys.extend(o.keys().filter(|k| *k != "threads").cloned());
        }
    }
    pointers.extend(keys.iter().map(|k| format!("/settings/{k}")));
    pointers.push("/shard/plan".into());
    for other in &shards[1..] {
        for p in &pointers {
            let (a, b) = (first.meta.pointer(p), other.meta.pointer(p));
            if a != b {
                return Err(Error::Shards {
                    field: field_name(p),
                    reason: format!(
                        "differs: {} in {}, {} in {}; merge only the shards of one sweep",
                        shown(a),
                        first.dir.display(),
                        shown(b),
                        other.dir.display()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Describes up to five units and how many more.
fn describe(units: &[Unit]) -> String {
    let mut s: Vec<String> = units.iter().take(5).map(Unit::to_string).collect();
    if units.len() > 5 {
        s.push(format!("and {} more", units.len() - 5));
    }
    s.join(", ")
}

/// Joins `shards` (any order) into one run. With `allow_partial`, missing shards and unfinished
/// units are left out and listed in [`Merged::missing`]; otherwise they are errors.
///
/// Quality results are copied bit for bit (the rows' `ppl_delta_pct` is then computed
/// against the fp16 quality unit's perplexity) and `rouge_l_vs_fp16` is recomputed against the fp16 summaries, exactly as the
/// sweep computes them on one machine. Errors: [`Error::Shards`] naming the field:
/// a differing setting/model/version/split, `shard.index` for a shard given twice or missing,
/// `shard.units` for a shard that did not finish (resume it) or holds a result it was not
/// assigned, `shard.count` for a count outside 1 to [`MAX_SHARDS`], `shard.plan` for a plan
/// that assigns a unit to a shard past the count.
pub fn merge(shards: &[ShardFolder], allow_partial: bool) -> Result<Merged> {
    if shards.is_empty() {
        return Err(Error::Shards {
            field: "shard.index".into(),
            reason: "no shard folders given".into(),
        });
    }
    check_counts(shards)?;
    check_same_sweep(shards)?;
    let count = shards[0].record.count;
    let plan = &shards[0].record.plan;
    let by_index = shard_table(shards, count)?;
    let missing = missing_units(&by_index, plan, allow_partial)?;
    check_no_stray_results(shards)?;
    let (points, quality) = join_results(&by_index, plan);
    let meta = merged_meta(&by_index, &missing);
    Ok(Merged {
        meta,
        points,
        quality,
        missing,
    })
}

/// Checks every shard's `shard.count` and plan before anything is sized by them: a count
/// edited into a meta.json (2^40) would allocate the shard table's terabytes, or overflow
/// (issue #25, found writing the merge fuzz target), and the plan names each unit's shard,
/// which indexes the shard table. Errors: [`Error::Shards`] naming `shard.count` for a count
/// outside 1 to [`MAX_SHARDS`], `shard.plan` for a unit assigned to a shard past the count;
/// both name the folder.
fn check_counts(shards: &[ShardFolder]) -> Result<()> {
    for s in shards {
        let count = s.record.count;
        if count == 0 || count > MAX_SHARDS {
            return Err(Error::Shards {
                field: "shard.count".into(),
                reason: format!(
                    "{count} in {} is not a number of shards (1 to {MAX_SHARDS}); its \
                     meta.json was damaged or edited: merge the folders `kvbench sweep --shard \
                     I/N` wrote",
                    s.dir.display()
                ),
            });
        }
        if let Some(a) = s.record.plan.iter().find(|a| a.shard >= count) {
            return Err(Error::Shards {
                field: "shard.plan".into(),
                reason: format!(
                    "{} assigns a unit to shard {} of {count} (0 to {}); its meta.json was \
                     damaged or edited: merge the folders `kvbench sweep --shard I/N` wrote",
                    s.dir.display(),
                    a.shard,
                    count - 1
                ),
            });
        }
    }
    Ok(())
}

/// The shard table: entry `i` is the folder of shard `i` of `count`, `None` where no folder was
/// given. Errors: [`Error::Shards`] naming `shard.index` for an index past the count or a shard
/// given twice (both folders named).
fn shard_table(shards: &[ShardFolder], count: usize) -> Result<Vec<Option<&ShardFolder>>> {
    let mut by_index: Vec<Option<&ShardFolder>> = vec![None; count];
    for s in shards {
        let i = s.record.index;
        if i >= count {
            return Err(Error::Shards {
                field: "shard.index".into(),
                reason: format!(
                    "{i} is out of range for {count} shards in {}",
                    s.dir.display()
                ),
            });
        }
        if let Some(prev) = by_index[i] {
            return Err(Error::Shards {
                field: "shard.index".into(),
                reason: format!(
                    "shard {i}/{count} is given twice: {} and {}",
                    prev.dir.display(),
                    s.dir.display()
                ),
            });
        }
        by_index[i] = Some(s);
    }
    Ok(by_index)
}

/// What each shard of the table failed to deliver, one description per shard in index order:
/// a missing shard's planned units, or the assigned units a given shard has no result for.
/// Errors (unless `allow_partial`): [`Error::Shards`] for the first such shard, naming
/// `shard.index` (missing) or `shard.units` (unfinished: resume it).
fn missing_units(
    by_index: &[Option<&ShardFolder>],
    plan: &[Assigned],
    allow_partial: bool,
) -> Result<Vec<String>> {
    let count = by_index.len();
    let mut missing = Vec::new();
    for (i, s) in by_index.iter().enumerate() {
        let units: Vec<Unit> = match s {
            None => plan
                .iter()
                .filter(|a| a.shard == i)
                .map(|a| a.unit)
                .collect(),
            Some(s) => s.assigned().filter(|u| !s.has(u)).copied().collect(),
        };
        if units.is_empty() {
            continue;
        }
        let what = match s {
            None => format!(
                "shard {i}/{count} is missing ({} units: {})",
                units.len(),
                describe(&units)
            ),
            Some(s) => format!(
                "shard {i}/{count} in {} did not finish: {} of its units are missing ({}); \
                 resume it with `kvbench sweep --resume {}`",
                s.dir.display(),
                units.len(),
                describe(&units),
                s.dir.display()
            ),
        };
        if !allow_partial {
            return Err(Error::Shards {
                field: if s.is_none() {
                    "shard.index"
                } else {
                    "shard.units"
                }
                .into(),
                reason: format!("{what}; or pass --allow-partial to merge what exists"),
            });
        }
        missing.push(what);
    }
    Ok(missing)
}

/// Checks that no shard holds a result its split assigns to another shard (it would not be a
/// shard of this split). Errors: [`Error::Shards`] naming `shard.units`, the folder and the
/// first such point (or, without one, quality result).
fn check_no_stray_results(shards: &[ShardFolder]) -> Result<()> {
    for s in shards {
        let assigned: Vec<&Unit> = s.assigned().collect();
        let stray = s
            .points
            .iter()
            .find(|o| {
                !assigned.contains(&&Unit::Timing {
                    scheme: o.scheme,
                    batch: o.batch,
                    seq_len: o.seq_len,
                })
            })
            .map(|o| format!("{} batch {} × {} tokens", o.scheme, o.batch, o.seq_len))
            .or_else(|| {
                s.quality
                    .iter()
                    .find(|q| !assigned.contains(&&Unit::Quality { scheme: q.scheme }))
                    .map(|q| format!("{} quality", q.scheme))
            });
        if let Some(u) = stray {
            return Err(Error::Shards {
                field: "shard.units".into(),
                reason: format!(
                    "{} holds {u}, which its split assigns to another shard",
                    s.dir.display()
                ),
            });
        }
    }
    Ok(())
}

/// Every delivered result in `plan` order, each from the shard the plan assigns its unit to:
/// the timing points, and the quality results with `rouge_l_vs_fp16` recomputed against the
/// fp16 summaries ([`with_fp16_rouge`]). Units no shard delivered are skipped.
fn join_results(
    by_index: &[Option<&ShardFolder>],
    plan: &[Assigned],
) -> (Vec<PointOutcome>, Vec<QualityOutcome>) {
    let owner = |u: &Unit| -> Option<&ShardFolder> {
        plan.iter()
            .find(|a| a.unit == *u)
            .and_then(|a| by_index[a.shard])
    };
    let quality_of = |scheme: KvScheme| -> Option<QualityOutcome> {
        owner(&Unit::Quality { scheme })
            .and_then(|s| s.quality.iter().find(|q| q.scheme == scheme).cloned())
    };
    let fp16 = quality_of(KvScheme::FP16);
    let mut quality = Vec::new();
    let mut points = Vec::new();
    for a in plan {
        match a.unit {
            Unit::Quality { scheme } => {
                if let Some(mut q) = quality_of(scheme) {
                    q.rouge = with_fp16_rouge(scheme, q.rouge, fp16.as_ref());
                    quality.push(q);
                }
            }
            Unit::Timing {
                scheme,
                batch,
                seq_len,
            } => {
                let Some(o) = owner(&a.unit).and_then(|s| {
                    s.points
                        .iter()
                        .find(|o| o.scheme == scheme && o.batch == batch && o.seq_len == seq_len)
                }) else {
                    continue;
                };
                points.push(o.clone());
            }
        }
    }
    (points, quality)
}

/// `meta.json` of the merged folder: the lowest present shard's, without `shard`, with
/// `merged_from` (each present shard's index, host, folder, run id, times and status, by
/// index), `status` (`finished`, or `partial` when `missing` is not empty) and `missing`.
fn merged_meta(by_index: &[Option<&ShardFolder>], missing: &[String]) -> Value {
    let mut present: Vec<&ShardFolder> = by_index.iter().flatten().copied().collect();
    present.sort_by_key(|s| s.record.index);
    let mut meta = present[0].meta.clone();
    if let Some(m) = meta.as_object_mut() {
        m.remove("shard");
        m.insert(
            "merged_from".into(),
            present
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "shard": format!("{}/{}", s.record.index, s.record.count),
                        "host": s.record.host,
                        "dir": s.dir.display().to_string(),
                        "run_id": s.meta["run_id"],
                        "started_at": s.meta["started_at"],
                        "finished_at": s.meta["finished_at"],
                        "resumed_at": s.meta["resumed_at"],
                        "status": s.meta["status"],
                    })
                })
                .collect(),
        );
        m.insert(
            "status".into(),
            if missing.is_empty() {
                "finished"
            } else {
                "partial"
            }
            .into(),
        );
        if !missing.is_empty() {
            m.insert("missing".into(), missing.to_vec().into());
        }
    }
    meta
}

/// `rouge` with `rouge_l_vs_fp16` against the fp16 summaries, as the sweep computes it (none
/// for fp16 itself or without fp16 summaries).
fn with_fp16_rouge(
    scheme: KvScheme,
    rouge: Option<crate::quality::xsum::RougeResult>,
    fp16: Option<&QualityOutcome>,
) -> Option<crate::quality::xsum::RougeResult> {
    let base = fp16
        .and_then(|f| f.rouge.as_ref())
        .filter(|_| !scheme.is_baseline());
    match (rouge, base) {
        (Some(r), Some(b)) => Some(r.with_baseline(&b.predictions)),
        (r, _) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 25: a shard whose meta.json has a format newer than
    /// [`super::super::meta::META_FORMAT`] is refused when read, naming that shard's meta.json
    /// and the format, before any merged folder is written (it used to fail after writing,
    /// naming the output).
    #[test]
    fn merge_refuses_a_shard_with_a_future_format() {
        let dir = std::env::temp_dir().join(format!("kvbench-merge-future-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let future = super::super::meta::META_FORMAT + 1;
        std::fs::write(
            dir.join(super::super::META_FILE),
            format!(r#"{{"format": {future}, "kvbench": "9.9.9 (future)", "shard": {{}}}}"#),
        )
        .unwrap();
        let e = ShardFolder::read(&dir).unwrap_err();
        std::fs::remove_dir_all(&dir).ok();
        assert!(e.is_usage(), "{e}");
        let e = e.to_string();
        assert!(
            e.contains(&format!("format {future}"))
                && e.contains("9.9.9 (future)")
                && e.contains(&dir.join("meta.json").display().to_string()),
            "{e}"
        );
        // A folder without meta.json is named as not a run folder.
        let e = ShardFolder::read(Path::new("/nonexistent/kvbench-shard"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a kvbench run folder"), "{e}");
    }

    /// Issue 25 (found writing the merge fuzz target): a shard whose meta.json says
    /// `shard.count` is 2^40, merged alone with `--allow-partial`, aborted kvbench allocating
    /// 8 TiB for the shard table, and `usize::MAX` panicked (capacity overflow); both are
    /// refused naming `shard.count` and the folder, as is 0.
    #[test]
    fn merge_refuses_a_shard_count_past_max_shards() {
        let record = |count: usize| ShardRecord {
            index: 0,
            count,
            host: "h".into(),
            plan: Vec::new(),
        };
        for count in [0, MAX_SHARDS + 1, 1 << 40, usize::MAX] {
            let shard = ShardFolder {
                dir: PathBuf::from("/shards/s0"),
                meta: serde_json::json!({ "shard": record(count) }),
                record: record(count),
                points: Vec::new(),
                quality: Vec::new(),
            };
            for partial in [false, true] {
                let e = merge(std::slice::from_ref(&shard), partial).unwrap_err();
                let msg = e.to_string();
                assert!(
                    matches!(&e, Error::Shards { field, .. } if field == "shard.count")
                        && msg.contains(&count.to_string())
                        && msg.contains("/shards/s0"),
                    "{msg}"
                );
            }
        }
        // The largest count still merges (partially: the other shards are missing).
        let shard = ShardFolder {
            dir: PathBuf::from("/shards/s0"),
            meta: serde_json::json!({ "shard": record(MAX_SHARDS) }),
            record: record(MAX_SHARDS),
            points: Vec::new(),
            quality: Vec::new(),
        };
        assert!(merge(&[shard], true).is_ok());
    }

    /// Issue 25 (found by tests/fuzz.rs, merge target, seed 28): a shard whose meta.json
    /// plan assigns a unit to shard 2 of 2, merged alone with `--allow-partial` (or with
    /// shards whose plans say the same), panicked indexing the shard table; refused naming
    /// `shard.plan`, the folder and the shard.
    #[test]
    fn merge_refuses_a_plan_unit_assigned_past_the_shard_count() {
        use crate::measure::shard::Assigned;
        for shard in [2, 16, usize::MAX] {
            let record = ShardRecord {
                index: 1,
                count: 2,
                host: "h".into(),
                plan: vec![Assigned {
                    unit: Unit::Timing {
                        scheme: KvScheme::FP16,
                        batch: 1,
                        seq_len: 16,
                    },
                    cost: 33.0,
                    shard,
                }],
            };
            let folder = ShardFolder {
                dir: PathBuf::from("/shards/s1"),
                meta: serde_json::json!({ "shard": record }),
                record,
                points: Vec::new(),
                quality: Vec::new(),
            };
            for partial in [false, true] {
                let e = merge(std::slice::from_ref(&folder), partial).unwrap_err();
                let msg = e.to_string();
                assert!(
                    matches!(&e, Error::Shards { field, .. } if field == "shard.plan")
                        && msg.contains(&format!("shard {shard} of 2"))
                        && msg.contains("/shards/s1"),
                    "{msg}"
                );
            }
        }
    }
}
