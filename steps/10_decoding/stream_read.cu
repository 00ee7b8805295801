// The ceiling rung 10 is measured against: how fast this GPU can read device memory when it does
// nothing else. Every thread reads 16-byte pieces, four in flight at a time, striding over the
// whole buffer, and folds them into a checksum so that the compiler cannot drop the loads.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda_check.cuh"
#include "decoding.hpp"

namespace fl::decoding {
namespace {

__global__ void __launch_bounds__(256) stream_read_kernel(const uint4* __restrict__ data, std::size_t n,
                                                          unsigned* __restrict__ sink) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned x = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {  // four loads issued before any is used
    const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
    x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = data[i];
    x ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  // One atomic a block, not a warp: thousands of atomics on one address queue up at L2 one after
  // another, microseconds that a short read would count as its own.
  __shared__ unsigned warps[256 / 32];
  for (int off = 16; off > 0; off /= 2) x ^= __shfl_xor_sync(0xffffffffu, x, off);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 256 / 32; ++w) x ^= warps[w];
    atomicXor(sink, x);
  }
}

}  // namespace

void stream_read(const void* data, std::size_t bytes, float* sink, void* stream) {
  if (!data || !sink) throw InputError("stream_read: data and sink must not be null");
  if (bytes % 16 != 0 || !is_aligned(data, 16))
    throw InputError("stream_read: data must be 16-byte aligned and bytes a multiple of 16");
  int device = 0, sms = 0;
  FL_CUDA_CHECK(cudaGetDevice(&device));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::size_t n = bytes / 16;
  const unsigned blocks = unsigned(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(sms) * 8, (n + 255) / 256)));
  stream_read_kernel<<<blocks, 256, 0, as_stream(stream)>>>(static_cast<const uint4*>(data), n,
                                                            reinterpret_cast<unsigned*>(sink));
  FL_CUDA_CHECK_LAUNCH();
}

}  // namespace fl::decoding
