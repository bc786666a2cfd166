//! The one SIMD dispatch of the CPU kernels (`kv::simd`, `kv::intdot`, `model::qmatmul`).
//!
//! kvbench chooses its vector code at compile time, as candle's quantized CPU kernels do
//! (`cfg(target_feature = …)`; `.cargo/config.toml` builds for the native CPU), so a kernel is
//! either compiled in or not and nothing is detected at run time. [`simd_dispatch!`] writes the
//! `cfg` pair every dispatch needs once, with the features spelled at the call. The three
//! `mod avx` kernel modules keep a plain `#[cfg(all(…))]`: an item inside a macro call would
//! leave `cargo fmt`'s reach, and no code is chosen there.

/// Chooses code by the CPU features the build targets: a branch compiled where
/// `target_arch = "x86_64"` and every listed `target_feature` is enabled, and an optional portable
/// branch compiled everywhere else.
///
/// - `simd_dispatch!(["avx2", "fma"], fast, portable)` is an expression: the value of whichever
///   branch is compiled (both of one type).
/// - `simd_dispatch!(["avx2", "fma"], fast)` is `fast` where the features are enabled and `()`
///   elsewhere: a vector body before a scalar tail, or a fast path that returns early.
///
/// (Written as call arguments, not `=>` arms, so that `cargo fmt` formats the branches.)
///
/// The chosen branch is the expression as written (same code, same results as writing the
/// `#[cfg(all(...))]` / `#[cfg(not(all(...)))]` pair by hand). `fast` is usually
/// `unsafe { avx::kernel(…) }` with its SAFETY comment at the call: the macro only chooses and
/// hides no `unsafe`.
macro_rules! simd_dispatch {
    ([$($feature:tt),+], $fast:expr, $portable:expr $(,)?) => {{
        #[cfg(all(target_arch = "x86_64", $(target_feature = $feature),+))]
        {
            $fast
        }
        #[cfg(not(all(target_arch = "x86_64", $(target_feature = $feature),+)))]
        {
            $portable
        }
    }};
    ([$($feature:tt),+], $fast:expr $(,)?) => {{
        #[cfg(all(target_arch = "x86_64", $(target_feature = $feature),+))]
        {
            $fast
        }
    }};
}
pub(crate) use simd_dispatch;
