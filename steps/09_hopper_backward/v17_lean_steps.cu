// Rung 09, v17_lean_steps: v16 with the consumer's step doing less integer and uniform
// bookkeeping, as rung 08's v17_lean_steps does for the forward.
//
// Why: rung 08's v17 cut its loop step's bookkeeping and ran 1.01–1.08× faster on every cell (run
// 142, H200). A reading of this rung's SASS (chapter 09's appendix) found the same kinds of work in
// an ordinary step of v16's consumers, 302 integer and uniform instructions at d = 128 and 234 at
// d = 64 causal: the wgmma descriptors that depend on the warpgroup built in per-thread registers
// and moved to uniform ones (R2UR) before every product, since the compiler cannot know a value
// from threadIdx.x to be the same in every lane; this thread's shared-memory offsets (dSᵀ's
// stmatrix rows, its columns of L and D, its place in the dQ staging tile) and the descriptors'
// addresses worked out again from threadIdx.x every step; the mask's test in 64-bit arithmetic
// every step.
//
// What changed, the arithmetic and the mask's decisions unchanged: the warpgroup through
// `__shfl_sync` from lane 0 (`wgu`), so that the descriptors built from it are uniform; the step's
// buffer and phase carried through the loop (`buf`, `ph`); the steps the mask touches worked out
// once a tile (`mask_end`, in 64 bits), the mask's limits only at those steps, and the element test
// against a constant; the aligned base, the base descriptors' addresses (`kept`) and this thread's
// offsets (`ds_row`, `ld_at`, `dq_at`) worked out once and passed through empty asm statements,
// which the compiler would otherwise work out again in every step.
//
// At d = 128 only (`kLean` in the kernel); at d = 64 the kernel is v16's, the same
// SASS instruction for instruction. The whole change ran 1.02–1.04× v16 at d = 128 but 0.93–0.95×
// at d = 64 N = 1024 not causal (runs 145–146, H200). Each change alone at d = 64 (run 147, the
// default mode, 16 × 16 × 1024): the pinned base (`asm volatile` on `base_`) 0.935× v16, `mask_end`
// 0.98×, `kept` 0.98×, the others 0.99–1.00×; all but the pinned base 0.99×. None gains there, so
// d = 64 keeps v16's code. In the deterministic mode, whose turns set the pace, every form was
// level with v16 (0.99–1.01×). The pinned base's cost is in the loader warp, not the consumers
// (a SASS reading; chapter 09's appendix): left 24 registers by setmaxnreg, it holds the
// addresses the pin keeps live, and ptxas then interleaves the step's eight loads of L and D with
// their shared stores, up to five dependent trips to memory where v16's loader makes two. At
// d = 128 the loader has four such loads and they stay together.
#include "../08_hopper_forward/tma.cuh"
#include "launch.cuh"

namespace fl::hopper_backward {
namespace {

using namespace backward::tc;  // kLog2e, StepMask, BlockTiles, run_kernels

constexpr Version kVersion = Version::V17LeanSteps;

// ---- constants --------------------------------------------------------------------------------

template <int D>
struct Cfg {
  static constexpr int kMma = 256, kThreads = kMma + 128, BC = 128, BR = D == 64 ? 128 : 64;  // + the writers' and loader's warpgroup
  static constexpr int NH = BR / 64;  // 64-row halves of Sᵀ and dPᵀ (one n128 wgmma fills both)
  // Registers a thread after setmaxnreg. The block is launched with kLaunchRegs a thread (168:
  // 65536 / 384, rounded down to a multiple of 8), and setmaxnreg.inc can only take what the
  // writer's warpgroup gave back: 256 · (240 − 168) = 128 · (168 − 24). Ask for more and it waits
  // forever.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8, kMmaRegs = 240, kWriterRegs = 24;
  static_assert(kMma * (kMmaRegs - kLaunchRegs) <= 128 * (kLaunchRegs - kWriterRegs), "setmaxnreg.inc would wait forever");
  // dQ's staging tile, BR rows of D floats. At d = 64 (kTensorAdds) in panels of 8 columns, each
  // BR rows of 32 bytes: a panel is what one tensor reduction adds. At d = 128 as in v13: in pairs
  // of rows one after the other (what one bulk reduction adds: two rows of dQ are contiguous in
  // global memory too), each pair followed by 8 floats of padding, so that the four pairs among
  // the 8 rows a warp stores to at once start in four different groups of 8 banks.
  static constexpr bool kTensorAdds = D == 64;
  // Columns of a panel. 8 (32-byte rows) is the one width whose float2 stores are conflict-free:
  // with 4 (16-byte rows) the panels sit 512 floats apart and a half-warp's stores meet two to a
  // bank, with 16 (64-byte rows) rows g and g + 2 share banks. TMA wants the box's width in bytes a
  // multiple of 16.
  static constexpr int kPanel = 8;
  static constexpr int kPairLd = 2 * D + 8, kTileFloats = kTensorAdds ? BR * D : BR / 2 * kPairLd;
  __device__ static constexpr int at(int r) { return r / 2 * kPairLd + r % 2 * D; }  // row r's first float (d = 128)
  static constexpr int kStages = 2;  // staging tiles: no room for a third at either head dim
  static constexpr int kWriters = kStages;         // a writer warp per staging tile
  static constexpr int kLoader = 3;                // the warp of the writer's warpgroup that loads
  static_assert(kWriters <= kLoader, "the loader is not a writer");
  // K, V; Q, dO twice; dSᵀ (in panels of 64 query rows); L, D twice; dQ's staging tiles; 1 KB to align the tiles to 1024
  // bytes; two mbarriers a staging tile and two a buffer of Q, dO, L and D; 16 bytes for a piece's count.
  static constexpr std::size_t kSmemBytes = std::size_t(2 * BC * D + 4 * BR * D + BC * BR) * 2 +
                                            (4 * BR + kStages * kTileFloats) * sizeof(float) + 1024 + 16 * kStages +
                                            16 * 2 + 16;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an SM gives a block");
  static_assert(((2 * BC * D + 4 * BR * D + BC * BR) * 2 + 4 * BR * 4) % 128 == 0 && kTileFloats * 4 % 128 == 0 &&
                    BR * kPanel * 4 % 128 == 0,
                "TMA reads the staging tiles' panels from 128-byte aligned addresses");
  // dK and dV on their way out: BC rows each of D values and 16 bytes of padding, where K, V, Q and
  // dO were.
  static constexpr int kOutRow = 2 * D + 16;
  static_assert(2 * BC * kOutRow <= (2 * BC * D + 4 * BR * D) * 2, "dK and dV fit where K, V, Q and dO were");
  static_assert(BC == kBc, "the twin's B_c is the kernel's");
  // A piece's partial dK and dV in fp32, as accumulated: element e of MMA thread x at e·kMma + x.
  static constexpr int kSlotFloats = 2 * (D / 64) * 32 * kMma;
};

// The split of the last wave, the same on the host (the plan) and on the GPU: the first `whole`
// blocks of the 1D grid are K/V blocks, numbered jb + n_kv · (kvh + Hkv · b); the r·k after them
// piece p of unit whole + p / k is piece p mod k. `parts`: r·k slots of kSlotFloats; `counts`: r
// counters, zero at the launch.
struct SplitGrid {
  int n_kv, hkv, k, whole;
  float* parts;
  int* counts;
};

// ---- device helpers ---------------------------------------------------------------------------

// The 256 threads that multiply meet (named barrier 1; the writer's warpgroup does not take part).
__device__ __forceinline__ void sync_mma() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

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
// The box of `map` at (column c0, row r0, slice s) += the box at `src` in shared memory (its rows
// one after the other), in fp32, by the copy engine; rows past the slice's end are left alone.
// `src` 128-byte aligned. The same groups as bulk_add.
__device__ __forceinline__ void tensor_add(const CUtensorMap& map, uint32_t src, int c0, int r0, int s) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(c0), "r"(r0), "r"(s), "r"(src)
               : "memory");
}
// Four 8 × 8 tiles of 16-bit values to shared memory: r[j] is this lane's pair (row lane / 4,
// columns 2·(lane % 4), + 1) of tile j; `row` the address of row lane % 8 of tile lane / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// dst[0 .. bytes) = src[...], copied from shared to global memory by the copy engine (the same
// alignment rules; the same groups).
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
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

// The counter moved on with release semantics: every addition the writer saw land before the call
// is ordered before the new value.
__device__ __forceinline__ void hand_on(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// ---- kernel -----------------------------------------------------------------------------------

template <class T, int D, bool kDeterministic, bool kSplit = false>
__global__ void __launch_bounds__(Cfg<D>::kThreads, 1)
backward_wgmma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Dsum,
                      float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int heads, int group,
                      int64_t nq, int64_t nk, float scale_log2, float scale, bool causal,
                      int* __restrict__ turns,  // [B, H, ceil(Nq / BR)], zeroed: whose turn it is to add to dQ
                      int group_heads,          // deterministic: (batch, KV head) pairs launched together
                      const __grid_constant__ CUtensorMap tq,     // Q [B·H][Nq][d], boxes of BR rows
                      const __grid_constant__ CUtensorMap tdo,    // dO, the same
                      const __grid_constant__ CUtensorMap tdq,  // dQ's accumulator (fp32), boxes of BR rows × 8 (d = 64)
                      const SplitGrid sg) {  // kSplit: the 1D grid's layout, the slots and counters
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace fl::wgmma;
  using C = Cfg<D>;
  constexpr int BC = C::BC, BR = C::BR, kMma = C::kMma, P = D / 64, NH = C::NH;  // P: 64-column panels of d
  // Where v17's changes apply (the header says why d = 128 only): the aligned base, `wgu`, the
  // descriptors' low words (`kept`), this thread's offsets (`ds_row`, `ld_at`, `dq_at`), `buf` and
  // `ph` carried through the loop, the mask's steps worked out once a tile (`mask_end`) and its
  // element test against a constant. Where false, v16's code, unchanged.
  constexpr bool kLean = D == 128;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // wgmma's 128-byte swizzle repeats every 1024 bytes: every tile starts on such a boundary.
  const uint32_t raw = smem_u32(smem_raw);
  uint32_t base_ = (raw + 1023u) & ~1023u;
  if constexpr (kLean) asm volatile("" : "+r"(base_));  // opaque to the compiler: worked out once, not at every use
  const uint32_t base = base_;
  T* Ks = reinterpret_cast<T*>(smem_raw + (base - raw));  // [BC][D] in panels
  T* Vs = Ks + BC * D;                                      // [BC][D]
  T* Qs = Vs + BC * D;                                      // [2][BR][D]
  T* dOs = Qs + 2 * BR * D;                                 // [2][BR][D]
  T* dSs = dOs + 2 * BR * D;                                // [BC][BR]  dSᵀ of the step, in panels of 64 query rows (columns)
  float* Ls = reinterpret_cast<float*>(dSs + BC * BR);      // [2][BR]
  float* Ds = Ls + 2 * BR;                                  // [2][BR]
  float* dQs = Ds + 2 * BR;                                 // [kStages][kTileFloats]  steps' dQ shares (128-byte aligned)
  // Staging tile sb's mbarriers: full(sb), every warp that multiplies has staged its share;
  // empty(sb), the writer's bulk (at d = 64, tensor) reductions have read it.
  const uint32_t bars = smem_u32(dQs + C::kStages * C::kTileFloats);
  const auto full = [bars](int sb) { return bars + 16u * sb; };
  const auto empty = [bars](int sb) { return bars + 16u * sb + 8u; };
  // Buffer buf of Q, dO, L and D: qfull(buf), the loader's copies have landed; qempty(buf), every
  // thread that multiplies is done with it.
  const auto qfull = [bars](int buf) { return bars + 16u * (C::kStages + buf); };
  const auto qempty = [bars](int buf) { return bars + 16u * (C::kStages + buf) + 8u; };

  const int wg = threadIdx.x / 128, wr = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const PanelCopy<D, kMma> copy(threadIdx.x);
  const uint32_t ks = smem_u32(Ks), vs = smem_u32(Vs), ds_s = smem_u32(dSs);
  const int key0 = 64 * wg + 16 * wr;  // the thread's first key (and +8) in Sᵀ, dPᵀ, dV, dK
  // Deterministic: the last K/V block first, each walking its Q blocks in order; the grid's blocks
  // in launch order take, group by group of group_heads (batch, KV head) pairs, rank 0 (the last
  // K/V block) of each pair of the group, then rank 1, ...
  static_assert(!(kSplit && kDeterministic), "the mode's order needs v15's 3D grid (n_kv below is its x)");
  const int n_kv = int(gridDim.x);
  unsigned rank = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  // kSplit: block x < whole is unit x; after them, piece p % k of unit whole + p / k (p / k: its
  // number among the r units left), p = x − whole. Worked out again from blockIdx where needed, so
  // that nothing of it stays in a register through the steps.
  const auto piece_of = [&] { return int(blockIdx.x) - sg.whole; };  // ≥ 0: a piece
  if constexpr (kSplit) {
    causal = false;  // the plan splits only there: a constant, so no step works out the diagonal's mask
    const unsigned unit = piece_of() < 0 ? blockIdx.x : unsigned(sg.whole + piece_of() / sg.k);
    rank = unit % unsigned(sg.n_kv), kvh = unit / unsigned(sg.n_kv) % unsigned(sg.hkv),
    b = unit / unsigned(sg.n_kv) / unsigned(sg.hkv);
  }
  if constexpr (kDeterministic) {
    const uint64_t at = blockIdx.x + gridDim.x * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);  // launch order
    const LaunchSlot slot = ranks_first_slot(at, n_kv, uint64_t(gridDim.y) * gridDim.z, group_heads);
    rank = slot.rank, kvh = unsigned(slot.pair % gridDim.y), b = unsigned(slot.pair / gridDim.y);
  }
  const int jb = kDeterministic ? n_kv - 1 - int(rank) : int(rank);
  const BlockTiles<BC, BR, T, std::decay_t<decltype(copy)>> tiles(copy, q, dout, lse, Dsum, Qs, dOs, Ls, Ds, heads, group,
                                                                 nq, nk, causal, unsigned(jb), !kDeterministic, kvh, b);
  const StepWalk<BR>& walk = tiles.walk;
  const int64_t j0 = walk.j0, kv_row0 = tiles.kv_row0, off = nk - nq;
  // The block's steps: all of them, or a piece's share of the walk, from the step it starts at.
  int steps = tiles.steps, h_first = 0, ib_first = walk.rot;
  if constexpr (kSplit) {
    if (const int p = piece_of(); p >= 0) {
      const PieceStart ps = piece_start(p % sg.k, sg.k, tiles.steps, walk.n_ib, walk.rot);
      steps = ps.steps, h_first = ps.h, ib_first = ps.ib;
    }
  }
  if (threadIdx.x == 0) {
    for (int sb = 0; sb < C::kStages; ++sb) {
      tma::mbar_init(full(sb), kMma / 32);  // one arrival from each warp that multiplies
      tma::mbar_init(empty(sb), 1);         // the writer's
    }
    for (int buf = 0; buf < 2; ++buf) {
      tma::mbar_init(qfull(buf), 32);         // the loader's lanes (lane 0 also announces the bytes)
      tma::mbar_init(qempty(buf), kMma);       // one arrival from each thread that multiplies
    }
    tma::mbar_init_fence();
  }
  __syncthreads();  // the mbarriers are initialised, for every thread and for the copy engine

  if (wg == 2) {  // ---- the dQ writers: the warpgroup's first kWriters warps; its last, the loader ----
    setmaxnreg_dec<C::kWriterRegs>();
    if (wr == C::kLoader) {
      // Step by step: wait for the buffer, announce its bytes, copy Q and dO by TMA, L and D by
      // the lanes (zeros past Nq), arrive.
      const int slice0 = int(b) * heads + int(kvh) * group;  // the group's first query head in [B·H]
      int h = h_first, ib = ib_first;
      for (int step = 0; step < steps; ++step) {
        const int buf = step & 1;
        if (step >= 2) tma::mbar_wait(qempty(buf), (step / 2 - 1) & 1);
        const int64_t i0 = walk.i0(ib), row0 = tiles.q_row0(h, ib);
        if (lane == 0) {
          tma::mbar_expect_tx(qfull(buf), 2 * BR * D * uint32_t(sizeof(T)));
#pragma unroll
          for (int p = 0; p < P; ++p) {
            tma::load(smem_u32(Qs + buf * BR * D) + p * BR * 128, tq, 64 * p, int(i0), slice0 + h, qfull(buf));
            tma::load(smem_u32(dOs + buf * BR * D) + p * BR * 128, tdo, 64 * p, int(i0), slice0 + h, qfull(buf));
          }
        }
        const int valid = int(std::min<int64_t>(BR, nq - i0));
        for (int r = lane; r < BR; r += 32) {
          Ls[buf * BR + r] = r < valid ? lse[row0 + r] : 0.f;
          Ds[buf * BR + r] = r < valid ? Dsum[row0 + r] : 0.f;
        }
        tma::mbar_arrive(qfull(buf));
        ib = ib + 1 < walk.n_ib ? ib + 1 : 0;
        h = ib == walk.rot ? h + 1 : h;
      }
      return;
    }
    if (wr >= C::kWriters) return;
    const int64_t n_qb = ceil_div<int64_t>(nq, BR);
    int* const head_turns = turns + (int64_t(b) * heads + int64_t(kvh) * group) * n_qb;
    // Writer wr takes every kWriters-th step from step wr, and with it staging tile wr.
    int h = h_first, ib = ib_first;
    const auto next = [&] {  // the walk's next step: the next Q block, or the group's next head
      ib = ib + 1 < walk.n_ib ? ib + 1 : 0;
      h = ib == walk.rot ? h + 1 : h;
    };
    for (int i = 0; i < wr; ++i) next();
    for (int step = wr; step < steps; step += C::kWriters) {
      const int64_t i0 = walk.i0(ib);
      const int sb = step % C::kStages;  // the staging tile: wr
      tma::mbar_wait(full(sb), (step / C::kStages) & 1);  // the step's dQ share is staged
      // This block's turn at the Q block: the blocks after it in the order (jb + 1 .. the last
      // block that sees the Q block's last row) add first.
      int* const turn = head_turns + h * n_qb + (walk.ib0 + ib);
      if constexpr (kDeterministic) {
        const int my_turn = (causal ? int(std::min<int64_t>((std::min(i0 + BR, nq) - 1 + off) / BC, n_kv - 1)) : n_kv - 1) - jb;
        if (lane == 0)
          while (read_turn(turn) != my_turn) {
          }
        __syncwarp();
        fence_async_global();
      }
      if constexpr (C::kTensorAdds) {  // lane l adds panel l (columns 8l..) of the tile
        if (lane < D / C::kPanel)
          tensor_add(tdq, smem_u32(dQs + sb * C::kTileFloats + lane * BR * C::kPanel), C::kPanel * lane, int(i0),
                     int(b) * heads + int(kvh) * group + h);
      } else {  // lane l adds pairs l, l + 32, ... of the tile's rows, the rows that exist
#pragma unroll
        for (int pr = lane; pr < BR / 2; pr += 32) {
          const int r = 2 * pr;
          if (const int64_t rows = std::min<int64_t>(2, nq - (i0 + r)); rows > 0)
            bulk_add(dq_acc + (tiles.q_row0(h, ib) + r) * D, smem_u32(dQs + sb * C::kTileFloats + C::at(r)),
                     uint32_t(rows) * D * sizeof(float));
        }
      }
      bulk_commit();
      bulk_wait_read();
      __syncwarp();
      if (lane == 0) tma::mbar_arrive(empty(sb));  // the tile may be written again
      if constexpr (kDeterministic) {          // the turn moves on once the additions have landed
        bulk_wait_all();
        fence_async_global();
        __syncwarp();
        if (lane == 0) hand_on(turn);
      }
      for (int i = 0; i < C::kWriters; ++i) next();
    }
    bulk_wait_all();  // every addition has been made before the block ends
    return;
  }

  // ---- the two warpgroups that multiply ----
  setmaxnreg_inc<C::kMmaRegs>();
  const int kv_valid = int(std::min<int64_t>(BC, nk - walk.j0));
  copy.template load<BC>(ks, k + (tiles.kv_row0 + walk.j0) * D, kv_valid);
  copy.template load<BC>(vs, v + (tiles.kv_row0 + walk.j0) * D, kv_valid);
  cp_async_commit();
  cp_async_wait<0>();
  fence_shared_to_async();  // K and V, for wgmma after the first step's barrier

  float dk_acc[P][32] = {}, dv_acc[P][32] = {};  // keys key0 + g (+8) × panel columns 8·(i/4) + 2t + i%2

  // The base descriptors: this warpgroup's 64 rows of K and of V (A of Sᵀ and dPᵀ), buffer 0 of Q
  // and dO read K-major (B of Sᵀ and dPᵀ) and MN-major (B of dK and dV), dSᵀ (MN-major A of dQ:
  // at d = 64 this warpgroup's panel of 64 query rows, at d = 128 the only one) and K read MN-major
  // (B of dQ: at d = 128 this warpgroup's panel of 64 columns, at d = 64 the only one). Each
  // warpgroup's dQ is 64 rows × 64 columns at both head dims. `advance` reaches every other
  // descriptor.
  // The warpgroup again, through __shfl_sync from lane 0: the compiler then knows it to be the same
  // in every lane of a warp, and builds the descriptors that use it in uniform registers, not in
  // per-thread ones moved to uniform ones (R2UR) before every wgmma.
  int wgu = wg;  // without kLean, as v16: the warpgroup from threadIdx.x
  if constexpr (kLean) wgu = __shfl_sync(0xffffffffu, wg, 0);
  // `kept`: a descriptor whose low word (the address) is opaque to the compiler, so that it is
  // worked out here once, not again in every step; the high word (a constant) stays visible.
  const auto kept = [](uint64_t d) {
    uint32_t lo = uint32_t(d);
    if constexpr (kLean) asm volatile("" : "+r"(lo));  // without kLean, d itself
    return (d & ~uint64_t(0xFFFFFFFF)) | lo;
  };
  const uint32_t q0 = smem_u32(Qs), do0 = smem_u32(dOs), tile_bytes = uint32_t(BR * D * sizeof(T));
  const uint64_t k_d = kept(desc(ks + 64 * wgu * 128, 16, 1024)), v_d = kept(desc(vs + 64 * wgu * 128, 16, 1024)),
                 q_k = kept(desc(q0, 16, 1024)), do_k = kept(desc(do0, 16, 1024)), q_mn = kept(desc(q0, BR * 128, 1024)),
                 do_mn = kept(desc(do0, BR * 128, 1024)),
                 ds_d = kept(desc(ds_s + (NH == 2 ? wgu * BC * 128 : 0), BC * 128, 1024)),
                 k_mn = kept(desc(ks + (D == 128 ? wgu * BC * 128 : 0), BC * 128, 1024));

  // The steps the mask touches, worked out once in 64 bits: StepMask's any() at step (h, ib) is
  // keys < BC, or (causal) ib·BR < y with y = BC − 1 − (ib0·BR + off − j0), that is
  // ib < mask_end below (ib is never negative). Its limits are still worked out at those steps.
  int mask_end = 0;  // used only with kLean
  if constexpr (kLean) {
    const int64_t y = int64_t(BC - 1) - (int64_t(walk.ib0) * BR + off - j0);
    mask_end = nk - j0 < BC ? INT_MAX : !causal || y <= 0 ? 0 : int(std::min<int64_t>((y - 1) / BR + 1, INT_MAX));
    asm volatile("" : "+r"(mask_end));  // opaque to the compiler: kept out of the loop
  }
  // This thread's shared-memory offsets, the same every step, worked out once and kept opaque to
  // the compiler (which otherwise works them out again from threadIdx.x in every step): dSᵀ's
  // stmatrix rows for the k-steps of a 64-row panel (k-step kk at ds_row[kk % 4] + its panel's
  // offset: the swizzle repeats panel by panel), and, in floats, its columns of L and D and its
  // place in the dQ staging tile (at d = 128 two: stores 0-5 start at dq_at[0], 6-7 at dq_at[1]).
  uint32_t ds_row[4] = {};
  int ld_at = 0, dq_at[2] = {};  // used only with kLean
  if constexpr (kLean) {
    ld_at = 2 * t;
    const int tile_key = key0 + lane % 8 + 8 * (lane / 8 % 2), tile_col = 8 * (lane / 16);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ds_row[kk] = ds_s + panel_at<BC>(tile_key, 16 * kk + tile_col);
      asm volatile("" : "+r"(ds_row[kk]));
    }
    if constexpr (C::kTensorAdds) {
      dq_at[0] = dq_at[1] = (64 * wg + 16 * wr + g) * C::kPanel + 2 * t;
    } else {  // store n (of column group n, or (n + 2) mod 8 in an odd row) at 8n floats from these
      const int at0 = C::at(16 * wr + g) + 64 * wg + 2 * t, odd = g & 1;
      dq_at[0] = at0 + 16 * odd, dq_at[1] = at0 - 48 * odd;
    }
    asm volatile("" : "+r"(ld_at), "+r"(dq_at[0]), "+r"(dq_at[1]));
  }
  int h = h_first, ib = ib_first;
  // The step's buffer of Q, dO, L and D (step % 2, and its staging tile: kStages is 2 too) and the
  // parity of their mbarriers' phase ((step / 2) % 2), carried from step to step.
  static_assert(C::kStages == 2, "the staging tile is the buffer");
  // Without kLean, as v16: worked out from the step, every step.
  int buf_c = 0;
  uint32_t ph_c = 0;
  for (int step = 0; step < steps; ++step) {
    const int ib_next = ib + 1 < walk.n_ib ? ib + 1 : 0, h_next = ib_next == walk.rot ? h + 1 : h;
    const int buf = kLean ? buf_c : step & 1;
    tma::mbar_wait(qfull(buf), kLean ? ph_c : (step / 2) & 1);  // the step's Q, dO, L and D are in
    sync_mma();  // K and V are in; the last step is done with dSᵀ
    const int64_t i0 = walk.i0(ib);
    const uint32_t bo = buf * tile_bytes;  // the buffer's offset in the Q and dO tiles
    const uint64_t qk = advance(q_k, bo), dok = advance(do_k, bo), qmn = advance(q_mn, bo),
                   domn = advance(do_mn, bo);
    // This thread's columns 2t, 2t + 1 of L and D: Lb + 8n (+ 2t without kLean; with it ld_at is 2t).
    const float* Lb = Ls + buf * BR + (kLean ? ld_at : 0);
    const float* Db = Ds + buf * BR + (kLean ? ld_at : 0);

    // Sᵀ and dPᵀ: k-step kk reads 16 columns of d, 32 bytes into panel kk / 4 of both operands;
    // with 128 query rows one n128 wgmma fills both halves. Half hh holds rows 64·hh.. .
    float st[NH][32], dpt[NH][32];
    fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t a = advance(k_d, (kk / 4) * BC * 128 + 32 * (kk % 4)), b = advance(qk, (kk / 4) * BR * 128 + 32 * (kk % 4));
      if constexpr (NH == 2) ss_n128<T, 0, 0>(st[0], st[NH - 1], a, b, kk > 0);
      else ss_n64<T, 0, 0>(st[0], a, b, kk > 0);
    }
    commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t a = advance(v_d, (kk / 4) * BC * 128 + 32 * (kk % 4)), b = advance(dok, (kk / 4) * BR * 128 + 32 * (kk % 4));
      if constexpr (NH == 2) ss_n128<T, 0, 0>(dpt[0], dpt[NH - 1], a, b, kk > 0);
      else ss_n64<T, 0, 0>(dpt[0], a, b, kk > 0);
    }
    commit();
    wait<1>();  // Sᵀ is in, and so the last step's dK; dPᵀ may still be running
#pragma unroll
    for (int hh = 0; hh < NH; ++hh) hold(st[hh]);
    if (step > 0) tma::mbar_arrive(qempty(buf ^ 1));  // the last step's dK has read its Q

    // Pᵀ in place. Element i of half hh is key key0 + g + 8·((i/2) % 2), query row
    // 64·hh + 8·(i/4) + 2t + i%2; below, n = 8·hh + i/4 counts the 8-row groups of the block.
    if constexpr (kLean) {
      if (ib < mask_end) {  // mask.any()
        const StepMask mask(j0, i0, nk, off, BC, BR, causal);
        // mask.masked(kb, rb): kb >= keys, or kb − rb > diag. The element's row rb is 2t + c, c a
        // constant, so the test is x > c with x = kb − 2t − diag, or x = INT_MAX for a key past Nk.
        int x[2];
#pragma unroll
        for (int hk = 0; hk < 2; ++hk) {
          const int kb = key0 + g + 8 * hk;
          x[hk] = kb >= mask.keys ? INT_MAX : kb - 2 * t - mask.diag;
        }
#pragma unroll
        for (int hh = 0; hh < NH; ++hh)
#pragma unroll
          for (int i = 0; i < 32; ++i)
            if (x[i / 2 % 2] > 64 * hh + 8 * (i / 4) + i % 2) st[hh][i] = -INFINITY;
      }
    } else {
      if (const StepMask mask(j0, i0, nk, off, BC, BR, causal); mask.any()) {  // v16's test, every step
#pragma unroll
        for (int hh = 0; hh < NH; ++hh)
#pragma unroll
          for (int i = 0; i < 32; ++i)
            if (mask.masked(key0 + g + 8 * (i / 2 % 2), 64 * hh + 8 * (i / 4) + 2 * t + i % 2)) st[hh][i] = -INFINITY;
      }
    }
    // D: at d = 128 read here, at d = 64 where dSᵀ uses it (there its 32 registers would push the
    // step past the 240 a thread has, and ptxas would serialise the wgmma: note C7512).
    float2 dd[NH == 1 ? BR / 8 : 1] = {};
    const auto d_of = [&](int n) {
      if constexpr (NH == 1) return dd[n];
      else return *reinterpret_cast<const float2*>(Db + 8 * n + (kLean ? 0 : 2 * t));
    };
#pragma unroll
    for (int n = 0; n < BR / 8; ++n) {
      const float2 l = *reinterpret_cast<const float2*>(Lb + 8 * n + (kLean ? 0 : 2 * t));
      if constexpr (NH == 1) dd[n] = *reinterpret_cast<const float2*>(Db + 8 * n + (kLean ? 0 : 2 * t));
      const float lx = l.x == -INFINITY ? INFINITY : l.x * kLog2e, ly = l.y == -INFINITY ? INFINITY : l.y * kLog2e;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st[n / 8][4 * (n % 8) + e] = fast_exp2(fmaf(st[n / 8][4 * (n % 8) + e], scale_log2, -(e % 2 ? ly : lx)));
    }
    wait<0>();  // dPᵀ is in
#pragma unroll
    for (int hh = 0; hh < NH; ++hh) hold(dpt[hh]);

    // dSᵀ = Pᵀ ∘ (dPᵀ − D); both as A fragments (k-step kk: query rows 16kk..16kk+15), and dSᵀ
    // to shared memory for dQ: k-step kk's four registers are tiles (keys key0 + 8·(j % 2) ..,
    // rows 16kk + 8·(j / 2) ..), j = 0..3, one stmatrix; this lane names row lane % 8 of tile
    // lane / 8.
    uint32_t ap[BR / 16][4], as[BR / 16][4];
    const int tile_key = key0 + lane % 8 + 8 * (lane / 8 % 2), tile_col = 8 * (lane / 16);  // without kLean
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // n8 tile 2kk + hf
        const int n = 2 * kk + hf;
        const float* const p = st[n / 8] + 4 * (n % 8);
        const float* const dp = dpt[n / 8] + 4 * (n % 8);
        const float2 dn = d_of(n);
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] = p[e] * (dp[e] - (e % 2 ? dn.y : dn.x));
        ap[kk][2 * hf] = pack<T>(p[0], p[1]);
        ap[kk][2 * hf + 1] = pack<T>(p[2], p[3]);
        as[kk][2 * hf] = pack<T>(s[0], s[1]);
        as[kk][2 * hf + 1] = pack<T>(s[2], s[3]);
        if (hf == 1) {
          if constexpr (kLean) stmatrix_x4(ds_row[kk % 4] + (kk / 4) * BC * 128, as[kk]);  // panel_at<BC>(tile_key, 16kk + tile_col)
          else stmatrix_x4(ds_s + panel_at<BC>(tile_key, 16 * kk + tile_col), as[kk]);
        }
      }

    // dV_j += Pᵀ dO_i (dK_j += dSᵀ Q_i comes after dQ, below): k-step kk is query rows 16kk..,
    // 2048 bytes into the tile; panel pc of dO_i (Q_i) gives columns 64pc.. .
    fence();
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk) rs_n64<T, 1>(dv_acc[pc], ap[kk], advance(domn, pc * BR * 128 + kk * 2048));
    commit();
    fence_shared_to_async();
    sync_mma();  // all of dSᵀ is in shared memory, visible to wgmma

    // dQ_i += dS K_j, warpgroup wg: rows 64·wg.. at d = 64, columns 64·wg.. at d = 128; k-step
    // kk is keys 16kk.. : 2048 bytes into dSᵀ's panel (MN-major A) and into K's (MN-major B).
    float dq[32];
    fence();  // dq's registers were read by last step's staging stores
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) ss_n64<T, 1, 1>(dq, advance(ds_d, kk * 2048), advance(k_mn, kk * 2048), kk > 0);
    commit();
    fence();
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk) rs_n64<T, 1>(dk_acc[pc], as[kk], advance(qmn, pc * BR * 128 + kk * 2048));
    commit();  // dK last: the one product this step does not wait for
    // dV and dQ are in; at d = 128 dK may still be running, into the next step. At d = 64 it lands
    // here: its A operands (dSᵀ, 32 registers at 128 rows) beside the next step's Sᵀ and dPᵀ would
    // not fit in a thread's 240 registers, and ptxas would serialise the wgmma (note C7512).
    if constexpr (NH == 2) wait<0>();
    else wait<1>();
#pragma unroll
    for (int pc = 0; pc < P; ++pc) hold(dv_acc[pc]);
    hold(dq);
    // Once the writer has read the tile this step reuses (kStages steps ago), element i of dq goes
    // to its row r0 + 16·wr + g + 8·((i/2) % 2), column c0 + 8·(i/4) + 2t + i%2, where (r0, c0) is
    // (64·wg, 0) at d = 64 and (0, 64·wg) at d = 128.
    const int sb = kLean ? buf : step % C::kStages;  // the staging tile, step % kStages
    if (step >= C::kStages) tma::mbar_wait(empty(sb), kLean ? ph_c ^ 1u : (step / C::kStages - 1) & 1);  // (step / kStages − 1) % 2
    if constexpr (C::kTensorAdds) {  // column 8n + 2t is in panel n, row r at 8·r floats into it
      float* tile;
      if constexpr (kLean) tile = dQs + sb * C::kTileFloats + dq_at[0];  // + (64·wg + 16·wr + g)·kPanel + 2t
      else tile = dQs + sb * C::kTileFloats + (64 * wg + 16 * wr + g) * C::kPanel + 2 * t;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        *reinterpret_cast<float2*>(tile + n * BR * C::kPanel) = make_float2(dq[4 * n], dq[4 * n + 1]);
        *reinterpret_cast<float2*>(tile + n * BR * C::kPanel + 8 * C::kPanel) = make_float2(dq[4 * n + 2], dq[4 * n + 3]);
      }
    } else {
      // Store n: column group n (columns 8n..8n + 7), or m = (n + 2) mod 8 in an odd row, so that
      // the two rows of a pair (d floats apart, the same banks) fall in banks 16 apart.
      // tile + 8·(odd ? m : n), tile = dQs + sb·kTileFloats + C::at(16·wr + g) + 64·wg + 2t
      float* const tile = dQs + sb * C::kTileFloats;
      float* const tile16 = tile + C::at(16 * wr + g) + 64 * wg + 2 * t;  // without kLean (v16's tile)
      const bool odd = g & 1;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int m = (n + 2) % 8;
        float* const dst = kLean ? tile + dq_at[n / 6] + 8 * n : tile16 + 8 * (odd ? m : n);
        *reinterpret_cast<float2*>(dst) = odd ? make_float2(dq[4 * m], dq[4 * m + 1]) : make_float2(dq[4 * n], dq[4 * n + 1]);
        *reinterpret_cast<float2*>(dst + (C::at(8) - C::at(0))) =
            odd ? make_float2(dq[4 * m + 2], dq[4 * m + 3]) : make_float2(dq[4 * n + 2], dq[4 * n + 3]);
      }
    }
    fence_shared_to_async();
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(full(sb));  // the warp's share, to the writer
    h = h_next, ib = ib_next;
    if constexpr (kLean) ph_c ^= uint32_t(buf_c), buf_c ^= 1;  // the phase moves on after buffer 1
  }
  wait<0>();  // the last step's dK
#pragma unroll
  for (int pc = 0; pc < P; ++pc) hold(dk_acc[pc]);
  if (steps > 0) tma::mbar_arrive(qempty((steps - 1) & 1));

  if constexpr (kSplit) {
    if (const int p = piece_of(); p >= 0) {
      const int left = p / sg.k, piece = p % sg.k;
      // A piece: its dK and dV sums to its slot (element e of thread x at e·256 + x, so that a
      // warp's stores are whole lines), then counted in on its K/V block's counter.
      const int x = threadIdx.x;  // 0 .. kMma − 1
      const auto slot_at = [&](int pp) { return sg.parts + (int64_t(left) * sg.k + pp) * C::kSlotFloats + x; };
      float* const mine = slot_at(piece);
#pragma unroll
      for (int pc = 0; pc < P; ++pc)
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          mine[(32 * pc + i) * kMma] = dk_acc[pc][i];
          mine[(32 * (P + pc) + i) * kMma] = dv_acc[pc][i];
        }
      __threadfence();  // the slot is in L2 before the count says so
      sync_mma();
      int* const said = reinterpret_cast<int*>(smem_raw + (bars + 16u * (C::kStages + 2) - raw));  // past the mbarriers
      if (x == 0) *said = atomicAdd(sg.counts + left, 1);
      sync_mma();
      // A vote, so that ptxas sees the branch below is the same in every lane of a warp (a branch
      // on a value read from shared memory it treats as divergent, and serializes wgmma: C7520).
      if (!__all_sync(0xffffffffu, *said == sg.k - 1)) return;  // another piece stores dK and dV
      __threadfence();  // the other pieces' slots are read after the count
      // Every piece's slot, its own too, added in piece order to zero: the same bits whichever
      // piece is last.
#pragma unroll
      for (int pc = 0; pc < P; ++pc)
#pragma unroll
        for (int i = 0; i < 32; ++i) dk_acc[pc][i] = dv_acc[pc][i] = 0.f;
      for (int pp = 0; pp < sg.k; ++pp) {
        const float* const other = slot_at(pp);
#pragma unroll
        for (int pc = 0; pc < P; ++pc)
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            dk_acc[pc][i] += __ldcg(other + (32 * pc + i) * kMma);
            dv_acc[pc][i] += __ldcg(other + (32 * (P + pc) + i) * kMma);
          }
      }
    }
  }

  // dK_j = scale · Σ dSᵀ Q and dV_j, rounded once, into shared memory (rows kOutRow bytes apart:
  // dK's BC rows, then dV's), once both warpgroups are done with K, V, Q and dO.
  sync_mma();
  unsigned char* const out = reinterpret_cast<unsigned char*>(Ks);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int kr = key0 + g + 8 * hh;  // the key's row in the block
#pragma unroll
    for (int pc = 0; pc < P; ++pc)
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int at = kr * C::kOutRow + 2 * (64 * pc + 8 * n + 2 * t);
        *reinterpret_cast<uint32_t*>(out + at) =
            pack<T>(scale * dk_acc[pc][4 * n + 2 * hh], scale * dk_acc[pc][4 * n + 2 * hh + 1]);
        *reinterpret_cast<uint32_t*>(out + BC * C::kOutRow + at) =
            pack<T>(dv_acc[pc][4 * n + 2 * hh], dv_acc[pc][4 * n + 2 * hh + 1]);
      }
  }
  // The warp holds whole rows: keys key0 .. key0 + 15 of both. Lane l copies key key0 + l % 16 of
  // dK (l < 16) or dV, if the key exists.
  fence_shared_to_async();
  __syncwarp();
  {
    const int kr = key0 + lane % 16, which = lane / 16;
    // kSplit: the block's first key and its row in [B·Hkv·Nk] worked out again from blockIdx, so
    // that no 64-bit value stays in registers through the steps (ptxas spilled one at d = 64).
    int64_t first_key = j0, first_row = kv_row0 + j0;
    if constexpr (kSplit) {
      const unsigned unit = piece_of() < 0 ? blockIdx.x : unsigned(sg.whole + piece_of() / sg.k);
      first_key = int64_t(unit % unsigned(sg.n_kv)) * BC, first_row = int64_t(unit / unsigned(sg.n_kv)) * nk + first_key;
    }
    if (first_key + kr < nk)
      bulk_store((which ? dv : dk) + (first_row + kr) * D,
                 smem_u32(out + (which * BC + kr) * C::kOutRow), uint32_t(D * sizeof(T)));
    bulk_commit();
    bulk_wait_read();  // the copies have read shared memory before the block ends
  }
#else
  __trap();  // built without sm_90a: dispatch never launches it (why_not_here); never silently
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ---- launcher ---------------------------------------------------------------------------------

// The launch a call takes: v15's 3D grid, or, not causal and not in the deterministic mode, the
// last wave's r = U mod G K/V blocks (U of them, G SMs) each cut into k pieces along their S steps
// (split_pieces says where and k; a piece's fixed costs are K and V loaded again, its Q pipeline
// started, its slot written and read). The same on the host for the workspace and for the launch.
// Where the split runs: d = 128 only. At d = 64 its pieces cost more than they give back: Nsight
// Compute counted 1.6-1.9 % more busy SM cycles on average (0.9 % fewer cycles in all), and
// `ladder` timed it at about 0.98 of v15 at 1 × 16 × 16384 (build run q); why is not known.
template <int D>
inline constexpr bool kSplits = D == 128;

template <int D>
struct Plan {
  bool split = false;
  int k = 1;
  int64_t n_kv = 0, units = 0, left = 0;

  Plan(const AttentionShape& s, bool deterministic, int sms) {
    n_kv = ceil_div<int64_t>(s.seq_k, Cfg<D>::BC);
    units = n_kv * s.kv_heads * s.batch;
    left = sms > 0 ? units % sms : 0;
    if (!kSplits<D> || s.causal || deterministic) return;
    k = split_pieces(units, sms, s.group() * ceil_div<int64_t>(s.seq_q, Cfg<D>::BR));
    split = k > 1 && blocks() <= INT32_MAX;  // a 1D grid
    if (!split) k = 1;
  }
  int64_t blocks() const { return units - left + left * k; }  // the 1D grid's, where split
  // The workspace: v15's, then r counters and r·k slots, each 256-byte aligned.
  static std::size_t up(std::size_t n) { return (n + 255) / 256 * 256; }
  std::size_t counts_at(const AttentionShape& s) const { return up(workspace_bytes(s)); }
  std::size_t parts_at(const AttentionShape& s) const { return up(counts_at(s) + sizeof(int) * left); }
  std::size_t bytes(const AttentionShape& s) const {
    return split ? parts_at(s) + sizeof(float) * std::size_t(left * k) * Cfg<D>::kSlotFloats : workspace_bytes(s);
  }
};

struct Launch {
  // The default mode's plan on this GPU; the deterministic mode needs v15's bytes, which this covers.
  static std::size_t backward_workspace_bytes(const AttentionShape& s, DType) {
    const int sms = gpu::sm_count();
    if (s.head_dim == 64) return Plan<64>(s, false, sms).bytes(s);
    if (s.head_dim == 128) return Plan<128>(s, false, sms).bytes(s);
    return workspace_bytes(s);
  }

  template <class T, int D>
  static void run(Version, const AttentionShape& s, const BackwardArgs& a) {
    int* turns = reinterpret_cast<int*>(static_cast<unsigned char*>(a.workspace) + turn_offset(s));
    const DType t = std::is_same_v<T, __half> ? DType::F16 : DType::BF16;
    const CUtensorMap tq = tma::make_tensor_map(a.q, t, s.batch * s.heads, s.seq_q, D, Cfg<D>::BR);
    const CUtensorMap tdo = tma::make_tensor_map(a.dout, t, s.batch * s.heads, s.seq_q, D, Cfg<D>::BR);
    // dQ's fp32 accumulator [B·H][Nq][d] in boxes of BR rows × one panel, where the writers add by TMA.
    CUtensorMap tdq{};
    if constexpr (Cfg<D>::kTensorAdds)
      tdq = tma::make_map(static_cast<unsigned char*>(a.workspace) + backward::dq_accum_offset(s), CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                          s.batch * s.heads, s.seq_q, D, Cfg<D>::kPanel, Cfg<D>::BR, CU_TENSOR_MAP_SWIZZLE_NONE);
    if (!a.deterministic) {
      if constexpr (kSplits<D>) {
        if (const Plan<D> plan(s, false, gpu::sm_count()); plan.split) {
          // One launch, so that the pieces start as the whole blocks free their SMs. The workspace
          // is backward_workspace_bytes(), which sizes it by the same plan.
          unsigned char* const ws = static_cast<unsigned char*>(a.workspace);
          int* const counts = reinterpret_cast<int*>(ws + plan.counts_at(s));
          FL_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * plan.left, as_stream(a.stream)));
          const SplitGrid sg{int(plan.n_kv), int(s.kv_heads), plan.k, int(plan.units - plan.left),
                             reinterpret_cast<float*>(ws + plan.parts_at(s)), counts};
          run_kernels<T, D>(dim3(unsigned(plan.blocks())), s, a, backward_wgmma_kernel<T, D, false, true>,
                            Cfg<D>::kThreads, Cfg<D>::kSmemBytes, turns, 1, tq, tdo, tdq, sg);
          return;
        }
      }
      run_kernels<T, D>(s, a, backward_wgmma_kernel<T, D, false>, Cfg<D>::kThreads, Cfg<D>::BC, Cfg<D>::kSmemBytes, turns,
                        1, tq, tdo, tdq, SplitGrid{});
      return;
    }
    FL_CUDA_CHECK(cudaMemsetAsync(turns, 0, workspace_bytes(s) - turn_offset(s), as_stream(a.stream)));
    // As many (batch, KV head) pairs a group as the SMs hold blocks of (one block an SM), at least one.
    const int sms = gpu::sm_count();
    const int group_heads = int(std::max<int64_t>(1, sms / ceil_div<int64_t>(s.seq_k, Cfg<D>::BC)));
    run_kernels<T, D>(s, a, backward_wgmma_kernel<T, D, true>, Cfg<D>::kThreads, Cfg<D>::BC, Cfg<D>::kSmemBytes, turns,
                      group_heads, tq, tdo, tdq, SplitGrid{});
  }
};

}  // namespace

static const RegisterKernel<Launch> registered{kVersion};

}  // namespace fl::hopper_backward
