// Rung 00, CPU twin: the textbook softmax, P_ij = exp(S_ij) / Σ_k exp(S_ik).
//
// Nothing keeps exp() in range: a logit above ~88.7 makes exp overflow fp32 to +inf, the sum
// becomes inf and P = inf/inf = NaN. tests/test_00_naive_eigen.cpp shows it; rung 01 mends it.
#include <cmath>

#include "naive_eigen.hpp"

namespace fl::naive_eigen {

void twin_softmax(const HbmMatrix<float>& S, HbmMatrix<float>& P, HbmMatrix<float>& lse) {
  for (int64_t r = 0; r < S.rows(); ++r) {
    // Sweep 1: the normaliser ℓ = Σ_j exp(S_rj).
    const Block s1 = S.load_rows(r, 1);
    float l = 0.f;
    for (int64_t j = 0; j < s1.cols(); ++j) l += std::exp(s1(0, j));
    // Sweep 2: P_rj = exp(S_rj) / ℓ. A row that sees no key has ℓ = 0: P = 0, lse = −∞.
    const Block s2 = S.load_rows(r, 1);
    Block p(1, s2.cols());
    for (int64_t j = 0; j < s2.cols(); ++j) p(0, j) = l > 0.f ? std::exp(s2(0, j)) / l : 0.f;
    P.store(r, 0, p);
    lse.store(r, 0, std::log(l));
  }
}

static const Register<standard::StandardRung<Backend::Cpu>> registered{kSpec, twin_softmax};

}  // namespace fl::naive_eigen
