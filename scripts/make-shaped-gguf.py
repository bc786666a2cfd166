#!/usr/bin/env python3
"""Writes a GGUF with a real model's shapes and random Q8_0 weights, for loading, memory and
speed runs at users' scale on machines that cannot fetch the real checkpoint.

    pip install gguf==0.19.0 numpy
    python3 scripts/make-shaped-gguf.py --shape llama-3-8b --out /tmp/llama-3-8b-shaped.Q8_0.gguf

Shapes are the published config.json values (meta-llama/Meta-Llama-3-8B: 32 layers, hidden
4096, 32 query heads, 8 KV heads, FFN 14336, vocab 128256, rope_theta 500000, rms eps 1e-5,
context 8192). The tokenizer is the default model's (SmolLM2's byte-level BPE, read from
`--tokenizer-from`), its vocabulary padded with unused control tokens to the shape's vocab so
the embedding and output matrices have the real sizes. Weights: int8 codes uniform in
[-127, 127] with one f16 scale per block of 32 set so each row's dot products keep unit scale
(w ~ 1/sqrt(in)); norms are ones. The numbers the model computes are meaningless; its bytes,
shapes and work per token are the real model's (8.53e9 bytes for llama-3-8b).

Tensors are streamed to the file one at a time (peak memory ~ one tensor), seeded by --seed.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - environment
    sys.exit("make-shaped-gguf: needs gguf-py: python3 -m pip install gguf==0.19.0")

# name: (layers, hidden, q heads, kv heads, ffn, vocab, rope theta, rms eps, context, source)
SHAPES = {
    "llama-3-8b": (32, 4096, 32, 8, 14336, 128256, 500000.0, 1e-5, 8192,
                   "meta-llama/Meta-Llama-3-8B config.json"),
    "llama-3.2-1b": (16, 2048, 32, 8, 8192, 128256, 500000.0, 1e-5, 8192,
                     "meta-llama/Llama-3.2-1B config.json (untied here)"),
    "tiny": (2, 256, 4, 2, 512, 49152, 10000.0, 1e-5, 2048, "a small test shape"),
}

Q8_0_BLOCK = 32
Q8_0_BYTES = 34


def q8_0_random(rng, rows, cols):
    """Random Q8_0 blocks for a [rows, cols] matrix: bytes [rows, cols/32*34]."""
    blocks = rows * (cols // Q8_0_BLOCK)
    out = np.empty((blocks, Q8_0_BYTES), dtype=np.uint8)
    # codes uniform in [-127, 127]: std 73.6; scale so w has std 1/sqrt(cols)
    d = np.float16(1.0 / (73.6 * np.sqrt(cols)))
    out[:, 0:2] = np.frombuffer(np.array([d], dtype=np.float16).tobytes(), dtype=np.uint8)
    out[:, 2:] = rng.integers(-127, 128, size=(blocks, Q8_0_BLOCK), dtype=np.int8).view(np.uint8)
    return out.reshape(rows, cols // Q8_0_BLOCK * Q8_0_BYTES)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokenizer-from", type=Path,
                    default=Path.home() / ".local/share/kvbench/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                    help="a GGUF whose gpt2 tokenizer to copy (default: kvbench's default model; "
                         "`kvbench fetch` prints its path)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    layers, hidden, nq, nkv, ffn, vocab, theta, eps, ctx, source = SHAPES[a.shape]
    head_dim = hidden // nq
    if not a.tokenizer_from.is_file():
        sys.exit(f"make-shaped-gguf: --tokenizer-from {a.tokenizer_from} does not exist; run "
                 "`kvbench fetch` first or pass a GGUF with a gpt2 tokenizer")
    src = gguf.GGUFReader(a.tokenizer_from)

    def field(name):
        f = src.fields[name]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = field("tokenizer.ggml.tokens")
    merges = field("tokenizer.ggml.merges")
    if len(tokens) > vocab:
        sys.exit(f"make-shaped-gguf: the tokenizer has {len(tokens)} tokens, more than {vocab}")
    types = [1] * len(tokens) + [3] * (vocab - len(tokens))
    tokens = tokens + [f"<|kvbench_unused_{i}|>" for i in range(vocab - len(tokens))]
    bos = int(src.fields["tokenizer.ggml.bos_token_id"].parts[-1][0])
    eos = int(src.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"{a.shape}-shaped-random-q8_0")
    w.add_description(f"random Q8_0 weights with the shapes of {source}; seed {a.seed}")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(nq)
    w.add_head_count_kv(nkv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    mats = [("token_embd.weight", vocab, hidden)]
    for i in range(layers):
        mats += [
            (f"blk.{i}.attn_q.weight", hidden, hidden),
            (f"blk.{i}.attn_k.weight", nkv * head_dim, hidden),
            (f"blk.{i}.attn_v.weight", nkv * head_dim, hidden),
            (f"blk.{i}.attn_output.weight", hidden, hidden),
            (f"blk.{i}.ffn_gate.weight", ffn, hidden),
            (f"blk.{i}.ffn_up.weight", ffn, hidden),
            (f"blk.{i}.ffn_down.weight", hidden, ffn),
        ]
    mats.append(("output.weight", vocab, hidden))
    norms = [f"blk.{i}.{n}.weight" for i in range(layers) for n in ("attn_norm", "ffn_norm")]
    norms.append("output_norm.weight")

    order = []
    for name, rows, cols in mats:
        nbytes = rows * cols // Q8_0_BLOCK * Q8_0_BYTES
        w.add_tensor_info(name, (rows, cols // Q8_0_BLOCK * Q8_0_BYTES), np.dtype(np.uint8),
                          nbytes, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        order.append(("q", name, rows, cols))
    for name in norms:
        w.add_tensor_info(name, (hidden,), np.dtype(np.float32), hidden * 4)
        order.append(("n", name, hidden, 0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(a.seed)
    total = 0
    for k, (kind, name, rows, cols) in enumerate(order):
        t = q8_0_random(rng, rows, cols) if kind == "q" else np.ones(rows, dtype=np.float32)
        w.write_tensor_data(t)
        total += t.nbytes
        if kind == "q" and (k % 28 == 0 or name == "output.weight"):
            print(f"make-shaped-gguf: {name} ({total / 1e9:.2f} GB written)", file=sys.stderr)
    w.close()
    print(f"make-shaped-gguf: wrote {a.out} ({a.out.stat().st_size} bytes, {a.shape}, seed {a.seed})")


if __name__ == "__main__":
    main()
