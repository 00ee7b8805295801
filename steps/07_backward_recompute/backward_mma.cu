// Rung 07, GPU: the backward pass on the tensor cores, fp16/bf16 in, fp32 accumulation.
//
// The structure is backward_recompute.cu's: one thread block per (K/V block j, key/value head,
// batch) keeps K_j and V_j in shared memory and dK_j, dV_j in registers while every Q block of the
// group's query heads passes by, and dQ is added to device memory with atomics. What changes is
// that the five products of a step are mma.sync instructions (rung 06's mma_sync.cuh), and that
// the work is split so that as little as possible leaves registers:
//
//   Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ are computed transposed, so warp w owns keys 16w..16w+15 of
//   the block (8 warps, 128 keys, in the default variant) of both as C fragments. Pᵀ and dSᵀ, formed in place, are then in the A layout of
//   dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i (the C-is-A trick of rung 06, on the key side): P never
//   touches shared memory, and dK_j, dV_j of the warp's 16 keys accumulate in its registers.
//
//   dQ_i += dS K_j needs dS by query rows, which the warps hold in pieces: dSᵀ goes to shared
//   memory once (16 bits), and warp w multiplies query rows 16·(w mod 4)..+15 of it (with 8 warps,
//   for half of d's columns) by K_j, reading it back with ldmatrix.trans, and adds the result to
//   an fp32 accumulator with float2 atomics.
//
// Three kernels: `preprocess_mma_kernel` (D = rowsum(dO ∘ O), and zeroes the accumulator), the
// main kernel, and `convert_dq_kernel` (dQ = scale · accumulator, in the dtype). The main kernel is
// `backward_mma_kernel` as described here, `backward_mma_2d_kernel` (below), which gives each
// product its own warp layout, or, on Hopper, `backward_wgmma_kernel` (below), the 2D kernel's
// step on warpgroup MMA; the default is the fastest the GPU can run (dispatch_variant).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <type_traits>

#include "../06_tensor_core_mma/mma_sync.cuh"
#include "../06_tensor_core_mma/swizzle.cuh"
#include "backward_recompute.hpp"
#include "block_reduce.cuh"
#include "cuda_check.cuh"
#include "wgmma.cuh"

namespace fl::backward {
namespace {

using namespace fl::mma;  // pack, mma_16816, ldmatrix_x4(_trans), cp_async_*, fast_exp2, swz, LaneRow, TileCopy

constexpr float kLog2e = 1.4426950408889634f;
constexpr int BR = 64;  // query rows per step

// How a variant cuts the work: W warps own 16 keys each (B_c = 16·W keys per thread block); for dQ
// the 4 row tiles of a step are shared out, and with 8 warps each takes half of d's columns.
// kKvRegs keeps the warp's K and V A-fragments in registers for the whole block instead of
// reading them from shared memory every step.
// kOneSync gives dSᵀ two buffers and moves step s's dQ product to the start of step s+1, behind
// that step's barrier, so a step has one barrier instead of two.
template <int D, int W, bool KvRegs, int MinBlocks = 1, bool OneSync = false>
struct Cfg {
  static constexpr bool k2D = false;
  static constexpr int kThreads = 32 * W, BC = 16 * W, kMinBlocks = MinBlocks;
  static constexpr bool kKvRegs = KvRegs, kOneSync = OneSync;
  static constexpr int kDsBufs = OneSync ? 2 : 1;
  static constexpr int kColSplit = W / 4;           // warps per dQ row tile
  static constexpr int kDqCols = D / kColSplit;     // dQ columns per warp
  static constexpr int kDqChunk = kDqCols < 64 ? kDqCols : 64;  // columns per pass (registers)
  static constexpr std::size_t kSmemBytes =
      std::size_t(2 * BC * D + 4 * BR * D + kDsBufs * BC * BR) * 2 + 4 * BR * sizeof(float);
  static_assert(W == 4 || W == 8, "4 or 8 warps");
};

// Two adjacent floats added to device memory: one red.global.add.v2.f32 on Hopper, two before.
__device__ __forceinline__ void atomic_add2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// Calls body(in_range) once, for the dQ atomics of a Q block: in_range(r) is r < Nq for a ragged
// last block and a constant true for a whole one, so that ptxas compiles the whole-block case, the
// common one, as a run of atomics with no condition. A condition around each atomic costs the warp
// a branch and a reconvergence and, as ptxas compiled `whole || row < nq`, the address worked out
// again for every atomic (docs/07, "One register per address").
template <class Body>
__device__ __forceinline__ void with_row_check(bool whole, int64_t nq, Body body) {
  if (whole) body([](int64_t) { return true; });
  else body([nq](int64_t r) { return r < nq; });
}

// D_r = Σ_c dO_rc · O_rc in fp32, D/8 lanes per row (one 16-byte chunk each), and the row's dQ
// accumulator set to zero.
template <class T, int D>
__global__ void preprocess_mma_kernel(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ Dsum,
                                      float* __restrict__ dq_acc, int64_t rows) {
  constexpr int kLanes = D / 8;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = tid / kLanes;
  const int col = 8 * int(tid % kLanes);
  const bool in = row < rows;
  float acc = 0.f;
  if (in) {
    const uint4 a = *reinterpret_cast<const uint4*>(o + row * D + col);
    const uint4 b = *reinterpret_cast<const uint4*>(dout + row * D + col);
    const T* x = reinterpret_cast<const T*>(&a);
    const T* y = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += float(x[i]) * float(y[i]);
    float4* z = reinterpret_cast<float4*>(dq_acc + row * D + col);
    z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  acc = group_reduce<kLanes>(acc, SumOp{});  // every lane of the warp takes part
  if (in && col == 0) Dsum[row] = acc;
}

// The steps of the thread block of K/V block jb: every (query head of the group, Q block that sees
// a key of the block). A step is (h, ib): query head h of the group, Q block ib0 + ib; the kernels
// walk them with a counter pair, so that no step needs an integer division. Each K/V block starts
// its walk over the Q blocks at a different one (block j at j mod n_ib, and round from there), so
// that the blocks running at the same time add into different rows of dQ.
template <int BR>
struct StepWalk {
  int64_t j0;           // the block's first key
  int ib0, n_ib, rot;   // first Q block, how many, where the walk starts
  __device__ StepWalk(unsigned jb, int BC, int64_t nq, int64_t nk, bool causal) : j0(int64_t(jb) * BC) {
    const int64_t off = nk - nq;  // row i sees keys ≤ i + off (causal, aligned bottom-right)
    const int64_t first_row = causal ? std::max(int64_t(0), j0 - off) : 0;
    ib0 = int(first_row / BR);
    n_ib = first_row < nq ? int(ceil_div<int64_t>(nq, BR)) - ib0 : 0;
    rot = n_ib > 0 ? int(jb % unsigned(n_ib)) : 0;
  }
  __device__ int64_t i0(int ib) const { return int64_t(ib0 + ib) * BR; }  // the Q block's first row
};

// Which (key, query row) pairs of a step are masked, in 32-bit offsets within its tiles: key kb of
// the K/V block (0..BC-1) and row rb of the Q block (0..BR-1) are masked when the key is past Nk
// or, causal, past the row's limit (key > row + Nk − Nq): kb ≥ keys, or kb − rb > diag with
// diag = i0 + off − j0 clamped to [−BR, BC] (past either end all pairs, or none, are masked, as
// without the clamp). 32-bit compares of a few registers, where 64-bit keys and rows cost two
// compares each and registers the 2D kernel does not have to spare.
struct StepMask {
  int keys, diag, bc;
  __device__ StepMask(int64_t j0, int64_t i0, int64_t nk, int64_t off, int BC, int BR, bool causal)
      : keys(int(std::min<int64_t>(nk - j0, BC))),
        diag(causal ? int(std::clamp<int64_t>(i0 + off - j0, -BR, BC)) : BC), bc(BC) {}
  __device__ bool any() const { return keys < bc || diag < bc - 1; }  // is any pair of the step masked?
  __device__ bool masked(int kb, int rb) const { return kb >= keys || kb - rb > diag; }
};

// One step's tiles by cp.async: rows row0.. (of [B·H·Nq]) of Q and dO, `valid` of them real, and
// their L and D. L and D too go by cp.async, so no thread waits for them mid-step. Padding rows get
// L = D = 0: their Q and dO rows are zeros, so their P = 1 meets dP = D = 0 and dO = 0 and adds
// nothing.
template <int BR, class T, class Copy>
__device__ __forceinline__ void load_q_block(const Copy& copy, T* Qs, T* dOs, float* Ls, float* Ds, const T* q,
                                             const T* dout, const float* lse, const float* Dsum, int64_t row0,
                                             int valid) {
  constexpr int D = Copy::kChunks * 8;
  copy.template load<BR>(smem_u32(Qs), q + row0 * D, valid);
  copy.template load<BR>(smem_u32(dOs), dout + row0 * D, valid);
  for (int r = threadIdx.x; r < BR; r += int(blockDim.x)) {
    cp_async_4(Ls + r, lse + row0 + (r < valid ? r : 0), r < valid);
    cp_async_4(Ds + r, Dsum + row0 + (r < valid ? r : 0), r < valid);
  }
}

// A thread block's K/V block (blockIdx: the block, its K/V head, the batch), its walk over the
// steps, where a step's query rows start, and the cp.async loads of its tiles: the prologue the 2D
// and wgmma kernels share. Q, dO, L and D have two buffers (buffer buf at Qs + buf·BR·D, ...).
template <int BC, int BR, class T, class Copy>
struct BlockTiles {
  static constexpr int D = Copy::kChunks * 8;
  const Copy& copy;
  const T *q, *dout;
  const float *lse, *Dsum;
  T *Qs, *dOs;
  float *Ls, *Ds;
  StepWalk<BR> walk;
  int64_t kv_row0, q_head0, nq;  // the K/V head's first row in [B·Hkv·Nk], the group's first query head's in [B·H·Nq]
  int steps;                     // query heads of the group × Q blocks that see a key of the block
  __device__ BlockTiles(const Copy& copy, const T* q, const T* dout, const float* lse, const float* Dsum, T* Qs, T* dOs,
                        float* Ls, float* Ds, int heads, int group, int64_t nq, int64_t nk, bool causal)
      : copy(copy), q(q), dout(dout), lse(lse), Dsum(Dsum), Qs(Qs), dOs(dOs), Ls(Ls), Ds(Ds),
        walk(blockIdx.x, BC, nq, nk, causal), kv_row0((int64_t(blockIdx.z) * (heads / group) + blockIdx.y) * nk),
        q_head0((int64_t(blockIdx.z) * heads + int64_t(blockIdx.y) * group) * nq), nq(nq), steps(group * walk.n_ib) {}
  // The first row of step (h, ib)'s Q block in [B·H·Nq].
  __device__ int64_t q_row0(int h, int ib) const { return q_head0 + h * nq + walk.i0(ib); }
  __device__ void load_step(int h, int ib, int buf) const {
    load_q_block<BR>(copy, Qs + buf * BR * D, dOs + buf * BR * D, Ls + buf * BR, Ds + buf * BR, q, dout, lse, Dsum,
                     q_row0(h, ib), int(std::min(int64_t(BR), nq - walk.i0(ib))));
  }
  // Step `step`'s tiles are in (buffer buf) and every thread is past the barrier: the next step's
  // start to load into the other buffer.
  __device__ void prefetch(int step, int h_next, int ib_next, int buf) const {
    if (step + 1 < steps) {
      load_step(h_next, ib_next, buf ^ 1);
      cp_async_commit();
    }
  }
  // K_j and V_j, and the first step's tiles into buffer 0: one cp.async group, committed.
  __device__ void load_first(uint32_t ks, uint32_t vs, const T* k, const T* v, int64_t nk) const {
    const int64_t j0 = walk.j0;
    copy.template load<BC>(ks, k + (kv_row0 + j0) * D, int(std::min(int64_t(BC), nk - j0)));
    copy.template load<BC>(vs, v + (kv_row0 + j0) * D, int(std::min(int64_t(BC), nk - j0)));
    if (steps > 0) load_step(0, walk.rot, 0);
    cp_async_commit();
  }
};

template <class T, int D, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
backward_mma_kernel(const T* __restrict__ q, const T* __restrict__ k,     // [B,H,Nq,d], [B,Hkv,Nk,d]
                    const T* __restrict__ v, const T* __restrict__ dout,  // [B,Hkv,Nk,d], [B,H,Nq,d]
                    const float* __restrict__ lse, const float* __restrict__ Dsum,  // [B,H,Nq] each
                    float* __restrict__ dq_acc,  // [B,H,Nq,d] fp32, zeroed, added to atomically, unscaled
                    T* __restrict__ dk, T* __restrict__ dv,  // [B,Hkv,Nk,d]
                    int heads, int group, int64_t nq, int64_t nk, float scale_log2, float scale, bool causal) {
  constexpr int BC = C::BC, kThreads = C::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // 128: LaneRow's XOR needs it
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [BC][D]
  T* Vs = Ks + BC * D;                      // [BC][D]
  T* Qs = Vs + BC * D;                      // [2][BR][D]  two buffers: step s+1 loads during step s
  T* dOs = Qs + 2 * BR * D;                 // [2][BR][D]
  T* dSs = dOs + 2 * BR * D;                // [kDsBufs][BC][BR]  dSᵀ of the step, for dQ
  float* Ls = reinterpret_cast<float*>(dSs + C::kDsBufs * BC * BR);  // [2][BR] L, natural log
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
  int prev_h = 0, prev_ib = 0;  // kOneSync: the step whose dQ is still to add
  for (int step = 0; step < steps; ++step) {
    const int ib_next = ib + 1 < n_ib ? ib + 1 : 0, h_next = ib_next == rot ? h + 1 : h;
    const int buf = step & 1;
    cp_async_wait<0>();
    __syncthreads();  // this step's tiles are in for every thread, and every warp is past the last step
    if (step + 1 < steps) {
      load_step(h_next, ib_next, buf ^ 1);
      cp_async_commit();
    }
    // kOneSync: the last step's dSᵀ is complete behind the barrier above, in the other buffer.
    if constexpr (C::kOneSync)
      if (step > 0) add_dq(prev_h, prev_ib, ds_s + uint32_t(((step - 1) & 1) * BC * BR * sizeof(T)));
    const int64_t i0 = int64_t(ib0 + ib) * BR;
    T* const ds_w = dSs + (C::kOneSync ? (step & 1) * BC * BR : 0);  // this step's dSᵀ goes here
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
    if constexpr (C::kOneSync) {
      prev_h = h, prev_ib = ib;
    } else {
      __syncthreads();  // all of dSᵀ is in shared memory
      add_dq(h, ib, ds_s);
    }
    h = h_next, ib = ib_next;
  }
  if constexpr (C::kOneSync)
    if (steps > 0) {
      __syncthreads();  // the last step's dSᵀ is complete
      add_dq(prev_h, prev_ib, ds_s + uint32_t(((steps - 1) & 1) * BC * BR * sizeof(T)));
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

// ---------------------------------------------------------------------------------------------
// The 2D-tiled kernel: the same steps, with each product given its own warp layout, as
// FlashAttention-2 does, so that every ldmatrix feeds more mma. The kernel above gives warp w
// 16 keys for everything, which makes each warp read all of Q_i and dO_i twice per step (once
// for Sᵀ, dPᵀ and once, transposed, for dK, dV): an ldmatrix of Q or dO feeds 2 mma, and the
// shared-memory pipe, not the tensor cores, sets the pace (docs/07, "Two-dimensional warp tiles").
// Here the 8 warps form a 4 × 2 grid three times over:
//
//   Sᵀ, dPᵀ:  warp (w % 4, w / 4) computes keys 32·(w % 4).. +31 × query rows (BR/2)·(w / 4)..
//             Pᵀ and dSᵀ go to shared memory, 16 bits, key-major.
//   dV, dK:   warp (w % 4, w / 4) owns keys 32·(w % 4).. +31 × columns (D/2)·(w / 4).. of dV_j and
//             dK_j; A = Pᵀ (dSᵀ) from shared memory, B = dO_i (Q_i) transposed.
//   dQ:       warp (w % 2, w / 2) takes query rows (BR/2)·(w % 2).. × columns (D/4)·(w / 2)..;
//             A = dS read from dSᵀ transposed, B = K_j transposed; float2 atomics as before.
//
// The price is Pᵀ through shared memory (one more 16-bit store per element) and a larger tile
// there. Fold folds each warp's first row or column into its ldmatrix patterns once
// (LaneRow::moved); without it (variant t2d_nofold) every load adds them again. Folding cuts the
// loop's instructions by a sixth, yet at d = 128 ptxas then spills a few registers and the kernel
// runs 1-4 % slower, so the default there is t2d_nofold (docs/07, "One register per address").
template <int D, int BRows, bool Fold = true>
struct Cfg2D {
  static constexpr bool k2D = true, kFold = Fold;
  static constexpr int kThreads = 256, kMinBlocks = 1, BC = 128, BR = BRows;
  static constexpr int kSM = 2, kSN = BR / 16;    // Sᵀ, dPᵀ: m16 tiles (keys), n8 tiles (query rows)
  static constexpr int kKM = 2, kKN = D / 16;     // dV, dK: m16 tiles (keys), n8 tiles (columns)
  static constexpr int kQM = BR / 32, kQN = D / 32;  // dQ: m16 tiles (query rows), n8 tiles (columns)
  static constexpr std::size_t kSmemBytes =
      std::size_t(2 * BC * D + 4 * BR * D + 2 * BC * BR) * 2 + 4 * BR * sizeof(float);
  static_assert(BR == 64 || BR == 128, "query rows per step");
};

template <class T, int D, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
backward_mma_2d_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Dsum,
                       float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int heads, int group,
                       int64_t nq, int64_t nk, float scale_log2, float scale, bool causal) {
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
  // The lane's ldmatrix patterns with the warp's first row or column folded in (LaneRow::moved),
  // one per operand: every load below is then one register, the tile and a constant. Without
  // Fold the patterns stay at (0, 0) and the loads add the warp's offsets (fk, fs, ...) each time.
  constexpr bool F = C::kFold;
  const LaneRow<D> lk = a_pattern<D>(lane).moved(F ? key0 : 0, 0);     // K_j, V_j: A of Sᵀ, dPᵀ
  const LaneRow<D> lq = b_pattern<D>(lane).moved(F ? sq0 : 0, 0);      // Q_i, dO_i: B of Sᵀ, dPᵀ
  const LaneRow<BR> lp = a_pattern<BR>(lane).moved(F ? key0 : 0, 0);   // Pᵀ, dSᵀ: A of dV, dK
  const LaneRow<D> lt = a_pattern<D>(lane).moved(0, F ? kc0 : 0);      // dO_i, Q_i: B of dV, dK
  const LaneRow<BR> lsq = b_pattern<BR>(lane).moved(0, F ? qq0 : 0);   // dSᵀ: A of dQ
  const LaneRow<D> lkq = a_pattern<D>(lane).moved(0, F ? qc0 : 0);     // K_j: B of dQ
  const int fk = F ? 0 : key0, fs = F ? 0 : sq0, fc = F ? 0 : kc0, fq = F ? 0 : qq0, fqc = F ? 0 : qc0;
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
    // folded kernel at d = 128: docs/07, "One register per address").
    float st[C::kSM][C::kSN][4] = {}, dpt[C::kSM][C::kSN][4] = {};
    auto key_by_row = [&](float (&acc)[C::kSM][C::kSN][4], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[C::kSM][4];
#pragma unroll
        for (int m = 0; m < C::kSM; ++m) ldmatrix_x4(a[m], lk.at(a_tile, fk + 16 * m, 16 * kk));
#pragma unroll
        for (int np = 0; np < C::kSN / 2; ++np) {
          uint32_t bf[4];
          ldmatrix_x4(bf, lq.at(b_tile, fs + 16 * np, 16 * kk));
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
        ldmatrix_x4(ap[m], lp.at(ps, fk + 16 * m, 16 * kk));
        ldmatrix_x4(as[m], lp.at(ds_s, fk + 16 * m, 16 * kk));
      }
#pragma unroll
      for (int cp = 0; cp < C::kKN / 2; ++cp) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, lt.at(dob, 16 * kk, fc + 16 * cp));
        ldmatrix_x4_trans(bq, lt.at(qb, 16 * kk, fc + 16 * cp));
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
        for (int m = 0; m < C::kQM; ++m) ldmatrix_x4_trans(a[m], lsq.at(ds_s, 16 * kk, fq + 16 * m));
#pragma unroll
        for (int cp = 0; cp < C::kQN / 2; ++cp) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, lkq.at(ks, 16 * kk, fqc + 16 * cp));
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

// ---------------------------------------------------------------------------------------------
// The warpgroup-MMA kernel (Hopper, sm_90a): the 2D kernel's steps with each product one
// `wgmma` per 16-deep slice instead of a grid of mma.sync, and no ldmatrix at all, since wgmma
// reads its shared-memory operands itself (wgmma.cuh). The 8 warps are two warpgroups; warpgroup
// w owns keys 64w..64w+63 of the block (B_c = 128) for Sᵀ, dPᵀ, dV and dK, as the first kernel's
// warps own 16 keys each, and the C-is-A trick carries over at warpgroup scale:
//
//   Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ   64 keys × 64 query rows each; A = K (V) rows, B = Q (dO) rows,
//                                    both K-major (d contiguous)
//   Pᵀ, dSᵀ in place; dSᵀ → shared memory (16 bits) for dQ
//   dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i  A = Pᵀ (dSᵀ) from registers, B = dO_i (Q_i) MN-major (read
//                                    transposed by the hardware), 64 columns per wgmma
//   dQ_i += dS K_j                   warpgroup w: all 64 rows × columns (D/2)·w..; A = dS, MN-major
//                                    from dSᵀ; B = K_jᵀ, K-major, from a transposed copy of K_j
//                                    made once per thread block; float2 atomics as before
//
// Sᵀ and dPᵀ are issued as two groups and waited for one at a time, so the exponentials of P run
// while the tensor cores compute dPᵀ; dV, dK and dQ are one group behind the barrier for dSᵀ.
template <int D>
struct CfgWg {
  static constexpr int kThreads = 256, kMinBlocks = 1, BC = 128, BR = 64;
  // K, V, Kᵀ; Q, dO twice; dSᵀ; L, D twice; 1 KB to align the tiles to 1024 bytes.
  static constexpr std::size_t kSmemBytes =
      std::size_t(3 * BC * D + 4 * BR * D + BC * BR) * 2 + 4 * BR * sizeof(float) + 1024;
};

template <class T, int D, class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
backward_wgmma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Dsum,
                      float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int heads, int group,
                      int64_t nq, int64_t nk, float scale_log2, float scale, bool causal) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace fl::wgmma;
  constexpr int BC = C::BC, BR = C::BR, kThreads = C::kThreads, P = D / 64;  // P: 64-column panels of d
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // wgmma's 128-byte swizzle repeats every 1024 bytes: every tile starts on such a boundary.
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  T* Ks = reinterpret_cast<T*>(smem_raw + (base - raw));  // [BC][D] in panels
  T* Vs = Ks + BC * D;                                      // [BC][D]
  T* Kt = Vs + BC * D;                                      // [D][BC]  K_jᵀ, B of dQ
  T* Qs = Kt + BC * D;                                      // [2][BR][D]
  T* dOs = Qs + 2 * BR * D;                                 // [2][BR][D]
  T* dSs = dOs + 2 * BR * D;                                // [BC][BR]  dSᵀ of the step
  float* Ls = reinterpret_cast<float*>(dSs + BC * BR);      // [2][BR]
  float* Ds = Ls + 2 * BR;                                  // [2][BR]

  const int wg = threadIdx.x / 128, wr = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const PanelCopy<D, kThreads> copy(threadIdx.x);
  const uint32_t ks = smem_u32(Ks), vs = smem_u32(Vs), kts = smem_u32(Kt), ds_s = smem_u32(dSs);
  const int key0 = 64 * wg + 16 * wr;  // the thread's first key (and +8) in Sᵀ, dPᵀ, dV, dK
  const BlockTiles<BC, BR, T, std::decay_t<decltype(copy)>> tiles(copy, q, dout, lse, Dsum, Qs, dOs, Ls, Ds, heads, group,
                                                                 nq, nk, causal);
  const StepWalk<BR>& walk = tiles.walk;
  const int64_t j0 = walk.j0, kv_row0 = tiles.kv_row0, off = nk - nq;
  const int steps = tiles.steps;
  tiles.load_first(ks, vs, k, v, nk);
  cp_async_wait<0>();
  __syncthreads();
  // K_jᵀ once: element (n, key) of a D × BC panel tile is K[key][n]. Two keys per 32-bit store.
  for (int i = threadIdx.x; i < BC * D / 2; i += kThreads) {
    const int n = i % D, key = 2 * (i / D);
    const T lo = Ks[panel_at<BC>(key, n) / 2], hi = Ks[panel_at<BC>(key + 1, n) / 2];
    *reinterpret_cast<uint32_t*>(reinterpret_cast<unsigned char*>(Kt) + panel_at<D>(n, key)) = pack<T>(lo, hi);
  }

  float dk_acc[P][32] = {}, dv_acc[P][32] = {};  // keys key0 + g (+8) × panel columns 8·(i/4) + 2t + i%2

  int h = 0, ib = walk.rot;
  for (int step = 0; step < steps; ++step) {
    const int ib_next = ib + 1 < walk.n_ib ? ib + 1 : 0, h_next = ib_next == walk.rot ? h + 1 : h;
    const int buf = step & 1;
    cp_async_wait<0>();
    fence_shared_to_async();
    __syncthreads();  // the step's tiles (and Kᵀ) are in, visible to wgmma; the last step is done
    tiles.prefetch(step, h_next, ib_next, buf);
    const int64_t i0 = walk.i0(ib);
    const uint32_t qb = smem_u32(Qs + buf * BR * D), dob = smem_u32(dOs + buf * BR * D);
    const float* Lb = Ls + buf * BR;
    const float* Db = Ds + buf * BR;

    // Sᵀ and dPᵀ: k-step kk reads 16 columns of d, 32 bytes into panel kk / 4 of both operands.
    float st[32], dpt[32];
    fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ss_n64<T, 0, 0>(st, desc(ks + (kk / 4) * BC * 128 + 64 * wg * 128 + 32 * (kk % 4), 16, 1024),
                      desc(qb + (kk / 4) * BR * 128 + 32 * (kk % 4), 16, 1024), kk > 0);
    commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ss_n64<T, 0, 0>(dpt, desc(vs + (kk / 4) * BC * 128 + 64 * wg * 128 + 32 * (kk % 4), 16, 1024),
                      desc(dob + (kk / 4) * BR * 128 + 32 * (kk % 4), 16, 1024), kk > 0);
    commit();
    wait<1>();  // Sᵀ is in; dPᵀ may still be running
    hold(st);

    // Pᵀ in place. Element i is key key0 + g + 8·((i/2) % 2), query row 8·(i/4) + 2t + i%2.
    if (const StepMask mask(j0, i0, nk, off, BC, BR, causal); mask.any()) {
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (mask.masked(key0 + g + 8 * (i / 2 % 2), 8 * (i / 4) + 2 * t + i % 2)) st[i] = -INFINITY;
    }
    float2 dd[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float2 l = *reinterpret_cast<const float2*>(Lb + 8 * n + 2 * t);
      dd[n] = *reinterpret_cast<const float2*>(Db + 8 * n + 2 * t);
      const float lx = l.x == -INFINITY ? INFINITY : l.x * kLog2e, ly = l.y == -INFINITY ? INFINITY : l.y * kLog2e;
#pragma unroll
      for (int e = 0; e < 4; ++e) st[4 * n + e] = fast_exp2(fmaf(st[4 * n + e], scale_log2, -(e % 2 ? ly : lx)));
    }
    wait<0>();  // dPᵀ is in
    hold(dpt);

    // dSᵀ = Pᵀ ∘ (dPᵀ − D); both as A fragments (k-step kk: query rows 16kk..16kk+15), and dSᵀ
    // to shared memory for dQ.
    uint32_t ap[4][4], as[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // n8 tile 2kk + hf
        const int n = 2 * kk + hf;
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] = st[4 * n + e] * (dpt[4 * n + e] - (e % 2 ? dd[n].y : dd[n].x));
        ap[kk][2 * hf] = pack<T>(st[4 * n], st[4 * n + 1]);
        ap[kk][2 * hf + 1] = pack<T>(st[4 * n + 2], st[4 * n + 3]);
        as[kk][2 * hf] = pack<T>(s[0], s[1]);
        as[kk][2 * hf + 1] = pack<T>(s[2], s[3]);
        *reinterpret_cast<uint32_t*>(dSs + swz<BR>(key0 + g, 8 * n + 2 * t)) = as[kk][2 * hf];
        *reinterpret_cast<uint32_t*>(dSs + swz<BR>(key0 + g + 8, 8 * n + 2 * t)) = as[kk][2 * hf + 1];
      }

    // dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i: k-step kk is query rows 16kk.., 2048 bytes into the tile;
    // panel pc of dO_i (Q_i) gives columns 64pc.. .
    fence();
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        rs_n64<T, 1>(dv_acc[pc], ap[kk], desc(dob + pc * BR * 128 + kk * 2048, BR * 128, 1024));
        rs_n64<T, 1>(dk_acc[pc], as[kk], desc(qb + pc * BR * 128 + kk * 2048, BR * 128, 1024));
      }
    commit();
    fence_shared_to_async();
    __syncthreads();  // all of dSᵀ is in shared memory, visible to wgmma

    // dQ_i += dS K_j, warpgroup wg: columns (D/2)·wg..; k-step kk is keys 16kk.. : 2048 bytes
    // into dSᵀ (MN-major A), 32 bytes into panel kk / 4 of Kᵀ (K-major B), whose rows (D/2)·wg..
    // start (D/2)·wg·128 bytes in.
    float dq[D / 4];
    fence();  // dq's registers were read by last step's atomics
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const uint64_t a = desc(ds_s + kk * 2048, BR * 128, 1024);
      const uint64_t bk = desc(kts + (kk / 4) * D * 128 + (D / 2) * wg * 128 + 32 * (kk % 4), 16, 1024);
      if constexpr (D == 128) ss_n64<T, 1, 0>(dq, a, bk, kk > 0);
      else ss_n32<T, 1, 0>(dq, a, bk, kk > 0);
    }
    commit();
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(dv_acc[pc]), hold(dk_acc[pc]);
    hold(dq);
    // Element i of dq: query row 16·wr + g + 8·((i/2) % 2), column (D/2)·wg + 8·(i/4) + 2t + i%2.
    float* dst = dq_acc + (tiles.q_row0(h, ib) + 16 * wr + g) * D + (D / 2) * wg + 2 * t;
    const int64_t row = i0 + 16 * wr + g;
    with_row_check(i0 + BR <= nq, nq, [&](auto in_range) {
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        if (in_range(row)) atomic_add2(dst + 8 * n, dq[4 * n], dq[4 * n + 1]);
        if (in_range(row + 8)) atomic_add2(dst + 8 * D + 8 * n, dq[4 * n + 2], dq[4 * n + 3]);
      }
    });
    h = h_next, ib = ib_next;
  }

  // dK_j = scale · Σ dSᵀ Q and dV_j, rounded once, for the keys that exist.
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int64_t key = j0 + key0 + g + 8 * hh;
    if (key >= nk) continue;
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int64_t at = (kv_row0 + key) * D + 64 * pc + 8 * n + 2 * t;
        *reinterpret_cast<uint32_t*>(dk + at) =
            pack<T>(scale * dk_acc[pc][4 * n + 2 * hh], scale * dk_acc[pc][4 * n + 2 * hh + 1]);
        *reinterpret_cast<uint32_t*>(dv + at) = pack<T>(dv_acc[pc][4 * n + 2 * hh], dv_acc[pc][4 * n + 2 * hh + 1]);
      }
  }
#else
  __trap();  // built without sm_90a: dispatch_variant never launches it (wgmma_here); never silently
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// dQ = scale · accumulator, rounded to T, 8 elements per thread.
template <class T>
__global__ void convert_dq_kernel(const float* __restrict__ acc, T* __restrict__ dq, int64_t n8, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 x = reinterpret_cast<const float4*>(acc)[2 * i], y = reinterpret_cast<const float4*>(acc)[2 * i + 1];
    reinterpret_cast<uint4*>(dq)[i] = uint4{pack<T>(scale * x.x, scale * x.y), pack<T>(scale * x.z, scale * x.w),
                                            pack<T>(scale * y.x, scale * y.y), pack<T>(scale * y.z, scale * y.w)};
  }
}

template <class C>
struct is_wg : std::false_type {};
template <int D>
struct is_wg<CfgWg<D>> : std::true_type {};

template <class T, int D, class C>
void launch(const AttentionShape& s, const BackwardArgs& a) {
  const cudaStream_t stream = as_stream(a.stream);
  unsigned char* ws = static_cast<unsigned char*>(a.workspace);
  float* Dsum = reinterpret_cast<float*>(ws);
  float* acc = reinterpret_cast<float*>(ws + dq_accum_offset(s));
  const int64_t rows = s.batch * s.heads * s.seq_q;
  preprocess_mma_kernel<T, D><<<unsigned(ceil_div<int64_t>(rows * (D / 8), 256)), 256, 0, stream>>>(
      static_cast<const T*>(a.o), static_cast<const T*>(a.dout), Dsum, acc, rows);
  FL_CUDA_CHECK_LAUNCH();

  static_assert(sizeof(T) == 2, "kSmemBytes counts 16-bit tiles");
  constexpr auto kernel = [] {
    if constexpr (is_wg<C>::value) return backward_wgmma_kernel<T, D, C>;
    else if constexpr (C::k2D) return backward_mma_2d_kernel<T, D, C>;
    else return backward_mma_kernel<T, D, C>;
  }();
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
  const dim3 grid(unsigned(ceil_div<int64_t>(s.seq_k, C::BC)), unsigned(s.kv_heads), unsigned(s.batch));
  const float scale = s.softmax_scale();
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
      static_cast<const T*>(a.dout), a.lse, Dsum, acc, static_cast<T*>(a.dk), static_cast<T*>(a.dv), int(s.heads),
      int(s.group()), s.seq_q, s.seq_k, scale * kLog2e, scale, s.causal);
  FL_CUDA_CHECK_LAUNCH();

  const int64_t n8 = s.q_elems() / 8;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div<int64_t>(n8, 256), 132 * 32));
  convert_dq_kernel<T><<<blocks, 256, 0, stream>>>(acc, static_cast<T*>(a.dq), n8, scale);
  FL_CUDA_CHECK_LAUNCH();
}

// The variants measured on the way (docs/07_backward_recompute.md has the numbers). Without
// FL_BACKWARD_VARIANT the fastest for the GPU and head dimension runs: wg on Hopper when the rung
// was built for sm_90a (CMakeLists.txt), else t2d_nofold at d = 128 (see Cfg2D) and w8_kv at
// d = 64; FL_BACKWARD_VARIANT=<name> runs another one, for bench/backward_variants.py. Every
// variant computes the same gradients and passes the same tests.
constexpr const char* kVariants[] = {"w4", "w8", "w4_kv", "w8_kv", "w4_occ", "w8_kv_1s", "t2d", "t2d_nofold", "wg"};
enum Variant { kW4, kW8, kW4Kv, kW8Kv, kW4Occ, kW8Kv1s, kT2d, kT2dNoFold, kWg, kDefault };
static_assert(std::size(kVariants) == kDefault, "a name for every variant, in the enum's order");

// Read at every call (a getenv and a few compares, next to a kernel of milliseconds), so that a
// benchmark can switch variants inside one process and time them all against the same FA2 run.
Variant chosen_variant() {
  const char* e = std::getenv("FL_BACKWARD_VARIANT");
  if (!e || !*e) return kDefault;
  std::string names;
  for (int i = 0; i < int(std::size(kVariants)); ++i) {
    if (std::string(e) == kVariants[i]) return Variant(i);
    names += std::string(i ? ", " : "") + kVariants[i];
  }
  throw InputError(std::string("rung ") + kMmaName + ": FL_BACKWARD_VARIANT=" + e + " is not a variant; there are " + names);
}

// wgmma runs on compute capability 9.0 only (H100, H200), and only if this rung was compiled for
// sm_90a. Asked at every call, like chosen_variant: three attribute queries, no synchronisation.
bool wgmma_here() {
#if defined(FL_HAVE_WGMMA)
  int dev = 0, major = 0, minor = 0;
  FL_CUDA_CHECK(cudaGetDevice(&dev));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

template <class T, int D>
void dispatch_variant(const AttentionShape& s, const BackwardArgs& a) {
  static_assert(Cfg<D, 8, D == 64>::BC == block_keys(DType::F16) && Cfg2D<D, D == 64 ? 128 : 64>::BC == block_keys(DType::F16) &&
                    CfgWg<D>::BC == block_keys(DType::F16),
                "the default variants' B_c is the twin's");
  Variant v = chosen_variant();
  if (v == kDefault) v = wgmma_here() ? kWg : D == 64 ? kW8Kv : kT2dNoFold;
  switch (v) {
    case kW4: return launch<T, D, Cfg<D, 4, false>>(s, a);                        // the first version: 4 warps, 64 keys
    case kW8: return launch<T, D, Cfg<D, 8, false>>(s, a);                        // 8 warps, 128 keys
    case kW4Kv: return launch<T, D, Cfg<D, 4, D == 64>>(s, a);                    // w4, K and V fragments in registers at d = 64
    case kW8Kv: return launch<T, D, Cfg<D, 8, D == 64>>(s, a);                    // both
    case kW4Occ: return launch<T, D, Cfg<D, 4, false, D == 64 ? 3 : 2>>(s, a);   // w4 held to 168 registers at d = 64 (3 blocks per SM)
    case kW8Kv1s: return launch<T, D, Cfg<D, 8, D == 64, 1, true>>(s, a);        // w8_kv with one barrier per step
    case kT2dNoFold: return launch<T, D, Cfg2D<D, D == 64 ? 128 : 64, false>>(s, a);  // t2d without LaneRow::moved
    case kWg:  // two warpgroups, wgmma (Hopper)
      if (!wgmma_here())
        throw InputError(std::string("rung ") + kMmaName + ": FL_BACKWARD_VARIANT=wg needs an sm_90 GPU (H100, H200) and "
                         "this rung built for sm_90a (CMAKE_CUDA_ARCHITECTURES containing 90)");
      return launch<T, D, CfgWg<D>>(s, a);
    default: return launch<T, D, Cfg2D<D, D == 64 ? 128 : 64>>(s, a);           // t2d: 2D warp tiles (B_r = 128 at d = 64)
  }
}

template <class T>
void dispatch_dim(const AttentionShape& s, const BackwardArgs& a) {
  switch (s.head_dim) {
    case 64: return dispatch_variant<T, 64>(s, a);
    case 128: return dispatch_variant<T, 128>(s, a);
    default: throw InputError(std::string("rung ") + kMmaName + " (cuda): head_dim " + std::to_string(s.head_dim) +
                              " has no kernel; supported: 64, 128");
  }
}

}  // namespace

void gpu_backward_mma(const AttentionShape& s, DType t, const BackwardArgs& a) {
  const std::string who = std::string("rung ") + kMmaName + " (cuda): ";
  if (s.kv_heads > 65535 || s.batch > 65535) throw InputError(who + "kv_heads and batch must each be at most 65535");
  for (const void* p : {a.q, a.k, a.v, a.o, a.dout, static_cast<const void*>(a.dq), static_cast<const void*>(a.dk),
                        static_cast<const void*>(a.dv), static_cast<const void*>(a.workspace)})
    if (!is_aligned(p, 16))
      throw InputError(who + "q, k, v, o, dout, dq, dk, dv and the workspace must be 16-byte aligned (the kernels "
                             "move them in 16-byte pieces); cudaMalloc and PyTorch allocations are");
  if (t == DType::F16) dispatch_dim<__half>(s, a);
  else dispatch_dim<__nv_bfloat16>(s, a);
}

static const Register<BackwardRung<Backend::Cuda, Precision::TensorCore>> registered_mma;

}  // namespace fl::backward
