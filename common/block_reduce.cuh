// Block-wide max and sum for kernels where one thread block owns one row (rungs 00–02's softmax).
// Warp shuffles first (no shared memory, no barrier), then one value per warp through shared
// memory. Every thread gets the result. blockDim.x must be a multiple of 32, at most 1024.
#pragma once

#include <cuda_runtime.h>

namespace fl {

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <class Op>
__device__ float warp_reduce(float x, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// `identity` is what idle lanes contribute (−∞ for max, 0 for sum).
template <class Op>
__device__ float block_reduce(float x, Op op, float identity) {
  __shared__ float per_warp[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = warp_reduce(x, op);
  __syncthreads();  // per_warp may still be read by a previous call
  if (lane == 0) per_warp[warp] = x;
  __syncthreads();
  x = lane < int(blockDim.x / 32) ? per_warp[lane] : identity;
  return warp_reduce(x, op);
}

}  // namespace fl
