//! `kvbench slurm`: run a sweep as a Slurm job array, one shard per array task, and merge the
//! shards in a job that starts when every task succeeded (`--dependency=afterok`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::sweep::SweepArgs;

/// Arguments of `kvbench slurm`: the sweep's own flags plus how to submit it.
#[derive(Debug, Clone, clap::Args)]
pub struct SlurmArgs {
    /// The sweep (every `kvbench sweep` flag; `--shards N` is required, `--out` is the job's
    /// folder: shard-0 … shard-(N-1), merged/, slurm/ with the scripts and logs).
    #[command(flatten)]
    pub sweep: SweepArgs,

    /// Slurm partition (`sbatch --partition`).
    #[arg(long, help_heading = "Slurm")]
    pub partition: Option<String>,

    /// Slurm account (`sbatch --account`).
    #[arg(long, help_heading = "Slurm")]
    pub account: Option<String>,

    /// Time limit per shard (`sbatch --time`, e.g. 2:00:00).
    #[arg(long, help_heading = "Slurm")]
    pub time: Option<String>,

    /// GPUs per shard (`sbatch --gpus-per-task`); pair with `--device cuda`.
    #[arg(long, help_heading = "Slurm")]
    pub gpus_per_task: Option<u32>,

    /// CPUs per shard (`sbatch --cpus-per-task`); also the sweep's `--threads` unless given.
    #[arg(long, help_heading = "Slurm")]
    pub cpus_per_task: Option<u32>,

    /// Memory per shard (`sbatch --mem`, e.g. 16G).
    #[arg(long, help_heading = "Slurm")]
    pub mem: Option<String>,

    /// Any other `sbatch` option for the shards (repeatable), written verbatim on its own
    /// `#SBATCH` line, where sbatch splits it on whitespace as in a script of your own:
    /// `--sbatch-arg=--qos=high`, `--sbatch-arg='-p gpu'`; quote a value with spaces for
    /// sbatch: `--sbatch-arg='--comment="two words"'`.
    #[arg(
        long = "sbatch-arg",
        value_name = "OPTION",
        allow_hyphen_values = true,
        help_heading = "Slurm"
    )]
    pub sbatch_args: Vec<String>,

    /// Job name prefix.
    #[arg(long, default_value = "kvbench", help_heading = "Slurm")]
    pub job_name: String,

    /// Print the two scripts and the sbatch commands; write and submit nothing.
    #[arg(long, help_heading = "Slurm")]
    pub dry_run: bool,

    /// Wait until the merge job ends (`sbatch --wait`); the exit code is 0 only when every
    /// shard and the merge succeeded.
    #[arg(long, help_heading = "Slurm")]
    pub wait: bool,
}

/// The two batch scripts of a sharded sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scripts {
    /// The job array: task `i` runs shard `i/N` (or resumes it when its folder exists).
    pub sweep: String,
    /// The merge job (submitted with `--dependency=afterok:<array job>`).
    pub merge: String,
}

/// What goes into the scripts.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Absolute path of the kvbench binary (on a file system every node sees).
    pub exe: PathBuf,
    /// Working directory of the jobs (absolute).
    pub workdir: PathBuf,
    /// The job's folder (absolute).
    pub out: PathBuf,
    /// Shards.
    pub shards: usize,
    /// The sweep's flags (already split into words; quoted when written).
    pub sweep_flags: Vec<String>,
    /// `--threads` for the shards (resumed ones included), if any.
    pub threads: Option<u32>,
    /// `#SBATCH --<name>=<value>` options of the shards, e.g. `("partition", "gpu")`; each
    /// value reaches sbatch as one argument, whatever it holds ([`sbatch_quote`]).
    pub shard_options: Vec<(String, String)>,
    /// Further options of the shards (`--sbatch-arg`), each written verbatim on its own
    /// `#SBATCH` line (sbatch splits it into words; [`sbatch_words`]).
    pub sbatch_args: Vec<String>,
    /// `#SBATCH --<name>=<value>` options of the merge job.
    pub merge_options: Vec<(String, String)>,
    /// Job name prefix.
    pub job_name: String,
}

/// Whether `s` needs no quoting, for the shell or for sbatch: non-empty and only
/// `[A-Za-z0-9_./:=,@%+-]`.
fn plainly_safe(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=,@%+-".contains(c))
}

/// Quotes `s` for a POSIX shell (single quotes unless it is plainly safe).
pub fn sh_quote(s: &str) -> String {
    if plainly_safe(s) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Most array tasks `kvbench slurm` submits: Slurm's default `MaxArraySize` is 1001 (task
/// ids 0 to 1000), and a larger `--array` is refused at submit time on such a cluster. Where
/// the site raised it, run `kvbench sweep --shards N` inside an array of your own.
pub const MAX_ARRAY_TASKS: usize = 1001;

/// Why [`sbatch_words`] could not read an `#SBATCH` line whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutShort {
    /// A quote (this character) that is never closed: sbatch stops with "Unmatched".
    UnmatchedQuote(char),
    /// An unquoted `#`: sbatch takes the rest of the line as a comment.
    Comment,
    /// A word with no characters (`""`): sbatch ignores it and the rest of the line.
    EmptyWord,
}

/// How sbatch reads an `#SBATCH` line (the text after `#SBATCH`) into words, as
/// `_get_argument` in Slurm's `src/sbatch/opt.c` does: words are separated by whitespace;
/// `'…'` and `"…"` group characters (whitespace included) and are dropped; `\` makes the next
/// character literal, inside quotes too. Errors: [`CutShort`] where sbatch would fail or read
/// less than the whole line.
pub fn sbatch_words(line: &str) -> Result<Vec<String>, CutShort> {
    let mut words = Vec::new();
    // The word being read: None between words; Some("") once a quote opened it.
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut end_word = |word: &mut Option<String>| match word.take() {
        Some(w) if w.is_empty() => Err(CutShort::EmptyWord),
        Some(w) => {
            words.push(w);
            Ok(())
        }
        None => Ok(()),
    };
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') => {
                if let Some(next) = chars.next() {
                    word.get_or_insert_with(String::new).push(next);
                }
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, '#') => return Err(CutShort::Comment),
            (None, c) if c.is_whitespace() => end_word(&mut word)?,
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(q) = quote {
        return Err(CutShort::UnmatchedQuote(q));
    }
    end_word(&mut word)?;
    Ok(words)
}

/// Writes `s` so that sbatch reads it as one word of an `#SBATCH` line ([`sbatch_words`]):
/// as it is when it holds only `[A-Za-z0-9_./:=,@%+-]`, else in double quotes with `\` and `"`
/// escaped by a `\`.
pub fn sbatch_quote(s: &str) -> String {
    if plainly_safe(s) {
        s.to_string()
    } else {
        format!("\"{}\"", s.replace('\\', r"\\").replace('"', "\\\""))
    }
}

/// A usage error for `value` of `flag` when it holds a control character (a newline would end
/// the `#SBATCH` line and run the rest as a command) or is empty.
fn plain_value(flag: &str, value: &str) -> Result<(), crate::Error> {
    let bad = |reason: String| crate::Error::InvalidArgument {
        name: flag.into(),
        reason,
    };
    if value.chars().any(char::is_control) {
        return Err(bad(format!(
            "{value:?} holds a control character (newline, tab, …), which would end or split a \
             line of the batch scripts; give the value on one line without them"
        )));
    }
    if value.trim().is_empty() {
        return Err(bad(format!(
            "{value:?} is empty; give a value or drop {flag}"
        )));
    }
    Ok(())
}

/// A path written into the scripts, as UTF-8 without control characters. Errors:
/// [`crate::Error::InvalidArgument`] naming `flag`.
fn plain_path<'a>(flag: &str, p: &'a Path) -> Result<&'a str, crate::Error> {
    let s = p.to_str().ok_or_else(|| crate::Error::InvalidArgument {
        name: flag.into(),
        reason: format!(
            "{} is not valid UTF-8, which the batch scripts cannot hold; give another folder",
            p.display()
        ),
    })?;
    plain_value(flag, s)?;
    Ok(s)
}

/// `--shards` of `kvbench slurm`: 1 to [`MAX_ARRAY_TASKS`]. Errors:
/// [`crate::Error::InvalidArgument`] naming `--shards` and the largest value accepted.
fn check_shards(shards: usize) -> Result<(), crate::Error> {
    if shards > MAX_ARRAY_TASKS {
        return Err(crate::Error::InvalidArgument {
            name: "--shards".into(),
            reason: format!(
                "{shards} array tasks are more than a Slurm job array holds by default \
                 (MaxArraySize 1001); give at most {MAX_ARRAY_TASKS}"
            ),
        });
    }
    crate::measure::shard::Shard::check_count(shards, "--shards")
}

impl JobSpec {
    /// Checks every value the scripts hold. Errors: [`crate::Error::InvalidArgument`] naming the
    /// flag: `--shards` outside 1 to [`MAX_ARRAY_TASKS`]; a control character (or an empty
    /// value) in `--job-name`, an option's value (`--partition`, `--account`, `--time`, `--mem`,
    /// …), a `--sbatch-arg`, a sweep flag's value, `--out` or the working directory; a `\` in
    /// `--out` (sbatch takes a `\` in `--output` to mean "expand no `%` pattern", so the
    /// per-task logs could not be named); a `--sbatch-arg` that is not an option (`-…`), has an
    /// unmatched quote, or an unquoted `#` (sbatch would drop the rest).
    pub fn check(&self) -> Result<(), crate::Error> {
        check_shards(self.shards)?;
        plain_value("--job-name", &self.job_name)?;
        let out = plain_path("--out", &self.out)?;
        if out.contains('\\') {
            return Err(crate::Error::InvalidArgument {
                name: "--out".into(),
                reason: format!(
                    "{out:?} holds a `\\`: sbatch reads a `\\` in --output as \"expand no % \
                     pattern\", so the per-task logs could not be named; give a folder without \
                     `\\`"
                ),
            });
        }
        plain_path("working directory", &self.workdir)?;
        for (k, v) in self.shard_options.iter().chain(&self.merge_options) {
            plain_value(&format!("--{k}"), v)?;
        }
        for a in &self.sbatch_args {
            plain_value("--sbatch-arg", a)?;
            let bad = |reason: String| crate::Error::InvalidArgument {
                name: "--sbatch-arg".into(),
                reason,
            };
            match sbatch_words(a) {
                Err(CutShort::Comment) => {
                    return Err(bad(format!(
                        "{a:?}: sbatch takes an unquoted `#` as the start of a comment and \
                         would drop the rest; quote it: --sbatch-arg='--comment=\"a#b\"'"
                    )))
                }
                Err(CutShort::UnmatchedQuote(q)) => {
                    return Err(bad(format!(
                        "{a:?} has an unmatched {q}; close it, or escape it as \\{q}"
                    )))
                }
                Err(CutShort::EmptyWord) => {
                    return Err(bad(format!(
                        "{a:?} holds an empty quoted word, at which sbatch stops reading the \
                         line; drop it"
                    )))
                }
                Ok(words) if words.first().is_none_or(|w| !w.starts_with('-')) => {
                    return Err(bad(format!(
                        "{a:?} is not an sbatch option; give one such as --qos=high or '-p gpu'"
                    )))
                }
                Ok(_) => {}
            }
        }
        let mut flag = "sweep flag";
        for w in &self.sweep_flags {
            if w.starts_with("--") {
                flag = w;
            }
            if w.chars().any(char::is_control) {
                plain_value(flag, w)?;
            }
        }
        Ok(())
    }
}

/// Writes the array and merge scripts for `job`. Shard folders are `out/shard-<i>`, the merged
/// run `out/merged`, logs `out/slurm/shard-<i>.log` and `out/slurm/merge.log`.
///
/// `#SBATCH` values are written as sbatch reads them ([`sbatch_quote`]); a `%` of `out` is
/// written `%%` in `--output` (sbatch's filename patterns: `%%` is a literal `%`, `%a` the
/// array task id), so the logs land in `out` itself. The shell lines quote every value for
/// bash ([`sh_quote`]). Errors: those of [`JobSpec::check`], before anything is written.
pub fn scripts(job: &JobSpec) -> Result<Scripts, crate::Error> {
    job.check()?;
    let q = |p: &Path| sh_quote(&p.display().to_string());
    let exe = q(&job.exe);
    let out = &job.out;
    let logs = out.join("slurm");
    let log = |name: &str| {
        let dir = logs.display().to_string().replace('%', "%%");
        sbatch_quote(&format!("{dir}/{name}"))
    };
    let chdir = sbatch_quote(&job.workdir.display().to_string());
    let option = |(k, v): &(String, String)| format!("#SBATCH --{k}={}\n", sbatch_quote(v));
    let threads = job
        .threads
        .map_or(String::new(), |t| format!(" --threads {t}"));
    let mut sweep = String::from("#!/bin/bash\n");
    sweep.push_str(&format!(
        "#SBATCH --job-name={}\n",
        sbatch_quote(&format!("{}-sweep", job.job_name))
    ));
    sweep.push_str(&format!("#SBATCH --array=0-{}\n", job.shards - 1));
    sweep.push_str(&format!("#SBATCH --output={}\n", log("shard-%a.log")));
    sweep.push_str(&format!("#SBATCH --chdir={chdir}\n"));
    for o in &job.shard_options {
        sweep.push_str(&option(o));
    }
    for a in &job.sbatch_args {
        sweep.push_str(&format!("#SBATCH {a}\n"));
    }
    sweep.push_str(&format!(
        "# Written by `kvbench slurm`: array task i runs shard i/{n} of the sweep into \
         shard-i/;\n# a task that is run again (requeued, or resubmitted with --array=i) \
         resumes its folder.\nset -euo pipefail\n",
        n = job.shards
    ));
    sweep.push_str(&format!("dir={}/shard-\"$SLURM_ARRAY_TASK_ID\"\n", q(out)));
    sweep.push_str(&format!(
        "if [ -s \"$dir/meta.json\" ]; then\n    exec {exe} sweep --resume \"$dir\"{threads}\nfi\n"
    ));
    let mut words = vec![exe.clone(), "sweep".to_string()];
    words.extend(job.sweep_flags.iter().map(|f| sh_quote(f)));
    if let Some(t) = job.threads {
        words.push(format!("--threads {t}"));
    }
    words.push(format!(
        "--shard \"$SLURM_ARRAY_TASK_ID/{}\" --out \"$dir\"",
        job.shards
    ));
    sweep.push_str(&format!("exec {}\n", words.join(" ")));
    let mut merge = String::from("#!/bin/bash\n");
    merge.push_str(&format!(
        "#SBATCH --job-name={}\n",
        sbatch_quote(&format!("{}-merge", job.job_name))
    ));
    merge.push_str(&format!("#SBATCH --output={}\n", log("merge.log")));
    merge.push_str(&format!("#SBATCH --chdir={chdir}\n"));
    for o in &job.merge_options {
        merge.push_str(&option(o));
    }
    merge.push_str(
        "# Written by `kvbench slurm`: joins the shards once every array task succeeded.\n\
         set -euo pipefail\n",
    );
    let dirs: Vec<String> = (0..job.shards)
        .map(|i| q(&out.join(format!("shard-{i}"))))
        .collect();
    // --force: a merge job that Slurm requeues after it wrote merged/ moves that aside instead of
    // failing on a folder that already holds a run.
    merge.push_str(&format!(
        "exec {exe} merge {} --out {} --force\n",
        dirs.join(" "),
        q(&out.join("merged"))
    ));
    Ok(Scripts { sweep, merge })
}

/// The sweep flags given on the command line, re-emitted for the shards (minus `--out`,
/// `--shards`, `--shard`, `--resume`, which `kvbench slurm` sets itself).
fn sweep_flags(matches: &clap::ArgMatches) -> Vec<String> {
    let cmd = <SweepArgs as clap::Args>::augment_args(clap::Command::new("sweep"));
    let mut flags = Vec::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if ["out", "shards", "shard", "resume"].contains(&id)
            || !super::given(Some(matches)).iter().any(|g| g == id)
        {
            continue;
        }
        let Some(long) = arg.get_long() else { continue };
        if !arg.get_action().takes_values() {
            flags.push(format!("--{long}"));
            continue;
        }
        let values: Vec<String> = matches
            .get_raw(id)
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let joined = match arg.get_value_delimiter() {
            Some(d) => vec![values.join(&d.to_string())],
            None => values,
        };
        for v in joined {
            flags.push(format!("--{long}"));
            flags.push(v);
        }
    }
    flags
}

/// Writes the scripts under `<out>/slurm/` and submits them (or prints them with `--dry-run`).
/// Errors: those of `checked_shards`, `job_spec` and [`scripts`], before anything is written,
/// then those of `submit`.
pub fn run(args: SlurmArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    let shards = checked_shards(&args, matches)?;
    let job = job_spec(&args, matches, shards)?;
    let s = scripts(&job)?;
    let dir = job.out.join("slurm");
    let (sweep_path, merge_path) = (dir.join("sweep.sbatch"), dir.join("merge.sbatch"));
    if args.dry_run {
        print_dry_run(&s, &sweep_path, &merge_path, args.wait);
        return Ok(());
    }
    submit(&s, &job.out, shards, &sweep_path, &merge_path, args.wait)
}

/// A usage error (exit code 2) naming `name`.
fn usage_error(name: &str, reason: String) -> anyhow::Error {
    crate::Error::InvalidArgument {
        name: name.into(),
        reason,
    }
    .into()
}

/// The number of shards, once the flags are known to make a job every task can run: `--shards`
/// given and in range ([`check_shards`]), neither `--shard` nor `--resume` given (each task
/// sets its own), the sweep's settings valid as every task's sweep would check them (the suite
/// applied), and `--cpus-per-task` not 0. Errors: usage errors naming the flag, and the
/// settings' own.
fn checked_shards(args: &SlurmArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<usize> {
    let shards = args.sweep.shard.shards.ok_or_else(|| {
        usage_error(
            "--shards",
            "give the number of shards (array tasks), e.g. --shards 4".into(),
        )
    })?;
    check_shards(shards)?;
    if args.sweep.shard.shard.is_some() || args.sweep.run.resume.is_some() {
        return Err(usage_error(
            if args.sweep.shard.shard.is_some() {
                "--shard"
            } else {
                "--resume"
            },
            "kvbench slurm sets each task's shard itself (and resumes a re-run task's folder); \
             drop it"
                .into(),
        ));
    }
    // Every task's sweep checks its settings before it starts; check them once here, before
    // anything is written or submitted (the suite applied as the sweep applies it).
    let mut check = args.sweep.clone();
    crate::app::resolve_settings(&mut check.settings, &mut check.run, matches)?;
    crate::measure::plan::SweepPlan::check(&check.settings)?;
    if args.cpus_per_task == Some(0) {
        return Err(usage_error(
            "--cpus-per-task",
            "0 CPUs cannot run a shard (it would be each sweep's --threads 0); give 1 or more"
                .into(),
        ));
    }
    Ok(shards)
}

/// What the scripts of a `shards`-task job hold: the working directory, the job's folder
/// (`--out`, else `reports/slurm-<time>`, made absolute against the working directory), this
/// kvbench binary, the sweep flags given, and the Slurm options (partition and account for
/// both jobs; time, GPUs, CPUs and memory for the shards). `--cpus-per-task` becomes the
/// shards' `--threads` unless the sweep flags give it. Errors: reading the working directory
/// or locating the binary.
fn job_spec(
    args: &SlurmArgs,
    matches: Option<&clap::ArgMatches>,
    shards: usize,
) -> anyhow::Result<JobSpec> {
    let workdir = std::env::current_dir().context("reading the working directory")?;
    let out = args.sweep.run.out.clone().unwrap_or_else(|| {
        let t = crate::util::time::now_compact();
        PathBuf::from("reports").join(format!("slurm-{t}"))
    });
    let out = if out.is_absolute() {
        out
    } else {
        workdir.join(out)
    };
    let exe = std::env::current_exe().context("locating the kvbench binary")?;
    let mut shard_options = Vec::new();
    let mut merge_options = Vec::new();
    for (k, v) in [
        ("partition", args.partition.clone()),
        ("account", args.account.clone()),
    ] {
        if let Some(v) = v {
            shard_options.push((k.to_string(), v.clone()));
            merge_options.push((k.to_string(), v));
        }
    }
    let extra = [
        ("time", args.time.clone()),
        ("gpus-per-task", args.gpus_per_task.map(|g| g.to_string())),
        ("cpus-per-task", args.cpus_per_task.map(|c| c.to_string())),
        ("mem", args.mem.clone()),
    ];
    for (k, v) in extra {
        if let Some(v) = v {
            shard_options.push((k.to_string(), v));
        }
    }
    let threads = match (args.sweep.settings.threads.threads, args.cpus_per_task) {
        (Some(_), _) => None, // given among the sweep flags
        (None, c) => c,
    };
    Ok(JobSpec {
        exe,
        workdir,
        out,
        shards,
        sweep_flags: matches.map(sweep_flags).unwrap_or_default(),
        threads,
        shard_options,
        sbatch_args: args.sbatch_args.clone(),
        merge_options,
        job_name: args.job_name.clone(),
    })
}

/// `sbatch`'s arguments for the merge job at `merge_path`, to start once every task of array
/// job `array_id` succeeded (`--wait` too when `wait`).
fn merge_submit_args(array_id: &str, wait: bool, merge_path: &Path) -> Vec<String> {
    let mut a = vec![
        "--parsable".to_string(),
        format!("--dependency=afterok:{array_id}"),
        "--kill-on-invalid-dep=yes".to_string(),
    ];
    if wait {
        a.push("--wait".into());
    }
    a.push(merge_path.display().to_string());
    a
}

/// `--dry-run`: prints both scripts, each under its path, and the two sbatch commands that
/// would submit them.
fn print_dry_run(s: &Scripts, sweep_path: &Path, merge_path: &Path, wait: bool) {
    println!("# {}\n{}", sweep_path.display(), s.sweep);
    println!("# {}\n{}", merge_path.display(), s.merge);
    println!("# submit:");
    println!(
        "sbatch --parsable {}",
        sh_quote(&sweep_path.display().to_string())
    );
    println!(
        "sbatch {}",
        merge_submit_args("<array job id>", wait, merge_path)
            .iter()
            .map(|a| sh_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// Writes the scripts to `sweep_path` and `merge_path` (in `<out>/slurm/`) and submits the
/// `shards`-task array, then the merge job after it; with `wait`, waits for the merge job and
/// checks that it wrote `<out>/merged`. Errors: a usage error naming `--out` when it already
/// holds a merged run; writing the scripts; [`sbatch`]'s; with `wait`, a merge job that did not
/// run (what to resubmit is named).
fn submit(
    s: &Scripts,
    out: &Path,
    shards: usize,
    sweep_path: &Path,
    merge_path: &Path,
    wait: bool,
) -> anyhow::Result<()> {
    let dir = out.join("slurm");
    let merged_meta = out.join("merged").join(crate::report::META_FILE);
    if merged_meta.exists() {
        return Err(usage_error(
            "--out",
            format!(
                "{} already holds a merged run; give a new folder",
                out.display()
            ),
        ));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(sweep_path, &s.sweep)
        .with_context(|| format!("writing {}", sweep_path.display()))?;
    std::fs::write(merge_path, &s.merge)
        .with_context(|| format!("writing {}", merge_path.display()))?;
    let array_id = sbatch(&["--parsable".into(), sweep_path.display().to_string()])?;
    println!(
        "submitted the sweep: array job {array_id} ({shards} tasks, logs in {}/shard-<i>.log)",
        dir.display()
    );
    let merge_args = merge_submit_args(&array_id, wait, merge_path);
    if wait {
        println!(
            "submitting the merge job (afterok:{array_id}) and waiting for it; merged run: {}",
            out.join("merged").display()
        );
    }
    let merge_id = sbatch(&merge_args)?;
    println!(
        "merge job {merge_id} (after every task of {array_id} succeeded) writes {}",
        out.join("merged").display()
    );
    if wait {
        // sbatch --wait exits 0 when the merge job was cancelled because a task failed (its
        // dependency can never be met), so the merged folder is the proof of success.
        if !merged_meta.exists() {
            anyhow::bail!(
                "the merge job did not run: a shard failed or was cancelled (logs: \
                 {}/shard-<i>.log); resubmit the failed tasks with `sbatch --array=<i> {}` \
                 (they resume their folders), then `sbatch {}`",
                dir.display(),
                sweep_path.display(),
                merge_path.display()
            );
        }
        println!("merged run: {}", out.join("merged").display());
    }
    Ok(())
}

/// Runs `sbatch args…` and returns the job id it prints (`--parsable`: `id[;cluster]`).
/// Errors: sbatch missing, or failing (its stderr quoted; with `--wait` this is the job's
/// failure).
fn sbatch(args: &[String]) -> anyhow::Result<String> {
    let out = Command::new("sbatch")
        .args(args)
        .output()
        .with_context(|| {
            "running sbatch (is this a Slurm login node? `kvbench slurm --dry-run` prints the \
         scripts instead)"
                .to_string()
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let id = stdout
        .lines()
        .next()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    if !out.status.success() {
        anyhow::bail!(
            "sbatch {} failed ({}){}: {}",
            args.join(" "),
            out.status,
            if id.is_empty() {
                String::new()
            } else {
                format!(" for job {id}")
            },
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if id.is_empty() {
        anyhow::bail!("sbatch printed no job id: {stdout}");
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("suites/ci.toml"), "suites/ci.toml");
        assert_eq!(sh_quote("fp16,int4"), "fp16,int4");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("h2o:ratio=0.2@q4_0"), "h2o:ratio=0.2@q4_0");
        assert_eq!(sh_quote("$HOME;rm"), "'$HOME;rm'");
    }

    /// A job of 3 shards with plain values, for tests to change one field of.
    fn job() -> JobSpec {
        JobSpec {
            exe: "/opt/kvbench".into(),
            workdir: "/home/me".into(),
            out: "/scratch/run".into(),
            shards: 3,
            sweep_flags: vec!["--suite".into(), "suites/ci.toml".into()],
            threads: None,
            shard_options: vec![("partition".into(), "gpu".into())],
            sbatch_args: Vec::new(),
            merge_options: vec![("partition".into(), "gpu".into())],
            job_name: "kvbench".into(),
        }
    }

    /// The (flag, reason) of a usage error.
    fn usage(e: crate::Error) -> (String, String) {
        match e {
            crate::Error::InvalidArgument { name, reason } => (name, reason),
            other => panic!("not a usage error: {other}"),
        }
    }

    /// The words sbatch reads from a script's directives (`#SBATCH` lines up to the first line
    /// that is neither blank nor a comment, as `_opt_batch_script` in Slurm's src/sbatch/opt.c),
    /// the number of `#SBATCH` lines read so, and the number in the whole script.
    fn directives(script: &str) -> (Vec<String>, usize, usize) {
        let (mut words, mut read) = (Vec::new(), 0);
        for line in script.lines() {
            if let Some(rest) = line.strip_prefix("#SBATCH") {
                words.extend(sbatch_words(rest).unwrap());
                read += 1;
            } else if !(line.trim().is_empty() || line.trim_start().starts_with('#')) {
                break;
            }
        }
        let all = script.lines().filter(|l| l.starts_with("#SBATCH")).count();
        (words, read, all)
    }

    /// Slurm's reading of `#SBATCH` lines, cases worked out by hand from `_get_argument`.
    #[test]
    fn sbatch_words_read_lines_as_sbatch_does() {
        let ok =
            |line: &str, want: &[&str]| assert_eq!(sbatch_words(line).unwrap(), want, "{line}");
        ok(" --a=b  c", &["--a=b", "c"]);
        ok(r#" --p="a b""#, &["--p=a b"]);
        ok(r#" 'a"b' "c'd""#, &["a\"b", "c'd"]);
        ok(r#" a\ b "x\"y" "\\""#, &["a b", "x\"y", "\\"]);
        ok(r#" "a#b""#, &["a#b"]);
        ok("", &[]);
        assert_eq!(sbatch_words(" --qos=high # note"), Err(CutShort::Comment));
        assert_eq!(sbatch_words(r#" "abc"#), Err(CutShort::UnmatchedQuote('"')));
        assert_eq!(sbatch_words(r#" -p "" x"#), Err(CutShort::EmptyWord));
        // What sbatch_quote writes, by hand, and that sbatch reads each back as one word.
        assert_eq!(sbatch_quote("gpu"), "gpu");
        assert_eq!(sbatch_quote("2:00:00"), "2:00:00");
        assert_eq!(sbatch_quote("gpu a"), r#""gpu a""#);
        assert_eq!(sbatch_quote(r#"a"b\c"#), r#""a\"b\\c""#);
        for v in [
            "gpu a",
            r#"a"b\c"#,
            "x#y",
            "it's",
            "50%",
            "$HOME",
            "a  b\u{e9}",
        ] {
            assert_eq!(sbatch_words(&sbatch_quote(v)).unwrap(), [v], "{v}");
        }
    }

    /// Issue 25, defect 1: a newline in `--partition` ended the `#SBATCH` line and ran the next
    /// as a command. Every value the scripts hold is refused with a control character, naming
    /// its flag and showing the value escaped.
    #[test]
    fn slurm_newline_in_partition_is_refused() {
        let mut j = job();
        j.shard_options = vec![("partition".into(), "gpu\ntouch /tmp/x".into())];
        let (name, reason) = usage(scripts(&j).unwrap_err());
        assert_eq!(name, "--partition");
        assert!(reason.contains(r#""gpu\ntouch /tmp/x""#), "{reason}");
        type Edit = Box<dyn Fn(&mut JobSpec)>;
        let cases: Vec<(&str, Edit)> = vec![
            (
                "--account",
                Box::new(|j| j.shard_options = vec![("account".into(), "a\rb".into())]),
            ),
            (
                "--time",
                Box::new(|j| j.shard_options = vec![("time".into(), "1:00\n".into())]),
            ),
            (
                "--mem",
                Box::new(|j| j.shard_options = vec![("mem".into(), "16G\t".into())]),
            ),
            (
                "--partition",
                Box::new(|j| j.merge_options = vec![("partition".into(), "\0".into())]),
            ),
            (
                "--job-name",
                Box::new(|j| j.job_name = "kv\nrm -rf ~".into()),
            ),
            (
                "--sbatch-arg",
                Box::new(|j| j.sbatch_args = vec!["--qos=high\ntouch x".into()]),
            ),
            ("--out", Box::new(|j| j.out = "/scratch/a\nb".into())),
            (
                "working directory",
                Box::new(|j| j.workdir = "/home/a\nb".into()),
            ),
            (
                "--model",
                Box::new(|j| j.sweep_flags = vec!["--model".into(), "m\nx".into()]),
            ),
        ];
        for (flag, set) in cases {
            let mut j = job();
            set(&mut j);
            let (name, reason) = usage(scripts(&j).unwrap_err());
            assert_eq!(name, flag, "{reason}");
            assert!(reason.contains("control character"), "{flag}: {reason}");
        }
    }

    /// Issue 25, defect 1: `--sbatch-arg='-p gpu'` was written `#SBATCH --p gpu` and an empty
    /// one `#SBATCH --`. It is written verbatim; what sbatch would misread is refused.
    #[test]
    fn slurm_sbatch_arg_is_written_verbatim() {
        let mut j = job();
        j.sbatch_args = vec![
            "-p gpu".into(),
            "--qos=high".into(),
            r#"--comment="a b""#.into(),
        ];
        let s = scripts(&j).unwrap();
        for line in [
            "#SBATCH -p gpu",
            "#SBATCH --qos=high",
            r#"#SBATCH --comment="a b""#,
        ] {
            assert!(s.sweep.lines().any(|l| l == line), "{line}\n{}", s.sweep);
        }
        assert!(!s.sweep.contains("#SBATCH --p "), "{}", s.sweep);
        assert!(!s.merge.contains("qos"), "{}", s.merge);
        for bad in [
            "",
            "  ",
            "gpu",
            "--comment=a#b",
            r#"--comment="a"#,
            r#"-p "" gpu"#,
            "\\",
        ] {
            let mut j = job();
            j.sbatch_args = vec![bad.into()];
            let (name, reason) = usage(scripts(&j).unwrap_err());
            assert_eq!(name, "--sbatch-arg", "{bad:?}: {reason}");
            assert!(reason.contains(&format!("{bad:?}")), "{bad:?}: {reason}");
        }
    }

    /// Issue 25, defect 1: values with spaces or `%` went unquoted into `#SBATCH` lines. Each
    /// is one sbatch word; a `%` of `--out` is `%%` in `--output` (a literal `%` in Slurm's
    /// filename patterns), and a `\` (which turns the patterns off) is refused.
    #[test]
    fn slurm_values_with_spaces_and_percent_are_quoted_for_sbatch() {
        let mut j = job();
        j.out = "/scratch/run 1%x".into();
        j.workdir = "/home/me too".into();
        j.job_name = "my job".into();
        j.shard_options = vec![("partition".into(), "gpu a".into())];
        let s = scripts(&j).unwrap();
        for line in [
            r#"#SBATCH --job-name="my job-sweep""#,
            r#"#SBATCH --output="/scratch/run 1%%x/slurm/shard-%a.log""#,
            r#"#SBATCH --chdir="/home/me too""#,
            r#"#SBATCH --partition="gpu a""#,
        ] {
            assert!(s.sweep.lines().any(|l| l == line), "{line}\n{}", s.sweep);
        }
        assert!(
            s.merge
                .lines()
                .any(|l| l == r#"#SBATCH --output="/scratch/run 1%%x/slurm/merge.log""#),
            "{}",
            s.merge
        );
        let mut j = job();
        j.out = r"/scratch/a\b".into();
        let (name, reason) = usage(scripts(&j).unwrap_err());
        assert_eq!(name, "--out", "{reason}");
    }

    /// Issue 25, defect 4: `--shards 10^12` aborted on a multi-TB allocation. Slurm's default
    /// MaxArraySize (1001 tasks) bounds it; 0 is refused without suggesting `--shard I/0`.
    #[test]
    fn slurm_shards_above_max_array_size_are_refused() {
        let mut j = job();
        for n in [1002, 1_000_000_000_000] {
            j.shards = n;
            let (name, reason) = usage(scripts(&j).unwrap_err());
            assert_eq!(name, "--shards");
            assert!(reason.contains("give at most 1001"), "{reason}");
        }
        j.shards = 0;
        let (name, reason) = usage(scripts(&j).unwrap_err());
        assert_eq!(name, "--shards");
        assert!(
            !reason.contains("I/0") && reason.contains("1 or more"),
            "{reason}"
        );
        j.shards = 1001;
        let s = scripts(&j).unwrap();
        assert!(s.sweep.lines().any(|l| l == "#SBATCH --array=0-1000"));
    }

    /// Issue 25, defect 1: the generated scripts, run with bash and a stub kvbench that records
    /// its arguments, pass every value verbatim (spaces, quotes, `%`, `$`, backquotes), resume a
    /// task's folder, merge every shard, and run no injected command; sbatch reads every
    /// `#SBATCH` line, each value as one word.
    #[test]
    fn slurm_scripts_run_with_a_stub_kvbench() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("kvbench-slurm-stub-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let bin = d.join("bin dir");
        std::fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("kv'bench");
        std::fs::write(
            &exe,
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > \"$STUB_ARGV\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = d.display().to_string();
        let out = format!("{root}/out 1 $HOME %a 'q' \"dq\"");
        let injected = format!("{root}/injected");
        let model = format!("my model's `touch {injected}` $(touch {injected}) %a \"q\" $HOME");
        let seq = format!("1; touch {injected}");
        let j = JobSpec {
            exe: exe.clone(),
            workdir: d.join("work dir"),
            out: out.clone().into(),
            shards: 3,
            sweep_flags: vec![
                "--model".into(),
                model.clone(),
                "--dtypes".into(),
                "fp16,int4".into(),
                "--seq-lens".into(),
                seq.clone(),
            ],
            threads: Some(4),
            shard_options: vec![
                ("partition".into(), "gpu a".into()),
                ("time".into(), "1:00:00".into()),
            ],
            sbatch_args: vec!["-p gpu".into(), r#"--comment="two words""#.into()],
            merge_options: vec![("partition".into(), "gpu a".into())],
            job_name: "my job".into(),
        };
        let s = scripts(&j).unwrap();
        let run = |script: &str, name: &str| -> Vec<String> {
            let path = d.join(format!("{name}.sbatch"));
            std::fs::write(&path, script).unwrap();
            let argv = d.join(format!("{name}.argv"));
            let st = Command::new("bash")
                .arg(&path)
                .env("SLURM_ARRAY_TASK_ID", "1")
                .env("STUB_ARGV", &argv)
                .status()
                .unwrap();
            assert!(st.success(), "{name}: {st}\n{script}");
            let text = std::fs::read_to_string(&argv).unwrap();
            text.lines().map(str::to_string).collect()
        };
        let shard1 = format!("{out}/shard-1");
        let want: Vec<String> = [
            "sweep",
            "--model",
            &model,
            "--dtypes",
            "fp16,int4",
            "--seq-lens",
            &seq,
            "--threads",
            "4",
            "--shard",
            "1/3",
            "--out",
            &shard1,
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        assert_eq!(run(&s.sweep, "sweep"), want);
        // A task run again resumes its folder.
        std::fs::create_dir_all(&shard1).unwrap();
        std::fs::write(format!("{shard1}/meta.json"), "{}").unwrap();
        assert_eq!(
            run(&s.sweep, "sweep-again"),
            ["sweep", "--resume", &shard1, "--threads", "4"]
        );
        let merged = format!("{out}/merged");
        let (s0, s2) = (format!("{out}/shard-0"), format!("{out}/shard-2"));
        assert_eq!(
            run(&s.merge, "merge"),
            ["merge", &s0, &shard1, &s2, "--out", &merged, "--force"]
        );
        assert!(!Path::new(&injected).exists(), "an injected command ran");
        // What sbatch reads: every #SBATCH line, before the first command.
        let (words, read, all) = directives(&s.sweep);
        let want = [
            "--job-name=my job-sweep".to_string(),
            "--array=0-2".into(),
            format!("--output={root}/out 1 $HOME %%a 'q' \"dq\"/slurm/shard-%a.log"),
            format!("--chdir={root}/work dir"),
            "--partition=gpu a".into(),
            "--time=1:00:00".into(),
            "-p".into(),
            "gpu".into(),
            "--comment=two words".into(),
        ];
        assert_eq!(words, want);
        assert_eq!((read, all), (8, 8));
        let (words, read, all) = directives(&s.merge);
        let want = [
            "--job-name=my job-merge".to_string(),
            format!("--output={root}/out 1 $HOME %%a 'q' \"dq\"/slurm/merge.log"),
            format!("--chdir={root}/work dir"),
            "--partition=gpu a".into(),
        ];
        assert_eq!(words, want);
        assert_eq!((read, all), (4, 4));
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn scripts_run_each_shard_and_merge_all() {
        let job = JobSpec {
            exe: "/opt/kvbench".into(),
            workdir: "/home/me".into(),
            out: "/scratch/run 1".into(),
            shards: 3,
            sweep_flags: vec!["--suite".into(), "suites/ci.toml".into()],
            threads: Some(4),
            shard_options: vec![
                ("partition".into(), "gpu".into()),
                ("gpus-per-task".into(), "1".into()),
            ],
            sbatch_args: Vec::new(),
            merge_options: vec![("partition".into(), "gpu".into())],
            job_name: "kvbench".into(),
        };
        let s = scripts(&job).unwrap();
        for line in [
            "#SBATCH --array=0-2",
            "#SBATCH --output=\"/scratch/run 1/slurm/shard-%a.log\"",
            "#SBATCH --partition=gpu",
            "#SBATCH --gpus-per-task=1",
            "dir='/scratch/run 1'/shard-\"$SLURM_ARRAY_TASK_ID\"",
            "    exec /opt/kvbench sweep --resume \"$dir\" --threads 4",
            "exec /opt/kvbench sweep --suite suites/ci.toml --threads 4 --shard \
             \"$SLURM_ARRAY_TASK_ID/3\" --out \"$dir\"",
        ] {
            assert!(s.sweep.lines().any(|l| l == line), "{line}\n{}", s.sweep);
        }
        assert!(s.merge.lines().any(|l| l
            == "exec /opt/kvbench merge '/scratch/run 1/shard-0' '/scratch/run 1/shard-1' \
                '/scratch/run 1/shard-2' --out '/scratch/run 1/merged' --force"));
        assert!(!s.merge.contains("gpus-per-task"));
    }
}
