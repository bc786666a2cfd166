//! Ground-floor helpers every layer may use and that know nothing about KV caches, models or
//! benchmarks: process memory probes, the UTC clock and run ids, the seeded generators
//! ([`noise`]: `Noise` and `SplitMix64`) and the one SIMD dispatch ([`simd`]).

pub mod memory;
pub mod nearest;
pub mod noise;
pub mod record;
pub mod serde_text;
pub mod simd;
pub mod size;
pub mod time;

/// Opens `path` for reading only if it is a regular file: a FIFO (or a device) given where a
/// results file, a meta.json or a text is expected would block forever or stream without end
/// (issue #25). Errors: the open's, and [`std::io::ErrorKind::InvalidInput`] ("not a regular
/// file …") for anything else than a regular file.
pub fn open_regular(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or folder)",
        ));
    }
    std::fs::File::open(path)
}

/// [`open_regular`], then the whole file as UTF-8 text. Errors: as `open_regular`, and the
/// read's (not UTF-8: [`std::io::ErrorKind::InvalidData`]).
pub fn read_regular(path: &std::path::Path) -> std::io::Result<String> {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut open_regular(path)?, &mut s)?;
    Ok(s)
}

/// The command line as recorded in `meta.json`: each argument as text, bytes that are not
/// UTF-8 shown as U+FFFD (`std::env::args` would panic on them; issue #25).
pub fn command_line() -> Vec<String> {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}
