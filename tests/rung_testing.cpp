#include "rung_testing.hpp"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <random>
#include <sstream>

namespace fl::testing {

uint64_t base_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("FL_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
    return uint64_t(std::random_device{}());
  }();
  static bool said = false;
  if (!said) {
    said = true;
    std::cerr << "[flash_ladder] inputs drawn from FL_TEST_SEED=" << seed
              << " (set it to replay this run)\n";
  }
  return seed;
}

std::string Case::str() const {
  std::ostringstream s;
  s << shape.str() << " inputs=" << input_kind_name(kind) << " seed=" << seed;
  return s.str();
}

AttentionShape make_shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nk, int64_t d,
                          bool causal) {
  AttentionShape s;
  s.batch = b, s.heads = h, s.kv_heads = hkv, s.seq_q = nq, s.seq_k = nk, s.head_dim = d;
  s.causal = causal;
  return s;
}

std::vector<Case> ladder_cases(const Rung& r, DType t) {
  const auto shape = make_shape;
  // Head dims tried: the rung's own list, or a spread when it takes any d.
  const Capabilities caps = r.caps();
  std::vector<int64_t> dims(caps.head_dims.begin(), caps.head_dims.end());
  if (dims.empty()) dims = {16, 64, 128};
  std::vector<AttentionShape> shapes;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    shapes.push_back(shape(1, 1, 1, 1, 1, d, false));          // a single key
    shapes.push_back(shape(1, 2, 2, 17, 17, d, true));         // tiny, ragged
    shapes.push_back(shape(2, 3, 1, 113, 203, d, true));       // Nq < Nk, GQA 3:1, B·H = 6
    shapes.push_back(shape(1, 2, 2, 203, 113, d, true));       // Nq > Nk: rows 0..89 see no key
    shapes.push_back(shape(1, 4, 2, 77, 300, d, false));       // GQA 2:1
  }
  // Longer rows once, with the middle head dim, to keep the suite quick on two cores.
  const int64_t d_mid = dims[dims.size() / 2];
  shapes.push_back(shape(1, 2, 1, 1000, 1000, d_mid, false));
  shapes.push_back(shape(1, 1, 1, 1023, 1024, d_mid, true));
  shapes.push_back(shape(1, 2, 2, 300, 40, d_mid, true));      // causal, Nq ≫ Nk: whole blocks of up to
                                                               // 128 rows see no key at all
  shapes.push_back(shape(3, 16, 4, 390, 200, d_mid, true));   // 192 row tiles of 128, more than an
                                                               // H100's 132 SMs: a persistent grid's
                                                               // walk, each head's first tile empty
  if (caps.head_dims.empty() && caps.max_head_dim >= 256)
    shapes.push_back(shape(2, 2, 2, 64, 65, 256, false));     // the largest head dim

  std::vector<Case> out;
  uint64_t n = 0;
  for (const AttentionShape& s : shapes) {
    if (!r.supports(s, t)) continue;
    out.push_back({s, InputKind::Normal, base_seed() + n++});
  }
  // Batch 0's first key/value head with every key equal: uniform P, O = mean of V.
  const AttentionShape flat = shape(2, 2, 2, 50, 70, d_mid, false);
  if (r.supports(flat, t)) out.push_back({flat, InputKind::ConstantRow, base_seed() + n++});
  return out;
}

std::string skip_reason(Backend b) {
  if (b == Backend::Cpu) return "not registered";
  std::string why;
  if (!gpu::available(&why)) return why;
  return "not registered in this build";
}

std::string skip_reason(const std::string& name, Backend b) {
  if (b == Backend::Cuda && !gpu::available()) return skip_reason(b);
  const Rung* r = Registry::instance().find(name, b);
  if (!r) return skip_reason(b);
  return r->unavailable();
}

const Rung* rung_or_skip(const std::string& name, Backend b) {
  if (b == Backend::Cuda && !gpu::available()) return nullptr;
  const Rung* r = Registry::instance().find(name, b);
  return r && r->unavailable().empty() ? r : nullptr;
}

CaseResult run_case(const Rung& r, DType t, const Case& c, double tol) {
  CaseResult res;
  const Inputs in = make_inputs(c.shape, t, c.seed, c.kind);
  ForwardRun run(r, c.shape, t, in);  // outputs are poisoned (NaN) here
  run.run(&res.io);
  res.out = run.fetch();
  res.ref = reference_forward(c.shape, in.q.data(), in.k.data(), in.v.data());
  res.check = check_forward(c.shape, t, res.out, res.ref, tol);
  return res;
}

}  // namespace fl::testing

namespace fl::testing {

void expect_cases_pass(const Rung& r, DType t, const std::vector<Case>& cases) {
  const Rung* twin = r.backend() == Backend::Cuda ? Registry::instance().find(r.name(), Backend::Cpu) : nullptr;
  for (const Case& c : cases) {
    SCOPED_TRACE(r.label() + " " + dtype_name(t) + " " + c.str());
    const CaseResult res = run_case(r, t, c);
    EXPECT_TRUE(res.check.pass) << res.check.str();
    EXPECT_EQ(res.check.o.bad, 0) << "unwritten or non-finite O elements";
    if (twin && twin->supports(c.shape, t)) {
      const CaseResult ref = run_case(*twin, t, c);
      const double limit = 2 * ref.check.o.rel_l2 + 0.1 * tolerance(t);
      EXPECT_LE(res.check.o.rel_l2, limit)
          << "GPU error " << res.check.o.rel_l2 << " vs CPU twin " << ref.check.o.rel_l2;
    }
  }
}

void expect_ladder_cases_pass(const std::string& name, Backend b, DType t) {
  const Rung* r = rung_or_skip(name, b);
  ASSERT_NE(r, nullptr);
  const std::vector<Case> cases = ladder_cases(*r, t);
  ASSERT_FALSE(cases.empty()) << r->label() << " supports none of the ladder's shapes";
  expect_cases_pass(*r, t, cases);
}

void expect_gpu_backward_matches_oracle_and_twin(const std::string& name, DType t, const AttentionShape& s,
                                                 uint64_t seed, bool deterministic) {
  const Rung* gpu = rung_or_skip(name, Backend::Cuda);
  if (!gpu) GTEST_SKIP() << skip_reason(name, Backend::Cuda);
  const Rung* twin = Registry::instance().find(name, Backend::Cpu);
  ASSERT_NE(twin, nullptr) << name << " registered no CPU twin";
  SCOPED_TRACE(name + " " + dtype_name(t) + " " + s.str() + " seed=" + std::to_string(seed) +
               (deterministic ? " deterministic" : ""));
  const Inputs in = make_inputs(s, t, seed);
  const BackwardInputs bin = make_backward_inputs(s, t, in, seed + 1);
  const ReferenceBackward ref = reference_backward(s, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
  const BackwardCheck g = check_backward(t, run_backward(*gpu, s, t, in, bin, nullptr, deterministic), ref);
  const BackwardCheck c = check_backward(t, run_backward(*twin, s, t, in, bin), ref);
  EXPECT_TRUE(g.pass) << g.str();
  const double floor = 0.1 * tolerance(t);
  EXPECT_LE(g.dq.rel_l2, 2 * c.dq.rel_l2 + floor) << "GPU " << g.str() << " vs twin " << c.str();
  EXPECT_LE(g.dk.rel_l2, 2 * c.dk.rel_l2 + floor) << "GPU " << g.str() << " vs twin " << c.str();
  EXPECT_LE(g.dv.rel_l2, 2 * c.dv.rel_l2 + floor) << "GPU " << g.str() << " vs twin " << c.str();
}

void expect_refused_where_unavailable(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const Rung* r = Registry::instance().find(name, Backend::Cuda);
    if (!r) GTEST_SKIP() << "no CUDA build: " << name << " has no kernel here";
    const AttentionShape s = make_shape(1, 2, 1, 77, 130, 64, true);
    const std::string why = r->unavailable();
    std::string refusal;
    const bool ok = r->supports(s, DType::BF16, &refusal);
    if (why.empty()) {
      EXPECT_TRUE(ok) << name << ": " << refusal;
    } else {
      EXPECT_FALSE(ok) << name;
      EXPECT_NE(refusal.find("cannot run here"), std::string::npos) << refusal;
      EXPECT_NE(refusal.find(why), std::string::npos) << refusal;
    }
  }
}

void expect_io_matches_model(const Rung& twin, DType t, const std::vector<AttentionShape>& shapes) {
  ASSERT_EQ(twin.backend(), Backend::Cpu);
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(twin.label() + " " + s.str());
    const Inputs in = make_inputs(s, t, base_seed());
    ForwardRun run(twin, s, t, in);
    IoCounter io;
    run.run(&io);
    const IoModel m = twin.modelled_io(s, t);
    EXPECT_EQ(double(io.read), m.read);
    EXPECT_EQ(double(io.written), m.written);
  }
}

}  // namespace fl::testing
