// 07_backward_recompute/mma: the fastest tensor-core version the GPU runs, under one name, for the
// tools that want "the ladder's best backward" (bench/compare_torch.py, the C ABI's users). Which
// version that is, is decided here and nowhere else (fastest_version), from the measurements in
// the appendix of docs/07_backward_recompute.md.
#include <cuda_runtime.h>

#include <string>

#include "backward_mma.cuh"

namespace fl::backward {

Version fastest_version(int64_t head_dim) { return head_dim == 64 ? Version::V3KvRegs : Version::V4Tiles2d; }

namespace {

void run_fastest(Version, const AttentionShape& s, DType t, const BackwardArgs& a) {
  const char* name = info(fastest_version(s.head_dim)).name;
  const Rung* r = Registry::instance().find(name, Backend::Cuda);
  if (!r) throw InputError(std::string("rung ") + kMmaName + " (cuda): " + name + " is not in this build");
  r->backward(s, t, a);
}

}  // namespace

static const Register<BackwardRung<Backend::Cuda>> registered{Version::Fastest, &run_fastest};

}  // namespace fl::backward
