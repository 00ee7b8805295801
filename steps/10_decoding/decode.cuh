// What every rung-10 kernel file shares and none of them teaches: the call's sizes as the kernels
// see them, the cut of a sequence into pieces (the device copy of piece_keys), the merge kernel
// (rung 02's merge across thread blocks), and the launch of one version: its split pass, then the
// merge when there is more than one piece. A version file holds its split kernel and ends with
//     static const Register<Launch> registered{"10_decoding/vN_name", "idea", paged};
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
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

// Hopper's thread-block clusters (v3 on): blocks of one cluster run at once on neighbouring SMs
// and can read each other's shared memory. cluster_sync is a barrier of all the cluster's threads
// whose writes before it are visible to every block of the cluster after it; cluster_address maps
// an address of this block's shared memory to the same place in block `rank`'s, and ld_cluster
// reads there. Never called on a GPU before sm_90: launch_in_clusters launches nothing there.
__device__ inline void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}
__device__ inline uint32_t cluster_address(uint32_t smem, int rank) {
  uint32_t at = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(at) : "r"(smem), "r"(rank));
#endif
  return at;
}
__device__ inline float ld_cluster(uint32_t at) {
  float x = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(x) : "r"(at) : "memory");
#endif
  return x;
}
__device__ inline float4 ld_cluster4(uint32_t at) {
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
               : "r"(at)
               : "memory");
#endif
  return x;
}

// Folds the pieces 0 .. pieces−1 of one packed row and stores the row: O (4 columns a lane, from
// column c) at o_row, and its lse at *lse_row (lane c = 0). piece(i, lse_i, o_i) loads piece i's
// lse_p and this lane's 4 columns of its O_p row; where they come from is the caller's business
// (the workspace for merge_row, a cluster's shared memory from v3 on), the arithmetic is one.
template <class T, int D, class Piece>
__device__ __forceinline__ void fold_pieces(int pieces, Piece piece, int c, T* __restrict__ o_row,
                                            float* __restrict__ lse_row) {
  float m = -INFINITY, l = 0.f;  // the running maximum of the lse_p and the sum of exp(lse_p − m)
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i0 = 0; i0 < pieces; i0 += kMergeChunk) {
    float ls[kMergeChunk];
    float4 x[kMergeChunk];
#pragma unroll
    for (int j = 0; j < kMergeChunk; ++j) {
      ls[j] = -INFINITY, x[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i0 + j < pieces) piece(i0 + j, ls[j], x[j]);
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
  uint32_t* out = reinterpret_cast<uint32_t*>(o_row + c);
  out[0] = fl::mma::pack<T>(acc.x * inv, acc.y * inv);
  out[1] = fl::mma::pack<T>(acc.z * inv, acc.w * inv);
  if (c == 0) *lse_row = l > 0.f ? m + logf(l) : -INFINITY;
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
  const int64_t row0 = p.part_row0(b, kvh, 0) + r;  // piece i's row of this packed row: row0 + i·R
  const int64_t q = p.q_row0(b, kvh) + r;
  fold_pieces<T, D>(
      p.pieces(len),
      [&](int i, float& ls, float4& x) {
        const int64_t row = row0 + int64_t(i) * p.rows;
        ls = __ldcg(lpart + row);
        x = __ldcg(reinterpret_cast<const float4*>(opart + row * D + c));
      },
      c, o + q * D, lse + q);
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

// Whether the current device is sm_90 or later: it can launch a grid before the one it depends on
// has finished, and it has thread-block clusters.
inline bool is_sm90_or_later() {
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
    if (is_sm90_or_later()) config.attrs = overlap, config.numAttrs = 1;
    FL_CUDA_CHECK(cudaLaunchKernelEx(&config, merge_kernel<T, D>, static_cast<const float*>(opart),
                                     static_cast<const float*>(lpart), a.kv_len, static_cast<T*>(a.o), a.lse, p));
  }
}

// The largest cluster launch_in_clusters asks for: 16 blocks, the H100's most (beyond the 8 every
// sm_90 GPU guarantees, so it asks for non-portable sizes), and the most pieces fold_pieces takes
// in one chunk.
inline constexpr int kMaxClusterPieces = 16;

// The split pass (v3 on) as clusters of a.splits blocks along x: the pieces of one (sequence, KV
// head, row tile) in one cluster, which merges them in its shared memory (no workspace round trip,
// no merge grid). A cluster's blocks must all run on one GPC (a group of 16 to 18 SMs on an H100),
// and where an SM may hold two blocks the GPU may put two of a cluster on one SM while other SMs
// idle: a stream of bytes then runs at half speed on those SMs. So each block asks for more than
// half an SM's shared memory (one block an SM), and clusters are used only when every cluster of
// the call fits on the GPU at once. Returns false, having launched nothing, where that cannot
// run: one piece, more than kMaxClusterPieces, a GPU before sm_90, or more clusters than it holds
// at once; the caller then launches the split pass and the merge grid.
template <class T, int D>
bool launch_in_clusters(SplitKernel<T, D> kernel, std::size_t smem, const DecodeShape& s, const DecodeArgs& a) {
  if (a.splits < 2 || a.splits > kMaxClusterPieces || !is_sm90_or_later()) return false;
  const Params p(s, a.splits);
  int device = 0, per_sm = 0, per_block = 0;
  FL_CUDA_CHECK(cudaGetDevice(&device));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const std::size_t alone = std::max(smem, std::size_t(per_sm / 2));  // two such blocks do not fit an SM
  if (alone > std::size_t(per_block)) return false;
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(alone)));
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(a.splits), unsigned(s.kv_heads * p.row_tiles), unsigned(s.batch));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = alone;
  config.stream = as_stream(a.stream);
  cudaLaunchAttribute cluster[1] = {};
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = unsigned(a.splits);
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = 1;
  config.attrs = cluster, config.numAttrs = 1;
  int fit = 0;  // clusters of this size and shared memory that the GPU holds at once
  FL_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, kernel, &config));
  if (int64_t(fit) < int64_t(config.gridDim.y) * config.gridDim.z) return false;
  FL_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
                                   static_cast<const T*>(a.v), a.page_table, a.kv_len, static_cast<T*>(a.o), a.lse,
                                   static_cast<float*>(nullptr), static_cast<float*>(nullptr), p));
  return true;
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
