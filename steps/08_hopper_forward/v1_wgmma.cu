// Rung 08, v1_wgmma: rung 06's forward with its two products on Hopper's warpgroup MMA.
//
// What changed from rung 06's v9_one_sync: mma.sync is one warp's 16×8×16 product with both
// operands in registers, fed by ldmatrix; `wgmma.mma_async` is one warpgroup's (4 warps', 128
// threads') 64×N×16 product that reads B, and A if asked, from shared memory itself, named by a
// 64-bit matrix descriptor (wgmma.cuh, this rung's: the tile's address, its two strides, its
// swizzle). So:
//   - a thread block is two warpgroups, each owning 64 query rows (B_r = 128), and a K/V block is
//     128 keys (B_c = 128);
//   - S = Q_i K_jᵀ is, per k-step of 16 along d, two wgmma of 64 keys each with both operands in
//     shared memory (Q and K are "K-major": d contiguous). No ldmatrix, no fragments to load;
//   - the accumulator S lands in the warpgroup's registers in mma.sync's C layout, 4 warps × 16
//     rows, so the online softmax is rung 06's, on a thread's two rows of 32 scores each;
//   - O += P V takes P from registers as the A operand (the C-is-A identity of rung 06 holds at
//     warpgroup scale) and V from shared memory read transposed ("MN-major": d contiguous along
//     the N side), one wgmma per k-step of 16 keys and 64 columns of d;
//   - tiles live in shared memory in 64-column panels with the 128-byte swizzle wgmma expects
//     (wgmma.cuh's panel layout, which is rung 06's swz<64> inside each panel), copied by
//     cp.async into two K/V buffers as in v9, with fence.proxy.async so that wgmma, which reads
//     through the async proxy, sees what cp.async wrote.
// wgmma is asynchronous: the warps issue a group of them, commit, and wait for the group before
// they read the accumulators. This version waits at once; overlapping that wait with useful work
// is what the later versions are about.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "block_reduce.cuh"
#include "launch.cuh"

namespace fl::hopper {
namespace {

using namespace fl::mma;  // pack, cp_async_*, fast_exp2, smem_u32
using tensor_core_mma::Tiling;

constexpr Version kVersion = Version::V1Wgmma;

// ---- constants --------------------------------------------------------------------------------

template <int D>
struct Cfg {
  static constexpr Tiling kTiling = tiling(kVersion, D);
  static constexpr int BR = kTiling.rows, BC = kTiling.keys;  // 128 query rows, 128 keys
  static constexpr int kWarpgroups = BR / 64, kThreads = 128 * kWarpgroups;
  static constexpr int P = D / 64;    // 64-column panels of d: O's accumulators, one wgmma N each
  static constexpr int NS = BC / 64;  // 64-key pieces of S, one wgmma N each
  static constexpr uint32_t kTileBytes = BC * D * 2;  // one K or V buffer, 16-bit values
  // Q; K and V twice; 1 KB to start the tiles on a 1024-byte boundary (the swizzle's period).
  static constexpr std::size_t kSmemBytes = std::size_t(BR * D) * 2 + 4 * std::size_t(kTileBytes) + 1024;
  static_assert(BR % 64 == 0 && BC % 64 == 0 && D % 64 == 0, "whole warpgroups and panels");
};

// ---- kernel -----------------------------------------------------------------------------------

template <class T, int D>
__global__ void __launch_bounds__(Cfg<D>::kThreads, 1)
wgmma_kernel(const T* __restrict__ q,  // [B, H, Nq, d]
             const T* __restrict__ k,  // [B, Hkv, Nk, d]
             const T* __restrict__ v,  // [B, Hkv, Nk, d]
             T* __restrict__ o,        // [B, H, Nq, d]
             float* __restrict__ lse,  // [B, H, Nq]
             int group, int64_t nq, int64_t nk, float scale_log2, bool causal) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace fl::wgmma;
  using C = Cfg<D>;
  constexpr int BR = C::BR, BC = C::BC, P = C::P, NS = C::NS;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  const uint32_t qs = base;                        // [BR][D] in panels
  const uint32_t ks = qs + uint32_t(BR * D * 2);   // [2][BC][D]
  const uint32_t vs = ks + 2 * C::kTileBytes;      // [2][BC][D]

  const int wg = threadIdx.x / 128, wr = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const PanelCopy<D, C::kThreads> copy(threadIdx.x);
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
    copy.template load<BC>(ks + buf * C::kTileBytes, kh + j0 * D, valid);
    copy.template load<BC>(vs + buf * C::kTileBytes, vh + j0 * D, valid);
  };

  copy.template load<BR>(qs, q + (bh * nq + i0) * D, int(min(int64_t(BR), nq - i0)));
  cp_async_commit();
  if (n_blocks > 0) load_kv(0, 0);
  cp_async_commit();

  // This thread's two rows in the block, r0 and r0 + 8 (element i of an accumulator: row
  // r0 + 8·((i/2) % 2), column 8·(i/4) + 2t + i%2 of its 64): running max (log2 units) and its
  // part of the sum; O before the division by ℓ, by panel of d.
  const int r0 = 64 * wg + 16 * wr + g;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float acc[P][32] = {};

  for (int jb = 0; jb < n_blocks; ++jb) {
    const int64_t j0 = int64_t(jb) * BC;
    const int buf = jb % 2;
    cp_async_wait<0>();      // this thread's copies of block jb (and of Q) have landed
    fence_shared_to_async();  // ... and are visible to wgmma's reads
    __syncthreads();         // everyone's, and both warpgroups are done with block jb - 1
    if (jb + 1 < n_blocks) {  // so block jb + 1 may overwrite that buffer, during this step
      load_kv(jb + 1, buf ^ 1);
      cp_async_commit();
    }
    const uint32_t kb = ks + buf * C::kTileBytes, vb = vs + buf * C::kTileBytes;

    // S = Q_i K_jᵀ, this warpgroup's 64 rows: k-step kk reads 16 columns of d, 32 bytes into
    // panel kk / 4 of both operands; A = Q rows 64·wg.., B = K rows 64·n.. (1024 bytes per 8 rows).
    float s[NS][32];
    fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int n = 0; n < NS; ++n)
        ss_n64<T, 0, 0>(s[n], desc(qs + (kk / 4) * BR * 128 + 64 * wg * 128 + 32 * (kk % 4), 16, 1024),
                        desc(kb + (kk / 4) * BC * 128 + 64 * n * 128 + 32 * (kk % 4), 16, 1024), kk > 0);
    commit();
    wait<0>();
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

    // The online softmax on the accumulators, rung 06's, on this thread's two rows.
    float alpha[2];
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
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[pc][i] *= alpha[(i / 2) % 2];

    // O += P V: P's C elements of keys 16kk..16kk+15 are, thread for thread, the A operand of
    // k-step kk (mma.sync's A layout, per warp); B = V rows 16kk.. (2048 bytes per 16 rows),
    // panel pc for columns 64·pc.., read transposed (MN-major).
    uint32_t ap[BC / 16][4];
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const float* e = s[kk / 4] + 8 * (kk % 4);
      ap[kk][0] = pack<T>(e[0], e[1]);
      ap[kk][1] = pack<T>(e[2], e[3]);
      ap[kk][2] = pack<T>(e[4], e[5]);
      ap[kk][3] = pack<T>(e[6], e[7]);
    }
    fence();  // the accumulators were rescaled since the last wgmma
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) rs_n64<T, 1>(acc[pc], ap[kk], desc(vb + pc * BC * 128 + kk * 2048, BC * 128, 1024));
    commit();
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(acc[pc]);
  }
  cp_async_wait<0>();  // nothing may still be landing at exit (Q, if the block saw no key)

  // The deferred normalisation, then O in the input type and lse in natural log.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float lsum = group_reduce<4>(l[h], SumOp{});
    const int64_t row = i0 + r0 + 8 * h;
    if (row >= nq) continue;
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
    const dim3 grid(unsigned(ceil_div<int64_t>(s.seq_q, C::BR)), unsigned(s.heads), unsigned(s.batch));
    wgmma_kernel<T, D><<<grid, C::kThreads, C::kSmemBytes, as_stream(a.stream)>>>(
        static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v), static_cast<T*>(a.o),
        a.lse, int(s.group()), s.seq_q, s.seq_k, s.softmax_scale() * kLog2e, s.causal);
    FL_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

static const RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::hopper
