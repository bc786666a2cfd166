//! The CUDA kernels of kernels/kv_cache.cu, run on the CPU, against the CPU [`KvCache`]: no GPU
//! and no nvcc needed, only g++ (C++20), so kernel bugs are found before GPU time is spent.
//!
//! kernels/emu/cuda_emu.h makes the .cu compile as host C++ and runs every CUDA thread of a block
//! as its own thread of execution with real barriers (`__syncthreads`, per-warp shuffles);
//! kernels/emu/harness.cpp executes the launch plan `CudaKvCache` runs (src/kv/cuda/plan.rs:
//! allocations, capacity growth, grid and block sizes, argument values — computed here by the
//! same `Planner`, not re-implemented in C++) for one scenario and writes the attention outputs
//! and the buffers the checks read (row counts, positions, code and scale planes). Per scenario
//! this test checks, against the CPU cache fed the same inputs:
//! - every attention output (a 70-token prefill, then single-token decode steps; a chunked
//!   prefill after that where the cache grows with rows held) is written (outputs start as NaN)
//!   and within 2e-3 of the output's largest magnitude;
//! - the rows the kernels stored are byte for byte the CPU encoders' rows (src/kv/formats/) of
//!   the input each slot holds, for every per-token format;
//! - the positions held after eviction (window, H2O) are the CPU cache's, and the device row
//!   counts equal the host mirror `CudaKvCache` sizes its launches with;
//! - no kernel writes outside a buffer (guard bytes around each, checked after every launch)
//!   and no barrier deadlocks.
//!
//! Schedulers: fibers (every CUDA thread a user-mode context, switched at the barriers in a
//! random order; fast, used for the full matrix), OS threads (one std::jthread per CUDA thread:
//! real concurrency, about 25× slower per barrier phase, used on small shapes), and OS threads under
//! ThreadSanitizer (tiny shapes; any data race between CUDA threads fails). Without g++ the
//! tests print SKIPPED and pass (the ThreadSanitizer one also without libtsan).
//!
//! `KVBENCH_EMU_SCHEMES="fp16 q4_0"` runs only the named schemes (when iterating on a kernel).

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kvbench::kv::cuda::plan::{self, Buf, Kind, Planner};
use kvbench::kv::formats::gpu::KV_FORMATS_H;
use kvbench::kv::{CacheGeometry, KvCache, KvScheme};
use rand::rngs::StdRng;
use rand::SeedableRng;
use sha2::{Digest, Sha256};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SOURCES: [&str; 3] = [
    "kernels/kv_cache.cu",
    "kernels/emu/cuda_emu.h",
    "kernels/emu/harness.cpp",
];
/// `-ffp-contract=off`: the rounding of nvcc --fmad=false (no contraction into FMA). The
/// warnings left out are CUDA idioms (`#pragma unroll`, `threadIdx.x < int`).
const CXXFLAGS: [&str; 7] = [
    "-std=c++20",
    "-O2",
    "-pthread",
    "-ffp-contract=off",
    "-Wall",
    "-Wno-unknown-pragmas",
    "-Wno-sign-compare",
];
/// ThreadSanitizer build (for the OS-thread scheduler): every unsynchronized pair of accesses
/// to shared memory or global buffers between two CUDA threads is reported, whatever the
/// interleaving; the first report fails the run.
const TSAN_FLAGS: [&str; 3] = ["-fsanitize=thread", "-g", "-O1"];
const TSAN_OPTIONS: &str = "halt_on_error=1:exitcode=66";
/// Longest one harness run may take before it counts as hung (a deadlock under OS threads).
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether g++ runs here (else every test prints SKIPPED and passes).
fn gxx() -> bool {
    static G: OnceLock<bool> = OnceLock::new();
    *G.get_or_init(|| {
        let ok = Command::new("g++").arg("--version").output().is_ok();
        if !ok {
            eprintln!("SKIPPED: g++ not found");
        }
        ok
    })
}

/// The harness built with `flags` (cached under target/tmp by a hash of its sources and
/// flags); g++'s messages when it does not build.
fn build(name: &str, flags: &[&str]) -> Result<PathBuf, String> {
    let mut h = Sha256::new();
    for s in SOURCES {
        h.update(std::fs::read(Path::new(ROOT).join(s)).unwrap());
    }
    h.update(KV_FORMATS_H);
    h.update(flags.join(" "));
    let hash: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernels_emu");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(format!("{name}-{hash}"));
    if exe.exists() {
        return Ok(exe);
    }
    let t = Instant::now();
    let tmp = dir.join(format!("{name}-{hash}.{}", std::process::id()));
    // kv_formats.h as build.rs generated it from the crate's id table (kernels include it).
    let include = dir.join(format!("include-{hash}.{}", std::process::id()));
    std::fs::create_dir_all(&include).unwrap();
    std::fs::write(include.join("kv_formats.h"), KV_FORMATS_H).unwrap();
    let out = Command::new("g++")
        .args(flags)
        .arg("-I")
        .arg(&include)
        .arg(Path::new(ROOT).join("kernels/emu/harness.cpp"))
        .arg("-o")
        .arg(&tmp)
        .output()
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&include).ok();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    std::fs::rename(&tmp, &exe).unwrap();
    eprintln!(
        "built {} in {:.1} s",
        exe.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(exe)
}

/// The harness, built once per test binary; `None` when g++ is missing.
fn harness() -> Option<&'static Path> {
    static H: OnceLock<Option<PathBuf>> = OnceLock::new();
    H.get_or_init(|| {
        gxx().then(|| {
            build("harness", &CXXFLAGS)
                .unwrap_or_else(|e| panic!("building the kernel harness failed:\n{e}"))
        })
    })
    .as_deref()
}

/// The harness under ThreadSanitizer; `None` (SKIPPED) when g++ is missing or cannot build or
/// run ThreadSanitizer binaries here (no libtsan, or an address-space layout it rejects).
fn harness_tsan() -> Option<&'static Path> {
    static H: OnceLock<Option<PathBuf>> = OnceLock::new();
    H.get_or_init(|| {
        // A harness that builds without TSan but not with it lacks the toolchain part only.
        harness()?;
        let flags: Vec<&str> = CXXFLAGS.iter().chain(&TSAN_FLAGS).copied().collect();
        let exe = match build("harness-tsan", &flags) {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("SKIPPED: g++ cannot build with -fsanitize=thread here:\n{e}");
                return None;
            }
        };
        let out = Command::new(&exe).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("ThreadSanitizer") {
            eprintln!("SKIPPED: ThreadSanitizer binaries do not run here:\n{err}");
            return None;
        }
        Some(exe)
    })
    .as_deref()
}

/// One run: a scheme on a geometry, fed `forwards` tokens per forward, under a scheduler.
#[derive(Debug, Clone)]
struct Scenario {
    scheme: &'static str,
    geom: CacheGeometry,
    batch: usize,
    forwards: Vec<usize>,
    /// `CudaKvCache::new`'s capacity argument.
    capacity: usize,
    /// Multiprocessors of the emulated device (sets the split count of attention).
    sms: usize,
    /// "fibers", "threads", or "tsan" (threads in the ThreadSanitizer build).
    sched: &'static str,
    /// Seeds the inputs and the emulator's block order and thread interleaving.
    seed: u64,
}

impl Scenario {
    fn label(&self) -> String {
        let g = self.geom;
        format!(
            "{} d={} kv={}/q={} b={} L={} [{}…×{}] {}",
            self.scheme,
            g.head_dim,
            g.kv_heads,
            g.q_heads,
            self.batch,
            g.layers,
            self.forwards[0],
            self.forwards.len(),
            self.sched
        )
    }
}

/// The plan `CudaKvCache` runs for this scenario (poisoned attention outputs), as the harness
/// reads it, with `dump` lines for every buffer the checks read; and the planner after it.
fn plan_text(s: &Scenario, scheme: KvScheme) -> (String, Planner) {
    let (mut p, mut steps) = Planner::new(scheme, s.geom, s.batch, s.capacity, s.sms)
        .unwrap_or_else(|e| panic!("{}: no CUDA plan: {e}", s.scheme));
    p.poison_outputs(true);
    for &n in &s.forwards {
        for layer in 0..s.geom.layers {
            steps.extend(p.append(layer, n));
            steps.extend(p.attend(layer, n));
        }
    }
    let mut text = plan::script(&steps);
    for b in dumped(&p, s.geom.layers) {
        text.push_str(&format!("dump {b}\n"));
    }
    (text, p)
}

/// The buffers the checks read: per layer the row counts, positions (eviction schemes) and the
/// code and scale planes of per-token K and V.
fn dumped(p: &Planner, layers: usize) -> Vec<Buf> {
    let mut out = Vec::new();
    let at = |kind, layer| Buf {
        kind,
        layer,
        fresh: false,
    };
    for layer in 0..layers {
        out.push(at(Kind::Lens, layer));
        if p.scheme().evicts() {
            out.push(at(Kind::Pos, layer));
        }
        for value in [false, true] {
            if p.format(value).token_group == 1 {
                out.push(at(Kind::Codes(value), layer));
                out.push(at(Kind::Meta(value), layer));
            }
        }
    }
    out
}

/// Runs `exe` on `args` with a time limit, its stderr going to `log`; the first lines of
/// stderr on failure.
fn run_harness(exe: &Path, args: &[&OsStr], log: &Path) -> Result<(), String> {
    let mut child = Command::new(exe)
        .args(args)
        .env("TSAN_OPTIONS", TSAN_OPTIONS)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .map_err(|e| format!("cannot run the harness: {e}"))?;
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            return Err(format!(
                "no result after {RUN_TIMEOUT:?} (a deadlock: threads waiting at different barriers?)"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if status.success() {
        return Ok(());
    }
    // TSan's stack traces spell out every template: the first lines say where.
    let err = std::fs::read_to_string(log).unwrap_or_default();
    let head: Vec<String> = err
        .lines()
        .take(16)
        .map(|l| l.chars().take(160).collect())
        .collect();
    Err(format!("harness failed ({status}):\n{}", head.join("\n")))
}

/// A scratch directory of its own under target/tmp.
fn scratch() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "kernels_emu/run-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Runs one scenario through the CPU cache and the emulated kernels and compares them; the
/// worst relative attention error on success, every mismatch found on failure.
fn check(s: &Scenario) -> Result<f32, String> {
    let scheme: KvScheme = s.scheme.parse().unwrap();
    let g = s.geom;
    let (d, kvh, qh, batch) = (g.head_dim, g.kv_heads, g.q_heads, s.batch);
    let dir = scratch();
    let mut rng = StdRng::seed_from_u64(s.seed);
    let t = Instant::now();
    let mut cpu = KvCache::new(scheme, g, batch).unwrap();
    let mut inputs: Vec<u8> = Vec::new();
    let mut want: Vec<Vec<f32>> = Vec::new();
    // Every K and V row each (layer, bh) received, by absolute position.
    let mut sent_k = vec![vec![Vec::<Vec<f32>>::new(); batch * kvh]; g.layers];
    let mut sent_v = sent_k.clone();
    for &n in &s.forwards {
        for layer in 0..g.layers {
            let k = common::activations(&mut rng, batch * kvh * n * d, d);
            let v = common::activations(&mut rng, batch * kvh * n * d, d);
            let q = common::activations(&mut rng, batch * qh * n * d, d);
            for bh in 0..batch * kvh {
                for t in 0..n {
                    sent_k[layer][bh].push(k[(bh * n + t) * d..][..d].to_vec());
                    sent_v[layer][bh].push(v[(bh * n + t) * d..][..d].to_vec());
                }
            }
            for x in [&k, &v, &q] {
                inputs.extend(x.iter().flat_map(|f| f.to_le_bytes()));
            }
            cpu.append(layer, &k, &v, n);
            want.push(cpu.attend(layer, &q, n));
        }
    }
    let cpu_time = t.elapsed();
    let (scen, inp) = (dir.join("plan.txt"), dir.join("inputs.bin"));
    let (text, planner) = plan_text(s, scheme);
    std::fs::write(&scen, text).unwrap();
    std::fs::write(&inp, &inputs).unwrap();
    let (exe, sched) = match s.sched {
        "tsan" => (harness_tsan().expect("checked by the caller"), "threads"),
        other => (harness().expect("checked by the caller"), other),
    };
    let t = Instant::now();
    let seed = s.seed.to_string();
    run_harness(
        exe,
        &[
            scen.as_os_str(),
            inp.as_os_str(),
            dir.as_os_str(),
            sched.as_ref(),
            seed.as_ref(),
        ],
        &dir.join("stderr.txt"),
    )
    .map_err(|e| format!("{e}\n(inputs kept in {})", dir.display()))?;
    let kernel_time = t.elapsed();

    let mut problems = Vec::new();
    let attn = f32s(&std::fs::read(dir.join("attn.bin")).unwrap());
    let mut worst = 0f32;
    let mut at = 0;
    for (step, w) in want.iter().enumerate() {
        let got = &attn[at..at + w.len()];
        at += w.len();
        let (fwd, layer) = (step / g.layers, step % g.layers);
        if let Some(i) = got.iter().position(|x| x.is_nan()) {
            problems.push(format!(
                "forward {fwd} layer {layer}: output element {i} never written (NaN)"
            ));
            continue;
        }
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        let (i, diff) = got
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .fold((0, 0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m });
        let err = diff / scale;
        worst = worst.max(err);
        if err >= 2e-3 {
            problems.push(format!(
                "forward {fwd} (n={}) layer {layer}: relative error {err:.2e} at element {i} \
                 (kernel {}, cpu {})",
                s.forwards[fwd], got[i], w[i]
            ));
        }
    }
    assert_eq!(at, attn.len(), "attention output size");

    let dump = |b: Buf| std::fs::read(dir.join(format!("{b}.bin"))).unwrap();
    let u32s = |bytes: Vec<u8>| -> Vec<usize> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect()
    };
    let at = |kind, layer| Buf {
        kind,
        layer,
        fresh: false,
    };
    let cap = planner.cap();
    let mut rows_checked = 0;
    for layer in 0..g.layers {
        let lens = u32s(dump(at(Kind::Lens, layer)));
        let all_pos = scheme.evicts().then(|| u32s(dump(at(Kind::Pos, layer))));
        let planes: Vec<Option<(Vec<u8>, Vec<u8>)>> = [false, true]
            .into_iter()
            .map(|value| {
                (planner.format(value).token_group == 1).then(|| {
                    (
                        dump(at(Kind::Codes(value), layer)),
                        dump(at(Kind::Meta(value), layer)),
                    )
                })
            })
            .collect();
        for b in 0..batch {
            for h in 0..kvh {
                let bh = b * kvh + h;
                let held = planner.held(b);
                let here = format!("layer {layer} b={b} h={h}");
                if held != lens[bh] {
                    problems.push(format!(
                        "{here}: device holds {} rows, the host mirror {held}",
                        lens[bh]
                    ));
                }
                let pos: Vec<usize> = match &all_pos {
                    Some(p) => p[bh * cap..bh * cap + held].to_vec(),
                    None => (0..held).collect(),
                };
                let mut sorted = pos.clone();
                sorted.sort_unstable();
                if sorted != cpu.held_positions(layer, b, h) {
                    problems.push(format!(
                        "{here}: positions held {sorted:?}, cpu {:?}",
                        cpu.held_positions(layer, b, h)
                    ));
                }
                for (value, q, sent) in [
                    (false, scheme.k, &sent_k[layer][bh]),
                    (true, scheme.v, &sent_v[layer][bh]),
                ] {
                    let Some((codes, meta)) = &planes[value as usize] else {
                        continue;
                    };
                    let f = planner.format(value);
                    let (cb, mb) = (f.code_bytes(d), f.meta_bytes(d));
                    let rows = plan::rows_from_planes(
                        f,
                        d,
                        &codes[bh * cap * cb..],
                        &meta[bh * cap * mb..],
                        held,
                    );
                    for (slot, (row, &p)) in rows.iter().zip(&pos).enumerate() {
                        let expect = common::cpu_row_bytes(q, &sent[p]);
                        rows_checked += 1;
                        if row != &expect {
                            problems.push(format!(
                                "{here} {q} slot {slot} (position {p}): stored row differs from \
                                 the CPU encoder's\n kernel {row:?}\n cpu    {expect:?}"
                            ));
                        }
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        std::fs::remove_dir_all(&dir).ok();
        eprintln!(
            "ok  {:<60} max rel err {worst:.1e}, {rows_checked} rows identical \
             (cpu {:.1} s, kernels {:.1} s)",
            s.label(),
            cpu_time.as_secs_f64(),
            kernel_time.as_secs_f64()
        );
        Ok(worst)
    } else {
        problems.truncate(8);
        problems.push(format!("(inputs and outputs kept in {})", dir.display()));
        Err(problems.join("\n"))
    }
}

/// Checks every scenario on `workers` threads (each runs one harness process at a time) and
/// fails with every scenario's problems at once.
fn check_all(mut scenarios: Vec<Scenario>) {
    // KVBENCH_EMU_SCHEMES="fp16 q4_0" runs only those schemes (debugging a kernel change).
    if let Ok(only) = std::env::var("KVBENCH_EMU_SCHEMES") {
        scenarios.retain(|s| only.split_whitespace().any(|o| o == s.scheme));
    }
    let t = Instant::now();
    let n = scenarios.len();
    let queue = Mutex::new(scenarios.into_iter());
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                let Some(s) = queue.lock().unwrap().next() else {
                    break;
                };
                if let Err(e) = check(&s) {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("{}:\n{e}", s.label()));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {n} scenarios differ from the CPU cache:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    eprintln!("{n} scenarios in {:.1} s", t.elapsed().as_secs_f64());
}

const SCHEMES: [&str; 17] = [
    "fp16",
    "int8-token",
    "fp8",
    "fp8-e5m2",
    "int4",
    "int4:group=16",
    "q8_0",
    "q4_0",
    "int8-channel:group=32,residual=32",
    "int8-channel",
    "int8-token/int4",
    "h2o:budget=48,recent=16",
    "h2o",
    "window:size=40,sinks=4",
    "nvfp4",
    "mxfp4",
    "window:size=40,sinks=4@nvfp4/mxfp4",
];

fn geom(layers: usize, kv_heads: usize, q_heads: usize, head_dim: usize) -> CacheGeometry {
    CacheGeometry {
        layers,
        kv_heads,
        q_heads,
        head_dim,
        window: None,
    }
}

/// Every scheme on head_dim 64 (3 kv heads, 9 query heads), 128 (2 and 8) and 256 (1 and 4,
/// Gemma 3 270M's heads: the `d256` kernels), batch 2, 2 layers:
/// a 70-token prefill, 20 decode steps, then a 60-token chunked prefill (the cache grows from
/// 128 to 256 rows per head with 90 held) and 2 more decode steps (eviction schemes hold
/// fewer and do not grow); plus, for a few schemes, a 300-token prefill whose decode steps
/// split attention over the sequence in 3 (⌈301/128⌉, 132 multiprocessors: the FlashDecoding
/// combine across splits), and a 1,100-token one whose 9 splits are more than the combine's
/// 8 warps.
#[test]
fn kernels_match_the_cpu_cache() {
    if harness().is_none() {
        return;
    }
    let mut forwards = vec![70];
    forwards.extend([1; 20]);
    forwards.extend([60, 1, 1]);
    let mut scenarios = Vec::new();
    for (i, g) in [geom(2, 3, 9, 64), geom(2, 2, 8, 128), geom(2, 1, 4, 256)]
        .into_iter()
        .enumerate()
    {
        for scheme in SCHEMES {
            scenarios.push(Scenario {
                scheme,
                geom: g,
                batch: 2,
                forwards: forwards.clone(),
                capacity: 32,
                sms: 132,
                sched: "fibers",
                seed: 7 + i as u64,
            });
        }
    }
    for scheme in [
        "q4_0",
        "int8-channel:group=32,residual=32",
        "h2o:budget=200,recent=16",
    ] {
        scenarios.push(Scenario {
            scheme,
            geom: geom(1, 1, 2, 64),
            batch: 2,
            forwards: vec![300, 1, 1, 1],
            capacity: 32,
            sms: 132,
            sched: "fibers",
            seed: 11,
        });
    }
    // 1,100 tokens: ⌈1101/128⌉ = 9 splits per decode step, so the combine's first warp merges
    // two of them (splits 0 and 8) before the warps merge; at head_dim 64 (2 dims per lane)
    // and 128 (4).
    for (d, seed) in [(64, 13), (128, 14)] {
        scenarios.push(Scenario {
            scheme: "q4_0",
            geom: geom(1, 1, 2, d),
            batch: 1,
            forwards: vec![1100, 1, 1],
            capacity: 32,
            sms: 132,
            sched: "fibers",
            seed,
        });
    }
    check_all(scenarios);
}

/// The same checks with one OS thread per CUDA thread (real concurrency, so unsynchronized
/// shared-memory accesses race for real) on small shapes: every scheme, batch 2, 2 kv heads and
/// 4 query heads, a 12-token prefill and 3 decode steps (KIVI with groups of 4 tokens and a
/// residual of 4, so groups are quantized; windows and budgets scaled down to match).
#[test]
fn kernels_match_the_cpu_cache_on_os_threads() {
    if harness().is_none() {
        return;
    }
    let schemes = [
        "fp16",
        "int8-token",
        "fp8",
        "fp8-e5m2",
        "int4:group=16",
        "q8_0",
        "q4_0",
        "nvfp4",
        "mxfp4",
        "int8-channel:group=4,residual=4",
        "int8-token/int4",
        "h2o:budget=8,recent=3",
        "window:size=6,sinks=2",
    ];
    let scenarios = schemes
        .into_iter()
        .enumerate()
        .map(|(i, scheme)| Scenario {
            scheme,
            geom: geom(1, 2, 4, if i % 2 == 0 { 64 } else { 128 }),
            batch: 2,
            forwards: vec![12, 1, 1, 1],
            capacity: 32,
            sms: 132,
            sched: "threads",
            seed: 100 + i as u64,
        })
        .collect();
    check_all(scenarios);
}

/// ThreadSanitizer over the OS-thread scheduler on tiny shapes that still reach every kernel
/// (append for two formats, KIVI quantize and residual, attention with H2O logits, combine, H2O
/// scores, both evictions): a missing `__syncthreads` or a shared-memory race is reported with
/// its source line even when the interleaving happened to give the right numbers.
#[test]
fn kernels_have_no_data_races() {
    if harness_tsan().is_none() {
        return;
    }
    let schemes = [
        "h2o:budget=5,recent=2",
        "window:size=3,sinks=1@q4_0",
        "int8-channel:group=2,residual=2",
        "int4:group=16/fp8",
    ];
    let scenarios = schemes
        .into_iter()
        .enumerate()
        .map(|(i, scheme)| Scenario {
            scheme,
            geom: geom(1, 1, 2, 64),
            batch: 2,
            forwards: vec![6, 1, 1],
            capacity: 32,
            sms: 132,
            sched: "tsan",
            seed: 200 + i as u64,
        })
        .collect();
    check_all(scenarios);
}

/// The shim's FP8 conversions (cuda_emu.h: nearest value by table search, ties to even,
/// __NV_SATFINITE) agree with the float8 crate (a port of CUDA's cuda_fp8.hpp bit manipulation)
/// on every code's decoding and on values around every code: exact codes, midpoints (ties),
/// just beside them, subnormals, beyond the largest finite value, infinities and NaN.
#[test]
fn fp8_conversions_match_cuda() {
    if harness().is_none() {
        return;
    }
    let mut xs: Vec<f32> = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30];
    for c in 0..=255u8 {
        for v in [
            float8::F8E4M3::from_bits(c).to_f32(),
            float8::F8E5M2::from_bits(c).to_f32(),
        ] {
            if v.is_finite() {
                xs.extend([v, f32::from_bits(v.to_bits() + 1), v * 1.0625, v * 0.9375]);
            }
        }
    }
    for c in 0..127u8 {
        for (a, b) in [
            (
                float8::F8E4M3::from_bits(c).to_f32(),
                float8::F8E4M3::from_bits(c + 1).to_f32(),
            ),
            (
                float8::F8E5M2::from_bits(c).to_f32(),
                float8::F8E5M2::from_bits(c + 1).to_f32(),
            ),
        ] {
            if a.is_finite() && b.is_finite() {
                let mid = (a + b) / 2.0; // exact: fp8 values have few mantissa bits
                xs.extend([mid, -mid, mid.next_up(), mid.next_down()]);
            }
        }
    }
    xs.extend([
        448.0, 463.9, 464.0, 465.0, 1e6, 57344.0, 61439.0, 61440.0, 1e30,
    ]);
    let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
    xs.extend(neg);
    let dir = scratch();
    let (inp, out) = (dir.join("values.bin"), dir.join("codes.bin"));
    std::fs::write(
        &inp,
        xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    )
    .unwrap();
    let exe = harness().unwrap();
    let args = [OsStr::new("--fp8"), inp.as_os_str(), out.as_os_str()];
    run_harness(exe, &args, &dir.join("stderr.txt")).unwrap();
    let got = std::fs::read(&out).unwrap();
    let (codes, halves) = got.split_at(2 * xs.len());
    let mut bad = Vec::new();
    for (x, c) in xs.iter().zip(codes.chunks_exact(2)) {
        let want = [
            float8::F8E4M3::from_f32(*x).to_bits(),
            float8::F8E5M2::from_f32(*x).to_bits(),
        ];
        if c != want {
            bad.push(format!(
                "{x:e} ({:#010x}): shim {c:02x?}, float8 {want:02x?}",
                x.to_bits()
            ));
        }
    }
    for (c, h) in halves.chunks_exact(4).enumerate() {
        let got = [
            u16::from_le_bytes([h[0], h[1]]),
            u16::from_le_bytes([h[2], h[3]]),
        ];
        let want = [
            float8::F8E4M3::from_bits(c as u8).to_f16().to_bits(),
            float8::F8E5M2::from_bits(c as u8).to_f16().to_bits(),
        ];
        if got != want {
            bad.push(format!(
                "code {c:#04x} to f16: shim {got:04x?}, float8 {want:04x?}"
            ));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    bad.truncate(20);
    assert!(
        bad.is_empty(),
        "fp8 conversions differ:\n{}",
        bad.join("\n")
    );
    eprintln!("fp8: {} values and 256 codes agree with float8", xs.len());
}
