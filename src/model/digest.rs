//! The sha256 of model files recorded in every run's `meta.json` (and compared on `--resume`
//! and by `gate`), computed once per file version: a file is hashed over its mapped pages (the
//! same pages the loader reads next, so the pass also pages the weights in), and the digest is
//! kept in `<data dir>/sha256-cache.json` under the file's canonical path, length, modification
//! time (ns) and inode — the key `make`, `rsync` and ccache-style tools trust to say a file has
//! not changed. A file rewritten in place gets a new mtime and is hashed again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// One cached digest and the file version it belongs to.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Entry {
    len: u64,
    mtime_ns: u128,
    inode: u64,
    sha256: String,
}

/// The cache file: canonical path → entry.
type Cache = BTreeMap<String, Entry>;

/// sha256 of `path`, hex, from the cache in [`super::fetch::data_dir`] when the file's length,
/// mtime and inode are unchanged, else computed (and the cache updated; a cache that cannot be
/// written costs only the next run's hashing). Errors: [`Error::Io`] when the file cannot be
/// read or mapped.
pub fn sha256_cached(path: &Path) -> Result<String> {
    sha256_cached_in(&super::fetch::data_dir().join("sha256-cache.json"), path)
}

/// [`sha256_cached`] with the cache at `cache_file`.
pub fn sha256_cached_in(cache_file: &Path, path: &Path) -> Result<String> {
    let key = std::fs::canonicalize(path).map_err(|e| Error::io(path, e))?;
    let stamp = version(&key)?;
    let mut cache = read_cache(cache_file);
    let name = key.display().to_string();
    if let Some(e) = cache.get(&name) {
        if (e.len, e.mtime_ns, e.inode) == (stamp.len, stamp.mtime_ns, stamp.inode) {
            return Ok(e.sha256.clone());
        }
    }
    let sha256 = sha256_mapped(&key)?;
    // The file may have changed while it was hashed: cache only a digest of one version.
    if version(&key)? == stamp {
        cache.insert(
            name,
            Entry {
                sha256: sha256.clone(),
                ..stamp
            },
        );
        write_cache(cache_file, &cache);
    }
    Ok(sha256)
}

/// sha256 over the file's mapped pages (sha2 uses the CPU's SHA extensions where present).
fn sha256_mapped(path: &Path) -> Result<String> {
    let map = super::mapped::map_file(path)?;
    let mut hasher = Sha256::new();
    for chunk in map.chunks(1 << 24) {
        hasher.update(chunk);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// The file's version: length, mtime in ns since the epoch, inode (0 where there is none).
fn version(path: &Path) -> Result<Entry> {
    let m = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let mtime_ns = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let inode = 0;
    Ok(Entry {
        len: m.len(),
        mtime_ns,
        inode,
        sha256: String::new(),
    })
}

fn read_cache(file: &Path) -> Cache {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes through a temporary file and a rename, so a reader never sees half a cache.
fn write_cache(file: &Path, cache: &Cache) {
    let Some(dir) = file.parent() else { return };
    let _ = std::fs::create_dir_all(dir);
    let tmp: PathBuf = dir.join(format!(".sha256-cache.{}.tmp", std::process::id()));
    if let Ok(bytes) = serde_json::to_vec_pretty(cache) {
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FIPS 180-2 appendix B.1: sha256("abc"). The cached digest is returned while the file's
    /// version is unchanged (shown by planting a wrong digest in the cache), and recomputed when
    /// the file is rewritten.
    #[test]
    fn cached_until_the_file_changes() {
        let dir = std::env::temp_dir().join(format!("kvbench-digest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cache, f) = (dir.join("cache.json"), dir.join("m.gguf"));
        std::fs::write(&f, b"abc").unwrap();
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_cached_in(&cache, &f).unwrap(), abc);
        let mut c = read_cache(&cache);
        c.values_mut().next().unwrap().sha256 = "planted".into();
        write_cache(&cache, &c);
        assert_eq!(sha256_cached_in(&cache, &f).unwrap(), "planted");
        // Rewritten (other length, newer mtime): hashed again. FIPS 180-2 B.2's message.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(
            &f,
            b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        )
        .unwrap();
        assert_eq!(
            sha256_cached_in(&cache, &f).unwrap(),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
