// Rung 11: a communicator for callers who have none (ring_gpu.hpp): NCCL's unique id and
// ncclCommInitRank behind the ring's own error messages. Built with v2_nccl.cu, when CMake finds
// NCCL; ring_attention.cpp holds what a build without it answers.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device.hpp"

#include "cuda_check.cuh"
#include "ring_gpu.hpp"

namespace fl::ring {
namespace {

InputError refused_call(const std::string& what) { return InputError("rung 11_ring_attention (nccl): " + what); }

void check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess)
    throw CudaError(std::string("rung 11_ring_attention (nccl): ") + call + ": " + ncclGetErrorString(r));
}

}  // namespace

// The versions' own openers (v3_kept.cu, v4_overlap.cu, v5_backward.cu).
std::unique_ptr<NcclRank> open_v3_kept(const RingShape&, DType, ncclComm_t, cudaStream_t, const std::string&);
std::unique_ptr<NcclRank> open_v4_overlap(const RingShape&, DType, ncclComm_t, cudaStream_t, const std::string&);
std::unique_ptr<NcclRank> open_v5_backward(const RingShape&, DType, ncclComm_t, cudaStream_t, const std::string&);

std::unique_ptr<NcclRank> nccl_ring_open(const std::string& version, const RingShape& s, DType t, void* comm,
                                         void* stream, const std::string& refused) {
  if (!comm) throw refused_call("comm is null: pass the ncclComm_t of the ring's ranks");
  const std::string v = version.empty() ? nccl_ring_versions().back() : version;
  const ncclComm_t c = static_cast<ncclComm_t>(comm);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (v == "v3_kept") return open_v3_kept(s, t, c, st, refused);
  if (v == "v4_overlap") return open_v4_overlap(s, t, c, st, refused);
  if (v == "v5_backward") return open_v5_backward(s, t, c, st, refused);
  std::string known;
  for (const std::string& x : nccl_ring_versions()) known += (known.empty() ? "" : ", ") + x;
  throw refused_call("no ring version '" + v + "'; there are " + known);
}

static_assert(kNcclIdBytes == NCCL_UNIQUE_ID_BYTES, "ring_gpu.hpp's id size is NCCL's");

bool nccl_built() { return true; }

void nccl_unique_id(void* id) {
  if (!id) throw refused_call("id is null: pass FL_RING_ID_BYTES (128) bytes to receive the unique id");
  ncclUniqueId u;
  check(ncclGetUniqueId(&u), "ncclGetUniqueId");
  std::memcpy(id, &u, sizeof u);
}

void* nccl_comm_init(const void* id, int ranks, int rank) {
  if (!id) throw refused_call("id is null: pass the bytes nccl_unique_id gave one of the ranks");
  if (ranks < 1) throw refused_call("ranks = " + std::to_string(ranks) + ": a ring needs at least one rank");
  if (rank < 0 || rank >= ranks)
    throw refused_call("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(ranks) + ")");
  ncclUniqueId u;
  std::memcpy(&u, id, sizeof u);
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, ranks, u, rank), "ncclCommInitRank");
  return comm;
}

void nccl_comm_destroy(void* comm) {
  if (comm) check(ncclCommDestroy(static_cast<ncclComm_t>(comm)), "ncclCommDestroy");
}

std::vector<std::string> nccl_ring_forward_on_gpus(const RingShape& s, DType t, const void* q, const void* k,
                                                   const void* v, void* o, float* lse, int reps, double* ms) {
  s.validate();
  int gpus = 0;
  FL_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  if (gpus < s.ranks)
    throw refused_call("a ring of " + std::to_string(s.ranks) + " ranks needs as many GPUs; this machine has " +
                  std::to_string(gpus) + ": ask for at most that many ranks (the CPU twin simulates any number)");
  const int P = int(s.ranks);
  const int64_t L = s.local_len(), d = s.attn.head_dim, e = int64_t(dtype_bytes(t));
  const int64_t qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads;
  std::vector<int> devs(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) devs[std::size_t(r)] = r;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast for these communicators (a set value stays)
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(P));
  check(ncclCommInitAll(comms.data(), P, devs.data()), "ncclCommInitAll");
  struct Comms {  // freed however this function ends
    std::vector<ncclComm_t>& c;
    ~Comms() {
      for (ncclComm_t x : c) ncclCommDestroy(x);
    }
  } guard{comms};
  std::vector<std::string> errors(static_cast<std::size_t>(P));
  struct Shards {
    gpu::DeviceBuffer q, k, v, o, lse;
  };
  std::vector<Shards> sh(static_cast<std::size_t>(P));
  // Every rank on its own thread, a phase joined before the next: a phase that calls the ring has
  // every rank call it, and the next starts only if all of them finished, so that no rank is ever
  // left waiting in the ring for one that failed before it or stopped after it.
  const auto on_every_rank = [&](const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r)
      threads.emplace_back([&, r] {
        try {
          FL_CUDA_CHECK(cudaSetDevice(r));
          body(r);
        } catch (const std::exception& ex) {
          errors[std::size_t(r)] = ex.what();
        }
      });
    for (std::thread& th : threads) th.join();
    return std::all_of(errors.begin(), errors.end(), [](const std::string& x) { return x.empty(); });
  };
  const std::size_t qb = std::size_t(qh * L * d * e), kb = std::size_t(kh * L * d * e);
  std::vector<std::unique_ptr<NcclRank>> ranks(static_cast<std::size_t>(P));  // the newest version, kept
  struct Close {  // each rank's kept state freed on its own GPU, however this function ends
    std::vector<std::unique_ptr<NcclRank>>& r;
    ~Close() {
      int current = 0;
      cudaGetDevice(&current);
      for (std::size_t i = 0; i < r.size(); ++i)
        if (r[i]) cudaSetDevice(int(i)), r[i].reset();
      cudaSetDevice(current);
    }
  } close{ranks};
  const auto call = [&](int r) {
    Shards& x = sh[std::size_t(r)];
    ranks[std::size_t(r)]->forward(x.q.get(), x.k.get(), x.v.get(), x.o.get(), static_cast<float*>(x.lse.get()));
  };
  // Each rank's shards up (its memory, its copies: what can fail on one rank alone, before any rank
  // enters the ring).
  bool ok = on_every_rank([&](int r) {
    std::vector<unsigned char> host(std::max(qb, kb));
    Shards& x = sh[std::size_t(r)];
    x = {gpu::DeviceBuffer(qb), gpu::DeviceBuffer(kb), gpu::DeviceBuffer(kb), gpu::DeviceBuffer(qb),
         gpu::DeviceBuffer(std::size_t(qh * L) * 4)};
    s.shard(r, q, host.data(), qh, d * e), x.q.upload(host.data(), qb);
    s.shard(r, k, host.data(), kh, d * e), x.k.upload(host.data(), kb);
    s.shard(r, v, host.data(), kh, d * e), x.v.upload(host.data(), kb);
    x.o.poison(), x.lse.poison();
  });
  // Each rank opened once: its checks, the ranks' agreement, its buffers.
  ok = ok && on_every_rank([&](int r) {
    ranks[std::size_t(r)] = nccl_ring_open("", s, t, comms[std::size_t(r)], nullptr);
  });
  // The checked call, each rank's rows back into o and lse (disjoint rows).
  ok = ok && on_every_rank([&](int r) {
    call(r);
    Shards& x = sh[std::size_t(r)];
    std::vector<unsigned char> host(qb);
    std::vector<float> rows(std::size_t(qh * L));
    x.o.download(host.data(), qb);
    s.unshard(r, host.data(), o, qh, d * e);
    x.lse.download(rows.data(), rows.size() * 4);
    s.unshard(r, rows.data(), lse, qh, 4);
  });
  // The timed calls, one phase each; rank 0's wall time of a call is kept.
  std::vector<double> times;
  for (int i = 0; ok && i < reps; ++i)
    ok = on_every_rank([&](int r) {
      const auto t0 = std::chrono::steady_clock::now();
      call(r);
      if (r == 0) times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    });
  if (ms) {
    std::sort(times.begin(), times.end());
    *ms = times.empty() ? 0.0 : times[times.size() / 2];
  }
  return errors;
}

}  // namespace fl::ring
