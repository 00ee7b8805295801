// Rung 07, CPU twin: FlashAttention-2's backward with Eigen blocks, every block counted.
#include "backward_recompute.hpp"

#include <limits>

#include "twin.hpp"

namespace fl::backward {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Q blocks that see at least one key of the K/V block starting at j0 (causal skips the rest).
template <class F>
void for_visible_q_blocks(const AttentionShape& s, int64_t j0, F&& visit) {
  for (int64_t i0 = 0; i0 < s.seq_q; i0 += kBr) {
    const int64_t br = std::min(kBr, s.seq_q - i0);
    if (s.last_key(i0 + br - 1) >= j0) visit(i0, br);
  }
}

}  // namespace

std::size_t workspace_bytes(const AttentionShape& s) { return std::size_t(s.lse_elems()) * sizeof(float); }

Capabilities capabilities() {
  Capabilities c;
  c.dtypes = {DType::F32};
  c.head_dims = {64, 128};
  c.backward = true;
  c.workspace_what = "D = rowsum(dO*O), B*H*Nq fp32";
  return c;
}

IoModel io_model(const AttentionShape& s) {
  const double d = double(s.head_dim), w = sizeof(float), nq = double(s.seq_q);
  // Once per query head: O, dO read; D written; dQ zeroed.
  double read = double(s.heads) * 2 * nq * d, written = double(s.heads) * (nq + nq * d);
  for (int64_t j0 = 0; j0 < s.seq_k; j0 += kBc) {
    const double bc = double(std::min(kBc, s.seq_k - j0));
    read += double(s.kv_heads) * 2 * bc * d;  // K_j, V_j, once per key/value head
    written += double(s.kv_heads) * 2 * bc * d;  // dK_j, dV_j
    for_visible_q_blocks(s, j0, [&](int64_t, int64_t br) {
      read += double(s.heads) * br * (2 * d + 2 + d);  // Q_i, dO_i, L_i, D_i, and dQ_i
      written += double(s.heads) * br * d;             // dQ_i back
    });
  }
  return {double(s.batch) * w * read, double(s.batch) * w * written};
}

void twin_backward(const AttentionShape& s, const BackwardArgs& a) {
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  const int64_t d = s.head_dim, q_rows = s.batch * s.heads * s.seq_q, kv_rows = s.batch * s.kv_heads * s.seq_k;
  HbmMatrix<const float> Q(static_cast<const float*>(a.q), q_rows, d, io);
  HbmMatrix<const float> K(static_cast<const float*>(a.k), kv_rows, d, io);
  HbmMatrix<const float> V(static_cast<const float*>(a.v), kv_rows, d, io);
  HbmMatrix<const float> O(static_cast<const float*>(a.o), q_rows, d, io);
  HbmMatrix<const float> dO(static_cast<const float*>(a.dout), q_rows, d, io);
  HbmMatrix<const float> L(a.lse, q_rows, 1, io);
  HbmMatrix<float> dQ(static_cast<float*>(a.dq), q_rows, d, io);
  HbmMatrix<float> dK(static_cast<float*>(a.dk), kv_rows, d, io);
  HbmMatrix<float> dV(static_cast<float*>(a.dv), kv_rows, d, io);
  HbmMatrix<float> Dm(static_cast<float*>(a.workspace), q_rows, 1, io);
  const float scale = s.softmax_scale();

  // Preprocessing, once per query head: D = rowsum(dO ∘ O), and dQ = 0 for the accumulation.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h);
      const Block o = O.load_rows(q0, s.seq_q), dout = dO.load_rows(q0, s.seq_q);
      Dm.store(q0, 0, (o.array() * dout.array()).rowwise().sum().matrix());
      dQ.store(q0, 0, Block::Zero(s.seq_q, d));
    }

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t hk = 0; hk < s.kv_heads; ++hk) {
      const int64_t k0 = (b * s.kv_heads + hk) * s.seq_k;
      for (int64_t j0 = 0; j0 < s.seq_k; j0 += kBc) {  // outer: K/V blocks
        const int64_t bc = std::min(kBc, s.seq_k - j0);
        const Block Kj = K.load_rows(k0 + j0, bc), Vj = V.load_rows(k0 + j0, bc);
        Block dKj = Block::Zero(bc, d), dVj = Block::Zero(bc, d);  // on chip until j is done
        for (int64_t h = hk * s.group(); h < (hk + 1) * s.group(); ++h) {  // the group's heads
          const int64_t q0 = s.q_row0(b, h);
          for_visible_q_blocks(s, j0, [&](int64_t i0, int64_t br) {  // inner: Q blocks
            const Block Qi = Q.load_rows(q0 + i0, br), dOi = dO.load_rows(q0 + i0, br);
            const Block Li = L.load_rows(q0 + i0, br), Di = Dm.load_rows(q0 + i0, br);
            // Recompute P = exp(S − L) for this tile; masked keys and rows that see nothing: 0.
            Block P = (Qi * Kj.transpose()) * scale;
            for (int64_t r = 0; r < br; ++r)
              for (int64_t c = 0; c < bc; ++c)
                P(r, c) = (j0 + c > s.last_key(i0 + r) || Li(r, 0) == kNegInf) ? 0.f : std::exp(P(r, c) - Li(r, 0));
            dVj += P.transpose() * dOi;                                   // dV = Pᵀ dO
            const Block dP = dOi * Vj.transpose();                        // dP = dO Vᵀ
            const Block dS = (P.array() * (dP.colwise() - Di.col(0)).array()).matrix();  // P ∘ (dP − D)
            dKj += scale * (dS.transpose() * Qi);                         // dK = scale · dSᵀ Q
            Block dQi = dQ.load_rows(q0 + i0, br);                        // dQ: a round trip per block
            dQi += scale * (dS * Kj);
            dQ.store(q0 + i0, 0, dQi);
          });
        }
        dK.store(k0 + j0, 0, dKj);
        dV.store(k0 + j0, 0, dVj);
      }
    }
}

static const Register<BackwardRung<Backend::Cpu>> registered;

}  // namespace fl::backward
