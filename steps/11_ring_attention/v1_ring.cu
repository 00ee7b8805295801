// Rung 11, v1_ring: the ring's forward on one GPU, every rank in turn (ring_gpu.hpp).
//
// Each rank holds its Q shard, the K/V shard it is visiting and the one arriving, and its running
// output in fp32 (O and lse). A step is the twin's: plan_step picks the rows of Q and of the
// visiting K/V that see each other; those rows are copied into dense staging arrays (one 2-D copy
// each: the same rows of every head), the local forward rung runs on them, and merge_kernel folds
// its O and lse into the rank's running ones with rung 02's merge. Then every rank's K/V shard
// goes to the next rank (a device copy here; ncclSend and ncclRecv in the NCCL version). At the
// end each rank's rows are rounded to the dtype and copied to their places in O and lse.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_check.cuh"
#include "device.hpp"
#include "ring_gpu.hpp"

namespace fl::ring {
namespace {

InputError bad(const std::string& what) { return InputError("rung 11_ring_attention (cuda): " + what); }

// Folds a step's rows into a rank's running output: row i of every head of (o_p, lse_p) [groups,
// n, d] into row r0 + i of (o_acc, lse_acc) [groups, L, d]. One block a row.
template <class T>
__global__ void merge_kernel(const T* __restrict__ o_p, const float* __restrict__ lse_p, float* __restrict__ o_acc,
                             float* __restrict__ lse_acc, int64_t n, int64_t L, int64_t r0, int d) {
  const int64_t row = blockIdx.x, g = row / n, i = row % n;
  float* acc_lse = lse_acc + g * L + r0 + i;
  const float l = *acc_lse, lp = lse_p[row], m = fmaxf(l, lp);
  if (m == -INFINITY) return;  // neither side saw a key: O stays 0, lse −∞
  const float a = expf(l - m), b = expf(lp - m), sum = a + b;
  float* out = o_acc + (g * L + r0 + i) * d;
  const T* part = o_p + row * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) out[c] = (a * out[c] + b * float(part[c])) / sum;
  __syncthreads();  // every thread has read *acc_lse
  if (threadIdx.x == 0) *acc_lse = m + logf(sum);
}

template <class T>
__global__ void round_kernel(const float* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = T(x[i]);
}

__global__ void fill_kernel(float* x, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

// Rows [from, from + count) of every one of `groups` heads (n_src rows a head, `row_bytes` a row)
// to rows [to, to + count) of dst (n_dst rows a head): one 2-D copy.
void copy_rows(void* dst, int64_t n_dst, int64_t to, const void* src, int64_t n_src, int64_t from, int64_t count,
               int64_t groups, std::size_t row_bytes, cudaStream_t st) {
  if (count == 0) return;
  FL_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst) + to * row_bytes, n_dst * row_bytes,
                                  static_cast<const char*>(src) + from * row_bytes, n_src * row_bytes,
                                  count * row_bytes, groups, cudaMemcpyDeviceToDevice, st));
}

template <class T>
void forward(const RingShape& s, DType t, const T* q, const T* k, const T* v, T* o, float* lse, cudaStream_t st) {
  const Rung& local = gpu_local_rung(t);
  const int64_t P = s.ranks, N = s.seq(), L = s.local_len(), d = s.attn.head_dim;
  const int64_t qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads;
  const std::size_t row = std::size_t(d) * sizeof(T), q_bytes = std::size_t(qh * L) * row,
                    kv_bytes = std::size_t(kh * L) * row;  // one of K or V of a shard
  AttentionShape whole_step = s.attn;  // the largest step: L queries, L keys
  whole_step.seq_q = whole_step.seq_k = L;
  const std::size_t ws_bytes = std::max<std::size_t>(16, local.workspace_bytes(whole_step, t));
  gpu::require_memory(std::size_t(P) * (q_bytes + 4 * kv_bytes + std::size_t(qh * L) * (d + 1) * 4) + 2 * q_bytes +
                          2 * kv_bytes + std::size_t(qh * L) * 4 + ws_bytes,
                      "rung 11's ring of " + std::to_string(P) + " ranks on one GPU (" + s.str() + ")");
  struct Rank {
    gpu::DeviceBuffer q, kv, kv_next, o, lse;  // kv: K then V of the shard being visited
  };
  std::vector<Rank> ranks(static_cast<std::size_t>(P));
  gpu::DeviceBuffer sq(q_bytes), sk(kv_bytes), sv(kv_bytes), so(q_bytes), sl(std::size_t(qh * L) * 4), ws(ws_bytes);
  for (int64_t r = 0; r < P; ++r) {  // the shards, and an empty running output
    Rank& R = ranks[std::size_t(r)];
    R.q = gpu::DeviceBuffer(q_bytes), R.kv = gpu::DeviceBuffer(2 * kv_bytes), R.kv_next = gpu::DeviceBuffer(2 * kv_bytes);
    R.o = gpu::DeviceBuffer(std::size_t(qh * L * d) * 4), R.lse = gpu::DeviceBuffer(std::size_t(qh * L) * 4);
    int64_t at = 0;
    for (int64_t c : s.chunks_of(r)) {
      const int64_t g0 = c * s.chunk_len(), n = s.chunk_len();
      copy_rows(R.q.get(), L, at, q, N, g0, n, qh, row, st);
      copy_rows(R.kv.get(), L, at, k, N, g0, n, kh, row, st);
      copy_rows(static_cast<char*>(R.kv.get()) + kv_bytes, L, at, v, N, g0, n, kh, row, st);
      at += n;
    }
    FL_CUDA_CHECK(cudaMemsetAsync(R.o.get(), 0, R.o.size(), st));
    fill_kernel<<<64, 256, 0, st>>>(static_cast<float*>(R.lse.get()), -INFINITY, qh * L);
    FL_CUDA_CHECK_LAUNCH();
  }
  for (int64_t step = 0; step < P; ++step) {
    for (int64_t r = 0; r < P; ++r) {
      Rank& R = ranks[std::size_t(r)];
      const StepPlan pl = plan_step(s, r, step);
      if (pl.nq == 0) continue;  // nothing of the visiting shard is visible to this rank
      const char* kv = static_cast<const char*>(R.kv.get());
      copy_rows(sq.get(), pl.nq, 0, R.q.get(), L, pl.q0, pl.nq, qh, row, st);
      copy_rows(sk.get(), pl.nk, 0, kv, L, pl.k0, pl.nk, kh, row, st);
      copy_rows(sv.get(), pl.nk, 0, kv + kv_bytes, L, pl.k0, pl.nk, kh, row, st);
      AttentionShape a = s.attn;
      a.seq_q = pl.nq, a.seq_k = pl.nk, a.causal = pl.causal;
      ForwardArgs fa;
      fa.q = sq.get(), fa.k = sk.get(), fa.v = sv.get(), fa.o = so.get(), fa.lse = static_cast<float*>(sl.get());
      fa.workspace = ws.get(), fa.stream = st;
      local.check(a, t, fa);
      local.forward(a, t, fa);
      merge_kernel<T><<<unsigned(qh * pl.nq), 128, 0, st>>>(static_cast<const T*>(so.get()),
                                                             static_cast<const float*>(sl.get()),
                                                             static_cast<float*>(R.o.get()),
                                                             static_cast<float*>(R.lse.get()), pl.nq, L, pl.q0, int(d));
      FL_CUDA_CHECK_LAUNCH();
    }
    if (step + 1 == P) break;
    for (int64_t r = 0; r < P; ++r)  // every shard to the next rank: ncclSend / ncclRecv on GPUs
      FL_CUDA_CHECK(cudaMemcpyAsync(ranks[std::size_t((r + 1) % P)].kv_next.get(), ranks[std::size_t(r)].kv.get(),
                                    2 * kv_bytes, cudaMemcpyDeviceToDevice, st));
    for (Rank& R : ranks) std::swap(R.kv, R.kv_next);
  }
  for (int64_t r = 0; r < P; ++r) {  // each rank's rows, O rounded to T once, to their places
    Rank& R = ranks[std::size_t(r)];
    round_kernel<T><<<256, 256, 0, st>>>(static_cast<const float*>(R.o.get()), static_cast<T*>(so.get()), qh * L * d);
    FL_CUDA_CHECK_LAUNCH();
    int64_t at = 0;
    for (int64_t c : s.chunks_of(r)) {
      const int64_t g0 = c * s.chunk_len(), n = s.chunk_len();
      copy_rows(o, N, g0, so.get(), L, at, n, qh, row, st);
      copy_rows(lse, N, g0, R.lse.get(), L, at, n, qh, sizeof(float), st);
      at += n;
    }
  }
  // The staging and the ranks' buffers are freed when this returns: wait for the queued work.
  FL_CUDA_CHECK(cudaStreamSynchronize(st));
}

}  // namespace

const Rung& gpu_local_rung(DType t) {
  for (const char* name : {"08_hopper_forward/v6_wide_qk", "06_tensor_core_mma/v9_one_sync"}) {
    const Rung* r = Registry::instance().find(name, Backend::Cuda);
    if (!r || !r->unavailable().empty()) continue;
    const std::vector<DType> ts = r->caps().dtypes;
    if (std::find(ts.begin(), ts.end(), t) != ts.end()) return *r;
  }
  throw bad(std::string("no forward rung of this build runs ") + dtype_name(t) + " on this GPU");
}

void gpu_ring_forward_local(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o,
                            float* lse, void* stream) {
  s.validate();
  if (t != DType::F16 && t != DType::BF16) throw bad(std::string("dtype ") + dtype_name(t) + ": fp16 and bf16 only");
  if (!q || !k || !v || !o || !lse) throw bad("q, k, v, o and lse must not be null");
  AttentionShape step = s.attn;
  step.seq_q = step.seq_k = s.local_len();
  std::string why;
  if (!gpu_local_rung(t).supports(step, t, &why)) throw bad("its local rung refuses a step: " + why);
  const cudaStream_t st = as_stream(stream);
  if (t == DType::F16)
    forward(s, t, static_cast<const __half*>(q), static_cast<const __half*>(k), static_cast<const __half*>(v),
            static_cast<__half*>(o), lse, st);
  else
    forward(s, t, static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
            static_cast<const __nv_bfloat16*>(v), static_cast<__nv_bfloat16*>(o), lse, st);
}

}  // namespace fl::ring
