//! Checks of `kvbench sweep`'s input made before anything slow runs, and of a run folder: a
//! non-empty `--out` is refused unless resumed (or moved aside with `--force`), a resumed run must
//! use the same model file and thread count and CPU, duplicate points are merged with a note, and
//! sizes that cannot be meant (threads far past the CPUs, billions of warm-up repeats) are refused.

use std::path::{Path, PathBuf};

use crate::error::Error;

/// Most worker threads accepted per logical CPU: more only oversubscribes the machine.
pub const MAX_THREADS_PER_CPU: usize = 4;
/// Most untimed warm-up repeats per point.
pub const MAX_WARMUP: usize = 1000;
/// Most timed repeats per point.
pub const MAX_REPEATS: usize = 100_000;

fn invalid(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

/// Logical CPUs visible to the process.
pub fn logical_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `--threads`: 1 to [`MAX_THREADS_PER_CPU`] × logical CPUs. Errors:
/// [`Error::InvalidArgument`] naming the value and the bound.
pub fn check_threads(threads: Option<usize>) -> Result<(), Error> {
    let cpus = logical_cpus();
    match threads {
        Some(0) => Err(invalid(
            "--threads",
            "0 threads cannot run anything; give 1 or more (default: all logical CPUs)".into(),
        )),
        Some(n) if n > MAX_THREADS_PER_CPU * cpus => Err(invalid(
            "--threads",
            format!(
                "{n} is more than {MAX_THREADS_PER_CPU} × the {cpus} logical CPUs; give at most {}",
                MAX_THREADS_PER_CPU * cpus
            ),
        )),
        _ => Ok(()),
    }
}

/// `--warmup` and `--repeats` within [`MAX_WARMUP`] and [`MAX_REPEATS`]; the message estimates
/// the forward passes asked for (`points × repeats × tokens`).
pub fn check_repeats(
    warmup: usize,
    repeats: usize,
    points: usize,
    gen: usize,
) -> Result<(), Error> {
    if warmup > MAX_WARMUP {
        return Err(invalid(
            "--warmup",
            format!(
                "{warmup} untimed repeats per point ({:.3e} forward passes over {points} points) \
                 would run for days; give at most {MAX_WARMUP} (1 to 3 is plenty)",
                warmup as f64 * points as f64 * 4.0
            ),
        ));
    }
    if repeats > MAX_REPEATS {
        return Err(invalid(
            "--repeats",
            format!(
                "{repeats} timed repeats per point ({:.3e} forward passes over {points} points) \
                 would run for days; give at most {MAX_REPEATS}, or use --min-time",
                repeats as f64 * points as f64 * gen as f64
            ),
        ));
    }
    Ok(())
}

/// Drops repeated entries of a list flag, keeping the first of each, and says so on stderr.
pub fn dedup_with_note<T: PartialEq + Clone + std::fmt::Display>(flag: &str, v: &mut Vec<T>) {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    let mut dropped = Vec::new();
    for x in v.drain(..) {
        if out.contains(&x) {
            dropped.push(x.to_string());
        } else {
            out.push(x);
        }
    }
    if !dropped.is_empty() {
        eprintln!(
            "note: {flag} lists {} more than once; each point is measured once",
            dropped.join(", ")
        );
    }
    *v = out;
}

/// Whether `dir` exists and holds anything.
pub fn non_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// Prepares `--out` for a new run: a missing or empty folder is fine; a non-empty one is refused
/// (it would mix two runs' rows and overwrite the first run's `meta.json`) unless `force`, which
/// renames it to `<out>.old-<UTC time>` first and says so. Errors: [`Error::InvalidArgument`]
/// (`--out`) naming the folder and what to pass instead; [`Error::Io`] when the move fails.
pub fn prepare_out(out: &Path, force: bool) -> Result<(), Error> {
    if out.exists() && !out.is_dir() {
        return Err(invalid(
            "--out",
            format!("{} exists and is not a folder", out.display()),
        ));
    }
    if !non_empty(out) {
        return Ok(());
    }
    if !force {
        return Err(invalid(
            "--out",
            format!(
                "{} already holds files (an earlier run?); pass --resume {} to continue that \
                 run, --force to move it aside to {}.old-<time>, or another --out",
                out.display(),
                out.display(),
                out.display()
            ),
        ));
    }
    let time = crate::util::time::now_compact();
    let mut aside = PathBuf::from(format!("{}.old-{time}", out.display()));
    let mut n = 1;
    while aside.exists() {
        aside = PathBuf::from(format!("{}.old-{time}-{n}", out.display()));
        n += 1;
    }
    std::fs::rename(out, &aside).map_err(|e| Error::io(out, e))?;
    eprintln!(
        "note: --force: moved the earlier {} to {}",
        out.display(),
        aside.display()
    );
    Ok(())
}

/// Creates a run folder, mapping a folder that cannot be made (under `/proc`, no permission) to
/// a usage error naming it. Errors: [`Error::InvalidArgument`] (`--out`).
pub fn create_out(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| {
        invalid(
            "--out",
            format!(
                "cannot create the run folder {} ({e}); pass --out with a writable folder",
                dir.display()
            ),
        )
    })?;
    // A folder that exists but cannot take files fails here, not after the model has loaded.
    let probe = dir.join(".kvbench-write-test");
    std::fs::write(&probe, b"").map_err(|e| {
        invalid(
            "--out",
            format!(
                "cannot write into {} ({e}); pass --out with a writable folder",
                dir.display()
            ),
        )
    })?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}

/// What a resumed run must share with the run that started the folder, else its new rows would
/// be measured under other conditions than the earlier ones yet carry the same run id.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeIdentity {
    /// sha256 of each model file (empty for synthetic runs).
    pub model_sha256: Vec<String>,
    /// Worker threads.
    pub threads: usize,
    /// CPU model name.
    pub cpu: String,
}

/// What a resumed run must share with the folder's first run, probed now (the thread pool must
/// be built first): the model files' sha256, the worker threads and the CPU.
pub fn resume_identity(model_sha256: Vec<String>) -> ResumeIdentity {
    let machine = crate::report::meta::Machine::probe();
    ResumeIdentity {
        model_sha256,
        threads: machine.threads,
        cpu: machine.cpu,
    }
}

/// Compares `now` with what the folder's `meta.json` recorded. A value meta.json lacks (a run
/// folder from an older kvbench) is not checked. Errors: [`Error::InvalidArgument`] (`--resume`)
/// naming the value that differs, both values, and what to do.
pub fn check_resume(
    dir: &Path,
    meta: &serde_json::Value,
    now: &ResumeIdentity,
) -> Result<(), Error> {
    let bad = |reason: String| {
        invalid(
            "--resume",
            format!(
                "{reason}; the rows already in {} were measured otherwise. Start a new run \
                 (another --out) instead",
                dir.display()
            ),
        )
    };
    if let Some(before) = meta["model"]["sha256"].as_array() {
        let before: Vec<&str> = before.iter().filter_map(|v| v.as_str()).collect();
        if before
            != now
                .model_sha256
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        {
            return Err(bad(format!(
                "the model file changed: sha256 {} then, {} now",
                before.join(","),
                now.model_sha256.join(",")
            )));
        }
    }
    if let Some(t) = meta["machine"]["threads"].as_u64() {
        if t as usize != now.threads {
            return Err(bad(format!(
                "the run used {t} threads, this one would use {} (pass --threads {t})",
                now.threads
            )));
        }
    }
    if let Some(cpu) = meta["machine"]["cpu"].as_str() {
        if cpu != now.cpu {
            return Err(bad(format!(
                "the run was measured on a {cpu}, this machine is a {}",
                now.cpu
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_list_entries_are_merged() {
        let mut v = vec![1usize, 4, 1, 4, 8];
        dedup_with_note("--batch-sizes", &mut v);
        assert_eq!(v, vec![1, 4, 8]);
    }

    #[test]
    fn threads_far_past_the_cpus_are_refused() {
        let cpus = logical_cpus();
        assert!(check_threads(Some(MAX_THREADS_PER_CPU * cpus)).is_ok());
        let e = check_threads(Some(MAX_THREADS_PER_CPU * cpus + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--threads"), "{e}");
        assert!(check_threads(Some(0)).is_err());
        assert!(check_threads(None).is_ok());
    }

    #[test]
    fn resume_with_another_model_file_is_refused() {
        let meta = serde_json::json!({
            "model": {"sha256": ["aa"]},
            "machine": {"threads": 2, "cpu": "X"}
        });
        let same = ResumeIdentity {
            model_sha256: vec!["aa".into()],
            threads: 2,
            cpu: "X".into(),
        };
        assert!(check_resume(Path::new("r"), &meta, &same).is_ok());
        let other = ResumeIdentity {
            model_sha256: vec!["bb".into()],
            ..same.clone()
        };
        let e = check_resume(Path::new("r"), &meta, &other)
            .unwrap_err()
            .to_string();
        assert!(e.contains("aa") && e.contains("bb"), "{e}");
        let threads = ResumeIdentity { threads: 1, ..same };
        let e = check_resume(Path::new("r"), &meta, &threads)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--threads 2"), "{e}");
    }
}
