// The numerics twin's step, as the tensor-core kernels take it: one block of scores into a row's
// running (m, ℓ) and output, with P rounded to the 16-bit input type before P·V and ℓ summed from
// the fp32 P. Rung 06's twin is built from it, and so is every later twin of a tensor-core forward
// (rung 10's decoding), so that they round where the kernels round, in one place.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <vector>

#include "../02_online_softmax/online_softmax.hpp"
#include "io_counter.hpp"

namespace fl::tensor_core_mma {

// x rounded to the 16-bit type T (Eigen::half, Eigen::bfloat16) and back: what the kernel does to
// P before the second product.
template <class T>
Block round_to_type(const Block& x) {
  return x.unaryExpr([](float v) { return float(T(v)); });
}

// Row r of the block's scores S (fp32, masked keys at −∞) into the row's state and output row:
// rung 02's merge one block at a time, O rescaled by exp(m_old − m_new) and P·V added.
template <class T>
void twin_row_step(const Block& S, int64_t r, const Block& Vj, Block& acc, online_softmax::RowState& st) {
  const float m_new = std::max(st.m, S.row(r).maxCoeff());
  if (m_new == -INFINITY) return;  // nothing seen yet: exp(−∞ + ∞) would be NaN
  const float alpha = std::exp(st.m - m_new);
  const Block P = (S.row(r).array() - m_new).exp().matrix();
  st = {m_new, alpha * st.l + P.sum()};                        // ℓ from the fp32 P
  acc.row(r) = alpha * acc.row(r) + round_to_type<T>(P) * Vj;  // P·V from the rounded P
}

// The end of a row block: O = acc / ℓ and lse = m + log ℓ per row; a row that saw no key gets
// O = 0 and lse = −∞. Returns lse as a column.
inline Block twin_finish(Block& acc, const std::vector<online_softmax::RowState>& st) {
  Block lse(acc.rows(), 1);
  for (int64_t r = 0; r < acc.rows(); ++r) {
    const bool seen = st[std::size_t(r)].l > 0.f;
    acc.row(r) *= seen ? 1.f / st[std::size_t(r)].l : 0.f;
    lse(r, 0) = seen ? st[std::size_t(r)].m + std::log(st[std::size_t(r)].l) : -INFINITY;
  }
  return lse;
}

}  // namespace fl::tensor_core_mma
