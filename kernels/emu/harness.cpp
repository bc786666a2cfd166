// Runs kernels/kv_cache.cu on the CPU (through cuda_emu.h) with the launch sequence of
// CudaKvCache in src/kv/cuda.rs, for one scenario, so tests/kernels_emulated.rs can compare the
// kernels with the CPU KvCache without a GPU.
//
// THIS MIRRORS src/kv/cuda.rs AND MUST CHANGE WITH IT: buffer layouts and sizes (Plane, Layer),
// capacity rounding (round_cap, grow), the host mirror of seen/held (finish_forward), and for
// every launch its grid, block size and argument values (append, attend). Buffers are host
// vectors (a device pointer is a host pointer), each with guard bytes on both sides that are
// checked after every launch; buffers CudaKvCache allocates with alloc_zeros are zeroed, and
// the attention buffers are NaN-filled (CudaKvCache's poison_outputs mode), so an element the
// kernels never write shows up as NaN.
//
// Usage: harness SCENARIO INPUTS OUT_DIR [fibers|threads] [SEED]
//        harness --fp8 VALUES OUT      (conversion check: see fp8_check below)
// The scheduler (default fibers) and SEED (default 1; block order and thread interleaving, 0 for
// index order) are cuda_emu.h's.
//
// SCENARIO, whitespace-separated `key values…` lines:
//   layers L  kv_heads H  q_heads Q  head_dim D  batch B  capacity C  sms S
//   k FMT GROUP RESIDUAL        v FMT GROUP RESIDUAL      (GpuFormat::id codes, see Fmt)
//   evict none | evict window SIZE SINKS | evict h2o BUDGET_TOKENS RATIO RECENT
//   forwards N1 N2 …            (tokens per forward: a prefill, then decode steps)
// INPUTS: f32 little-endian; per forward, per layer: K and V [B, H, n, D], then Q [B, Q, n, D].
// OUT_DIR/attn.bin: per forward, per layer, the attention output [B, Q, n, D] f32.
// OUT_DIR/state.bin: per layer, sequence b, kv head h: u32 held (host mirror), u32 lens[bh]
//   (device), u32 positions[held] (CudaKvCache::download_rows: slot order), then the K rows and
//   the V rows in the CPU row layout (per block: meta, then codes); no K rows for KIVI keys.

#include "cuda_emu.h"

#include "../kv_cache.cu"

#include <cinttypes>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void die(const std::string &msg) {
    fprintf(stderr, "harness: %s\n", msg.c_str());
    exit(2);
}

size_t div_ceil(size_t a, size_t b) { return (a + b - 1) / b; }

// --- Device buffers ------------------------------------------------------------------------

constexpr size_t kGuard = 64;
constexpr uint8_t kCanary = 0xA5;

struct Buf;
std::set<Buf *> &live_bufs() {
    static std::set<Buf *> s;
    return s;
}

// `bytes` of "device" memory with kGuard canary bytes before and after.
struct Buf {
    std::string name;
    std::vector<uint8_t> mem;
    size_t bytes;
    Buf(std::string n, size_t b) : name(std::move(n)), mem(b + 2 * kGuard, kCanary), bytes(b) {
        live_bufs().insert(this);
    }
    ~Buf() { live_bufs().erase(this); }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    uint8_t *ptr() { return mem.data() + kGuard; }
    template <class T> T *as() { return (T *)ptr(); }
    void check(const char *kernel) const {
        for (size_t i = 0; i < kGuard; i++)
            if (mem[i] != kCanary || mem[kGuard + bytes + i] != kCanary) {
                fprintf(stderr, "harness: %s wrote outside buffer %s (%zu bytes)\n", kernel,
                        name.c_str(), bytes);
                exit(3);
            }
    }
};
using BufP = std::unique_ptr<Buf>;

// CudaKvCache::zeros: alloc_zeros(n.max(1)) elements of T.
template <class T> BufP zeros(const std::string &name, size_t n) {
    auto b = std::make_unique<Buf>(name, std::max<size_t>(n, 1) * sizeof(T));
    memset(b->ptr(), 0, b->bytes);
    return b;
}

// attend's alloc in poison mode: n f32 NaNs.
BufP nans(const std::string &name, size_t n) {
    auto b = std::make_unique<Buf>(name, std::max<size_t>(n, 1) * 4);
    const float nan = NAN;
    for (size_t i = 0; i < b->bytes / 4; i++) memcpy(b->ptr() + 4 * i, &nan, 4);
    return b;
}

template <class... P, class... A>
void launch(const char *name, void (*k)(P...), dim3 grid, unsigned block, A &&...args) {
    kvemu::launch(name, k, grid, dim3(block), std::forward<A>(args)...);
    for (Buf *b : live_bufs()) b->check(name);
}

// --- GpuFormat -----------------------------------------------------------------------------

struct Fmt {
    int id = 0, group = 0, residual = 0;  // kernel fmt code; INT4 element / CHAN8 token group
    // (blocks per row, meta bytes per block, code bytes per block): GpuFormat::blocks.
    void blocks(size_t d, size_t &n, size_t &m, size_t &c) const {
        switch (id) {
        case F16: n = 1, m = 0, c = 2 * d; break;
        case INT8_TOKEN:
        case FP8_E4M3:
        case FP8_E5M2: n = 1, m = 2, c = d; break;
        case INT4: n = d / group, m = 4, c = group / 2; break;
        case Q8_0: n = d / 32, m = 2, c = 32; break;
        case Q4_0: n = d / 32, m = 2, c = 16; break;
        case CHAN8: n = 1, m = 0, c = d; break;
        default: die("unknown format " + std::to_string(id));
        }
    }
    size_t code_bytes(size_t d) const {
        size_t n, m, c;
        blocks(d, n, m, c);
        return n * c;
    }
    size_t meta_bytes(size_t d) const {
        size_t n, m, c;
        blocks(d, n, m, c);
        return n * m;
    }
    size_t token_group() const { return id == CHAN8 ? (size_t)group : 1; }
};

struct Scenario {
    size_t layers = 0, kv_heads = 0, q_heads = 0, head_dim = 0, batch = 0, capacity = 0,
           sms = 132;
    Fmt k, v;
    enum { None, Window, H2o } evict = None;
    size_t size = 0, sinks = 0, budget = 0, recent = 0;  // budget: tokens, 0 = ratio
    float ratio = 0;
    std::vector<size_t> forwards;

    bool evicts() const { return evict != None; }
    // KvScheme::held_tokens.
    size_t held_tokens(size_t seen) const {
        switch (evict) {
        case Window: return std::min(seen, size + sinks);
        case H2o: {
            size_t b = budget ? budget : (size_t)ceil((double)ratio * (double)seen);
            return std::min(seen, std::max(b, recent + 1));
        }
        default: return seen;
        }
    }
};

Scenario parse(const std::string &path) {
    std::ifstream f(path);
    if (!f) die("cannot read " + path);
    Scenario s;
    std::string line;
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string key;
        if (!(in >> key) || key[0] == '#') continue;
        auto fmt = [&](Fmt &x) { in >> x.id >> x.group >> x.residual; };
        if (key == "layers") in >> s.layers;
        else if (key == "kv_heads") in >> s.kv_heads;
        else if (key == "q_heads") in >> s.q_heads;
        else if (key == "head_dim") in >> s.head_dim;
        else if (key == "batch") in >> s.batch;
        else if (key == "capacity") in >> s.capacity;
        else if (key == "sms") in >> s.sms;
        else if (key == "k") fmt(s.k);
        else if (key == "v") fmt(s.v);
        else if (key == "forwards") {
            size_t n;
            while (in >> n) s.forwards.push_back(n);
        } else if (key == "evict") {
            std::string mode;
            in >> mode;
            if (mode == "window") s.evict = Scenario::Window, in >> s.size >> s.sinks;
            else if (mode == "h2o") s.evict = Scenario::H2o, in >> s.budget >> s.ratio >> s.recent;
            else if (mode != "none") die("unknown eviction " + mode);
        } else die("unknown key " + key);
        if (in.fail() && !in.eof()) die("bad line: " + line);
    }
    if (!s.layers || !s.kv_heads || !s.q_heads || !s.head_dim || !s.batch || s.forwards.empty())
        die("incomplete scenario " + path);
    return s;
}

// --- CudaKvCache ---------------------------------------------------------------------------

struct Plane {
    Fmt fmt;
    BufP codes, meta, resid, chan_scales;  // resid, chan_scales: CHAN8 only
};

struct Layer {
    Plane k, v;
    BufP pos, score, lens;  // pos: eviction schemes; score: H2O
};

struct Cache {
    const Scenario &sc;
    size_t cap = 0;
    std::vector<Layer> layers;
    BufP seen_dev;
    std::vector<size_t> seen, held;
    size_t pending = 0;

    explicit Cache(const Scenario &s) : sc(s) {
        seen_dev = zeros<uint32_t>("seen", s.batch);
        seen.assign(s.batch, 0);
        held.assign(s.batch, 0);
        const size_t c = round_cap(std::max<size_t>(s.capacity, 64));
        for (size_t l = 0; l < s.layers; l++) {
            Layer ly;
            ly.k = plane(s.k, c, "K");
            ly.v = plane(s.v, c, "V");
            if (s.evicts()) ly.pos = zeros<uint32_t>("pos", bhs() * c);
            if (s.evict == Scenario::H2o) ly.score = zeros<float>("score", bhs() * c);
            ly.lens = zeros<uint32_t>("lens", bhs());
            layers.push_back(std::move(ly));
        }
        cap = c;
    }

    size_t bhs() const { return sc.batch * sc.kv_heads; }
    size_t round_cap(size_t n) const {
        const size_t g = sc.k.token_group();
        return div_ceil(n, g) * g;
    }

    Plane plane(Fmt f, size_t c, const std::string &kv) const {
        const size_t d = sc.head_dim;
        Plane p;
        p.fmt = f;
        if (f.id == CHAN8) {
            p.resid = zeros<uint16_t>(kv + ".resid", bhs() * (f.residual + f.group) * d);
            p.chan_scales = zeros<uint16_t>(kv + ".chan_scales", bhs() * (c / f.group) * d);
        }
        p.codes = zeros<uint8_t>(kv + ".codes", bhs() * c * f.code_bytes(d));
        p.meta = zeros<uint8_t>(kv + ".meta", bhs() * c * f.meta_bytes(d));
        return p;
    }

    Stream args(Plane &p) const {
        Stream s;
        s.codes = p.codes->ptr();
        s.meta = p.meta->ptr();
        s.resid = p.resid ? p.resid->as<uint16_t>() : nullptr;
        s.chan_scales = p.chan_scales ? p.chan_scales->as<uint16_t>() : nullptr;
        s.fmt = p.fmt.id;
        s.group = (p.fmt.id == INT4 || p.fmt.id == CHAN8) ? p.fmt.group : 0;
        s.residual = p.fmt.id == CHAN8 ? p.fmt.residual : 0;
        s.code_bytes = (int)p.fmt.code_bytes(sc.head_dim);
        s.meta_bytes = (int)p.fmt.meta_bytes(sc.head_dim);
        s.cap = (int)cap;
        return s;
    }

    // copy_rows: rows 0..n of head bh, per_row bytes each, between two capacities.
    static void copy_rows(Buf &from, Buf &to, size_t bh, size_t from_cap, size_t to_cap, size_t n,
                          size_t per_row) {
        if (n == 0 || per_row == 0) return;
        if ((bh * from_cap + n) * per_row > from.bytes || (bh * to_cap + n) * per_row > to.bytes)
            die("copy_rows out of bounds in " + from.name);
        memcpy(to.ptr() + bh * to_cap * per_row, from.ptr() + bh * from_cap * per_row, n * per_row);
    }

    void grow(size_t need) {
        if (need <= cap) return;
        const size_t new_cap = round_cap(std::max(need, 2 * cap));
        const size_t old_cap = cap, d = sc.head_dim;
        std::vector<size_t> h(bhs());
        for (size_t bh = 0; bh < bhs(); bh++) h[bh] = held[bh / sc.kv_heads];
        for (auto &l : layers) {
            for (auto [p, kv] : {std::pair{&l.k, "K"}, std::pair{&l.v, "V"}}) {
                Plane fresh = plane(p->fmt, new_cap, kv);
                const size_t cb = p->fmt.code_bytes(d), mb = p->fmt.meta_bytes(d);
                for (size_t bh = 0; bh < bhs(); bh++) {
                    copy_rows(*p->codes, *fresh.codes, bh, old_cap, new_cap, h[bh], cb);
                    copy_rows(*p->meta, *fresh.meta, bh, old_cap, new_cap, h[bh], mb);
                    if (p->fmt.id == CHAN8) {
                        const size_t g = p->fmt.group;
                        copy_rows(*p->chan_scales, *fresh.chan_scales, bh, old_cap / g,
                                  new_cap / g, h[bh] / g, 2 * d);
                    }
                }
                fresh.resid = std::move(p->resid);  // the KIVI ring has a fixed size
                *p = std::move(fresh);
            }
            if (l.pos) {
                BufP fresh = zeros<uint32_t>("pos", bhs() * new_cap);
                for (size_t bh = 0; bh < bhs(); bh++)
                    copy_rows(*l.pos, *fresh, bh, old_cap, new_cap, h[bh], 4);
                l.pos = std::move(fresh);
            }
            if (l.score) {
                BufP fresh = zeros<float>("score", bhs() * new_cap);
                for (size_t bh = 0; bh < bhs(); bh++)
                    copy_rows(*l.score, *fresh, bh, old_cap, new_cap, h[bh], 4);
                l.score = std::move(fresh);
            }
        }
        cap = new_cap;
    }

    void finish_forward(bool evicted) {
        if (pending == 0) return;
        launch("kv_advance_seen", kv_advance_seen, dim3((unsigned)div_ceil(sc.batch, 128)), 128,
               seen_dev->as<uint32_t>(), (int)sc.batch, (int)pending);
        for (size_t b = 0; b < sc.batch; b++) {
            seen[b] += pending;
            held[b] = evicted ? sc.held_tokens(seen[b]) : held[b] + pending;
        }
        pending = 0;
    }

    // k, v: [batch, kv_heads, n_new, head_dim] f32.
    void append(size_t layer, std::vector<float> &k, std::vector<float> &v, size_t n_new) {
        if (layer == 0) {
            finish_forward(false);
            grow(*std::max_element(held.begin(), held.end()) + n_new);
            pending = n_new;
        }
        const size_t d = sc.head_dim;
        // The K/V tensors live in device buffers of their own.
        Buf kx("K input", k.size() * 4), vx("V input", v.size() * 4);
        memcpy(kx.ptr(), k.data(), kx.bytes);
        memcpy(vx.ptr(), v.data(), vx.bytes);
        Layer &l = layers[layer];
        for (auto [p, x] : {std::pair{&l.k, &kx}, std::pair{&l.v, &vx}}) {
            const Stream sa = args(*p);
            const int n = (int)n_new, di = (int)d;
            if (p->fmt.id == CHAN8) {
                const unsigned groups = (unsigned)(n_new / p->fmt.group + 2);
                launch("kv_chan_quantize", kv_chan_quantize, dim3(groups, (unsigned)bhs()),
                       (unsigned)d, sa, x->as<float>(), l.lens->as<uint32_t>(), n, di);
                launch("kv_chan_resid", kv_chan_resid, dim3((unsigned)n_new, (unsigned)bhs()), 128,
                       sa, x->as<float>(), l.lens->as<uint32_t>(), n, di);
            } else {
                launch("kv_append", kv_append, dim3((unsigned)n_new, (unsigned)bhs()), 32, sa,
                       x->as<float>(), l.lens->as<uint32_t>(), n, di);
            }
        }
        launch("kv_advance", kv_advance, dim3((unsigned)div_ceil(bhs(), 128)), 128,
               l.lens->as<uint32_t>(), seen_dev->as<uint32_t>(),
               l.pos ? l.pos->as<uint32_t>() : nullptr, l.score ? l.score->as<float>() : nullptr,
               (int)cap, (int)sc.kv_heads, (int)bhs(), (int)n_new);
    }

    // q: [batch, q_heads, n_q, head_dim] f32; returns the same shape.
    std::vector<float> attend(size_t layer, const std::vector<float> &q, size_t n_q) {
        const size_t d = sc.head_dim, group = sc.q_heads / sc.kv_heads, rows = group * n_q;
        const size_t len = *std::max_element(held.begin(), held.end()) + pending;
        const size_t qtiles = div_ceil(rows, QT);
        const size_t splits =
            std::clamp(div_ceil(2 * sc.sms, bhs() * qtiles), (size_t)1,
                       std::max<size_t>(div_ceil(len, 256), 1));
        const size_t chunk = div_ceil(len, splits);
        const bool h2o = sc.evict == Scenario::H2o;
        BufP part_o = nans("part_o", splits * bhs() * rows * d);
        BufP part_ml = nans("part_ml", splits * bhs() * rows * 2);
        BufP out = nans("out", sc.batch * sc.q_heads * n_q * d);
        BufP logits = h2o ? nans("logits", bhs() * rows * cap) : nullptr;
        BufP ml = h2o ? nans("ml", bhs() * rows * 2) : nullptr;
        Buf qx("Q input", q.size() * 4);
        memcpy(qx.ptr(), q.data(), qx.bytes);
        const float scale = 1.0f / sqrtf((float)d);
        Layer &l = layers[layer];
        const Stream ka = args(l.k), va = args(l.v);
        const int kvh = (int)sc.kv_heads, grp = (int)group, nq = (int)n_q, ch = (int)chunk;
        void (*partial)(const float *, Stream, Stream, const uint32_t *, int, int, int, float, int,
                        float *, float *, float *) = d == 64    ? kv_attn_partial_d64
                                                     : d == 128 ? kv_attn_partial_d128
                                                     : d == 256 ? kv_attn_partial_d256
                                                                : nullptr;
        if (!partial) die("head_dim must be 64, 128 or 256");
        const dim3 grid((unsigned)splits, (unsigned)bhs(), (unsigned)qtiles);
        launch("kv_attn_partial", partial, grid, WARPS * 32, qx.as<float>(), ka, va,
               l.lens->as<uint32_t>(), kvh, grp, nq, scale, ch, part_o->as<float>(),
               part_ml->as<float>(), logits ? logits->as<float>() : nullptr);
        launch("kv_attn_combine", kv_attn_combine, dim3((unsigned)rows, (unsigned)bhs()),
               (unsigned)d, part_o->as<float>(), part_ml->as<float>(), (int)splits, kvh, grp, nq,
               (int)d, out->as<float>(), ml ? ml->as<float>() : nullptr);
        if (logits && ml && l.score)
            launch("kv_h2o_scores", kv_h2o_scores,
                   dim3((unsigned)div_ceil(cap, 256), (unsigned)bhs()), 256, logits->as<float>(),
                   ml->as<float>(), l.lens->as<uint32_t>(), (int)rows, (int)cap,
                   l.score->as<float>());
        if (sc.evicts()) {
            int mode = 0, size = 0, sinks = 0, budget = 0, recent = 0;
            float ratio = 0;
            if (sc.evict == Scenario::Window) size = (int)sc.size, sinks = (int)sc.sinks;
            else mode = 1, budget = (int)sc.budget, ratio = sc.budget ? 0.f : sc.ratio,
                 recent = (int)sc.recent;
            launch("kv_evict", kv_evict, dim3((unsigned)bhs()), 256, ka, va, l.pos->as<uint32_t>(),
                   l.score ? l.score->as<float>() : nullptr, l.lens->as<uint32_t>(),
                   seen_dev->as<uint32_t>(), kvh, mode, size, sinks, budget, ratio, recent, nq);
        }
        if (layer + 1 == sc.layers) finish_forward(sc.evicts());
        std::vector<float> o(sc.batch * sc.q_heads * n_q * d);
        memcpy(o.data(), out->ptr(), o.size() * 4);
        return o;
    }

    // download_rows for K (value = false) or V, appended to `w` (without positions).
    void rows(size_t layer, size_t b, size_t h, bool value, std::vector<uint8_t> &w) {
        Layer &l = layers[layer];
        Plane &p = value ? l.v : l.k;
        if (p.fmt.id == CHAN8) return;
        const size_t d = sc.head_dim, bh = b * sc.kv_heads + h;
        const size_t n = std::min(held[b], cap);
        const size_t cb = p.fmt.code_bytes(d), mb = p.fmt.meta_bytes(d);
        size_t nb, bm, bc;
        p.fmt.blocks(d, nb, bm, bc);
        for (size_t t = 0; t < n; t++)
            for (size_t k = 0; k < nb; k++) {
                const uint8_t *m = p.meta->ptr() + (bh * cap + t) * mb + k * bm;
                const uint8_t *c = p.codes->ptr() + (bh * cap + t) * cb + k * bc;
                w.insert(w.end(), m, m + bm);
                w.insert(w.end(), c, c + bc);
            }
    }
};

void put_u32(std::vector<uint8_t> &w, uint32_t x) {
    const uint8_t *p = (const uint8_t *)&x;
    w.insert(w.end(), p, p + 4);
}

void write_file(const std::string &path, const void *data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write((const char *)data, (std::streamsize)bytes);
    if (!f) die("cannot write " + path);
}

int run_scenario(const Scenario &s, const std::string &inputs, const std::string &out_dir) {
    std::ifstream in(inputs, std::ios::binary);
    if (!in) die("cannot read " + inputs);
    auto read = [&](size_t n) {
        std::vector<float> x(n);
        in.read((char *)x.data(), (std::streamsize)(n * 4));
        if (!in) die("inputs end early");
        return x;
    };
    Cache c(s);
    std::vector<float> attn;
    const size_t d = s.head_dim;
    for (size_t n : s.forwards)
        for (size_t layer = 0; layer < s.layers; layer++) {
            auto k = read(s.batch * s.kv_heads * n * d);
            auto v = read(s.batch * s.kv_heads * n * d);
            auto q = read(s.batch * s.q_heads * n * d);
            c.append(layer, k, v, n);
            auto o = c.attend(layer, q, n);
            attn.insert(attn.end(), o.begin(), o.end());
        }
    write_file(out_dir + "/attn.bin", attn.data(), attn.size() * 4);
    std::vector<uint8_t> st;
    for (size_t layer = 0; layer < s.layers; layer++)
        for (size_t b = 0; b < s.batch; b++)
            for (size_t h = 0; h < s.kv_heads; h++) {
                Layer &l = c.layers[layer];
                const size_t bh = b * s.kv_heads + h, n = std::min(c.held[b], c.cap);
                put_u32(st, (uint32_t)c.held[b]);
                put_u32(st, l.lens->as<uint32_t>()[bh]);
                for (size_t t = 0; t < n; t++)
                    put_u32(st, l.pos ? l.pos->as<uint32_t>()[bh * c.cap + t] : (uint32_t)t);
                c.rows(layer, b, h, false, st);
                c.rows(layer, b, h, true, st);
            }
    write_file(out_dir + "/state.bin", st.data(), st.size());
    return 0;
}

// Conversion check of the shim itself: VALUES holds f32s; OUT gets, per value, its E4M3 and
// E5M2 codes, then for every code 0..255 the f16 bits of its E4M3 and E5M2 decodings (u16).
int fp8_check(const std::string &values, const std::string &out) {
    std::ifstream in(values, std::ios::binary);
    std::vector<uint8_t> w;
    float x;
    while (in.read((char *)&x, 4)) {
        w.push_back(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
        w.push_back(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2));
    }
    for (unsigned c = 0; c < 256; c++)
        for (auto k : {__NV_E4M3, __NV_E5M2}) {
            const uint16_t h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, k).x;
            w.push_back((uint8_t)h);
            w.push_back((uint8_t)(h >> 8));
        }
    write_file(out, w.data(), w.size());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc == 4 && std::string(argv[1]) == "--fp8") return fp8_check(argv[2], argv[3]);
    if (argc < 4) {
        fprintf(stderr, "usage: harness SCENARIO INPUTS OUT_DIR [fibers|threads] [SEED]\n"
                        "       harness --fp8 VALUES OUT\n");
        return 2;
    }
    if (argc > 4) {
        const std::string m = argv[4];
        if (m == "threads") kvemu::sched = kvemu::Sched::Threads;
        else if (m != "fibers") die("scheduler must be fibers or threads");
    }
    if (argc > 5) kvemu::seed = strtoull(argv[5], nullptr, 10);
    return run_scenario(parse(argv[1]), argv[2], argv[3]);
}
