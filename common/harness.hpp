// Running a rung on a problem the same way everywhere (ladder, tests, benchmarks): fresh random
// inputs rounded to the dtype, outputs poisoned with NaN before every run, inputs and outputs
// placed where the rung runs, device memory checked before anything is allocated.
#pragma once

#include <cstdint>
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

struct ForwardCheck {
  ErrorStats o, lse;
  bool pass = false;
  std::string str() const;
};

// Compares the rows `ref` holds against the fp64 oracle. `tol` overrides the dtype's tolerance.
ForwardCheck check_forward(const AttentionShape& s, DType t, const ForwardOutputs& out,
                           const ReferenceForward& ref, double tol = 0);

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
// rung), gradients poisoned (NaN) first; `io` counts a twin's traffic.
BackwardOutputs run_backward(const Rung& r, const AttentionShape& s, DType t, const Inputs& in,
                             const BackwardInputs& bin, IoCounter* io = nullptr);

struct BackwardCheck {
  ErrorStats dq, dk, dv;
  bool pass = false;
  std::string str() const;
};
BackwardCheck check_backward(DType t, const BackwardOutputs& out, const ReferenceBackward& ref,
                             double tol = 0);

}  // namespace fl
