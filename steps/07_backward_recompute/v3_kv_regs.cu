// Rung 07, v3_kv_regs: v2 with the warp's K and V A-fragments held in registers (d = 64).
//
// What changed from v2: every step, each warp read its 16 keys of K_j and V_j from shared memory
// again (the A operands of Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ), though they do not change while
// the Q blocks pass by. Loaded once, at the first step, they stay in registers for the whole
// block: d/16 × 4 registers each, 32 in all at d = 64. At d = 128 the 64 registers do not fit
// beside the accumulators (ptxas spills), so there the kernel is v2's.
#include "backward_mma.cuh"

namespace fl::backward {
namespace {

using namespace tc;  // BR, kLog2e, StepWalk, StepMask, load_q_block, atomic_add2, with_row_check, run_kernels

constexpr Version kVersion = Version::V3KvRegs;

// ---- constants --------------------------------------------------------------------------------

// W warps own 16 keys each (B_c = 16·W keys per thread block). For dQ the 4 row tiles of a step
// are shared out; with 8 warps each takes half of d's columns, at most 64 at a time (registers).
template <int D>
struct Cfg {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps, BC = 16 * kWarps;
  static constexpr bool kKvRegs = D == 64;          // K, V fragments in registers: they fit at d = 64
  static constexpr int kColSplit = kWarps / 4;      // warps per dQ row tile
  static constexpr int kDqCols = D / kColSplit;     // dQ columns per warp
  static constexpr int kDqChunk = kDqCols < 64 ? kDqCols : 64;  // columns per pass (registers)
  static constexpr std::size_t kSmemBytes = std::size_t(2 * BC * D + 4 * BR * D + BC * BR) * 2 + 4 * BR * sizeof(float);
  static_assert(BC == info(kVersion).block_keys, "the twin's B_c is the kernel's");
};

// ---- kernel -----------------------------------------------------------------------------------

template <class T, int D>
__global__ void __launch_bounds__(Cfg<D>::kThreads, 1)
backward_mma_kernel(const T* __restrict__ q, const T* __restrict__ k,     // [B,H,Nq,d], [B,Hkv,Nk,d]
                    const T* __restrict__ v, const T* __restrict__ dout,  // [B,Hkv,Nk,d], [B,H,Nq,d]
                    const float* __restrict__ lse, const float* __restrict__ Dsum,  // [B,H,Nq] each
                    float* __restrict__ dq_acc,  // [B,H,Nq,d] fp32, zeroed, added to atomically, unscaled
                    T* __restrict__ dk, T* __restrict__ dv,  // [B,Hkv,Nk,d]
                    int heads, int group, int64_t nq, int64_t nk, float scale_log2, float scale, bool causal) {
  using C = Cfg<D>;
  constexpr int BC = C::BC, kThreads = C::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // 128: LaneRow's XOR needs it
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [BC][D]
  T* Vs = Ks + BC * D;                      // [BC][D]
  T* Qs = Vs + BC * D;                      // [2][BR][D]  two buffers: step s+1 loads during step s
  T* dOs = Qs + 2 * BR * D;                 // [2][BR][D]
  T* dSs = dOs + 2 * BR * D;                // [BC][BR]  dSᵀ of the step, for dQ
  float* Ls = reinterpret_cast<float*>(dSs + BC * BR);  // [2][BR] L, natural log
  float* Ds = Ls + 2 * BR;                               // [2][BR]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Shared-memory addresses as rung 06's v8 makes them: the lane's part once, here (swizzle.hpp).
  const int kw = 16 * warp;  // the warp's first key of the block, and later its first query row
  const int qr = 16 * (warp % 4), col0 = C::kDqCols * (warp / 4);  // dQ: the warp's rows, columns
  const LaneRow<D> la = a_pattern<D>(lane), lb = b_pattern<D>(lane);
  // The same with the warp's own first row or column folded in (LaneRow::moved): K_j, V_j rows
  // kw.. (A of Sᵀ, dPᵀ); dSᵀ columns qr.. and K_j columns col0.. (A and B of dQ).
  const LaneRow<D> lk = la.moved(kw, 0), lkq = la.moved(0, col0);
  const LaneRow<BR> lsq = b_pattern<BR>(lane).moved(0, qr);
  const TileCopy<D, kThreads> copy(threadIdx.x);
  const uint32_t ks = smem_u32(Ks), vs = smem_u32(Vs), ds_s = smem_u32(dSs);
  const StepWalk<BR> walk(blockIdx.x, BC, nq, nk, causal);
  const int hk = blockIdx.y, b = blockIdx.z, kv_heads = heads / group;
  const int64_t j0 = walk.j0, kv_row0 = (int64_t(b) * kv_heads + hk) * nk, off = nk - nq;
  const int ib0 = walk.ib0, n_ib = walk.n_ib, rot = walk.rot, steps = group * n_ib;
  auto q_row0 = [&](int h, int ib) {  // first row of the step's Q block in [B·H·Nq]
    return (int64_t(b) * heads + hk * group + h) * nq + walk.i0(ib);
  };
  auto load_step = [&](int h, int ib, int buf) {
    load_q_block<BR>(copy, Qs + buf * BR * D, dOs + buf * BR * D, Ls + buf * BR, Ds + buf * BR, q, dout, lse, Dsum,
                     q_row0(h, ib), int(std::min(int64_t(BR), nq - walk.i0(ib))));
  };

  copy.template load<BC>(ks, k + (kv_row0 + j0) * D, int(std::min(int64_t(BC), nk - j0)));
  copy.template load<BC>(vs, v + (kv_row0 + j0) * D, int(std::min(int64_t(BC), nk - j0)));
  if (steps > 0) load_step(0, rot, 0);
  cp_async_commit();

  // dK_j (unscaled) and dV_j of the warp's keys kw + g (+8), columns 8c + 2t (+1).
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  uint32_t kf[C::kKvRegs ? D / 16 : 1][4], vf[C::kKvRegs ? D / 16 : 1][4];  // kKvRegs: A of K_j, V_j

  // dQ_i += dS K_j for step (h, ib), whose dSᵀ is at ds_buf: warp w takes query rows
  // 16·(w % 4).. +15 and, with 8 warps, half of d's columns, a chunk of at most 64 at a time.
  // A(m, k) = dSᵀ[k][m], read with ldmatrix.trans; B(k, n) = K[k][n], also transposed. Rows past
  // Nq add nothing.
  auto add_dq = [&](int h, int ib, uint32_t ds_buf) {
    const int64_t row = walk.i0(ib) + qr + g;
    float* dst = dq_acc + (q_row0(h, ib) + qr + g) * D + col0 + 2 * t;
#pragma unroll
    for (int chunk = 0; chunk < C::kDqCols / C::kDqChunk; ++chunk) {
      constexpr int NT = C::kDqChunk / 8;  // n8 tiles per chunk
      // With few tiles, even and odd k-steps add into separate accumulators, so that consecutive
      // mma do not wait on each other's result.
      constexpr int kSplit = NT < 8 ? 2 : 1;
      float dq[kSplit][NT][4] = {};
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, lsq.at(ds_buf, 16 * kk, 0));
#pragma unroll
        for (int cp = 0; cp < NT / 2; ++cp) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, lkq.at(ks, 16 * kk, C::kDqChunk * chunk + 16 * cp));
          mma_16816<T>(dq[kk % kSplit][2 * cp], a, bk[0], bk[1]);
          mma_16816<T>(dq[kk % kSplit][2 * cp + 1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
          for (int sp = 1; sp < kSplit; ++sp) dq[0][c][e] += dq[sp][c][e];
      with_row_check(walk.i0(ib) + BR <= nq, nq, [&](auto in_range) {
#pragma unroll
        for (int c = 0; c < NT; ++c) {
          if (in_range(row)) atomic_add2(dst + C::kDqChunk * chunk + 8 * c, dq[0][c][0], dq[0][c][1]);
          if (in_range(row + 8)) atomic_add2(dst + 8 * D + C::kDqChunk * chunk + 8 * c, dq[0][c][2], dq[0][c][3]);
        }
      });
    }
  };

  int h = 0, ib = rot;  // this step's
  for (int step = 0; step < steps; ++step) {
    const int ib_next = ib + 1 < n_ib ? ib + 1 : 0, h_next = ib_next == rot ? h + 1 : h;
    const int buf = step & 1;
    cp_async_wait<0>();
    __syncthreads();  // this step's tiles are in for every thread, and every warp is past the last step
    if (step + 1 < steps) {
      load_step(h_next, ib_next, buf ^ 1);
      cp_async_commit();
    }
    const int64_t i0 = int64_t(ib0 + ib) * BR;
    T* const ds_w = dSs;  // this step's dSᵀ goes here
    const uint32_t qb = smem_u32(Qs + buf * BR * D), dob = smem_u32(dOs + buf * BR * D);
    const float* Lb = Ls + buf * BR;
    const float* Db = Ds + buf * BR;
    if constexpr (C::kKvRegs) {
      if (step == 0) {  // K_j, V_j have landed: their A fragments stay in registers from here on
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          ldmatrix_x4(kf[kk], lk.at(ks, 0, 16 * kk));
          ldmatrix_x4(vf[kk], lk.at(vs, 0, 16 * kk));
        }
      }
    }

    // Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ: 16 keys × 64 query rows each, 8 C tiles; k-steps along d.
    float st[BR / 8][4] = {}, dpt[BR / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      if constexpr (C::kKvRegs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) ak[i] = kf[kk][i], av[i] = vf[kk][i];
      } else {
        ldmatrix_x4(ak, lk.at(ks, 0, 16 * kk));
        ldmatrix_x4(av, lk.at(vs, 0, 16 * kk));
      }
#pragma unroll
      for (int np = 0; np < BR / 16; ++np) {  // B(k, n) = Q[n][k]: rows of Q are columns of B
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, lb.at(qb, 16 * np, 16 * kk));
        ldmatrix_x4(bo, lb.at(dob, 16 * np, 16 * kk));
        mma_16816<T>(st[2 * np], ak, bq[0], bq[1]);
        mma_16816<T>(st[2 * np + 1], ak, bq[2], bq[3]);
        mma_16816<T>(dpt[2 * np], av, bo[0], bo[1]);
        mma_16816<T>(dpt[2 * np + 1], av, bo[2], bo[3]);
      }
    }

    // Pᵀ = 2^(Sᵀ·scale·log2 e − L·log2 e) and dSᵀ = Pᵀ ∘ (dPᵀ − D), in place. Element e of tile n
    // is key kw + g + 8·(e/2), query row 8n + 2t + e%2. Only a block with keys past Nk or keys
    // past some row's causal limit is masked.
    if (const StepMask mask(j0, i0, nk, off, BC, BR, causal); mask.any()) {
#pragma unroll
      for (int n = 0; n < BR / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (mask.masked(kw + g + 8 * (e / 2), 8 * n + 2 * t + e % 2)) st[n][e] = -INFINITY;
        }
    }
#pragma unroll
    for (int n = 0; n < BR / 8; ++n) {
      const float2 l = *reinterpret_cast<const float2*>(Lb + 8 * n + 2 * t);
      const float2 dd = *reinterpret_cast<const float2*>(Db + 8 * n + 2 * t);
      // L in log2 units; a row that saw no key (L = −∞) gets +∞, so its P is 0, not 2^(−∞+∞).
      const float lx = l.x == -INFINITY ? INFINITY : l.x * kLog2e, ly = l.y == -INFINITY ? INFINITY : l.y * kLog2e;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = fast_exp2(fmaf(st[n][e], scale_log2, -(e % 2 ? ly : lx)));
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - (e % 2 ? dd.y : dd.x));
      }
    }

    // dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i: C tiles 2kk and 2kk+1 of Pᵀ (dSᵀ) are the A tile of
    // k-step kk (16 query rows); B(k, n) = dO[k][n], read transposed. dSᵀ also goes to shared
    // memory, 16 bits, for dQ.
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      uint32_t ap[4], as[4];
      ap[0] = pack<T>(st[2 * kk][0], st[2 * kk][1]);
      ap[1] = pack<T>(st[2 * kk][2], st[2 * kk][3]);
      ap[2] = pack<T>(st[2 * kk + 1][0], st[2 * kk + 1][1]);
      ap[3] = pack<T>(st[2 * kk + 1][2], st[2 * kk + 1][3]);
      as[0] = pack<T>(dpt[2 * kk][0], dpt[2 * kk][1]);
      as[1] = pack<T>(dpt[2 * kk][2], dpt[2 * kk][3]);
      as[2] = pack<T>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
      as[3] = pack<T>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
      *reinterpret_cast<uint32_t*>(ds_w + swz<BR>(kw + g, 16 * kk + 2 * t)) = as[0];
      *reinterpret_cast<uint32_t*>(ds_w + swz<BR>(kw + g + 8, 16 * kk + 2 * t)) = as[1];
      *reinterpret_cast<uint32_t*>(ds_w + swz<BR>(kw + g, 16 * kk + 8 + 2 * t)) = as[2];
      *reinterpret_cast<uint32_t*>(ds_w + swz<BR>(kw + g + 8, 16 * kk + 8 + 2 * t)) = as[3];
#pragma unroll
      for (int cp = 0; cp < D / 16; ++cp) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, la.at(dob, 16 * kk, 16 * cp));
        ldmatrix_x4_trans(bq, la.at(qb, 16 * kk, 16 * cp));
        mma_16816<T>(dv_acc[2 * cp], ap, bo[0], bo[1]);
        mma_16816<T>(dv_acc[2 * cp + 1], ap, bo[2], bo[3]);
        mma_16816<T>(dk_acc[2 * cp], as, bq[0], bq[1]);
        mma_16816<T>(dk_acc[2 * cp + 1], as, bq[2], bq[3]);
      }
    }
    __syncthreads();  // all of dSᵀ is in shared memory
    add_dq(h, ib, ds_s);
    h = h_next, ib = ib_next;
  }
  cp_async_wait<0>();  // K/V may still be landing if this block had no step

  // dK_j = scale · Σ dSᵀ Q and dV_j, rounded once, for the keys that exist.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t key = j0 + kw + g + 8 * h;
    if (key >= nk) continue;
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      const int64_t at = (kv_row0 + key) * D + 8 * c + 2 * t;
      *reinterpret_cast<uint32_t*>(dk + at) = pack<T>(scale * dk_acc[c][2 * h], scale * dk_acc[c][2 * h + 1]);
      *reinterpret_cast<uint32_t*>(dv + at) = pack<T>(dv_acc[c][2 * h], dv_acc[c][2 * h + 1]);
    }
  }
}

// ---- launcher ---------------------------------------------------------------------------------

struct Launch {
  template <class T, int D>
  static void run(Version, const AttentionShape& s, const BackwardArgs& a) {
    run_kernels<T, D>(s, a, backward_mma_kernel<T, D>, Cfg<D>::kThreads, Cfg<D>::BC, Cfg<D>::kSmemBytes);
  }
};

}  // namespace

static const tc::RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::backward
