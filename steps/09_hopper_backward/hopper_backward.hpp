// Rung 09: the backward pass on Hopper's own instructions (sm_90a). Rung 07 builds the backward by
// recomputation on mma.sync, which every GPU from sm_80 runs; this rung moves it onto warpgroup
// MMA and the machinery rung 08 taught for the forward, one idea a version
// (docs/09_hopper_backward.md):
//   v1_wgmma          rung 07's v4 step on warpgroup MMA: every product one wgmma per 16-deep
//                     slice, its operands read from shared memory by descriptor (P and dS from
//                     registers); dQ added to an fp32 accumulator with atomics, as in rung 07.
//   v2_deterministic  v1 with a deterministic mode: the K/V blocks add to each Q block's rows of
//                     dQ one after another in a fixed order, handed on by a counter per Q block,
//                     so the same inputs give the same bits on every run.
//   v3_dq_writer      v2 with a warp of its own for dQ (warp specialization): the others stage
//                     their dQ share in shared memory, the writer adds it with bulk reductions
//                     and, in the deterministic mode, waits for the turns while they go on.
//   v4_descriptors    v3 with the wgmma descriptors built once before the loop and advanced by
//                     constants, not rebuilt from addresses at every product.
//   v5_two_writers    v4 with a writer warp per staging tile (two at d = 64): one writer's wait
//                     for its additions to land no longer holds up the next step's.
//   v6_ranks_first    v5 whose deterministic mode launches its blocks rank by rank in the order of
//                     turns, across a group of heads that fills the GPU, so that the blocks' stagger
//                     carries over from one group to the next.
//   v7_tma_loads      v6 whose Q, dO, L and D are loaded by a warp of their own (Q and dO by TMA),
//                     not by the warps that multiply.
//   v8_k_in_place     v7 whose dQ product reads K where it is (MN-major), with no transposed copy;
//                     the room it took gives d = 128 a second dQ staging tile and writer.
//   v9_dk_in_flight   v8 whose step ends with dK's product still running (dQ committed before
//                     it), under the dQ staging and the next step's start.
//   v10_three_tiles   v9 with three dQ staging tiles and writers at d = 64: the warps that multiply
//                     run a step further ahead of the deterministic mode's turns.
//   v11_tall_q_blocks v10 with Q blocks of 128 rows at d = 64 (64 at d = 128): twice the products
//                     for each step's fixed costs, and wider wgmma.
//   v12_bulk_epilogue v11 whose dK and dV leave through shared memory, a row per bulk copy, not
//                     4 bytes a thread at a time.
//   v13_stmatrix      v12 whose dSᵀ goes to shared memory by stmatrix, four 8 × 8 tiles an
//                     instruction, not a 4-byte store per pair.
//   v14_tensor_adds   v13 whose writers add dQ at d = 64 by TMA tensor reductions, one a panel of
//                     8 columns (8 a step), not a bulk reduction per pair of rows (64).
//   v15_rotated_stores v14 whose warps store dQ's share at d = 128 without bank conflicts: odd
//                     rows store their column groups in a rotated order.
//   v16_split_tail    v15 whose last wave's K/V blocks, not causal and not in the deterministic
//                     mode, are cut into pieces along their Q steps, so that no SM idles at the end.
//   v17_lean_steps    v16 whose consumers' step, at d = 128, does less integer bookkeeping: the
//                     warpgroup known to be warp-uniform, buffer and phase carried, offsets and the
//                     mask's steps worked out once (rung 08's v17 for the backward); at d = 64 v16's.
//
// The algorithm, the numerics, the CPU twin and the IO model are rung 07's (its tensor-core
// versions' twin with this rung's block of 128 keys); the forward these versions pair with is
// rung 08's fastest version.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>

#include "../07_backward_recompute/backward_recompute.hpp"
#include "../08_hopper_forward/hopper_forward.hpp"
#include "../../common/host_device.hpp"

namespace fl::hopper_backward {

enum class Version { V1Wgmma, V2Deterministic, V3DqWriter, V4Descriptors, V5TwoWriters, V6RanksFirst, V7TmaLoads, V8KInPlace, V9DkInFlight,
                     V10ThreeTiles, V11TallQBlocks, V12BulkEpilogue, V13Stmatrix, V14TensorAdds, V15RotatedStores,
                     V16SplitTail, V17LeanSteps };

struct VersionInfo {
  Version version;
  const char* name;
  const char* idea;
  bool deterministic;  // runs BackwardArgs::deterministic
};
inline constexpr VersionInfo kVersions[] = {
    {Version::V1Wgmma, "09_hopper_backward/v1_wgmma",
     "rung 07's backward step on Hopper's warpgroup MMA: operands read from shared memory by descriptor (sm_90a)",
     false},
    {Version::V2Deterministic, "09_hopper_backward/v2_deterministic",
     "v1 + a deterministic mode: K/V blocks add to dQ in a fixed order, handed on by a counter per Q block", true},
    {Version::V3DqWriter, "09_hopper_backward/v3_dq_writer",
     "v2 + a warp of its own adds dQ (bulk reductions from a staging tile, a pair of rows each) and waits for the "
     "turns",
     true},
    {Version::V4Descriptors, "09_hopper_backward/v4_descriptors",
     "v3 + the wgmma descriptors built once and advanced by constants (rung 08's v7 idea)", true},
    {Version::V5TwoWriters, "09_hopper_backward/v5_two_writers",
     "v4 + a writer warp per staging tile (two at d = 64): one writer's wait for its additions to land no longer "
     "holds up the next step's",
     true},
    {Version::V6RanksFirst, "09_hopper_backward/v6_ranks_first",
     "v5 + the deterministic mode launches its blocks rank by rank across a group of heads that fills the GPU, so "
     "their stagger carries over from one group to the next",
     true},
    {Version::V7TmaLoads, "09_hopper_backward/v7_tma_loads",
     "v6 + Q, dO, L and D loaded by a warp of their own (Q and dO by TMA), not by the warps that multiply", true},
    {Version::V8KInPlace, "09_hopper_backward/v8_k_in_place",
     "v7 + dQ reads K where it is (an MN-major operand), no transposed copy; the room gives d = 128 a second dQ "
     "staging tile and writer",
     true},
    {Version::V9DkInFlight, "09_hopper_backward/v9_dk_in_flight",
     "v8 + dK committed after dQ and left running across the step's end, under the dQ staging and the next "
     "step's start",
     true},
    {Version::V10ThreeTiles, "09_hopper_backward/v10_three_tiles",
     "v9 + three dQ staging tiles and writer warps at d = 64 (two at d = 128, where shared memory has no room): "
     "the warps that multiply run a step further ahead of the deterministic mode's turns",
     true},
    {Version::V11TallQBlocks, "09_hopper_backward/v11_tall_q_blocks",
     "v10 + Q blocks of 128 rows at d = 64 (FlashAttention-3's step there): twice the products for each step's "
     "barriers, waits and turns, Sᵀ and dPᵀ one n128 wgmma, dQ one n64 a warpgroup; two staging tiles",
     true},
    {Version::V12BulkEpilogue, "09_hopper_backward/v12_bulk_epilogue",
     "v11 + dK and dV written through shared memory and stored a row per bulk copy (whole sectors), not 4 bytes "
     "a thread from the accumulators",
     true},
    {Version::V13Stmatrix, "09_hopper_backward/v13_stmatrix",
     "v12 + dSᵀ stored to shared memory by stmatrix, four 8 x 8 tiles an instruction (4 a step at d = 128, 8 at "
     "d = 64), not a 4-byte store a tile a thread",
     true},
    {Version::V14TensorAdds, "09_hopper_backward/v14_tensor_adds",
     "v13 + dQ added at d = 64 by TMA tensor reductions from a staging tile in panels of 8 columns, 8 a step, not "
     "64 bulk reductions of two rows: the copy engine pays per operation, and the mode's turns wait for it",
     true},
    {Version::V15RotatedStores, "09_hopper_backward/v15_rotated_stores",
     "v14 + dQ's share stored at d = 128 without bank conflicts: a thread of an odd row writes its column groups "
     "two blocks on (16 banks), where the two rows of a staging pair, d floats apart, met in the same banks",
     true},
    {Version::V16SplitTail, "09_hopper_backward/v16_split_tail",
     "v15 + not causal and not deterministic, the last wave's K/V blocks cut into 2-4 pieces along their Q steps, "
     "one a thread block; each piece's dK and dV to a slot, the last piece adds them in piece order and stores",
     true},
    {Version::V17LeanSteps, "09_hopper_backward/v17_lean_steps",
     "v16 + at d = 128, the consumers' step with less integer bookkeeping: the warpgroup warp-uniform "
     "(descriptors without R2UR), buffer and phase carried, this thread's offsets and the mask's steps worked "
     "out once a tile (at d = 64 the same changes lose, one of them 6 %: v16's code there)",
     true},
};
constexpr const VersionInfo& info(Version v) { return kVersions[int(v)]; }
static_assert(int(Version::V17LeanSteps) + 1 == int(std::size(kVersions)), "a VersionInfo for every version, in order");
// The newest version, the rung's fastest (chapter 09's tables): rung 11's backward step.
// v17 is 1.00–1.09× v16 at d = 128 and v16's code at d = 64 (run 148, H200).
inline constexpr const char* kNewest = kVersions[std::size(kVersions) - 1].name;

// Keys per K/V block, every version: two warpgroups of 64 keys. Query rows per step: rung 07's kBr.
inline constexpr int64_t kBc = 128;

// The forward the versions pair with (the ladder's and the C ABI's forward of a backward rung).
inline constexpr const char* kForward = hopper::kNewest;

// v6's launch order in the deterministic mode: block `at` of the grid (in launch order, of
// n_kv · pairs) takes rank `rank` in the order of turns (rank 0: the last K/V block, which adds
// first) of (batch, KV head) pair `pair`. The pairs go in groups of group_heads; within a group,
// rank 0 of each pair, then rank 1, ... So every block's predecessor in the order (its pair's rank
// − 1) has a smaller launch index. A function of its own so that the CPU tests check it for any
// group size, not only the one the test machine's SM count gives.
struct LaunchSlot {
  unsigned rank;
  uint64_t pair;
};
FL_HOST_DEVICE inline LaunchSlot ranks_first_slot(uint64_t at, int n_kv, uint64_t pairs, int group_heads) {
  const uint64_t per_group = uint64_t(group_heads) * n_kv, first = at / per_group * group_heads;
  const uint64_t size = pairs - first < uint64_t(group_heads) ? pairs - first : uint64_t(group_heads);
  const uint64_t in = at % per_group;
  return {unsigned(in / size), first + in % size};
}

// v16's split of the last wave (not causal, the default mode, d = 128): `units` K/V blocks of
// `steps` steps each on `sms` SMs leave r = units mod sms for a last wave; each is cut into k
// pieces, k of 2, 3 or 4 with at least kMinPieceSteps steps a piece, the one whose pieces' waves
// take the least time, ceil(r·k / sms) / k of a K/V block's (the smaller k on a tie), and only
// where that is at most 0.8 of one (a piece's fixed costs are not worth less). 1: no split.
// Functions of their own, as ranks_first_slot, so that the CPU tests check them for any shape and
// SM count. A piece's fixed costs (K and V loaded again, its Q pipeline started, its slot written
// and read) want steps to repay them: pieces of 5 steps (N = 1024, d = 128, k = 3) ran at 0.99x
// v15 in runs 122 and 123, pieces of 21 and more (N >= 4096) level or ahead.
inline constexpr int kMinPieceSteps = 8;
FL_HOST_DEVICE inline int split_pieces(int64_t units, int64_t sms, int64_t steps) {
  if (sms <= 0 || units <= sms || units % sms == 0) return 1;
  const int64_t left = units % sms;
  int k = 1;
  int64_t best = 0;  // the tail is best / k of a K/V block's time
  for (int kk = 2; kk <= 4; ++kk) {
    const int64_t waves = (left * kk + sms - 1) / sms;
    if (steps / kk >= kMinPieceSteps && (k == 1 || waves * k < best * kk)) k = kk, best = waves;
  }
  return k > 1 && 5 * best <= 4 * int64_t(k) ? k : 1;
}
// Piece `piece` of k of a K/V block's walk of `steps` steps over n_ib Q blocks from Q block rot:
// steps [piece·steps / k, (piece+1)·steps / k), and the step it starts at, (h, ib) = (s0 / n_ib,
// (rot + s0 mod n_ib) mod n_ib), where the walk (Q blocks rot, rot + 1, ... mod n_ib, the next
// head after n_ib) is after s0 steps.
struct PieceStart {
  int steps, h, ib;
};
FL_HOST_DEVICE inline PieceStart piece_start(int piece, int k, int steps, int n_ib, int rot) {
  const int s0 = int(int64_t(piece) * steps / k), s1 = int(int64_t(piece + 1) * steps / k);
  return {s1 - s0, s0 / n_ib, (rot + s0 % n_ib) % n_ib};
}

// Device memory the backward adds: rung 07's (D, then dQ's fp32 accumulator), then one 32-bit turn
// counter per (batch, query head, Q block of kBr rows), used by the deterministic mode.
std::size_t workspace_bytes(const AttentionShape& s);
std::size_t turn_offset(const AttentionShape& s);

Capabilities capabilities(Version v);

// A version's kernel launcher (CUDA builds only; each version file registers its own), and why
// the kernels cannot run on this machine (empty when they can).
using KernelFn = void (*)(Version, const AttentionShape&, DType, const BackwardArgs&);
using WhyNotFn = std::string (*)();
using WorkspaceFn = std::size_t (*)(const AttentionShape&, DType);  // a version's backward workspace; null: the rung's

// One version on either backend: rung 07's twin with B_c = 128 (hopper_backward.cpp registers one
// per version), or the version's kernels. The forward is rung 08's (kForward), on the same backend.
template <Backend B>
class HopperBackwardRung final : public Rung {
 public:
  explicit HopperBackwardRung(Version v, KernelFn kernel = nullptr, WhyNotFn why_not = nullptr,
                              WorkspaceFn workspace = nullptr)
      : v_(v), kernel_(kernel), why_not_(why_not), workspace_(workspace) {}
  std::string name() const override { return info(v_).name; }
  std::string idea() const override { return info(v_).idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(v_); }
  std::string unavailable() const override { return why_not_ ? why_not_() : std::string(); }
  std::size_t workspace_bytes(const AttentionShape& s, DType t) const override {
    return forward_rung().workspace_bytes(s, t);
  }
  // The rung's workspace, or a version's own (v16's split tail, sized for the current GPU's SM
  // count) where it has one and its kernels can run here.
  std::size_t backward_workspace_bytes(const AttentionShape& s, DType t) const override {
    return workspace_ && unavailable().empty() ? workspace_(s, t) : hopper_backward::workspace_bytes(s);
  }
  IoModel modelled_backward_io(const AttentionShape& s, DType t) const override { return backward::io_model(s, t, kBc); }
  IoModel modelled_io(const AttentionShape& s, DType t) const override { return forward_rung().modelled_io(s, t); }
  void forward(const AttentionShape& s, DType t, const ForwardArgs& a) const override {
    forward_rung().forward(s, t, a);
  }
  void backward(const AttentionShape& s, DType t, const BackwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) backward::twin_backward(s, t, a, kBc);
    else kernel_(v_, s, t, a);
  }

 private:
  const Rung& forward_rung() const {
    const Rung* r = Registry::instance().find(kForward, backend());
    if (!r) throw InputError("rung " + label() + " pairs with the forward of " + kForward + ", which this build lacks");
    return *r;
  }
  Version v_;
  KernelFn kernel_;
  WhyNotFn why_not_;
  WorkspaceFn workspace_;
};

}  // namespace fl::hopper_backward
