//! Warnings about a run's points, grouped by cause (issue #26): one line per cause with how
//! many points it touched, the worst of them and what to do — said once —, instead of one line
//! per point repeating the same advice. The per-point detail goes to `summary.md`, collapsed.
//!
//! [`Warnings::of_sweep`] and `report::serve::warnings` collect typed [`Cause`]s from finished rows;
//! [`Warnings::lines`] and [`Warnings::markdown`] are the only places they become text.

use super::ResultRow;
use crate::measure::contention::CONTENDED_CORES;

/// TPOT's 95 % interval half-width above this share of its mean is worth a warning, %.
pub const WIDE_CI_PCT: f64 = 5.0;

/// Inter-token latencies outside Tukey's fences above this share of the samples are worth a
/// warning, %. Tukey's fences flag about one sample in a handful by chance, so points with
/// fewer than [`MIN_OUTLIER_SAMPLES`] samples are not judged.
pub const OUTLIER_PCT: usize = 5;

/// The fewest inter-token latencies (repeats × (gen − 1)) on which outliers are judged.
pub const MIN_OUTLIER_SAMPLES: usize = 20;

/// A measured serving point whose speed probe ran more than this share off the run's median
/// (prefill or decode step) is worth a warning, %: a probe spreads about ±7 % around the speed
/// of the minute it samples (AMD EPYC VM, 2026-12-06: the twelve points of one steady run
/// probed 288–393 ms per prefill, 11.4–14.3 ms per step), so 20 % is three of those, while
/// the drift of half an hour there reached 10–30 %.
pub const DRIFT_PCT: f64 = 20.0;

/// The fewest probed points on which drift is judged (the median of fewer says little).
pub const MIN_DRIFT_POINTS: usize = 3;

/// Why a point's numbers deserve a second look, with the numbers that say how much.
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    /// Other processes used more than [`CONTENDED_CORES`] cores on average while the point
    /// was timed: its latencies describe a shared machine.
    Contended {
        /// Cores the other processes occupied on average, cores.
        other_cores: f64,
    },
    /// The machine ran the point's speed probe ([`crate::perf::SpeedProbe`]) more than
    /// [`DRIFT_PCT`] % off the run's median: the machine's speed drifted (a shared VM's does,
    /// unseen by other processes' CPU use), so the point's latencies are not comparable with
    /// the other points' to better than that.
    Drifted {
        /// The point's probe prefill ÷ the run's median.
        prefill: f64,
        /// The point's probe decode step ÷ the run's median.
        step: f64,
    },
    /// More than [`OUTLIER_PCT`] % of the inter-token latencies lie outside Tukey's fences.
    ItlOutliers {
        /// Samples outside the fences.
        outliers: usize,
        /// Inter-token latencies judged (repeats × (gen − 1)).
        samples: usize,
    },
    /// TPOT's 95 % interval half-width is wider than [`WIDE_CI_PCT`] % of its mean.
    WideTpotCi {
        /// Mean TPOT, ms.
        mean_ms: f64,
        /// Half-width of its 95 % confidence interval, ms.
        ci95_ms: f64,
    },
    /// One timed repeat: TPOT has no confidence interval.
    SingleRepeat,
}

impl Cause {
    /// The order causes are listed in (most telling first), and the key they group by.
    fn rank(&self) -> u8 {
        match self {
            Cause::Contended { .. } => 0,
            Cause::Drifted { .. } => 1,
            Cause::ItlOutliers { .. } => 2,
            Cause::WideTpotCi { .. } => 3,
            Cause::SingleRepeat => 4,
        }
    }

    /// How bad it is, to pick a group's worst point: cores, outlier share, or CI / mean.
    fn severity(&self) -> f64 {
        match *self {
            Cause::Contended { other_cores } => other_cores,
            // The ratios are to the run's median: as a probe against a probe of 1 ms each.
            Cause::Drifted { prefill, step } => crate::perf::SpeedProbe {
                prefill_ms: prefill,
                step_ms: step,
            }
            .drift(&crate::perf::SpeedProbe {
                prefill_ms: 1.0,
                step_ms: 1.0,
            }),
            Cause::ItlOutliers { outliers, samples } => outliers as f64 / samples.max(1) as f64,
            Cause::WideTpotCi { mean_ms, ci95_ms } => ci95_ms / mean_ms,
            Cause::SingleRepeat => 0.0,
        }
    }

    /// The cause's short name (the detail table's first column).
    fn name(&self) -> &'static str {
        match self {
            Cause::Contended { .. } => "contended",
            Cause::Drifted { .. } => "machine drifted",
            Cause::ItlOutliers { .. } => "ITL outliers",
            Cause::WideTpotCi { .. } => "wide TPOT CI",
            Cause::SingleRepeat => "one repeat",
        }
    }

    /// This point's numbers, e.g. `1.20 other cores` or `TPOT 2.00 ± 0.86 ms (±43 %)`.
    fn detail(&self) -> String {
        match *self {
            Cause::Contended { other_cores } => format!("{other_cores:.2} other cores"),
            Cause::Drifted { prefill, step } => {
                format!("speed probe prefill {prefill:.2}×, step {step:.2}× the run's median")
            }
            Cause::ItlOutliers { outliers, samples } => {
                format!("{outliers} of {samples} inter-token latencies")
            }
            Cause::WideTpotCi { mean_ms, ci95_ms } => format!(
                "TPOT {mean_ms:.2} ± {ci95_ms:.2} ms (±{:.0} %)",
                100.0 * ci95_ms / mean_ms
            ),
            Cause::SingleRepeat => "no TPOT interval".into(),
        }
    }
}

/// One point's warning: the point as a reader names it and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PointWarning {
    /// The point, e.g. `int8-token batch 1 × 128` (sweep) or `fp16 poisson 2 req/s` (serve).
    pub point: String,
    /// Why.
    pub cause: Cause,
}

/// The warnings of one run: every point's, with how many points were timed.
#[derive(Debug, Clone, PartialEq)]
pub struct Warnings {
    /// The subcommand that measured the run (`sweep`, `serve`), named in the advice.
    pub command: &'static str,
    /// Points that finished (failed points are not timed, so not judged).
    pub points: usize,
    /// Every warning, in the rows' order.
    pub list: Vec<PointWarning>,
}

/// The warnings of one cause: how many points and the worst of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Group<'a> {
    /// Points with this cause.
    pub count: usize,
    /// The worst of them (the first among equals).
    pub worst: &'a PointWarning,
}

impl Warnings {
    /// A sweep's warnings: contended points, ITL outliers over [`OUTLIER_PCT`] % (on
    /// [`MIN_OUTLIER_SAMPLES`]+ samples), TPOT intervals wider than [`WIDE_CI_PCT`] % of the
    /// mean, and single repeats. Failed rows are skipped.
    pub fn of_sweep(rows: &[ResultRow]) -> Warnings {
        let mut list = Vec::new();
        let ok: Vec<&ResultRow> = rows.iter().filter(|r| r.status.is_ok()).collect();
        for r in &ok {
            let point = format!("{} batch {} × {}", r.scheme, r.batch_size, r.seq_len);
            let mut push = |cause| {
                list.push(PointWarning {
                    point: point.clone(),
                    cause,
                })
            };
            if let (Some(true), Some(c)) = (r.contended, r.other_cpu_cores) {
                push(Cause::Contended { other_cores: c });
            }
            let samples = r.repeats.unwrap_or(0) * r.gen_tokens.saturating_sub(1);
            if let Some(k) = r
                .itl
                .outliers
                .filter(|&k| samples >= MIN_OUTLIER_SAMPLES && k * 100 > OUTLIER_PCT * samples)
            {
                push(Cause::ItlOutliers {
                    outliers: k,
                    samples,
                });
            }
            if let (Some(ci), Some(m)) = (r.tpot.ci95, r.tpot.mean) {
                if ci > WIDE_CI_PCT / 100.0 * m {
                    push(Cause::WideTpotCi {
                        mean_ms: m,
                        ci95_ms: ci,
                    });
                }
            }
            if r.repeats == Some(1) {
                push(Cause::SingleRepeat);
            }
        }
        Warnings {
            command: "sweep",
            points: ok.len(),
            list,
        }
    }

    /// Whether there is nothing to warn about.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The warnings grouped by cause, in [`Cause`]'s order: a count and the worst point each.
    pub fn groups(&self) -> Vec<Group<'_>> {
        let mut groups: Vec<Group<'_>> = Vec::new();
        let mut sorted: Vec<&PointWarning> = self.list.iter().collect();
        sorted.sort_by_key(|w| w.cause.rank()); // stable: rows' order within a cause
        for w in sorted {
            match groups.last_mut() {
                Some(g) if g.worst.cause.rank() == w.cause.rank() => {
                    g.count += 1;
                    if w.cause.severity() > g.worst.cause.severity() {
                        g.worst = w;
                    }
                }
                _ => groups.push(Group { count: 1, worst: w }),
            }
        }
        groups
    }

    /// One line per cause (without a `warning: ` prefix): how many of the run's points, the
    /// worst case, and the advice once.
    pub fn lines(&self) -> Vec<String> {
        let n = self.points;
        self.groups()
            .iter()
            .map(|g| {
                let (k, p) = (g.count, &g.worst.point);
                match g.worst.cause {
                    Cause::Contended { other_cores } => format!(
                        "{k} of {n} points ran while other processes used more than \
                         {CONTENDED_CORES} cores (worst {other_cores:.2} cores, {p}): their \
                         latencies describe a shared machine, not the scheme; when the machine \
                         is idle, `kvbench {} --resume <run folder> --rerun-contended` measures \
                         them again",
                        self.command
                    ),
                    Cause::Drifted { prefill, step } => format!(
                        "{k} of {n} points ran while the machine's speed probe was more than \
                         {DRIFT_PCT} % off the run's median (worst {p}: prefill {prefill:.2}×, \
                         decode step {step:.2}×): the machine's speed drifted, which other \
                         processes' CPU use does not show, so those points' latencies differ \
                         from the others' by that much before any scheme does; compare them \
                         with care, or measure them again when the probe holds steady"
                    ),
                    Cause::ItlOutliers { outliers, samples } => format!(
                        "{k} of {n} points: more than {OUTLIER_PCT} % of inter-token latencies \
                         outside Tukey's fences (worst {outliers} of {samples}, {p}): the machine \
                         was busy or throttling; rerun on an idle machine with more --repeats or \
                         --min-time"
                    ),
                    Cause::WideTpotCi { mean_ms, ci95_ms } => format!(
                        "{k} of {n} points: TPOT 95 % CI wider than {WIDE_CI_PCT} % of the mean \
                         (worst ±{:.0} %, {p}: {mean_ms:.2} ± {ci95_ms:.2} ms); raise --repeats \
                         or --min-time",
                        100.0 * ci95_ms / mean_ms
                    ),
                    Cause::SingleRepeat => format!(
                        "{k} of {n} points: one timed repeat, so TPOT has no confidence \
                         interval; rerun with --repeats 3 or more for numbers you compare"
                    ),
                }
            })
            .collect()
    }

    /// `summary.md`'s section: the grouped lines, then every point's warning in a collapsed
    /// table. Empty when there is nothing to warn about.
    pub fn markdown(&self) -> String {
        if self.is_empty() {
            return String::new();
        }
        let mut md = "\n## Warnings\n\n".to_string();
        for line in self.lines() {
            md.push_str(&format!("- {line}\n"));
        }
        md.push_str(&format!(
            "\n<details><summary>Every warning, point by point ({})</summary>\n\n\
             | point | cause | numbers |\n| --- | --- | --- |\n",
            self.list.len()
        ));
        for w in &self.list {
            md.push_str(&format!(
                "| {} | {} | {} |\n",
                w.point,
                w.cause.name(),
                w.cause.detail()
            ));
        }
        md.push_str("\n</details>\n");
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::sweep::PointStatus;
    use crate::report::serve::ServeRow;
    use crate::report::Latency;

    /// A timed sweep point: 3 repeats of 8 tokens (21 inter-token latencies), TPOT `mean` ±
    /// `ci` ms, `outliers` ITL outliers, other processes' cores `other`.
    fn point(scheme: &str, b: usize, s: usize, mean: f64, ci: f64, outliers: usize) -> ResultRow {
        ResultRow {
            scheme: scheme.into(),
            batch_size: b,
            seq_len: s,
            gen_tokens: 8,
            repeats: Some(3),
            tpot: Latency {
                mean: Some(mean),
                ci95: Some(ci),
                ..Default::default()
            },
            itl: Latency {
                outliers: Some(outliers),
                ..Default::default()
            },
            other_cpu_cores: Some(0.02),
            contended: Some(false),
            ..Default::default()
        }
    }

    /// By hand: fp16 ±10 %, int8-token ±43 % (0.86 / 2.00), int4 ±10 % and contended at 1.2
    /// cores, int8 ±2 % (not wide) with 3 of 21 ITL outliers (14 % > 5 %), and a failed point
    /// marked contended at 2.0 cores that is not judged: 4 timed points, three causes.
    fn sweep_fixture() -> Vec<ResultRow> {
        vec![
            point("fp16", 1, 128, 10.0, 1.0, 0),
            point("int8-token", 1, 128, 2.0, 0.86, 1),
            ResultRow {
                other_cpu_cores: Some(1.2),
                contended: Some(true),
                ..point("int4", 4, 512, 4.0, 0.4, 0)
            },
            point("int8", 4, 512, 5.0, 0.1, 3),
            ResultRow {
                status: PointStatus::Error("boom".into()),
                other_cpu_cores: Some(2.0),
                contended: Some(true),
                ..point("q4_0", 4, 512, 9.0, 9.0, 9)
            },
        ]
    }

    /// Issue #26: one line per cause, with the count, the worst point and the advice once; the
    /// contended advice names the flag that re-measures (`--rerun-contended`).
    #[test]
    fn sweep_warnings_one_line_per_cause() {
        let w = Warnings::of_sweep(&sweep_fixture());
        assert_eq!(w.points, 4);
        assert_eq!(w.list.len(), 5, "{w:?}");
        assert_eq!(
            w.lines(),
            vec![
                "1 of 4 points ran while other processes used more than 0.15 cores (worst 1.20 \
                 cores, int4 batch 4 × 512): their latencies describe a shared machine, not the \
                 scheme; when the machine is idle, `kvbench sweep --resume <run folder> \
                 --rerun-contended` measures them again"
                    .to_string(),
                "1 of 4 points: more than 5 % of inter-token latencies outside Tukey's fences \
                 (worst 3 of 21, int8 batch 4 × 512): the machine was busy or throttling; rerun \
                 on an idle machine with more --repeats or --min-time"
                    .to_string(),
                "3 of 4 points: TPOT 95 % CI wider than 5 % of the mean (worst ±43 %, \
                 int8-token batch 1 × 128: 2.00 ± 0.86 ms); raise --repeats or --min-time"
                    .to_string(),
            ]
        );
    }

    /// The thresholds are strict: a CI of exactly 5 % and 1 outlier in 20 (5 %) are not
    /// warned about; 2 outliers in 19 samples (under 20) are not judged. Single repeats are
    /// counted, with no worst case.
    #[test]
    fn sweep_warnings_thresholds_and_single_repeats() {
        let edge = point("fp16", 1, 64, 10.0, 0.5, 1);
        let edge = ResultRow {
            gen_tokens: 5,
            repeats: Some(5),
            ..edge
        };
        let few = ResultRow {
            gen_tokens: 20,
            repeats: Some(1),
            tpot: Latency {
                mean: Some(3.0),
                ..Default::default()
            },
            itl: Latency {
                outliers: Some(2),
                ..Default::default()
            },
            ..point("int8", 1, 64, 0.0, 0.0, 0)
        };
        let one = ResultRow {
            scheme: "int4".into(),
            ..few.clone()
        };
        assert!(Warnings::of_sweep(std::slice::from_ref(&edge)).is_empty());
        assert_eq!(
            Warnings::of_sweep(&[edge, few, one]).lines(),
            vec![
                "2 of 3 points: one timed repeat, so TPOT has no confidence interval; rerun \
                  with --repeats 3 or more for numbers you compare"
                    .to_string()
            ]
        );
    }

    /// summary.md: the grouped lines as a list, then every point's warning in a collapsed
    /// table, numbers by hand.
    #[test]
    fn sweep_warnings_markdown_keeps_every_point() {
        let md = Warnings::of_sweep(&sweep_fixture()).markdown();
        assert!(
            md.starts_with("\n## Warnings\n\n- 1 of 4 points ran while"),
            "{md}"
        );
        assert!(md.contains("\n- 3 of 4 points: TPOT 95 % CI"), "{md}");
        assert!(
            md.contains("<details><summary>Every warning, point by point (5)</summary>"),
            "{md}"
        );
        for row in [
            "| fp16 batch 1 × 128 | wide TPOT CI | TPOT 10.00 ± 1.00 ms (±10 %) |",
            "| int8-token batch 1 × 128 | wide TPOT CI | TPOT 2.00 ± 0.86 ms (±43 %) |",
            "| int4 batch 4 × 512 | contended | 1.20 other cores |",
            "| int4 batch 4 × 512 | wide TPOT CI | TPOT 4.00 ± 0.40 ms (±10 %) |",
            "| int8 batch 4 × 512 | ITL outliers | 3 of 21 inter-token latencies |",
        ] {
            assert!(md.contains(row), "{row} missing from {md}");
        }
        assert!(!md.contains("q4_0"), "{md}");
        assert!(md.ends_with("</details>\n"), "{md}");
        assert!(Warnings::of_sweep(&[]).markdown().is_empty());
    }

    /// Serve: drift by hand. Probes (prefill, step) ms: fp16 (250, 12), int8-token (255,
    /// 12.2), int4 (320, 12), the window (250, 9), q4_0 (245, 11.8), and a failed point
    /// (900, 90) not judged: medians 250 and 12, so int4 runs its prefill 1.28× (> 20 %) and
    /// the window its step 0.75× (25 % off), int8-token (1.02×, 1.017×) and q4_0 (0.98×,
    /// 0.983×) within; int4 is the worst. A simulated run's probes (the measured ones it was
    /// scaled to) are not judged, nor fewer than three probed points; a merged folder's runs
    /// are judged apart (a point at half its run's step is flagged, though it equals the
    /// other run's).
    #[test]
    fn serve_warnings_flag_a_drifting_machine() {
        let row = |scheme: &str, p: f64, s: f64, ok: bool| ServeRow {
            scheme: scheme.into(),
            arrival: "poisson 2 req/s".into(),
            mode: "measured".into(),
            other_cores: Some(0.0),
            probe_prefill_ms: Some(p),
            probe_step_ms: Some(s),
            status: if ok {
                PointStatus::Ok
            } else {
                PointStatus::Error("boom".into())
            },
            ..Default::default()
        };
        let mut rows = vec![
            row("fp16", 250.0, 12.0, true),
            row("int8-token", 255.0, 12.2, true),
            row("int4", 320.0, 12.0, true),
            row("window", 250.0, 9.0, true),
            row("q4_0", 245.0, 11.8, true),
            row("int2", 900.0, 90.0, false),
        ];
        let w = super::super::serve::warnings(&rows);
        let points: Vec<(&str, &str)> = w
            .list
            .iter()
            .map(|x| (x.point.as_str(), x.cause.name()))
            .collect();
        assert_eq!(
            points,
            [
                ("int4 poisson 2 req/s", "machine drifted"),
                ("window poisson 2 req/s", "machine drifted")
            ]
        );
        let lines = w.lines();
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with("2 of 5 points ran while the machine's speed probe was more than 20 % off the run's median (worst int4 poisson 2 req/s: prefill 1.28×, decode step 1.00×)"),
            "{}",
            lines[0]
        );
        for r in &mut rows {
            r.mode = "simulated".into();
        }
        assert!(super::super::serve::warnings(&rows).list.is_empty());
        // A merged folder: each run judged against its own median. Run `b`'s three points
        // probe 2× run `a`'s (another machine) and none drifts within its run.
        rows.iter_mut().for_each(|r| r.mode = "measured".into());
        let mut merged: Vec<ServeRow> = rows[..3]
            .iter()
            .map(|r| ServeRow {
                run_id: "a".into(),
                probe_prefill_ms: Some(250.0),
                probe_step_ms: Some(12.0),
                ..r.clone()
            })
            .collect();
        merged.extend(merged.clone().into_iter().map(|r| ServeRow {
            run_id: "b".into(),
            probe_prefill_ms: Some(500.0),
            probe_step_ms: Some(24.0),
            ..r
        }));
        assert!(super::super::serve::warnings(&merged).list.is_empty());
        merged[5].probe_step_ms = Some(12.0);
        let w = super::super::serve::warnings(&merged);
        assert_eq!(w.list.len(), 1, "{:?}", w.list);
        rows.truncate(2);
        rows[1].probe_prefill_ms = Some(400.0);
        assert!(super::super::serve::warnings(&rows).list.is_empty());
    }

    /// Serve: contended points grouped (worst 1.70 cores, the prefix-cached int8 point), an
    /// idle point and a failed one not counted; the advice names `kvbench serve`. The line
    /// printed as a point finishes marks it without repeating the advice.
    #[test]
    fn serve_warnings_group_contended_points() {
        let row = |scheme: &str, prefix: bool, cores: f64, ok: bool| ServeRow {
            scheme: scheme.into(),
            arrival: "poisson 2 req/s".into(),
            prefix_caching: prefix,
            other_cores: Some(cores),
            status: if ok {
                PointStatus::Ok
            } else {
                PointStatus::Error("boom".into())
            },
            ..Default::default()
        };
        let rows = vec![
            row("fp16", false, 0.9, true),
            row("int8", true, 1.7, true),
            row("int4", false, 0.05, true),
            row("q4_0", false, 3.0, false),
        ];
        let w = super::super::serve::warnings(&rows);
        assert_eq!(
            w.lines(),
            vec![
                "2 of 3 points ran while other processes used more than 0.15 cores (worst 1.70 \
                  cores, int8 poisson 2 req/s, prefix cached): their latencies describe a shared \
                  machine, not the scheme; when the machine is idle, `kvbench serve --resume \
                  <run folder> --rerun-contended` measures them again"
                    .to_string()
            ]
        );
        let line = super::super::serve::point_line(&rows[1]);
        assert!(
            line.ends_with(" (contended: other processes used 1.70 cores)"),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
        assert!(!super::super::serve::point_line(&rows[2]).contains("contended"));
    }
}
