#!/usr/bin/env bash
# Prepares, on a machine with registry access, everything scripts/device-check.sh needs on a GPU
# machine that reaches nothing (no crates, no model hub): the `cuda` build of kvbench and of the
# kernel tests (tests/cuda.rs), the default model and gguf-py, packed into .device/ (git-ignored).
#
#   scripts/device-bundle.sh        # then run scripts/device-check.sh there (see its header)
#
# The device tool carries at most 64 MiB per call and the model alone is 94 MiB, so the bundle is
# split in two folders, .device/a and .device/b, each carried by one call of device-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-cuda.sh
cargo build --release --locked          # the CPU build, for `kvbench fetch`
model=$(./target/release/kvbench fetch | head -n 1)

rm -rf .device && mkdir -p .device/a .device/b
# The test binary of tests/cuda.rs: the newest executable named cuda-<hash> under deps/.
tests=$(find target/cuda/release/deps -maxdepth 1 -type f -name 'cuda-*' -perm -u+x -printf '%T@ %p\n' \
    | sort -rn | head -n 1 | cut -d' ' -f2)
test -n "$tests" || { echo "no tests/cuda.rs binary under target/cuda/release/deps" >&2; exit 1; }
strip -o .device/kvbench target/cuda/release/kvbench
strip -o .device/cuda-tests "$tests"
tar -C .device -cJf .device/a/bin.tar.xz kvbench cuda-tests
rm .device/kvbench .device/cuda-tests
# Model: the first 36 MiB with the binaries (~20 MiB compressed), the rest in the second call
# (each call also carries the ~3 MiB working tree).
head -c $((36 << 20)) "$model" > .device/a/model.gguf.part1
tail -c +$(((36 << 20) + 1)) "$model" > .device/b/model.gguf.part2
sha256sum "$model" | cut -d' ' -f1 > .device/a/model.sha256
cp .device/a/model.sha256 .device/b/
git rev-parse --short=12 HEAD > .device/a/revision
# gguf-py (pure Python; numpy, pyyaml, tqdm and requests are on the GPU image) for
# scripts/make-shaped-gguf.py's Llama-3-8B-shaped model, written there.
python3 -m pip download -q --no-deps --only-binary=:all: -d .device/a gguf==0.19.0
du -sh .device/a .device/b
echo "bundle ready: call scripts/device-check.sh \$OUT twice, carrying .device/a, then .device/b"
