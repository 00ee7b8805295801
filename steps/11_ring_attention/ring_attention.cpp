// Rung 11, the twin: P ranks simulated in one process, each with its own shards, passing K/V (and
// in the backward dK/dV) around a ring; every byte sent counted. A step's attention is a
// registered twin of the ladder (local_rung), on a sub-problem cut out of the rank's buffers.
#include "ring_attention.hpp"
#include "ring_gpu.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "../02_online_softmax/online_softmax.hpp"
#include "../07_backward_recompute/backward_recompute.hpp"

namespace fl::ring {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

InputError bad(const std::string& what) { return InputError("rung 11_ring_attention: " + what); }

// ---- Rows of [groups, n, width] tensors ----------------------------------------------------------
// Every array here is `groups` (B·H or B·Hkv) heads of n rows of `width` elements ([B, H, n, d], or
// width 1 for lse). A shard, a sub-problem and a step's result are rows of such arrays; one helper
// moves them: rows [from, from + count) of every head of src (n_src rows a head) go to rows
// [to, to + count) of dst (n_dst a head), element by element through `op(dst_elem, src_elem)`.
struct RowCopy {
  int64_t groups, width;
  int64_t n_src, from, n_dst, to, count;
};
template <class D, class S, class Op>
void for_rows(const RowCopy& c, const S* src, D* dst, Op op) {
  for (int64_t g = 0; g < c.groups; ++g)
    for (int64_t i = 0; i < c.count; ++i) {
      const S* a = src + ((g * c.n_src) + c.from + i) * c.width;
      D* b = dst + ((g * c.n_dst) + c.to + i) * c.width;
      for (int64_t e = 0; e < c.width; ++e) op(b[e], a[e]);
    }
}
template <class D, class S>
void copy_rows(const RowCopy& c, const S* src, D* dst) {
  for_rows(c, src, dst, [](D& y, const S& x) { y = D(float(x)); });
}

// Rows [r0, r0 + n) of every head of a local array (L rows a head), as their own array.
template <class T>
std::vector<T> slice(const std::vector<T>& local, int64_t groups, int64_t width, int64_t L, int64_t r0, int64_t n) {
  std::vector<T> out(std::size_t(groups * n * width));
  copy_rows({groups, width, L, r0, n, 0, n}, local.data(), out.data());
  return out;
}

// Where rank r's local rows sit in the whole sequence: its chunks, in local order.
struct Piece {
  int64_t local0, global0, rows;
};
std::vector<Piece> pieces(const RingShape& s, int64_t r) {
  std::vector<Piece> out;
  int64_t at = 0;
  for (int64_t c : s.chunks_of(r)) {
    out.push_back({at, c * s.chunk_len(), s.chunk_len()});
    at += s.chunk_len();
  }
  return out;
}

// Rank r's shard of a whole array [groups, N, width]: its rows, copied out (the rank's own memory).
template <class T>
std::vector<T> shard(const RingShape& s, int64_t r, const T* whole, int64_t groups, int64_t width) {
  const int64_t L = s.local_len();
  std::vector<T> out(std::size_t(groups * L * width));
  for (const Piece& p : pieces(s, r)) copy_rows({groups, width, s.seq(), p.global0, L, p.local0, p.rows}, whole, out.data());
  return out;
}
// The reverse: rank r's local rows (fp32 or T) into their places in the whole array, rounded to T.
template <class T, class S>
void unshard(const RingShape& s, int64_t r, const std::vector<S>& local, T* whole, int64_t groups, int64_t width) {
  const int64_t L = s.local_len();
  for (const Piece& p : pieces(s, r)) copy_rows({groups, width, L, p.local0, s.seq(), p.global0, p.rows}, local.data(), whole);
}

// ---- The ring ---------------------------------------------------------------------------------

// What a rank holds of one K/V shard while it travels, and where it started.
template <class T>
struct KvShard {
  int64_t origin = 0;
  std::vector<T> k, v;         // [B, Hkv, L, d]
  std::vector<float> dk, dv;   // backward: the shard's fp32 dK/dV accumulators, [B, Hkv, L, d]
  uint64_t bytes(bool with_kv, bool with_grads) const {
    return (with_kv ? (k.size() + v.size()) * sizeof(T) : 0) + (with_grads ? (dk.size() + dv.size()) * sizeof(float) : 0);
  }
};

// Every rank sends what it holds to rank r + 1 and receives what rank r − 1 held: the ring's one
// communication step (ncclSend / ncclRecv on the GPUs). The copy goes through a receive buffer so
// that no rank reads what another rank still owns. Counts the bytes; a rank never sends to itself
// (P = 1 moves nothing).
template <class T>
void pass_around(std::vector<KvShard<T>>& held, bool with_kv, bool with_grads, RingStats& st, int64_t step) {
  const int64_t P = int64_t(held.size());
  if (P == 1) return;
  std::vector<KvShard<T>> recv(held.size());
  for (int64_t r = 0; r < P; ++r) {
    const int64_t to = (r + 1) % P;
    const uint64_t b = held[std::size_t(r)].bytes(with_kv, with_grads);
    recv[std::size_t(to)] = std::move(held[std::size_t(r)]);
    if (!with_kv) recv[std::size_t(to)].k.clear(), recv[std::size_t(to)].v.clear();  // only dK/dV went
    st.ranks[std::size_t(r)].bytes_sent += b;
    st.ranks[std::size_t(to)].bytes_received += b;
    st.bytes_per_step[std::size_t(step)] += b;
  }
  held = std::move(recv);
}

// Chunk pairs of one step into rank r's account: full or diagonal when inside the plan's
// rectangle and visible; skipped when no query of the pair sees a key of it (outside the
// rectangle, or at step 0 a pair wholly above the diagonal, whose blocks the local kernel skips).
void count_pairs(const RingShape& s, int64_t r, const StepPlan& p, RankStats& st) {
  const int64_t c = s.chunk_len();
  const std::vector<int64_t> qc = s.chunks_of(r), kc = s.chunks_of(p.source);
  for (std::size_t a = 0; a < qc.size(); ++a)
    for (std::size_t b = 0; b < kc.size(); ++b) {
      const bool inside = int64_t(a) * c >= p.q0 && int64_t(a + 1) * c <= p.q0 + p.nq && int64_t(b) * c >= p.k0 &&
                          int64_t(b + 1) * c <= p.k0 + p.nk;
      if (inside && (!s.attn.causal || qc[a] > kc[b])) {
        ++st.pairs_full;
        st.scores += c * c;
      } else if (inside && qc[a] == kc[b]) {
        ++st.pairs_diagonal;
        st.scores += c * (c + 1) / 2;
      } else {
        ++st.pairs_skipped;
      }
    }
}

// The sub-problem of one step: the plan's rows of Q against its rows of the visiting K/V.
AttentionShape sub_shape(const RingShape& s, const StepPlan& p) {
  AttentionShape a = s.attn;
  a.seq_q = p.nq;
  a.seq_k = p.nk;
  a.causal = p.causal;
  return a;
}

// Folds a step's partial rows (O_p normalised, lse_p) into a rank's running rows, in fp32: rung
// 02's merge of the states {lse, 1} and {lse_p, 1}, then O = (e^(lse − m)·O + e^(lse_p − m)·O_p) / ℓ
// and lse = m + log ℓ, as rung 10 merges the pieces of a sequence.
template <class T>
void merge_rows(const std::vector<T>& o_p, const std::vector<float>& lse_p, int64_t groups, int64_t d, int64_t L,
                int64_t r0, std::vector<float>& o, std::vector<float>& lse) {
  const int64_t n = int64_t(lse_p.size()) / groups;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < n; ++i) {
      float& l = lse[std::size_t(g * L + r0 + i)];
      const float lp = lse_p[std::size_t(g * n + i)];
      float* row = o.data() + (g * L + r0 + i) * d;
      const T* part = o_p.data() + (g * n + i) * d;
      if (l == kNegInf) {  // an empty row takes the part as it is (if it saw a key): the blend
        if (lp == kNegInf) continue;  // below gives the same value, but 0·0 + (−0) is +0, not −0
        for (int64_t c = 0; c < d; ++c) row[c] = float(part[c]);
        l = lp;
        continue;
      }
      const online_softmax::RowState m = online_softmax::merge({l, 1.f}, {lp, 1.f});
      if (m.m == kNegInf) continue;  // neither side saw a key: O stays 0, lse −∞
      const float a = std::exp(l - m.m), b = std::exp(lp - m.m);
      for (int64_t c = 0; c < d; ++c) row[c] = (a * row[c] + b * float(part[c])) / m.l;
      l = m.m + std::log(m.l);
    }
}

// Everything refused before any work: the shape, what the local twin does not run, null pointers.
// Returns a zeroed account for the call.
RingStats check_call(const RingShape& s, DType t, std::initializer_list<const void*> ptrs) {
  s.validate();
  std::string why;
  if (!local_rung(t).supports(s.attn, t, &why)) throw bad("its local attention refuses the problem: " + why);
  for (const void* p : ptrs)
    if (!p) throw bad("a null pointer among the arrays of the call");
  return {std::vector<RankStats>(std::size_t(s.ranks)), std::vector<uint64_t>(std::size_t(s.ranks))};
}

template <class T>
void forward(const RingShape& s, DType t, const T* q, const T* k, const T* v, T* o, float* lse, RingStats& st) {
  const Rung& local = local_rung(t);
  const int64_t P = s.ranks, L = s.local_len(), d = s.attn.head_dim;
  const int64_t qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads;
  // Each rank's own memory: its Q shard, the K/V shard it holds now, its running O and lse.
  const std::size_t np = static_cast<std::size_t>(P);
  std::vector<std::vector<T>> Q(np);
  std::vector<KvShard<T>> held(np);
  std::vector<std::vector<float>> Oacc(np), Lacc(np);
  for (int64_t r = 0; r < P; ++r) {
    Q[std::size_t(r)] = shard(s, r, q, qh, d);
    held[std::size_t(r)] = {r, shard(s, r, k, kh, d), shard(s, r, v, kh, d), {}, {}};
    Oacc[std::size_t(r)].assign(std::size_t(qh * L * d), 0.f);
    Lacc[std::size_t(r)].assign(std::size_t(qh * L), kNegInf);
  }
  for (int64_t step = 0; step < P; ++step) {
    for (int64_t r = 0; r < P; ++r) {  // every rank at once on the GPUs; one after another here
      const StepPlan p = plan_step(s, r, step);
      RankStats& rs = st.ranks[std::size_t(r)];
      count_pairs(s, r, p, rs);
      if (p.nq == 0) continue;
      const KvShard<T>& kv = held[std::size_t(r)];
      const AttentionShape a = sub_shape(s, p);
      const std::vector<T> qs = slice(Q[std::size_t(r)], qh, d, L, p.q0, p.nq);
      const std::vector<T> ks = slice(kv.k, kh, d, L, p.k0, p.nk), vs = slice(kv.v, kh, d, L, p.k0, p.nk);
      std::vector<T> os(qs.size());
      std::vector<float> ls(std::size_t(qh * p.nq));
      std::vector<unsigned char> ws(local.workspace_bytes(a, t));
      ForwardArgs fa;
      fa.q = qs.data(), fa.k = ks.data(), fa.v = vs.data(), fa.o = os.data(), fa.lse = ls.data();
      fa.workspace = ws.empty() ? nullptr : ws.data();
      fa.io = &rs.hbm;
      local.forward(a, t, fa);
      merge_rows(os, ls, qh, d, L, p.q0, Oacc[std::size_t(r)], Lacc[std::size_t(r)]);
    }
    if (step + 1 < P) pass_around(held, /*with_kv=*/true, /*with_grads=*/false, st, step);
  }
  for (int64_t r = 0; r < P; ++r) {  // each rank's rows of the answer, O rounded to T once
    unshard(s, r, Oacc[std::size_t(r)], o, qh, d);
    unshard(s, r, Lacc[std::size_t(r)], lse, qh, 1);
  }
}

template <class T>
void backward(const RingShape& s, DType t, const T* q, const T* k, const T* v, const T* o, const float* lse,
              const T* dout, T* dq, T* dk, T* dv, RingStats& st) {
  const Rung& local = local_rung(t);
  const int64_t P = s.ranks, L = s.local_len(), d = s.attn.head_dim;
  const int64_t qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads;
  // Each rank keeps Q, O, lse and dO of its rows and its dQ accumulator; K/V shards travel with
  // their dK/dV accumulators.
  struct Rows {
    std::vector<T> q, o, dout;
    std::vector<float> lse, dq;
  };
  const std::size_t np = static_cast<std::size_t>(P);
  std::vector<Rows> R(np);
  std::vector<KvShard<T>> held(np);
  for (int64_t r = 0; r < P; ++r) {
    R[std::size_t(r)] = {shard(s, r, q, qh, d), shard(s, r, o, qh, d), shard(s, r, dout, qh, d), shard(s, r, lse, qh, 1),
                         std::vector<float>(std::size_t(qh * L * d), 0.f)};
    const std::vector<float> zero(std::size_t(kh * L * d), 0.f);
    held[std::size_t(r)] = {r, shard(s, r, k, kh, d), shard(s, r, v, kh, d), zero, zero};
  }
  auto add = [](float& y, const T& x) { y += float(x); };
  for (int64_t step = 0; step < P; ++step) {
    for (int64_t r = 0; r < P; ++r) {
      const StepPlan p = plan_step(s, r, step);
      RankStats& rs = st.ranks[std::size_t(r)];
      count_pairs(s, r, p, rs);
      if (p.nq == 0) continue;
      KvShard<T>& kv = held[std::size_t(r)];
      const Rows& mine = R[std::size_t(r)];
      const AttentionShape a = sub_shape(s, p);
      const std::vector<T> qs = slice(mine.q, qh, d, L, p.q0, p.nq), os = slice(mine.o, qh, d, L, p.q0, p.nq),
                           dos = slice(mine.dout, qh, d, L, p.q0, p.nq);
      const std::vector<float> ls = slice(mine.lse, qh, 1, L, p.q0, p.nq);
      const std::vector<T> ks = slice(kv.k, kh, d, L, p.k0, p.nk), vs = slice(kv.v, kh, d, L, p.k0, p.nk);
      std::vector<T> dqs(qs.size()), dks(ks.size()), dvs(vs.size());
      std::vector<unsigned char> ws(local.backward_workspace_bytes(a, t));
      BackwardArgs ba;
      ba.q = qs.data(), ba.k = ks.data(), ba.v = vs.data(), ba.o = os.data(), ba.lse = ls.data();
      ba.dout = dos.data(), ba.dq = dqs.data(), ba.dk = dks.data(), ba.dv = dvs.data();
      ba.workspace = ws.empty() ? nullptr : ws.data();
      ba.io = &rs.hbm;
      local.backward(a, t, ba);
      // The block pair's parts of the sums, added in fp32: dQ here, dK/dV to the travelling shard's.
      for_rows({qh, d, p.nq, 0, L, p.q0, p.nq}, dqs.data(), R[std::size_t(r)].dq.data(), add);
      for_rows({kh, d, p.nk, 0, L, p.k0, p.nk}, dks.data(), kv.dk.data(), add);
      for_rows({kh, d, p.nk, 0, L, p.k0, p.nk}, dvs.data(), kv.dv.data(), add);
    }
    // K/V go on to the next rank while a step remains; the dK/dV accumulators go every step, the
    // last time home: after step P − 1 rank r holds the shard of rank r + 1.
    pass_around(held, /*with_kv=*/step + 1 < P, /*with_grads=*/true, st, step);
  }
  for (int64_t r = 0; r < P; ++r) {
    const KvShard<T>& home = held[std::size_t(r)];
    if (home.origin != r) throw std::logic_error("rung 11_ring_attention: a dK/dV accumulator did not come home");
    unshard(s, r, R[std::size_t(r)].dq, dq, qh, d);
    unshard(s, r, home.dk, dk, kh, d);
    unshard(s, r, home.dv, dv, kh, d);
  }
}

// The storage type of a dtype: calls f with a null pointer of it.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(static_cast<float*>(nullptr));
    case DType::F16: return f(static_cast<Eigen::half*>(nullptr));
    case DType::BF16: return f(static_cast<Eigen::bfloat16*>(nullptr));
  }
}

}  // namespace

const char* sharding_name(Sharding s) { return s == Sharding::Zigzag ? "zigzag" : "contiguous"; }

void RingShape::validate() const {
  try {
    attn.validate();
  } catch (const InputError& e) {
    throw bad(e.what());
  }
  if (ranks < 1) throw bad("ranks (P) must be at least 1, not " + std::to_string(ranks));
  if (attn.seq_q != attn.seq_k)
    throw bad("ring attention splits one sequence attending to itself: seq_q must equal seq_k, not " +
              std::to_string(attn.seq_q) + " and " + std::to_string(attn.seq_k));
  if (seq() % chunks() != 0)
    throw bad("the sequence length " + std::to_string(seq()) + " must be a multiple of " + std::to_string(chunks()) +
              (sharding == Sharding::Zigzag ? " (2P chunks, zigzag)" : " (P shards, contiguous)"));
}

std::vector<int64_t> RingShape::chunks_of(int64_t rank) const {
  if (sharding == Sharding::Zigzag) return {rank, 2 * ranks - 1 - rank};  // r < 2P − 1 − r: ascending
  return {rank};
}

int64_t RingShape::global_row(int64_t rank, int64_t i) const {
  return chunks_of(rank)[std::size_t(i / chunk_len())] * chunk_len() + i % chunk_len();
}

void RingShape::shard(int64_t rank, const void* whole, void* local, int64_t groups, int64_t row_bytes) const {
  const auto* src = static_cast<const unsigned char*>(whole);
  auto* dst = static_cast<unsigned char*>(local);
  int64_t at = 0;  // the chunk's first local row
  for (int64_t c : chunks_of(rank)) {
    for (int64_t g = 0; g < groups; ++g)
      std::memcpy(dst + (g * local_len() + at) * row_bytes, src + (g * seq() + c * chunk_len()) * row_bytes,
                  std::size_t(chunk_len() * row_bytes));
    at += chunk_len();
  }
}

void RingShape::unshard(int64_t rank, const void* local, void* whole, int64_t groups, int64_t row_bytes) const {
  const auto* src = static_cast<const unsigned char*>(local);
  auto* dst = static_cast<unsigned char*>(whole);
  int64_t at = 0;
  for (int64_t c : chunks_of(rank)) {
    for (int64_t g = 0; g < groups; ++g)
      std::memcpy(dst + (g * seq() + c * chunk_len()) * row_bytes, src + (g * local_len() + at) * row_bytes,
                  std::size_t(chunk_len() * row_bytes));
    at += chunk_len();
  }
}

std::string RingShape::str() const {
  return attn.str() + " P=" + std::to_string(ranks) + " " + sharding_name(sharding);
}

StepPlan plan_step(const RingShape& s, int64_t rank, int64_t step) {
  StepPlan p;
  p.source = ((rank - step) % s.ranks + s.ranks) % s.ranks;
  const std::vector<int64_t> qc = s.chunks_of(rank), kc = s.chunks_of(p.source);
  const int64_t n = int64_t(qc.size()), c = s.chunk_len();
  auto sees = [&](int64_t a, int64_t b) { return !s.attn.causal || qc[std::size_t(a)] >= kc[std::size_t(b)]; };
  int64_t qa = n, qb = -1, ka = n, kb = -1;  // the rectangle, in chunks: [qa, qb] × [ka, kb]
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b)
      if (sees(a, b)) qa = std::min(qa, a), qb = std::max(qb, a), ka = std::min(ka, b), kb = std::max(kb, b);
  if (qb < 0) return p;  // nothing of the visiting shard is visible to this rank
  p.causal = s.attn.causal && step == 0;
  // Past step 0 the shards differ, so every pair in the rectangle must be wholly visible; at step
  // 0 Q and K/V are the same chunks in ascending order, so the local mask is the global one.
  for (int64_t a = qa; a <= qb; ++a)
    for (int64_t b = ka; b <= kb; ++b)
      if (!p.causal && !sees(a, b)) throw std::logic_error("rung 11_ring_attention: a step's rectangle holds a masked pair");
  p.q0 = qa * c, p.nq = (qb - qa + 1) * c, p.k0 = ka * c, p.nk = (kb - ka + 1) * c;
  return p;
}

double RingIo::forward_step(int64_t step, int64_t P) const {
  return P > 1 && step + 1 < P ? double(P) * kv_shard : 0.0;
}
double RingIo::backward_step(int64_t step, int64_t P) const {
  return P > 1 ? double(P) * ((step + 1 < P ? kv_shard : 0.0) + dkv_shard) : 0.0;
}

RingIo ring_io_model(const RingShape& s, DType t) {
  const double P = double(s.ranks), rows = double(s.attn.batch * s.attn.kv_heads * s.local_len() * s.attn.head_dim);
  RingIo m;
  m.kv_shard = 2 * rows * double(dtype_bytes(t));
  m.dkv_shard = 2 * rows * sizeof(float);
  m.forward_per_rank = (P - 1) * m.kv_shard;
  m.backward_per_rank = s.ranks > 1 ? (P - 1) * m.kv_shard + P * m.dkv_shard : 0.0;
  return m;
}

const Rung& local_rung(DType t) {
  const char* name = t == DType::F32 ? backward::kName : backward::kMmaName;
  const Rung* r = Registry::instance().find(name, Backend::Cpu);
  if (!r) throw bad(std::string("its local twin ") + name + " is not in this build");
  return *r;
}

void twin_ring_forward(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                       RingStats* stats) {
  RingStats st = check_call(s, t, {q, k, v, o, lse});
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    forward<T>(s, t, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), lse,
               st);
  });
  if (stats) *stats = std::move(st);
}

void twin_ring_backward(const RingShape& s, DType t, const void* q, const void* k, const void* v, const void* o,
                        const float* lse, const void* dout, void* dq, void* dk, void* dv, RingStats* stats) {
  RingStats st = check_call(s, t, {q, k, v, o, lse, dout, dq, dk, dv});
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    backward<T>(s, t, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                static_cast<const T*>(o), lse, static_cast<const T*>(dout), static_cast<T*>(dq), static_cast<T*>(dk),
                static_cast<T*>(dv), st);
  });
  if (stats) *stats = std::move(st);
}

RingForwardRun run_ring_forward(const RingShape& s, DType t, const Inputs& in) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t);
  RingForwardRun r;
  r.o = to_storage(std::vector<float>(in.q.size(), nan), t);
  r.out.lse.assign(std::size_t(s.attn.lse_elems()), nan);
  twin_ring_forward(s, t, q.data(), k.data(), v.data(), r.o.data(), r.out.lse.data(), &r.stats);
  r.out.o = from_storage(r.o, t);
  return r;
}

RingBackwardRun run_ring_backward(const RingShape& s, DType t, const Inputs& in, const BackwardInputs& bin) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto st = [t](const std::vector<float>& x) { return to_storage(x, t); };
  const std::vector<unsigned char> q = st(in.q), k = st(in.k), v = st(in.v), o = st(bin.o), dout = st(bin.dout);
  std::vector<unsigned char> dq = st(std::vector<float>(in.q.size(), nan)), dk = st(std::vector<float>(in.k.size(), nan)),
                             dv = dk;
  RingBackwardRun r;
  twin_ring_backward(s, t, q.data(), k.data(), v.data(), o.data(), bin.lse.data(), dout.data(), dq.data(), dk.data(),
                     dv.data(), &r.stats);
  r.grads = {from_storage(dq, t), from_storage(dk, t), from_storage(dv, t)};
  return r;
}

void NcclRank::backward(const void*, const void*, const void*, const void*, const float*, const void*, void*, void*,
                        void*) {
  throw bad("the ring's " + version() + " has no backward on the GPUs (v5_backward is the first that does)");
}

#if !FLASH_LADDER_HAS_NCCL
// Why, as CMake knew it: it looks for NCCL only in a build with CUDA.
#if FLASH_LADDER_HAS_CUDA
constexpr const char* kNoNccl = "this build has no NCCL (CMake found none)";
#else
constexpr const char* kNoNccl = "this build has no NCCL (it has no CUDA, so none was looked for)";
#endif
std::unique_ptr<NcclRank> nccl_ring_open(const std::string&, const RingShape&, DType, void*, void*, const std::string&) {
  throw bad(std::string(kNoNccl) + ": the ring across GPUs is left out");
}
const Rung& gpu_local_backward_rung(DType) {
  throw bad(std::string(kNoNccl) + ": the ring's backward runs on the GPUs only with it");
}
void nccl_ring_forward(const RingShape&, DType, const void*, const void*, const void*, void*, float*, void*, void*,
                       const std::string&) {
  throw bad(std::string(kNoNccl) + ": the ring across GPUs is left out");
}
bool nccl_built() { return false; }
void nccl_unique_id(void*) { throw bad(std::string(kNoNccl) + ": no communicator to make"); }
void* nccl_comm_init(const void*, int, int) {
  throw bad(std::string(kNoNccl) + ": no communicator to make");
}
void nccl_comm_destroy(void*) { throw bad(std::string(kNoNccl) + ": no communicator to free"); }
std::vector<std::string> nccl_ring_forward_on_gpus(const RingShape&, DType, const void*, const void*, const void*, void*,
                                                   float*, int, double*) {
  throw bad(std::string(kNoNccl) + ": the ring across GPUs is left out");
}
#endif
#if !FLASH_LADDER_HAS_CUDA
const Rung& gpu_local_rung(DType) { throw bad("this build has no CUDA: the ring runs on the GPU only with it"); }
void gpu_ring_forward_local(const RingShape&, DType, const void*, const void*, const void*, void*, float*, void*) {
  throw bad("this build has no CUDA: twin_ring_forward runs the ring on the CPU");
}
#endif

}  // namespace fl::ring
