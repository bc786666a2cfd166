#!/usr/bin/env bash
# What bounds the cache formats' attention (issue #24): per K/V row (one kv head's key and value
# rows with its query heads), the marginal time in cache and from DRAM, and the instructions
# executed. No PMU counters needed (shared VMs rarely expose them).
#
#   scripts/attn-rows.sh [OUT] [SCHEMES]     (default OUT /tmp/attn-rows, SCHEMES below)
#
# 1. Time: `kvbench attn-bench` at 128, 512, 2,048 and 8,192 tokens (batch 1, default model
#    shapes: 30 layers x 3 kv heads), twice; in cache = (t(512) - t(128)) / (90 * 384 rows),
#    from DRAM = (t(8192) - t(2048)) / (90 * 6,144 rows), nanoseconds per row.
# 2. Instructions: callgrind (valgrind) on a build for x86-64-v3 (AVX2, what CI's machines run;
#    valgrind has no AVX-512), one thread: the per-step count at 1,536 tokens minus at 512 (each
#    as 6 steps minus 2), over 90 * 1,024 rows; then that build timed as in 1.
# V3_TARGET_DIR: the cargo target folder of the x86-64-v3 build (default target/x86-64-v3).
# Needs valgrind and ~10 minutes (the x86-64-v3 build, ~40 s of callgrind per scheme). Run
# nothing else meanwhile: step 1 is a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/attn-rows}
schemes=${2:-fp16,int8-token,q8_0,fp8,int4,q4_0,mxfp4,int2,turboquant,turboquant-prod}
command -v valgrind >/dev/null || { echo "attn-rows.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
mkdir -p "$out"
cargo build --release --bin kvbench
v3_dir=${V3_TARGET_DIR:-target/x86-64-v3}
RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build --release --bin kvbench --target-dir "$v3_dir"
native=target/release/kvbench
v3=$v3_dir/release/kvbench
for build in native v3; do
    for r in 1 2; do
        "${!build}" attn-bench --dtypes "$schemes" --seq-lens 128,512,2048,8192 --steps 40 \
            --seed "$r" --out "$out/time-$build-$r" > "$out/time-$build-$r.txt"
    done
done
count() { # scheme len steps -> instructions (callgrind's total)
    RAYON_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1.$2.$3" \
        "$v3" attn-bench --dtypes "$1" --seq-lens "$2" --steps "$3" > /dev/null 2>&1
    awk '/^(summary|totals):/ {print $2; exit}' "$out/cg.$1.$2.$3"
}
: > "$out/instructions.txt"
for s in ${schemes//,/ }; do
    a=$(( ($(count "$s" 512 6) - $(count "$s" 512 2)) / 4 ))
    b=$(( ($(count "$s" 1536 6) - $(count "$s" 1536 2)) / 4 ))
    echo "$s $(( (b - a) / (90 * 1024) ))" >> "$out/instructions.txt"
    rm -f "$out"/cg."$s".*
done
python3 - "$out" <<'PY'
import csv, sys, collections
out = sys.argv[1]
ins = dict((l.split()[0], int(l.split()[1])) for l in open(f"{out}/instructions.txt"))
def per_row(build):
    t = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in (1, 2):
        for x in csv.DictReader(open(f"{out}/time-{build}-{r}/results.csv")):
            t[x["scheme"]][int(x["seq_len"])].append((float(x["p50_ms"]), int(x["kv_bytes"])))
    rows = {}
    for s, d in t.items():
        cache = [(d[512][i][0] - d[128][i][0]) * 1e6 / (90 * 384) for i in range(2)]
        dram = [(d[8192][i][0] - d[2048][i][0]) * 1e6 / (90 * 6144) for i in range(2)]
        per = (d[8192][0][1] - d[2048][0][1]) / (90 * 6144)
        rows[s] = (per, cache, dram)
    return rows
nat, v3 = per_row("native"), per_row("v3")
rng = lambda v: f"{min(v):.1f}–{max(v):.1f}"
print("| scheme | bytes per row | ns per row in cache | from DRAM | x86-64-v3: instructions per row | ns per row from DRAM | instructions per ns |")
print("|---|---|---|---|---|---|---|")
for s, (per, cache, dram) in nat.items():
    i = ins.get(s)
    d3 = v3[s][2]
    print(f"| {s} | {per:.0f} | {rng(cache)} | {rng(dram)} | {i} | {rng(d3)} | {i / (sum(d3) / 2):.0f} |")
PY
