// Running a rung on a problem the same way everywhere (ladder, tests, benchmarks): fresh random
// inputs rounded to the dtype, outputs poisoned with NaN before every run, inputs and outputs
// placed where the rung runs, device memory checked before anything is allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compare.hpp"
#include "reference.hpp"
#include "rung.hpp"

namespace fl {

enum class InputKind {
  Normal,       // q, k, v ~ N(0, 1)
  LargeLogits,  // q, k shifted so logits reach ~120: exp() of them overflows fp32 (max ~88.7)
  ConstantRow,  // batch 0's first key/value head has every key equal: each of its rows of S is
                // constant, so P is uniform and O is the mean of V
  RisingLogits,  // a row's logits drift along the keys, from the first key to the last up by as
                 // much as 120 or down by as much as 60, a pace drawn per row: each row's maximum
                 // keeps moving as blocks of keys arrive, some rows' fast, some slowly, some not
                 // at all (rung 08's tests)
};
const char* input_kind_name(InputKind k);

struct Inputs {
  std::vector<float> q, k, v;  // exactly representable in the dtype they were made for
  uint64_t seed = 0;
  InputKind kind = InputKind::Normal;
};
Inputs make_inputs(const AttentionShape& s, DType t, uint64_t seed,
                   InputKind kind = InputKind::Normal);

float round_to(DType t, float x);  // x rounded to the nearest fp16/bf16 value (identity for fp32)
std::vector<unsigned char> to_storage(const std::vector<float>& x, DType t);
std::vector<float> from_storage(const std::vector<unsigned char>& bytes, DType t);

struct ForwardOutputs {
  std::vector<float> o;    // [B, H, Nq, d]
  std::vector<float> lse;  // [B, H, Nq]
};

struct BackwardOutputs;

// ---- Staging: the one place a rung's arrays are put where it runs ---------------------------------
// Every array a forward (and, when asked, a backward) of one rung on one problem reads and writes,
// in the call's dtype, in host memory for a CPU twin or device memory for a GPU rung (free device
// memory checked before anything is allocated: gpu::OutOfMemory, naming `what`; a GPU rung's
// outputs are copied to the host only when fetched), and the argument structs that point at them.
// Outputs are poisoned (NaN) when staged; poison_forward/poison_backward do it again. ForwardRun,
// run_backward and BackwardRun are built on it.
class Staging {
 public:
  // Q, K, V from `in`; O, lse and the forward's workspace; with `dout` (a backward), dO from it,
  // dQ, dK, dV and the backward's workspace too.
  Staging(const Rung& r, const AttentionShape& s, DType t, const Inputs& in, const std::vector<float>* dout,
          const std::string& what);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // The bytes of every array above where the rung runs (workspaces included).
  static std::size_t bytes(const Rung& r, const AttentionShape& s, DType t, bool backward);

  bool on_gpu() const;
  ForwardArgs forward_args(IoCounter* io = nullptr) const;
  BackwardArgs backward_args(IoCounter* io = nullptr) const;
  void set_forward_outputs(const std::vector<float>& o, const std::vector<float>& lse);  // given O and lse
  void poison_forward();   // NaN into O and lse
  void poison_backward();  // NaN into dQ, dK, dV
  ForwardOutputs forward_outputs() const;  // waits for the device, converts to fp32
  BackwardOutputs gradients() const;
  // Median milliseconds of `fn` over `reps` calls after `warmup`: CUDA events around each call
  // with L2 flushed before it (outside the timed region) on the GPU, the host clock for a twin.
  double time_ms(const std::function<void()>& fn, int warmup, int reps) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One rung's inputs and outputs, allocated where it runs. GPU rungs: checks free device memory
// first and throws gpu::OutOfMemory (nothing allocated) if the problem does not fit.
class ForwardRun {
 public:
  ForwardRun(const Rung& r, const AttentionShape& s, DType t, const Inputs& in);
  ~ForwardRun();
  ForwardRun(const ForwardRun&) = delete;
  ForwardRun& operator=(const ForwardRun&) = delete;

  void poison();                       // NaN into O and lse
  void run(IoCounter* io = nullptr);   // one forward (no poisoning, no sync)
  ForwardOutputs fetch() const;        // waits for the device, converts to fp32
  // Median milliseconds over `reps` calls after `warmup`; GPU rungs flush L2 before each call.
  double time_ms(int warmup, int reps);
  std::size_t extra_bytes() const;     // the rung's workspace
  // All device memory this problem takes on the rung: inputs, outputs and workspace.
  static std::size_t device_bytes(const Rung& r, const AttentionShape& s, DType t);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- What the arithmetic allows -------------------------------------------------------------
// A relative L2 error means nothing where the exact answer is ~0 (rung 07's dQ on a head whose keys
// are all equal: Σ_j dS_ij = 0 times one key), and no rung can beat the problem's own condition
// (logits of 120, or a scale of 1000, turn the last bits of Q·Kᵀ into visible changes of P). So a
// check may also hold a rung to how far the exact (fp64) answer moves when every input is changed
// by a relative amount of at most the dtype's tolerance: the rung passes when its L2 error is
// within the tolerance relative to the answer, OR within that move (the "condition floor"). On a
// well-conditioned problem the move is about the tolerance itself, so nothing is loosened there;
// a real bug (a wrong index, a missing scale, an unwritten element) is far past both.

// `in` with every element of Q, K, V multiplied by (1 + δ), δ uniform in [−eta, eta], from `seed`.
Inputs perturbed_inputs(const Inputs& in, double eta, uint64_t seed);
std::vector<float> perturbed(const std::vector<float>& x, double eta, uint64_t seed);
// The seed perturbed_inputs is given for inputs drawn with `seed` (a fixed function of it).
uint64_t perturbation_seed(uint64_t seed);

struct ForwardCheck {
  ErrorStats o, lse;
  double o_floor = 0;    // ‖O(moved inputs) − O‖₂ (0: no condition floor was given)
  double lse_floor = 0;  // max |lse(moved inputs) − lse|
  double tolerance = 0;  // the relative L2 tolerance it was held to
  bool pass = false;
  std::string str() const;
  bool passed_on_floor() const;  // passes only because of the condition floor
};

// Compares the rows `ref` holds against the fp64 oracle. `tol` overrides the dtype's tolerance.
// `moved`, when given, is the oracle on the same rows of inputs changed by the tolerance
// (perturbed_inputs): the condition floor above.
ForwardCheck check_forward(const AttentionShape& s, DType t, const ForwardOutputs& out,
                           const ReferenceForward& ref, double tol = 0,
                           const ReferenceForward* moved = nullptr);

// ---- backward ---------------------------------------------------------------------------------

// What a backward pass reads besides Q, K, V: the forward's O and lse (from the fp64 oracle,
// rounded as a forward in that dtype would store them) and a random upstream gradient dO.
struct BackwardInputs {
  std::vector<float> o;     // [B, H, Nq, d], exact in the dtype
  std::vector<float> lse;   // [B, H, Nq], fp32
  std::vector<float> dout;  // [B, H, Nq, d], exact in the dtype
};
BackwardInputs make_backward_inputs(const AttentionShape& s, DType t, const Inputs& in, uint64_t seed);

struct BackwardOutputs {
  std::vector<float> dq;  // [B, H, Nq, d]
  std::vector<float> dk;  // [B, Hkv, Nk, d]
  std::vector<float> dv;  // [B, Hkv, Nk, d]
};

// Runs one backward of a rung where it runs (host memory for a twin, device memory for a GPU
// rung), gradients poisoned (NaN) first; `io` counts a twin's traffic; `deterministic` asks for the
// rung's deterministic mode (BackwardArgs::deterministic).
BackwardOutputs run_backward(const Rung& r, const AttentionShape& s, DType t, const Inputs& in,
                             const BackwardInputs& bin, IoCounter* io = nullptr, bool deterministic = false);

// One rung's forward and backward on one problem, for timing, as in training: Q, K, V, a random dO
// (drawn with `dout_seed`), and the O and lse of the rung's own forward (Staging). Correctness is
// the oracle's business (oracle.hpp); this class only runs and times.
class BackwardRun {
 public:
  // `deterministic`: every backward in the rung's deterministic mode (BackwardArgs::deterministic).
  BackwardRun(const Rung& r, const AttentionShape& s, DType t, const Inputs& in, uint64_t dout_seed,
              bool deterministic = false);
  // All memory a forward and backward of this problem take where the rung runs.
  static std::size_t device_bytes(const Rung& r, const AttentionShape& s, DType t) {
    return Staging::bytes(r, s, t, /*backward=*/true);
  }
  void forward();
  void backward(IoCounter* io = nullptr);
  void synchronize() const;
  // Median milliseconds of the backward alone (on the O and lse of one forward run first), and of
  // a forward followed by a backward, one training step of the layer.
  double time_backward_ms(int warmup, int reps);
  double time_forward_backward_ms(int warmup, int reps);
  // N(0, 1) values, exact in the dtype, from their own generator (dO).
  static std::vector<float> random_normal(int64_t n, DType t, uint64_t seed);

 private:
  const Rung& rung_;
  AttentionShape shape_;
  DType dtype_;
  std::unique_ptr<Staging> st_;
  ForwardArgs fa_;
  BackwardArgs ba_;
  bool forward_done_ = false;
};

struct BackwardCheck {
  ErrorStats dq, dk, dv;
  double dq_floor = 0, dk_floor = 0, dv_floor = 0;  // condition floors (0: none given)
  double tolerance = 0;
  bool pass = false;
  std::string str() const;
  bool passed_on_floor() const;  // passes only because of a condition floor
};
// `moved`, when given, is the oracle's backward on inputs (Q, K, V and dO) changed by the
// tolerance: the condition floor above.
BackwardCheck check_backward(DType t, const BackwardOutputs& out, const ReferenceBackward& ref,
                             double tol = 0, const ReferenceBackward* moved = nullptr);
// The condition floor's gradients: the exact backward (reference_backward_given) of every input a
// rung's backward is handed, changed by a relative amount of at most the tolerance of its type: Q,
// K, V, O and dO by the dtype's, the log-sum-exp by fp32's (it is fp32 in every dtype).
ReferenceBackward reference_backward_moved(const AttentionShape& s, DType t, const Inputs& in,
                                           const BackwardInputs& bin);

}  // namespace fl
