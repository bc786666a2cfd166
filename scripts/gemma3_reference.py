#!/usr/bin/env python3
"""Independent reference values for kvbench's Gemma 3 decoder and SentencePiece tokenizer.

Reads a Gemma 3 GGUF with gguf-py (`pip install gguf==0.19.0 numpy`), dequantizes every tensor
with `gguf.quants.dequantize`, and computes in plain numpy (float64):

* the logits of a short prompt, following llama.cpp's `gemma3` graph (src/models/gemma3.cpp):
  token embedding x sqrt(hidden); per block: RMSNorm -> q/k/v -> RMSNorm per head on q and k
  (QK-norm) -> NeoX RoPE (base `gemma3.rope.freq_base` on global layers, 10000 on sliding ones)
  -> attention scaled by 1/sqrt(head_dim) with a causal mask, and on sliding layers a window
  (key visible iff query_pos - key_pos < window) -> output projection -> RMSNorm (post-attention)
  -> residual; RMSNorm -> down(gelu_tanh(gate(h)) * up(h)) -> RMSNorm (post-FFN) -> residual;
  final RMSNorm; logits = h . token_embdᵀ (tied). Norm weights are used as stored: llama.cpp's
  converter stores Gemma's (1 + w) already (convert_hf_to_gguf.py, Gemma3Model, norm_shift).
  Layer i is global when (i + 1) % 6 == 0 (llama.cpp `set_swa_pattern(6)`).
* token ids of WikiText-2 lines with a from-scratch port of llama.cpp's `llm_tokenizer_spm`
  (llama-vocab.cpp): special and user-defined tokens split out of the raw text first (longest
  first), spaces escaped as U+2581, symbols = UTF-8 characters, bigrams merged by highest
  score of the merged piece (ties: leftmost), pieces not in the vocabulary resegmented through
  their merge history down to `<0xXX>` byte tokens.

Usage: scripts/gemma3_reference.py MODEL.gguf OUT_DIR [--lines N]
Writes OUT_DIR/gemma3_270m_logits.json and OUT_DIR/gemma3_270m_tokens.json (tests/data/ holds
the output for N = 300). To check the tokenizer on more lines:
  scripts/gemma3_reference.py MODEL.gguf /tmp --lines 2500
  GEMMA3_TOKENS_JSON=/tmp/gemma3_270m_tokens.json cargo test --release --test gemma3 tokenizer

The stored norm weights already hold Gemma's 1 + w: on the 14-token prompt, mean next-token NLL
is 2.53 nats with them as stored (" Berlin" predicted last) and 16.8 nats with 1 added again.
"""

import heapq
import json
import math
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

# <bos> "The capital of France is Paris, and the capital of Germany is"
PROMPT_IDS = [2, 818, 5279, 529, 7001, 563, 9079, 236764, 532, 506, 5279, 529, 9405, 563]
LONG_WINDOW = 4  # sliding window forced on sliding layers for the windowed case
LONG_IDS = PROMPT_IDS


class Model:
    def __init__(self, path):
        self.r = gguf.GGUFReader(path)
        self.t = {t.name: t for t in self.r.tensors}
        f = self.r.fields

        def val(k):
            return f[k].contents()

        self.hidden = int(val("gemma3.embedding_length"))
        self.layers = int(val("gemma3.block_count"))
        self.nh = int(val("gemma3.attention.head_count"))
        self.nkv = int(val("gemma3.attention.head_count_kv"))
        self.hd = int(val("gemma3.attention.key_length"))
        self.eps = float(val("gemma3.attention.layer_norm_rms_epsilon"))
        self.base_global = float(val("gemma3.rope.freq_base"))
        self.base_local = 10000.0
        self.window = int(val("gemma3.attention.sliding_window"))
        self.cache = {}

    def w(self, name):
        if name not in self.cache:
            t = self.t[name]
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            shape = [int(x) for x in reversed(t.shape)]
            self.cache[name] = a.reshape(shape)
        return self.cache[name]

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base):
        # x: [n, heads, d]; NeoX pairing (i, i + d/2).
        d = x.shape[-1]
        inv = base ** (-np.arange(0, d // 2) * 2.0 / d)
        ang = np.outer(pos, inv)  # [n, d/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward(self, ids, window=None):
        window = self.window if window is None else window
        n = len(ids)
        emb = self.w("token_embd.weight")
        x = emb[ids] * math.sqrt(self.hidden)
        pos = np.arange(n)
        for i in range(self.layers):
            p = f"blk.{i}."
            sliding = (i + 1) % 6 != 0
            h = self.rms(x, self.w(p + "attn_norm.weight"))
            q = (h @ self.w(p + "attn_q.weight").T).reshape(n, self.nh, self.hd)
            k = (h @ self.w(p + "attn_k.weight").T).reshape(n, self.nkv, self.hd)
            v = (h @ self.w(p + "attn_v.weight").T).reshape(n, self.nkv, self.hd)
            q = self.rms(q, self.w(p + "attn_q_norm.weight"))
            k = self.rms(k, self.w(p + "attn_k_norm.weight"))
            base = self.base_local if sliding else self.base_global
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            rep = self.nh // self.nkv
            out = np.zeros((n, self.nh, self.hd))
            for hq in range(self.nh):
                hk = hq // rep
                s = q[:, hq, :] @ k[:, hk, :].T / math.sqrt(self.hd)  # [n, n]
                qi, kj = np.meshgrid(pos, pos, indexing="ij")
                mask = kj > qi
                if sliding:
                    mask |= (qi - kj) >= window
                s = np.where(mask, -np.inf, s)
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                out[:, hq, :] = s @ v[:, hk, :]
            a = out.reshape(n, self.nh * self.hd) @ self.w(p + "attn_output.weight").T
            x = x + self.rms(a, self.w(p + "post_attention_norm.weight"))
            h = self.rms(x, self.w(p + "ffn_norm.weight"))
            g = h @ self.w(p + "ffn_gate.weight").T
            g = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
            m = (g * (h @ self.w(p + "ffn_up.weight").T)) @ self.w(p + "ffn_down.weight").T
            x = x + self.rms(m, self.w(p + "post_ffw_norm.weight"))
        x = self.rms(x, self.w("output_norm.weight"))
        return x @ emb.T


def logit_summary(logits, probe):
    rows = []
    for row in logits:
        top = np.argsort(-row)[:5]
        rows.append(
            {
                "top5_ids": [int(t) for t in top],
                "top5_logits": [float(row[t]) for t in top],
                "probe_logits": [float(row[t]) for t in probe],
            }
        )
    return rows


class Spm:
    """llama.cpp's llm_tokenizer_spm, with its special-token partition (parse_special = true)."""

    def __init__(self, r):
        f = r.fields
        self.tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
        self.scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
        self.types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        # control (3) and user-defined (4) tokens, longest first (llama.cpp sorts by length).
        self.special = sorted(
            [t for t, ty in zip(self.tokens, self.types) if ty in (3, 4)],
            key=lambda t: -len(t),
        )
        self.add_space_prefix = bool(f["tokenizer.ggml.add_space_prefix"].contents()) if "tokenizer.ggml.add_space_prefix" in f else True

    def partition(self, text):
        frags = [(False, text)]  # (is_token, text)
        for sp in self.special:
            out = []
            for is_tok, s in frags:
                if is_tok or sp not in s:
                    out.append((is_tok, s))
                    continue
                start = 0
                while True:
                    j = s.find(sp, start)
                    if j < 0:
                        break
                    if j > start:
                        out.append((False, s[start:j]))
                    out.append((True, sp))
                    start = j + len(sp)
                if start < len(s):
                    out.append((False, s[start:]))
            frags = out
        return frags

    def encode_fragment(self, text):
        text = text.replace(" ", "\u2581")
        syms = list(text)  # UTF-8 characters
        if not syms:
            return []
        prev = list(range(-1, len(syms) - 1))
        nxt = list(range(1, len(syms) + 1))
        nxt[-1] = -1
        alive = [True] * len(syms)
        rev = {}
        heap = []

        def add(l, r):
            if l < 0 or r < 0:
                return
            t = syms[l] + syms[r]
            i = self.ids.get(t)
            if i is None:
                return
            heapq.heappush(heap, (-self.scores[i], l, r, t))
            rev[t] = (l, r, syms[l], syms[r])

        for i in range(len(syms) - 1):
            add(i, i + 1)
        merges = {}
        while heap:
            _, l, r, t = heapq.heappop(heap)
            if not alive[l] or not alive[r] or syms[l] + syms[r] != t or nxt[l] != r:
                continue
            merges[t] = (syms[l], syms[r])
            syms[l] = t
            alive[r] = False
            nxt[l] = nxt[r]
            if nxt[r] >= 0:
                prev[nxt[r]] = l
            add(prev[l], l)
            add(l, nxt[l])
        out = []

        def resegment(s):
            i = self.ids.get(s)
            if i is not None:
                out.append(i)
                return
            if s in merges:
                a, b = merges[s]
                resegment(a)
                resegment(b)
                return
            for byte in s.encode("utf-8"):
                out.append(self.ids[f"<0x{byte:02X}>"])

        i = 0
        while i >= 0 and i < len(syms):
            resegment(syms[i])
            i = nxt[i]
        return out

    def encode(self, text):
        ids = []
        for k, (is_tok, s) in enumerate(self.partition(text)):
            if is_tok:
                ids.append(self.ids[s])
            else:
                if self.add_space_prefix and k == 0:
                    s = " " + s
                ids.extend(self.encode_fragment(s))
        return ids


def main():
    path, out_dir = sys.argv[1], sys.argv[2]
    n_lines = int(sys.argv[sys.argv.index("--lines") + 1]) if "--lines" in sys.argv else 300
    m = Model(path)
    spm = Spm(m.r)
    lines = [l for l in open("/work/shared/datasets/wiki.test.raw", encoding="utf-8").read().split("\n")]
    lines = [l + "\n" for l in lines if l.strip()][:n_lines]
    toks = {"source": "wiki.test.raw, first non-empty lines each with its newline", "lines": lines,
            "ids": [spm.encode(l) for l in lines]}
    json.dump(toks, open(f"{out_dir}/gemma3_270m_tokens.json", "w"), ensure_ascii=False)
    probe = [0, 1, 2, 107, 236761, 262143]
    full = m.forward(PROMPT_IDS)
    windowed = m.forward(LONG_IDS, window=LONG_WINDOW)
    res = {
        "model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "method": "scripts/gemma3_reference.py: numpy float64 over gguf-py dequantized weights",
        "probe_ids": probe,
        "prompt_ids": PROMPT_IDS,
        "prompt": logit_summary(full, probe),
        "windowed": {"window": LONG_WINDOW, "ids": LONG_IDS, "positions": logit_summary(windowed, probe)},
    }
    json.dump(res, open(f"{out_dir}/gemma3_270m_logits.json", "w"), indent=1)
    print("prompt:", repr("".join(spm.tokens[i] for i in PROMPT_IDS)))
    print("greedy next:", [spm.tokens[r["top5_ids"][0]] for r in res["prompt"]])


if __name__ == "__main__":
    main()
