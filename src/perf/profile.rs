//! Device profiles: what a device can do (memory, bandwidth, matmul throughput, link) and how
//! much of it kvbench's decode path reaches per term class ([`Efficiency`]), as data files with
//! a source for every number. Shipped: H100 SXM, H200, A100 80GB, L40S, B200 (published peak
//! figures, efficiencies assumed — `calibrated = false`, said in every output) in
//! `profiles/*.toml`; `kvbench calibrate` writes a measured one for the machine at hand. A user
//! profile is any file of the same form.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};

/// Fractions of each speed of light the decode path reaches, per term class (0 < e ≤ 1).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Reading the weights (a decode step's matrix–vector products), of the memory bandwidth.
    pub weights: f64,
    /// Matrix products when compute-bound (prefill, large batches), of the matmul peak.
    pub matmul: f64,
    /// The decode step's matrix products (another kernel than prefill's on some devices:
    /// kvbench's CPU decode runs Q8_0 dot products, its prefill an f32 GEMM); absent: `matmul`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_matmul: Option<f64>,
    /// The prefill's matrix products by prompt length, `[[tokens, efficiency], …]` with tokens
    /// rising: the efficiency measured at the nearest shapes (AIConfigurator's method: speed
    /// of light ÷ the efficiency measured at the nearest shape), interpolated so that the
    /// matmul time is linear in tokens between two lengths ([`interpolate`]) and held at the
    /// ends. Empty: `matmul` for every length. `kvbench calibrate` fills it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matmul_by_tokens: Vec<(u64, f64)>,
    /// The decode step's matrix products by batch size, `[[batch, efficiency], …]`, as
    /// `matmul_by_tokens`. Empty: `decode_matmul` (or `matmul`) for every batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decode_matmul_by_batch: Vec<(u64, f64)>,
    /// Reading cached K/V in attention, of the memory bandwidth, for a scheme not listed in
    /// `kv_read_by_scheme`.
    pub kv_read: f64,
    /// Per scheme (its printed name, e.g. `int4`): reading its cached K/V, dequantization
    /// included, of the memory bandwidth.
    #[serde(default)]
    pub kv_read_by_scheme: BTreeMap<String, f64>,
    /// Writing new K/V, of the memory bandwidth.
    pub kv_write: f64,
    /// Attention's arithmetic (QKᵀ and PV) when compute-bound (long prefills), of the matmul
    /// peak.
    pub attention: f64,
    /// Tensor-parallel all-reduce, of the link bandwidth.
    pub allreduce: f64,
}

impl Efficiency {
    /// The prefill matmuls' efficiency for `tokens` new tokens: `matmul_by_tokens` at that
    /// length ([`interpolate`], held at the ends), else `matmul`.
    pub fn prefill_matmul_at(&self, tokens: usize) -> f64 {
        interpolate(&self.matmul_by_tokens, tokens).unwrap_or(self.matmul)
    }

    /// The decode matmuls' efficiency at batch `batch`: `decode_matmul_by_batch` there, else
    /// `decode_matmul`, else `matmul`.
    pub fn decode_matmul_at(&self, batch: usize) -> f64 {
        interpolate(&self.decode_matmul_by_batch, batch)
            .or(self.decode_matmul)
            .unwrap_or(self.matmul)
    }
}

/// `table`'s efficiency at size `n` (tokens or batch), such that the matrix products' time,
/// proportional to `size / efficiency`, is linear in `n` between the two nearest sizes
/// (harmonic interpolation of the efficiency): `e(n) = n / ((1 − f)·n₀/e₀ + f·n₁/e₁)` with
/// `f = (n − n₀)/(n₁ − n₀)`; the end value beyond either end (time proportional to `n` there).
/// Between two sizes whose times do not fall and whose time per row does not rise — what
/// [`crate::perf::fit`]'s smoothing guarantees before a serving trace's correction — the
/// interpolated time keeps both properties
/// (a chord through two such points has a non-negative intercept); linear interpolation of the
/// efficiency in log n, used before, can dip between them. `None` for an empty table.
pub fn interpolate(table: &[(u64, f64)], n: usize) -> Option<f64> {
    let (first, last) = (table.first()?, table.last()?);
    let n = n.max(1) as f64;
    if n <= first.0 as f64 {
        return Some(first.1);
    }
    if n >= last.0 as f64 {
        return Some(last.1);
    }
    let i = table.iter().position(|&(m, _)| m as f64 >= n)?;
    let ((n0, e0), (n1, e1)) = (table[i - 1], table[i]);
    let (n0, n1) = (n0 as f64, n1 as f64);
    let f = (n - n0) / (n1 - n0);
    Some(n / ((1.0 - f) * n0 / e0 + f * n1 / e1))
}

/// Fixed costs, µs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overhead {
    /// Per forward pass (a decode step or one prefill): launches, sampling, scheduling.
    pub step_us: f64,
    /// Per layer of a forward pass (norms, RoPE, small kernels).
    pub layer_us: f64,
    /// Extra on a decode step that directly follows a prefill, µs: on a CPU the prefill
    /// streams its own weights (f32, 540 MB for the default model) through the last-level
    /// cache and pushes the decode weights out, so the next step fetches them from DRAM again
    /// (15–17 ms more per such step after prompts above 48 tokens in the serving runs of
    /// 2026-12-03, Intel Xeon, 2 threads; the step after it is back to normal). 0 when absent:
    /// a GPU reads its weights from HBM every step either way. With `after_prefill_by_prompt`,
    /// its value at the longest prompt.
    #[serde(default)]
    pub after_prefill_us: f64,
    /// `after_prefill_us` by the longest prompt prefilled since the previous step, `[tokens,
    /// µs]` rows with rising tokens (empty: `after_prefill_us` whatever the prompt). On the
    /// CPU it depends on the prompt: the serving runs of 2026-12-03 (Intel Xeon, 2 threads)
    /// paid 1.3 ms after prompts of up to 48 tokens but 15–17 ms after longer ones (likely
    /// cause, not verified: gemm 0.19 packs the weight matrix above `2·MR` rows). Linear
    /// between rows, the end values beyond them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_prefill_by_prompt: Vec<(u64, f64)>,
    /// Extra per token written (each prompt token of a prefill, each sequence's new token of a
    /// decode step), by scheme, µs (a scheme not listed: 0): the work beyond what the fp16
    /// cache does — encoding the token's K/V in the scheme's format, and on a decode step
    /// quantizing the queries to score keys on their codes. On the CPU path ~0.1 ms per token
    /// for int8-token and int4 (30 layers × 3 KV heads, Intel Xeon, 2 threads, 2026-12-03):
    /// more than their smaller reads save on a decode step below ~200 cached tokens, and 6 %
    /// of a prefill. `kvbench calibrate` fits it from each scheme's short-context decode step
    /// against fp16's in the same rounds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kv_encode_us_by_scheme: BTreeMap<String, f64>,
}

impl Overhead {
    /// The extra of a decode step after prefills whose longest prompt was `prompt` tokens
    /// (0: no prefill since the previous step), seconds: `after_prefill_by_prompt` at
    /// `prompt`, linear between its rows, else `after_prefill_us`.
    pub fn after_prefill_s(&self, prompt: usize) -> f64 {
        if prompt == 0 {
            return 0.0;
        }
        let t = &self.after_prefill_by_prompt;
        let us = match (t.first(), t.last()) {
            (Some(&(n0, v0)), _) if prompt as u64 <= n0 => v0,
            (_, Some(&(n1, v1))) if prompt as u64 >= n1 => v1,
            (Some(_), Some(_)) => {
                let i = t.iter().position(|&(n, _)| n >= prompt as u64).unwrap_or(0);
                let ((n0, v0), (n1, v1)) = (t[i - 1], t[i]);
                let f = (prompt as f64 - n0 as f64) / (n1 as f64 - n0 as f64);
                v0 + f * (v1 - v0)
            }
            _ => self.after_prefill_us,
        };
        us * 1e-6
    }
}

/// The link between the GPUs of a tensor-parallel group.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Bandwidth per GPU and direction, GB/s (10⁹ bytes/s).
    pub bw_gb_s: f64,
    /// Latency of one collective, µs.
    pub latency_us: f64,
}

/// A device profile (see the module docs). Every number > 0; overheads ≥ 0.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Short name (`h100-sxm`).
    pub name: String,
    /// What it is.
    pub description: String,
    /// Whether the efficiencies were measured on this device (`kvbench calibrate`); `false`:
    /// published peaks with assumed efficiencies, flagged "uncalibrated" in every output.
    pub calibrated: bool,
    /// Whether memory traffic and arithmetic overlap within an operation, as on GPUs (an op
    /// takes the larger of its two bounds, the roofline), or add up, as kvbench's CPU kernels
    /// measure (`false`). Default `true`.
    #[serde(default = "yes")]
    pub overlap: bool,
    /// Device memory, GiB (what the framework reports as total, e.g. 79.1 for an 80 GB part).
    pub memory_gib: f64,
    /// Peak memory bandwidth, GB/s.
    pub mem_bw_gb_s: f64,
    /// Peak dense matmul throughput in the weights' dtype (bf16 on GPUs), TFLOP/s.
    pub matmul_tflops: f64,
    /// The dtype the decode path's weights are read in on this device (`q8_0` for kvbench's
    /// CPU decode); absent: the model's own (bf16 for the shipped aliases), as vLLM serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_dtype: Option<String>,
    /// The dtype of the prefill's weights (`f32` for kvbench's CPU prefill); absent: as
    /// `weights_dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_weights_dtype: Option<String>,
    /// The tensor-parallel link; absent on a device that cannot run tensor parallelism.
    #[serde(default)]
    pub link: Option<Link>,
    /// What the decode path reaches of each peak.
    pub efficiency: Efficiency,
    /// Fixed costs.
    pub overhead: Overhead,
    /// The speed probe's timings on this machine when it was calibrated (`kvbench calibrate`:
    /// the mean of one probe before each phase and one after the last); absent on published
    /// profiles. `kvbench serve --simulate --speed-from` scales the simulation by a measured
    /// run's median probe against this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<SpeedProbe>,
    /// Where each number comes from, by field (`mem_bw_gb_s = "NVIDIA H100 datasheet"`).
    #[serde(default)]
    pub sources: BTreeMap<String, String>,
}

/// The speed probe: a fixed piece of the serving path timed on the machine at hand — the
/// median of [`SpeedProbe::ROUNDS`] prefills of a [`SpeedProbe::PROMPT`]-token prompt, and of
/// [`SpeedProbe::STEPS`] decode steps per round of a running batch of [`SpeedProbe::BATCH`]
/// fp16 sequences, each prefill right after those steps, as a serving prefill follows decode steps
/// (`crate::serve::calibrate::speed_probe`). Taken when `kvbench calibrate` fits a profile and
/// before every measured serving point, it says how fast the machine ran then: a shared VM
/// drifts by 10–30 % over half an hour (AMD EPYC, 2026-12-05: one calibration's steps
/// 1.00–1.20× slower in the serving runs after it, its prefills 11–30 % slower), more than
/// the simulation's targets allow, and the ratio of two probes separates that drift from the
/// model's own error. Times in ms (> 0).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedProbe {
    /// Median prefill of the probe's prompt, ms.
    pub prefill_ms: f64,
    /// Median decode step of the probe's running batch, ms.
    pub step_ms: f64,
}

impl SpeedProbe {
    /// Prompt tokens of the probe's prefills.
    pub const PROMPT: usize = 128;
    /// Sequences of the probe's running batch (prompts of [`SpeedProbe::RUNNING_PROMPT`]
    /// tokens).
    pub const BATCH: usize = 4;
    /// Prompt tokens of each sequence of the probe's running batch.
    pub const RUNNING_PROMPT: usize = 32;
    /// Rounds of timed steps and a timed prefill, after one untimed round (with 5 rounds of one
    /// step each, five probes of one idle minute ranged 11.0–16.8 ms per step).
    pub const ROUNDS: usize = 7;
    /// Timed decode steps per round.
    pub const STEPS: usize = 3;

    /// The mean of `probes` (None: none).
    pub fn mean(probes: &[SpeedProbe]) -> Option<SpeedProbe> {
        let n = probes.len() as f64;
        (!probes.is_empty()).then(|| SpeedProbe {
            prefill_ms: probes.iter().map(|p| p.prefill_ms).sum::<f64>() / n,
            step_ms: probes.iter().map(|p| p.step_ms).sum::<f64>() / n,
        })
    }

    /// The median of `probes`, prefill and step apart (type 7, [`crate::stats::percentile`];
    /// None: none).
    pub fn median(probes: &[SpeedProbe]) -> Option<SpeedProbe> {
        let mid = |f: fn(&SpeedProbe) -> f64| {
            let mut v: Vec<f64> = probes.iter().map(f).collect();
            crate::stats::percentile(&mut v, 50.0)
        };
        (!probes.is_empty()).then(|| SpeedProbe {
            prefill_ms: mid(|p| p.prefill_ms),
            step_ms: mid(|p| p.step_ms),
        })
    }

    /// How much slower this probe ran than `base` (whose times are > 0, as a checked profile's
    /// are): `(prefill ratio, step ratio)`, > 1 slower.
    pub fn slowdown(&self, base: &SpeedProbe) -> (f64, f64) {
        (
            self.prefill_ms / base.prefill_ms,
            self.step_ms / base.step_ms,
        )
    }

    /// How far this probe ran from `base`, the larger of its two ratios' distances from 1
    /// (0.2: 20 % off in prefill or step).
    pub fn drift(&self, base: &SpeedProbe) -> f64 {
        let (p, s) = self.slowdown(base);
        (p - 1.0).abs().max((s - 1.0).abs())
    }
}

fn yes() -> bool {
    true
}

/// The shipped profiles: `(name, TOML)`.
pub const SHIPPED: &[(&str, &str)] = &[
    ("h100-sxm", include_str!("../../profiles/h100-sxm.toml")),
    ("h200", include_str!("../../profiles/h200.toml")),
    ("a100-80gb", include_str!("../../profiles/a100-80gb.toml")),
    ("a100-40gb", include_str!("../../profiles/a100-40gb.toml")),
    ("l40s", include_str!("../../profiles/l40s.toml")),
    ("b200", include_str!("../../profiles/b200.toml")),
];

fn bad(name: &str, reason: String) -> Error {
    Error::InvalidArgument {
        name: name.into(),
        reason,
    }
}

impl DeviceProfile {
    /// A shipped profile by name, or a profile file at `spec`. Errors:
    /// [`Error::InvalidArgument`] (`--simulate`) naming the spec when it is neither (listing
    /// the shipped names), or the file and field as [`DeviceProfile::parse`].
    pub fn load(spec: &str) -> Result<DeviceProfile> {
        if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == spec) {
            return Self::parse(text, &format!("profiles/{spec}.toml"));
        }
        let path = Path::new(spec);
        if !path.is_file() {
            return Err(bad(
                "--simulate",
                format!(
                    "`{spec}` is neither a shipped profile ({}) nor a profile file; write one \
                     with `kvbench calibrate --out FILE` or copy a shipped one",
                    SHIPPED
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let text = crate::util::read_regular(path).map_err(|e| {
            bad(
                "--simulate",
                format!("{}: cannot read it ({e})", path.display()),
            )
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Reads a profile's TOML (`source` names it in errors) and checks it. Errors:
    /// [`Error::InvalidArgument`] naming the source and the missing, unknown or out-of-range
    /// field.
    pub fn parse(text: &str, source: &str) -> Result<DeviceProfile> {
        let p: DeviceProfile = toml::from_str(text).map_err(|e| {
            bad(
                "--simulate",
                format!("{source}: {}", e.to_string().trim_end()),
            )
        })?;
        p.validate().map_err(|e| match e {
            Error::InvalidArgument { reason, .. } => {
                bad("--simulate", format!("{source}: {reason}"))
            }
            e => e,
        })?;
        Ok(p)
    }

    /// Every rate and size finite and > 0, efficiencies in (0, 1], overheads finite and ≥ 0.
    /// Errors: [`Error::InvalidArgument`] naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        let positive = |field: &str, v: f64| -> Result<()> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(
                    "profile",
                    format!("`{field}` is {v}; it must be a number > 0"),
                ))
            }
        };
        let share = |field: &str, v: f64| -> Result<()> {
            if v.is_finite() && v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(bad(
                    "profile",
                    format!("`{field}` is {v}; an efficiency is a share in (0, 1]"),
                ))
            }
        };
        positive("memory_gib", self.memory_gib)?;
        positive("mem_bw_gb_s", self.mem_bw_gb_s)?;
        positive("matmul_tflops", self.matmul_tflops)?;
        if let Some(p) = &self.probe {
            positive("probe.prefill_ms", p.prefill_ms)?;
            positive("probe.step_ms", p.step_ms)?;
        }
        if let Some(l) = &self.link {
            positive("link.bw_gb_s", l.bw_gb_s)?;
            if !(l.latency_us.is_finite() && l.latency_us >= 0.0) {
                return Err(bad(
                    "profile",
                    format!("`link.latency_us` is {}; it must be ≥ 0", l.latency_us),
                ));
            }
        }
        let e = &self.efficiency;
        for (f, v) in [
            ("efficiency.weights", e.weights),
            ("efficiency.matmul", e.matmul),
            ("efficiency.kv_read", e.kv_read),
            ("efficiency.kv_write", e.kv_write),
            ("efficiency.attention", e.attention),
            ("efficiency.allreduce", e.allreduce),
        ] {
            share(f, v)?;
        }
        if let Some(v) = e.decode_matmul {
            share("efficiency.decode_matmul", v)?;
        }
        let o = &self.overhead;
        let tables = [
            ("efficiency.matmul_by_tokens", &e.matmul_by_tokens),
            (
                "efficiency.decode_matmul_by_batch",
                &e.decode_matmul_by_batch,
            ),
            (
                "overhead.after_prefill_by_prompt",
                &o.after_prefill_by_prompt,
            ),
        ];
        for (f, table) in tables {
            for (i, &(n, _)) in table.iter().enumerate() {
                if n == 0 || (i > 0 && n <= table[i - 1].0) {
                    return Err(bad(
                        "profile",
                        format!("`{f}`: sizes must be > 0 and rising; entry {i} is {n}"),
                    ));
                }
            }
        }
        for (f, table) in &tables[..2] {
            for (i, &(_, v)) in table.iter().enumerate() {
                share(&format!("{f}[{i}]"), v)?;
            }
        }
        for (scheme, v) in &e.kv_read_by_scheme {
            share(&format!("efficiency.kv_read_by_scheme.{scheme}"), *v)?;
        }
        // Overheads, µs: any number ≥ 0.
        let named = [
            ("overhead.step_us".to_string(), o.step_us),
            ("overhead.layer_us".to_string(), o.layer_us),
            ("overhead.after_prefill_us".to_string(), o.after_prefill_us),
        ];
        let tabled = o.after_prefill_by_prompt.iter().enumerate();
        let overheads = named
            .into_iter()
            .chain(tabled.map(|(i, &(_, v))| (format!("overhead.after_prefill_by_prompt[{i}]"), v)))
            .chain(
                o.kv_encode_us_by_scheme
                    .iter()
                    .map(|(k, &v)| (format!("overhead.kv_encode_us_by_scheme.{k}"), v)),
            );
        for (f, v) in overheads {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(
                    "profile",
                    format!("`{f}` is {v}; it must be a number ≥ 0"),
                ));
            }
        }
        Ok(())
    }

    /// The profile as TOML (what `kvbench calibrate` writes). Errors: the serializer's (none
    /// for a valid profile).
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).map_err(|e| bad("profile", e.to_string()))
    }

    /// `name` and whether it is calibrated, for titles and rows: `h100-sxm (uncalibrated)`.
    pub fn label(&self) -> String {
        if self.calibrated {
            self.name.clone()
        } else {
            format!("{} (uncalibrated)", self.name)
        }
    }

    /// Device memory, bytes.
    pub fn memory_bytes(&self) -> u64 {
        (self.memory_gib * (1u64 << 30) as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shipped profile reads and validates, is marked uncalibrated and names a source for
    /// each peak figure.
    #[test]
    fn shipped_profiles_read() {
        for (name, _) in SHIPPED {
            let p = DeviceProfile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&p.name, name);
            assert!(!p.calibrated, "{name}");
            for f in ["memory_gib", "mem_bw_gb_s", "matmul_tflops"] {
                assert!(p.sources.contains_key(f), "{name}: no source for {f}");
            }
        }
    }

    /// Interpolation by hand: 1 token at 0.2 and 100 at 0.5 take 1/0.2 = 5 and 100/0.5 = 200
    /// time units; 10 tokens lie 9/99 of the way, 5 + 195·9/99 = 22.727 units, so 10/22.727 =
    /// 0.44; below and above, the ends; a table that does not rise is refused.
    #[test]
    fn tables_interpolate_time_linearly() {
        let t = [(1u64, 0.2), (100, 0.5)];
        assert_eq!(interpolate(&t, 1), Some(0.2));
        assert!((interpolate(&t, 10).unwrap() - 0.44).abs() < 1e-12);
        assert_eq!(interpolate(&t, 1000), Some(0.5));
        assert_eq!(interpolate(&[], 10), None);
        let mut p = DeviceProfile::parse(SHIPPED[0].1, "x").unwrap();
        p.efficiency.matmul_by_tokens = vec![(128, 0.5), (32, 0.4)];
        let e = p.validate().unwrap_err().to_string();
        assert!(
            e.contains("matmul_by_tokens") && e.contains("rising"),
            "{e}"
        );
        p.efficiency.matmul_by_tokens = vec![(32, 0.4), (128, 0.5)];
        let back = DeviceProfile::parse(&p.to_toml().unwrap(), "y").unwrap();
        assert_eq!(
            back.efficiency.prefill_matmul_at(64),
            p.efficiency.prefill_matmul_at(64)
        );
    }

    /// A missing field, an unknown one, a zero bandwidth, an efficiency above 1 and an
    /// after-prefill table whose prompts fall or start at 0 or whose extra is negative are
    /// refused, each naming the field (and the file).
    #[test]
    fn bad_profiles_are_named() {
        let good = SHIPPED[0].1;
        let p = DeviceProfile::parse(&good.replace("mem_bw_gb_s = ", "# "), "x.toml");
        let e = p.unwrap_err().to_string();
        assert!(e.contains("mem_bw_gb_s") && e.contains("x.toml"), "{e}");
        let e = DeviceProfile::parse(&format!("{good}\nbogus = 1\n"), "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let mut p = DeviceProfile::parse(good, "x").unwrap();
        p.mem_bw_gb_s = 0.0;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("mem_bw_gb_s") && e.contains("> 0"), "{e}");
        let mut p = DeviceProfile::parse(good, "x").unwrap();
        p.efficiency.kv_read = 1.5;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("efficiency.kv_read"), "{e}");
        for table in [
            vec![(64, 10.0), (32, 20.0)],
            vec![(0, 1.0)],
            vec![(32, -1.0)],
        ] {
            let mut p = DeviceProfile::parse(good, "x").unwrap();
            p.overhead.after_prefill_by_prompt = table;
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains("after_prefill_by_prompt"), "{e}");
        }
        for (prefill_ms, step_ms, field) in [
            (0.0, 12.0, "probe.prefill_ms"),
            (250.0, f64::NAN, "probe.step_ms"),
        ] {
            let mut p = DeviceProfile::parse(good, "x").unwrap();
            p.probe = Some(SpeedProbe {
                prefill_ms,
                step_ms,
            });
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = DeviceProfile::parse(&format!("{good}\n[probe]\nprefill_ms = 250\n"), "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("step_ms") && e.contains("x.toml"), "{e}");
        let e = DeviceProfile::load("h900").unwrap_err().to_string();
        assert!(e.contains("h100-sxm") && e.contains("h900"), "{e}");
    }

    /// A probe's mean, slowdown, drift and median by hand: (200, 10) and (300, 14) ms average
    /// to (250, 12); (300, 18) against that is 1.2× the prefill and 1.5× the step, a drift of
    /// 0.5; (200, 12) 0.8× and 1×, a drift of 0.2.
    #[test]
    fn speed_probes_by_hand() {
        let p = |prefill_ms, step_ms| SpeedProbe {
            prefill_ms,
            step_ms,
        };
        let m = SpeedProbe::mean(&[p(200.0, 10.0), p(300.0, 14.0)]).unwrap();
        assert_eq!(m, p(250.0, 12.0));
        assert_eq!(SpeedProbe::mean(&[]), None);
        let (a, b) = p(300.0, 18.0).slowdown(&m);
        assert!((a - 1.2).abs() < 1e-12 && (b - 1.5).abs() < 1e-12);
        assert!((p(300.0, 18.0).drift(&m) - 0.5).abs() < 1e-12);
        assert!((p(200.0, 12.0).drift(&m) - 0.2).abs() < 1e-12);
        // Medians apart: of (200, 14), (300, 10), (250, 30) → (250, 14); of two, the means.
        let three = [p(200.0, 14.0), p(300.0, 10.0), p(250.0, 30.0)];
        assert_eq!(SpeedProbe::median(&three), Some(p(250.0, 14.0)));
        assert_eq!(SpeedProbe::median(&three[..2]), Some(p(250.0, 12.0)));
        assert_eq!(SpeedProbe::median(&[]), None);
    }
}
