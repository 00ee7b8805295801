// Rung 04: FlashAttention-1. Beyond the conformance suite: the block sizes follow the paper's rule,
// the traffic follows Θ(N²d²/M) for any on-chip budget M, and no N×N memory is used.
#include "../steps/04_fa1_loop_order/fa1_loop_order.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Rung04, RungConformance, ::testing::Values("04_fa1_loop_order"));

TEST(Fa1, BlockSizesFollowThePapersRule) {
  EXPECT_EQ(fa1::blocks_for(16384, 64).bc, 64);   // ⌈16384 / 256⌉
  EXPECT_EQ(fa1::blocks_for(16384, 64).br, 64);   // min(64, d)
  EXPECT_EQ(fa1::blocks_for(16384, 128).bc, 32);
  EXPECT_EQ(fa1::blocks_for(16384, 32).bc, 128);
  EXPECT_EQ(fa1::blocks_for(16384, 32).br, 32);   // capped at d
  EXPECT_EQ(fa1::blocks_for(1000, 64).bc, 4);     // ⌈1000 / 256⌉
}

// Runs the twin with budget M on fresh inputs; returns the counted traffic after checking O.
IoCounter run_twin(const AttentionShape& s, int64_t m_floats) {
  const Inputs in = make_inputs(s, DType::F32, base_seed());
  std::vector<float> o(s.o_elems(), NAN), lse(s.lse_elems(), NAN), ws(2 * s.lse_elems(), NAN);
  ForwardArgs a;
  a.q = in.q.data(), a.k = in.k.data(), a.v = in.v.data(), a.o = o.data(), a.lse = lse.data();
  a.workspace = ws.data();
  IoCounter io;
  a.io = &io;
  fa1::twin_forward(s, a, m_floats);
  const ReferenceForward ref = reference_forward(s, in.q.data(), in.k.data(), in.v.data());
  const ForwardCheck c = check_forward(s, DType::F32, {o, lse}, ref);
  EXPECT_TRUE(c.pass) << "M=" << m_floats << " " << s.str() << " " << c.str();
  return io;
}

// For every budget M the twin is right and moves exactly the modelled bytes; non-causal, the
// model is the closed form of the paper's Theorem 2 bound.
TEST(Fa1, TrafficMatchesModelForAnyBudget) {
  for (int64_t M : {1024, 4096, 16384, 65536})
    for (const AttentionShape& s : {make_shape(1, 2, 1, 150, 130, 64, false), make_shape(1, 1, 1, 77, 200, 32, true)}) {
      const IoCounter io = run_twin(s, M);
      const IoModel m = fa1::io_model(s, M);
      EXPECT_EQ(double(io.read), m.read) << "M=" << M << " " << s.str();
      EXPECT_EQ(double(io.written), m.written) << "M=" << M << " " << s.str();
    }
  const AttentionShape s = make_shape(1, 1, 1, 1024, 1024, 64, false);
  const double N = 1024, d = 64, tc = 1024 / 64;  // M = 16384: B_c = 64
  const IoModel m = fa1::io_model(s, 16384);
  EXPECT_EQ(m.read, 4 * (2 * N * d + tc * (2 * N * d + 2 * N) + 2 * N));
  EXPECT_EQ(m.written, 4 * (N * d + 2 * N + tc * (N * d + 2 * N) + N));
}

// Θ(N²d²/M): quadrupling M cuts the traffic about four-fold once N ≫ B_c; doubling N about
// quadruples it.
TEST(Fa1, TrafficScalesAsNSquaredDSquaredOverM) {
  const auto io = [](int64_t n, int64_t M) { return fa1::io_model(make_shape(1, 1, 1, n, n, 64, false), M).total(); };
  EXPECT_NEAR(io(8192, 4096) / io(8192, 16384), 4.0, 0.2);
  EXPECT_NEAR(io(16384, 16384) / io(8192, 16384), 4.0, 0.2);
}

TEST(Fa1, ExtraMemoryIsLinearInN) {
  const Rung* r = Registry::instance().find("04_fa1_loop_order", Backend::Cpu);
  ASSERT_NE(r, nullptr);
  const AttentionShape s = make_shape(1, 16, 16, 65536, 65536, 64, false);
  EXPECT_EQ(r->workspace_bytes(s, DType::F32), 2u * 16 * 65536 * 4);  // ℓ and m: 8 MiB
}

}  // namespace
}  // namespace fl::testing
