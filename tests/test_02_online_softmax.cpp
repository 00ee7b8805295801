// Rung 02: the online softmax. Beyond the conformance suite: merge() is the two-pass (max, sum)
// in any order, never NaN on empty states, and the rung saves rung 01's extra sweep.
#include <random>

#include "../steps/02_online_softmax/online_softmax.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Rung02, RungConformance, ::testing::Values("02_online_softmax"));

using online_softmax::merge;
using online_softmax::RowState;

// Folding scores one at a time, or in blocks merged in any order, gives the two-pass answer.
TEST(OnlineSoftmax, MergeEqualsTwoPassInAnyOrder) {
  std::mt19937 rng{unsigned(base_seed())};
  std::normal_distribution<float> n(0.f, 30.f);  // wide: the running max changes often
  std::vector<float> x(1000);
  for (auto& e : x) e = n(rng);
  double m = -INFINITY, l = 0;
  for (float e : x) m = std::max(m, double(e));
  for (float e : x) l += std::exp(double(e) - m);

  RowState forward, backward, blocks[4];
  for (size_t j = 0; j < x.size(); ++j) forward = merge(forward, {x[j], 1.f});
  for (size_t j = x.size(); j-- > 0;) backward = merge(backward, {x[j], 1.f});
  for (size_t j = 0; j < x.size(); ++j) blocks[j % 4] = merge(blocks[j % 4], {x[j], 1.f});
  const RowState tree = merge(merge(blocks[3], blocks[0]), merge(blocks[2], blocks[1]));
  for (const RowState& s : {forward, backward, tree}) {
    EXPECT_EQ(double(s.m), m);
    EXPECT_NEAR(s.l, l, 1e-5 * l);
  }
}

// Two empty states (rows that have seen only masked keys) merge to empty, not to NaN.
TEST(OnlineSoftmax, MergingEmptyStatesStaysEmpty) {
  const RowState e = merge(RowState{}, RowState{});
  EXPECT_EQ(e.m, -INFINITY);
  EXPECT_EQ(e.l, 0.f);
  const RowState one = merge(RowState{}, {2.f, 1.f});
  EXPECT_EQ(one.m, 2.f);
  EXPECT_EQ(one.l, 1.f);
}

void expect_survives_large_logits(Backend b) {
  const Rung* r = rung_or_skip("02_online_softmax", b);
  if (!r) GTEST_SKIP() << skip_reason(b);
  const Case c{make_shape(1, 2, 1, 128, 200, 64, false), InputKind::LargeLogits, base_seed()};
  const CaseResult res = run_case(*r, DType::F32, c, 1e-4);
  EXPECT_TRUE(res.check.pass) << res.check.str();
}
TEST(OnlineSoftmax, CpuTwinSurvivesLargeLogits) { expect_survives_large_logits(Backend::Cpu); }
TEST(OnlineSoftmax, GpuSurvivesLargeLogits) { expect_survives_large_logits(Backend::Cuda); }

// One sweep fewer than rung 01, the same as rung 00: the safety is free.
TEST(OnlineSoftmax, SavesRung01sExtraSweep) {
  const auto s = make_shape(1, 2, 2, 300, 200, 64, false);
  const Rung* online = Registry::instance().find("02_online_softmax", Backend::Cpu);
  const Rung* naive = Registry::instance().find("00_naive_eigen", Backend::Cpu);
  ASSERT_TRUE(online && naive);
  EXPECT_EQ(online->modelled_io(s, DType::F32).total(), naive->modelled_io(s, DType::F32).total());
}

}  // namespace
}  // namespace fl::testing
