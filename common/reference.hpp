// The oracle: attention forward and backward in fp64 with Eigen, written for clarity, never
// optimised and never shared with a rung's own code. Inputs are the exact values a rung receives
// (already rounded to the rung's dtype), widened to double.
#pragma once

#include <cstdint>
#include <vector>

#include "problem.hpp"

namespace fl {

struct ReferenceForward {
  std::vector<int64_t> rows;  // the query rows computed in every (b, h); all rows when built with {}
  std::vector<double> o;      // [B, H, R, d], R = rows.size()
  std::vector<double> lse;    // [B, H, R]; −∞ for a row that sees no key
};

// `rows`: the query rows to compute (each < Nq), or empty for all. Checking a sample of rows keeps
// the oracle cheap for long sequences; every row still attends to every key.
ReferenceForward reference_forward(const AttentionShape& s, const float* q,  // [B, H, Nq, d]
                                   const float* k,                           // [B, Hkv, Nk, d]
                                   const float* v,                           // [B, Hkv, Nk, d]
                                   std::vector<int64_t> rows = {});

struct ReferenceBackward {
  std::vector<double> dq;  // [B, H, Nq, d]
  std::vector<double> dk;  // [B, Hkv, Nk, d], summed over the query heads of each group
  std::vector<double> dv;  // [B, Hkv, Nk, d], likewise
};

// dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(P ∘ dP)), dQ = scale·dS K, dK = scale·dSᵀ Q.
ReferenceBackward reference_backward(const AttentionShape& s, const float* q, const float* k,
                                     const float* v, const float* dout);  // dout: [B, H, Nq, d]

// The same gradients computed from what a rung's backward is handed besides Q, K, V and dO: the
// forward's O and lse. P = exp(S − lse) with the given lse (not renormalized) and D = rowsum(dO ∘ O)
// with the given O. With the exact O and lse it equals reference_backward; the checks run it on
// slightly changed O and lse (and Q, K, V, dO) to see how far the exact gradients move when a
// rung's inputs are a little off (harness.hpp: the condition floor). A row that sees no key
// (lse = −∞) gets P = 0.
ReferenceBackward reference_backward_given(const AttentionShape& s, const float* q, const float* k,
                                           const float* v, const float* o,  // o: [B, H, Nq, d]
                                           const float* lse,                // [B, H, Nq]
                                           const float* dout);

// (Q·Kᵀ·scale)·V with no softmax and no mask: what rung 03's fused tiling demo computes.
std::vector<double> reference_no_softmax(const AttentionShape& s, const float* q, const float* k,
                                         const float* v);  // -> [B, H, Nq, d]

// A set of rows that always includes the first and last row and the ragged edges, plus
// `count` rows spread evenly; all rows when Nq <= count.
std::vector<int64_t> sample_rows(int64_t seq_q, int64_t count);

}  // namespace fl
