// Rung 00: attention as the formula reads, with the textbook softmax exp(s)/Σexp(s).
#pragma once

#include "standard_attention.hpp"

namespace fl::naive_eigen {

// The softmax reads each row of S twice: once for Σ exp(s), once to write P = exp(s)/Σ.
inline constexpr standard::Spec kSpec{
    "00_naive_eigen",
    "S=QK^T, P=softmax(S), O=PV in three passes; softmax without max-subtraction (overflows)", 2};

// This rung's softmax pass (see standard::TwinSoftmax, standard::GpuSoftmax).
void twin_softmax(const HbmMatrix<float>& S, HbmMatrix<float>& P, HbmMatrix<float>& lse);
void gpu_softmax(const float* S, float* P, float* lse, int64_t rows, int64_t cols, void* stream);

}  // namespace fl::naive_eigen
