// LAB online_softmax_merge (docs/labs.md): fill in the TODO(lab) lines of this file and of
// online_softmax.cpp beside it, then rebuild and grade (build/ in place of build-cpu/ with the GPU rungs): cmake --build build-cpu --target lab_online_softmax_merge && ctest --test-dir build-cpu -L lab_online_softmax_merge --output-on-failure
// Rung 02: the online softmax (Milakov & Gimelshein, 2018): the max and the normaliser in one
// sweep, with rung 00's passes 1 and 3.
#pragma once

#include <cmath>

#include "../00_naive_eigen/standard_attention.hpp"
#include "host_device.hpp"

namespace fl::online_softmax {

// The softmax reads each row of S twice: once for (m, ℓ) together, once to write P.
inline constexpr standard::Spec kSpec{
    "02_online_softmax",
    "running max and sum in one sweep (Milakov & Gimelshein 2018), then normalise: two sweeps", 2};

// The running state of one row: m = the largest score seen so far, ℓ = Σ exp(s − m) over them.
struct RowState {
  float m = -INFINITY;
  float l = 0.f;
};

// The one idea of this rung. Folding state b into a: the larger max wins and the other sum is
// rescaled by exp(old max − new max) ≤ 1, so nothing overflows and the result equals a two-pass
// max-then-sum. Adding one score s is merge(a, {s, 1}). Both sides of the CPU/GPU boundary use it.
FL_HOST_DEVICE inline RowState merge(RowState a, RowState b) {
  // TODO(lab): return the state of a and b's scores together, in three lines:
  //   1. m = the larger of a.m and b.m (fmaxf: this function runs on the GPU too);
  //   2. when m is −∞ neither side has seen a score: return {m, 0.f} (exp(−∞ − (−∞)) is NaN);
  //   3. otherwise return {m, ℓ}, where ℓ is a.l and b.l each rescaled from its own max to m
  //      (by expf(old max − m), at most 1) and added.
  (void)a, (void)b;
  return {};  // wrong on purpose: the empty state, whatever a and b hold
}

// This rung's softmax pass (see standard::TwinSoftmax, standard::GpuSoftmax); rung 03 reuses it.
void twin_softmax(const HbmMatrix<float>& S, HbmMatrix<float>& P, HbmMatrix<float>& lse);
void gpu_softmax(const float* S, float* P, float* lse, int64_t rows, int64_t cols, void* stream);

}  // namespace fl::online_softmax
