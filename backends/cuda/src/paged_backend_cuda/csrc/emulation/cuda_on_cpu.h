// Just enough CUDA for a host C++ compiler to build this package's kernels and run them on the CPU, so the
// real kernel source can be tested without a GPU (emulated.py builds it; common.cuh includes this file when
// the compiler is not nvcc). It covers what csrc/*.cu use and nothing more.
//
// A launch runs its blocks one after another. The threads of a block are cooperative fibers on the calling
// OS thread, each with its own stack: a fiber runs until it reaches a barrier (__syncthreads, or a warp
// shuffle, which is a barrier of its warp: every lane deposits its value, then each reads its partner's),
// then hands over to the next runnable fiber; the last to arrive releases the others and runs on. So one of
// the interleavings the barriers allow is run, not all of them: a race between barriers goes unnoticed.
// Barrier misuse does not: a deadlock (threads waiting at different barriers), a thread exiting while others
// wait at a barrier, a shuffle in a warp whose lane has exited or a partial-warp mask fail the launch
// (take_error()). A shuffle pairs with its warp's next shuffle wherever that is called from.
//
// Fibers start with makecontext/setcontext and switch with _setjmp/_longjmp. swapcontext would also save and
// restore the signal mask, a system call (~300 ns) per switch, and a warp_sum is five switches per lane;
// _setjmp/_longjmp (~12 ns) is enough here because every jump lands in a frame that is suspended in _setjmp
// on a stack that is still live (a fiber's own, or the launcher's). Fortified builds replace _longjmp with a
// check that refuses to change stacks, hence -U_FORTIFY_SOURCE.
#pragma once

#if defined(__CUDACC__)
#error "cuda_on_cpu.h is for host compilers; nvcc has the real CUDA headers"
#endif
#if defined(_FORTIFY_SOURCE) && _FORTIFY_SOURCE > 0
#error "build with -U_FORTIFY_SOURCE: the fortified longjmp refuses to switch to a fiber's stack"
#endif

#include <math.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers and built-in types ------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time, so one static array per kernel instantiation is exactly one block's shared memory.
#define __shared__ static
// (__restrict__ is a g++ and clang keyword already.)

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
using cudaStream_t = struct CUstream_st*;

inline uint3 threadIdx{}, blockIdx{};  // set by the scheduler for the running fiber and block
inline dim3 blockDim, gridDim;

// ---- element types ----------------------------------------------------------------------------------------
// Structs, not arithmetic types, so that code which would not compile for the GPU's types fails here too.

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = uint32_t{h.bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return {static_cast<uint16_t>(u >> 16)};
}

struct __half {
  _Float16 value;  // IEEE binary16; the conversions round to nearest even, as __float2half_rn does
};
inline float __half2float(__half h) { return static_cast<float>(h.value); }
inline __half __float2half_rn(float f) { return {static_cast<_Float16>(f)}; }

// ---- device functions -------------------------------------------------------------------------------------

inline float __expf(float x) { return expf(x); }  // the GPU's is a faster approximation, within a few ulp
template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
  return a < b ? b : a;
}

// ---- the fiber scheduler ----------------------------------------------------------------------------------

namespace cuda_emu {

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kMaxThreads = 1024;
constexpr int kWarpSize = 32;

enum class State : uint8_t { kRunnable, kAtSync, kAtShuffle, kDone };

struct Fiber {
  jmp_buf resume;        // where the fiber continues when it is suspended (started == true)
  bool started = false;  // false: its next run begins at fiber_main on a fresh stack
  State state = State::kRunnable;
  char* stack = nullptr;
};

struct Runtime {
  std::mutex mutex;            // one launch at a time: the shared arrays and this state are global
  Fiber fibers[kMaxThreads];   // fixed: a suspended fiber's jmp_buf must not move
  int stacks = 0;              // fibers with a stack, grown to the largest block so far and kept
  jmp_buf launcher;            // run_block's frame, where the block's last fiber returns to
  ucontext_t start;            // scratch for starting a fiber (setcontext copies it out)
  void (*body)(const void*) = nullptr;  // the kernel call of the current launch
  const void* arg = nullptr;
  int threads = 0, current = 0, live = 0, at_sync = 0;
  bool failed = false;  // the current block failed
  int warp_live[kMaxThreads / kWarpSize] = {}, warp_arrived[kMaxThreads / kWarpSize] = {};
  uint64_t shuffle_in[kMaxThreads] = {}, shuffle_out[kMaxThreads] = {};
  int shuffle_from[kMaxThreads] = {};
};
inline Runtime rt;
inline thread_local const char* error = nullptr;  // the launching thread's first failure, until take_error()

[[noreturn]] inline void fail(const char* why) {
  if (error == nullptr) error = why;
  rt.failed = true;
  _longjmp(rt.launcher, 1);
}

inline void fiber_main();

// Runs fiber t from where it stopped (or from the start). Never returns to the caller.
[[noreturn]] inline void enter(int t) {
  rt.current = t;
  threadIdx = {t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
  Fiber& f = rt.fibers[t];
  if (f.started) _longjmp(f.resume, 1);
  f.started = true;
  getcontext(&rt.start);
  rt.start.uc_stack.ss_sp = f.stack;
  rt.start.uc_stack.ss_size = kStackBytes;
  rt.start.uc_link = nullptr;  // fiber_main never returns
  makecontext(&rt.start, fiber_main, 0);
  setcontext(&rt.start);
  fail("setcontext failed");
}

// The next runnable fiber after the current one, round robin; failing when every live fiber is waiting.
inline int next_runnable() {
  for (int i = 1; i <= rt.threads; ++i) {
    const int t = (rt.current + i) % rt.threads;
    if (rt.fibers[t].state == State::kRunnable) return t;
  }
  fail("deadlock: every live thread waits, at barriers that cannot complete (divergent __syncthreads/shuffle)");
}

// Suspends the current fiber (its state says why) and runs another; returns once it is resumed. Not inlined,
// so that _setjmp (returns twice) stays out of the kernels' own code generation.
__attribute__((noinline)) inline void switch_away() {
  const int next = next_runnable();
  if (_setjmp(rt.fibers[rt.current].resume) == 0) enter(next);
}

inline void release_sync() {
  for (int t = 0; t < rt.threads; ++t)
    if (rt.fibers[t].state == State::kAtSync) rt.fibers[t].state = State::kRunnable;
  rt.at_sync = 0;
}

inline void sync_threads() {
  if (++rt.at_sync == rt.live) {
    release_sync();  // the last to arrive runs on
  } else {
    rt.fibers[rt.current].state = State::kAtSync;
    switch_away();
  }
}

// The warp-level barrier of a shuffle: deposit `bits`, wait for the warp, return lane `from`'s deposit.
inline uint64_t exchange(uint64_t bits, int from_lane) {
  const int me = rt.current, base = me - me % kWarpSize, w = me / kWarpSize;
  const int width = std::min(kWarpSize, rt.threads - base);
  if (rt.warp_live[w] != width) fail("warp shuffle in a warp with exited lanes");
  if (from_lane < 0 || from_lane >= width) fail("warp shuffle from a lane outside the warp");
  rt.shuffle_in[me] = bits;
  rt.shuffle_from[me] = base + from_lane;
  if (++rt.warp_arrived[w] == width) {
    // Every lane's result is taken now, before any lane can deposit its next value.
    for (int t = base; t < base + width; ++t) {
      rt.shuffle_out[t] = rt.shuffle_in[rt.shuffle_from[t]];
      rt.fibers[t].state = State::kRunnable;
    }
    rt.warp_arrived[w] = 0;
  } else {
    rt.fibers[me].state = State::kAtShuffle;
    switch_away();
  }
  return rt.shuffle_out[me];
}

// A fiber's whole life: run the launch's kernel once per block, parking between blocks.
inline void fiber_main() {
  for (;;) {
    rt.body(rt.arg);
    Fiber& f = rt.fibers[rt.current];
    const int w = rt.current / kWarpSize;
    f.state = State::kDone;
    --rt.live;
    --rt.warp_live[w];
    if (rt.warp_arrived[w] > 0) fail("a thread exited while its warp waits at a shuffle");
    // Stricter than the GPU, where exited threads count as arrived: these kernels only return early all
    // together, so a thread leaving while others wait is a __syncthreads in divergent code.
    if (rt.at_sync > 0) fail("a thread exited while others wait at __syncthreads");
    if (_setjmp(f.resume) == 0) {
      if (rt.live == 0) _longjmp(rt.launcher, 1);
      enter(next_runnable());
    }
    // Resumed by the next block that includes this thread.
  }
}

inline void grow(int threads) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (; rt.stacks < threads; ++rt.stacks) {
    // A guard page below each stack turns an overflow into a fault instead of another fiber's corruption.
    void* mem = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) fail("cannot map a fiber stack");
    mprotect(mem, page, PROT_NONE);
    rt.fibers[rt.stacks].stack = static_cast<char*>(mem) + page;
  }
}

// Runs one block to its end; false when it failed (see error).
inline bool run_block() {
  rt.failed = false;
  for (int t = 0; t < rt.threads; ++t) rt.fibers[t].state = State::kRunnable;
  rt.live = rt.threads;
  rt.at_sync = 0;
  for (int t = 0; t < rt.threads; t += kWarpSize) {
    rt.warp_live[t / kWarpSize] = std::min(kWarpSize, rt.threads - t);
    rt.warp_arrived[t / kWarpSize] = 0;
  }
  rt.current = 0;
  if (_setjmp(rt.launcher) == 0) enter(0);
  return !rt.failed;
}

inline void run(dim3 grid, dim3 block, void (*body)(const void*), const void* arg) {
  std::lock_guard<std::mutex> lock(rt.mutex);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
      grid.z > 65535) {
    if (error == nullptr) error = "invalid launch configuration";
    return;
  }
  if (_setjmp(rt.launcher) != 0) return;  // grow() failed
  grow(static_cast<int>(threads));
  rt.threads = static_cast<int>(threads);
  rt.body = body;
  rt.arg = arg;
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        if (!run_block()) {
          for (Fiber& f : rt.fibers) f.started = false;  // abandon the stuck fibers' stacks: restart them fresh
          return;
        }
      }
}

// The first failure of a launch since the last call (nullptr: none), cleared.
inline const char* take_error() {
  const char* e = error;
  error = nullptr;
  return e;
}

template <typename F>
void call(const void* f) {
  (*static_cast<const F*>(f))();
}

// launch(grid, block, stream, kernel)(args...) is kernel<<<grid, block, 0, stream>>>(args...).
template <typename... P>
struct Launch {
  void (*kernel)(P...);
  dim3 grid, block;

  template <typename... A>
  void operator()(A&&... args) const {
    // The arguments are converted to the parameter types once, as a launch does; std::apply then passes
    // each thread its own copy of the by-value parameters.
    const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    const auto body = [&] { std::apply(kernel, params); };
    run(grid, block, &call<decltype(body)>, &body);
  }
};

template <typename... P>
Launch<P...> launch(dim3 grid, dim3 block, cudaStream_t /*stream*/, void (*kernel)(P...)) {
  return {kernel, grid, block};
}

}  // namespace cuda_emu

inline void __syncthreads() { cuda_emu::sync_threads(); }

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = cuda_emu::kWarpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>, "shuffles move 8 bytes at most");
  if (mask != 0xffffffffu || width != cuda_emu::kWarpSize) cuda_emu::fail("only full-warp shuffles are emulated");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  bits = cuda_emu::exchange(bits, (cuda_emu::rt.current % cuda_emu::kWarpSize) ^ lane_mask);
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
