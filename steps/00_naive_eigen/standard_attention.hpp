// Standard attention: three passes, with S and P stored in device memory in between.
//
//   pass 1  S = Q·Kᵀ·scale (masked entries −∞)   reads Q, K    writes S    [B, H, Nq, Nk] fp32
//   pass 2  P = softmax(S), lse                   reads S       writes P    [B, H, Nq, Nk] fp32
//   pass 3  O = P·V                               reads P, V    writes O
//
// Rungs 00, 01 and 02 differ only in pass 2, the softmax; this file holds passes 1 and 3 and the
// driver, so `diff steps/00_naive_eigen/naive_eigen.cpp steps/01_safe_softmax/safe_softmax.cpp`
// shows the one idea each rung teaches.
#pragma once

#include <type_traits>

#include "io_counter.hpp"
#include "rung.hpp"

namespace fl::standard {

// S and P, each B·H·Nq·Nk fp32.
std::size_t workspace_bytes(const AttentionShape& s);

// Closed-form traffic for one forward, the formula the twins are pinned to. Per (batch, head),
// in fp32 words: Q (Nq·d) and K (Nk·d) read once to make S; S (Nq·Nk) written; the softmax reads
// S `softmax_reads` times and writes P (Nq·Nk) and lse (Nq); P (Nq·Nk) and V (Nk·d) read once to
// make O; O (Nq·d) written. Θ(N·d + N²): the N² terms are what FlashAttention removes.
IoModel io_model(const AttentionShape& s, int softmax_reads);

// Capabilities shared by rungs 00–02: fp32, any head dim up to 256, causal, GQA.
Capabilities capabilities();

// ---- CPU twin -------------------------------------------------------------------------------
// The softmax pass of a twin: S, P are [rows, Nk], lse is [rows, 1], rows = B·H·Nq, all in the
// twin's device memory. Each rung writes its own.
using TwinSoftmax = void (*)(const HbmMatrix<float>& S, HbmMatrix<float>& P, HbmMatrix<float>& lse);

// Runs passes 1, 2 (the given softmax) and 3 on host memory, counting traffic into a.io if set.
void twin_forward(const AttentionShape& s, const ForwardArgs& a, TwinSoftmax softmax);

// ---- GPU ------------------------------------------------------------------------------------
// The softmax pass of a GPU rung: launches on `stream` over S, P: [rows, cols], lse: [rows].
using GpuSoftmax = void (*)(const float* S, float* P, float* lse, int64_t rows, int64_t cols,
                            void* stream);

// Launches passes 1, 2 (the given softmax) and 3 on device pointers (CUDA builds only).
void gpu_forward(const AttentionShape& s, const ForwardArgs& a, GpuSoftmax softmax);

// ---- The rung class of 00–02 -----------------------------------------------------------------
// All that differs between those rungs is named here; the softmax pass comes with the backend.
struct Spec {
  const char* name;   // the directory name, "00_naive_eigen"
  const char* idea;   // one line for `ladder --list`
  int softmax_reads;  // how many times the softmax pass reads each row of S
};

// The rung on either backend, as every rung is declared (common/rung.hpp): the twin registers
// `Register<StandardRung<Backend::Cpu>>{kSpec, twin_softmax}` in the rung's .cpp, the kernels
// `Register<StandardRung<Backend::Cuda>>{kSpec, gpu_softmax}` in its .cu.
template <Backend B>
class StandardRung final : public Rung {
 public:
  using Softmax = std::conditional_t<B == Backend::Cpu, TwinSoftmax, GpuSoftmax>;
  StandardRung(Spec spec, Softmax softmax) : spec_(spec), softmax_(softmax) {}
  std::string name() const override { return spec_.name; }
  std::string idea() const override { return spec_.idea; }
  Backend backend() const override { return B; }
  Capabilities caps() const override { return capabilities(); }
  std::size_t workspace_bytes(const AttentionShape& s, DType) const override {
    return standard::workspace_bytes(s);
  }
  IoModel modelled_io(const AttentionShape& s, DType) const override {
    return io_model(s, spec_.softmax_reads);
  }
  void forward(const AttentionShape& s, DType, const ForwardArgs& a) const override {
    if constexpr (B == Backend::Cpu) twin_forward(s, a, softmax_);
    else gpu_forward(s, a, softmax_);
  }

 private:
  Spec spec_;
  Softmax softmax_;
};

}  // namespace fl::standard
