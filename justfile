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
