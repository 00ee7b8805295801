// Rung 02, GPU: the online softmax, one thread block per row of S, two sweeps over the row.
//
// Each thread folds its strided share of the row into a RowState; the states then merge across
// the warp with shuffles and across warps through shared memory. merge() is associative, so the
// order of the tree does not change the result beyond rounding.
#include <cuda_runtime.h>

#include "cuda_check.cuh"
#include "online_softmax.hpp"

namespace fl::online_softmax {
namespace {

constexpr int kThreads = 256;  // per row; a multiple of 32
constexpr int kWarps = kThreads / 32;

__device__ RowState warp_merge(RowState s) {
  for (int offset = 16; offset > 0; offset /= 2)
    s = merge(s, {__shfl_xor_sync(0xffffffffu, s.m, offset), __shfl_xor_sync(0xffffffffu, s.l, offset)});
  return s;
}

__global__ void softmax_kernel(const float* __restrict__ S,  // [rows, cols]
                               float* __restrict__ P,        // [rows, cols]
                               float* __restrict__ lse,      // [rows]
                               int64_t cols) {
  __shared__ RowState per_warp[kWarps];
  const float* s = S + blockIdx.x * cols;
  float* p = P + blockIdx.x * cols;
  // Sweep 1: (m, ℓ) of this thread's share, then of the whole row.
  RowState st;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) st = merge(st, {s[j], 1.f});
  st = warp_merge(st);
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = st;
  __syncthreads();
  st = threadIdx.x % 32 < kWarps ? per_warp[threadIdx.x % 32] : RowState{};
  st = warp_merge(st);
  // Sweep 2: P_j = exp(S_j − m) / ℓ; an empty row gets P = 0 and lse = −∞.
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    p[j] = st.l > 0.f ? expf(s[j] - st.m) / st.l : 0.f;
  if (threadIdx.x == 0) lse[blockIdx.x] = st.l > 0.f ? st.m + logf(st.l) : -INFINITY;
}

}  // namespace

void gpu_softmax(const float* S, float* P, float* lse, int64_t rows, int64_t cols, void* stream) {
  softmax_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(S, P, lse, cols);
  FL_CUDA_CHECK_LAUNCH();
}

static const Register<standard::StandardRung<Backend::Cuda>> registered{kSpec, gpu_softmax};

}  // namespace fl::online_softmax
