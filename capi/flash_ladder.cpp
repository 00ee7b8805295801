// The C ABI over the rung registry. Each entry point does the same four things: look the rung up,
// turn the C arguments into the C++ ones (AttentionShape, DType, ForwardArgs), let Rung::check
// refuse anything bad before any work, then run. Every C++ exception stops at guarded() and
// becomes an fl_status and a message, because an exception unwinding into C or Python is undefined
// behaviour, not an error report.
#include "flash_ladder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "decoding.hpp"
#include "ring_attention.hpp"
#include "ring_gpu.hpp"
#include "device.hpp"
#include "host_memory.hpp"
#include "problem.hpp"
#include "rung.hpp"

#if FLASH_LADDER_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda_check.cuh"
#endif

#ifndef FL_VERSION_STRING
#define FL_VERSION_STRING "unknown"
#endif
#ifndef FL_BUILD_INFO
#define FL_BUILD_INFO "flash_ladder " FL_VERSION_STRING
#endif

namespace {

using fl::Backend;
using fl::DType;

// ---- Errors ---------------------------------------------------------------------------------

thread_local std::string t_last_error;

// The two failures that are not InputError: a rung this build lacks, and a GPU that is not there.
struct NotFound : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct NoGpu : std::runtime_error {
  using std::runtime_error::runtime_error;
};

fl_status fail(fl_status s, const char* fn, const std::string& what) {
  t_last_error = std::string(fn) + ": " + what;
  return s;
}

// Runs `body`, which throws on failure, and turns whatever it throws into a status. `fn` (the C
// function's name) starts every message so a student sees which call refused.
template <class F>
fl_status guarded(const char* fn, F&& body) {
  try {
    body();
    t_last_error.clear();
    return FL_OK;
  } catch (const fl::InputError& e) {
    return fail(FL_ERR_INVALID, fn, e.what());
  } catch (const NotFound& e) {
    return fail(FL_ERR_NOT_FOUND, fn, e.what());
  } catch (const fl::gpu::OutOfMemory& e) {
    return fail(FL_ERR_OUT_OF_MEMORY, fn, e.what());
  } catch (const fl::HostOutOfMemory& e) {
    return fail(FL_ERR_OUT_OF_MEMORY, fn, e.what());
  } catch (const std::bad_alloc&) {
    return fail(FL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  } catch (const NoGpu& e) {
    return fail(FL_ERR_CUDA, fn, e.what());
#if FLASH_LADDER_HAS_CUDA
  } catch (const fl::CudaError& e) {
    // A failed cudaMalloc inside a rung is still "out of memory" to the caller.
    const std::string m = e.what();
    const bool oom = m.find("cudaErrorMemoryAllocation") != std::string::npos;
    return fail(oom ? FL_ERR_OUT_OF_MEMORY : FL_ERR_CUDA, fn, m);
#endif
  } catch (const std::exception& e) {
    // The CPU-only build cannot name fl::CudaError (it lives in a CUDA header), but its messages
    // all start this way.
    const std::string m = e.what();
    return fail(m.rfind("CUDA error", 0) == 0 ? FL_ERR_CUDA : FL_ERR_INTERNAL, fn, m);
  } catch (...) {
    return fail(FL_ERR_INTERNAL, fn, "unknown C++ exception");
  }
}

// ---- Arguments --------------------------------------------------------------------------------

Backend parse_backend(const char* b) {
  if (!b) throw fl::InputError("backend is NULL; pass \"cpu\" or \"cuda\"");
  const std::string s = b;
  if (s == "cpu") return Backend::Cpu;
  if (s == "cuda") return Backend::Cuda;
  throw fl::InputError("unknown backend '" + s + "'; pass \"cpu\" or \"cuda\"");
}

// A C enum can hold any int, so the value is checked, not trusted.
DType to_dtype(fl_dtype t) {
  switch (static_cast<int>(t)) {
    case FL_FP32: return DType::F32;
    case FL_FP16: return DType::F16;
    case FL_BF16: return DType::BF16;
  }
  throw fl::InputError("dtype " + std::to_string(static_cast<int>(t)) +
                       " is not one of FL_FP32 (0), FL_FP16 (1), FL_BF16 (2)");
}

// The fields alone, unchecked: fl_ring_forward's ranks check them together (see there).
fl::ring::RingShape ring_shape_fields(const fl_ring_shape* c) {
  fl::ring::RingShape s;
  s.attn.batch = c->batch;
  s.attn.heads = c->heads;
  s.attn.kv_heads = c->kv_heads;
  s.attn.seq_q = s.attn.seq_k = c->seq;
  s.attn.head_dim = c->head_dim;
  s.attn.causal = c->causal != 0;
  s.attn.scale = c->scale;
  s.ranks = c->ranks;
  s.sharding = c->zigzag ? fl::ring::Sharding::Zigzag : fl::ring::Sharding::Contiguous;
  return s;
}

fl::ring::RingShape to_ring_shape(const fl_ring_shape* c) {
  if (!c) throw fl::InputError("shape is NULL");
  fl::ring::RingShape s = ring_shape_fields(c);
  s.validate();  // the AttentionShape's checks, P < 1, N not a multiple of P (2P): refused, named
  return s;
}

static_assert(FL_RING_ID_BYTES == fl::ring::kNcclIdBytes, "the header's id size is the ring's (NCCL's)");

void require_nccl() {
  if (!fl::ring::nccl_built())
    throw NotFound("this build has no NCCL (CMake found none): the ring across GPUs is left out; "
                   "fl_ring_forward_host runs its CPU twin");
}

fl::AttentionShape to_shape(const fl_shape* c) {
  if (!c) throw fl::InputError("shape is NULL");
  fl::AttentionShape s;
  s.batch = c->batch;
  s.heads = c->heads;
  s.kv_heads = c->kv_heads;
  s.seq_q = c->seq_q;
  s.seq_k = c->seq_k;
  s.head_dim = c->head_dim;
  s.causal = c->causal != 0;
  s.scale = c->scale;
  s.validate();  // zero or negative sizes, H % Hkv, a bad scale: refused here, named
  return s;
}

// `host_fn`: for a GPU rung, the entry point that runs its CPU twin instead (named when this build
// has no GPU rungs).
const fl::Rung& find_rung(const char* name, Backend b, const char* host_fn = "fl_forward_host") {
  if (!name) throw fl::InputError("rung name is NULL");
  if (const fl::Rung* r = fl::Registry::instance().find(name, b)) return *r;
  std::string have;
  for (const fl::Rung* r : fl::Registry::instance().all())
    if (r->backend() == b) have += (have.empty() ? "" : ", ") + r->name();
  std::string msg = std::string("no rung '") + name + "' on backend " + fl::backend_name(b) +
                    " in this build";
  if (b == Backend::Cuda && !fl::gpu::built_with_cuda())
    msg += std::string(" (it was configured without CUDA, so it has no GPU rungs; ") + host_fn +
           " runs the CPU twins)";
  else
    msg += "; it has: " + (have.empty() ? std::string("none") : have);
  throw NotFound(msg);
}

// gpu::available() asks the driver for device properties, which is slow enough to show up in a
// timed loop; the answer cannot change while the process lives, so it is asked once.
bool gpu_available(std::string* why) {
  static const std::pair<bool, std::string> answer = [] {
    std::string w;
    bool ok = false;
    try {
      ok = fl::gpu::available(&w);
    } catch (const std::exception& e) {
      w = e.what();
    }
    return std::make_pair(ok, w);
  }();
  if (why) *why = answer.second;
  return answer.first;
}

// `host_fn` is the entry point that runs the same rung's CPU twin on host memory.
void require_gpu(const char* host_fn) {
  std::string why;
  if (!gpu_available(&why))
    throw NoGpu("no GPU to run on: " + why + "; " + host_fn + " runs the CPU twin instead");
}

// A CPU twin's workspace, refused before it is allocated when host memory cannot hold it, and a
// std::bad_alloc inside the twin said with the figures (FL_ERR_OUT_OF_MEMORY either way).
std::string twin_memory_what(const fl::Rung& r, const fl::AttentionShape& s, std::size_t workspace) {
  const std::string what = r.caps().workspace_what;
  return "rung " + r.label() + " on " + s.str() + " (its workspace" + (what.empty() ? "" : ", " + what) +
         ", is " + fl::describe_bytes(double(workspace)) + ")";
}
template <class F>
void run_twin(const fl::Rung& r, const fl::AttentionShape& s, std::size_t workspace, F&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    throw fl::HostOutOfMemory(twin_memory_what(r, s, workspace) + " ran out of host memory: this machine has " +
                              fl::describe_bytes(double(fl::available_host_memory())) + " available");
  }
}

// The most common mistake from Python or C: a host array handed to the kernel entry point. The
// kernel would fault (an illegal address that poisons the whole CUDA context), so ask the driver
// what each pointer is first and refuse with a message instead.
void require_device_pointer(const void* p, const char* what, const fl::Rung& r) {
#if FLASH_LADDER_HAS_CUDA
  if (!p) return;  // null pointers were refused by Rung::check; a null workspace is allowed
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // cannot tell what it is: clear the error and let the kernel try
    return;
  }
  if (attr.type == cudaMemoryTypeUnregistered)
    throw fl::InputError("rung " + r.label() + ": pointer '" + what +
                         "' is ordinary host memory; fl_forward and fl_backward take device "
                         "pointers (fl_forward_host runs the CPU twin on host memory)");
  int current = 0;
  if (attr.type == cudaMemoryTypeDevice && cudaGetDevice(&current) == cudaSuccess &&
      attr.device != current)
    throw fl::InputError("rung " + r.label() + ": pointer '" + what + "' lives on device " +
                         std::to_string(attr.device) + " but the current device is " +
                         std::to_string(current) + "; call cudaSetDevice (torch.cuda.set_device) "
                         "first");
#else
  (void)p, (void)what, (void)r;
#endif
}

// `ask` names the function that says how much is needed, for the message.
void require_workspace(const fl::Rung& r, const fl::AttentionShape& s, DType t, std::size_t need,
                       const void* workspace, std::size_t given, const char* ask) {
  if (need == 0 || (workspace && given >= need)) return;
  const std::string what = r.caps().workspace_what;
  throw fl::InputError("rung " + r.label() + " needs a workspace of " + std::to_string(need) +
                       " bytes (" + fl::describe_bytes(double(need)) +
                       (what.empty() ? "" : ": " + what) + ") for " + s.str() + " " +
                       fl::dtype_name(t) + ", but was given " +
                       (workspace ? std::to_string(given) + " bytes" : std::string("none")) +
                       "; " + ask + " gives the size");
}

// Host workspace for a CPU twin when the caller passed none: max_align_t keeps it aligned for any
// element type a twin casts it to.
struct HostWorkspace {
  std::unique_ptr<std::max_align_t[]> storage;
  void* get(void* given, std::size_t need) {
    if (given || need == 0) return given;
    storage.reset(new std::max_align_t[(need + sizeof(std::max_align_t) - 1) /
                                       sizeof(std::max_align_t)]);
    return storage.get();
  }
};

fl::decoding::DecodeShape to_decode_shape(const fl_decode_shape* c) {
  if (!c) throw fl::InputError("shape is NULL");
  fl::decoding::DecodeShape s;
  s.batch = c->batch;
  s.heads = c->heads;
  s.kv_heads = c->kv_heads;
  s.seq_q = c->seq_q;
  s.head_dim = c->head_dim;
  s.capacity = c->capacity;
  s.page_size = c->page_size;
  s.num_pages = c->num_pages;
  s.pages_per_seq = c->pages_per_seq;
  s.causal = c->causal != 0;
  s.scale = c->scale;
  s.validate();
  return s;
}

void report_io(fl_io* io, const fl::IoCounter& counted, const fl::IoModel* model) {
  if (!io) return;
  io->read_bytes = counted.read;
  io->written_bytes = counted.written;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  io->modelled_read_bytes = model ? model->read : nan;
  io->modelled_written_bytes = model ? model->written : nan;
}

fl::BackwardArgs backward_args(const void* q, const void* k, const void* v, const void* o,
                               const float* lse, const void* dout, void* dq, void* dk, void* dv,
                               void* workspace, void* stream) {
  fl::BackwardArgs a;
  a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.dout = dout;
  a.dq = dq, a.dk = dk, a.dv = dv;
  a.workspace = workspace;
  a.stream = stream;
  return a;
}

// ---- The listing ------------------------------------------------------------------------------

// The registry is filled by static constructors when the library loads and never changes after,
// so the strings handed out through the ABI can be built once and live as long as the library.
struct Entry {
  std::string name, backend, idea;
  bool backward, deterministic;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = [] {
    std::vector<Entry> t;
    for (const fl::Rung* r : fl::Registry::instance().all())
      t.push_back({r->name(), fl::backend_name(r->backend()), r->idea(), r->caps().backward,
                   r->caps().backward && (r->backend() == Backend::Cpu || r->caps().deterministic_backward)});
    return t;
  }();
  return table;
}

const Entry* entry(int i, const char* fn) {
  const Entry* e = nullptr;
  guarded(fn, [&] {
    const auto& t = entries();
    if (i < 0 || i >= int(t.size()))
      throw fl::InputError("rung index " + std::to_string(i) + " is out of range [0, " +
                           std::to_string(t.size()) + ")");
    e = &t[std::size_t(i)];
  });
  return e;
}

}  // namespace

// ---- The library ---------------------------------------------------------------------------------

extern "C" {

int fl_abi_version(void) { return FL_ABI_VERSION; }
const char* fl_version(void) { return FL_VERSION_STRING; }
const char* fl_build_info(void) { return FL_BUILD_INFO; }

int fl_cuda_available(void) {
  std::string why;
  const bool ok = gpu_available(&why);
  if (ok) {
    t_last_error.clear();
  } else {
    t_last_error = "fl_cuda_available: " + why;
  }
  return ok ? 1 : 0;
}

const char* fl_last_error(void) { return t_last_error.c_str(); }

const char* fl_status_name(fl_status s) {
  switch (s) {
    case FL_OK: return "FL_OK";
    case FL_ERR_INVALID: return "FL_ERR_INVALID";
    case FL_ERR_NOT_FOUND: return "FL_ERR_NOT_FOUND";
    case FL_ERR_OUT_OF_MEMORY: return "FL_ERR_OUT_OF_MEMORY";
    case FL_ERR_CUDA: return "FL_ERR_CUDA";
    case FL_ERR_INTERNAL: return "FL_ERR_INTERNAL";
  }
  return "FL_STATUS_UNKNOWN";
}

// ---- Listing ---------------------------------------------------------------------------------------

int fl_rung_count(void) {
  int n = 0;
  guarded("fl_rung_count", [&] { n = int(entries().size()); });
  return n;
}

const char* fl_rung_name(int i) {
  const Entry* e = entry(i, "fl_rung_name");
  return e ? e->name.c_str() : nullptr;
}

const char* fl_rung_backend(int i) {
  const Entry* e = entry(i, "fl_rung_backend");
  return e ? e->backend.c_str() : nullptr;
}

const char* fl_rung_idea(int i) {
  const Entry* e = entry(i, "fl_rung_idea");
  return e ? e->idea.c_str() : nullptr;
}

int fl_rung_has_backward(int i) {
  const Entry* e = entry(i, "fl_rung_has_backward");
  return e && e->backward ? 1 : 0;
}

int fl_rung_has_deterministic_backward(int i) {
  const Entry* e = entry(i, "fl_rung_has_deterministic_backward");
  return e && e->deterministic ? 1 : 0;
}

int fl_rung_supports(const char* rung, const char* backend, const fl_shape* shape,
                     fl_dtype dtype) {
  const fl_status st = guarded("fl_rung_supports", [&] {
    const fl::Rung& r = find_rung(rung, parse_backend(backend));
    r.check_supported(to_shape(shape), to_dtype(dtype));
  });
  return st == FL_OK ? 1 : 0;
}

// ---- Forward ---------------------------------------------------------------------------------------

fl_status fl_forward_workspace_bytes(const char* rung, const char* backend, const fl_shape* shape,
                                     fl_dtype dtype, size_t* bytes) {
  return guarded("fl_forward_workspace_bytes", [&] {
    if (!bytes) throw fl::InputError("bytes (the output) is NULL");
    *bytes = 0;
    const fl::Rung& r = find_rung(rung, parse_backend(backend));
    const fl::AttentionShape s = to_shape(shape);
    const DType t = to_dtype(dtype);
    r.check_supported(s, t);  // a size for a problem the rung refuses would mean nothing
    *bytes = r.workspace_bytes(s, t);
  });
}

fl_status fl_forward(const char* rung, const fl_shape* shape, fl_dtype dtype, const void* q,
                     const void* k, const void* v, void* o, float* lse, void* workspace,
                     size_t workspace_bytes, void* cuda_stream) {
  return guarded("fl_forward", [&] {
    // The arguments first: a bad shape is FL_ERR_INVALID on every machine, GPU or not.
    const fl::AttentionShape s = to_shape(shape);
    const DType t = to_dtype(dtype);
    const fl::Rung& r = find_rung(rung, Backend::Cuda);
    fl::ForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    a.workspace = workspace;
    a.stream = cuda_stream;
    r.check(s, t, a);
    require_workspace(r, s, t, r.workspace_bytes(s, t), workspace, workspace_bytes,
                      "fl_forward_workspace_bytes");
    require_gpu("fl_forward_host");
    for (auto [p, what] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"},
                           {o, "o"}, {lse, "lse"}, {workspace, "workspace"}})
      require_device_pointer(p, what, r);
    r.forward(s, t, a);
  });
}

fl_status fl_forward_host(const char* rung, const fl_shape* shape, fl_dtype dtype, const void* q,
                          const void* k, const void* v, void* o, float* lse, void* workspace,
                          size_t workspace_bytes, fl_io* io) {
  return guarded("fl_forward_host", [&] {
    const fl::AttentionShape s = to_shape(shape);
    const DType t = to_dtype(dtype);
    const fl::Rung& r = find_rung(rung, Backend::Cpu);
    const std::size_t need = r.workspace_bytes(s, t);
    HostWorkspace own;
    fl::IoCounter counted;
    fl::ForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    a.io = &counted;
    // Refuse everything before allocating a workspace for it: a null workspace passes the check
    // here because the library supplies one.
    a.workspace = need ? &counted : nullptr;
    r.check(s, t, a);
    if (workspace)
      require_workspace(r, s, t, need, workspace, workspace_bytes, "fl_forward_workspace_bytes");
    if (!workspace) fl::require_host_memory(double(need), twin_memory_what(r, s, need));
    run_twin(r, s, need, [&] {
      a.workspace = own.get(workspace, need);
      r.forward(s, t, a);
    });
    const fl::IoModel model = r.modelled_io(s, t);
    report_io(io, counted, &model);
  });
}

// ---- Backward ------------------------------------------------------------------------------------

fl_status fl_backward_workspace_bytes(const char* rung, const char* backend, const fl_shape* shape,
                                      fl_dtype dtype, size_t* bytes) {
  return guarded("fl_backward_workspace_bytes", [&] {
    if (!bytes) throw fl::InputError("bytes (the output) is NULL");
    *bytes = 0;
    const fl::Rung& r = find_rung(rung, parse_backend(backend));
    const fl::AttentionShape s = to_shape(shape);
    const DType t = to_dtype(dtype);
    r.check_supported(s, t, /*for_backward=*/true);
    *bytes = r.backward_workspace_bytes(s, t);
  });
}


fl_status fl_backward(const char* rung, const fl_shape* shape, fl_dtype dtype, const void* q,
                      const void* k, const void* v, const void* o, const float* lse,
                      const void* dout, void* dq, void* dk, void* dv, void* workspace,
                      size_t workspace_bytes, void* cuda_stream) {
  return fl_backward_ex(rung, shape, dtype, q, k, v, o, lse, dout, dq, dk, dv, workspace,
                        workspace_bytes, 0u, cuda_stream);
}

fl_status fl_backward_ex(const char* rung, const fl_shape* shape, fl_dtype dtype, const void* q,
                         const void* k, const void* v, const void* o, const float* lse,
                         const void* dout, void* dq, void* dk, void* dv, void* workspace,
                         size_t workspace_bytes, unsigned flags, void* cuda_stream) {
  return guarded(flags ? "fl_backward_ex" : "fl_backward", [&] {
    // The arguments first: a bad shape is FL_ERR_INVALID on every machine, GPU or not.
    const fl::AttentionShape s = to_shape(shape);
    const DType t = to_dtype(dtype);
    if (flags & ~FL_BACKWARD_DETERMINISTIC)
      throw fl::InputError("fl_backward_ex: unknown flag bits " + std::to_string(flags & ~FL_BACKWARD_DETERMINISTIC) +
                           "; the flags are FL_BACKWARD_DETERMINISTIC (1)");
    const fl::Rung& r = find_rung(rung, Backend::Cuda, "fl_backward_host");
    fl::BackwardArgs a = backward_args(q, k, v, o, lse, dout, dq, dk, dv, workspace, cuda_stream);
    a.deterministic = (flags & FL_BACKWARD_DETERMINISTIC) != 0;
    r.check(s, t, a);
    require_workspace(r, s, t, r.backward_workspace_bytes(s, t), workspace, workspace_bytes,
                      "fl_backward_workspace_bytes");
    require_gpu("fl_backward_host");
    for (auto [p, what] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"},
                           {o, "o"}, {lse, "lse"}, {dout, "dout"}, {dq, "dq"}, {dk, "dk"},
                           {dv, "dv"}, {workspace, "workspace"}})
      require_device_pointer(p, what, r);
    r.backward(s, t, a);
  });
}

fl_status fl_backward_host(const char* rung, const fl_shape* shape, fl_dtype dtype, const void* q,
                           const void* k, const void* v, const void* o, const float* lse,
                           const void* dout, void* dq, void* dk, void* dv, void* workspace,
                           size_t workspace_bytes, fl_io* io) {
  return guarded("fl_backward_host", [&] {
    const fl::AttentionShape s = to_shape(shape);
    const DType t = to_dtype(dtype);
    const fl::Rung& r = find_rung(rung, Backend::Cpu);
    const std::size_t need = r.backward_workspace_bytes(s, t);
    HostWorkspace own;
    fl::IoCounter counted;
    fl::BackwardArgs a = backward_args(q, k, v, o, lse, dout, dq, dk, dv, nullptr, nullptr);
    a.io = &counted;
    a.workspace = need ? &counted : nullptr;  // as in fl_forward_host: checked before allocating
    r.check(s, t, a);
    if (workspace)
      require_workspace(r, s, t, need, workspace, workspace_bytes, "fl_backward_workspace_bytes");
    if (!workspace) fl::require_host_memory(double(need), twin_memory_what(r, s, need));
    run_twin(r, s, need, [&] {
      a.workspace = own.get(workspace, need);
      r.backward(s, t, a);
    });
    const fl::IoModel model = r.modelled_backward_io(s, t);  // NaN where the rung has no closed form
    report_io(io, counted, &model);
  });
}

int fl_decode_choose_splits(const fl_decode_shape* shape, int64_t max_len, int sm_count) {
  int n = -1;
  guarded("fl_decode_choose_splits", [&] {
    const fl::decoding::DecodeShape s = to_decode_shape(shape);
    if (max_len < 0 || sm_count < 1)
      throw fl::InputError("max_len must be >= 0 and sm_count >= 1 (got " + std::to_string(max_len) + ", " +
                           std::to_string(sm_count) + ")");
    n = fl::decoding::choose_splits(s, max_len, sm_count);
  });
  return n;
}

fl_status fl_decode_workspace_bytes(const fl_decode_shape* shape, int splits, size_t* bytes) {
  return guarded("fl_decode_workspace_bytes", [&] {
    if (!bytes) throw fl::InputError("bytes (the output) is NULL");
    const fl::decoding::DecodeShape s = to_decode_shape(shape);
    if (splits < 1 || splits > fl::decoding::kMaxSplits)
      throw fl::InputError("splits must be 1.." + std::to_string(fl::decoding::kMaxSplits) + " here (not " +
                           std::to_string(splits) + "): ask fl_decode_choose_splits for the number first");
    *bytes = fl::decoding::workspace_bytes(s, splits);
  });
}

fl_status fl_decode_host(const fl_decode_shape* shape, fl_dtype dtype, const void* q, const void* k, const void* v,
                         const int32_t* page_table, const int32_t* kv_len, void* o, float* lse, int splits,
                         void* workspace, size_t workspace_bytes, fl_io* io) {
  return guarded("fl_decode_host", [&] {
    const fl::decoding::DecodeShape s = to_decode_shape(shape);
    const DType t = to_dtype(dtype);
    if (!kv_len) throw fl::InputError("rung 10_decoding: kv_len is NULL");
    if (splits < 0 || splits > fl::decoding::kMaxSplits)
      throw fl::InputError("rung 10_decoding: splits must be 0 (choose) or 1.." +
                           std::to_string(fl::decoding::kMaxSplits) + ", not " + std::to_string(splits));
    int64_t max_len = 0;
    for (int64_t b = 0; b < s.batch; ++b) max_len = std::max<int64_t>(max_len, kv_len[b]);
    fl::decoding::DecodeArgs a;
    a.q = q, a.k = k, a.v = v, a.page_table = page_table, a.kv_len = kv_len, a.o = o, a.lse = lse;
    a.splits = splits > 0 ? splits : fl::decoding::choose_splits(s, max_len, a.sm_count);
    const std::size_t need = fl::decoding::workspace_bytes(s, a.splits);
    if (workspace && workspace_bytes < need)
      throw fl::InputError("rung 10_decoding: the workspace has " + std::to_string(workspace_bytes) + " bytes, " +
                           std::to_string(need) + " needed (fl_decode_workspace_bytes)");
    std::vector<unsigned char> own;
    if (!workspace && need) {
      fl::require_host_memory(double(need), "rung 10_decoding's workspace on " + s.str());
      own.resize(need);
    }
    a.workspace = workspace ? workspace : (need ? own.data() : nullptr);
    fl::IoCounter counted;
    a.io = &counted;
    fl::decoding::twin_decode(s, t, a);
    const fl::IoModel model = fl::decoding::io_model(s, t, std::vector<int32_t>(kv_len, kv_len + s.batch), a.splits);
    report_io(io, counted, &model);
  });
}

int fl_decode_version_count(void) {
  int n = 0;
  guarded("fl_decode_version_count", [&] { n = int(fl::decoding::kernels().size()); });
  return n;
}

namespace {
const fl::decoding::Kernel* decode_version(int i, const char* fn) {
  const auto& all = fl::decoding::kernels();
  const fl::decoding::Kernel* k = nullptr;
  guarded(fn, [&] {
    if (i < 0 || i >= int(all.size()))
      throw fl::InputError("index " + std::to_string(i) + " is outside 0.." + std::to_string(int(all.size()) - 1));
    k = &all[std::size_t(i)];
  });
  return k;
}
}  // namespace

const char* fl_decode_version_name(int i) {
  const fl::decoding::Kernel* k = decode_version(i, "fl_decode_version_name");
  return k ? k->name.c_str() : nullptr;
}

const char* fl_decode_version_idea(int i) {
  const fl::decoding::Kernel* k = decode_version(i, "fl_decode_version_idea");
  return k ? k->idea.c_str() : nullptr;
}

fl_status fl_decode(const char* version, const fl_decode_shape* shape, fl_dtype dtype, const void* q, const void* k,
                    const void* v, const int32_t* page_table, const int32_t* kv_len, void* o, float* lse, int splits,
                    void* workspace, size_t workspace_bytes, void* cuda_stream) {
  return guarded("fl_decode", [&] {
    const fl::decoding::DecodeShape s = to_decode_shape(shape);
    const DType t = to_dtype(dtype);
    if (!version) throw fl::InputError("version is NULL (fl_decode_version_name lists them)");
    const fl::decoding::Kernel* kernel = nullptr;
    try {
      kernel = &fl::decoding::find_kernel(version);
    } catch (const fl::InputError& e) {
      throw NotFound(e.what());
    }
    require_gpu("fl_decode_host");
    fl::decoding::DecodeArgs a;
    a.q = q, a.k = k, a.v = v, a.page_table = page_table, a.kv_len = kv_len, a.o = o, a.lse = lse;
    a.workspace = workspace, a.splits = splits, a.stream = cuda_stream;
    a.sm_count = fl::gpu::sm_count();
    fl::decoding::decode(*kernel, s, t, a, workspace_bytes);
  });
}

fl_status fl_stream_read(const void* data, size_t bytes, float* sink, void* cuda_stream) {
  return guarded("fl_stream_read", [&] {
    std::string why;
    if (!fl::gpu::available(&why)) throw NoGpu("no GPU to measure: " + why);
    fl::decoding::stream_read(data, bytes, sink, cuda_stream);
  });
}

int fl_ring_chunks(const fl_ring_shape* shape, int64_t rank, int64_t chunks[2]) {
  int n = -1;
  guarded("fl_ring_chunks", [&] {
    const fl::ring::RingShape s = to_ring_shape(shape);
    if (!chunks) throw fl::InputError("chunks is NULL: pass room for two");
    if (rank < 0 || rank >= s.ranks)
      throw fl::InputError("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(s.ranks) + ")");
    const std::vector<int64_t> c = s.chunks_of(rank);
    for (std::size_t i = 0; i < c.size(); ++i) chunks[i] = c[i];
    n = int(c.size());
  });
  return n;
}

fl_status fl_ring_forward_host(const fl_ring_shape* shape, fl_dtype dtype, const void* q, const void* k,
                               const void* v, void* o, float* lse) {
  return guarded("fl_ring_forward_host", [&] {
    fl::ring::twin_ring_forward(to_ring_shape(shape), to_dtype(dtype), q, k, v, o, lse);
  });
}

int fl_ring_nccl_available(void) {
  int ok = 0;
  guarded("fl_ring_nccl_available", [&] {
    require_nccl();
    ok = 1;
  });
  return ok;
}

fl_status fl_ring_unique_id(void* id) {
  return guarded("fl_ring_unique_id", [&] {
    require_nccl();
    fl::ring::nccl_unique_id(id);
  });
}

fl_status fl_ring_comm_init(const void* id, int ranks, int rank, void** comm) {
  return guarded("fl_ring_comm_init", [&] {
    if (!comm) throw fl::InputError("comm is NULL: pass where to put the communicator");
    *comm = nullptr;
    require_nccl();
    require_gpu("fl_ring_forward_host");
    *comm = fl::ring::nccl_comm_init(id, ranks, rank);
  });
}

fl_status fl_ring_comm_destroy(void* comm) {
  return guarded("fl_ring_comm_destroy", [&] {
    require_nccl();
    fl::ring::nccl_comm_destroy(comm);
  });
}

fl_status fl_ring_forward(const fl_ring_shape* shape, fl_dtype dtype, const void* q, const void* k, const void* v,
                          void* o, float* lse, void* nccl_comm, void* cuda_stream) {
  return guarded("fl_ring_forward", [&] {
    require_nccl();
    require_gpu("fl_ring_forward_host");
    // Nothing this rank is given may stop it before the ranks' agreement: the others would wait
    // for it there. A NULL shape (RingShape's defaults stand in) or an unknown dtype is handed on as
    // refused,
    // a bad shape is refused there, and every rank returns FL_ERR_INVALID together.
    std::string refused;
    fl::ring::RingShape s;
    if (shape) s = ring_shape_fields(shape);
    else refused = "shape is NULL";
    DType t = DType::BF16;
    try {
      t = to_dtype(dtype);
    } catch (const fl::InputError& e) {
      if (refused.empty()) refused = e.what();
    }
    fl::ring::nccl_ring_forward(s, t, q, k, v, o, lse, nccl_comm, cuda_stream, refused);
  });
}

struct fl_ring_rank {
  std::unique_ptr<fl::ring::NcclRank> rank;
};

fl_status fl_ring_open(const fl_ring_shape* shape, fl_dtype dtype, void* nccl_comm, void* cuda_stream,
                       fl_ring_rank** rank) {
  return guarded("fl_ring_open", [&] {
    require_nccl();
    require_gpu("fl_ring_forward_host");
    // As in fl_ring_forward: what this rank alone gets wrong is refused in the ranks' agreement.
    std::string refused;
    fl::ring::RingShape s;
    if (shape) s = ring_shape_fields(shape);
    else refused = "shape is NULL";
    DType t = DType::BF16;
    try {
      t = to_dtype(dtype);
    } catch (const fl::InputError& e) {
      if (refused.empty()) refused = e.what();
    }
    if (!rank && refused.empty()) refused = "rank is NULL: pass where to put the opened rank";
    if (rank) *rank = nullptr;
    auto opened = std::make_unique<fl_ring_rank>();
    opened->rank = fl::ring::nccl_ring_open("", s, t, nccl_comm, cuda_stream, refused);
    if (rank) *rank = opened.release();  // (a NULL rank was refused in the agreement above)
  });
}

fl_status fl_ring_rank_forward(fl_ring_rank* rank, const void* q, const void* k, const void* v, void* o, float* lse) {
  return guarded("fl_ring_rank_forward", [&] {
    if (!rank) throw fl::InputError("rank is NULL: pass what fl_ring_open gave this rank");
    rank->rank->forward(q, k, v, o, lse);
  });
}

fl_status fl_ring_rank_backward(fl_ring_rank* rank, const void* q, const void* k, const void* v, const void* o,
                                const float* lse, const void* dout, void* dq, void* dk, void* dv) {
  return guarded("fl_ring_rank_backward", [&] {
    if (!rank) throw fl::InputError("rank is NULL: pass what fl_ring_open gave this rank");
    rank->rank->backward(q, k, v, o, lse, dout, dq, dk, dv);
  });
}

fl_status fl_ring_close(fl_ring_rank* rank) {
  return guarded("fl_ring_close", [&] { delete rank; });
}

}  // extern "C"
