// LAB fa2_twin_loop (docs/labs.md): fill in the TODO(lab) lines, then rebuild and grade (build/ in
// place of build-cpu/ with the GPU rungs): cmake --build build-cpu --target lab_fa2_twin_loop && ctest --test-dir build-cpu -L lab_fa2_twin_loop --output-on-failure
// Rung 05, CPU twin: FlashAttention-2's loop order with Eigen blocks, every block counted.
#include "fa2_loop_order.hpp"

#include "twin.hpp"

#include <limits>

namespace fl::fa2 {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

Capabilities capabilities() {
  Capabilities c;
  c.dtypes = {DType::F32};
  c.head_dims = {64, 128};
  return c;
}

IoModel io_model(const AttentionShape& s) {
  const double d = double(s.head_dim), w = sizeof(float);
  double read = double(s.seq_q) * d, written = double(s.seq_q) * (d + 1);  // Q; O and lse
  for (int64_t i0 = 0; i0 < s.seq_q; i0 += kBr) {
    const int64_t end = visible_key_end(s, i0, std::min(kBr, s.seq_q - i0));
    for (int64_t j0 = 0; j0 < end; j0 += kBc)  // K_j and V_j, whole blocks (the last one ragged)
      read += 2.0 * double(std::min(kBc, s.seq_k - j0)) * d;
  }
  const double bh = double(s.batch * s.heads);
  return {bh * w * read, bh * w * written};
}

void twin_forward(const AttentionShape& s, const ForwardArgs& a) {
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  const int64_t d = s.head_dim;
  auto [Q, K, V, O, LSE] = twin_arrays(s, a, io);
  const float scale = s.softmax_scale();

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);
      for (int64_t i0 = 0; i0 < s.seq_q; i0 += kBr) {  // outer: Q blocks (one thread block each)
        const int64_t br = std::min(kBr, s.seq_q - i0);
        const Block Qi = Q.load_rows(q0 + i0, br);
        Block acc = Block::Zero(br, d);  // O_i, not yet divided by ℓ
        std::vector<online_softmax::RowState> st(br);
        const int64_t end = visible_key_end(s, i0, br);
        for (int64_t j0 = 0; j0 < end; j0 += kBc) {  // inner: K/V blocks
          const int64_t bc = std::min(kBc, s.seq_k - j0);  // whole blocks, as the kernel loads
          const Block Kj = K.load_rows(k0 + j0, bc), Vj = V.load_rows(k0 + j0, bc);
          Block S = (Qi * Kj.transpose()) * scale;
          for (int64_t r = 0; r < br; ++r) {
            for (int64_t c = 0; c < bc; ++c)
              if (j0 + c > s.last_key(i0 + r)) S(r, c) = kNegInf;
            // TODO(lab): the online-softmax step for row r (FlashAttention-2, Algorithm 1), six lines:
            //   m_new = max(st[r].m, the largest entry of S.row(r));
            //   if m_new is −∞ (kNegInf) the row sees no key yet: continue;
            //   alpha = exp(st[r].m − m_new), which rescales what was summed under the old max
            //           (it is 0 when st[r].m = −∞: nothing to rescale);
            //   P     = exp(S.row(r) − m_new), a 1 × bc Block (Eigen: .array(), .exp(), .matrix());
            //   st[r] = {m_new, alpha · st[r].l + the sum of P};
            //   acc.row(r) = alpha · acc.row(r) + P · V_j.
            // No division by ℓ here: that waits for the end of the K/V loop.
          }
        }
        Block lse(br, 1);
        for (int64_t r = 0; r < br; ++r) {  // the deferred normalisation, once per row
          // TODO(lab): a row that saw a key (st[r].l > 0): divide acc.row(r) by st[r].l and set
          //   lse(r, 0) = st[r].m + log(st[r].l). A row that saw none: acc.row(r) = 0, lse = kNegInf.
          lse(r, 0) = 0.f;  // wrong on purpose
        }
        O.store(q0 + i0, 0, acc);
        LSE.store(q0 + i0, 0, lse);
      }
    }
}

static const Register<Fa2<Backend::Cpu>> registered;

}  // namespace fl::fa2
