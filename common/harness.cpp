#include "harness.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "device.hpp"

namespace fl {

const char* input_kind_name(InputKind k) {
  switch (k) {
    case InputKind::Normal: return "normal";
    case InputKind::LargeLogits: return "large-logits";
    case InputKind::ConstantRow: return "constant-row";
  }
  return "?";
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::F32: return x;
    case DType::F16: return float(Eigen::half(x));
    case DType::BF16: return float(Eigen::bfloat16(x));
  }
  return x;
}

std::vector<unsigned char> to_storage(const std::vector<float>& x, DType t) {
  std::vector<unsigned char> out(x.size() * dtype_bytes(t));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(&out[4 * i], &x[i], 4);
    } else {
      const uint16_t bits = t == DType::F16 ? Eigen::numext::bit_cast<uint16_t>(Eigen::half(x[i]))
                                            : Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(x[i]));
      std::memcpy(&out[2 * i], &bits, 2);
    }
  }
  return out;
}

std::vector<float> from_storage(const std::vector<unsigned char>& b, DType t) {
  const size_t n = b.size() / dtype_bytes(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::F32) {
      std::memcpy(&out[i], &b[4 * i], 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, &b[2 * i], 2);
      out[i] = t == DType::F16 ? float(Eigen::numext::bit_cast<Eigen::half>(bits))
                               : float(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
    }
  }
  return out;
}

Inputs make_inputs(const AttentionShape& s, DType t, uint64_t seed, InputKind kind) {
  s.validate();
  Inputs in;
  in.seed = seed;
  in.kind = kind;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.f, 1.f);
  // Large logits: with q, k ≈ a + N(0,1), a logit is ≈ a²·d·scale = a²·√d; pick a so that is 120.
  const float shift =
      kind == InputKind::LargeLogits ? std::sqrt(120.f / std::sqrt(float(s.head_dim))) : 0.f;
  auto fill = [&](std::vector<float>& x, int64_t n, float offset) {
    x.resize(n);
    for (auto& e : x) e = round_to(t, n01(rng) + offset);
  };
  fill(in.q, s.q_elems(), shift);
  fill(in.k, s.kv_elems(), shift);
  fill(in.v, s.kv_elems(), 0.f);
  if (kind == InputKind::ConstantRow)  // batch 0, kv head 0: every key equals key 0
    for (int64_t j = 1; j < s.seq_k; ++j)
      std::memcpy(&in.k[j * s.head_dim], &in.k[0], sizeof(float) * s.head_dim);
  return in;
}

// ---------------------------------------------------------------------------------------------
struct ForwardRun::Impl {
  Impl(const Rung& r, const AttentionShape& s, DType t)
      : rung(r), shape(s), dtype(t), on_gpu(r.backend() == Backend::Cuda) {}
  const Rung& rung;
  AttentionShape shape;
  DType dtype;
  bool on_gpu;
  // Host side (CPU twins run on these; GPU rungs stage through them).
  std::vector<unsigned char> q, k, v, o, lse, ws;
  gpu::DeviceBuffer dq, dk, dv, d_o, dlse, dws;

  ForwardArgs args() {
    ForwardArgs a;
    if (on_gpu) {
      a.q = dq.get(), a.k = dk.get(), a.v = dv.get(), a.o = d_o.get();
      a.lse = static_cast<float*>(dlse.get());
      a.workspace = dws.get();
    } else {
      a.q = q.data(), a.k = k.data(), a.v = v.data(), a.o = o.data();
      a.lse = reinterpret_cast<float*>(lse.data());
      a.workspace = ws.empty() ? nullptr : ws.data();
    }
    return a;
  }
};

std::size_t ForwardRun::device_bytes(const Rung& r, const AttentionShape& s, DType t) {
  const std::size_t e = dtype_bytes(t);
  return e * std::size_t(2 * s.q_elems() + 2 * s.kv_elems()) + 4 * std::size_t(s.lse_elems()) +
         r.workspace_bytes(s, t);
}

ForwardRun::ForwardRun(const Rung& r, const AttentionShape& s, DType t, const Inputs& in)
    : impl_(std::make_unique<Impl>(r, s, t)) {
  r.check_supported(s, t);
  auto& m = *impl_;
  m.q = to_storage(in.q, t);
  m.k = to_storage(in.k, t);
  m.v = to_storage(in.v, t);
  m.o.assign(s.o_elems() * dtype_bytes(t), 0);
  m.lse.assign(s.lse_elems() * 4, 0);
  const std::size_t ws = r.workspace_bytes(s, t);
  if (m.on_gpu) {
    std::string what = "rung " + r.label() + " on " + s.str();
    if (ws) what += " (its workspace, " + r.caps().workspace_what + ", is " + describe_bytes(double(ws)) + ")";
    gpu::require_memory(device_bytes(r, s, t), what);
    m.dq = gpu::DeviceBuffer(m.q.size());
    m.dk = gpu::DeviceBuffer(m.k.size());
    m.dv = gpu::DeviceBuffer(m.v.size());
    m.d_o = gpu::DeviceBuffer(m.o.size());
    m.dlse = gpu::DeviceBuffer(m.lse.size());
    m.dws = gpu::DeviceBuffer(ws);
    m.dq.upload(m.q.data(), m.q.size());
    m.dk.upload(m.k.data(), m.k.size());
    m.dv.upload(m.v.data(), m.v.size());
  } else {
    m.ws.assign(ws, 0);
  }
  poison();
}

ForwardRun::~ForwardRun() = default;

void ForwardRun::poison() {
  auto& m = *impl_;
  if (m.on_gpu) {
    m.d_o.poison();
    m.dlse.poison();
  } else {
    for (auto* b : {&m.o, &m.lse})
      for (size_t i = 0; i + 1 < b->size(); i += 2) {  // 0x7fc0 little-endian in every 16-bit word
        (*b)[i] = 0xc0;
        (*b)[i + 1] = 0x7f;
      }
  }
}

void ForwardRun::run(IoCounter* io) {
  auto& m = *impl_;
  ForwardArgs a = m.args();
  a.io = io;
  m.rung.check(m.shape, m.dtype, a);
  m.rung.forward(m.shape, m.dtype, a);
}

ForwardOutputs ForwardRun::fetch() const {
  auto& m = *impl_;
  if (m.on_gpu) {
    gpu::synchronize();
    m.d_o.download(m.o.data(), m.o.size());
    m.dlse.download(m.lse.data(), m.lse.size());
  }
  ForwardOutputs out;
  out.o = from_storage(m.o, m.dtype);
  out.lse = from_storage(m.lse, DType::F32);
  return out;
}

double ForwardRun::time_ms(int warmup, int reps) {
  auto& m = *impl_;
  if (m.on_gpu) return gpu::time_ms([&] { run(); }, warmup, reps, [] { gpu::flush_l2(); });
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> t;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

std::size_t ForwardRun::extra_bytes() const { return impl_->rung.workspace_bytes(impl_->shape, impl_->dtype); }

// ---------------------------------------------------------------------------------------------
namespace {
// ‖a − b‖₂ over the elements where both are finite (an empty row's −∞ lse matches itself).
double l2_distance(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::isfinite(a[i]) && std::isfinite(b[i])) sum += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(sum);
}
double max_distance(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::isfinite(a[i]) && std::isfinite(b[i])) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
// Within the tolerance relative to the answer, or within the condition floor.
bool within(const ErrorStats& e, double tol, double floor) {
  return e.bad == 0 && (e.l2 <= tol * e.ref_l2 || e.l2 <= floor);
}
bool on_floor(const ErrorStats& e, double tol, double floor) {
  return e.bad == 0 && !(e.l2 <= tol * e.ref_l2) && e.l2 <= floor;
}
// " (L2 error 1.1e-06, within the 3.4e-04 that changing every input by 1e-05 moves the exact dQ)"
std::string floor_note(const char* what, const ErrorStats& e, double tol, double floor) {
  if (floor <= 0 || e.bad > 0 || e.l2 <= tol * e.ref_l2) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf, " (L2 error %.2e %s the %.2e that changing every input by %.0e moves the exact %s)",
                e.l2, e.l2 <= floor ? "within" : "past", floor, tol, what);
  return buf;
}
}  // namespace

uint64_t perturbation_seed(uint64_t seed) { return seed ^ 0x9e3779b97f4a7c15ull; }

std::vector<float> perturbed(const std::vector<float>& x, double eta, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-eta, eta);
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = float(double(x[i]) * (1 + u(rng)));
  return out;
}

Inputs perturbed_inputs(const Inputs& in, double eta, uint64_t seed) {
  Inputs out;
  out.seed = in.seed;
  out.kind = in.kind;
  out.q = perturbed(in.q, eta, seed);
  out.k = perturbed(in.k, eta, seed + 1);
  out.v = perturbed(in.v, eta, seed + 2);
  return out;
}

std::string ForwardCheck::str() const {
  return std::string(pass ? "PASS" : "FAIL") + " O: " + o.str() + floor_note("O", o, tolerance, o_floor) +
         " | lse: " + lse.str();
}

bool ForwardCheck::passed_on_floor() const { return pass && on_floor(o, tolerance, o_floor); }

ForwardCheck check_forward(const AttentionShape& s, DType t, const ForwardOutputs& out,
                           const ReferenceForward& ref, double tol, const ReferenceForward* moved) {
  const int64_t R = int64_t(ref.rows.size()), d = s.head_dim;
  std::vector<float> o_rows, lse_rows;
  o_rows.reserve(s.batch * s.heads * R * d);
  lse_rows.reserve(s.batch * s.heads * R);
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh)
    for (int64_t r : ref.rows) {
      const float* row = &out.o[(bh * s.seq_q + r) * d];
      o_rows.insert(o_rows.end(), row, row + d);
      lse_rows.push_back(out.lse[bh * s.seq_q + r]);
    }
  ForwardCheck c;
  c.o = compare(o_rows.data(), ref.o.data(), int64_t(o_rows.size()));
  c.lse = compare(lse_rows.data(), ref.lse.data(), int64_t(lse_rows.size()));
  c.tolerance = tol > 0 ? tol : tolerance(t);
  if (moved) {
    c.o_floor = l2_distance(moved->o, ref.o);
    c.lse_floor = max_distance(moved->lse, ref.lse);
  }
  // lse is a log, of size up to the largest logit: hold it to the same relative accuracy,
  // measured against its largest finite magnitude (an absolute error of 1e-5 on lse = 120 is
  // as good as fp32 can do).
  double lse_scale = 1;
  for (double x : ref.lse)
    if (std::isfinite(x)) lse_scale = std::max(lse_scale, std::abs(x));
  c.pass = within(c.o, c.tolerance, c.o_floor) && c.lse.bad == 0 &&
           c.lse.max_abs <= std::max(10 * c.tolerance * lse_scale, c.lse_floor);
  return c;
}

// ---------------------------------------------------------------------------------------------
BackwardInputs make_backward_inputs(const AttentionShape& s, DType t, const Inputs& in, uint64_t seed) {
  const ReferenceForward f = reference_forward(s, in.q.data(), in.k.data(), in.v.data());
  BackwardInputs b;
  b.o.resize(f.o.size());
  for (size_t i = 0; i < f.o.size(); ++i) b.o[i] = round_to(t, float(f.o[i]));
  b.lse.assign(f.lse.begin(), f.lse.end());
  b.dout = make_inputs(s, t, seed).q;  // same shape as Q, N(0, 1), exact in the dtype
  return b;
}

BackwardOutputs run_backward(const Rung& r, const AttentionShape& s, DType t, const Inputs& in,
                             const BackwardInputs& bin, IoCounter* io) {
  r.check_supported(s, t, true);
  const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t),
                                   o = to_storage(bin.o, t), dout = to_storage(bin.dout, t);
  // Gradients are stored in the call's dtype, as the inputs are; poisoned (NaN) first.
  std::vector<unsigned char> dq = to_storage(std::vector<float>(s.q_elems(), NAN), t),
                             dk = to_storage(std::vector<float>(s.kv_elems(), NAN), t),
                             dv = to_storage(std::vector<float>(s.kv_elems(), NAN), t);
  const std::size_t ws_bytes = r.backward_workspace_bytes(s, t);
  BackwardArgs a;
  a.io = io;
  if (r.backend() == Backend::Cpu) {
    std::vector<unsigned char> ws(ws_bytes);
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.o = o.data(), a.lse = bin.lse.data(), a.dout = dout.data();
    a.dq = dq.data(), a.dk = dk.data(), a.dv = dv.data();
    a.workspace = ws.empty() ? nullptr : ws.data();
    r.check(s, t, a);
    r.backward(s, t, a);
  } else {
    const std::size_t bytes = 5 * q.size() + 4 * k.size() + 4 * bin.lse.size() + ws_bytes;
    gpu::require_memory(bytes, "backward of rung " + r.label() + " on " + s.str());
    auto put = [](const void* host, std::size_t n) {
      gpu::DeviceBuffer b(n);
      b.upload(host, n);
      return b;
    };
    gpu::DeviceBuffer q_d = put(q.data(), q.size()), k_d = put(k.data(), k.size()), v_d = put(v.data(), v.size()),
                      o_d = put(o.data(), o.size()), do_d = put(dout.data(), dout.size()),
                      l_d = put(bin.lse.data(), 4 * bin.lse.size()), gq(dq.size()), gk(dk.size()), gv(dv.size()),
                      ws(ws_bytes);
    gq.poison(), gk.poison(), gv.poison();
    a.q = q_d.get(), a.k = k_d.get(), a.v = v_d.get(), a.o = o_d.get(), a.dout = do_d.get();
    a.lse = static_cast<const float*>(l_d.get());
    a.dq = gq.get(), a.dk = gk.get(), a.dv = gv.get(), a.workspace = ws.get();
    r.check(s, t, a);
    r.backward(s, t, a);
    gpu::synchronize();
    gq.download(dq.data(), dq.size()), gk.download(dk.data(), dk.size()), gv.download(dv.data(), dv.size());
  }
  return {from_storage(dq, t), from_storage(dk, t), from_storage(dv, t)};
}

std::string BackwardCheck::str() const {
  return std::string(pass ? "PASS" : "FAIL") + " dQ: " + dq.str() + floor_note("dQ", dq, tolerance, dq_floor) +
         " | dK: " + dk.str() + floor_note("dK", dk, tolerance, dk_floor) + " | dV: " + dv.str() +
         floor_note("dV", dv, tolerance, dv_floor);
}

bool BackwardCheck::passed_on_floor() const {
  return pass && (on_floor(dq, tolerance, dq_floor) || on_floor(dk, tolerance, dk_floor) ||
                  on_floor(dv, tolerance, dv_floor));
}

BackwardCheck check_backward(DType t, const BackwardOutputs& out, const ReferenceBackward& ref, double tol,
                             const ReferenceBackward* moved) {
  BackwardCheck c;
  c.dq = compare(out.dq.data(), ref.dq.data(), int64_t(out.dq.size()));
  c.dk = compare(out.dk.data(), ref.dk.data(), int64_t(out.dk.size()));
  c.dv = compare(out.dv.data(), ref.dv.data(), int64_t(out.dv.size()));
  c.tolerance = tol > 0 ? tol : tolerance(t);
  if (moved) {
    c.dq_floor = l2_distance(moved->dq, ref.dq);
    c.dk_floor = l2_distance(moved->dk, ref.dk);
    c.dv_floor = l2_distance(moved->dv, ref.dv);
  }
  c.pass = within(c.dq, c.tolerance, c.dq_floor) && within(c.dk, c.tolerance, c.dk_floor) &&
           within(c.dv, c.tolerance, c.dv_floor);
  return c;
}

ReferenceBackward reference_backward_moved(const AttentionShape& s, DType t, const Inputs& in,
                                           const BackwardInputs& bin) {
  const double eta = tolerance(t);
  const uint64_t seed = perturbation_seed(in.seed);
  const Inputs m = perturbed_inputs(in, eta, seed);
  const std::vector<float> o = perturbed(bin.o, eta, seed + 3), dout = perturbed(bin.dout, eta, seed + 4),
                           lse = perturbed(bin.lse, tolerance(DType::F32), seed + 5);
  return reference_backward_given(s, m.q.data(), m.k.data(), m.v.data(), o.data(), lse.data(), dout.data());
}

}  // namespace fl
