// Rung 00: the textbook three-pass attention. Beyond the conformance suite: the unsafe softmax
// really overflows on large logits, and the traffic really is Θ(N·d + N²).
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Rung00, RungConformance, ::testing::Values("00_naive_eigen"));

constexpr const char* kName = "00_naive_eigen";

// Logits near 120 make exp() overflow fp32 (largest finite exp is near 88.7): the sum becomes inf
// and P = inf/inf = NaN. The oracle shows the inputs really do carry such logits.
void expect_overflow(Backend b) {
  const Rung* r = rung_or_skip(kName, b);
  if (!r) GTEST_SKIP() << skip_reason(b);
  const Case c{make_shape(1, 2, 2, 128, 128, 64, false), InputKind::LargeLogits, base_seed()};
  const CaseResult res = run_case(*r, DType::F32, c);
  double max_lse = 0;
  for (double x : res.ref.lse) max_lse = std::max(max_lse, x);
  ASSERT_GT(max_lse, 88.8) << "inputs too tame to overflow exp() in fp32";
  EXPECT_FALSE(res.check.pass);
  EXPECT_GT(res.check.o.bad, 0) << "expected inf/NaN in O: " << res.check.str();
}

TEST(NaiveEigen, CpuTwinOverflowsOnLargeLogits) { expect_overflow(Backend::Cpu); }
TEST(NaiveEigen, GpuOverflowsOnLargeLogits) { expect_overflow(Backend::Cuda); }

// The closed form, worked by hand for B = H = 1, Nq = Nk = N = 1024, d = 64 (fp32 words × 4 bytes):
// read  = Q N·d + K N·d + S 2·N² (two sweeps) + P N² + V N·d = 3·65536 + 3·1048576 words
// write = S N² + P N² + lse N + O N·d                        = 2·1048576 + 1024 + 65536 words
TEST(NaiveEigen, ClosedFormIsStandardAttentionTraffic) {
  const Rung* twin = Registry::instance().find(kName, Backend::Cpu);
  ASSERT_NE(twin, nullptr);
  const IoModel m = twin->modelled_io(make_shape(1, 1, 1, 1024, 1024, 64, false), DType::F32);
  EXPECT_EQ(m.read, 4.0 * (3 * 65536 + 3 * 1048576));
  EXPECT_EQ(m.written, 4.0 * (2 * 1048576 + 1024 + 65536));
  // Θ(N²) once N ≫ d: doubling N nearly quadruples the bytes.
  const double at4k = twin->modelled_io(make_shape(1, 1, 1, 4096, 4096, 64, false), DType::F32).total();
  const double at8k = twin->modelled_io(make_shape(1, 1, 1, 8192, 8192, 64, false), DType::F32).total();
  EXPECT_GT(at8k / at4k, 3.9);
  EXPECT_LT(at8k / at4k, 4.0);
}

}  // namespace
}  // namespace fl::testing
