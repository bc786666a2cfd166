#!/usr/bin/env bash
# Builds kvbench with `--features cuda` (release, binary and test binaries) on any x86-64 Linux
# machine, GPU or not: installs the pinned CUDA 13.0 toolchain first (scripts/cuda-toolchain.sh).
#
#   scripts/build-cuda.sh            # -> target/cuda/release/kvbench
#
# Separate target folder (target/cuda) so CPU and CUDA builds do not rebuild each other, and
# target-cpu=x86-64-v3 (AVX2/FMA/F16C) instead of this repo's `native`, so the binary also runs
# on the GPU machine's host CPU. CUDA_COMPUTE_CAP defaults to 90 (H100/H200).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/cuda-toolchain.sh
source scripts/cuda-toolchain.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cuda}"
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=x86-64-v3}"
cargo build --release --locked --features cuda --bins --test cuda "$@"
