// Rung 10, v3_cluster_merge: v2 with the pieces of a sequence merged in a thread-block cluster.
//
// What changed from v2: where a call has 2 to 16 pieces (one sequence, or a few: the short calls
// whose fixed cost the merge grid is a large share of), the split pass is launched as clusters of
// `splits` blocks, the pieces of one (sequence, KV head, row tile) side by side on one GPC. At its
// end each block leaves its piece's O rows and lse in its own shared memory, the cluster waits at
// one barrier, and its blocks, each taking a few of the tile's rows, fold the pieces from their
// neighbours' shared memory with the merge's own arithmetic (fold_pieces, decode.cuh): v2's bits,
// with no workspace round trip and no second grid. Otherwise (one piece, more than 16, or a GPU
// without clusters) it runs as v2 does.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "../06_tensor_core_mma/mma_layout.hpp"
#include "../06_tensor_core_mma/swizzle.cuh"
#include "block_reduce.cuh"
#include "decode.cuh"

namespace fl::decoding {
namespace {

using namespace fl::mma;  // pack, mma_16816, ldmatrix_x4(_trans), cp_async_*, fast_exp2, LaneRow, TileCopy

// Blocks of 64 keys in the pipeline, S: 3 at d = 128 (100 KiB of shared memory with Q's tile, two
// blocks an SM on an H100, one on an A100) and 4 at d = 64 (66 KiB). GPUs that give a block less than
// 100 KiB (sm_86, sm_89) run d = 128 with 2.
template <int D>
inline constexpr int kStages = D == 128 ? 3 : 4;
constexpr int BC = int(kBlockKeys);

template <int D, int S>
constexpr std::size_t smem_bytes() {
  return std::size_t(kTileRows + 2 * S * BC) * D * 2;
}

// Rows [0, valid) of the key block that starts at key j0 of a sequence whose page ids are
// `pages`, from the paged pools of K and V into swizzled tiles; rows past `valid` become zeros and
// read nothing. Thread t copies chunk t % (D/8) of rows t / (D/8) + i·kRowStep (TileCopy's cut),
// each from its own page: one lookup serves K and V. Keys are below 2³¹ (kv_len is int32).
template <int D, class T>
__device__ void load_paged(uint32_t k_tile, uint32_t v_tile, const T* k_pool, const T* v_pool, const int32_t* pages,
                           int j0, int valid, int kvh, const Params& p, const TileCopy<D, kThreads>& copy) {
  using C = TileCopy<D, kThreads>;
  const int row = int(threadIdx.x) / C::kChunks, col = 8 * (int(threadIdx.x) % C::kChunks);
#pragma unroll
  for (int i = 0; i < BC / C::kRowStep; ++i) {
    const int r = row + i * C::kRowStep, j = j0 + r;
    const bool ok = r < valid;
    const int64_t page = ok ? pages[j / p.page_size] : 0;
    const int64_t at = ((page * p.kv_heads + kvh) * p.page_size + (ok ? j % p.page_size : 0)) * D + col;
    cp_async_16(k_tile + copy.dst_at(i), k_pool + at, ok);
    cp_async_16(v_tile + copy.dst_at(i), v_pool + at, ok);
  }
}

template <class T, int D, int S, bool kPaged, bool kCluster>
__global__ void __launch_bounds__(kThreads)
split_kernel(const T* __restrict__ q,  // [B, H, Nq, D]
             const T* __restrict__ k,  // [B, Hkv, capacity, D] or paged [num_pages, Hkv, page_size, D]
             const T* __restrict__ v,
             const int32_t* __restrict__ page_table,  // [B, pages_per_seq] when kPaged
             const int32_t* __restrict__ kv_len,  // [B]
             T* __restrict__ o, float* __restrict__ lse,  // written when there is one piece
             float* __restrict__ opart, float* __restrict__ lpart,  // the pieces' outputs otherwise (not kCluster)
             Params p) {
  allow_dependent_launch();  // the merge may launch now and wait for this pass (decode.cuh)
  constexpr int kTile = BC * D;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [16][D], swizzled like every tile here
  T* Ks = Qs + kTileRows * D;              // [S][64][D]
  T* Vs = Ks + S * kTile;                  // [S][64][D]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int piece = blockIdx.x, kvh = blockIdx.y / p.row_tiles, b = blockIdx.z;
  const int row0 = kTileRows * (blockIdx.y % p.row_tiles);  // this block's first packed row
  const int64_t len = kv_len[b], chunk = p.piece_keys(len);
  const int64_t k0 = piece * chunk, k1 = min(len, k0 + chunk);  // the piece's keys
  // Past the sequence's end: the merge leaves the piece out. In a cluster every block still
  // takes part in the cluster's barriers, with no keys.
  if (k0 >= len && p.splits > 1 && !kCluster) return;
  const int n_blocks = k1 > k0 ? int((k1 - k0 + BC - 1) / BC) : 0;

  const LaneRow<D> la = a_pattern<D>(lane), lb = b_pattern<D>(lane);
  const TileCopy<D, kThreads> copy(threadIdx.x);
  const int64_t q0 = p.q_row0(b, kvh);
  const T* kh = k + (kPaged ? 0 : (int64_t(b) * p.kv_heads + kvh) * p.capacity * D);
  const T* vh = v + (kPaged ? 0 : (int64_t(b) * p.kv_heads + kvh) * p.capacity * D);
  const int32_t* pages = kPaged ? page_table + int64_t(b) * p.pages_per_seq : nullptr;
  auto load_kv = [&](int jb) {  // keys k0 + 64·jb .. into buffer jb % S; past k1: zeros
    const int64_t j0 = k0 + int64_t(jb) * BC;
    const int valid = int(min(int64_t(BC), k1 - j0));
    if constexpr (kPaged) {
      load_paged<D>(smem_u32(Ks + (jb % S) * kTile), smem_u32(Vs + (jb % S) * kTile), kh, vh, pages, int(j0), valid,
                    kvh, p, copy);
    } else {
      copy.template load<BC>(smem_u32(Ks + (jb % S) * kTile), kh + j0 * D, valid);
      copy.template load<BC>(smem_u32(Vs + (jb % S) * kTile), vh + j0 * D, valid);
    }
  };

  // The pipeline's start: Q, then blocks 0 .. S−2, one commit group each (empty ones too, so
  // that "wait until at most S−2 groups are pending" always means "block jb has landed").
  copy.template load<kTileRows>(smem_u32(Qs), q + (q0 + row0) * D, min(kTileRows, p.rows - row0));
  cp_async_commit();
  for (int jb = 0; jb < S - 1; ++jb) {
    if (jb < n_blocks) load_kv(jb);
    cp_async_commit();
  }
  cp_async_wait<S - 1>();  // Q's group
  __syncthreads();
  uint32_t qa[D / 16][4];  // Q's A fragments, for every block
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qa[kk], la.at(smem_u32(Qs), 0, 16 * kk));

  // Rows g and g + 8 of the tile: running max (log2 units) and this lane's part of the sum; O's
  // columns c0 + 8c + 2t, +1 of this warp's quarter, before the division by ℓ.
  const int c0 = warp * (D / 4);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, acc[D / 32][4] = {};

  for (int jb = 0; jb < n_blocks; ++jb) {
    cp_async_wait<S - 2>();  // this thread's copies of block jb have landed
    __syncthreads();         // everyone's have, and every warp is done with block jb − 1
    if (jb + S - 1 < n_blocks) load_kv(jb + S - 1);  // into block jb − 1's buffer
    cp_async_commit();
    const uint32_t Kb = smem_u32(Ks + (jb % S) * kTile), Vb = smem_u32(Vs + (jb % S) * kTile);

    // S = Q Kᵀ for all 64 keys: 8 C tiles of 16×8; every warp the same.
    float s[BC / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(bk, lb.at(Kb, 16 * np, 16 * kk));
        mma_16816<T>(s[2 * np], qa[kk], bk[0], bk[1]);
        mma_16816<T>(s[2 * np + 1], qa[kk], bk[2], bk[3]);
      }

    // The mask, only on a block that holds keys past the piece (a sequence's ragged end) or, causal,
    // past the first new row's last key (len − Nq): packed row r = hl·Nq + i sees keys
    // j ≤ i + len − Nq.
    const int64_t j0 = k0 + int64_t(jb) * BC;
    if (j0 + BC > k1 || (p.causal && j0 + BC - 1 > len - p.seq_q)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + g + 8 * h;
        const int64_t end = p.causal ? min(k1, r % p.seq_q + len - p.seq_q + 1) : k1;
        const int limit = int(max(int64_t(0), min(int64_t(BC), end - j0)));  // keys [0, limit) seen
#pragma unroll
        for (int n = 0; n < BC / 8; ++n)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e)
            if (8 * n + c_elem(lane, e).col >= limit) s[n][e] = -INFINITY;
      }
    }

    // The online softmax of rung 06, on the fragments.
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      const float m_new = fmaxf(m[h], group_reduce<4>(mx, MaxOp{}) * p.scale_log2);
      const float ref = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = fast_exp2(m[h] - ref);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < BC / 8; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) sum += (s[n][e] = fast_exp2(fmaf(s[n][e], p.scale_log2, -ref)));
      l[h] = alpha[h] * l[h] + sum;
      m[h] = m_new;
    }
#pragma unroll
    for (int c = 0; c < D / 32; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[c][e] *= alpha[e / 2];

    // O[:, this warp's quarter] += P V: P's C tiles 2kk, 2kk + 1 are the A tile of k-step kk.
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack<T>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack<T>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int cp = 0; cp < D / 64; ++cp) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, la.at(Vb, 16 * kk, c0 + 16 * cp));
        mma_16816<T>(acc[2 * cp], a, bv[0], bv[1]);
        mma_16816<T>(acc[2 * cp + 1], a, bv[2], bv[3]);
      }
    }
  }
  cp_async_wait<0>();  // nothing may still be landing at exit

  // The piece's O (divided by its own sum) and lse: into O and lse with one piece, else into the
  // workspace for the merge, or in a cluster into this block's shared memory over the key tiles
  // (part[r][D], then lse at part[16·D + r], r the row in the tile). A row that saw no key: O = 0,
  // lse = −∞.
  float* part = reinterpret_cast<float*>(Ks);
  if constexpr (kCluster) __syncthreads();  // every warp is done with the last key tile
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float lsum = group_reduce<4>(l[h], SumOp{});
    const int r = row0 + g + 8 * h;
    if (r >= p.rows) continue;
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    const float row_lse = lsum > 0.f ? m[h] / kLog2e + logf(lsum) : -INFINITY;
    const int col = c0 + c_elem(lane, 2 * h).col;
    if (p.splits == 1) {
#pragma unroll
      for (int c = 0; c < D / 32; ++c)
        *reinterpret_cast<uint32_t*>(o + (q0 + r) * D + col + 8 * c) = pack<T>(acc[c][2 * h] * inv, acc[c][2 * h + 1] * inv);
      if (warp == 0 && lane % 4 == 0) lse[q0 + r] = row_lse;
    } else if constexpr (kCluster) {
#pragma unroll
      for (int c = 0; c < D / 32; ++c)
        *reinterpret_cast<float2*>(part + (r - row0) * D + col + 8 * c) =
            make_float2(acc[c][2 * h] * inv, acc[c][2 * h + 1] * inv);
      if (warp == 0 && lane % 4 == 0) part[kTileRows * D + r - row0] = row_lse;
    } else {
      const int64_t row = p.part_row0(b, kvh, piece) + r;
#pragma unroll
      for (int c = 0; c < D / 32; ++c)
        *reinterpret_cast<float2*>(opart + row * D + col + 8 * c) = make_float2(acc[c][2 * h] * inv, acc[c][2 * h + 1] * inv);
      if (warp == 0 && lane % 4 == 0) lpart[row] = row_lse;
    }
  }
  if constexpr (kCluster) {
    cluster_sync();  // every piece's rows are written and visible to the whole cluster
    // The merge: block `piece` (its rank in the cluster) takes the tile's rows piece·kMergeRows ..,
    // then every splits·kMergeRows-th, a row per group of D/4 lanes as in merge_kernel.
    const int c = 4 * (int(threadIdx.x) % (D / 4));
    const uint32_t mine = smem_u32(part);
    for (int rt = piece * kMergeRows<D> + int(threadIdx.x) / (D / 4); rt < kTileRows && row0 + rt < p.rows;
         rt += p.splits * kMergeRows<D>) {
      const int64_t q = q0 + row0 + rt;
      fold_pieces<T, D>(
          p.pieces(len),
          [&](int i, float& ls, float4& x) {
            const uint32_t there = cluster_address(mine, i);
            ls = ld_cluster(there + 4 * (kTileRows * D + rt));
            x = ld_cluster4(there + 4 * (rt * D + c));
          },
          c, o + q * D, lse + q);
    }
    cluster_sync();  // no block leaves while another may still read its shared memory
  }
}

struct Launch {
  // Clusters where they can run (decode.cuh's launch_in_clusters), else v2's split pass and merge.
  template <class T, int D, int S, bool kPaged>
  static void go(const DecodeShape& s, const DecodeArgs& a) {
    if (!launch_in_clusters<T, D>(split_kernel<T, D, S, kPaged, true>, smem_bytes<D, S>(), s, a))
      launch<T, D>(split_kernel<T, D, S, kPaged, false>, smem_bytes<D, S>(), s, a);
  }
  template <class T, int D>
  static void run(const DecodeShape& s, const DecodeArgs& a) {
    constexpr int S = kStages<D>;
    if (fits(smem_bytes<D, S>())) {
      if (s.paged()) go<T, D, S, true>(s, a);
      else go<T, D, S, false>(s, a);
    } else {
      if (s.paged()) go<T, D, S - 1, true>(s, a);
      else go<T, D, S - 1, false>(s, a);
    }
  }
};

}  // namespace

static const Register<Launch> registered{"10_decoding/v3_cluster_merge",
                                         "v2 with a sequence's pieces merged in a thread-block cluster's shared "
                                         "memory (2 to 16 pieces, sm_90 on): no merge grid",
                                         true};

}  // namespace fl::decoding
