// Rung 11: a communicator for callers who have none (ring_gpu.hpp): NCCL's unique id and
// ncclCommInitRank behind the ring's own error messages. Built with v2_nccl.cu, when CMake finds
// NCCL; ring_attention.cpp holds what a build without it answers.
#include <nccl.h>

#include <cstring>
#include <string>

#include "cuda_check.cuh"
#include "ring_gpu.hpp"

namespace fl::ring {
namespace {

InputError refused(const std::string& what) { return InputError("rung 11_ring_attention (nccl): " + what); }

void check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess)
    throw CudaError(std::string("rung 11_ring_attention (nccl): ") + call + ": " + ncclGetErrorString(r));
}

}  // namespace

static_assert(kNcclIdBytes == NCCL_UNIQUE_ID_BYTES, "ring_gpu.hpp's id size is NCCL's");

bool nccl_built() { return true; }

void nccl_unique_id(void* id) {
  if (!id) throw refused("id is null: pass kNcclIdBytes (128) bytes to receive the unique id");
  ncclUniqueId u;
  check(ncclGetUniqueId(&u), "ncclGetUniqueId");
  std::memcpy(id, &u, sizeof u);
}

void* nccl_comm_init(const void* id, int ranks, int rank) {
  if (!id) throw refused("id is null: pass the bytes nccl_unique_id gave one of the ranks");
  if (ranks < 1) throw refused("ranks = " + std::to_string(ranks) + ": a ring needs at least one rank");
  if (rank < 0 || rank >= ranks)
    throw refused("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(ranks) + ")");
  ncclUniqueId u;
  std::memcpy(&u, id, sizeof u);
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, ranks, u, rank), "ncclCommInitRank");
  return comm;
}

void nccl_comm_destroy(void* comm) {
  if (comm) check(ncclCommDestroy(static_cast<ncclComm_t>(comm)), "ncclCommDestroy");
}

}  // namespace fl::ring
