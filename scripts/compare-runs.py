#!/usr/bin/env python3
"""Checks that two kvbench results.csv files hold the same points with identical quality and
byte columns (timing columns differ between runs and are not compared).

    scripts/compare-runs.py ONE_MACHINE/results.csv MERGED/results.csv

Used by .ci/run to check a merged sharded run (kvbench slurm/merge) against the same suite run
on one machine. Exit 0 when they match, 1 otherwise, naming every differing point and column.
"""
import csv
import sys

KEY = ("scheme", "batch_size", "seq_len")
# Compared as text: kvbench writes each f64 in its shortest round-trip form, so equal text is
# equal bits.
SAME = (
    "model", "prefill_weight_dtype", "decode_weight_dtype", "status", "gen_tokens",
    "kv_tokens", "kv_bytes", "kv_bytes_predicted", "kv_bytes_per_token", "kv_ratio_vs_fp16",
    "kv_reserved_bytes",
    "ppl", "ppl_delta_pct", "ppl_mean_nll", "kl_mean", "kl_p99", "kl_q1", "kl_q2", "kl_q3",
    "kl_q4", "top1_agree_pct", "mean_abs_dp_top",
    "rouge_samples", "rouge1_f1", "rouge2_f1", "rouge_l_f1", "rouge_lsum_f1", "rouge_l_vs_fp16",
    "passkey_trials", "passkey_accuracy_pct",
    "ppl_mode", "ppl_windows", "ppl_ctx", "ppl_weight_dtype",
)


def rows(path):
    with open(path, newline="") as f:
        out = {}
        for r in csv.DictReader(f):
            k = tuple(r[c] for c in KEY)
            if k in out:
                sys.exit(f"{path}: point {k} appears twice")
            out[k] = r
        return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = rows(sys.argv[1]), rows(sys.argv[2])
    bad = []
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            bad.append(f"{k}: only in {sys.argv[1] if k in a else sys.argv[2]}")
            continue
        for c in SAME:
            if a[k].get(c) != b[k].get(c):
                bad.append(f"{k} {c}: {a[k].get(c)!r} vs {b[k].get(c)!r}")
    quality = sum(1 for r in a.values() if r.get("ppl"))
    if bad:
        print(f"{len(bad)} differences:", *bad, sep="\n  ")
        sys.exit(1)
    print(f"same {len(a)} points; identical {len(SAME)} quality/byte columns "
          f"({quality} points with perplexity)")


if __name__ == "__main__":
    main()
