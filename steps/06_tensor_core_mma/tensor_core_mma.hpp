// Rung 06: rung 05's algorithm on the tensor cores. Q·Kᵀ and P·V become warp-wide
// mma.sync.m16n8k16 instructions on fp16 or bf16 inputs with fp32 accumulation; each warp owns 16
// query rows, so the softmax statistics of a row live in the four lanes that hold it.
//
// The rung is built as versions, each registered, tested and benchmarked on its own, each adding
// one idea to the one before (docs/06_tensor_core_mma.md):
//   v1_mma       the first tensor-core version: fragments loaded from shared memory with plain 32-
//                and 16-bit loads; P kept in registers, where the C layout of Q·Kᵀ already is the
//                A layout of P·V (mma_layout.hpp).
//   v2_ldmatrix  fragments loaded with ldmatrix: one instruction fills four 8×8 pieces for the
//                whole warp; .trans turns V's rows into B's columns on the way.
//   v3_pipeline  K/V blocks copied with cp.async into two buffers: block j+1 streams in while
//                block j is multiplied.
//   v4_swizzle   shared memory without padding: 16-byte chunks XOR-swizzled across rows, so
//                ldmatrix stays free of bank conflicts in less memory.
//   v5_lean      fewer instructions around the mma: masks only on the blocks that need them, the
//                scale folded into the exponent's one FFMA, ex2.approx for exp2.
//   v6_tall      128 query rows per thread block, 32 per warp, so each K/V fragment loaded from
//                shared memory feeds two mma instead of one.
//   v7_wide      at d = 64, 128 keys per K/V block: the per-row work of a step (the max across the
//                quad, alpha, the rescale of O, a barrier) is shared by twice the keys.
//   v8_hoisted   the lane-dependent part of every ldmatrix and cp.async address (swizzle and all)
//                is worked out once, before the loop: inside it each load is one instruction.
//   v9_one_sync  one barrier per K/V block instead of two: the copy of the next block is issued
//                just after the barrier, when every warp is done with the buffer it overwrites.
#pragma once

#include <iterator>

#include "../05_fa2_loop_order/fa2_loop_order.hpp"

namespace fl::tensor_core_mma {

enum class Version { V1Mma, V2Ldmatrix, V3Pipeline, V4Swizzle, V5Lean, V6Tall, V7Wide, V8Hoisted, V9OneSync };

// How a version cuts the work: query rows and keys per block, warps per block, 16-row mma tiles
// per warp, and whether the row blocks are counted from the last row (from_end: the partial
// block, if any, is the first, not the last). The kernel is built from it and the twin follows it,
// so their IO counts agree.
struct Tiling {
  int rows, keys, warps, m_tiles;
  bool from_end = false;
  // The first row of the first block (≤ 0): a block covers rows [b0, b0 + rows) ∩ [0, seq_q).
  constexpr int64_t first_row(int64_t seq_q) const {
    return from_end ? seq_q - (seq_q + rows - 1) / rows * rows : 0;
  }
};
constexpr Tiling tiling(Version v, int64_t d) {
  // At d = 128 a 128-key block's scores do not fit beside O's accumulators in 255 registers.
  if (v >= Version::V7Wide && d == 64) return {128, 128, 4, 2};
  if (v >= Version::V6Tall) return {128, 64, 4, 2};
  return {64, 64, 4, 1};
}

// Traffic as rung 05's, in 2-byte elements: Q once, K and V once per Q block for the blocks it
// can see, O written once; lse is fp32.
IoModel io_model(const AttentionShape& s, DType t, Tiling tile);

Capabilities capabilities();

// The numerics twin: rung 05's loops with the kernel's roundings. Inputs arrive in fp16/bf16 (the
// harness rounds them), S and the running statistics are fp32, P is rounded to the input type
// before P·V (the kernel feeds it to the tensor cores in that type) while ℓ sums the unrounded P,
// and O is rounded once at the end. Its error against the fp64 oracle is the floor the kernel is
// held to.
void twin_forward(const AttentionShape& s, DType t, const ForwardArgs& a, Tiling tile);

struct VersionInfo {
  Version version;
  const char* name;
  const char* idea;
};
inline constexpr VersionInfo kVersions[] = {
    {Version::V1Mma, "06_tensor_core_mma/v1_mma",
     "mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), P kept in registers between the products"},
    {Version::V2Ldmatrix, "06_tensor_core_mma/v2_ldmatrix",
     "v1 + fragments loaded with ldmatrix (.trans for V)"},
    {Version::V3Pipeline, "06_tensor_core_mma/v3_pipeline",
     "v2 + cp.async double buffering: K/V block j+1 loads while block j computes"},
    {Version::V4Swizzle, "06_tensor_core_mma/v4_swizzle",
     "v3 + XOR-swizzled shared memory instead of padding"},
    {Version::V5Lean, "06_tensor_core_mma/v5_lean",
     "v4 + fewer instructions per score: masks only where needed, scale folded into one FFMA"},
    {Version::V6Tall, "06_tensor_core_mma/v6_tall",
     "v5 + 128 query rows per block, 32 per warp: each K/V fragment feeds two mma"},
    {Version::V7Wide, "06_tensor_core_mma/v7_wide",
     "v6 + 128 keys per K/V block at d=64: per-row work shared by twice the keys"},
    {Version::V8Hoisted, "06_tensor_core_mma/v8_hoisted",
     "v7 + ldmatrix and cp.async addresses worked out once per thread, outside the loop"},
    {Version::V9OneSync, "06_tensor_core_mma/v9_one_sync",
     "v8 + one barrier per K/V block: the next block's copy starts right after it"},
};
inline constexpr const char* kV1Name = kVersions[0].name;
constexpr const VersionInfo& info(Version v) { return kVersions[int(v)]; }
static_assert(int(Version::V9OneSync) + 1 == int(std::size(kVersions)), "a VersionInfo for every version, in order");
// The newest version, the fastest on mma.sync: rung 11's forward step where rung 08 cannot run.
inline constexpr const char* kNewest = kVersions[std::size(kVersions) - 1].name;

// A version's kernel launcher (CUDA builds only): each version file (v1_mma.cu ... v9_one_sync.cu)
// defines one and registers it under the version's name (launch.cuh).
using KernelFn = void (*)(Version, const AttentionShape&, DType, const ForwardArgs&);

// One version on either backend: the twin with the version's tiling (tensor_core_mma.cpp
// registers one per version), or the version's kernel (each version file registers its own).
template <Backend B>
class TensorCoreRung final : public Rung {
 public:
  explicit TensorCoreRung(Version v, KernelFn kernel = nullptr) : version_(v), kernel_(kernel) {}
  std::string name() const override { return info(version_).name; }
  std::string idea() const override { return info(version_).idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(); }
  IoModel modelled_io(const AttentionShape& s, DType t) const override {
    return io_model(s, t, tiling(version_, s.head_dim));
  }
  void forward(const AttentionShape& s, DType t, const ForwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_forward(s, t, a, tiling(version_, s.head_dim));
    else kernel_(version_, s, t, a);
  }

 private:
  Version version_;
  KernelFn kernel_;
};

// Version v's kernel as the registry holds it (rung 07 pairs its backward with v9's forward this
// way); throws InputError where the library was built without CUDA.
void gpu_forward(Version v, const AttentionShape& s, DType t, const ForwardArgs& a);

}  // namespace fl::tensor_core_mma
