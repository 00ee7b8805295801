// Rung 08: the forward pass on Hopper's own instructions (sm_90a), FlashAttention-3's road. Rung 06
// runs FlashAttention-2 on mma.sync, the tensor-core instruction Ampere introduced: one warp, its
// operands in registers, loaded there by ldmatrix. On an H100 that reaches about a third of the
// tensor cores' peak. Hopper adds `wgmma`, a warpgroup's (4 warps') multiply that reads its
// operands from shared memory by descriptor and runs asynchronously, and the tensor memory
// accelerator (TMA), a copy engine that moves whole tiles on one thread's word. This rung rebuilds
// rung 06's kernel on them, one idea a version (docs/08_hopper_forward.md):
//   v1_wgmma     the two products as wgmma: S = Q·Kᵀ from shared memory (both operands by
//                descriptor), O += P·V with P from registers; two warpgroups of 64 query rows;
//                K/V by cp.async into two buffers, as rung 06's v9.
//   v2_overlap   the softmax of block j runs while the tensor cores do P·V of block j − 1: S_j
//                and P_{j−1} V_{j−1} issued together, waited for one at a time; three K/V buffers.
//   v3_tma       the tiles copied by the tensor memory accelerator, one thread's instruction a
//                panel, completing on mbarriers; no block-wide barrier left in the loop.
//   v4_warp_specialized  a producer warpgroup issues the copies, two consumer warpgroups only
//                multiply; registers moved from the one to the others with setmaxnreg.
//   v5_persistent  one thread block an SM, walking tile after tile: the next tile's Q and K/V
//                are fetched while the consumers finish the last one; tiles in pairs of equal
//                causal work.
//   v6_wide_qk   S = Q·Kᵀ one wgmma 128 keys wide per k-step instead of two 64 wide: Q's slice
//                read from shared memory once, not twice (shared memory's bandwidth).
//   v7_descriptors  the wgmma descriptors built once and advanced by constants: fewer
//                instructions a step.
//   v8_short_chains  at d = 128, each row's maximum and sum over four running partials, not
//                one: the softmax's dependency chains a quarter as long.
//   v9_three_consumers  at d = 64, three consumer warpgroups (192 query rows a tile), not two: a
//                third stream of products for the tensor cores while two consumers do softmax;
//                and, there, a walk that deals single tiles, not pairs (finer shares of the grid).
//   v10_end_aligned  at d = 64, a head's 192-row tiles counted from its last row: the partial
//                tile is the first one, which under the causal mask sees the fewest keys.
//   v11_tma_store  at d = 128, O through shared memory (stmatrix) and out by one TMA store a
//                panel, in the K buffer of the tile's last block, instead of 4-byte stores.
//   v12_split_kv  K and V handed back to the producer apart: K once its Q·Kᵀ is done, a step
//                before its V, so the next K is fetched earlier.
//   v13_split_tail  not causal, the walk's last round split along the keys over every block
//                where that saves enough, the pieces' partial results added by each tile's last.
//   v14_flat_tiles  at d = 64, not causal, where a head's 192-row tiles leave many rows past its
//                end (N = 1024), tiles cut from all heads' rows at once.
//   v15_consumer_ends  causal, at d = 64, each consumer stops at its own rows' last key block
//                instead of its tile's.
//   v16_half_ends  causal, at d = 64, a consumer's last key block multiplied on its first 64 keys
//                alone where its rows see no more, as a step after the loop.
//   v17_lean_steps  the consumer's loop step with less bookkeeping: warp-uniform role, buffer and
//                phase carried, the mask's test and limits worked out once a tile in 32 bits.
//   v18_early_lse  at d = 128, a tile's row sums, 1/ℓ and lse worked out under its last P·V,
//                which they do not need, instead of after it.
//
// The numerics are rung 06's (fp32 accumulation, P rounded to the input type before P·V, O
// rounded once), so its twin is rung 06's numerics twin with this rung's block sizes.
#pragma once

#include <climits>
#include <cstdint>
#include <iterator>
#include <string>

#include "../06_tensor_core_mma/tensor_core_mma.hpp"

namespace fl::hopper {

enum class Version { V1Wgmma, V2Overlap, V3Tma, V4WarpSpecialized, V5Persistent, V6WideQk, V7Descriptors, V8ShortChains,
                     V9ThreeConsumers, V10EndAligned, V11TmaStore, V12SplitKv,
                     V13SplitTail, V14FlatTiles, V15ConsumerEnds, V16HalfEnds, V17LeanSteps, V18EarlyLse };

struct VersionInfo {
  Version version;
  const char* name;
  const char* idea;
};
inline constexpr VersionInfo kVersions[] = {
    {Version::V1Wgmma, "08_hopper_forward/v1_wgmma",
     "warpgroup MMA (sm_90a): S = Q*K^T with both operands read from shared memory by descriptor, "
     "O += P*V with P in registers; two warpgroups of 64 query rows"},
    {Version::V2Overlap, "08_hopper_forward/v2_overlap",
     "v1 + the softmax of block j while the tensor cores do P*V of block j-1 (wgmma left in flight)"},
    {Version::V3Tma, "08_hopper_forward/v3_tma",
     "v2 + tiles copied by TMA (one thread, one instruction a panel) completing on mbarriers, no block barrier"},
    {Version::V4WarpSpecialized, "08_hopper_forward/v4_warp_specialized",
     "v3 + a producer warpgroup for the copies, two consumer warpgroups; registers moved with setmaxnreg"},
    {Version::V5Persistent, "08_hopper_forward/v5_persistent",
     "v4 + a persistent grid (one block an SM walks pairs of row tiles, equal causal work a pair): the next "
     "tile's loads under the last one's end"},
    {Version::V6WideQk, "08_hopper_forward/v6_wide_qk",
     "v5 + S = Q*K^T as one m64n128k16 wgmma a k-step (Q read from shared memory once, not twice)"},
    {Version::V7Descriptors, "08_hopper_forward/v7_descriptors",
     "v6 + the wgmma descriptors built once and advanced by constants (fewer instructions a step)"},
    {Version::V8ShortChains, "08_hopper_forward/v8_short_chains",
     "v7 + at d = 128, each row's maximum and sum over four running partials instead of one (dependency "
     "chains of 8, not 32)"},
    {Version::V9ThreeConsumers, "08_hopper_forward/v9_three_consumers",
     "v8 + at d = 64, three consumer warpgroups of 64 rows (192 a tile) instead of two, registers split "
     "32/160, and a walk of single tiles: a third consumer's products run while two do their softmax"},
    {Version::V10EndAligned, "08_hopper_forward/v10_end_aligned",
     "v9 + at d = 64 the 192-row tiles counted from a head's last row, so that the partial tile is the "
     "first, which the causal mask makes the shortest"},
    {Version::V11TmaStore, "08_hopper_forward/v11_tma_store",
     "v10 + at d = 128, O written to shared memory with stmatrix and stored by TMA, one box a panel, in the "
     "K buffer of the tile's last block, instead of by every thread 4 bytes at a time"},
    {Version::V12SplitKv, "08_hopper_forward/v12_split_kv",
     "v11 + K and V handed back to the producer apart, on mbarriers of their own: K after its Q*K^T, V "
     "after its P*V, so that K is fetched a step further ahead"},
    {Version::V13SplitTail, "08_hopper_forward/v13_split_tail",
     "v12 + without the causal mask, the walk's last round split along the keys over every thread block "
     "where that saves enough (no SM idle at the end); each tile's last piece adds every piece's partial result"},
    {Version::V14FlatTiles, "08_hopper_forward/v14_flat_tiles",
     "v13 + at d = 64 without the mask, where a head's 192-row tiles leave many rows past its end (N = 1024), "
     "tiles cut from all heads' rows at once: a tile may span two heads, whose K and V go to two buffer sets"},
    {Version::V15ConsumerEnds, "08_hopper_forward/v15_consumer_ends",
     "v14 + under the causal mask at d = 64, each consumer of a 192-row tile stops at the last key block its "
     "own 64 rows see instead of the tile's, handing the later blocks' buffers back as they land"},
    {Version::V16HalfEnds, "08_hopper_forward/v16_half_ends",
     "v15 + under the causal mask at d = 64, a consumer's last key block multiplied on its first 64 keys alone "
     "(an n64 Q*K^T, the softmax over 64 scores, half the P*V) where its rows see none of the other 64"},
    {Version::V17LeanSteps, "08_hopper_forward/v17_lean_steps",
     "v16 + the consumer's loop step with less integer bookkeeping on its serial chain: its role warp-uniform, "
     "the buffer and phase carried from step to step, the mask's test and limits worked out once a tile in 32 bits"},
    {Version::V18EarlyLse, "08_hopper_forward/v18_early_lse",
     "v17 + the row sums, 1/l and lse of a d = 128 tile worked out under its last P*V instead of after it"},
};
constexpr const VersionInfo& info(Version v) { return kVersions[int(v)]; }
static_assert(int(Version::V18EarlyLse) + 1 == int(std::size(kVersions)), "a VersionInfo for every version, in order");
// The newest version, the fastest or level with the fastest on every cell of chapter 08's grid:
// v15 was within 0.5 % of the fastest of v7, v14 and v15 (run 132), v16 is v15's code but for
// the causal d = 64 kernels (one a dtype), where it gains (run 138), v17 is 1.01–1.08× v16 on
// every cell (run 142, H200), and v18 is 1.01–1.03× v17 on the d = 128 cells that run its change
// (those that do not split) and v17's code elsewhere (run 151, H200). It is the forward rung 09
// pairs with and rung 11's steps run; a new version moves every one of them by being added last.
inline constexpr const char* kNewest = kVersions[std::size(kVersions) - 1].name;

// Query rows and keys per block, which the twin follows so that its IO count is the kernel's:
// consumer warpgroups of 64 rows each, two (three in v9 at d = 64), 128 keys.
constexpr tensor_core_mma::Tiling tiling(Version v, int64_t d) {
  if (v >= Version::V10EndAligned && d == 64) return {192, 128, 12, 1, true};
  if (v >= Version::V9ThreeConsumers && d == 64) return {192, 128, 12, 1};
  return {128, 128, 8, 1};
}

// v14_flat_tiles: whether a shape's rows suit tiles cut from all heads' rows at once, by the shape
// alone (v14's and v15's launchers also need the walk not to split, which depends on the GPU; v16's
// takes it first and may split it): d = 64 (192-row
// tiles), no mask, Nq a multiple of 64 and at least 128 (a consumer's 64 rows in one head, a
// tile's in at most two), all rows countable in an int, and a head's own tiles multiplying at
// least a tenth more rows than it has (N = 1024: 1152 for 1024; N = 4096: 4224 for 4096, too few
// to pay for an emptier last round).
inline constexpr int64_t kFlatShare = 10;
inline bool flat_tiles_pay(const AttentionShape& s) {
  const tensor_core_mma::Tiling t = tiling(Version::V14FlatTiles, s.head_dim);
  const int64_t rows = s.batch * s.heads * s.seq_q, tiled = (s.seq_q + t.rows - 1) / t.rows * t.rows;
  return s.head_dim == 64 && !s.causal && s.seq_q % 64 == 0 && s.seq_q >= 128 && rows <= INT32_MAX &&
         (tiled - s.seq_q) * kFlatShare >= s.seq_q;
}

inline Capabilities capabilities() {
  Capabilities c;
  c.dtypes = {DType::F16, DType::BF16};
  c.head_dims = {64, 128};
  return c;
}

// A version's kernel launcher (CUDA builds only; each version file registers its own), and why
// the kernels cannot run on this machine (empty when they can: an sm_90 GPU, a build for sm_90a).
using KernelFn = void (*)(Version, const AttentionShape&, DType, const ForwardArgs&);
using WhyNotFn = std::string (*)();
using WorkspaceFn = std::size_t (*)(const AttentionShape&, DType);  // null: none

// One version on either backend: rung 06's numerics twin with this version's tiling
// (hopper_forward.cpp registers one per version), or the version's kernel.
template <Backend B>
class HopperRung final : public Rung {
 public:
  explicit HopperRung(Version v, KernelFn kernel = nullptr, WhyNotFn why_not = nullptr, WorkspaceFn workspace = nullptr)
      : version_(v), kernel_(kernel), why_not_(why_not), workspace_(workspace) {}
  std::string name() const override { return info(version_).name; }
  std::string idea() const override { return info(version_).idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override {
    Capabilities c = capabilities();
    if (workspace_) c.workspace_what = "the partial results and counters of a split last round";
    return c;
  }
  std::string unavailable() const override { return why_not_ ? why_not_() : std::string(); }
  // A kernel's workspace (v13's split walk), sized for the current GPU's SM count; none where the
  // kernel cannot run here.
  std::size_t workspace_bytes(const AttentionShape& s, DType t) const override {
    return workspace_ && unavailable().empty() ? workspace_(s, t) : 0;
  }
  IoModel modelled_io(const AttentionShape& s, DType t) const override {
    return tensor_core_mma::io_model(s, t, tiling(version_, s.head_dim));
  }
  void forward(const AttentionShape& s, DType t, const ForwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) tensor_core_mma::twin_forward(s, t, a, tiling(version_, s.head_dim));
    else kernel_(version_, s, t, a);
  }

 private:
  Version version_;
  KernelFn kernel_;
  WhyNotFn why_not_;
  WorkspaceFn workspace_;
};

}  // namespace fl::hopper
