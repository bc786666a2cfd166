//! The `kvbench` binary: parse, dispatch, map errors to exit codes (see `kvbench::cli`).

/// mimalloc instead of glibc's malloc for the binary (the library leaves the choice to its
/// user). The decode step allocates hundreds of short-lived buffers (candle's tensors, each
/// layer's outputs) between KV caches of hundreds of MB; glibc spent 4 % of a batch-8 step in
/// `_int_malloc` alone (perf, default model, batch 8 × 512 tokens, 2026-12-06) and gave pages
/// back to the kernel only to fault them in again. Interleaved, same machine, four runs each
/// (commit d51464c): TPOT at batch 1 × 512 tokens 9.7 → 8.1 ms, batch 8 27.4 → 25.6 ms.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    kvbench::cli::main()
}
