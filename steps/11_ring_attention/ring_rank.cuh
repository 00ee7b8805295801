// What every GPU version of rung 11 shares: one rank of the ring in device memory (its Q shard, the
// K/V shard it visits and the one arriving, its running output in fp32) and the twin's step on the
// ladder's kernels: the rows plan_step names copied into dense staging arrays, the local forward
// rung on them, merge_kernel folding the result into the running output (rung 02's merge). The
// versions differ in how the K/V shards travel: v1_ring.cu copies them on one GPU, v2_nccl.cu
// sends them over NCCL.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_check.cuh"
#include "device.hpp"
#include "ring_gpu.hpp"

namespace fl::ring {

// The first of `names` that this build registers for CUDA, this GPU runs and that takes dtype t
// (gpu_local_rung and gpu_local_backward_rung); InputError naming `what` when none does.
template <std::size_t N>
const Rung& first_gpu_rung(const char* const (&names)[N], DType t, const char* what) {
  for (const char* name : names) {
    const Rung* r = Registry::instance().find(name, Backend::Cuda);
    if (!r || !r->unavailable().empty()) continue;
    const std::vector<DType> ts = r->caps().dtypes;
    if (std::find(ts.begin(), ts.end(), t) != ts.end()) return *r;
  }
  throw InputError(std::string("rung 11_ring_attention (cuda): no ") + what + " rung of this build runs " +
                   dtype_name(t) + " on this GPU");
}

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

template <class F>
__global__ void fill_kernel(F* x, F value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

// Rows [from, from + count) of every one of `groups` heads (n_src rows a head, `row_bytes` a row)
// to rows [to, to + count) of dst (n_dst rows a head): one 2-D copy.
inline void copy_rows(void* dst, int64_t n_dst, int64_t to, const void* src, int64_t n_src, int64_t from,
                      int64_t count, int64_t groups, std::size_t row_bytes, cudaStream_t st) {
  if (count == 0) return;
  FL_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst) + to * row_bytes, n_dst * row_bytes,
                                  static_cast<const char*>(src) + from * row_bytes, n_src * row_bytes,
                                  count * row_bytes, groups, cudaMemcpyDeviceToDevice, st));
}

// Where one rank's call spends its time, when the environment asks for it (FL_RING_PHASES=1): at
// each mark the rank's stream is drained and the wall time since the mark before noted; when the
// clock goes out of scope (declare it before the rank's buffers, so that their release counts in
// the last part) one line goes to stderr. Without the variable it does nothing: no
// synchronisation, no output, a normal call's timing untouched.
class PhaseClock {
 public:
  explicit PhaseClock(cudaStream_t st) : st_(st), on_(std::getenv("FL_RING_PHASES") != nullptr) {
    if (on_) t0_ = last_ = Clock::now();
  }
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  int rank = -1;  // for the line; the caller sets it once it knows
  void mark(const std::string& phase) {
    if (!on_) return;
    cudaStreamSynchronize(st_);  // a failure here surfaces in the call's own checks
    const Clock::time_point t = Clock::now();
    line_ += (line_.empty() ? "" : ", ") + phase + " " + ms(last_, t);
    last_ = t;
  }
  ~PhaseClock() {
    if (!on_) return;
    const Clock::time_point t = Clock::now();
    std::fprintf(stderr, "ring rank %d: %s, the rest (buffers freed) %s; in all %s ms\n", rank, line_.c_str(),
                 ms(last_, t).c_str(), ms(t0_, t).c_str());
  }

 private:
  using Clock = std::chrono::steady_clock;
  static std::string ms(Clock::time_point a, Clock::time_point b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", std::chrono::duration<double, std::milli>(b - a).count());
    return buf;
  }
  cudaStream_t st_;
  bool on_;
  Clock::time_point t0_, last_;
  std::string line_;
};

// The most a local rung asks for over every step of every rank (`need` of each step's own shape
// and mask), at least 16 bytes. Rung 08's v13 needs a forward workspace only where a non-causal
// walk splits its last round, and rung 09's v16 a larger backward one only where a non-causal
// backward splits its last wave; a smaller or unmasked step can do that where the whole causal
// step does not, and the bytes are not monotone in the shape (they follow the wave's remainder).
template <class Need>
inline std::size_t most_over_steps(const RingShape& s, Need need) {
  std::size_t ws = 16;
  for (int64_t rank = 0; rank < s.ranks; ++rank)
    for (int64_t step = 0; step < s.ranks; ++step) {
      const StepPlan pl = plan_step(s, rank, step);
      if (pl.nq == 0) continue;
      AttentionShape a = s.attn;
      a.seq_q = pl.nq, a.seq_k = pl.nk, a.causal = pl.causal;
      ws = std::max(ws, need(a));
    }
  return ws;
}
inline std::size_t step_workspace_bytes(const Rung& local, const RingShape& s, DType t) {
  return most_over_steps(s, [&](const AttentionShape& a) { return local.workspace_bytes(a, t); });
}
inline std::size_t step_backward_workspace_bytes(const Rung& local, const RingShape& s, DType t) {
  return most_over_steps(s, [&](const AttentionShape& a) { return local.backward_workspace_bytes(a, t); });
}

// Device memory one rank holds (RankState's buffers), for a check before any of it is taken.
inline std::size_t rank_bytes(const RingShape& s, DType t) {
  const int64_t L = s.local_len(), d = s.attn.head_dim, qh = s.attn.batch * s.attn.heads,
                kh = s.attn.batch * s.attn.kv_heads;
  const std::size_t row = std::size_t(d) * 2, q_bytes = std::size_t(qh * L) * row, kv_bytes = std::size_t(kh * L) * row;
  const std::size_t ws = step_workspace_bytes(gpu_local_rung(t), s, t);
  return 3 * q_bytes + 6 * kv_bytes + std::size_t(qh * L) * std::size_t(d + 2) * 4 + ws;
}

// One rank: its buffers on the current GPU and its steps. T is __half or __nv_bfloat16.
template <class T>
class RankState {
 public:
  RankState(const RingShape& s, DType t, int64_t rank, cudaStream_t st)
      : s_(s), t_(t), rank_(rank), st_(st), local_(gpu_local_rung(t)), L_(s.local_len()), d_(s.attn.head_dim),
        qh_(s.attn.batch * s.attn.heads), kh_(s.attn.batch * s.attn.kv_heads), row_(std::size_t(d_) * sizeof(T)),
        kv_bytes_(std::size_t(kh_ * L_) * row_) {
    const std::size_t q_bytes = std::size_t(qh_ * L_) * row_, ws = step_workspace_bytes(local_, s, t);
    gpu::require_memory(rank_bytes(s, t), "rank " + std::to_string(rank) + " of rung 11's ring (" + s.str() + ")");
    q_ = gpu::DeviceBuffer(q_bytes), kv_ = gpu::DeviceBuffer(2 * kv_bytes_), kv_next_ = gpu::DeviceBuffer(2 * kv_bytes_);
    o_ = gpu::DeviceBuffer(std::size_t(qh_ * L_ * d_) * 4), lse_ = gpu::DeviceBuffer(std::size_t(qh_ * L_) * 4);
    sq_ = gpu::DeviceBuffer(q_bytes), sk_ = gpu::DeviceBuffer(kv_bytes_), sv_ = gpu::DeviceBuffer(kv_bytes_);
    so_ = gpu::DeviceBuffer(q_bytes), sl_ = gpu::DeviceBuffer(std::size_t(qh_ * L_) * 4), ws_ = gpu::DeviceBuffer(ws);
    reset();
  }

  // The running output back to the empty state (O = 0, lse = −∞): before a call's first step.
  void reset() {
    FL_CUDA_CHECK(cudaMemsetAsync(o_.get(), 0, o_.size(), st_));
    fill_kernel<float><<<64, 256, 0, st_>>>(static_cast<float*>(lse_.get()), -INFINITY, qh_ * L_);
    FL_CUDA_CHECK_LAUNCH();
  }

  // The rank's shards from arrays laid out like its own ([B, H, L, d] and [B, Hkv, L, d], its
  // chunks in order: what the caller of the NCCL version holds), or cut from the whole problem's.
  void load_local(const T* q, const T* k, const T* v) {
    copy_rows(q_.get(), L_, 0, q, L_, 0, L_, qh_, row_, st_);
    copy_rows(kv_.get(), L_, 0, k, L_, 0, L_, kh_, row_, st_);
    copy_rows(static_cast<char*>(kv_.get()) + kv_bytes_, L_, 0, v, L_, 0, L_, kh_, row_, st_);
  }
  void load_from_whole(const T* q, const T* k, const T* v) {
    int64_t at = 0;
    for (int64_t c : s_.chunks_of(rank_)) {
      const int64_t g0 = c * s_.chunk_len(), n = s_.chunk_len(), N = s_.seq();
      copy_rows(q_.get(), L_, at, q, N, g0, n, qh_, row_, st_);
      copy_rows(kv_.get(), L_, at, k, N, g0, n, kh_, row_, st_);
      copy_rows(static_cast<char*>(kv_.get()) + kv_bytes_, L_, at, v, N, g0, n, kh_, row_, st_);
      at += n;
    }
  }

  // Step `step` of the twin: this rank's visible rows against the visiting shard, merged in.
  void compute(int64_t step) {
    const StepPlan pl = plan_step(s_, rank_, step);
    if (pl.nq == 0) return;  // nothing of the visiting shard is visible to this rank
    const char* kv = static_cast<const char*>(kv_.get());
    copy_rows(sq_.get(), pl.nq, 0, q_.get(), L_, pl.q0, pl.nq, qh_, row_, st_);
    copy_rows(sk_.get(), pl.nk, 0, kv, L_, pl.k0, pl.nk, kh_, row_, st_);
    copy_rows(sv_.get(), pl.nk, 0, kv + kv_bytes_, L_, pl.k0, pl.nk, kh_, row_, st_);
    AttentionShape a = s_.attn;
    a.seq_q = pl.nq, a.seq_k = pl.nk, a.causal = pl.causal;
    ForwardArgs fa;
    fa.q = sq_.get(), fa.k = sk_.get(), fa.v = sv_.get(), fa.o = so_.get(), fa.lse = static_cast<float*>(sl_.get());
    fa.workspace = ws_.get(), fa.stream = st_;
    local_.check(a, t_, fa);
    local_.forward(a, t_, fa);
    merge_kernel<T><<<unsigned(qh_ * pl.nq), 128, 0, st_>>>(static_cast<const T*>(so_.get()),
                                                             static_cast<const float*>(sl_.get()),
                                                             static_cast<float*>(o_.get()),
                                                             static_cast<float*>(lse_.get()), pl.nq, L_, pl.q0, int(d_));
    FL_CUDA_CHECK_LAUNCH();
  }

  // The shard that travels: K then V, 2·kv_bytes(); the next one lands in kv_next, then swap().
  void* kv() { return kv_.get(); }
  void* kv_next() { return kv_next_.get(); }
  std::size_t shard_bytes() const { return 2 * kv_bytes_; }
  void swap() { std::swap(kv_, kv_next_); }

  // The rank's rows, O rounded to T once: into arrays laid out like its own, or into the whole
  // problem's at their places.
  void store_local(T* o, float* lse) {
    round_kernel<T><<<256, 256, 0, st_>>>(static_cast<const float*>(o_.get()), o, qh_ * L_ * d_);
    FL_CUDA_CHECK_LAUNCH();
    copy_rows(lse, L_, 0, lse_.get(), L_, 0, L_, qh_, sizeof(float), st_);
  }
  void store_to_whole(T* o, float* lse) {
    round_kernel<T><<<256, 256, 0, st_>>>(static_cast<const float*>(o_.get()), static_cast<T*>(so_.get()), qh_ * L_ * d_);
    FL_CUDA_CHECK_LAUNCH();
    int64_t at = 0;
    for (int64_t c : s_.chunks_of(rank_)) {
      const int64_t g0 = c * s_.chunk_len(), n = s_.chunk_len(), N = s_.seq();
      copy_rows(o, N, g0, so_.get(), L_, at, n, qh_, row_, st_);
      copy_rows(lse, N, g0, lse_.get(), L_, at, n, qh_, sizeof(float), st_);
      at += n;
    }
  }

 private:
  RingShape s_;
  DType t_;
  int64_t rank_;
  cudaStream_t st_;
  const Rung& local_;
  int64_t L_, d_, qh_, kh_;
  std::size_t row_, kv_bytes_;
  gpu::DeviceBuffer q_, kv_, kv_next_, o_, lse_;     // the rank's own
  gpu::DeviceBuffer sq_, sk_, sv_, so_, sl_, ws_;    // a step's staging
};

// The checks every GPU version makes before any work.
inline void check_gpu_call(const RingShape& s, DType t, std::initializer_list<const void*> ptrs) {
  s.validate();
  auto bad = [](const std::string& w) { return InputError("rung 11_ring_attention (cuda): " + w); };
  if (t != DType::F16 && t != DType::BF16) throw bad(std::string("dtype ") + dtype_name(t) + ": fp16 and bf16 only");
  for (const void* p : ptrs)
    if (!p) throw bad("a null pointer among q, k, v, o and lse");
  AttentionShape step = s.attn;
  step.seq_q = step.seq_k = s.local_len();
  std::string why;
  if (!gpu_local_rung(t).supports(step, t, &why)) throw bad("its local rung refuses a step: " + why);
}

}  // namespace fl::ring
