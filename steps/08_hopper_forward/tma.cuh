// Hopper's tensor memory accelerator (TMA) and the mbarriers its copies complete on, as rung 08's
// v3 introduces them and the versions after it use them (sm_90; the copies below need sm_90a's
// build of this rung only because its kernels do).
//
// A TMA copy moves a whole box of a tensor between global and shared memory on one thread's
// instruction: no thread computes an address per 16 bytes, as every thread does for cp.async. What
// the box is (the tensor's sizes and strides in global memory, the box's size, the swizzle it is
// written with, what fills the part of a box that lies outside the tensor) is a 128-byte "tensor
// map" made once on the host (make_map; make_tensor_map for the 16-bit inputs of rungs 08 and 09)
// and passed to the kernel as a __grid_constant__ parameter. (Rung 09's v14 also makes an
// unswizzled fp32 map of dQ's accumulator, which its writers add boxes into.) With the 128-byte
// swizzle and a box 64 values (128 bytes) wide, a box lands in shared memory exactly as this
// rung's wgmma.cuh lays out a panel (panel_at), which is what wgmma reads: TMA and wgmma agree on
// the layout without any thread touching it.
//
// A copy completes on an mbarrier, a 64-bit object in shared memory: one thread announces how many
// bytes are coming (arrive_expect_tx), the copies count them down as they land, and the barrier's
// phase flips when the count and the expected arrivals are both done; threads wait for a phase
// (wait). The same object with plain arrivals (arrive) tells the issuing thread that a buffer is
// free again.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder is fetched at run time)
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda_check.cuh"
#include "problem.hpp"

namespace fl::tma {

// ---- host: the tensor map ---------------------------------------------------------------------

// cuTensorMapEncodeTiled, fetched from the driver through the runtime once, so that the library
// needs no link to libcuda.
using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                            const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline Encode encoder() {
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    FL_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
#else  // before CUDA 12.5 the runtime asks for the driver's entry point without a version
    FL_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found));
#endif
    if (found != cudaDriverEntryPointSuccess || !fn)
      throw CudaError("cuTensorMapEncodeTiled is not in this driver (TMA needs a CUDA 12 driver and an sm_90 GPU)");
    return reinterpret_cast<Encode>(fn);
  }();
  return encode;
}

// A tensor map of a [slices][rows][d] array (d contiguous; a slice is one head's rows) of values
// of type `type` (16-bit floats or fp32), in boxes of box_rows × box_cols values of one slice; rows
// past a slice's end read as zeros (and are left alone by stores and reductions).
inline CUtensorMap make_map(const void* base, CUtensorMapDataType type, int64_t slices, int64_t rows, int64_t d,
                            int box_cols, int box_rows, CUtensorMapSwizzle swizzle) {
  const int64_t elem_bytes = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4
                             : type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                 ? 2
                                 : 0;
  if (elem_bytes == 0) throw CudaError("make_map: only fp16, bf16 and fp32 tensor maps are made here");
  CUtensorMap map{};
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(rows), cuuint64_t(slices)};
  const cuuint64_t strides[2] = {cuuint64_t(d * elem_bytes), cuuint64_t(rows * d * elem_bytes)};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t step[3] = {1, 1, 1};
  const CUresult r = encoder()(&map, type, 3, const_cast<void*>(base), dims, strides, box, step,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) + " for a [" +
                    std::to_string(slices) + "][" + std::to_string(rows) + "][" + std::to_string(d) +
                    "] tensor in boxes of " + std::to_string(box_rows) + " x " + std::to_string(box_cols) +
                    " (TMA's limits: 2^32 - 1 elements a dimension, a 16-byte aligned base, strides a multiple "
                    "of 16 bytes, at most 256 values a box dimension, a box row a multiple of 16 bytes)");
  return map;
}

// The 16-bit inputs (Q, K, V, dO) in boxes of box_rows × 64 values, written with the 128-byte
// swizzle.
inline CUtensorMap make_tensor_map(const void* base, DType t, int64_t slices, int64_t rows, int64_t d, int box_rows) {
  return make_map(base, t == DType::F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, slices, rows,
                  d, 64, box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

// ---- device: mbarriers and the copy -----------------------------------------------------------

__device__ inline void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the copy engine (and, after a barrier, to every thread).
__device__ inline void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival that also announces `bytes` more to come by TMA before the phase may complete.
__device__ inline void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Announces `bytes` more to come by TMA without arriving: for a barrier whose arrivals come from
// threads that have work of their own to do after the copies are issued.
__device__ inline void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ inline void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Returns once the barrier has completed the phase of parity `parity` (0, 1, 0, ... for its 1st,
// 2nd, 3rd completion).
__device__ inline void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// The box at (column c0, row r0, slice s) of `map` into shared memory at `dst` (1024-byte aligned
// for the 128-byte swizzle), completing on `bar`.
__device__ inline void load(uint32_t dst, const CUtensorMap& map, int c0, int r0, int s, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(r0), "r"(s), "r"(bar)
      : "memory");
}

}  // namespace fl::tma
