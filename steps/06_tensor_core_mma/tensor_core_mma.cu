// Rung 06, GPU: FlashAttention-2 on the tensor cores, fp16 and bf16 in, fp32 accumulate.
//
// What changed from rung 05: the two products are mma.sync.m16n8k16 instructions, each a warp
// multiplying a 16×16 tile by a 16×8 tile in one go, instead of 4×4 FFMA patches per thread. The
// work split follows the instruction: each of 4 warps owns 16 query rows; within a warp, lane
// 4·g + t holds rows g and g + 8 of every C tile (mma_layout.hpp), so a row's max and sum are
// reduced across the 4 lanes t = 0..3 that share it. P leaves Q·Kᵀ in C layout, which is the A
// layout of P·V: it is rounded to 16 bits and fed straight back, never touching shared memory.
//
// The versions are one kernel with feature switches (struct Features): each version turns on one
// more, and the code a switch selects sits in the helper it names (load_tile, the fragment
// loaders, Smem::at), so reading a switch's `if constexpr` branches is reading that version's
// idea. docs/06_tensor_core_mma.md has the measured gain of each.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "block_reduce.cuh"
#include "cuda_check.cuh"
#include "mma_layout.hpp"
#include "mma_sync.cuh"
#include "swizzle.cuh"
#include "tensor_core_mma.hpp"

namespace fl::tensor_core_mma {
namespace {

using namespace fl::mma;  // pack, mma_16816, ldmatrix_x4(_trans), cp_async_*, fast_exp2, swz, ...

constexpr int kPad = 8;  // unswizzled rows: +16 bytes, so 8 rows of an 8×8 piece start 4 banks apart
constexpr float kLog2e = 1.4426950408889634f;

// ---- the versions --------------------------------------------------------------------------------

template <Version V, int D>
struct Features {
  static constexpr bool kLdmatrix = V >= Version::V2Ldmatrix;  // ldmatrix instead of scalar loads
  static constexpr bool kCpAsync = V >= Version::V3Pipeline;   // cp.async into two K/V buffers
  static constexpr bool kSwizzle = V >= Version::V4Swizzle;    // XOR-swizzled chunks, no padding
  static constexpr bool kLean = V >= Version::V5Lean;         // the instruction diet
  static constexpr bool kHoisted = V >= Version::V8Hoisted;   // addresses worked out before the loop
  static_assert(!kHoisted || (kLdmatrix && kCpAsync && kSwizzle), "v8 hoists ldmatrix and cp.async addresses");
  static constexpr bool kOneSync = V >= Version::V9OneSync;   // one barrier per K/V block
  // v6: 128 rows per block, as 4 warps of two 16-row m-tiles: each K/V fragment feeds two mma.
  static constexpr Tiling kTiling = tiling(V, D);
  static constexpr int kMTiles = kTiling.m_tiles;              // 16-row mma tiles per warp
  static constexpr int kWarps = kTiling.warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = kTiling.rows;                   // query rows per thread block
  static constexpr int kBc = kTiling.keys;                     // keys per K/V block
  static_assert(kRows == 16 * kMTiles * kWarps, "rows = 16 × m-tiles × warps");
};

// Where element (row, col) of a tile with D columns lives in shared memory. Swizzled: the 16-byte
// chunk index is XORed with row % 8, so the 8 rows an ldmatrix reads at one chunk column land in 8
// different bank groups without any padding. Reads and writes at chunk granularity (col % 8 == 0)
// are all the swizzled versions make.
template <class F, int D>
struct Smem {
  static constexpr int kLd = F::kSwizzle ? D : D + kPad;  // row stride, elements
  __device__ static int at(int row, int col) {
    if constexpr (F::kSwizzle) return swz<D>(row, col);
    else return row * kLd + col;
  }
};

// v8: this thread's share of every shared-memory address, worked out once before the loop
// (swizzle.cuh): the A pattern for the ldmatrix of Q (A fragments) and V (B through .trans), the
// B pattern for K's, and `copy` for its cp.async chunks.
template <class F, int D>
struct Lanes {
  LaneRow<D> a, b;
  TileCopy<D, F::kThreads> copy;
  __device__ explicit Lanes(int tid) : a(a_pattern<D>(tid % 32)), b(b_pattern<D>(tid % 32)), copy(tid) {}
};

// ---- device helpers ---------------------------------------------------------------------------

// rows × D elements from global into a shared tile, in 16-byte chunks; rows at or past `valid`
// are zero (a ragged last block: no NaN can come in through 0·garbage).
template <int rows, class T, class F, int D>
__device__ void load_tile(T* dst, const T* src, int valid, const Lanes<F, D>& ln) {
  if constexpr (F::kHoisted) {
    ln.copy.template load<rows>(smem_u32(dst), src, valid);
  } else {
    constexpr int kChunks = D / 8;  // 8 halves per 16 bytes
    for (int c = threadIdx.x; c < rows * kChunks; c += F::kThreads) {
      const int r = c / kChunks, col = 8 * (c % kChunks);
      T* d = dst + Smem<F, D>::at(r, col);
      if constexpr (F::kCpAsync) {
        cp_async_16(d, src + int64_t(r < valid ? r : 0) * D + col, r < valid);
      } else {
        const uint4 x = r < valid ? *reinterpret_cast<const uint4*>(src + int64_t(r) * D + col) : uint4{0, 0, 0, 0};
        *reinterpret_cast<uint4*>(d) = x;
      }
    }
  }
}

// The A fragment of the 16×16 piece of a row-major tile at (r0, c0).
template <class T, class F, int D>
__device__ void load_a(uint32_t (&a)[4], const T* tile, int r0, int c0, int lane, const Lanes<F, D>& ln) {
  if constexpr (F::kHoisted) {
    ldmatrix_x4(a, ln.a.at(smem_u32(tile), r0, c0));
  } else if constexpr (F::kLdmatrix) {
    ldmatrix_x4(a, tile + Smem<F, D>::at(r0 + lane % 16, c0 + 8 * (lane / 16)));
  } else {
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // elements 2r and 2r + 1 are adjacent in a row
      const mma::Coord c = mma::a_elem(lane, 2 * r);
      a[r] = *reinterpret_cast<const uint32_t*>(tile + Smem<F, D>::at(r0 + c.row, c0 + c.col));
    }
  }
}

// B fragments of two n8 tiles, n0 and n0 + 8, for k-step k0, when B(k, n) = X[n][k] (K: key n,
// dimension k). b[0], b[1] for tile n0; b[2], b[3] for tile n0 + 8.
template <class T, class F, int D>
__device__ void load_b_rows(uint32_t (&b)[4], const T* tile, int n0, int k0, int lane, const Lanes<F, D>& ln) {
  if constexpr (F::kHoisted) {
    ldmatrix_x4(b, ln.b.at(smem_u32(tile), n0, k0));
  } else if constexpr (F::kLdmatrix) {
    ldmatrix_x4(b, tile + Smem<F, D>::at(n0 + lane % 8 + 8 * (lane / 16), k0 + 8 * ((lane / 8) % 2)));
  } else {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const mma::Coord c = mma::b_elem(lane, 2 * (r % 2));  // (k, n) of the pair's first element
      b[r] = *reinterpret_cast<const uint32_t*>(tile + Smem<F, D>::at(n0 + 8 * (r / 2) + c.col, k0 + c.row));
    }
  }
}

// The same when B(k, n) = X[k][n] (V: key k, column n): a pair of B elements sits in two rows.
template <class T, class F, int D>
__device__ void load_b_cols(uint32_t (&b)[4], const T* tile, int k0, int n0, int lane, const Lanes<F, D>& ln) {
  if constexpr (F::kHoisted) {
    ldmatrix_x4_trans(b, ln.a.at(smem_u32(tile), k0, n0));
  } else if constexpr (F::kLdmatrix) {
    ldmatrix_x4_trans(b, tile + Smem<F, D>::at(k0 + lane % 8 + 8 * ((lane / 8) % 2), n0 + 8 * (lane / 16)));
  } else {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const mma::Coord e0 = mma::b_elem(lane, 2 * (r % 2)), e1 = mma::b_elem(lane, 2 * (r % 2) + 1);
      const int n = n0 + 8 * (r / 2);
      b[r] = pack<T>(tile[Smem<F, D>::at(k0 + e0.row, n + e0.col)], tile[Smem<F, D>::at(k0 + e1.row, n + e1.col)]);
    }
  }
}

// ---- kernel -----------------------------------------------------------------------------------

template <Version V, class T, int D>
__global__ void __launch_bounds__(Features<V, D>::kThreads)
mma_kernel(const T* __restrict__ q,  // [B, H, Nq, d]
           const T* __restrict__ k,  // [B, Hkv, Nk, d]
           const T* __restrict__ v,  // [B, Hkv, Nk, d]
           T* __restrict__ o,        // [B, H, Nq, d]
           float* __restrict__ lse,  // [B, H, Nq]
           int group, int64_t nq, int64_t nk, float scale_log2, bool causal) {
  using F = Features<V, D>;
  constexpr int BR = F::kRows, BC = F::kBc, MT = F::kMTiles, kBuffers = F::kCpAsync ? 2 : 1;
  constexpr int kTile = BC * Smem<F, D>::kLd;  // elements in one K or V buffer
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);        // [BR][ld]
  T* Ks = Qs + BR * Smem<F, D>::kLd;              // [kBuffers][BC][ld]
  T* Vs = Ks + kBuffers * kTile;                  // [kBuffers][BC][ld]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const Lanes<F, D> ln(threadIdx.x);
  const int r0 = 16 * MT * warp;  // this warp's first row within the block
  const int64_t i0 = int64_t(blockIdx.x) * BR;
  const int64_t bh = int64_t(blockIdx.z) * gridDim.y + blockIdx.y;
  const int64_t kv = int64_t(blockIdx.z) * (gridDim.y / group) + blockIdx.y / group;
  const T* kh = k + kv * nk * D;
  const T* vh = v + kv * nk * D;

  const int64_t last_row = min(i0 + BR, nq) - 1;
  const int64_t key_end = causal ? min(nk, last_row + (nk - nq) + 1) : nk;  // ≤ 0: sees nothing
  const int n_blocks = key_end > 0 ? int((key_end + BC - 1) / BC) : 0;
  auto load_kv = [&](int jb, int buf) {
    const int64_t j0 = int64_t(jb) * BC;
    const int valid = int(min(int64_t(BC), nk - j0));
    load_tile<BC>(Ks + buf * kTile, kh + j0 * D, valid, ln);
    load_tile<BC>(Vs + buf * kTile, vh + j0 * D, valid, ln);
  };

  load_tile<BR>(Qs, q + (bh * nq + i0) * D, int(min(int64_t(BR), nq - i0)), ln);
  if constexpr (F::kCpAsync) {
    cp_async_commit();
    if (n_blocks > 0) load_kv(0, 0);
    cp_async_commit();
  }

  // Rows g and g + 8 of each of this warp's m-tiles: running max (log2 units) and this lane's
  // part of the sum; O before the division by ℓ, columns 8c + 2t, +1.
  float m[MT][2], l[MT][2], acc[MT][D / 8][4] = {};
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  for (int jb = 0; jb < n_blocks; ++jb) {
    const int64_t j0 = int64_t(jb) * BC;
    int buf = 0;
    if constexpr (F::kOneSync) {
      buf = jb % 2;
      cp_async_wait<0>();  // this thread's copies of block jb (issued one step ago) have landed
      __syncthreads();     // everyone's have, and every warp is done with block jb - 1 and its buffer
      if (jb + 1 < n_blocks) {  // so block jb + 1 may now overwrite that buffer, during this step
        load_kv(jb + 1, buf ^ 1);
        cp_async_commit();
      }
    } else if constexpr (F::kCpAsync) {
      buf = jb % 2;
      if (jb + 1 < n_blocks) {  // the next block streams into the other buffer during this one
        load_kv(jb + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();  // everything but that newest group has landed
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    } else {
      __syncthreads();  // every warp is done with the previous K_j, V_j
      load_kv(jb, 0);
      __syncthreads();
    }
    const T* Kb = Ks + buf * kTile;
    const T* Vb = Vs + buf * kTile;

    // S = Q_i K_jᵀ: per m-tile 16 rows × 64 keys, 8 C tiles of 16×8; k-steps of 16 along d.
    float s[MT][BC / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_a<T, F, D>(a[mt], Qs, r0 + 16 * mt, 16 * kk, lane, ln);
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        uint32_t b[4];
        load_b_rows<T, F, D>(b, Kb, 16 * np, 16 * kk, lane, ln);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Online softmax on the fragments: element e of tile n is row g + 8·(e/2), key 8n + 2t + e%2.
    if constexpr (F::kLean) {
      // Only a block that holds keys past Nk, or keys past this warp's first row's causal limit,
      // needs a mask; the others, most of a long sequence, go straight to the exponent. Indices
      // are relative to the block, so the compares are 32-bit.
      const bool edge = j0 + BC > nk || (causal && j0 + BC - 1 > i0 + r0 + (nk - nq));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (edge) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t row = i0 + r0 + 16 * mt + g + 8 * h;
            const int64_t lim64 = causal ? min(nk, row + (nk - nq) + 1) - j0 : nk - j0;
            const int limit = int(max(int64_t(0), min(int64_t(BC), lim64)));  // keys [0, limit) visible
#pragma unroll
            for (int n = 0; n < BC / 8; ++n)
#pragma unroll
              for (int e = 2 * h; e < 2 * h + 2; ++e)
                if (8 * n + mma::c_elem(lane, e).col >= limit) s[mt][n][e] = -INFINITY;
          }
        }
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;  // in raw score units: the scale is positive, so max commutes
#pragma unroll
          for (int n = 0; n < BC / 8; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
          const float m_new = fmaxf(m[mt][h], group_reduce<4>(mx, MaxOp{}) * scale_log2);
          const float ref = m_new == -INFINITY ? 0.f : m_new;
          alpha[h] = fast_exp2(m[mt][h] - ref);
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < BC / 8; ++n)
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e)  // one FFMA and one MUFU per score
              sum += (s[mt][n][e] = fast_exp2(fmaf(s[mt][n][e], scale_log2, -ref)));
          l[mt][h] = alpha[h] * l[mt][h] + sum;
          m[mt][h] = m_new;
        }
#pragma unroll
        for (int c = 0; c < D / 8; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][c][e] *= alpha[e / 2];
      }
    } else {
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
        load_b_cols<T, F, D>(b, Vb, 16 * kk, 16 * cp, lane, ln);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(acc[mt][2 * cp], a[mt], b[0], b[1]);
          mma_16816<T>(acc[mt][2 * cp + 1], a[mt], b[2], b[3]);
        }
      }
    }
    if constexpr (F::kCpAsync && !F::kOneSync) __syncthreads();  // this buffer is refilled two blocks from now
  }
  if constexpr (F::kCpAsync) cp_async_wait<0>();  // nothing may still be landing at exit

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

template <Version V, class T, int D>
void launch(const AttentionShape& s, const ForwardArgs& a) {
  using F = Features<V, D>;
  constexpr std::size_t bytes =
      std::size_t(F::kRows + 2 * (F::kCpAsync ? 2 : 1) * F::kBc) * Smem<F, D>::kLd * sizeof(T);
  FL_CUDA_CHECK(cudaFuncSetAttribute(mma_kernel<V, T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  const dim3 grid(unsigned(ceil_div<int64_t>(s.seq_q, F::kRows)), unsigned(s.heads), unsigned(s.batch));
  mma_kernel<V, T, D><<<grid, F::kThreads, bytes, as_stream(a.stream)>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.o),
      a.lse, int(s.group()), s.seq_q, s.seq_k, s.softmax_scale() * kLog2e, s.causal);
  FL_CUDA_CHECK_LAUNCH();
}

template <Version V, class T>
void dispatch_dim(const AttentionShape& s, const ForwardArgs& a) {
  switch (s.head_dim) {
    case 64: return launch<V, T, 64>(s, a);
    case 128: return launch<V, T, 128>(s, a);
    default: throw InputError("rung 06_tensor_core_mma (cuda): head_dim " + std::to_string(s.head_dim) +
                              " has no kernel; supported: 64, 128");
  }
}

template <Version V>
void dispatch(const AttentionShape& s, DType t, const ForwardArgs& a) {
  if (t == DType::F16) dispatch_dim<V, __half>(s, a);
  else dispatch_dim<V, __nv_bfloat16>(s, a);
}

}  // namespace

void gpu_forward(Version v, const AttentionShape& s, DType t, const ForwardArgs& a) {
  if (s.heads > 65535 || s.batch > 65535)
    throw InputError("rung 06_tensor_core_mma (cuda): heads and batch must each be at most 65535 (grid y, z)");
  if (!is_aligned(a.q, 16) || !is_aligned(a.k, 16) || !is_aligned(a.v, 16) || !is_aligned(a.o, 16))
    throw InputError("rung 06_tensor_core_mma (cuda): q, k, v and o must be 16-byte aligned (the kernel "
                     "moves them in 16-byte pieces); cudaMalloc and PyTorch allocations are");
  switch (v) {
    case Version::V1Mma: return dispatch<Version::V1Mma>(s, t, a);
    case Version::V2Ldmatrix: return dispatch<Version::V2Ldmatrix>(s, t, a);
    case Version::V3Pipeline: return dispatch<Version::V3Pipeline>(s, t, a);
    case Version::V4Swizzle: return dispatch<Version::V4Swizzle>(s, t, a);
    case Version::V5Lean: return dispatch<Version::V5Lean>(s, t, a);
    case Version::V6Tall: return dispatch<Version::V6Tall>(s, t, a);
    case Version::V7Wide: return dispatch<Version::V7Wide>(s, t, a);
    case Version::V8Hoisted: return dispatch<Version::V8Hoisted>(s, t, a);
    case Version::V9OneSync: return dispatch<Version::V9OneSync>(s, t, a);
  }
}

static const struct RegisterKernels {
  RegisterKernels() {
    for (const VersionInfo& v : kVersions)
      Registry::instance().add(std::make_unique<TensorCoreRung<Backend::Cuda>>(v.name, v.idea, v.version));
  }
} registered;

}  // namespace fl::tensor_core_mma
