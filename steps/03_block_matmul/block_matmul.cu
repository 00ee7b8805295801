// Rung 03, GPU: shared-memory tiled Q·Kᵀ and P·V (rung 02's softmax between), and the fused
// tiled attention without softmax.
//
// What changed from rungs 00–02: there, each thread read a whole row of Q and of K from device
// memory for one element of S, so every operand was fetched T times by neighbouring threads. Here
// a T×T block of threads loads a T×T piece of each operand into shared memory once, and each
// thread then reads it T times from there. Device-memory reads drop by a factor of T.
#include <cuda_runtime.h>

#include <cmath>

#include "block_matmul.hpp"
#include "cuda_check.cuh"

namespace fl::block_matmul {
namespace {

constexpr int T = kTile;  // a T×T block of threads computes a T×T tile; one element per thread

// The key/value head that query head bh = b·H + h reads (grouped-query attention).
__device__ int64_t kv_head(int64_t bh, int heads, int group) {
  return (bh / heads) * (heads / group) + (bh % heads) / group;
}

// Pass 1, one T×T tile of S per block: S_ij = scale · Q_i·K_jᵀ, masked entries −∞.
__global__ void scores_tiled_kernel(const float* __restrict__ q,  // [B, H, Nq, d]
                                    const float* __restrict__ k,  // [B, Hkv, Nk, d]
                                    float* __restrict__ S,        // [B, H, Nq, Nk]
                                    int heads, int group, int64_t nq, int64_t nk, int d,
                                    float scale, bool causal) {
  // +1 column: thread tx reads row tx of Ks, so rows must fall in different banks.
  __shared__ float Qs[T][T + 1], Ks[T][T + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i0 = blockIdx.y * int64_t(T), j0 = blockIdx.x * int64_t(T), bh = blockIdx.z;
  const float* qh = q + bh * nq * d;
  const float* kh = k + kv_head(bh, heads, group) * nk * d;
  float acc = 0.f;
  for (int c0 = 0; c0 < d; c0 += T) {
    // Coalesced: consecutive tx read consecutive columns of one row. Zeros pad the ragged edges.
    Qs[ty][tx] = (i0 + ty < nq && c0 + tx < d) ? qh[(i0 + ty) * d + c0 + tx] : 0.f;
    Ks[ty][tx] = (j0 + ty < nk && c0 + tx < d) ? kh[(j0 + ty) * d + c0 + tx] : 0.f;
    __syncthreads();
    for (int c = 0; c < T; ++c) acc += Qs[ty][c] * Ks[tx][c];
    __syncthreads();  // before the next piece overwrites Qs, Ks
  }
  const int64_t i = i0 + ty, j = j0 + tx;
  if (i < nq && j < nk) S[(bh * nq + i) * nk + j] = (causal && j > i + (nk - nq)) ? -INFINITY : acc * scale;
}

// Pass 3, one T×T tile of O per block: O_ic = Σ_j P_ij·V_jc over T-wide pieces of the keys.
__global__ void pv_tiled_kernel(const float* __restrict__ P,  // [B, H, Nq, Nk]
                                const float* __restrict__ v,  // [B, Hkv, Nk, d]
                                float* __restrict__ o,        // [B, H, Nq, d]
                                int heads, int group, int64_t nq, int64_t nk, int d) {
  __shared__ float Ps[T][T + 1], Vs[T][T + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i0 = blockIdx.y * int64_t(T), bh = blockIdx.z;
  const int c0 = blockIdx.x * T;
  const float* ph = P + bh * nq * nk;
  const float* vh = v + kv_head(bh, heads, group) * nk * d;
  float acc = 0.f;
  for (int64_t j0 = 0; j0 < nk; j0 += T) {
    Ps[ty][tx] = (i0 + ty < nq && j0 + tx < nk) ? ph[(i0 + ty) * nk + j0 + tx] : 0.f;
    Vs[ty][tx] = (j0 + ty < nk && c0 + tx < d) ? vh[(j0 + ty) * d + c0 + tx] : 0.f;
    __syncthreads();
    for (int j = 0; j < T; ++j) acc += Ps[ty][j] * Vs[j][tx];
    __syncthreads();
  }
  const int64_t i = i0 + ty;
  if (i < nq && c0 + tx < d) o[(bh * nq + i) * d + c0 + tx] = acc;
}

// O_i = Σ_j (Q_i·K_jᵀ·scale)·V_j, one T-row block of queries per thread block. S_ij is made in
// shared memory and consumed there: the fusion softmax will forbid until rung 04 mends it.
constexpr int kMaxD = kFusedMaxHeadDim;
__global__ void fused_no_softmax_kernel(const float* __restrict__ q,  // [B, H, Nq, d]
                                        const float* __restrict__ k,  // [B, Hkv, Nk, d]
                                        const float* __restrict__ v,  // [B, Hkv, Nk, d]
                                        float* __restrict__ o,        // [B, H, Nq, d]
                                        int heads, int group, int64_t nq, int64_t nk, int d,
                                        float scale) {
  __shared__ float Qs[T][kMaxD + 1], Ks[T][kMaxD + 1], Vs[T][kMaxD], Ss[T][T + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * T + tx;
  const int64_t i0 = blockIdx.x * int64_t(T), bh = blockIdx.y;
  const float* qh = q + bh * nq * d;
  const int64_t kv = kv_head(bh, heads, group);
  const float* kh = k + kv * nk * d;
  const float* vh = v + kv * nk * d;
  for (int e = tid; e < T * d; e += T * T) {
    const int r = e / d, c = e % d;
    Qs[r][c] = i0 + r < nq ? qh[(i0 + r) * d + c] : 0.f;
  }
  float acc[kMaxD / T] = {};  // this thread's O_i[ty][tx + T·c]: a fixed-size, unrolled array
  for (int64_t j0 = 0; j0 < nk; j0 += T) {
    for (int e = tid; e < T * d; e += T * T) {
      const int r = e / d, c = e % d;
      const bool in = j0 + r < nk;  // zero rows past Nk: their S is 0 and their V is 0
      Ks[r][c] = in ? kh[(j0 + r) * d + c] : 0.f;
      Vs[r][c] = in ? vh[(j0 + r) * d + c] : 0.f;
    }
    __syncthreads();
    float s = 0.f;
    for (int c = 0; c < d; ++c) s += Qs[ty][c] * Ks[tx][c];
    Ss[ty][tx] = s * scale;
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kMaxD / T; ++c)
      if (tx + T * c < d)
        for (int j = 0; j < T; ++j) acc[c] += Ss[ty][j] * Vs[j][tx + T * c];
    __syncthreads();
  }
  if (i0 + ty < nq) {
#pragma unroll
    for (int c = 0; c < kMaxD / T; ++c)
      if (tx + T * c < d) o[(bh * nq + i0 + ty) * d + tx + T * c] = acc[c];
  }
}

void check_grid(const AttentionShape& s) {
  if (s.batch * s.heads > 65535)
    throw InputError("rung 03_block_matmul: B*H = " + std::to_string(s.batch * s.heads) +
                     " exceeds 65535 (the grid's z dimension)");
}

}  // namespace

void gpu_forward(const AttentionShape& s, const ForwardArgs& a) {
  check_grid(s);
  const cudaStream_t stream = as_stream(a.stream);
  float* S = static_cast<float*>(a.workspace);
  float* P = S + s.score_elems();
  const unsigned bh = unsigned(s.batch * s.heads);
  const dim3 block(T, T);
  scores_tiled_kernel<<<dim3(unsigned(ceil_div<int64_t>(s.seq_k, T)), unsigned(ceil_div<int64_t>(s.seq_q, T)), bh),
                        block, 0, stream>>>(static_cast<const float*>(a.q), static_cast<const float*>(a.k),
                                            S, int(s.heads), int(s.group()), s.seq_q, s.seq_k,
                                            int(s.head_dim), s.softmax_scale(), s.causal);
  FL_CUDA_CHECK_LAUNCH();
  online_softmax::gpu_softmax(S, P, a.lse, s.batch * s.heads * s.seq_q, s.seq_k, a.stream);
  pv_tiled_kernel<<<dim3(unsigned(ceil_div<int64_t>(s.head_dim, T)), unsigned(ceil_div<int64_t>(s.seq_q, T)), bh),
                    block, 0, stream>>>(P, static_cast<const float*>(a.v), static_cast<float*>(a.o),
                                        int(s.heads), int(s.group()), s.seq_q, s.seq_k, int(s.head_dim));
  FL_CUDA_CHECK_LAUNCH();
}

void gpu_fused_no_softmax(const AttentionShape& s, const float* q, const float* k, const float* v,
                          float* o, void* stream) {
  s.validate();
  check_grid(s);
  if (s.head_dim > kMaxD)
    throw InputError("fused_no_softmax: head_dim " + std::to_string(s.head_dim) +
                     " is above the demo's limit of " + std::to_string(kMaxD));
  fused_no_softmax_kernel<<<dim3(unsigned(ceil_div<int64_t>(s.seq_q, T)), unsigned(s.batch * s.heads)),
                            dim3(T, T), 0, as_stream(stream)>>>(q, k, v, o, int(s.heads), int(s.group()),
                                                                 s.seq_q, s.seq_k, int(s.head_dim),
                                                                 s.softmax_scale());
  FL_CUDA_CHECK_LAUNCH();
}

static const Register<BlockMatmul<Backend::Cuda>> registered;
}  // namespace fl::block_matmul
