// Rung 04, GPU: FlashAttention-1's loop order in one fused kernel, one thread block per
// (batch, head) as in the original.
//
// What changed from rung 03: S and P no longer exist in device memory. A K/V block stays in shared
// memory while every Q block passes by; each (i, j) step makes S_ij and P̃_ij on chip, folds them
// into the row statistics with rung 02's merge() and rescales O_i. The cost is visible in the
// kernel: O_i, ℓ_i, m_i are read from and written to device memory on every step, and with one
// block per (batch, head) a 16-head problem keeps 16 of the GPU's 132 multiprocessors busy.
#include <cuda_runtime.h>

#include <cmath>

#include "block_reduce.cuh"
#include "cuda_check.cuh"
#include "fa1_loop_order.hpp"

namespace fl::fa1 {
namespace {

constexpr int kThreads = 256;  // 16×16; thread (ty, tx) owns rows ty + 16a and columns tx + 16b
constexpr int kSide = 16;

template <int D>
constexpr Blocks kBlocks = blocks_for(kKernelM, D);

// Shared memory for one K/V block and one Q block. +1 on rows read across lanes keeps them in
// different banks.
template <int D>
constexpr std::size_t smem_floats() {
  constexpr Blocks b = kBlocks<D>;
  return b.bc * (D + 1)      // K_j
         + b.bc * D          // V_j
         + b.br * (D + 1)    // Q_i
         + b.br * (b.bc + 1);  // P̃_ij
}

template <int D>
__global__ void __launch_bounds__(kThreads)
fa1_kernel(const float* __restrict__ q,  // [B, H, Nq, d]
           const float* __restrict__ k,  // [B, Hkv, Nk, d]
           const float* __restrict__ v,  // [B, Hkv, Nk, d]
           float* __restrict__ o,        // [B, H, Nq, d]  also the running O_i between steps
           float* __restrict__ lse,      // [B, H, Nq]
           float* __restrict__ ws,       // [2, B, H, Nq]  running ℓ, then running m
           int heads, int group, int64_t nq, int64_t nk, float scale, bool causal) {
  constexpr int BR = kBlocks<D>.br, BC = kBlocks<D>.bc;
  constexpr int TM = BR / kSide, TN = BC / kSide, TD = D / kSide;  // per-thread rows, keys, columns
  static_assert(BR % kSide == 0 && BC % kSide == 0 && D % kSide == 0, "blocks must tile 16x16 threads");
  extern __shared__ float smem[];
  float* Ks = smem;                    // [BC][D+1]
  float* Vs = Ks + BC * (D + 1);       // [BC][D]
  float* Qs = Vs + BC * D;             // [BR][D+1]
  float* Ps = Qs + BR * (D + 1);       // [BR][BC+1]

  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide, tid = threadIdx.x;
  const int64_t bh = blockIdx.y * int64_t(heads) + blockIdx.x;
  const int64_t kv = blockIdx.y * int64_t(heads / group) + blockIdx.x / group;
  const float* qh = q + bh * nq * D;
  const float* kh = k + kv * nk * D;
  const float* vh = v + kv * nk * D;
  float* oh = o + bh * nq * D;
  float* lh = ws + bh * nq;                          // ℓ of this head
  float* mh = ws + int64_t(gridDim.x) * gridDim.y * nq + bh * nq;  // m of this head

  // Line 2 of Algorithm 1: O = 0, ℓ = 0, m = −∞ in device memory.
  for (int64_t e = tid; e < nq * D; e += kThreads) oh[e] = 0.f;
  for (int64_t r = tid; r < nq; r += kThreads) lh[r] = 0.f, mh[r] = -INFINITY;
  __syncthreads();

  for (int64_t j0 = 0; j0 < nk; j0 += BC) {  // outer loop: K/V blocks
    for (int e = tid; e < BC * D; e += kThreads) {
      const int r = e / D, c = e % D;
      const bool in = j0 + r < nk;  // zero rows past Nk: no NaN can leak in through 0·garbage
      Ks[r * (D + 1) + c] = in ? kh[(j0 + r) * D + c] : 0.f;
      Vs[r * D + c] = in ? vh[(j0 + r) * D + c] : 0.f;
    }
    for (int64_t i0 = 0; i0 < nq; i0 += BR) {  // inner loop: Q blocks
      const int64_t last_row = min(i0 + BR, nq) - 1;
      if (causal && last_row + (nk - nq) < j0) continue;  // block entirely above the diagonal
      for (int e = tid; e < BR * D; e += kThreads) {
        const int r = e / D, c = e % D;
        Qs[r * (D + 1) + c] = i0 + r < nq ? qh[(i0 + r) * D + c] : 0.f;
      }
      // The running statistics of this thread's rows, read before anyone rewrites them.
      online_softmax::RowState old[TM];
#pragma unroll
      for (int a = 0; a < TM; ++a) {
        const int64_t row = i0 + ty + kSide * a;
        if (row < nq) old[a] = {mh[row], lh[row]};
      }
      __syncthreads();

      // S_ij = scale · Q_i K_jᵀ, this thread's TM×TN entries; masked and out-of-range keys −∞.
      float s[TM][TN] = {};
      for (int c = 0; c < D; ++c) {
        float qa[TM], kb[TN];
#pragma unroll
        for (int a = 0; a < TM; ++a) qa[a] = Qs[(ty + kSide * a) * (D + 1) + c];
#pragma unroll
        for (int b = 0; b < TN; ++b) kb[b] = Ks[(tx + kSide * b) * (D + 1) + c];
#pragma unroll
        for (int a = 0; a < TM; ++a)
#pragma unroll
          for (int b = 0; b < TN; ++b) s[a][b] += qa[a] * kb[b];
      }
      // m̃ = rowmax(S), P̃ = exp(S − m̃), ℓ̃ = rowsum(P̃): the block's own softmax statistics.
      online_softmax::RowState blk[TM];
#pragma unroll
      for (int a = 0; a < TM; ++a) {
        const int64_t row = i0 + ty + kSide * a;
        float mx = -INFINITY;
#pragma unroll
        for (int b = 0; b < TN; ++b) {
          const int64_t col = j0 + tx + kSide * b;
          s[a][b] = (col >= nk || (causal && col > row + (nk - nq))) ? -INFINITY : s[a][b] * scale;
          mx = fmaxf(mx, s[a][b]);
        }
        mx = group_reduce<kSide>(mx, MaxOp{});
        float sum = 0.f;
#pragma unroll
        for (int b = 0; b < TN; ++b) {
          const float p = mx == -INFINITY ? 0.f : expf(s[a][b] - mx);
          Ps[(ty + kSide * a) * (BC + 1) + tx + kSide * b] = p;
          sum += p;
        }
        blk[a] = {mx, group_reduce<kSide>(sum, SumOp{})};
      }
      __syncthreads();

      // O_i ← diag(ℓ_new)⁻¹ (diag(ℓ_i)·e^{m_i − m_new}·O_i + e^{m̃ − m_new}·P̃_ij·V_j), in place in
      // device memory: this thread always owns the same (row, column) entries, so no other thread
      // touches them between steps.
#pragma unroll
      for (int a = 0; a < TM; ++a) {
        const int64_t row = i0 + ty + kSide * a;
        if (row >= nq) continue;
        const online_softmax::RowState now = online_softmax::merge(old[a], blk[a]);
        const float alpha = old[a].m == -INFINITY ? 0.f : expf(old[a].m - now.m);
        const float beta = blk[a].m == -INFINITY ? 0.f : expf(blk[a].m - now.m);
        const float* p = Ps + (ty + kSide * a) * (BC + 1);
#pragma unroll
        for (int e = 0; e < TD; ++e) {
          const int col = tx + kSide * e;
          float pv = 0.f;
          for (int j = 0; j < BC; ++j) pv += p[j] * Vs[j * D + col];
          const float prev = oh[row * D + col];
          oh[row * D + col] = now.l > 0.f ? (old[a].l * alpha * prev + beta * pv) / now.l : 0.f;
        }
        if (tx == 0) lh[row] = now.l, mh[row] = now.m;
      }
      __syncthreads();  // Q_i and P̃ are overwritten by the next inner step
    }
    __syncthreads();  // K_j, V_j are overwritten by the next outer step
  }

  // lse = m + log ℓ, −∞ for a row that saw no key.
  for (int64_t r = tid; r < nq; r += kThreads) {
    const float l = lh[r];
    lse[bh * nq + r] = l > 0.f ? mh[r] + logf(l) : -INFINITY;
  }
}

template <int D>
void launch(const AttentionShape& s, const ForwardArgs& a) {
  constexpr std::size_t bytes = smem_floats<D>() * sizeof(float);
  // Above 48 KiB a kernel must opt in to more shared memory; every Ampere/Hopper GPU allows this.
  FL_CUDA_CHECK(cudaFuncSetAttribute(fa1_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  fa1_kernel<D><<<dim3(unsigned(s.heads), unsigned(s.batch)), kThreads, bytes, as_stream(a.stream)>>>(
      static_cast<const float*>(a.q), static_cast<const float*>(a.k), static_cast<const float*>(a.v),
      static_cast<float*>(a.o), a.lse, static_cast<float*>(a.workspace), int(s.heads), int(s.group()),
      s.seq_q, s.seq_k, s.softmax_scale(), s.causal);
  FL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gpu_forward(const AttentionShape& s, const ForwardArgs& a) {
  if (s.batch > 65535) throw InputError("rung 04_fa1_loop_order: batch above 65535 (grid y)");
  switch (s.head_dim) {
    case 32: return launch<32>(s, a);
    case 64: return launch<64>(s, a);
    case 128: return launch<128>(s, a);
    default: throw InputError("rung 04_fa1_loop_order (cuda): head_dim " + std::to_string(s.head_dim) +
                              " has no kernel; supported: 32, 64, 128");
  }
}

static const Register<Fa1<Backend::Cuda>> registered;

}  // namespace fl::fa1
