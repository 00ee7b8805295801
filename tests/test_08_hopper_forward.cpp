// Rung 08: the forward pass on Hopper. The conformance suite holds every version to the fp64
// oracle and to rung 06's numerics twin (with this rung's block sizes) on ragged, causal and GQA
// shapes; its GPU half runs where wgmma does (an H100 or H200 and a build for sm_90a) and says why
// it is left out elsewhere. Here: that elsewhere is a refusal with a reason, never a wrong answer.
#include <string>
#include <vector>

#include "../steps/08_hopper_forward/hopper_forward.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

std::vector<std::string> version_names() { return rung_names("08_hopper_forward"); }
INSTANTIATE_TEST_SUITE_P(Rung08, RungConformance, ::testing::ValuesIn(version_names()), version_label);

// On a machine where the kernels cannot run, every check refuses with what the rung needs; where
// they can, nothing is refused for that reason.
TEST(Hopper, RefusesWhereWgmmaCannotRunAndSaysWhy) {
  for (const std::string& name : version_names()) {
    const Rung* r = Registry::instance().find(name, Backend::Cuda);
    if (!r) GTEST_SKIP() << "no CUDA build: " << name << " has no kernel here";
    const AttentionShape s = make_shape(1, 2, 1, 77, 130, 64, true);
    const std::string why = r->unavailable();
    std::string refusal;
    const bool ok = r->supports(s, DType::BF16, &refusal);
    if (why.empty()) {
      EXPECT_TRUE(ok) << refusal;
    } else {
      EXPECT_FALSE(ok);
      EXPECT_NE(refusal.find("cannot run here"), std::string::npos) << refusal;
      EXPECT_NE(refusal.find(why), std::string::npos) << refusal;
    }
  }
}

}  // namespace
}  // namespace fl::testing
