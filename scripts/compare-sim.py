#!/usr/bin/env python3
"""Simulated against measured serving, point by point (issue #23's validation).

Usage: scripts/compare-sim.py MEASURED_DIR SIMULATED_DIR [--markdown] [--repeat]
                              [--between MEASURED_AGAIN_DIR]

Either folder may be a comma-separated list of runs of the same workload (DIR1,DIR2,DIR3): each
point's numbers on that side are then the median over the runs (validate-sim.sh --runs K).

Reads each folder's results.csv (kvbench serve), pairs points by scheme and arrival, and prints
for each: request throughput, TTFT p50/p95 and TPOT p50/p95, measured | simulated | error %.
A point is within target when throughput is within 10 % and all four latencies within 15 %.
Exits 0; the last line counts the points within target. With --markdown, a cell outside its
target is bold. With --repeat the second folder is a second measured run of the same workload
(same seed, same arrivals), labelled so: the same targets then say how far the measurement
agrees with itself, the floor under any simulation's agreement with one measured run.
With --between, a second measured run of the same workload: each point also says whether every
simulated value lies within its target of either measured run or between the two (the
measurement's own spread at that point), and the last lines count those points too. That count
is not the target; it says which misses are the model's (outside both runs and their spread)
and which are a point the measurement itself does not repeat to the target's precision.

Then, where both runs recorded their decode steps (raw.jsonl traces from kvbench 2026-12-03 on:
step_s, context_tokens, prefill_s, prefill_tokens), which term differs: each run's decode steps
fitted to  step = fixed + per_seq · running + per_token · context_tokens  (per_token within
each batch size, see fit_steps; the steps right after a prefill apart, as what they take beyond
that), and its prefills to seconds per prefilled token, measured next to simulated. A simulated run's
steps follow the performance model exactly, so its fit reads the model's terms back; the
measured fit says what the serving path really paid for each. The ratio of the measured steps
to the simulated fit at the measured steps' own batches and contexts says how much slower
(above 1) the serving path ran than the model at the same shapes, apart from any difference
of schedule.

Where the measured run took a speed probe before each point (kvbench 2026-12-06 on:
probe_prefill_ms, probe_step_ms) and the simulated run's profile holds the calibration's own
probe, the table says how much slower than at calibration the machine ran each point (above 1:
slower), prefill and decode step apart; a simulation run with --speed-from is scaled by the
median of these over the run (one probe spreads about ±7 % around its minute's speed).
Last, from each point's requests in raw.jsonl, how well its TPOT p50 is conditioned: the
requests' mean TPOT measured → second run (error), and how far apart the four TPOTs around the
median lie (per cent of the median). A request's TPOT is its decode steps plus the prefills of
other requests that land inside them (an ITL above 3× the point's median ITL: a stall), so the
TPOTs cluster by stall count; where the median falls in a gap between clusters, a prefill
landing just before rather than just after one request's last token moves the p50 by the gap,
and the last column counts the requests whose stall count differs between the two runs.
"""
import csv
import json
import math
import sys

# What the second folder holds, as the column heads name it.
OTHER = "measured again" if "--repeat" in sys.argv else "simulated"


# results.csv columns that are labels, not numbers a median is taken of.
LABELS = {"run_id", "model", "mode", "profile", "scheme", "arrival", "prefix_caching", "status",
          "contended", "error"}


def folders(d):
    """The folders a command-line argument names: one, or several comma-separated."""
    dirs = [x for x in d.split(",") if x]
    if not dirs:
        sys.exit(f"compare-sim.py: no run folder in `{d}`\n" + __doc__)
    return dirs


def rows(d):
    """(scheme, arrival, prefix_caching) -> results.csv row. `d` may name several folders,
    comma-separated (runs of one workload): each point's numbers are then the median over the
    runs whose row is ok (the middle one of three; the mean of the middle two of an even
    count; a cell with no number left out), and the point counts as ok only where more than
    half of the runs are (else its status is `partial`, and it is not scored)."""
    runs = []
    for x in folders(d):
        with open(f"{x}/results.csv", newline="") as f:
            runs.append({(r["scheme"], r["arrival"], r["prefix_caching"]): r
                         for r in csv.DictReader(f)})
    if len(runs) == 1:
        return runs[0]
    out = {}
    for key in dict.fromkeys(k for r in runs for k in r):
        ok = [r[key] for r in runs if key in r and r[key]["status"] == "ok"]
        if 2 * len(ok) <= len(runs):
            some = next(r[key] for r in runs if key in r)
            out[key] = dict(some, status="partial")
            continue
        row = dict(ok[0])
        for c in row:
            if c in LABELS:
                continue
            v = sorted(x for x in (num(r, c) for r in ok) if x is not None)
            if v:
                k = len(v) // 2
                row[c] = repr(v[k] if len(v) % 2 else (v[k - 1] + v[k]) / 2.0)
            else:
                row[c] = ""
        out[key] = row
    return out


def num(r, k):
    v = r.get(k, "")
    try:
        return float(v) if v not in ("", "NaN") else None
    except ValueError:
        return None


def traces(d):
    """(scheme, arrival, prefix_caching) -> the point's decode steps, from raw.jsonl."""
    out = {}
    with open(f"{d}/raw.jsonl") as f:
        for line in f:
            x = json.loads(line)
            if "steps" in x and "row" in x:
                r = x["row"]
                key = (r["scheme"], r["arrival"], str(r["prefix_caching"]).lower())
                out[key] = x["steps"]
    return out


def timed(s):
    """Whether a trace step recorded its own time and context."""
    t = s.get("step_s")
    return isinstance(t, (int, float)) and not math.isnan(t) and bool(s.get("context_tokens"))


def after_prefill_extra(steps, fit):
    """Mean time of the steps right after a prefill beyond what `fit` gives their batch and
    context, ms; or None."""
    fixed, per_seq, per_token, _ = fit
    extra = [s["step_s"] * 1e3 - (fixed + per_seq * s["running"]
                                  + per_token * s["context_tokens"] / 1e3)
             for s in steps if timed(s) and s.get("prefill_tokens")]
    return sum(extra) / len(extra) if extra else None


def fit_steps(steps):
    """The decode steps that recorded their time, not right after a prefill (those carry the
    cache refill, `after_prefill_extra`), as  step = g(running) + per_token ·
    context_tokens:  per_token is the within-batch-size slope (least squares with one intercept
    per batch size, so a per-batch cost that is not linear in the batch does not leak into it),
    and the intercepts g(b) fitted by weighted least squares to  fixed + per_seq · b.
    Returns (fixed ms, per_seq ms, per_token us, steps) or None."""
    groups = {}
    for s in steps:
        if timed(s) and not s.get("prefill_tokens"):
            groups.setdefault(s["running"], []).append((s["context_tokens"], s["step_s"]))
    sxy = sxx = 0.0
    means = []
    for b, g in groups.items():
        mx = sum(x for x, _ in g) / len(g)
        my = sum(y for _, y in g) / len(g)
        sxy += sum((x - mx) * (y - my) for x, y in g)
        sxx += sum((x - mx) ** 2 for x, _ in g)
        means.append((b, mx, my, len(g)))
    if len(means) < 2 or sxx <= 0:
        return None
    k = sxy / sxx
    # g(b) = mean step − k · mean context, then fixed + per_seq · b weighted by the steps.
    w = sum(n for *_, n in means)
    bm = sum(b * n for b, _, _, n in means) / w
    gm = sum((y - k * x) * n for _, x, y, n in means) / w
    sbb = sum(n * (b - bm) ** 2 for b, _, _, n in means)
    sbg = sum(n * (b - bm) * (y - k * x - gm) for b, x, y, n in means)
    per_seq = sbg / sbb if sbb > 0 else 0.0
    return ((gm - per_seq * bm) * 1e3, per_seq * 1e3, k * 1e6, int(w))


def step_ratio(steps, fit):
    """The measured steps that followed no prefill against `fit` (the other run's step fit)
    at each one's own batch and context: Σ measured / Σ fitted, or None. Above 1, the
    serving path's steps ran slower than the other run's model of them at the same shapes,
    whatever the schedule (a machine slower than when it was calibrated, or a term priced
    low); the schedule's own differences (more or fewer sequences at once) do not enter."""
    fixed, per_seq, per_token, _ = fit
    own = [s for s in steps if timed(s) and not s.get("prefill_tokens")]
    pred = sum(fixed + per_seq * s["running"] + per_token * s["context_tokens"] / 1e3
               for s in own)
    return sum(s["step_s"] * 1e3 for s in own) / pred if own and pred > 0 else None


def prefill_rate(steps):
    """Seconds per prefilled token over the samples that prefilled, ms; or None."""
    pre = [s for s in steps if s.get("prefill_tokens")]
    t = sum(s["prefill_s"] for s in pre)
    n = sum(s["prefill_tokens"] for s in pre)
    return t / n * 1e3 if n else None


def profile_probe(d):
    """The speed probe of the profile a simulated run ran on (its meta.json's `profile`), or
    None."""
    try:
        with open(f"{d}/meta.json") as f:
            p = json.load(f).get("profile", {}).get("probe")
    except (OSError, ValueError, AttributeError):
        return None
    return p if isinstance(p, dict) and "prefill_ms" in p and "step_ms" in p else None


def slowdown(m, base):
    """`prefill × / step ×` of a measured row's probe against the profile's, or "-"."""
    a, b = num(m, "probe_prefill_ms"), num(m, "probe_step_ms")
    if base is None or a is None or b is None:
        return "-"
    return f"{a / base['prefill_ms']:.3f} / {b / base['step_ms']:.3f}"


def table(title, head, lines, md):
    """Prints a titled table after a blank line: markdown with `md`, else tab-separated."""
    print()
    print(title)
    print()
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for line in [head] * (not md) + lines:
        print(("| " + " | ".join(line) + " |") if md else "\t".join(line))

def terms(meas_dir, sim_dir, md):
    """Prints the step fits of every point both runs traced."""
    try:
        tm, ts = traces(meas_dir), traces(sim_dir)
    except OSError:
        return
    base = profile_probe(sim_dir) if OTHER == "simulated" else None
    meas = rows(meas_dir)
    lines = []
    for key, m in tm.items():
        s = ts.get(key)
        fm, fs = fit_steps(m), (fit_steps(s) if s else None)
        if fm is None or fs is None:
            continue
        pm, ps = prefill_rate(m), prefill_rate(s)
        am, as_ = after_prefill_extra(m, fm), after_prefill_extra(s, fs)
        cell = lambda a, b, f: f"{a:{f}} → {b:{f}}" if a is not None and b is not None else "-"
        r = step_ratio(m, fs)
        lines.append([key[0], key[1], cell(fm[0], fs[0], ".2f"), cell(fm[1], fs[1], ".2f"),
                      cell(fm[2], fs[2], ".2f"), cell(am, as_, ".1f"),
                      cell(pm, ps, ".3f"), f"{r:.3f}" if r is not None else "-",
                      slowdown(meas.get(key, {}), base), f"{fm[3]} / {fs[3]}"])
    if not lines:
        return
    head = ["scheme", "load", "step fixed ms", "per sequence ms", "per cached token µs",
            "after a prefill, ms more", "prefill ms per token",
            f"measured steps ÷ {OTHER} fit, same shapes",
            "speed probe ÷ calibration's: prefill / step", "steps"]
    table(f"Decode steps fitted (measured → {OTHER}):", head, lines, md)


def requests(d):
    """(scheme, arrival label, prefix_caching) -> {request id: (TPOT ms, stalls)}, from raw.jsonl."""
    out = {}
    with open(f"{d}/raw.jsonl") as f:
        for line in f:
            x = json.loads(line)
            t = x.get("token_s") if x.get("kind") == "request" else None
            if not t or len(t) < 3 or x.get("status") != "ok":
                continue
            a = x.get("arrival", {})
            label = f"{a.get('kind', '?')} {a.get('rate', '')}".strip()
            key = (x["scheme"], label, str(x.get("prefix_caching")).lower())
            itl = [b - a_ for a_, b in zip(t, t[1:])]
            med = sorted(itl)[len(itl) // 2]
            tpot = 1000.0 * (t[-1] - x["first_token_s"]) / (len(t) - 1)
            out.setdefault(key, {})[x["id"]] = (tpot, sum(1 for g in itl if g > 3 * med))
    return out


def tpot_conditioning(meas_dir, sim_dir, md):
    """Prints, per point, mean TPOT and how much the TPOT p50 moves if one request changes cluster."""
    try:
        rm, rs = requests(meas_dir), requests(sim_dir)
    except OSError:
        return
    lines = []
    for key, m in rm.items():
        s = rs.get(key, {})
        ids = [i for i in m if i in s]
        if len(ids) < 4:
            continue
        mean = lambda d: sum(d[i][0] for i in ids) / len(ids)
        a, b = mean(m), mean(s)

        def gap(d):
            v = sorted(d[i][0] for i in ids)
            k = len(v) // 2
            return 100.0 * (v[min(k + 1, len(v) - 1)] - v[max(k - 2, 0)]) / v[k]

        flips = sum(1 for i in ids if m[i][1] != s[i][1])
        lines.append([key[0], key[1], f"{a:.4g} → {b:.4g} ({100.0 * (b / a - 1.0):+.1f} %)",
                      f"{gap(m):.0f} % / {gap(s):.0f} %", f"{flips} of {len(ids)}"])
    if not lines:
        return
    head = ["scheme", "arrival", f"mean TPOT ms: measured → {OTHER} (error)",
            "spread of the 4 TPOTs around the median, % of it: measured / " + OTHER,
            "requests whose stall count differs"]
    table("TPOT p50's conditioning (per request, from raw.jsonl):", head, lines, md)


def in_spread(a, b, c, lim):
    """Whether `b` is within `lim` % of `a` or of `c`, or between them."""
    near = lambda x: x is not None and x != 0 and abs(100.0 * (b / x - 1.0)) <= lim
    return near(a) or near(c) or (c is not None and min(a, c) <= b <= max(a, c))


def main():
    argv = sys.argv[1:]
    again_dir = None
    for i, a in enumerate(argv):
        if a.startswith("--between="):
            argv[i:i + 1] = ["--between", a.split("=", 1)[1]]
            break
    if "--between" in argv:
        i = argv.index("--between")
        if i + 1 >= len(argv) or argv[i + 1].startswith("--") or not argv[i + 1]:
            sys.exit("compare-sim.py: --between needs a second measured run's folder\n" + __doc__)
        again_dir = argv[i + 1]
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    md = "--markdown" in argv
    runs = [len(folders(d)) for d in args]
    for side, d, n in zip(("measured", OTHER), args, runs):
        if n > 1:
            print(f"{side}: each point the median over {n} runs ({d})")
    if max(runs) > 1:
        print()
    meas, sim = rows(args[0]), rows(args[1])
    again = rows(again_dir) if again_dir else None
    cols = [("request_throughput", 10.0), ("ttft_ms_p50", 15.0), ("ttft_ms_p95", 15.0),
            ("tpot_ms_p50", 15.0), ("tpot_ms_p95", 15.0)]
    head = ["scheme", "load"] + [f"{c}: measured → {OTHER} (error)" for c, _ in cols] + [
        "within"
    ] + ["within either measured run or between"] * (again is not None)
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print("\t".join(head))
    ok = total = spread_ok = spread_total = 0
    errs = {c: [] for c, _ in cols}
    inside = {c: 0 for c, _ in cols}
    for key, m in meas.items():
        s = sim.get(key)
        if s is None or m["status"] != "ok" or s["status"] != "ok":
            continue
        total += 1
        r = again.get(key) if again is not None else None
        r = r if r is not None and r["status"] == "ok" else None
        cells, good, spread = [], True, r is not None
        for c, lim in cols:
            a, b = num(m, c), num(s, c)
            if a is None or b is None or a == 0:
                cells.append("-")
                continue
            e = 100.0 * (b / a - 1.0)
            errs[c].append(abs(e))
            inside[c] += abs(e) <= lim
            good &= abs(e) <= lim
            spread = spread and in_spread(a, b, num(r, c), lim)
            cell = f"{a:.4g} → {b:.4g} ({e:+.1f} %)"
            cells.append(cell if abs(e) <= lim or not md else f"**{cell}**")
        ok += good
        spread_total += r is not None
        spread_ok += spread
        line = [key[0], key[1]] + cells + ["yes" if good else "no"]
        if again is not None:
            line.append("-" if r is None else "yes" if spread else "no")
        print(("| " + " | ".join(line) + " |") if md else "\t".join(line))
    print()
    for c, _ in cols:
        e = sorted(errs[c])
        if e:
            print(f"{c}: median |error| {e[len(e) // 2]:.1f} %, worst {e[-1]:.1f} %, "
                  f"{inside[c]} of {len(e)} within target")
    print(f"{ok} of {total} points within target (throughput ±10 %, TTFT/TPOT p50/p95 ±15 %)")
    if again is not None:
        print(f"{spread_ok} of {spread_total} points within target of either measured run or "
              "between them (the measurement's own spread; not the target)")
    if max(runs) > 1:
        # The step fits and TPOT conditioning compare one run with one run; a median side has
        # no steps of its own (compare the runs pairwise for those).
        return
    terms(args[0], args[1], md)
    tpot_conditioning(args[0], args[1], md)


if __name__ == "__main__":
    main()
