// Rung 07, GPU: the backward pass by recomputation, fp32 on CUDA cores, written to be read.
//
// Two kernels. `preprocess_kernel` computes D = rowsum(dO ∘ O), one warp per query row.
// `backward_kernel` runs one thread block per (K/V block j, key/value head, batch): K_j and V_j
// stay in shared memory and dK_j, dV_j in registers while every Q block of every query head of
// the group passes by; each step recomputes P from L, forms dS, adds to dK_j and dV_j, and adds its
// share of dQ_i to device memory with atomicAdd, since many thread blocks (one per K/V block)
// contribute to the same dQ_i. The tensor-core versions (v1_mma.cu ...) keep this structure.
#include <cuda_runtime.h>

#include <cmath>

#include "backward_recompute.hpp"
#include "cuda_check.cuh"

namespace fl::backward {
namespace {

constexpr int kSide = 16, kThreads = kSide * kSide;  // thread (ty, tx) owns rows ty + 16a, cols tx + 16b
constexpr int BR = int(kBr), BC = int(info(Version::Fp32).block_keys);
constexpr int kA = BR / kSide, kB = BC / kSide;        // 4 × 4 entries of each 64 × 64 tile per thread

// D_r = Σ_c dO_rc · O_rc, one warp per row.
__global__ void preprocess_kernel(const float* __restrict__ o,     // [B·H·Nq, d]
                                  const float* __restrict__ dout,  // [B·H·Nq, d]
                                  float* __restrict__ D,           // [B·H·Nq]
                                  int64_t rows, int d) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float acc = 0.f;
  for (int c = lane; c < d; c += 32) acc += o[row * d + c] * dout[row * d + c];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) D[row] = acc;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
backward_kernel(const float* __restrict__ q, const float* __restrict__ k,  // [B,H,Nq,d], [B,Hkv,Nk,d]
                const float* __restrict__ v, const float* __restrict__ dout,  // [B,Hkv,Nk,d], [B,H,Nq,d]
                const float* __restrict__ lse, const float* __restrict__ Dsum,  // [B,H,Nq] each
                float* __restrict__ dq,        // [B, H, Nq, d], fp32, zeroed, accumulated atomically
                float* __restrict__ dk,        // [B, Hkv, Nk, d]
                float* __restrict__ dv,        // [B, Hkv, Nk, d]
                int heads, int group, int64_t nq, int64_t nk, float scale, bool causal) {
  constexpr int LD = D + 1;  // +1: a warp reading one column of 16 rows hits 16 banks
  extern __shared__ float smem[];
  float* Ks = smem;              // [BC][LD]
  float* Vs = Ks + BC * LD;      // [BC][LD]
  float* Qs = Vs + BC * LD;      // [BR][LD]
  float* dOs = Qs + BR * LD;     // [BR][LD]
  float* Ps = dOs + BR * LD;     // [BR][BC+1]  P_ij, recomputed
  float* dSs = Ps + BR * (BC + 1);  // [BR][BC+1]  dS_ij
  float* Ls = dSs + BR * (BC + 1);  // [BR]
  float* Ds = Ls + BR;              // [BR]

  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide, tid = threadIdx.x;
  const int64_t j0 = int64_t(blockIdx.x) * BC;
  const int hk = blockIdx.y, b = blockIdx.z, kv_heads = heads / group;
  const int64_t kv_row0 = (int64_t(b) * kv_heads + hk) * nk;

  for (int e = tid; e < BC * D; e += kThreads) {
    const int r = e / D, c = e % D;
    const bool in = j0 + r < nk;
    Ks[r * LD + c] = in ? k[(kv_row0 + j0 + r) * D + c] : 0.f;
    Vs[r * LD + c] = in ? v[(kv_row0 + j0 + r) * D + c] : 0.f;
  }
  float dk_acc[kB][D / kSide] = {}, dv_acc[kB][D / kSide] = {};  // keys ty + 16a, columns tx + 16e

  for (int h = hk * group; h < (hk + 1) * group; ++h) {  // every query head of the group
    const int64_t q_row0 = (int64_t(b) * heads + h) * nq;
    for (int64_t i0 = 0; i0 < nq; i0 += BR) {
      const int64_t last_row = min(i0 + BR, nq) - 1;
      if (causal && last_row + (nk - nq) < j0) continue;  // this Q block sees no key of block j
      __syncthreads();  // the previous step is done with Qs, dOs, Ps, dSs
      for (int e = tid; e < BR * D; e += kThreads) {
        const int r = e / D, c = e % D;
        const bool in = i0 + r < nq;
        Qs[r * LD + c] = in ? q[(q_row0 + i0 + r) * D + c] : 0.f;
        dOs[r * LD + c] = in ? dout[(q_row0 + i0 + r) * D + c] : 0.f;
      }
      for (int r = tid; r < BR; r += kThreads) {
        const bool in = i0 + r < nq;
        Ls[r] = in ? lse[q_row0 + i0 + r] : -INFINITY;
        Ds[r] = in ? Dsum[q_row0 + i0 + r] : 0.f;
      }
      __syncthreads();

      // S = Q_i K_jᵀ and dP = dO_i V_jᵀ, this thread's 4×4 of each: rows ty + 16a, keys tx + 16b.
      float s[kA][kB] = {}, dp[kA][kB] = {};
      for (int c = 0; c < D; ++c) {
#pragma unroll
        for (int a = 0; a < kA; ++a) {
          const float qa = Qs[(ty + kSide * a) * LD + c], da = dOs[(ty + kSide * a) * LD + c];
#pragma unroll
          for (int bb = 0; bb < kB; ++bb) {
            s[a][bb] += qa * Ks[(tx + kSide * bb) * LD + c];
            dp[a][bb] += da * Vs[(tx + kSide * bb) * LD + c];
          }
        }
      }
      // P = exp(scale·S − L), 0 where masked or where the row saw no key; dS = P ∘ (dP − D).
#pragma unroll
      for (int a = 0; a < kA; ++a) {
        const int r = ty + kSide * a;
        const int64_t row = i0 + r;
#pragma unroll
        for (int bb = 0; bb < kB; ++bb) {
          const int c = tx + kSide * bb;
          const int64_t key = j0 + c;
          const bool hidden = key >= nk || row >= nq || (causal && key > row + (nk - nq)) || Ls[r] == -INFINITY;
          const float p = hidden ? 0.f : expf(s[a][bb] * scale - Ls[r]);
          Ps[r * (BC + 1) + c] = p;
          dSs[r * (BC + 1) + c] = p * (dp[a][bb] - Ds[r]);
        }
      }
      __syncthreads();

      // dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i (scaled at the end): keys ty + 16a, columns tx + 16e.
      for (int r = 0; r < BR; ++r) {
#pragma unroll
        for (int a = 0; a < kB; ++a) {
          const float p = Ps[r * (BC + 1) + ty + kSide * a], ds = dSs[r * (BC + 1) + ty + kSide * a];
#pragma unroll
          for (int e = 0; e < D / kSide; ++e) {
            dv_acc[a][e] += p * dOs[r * LD + tx + kSide * e];
            dk_acc[a][e] += ds * Qs[r * LD + tx + kSide * e];
          }
        }
      }
      // dQ_i += scale · dS K_j: rows ty + 16a, columns tx + 16e, added atomically (other K/V
      // blocks add to the same rows at the same time).
#pragma unroll
      for (int a = 0; a < kA; ++a) {
        const int r = ty + kSide * a;
        if (i0 + r >= nq) continue;
#pragma unroll
        for (int e = 0; e < D / kSide; ++e) {
          const int c = tx + kSide * e;
          float acc = 0.f;
          for (int key = 0; key < BC; ++key) acc += dSs[r * (BC + 1) + key] * Ks[key * LD + c];
          atomicAdd(&dq[(q_row0 + i0 + r) * D + c], scale * acc);
        }
      }
    }
  }

#pragma unroll
  for (int a = 0; a < kB; ++a) {
    const int64_t key = j0 + ty + kSide * a;
    if (key >= nk) continue;
#pragma unroll
    for (int e = 0; e < D / kSide; ++e) {
      const int c = tx + kSide * e;
      dk[(kv_row0 + key) * D + c] = scale * dk_acc[a][e];
      dv[(kv_row0 + key) * D + c] = dv_acc[a][e];
    }
  }
}

template <int D>
void launch(const AttentionShape& s, const BackwardArgs& a) {
  const cudaStream_t stream = as_stream(a.stream);
  float* Dsum = static_cast<float*>(a.workspace);
  const int64_t rows = s.batch * s.heads * s.seq_q;
  preprocess_kernel<<<unsigned(ceil_div<int64_t>(rows, 8)), 256, 0, stream>>>(
      static_cast<const float*>(a.o), static_cast<const float*>(a.dout), Dsum, rows, D);
  FL_CUDA_CHECK_LAUNCH();
  FL_CUDA_CHECK(cudaMemsetAsync(a.dq, 0, std::size_t(s.q_elems()) * sizeof(float), stream));
  constexpr std::size_t bytes = (std::size_t(2 * BC + 2 * BR) * (D + 1) + 2 * BR * (BC + 1) + 2 * BR) * sizeof(float);
  FL_CUDA_CHECK(cudaFuncSetAttribute(backward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  const dim3 grid(unsigned(ceil_div<int64_t>(s.seq_k, BC)), unsigned(s.kv_heads), unsigned(s.batch));
  backward_kernel<D><<<grid, kThreads, bytes, stream>>>(
      static_cast<const float*>(a.q), static_cast<const float*>(a.k), static_cast<const float*>(a.v),
      static_cast<const float*>(a.dout), a.lse, Dsum, static_cast<float*>(a.dq), static_cast<float*>(a.dk),
      static_cast<float*>(a.dv), int(s.heads), int(s.group()), s.seq_q, s.seq_k, s.softmax_scale(), s.causal);
  FL_CUDA_CHECK_LAUNCH();
}

void gpu_backward(Version, const AttentionShape& s, DType, const BackwardArgs& a) {
  if (s.kv_heads > 65535 || s.batch > 65535)
    throw InputError("rung 07_backward_recompute (cuda): kv_heads and batch must each be at most 65535");
  switch (s.head_dim) {
    case 64: return launch<64>(s, a);
    case 128: return launch<128>(s, a);
    default: throw InputError("rung 07_backward_recompute (cuda): head_dim " + std::to_string(s.head_dim) +
                              " has no kernel; supported: 64, 128");
  }
}

}  // namespace

static const Register<BackwardRung<Backend::Cuda>> registered{Version::Fp32, &gpu_backward};

}  // namespace fl::backward
