// Rung 01: the safe softmax. Beyond the conformance suite: it survives the logits that break
// rung 00, and its third sweep over S shows in the traffic.
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Rung01, RungConformance, ::testing::Values("01_safe_softmax"));

// Large logits: rung 00 gives NaN, rung 01 the right answer. fp32 rounds a logit near 120 to
// within ~1e-5 absolute, which becomes a relative error in P of the same size, so the bound is 1e-4.
void expect_survives_large_logits(Backend b) {
  const Rung* safe = rung_or_skip("01_safe_softmax", b);
  const Rung* naive = Registry::instance().find("00_naive_eigen", b);
  if (!safe || !naive) GTEST_SKIP() << skip_reason(b);
  const Case c{make_shape(1, 2, 2, 128, 128, 64, true), InputKind::LargeLogits, base_seed()};
  const CaseResult ok = run_case(*safe, DType::F32, c, 1e-4);
  EXPECT_TRUE(ok.check.pass) << ok.check.str();
  const CaseResult broken = run_case(*naive, DType::F32, c, 1e-4);
  EXPECT_GT(broken.check.o.bad, 0) << "rung 00 should overflow on the same inputs";
}

TEST(SafeSoftmax, CpuTwinSurvivesLargeLogitsWhereRung00Overflows) {
  expect_survives_large_logits(Backend::Cpu);
}
TEST(SafeSoftmax, GpuSurvivesLargeLogitsWhereRung00Overflows) {
  expect_survives_large_logits(Backend::Cuda);
}

// Safety costs one more sweep over S: exactly Nq·Nk more fp32 reads per head than rung 00.
TEST(SafeSoftmax, ThirdSweepCostsOneMoreReadOfS) {
  const auto s = make_shape(2, 3, 1, 100, 130, 64, true);
  const Rung* safe = Registry::instance().find("01_safe_softmax", Backend::Cpu);
  const Rung* naive = Registry::instance().find("00_naive_eigen", Backend::Cpu);
  ASSERT_TRUE(safe && naive);
  EXPECT_EQ(safe->modelled_io(s, DType::F32).read - naive->modelled_io(s, DType::F32).read,
            4.0 * 2 * 3 * 100 * 130);
  EXPECT_EQ(safe->modelled_io(s, DType::F32).written, naive->modelled_io(s, DType::F32).written);
}

}  // namespace
}  // namespace fl::testing
