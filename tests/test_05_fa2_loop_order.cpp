// Rung 05: FlashAttention-2. Beyond the conformance suite: Q is read once and K/V once per Q
// block, causal blocks above the diagonal are never loaded, and no extra memory is used.
#include "../steps/05_fa2_loop_order/fa2_loop_order.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Rung05, RungConformance, ::testing::Values("05_fa2_loop_order"));

// By hand for B = H = 1, N = 1024, d = 64, B_r = B_c = 64 (Tr = 16): Q read once, K and V 16
// times, O and lse written once.
TEST(Fa2, ReadsQOnceAndStreamsKVOncePerQBlock) {
  const double N = 1024, d = 64;
  const IoModel m = fa2::io_model(make_shape(1, 1, 1, 1024, 1024, 64, false));
  EXPECT_EQ(m.read, 4 * (N * d + 16 * 2 * N * d));
  EXPECT_EQ(m.written, 4 * (N * d + N));
  // Rung 04 with the same 64×64 blocks (tests/test_04_fa1_loop_order.cpp has its formula) moves
  // more: its 16 round trips of O, ℓ and m outweigh the K/V re-reads rung 05 pays.
  const double fa1 = 4 * (2 * N * d + 16 * (2 * N * d + 2 * N) + 2 * N) + 4 * (N * d + 2 * N + 16 * (N * d + 2 * N) + N);
  EXPECT_LT(m.total(), fa1);
}

// Causal: Q block i loads K/V blocks 0..i only, about half the non-causal traffic at Nq = Nk.
TEST(Fa2, CausalSkipsBlocksAboveTheDiagonal) {
  const double full = fa2::io_model(make_shape(1, 1, 1, 4096, 4096, 64, false)).read;
  const double causal = fa2::io_model(make_shape(1, 1, 1, 4096, 4096, 64, true)).read;
  const double q = 4096.0 * 64 * 4, kv_per_block = 2.0 * 64 * 64 * 4;
  EXPECT_EQ(causal, q + kv_per_block * (64 * 65 / 2));  // Σ_{i=1}^{64} i blocks
  EXPECT_NEAR((causal - q) / (full - q), 0.5, 0.01);
}

TEST(Fa2, NoExtraMemory) {
  const Rung* r = Registry::instance().find("05_fa2_loop_order", Backend::Cpu);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->workspace_bytes(make_shape(1, 16, 16, 65536, 65536, 64, false), DType::F32), 0u);
}

}  // namespace
}  // namespace fl::testing
