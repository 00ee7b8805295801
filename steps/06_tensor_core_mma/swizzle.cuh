// The device half of swizzle.hpp: a thread's cp.async share of a tile copy into a swizzled tile
// (rung 06's v8, rung 07). The offsets are worked out once (TileCopyOffsets); each call issues
// kRows / kRowStep cp.async with compile-time steps.
#pragma once

#include "mma_sync.cuh"
#include "swizzle.hpp"

namespace fl::mma {

template <int D, int kThreads>
struct TileCopy : TileCopyOffsets<D, kThreads> {
  using Base = TileCopyOffsets<D, kThreads>;
  using Base::kRowStep;
  __device__ explicit TileCopy(int tid) : Base(tid) {}

  // kRows rows from g (row-major, D per row) into the shared tile at byte address `tile`; rows at
  // or past `valid` become zeros and read nothing (their source is pointed at the tile's first row).
  template <int kRows, class T>
  __device__ void load(uint32_t tile, const T* g, int valid) const {
    static_assert(kRows % kRowStep == 0, "whole passes");
    if (valid >= kRows) {  // every block but a ragged last one
      const T* src = g + this->src;  // one 64-bit add; the passes step from it by constants
#pragma unroll
      for (int i = 0; i < kRows / kRowStep; ++i) cp_async_16(tile + this->dst_at(i), src + i * kRowStep * D);
    } else {
      const int row = int(threadIdx.x) / Base::kChunks;
#pragma unroll
      for (int i = 0; i < kRows / kRowStep; ++i) {
        const bool ok = row + i * kRowStep < valid;
        cp_async_16(tile + this->dst_at(i), g + (ok ? this->src_at(i) : this->src % D), ok);
      }
    }
  }
};

}  // namespace fl::mma
