//! The suites built into the binary: every `suites/*.toml` embedded at compile time, so
//! `--suite quick` works from any folder (and from an installed binary without the source
//! tree), while `--suite path/to/file.toml` still reads a file. A suite is a TOML table under
//! the flags' own names (see the settings module, `measure/settings.rs`), plus two keys only a suite has:
//! `description` (one line) and `run-time` (the run time its author states, in words).

use std::path::Path;

use crate::error::{Error, Result};

/// A suite shipped inside the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinSuite {
    /// The name `--suite` takes: the file's stem (`quick` for `suites/quick.toml`).
    pub name: &'static str,
    /// The command that runs it: `sweep` or `serve`.
    pub command: &'static str,
    /// The file's text, as committed.
    pub text: &'static str,
}

macro_rules! builtin {
    ($name:literal, $command:literal) => {
        BuiltinSuite {
            name: $name,
            command: $command,
            text: include_str!(concat!("../../suites/", $name, ".toml")),
        }
    };
}

/// Every suite in `suites/`, sweep suites first; a test checks the folder holds exactly these.
pub const BUILTIN: &[BuiltinSuite] = &[
    builtin!("quick", "sweep"),
    builtin!("ci", "sweep"),
    builtin!("capacity", "sweep"),
    builtin!("quality", "sweep"),
    builtin!("long-context", "sweep"),
    builtin!("serve", "serve"),
    builtin!("serve-decode", "serve"),
];

impl BuiltinSuite {
    /// The built-in suite called `name`, if any.
    pub fn find(name: &str) -> Option<&'static BuiltinSuite> {
        BUILTIN.iter().find(|s| s.name == name)
    }

    /// Where the text came from, for errors and for `--suite` help: `suites/<name>.toml`.
    pub fn source(&self) -> String {
        format!("suites/{}.toml (built in)", self.name)
    }

    /// A string key of the suite (`description`, `run-time`), or `None` when absent, not a
    /// string, or the text is not TOML (a test checks every built-in parses).
    pub fn key(&self, key: &str) -> Option<String> {
        let table: toml::Table = toml::from_str(self.text).ok()?;
        table.get(key)?.as_str().map(str::to_string)
    }

    /// `name (command): description; run time`, for `--suite`'s help. The description's own
    /// leading `name: ` is dropped (the files start it that way).
    pub fn help_line(&self) -> String {
        let desc = self.key("description").unwrap_or_default();
        let prefix = format!("{}: ", self.name);
        let desc = desc.strip_prefix(&prefix).unwrap_or(&desc);
        let mut line = format!("{} ({}): {desc}", self.name, self.command);
        if let Some(time) = self.key("run-time") {
            line.push_str(&format!(" [{time}]"));
        }
        line
    }
}

/// The built-in names, comma-separated, in [`BUILTIN`]'s order.
pub fn builtin_names() -> String {
    BUILTIN
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--suite`'s long help: what it takes, then one line per built-in suite.
pub fn suite_long_help() -> String {
    let mut help = String::from(
        "Read settings from a suite: a TOML file, or the name of a built-in suite (used when \
         no file of that name exists); flags given here override it. Built-in suites:",
    );
    for s in BUILTIN {
        help.push_str("\n  ");
        help.push_str(&s.help_line());
    }
    help
}

/// Largest suite file read, bytes: suites are a few dozen lines.
pub const MAX_SUITE_BYTES: u64 = 1 << 20;

/// The text of the suite file at `path`, for `sweep --suite` and `serve --suite`. Only a regular
/// file of at most [`MAX_SUITE_BYTES`] is read: a FIFO or a device would block or stream
/// without end (issue #25: a FIFO given as `--suite` hung forever). Errors:
/// [`Error::InvalidArgument`] (`--suite`) naming the path: missing or unreadable, not a regular
/// file, too large, not UTF-8.
pub fn read_suite_file(path: &Path) -> Result<String> {
    let bad = |reason: String| Error::InvalidArgument {
        name: "--suite".into(),
        reason: format!("{}: {reason}", path.display()),
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
    if !meta.is_file() {
        return Err(bad(
            "not a regular file (a FIFO, device or folder); give a suite's .toml file".into(),
        ));
    }
    if meta.len() > MAX_SUITE_BYTES {
        return Err(bad(format!(
            "{} bytes is not a suite (at most {MAX_SUITE_BYTES} bytes)",
            meta.len()
        )));
    }
    std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it ({e})")))
}

/// `--suite`'s short help (`-h`): what it takes and the built-in names.
pub fn suite_short_help() -> String {
    format!(
        "Read settings from a suite: a TOML file or a built-in name ({}); flags given here \
         override it",
        builtin_names()
    )
}

/// The text of the suite `spec` names for `kvbench <command>`, and where it came from (the
/// path, or `suites/<name>.toml (built in)`), for errors. An existing path is read as a file
/// ([`read_suite_file`]: only a regular file, at most [`MAX_SUITE_BYTES`]); otherwise `spec` is looked up among [`BUILTIN`].
///
/// Errors: [`Error::InvalidArgument`] (`--suite`): the file cannot be read (as
/// `read_suite_file`); `spec` is neither a path that exists nor a built-in name (the nearest
/// built-in names first, then all of them); the built-in suite is another command's (naming
/// the command to run it with).
pub fn resolve(spec: &Path, command: &str) -> Result<(String, String)> {
    if std::fs::symlink_metadata(spec).is_ok() {
        let text = read_suite_file(spec)?;
        return Ok((text, spec.display().to_string()));
    }
    let name = spec.to_string_lossy();
    let bad = |reason: String| Error::InvalidArgument {
        name: "--suite".into(),
        reason,
    };
    let Some(suite) = BuiltinSuite::find(&name) else {
        let near = crate::util::nearest::did_you_mean(&name, BUILTIN.iter().map(|s| s.name));
        return Err(bad(format!(
            "`{name}` is neither a suite file nor a built-in suite{near}; the built-in suites \
             are {}",
            builtin_names()
        )));
    };
    if suite.command != command {
        return Err(bad(format!(
            "`{name}` is a built-in `kvbench {}` suite, not a `kvbench {command}` one; run it \
             with `kvbench {} --suite {name}`",
            suite.command, suite.command
        )));
    }
    Ok((suite.text.to_string(), suite.source()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `suites/*.toml` is built in under its stem with the file's exact text, and
    /// nothing else is: adding a suite file without listing it fails here.
    #[test]
    fn builtin_table_matches_the_suites_folder() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut names: Vec<String> = BUILTIN.iter().map(|s| s.name.to_string()).collect();
        names.sort();
        assert_eq!(files, names);
        for s in BUILTIN {
            let on_disk = std::fs::read_to_string(dir.join(format!("{}.toml", s.name))).unwrap();
            assert_eq!(on_disk, s.text, "{}", s.name);
            assert!(
                s.key("description").is_some(),
                "{} has no description",
                s.name
            );
        }
    }

    /// An unknown name is refused with the nearest name first and every built-in listed; a
    /// built-in of the other command names the command to run it with.
    #[test]
    fn unknown_or_foreign_names_are_refused() {
        let e = resolve(Path::new("quik"), "sweep").unwrap_err().to_string();
        assert!(e.contains("did you mean `quick`?"), "{e}");
        assert!(
            e.contains("quick, ci, capacity, quality, long-context, serve, serve-decode"),
            "{e}"
        );
        let e = resolve(Path::new("serve"), "sweep")
            .unwrap_err()
            .to_string();
        assert!(e.contains("kvbench serve --suite serve"), "{e}");
        let e = resolve(Path::new("ci"), "serve").unwrap_err().to_string();
        assert!(e.contains("kvbench sweep --suite ci"), "{e}");
    }

    /// A path that exists wins over a built-in name, and is read as a file.
    #[test]
    fn an_existing_path_wins_over_a_builtin_name() {
        let dir = std::env::temp_dir().join(format!("kvbench-suites-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("quick");
        std::fs::write(&file, "gen = 3\n").unwrap();
        let (text, source) = resolve(&file, "sweep").unwrap();
        assert_eq!(text, "gen = 3\n");
        assert_eq!(source, file.display().to_string());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The help lists each built-in with its description (without the repeated name) and the
    /// run time its file states: quality's "about 30 minutes on a 2-core CPU" from its
    /// `run-time` key; ci states none.
    #[test]
    fn help_lists_descriptions_and_run_times() {
        let help = suite_long_help();
        assert!(
            help.contains(
                "\n  quality (sweep): perplexity, KL, top-1, ROUGE and passkey for every scheme \
                 [about 30 minutes on a 2-core CPU]"
            ),
            "{help}"
        );
        let ci = BuiltinSuite::find("ci").unwrap().help_line();
        assert!(!ci.contains('['), "{ci}");
        assert_eq!(help.lines().count(), 1 + BUILTIN.len());
    }
}
