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
TEST(Hopper, RefusesWhereWgmmaCannotRunAndSaysWhy) { expect_refused_where_unavailable(version_names()); }

}  // namespace
}  // namespace fl::testing
