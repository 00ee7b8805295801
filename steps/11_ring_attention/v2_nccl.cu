// Rung 11, v2_nccl: v1's ring with one rank per GPU, the K/V shards over NCCL (ring_gpu.hpp).
//
// What changed from v1: a call is one rank. Its shards are the caller's own arrays; after each
// step it sends its K/V shard to rank r + 1 and receives the next from rank r − 1, both in one
// NCCL group (ncclSend and ncclRecv between ncclGroupStart and ncclGroupEnd, so neither waits for
// the other), on the call's stream. The transfer still waits for the step before it: hiding it
// behind the next step's compute is the next version. Before anything else the ranks agree on the
// problem (agree_or_throw), so that a rank with other arguments cannot leave the rest hanging in a
// transfer that never comes. Non-blocking communicators (ncclInProgress) are not supported.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <string>

#include "ring_nccl.hpp"

namespace fl::ring {
namespace {

// One rank. Everything that can fail on this rank alone (the checks, every step's shape against
// the local rung, the rank's device memory) happens before the agreement, so that its failure
// reaches every rank there. After it, a step that still fails (a CUDA error) does not stop the
// ring: the rank keeps passing the shards on, so the other ranks finish, and throws at the end.
template <class T>
void run(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o, float* lse,
         ncclComm_t comm, cudaStream_t st, const std::string& refused) {
  std::string local_error;
  int me = 0;
  PhaseClock clock(st);  // FL_RING_PHASES=1: where the call's time goes (ring_rank.cuh)
  std::unique_ptr<RankState<T>> R;
  try {
    me = check_rank(s, t, comm, refused, {q, k, v, o, lse});  // ring_nccl.hpp
    clock.rank = me;
    gpu::require_memory(rank_bytes(s, t), "a rank of rung 11's ring (" + s.str() + ")");
    if (me < s.ranks) {
      R = std::make_unique<RankState<T>>(s, t, me, st);
      R->load_local(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v));
    }
  } catch (const std::exception& e) {
    local_error = e.what();
  } catch (...) {
    local_error = "an unknown error before the ring started";
  }
  clock.mark("set-up");
  agree_or_throw(s, t, local_error, comm, st);
  clock.mark("agreement");

  const int P = int(s.ranks);
  std::string failed;  // a step's error, said once the ring is done
  for (int step = 0; step < P; ++step) {
    if (failed.empty()) {
      try {
        R->compute(step);
      } catch (const std::exception& e) {
        failed = e.what();
      }
    }
    clock.mark("step " + std::to_string(step));
    if (step + 1 == P) break;
    send_recv(R->kv(), R->kv_next(), R->shard_bytes(), (me + 1) % P, (me + P - 1) % P, comm, st);
    R->swap();
    clock.mark("transfer " + std::to_string(step));
  }
  if (failed.empty()) R->store_local(static_cast<T*>(o), lse);
  FL_CUDA_CHECK(cudaStreamSynchronize(st));  // the rank's buffers are freed when this returns
  clock.mark("store");
  if (!failed.empty()) throw CudaError("rung 11_ring_attention (nccl): rank " + std::to_string(me) + ": " + failed);
}

}  // namespace

void nccl_ring_forward(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                       void* comm_ptr, void* stream, const std::string& refused) {
  if (!comm_ptr) throw nccl_bad("comm is null: pass the ncclComm_t of the ring's ranks");
  const ncclComm_t comm = static_cast<ncclComm_t>(comm_ptr);
  const cudaStream_t st = as_stream(stream);
  if (t == DType::F16) run<__half>(s, t, q, k, v, o, lse, comm, st, refused);
  else run<__nv_bfloat16>(s, t, q, k, v, o, lse, comm, st, refused);  // fp32 and others: refused in run's checks
}

}  // namespace fl::ring
