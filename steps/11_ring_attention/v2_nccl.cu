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
#include <nccl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ring_rank.cuh"

namespace fl::ring {
namespace {

InputError bad(const std::string& what) { return InputError("rung 11_ring_attention (nccl): " + what); }

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw CudaError(std::string("rung 11_ring_attention (nccl): ") + what + ": " + ncclGetErrorString(r));
}

// Every rank contributes the same fixed-size vector, so the all-reduce cannot hang on a rank's bad
// arguments; the element-wise max and min over the ranks (the min as the max of the negatives)
// then tell every rank alike whether they agree.
void agree_or_throw(const RingShape& s, DType t, const std::string& local_error, ncclComm_t comm, cudaStream_t st) {
  int count = 0;
  nccl_check(ncclCommCount(comm, &count), "ncclCommCount");
  float scale = s.attn.softmax_scale();
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  const char* names[] = {"batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal", "softmax scale (bits)",
                         "ranks", "sharding", "dtype", "communicator size", "arguments accepted (1) or refused (0)"};
  const std::vector<int64_t> mine = {s.attn.batch, s.attn.heads, s.attn.kv_heads, s.attn.seq_q, s.attn.seq_k,
                                     s.attn.head_dim, int64_t(s.attn.causal), int64_t(scale_bits), s.ranks,
                                     int64_t(s.sharding), int64_t(t), int64_t(count), int64_t(local_error.empty())};
  const std::size_t n = mine.size();
  std::vector<int64_t> both(2 * n);
  for (std::size_t i = 0; i < n; ++i) both[i] = mine[i], both[n + i] = -mine[i];
  gpu::DeviceBuffer buf(both.size() * sizeof(int64_t));
  FL_CUDA_CHECK(cudaMemcpyAsync(buf.get(), both.data(), both.size() * sizeof(int64_t), cudaMemcpyHostToDevice, st));
  nccl_check(ncclAllReduce(buf.get(), buf.get(), both.size(), ncclInt64, ncclMax, comm, st), "ncclAllReduce");
  FL_CUDA_CHECK(cudaMemcpyAsync(both.data(), buf.get(), both.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, st));
  FL_CUDA_CHECK(cudaStreamSynchronize(st));
  std::string differ;
  for (std::size_t i = 0; i + 1 < n; ++i)
    if (both[i] != -both[n + i])
      differ += std::string(differ.empty() ? "" : ", ") + names[i] + " from " + std::to_string(-both[n + i]) + " to " +
                std::to_string(both[i]);
  if (!local_error.empty()) throw bad(local_error);  // this rank's own reason first
  if (!differ.empty()) throw bad("the ranks disagree on the call: " + differ + "; every rank must pass the same problem");
  if (-both[2 * n - 1] == 0) throw bad("another rank refused its arguments (its own error says why)");
  if (count != s.ranks)
    throw bad("the communicator has " + std::to_string(count) + " ranks and the problem " + std::to_string(s.ranks));
}

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
    if (!refused.empty()) throw InputError(refused);
    check_gpu_call(s, t, {q, k, v, o, lse});
    nccl_check(ncclCommUserRank(comm, &me), "ncclCommUserRank");
    clock.rank = me;
    int dev = -1, mine = -2;
    nccl_check(ncclCommCuDevice(comm, &dev), "ncclCommCuDevice");
    FL_CUDA_CHECK(cudaGetDevice(&mine));
    if (dev != mine)
      throw bad("the communicator's rank is on GPU " + std::to_string(dev) + ", the current GPU is " + std::to_string(mine));
    if (me < s.ranks)
      for (int64_t step = 0; step < s.ranks; ++step) {
        const StepPlan pl = plan_step(s, me, step);
        AttentionShape a = s.attn;
        a.seq_q = pl.nq, a.seq_k = pl.nk, a.causal = pl.causal;
        std::string why;
        if (pl.nq > 0 && !gpu_local_rung(t).supports(a, t, &why))
          throw bad("the local rung refuses step " + std::to_string(step) + ": " + why);
      }
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
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) {  // the group is always closed, whatever its calls returned
      const ncclResult_t a = ncclSend(R->kv(), R->shard_bytes(), ncclChar, (me + 1) % P, comm, st);
      const ncclResult_t b = ncclRecv(R->kv_next(), R->shard_bytes(), ncclChar, (me + P - 1) % P, comm, st);
      r = ncclGroupEnd();
      if (r == ncclSuccess) r = a != ncclSuccess ? a : b;
    }
    nccl_check(r, "the step's ncclSend and ncclRecv");
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
  if (!comm_ptr) throw bad("comm is null: pass the ncclComm_t of the ring's ranks");
  const ncclComm_t comm = static_cast<ncclComm_t>(comm_ptr);
  const cudaStream_t st = as_stream(stream);
  if (t == DType::F16) run<__half>(s, t, q, k, v, o, lse, comm, st, refused);
  else run<__nv_bfloat16>(s, t, q, k, v, o, lse, comm, st, refused);  // fp32 and others: refused in run's checks
}

}  // namespace fl::ring
