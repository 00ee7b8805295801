// Hopper's warpgroup MMA (wgmma, sm_90a) as rung 08's forward and rung 09's backward use it: the
// shared-memory tile layout it reads, the matrix descriptor that names such a tile, and the shapes
// of `wgmma.mma_async` they issue (ss_n64, ss_n128 and rs_n64 for the forward; ss_n64, ss_n32 and
// rs_n64 for the backward), and the register moves of warp specialization. Everything here
// compiles to nothing outside an sm_90a pass (guarded by __CUDA_ARCH_FEAT_SM90_ALL at the call
// sites).
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp's index a multiple of 4). One
// wgmma multiplies a 64 × 16 A by a 16 × N B into a 64 × N fp32 accumulator held in the
// warpgroup's registers: warp w of the group holds rows 16w..16w+15 in the layout of an mma.sync
// m16n8 C fragment repeated N/8 times (element i of a thread: row g + 8·((i/2) % 2), column
// 8·(i/4) + 2t + i % 2, with g = lane/4, t = lane%4). A comes from shared memory or, in the same
// layout as mma.sync's A fragment, from registers; B always comes from shared memory.
//
// The tile layout ("panels"): a rows × C tile of 16-bit values is cut into C/64 panels of 64
// columns; panel p holds columns 64p..64p+63 of every row, 128 bytes per row, rows one after the
// other, and within a row chunk c (8 values, 16 bytes) sits at chunk position c ^ (row % 8).
// That is rung 06's swz<64> in each panel, and it is the hardware's 128-byte swizzle, which
// wgmma undoes by itself when the panel starts on a 1024-byte boundary.
#pragma once

// Compiled for a GPU other than sm_90a, the kernels of rungs 08 and 09 keep only their __trap()
// (their launchers refuse every call first), so the constants and helpers that only the left-out
// bodies use are unreferenced there: nvcc's note on each (#177), some two hundred a build, is
// silenced for those passes only. The sm_90a pass, which compiles the bodies, still reports it.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma nv_diag_suppress 177
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>

#include "../06_tensor_core_mma/mma_sync.cuh"
#include "../06_tensor_core_mma/swizzle.hpp"
#include "cuda_check.cuh"

namespace fl::wgmma {

// Whether wgmma can run now: the current GPU has compute capability 9.0 (H100, H200) and the
// source that asks was compiled for sm_90a (the rung's CMakeLists.txt defines FL_HAVE_WGMMA then).
// Asked at every call: three attribute queries, no synchronisation.
inline bool available() {
#if defined(FL_HAVE_WGMMA)
  int dev = 0, major = 0, minor = 0;
  FL_CUDA_CHECK(cudaGetDevice(&dev));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

// Empty where wgmma runs; else what a Hopper rung needs, naming `instead`, the version that runs on
// any GPU from sm_80 (a rung's unavailable(): every check refuses with it).
inline std::string why_not_here(const char* instead) {
  try {
    if (available()) return {};
  } catch (const std::exception& e) {  // no GPU, no driver: say so, never throw from a question
    return std::string("no GPU to run on (") + e.what() + ")";
  }
  return std::string("it needs an sm_90 GPU (H100, H200) and the rung built for sm_90a (CMAKE_CUDA_ARCHITECTURES "
                     "containing 90); ") + instead + " runs on any GPU from sm_80";
}

// Byte offset of element (r, c) in a kRows × C panel tile.
template <int kRows>
__host__ __device__ constexpr uint32_t panel_at(int r, int c) {
  return uint32_t((c / 64) * kRows * 128 + 2 * fl::mma::swz<64>(r, c % 64));
}

// A thread's share of copying a kRows × D tile from global memory (row-major) into a panel tile
// by cp.async, 16 bytes at a time: thread tid always copies chunk tid % (D/8) of rows
// tid / (D/8) + i·kRowStep. The same interface as rung 06's TileCopy (kChunks, load), which it
// equals at D = 64.
template <int D, int kThreads>
struct PanelCopy {
  static constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRowStep % 8 == 0, "each thread keeps one chunk column");
  int src;            // this thread's first chunk in global memory, values from the tile's start
  uint32_t dst_row;   // bytes from its panel's start to its first chunk
  int chunk, row;     // its chunk column (0..D/8-1) and first row
  __device__ explicit PanelCopy(int tid)
      : src(tid / kChunks * D + 8 * (tid % kChunks)), dst_row(panel_at<8>(tid / kChunks, 8 * (tid % kChunks) % 64)),
        chunk(tid % kChunks), row(tid / kChunks) {}

  // Rows at or past `valid` become zeros and read nothing.
  template <int kRows, class T>
  __device__ void load(uint32_t tile, const T* g, int valid) const {
    static_assert(kRows % kRowStep == 0, "whole passes");
    const uint32_t dst = tile + uint32_t(chunk / 8) * (kRows * 128) + dst_row;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool ok = row + i * kRowStep < valid;
      fl::mma::cp_async_16(dst + uint32_t(i * kRowStep * 128), g + (ok ? src + i * kRowStep * D : src % D), ok);
    }
  }
};

// The matrix descriptor of a panel tile (128-byte swizzle). `lbo` and `sbo` are the two strides
// the hardware cannot infer: for a K-major operand (K contiguous) sbo is the step between groups
// of 8 rows (1024 bytes) and lbo is unused; for an MN-major operand (M or N contiguous, read with
// the transpose flag) lbo is the step from one 64-wide panel to the next along M or N and sbo the
// step between groups of 8 rows along K (1024 bytes). The start address may sit inside a panel
// (the K-major k-steps advance it by 32 bytes; rung 09's v8 starts an MN-major B 64 bytes along N):
// the swizzle is applied to the absolute address, and as long as bits 7-9 of the start address are
// zero the descriptor's base-offset field stays 0.
__device__ inline uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | uint64_t((lbo >> 4) & 0x3FFF) << 16 |
         uint64_t((sbo >> 4) & 0x3FFF) << 32 | uint64_t(1) << 62;
}

// A descriptor advanced by `bytes` of shared memory (a multiple of 16). The low 32-bit word holds
// the address over 16 (bits 0-13) and the leading-byte stride (bits 16-29): adding bytes / 16 to it
// moves the address and leaves the strides and the swizzle alone as long as the address stays
// below 2^14 * 16 bytes = 256 KB, which all of an SM's shared memory does.
// Kernels build a tile's base descriptor once and reach every k-step, buffer and panel from it.
__device__ inline uint64_t advance(uint64_t d, uint32_t bytes) {
  return (d & ~uint64_t(0xFFFFFFFF)) | uint32_t(uint32_t(d) + (bytes >> 4));
}

// wgmma.fence before the first wgmma that reads registers written since (accumulators, A);
// commit closes a group of issued wgmma; wait<N> returns when at most N groups are in flight.
__device__ inline void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared-memory writes of the ordinary kind (st.shared, cp.async) become visible to wgmma, which
// reads through the async proxy, only after this fence (and a barrier, for other threads' writes).
__device__ inline void fence_shared_to_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Warp specialization (rung 08 from v4, rung 09 from v3): a warpgroup's threads give back
// registers, or take more, as the warpgroup takes its role (sm_90a; every thread of the warpgroup
// executes it; the kernel starts at 65536 / kThreads each, rounded down to a multiple of 8: 168
// for 384 threads).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// Tells the compiler the accumulators are in use (by wgmma in flight), so it keeps them in place.
template <int N>
__device__ inline void hold(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define FL_WG_D8(b) \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), "+f"(d[b + 7])
#define FL_WG_E8(b) \
  "+f"(e[b + 0]), "+f"(e[b + 1]), "+f"(e[b + 2]), "+f"(e[b + 3]), "+f"(e[b + 4]), "+f"(e[b + 5]), "+f"(e[b + 6]), "+f"(e[b + 7])
#define FL_WG_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FL_WG_R32                                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define FL_WG_R64                                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// D (+)= A·B, m64n64k16, A and B from shared memory; kTransA/kTransB: 1 for an MN-major operand.
template <class T, int kTransA, int kTransB>
__device__ inline void ss_n64(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FL_WG_R32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8), FL_WG_D8(16), FL_WG_D8(24)
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FL_WG_R32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8), FL_WG_D8(16), FL_WG_D8(24)
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB));
}

// The same with N = 32.
template <class T, int kTransA, int kTransB>
__device__ inline void ss_n32(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " FL_WG_R16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8)
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " FL_WG_R16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8)
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB));
}

// D (+)= A·B, m64n128k16, A and B from shared memory: one instruction for 128 columns of B, whose
// accumulators are two m64n64 ones side by side (d: columns 0..63, e: 64..127; the same layout).
// Per product it reads A once where two n64 read it twice.
template <class T, int kTransA, int kTransB>
__device__ inline void ss_n128(float (&d)[32], float (&e)[32], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FL_WG_R64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8), FL_WG_D8(16), FL_WG_D8(24), FL_WG_E8(0), FL_WG_E8(8), FL_WG_E8(16), FL_WG_E8(24)
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FL_WG_R64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8), FL_WG_D8(16), FL_WG_D8(24), FL_WG_E8(0), FL_WG_E8(8), FL_WG_E8(16), FL_WG_E8(24)
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB));
}

// D += A·B, m64n64k16, A from registers (an mma.sync A fragment per warp), B from shared memory.
template <class T, int kTransB>
__device__ inline void rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FL_WG_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8), FL_WG_D8(16), FL_WG_D8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1), "n"(kTransB));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FL_WG_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : FL_WG_D8(0), FL_WG_D8(8), FL_WG_D8(16), FL_WG_D8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1), "n"(kTransB));
}

#undef FL_WG_D8
#undef FL_WG_E8
#undef FL_WG_R64
#undef FL_WG_R16
#undef FL_WG_R32

}  // namespace fl::wgmma
