// Rung 08, v11_tile_seam: v10 with the seam between two tiles of a block's walk overlapped: the
// next tile's first product S = Q·K_0ᵀ is issued beside the last tile's last P·V, so the first
// block's softmax runs while the tensor cores finish the tile before.
//
// Why: a tile is n key blocks; in v10 its first step has no P·V to hide its softmax under (S_0 is
// waited for alone, then the softmax runs with nothing queued), and its last P·V is waited for
// alone before O is written. Both consumer warpgroups walk the same tile, so both sit at the seam
// at once and the tensor cores idle there. At N = 1024 (8 blocks a tile) v10 is about 12 % behind
// cuDNN's forward and at 4096 about 3 %: the same cost of about one step a tile.
//
// What changed: the consumers keep the last block's P·V pending (`pend`) when a tile ends: its
// P is in `ap`, O rescaled in `acc`, and the tile's rows, ℓ and m saved. The next tile's first
// step then issues S_0 and that P·V together, as every other step does with S_j and P_{j−1}V_{j−1}.
// After it the old tile's O is complete in acc (`ready`), and the next step writes it at its top,
// before it issues anything (`write_ready`): the step itself stays one piece of code, and the
// rescale skips a tile's first block by a select, not a branch. A tile's first P·V then
// overwrites acc (`issue_pv`'s `first`: the wgmma's accumulate flag off), so nothing ever zeroes
// the accumulators. A tile that sees no key writes zeros and leaves what is pending; the walk's
// end finishes it (`finish`). The next tile's Q now has less time to land (it is fetched once
// both consumers' last Q·Kᵀ are done, and the seam no longer waits for the last P·V and O's
// stores), so when the producer fetches a tile's Q it asks L2 for the next tile's
// (`tma::prefetch_l2`).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "block_reduce.cuh"
#include "launch.cuh"
#include "tma.cuh"

namespace fl::hopper {
namespace {

using namespace fl::mma;  // pack, fast_exp2, smem_u32
using tensor_core_mma::Tiling;

constexpr Version kVersion = Version::V11TileSeam;

// ---- constants --------------------------------------------------------------------------------

template <int D>
struct Cfg {
  static constexpr Tiling kTiling = tiling(kVersion, D);
  static constexpr int BR = kTiling.rows, BC = kTiling.keys;  // 128 query rows (192 at d = 64), 128 keys
  static constexpr int kConsumers = BR / 64, kThreads = 128 * (kConsumers + 1);  // + the producer
  static constexpr bool kFromEnd = kTiling.from_end;  // tiles counted from a head's last row (d = 64)
  // 128·40 + 256·232 ≤ 64K registers with two consumers; 128·32 + 384·160 = 64K with three.
  static constexpr int kProducerRegs = kConsumers == 2 ? 40 : 32, kConsumerRegs = kConsumers == 2 ? 232 : 160;
  static constexpr int P = D / 64;    // 64-column panels of d: O's accumulators, one wgmma N each
  static constexpr int NS = BC / 64;  // 64-key halves of S's accumulators (one n128 wgmma fills both)
  static constexpr uint32_t kTileBytes = BC * D * 2;  // one K or V buffer, 16-bit values
  static constexpr int kStages = 3;  // K/V buffers: block j + 2 loads once j − 1's V is done with
  // Q; K and V three times; 1 KB to start the tiles on a 1024-byte boundary (the swizzle's period).
  static constexpr std::size_t kSmemBytes =
      std::size_t(BR * D) * 2 + 2 * kStages * std::size_t(kTileBytes) + 1024 + 128;  // + the mbarriers
  static_assert(BR % 64 == 0 && BC == 128 && D % 64 == 0, "whole warpgroups and panels; S one n128 wide");
};

// ---- kernel -----------------------------------------------------------------------------------

template <class T, int D>
__global__ void __launch_bounds__(Cfg<D>::kThreads, 1)
wgmma_kernel(const __grid_constant__ CUtensorMap tq,  // Q [B·H][Nq][d]
             const __grid_constant__ CUtensorMap tk,  // K [B·Hkv][Nk][d]
             const __grid_constant__ CUtensorMap tv,  // V [B·Hkv][Nk][d]
             T* __restrict__ o,                       // [B, H, Nq, d]
             float* __restrict__ lse,  // [B, H, Nq]
             int heads, int group, int64_t nq, int64_t nk, int n_units, float scale_log2, bool causal) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace fl::wgmma;
  using C = Cfg<D>;
  constexpr int BR = C::BR, BC = C::BC, P = C::P, NS = C::NS;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  const uint32_t qs = base;                        // [BR][D] in panels
  const uint32_t ks = qs + uint32_t(BR * D * 2);            // [kStages][BC][D]
  const uint32_t vs = ks + C::kStages * C::kTileBytes;      // [kStages][BC][D]
  // mbarriers: full[s] (the block in buffer s has landed), empty[s] (every consumer warpgroup is
  // done with it), and Q's two: landed, and done with (its last Q·Kᵀ in every consumer).
  const uint32_t bars = vs + C::kStages * C::kTileBytes;
  auto full = [&](int st) { return bars + 8 * st; };
  auto empty = [&](int st) { return bars + 8 * (C::kStages + st); };
  const uint32_t qbar = bars + 16 * C::kStages, qempty = qbar + 8;

  const int role = threadIdx.x / 128;  // 0: the producer; 1 .. kConsumers: the consumers
  const int wg = role - 1, wr = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n_m = int((nq + BR - 1) / BR);  // row tiles a head

  // Tile k of this block's walk. At d = 128, v8's: the first or second half of pair
  // blockIdx.x + (k / 2)·gridDim.x, the longer tile first (m = n − 1 − p, then m = p); `valid` is
  // false for the second half of a head's middle pair where n is odd (m = p = n − 1 − p). At d = 64
  // one tile is the unit (the header says why): number k·G + b in even rounds and k·G + (G − 1 − b)
  // in odd ones (G blocks, b = blockIdx.x: a snake, so that a block early in one round is late in
  // the next). Not causal, the tiles are numbered head by head, so that the tiles in flight at once
  // share a few heads' K and V in L2. Causal, longest first: every head's m = n − 1, then every
  // head's m = n − 2, and so on, so that the short tiles at the end even out the blocks' loads.
  // `last`: past the last pair or tile (n_units of them).
  // The tile's first row, its (batch, head) and slice of K and V, and how many key blocks it sees.
  struct Tile {
    bool valid, last;
    int64_t i0, bh;
    int kv, n_blocks;
  };
  auto tile_at = [&](int k) {
    Tile w{};
    int m;
    if constexpr (C::kConsumers == 2) {
      const int pairs_a_head = (n_m + 1) / 2, pair = blockIdx.x + (k / 2) * gridDim.x, half = k % 2;
      w.last = pair >= n_units;
      const int p = pair % pairs_a_head;
      m = half ? p : n_m - 1 - p;
      w.valid = !w.last && !(half && m == n_m - 1 - p);
      if (!w.valid) return w;
      w.bh = pair / pairs_a_head;
    } else {
      const int tile = k * int(gridDim.x) + (k % 2 == 0 ? int(blockIdx.x) : int(gridDim.x) - 1 - int(blockIdx.x));
      w.last = tile >= n_units;
      w.valid = !w.last;
      if (!w.valid) return w;
      const int bhs = n_units / n_m;
      m = causal ? n_m - 1 - tile / bhs : tile % n_m;
      w.bh = causal ? tile % bhs : tile / n_m;
    }
    w.i0 = (C::kFromEnd ? nq - int64_t(n_m) * BR : 0) + int64_t(m) * BR;  // < 0: a partial first tile
    w.kv = int(w.bh / heads) * (heads / group) + int(w.bh % heads) / group;
    const int64_t last_row = min(w.i0 + BR, nq) - 1;
    const int64_t key_end = causal ? min(nk, last_row + (nk - nq) + 1) : nk;  // ≤ 0: sees nothing
    w.n_blocks = key_end > 0 ? int((key_end + BC - 1) / BC) : 0;
    return w;
  };
  // The producer's thread 0 issues every copy: block jb's K and V, a TMA box per 64-column panel,
  // into buffer it % kStages, where `it` counts the blocks of the whole walk; keys past Nk read as
  // zeros.
  auto load_kv = [&](int kv, int jb, int it) {
    const int st = it % C::kStages;
    tma::mbar_expect(full(st), 2 * C::kTileBytes);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      tma::load(ks + st * C::kTileBytes + p * BC * 128, tk, 64 * p, jb * BC, kv, full(st));
      tma::load(vs + st * C::kTileBytes + p * BC * 128, tv, 64 * p, jb * BC, kv, full(st));
    }
  };
  if (threadIdx.x == 0) {
    for (int st = 0; st < C::kStages; ++st) {
      tma::mbar_init(full(st), 1);                // the producer's expect_tx, and the bytes
      tma::mbar_init(empty(st), C::kConsumers);   // one arrival from each consumer
    }
    tma::mbar_init(qbar, 1);
    tma::mbar_init(qempty, C::kConsumers);
    tma::mbar_init_fence();
  }
  __syncthreads();  // the barriers are initialised, for every thread and for the copy engine

  if (role == 0) {  // ---- the producer ----
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      int it = 0, q_uses = 0;  // K/V blocks and Q tiles fetched so far in the walk
      for (int k = 0;; ++k) {
        const Tile w = tile_at(k);
        if (w.last) break;
        if (!w.valid || w.n_blocks == 0) continue;  // rows that see no key: the consumers write them alone
        if (q_uses > 0) tma::mbar_wait(qempty, (q_uses - 1) & 1);  // the last tile's Q·Kᵀ are done
        ++q_uses;
        tma::mbar_expect(qbar, BR * D * 2);
#pragma unroll
        for (int p = 0; p < P; ++p) tma::load(qs + p * BR * 128, tq, 64 * p, int(w.i0), int(w.bh), qbar);
        for (int k2 = k + 1;; ++k2) {  // the next tile with keys: its Q into L2, to land fast at the seam
          const Tile w2 = tile_at(k2);
          if (w2.last) break;
          if (!w2.valid || w2.n_blocks == 0) continue;
#pragma unroll
          for (int p = 0; p < P; ++p) tma::prefetch_l2(tq, 64 * p, int(w2.i0), int(w2.bh));
          break;
        }
        for (int jb = 0; jb < w.n_blocks; ++jb, ++it) {
          if (it >= C::kStages)  // block it − kStages has left this buffer, in every consumer
            tma::mbar_wait(empty(it % C::kStages), ((it - C::kStages) / C::kStages) & 1);
          load_kv(w.kv, jb, it);
        }
      }
    }
  } else {  // ---- the consumers ----
  setmaxnreg_inc<C::kConsumerRegs>();
  int it0 = 0, q_uses = 0;  // the walk's K/V blocks and Q tiles before this tile's
  // The base descriptors: this warpgroup's 64 rows of Q, buffer 0 of K (K-major) and of V
  // (MN-major, read transposed); `advance` (wgmma.cuh) reaches every other one from them.
  const uint64_t q_desc = desc(qs + 64 * wg * 128, 16, 1024), k_desc = desc(ks, 16, 1024),
                 v_desc = desc(vs, BC * 128, 1024);
  // This thread's two rows in a block, r0 and r0 + 8 (element i of an accumulator: row
  // r0 + 8·((i/2) % 2), column 8·(i/4) + 2t + i%2 of its 64): running max (log2 units) and its
  // part of the sum; O before the division by ℓ, by panel of d. They live across the walk: at a
  // seam they still hold the last tile's until its O is written.
  const int r0 = 64 * wg + 16 * wr + g;
  float m[2], l[2];
  float acc[P][32] = {};  // finite from the start: a tile that sees no key writes acc · 0
  uint32_t ap[BC / 16][4];  // P of the block before, as A operands: read by this step's P·V

  // O += P V for the block whose V is in buffer `buf`, or O = P V for a tile's first block
  // (`first`: the products overwrite what acc held, the tile before's O, already written): one
  // group, committed, not waited for.
  auto issue_pv = [&](int buf, bool first) {
    const uint64_t vd = advance(v_desc, buf * C::kTileBytes);
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        rs_n64<T, 1>(acc[pc], ap[kk], advance(vd, pc * BC * 128 + kk * 2048), !first || kk > 0);
    commit();
  };
  // The deferred normalisation of a finished tile's O (in acc), then O in the input type and lse in
  // natural log. Nothing clears acc for the next tile (moves that zeroed it would make ptxas
  // serialize the wgmma, note C7515): the tile's first P·V overwrites it, and a tile that sees no
  // key has ℓ = 0, so its O is acc · 0.
  auto write_tile = [&](int64_t i0, int64_t bh, const float (&lt)[2], const float (&mt)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float lsum = group_reduce<4>(lt[h], SumOp{});
      const int64_t row = i0 + r0 + 8 * h;
      if (row < 0 || row >= nq) continue;  // rows of a partial tile outside the head
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;  // a row that saw no key: O = 0
      T* out = o + (bh * nq + row) * D;
#pragma unroll
      for (int pc = 0; pc < P; ++pc)
#pragma unroll
        for (int c = 0; c < 8; ++c)
          *reinterpret_cast<uint32_t*>(out + 64 * pc + 8 * c + 2 * t) =
              pack<T>(acc[pc][4 * c + 2 * h] * inv, acc[pc][4 * c + 2 * h + 1] * inv);
      if (t == 0) lse[bh * nq + row] = lsum > 0.f ? mt[h] / kLog2e + logf(lsum) : -INFINITY;
    }
  };
  // The tile whose last P·V is pending: its rows, ℓ and m, the buffer of its last block, and
  // whether that block was its first. And the tile whose O is complete in acc, to be written at
  // the top of the next step (`ready`): writing it inside the step, between the softmax and the
  // rescale, made the step two pieces of code that ptxas schedules apart.
  bool pend = false, pend_first = false, ready = false;
  int pend_buf = 0;
  int64_t pend_i0 = 0, pend_bh = 0, ready_i0 = 0, ready_bh = 0;
  float pend_l[2], pend_m[2], ready_l[2], ready_m[2];
  auto write_ready = [&]() {
    if (ready) write_tile(ready_i0, ready_bh, ready_l, ready_m);
    ready = false;
  };
  auto finish = [&]() {  // what is pending, waited for alone, and its O written
    if (!pend) return;
    fence();
    issue_pv(pend_buf, pend_first);
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(acc[pc]);
    if (threadIdx.x % 128 == 0) tma::mbar_arrive(empty(pend_buf));
    write_tile(pend_i0, pend_bh, pend_l, pend_m);
    pend = false;
  };

  for (int k = 0;; ++k) {
  const Tile w = tile_at(k);
  if (w.last) break;
  if (!w.valid) continue;
  const int64_t i0 = w.i0, bh = w.bh;
  const int n_blocks = w.n_blocks;
#pragma unroll
  for (int h = 0; h < 2; ++h) m[h] = -INFINITY, l[h] = 0.f;
  if (n_blocks == 0) {  // rows that see no key: O = 0 and lse = −∞; what is pending stays so
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = i0 + r0 + 8 * h;
      if (row < 0 || row >= nq) continue;  // rows of a partial tile outside the head
      T* dst = o + (bh * nq + row) * D;
#pragma unroll
      for (int c = 0; c < D / 8; ++c) *reinterpret_cast<uint32_t*>(dst + 8 * c + 2 * t) = 0u;
      if (t == 0) lse[bh * nq + row] = -INFINITY;
    }
    continue;
  }
  tma::mbar_wait(qbar, q_uses++ & 1);

  for (int jb = 0; jb < n_blocks; ++jb) {
    const int64_t j0 = int64_t(jb) * BC;
    const int buf = (it0 + jb) % C::kStages;
    tma::mbar_wait(full(buf), ((it0 + jb) / C::kStages) & 1);  // block jb has landed
    const uint64_t kd = advance(k_desc, buf * C::kTileBytes);

    // S = Q_i K_jᵀ, this warpgroup's 64 rows: k-step kk reads 16 columns of d, 32 bytes into
    // panel kk / 4 of both operands; A = Q rows 64·wg.., B = all 128 K rows (1024 bytes per 8).
    // Then the P·V before it, while this step's softmax runs: P_{j−1} V_{j−1}, or at a tile's
    // first step the last one of the tile before (the seam).
    float s[NS][32];
    fence();  // O was rescaled and P packed since the last wgmma
    write_ready();  // the tile completed at the last seam: its O, read before anything is in flight
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ss_n128<T, 0, 0>(s[0], s[1], advance(q_desc, (kk / 4) * BR * 128 + 32 * (kk % 4)),
                       advance(kd, (kk / 4) * BC * 128 + 32 * (kk % 4)), kk > 0);
    commit();
    const bool seam = jb == 0 && pend;
    const int prev = jb > 0 ? (it0 + jb - 1) % C::kStages : pend_buf;  // the buffer that P·V reads
    if (jb > 0 || seam) {
      issue_pv(prev, jb == 1 || (seam && pend_first));
      wait<1>();  // S is in; the P·V before may still be running
    } else {
      wait<0>();
    }
    // Q is done with after the tile's last Q·Kᵀ: the producer may fetch the next tile's.
    if (jb == n_blocks - 1 && threadIdx.x % 128 == 0) tma::mbar_arrive(qempty);
#pragma unroll
    for (int n = 0; n < NS; ++n) hold(s[n]);

    // Masks only where they can apply (rung 06's v5): keys past Nk, or past the causal limit of
    // this warpgroup's first row.
    if (j0 + BC > nk || (causal && j0 + BC - 1 > i0 + 64 * wg + (nk - nq))) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = i0 + r0 + 8 * h;
        const int64_t lim64 = causal ? min(nk, row + (nk - nq) + 1) - j0 : nk - j0;
        const int limit = int(max(int64_t(0), min(int64_t(BC), lim64)));  // keys [0, limit) visible
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int i = 0; i < 32; ++i)
            if ((i / 2) % 2 == h && 64 * n + 8 * (i / 4) + 2 * t + i % 2 >= limit) s[n][i] = -INFINITY;
      }
    }

    // The online softmax on the accumulators, rung 06's, on this thread's two rows. At d = 128 each
    // row's maximum and sum run over four partials (element i of half n is row h = (i/2) % 2's
    // score number 16n + 2(i/4) + i%2; its partial is that % 4); at d = 64 as in v7 (v8's header
    // says why).
    float alpha[2];
    if constexpr (D == 128) {
      float mx[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 4; ++k) mx[h][k] = -INFINITY;  // in raw score units: the scale is positive
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int h = (i / 2) % 2, k = (2 * (i / 4) + i % 2) % 4;
          mx[h][k] = fmaxf(mx[h][k], s[n][i]);
        }
      float ref[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float row_max = fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]));
        const float m_new = fmaxf(m[h], group_reduce<4>(row_max, MaxOp{}) * scale_log2);
        ref[h] = m_new == -INFINITY ? 0.f : m_new;  // no −∞ − −∞ for a row with nothing yet
        alpha[h] = fast_exp2(m[h] - ref[h]);
        m[h] = m_new;
      }
      float sum[2][4] = {};
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int h = (i / 2) % 2, k = (2 * (i / 4) + i % 2) % 4;
          sum[h][k] += (s[n][i] = fast_exp2(fmaf(s[n][i], scale_log2, -ref[h])));
        }
#pragma unroll
      for (int h = 0; h < 2; ++h)  // this thread's part; the quad adds its parts at the end
        l[h] = alpha[h] * l[h] + ((sum[h][0] + sum[h][1]) + (sum[h][2] + sum[h][3]));
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;  // in raw score units: the scale is positive, so max commutes
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int i = 0; i < 32; ++i)
            if ((i / 2) % 2 == h) mx = fmaxf(mx, s[n][i]);
        const float m_new = fmaxf(m[h], group_reduce<4>(mx, MaxOp{}) * scale_log2);
        const float ref = m_new == -INFINITY ? 0.f : m_new;  // no −∞ − −∞ for a row with nothing yet
        alpha[h] = fast_exp2(m[h] - ref);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int i = 0; i < 32; ++i)
            if ((i / 2) % 2 == h) sum += (s[n][i] = fast_exp2(fmaf(s[n][i], scale_log2, -ref)));
        l[h] = alpha[h] * l[h] + sum;  // this thread's part; the quad adds its parts at the end
        m[h] = m_new;
      }
    }

    // The P·V before has landed in O: its block's buffer is free as far as this warpgroup goes
    // (the producer refills it once every consumer has said so). At a seam that completes the tile
    // before, whose O the next step's top writes. Then rescale O by this block's alpha, but at a
    // tile's first block (a select, not a branch: acc is then the tile before's O, or nothing, and
    // the next P·V overwrites it), and P_j becomes the A operands of the next step's P·V.
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(acc[pc]);
    if ((jb > 0 || seam) && threadIdx.x % 128 == 0) tma::mbar_arrive(empty(prev));
    ready = seam;
    ready_i0 = pend_i0, ready_bh = pend_bh;
#pragma unroll
    for (int h = 0; h < 2; ++h) ready_l[h] = pend_l[h], ready_m[h] = pend_m[h];
    pend = pend && !seam;
    const float a0 = jb > 0 ? alpha[0] : 1.f, a1 = jb > 0 ? alpha[1] : 1.f;
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[pc][i] *= (i / 2) % 2 ? a1 : a0;
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const float* e = s[kk / 4] + 8 * (kk % 4);
      ap[kk][0] = pack<T>(e[0], e[1]);
      ap[kk][1] = pack<T>(e[2], e[3]);
      ap[kk][2] = pack<T>(e[4], e[5]);
      ap[kk][3] = pack<T>(e[6], e[7]);
    }
  }
  // The last block's P·V stays pending: the next tile's first step issues it (or `finish` does).
  pend = true;
  pend_first = n_blocks == 1;
  pend_buf = (it0 + n_blocks - 1) % C::kStages;
  pend_i0 = i0, pend_bh = bh;
#pragma unroll
  for (int h = 0; h < 2; ++h) pend_l[h] = l[h], pend_m[h] = m[h];
  it0 += n_blocks;
  }  // the tiles
  write_ready();  // the walk's last tiles
  finish();
  }  // the consumers
#else
  __trap();  // built without sm_90a: the launcher refuses first (launch.cuh), never silently
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ---- launcher ---------------------------------------------------------------------------------

struct Launch {
  template <class T, int D>
  static void run(const AttentionShape& s, const ForwardArgs& a) {
    using C = Cfg<D>;
    FL_CUDA_CHECK(cudaFuncSetAttribute(wgmma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
    const DType t = std::is_same_v<T, __half> ? DType::F16 : DType::BF16;
    const CUtensorMap tq = tma::make_tensor_map(a.q, t, s.batch * s.heads, s.seq_q, D, C::BR);
    const CUtensorMap tk = tma::make_tensor_map(a.k, t, s.batch * s.kv_heads, s.seq_k, D, C::BC);
    const CUtensorMap tv = tma::make_tensor_map(a.v, t, s.batch * s.kv_heads, s.seq_k, D, C::BC);
    // One block per SM (one fits: the whole register file), or one per unit of the walk (a pair of
    // tiles at d = 128, a tile at d = 64) where there are fewer.
    const int64_t tiles = ceil_div<int64_t>(s.seq_q, C::BR), units = (C::kConsumers == 2 ? (tiles + 1) / 2 : tiles) * s.batch * s.heads;
    if (units > INT32_MAX / 4)  // the walk counts tiles in an int
      throw InputError("rung 08_hopper_forward/v11_tile_seam (cuda): ceil(Nq / " +
                       std::to_string(C::kConsumers == 2 ? 2 * C::BR : C::BR) + ") * batch * heads must be below 2^29");
    const int sms = gpu::sm_count();
    const unsigned grid = unsigned(std::min<int64_t>(units, sms));
    wgmma_kernel<T, D><<<grid, C::kThreads, C::kSmemBytes, as_stream(a.stream)>>>(
        tq, tk, tv, static_cast<T*>(a.o), a.lse, int(s.heads), int(s.group()), s.seq_q, s.seq_k, int(units),
        s.softmax_scale() * kLog2e, s.causal);
    FL_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

static const RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::hopper
