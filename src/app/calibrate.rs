//! `kvbench calibrate` end to end: the model in each phase's weights, the serving path's own
//! prefills and decode steps timed ([`crate::serve::calibrate::measure`]), a device profile
//! fitted to them ([`crate::perf::fit::fit`]) and written as TOML — what
//! `kvbench serve --simulate <file>` then runs on — with every timing against the profile's
//! prediction.

use std::path::PathBuf;

use anyhow::Context;

use crate::measure::settings::{ModelArgs, SchemeArgs, ThreadArgs, WeightArgs};
use crate::model::{self, hub};
use crate::perf::fit::fit;
use crate::perf::ModelShape;
use crate::quality::wikitext;
use crate::report::meta::Machine;
use crate::serve::calibrate::{measure, CalibrationSpec, TraceSpec};
use crate::serve::workload::LenDist;

use super::{progress_bar, set_threads, BarProgress};

/// `--prefill-lens`'s default, tokens.
const DEFAULT_PREFILL_LENS: &str = "16,32,48,64,128,192,256,384,512";

/// Arguments of `kvbench calibrate`: the shared `--model`, `--dtypes` (the schemes whose K/V
/// reads are fitted), `--weights`, `--prefill-weights`, `--threads`, and what to time.
#[derive(Debug, clap::Args)]
#[command(mut_arg("dtypes", |a| a.default_value("fp16,int8,int4,window:size=128,sinks=4")))]
pub struct CalibrateArgs {
    /// `--model`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// `--dtypes`.
    #[command(flatten)]
    pub schemes: SchemeArgs,
    /// `--weights`, `--prefill-weights`.
    #[command(flatten)]
    pub weights: WeightArgs,
    /// `--threads`.
    #[command(flatten)]
    pub threads: ThreadArgs,
    /// Prompt lengths of the timed prefills, tokens, comma-separated. The default reaches
    /// past the longest recompute prefill the shipped serve suites can produce (prompt + all
    /// but the last output token: 384 + 63 = 447 in `suites/serve.toml`); beyond the longest
    /// length the profile holds its matmul efficiency (time linear in tokens).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_PREFILL_LENS)]
    pub prefill_lens: Vec<usize>,
    /// Batch sizes of the timed decode steps, comma-separated. The default reaches past the
    /// most sequences the shipped serve suites run at once (29 in int4 at 2 req/s in
    /// `suites/serve-decode.toml`, 23 in `suites/serve.toml` with prefix caching); beyond the
    /// largest batch the profile holds its decode matmul efficiency (time linear in the batch).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,3,4,6,8,12,16,24,32,48"
    )]
    pub batch_sizes: Vec<usize>,
    /// Long context of the per-scheme decode steps, tokens (each scheme is also timed at the
    /// short context, 32 + the steps, in the same rounds; the difference is its K/V cost):
    /// where the workload you will simulate runs — the shipped serve suites run at 32–448
    /// tokens.
    #[arg(long, default_value_t = 384)]
    pub long_ctx: usize,
    /// Sequences of the per-scheme decode steps: as many as the shipped serve suites mostly
    /// run (2–14), and 8 × (384 − 32) cached tokens between each scheme's short and long
    /// step, a difference of several ms on this CPU, above the steps' noise.
    #[arg(long, default_value_t = 8)]
    pub scheme_batch: usize,
    /// Timed prefills per prompt length (the median is kept; of the running batch's steps
    /// right before and after each, the mean).
    #[arg(long, default_value_t = 11)]
    pub repeats: usize,
    /// Timed decode steps per batch size and per scheme (the median is kept).
    #[arg(long, default_value_t = 33)]
    pub step_repeats: usize,
    /// Requests per phase of the serving trace run last (0: none): the real scheduler in closed
    /// loops of each `--trace-clients` count, fp16 K/V, no preemption, prompts of
    /// `--trace-input-len` and outputs of `--trace-output-len` tokens; the profile's decode
    /// steps are then corrected to agree on average with the trace's steps that followed no
    /// prefill, and its prefills scaled by the trace's one-request prefills over the
    /// profile's (README, "Calibration"). About 1.5 minutes on 2 cores with the defaults.
    #[arg(long, default_value_t = 24)]
    pub trace_requests: usize,
    /// Client counts of the serving trace's phases, comma-separated (each the most sequences
    /// running at once in its phase).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub trace_clients: Vec<usize>,
    /// Prompt lengths of the serving trace, tokens (`A..B` uniform, or one length).
    #[arg(long, default_value = "16..384")]
    pub trace_input_len: LenDist,
    /// Output lengths of the serving trace, tokens (`A..B` uniform, or one length).
    #[arg(long, default_value = "16..160")]
    pub trace_output_len: LenDist,
    /// The profile's name (default: cpu-<host name>).
    #[arg(long)]
    pub name: Option<String>,
    /// Profile file to write (default: reports/calibrate-<time>/profile.toml, with
    /// calibration.csv beside it).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Fit the timings an earlier calibration saved (its timings.csv) instead of measuring:
    /// the analysis re-run on the same raw samples, as criterion's saved baselines. The model
    /// is still loaded for its shapes and weight sizes; the timing flags are ignored.
    #[arg(long, value_name = "CSV")]
    pub from_timings: Option<PathBuf>,
}

/// Prompt tokens of the batch sizes' decode steps (the steps add to it).
const SHORT_CTX: usize = 32;

/// Runs `kvbench calibrate`. Errors: usage errors for bad flags or models; the fit's when the
/// timings cannot be separated; I/O.
pub fn run(a: CalibrateArgs) -> anyhow::Result<()> {
    set_threads(a.threads.threads)?;
    if a.repeats == 0 || a.step_repeats == 0 || a.prefill_lens.len() < 3 || a.batch_sizes.len() < 2
    {
        return Err(crate::Error::InvalidArgument {
            name: "kvbench calibrate".into(),
            reason: "need --repeats ≥ 1, --step-repeats ≥ 1, three or more --prefill-lens and \
                     two or more --batch-sizes to separate the terms"
                .into(),
        }
        .into());
    }
    if a.trace_requests > 0 && (a.trace_clients.is_empty() || a.trace_clients.contains(&0)) {
        return Err(crate::Error::InvalidArgument {
            name: "--trace-clients".into(),
            reason: format!(
                "{:?}: give one or more client counts ≥ 1 (or --trace-requests 0 for no \
                 serving trace)",
                a.trace_clients
            ),
        }
        .into());
    }
    for (flag, len) in [
        ("--trace-input-len", &a.trace_input_len),
        ("--trace-output-len", &a.trace_output_len),
    ] {
        if matches!(len, LenDist::Xsum(..)) {
            return Err(crate::Error::InvalidArgument {
                name: flag.into(),
                reason: format!(
                    "`{len}`: the serving trace takes one length or a uniform range (`A..B`)"
                ),
            }
            .into());
        }
    }
    if a.scheme_batch == 0 || a.long_ctx <= SHORT_CTX {
        return Err(crate::Error::InvalidArgument {
            name: "kvbench calibrate".into(),
            reason: format!(
                "need --scheme-batch ≥ 1 and --long-ctx above the short context of \
                 {SHORT_CTX} tokens (got {} and {}): the schemes' K/V cost is their step less \
                 the short-context one",
                a.scheme_batch, a.long_ctx
            ),
        }
        .into());
    }
    let location = hub::resolve(&a.model.model)?;
    let load = |dtype| {
        model::load_location(&a.model.model, &location, dtype)
            .with_context(|| format!("loading model `{}` with {dtype} weights", a.model.model))
    };
    let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
    let peak = super::memory::PeakLoad {
        schemes: a.schemes.dtypes.0.clone(),
        // An upper bound: the largest batch at the longest context. The short-context batches,
        // held at once for interleaved rounds, hold far less (Σ batch × ~70 tokens).
        batch: max(&a.batch_sizes).max(a.scheme_batch),
        prompt: max(&a.prefill_lens).max(a.long_ctx),
        gen: 0,
        ppl_ctx: 0,
        kv_bytes: None,
    };
    let weights = super::memory::plan_decode_prefill(
        &location,
        &candle_core::Device::Cpu,
        a.weights.weights,
        a.weights.prefill_weights,
        &peak,
    )?;
    let (decode_dtype, prefill_dtype) = (weights.dtype("decode"), weights.dtype("prefill"));
    let decode = load(decode_dtype)?;
    let prefill = load(prefill_dtype)?;
    let text = decode.tokenizer.encode(wikitext::wikitext2_test_text())?;
    let spec = CalibrationSpec {
        prefill_lens: a.prefill_lens.clone(),
        batches: a.batch_sizes.clone(),
        short_ctx: SHORT_CTX,
        schemes: a.schemes.dtypes.0.clone(),
        scheme_batch: a.scheme_batch,
        long_ctx: a.long_ctx,
        repeats: a.repeats,
        step_repeats: a.step_repeats,
        trace: (a.trace_requests > 0).then(|| TraceSpec {
            clients: a.trace_clients.clone(),
            requests: a.trace_requests,
            input_len: a.trace_input_len.clone(),
            output_len: a.trace_output_len.clone(),
            // Not the shipped serve suites' seed 0: the trace is the calibration's own workload.
            seed: 7,
        }),
    };
    for s in &spec.schemes {
        s.validate(decode.model.config.head_dim)?;
    }
    let samples = match &a.from_timings {
        Some(path) => read_timings(path)?,
        None => {
            let bar = progress_bar(spec.units());
            let samples = measure(
                &prefill.model,
                &decode.model,
                &text,
                &spec,
                &BarProgress::new(bar.clone()),
            )?;
            bar.finish_and_clear();
            samples
        }
    };
    // The weights at their dtypes' nominal bytes per parameter, as `serve --simulate` charges
    // them (`model_shape`): the model's own count adds the tied head a second time (30 MB of
    // q8_0 for SmolLM2-135M), and a rate fitted to it made every simulated step of the same
    // model 0.7 ms fast (AMD EPYC, 2026-12-05: batch 1 at 6.4 ms simulated, 7.2 calibrated).
    // `native` weights are the file's own dtype (`model_shape` reads the geometry's).
    let geom = crate::model::geometry::for_model_arg(&a.model.model)?;
    let nominal = |d: crate::model::WeightDtype| match d {
        crate::model::WeightDtype::Native => geom.weight_dtype.clone(),
        d => d.to_string(),
    };
    // The fit sees every layer global (`fit` times no window): a hybrid model's window is
    // for the simulation to apply, not for the calibration's rates.
    let shape = ModelShape {
        window: None,
        ..super::serve::model_shape(
            &geom,
            Some(&nominal(decode_dtype)),
            Some(&nominal(prefill_dtype)),
        )?
    };
    let machine = Machine::probe();
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| format!("cpu-{}", machine.hostname));
    let description = format!(
        "{}, {} threads: kvbench's CPU serving path ({} decode, {} prefill weights)",
        machine.cpu, machine.threads, decode_dtype, prefill_dtype
    );
    let out = a.out.clone().unwrap_or_else(|| {
        PathBuf::from("reports")
            .join(format!("calibrate-{}", crate::util::time::now_compact()))
            .join("profile.toml")
    });
    let dir = out.parent().map_or(PathBuf::from("."), PathBuf::from);
    crate::report::run_dir::create_out(&dir)?;
    // The raw timings first: a fit that fails still leaves what was measured.
    write_timings(&dir.join("timings.csv"), &samples)?;
    let (mut profile, points) = fit(&name, &description, &shape, &samples)?;
    profile.weights_dtype = Some(nominal(decode_dtype));
    profile.prefill_weights_dtype = Some(nominal(prefill_dtype));
    let how = format!(
        "kvbench calibrate {} on {} ({} threads), model {} — fitted to the timings in \
         calibration.csv beside this file",
        crate::util::time::now_rfc3339(),
        machine.cpu,
        machine.threads,
        a.model.model
    );
    for f in [
        "memory_gib",
        "mem_bw_gb_s",
        "matmul_tflops",
        "efficiency",
        "overhead",
        "probe",
    ] {
        if f != "probe" || profile.probe.is_some() {
            profile.sources.insert(f.into(), how.clone());
        }
    }
    std::fs::write(&out, profile.to_toml()?).map_err(|e| crate::Error::io(&out, e))?;
    let csv_path = dir.join("calibration.csv");
    let mut w = csv::Writer::from_path(&csv_path)?;
    for p in &points {
        w.serialize(p)?;
    }
    w.flush()?;
    println!(
        "{:<28} {:>12} {:>12} {:>8}",
        "timing", "measured ms", "model ms", "error"
    );
    for p in &points {
        println!(
            "{:<28} {:>12.3} {:>12.3} {:>+7.1}%",
            p.what,
            p.measured_ms,
            p.predicted_ms,
            p.error_pct()
        );
    }
    println!(
        "probes: read {:.1} GB/s, GEMM {:.3} TFLOP/s; profile peaks {:.1} GB/s, {:.3} TFLOP/s",
        samples.probe_bw_gb_s, samples.probe_tflops, profile.mem_bw_gb_s, profile.matmul_tflops
    );
    for (phase, p) in &samples.probes {
        println!(
            "speed probe {:<22} prefill of {} tokens {:>7.1} ms, step of {} sequences {:>6.2} ms",
            if phase == "end" {
                "after the last phase:".to_string()
            } else {
                format!("before {phase}:")
            },
            crate::perf::SpeedProbe::PROMPT,
            p.prefill_ms,
            crate::perf::SpeedProbe::BATCH,
            p.step_ms
        );
    }
    // How far the machine's speed moved while it was calibrated: the largest probe over the
    // smallest, prefill and step apart.
    let spread = |f: fn(&crate::perf::SpeedProbe) -> f64| {
        let v = samples.probes.iter().map(|p| f(&p.1));
        let (lo, hi) = v.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        100.0 * (hi / lo - 1.0)
    };
    if samples.probes.len() > 1 {
        let (fill, step) = (spread(|p| p.prefill_ms), spread(|p| p.step_ms));
        println!(
            "speed probe spread: prefill {fill:.1} %, step {step:.1} % (largest ÷ smallest); \
             the profile keeps the mean"
        );
        if fill.max(step) > crate::report::warnings::DRIFT_PCT {
            eprintln!(
                "warning: the machine's speed drifted {:.0} % while it was calibrated (the speed \
                 probes above): the profile describes the mean of its phases; calibrate again \
                 when the probe holds steady for a profile you compare serving runs with",
                fill.max(step)
            );
        }
    }
    println!("wrote {} and {}", out.display(), csv_path.display());
    Ok(())
}

/// One timing of `kvbench calibrate` as `timings.csv` holds it: what ran (`prefill`, `decode`
/// at the short context, `scheme` at the long one, `trace_step` a serving trace's step with
/// its running sequences as the batch, their summed context as the tokens and the longest
/// prompt prefilled right before it, `trace_prefill` a serving trace's prefill of one
/// request, batch 1 and its prompt as the tokens), its batch and context, seconds (median; a
/// trace step's or trace prefill's own time).
#[derive(serde::Serialize, serde::Deserialize)]
struct Timing<K> {
    kind: K,
    scheme: String,
    batch: usize,
    tokens: usize,
    seconds: f64,
    /// A `trace_step`'s longest prompt prefilled since the step before, tokens (0: none, and
    /// every other kind; absent in files from before 2026-12-05).
    #[serde(default)]
    prompt: usize,
    /// A speed probe's phase, the one it was taken before (`end`: after the last); empty for
    /// every other kind (absent in files from before 2026-12-06).
    #[serde(default)]
    phase: String,
}

/// Writes every timing of `samples` to `path` (CSV, one row per timing; the probes as rows of
/// kind `probe_read_gb_s` / `probe_gemm_tflops` with the figure in `seconds`, each speed probe
/// as a `speed_probe_prefill` and a `speed_probe_step` row). Errors: I/O.
fn write_timings(
    path: &std::path::Path,
    samples: &crate::perf::fit::Samples,
) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    let row = |kind: &'static str, scheme: String, batch, tokens, seconds| Timing {
        kind,
        scheme,
        batch,
        tokens,
        seconds,
        prompt: 0,
        phase: String::new(),
    };
    w.serialize(row(
        "probe_read_gb_s",
        String::new(),
        0,
        0,
        samples.probe_bw_gb_s,
    ))?;
    w.serialize(row(
        "probe_gemm_tflops",
        String::new(),
        0,
        0,
        samples.probe_tflops,
    ))?;
    for (phase, p) in &samples.probes {
        let (b, t) = (
            crate::perf::SpeedProbe::BATCH,
            crate::perf::SpeedProbe::PROMPT,
        );
        for (kind, batch, tokens, ms) in [
            ("speed_probe_prefill", 1, t, p.prefill_ms),
            (
                "speed_probe_step",
                b,
                crate::perf::SpeedProbe::RUNNING_PROMPT,
                p.step_ms,
            ),
        ] {
            w.serialize(Timing {
                phase: phase.clone(),
                ..row(kind, "fp16".into(), batch, tokens, ms * 1e-3)
            })?;
        }
    }
    for &(t, s) in &samples.prefill {
        w.serialize(row("prefill", "fp16".into(), 1, t, s))?;
    }
    for &(b, c, s) in &samples.decode {
        w.serialize(row("decode", "fp16".into(), b, c, s))?;
    }
    for &(k, b, c, s) in &samples.scheme_steps {
        w.serialize(row("scheme", k.to_string(), b, c, s))?;
    }
    for &(b, t, before, after) in &samples.after_prefill {
        w.serialize(row("step_before_prefill", "fp16".into(), b, t, before))?;
        w.serialize(row("step_after_prefill", "fp16".into(), b, t, after))?;
    }
    for &(b, c, p, s) in &samples.trace {
        w.serialize(Timing {
            prompt: p,
            ..row("trace_step", "fp16".into(), b, c, s)
        })?;
    }
    for &(t, s) in &samples.trace_prefill {
        w.serialize(row("trace_prefill", "fp16".into(), 1, t, s))?;
    }
    w.flush()?;
    Ok(())
}

/// The timings a `timings.csv` holds (what [`write_timings`] wrote). Errors:
/// [`crate::Error::InvalidArgument`] (`--from-timings`) naming the file and the row for an
/// unreadable row, an unknown kind or scheme, a non-positive time; the CSV reader's.
fn read_timings(path: &std::path::Path) -> anyhow::Result<crate::perf::fit::Samples> {
    let bad = |reason: String| crate::Error::InvalidArgument {
        name: "--from-timings".into(),
        reason: format!("{}: {reason}", path.display()),
    };
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(e.to_string()))?;
    let mut s = crate::perf::fit::Samples::default();
    let (mut before, mut probe_prefill) = (Vec::new(), Vec::new());
    for (i, row) in r.deserialize::<Timing<String>>().enumerate() {
        let line = i + 2;
        let t = row.map_err(|e| bad(format!("row {line}: {e}")))?;
        if !(t.seconds.is_finite() && t.seconds > 0.0) {
            return Err(bad(format!(
                "row {line}: {} is not a positive figure",
                t.seconds
            ))
            .into());
        }
        match t.kind.as_str() {
            "probe_read_gb_s" => s.probe_bw_gb_s = t.seconds,
            "probe_gemm_tflops" => s.probe_tflops = t.seconds,
            "speed_probe_prefill" => probe_prefill.push((t.phase, t.seconds * 1e3)),
            "speed_probe_step" => {
                let (phase, prefill_ms) = probe_prefill
                    .pop()
                    .filter(|(phase, _)| *phase == t.phase)
                    .ok_or_else(|| {
                        bad(format!(
                            "row {line}: a speed_probe_step row (phase `{}`) with no \
                             speed_probe_prefill row of its phase right before it",
                            t.phase
                        ))
                    })?;
                s.probes.push((
                    phase,
                    crate::perf::SpeedProbe {
                        prefill_ms,
                        step_ms: t.seconds * 1e3,
                    },
                ));
            }
            "prefill" => s.prefill.push((t.tokens, t.seconds)),
            "decode" => s.decode.push((t.batch, t.tokens, t.seconds)),
            "trace_step" if t.batch == 0 || t.tokens < t.batch => {
                return Err(bad(format!(
                    "row {line}: a trace_step of {} sequences holding {} tokens in all (each \
                     sequence holds at least one)",
                    t.batch, t.tokens
                ))
                .into())
            }
            "trace_step" => s.trace.push((t.batch, t.tokens, t.prompt, t.seconds)),
            "trace_prefill" if t.tokens == 0 => {
                return Err(bad(format!(
                    "row {line}: a trace_prefill of 0 tokens (a prefill runs one or more)"
                ))
                .into())
            }
            "trace_prefill" => s.trace_prefill.push((t.tokens, t.seconds)),
            "step_before_prefill" => before.push((t.batch, t.tokens, t.seconds)),
            "step_after_prefill" => {
                let i = before
                    .iter()
                    .position(|b| (b.0, b.1) == (t.batch, t.tokens))
                    .ok_or_else(|| {
                        bad(format!(
                            "row {line}: a step_after_prefill row with no step_before_prefill \
                             row of batch {} and {} tokens before it",
                            t.batch, t.tokens
                        ))
                    })?;
                let (b, n, s0) = before.swap_remove(i);
                s.after_prefill.push((b, n, s0, t.seconds));
            }
            "after_prefill" => {
                return Err(bad(format!(
                    "row {line}: `after_prefill` rows come from a kvbench calibrate before \
                     2026-12-03, whose step after a prefill had no step before it to compare \
                     with; calibrate again"
                ))
                .into())
            }
            "scheme" => {
                let k = t
                    .scheme
                    .parse()
                    .map_err(|e| bad(format!("row {line}: {e}")))?;
                s.scheme_steps.push((k, t.batch, t.tokens, t.seconds));
            }
            k => {
                return Err(bad(format!(
                    "row {line}: unknown kind `{k}` (probe_read_gb_s, probe_gemm_tflops, \
                     speed_probe_prefill, speed_probe_step, prefill, decode, scheme, \
                     step_before_prefill, step_after_prefill, trace_step, trace_prefill)"
                ))
                .into())
            }
        }
    }
    if let Some((phase, _)) = probe_prefill.first() {
        return Err(bad(format!(
            "a speed_probe_prefill row (phase `{phase}`) with no speed_probe_step row after it"
        ))
        .into());
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timings.csv written by hand reads back to the samples it states; a bad kind and a
    /// zero time are refused naming the file and the row.
    #[test]
    fn timings_read_by_hand() {
        let dir = std::env::temp_dir().join(format!("kvbench-timings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("timings.csv");
        std::fs::write(
            &p,
            "kind,scheme,batch,tokens,seconds,prompt,phase\nprobe_read_gb_s,,0,0,9.5,0,\n\
             probe_gemm_tflops,,0,0,0.18,0,\nspeed_probe_prefill,fp16,1,128,0.25,0,prefills\n\
             speed_probe_step,fp16,4,32,0.0125,0,prefills\nprefill,fp16,1,32,0.15,0,\n\
             decode,fp16,4,37,0.02,0,\nscheme,int4,4,1029,0.03,0,\n\
             step_before_prefill,fp16,4,64,0.02,0,\nstep_after_prefill,fp16,4,64,0.035,0,\n\
             trace_prefill,fp16,1,200,0.4,0,\n",
        )
        .unwrap();
        let s = read_timings(&p).unwrap();
        assert_eq!(s.trace_prefill, vec![(200, 0.4)]);
        assert_eq!((s.probe_bw_gb_s, s.probe_tflops), (9.5, 0.18));
        assert_eq!(s.prefill, vec![(32, 0.15)]);
        assert_eq!(s.decode, vec![(4, 37, 0.02)]);
        let int4: crate::kv::KvScheme = "int4".parse().unwrap();
        assert_eq!(s.scheme_steps, vec![(int4, 4, 1029, 0.03)]);
        assert_eq!(s.after_prefill, vec![(4, 64, 0.02, 0.035)]);
        // Seconds in the file, ms in the probe.
        assert_eq!(
            s.probes,
            vec![(
                "prefills".to_string(),
                crate::perf::SpeedProbe {
                    prefill_ms: 250.0,
                    step_ms: 12.5
                }
            )]
        );
        std::fs::write(
            &p,
            "kind,scheme,batch,tokens,seconds\nspeed_probe_step,fp16,4,32,0.0125\n",
        )
        .unwrap();
        let e = read_timings(&p).unwrap_err().to_string();
        assert!(
            e.contains("row 2") && e.contains("speed_probe_prefill"),
            "{e}"
        );
        // A probe's two rows of different phases, or a prefill row alone, are refused.
        std::fs::write(
            &p,
            "kind,scheme,batch,tokens,seconds,prompt,phase\n\
             speed_probe_prefill,fp16,1,128,0.25,0,prefills\n\
             speed_probe_step,fp16,4,32,0.0125,0,end\n",
        )
        .unwrap();
        let e = read_timings(&p).unwrap_err().to_string();
        assert!(e.contains("row 3") && e.contains("`end`"), "{e}");
        std::fs::write(
            &p,
            "kind,scheme,batch,tokens,seconds,prompt,phase\n\
             speed_probe_prefill,fp16,1,128,0.25,0,end\n",
        )
        .unwrap();
        let e = read_timings(&p).unwrap_err().to_string();
        assert!(e.contains("no speed_probe_step"), "{e}");
        std::fs::write(
            &p,
            "kind,scheme,batch,tokens,seconds\ntrace_prefill,fp16,1,0,0.1\n",
        )
        .unwrap();
        let e = read_timings(&p).unwrap_err().to_string();
        assert!(e.contains("row 2") && e.contains("0 tokens"), "{e}");
        // A file from before the `prompt` and `phase` columns reads back.
        std::fs::write(
            &p,
            "kind,scheme,batch,tokens,seconds\nprefill,fp16,1,32,0.15\n",
        )
        .unwrap();
        let s = read_timings(&p).unwrap();
        assert_eq!((s.prefill, s.probes.len()), (vec![(32, 0.15)], 0));
        std::fs::write(&p, "kind,scheme,batch,tokens,seconds\nwarmup,,1,1,0.1\n").unwrap();
        let e = read_timings(&p).unwrap_err().to_string();
        assert!(
            e.contains("timings.csv") && e.contains("row 2") && e.contains("warmup"),
            "{e}"
        );
        std::fs::write(
            &p,
            "kind,scheme,batch,tokens,seconds\nprefill,fp16,1,32,0\n",
        )
        .unwrap();
        let e = read_timings(&p).unwrap_err().to_string();
        assert!(e.contains("row 2"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The default prompt lengths reach the longest recompute prefill of every shipped serve
    /// suite, read from the suite files: the largest prompt plus all but the last of the
    /// largest output (a preempted sequence still has a token to generate; 384 + 64 − 1 = 447
    /// in `suites/serve.toml`, 64 + 256 − 1 = 319 in `suites/serve-decode.toml`).
    #[test]
    fn prefill_lens_reach_the_longest_recompute() {
        let longest: usize = DEFAULT_PREFILL_LENS
            .split(',')
            .map(|t| t.parse::<usize>().unwrap())
            .max()
            .unwrap();
        let upper = |v: &toml::Value, key: &str| -> usize {
            let t = v[key].as_str().unwrap();
            t.rsplit("..").next().unwrap().trim().parse().unwrap()
        };
        let mut seen = 0;
        for e in std::fs::read_dir("suites").unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !(name.starts_with("serve") && name.ends_with(".toml")) {
                continue;
            }
            let v: toml::Value = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let recompute = upper(&v, "input-len") + upper(&v, "output-len") - 1;
            assert!(recompute <= longest, "{name}: {recompute} > {longest}");
            seen += 1;
        }
        assert!(seen >= 2, "{seen} serve suites");
    }
}
