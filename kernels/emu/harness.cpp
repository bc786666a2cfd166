// Runs kernels/kv_cache.cu on the CPU (through cuda_emu.h) by executing a launch plan that
// src/kv/cuda/plan.rs computed (kv::cuda::plan::script): the very allocations, copies and
// launches (grids, block sizes, argument values) the CUDA cache runs, so nothing of its host
// logic is re-implemented here. tests/kernels_emulated.rs writes the plan and the inputs, and
// compares what comes out with the CPU KvCache.
//
// Buffers are host vectors (a device pointer is a host pointer), each with guard bytes on both
// sides that are checked after every launch; every argument is type-checked against the
// kernel's parameter (a pointer, int, float or Stream), so a plan whose argument list does not
// match a kernel's signature fails here before it fails on a GPU.
//
// Usage: harness PLAN INPUTS OUT_DIR [fibers|threads] [SEED]
//        harness --fp8 VALUES OUT      (conversion check: see fp8_check below)
// The scheduler (default fibers) and SEED (default 1; block order and thread interleaving, 0 for
// index order) are cuda_emu.h's.
//
// PLAN: plan::script's lines (alloc, copy, replace, zero, input, launch, output, free), plus
//   dump BUF                   writes the buffer's bytes to OUT_DIR/BUF.bin
// INPUTS: f32 little-endian, read in order by the plan's `input` lines.
// OUT_DIR/attn.bin: every `output` buffer, in order (the attention outputs).

#include "cuda_emu.h"

#include "../kv_cache.cu"

#include <bit>
#include <cinttypes>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

[[noreturn]] void die(const std::string &msg) {
    fprintf(stderr, "harness: %s\n", msg.c_str());
    exit(2);
}

// --- Device buffers ------------------------------------------------------------------------

constexpr size_t kGuard = 64;
constexpr uint8_t kCanary = 0xA5;

struct Buf;
// Never destroyed: buffers in the global map below are freed at exit, after function statics.
std::set<Buf *> &live_bufs() {
    static auto *s = new std::set<Buf *>;
    return *s;
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
    void check(const char *kernel) const {
        for (size_t i = 0; i < kGuard; i++)
            if (mem[i] != kCanary || mem[kGuard + bytes + i] != kCanary) {
                fprintf(stderr, "harness: %s wrote outside buffer %s (%zu bytes)\n", kernel,
                        name.c_str(), bytes);
                exit(3);
            }
    }
    void fill_nan() {
        const float nan = NAN;
        for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy(ptr() + i, &nan, 4);
    }
};
using BufP = std::unique_ptr<Buf>;

std::map<std::string, BufP> bufs;

Buf &get(const std::string &name) {
    auto it = bufs.find(name);
    if (it == bufs.end()) die("buffer " + name + " used before it is allocated");
    return *it->second;
}

// --- Kernel arguments ------------------------------------------------------------------------

std::vector<std::string> split(const std::string &s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    std::istringstream in(s);
    while (std::getline(in, cur, sep)) out.push_back(cur);
    return out;
}

void *pointer(const std::string &name) { return name == "-" ? nullptr : get(name).ptr(); }

// One plan argument (`p:BUF`, `i:INT`, `f:BITS`, `s:…`) as the kernel's parameter type T.
template <class T> T arg(const std::string &tok, const char *kernel, size_t i) {
    auto want = [&](char tag) {
        if (tok.size() < 2 || tok[0] != tag || tok[1] != ':')
            die(std::string(kernel) + " argument " + std::to_string(i) + " is `" + tok +
                "`, the kernel takes a " + tag + ": argument there");
        return tok.substr(2);
    };
    if constexpr (std::is_same_v<T, int>) {
        return std::stoi(want('i'));
    } else if constexpr (std::is_same_v<T, float>) {
        return std::bit_cast<float>((uint32_t)std::stoul(want('f')));
    } else if constexpr (std::is_same_v<T, Stream>) {
        const auto f = split(want('s'), ',');
        if (f.size() != 10) die(std::string(kernel) + ": a Stream has 10 fields: " + tok);
        Stream s;
        s.codes = (uint8_t *)pointer(f[0]);
        s.meta = (uint8_t *)pointer(f[1]);
        s.resid = (uint16_t *)pointer(f[2]);
        s.chan_scales = (uint16_t *)pointer(f[3]);
        s.fmt = std::stoi(f[4]);
        s.group = std::stoi(f[5]);
        s.residual = std::stoi(f[6]);
        s.code_bytes = std::stoi(f[7]);
        s.meta_bytes = std::stoi(f[8]);
        s.cap = std::stoi(f[9]);
        return s;
    } else {
        static_assert(std::is_pointer_v<T>, "kernel parameters are pointers, int, float, Stream");
        return (T)pointer(want('p'));
    }
}

using Args = std::vector<std::string>;
using Kernel = std::function<void(dim3, unsigned, const Args &)>;

template <class... P, size_t... I>
void call(const char *name, void (*k)(P...), dim3 grid, unsigned block, const Args &a,
          std::index_sequence<I...>) {
    if (a.size() != sizeof...(P))
        die(std::string(name) + " takes " + std::to_string(sizeof...(P)) + " arguments, the plan gives " +
            std::to_string(a.size()));
    kvemu::launch(name, k, grid, dim3(block), arg<P>(a[I], name, I)...);
    for (Buf *b : live_bufs()) b->check(name);
}

template <class... P> Kernel kernel(const char *name, void (*k)(P...)) {
    return [name, k](dim3 grid, unsigned block, const Args &a) {
        call(name, k, grid, block, a, std::index_sequence_for<P...>{});
    };
}

const std::map<std::string, Kernel> &kernels() {
    static const std::map<std::string, Kernel> k = {
        {"kv_append", kernel("kv_append", kv_append)},
        {"kv_chan_quantize", kernel("kv_chan_quantize", kv_chan_quantize)},
        {"kv_chan_resid", kernel("kv_chan_resid", kv_chan_resid)},
        {"kv_advance", kernel("kv_advance", kv_advance)},
        {"kv_advance_seen", kernel("kv_advance_seen", kv_advance_seen)},
        {"kv_attn_partial_d64", kernel("kv_attn_partial_d64", kv_attn_partial_d64)},
        {"kv_attn_partial_d128", kernel("kv_attn_partial_d128", kv_attn_partial_d128)},
        {"kv_attn_partial_d256", kernel("kv_attn_partial_d256", kv_attn_partial_d256)},
        {"kv_attn_combine", kernel("kv_attn_combine", kv_attn_combine)},
        {"kv_h2o_scores", kernel("kv_h2o_scores", kv_h2o_scores)},
        {"kv_evict", kernel("kv_evict", kv_evict)},
    };
    return k;
}

void write_file(const std::string &path, const void *data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write((const char *)data, (std::streamsize)bytes);
    if (!f) die("cannot write " + path);
}

// --- The plan --------------------------------------------------------------------------------

int run_plan(const std::string &plan, const std::string &inputs, const std::string &out_dir) {
    std::ifstream f(plan), in(inputs, std::ios::binary);
    if (!f) die("cannot read " + plan);
    if (!in) die("cannot read " + inputs);
    std::vector<uint8_t> attn;
    std::string line;
    size_t lineno = 0;
    while (std::getline(f, line)) {
        lineno++;
        std::istringstream ls(line);
        std::string op;
        if (!(ls >> op) || op[0] == '#') continue;
        auto bad = [&]() { die("line " + std::to_string(lineno) + ": bad step: " + line); };
        if (op == "alloc") {
            std::string name, fill;
            size_t elem = 0, count = 0;
            if (!(ls >> name >> elem >> count >> fill)) bad();
            auto b = std::make_unique<Buf>(name, elem * count);
            if (fill == "zero") memset(b->ptr(), 0, b->bytes);
            else if (fill == "nan" || fill == "uninit") b->fill_nan();  // unwritten shows as NaN
            else bad();
            bufs[name] = std::move(b);
        } else if (op == "copy") {
            std::string src, dst;
            size_t so = 0, dof = 0, n = 0;
            if (!(ls >> src >> dst >> so >> dof >> n)) bad();
            Buf &a = get(src), &b = get(dst);
            if (so + n > a.bytes || dof + n > b.bytes) die("copy out of bounds: " + line);
            memcpy(b.ptr() + dof, a.ptr() + so, n);
        } else if (op == "replace") {
            std::string dst, src;
            if (!(ls >> dst >> src)) bad();
            get(dst);
            get(src);
            BufP fresh = std::move(bufs.at(src));
            bufs.erase(src);
            fresh->name = dst;
            bufs[dst] = std::move(fresh);
        } else if (op == "zero") {
            std::string name;
            if (!(ls >> name)) bad();
            Buf &b = get(name);
            memset(b.ptr(), 0, b.bytes);
        } else if (op == "input") {
            std::string name;
            size_t count = 0;
            if (!(ls >> name >> count)) bad();
            auto b = std::make_unique<Buf>(name, count * 4);
            in.read((char *)b->ptr(), (std::streamsize)(count * 4));
            if (!in) die("inputs end early at line " + std::to_string(lineno));
            bufs[name] = std::move(b);
        } else if (op == "output") {
            std::string name;
            if (!(ls >> name)) bad();
            Buf &b = get(name);
            attn.insert(attn.end(), b.ptr(), b.ptr() + b.bytes);
            bufs.erase(name);
        } else if (op == "free") {
            std::string name;
            if (!(ls >> name)) bad();
            get(name);
            bufs.erase(name);
        } else if (op == "dump") {
            std::string name;
            if (!(ls >> name)) bad();
            Buf &b = get(name);
            write_file(out_dir + "/" + name + ".bin", b.ptr(), b.bytes);
        } else if (op == "launch") {
            std::string name;
            unsigned gx = 0, gy = 0, gz = 0, block = 0;
            if (!(ls >> name >> gx >> gy >> gz >> block)) bad();
            Args a;
            for (std::string t; ls >> t;) a.push_back(t);
            auto k = kernels().find(name);
            if (k == kernels().end()) die("no kernel " + name);
            k->second(dim3(gx, gy, gz), block, a);
        } else {
            bad();
        }
    }
    write_file(out_dir + "/attn.bin", attn.data(), attn.size());
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
        fprintf(stderr, "usage: harness PLAN INPUTS OUT_DIR [fibers|threads] [SEED]\n"
                        "       harness --fp8 VALUES OUT\n");
        return 2;
    }
    if (argc > 4) {
        const std::string m = argv[4];
        if (m == "threads") kvemu::sched = kvemu::Sched::Threads;
        else if (m != "fibers") die("scheduler must be fibers or threads");
    }
    if (argc > 5) kvemu::seed = strtoull(argv[5], nullptr, 10);
    return run_plan(argv[1], argv[2], argv[3]);
}
