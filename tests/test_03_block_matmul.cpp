// Rung 03: tiled matrix products. Beyond the conformance suite: the fused tiling without softmax
// computes (Q·Kᵀ·scale)·V in one pass with S kept on chip, and tiling divides the operand reads.
#include <cmath>

#include "../steps/03_block_matmul/block_matmul.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Rung03, RungConformance, ::testing::Values("03_block_matmul"));

using block_matmul::kTile;

// The fused demo matches the oracle's (Q·Kᵀ·scale)·V, on ragged shapes and GQA. Without a softmax
// nothing keeps O away from zero: where Q·Kᵀ nearly cancels (the 1 × 1 shape, q and k nearly
// orthogonal, about one draw in 400), an exact fp32 dot product is still off by its roundings,
// which are relative to Σ|q||k|, not to the tiny sum. So the error is held to the dtype's
// tolerance of what the same products give on |Q|, |K|, |V|, the dot product's own error bound: a
// wrong scale, tile or element still misses it by orders of magnitude.
TEST(BlockMatmul, FusedTilingWithoutSoftmaxMatchesOracle) {
  for (const AttentionShape& s : {make_shape(1, 2, 1, 37, 50, 64, false), make_shape(2, 2, 2, 100, 17, 128, false),
                                  make_shape(1, 1, 1, 1, 1, 16, false)}) {
    SCOPED_TRACE(s.str());
    const Inputs in = make_inputs(s, DType::F32, base_seed());
    const std::vector<double> ref = reference_no_softmax(s, in.q.data(), in.k.data(), in.v.data());
    auto magnitudes = [](const std::vector<float>& x) {
      std::vector<float> a(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) a[i] = std::fabs(x[i]);
      return a;
    };
    const std::vector<float> aq = magnitudes(in.q), ak = magnitudes(in.k), av = magnitudes(in.v);
    const std::vector<double> bound = reference_no_softmax(s, aq.data(), ak.data(), av.data());
    double bound_l2 = 0;
    for (double b : bound) bound_l2 += b * b;
    bound_l2 = std::sqrt(bound_l2);
    std::vector<float> o(s.o_elems(), NAN);
    IoCounter io;
    block_matmul::twin_fused_no_softmax(s, in.q.data(), in.k.data(), in.v.data(), o.data(), io);
    const ErrorStats e = compare(o.data(), ref.data(), int64_t(o.size()));
    EXPECT_EQ(e.bad, 0) << e.str();
    EXPECT_LE(e.l2, tolerance(DType::F32) * bound_l2) << e.str() << " (bound: tolerance x ||(|Q||K|^T scale)|V|||)";
    EXPECT_EQ(double(io.read), block_matmul::fused_io_model(s).read);
    EXPECT_EQ(double(io.written), block_matmul::fused_io_model(s).written);
  }
}

TEST(BlockMatmul, GpuFusedTilingWithoutSoftmaxMatchesOracle) {
#ifndef FLASH_LADDER_HAS_CUDA
  GTEST_SKIP() << skip_reason(Backend::Cuda);
#else
  if (!Registry::instance().find("03_block_matmul", Backend::Cuda) || !gpu::available())
    GTEST_SKIP() << skip_reason(Backend::Cuda);
  for (const AttentionShape& s : {make_shape(1, 2, 1, 37, 50, 64, false), make_shape(2, 2, 2, 100, 17, 128, false)}) {
    SCOPED_TRACE(s.str());
    const Inputs in = make_inputs(s, DType::F32, base_seed());
    const std::vector<double> ref = reference_no_softmax(s, in.q.data(), in.k.data(), in.v.data());
    gpu::DeviceBuffer q(in.q.size() * 4), k(in.k.size() * 4), v(in.v.size() * 4), o(s.o_elems() * 4);
    q.upload(in.q.data(), q.size()), k.upload(in.k.data(), k.size()), v.upload(in.v.data(), v.size());
    o.poison();
    block_matmul::gpu_fused_no_softmax(s, static_cast<float*>(q.get()), static_cast<float*>(k.get()),
                                       static_cast<float*>(v.get()), static_cast<float*>(o.get()), nullptr);
    std::vector<float> out(s.o_elems());
    o.download(out.data(), o.size());
    const ErrorStats e = compare(out.data(), ref.data(), int64_t(out.size()));
    EXPECT_TRUE(passes(e, DType::F32)) << e.str();
  }
#endif
}

// The closed form, by hand for B = H = 1, N = 1024, d = 64, T = 16 (Tr = Tc = 64, ⌈d/T⌉ = 4):
// Q and K are each read 64 times, P 4 times, V 64 times; rung 02 reads them once (its model
// idealises the products) and rung 00's kernels, a thread per output, would read them N times.
TEST(BlockMatmul, TilesReadOperandsOncePerTile) {
  static_assert(kTile == 16, "the numbers below are worked for T = 16");
  const IoModel m = block_matmul::io_model(make_shape(1, 1, 1, 1024, 1024, 64, false));
  const double N = 1024, d = 64;
  EXPECT_EQ(m.read, 4 * (N * d * 64 + N * d * 64 + 2 * N * N + N * N * 4 + N * d * 64));
  EXPECT_EQ(m.written, 4 * (2 * N * N + N + N * d));
  // The fused pass: Q once, K and V once per 16-row block, O once. No N² term at all.
  const IoModel f = block_matmul::fused_io_model(make_shape(1, 1, 1, 1024, 1024, 64, false));
  EXPECT_EQ(f.total(), 4 * (N * d + 2 * N * d * 64 + N * d));
}

}  // namespace
}  // namespace fl::testing
