//! `kvbench completions <shell>`: the shell's completion script on stdout, generated from the
//! same clap definition the binary parses with (clap_complete), so it never lags a flag.

use std::io::Write;

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
/// `cmd` (kvbench's whole clap definition, `Cli::command()`, passed in by the caller).
pub fn script(shell: CompletionShell, mut cmd: clap::Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(Shell::from(shell), &mut cmd, "kvbench", &mut out);
    out
}

/// Writes the script for `cmd` to stdout. Errors: stdout cannot be written (a full disk,
/// `>&-`).
pub fn run(args: CompletionsArgs, cmd: clap::Command) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script(args.shell, cmd))?;
    stdout.flush()?;
    Ok(())
}
