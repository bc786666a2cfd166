#!/usr/bin/env bash
# compare-llamacpp.sh — kvbench's decode speed next to llama.cpp's, on the same GGUF, the same
# prompt token ids, the same thread count, interleaved; the source of the README's performance
# table. NOT run by CI (too slow: see "How long").
#
# What it does
#   1. Setup (once; reused while it imports): a venv at $LLAMACPP_VENV (default
#      $KVBENCH_HOME/llamacpp-venv, i.e. ~/.local/share/kvbench/llamacpp-venv) with
#      llama-cpp-python 0.3.36 built from source for this CPU (GGML_NATIVE, without AMX; CMAKE_ARGS overrides),
#      niced, without its multimodal library (LLAVA_BUILD=OFF), plus numpy and matplotlib.
#   2. The prompts: `cargo build --release --example dump_prompts` (examples/dump_prompts.rs)
#      prints the token ids `kvbench sweep` times (WikiText-2 from seeded offsets, the model's own
#      tokenizer), so llama.cpp decodes exactly the same tokens.
#   3. PASSES passes; in each, per prompt depth (DEPTH with batches BATCHES, then LONG_DEPTH with
#      batch 1): `kvbench sweep` over the cache types, then llama.cpp (scripts/llamacpp_decode.py:
#      llama_batch_init, one token per sequence per llama_decode, n_seq_max = batch) with its
#      default Hadamard rotation of quantized caches, then llama.cpp with LLAMA_ATTN_ROT_DISABLE=1
#      (quantized caches only). Engines alternate A B A B, so machine drift hits both.
#   4. scripts/llamacpp_report.py writes, in $OUT: comparison.csv (engine, cache type, rotation,
#      batch, depth, pass, decode tokens/s, TPOT ms, TTFT ms, 1-minute load average before/after,
#      other processes' cores while timed and a contended flag, as kvbench's sweep measures them),
#      comparison.md (a README-ready table with date, CPU and model sha256) and comparison.png.
#      Raw data stay next to them: llamacpp.jsonl, kvbench/*/ (kvbench's run folders), logs/.
#
# Usage (from anywhere; run on a quiet machine, nothing else busy):
#   scripts/compare-llamacpp.sh                   # full comparison, defaults below
#   PASSES=1 BATCHES=1,4 DEPTH=128 LONG_DEPTH= GEN=8 scripts/compare-llamacpp.sh   # smoke test
#   SETUP_ONLY=1 scripts/compare-llamacpp.sh      # just build the venv
#   REPORT_ONLY=1 OUT=reports/compare-llamacpp-X scripts/compare-llamacpp.sh   # re-render
#
# Options (environment variables)
#   PASSES=3          interleaved passes (each engine runs every point once per pass)
#   REPEATS=1         timed repeats per point and pass (both engines; 1 untimed warm-up first)
#   BATCHES=1,4,8     batch sizes at DEPTH
#   DEPTH=512         prompt tokens per sequence for the batch grid
#   LONG_DEPTH=4096   prompt tokens for the batch-1 long-context point (empty: skip it)
#   GEN=32            generated tokens per sequence (TPOT over the last GEN−1)
#   THREADS=$(nproc)  threads for both engines (kvbench's default: every logical CPU)
#   SEED=0            prompt-offset seed (kvbench's --seed)
#   CACHE_TYPES=f16,q8_0,q4_0   K/V cache types (llama.cpp names; f16 is kvbench's fp16)
#   KVBENCH_ROT=0     1: also time kvbench's rotated q8_0+rot / q4_0+rot (pairs with llama.cpp's
#                     default rotation; adds ~2/3 to kvbench's time)
#   KVBENCH=target/release/kvbench   the kvbench binary timed (built separately)
#   KVBENCH_WEIGHTS=q8_0   kvbench's decode weights (--weights); llama.cpp runs them as stored
#   KVBENCH_EXTRA=    more `kvbench sweep` flags
#   MODEL=            GGUF file (default: `$KVBENCH fetch`, kvbench's default model)
#   OUT=reports/compare-llamacpp-<date>   run folder
#   LLAMACPP_VENV=    venv path (see Setup); CMAKE_ARGS= overrides the llama.cpp build flags
#
# How long (2-core AVX2 machine, SmolLM2-135M, defaults; estimated from the README's single-point
# timings, not yet measured as a whole — the script was written on a busy machine):
#   setup ~15 min once (the C++ build; reused afterwards), prompts ~1 min (cargo builds the example);
#   one pass ~12 min: kvbench ~7 min (its f32 prefill of batch 8 × 512 and 1 × 4096 tokens, run
#   for the warm-up and each repeat, dominates), llama.cpp ~5 min over its five cache/rotation
#   settings; so ~35–40 min for PASSES=3 REPEATS=1. Each extra repeat adds ~40 % to a pass (it
#   re-runs the prefill). Smoke test (PASSES=1 BATCHES=1,4 DEPTH=128 LONG_DEPTH= GEN=8): ~3 min.
#
# Exit codes: 0 ok, 1 a step failed (its log is named), 2 bad settings.

set -euo pipefail
cd "$(dirname "$0")/.."

PASSES=${PASSES:-3}
REPEATS=${REPEATS:-1}
BATCHES=${BATCHES:-1,4,8}
DEPTH=${DEPTH:-512}
LONG_DEPTH=${LONG_DEPTH-4096}
GEN=${GEN:-32}
THREADS=${THREADS:-$(nproc)}
SEED=${SEED:-0}
CACHE_TYPES=${CACHE_TYPES:-f16,q8_0,q4_0}
KVBENCH_ROT=${KVBENCH_ROT:-0}
KVBENCH=${KVBENCH:-target/release/kvbench}
KVBENCH_WEIGHTS=${KVBENCH_WEIGHTS:-q8_0}
KVBENCH_EXTRA=${KVBENCH_EXTRA:-}
LLAMACPP_VERSION=0.3.36
data_home="${KVBENCH_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/kvbench}"
VENV=${LLAMACPP_VENV:-$data_home/llamacpp-venv}
OUT=${OUT:-reports/compare-llamacpp-$(date +%Y%m%d-%H%M%S)}

die() { echo "compare-llamacpp: $2" >&2; exit "$1"; }
is_list() { [[ $1 =~ ^[0-9]+(,[0-9]+)*$ ]]; }
for v in PASSES REPEATS GEN THREADS SEED DEPTH; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 0 ]] || die 2 "$v=${!v} is not a whole number"
done
[[ $PASSES -ge 1 && $REPEATS -ge 1 && $THREADS -ge 1 && $DEPTH -ge 1 ]] ||
    die 2 "PASSES, REPEATS, THREADS and DEPTH must be ≥ 1"
[[ $GEN -ge 2 ]] || die 2 "GEN=$GEN leaves no decode step to time; use ≥ 2"
is_list "$BATCHES" || die 2 "BATCHES=$BATCHES is not a comma-separated list of sizes (e.g. 1,4,8)"
[[ -z $LONG_DEPTH || $LONG_DEPTH =~ ^[1-9][0-9]*$ ]] || die 2 "LONG_DEPTH=$LONG_DEPTH is not a length (or empty)"
kv_dtypes=()
ll_quant=()
IFS=, read -ra cts <<< "$CACHE_TYPES"
for c in "${cts[@]}"; do
    case $c in
        f16) kv_dtypes+=(fp16) ;;
        q8_0 | q4_0)
            kv_dtypes+=("$c")
            ll_quant+=("$c")
            [[ $KVBENCH_ROT == 1 ]] && kv_dtypes+=("$c+rot")
            ;;
        *) die 2 "CACHE_TYPES: \`$c\` is not one of f16, q8_0, q4_0" ;;
    esac
done
KV_DTYPES=$(IFS=,; echo "${kv_dtypes[*]}")
LL_QUANT=$(IFS=,; echo "${ll_quant[*]}")
PY="$VENV/bin/python"

setup_venv() {
    if [[ -x $PY ]] && "$PY" -c "import llama_cpp, numpy, matplotlib, sys; sys.exit(llama_cpp.__version__ != '$LLAMACPP_VERSION')" 2>/dev/null; then
        return
    fi
    mkdir -p "$(dirname "$VENV")"
    echo "== setup: what is missing of llama-cpp-python $LLAMACPP_VERSION (from source, ~15 min on 2 quiet cores), numpy, matplotlib into $VENV"
    [[ -x $PY ]] || python3 -m venv "$VENV" || die 1 "python3 -m venv $VENV failed (apt install python3-venv?)"
    local log="$VENV/install.log"
    local cmake="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAVA_BUILD=OFF"
    # On a CPU with AMX, GGML_NATIVE compiles ggml's AMX matmul, which segfaulted on the first
    # prompt (ggml_backend_amx_mul_mat, Q4_1 and Q8_0 weights) on an Intel Xeon VM here: build
    # without it (-mno-amx-* wins over -march=native in GCC); llama.cpp then runs its AVX-512
    # VNNI kernels, as kvbench does.
    if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
        local noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        cmake="$cmake -DCMAKE_C_FLAGS='$noamx' -DCMAKE_CXX_FLAGS='$noamx'"
        echo "   (this CPU has AMX: llama.cpp is built without its AMX path, which crashed here)"
    fi
    CMAKE_ARGS=${CMAKE_ARGS:-$cmake} \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        nice -n 15 "$VENV/bin/pip" install --no-cache-dir --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMACPP_VERSION" numpy matplotlib > "$log" 2>&1 ||
        die 1 "installing llama-cpp-python failed; see $log"
    "$PY" -c "import llama_cpp" || die 1 "llama_cpp does not import after the install; see $log"
}

setup_venv
[[ ${SETUP_ONLY:-0} == 1 ]] && { echo "venv ready: $VENV"; exit 0; }

if [[ ${REPORT_ONLY:-0} != 1 ]]; then
    [[ -x $KVBENCH ]] || die 2 "KVBENCH=$KVBENCH is not an executable; cargo build --release, or point KVBENCH at one"
    if [[ -z ${MODEL:-} ]]; then
        MODEL=$("$KVBENCH" fetch | tail -n1) || die 1 "\`$KVBENCH fetch\` failed"
    fi
    [[ -f $MODEL ]] || die 2 "MODEL=$MODEL is not a file"
    mkdir -p "$OUT/logs" "$OUT/kvbench"
    OUT=$(cd "$OUT" && pwd)
    : > "$OUT/llamacpp.jsonl"
    : > "$OUT/kvbench-runs.jsonl"

    echo "== prompts: kvbench's token ids (examples/dump_prompts.rs)"
    points=()
    IFS=, read -ra bs <<< "$BATCHES"
    for b in "${bs[@]}"; do points+=("${b}x$DEPTH"); done
    [[ -n $LONG_DEPTH ]] && points+=("1x$LONG_DEPTH")
    nice -n 10 cargo build --release --quiet --example dump_prompts 2> "$OUT/logs/dump_prompts-build.log" ||
        die 1 "building examples/dump_prompts failed; see $OUT/logs/dump_prompts-build.log"
    target/release/examples/dump_prompts "$MODEL" "$SEED" "${points[@]}" > "$OUT/prompts.json" ||
        die 1 "dump_prompts failed"

    echo "== meta"
    MODEL="$MODEL" KVBENCH="$KVBENCH" OUT="$OUT" PASSES="$PASSES" REPEATS="$REPEATS" GEN="$GEN" \
    THREADS="$THREADS" SEED="$SEED" BATCHES="$BATCHES" DEPTH="$DEPTH" LONG_DEPTH="$LONG_DEPTH" \
    KV_DTYPES="$KV_DTYPES" KVBENCH_WEIGHTS="$KVBENCH_WEIGHTS" KVBENCH_EXTRA="$KVBENCH_EXTRA" \
    KVBENCH_VERSION="$("$KVBENCH" --version)" MODEL_SHA256="$(sha256sum "$MODEL" | cut -d' ' -f1)" \
    GIT_REV="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        "$PY" - <<'EOF'
import datetime, json, os, platform
import llama_cpp
e = os.environ
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           platform.processor())
meta = {
    "date": datetime.date.today().isoformat(),
    "started_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    "cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
    "model": e["MODEL"], "model_sha256": e["MODEL_SHA256"],
    "kvbench": e["KVBENCH"], "kvbench_version": e["KVBENCH_VERSION"].removeprefix("kvbench "),
    "git_rev": e["GIT_REV"], "llamacpp_version": llama_cpp.__version__,
    "llamacpp_system_info": llama_cpp.llama_print_system_info().decode(),
    "settings": {k.lower(): e[k] for k in ("PASSES", "REPEATS", "GEN", "THREADS", "SEED", "BATCHES",
                 "DEPTH", "LONG_DEPTH", "KV_DTYPES", "KVBENCH_WEIGHTS", "KVBENCH_EXTRA")},
}
json.dump(meta, open(os.path.join(e["OUT"], "meta.json"), "w"), indent=1)
EOF

    loadavg() { cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,; }

    # kvbench over one depth: every cache type, the given batches.
    run_kvbench() { # pass depth batches
        local dir="$OUT/kvbench/pass$1-depth$2" before after
        before=$(loadavg)
        # shellcheck disable=SC2086  # KVBENCH_EXTRA is a list of flags
        "$KVBENCH" sweep --model "$MODEL" --dtypes "$KV_DTYPES" --batch-sizes "$3" --seq-lens "$2" \
            --gen "$GEN" --ppl-windows 0 --threads "$THREADS" --warmup 1 --repeats "$REPEATS" \
            --seed "$SEED" --weights "$KVBENCH_WEIGHTS" --out "$dir" $KVBENCH_EXTRA \
            > "$OUT/logs/kvbench-pass$1-depth$2.log" 2>&1 ||
            die 1 "kvbench sweep failed; see $OUT/logs/kvbench-pass$1-depth$2.log"
        after=$(loadavg)
        printf '{"dir": "%s", "pass": %d, "depth": %d, "load_before": [%s], "load_after": [%s]}\n' \
            "$dir" "$1" "$2" "$before" "$after" >> "$OUT/kvbench-runs.jsonl"
        echo "kvbench pass $1 depth $2 (batches $3): done, load $before → $after"
    }

    # llama.cpp over one depth: rotation default (every cache type), then off (quantized only).
    run_llamacpp() { # pass points rotation cache_types
        [[ -n $4 ]] || return 0
        "$PY" scripts/llamacpp_decode.py --model "$MODEL" --prompts "$OUT/prompts.json" \
            --points "$2" --cache-types "$4" --rotation "$3" --gen "$GEN" --threads "$THREADS" \
            --warmup 1 --repeats "$REPEATS" --pass "$1" --out "$OUT/llamacpp.jsonl" \
            --log "$OUT/logs/llamacpp.log" --text datasets/wikitext-2-raw/wiki.test.raw ||
            die 1 "llama.cpp pass $1 ($3 rotation, $2) failed; see $OUT/logs/llamacpp.log"
    }

    depths=("$DEPTH")
    [[ -n $LONG_DEPTH ]] && depths+=("$LONG_DEPTH")
    for ((p = 1; p <= PASSES; p++)); do
        for d in "${depths[@]}"; do
            if [[ $d == "$DEPTH" ]]; then batches=$BATCHES; else batches=1; fi
            ll_points=$(IFS=,; for b in $batches; do printf '%sx%s,' "$b" "$d"; done)
            ll_points=${ll_points%,}
            echo "== pass $p/$PASSES, depth $d"
            run_kvbench "$p" "$d" "$batches"
            run_llamacpp "$p" "$ll_points" default "$CACHE_TYPES"
            run_llamacpp "$p" "$ll_points" off "$LL_QUANT"
        done
    done
fi

echo "== report"
"$PY" scripts/llamacpp_report.py --dir "$OUT" || die 1 "the report failed"
echo "written: $OUT/comparison.csv, $OUT/comparison.md, $OUT/comparison.png"
