// Rung 09: the backward pass on Hopper. Every version's gradients against the fp64 oracle's
// backward and against rung 07's twin with this rung's blocks, on ragged, causal (rows that see no
// key), GQA shapes, both head dims, fp16 and bf16; the deterministic mode's bits the same on every
// run; the twin's traffic pinned to rung 07's closed form; and off Hopper, a refusal with a reason.
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "../steps/09_hopper_backward/hopper_backward.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

std::vector<std::string> version_names() { return rung_names("09_hopper_backward"); }
INSTANTIATE_TEST_SUITE_P(Rung09, RungConformance, ::testing::ValuesIn(version_names()), version_label);

// Ragged, causal with Nq > Nk (rows that see no key: at d = 64 a whole Q block of 128 of them,
// which no K/V block adds to) and Nq < Nk, GQA 3:1 and 2:1, a K/V block of 200 keys (one whole and
// one part), and more Q blocks than K/V blocks and fewer.
std::vector<AttentionShape> shapes() {
  return {make_shape(1, 2, 2, 17, 17, 64, true),      make_shape(2, 3, 1, 113, 203, 64, true),
          make_shape(1, 2, 2, 203, 113, 128, true),   make_shape(1, 4, 2, 77, 300, 128, false),
          make_shape(1, 2, 1, 1000, 1000, 64, false), make_shape(1, 2, 2, 333, 333, 128, true),
          make_shape(2, 4, 2, 390, 200, 128, true),   make_shape(1, 2, 1, 400, 150, 64, true)};
}

// The GPU tests run once per version (a ctest test each: the suite's per-test time limit holds
// however many versions the rung gains), the deterministic mode's on the versions that have it.
std::vector<std::string> deterministic_names() {
  std::vector<std::string> out;
  for (const hopper_backward::VersionInfo& v : hopper_backward::kVersions)
    if (v.deterministic) out.push_back(v.name);
  return out;
}
// Each version's inputs from seeds of their own, so a failure replays with the version alone.
uint64_t version_seed(const std::string& name) {
  for (std::size_t i = 0; i < std::size(hopper_backward::kVersions); ++i)
    if (name == hopper_backward::kVersions[i].name) return 100 * i;
  return 0;
}

class HopperBackwardVersion : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Rung09, HopperBackwardVersion, ::testing::ValuesIn(version_names()), version_label);
class HopperBackwardDeterministic : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Rung09, HopperBackwardDeterministic, ::testing::ValuesIn(deterministic_names()),
                         version_label);

TEST_P(HopperBackwardVersion, GpuGradientsMatchTheOracleAndTheTwin) {
  uint64_t seed = base_seed() + version_seed(GetParam());
  for (DType t : {DType::F16, DType::BF16})
    for (const AttentionShape& s : shapes()) expect_gpu_backward_matches_oracle_and_twin(GetParam(), t, s, seed += 2);
}

// The deterministic mode is still right: the same checks, the additions in their fixed order.
TEST_P(HopperBackwardDeterministic, GpuDeterministicGradientsMatchTheOracleAndTheTwin) {
  uint64_t seed = base_seed() + 1000 + version_seed(GetParam());
  for (DType t : {DType::F16, DType::BF16})
    for (const AttentionShape& s : shapes())
      expect_gpu_backward_matches_oracle_and_twin(GetParam(), t, s, seed += 2, /*deterministic=*/true);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Ten runs on the same inputs give the same bits of dQ, dK and dV. The shapes have many K/V blocks
// adding to the same rows of dQ (up to 32), where the default mode's atomics arrive in an order
// that changes from run to run. The last shape has 6 (batch, KV head) pairs of 32 K/V blocks: on
// 132 SMs v6's mode takes them in a group of 4 and a group of 2.
TEST_P(HopperBackwardDeterministic, GpuDeterministicModeGivesTheSameBitsEveryRun) {
  uint64_t seed = base_seed() + 2000 + version_seed(GetParam());
  FL_RUNG_OR_SKIP(gpu, GetParam(), Backend::Cuda);
  for (DType t : {DType::F16, DType::BF16})
    for (const AttentionShape& s : {make_shape(2, 4, 2, 1000, 4096, 128, false), make_shape(1, 8, 2, 4096, 4096, 64, true),
                                    make_shape(1, 3, 1, 777, 1500, 128, true), make_shape(3, 4, 2, 300, 4096, 64, false)}) {
      SCOPED_TRACE(GetParam() + " " + dtype_name(t) + " " + s.str() + " seed=" + std::to_string(seed));
      const Inputs in = make_inputs(s, t, seed++);
      const BackwardInputs bin = make_backward_inputs(s, t, in, seed++);
      const BackwardOutputs first = run_backward(*gpu, s, t, in, bin, nullptr, true);
      int differ = 0;
      for (int run = 1; run < 10; ++run) {
        const BackwardOutputs again = run_backward(*gpu, s, t, in, bin, nullptr, true);
        differ += !same_bits(first.dq, again.dq) || !same_bits(first.dk, again.dk) || !same_bits(first.dv, again.dv);
      }
      EXPECT_EQ(differ, 0) << differ << " of 9 runs differ from the first in some bit of dQ, dK or dV";
    }
}

// v16_split_tail cuts the last wave's K/V blocks (not causal, the default mode, d = 128) into k
// pieces along their Q steps. On 132 SMs each of these splits (the plan's choice in brackets): 136
// K/V blocks, 4 left, and 140, 8 left (k = 2, 3, 4 by the steps a block has); GQA and not, ragged
// Nq and Nk, a batch of 2, pieces of 8 or 9 steps (at least kMinPieceSteps).
std::vector<AttentionShape> split_tail_shapes() {
  return {make_shape(1, 34, 17, 1100, 1024, 128, false),  // 36 steps: k = 4
          make_shape(2, 17, 17, 1600, 500, 128, false),   // 25 steps: k = 3
          make_shape(1, 20, 10, 500, 1700, 128, false),   // 16 steps: k = 2
          make_shape(2, 17, 17, 1099, 497, 128, false)};  // 18 steps: k = 2
}
constexpr const char* kSplitTail = "09_hopper_backward/v16_split_tail";

// The split asks for more workspace than v15 (its slots and counters): on 132 SMs every shape here
// must (else this test would check v15's path again).
void expect_split_on_132_sms(const Rung& r) {
  if (gpu::sm_count() == 132) {
    const Rung* v15 = Registry::instance().find(hopper_backward::info(hopper_backward::Version::V15RotatedStores).name,
                                                Backend::Cuda);
    ASSERT_NE(v15, nullptr);
    for (const AttentionShape& s : split_tail_shapes())
      EXPECT_GT(r.backward_workspace_bytes(s, DType::BF16), v15->backward_workspace_bytes(s, DType::BF16))
          << s.str() << " does not split";
    // d = 64 does not split (kSplits): the same shape there asks for v15's workspace.
    const AttentionShape d64 = make_shape(1, 34, 17, 2100, 1024, 64, false);  // 34 steps: k = 4 by the count
    EXPECT_GT(hopper_backward::split_pieces(136, 132, 34), 1);
    EXPECT_EQ(r.backward_workspace_bytes(d64, DType::BF16), v15->backward_workspace_bytes(d64, DType::BF16));
  } else {
    std::cout << "[   NOTE   ] this GPU has " << gpu::sm_count() << " SMs, not 132: some of these shapes may not "
              << "split here, and where they do not, this test checks v15's path again\n";
  }
}

TEST(HopperBackward, SplitTailGpuGradientsMatchTheOracleAndTheTwin) {
  FL_RUNG_OR_SKIP(r, kSplitTail, Backend::Cuda);
  expect_split_on_132_sms(*r);
  // Each shape once, the dtypes taking turns (the split does not depend on the dtype).
  uint64_t seed = base_seed() + 4000;
  int n = 0;
  for (const AttentionShape& s : split_tail_shapes())
    expect_gpu_backward_matches_oracle_and_twin(kSplitTail, n++ % 2 ? DType::BF16 : DType::F16, s, seed += 2);
}

// The pieces' dK and dV are added in piece order, whichever piece comes last: the default mode
// gives the same bits of dK and dV on every run of a split shape (dQ's additions still arrive in
// an order that changes from run to run, as in v15).
TEST(HopperBackward, SplitTailGivesTheSameDkAndDvBitsEveryRun) {
  FL_RUNG_OR_SKIP(r, kSplitTail, Backend::Cuda);
  expect_split_on_132_sms(*r);
  uint64_t seed = base_seed() + 5000;
  const AttentionShape s = split_tail_shapes()[0];
  const DType t = DType::BF16;
  SCOPED_TRACE(s.str() + " seed=" + std::to_string(seed));
  const Inputs in = make_inputs(s, t, seed++);
  const BackwardInputs bin = make_backward_inputs(s, t, in, seed++);
  const BackwardOutputs first = run_backward(*r, s, t, in, bin, nullptr, false);
  int differ = 0;
  for (int run = 1; run < 10; ++run) {
    const BackwardOutputs again = run_backward(*r, s, t, in, bin, nullptr, false);
    differ += !same_bits(first.dk, again.dk) || !same_bits(first.dv, again.dv);
  }
  EXPECT_EQ(differ, 0) << differ << " of 9 runs differ from the first in some bit of dK or dV";
}

// v17_lean_steps moves bookkeeping out of the consumers' step at d = 128 (at d = 64 its kernels are
// v16's, so those shapes check the dispatch) and changes no arithmetic: in the
// deterministic mode (dQ added in a fixed order) its dQ, dK and dV are v16's to the bit, on shapes
// that put the mask's edges everywhere they fall (the oracle shapes: ragged, causal with Nq above
// and below Nk, GQA, a 200-key block) in both dtypes; in the default mode its dK and dV are v16's
// on a split shape (the pieces add in piece order; dQ's atomics arrive in a changing order).
TEST(HopperBackward, LeanStepsGiveV16sBits) {
  FL_RUNG_OR_SKIP(mine, "09_hopper_backward/v17_lean_steps", Backend::Cuda);
  FL_RUNG_OR_SKIP(v16, kSplitTail, Backend::Cuda);
  uint64_t seed = base_seed() + 6000;
  for (DType t : {DType::F16, DType::BF16})
    for (const AttentionShape& s : shapes()) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + s.str() + " seed=" + std::to_string(seed));
      const Inputs in = make_inputs(s, t, seed++);
      const BackwardInputs bin = make_backward_inputs(s, t, in, seed++);
      const BackwardOutputs a = run_backward(*mine, s, t, in, bin, nullptr, true);
      const BackwardOutputs b = run_backward(*v16, s, t, in, bin, nullptr, true);
      EXPECT_TRUE(same_bits(a.dq, b.dq)) << "dQ differs from v16's";
      EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dK differs from v16's";
      EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dV differs from v16's";
    }
  expect_split_on_132_sms(*mine);
  const AttentionShape s = split_tail_shapes()[0];
  SCOPED_TRACE("default mode, split: " + s.str() + " seed=" + std::to_string(seed));
  const Inputs in = make_inputs(s, DType::BF16, seed++);
  const BackwardInputs bin = make_backward_inputs(s, DType::BF16, in, seed++);
  const BackwardOutputs a = run_backward(*mine, s, DType::BF16, in, bin, nullptr, false);
  const BackwardOutputs b = run_backward(*v16, s, DType::BF16, in, bin, nullptr, false);
  EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dK differs from v16's";
  EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dV differs from v16's";
}

// v16's split on the host: where it splits and into how many pieces (132 SMs: the grid's
// non-causal cells at N >= 4096, 2048 K/V blocks with 68 left, k = 3 by the count at both head
// dims, though only d = 128's kernel splits (kSplits); 1 × 34 × 4096 at d = 128, 1088 with 32
// left, k = 4; whole waves, too few steps a piece (N = 1024), or a tail too long to gain enough:
// no split), and for any shape that every piece's steps, walked from its start, cover each step of
// the K/V block once and start where the whole walk would be.
TEST(HopperBackward, SplitTailPlanSplitsWhereTheTailPays) {
  EXPECT_EQ(hopper_backward::split_pieces(2048, 132, 64), 3);   // d = 128: 4096 / 64 Q blocks a K/V block
  EXPECT_EQ(hopper_backward::split_pieces(2048, 132, 32), 3);   // d = 64
  EXPECT_EQ(hopper_backward::split_pieces(1088, 132, 64), 4);
  EXPECT_EQ(hopper_backward::split_pieces(1056, 132, 64), 1);   // whole waves
  EXPECT_EQ(hopper_backward::split_pieces(132, 132, 64), 1);    // one wave
  EXPECT_EQ(hopper_backward::split_pieces(100, 132, 64), 1);    // less than one
  EXPECT_EQ(hopper_backward::split_pieces(2048, 132, 16), 1);   // N = 1024, d = 128: pieces of 5 steps
  EXPECT_EQ(hopper_backward::split_pieces(2048, 132, 8), 1);    // N = 1024, d = 64
  EXPECT_EQ(hopper_backward::split_pieces(136, 132, 15), 1);    // a piece would have fewer than 8 steps
  EXPECT_EQ(hopper_backward::split_pieces(136, 132, 16), 2);
  EXPECT_EQ(hopper_backward::split_pieces(136, 132, 26), 3);
  EXPECT_EQ(hopper_backward::split_pieces(136, 132, 36), 4);
  EXPECT_EQ(hopper_backward::split_pieces(263, 132, 64), 1);    // 131 left: no k brings the tail to 0.8
  for (int64_t sms = 1; sms <= 140; ++sms)
    for (int64_t units = 1; units <= 3 * sms; ++units)
      if (const int k = hopper_backward::split_pieces(units, sms, 32); k > 1) {
        EXPECT_TRUE(k <= 4 && 32 / k >= hopper_backward::kMinPieceSteps && units > sms && units % sms > 0);
        EXPECT_LE(5 * ((units % sms * k + sms - 1) / sms), 4 * k) << units << " on " << sms;
      }
}

TEST(HopperBackward, SplitTailPiecesCoverEveryStepOnceFromWhereTheWalkIs) {
  for (int n_ib = 1; n_ib <= 11; ++n_ib)
    for (int group = 1; group <= 5; ++group)
      for (int rot = 0; rot < n_ib; ++rot)
        for (int k = 2; k <= 4; ++k) {
          const int steps = group * n_ib;
          if (steps / k < 1) continue;
          SCOPED_TRACE("n_ib " + std::to_string(n_ib) + ", group " + std::to_string(group) + ", rot " +
                       std::to_string(rot) + ", k " + std::to_string(k));
          // The whole walk, as the kernel's next(): (h, ib) of every step.
          std::vector<std::pair<int, int>> walk;
          for (int h = 0, ib = rot, i = 0; i < steps; ++i) {
            walk.push_back({h, ib});
            ib = ib + 1 < n_ib ? ib + 1 : 0;
            h = ib == rot ? h + 1 : h;
          }
          int at = 0;  // the pieces in order cover the walk in order
          for (int piece = 0; piece < k; ++piece) {
            const hopper_backward::PieceStart p = hopper_backward::piece_start(piece, k, steps, n_ib, rot);
            ASSERT_GE(p.steps, 0);
            if (p.steps > 0) {
              EXPECT_EQ(std::make_pair(p.h, p.ib), walk[at]) << "piece " << piece;
            }
            at += p.steps;
          }
          EXPECT_EQ(at, steps);
        }
}

// v6's launch order in the deterministic mode, for group sizes any GPU may give: every (pair, rank)
// is taken by exactly one block, and the block a block waits for at every Q block (its pair's
// rank − 1) was launched before it, so that a full GPU cannot hang on a block not yet started.
TEST(HopperBackward, RanksFirstLaunchOrderIsAPermutationThatWaitsOnlyBackwards) {
  for (int n_kv = 1; n_kv <= 9; ++n_kv)
    for (uint64_t pairs = 1; pairs <= 13; ++pairs)
      for (int group = 1; group <= 15; ++group) {
        SCOPED_TRACE("n_kv " + std::to_string(n_kv) + ", pairs " + std::to_string(pairs) + ", group " +
                     std::to_string(group));
        std::vector<int64_t> launched(std::size_t(n_kv) * pairs, -1);  // [pair][rank]: its launch index
        for (uint64_t at = 0; at < launched.size(); ++at) {
          const hopper_backward::LaunchSlot s = hopper_backward::ranks_first_slot(at, n_kv, pairs, group);
          ASSERT_LT(s.rank, unsigned(n_kv));
          ASSERT_LT(s.pair, pairs);
          int64_t& slot = launched[s.pair * n_kv + s.rank];
          ASSERT_EQ(slot, -1) << "pair " << s.pair << " rank " << s.rank << " taken twice";
          slot = int64_t(at);
        }
        for (uint64_t p = 0; p < pairs; ++p)
          for (int r = 1; r < n_kv; ++r)
            EXPECT_LT(launched[p * n_kv + r - 1], launched[p * n_kv + r]) << "pair " << p << " rank " << r;
      }
}

// A version without the mode refuses it before any work, naming the versions that have it.
TEST(HopperBackward, RefusesTheDeterministicModeWhereItHasNone) {
  const AttentionShape s = make_shape(1, 2, 2, 64, 64, 64, false);
  for (const hopper_backward::VersionInfo& v : hopper_backward::kVersions) {
    const Rung* r = Registry::instance().find(v.name, Backend::Cuda);
    if (!r) GTEST_SKIP() << "no CUDA build: " << v.name << " has no kernel here";
    EXPECT_EQ(r->caps().deterministic_backward, v.deterministic) << v.name;
    if (v.deterministic || !r->unavailable().empty()) continue;
    int dummy = 0;
    BackwardArgs a;
    a.q = a.k = a.v = a.o = a.dout = &dummy;
    a.lse = reinterpret_cast<const float*>(&dummy);
    a.dq = a.dk = a.dv = a.workspace = &dummy;
    a.deterministic = true;
    try {
      r->check(s, DType::BF16, a);
      ADD_FAILURE() << v.name << " accepted the deterministic mode";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("v2_deterministic"), std::string::npos) << e.what();
    }
  }
}

// The twins' backward traffic is rung 07's closed form with B_c = 128.
TEST(HopperBackward, TwinBackwardTrafficMatchesClosedForm) {
  uint64_t seed = base_seed() + 3000;
  for (const AttentionShape& s : {make_shape(1, 2, 1, 100, 130, 64, true), make_shape(2, 2, 2, 129, 257, 128, false),
                                  make_shape(1, 4, 2, 70, 200, 64, true)})
    for (const hopper_backward::VersionInfo& v : hopper_backward::kVersions) {
      SCOPED_TRACE(std::string(v.name) + " " + s.str());
      const Rung* twin = Registry::instance().find(v.name, Backend::Cpu);
      ASSERT_NE(twin, nullptr);
      const Inputs in = make_inputs(s, DType::BF16, seed++);
      const BackwardInputs bin = make_backward_inputs(s, DType::BF16, in, seed++);
      IoCounter io;
      run_backward(*twin, s, DType::BF16, in, bin, &io);
      const IoModel m = backward::io_model(s, DType::BF16, hopper_backward::kBc);
      EXPECT_EQ(double(io.read), m.read);
      EXPECT_EQ(double(io.written), m.written);
      EXPECT_EQ(twin->modelled_backward_io(s, DType::BF16).read, m.read);
    }
}

// The workspace: rung 07's (D, dQ's fp32 accumulator), then a turn counter per (b, h, Q block).
TEST(HopperBackward, WorkspaceIsRung07sPlusATurnCounterPerQBlock) {
  const AttentionShape s = make_shape(2, 16, 4, 1000, 3000, 128, true);
  const Rung* twin = Registry::instance().find(hopper_backward::kVersions[0].name, Backend::Cpu);
  ASSERT_NE(twin, nullptr);
  const std::size_t rung07 = backward::workspace_bytes(s, backward::Precision::TensorCore);
  EXPECT_EQ(hopper_backward::turn_offset(s) % 256, 0u);
  EXPECT_GE(hopper_backward::turn_offset(s), rung07);
  EXPECT_EQ(twin->backward_workspace_bytes(s, DType::BF16), hopper_backward::turn_offset(s) + 2 * 16 * 16 * sizeof(int));
}

// Off Hopper every check refuses with what the rung needs; on it, nothing is refused for that.
TEST(HopperBackward, RefusesWhereWgmmaCannotRunAndSaysWhy) { expect_refused_where_unavailable(version_names()); }

}  // namespace
}  // namespace fl::testing
