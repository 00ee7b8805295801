// Passes 1 and 3 of standard attention on the GPU: the plainest possible kernels, one thread per
// output element reading its operands straight from device memory. Rung 03 replaces them with
// shared-memory tiles; here they are deliberately simple so the softmax is what a student reads.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda_check.cuh"
#include "standard_attention.hpp"

namespace fl::standard {
namespace {

constexpr int kTile = 16;  // 16×16 threads per block for S, one S element each

// Pass 1. S[bh, i, j] = scale · Σ_c Q[bh, i, c]·K[bkv, j, c], or −∞ where the causal mask hides j.
__global__ void scores_kernel(const float* __restrict__ q,  // [B, H, Nq, d]
                              const float* __restrict__ k,  // [B, Hkv, Nk, d]
                              float* __restrict__ S,        // [B, H, Nq, Nk]
                              int heads, int group, int64_t nq, int64_t nk, int d, float scale,
                              bool causal) {
  const int64_t j = blockIdx.x * int64_t(kTile) + threadIdx.x;
  const int64_t i = blockIdx.y * int64_t(kTile) + threadIdx.y;
  const int64_t bh = blockIdx.z;  // b·H + h
  if (i >= nq || j >= nk) return;
  const int64_t bkv = (bh / heads) * (heads / group) + (bh % heads) / group;
  float* out = S + (bh * nq + i) * nk + j;
  if (causal && j > i + (nk - nq)) {
    *out = -INFINITY;
    return;
  }
  const float* qi = q + (bh * nq + i) * d;
  const float* kj = k + (bkv * nk + j) * d;
  float acc = 0.f;
  for (int c = 0; c < d; ++c) acc += qi[c] * kj[c];
  *out = acc * scale;
}

constexpr int kPvCols = 32, kPvRows = 8;  // a warp spans 32 columns of O: V reads coalesce

// Pass 3. O[bh, i, c] = Σ_j P[bh, i, j]·V[bkv, j, c].
__global__ void pv_kernel(const float* __restrict__ P,  // [B, H, Nq, Nk]
                          const float* __restrict__ v,  // [B, Hkv, Nk, d]
                          float* __restrict__ o,        // [B, H, Nq, d]
                          int heads, int group, int64_t nq, int64_t nk, int d) {
  const int c = blockIdx.x * kPvCols + threadIdx.x;
  const int64_t i = blockIdx.y * int64_t(kPvRows) + threadIdx.y;
  const int64_t bh = blockIdx.z;
  if (i >= nq || c >= d) return;
  const int64_t bkv = (bh / heads) * (heads / group) + (bh % heads) / group;
  const float* pi = P + (bh * nq + i) * nk;
  const float* vc = v + bkv * nk * d + c;
  float acc = 0.f;
  for (int64_t j = 0; j < nk; ++j) acc += pi[j] * vc[j * d];
  o[(bh * nq + i) * d + c] = acc;
}

}  // namespace

void gpu_forward(const AttentionShape& s, const ForwardArgs& a, GpuSoftmax softmax) {
  const cudaStream_t stream = as_stream(a.stream);
  float* S = static_cast<float*>(a.workspace);
  float* P = S + s.score_elems();
  const int64_t bh = s.batch * s.heads;
  if (bh > 65535) throw InputError("standard attention kernels: B*H must be at most 65535 (grid z)");

  const dim3 tile(kTile, kTile);
  const dim3 grid_s(unsigned(ceil_div<int64_t>(s.seq_k, kTile)), unsigned(ceil_div<int64_t>(s.seq_q, kTile)),
                    unsigned(bh));
  scores_kernel<<<grid_s, tile, 0, stream>>>(static_cast<const float*>(a.q),
                                             static_cast<const float*>(a.k), S, int(s.heads),
                                             int(s.group()), s.seq_q, s.seq_k, int(s.head_dim),
                                             s.softmax_scale(), s.causal);
  FL_CUDA_CHECK_LAUNCH();

  softmax(S, P, a.lse, bh * s.seq_q, s.seq_k, a.stream);

  const dim3 grid_o(unsigned(ceil_div<int64_t>(s.head_dim, kPvCols)),
                    unsigned(ceil_div<int64_t>(s.seq_q, kPvRows)), unsigned(bh));
  pv_kernel<<<grid_o, dim3(kPvCols, kPvRows), 0, stream>>>(P, static_cast<const float*>(a.v),
                                                          static_cast<float*>(a.o), int(s.heads),
                                                          int(s.group()), s.seq_q, s.seq_k,
                                                          int(s.head_dim));
  FL_CUDA_CHECK_LAUNCH();
}

}  // namespace fl::standard
