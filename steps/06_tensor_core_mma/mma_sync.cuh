// The Ampere-generation tensor-core instructions rung 06 is built on, as small device functions:
// mma.sync m16n8k16, ldmatrix (plain and transposing), cp.async and ex2.approx. Rung 06 introduces
// them (docs/06_tensor_core_mma.md); rung 07's tensor-core backward uses the same ones.
// Fragment layouts (which lane holds which element) are in mma_layout.hpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fl::mma {

// Two floats as one 32-bit register of two 16-bit values, the lower column in the low half.
template <class T>
__device__ inline uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
template <class T>
__device__ inline uint32_t pack(T lo, T hi) {
  return uint32_t(*reinterpret_cast<const uint16_t*>(&lo)) |
         (uint32_t(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
}

// D += A·B for one 16×16 × 16×8 tile, fp32 accumulators.
template <class T>
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t b0, const uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8×8 pieces of 16-bit values for the whole warp: lanes 8i..8i+7 give the row addresses of
// piece i, and each lane gets (row lane/4, columns 2·(lane%4), +1) of every piece, one register
// each; .trans hands out the transpose, (rows 2·(lane%4), +1, column lane/4).
// The address may be a generic pointer into shared memory or, as rung 06's v8 keeps them, a
// 32-bit shared-window address (smem_u32).
__device__ inline uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { ldmatrix_x4(r, smem_u32(smem)); }
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) { ldmatrix_x4_trans(r, smem_u32(smem)); }

// 16 bytes from global to shared memory without passing through registers; zeros when !valid.
__device__ inline void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_16(void* smem, const void* gmem, bool valid) { cp_async_16(smem_u32(smem), gmem, valid); }
__device__ inline void cp_async_16(uint32_t smem, const void* gmem) {  // always all 16 bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}
// The same for 4 bytes (cp.async.ca: through L1; 16 bytes is the only size .cg takes).
__device__ inline void cp_async_4(void* smem, const void* gmem, bool valid) {
  const unsigned addr = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// 2^x in one MUFU instruction (ex2.approx flushes subnormal results to 0; 2^−∞ = +0).
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fl::mma
