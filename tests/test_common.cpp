// The common core: shape validation, the fp64 oracle (checked against a plain loop and, for the
// backward pass, against finite differences), error metrics, the IO counter, the registry.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <tuple>

#include "harness.hpp"
#include "io_counter.hpp"
#include "rung_testing.hpp"

namespace fl::testing {
namespace {

std::string error_of(const AttentionShape& s) {
  try {
    s.validate();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Shape, RefusesBadShapesWithMessagesThatSayWhatIsAllowed) {
  const AttentionShape ok = make_shape(2, 8, 2, 100, 90, 64, true);
  EXPECT_EQ(error_of(ok), "");
  AttentionShape s = ok;
  s.batch = 0;
  EXPECT_NE(error_of(s).find("batch (B) = 0; it must be at least 1"), std::string::npos);
  s = ok, s.seq_k = -3;
  EXPECT_NE(error_of(s).find("seq_k (Nk) = -3"), std::string::npos);
  s = ok, s.kv_heads = 3;
  EXPECT_NE(error_of(s).find("heads (H) = 8 is not a multiple of kv_heads (Hkv) = 3"), std::string::npos);
  s = ok, s.scale = -1;
  EXPECT_NE(error_of(s).find("bad scale"), std::string::npos);
  s = ok, s.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(error_of(s).find("bad scale"), std::string::npos);
  s = ok, s.seq_q = s.seq_k = int64_t(1) << 40;
  EXPECT_NE(error_of(s).find("64-bit"), std::string::npos);
  EXPECT_THROW(parse_dtype("fp64"), InputError);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
}

TEST(Shape, FlopsFollowTheAnchorsConvention) {
  EXPECT_EQ(make_shape(2, 16, 16, 1024, 1024, 64, false).flops_forward(), 4.0 * 2 * 16 * 1024 * 1024 * 64);
  EXPECT_EQ(make_shape(2, 16, 16, 1024, 1024, 64, true).flops_forward(), 2.0 * 2 * 16 * 1024 * 1024 * 64);
  EXPECT_EQ(make_shape(1, 1, 1, 8, 8, 8, false).flops_backward(), 2.5 * 4 * 8 * 8 * 8);
}

TEST(Shape, CausalMaskIsBottomRightAligned) {
  const AttentionShape wide = make_shape(1, 1, 1, 3, 5, 8, true);  // Nq < Nk: row 0 sees keys 0..2
  EXPECT_EQ(wide.last_key(0), 2);
  EXPECT_EQ(wide.last_key(2), 4);
  const AttentionShape tall = make_shape(1, 1, 1, 5, 3, 8, true);  // Nq > Nk: rows 0, 1 see nothing
  EXPECT_LT(tall.last_key(1), 0);
  EXPECT_EQ(tall.last_key(2), 0);
}

// The oracle against the definition written out as loops, on a shape with GQA, a causal mask
// and rows that see no key.
TEST(Oracle, ForwardMatchesTheDefinition) {
  const AttentionShape s = make_shape(2, 4, 2, 7, 5, 3, true);
  const Inputs in = make_inputs(s, DType::F32, base_seed());
  const ReferenceForward ref = reference_forward(s, in.q.data(), in.k.data(), in.v.data());
  const double scale = s.softmax_scale();  // the fp32 scale every rung uses
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 7; ++i) {
        const int64_t bh = b * 4 + h, bkv = b * 2 + h / 2;
        std::vector<double> p;
        double m = -INFINITY;
        for (int64_t j = 0; j <= i + (5 - 7) && j < 5; ++j) {
          double dot = 0;
          for (int c = 0; c < 3; ++c) dot += double(in.q[(bh * 7 + i) * 3 + c]) * in.k[(bkv * 5 + j) * 3 + c];
          p.push_back(dot * scale);
          m = std::max(m, p.back());
        }
        const double lse = ref.lse[bh * 7 + i];
        if (p.empty()) {
          EXPECT_EQ(lse, -INFINITY);
          for (int c = 0; c < 3; ++c) EXPECT_EQ(ref.o[(bh * 7 + i) * 3 + c], 0.0);
          continue;
        }
        double l = 0;
        for (double& e : p) l += (e = std::exp(e - m));
        EXPECT_NEAR(lse, m + std::log(l), 1e-12);
        for (int c = 0; c < 3; ++c) {
          double o = 0;
          for (size_t j = 0; j < p.size(); ++j) o += p[j] / l * in.v[(bkv * 5 + j) * 3 + c];
          EXPECT_NEAR(ref.o[(bh * 7 + i) * 3 + c], o, 1e-12);
        }
      }
}

TEST(Oracle, SampledRowsEqualTheFullResult) {
  const AttentionShape s = make_shape(1, 2, 1, 300, 200, 16, true);
  const Inputs in = make_inputs(s, DType::F32, base_seed());
  const auto full = reference_forward(s, in.q.data(), in.k.data(), in.v.data());
  const auto rows = sample_rows(s.seq_q, 10);
  const auto part = reference_forward(s, in.q.data(), in.k.data(), in.v.data(), rows);
  ASSERT_EQ(part.rows, rows);
  for (int64_t bh = 0; bh < 2; ++bh)
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(part.lse[bh * rows.size() + r], full.lse[bh * 300 + rows[r]]);
      for (int c = 0; c < 16; ++c)
        EXPECT_EQ(part.o[(bh * rows.size() + r) * 16 + c], full.o[(bh * 300 + rows[r]) * 16 + c]);
    }
}

// The backward oracle against central differences of L = Σ dO ∘ O, for every input element of a
// small problem with GQA and a causal mask. fp64 throughout: agreement to ~1e-7 relative.
TEST(Oracle, BackwardMatchesFiniteDifferences) {
  const AttentionShape s = make_shape(1, 4, 2, 6, 9, 5, true);
  Inputs in = make_inputs(s, DType::F32, base_seed());
  std::vector<float> dout = make_inputs(s, DType::F32, base_seed() + 7).q;
  const ReferenceBackward g = reference_backward(s, in.q.data(), in.k.data(), in.v.data(), dout.data());
  auto loss = [&](const Inputs& x) {
    const auto f = reference_forward(s, x.q.data(), x.k.data(), x.v.data());
    double L = 0;
    for (size_t i = 0; i < f.o.size(); ++i) L += f.o[i] * dout[i];
    return L;
  };
  // Inputs are float: step by a power of two so q ± h is exact, and difference in double.
  const float h = 1.0f / 1024;
  auto check = [&](std::vector<float> Inputs::*which, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < grad.size(); ++i) {
      Inputs plus = in, minus = in;
      (plus.*which)[i] += h;
      (minus.*which)[i] -= h;
      const double fd = (loss(plus) - loss(minus)) / (double((plus.*which)[i]) - double((minus.*which)[i]));
      EXPECT_NEAR(grad[i], fd, 1e-4 * (1 + std::abs(fd))) << name << "[" << i << "]";
    }
  };
  check(&Inputs::q, g.dq, "dq");
  check(&Inputs::k, g.dk, "dk");
  check(&Inputs::v, g.dv, "dv");
}

TEST(Compare, PoisonedAndNonFiniteElementsAreBad) {
  const double ref[] = {1, 2, -INFINITY, 4};
  const float good[] = {1, 2, -INFINITY, 4};
  EXPECT_EQ(compare(good, ref, 4).bad, 0);
  EXPECT_EQ(compare(good, ref, 4).rel_l2, 0);
  const float unwritten[] = {1, NAN, -INFINITY, 4};
  const ErrorStats e = compare(unwritten, ref, 4);
  EXPECT_EQ(e.bad, 1);
  EXPECT_EQ(e.first_bad, 1);
  EXPECT_FALSE(passes(e, DType::F32));
  const float wrong_inf[] = {1, 2, 0, 4};  // an empty row's lse must be −∞, not 0
  EXPECT_EQ(compare(wrong_inf, ref, 4).bad, 1);
  const float off[] = {1, 2, -INFINITY, 4.1f};
  EXPECT_NEAR(compare(off, ref, 4).max_abs, 0.1, 1e-6);
}

// A rung that forgets to write is caught: the harness poisons O and lse with NaN before it runs.
class LazyRung final : public Rung {
 public:
  std::string name() const override { return "99_lazy"; }
  Backend backend() const override { return Backend::Cpu; }
  std::string idea() const override { return "writes half of O"; }
  Capabilities caps() const override { return {}; }
  IoModel modelled_io(const AttentionShape&, DType) const override { return {}; }
  void forward(const AttentionShape& s, DType, const ForwardArgs& a) const override {
    const auto ref = reference_forward(s, static_cast<const float*>(a.q), static_cast<const float*>(a.k),
                                       static_cast<const float*>(a.v));
    for (int64_t i = 0; i < s.o_elems() / 2; ++i) static_cast<float*>(a.o)[i] = float(ref.o[i]);
    for (int64_t i = 0; i < s.lse_elems(); ++i) a.lse[i] = float(ref.lse[i]);
  }
};

TEST(Harness, UnwrittenOutputsFail) {
  const LazyRung lazy;
  const Case c{make_shape(1, 2, 2, 20, 20, 8, false), InputKind::Normal, base_seed()};
  const CaseResult res = run_case(lazy, DType::F32, c);
  EXPECT_FALSE(res.check.pass);
  EXPECT_EQ(res.check.o.bad, c.shape.o_elems() - c.shape.o_elems() / 2);
}

TEST(Harness, InputsAreExactInTheirDtypeAndFresh) {
  const AttentionShape s = make_shape(1, 1, 1, 64, 64, 32, false);
  const Inputs a = make_inputs(s, DType::BF16, 1), b = make_inputs(s, DType::BF16, 2);
  EXPECT_NE(a.q, b.q);
  for (float x : a.q) EXPECT_EQ(round_to(DType::BF16, x), x);
  EXPECT_EQ(from_storage(to_storage(a.q, DType::BF16), DType::BF16), a.q);
  EXPECT_EQ(from_storage(to_storage(a.v, DType::F16), DType::F16).size(), a.v.size());
  EXPECT_EQ(round_to(DType::F16, 1.0f + 1.0f / 4096), 1.0f);  // below fp16's half-ulp at 1
}

TEST(IoCounter, CountsEveryByteAndRefusesOutOfBounds) {
  std::vector<float> mem(6 * 5, 1.f);
  IoCounter io;
  HbmMatrix<float> m(mem.data(), 6, 5, io);
  const Block b = m.load(1, 2, 1, 3);
  EXPECT_EQ(io.read, 2u * 3 * 4);
  m.store(4, 0, b);
  EXPECT_EQ(io.written, 2u * 3 * 4);
  EXPECT_THROW(m.load(5, 2, 0, 1), std::out_of_range);
  EXPECT_THROW(m.store(0, 3, b), std::out_of_range);
  std::vector<Eigen::half> halves(4);
  IoCounter io16;
  HbmMatrix<Eigen::half> h(halves.data(), 2, 2, io16);
  h.store(0, 0, 1.5f);
  EXPECT_EQ(io16.written, 2u);  // an fp16 element is two bytes of traffic
  EXPECT_EQ(h.load(0, 0), 1.5f);
}

TEST(Registry, RungsAreOrderedAndFoundByNameAndBackend) {
  const auto names = Registry::instance().names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end(), natural_less));
  for (std::size_t i = 1; i < names.size(); ++i) EXPECT_NE(names[i - 1], names[i]);
  EXPECT_EQ(Registry::instance().find("no_such_rung", Backend::Cpu), nullptr);
}

// Versions in the order they were built: v9 before v10, as a student counts, not as text sorts.
TEST(Registry, NamesCompareTheirNumbersAsNumbers) {
  EXPECT_TRUE(natural_less("08_hopper_forward/v9_three_consumers", "08_hopper_forward/v10_end_aligned"));
  EXPECT_FALSE(natural_less("08_hopper_forward/v10_end_aligned", "08_hopper_forward/v9_three_consumers"));
  EXPECT_TRUE(natural_less("06_tensor_core_mma/v1_mma", "06_tensor_core_mma/v2_ldmatrix"));
  EXPECT_TRUE(natural_less("07_backward_recompute", "07_backward_recompute/mma"));  // a prefix first
  EXPECT_TRUE(natural_less("07_backward_recompute/mma", "07_backward_recompute/v1_mma"));
  EXPECT_TRUE(natural_less("05_fa2_loop_order", "06_tensor_core_mma"));
  EXPECT_TRUE(natural_less("v2", "v02"));  // the same value: fewer digits first, so the order is total
  EXPECT_FALSE(natural_less("v2_a", "v2_a"));
  EXPECT_TRUE(natural_less("a", "a1"));
  EXPECT_FALSE(natural_less("a1", "a"));
}

// Where there is no GPU the reason says so in plain words (the CUDA runtime's own text for a
// machine without a driver is "CUDA driver version is insufficient for CUDA runtime version", which
// sends a student to update a driver that is not there). This is the reason the ladder's header, the
// GPU tests' skips, fl_cuda_available and --device cuda all give.
TEST(Device, NoGpuIsSaidInPlainWords) {
  std::string why;
  if (gpu::available(&why)) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(why.empty());
  if (!gpu::built_with_cuda()) return;  // the CPU-only build says it has no CUDA at all
  const bool driver_files = std::ifstream("/proc/driver/nvidia/version").good();
  std::printf("[flash_ladder] no GPU: %s\n", why.c_str());
  if (!driver_files) {
    EXPECT_NE(why.find("no NVIDIA driver or GPU was found"), std::string::npos) << why;
  }
  EXPECT_EQ(why.find("CUDA driver version is insufficient"), std::string::npos) << why;
}

// ---- What the arithmetic allows: the condition floor ---------------------------------------------

// The backward from a given O and lse (what a rung is handed) is the backward, when they are exact.
TEST(Oracle, BackwardFromGivenOAndLseIsTheBackward) {
  const AttentionShape s = make_shape(2, 4, 2, 37, 23, 16, true);  // rows 0..13 see no key
  const Inputs in = make_inputs(s, DType::F32, base_seed());
  const BackwardInputs bin = make_backward_inputs(s, DType::F32, in, base_seed() + 1);
  const ReferenceBackward g = reference_backward(s, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
  const ReferenceBackward h = reference_backward_given(s, in.q.data(), in.k.data(), in.v.data(), bin.o.data(),
                                                       bin.lse.data(), bin.dout.data());
  // O and lse are fp32 here, so the two differ by fp32 rounding, not more.
  for (auto [a, b, name] : {std::tuple{&g.dq, &h.dq, "dq"}, {&g.dk, &h.dk, "dk"}, {&g.dv, &h.dv, "dv"}}) {
    std::vector<float> af(a->begin(), a->end());
    EXPECT_LT(compare(af.data(), b->data(), int64_t(b->size())).rel_l2, 1e-6) << name;
  }
}

// The gradients of a problem, what a correct fp32 backward returns (the exact ones, each element
// off by up to `noise` times the gradient's typical size: fp32 rounding), and the condition floor.
struct GradCase {
  AttentionShape s;
  ReferenceBackward ref, moved;
  BackwardOutputs out;
};
GradCase grad_case(const AttentionShape& s, InputKind kind, double noise, uint64_t seed) {
  GradCase c;
  c.s = s;
  const Inputs in = make_inputs(s, DType::F32, seed, kind);
  const BackwardInputs bin = make_backward_inputs(s, DType::F32, in, seed + 1);
  c.ref = reference_backward(s, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
  c.moved = reference_backward_moved(s, DType::F32, in, bin);
  std::mt19937_64 rng(seed + 2);
  std::uniform_real_distribution<double> u(-1, 1);
  auto rounded = [&](const std::vector<double>& x) {
    double rms = 0;
    for (double e : x) rms += e * e;
    rms = std::sqrt(rms / double(x.size()));
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = float(x[i] + noise * rms * u(rng));
    return y;
  };
  c.out = {rounded(c.ref.dq), rounded(c.ref.dk), rounded(c.ref.dv)};
  return c;
}

// ladder --inputs constant-row: the head whose keys are all equal has dQ = 0 exactly (Σ_j dS_ij = 0
// times one key), so fp32 rounding (1e-7 absolute) is a relative error of ~1e8. Held to the floor
// (how far the exact dQ moves when the inputs change by the tolerance) it passes, as it must.
TEST(Checks, AZeroGradientIsHeldToWhatTheArithmeticAllows) {
  const AttentionShape s = make_shape(1, 1, 1, 64, 80, 32, false);
  GradCase c = grad_case(s, InputKind::ConstantRow, 1e-7, base_seed());
  // The dQ of this head is rounding noise around 0.
  double dq_max = 0;
  for (double x : c.ref.dq) dq_max = std::max(dq_max, std::abs(x));
  ASSERT_LT(dq_max, 1e-12);
  for (std::size_t i = 0; i < c.out.dq.size(); ++i) c.out.dq[i] = float(1e-7 * ((i % 7) - 3.0) / 3);
  const BackwardCheck plain = check_backward(DType::F32, c.out, c.ref);
  EXPECT_FALSE(plain.pass) << "a relative error alone fails it: " << plain.str();
  const BackwardCheck held = check_backward(DType::F32, c.out, c.ref, 0, &c.moved);
  EXPECT_TRUE(held.pass) << held.str();
  EXPECT_TRUE(held.passed_on_floor());
  EXPECT_NE(held.str().find("within the"), std::string::npos) << held.str();
}

// ladder --inputs large-logits: logits of ~120 make the last bits of Q·Kᵀ visible in P; an error a
// few times the tolerance is what fp32 does there (a plain fp32 backward errs 9e-6..2.2e-5, rung
// 07's twin 6e-5), and the floor says so.
TEST(Checks, LargeLogitsAreHeldToTheirCondition) {
  const AttentionShape s = make_shape(1, 2, 2, 96, 96, 64, false);
  const GradCase c = grad_case(s, InputKind::LargeLogits, 6e-5, base_seed());
  EXPECT_FALSE(check_backward(DType::F32, c.out, c.ref).pass);
  const BackwardCheck held = check_backward(DType::F32, c.out, c.ref, 0, &c.moved);
  EXPECT_TRUE(held.pass) << held.str();
}

// The floor does not let a bug through: each of these is FAIL, on well-conditioned inputs, on the
// constant row and on large logits alike.
TEST(Checks, AWrongGradientStillFails) {
  uint64_t seed = base_seed();
  for (InputKind kind : {InputKind::Normal, InputKind::ConstantRow, InputKind::LargeLogits}) {
    const AttentionShape s = make_shape(1, 4, 2, 64, 80, 32, true);
    const GradCase c = grad_case(s, kind, 1e-7, seed += 3);
    SCOPED_TRACE(std::string("inputs ") + input_kind_name(kind) + " seed=" + std::to_string(seed));
    ASSERT_TRUE(check_backward(DType::F32, c.out, c.ref, 0, &c.moved).pass) << "the correct one passes";
    auto expect_fail = [&](const char* bug, BackwardOutputs o) {
      const BackwardCheck k = check_backward(DType::F32, o, c.ref, 0, &c.moved);
      EXPECT_FALSE(k.pass) << bug << ": " << k.str();
    };
    BackwardOutputs o = c.out;
    for (auto& x : o.dq) x *= 1.01f;  // a scale off by 1%
    expect_fail("dQ 1% too large", o);
    o = c.out;
    for (std::size_t i = 0; i < o.dk.size() / 2; ++i) o.dk[i] = 0;  // one kv head's dK not summed in
    expect_fail("half of dK missing", o);
    o = c.out;
    // The largest and the smallest row of dV swapped (a key index mixed up), in the last kv head:
    // the constant-row head's dV rows are all equal, and on large logits many rows are ~0.
    {
      const int64_t d = s.head_dim, rows = s.seq_k, first = int64_t(o.dv.size()) / d - rows;
      auto norm = [&](int64_t r) {
        double n = 0;
        for (int64_t x = 0; x < d; ++x) n += double(o.dv[r * d + x]) * o.dv[r * d + x];
        return n;
      };
      int64_t big = first, small = first;
      for (int64_t r = first; r < first + rows; ++r) {
        if (norm(r) > norm(big)) big = r;
        if (norm(r) < norm(small)) small = r;
      }
      for (int64_t x = 0; x < d; ++x) std::swap(o.dv[big * d + x], o.dv[small * d + x]);
    }
    expect_fail("two rows of dV swapped", o);
    o = c.out;
    o.dq[5] = NAN;  // unwritten
    expect_fail("an unwritten element of dQ", o);
    o = c.out;
    for (std::size_t i = 0; i < o.dq.size(); ++i) o.dq[i] += 1e-3f;  // dQ off where it should be ~0
    expect_fail("dQ off by 1e-3 everywhere", o);
  }
}

TEST(Checks, AWrongForwardStillFails) {
  for (InputKind kind : {InputKind::Normal, InputKind::ConstantRow, InputKind::LargeLogits}) {
    const AttentionShape s = make_shape(1, 2, 2, 64, 80, 32, true);
    const Inputs in = make_inputs(s, DType::F32, base_seed(), kind);
    const ReferenceForward ref = reference_forward(s, in.q.data(), in.k.data(), in.v.data());
    const Inputs m = perturbed_inputs(in, tolerance(DType::F32), perturbation_seed(in.seed));
    const ReferenceForward moved = reference_forward(s, m.q.data(), m.k.data(), m.v.data());
    ForwardOutputs out{std::vector<float>(ref.o.begin(), ref.o.end()), std::vector<float>(ref.lse.begin(), ref.lse.end())};
    SCOPED_TRACE(input_kind_name(kind));
    EXPECT_TRUE(check_forward(s, DType::F32, out, ref, 0, &moved).pass);
    ForwardOutputs bad = out;
    for (int64_t c2 = 0; c2 < s.head_dim; ++c2) bad.o[c2] = 0;  // the first row left at 0 (a mask bug)
    EXPECT_FALSE(check_forward(s, DType::F32, bad, ref, 0, &moved).pass);
    bad = out;
    for (auto& x : bad.o) x *= 1.001f;  // normalized by a sum off by 0.1%
    EXPECT_FALSE(check_forward(s, DType::F32, bad, ref, 0, &moved).pass);
  }
}

}  // namespace
}  // namespace fl::testing
