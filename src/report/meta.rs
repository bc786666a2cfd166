//! `meta.json`: every choice that changes a number, so a result can be traced and reproduced.

use std::path::Path;

use crate::error::{Error, Result};
use crate::util::memory;

/// kvbench's version and the git revision it was built from (`-dirty` if uncommitted changes).
pub fn version() -> String {
    format!(
        "{} ({})",
        env!("CARGO_PKG_VERSION"),
        env!("KVBENCH_GIT_REV")
    )
}

/// The machine a run happened on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// CPU model name (`/proc/cpuinfo`).
    pub cpu: String,
    /// Logical CPUs visible to the process.
    pub logical_cpus: usize,
    /// Worker threads kvbench used (rayon pool; candle's matmuls use the same count).
    pub threads: usize,
    /// Total memory, bytes.
    pub memory_bytes: Option<u64>,
    /// SIMD features the binary was compiled to use.
    pub simd: Vec<&'static str>,
    /// Operating system and architecture.
    pub os: String,
    /// Host name.
    pub hostname: String,
}

impl Machine {
    /// Probes the current machine.
    pub fn probe() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let mut simd = Vec::new();
        if cfg!(target_feature = "avx2") {
            simd.push("avx2");
        }
        if cfg!(target_feature = "fma") {
            simd.push("fma");
        }
        if cfg!(target_feature = "f16c") {
            simd.push("f16c");
        }
        if cfg!(target_feature = "avx512f") {
            simd.push("avx512f");
        }
        if cfg!(target_feature = "neon") {
            simd.push("neon");
        }
        Machine {
            cpu,
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads: rayon::current_num_threads(),
            memory_bytes: memory::total_bytes(),
            simd,
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        }
    }
}


/// Writes `value` as pretty JSON to `path` (atomically: temp file, then rename).
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::io(path, e.into()))?;
    // A failed write (disk full) or rename leaves no stray temp file behind.
    let result = std::fs::write(&tmp, text + "\n")
        .map_err(|e| Error::io(&tmp, e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
