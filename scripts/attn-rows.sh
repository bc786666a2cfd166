#!/usr/bin/env bash
# What bounds the cache formats' attention (issue #24): per K/V row (one kv head's key and value
# rows with its query heads), the marginal time in cache and from DRAM, and the instructions
# executed. No PMU counters needed (shared VMs rarely expose them).
#
#   scripts/attn-rows.sh [OUT] [SCHEMES]     (default OUT /tmp/attn-rows, SCHEMES below)
#
# 1. Time: `kvbench attn-bench` at 128, 512, 4,096 and 16,384 tokens (batch 1, default model
#    shapes: 30 layers x 3 kv heads, so 90 rows a token), each build twice, the builds
#    alternating (native, x86-64-v3, native, x86-64-v3), each run with `--peak-bandwidth auto`:
#    in cache = (t(512) - t(128)) / (90 * 384 rows) (at most 12 MiB), from DRAM =
#    (t(16384) - t(4096)) / (90 * 12,288 rows) (past a 32 MiB L3 for every format of >= 4 bits),
#    nanoseconds per row from the p50 step times.
# 2. Instructions: callgrind (valgrind) on the x86-64-v3 build (AVX2, what CI's machines run;
#    valgrind has no AVX-512), one thread (no pool spinning): the per-step count at 1,536 tokens
#    minus that at 512 (each as 6 steps minus 2), over 90 * 1,024 rows.
# Prints a markdown table with each run's probe reading and the most other processes used while
# a table was timed (above ~0.05 cores the machine was shared: rerun).
# V3_TARGET_DIR: the cargo target folder of the x86-64-v3 build (default target/x86-64-v3).
# Needs valgrind; ~20-30 minutes (a first x86-64-v3 build, then ~1 minute of callgrind a scheme).
# Run nothing else meanwhile: step 1 is a timing.
set -euo pipefail
out=$(realpath -m "${1:-/tmp/attn-rows}")
schemes=${2:-fp16,int8-token,q8_0,fp8,int4,q4_0,mxfp4,int2,turboquant,turboquant-prod}
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "attn-rows.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
mkdir -p "$out"
cargo build --release --bin kvbench
v3_dir=${V3_TARGET_DIR:-target/x86-64-v3}
RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build --release --bin kvbench --target-dir "$v3_dir"
native=target/release/kvbench
v3=$v3_dir/release/kvbench
for r in 1 2; do
    for build in native v3; do
        "${!build}" attn-bench --dtypes "$schemes" --seq-lens 128,512,4096,16384 --steps 40 \
            --seed "$r" --peak-bandwidth auto --out "$out/time-$build-$r" > "$out/time-$build-$r.txt"
    done
done
count() { # scheme len steps -> instructions (callgrind's total)
    local f="$out/cg.$1.$2.$3"
    RAYON_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$f" \
        "$v3" attn-bench --dtypes "$1" --seq-lens "$2" --steps "$3" > "$f.log" 2>&1 \
        || { echo "attn-rows.sh: callgrind failed for $1 at $2 tokens; see $f.log" >&2; exit 1; }
    awk '/^(summary|totals):/ {print $2; exit}' "$f"
}
: > "$out/instructions.txt"
for s in ${schemes//,/ }; do
    a2=$(count "$s" 512 2); a6=$(count "$s" 512 6); b2=$(count "$s" 1536 2); b6=$(count "$s" 1536 6)
    echo "$s $a2 $a6 $b2 $b6" >> "$out/instructions.txt"
    rm -f "$out"/cg."$s".*[0-9]
done
python3 - "$out" <<'PY'
import csv, sys, collections
out = sys.argv[1]
ins = []  # in the order given, as the CSVs list the schemes (by their canonical names)
for line in open(f"{out}/instructions.txt"):
    name, a2, a6, b2, b6 = line.split()
    a, b = (int(a6) - int(a2)) / 4, (int(b6) - int(b2)) / 4
    ins.append((b - a) / (90 * 1024))
def runs(build):
    t = collections.OrderedDict()
    probe, other = [], 0.0
    for r in (1, 2):
        for x in csv.DictReader(open(f"{out}/time-{build}-{r}/results.csv")):
            t.setdefault(x["scheme"], collections.defaultdict(list))[int(x["seq_len"])].append(
                (float(x["p50_ms"]), int(x["kv_bytes"])))
            other = max(other, float(x["other_cores"] or 0))
            if x["peak_gb_s"]:
                probe.append(float(x["peak_gb_s"]))
    rows = collections.OrderedDict()
    for s, d in t.items():
        cache = [(d[512][i][0] - d[128][i][0]) * 1e6 / (90 * 384) for i in range(2)]
        dram = [(d[16384][i][0] - d[4096][i][0]) * 1e6 / (90 * 12288) for i in range(2)]
        per = (d[16384][0][1] - d[4096][0][1]) / (90 * 12288)
        rows[s] = (per, cache, dram)
    return rows, sorted(set(probe)), other
(nat, nprobe, nother), (v3, vprobe, vother) = runs("native"), runs("v3")
rng = lambda v: f"{min(v):.1f}–{max(v):.1f}"
print(f"probe (GB/s): native runs {nprobe}, x86-64-v3 runs {vprobe}; "
      f"most other cores while timed: native {nother:.2f}, x86-64-v3 {vother:.2f}")
print("| scheme | bytes per row | ns per row in cache | from DRAM | x86-64-v3: instructions per row | ns per row from DRAM | instructions per ns |")
print("|---|---|---|---|---|---|---|")
for (s, (per, cache, dram)), i in zip(nat.items(), ins):
    d3 = v3[s][2]
    print(f"| {s} | {per:.0f} | {rng(cache)} | {rng(dram)} | {i:.0f} | {rng(d3)} | {i / (sum(d3) / 2):.0f} |")
PY
