// Passes 1 and 3 of standard attention in a CPU twin: whole-head Eigen products, every byte of
// Q, K, V, S, P and O moved through the IO counter.
#include "standard_attention.hpp"

#include "twin.hpp"

#include <limits>

namespace fl::standard {

std::size_t workspace_bytes(const AttentionShape& s) {
  return 2 * std::size_t(s.score_elems()) * sizeof(float);
}

IoModel io_model(const AttentionShape& s, int softmax_reads) {
  const double bh = double(s.batch * s.heads), nq = double(s.seq_q), nk = double(s.seq_k),
               d = double(s.head_dim), w = sizeof(float);
  IoModel m;
  m.read = bh * w * (nq * d + nk * d              // pass 1: Q, K
                     + softmax_reads * nq * nk    // pass 2: S, once per softmax sweep
                     + nq * nk + nk * d);         // pass 3: P, V
  m.written = bh * w * (nq * nk                   // pass 1: S
                        + nq * nk + nq            // pass 2: P, lse
                        + nq * d);                // pass 3: O
  return m;
}

Capabilities capabilities() {
  Capabilities c;
  c.dtypes = {DType::F32};
  c.max_head_dim = 256;
  c.workspace_what = "S and P, B*H*Nq*Nk fp32 each";
  return c;
}

void twin_forward(const AttentionShape& s, const ForwardArgs& a, TwinSoftmax softmax) {
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  const int64_t rows = s.batch * s.heads * s.seq_q;
  float* ws = static_cast<float*>(a.workspace);
  auto [Q, K, V, O, L] = twin_arrays(s, a, io);
  HbmMatrix<float> S(ws, rows, s.seq_k, io);
  HbmMatrix<float> P(ws + s.score_elems(), rows, s.seq_k, io);
  const float scale = s.softmax_scale();

  // Pass 1: S = Q·Kᵀ·scale, one (batch, head) at a time; masked scores are −∞ so exp() gives 0.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);  // GQA: a shared K/V head
      const Block q = Q.load_rows(q0, s.seq_q), k = K.load_rows(k0, s.seq_k);
      Block sc = (q * k.transpose()) * scale;
      for (int64_t i = 0; i < s.seq_q; ++i)
        for (int64_t j = std::max<int64_t>(s.last_key(i) + 1, 0); j < s.seq_k; ++j)
          sc(i, j) = -std::numeric_limits<float>::infinity();
      S.store(q0, 0, sc);
    }

  // Pass 2: the rung's own softmax.
  softmax(S, P, L);

  // Pass 3: O = P·V.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);
      const Block p = P.load_rows(q0, s.seq_q), v = V.load_rows(k0, s.seq_k);
      O.store(q0, 0, p * v);
    }
}

}  // namespace fl::standard
