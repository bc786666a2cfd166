#!/usr/bin/env bash
# The GPU check, for an x86-64 machine with an NVIDIA GPU, a CUDA 13.0 driver and no registry
# access (binaries and model come from scripts/device-bundle.sh, built elsewhere).
#
#   scripts/device-check.sh OUT_DIR
#
# The bundle travels in two parts (.device/a, .device/b; 64 MiB per call): each call stages the
# parts it finds under .device/ into $KVBENCH_DEVICE_STAGE (default /var/tmp/kvbench-device);
# once the model's checksum matches, the same call runs the checks:
#   1. tests/cuda.rs: every kernel against its CPU reference (KVBENCH_REQUIRE_GPU=1, so a
#      missing GPU fails instead of skipping);
#   2. attn-bench --device cuda:0 at 8k and 32k tokens, every scheme: p50 per decode step,
#      bytes moved and FLOPs (the floors) and achieved HBM bandwidth;
#   3. a sweep of every scheme on the default model (batch 1 and 8, 512 and 2048 tokens):
#      TTFT, TPOT, tokens/s, VRAM high-water, KV bytes, perplexity on 2 WikiText-2 windows.
# Logs and CSVs go to OUT_DIR; the last lines printed are a short summary. Under 8 minutes on
# an H200.
set -uo pipefail
out=${1:?usage: scripts/device-check.sh OUT_DIR}
cd "$(dirname "$0")/.."
stage=${KVBENCH_DEVICE_STAGE:-/var/tmp/kvbench-device}
mkdir -p "$stage" "$out"
for part in .device/a .device/b; do
    [ -d "$part" ] && cp -f "$part"/* "$stage"/
done
want=$(cat "$stage/model.sha256" 2>/dev/null || true)
if [ ! -f "$stage/model.gguf" ] || [ "$(sha256sum "$stage/model.gguf" | cut -d' ' -f1)" != "$want" ]; then
    if [ -f "$stage/model.gguf.part1" ] && [ -f "$stage/model.gguf.part2" ]; then
        cat "$stage/model.gguf.part1" "$stage/model.gguf.part2" > "$stage/model.gguf"
    fi
fi
if [ -z "$want" ] || [ ! -f "$stage/model.gguf" ] \
    || [ "$(sha256sum "$stage/model.gguf" | cut -d' ' -f1)" != "$want" ] \
    || [ ! -f "$stage/bin.tar.xz" ]; then
    echo "staged: $(ls "$stage" | tr '\n' ' ')"
    echo "bundle incomplete: call again carrying the other part (.device/a, .device/b)"
    exit 0
fi
tar -C "$stage" -xJf "$stage/bin.tar.xz"
log="$out/device-check.log"
exec > >(tee "$log") 2>&1
t0=$(date +%s)
echo "== machine ($(date -u +%FT%TZ), bundle built from $(cat "$stage/revision" 2>/dev/null))"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
lscpu | grep -E "Model name|^CPU\(s\)"

# The CUDA user-space libraries the binary links (cuBLAS, cuRAND, NVRTC, runtime): wherever this
# image keeps them (CUDA toolkit, or the nvidia-* wheels beside PyTorch).
libdirs=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu \
    /opt /usr/local/lib /usr/lib/python3*/ /root/.local -name 'libcublas.so.13*' \
    -o -name 'libcurand.so.10*' -o -name 'libnvrtc.so.13*' -o -name 'libcudart.so.13*' \
    -o -name 'libcublasLt.so.13*' 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:-}"
missing=$(ldd "$stage/kvbench" | grep "not found" || true)
if [ -n "$missing" ]; then
    echo "libraries not found:"; echo "$missing"; exit 1
fi
export KVBENCH_HOME="$stage/home" KVBENCH_REQUIRE_GPU=1
mkdir -p "$KVBENCH_HOME/models"
ln -sf "$stage/model.gguf" "$KVBENCH_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf"
schemes=fp16,int8-token,int8-channel,fp8,int4,q8_0,q4_0,h2o,window
status=0

echo "== 1. kernels against their CPU references"
timeout 120 "$stage/cuda-tests" --test-threads=1 --nocapture 2>&1 | tee "$out/kernel-tests.log" \
    || status=1

echo "== 2. decode attention at 8k and 32k tokens: floors and achieved HBM bandwidth"
# The default model's geometry, then Llama-3-8B's (32 layers, 8 kv heads × 128; shipped
# geometry, no weights), where the cache is large enough to be bandwidth-bound.
for m in default llama-3-8b; do
    timeout 120 "$stage/kvbench" attn-bench --model "$m" --device cuda:0 --dtypes "$schemes" \
        --seq-len 8192,32768 --steps 50 --peak-bandwidth 4800 2>&1 | tee -a "$out/attn-bench.txt" \
        || status=1
done

echo "== 3. sweep on the default model, every scheme"
timeout 150 "$stage/kvbench" sweep --device cuda:0 --dtypes "$schemes" --batch-sizes 1,8 \
    --seq-lens 512,2048 --gen 32 --ppl-windows 2 --repeats 3 --out "$out/sweep" 2>&1 \
    | tail -n 40 || status=1
cp "$out/sweep/results.csv" "$out/sweep-results.csv" 2>/dev/null || true

echo "== summary ($(($(date +%s) - t0)) s, status $status)"
grep -E "^test result|FAILED|panicked" "$out/kernel-tests.log" || true
exit $status
