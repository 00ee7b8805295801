// Rung 03, CPU twin: the same T×T tiles as the kernels, every tile load counted.
#include "block_matmul.hpp"

#include "twin.hpp"

#include <limits>

namespace fl::block_matmul {
namespace {

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

}  // namespace

IoModel io_model(const AttentionShape& s) {
  const double bh = double(s.batch * s.heads), nq = double(s.seq_q), nk = double(s.seq_k),
               d = double(s.head_dim), w = sizeof(float);
  const double tr = double(tiles(s.seq_q)), tc = double(tiles(s.seq_k)), td = double(tiles(s.head_dim));
  IoModel m;
  m.read = bh * w * (nq * d * tc + nk * d * tr   // S tiles: Q once per column tile, K per row tile
                     + 2 * nq * nk                // rung 02's softmax: two sweeps over S
                     + nq * nk * td + nk * d * tr);  // O tiles: P once per column tile of O, V per row tile
  m.written = bh * w * (nq * nk + nq * nk + nq + nq * d);  // S, P, lse, O
  return m;
}

void twin_forward(const AttentionShape& s, const ForwardArgs& a) {
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  const int64_t d = s.head_dim, nq = s.seq_q, nk = s.seq_k, rows = s.batch * s.heads * nq;
  float* ws = static_cast<float*>(a.workspace);
  auto [Q, K, V, O, L] = twin_arrays(s, a, io);
  HbmMatrix<float> S(ws, rows, nk, io);
  HbmMatrix<float> P(ws + s.score_elems(), rows, nk, io);
  const float scale = s.softmax_scale();

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);
      // Pass 1, tile (i, j) of S: a T-row block of Q and of K, each d wide, in T×T pieces.
      for (int64_t i0 = 0; i0 < nq; i0 += kTile)
        for (int64_t j0 = 0; j0 < nk; j0 += kTile) {
          const int64_t br = std::min<int64_t>(kTile, nq - i0), bc = std::min<int64_t>(kTile, nk - j0);
          Block acc = Block::Zero(br, bc);
          for (int64_t c0 = 0; c0 < d; c0 += kTile) {
            const int64_t bd = std::min<int64_t>(kTile, d - c0);
            acc += Q.load(q0 + i0, br, c0, bd) * K.load(k0 + j0, bc, c0, bd).transpose();
          }
          acc *= scale;
          for (int64_t r = 0; r < br; ++r)
            for (int64_t c = 0; c < bc; ++c)
              if (j0 + c > s.last_key(i0 + r)) acc(r, c) = -std::numeric_limits<float>::infinity();
          S.store(q0 + i0, j0, acc);
        }
    }

  online_softmax::twin_softmax(S, P, L);  // pass 2: rung 02's

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);
      // Pass 3, tile (i, c) of O: Σ over key tiles j of P_ij (T×T) times V_jc (T×T).
      for (int64_t i0 = 0; i0 < nq; i0 += kTile)
        for (int64_t c0 = 0; c0 < d; c0 += kTile) {
          const int64_t br = std::min<int64_t>(kTile, nq - i0), bd = std::min<int64_t>(kTile, d - c0);
          Block acc = Block::Zero(br, bd);
          for (int64_t j0 = 0; j0 < nk; j0 += kTile) {
            const int64_t bc = std::min<int64_t>(kTile, nk - j0);
            acc += P.load(q0 + i0, br, j0, bc) * V.load(k0 + j0, bc, c0, bd);
          }
          O.store(q0 + i0, c0, acc);
        }
    }
}

IoModel fused_io_model(const AttentionShape& s) {
  const double bh = double(s.batch * s.heads), w = sizeof(float), d = double(s.head_dim);
  IoModel m;
  m.read = bh * w * (s.seq_q * d + 2.0 * s.seq_k * d * double(tiles(s.seq_q)));
  m.written = bh * w * s.seq_q * d;
  return m;
}

void twin_fused_no_softmax(const AttentionShape& s, const float* q, const float* k, const float* v,
                           float* o, IoCounter& io) {
  const int64_t d = s.head_dim, nq = s.seq_q, nk = s.seq_k;
  HbmMatrix<const float> Q(q, s.batch * s.heads * nq, d, io);
  HbmMatrix<const float> K(k, s.batch * s.kv_heads * nk, d, io);
  HbmMatrix<const float> V(v, s.batch * s.kv_heads * nk, d, io);
  HbmMatrix<float> O(o, s.batch * s.heads * nq, d, io);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);
      for (int64_t i0 = 0; i0 < nq; i0 += kTile) {
        const int64_t br = std::min<int64_t>(kTile, nq - i0);
        const Block qi = Q.load_rows(q0 + i0, br);  // on chip for the whole row of tiles
        Block oi = Block::Zero(br, d);
        for (int64_t j0 = 0; j0 < nk; j0 += kTile) {
          const int64_t bc = std::min<int64_t>(kTile, nk - j0);
          const Block kj = K.load_rows(k0 + j0, bc), vj = V.load_rows(k0 + j0, bc);
          const Block sij = (qi * kj.transpose()) * s.softmax_scale();  // never leaves chip
          oi += sij * vj;  // final as soon as it is added: nothing later rescales it
        }
        O.store(q0 + i0, 0, oi);
      }
    }
}

static const Register<BlockMatmul<Backend::Cpu>> registered;
}  // namespace fl::block_matmul
