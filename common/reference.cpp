#include "reference.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

namespace fl {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One [n, d] head of a [B, heads, n, d] tensor, widened to double.
MatD head(const float* x, int64_t b, int64_t h, int64_t heads, int64_t n, int64_t d) {
  const float* p = x + ((b * heads + h) * n) * d;
  MatD m(n, d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < d; ++c) m(i, c) = double(p[i * d + c]);
  return m;
}

// P = softmax(S) row by row, masked entries already −∞. A row with no visible key gets P = 0 and
// lse = −∞.
void softmax_rows(MatD& s, std::vector<double>* lse) {
  for (int64_t i = 0; i < s.rows(); ++i) {
    const double m = s.row(i).maxCoeff();
    if (m == kNegInf) {
      s.row(i).setZero();
      if (lse) lse->push_back(kNegInf);
      continue;
    }
    double l = 0;
    for (int64_t j = 0; j < s.cols(); ++j) l += (s(i, j) = std::exp(s(i, j) - m));
    s.row(i) /= l;
    if (lse) lse->push_back(m + std::log(l));
  }
}

// Scores for the given query rows of one head, with the causal mask applied.
MatD scores(const AttentionShape& sh, const MatD& q, const MatD& k, const std::vector<int64_t>& rows) {
  MatD qr(rows.size(), sh.head_dim);
  for (size_t r = 0; r < rows.size(); ++r) qr.row(r) = q.row(rows[r]);
  MatD s = (qr * k.transpose()) * double(sh.softmax_scale());
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t j = sh.last_key(rows[r]) + 1; j < sh.seq_k; ++j)
      if (j >= 0) s(r, j) = kNegInf;
  return s;
}

std::vector<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < n; ++i) r[i] = i;
  return r;
}

}  // namespace

std::vector<int64_t> sample_rows(int64_t seq_q, int64_t count) {
  if (seq_q <= count) return all_rows(seq_q);
  std::vector<int64_t> r = {0, 1, seq_q - 2, seq_q - 1};
  for (int64_t t = 0; t < count; ++t) r.push_back(t * (seq_q - 1) / std::max<int64_t>(count - 1, 1));
  // Rows just around multiples of 64 and 128 catch block-edge bugs in tiled kernels.
  for (int64_t e : {63, 64, 127, 128, 129})
    if (e < seq_q) r.push_back(e);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

ReferenceForward reference_forward(const AttentionShape& s, const float* q, const float* k,
                                   const float* v, std::vector<int64_t> rows) {
  s.validate();
  if (rows.empty()) rows = all_rows(s.seq_q);
  for (int64_t r : rows)
    if (r < 0 || r >= s.seq_q) throw InputError("reference_forward: row " + std::to_string(r) + " outside Nq");
  ReferenceForward out;
  out.rows = rows;
  out.o.reserve(s.batch * s.heads * rows.size() * s.head_dim);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t hk = h / s.group();
      const MatD qh = head(q, b, h, s.heads, s.seq_q, s.head_dim);
      const MatD kh = head(k, b, hk, s.kv_heads, s.seq_k, s.head_dim);
      const MatD vh = head(v, b, hk, s.kv_heads, s.seq_k, s.head_dim);
      MatD p = scores(s, qh, kh, rows);
      softmax_rows(p, &out.lse);
      const MatD o = p * vh;
      out.o.insert(out.o.end(), o.data(), o.data() + o.size());
    }
  return out;
}

// The backward both entry points share. For each head, `probs(b, h, qh, kh)` gives the softmax P
// and `delta(b, h, p, dp)` the row sums D_i = sum_j P_ij dP_ij (equal to rowsum(dO * O)); then
// dV = P^T dO, dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q, summed over a GQA group.
template <class Probs, class Delta>
ReferenceBackward backward_over_heads(const AttentionShape& s, const float* q, const float* k,
                                      const float* v, const float* dout, Probs probs, Delta delta) {
  s.validate();
  const int64_t d = s.head_dim;
  ReferenceBackward g;
  g.dq.assign(s.q_elems(), 0.0);
  g.dk.assign(s.kv_elems(), 0.0);
  g.dv.assign(s.kv_elems(), 0.0);
  const double scale = s.softmax_scale();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t hk = h / s.group();
      const MatD qh = head(q, b, h, s.heads, s.seq_q, d);
      const MatD kh = head(k, b, hk, s.kv_heads, s.seq_k, d);
      const MatD vh = head(v, b, hk, s.kv_heads, s.seq_k, d);
      const MatD doh = head(dout, b, h, s.heads, s.seq_q, d);
      const MatD p = probs(b, h, qh, kh);
      const MatD dv = p.transpose() * doh;
      const MatD dp = doh * vh.transpose();
      const Eigen::VectorXd dd = delta(b, h, p, dp);
      const MatD ds = p.array() * (dp.colwise() - dd).array();
      const MatD dq = scale * ds * kh;
      const MatD dk = scale * ds.transpose() * qh;
      double* dq_out = g.dq.data() + ((b * s.heads + h) * s.seq_q) * d;
      double* dk_out = g.dk.data() + ((b * s.kv_heads + hk) * s.seq_k) * d;
      double* dv_out = g.dv.data() + ((b * s.kv_heads + hk) * s.seq_k) * d;
      for (int64_t i = 0; i < dq.size(); ++i) dq_out[i] = dq.data()[i];
      for (int64_t i = 0; i < dk.size(); ++i) dk_out[i] += dk.data()[i];  // GQA: sum the group
      for (int64_t i = 0; i < dv.size(); ++i) dv_out[i] += dv.data()[i];
    }
  return g;
}

ReferenceBackward reference_backward(const AttentionShape& s, const float* q, const float* k,
                                     const float* v, const float* dout) {
  const std::vector<int64_t> rows = all_rows(s.seq_q);
  return backward_over_heads(
      s, q, k, v, dout,
      [&](int64_t, int64_t, const MatD& qh, const MatD& kh) {
        MatD p = scores(s, qh, kh, rows);
        softmax_rows(p, nullptr);
        return p;
      },
      [](int64_t, int64_t, const MatD& p, const MatD& dp) -> Eigen::VectorXd {
        return (p.array() * dp.array()).rowwise().sum();
      });
}

// P from the given lse and D from the given O (reference.hpp says what that is for).
ReferenceBackward reference_backward_given(const AttentionShape& s, const float* q, const float* k,
                                           const float* v, const float* o, const float* lse,
                                           const float* dout) {
  const std::vector<int64_t> rows = all_rows(s.seq_q);
  return backward_over_heads(
      s, q, k, v, dout,
      [&](int64_t b, int64_t h, const MatD& qh, const MatD& kh) {
        MatD p = scores(s, qh, kh, rows);
        const float* lse_h = lse + (b * s.heads + h) * s.seq_q;
        for (int64_t i = 0; i < s.seq_q; ++i) {
          const double l = lse_h[i];
          for (int64_t j = 0; j < s.seq_k; ++j) p(i, j) = std::isinf(l) ? 0.0 : std::exp(p(i, j) - l);
        }
        return p;
      },
      [&](int64_t b, int64_t h, const MatD&, const MatD&) -> Eigen::VectorXd {
        const MatD doh = head(dout, b, h, s.heads, s.seq_q, s.head_dim);
        const MatD oh = head(o, b, h, s.heads, s.seq_q, s.head_dim);
        return (doh.array() * oh.array()).rowwise().sum();
      });
}

std::vector<double> reference_no_softmax(const AttentionShape& s, const float* q, const float* k,
                                         const float* v) {
  s.validate();
  std::vector<double> out;
  out.reserve(s.o_elems());
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t hk = h / s.group();
      const MatD qh = head(q, b, h, s.heads, s.seq_q, s.head_dim);
      const MatD kh = head(k, b, hk, s.kv_heads, s.seq_k, s.head_dim);
      const MatD vh = head(v, b, hk, s.kv_heads, s.seq_k, s.head_dim);
      const MatD o = ((qh * kh.transpose()) * double(s.softmax_scale())) * vh;
      out.insert(out.end(), o.data(), o.data() + o.size());
    }
  return out;
}

}  // namespace fl
