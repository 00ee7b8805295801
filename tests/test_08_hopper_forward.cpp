// Rung 08: the forward pass on Hopper. The conformance suite holds every version to the fp64
// oracle and to rung 06's numerics twin (with this rung's block sizes) on ragged, causal and GQA
// shapes; its GPU half runs where wgmma does (an H100 or H200 and a build for sm_90a) and says why
// it is left out elsewhere. Here: that elsewhere is a refusal with a reason, never a wrong answer.
#include <algorithm>
#include <cstring>
#include <iostream>
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

// v14_flat_tiles cuts d = 64's tiles from all heads' rows at once where there is no mask, Nq is a
// multiple of 64 (at least 128), the walk is not split and a head's own tiles would leave a tenth
// of its rows or more past its end: a tile may hold rows of two heads, with the same K and V (GQA)
// or not, and the last tile may run past the last head. Every version, non-causal d = 64 shapes
// of that kind: tiles across heads of their own K/V and of shared ones (GQA 4:1 and 2:1), Nq of
// two slices (every tile across two heads), a last tile with one or two empty consumers, and more
// tiles than an H100 has SMs (278: about two a thread block, so that a block's walk goes from tile
// to tile, with and without the second set); and one where a head's tiles leave too few rows
// (Nq = 192: none) for the flat walk.
std::vector<AttentionShape> flat_shapes() {
  return {make_shape(2, 4, 4, 1024, 300, 64, false), make_shape(1, 8, 2, 320, 700, 64, false),
          make_shape(3, 2, 1, 128, 65, 64, false),   make_shape(1, 3, 3, 192, 1000, 64, false),
          make_shape(1, 1, 1, 128, 300, 64, false),  make_shape(4, 16, 4, 832, 130, 64, false)};
}

// The launcher takes the flat walk where the shape suits it (hopper::flat_tiles_pay) and the walk
// does not split. No shape here splits on any GPU: with Nk ≤ 1024 a tile has at most 8 key blocks,
// and v13's split needs a block's share to be 8 key blocks shorter than a tile (kMinSaved). So every
// shape but Nq = 192 takes the flat walk, and the test below checks the flat kernel, not v13's again;
// and the grid's cells take it at N = 1024 only, not causal.
TEST(Hopper, FlatTilesTakeTheShapesThatSuitThem) {
  for (const AttentionShape& s : flat_shapes()) {
    EXPECT_LE(s.seq_k, 1024) << s.str() << " could split on some GPU";
    EXPECT_EQ(hopper::flat_tiles_pay(s), s.seq_q != 192) << s.str();
  }
  EXPECT_TRUE(hopper::flat_tiles_pay(make_shape(16, 16, 16, 1024, 1024, 64, false)));
  EXPECT_FALSE(hopper::flat_tiles_pay(make_shape(16, 16, 16, 1024, 1024, 64, true))) << "causal";
  EXPECT_FALSE(hopper::flat_tiles_pay(make_shape(16, 16, 16, 1024, 1024, 128, false))) << "d = 128";
  EXPECT_FALSE(hopper::flat_tiles_pay(make_shape(4, 16, 16, 4096, 4096, 64, false))) << "3 % more rows";
  EXPECT_FALSE(hopper::flat_tiles_pay(make_shape(1, 16, 16, 1000, 1000, 64, false))) << "Nq not a multiple of 64";
  EXPECT_FALSE(hopper::flat_tiles_pay(make_shape(8, 16, 16, 64, 64, 64, false))) << "Nq below 128";
}

void expect_flat_shapes_pass(const std::string& name) {
  FL_RUNG_OR_SKIP(r, name, Backend::Cuda);
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<Case> cases;
    uint64_t n = 0;
    for (const AttentionShape& s : flat_shapes()) cases.push_back({s, InputKind::Normal, base_seed() + n++});
    expect_cases_pass(*r, t, cases);
  }
}

TEST(Hopper, EveryVersionMatchesOracleOnTilesAcrossHeads) {
  for (const std::string& name : version_names()) expect_flat_shapes_pass(name);
}

// v13_split_tail splits a non-causal walk's last round along the keys over all thread blocks,
// where the tiles do not fill whole rounds and a block's share of the split is at least 8 key
// blocks shorter than a whole tile (kMinSaved; on an H100's or H200's 132 SMs for these shapes): shares of the r tiles' W key blocks
// longer than one block (W > 132) and empty ones (W < 132), tiles of 3 to 12 pieces, pieces of 1
// to 10 key blocks, 1, 2 or 8 whole rounds first, ragged Nq (a partial tile; at d = 64 the first)
// and Nk, GQA.
std::vector<AttentionShape> split_tail_shapes() {
  return {make_shape(1, 8, 2, 2100, 1500, 128, false),  make_shape(1, 12, 4, 2900, 1100, 128, false),
          make_shape(1, 58, 29, 400, 2100, 64, false),  make_shape(1, 70, 70, 300, 1400, 64, false),
          make_shape(1, 20, 5, 1500, 2000, 64, false),  make_shape(1, 182, 182, 150, 3000, 64, false),
          make_shape(1, 1066, 533, 64, 1100, 64, false)};
}

// v13 and v14 (whose split walk is v13's).
void expect_split_tail_passes(const std::string& name) {
  FL_RUNG_OR_SKIP(r, name, Backend::Cuda);
  // The split walk, and it alone, asks for a workspace: on 132 SMs every shape here must split
  // (else this test would check v12's walk again), and the grid's N = 1024 cells must not.
  if (gpu::sm_count() == 132) {
    for (const AttentionShape& s : split_tail_shapes())
      EXPECT_GT(r->workspace_bytes(s, DType::BF16), 0u) << s.str() << " does not split";
    for (int d : {64, 128})
      EXPECT_EQ(r->workspace_bytes(make_shape(16, 16, 16, 1024, 1024, d, false), DType::BF16), 0u)
          << "the split pays too little at N = 1024, d = " << d;
  } else {
    std::cout << "[   NOTE   ] this GPU has " << gpu::sm_count() << " SMs, not 132: some of these shapes may not "
              << "split here, and where they do not, this test checks v12's walk again\n";
  }
  // Each shape once, the dtypes taking turns (the walk does not depend on the dtype; the fp64
  // oracle on these shapes is most of the test's time).
  std::vector<Case> cases[2];
  uint64_t n = 0;
  for (const AttentionShape& s : split_tail_shapes()) {
    cases[n % 2].push_back({s, InputKind::Normal, base_seed() + n});
    ++n;
  }
  expect_cases_pass(*r, DType::BF16, cases[0]);
  expect_cases_pass(*r, DType::F16, cases[1]);
}

// (v15's split kernel is v14's code: its change is compiled out of the walks that cannot be causal.)
TEST(Hopper, SplitTailMatchesOracle) {
  for (const char* name : {"08_hopper_forward/v13_split_tail", "08_hopper_forward/v14_flat_tiles"})
    expect_split_tail_passes(name);
}

// Where v13 (and v14 to v17) splits, the last piece of a tile to count in (which depends on timing) adds every
// piece in the same order: O and lse have the same bits on every run of the same inputs.
void expect_split_tail_same_bits(const std::string& name,
                                 const std::vector<AttentionShape>& shapes = {make_shape(1, 8, 2, 2100, 1500, 128, false),
                                                                              make_shape(1, 70, 70, 300, 1400, 64, false)}) {
  FL_RUNG_OR_SKIP(r, name, Backend::Cuda);
  uint64_t seed = base_seed() + 3000;
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(s.str() + " seed=" + std::to_string(seed));
    ForwardRun run(*r, s, DType::BF16, make_inputs(s, DType::BF16, seed++));
    run.run();
    const ForwardOutputs first = run.fetch();
    int differ = 0;
    for (int again = 1; again < 20; ++again) {
      run.poison();
      run.run();
      const ForwardOutputs next = run.fetch();
      differ += std::memcmp(first.o.data(), next.o.data(), first.o.size() * sizeof(float)) != 0 ||
                std::memcmp(first.lse.data(), next.lse.data(), first.lse.size() * sizeof(float)) != 0;
    }
    EXPECT_EQ(differ, 0) << differ << " of 19 runs differ from the first in some bit of O or lse";
  }
}

TEST(Hopper, SplitTailGivesTheSameBitsEveryRun) {
  for (const char* name : {"08_hopper_forward/v13_split_tail", "08_hopper_forward/v14_flat_tiles",
                           "08_hopper_forward/v15_consumer_ends", "08_hopper_forward/v16_half_ends",
                           "08_hopper_forward/v17_lean_steps", "08_hopper_forward/v18_early_lse"})
    expect_split_tail_same_bits(name);
}

// v15_consumer_ends: under the causal mask at d = 64, each consumer of a 192-row tile stops at the
// last key block its own 64 rows see, and only waits for and hands back the tile's later ones.
// Causal d = 64 shapes where a tile's consumers end in different blocks: Nq = Nk (the grid's
// kind), Nk past Nq by an offset that is no multiple of 64, Nk short of Nq (the first rows see no
// key: a consumer with no block of its own in a tile whose others have some), GQA, and more tiles
// than an H100 has SMs (256, 384 and 512: a block's walk goes on after tiles whose consumers ended
// apart, its barriers' phases counted through them; in the 512, Nk short of Nq, after tiles with a
// consumer that saw no key). v15 against the oracle in both dtypes; and
// its O and lse the same values as v14's, which runs every consumer to the tile's last block (a
// block wholly masked for a row adds exactly nothing to it: its rescale is exp2(0) = 1, its P 0).
std::vector<AttentionShape> consumer_end_shapes() {
  return {make_shape(2, 4, 4, 1024, 1024, 64, true), make_shape(1, 4, 2, 320, 700, 64, true),
          make_shape(1, 2, 1, 700, 300, 64, true),   make_shape(3, 3, 1, 1000, 1090, 64, true),
          make_shape(4, 16, 4, 640, 640, 64, true),  make_shape(8, 16, 16, 512, 512, 64, true),
          make_shape(8, 16, 8, 700, 300, 64, true)};
}

// `name` against the oracle on `shapes` in both dtypes, and its O and lse the same values as
// `before`'s on each (bf16).
void expect_oracle_and_values_of(const char* name, const char* before_name, const std::vector<AttentionShape>& shapes,
                                 uint64_t seed_base) {
  FL_RUNG_OR_SKIP(r, name, Backend::Cuda);
  FL_RUNG_OR_SKIP(before, before_name, Backend::Cuda);
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<Case> cases;
    uint64_t n = 0;
    for (const AttentionShape& s : shapes) cases.push_back({s, InputKind::Normal, seed_base + n++});
    expect_cases_pass(*r, t, cases);
  }
  uint64_t seed = seed_base + 100;
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(s.str() + " seed=" + std::to_string(seed));
    const auto inputs = make_inputs(s, DType::BF16, seed++);
    ForwardRun mine(*r, s, DType::BF16, inputs), theirs(*before, s, DType::BF16, inputs);
    mine.run();
    theirs.run();
    const ForwardOutputs a = mine.fetch(), b = theirs.fetch();
    ASSERT_EQ(a.o.size(), b.o.size());
    int64_t o_differ = 0, lse_differ = 0;
    for (std::size_t i = 0; i < a.o.size(); ++i) o_differ += !(a.o[i] == b.o[i]);
    for (std::size_t i = 0; i < a.lse.size(); ++i) lse_differ += !(a.lse[i] == b.lse[i]);
    EXPECT_EQ(o_differ, 0) << o_differ << " of " << a.o.size() << " values of O differ from " << before_name << "'s";
    EXPECT_EQ(lse_differ, 0) << lse_differ << " of " << a.lse.size() << " lse differ from " << before_name << "'s";
  }
}

TEST(Hopper, ConsumerEndsMatchOracleAndTheTileEnds) {
  expect_oracle_and_values_of("08_hopper_forward/v15_consumer_ends", "08_hopper_forward/v14_flat_tiles",
                              consumer_end_shapes(), base_seed() + 4000);
}

// v16_half_ends: under the causal mask at d = 64, a consumer whose rows' keys end in the first
// half of its last 128-key block multiplies that block on its first 64 keys alone, after its
// loop. On the shapes above (Nq = Nk: every other consumer, a consumer whose only block is half;
// the offsets: some of them), Nk = 300 (the last consumer's keys end 44 into a block, at Nk),
// Nq = Nk = 1000 (a partial first tile), Nk past Nq by 800 and short of it by 538, against the
// oracle, and v15's values (the skipped half adds exact zeros).
TEST(Hopper, HalfBlocksMatchOracleAndTheWholeBlocks) {
  std::vector<AttentionShape> shapes = consumer_end_shapes();
  shapes.push_back(make_shape(2, 2, 1, 300, 300, 64, true));
  shapes.push_back(make_shape(2, 4, 2, 1000, 1000, 64, true));
  shapes.push_back(make_shape(1, 3, 1, 200, 1000, 64, true));
  shapes.push_back(make_shape(3, 2, 2, 1090, 552, 64, true));
  // Each shape has consumers whose keys end in a block's first half (counted as the kernel counts
  // them: v10's 192-row tiles from a head's last row, 64 rows a consumer, 128-key blocks), so that
  // the half step runs on every one; the values below cannot tell which step ran.
  for (const AttentionShape& s : shapes) {
    const tensor_core_mma::Tiling t = hopper::tiling(hopper::Version::V16HalfEnds, 64);
    int halves = 0;
    for (int64_t r = t.first_row(s.seq_q); r < s.seq_q; r += 64) {
      const int64_t key_end = std::min<int64_t>(s.seq_k, r + 64 + (s.seq_k - s.seq_q));
      const int64_t n_mine = key_end > 0 ? (key_end + t.keys - 1) / t.keys : 0;
      halves += n_mine > 0 && key_end - (n_mine - 1) * t.keys <= 64;
    }
    EXPECT_GT(halves, 0) << s.str() << " has no half block";
  }
  expect_oracle_and_values_of("08_hopper_forward/v16_half_ends", "08_hopper_forward/v15_consumer_ends", shapes,
                              base_seed() + 4200);
}

// v17_lean_steps: the loop's buffer and phase carried, and which blocks take the mask and its
// limits worked out once a tile in 32 bits; nothing it computes changes, so its O and lse are v16's
// to the bit. The shapes put the mask's edges everywhere it can fall: v15's causal d = 64 shapes
// (Nk past Nq, short of it, rows that see no key, GQA, walks of many tiles), causal d = 128 with
// Nq above and below Nk, and without the mask Nk's ragged end in a split last round (pieces that
// start past key block 0), in a flat walk across heads and in the pairs walk at d = 128.
TEST(Hopper, LeanStepsMatchOracleAndV16) {
  std::vector<AttentionShape> shapes = consumer_end_shapes();
  shapes.push_back(make_shape(2, 3, 1, 777, 333, 128, true));
  shapes.push_back(make_shape(1, 4, 2, 300, 1300, 128, true));
  shapes.push_back(make_shape(1, 8, 2, 2100, 1500, 128, false));
  shapes.push_back(make_shape(1, 70, 70, 300, 1400, 64, false));
  shapes.push_back(make_shape(4, 8, 2, 1024, 1000, 64, false));
  shapes.push_back(make_shape(2, 5, 5, 200, 1025, 128, false));
  expect_oracle_and_values_of("08_hopper_forward/v17_lean_steps", "08_hopper_forward/v16_half_ends", shapes,
                              base_seed() + 4400);
}

// v18 moves the end of a d = 128 tile (the quad's row sums, 1/l, lse) under its last P·V: the
// same arithmetic in another place, so its output must be v17's. The d = 128 shapes take the
// pairs walk (with rows that see no key: causal, Nq > Nk) and the split one, whose kernel is v17's;
// the d = 64 shapes run v17's kernels and check that v18 dispatches to them.
TEST(Hopper, EarlyLseMatchesOracleAndV17) {
  std::vector<AttentionShape> shapes = consumer_end_shapes();
  shapes.push_back(make_shape(2, 3, 1, 777, 333, 128, true));
  shapes.push_back(make_shape(1, 8, 2, 2100, 1500, 128, false));
  shapes.push_back(make_shape(4, 8, 2, 1024, 1000, 64, false));
  shapes.push_back(make_shape(2, 5, 5, 200, 1025, 128, false));
  shapes.push_back(make_shape(2, 4, 4, 1024, 1024, 128, false));
  shapes.push_back(make_shape(2, 4, 2, 1024, 1024, 64, true));
  expect_oracle_and_values_of("08_hopper_forward/v18_early_lse", "08_hopper_forward/v17_lean_steps", shapes,
                              base_seed() + 4500);
}

// v10 counts a head's 192-row tiles (d = 64) from its last row (Tiling::from_end): the partial
// tile is the first and starts above the head. The twin and the IO model follow the tiling, so at
// N = 1024, causal, a head's K and V blocks are read 27 times, against v9's 32 (chapter 08, "v10:
// the partial tile first").
TEST(Hopper, TilesCountedFromTheEndPutThePartialTileFirst) {
  const tensor_core_mma::Tiling v9 = hopper::tiling(hopper::Version::V9ThreeConsumers, 64),
                                v10 = hopper::tiling(hopper::Version::V10EndAligned, 64);
  EXPECT_EQ(v9.first_row(1024), 0);
  EXPECT_EQ(v10.first_row(1024), -128);
  EXPECT_EQ(v10.first_row(1152), 0);
  EXPECT_EQ(v10.first_row(1), -191);
  EXPECT_FALSE(hopper::tiling(hopper::Version::V10EndAligned, 128).from_end);  // d = 128: v8's tiles
  const AttentionShape s = make_shape(1, 1, 1, 1024, 1024, 64, true);
  const double q_bytes = 1024.0 * 64 * 2, block_bytes = 2.0 * 128 * 64 * 2;  // Q; one block of K and V
  EXPECT_EQ((tensor_core_mma::io_model(s, DType::BF16, v9).read - q_bytes) / block_bytes, 32.0);
  EXPECT_EQ((tensor_core_mma::io_model(s, DType::BF16, v10).read - q_bytes) / block_bytes, 27.0);
}

}  // namespace
}  // namespace fl::testing
