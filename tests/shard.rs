//! Sharded sweeps and `kvbench merge` through the binary: the shards of a sweep merge into the
//! rows one machine writes (quality columns bit for bit), a killed shard resumes and then
//! merges, and mixed, duplicated or missing shards are refused with exit 2 naming the field.

use std::path::{Path, PathBuf};

mod common;
use common::kvbench;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-shard-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `results.csv` as (header, rows).
fn csv_rows(dir: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(dir.join("results.csv")).unwrap();
    let h = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r
        .records()
        .map(|rec| rec.unwrap().iter().map(String::from).collect())
        .collect();
    (h, rows)
}

/// Columns of `dir`'s results.csv named in `cols`, per row (row order kept).
fn columns(dir: &Path, cols: &[&str]) -> Vec<Vec<String>> {
    let (h, rows) = csv_rows(dir);
    let idx: Vec<usize> = cols
        .iter()
        .map(|c| {
            h.iter()
                .position(|x| x == c)
                .unwrap_or_else(|| panic!("{c}"))
        })
        .collect();
    rows.iter()
        .map(|r| idx.iter().map(|&i| r[i].clone()).collect())
        .collect()
}

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap()
}

const KEY: &[&str] = &["scheme", "batch_size", "seq_len", "status"];
const BYTES: &[&str] = &[
    "kv_tokens",
    "kv_bytes",
    "kv_bytes_predicted",
    "kv_ratio_vs_fp16",
    "kv_reserved_bytes",
];
const QUALITY: &[&str] = &[
    "ppl",
    "ppl_delta_pct",
    "ppl_mean_nll",
    "kl_mean",
    "kl_p99",
    "kl_q1",
    "kl_q4",
    "top1_agree_pct",
    "mean_abs_dp_top",
    "rouge_samples",
    "rouge1_f1",
    "rouge_l_f1",
    "rouge_l_vs_fp16",
    "passkey_trials",
    "passkey_accuracy_pct",
    // The paired statistics (issue #15) survive the merge.
    "ppl_se",
    "delta_ppl_pct_lo",
    "delta_ppl_pct_hi",
    "ci_method",
    "kl_p99_9",
    "kl_max",
    "same_top_p_se",
    "ppl_mode",
];

const SYNTH: &[&str] = &[
    "sweep",
    "--synthetic",
    "--model",
    "smollm2-135m",
    "--dtypes",
    "fp16,int8-token,int4,window:size=16",
    "--batch-sizes",
    "1,2",
    "--seq-lens",
    "24,40",
    "--gen",
    "3",
];

fn synth(out: &Path, extra: &[&str]) -> (i32, String) {
    let mut a: Vec<&str> = SYNTH.to_vec();
    a.extend_from_slice(extra);
    a.extend_from_slice(&["--out", s(out)]);
    let (code, _, err) = kvbench(&a);
    (code, err)
}

/// Shards of a synthetic sweep (no weights) merge into the single run's rows: every point once,
/// in the single run's order, with the same bytes; the shards' split covers every point once.
#[test]
fn merge_of_synthetic_shards_equals_single_run() {
    let d = tmp("synth");
    let one = d.join("one");
    let (code, err) = synth(&one, &[]);
    assert_eq!(code, 0, "{err}");
    let mut dirs = Vec::new();
    let mut total = 0;
    for i in 0..3 {
        let dir = d.join(format!("shard-{i}"));
        let (code, err) = synth(&dir, &["--shard", &format!("{i}/3")]);
        assert_eq!(code, 0, "{err}");
        let m = meta(&dir);
        assert_eq!(m["shard"]["index"], i);
        assert_eq!(m["shard"]["count"], 3);
        assert!(!m["shard"]["host"].as_str().unwrap().is_empty());
        total += csv_rows(&dir).1.len();
        dirs.push(dir);
    }
    assert_eq!(
        total, 16,
        "4 schemes × 2 batches × 2 lengths, each in one shard"
    );
    let merged = d.join("merged");
    let mut a = vec!["merge"];
    // Any order.
    a.extend(dirs.iter().rev().map(|p| s(p)));
    a.extend(["--out", s(&merged)]);
    let (code, _, err) = kvbench(&a);
    assert_eq!(code, 0, "{err}");
    let cols: Vec<&str> = KEY.iter().chain(BYTES).copied().collect();
    assert_eq!(columns(&merged, &cols), columns(&one, &cols));
    for f in ["raw.jsonl", "summary.md", "plots/kv_memory_vs_tokens.svg"] {
        assert!(merged.join(f).metadata().unwrap().len() > 0, "{f}");
    }
    let m = meta(&merged);
    assert_eq!(m["merged_from"].as_array().unwrap().len(), 3);
    assert_eq!(m["status"], "finished");
    assert!(m.get("shard").is_none());
    std::fs::remove_dir_all(&d).ok();
}

/// Inside a Slurm job array the shard comes from SLURM_ARRAY_TASK_ID/COUNT; with --shards N
/// from a Kubernetes Indexed Job's JOB_COMPLETION_INDEX.
#[test]
fn shard_from_scheduler_environment() {
    let d = tmp("env");
    let run = |dir: &Path, env: &[(&str, &str)], extra: &[&str]| {
        let mut a: Vec<&str> = SYNTH.to_vec();
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--out", s(dir)]);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(&a)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let slurm = d.join("slurm");
    let (code, err) = run(
        &slurm,
        &[
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(meta(&slurm)["shard"]["index"], 1);
    assert_eq!(meta(&slurm)["shard"]["count"], 4);
    let k8s = d.join("k8s");
    let (code, err) = run(&k8s, &[("JOB_COMPLETION_INDEX", "2")], &["--shards", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(meta(&k8s)["shard"]["index"], 2);
    assert_eq!(meta(&k8s)["shard"]["count"], 3);
    let (code, err) = run(&d.join("bad"), &[], &["--shards", "3"]);
    assert_eq!(code, 2, "--shards without an index: {err}");
    assert!(err.contains("JOB_COMPLETION_INDEX"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

/// Mixed sets are refused with exit 2 naming the differing field; duplicated and missing shards
/// too; --allow-partial merges what exists and says what is missing.
#[test]
fn merge_refuses_mixed_duplicate_and_missing_shards() {
    let d = tmp("refuse");
    let a0 = d.join("a0");
    let a1 = d.join("a1");
    let b1 = d.join("b1");
    assert_eq!(synth(&a0, &["--shard", "0/2"]).0, 0);
    assert_eq!(synth(&a1, &["--shard", "1/2"]).0, 0);
    assert_eq!(synth(&b1, &["--shard", "1/2", "--seed", "7"]).0, 0);
    let out = d.join("out");
    let merge = |dirs: &[&Path], extra: &[&str]| {
        let mut a = vec!["merge"];
        a.extend(dirs.iter().map(|p| s(p)));
        a.extend(["--out", s(&out)]);
        a.extend_from_slice(extra);
        kvbench(&a)
    };
    let (code, _, err) = merge(&[&a0, &b1], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("settings.seed"), "{err}");
    let (code, _, err) = merge(&[&a0, &a1, &a1], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("shard.index") && err.contains("twice"),
        "{err}"
    );
    let (code, _, err) = merge(&[&a0], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("shard.index") && err.contains("shard 1/2 is missing"),
        "{err}"
    );
    // A different kvbench version and a different model file, doctored into a copy.
    for (field, pointer, value) in [
        (
            "`kvbench`",
            "/kvbench",
            serde_json::json!("0.0.1 (elsewhere)"),
        ),
        (
            "`model_geometry`",
            "/model_geometry/layers",
            serde_json::json!(99),
        ),
    ] {
        let c = d.join("doctored");
        std::fs::remove_dir_all(&c).ok();
        std::fs::create_dir_all(&c).unwrap();
        std::fs::copy(a1.join("raw.jsonl"), c.join("raw.jsonl")).unwrap();
        let mut m = meta(&a1);
        *m.pointer_mut(pointer).unwrap() = value;
        std::fs::write(c.join("meta.json"), m.to_string()).unwrap();
        let (code, _, err) = merge(&[&a0, &c], &[]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(field), "{field}: {err}");
    }
    // Not a shard at all.
    let whole = d.join("whole");
    assert_eq!(synth(&whole, &[]).0, 0);
    let (code, _, err) = merge(&[&a0, &whole], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not run as a shard"), "{err}");
    // Partial: what exists, with the rest listed.
    let (code, _, err) = merge(&[&a0], &["--allow-partial"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("shard 1/2 is missing"), "{err}");
    let m = meta(&out);
    assert_eq!(m["status"], "partial");
    assert_eq!(m["missing"].as_array().unwrap().len(), 1);
    assert_eq!(csv_rows(&out).1.len(), csv_rows(&a0).1.len());
    std::fs::remove_dir_all(&d).ok();
}

/// The quality of a real sweep (perplexity with KL vs fp16, ROUGE with agreement vs the fp16
/// summaries, passkey) survives sharding bit for bit, including a shard killed mid-run and
/// resumed: the merged rows equal one machine's in order, bytes and every quality column.
#[test]
fn merged_shards_equal_single_run_and_killed_shard_resumes() {
    kvbench::model::fetch::ensure_default_model().unwrap();
    let d = tmp("real");
    let sweep: &[&str] = &[
        "sweep",
        "--dtypes",
        "fp16,int8-token,h2o:budget=24,recent=8",
        "--batch-sizes",
        "1",
        "--seq-lens",
        "16,24",
        "--gen",
        "3",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--ctx",
        "48",
        "--ppl-windows",
        "2",
        "--rouge-samples",
        "1",
        "--rouge-doc-tokens",
        "48",
        "--rouge-max-new",
        "4",
        "--passkey-lengths",
        "120",
        "--passkey-depths",
        "50",
    ];
    let run = |out: &Path, extra: &[&str]| {
        let mut a = sweep.to_vec();
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--out", s(out)]);
        let (code, _, err) = kvbench(&a);
        assert_eq!(code, 0, "{err}");
    };
    let one = d.join("one");
    run(&one, &[]);
    let shards: Vec<PathBuf> = (0..3).map(|i| d.join(format!("shard-{i}"))).collect();
    for (i, dir) in shards.iter().enumerate() {
        run(dir, &["--shard", &format!("{i}/3")]);
    }
    // Every shard holds some quality unit: 3 quality units (one per scheme) dealt to 3 shards,
    // each a record of its own in raw.jsonl (no quality.jsonl any more).
    for dir in &shards {
        assert_eq!(quality_lines(dir).len(), 1, "{}", dir.display());
        assert!(!dir.join("quality.jsonl").exists());
    }

    // Kill one shard mid-run: keep its meta.json and cut its results, the last line half
    // written, as an interrupted process leaves them.
    let victim = shards
        .iter()
        .find(|d| !csv_rows(d).1.is_empty())
        .unwrap()
        .clone();
    let raw = std::fs::read_to_string(victim.join("raw.jsonl")).unwrap();
    std::fs::write(victim.join("raw.jsonl"), &raw.as_bytes()[..raw.len() / 3]).unwrap();
    let merged = d.join("merged");
    let merge = |dirs: &[PathBuf]| {
        let mut a = vec!["merge"];
        a.extend(dirs.iter().map(|p| s(p)));
        a.extend(["--out", s(&merged)]);
        kvbench(&a)
    };
    let (code, _, err) = merge(&shards);
    assert_eq!(code, 2, "an unfinished shard is refused: {err}");
    assert!(
        err.contains("shard.units") && err.contains("--resume"),
        "{err}"
    );
    let (code, _, err) = kvbench(&["sweep", "--resume", s(&victim)]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = merge(&shards);
    assert_eq!(code, 0, "{err}");

    let cols: Vec<&str> = KEY.iter().chain(BYTES).chain(QUALITY).copied().collect();
    let want = columns(&one, &cols);
    let vs = cols.iter().position(|c| *c == "rouge_l_vs_fp16").unwrap();
    assert_eq!(want.len(), 6);
    assert!(
        want.iter().all(|r| !r[cols.len() - 1].is_empty()),
        "every row has quality"
    );
    // The non-fp16 rows carry a ROUGE-L agreement with fp16 (recomputed at the merge).
    assert!(want.iter().filter(|r| !r[vs].is_empty()).count() == 4);
    // Compared as sets of rows: the runner's point order is its own business (the merge
    // writes the planned order; the synthetic test above checks it against the runner's).
    let sorted = |mut v: Vec<Vec<String>>| {
        v.sort();
        v
    };
    assert_eq!(sorted(columns(&merged, &cols)), sorted(want));
    // Each shard probed its own machine's read bandwidth (two probes never agree to the bit):
    // the merged rows leave the floor ratio empty rather than label them with one shard's;
    // the one-machine run has it on every row.
    let floor = |dir: &Path| columns(dir, &["tpot_vs_floor"]);
    assert!(
        floor(&merged).iter().all(|r| r[0].is_empty()),
        "{:?}",
        floor(&merged)
    );
    assert!(
        floor(&one).iter().all(|r| !r[0].is_empty()),
        "{:?}",
        floor(&one)
    );
    assert!(err.contains("leave tpot_vs_floor empty"), "{err}");
    // Each scheme's quality once in the merged raw.jsonl, and once in the one-machine run.
    assert_eq!(quality_lines(&merged).len(), 3);
    assert_eq!(quality_lines(&one).len(), 3);
    std::fs::remove_dir_all(&d).ok();
}

/// `kvbench slurm --dry-run` prints an array of N tasks running the given sweep flags, each its
/// own shard, and a merge job after all of them; without --shards it is a usage error.
#[test]
fn slurm_dry_run_prints_array_and_merge() {
    let (code, out, err) = kvbench(&[
        "slurm",
        "--shards",
        "4",
        "--suite",
        "suites/ci.toml",
        "--gen",
        "4",
        "--partition",
        "gpu",
        "--gpus-per-task",
        "1",
        "--cpus-per-task",
        "2",
        "--time",
        "1:00:00",
        "--out",
        "/shared/run",
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "#SBATCH --array=0-3",
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-task=1",
        "#SBATCH --time=1:00:00",
        "sweep --suite suites/ci.toml --gen 4 --threads 2 --shard \"$SLURM_ARRAY_TASK_ID/4\" \
         --out \"$dir\"",
        "sweep --resume \"$dir\" --threads 2",
        "merge /shared/run/shard-0 /shared/run/shard-1 /shared/run/shard-2 /shared/run/shard-3 \
         --out /shared/run/merged --force",
        "--dependency=afterok:",
    ] {
        assert!(out.contains(want), "{want}\n{out}");
    }
    assert!(
        !Path::new("/shared/run").exists(),
        "a dry run writes nothing"
    );
    let (code, _, err) = kvbench(&["slurm", "--suite", "suites/ci.toml", "--dry-run"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--shards"), "{err}");
}

/// The quality records of a run folder's raw.jsonl (`"record":"quality"` lines), one per scheme.
fn quality_lines(dir: &Path) -> Vec<serde_json::Value> {
    let q: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("raw.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["record"] == "quality")
        .collect();
    let mut schemes: Vec<&str> = q.iter().map(|v| v["scheme"].as_str().unwrap()).collect();
    schemes.sort();
    schemes.dedup();
    assert_eq!(
        schemes.len(),
        q.len(),
        "a scheme's quality twice in {}",
        dir.display()
    );
    q
}
