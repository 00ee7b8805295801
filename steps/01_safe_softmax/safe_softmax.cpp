// Rung 01, CPU twin: the safe softmax, P_ij = exp(S_ij − m_i) / Σ_k exp(S_ik − m_i), m_i = max_k S_ik.
//
// Subtracting the row max changes nothing mathematically (the factor exp(−m_i) cancels) but keeps
// every exponent ≤ 0, so exp() never overflows and the largest term is exactly 1.
#include <cmath>

#include "safe_softmax.hpp"

namespace fl::safe_softmax {

void twin_softmax(const HbmMatrix<float>& S, HbmMatrix<float>& P, HbmMatrix<float>& lse) {
  for (int64_t r = 0; r < S.rows(); ++r) {
    // Sweep 1: the row max m.
    const float m = S.load_rows(r, 1).maxCoeff();
    // Sweep 2: the normaliser ℓ = Σ_j exp(S_rj − m).
    const Block s2 = S.load_rows(r, 1);
    float l = 0.f;
    if (m != -INFINITY)  // a row that sees no key has m = −∞ and would give exp(−∞ + ∞) = NaN
      for (int64_t j = 0; j < s2.cols(); ++j) l += std::exp(s2(0, j) - m);
    // Sweep 3: P_rj = exp(S_rj − m) / ℓ; an empty row gets P = 0 and lse = −∞.
    const Block s3 = S.load_rows(r, 1);
    Block p(1, s3.cols());
    for (int64_t j = 0; j < s3.cols(); ++j) p(0, j) = l > 0.f ? std::exp(s3(0, j) - m) / l : 0.f;
    P.store(r, 0, p);
    lse.store(r, 0, l > 0.f ? m + std::log(l) : -INFINITY);
  }
}

static const Register<standard::StandardRung<Backend::Cpu>> registered{kSpec, twin_softmax};

}  // namespace fl::safe_softmax
