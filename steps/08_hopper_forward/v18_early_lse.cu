// Rung 08, v18_early_lse: v17 with the end of a d = 128 tile's rows (ℓ summed over the quad,
// 1/ℓ and the log-sum-exp, stored) worked out under the tile's last P·V instead of after it.
//
// Why: a reading of v17's SASS (appendix 08, "The tile's seam after v17") put the fixed cost a
// tile pays in the seam from its last P·V to the next tile's first Q·Kᵀ, about 1250 stall cycles
// at d = 128, and found there about 160 instructions, some 500 cycles, that wait for the last
// P·V without needing it: m and ℓ are final once the last block's softmax is done, before that
// P·V is issued, and only O needs its result.
//
// What changed: `early_end` (the quad's sum of ℓ, 1/ℓ kept in `e_inv`, lse stored) called between
// the last P·V's commit and its wait, or after the tile's blocks where the consumer had none;
// the epilogue takes 1/ℓ from `e_inv`. `kEarly` limits it to d = 128 without the split: a split
// tile's pieces merge ℓ first, and at d = 64 (the causal kEnds kernel, in a first form) the last
// P·V is two to four times shorter than the work, which then, by a reading of its SASS, held back
// the last V buffer's release; it lost 1–2 % there (chapter 08, v18). The operations and their order are v17's, so the outputs are
// v17's to the bit.
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

constexpr Version kVersion = Version::V18EarlyLse;

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
  // K and V buffers: block j + 2's K loads once block j − 1's K is done with (and after V_{j+1}, which
  // the producer issues first), its V once j − 1's V is.
  static constexpr int kStages = 3;
  // Q; K and V three times; 1 KB to start the tiles on a 1024-byte boundary (the swizzle's period).
  // O on its way out at d = 128: each consumer's 64 rows go through shared memory to one TMA store
  // a panel, in the K buffer of the tile's last block, which no product reads once every consumer
  // is past its last Q·Kᵀ (the 227 KB are full). d = 64 keeps v10's stores (the header says why).
  static constexpr bool kStaged = D == 128;
  static_assert(!kStaged || !kFromEnd, "a TMA store takes no box above row 0: staged tiles start in the head");
  // d = 64 may walk flat tiles (the launcher decides), with a second set of K/V buffers for the
  // second head of a tile that runs across two; the other walks keep v13's shared memory.
  static constexpr bool kFlat = kConsumers == 3;
  static constexpr std::size_t smem_bytes(int sets) {
    return std::size_t(BR * D) * 2 + sets * 2 * kStages * std::size_t(kTileBytes) + 1024 + 256;  // + the mbarriers
  }
  static_assert(smem_bytes(kFlat ? 2 : 1) <= 227 * 1024, "more shared memory than an SM gives a block");
  static_assert(BR % 64 == 0 && BC == 128 && D % 64 == 0, "whole warpgroups and panels; S one n128 wide");
  // A piece's partial result, per consumer thread: O's accumulators, then m and ℓ of its two rows.
  static constexpr int kPartial = P * 32 + 4;
};

// The split walk's shape, the same on the host and on the GPU: U tiles over G blocks, R whole
// rounds, the r tiles left cut into W = r·nb key blocks shared out evenly. In 32 bits (the
// launcher splits only where W·G < 2^32): 64-bit divisions cost the producer registers it has not.
struct SplitWalk {
  uint32_t grid, rounds, left, nb, work;
  __host__ __device__ SplitWalk(uint32_t u, uint32_t g, uint32_t n_blocks)
      : grid(g), rounds(u / g), left(u % g), nb(n_blocks), work((u % g) * n_blocks) {}
  __host__ __device__ uint32_t lo(uint32_t b) const { return b * work / grid; }  // block b's first key block of W
  // The block whose share holds key block w of W.
  __host__ __device__ uint32_t owner(uint32_t w) const {
    uint32_t b = w * grid / work;
    while (b + 1 < grid && lo(b + 1) <= w) ++b;
    while (b > 0 && lo(b) > w) --b;
    return b;
  }
};

// ---- device helpers ---------------------------------------------------------------------------

// Consumer c's 128 threads meet (named barrier 1 + c; 0 is __syncthreads).
__device__ __forceinline__ void sync_consumer(int c) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory"); }
// Four 8 × 8 tiles of 16-bit values to shared memory: r[j] is this lane's pair (row lane / 4,
// columns 2·(lane % 4), + 1) of tile j; `row` the address of row lane % 8 of tile lane / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
// The box at `src` in shared memory (a panel, as `load` writes one) to (column c0, row r0, slice s)
// of `map`, by the copy engine; rows outside the slice are not written. The thread goes on; the
// stores it issued form a group at bulk_commit; bulk_wait_read returns once they have read shared
// memory, bulk_wait_all once they are done.
__device__ __forceinline__ void tma_store(const CUtensorMap& map, uint32_t src, int c0, int r0, int s) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(c0), "r"(r0), "r"(s), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- kernel -----------------------------------------------------------------------------------

// kSplit: the non-causal walk with its last round split along the keys; kFlat: the walk of flat
// tiles (d = 64); kEnds: the causal walk at d = 64, each consumer to its own last key block. The
// launcher decides; never two.
template <class T, int D, bool kSplit, bool kFlat, bool kEnds = false>
__global__ void __launch_bounds__(Cfg<D>::kThreads, 1)
wgmma_kernel(const __grid_constant__ CUtensorMap tq,  // Q [B·H][Nq][d]
             const __grid_constant__ CUtensorMap to,  // O [B·H][Nq][d], in boxes of 64 rows
             const __grid_constant__ CUtensorMap tk,  // K [B·Hkv][Nk][d]
             const __grid_constant__ CUtensorMap tv,  // V [B·Hkv][Nk][d]
             T* __restrict__ o,                       // [B, H, Nq, d]
             float* __restrict__ lse,  // [B, H, Nq]
             int heads, int group, int64_t nq, int64_t nk, int n_units, float scale_log2, bool causal,
             const SplitWalk sw,  // kSplit: the walk's shape (a parameter: read where used, no register)
             float* __restrict__ parts,  // kSplit: 2·G·kConsumers slots of 128·kPartial floats
             int* __restrict__ counts,  // kSplit: r·kConsumers counters, zero at the launch
             int n_bh) {  // B·H
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace fl::wgmma;
  using C = Cfg<D>;
  static_assert(!(kSplit && kFlat), "a walk is split or flat, not both");
  // The half step after the loop assumes the causal walk at d = 64: no piece, no flat tile, no
  // staged O store.
  static_assert(!kEnds || (D == 64 && !kSplit && !kFlat), "kEnds is the causal d = 64 walk alone");
  constexpr int BR = C::BR, BC = C::BC, P = C::P, NS = C::NS;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  uint32_t base_ = (raw + 1023u) & ~1023u;
  asm volatile("" : "+r"(base_));  // opaque to the compiler: worked out once, not at every use
  const uint32_t base = base_;
  const uint32_t qs = base;                        // [BR][D] in panels
  const uint32_t ks = qs + uint32_t(BR * D * 2);            // [kStages][BC][D]
  const uint32_t vs = ks + C::kStages * C::kTileBytes;      // [kStages][BC][D]
  // Flat: the second set, K at ks + kSecond, V at vs + kSecond.
  constexpr uint32_t kSecond = 2 * C::kStages * C::kTileBytes;
  // mbarriers, for K and V apart: kfull[s] and vfull[s] (the block's K, its V, in buffer s has
  // landed), kempty[s] and vempty[s] (every consumer warpgroup is done with it), and Q's two:
  // landed, and done with (its last Q·Kᵀ in every consumer).
  const uint32_t bars = vs + (kFlat ? 3 : 1) * C::kStages * C::kTileBytes;  // past the second set, if any
  auto kfull = [&](int st) { return bars + 8 * st; };
  auto vfull = [&](int st) { return bars + 8 * (C::kStages + st); };
  auto kempty = [&](int st) { return bars + 8 * (2 * C::kStages + st); };
  auto vempty = [&](int st) { return bars + 8 * (3 * C::kStages + st); };
  const uint32_t qbar = bars + 32 * C::kStages, qempty = qbar + 8;

  // 0: the producer; 1 .. kConsumers: the consumers. The same in every lane of a warp, said so:
  // Q's descriptor and the mask's test are then worked out in uniform registers.
  const int role = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
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
  // kSplit: a piece of a tile, key blocks [a, a + n_blocks); `split` where it is not the whole
  // tile (then `left` is the tile's number among the r left and `slot` this piece's).
  // kFlat: tile t is rows 192t.. of all heads' rows; i0 and bh are its first row's, kv2 the K/V
  // slice of its last row's head (kv where that is the same head or slice).
  struct Tile {
    bool valid, last;
    int64_t i0, bh;
    int kv, kv2, n_blocks;
    int a = 0, left = 0, slot = 0;
    bool split = false;
  };
  auto tile_at = [&](int k) {
    Tile w{};
    int m, n_piece = -1;
    if constexpr (kSplit) {  // whole tiles k·G + b, then this block's share of the rest
      int tile;
      if (uint32_t(k) < sw.rounds) {
        tile = k * int(gridDim.x) + int(blockIdx.x);
      } else {
        const uint32_t lo = sw.lo(blockIdx.x), hi = sw.lo(blockIdx.x + 1);
        // Piece k − R of this block's share: the first starts at lo, a second at the next tile.
        const uint32_t start = uint32_t(k) == sw.rounds ? lo : (lo / sw.nb + 1) * sw.nb;
        w.last = uint32_t(k) > sw.rounds + 1 || start >= hi;
        if (w.last) return w;
        w.valid = true;
        const uint32_t tl = start / sw.nb, end = min(hi, (tl + 1) * sw.nb);
        tile = int(sw.rounds * sw.grid + tl);
        w.a = int(start - tl * sw.nb);
        const int n = int(end - start);
        w.split = uint32_t(n) < sw.nb;
        w.left = int(tl);
        w.slot = 2 * int(blockIdx.x) + (k - int(sw.rounds));
        n_piece = n;
      }
      w.last = false;
      w.valid = true;
      m = tile % n_m;
      w.bh = tile / n_m;
    } else if constexpr (C::kConsumers == 2) {
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
      if constexpr (kFlat) {  // in 64-row slices, s_head a head (the launcher keeps their count in an int)
        const int s_head = int(nq / 64), s0 = tile * C::kConsumers, s2 = min(s0 + C::kConsumers, n_bh * s_head) - 1;
        const int bh0 = s0 / s_head, bh2 = s2 / s_head;
        w.bh = bh0;
        w.i0 = int64_t(s0 - bh0 * s_head) * 64;
        w.kv = (bh0 / heads) * (heads / group) + (bh0 % heads) / group;
        w.kv2 = (bh2 / heads) * (heads / group) + (bh2 % heads) / group;
        w.n_blocks = int((nk + BC - 1) / BC);
        return w;
      }
      const int bhs = n_units / n_m;
      m = causal ? n_m - 1 - tile / bhs : tile % n_m;
      w.bh = causal ? tile % bhs : tile / n_m;
    }
    w.i0 = (C::kFromEnd ? nq - int64_t(n_m) * BR : 0) + int64_t(m) * BR;  // < 0: a partial first tile
    w.kv = w.kv2 = int(w.bh / heads) * (heads / group) + int(w.bh % heads) / group;
    const int64_t last_row = min(w.i0 + BR, nq) - 1;
    const int64_t key_end = causal ? min(nk, last_row + (nk - nq) + 1) : nk;  // ≤ 0: sees nothing
    w.n_blocks = key_end > 0 ? int((key_end + BC - 1) / BC) : 0;
    if (n_piece >= 0) w.n_blocks = n_piece;  // a piece of a tile left for the last round
    return w;
  };
  // The producer's thread 0 issues every copy: block jb's K (or V), a TMA box per 64-column
  // panel, into buffer it % kStages of `dst`, where `it` counts the blocks of the whole walk; keys
  // past Nk read as zeros.
  // Flat, where kv2 differs from kv: the same block of slice kv2 into the second set as well.
  auto load_block = [&](const CUtensorMap& map, uint32_t dst, uint32_t bar, int kv, int kv2, int jb, int it) {
    const int st = it % C::kStages;
    tma::mbar_expect(bar, (kv2 != kv ? 2 : 1) * C::kTileBytes);
#pragma unroll
    for (int p = 0; p < P; ++p) tma::load(dst + st * C::kTileBytes + p * BC * 128, map, 64 * p, jb * BC, kv, bar);
    if (kv2 != kv)
#pragma unroll
      for (int p = 0; p < P; ++p) tma::load(dst + kSecond + st * C::kTileBytes + p * BC * 128, map, 64 * p, jb * BC, kv2, bar);
  };
  if (threadIdx.x == 0) {
    for (int st = 0; st < C::kStages; ++st) {
      tma::mbar_init(kfull(st), 1);                // the producer's expect_tx, and the bytes
      tma::mbar_init(vfull(st), 1);
      tma::mbar_init(kempty(st), C::kConsumers);   // one arrival from each consumer
      tma::mbar_init(vempty(st), C::kConsumers);
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
        for (int p = 0; p < P; ++p)  // flat: tq is one slice of all rows
          tma::load(qs + p * BR * 128, tq, 64 * p, int(kFlat ? w.bh * nq + w.i0 : w.i0), kFlat ? 0 : int(w.bh), qbar);
        for (int jb = 0; jb < w.n_blocks; ++jb, ++it) {
          const int st = it % C::kStages, phase = ((it - C::kStages) / C::kStages) & 1;
          // Block it − kStages has left this buffer, in every consumer: K after its Q·Kᵀ, V after
          // its P·V, which comes a step later, so K is fetched a block further ahead than V.
          if (it >= C::kStages) tma::mbar_wait(kempty(st), phase);
          load_block(tk, ks, kfull(st), w.kv, w.kv2, w.a + jb, it);  // a piece: its own key blocks
          if (it >= C::kStages) tma::mbar_wait(vempty(st), phase);
          load_block(tv, vs, vfull(st), w.kv, w.kv2, w.a + jb, it);
        }
      }
    }
  } else {  // ---- the consumers ----
  setmaxnreg_inc<C::kConsumerRegs>();
  int it0 = 0, q_uses = 0;  // the walk's K/V blocks and Q tiles before this tile's
  int pending = -1;  // d = 128: the K buffer the last tile's O store reads, not yet handed back
  // The base descriptors: this warpgroup's 64 rows of Q, buffer 0 of K (K-major) and of V
  // (MN-major, read transposed); `advance` (wgmma.cuh) reaches every other one from them.
  const uint64_t q_desc = desc(qs + 64 * wg * 128, 16, 1024), k_desc = desc(ks, 16, 1024),
                 v_desc = desc(vs, BC * 128, 1024);
  for (int k = 0;; ++k) {
  const Tile w = tile_at(k);
  if (w.last) break;
  if (!w.valid) continue;
  // This consumer's rows: flat, its 64 lie in one head, which may be the tile's second (its K and
  // V then in the second set, where that head's slice differs); i0 is kept such that i0 + 64·wg
  // is its first row in that head. Rows past the last head (the last tile) are not stored.
  int64_t i0 = w.i0, bh = w.bh;
  uint32_t set = 0;
  if constexpr (kFlat) {
    const int s_head = int(nq / 64), slice = int(w.bh) * s_head + int(w.i0 / 64) + wg, b = slice / s_head;
    bh = b;
    i0 = int64_t(slice - b * s_head - wg) * 64;
    if (b != w.bh && w.kv2 != w.kv) set = kSecond;
    // The same in every lane of the warp, which the compiler cannot see from how it was reached:
    // said so, the buffer addresses below stay in uniform registers, where wgmma's descriptors
    // are read from (else they are worked out in each thread's registers and moved every step).
    set = __shfl_sync(0xffffffffu, set, 0);
  }
  const int n_blocks = w.n_blocks;
  if (n_blocks > 0) tma::mbar_wait(qbar, q_uses++ & 1);
  // kEnds: the key blocks this consumer's own rows see, up to its last row's causal limit; the
  // tile's n_blocks are its last consumer's. The same in every lane, said so (v14's `set` says
  // why). The other kernels, the non-causal d = 64 walk among them, keep v14's code.
  // half_end: those keys end in the first half of its last block, which then runs after the loop.
  int n_mine = n_blocks;
  bool half_end = false;
  if constexpr (kEnds)
    if (causal && n_blocks > 0) {
      const int64_t key_end = min(nk, i0 + 64 * wg + 64 + (nk - nq));  // ≤ 0: its rows see nothing
      n_mine = key_end > 0 ? min(n_blocks, int((key_end + BC - 1) / BC)) : 0;
      n_mine = __shfl_sync(0xffffffffu, n_mine, 0);
      half_end = __shfl_sync(0xffffffffu, n_mine > 0 && key_end - int64_t(n_mine - 1) * BC <= 64, 0);
    }
  const int n_loop = n_mine - (half_end ? 1 : 0);  // the blocks of whole steps

  // This thread's two rows in the block, r0 and r0 + 8 (element i of an accumulator: row
  // r0 + 8·((i/2) % 2), column 8·(i/4) + 2t + i%2 of its 64): running max (log2 units) and its
  // part of the sum; O before the division by ℓ, by panel of d.
  const int r0 = 64 * wg + 16 * wr + g;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float acc[P][32] = {};
  uint32_t ap[BC / 16][4];  // P of the block before, as A operands: read by this step's P·V

  // O += P V for the block whose V is in buffer `buf`: one group, committed, not waited for.
  auto issue_pv = [&](int buf) {
    const uint64_t vd = advance(v_desc, set + buf * C::kTileBytes);
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) rs_n64<T, 1>(acc[pc], ap[kk], advance(vd, pc * BC * 128 + kk * 2048));
    commit();
  };
  // The same for a half block: the first four of V's eight 16-key slices.
  auto issue_pv_half = [&](int buf) {
    const uint64_t vd = advance(v_desc, set + buf * C::kTileBytes);
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < BC / 32; ++kk) rs_n64<T, 1>(acc[pc], ap[kk], advance(vd, pc * BC * 128 + kk * 2048));
    commit();
  };

  // The buffer and phase of the step's block and of the block before, carried from step to step
  // (the producer fills the buffers in the same order). mask_from: the first block the mask may
  // touch (keys past Nk, or past the causal limit of this warpgroup's first row); every later one
  // is masked too.
  int buf = it0 % C::kStages, prev = 0;
  uint32_t ph = uint32_t(it0 / C::kStages) & 1u, pph = 0;
  int mask_from;
  {
    const int64_t lim1 = nk - BC - int64_t(w.a) * BC, lim2 = i0 + 64 * wg + (nk - nq) - BC + 1 - int64_t(w.a) * BC;
    const int64_t lim = causal ? min(lim1, lim2) : lim1;  // block jb unmasked iff jb * BC <= lim
    mask_from = lim < 0 ? 0 : int(min(lim / BC + 1, int64_t(INT_MAX)));
    asm volatile("" : "+r"(mask_from));  // kept out of the loop
  }
  // The mask's limits, relative to the piece's first key, in 32 bits: this thread's row r0's
  // causal limit and Nk's, clamped to ±2^30 where they lie farther out (exact while Nk < 2^30).
  constexpr int64_t kFar = int64_t(1) << 30;
  int lim_nk = int(max(-kFar, min(kFar, nk - int64_t(w.a) * BC)));
  int lim_row = causal ? int(max(-kFar, min(kFar, i0 + r0 + (nk - nq) + 1 - int64_t(w.a) * BC))) : int(kFar);
  asm volatile("" : "+r"(lim_nk), "+r"(lim_row));
  for (int jb = 0; jb < n_loop; ++jb) {
    const int64_t j0 = int64_t(w.a + jb) * BC;  // a piece starts at key block a
    tma::mbar_wait(kfull(buf), ph);  // block jb's K has landed
    const uint64_t kd = advance(k_desc, set + buf * C::kTileBytes);

    // S = Q_i K_jᵀ, this warpgroup's 64 rows: k-step kk reads 16 columns of d, 32 bytes into
    // panel kk / 4 of both operands; A = Q rows 64·wg.., B = all 128 K rows (1024 bytes per 8).
    // Then P_{j−1} V_{j−1}, while this step's softmax runs.
    float s[NS][32];
    fence();  // O was rescaled and P packed since the last wgmma
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ss_n128<T, 0, 0>(s[0], s[1], advance(q_desc, (kk / 4) * BR * 128 + 32 * (kk % 4)),
                       advance(kd, (kk / 4) * BC * 128 + 32 * (kk % 4)), kk > 0);
    commit();
    if (jb > 0) {
      tma::mbar_wait(vfull(prev), pph);  // block jb − 1's V has landed
      issue_pv(prev);
      wait<1>();  // S is in; P·V of the block before may still be running
    } else {
      wait<0>();
      // The last tile's O store has had this tile's first Q·Kᵀ to read its buffer: hand it back.
      if (pending >= 0 && threadIdx.x % 128 == 0) {
        bulk_wait_read();
        tma::mbar_arrive(kempty(pending));
      }
      pending = -1;
    }
    if (threadIdx.x % 128 == 0) {
      // Q·Kᵀ is done with block jb's K (but for the tile's last at d = 128, which O borrows) and,
      // after the tile's last, with Q: the producer may refill them.
      if (!(C::kStaged && jb == n_blocks - 1)) tma::mbar_arrive(kempty(buf));
      if (jb == n_mine - 1) tma::mbar_arrive(qempty);
    }
#pragma unroll
    for (int n = 0; n < NS; ++n) hold(s[n]);

    // Masks only where they can apply (rung 06's v5): keys past Nk, or past the causal limit of
    // this warpgroup's first row.
    if (jb >= mask_from) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int limit = max(0, min(BC, min(lim_nk, lim_row + 8 * h) - jb * BC));  // keys [0, limit) visible
        const int lt = limit - 2 * t;  // this thread's columns: 2t + a constant
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int i = 0; i < 32; ++i)
            if ((i / 2) % 2 == h && 64 * n + 8 * (i / 4) + i % 2 >= lt) s[n][i] = -INFINITY;
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

    // P_{j−1} V_{j−1} has landed in O: block jb − 1's V buffer is free as far as this warpgroup
    // goes (the producer refills it once every consumer has said so). Then rescale O by this
    // block's alpha, and P_j becomes the A operands of the next step's P·V.
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(acc[pc]);
    if (jb > 0 && threadIdx.x % 128 == 0) tma::mbar_arrive(vempty(prev));
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[pc][i] *= alpha[(i / 2) % 2];
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const float* e = s[kk / 4] + 8 * (kk % 4);
      ap[kk][0] = pack<T>(e[0], e[1]);
      ap[kk][1] = pack<T>(e[2], e[3]);
      ap[kk][2] = pack<T>(e[4], e[5]);
      ap[kk][3] = pack<T>(e[6], e[7]);
    }
    prev = buf;
    pph = ph;
    if (++buf == C::kStages) buf = 0, ph ^= 1u;
  }
  // The consumer's last block where half_end, on its first 64 keys: the loop's step with one
  // n64 product for S, which always straddles the diagonal (so always masked), and the softmax at
  // d = 64 over those 64 scores (a half block is only ever the causal d = 64 kernel's).
  if constexpr (kEnds) {
    if (half_end) {
      const int jb = n_mine - 1;
      const int64_t j0 = int64_t(jb) * BC;
      const int buf = (it0 + jb) % C::kStages, prev = (it0 + jb - 1) % C::kStages;
      tma::mbar_wait(kfull(buf), ((it0 + jb) / C::kStages) & 1);  // block jb's K has landed
      const uint64_t kd = advance(k_desc, set + buf * C::kTileBytes);
      float sh[32];
      fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ss_n64<T, 0, 0>(sh, advance(q_desc, (kk / 4) * BR * 128 + 32 * (kk % 4)),
                        advance(kd, (kk / 4) * BC * 128 + 32 * (kk % 4)), kk > 0);
      commit();
      if (jb > 0) {
        tma::mbar_wait(vfull(prev), ((it0 + jb - 1) / C::kStages) & 1);  // block jb − 1's V has landed
        issue_pv(prev);
        wait<1>();
      } else {
        wait<0>();
      }
      if (threadIdx.x % 128 == 0) {
        tma::mbar_arrive(kempty(buf));
        tma::mbar_arrive(qempty);
      }
      hold(sh);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = i0 + r0 + 8 * h;
        const int limit = int(max(int64_t(0), min(nk, row + (nk - nq) + 1) - j0));  // keys [0, limit) visible, ≤ 64
#pragma unroll
        for (int i = 0; i < 32; ++i)
          if ((i / 2) % 2 == h && 8 * (i / 4) + 2 * t + i % 2 >= limit) sh[i] = -INFINITY;
      }
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 32; ++i)
          if ((i / 2) % 2 == h) mx = fmaxf(mx, sh[i]);
        const float m_new = fmaxf(m[h], group_reduce<4>(mx, MaxOp{}) * scale_log2);
        const float ref = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = fast_exp2(m[h] - ref);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 32; ++i)
          if ((i / 2) % 2 == h) sum += (sh[i] = fast_exp2(fmaf(sh[i], scale_log2, -ref)));
        l[h] = alpha[h] * l[h] + sum;
        m[h] = m_new;
      }
      wait<0>();
#pragma unroll
      for (int pc = 0; pc < P; ++pc) hold(acc[pc]);
      if (jb > 0 && threadIdx.x % 128 == 0) tma::mbar_arrive(vempty(prev));
#pragma unroll
      for (int pc = 0; pc < P; ++pc)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[pc][i] *= alpha[(i / 2) % 2];
#pragma unroll
      for (int kk = 0; kk < BC / 32; ++kk) {
        const float* e = sh + 8 * kk;
        ap[kk][0] = pack<T>(e[0], e[1]);
        ap[kk][1] = pack<T>(e[2], e[3]);
        ap[kk][2] = pack<T>(e[4], e[5]);
        ap[kk][3] = pack<T>(e[6], e[7]);
      }
    }
  }
  const int last = (it0 + n_mine - 1) % C::kStages;
  // v18: m and l are final once the last softmax is done, so their sum over the quad, 1/l and lse
  // are worked out under the last P·V instead of after its wait (d = 128, whole tiles: pieces of a
  // split tile merge first, and at d = 64 the shorter P·V hides too little; chapter 08, v18).
  constexpr bool kEarly = !kSplit && !kFlat && D == 128;
  float e_inv[2] = {0.f, 0.f};
  auto early_end = [&]() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float lsum = group_reduce<4>(l[h], SumOp{});
      e_inv[h] = lsum > 0.f ? 1.f / lsum : 0.f;
      const int64_t row = i0 + r0 + 8 * h;
      if (t == 0 && row < nq) lse[bh * nq + row] = lsum > 0.f ? m[h] / kLog2e + logf(lsum) : -INFINITY;
    }
  };
  if (n_mine > 0) {  // the last block's P·V, and its V buffer released for the next blocks
    tma::mbar_wait(vfull(last), ((it0 + n_mine - 1) / C::kStages) & 1);
    fence();
    if (half_end)
      issue_pv_half(last);
    else
      issue_pv(last);
    if constexpr (kEarly) early_end();
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(acc[pc]);
    if (threadIdx.x % 128 == 0) tma::mbar_arrive(vempty(last));
  }
  // The tile's blocks past this consumer's own: each K and V awaited as it lands, then handed back,
  // so that the releases count block by block as the producer expects them. A wait names a phase
  // by its parity alone, so a thread must come to each wait neither a phase early (it would pass
  // at once) nor two late (it would wait for a phase that needs its own warpgroup's next
  // products). No product ties the warps together here, so one thread does the waits and the
  // hand-backs between two barriers of the consumer's 128 threads: the first holds them until
  // every warp is past this tile's waits, the second until these blocks have landed, before any
  // goes on to the next tile's.
  if (n_mine < n_blocks) {
    sync_consumer(wg);
    if (threadIdx.x % 128 == 0) {
      if (n_mine == 0) tma::mbar_arrive(qempty);  // Q unread
      for (int jb = n_mine; jb < n_blocks; ++jb) {
        const int buf = (it0 + jb) % C::kStages, phase = ((it0 + jb) / C::kStages) & 1;
        tma::mbar_wait(kfull(buf), phase);
        tma::mbar_arrive(kempty(buf));
        tma::mbar_wait(vfull(buf), phase);
        tma::mbar_arrive(vempty(buf));
      }
    }
    sync_consumer(wg);
  }
  if constexpr (kEarly)
    if (n_mine <= 0) early_end();
  it0 += n_blocks;

  if constexpr (kSplit) {
    if (w.split) {
      // A piece: its partial result to its slot (element e of thread x at e·128 + x, so that a
      // warp's stores are whole lines), then counted in on the tile's counter, one per consumer.
      const int x = threadIdx.x % 128;
      const auto slot_at = [&](int64_t slot) { return parts + (slot * C::kConsumers + wg) * (C::kPartial * 128) + x; };
      float* mine = slot_at(w.slot);
#pragma unroll
      for (int pc = 0; pc < P; ++pc)
#pragma unroll
        for (int i = 0; i < 32; ++i) mine[(32 * pc + i) * 128] = acc[pc][i];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mine[(32 * P + h) * 128] = m[h];
        mine[(32 * P + 2 + h) * 128] = l[h];
      }
      __threadfence();  // the slot is in L2 before the count says so
      sync_consumer(wg);
      // The blocks whose shares hold this tile's key blocks (a share can be empty where W < G).
      const uint32_t t0 = uint32_t(w.left) * sw.nb, first = sw.owner(t0), final_ = sw.owner(t0 + sw.nb - 1);
      int pieces = 0;
      for (uint32_t b = first; b <= final_; ++b) pieces += sw.lo(b) < sw.lo(b + 1);
      int* const said = reinterpret_cast<int*>(smem_raw + (bars + 128 + 4 * wg - raw));  // past the mbarriers
      int* const count = counts + int64_t(w.left) * C::kConsumers + wg;
      if (x == 0) *said = atomicAdd(count, 1);
      sync_consumer(wg);
      // A vote, so that ptxas sees the branch below is the same in every lane of a warp (a
      // branch on a value read from shared memory it treats as divergent, and serializes wgmma).
      const bool last_in = __all_sync(0xffffffffu, *said == pieces - 1);
      sync_consumer(wg);  // every thread has read `said` before it is written again
      if (!last_in) {  // another piece stores the tile; the tile's last K buffer goes back now
        if constexpr (C::kStaged)
          if (x == 0) tma::mbar_arrive(kempty(last));
        continue;
      }
      __threadfence();  // and the other pieces' slots are read after the count
      // Add every piece's slot, its own too, in the order of their blocks into an empty state, as
      // the online softmax adds a block (both sides rescaled to the larger maximum): the same bits
      // whichever piece is last.
#pragma unroll
      for (int h = 0; h < 2; ++h) m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
      for (int pc = 0; pc < P; ++pc)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[pc][i] = 0.f;
      for (uint32_t b = first; b <= final_; ++b) {
        if (sw.lo(b) >= sw.lo(b + 1)) continue;
        const float* other = slot_at(2 * int64_t(b) + (sw.lo(b) / sw.nb == uint32_t(w.left) ? 0 : 1));
        float fa[2], fo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float mo = __ldcg(other + (32 * P + h) * 128), lo = __ldcg(other + (32 * P + 2 + h) * 128);
          const float mx = fmaxf(m[h], mo);
          fa[h] = m[h] == -INFINITY ? 0.f : fast_exp2(m[h] - mx);
          fo[h] = mo == -INFINITY ? 0.f : fast_exp2(mo - mx);
          l[h] = l[h] * fa[h] + lo * fo[h];
          m[h] = mx;
        }
#pragma unroll
        for (int pc = 0; pc < P; ++pc)
#pragma unroll
          for (int i = 0; i < 32; ++i)
            acc[pc][i] = acc[pc][i] * fa[(i / 2) % 2] + __ldcg(other + (32 * pc + i) * 128) * fo[(i / 2) % 2];
      }
    }
  }

  if constexpr (!C::kStaged) {
    // The deferred normalisation, then O in the input type and lse in natural log.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float lsum = group_reduce<4>(l[h], SumOp{});
      const int64_t row = i0 + r0 + 8 * h;
      if (row < 0 || row >= nq || bh >= n_bh) continue;  // rows of a partial tile outside the head
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;  // a row that saw no key: O = 0
      T* out = o + (bh * nq + row) * D;
#pragma unroll
      for (int pc = 0; pc < P; ++pc)
#pragma unroll
        for (int c = 0; c < 8; ++c)
          *reinterpret_cast<uint32_t*>(out + 64 * pc + 8 * c + 2 * t) =
              pack<T>(acc[pc][4 * c + 2 * h] * inv, acc[pc][4 * c + 2 * h + 1] * inv);
      if (t == 0) lse[bh * nq + row] = lsum > 0.f ? m[h] / kLog2e + logf(lsum) : -INFINITY;
    }
  } else {  // kStaged (d = 128)
  // The deferred normalisation: ℓ summed over the quad, lse in natural log, then O in the input
  // type through shared memory.
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (kEarly) { inv[h] = e_inv[h]; continue; }
    const float lsum = group_reduce<4>(l[h], SumOp{});
    inv[h] = lsum > 0.f ? 1.f / lsum : 0.f;  // a row that saw no key: O = 0
    const int64_t row = i0 + r0 + 8 * h;
    if (t == 0 && row < nq) lse[bh * nq + row] = lsum > 0.f ? m[h] / kLog2e + logf(lsum) : -INFINITY;
  }
  if (n_blocks == 0) {  // rows that see no key: zeros, stored directly (there is no K buffer to borrow)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = i0 + r0 + 8 * h;
      if (row >= nq) continue;  // rows of a partial tile past the head
#pragma unroll
      for (int c = 0; c < D / 8; ++c) *reinterpret_cast<uint32_t*>(o + (bh * nq + row) * D + 8 * c + 2 * t) = 0u;
    }
  } else {
    tma::mbar_wait(qempty, (q_uses - 1) & 1);  // every consumer is past its last Q·Kᵀ: K_last is free
    const uint32_t stage = ks + last * C::kTileBytes;
    // This warp's 16 rows, 8 × 8 tiles four at a time: tile j of a group is row half j % 2 and
    // column octet 2·cc + j / 2 of panel pc, the pair acc[pc][4c + 2h], + 1 of each lane.
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int h = j % 2, c = 2 * cc + j / 2;
          r[j] = pack<T>(acc[pc][4 * c + 2 * h] * inv[h], acc[pc][4 * c + 2 * h + 1] * inv[h]);
        }
        const int row = 16 * wr + 8 * ((lane / 8) % 2) + lane % 8, col = 64 * pc + 8 * (2 * cc + lane / 16);
        stmatrix_x4(stage + panel_at<BC>(64 * wg + row, col), r);
      }
    fence_shared_to_async();  // the writes, visible to the copy engine
    sync_consumer(wg);        // from all 128 threads
    if (threadIdx.x % 128 == 0) {
#pragma unroll
      for (int p = 0; p < P; ++p) tma_store(to, stage + p * BC * 128 + 64 * wg * 128, 64 * p, int(i0) + 64 * wg, int(bh));
      bulk_commit();
    }
    pending = last;  // handed back in the next tile's first step
  }
  }  // kStaged
  }  // the tiles
  if (threadIdx.x % 128 == 0) bulk_wait_all();  // O's last stores are done before the block ends
  }  // the consumers
#else
  __trap();  // built without sm_90a: the launcher refuses first (launch.cuh), never silently
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ---- launcher ---------------------------------------------------------------------------------

// The walk a launch takes: one block an SM (one fits: the whole register file), or one a unit
// (a pair of tiles at d = 128, a tile at d = 64; a tile where the walk is split) where there are
// fewer; split where not causal and the idle last round would cost each block at least
// kMinSaved key blocks more than its share of the split (a piece's fixed costs, its Q load, its
// pipeline's start and its partial result's store or merge, are about 2–3 key blocks' time; at
// N = 1024 the split saved too little to pay for them). Flat tiles (d = 64) where the walk is not
// split and the shape's rows suit them (`flat_tiles_pay` in hopper_forward.hpp: no mask, Nq a
// multiple of 64, at least 128, and a head's own tiles multiplying a tenth more rows than it has).
inline constexpr int64_t kMinSaved = 8;

template <int D>
struct Plan {
  bool split = false, flat = false;
  int64_t units = 0, nb = 1;
  unsigned grid = 0;

  Plan(const AttentionShape& s, int sms) {
    using C = Cfg<D>;
    const int64_t tiles = ceil_div<int64_t>(s.seq_q, C::BR), single = tiles * s.batch * s.heads;
    const int64_t blocks = ceil_div<int64_t>(s.seq_k, C::BC), left = single % sms;
    split = !s.causal && single > sms && left != 0 && blocks - ceil_div<int64_t>(left * blocks, sms) >= kMinSaved &&
            left * blocks * sms < (int64_t(1) << 32);  // SplitWalk's 32 bits
    nb = split ? blocks : 1;
    const int64_t rows = s.batch * s.heads * s.seq_q;  // all heads' rows, counted in an int by the walk
    flat = C::kFlat && !split && flat_tiles_pay(s);
    units = split ? single : flat ? ceil_div<int64_t>(rows, C::BR) : (C::kConsumers == 2 ? (tiles + 1) / 2 : tiles) * s.batch * s.heads;
    grid = unsigned(std::min<int64_t>(units, sms));
  }
  // The workspace: two slots a block for its pieces' partial results, then a counter for each
  // consumer of each tile left (zeroed at every launch).
  std::size_t parts_bytes() const { return split ? sizeof(float) * 2 * grid * Cfg<D>::kConsumers * Cfg<D>::kPartial * 128 : 0; }
  std::size_t bytes() const { return split ? parts_bytes() + sizeof(int) * (units % grid) * Cfg<D>::kConsumers : 0; }
};

struct Launch {
  static std::size_t workspace_bytes(const AttentionShape& s, DType) {
    const int sms = gpu::sm_count();
    return s.head_dim == 64 ? Plan<64>(s, sms).bytes() : Plan<128>(s, sms).bytes();
  }

  template <class T, int D>
  static void run(const AttentionShape& s, const ForwardArgs& a) {
    using C = Cfg<D>;
    const DType t = std::is_same_v<T, __half> ? DType::F16 : DType::BF16;
    const Plan<D> plan(s, gpu::sm_count());
    const int64_t n_bh = s.batch * s.heads;
    const CUtensorMap tq = plan.flat ? tma::make_tensor_map(a.q, t, 1, n_bh * s.seq_q, D, C::BR)  // all rows at once
                                     : tma::make_tensor_map(a.q, t, n_bh, s.seq_q, D, C::BR);
    const CUtensorMap to = tma::make_tensor_map(a.o, t, s.batch * s.heads, s.seq_q, D, 64);
    const CUtensorMap tk = tma::make_tensor_map(a.k, t, s.batch * s.kv_heads, s.seq_k, D, C::BC);
    const CUtensorMap tv = tma::make_tensor_map(a.v, t, s.batch * s.kv_heads, s.seq_k, D, C::BC);
    if (s.seq_k >= (int64_t(1) << 30))  // the mask's limits are 32-bit
      throw InputError("rung 08_hopper_forward/v17_lean_steps (cuda): Nk must be below 2^30 (the mask's limits are "
                       "32-bit); for longer keys run 08_hopper_forward/v16_half_ends");
    if (plan.units > INT32_MAX / 4)  // the walk counts tiles in an int
      throw InputError("rung 08_hopper_forward/v17_lean_steps (cuda): ceil(Nq / " +
                       std::to_string(C::kConsumers == 2 && !plan.split && !plan.flat ? 2 * C::BR : C::BR) +
                       ") * batch * heads must be below 2^29");
    const SplitWalk sw(uint32_t(plan.units), plan.grid, uint32_t(plan.nb));
    float* parts = nullptr;
    int* counts = nullptr;
    if (plan.split) {
      if (!a.workspace)  // Rung::check refuses it first; a direct call of forward() may not have
        throw InputError("rung 08_hopper_forward/v17_lean_steps (cuda): this shape splits its last round and needs "
                         "a workspace of workspace_bytes() bytes (sized for the current GPU's SM count)");
      parts = static_cast<float*>(a.workspace);
      counts = reinterpret_cast<int*>(static_cast<unsigned char*>(a.workspace) + plan.parts_bytes());
      FL_CUDA_CHECK(cudaMemsetAsync(counts, 0, plan.bytes() - plan.parts_bytes(), as_stream(a.stream)));
    }
    auto* const kernel = plan.split  ? &wgmma_kernel<T, D, true, false>
                         : plan.flat ? &wgmma_kernel<T, D, false, C::kFlat>  // (never taken at d = 128)
                         : s.causal  ? &wgmma_kernel<T, D, false, false, C::kFlat>  // d = 64: kEnds
                                     : &wgmma_kernel<T, D, false, false>;
    const std::size_t smem = C::smem_bytes(plan.flat ? 2 : 1);
    FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<plan.grid, C::kThreads, smem, as_stream(a.stream)>>>(
        tq, to, tk, tv, static_cast<T*>(a.o), a.lse, int(s.heads), int(s.group()), s.seq_q, s.seq_k, int(plan.units),
        s.softmax_scale() * kLog2e, s.causal, sw, parts, counts, int(n_bh));
    FL_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

static const RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::hopper
