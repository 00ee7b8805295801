// Checked CUDA calls for kernel launchers (CUDA sources only). A failed call throws with the
// expression, file, line and CUDA's own message; a kernel launch is followed by
// FL_CUDA_CHECK_LAUNCH() so a bad configuration is reported where it happened, not later.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fl {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess)
    throw CudaError(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                    ") in " + expr + " at " + file + ":" + std::to_string(line));
}

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Whether a pointer is aligned for `bytes`-wide vector loads (16 for float4 / uint4).
inline bool is_aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Integer ceiling division, for grid sizes.
template <class T>
__host__ __device__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

}  // namespace fl

#define FL_CUDA_CHECK(expr) ::fl::cuda_check((expr), #expr, __FILE__, __LINE__)
#define FL_CUDA_CHECK_LAUNCH() FL_CUDA_CHECK(cudaGetLastError())
