//! Ctrl-C (SIGINT) and SIGTERM end a run the way a user can act on: the run folder this
//! process holds ([`crate::report::run_dir`]) gets `"status": "interrupted"` and an
//! `interrupted_at` time in its `meta.json`, its lock is released, one line says where the
//! finished results are and how to continue (`kvbench <command> --resume <dir>`), and the exit
//! code is the shell's convention, 128 + the signal (130 for SIGINT, 143 for SIGTERM).
//!
//! Everything a run finished is already on disk when the signal comes (each point is appended
//! to `raw.jsonl` and flushed as it finishes), so stopping at once loses only the point in
//! progress; a `raw.jsonl` line cut short by the exit is dropped on `--resume`.
//!
//! A closed pipe (`kvbench plan | head -1`) ends the process quietly through SIGPIPE's default
//! action, as `cat` or `grep` do, instead of Rust's default of ignoring SIGPIPE and then
//! panicking on the failed write ([`install`]).

use crate::report::meta::RunStatus;
use std::path::Path;

/// Installs the handlers: SIGPIPE back to its default action, and a thread that waits for
/// SIGINT/SIGTERM. Call once, first thing in `main`. Errors are ignored (a platform without
/// these signals keeps its defaults).
pub fn install() {
    // SAFETY: setting a signal's disposition to its default has no preconditions; done before
    // any other thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let name = if sig == SIGINT {
                "interrupted"
            } else {
                "terminated"
            };
            match crate::report::run_dir::held() {
                Some(dir) => {
                    mark_interrupted(&dir);
                    crate::report::run_dir::release_held(&dir);
                    let cmd = super::command_line()
                        .get(1)
                        .cloned()
                        .unwrap_or_else(|| "sweep".into());
                    eprintln!(
                        "\n{name}: the finished results are kept in {}; continue with `kvbench \
                         {cmd} --resume {}`",
                        dir.display(),
                        dir.display()
                    );
                }
                None => eprintln!("\n{name}"),
            }
            std::process::exit(128 + sig);
        }
    });
}

/// Sets `"status": "interrupted"` and `"interrupted_at"` in `dir/meta.json` (written through a
/// temporary file and a rename, as every `meta.json` write). A folder without a readable
/// `meta.json` is left alone, and so is a run that has already ended (`finished`, `failed`,
/// `partial`): a signal that arrives after its last `meta.json` write, while it lets go of its
/// folder, does not relabel its complete results.
pub fn mark_interrupted(dir: &Path) {
    let path = dir.join(crate::report::META_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let Some(m) = v.as_object_mut() else {
        return;
    };
    let status = m
        .get("status")
        .cloned()
        .map(serde_json::from_value::<RunStatus>);
    if matches!(status, Some(Ok(s)) if s.has_ended()) {
        return;
    }
    m.insert("status".into(), serde_json::json!(RunStatus::Interrupted));
    m.insert(
        "interrupted_at".into(),
        crate::util::time::now_rfc3339().into(),
    );
    let tmp = path.with_extension("json.interrupt.tmp");
    if let Ok(s) = serde_json::to_string_pretty(&v) {
        if std::fs::write(&tmp, s + "\n").is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_json_is_marked_interrupted_and_keeps_its_fields() {
        let d = std::env::temp_dir().join(format!("kvbench-int-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("meta.json"),
            r#"{"format": 1, "status": "running", "run_id": "x"}"#,
        )
        .unwrap();
        mark_interrupted(&d);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("meta.json")).unwrap()).unwrap();
        assert_eq!(v["status"], "interrupted");
        assert_eq!(v["run_id"], "x");
        assert_eq!(v["format"], 1);
        assert!(v["interrupted_at"].as_str().unwrap().ends_with('Z'));
        std::fs::remove_dir_all(&d).ok();
    }

    /// A run that has ended keeps its status: the signal came after its last write.
    #[test]
    fn an_ended_run_is_not_marked_interrupted() {
        let d = std::env::temp_dir().join(format!("kvbench-int-done-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for status in ["finished", "failed", "partial"] {
            let meta = format!(r#"{{"format": 1, "status": "{status}", "run_id": "x"}}"#);
            std::fs::write(d.join("meta.json"), &meta).unwrap();
            mark_interrupted(&d);
            assert_eq!(std::fs::read_to_string(d.join("meta.json")).unwrap(), meta);
        }
        std::fs::remove_dir_all(&d).ok();
    }
}
