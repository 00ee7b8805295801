// Rung 06, v2_ldmatrix: v1 with its fragments loaded by ldmatrix.
//
// What changed from v1: a fragment was four (A) or two (B) 32-bit shared-memory loads per lane,
// each with its own address, and a pair of V's B fragments was eight 16-bit loads (a B pair of V
// sits in two rows). ldmatrix.x4 fills four 8×8 pieces for the whole warp in one instruction:
// each lane gives one row address and gets, in return, exactly the elements the mma fragment
// layout wants it to hold. Its .trans form hands the pieces out transposed, which turns V's rows
// into the columns B needs on the way. Three load helpers change; the kernel does not.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "block_reduce.cuh"
#include "launch.cuh"
#include "mma_layout.hpp"
#include "mma_sync.cuh"

namespace fl::tensor_core_mma {
namespace {

using namespace fl::mma;  // pack, mma_16816, ldmatrix_x4(_trans), c_elem

constexpr Version kVersion = Version::V2Ldmatrix;

// ---- constants --------------------------------------------------------------------------------

// The version's cut of the work (tensor_core_mma.hpp's tiling, which the twin follows too):
// query rows and keys per block, 4 warps of one 16-row m-tile each.
template <int D>
struct Cfg {
  static constexpr Tiling kTiling = tiling(kVersion, D);
  static constexpr int kMTiles = kTiling.m_tiles;  // 16-row mma tiles per warp
  static constexpr int kWarps = kTiling.warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = kTiling.rows;       // query rows per thread block
  static constexpr int kBc = kTiling.keys;         // keys per K/V block
  static_assert(kRows == 16 * kMTiles * kWarps, "rows = 16 × m-tiles × warps");
};

// Where element (row, col) of a tile with D columns lives in shared memory: rows padded by 8
// values (16 bytes), so the 8 rows of an 8×8 piece start 4 banks apart.
template <int D>
struct Smem {
  static constexpr int kLd = D + 8;  // row stride, elements
  __device__ static int at(int row, int col) { return row * kLd + col; }
};

// ---- device helpers ---------------------------------------------------------------------------

// rows × D elements from global into a shared tile, in 16-byte chunks; rows at or past `valid`
// are zero (a ragged last block: no NaN can come in through 0·garbage).
template <int rows, int kThreads, int D, class T>
__device__ void load_tile(T* dst, const T* src, int valid) {
  constexpr int kChunks = D / 8;  // 8 halves per 16 bytes
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = 8 * (c % kChunks);
    T* d = dst + Smem<D>::at(r, col);
    const uint4 x = r < valid ? *reinterpret_cast<const uint4*>(src + int64_t(r) * D + col) : uint4{0, 0, 0, 0};
    *reinterpret_cast<uint4*>(d) = x;
  }
}

// The A fragment of the 16×16 piece of a row-major tile at (r0, c0): lanes 0-15 give rows
// r0.. of columns c0..c0+7, lanes 16-31 the same rows at c0+8..; the pieces come out top-left,
// bottom-left, top-right, bottom-right, A's registers 0-3.
template <class T, int D>
__device__ void load_a(uint32_t (&a)[4], const T* tile, int r0, int c0, int lane) {
  ldmatrix_x4(a, tile + Smem<D>::at(r0 + lane % 16, c0 + 8 * (lane / 16)));
}

// B fragments of two n8 tiles, n0 and n0 + 8, for k-step k0, when B(k, n) = X[n][k] (K: key n,
// dimension k). b[0], b[1] for tile n0; b[2], b[3] for tile n0 + 8.
// A row of X is a column of B, so a plain ldmatrix of X's rows gives B's layout.
template <class T, int D>
__device__ void load_b_rows(uint32_t (&b)[4], const T* tile, int n0, int k0, int lane) {
  ldmatrix_x4(b, tile + Smem<D>::at(n0 + lane % 8 + 8 * (lane / 16), k0 + 8 * ((lane / 8) % 2)));
}

// The same when B(k, n) = X[k][n] (V: key k, column n): a pair of B elements sits in two rows,
// and ldmatrix.trans hands each lane the transposed pair.
template <class T, int D>
__device__ void load_b_cols(uint32_t (&b)[4], const T* tile, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, tile + Smem<D>::at(k0 + lane % 8 + 8 * ((lane / 8) % 2), n0 + 8 * (lane / 16)));
}

// ---- kernel -----------------------------------------------------------------------------------

template <class T, int D>
__global__ void __launch_bounds__(Cfg<D>::kThreads)
mma_kernel(const T* __restrict__ q,  // [B, H, Nq, d]
           const T* __restrict__ k,  // [B, Hkv, Nk, d]
           const T* __restrict__ v,  // [B, Hkv, Nk, d]
           T* __restrict__ o,        // [B, H, Nq, d]
           float* __restrict__ lse,  // [B, H, Nq]
           int group, int64_t nq, int64_t nk, float scale_log2, bool causal) {
  using C = Cfg<D>;
  constexpr int BR = C::kRows, BC = C::kBc, MT = C::kMTiles;
  constexpr int kTile = BC * Smem<D>::kLd;  // elements in the K or the V tile
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [BR][ld]
  T* Ks = Qs + BR * Smem<D>::kLd;           // [BC][ld]
  T* Vs = Ks + kTile;                       // [BC][ld]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * MT * warp;  // this warp's first row within the block
  const int64_t i0 = int64_t(blockIdx.x) * BR;
  const int64_t bh = int64_t(blockIdx.z) * gridDim.y + blockIdx.y;
  const int64_t kv = int64_t(blockIdx.z) * (gridDim.y / group) + blockIdx.y / group;
  const T* kh = k + kv * nk * D;
  const T* vh = v + kv * nk * D;

  const int64_t last_row = min(i0 + BR, nq) - 1;
  const int64_t key_end = causal ? min(nk, last_row + (nk - nq) + 1) : nk;  // ≤ 0: sees nothing
  const int n_blocks = key_end > 0 ? int((key_end + BC - 1) / BC) : 0;
  auto load_kv = [&](int jb) {
    const int64_t j0 = int64_t(jb) * BC;
    const int valid = int(min(int64_t(BC), nk - j0));
    load_tile<BC, C::kThreads, D>(Ks, kh + j0 * D, valid);
    load_tile<BC, C::kThreads, D>(Vs, vh + j0 * D, valid);
  };

  load_tile<BR, C::kThreads, D>(Qs, q + (bh * nq + i0) * D, int(min(int64_t(BR), nq - i0)));

  // Rows g and g + 8 of each of this warp's m-tiles: running max (log2 units) and this lane's
  // part of the sum; O before the division by ℓ, columns 8c + 2t, +1.
  float m[MT][2], l[MT][2], acc[MT][D / 8][4] = {};
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  for (int jb = 0; jb < n_blocks; ++jb) {
    const int64_t j0 = int64_t(jb) * BC;
    __syncthreads();  // every warp is done with the previous K_j, V_j
    load_kv(jb);
    __syncthreads();

    // S = Q_i K_jᵀ: per m-tile 16 rows × BC keys, BC/8 C tiles of 16×8; k-steps of 16 along d.
    float s[MT][BC / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_a<T, D>(a[mt], Qs, r0 + 16 * mt, 16 * kk, lane);
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        uint32_t b[4];
        load_b_rows<T, D>(b, Ks, 16 * np, 16 * kk, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Online softmax on the fragments: element e of tile n is row g + 8·(e/2), key 8n + 2t + e%2.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = i0 + r0 + 16 * mt + g + 8 * h;
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < BC / 8; ++n)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const int64_t key = j0 + 8 * n + mma::c_elem(lane, e).col;
            const bool hidden = key >= nk || (causal && key > row + (nk - nq));
            s[mt][n][e] = hidden ? -INFINITY : s[mt][n][e] * scale_log2;
            mx = fmaxf(mx, s[mt][n][e]);
          }
        const float m_new = fmaxf(m[mt][h], group_reduce<4>(mx, MaxOp{}));
        const float ref = m_new == -INFINITY ? 0.f : m_new;  // no −∞ − −∞ for a row with nothing yet
        alpha[h] = exp2f(m[mt][h] - ref);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < BC / 8; ++n)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) sum += (s[mt][n][e] = exp2f(s[mt][n][e] - ref));
        l[mt][h] = alpha[h] * l[mt][h] + sum;  // this lane's part; the quad adds its parts at the end
        m[mt][h] = m_new;
      }
#pragma unroll
      for (int c = 0; c < D / 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][c][e] *= alpha[e / 2];
    }

    // O += P V: P's C tiles 2kk and 2kk + 1 are, lane for lane, the A tile of k-step kk.
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int cp = 0; cp < D / 16; ++cp) {
        uint32_t b[4];
        load_b_cols<T, D>(b, Vs, 16 * kk, 16 * cp, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(acc[mt][2 * cp], a[mt], b[0], b[1]);
          mma_16816<T>(acc[mt][2 * cp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // The deferred normalisation, then O in the input type and lse in natural log.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float lsum = group_reduce<4>(l[mt][h], SumOp{});
      const int64_t row = i0 + r0 + 16 * mt + g + 8 * h;
      if (row >= nq) continue;
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;  // a row that saw no key: O = 0
      T* out = o + (bh * nq + row) * D;
#pragma unroll
      for (int c = 0; c < D / 8; ++c)
        *reinterpret_cast<uint32_t*>(out + 8 * c + mma::c_elem(lane, 2 * h).col) =
            pack<T>(acc[mt][c][2 * h] * inv, acc[mt][c][2 * h + 1] * inv);
      if (t == 0) lse[bh * nq + row] = lsum > 0.f ? m[mt][h] / kLog2e + logf(lsum) : -INFINITY;
    }
}

// ---- launcher ---------------------------------------------------------------------------------

struct Launch {
  template <class T, int D>
  static void run(const AttentionShape& s, const ForwardArgs& a) {
    using C = Cfg<D>;
    constexpr std::size_t bytes = std::size_t(C::kRows + 2 * C::kBc) * Smem<D>::kLd * sizeof(T);
    FL_CUDA_CHECK(cudaFuncSetAttribute(mma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const dim3 grid(unsigned(ceil_div<int64_t>(s.seq_q, C::kRows)), unsigned(s.heads), unsigned(s.batch));
    mma_kernel<T, D><<<grid, C::kThreads, bytes, as_stream(a.stream)>>>(
        static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.o),
        a.lse, int(s.group()), s.seq_q, s.seq_k, s.softmax_scale() * kLog2e, s.causal);
    FL_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

static const RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::tensor_core_mma
