// Rung 08, v2_overlap: v1 with the softmax of block j running while the tensor cores do P·V of
// block j − 1.
//
// What changed from v1: v1 waits for every wgmma group as soon as it is issued, so within a
// warpgroup the tensor cores idle while its softmax runs (the other warpgroup may fill the gap,
// or may be in its own softmax). wgmma is asynchronous, and groups complete in the order they were
// committed, so a warpgroup can keep one group in flight while it computes: each step now issues
// S_j = Q K_jᵀ, then O += P_{j−1} V_{j−1} (P of the block before, kept in registers as A operands),
// waits only for S_j (wait<1>: the older group, S, is done; P·V may still run), does the masks and
// the softmax of block j, and only then waits for P·V before it rescales O by block j's alpha.
// The O it rescales already holds P_{j−1} V_{j−1}, which was computed against block j − 1's max,
// as the online softmax requires. The price: V_{j−1} is read during step j, so K/V get three
// buffers (block j + 1 streams into the one block j − 2 used), and P's A operands stay live across
// the step.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "block_reduce.cuh"
#include "launch.cuh"

namespace fl::hopper {
namespace {

using namespace fl::mma;  // pack, cp_async_*, fast_exp2, smem_u32
using tensor_core_mma::Tiling;

constexpr Version kVersion = Version::V2Overlap;

// ---- constants --------------------------------------------------------------------------------

template <int D>
struct Cfg {
  static constexpr Tiling kTiling = tiling(kVersion, D);
  static constexpr int BR = kTiling.rows, BC = kTiling.keys;  // 128 query rows, 128 keys
  static constexpr int kWarpgroups = BR / 64, kThreads = 128 * kWarpgroups;
  static constexpr int P = D / 64;    // 64-column panels of d: O's accumulators, one wgmma N each
  static constexpr int NS = BC / 64;  // 64-key pieces of S, one wgmma N each
  static constexpr uint32_t kTileBytes = BC * D * 2;  // one K or V buffer, 16-bit values
  static constexpr int kStages = 3;  // K/V buffers: block j + 1 loads while j − 1's V is still read
  // Q; K and V three times; 1 KB to start the tiles on a 1024-byte boundary (the swizzle's period).
  static constexpr std::size_t kSmemBytes =
      std::size_t(BR * D) * 2 + 2 * kStages * std::size_t(kTileBytes) + 1024;
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
  const uint32_t ks = qs + uint32_t(BR * D * 2);            // [kStages][BC][D]
  const uint32_t vs = ks + C::kStages * C::kTileBytes;      // [kStages][BC][D]

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
  uint32_t ap[BC / 16][4];  // P of the block before, as A operands: read by this step's P·V

  // O += P V for the block whose V is at vb: one group, committed, not waited for.
  auto issue_pv = [&](uint32_t vb) {
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) rs_n64<T, 1>(acc[pc], ap[kk], desc(vb + pc * BC * 128 + kk * 2048, BC * 128, 1024));
    commit();
  };

  for (int jb = 0; jb < n_blocks; ++jb) {
    const int64_t j0 = int64_t(jb) * BC;
    const int buf = jb % C::kStages;
    cp_async_wait<0>();      // this thread's copies of block jb (and of Q) have landed
    fence_shared_to_async();  // ... and are visible to wgmma's reads
    __syncthreads();         // everyone's, and both warpgroups are done with block jb - 2
    if (jb + 1 < n_blocks) {  // so block jb + 1 may overwrite that buffer, during this step
      load_kv(jb + 1, (jb + 1) % C::kStages);
      cp_async_commit();
    }
    const uint32_t kb = ks + buf * C::kTileBytes;

    // S = Q_i K_jᵀ, this warpgroup's 64 rows: k-step kk reads 16 columns of d, 32 bytes into
    // panel kk / 4 of both operands; A = Q rows 64·wg.., B = K rows 64·n.. (1024 bytes per 8 rows).
    // Then P_{j−1} V_{j−1}, while this step's softmax runs.
    float s[NS][32];
    fence();  // O was rescaled and P packed since the last wgmma
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int n = 0; n < NS; ++n)
        ss_n64<T, 0, 0>(s[n], desc(qs + (kk / 4) * BR * 128 + 64 * wg * 128 + 32 * (kk % 4), 16, 1024),
                        desc(kb + (kk / 4) * BC * 128 + 64 * n * 128 + 32 * (kk % 4), 16, 1024), kk > 0);
    commit();
    if (jb > 0) {
      issue_pv(vs + ((jb - 1) % C::kStages) * C::kTileBytes);
      wait<1>();  // S is in; P·V of the block before may still be running
    } else {
      wait<0>();
    }
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

    // P_{j−1} V_{j−1} has landed in O: rescale it by this block's alpha, and P_j becomes the A
    // operands of the next step's P·V (the C-is-A identity, per warp).
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(acc[pc]);
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
  }
  if (n_blocks > 0) {  // the last block's P·V
    fence();
    issue_pv(vs + ((n_blocks - 1) % C::kStages) * C::kTileBytes);
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
