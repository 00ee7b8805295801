// ring_probe: the two numbers rung 11's model of the ring needs, measured on the machine it will
// run on (docs/11_ring_attention.md, "When the ring hides its communication"):
//   β  the link: every GPU of the process sends `size` bytes to the next and receives as many from
//      the previous, all in one NCCL group (ncclSend + ncclRecv between ncclGroupStart and
//      ncclGroupEnd, as the ring issues them), for sizes from 16 MiB to 1 GiB; β = size / time,
//      each way per GPU;
//   F  the local kernels: the forward (and backward) rung that a ring step runs, on one GPU, on
//      one full step's block pair: L = N / P queries against L keys, not causal.
// Then the hiding lengths of the model, L* = (Hkv / H)·e·F / (2β) for the forward and
// (Hkv / H)·(e + 4)·F_bwd / (5β) for the backward, and whether the problem asked for hides its
// transfers. With --efficiency, the ring itself (each version --ring-versions names, a thread a
// GPU) against the same rungs on one GPU on the whole problem and the same inputs, at each N given:
// parallel efficiency t_1 / (P · t_P), forward and (v5) backward, and how far its outputs are from
// one GPU's. One process drives every visible GPU; with one GPU only F is measured.
//
//   build-hopper/bench/ring_probe --seq 131072 --heads 32 --kv-heads 8 --head-dim 128 --json ring.json
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <thread>

#include "../steps/11_ring_attention/ring_gpu.hpp"
#include "bench_common.hpp"
#include "device.hpp"
#include "rung.hpp"

namespace fl {
namespace {

#define PROBE_CUDA(x) check_cuda((x), #x)
#define PROBE_NCCL(x) check_nccl((x), #x)
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check_nccl(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(e));
}

const char* kUsageText = R"(usage: ring_probe [flags]

Measures what rung 11's ring needs to hide its communication: the link (every visible GPU sends to
the next and receives from the previous in one NCCL group, as the ring does) and the local
kernels' speed on one step of the problem, then prints the model's hiding lengths.

  --gpus P          GPUs in the ring (default: every visible one)
  --sizes LIST      MiB per transfer, comma list (default 16,64,256,1024)
  --reps R          timed exchanges per size, the median kept (default 20)
  --batch B --heads H --kv-heads Hkv --seq N --head-dim d --dtype fp16|bf16
                    the whole problem (default 1, 32, 8, 131072, 128, bf16); a step is
                    L = N / P queries against L keys
  --fwd-rung NAME   the forward a step runs (default: the ring's own, the first this GPU runs of
                    @FWD@)
  --bwd-rung NAME   the backward (default: the ring's own, the first this GPU runs of
                    @BWD@)
  --efficiency LIST sequence lengths N at which to time the ring (a thread a GPU, causal, zigzag)
                    against the same rungs on one GPU on the whole problem, and to compare their
                    outputs (e.g. 16384,65536,131072)
  --ring-versions L the ring versions --efficiency runs (default v5_backward, forward and backward;
                    v2_nccl, v3_kept and v4_overlap run the forward only)
  --json FILE       also write the measurements as JSON
  --help            this text
)";

// The usage text with the ring's own rung lists (ring_gpu.hpp) in place of @FWD@ and @BWD@.
std::string usage() {
  auto list = [](const auto& names) {
    std::string r;
    for (const char* n : names) r += (r.empty() ? "" : ", ") + std::string(n);
    return r;
  };
  std::string u = kUsageText;
  u.replace(u.find("@FWD@"), 5, list(ring::kLocalForwards));
  u.replace(u.find("@BWD@"), 5, list(ring::kLocalBackwards));
  return u;
}

struct Options {
  int gpus = 0;
  std::vector<int64_t> sizes_mib = {16, 64, 256, 1024};
  int reps = 20;
  AttentionShape shape{1, 32, 8, 131072, 131072, 128, false, 0.0};
  DType dtype = DType::BF16;
  std::string fwd_rung, bwd_rung, json;
  std::vector<int64_t> efficiency;  // N values for the ring's own timing
  std::vector<std::string> versions = {"v5_backward"};  // the ring versions --efficiency times
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError(f + " needs a value");
      return argv[++i];
    };
    auto integer = [&](int64_t min) {
      int64_t x = 0;
      const std::string v = next();
      if (!bench::parse_int(v, &x) || x < min)
        throw InputError(f + " expects an integer of at least " + std::to_string(min) + ", got '" + v + "'");
      return x;
    };
    if (f == "--help") {
      std::cout << usage();
      std::exit(0);
    } else if (f == "--gpus") o.gpus = int(integer(1));
    else if (f == "--reps") o.reps = int(integer(1));
    else if (f == "--sizes") {
      o.sizes_mib.clear();
      for (const std::string& s : bench::split_commas(next())) {
        int64_t x = 0;
        if (!bench::parse_int(s, &x) || x < 1) throw InputError("--sizes: '" + s + "' is not a size in MiB");
        o.sizes_mib.push_back(x);
      }
    } else if (f == "--batch") o.shape.batch = integer(1);
    else if (f == "--heads") o.shape.heads = integer(1);
    else if (f == "--kv-heads") o.shape.kv_heads = integer(1);
    else if (f == "--seq") o.shape.seq_q = o.shape.seq_k = integer(1);
    else if (f == "--head-dim") o.shape.head_dim = integer(1);
    else if (f == "--dtype") o.dtype = parse_dtype(next());
    else if (f == "--fwd-rung") o.fwd_rung = next();
    else if (f == "--bwd-rung") o.bwd_rung = next();
    else if (f == "--json") o.json = next();
    else if (f == "--ring-versions") {
      o.versions = bench::split_commas(next());
      for (const std::string& v : o.versions) {
        const std::vector<std::string>& known = ring::nccl_ring_versions();
        if (v != "v2_nccl" && std::find(known.begin(), known.end(), v) == known.end())
          throw InputError("--ring-versions: no version '" + v + "' (v2_nccl, v3_kept, v4_overlap, v5_backward)");
      }
    }
    else if (f == "--efficiency") {
      for (const std::string& s : bench::split_commas(next())) {
        int64_t x = 0;
        if (!bench::parse_int(s, &x) || x < 1) throw InputError("--efficiency: '" + s + "' is not a sequence length");
        o.efficiency.push_back(x);
      }
    }
    else throw InputError("unknown flag '" + f + "' (ring_probe --help lists them)");
  }
  o.shape.validate();
  if (o.dtype != DType::F16 && o.dtype != DType::BF16) throw InputError("--dtype: fp16 or bf16");
  return o;
}

// The rung `given` names, which must be usable here; without a name, the one the ring's steps run
// (`fallback`: ring::gpu_local_rung or ring::gpu_local_backward_rung), or nullptr when there is none.
const Rung* pick(const std::string& given, const Rung& (*fallback)(DType), DType t) {
  if (given.empty()) {
    try {
      return &fallback(t);
    } catch (const InputError&) {
      return nullptr;
    }
  }
  const Rung* r = Registry::instance().find(given, Backend::Cuda);
  if (!r || !r->unavailable().empty())
    throw InputError("rung " + given + " is " + (r ? "unavailable here: " + r->unavailable() : "not in this build"));
  return r;
}

// A device buffer of `bytes` holding small random 16-bit values (a 1 MiB random block, repeated).
gpu::DeviceBuffer random_buffer(std::size_t bytes, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> block(1 << 19);
  for (float& x : block) x = normal(rng);
  const std::vector<unsigned char> one = to_storage(block, t);
  gpu::DeviceBuffer d(bytes);
  for (std::size_t at = 0; at < bytes; at += one.size())
    PROBE_CUDA(cudaMemcpy(static_cast<char*>(d.get()) + at, one.data(), std::min(one.size(), bytes - at),
                          cudaMemcpyHostToDevice));
  return d;
}

struct Rate {
  std::string rung;
  double ms = NAN, tflops = NAN;
};

// F of one step's block pair: L queries against L keys, not causal, on GPU 0.
std::pair<Rate, Rate> local_rates(const Options& o, const AttentionShape& step) {
  PROBE_CUDA(cudaSetDevice(0));
  const Rung* fwd = pick(o.fwd_rung, ring::gpu_local_rung, o.dtype);
  const Rung* bwd = pick(o.bwd_rung, ring::gpu_local_backward_rung, o.dtype);
  if (!fwd) throw InputError("no forward rung of this build runs on this GPU");
  const std::size_t e = dtype_bytes(o.dtype);
  const std::size_t qb = std::size_t(step.batch * step.heads * step.seq_q * step.head_dim) * e;
  const std::size_t kb = std::size_t(step.batch * step.kv_heads * step.seq_k * step.head_dim) * e;
  gpu::require_memory(4 * qb + 4 * kb, "the local step of " + step.str());
  gpu::DeviceBuffer q = random_buffer(qb, o.dtype, 1), k = random_buffer(kb, o.dtype, 2),
                    v = random_buffer(kb, o.dtype, 3), out(qb), lse(std::size_t(step.batch * step.heads * step.seq_q) * 4);
  gpu::DeviceBuffer fws(std::max<std::size_t>(16, fwd->workspace_bytes(step, o.dtype)));
  ForwardArgs fa;
  fa.q = q.get(), fa.k = k.get(), fa.v = v.get(), fa.o = out.get(), fa.lse = static_cast<float*>(lse.get());
  fa.workspace = fws.get();
  fwd->check(step, o.dtype, fa);
  std::pair<Rate, Rate> r;
  r.first.rung = fwd->name();
  r.first.ms = gpu::time_ms([&] { fwd->forward(step, o.dtype, fa); }, 3, 10, [] { gpu::flush_l2(); });
  r.first.tflops = step.flops_forward() / (r.first.ms * 1e-3) / 1e12;
  if (bwd) {
    gpu::DeviceBuffer dout = random_buffer(qb, o.dtype, 4), dq(qb), dk(kb), dv(kb);
    gpu::DeviceBuffer bws(std::max<std::size_t>(16, bwd->backward_workspace_bytes(step, o.dtype)));
    fwd->forward(step, o.dtype, fa);  // O and lse for the backward
    BackwardArgs ba;
    ba.q = q.get(), ba.k = k.get(), ba.v = v.get(), ba.o = out.get(), ba.lse = static_cast<const float*>(lse.get());
    ba.dout = dout.get(), ba.dq = dq.get(), ba.dk = dk.get(), ba.dv = dv.get(), ba.workspace = bws.get();
    r.second.rung = bwd->name();
    r.second.ms = gpu::time_ms([&] { bwd->backward(step, o.dtype, ba); }, 3, 10, [] { gpu::flush_l2(); });
    r.second.tflops = 2.5 * step.flops_forward() / (r.second.ms * 1e-3) / 1e12;
  }
  return r;
}

struct Link {
  int64_t bytes = 0;
  double ms = NAN, gbs = NAN;  // per exchange; GB/s each way per GPU
};

// Every GPU sends `bytes` to the next and receives from the previous, in one group; median of reps.
std::vector<Link> link_rates(const Options& o, int p) {
  const std::size_t n = static_cast<std::size_t>(p);
  std::vector<int> devs(n);
  for (int i = 0; i < p; ++i) devs[std::size_t(i)] = i;
  std::vector<ncclComm_t> comms(n);
  PROBE_NCCL(ncclCommInitAll(comms.data(), p, devs.data()));
  std::vector<cudaStream_t> streams(n);
  const int64_t most = *std::max_element(o.sizes_mib.begin(), o.sizes_mib.end()) << 20;
  std::vector<void*> send(n), recv(n);
  for (int i = 0; i < p; ++i) {
    PROBE_CUDA(cudaSetDevice(i));
    PROBE_CUDA(cudaStreamCreateWithFlags(&streams[std::size_t(i)], cudaStreamNonBlocking));
    PROBE_CUDA(cudaMalloc(&send[std::size_t(i)], std::size_t(most)));
    PROBE_CUDA(cudaMalloc(&recv[std::size_t(i)], std::size_t(most)));
    PROBE_CUDA(cudaMemset(send[std::size_t(i)], i + 1, std::size_t(most)));
  }
  auto exchange = [&](int64_t bytes) {
    PROBE_NCCL(ncclGroupStart());
    for (int i = 0; i < p; ++i) {
      PROBE_NCCL(ncclSend(send[std::size_t(i)], std::size_t(bytes), ncclChar, (i + 1) % p, comms[std::size_t(i)],
                          streams[std::size_t(i)]));
      PROBE_NCCL(ncclRecv(recv[std::size_t(i)], std::size_t(bytes), ncclChar, (i + p - 1) % p, comms[std::size_t(i)],
                          streams[std::size_t(i)]));
    }
    PROBE_NCCL(ncclGroupEnd());
    for (int i = 0; i < p; ++i) {
      PROBE_CUDA(cudaSetDevice(i));
      PROBE_CUDA(cudaStreamSynchronize(streams[std::size_t(i)]));
    }
  };
  std::vector<Link> out;
  for (int64_t mib : o.sizes_mib) {
    const int64_t bytes = mib << 20;
    for (int w = 0; w < 3; ++w) exchange(bytes);
    std::vector<double> ms;
    for (int r = 0; r < o.reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      exchange(bytes);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(ms.begin(), ms.begin() + std::ptrdiff_t(ms.size() / 2), ms.end());
    Link l;
    l.bytes = bytes;
    l.ms = ms[ms.size() / 2];
    l.gbs = double(bytes) / (l.ms * 1e-3) / 1e9;
    out.push_back(l);
    std::cerr << "  link " << mib << " MiB: " << l.gbs << " GB/s each way\n";
  }
  for (int i = 0; i < p; ++i) {
    PROBE_CUDA(cudaSetDevice(i));
    cudaFree(send[std::size_t(i)]);
    cudaFree(recv[std::size_t(i)]);
    cudaStreamDestroy(streams[std::size_t(i)]);
    ncclCommDestroy(comms[std::size_t(i)]);
  }
  return out;
}

// Whole-problem host arrays in the dtype's storage: a random block of a prime-ish number of
// elements, tiled (so no two rows of one array at a shard's or a chunk's distance are alike, and a
// misplaced row shows in the comparison), quick to make at any N.
std::vector<unsigned char> host_random(std::size_t elems, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> block((1u << 19) + 7);
  for (float& x : block) x = normal(rng);
  const std::vector<unsigned char> one = to_storage(block, t);
  const std::size_t e = dtype_bytes(t), bytes = elems * e;
  std::vector<unsigned char> out(bytes);
  for (std::size_t at = 0; at < bytes; at += one.size()) std::memcpy(out.data() + at, one.data(), std::min(one.size(), bytes - at));
  return out;
}

// ‖a − b‖ / ‖b‖ over two arrays in the dtype's storage (or fp32 when t is F32).
double rel_l2(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b, DType t) {
  const std::vector<float> x = from_storage(a, t), y = from_storage(b, t);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double dlt = double(x[i]) - double(y[i]);
    num += dlt * dlt, den += double(y[i]) * double(y[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Efficiency {
  int64_t n = 0;
  std::string version;
  double one_fwd = NAN, one_bwd = NAN;              // the local rungs on one GPU, the whole problem (CUDA events)
  double open_ms = NAN, ring_fwd = NAN, ring_bwd = NAN;  // the ring's calls (wall clock, every rank's thread joined)
  double eff_fwd = NAN, eff_bwd = NAN, eff = NAN;   // t_1 / (P · t_P): forward, backward, both
  double err_o = NAN, err_lse = NAN, err_dq = NAN, err_dk = NAN, err_dv = NAN, bar = NAN;  // ring against one GPU
  std::string error;
};

// Runs body(rank) on a thread a GPU (cudaSetDevice(rank) first); the wall time of the whole, in
// ms. Throws the first rank's error after all have joined.
double on_ranks(int p, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(p));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < p; ++i)
    threads.emplace_back([&, i] {
      try {
        PROBE_CUDA(cudaSetDevice(i));
        body(i);
        PROBE_CUDA(cudaDeviceSynchronize());
      } catch (const std::exception& ex) {
        errors[std::size_t(i)] = ex.what();
      }
    });
  for (std::thread& t : threads) t.join();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < p; ++i)
    if (!errors[std::size_t(i)].empty()) throw std::runtime_error("rank " + std::to_string(i) + ": " + errors[std::size_t(i)]);
  return ms;
}

double median(std::vector<double> x) {
  if (x.empty()) return NAN;
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// At each N: the local rungs on GPU 0 on the whole problem (forward, and the backward when a
// version asked for has one), then each ring version on the same inputs, sharded (causal,
// zigzag), a thread a GPU: its forward (and backward) timed by the wall clock over `reps` calls
// after one, and its outputs compared with the one-GPU ones. "v2_nccl" is the call that sets up
// its rank every time (nccl_ring_forward); the others are opened once (nccl_ring_open, timed
// apart) and called.
std::vector<Efficiency> ring_efficiency(const Options& o, int p) {
  std::vector<Efficiency> out;
  std::vector<int> devs(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) devs[std::size_t(i)] = i;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(p));
  PROBE_NCCL(ncclCommInitAll(comms.data(), p, devs.data()));
  const std::size_t e = dtype_bytes(o.dtype);
  const int reps = std::max(1, std::min(o.reps, 5));
  bool any_backward = false;
  for (const std::string& v : o.versions) any_backward |= v == "v5_backward";
  for (int64_t n : o.efficiency) {
    ring::RingShape s{o.shape, p, ring::Sharding::Zigzag};
    s.attn.seq_q = s.attn.seq_k = n, s.attn.causal = true;
    const int64_t qh = s.attn.batch * s.attn.heads, kh = s.attn.batch * s.attn.kv_heads, d = s.attn.head_dim;
    const int64_t L = n / p;
    const std::size_t qe = std::size_t(qh * n * d), ke = std::size_t(kh * n * d);
    Efficiency one;
    std::vector<unsigned char> q, k, v, dout, o1, dq1, dk1, dv1;
    std::vector<float> lse1;
    try {
      s.validate();
      std::cerr << "N = " << n << ": drawing the inputs, the one-GPU run...\n";
      q = host_random(qe, o.dtype, 1), k = host_random(ke, o.dtype, 2), v = host_random(ke, o.dtype, 3);
      dout = host_random(qe, o.dtype, 4);
      o1.resize(qe * e), dq1.resize(qe * e), dk1.resize(ke * e), dv1.resize(ke * e), lse1.resize(std::size_t(qh * n));
      PROBE_CUDA(cudaSetDevice(0));
      const Rung& fwd = ring::gpu_local_rung(o.dtype);
      gpu::DeviceBuffer dq_(qe * e), dk_(ke * e), dv_(ke * e), do_(qe * e), out_(qe * e), lse_(lse1.size() * 4),
          ws(std::max<std::size_t>(16, fwd.workspace_bytes(s.attn, o.dtype)));
      dq_.upload(q.data(), qe * e), dk_.upload(k.data(), ke * e), dv_.upload(v.data(), ke * e), do_.upload(dout.data(), qe * e);
      ForwardArgs fa;
      fa.q = dq_.get(), fa.k = dk_.get(), fa.v = dv_.get(), fa.o = out_.get(), fa.lse = static_cast<float*>(lse_.get());
      fa.workspace = ws.get();
      fwd.check(s.attn, o.dtype, fa);
      one.one_fwd = gpu::time_ms([&] { fwd.forward(s.attn, o.dtype, fa); }, 1, reps, [] { gpu::flush_l2(); });
      out_.download(o1.data(), o1.size()), lse_.download(lse1.data(), lse1.size() * 4);
      if (any_backward) {
        const Rung& bwd = ring::gpu_local_backward_rung(o.dtype);
        gpu::DeviceBuffer gq(qe * e), gk(ke * e), gv(ke * e),
            bws(std::max<std::size_t>(16, bwd.backward_workspace_bytes(s.attn, o.dtype)));
        BackwardArgs ba;
        ba.q = dq_.get(), ba.k = dk_.get(), ba.v = dv_.get(), ba.o = out_.get(), ba.lse = static_cast<const float*>(lse_.get());
        ba.dout = do_.get(), ba.dq = gq.get(), ba.dk = gk.get(), ba.dv = gv.get(), ba.workspace = bws.get();
        bwd.check(s.attn, o.dtype, ba);
        one.one_bwd = gpu::time_ms([&] { bwd.backward(s.attn, o.dtype, ba); }, 1, reps, [] { gpu::flush_l2(); });
        gq.download(dq1.data(), dq1.size()), gk.download(dk1.data(), dk1.size()), gv.download(dv1.data(), dv1.size());
      }
    } catch (const std::exception& ex) {
      one.error = ex.what();
    }
    for (const std::string& version : o.versions) {
      Efficiency r = one;
      r.n = n, r.version = version;
      if (r.error.empty()) try {
        std::cerr << "N = " << n << ": the ring, " << version << "...\n";
        const bool backward = version == "v5_backward";
        const std::size_t qb = std::size_t(qh * L * d) * e, kb = std::size_t(kh * L * d) * e;
        struct Rank {
          gpu::DeviceBuffer q, k, v, o, lse, dout, dq, dk, dv;
          std::unique_ptr<ring::NcclRank> ring;
        };
        std::vector<Rank> ranks(static_cast<std::size_t>(p));
        on_ranks(p, [&](int i) {
          Rank& x = ranks[std::size_t(i)];
          std::vector<unsigned char> host(std::max(qb, kb));
          auto up = [&](gpu::DeviceBuffer& b, const std::vector<unsigned char>& whole, int64_t groups, std::size_t bytes) {
            b = gpu::DeviceBuffer(bytes);
            s.shard(i, whole.data(), host.data(), groups, d * int64_t(e));
            b.upload(host.data(), bytes);
          };
          up(x.q, q, qh, qb), up(x.k, k, kh, kb), up(x.v, v, kh, kb);
          x.o = gpu::DeviceBuffer(qb), x.lse = gpu::DeviceBuffer(std::size_t(qh * L) * 4);
          x.o.poison(), x.lse.poison();
          if (backward) {
            up(x.dout, dout, qh, qb);
            x.dq = gpu::DeviceBuffer(qb), x.dk = gpu::DeviceBuffer(kb), x.dv = gpu::DeviceBuffer(kb);
            x.dq.poison(), x.dk.poison(), x.dv.poison();
          }
        });
        if (version != "v2_nccl")
          r.open_ms = on_ranks(p, [&](int i) {
            ranks[std::size_t(i)].ring = ring::nccl_ring_open(version, s, o.dtype, comms[std::size_t(i)], nullptr);
          });
        auto fwd = [&](int i) {
          Rank& x = ranks[std::size_t(i)];
          if (x.ring) x.ring->forward(x.q.get(), x.k.get(), x.v.get(), x.o.get(), static_cast<float*>(x.lse.get()));
          else ring::nccl_ring_forward(s, o.dtype, x.q.get(), x.k.get(), x.v.get(), x.o.get(),
                                       static_cast<float*>(x.lse.get()), comms[std::size_t(i)], nullptr);
        };
        auto bwd = [&](int i) {
          Rank& x = ranks[std::size_t(i)];
          x.ring->backward(x.q.get(), x.k.get(), x.v.get(), x.o.get(), static_cast<const float*>(x.lse.get()),
                           x.dout.get(), x.dq.get(), x.dk.get(), x.dv.get());
        };
        std::vector<double> tf, tb;
        for (int rep = 0; rep <= reps; ++rep) {
          const double ms = on_ranks(p, fwd);
          if (rep) tf.push_back(ms);
        }
        r.ring_fwd = median(tf);
        r.eff_fwd = r.one_fwd / (double(p) * r.ring_fwd);
        if (backward) {
          for (int rep = 0; rep <= reps; ++rep) {
            const double ms = on_ranks(p, bwd);
            if (rep) tb.push_back(ms);
          }
          r.ring_bwd = median(tb);
          r.eff_bwd = r.one_bwd / (double(p) * r.ring_bwd);
          r.eff = (r.one_fwd + r.one_bwd) / (double(p) * (r.ring_fwd + r.ring_bwd));
        }
        // The ranks' rows back in their places, against the one-GPU outputs.
        std::vector<unsigned char> o2(o1.size()), dq2(dq1.size()), dk2(dk1.size()), dv2(dv1.size());
        std::vector<float> lse2(lse1.size());
        on_ranks(p, [&](int i) {
          Rank& x = ranks[std::size_t(i)];
          std::vector<unsigned char> host(std::max(qb, kb));
          auto down = [&](const gpu::DeviceBuffer& b, void* whole, int64_t groups, std::size_t bytes, int64_t row) {
            b.download(host.data(), bytes);
            s.unshard(i, host.data(), whole, groups, row);
          };
          down(x.o, o2.data(), qh, qb, d * int64_t(e));
          down(x.lse, lse2.data(), qh, std::size_t(qh * L) * 4, 4);
          if (backward) {
            down(x.dq, dq2.data(), qh, qb, d * int64_t(e));
            down(x.dk, dk2.data(), kh, kb, d * int64_t(e));
            down(x.dv, dv2.data(), kh, kb, d * int64_t(e));
          }
          x.ring.reset();  // on its own GPU
        });
        const auto as_bytes = [](const std::vector<float>& x) {
          std::vector<unsigned char> b(x.size() * 4);
          std::memcpy(b.data(), x.data(), b.size());
          return b;
        };
        r.err_o = rel_l2(o2, o1, o.dtype);
        r.err_lse = rel_l2(as_bytes(lse2), as_bytes(lse1), DType::F32);
        if (backward)
          r.err_dq = rel_l2(dq2, dq1, o.dtype), r.err_dk = rel_l2(dk2, dk1, o.dtype), r.err_dv = rel_l2(dv2, dv1, o.dtype);
        // What the arithmetic allows: the ring rounds each step's part to the dtype before adding
        // it in fp32 and rounds the sum once more, so it may differ from one GPU's result by about
        // P + 1 roundings (unit roundoff u); the bar is (P + 2)·u of the array's norm.
        r.bar = double(p + 2) * (o.dtype == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11));
      } catch (const std::exception& ex) {
        r.error = ex.what();
      }
      std::cout << "efficiency N = " << n << " " << version << ": ";
      if (!r.error.empty()) std::cout << "not measured: " << r.error << '\n';
      else {
        std::cout << "one GPU fwd " << r.one_fwd << " ms" << (std::isnan(r.one_bwd) ? "" : ", bwd " + std::to_string(r.one_bwd) + " ms")
                  << "; ring fwd " << r.ring_fwd << " ms (efficiency " << r.eff_fwd << ")";
        if (!std::isnan(r.ring_bwd))
          std::cout << ", bwd " << r.ring_bwd << " ms (" << r.eff_bwd << "), fwd+bwd efficiency " << r.eff;
        if (!std::isnan(r.open_ms)) std::cout << "; open " << r.open_ms << " ms";
        const bool match = r.err_o <= r.bar && (std::isnan(r.err_dq) || (r.err_dq <= r.bar && r.err_dk <= r.bar && r.err_dv <= r.bar));
        std::cout << "\n  against one GPU, rel. L2: O " << r.err_o << ", lse " << r.err_lse;
        if (!std::isnan(r.err_dq)) std::cout << ", dQ " << r.err_dq << ", dK " << r.err_dk << ", dV " << r.err_dv;
        std::cout << " (bar " << r.bar << "): " << (match ? "MATCH" : "DIFFER") << '\n';
      }
      out.push_back(r);
    }
  }
  for (int i = 0; i < p; ++i) ncclCommDestroy(comms[std::size_t(i)]);
  return out;
}

int probe_main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // The communicators made here never use NVLink multicast (NVLS): a ring of sends and receives
  // gains nothing from it, and on shared machines it is kept off. A value the caller set stays.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::string why;
  if (!gpu::available(&why)) throw std::runtime_error("no GPU: " + why);
  int visible = 0;
  PROBE_CUDA(cudaGetDeviceCount(&visible));
  const int p = o.gpus ? o.gpus : visible;
  if (p > visible) throw InputError("--gpus " + std::to_string(p) + ": only " + std::to_string(visible) + " visible");
  if (o.shape.seq_q % p) throw InputError("--seq must be a multiple of the GPUs in the ring");
  AttentionShape step = o.shape;
  step.seq_q = step.seq_k = o.shape.seq_q / p;
  std::cout << "ring_probe: " << p << " GPU(s) (" << gpu::device_name() << "), whole problem " << o.shape.str()
            << " " << dtype_name(o.dtype) << ", a step " << step.str() << '\n';
  const auto [fwd, bwd] = local_rates(o, step);
  std::cout << "F: " << fwd.rung << " " << fwd.ms << " ms a step (" << fwd.tflops << " TFLOP/s)";
  if (!bwd.rung.empty()) std::cout << "; F_bwd: " << bwd.rung << " " << bwd.ms << " ms (" << bwd.tflops << " TFLOP/s)";
  std::cout << '\n';
  std::vector<Link> links;
  if (p >= 2) links = link_rates(o, p);
  else std::cout << "one GPU: no link to measure (--gpus 2 on a machine with two)\n";

  const double e = double(dtype_bytes(o.dtype)), g = double(o.shape.kv_heads) / double(o.shape.heads);
  const double L = double(step.seq_q), kv = 2.0 * double(step.batch * step.kv_heads) * L * double(step.head_dim) * e;
  const double dkv = kv / e * 4;
  std::ofstream json;
  if (!o.json.empty()) {
    json.open(o.json);
    if (!json) throw InputError("--json: cannot write '" + o.json + "'");
    json << "{\"gpus\": " << p << ", \"device\": \"" << gpu::device_name() << "\", \"date\": \"" << bench::today_utc()
         << "\", \"shape\": \"" << o.shape.str() << "\", \"dtype\": \"" << dtype_name(o.dtype) << "\", \"step_len\": " << L
         << ", \"fwd\": {\"rung\": \"" << fwd.rung << "\", \"ms\": " << fwd.ms << ", \"tflops\": " << fwd.tflops
         << "}, \"bwd\": {\"rung\": \"" << bwd.rung << "\", \"ms\": " << (bwd.rung.empty() ? 0 : bwd.ms)
         << ", \"tflops\": " << (bwd.rung.empty() ? 0 : bwd.tflops) << "}, \"links\": [";
  }
  for (std::size_t i = 0; i < links.size(); ++i) {
    const Link& l = links[i];
    const double beta = l.gbs * 1e9, F = fwd.tflops * 1e12;
    const double lstar = g * e * F / (2 * beta);
    const double fwd_transfer_ms = kv / beta * 1e3;
    std::cout << "link " << (l.bytes >> 20) << " MiB: " << l.gbs << " GB/s each way; forward L* = " << lstar
              << " (causal zigzag " << 2 * lstar << "); this step: compute " << fwd.ms << " ms, K/V transfer "
              << fwd_transfer_ms << " ms";
    double bstar = NAN, bwd_transfer_ms = NAN;
    if (!bwd.rung.empty()) {
      bstar = g * (e + 4) * bwd.tflops * 1e12 / (5 * beta);
      bwd_transfer_ms = (kv + dkv) / beta * 1e3;
      std::cout << "; backward L* = " << bstar << ", compute " << bwd.ms << " ms, K/V + dK/dV transfer "
                << bwd_transfer_ms << " ms";
    }
    std::cout << (L >= lstar ? "  (the forward hides)" : "  (the forward cannot hide)") << '\n';
    if (json.is_open())
      json << (i ? ", " : "") << "{\"bytes\": " << l.bytes << ", \"ms\": " << l.ms << ", \"GBps\": " << l.gbs
           << ", \"fwd_lstar\": " << lstar << ", \"bwd_lstar\": " << (std::isnan(bstar) ? 0 : bstar)
           << ", \"fwd_transfer_ms\": " << fwd_transfer_ms << "}";
  }
  std::vector<Efficiency> eff;
  if (!o.efficiency.empty() && p >= 2) eff = ring_efficiency(o, p);
  if (json.is_open()) {
    json << "], \"efficiency\": [";
    auto num = [](double x) { return std::isnan(x) ? std::string("null") : std::to_string(x); };
    for (std::size_t i = 0; i < eff.size(); ++i) {
      const Efficiency& x = eff[i];
      json << (i ? ", " : "") << "{\"N\": " << x.n << ", \"version\": \"" << x.version << "\", \"one_ms\": " << num(x.one_fwd)
           << ", \"ring_ms\": " << num(x.ring_fwd) << ", \"efficiency\": " << num(x.eff_fwd)
           << ", \"one_bwd_ms\": " << num(x.one_bwd) << ", \"ring_bwd_ms\": " << num(x.ring_bwd)
           << ", \"efficiency_bwd\": " << num(x.eff_bwd) << ", \"efficiency_fwd_bwd\": " << num(x.eff)
           << ", \"open_ms\": " << num(x.open_ms) << ", \"rel_l2\": {\"o\": " << num(x.err_o) << ", \"lse\": " << num(x.err_lse)
           << ", \"dq\": " << num(x.err_dq) << ", \"dk\": " << num(x.err_dk) << ", \"dv\": " << num(x.err_dv)
           << "}, \"bar\": " << num(x.bar) << ", \"error\": \"" << (x.error.empty() ? "" : "see the log") << "\"}";
    }
    json << "]}\n";
    std::cout << "wrote " << o.json << '\n';
  }
  return 0;
}

}  // namespace
}  // namespace fl

int main(int argc, char** argv) {
  try {
    return fl::probe_main(argc, argv);
  } catch (const fl::InputError& e) {
    std::cerr << "ring_probe: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ring_probe: " << e.what() << '\n';
    return 1;
  }
}
