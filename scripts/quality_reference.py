#!/usr/bin/env python3
"""Independent reference values for kvbench's TurboQuant and paired-statistics tests.

Standard library only (no numpy on the build machines). Re-derives, with code that shares
nothing with the Rust implementation:

- the Lloyd-Max quantizer of N(0, 1) at 1-4 bits (Lloyd's iteration, libm erfc), to compare
  with Max (1960) Table I as pinned in src/kv/quant/codebook.rs;
- SplitMix64's first outputs for seed 0;
- the numbers pinned in src/quality/paired/tests.rs (paired t interval, llama.cpp ppl_se,
  type-7 KL percentiles, noise floor).

Usage: python3 scripts/quality_reference.py
"""

import math
import statistics as st


def lloyd_max(bits):
    """Lloyd's iteration with Python's libm erfc for the cell moments (the Rust code uses
    statrs's erfc): centroid = (phi(a) - phi(b)) / (Phi(b) - Phi(a))."""
    phi = lambda x: 0.0 if math.isinf(x) else math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))
    xphi = lambda x: 0.0 if math.isinf(x) else x * phi(x)
    levels = 1 << bits
    c = [-2.5 + 5.0 * (i + 0.5) / levels for i in range(levels)]

    def cells(c):
        t = [(c[i] + c[i + 1]) / 2 for i in range(levels - 1)]
        return list(zip([-math.inf] + t, t + [math.inf]))

    for _ in range(1_000_000):
        new = [(phi(a) - phi(b)) / (cdf(b) - cdf(a)) for a, b in cells(c)]
        done = max(abs(x - y) for x, y in zip(new, c)) < 1e-13
        c = new
        if done:
            break
    mse = 0.0
    for (a, b), ci in zip(cells(c), c):
        p = cdf(b) - cdf(a)
        m1 = phi(a) - phi(b)
        m2 = p - (xphi(b) - xphi(a))
        mse += m2 - 2 * ci * m1 + ci * ci * p
    return c, mse


def splitmix64(seed, n):
    m = (1 << 64) - 1
    out = []
    for _ in range(n):
        seed = (seed + 0x9E3779B97F4A7C15) & m
        z = seed
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        out.append(z ^ (z >> 31))
    return out


def main():
    print("== Lloyd-Max N(0,1) ==")
    for b in range(1, 5):
        c, mse = lloyd_max(b)
        pos = [round(v, 4) for v in c[len(c) // 2:]]
        print(f"{b} bits: +levels {pos}  mse {mse:.6f}")
    print("== SplitMix64 seed 0 ==")
    print([hex(v) for v in splitmix64(0, 3)])

    print("== ppl_se, NLL (1,2,3,4) ==")
    x = [1.0, 2.0, 3.0, 4.0]
    m = sum(x) / len(x)
    se = math.sqrt((sum(v * v for v in x) / len(x) - m * m) / (len(x) - 1))
    print(f"ppl {math.exp(m)!r} ppl_se {math.exp(m) * se!r}")

    print("== paired t interval ==")
    a = [3.0, 3.1, 3.3, 3.2]
    b = [2.9, 3.0, 3.1, 3.15]
    d = [p - q for p, q in zip(a, b)]
    md, sd = st.mean(d), st.stdev(d)
    se = sd / math.sqrt(len(d))
    t = 3.182446305284263  # t_0.975,3 from printed tables
    lo, hi = md - t * se, md + t * se
    pr = math.exp(st.mean(b))
    print(f"mean {md!r} se {se!r} ci [{lo!r}, {hi!r}]")
    print(f"delta % {100 * math.expm1(md)!r} in [{100 * math.expm1(lo)!r}, {100 * math.expm1(hi)!r}]")
    print(f"ppl_ref {pr!r} ppl {math.exp(st.mean(a))!r} delta {pr * math.expm1(md)!r} "
          f"in [{pr * math.expm1(lo)!r}, {pr * math.expm1(hi)!r}]")

    print("== KL percentiles (type 7) ==")
    kl = [((i * 7919) % 1000) / 1000.0 * 0.01 for i in range(2000)] + [0.5, 1.25, 3.0]
    q = st.quantiles(kl, n=1000, method="inclusive")
    print(f"p99.9 {q[998]!r} p99 {q[989]!r} p95 {q[949]!r} p90 {q[899]!r} "
          f"median {st.median(kl)!r} mean {st.mean(kl)!r} max {max(kl)!r}")

    print("== noise floor ==")
    p = [10.0, 10.2, 9.9]
    print(f"mean {st.mean(p)!r} sd {st.stdev(p)!r} spread % {100 * (max(p) - min(p)) / st.mean(p)!r}")


if __name__ == "__main__":
    main()
