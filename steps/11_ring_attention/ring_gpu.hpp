// Rung 11 on the GPU: the ring's forward with the ladder's fastest forward kernel as each step's
// attention. v1_ring.cu runs all P ranks on the current GPU, in the twin's order (every rank's
// step, then every transfer), with the ring's transfers as device-to-device copies: the ring's
// logic (shards, step plans, merges) on real kernels, testable on one GPU. v2_nccl.cu runs one
// rank per GPU (per process, or per thread), the transfers over NCCL; built when CMake finds NCCL.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "../06_tensor_core_mma/tensor_core_mma.hpp"
#include "../07_backward_recompute/backward_recompute.hpp"
#include "../08_hopper_forward/hopper_forward.hpp"
#include "../09_hopper_backward/hopper_backward.hpp"
#include "ring_attention.hpp"

namespace fl::ring {

// The rungs a step may run on the GPU, in order of preference: the newest (fastest) version of the
// Hopper rung, else of the rung that runs on every GPU from sm_80. The first this GPU and build run
// in the call's dtype is taken.
inline constexpr const char* kLocalForwards[] = {hopper::kNewest, tensor_core_mma::kNewest};
inline constexpr const char* kLocalBackwards[] = {hopper_backward::kNewest,
                                                  backward::info(backward::Version::V4Tiles2d).name};

// The forward rung a step runs on this GPU: the first of kLocalForwards it runs, fp16 and bf16.
// Throws InputError when there is none.
const Rung& gpu_local_rung(DType t);

// O [B, H, N, d] and lse [B, H, N] of the whole problem, through the ring of s.ranks ranks all on
// the current GPU: q, k, v, o, lse are DEVICE pointers of the whole problem; the work goes on
// `stream`, and the call returns when it is done (the ranks' buffers are its own). Each rank's shards are copied out, the ring runs step by step
// (its K/V shards passed on by device copies), and the ranks' rows are copied back: what the
// ranks of the NCCL version hold and compute, on one GPU. Refuses what the twin refuses, and what
// the local rung does not run, before any work. Throws without CUDA.
void gpu_ring_forward_local(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o,
                            float* lse, void* stream);

// One rank of the ring on the current GPU, the K/V shards passed over NCCL: `comm` is an
// ncclComm_t of s.ranks ranks (the caller's: under torchrun, its process group's), this rank its
// ncclCommUserRank. q, k, v, o, lse are this rank's shards in device memory, its chunks in order
// (RingShape::chunks_of): q, o [B, H, N / P, d], k, v [B, Hkv, N / P, d], lse [B, H, N / P].
// Every rank calls it with the same problem. Before any other communication the ranks agree, with
// one all-reduce, on the problem, the dtype and the communicator's size; a rank given a different
// shape, bad arguments or a communicator of another size makes every rank throw InputError, none
// hangs. Returns when the rank's work is done. Throws without NCCL. `refused`: why the caller has
// already refused this rank's call (the C ABI: a NULL shape, an unknown dtype); the rank still
// takes part in the agreement, so that every rank fails with it instead of waiting.
void nccl_ring_forward(const RingShape& s, DType t, const void* q, const void* k, const void* v, void* o,
                       float* lse, void* comm, void* stream, const std::string& refused = {});

// One rank of the NCCL ring kept from one call to the next (v3_kept onwards). Every rank opens it
// once with the same problem, dtype, communicator and stream: the ranks check and agree then (as
// v2 does on every call; a rank given another shape, bad arguments or a communicator of another
// size makes every rank's open throw InputError), and each takes its device memory. A call after
// that only runs the ring. Its pointers are this rank's shards in device memory, laid out as for
// nccl_ring_forward; a rank whose call has a null pointer still passes the shards on, and every
// rank's call then throws InputError at its end, none hangs. What the vote cannot catch (a non-null
// pointer that is not this rank's device memory, a CUDA fault in a step) can still make one rank
// throw out of the ring and leave the others waiting, as with v2. Destroy it before its communicator.
class NcclRank {
 public:
  virtual ~NcclRank() = default;
  virtual std::string version() const = 0;  // "v3_kept", ...
  virtual void forward(const void* q, const void* k, const void* v, void* o, float* lse) = 0;
  // dQ, dK, dV of this rank's rows and keys (dK, dV summed over each GQA group) from its shards of
  // Q, K, V, of the forward's O and lse (the whole sequence's, as forward() returns them) and of dO.
  // Versions without a backward on the GPUs throw InputError, on every rank alike.
  virtual bool has_backward() const { return false; }
  virtual void backward(const void* q, const void* k, const void* v, const void* o, const float* lse,
                        const void* dout, void* dq, void* dk, void* dv);
};

// The versions that keep a rank, in the ladder's order, each with its idea; the last is the default.
struct NcclRingVersion {
  const char* name;
  const char* idea;
};
inline constexpr NcclRingVersion kNcclRingVersions[] = {
    {"v3_kept", "v2 with the rank kept across calls (opened once)"},
    {"v4_overlap", "v3 with the transfer on its own stream, under the step"},
    {"v5_backward", "v4 with the backward on the GPUs (what --ring P --device cuda runs)"},
};
inline const std::vector<std::string>& nccl_ring_versions() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> names;
    for (const NcclRingVersion& r : kNcclRingVersions) names.push_back(r.name);
    return names;
  }();
  return v;
}
// Opens `version` ("" for the last) on this rank: comm and stream as for nccl_ring_forward. Throws
// without NCCL, and InputError for an unknown version (before any communication).
std::unique_ptr<NcclRank> nccl_ring_open(const std::string& version, const RingShape& s, DType t, void* comm,
                                         void* stream, const std::string& refused = {});

// The backward rung a step of v5_backward runs: the first of kLocalBackwards this GPU runs. Throws
// InputError when there is none.
const Rung& gpu_local_backward_rung(DType t);

// A communicator for the ring when the caller has none (outside torchrun): one rank calls
// nccl_unique_id and hands its kNcclIdBytes bytes to every rank (a file, a socket, MPI), then each
// rank, on its own GPU (the current CUDA device), calls nccl_comm_init with the same bytes, the
// ring's size and its rank; nccl_comm_destroy frees it. NCCL's init blocks until every rank has
// called it. All three throw without NCCL; nccl_comm_init refuses ranks < 1, rank outside
// [0, ranks) and a null id before calling NCCL.
inline constexpr int kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
bool nccl_built();                        // this build has NCCL (CMake found it)
void nccl_unique_id(void* id);            // kNcclIdBytes bytes
void* nccl_comm_init(const void* id, int ranks, int rank);
void nccl_comm_destroy(void* comm);

// The whole problem through the NCCL ring on GPUs 0 .. P − 1 of this process, a thread a rank (what
// `ladder --ring P --device cuda` runs): q, k, v, o, lse HOST arrays of the whole problem in the
// dtype's storage. Each rank's shards (its chunks in order) go to its GPU, it opens the newest kept
// version (nccl_ring_open), runs its forward once (checked) and then `reps` more times, timed
// together (the median wall time of a call, in *ms, rank 0's); its rows come back into o and lse.
// Each phase (the shards up, the opening, each call) runs on
// every rank and ends for all before the next begins, so a rank that fails stops them all without a
// hang. Returns each rank's error message ("" when it finished).
// Throws InputError when this machine has fewer than P GPUs, and without NCCL.
std::vector<std::string> nccl_ring_forward_on_gpus(const RingShape& s, DType t, const void* q, const void* k,
                                                   const void* v, void* o, float* lse, int reps = 0,
                                                   double* ms = nullptr);

}  // namespace fl::ring
