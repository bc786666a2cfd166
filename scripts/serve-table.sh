#!/usr/bin/env bash
# Produces the README's serving table (issue #16) on the default model. Run it on a QUIET
# machine (no compiles, no other benchmarks): `kvbench serve` warns for every point that ran
# while other processes took CPU. About 12–15 minutes on 2 cores.
#
#   scripts/serve-table.sh [OUT_DIR]      (default reports/serve-table)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-reports/serve-table}
bin=./target/release/kvbench
test -x "$bin" || cargo build --release --locked

# 1. fp16 / int8 / int4 / a 128-token window under one 24 MiB budget at 1, 2, 4 req/s
#    (Poisson, seeded): max running, throughput, p95 latency, goodput, preemptions, and the
#    plan's predicted concurrency next to the measured one.
"$bin" serve --suite suites/serve.toml --out "$out/rates" --force

# 2. Prefix sharing: a 256-token system prompt common to every request, prefix caching off and
#    on, at 2 req/s: memory saved (pool accounting) and TTFT saved per scheme.
"$bin" serve --suite suites/serve.toml --schemes fp16,int8,int4 --rate 2 --shared-prefix 256 \
    --input-len 64..192 --out "$out/prefix" --force

# 3. The same budget question at data-centre scale: Llama-3-70B, fp16 vs fp8 KV, TP 4 on 80 GiB
#    GPUs, 8 GPUs (2 replicas).
"$bin" plan --model llama-3-70b --memory 80GiB --schemes fp16,fp8:scale=tensor,int4 \
    --ctx 4k,32k --tensor-parallel 4 --gpus 8 --out "$out/plan-70b-tp4"

echo
echo "== tables: $out/rates/summary.md and $out/prefix/summary.md"
