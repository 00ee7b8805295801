// Rung 10, v1_split_kv: decoding as Flash-Decoding does it, on a contiguous KV cache.
//
// A thread block is one piece of one sequence's keys (blockIdx.x) for one KV head and one tile of
// 16 packed query rows (blockIdx.y), of one sequence (blockIdx.z). The packed rows are the G query
// heads × Nq new rows that share the KV head: consecutive rows of Q, so one load. The block
// streams its piece's keys through shared memory in blocks of 64 with a kStages-deep cp.async
// pipeline (rung 06's v3, deeper: decoding is a stream of bytes, and the bytes in flight set its
// speed), computes the online softmax of rung 06 on them, and writes its piece's O and lse to the
// workspace (or, with one piece, O and lse themselves); merge_kernel (decode.cuh) joins the pieces.
//
// The warps' split of the work: the tile has 16 rows, too few to give each warp its own rows. So
// every warp computes the scores of the whole 64-key block (the same S, bit for bit, in all four)
// and the same softmax, and takes a quarter of O's columns for P·V. The four-fold QKᵀ costs
// nothing that shows: the tensor cores idle in decoding, waiting for bytes. What it buys: one
// softmax step per 64-key block, the twin's, and no merge between warps at the end.
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

template <class T, int D, int S>
__global__ void __launch_bounds__(kThreads)
split_kernel(const T* __restrict__ q,  // [B, H, Nq, D]
             const T* __restrict__ k,  // [B, Hkv, capacity, D]
             const T* __restrict__ v,
             const int32_t* __restrict__,  // no page table in this version
             const int32_t* __restrict__ kv_len,  // [B]
             T* __restrict__ o, float* __restrict__ lse,  // written when there is one piece
             float* __restrict__ opart, float* __restrict__ lpart,  // the pieces' outputs otherwise
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
  if (k0 >= len && p.splits > 1) return;  // past the sequence's end: the merge leaves it out
  const int n_blocks = k1 > k0 ? int((k1 - k0 + BC - 1) / BC) : 0;

  const LaneRow<D> la = a_pattern<D>(lane), lb = b_pattern<D>(lane);
  const TileCopy<D, kThreads> copy(threadIdx.x);
  const int64_t q0 = p.q_row0(b, kvh);
  const T* kh = k + (int64_t(b) * p.kv_heads + kvh) * p.capacity * D;
  const T* vh = v + (int64_t(b) * p.kv_heads + kvh) * p.capacity * D;
  auto load_kv = [&](int jb) {  // keys k0 + 64·jb .. into buffer jb % S; past k1: zeros
    const int64_t j0 = k0 + int64_t(jb) * BC;
    const int valid = int(min(int64_t(BC), k1 - j0));
    copy.template load<BC>(smem_u32(Ks + (jb % S) * kTile), kh + j0 * D, valid);
    copy.template load<BC>(smem_u32(Vs + (jb % S) * kTile), vh + j0 * D, valid);
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
  // workspace for the merge. A row that saw no key: O = 0, lse = −∞.
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
    } else {
      const int64_t row = p.part_row0(b, kvh, piece) + r;
#pragma unroll
      for (int c = 0; c < D / 32; ++c)
        *reinterpret_cast<float2*>(opart + row * D + col + 8 * c) = make_float2(acc[c][2 * h] * inv, acc[c][2 * h + 1] * inv);
      if (warp == 0 && lane % 4 == 0) lpart[row] = row_lse;
    }
  }
}

struct Launch {
  template <class T, int D>
  static void run(const DecodeShape& s, const DecodeArgs& a) {
    constexpr int S = kStages<D>;
    if (fits(smem_bytes<D, S>())) launch<T, D>(split_kernel<T, D, S>, smem_bytes<D, S>(), s, a);
    else launch<T, D>(split_kernel<T, D, S - 1>, smem_bytes<D, S - 1>(), s, a);
  }
};

}  // namespace

static const Register<Launch> registered{"10_decoding/v1_split_kv",
                                         "split-KV (Flash-Decoding) with a GQA group's rows packed into one tile; "
                                         "contiguous cache",
                                         false};

}  // namespace fl::decoding
