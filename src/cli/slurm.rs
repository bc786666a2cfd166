//! `kvbench slurm`: run a sweep as a Slurm job array, one shard per array task, and merge the
//! shards in a job that starts when every task succeeded (`--dependency=afterok`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::sweep::SweepArgs;
use crate::measure::settings::SweepSettings;

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

    /// Any other `sbatch` option for the shards, verbatim (repeatable), e.g.
    /// `--sbatch-arg=--qos=high`.
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
    /// `#SBATCH` options of the shards (without the leading `--`), e.g. `partition=gpu`.
    pub shard_options: Vec<String>,
    /// `#SBATCH` options of the merge job.
    pub merge_options: Vec<String>,
    /// Job name prefix.
    pub job_name: String,
}

/// Quotes `s` for a POSIX shell (single quotes unless it is plainly safe).
pub fn sh_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=,@%+-".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Writes the array and merge scripts for `job`. Shard folders are `out/shard-<i>`, the merged
/// run `out/merged`, logs `out/slurm/shard-<i>.log` and `out/slurm/merge.log`.
pub fn scripts(job: &JobSpec) -> Scripts {
    let q = |p: &Path| sh_quote(&p.display().to_string());
    let exe = q(&job.exe);
    let out = &job.out;
    let logs = out.join("slurm");
    let threads = job
        .threads
        .map_or(String::new(), |t| format!(" --threads {t}"));
    let mut sweep = String::from("#!/bin/bash\n");
    sweep.push_str(&format!("#SBATCH --job-name={}-sweep\n", job.job_name));
    sweep.push_str(&format!("#SBATCH --array=0-{}\n", job.shards - 1));
    sweep.push_str(&format!(
        "#SBATCH --output={}\n",
        logs.join("shard-%a.log").display()
    ));
    sweep.push_str(&format!("#SBATCH --chdir={}\n", job.workdir.display()));
    for o in &job.shard_options {
        sweep.push_str(&format!("#SBATCH --{o}\n"));
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
    merge.push_str(&format!("#SBATCH --job-name={}-merge\n", job.job_name));
    merge.push_str(&format!(
        "#SBATCH --output={}\n",
        logs.join("merge.log").display()
    ));
    merge.push_str(&format!("#SBATCH --chdir={}\n", job.workdir.display()));
    for o in &job.merge_options {
        merge.push_str(&format!("#SBATCH --{o}\n"));
    }
    merge.push_str(
        "# Written by `kvbench slurm`: joins the shards once every array task succeeded.\n\
         set -euo pipefail\n",
    );
    let dirs: Vec<String> = (0..job.shards)
        .map(|i| q(&out.join(format!("shard-{i}"))))
        .collect();
    merge.push_str(&format!(
        "exec {exe} merge {} --out {}\n",
        dirs.join(" "),
        q(&out.join("merged"))
    ));
    Scripts { sweep, merge }
}

/// The sweep flags given on the command line, re-emitted for the shards (minus `--out`,
/// `--shards`, `--shard`, `--resume`, which `kvbench slurm` sets itself).
fn sweep_flags(matches: &clap::ArgMatches) -> Vec<String> {
    let cmd = <SweepArgs as clap::Args>::augment_args(clap::Command::new("sweep"));
    let mut flags = Vec::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if ["out", "shards", "shard", "resume"].contains(&id)
            || !super::suite::given_on_cli(Some(matches), id)
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
pub fn run(args: SlurmArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    let usage = |name: &str, reason: String| -> anyhow::Error {
        crate::Error::InvalidArgument {
            name: name.into(),
            reason,
        }
        .into()
    };
    let shards = args.sweep.shards.ok_or_else(|| {
        usage(
            "--shards",
            "give the number of shards (array tasks), e.g. --shards 4".into(),
        )
    })?;
    crate::measure::shard::Shard::new(0, shards)?;
    if args.sweep.shard.is_some() || args.sweep.resume.is_some() {
        return Err(usage(
            if args.sweep.shard.is_some() {
                "--shard"
            } else {
                "--resume"
            },
            "kvbench slurm sets each task's shard itself (and resumes a re-run task's folder); \
             drop it"
                .into(),
        ));
    }
    if let Some(suite) = &args.sweep.suite {
        super::suite::apply(&mut SweepSettings::default(), suite, |_| false)?;
    }
    let workdir = std::env::current_dir().context("reading the working directory")?;
    let out = args.sweep.out.clone().unwrap_or_else(|| {
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
            shard_options.push(format!("{k}={v}"));
            merge_options.push(format!("{k}={v}"));
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
            shard_options.push(format!("{k}={v}"));
        }
    }
    shard_options.extend(
        args.sbatch_args
            .iter()
            .map(|a| a.trim_start_matches('-').to_string()),
    );
    let threads = match (args.sweep.settings.device.threads, args.cpus_per_task) {
        (Some(_), _) => None, // given among the sweep flags
        (None, c) => c,
    };
    let job = JobSpec {
        exe,
        workdir,
        out: out.clone(),
        shards,
        sweep_flags: matches.map(sweep_flags).unwrap_or_default(),
        threads,
        shard_options,
        merge_options,
        job_name: args.job_name.clone(),
    };
    let s = scripts(&job);
    let dir = out.join("slurm");
    let (sweep_path, merge_path) = (dir.join("sweep.sbatch"), dir.join("merge.sbatch"));
    let merge_submit = |array_id: &str| -> Vec<String> {
        let mut a = vec![
            "--parsable".to_string(),
            format!("--dependency=afterok:{array_id}"),
            "--kill-on-invalid-dep=yes".to_string(),
        ];
        if args.wait {
            a.push("--wait".into());
        }
        a.push(merge_path.display().to_string());
        a
    };
    if args.dry_run {
        println!("# {}\n{}", sweep_path.display(), s.sweep);
        println!("# {}\n{}", merge_path.display(), s.merge);
        println!("# submit:");
        println!(
            "sbatch --parsable {}",
            sh_quote(&sweep_path.display().to_string())
        );
        println!(
            "sbatch {}",
            merge_submit("<array job id>")
                .iter()
                .map(|a| sh_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        );
        return Ok(());
    }
    let merged_meta = out.join("merged").join(crate::report::META_FILE);
    if merged_meta.exists() {
        return Err(usage(
            "--out",
            format!(
                "{} already holds a merged run; give a new folder",
                out.display()
            ),
        ));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&sweep_path, &s.sweep)
        .with_context(|| format!("writing {}", sweep_path.display()))?;
    std::fs::write(&merge_path, &s.merge)
        .with_context(|| format!("writing {}", merge_path.display()))?;
    let array_id = sbatch(&["--parsable".into(), sweep_path.display().to_string()])?;
    println!(
        "submitted the sweep: array job {array_id} ({shards} tasks, logs in {}/shard-<i>.log)",
        dir.display()
    );
    let merge_args = merge_submit(&array_id);
    if args.wait {
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
    if args.wait {
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

    #[test]
    fn scripts_run_each_shard_and_merge_all() {
        let job = JobSpec {
            exe: "/opt/kvbench".into(),
            workdir: "/home/me".into(),
            out: "/scratch/run 1".into(),
            shards: 3,
            sweep_flags: vec!["--suite".into(), "suites/ci.toml".into()],
            threads: Some(4),
            shard_options: vec!["partition=gpu".into(), "gpus-per-task=1".into()],
            merge_options: vec!["partition=gpu".into()],
            job_name: "kvbench".into(),
        };
        let s = scripts(&job);
        for line in [
            "#SBATCH --array=0-2",
            "#SBATCH --output=/scratch/run 1/slurm/shard-%a.log",
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
                '/scratch/run 1/shard-2' --out '/scratch/run 1/merged'"));
        assert!(!s.merge.contains("gpus-per-task"));
    }
}
