// Rung 11, v1_ring: the ring's forward on one GPU, every rank in turn (ring_gpu.hpp).
//
// Each rank (RankState, ring_rank.cuh) holds its Q shard, the K/V shard it is visiting and the one
// arriving, and its running output in fp32 (O and lse). A step is the twin's: plan_step picks the
// rows of Q and of the visiting K/V that see each other; those rows are copied into dense staging
// arrays (one 2-D copy each: the same rows of every head), the local forward rung runs on them,
// and merge_kernel folds its O and lse into the rank's running ones with rung 02's merge. Then
// every rank's K/V shard goes to the next rank: here a device copy, every rank on one GPU, so the
// ring's logic runs on real kernels where there is only one GPU. At the end each rank's rows are
// rounded to the dtype and copied to their places in O and lse.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <vector>

#include "ring_rank.cuh"

namespace fl::ring {
namespace {

template <class T>
void forward(const RingShape& s, DType t, const T* q, const T* k, const T* v, T* o, float* lse, cudaStream_t st) {
  const int64_t P = s.ranks;
  gpu::require_memory(std::size_t(P) * rank_bytes(s, t), "rung 11's ring of " + std::to_string(P) +
                                                             " ranks on one GPU (" + s.str() + ")");
  std::vector<std::unique_ptr<RankState<T>>> ranks;
  for (int64_t r = 0; r < P; ++r) {
    ranks.push_back(std::make_unique<RankState<T>>(s, t, r, st));
    ranks.back()->load_from_whole(q, k, v);
  }
  for (int64_t step = 0; step < P; ++step) {
    for (auto& r : ranks) r->compute(step);
    if (step + 1 == P) break;
    for (int64_t r = 0; r < P; ++r)  // every shard to the next rank
      FL_CUDA_CHECK(cudaMemcpyAsync(ranks[std::size_t((r + 1) % P)]->kv_next(), ranks[std::size_t(r)]->kv(),
                                    ranks[std::size_t(r)]->shard_bytes(), cudaMemcpyDeviceToDevice, st));
    for (auto& r : ranks) r->swap();
  }
  for (auto& r : ranks) r->store_to_whole(o, lse);
  // The ranks' buffers are freed when this returns: wait for the queued work.
  FL_CUDA_CHECK(cudaStreamSynchronize(st));
}

}  // namespace

const Rung& gpu_local_rung(DType t) { return first_gpu_rung(kLocalForwards, t, "forward"); }

void gpu_ring_forward_local(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o,
                            float* lse, void* stream) {
  check_gpu_call(s, t, {q, k, v, o, lse});
  const cudaStream_t st = as_stream(stream);
  if (t == DType::F16)
    forward(s, t, static_cast<const __half*>(q), static_cast<const __half*>(k), static_cast<const __half*>(v),
            static_cast<__half*>(o), lse, st);
  else
    forward(s, t, static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
            static_cast<const __nv_bfloat16*>(v), static_cast<__nv_bfloat16*>(o), lse, st);
}

}  // namespace fl::ring
