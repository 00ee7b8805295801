// LAB mma_fragments (docs/labs.md), part 2 of 2 (part 1: mma_layout.hpp): fill in the TODO(lab)
// lines of a_pattern and b_pattern at the end of the file, then rebuild and grade: cmake --build build-cpu --target lab_mma_fragments && ctest --test-dir build-cpu -L lab_mma_fragments --output-on-failure
// The swizzled shared-memory tile that rung 06 introduces (v4) and rung 07 reuses, and the address
// arithmetic of rung 06's v8: the part of an ldmatrix or cp.async address that depends on the lane
// is worked out once per thread, before the main loop, so that inside the loop each load is one
// instruction with a compile-time offset (docs/appendix/06_tensor_core_mma.md, "v8, addresses worked out once"). Host and device:
// tests/test_06_tensor_core_mma.cpp checks every function here against swz on the CPU.
//
// The layout: a tile of rows × LD 16-bit values, row-major, cut into 16-byte chunks (8 values).
// Chunk c of row r is stored at chunk position c ^ (r % 8). The 8 rows that one ldmatrix piece
// reads at one chunk column then sit in 8 different groups of 4 banks: no bank conflict, no padding.
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace fl::mma {

// Element (row, col) of a swizzled tile with LD values per row.
template <int LD>
FL_HOST_DEVICE constexpr int swz(int row, int col) {
  static_assert(LD >= 64 && LD % 64 == 0, "whole groups of 8 chunks per row");
  return row * LD + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// One lane's row address for ldmatrix.x4 in a swizzled tile. When a warp reads the 16×16 piece at
// (r0, c0), each lane gives the address of row r0 + row, chunk c0/8 + chunk, where (row, chunk)
// depends on the lane only. Two patterns serve rungs 06 and 07:
//   a_pattern: row lane % 16, chunk lane / 16. The four 8×8 pieces come out top-left,
//     bottom-left, top-right, bottom-right: an A fragment (or, with .trans, the B fragments of
//     two n8 tiles of a row-major K×N tile).
//   b_pattern: row lane % 8 + 8·(lane / 16), chunk (lane / 8) % 2: top-left, top-right,
//     bottom-left, bottom-right, i.e. the B fragments of two n8 tiles of an N×K tile.
// The lane's part is one byte offset, `off`, for the piece at (0, 0). For r0 a multiple of 8 the
// row's swizzle key (row % 8) stays the same, and moving c0 by 16 within a group of 64 columns
// only flips bits 5-6 of the byte address, so at() is the lane offset XOR a compile-time constant,
// plus the tile's address and a compile-time offset, once the loops are unrolled. The XOR may go
// on the lane offset alone because the tile starts on a 128-byte boundary (every row is a multiple
// of 128 bytes, so bits 5-6 of any row's start are zero); then the tile's part can stay in a
// uniform register (docs/appendix/07_backward_recompute.md, "Two-dimensional warp tiles").
template <int LD>
struct LaneRow {
  uint32_t off;  // bytes from the tile's start to this lane's row address for the piece at (0, 0)
  FL_HOST_DEVICE LaneRow(int row, int chunk) : off(uint32_t(2 * swz<LD>(row, 8 * chunk))) {}
  // The byte address for the piece at (r0, c0), r0 % 8 == 0, c0 % 16 == 0; `tile` is the tile's.
  FL_HOST_DEVICE uint32_t at(uint32_t tile, int r0, int c0) const {
    return tile + (off ^ uint32_t(32 * ((c0 / 16) % 4))) + uint32_t(2 * (r0 * LD + 64 * (c0 / 64)));
  }
  // The pattern moved to the piece at (r0, c0), for a warp whose pieces all lie past it: at(tile,
  // r, c) of the result is at(tile, r0 + r, c0 + c) of this one. Folding a warp's own first row
  // and column in once leaves one register per address and nothing to add per ldmatrix
  // (docs/appendix/07_backward_recompute.md, "One register per address"). Exact when r0 % 8 == 0 and, within a group of 64 columns, the
  // 16-column steps of c0 and of every later c have no bit in common (so XOR is addition):
  // c0 % 64 == 0, or e.g. c0 % 64 == 32 with c % 64 < 32.
  FL_HOST_DEVICE LaneRow moved(int r0, int c0) const {
    LaneRow m = *this;
    m.off = at(0, r0, c0);
    return m;
  }
};
template <int LD>
FL_HOST_DEVICE LaneRow<LD> a_pattern(int lane) {
  // TODO(lab): return LaneRow<LD>(row, chunk) for this lane's ldmatrix.x4 address of an A
  //   fragment: lanes 0–7, 8–15, 16–23, 24–31 give the 8 row addresses of the top-left,
  //   bottom-left, top-right and bottom-right 8×8 pieces of the 16×16 piece (chunk 0 is columns 0–7).
  (void)lane;
  return LaneRow<LD>(0, 0);  // wrong on purpose: every lane points at row 0, chunk 0
}
template <int LD>
FL_HOST_DEVICE LaneRow<LD> b_pattern(int lane) {
  // TODO(lab): the same for two n8 B fragments of an N×K tile: lanes 0–7, 8–15, 16–23, 24–31
  //   address the top-left, top-right, bottom-left and bottom-right 8×8 pieces.
  (void)lane;
  return LaneRow<LD>(0, 0);  // wrong on purpose
}

// A thread's share of copying a kRows × D tile from global memory (row-major, D values per row)
// into a swizzled shared tile, 16 bytes at a time. Thread t always copies chunk t % (D/8) of rows
// t / (D/8) + i·kRowStep; with kRowStep a multiple of 8 that chunk's swizzled position is the same
// in each of those rows, so both addresses are worked out once and then step by a constant
// (swizzle.cuh has the copy itself).
template <int D, int kThreads>
struct TileCopyOffsets {
  static constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRowStep % 8 == 0, "each thread keeps one chunk column");
  int src;       // this thread's first chunk in global memory, in values from the tile's start
  uint32_t dst;  // the same in shared memory, in bytes from the tile's start
  FL_HOST_DEVICE explicit TileCopyOffsets(int tid)
      : src(tid / kChunks * D + 8 * (tid % kChunks)), dst(uint32_t(2 * swz<D>(tid / kChunks, 8 * (tid % kChunks)))) {}
  // Where pass i of thread tid reads and writes: row tid / kChunks + i·kRowStep.
  FL_HOST_DEVICE int src_at(int i) const { return src + i * kRowStep * D; }
  FL_HOST_DEVICE uint32_t dst_at(int i) const { return dst + uint32_t(2 * i * kRowStep * D); }
};

}  // namespace fl::mma
