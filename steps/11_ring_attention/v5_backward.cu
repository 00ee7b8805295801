// Rung 11, v5_backward: v4's rank with the backward pass on the GPUs (ring_gpu.hpp's NcclRank).
//
// What changed from v4: backward(). The K/V shards go around as in the forward, overlapped with
// the step the same way, and with each one travels an fp32 accumulator of its dK and dV (`dkv_`)
// to which every rank it visits adds its part. A step is the twin's (twin_ring_backward): the rows
// plan_step names (staged only where they are not the whole shard), the local backward rung on
// them with the GLOBAL O and lse of the rank's rows, then add_rows folds its dQ into the rank's
// fp32 dQ and its dK, dV into the visiting shard's accumulator. The accumulator can only move
// once the step has added to it, so it goes after the step (on the transfer stream, the compute
// stream waiting for it before the next step), every step, the last time home: after step P − 1
// rank r holds the accumulator of rank r + 1's shard, one hop away. Then dQ, dK, dV are rounded
// to the dtype once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ring_nccl.hpp"

namespace fl::ring {
namespace {

// acc[g, r0 + i, :] += part[g, i, :] for every one of `groups` heads: part [groups, n, d] in T,
// acc [groups, L, d] in fp32.
template <class T>
__global__ void add_rows(const T* __restrict__ part, float* __restrict__ acc, int64_t groups, int64_t n, int64_t L,
                         int64_t r0, int64_t d) {
  const int64_t total = groups * n * d, per_group = n * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / per_group, rest = i - g * per_group;
    acc[(g * L + r0) * d + rest] += float(part[i]);
  }
}

// Device memory the backward adds to a rank (rank_bytes is the forward's).
std::size_t backward_bytes(const RingShape& s, DType t) {
  const int64_t L = s.local_len(), d = s.attn.head_dim, qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads;
  const std::size_t e = dtype_bytes(t), q = std::size_t(qh * L * d), kv = std::size_t(kh * L * d);
  const std::size_t ws = step_backward_workspace_bytes(gpu_local_backward_rung(t), s, t);  // ring_rank.cuh
  return q * (4 * e + 4) + std::size_t(qh * L) * 4 + kv * (4 * e + 2 * 2 * 4) + ws;
}

template <class T>
class KeptRank final : public NcclRank {
 public:
  // Everything that can fail on this rank alone (the checks, every step's shape against the local
  // rung, the rank's device memory) happens before the agreement, so that its failure reaches
  // every rank there.
  KeptRank(const RingShape& s, DType t, ncclComm_t comm, cudaStream_t st, const std::string& refused)
      : s_(s), t_(t), comm_(comm), st_(st), bwd_(gpu_local_backward_rung(t)), qh_(s.attn.batch * s.attn.heads),
        kh_(s.attn.batch * s.attn.kv_heads) {
    std::string local_error;
    try {
      me_ = check_rank(s, t, comm, refused, {}, /*backward=*/true);  // ring_nccl.hpp
      gpu::require_memory(rank_bytes(s, t) + backward_bytes(s, t), "a rank of rung 11's ring (" + s.str() + ")");
      if (me_ < s.ranks) R_ = std::make_unique<RankState<T>>(s, t, me_, st);
      if (R_) {  // a call with null pointers passes on written memory, never uninitialised
        FL_CUDA_CHECK(cudaMemsetAsync(R_->kv(), 0, R_->shard_bytes(), st));
        FL_CUDA_CHECK(cudaMemsetAsync(R_->kv_next(), 0, R_->shard_bytes(), st));
      }
      flag_ = gpu::DeviceBuffer(sizeof(int));
      const int64_t L = s.local_len(), d = s.attn.head_dim;
      const std::size_t q = std::size_t(qh_ * L * d), kv = std::size_t(kh_ * L * d), e = sizeof(T);
      dq_ = gpu::DeviceBuffer(q * 4), dkv_ = gpu::DeviceBuffer(2 * kv * 4), dkv_next_ = gpu::DeviceBuffer(2 * kv * 4);
      sq_ = gpu::DeviceBuffer(q * e), so_ = gpu::DeviceBuffer(q * e), sdo_ = gpu::DeviceBuffer(q * e);
      sl_ = gpu::DeviceBuffer(std::size_t(qh_ * L) * 4), pdq_ = gpu::DeviceBuffer(q * e);
      sk_ = gpu::DeviceBuffer(kv * e), sv_ = gpu::DeviceBuffer(kv * e), pdk_ = gpu::DeviceBuffer(kv * e),
      pdv_ = gpu::DeviceBuffer(kv * e);
      ws_ = gpu::DeviceBuffer(step_backward_workspace_bytes(bwd_, s, t));  // each step's own shape
      FL_CUDA_CHECK(cudaMemsetAsync(dkv_next_.get(), 0, dkv_next_.size(), st));  // what NCCL overwrites, initialised
      // The transfers' stream at the highest priority: the local forward's persistent grid takes
      // every SM for the whole step, so a transfer kernel not placed before it waits for the
      // step's end, and holds its peer's SMs all that while (see the appendix).
      int lowest = 0, highest = 0;
      FL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
      FL_CUDA_CHECK(cudaStreamCreateWithPriority(&moving_, cudaStreamNonBlocking, highest));
      FL_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      FL_CUDA_CHECK(cudaEventCreateWithFlags(&moved_, cudaEventDisableTiming));
      FL_CUDA_CHECK(cudaEventCreateWithFlags(&added_, cudaEventDisableTiming));
    } catch (const std::exception& e) {
      local_error = e.what();
    } catch (...) {
      local_error = "an unknown error while opening the rank";
    }
    try {
      agree_or_throw(s, t, local_error, comm, st);
    } catch (...) {
      release();
      throw;
    }
  }
  ~KeptRank() override { release(); }
  std::string version() const override { return "v5_backward"; }

  // A step that fails (a CUDA error) does not stop the ring: the rank keeps passing the shards
  // on, so the other ranks finish, and throws at the end.
  void forward(const void* q, const void* k, const void* v, void* o, float* lse) override {
    PhaseClock clock(st_);  // FL_RING_PHASES=1: where the call's time goes (ring_rank.cuh)
    clock.rank = me_;
    const bool mine = q && k && v && o && lse;
    int* flag = static_cast<int*>(flag_.get());
    R_->reset();
    if (mine) R_->load_local(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v));
    FL_CUDA_CHECK(cudaEventRecord(ready_, st_));
    FL_CUDA_CHECK(cudaStreamWaitEvent(moving_, ready_, 0));
    vote(flag, mine, comm_, moving_);
    clock.mark("set-up");

    const int P = int(s_.ranks);
    std::string failed;  // a step's error, said once the ring is done
    for (int step = 0; step < P; ++step) {
      if (step + 1 < P) {  // this step's shard goes on while the step computes on it
        FL_CUDA_CHECK(cudaStreamWaitEvent(moving_, ready_, 0));
        send_recv(R_->kv(), R_->kv_next(), R_->shard_bytes(), (me_ + 1) % P, (me_ + P - 1) % P, comm_, moving_);
        FL_CUDA_CHECK(cudaEventRecord(moved_, moving_));
      }
      if (mine && failed.empty()) {
        try {
          R_->compute(step);
        } catch (const std::exception& e) {
          failed = e.what();
        }
      }
      clock.mark("step " + std::to_string(step));
      if (step + 1 == P) break;
      FL_CUDA_CHECK(cudaStreamWaitEvent(st_, moved_, 0));  // the next step reads what arrived
      R_->swap();
      FL_CUDA_CHECK(cudaEventRecord(ready_, st_));  // and the buffer this step read may be written
      clock.mark("transfer " + std::to_string(step));
    }
    if (mine && failed.empty()) R_->store_local(static_cast<T*>(o), lse);
    FL_CUDA_CHECK(cudaEventRecord(moved_, moving_));  // the vote (and the last transfer) done
    FL_CUDA_CHECK(cudaStreamWaitEvent(st_, moved_, 0));
    count_votes(flag, mine, st_);  // waits for the stream
    clock.mark("store");
    if (!failed.empty()) throw CudaError("rung 11_ring_attention (nccl): rank " + std::to_string(me_) + ": " + failed);
  }

  bool has_backward() const override { return true; }

  // The forward's ring with the gradients: K/V shards overlapped with the steps as in forward(),
  // their dK/dV accumulators after each step. A failed step is handled as in forward().
  void backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* dout,
                void* dq, void* dk, void* dv) override {
    PhaseClock clock(st_);
    clock.rank = me_;
    const bool mine = q && k && v && o && lse && dout && dq && dk && dv;
    int* flag = static_cast<int*>(flag_.get());
    const int64_t L = s_.local_len();
    const std::size_t row = std::size_t(s_.attn.head_dim) * sizeof(T), half = R_->shard_bytes() / 2;
    if (mine) {  // the rank's own K/V shard starts the ring
      copy_rows(R_->kv(), L, 0, k, L, 0, L, kh_, row, st_);
      copy_rows(static_cast<char*>(R_->kv()) + half, L, 0, v, L, 0, L, kh_, row, st_);
    }
    FL_CUDA_CHECK(cudaMemsetAsync(dq_.get(), 0, dq_.size(), st_));
    FL_CUDA_CHECK(cudaMemsetAsync(dkv_.get(), 0, dkv_.size(), st_));
    FL_CUDA_CHECK(cudaEventRecord(ready_, st_));
    FL_CUDA_CHECK(cudaStreamWaitEvent(moving_, ready_, 0));
    vote(flag, mine, comm_, moving_);
    clock.mark("set-up");

    const int P = int(s_.ranks);
    const int to = (me_ + 1) % P, from = (me_ + P - 1) % P;
    std::string failed;
    for (int step = 0; step < P; ++step) {
      if (step + 1 < P) {  // K/V go on while the step computes, as in the forward
        FL_CUDA_CHECK(cudaStreamWaitEvent(moving_, ready_, 0));
        send_recv(R_->kv(), R_->kv_next(), R_->shard_bytes(), to, from, comm_, moving_);
      }
      if (mine && failed.empty()) {
        try {
          step_backward(step, static_cast<const T*>(q), static_cast<const T*>(o), lse, static_cast<const T*>(dout));
        } catch (const std::exception& e) {
          failed = e.what();
        }
      }
      clock.mark("step " + std::to_string(step));
      if (P > 1) {  // the accumulator the step added to goes on, the last time home
        FL_CUDA_CHECK(cudaEventRecord(added_, st_));
        FL_CUDA_CHECK(cudaStreamWaitEvent(moving_, added_, 0));
        send_recv(dkv_.get(), dkv_next_.get(), dkv_.size(), to, from, comm_, moving_);
        FL_CUDA_CHECK(cudaEventRecord(moved_, moving_));
        FL_CUDA_CHECK(cudaStreamWaitEvent(st_, moved_, 0));
        std::swap(dkv_, dkv_next_);
        if (step + 1 < P) R_->swap();
        FL_CUDA_CHECK(cudaEventRecord(ready_, st_));
      }
      clock.mark("transfer " + std::to_string(step));
    }
    if (mine && failed.empty()) {
      const int64_t nq = qh_ * L * s_.attn.head_dim, nk = kh_ * L * s_.attn.head_dim;
      const float* acc = static_cast<const float*>(dkv_.get());
      round_kernel<T><<<1024, 256, 0, st_>>>(static_cast<const float*>(dq_.get()), static_cast<T*>(dq), nq);
      round_kernel<T><<<1024, 256, 0, st_>>>(acc, static_cast<T*>(dk), nk);
      round_kernel<T><<<1024, 256, 0, st_>>>(acc + nk, static_cast<T*>(dv), nk);
      FL_CUDA_CHECK_LAUNCH();
    }
    FL_CUDA_CHECK(cudaEventRecord(moved_, moving_));  // the vote (and the last transfer) done
    FL_CUDA_CHECK(cudaStreamWaitEvent(st_, moved_, 0));
    count_votes(flag, mine, st_);
    clock.mark("store");
    if (!failed.empty()) throw CudaError("rung 11_ring_attention (nccl): rank " + std::to_string(me_) + ": " + failed);
  }

 private:
  // Step `step` of twin_ring_backward on this rank: the block pair's dQ into dq_, its dK and dV into
  // the visiting shard's accumulator.
  void step_backward(int step, const T* q, const T* o, const float* lse, const T* dout) {
    const StepPlan pl = plan_step(s_, me_, step);
    if (pl.nq == 0) return;  // nothing of the visiting shard is visible to this rank
    const int64_t L = s_.local_len(), d = s_.attn.head_dim;
    const std::size_t row = std::size_t(d) * sizeof(T);
    // The rows r0 .. r0 + n of every head: the array itself when that is all of it, else a copy.
    auto rows = [&](const void* src, gpu::DeviceBuffer& stage, int64_t groups, std::size_t bytes, int64_t r0,
                    int64_t n) -> const void* {
      if (r0 == 0 && n == L) return src;
      copy_rows(stage.get(), n, 0, src, L, r0, n, groups, bytes, st_);
      return stage.get();
    };
    const char* kv = static_cast<const char*>(R_->kv());
    AttentionShape a = s_.attn;
    a.seq_q = pl.nq, a.seq_k = pl.nk, a.causal = pl.causal;
    BackwardArgs ba;
    ba.q = rows(q, sq_, qh_, row, pl.q0, pl.nq), ba.o = rows(o, so_, qh_, row, pl.q0, pl.nq);
    ba.dout = rows(dout, sdo_, qh_, row, pl.q0, pl.nq);
    ba.lse = static_cast<const float*>(rows(lse, sl_, qh_, sizeof(float), pl.q0, pl.nq));
    ba.k = rows(kv, sk_, kh_, row, pl.k0, pl.nk), ba.v = rows(kv + R_->shard_bytes() / 2, sv_, kh_, row, pl.k0, pl.nk);
    ba.dq = pdq_.get(), ba.dk = pdk_.get(), ba.dv = pdv_.get(), ba.workspace = ws_.get(), ba.stream = st_;
    bwd_.check(a, t_, ba);
    bwd_.backward(a, t_, ba);
    float* acc = static_cast<float*>(dkv_.get());
    add_rows<T><<<1024, 256, 0, st_>>>(static_cast<const T*>(pdq_.get()), static_cast<float*>(dq_.get()), qh_, pl.nq, L,
                                       pl.q0, d);
    add_rows<T><<<1024, 256, 0, st_>>>(static_cast<const T*>(pdk_.get()), acc, kh_, pl.nk, L, pl.k0, d);
    add_rows<T><<<1024, 256, 0, st_>>>(static_cast<const T*>(pdv_.get()), acc + kh_ * L * d, kh_, pl.nk, L, pl.k0, d);
    FL_CUDA_CHECK_LAUNCH();
  }

  RingShape s_;
  DType t_;
  ncclComm_t comm_;
  cudaStream_t st_;
  const Rung& bwd_;  // the local backward rung
  int64_t qh_, kh_;
  int me_ = 0;
  std::unique_ptr<RankState<T>> R_;
  gpu::DeviceBuffer flag_;  // the call's vote
  gpu::DeviceBuffer dq_, dkv_, dkv_next_;  // fp32: the rank's dQ; the visiting shard's dK, dV and the next one's
  gpu::DeviceBuffer sq_, so_, sdo_, sl_, sk_, sv_, pdq_, pdk_, pdv_, ws_;  // a backward step's staging and output
  cudaStream_t moving_ = nullptr;  // the transfers' stream
  cudaEvent_t ready_ = nullptr, moved_ = nullptr, added_ = nullptr;
  void release() {
    if (moving_) cudaStreamSynchronize(moving_), cudaStreamDestroy(moving_);
    if (ready_) cudaEventDestroy(ready_);
    if (moved_) cudaEventDestroy(moved_);
    if (added_) cudaEventDestroy(added_);
    moving_ = nullptr, ready_ = moved_ = added_ = nullptr;
  }
};

}  // namespace

std::unique_ptr<NcclRank> open_v5_backward(const RingShape& s, DType t, ncclComm_t comm, cudaStream_t st,
                                       const std::string& refused) {
  if (t == DType::F16) return std::make_unique<KeptRank<__half>>(s, t, comm, st, refused);
  return std::make_unique<KeptRank<__nv_bfloat16>>(s, t, comm, st, refused);  // fp32 and others: refused in the checks
}

const Rung& gpu_local_backward_rung(DType t) { return first_gpu_rung(kLocalBackwards, t, "backward"); }

}  // namespace fl::ring
