// The arrays of one forward pass as a CPU twin sees them: matrices in its "device memory" whose
// every access goes through the IO counter. One place builds them, so the twins of rungs 00–05 do
// not each repeat the pointer casts and row counts.
#pragma once

#include "io_counter.hpp"
#include "rung.hpp"

namespace fl {

struct TwinArrays {
  HbmMatrix<const float> Q;  // [B·H·Nq, d]
  HbmMatrix<const float> K;  // [B·Hkv·Nk, d]
  HbmMatrix<const float> V;  // [B·Hkv·Nk, d]
  HbmMatrix<float> O;        // [B·H·Nq, d]
  HbmMatrix<float> LSE;      // [B·H·Nq, 1]
};

// fp32 arrays over a forward call's pointers, counting into `io`.
inline TwinArrays twin_arrays(const AttentionShape& s, const ForwardArgs& a, IoCounter& io) {
  const int64_t q_rows = s.batch * s.heads * s.seq_q, kv_rows = s.batch * s.kv_heads * s.seq_k;
  const int64_t d = s.head_dim;
  return {HbmMatrix<const float>(static_cast<const float*>(a.q), q_rows, d, io),
          HbmMatrix<const float>(static_cast<const float*>(a.k), kv_rows, d, io),
          HbmMatrix<const float>(static_cast<const float*>(a.v), kv_rows, d, io),
          HbmMatrix<float>(static_cast<float*>(a.o), q_rows, d, io),
          HbmMatrix<float>(a.lse, q_rows, 1, io)};
}

}  // namespace fl
