// Rung 11: ring attention (context parallelism). One sequence too long for one GPU is cut along
// its length into P shards, one per GPU ("rank"). Each rank keeps its shard of Q for the whole
// call and passes K/V shards around a ring: at step s = 0 .. P−1 rank r holds the K/V shard that
// started at rank (r − s) mod P, attends its Q to it, and merges that partial (O, lse) into its
// running one by rung 02's merge (as rung 10 merges the pieces of a sequence, now across GPUs);
// then every rank sends its K/V shard to rank r + 1 and receives one from r − 1. Causal attention
// needs the work balanced: with zigzag sharding (the sequence cut into 2P chunks, rank r holding
// chunks r and 2P − 1 − r) every rank sees the same number of (query, key) pairs.
//
// The backward pass goes around the same ring: K/V shards travel as in the forward, and with each
// one an fp32 accumulator of its dK/dV, to which every rank adds its contribution; after the last
// step one more hop brings each accumulator home (P hops in all).
//
// This file and ring_attention.cpp are the CPU twin: P simulated ranks in one process, each with
// its own copies of its shards, the same sharding, the same step order and the same merges as the
// NCCL kernels will use, every byte a rank sends or receives counted (`RingStats`) and pinned to
// the closed form (`ring_io_model`). The local attention of a step is a registered twin of the
// ladder (`local_rung`): rung 07's fp32 rung (forward rung 05's) for fp32, rung 07's tensor-core
// rung (forward rung 06 v9's) for fp16 and bf16, so a step rounds where those kernels round. The
// problem is one self-attention over the whole sequence (Nq = Nk); this rung registers no `Rung`
// (its calls take a number of ranks and a sharding), and is reached through `twin_ring_forward`
// and `twin_ring_backward`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness.hpp"
#include "io_model.hpp"
#include "rung.hpp"

namespace fl::ring {

// How the sequence is cut. Contiguous: P chunks of N / P, rank r holds chunk r. Zigzag: 2P chunks
// of N / 2P, rank r holds chunk r and chunk 2P − 1 − r (one early, one late: balanced causal work).
enum class Sharding { Contiguous, Zigzag };
const char* sharding_name(Sharding s);  // "contiguous", "zigzag"

struct RingShape {
  AttentionShape attn;  // the WHOLE problem: Q [B, H, N, d], K, V [B, Hkv, N, d]; seq_q = seq_k = N
  int64_t ranks = 1;    // P ≥ 1 simulated GPUs
  Sharding sharding = Sharding::Contiguous;

  // Throws InputError naming the rung (before any work) for a bad AttentionShape, P < 1,
  // Nq ≠ Nk (ring attention splits one sequence that attends to itself), or N not a multiple of
  // P (contiguous) or 2P (zigzag).
  void validate() const;

  int64_t seq() const { return attn.seq_q; }                                          // N
  int64_t chunks() const { return sharding == Sharding::Zigzag ? 2 * ranks : ranks; }  // of the sequence
  int64_t chunk_len() const { return seq() / chunks(); }                               // c
  int64_t chunks_per_rank() const { return chunks() / ranks; }                         // 1 or 2
  int64_t local_len() const { return seq() / ranks; }                                  // N / P rows a rank holds
  // The chunks rank r holds, in the order its local rows keep them (ascending positions).
  std::vector<int64_t> chunks_of(int64_t rank) const;
  // The global position of local row i of rank r.
  int64_t global_row(int64_t rank, int64_t i) const;
  // Rank r's rows of a whole host array [groups, N, row] (row_bytes a row) into its shard
  // [groups, N / P, row], its chunks in order; unshard puts a shard's rows back in their places.
  void shard(int64_t rank, const void* whole, void* local, int64_t groups, int64_t row_bytes) const;
  void unshard(int64_t rank, const void* local, void* whole, int64_t groups, int64_t row_bytes) const;
  std::string str() const;  // "B=1 H=4 Hkv=1 Nq=96 Nk=96 d=64 causal=1 P=3 zigzag"
};

// The attention one rank runs at one step: rows [q0, q0 + nq) of its local Q against rows
// [k0, k0 + nk) of the visiting K/V shard, with the causal mask of the local rows (only at step 0,
// where Q and K/V are the same shard and local order is global order) or none. nq = 0: nothing to
// compute (causal, every key of the visiting shard lies after every query of this rank).
struct StepPlan {
  int64_t source = 0;  // the rank the visiting K/V shard started at: (rank − step) mod P
  int64_t q0 = 0, nq = 0, k0 = 0, nk = 0;
  bool causal = false;
};
// Worked out from the chunks: the rows of Q that see at least one visiting key, and the keys
// that at least one of them sees; every chunk pair in that rectangle is then wholly visible or, at
// step 0, on or past the diagonal. Throws std::logic_error if a sharding broke that rule.
StepPlan plan_step(const RingShape& s, int64_t rank, int64_t step);

// One rank's account of a call. Chunk pairs: (a chunk of the rank's Q, a chunk of a visiting
// K/V shard), P · chunks_per_rank² of them over a call; each is computed whole (full), computed
// with the causal mask (diagonal), or skipped (no query of it sees a key of it).
struct RankStats {
  uint64_t bytes_sent = 0;      // over the ring to rank r + 1
  uint64_t bytes_received = 0;  // from rank r − 1
  int64_t pairs_full = 0, pairs_diagonal = 0, pairs_skipped = 0;
  int64_t scores = 0;  // (query, key) pairs its rows see, per head: the work to balance
  IoCounter hbm;       // the local twin's device-memory traffic, summed over the steps
};
struct RingStats {
  std::vector<RankStats> ranks;         // [P]
  std::vector<uint64_t> bytes_per_step; // [P]: bytes all ranks send after step s (0 after the last forward step)
};

// The ring's communication by closed form (docs/11_ring_attention.md), bytes a rank sends, which
// equal the bytes it receives (every rank does the same at every step):
//   one K/V shard:  kv  = 2 · B · Hkv · (N / P) · d · e       (K and V, e bytes an element)
//   one dK/dV:      dkv = 2 · B · Hkv · (N / P) · d · 4       (fp32 accumulators)
//   forward:  (P − 1) · kv                   (no send after the last step)
//   backward: (P − 1) · kv + P · dkv         (dK/dV travel with K/V, then one hop home); 0 at P = 1
// Causal or not, zigzag or not: the ring moves every shard every step (skipping a send would
// break the ring for the ranks further on).
struct RingIo {
  double kv_shard = 0, dkv_shard = 0;
  double forward_per_rank = 0, backward_per_rank = 0;
  double forward_step(int64_t step, int64_t ranks) const;   // all ranks, after step s
  double backward_step(int64_t step, int64_t ranks) const;  // all ranks, after step s
};
RingIo ring_io_model(const RingShape& s, DType t);

// The registered CPU rung a step runs on, by dtype: rung 07's fp32 twin (its forward rung 05's)
// or rung 07's tensor-core twin (its forward rung 06 v9_one_sync's). Its capabilities (dtypes,
// head dims 64 and 128) are the ring's.
const Rung& local_rung(DType t);

// The forward: O [B, H, N, d] and lse [B, H, N] of the whole sequence, assembled from the ranks.
// Pointers are host memory in the dtype (float, or 16-bit storage for fp16/bf16); stats, when not
// null, gets the ring's account. Refuses a bad shape, dtype, head dim or null pointer before any
// work.
void twin_ring_forward(const RingShape& s, DType t,
                       const void* q,  // [B, H, N, d]
                       const void* k,  // [B, Hkv, N, d]
                       const void* v,  // [B, Hkv, N, d]
                       void* o,        // [B, H, N, d]
                       float* lse,     // [B, H, N]
                       RingStats* stats = nullptr);

// The backward: dQ, dK, dV of the whole sequence (dK, dV summed over each GQA group, as every rung
// returns them) from Q, K, V, the forward's O and lse, and dO. Each rank's step is the local
// rung's backward on its block pair with the GLOBAL O and lse of its rows: P = exp(S − lse) and
// D = rowsum(dO ∘ O) are then the whole row's, so a block pair's dQ, dK, dV are exact parts of
// the sums.
void twin_ring_backward(const RingShape& s, DType t, const void* q, const void* k, const void* v,
                        const void* o,      // [B, H, N, d]
                        const float* lse,   // [B, H, N]
                        const void* dout,   // [B, H, N, d]
                        void* dq,           // [B, H, N, d]
                        void* dk,           // [B, Hkv, N, d]
                        void* dv,           // [B, Hkv, N, d]
                        RingStats* stats = nullptr);

// The same two calls on fp32 arrays whose values are exact in the dtype (harness.hpp's Inputs and
// BackwardInputs): stored in the dtype, run with every output poisoned (NaN) first, read back.
// What the tests and `ladder --ring` call.
struct RingForwardRun {
  ForwardOutputs out;               // O and lse in fp32
  std::vector<unsigned char> o;     // O as stored, for bitwise comparisons
  RingStats stats;
};
RingForwardRun run_ring_forward(const RingShape& s, DType t, const Inputs& in);
struct RingBackwardRun {
  BackwardOutputs grads;
  RingStats stats;
};
RingBackwardRun run_ring_backward(const RingShape& s, DType t, const Inputs& in, const BackwardInputs& bin);

}  // namespace fl::ring
