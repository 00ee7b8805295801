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
// Status: the CPU twin with its IO model, and a readable fp32 CUDA version. The tensor-core
// backward comes next (docs/07_backward_recompute.md). The forward pass is rung 05's.
#pragma once

#include "../05_fa2_loop_order/fa2_loop_order.hpp"

namespace fl::backward {

// Query rows and keys per block, as the kernels will use them.
inline constexpr int64_t kBr = 64, kBc = 64;

inline constexpr const char* kName = "07_backward_recompute";
inline constexpr const char* kIdea =
    "dQ, dK, dV from Q, K, V, O, dO and lse only: P recomputed tile by tile, D = rowsum(dO*O)";

// D, B·H·Nq fp32: the one array the backward adds in device memory. Linear in N.
std::size_t workspace_bytes(const AttentionShape& s);

// Bytes the backward moves, counted over the blocks its loops visit (fp32):
//   per query head, once:  O and dO read (D = rowsum(dO ∘ O)), D written, dQ zeroed;
//   per K/V block:         K_j, V_j read, dK_j, dV_j written;
//   per visible (i, j):    Q_i, dO_i, L_i, D_i read, dQ_i read and written back.
// Non-causal that is Θ(Nq·d + Nk·d + Tc·Nq·d) per head: the dQ round trips play the part the
// O round trips played in rung 04.
IoModel io_model(const AttentionShape& s);

Capabilities capabilities();

// The CPU twin of the backward pass, counting its traffic into a.io when set.
void twin_backward(const AttentionShape& s, const BackwardArgs& a);

// The readable fp32 CUDA backward (CUDA builds only): D, then one thread block per K/V block.
void gpu_backward(const AttentionShape& s, const BackwardArgs& a);

// The rung on either backend: rung 05's forward (this rung's subject is the backward pass) and
// this backward; the twin registers in backward_recompute.cpp, the kernels in the .cu.
template <Backend B>
class BackwardRung final : public Rung {
 public:
  std::string name() const override { return kName; }
  std::string idea() const override { return kIdea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(); }
  std::size_t backward_workspace_bytes(const AttentionShape& s, DType) const override {
    return backward::workspace_bytes(s);
  }
  IoModel modelled_io(const AttentionShape& s, DType) const override { return fa2::io_model(s); }
  void forward(const AttentionShape& s, DType, const ForwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) fa2::twin_forward(s, a);
    else fa2::gpu_forward(s, a);
  }
  void backward(const AttentionShape& s, DType, const BackwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_backward(s, a);
    else gpu_backward(s, a);
  }
};

}  // namespace fl::backward
