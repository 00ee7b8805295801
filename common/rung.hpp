// The one interface every rung implements, and the registry rungs add themselves to.
//
// A rung is one step of the ladder on one backend: steps/00_naive_eigen registers a CPU twin and,
// when built with CUDA, a GPU kernel under the same name. Every rung is declared the same way: a
// class template over the backend that says what the rung is (name, idea, what it accepts, its
// IO model) and runs the twin or the kernel,
//     template <Backend B> class MyRung final : public Rung { ... };
// registered with one line in the twin's .cpp and one in the kernel's .cu,
//     static const fl::Register<MyRung<Backend::Cpu>> registered;   // MyRung<Backend::Cuda> in the .cu
// (a rung of versions passes the version, and its kernel, to the constructor), and its directory's
// CMakeLists.txt adds it with one line (flash_ladder_add_rung). Nothing else in the project lists
// the rungs.
#pragma once

#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io_model.hpp"
#include "problem.hpp"

namespace fl {

enum class Backend { Cpu, Cuda };
const char* backend_name(Backend b);  // "cpu", "cuda"

// What a rung accepts. Anything else is refused by Rung::check with a message naming the rung.
struct Capabilities {
  std::vector<DType> dtypes{DType::F32};
  std::vector<int> head_dims;  // the head dims it runs; empty: any d in [1, max_head_dim]
  int max_head_dim = 256;
  bool causal = true;
  bool gqa = true;              // Hkv < H
  bool backward = false;
  // Its GPU backward runs a deterministic mode (BackwardArgs::deterministic). A CPU twin is
  // deterministic as it is: one thread, one order.
  bool deterministic_backward = false;
  std::string workspace_what;   // what its extra device memory holds, for messages ("S and P ...")
};

// Pointers live where the rung runs: host memory for Backend::Cpu, device memory for ::Cuda.
// Element type is the dtype of the call (float for fp32, 16-bit storage for fp16/bf16).
struct ForwardArgs {
  const void* q = nullptr;  // [B, H, Nq, d]
  const void* k = nullptr;  // [B, Hkv, Nk, d]
  const void* v = nullptr;  // [B, Hkv, Nk, d]
  void* o = nullptr;        // [B, H, Nq, d]
  float* lse = nullptr;     // [B, H, Nq], natural log; −∞ for a row that sees no key
  void* workspace = nullptr;     // workspace_bytes() bytes where the rung runs (may be null if 0)
  void* stream = nullptr;        // cudaStream_t for GPU rungs; ignored by CPU twins
  IoCounter* io = nullptr;       // CPU twins count their device-memory traffic here if non-null
};

struct BackwardArgs {
  const void* q = nullptr;    // [B, H, Nq, d]
  const void* k = nullptr;    // [B, Hkv, Nk, d]
  const void* v = nullptr;    // [B, Hkv, Nk, d]
  const void* o = nullptr;    // [B, H, Nq, d]
  const float* lse = nullptr; // [B, H, Nq]
  const void* dout = nullptr; // [B, H, Nq, d]
  void* dq = nullptr;         // [B, H, Nq, d]    gradients in the call's dtype
  void* dk = nullptr;         // [B, Hkv, Nk, d]  summed over the query heads of each group
  void* dv = nullptr;         // [B, Hkv, Nk, d]
  void* workspace = nullptr;
  void* stream = nullptr;
  IoCounter* io = nullptr;
  // The same dQ, dK and dV bits on every run of the same inputs: the contributions to each element
  // added in a fixed order (rungs whose caps().deterministic_backward; refused by others' check).
  bool deterministic = false;
};

class Rung {
 public:
  virtual ~Rung() = default;

  virtual std::string name() const = 0;     // "00_naive_eigen", "06_tensor_core_mma/v3_pipeline"
  virtual Backend backend() const = 0;
  virtual std::string idea() const = 0;     // one line: what this rung teaches
  virtual Capabilities caps() const = 0;
  // Why this rung cannot run on this machine now (a GPU or an instruction set it needs), or empty
  // when it can. check_supported refuses every call with it, so the ladder, the tests and the C ABI
  // say it instead of failing.
  virtual std::string unavailable() const { return {}; }

  // Extra memory the rung needs where it runs, beyond Q, K, V, O and lse.
  virtual std::size_t workspace_bytes(const AttentionShape&, DType) const { return 0; }
  virtual std::size_t backward_workspace_bytes(const AttentionShape&, DType) const { return 0; }

  // Bytes its algorithm moves between device memory and on-chip memory (closed form). A CPU
  // twin's counted traffic equals this exactly; tests pin it.
  virtual IoModel modelled_io(const AttentionShape&, DType) const = 0;
  // The same for the backward pass of a rung that has one. NaN (the default) where the rung gives
  // no closed form for it; where it does, its twin's counted backward traffic equals it.
  virtual IoModel modelled_backward_io(const AttentionShape&, DType) const {
    return {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
  }

  // Computes O and lse. Call check() first (the harness and the C ABI do).
  virtual void forward(const AttentionShape&, DType, const ForwardArgs&) const = 0;
  virtual void backward(const AttentionShape&, DType, const BackwardArgs&) const;

  // Refuses, before any work, a bad shape, a dtype / head dim / mask / GQA the rung does not run,
  // a null pointer or a missing workspace. Throws InputError naming the rung and what it supports.
  void check(const AttentionShape&, DType, const ForwardArgs&) const;
  void check(const AttentionShape&, DType, const BackwardArgs&) const;
  void check_supported(const AttentionShape&, DType, bool for_backward = false) const;
  bool supports(const AttentionShape&, DType, std::string* why = nullptr) const;

  std::string label() const { return name() + " (" + backend_name(backend()) + ")"; }
  std::string step() const;  // the directory part of name(): "06_tensor_core_mma"
};

// Names in the order a reader counts them: runs of digits compare as numbers, so that
// 08_hopper_forward/v9_three_consumers comes before v10_end_aligned (as text it would come after).
bool natural_less(std::string_view a, std::string_view b);

class Registry {
 public:
  static Registry& instance();
  void add(std::unique_ptr<Rung> r);  // refuses a duplicate (name, backend)
  std::vector<const Rung*> all() const;  // ordered by name (natural_less), then CPU before CUDA
  const Rung* find(std::string_view name, Backend b) const;  // nullptr if not built
  std::vector<std::string> names() const;  // distinct names, in order
  // The GPU rungs of this build with a deterministic backward, "a, b" (for messages); "none" if
  // there are none.
  std::string deterministic_backward_names() const;

 private:
  std::vector<std::unique_ptr<Rung>> rungs_;
};

// `static const Register<MyRung> registered{args...};` adds MyRung(args...) at program start.
template <class R>
struct Register {
  template <class... Args>
  explicit Register(Args&&... args) {
    Registry::instance().add(std::make_unique<R>(std::forward<Args>(args)...));
  }
};

}  // namespace fl
