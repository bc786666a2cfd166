#!/usr/bin/env bash
# Issue #23's validation on this machine: calibrate a profile from the serving path's own
# prefills and decode steps, measure two serving workloads, simulate the same workloads on the
# calibrated profile, and print predicted next to measured for every point.
#
# Usage: scripts/validate-sim.sh [OUT] [--repeat | --runs K] [--num-requests N]
#   (default OUT reports/validate-sim-<time>; N: requests per point in every measured and
#   simulated run, overriding the suites' 48 — the same seeded requests plus more; the run time
#   grows in proportion)
# About 30 minutes on 2 idle cores; with --repeat about 55: each suite is measured a second time
# right after the first (same seed, same arrivals) and the second run is compared with the first
# on the same targets, which says how far the measurement agrees with itself at each point, and
# the simulation at the first run's speed is scored against both runs (compare-sim --between:
# within target of either, or between them).
# With --runs K (K >= 2; about 5 + 24·K minutes) each suite is measured K times, the suites
# interleaved (serve, decode-heavy, serve, ...), each run simulated at its own speed, and every
# point scored by the median of the K measured runs against the median of the K simulations
# (compare-sim with comma-separated folders): the reference is then the measurement's central
# value rather than one draw of a VM whose runs agree with each other on 9–15 of 24 points.
# Each measured run is also scored against the median of the others (the measurement's own
# agreement with such a reference) and against its own simulation. (--runs compares at the
# runs' speeds only.)
# Otherwise each comparison is printed twice: against the simulation at the calibration's speed, and
# against the same simulation at the speed the machine had while the measured run ran
# (--speed-from: the run's median speed probe against the calibration's), which takes a shared
# VM's drift between the calibration and the run out of the error and leaves the model's own.
# Run nothing else meanwhile: the measured runs are timings.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=0
runs=1
args=()
extra=()
usage="usage: validate-sim.sh [OUT] [--repeat | --runs K] [--num-requests N]"
while [ $# -gt 0 ]; do
    case $1 in
        --repeat) repeat=1 ;;
        --runs)
            case ${2:-} in
                ''|*[!0-9]*) echo "validate-sim.sh: --runs needs a whole number of measured runs per suite, 2 or more ($usage)" >&2; exit 2 ;;
            esac
            runs=$((10#$2))
            if [ "$runs" -lt 2 ]; then
                echo "validate-sim.sh: --runs needs 2 or more measured runs per suite, got $2 (one run: leave --runs out; $usage)" >&2
                exit 2
            fi
            shift ;;
        --num-requests)
            case ${2:-} in
                ''|*[!0-9]*) echo "validate-sim.sh: --num-requests needs a whole number of requests per point ($usage)" >&2; exit 2 ;;
            esac
            extra=(--num-requests "$2"); shift ;;
        -*) echo "validate-sim.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
        *) args+=("$1") ;;
    esac
    shift
done
if [ "$repeat" = 1 ] && [ "$runs" -gt 1 ]; then
    echo "validate-sim.sh: --repeat and --runs exclude each other (--repeat is two runs compared run to run; $usage)" >&2
    exit 2
fi
out=${args[0]:-reports/validate-sim-$(date -u +%Y%m%d-%H%M%S)}
if [ "$runs" -gt 1 ] && [[ $out == *,* ]]; then
    echo "validate-sim.sh: OUT ($out) has a comma, which compare-sim.py reads as a list of folders; give --runs an OUT without one" >&2
    exit 2
fi
bin=target/release/kvbench
test -x "$bin" || cargo build --release
mkdir -p "$out"
# One serving run of suite $1 (serve, serve-decode), the rest of the arguments kvbench serve's.
serve_suite() { local w=$1; shift; "$bin" serve --suite "suites/$w.toml" ${extra[@]+"${extra[@]}"} "$@"; }
# Its arguments joined by commas (compare-sim.py's list of runs).
join() { local IFS=,; echo "$*"; }
echo "== calibrate ($out/profile.toml)"
"$bin" calibrate --out "$out/profile.toml"
if [ "$runs" -gt 1 ]; then
    # Run k's folders: measured-$w for the first, measured-k-$w after it.
    name() { if [ "$2" = 1 ]; then echo "$out/$1-$3"; else echo "$out/$1-$2-$3"; fi; }
    for k in $(seq 1 "$runs"); do
        for w in serve serve-decode; do
            echo "== measured, run $k of $runs: suites/$w.toml"
            serve_suite "$w" --out "$(name measured "$k" "$w")"
        done
    done
    for w in serve serve-decode; do
        meas=() sims=()
        for k in $(seq 1 "$runs"); do
            echo "== simulated at run $k's speed (--speed-from): suites/$w.toml"
            serve_suite "$w" --simulate "$out/profile.toml" --speed-from "$(name measured "$k" "$w")" \
                --out "$(name simulated-at-speed "$k" "$w")"
            meas+=("$(name measured "$k" "$w")")
            sims+=("$(name simulated-at-speed "$k" "$w")")
        done
        echo "== $w: median of $runs measured runs | median of the simulations at their speeds | error"
        scripts/compare-sim.py "$(join "${meas[@]}")" "$(join "${sims[@]}")" --markdown | tee "$out/compare-median-$w.md"
        for k in $(seq 1 "$runs"); do
            others=()
            for j in $(seq 1 "$runs"); do [ "$j" = "$k" ] || others+=("$(name measured "$j" "$w")"); done
            echo "== $w: median of the other measured runs | measured run $k | difference"
            scripts/compare-sim.py "$(join "${others[@]}")" "$(name measured "$k" "$w")" \
                --markdown --repeat | tee "$out/repeat-median-$k-$w.md"
            echo "== $w: measured run $k | simulated at its speed | error"
            scripts/compare-sim.py "$(name measured "$k" "$w")" "$(name simulated-at-speed "$k" "$w")" \
                --markdown | tee "$out/compare-at-speed-$k-$w.md"
        done
    done
    exit 0
fi
for w in serve serve-decode; do
    echo "== measured: suites/$w.toml"
    serve_suite "$w" --out "$out/measured-$w"
    if [ "$repeat" = 1 ]; then
        echo "== measured again: suites/$w.toml"
        serve_suite "$w" --out "$out/measured-again-$w"
    fi
    echo "== simulated on the calibrated profile: suites/$w.toml"
    serve_suite "$w" --simulate "$out/profile.toml" --out "$out/simulated-$w"
    echo "== simulated at the measured run's speed (--speed-from): suites/$w.toml"
    serve_suite "$w" --simulate "$out/profile.toml" --speed-from "$out/measured-$w" \
        --out "$out/simulated-at-speed-$w"
done
for w in serve serve-decode; do
    echo "== $w: measured | simulated | error"
    scripts/compare-sim.py "$out/measured-$w" "$out/simulated-$w" --markdown | tee "$out/compare-$w.md"
    echo "== $w: measured | simulated at the measured run's speed | error"
    scripts/compare-sim.py "$out/measured-$w" "$out/simulated-at-speed-$w" --markdown \
        | tee "$out/compare-at-speed-$w.md"
    if [ "$repeat" = 1 ]; then
        echo "== $w: measured | measured again | difference"
        scripts/compare-sim.py "$out/measured-$w" "$out/measured-again-$w" --markdown --repeat \
            | tee "$out/repeat-$w.md"
        echo "== $w: simulated at the first measured run's speed, against both measured runs"
        scripts/compare-sim.py "$out/measured-$w" "$out/simulated-at-speed-$w" --markdown \
            --between "$out/measured-again-$w" | tee "$out/compare-between-$w.md"
    fi
done
