// kvbench's CUDA kernels for KV caches: quantize-on-write (append) for every cache format,
// decode attention that reads each format directly (fused dequantize, f32 accumulation, split
// over the sequence as in FlashDecoding), H2O score accumulation and on-GPU eviction.
//
// The stored forms are the CPU formats of src/kv/format.rs and src/kv/stream.rs, with the same
// rounding (CPU = reference; tests/cuda.rs compares them), laid out as planes so that every row
// of codes is aligned:
//   codes [bh][cap][code_bytes]   meta [bh][cap][meta_bytes]
// where bh = sequence * kv_heads + kv_head and, per format (d = head_dim):
//   F16        codes 2d (binary16)                meta 0
//   INT8_TOKEN codes d  (i8, x ≈ q·s)             meta 2  (f16 scale s = absmax/127, rounded up)
//   FP8_*      codes d  (E4M3/E5M2 of x/s)        meta 2  (f16 scale s = absmax/max, rounded up)
//   INT4       codes d/2 (elt 2j low nibble)      meta 4·d/G (per group f16 scale, f16 minimum)
//   Q8_0       codes d  (ggml quantize_row_q8_0)  meta 2·d/32
//   Q4_0       codes d/2 (elt j low, j+16 high)   meta 2·d/32
//   CHAN8      KIVI keys (arXiv 2402.02750 §3.2): codes d (i8) for slots in quantized token
//              groups; per group of G tokens a block of d f16 per-channel scales in
//              chan_scales [bh][cap/G][d]; the newest rows (the residual) as f16 in a ring
//              resid [bh][R][d], R = residual + G, slot t at ring row t % R.
// Compiled with --fmad=false so products and sums round exactly as the CPU encoders do.

#ifndef KVBENCH_CUDA_EMU  // kernels/emu/cuda_emu.h provides these on the CPU
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif
#include <stdint.h>

#define F16 0
#define INT8_TOKEN 1
#define FP8_E4M3 2
#define FP8_E5M2 3
#define INT4 4
#define Q8_0 5
#define Q4_0 6
#define CHAN8 7

#define NEG_INF (-__int_as_float(0x7f800000))

// One K or V stream of one layer.
struct Stream {
    uint8_t *codes;
    uint8_t *meta;
    uint16_t *resid;        // CHAN8 only
    uint16_t *chan_scales;  // CHAN8 only
    int fmt;
    int group;       // INT4: elements per group; CHAN8: tokens per group
    int residual;    // CHAN8: f16 rows kept unquantized
    int code_bytes;  // per row
    int meta_bytes;  // per row
    int cap;         // rows per bh
};

__device__ __forceinline__ float h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ uint16_t f2h(float v) {
    return __half_as_ushort(__float2half_rn(v));
}

// The smallest f16 >= v (as src/kv/format.rs f16_round_up), saturating at f16's maximum.
__device__ __forceinline__ uint16_t f16_round_up(float v) {
    uint16_t h = f2h(v);
    if (h2f(h) < v && h != 0x7bff) {
        if (h == 0x8000) return 0x0001;
        return (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
    }
    return h;
}

__device__ __forceinline__ uint16_t f16_round_down(float v) {
    return f16_round_up(-v) ^ 0x8000;
}

__device__ __forceinline__ float fp8_decode(uint8_t c, int fmt) {
    __half_raw r = __nv_cvt_fp8_to_halfraw(
        (__nv_fp8_storage_t)c, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return h2f(r.x);
}

__device__ __forceinline__ uint8_t fp8_encode(float v, int fmt) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE,
                                          fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// Number of CHAN8 slots in quantized groups when `len` rows are held (as ChannelStream::push:
// groups are quantized while the residual holds at least residual + group rows).
__device__ __forceinline__ int chan_quantized(int len, int residual, int group) {
    return len > residual ? (len - residual) / group * group : 0;
}

// Element e of row `slot` of head `bh`, dequantized to f32.
__device__ __forceinline__ float load_elem(const Stream &s, int d, int bh, int slot, int e,
                                           int quantized) {
    const size_t row = (size_t)bh * s.cap + slot;
    const uint8_t *c = s.codes + row * s.code_bytes;
    const uint8_t *m = s.meta + row * s.meta_bytes;
    switch (s.fmt) {
    case F16:
        return h2f(((const uint16_t *)c)[e]);
    case INT8_TOKEN:
        return (float)(int8_t)c[e] * h2f(*(const uint16_t *)m);
    case FP8_E4M3:
    case FP8_E5M2:
        return fp8_decode(c[e], s.fmt) * h2f(*(const uint16_t *)m);
    case INT4: {
        const int g = e / s.group;
        const float sc = h2f(((const uint16_t *)m)[2 * g]);
        const float mn = h2f(((const uint16_t *)m)[2 * g + 1]);
        const int q = (c[e >> 1] >> ((e & 1) * 4)) & 15;
        return mn + (float)q * sc;
    }
    case Q8_0:
        return (float)(int8_t)c[e] * h2f(((const uint16_t *)m)[e >> 5]);
    case Q4_0: {
        const int j = e & 31;
        const uint8_t b = c[(e >> 5) * 16 + (j & 15)];
        const int q = (j < 16 ? b : b >> 4) & 15;
        return (float)(q - 8) * h2f(((const uint16_t *)m)[e >> 5]);
    }
    case CHAN8: {
        if (slot >= quantized) {
            const int R = s.residual + s.group;
            return h2f(s.resid[((size_t)bh * R + slot % R) * d + e]);
        }
        const size_t blk = (size_t)bh * (s.cap / s.group) + slot / s.group;
        return (float)(int8_t)c[e] * h2f(s.chan_scales[blk * d + e]);
    }
    }
    return 0.f;
}

// ---------------------------------------------------------------------------------------------
// Append (quantize on write). x: [bh][n_new][d] f32 (contiguous), rows go to slots
// lens[bh] .. lens[bh] + n_new. One block of 32 threads per (new row, bh); the row is staged in
// shared memory and each format's groups are encoded by one thread each, sequentially, in the
// CPU encoder's order (bit-exact codes).
// CHAN8 streams do not come here: see kv_chan_quantize and kv_chan_resid.
extern "C" __global__ void kv_append(Stream s, const float *__restrict__ x, const uint32_t *lens,
                                     int n_new, int d) {
    const int i = blockIdx.x, bh = blockIdx.y, lane = threadIdx.x;
    __shared__ float row[256];
    __shared__ float red[32];
    const float *xr = x + ((size_t)bh * n_new + i) * d;
    float amax = 0.f;
    for (int e = lane; e < d; e += 32) {
        row[e] = xr[e];
        amax = fmaxf(amax, fabsf(row[e]));
    }
    red[lane] = amax;
    __syncthreads();
    if (lane == 0) {
        float a = 0.f;
        for (int k = 0; k < 32; k++) a = fmaxf(a, red[k]);
        red[0] = a;
    }
    __syncthreads();
    amax = red[0];
    const int slot = (int)lens[bh] + i;
    const size_t r = (size_t)bh * s.cap + slot;
    uint8_t *c = s.codes + r * s.code_bytes;
    uint8_t *m = s.meta + r * s.meta_bytes;
    switch (s.fmt) {
    case F16:
        for (int e = lane; e < d; e += 32) ((uint16_t *)c)[e] = f2h(row[e]);
        break;
    case INT8_TOKEN: {
        const uint16_t sh = f16_round_up(amax / 127.f);
        const float sc = h2f(sh);
        const float inv = sc > 0.f ? 1.f / sc : 0.f;
        if (lane == 0) *(uint16_t *)m = sh;
        for (int e = lane; e < d; e += 32)
            c[e] = (uint8_t)(int8_t)fminf(fmaxf(roundf(row[e] * inv), -127.f), 127.f);
        break;
    }
    case FP8_E4M3:
    case FP8_E5M2: {
        const float mx = s.fmt == FP8_E4M3 ? 448.f : 57344.f;
        const uint16_t sh = f16_round_up(amax / mx);
        const float sc = h2f(sh);
        const float inv = sc > 0.f ? 1.f / sc : 0.f;
        if (lane == 0) *(uint16_t *)m = sh;
        for (int e = lane; e < d; e += 32) c[e] = fp8_encode(row[e] * inv, s.fmt);
        break;
    }
    case INT4:
        for (int g = lane; g < d / s.group; g += 32) {
            const float *xs = row + g * s.group;
            float lo = INFINITY, hi = -INFINITY;
            for (int k = 0; k < s.group; k++) {
                lo = fminf(lo, xs[k]);
                hi = fmaxf(hi, xs[k]);
            }
            const uint16_t mh = f16_round_down(lo);
            const float mf = h2f(mh);
            const uint16_t dh = f16_round_up((hi - mf) / 15.f);
            const float df = h2f(dh);
            const float inv = df > 0.f ? 1.f / df : 0.f;
            ((uint16_t *)m)[2 * g] = dh;
            ((uint16_t *)m)[2 * g + 1] = mh;
            for (int k = 0; k < s.group; k += 2) {
                const int q0 = (int)fminf(fmaxf(roundf((xs[k] - mf) * inv), 0.f), 15.f);
                const int q1 = (int)fminf(fmaxf(roundf((xs[k + 1] - mf) * inv), 0.f), 15.f);
                c[(g * s.group + k) / 2] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        break;
    case Q8_0:
        for (int b = lane; b < d / 32; b += 32) {
            const float *xs = row + 32 * b;
            float a = 0.f;
            for (int k = 0; k < 32; k++) a = fmaxf(a, fabsf(xs[k]));
            const float dd = a / 127.f;
            const float id = dd != 0.f ? 1.f / dd : 0.f;
            ((uint16_t *)m)[b] = f2h(dd);
            for (int k = 0; k < 32; k++) c[32 * b + k] = (uint8_t)(int8_t)roundf(xs[k] * id);
        }
        break;
    case Q4_0:
        for (int b = lane; b < d / 32; b += 32) {
            const float *xs = row + 32 * b;
            float a = 0.f, mx = 0.f;
            for (int k = 0; k < 32; k++)
                if (a < fabsf(xs[k])) {
                    a = fabsf(xs[k]);
                    mx = xs[k];
                }
            const float dd = mx / -8.f;
            const float id = dd != 0.f ? 1.f / dd : 0.f;
            ((uint16_t *)m)[b] = f2h(dd);
            for (int j = 0; j < 16; j++) {
                const int q0 = min(15, (int)(xs[j] * id + 8.5f));
                const int q1 = min(15, (int)(xs[j + 16] * id + 8.5f));
                c[16 * b + j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        break;
    }
}

// CHAN8 (KIVI keys): quantizes every token group that becomes complete with this append
// (groups old_q/G .. new_q/G of each head), reading each row from the f16 ring if it was held
// before, else from the new input rounded to f16 (as ChannelStream, which quantizes from its
// f16 residual). One block per (group, bh); thread c handles channel c (absmax over G tokens).
// Launch before kv_chan_resid, which overwrites ring rows.
extern "C" __global__ void kv_chan_quantize(Stream s, const float *__restrict__ x,
                                            const uint32_t *lens, int n_new, int d) {
    const int bh = blockIdx.y, c = threadIdx.x;
    const int old_len = (int)lens[bh], new_len = old_len + n_new;
    const int g0 = chan_quantized(old_len, s.residual, s.group) / s.group;
    const int g1 = chan_quantized(new_len, s.residual, s.group) / s.group;
    const int grp = g0 + (int)blockIdx.x;
    if (grp >= g1 || c >= d) return;
    const int R = s.residual + s.group;
    float a = 0.f;
    for (int k = 0; k < s.group; k++) {
        const int t = grp * s.group + k;
        const float v = t < old_len ? h2f(s.resid[((size_t)bh * R + t % R) * d + c])
                                    : h2f(f2h(x[((size_t)bh * n_new + t - old_len) * d + c]));
        a = fmaxf(a, fabsf(v));
    }
    const uint16_t sh = f16_round_up(a / 127.f);
    const float sc = h2f(sh);
    const float inv = sc > 0.f ? 1.f / sc : 0.f;
    s.chan_scales[((size_t)bh * (s.cap / s.group) + grp) * d + c] = sh;
    for (int k = 0; k < s.group; k++) {
        const int t = grp * s.group + k;
        const float v = t < old_len ? h2f(s.resid[((size_t)bh * R + t % R) * d + c])
                                    : h2f(f2h(x[((size_t)bh * n_new + t - old_len) * d + c]));
        s.codes[((size_t)bh * s.cap + t) * s.code_bytes + c] =
            (uint8_t)(int8_t)fminf(fmaxf(roundf(v * inv), -127.f), 127.f);
    }
}

// CHAN8: writes the new rows that stay in the residual into the f16 ring. Grid (n_new, bh).
extern "C" __global__ void kv_chan_resid(Stream s, const float *__restrict__ x,
                                         const uint32_t *lens, int n_new, int d) {
    const int i = blockIdx.x, bh = blockIdx.y;
    const int old_len = (int)lens[bh], t = old_len + i;
    if (t < chan_quantized(old_len + n_new, s.residual, s.group)) return;
    const int R = s.residual + s.group;
    for (int e = threadIdx.x; e < d; e += blockDim.x)
        s.resid[((size_t)bh * R + t % R) * d + e] = f2h(x[((size_t)bh * n_new + i) * d + e]);
}

// After the appends of a layer: lens[bh] += n_new (and, for eviction, the new slots' absolute
// positions and zero H2O scores). One thread per bh.
extern "C" __global__ void kv_advance(uint32_t *lens, const uint32_t *seen, uint32_t *pos,
                                      float *score, int cap, int kv_heads, int bhs, int n_new) {
    const int bh = blockIdx.x * blockDim.x + threadIdx.x;
    if (bh >= bhs) return;
    const int len = (int)lens[bh];
    const uint32_t p0 = seen[bh / kv_heads];
    for (int i = 0; i < n_new; i++) {
        if (pos) pos[(size_t)bh * cap + len + i] = p0 + i;
        if (score) score[(size_t)bh * cap + len + i] = 0.f;
    }
    lens[bh] = len + n_new;
}

// After every layer of a forward: seen[b] += n_new. One thread per sequence.
extern "C" __global__ void kv_advance_seen(uint32_t *seen, int batch, int n_new) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < batch) seen[b] += n_new;
}

// ---------------------------------------------------------------------------------------------
// Decode attention, split over the sequence (FlashDecoding: Dao et al. 2023, "Flash-Decoding
// for long-context inference"; online softmax: Milakov & Gimelshein 2018).
//
// q: [batch][q_heads][n_q][d] f32. Query row r of kv head bh is (g = r / n_q, i = r % n_q),
// query head kv_head * group + g (GQA), and sees slots 0 .. len - n_q + i (new tokens sit at
// the end, after every older one, as on the CPU). Grid (splits, bh, ceil(group·n_q / QT)),
// 4 warps; warp w takes slots t0 + w, t0 + w + 4, ...; lane l holds elements l·E .. l·E+E-1.
// Writes per split the unnormalized output, the running max and the sum of exp:
//   part_o [splits][bh][group·n_q][d], part_ml [splits][bh][group·n_q][2].
// With logits != null (H2O) also every scaled score, logits [bh][group·n_q][cap] (−inf where
// masked), for kv_h2o_scores.
#define QT 4
#define WARPS 4

template <int D>
__device__ void attn_partial(const float *__restrict__ q, Stream K, Stream V,
                             const uint32_t *lens, int kv_heads, int group, int n_q,
                             float scale, int chunk, float *part_o, float *part_ml,
                             float *logits) {
    constexpr int E = D / 32;
    const int split = blockIdx.x, bh = blockIdx.y, r0 = blockIdx.z * QT;
    const int splits = gridDim.x, bhs = gridDim.y;
    const int rows = group * n_q;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = bh / kv_heads, hk = bh % kv_heads;
    const int len = (int)lens[bh];
    // Only CHAN8 has token groups (other formats pass group 0: no division by zero).
    const int kq = K.fmt == CHAN8 ? chan_quantized(len, K.residual, K.group) : 0;
    const int vq = V.fmt == CHAN8 ? chan_quantized(len, V.residual, V.group) : 0;
    __shared__ float qs[QT][D];
    __shared__ float sm[WARPS][QT], sl[WARPS][QT];
    __shared__ float sacc[WARPS][QT][D];
    for (int k = threadIdx.x; k < QT * D; k += blockDim.x) {
        const int j = k / D, e = k % D, r = r0 + j;
        float v = 0.f;
        if (r < rows) {
            const int g = r / n_q, i = r % n_q;
            v = q[(((size_t)b * kv_heads * group + hk * group + g) * n_q + i) * D + e] * scale;
        }
        qs[j][e] = v;
    }
    __syncthreads();
    float m[QT], l[QT], acc[QT][E];
#pragma unroll
    for (int j = 0; j < QT; j++) {
        m[j] = NEG_INF;
        l[j] = 0.f;
#pragma unroll
        for (int k = 0; k < E; k++) acc[j][k] = 0.f;
    }
    const int t0 = split * chunk, t1 = min(len, t0 + chunk);
    for (int t = t0 + warp; t < t1; t += WARPS) {
        float kx[E], vx[E];
#pragma unroll
        for (int k = 0; k < E; k++) kx[k] = load_elem(K, D, bh, t, lane * E + k, kq);
        float sc[QT];
        bool any = false;
#pragma unroll
        for (int j = 0; j < QT; j++) {
            float p = 0.f;
#pragma unroll
            for (int k = 0; k < E; k++) p += qs[j][lane * E + k] * kx[k];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
            const int r = r0 + j;
            const bool vis = r < rows && t <= len - n_q + r % n_q;
            sc[j] = vis ? p : NEG_INF;
            any |= vis;
            if (logits && r < rows && lane == 0) logits[((size_t)bh * rows + r) * K.cap + t] = sc[j];
        }
        if (!any) continue;
#pragma unroll
        for (int k = 0; k < E; k++) vx[k] = load_elem(V, D, bh, t, lane * E + k, vq);
#pragma unroll
        for (int j = 0; j < QT; j++) {
            if (sc[j] == NEG_INF) continue;
            const float mn = fmaxf(m[j], sc[j]);
            const float a = __expf(m[j] - mn);  // m = −inf → 0
            const float p = __expf(sc[j] - mn);
            l[j] = l[j] * a + p;
#pragma unroll
            for (int k = 0; k < E; k++) acc[j][k] = acc[j][k] * a + p * vx[k];
            m[j] = mn;
        }
    }
#pragma unroll
    for (int j = 0; j < QT; j++) {
        if (lane == 0) {
            sm[warp][j] = m[j];
            sl[warp][j] = l[j];
        }
#pragma unroll
        for (int k = 0; k < E; k++) sacc[warp][j][lane * E + k] = acc[j][k];
    }
    __syncthreads();
    for (int k = threadIdx.x; k < QT * D; k += blockDim.x) {
        const int j = k / D, e = k % D, r = r0 + j;
        if (r >= rows) continue;
        float M = NEG_INF;
        for (int w = 0; w < WARPS; w++) M = fmaxf(M, sm[w][j]);
        float L = 0.f, O = 0.f;
        if (M != NEG_INF)
            for (int w = 0; w < WARPS; w++) {
                if (sm[w][j] == NEG_INF) continue;
                const float a = __expf(sm[w][j] - M);
                L += sl[w][j] * a;
                O += sacc[w][j][e] * a;
            }
        const size_t pr = ((size_t)split * bhs + bh) * rows + r;
        part_o[pr * D + e] = O;
        if (e == 0) {
            part_ml[2 * pr] = M;
            part_ml[2 * pr + 1] = L;
        }
    }
    (void)splits;
}

#define ATTN_PARTIAL(D)                                                                       \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
        kv_attn_partial_d##D(const float *q, Stream K, Stream V, const uint32_t *lens,       \
                             int kv_heads, int group, int n_q, float scale, int chunk,        \
                             float *part_o, float *part_ml, float *logits) {                  \
        attn_partial<D>(q, K, V, lens, kv_heads, group, n_q, scale, chunk, part_o, part_ml,   \
                        logits);                                                              \
    }
ATTN_PARTIAL(64)
ATTN_PARTIAL(128)
ATTN_PARTIAL(256)

// Merges the splits: out [batch][q_heads][n_q][d] = Σ_s o_s·e^{m_s−M} / Σ_s l_s·e^{m_s−M};
// also ml [bh][group·n_q][2] = (M, L) for kv_h2o_scores. Grid (group·n_q, bh), d threads.
extern "C" __global__ void kv_attn_combine(const float *part_o, const float *part_ml, int splits,
                                           int kv_heads, int group, int n_q, int d, float *out,
                                           float *ml) {
    const int r = blockIdx.x, bh = blockIdx.y, bhs = gridDim.y, e = threadIdx.x;
    const int rows = group * n_q;
    if (e >= d) return;
    float M = NEG_INF;
    for (int s = 0; s < splits; s++)
        M = fmaxf(M, part_ml[2 * (((size_t)s * bhs + bh) * rows + r)]);
    float L = 0.f, O = 0.f;
    for (int s = 0; s < splits; s++) {
        const size_t pr = ((size_t)s * bhs + bh) * rows + r;
        const float ms = part_ml[2 * pr];
        if (ms == NEG_INF) continue;
        const float a = __expf(ms - M);
        L += part_ml[2 * pr + 1] * a;
        O += part_o[pr * d + e] * a;
    }
    const int b = bh / kv_heads, hk = bh % kv_heads, g = r / n_q, i = r % n_q;
    out[(((size_t)b * kv_heads * group + hk * group + g) * n_q + i) * d + e] = O / L;
    if (e == 0 && ml) {
        ml[2 * ((size_t)bh * rows + r)] = M;
        ml[2 * ((size_t)bh * rows + r) + 1] = L;
    }
}

// H2O (Zhang et al. 2023, arXiv 2306.14048 §3–4): each slot's accumulated attention grows by
// the probability every query row of its kv head gave it. Grid (ceil(cap/256), bh).
extern "C" __global__ void kv_h2o_scores(const float *logits, const float *ml,
                                         const uint32_t *lens, int rows, int cap, float *score) {
    const int bh = blockIdx.y, t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int)lens[bh]) return;
    float acc = 0.f;
    for (int r = 0; r < rows; r++) {
        const float s = logits[((size_t)bh * rows + r) * cap + t];
        if (s == NEG_INF) continue;
        const size_t k = (size_t)bh * rows + r;
        acc += __expf(s - ml[2 * k]) / ml[2 * k + 1];
    }
    score[(size_t)bh * cap + t] += acc;
}

// ---------------------------------------------------------------------------------------------
// Eviction on the GPU, one block (256 threads) per bh, no host round trip. Repeatedly finds a
// victim slot and moves the last slot's row (K and V codes and meta, position, score) into it
// (swap-remove, as the CPU cache), until none is left:
//   mode 0, window (StreamingLLM, Xiao et al. 2023 §3.2): a slot whose position p has
//     p ≥ sinks and p + size < seen; the oldest first.
//   mode 1, H2O: while held > budget(seen) = max(recent + 1, budget or ceil(ratio·seen)),
//     the slot outside the protected recent window (p + max(recent, 1) < seen) with the lowest
//     accumulated score, ties to the oldest.
__device__ void copy_row(uint8_t *base, int bytes, size_t from, size_t to) {
    for (int k = threadIdx.x; k < bytes; k += blockDim.x) base[to * bytes + k] = base[from * bytes + k];
}

extern "C" __global__ void kv_evict(Stream K, Stream V, uint32_t *pos, float *score,
                                    uint32_t *lens, const uint32_t *seen, int kv_heads, int mode,
                                    int size, int sinks, int budget_tokens, float ratio,
                                    int recent, int n_new) {
    const int bh = blockIdx.x;
    const int cap = K.cap;
    // seen[] advances after the last layer; eviction counts this forward's tokens already.
    const long long sn = (long long)seen[bh / kv_heads] + n_new;
    long long limit = budget_tokens > 0 ? budget_tokens : (long long)ceil((double)ratio * (double)sn);
    if (limit < recent + 1) limit = recent + 1;
    const long long protect = recent > 1 ? recent : 1;
    __shared__ float bs[256];
    __shared__ uint32_t bp[256];
    __shared__ int bi[256];
    __shared__ int len_s;
    if (threadIdx.x == 0) len_s = (int)lens[bh];
    __syncthreads();
    const size_t base = (size_t)bh * cap;
    while (true) {
        const int len = len_s;
        if (mode == 1 && len <= limit) break;
        float best_s = INFINITY;
        uint32_t best_p = 0xffffffffu;
        int best_i = -1;
        for (int t = threadIdx.x; t < len; t += blockDim.x) {
            const uint32_t p = pos[base + t];
            bool cand;
            float sc = 0.f;
            if (mode == 0) {
                cand = (long long)p >= sinks && (long long)p + size < sn;
            } else {
                cand = (long long)p + protect < sn;
                sc = score[base + t];
            }
            if (cand && (sc < best_s || (sc == best_s && p < best_p))) {
                best_s = sc;
                best_p = p;
                best_i = t;
            }
        }
        bs[threadIdx.x] = best_s;
        bp[threadIdx.x] = best_p;
        bi[threadIdx.x] = best_i;
        __syncthreads();
        for (int o = blockDim.x / 2; o > 0; o >>= 1) {
            if (threadIdx.x < o) {
                const int u = threadIdx.x + o;
                if (bi[u] >= 0 && (bi[threadIdx.x] < 0 || bs[u] < bs[threadIdx.x] ||
                                   (bs[u] == bs[threadIdx.x] && bp[u] < bp[threadIdx.x]))) {
                    bs[threadIdx.x] = bs[u];
                    bp[threadIdx.x] = bp[u];
                    bi[threadIdx.x] = bi[u];
                }
            }
            __syncthreads();
        }
        const int victim = bi[0];
        if (victim < 0) break;
        const size_t from = base + len - 1, to = base + victim;
        if (victim != len - 1) {
            copy_row(K.codes, K.code_bytes, from, to);
            copy_row(V.codes, V.code_bytes, from, to);
            if (K.meta_bytes) copy_row(K.meta, K.meta_bytes, from, to);
            if (V.meta_bytes) copy_row(V.meta, V.meta_bytes, from, to);
            if (threadIdx.x == 0) {
                pos[to] = pos[from];
                if (score) score[to] = score[from];
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) len_s = len - 1;
        __syncthreads();
    }
    if (threadIdx.x == 0) lens[bh] = len_s;
}
