# Developer shortcuts. The README's two commands work without `just`.

# Run the default sweep on the default model.
sweep *ARGS:
    cargo run --release -- sweep {{ARGS}}

# Run the tests (the same command CI runs).
test:
    cargo test --release

# Fetch the default model and print its path.
fetch:
    cargo run --release -- fetch --sha256

# Format and lint.
lint:
    cargo fmt --all -- --check
    cargo clippy --release --all-targets -- -D warnings

# What CI runs, end to end.
ci:
    bash .ci/run

# Fuzz the GGUF reader: 1,000,000 seeded mutations of real files (about 7 minutes on one core);
# prints executions, crashes and how far the mutants got.
fuzz-gguf EXECS="1000000" SEED="14":
    KVBENCH_FUZZ_EXECS={{EXECS}} KVBENCH_FUZZ_SEED={{SEED}} cargo test --release --test fuzz -- --ignored --nocapture
