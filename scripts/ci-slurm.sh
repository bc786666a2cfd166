#!/usr/bin/env bash
# CI step (called by .ci/run after its one-machine run of suites/ci.toml into OUT/ci): start a
# single-node Slurm (scripts/slurm-local.sh; installs Debian's packages if needed), run the same
# suite as a 4-shard job array through `kvbench slurm --wait`, and check that the merged run
# holds the same rows as OUT/ci with identical quality and byte columns. Stops exactly the
# daemons it started, by PID, also on failure.
#
#   scripts/ci-slurm.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/ci-slurm.sh OUT (with OUT/ci/results.csv from a one-machine run)}
test -s "$out/ci/results.csv" || { echo "no $out/ci/results.csv to compare with"; exit 2; }
t0=$(date +%s)
export SLURM_LOCAL_DIR="$out/slurm-local"
trap 'scripts/slurm-local.sh stop' EXIT
conf=$(scripts/slurm-local.sh start)   # installs if needed; prints `export SLURM_CONF=…`
eval "$conf"
echo "slurm up after $(( $(date +%s) - t0 )) s: $(sinfo -h -o '%P %T %c CPUs')"
# One CPU (and thread) per shard: two shards at a time on 2 cores, the same total work as the
# one-machine run.
t1=$(date +%s)
if ! ./target/release/kvbench slurm --shards 4 --suite suites/ci.toml --cpus-per-task 1 \
        --out "$out/sharded" --wait; then
    tail -n 20 "$out"/sharded/slurm/*.log || true
    exit 1
fi
echo "4-shard array + merge: $(( $(date +%s) - t1 )) s"
python3 scripts/compare-runs.py "$out/ci/results.csv" "$out/sharded/merged/results.csv"
echo "slurm step: $(( $(date +%s) - t0 )) s in all"
