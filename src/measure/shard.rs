//! Splitting a sweep across machines: the planned work as a list of units, an estimate of each
//! unit's cost, and a deterministic, cost-balanced assignment of units to `N` shards.
//!
//! A sweep's work is
//! - one **timing unit** per scheme × batch size × prompt length (the point's warm-up and timed
//!   repeats), and
//! - one **quality unit** per scheme: its perplexity run (with the fp16 cache in lockstep for KL
//!   divergence, so the fp16 reference is computed inside every unit that needs it and nothing
//!   has to travel between shards), its XSum summaries and its passkey trials.
//!
//! [`plan`] lists the units in a fixed order, [`cost`] estimates each, [`split`] assigns them
//! (longest-processing-time-first list scheduling: units by falling cost, each to the least
//! loaded shard; Graham 1969, "Bounds on multiprocessing timing anomalies", which bounds the
//! busiest shard by the mean load plus the largest unit), and [`select`] gives one shard's units.
//! Everything here is a pure function of the sweep's settings, so every shard computes the same
//! split without talking to the others, and `kvbench merge` can check it.

use std::fmt;
use std::str::FromStr;

use super::sweep::SweepSpec;
pub use super::unit::{Selection, Unit};
use crate::error::{Error, Result};
use crate::quality::perplexity::PplMode;

/// `--shard I/N` or `--shards N`: which part of a sweep this process runs.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ShardArgs {
    /// Run only shard I of N (0-based: 0/4 … 3/4) of the sweep's work, split by estimated cost;
    /// `kvbench merge` joins the shards' folders. Default: Slurm's SLURM_ARRAY_TASK_ID of
    /// SLURM_ARRAY_TASK_COUNT inside a job array, else the whole sweep.
    #[arg(long, value_name = "I/N", conflicts_with = "shards")]
    pub shard: Option<Shard>,
    /// Split the sweep into N shards and run the one whose index is in JOB_COMPLETION_INDEX
    /// (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID.
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,
}

/// Shard `index` of `count`, 0-based (`0/4` … `3/4`), as a Slurm array `--array=0-(N-1)` numbers
/// its tasks (`SLURM_ARRAY_TASK_ID`) and a Kubernetes Indexed Job its pods
/// (`JOB_COMPLETION_INDEX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// 0-based index, `< count`.
    pub index: usize,
    /// Number of shards, ≥ 1.
    pub count: usize,
}

/// Most shards a sweep may be split into. Kubernetes caps an Indexed Job at 100 000
/// completions, and a Slurm job array is far smaller (`MaxArraySize`, 1001 tasks by default;
/// `kvbench slurm` checks that bound); the cap keeps the per-shard loads [`split`] holds small
/// however large a number is given.
pub const MAX_SHARDS: usize = 100_000;

impl Shard {
    /// Checks a shard count given as `flag` (`--shard` for `I/N`, `--shards`): 1 to
    /// [`MAX_SHARDS`]. Called before anything is sized by the count. Errors:
    /// [`Error::InvalidArgument`] naming `flag`, the value and the accepted range.
    pub fn check_count(count: usize, flag: &str) -> Result<()> {
        if count == 0 {
            return Err(Error::InvalidArgument {
                name: flag.into(),
                reason: "0 shards cannot run anything: the number of shards must be 1 or more"
                    .into(),
            });
        }
        if count > MAX_SHARDS {
            return Err(Error::InvalidArgument {
                name: flag.into(),
                reason: format!(
                    "{count} shards is more than any scheduler runs at once; give at most \
                     {MAX_SHARDS}"
                ),
            });
        }
        Ok(())
    }

    /// Shard `index` of `count`. Errors: [`Error::InvalidArgument`] (`--shard`) when `count` is 0
    /// or above [`MAX_SHARDS`], or `index ≥ count`.
    pub fn new(index: usize, count: usize) -> Result<Shard> {
        Shard::check_count(count, "--shard")?;
        if index >= count {
            return Err(Error::InvalidArgument {
                name: "--shard".into(),
                reason: format!(
                    "shard {index} of {count} does not exist: shards are numbered from 0 to {} \
                     (as SLURM_ARRAY_TASK_ID with --array=0-{} and JOB_COMPLETION_INDEX number them)",
                    count - 1,
                    count - 1
                ),
            });
        }
        Ok(Shard { index, count })
    }

    /// The shard a process should run when none is given as `--shard I/N`, from the scheduler's
    /// environment (`env(name)` reads a variable):
    /// - `--shards N` (`shards`) with `JOB_COMPLETION_INDEX` (Kubernetes Indexed Job), else with
    ///   `SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN`;
    /// - without `--shards`: `SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN` of
    ///   `SLURM_ARRAY_TASK_COUNT` when Slurm sets both (a job array), else no shard.
    ///
    /// Subtracting `SLURM_ARRAY_TASK_MIN` (0 when unset) makes `--array=1-4` work as well as
    /// `--array=0-3`; a sparse array (`--array=0,2,5`) is not supported.
    /// Errors: [`Error::InvalidArgument`] for `--shards` outside 1 to [`MAX_SHARDS`] (checked
    /// first), `--shards` without an index in the environment, a variable that is not a number,
    /// `SLURM_ARRAY_TASK_ID` below `SLURM_ARRAY_TASK_MIN`, or an index out of range.
    pub fn resolve(
        given: Option<Shard>,
        shards: Option<usize>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Shard>> {
        if let Some(s) = given {
            return Ok(Some(s));
        }
        let num = |name: &str| -> Result<Option<usize>> {
            match env(name) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => {
                    v.trim()
                        .parse::<usize>()
                        .map(Some)
                        .map_err(|_| Error::InvalidArgument {
                            name: name.into(),
                            reason: format!("`{v}` is not a shard index (a whole number ≥ 0)"),
                        })
                }
            }
        };
        let slurm_index = || -> Result<Option<usize>> {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            match num("SLURM_ARRAY_TASK_ID")? {
                Some(id) if id < min => Err(Error::InvalidArgument {
                    name: "SLURM_ARRAY_TASK_ID".into(),
                    reason: format!(
                        "SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}: no task \
                         of the array has that index; unset both or give --shard I/N"
                    ),
                }),
                id => Ok(id.map(|id| id - min)),
            }
        };
        match shards {
            Some(n) => {
                Shard::check_count(n, "--shards")?;
                let index = match num("JOB_COMPLETION_INDEX")? {
                    Some(i) => i,
                    None => slurm_index()?.ok_or_else(|| Error::InvalidArgument {
                        name: "--shards".into(),
                        reason: format!(
                            "--shards {n} takes the shard index from JOB_COMPLETION_INDEX \
                             (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID (Slurm job array), \
                             and neither is set; give --shard I/{n} instead"
                        ),
                    })?,
                };
                Shard::new(index, n).map(Some)
            }
            None => match (slurm_index()?, num("SLURM_ARRAY_TASK_COUNT")?) {
                (Some(i), Some(n)) => {
                    Shard::check_count(n, "SLURM_ARRAY_TASK_COUNT")?;
                    Shard::new(i, n).map(Some)
                }
                _ => Ok(None),
            },
        }
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = Error;

    /// Parses `I/N` (0-based `I`). Errors: [`Error::InvalidArgument`] (`--shard`).
    fn from_str(s: &str) -> Result<Shard> {
        let bad = || Error::InvalidArgument {
            name: "--shard".into(),
            reason: format!(
                "`{s}` is not I/N: give the 0-based shard index and the number of shards, \
                 e.g. 0/4 … 3/4"
            ),
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let i = i.trim().parse().map_err(|_| bad())?;
        let n = n.trim().parse().map_err(|_| bad())?;
        Shard::new(i, n)
    }
}

/// Every unit of a sweep, in the order a single machine reports them: the quality units of
/// every scheme (when `quality`, in `spec.schemes` order), then the timing points, batch sizes
/// outer, prompt lengths, then schemes inner (the schemes of a point are timed interleaved).
pub fn plan(spec: &SweepSpec, quality: bool) -> Vec<Unit> {
    let mut units = Vec::new();
    if quality {
        units.extend(spec.schemes.iter().map(|&scheme| Unit::Quality { scheme }));
    }
    for &batch in &spec.batch_sizes {
        for &seq_len in &spec.seq_lens {
            for &scheme in &spec.schemes {
                units.push(Unit::Timing {
                    scheme,
                    batch,
                    seq_len,
                });
            }
        }
    }
    units
}

/// Tokens a scheme's generation tasks process, for [`cost`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskLoad {
    /// Prompt tokens over all XSum and passkey prompts (prefilled once each).
    pub prompt_tokens: usize,
    /// Tokens generated at most over all prompts (one decode step each).
    pub new_tokens: usize,
}

/// Cost of one decode step in prefill-token equivalents, plus one per sequence in the batch: a
/// decode step reads every weight for a single token. Calibrated on the CI suite (SmolLM2-135M,
/// f32 perplexity weights, 2 cores, one thread per shard): a decode-mode perplexity unit
/// (2 × 511 steps of batch 2, fp16 in lockstep) took 9.6× as long as a chunked one (2 windows
/// of 512 tokens, twice), i.e. a step of batch 2 ≈ 19 prefill tokens.
const DECODE_STEP: f64 = 16.0;

/// Estimated cost of `unit`, in prefill-token equivalents (one token through the model in a
/// prefill = 1; a decode step of batch `b` = 16 + `b`). Only the ratios matter: they balance
/// [`split`]. Timing: warm-up repeats (4 tokens) and `repeats` timed ones, each a prefill of
/// `batch × seq_len` tokens and `gen − 1` decode steps. Quality: perplexity windows (prefilled
/// in `chunked` mode, `ctx − 1` batched decode steps in `decode` mode; twice over for the fp16
/// lockstep when `spec.kl` and the scheme is not fp16) plus `tasks` (batch 1).
pub fn cost(unit: &Unit, spec: &SweepSpec, tasks: TaskLoad) -> f64 {
    let step = |batch: usize| DECODE_STEP + batch as f64;
    match *unit {
        Unit::Timing { batch, seq_len, .. } => {
            let one =
                |gen: usize| (batch * seq_len) as f64 + gen.saturating_sub(1) as f64 * step(batch);
            spec.warmup as f64 * one(spec.gen.min(4)) + spec.repeats.max(1) as f64 * one(spec.gen)
        }
        Unit::Quality { scheme } => {
            let ppl = spec.ppl.as_ref().map_or(0.0, |p| {
                let windows = p.windows.unwrap_or(0);
                let once = match p.mode.resolve(&scheme) {
                    PplMode::Decode => {
                        let batch = p.batch.max(1);
                        let full = windows / batch;
                        let rest = windows % batch;
                        let groups = [(full, batch), (usize::from(rest > 0), rest)];
                        groups
                            .iter()
                            .map(|&(n, b)| n as f64 * p.ctx.saturating_sub(1) as f64 * step(b))
                            .sum()
                    }
                    _ => (windows * p.ctx) as f64,
                };
                let lockstep = spec.kl && !scheme.is_baseline();
                once * if lockstep { 2.0 } else { 1.0 }
            });
            ppl + tasks.prompt_tokens as f64 + tasks.new_tokens as f64 * step(1)
        }
    }
}

/// Assigns each of `costs.len()` units to one of `count` shards: units by falling cost (ties:
/// the earlier unit first), each to the shard with the least cost so far (ties: the lower
/// index). Returns the shard index of each unit. Deterministic; the busiest shard carries at
/// most the mean load plus the largest unit (Graham's list-scheduling bound). Errors:
/// [`Error::InvalidArgument`] when `count` is 0 or above [`MAX_SHARDS`] (checked before the
/// loads are allocated) or a cost is negative or not finite.
pub fn split(costs: &[f64], count: usize) -> Result<Vec<usize>> {
    Shard::check_count(count, "--shard")?;
    if let Some(c) = costs.iter().find(|c| !(c.is_finite() && **c >= 0.0)) {
        return Err(Error::InvalidArgument {
            name: "unit cost".into(),
            reason: format!("{c} is not a finite cost ≥ 0"),
        });
    }
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]).then(a.cmp(&b)));
    let mut load = vec![0.0f64; count];
    let mut owner = vec![0; costs.len()];
    for u in order {
        let mut best = 0;
        for s in 1..count {
            if load[s] < load[best] {
                best = s;
            }
        }
        load[best] += costs[u];
        owner[u] = best;
    }
    Ok(owner)
}

/// The units of `units` that `shard` runs under [`split`] of `costs`, in their planned order.
/// Errors: those of [`split`], and [`Error::InvalidArgument`] when the lengths differ.
pub fn select(units: &[Unit], costs: &[f64], shard: Shard) -> Result<Vec<Unit>> {
    if units.len() != costs.len() {
        return Err(Error::InvalidArgument {
            name: "unit cost".into(),
            reason: format!("{} units but {} costs", units.len(), costs.len()),
        });
    }
    let owner = split(costs, shard.count)?;
    Ok(units
        .iter()
        .zip(owner)
        .filter(|&(_, o)| o == shard.index)
        .map(|(u, _)| *u)
        .collect())
}

/// One planned unit with its estimated cost and the shard that runs it (recorded in a shard's
/// `meta.json`, so `kvbench merge` can say what a missing shard held).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Assigned {
    /// The unit.
    #[serde(flatten)]
    pub unit: Unit,
    /// Estimated cost ([`cost`]), prefill-token equivalents.
    pub cost: f64,
    /// Shard index that runs it.
    pub shard: usize,
}

/// The whole plan with costs and owners, in planned order. Errors: those of [`split`].
pub fn assign(units: &[Unit], costs: &[f64], count: usize) -> Result<Vec<Assigned>> {
    let owner = split(costs, count)?;
    Ok(units
        .iter()
        .zip(costs)
        .zip(owner)
        .map(|((u, &cost), shard)| Assigned {
            unit: *u,
            cost,
            shard,
        })
        .collect())
}

/// What a shard's `meta.json` records under `shard`: which shard it is, where it ran, and the
/// whole split (so `kvbench merge` can check the set and name what a missing shard held).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShardRecord {
    /// 0-based shard index.
    pub index: usize,
    /// Number of shards.
    pub count: usize,
    /// Host name of the machine that ran it.
    pub host: String,
    /// Every unit of the sweep with its cost and shard, in planned order.
    pub plan: Vec<Assigned>,
}

impl ShardRecord {
    /// The shard.
    pub fn shard(&self) -> Shard {
        Shard {
            index: self.index,
            count: self.count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvScheme;
    use crate::quality::perplexity::{PplProtocol, Scoring};

    fn scheme(s: &str) -> KvScheme {
        s.parse().unwrap()
    }

    fn spec() -> SweepSpec {
        let mut s = SweepSpec::timing_only(
            vec![
                scheme("fp16"),
                scheme("int8-token"),
                scheme("int4"),
                scheme("h2o"),
            ],
            vec![1, 4],
            vec![128, 512],
            32,
            0,
        );
        s.ppl = Some(PplProtocol {
            mode: PplMode::Auto,
            batch: 8,
            ctx: 512,
            windows: Some(4),
            scoring: Scoring::Half,
            bos: false,
            exact_attention: true,
        });
        s.kl = true;
        s
    }

    #[test]
    fn shard_parses_zero_based_and_rejects_out_of_range() {
        assert_eq!(
            "0/4".parse::<Shard>().unwrap(),
            Shard { index: 0, count: 4 }
        );
        assert_eq!("3/4".parse::<Shard>().unwrap().to_string(), "3/4");
        for bad in ["4/4", "1/0", "1", "a/4", "-1/4", "1/4/2"] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
            assert!(e.to_string().contains("--shard"), "{bad}: {e}");
        }
    }

    #[test]
    fn shard_from_slurm_and_kubernetes_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        // --shard wins over everything.
        let given = Some(Shard::new(1, 2).unwrap());
        let slurm = env(&[
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(Shard::resolve(given, None, slurm).unwrap(), given);
        // A Slurm array --array=0-3, task 3.
        assert_eq!(
            Shard::resolve(None, None, slurm).unwrap(),
            Some(Shard { index: 3, count: 4 })
        );
        // --array=1-4: task 4 is the last shard.
        let one_based = env(&[
            ("SLURM_ARRAY_TASK_ID", "4"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(
            Shard::resolve(None, None, one_based).unwrap(),
            Some(Shard { index: 3, count: 4 })
        );
        // Kubernetes Indexed Job: the index from JOB_COMPLETION_INDEX, the count from --shards.
        let k8s = env(&[("JOB_COMPLETION_INDEX", "2")]);
        assert_eq!(
            Shard::resolve(None, Some(5), k8s).unwrap(),
            Some(Shard { index: 2, count: 5 })
        );
        assert_eq!(Shard::resolve(None, None, k8s).unwrap(), None);
        // Nothing set: no shard; --shards without an index: a usage error naming --shards.
        let none = env(&[]);
        assert_eq!(Shard::resolve(None, None, none).unwrap(), None);
        let e = Shard::resolve(None, Some(4), none).unwrap_err();
        assert!(e.is_usage() && e.to_string().contains("--shards"), "{e}");
        // Out of range and not a number.
        let e = Shard::resolve(None, Some(2), k8s).unwrap_err();
        assert!(e.to_string().contains("2 of 2"), "{e}");
        let e = Shard::resolve(None, Some(2), env(&[("JOB_COMPLETION_INDEX", "x")])).unwrap_err();
        assert!(e.to_string().contains("JOB_COMPLETION_INDEX"), "{e}");
    }

    /// Issue 25, defect 4: `--shard 0/10^12` and `--shards 10^12` aborted on a multi-TB
    /// allocation of per-shard loads. Every count is bounded by MAX_SHARDS before anything is
    /// sized by it, the message naming the flag and the largest value accepted.
    #[test]
    fn shard_count_of_10_pow_12_is_refused_before_allocating() {
        let huge = 1_000_000_000_000usize;
        let reason = |e: Error| match e {
            Error::InvalidArgument { name, reason } => (name, reason),
            other => panic!("not a usage error: {other}"),
        };
        let (name, r) = reason("0/1000000000000".parse::<Shard>().unwrap_err());
        assert_eq!(name, "--shard");
        assert!(r.contains("give at most 100000"), "{r}");
        let k8s = |k: &str| (k == "JOB_COMPLETION_INDEX").then(|| "0".to_string());
        let (name, r) = reason(Shard::resolve(None, Some(huge), k8s).unwrap_err());
        assert_eq!(name, "--shards");
        assert!(r.contains("give at most 100000"), "{r}");
        let slurm = |k: &str| match k {
            "SLURM_ARRAY_TASK_ID" => Some("0".to_string()),
            "SLURM_ARRAY_TASK_COUNT" => Some(huge.to_string()),
            _ => None,
        };
        let (name, _) = reason(Shard::resolve(None, None, slurm).unwrap_err());
        assert_eq!(name, "SLURM_ARRAY_TASK_COUNT");
        assert!(split(&[1.0], huge).is_err());
        assert!(split(&[1.0], 100_001).is_err());
        // The bound itself is accepted (a load per shard, then empty shards).
        assert_eq!(
            Shard::new(99_999, 100_000).unwrap().to_string(),
            "99999/100000"
        );
        assert_eq!(split(&[1.0, 2.0], 100_000).unwrap(), vec![1, 0]);
    }

    /// Issue 25, defect 7: SLURM_ARRAY_TASK_ID below SLURM_ARRAY_TASK_MIN silently became
    /// shard 0; it is an error naming both variables.
    #[test]
    fn slurm_array_task_id_below_task_min_is_refused() {
        let env = |k: &str| match k {
            "SLURM_ARRAY_TASK_ID" => Some("0".to_string()),
            "SLURM_ARRAY_TASK_MIN" => Some("1".to_string()),
            "SLURM_ARRAY_TASK_COUNT" => Some("4".to_string()),
            _ => None,
        };
        for shards in [None, Some(4)] {
            match Shard::resolve(None, shards, env).unwrap_err() {
                Error::InvalidArgument { name, reason } => {
                    assert_eq!(name, "SLURM_ARRAY_TASK_ID");
                    assert!(
                        reason.contains("SLURM_ARRAY_TASK_ID 0 is below SLURM_ARRAY_TASK_MIN 1"),
                        "{reason}"
                    );
                }
                other => panic!("{other}"),
            }
        }
    }

    /// Issue 25, defect 10: `--shards 0` suggested `--shard I/0`; it says the count must be 1
    /// or more, naming `--shards`.
    #[test]
    fn shards_0_does_not_suggest_shard_i_of_0() {
        match Shard::resolve(None, Some(0), |_| None).unwrap_err() {
            Error::InvalidArgument { name, reason } => {
                assert_eq!(name, "--shards");
                assert!(!reason.contains("I/0"), "{reason}");
                assert!(reason.contains("1 or more"), "{reason}");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn plan_lists_quality_units_first_then_points_with_their_schemes() {
        let s = spec();
        let units = plan(&s, true);
        // 4 schemes × (1 quality + 2 × 2 timing points).
        assert_eq!(units.len(), 20);
        assert_eq!(
            units[0],
            Unit::Quality {
                scheme: scheme("fp16")
            }
        );
        assert!(matches!(units[3], Unit::Quality { .. }));
        assert_eq!(
            units[4],
            Unit::Timing {
                scheme: scheme("fp16"),
                batch: 1,
                seq_len: 128
            }
        );
        assert_eq!(
            units[5],
            Unit::Timing {
                scheme: s.schemes[1],
                batch: 1,
                seq_len: 128
            }
        );
        assert_eq!(
            units[19],
            Unit::Timing {
                scheme: s.schemes[3],
                batch: 4,
                seq_len: 512
            }
        );
        assert_eq!(plan(&s, false).len(), 16);
    }

    /// Costs worked out by hand from the documented model.
    #[test]
    fn cost_by_hand() {
        let mut s = spec();
        s.warmup = 1;
        s.repeats = 2;
        let t = |b, l| Unit::Timing {
            scheme: scheme("int4"),
            batch: b,
            seq_len: l,
        };
        // batch 4 × 128: prefill 512; warm-up 3 steps × 20, timed 31 steps × 20.
        // 1 × (512 + 60) + 2 × (512 + 620) = 572 + 2264.
        assert_eq!(cost(&t(4, 128), &s, TaskLoad::default()), 2836.0);
        let q = |name| Unit::Quality {
            scheme: scheme(name),
        };
        // fp16, chunked, no lockstep: 4 windows × 512.
        assert_eq!(cost(&q("fp16"), &s, TaskLoad::default()), 2048.0);
        // int4: the same twice (fp16 in lockstep for KL).
        assert_eq!(cost(&q("int4"), &s, TaskLoad::default()), 4096.0);
        // h2o: decode mode, 4 windows in one batch of ≤ 8: 511 steps × (16 + 4), twice.
        assert_eq!(cost(&q("h2o"), &s, TaskLoad::default()), 2.0 * 511.0 * 20.0);
        // Generation tasks: 1000 prompt tokens + 10 new tokens × (16 + 1).
        let tasks = TaskLoad {
            prompt_tokens: 1000,
            new_tokens: 10,
        };
        assert_eq!(cost(&q("fp16"), &s, tasks), 2048.0 + 1170.0);
        s.kl = false;
        assert_eq!(cost(&q("int4"), &s, TaskLoad::default()), 2048.0);
    }

    /// Every unit lands in exactly one shard, whatever the shard count, and the union of the
    /// shards' selections is the plan.
    #[test]
    fn every_unit_in_exactly_one_shard() {
        let s = spec();
        let units = plan(&s, true);
        let costs: Vec<f64> = units
            .iter()
            .map(|u| cost(u, &s, TaskLoad::default()))
            .collect();
        for n in [1, 2, 3, 4, 7, 20, 25] {
            let mut seen = vec![0usize; units.len()];
            for i in 0..n {
                for u in select(&units, &costs, Shard::new(i, n).unwrap()).unwrap() {
                    seen[units.iter().position(|x| *x == u).unwrap()] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{n} shards: {seen:?}");
        }
    }

    /// The same inputs give the same split (every shard computes it independently).
    #[test]
    fn split_is_deterministic() {
        let costs = [5.0, 5.0, 1.0, 3.0, 3.0, 3.0, 0.0, 2.0];
        let a = split(&costs, 3).unwrap();
        for _ in 0..5 {
            assert_eq!(split(&costs, 3).unwrap(), a);
        }
        // Worked by hand: 5 (u0) → s0; 5 (u1) → s1 (tie with s2: lower index); 3 (u3) → s2;
        // loads 5,5,3, so 3 (u4) → s2: 5,5,6; 3 (u5) → s0: 8,5,6; 2 (u7) → s1: 8,7,6;
        // 1 (u2) → s2: 8,7,7; 0 (u6) → s1 (tie).
        assert_eq!(a, vec![0, 1, 2, 2, 2, 0, 1, 1]);
    }

    /// Balanced: the busiest shard is within Graham's bound (mean + largest unit), and on
    /// equal units the loads differ by at most one unit.
    #[test]
    fn split_is_balanced() {
        let costs: Vec<f64> = (0..97).map(|i| ((i * 37) % 101) as f64 + 1.0).collect();
        for n in 1..=9 {
            let owner = split(&costs, n).unwrap();
            let mut load = vec![0.0; n];
            for (c, o) in costs.iter().zip(&owner) {
                load[*o] += c;
            }
            let mean = costs.iter().sum::<f64>() / n as f64;
            let max_unit = costs.iter().cloned().fold(0.0, f64::max);
            let busiest = load.iter().cloned().fold(0.0, f64::max);
            assert!(busiest <= mean + max_unit, "{n}: {load:?}");
        }
        let owner = split(&[1.0; 10], 4).unwrap();
        let counts: Vec<usize> = (0..4)
            .map(|s| owner.iter().filter(|&&o| o == s).count())
            .collect();
        assert_eq!(counts, vec![3, 3, 2, 2]);
        assert!(split(&[1.0, f64::NAN], 2).is_err());
        assert!(split(&[1.0], 0).is_err());
    }
}
