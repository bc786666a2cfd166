//! A run folder, for every measuring command (`sweep`, `serve`): where it is and under which
//! run id ([`RunDir`]: a new folder, `--force` moving an old one aside, or a resumed one), the
//! flags that choose it ([`RunDirArgs`]), what a resumed run must share with the first
//! ([`check_resume`]), and the append-only raw log ([`RawLog`], [`read_jsonl`]): one JSON
//! line per finished result, flushed at once; on resume rewritten to the finished work first.
//!
//! One writer per run folder: a lock file (`.kvbench.lock`, holding the writer's PID) created
//! atomically (`O_CREAT | O_EXCL`) before a run writes anything, removed when the run ends.
//! Two runs given the same `--out` at the same moment both see an empty folder; only one can
//! create the lock, so the other is refused instead of interleaving its rows into the first
//! one's `raw.jsonl` (the defect of issue #25: two `serve` runs into one folder both exited 0).
//!
//! A lock left by a process that no longer runs (kill -9, a lost machine) is stale: the next
//! run takes it over, since `--resume` after a crash is the normal way on. Whether the PID runs
//! is read from `/proc/<pid>` (Linux); where `/proc` is missing the lock is taken as stale.
//! The same scheme as Slurm's and many daemons' PID files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The flags that choose a run folder, shared by every measuring command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunDirArgs {
    /// Read settings from a suite: a TOML file, or a built-in suite's name (`quick`, `ci`,
    /// `serve`, …; `crate::measure::suites::BUILTIN`) where no file of that name exists;
    /// flags given here override it.
    #[arg(long, value_name = "FILE|NAME",
          help = crate::measure::suites::suite_short_help(),
          long_help = crate::measure::suites::suite_long_help())]
    pub suite: Option<PathBuf>,
    /// Continue an interrupted run in this folder with the settings it started with (from its
    /// meta.json); finished points are kept, the rest run.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,
    /// Run folder (default: reports/<run-id>). A folder that already holds files is refused
    /// unless --resume continues it or --force moves it aside.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// With --out: move an existing, non-empty run folder aside to `<out>.old-<time>` and start
    /// a new run there.
    #[arg(long)]
    pub force: bool,
    /// With --resume: measure again the finished points that were timed while other processes
    /// used more than 0.15 cores (`contended = true` in results.csv); their old records are
    /// dropped from raw.jsonl and the new measurement takes their place. Quality results are
    /// kept (they do not depend on the machine's load).
    #[arg(long, requires = "resume")]
    pub rerun_contended: bool,
}

/// A run folder this process writes: its id, when it started and was resumed, the path, and
/// the lock that keeps other runs out until it is dropped.
#[derive(Debug)]
pub struct RunDir {
    /// The run id (`<UTC start time>-<label>`).
    pub run_id: String,
    /// UTC start time of the first run, RFC 3339.
    pub started_at: String,
    /// When `--resume` continued it, this run last.
    pub resumed_at: Vec<String>,
    /// The folder.
    pub dir: PathBuf,
    /// `--rerun-contended`: finished points timed on a busy machine run again.
    pub rerun_contended: bool,
    _lock: FolderLock,
}

impl RunDir {
    /// A new run's folder `dir` (created), run id `run_id`, started `now`. `explicit`: `dir`
    /// came from `--out`, which [`prepare_out`] checked (and with `--force` emptied) at start,
    /// so files there now were written by another process meanwhile. Errors:
    /// [`Error::InvalidArgument`] (`--out`) for such a folder, one that cannot be created or
    /// written, or one another run holds; [`Error::Io`].
    pub fn create(dir: PathBuf, explicit: bool, run_id: String, now: &str) -> Result<RunDir> {
        if explicit && non_empty(&dir) {
            return Err(invalid(
                "--out",
                format!(
                    "{} received files after this run checked it at start: another kvbench run \
                     is writing there; give each run its own --out",
                    dir.display()
                ),
            ));
        }
        // A default folder taken meanwhile.
        prepare_out(&dir, false)?;
        create_out(&dir)?;
        let lock = FolderLock::acquire_empty(&dir, "--out")?;
        Ok(RunDir {
            run_id,
            started_at: now.to_string(),
            resumed_at: Vec::new(),
            dir,
            rerun_contended: false,
            _lock: lock,
        })
    }

    /// The folder `dir` of a run resumed `now`, keeping the first run's id and start time and
    /// its earlier resumptions. Errors: as [`FolderLock::acquire`] (`--resume`).
    pub fn resume(
        dir: PathBuf,
        run_id: String,
        started_at: String,
        mut resumed_at: Vec<String>,
        now: &str,
    ) -> Result<RunDir> {
        resumed_at.push(now.to_string());
        let lock = FolderLock::acquire(&dir, "--resume")?;
        Ok(RunDir {
            run_id,
            started_at,
            resumed_at,
            dir,
            rerun_contended: false,
            _lock: lock,
        })
    }
}

/// Which command wrote the results at `path`: a run folder's `meta.json` says it; a
/// `results.csv` is a serving run's when its header has the serving columns (`arrival`,
/// `goodput`). Errors: [`Error::InvalidArgument`] naming the path when it is neither a run
/// folder nor a readable file.
pub fn kind_of(path: &Path) -> Result<super::meta::RunKind> {
    use super::meta::RunKind;
    if path.is_dir() {
        let value = super::meta::read_value(&path.join(META_FILE))?;
        return Ok(RunKind::of(&value));
    }
    let mut first = String::new();
    let f = crate::util::open_regular(path).map_err(|e| {
        invalid(
            &path.display().to_string(),
            format!("cannot read it ({e}): give a run folder or its results.csv"),
        )
    })?;
    std::io::BufRead::read_line(&mut std::io::BufReader::new(f), &mut first)
        .map_err(|e| Error::io(path, e))?;
    let cols: Vec<&str> = first.trim_end().split(',').collect();
    Ok(if cols.contains(&"arrival") && cols.contains(&"goodput") {
        RunKind::Serve
    } else {
        RunKind::Sweep
    })
}

impl RunDir {
    /// This run's `meta.json`, status `running`: the version, the command line, the machine,
    /// when the run started and was resumed, `settings` as recorded (threads filled in), what
    /// every row repeats, and the command's own `details`.
    pub fn meta<S: crate::measure::settings::Settings, C>(
        &self,
        kind: super::meta::RunKind,
        mode: super::meta::RunMode,
        settings: &S,
        report_context: C,
        details: serde_json::Map<String, serde_json::Value>,
    ) -> super::meta::RunMeta<S, C> {
        super::meta::RunMeta {
            format: super::meta::META_FORMAT,
            kvbench: super::meta::version(),
            kind,
            run_id: self.run_id.clone(),
            mode,
            command: crate::util::command_line(),
            started_at: self.started_at.clone(),
            finished_at: None,
            status: Some(super::meta::RunStatus::Running),
            machine: super::meta::Machine::probe(),
            resumed_at: self.resumed_at.clone(),
            shard: None,
            settings: settings.recorded(crate::measure::settings::logical_cpus()),
            report_context,
            details,
        }
    }
}

/// Reads a JSON-lines file of `what` records (`raw result`, `serve raw`). A last line cut short
/// by an interrupted write (no newline after it) is dropped with a warning on stderr; a
/// missing file reads as no records. Errors: [`Error::Io`] (unreadable, not a regular file);
/// [`Error::InvalidArgument`] naming the file and line of any other line that does not parse.
pub fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<Vec<T>> {
    let text = match crate::util::read_regular(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str::<T>(line) {
            Ok(o) => out.push(o),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                eprintln!(
                    "warning: {}: dropped a last line cut short (an interrupted write); its work runs again on --resume",
                    path.display()
                );
            }
            Err(e) => {
                return Err(Error::InvalidArgument {
                    name: format!("{}:{}", path.display(), i + 1),
                    reason: format!("not a kvbench {what} line: {e}"),
                })
            }
        }
    }
    Ok(out)
}

/// A run folder's append-only raw log (`raw.jsonl`): one JSON object a line, each written and
/// flushed as its result finishes.
#[derive(Debug)]
pub struct RawLog {
    path: PathBuf,
    file: std::fs::File,
}

impl RawLog {
    /// Opens `dir/raw.jsonl` to append. When `keep` is not empty (a resumed run's finished
    /// lines) or the file ends in a line cut short, it is first rewritten to exactly `keep`
    /// (through a temporary file and a rename, so an interruption then loses nothing).
    /// Errors: [`Error::Io`] naming the file.
    pub fn open(dir: &Path, keep: &[String]) -> Result<RawLog> {
        let path = dir.join(RAW_FILE);
        let cut_short = std::fs::read(&path).is_ok_and(|b| b.last().is_some_and(|&c| c != b'\n'));
        if !keep.is_empty() || cut_short {
            let tmp = path.with_extension("jsonl.tmp");
            let mut text = String::new();
            for l in keep {
                text.push_str(l);
                text.push('\n');
            }
            std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Ok(RawLog { path, file })
    }

    /// Appends `record` as one line and flushes it. Errors: [`Error::Io`] naming the file.
    pub fn append(&mut self, record: &impl serde::Serialize) -> Result<()> {
        let mut line =
            serde_json::to_string(record).map_err(|e| Error::io(&self.path, e.into()))?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| Error::io(&self.path, e))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// File names inside a run folder.
pub const RAW_FILE: &str = "raw.jsonl";
/// See [`RAW_FILE`].
pub const CSV_FILE: &str = "results.csv";
/// See [`RAW_FILE`].
pub const META_FILE: &str = "meta.json";
/// See [`RAW_FILE`].
pub const SUMMARY_FILE: &str = "summary.md";
/// See [`RAW_FILE`].
pub const PLOTS_DIR: &str = "plots";
/// Where run folders written before quality had its own `raw.jsonl` record kept it (one
/// `QualityOutcome` per line); read by `crate::report::read_records`, never written.
pub const LEGACY_QUALITY_FILE: &str = "quality.jsonl";

/// The lock file's name inside a run folder.
pub const LOCK_FILE: &str = ".kvbench.lock";

/// The run folder this process holds, for the interrupt handler ([`crate::cli::interrupt`]).
static HELD: Mutex<Option<PathBuf>> = Mutex::new(None);

/// A held run-folder lock; dropping it removes the lock file.
#[derive(Debug)]
pub struct FolderLock {
    path: PathBuf,
    dir: PathBuf,
}

/// Whether process `pid` runs now (`/proc/<pid>` exists). `None` where `/proc` is absent.
fn alive(pid: u32) -> Option<bool> {
    if !Path::new("/proc/self").exists() {
        return None;
    }
    Some(Path::new(&format!("/proc/{pid}")).exists())
}

/// Creates the lock file `path` holding `pid`, atomically: the PID is written to a file of this
/// process's own (`<lock>.<pid>`), which is then hard-linked to `path` (fails with
/// `AlreadyExists` when the lock is held) and removed — so another process never reads a lock
/// file that exists but holds no PID yet (with `create_new` and a write after, one that did
/// took it for stale, removed it, and both runs wrote into one folder). Where hard links are
/// not supported, `create_new` and a write, as before.
fn create_with_pid(path: &Path, pid: u32) -> std::io::Result<()> {
    let mut own = path.as_os_str().to_owned();
    own.push(format!(".{pid}"));
    let own = PathBuf::from(own);
    std::fs::write(&own, format!("{pid}\n"))?;
    let linked = std::fs::hard_link(&own, path);
    let _ = std::fs::remove_file(&own);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)?;
            writeln!(f, "{pid}")
        }
        r => r,
    }
}

impl FolderLock {
    /// Takes the lock of run folder `dir` (which must exist) for this process. `flag` names
    /// the input that chose the folder (`--out`, `--resume`) for the error. A stale lock (its
    /// PID no longer runs, or unreadable) is taken over. Errors: [`Error::InvalidArgument`]
    /// naming `flag` when another running process (its PID named) holds the folder;
    /// [`Error::Io`] when the lock file cannot be written.
    pub fn acquire(dir: &Path, flag: &str) -> Result<FolderLock> {
        let path = dir.join(LOCK_FILE);
        let me = std::process::id();
        for _ in 0..2 {
            match create_with_pid(&path, me) {
                Ok(()) => {
                    if let Ok(mut h) = HELD.lock() {
                        *h = Some(dir.to_path_buf());
                    }
                    return Ok(FolderLock {
                        path,
                        dir: dir.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match holder {
                        Some(pid) if pid != me && alive(pid) == Some(true) => {
                            return Err(Error::InvalidArgument {
                                name: flag.into(),
                                reason: format!(
                                    "{} is being written by another kvbench run (pid {pid}, \
                                     lock {}); give each run its own --out, or wait until that \
                                     run ends and then `--resume` it",
                                    dir.display(),
                                    path.display()
                                ),
                            });
                        }
                        // Stale (the writer is gone) or ours: take it over.
                        _ => {
                            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                        }
                    }
                }
                Err(e) => return Err(Error::io(&path, e)),
            }
        }
        Err(Error::InvalidArgument {
            name: flag.into(),
            reason: format!(
                "{} changed hands twice while this run tried to lock it: another kvbench run is \
                 starting there; give each run its own --out",
                dir.display()
            ),
        })
    }

    /// [`Self::acquire`] for a new run: the folder must then hold nothing but the lock. Files
    /// there were written by another run after this one checked the folder at its start (two
    /// runs given the same `--out`, the other one already finished). Errors: as `acquire`, and
    /// [`Error::InvalidArgument`] naming `flag` for such a folder.
    pub fn acquire_empty(dir: &Path, flag: &str) -> Result<FolderLock> {
        let lock = Self::acquire(dir, flag)?;
        let others = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .flatten()
            // Not the lock, nor another run's lock being created (`<lock>.<pid>`, gone at once).
            .any(|e| !e.file_name().to_string_lossy().starts_with(LOCK_FILE));
        if others {
            return Err(Error::InvalidArgument {
                name: flag.into(),
                reason: format!(
                    "{} received files after this run checked it at start: another kvbench run \
                     is writing there; give each run its own --out",
                    dir.display()
                ),
            });
        }
        Ok(lock)
    }

    /// The locked folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Ok(mut h) = HELD.lock() {
            if h.as_deref() == Some(self.dir.as_path()) {
                *h = None;
            }
        }
    }
}

/// The run folder this process holds a lock on now, if any.
pub fn held() -> Option<PathBuf> {
    HELD.lock().ok().and_then(|h| h.clone())
}

/// Removes the lock file of `dir` if this process holds it (for an exit that skips `Drop`).
pub fn release_held(dir: &Path) {
    let path = dir.join(LOCK_FILE);
    let mine = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        == Some(std::process::id());
    if mine {
        let _ = std::fs::remove_file(&path);
    }
}

fn invalid(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

/// Whether `dir` exists and holds anything.
pub fn non_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// Prepares `--out` for a new run: a missing or empty folder is fine; a non-empty one is refused
/// (it would mix two runs' rows and overwrite the first run's `meta.json`) unless `force`, which
/// renames it to `<out>.old-<UTC time>` first and says so. Errors: [`Error::InvalidArgument`]
/// (`--out`) naming the folder and what to pass instead; [`Error::Io`] when the move fails.
pub fn prepare_out(out: &Path, force: bool) -> Result<()> {
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
pub fn create_out(dir: &Path) -> Result<()> {
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
    let machine = super::meta::Machine::probe();
    ResumeIdentity {
        model_sha256,
        threads: machine.threads,
        cpu: machine.cpu,
    }
}

/// Compares `now` with what the folder's `meta.json` recorded. A value meta.json lacks (a run
/// folder from an older kvbench) is not checked. Errors: [`Error::InvalidArgument`] (`--resume`)
/// naming the value that differs, both values, and what to do.
pub fn check_resume(dir: &Path, meta: &serde_json::Value, now: &ResumeIdentity) -> Result<()> {
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

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvbench-lock-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A folder locked by a running process (PID 1, init, always runs) is refused naming the
    /// flag and the PID; once released, the lock can be taken.
    #[test]
    fn a_folder_held_by_a_running_process_is_refused() {
        let d = tmp("held");
        std::fs::write(d.join(LOCK_FILE), "1\n").unwrap();
        let e = FolderLock::acquire(&d, "--out").unwrap_err().to_string();
        assert!(e.contains("--out") && e.contains("pid 1"), "{e}");
        std::fs::remove_file(d.join(LOCK_FILE)).unwrap();
        let l = FolderLock::acquire(&d, "--out").unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join(LOCK_FILE)).unwrap().trim(),
            std::process::id().to_string()
        );
        drop(l);
        assert!(!d.join(LOCK_FILE).exists());
        std::fs::remove_dir_all(&d).ok();
    }

    /// The lock file appears with its PID already in it (a file of the creator's own, linked
    /// into place), never empty, so no other run can take a lock being written for stale; the
    /// creator's own file is gone after; a second creation finds the lock and fails.
    #[test]
    fn the_lock_file_appears_with_its_pid() {
        let d = tmp("link");
        let path = d.join(LOCK_FILE);
        create_with_pid(&path, 4242).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "4242\n");
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [LOCK_FILE], "the creator's own file is removed");
        let e = create_with_pid(&path, 4243).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "4242\n");
        std::fs::remove_dir_all(&d).ok();
    }

    /// A lock whose PID no longer runs (PIDs are below 2^22 on Linux, so 4,000,000,000 never
    /// runs) or that holds no PID is stale and taken over.
    #[test]
    fn a_stale_lock_is_taken_over() {
        let d = tmp("stale");
        for stale in ["4000000000\n", "", "not a pid"] {
            std::fs::write(d.join(LOCK_FILE), stale).unwrap();
            let l = FolderLock::acquire(&d, "--resume").unwrap();
            drop(l);
        }
        std::fs::remove_dir_all(&d).ok();
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
