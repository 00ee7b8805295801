// Rung 04, CPU twin: Algorithm 1 of the FlashAttention paper with Eigen blocks, every block that
// crosses between device memory and the on-chip budget counted.
#include "fa1_loop_order.hpp"

#include "twin.hpp"

#include <limits>

namespace fl::fa1 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The loops' shared walk: calls visit(i0, br) for every Q block that sees at least one key of the
// K/V block starting at j0. Causal blocks entirely above the diagonal are skipped.
template <class F>
void for_visible_q_blocks(const AttentionShape& s, int64_t br, int64_t j0, F&& visit) {
  for (int64_t i0 = 0; i0 < s.seq_q; i0 += br) {
    const int64_t rows = std::min(br, s.seq_q - i0);
    if (s.last_key(i0 + rows - 1) < j0) continue;  // the block's last row sees no key ≥ j0
    visit(i0, rows);
  }
}

}  // namespace

std::size_t workspace_bytes(const AttentionShape& s) { return 2 * std::size_t(s.lse_elems()) * sizeof(float); }

Capabilities capabilities() {
  Capabilities c;
  c.dtypes = {DType::F32};
  c.head_dims = {32, 64, 128};
  c.workspace_what = "l and m, B*H*Nq fp32 each";
  return c;
}

IoModel io_model(const AttentionShape& s, int64_t m_floats) {
  const Blocks blk = blocks_for(m_floats, s.head_dim);
  const double d = double(s.head_dim), w = sizeof(float), nq = double(s.seq_q), nk = double(s.seq_k);
  double read = 2 * nk * d + 2 * nq, written = nq * d + 2 * nq + nq;  // K, V; final sweep; init; lse
  for (int64_t j0 = 0; j0 < s.seq_k; j0 += blk.bc)
    for_visible_q_blocks(s, blk.br, j0, [&](int64_t, int64_t rows) {
      read += rows * (2 * d + 2);     // Q_i, O_i, ℓ_i, m_i
      written += rows * (d + 2);      // O_i, ℓ_i, m_i
    });
  const double bh = double(s.batch * s.heads);
  return {bh * w * read, bh * w * written};
}

void twin_forward(const AttentionShape& s, const ForwardArgs& a, int64_t m_floats) {
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  const Blocks blk = blocks_for(m_floats, s.head_dim);
  const int64_t d = s.head_dim, rows_all = s.batch * s.heads * s.seq_q;
  float* ws = static_cast<float*>(a.workspace);
  auto [Q, K, V, O, LSE] = twin_arrays(s, a, io);
  HbmMatrix<float> L(ws, rows_all, 1, io);              // ℓ: running softmax denominators
  HbmMatrix<float> M(ws + rows_all, rows_all, 1, io);   // m: running row maxima
  const float scale = s.softmax_scale();

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);
      // Line 2 of Algorithm 1: O = 0, ℓ = 0, m = −∞ in device memory.
      O.store(q0, 0, Block::Zero(s.seq_q, d));
      L.store(q0, 0, Block::Zero(s.seq_q, 1));
      M.store(q0, 0, Block::Constant(s.seq_q, 1, kNegInf));
      for (int64_t j0 = 0; j0 < s.seq_k; j0 += blk.bc) {  // outer: K/V blocks
        const int64_t bc = std::min(blk.bc, s.seq_k - j0);
        const Block Kj = K.load_rows(k0 + j0, bc), Vj = V.load_rows(k0 + j0, bc);
        for_visible_q_blocks(s, blk.br, j0, [&](int64_t i0, int64_t br) {  // inner: Q blocks
          const Block Qi = Q.load_rows(q0 + i0, br);
          Block Oi = O.load_rows(q0 + i0, br);
          const Block li = L.load_rows(q0 + i0, br), mi = M.load_rows(q0 + i0, br);
          Block S = (Qi * Kj.transpose()) * scale;
          for (int64_t r = 0; r < br; ++r)
            for (int64_t c = 0; c < bc; ++c)
              if (j0 + c > s.last_key(i0 + r)) S(r, c) = kNegInf;
          Block l_new(br, 1), m_new(br, 1);
          for (int64_t r = 0; r < br; ++r) {
            // This block's row statistics: m̃ = rowmax(S), P̃ = exp(S − m̃), ℓ̃ = rowsum(P̃).
            const float m_blk = S.row(r).maxCoeff();
            Block P = Block::Zero(1, bc);
            if (m_blk != kNegInf) P = (S.row(r).array() - m_blk).exp().matrix();
            const online_softmax::RowState old{mi(r, 0), li(r, 0)}, blk_state{m_blk, P.sum()};
            const online_softmax::RowState now = online_softmax::merge(old, blk_state);
            // O_i ← diag(ℓ_new)⁻¹ (diag(ℓ_i)·e^{m_i − m_new}·O_i + e^{m̃ − m_new}·P̃·V_j)  (line 12)
            const float alpha = old.m == kNegInf ? 0.f : std::exp(old.m - now.m);
            const float beta = m_blk == kNegInf ? 0.f : std::exp(m_blk - now.m);
            if (now.l > 0.f)
              Oi.row(r) = (old.l * alpha * Oi.row(r) + beta * (P * Vj)) / now.l;
            l_new(r, 0) = now.l;
            m_new(r, 0) = now.m;
          }
          O.store(q0 + i0, 0, Oi);  // the round trip FlashAttention-2 removes
          L.store(q0 + i0, 0, l_new);
          M.store(q0 + i0, 0, m_new);
        });
      }
      // lse = m + log ℓ, for the backward pass; −∞ where the row saw no key.
      const Block l = L.load_rows(q0, s.seq_q), m = M.load_rows(q0, s.seq_q);
      Block lse(s.seq_q, 1);
      for (int64_t r = 0; r < s.seq_q; ++r) lse(r, 0) = l(r, 0) > 0.f ? m(r, 0) + std::log(l(r, 0)) : kNegInf;
      LSE.store(q0, 0, lse);
    }
}

static const Register<Fa1<Backend::Cpu>> registered;

}  // namespace fl::fa1
