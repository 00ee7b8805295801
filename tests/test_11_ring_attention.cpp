// Rung 11: ring attention, the CPU twin. Forward and backward of P = 1..4 simulated ranks against
// the fp64 oracle (contiguous and zigzag sharding, causal and not, GQA 1:1 and 4:1, fp32, fp16,
// bf16, d = 64 and 128); one rank giving the bits of the local twin it calls; P ranks within 2× the
// single-rank twin's error; the bytes every rank sends and receives, and every step, equal to the
// closed form (`ring_io_model`); each rank's device-memory traffic equal to the local twin's model
// summed over its steps; zigzag balancing causal work where contiguous does not; bad calls refused
// before any work. Outputs start as NaN, so an element no rank wrote shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../steps/11_ring_attention/ring_attention.hpp"
#include "../steps/11_ring_attention/ring_gpu.hpp"
#include "device.hpp"

#if FLASH_LADDER_HAS_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif
#include "compare.hpp"
#include "harness.hpp"
#include "reference.hpp"
#include "rung_testing.hpp"

namespace fl::testing {
namespace {

using ring::RingShape;
using ring::RingStats;
using ring::Sharding;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

RingShape ring_shape(int64_t heads, int64_t kv_heads, int64_t n, int64_t d, bool causal, int64_t ranks, Sharding sh,
                     int64_t batch = 1) {
  return {make_shape(batch, heads, kv_heads, n, n, d, causal), ranks, sh};
}

using RingForward = ring::RingForwardRun;
using RingBackward = ring::RingBackwardRun;
constexpr auto ring_forward = ring::run_ring_forward;
constexpr auto ring_backward = ring::run_ring_backward;

// The grid: P 1..4, both shardings, causal and not, GQA 1:1 and 4:1, N = 48 (a multiple of 2P
// for every P here) and N = 120 at P = 3 (chunks of 20 and 40 keys: not a multiple of any block).
std::vector<RingShape> grid(int64_t d) {
  std::vector<RingShape> out;
  for (int64_t P : {1, 2, 3, 4})
    for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
      for (bool causal : {false, true})
        for (auto [h, hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}}) out.push_back(ring_shape(h, hkv, 48, d, causal, P, sh));
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag}) out.push_back(ring_shape(4, 1, 120, d, true, 3, sh, 2));
  return out;
}

const std::vector<DType> kDtypes = {DType::F32, DType::F16, DType::BF16};

// The error of `out` against the oracle must be within the dtype's tolerance and at most 2× that
// of the single-rank twin on the same inputs (with a floor of a tenth of the tolerance, for when
// both sit at rounding level): the rule a GPU rung meets against its twin.
void expect_no_worse_than(const ErrorStats& ring, const ErrorStats& single, DType t, const char* what) {
  EXPECT_EQ(ring.bad, 0) << what << ": " << ring.str();
  EXPECT_LE(ring.rel_l2, tolerance(t)) << what << ": " << ring.str();
  EXPECT_LE(ring.rel_l2, std::max(2 * single.rel_l2, tolerance(t) / 10))
      << what << ": ring " << ring.str() << ", single-rank twin " << single.str();
}

// ---- The forward ------------------------------------------------------------------------------

// shard and unshard: every rank's shard holds its chunks' rows in order (row i of chunk c of group
// g is global row c·chunk + i), and the ranks' shards put back give the whole array, every row once.
TEST(RingAttention, ShardsHoldTheRanksChunksAndPutBackGiveTheWhole) {
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag}) {
    const RingShape s = ring_shape(2, 1, 60, 64, false, 3, sh, 2);  // 60 rows: 3 or 6 chunks
    SCOPED_TRACE(s.str());
    const int64_t groups = 4, row = 3;  // 3 int32 a row: its group, its global row, a marker
    std::vector<int32_t> whole(std::size_t(groups * s.seq() * row));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t i = 0; i < s.seq(); ++i)
        for (int64_t e = 0; e < row; ++e) whole[std::size_t((g * s.seq() + i) * row + e)] = int32_t(e == 0 ? g : e == 1 ? i : 7);
    std::vector<int32_t> back(whole.size(), -1);
    for (int64_t r = 0; r < s.ranks; ++r) {
      std::vector<int32_t> local(std::size_t(groups * s.local_len() * row), -1);
      s.shard(r, whole.data(), local.data(), groups, row * 4);
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t i = 0; i < s.local_len(); ++i) {
          const int32_t* x = &local[std::size_t((g * s.local_len() + i) * row)];
          EXPECT_EQ(x[0], g);
          EXPECT_EQ(x[1], s.global_row(r, i)) << "rank " << r << " local row " << i;
        }
      s.unshard(r, local.data(), back.data(), groups, row * 4);
    }
    EXPECT_EQ(back, whole);
  }
}

TEST(RingAttention, ForwardMatchesTheOracleAndTheSingleRankTwin) {
  uint64_t seed = base_seed();
  for (int64_t d : {64, 128})
    for (const RingShape& s : grid(d))
      for (DType t : kDtypes) {
        if (d == 128 && t != DType::BF16) continue;  // d = 128 once, in the coarsest dtype
        SCOPED_TRACE(s.str() + " " + dtype_name(t) + " seed=" + std::to_string(seed));
        const Inputs in = make_inputs(s.attn, t, seed++);
        const RingForward r = ring_forward(s, t, in);
        const ReferenceForward ref = reference_forward(s.attn, in.q.data(), in.k.data(), in.v.data());
        const ForwardCheck c = check_forward(s.attn, t, r.out, ref);
        EXPECT_TRUE(c.pass) << c.str();
        ForwardRun single(ring::local_rung(t), s.attn, t, in);
        single.run();
        const ForwardCheck cs = check_forward(s.attn, t, single.fetch(), ref);
        expect_no_worse_than(c.o, cs.o, t, "O");
        EXPECT_LE(c.lse.max_abs, 1e-5) << "lse " << c.lse.str();  // fp32 merges of fp32 lse
      }
}

// One rank computes the whole sequence in one call of the local twin (zigzag's two chunks are 0
// and 1, in order), and an empty row takes that call's part as it is: no bit changes, not even a
// −0 (a blend 0·0 + 1·(−0) would give +0; FL_TEST_SEED=2157324758 draws one).
TEST(RingAttention, OneRankGivesTheLocalTwinsBits) {
  uint64_t seed = base_seed();
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
    for (bool causal : {false, true})
      for (DType t : kDtypes) {
        const RingShape s = ring_shape(4, 2, 96, 64, causal, 1, sh);
        SCOPED_TRACE(s.str() + " " + dtype_name(t));
        const Inputs in = make_inputs(s.attn, t, seed++);
        const RingForward r = ring_forward(s, t, in);
        ForwardRun single(ring::local_rung(t), s.attn, t, in);
        single.run();
        const ForwardOutputs so = single.fetch();
        EXPECT_EQ(std::memcmp(r.out.o.data(), so.o.data(), so.o.size() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(r.out.lse.data(), so.lse.data(), so.lse.size() * sizeof(float)), 0);

        const BackwardInputs bin = make_backward_inputs(s.attn, t, in, seed++);
        const RingBackward rb = ring_backward(s, t, in, bin);
        const BackwardOutputs sb = run_backward(ring::local_rung(t), s.attn, t, in, bin);
        EXPECT_EQ(rb.grads.dq, sb.dq);
        EXPECT_EQ(rb.grads.dk, sb.dk);
        EXPECT_EQ(rb.grads.dv, sb.dv);
      }
}

// ---- The backward -----------------------------------------------------------------------------

TEST(RingAttention, BackwardMatchesTheOracleAndTheSingleRankTwin) {
  uint64_t seed = base_seed();
  for (const RingShape& s : grid(64))
    for (DType t : kDtypes) {
      SCOPED_TRACE(s.str() + " " + dtype_name(t) + " seed=" + std::to_string(seed));
      const Inputs in = make_inputs(s.attn, t, seed++);
      const BackwardInputs bin = make_backward_inputs(s.attn, t, in, seed++);
      const RingBackward r = ring_backward(s, t, in, bin);
      const ReferenceBackward ref = reference_backward(s.attn, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
      const BackwardCheck c = check_backward(t, r.grads, ref);
      EXPECT_TRUE(c.pass) << c.str();
      const BackwardCheck cs = check_backward(t, run_backward(ring::local_rung(t), s.attn, t, in, bin), ref);
      expect_no_worse_than(c.dq, cs.dq, t, "dQ");
      expect_no_worse_than(c.dk, cs.dk, t, "dK");
      expect_no_worse_than(c.dv, cs.dv, t, "dV");
    }
}

// ---- What the ring moves ------------------------------------------------------------------------

// Every rank sends and receives exactly the closed form, forward and backward, and so does every
// step; the dK/dV accumulators' last hop home shows in the backward's last step.
TEST(RingAttention, BytesSentEqualTheClosedForm) {
  uint64_t seed = base_seed();
  for (int64_t P : {1, 2, 3, 4})
    for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
      for (bool causal : {false, true})
        for (DType t : {DType::F32, DType::BF16}) {
          const RingShape s = ring_shape(4, 2, 48, 64, causal, P, sh, 2);
          SCOPED_TRACE(s.str() + " " + dtype_name(t));
          const Inputs in = make_inputs(s.attn, t, seed++);
          const ring::RingIo m = ring::ring_io_model(s, t);
          EXPECT_EQ(m.kv_shard, 2.0 * 2 * 2 * (48 / P) * 64 * double(dtype_bytes(t)));  // K and V of B·Hkv heads
          EXPECT_EQ(m.dkv_shard, 2.0 * 2 * 2 * (48 / P) * 64 * 4);
          const RingStats f = ring_forward(s, t, in).stats;
          const RingStats b = ring_backward(s, t, in, make_backward_inputs(s.attn, t, in, seed++)).stats;
          ASSERT_EQ(f.ranks.size(), std::size_t(P));
          for (const RingStats* st : {&f, &b})
            for (const ring::RankStats& r : st->ranks) {
              const double want = st == &f ? m.forward_per_rank : m.backward_per_rank;
              EXPECT_EQ(double(r.bytes_sent), want);
              EXPECT_EQ(double(r.bytes_received), want);
            }
          for (int64_t step = 0; step < P; ++step) {
            EXPECT_EQ(double(f.bytes_per_step[std::size_t(step)]), m.forward_step(step, P)) << "step " << step;
            EXPECT_EQ(double(b.bytes_per_step[std::size_t(step)]), m.backward_step(step, P)) << "step " << step;
          }
        }
  // The forms themselves, at P = 4: three K/V shards forward; three K/V shards and four dK/dV back.
  const ring::RingIo m = ring::ring_io_model(ring_shape(8, 8, 4096, 128, true, 4, Sharding::Zigzag), DType::BF16);
  EXPECT_EQ(m.forward_per_rank, 3 * m.kv_shard);
  EXPECT_EQ(m.backward_per_rank, 3 * m.kv_shard + 4 * m.dkv_shard);
  EXPECT_EQ(m.dkv_shard, 2 * m.kv_shard);  // fp32 accumulators, twice a bf16 shard
}

// A rank's device-memory traffic is the local twin's closed form summed over the steps it computes.
TEST(RingAttention, EachRanksDeviceTrafficIsTheLocalTwinsModelOverItsSteps) {
  uint64_t seed = base_seed();
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
    for (DType t : {DType::F32, DType::F16}) {
      const RingShape s = ring_shape(4, 1, 120, 64, true, 3, sh);
      SCOPED_TRACE(s.str() + " " + dtype_name(t));
      const Inputs in = make_inputs(s.attn, t, seed++);
      const RingStats f = ring_forward(s, t, in).stats;
      const RingStats b = ring_backward(s, t, in, make_backward_inputs(s.attn, t, in, seed++)).stats;
      const Rung& local = ring::local_rung(t);
      for (int64_t r = 0; r < s.ranks; ++r) {
        IoModel fwd, bwd;
        for (int64_t step = 0; step < s.ranks; ++step) {
          const ring::StepPlan p = ring::plan_step(s, r, step);
          if (p.nq == 0) continue;
          AttentionShape a = s.attn;
          a.seq_q = p.nq, a.seq_k = p.nk, a.causal = p.causal;
          const IoModel mf = local.modelled_io(a, t), mb = local.modelled_backward_io(a, t);
          fwd.read += mf.read, fwd.written += mf.written, bwd.read += mb.read, bwd.written += mb.written;
        }
        EXPECT_EQ(double(f.ranks[std::size_t(r)].hbm.read), fwd.read) << "rank " << r;
        EXPECT_EQ(double(f.ranks[std::size_t(r)].hbm.written), fwd.written) << "rank " << r;
        EXPECT_EQ(double(b.ranks[std::size_t(r)].hbm.read), bwd.read) << "rank " << r;
        EXPECT_EQ(double(b.ranks[std::size_t(r)].hbm.written), bwd.written) << "rank " << r;
      }
    }
}

// ---- Balance ------------------------------------------------------------------------------------

// Causal with contiguous shards, rank r sees r full chunk pairs and its diagonal: the last rank
// does about 2P − 1 times the first's work. Zigzag gives every rank the same pairs and the same
// (query, key) count. Without a mask every pair is full on every rank.
TEST(RingAttention, ZigzagBalancesCausalWorkAndContiguousDoesNot) {
  for (int64_t P : {2, 3, 4}) {
    for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
      for (bool causal : {false, true}) {
        const RingShape s = ring_shape(2, 2, 48, 64, causal, P, sh);
        SCOPED_TRACE(s.str());
        const Inputs in = make_inputs(s.attn, DType::F32, base_seed());
        const RingStats st = ring_forward(s, DType::F32, in).stats;
        const int64_t per_rank = P * s.chunks_per_rank() * s.chunks_per_rank(), c = s.chunk_len();
        std::vector<int64_t> scores;
        for (const ring::RankStats& r : st.ranks) {
          EXPECT_EQ(r.pairs_full + r.pairs_diagonal + r.pairs_skipped, per_rank);
          scores.push_back(r.scores);
        }
        const auto [lo, hi] = std::minmax_element(scores.begin(), scores.end());
        if (!causal) {
          for (const ring::RankStats& r : st.ranks) EXPECT_EQ(r.pairs_full, per_rank);
          EXPECT_EQ(*lo, *hi);
        } else if (sh == Sharding::Zigzag) {
          for (const ring::RankStats& r : st.ranks) {  // chunks r and 2P−1−r: 2P−1 full, 2 diagonal
            EXPECT_EQ(r.pairs_full, 2 * P - 1);
            EXPECT_EQ(r.pairs_diagonal, 2);
          }
          EXPECT_EQ(*lo, *hi);
        } else {
          for (int64_t r = 0; r < P; ++r) {
            EXPECT_EQ(st.ranks[std::size_t(r)].pairs_full, r);
            EXPECT_EQ(st.ranks[std::size_t(r)].pairs_diagonal, 1);
            EXPECT_EQ(st.ranks[std::size_t(r)].scores, r * c * c + c * (c + 1) / 2);
          }
          EXPECT_GT(*hi, (2 * P - 2) * *lo);  // (2P − 1)c² + c vs c² + c, over 2
        }
      }
  }
}

// The steps of a zigzag rank past the first each compute half the visiting shard: both Q chunks
// against the visitor's early chunk (it came from a lower rank), or the late Q chunk against both
// (from a higher rank). Step 0 is the rank's own shard, causal.
TEST(RingAttention, ZigzagStepsComputeHalfOfEachVisitingShard) {
  const RingShape s = ring_shape(1, 1, 64, 64, true, 4, Sharding::Zigzag);
  const int64_t c = s.chunk_len();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t step = 0; step < 4; ++step) {
      const ring::StepPlan p = ring::plan_step(s, r, step);
      SCOPED_TRACE("rank " + std::to_string(r) + " step " + std::to_string(step));
      EXPECT_EQ(p.source, (r - step + 4) % 4);
      if (step == 0) {
        EXPECT_TRUE(p.causal);
        EXPECT_EQ(p.nq * p.nk, 4 * c * c);
      } else if (p.source < r) {
        EXPECT_EQ(std::vector<int64_t>({p.q0, p.nq, p.k0, p.nk}), std::vector<int64_t>({0, 2 * c, 0, c}));
      } else {
        EXPECT_EQ(std::vector<int64_t>({p.q0, p.nq, p.k0, p.nk}), std::vector<int64_t>({c, c, 0, 2 * c}));
      }
      EXPECT_FALSE(step > 0 && p.causal);
    }
  // Where each local row lives: rank 1 of 4 holds chunks 1 and 6 of 8.
  EXPECT_EQ(s.global_row(1, 0), c);
  EXPECT_EQ(s.global_row(1, c), 6 * c);
}

// ---- Refusals -----------------------------------------------------------------------------------

// A bad call is refused with a message naming the rung, before any output element is written.
TEST(RingAttention, RefusesBadCallsBeforeAnyWork) {
  struct Bad {
    RingShape s;
    DType t;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {ring_shape(2, 2, 50, 64, false, 3, Sharding::Contiguous), DType::F32, "multiple of 3"},
      {ring_shape(2, 2, 50, 64, true, 2, Sharding::Zigzag), DType::F32, "multiple of 4"},
      {{make_shape(1, 2, 2, 48, 96, 64, false), 2, Sharding::Contiguous}, DType::F32, "seq_q must equal seq_k"},
      {ring_shape(2, 2, 48, 64, false, 0, Sharding::Contiguous), DType::F32, "at least 1"},
      {ring_shape(2, 2, 48, 64, false, -2, Sharding::Zigzag), DType::F32, "at least 1"},
      {ring_shape(3, 2, 48, 64, false, 2, Sharding::Contiguous), DType::F32, "multiple"},  // H % Hkv
      {ring_shape(2, 2, 48, 32, false, 2, Sharding::Contiguous), DType::BF16, "head_dim"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.s.str());
    const int64_t n = std::max<int64_t>(1, b.s.attn.q_elems()), nkv = std::max<int64_t>(1, b.s.attn.kv_elems());
    std::vector<float> q(std::size_t(n), 1.f), k(std::size_t(nkv), 1.f), o(std::size_t(n), kNaN),
        lse(std::size_t(std::max<int64_t>(1, b.s.attn.lse_elems())), kNaN), dq = o, dk(std::size_t(nkv), kNaN), dv = dk;
    auto expect_refused = [&](auto&& call) {
      try {
        call();
        ADD_FAILURE() << "not refused";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("11_ring_attention"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(b.says), std::string::npos) << e.what();
      }
    };
    expect_refused([&] { ring::twin_ring_forward(b.s, b.t, q.data(), k.data(), k.data(), o.data(), lse.data()); });
    expect_refused([&] {
      ring::twin_ring_backward(b.s, b.t, q.data(), k.data(), k.data(), q.data(), lse.data(), q.data(), dq.data(),
                               dk.data(), dv.data());
    });
    for (const std::vector<float>* out : {&o, &lse, &dq, &dk, &dv})
      EXPECT_TRUE(std::all_of(out->begin(), out->end(), [](float x) { return x != x; })) << "an output was written";
  }
  // Null pointers, named as such.
  const RingShape s = ring_shape(2, 2, 48, 64, false, 2, Sharding::Zigzag);
  std::vector<float> x(std::size_t(s.attn.q_elems()), 1.f), l(std::size_t(s.attn.lse_elems()));
  EXPECT_THROW(ring::twin_ring_forward(s, DType::F32, x.data(), nullptr, x.data(), x.data(), l.data()), InputError);
  EXPECT_THROW(ring::twin_ring_backward(s, DType::F32, x.data(), x.data(), x.data(), x.data(), l.data(), x.data(),
                                        x.data(), x.data(), nullptr),
               InputError);
}

// ---- On the GPU: v1_ring, every rank on one GPU ------------------------------------------------

// The ring of ranks on one GPU (gpu_ring_forward_local) on `in`: O and lse as fp32, the outputs
// poisoned before the call.
ForwardOutputs one_gpu_ring(const RingShape& s, DType t, const Inputs& in) {
  const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t);
  gpu::DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size()), dout(q.size()),
      dlse(std::size_t(s.attn.lse_elems()) * sizeof(float));
  dq.upload(q.data(), q.size()), dk.upload(k.data(), k.size()), dv.upload(v.data(), v.size());
  dout.poison(), dlse.poison();
  ring::gpu_ring_forward_local(s, t, dq.get(), dk.get(), dv.get(), dout.get(), static_cast<float*>(dlse.get()),
                               nullptr);
  std::vector<unsigned char> o(q.size());
  ForwardOutputs out;
  out.lse.resize(std::size_t(s.attn.lse_elems()));
  dout.download(o.data(), o.size());
  dlse.download(out.lse.data(), out.lse.size() * sizeof(float));
  out.o = from_storage(o, t);
  return out;
}

// The ring of ranks on one GPU, each step the GPU's fastest forward: against the oracle, and no
// worse than twice the twin ring's error on the same inputs (the rule a GPU rung meets against its
// twin). N = 480 gives chunks of 240, 120, 80 and 60 keys: not multiples of the kernels' blocks.
TEST(RingAttentionGpu, OneGpuRingMatchesTheOracleAndTheTwin) {
  if (!gpu::available()) GTEST_SKIP() << skip_reason(Backend::Cuda);
  uint64_t seed = base_seed() + 700;
  for (DType t : {DType::F16, DType::BF16})
    for (int64_t P : {1, 2, 3, 4})
      for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
        for (bool causal : {false, true})
          for (int64_t d : {64, 128}) {
            if (t == DType::F16 && d == 128) continue;
            const RingShape s = ring_shape(4, 1, 480, d, causal, P, sh, 2);
            SCOPED_TRACE(s.str() + " " + dtype_name(t) + " seed=" + std::to_string(seed) + " local " +
                         ring::gpu_local_rung(t).name());
            const Inputs in = make_inputs(s.attn, t, seed++);
            const ForwardOutputs out = one_gpu_ring(s, t, in);
            const ReferenceForward ref = reference_forward(s.attn, in.q.data(), in.k.data(), in.v.data());
            const ForwardCheck c = check_forward(s.attn, t, out, ref);
            EXPECT_TRUE(c.pass) << c.str();
            const ForwardCheck twin = check_forward(s.attn, t, ring_forward(s, t, in).out, ref);
            expect_no_worse_than(c.o, twin.o, t, "O");
            EXPECT_LE(c.lse.max_abs, 1e-3) << "lse " << c.lse.str();
          }
}

// Steps whose shape splits rung 08 v13's last round (a workspace) where the whole causal step's
// shape does not: N = 4200, two ranks, d = 128. Contiguous, rank 1's second step is 2100 × 2100
// unmasked (136 tiles on 132 SMs: a tail of 4, split); zigzag, its half steps split too. Each rank
// sizes its workspace over every step (ring::step_workspace_bytes), else the split step overruns it.
TEST(RingAttentionGpu, OneGpuRingWhoseStepsSplitMatchesTheOracle) {
  if (!gpu::available()) GTEST_SKIP() << skip_reason(Backend::Cuda);
  uint64_t seed = base_seed() + 800;
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag}) {
    const RingShape s = ring_shape(8, 2, 4200, 128, true, 2, sh);
    const DType t = DType::BF16;
    SCOPED_TRACE(s.str() + " seed=" + std::to_string(seed) + " local " + ring::gpu_local_rung(t).name());
    const Inputs in = make_inputs(s.attn, t, seed++);
    const ForwardOutputs out = one_gpu_ring(s, t, in);
    const ForwardCheck c = check_forward(s.attn, t, out, reference_forward(s.attn, in.q.data(), in.k.data(), in.v.data()));
    EXPECT_TRUE(c.pass) << c.str();
    EXPECT_LE(c.lse.max_abs, 1e-3) << "lse " << c.lse.str();
  }
}

// ---- Across GPUs: v2_nccl, one rank a GPU ------------------------------------------------------

#if FLASH_LADDER_HAS_NCCL
// Runs `body(rank, comm)` on every GPU at once, one thread a rank, with a communicator of them all;
// returns each rank's error message ("" when it returned).
std::vector<std::string> on_every_gpu(int P, const std::function<void(int, ncclComm_t)>& body) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast for these communicators (a set value stays)
  ncclUniqueId id;
  std::vector<std::string> errors(static_cast<std::size_t>(P));
  if (ncclGetUniqueId(&id) != ncclSuccess) {  // no threads start with an id that means nothing
    for (std::string& e : errors) e = "ncclGetUniqueId failed";
    return errors;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        ncclComm_t comm = nullptr;
        if (ncclCommInitRank(&comm, P, id, r) != ncclSuccess) throw std::runtime_error("ncclCommInitRank failed");
        try {
          body(r, comm);
        } catch (...) {
          ncclCommDestroy(comm);
          throw;
        }
        ncclCommDestroy(comm);
      } catch (const std::exception& e) {
        errors[std::size_t(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

int gpu_count() {
  int n = 0;
  return gpu::available() && cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
#endif

// Two GPUs, each a rank with its shards: the same bits as the one-GPU ring (the same kernels on
// the same rows in the same order), and within the tolerance of the oracle.
TEST(RingAttentionNccl, TwoGpusGiveTheOneGpuRingsBits) {
#if !FLASH_LADDER_HAS_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs; this machine has " << gpu_count();
  const int P = 2;
  uint64_t seed = base_seed() + 900;
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
    for (bool causal : {false, true}) {
      const DType t = DType::BF16;
      const RingShape s = ring_shape(8, 2, 1024, 128, causal, P, sh, 2);
      SCOPED_TRACE(s.str());
      const Inputs in = make_inputs(s.attn, t, seed++);
      const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t);
      // The one-GPU ring on GPU 0.
      std::vector<unsigned char> o_one(q.size());
      std::vector<float> lse_one(std::size_t(s.attn.lse_elems()));
      {
        gpu::DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size()), dout(q.size()), dlse(lse_one.size() * 4);
        dq.upload(q.data(), q.size()), dk.upload(k.data(), k.size()), dv.upload(v.data(), v.size());
        ring::gpu_ring_forward_local(s, t, dq.get(), dk.get(), dv.get(), dout.get(), static_cast<float*>(dlse.get()), nullptr);
        dout.download(o_one.data(), o_one.size());
        dlse.download(lse_one.data(), lse_one.size() * 4);
      }
      // Each rank's shards (its chunks in order), run on its GPU, put back in their places.
      const int64_t L = s.local_len(), d = s.attn.head_dim;
      const int64_t qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads;
      std::vector<unsigned char> o(q.size());
      std::vector<float> lse(lse_one.size(), kNaN);
      const std::vector<std::string> errors = on_every_gpu(P, [&](int r, ncclComm_t comm) {
        const std::size_t qb = std::size_t(qh * L * d * 2), kb = std::size_t(kh * L * d * 2);
        std::vector<unsigned char> ql(qb), kl(kb), vl(kb), ol(qb);
        std::vector<float> ll(std::size_t(qh * L));
        s.shard(r, q.data(), ql.data(), qh, d * 2);
        s.shard(r, k.data(), kl.data(), kh, d * 2);
        s.shard(r, v.data(), vl.data(), kh, d * 2);
        gpu::DeviceBuffer dq(qb), dk(kb), dv(kb), dout(qb), dlse(ll.size() * 4);
        dq.upload(ql.data(), qb), dk.upload(kl.data(), kb), dv.upload(vl.data(), kb);
        dout.poison(), dlse.poison();
        ring::nccl_ring_forward(s, t, dq.get(), dk.get(), dv.get(), dout.get(), static_cast<float*>(dlse.get()), comm,
                                nullptr);
        dout.download(ol.data(), qb);
        dlse.download(ll.data(), ll.size() * 4);
        s.unshard(r, ol.data(), o.data(), qh, d * 2);  // ranks write disjoint rows
        s.unshard(r, ll.data(), lse.data(), qh, 4);
      });
      for (int r = 0; r < P; ++r) ASSERT_EQ(errors[std::size_t(r)], "") << "rank " << r;
      EXPECT_EQ(o, o_one) << "O differs from the one-GPU ring's";
      EXPECT_EQ(0, std::memcmp(lse.data(), lse_one.data(), lse.size() * 4)) << "lse differs from the one-GPU ring's";
      ForwardOutputs out{from_storage(o, t), lse};
      const ForwardCheck chk = check_forward(s.attn, t, out, reference_forward(s.attn, in.q.data(), in.k.data(), in.v.data()));
      EXPECT_TRUE(chk.pass) << chk.str();
    }
#endif
}

// A rank given another problem, or a communicator of another size: every rank throws, none hangs
// (a hang shows as this test's timeout).
TEST(RingAttentionNccl, DisagreeingRanksAllFailWithoutHanging) {
#if !FLASH_LADDER_HAS_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs; this machine has " << gpu_count();
  const RingShape s = ring_shape(4, 1, 256, 64, true, 2, Sharding::Zigzag);
  auto call = [&](const RingShape& mine, int r, ncclComm_t comm) {
    const std::size_t qb = std::size_t(mine.attn.batch * mine.attn.heads * mine.local_len() * 64 * 2);
    gpu::DeviceBuffer buf(4 * qb + 4096);
    char* p = static_cast<char*>(buf.get());
    ring::nccl_ring_forward(mine, DType::BF16, p, p + qb, p + 2 * qb, p + 3 * qb, reinterpret_cast<float*>(p + 4 * qb),
                            comm, nullptr);
    (void)r;
  };
  std::vector<std::string> errors = on_every_gpu(2, [&](int r, ncclComm_t comm) {
    RingShape mine = s;
    if (r == 1) mine.attn.seq_q = mine.attn.seq_k = 512;  // rank 1 thinks the sequence is longer
    call(mine, r, comm);
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("disagree"), std::string::npos) << e;
  errors = on_every_gpu(2, [&](int r, ncclComm_t comm) {
    RingShape three = s;  // a communicator of 2 ranks for a ring of 3 (N = 384: chunks of 64)
    three.ranks = 3, three.attn.seq_q = three.attn.seq_k = 384;
    call(three, r, comm);
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("communicator has 2 ranks"), std::string::npos) << e;
#endif
}

// ---- Across GPUs: the kept rank (v3_kept, v4_overlap, v5_backward) ----------------------------

#if FLASH_LADDER_HAS_NCCL
// The whole problem through `version` opened on the first P GPUs (a thread a rank): each rank's
// shards up, its forward called twice (the second call must give the first's bits: a kept rank
// starts every call from the empty state), then with `bin` its backward, twice (O and lse from
// bin: the oracle's, rounded as a forward stores them); the ranks' rows put back in their places.
struct KeptRun {
  std::vector<unsigned char> o, dq, dk, dv;  // in the dtype's storage
  std::vector<float> lse;
};
std::vector<std::string> kept_ring(int P, const std::string& version, const RingShape& s, DType t, const Inputs& in,
                                   const BackwardInputs* bin, KeptRun& out) {
  const int64_t L = s.local_len(), d = s.attn.head_dim, e = int64_t(dtype_bytes(t));
  const int64_t qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads;
  const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t);
  const std::vector<unsigned char> o_in = bin ? to_storage(bin->o, t) : std::vector<unsigned char>(),
                                   do_in = bin ? to_storage(bin->dout, t) : std::vector<unsigned char>();
  out.o.assign(q.size(), 0), out.lse.assign(std::size_t(s.attn.lse_elems()), kNaN);
  if (bin) out.dq.assign(q.size(), 0), out.dk.assign(k.size(), 0), out.dv.assign(v.size(), 0);
  return on_every_gpu(P, [&](int r, ncclComm_t comm) {
    const std::size_t qb = std::size_t(qh * L * d * e), kb = std::size_t(kh * L * d * e), lb = std::size_t(qh * L) * 4;
    std::vector<unsigned char> host(std::max(qb, kb));
    auto up = [&](const std::vector<unsigned char>& whole, int64_t groups, std::size_t bytes, int64_t row) {
      gpu::DeviceBuffer b(bytes);
      s.shard(r, whole.data(), host.data(), groups, row);
      b.upload(host.data(), bytes);
      return b;
    };
    auto down = [&](const gpu::DeviceBuffer& b, void* whole, int64_t groups, std::size_t bytes, int64_t row) {
      b.download(host.data(), bytes);
      s.unshard(r, host.data(), whole, groups, row);  // ranks write disjoint rows
    };
    gpu::DeviceBuffer dq = up(q, qh, qb, d * e), dk = up(k, kh, kb, d * e), dv = up(v, kh, kb, d * e), o(qb), lse(lb);
    o.poison(), lse.poison();
    std::unique_ptr<ring::NcclRank> rank = ring::nccl_ring_open(version, s, t, comm, nullptr);
    rank->forward(dq.get(), dk.get(), dv.get(), o.get(), static_cast<float*>(lse.get()));
    std::vector<unsigned char> first(qb);
    o.download(first.data(), qb);
    o.poison();
    rank->forward(dq.get(), dk.get(), dv.get(), o.get(), static_cast<float*>(lse.get()));
    std::vector<unsigned char> second(qb);
    o.download(second.data(), qb);
    if (first != second) throw std::runtime_error("the second forward call gave other bits than the first");
    down(o, out.o.data(), qh, qb, d * e);
    down(lse, out.lse.data(), qh, lb, 4);
    if (!bin) return;
    std::vector<float> lse_shard(std::size_t(qh * L));
    gpu::DeviceBuffer oo = up(o_in, qh, qb, d * e), dout = up(do_in, qh, qb, d * e), ll(lb), gq(qb), gk(kb), gv(kb);
    s.shard(r, bin->lse.data(), lse_shard.data(), qh, 4);
    ll.upload(lse_shard.data(), lb);
    for (int call = 0; call < 2; ++call) {  // twice: the second starts from the kept state
      gq.poison(), gk.poison(), gv.poison();
      rank->backward(dq.get(), dk.get(), dv.get(), oo.get(), static_cast<const float*>(ll.get()), dout.get(), gq.get(),
                     gk.get(), gv.get());
    }
    down(gq, out.dq.data(), qh, qb, d * e);
    down(gk, out.dk.data(), kh, kb, d * e);
    down(gv, out.dv.data(), kh, kb, d * e);
  });
}
#endif

// v3, v4 and v5 compute what v2 computes, in the same order, with one rank a GPU: the one-GPU
// ring's bits, on one GPU (a ring of one rank) and on two where there are two.
TEST(RingAttentionNccl, KeptVersionsGiveTheOneGpuRingsBits) {
#if !FLASH_LADDER_HAS_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  uint64_t seed = base_seed() + 950;
  for (int P : {1, 2}) {
    if (gpu_count() < P) continue;  // the two-GPU half needs two
    for (const std::string& version : ring::nccl_ring_versions())
      for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
        for (bool causal : {false, true}) {
          const DType t = DType::BF16;
          const RingShape s = ring_shape(8, 2, 1024, 128, causal, P, sh, 2);
          SCOPED_TRACE(s.str() + " " + version);
          const Inputs in = make_inputs(s.attn, t, seed++);
          const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t);
          std::vector<unsigned char> o_one(q.size());
          std::vector<float> lse_one(std::size_t(s.attn.lse_elems()));
          {
            gpu::DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size()), dout(q.size()), dlse(lse_one.size() * 4);
            dq.upload(q.data(), q.size()), dk.upload(k.data(), k.size()), dv.upload(v.data(), v.size());
            ring::gpu_ring_forward_local(s, t, dq.get(), dk.get(), dv.get(), dout.get(), static_cast<float*>(dlse.get()),
                                         nullptr);
            dout.download(o_one.data(), o_one.size());
            dlse.download(lse_one.data(), lse_one.size() * 4);
          }
          KeptRun run;
          const std::vector<std::string> errors = kept_ring(P, version, s, t, in, nullptr, run);
          for (int r = 0; r < P; ++r) ASSERT_EQ(errors[std::size_t(r)], "") << "rank " << r;
          EXPECT_EQ(run.o, o_one) << "O differs from the one-GPU ring's";
          EXPECT_EQ(0, std::memcmp(run.lse.data(), lse_one.data(), lse_one.size() * 4)) << "lse differs";
        }
  }
#endif
}

// v5's backward on the GPUs (one rank, and two where there are two): dQ, dK, dV within the
// dtype's tolerance of the fp64 oracle and no worse than twice the local backward rung's error on
// the whole problem on one GPU. Ragged chunks (N = 480: chunks of 240, 120), GQA 4:1, both
// shardings, causal and not, d = 64 and 128, fp16 and bf16.
TEST(RingAttentionNccl, BackwardOnTheGpusMatchesTheOracleAndOneGpu) {
#if !FLASH_LADDER_HAS_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  uint64_t seed = base_seed() + 980;
  for (int P : {1, 2}) {
    if (gpu_count() < P) continue;
    for (DType t : {DType::F16, DType::BF16})
      for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag})
        for (bool causal : {false, true})
          for (int64_t d : {64, 128}) {
            const RingShape s = ring_shape(4, 1, 480, d, causal, P, sh, 2);
            SCOPED_TRACE(s.str() + " " + dtype_name(t) + " seed=" + std::to_string(seed));
            const Inputs in = make_inputs(s.attn, t, seed++);
            const BackwardInputs bin = make_backward_inputs(s.attn, t, in, seed++);
            KeptRun run;
            const std::vector<std::string> errors = kept_ring(P, "v5_backward", s, t, in, &bin, run);
            for (int r = 0; r < P; ++r) ASSERT_EQ(errors[std::size_t(r)], "") << "rank " << r;
            const ReferenceBackward ref = reference_backward(s.attn, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
            const BackwardOutputs g{from_storage(run.dq, t), from_storage(run.dk, t), from_storage(run.dv, t)};
            const BackwardCheck c = check_backward(t, g, ref);
            EXPECT_TRUE(c.pass) << c.str();
            const BackwardCheck one = check_backward(t, run_backward(ring::gpu_local_backward_rung(t), s.attn, t, in, bin), ref);
            expect_no_worse_than(c.dq, one.dq, t, "dQ");
            expect_no_worse_than(c.dk, one.dk, t, "dK");
            expect_no_worse_than(c.dv, one.dv, t, "dV");
            const ForwardCheck f = check_forward(s.attn, t, {from_storage(run.o, t), run.lse},
                                                 reference_forward(s.attn, in.q.data(), in.k.data(), in.v.data()));
            EXPECT_TRUE(f.pass) << f.str();
          }
  }
#endif
}

// A rank handed a null pointer in one call: every rank's call throws (none hangs: a hang shows as
// this test's timeout), and the same kept ranks then run a good call correctly. A version without
// a backward, or an unknown one, is refused on every rank alike.
TEST(RingAttentionNccl, ANullPointerOnOneRankFailsEveryRankAndTheRingGoesOn) {
#if !FLASH_LADDER_HAS_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  const int P = std::min(2, gpu_count());
  const DType t = DType::BF16;
  const RingShape s = ring_shape(4, 1, 256, 64, true, P, Sharding::Zigzag);
  const Inputs in = make_inputs(s.attn, t, base_seed() + 990);
  const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t);
  const ReferenceForward ref = reference_forward(s.attn, in.q.data(), in.k.data(), in.v.data());
  std::vector<std::string> bad_fwd(static_cast<std::size_t>(P)), bad_bwd(static_cast<std::size_t>(P)),
      no_bwd(static_cast<std::size_t>(P)), unknown(static_cast<std::size_t>(P));
  std::vector<unsigned char> o_all(q.size());
  std::vector<float> lse_all(std::size_t(s.attn.lse_elems()), kNaN);
  const std::vector<std::string> errors = on_every_gpu(P, [&](int r, ncclComm_t comm) {
    const int64_t L = s.local_len(), d = 64, qh = s.attn.heads, kh = s.attn.kv_heads;
    const std::size_t qb = std::size_t(qh * L * d * 2), kb = std::size_t(kh * L * d * 2);
    std::vector<unsigned char> host(qb);
    gpu::DeviceBuffer dq(qb), dk(kb), dv(kb), o(qb), lse(std::size_t(qh * L) * 4), g(qb), gk(kb), gv(kb);
    s.shard(r, q.data(), host.data(), qh, d * 2), dq.upload(host.data(), qb);
    s.shard(r, k.data(), host.data(), kh, d * 2), dk.upload(host.data(), kb);
    s.shard(r, v.data(), host.data(), kh, d * 2), dv.upload(host.data(), kb);
    o.poison(), lse.poison();  // the bad calls read them: written (NaN), for initcheck
    auto rank = ring::nccl_ring_open("", s, t, comm, nullptr);
    float* l = static_cast<float*>(lse.get());
    try {
      rank->forward(dq.get(), dk.get(), dv.get(), r == P - 1 ? nullptr : o.get(), l);
    } catch (const std::exception& e) {
      bad_fwd[std::size_t(r)] = e.what();
    }
    try {
      rank->backward(dq.get(), dk.get(), dv.get(), o.get(), l, o.get(), r == 0 ? nullptr : g.get(), gk.get(), gv.get());
    } catch (const std::exception& e) {
      bad_bwd[std::size_t(r)] = e.what();
    }
    o.poison(), lse.poison();
    rank->forward(dq.get(), dk.get(), dv.get(), o.get(), l);  // a good call after the bad ones
    rank->backward(dq.get(), dk.get(), dv.get(), o.get(), l, o.get(), g.get(), gk.get(), gv.get());  // and its backward
    o.download(host.data(), qb);
    s.unshard(r, host.data(), o_all.data(), qh, d * 2);
    std::vector<float> rows(std::size_t(qh * L));
    lse.download(rows.data(), rows.size() * 4);
    s.unshard(r, rows.data(), lse_all.data(), qh, 4);
    rank.reset();
    auto v3 = ring::nccl_ring_open("v3_kept", s, t, comm, nullptr);
    try {
      v3->backward(dq.get(), dk.get(), dv.get(), o.get(), l, o.get(), g.get(), gk.get(), gv.get());
    } catch (const std::exception& e) {
      no_bwd[std::size_t(r)] = e.what();
    }
    try {
      ring::nccl_ring_open("v9_nothing", s, t, comm, nullptr);
    } catch (const std::exception& e) {
      unknown[std::size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < P; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(errors[std::size_t(r)], "");
    EXPECT_NE(bad_fwd[std::size_t(r)].find("null pointer"), std::string::npos) << bad_fwd[std::size_t(r)];
    EXPECT_NE(bad_bwd[std::size_t(r)].find("null pointer"), std::string::npos) << bad_bwd[std::size_t(r)];
    EXPECT_NE(no_bwd[std::size_t(r)].find("no backward"), std::string::npos) << no_bwd[std::size_t(r)];
    EXPECT_NE(unknown[std::size_t(r)].find("no ring version 'v9_nothing'"), std::string::npos) << unknown[std::size_t(r)];
  }
  if (P == 2) {  // the rank with good pointers learns of the other's
    EXPECT_NE(bad_fwd[0].find("another rank"), std::string::npos) << bad_fwd[0];
    EXPECT_NE(bad_bwd[1].find("another rank"), std::string::npos) << bad_bwd[1];
  }
  const ForwardCheck c = check_forward(s.attn, t, {from_storage(o_all, t), lse_all}, ref);
  EXPECT_TRUE(c.pass) << c.str();
#endif
}

}  // namespace
}  // namespace fl::testing
