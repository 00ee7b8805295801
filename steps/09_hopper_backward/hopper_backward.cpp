// Rung 09, the twins: rung 07's backward twin, one per version, with this rung's 128-key blocks.
#include "hopper_backward.hpp"

#include <memory>

namespace fl::hopper_backward {

std::size_t turn_offset(const AttentionShape& s) {
  const std::size_t end = backward::workspace_bytes(s, backward::Precision::TensorCore);
  return (end + 255) / 256 * 256;
}

std::size_t workspace_bytes(const AttentionShape& s) {
  const int64_t q_blocks = (s.seq_q + backward::kBr - 1) / backward::kBr;
  return turn_offset(s) + std::size_t(s.batch * s.heads * q_blocks) * sizeof(int);
}

Capabilities capabilities(Version v) {
  Capabilities c = backward::capabilities(backward::Precision::TensorCore);
  c.deterministic_backward = info(v).deterministic;
  c.workspace_what += ", and a 32-bit turn counter per Q block of 64 rows; for the forward, whatever rung 08's " +
                      std::string(kForward) + " needs (a split last round's partial results)";
  return c;
}

static const struct RegisterTwins {
  RegisterTwins() {
    for (const VersionInfo& v : kVersions)
      Registry::instance().add(std::make_unique<HopperBackwardRung<Backend::Cpu>>(v.version));
  }
} registered;

}  // namespace fl::hopper_backward
