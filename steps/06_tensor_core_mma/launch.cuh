// What every rung-06 kernel file shares and none of them teaches: the checks before a launch, the
// choice of the kernel instance for the call's dtype and head dim, and the registration of the
// version under its name. A version file (v1_mma.cu ... v9_one_sync.cu) holds its kernel and a
// `Launch` with `template <class T, int D> static void run(shape, args)`, and ends with
//     static const RegisterKernel<Launch> registered{kVersion};
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <string>

#include "cuda_check.cuh"
#include "dispatch.cuh"
#include "tensor_core_mma.hpp"

namespace fl::tensor_core_mma {

inline constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = 2^(x·log2 e): one FFMA, one MUFU

// Launch::run<T, D> for the call's dtype (fp16 or bf16) and head dim (64 or 128), after the checks
// every version's kernel needs: the grid's y and z limits, and 16-byte alignment (the kernels move
// Q, K, V and O in 16-byte pieces).
template <class Launch>
void dispatch(Version v, const AttentionShape& s, DType t, const ForwardArgs& a) {
  const std::string who = std::string("rung ") + info(v).name + " (cuda): ";
  if (s.heads > 65535 || s.batch > 65535)
    throw InputError(who + "heads and batch must each be at most 65535 (grid y, z)");
  if (!is_aligned(a.q, 16) || !is_aligned(a.k, 16) || !is_aligned(a.v, 16) || !is_aligned(a.o, 16))
    throw InputError(who + "q, k, v and o must be 16-byte aligned (the kernel moves them in 16-byte "
                     "pieces); cudaMalloc and PyTorch allocations are");
  dispatch_16bit<Launch, 64, 128>(who, t, s.head_dim, s, a);
}

// Adds version v's kernel to the registry at program start.
template <class Launch>
struct RegisterKernel {
  explicit RegisterKernel(Version v) {
    Registry::instance().add(std::make_unique<TensorCoreRung<Backend::Cuda>>(v, &dispatch<Launch>));
  }
};

}  // namespace fl::tensor_core_mma
