// Rung 04: FlashAttention-1 (Dao et al. 2022, Algorithm 1). S and P never reach device memory:
// the outer loop walks K/V blocks j, the inner loop walks Q blocks i, and each (i, j) step folds
// the block's softmax into the running statistics (m, ℓ) with rung 02's merge(), rescaling O_i.
// The price of this loop order: O_i, ℓ_i and m_i go back to device memory after every step and
// come back on the next outer iteration, and the kernel runs one thread block per (batch, head).
#pragma once

#include "../02_online_softmax/online_softmax.hpp"

namespace fl::fa1 {

// Block sizes from an on-chip budget of M floats (the paper's rule): K_j and V_j take half of it,
// so B_c = ⌈M / 4d⌉ keys; a Q block is no taller than d rows, B_r = min(B_c, d).
struct Blocks {
  int64_t br, bc;
};
constexpr Blocks blocks_for(int64_t m_floats, int64_t d) {
  const int64_t bc = (m_floats + 4 * d - 1) / (4 * d);
  return {bc < d ? bc : d, bc};
}

// The kernel's budget: 16384 floats (64 KiB), which gives B_r × B_c = 64×64 at d = 64,
// 32×32 at d = 128 and 32×128 at d = 32.
inline constexpr int64_t kKernelM = 16384;

inline constexpr standard::Spec kSpec{
    "04_fa1_loop_order",
    "FlashAttention-1: K/V blocks outer, Q blocks inner; O, l, m round-trip through device memory", 0};

// Traffic, counted over the blocks the loops visit (causal skips blocks above the diagonal):
// O, ℓ, m initialised once; K_j, V_j read once; per visited (i, j): Q_i, O_i, ℓ_i, m_i read and
// O_i, ℓ_i, m_i written; a last sweep turns (m, ℓ) into lse. Non-causal, that is
//   read    = 2·Nk·d + Tc·(2·Nq·d + 2·Nq) + 2·Nq
//   written = Nq·d + 2·Nq + Tc·(Nq·d + 2·Nq) + Nq        with Tc = ⌈Nk / B_c⌉ ≈ 4·Nk·d / M,
// Θ(Nq·Nk·d² / M) words: the paper's bound.
IoModel io_model(const AttentionShape& s, int64_t m_floats);

// ℓ and m in device memory, B·H·Nq fp32 each.
std::size_t workspace_bytes(const AttentionShape& s);
Capabilities capabilities();

// The CPU twin with any budget M (the registered twin uses kKernelM).
void twin_forward(const AttentionShape& s, const ForwardArgs& a, int64_t m_floats);
void gpu_forward(const AttentionShape& s, const ForwardArgs& a);

// The rung on either backend: the twin in fa1_loop_order.cpp, the kernel in fa1_loop_order.cu.
template <Backend B>
class Fa1 final : public Rung {
 public:
  std::string name() const override { return kSpec.name; }
  std::string idea() const override { return kSpec.idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(); }
  std::size_t workspace_bytes(const AttentionShape& s, DType) const override { return fa1::workspace_bytes(s); }
  IoModel modelled_io(const AttentionShape& s, DType) const override { return io_model(s, kKernelM); }
  void forward(const AttentionShape& s, DType, const ForwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_forward(s, a, kKernelM);
    else gpu_forward(s, a);
  }
};

}  // namespace fl::fa1
