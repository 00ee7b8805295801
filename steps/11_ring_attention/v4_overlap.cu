// Rung 11, v4_overlap: v3's kept rank with the transfers on a stream of their own, overlapped
// with the step (ring_gpu.hpp's NcclRank).
//
// What changed from v3: a step only reads the K/V shard it visits, so that shard can go on to
// rank r + 1 while the step computes on it, and the next one can land in the other buffer. The
// rank owns a second stream for NCCL (`moving_`); two events order the streams: `ready_` (on the
// compute stream: the shard is loaded, or the step before is done reading the buffer the next
// shard lands in) before each transfer, and `moved_` (on the transfer stream: the next shard has
// arrived) before the next step. A step then costs the larger of its compute and its transfer,
// not their sum. The call's vote goes on the transfer stream too, so that every NCCL call of a
// rank is issued on one stream in one order. That stream has the highest priority: the local
// forward's grid is persistent (a block on every SM for the whole step), and on two H200s a
// transfer kernel that was not placed first waited for the step to end while its peer's held SMs
// (at N = 131072 a forward took 166 ms against v3's 124; with the priority, 123).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <string>

#include "ring_nccl.hpp"

namespace fl::ring {
namespace {

template <class T>
class KeptRank final : public NcclRank {
 public:
  // Everything that can fail on this rank alone (the checks, every step's shape against the local
  // rung, the rank's device memory) happens before the agreement, so that its failure reaches
  // every rank there.
  KeptRank(const RingShape& s, DType t, ncclComm_t comm, cudaStream_t st, const std::string& refused)
      : s_(s), t_(t), comm_(comm), st_(st) {
    std::string local_error;
    try {
      me_ = check_rank(s, t, comm, refused, {});  // ring_nccl.hpp
      gpu::require_memory(rank_bytes(s, t), "a rank of rung 11's ring (" + s.str() + ")");
      if (me_ < s.ranks) R_ = std::make_unique<RankState<T>>(s, t, me_, st);
      if (R_) {  // a call with null pointers passes on written memory, never uninitialised
        FL_CUDA_CHECK(cudaMemsetAsync(R_->kv(), 0, R_->shard_bytes(), st));
        FL_CUDA_CHECK(cudaMemsetAsync(R_->kv_next(), 0, R_->shard_bytes(), st));
      }
      flag_ = gpu::DeviceBuffer(sizeof(int));
      // The transfers' stream at the highest priority: the local forward's persistent grid takes
      // every SM for the whole step, so a transfer kernel not placed before it waits for the
      // step's end, and holds its peer's SMs all that while (see the appendix).
      int lowest = 0, highest = 0;
      FL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
      FL_CUDA_CHECK(cudaStreamCreateWithPriority(&moving_, cudaStreamNonBlocking, highest));
      FL_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      FL_CUDA_CHECK(cudaEventCreateWithFlags(&moved_, cudaEventDisableTiming));
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
  std::string version() const override { return "v4_overlap"; }

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

 private:
  RingShape s_;
  DType t_;
  ncclComm_t comm_;
  cudaStream_t st_;
  int me_ = 0;
  std::unique_ptr<RankState<T>> R_;
  gpu::DeviceBuffer flag_;  // the call's vote
  cudaStream_t moving_ = nullptr;  // the transfers' stream
  cudaEvent_t ready_ = nullptr, moved_ = nullptr;
  void release() {
    if (moving_) cudaStreamSynchronize(moving_), cudaStreamDestroy(moving_);
    if (ready_) cudaEventDestroy(ready_);
    if (moved_) cudaEventDestroy(moved_);
    moving_ = nullptr, ready_ = moved_ = nullptr;
  }
};

}  // namespace

std::unique_ptr<NcclRank> open_v4_overlap(const RingShape& s, DType t, ncclComm_t comm, cudaStream_t st,
                                       const std::string& refused) {
  if (t == DType::F16) return std::make_unique<KeptRank<__half>>(s, t, comm, st, refused);
  return std::make_unique<KeptRank<__nv_bfloat16>>(s, t, comm, st, refused);  // fp32 and others: refused in the checks
}

}  // namespace fl::ring
