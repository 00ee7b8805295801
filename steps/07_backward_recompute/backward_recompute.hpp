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
// Two precisions, two rungs. "07_backward_recompute" is the readable fp32 version on CUDA cores
// (backward_recompute.cu), its forward rung 05's. "07_backward_recompute/mma" is the same loop on
// the tensor cores in fp16/bf16 with fp32 accumulation (backward_mma.cu), its forward rung 06's
// v9_one_sync; its dQ accumulates in an fp32 workspace that a last pass scales and rounds. One CPU twin
// (backward_recompute.cpp) serves both, with the roundings the precision calls for.
#pragma once

#include "../05_fa2_loop_order/fa2_loop_order.hpp"
#include "../06_tensor_core_mma/tensor_core_mma.hpp"

namespace fl::backward {

// Query rows per step, both kernels; keys per K/V block: 64 for the fp32 kernel, 128 for the
// tensor-core one (8 warps of 16 keys; backward_mma.cu says why). The twin and the IO model follow.
inline constexpr int64_t kBr = 64;
constexpr int64_t block_keys(DType t) { return t == DType::F32 ? 64 : 128; }

inline constexpr const char* kName = "07_backward_recompute";
inline constexpr const char* kIdea =
    "dQ, dK, dV from Q, K, V, O, dO and lse only: P recomputed tile by tile, D = rowsum(dO*O)";
inline constexpr const char* kMmaName = "07_backward_recompute/mma";
inline constexpr const char* kMmaIdea =
    "the same backward on the tensor cores: five mma.sync products per tile, fp16/bf16 in, fp32 dQ by atomics";

// fp32 on CUDA cores, or 16-bit on the tensor cores.
enum class Precision { Fp32, TensorCore };

// The forward the tensor-core rung pairs with: rung 06's fastest version.
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
IoModel io_model(const AttentionShape& s, DType t);

Capabilities capabilities(Precision p);

// The CPU twin of the backward pass, counting its traffic into a.io when set. fp32: dQ accumulates
// in place. fp16/bf16: the tensor-core kernel's roundings (P and dS rounded to the dtype before
// the products they feed, dQ accumulated in fp32 in the workspace, dK, dV, dQ rounded once).
void twin_backward(const AttentionShape& s, DType t, const BackwardArgs& a);

// The readable fp32 CUDA backward (CUDA builds only): D, then one thread block per K/V block.
void gpu_backward(const AttentionShape& s, const BackwardArgs& a);

// The tensor-core backward (CUDA builds only), fp16 or bf16, d = 64 or 128.
void gpu_backward_mma(const AttentionShape& s, DType t, const BackwardArgs& a);

// The rung on either backend and in either precision. The forward is the earlier rung's (this
// rung's subject is the backward pass): rung 05's for fp32, rung 06 v9_one_sync's for 16 bits. The
// twins register in backward_recompute.cpp, the kernels in the .cu files.
template <Backend B, Precision P>
class BackwardRung final : public Rung {
 public:
  std::string name() const override { return P == Precision::Fp32 ? kName : kMmaName; }
  std::string idea() const override { return P == Precision::Fp32 ? kIdea : kMmaIdea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(P); }
  std::size_t backward_workspace_bytes(const AttentionShape& s, DType) const override {
    return backward::workspace_bytes(s, P);
  }
  IoModel modelled_backward_io(const AttentionShape& s, DType t) const override { return io_model(s, t); }
  IoModel modelled_io(const AttentionShape& s, DType t) const override {
    if constexpr (P == Precision::Fp32) return fa2::io_model(s);
    else return tensor_core_mma::io_model(s, t, tensor_core_mma::tiling(kMmaForward, s.head_dim));
  }
  void forward(const AttentionShape& s, DType t, const ForwardArgs& a) const override {
    if constexpr (P == Precision::Fp32) {
      if constexpr (B == Backend::Cpu) fa2::twin_forward(s, a);
      else fa2::gpu_forward(s, a);
    } else {
      if constexpr (B == Backend::Cpu) tensor_core_mma::twin_forward(s, t, a, tensor_core_mma::tiling(kMmaForward, s.head_dim));
      else tensor_core_mma::gpu_forward(kMmaForward, s, t, a);
    }
  }
  void backward(const AttentionShape& s, DType t, const BackwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_backward(s, t, a);
    else if constexpr (P == Precision::Fp32) gpu_backward(s, a);
    else gpu_backward_mma(s, t, a);
  }
};

}  // namespace fl::backward
