// Rung 06: tensor cores. Beyond the conformance suite (fp16 and bf16, every version): the
// mma.sync.m16n8k16 fragment layouts the kernel indexes through are checked here on the CPU, so
// CI catches a wrong lane ↔ element map without a GPU.
#include <set>
#include <string>
#include <vector>

#include "../steps/06_tensor_core_mma/mma_layout.hpp"
#include "../steps/06_tensor_core_mma/swizzle.hpp"
#include "../steps/06_tensor_core_mma/tensor_core_mma.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

// Every version, each on its own: the road to speed must stay correct at every step.
INSTANTIATE_TEST_SUITE_P(Rung06, RungConformance, ::testing::ValuesIn(rung_names("06_tensor_core_mma")),
                         version_label);

// Every element of the tile is held by exactly one (lane, element) pair.
template <class F>
void expect_bijection(F elem, int per_lane, int rows, int cols) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < per_lane; ++e) {
      const mma::Coord c = elem(lane, e);
      EXPECT_TRUE(c.row >= 0 && c.row < rows && c.col >= 0 && c.col < cols) << lane << "," << e;
      EXPECT_TRUE(seen.insert({c.row, c.col}).second) << "(" << c.row << "," << c.col << ") held twice";
    }
  EXPECT_EQ(int(seen.size()), rows * cols);
}

TEST(MmaLayout, FragmentsCoverTheirTilesExactlyOnce) {
  expect_bijection(mma::a_elem, 8, 16, 16);  // A: 16×16, 8 halves per lane
  expect_bijection(mma::b_elem, 4, 16, 8);   // B: 16×8 (k × n), 4 halves per lane
  expect_bijection(mma::c_elem, 4, 16, 8);   // C: 16×8, 4 floats per lane
}

// Points from the PTX ISA's figures: lane 0 starts every fragment at the origin; lane 5 is group
// 1, thread 1; the second register of A is 8 rows down, the third 8 columns right.
TEST(MmaLayout, MatchesThePtxFigures) {
  auto eq = [](mma::Coord c, int r, int col) { return c.row == r && c.col == col; };
  EXPECT_TRUE(eq(mma::a_elem(0, 0), 0, 0));
  EXPECT_TRUE(eq(mma::a_elem(5, 1), 1, 3));   // g = 1, t = 1: columns 2t, 2t + 1
  EXPECT_TRUE(eq(mma::a_elem(5, 2), 9, 2));   // register 1: row g + 8
  EXPECT_TRUE(eq(mma::a_elem(5, 4), 1, 10));  // register 2: column 2t + 8
  EXPECT_TRUE(eq(mma::a_elem(31, 7), 15, 15));
  EXPECT_TRUE(eq(mma::b_elem(5, 0), 2, 1));   // B: k = 2t, n = g
  EXPECT_TRUE(eq(mma::b_elem(5, 3), 11, 1));  // register 1: k = 2t + 9
  EXPECT_TRUE(eq(mma::c_elem(5, 3), 9, 3));   // C: row g + 8, column 2t + 1
}

// FlashAttention-2's register trick: C tiles 2kk and 2kk + 1 of S are, lane for lane and in
// order, the A tile of P for k-step kk. The kernel packs s[2kk][0..3], s[2kk+1][0..3] into A.
TEST(MmaLayout, TwoCTilesSideBySideAreOneATile) {
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 8; ++e) {
      const mma::Coord a = mma::a_elem(lane, e);
      const int tile = e < 4 ? 0 : 1;  // registers 0, 1 from tile 0; registers 2, 3 from tile 1
      const int ce = e < 4 ? e : e - 4;
      const mma::Coord c = mma::c_elem(lane, ce);
      EXPECT_EQ(a.row, c.row) << "lane " << lane << " element " << e;
      EXPECT_EQ(a.col, c.col + 8 * tile) << "lane " << lane << " element " << e;
    }
}

// The numerics twin rounds where the kernel does, so its fp16 error is about a tenth of its bf16
// error (10 against 7 mantissa bits), and both sit well inside the dtype's tolerance.
// v8's precomputed ldmatrix addresses (swizzle.hpp) land exactly where swz puts the element each
// lane must point at, for every lane, every piece of a 128-row tile and tiles at several
// 128-byte-aligned addresses.
template <int LD>
void expect_lane_rows_match_swz() {
  for (uint32_t tile : {0u, 128u, 4096u + 256u, 65536u + 1920u})
    for (int lane = 0; lane < 32; ++lane) {
      const mma::LaneRow<LD> a = mma::a_pattern<LD>(lane), b = mma::b_pattern<LD>(lane);
      for (int r0 = 0; r0 < 128; r0 += 8)
        for (int c0 = 0; c0 < LD; c0 += 16) {
          const uint32_t want_a = tile + 2 * mma::swz<LD>(r0 + lane % 16, c0 + 8 * (lane / 16));
          const uint32_t want_b = tile + 2 * mma::swz<LD>(r0 + lane % 8 + 8 * (lane / 16), c0 + 8 * (lane / 8 % 2));
          ASSERT_EQ(a.at(tile, r0, c0), want_a) << "LD " << LD << " lane " << lane << " (" << r0 << "," << c0 << ")";
          ASSERT_EQ(b.at(tile, r0, c0), want_b) << "LD " << LD << " lane " << lane << " (" << r0 << "," << c0 << ")";
        }
    }
}
TEST(Swizzle, PrecomputedLdmatrixAddressesMatchTheLayout) {
  expect_lane_rows_match_swz<64>();
  expect_lane_rows_match_swz<128>();
}

// LaneRow::moved, as rung 07's 2D kernel folds a warp's first row and column in: every (r0, c0)
// its contract allows (r0 a multiple of 8; c0's and c's 16-column steps sharing no bit within a
// group of 64 columns) gives the address of the unmoved pattern at (r0 + r, c0 + c).
template <int LD>
void expect_moved_lane_rows_match() {
  const uint32_t tile = 4096u + 384u;
  for (int lane = 0; lane < 32; ++lane)
    for (const mma::LaneRow<LD> p : {mma::a_pattern<LD>(lane), mma::b_pattern<LD>(lane)})
      for (int r0 = 0; r0 < 64; r0 += 8)
        for (int c0 = 0; c0 < LD; c0 += 16) {
          const mma::LaneRow<LD> m = p.moved(r0, c0);
          for (int r = 0; r < 64; r += 8)
            for (int c = 0; c0 + c < LD; c += 16) {
              if (((c0 / 16) % 4) & ((c / 16) % 4)) continue;  // outside the contract
              ASSERT_EQ(m.at(tile, r, c), p.at(tile, r0 + r, c0 + c))
                  << "LD " << LD << " lane " << lane << " moved to (" << r0 << "," << c0 << "), at (" << r << "," << c << ")";
            }
        }
}
TEST(Swizzle, MovedLaneRowsAddUp) {
  expect_moved_lane_rows_match<64>();
  expect_moved_lane_rows_match<128>();
}

// v8's cp.async shares (TileCopyOffsets): every 16-byte chunk of the tile is copied exactly once,
// from its place in global memory to its swizzled place in shared memory.
template <int D, int kThreads, int kRows>
void expect_tile_copy_covers_the_tile() {
  using C = mma::TileCopyOffsets<D, kThreads>;
  std::set<int> seen;
  for (int tid = 0; tid < kThreads; ++tid) {
    const C c(tid);
    for (int i = 0; i < kRows / C::kRowStep; ++i) {
      const int src = c.src_at(i), row = src / D, col = src % D;
      ASSERT_EQ(col % 8, 0);
      ASSERT_LT(row, kRows);
      EXPECT_EQ(c.dst_at(i), uint32_t(2 * mma::swz<D>(row, col))) << "D " << D << " thread " << tid << " pass " << i;
      EXPECT_TRUE(seen.insert(src).second) << "chunk (" << row << "," << col << ") copied twice";
    }
  }
  EXPECT_EQ(int(seen.size()), kRows * D / 8) << "D " << D << " threads " << kThreads;
}
TEST(Swizzle, TileCopyCoversEveryChunkOnceAtItsSwizzledPlace) {
  expect_tile_copy_covers_the_tile<64, 128, 128>();
  expect_tile_copy_covers_the_tile<128, 128, 64>();
  expect_tile_copy_covers_the_tile<64, 256, 64>();
  expect_tile_copy_covers_the_tile<128, 256, 128>();
}

TEST(TensorCoreMma, TwinErrorFollowsTheMantissa) {
  const Rung* twin = Registry::instance().find(tensor_core_mma::kV1Name, Backend::Cpu);
  ASSERT_NE(twin, nullptr);
  const Case c{make_shape(1, 2, 2, 200, 300, 64, false), InputKind::Normal, base_seed()};
  const double e16 = run_case(*twin, DType::F16, c).check.o.rel_l2;
  const double ebf = run_case(*twin, DType::BF16, c).check.o.rel_l2;
  EXPECT_LT(e16, tolerance(DType::F16) / 4);
  EXPECT_LT(ebf, tolerance(DType::BF16) / 4);
  EXPECT_GT(ebf / e16, 4.0);  // 2^3 in theory; rounding noise keeps it from being exact
}

}  // namespace
}  // namespace fl::testing
