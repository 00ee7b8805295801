// What every NCCL version of rung 11 shares (v2_nccl.cu onwards): NCCL's errors in the rung's
// words, the checks a rank makes alone, and the ranks' agreement (agree_or_throw), which turns one
// rank's bad arguments into an error on every rank instead of a hang.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ring_rank.cuh"

namespace fl::ring {

inline InputError nccl_bad(const std::string& what) { return InputError("rung 11_ring_attention (nccl): " + what); }

inline void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw CudaError(std::string("rung 11_ring_attention (nccl): ") + what + ": " + ncclGetErrorString(r));
}

// One send to rank `to` and one receive from rank `from` (`bytes` each), in one NCCL group so
// that neither waits for the other, on `st`. The group is always closed, whatever its calls
// returned.
inline void send_recv(const void* send, void* recv, std::size_t bytes, int to, int from, ncclComm_t comm,
                      cudaStream_t st) {
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess) {
    const ncclResult_t a = ncclSend(send, bytes, ncclChar, to, comm, st);
    const ncclResult_t b = ncclRecv(recv, bytes, ncclChar, from, comm, st);
    r = ncclGroupEnd();
    if (r == ncclSuccess) r = a != ncclSuccess ? a : b;
  }
  nccl_check(r, "the step's ncclSend and ncclRecv");
}

// What a rank can check alone, before the ranks agree: the caller's own refusal, the arguments
// (check_gpu_call), that the communicator's rank lives on the current GPU, and that the local
// forward rung (and, with `backward`, the local backward rung) runs every step this rank will
// take. Returns the rank's number in the communicator.
inline int check_rank(const RingShape& s, DType t, ncclComm_t comm, const std::string& refused,
                      std::initializer_list<const void*> ptrs, bool backward = false) {
  if (!refused.empty()) throw InputError(refused);
  check_gpu_call(s, t, ptrs);
  int me = 0, dev = -1, mine = -2;
  nccl_check(ncclCommUserRank(comm, &me), "ncclCommUserRank");
  nccl_check(ncclCommCuDevice(comm, &dev), "ncclCommCuDevice");
  FL_CUDA_CHECK(cudaGetDevice(&mine));
  if (dev != mine)
    throw nccl_bad("the communicator's rank is on GPU " + std::to_string(dev) + ", the current GPU is " + std::to_string(mine));
  if (me < s.ranks)
    for (int64_t step = 0; step < s.ranks; ++step) {
      const StepPlan pl = plan_step(s, me, step);
      AttentionShape a = s.attn;
      a.seq_q = pl.nq, a.seq_k = pl.nk, a.causal = pl.causal;
      std::string why;
      if (pl.nq > 0 && !gpu_local_rung(t).supports(a, t, &why))
        throw nccl_bad("the local rung refuses step " + std::to_string(step) + ": " + why);
      if (backward && pl.nq > 0 && !gpu_local_backward_rung(t).supports(a, t, &why))
        throw nccl_bad("the local backward rung refuses step " + std::to_string(step) + ": " + why);
    }
  return me;
}

// Every rank contributes the same fixed-size vector, so the all-reduce cannot hang on a rank's bad
// arguments; the element-wise max and min over the ranks (the min as the max of the negatives)
// then tell every rank alike whether they agree.
inline void agree_or_throw(const RingShape& s, DType t, const std::string& local_error, ncclComm_t comm,
                           cudaStream_t st) {
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
  if (!local_error.empty()) throw nccl_bad(local_error);  // this rank's own reason first
  if (!differ.empty()) throw nccl_bad("the ranks disagree on the call: " + differ + "; every rank must pass the same problem");
  if (-both[2 * n - 1] == 0) throw nccl_bad("another rank refused its arguments (its own error says why)");
  if (count != s.ranks)
    throw nccl_bad("the communicator has " + std::to_string(count) + " ranks and the problem " + std::to_string(s.ranks));
}

// A kept rank's call (v3_kept onwards) is not agreed on before it starts: the problem was, when the
// rank was opened, and a call can only differ in its pointers. Each rank votes whether its own are
// usable (one int, the minimum over the ranks, enqueued on `st` without waiting: `vote`), runs the
// ring either way (a rank whose pointers are not usable computes nothing but still passes the
// shards on), and reads the vote at the end (`count_votes`): if any rank's arguments were not
// usable, every rank throws, none waits for a transfer that never comes.
inline void vote(int* flag, bool mine, ncclComm_t comm, cudaStream_t st) {
  fill_kernel<int><<<1, 32, 0, st>>>(flag, mine ? 1 : 0, 1);
  FL_CUDA_CHECK_LAUNCH();
  nccl_check(ncclAllReduce(flag, flag, 1, ncclInt32, ncclMin, comm, st), "ncclAllReduce (the call's vote)");
}
inline void count_votes(const int* flag, bool mine, cudaStream_t st) {
  int all = 0;
  FL_CUDA_CHECK(cudaMemcpyAsync(&all, flag, sizeof all, cudaMemcpyDeviceToHost, st));
  FL_CUDA_CHECK(cudaStreamSynchronize(st));
  if (!mine)
    throw nccl_bad("a null pointer among this rank's arrays; no rank's output of this call is valid: pass this "
                   "rank's shards in device memory for every array and call again on every rank");
  if (!all)
    throw nccl_bad("another rank's call had a null pointer (its own error says so); no rank's output of this call "
                   "is valid: call again on every rank once that rank's arrays are mended");
}

}  // namespace fl::ring
