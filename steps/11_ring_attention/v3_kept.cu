// Rung 11, v3_kept: v2's rank kept from one call to the next (ring_gpu.hpp's NcclRank).
//
// What changed from v2: on two H200s v2 spent more time around the ring than in it at N = 65536
// (a call took 58 ms of which 28 ms were its two steps: 23 ms of set-up, mostly allocating its
// buffers, 4 ms freeing them, under half a millisecond agreeing). Here a rank is opened once (nccl_ring_open): its
// checks, the ranks' agreement and its buffers happen then, and every call after that only loads
// the shards, runs the ring's steps and stores its rows. A call's pointers are the only thing
// that can still differ from rank to rank; the ranks vote on them without waiting (vote and
// count_votes in ring_nccl.hpp) and all throw at the end if one was handed a null pointer. The
// transfers still wait for the step before them.
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
    } catch (const std::exception& e) {
      local_error = e.what();
    } catch (...) {
      local_error = "an unknown error while opening the rank";
    }
    agree_or_throw(s, t, local_error, comm, st);
  }
  std::string version() const override { return "v3_kept"; }

  // A step that fails (a CUDA error) does not stop the ring: the rank keeps passing the shards
  // on, so the other ranks finish, and throws at the end.
  void forward(const void* q, const void* k, const void* v, void* o, float* lse) override {
    PhaseClock clock(st_);  // FL_RING_PHASES=1: where the call's time goes (ring_rank.cuh)
    clock.rank = me_;
    const bool mine = q && k && v && o && lse;
    int* flag = static_cast<int*>(flag_.get());
    vote(flag, mine, comm_, st_);
    R_->reset();
    if (mine) R_->load_local(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v));
    clock.mark("set-up");

    const int P = int(s_.ranks);
    std::string failed;  // a step's error, said once the ring is done
    for (int step = 0; step < P; ++step) {
      if (mine && failed.empty()) {
        try {
          R_->compute(step);
        } catch (const std::exception& e) {
          failed = e.what();
        }
      }
      clock.mark("step " + std::to_string(step));
      if (step + 1 == P) break;
      send_recv(R_->kv(), R_->kv_next(), R_->shard_bytes(), (me_ + 1) % P, (me_ + P - 1) % P, comm_, st_);
      R_->swap();
      clock.mark("transfer " + std::to_string(step));
    }
    if (mine && failed.empty()) R_->store_local(static_cast<T*>(o), lse);
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
};

}  // namespace

std::unique_ptr<NcclRank> open_v3_kept(const RingShape& s, DType t, ncclComm_t comm, cudaStream_t st,
                                       const std::string& refused) {
  if (t == DType::F16) return std::make_unique<KeptRank<__half>>(s, t, comm, st, refused);
  return std::make_unique<KeptRank<__nv_bfloat16>>(s, t, comm, st, refused);  // fp32 and others: refused in the checks
}

}  // namespace fl::ring
