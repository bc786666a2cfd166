//! Records the git revision the binary was built from, for `meta.json`; writes
//! `$OUT_DIR/kv_formats.h`, the kernels' format and eviction-mode ids, from the crate's own
//! table (src/kv/formats/gpu_ids.rs, included below); with the `cuda` feature, compiles every
//! `kernels/*.cu` to PTX with nvcc (embedded by `src/kv/cuda/device.rs`).

/// The table the crate uses too (`kv::formats::gpu`), compiled here on its own.
#[allow(dead_code)]
mod gpu_ids {
    include!("src/kv/formats/gpu_ids.rs");
}

fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=src/kv/formats/gpu_ids.rs");
    let header = out.join("kv_formats.h");
    let text = gpu_ids::gpu_header();
    // Rewritten only when it changes, so nvcc's inputs keep their timestamps.
    if std::fs::read_to_string(&header).ok().as_deref() != Some(text.as_str()) {
        std::fs::write(&header, text).expect("write kv_formats.h to OUT_DIR");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        compile_kernels(&out);
    }
    let rev = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dirty = std::process::Command::new("git")
        // --no-optional-locks: do not refresh .git/index, which would re-trigger this script.
        .args([
            "--no-optional-locks",
            "status",
            "--porcelain",
            "--untracked-files=no",
        ])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    let rev = if dirty { format!("{rev}-dirty") } else { rev };
    println!("cargo:rustc-env=KVBENCH_GIT_REV={rev}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}

/// nvcc: `$NVCC`, else `$CUDA_ROOT/bin/nvcc` (or CUDA_PATH/CUDA_HOME), else `nvcc` on PATH.
fn nvcc() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("NVCC") {
        return p.into();
    }
    for var in ["CUDA_ROOT", "CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = std::env::var_os(var) {
            let p = std::path::Path::new(&root).join("bin").join("nvcc");
            if p.exists() {
                return p;
            }
        }
    }
    "nvcc".into()
}

/// Compiles `kernels/*.cu` to `$OUT_DIR/<name>.ptx` for `sm_$CUDA_COMPUTE_CAP` (default 90,
/// Hopper), with `$OUT_DIR` on the include path for kv_formats.h. `--fmad=false` keeps multiply
/// and add separately rounded, as in the CPU encoders the kernels must match bit for bit.
fn compile_kernels(out: &std::path::Path) {
    for var in [
        "NVCC",
        "CUDA_ROOT",
        "CUDA_PATH",
        "CUDA_HOME",
        "CUDA_COMPUTE_CAP",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=kernels");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap = cap.trim().trim_start_matches("sm_").to_string();
    let nvcc = nvcc();
    let mut sources: Vec<_> = std::fs::read_dir("kernels")
        .expect("kernels/ exists in the source tree")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for src in sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let ptx = out.join(src.with_extension("ptx").file_name().expect("file name"));
        let status = std::process::Command::new(&nvcc)
            .args([
                "--ptx",
                &format!("-arch=sm_{cap}"),
                "-std=c++20",
                "-O3",
                "--fmad=false",
            ])
            .arg("-I")
            .arg(out)
            .args(["-lineinfo", "-o"])
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run nvcc ({}): {e}. Install a CUDA toolkit or run \
                     `source scripts/cuda-toolchain.sh` (CUDA 13.0 from PyPI), or build without \
                     --features cuda",
                    nvcc.display()
                )
            });
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}
