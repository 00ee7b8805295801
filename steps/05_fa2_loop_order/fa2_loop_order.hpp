// Rung 05: FlashAttention-2 (Dao 2023). The loops of rung 04 swap places: each thread block owns
// one Q block for its whole life and streams every K/V block past it. O_i, m_i and ℓ_i never
// leave the chip until the end, the division by ℓ happens once (deferred normalisation), lse is
// written for the backward pass, and the grid spans (Q block, head, batch), so even one head of a
// long sequence fills the GPU. Causal: K/V blocks wholly above the diagonal are never loaded.
#pragma once

#include "../02_online_softmax/online_softmax.hpp"

namespace fl::fa2 {

// Rows of Q per thread block and keys per K/V block, in the kernel and in the twin.
inline constexpr int64_t kBr = 64, kBc = 64;

inline constexpr standard::Spec kSpec{
    "05_fa2_loop_order",
    "FlashAttention-2: Q blocks outer (one per thread block), K/V streamed; O, l, m stay on chip", 0};

// Traffic: Q_i read once; for each Q block, every K/V block it can see at least partly read once
// (causal blocks wholly above the diagonal skipped; the ragged last block counted by the rows
// that exist); O and lse written once. Non-causal: read = Nq·d + Tr·2·Nk·d, written = Nq·d + Nq, with Tr = ⌈Nq / B_r⌉.
IoModel io_model(const AttentionShape& s);

Capabilities capabilities();
void twin_forward(const AttentionShape& s, const ForwardArgs& a);
void gpu_forward(const AttentionShape& s, const ForwardArgs& a);

// The rung on either backend: the twin in fa2_loop_order.cpp, the kernel in fa2_loop_order.cu.
template <Backend B>
class Fa2 final : public Rung {
 public:
  std::string name() const override { return kSpec.name; }
  std::string idea() const override { return kSpec.idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(); }
  IoModel modelled_io(const AttentionShape& s, DType) const override { return io_model(s); }
  void forward(const AttentionShape& s, DType, const ForwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_forward(s, a);
    else gpu_forward(s, a);
  }
};

// Keys [0, end) are all that rows [i0, i0 + rows) can see: the K/V loop stops there.
inline int64_t visible_key_end(const AttentionShape& s, int64_t i0, int64_t rows) {
  const int64_t last = s.last_key(i0 + rows - 1);
  return last < 0 ? 0 : std::min(s.seq_k, last + 1);
}

}  // namespace fl::fa2
