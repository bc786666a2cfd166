#!/usr/bin/env python3
"""Turns a compare-llamacpp.sh run into comparison.csv, comparison.md and comparison.png.

Inputs (all in the run folder --dir):
- llamacpp.jsonl: one line per llama.cpp point, from scripts/llamacpp_decode.py;
- kvbench-runs.jsonl: one line per `kvbench sweep` invocation: {"dir", "pass", "load_before",
  "load_after"}; the points are read from that run folder's raw.jsonl (kvbench's own raw samples);
- meta.json: date, CPU, model path and sha256, versions, settings (written by the shell script).

Definitions, the same for both engines (kvbench's, src/measure/sweep.rs): decode tokens/s =
batch × decode steps / Σ step time over all timed repeats; TPOT = mean step time (ms); TTFT = mean
prefill + first pick (ms). The Markdown table gives the median over passes of each.
Load averages: llama.cpp rows carry /proc/loadavg's 1-minute value just before and after each
point's timed repeats; kvbench rows those around the whole `kvbench sweep` invocation.
Exit codes: 0 ok, 1 unreadable input.
"""

import argparse
import csv
import json
import os
import statistics
import sys

COLUMNS = ["engine", "engine_version", "cache_type", "rotation", "batch", "depth", "gen", "pass",
           "repeats", "decode_tok_s", "tpot_ms", "ttft_ms", "first_token", "load1_before",
           "load1_after", "other_cores", "contended"]


CONTENDED_CORES = 0.15  # kvbench's threshold (src/measure/contention.rs)
CT_ORDER = {"f16": 0, "q8_0": 1, "q4_0": 2}
ROT_ORDER = {"none": 0, "off": 1, "hadamard": 2}


def order(ct, rot):
    return (CT_ORDER.get(ct, 9), ROT_ORDER.get(rot, 9))


def die(msg):
    print(f"llamacpp_report: {msg}", file=sys.stderr)
    sys.exit(1)


def read_jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        die(f"{path}: {e}")


def timing_row(engine, version, cache_type, rotation, batch, depth, gen, pass_no, t, lb, la, oc):
    steps = sum(len(r) for r in t["itl_ms"])
    ms = sum(sum(r) for r in t["itl_ms"])
    return {
        "engine": engine,
        "engine_version": version,
        "cache_type": cache_type,
        "rotation": rotation,
        "batch": batch,
        "depth": depth,
        "gen": gen,
        "pass": pass_no,
        "repeats": len(t["ttft_ms"]),
        "decode_tok_s": round(batch * steps / (ms * 1e-3), 3) if ms > 0 else "",
        "tpot_ms": round(ms / steps, 4) if steps else "",
        "ttft_ms": round(statistics.mean(t["ttft_ms"]), 3) if t["ttft_ms"] else "",
        "first_token": t["generated"][0] if t.get("generated") else "",
        "load1_before": lb[0] if lb else "",
        "load1_after": la[0] if la else "",
        "other_cores": round(oc, 3) if oc is not None else "",
        "contended": "" if oc is None else int(oc > CONTENDED_CORES),
    }


def kvbench_scheme(s):
    """kvbench scheme spec → (cache type, rotation) in llama.cpp's terms; None if not comparable."""
    base, rot = (s[:-4], "hadamard") if s.endswith("+rot") else (s, None)
    if base == "fp16":
        return ("f16", rot or "none")
    if base in ("q8_0", "q4_0"):
        return (base, rot or "off")
    return None


def collect(run_dir, meta):
    rows = []
    for p in read_jsonl(os.path.join(run_dir, "llamacpp.jsonl")):
        rows.append(timing_row("llama.cpp", p["engine_version"], p["cache_type"], p["rotation"],
                               p["batch"], p["seq_len"], p["gen"], p["pass"], p,
                               p.get("load_before"), p.get("load_after"), p.get("other_cores")))
    for inv in read_jsonl(os.path.join(run_dir, "kvbench-runs.jsonl")):
        for p in read_jsonl(os.path.join(inv["dir"], "raw.jsonl")):
            if p.get("record") == "quality":  # a scheme's quality results, not a timing point
                continue
            ct = kvbench_scheme(p["scheme"])
            if ct is None or p.get("status") != "ok":
                if p.get("status") != "ok":
                    print(f"warning: kvbench {p['scheme']} batch {p['batch']} × {p['seq_len']} "
                          f"in pass {inv['pass']}: {p.get('status')}", file=sys.stderr)
                continue
            gen = len(p["timing"]["itl_ms"][0]) + 1 if p["timing"]["itl_ms"] else ""
            rows.append(timing_row("kvbench", meta.get("kvbench_version", ""), ct[0], ct[1],
                                   p["batch"], p["seq_len"], gen, inv["pass"], p["timing"],
                                   inv.get("load_before"), inv.get("load_after"),
                                   (p["timing"].get("contention") or {}).get("other_cores")))
    rows.sort(key=lambda r: (r["depth"], r["batch"], *order(r["cache_type"], r["rotation"]),
                             r["engine"], r["pass"]))
    return rows


def medians(rows):
    """{(engine, cache_type, rotation, batch, depth): {metric: median over passes}}."""
    groups = {}
    for r in rows:
        k = (r["engine"], r["cache_type"], r["rotation"], r["batch"], r["depth"])
        groups.setdefault(k, []).append(r)
    out = {}
    for k, rs in groups.items():
        m = {}
        for f in ("decode_tok_s", "tpot_ms", "ttft_ms"):
            vals = [r[f] for r in rs if r[f] != ""]
            m[f] = statistics.median(vals) if vals else None
        m["passes"] = len(rs)
        m["contended"] = sum(1 for r in rs if r["contended"] == 1)
        out[k] = m
    return out


def fmt(v, nd):
    return "—" if v is None else f"{v:,.{nd}f}"


def markdown(rows, meta):
    med = medians(rows)
    keys = sorted({k[1:] for k in med}, key=lambda k: (k[3], k[2], *order(k[0], k[1])))
    loads = [r[f] for r in rows for f in ("load1_before", "load1_after") if r[f] != ""]
    agree = total = 0
    firsts = {}
    for r in rows:
        if r["cache_type"] == "f16" and r["first_token"] != "":
            firsts.setdefault((r["batch"], r["depth"]), {}).setdefault(r["engine"], set()).add(
                r["first_token"])
    for d in firsts.values():
        if "kvbench" in d and "llama.cpp" in d:
            total += 1
            agree += bool(d["kvbench"] & d["llama.cpp"])
    s = meta["settings"]
    lines = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} logical CPUs), "
        f"{s['threads']} threads for both engines; model `{os.path.basename(meta['model'])}` "
        f"(sha256 `{meta['model_sha256'][:8]}…`); kvbench {meta['kvbench_version']} "
        f"(decode weights {s['kvbench_weights']}), llama.cpp via llama-cpp-python "
        f"{meta['llamacpp_version']} (weights as stored, flash attention on, one KV stream per "
        f"sequence). Same prompt token ids (WikiText-2, seed {s['seed']}), {s['gen']} generated "
        f"tokens, {s['passes']} interleaved pass(es) × {s['repeats']} timed repeat(s); medians "
        f"over passes. Load average (1 min) during the run: "
        f"{min(loads):.2f}–{max(loads):.2f}." if loads else "",
        "",
        "| cache | rotation | batch | depth | kvbench tok/s | llama.cpp tok/s | kvbench ÷ llama.cpp "
        "| kvbench TPOT ms | llama.cpp TPOT ms | kvbench TTFT ms | llama.cpp TTFT ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    n_contended = 0
    for ct, rot, b, d in keys:
        kv = med.get(("kvbench", ct, rot, b, d), {})
        ll = med.get(("llama.cpp", ct, rot, b, d), {})
        a, c = kv.get("decode_tok_s"), ll.get("decode_tok_s")
        ratio = f"{a / c:.2f}×" if a and c else "—"
        if kv.get("contended") or ll.get("contended"):
            ratio += " ⚠"
            n_contended += 1
        lines.append(
            f"| {ct} | {rot} | {b} | {d} | {fmt(a, 1)} | {fmt(c, 1)} | {ratio} "
            f"| {fmt(kv.get('tpot_ms'), 2)} | {fmt(ll.get('tpot_ms'), 2)} "
            f"| {fmt(kv.get('ttft_ms'), 0)} | {fmt(ll.get('ttft_ms'), 0)} |")
    lines += [
        "",
        "rotation: `hadamard` = Hadamard-rotated K/V (llama.cpp's default for quantized caches; "
        "kvbench's `+rot`), `off` = quantized without rotation (llama.cpp with "
        "`LLAMA_ATTN_ROT_DISABLE=1`), `none` = f16. Same-prompt check: the first greedy token of "
        f"sequence 0 (f16 cache) agrees between the engines at {agree} of {total} points.",
        "",
    ]
    if n_contended:
        lines += [
            f"⚠ {n_contended} row(s) had a contended pass: other processes used more than "
            f"{CONTENDED_CORES} cores while it was timed (column `other_cores` in comparison.csv), "
            "so those numbers describe the machine, not the engines. Stop the other work and "
            "rerun before quoting them.",
            "",
        ]
    return "\n".join(lines)


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed; no chart", file=sys.stderr)
        return False
    med = medians(rows)
    depths = sorted({k[4] for k in med})
    fig, axes = plt.subplots(1, len(depths), figsize=(max(7.5, 6 * len(depths)), 4.8), squeeze=False)
    colors = {"f16": "tab:blue", "q8_0": "tab:orange", "q4_0": "tab:green"}
    styles = {"kvbench": "-", "llama.cpp": "--"}
    markers = {"none": "o", "off": "s", "hadamard": "^"}
    for ax, depth in zip(axes[0], depths):
        series = sorted({k[:3] for k in med if k[4] == depth},
                        key=lambda s: (s[0], *order(s[1], s[2])))
        batches = sorted({k[3] for k in med if k[4] == depth})
        if len(batches) > 1:
            for eng, ct, rot in series:
                pts = sorted((k[3], m["decode_tok_s"]) for k, m in med.items()
                             if k[:3] == (eng, ct, rot) and k[4] == depth and m["decode_tok_s"])
                ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(eng, ":"),
                        color=colors.get(ct, "gray"), marker=markers.get(rot, "x"),
                        label=f"{eng} {ct} {rot}")
            ax.set_xlabel("batch (sequences decoded together)")
            ax.set_xticks(batches)
        else:
            labels, vals, cols = [], [], []
            for eng, ct, rot in series:
                m = med.get((eng, ct, rot, batches[0], depth), {})
                if m.get("decode_tok_s"):
                    labels.append(f"{eng}\n{ct} {rot}")
                    vals.append(m["decode_tok_s"])
                    cols.append(colors.get(ct, "gray"))
            ax.barh(range(len(vals)), vals, color=cols)
            ax.set_yticks(range(len(vals)), labels, fontsize=7)
            ax.set_xlabel(f"decode tokens/s (batch {batches[0]})")
        ax.set_title(f"prompt depth {depth} tokens")
        if len(batches) > 1:
            ax.set_ylabel("decode tokens/s")
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle("Decode tokens/s, median of passes: kvbench (solid) vs llama.cpp (dashed),\n"
                 "same GGUF, prompt ids and threads", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="the compare-llamacpp.sh run folder")
    a = p.parse_args(argv)
    try:
        with open(os.path.join(a.dir, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        die(f"{a.dir}/meta.json: {e}")
    rows = collect(a.dir, meta)
    if not rows:
        die(f"no finished points in {a.dir}")
    with open(os.path.join(a.dir, "comparison.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    md = markdown(rows, meta)
    with open(os.path.join(a.dir, "comparison.md"), "w") as f:
        f.write(md)
    chart(rows, os.path.join(a.dir, "comparison.png"))
    print(md)


if __name__ == "__main__":
    main(sys.argv[1:])
