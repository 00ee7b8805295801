// Rung 01: the safe softmax, exp(s − max)/Σexp(s − max), with rung 00's passes 1 and 3.
#pragma once

#include "../00_naive_eigen/standard_attention.hpp"

namespace fl::safe_softmax {

// The softmax reads each row of S three times: for its max m, for ℓ = Σ exp(s − m), and to write P.
inline constexpr standard::Spec kSpec{
    "01_safe_softmax",
    "subtract the row max before exp: three sweeps over each row of S, no overflow", 3};

// This rung's softmax pass (see standard::TwinSoftmax, standard::GpuSoftmax).
void twin_softmax(const HbmMatrix<float>& S, HbmMatrix<float>& P, HbmMatrix<float>& lse);
void gpu_softmax(const float* S, float* P, float* lse, int64_t rows, int64_t cols, void* stream);

}  // namespace fl::safe_softmax
