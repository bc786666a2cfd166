#!/usr/bin/env python3
"""llama.cpp's perplexity on WikiText-2, the `llama-perplexity` protocol, through llama-cpp-python.

The independent side of kvbench's perplexity on a GGUF (README "Perplexity protocol"; issue #22's
Gemma 3 target): the same file, llama.cpp's own tokenizer and forward pass, its K/V cache types.
It re-implements `llama-perplexity`'s default path (llama.cpp tools/perplexity/perplexity.cpp,
`perplexity()`): the text tokenized once with add_special (a BOS first when the vocabulary adds
one); non-overlapping windows of --ctx tokens from the start; each window's first token replaced
by BOS when the model adds one; logits for the second half; NLL of the next token for positions
ctx/2 .. ctx-2 (ctx/2 - 1 per window); perplexity = exp(mean NLL). One window per llama_decode
(n_batch = n_ctx), flash attention on (llama.cpp needs it for quantized V caches).

Prints one JSON object: per cache type, the perplexity, the mean NLL, each window's mean NLL
(for paired intervals against kvbench's `raw.jsonl` windows) and llama.cpp's attention-rotation
flags as its log printed them.

Usage (the venv scripts/compare-llamacpp.sh builds: SETUP_ONLY=1 scripts/compare-llamacpp.sh):
  ~/.local/share/kvbench/llamacpp-venv/bin/python scripts/llamacpp_perplexity.py \
      --model ~/.local/share/kvbench/models/gemma-3-270m-q4_k_m.gguf --windows 8 \
      --cache-types f16,q8_0,q4_0 [--rotation off] [--threads 2] > llamacpp-ppl.json

--rotation off sets LLAMA_ATTN_ROT_DISABLE=1 (recent llama.cpp Hadamard-rotates quantized caches;
kvbench's q8_0/q4_0 do not rotate). Exit 2 on bad arguments, 1 when llama.cpp fails.
"""

import argparse
import json
import math
import os
import sys
import time

# The cache types, context parameters and rotation-flag parsing of the decode comparison.
from llamacpp_decode import CACHE_TYPES, context_params, rot_flags  # noqa: E402


def die(code, msg):
    print(f"llamacpp_perplexity.py: {msg}", file=sys.stderr)
    sys.exit(code)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "datasets",
                                                   "wikitext-2-raw", "wiki.test.raw"))
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--cache-types", default="f16,q8_0,q4_0")
    p.add_argument("--rotation", choices=["on", "off"], default="on")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    a.cache_types = [c.strip() for c in a.cache_types.split(",") if c.strip()]
    for c in a.cache_types:
        if c not in CACHE_TYPES:
            die(2, f"--cache-types: unknown {c!r}; use one of {', '.join(CACHE_TYPES)}")
    if a.ctx < 4 or a.ctx % 2:
        die(2, f"--ctx {a.ctx}: use an even number of tokens >= 4")
    if a.windows < 1:
        die(2, f"--windows {a.windows}: use 1 or more")
    if not os.path.isfile(a.model):
        die(2, f"--model {a.model}: no such file")
    return a


def main(argv):
    a = parse_args(argv)
    if a.rotation == "off":
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    try:
        import llama_cpp as L
        import numpy as np
    except ImportError as e:
        die(1, f"{e}; SETUP_ONLY=1 scripts/compare-llamacpp.sh builds the venv with both")
    try:
        with open(a.text, "rb") as f:
            raw = f.read()
    except OSError as e:
        die(2, f"--text {a.text}: {e}")
    # llama-perplexity reads the file with its final newline removed (common's file reader).
    if raw.endswith(b"\n"):
        raw = raw[:-1]

    log = []

    @L.llama_log_callback
    def on_log(level, text, user_data):
        log.append(text.decode("utf-8", "replace") if text else "")

    L.llama_log_set(on_log, None)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(a.model.encode(), L.llama_model_default_params())
    if not model:
        die(1, f"llama.cpp could not load {a.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    add_bos = bool(L.llama_vocab_get_add_bos(vocab))
    bos = L.llama_vocab_bos(vocab)

    buf = (L.llama_token * (len(raw) + 8))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
    if n < 0:
        die(1, f"llama_tokenize needs {-n} slots")
    tokens = list(buf[:n])
    n_windows = min(a.windows, len(tokens) // a.ctx)
    first = a.ctx // 2

    out = {
        "model": os.path.abspath(a.model),
        "llama_cpp_python": L.__version__,
        "text_tokens": len(tokens),
        "add_bos": add_bos,
        "ctx": a.ctx,
        "windows": n_windows,
        "scored_per_window": a.ctx - 1 - first,
        "threads": a.threads,
        "rotation_env": a.rotation,
        "cache": {},
    }
    for ct in a.cache_types:
        cp = context_params(L, ct, a.ctx, a.ctx, 1, a.threads)
        cp.n_ubatch = a.ctx
        log.clear()
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            die(1, f"llama.cpp could not create a context with {ct} caches")
        rot_k, rot_v = rot_flags(log)
        mem = L.llama_get_memory(ctx)
        lb = L.llama_batch_init(a.ctx, 0, 1)
        window_nll = []
        t0 = time.time()
        for w in range(n_windows):
            win = tokens[w * a.ctx:(w + 1) * a.ctx]
            if add_bos:
                win[0] = bos
            L.llama_memory_clear(mem, True)
            for i, t in enumerate(win):
                lb.token[i] = t
                lb.pos[i] = i
                lb.n_seq_id[i] = 1
                lb.seq_id[i][0] = 0
                lb.logits[i] = i >= first
            lb.n_tokens = a.ctx
            rc = L.llama_decode(ctx, lb)
            if rc != 0:
                die(1, f"llama_decode returned {rc} ({ct}, window {w})")
            rows = []
            for i in range(first, a.ctx - 1):
                ptr = L.llama_get_logits_ith(ctx, i)
                rows.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float64))
            lg = np.stack(rows)
            mx = lg.max(axis=1, keepdims=True)
            lse = mx[:, 0] + np.log(np.exp(lg - mx).sum(axis=1))
            targets = np.array(win[first + 1:a.ctx])
            nll = lse - lg[np.arange(len(targets)), targets]
            window_nll.append(float(nll.mean()))
            print(f"{ct}: window {w + 1}/{n_windows} mean NLL {window_nll[-1]:.5f}", file=sys.stderr)
        L.llama_batch_free(lb)
        L.llama_free(ctx)
        mean = sum(window_nll) / len(window_nll)
        out["cache"][ct] = {
            "ppl": math.exp(mean),
            "mean_nll": mean,
            "window_nll": window_nll,
            "seconds": time.time() - t0,
            "attn_rot_k": rot_k,
            "attn_rot_v": rot_v,
        }
    L.llama_model_free(model)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
