//! Weight bytes read in place from a memory-mapped model file, so every phase of a run (prefill,
//! decode, perplexity) that computes in the file's own format shares one copy: the kernel pages
//! of the file, counted once however many models use them.
//!
//! As llama.cpp does by default (`llama_model_loader` with `use_mmap`): the tensors' bytes stay
//! in the file's pages and the CPU kernels read them there; only a layer converted to another
//! format (f32 for exact quality numbers, Q8_0 from a 4-bit file) gets bytes of its own.
//!
//! One mapping per file per process ([`map_file`] hands out the same [`Mmap`] while any user
//! holds it), so two models of one file do not count its pages twice in the resident set.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::SystemTime;

use memmap2::Mmap;

use crate::error::{Error, Result};

/// Bytes of one weight tensor: its own allocation, or a range of a mapped file.
#[derive(Clone)]
pub struct WeightBytes(Repr);

#[derive(Clone)]
enum Repr {
    Owned(Arc<Vec<u8>>),
    Mapped { map: Arc<Mmap>, range: Range<usize> },
}

impl WeightBytes {
    /// Bytes kvbench allocated (a converted layer).
    pub fn owned(bytes: Vec<u8>) -> Self {
        WeightBytes(Repr::Owned(Arc::new(bytes)))
    }

    /// `range` of a mapped file. Returns `None` when the range runs past the mapping (a
    /// truncated file; the caller names it).
    pub fn mapped(map: Arc<Mmap>, range: Range<usize>) -> Option<Self> {
        (range.start <= range.end && range.end <= map.len())
            .then_some(WeightBytes(Repr::Mapped { map, range }))
    }

    /// Whether the bytes are the file's pages (no copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Repr::Mapped { .. })
    }
}

impl From<Vec<u8>> for WeightBytes {
    fn from(bytes: Vec<u8>) -> Self {
        WeightBytes::owned(bytes)
    }
}

impl std::ops::Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Owned(v) => v,
            Repr::Mapped { map, range } => &map[range.clone()],
        }
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "WeightBytes({kind}, {} bytes)", self.len())
    }
}

/// A file's identity for reuse: length and modification time.
type Stamp = (u64, Option<SystemTime>);

/// The mappings this process holds, by canonical path.
type Maps = Mutex<HashMap<PathBuf, (Stamp, Weak<Mmap>)>>;

fn maps() -> &'static Maps {
    static MAPS: OnceLock<Maps> = OnceLock::new();
    MAPS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Maps `path` read-only, or returns the mapping this process already holds of it (same length
/// and modification time). Pages are read on first touch (the kernel's read-ahead makes the
/// first pass a sequential read); see [`prefault`] to read them at load time.
///
/// Errors: [`Error::ModelNotFound`] when the file is missing, [`Error::Io`] when it cannot be
/// opened or mapped.
pub fn map_file(path: &Path) -> Result<Arc<Mmap>> {
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::ModelNotFound {
            model: path.display().to_string(),
            reason: format!("{e}; pass an existing .gguf file or a folder with config.json"),
        },
        _ => Error::io(path, e),
    })?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    let stamp = (meta.len(), meta.modified().ok());
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut held = maps().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((s, weak)) = held.get(&key) {
        if *s == stamp {
            if let Some(m) = weak.upgrade() {
                return Ok(m);
            }
        }
    }
    // SAFETY: mapped read-only; kvbench never writes model files, and a file changed on disk
    // by another program while mapped is the same hazard llama.cpp's mmap loading accepts.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?);
    held.retain(|_, (_, w)| w.strong_count() > 0);
    held.insert(key, (stamp, Arc::downgrade(&map)));
    Ok(map)
}

/// Reads every page of `map` now (sequentially, with the kernel's read-ahead: `MADV_WILLNEED`
/// then one touch per 4 KiB page), so that loading costs one pass over the file at the disk's
/// speed and the first timed step does not page the weights in.
pub fn prefault(map: &Mmap) {
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::WillNeed);
    let mut acc = 0u8;
    for page in map.chunks(4096) {
        acc ^= page[0];
    }
    std::hint::black_box(acc);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_mapping_per_file_and_ranges_checked() {
        let dir = std::env::temp_dir().join(format!("kvbench-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("w.bin");
        std::fs::write(&p, (0u8..=255).collect::<Vec<_>>()).unwrap();
        let a = map_file(&p).unwrap();
        let b = map_file(&p).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "a second open reuses the live mapping");
        let w = WeightBytes::mapped(a.clone(), 10..14).unwrap();
        assert_eq!(&*w, &[10, 11, 12, 13]);
        assert!(w.is_mapped());
        assert!(WeightBytes::mapped(a, 250..257).is_none(), "past the end");
        assert!(!WeightBytes::owned(vec![1]).is_mapped());
        assert!(matches!(
            map_file(&dir.join("missing.gguf")),
            Err(Error::ModelNotFound { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
