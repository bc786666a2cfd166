//! The library's error type. Every variant carries the input that caused it, so the binary can
//! print a message that names the input and says what to do (exit code 2 for usage errors).

use std::path::PathBuf;

/// Errors returned by the kvbench library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A KV-cache scheme string could not be parsed. Carries the input and the valid forms.
    #[error("unknown KV-cache scheme `{input}`: {reason}\n  valid schemes: {valid}")]
    UnknownScheme {
        input: String,
        reason: String,
        valid: String,
    },

    /// A model path, alias or repo id could not be resolved to files on disk.
    #[error("model `{model}` not found: {reason}")]
    ModelNotFound { model: String, reason: String },

    /// A model file exists but could not be read (truncated GGUF, bad config.json, ...).
    #[error("cannot load model file {path}: {reason}")]
    ModelFormat { path: PathBuf, reason: String },

    /// The model's architecture or tokenizer is not one kvbench implements.
    #[error("unsupported model: {0}")]
    Unsupported(String),

    /// A command-line or suite value is out of range (ctx larger than the model's, zero batch, ...).
    #[error("invalid value for {name}: {reason}")]
    InvalidArgument { name: String, reason: String },

    /// Shard folders that cannot be merged into one run (`kvbench merge`): a setting, the model,
    /// the kvbench version or the split differs, a shard is given twice, missing or unfinished.
    /// Carries the field (`settings.gen`, `model.sha256`, `shard.index`, ...) and what is wrong.
    #[error("cannot merge shards: `{field}` {reason}")]
    Shards { field: String, reason: String },

    /// Fetching the default model failed (pip missing, no network, checksum mismatch).
    #[error("fetching the default model failed: {0}")]
    Fetch(String),

    /// A measurement produced NaN or infinity (never silently averaged away).
    #[error("non-finite result: {0}")]
    NonFinite(String),

    /// A compute device could not be opened (no such GPU, no driver). Carries the device as
    /// `--device` names it (`cuda:0`) and the cause.
    #[error("cannot open device `{device}`: {reason}")]
    Device { device: String, reason: String },

    /// A CUDA driver call failed. Carries the operation (`alloc`, `copy`, a kernel's name) and
    /// whether the driver reported out of memory (`CUDA_ERROR_OUT_OF_MEMORY`), which a sweep
    /// records as an `oom` point instead of an error.
    #[error("CUDA {op}: {reason}")]
    Cuda {
        op: String,
        reason: String,
        out_of_memory: bool,
    },

    /// Tokenizer construction or encoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// Tensor operation failed inside candle (message without candle's backtrace).
    #[error("{}", first_line(.0))]
    Candle(#[from] candle_core::Error),

    /// File-system error, with the path involved. (The I/O error is part of the message, not
    /// a separate `source`, so `{:#}` chains print it once.)
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

impl Error {
    /// Whether this error is the user's input being wrong (exit code 2) rather than a runtime
    /// failure (exit code 1).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::UnknownScheme { .. }
                | Error::ModelNotFound { .. }
                | Error::ModelFormat { .. }
                | Error::Unsupported(_)
                | Error::InvalidArgument { .. }
                | Error::Shards { .. }
        )
    }

    /// Wraps an `std::io::Error` with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            cause: source,
        }
    }
}

impl Error {
    /// A CUDA driver error as this crate's error, naming the operation; `out_of_memory` is read
    /// from the driver's message (`CUDA_ERROR_OUT_OF_MEMORY`, "out of memory").
    pub fn cuda(op: &str, e: impl std::fmt::Display) -> Self {
        let reason = first_line(&e);
        let m = reason.to_ascii_lowercase();
        let out_of_memory = m.contains("out_of_memory") || m.contains("out of memory");
        Error::Cuda {
            op: op.into(),
            reason,
            out_of_memory,
        }
    }

    /// Whether this error says the device or host ran out of memory: [`Error::Cuda`] with
    /// `out_of_memory`, or a candle error whose message says so (candle's own CUDA allocations,
    /// a failed host allocation reported as `alloc_failed`).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::Cuda { out_of_memory, .. } => *out_of_memory,
            Error::Candle(e) => {
                let m = e.to_string().to_ascii_lowercase();
                m.contains("out_of_memory")
                    || m.contains("out of memory")
                    || m.contains("alloc_failed")
            }
            _ => false,
        }
    }
}

/// The first line of an error's message: candle appends a backtrace to its messages when
/// `RUST_BACKTRACE` is set, which users should not have to read.
pub fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Result alias used throughout the library.
pub type Result<T> = std::result::Result<T, Error>;
