// Rung 10, the twin: split-KV decoding with the query rows of a GQA group packed together, over a
// contiguous or a paged KV cache, every array behind the IO counter.
#include "decoding.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "../02_online_softmax/online_softmax.hpp"
#include "../06_tensor_core_mma/twin_step.hpp"
#include "io_counter.hpp"

namespace fl::decoding {
namespace {

using tensor_core_mma::twin_finish;
using tensor_core_mma::twin_row_step;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

InputError bad(const std::string& what) { return InputError("rung 10_decoding: " + what); }

// Where the twin reads one sequence's keys: rows of the K and V matrices, page by page.
struct KeyRows {
  const DecodeShape& s;
  int64_t b, kvh;
  // The row of K (and V) that holds key j: contiguous, (b·Hkv + kvh)·capacity + j; paged, row
  // j % page of (page id · Hkv + kvh), the page id read from the table (counted once a page).
  int64_t row(int64_t j, int32_t page_id) const {
    return s.paged() ? (int64_t(page_id) * s.kv_heads + kvh) * s.page_size + j % s.page_size
                     : (b * s.kv_heads + kvh) * s.capacity + j;
  }
};

// Keys [j0, j0 + n) of one sequence as an n × d block: one load per page-long run of them.
template <class T>
Block load_keys(const HbmMatrix<const T>& M, const KeyRows& kr, const std::vector<int32_t>& pages, int64_t j0,
                int64_t n) {
  Block out(n, M.cols());
  for (int64_t j = j0; j < j0 + n;) {
    const int64_t run = kr.s.paged() ? std::min(j0 + n, (j / kr.s.page_size + 1) * kr.s.page_size) - j : j0 + n - j;
    const int32_t page = kr.s.paged() ? pages[std::size_t(j / kr.s.page_size)] : 0;
    out.middleRows(j - j0, run) = M.load_rows(kr.row(j, page), run);
    j += run;
  }
  return out;
}

template <class T>
void twin(const DecodeShape& s, const DecodeArgs& a, const std::vector<int32_t>& len, int splits, IoCounter& io) {
  const int64_t d = s.head_dim, G = s.group(), Nq = s.seq_q, R = s.rows();
  const int64_t kv_rows = s.paged() ? s.num_pages * s.kv_heads * s.page_size : s.batch * s.kv_heads * s.capacity;
  const int64_t q_rows = s.batch * s.heads * Nq;
  HbmMatrix<const T> Q(static_cast<const T*>(a.q), q_rows, d, io);
  HbmMatrix<const T> K(static_cast<const T*>(a.k), kv_rows, d, io);
  HbmMatrix<const T> V(static_cast<const T*>(a.v), kv_rows, d, io);
  HbmMatrix<T> O(static_cast<T*>(a.o), q_rows, d, io);
  HbmMatrix<float> LSE(a.lse, q_rows, 1, io);
  // The pieces' outputs (splits > 1): row ((b·Hkv + kvh)·splits + p)·R + r, fp32.
  const int64_t part_rows = splits > 1 ? s.batch * s.kv_heads * splits * R : 0;
  float* ws = static_cast<float*>(a.workspace);
  HbmMatrix<float> Opart(ws, part_rows, d, io), Lpart(ws + part_rows * d, part_rows, 1, io);
  const float scale = s.softmax_scale();

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t kvh = 0; kvh < s.kv_heads; ++kvh) {
      const int64_t L = len[std::size_t(b)], chunk = piece_keys(s, L, splits), pieces = active_pieces(s, L, splits);
      // Packed row r = hl·Nq + i: query head kvh·G + hl, new row i. Its rows of Q are Nq apart in
      // [B·H·Nq], G heads in a row: one load of G·Nq consecutive rows.
      const int64_t q0 = s.q_row0(b, kvh * G);
      const KeyRows kr{s, b, kvh};
      const int64_t base = (b * s.kv_heads + kvh) * splits;

      // ---- the split pass: one thread block per piece ----
      for (int64_t p = 0; p < pieces; ++p) {
        const int64_t k0 = p * chunk, k1 = std::min(L, k0 + chunk);
        const Block Qp = Q.load_rows(q0, R);  // each piece's block reads the packed rows
        // The page ids of the piece's pages (it starts on a page boundary: each read once).
        std::vector<int32_t> pages;
        if (s.paged()) {
          pages.assign(std::size_t((k1 + s.page_size - 1) / s.page_size), 0);
          for (int64_t pg = k0 / s.page_size; pg * s.page_size < k1; ++pg) {
            // A page id is an int32 read from device memory (HbmMatrix holds values seen as
            // float, which would round ids past 2^24): read and counted here; checked by twin_decode.
            pages[std::size_t(pg)] = a.page_table[b * s.pages_per_seq + pg];
            io.read += sizeof(int32_t);
          }
        }
        Block acc = Block::Zero(R, d);
        std::vector<online_softmax::RowState> st(static_cast<std::size_t>(R));
        for (int64_t j0 = k0; j0 < k1; j0 += kBlockKeys) {
          const int64_t bc = std::min(kBlockKeys, k1 - j0);
          const Block Kj = load_keys(K, kr, pages, j0, bc), Vj = load_keys(V, kr, pages, j0, bc);
          Block S = (Qp * Kj.transpose()) * scale;  // fp32 accumulation, like the tensor cores'
          for (int64_t r = 0; r < R; ++r) {
            const int64_t last = s.causal ? r % Nq + L - Nq : L - 1;  // the row's last key
            for (int64_t c = 0; c < bc; ++c)
              if (j0 + c > last) S(r, c) = kNegInf;
            twin_row_step<T>(S, r, Vj, acc, st[std::size_t(r)]);  // rung 06's step: P rounded to T
          }
        }
        const Block lse = twin_finish(acc, st);
        if (splits == 1) {  // the only piece: O and lse straight out, per query head
          for (int64_t hl = 0; hl < G; ++hl) {
            O.store(q0 + hl * Nq, 0, acc.middleRows(hl * Nq, Nq));
            LSE.store(q0 + hl * Nq, 0, lse.middleRows(hl * Nq, Nq));
          }
        } else {
          Opart.store((base + p) * R, 0, acc);
          Lpart.store((base + p) * R, 0, lse);
        }
      }
      if (splits == 1 && pieces > 0) continue;

      // ---- the merge: rung 02's merge of (m, ℓ) states, one state per piece ----
      // Piece p's rows hold O_p (normalised) and lse_p = m_p + log ℓ_p. As states {lse_p, 1}
      // they fold into {m, ℓ}; then lse = m + log ℓ and O = Σ_p exp(lse_p − m) O_p / ℓ.
      Block Om = Block::Zero(R, d), lse(R, 1);
      if (pieces > 0) {
        std::vector<Block> Op, Lp;
        for (int64_t p = 0; p < pieces; ++p) {
          Op.push_back(Opart.load_rows((base + p) * R, R));
          Lp.push_back(Lpart.load_rows((base + p) * R, R));
        }
        for (int64_t r = 0; r < R; ++r) {
          online_softmax::RowState m;
          for (int64_t p = 0; p < pieces; ++p) m = online_softmax::merge(m, {Lp[p](r, 0), 1.f});
          if (m.m == kNegInf) {
            lse(r, 0) = kNegInf;
            continue;
          }
          for (int64_t p = 0; p < pieces; ++p) Om.row(r) += std::exp(Lp[p](r, 0) - m.m) * Op[p].row(r);
          Om.row(r) /= m.l;
          lse(r, 0) = m.m + std::log(m.l);
        }
      } else {
        lse.setConstant(kNegInf);  // an empty sequence: O = 0, lse = −∞
      }
      for (int64_t hl = 0; hl < G; ++hl) {
        O.store(q0 + hl * Nq, 0, Om.middleRows(hl * Nq, Nq));
        LSE.store(q0 + hl * Nq, 0, lse.middleRows(hl * Nq, Nq));
      }
    }
}

}  // namespace

void DecodeShape::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw bad(what);
  };
  need(batch >= 1 && heads >= 1 && kv_heads >= 1 && head_dim >= 1,
       "batch, heads, kv_heads and head_dim must be at least 1 (" + str() + ")");
  need(heads % kv_heads == 0, "heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" +
                                  std::to_string(kv_heads) + ")");
  need(seq_q >= 1 && seq_q <= kMaxSeqQ, "seq_q (new rows per sequence) must be 1.." + std::to_string(kMaxSeqQ) +
                                            ", not " + std::to_string(seq_q));
  need(!(scale < 0) && std::isfinite(scale), "scale must be finite and > 0 (or 0 for 1/sqrt(d))");
  if (paged()) {
    need(page_size % 16 == 0, "page_size must be a multiple of 16 (0 for a contiguous cache), not " +
                                  std::to_string(page_size));
    need(num_pages >= 1 && pages_per_seq >= 1, "a paged cache needs num_pages and pages_per_seq >= 1");
    need(capacity == pages_per_seq * page_size,
         "capacity must be pages_per_seq * page_size = " + std::to_string(pages_per_seq * page_size) + ", not " +
             std::to_string(capacity));
  } else {
    need(page_size == 0, "page_size must be 0 (contiguous) or a positive multiple of 16, not " +
                             std::to_string(page_size));
    need(capacity >= 1, "capacity (key slots per sequence) must be at least 1");
  }
}

float DecodeShape::softmax_scale() const { return scale > 0 ? float(scale) : 1.f / std::sqrt(float(head_dim)); }

int64_t DecodeShape::granule() const { return paged() ? std::lcm(kBlockKeys, page_size) : kBlockKeys; }

std::string DecodeShape::str() const {
  return "B=" + std::to_string(batch) + " H=" + std::to_string(heads) + " Hkv=" + std::to_string(kv_heads) +
         " Nq=" + std::to_string(seq_q) + " d=" + std::to_string(head_dim) + " capacity=" + std::to_string(capacity) +
         (paged() ? " page=" + std::to_string(page_size) : std::string()) + " causal=" + std::to_string(int(causal));
}

int choose_splits(const DecodeShape& s, int64_t max_len, int sm_count) {
  const int64_t blocks = s.batch * s.kv_heads * ((s.rows() + 15) / 16);  // the split pass's blocks at splits = 1
  const int64_t per_sm = s.paged() ? 2 : 1;  // a paged cache's scattered reads want two blocks an SM in flight
  const int64_t by_sm = std::max<int64_t>(1, per_sm * std::max(sm_count, 1) / blocks);
  const int64_t shortest = std::max(kMinPieceKeys, s.granule());
  const int64_t by_len = std::max<int64_t>(1, (max_len + shortest - 1) / shortest);
  return int(std::min<int64_t>({by_sm, by_len, kMaxSplits}));
}

int64_t piece_keys(const DecodeShape& s, int64_t len, int splits) {
  const int64_t g = s.granule(), per = (len + splits - 1) / splits;
  return std::max(g, (per + g - 1) / g * g);
}

int64_t active_pieces(const DecodeShape& s, int64_t len, int splits) {
  const int64_t chunk = piece_keys(s, len, splits);
  return (len + chunk - 1) / chunk;
}

std::size_t workspace_bytes(const DecodeShape& s, int splits) {
  if (splits <= 1) return 0;
  return std::size_t(s.batch * s.kv_heads * splits * s.rows()) * std::size_t(s.head_dim + 1) * sizeof(float);
}

IoModel io_model(const DecodeShape& s, DType t, const std::vector<int32_t>& kv_len, int splits) {
  const double e = double(dtype_bytes(t)), d = double(s.head_dim), R = double(s.rows());
  double read = 0, written = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t L = kv_len[std::size_t(b)], pieces = active_pieces(s, L, splits);
    double r = double(pieces) * R * d * e + 2.0 * double(L) * d * e;  // Q per piece; K and V once
    if (s.paged()) r += 4.0 * double((L + s.page_size - 1) / s.page_size);  // page ids, once a page
    double w = R * (d * e + 4.0);                                          // O and lse
    if (splits > 1) {                                                     // the pieces' round trip
      w += double(pieces) * R * (d + 1.0) * 4.0;
      r += double(pieces) * R * (d + 1.0) * 4.0;
    }
    read += double(s.kv_heads) * r;
    written += double(s.kv_heads) * w;
  }
  return {read, written};
}

void twin_decode(const DecodeShape& s, DType t, const DecodeArgs& a) {
  s.validate();
  if (t != DType::F16 && t != DType::BF16) throw bad(std::string("dtype ") + dtype_name(t) + ": fp16 and bf16 only");
  if (!a.q || !a.k || !a.v || !a.o || !a.lse || !a.kv_len) throw bad("q, k, v, o, lse and kv_len must not be null");
  if (s.paged() && !a.page_table) throw bad("a paged cache (page_size > 0) needs a page table");
  if (a.splits < 0 || a.splits > kMaxSplits)
    throw bad("splits must be 0 (choose) or 1.." + std::to_string(kMaxSplits) + ", not " + std::to_string(a.splits));
  const std::vector<int32_t> len(a.kv_len, a.kv_len + s.batch);
  int64_t max_len = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    if (len[std::size_t(b)] < 0 || len[std::size_t(b)] > s.capacity)
      throw bad("kv_len[" + std::to_string(b) + "] = " + std::to_string(len[std::size_t(b)]) + " is outside 0.." +
                std::to_string(s.capacity) + " (the cache's capacity)");
    max_len = std::max<int64_t>(max_len, len[std::size_t(b)]);
  }
  if (s.paged())  // every page a sequence uses is in the pool (checked here, not counted as traffic)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t pg = 0; pg * s.page_size < len[std::size_t(b)]; ++pg) {
        const int32_t id = a.page_table[b * s.pages_per_seq + pg];
        if (id < 0 || id >= s.num_pages)
          throw bad("page table entry [" + std::to_string(b) + "][" + std::to_string(pg) + "] = " + std::to_string(id) +
                    " is outside the pool of " + std::to_string(s.num_pages) + " pages");
      }
  const int splits = a.splits > 0 ? a.splits : choose_splits(s, max_len, a.sm_count);
  if (splits > 1 && !a.workspace) throw bad("splits > 1 needs a workspace of workspace_bytes(shape, splits)");
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  if (t == DType::F16) twin<Eigen::half>(s, a, len, splits, io);
  else twin<Eigen::bfloat16>(s, a, len, splits, io);
}

}  // namespace fl::decoding
