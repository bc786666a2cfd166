//! Sweep suites: `suites/*.toml` files holding `kvbench sweep` settings under the flags' own
//! names (`batch-sizes = [1, 4]`), the keys of [`SweepSettings`]. Flags given on the command
//! line override the suite; keys the sweep does not know are errors naming the key and the
//! file. The same form, with every value filled in, is kept in `meta.json` as `settings`, which
//! is what `--resume` reads.

use std::path::Path;

use clap::parser::ValueSource;

use crate::error::Result;
use crate::measure::settings::{Settings, SweepSettings};

/// Lays the suite file at `path` over `settings`, except for flags `from_cli` says were given
/// on the command line (by clap id). Errors: [`crate::Error::InvalidArgument`] naming the
/// file: unreadable, not TOML, an unknown key (listing the keys), a value of the wrong form.
pub fn apply(
    settings: &mut SweepSettings,
    path: &Path,
    from_cli: impl Fn(&str) -> bool,
) -> Result<()> {
    let table = SweepSettings::read_suite(path)?;
    *settings = settings.overlay(&table, &format!("--suite {}", path.display()), from_cli)?;
    Ok(())
}

/// Whether the flag with clap id `id` was given on the command line (not defaulted).
pub fn given_on_cli(matches: Option<&clap::ArgMatches>, id: &str) -> bool {
    matches.is_some_and(|m| {
        m.try_get_raw(id).is_ok() && m.value_source(id) == Some(ValueSource::CommandLine)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A suite file's values apply, a flag given on the command line wins, and an unknown key
    /// is an error naming the key and the file.
    #[test]
    fn suite_file_applies_and_names_unknown_keys() {
        let dir = std::env::temp_dir().join(format!("kvbench-suite-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.toml");
        std::fs::write(&p, "gen = 8\nrepeats = 2\nseq-lens = [64]\n").unwrap();
        let mut s = SweepSettings::default();
        apply(&mut s, &p, |id| id == "repeats").unwrap();
        assert_eq!(
            (s.grid.gen, s.timing.repeats, s.grid.seq_lens.clone()),
            (8, 3, vec![64])
        );
        std::fs::write(&p, "gen = 8\nbatch-size = [1]\n").unwrap();
        let msg = apply(&mut s, &p, |_| false).unwrap_err().to_string();
        assert!(
            msg.contains("batch-size") && msg.contains("s.toml"),
            "{msg}"
        );
        assert!(msg.contains("batch-sizes"), "lists the allowed keys: {msg}");
        std::fs::write(&p, "gen = \"eight\"\n").unwrap();
        let msg = apply(&mut s, &p, |_| false).unwrap_err().to_string();
        assert!(msg.contains("gen") && msg.contains("s.toml"), "{msg}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Every sweep suite shipped in suites/ reads (`serve.toml` holds `kvbench serve`'s
    /// settings, read by `serve --suite`).
    #[test]
    fn shipped_suites_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") && !p.ends_with("serve.toml") {
                let mut s = SweepSettings::default();
                apply(&mut s, &p, |_| false).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            }
        }
    }
}
