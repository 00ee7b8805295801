// Rung 01, GPU: the safe softmax, one thread block per row of S, three sweeps over the row.
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.cuh"
#include "safe_softmax.hpp"

namespace fl::safe_softmax {
namespace {

constexpr int kThreads = 256;  // per row; a multiple of 32 for block_reduce

__global__ void softmax_kernel(const float* __restrict__ S,  // [rows, cols]
                               float* __restrict__ P,        // [rows, cols]
                               float* __restrict__ lse,      // [rows]
                               int64_t cols) {
  const float* s = S + blockIdx.x * cols;
  float* p = P + blockIdx.x * cols;
  // Sweep 1: m = max_j S_j.
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_reduce(m, MaxOp{}, -INFINITY);
  // Sweep 2: ℓ = Σ_j exp(S_j − m); skipped for a row that sees no key (m = −∞).
  float l = 0.f;
  if (m != -INFINITY)
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) l += expf(s[j] - m);
  l = block_reduce(l, SumOp{}, 0.f);
  // Sweep 3: P_j = exp(S_j − m) / ℓ; an empty row gets P = 0 and lse = −∞.
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) p[j] = l > 0.f ? expf(s[j] - m) / l : 0.f;
  if (threadIdx.x == 0) lse[blockIdx.x] = l > 0.f ? m + logf(l) : -INFINITY;
}

}  // namespace

void gpu_softmax(const float* S, float* P, float* lse, int64_t rows, int64_t cols, void* stream) {
  softmax_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(S, P, lse, cols);
  FL_CUDA_CHECK_LAUNCH();
}

static const Register<standard::StandardRung<Backend::Cuda>> registered{kSpec, gpu_softmax};

}  // namespace fl::safe_softmax
