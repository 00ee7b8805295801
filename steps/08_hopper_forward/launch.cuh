// What every rung-08 kernel file shares and none of them teaches: the checks before a launch (a
// GPU that runs wgmma, a build for sm_90a, the grid's limits, 16-byte alignment), the kernel
// instance for the call's dtype and head dim, and the registration of the version under its name.
// A version file holds its kernel and a `Launch` with `template <class T, int D> static void
// run(shape, args)` (and, if it needs device memory of its own, a static `workspace_bytes(shape,
// dtype)`), and ends with
//     static const RegisterKernel<Launch> registered{kVersion};
#pragma once

#include <memory>
#include <string>
#include <type_traits>

#include "cuda_check.cuh"
#include "device.hpp"
#include "dispatch.cuh"
#include "hopper_forward.hpp"
#include "wgmma.cuh"

namespace fl::hopper {

inline constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = 2^(x·log2 e)

// Empty where wgmma runs; else what the rung needs (the rung's unavailable(): every check refuses).
inline std::string why_not_here() { return fl::wgmma::why_not_here("06_tensor_core_mma/v9_one_sync"); }

template <class Launch>
void dispatch(Version v, const AttentionShape& s, DType t, const ForwardArgs& a) {
  const std::string who = std::string("rung ") + info(v).name + " (cuda): ";
  if (const std::string why = why_not_here(); !why.empty()) throw InputError(who + why);
  if (s.heads > 65535 || s.batch > 65535) throw InputError(who + "heads and batch must each be at most 65535 (grid y, z)");
  if (!is_aligned(a.q, 16) || !is_aligned(a.k, 16) || !is_aligned(a.v, 16) || !is_aligned(a.o, 16))
    throw InputError(who + "q, k, v and o must be 16-byte aligned (the kernel moves them in 16-byte pieces); "
                     "cudaMalloc and PyTorch allocations are");
  if (a.workspace && !is_aligned(a.workspace, 16))
    throw InputError(who + "the workspace must be 16-byte aligned, as q, k, v and o are; allocate it with cudaMalloc or as a "
                     "PyTorch tensor");
  dispatch_16bit<Launch, 64, 128>(who, t, s.head_dim, s, a);
}

// A Launch's `static std::size_t workspace_bytes(shape, dtype)`, where it has one.
template <class Launch, class = void>
struct WorkspaceOf {
  static constexpr WorkspaceFn fn = nullptr;
};
template <class Launch>
struct WorkspaceOf<Launch, std::void_t<decltype(&Launch::workspace_bytes)>> {
  static constexpr WorkspaceFn fn = &Launch::workspace_bytes;
};

// Adds version v's kernel to the registry at program start.
template <class Launch>
struct RegisterKernel {
  explicit RegisterKernel(Version v) {
    Registry::instance().add(
        std::make_unique<HopperRung<Backend::Cuda>>(v, &dispatch<Launch>, &why_not_here, WorkspaceOf<Launch>::fn));
  }
};

}  // namespace fl::hopper
