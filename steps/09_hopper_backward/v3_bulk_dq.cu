// Rung 09, v3_bulk_dq: v2 with dQ's additions made by bulk reductions from shared memory.
//
// Why: in v1 and v2 every thread adds its share of dS_ij K_j to dQ's fp32 accumulator with its
// own atomics, D/16 · 2 two-float reductions a step (16 at d = 128): 4096 small reductions a step
// per thread block, each a separate request to L2. At d = 128 they bound the kernel (chapter 07's
// profile: L2 busy at 53 %, warps stalled on the load/store queue). Hopper can add a whole run of
// bytes from shared memory to global memory in one instruction, done by the copy engine beside
// the SM (`cp.reduce.async.bulk ... .add.f32`, the bulk form of TMA's reductions): the requests
// are whole 32-byte sectors, and the threads go on at once.
//
// What changed: each warp writes its 16 rows × D/2 columns of the step's dQ share into its own
// staging tile in shared memory (rows padded by 8 floats, so a warp's stores hit every bank once
// per 256 bytes), makes the writes visible to the async proxy, and 16 of its lanes each hand one
// row to a bulk reduction (`bulk_add`: D/2 floats, 256 bytes at d = 128). Before the next step
// writes the tile again those lanes wait until their reductions have read it (`bulk_wait_read`),
// which is long done by then. The deterministic mode keeps v2's turns, now per warp: the turn
// counter of a Q block moves on once for each of the block's 8 warps (`kWarps`), a warp adds when
// every warp of the blocks before it has handed on, and hands on itself once its own reductions
// have landed (`bulk_wait_all`), under the next step's first products as in v2. Without block
// barriers for the turns, a warp of one block waits only for what it must.
//
// On any GPU other than compute capability 9.0, or a build without sm_90a, the version is refused
// with a message (launch.cuh); the kernel itself traps where it was compiled without sm_90a.
#include "launch.cuh"

namespace fl::hopper_backward {
namespace {

using namespace backward::tc;  // kLog2e, StepMask, BlockTiles, atomic_add2, with_row_check, run_kernels

constexpr Version kVersion = Version::V3BulkDq;

// ---- constants --------------------------------------------------------------------------------

template <int D>
struct Cfg {
  static constexpr int kThreads = 256, BC = 128, BR = 64, kWarps = kThreads / 32;
  // A warp's dQ staging tile: 16 rows of D/2 floats, each padded by 8 (32 bytes).
  static constexpr int kStageLd = D / 2 + 8, kStageFloats = 16 * kStageLd;
  // K, V, Kᵀ; Q, dO twice; dSᵀ; L, D twice; the warps' dQ staging; 1 KB to align the tiles to 1024 bytes.
  static constexpr std::size_t kSmemBytes = std::size_t(3 * BC * D + 4 * BR * D + BC * BR) * 2 +
                                            (4 * BR + kWarps * kStageFloats) * sizeof(float) + 1024;
  static_assert(BC == kBc, "the twin's B_c is the kernel's");
};

// ---- device helpers ---------------------------------------------------------------------------

// dst[0 .. bytes/4) += src[...] in fp32, element by element, done by the bulk-copy engine: the
// thread issues it and goes on. Both addresses 16-byte aligned, bytes a multiple of 16. The
// reductions a thread issued form a group at bulk_commit; bulk_wait_read returns once they have
// read their shared memory (which may be written again), bulk_wait_all once their additions have
// been made in global memory.
__device__ __forceinline__ void bulk_add(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Orders this thread's global accesses through the async proxy (the bulk reductions) with its
// ordinary ones (the turn counter's loads and release).
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// A turn counter read with acquire semantics: the additions made before the counter moved (by the
// blocks whose turns came first) are ordered before whatever this thread does after.
__device__ __forceinline__ int read_turn(const int* counter) {
  int seen;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  return seen;
}

// The counter moved on with release semantics: every addition the warp's lanes saw land before the
// __syncwarp that precedes the call is ordered before the new value.
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
  constexpr int BC = C::BC, BR = C::BR, kThreads = C::kThreads, kWarps = C::kWarps, P = D / 64;  // P: 64-column panels of d
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
  float* dQs = Ds + 2 * BR;                                 // [kWarps][16][kStageLd]  dQ shares, staged

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
  int* handed = nullptr;  // the counter of the last step's Q block, not yet moved on by this warp
  float* const stage = dQs + (4 * wg + wr) * C::kStageFloats;  // this warp's staging tile
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
    // block that sees the Q block's last row) add first, each of their warps handing on once.
    int* const turn = head_turns + h * n_qb + i0 / BR;
    const int my_turn =
        kWarps * (int(std::min<int64_t>(causal ? (std::min(i0 + BR, nq) - 1 + off) / BC : n_kv - 1, n_kv - 1)) - jb);

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
    // While the tensor cores work: the warp hands on the last step's turn once its lanes' bulk
    // reductions have landed (waiting for them here is off the critical path).
    if constexpr (kDeterministic) {
      if (handed) {
        if (lane < 16) bulk_wait_all(), fence_async_global();
        __syncwarp();
        if (lane == 0) hand_on(handed);
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
    fence();  // dq's registers were read by last step's staging stores
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const uint64_t a = desc(ds_s + kk * 2048, BR * 128, 1024);
      const uint64_t bk = desc(kts + (kk / 4) * D * 128 + (D / 2) * wg * 128 + 32 * (kk % 4), 16, 1024);
      if constexpr (D == 128) ss_n64<T, 1, 0>(dq, a, bk, kk > 0);
      else ss_n32<T, 1, 0>(dq, a, bk, kk > 0);
    }
    commit();
    if (lane < 16) bulk_wait_read();  // the last step's reductions have read the staging tile
    wait<0>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(dv_acc[pc]), hold(dk_acc[pc]);
    hold(dq);
    __syncwarp();
    // Element i of dq: the warp's row g + 8·((i/2) % 2) (query row i0 + 16·wr + that), column
    // (D/2)·wg + 8·(i/4) + 2t + i%2: column 8·(i/4) + 2t + i%2 of the staging tile.
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      *reinterpret_cast<float2*>(stage + g * C::kStageLd + 8 * n + 2 * t) = make_float2(dq[4 * n], dq[4 * n + 1]);
      *reinterpret_cast<float2*>(stage + (g + 8) * C::kStageLd + 8 * n + 2 * t) =
          make_float2(dq[4 * n + 2], dq[4 * n + 3]);
    }
    fence_shared_to_async();
    __syncwarp();  // the warp's share is in its tile, visible to the bulk copies
    // Lane r < 16 adds row r of the tile (query row i0 + 16·wr + r, if it exists) to dQ.
    if (lane < 16) {
      if constexpr (kDeterministic) {  // the lanes wait for the warp's turn
        while (read_turn(turn) < my_turn) {
        }
        fence_async_global();
      }
      if (i0 + 16 * wr + lane < nq)
        bulk_add(dq_acc + (tiles.q_row0(h, ib) + 16 * wr + lane) * D + (D / 2) * wg, smem_u32(stage + lane * C::kStageLd),
                 (D / 2) * sizeof(float));
      bulk_commit();
    }
    h = h_next, ib = ib_next;
  }
  // Every reduction has landed (and read its tile) before the block ends; the last step's turn.
  if (lane < 16) bulk_wait_all(), fence_async_global();
  if constexpr (kDeterministic) {
    __syncwarp();
    if (lane == 0 && handed) hand_on(handed);
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
