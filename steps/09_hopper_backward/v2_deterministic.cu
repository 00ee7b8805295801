// Rung 09, v2_deterministic: v1 with a deterministic mode (BackwardArgs::deterministic).
//
// Why v1 is not deterministic: every K/V block adds its share dS_ij K_j to the rows of dQ_i with
// float atomics, and float addition is not associative: (a + b) + c and (a + c) + b may differ in
// the last bit. Which block adds first depends on which SM got there first, so two runs on the
// same inputs give dQ values that differ in their last bits (dK and dV are summed in one thread
// block's registers, in the order of its walk, and were already the same every run).
//
// What changed: in the deterministic mode the additions to each Q block's rows of dQ happen in a
// fixed order, the K/V blocks of a head taking turns. Each (batch, query head, Q block) has a turn
// counter in the workspace, zeroed before the kernel. A block computes its dQ share as before, then
// waits until the counter shows its turn (one thread spins on an acquire load, `read_turn`, the
// block meets at a barrier), adds, and hands the turn on (`hand_on`: one thread's release
// increment). The hand-on waits until the block's additions have landed in L2; it is made in the
// next step, after that step's first products are issued, so the tensor cores work while it waits
// (and there the block also looks whether its next turn has already come). The order is the K/V
// blocks from the last to the first, and the blocks are numbered so that the last is launched first
// (block jb runs as blockIdx.x = n_kv − 1 − jb): a block only ever waits for blocks launched before
// it, which are running or done, so the waits cannot deadlock. Every block walks its Q blocks in
// order from its first (no rotation). Causal, the last K/V block sees the fewest Q blocks and
// starts nearest its diagonal: block jb reaches Q block i about two steps after block jb + 1 did,
// so a turn is usually ready when asked for. Without the mode the kernel is v1's.
//
// On any GPU other than compute capability 9.0, or a build without sm_90a, the version is refused
// with a message (launch.cuh); the kernel itself traps where it was compiled without sm_90a.
#include "launch.cuh"

namespace fl::hopper_backward {
namespace {

using namespace backward::tc;  // kLog2e, StepMask, BlockTiles, atomic_add2, with_row_check, run_kernels

constexpr Version kVersion = Version::V2Deterministic;

// ---- constants --------------------------------------------------------------------------------

template <int D>
struct Cfg {
  static constexpr int kThreads = 256, BC = 128, BR = 64;
  // K, V, Kᵀ; Q, dO twice; dSᵀ; L, D twice; 1 KB to align the tiles to 1024 bytes.
  static constexpr std::size_t kSmemBytes =
      std::size_t(3 * BC * D + 4 * BR * D + BC * BR) * 2 + 4 * BR * sizeof(float) + 1024;
  static_assert(BC == kBc, "the twin's B_c is the kernel's");
};

// ---- device helpers ---------------------------------------------------------------------------

// A turn counter read with acquire semantics: the additions made before the counter moved (by the
// blocks whose turns came first) are ordered before whatever this thread does after.
__device__ __forceinline__ int read_turn(const int* counter) {
  int seen;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  return seen;
}

// The counter moved on with release semantics: every addition this block made before the barrier
// that precedes the call (its threads' atomics) is ordered before the new value.
__device__ __forceinline__ void hand_on(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// ---- kernel -----------------------------------------------------------------------------------

template <class T, int D, bool kDeterministic>
__global__ void __launch_bounds__(Cfg<D>::kThreads, 1)
backward_wgmma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Dsum,
                      float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int heads, int group,
                      int64_t nq, int64_t nk, float scale_log2, float scale, bool causal,
                      int* __restrict__ turns) {  // [B, H, ceil(Nq / BR)], zeroed: whose turn it is to add to dQ
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace fl::wgmma;
  using C = Cfg<D>;
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
  // Deterministic: the last K/V block first, each walking its Q blocks in order.
  const int n_kv = int(gridDim.x), jb = kDeterministic ? n_kv - 1 - int(blockIdx.x) : int(blockIdx.x);
  const BlockTiles<BC, BR, T, std::decay_t<decltype(copy)>> tiles(copy, q, dout, lse, Dsum, Qs, dOs, Ls, Ds, heads, group,
                                                                 nq, nk, causal, unsigned(jb), !kDeterministic);
  const StepWalk<BR>& walk = tiles.walk;
  const int64_t j0 = walk.j0, kv_row0 = tiles.kv_row0, off = nk - nq;
  const int steps = tiles.steps;
  const int64_t n_qb = ceil_div<int64_t>(nq, BR);
  int* const head_turns = turns + (int64_t(blockIdx.z) * heads + int64_t(blockIdx.y) * group) * n_qb;
  int* handed = nullptr;  // the counter of the last step's Q block, not yet moved on (thread 0)
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
    // This block's turn at the Q block: the blocks after it in the order (jb + 1 .. the last
    // block that sees the Q block's last row) add first.
    int* const turn = head_turns + h * n_qb + i0 / BR;
    const int my_turn = int(std::min<int64_t>(causal ? (std::min(i0 + BR, nq) - 1 + off) / BC : n_kv - 1, n_kv - 1)) - jb;

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
    // While the tensor cores work: hand on the last step's turn (its additions all came before
    // this step's barrier; the release waits for them to land, off the critical path now), and
    // look whether this step's turn has come already.
    bool ready = true;
    if constexpr (kDeterministic) {
      if (threadIdx.x == 0) {
        if (handed) hand_on(handed);
        ready = read_turn(turn) == my_turn;
      }
      handed = turn;
    }
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
    if constexpr (kDeterministic) {  // thread 0 waits for the turn, the block with it
      if (threadIdx.x == 0 && !ready)
        while (read_turn(turn) != my_turn) {
        }
      __syncthreads();
    }
    with_row_check(i0 + BR <= nq, nq, [&](auto in_range) {
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        if (in_range(row)) atomic_add2(dst + 8 * n, dq[4 * n], dq[4 * n + 1]);
        if (in_range(row + 8)) atomic_add2(dst + 8 * D + 8 * n, dq[4 * n + 2], dq[4 * n + 3]);
      }
    });
    h = h_next, ib = ib_next;
  }
  if constexpr (kDeterministic) {  // the last step's turn
    __syncthreads();
    if (threadIdx.x == 0 && handed) hand_on(handed);
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
  __trap();  // built without sm_90a: dispatch never launches it (why_not_here); never silently
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ---- launcher ---------------------------------------------------------------------------------

struct Launch {
  template <class T, int D>
  static void run(Version, const AttentionShape& s, const BackwardArgs& a) {
    int* turns = reinterpret_cast<int*>(static_cast<unsigned char*>(a.workspace) + turn_offset(s));
    if (!a.deterministic) {
      run_kernels<T, D>(s, a, backward_wgmma_kernel<T, D, false>, Cfg<D>::kThreads, Cfg<D>::BC, Cfg<D>::kSmemBytes,
                        turns);
      return;
    }
    FL_CUDA_CHECK(cudaMemsetAsync(turns, 0, workspace_bytes(s) - turn_offset(s), as_stream(a.stream)));
    run_kernels<T, D>(s, a, backward_wgmma_kernel<T, D, true>, Cfg<D>::kThreads, Cfg<D>::BC, Cfg<D>::kSmemBytes, turns);
  }
};

}  // namespace

static const RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::hopper_backward
