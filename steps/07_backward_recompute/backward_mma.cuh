// What rung 07's tensor-core versions (v1_mma.cu ... v4_2d_tiles.cu) and rung 09's share and none
// of them teaches:
// the preprocessing kernel (D = rowsum(dO ∘ O), dQ's accumulator zeroed), the walk of a K/V
// block's steps over the Q blocks, the step's mask, the cp.async loads of a step's tiles, the last
// pass that scales and rounds dQ, and the launch of the three kernels. A version file holds its
// main kernel and a `Launch` with `template <class T, int D> static void run(shape, args)` that
// calls run_kernels with it, and ends with
//     static const RegisterKernel<Launch> registered{kVersion};
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "../06_tensor_core_mma/mma_sync.cuh"
#include "../06_tensor_core_mma/swizzle.cuh"
#include "backward_recompute.hpp"
#include "block_reduce.cuh"
#include "cuda_check.cuh"
#include "dispatch.cuh"

namespace fl::backward::tc {

using namespace fl::mma;  // pack, mma_16816, ldmatrix_x4(_trans), cp_async_*, fast_exp2, swz, LaneRow, TileCopy

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr int BR = int(kBr);  // query rows per step

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
// again for every atomic (docs/appendix/07_backward_recompute.md, "One register per address").
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
// that the blocks running at the same time add into different rows of dQ (unless `rotate` is false:
// then every block walks them in order, from its first).
template <int BR>
struct StepWalk {
  int64_t j0;           // the block's first key
  int ib0, n_ib, rot;   // first Q block, how many, where the walk starts
  __device__ StepWalk(unsigned jb, int BC, int64_t nq, int64_t nk, bool causal, bool rotate = true)
      : j0(int64_t(jb) * BC) {
    const int64_t off = nk - nq;  // row i sees keys ≤ i + off (causal, aligned bottom-right)
    const int64_t first_row = causal ? std::max(int64_t(0), j0 - off) : 0;
    ib0 = int(first_row / BR);
    n_ib = first_row < nq ? int(ceil_div<int64_t>(nq, BR)) - ib0 : 0;
    rot = rotate && n_ib > 0 ? int(jb % unsigned(n_ib)) : 0;
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

// A thread block's K/V block (blockIdx: the block, its K/V head, the batch; or K/V block jb of that
// head and batch, walked with or without the rotation; or block jb of K/V head kvh of batch b, for
// a grid whose blocks are not laid out that way), its walk over the steps, where a step's
// query rows start, and the cp.async loads of its tiles: the prologue the 2D kernel and rung 09's
// wgmma kernels share. Q, dO, L and D have two buffers (buffer buf at Qs + buf·BR·D, ...).
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
      : BlockTiles(copy, q, dout, lse, Dsum, Qs, dOs, Ls, Ds, heads, group, nq, nk, causal, blockIdx.x, true) {}
  __device__ BlockTiles(const Copy& copy, const T* q, const T* dout, const float* lse, const float* Dsum, T* Qs, T* dOs,
                        float* Ls, float* Ds, int heads, int group, int64_t nq, int64_t nk, bool causal, unsigned jb,
                        bool rotate)
      : BlockTiles(copy, q, dout, lse, Dsum, Qs, dOs, Ls, Ds, heads, group, nq, nk, causal, jb, rotate, blockIdx.y,
                   blockIdx.z) {}
  __device__ BlockTiles(const Copy& copy, const T* q, const T* dout, const float* lse, const float* Dsum, T* Qs, T* dOs,
                        float* Ls, float* Ds, int heads, int group, int64_t nq, int64_t nk, bool causal, unsigned jb,
                        bool rotate, unsigned kvh, unsigned b)
      : copy(copy), q(q), dout(dout), lse(lse), Dsum(Dsum), Qs(Qs), dOs(dOs), Ls(Ls), Ds(Ds),
        walk(jb, BC, nq, nk, causal, rotate), kv_row0((int64_t(b) * (heads / group) + kvh) * nk),
        q_head0((int64_t(b) * heads + int64_t(kvh) * group) * nq), nq(nq), steps(group * walk.n_ib) {}
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

// dQ = scale · accumulator, rounded to T, 8 elements per thread.
template <class T>
__global__ void convert_dq_kernel(const float* __restrict__ acc, T* __restrict__ dq, int64_t n8, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 x = reinterpret_cast<const float4*>(acc)[2 * i], y = reinterpret_cast<const float4*>(acc)[2 * i + 1];
    reinterpret_cast<uint4*>(dq)[i] = uint4{pack<T>(scale * x.x, scale * x.y), pack<T>(scale * x.z, scale * x.w),
                                            pack<T>(scale * y.x, scale * y.y), pack<T>(scale * y.z, scale * y.w)};
  }
}

// The three kernels of a backward call, on the call's stream: D and dQ's zeroed accumulator, the
// version's main kernel (threads, keys per block and shared memory from its configuration; `extra`
// arguments after the common ones) on `grid`, and dQ = scale · accumulator in the dtype.
template <class T, int D, class Kernel, class... Extra>
void run_kernels(dim3 grid, const AttentionShape& s, const BackwardArgs& a, Kernel kernel, int threads,
                 std::size_t smem_bytes, Extra... extra) {
  const cudaStream_t stream = as_stream(a.stream);
  unsigned char* ws = static_cast<unsigned char*>(a.workspace);
  float* Dsum = reinterpret_cast<float*>(ws);
  float* acc = reinterpret_cast<float*>(ws + dq_accum_offset(s));
  const int64_t rows = s.batch * s.heads * s.seq_q;
  preprocess_mma_kernel<T, D><<<unsigned(ceil_div<int64_t>(rows * (D / 8), 256)), 256, 0, stream>>>(
      static_cast<const T*>(a.o), static_cast<const T*>(a.dout), Dsum, acc, rows);
  FL_CUDA_CHECK_LAUNCH();

  static_assert(sizeof(T) == 2, "kSmemBytes counts 16-bit tiles");
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
  const float scale = s.softmax_scale();
  kernel<<<grid, threads, smem_bytes, stream>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
      static_cast<const T*>(a.dout), a.lse, Dsum, acc, static_cast<T*>(a.dk), static_cast<T*>(a.dv), int(s.heads),
      int(s.group()), s.seq_q, s.seq_k, scale * kLog2e, scale, s.causal, extra...);
  FL_CUDA_CHECK_LAUNCH();

  const int64_t n8 = s.q_elems() / 8;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div<int64_t>(n8, 256), 132 * 32));
  convert_dq_kernel<T><<<blocks, 256, 0, stream>>>(acc, static_cast<T*>(a.dq), n8, scale);
  FL_CUDA_CHECK_LAUNCH();
}
// The usual grid: a thread block for each K/V block of `block_keys` keys (x), KV head (y) and batch (z).
template <class T, int D, class Kernel, class... Extra>
void run_kernels(const AttentionShape& s, const BackwardArgs& a, Kernel kernel, int threads, int block_keys,
                 std::size_t smem_bytes, Extra... extra) {
  const dim3 grid(unsigned(ceil_div<int64_t>(s.seq_k, block_keys)), unsigned(s.kv_heads), unsigned(s.batch));
  run_kernels<T, D>(grid, s, a, kernel, threads, smem_bytes, extra...);
}

// Launch::run<T, D>(v, s, a) for the call's dtype and head dim, after the checks every version's
// kernels need: the grid's y and z limits, and 16-byte alignment. `name` is the version's
// registered name, for the messages; V is its rung's Version.
template <class Launch, class V>
void dispatch_named(const char* name, V v, const AttentionShape& s, DType t, const BackwardArgs& a) {
  const std::string who = std::string("rung ") + name + " (cuda): ";
  if (s.kv_heads > 65535 || s.batch > 65535) throw InputError(who + "kv_heads and batch must each be at most 65535");
  for (const void* p : {a.q, a.k, a.v, a.o, a.dout, static_cast<const void*>(a.dq), static_cast<const void*>(a.dk),
                        static_cast<const void*>(a.dv), static_cast<const void*>(a.workspace)})
    if (!is_aligned(p, 16))
      throw InputError(who + "q, k, v, o, dout, dq, dk, dv and the workspace must be 16-byte aligned (the kernels "
                             "move them in 16-byte pieces); cudaMalloc and PyTorch allocations are");
  dispatch_16bit<Launch, 64, 128>(who, t, s.head_dim, v, s, a);
}
template <class Launch>
void dispatch(Version v, const AttentionShape& s, DType t, const BackwardArgs& a) {
  dispatch_named<Launch>(info(v).name, v, s, t, a);
}

// Adds version v's kernels to the registry at program start.
template <class Launch>
struct RegisterKernel {
  explicit RegisterKernel(Version v) { Registry::instance().add(std::make_unique<BackwardRung<Backend::Cuda>>(v, &dispatch<Launch>)); }
};

}  // namespace fl::backward::tc
