// What the `ladder` program and the `ladder_bench` sweep share: picking rungs from a command-line
// list, strict number parsing, the short GPU name and the UTC date they print, the GPU check behind
// their device flags, the lazily computed fp64 oracle (forward and backward) of a problem, and
// BackwardRun, which keeps one rung's forward and backward where it runs for timing. Header-only,
// bench/ only (io_probe uses the number parsing too).
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device.hpp"
#include "harness.hpp"
#include "problem.hpp"
#include "reference.hpp"
#include "rung.hpp"

namespace fl::bench {

inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// An item of --rungs names a rung by its whole name ("06_tensor_core_mma/v3_pipeline") or by a
// leading part that ends where the name has '_' or '/' ("06", "06_tensor_core_mma"), so "0"
// matches nothing rather than every rung from 00 to 09.
inline bool rung_matches(const std::string& name, const std::string& item) {
  if (item.empty() || name.compare(0, item.size(), item) != 0) return false;
  return name.size() == item.size() || name[item.size()] == '_' || name[item.size()] == '/';
}

// The registered rungs named by `list` ("all" or a comma list), in registry order, on the given
// backends. Throws InputError naming the item that matched nothing and what is built.
inline std::vector<const Rung*> select_rungs(const std::string& list, bool cpu, bool cuda) {
  const auto all = Registry::instance().all();
  std::vector<std::string> items = split_commas(list);
  const bool everything = list == "all";
  std::vector<const Rung*> out;
  for (const Rung* r : all) {
    if ((r->backend() == Backend::Cpu && !cpu) || (r->backend() == Backend::Cuda && !cuda)) continue;
    bool wanted = everything;
    for (const auto& it : items) wanted = wanted || rung_matches(r->name(), it);
    if (wanted) out.push_back(r);
  }
  if (!everything)
    for (const auto& it : items) {
      bool found = false;
      for (const Rung* r : all) found = found || rung_matches(r->name(), it);
      if (!found) {
        std::string built;
        for (const auto& n : Registry::instance().names()) built += (built.empty() ? "" : ", ") + n;
        throw InputError("no rung matches '" + it + "'; give a full name or its number (00, 01, ...) " +
                         "from the rungs this build has: " + built);
      }
    }
  return out;
}

// Whole-string integer parsing: "12x", "", "1e3" are refused, not read as 12, 0, 1.
inline bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

inline bool parse_uint64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

// "NVIDIA H100 80GB HBM3" -> "H100 80GB": short enough for a table column, enough to tell GPUs apart.
inline std::string short_gpu_name(std::string name) {
  for (const char* prefix : {"NVIDIA ", "GeForce "})
    if (name.rfind(prefix, 0) == 0) name.erase(0, std::string(prefix).size());
  int words = 0;
  for (std::size_t i = 0; i < name.size(); ++i)
    if (name[i] == ' ' && ++words == 2) return name.substr(0, i);
  return name;
}

// "2025-06-01": the day in UTC, for results that say when they were measured.
inline std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

// ---- Which devices --------------------------------------------------------------------------------
struct GpuChoice {
  bool present = false;  // a CUDA device can run the GPU rungs
  bool use = false;      // ... and the device flag lets them run
  std::string why;       // why there is none, when !present ("" when it was not asked)
};

// What a device flag (cpu | cuda | all, already checked to be one of them) leaves to run. The GPU is
// asked about only when the flag allows it or `ask_anyway` (a CUDA context costs a moment even when
// it is not used). `cuda_flag` is how the flag asking for the GPU is spelled in the message given
// when there is none ("--device cuda", "--fl_device=cuda").
inline GpuChoice choose_gpu(const std::string& device, const std::string& cuda_flag, bool ask_anyway = false) {
  GpuChoice g;
  if (device != "cpu" || ask_anyway) g.present = gpu::available(&g.why);
  g.use = g.present && device != "cpu";
  if (device == "cuda" && !g.present) throw InputError(cuda_flag + ": no GPU rung can run here: " + g.why);
  return g;
}

// ---- The oracle of a problem --------------------------------------------------------------------
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
  bool has_inputs() const { return inputs_ != nullptr; }
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
  BackwardCheck check_backward_of(const Rung& r, const AttentionShape& s, IoCounter* io = nullptr) {
    const ReferenceBackward& ref = backward(s);
    const ReferenceBackward& moved = backward_moved(s);
    return check_backward(dtype_, run_backward(r, s, dtype_, backward_qkv(s), backward_inputs(s), io), ref, 0,
                          &moved);
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

// ---- Timing ----------------------------------------------------------------------------------------
inline double host_ms(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Median milliseconds of `fn` on the host clock over `reps` calls after `warmup` (CPU twins).
inline double host_median_ms(const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < std::max(reps, 1); ++i) t.push_back(host_ms(fn));
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

// ---- One rung's forward and backward, for timing ----------------------------------------------------
// Q, K, V, a random dO, and the rung's own O, lse, dQ, dK, dV and both workspaces, allocated where
// the rung runs (host memory for a twin, device memory for a GPU rung; device memory is checked
// before anything is allocated and gpu::OutOfMemory thrown if the problem does not fit). The
// backward reads the O and lse of the rung's own forward, as in training. Correctness is
// Oracle::check_backward_of's business; this class only runs and times.
class BackwardRun {
 public:
  BackwardRun(const Rung& r, const AttentionShape& s, DType t, const Inputs& in, uint64_t dout_seed)
      : rung_(r), shape_(s), dtype_(t), on_gpu_(r.backend() == Backend::Cuda) {
    r.check_supported(s, t, /*for_backward=*/true);
    const std::size_t e = dtype_bytes(t), q_bytes = e * std::size_t(s.q_elems()),
                      kv_bytes = e * std::size_t(s.kv_elems()), lse_bytes = 4 * std::size_t(s.lse_elems());
    const std::size_t ws_f = r.workspace_bytes(s, t), ws_b = r.backward_workspace_bytes(s, t);
    std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t),
                               dout = to_storage(random_normal(s.q_elems(), t, dout_seed), t);
    if (on_gpu_) {
      gpu::require_memory(device_bytes(r, s, t), "forward and backward of rung " + r.label() + " on " + s.str());
      auto put = [](const std::vector<unsigned char>& host) {
        gpu::DeviceBuffer b(host.size());
        b.upload(host.data(), host.size());
        return b;
      };
      d_.q = put(q), d_.k = put(k), d_.v = put(v), d_.dout = put(dout);
      d_.o = gpu::DeviceBuffer(q_bytes), d_.lse = gpu::DeviceBuffer(lse_bytes);
      d_.dq = gpu::DeviceBuffer(q_bytes), d_.dk = gpu::DeviceBuffer(kv_bytes), d_.dv = gpu::DeviceBuffer(kv_bytes);
      d_.ws_f = gpu::DeviceBuffer(ws_f), d_.ws_b = gpu::DeviceBuffer(ws_b);
      fa_.q = ba_.q = d_.q.get(), fa_.k = ba_.k = d_.k.get(), fa_.v = ba_.v = d_.v.get();
      fa_.o = d_.o.get(), ba_.o = d_.o.get(), ba_.dout = d_.dout.get();
      fa_.lse = static_cast<float*>(d_.lse.get()), ba_.lse = static_cast<const float*>(d_.lse.get());
      ba_.dq = d_.dq.get(), ba_.dk = d_.dk.get(), ba_.dv = d_.dv.get();
      fa_.workspace = d_.ws_f.get(), ba_.workspace = d_.ws_b.get();
    } else {
      h_.q = std::move(q), h_.k = std::move(k), h_.v = std::move(v), h_.dout = std::move(dout);
      h_.o.assign(q_bytes, 0), h_.lse.assign(lse_bytes, 0);
      h_.dq.assign(q_bytes, 0), h_.dk.assign(kv_bytes, 0), h_.dv.assign(kv_bytes, 0);
      h_.ws_f.assign(ws_f, 0), h_.ws_b.assign(ws_b, 0);
      fa_.q = ba_.q = h_.q.data(), fa_.k = ba_.k = h_.k.data(), fa_.v = ba_.v = h_.v.data();
      fa_.o = h_.o.data(), ba_.o = h_.o.data(), ba_.dout = h_.dout.data();
      fa_.lse = reinterpret_cast<float*>(h_.lse.data()), ba_.lse = reinterpret_cast<const float*>(h_.lse.data());
      ba_.dq = h_.dq.data(), ba_.dk = h_.dk.data(), ba_.dv = h_.dv.data();
      fa_.workspace = h_.ws_f.empty() ? nullptr : h_.ws_f.data();
      ba_.workspace = h_.ws_b.empty() ? nullptr : h_.ws_b.data();
    }
    // Checked once here, not in the timed calls.
    r.check(s, t, fa_);
    r.check(s, t, ba_);
  }

  // All memory a forward and backward of this problem takes where the rung runs: Q, K, V, O, lse,
  // dO, dQ, dK, dV and both workspaces.
  static std::size_t device_bytes(const Rung& r, const AttentionShape& s, DType t) {
    const std::size_t e = dtype_bytes(t);
    return e * std::size_t(4 * s.q_elems() + 4 * s.kv_elems()) + 4 * std::size_t(s.lse_elems()) +
           r.workspace_bytes(s, t) + r.backward_workspace_bytes(s, t);
  }

  void forward() {
    rung_.forward(shape_, dtype_, fa_);
    forward_done_ = true;
  }
  void backward(IoCounter* io = nullptr) {
    BackwardArgs a = ba_;
    a.io = io;
    rung_.backward(shape_, dtype_, a);
  }
  void synchronize() const {
    if (on_gpu_) gpu::synchronize();
  }

  // Median milliseconds of the backward alone, on the O and lse of one forward run first. GPU:
  // CUDA events around the call, L2 flushed before each (outside the timed region).
  double time_backward_ms(int warmup, int reps) {
    if (!forward_done_) forward();
    return time([&] { backward(); }, warmup, reps);
  }
  // Median milliseconds of a forward followed by a backward, one training step of the layer.
  double time_forward_backward_ms(int warmup, int reps) {
    return time(
        [&] {
          forward();
          backward();
        },
        warmup, reps);
  }

  // N(0, 1) values, exact in the dtype, from their own generator (dO).
  static std::vector<float> random_normal(int64_t n, DType t, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.f, 1.f);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = round_to(t, n01(rng));
    return x;
  }

 private:
  double time(const std::function<void()>& fn, int warmup, int reps) {
    if (on_gpu_) return gpu::time_ms(fn, warmup, reps, [] { gpu::flush_l2(); });
    return host_median_ms(fn, warmup, reps);
  }

  const Rung& rung_;
  AttentionShape shape_;
  DType dtype_;
  bool on_gpu_;
  bool forward_done_ = false;
  struct Host {
    std::vector<unsigned char> q, k, v, dout, o, lse, dq, dk, dv, ws_f, ws_b;
  } h_;
  struct Device {
    gpu::DeviceBuffer q, k, v, dout, o, lse, dq, dk, dv, ws_f, ws_b;
  } d_;
  ForwardArgs fa_;
  BackwardArgs ba_;
};

}  // namespace fl::bench
