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
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    writeln!(f, "{me}").map_err(|e| Error::io(&path, e))?;
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
            .any(|e| e.file_name() != LOCK_FILE);
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
}
