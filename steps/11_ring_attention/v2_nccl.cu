// Rung 11, v2_nccl: v1's ring with one rank per GPU, the K/V shards over NCCL (ring_gpu.hpp).
//
// What changed from v1: a call is one rank. Its shards are the caller's own arrays; after each
// step it sends its K/V shard to rank r + 1 and receives the next from rank r − 1, both in one
// NCCL group (ncclSend and ncclRecv between ncclGroupStart and ncclGroupEnd, so neither waits for
// the other), on the call's stream. The transfer still waits for the step before it: hiding it
// behind the next step's compute is the next version. Before anything else the ranks agree on the
// problem (agree_or_throw), so that a rank with other arguments cannot leave the rest hanging in a
// transfer that never comes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>

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
  const char* names[] = {"batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal", "ranks", "sharding",
                         "dtype", "communicator size", "arguments accepted (1) or refused (0)"};
  const std::vector<int64_t> mine = {s.attn.batch, s.attn.heads, s.attn.kv_heads, s.attn.seq_q, s.attn.seq_k,
                                     s.attn.head_dim, int64_t(s.attn.causal), s.ranks, int64_t(s.sharding),
                                     int64_t(t), int64_t(count), int64_t(local_error.empty())};
  const std::size_t n = mine.size();
  std::vector<int64_t> both(2 * n);
  for (std::size_t i = 0; i < n; ++i) both[i] = mine[i], both[n + i] = -mine[i];
  gpu::DeviceBuffer buf(both.size() * sizeof(int64_t));
  buf.upload(both.data(), both.size() * sizeof(int64_t));
  nccl_check(ncclAllReduce(buf.get(), buf.get(), both.size(), ncclInt64, ncclMax, comm, st), "ncclAllReduce");
  FL_CUDA_CHECK(cudaStreamSynchronize(st));
  buf.download(both.data(), both.size() * sizeof(int64_t));
  std::string differ;
  for (std::size_t i = 0; i + 1 < n; ++i)
    if (both[i] != -both[n + i])
      differ += std::string(differ.empty() ? "" : ", ") + names[i] + " from " + std::to_string(-both[n + i]) + " to " +
                std::to_string(both[i]);
  if (!differ.empty()) throw bad("the ranks disagree on the call: " + differ + "; every rank must pass the same problem");
  if (-both[2 * n - 1] == 0)
    throw bad(local_error.empty() ? "another rank refused its arguments (its own error says why)" : local_error);
  if (count != s.ranks)
    throw bad("the communicator has " + std::to_string(count) + " ranks and the problem " + std::to_string(s.ranks));
}

template <class T>
void forward(const RingShape& s, DType t, const T* q, const T* k, const T* v, T* o, float* lse, ncclComm_t comm,
             cudaStream_t st) {
  int me = 0;
  nccl_check(ncclCommUserRank(comm, &me), "ncclCommUserRank");
  const int P = int(s.ranks);
  RankState<T> R(s, t, me, st);
  R.load_local(q, k, v);
  for (int step = 0; step < P; ++step) {
    R.compute(step);
    if (step + 1 == P) break;
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    nccl_check(ncclSend(R.kv(), R.shard_bytes(), ncclChar, (me + 1) % P, comm, st), "ncclSend");
    nccl_check(ncclRecv(R.kv_next(), R.shard_bytes(), ncclChar, (me + P - 1) % P, comm, st), "ncclRecv");
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    R.swap();
  }
  R.store_local(o, lse);
  FL_CUDA_CHECK(cudaStreamSynchronize(st));  // the rank's buffers are freed when this returns
}

}  // namespace

void nccl_ring_forward(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                       void* comm_ptr, void* stream) {
  if (!comm_ptr) throw bad("comm is null: pass the ncclComm_t of the ring's ranks");
  const ncclComm_t comm = static_cast<ncclComm_t>(comm_ptr);
  const cudaStream_t st = as_stream(stream);
  std::string local_error;  // this rank's refusal, said only after every rank has been heard
  try {
    check_gpu_call(s, t, {q, k, v, o, lse});
    gpu::require_memory(rank_bytes(s, t), "a rank of rung 11's ring (" + s.str() + ")");
  } catch (const InputError& e) {
    local_error = e.what();
  } catch (const gpu::OutOfMemory& e) {
    local_error = e.what();
  }
  agree_or_throw(s, t, local_error, comm, st);
  if (t == DType::F16)
    forward(s, t, static_cast<const __half*>(q), static_cast<const __half*>(k), static_cast<const __half*>(v),
            static_cast<__half*>(o), lse, comm, st);
  else
    forward(s, t, static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
            static_cast<const __nv_bfloat16*>(v), static_cast<__nv_bfloat16*>(o), lse, comm, st);
}

}  // namespace fl::ring
