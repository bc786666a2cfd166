#!/usr/bin/env python3
"""Batched greedy decode timed on llama.cpp (through llama-cpp-python's low-level C API), on the
same GGUF and the same prompt token ids as `kvbench sweep`.

Part of scripts/compare-llamacpp.sh; not run by CI. Needs llama-cpp-python (pinned 0.3.36 by the
script) and numpy.

Per point (cache type × batch × prompt length) it does what kvbench's sweep does
(src/measure/sweep.rs):
- a fresh context with `n_seq_max = batch`, `n_ctx = batch × pad256(seq_len + gen)` (one KV
  stream per sequence, llama.cpp's default `kv_unified = false`), `n_batch = batch × seq_len`
  so the whole prompt goes in one `llama_decode` (llama.cpp splits it into `n_ubatch` = 512-token
  micro-batches), K and V caches of `type_k = type_v = cache type`, flash attention on (llama.cpp
  refuses a quantized V cache without it; it is on for f16 too, so every cache type runs the same
  attention kernel), `n_threads = n_threads_batch = --threads`;
- `--warmup` untimed runs of min(4, gen) tokens, then `--repeats` timed runs, each after
  `llama_memory_clear`:
  - TTFT (ms): one `llama_decode` of all `batch × seq_len` prompt tokens (logits only for each
    sequence's last token) + the greedy pick of each sequence's first token;
  - ITL (ms), gen − 1 times: one `llama_decode` of a batch holding one token per sequence (each
    sequence's previous pick, at position seq_len + step) + the greedy picks.
  Batches are filled before the clock starts; each timed span ends with `llama_synchronize` and
  the argmax over the logits (as kvbench's steps end with the argmax on the host).

llama.cpp rotates quantized K/V caches with a Hadamard transform (blocks of 64) unless the
environment variable LLAMA_ATTN_ROT_DISABLE is set to a non-zero number when the KV cache is
created (src/llama-kv-cache.cpp). `--rotation off` sets it for this process; whether rotation was
actually on is read back from llama.cpp's own log line (`attn_rot_k = 0|1`) and recorded.

Output: one JSON object per point appended to --out (JSON Lines), with the same timing fields as
kvbench's raw.jsonl (`ttft_ms`: [repeat], `itl_ms`: [repeat][step]) and what was used.
Exit codes: 0 ok, 1 llama.cpp failed (load, context, decode), 2 bad arguments.
"""

import argparse
import ctypes
import json
import os
import re
import sys
import time

CACHE_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}  # ggml_type ids (ggml.h)


def die(code, msg):
    print(f"llamacpp_decode: {msg}", file=sys.stderr)
    sys.exit(code)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--prompts", required=True,
                   help="JSON from `cargo run --example dump_prompts` (kvbench's prompt token ids)")
    p.add_argument("--points", required=True,
                   help="BATCHxSEQ_LEN, comma-separated (each must be in --prompts)")
    p.add_argument("--cache-types", default="f16,q8_0,q4_0",
                   help=f"K/V cache types, comma-separated: {', '.join(CACHE_TYPES)}")
    p.add_argument("--rotation", choices=["default", "off"], default="default",
                   help="off: LLAMA_ATTN_ROT_DISABLE=1 (no Hadamard rotation of quantized caches)")
    p.add_argument("--gen", type=int, default=32, help="tokens generated per sequence (≥ 2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--pass", dest="pass_no", type=int, default=1, help="recorded as is")
    p.add_argument("--out", required=True, help="JSON Lines file to append to")
    p.add_argument("--log", help="file for llama.cpp's own log (default: discarded)")
    p.add_argument("--text", help="the text the prompts were cut from (WikiText-2 wiki.test.raw): "
                   "each prompt, detokenized by llama.cpp, must occur in it")
    a = p.parse_args(argv)
    if a.gen < 2:
        die(2, f"--gen {a.gen} leaves no decode step to time; use ≥ 2")
    if a.threads < 1 or a.repeats < 1 or a.warmup < 0:
        die(2, "--threads and --repeats must be ≥ 1, --warmup ≥ 0")
    a.cache_types = [c.strip() for c in a.cache_types.split(",") if c.strip()]
    for c in a.cache_types:
        if c not in CACHE_TYPES:
            die(2, f"--cache-types: `{c}` is not one of {', '.join(CACHE_TYPES)}")
    pts = []
    for s in a.points.split(","):
        m = re.fullmatch(r"\s*(\d+)x(\d+)\s*", s)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            die(2, f"--points: `{s}` is not BATCHxSEQ_LEN with both ≥ 1")
        pts.append((int(m.group(1)), int(m.group(2))))
    a.points = pts
    return a


CONTENDED_CORES = 0.15  # kvbench's threshold (src/measure/contention.rs)


def cpu_sample():
    """(monotonic s, machine busy ticks, this process's ticks) from /proc, or None.

    The method of kvbench's src/measure/contention.rs: /proc/stat's cpu line, user + nice +
    system + irq + softirq + steal; /proc/self/stat's utime + stime (all threads)."""
    try:
        with open("/proc/stat") as f:
            cpu = next(l for l in f if l.startswith("cpu "))
        with open("/proc/self/stat") as f:
            own = f.read()
    except (OSError, StopIteration):
        return None
    v = [int(x) for x in cpu.split()[1:]]
    busy = sum(v[i] for i in (0, 1, 2, 5, 6, 7) if i < len(v))
    rest = own[own.rfind(")") + 1:].split()
    return time.monotonic(), busy, int(rest[11]) + int(rest[12])


def other_cores(spans):
    """Cores other processes occupied on average over [(sample, sample)] spans, or None."""
    hz = os.sysconf("SC_CLK_TCK")
    spans = [(a, b) for a, b in spans if a and b]
    wall = sum(b[0] - a[0] for a, b in spans)
    if wall <= 0:
        return None
    ticks = sum(max((b[1] - a[1]) - (b[2] - a[2]), 0) for a, b in spans)
    return ticks / hz / wall


def load_avg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


class Llama:
    """The model, loaded once; llama.cpp's log captured (for the rotation flags it prints)."""

    def __init__(self, L, path, log_path):
        self.L = L
        self.log_lines = []
        self.log_file = open(log_path, "a") if log_path else None

        @L.llama_log_callback
        def on_log(level, text, user_data):
            s = text.decode("utf-8", "replace") if text else ""
            self.log_lines.append(s)
            if self.log_file:
                self.log_file.write(s)

        self._on_log = on_log  # keep the callback alive
        L.llama_log_set(on_log, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            die(1, f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def detokenize(self, ids):
        """The bytes llama.cpp's vocabulary gives `ids` (special tokens rendered)."""
        buf = ctypes.create_string_buffer(256)
        out = []
        for t in ids:
            n = self.L.llama_token_to_piece(self.vocab, t, buf, len(buf), 0, True)
            if n < 0:
                die(1, f"token {t} has no piece in llama.cpp's vocabulary (n_vocab {self.n_vocab})")
            out.append(buf.raw[:n])
        return b"".join(out)


def rot_flags(lines):
    """(attn_rot_k, attn_rot_v) from llama.cpp's KV-cache log lines, None where not printed."""
    k = v = None
    for s in lines:
        m = re.search(r"attn_rot_k = (\d)", s)
        if m:
            k = int(m.group(1))
        m = re.search(r"attn_rot_v = (\d)", s)
        if m:
            v = int(m.group(1))
    return k, v


def context_params(L, cache_type, n_ctx, n_batch, n_seq_max, threads):
    """llama.cpp context parameters as both comparison scripts use them: K and V caches of
    `cache_type` (CACHE_TYPES), flash attention on (needed for quantized V), perf counters off."""
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_batch
    cp.n_seq_max = n_seq_max
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
    cp.type_k = CACHE_TYPES[cache_type]
    cp.type_v = CACHE_TYPES[cache_type]
    cp.no_perf = True
    return cp


def pad256(n):
    return (n + 255) // 256 * 256


def run_point(lm, args, cache_type, batch, seq_len, rows):
    import numpy as np

    L = lm.L
    gen = args.gen
    cp = context_params(L, cache_type, batch * pad256(seq_len + gen),
                        max(batch * seq_len, batch), batch, args.threads)
    lm.log_lines.clear()
    ctx = L.llama_init_from_model(lm.model, cp)
    if not ctx:
        die(1, f"llama.cpp could not create a context ({cache_type}, batch {batch}, "
               f"seq_len {seq_len}); rerun with --log FILE to see why")
    rot_k, rot_v = rot_flags(lm.log_lines)
    mem = L.llama_get_memory(ctx)
    n_vocab = lm.n_vocab
    lb = L.llama_batch_init(cp.n_batch, 0, 1)

    def fill(tokens_by_seq, pos0, last_only):
        """One batch: sequence s gets tokens_by_seq[s] at positions pos0.. ."""
        i = 0
        for s, toks in enumerate(tokens_by_seq):
            for j, t in enumerate(toks):
                lb.token[i] = t
                lb.pos[i] = pos0 + j
                lb.n_seq_id[i] = 1
                lb.seq_id[i][0] = s
                lb.logits[i] = (j == len(toks) - 1) if last_only else True
                i += 1
        lb.n_tokens = i
        # index of each sequence's output row in this batch
        return [sum(len(t) for t in tokens_by_seq[: s + 1]) - 1 for s in range(len(tokens_by_seq))]

    def decode_and_pick(out_idx):
        rc = L.llama_decode(ctx, lb)
        if rc != 0:
            die(1, f"llama_decode returned {rc} ({cache_type}, batch {batch}, seq_len {seq_len})")
        L.llama_synchronize(ctx)
        picks = []
        for i in out_idx:
            ptr = L.llama_get_logits_ith(ctx, i)
            picks.append(int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax()))
        return picks

    def one_run(n_gen):
        L.llama_memory_clear(mem, True)
        idx = fill(rows, 0, last_only=True)
        t0 = time.perf_counter_ns()
        nxt = decode_and_pick(idx)
        ttft = (time.perf_counter_ns() - t0) / 1e6
        generated = [nxt[0]]
        itl = []
        for step in range(1, n_gen):
            idx = fill([[t] for t in nxt], seq_len + step - 1, last_only=False)
            t0 = time.perf_counter_ns()
            nxt = decode_and_pick(idx)
            itl.append((time.perf_counter_ns() - t0) / 1e6)
            generated.append(nxt[0])
        return ttft, itl, generated

    for _ in range(args.warmup):
        one_run(min(4, gen))
    load_before = load_avg()
    ttft_ms, itl_ms, spans = [], [], []
    for _ in range(args.repeats):
        a = cpu_sample()
        t, itl, generated = one_run(gen)
        spans.append((a, cpu_sample()))
        ttft_ms.append(t)
        itl_ms.append(itl)
    load_after = load_avg()
    oc = other_cores(spans)
    L.llama_batch_free(lb)
    L.llama_free(ctx)
    return {
        "ttft_ms": ttft_ms,
        "itl_ms": itl_ms,
        "generated": generated,
        "attn_rot_k": rot_k,
        "attn_rot_v": rot_v,
        "n_ctx": cp.n_ctx,
        "n_batch": cp.n_batch,
        "load_before": load_before,
        "load_after": load_after,
        "other_cores": oc,
        "contended": oc is not None and oc > CONTENDED_CORES,
    }


def main(argv):
    args = parse_args(argv)
    if args.rotation == "off":
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    else:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    try:
        with open(args.prompts) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        die(2, f"--prompts {args.prompts}: {e}")
    table = {(p["batch"], p["seq_len"]): p["tokens"] for p in doc.get("prompts", [])}
    for pt in args.points:
        if pt not in table:
            die(2, f"--points: {pt[0]}x{pt[1]} is not in {args.prompts}; dump it first")
    try:
        import llama_cpp as L
        import numpy  # noqa: F401
    except ImportError as e:
        die(1, f"{e}; run scripts/compare-llamacpp.sh, which installs llama-cpp-python")
    lm = Llama(L, args.model, args.log)
    system_info = L.llama_print_system_info().decode()
    if args.text:
        # Same prompts, checked independently of kvbench: llama.cpp's own vocabulary must turn
        # every prompt row back into a verbatim span of the source text.
        with open(args.text, "rb") as f:
            text = f.read()
        for batch, seq_len in args.points:
            for s, row in enumerate(table[(batch, seq_len)]):
                if len(row) != seq_len or lm.detokenize(row) not in text:
                    die(1, f"prompt {s} of {batch}x{seq_len} is not a span of {args.text} in "
                           "llama.cpp's vocabulary: the engines would not see the same text")
    with open(args.out, "a") as out:
        for cache_type in args.cache_types:
            for batch, seq_len in args.points:
                rows = table[(batch, seq_len)]
                r = run_point(lm, args, cache_type, batch, seq_len, rows)
                rotated = bool(r["attn_rot_k"] or r["attn_rot_v"])
                if args.rotation == "off" and rotated:
                    die(1, "LLAMA_ATTN_ROT_DISABLE=1 did not turn llama.cpp's rotation off")
                r.update({
                    "engine": "llama.cpp",
                    "engine_version": L.__version__,
                    "cache_type": cache_type,
                    "rotation": "hadamard" if rotated else ("off" if args.rotation == "off"
                                                            and cache_type != "f16" else "none"),
                    "batch": batch,
                    "seq_len": seq_len,
                    "gen": args.gen,
                    "pass": args.pass_no,
                    "threads": args.threads,
                    "flash_attn": True,
                    "kv_unified": False,
                    "system_info": system_info,
                })
                out.write(json.dumps(r) + "\n")
                out.flush()
                tpot = sum(map(sum, r["itl_ms"])) / sum(map(len, r["itl_ms"]))
                print(f"llama.cpp {cache_type:5} rot={r['rotation']:8} batch {batch} × {seq_len}: "
                      f"TTFT {sum(r['ttft_ms']) / len(r['ttft_ms']):.0f} ms, TPOT {tpot:.2f} ms, "
                      f"{batch * 1000 / tpot:.1f} tok/s"
                      + (f", CONTENDED (other processes used {r['other_cores']:.2f} cores)"
                         if r["contended"] else ""), flush=True)
    L.llama_model_free(lm.model)


if __name__ == "__main__":
    main(sys.argv[1:])
