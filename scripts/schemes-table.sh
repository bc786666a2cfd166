#!/usr/bin/env bash
# Produces the README's table of the 2026 schemes (issue #15) on the default model, plus the
# q4_0 / int8-token intervals on 32 windows and a noise floor. Quality numbers do not depend on
# machine load; the timing run (step 3) does — run that step on a QUIET machine.
# About 45 min (quality) + 10 min (timing) on 2 cores.
#
#   scripts/schemes-table.sh [OUT_DIR]      (default reports/schemes-table)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-reports/schemes-table}
bin=./target/release/kvbench
test -x "$bin" || cargo build --release --locked
schemes=fp16,int8-token,q4_0,int4,int2-channel,k4v2,k2v4,turboquant,turboquant:bits=3,turboquant-prod
schemes=$schemes,turboquant_k8v4,turboquant_4bit_nc,turboquant_k3v4_nc,turboquant_3bit_nc

# 1. Quality: perplexity through each cache on 32 WikiText-2 windows of 512 tokens (second
#    half scored), an fp16 cache in lockstep for KL / same top-p, paired Student-t 95 % interval
#    of ΔPPL over the 32 per-window NLL differences. The timing of this run is not used.
"$bin" sweep --dtypes "$schemes" --batch-sizes 1 --seq-lens 128 --gen 8 --repeats 1 --warmup 0 \
    --ppl-windows 32 --out "$out/quality" --force

# 2. Noise floor: q4_0 and int8-token perplexity rerun 3× with every layer's input moved one ulp
#    (seeded), 8 windows: ΔPPLs inside this spread cannot be told apart.
"$bin" sweep --dtypes fp16,int8-token,q4_0 --batch-sizes 1 --seq-lens 64 --gen 4 --repeats 1 \
    --warmup 0 --ppl-windows 8 --ppl-noise-floor 3 --out "$out/noise" --force

# 3. Timing (quiet machine). End to end: every scheme interleaved, batch 1 × 512-token prompt,
#    32 decode steps, 3 repeats, no quality. At 135M parameters the step is mostly weights, so
#    the cache's own cost is timed apart too: append + attention at 8,192 tokens (attn-bench,
#    schemes interleaved step by step, with the machine's read bandwidth measured first).
"$bin" sweep --dtypes "$schemes" --batch-sizes 1 --seq-lens 512 --gen 32 --repeats 3 \
    --ppl-windows 0 --out "$out/timing" --force
"$bin" attn-bench --dtypes "$schemes" --seq-lens 8192 --steps 20 --peak-bandwidth auto \
    | tee "$out/attn-smollm2.txt"

# 4. A second geometry without weights (no second model is reachable here): Qwen2.5-7B's KV
#    shapes (28 layers × 4 KV heads × head_dim 128, GQA 7:1), append + attention at 4,096.
"$bin" attn-bench --model qwen2.5-7b --dtypes "$schemes" --seq-lens 4096 --steps 20 \
    | tee "$out/attn-qwen2.5-7b.txt"

echo
echo "== tables: $out/{quality,noise,timing}/summary.md, $out/attn-*.txt"
