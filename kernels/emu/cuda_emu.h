// CPU emulation of the CUDA subset kernels/kv_cache.cu uses, so the kernels compile unchanged as
// host C++20 with g++ and run where no GPU is:
//
//   g++ -std=c++20 -O2 -pthread -ffp-contract=off -x c++ -include kernels/emu/cuda_emu.h ...
//
// (kernels/emu/harness.cpp includes this header and then the .cu itself.) -ffp-contract=off
// matches nvcc --fmad=false: every product and sum rounds on its own, as in the CPU encoders.
//
// Execution model (what CUDA guarantees and no more, so missing barriers and bad indexing show):
// - A launch runs its blocks one after another, in a random order (kvemu::seed; 0: x fastest,
//   then y, z), as CUDA promises no order; every CUDA thread of a block is its own thread of
//   execution with its own stack, its own copy of the kernel arguments and its own threadIdx;
//   blockIdx/blockDim/gridDim describe the launch.
// - `__shared__` variables are function statics: one instance the block's threads share (blocks
//   never overlap in time). Unlike CUDA they are not garbage at block start: they hold what the
//   previous block left.
// - `__syncthreads()` is a barrier over the block's threads that have not returned (as on the
//   GPU, a thread that exits stops counting). `__shfl_xor_sync` and `__shfl_sync` exchange values among the live
//   lanes of one warp (32 consecutive threads) through a per-warp buffer and a per-warp barrier:
//   warps of a block proceed independently of each other between `__syncthreads()`.
// - Two schedulers (kvemu::sched):
//     Threads: one OS thread (std::jthread) per CUDA thread, std::barrier for both barriers:
//       real concurrency, so unsynchronized shared-memory traffic races for real (and
//       ThreadSanitizer, -fsanitize=thread, reports it with its source line). Slow: each
//       barrier phase costs every thread a context switch (about 2 µs per thread per phase on
//       2 cores).
//     Fibers: one user-mode context (own stack) per CUDA thread, all on the calling OS thread,
//       switched only at the barriers; between two barriers the threads run one at a time in a
//       random order drawn afresh at every barrier (kvemu::seed), so a read that is not
//       separated by a barrier from another thread's write sees the old or the new value
//       depending on the order, and a missing __syncthreads shows up as a wrong result. About
//       75 ns per thread and barrier phase (25× faster than Threads); a deadlock (divergent
//       barriers) is reported, not hung.
// - Half precision is _Float16 (round to nearest even, as __float2half_rn); FP8 conversions
//   follow the OCP FP8 spec (E4M3: bias 7, max 448, no infinity, S.1111.111 = NaN; E5M2:
//   bias 15, max 57344, IEEE-like) with CUDA's __NV_SATFINITE saturation and NaN encodings.
//   `__expf` is expf (CUDA's is an approximation of a few ulp).
//
// Not modelled: timing, occupancy, shared-memory capacity and bank conflicts; blocks running
// concurrently (a launch's blocks never overlap, so inter-block races and atomics are not
// exercised; order dependencies are, through the random block order); the GPU's weak memory
// model (Fibers run each segment between barriers atomically; Threads order memory at the
// barriers as C++ acquire/release, on x86's strong hardware ordering), so a missing
// __threadfence would not show; warp-synchronous execution without __syncwarp (lanes are
// independent threads here, as on Volta and later); partial shuffle masks (rejected);
// out-of-bounds reads (the harness guards buffers against writes only).
#pragma once
#define KVBENCH_CUDA_EMU 1

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

// Fibers switch with a few lines of assembly on x86-64 and with ucontext elsewhere (or with
// -DKVEMU_UCONTEXT; ucontext costs a system call per switch).
#if defined(__x86_64__) && !defined(KVEMU_UCONTEXT)
#define KVEMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// Per CUDA thread (the Fibers scheduler sets them on every switch) and per launch.
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// ---------------------------------------------------------------------------------------------
// Numeric intrinsics.

using __half = _Float16;
struct __half_raw {
    unsigned short x;
};
typedef unsigned char __nv_fp8_storage_t;
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };

inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float v) { return (__half)v; }
inline __half __ushort_as_half(unsigned short u) {
    __half h;
    memcpy(&h, &u, 2);
    return h;
}
inline unsigned short __half_as_ushort(__half h) {
    unsigned short u;
    memcpy(&u, &h, 2);
    return u;
}
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
inline float __expf(float x) { return expf(x); }

namespace kvemu {

// Value of FP8 code c (sign applied) per the OCP FP8 spec; NaN for NaN codes, ±inf for E5M2's
// infinities.
inline double fp8_value(unsigned c, __nv_fp8_interpretation_t k) {
    const bool e4m3 = k == __NV_E4M3;
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    const unsigned mag = c & 0x7f, e = mag >> mbits, m = mag & ((1u << mbits) - 1);
    const double s = (c & 0x80) ? -1.0 : 1.0;
    if (e4m3 && mag == 0x7f) return NAN;
    if (!e4m3 && e == 31) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp((double)m, 1 - bias - mbits);
    return s * ldexp((double)((1u << mbits) | m), (int)e - bias - mbits);
}

// Round to the nearest code (ties to the even code, i.e. mantissa LSB 0), saturating finite
// overflow and infinities to ±max (__NV_SATFINITE); NaN as CUDA encodes it (E4M3 S.1111.111,
// E5M2 S.11111.1x with x the f32 NaN's next mantissa bit). Independent of the bit manipulation
// in CUDA's cuda_fp8.hpp: it searches the table of the 127 non-negative finite values.
inline uint8_t fp8_from_float(float x, __nv_fp8_interpretation_t k) {
    const bool e4m3 = k == __NV_E4M3;
    uint32_t bits;
    memcpy(&bits, &x, 4);
    const uint8_t sign = (uint8_t)((bits >> 31) << 7);
    if (x != x) return sign | (e4m3 ? 0x7f : (uint8_t)(0x7e | ((bits >> 21) & 1)));
    const uint8_t max_code = e4m3 ? 0x7e : 0x7b;
    const double ax = fabs((double)x);
    if (ax >= fp8_value(max_code, k)) return sign | max_code;
    // Codes 0..max_code are ascending in value: the last one <= ax and the next one.
    unsigned lo = 0;
    while (lo + 1 <= max_code && fp8_value(lo + 1, k) <= ax) lo++;
    const double dlo = ax - fp8_value(lo, k), dhi = fp8_value(lo + 1, k) - ax;
    const unsigned c = dlo < dhi ? lo : dhi < dlo ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return sign | (uint8_t)c;
}

}  // namespace kvemu

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat,
                                                __nv_fp8_interpretation_t k) {
    if (sat != __NV_SATFINITE) {
        fprintf(stderr, "cuda_emu: only __NV_SATFINITE is emulated\n");
        abort();
    }
    return kvemu::fp8_from_float(x, k);
}

inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t c, __nv_fp8_interpretation_t k) {
    if (k == __NV_E5M2) {
        const unsigned short u = (unsigned short)(c << 8);
        return {(u & 0x7fff) > 0x7c00 ? (unsigned short)0x7fff : u};  // NaN: canonical
    }
    if ((c & 0x7f) == 0x7f) return {0x7fff};
    // Every E4M3 value is exact in f16.
    return {__half_as_ushort((__half)(float)kvemu::fp8_value(c, k))};
}

// ---------------------------------------------------------------------------------------------
// Blocks, barriers and the two schedulers.

namespace kvemu {

enum class Sched { Threads, Fibers };
inline Sched sched = Sched::Fibers;
// Seed of the block order and (Fibers) of the interleaving of threads; 0: in index order.
inline uint64_t seed = 1;
// Name of the kernel running (diagnostics).
inline const char *current_kernel = "";

struct Block {
    unsigned n = 0, warps = 0;
    // [warp][parity][lane]: shuffle k of a warp uses parity k % 2, so a lane can only overwrite
    // a slot after every lane passed the next barrier, i.e. finished reading this one.
    std::vector<std::array<std::array<uint64_t, 32>, 2>> shfl;
    // Threads scheduler.
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
    unsigned warp_size(unsigned w) const { return std::min(32u, n - 32 * w); }
};

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

// One CUDA thread.
struct Lane {
    Block *block = nullptr;
    dim3 tid;
    unsigned linear = 0, warp = 0, lane = 0, shuffles = 0;
    // Fibers scheduler.
    State state = State::Ready;
    void *sp = nullptr;
    char *stack = nullptr;
#if !defined(KVEMU_ASM_SWITCH)
    ucontext_t ctx;
#endif
};

inline thread_local Lane *self = nullptr;

[[noreturn]] inline void fail(const char *what) {
    fprintf(stderr, "cuda_emu: %s (kernel %s, block %u,%u,%u, thread %u)\n", what, current_kernel,
            blockIdx.x, blockIdx.y, blockIdx.z, self ? self->linear : 0u);
    abort();
}

// --- Fibers: context switch (x86-64 System V; ucontext elsewhere) ---------------------------
//
// A thread that blocks at a barrier switches straight to the next ready thread of the current
// sweep (one switch per thread per barrier phase); when the sweep is done it returns to the
// scheduler, which releases whatever barrier is complete and starts the next sweep in a fresh
// random order. The scheduler state is global: one OS thread runs fibers at a time.

inline constexpr size_t kStack = 256 * 1024;

#if defined(KVEMU_ASM_SWITCH)
extern "C" void kvemu_switch(void **save_sp, void *to_sp);
extern "C" void kvemu_trampoline();
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp,
// switches to to_sp and restores the same from there. MXCSR and the x87 control word are not
// switched: no kernel changes the floating-point environment. A fresh fiber's stack holds
// kvemu_trampoline as return address, the entry in r13 and its argument in r12. Weak: the
// header may be included by several translation units.
asm(R"(
    .pushsection .text
    .weak kvemu_switch
    .type kvemu_switch, @function
kvemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kvemu_switch, .-kvemu_switch
    .weak kvemu_trampoline
    .type kvemu_trampoline, @function
kvemu_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size kvemu_trampoline, .-kvemu_trampoline
    .popsection
)");
#endif

struct FiberSched {
    void *sp = nullptr;  // the scheduler's stack pointer while fibers run
#if !defined(KVEMU_ASM_SWITCH)
    ucontext_t ctx;
#endif
    const std::function<void()> *body = nullptr;
    std::vector<char *> stacks;  // kStack each, a PROT_NONE guard page below
    std::vector<Lane> *lanes = nullptr;
    std::vector<unsigned> order;  // the current sweep's order of lanes
    size_t next = 0;              // position in `order` of the next lane to look at
    unsigned live = 0;            // lanes that have not returned
#if !defined(KVEMU_ASM_SWITCH)
    Lane *starting = nullptr;  // the lane a fresh context starts (fiber_start reads it)
#endif
};
inline FiberSched fs;

inline uint64_t rng_state = 0;  // splitmix64, from `seed` at the first launch

inline uint64_t splitmix64() {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The next lane of the sweep that is ready to run, or null at the end of the sweep.
inline Lane *next_ready() {
    while (fs.next < fs.order.size()) {
        Lane &l = (*fs.lanes)[fs.order[fs.next++]];
        if (l.state == State::Ready) return &l;
    }
    return nullptr;
}

// Leaves the running fiber `from` (blocked or returned) for the next ready one or the scheduler.
inline void switch_from(Lane *from) {
    Lane *to = next_ready();
    self = to;
    if (to) threadIdx = to->tid;
#if defined(KVEMU_ASM_SWITCH)
    kvemu_switch(&from->sp, to ? to->sp : fs.sp);
#else
    fs.starting = to;
    swapcontext(&from->ctx, to ? &to->ctx : &fs.ctx);
#endif
}

inline void fiber_entry(Lane *l) {
    (*fs.body)();
    l->state = State::Done;
    fs.live--;
    switch_from(l);
    abort();  // never resumed
}

#if !defined(KVEMU_ASM_SWITCH)
inline void fiber_start() { fiber_entry(fs.starting); }
#endif

inline char *fiber_stack(size_t i) {
    while (fs.stacks.size() <= i) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void *m = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (m == MAP_FAILED) fail("mmap of a fiber stack failed");
        mprotect(m, page, PROT_NONE);  // overflow faults instead of corrupting a neighbour
        fs.stacks.push_back((char *)m + page);
    }
    return fs.stacks[i];
}

inline void fiber_prepare(Lane &l) {
#if defined(KVEMU_ASM_SWITCH)
    // Stack tops staggered by 64 bytes per lane: equal offsets in every stack would map all
    // fibers' hot frames onto the same L1 cache sets.
    uint64_t *sp = (uint64_t *)(l.stack + kStack - 64 * (l.linear % 61) - 72);
    sp[0] = sp[1] = 0;                       // r15, r14
    sp[2] = (uint64_t)(void *)&fiber_entry;  // r13: entry
    sp[3] = (uint64_t)&l;                    // r12: its argument
    sp[4] = sp[5] = 0;                       // rbx, rbp
    sp[6] = (uint64_t)(void *)&kvemu_trampoline;
    l.sp = sp;  // after the pops and `ret`, rsp = sp + 56: 16-byte aligned at the call
#else
    getcontext(&l.ctx);
    l.ctx.uc_stack.ss_sp = l.stack;
    l.ctx.uc_stack.ss_size = kStack;
    l.ctx.uc_link = nullptr;
    makecontext(&l.ctx, fiber_start, 0);
#endif
}

// A random permutation of v (Fisher–Yates); none with seed 0.
inline void shuffle(std::vector<unsigned> &v) {
    if (seed)
        for (size_t i = v.size(); i > 1; i--)
            std::swap(v[i - 1], v[(size_t)(((unsigned __int128)splitmix64() * i) >> 64)]);
}

// One sweep: runs every ready lane, in a random order, until it blocks or returns.
inline void sweep() {
    shuffle(fs.order);
    fs.next = 0;
    Lane *first = next_ready();
    if (!first) return;
    self = first;
    threadIdx = first->tid;
#if defined(KVEMU_ASM_SWITCH)
    kvemu_switch(&fs.sp, first->sp);
#else
    fs.starting = first;
    swapcontext(&fs.ctx, &first->ctx);
#endif
}

inline void fiber_block(State s) {
    self->state = s;
    switch_from(self);
}

// Runs one block's threads as fibers until all have returned.
inline void run_block_fibers(Block &b, std::vector<Lane> &lanes) {
    fs.lanes = &lanes;
    fs.order.resize(b.n);
    std::iota(fs.order.begin(), fs.order.end(), 0u);
    for (auto &l : lanes) {
        l.state = State::Ready;
        fiber_prepare(l);
    }
    fs.live = b.n;
    while (true) {
        sweep();
        if (fs.live == 0) break;
        // Every live thread now waits at a barrier: release what can be released.
        unsigned at_block = 0;
        for (auto &l : lanes) at_block += l.state == State::AtBlockBarrier;
        bool released = false;
        if (at_block == fs.live) {
            for (auto &l : lanes)
                if (l.state == State::AtBlockBarrier) l.state = State::Ready;
            released = true;
        } else {
            for (unsigned w = 0; w < b.warps; w++) {
                unsigned waiting = 0, alive = 0;
                for (unsigned i = 32 * w; i < 32 * w + b.warp_size(w); i++) {
                    alive += lanes[i].state != State::Done;
                    waiting += lanes[i].state == State::AtWarpBarrier;
                }
                if (waiting && waiting == alive) {
                    for (unsigned i = 32 * w; i < 32 * w + b.warp_size(w); i++)
                        if (lanes[i].state == State::AtWarpBarrier) lanes[i].state = State::Ready;
                    released = true;
                }
            }
        }
        if (!released) {
            self = nullptr;
            fail("deadlock: threads wait at different barriers (__syncthreads in divergent code, "
                 "or a shuffle whose warp is partly at __syncthreads)");
        }
    }
    self = nullptr;
}

// --- Barriers as the kernels call them ------------------------------------------------------

inline void block_sync() {
    if (sched == Sched::Fibers)
        fiber_block(State::AtBlockBarrier);
    else
        self->block->bar->arrive_and_wait();
}

inline void warp_sync() {
    if (sched == Sched::Fibers)
        fiber_block(State::AtWarpBarrier);
    else
        self->block->warp_bar[self->warp]->arrive_and_wait();
}

// --- Launch ---------------------------------------------------------------------------------

inline void make_block(Block &b, unsigned n) {
    b.n = n;
    b.warps = (n + 31) / 32;
    b.shfl.assign(b.warps, {});
    if (sched == Sched::Threads) {
        b.bar = std::make_unique<std::barrier<>>(n);
        b.warp_bar.clear();
        for (unsigned w = 0; w < b.warps; w++)
            b.warp_bar.push_back(std::make_unique<std::barrier<>>(b.warp_size(w)));
    }
}

inline dim3 unflatten(unsigned i, dim3 d) { return dim3(i % d.x, i / d.x % d.y, i / d.x / d.y); }

// Runs `body` (one CUDA thread's call of the kernel) for every thread of every block.
inline void run(const char *name, dim3 grid, dim3 block, const std::function<void()> &body) {
    current_kernel = name;
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z;
    const unsigned nb = grid.x * grid.y * grid.z;
    if (n == 0 || n > 1024) fail("block size must be 1..1024 threads");
    if (nb == 0) return;
    if (!rng_state) rng_state = seed;
    std::vector<unsigned> blocks_order(nb);
    std::iota(blocks_order.begin(), blocks_order.end(), 0u);
    shuffle(blocks_order);
    if (sched == Sched::Fibers) {
        std::vector<Lane> lanes(n);
        for (unsigned t = 0; t < n; t++) {
            lanes[t].tid = unflatten(t, block);
            lanes[t].linear = t;
            lanes[t].warp = t / 32;
            lanes[t].lane = t % 32;
            lanes[t].stack = fiber_stack(t);
        }
        fs.body = &body;
        Block b;
        make_block(b, n);
        for (unsigned bi : blocks_order) {
            blockIdx = unflatten(bi, grid);
            b.shfl.assign(b.warps, {});
            for (auto &l : lanes) {
                l.block = &b;
                l.shuffles = 0;
            }
            run_block_fibers(b, lanes);
        }
        return;
    }
    // Threads: n OS threads walk the blocks in the same order; a block's barriers are fresh
    // objects (a returned thread drops out of them), and `next` keeps every thread out of the
    // next block until all have left this one (shared memory is reused).
    std::vector<Block> blocks(nb);
    for (auto &b : blocks) make_block(b, n);
    std::barrier<> next(n);
    {
        std::vector<std::jthread> threads;
        threads.reserve(n);
        for (unsigned t = 0; t < n; t++)
            threads.emplace_back([&, t] {
                Lane l;
                l.tid = unflatten(t, block);
                l.linear = t;
                l.warp = t / 32;
                l.lane = t % 32;
                self = &l;
                threadIdx = l.tid;
                for (unsigned bi : blocks_order) {
                    blockIdx = unflatten(bi, grid);
                    l.block = &blocks[bi];
                    l.shuffles = 0;
                    body();
                    blocks[bi].bar->arrive_and_drop();
                    blocks[bi].warp_bar[l.warp]->arrive_and_drop();
                    next.arrive_and_wait();
                }
                self = nullptr;
            });
    }
}

// Launches `kernel` on `grid` × `block` with `args` (converted to the kernel's parameter types
// once; every CUDA thread receives its own copy, as from CUDA's parameter space).
template <class... P, class... A>
void launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "argument count differs from the kernel's");
    const std::tuple<P...> params(std::forward<A>(args)...);
    run(name, grid, block, [&] {
        std::tuple<P...> mine = params;
        std::apply(kernel, mine);
    });
}

}  // namespace kvemu

inline void __syncthreads() { kvemu::block_sync(); }

namespace kvemu {
// One full-warp shuffle: every lane posts `v`, the warp meets, and each lane reads the value of
// lane `src(own lane)` (its own where that lane is outside the warp, as CUDA).
template <class T, class Src>
T shuffle(unsigned mask, T v, int width, Src src_of) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    if (mask != 0xffffffffu || width != 32) fail("only full-warp shuffles are emulated");
    Lane &l = *self;
    Block &b = *l.block;
    auto &buf = b.shfl[l.warp][l.shuffles++ & 1];
    memcpy(&buf[l.lane], &v, sizeof(T));
    warp_sync();
    unsigned src = src_of(l.lane);
    if (src >= b.warp_size(l.warp)) src = l.lane;
    T r;
    memcpy(&r, &buf[src], sizeof(T));
    return r;
}
}  // namespace kvemu

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return kvemu::shuffle(mask, v, width, [&](unsigned lane) { return lane ^ (unsigned)lane_mask; });
}

// Every lane reads lane src_lane's value (CUDA's index form of the shuffle; src_lane taken
// modulo 32, as width 32).
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    return kvemu::shuffle(mask, v, width, [&](unsigned) { return (unsigned)src_lane & 31u; });
}
