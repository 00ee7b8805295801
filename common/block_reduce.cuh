// Max and sum across lanes and blocks: block-wide for rungs 00–02 (one thread block per row of S),
// across groups of lanes for the fused rungs.
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

// Reduces across each group of kLanes consecutive lanes (a power of two, at most 32); every lane
// gets its group's result. Rungs 04 and 05 reduce over the 16 lanes that share rows of S, rung 06
// over the 4 lanes of a quad; a whole warp is 32.
template <int kLanes, class Op>
__device__ float group_reduce(float x, Op op) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two up to 32");
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

template <class Op>
__device__ float warp_reduce(float x, Op op) {
  return group_reduce<32>(x, op);
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
