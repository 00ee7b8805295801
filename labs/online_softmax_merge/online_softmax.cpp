// LAB online_softmax_merge (docs/labs.md): the TODO(lab) here and in online_softmax.hpp.
// Rung 02, CPU twin: one sweep for the row's max m and normaliser ℓ together, one to write P.
//
// The safe softmax of rung 01 needs m before it can sum exp(s − m). The online softmax keeps a
// running (m, ℓ) and, whenever m grows, rescales the sum so far by exp(m_old − m_new). That one
// identity is what lets FlashAttention (rungs 04–05) process a row of S block by block.
#include "online_softmax.hpp"

namespace fl::online_softmax {

void twin_softmax(const HbmMatrix<float>& S, HbmMatrix<float>& P, HbmMatrix<float>& lse) {
  for (int64_t r = 0; r < S.rows(); ++r) {
    // Sweep 1: (m, ℓ) in one pass over the row.
    const Block s1 = S.load_rows(r, 1);
    RowState st;
    // TODO(lab): fold the row's scores s1(0, j), j = 0 … s1.cols() − 1, into st one at a time with
    //   merge(). One score s on its own is the state {m = s, ℓ = exp(s − s) = 1}.
    // Sweep 2: P_rj = exp(S_rj − m) / ℓ; a row that sees no key gets P = 0 and lse = −∞.
    const Block s2 = S.load_rows(r, 1);
    Block p(1, s2.cols());
    for (int64_t j = 0; j < s2.cols(); ++j) p(0, j) = st.l > 0.f ? std::exp(s2(0, j) - st.m) / st.l : 0.f;
    P.store(r, 0, p);
    lse.store(r, 0, st.l > 0.f ? st.m + std::log(st.l) : -INFINITY);
  }
}

static const Register<standard::StandardRung<Backend::Cpu>> registered{kSpec, twin_softmax};

}  // namespace fl::online_softmax
