// Rung 10: decoding. The twin against the fp64 oracle, sequence by sequence (ragged lengths, an
// empty and a length-1 sequence in the same batch, pages not filled to the end, GQA 1:1, 4:1 and
// 8:1, causal Nq > 1, fp16 and bf16, any number of pieces); paged and contiguous caches giving the
// same bits; a batch giving each sequence the bits it gets alone; the traffic pinned to the closed
// form; the split rule; and bad input refused before any work. Cache slots past a sequence's
// length, and pages no sequence owns, hold NaN: reading one shows up in the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../steps/10_decoding/decoding.hpp"
#include "compare.hpp"
#include "device.hpp"
#include "harness.hpp"
#include "reference.hpp"
#include "rung_testing.hpp"

namespace fl::testing {
namespace {

using decoding::DecodeArgs;
using decoding::DecodeShape;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One problem's data in fp32 (every value exact in the dtype): Q, and a contiguous cache whose
// slots past each sequence's length are NaN.
struct Problem {
  DecodeShape s;  // contiguous: capacity = the longest length (at least 1)
  DType t = DType::BF16;
  std::vector<int32_t> len;
  std::vector<float> q, k, v;  // q [B, H, Nq, d]; k, v [B, Hkv, capacity, d]
  uint64_t seed = 0;
  std::string str() const {
    std::string l;
    for (int32_t x : len) l += (l.empty() ? "" : ",") + std::to_string(x);
    return s.str() + " " + dtype_name(t) + " len={" + l + "} seed=" + std::to_string(seed);
  }
};

Problem make_problem(int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t d, bool causal, std::vector<int32_t> len,
                     DType t, uint64_t seed) {
  Problem p;
  p.s.batch = int64_t(len.size());
  p.s.heads = heads;
  p.s.kv_heads = kv_heads;
  p.s.seq_q = seq_q;
  p.s.head_dim = d;
  p.s.causal = causal;
  p.s.capacity = std::max<int64_t>(1, *std::max_element(len.begin(), len.end()));
  p.t = t;
  p.len = std::move(len);
  p.seed = seed;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto draw = [&](std::vector<float>& x, int64_t n) {
    x.resize(std::size_t(n));
    for (float& e : x) e = round_to(t, normal(rng));
  };
  const DecodeShape& s = p.s;
  draw(p.q, s.batch * s.heads * s.seq_q * d);
  draw(p.k, s.batch * s.kv_heads * s.capacity * d);
  draw(p.v, s.batch * s.kv_heads * s.capacity * d);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.kv_heads; ++h)
      for (int64_t j = p.len[std::size_t(b)]; j < s.capacity; ++j)
        for (int64_t c = 0; c < d; ++c) {
          const std::size_t at = std::size_t(((b * s.kv_heads + h) * s.capacity + j) * d + c);
          p.k[at] = p.v[at] = kNaN;
        }
  return p;
}

struct Result {
  std::vector<unsigned char> o;  // [B, H, Nq, d] in the dtype
  std::vector<float> lse;        // [B, H, Nq]
  IoCounter io;
  int splits = 0;
};

// The twin (kernel = null) or a GPU kernel on the problem's cache, contiguous (page_size = 0) or
// paged: the pages of each sequence scattered over a pool in a random order, with spare pages of
// NaN between them. Outputs start as NaN. The kernel gets the twin's number of pieces; on the GPU
// its workspace may first be filled with the byte ws_fill (≥ 0), and the call made `calls` times on
// the same workspace, the outputs poisoned again before each.
Result run(const Problem& p, int64_t page_size, int splits, const decoding::Kernel* kernel, int ws_fill = -1,
           int calls = 1) {
  DecodeShape s = p.s;
  std::vector<float> k = p.k, v = p.v;
  std::vector<int32_t> table;
  if (page_size > 0) {
    decoding::PagedCopy paged = decoding::to_paged(s, p.k, p.v, page_size, p.seed + 7, 3, kNaN);
    s = paged.shape;
    k = std::move(paged.k), v = std::move(paged.v), table = std::move(paged.table);
  }
  const std::vector<unsigned char> q8 = to_storage(p.q, p.t), k8 = to_storage(k, p.t), v8 = to_storage(v, p.t);
  Result r;
  r.o = to_storage(std::vector<float>(p.q.size(), kNaN), p.t);  // poisoned
  r.lse.assign(std::size_t(s.batch * s.heads * s.seq_q), kNaN);
  int64_t max_len = 0;
  for (int32_t x : p.len) max_len = std::max<int64_t>(max_len, x);
  r.splits = splits > 0 ? splits : decoding::choose_splits(s, max_len, 132);
  std::vector<unsigned char> ws(decoding::workspace_bytes(s, r.splits));
  DecodeArgs a;
  a.q = q8.data();
  a.k = k8.data();
  a.v = v8.data();
  a.page_table = page_size > 0 ? table.data() : nullptr;
  a.kv_len = p.len.data();
  a.o = r.o.data();
  a.lse = r.lse.data();
  a.workspace = ws.empty() ? nullptr : ws.data();
  a.splits = splits;
  a.io = &r.io;
  if (!kernel) {
    decoding::twin_decode(s, p.t, a);
    return r;
  }
  // The same call on the GPU: every array copied over, O and lse poisoned there.
  auto upload = [](const void* host, std::size_t bytes) {
    gpu::DeviceBuffer d(std::max<std::size_t>(bytes, 16));
    if (bytes) d.upload(host, bytes);
    return d;
  };
  const gpu::DeviceBuffer dq = upload(q8.data(), q8.size()), dk = upload(k8.data(), k8.size()),
                          dv = upload(v8.data(), v8.size()),
                          dt = upload(table.data(), table.size() * sizeof(int32_t)),
                          dl = upload(p.len.data(), p.len.size() * sizeof(int32_t));
  gpu::DeviceBuffer dout(r.o.size()), dlse(r.lse.size() * sizeof(float)), dws(std::max<std::size_t>(ws.size(), 16));
  if (ws_fill >= 0) {
    const std::vector<unsigned char> junk(dws.size(), static_cast<unsigned char>(ws_fill));
    dws.upload(junk.data(), junk.size());
  }
  a.q = dq.get(), a.k = dk.get(), a.v = dv.get(), a.kv_len = static_cast<const int32_t*>(dl.get());
  a.page_table = page_size > 0 ? static_cast<const int32_t*>(dt.get()) : nullptr;
  a.o = dout.get(), a.lse = static_cast<float*>(dlse.get()), a.workspace = dws.get();
  a.splits = r.splits;
  a.io = nullptr;
  for (int c = 0; c < calls; ++c) {
    dout.poison();
    dlse.poison();
    decoding::decode(*kernel, s, p.t, a, dws.size());
  }
  gpu::synchronize();
  dout.download(r.o.data(), r.o.size());
  dlse.download(r.lse.data(), r.lse.size() * sizeof(float));
  return r;
}

Result run_twin(const Problem& p, int64_t page_size, int splits) { return run(p, page_size, splits, nullptr); }

// Every sequence against the fp64 oracle run on it alone (Nk = its length); an empty sequence
// must give O = 0 and lse = −∞.
void expect_matches_oracle(const Problem& p, const Result& r) {
  const DecodeShape& s = p.s;
  const int64_t d = s.head_dim, per_o = s.heads * s.seq_q * d, per_l = s.heads * s.seq_q;
  const std::vector<float> o = from_storage(r.o, p.t);
  std::vector<double> ref_o(o.size()), ref_l(r.lse.size());
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t L = p.len[std::size_t(b)];
    if (L == 0) {
      std::fill_n(ref_o.begin() + b * per_o, per_o, 0.0);
      std::fill_n(ref_l.begin() + b * per_l, per_l, -std::numeric_limits<double>::infinity());
      continue;
    }
    AttentionShape a;
    a.batch = 1;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.seq_q = s.seq_q;
    a.seq_k = L;
    a.head_dim = d;
    a.causal = s.causal;
    std::vector<float> kb(std::size_t(s.kv_heads * L * d)), vb(kb.size());
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      const std::size_t from = std::size_t(((b * s.kv_heads + h) * s.capacity) * d);
      std::copy_n(p.k.begin() + std::ptrdiff_t(from), L * d, kb.begin() + h * L * d);
      std::copy_n(p.v.begin() + std::ptrdiff_t(from), L * d, vb.begin() + h * L * d);
    }
    const ReferenceForward ref = reference_forward(a, p.q.data() + b * per_o, kb.data(), vb.data());
    std::copy(ref.o.begin(), ref.o.end(), ref_o.begin() + b * per_o);
    std::copy(ref.lse.begin(), ref.lse.end(), ref_l.begin() + b * per_l);
  }
  const ErrorStats eo = compare(o.data(), ref_o.data(), int64_t(o.size()));
  const ErrorStats el = compare(r.lse.data(), ref_l.data(), int64_t(r.lse.size()));
  EXPECT_TRUE(passes(eo, p.t)) << "O: " << eo.str() << " (tolerance " << tolerance(p.t) << ")";
  EXPECT_EQ(el.bad, 0) << "lse: " << el.str();
  EXPECT_LT(el.max_abs, 1e-3) << "lse: " << el.str();  // fp32 sums of at most 32771 terms
}

bool same_bits(const Result& a, const Result& b) {
  return a.o == b.o && a.lse.size() == b.lse.size() &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

// ---- against the oracle -------------------------------------------------------------------------

// Ragged lengths with an empty and a length-1 sequence, GQA 1:1, 4:1, 8:1, Nq 1 and 4, causal,
// pages of 16 and 48 (for the twin and a kernel with pages), one piece, the chosen number and five;
// the twin (kernel = null) or a kernel, at each head dim of `dims`.
void expect_matches_oracle_on_the_grid(const decoding::Kernel* k, uint64_t seed, std::vector<int64_t> dims) {
  struct Heads {
    int64_t h, hkv;
  };
  for (DType t : {DType::F16, DType::BF16})
    for (const Heads hh : {Heads{4, 4}, Heads{8, 2}, Heads{8, 1}})
      for (int64_t nq : {1, 4})
        for (bool causal : {false, true}) {
          if (causal && nq == 1) continue;  // one new row sees every key either way
          for (int64_t d : dims) {
            const Problem p = make_problem(hh.h, hh.hkv, nq, d, causal, {1, 0, 17, 1000, 3}, t, seed++);
            for (int64_t page : {int64_t(0), int64_t(16), int64_t(48)})
              for (int splits : {1, 0, 5}) {
                if (page > 0 && k && !k->paged) continue;
                SCOPED_TRACE((k ? k->name : std::string("twin")) + " " + p.str() + " page=" + std::to_string(page) +
                             " splits=" + std::to_string(splits));
                expect_matches_oracle(p, run(p, page, splits, k));
              }
          }
        }
}

TEST(Decoding, TwinMatchesTheOracleSequenceBySequence) { expect_matches_oracle_on_the_grid(nullptr, base_seed(), {64}); }

// The long and ragged ones once each, at d = 128: 32771 keys (a page table of 2049 pages of 16,
// the last holding 3), causal with four new rows, cut into many pieces.
TEST(Decoding, TwinMatchesTheOracleOnLongSequences) {
  uint64_t seed = base_seed() + 100;
  for (DType t : {DType::F16, DType::BF16}) {
    const Problem p = make_problem(8, 2, 4, 128, true, {32771, 1, 4099}, t, seed++);
    for (const auto& [page, splits] : {std::pair<int64_t, int>{0, 0}, {16, 0}, {256, 9}}) {
      SCOPED_TRACE(p.str() + " page=" + std::to_string(page) + " splits=" + std::to_string(splits));
      const Result r = run_twin(p, page, splits);
      EXPECT_GT(r.splits, 1);
      expect_matches_oracle(p, r);
    }
  }
}

// Causal with more new rows than keys: rows that see no key get O = 0 and lse = −∞.
TEST(Decoding, RowsThatSeeNoKeyGetZeroAndMinusInfinity) {
  const Problem p = make_problem(2, 1, 8, 64, true, {3, 0, 8}, DType::BF16, base_seed() + 200);
  const Result r = run_twin(p, 16, 2);
  expect_matches_oracle(p, r);
  // Sequence 0 (3 keys): rows 0..4 see none.
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 8; ++i) {
      const float l = r.lse[std::size_t(h * 8 + i)];
      if (i < 5) EXPECT_TRUE(std::isinf(l) && l < 0) << "h=" << h << " row " << i << ": " << l;
      else EXPECT_TRUE(std::isfinite(l)) << "h=" << h << " row " << i << ": " << l;
    }
}

// ---- the same bits ------------------------------------------------------------------------------

// Pages only change where a key is read from: with the same pieces (pages of 16 and 64 keys cut
// them at the same 64-key granule as the contiguous cache) the output is bit for bit the same.
// For the twin (kernel = null) or a kernel.
void expect_paged_gives_contiguous_bits(const decoding::Kernel* k, uint64_t seed) {
  const std::string who = k ? k->name : "twin";
  for (DType t : {DType::F16, DType::BF16}) {
    const Problem p = make_problem(8, 2, 2, 128, true, {1000, 0, 1, 333, 4096}, t, seed++);
    for (int splits : {1, 5}) {
      const Result flat = run(p, 0, splits, k);
      for (int64_t page : {int64_t(16), int64_t(64)})
        EXPECT_TRUE(same_bits(flat, run(p, page, splits, k))) << who << " " << p.str() << " page=" << page
                                                                 << " splits=" << splits;
    }
    // Pages of 256 cut the pieces at 256 keys: the same bits with one piece.
    EXPECT_TRUE(same_bits(run(p, 0, 1, k), run(p, 256, 1, k))) << who << " " << p.str() << " page=256";
  }
}

// Lengths per sequence: each sequence's rows are those it gets alone, with the same pieces.
void expect_each_sequence_gets_its_bits_alone(const decoding::Kernel* k, int64_t page) {
  const std::string who = k ? k->name : "twin";
  const std::vector<int32_t> len = {0, 1, 17, 1000, 4099};
  const Problem p = make_problem(4, 1, 3, 64, true, len, DType::F16, base_seed() + 400);
  const Result all = run(p, page, 4, k);
  const int64_t per_o = p.s.heads * p.s.seq_q * p.s.head_dim * 2, per_l = p.s.heads * p.s.seq_q;
  for (std::size_t b = 0; b < len.size(); ++b) {
    Problem one = p;
    one.s.batch = 1;
    one.len = {len[b]};
    const int64_t kv = p.s.kv_heads * p.s.capacity * p.s.head_dim;
    one.q.assign(p.q.begin() + std::ptrdiff_t(b) * per_o / 2, p.q.begin() + std::ptrdiff_t(b + 1) * per_o / 2);
    one.k.assign(p.k.begin() + std::ptrdiff_t(b) * kv, p.k.begin() + std::ptrdiff_t(b + 1) * kv);
    one.v.assign(p.v.begin() + std::ptrdiff_t(b) * kv, p.v.begin() + std::ptrdiff_t(b + 1) * kv);
    const Result r = run(one, page, 4, k);
    EXPECT_EQ(0, std::memcmp(r.o.data(), all.o.data() + b * per_o, std::size_t(per_o))) << who << " sequence " << b;
    EXPECT_EQ(0, std::memcmp(r.lse.data(), all.lse.data() + b * per_l, std::size_t(per_l) * sizeof(float)))
        << who << " sequence " << b;
  }
}

TEST(Decoding, PagedAndContiguousGiveTheSameBits) { expect_paged_gives_contiguous_bits(nullptr, base_seed() + 300); }

TEST(Decoding, EachSequenceGetsTheBitsItGetsAlone) { expect_each_sequence_gets_its_bits_alone(nullptr, 16); }

// ---- traffic --------------------------------------------------------------------------------------

TEST(Decoding, TwinTrafficMatchesTheClosedForm) {
  uint64_t seed = base_seed() + 500;
  for (const auto& [heads, kv_heads, nq] : {std::tuple<int64_t, int64_t, int64_t>{8, 1, 1}, {8, 2, 4}, {4, 4, 2}})
    for (int64_t page : {int64_t(0), int64_t(16), int64_t(256)})
      for (int splits : {1, 3, 0}) {
        const Problem p = make_problem(heads, kv_heads, nq, 64, nq > 1, {0, 1, 300, 2000}, DType::BF16, seed++);
        const Result r = run_twin(p, page, splits);
        DecodeShape s = p.s;
        if (page > 0) {
          s.page_size = page;
          s.pages_per_seq = (p.s.capacity + page - 1) / page;
          s.capacity = s.pages_per_seq * page;
          s.num_pages = s.batch * s.pages_per_seq + 3;
        }
        const IoModel m = decoding::io_model(s, DType::BF16, p.len, r.splits);
        SCOPED_TRACE(p.str() + " page=" + std::to_string(page) + " splits=" + std::to_string(r.splits));
        EXPECT_EQ(double(r.io.read), m.read);
        EXPECT_EQ(double(r.io.written), m.written);
      }
}

// The point of packing a group's rows: K and V are read once per KV head, however many query
// heads share it. Eight query heads on one KV head read the same K and V bytes as one.
TEST(Decoding, KAndVAreReadOncePerKvHead) {
  const std::vector<int32_t> len = {5000, 77};
  const IoModel one = decoding::io_model(make_problem(1, 1, 1, 128, false, len, DType::BF16, 1).s, DType::BF16, len, 1);
  const IoModel eight = decoding::io_model(make_problem(8, 1, 1, 128, false, len, DType::BF16, 1).s, DType::BF16, len, 1);
  const double kv = 2.0 * (5000 + 77) * 128 * 2, q_one = 2 * 128 * 2.0;
  EXPECT_EQ(one.read, kv + q_one);
  EXPECT_EQ(eight.read, kv + 8 * q_one);
}

// ---- the split rule -------------------------------------------------------------------------------

TEST(Decoding, SplitsFillTheGpuAndNoMore) {
  DecodeShape s;
  s.heads = 32;
  s.kv_heads = 8;
  s.capacity = 131072;
  s.batch = 1;  // 8 blocks for 132 SMs: 16 pieces each, 128 blocks, one an SM
  EXPECT_EQ(decoding::choose_splits(s, 131072, 132), 16);
  s.kv_heads = 32;  // 32 blocks: 4 pieces each (5 would be 160 blocks, more than the SMs)
  EXPECT_EQ(decoding::choose_splits(s, 131072, 132), 4);
  s.kv_heads = 8, s.seq_q = 16;  // 64 packed rows, 4 row tiles: 32 blocks, 4 pieces
  EXPECT_EQ(decoding::choose_splits(s, 131072, 132), 4);
  s.seq_q = 1, s.batch = 16;  // 128 blocks, fewer than the SMs but more than half: no split
  EXPECT_EQ(decoding::choose_splits(s, 131072, 132), 1);
  s.batch = 64;  // 512 blocks: no split
  EXPECT_EQ(decoding::choose_splits(s, 131072, 132), 1);
  s.batch = 1;  // short sequences: no piece shorter than kMinPieceKeys
  EXPECT_EQ(decoding::choose_splits(s, 4096, 132), 8);
  EXPECT_EQ(decoding::choose_splits(s, 4097, 132), 9);
  EXPECT_EQ(decoding::choose_splits(s, 512, 132), 1);
  EXPECT_EQ(decoding::choose_splits(s, 200, 132), 1);
  EXPECT_EQ(decoding::choose_splits(s, 64, 132), 1);
  EXPECT_EQ(decoding::choose_splits(s, 131072, 1), 1);  // one SM: nothing to fill
  s.page_size = 64, s.capacity = 131072, s.pages_per_seq = 2048;  // paged: two blocks an SM
  EXPECT_EQ(decoding::choose_splits(s, 131072, 132), 33);
  s.batch = 16;
  EXPECT_EQ(decoding::choose_splits(s, 131072, 132), 2);
  // Pieces start on granule boundaries and cover the sequence.
  for (int64_t len : {1, 63, 64, 65, 1000, 32771})
    for (int splits : {1, 2, 7, 64}) {
      const int64_t chunk = decoding::piece_keys(s, len, splits), n = decoding::active_pieces(s, len, splits);
      EXPECT_EQ(chunk % s.granule(), 0);
      EXPECT_LE(n, splits);
      EXPECT_GE(n * chunk, len);
      EXPECT_LT((n - 1) * chunk, len);
    }
  s.page_size = 48;
  s.pages_per_seq = 10;
  s.capacity = 480;
  EXPECT_EQ(s.granule(), 192);  // whole blocks of 64 and whole pages of 48
}

// ---- refusals -------------------------------------------------------------------------------------

TEST(Decoding, RefusesBadInputBeforeAnyWork) {
  const Problem p = make_problem(4, 2, 2, 64, false, {10, 20}, DType::BF16, 1);
  const std::vector<unsigned char> q8 = to_storage(p.q, p.t), k8 = to_storage(p.k, p.t);
  std::vector<unsigned char> o(q8.size(), 0xAB);
  std::vector<float> lse(16, 1.f);  // [2, 4, 2]
  std::vector<int32_t> len = p.len, table = {0, 1};
  auto call = [&](DecodeShape s, DType t, DecodeArgs a) {
    try {
      decoding::twin_decode(s, t, a);
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("10_decoding"), std::string::npos) << e.what();
      EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](unsigned char c) { return c == 0xAB; })) << "O written";
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted " << s.str();
    return std::string();
  };
  DecodeArgs a;
  a.q = q8.data();
  a.k = a.v = k8.data();
  a.kv_len = len.data();
  a.o = o.data();
  a.lse = lse.data();
  a.splits = 1;
  DecodeShape s = p.s;
  auto with = [&](auto change) {
    DecodeShape x = s;
    change(x);
    return x;
  };
  EXPECT_NE(call(with([](DecodeShape& x) { x.seq_q = 17; }), p.t, a).find("seq_q"), std::string::npos);
  EXPECT_NE(call(with([](DecodeShape& x) { x.seq_q = 0; }), p.t, a).find("seq_q"), std::string::npos);
  EXPECT_NE(call(with([](DecodeShape& x) { x.heads = 3; }), p.t, a).find("multiple"), std::string::npos);
  EXPECT_NE(call(with([](DecodeShape& x) { x.page_size = 24, x.pages_per_seq = 1, x.num_pages = 2, x.capacity = 24; }),
                 p.t, a).find("multiple of 16"), std::string::npos);
  EXPECT_NE(call(with([](DecodeShape& x) { x.page_size = 16, x.pages_per_seq = 2, x.num_pages = 2, x.capacity = 20; }),
                 p.t, a).find("capacity"), std::string::npos);
  EXPECT_NE(call(s, DType::F32, a).find("fp16 and bf16"), std::string::npos);
  len[1] = 21;  // past the capacity of 20
  EXPECT_NE(call(s, p.t, a).find("kv_len[1]"), std::string::npos);
  len[1] = 20;
  DecodeArgs no_o = a;
  no_o.o = nullptr;
  EXPECT_NE(call(s, p.t, no_o).find("null"), std::string::npos);
  DecodeArgs many = a;
  many.splits = decoding::kMaxSplits + 1;
  EXPECT_NE(call(s, p.t, many).find("splits"), std::string::npos);
  DecodeArgs no_ws = a;
  no_ws.splits = 2;
  EXPECT_NE(call(s, p.t, no_ws).find("workspace"), std::string::npos);
  // Paged: no table, and a page id outside the pool.
  const DecodeShape paged = with([](DecodeShape& x) { x.page_size = 16, x.pages_per_seq = 2, x.num_pages = 2, x.capacity = 32; });
  EXPECT_NE(call(paged, p.t, a).find("page table"), std::string::npos);
  DecodeArgs bad_page = a;
  table = {0, 1, 5, 0};  // sequence 1's first page
  bad_page.page_table = table.data();
  EXPECT_NE(call(paged, p.t, bad_page).find("outside the pool"), std::string::npos);
}

// ---- the GPU kernels --------------------------------------------------------------------------------

// Every kernel of this build, or a skip that says why there are none.
#define FOR_EACH_KERNEL(k)                                                                         \
  if (!gpu::available() || decoding::kernels().empty())                                           \
    GTEST_SKIP() << "no rung-10 kernels to run: " << skip_reason(Backend::Cuda);                    \
  for (const decoding::Kernel& k : decoding::kernels())

TEST(DecodingGpu, KernelsMatchTheOracleSequenceBySequence) {
  FOR_EACH_KERNEL(k) { expect_matches_oracle_on_the_grid(&k, base_seed() + 1000, {64, 128}); }
}

// Long, ragged and many pieces, with 16 packed rows (G = 4, Nq = 4) and more than 16 (G = 8,
// Nq = 4: two row tiles), the rows of a causal Nq = 8 that see no key, a partial second row tile
// and the most new rows (Nq = 16).
TEST(DecodingGpu, KernelsMatchTheOracleOnLongSequences) {
  FOR_EACH_KERNEL(k) {
    uint64_t seed = base_seed() + 1100;
    for (DType t : {DType::F16, DType::BF16})
      for (int64_t heads : {8, 16}) {
        const Problem p = make_problem(heads, 2, 4, 128, true, {32771, 1, 4099}, t, seed++);
        for (const auto& [page, splits] : {std::pair<int64_t, int>{0, 0}, {16, 0}, {256, 9}}) {
          if (page > 0 && !k.paged) continue;
          SCOPED_TRACE(k.name + " " + p.str() + " page=" + std::to_string(page) + " splits=" + std::to_string(splits));
          expect_matches_oracle(p, run(p, page, splits, &k));
        }
      }
    const Problem few = make_problem(2, 1, 8, 64, true, {3, 0, 8}, DType::BF16, seed++);
    expect_matches_oracle(few, run(few, k.paged ? 16 : 0, 2, &k));
    // A partial second row tile (G = 8, Nq = 3: 24 rows), not causal; and Nq = 16, causal.
    const Problem partial = make_problem(8, 1, 3, 128, false, {700, 5, 130}, DType::F16, seed++);
    expect_matches_oracle(partial, run(partial, k.paged ? 48 : 0, 0, &k));
    const Problem sixteen = make_problem(4, 2, 16, 64, true, {2000, 16, 9}, DType::BF16, seed++);
    expect_matches_oracle(sixteen, run(sixteen, 0, 3, &k));
  }
}

// The kernels keep the twin's promises: paged = contiguous bits, a batch = each sequence alone.
TEST(DecodingGpu, PagedAndContiguousGiveTheSameBits) {
  FOR_EACH_KERNEL(k) {
    if (k.paged) expect_paged_gives_contiguous_bits(&k, base_seed() + 1200);
  }
}

TEST(DecodingGpu, EachSequenceGetsTheBitsItGetsAlone) {
  FOR_EACH_KERNEL(k) { expect_each_sequence_gets_its_bits_alone(&k, k.paged ? 16 : 0); }
}

// Each version changes how keys are found, not what is computed with them: on a contiguous cache
// every version gives v1's bits, at one piece, the chosen number, and 2, 16 and 17 (the merge's
// chunk of 16 pieces, and one past it).
TEST(DecodingGpu, VersionsGiveV1sBitsOnAContiguousCache) {
  FOR_EACH_KERNEL(k) {
    const decoding::Kernel& v1 = decoding::kernels().front();
    const Problem p = make_problem(8, 2, 4, 128, true, {777, 5000, 64}, DType::BF16, base_seed() + 1400);
    for (int splits : {1, 0, 2, 16, 17})
      EXPECT_TRUE(same_bits(run(p, 0, splits, &v1), run(p, 0, splits, &k))) << k.name << " splits=" << splits;
  }
}

// The workspace's contract (workspace_bytes): whatever it held before the first call (zeros,
// every byte 0xff, every byte 0x01) and however many calls reuse it, every call gives v1's bits,
// an empty sequence among them; with 7 pieces, and with 40 (the merge's chunks of 16: 16 + 16 + 8).
TEST(DecodingGpu, AnyWorkspaceAndRepeatedCallsGiveV1sBits) {
  FOR_EACH_KERNEL(k) {
    const decoding::Kernel& v1 = decoding::kernels().front();
    const Problem p = make_problem(8, 2, 4, 128, true, {777, 5000, 0, 64}, DType::BF16, base_seed() + 1500);
    for (int splits : {7, 40}) {
      const Result ref = run(p, 0, splits, &v1);
      for (int fill : {0x00, 0xff, 0x01})
        EXPECT_TRUE(same_bits(ref, run(p, 0, splits, &k, fill, 3))) << k.name << " fill=" << fill << " splits=" << splits;
    }
  }
}

// Refused on the host before any launch: what the kernels do not run, and bad arguments.
TEST(DecodingGpu, RefusesWhatItDoesNotRun) {
  FOR_EACH_KERNEL(k) {
    const Problem p = make_problem(4, 2, 2, 64, false, {10, 20}, DType::BF16, 1);
    gpu::DeviceBuffer buf(1 << 16);
    DecodeArgs a;
    a.q = a.k = a.v = a.o = buf.get();
    a.lse = static_cast<float*>(buf.get());
    a.kv_len = static_cast<const int32_t*>(buf.get());
    a.splits = 1;
    auto refusal = [&](DecodeShape s, DType t, DecodeArgs x, std::size_t ws = 0) {
      try {
        decoding::decode(k, s, t, x, ws);
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(k.name), std::string::npos) << e.what();
        return std::string(e.what());
      }
      ADD_FAILURE() << k.name << " accepted " << s.str();
      return std::string();
    };
    DecodeShape s = p.s;
    EXPECT_NE(refusal(s, DType::F32, a).find("fp16 and bf16"), std::string::npos);
    s.head_dim = 96;
    EXPECT_NE(refusal(s, p.t, a).find("head_dim"), std::string::npos);
    s.head_dim = 64;
    DecodeArgs odd = a;
    odd.k = static_cast<const char*>(buf.get()) + 2;
    EXPECT_NE(refusal(s, p.t, odd).find("16-byte"), std::string::npos);
    DecodeArgs two = a;
    two.splits = 2;
    EXPECT_NE(refusal(s, p.t, two).find("workspace"), std::string::npos);
    two.workspace = buf.get();
    EXPECT_NE(refusal(s, p.t, two, 8).find("workspace"), std::string::npos);  // too small
    DecodeArgs odd_lse = a;
    odd_lse.lse = reinterpret_cast<float*>(static_cast<char*>(buf.get()) + 2);
    EXPECT_NE(refusal(s, p.t, odd_lse).find("4-byte"), std::string::npos);
    DecodeShape paged = s;
    paged.page_size = 16, paged.pages_per_seq = 2, paged.num_pages = 4, paged.capacity = 32;
    EXPECT_NE(refusal(paged, p.t, a).find(k.paged ? "page table" : "paged"), std::string::npos);
  }
  EXPECT_THROW(decoding::find_kernel("10_decoding/v0_nothing"), InputError);
}

}  // namespace
}  // namespace fl::testing
