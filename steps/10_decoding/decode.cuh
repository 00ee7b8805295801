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
  __device__ int64_t piece_keys(int64_t len) const {
    const int64_t per = (len + splits - 1) / splits;
    return max(granule, (per + granule - 1) / granule * granule);
  }
  // The first of the Nq·G packed rows of (sequence b, KV head kvh) among Q's [B·H·Nq] rows.
  __device__ int64_t q_row0(int b, int kvh) const { return (int64_t(b) * heads + int64_t(kvh) * group) * seq_q; }
  // Where piece `piece` of (b, kvh) keeps its rows in the workspace: row (…)·R + r, D floats each.
  __device__ int64_t part_row0(int b, int kvh, int piece) const {
    return ((int64_t(b) * kv_heads + kvh) * splits + piece) * rows;
  }
};

// ---- the merge: one block per (row tile, KV head, sequence) -----------------------------------
//
// Piece p of a row left O_p (already divided by its own sum) and lse_p. As rung 02's row states
// {m = lse_p, ℓ = 1} they merge into m = max_p lse_p and ℓ = Σ_p exp(lse_p − m); then
// lse = m + log ℓ and O = Σ_p exp(lse_p − m)·O_p / ℓ. A row no piece saw a key of keeps m = −∞:
// O = 0, lse = −∞.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
merge_kernel(const float* __restrict__ opart, const float* __restrict__ lpart, const int32_t* __restrict__ kv_len,
             T* __restrict__ o, float* __restrict__ lse, Params p) {
  __shared__ float weight[kMaxSplits][kTileRows];  // exp(lse_p − m) of each piece and row
  __shared__ float inv_l[kTileRows];
  const int rt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t len = kv_len[b];
  const int pieces = len > 0 ? int((len + p.piece_keys(len) - 1) / p.piece_keys(len)) : 0;
  const int64_t part0 = p.part_row0(b, kvh, 0), q0 = p.q_row0(b, kvh);
  if (threadIdx.x < kTileRows) {
    const int r = rt * kTileRows + int(threadIdx.x);
    if (r < p.rows) {
      float m = -INFINITY;
      for (int i = 0; i < pieces; ++i) m = fmaxf(m, lpart[part0 + int64_t(i) * p.rows + r]);
      float l = 0.f;
      for (int i = 0; i < pieces; ++i) {
        const float w = m == -INFINITY ? 0.f : expf(lpart[part0 + int64_t(i) * p.rows + r] - m);
        weight[i][threadIdx.x] = w;
        l += w;
      }
      inv_l[threadIdx.x] = l > 0.f ? 1.f / l : 0.f;
      lse[q0 + r] = l > 0.f ? m + logf(l) : -INFINITY;
    }
  }
  __syncthreads();
  // Then every element of the tile's rows: consecutive threads, consecutive columns.
  for (int e = int(threadIdx.x); e < kTileRows * D; e += kThreads) {
    const int rr = e / D, c = e % D, r = rt * kTileRows + rr;
    if (r >= p.rows) break;
    float acc = 0.f;
    for (int i = 0; i < pieces; ++i) acc += weight[i][rr] * opart[(part0 + int64_t(i) * p.rows + r) * D + c];
    o[(q0 + r) * D + c] = T(acc * inv_l[rr]);
  }
}

// ---- the launch --------------------------------------------------------------------------------

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
    merge_kernel<T, D><<<dim3(unsigned(p.row_tiles), unsigned(s.kv_heads), unsigned(s.batch)), kThreads, 0, stream>>>(
        opart, lpart, a.kv_len, static_cast<T*>(a.o), a.lse, p);
    FL_CUDA_CHECK_LAUNCH();
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
