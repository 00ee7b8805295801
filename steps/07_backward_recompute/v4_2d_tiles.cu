// Rung 07, v4_2d_tiles: v3's step with each product given its own warp layout.
//
// What changed from v3: v1-v3 give warp w 16 keys for everything, which makes each warp read all
// of Q_i and dO_i twice per step (once for Sᵀ, dPᵀ and once, transposed, for dK, dV): an ldmatrix
// of Q or dO feeds 2 mma, and the shared-memory pipe, not the tensor cores, sets the pace. Here,
// as in FlashAttention-2, the 8 warps form a grid of their own for each product (4 × 2 for Sᵀ,
// dPᵀ and for dV, dK; 2 × 4 for dQ), so every ldmatrix feeds more mma:
//
//   Sᵀ, dPᵀ:  warp (w % 4, w / 4) computes keys 32·(w % 4).. +31 × query rows (BR/2)·(w / 4)..
//             Pᵀ and dSᵀ go to shared memory, 16 bits, key-major.
//   dV, dK:   warp (w % 4, w / 4) owns keys 32·(w % 4).. +31 × columns (D/2)·(w / 4).. of dV_j and
//             dK_j; A = Pᵀ (dSᵀ) from shared memory, B = dO_i (Q_i) transposed.
//   dQ:       warp (w % 2, w / 2) takes query rows (BR/2)·(w % 2).. × columns (D/4)·(w / 2)..;
//             A = dS read from dSᵀ transposed, B = K_j transposed; float2 atomics as before.
//
// The price is Pᵀ through shared memory (one more 16-bit store per element) and a larger tile
// there. The step's prologue (the walk, the tile loads, the prefetch) is backward_mma.cuh's
// BlockTiles, which rung 09's kernels share.
#include "backward_mma.cuh"

namespace fl::backward {
namespace {

using namespace tc;  // kLog2e, StepWalk, StepMask, BlockTiles, atomic_add2, with_row_check, run_kernels

constexpr Version kVersion = Version::V4Tiles2d;

// ---- constants --------------------------------------------------------------------------------

// 8 warps; B_c = 128 keys; B_r = 128 query rows per step at d = 64 and 64 at d = 128 (registers).
template <int D>
struct Cfg {
  static constexpr int kThreads = 256, BC = 128, BR = D == 64 ? 128 : 64;
  static constexpr int kSM = 2, kSN = BR / 16;    // Sᵀ, dPᵀ: m16 tiles (keys), n8 tiles (query rows)
  static constexpr int kKM = 2, kKN = D / 16;     // dV, dK: m16 tiles (keys), n8 tiles (columns)
  static constexpr int kQM = BR / 32, kQN = D / 32;  // dQ: m16 tiles (query rows), n8 tiles (columns)
  static constexpr std::size_t kSmemBytes =
      std::size_t(2 * BC * D + 4 * BR * D + 2 * BC * BR) * 2 + 4 * BR * sizeof(float);
  static_assert(BC == info(kVersion).block_keys, "the twin's B_c is the kernel's");
};

// ---- kernel -----------------------------------------------------------------------------------

template <class T, int D>
__global__ void __launch_bounds__(Cfg<D>::kThreads, 1)
backward_mma_2d_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Dsum,
                       float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int heads, int group,
                       int64_t nq, int64_t nk, float scale_log2, float scale, bool causal) {
  using C = Cfg<D>;
  constexpr int BC = C::BC, BR = C::BR, kThreads = C::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // 128: LaneRow's XOR needs it
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [BC][D]
  T* Vs = Ks + BC * D;                      // [BC][D]
  T* Qs = Vs + BC * D;                      // [2][BR][D]
  T* dOs = Qs + 2 * BR * D;                 // [2][BR][D]
  T* Ps = dOs + 2 * BR * D;                 // [BC][BR]  Pᵀ of the step
  T* dSs = Ps + BC * BR;                    // [BC][BR]  dSᵀ of the step
  float* Ls = reinterpret_cast<float*>(dSs + BC * BR);  // [2][BR]
  float* Ds = Ls + 2 * BR;                               // [2][BR]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const TileCopy<D, kThreads> copy(threadIdx.x);
  const uint32_t ks = smem_u32(Ks), vs = smem_u32(Vs), ps = smem_u32(Ps), ds_s = smem_u32(dSs);
  const int key0 = 32 * (warp % 4);              // Sᵀ, dPᵀ, dV, dK: the warp's 32 keys
  const int sq0 = (BR / 2) * (warp / 4);         // Sᵀ, dPᵀ: the warp's query rows
  const int kc0 = (D / 2) * (warp / 4);          // dV, dK: the warp's columns
  const int qq0 = (BR / 2) * (warp % 2), qc0 = (D / 4) * (warp / 2);  // dQ: rows, columns
  // The lane's ldmatrix patterns (swizzle.hpp), one per operand; each load adds the warp's first
  // row or column (key0, sq0, kc0, qq0, qc0) to its offsets.
  const LaneRow<D> lk = a_pattern<D>(lane);    // K_j, V_j: A of Sᵀ, dPᵀ
  const LaneRow<D> lq = b_pattern<D>(lane);    // Q_i, dO_i: B of Sᵀ, dPᵀ
  const LaneRow<BR> lp = a_pattern<BR>(lane);  // Pᵀ, dSᵀ: A of dV, dK
  const LaneRow<D> lt = a_pattern<D>(lane);    // dO_i, Q_i: B of dV, dK
  const LaneRow<BR> lsq = b_pattern<BR>(lane); // dSᵀ: A of dQ
  const LaneRow<D> lkq = a_pattern<D>(lane);   // K_j: B of dQ
  const BlockTiles<BC, BR, T, std::decay_t<decltype(copy)>> tiles(copy, q, dout, lse, Dsum, Qs, dOs, Ls, Ds, heads, group,
                                                                 nq, nk, causal);
  const StepWalk<BR>& walk = tiles.walk;
  const int64_t j0 = walk.j0, kv_row0 = tiles.kv_row0, off = nk - nq;
  const int steps = tiles.steps;
  tiles.load_first(ks, vs, k, v, nk);

  float dk_acc[C::kKM][C::kKN][4] = {}, dv_acc[C::kKM][C::kKN][4] = {};

  int h = 0, ib = walk.rot;
  for (int step = 0; step < steps; ++step) {
    const int ib_next = ib + 1 < walk.n_ib ? ib + 1 : 0, h_next = ib_next == walk.rot ? h + 1 : h;
    const int buf = step & 1;
    cp_async_wait<0>();
    __syncthreads();  // this step's tiles are in, and every warp is done with the last step's
    tiles.prefetch(step, h_next, ib_next, buf);
    const int64_t i0 = walk.i0(ib);
    const uint32_t qb = smem_u32(Qs + buf * BR * D), dob = smem_u32(dOs + buf * BR * D);
    const float* Lb = Ls + buf * BR;
    const float* Db = Ds + buf * BR;

    // Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ, keys key0.. × query rows sq0..: A = K_j (V_j) rows, B =
    // Q_i (dO_i) rows. One product after the other, as FlashAttention-2 does: only one product's
    // fragments are live at a time, 12 registers fewer here (it did not stop ptxas spilling the
    // folded kernel at d = 128: docs/appendix/07_backward_recompute.md, "One register per address").
    float st[C::kSM][C::kSN][4] = {}, dpt[C::kSM][C::kSN][4] = {};
    auto key_by_row = [&](float (&acc)[C::kSM][C::kSN][4], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[C::kSM][4];
#pragma unroll
        for (int m = 0; m < C::kSM; ++m) ldmatrix_x4(a[m], lk.at(a_tile, key0 + 16 * m, 16 * kk));
#pragma unroll
        for (int np = 0; np < C::kSN / 2; ++np) {
          uint32_t bf[4];
          ldmatrix_x4(bf, lq.at(b_tile, sq0 + 16 * np, 16 * kk));
#pragma unroll
          for (int m = 0; m < C::kSM; ++m) {
            mma_16816<T>(acc[m][2 * np], a[m], bf[0], bf[1]);
            mma_16816<T>(acc[m][2 * np + 1], a[m], bf[2], bf[3]);
          }
        }
      }
    };
    key_by_row(st, ks, qb);
    key_by_row(dpt, vs, dob);

    // Pᵀ and dSᵀ in place, then to shared memory. Element e of tile (m, n) is key
    // key0 + 16m + g + 8·(e/2), query row sq0 + 8n + 2t + e%2.
    if (const StepMask mask(j0, i0, nk, off, BC, BR, causal); mask.any()) {
#pragma unroll
      for (int m = 0; m < C::kSM; ++m)
#pragma unroll
        for (int n = 0; n < C::kSN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (mask.masked(key0 + 16 * m + g + 8 * (e / 2), sq0 + 8 * n + 2 * t + e % 2)) st[m][n][e] = -INFINITY;
          }
    }
#pragma unroll
    for (int n = 0; n < C::kSN; ++n) {
      const int c = sq0 + 8 * n + 2 * t;
      const float2 l = *reinterpret_cast<const float2*>(Lb + c);
      const float2 dd = *reinterpret_cast<const float2*>(Db + c);
      const float lx = l.x == -INFINITY ? INFINITY : l.x * kLog2e, ly = l.y == -INFINITY ? INFINITY : l.y * kLog2e;
#pragma unroll
      for (int m = 0; m < C::kSM; ++m) {
        float p[4], s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = fast_exp2(fmaf(st[m][n][e], scale_log2, -(e % 2 ? ly : lx)));
          s[e] = p[e] * (dpt[m][n][e] - (e % 2 ? dd.y : dd.x));
        }
        const int r = key0 + 16 * m + g;
        *reinterpret_cast<uint32_t*>(Ps + swz<BR>(r, c)) = pack<T>(p[0], p[1]);
        *reinterpret_cast<uint32_t*>(Ps + swz<BR>(r + 8, c)) = pack<T>(p[2], p[3]);
        *reinterpret_cast<uint32_t*>(dSs + swz<BR>(r, c)) = pack<T>(s[0], s[1]);
        *reinterpret_cast<uint32_t*>(dSs + swz<BR>(r + 8, c)) = pack<T>(s[2], s[3]);
      }
    }
    __syncthreads();  // all of Pᵀ and dSᵀ are in shared memory

    // dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i for keys key0.. × columns kc0..; k-steps over the BR rows.
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      uint32_t ap[C::kKM][4], as[C::kKM][4];
#pragma unroll
      for (int m = 0; m < C::kKM; ++m) {
        ldmatrix_x4(ap[m], lp.at(ps, key0 + 16 * m, 16 * kk));
        ldmatrix_x4(as[m], lp.at(ds_s, key0 + 16 * m, 16 * kk));
      }
#pragma unroll
      for (int cp = 0; cp < C::kKN / 2; ++cp) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, lt.at(dob, 16 * kk, kc0 + 16 * cp));
        ldmatrix_x4_trans(bq, lt.at(qb, 16 * kk, kc0 + 16 * cp));
#pragma unroll
        for (int m = 0; m < C::kKM; ++m) {
          mma_16816<T>(dv_acc[m][2 * cp], ap[m], bo[0], bo[1]);
          mma_16816<T>(dv_acc[m][2 * cp + 1], ap[m], bo[2], bo[3]);
          mma_16816<T>(dk_acc[m][2 * cp], as[m], bq[0], bq[1]);
          mma_16816<T>(dk_acc[m][2 * cp + 1], as[m], bq[2], bq[3]);
        }
      }
    }

    // dQ_i += dS K_j for query rows qq0.. × columns qc0..; k-steps over the BC keys. A(m, k) =
    // dSᵀ[k][m], read transposed; B(k, n) = K[k][n], also transposed. Rows past Nq add nothing.
    {
      float dq[C::kQM][C::kQN][4] = {};
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        uint32_t a[C::kQM][4];
#pragma unroll
        for (int m = 0; m < C::kQM; ++m) ldmatrix_x4_trans(a[m], lsq.at(ds_s, 16 * kk, qq0 + 16 * m));
#pragma unroll
        for (int cp = 0; cp < C::kQN / 2; ++cp) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, lkq.at(ks, 16 * kk, qc0 + 16 * cp));
#pragma unroll
          for (int m = 0; m < C::kQM; ++m) {
            mma_16816<T>(dq[m][2 * cp], a[m], bk[0], bk[1]);
            mma_16816<T>(dq[m][2 * cp + 1], a[m], bk[2], bk[3]);
          }
        }
      }
      float* dst = dq_acc + (tiles.q_row0(h, ib) + qq0 + g) * D + qc0 + 2 * t;
      with_row_check(i0 + BR <= nq, nq, [&](auto in_range) {
#pragma unroll
        for (int m = 0; m < C::kQM; ++m) {
          const int64_t row = i0 + qq0 + 16 * m + g;
#pragma unroll
          for (int n = 0; n < C::kQN; ++n) {
            if (in_range(row)) atomic_add2(dst + 16 * m * D + 8 * n, dq[m][n][0], dq[m][n][1]);
            if (in_range(row + 8)) atomic_add2(dst + (16 * m + 8) * D + 8 * n, dq[m][n][2], dq[m][n][3]);
          }
        }
      });
    }
    h = h_next, ib = ib_next;
  }
  cp_async_wait<0>();  // K/V may still be landing if this block had no step

  // dK_j = scale · Σ dSᵀ Q and dV_j of the warp's keys and columns, rounded once, for the keys that exist.
#pragma unroll
  for (int m = 0; m < C::kKM; ++m)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t key = j0 + key0 + 16 * m + g + 8 * hh;
      if (key >= nk) continue;
#pragma unroll
      for (int n = 0; n < C::kKN; ++n) {
        const int64_t at = (kv_row0 + key) * D + kc0 + 8 * n + 2 * t;
        *reinterpret_cast<uint32_t*>(dk + at) = pack<T>(scale * dk_acc[m][n][2 * hh], scale * dk_acc[m][n][2 * hh + 1]);
        *reinterpret_cast<uint32_t*>(dv + at) = pack<T>(dv_acc[m][n][2 * hh], dv_acc[m][n][2 * hh + 1]);
      }
    }
}

// ---- launcher ---------------------------------------------------------------------------------

struct Launch {
  template <class T, int D>
  static void run(Version, const AttentionShape& s, const BackwardArgs& a) {
    run_kernels<T, D>(s, a, backward_mma_2d_kernel<T, D>, Cfg<D>::kThreads, Cfg<D>::BC, Cfg<D>::kSmemBytes);
  }
};

}  // namespace

static const tc::RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::backward
