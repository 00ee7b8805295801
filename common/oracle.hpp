// The fp64 oracle as the ladder and the benchmarks use it, beside the harness that stages a rung's
// data (harness.hpp): one problem's inputs and its reference answers, each computed the first time
// a rung needs it, with the condition floors its checks allow. A rung's data then goes ladder →
// registry → rung → harness and oracle, all in common/.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "reference.hpp"

namespace fl {

// The fp64 backward oracle holds whole Nq×Nk matrices of each head (P, dP, dS) and costs about
// 14·B·H·Nq·Nk·d flops with the forward that makes its O and lse: past this many B·H·Nq·Nk·d
// (1×4×512×512×64, the ladder's default problem, a fraction of a second) the gradients are
// checked on a smaller problem instead (backward_check_shape).
inline constexpr double kBackwardOracleLimit = double(int64_t(1) << 26);

inline double oracle_cost(const AttentionShape& s) {
  return double(s.batch) * double(s.heads) * double(s.seq_q) * double(s.seq_k) * double(s.head_dim);
}

// The problem a backward's gradients are checked on: the problem itself when the oracle can afford
// it; otherwise one group of query heads (B = 1, Hkv = 1, H = H/Hkv, so a GQA sum still happens)
// with the sequences halved until it can. d, the mask and the dtype stay: the same kernel runs, on a
// problem with fewer blocks. Nq and Nk are halved together while equal, else the longer one.
inline AttentionShape backward_check_shape(const AttentionShape& s, double limit = kBackwardOracleLimit) {
  if (oracle_cost(s) <= limit) return s;
  AttentionShape c = s;
  c.batch = 1;
  c.kv_heads = 1;
  c.heads = s.group();
  while (oracle_cost(c) > limit && std::max(c.seq_q, c.seq_k) > 1) {
    if (c.seq_q == c.seq_k) c.seq_q = c.seq_k = (c.seq_q + 1) / 2;
    else if (c.seq_k > c.seq_q) c.seq_k = (c.seq_k + 1) / 2;
    else c.seq_q = (c.seq_q + 1) / 2;
  }
  return c;
}

inline bool same_problem(const AttentionShape& a, const AttentionShape& b) {
  return a.batch == b.batch && a.heads == b.heads && a.kv_heads == b.kv_heads && a.seq_q == b.seq_q &&
         a.seq_k == b.seq_k && a.head_dim == b.head_dim && a.causal == b.causal && a.scale == b.scale;
}

// One problem's inputs and its fp64 oracle, each part computed the first time a rung needs it (if
// every rung is skipped, never: not even the inputs, which for a long sequence take seconds to draw
// and gigabytes to hold). Forward: O and lse on `rows` of every head (all rows when empty).
// Backward: dQ, dK, dV on a problem the caller picks (the problem itself, or a smaller one from
// backward_check_shape), with inputs made from the same seed and kind when it is a smaller problem,
// O and lse from the oracle's forward, and dO drawn with `dout_seed`; kept per problem. Each check
// also gets its condition floor: the oracle again on inputs changed by the dtype's tolerance
// (harness.hpp, "What the arithmetic allows").
class Oracle {
 public:
  Oracle() = default;
  Oracle(const AttentionShape& s, DType t, Inputs in, std::vector<int64_t> rows, uint64_t dout_seed)
      : shape_(s), dtype_(t), seed_(in.seed), kind_(in.kind), inputs_(std::make_unique<Inputs>(std::move(in))),
        rows_(std::move(rows)), dout_seed_(dout_seed) {}
  // Inputs drawn with `seed` and `kind` when first asked for.
  Oracle(const AttentionShape& s, DType t, uint64_t seed, InputKind kind, std::vector<int64_t> rows,
         uint64_t dout_seed)
      : shape_(s), dtype_(t), seed_(seed), kind_(kind), rows_(std::move(rows)), dout_seed_(dout_seed) {}

  // Told before each part is computed, for a progress line (the ladder prints it to stderr).
  std::function<void(const std::string&)> on_compute;

  const AttentionShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  uint64_t seed() const { return seed_; }
  InputKind kind() const { return kind_; }
  const Inputs& inputs() {
    if (!inputs_) {
      tell("drawing the inputs (" + shape_.str() + ")");
      inputs_ = std::make_unique<Inputs>(make_inputs(shape_, dtype_, seed_, kind_));
    }
    return *inputs_;
  }
  const std::vector<int64_t>& rows() const { return rows_; }
  uint64_t dout_seed() const { return dout_seed_; }

  const ReferenceForward& forward() {
    if (!fwd_) {
      const Inputs& in = inputs();
      tell("computing the fp64 oracle's forward on " +
           std::to_string(rows_.empty() ? shape_.seq_q : int64_t(rows_.size())) + " rows of each head");
      fwd_ = std::make_unique<ReferenceForward>(
          reference_forward(shape_, in.q.data(), in.k.data(), in.v.data(), rows_));
    }
    return *fwd_;
  }
  // The forward's condition floor: the oracle on the same rows of inputs changed by the tolerance.
  const ReferenceForward& forward_moved() {
    if (!fwd_moved_) {
      const Inputs& in = inputs();
      tell("computing the fp64 oracle's forward on inputs changed by the tolerance (what the arithmetic allows)");
      const Inputs m = perturbed_inputs(in, tolerance(dtype_), perturbation_seed(in.seed));
      fwd_moved_ = std::make_unique<ReferenceForward>(
          reference_forward(shape_, m.q.data(), m.k.data(), m.v.data(), rows_));
    }
    return *fwd_moved_;
  }
  ForwardCheck check_forward_of(const ForwardOutputs& out) {
    return check_forward(shape_, dtype_, out, forward(), 0, &forward_moved());
  }

  // Q, K, V of problem `s`: the problem's own, or fresh ones of a smaller problem.
  const Inputs& backward_qkv(const AttentionShape& s) {
    if (same_problem(s, shape_)) return inputs();
    Case& c = backward_case(s);
    if (!c.qkv) c.qkv = std::make_unique<Inputs>(make_inputs(s, dtype_, seed_, kind_));
    return *c.qkv;
  }
  const BackwardInputs& backward_inputs(const AttentionShape& s) {
    const Inputs& in = backward_qkv(s);  // first: making inputs is not the oracle's work
    Case& c = backward_case(s);
    if (!c.in) {
      tell("computing the fp64 oracle's O and lse for the backward on " + s.str());
      c.in = std::make_unique<BackwardInputs>(make_backward_inputs(s, dtype_, in, dout_seed_));
    }
    return *c.in;
  }
  const ReferenceBackward& backward(const AttentionShape& s) {
    const BackwardInputs& b = backward_inputs(s);
    const Inputs& in = backward_qkv(s);
    Case& c = backward_case(s);
    if (!c.ref) {
      tell("computing the fp64 oracle's backward on " + s.str());
      c.ref = std::make_unique<ReferenceBackward>(
          reference_backward(s, in.q.data(), in.k.data(), in.v.data(), b.dout.data()));
    }
    return *c.ref;
  }
  // The backward's condition floor: the oracle's backward on Q, K, V, dO changed by the tolerance.
  const ReferenceBackward& backward_moved(const AttentionShape& s) {
    const BackwardInputs& b = backward_inputs(s);
    const Inputs& in = backward_qkv(s);
    Case& c = backward_case(s);
    if (!c.moved) {
      tell("computing the fp64 oracle's backward on inputs changed by the tolerance (what the arithmetic allows)");
      c.moved = std::make_unique<ReferenceBackward>(reference_backward_moved(s, dtype_, in, b));
    }
    return *c.moved;
  }

  // One backward of rung `r` on problem `s`, gradients poisoned first, checked against the oracle;
  // `io` counts a twin's traffic. Throws gpu::OutOfMemory when it does not fit.
  BackwardCheck check_backward_of(const Rung& r, const AttentionShape& s, IoCounter* io = nullptr,
                                  bool deterministic = false) {
    const ReferenceBackward& ref = backward(s);
    const ReferenceBackward& moved = backward_moved(s);
    return check_backward(dtype_, run_backward(r, s, dtype_, backward_qkv(s), backward_inputs(s), io, deterministic),
                          ref, 0, &moved);
  }

 private:
  struct Case {
    AttentionShape shape;
    std::unique_ptr<Inputs> qkv;  // only for a problem other than shape_
    std::unique_ptr<BackwardInputs> in;
    std::unique_ptr<ReferenceBackward> ref, moved;
  };
  Case& backward_case(const AttentionShape& s) {
    for (auto& c : cases_)
      if (same_problem(c->shape, s)) return *c;
    cases_.push_back(std::make_unique<Case>());
    cases_.back()->shape = s;
    return *cases_.back();
  }
  void tell(const std::string& what) const {
    if (on_compute) on_compute(what);
  }

  AttentionShape shape_;
  DType dtype_ = DType::F32;
  uint64_t seed_ = 0;
  InputKind kind_ = InputKind::Normal;
  std::unique_ptr<Inputs> inputs_;
  std::vector<int64_t> rows_;
  uint64_t dout_seed_ = 0;
  std::unique_ptr<ReferenceForward> fwd_, fwd_moved_;
  std::vector<std::unique_ptr<Case>> cases_;
};

}  // namespace fl
