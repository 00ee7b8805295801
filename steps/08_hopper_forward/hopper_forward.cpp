// Rung 08, the twins: rung 06's numerics twin, one per version, with the version's block sizes.
#include "hopper_forward.hpp"

#include <memory>

namespace fl::hopper {

static const struct RegisterTwins {
  RegisterTwins() {
    for (const VersionInfo& v : kVersions) Registry::instance().add(std::make_unique<HopperRung<Backend::Cpu>>(v.version));
  }
} registered;

}  // namespace fl::hopper
