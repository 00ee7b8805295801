// Rung 03: block matrix multiplication. Q·Kᵀ and P·V are computed tile by tile, each tile's
// operands staged once through on-chip memory and reused T times from there. The softmax between
// them is rung 02's, and S and P still go through device memory: tiling alone does not remove
// them. The fused "attention without softmax" below shows why, and what FlashAttention adds.
#pragma once

#include "../02_online_softmax/online_softmax.hpp"

namespace fl::block_matmul {

// S and O are computed in T×T tiles; their operands come on chip in T×T pieces.
inline constexpr int kTile = 16;

inline constexpr standard::Spec kSpec{
    "03_block_matmul",
    "Q*K^T and P*V in shared-memory tiles, online softmax between: S and P still in device memory",
    2};

// Closed-form traffic. A T×T tile of S needs a T-row block of Q and of K: every Q row is loaded
// once per column tile (Tc = ⌈Nk/T⌉ times) and every K row once per row tile (Tr = ⌈Nq/T⌉).
// Likewise P·V loads P once per column tile of O (⌈d/T⌉) and V once per row tile (Tr). The
// softmax in between is rung 02's: S read twice, P and lse written.
IoModel io_model(const AttentionShape& s);

void twin_forward(const AttentionShape& s, const ForwardArgs& a);
void gpu_forward(const AttentionShape& s, const ForwardArgs& a);

// The rung on either backend: the twin in block_matmul.cpp, the kernels in block_matmul.cu. What
// it accepts and the memory it needs are standard attention's (S and P in device memory).
template <Backend B>
class BlockMatmul final : public Rung {
 public:
  std::string name() const override { return kSpec.name; }
  std::string idea() const override { return kSpec.idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return standard::capabilities(); }
  std::size_t workspace_bytes(const AttentionShape& s, DType) const override { return standard::workspace_bytes(s); }
  IoModel modelled_io(const AttentionShape& s, DType) const override { return io_model(s); }
  void forward(const AttentionShape& s, DType, const ForwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_forward(s, a);
    else gpu_forward(s, a);
  }
};

// ---- Fusion without softmax --------------------------------------------------------------------
// O_i = Σ_j (Q_i·K_jᵀ·scale)·V_j for every T-row block i: one pass, S_ij lives on chip only.
// Possible because without softmax each tile's contribution is final the moment it is computed.
// No mask; no lse. Checked against fl::reference_no_softmax.
IoModel fused_io_model(const AttentionShape& s);  // Q and O once; K and V once per row block
inline constexpr int kFusedMaxHeadDim = 128;
void twin_fused_no_softmax(const AttentionShape& s, const float* q,  // [B, H, Nq, d]
                           const float* k, const float* v,            // [B, Hkv, Nk, d]
                           float* o, IoCounter& io);                  // [B, H, Nq, d]
void gpu_fused_no_softmax(const AttentionShape& s, const float* q, const float* k, const float* v,
                          float* o, void* stream);

}  // namespace fl::block_matmul
