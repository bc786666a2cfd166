#!/usr/bin/env bash
# Issue #23's validation on this machine: calibrate a profile from the serving path's own
# prefills and decode steps, measure two serving workloads, simulate the same workloads on the
# calibrated profile, and print predicted next to measured for every point.
#
# Usage: scripts/validate-sim.sh [OUT]   (default reports/validate-sim-<time>)
# About 25 minutes on 2 idle cores. Run nothing else meanwhile: the measured runs are timings.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-reports/validate-sim-$(date -u +%Y%m%d-%H%M%S)}
bin=target/release/kvbench
test -x "$bin" || cargo build --release
mkdir -p "$out"
echo "== calibrate ($out/profile.toml)"
"$bin" calibrate --out "$out/profile.toml"
for w in serve serve-decode; do
    echo "== measured: suites/$w.toml"
    "$bin" serve --suite "suites/$w.toml" --out "$out/measured-$w"
    echo "== simulated on the calibrated profile: suites/$w.toml"
    "$bin" serve --suite "suites/$w.toml" --simulate "$out/profile.toml" --out "$out/simulated-$w"
done
for w in serve serve-decode; do
    echo "== $w: measured | simulated | error"
    scripts/compare-sim.py "$out/measured-$w" "$out/simulated-$w" --markdown | tee "$out/compare-$w.md"
done
