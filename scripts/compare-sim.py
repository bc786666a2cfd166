#!/usr/bin/env python3
"""Simulated against measured serving, point by point (issue #23's validation).

Usage: scripts/compare-sim.py MEASURED_DIR SIMULATED_DIR [--markdown]

Reads each folder's results.csv (kvbench serve), pairs points by scheme and arrival, and prints
for each: request throughput, TTFT p50/p95 and TPOT p50/p95, measured | simulated | error %.
A point is within target when throughput is within 10 % and all four latencies within 15 %.
Exits 0; the last line counts the points within target. With --markdown, a cell outside its
target is bold.
"""
import csv
import sys


def rows(d):
    with open(f"{d}/results.csv", newline="") as f:
        return {(r["scheme"], r["arrival"], r["prefix_caching"]): r for r in csv.DictReader(f)}


def num(r, k):
    v = r.get(k, "")
    return float(v) if v not in ("", "NaN") else None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    md = "--markdown" in sys.argv
    meas, sim = rows(args[0]), rows(args[1])
    cols = [("request_throughput", 10.0), ("ttft_ms_p50", 15.0), ("ttft_ms_p95", 15.0),
            ("tpot_ms_p50", 15.0), ("tpot_ms_p95", 15.0)]
    head = ["scheme", "load"] + [f"{c}: measured → simulated (error)" for c, _ in cols] + [
        "within"
    ]
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print("\t".join(head))
    ok = total = 0
    errs = {c: [] for c, _ in cols}
    inside = {c: 0 for c, _ in cols}
    for key, m in meas.items():
        s = sim.get(key)
        if s is None or m["status"] != "ok" or s["status"] != "ok":
            continue
        total += 1
        cells, good = [], True
        for c, lim in cols:
            a, b = num(m, c), num(s, c)
            if a is None or b is None or a == 0:
                cells.append("-")
                continue
            e = 100.0 * (b / a - 1.0)
            errs[c].append(abs(e))
            inside[c] += abs(e) <= lim
            good &= abs(e) <= lim
            cell = f"{a:.4g} → {b:.4g} ({e:+.1f} %)"
            cells.append(cell if abs(e) <= lim or not md else f"**{cell}**")
        ok += good
        line = [key[0], key[1]] + cells + ["yes" if good else "no"]
        print(("| " + " | ".join(line) + " |") if md else "\t".join(line))
    print()
    for c, _ in cols:
        e = sorted(errs[c])
        if e:
            print(f"{c}: median |error| {e[len(e) // 2]:.1f} %, worst {e[-1]:.1f} %, "
                  f"{inside[c]} of {len(e)} within target")
    print(f"{ok} of {total} points within target (throughput ±10 %, TTFT/TPOT p50/p95 ±15 %)")


if __name__ == "__main__":
    main()
