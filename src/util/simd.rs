//! The one SIMD dispatch of the CPU kernels (`kv::simd`, `kv::intdot`, `model::qmatmul`).
//!
//! kvbench chooses its vector code at compile time, as candle's quantized CPU kernels do
//! (`cfg(target_feature = …)`; `.cargo/config.toml` builds for the native CPU), so a kernel is
//! either compiled in or not and nothing is detected at run time. [`simd_dispatch!`] writes the
//! `cfg` pair every dispatch needs once, with the features spelled at the call. The three
//! `mod avx` kernel modules keep a plain `#[cfg(all(…))]`: an item inside a macro call would
//! leave `cargo fmt`'s reach, and no code is chosen there. [`query_groups!`] is the kernels'
//! one loop over queries in register-sized groups.

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

/// Runs `body` once per group of queries `0..nq`: groups of four, then one group of the 1–3
/// left, with `j` the group's first query and `Q` its size as a `const` (4, 3, 2 or 1), so the
/// body can name a block kernel monomorphized for it (`kernel::<Q>(…, j, …)`: one group's
/// accumulators in registers). A GQA group of 3 is one call of `Q = 3`; 7 queries are `Q = 4`
/// at `j = 0` and `Q = 3` at `j = 4`.
///
/// `query_groups!(nq, Q, j, body)` (call arguments, so that `cargo fmt` formats the body).
macro_rules! query_groups {
    ($nq:expr, $q:ident, $j:ident, $body:expr $(,)?) => {{
        let nq: usize = $nq;
        let mut $j = 0usize;
        while nq - $j >= 4 {
            {
                const $q: usize = 4;
                $body;
            }
            $j += 4;
        }
        match nq - $j {
            3 => {
                const $q: usize = 3;
                $body;
            }
            2 => {
                const $q: usize = 2;
                $body;
            }
            1 => {
                const $q: usize = 1;
                $body;
            }
            _ => {}
        }
    }};
}
pub(crate) use query_groups;
