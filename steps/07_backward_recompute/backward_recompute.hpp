// Rung 07: the backward pass by recomputation. Training needs dQ, dK and dV. Keeping P from the
// forward pass would cost the N×N memory FlashAttention exists to avoid, so the backward pass
// keeps only O and the log-sum-exp L and recomputes P = exp(S − L) one tile at a time:
//
//   D   = rowsum(dO ∘ O)                  (= rowsum(P ∘ dP), one number per query row)
//   dV  = Pᵀ dO        dP = dO Vᵀ          dS = P ∘ (dP − D)
//   dQ  = scale · dS K                     dK = scale · dSᵀ Q
//
// The loop order is FlashAttention-2's backward: K/V blocks outer (dK_j and dV_j stay on chip
// until the block is done), Q blocks inner; dQ_i gets a contribution from every K/V block, so it
// is read, added to and written back on every step (the GPU kernel will use atomics for it).
// Grouped-query attention: dK and dV of a key/value head sum the query heads of its group.
//
// The rung is built as versions, each a file and a registered name (docs/07_backward_recompute.md):
//   07_backward_recompute          the readable fp32 backward on CUDA cores (backward_recompute.cu),
//                                  its forward rung 05's;
//   07_backward_recompute/v1_mma   the same loop on the tensor cores, fp16/bf16 in, fp32 accumulate:
//                                  the five products of a step as mma.sync, dQ added to an fp32
//                                  workspace with atomics and rounded by a last pass (v1_mma.cu);
//   .../v2_eight_warps, v3_kv_regs, v4_2d_tiles: one idea each (their files say which);
//   07_backward_recompute/mma      the fastest of v1..v4: v3 at d = 64, v4 at d = 128 (fastest_version).
// The tensor-core versions' forward is rung 06's v9_one_sync. The same backward on Hopper's own
// instructions (warpgroup MMA, TMA) is rung 09 (steps/09_hopper_backward), which reuses this rung's
// twin, its IO model and the kernel parts in backward_mma.cuh. One CPU twin (backward_recompute.cpp)
// serves every version, with the roundings and the block size of the version it stands for.
#pragma once

#include "../05_fa2_loop_order/fa2_loop_order.hpp"
#include "../06_tensor_core_mma/tensor_core_mma.hpp"

#include <iterator>

namespace fl::backward {

// Query rows per step: the twin's, its IO model's and every kernel's but v4's at d = 64, which
// steps 128 rows at a time (its own Cfg::BR).
inline constexpr int64_t kBr = 64;

enum class Version { Fp32, V1Mma, V2EightWarps, V3KvRegs, V4Tiles2d, Fastest };
enum class Precision { Fp32, TensorCore };

struct VersionInfo {
  Version version;
  const char* name;
  const char* idea;
  int64_t block_keys;  // keys per K/V block (B_c): the kernel's, which the twin and the IO model follow
};
inline constexpr VersionInfo kVersions[] = {
    {Version::Fp32, "07_backward_recompute",
     "dQ, dK, dV from Q, K, V, O, dO and lse only: P recomputed tile by tile, D = rowsum(dO*O)", 64},
    {Version::V1Mma, "07_backward_recompute/v1_mma",
     "the backward on the tensor cores: five mma.sync products per step, 4 warps of 16 keys, fp32 dQ by atomics", 64},
    {Version::V2EightWarps, "07_backward_recompute/v2_eight_warps",
     "v1 with 8 warps, 128 keys per block: half the dQ atomics and Q/dO tile loads per key", 128},
    {Version::V3KvRegs, "07_backward_recompute/v3_kv_regs",
     "v2 with K and V A-fragments held in registers for the whole block (d = 64)", 128},
    {Version::V4Tiles2d, "07_backward_recompute/v4_2d_tiles",
     "v3's step with each product given its own 4x2 warp layout; P and dS through shared memory", 128},
    {Version::Fastest, "07_backward_recompute/mma",
     "the fastest tensor-core version: v3_kv_regs at d = 64, v4_2d_tiles at d = 128", 128},
};
constexpr const VersionInfo& info(Version v) { return kVersions[int(v)]; }
static_assert(int(Version::Fastest) + 1 == int(std::size(kVersions)), "a VersionInfo for every version, in order");
constexpr Precision precision(Version v) { return v == Version::Fp32 ? Precision::Fp32 : Precision::TensorCore; }

inline constexpr const char* kName = kVersions[0].name;
inline constexpr const char* kMmaName = info(Version::Fastest).name;

// The forward the tensor-core versions pair with: rung 06's fastest version.
inline constexpr tensor_core_mma::Version kMmaForward = tensor_core_mma::Version::V9OneSync;

// The device memory the backward adds, linear in N: D (B·H·Nq fp32); the tensor-core version adds
// dQ's fp32 accumulator (B·H·Nq·d), after D at a 256-byte boundary.
std::size_t workspace_bytes(const AttentionShape& s, Precision p);
std::size_t dq_accum_offset(const AttentionShape& s);

// Bytes the backward moves, counted over the blocks its loops visit (elements of the call's
// dtype; L, D and dQ's accumulator fp32):
//   per query head, once:  O and dO read (D = rowsum(dO ∘ O)), D written, dQ (fp32) zeroed;
//   per K/V block:         K_j, V_j read, dK_j, dV_j written;
//   per visible (i, j):    Q_i, dO_i, L_i, D_i read, dQ_i read and written back (fp32);
//   16-bit only, at the end: dQ's accumulator read, dQ written in the dtype.
// Non-causal that is Θ(Nq·d + Nk·d + Tc·Nq·d) per head: the dQ round trips play the part the
// O round trips played in rung 04.
IoModel io_model(const AttentionShape& s, DType t, int64_t block_keys);

Capabilities capabilities(Precision p);

// The CPU twin of the backward pass, counting its traffic into a.io when set. fp32: dQ accumulates
// in place. fp16/bf16: the tensor-core kernel's roundings (P and dS rounded to the dtype before
// the products they feed, dQ accumulated in fp32 in the workspace, dK, dV, dQ rounded once).
void twin_backward(const AttentionShape& s, DType t, const BackwardArgs& a, int64_t block_keys);

// The version 07_backward_recompute/mma runs for this head dim (CUDA builds only).
Version fastest_version(int64_t head_dim);

// A version's backward kernels (CUDA builds only): backward_recompute.cu and each tensor-core
// version file define one and register it under the version's name.
using BackwardKernelFn = void (*)(Version, const AttentionShape&, DType, const BackwardArgs&);

// One version on either backend: the twin (backward_recompute.cpp registers one per version), or
// the version's kernels (its file registers them). The forward is the earlier rung's (this rung's
// subject is the backward pass): rung 05's for fp32, rung 06 v9_one_sync's for 16 bits.
template <Backend B>
class BackwardRung final : public Rung {
 public:
  explicit BackwardRung(Version v, BackwardKernelFn kernel = nullptr) : v_(v), kernel_(kernel) {}
  std::string name() const override { return info(v_).name; }
  std::string idea() const override { return info(v_).idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(precision(v_)); }
  std::size_t backward_workspace_bytes(const AttentionShape& s, DType) const override {
    return backward::workspace_bytes(s, precision(v_));
  }
  IoModel modelled_backward_io(const AttentionShape& s, DType t) const override {
    return io_model(s, t, info(v_).block_keys);
  }
  IoModel modelled_io(const AttentionShape& s, DType t) const override { return forward_rung().modelled_io(s, t); }
  void forward(const AttentionShape& s, DType t, const ForwardArgs& a) const override {
    forward_rung().forward(s, t, a);
  }
  void backward(const AttentionShape& s, DType t, const BackwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_backward(s, t, a, info(v_).block_keys);
    else kernel_(v_, s, t, a);
  }

 private:
  // The rung whose forward this version pairs with, on the same backend, from the registry.
  const Rung& forward_rung() const {
    const std::string fwd = v_ == Version::Fp32 ? fa2::kSpec.name : tensor_core_mma::info(kMmaForward).name;
    const Rung* r = Registry::instance().find(fwd, backend());
    if (!r) throw InputError("rung " + label() + " pairs with the forward of " + fwd + ", which this build lacks");
    return *r;
  }
  Version v_;
  BackwardKernelFn kernel_;
};

}  // namespace fl::backward
