//! `kvbench completions <shell>`: the shell's completion script on stdout, generated from the
//! same clap definition the binary parses with (clap_complete), so it never lags a flag.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

/// Shells `kvbench completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    /// Bash: `source <(kvbench completions bash)`, or save it under
    /// `~/.local/share/bash-completion/completions/kvbench`.
    Bash,
    /// Zsh: save it as `_kvbench` in a folder on `$fpath`.
    Zsh,
    /// Fish: save it as `~/.config/fish/completions/kvbench.fish`.
    Fish,
}

impl From<CompletionShell> for Shell {
    fn from(s: CompletionShell) -> Self {
        match s {
            CompletionShell::Bash => Shell::Bash,
            CompletionShell::Zsh => Shell::Zsh,
            CompletionShell::Fish => Shell::Fish,
        }
    }
}

/// Arguments of `kvbench completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to write the completion script for.
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

/// The completion script for `shell`, as bytes (UTF-8 text): every subcommand and flag of
/// `kvbench`.
pub fn script(shell: CompletionShell) -> Vec<u8> {
    let mut cmd = super::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(Shell::from(shell), &mut cmd, "kvbench", &mut out);
    out
}

/// Writes the script to stdout. Errors: stdout cannot be written (a full disk, `>&-`).
pub fn run(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script(args.shell))?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each script names subcommands and flags the CLI has (`sweep`, `serve`, `dtypes`,
    /// `suite`), each in its shell's spelling (bash and zsh `--dtypes`, fish `-l dtypes`), and
    /// has its shell's marker: bash's `complete -F`, zsh's `#compdef kvbench`, fish's
    /// `complete -c kvbench`.
    #[test]
    fn scripts_name_subcommands_and_flags() {
        for (shell, marker, long) in [
            (CompletionShell::Bash, "complete -F _kvbench", "--"),
            (CompletionShell::Zsh, "#compdef kvbench", "--"),
            (CompletionShell::Fish, "complete -c kvbench", "-l "),
        ] {
            let text = String::from_utf8(script(shell)).unwrap();
            let dtypes = format!("{long}dtypes");
            let suite = format!("{long}suite");
            for want in [marker, "sweep", "serve", "attn-bench", &dtypes, &suite] {
                assert!(text.contains(want), "{shell:?} script lacks `{want}`");
            }
            assert!(!text.contains("no-such-flag"));
        }
    }
}
