// What every rung-10 kernel file shares and none of them teaches: the call's sizes as the kernels
// see them, the cut of a sequence into pieces (the device copy of piece_keys), the merge kernel
// (rung 02's merge across thread blocks), and the launch of one version: its split pass, then the
// merge when there is more than one piece. A version file holds its split kernel and ends with
//     static const Register<Launch> registered{"10_decoding/vN_name", "idea", paged};
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "../06_tensor_core_mma/mma_sync.cuh"
#include "cuda_check.cuh"
#include "decoding.hpp"
#include "dispatch.cuh"

namespace fl::decoding {

inline constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = 2^(x·log2 e)
inline constexpr int kThreads = 128;                   // 4 warps a block, in every version
inline constexpr int kTileRows = 16;                   // packed rows a block takes: one m16 tile

// One call's sizes, passed by value to the kernels. A block of the split pass is
// (piece, KV head × row tile, sequence): blockIdx.x, .y, .z.
struct Params {
  int heads, kv_heads, group, seq_q, rows;  // H, Hkv, G = H / Hkv, Nq, R = G·Nq
  int row_tiles;                            // ⌈R / 16⌉
  int splits;
  int64_t capacity;                         // contiguous: key slots per (sequence, KV head)
  int page_size, pages_per_seq;             // paged (0 when contiguous)
  int64_t granule;                          // pieces start on multiples of it (DecodeShape::granule)
  float scale_log2;                         // softmax scale × log2 e
  bool causal;

  Params(const DecodeShape& s, int n_splits)
      : heads(int(s.heads)), kv_heads(int(s.kv_heads)), group(int(s.group())), seq_q(int(s.seq_q)),
        rows(int(s.rows())), row_tiles(int((s.rows() + kTileRows - 1) / kTileRows)), splits(n_splits),
        capacity(s.capacity), page_size(int(s.page_size)), pages_per_seq(int(s.pages_per_seq)),
        granule(s.granule()), scale_log2(s.softmax_scale() * kLog2e), causal(s.causal) {}

  // Keys in each piece of a sequence of `len` keys: piece_keys of decoding.cpp, on the device.
  // In 32-bit unsigned arithmetic (a 64-bit division is a subroutine call, and in merge_kernel its
  // calling convention made ptxas spill). len < 2³¹ (kv_len is int32) and the granule, the least
  // common multiple of 64 and a page of at most 2³⁰ keys, is below 2³²: per + g − 1 wraps only
  // when g > per, and then the quotient is 0 and the answer g, as it should be.
  __device__ int64_t piece_keys(int64_t len) const {
    const uint32_t g = uint32_t(granule), per = (uint32_t(len) + uint32_t(splits) - 1) / uint32_t(splits);
    return int64_t(max(g, (per + g - 1) / g * g));
  }
  // The pieces that hold keys of a sequence of len keys: ⌈len / piece_keys⌉ (written so that it
  // cannot wrap), 0 when len = 0.
  __device__ int pieces(int64_t len) const {
    const uint32_t chunk = uint32_t(piece_keys(len));
    return len > 0 ? int((uint32_t(len) - 1) / chunk + 1) : 0;
  }
  // The first of the Nq·G packed rows of (sequence b, KV head kvh) among Q's [B·H·Nq] rows.
  __device__ int64_t q_row0(int b, int kvh) const { return (int64_t(b) * heads + int64_t(kvh) * group) * seq_q; }
  // Where piece `piece` of (b, kvh) keeps its rows in the workspace: row (…)·R + r, D floats each.
  __device__ int64_t part_row0(int b, int kvh, int piece) const {
    return ((int64_t(b) * kv_heads + kvh) * splits + piece) * rows;
  }
};

// ---- the merge: a row per group of D/4 lanes, 4 columns a lane --------------------------------
//
// Piece p of a row left O_p (already divided by its own sum) and lse_p. As rung 02's row states
// {m = lse_p, ℓ = 1} they merge into m = max_p lse_p and ℓ = Σ_p exp(lse_p − m); then
// lse = m + log ℓ and O = Σ_p exp(lse_p − m)·O_p / ℓ. A row no piece saw a key of keeps m = −∞:
// O = 0, lse = −∞.
//
// The merge is a few microseconds of latency, not of bandwidth: it reads little, and each round
// trip to L2 is a microsecond of it. So it folds the pieces in chunks of kMergeChunk as rung 02
// folds blocks of keys: every lane loads a chunk's lse_p and its 4 columns of the chunk's O_p
// rows all at once (one round trip), then rescales what it holds to the chunk's new maximum and
// adds the chunk in. Up to kMergeChunk pieces, one round trip in all. As many blocks as there are
// rows / kMergeRows, so that even one sequence's merge spreads over the GPU.
template <int D>
inline constexpr int kMergeRows = kThreads / (D / 4);  // rows a merge block takes
inline constexpr int kMergeChunk = 16;                 // pieces loaded at once

// Hopper's programmatic dependent launch: the merge grid is launched while the split pass still
// runs (see launch) and waits here until that pass has finished and its writes are visible.
__device__ inline void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the merge grid launch once every block of the split pass has started (or finished).
__device__ inline void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Packed row r of (sequence b, KV head kvh), of a sequence of len keys, by a group of D/4 lanes
// (lane threadIdx.x % (D/4)); a group past the last row (r ≥ R) stores nothing. The pieces'
// outputs are read through L2 (ld.global.cg): the grid before wrote them on other SMs.
template <class T, int D>
__device__ __forceinline__ void merge_row(const float* __restrict__ opart, const float* __restrict__ lpart, int64_t len,
                                          T* __restrict__ o, float* __restrict__ lse, const Params p, int b, int kvh,
                                          int r) {
  if (r >= p.rows) return;
  const int c = 4 * (int(threadIdx.x) % (D / 4));
  const int pieces = p.pieces(len);
  const int64_t row0 = p.part_row0(b, kvh, 0) + r;  // piece i's row of this packed row: row0 + i·R

  float m = -INFINITY, l = 0.f;  // the running maximum of the lse_p and the sum of exp(lse_p − m)
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i0 = 0; i0 < pieces; i0 += kMergeChunk) {
    float ls[kMergeChunk];
    float4 x[kMergeChunk];
#pragma unroll
    for (int j = 0; j < kMergeChunk; ++j) {
      const bool in = i0 + j < pieces;
      const int64_t row = row0 + int64_t(i0 + j) * p.rows;
      ls[j] = in ? __ldcg(lpart + row) : -INFINITY;
      x[j] = in ? __ldcg(reinterpret_cast<const float4*>(opart + row * D + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float mx = m;
#pragma unroll
    for (int j = 0; j < kMergeChunk; ++j) mx = fmaxf(mx, ls[j]);
    const float keep = m == -INFINITY ? 0.f : expf(m - mx);  // what the chunks before weigh now
    l *= keep, acc.x *= keep, acc.y *= keep, acc.z *= keep, acc.w *= keep;
#pragma unroll
    for (int j = 0; j < kMergeChunk; ++j) {
      const float w = ls[j] == -INFINITY ? 0.f : expf(ls[j] - mx);
      l += w;
      acc.x += w * x[j].x, acc.y += w * x[j].y, acc.z += w * x[j].z, acc.w += w * x[j].w;
    }
    m = mx;
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  const int64_t q = p.q_row0(b, kvh) + r;
  uint32_t* out = reinterpret_cast<uint32_t*>(o + q * D + c);
  out[0] = fl::mma::pack<T>(acc.x * inv, acc.y * inv);
  out[1] = fl::mma::pack<T>(acc.z * inv, acc.w * inv);
  if (c == 0) lse[q] = l > 0.f ? m + logf(l) : -INFINITY;
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
merge_kernel(const float* __restrict__ opart, const float* __restrict__ lpart, const int32_t* __restrict__ kv_len,
             T* __restrict__ o, float* __restrict__ lse, Params p) {
  wait_for_prior_grid();
  const int r = int(blockIdx.x) * kMergeRows<D> + int(threadIdx.x) / (D / 4);
  merge_row<T, D>(opart, lpart, kv_len[blockIdx.z], o, lse, p, int(blockIdx.z), int(blockIdx.y), r);
}

// ---- the launch --------------------------------------------------------------------------------

// Whether the current device can launch a grid before the one it depends on has finished (sm_90 on).
inline bool has_dependent_launch() {
  int device = 0, major = 0;
  FL_CUDA_CHECK(cudaGetDevice(&device));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

template <class T, int D>
using SplitKernel = void (*)(const T*, const T*, const T*, const int32_t*, const int32_t*, T*, float*, float*,
                             float*, Params);

// The split pass with `smem` bytes of dynamic shared memory, then (splits > 1) the merge, both on
// a.stream. The workspace holds the pieces' outputs, then their log-sum-exps.
template <class T, int D>
void launch(SplitKernel<T, D> kernel, std::size_t smem, const DecodeShape& s, const DecodeArgs& a) {
  const Params p(s, a.splits);
  const cudaStream_t stream = as_stream(a.stream);
  float* opart = static_cast<float*>(a.workspace);
  float* lpart = opart ? opart + s.batch * s.kv_heads * a.splits * s.rows() * D : nullptr;
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(a.splits), unsigned(s.kv_heads * p.row_tiles), unsigned(s.batch));
  kernel<<<grid, kThreads, smem, stream>>>(static_cast<const T*>(a.q), static_cast<const T*>(a.k),
                                           static_cast<const T*>(a.v), a.page_table, a.kv_len, static_cast<T*>(a.o),
                                           a.lse, opart, lpart, p);
  FL_CUDA_CHECK_LAUNCH();
  if (a.splits > 1) {
    // The merge, launched with programmatic stream serialization where the GPU has it (sm_90 on):
    // its launch and its blocks' start overlap the split pass's last blocks, and merge_kernel's
    // first instruction waits for the pass to be done. A short call (one sequence, a few thousand
    // keys) is a few microseconds of work, and a second launch's latency would be a large share.
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned((s.rows() + kMergeRows<D> - 1) / kMergeRows<D>), unsigned(s.kv_heads), unsigned(s.batch));
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    cudaLaunchAttribute overlap[1] = {};
    overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap[0].val.programmaticStreamSerializationAllowed = 1;
    if (has_dependent_launch()) config.attrs = overlap, config.numAttrs = 1;
    FL_CUDA_CHECK(cudaLaunchKernelEx(&config, merge_kernel<T, D>, static_cast<const float*>(opart),
                                     static_cast<const float*>(lpart), a.kv_len, static_cast<T*>(a.o), a.lse, p));
  }
}

// Whether a block of the current device may have `bytes` of dynamic shared memory.
inline bool fits(std::size_t bytes) {
  int device = 0, most = 0;
  FL_CUDA_CHECK(cudaGetDevice(&device));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes <= std::size_t(most);
}

// Adds a version to the registry at program start; Launch::run<T, D>(shape, args) launches it.
template <class Launch>
struct Register {
  Register(const char* name, const char* idea, bool paged) {
    register_kernel(Kernel{name, idea, paged, [](const DecodeShape& s, DType t, const DecodeArgs& a) {
                             dispatch_16bit<Launch, 64, 128>("rung 10_decoding: ", t, s.head_dim, s, a);
                           }});
  }
};

}  // namespace fl::decoding
