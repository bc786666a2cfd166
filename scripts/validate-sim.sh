#!/usr/bin/env bash
# Issue #23's validation on this machine: calibrate a profile from the serving path's own
# prefills and decode steps, measure two serving workloads, simulate the same workloads on the
# calibrated profile, and print predicted next to measured for every point.
#
# Usage: scripts/validate-sim.sh [OUT] [--repeat] [--num-requests N]
#   (default OUT reports/validate-sim-<time>; N: requests per point in every measured and
#   simulated run, overriding the suites' 48 — the same seeded requests plus more; the run time
#   grows in proportion)
# About 30 minutes on 2 idle cores; with --repeat about 55: each suite is measured a second time
# right after the first (same seed, same arrivals) and the second run is compared with the first
# on the same targets, which says how far the measurement agrees with itself at each point, and
# the simulation at the first run's speed is scored against both runs (compare-sim --between:
# within target of either, or between them).
# Each comparison is printed twice: against the simulation at the calibration's speed, and
# against the same simulation at the speed the machine had while the measured run ran
# (--speed-from: the run's median speed probe against the calibration's), which takes a shared
# VM's drift between the calibration and the run out of the error and leaves the model's own.
# Run nothing else meanwhile: the measured runs are timings.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=0
args=()
extra=()
usage="usage: validate-sim.sh [OUT] [--repeat] [--num-requests N]"
while [ $# -gt 0 ]; do
    case $1 in
        --repeat) repeat=1 ;;
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
out=${args[0]:-reports/validate-sim-$(date -u +%Y%m%d-%H%M%S)}
bin=target/release/kvbench
test -x "$bin" || cargo build --release
mkdir -p "$out"
echo "== calibrate ($out/profile.toml)"
"$bin" calibrate --out "$out/profile.toml"
for w in serve serve-decode; do
    echo "== measured: suites/$w.toml"
    "$bin" serve --suite "suites/$w.toml" ${extra[@]+"${extra[@]}"} --out "$out/measured-$w"
    if [ "$repeat" = 1 ]; then
        echo "== measured again: suites/$w.toml"
        "$bin" serve --suite "suites/$w.toml" ${extra[@]+"${extra[@]}"} --out "$out/measured-again-$w"
    fi
    echo "== simulated on the calibrated profile: suites/$w.toml"
    "$bin" serve --suite "suites/$w.toml" ${extra[@]+"${extra[@]}"} --simulate "$out/profile.toml" --out "$out/simulated-$w"
    echo "== simulated at the measured run's speed (--speed-from): suites/$w.toml"
    "$bin" serve --suite "suites/$w.toml" ${extra[@]+"${extra[@]}"} --simulate "$out/profile.toml" \
        --speed-from "$out/measured-$w" --out "$out/simulated-at-speed-$w"
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
