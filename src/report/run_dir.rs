//! A run folder, for every measuring command (`sweep`, `serve`): where it is and under which
//! run id ([`RunDir`]: a new folder, `--force` moving an old one aside, or a resumed one), the
//! flags that choose it ([`RunDirArgs`]), what a resumed run must share with the first
//! ([`check_resume`]), and the append-only raw log ([`RawLog`], [`read_jsonl`]): one JSON
//! line per finished result, flushed at once; on resume rewritten to the finished work first.
//!
//! One writer per run folder: a lock file (`.kvbench.lock`, holding the writer's PID) that the
//! writer holds the kernel's advisory lock on (`flock(2)` through [`std::fs::File::try_lock`])
//! from before it writes anything until it ends. Two runs given the same `--out` at the same
//! moment both see an empty folder; only one gets the lock, so the other is refused instead of
//! interleaving its rows into the first one's `raw.jsonl` (the defect of issue #25: two
//! `serve` runs into one folder both exited 0).
//!
//! The kernel drops the lock when its process ends however it ends (kill -9 included), so a
//! lock file left behind is free to the next run — `--resume` after a crash is the normal way
//! on — and no run decides from a PID whether a lock is stale: two runs that found the same
//! left-behind file both took it over under the PID-file scheme this replaces (each removed
//! the file and created its own; the second removal took the first run's fresh lock), and a
//! PID reused by another process kept a dead run's folder locked. The PID in the file only
//! names the holder in errors. A run removes the lock file when it ends only if it is still
//! its own (same device and inode: `--force` may have moved its folder aside meanwhile), and
//! `--force` refuses a folder a run still holds.
//!
//! Where the file system takes no advisory locks (some network mounts; tried on a file of the
//! run's own before the shared one is touched), the PID-file scheme stands in: the file created
//! atomically (`O_CREAT | O_EXCL` through a hard link), a lock whose PID no longer runs
//! (`/proc/<pid>`) taken over — the scheme of Slurm's and many daemons' PID files, with its
//! races (two runs finding a stale file at once may both take it; a reused PID holds it).
//! A run of a kvbench from before 2026-12-06 holds its folder by the PID-file scheme alone,
//! which this one does not see: let such runs end before starting new ones in their folders.

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

/// The file [`create_out`] writes and removes to see that a run folder takes files.
const WRITE_TEST: &str = ".kvbench-write-test";

/// The run folder this process holds, for the interrupt handler ([`crate::cli::interrupt`]),
/// and its lock file's identity (`None`: the PID-file scheme).
static HELD: Mutex<Option<(PathBuf, Option<FileId>)>> = Mutex::new(None);

/// A file's identity: its device and inode numbers.
type FileId = (u64, u64);

fn file_id(m: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// Whether the file at `path` is the open file `file` (the same device and inode).
fn same_file(path: &Path, file: &std::fs::File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => file_id(&a) == file_id(&b),
        _ => false,
    }
}

/// A held run-folder lock; dropping it removes the lock file if it is still this lock's (and
/// then releases the kernel's lock on it, by closing the file).
#[derive(Debug)]
pub struct FolderLock {
    path: PathBuf,
    dir: PathBuf,
    /// The lock file, open with the kernel's lock held on it (`None`: the PID-file scheme).
    file: Option<std::fs::File>,
}

/// What one try at the kernel's lock on a run folder's lock file found.
#[derive(Debug)]
enum Flock {
    /// Held by this process from now on: the lock file, open, holding this process's PID.
    Held(std::fs::File),
    /// Held by another run: the PID its file names, where it names one that runs.
    Busy(Option<u32>),
    /// The file was removed or replaced between opening and locking it (its holder ended
    /// meanwhile): try again.
    Moved,
}

/// The PID a lock file names, if it names one.
fn pid_in(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
}

/// Whether the file system of lock file `path` takes advisory locks, tried on a file of this
/// call's own next to it (`<lock>.<pid>.<n>.probe`, removed after), so the shared lock file is
/// not touched before the scheme is chosen (and two threads of one process trying at once do
/// not lock each other's probe). Errors: the probe file cannot be created.
fn flock_supported(path: &Path, pid: u32) -> std::io::Result<bool> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut probe = path.as_os_str().to_owned();
    probe.push(format!(".{pid}.{n}.probe"));
    let probe = PathBuf::from(probe);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)?;
    // Another holder of this very file (a process of the same PID in another PID namespace
    // sharing the folder) proves locks work as well as holding it does.
    let ok = !matches!(file.try_lock(), Err(std::fs::TryLockError::Error(_)));
    drop(file);
    let _ = std::fs::remove_file(&probe);
    Ok(ok)
}

/// One try at the kernel's lock on lock file `path` for process `pid`: opened (created if
/// missing, never truncated before the lock is held), then [`lock_open`]. A file this user may
/// not write (left by another user in a shared folder) is locked read-only and, when no one
/// holds it, removed (then [`Flock::Moved`]: try again). Errors: opening, removing or writing
/// the file; the kernel refusing the lock for another reason than another holder.
fn flock_with_pid(path: &Path, pid: u32) -> std::io::Result<Flock> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && path.exists() => {
            let theirs = std::fs::File::open(path)?;
            return match lock_open(path, theirs, None)? {
                Flock::Held(f) => {
                    std::fs::remove_file(path)?;
                    drop(f);
                    Ok(Flock::Moved)
                }
                other => Ok(other),
            };
        }
        Err(e) => return Err(e),
    };
    lock_open(path, file, Some(pid))
}

/// The kernel's lock on `file`, opened at `path`: held, and `path` still names `file`, it is
/// [`Flock::Held`] and the file then holds `pid` alone (`None`: left as it is). The holder
/// before this one removes the file when it ends and then lets go, so one who opened the file
/// before the removal finds it moved, whether the holder let go yet or not. Errors: the kernel
/// refusing the lock for another reason than another holder; writing the file.
fn lock_open(path: &Path, mut file: std::fs::File, pid: Option<u32>) -> std::io::Result<Flock> {
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            if !same_file(path, &file) {
                return Ok(Flock::Moved);
            }
            // Until the holder writes its own, the file may name the run that left it.
            let holder = pid_in(path).filter(|&p| alive(p) != Some(false));
            return Ok(Flock::Busy(holder));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    if !same_file(path, &file) {
        return Ok(Flock::Moved);
    }
    if let Some(pid) = pid {
        file.set_len(0)?;
        writeln!(file, "{pid}")?;
        file.flush()?;
    }
    Ok(Flock::Held(file))
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
    /// Takes the lock of run folder `dir` (which must exist) for this process: the kernel's
    /// advisory lock on its lock file, or where the file system takes none the PID-file scheme
    /// (module docs). A lock file no process holds the kernel's lock on (its run ended,
    /// however) is taken over, whatever PID it names. `flag` names the input that chose the
    /// folder (`--out`, `--resume`) for the error. Errors: [`Error::InvalidArgument`] naming
    /// `flag` when another run (its PID named where the file names one that runs) holds the
    /// folder, or the file changed hands three times while this run tried; [`Error::Io`] when
    /// the lock file cannot be opened or written, or the kernel refuses the lock for another
    /// reason than another holder.
    pub fn acquire(dir: &Path, flag: &str) -> Result<FolderLock> {
        let Some(file) = flock_folder(dir, flag)? else {
            return Self::acquire_by_pid(dir, flag);
        };
        let id = file.metadata().ok().map(|m| file_id(&m));
        if let Ok(mut h) = HELD.lock() {
            *h = Some((dir.to_path_buf(), id));
        }
        Ok(FolderLock {
            path: dir.join(LOCK_FILE),
            dir: dir.to_path_buf(),
            file: Some(file),
        })
    }

    /// [`Self::acquire`] where the file system takes no advisory locks: the PID-file scheme
    /// (module docs). Errors: [`Error::InvalidArgument`] naming `flag` when a running process
    /// other than this one (its PID named) holds the folder, or the lock changed hands twice
    /// while this run tried; [`Error::Io`] when the lock file cannot be created or a stale one
    /// removed.
    fn acquire_by_pid(dir: &Path, flag: &str) -> Result<FolderLock> {
        let path = dir.join(LOCK_FILE);
        let me = std::process::id();
        for _ in 0..2 {
            match create_with_pid(&path, me) {
                Ok(()) => {
                    if let Ok(mut h) = HELD.lock() {
                        *h = Some((dir.to_path_buf(), None));
                    }
                    return Ok(FolderLock {
                        path,
                        dir: dir.to_path_buf(),
                        file: None,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if let Some(pid) = live_holder(&path, me) {
                        return Err(busy(dir, &path, flag, Some(pid)));
                    }
                    // Stale (the writer is gone) or ours: take it over (gone already: another
                    // run took it over first; try again).
                    match std::fs::remove_file(&path) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(Error::io(&path, e));
                        }
                        _ => {}
                    }
                }
                Err(e) => return Err(Error::io(&path, e)),
            }
        }
        Err(changed_hands(dir, flag))
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
            // Not the lock, nor another run's lock or probe being created (`<lock>.<pid>…`,
            // gone at once), nor another run's write test (`create_out`).
            .any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                !name.starts_with(LOCK_FILE) && name != WRITE_TEST
            });
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
        // Only this lock's own file: a folder moved aside (`--force`) holds another run's at
        // this path now.
        let ours = match &self.file {
            Some(f) => same_file(&self.path, f),
            None => pid_in(&self.path) == Some(std::process::id()),
        };
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Ok(mut h) = HELD.lock() {
            if h.as_ref().map(|(d, _)| d.as_path()) == Some(self.dir.as_path()) {
                *h = None;
            }
        }
    }
}

/// The run folder this process holds a lock on now, if any.
pub fn held() -> Option<PathBuf> {
    HELD.lock()
        .ok()
        .and_then(|h| h.as_ref().map(|(d, _)| d.clone()))
}

/// Removes the lock file of `dir` if it is this process's (for an exit that skips `Drop`; the
/// kernel's lock goes with the process anyway): the file this process locked, or under the
/// PID-file scheme the file naming this process.
pub fn release_held(dir: &Path) {
    let path = dir.join(LOCK_FILE);
    // Held across the check and the removal: `Drop` clears HELD before it closes the file, so
    // the inode checked cannot be another run's new lock file meanwhile.
    let guard = HELD.lock().ok();
    let id = guard
        .as_ref()
        .and_then(|h| h.as_ref().filter(|(d, _)| d == dir).map(|(_, id)| *id));
    let mine = match id {
        Some(Some(id)) => std::fs::metadata(&path).ok().map(|m| file_id(&m)) == Some(id),
        _ => pid_in(&path) == Some(std::process::id()),
    };
    if mine {
        let _ = std::fs::remove_file(&path);
    }
    drop(guard);
}

/// Holds the kernel's lock on run folder `out`'s lock file (created if missing) while
/// `--force` moves the non-empty folder aside, so no run takes the folder meanwhile; `None`
/// where the file system takes no advisory locks and no running process other than this one
/// holds the folder by the PID-file scheme. Errors: [`Error::InvalidArgument`] (`--force`)
/// when a run holds the folder (moved aside, it would go on writing by path into the new
/// run's folder) or it changed hands three times meanwhile; [`Error::Io`] when the lock file
/// cannot be opened.
fn hold_for_move(out: &Path) -> Result<Option<std::fs::File>> {
    if let Some(file) = flock_folder(out, "--force")? {
        return Ok(Some(file));
    }
    let path = out.join(LOCK_FILE);
    match live_holder(&path, std::process::id()) {
        Some(pid) => Err(busy(out, &path, "--force", Some(pid))),
        None => Ok(None),
    }
}

/// The kernel's lock on run folder `dir`'s lock file for this process, tried up to three times
/// while the file changes hands; `None` where the file system takes no advisory locks.
/// Errors: [`Error::InvalidArgument`] naming `flag` when another run holds it or it changed
/// hands three times; [`Error::Io`] when the file cannot be opened or written.
fn flock_folder(dir: &Path, flag: &str) -> Result<Option<std::fs::File>> {
    let path = dir.join(LOCK_FILE);
    let me = std::process::id();
    if !flock_supported(&path, me).map_err(|e| Error::io(&path, e))? {
        return Ok(None);
    }
    for _ in 0..3 {
        match flock_with_pid(&path, me).map_err(|e| Error::io(&path, e))? {
            Flock::Held(file) => return Ok(Some(file)),
            Flock::Busy(pid) => return Err(busy(dir, &path, flag, pid)),
            Flock::Moved => continue,
        }
    }
    Err(changed_hands(dir, flag))
}

/// Under the PID-file scheme, the running process other than `me` that lock file `path`
/// names, if any.
fn live_holder(path: &Path, me: u32) -> Option<u32> {
    pid_in(path).filter(|&pid| pid != me && alive(pid) == Some(true))
}

/// The error for a run folder `dir` whose lock file `path` another run holds (`pid`, where
/// the file names one); `flag` chose the folder.
fn busy(dir: &Path, path: &Path, flag: &str, pid: Option<u32>) -> Error {
    let who = pid.map_or("its PID not yet written".to_string(), |p| {
        format!("pid {p}")
    });
    invalid(
        flag,
        format!(
            "{} is held by another kvbench run ({who}, lock {}): one writing it, or one moving \
             it aside under --force; give each run its own --out, or wait until that run ends \
             and then `--resume` the folder if it is still there",
            dir.display(),
            path.display()
        ),
    )
}

/// The error for a run folder whose lock changed hands more than this run's tries.
fn changed_hands(dir: &Path, flag: &str) -> Error {
    invalid(
        flag,
        format!(
            "{} changed hands repeatedly while this run tried to lock it: another kvbench run \
             is starting there; give each run its own --out",
            dir.display()
        ),
    )
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
/// renames it to `<out>.old-<UTC time>` first and says so — unless a run still writes it.
/// Errors: [`Error::InvalidArgument`] (`--out`) naming the folder and what to pass instead, or
/// (`--force`) naming the run that holds it; [`Error::Io`] when the move fails.
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
    let hold = hold_for_move(out)?;
    std::fs::rename(out, &aside).map_err(|e| Error::io(out, e))?;
    if let Some(file) = hold {
        // The lock file a run left behind, moved along: no run holds it.
        let moved = aside.join(LOCK_FILE);
        if same_file(&moved, &file) {
            let _ = std::fs::remove_file(&moved);
        }
    }
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
    let probe = dir.join(WRITE_TEST);
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

    /// A folder whose lock file another holder has the kernel's lock on (here an open file of
    /// this test's own, naming PID 1) is refused naming the flag and the PID; once that holder
    /// lets go, the lock is taken, the file then naming this process, and removed on drop.
    #[test]
    fn a_folder_held_by_a_running_process_is_refused() {
        let d = tmp("held");
        std::fs::write(d.join(LOCK_FILE), "1\n").unwrap();
        let holder = std::fs::File::open(d.join(LOCK_FILE)).unwrap();
        holder.try_lock().unwrap();
        let e = FolderLock::acquire(&d, "--out").unwrap_err().to_string();
        assert!(e.contains("--out") && e.contains("pid 1"), "{e}");
        drop(holder);
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

    /// A lock file no process holds the kernel's lock on is taken over, whatever it names: a
    /// PID that no longer runs (PIDs are below 2^22 on Linux, so 4,000,000,000 never runs),
    /// none, or one that runs (PID 1, init) — a killed run's PID reused by another process
    /// kept its folder locked under the PID-file scheme.
    #[test]
    fn a_left_behind_lock_is_taken_over() {
        let d = tmp("stale");
        for stale in ["4000000000\n", "", "not a pid", "1\n"] {
            std::fs::write(d.join(LOCK_FILE), stale).unwrap();
            let l = FolderLock::acquire(&d, "--resume").unwrap();
            assert_eq!(
                std::fs::read_to_string(d.join(LOCK_FILE)).unwrap(),
                format!("{}\n", std::process::id()),
                "{stale:?}"
            );
            drop(l);
        }
        std::fs::remove_dir_all(&d).ok();
    }

    /// The PID-file scheme (file systems without advisory locks): a lock naming a PID that no
    /// longer runs, or none, is taken over; one naming a running process (PID 1) is refused,
    /// naming it; a file removed before it could be (another run took it over first) is no
    /// error.
    #[test]
    fn the_pid_file_scheme_takes_stale_locks_and_refuses_live_ones() {
        let d = tmp("pidfile");
        for stale in ["4000000000\n", "", "not a pid"] {
            std::fs::write(d.join(LOCK_FILE), stale).unwrap();
            let l = FolderLock::acquire_by_pid(&d, "--resume").unwrap();
            assert_eq!(
                pid_in(&d.join(LOCK_FILE)),
                Some(std::process::id()),
                "{stale:?}"
            );
            drop(l);
            assert!(!d.join(LOCK_FILE).exists());
        }
        std::fs::write(d.join(LOCK_FILE), "1\n").unwrap();
        let e = FolderLock::acquire_by_pid(&d, "--out")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--out") && e.contains("pid 1"), "{e}");
        std::fs::remove_dir_all(&d).ok();
    }

    /// A run that opened the lock file just before its holder ended (the holder removes the
    /// file, then lets go) finds it moved and tries again — whether the holder has let go yet
    /// or not — rather than locking a file no longer in the folder (a third run would create
    /// a new one and hold the folder too) or being refused from a free folder.
    #[test]
    fn a_lock_file_removed_after_opening_is_tried_again() {
        let d = tmp("moved");
        let path = d.join(LOCK_FILE);
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let holder = FolderLock::acquire(&d, "--out").unwrap();
        assert!(matches!(
            lock_open(&path, open(), Some(7)).unwrap(),
            Flock::Busy(Some(p)) if p == std::process::id()
        ));
        // Three runs open the file; then the holder ends: its `Drop` removes the file (done
        // here by hand first, to look between the removal and the letting go), then lets go.
        let (early, late, later) = (open(), open(), open());
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            lock_open(&path, early, Some(7)).unwrap(),
            Flock::Moved
        ));
        drop(holder);
        assert!(!path.exists());
        assert!(matches!(
            lock_open(&path, late, Some(7)).unwrap(),
            Flock::Moved
        ));
        // Another run has created a new lock file at the path since: the old file, opened
        // before, is still not the folder's.
        std::fs::write(&path, "").unwrap();
        assert!(matches!(
            lock_open(&path, later, Some(7)).unwrap(),
            Flock::Moved
        ));
        drop(FolderLock::acquire(&d, "--out").unwrap());
        std::fs::remove_dir_all(&d).ok();
    }

    /// Four runs taking and letting go of one folder's lock over and over, starting from a lock
    /// file a killed run left: never two hold it at once, and every run gets it in turn. Four
    /// threads stand for the runs (the kernel's lock belongs to each open file, so two opens in
    /// one process exclude each other as two processes do).
    #[test]
    fn runs_taking_one_folder_never_hold_it_together() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let d = tmp("stress");
        std::fs::write(d.join(LOCK_FILE), "4000000000\n").unwrap();
        let holding = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mut got = 0;
                    while got < 50 {
                        let lock = match FolderLock::acquire(&d, "--resume") {
                            Ok(lock) => lock,
                            Err(Error::InvalidArgument { .. }) => {
                                std::thread::yield_now();
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        };
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_micros(100));
                        holding.fetch_sub(1, Ordering::SeqCst);
                        drop(lock);
                        got += 1;
                    }
                });
            }
        });
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "two runs held the folder at once"
        );
        assert!(!d.join(LOCK_FILE).exists());
        std::fs::remove_dir_all(&d).ok();
    }

    /// `--force` refuses to move aside a folder a run still writes (moved, that run would go on
    /// writing by path into the new run's folder), naming the run; a lock file a killed run
    /// left behind is no obstacle, and is not carried into the moved folder.
    #[test]
    fn force_does_not_move_a_folder_a_run_writes() {
        let d = tmp("force");
        std::fs::write(d.join("raw.jsonl"), "{}\n").unwrap();
        let holder = FolderLock::acquire(&d, "--out").unwrap();
        let e = prepare_out(&d, true).unwrap_err().to_string();
        assert!(
            e.contains("--force") && e.contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
        assert!(d.join("raw.jsonl").exists());
        drop(holder);
        std::fs::write(d.join(LOCK_FILE), "4000000000\n").unwrap();
        prepare_out(&d, true).unwrap();
        assert!(!d.exists());
        let parent = d.parent().unwrap();
        let stem = d.file_name().unwrap().to_string_lossy().to_string();
        let aside: Vec<_> = std::fs::read_dir(parent)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{stem}.old-"))
            })
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(aside[0].join("raw.jsonl").exists());
        assert!(!aside[0].join(LOCK_FILE).exists());
        std::fs::remove_dir_all(&aside[0]).ok();
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
