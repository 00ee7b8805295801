// LAB fa2_kernel_loop (docs/labs.md), needs a GPU: fill in the TODO(lab) lines, then rebuild and
// grade in the build with the GPU rungs: cmake --build build --target lab_fa2_kernel_loop && ctest --test-dir build -L lab_fa2_kernel_loop --output-on-failure
// Rung 05, GPU: FlashAttention-2's loop order, fp32 on CUDA cores.
//
// What changed from rung 04: the loops are swapped. A thread block owns one B_r-row block of Q
// for its whole life, so the running O_i, m_i and ℓ_i sit in registers instead of making a round
// trip through device memory on every step; O_i is divided by ℓ_i once, at the end; and the grid
// is (Q block, head, batch), which gives a 4096-token, 16-head problem 1024 thread blocks where
// rung 04 had 16.
//
// Work split: 256 threads as 16×16; thread (ty, tx) owns rows 4·ty … 4·ty+3 of S_ij and of O_i,
// keys 4·tx … 4·tx+3 of S_ij and columns 64·e + 4·tx … +3 of O_i. Each inner step is two small
// matrix products from shared memory into registers (16 FFMA per pair of 16-byte loads), with the
// row statistics reduced across the 16 lanes of a row by warp shuffles.
#include <cuda_runtime.h>

#include <cmath>

#include "block_reduce.cuh"
#include "cuda_check.cuh"
#include "fa2_loop_order.hpp"

namespace fl::fa2 {
namespace {

constexpr int kThreads = 256, kSide = 16, kR = 4;  // 16×16 threads, 4×4 entries of S each
constexpr int BR = int(kBr), BC = int(kBc);
static_assert(BR == kSide * kR && BC == kSide * kR, "a 64×64 tile is 16×16 threads of 4×4");
constexpr int kPad = 4;  // keeps rows 16-byte aligned and off each other's banks
constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x·log2 e): exp2 is one MUFU op

// Shared memory: Q_i [BR][D+4], K_jᵀ [D][BC+4] (P̃_ij reuses it once S is made), V_j [BC][D+4].
template <int D>
constexpr std::size_t smem_floats() {
  static_assert(BR * (BC + kPad) <= D * (BC + kPad), "P must fit where K^T was");
  return BR * (D + kPad) + D * (BC + kPad) + BC * (D + kPad);
}

__device__ float component(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <int D>
__global__ void __launch_bounds__(kThreads)
fa2_kernel(const float* __restrict__ q,  // [B, H, Nq, d]
           const float* __restrict__ k,  // [B, Hkv, Nk, d]
           const float* __restrict__ v,  // [B, Hkv, Nk, d]
           float* __restrict__ o,        // [B, H, Nq, d]
           float* __restrict__ lse,      // [B, H, Nq]
           int group, int64_t nq, int64_t nk, float scale_log2, bool causal) {
  constexpr int TE = D / 64;  // float4 column groups of O per thread
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;                         // [BR][D + kPad]
  float* Kt = Qs + BR * (D + kPad);         // [D][BC + kPad]   K_jᵀ
  float* Ps = Kt;                           // [BR][BC + kPad]  P̃_ij, once S_ij is in registers
  float* Vs = Kt + D * (BC + kPad);         // [BC][D + kPad]

  const int tid = threadIdx.x, tx = tid % kSide, ty = tid / kSide;
  const int64_t i0 = int64_t(blockIdx.x) * BR;
  const int64_t bh = int64_t(blockIdx.z) * gridDim.y + blockIdx.y;
  const int64_t kv = int64_t(blockIdx.z) * (gridDim.y / group) + blockIdx.y / group;
  const float* qh = q + bh * nq * D;
  const float* kh = k + kv * nk * D;
  const float* vh = v + kv * nk * D;

  // Q_i, once for the block's whole life: coalesced 16-byte loads, zeros past Nq.
  for (int e = tid; e < BR * D / 4; e += kThreads) {
    const int r = e / (D / 4), c = 4 * (e % (D / 4));
    const float4 x = i0 + r < nq ? *reinterpret_cast<const float4*>(qh + (i0 + r) * D + c) : float4{};
    *reinterpret_cast<float4*>(Qs + r * (D + kPad) + c) = x;
  }

  float acc[kR][4 * TE] = {};                        // O_i before the division by ℓ
  float m[kR], l[kR];                                 // running max (log2 units) and sum
#pragma unroll
  for (int r = 0; r < kR; ++r) m[r] = -INFINITY, l[r] = 0.f;

  // Keys this block can see: causal blocks wholly above the diagonal are never loaded.
  const int64_t last_row = min(i0 + BR, nq) - 1;
  const int64_t key_end = causal ? min(nk, last_row + (nk - nq) + 1) : nk;  // ≤ 0: sees nothing

  for (int64_t j0 = 0; j0 < key_end; j0 += BC) {
    __syncthreads();  // the previous step is done with K_jᵀ/P̃ and V_j
    // K_j, transposed on the way in. Lane ↔ key row, so the transposed stores of a warp land in
    // 32 consecutive words (no bank conflicts); V_j plain, coalesced like Q.
    for (int e = tid; e < BC * D / 4; e += kThreads) {
      const int r = e % BC, c = 4 * (e / BC);
      const float4 x = j0 + r < nk ? *reinterpret_cast<const float4*>(kh + (j0 + r) * D + c) : float4{};
      Kt[(c + 0) * (BC + kPad) + r] = x.x;
      Kt[(c + 1) * (BC + kPad) + r] = x.y;
      Kt[(c + 2) * (BC + kPad) + r] = x.z;
      Kt[(c + 3) * (BC + kPad) + r] = x.w;
    }
    for (int e = tid; e < BC * D / 4; e += kThreads) {
      const int r = e / (D / 4), c = 4 * (e % (D / 4));
      const float4 x = j0 + r < nk ? *reinterpret_cast<const float4*>(vh + (j0 + r) * D + c) : float4{};
      *reinterpret_cast<float4*>(Vs + r * (D + kPad) + c) = x;
    }
    __syncthreads();

    // S_ij = Q_i K_jᵀ, this thread's 4×4.
    float s[kR][4] = {};
#pragma unroll 4
    for (int c = 0; c < D; c += 4) {
      float4 qa[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) qa[r] = *reinterpret_cast<const float4*>(Qs + (kR * ty + r) * (D + kPad) + c);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const float4 kb = *reinterpret_cast<const float4*>(Kt + (c + cc) * (BC + kPad) + kR * tx);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const float a = component(qa[r], cc);
          s[r][0] += a * kb.x, s[r][1] += a * kb.y, s[r][2] += a * kb.z, s[r][3] += a * kb.w;
        }
      }
    }

    // Online softmax in log2 units: x = S·scale·log2 e. Mask out-of-range and causal keys.
    float p[kR][4];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int64_t row = i0 + kR * ty + r;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t col = j0 + kR * tx + c;
        const bool hidden = col >= nk || (causal && col > row + (nk - nq));
        s[r][c] = hidden ? -INFINITY : s[r][c] * scale_log2;
        mx = fmaxf(mx, s[r][c]);
      }
      // TODO(lab): the online-softmax step of row r, in log2 units (s is already S·scale·log2 e).
      // mx is this thread's max over its 4 keys; the row's 64 keys are spread over the 16 lanes
      // tx = 0..15 of the row, so every lane must take part in each group_reduce<kSide>:
      //   m_new = fmaxf(m[r], group_reduce<kSide>(mx, MaxOp{}))          the row's new max;
      //   ref   = m_new, or 0.f when m_new is −INFINITY (no key seen yet: avoids −∞ − −∞ = NaN);
      //   alpha = exp2f(m[r] − ref)                                      rescales the old sums;
      //   p[r][c] = exp2f(s[r][c] − ref) for c = 0..3, and sum = their sum;
      //   l[r] = alpha · l[r] + group_reduce<kSide>(sum, SumOp{});  m[r] = m_new;
      //   acc[r][c] *= alpha for c = 0 .. 4·TE − 1 (O_i so far, under the old max).
      (void)mx;
#pragma unroll
      for (int c = 0; c < 4; ++c) p[r][c] = 0.f;  // wrong on purpose: P̃ = 0, so O stays 0
    }
    __syncthreads();  // everyone has read K_jᵀ: P̃ may overwrite it
#pragma unroll
    for (int r = 0; r < kR; ++r)
      *reinterpret_cast<float4*>(Ps + (kR * ty + r) * (BC + kPad) + kR * tx) = {p[r][0], p[r][1], p[r][2], p[r][3]};
    __syncthreads();

    // O_i += P̃_ij V_j.
#pragma unroll 4
    for (int j = 0; j < BC; j += 4) {
      float4 pa[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) pa[r] = *reinterpret_cast<const float4*>(Ps + (kR * ty + r) * (BC + kPad) + j);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int e = 0; e < TE; ++e) {
          const float4 vb = *reinterpret_cast<const float4*>(Vs + (j + jj) * (D + kPad) + 64 * e + kR * tx);
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            const float a = component(pa[r], jj);
            acc[r][4 * e + 0] += a * vb.x, acc[r][4 * e + 1] += a * vb.y;
            acc[r][4 * e + 2] += a * vb.z, acc[r][4 * e + 3] += a * vb.w;
          }
        }
    }
  }

  // The deferred normalisation: one division per row, at the end. lse = ln ℓ + m·ln 2.
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int64_t row = i0 + kR * ty + r;
    if (row >= nq) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;  // a row that saw no key: O = 0
    float* out = o + (bh * nq + row) * D;
#pragma unroll
    for (int e = 0; e < TE; ++e)
      *reinterpret_cast<float4*>(out + 64 * e + kR * tx) = {acc[r][4 * e] * inv, acc[r][4 * e + 1] * inv,
                                                           acc[r][4 * e + 2] * inv, acc[r][4 * e + 3] * inv};
    if (tx == 0) lse[bh * nq + row] = l[r] > 0.f ? m[r] / kLog2e + logf(l[r]) : -INFINITY;
  }
}

template <int D>
void launch(const AttentionShape& s, const ForwardArgs& a) {
  constexpr std::size_t bytes = smem_floats<D>() * sizeof(float);
  FL_CUDA_CHECK(cudaFuncSetAttribute(fa2_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  const dim3 grid(unsigned(ceil_div<int64_t>(s.seq_q, kBr)), unsigned(s.heads), unsigned(s.batch));
  fa2_kernel<D><<<grid, kThreads, bytes, as_stream(a.stream)>>>(
      static_cast<const float*>(a.q), static_cast<const float*>(a.k), static_cast<const float*>(a.v),
      static_cast<float*>(a.o), a.lse, int(s.group()), s.seq_q, s.seq_k, s.softmax_scale() * kLog2e, s.causal);
  FL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gpu_forward(const AttentionShape& s, const ForwardArgs& a) {
  if (s.heads > 65535 || s.batch > 65535)
    throw InputError("rung 05_fa2_loop_order (cuda): heads and batch must each be at most 65535 (grid y, z)");
  if (!is_aligned(a.q, 16) || !is_aligned(a.k, 16) || !is_aligned(a.v, 16) || !is_aligned(a.o, 16))
    throw InputError("rung 05_fa2_loop_order (cuda): q, k, v and o must be 16-byte aligned (the kernel "
                     "moves them in float4s); cudaMalloc and PyTorch allocations are");
  switch (s.head_dim) {
    case 64: return launch<64>(s, a);
    case 128: return launch<128>(s, a);
    default: throw InputError("rung 05_fa2_loop_order (cuda): head_dim " + std::to_string(s.head_dim) +
                              " has no kernel; supported: 64, 128");
  }
}

static const Register<Fa2<Backend::Cuda>> registered;

}  // namespace fl::fa2
