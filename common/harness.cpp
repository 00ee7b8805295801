#include "harness.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>

#include "device.hpp"

namespace fl {

const char* input_kind_name(InputKind k) {
  switch (k) {
    case InputKind::Normal: return "normal";
    case InputKind::LargeLogits: return "large-logits";
    case InputKind::ConstantRow: return "constant-row";
    case InputKind::RisingLogits: return "rising-logits";
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
  if (kind == InputKind::RisingLogits) {
    // Coordinate 0 carries the drift: key j's is ramp·j/(Nk − 1), row i's a draw c_i in [−1, 2],
    // so the scaled logit moves by c_i·ramp/√d = 60·c_i over the keys (ramp = 60·√d).
    const float ramp = 60.f * std::sqrt(float(s.head_dim));
    std::uniform_real_distribution<float> pace(-1.f, 2.f);
    for (int64_t r = 0; r < s.q_elems() / s.head_dim; ++r) in.q[r * s.head_dim] = round_to(t, pace(rng));
    for (int64_t r = 0; r < s.kv_elems() / s.head_dim; ++r) {
      const int64_t j = r % s.seq_k;  // K is [B, Hkv, Nk, d]
      in.k[r * s.head_dim] = round_to(t, ramp * float(j) / float(std::max<int64_t>(1, s.seq_k - 1)));
    }
  }
  return in;
}

// ---------------------------------------------------------------------------------------------
namespace {

// Every 16-bit word 0x7fc0 little-endian: a NaN in fp32, fp16 and bf16 alike (as DeviceBuffer::poison).
void poison_host(std::vector<unsigned char>& b) {
  for (size_t i = 0; i + 1 < b.size(); i += 2) b[i] = 0xc0, b[i + 1] = 0x7f;
}

// One array of a call where the rung runs: host bytes for a twin; device memory for a GPU rung,
// whose host copy is made only when its contents are fetched (a workspace never is).
struct Array {
  mutable std::vector<unsigned char> host;
  gpu::DeviceBuffer dev;
  std::size_t bytes = 0;
  bool on_gpu = false;
  // n zero bytes, or `content` (n bytes) when given.
  void init(std::size_t n, const std::vector<unsigned char>* content, bool gpu) {
    bytes = n;
    on_gpu = gpu;
    if (on_gpu) {
      dev = gpu::DeviceBuffer(n);
      if (content) dev.upload(content->data(), n);
    } else {
      host = content ? *content : std::vector<unsigned char>(n);
    }
  }
  void* ptr() const {
    if (on_gpu) return dev.get();
    return host.empty() ? nullptr : host.data();
  }
  void poison() {
    if (on_gpu) dev.poison();
    else poison_host(host);
  }
  void upload(const std::vector<unsigned char>& b) {
    if (b.size() != bytes) throw std::logic_error("Staging: an array's new contents have the wrong size");
    if (on_gpu) dev.upload(b.data(), bytes);
    else std::copy(b.begin(), b.end(), host.begin());  // in place: pointers handed out stay valid
  }
  const std::vector<unsigned char>& fetch() const {
    if (on_gpu) {
      host.resize(bytes);
      dev.download(host.data(), bytes);
    }
    return host;
  }
};

}  // namespace

struct Staging::Impl {
  const Rung& rung;
  AttentionShape shape;
  DType dtype;
  bool on_gpu, backward;
  Array q, k, v, o, lse, ws_f, dout, dq, dk, dv, ws_b;
  Impl(const Rung& r, const AttentionShape& s, DType t, bool bwd)
      : rung(r), shape(s), dtype(t), on_gpu(r.backend() == Backend::Cuda), backward(bwd) {}
};

std::size_t Staging::bytes(const Rung& r, const AttentionShape& s, DType t, bool backward) {
  const std::size_t e = dtype_bytes(t), q = e * std::size_t(s.q_elems()), kv = e * std::size_t(s.kv_elems()),
                    lse = 4 * std::size_t(s.lse_elems());
  std::size_t n = 2 * q + 2 * kv + lse + r.workspace_bytes(s, t);          // Q, O, K, V, lse
  if (backward) n += 2 * q + 2 * kv + r.backward_workspace_bytes(s, t);   // dO, dQ, dK, dV
  return n;
}

Staging::Staging(const Rung& r, const AttentionShape& s, DType t, const Inputs& in, const std::vector<float>* dout,
                 const std::string& what)
    : impl_(std::make_unique<Impl>(r, s, t, dout != nullptr)) {
  auto& m = *impl_;
  if (m.on_gpu) gpu::require_memory(bytes(r, s, t, m.backward), what);
  const std::size_t e = dtype_bytes(t), q_bytes = e * std::size_t(s.q_elems()), kv_bytes = e * std::size_t(s.kv_elems());
  auto put = [&](Array& a, const std::vector<float>& x, DType as) {
    const std::vector<unsigned char> b = to_storage(x, as);
    a.init(b.size(), &b, m.on_gpu);
  };
  put(m.q, in.q, t);
  put(m.k, in.k, t);
  put(m.v, in.v, t);
  m.o.init(q_bytes, nullptr, m.on_gpu);
  m.lse.init(4 * std::size_t(s.lse_elems()), nullptr, m.on_gpu);
  m.ws_f.init(r.workspace_bytes(s, t), nullptr, m.on_gpu);
  if (m.backward) {
    put(m.dout, *dout, t);
    m.dq.init(q_bytes, nullptr, m.on_gpu);
    m.dk.init(kv_bytes, nullptr, m.on_gpu);
    m.dv.init(kv_bytes, nullptr, m.on_gpu);
    m.ws_b.init(r.backward_workspace_bytes(s, t), nullptr, m.on_gpu);
  }
  poison_forward();
  if (m.backward) poison_backward();
}

Staging::~Staging() = default;

bool Staging::on_gpu() const { return impl_->on_gpu; }

ForwardArgs Staging::forward_args(IoCounter* io) const {
  const auto& m = *impl_;
  ForwardArgs a;
  a.q = m.q.ptr(), a.k = m.k.ptr(), a.v = m.v.ptr(), a.o = m.o.ptr();
  a.lse = static_cast<float*>(m.lse.ptr());
  a.workspace = m.ws_f.ptr();
  a.io = io;
  return a;
}

BackwardArgs Staging::backward_args(IoCounter* io) const {
  const auto& m = *impl_;
  BackwardArgs a;
  a.q = m.q.ptr(), a.k = m.k.ptr(), a.v = m.v.ptr(), a.o = m.o.ptr(), a.dout = m.dout.ptr();
  a.lse = static_cast<const float*>(m.lse.ptr());
  a.dq = m.dq.ptr(), a.dk = m.dk.ptr(), a.dv = m.dv.ptr();
  a.workspace = m.ws_b.ptr();
  a.io = io;
  return a;
}

void Staging::set_forward_outputs(const std::vector<float>& o, const std::vector<float>& lse) {
  impl_->o.upload(to_storage(o, impl_->dtype));
  impl_->lse.upload(to_storage(lse, DType::F32));
}

void Staging::poison_forward() {
  impl_->o.poison();
  impl_->lse.poison();
}

void Staging::poison_backward() {
  impl_->dq.poison();
  impl_->dk.poison();
  impl_->dv.poison();
}

ForwardOutputs Staging::forward_outputs() const {
  const auto& m = *impl_;
  if (m.on_gpu) gpu::synchronize();
  return {from_storage(m.o.fetch(), m.dtype), from_storage(m.lse.fetch(), DType::F32)};
}

BackwardOutputs Staging::gradients() const {
  const auto& m = *impl_;
  if (m.on_gpu) gpu::synchronize();
  return {from_storage(m.dq.fetch(), m.dtype), from_storage(m.dk.fetch(), m.dtype), from_storage(m.dv.fetch(), m.dtype)};
}

double Staging::time_ms(const std::function<void()>& fn, int warmup, int reps) const {
  if (impl_->on_gpu) return gpu::time_ms(fn, warmup, reps, [] { gpu::flush_l2(); });
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

// ---------------------------------------------------------------------------------------------
struct ForwardRun::Impl {
  const Rung& rung;
  AttentionShape shape;
  DType dtype;
  Staging st;
  Impl(const Rung& r, const AttentionShape& s, DType t, const Inputs& in, const std::string& what)
      : rung(r), shape(s), dtype(t), st(r, s, t, in, nullptr, what) {}
};

std::size_t ForwardRun::device_bytes(const Rung& r, const AttentionShape& s, DType t) {
  return Staging::bytes(r, s, t, /*backward=*/false);
}

namespace {
std::string forward_what(const Rung& r, const AttentionShape& s, DType t) {
  r.check_supported(s, t);  // before anything is allocated
  std::string what = "rung " + r.label() + " on " + s.str();
  if (const std::size_t ws = r.workspace_bytes(s, t))
    what += " (its workspace, " + r.caps().workspace_what + ", is " + describe_bytes(double(ws)) + ")";
  return what;
}
}  // namespace

ForwardRun::ForwardRun(const Rung& r, const AttentionShape& s, DType t, const Inputs& in)
    : impl_(std::make_unique<Impl>(r, s, t, in, forward_what(r, s, t))) {}

ForwardRun::~ForwardRun() = default;

void ForwardRun::poison() { impl_->st.poison_forward(); }

void ForwardRun::run(IoCounter* io) {
  auto& m = *impl_;
  const ForwardArgs a = m.st.forward_args(io);
  m.rung.check(m.shape, m.dtype, a);
  m.rung.forward(m.shape, m.dtype, a);
}

ForwardOutputs ForwardRun::fetch() const { return impl_->st.forward_outputs(); }

double ForwardRun::time_ms(int warmup, int reps) {
  return impl_->st.time_ms([&] { run(); }, warmup, reps);
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
                             const BackwardInputs& bin, IoCounter* io, bool deterministic) {
  r.check_supported(s, t, true);
  Staging st(r, s, t, in, &bin.dout, "backward of rung " + r.label() + " on " + s.str());
  st.set_forward_outputs(bin.o, bin.lse);  // the oracle's, rounded as a forward in the dtype stores them
  BackwardArgs a = st.backward_args(io);
  a.deterministic = deterministic;
  r.check(s, t, a);
  r.backward(s, t, a);
  return st.gradients();  // poisoned (NaN) before the call: an element left unwritten shows
}

// ---------------------------------------------------------------------------------------------
BackwardRun::BackwardRun(const Rung& r, const AttentionShape& s, DType t, const Inputs& in, uint64_t dout_seed,
                         bool deterministic)
    : rung_(r), shape_(s), dtype_(t) {
  r.check_supported(s, t, /*for_backward=*/true);
  const std::vector<float> dout = random_normal(s.q_elems(), t, dout_seed);
  st_ = std::make_unique<Staging>(r, s, t, in, &dout, "forward and backward of rung " + r.label() + " on " + s.str());
  fa_ = st_->forward_args();
  ba_ = st_->backward_args();
  ba_.deterministic = deterministic;
  r.check(s, t, fa_);  // checked once here, not in the timed calls
  r.check(s, t, ba_);
}

void BackwardRun::forward() {
  rung_.forward(shape_, dtype_, fa_);
  forward_done_ = true;
}

void BackwardRun::backward(IoCounter* io) {
  BackwardArgs a = ba_;
  a.io = io;
  rung_.backward(shape_, dtype_, a);
}

void BackwardRun::synchronize() const {
  if (st_->on_gpu()) gpu::synchronize();
}

double BackwardRun::time_backward_ms(int warmup, int reps) {
  if (!forward_done_) forward();
  return st_->time_ms([&] { backward(); }, warmup, reps);
}

double BackwardRun::time_forward_backward_ms(int warmup, int reps) {
  return st_->time_ms(
      [&] {
        forward();
        backward();
      },
      warmup, reps);
}

std::vector<float> BackwardRun::random_normal(int64_t n, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = round_to(t, n01(rng));
  return x;
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
