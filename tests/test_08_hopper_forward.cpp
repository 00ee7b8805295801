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

// Logits that drift along the keys (InputKind::RisingLogits): each row's maximum moves block after
// block, fast in some rows, slowly or not at all in others, so O is rescaled at most steps in
// some rows of a warp and at none in others (and a version that skips rescales, as the lazy
// rescale tried in appendix 08 did, keeps a stale reference in some). Ragged, causal and GQA,
// both head dims, in both 16-bit types.
std::vector<AttentionShape> rising_shapes() {
  return {make_shape(1, 2, 1, 300, 1000, 64, false), make_shape(2, 4, 2, 257, 1030, 128, true),
          make_shape(1, 2, 2, 129, 4000, 128, false), make_shape(1, 4, 1, 1000, 1000, 64, true)};
}

void expect_rising_logits_pass(const std::string& name, Backend b) {
  FL_RUNG_OR_SKIP(r, name, b);
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<Case> cases;
    for (const AttentionShape& s : rising_shapes()) cases.push_back({s, InputKind::RisingLogits, base_seed()});
    expect_cases_pass(*r, t, cases);
  }
}

TEST(Hopper, TwinMatchesOracleOnRisingLogits) {
  expect_rising_logits_pass("08_hopper_forward/v7_descriptors", Backend::Cpu);
}

TEST(Hopper, EveryVersionMatchesOracleAndTwinOnRisingLogits) {
  for (const std::string& name : version_names()) expect_rising_logits_pass(name, Backend::Cuda);
}

}  // namespace
}  // namespace fl::testing
