// What every rung-09 kernel file shares and none of them teaches: the checks before a launch (a
// GPU that runs wgmma and a build for sm_90a, then rung 07's: the grid's limits, 16-byte
// alignment), the kernel instance for the call's dtype and head dim, and the registration of the
// version under its name. The kernels' parts (the walk over Q blocks, the step's mask and loads,
// D, the last pass over dQ) are rung 07's (backward_mma.cuh). A version file holds its kernel and a
// `Launch` with `template <class T, int D> static void run(Version, shape, args)`, and ends with
//     static const RegisterKernel<Launch> registered{kVersion};
#pragma once

#include <memory>
#include <string>
#include <type_traits>

#include "../07_backward_recompute/backward_mma.cuh"
#include "../08_hopper_forward/wgmma.cuh"
#include "device.hpp"
#include "hopper_backward.hpp"

namespace fl::hopper_backward {

// Empty where wgmma runs; else what the rung needs (the rung's unavailable(): every check refuses).
inline std::string why_not_here() { return fl::wgmma::why_not_here("07_backward_recompute/v4_2d_tiles"); }

template <class Launch>
void dispatch(Version v, const AttentionShape& s, DType t, const BackwardArgs& a) {
  if (const std::string why = why_not_here(); !why.empty())
    throw InputError(std::string("rung ") + info(v).name + " (cuda): " + why);
  backward::tc::dispatch_named<Launch>(info(v).name, v, s, t, a);
}

// A Launch's `static std::size_t backward_workspace_bytes(shape, dtype)`, where it has one (rung
// 08's WorkspaceOf).
template <class Launch, class = void>
struct WorkspaceOf {
  static constexpr WorkspaceFn fn = nullptr;
};
template <class Launch>
struct WorkspaceOf<Launch, std::void_t<decltype(&Launch::backward_workspace_bytes)>> {
  static constexpr WorkspaceFn fn = &Launch::backward_workspace_bytes;
};

// Adds version v's kernels to the registry at program start.
template <class Launch>
struct RegisterKernel {
  explicit RegisterKernel(Version v) {
    Registry::instance().add(std::make_unique<HopperBackwardRung<Backend::Cuda>>(v, &dispatch<Launch>, &why_not_here,
                                                                                 WorkspaceOf<Launch>::fn));
  }
};

}  // namespace fl::hopper_backward
