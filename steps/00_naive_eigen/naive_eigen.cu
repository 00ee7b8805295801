// Rung 00, GPU: the textbook softmax as a kernel, one thread block per row of S.
//
// Like the twin, it sums exp(S) with no max subtracted, so large logits overflow to inf and then
// NaN. The two sweeps over the row each read it from device memory.
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.cuh"
#include "naive_eigen.hpp"

namespace fl::naive_eigen {
namespace {

constexpr int kThreads = 256;  // per row; a multiple of 32 for block_reduce

__global__ void softmax_kernel(const float* __restrict__ S,  // [rows, cols]
                               float* __restrict__ P,        // [rows, cols]
                               float* __restrict__ lse,      // [rows]
                               int64_t cols) {
  const float* s = S + blockIdx.x * cols;
  float* p = P + blockIdx.x * cols;
  // Sweep 1: ℓ = Σ_j exp(S_j).
  float l = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) l += expf(s[j]);
  l = block_reduce(l, SumOp{}, 0.f);
  // Sweep 2: P_j = exp(S_j) / ℓ; a row that sees no key (ℓ = 0) gets P = 0 and lse = −∞.
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) p[j] = l > 0.f ? expf(s[j]) / l : 0.f;
  if (threadIdx.x == 0) lse[blockIdx.x] = logf(l);
}

}  // namespace

void gpu_softmax(const float* S, float* P, float* lse, int64_t rows, int64_t cols, void* stream) {
  softmax_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(S, P, lse, cols);
  FL_CUDA_CHECK_LAUNCH();
}

static const Register<standard::StandardRung<Backend::Cuda>> registered{kSpec, gpu_softmax};

}  // namespace fl::naive_eigen
