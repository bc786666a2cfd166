//! The `kvbench` binary: parse, dispatch, map errors to exit codes (see `kvbench::cli`).
fn main() -> std::process::ExitCode {
    kvbench::cli::main()
}
