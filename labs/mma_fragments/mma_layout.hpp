// LAB mma_fragments (docs/labs.md), part 1 of 2 (part 2: swizzle.hpp's a_pattern, b_pattern):
// fill in the TODO(lab) lines, then rebuild and grade (no GPU needed; build/ in place of build-cpu/ with the GPU rungs): cmake --build build-cpu --target lab_mma_fragments && ctest --test-dir build-cpu -L lab_mma_fragments --output-on-failure
// Which lane of a warp holds which element of an mma.sync.m16n8k16 tile (fp16/bf16 inputs, fp32
// accumulators), from the PTX ISA's "Matrix Fragments for mma.m16n8k16". The kernel indexes its
// fragments through these functions and tests/test_06_tensor_core_mma.cpp checks them on the CPU
// on every CI run, so a wrong index shows up without a GPU.
//
// In every fragment, lane = 4·g + t: g = lane / 4 (the "group", a row of A and C, a column of B)
// and t = lane % 4 (the thread in the group, which picks a pair of adjacent columns).
//
//   A, 16×16, row-major, 8 halves in 4 registers:   C/D, 16×8 fp32, 4 floats:
//     reg 0: (g,    2t..2t+1)                          c0, c1: (g,     2t..2t+1)
//     reg 1: (g+8,  2t..2t+1)                          c2, c3: (g + 8, 2t..2t+1)
//     reg 2: (g,    2t+8..2t+9)
//     reg 3: (g+8,  2t+8..2t+9)                      B, 16×8 (k × n), 4 halves in 2 registers:
//                                                      reg 0: k = 2t..2t+1,   n = g
//                                                      reg 1: k = 2t+8..2t+9, n = g
//
// The identity FlashAttention-2 is built on: two C tiles side by side (columns 0–7 and 8–15)
// hold, lane for lane, exactly the elements of one A tile. So P, made in C layout by Q·Kᵀ, is
// already in A layout for P·V: it never needs to leave the registers.
#pragma once

#include "host_device.hpp"

namespace fl::mma {

struct Coord {
  int row, col;
};

// Element e (0..7, two per register, low half first) of lane's A fragment.
FL_HOST_DEVICE constexpr Coord a_elem(int lane, int e) {
  // TODO(lab): return {row, col} of element e from the A table above: with g = lane / 4,
  //   t = lane % 4, register reg = e / 2 and half = e % 2 (0 = the lower column of the pair),
  //   registers 1 and 3 are 8 rows below 0 and 2; registers 2 and 3 are 8 columns right of 0 and 1.
  (void)lane, (void)e;
  return {0, 0};  // wrong on purpose: every element at the origin
}

// Element e (0..3) of lane's B fragment, as (k, n).
FL_HOST_DEVICE constexpr Coord b_elem(int lane, int e) {
  // TODO(lab): return {k, n} of element e from the B table above (reg = e / 2, half = e % 2):
  //   the column n is the lane's group g; register 1 is 8 rows (k) below register 0.
  (void)lane, (void)e;
  return {0, 0};  // wrong on purpose
}

// Element e (0..3) of lane's C/D fragment.
FL_HOST_DEVICE constexpr Coord c_elem(int lane, int e) {
  // TODO(lab): return {row, col} of float e (0..3) from the C/D table above: c0, c1 in row g,
  //   c2, c3 in row g + 8, each pair in columns 2t and 2t + 1.
  (void)lane, (void)e;
  return {0, 0};  // wrong on purpose
}

}  // namespace fl::mma
