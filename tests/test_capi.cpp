// The C ABI seen from outside: only flash_ladder.h's functions touch the rungs (this executable
// links the common core for the oracle and the inputs, never a rung). Each refusal is checked for
// its status, for a message that names the problem, and for outputs left untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compare.hpp"
#include "device.hpp"
#include "flash_ladder.h"
#include "harness.hpp"
#include "reference.hpp"

#if FLASH_LADDER_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

fl_shape c_shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nk, int64_t d, bool causal) {
  return fl_shape{b, h, hkv, nq, nk, d, causal ? 1 : 0, 0.0};
}

fl::AttentionShape cpp_shape(const fl_shape& c) {
  fl::AttentionShape s;
  s.batch = c.batch, s.heads = c.heads, s.kv_heads = c.kv_heads;
  s.seq_q = c.seq_q, s.seq_k = c.seq_k, s.head_dim = c.head_dim;
  s.causal = c.causal != 0;
  s.scale = c.scale;
  return s;
}

fl::DType cpp_dtype(fl_dtype t) {
  return t == FL_FP32 ? fl::DType::F32 : t == FL_FP16 ? fl::DType::F16 : fl::DType::BF16;
}

struct Listed {
  std::string name, backend;
};
std::vector<Listed> listed(const std::string& backend) {
  std::vector<Listed> out;
  for (int i = 0; i < fl_rung_count(); ++i)
    if (backend == fl_rung_backend(i)) out.push_back({fl_rung_name(i), fl_rung_backend(i)});
  return out;
}

// Fresh inputs for a problem, with host outputs poisoned: an element the rung never wrote stays
// NaN and the comparison counts it as bad.
struct HostProblem {
  fl_shape shape;
  fl::AttentionShape s;
  fl::Inputs in;
  std::vector<float> o, lse;
  HostProblem(const fl_shape& c, uint64_t seed) : shape(c), s(cpp_shape(c)) {
    in = fl::make_inputs(s, fl::DType::F32, seed);
    o.assign(s.o_elems(), kNaN);
    lse.assign(s.lse_elems(), kNaN);
  }
  fl_status run(const char* rung, fl_io* io = nullptr) {
    return fl_forward_host(rung, &shape, FL_FP32, in.q.data(), in.k.data(), in.v.data(), o.data(),
                           lse.data(), nullptr, 0, io);
  }
  bool untouched() const {
    for (float x : o)
      if (!std::isnan(x)) return false;
    for (float x : lse)
      if (!std::isnan(x)) return false;
    return true;
  }
};

void expect_matches_oracle(const fl::AttentionShape& s, fl::DType t, const fl::Inputs& in,
                           const std::vector<float>& o, const std::vector<float>& lse) {
  const fl::ReferenceForward ref = fl::reference_forward(s, in.q.data(), in.k.data(), in.v.data());
  const fl::ErrorStats eo = fl::compare(o.data(), ref.o.data(), s.o_elems());
  const fl::ErrorStats el = fl::compare(lse.data(), ref.lse.data(), s.lse_elems());
  EXPECT_TRUE(fl::passes(eo, t)) << "O: " << eo.str();
  EXPECT_TRUE(fl::passes(el, t)) << "lse: " << el.str();
  EXPECT_EQ(eo.bad, 0) << "unwritten (still NaN) or non-finite O elements";
  EXPECT_EQ(el.bad, 0) << "unwritten (still NaN) or wrong lse elements";
}

// Status and message in one assertion, so a failure prints both.
#define EXPECT_REFUSED(call, status, needle)                                                 \
  do {                                                                                     \
    const fl_status st_ = (call);                                                          \
    const std::string msg_ = fl_last_error();                                              \
    EXPECT_EQ(st_, status) << fl_status_name(st_) << ": " << msg_;                          \
    EXPECT_NE(msg_.find(needle), std::string::npos)                                        \
        << "message should name '" << (needle) << "': " << msg_;                           \
  } while (0)

// ---- The library and its listing --------------------------------------------------------------

TEST(CApi, VersionAndAbi) {
  EXPECT_EQ(fl_abi_version(), FL_ABI_VERSION);
  EXPECT_GT(std::strlen(fl_version()), 0u);
  EXPECT_NE(std::string(fl_build_info()).find(fl_version()), std::string::npos);
  EXPECT_STREQ(fl_status_name(FL_ERR_NOT_FOUND), "FL_ERR_NOT_FOUND");
}

TEST(CApi, ListsEveryRungWithItsBackend) {
  const int n = fl_rung_count();
  ASSERT_GT(n, 0);
  bool naive_cpu = false;
  for (int i = 0; i < n; ++i) {
    ASSERT_NE(fl_rung_name(i), nullptr);
    ASSERT_NE(fl_rung_backend(i), nullptr);
    ASSERT_NE(fl_rung_idea(i), nullptr);
    const std::string backend = fl_rung_backend(i);
    EXPECT_TRUE(backend == "cpu" || backend == "cuda") << backend;
    EXPECT_GT(std::strlen(fl_rung_idea(i)), 0u) << fl_rung_name(i);
    naive_cpu |= std::string(fl_rung_name(i)) == "00_naive_eigen" && backend == "cpu";
  }
  EXPECT_TRUE(naive_cpu) << "00_naive_eigen's CPU twin is not listed";
  EXPECT_EQ(fl_rung_name(n), nullptr);
  EXPECT_NE(std::string(fl_last_error()).find("out of range"), std::string::npos) << fl_last_error();
  EXPECT_EQ(fl_rung_name(-1), nullptr);
  // GPU rungs are listed exactly when the build has them.
  if (!fl::gpu::built_with_cuda()) {
    EXPECT_TRUE(listed("cuda").empty());
  }
}

TEST(CApi, SupportsSaysWhyNot) {
  const fl_shape s = c_shape(1, 2, 1, 9, 9, 64, true);
  EXPECT_EQ(fl_rung_supports("00_naive_eigen", "cpu", &s, FL_FP32), 1) << fl_last_error();
  EXPECT_STREQ(fl_last_error(), "");
  EXPECT_EQ(fl_rung_supports("00_naive_eigen", "cpu", &s, FL_FP16), 0);
  EXPECT_NE(std::string(fl_last_error()).find("fp16"), std::string::npos) << fl_last_error();
  EXPECT_EQ(fl_rung_supports("no_such_rung", "cpu", &s, FL_FP32), 0);
  EXPECT_NE(std::string(fl_last_error()).find("no_such_rung"), std::string::npos);
  EXPECT_EQ(fl_rung_supports("00_naive_eigen", "tpu", &s, FL_FP32), 0);
  EXPECT_NE(std::string(fl_last_error()).find("tpu"), std::string::npos);
}

// ---- Forward on the CPU twins -----------------------------------------------------------------

TEST(CApi, HostForwardOfEveryTwinMatchesTheOracle) {
  const uint64_t seed = 20240611;
  const std::vector<fl_shape> shapes = {
      c_shape(2, 4, 2, 33, 47, 16, false),  // GQA 2:1, B·H = 8, ragged
      c_shape(1, 2, 2, 40, 25, 32, true),   // Nq > Nk causal: rows 0..14 see no key (lse −∞)
      c_shape(1, 1, 1, 1, 1, 8, true),      // one query, one key
  };
  const auto twins = listed("cpu");
  ASSERT_FALSE(twins.empty());
  for (const Listed& r : twins) {
    for (const fl_shape& c : shapes) {
      if (!fl_rung_supports(r.name.c_str(), "cpu", &c, FL_FP32)) continue;
      HostProblem p(c, seed);
      SCOPED_TRACE(r.name + " " + p.s.str() + " seed=" + std::to_string(seed));
      fl_io io{};
      ASSERT_EQ(p.run(r.name.c_str(), &io), FL_OK) << fl_last_error();
      EXPECT_STREQ(fl_last_error(), "");
      expect_matches_oracle(p.s, fl::DType::F32, p.in, p.o, p.lse);
      // The twin's counted traffic is its closed form exactly (the IO model's promise).
      EXPECT_EQ(double(io.read_bytes), io.modelled_read_bytes);
      EXPECT_EQ(double(io.written_bytes), io.modelled_written_bytes);
      EXPECT_GT(io.read_bytes, 0u);
    }
  }
}

TEST(CApi, HostForwardTakesTheCallersWorkspace) {
  HostProblem p(c_shape(1, 2, 1, 21, 30, 16, true), 7);
  size_t bytes = 1;
  ASSERT_EQ(fl_forward_workspace_bytes("00_naive_eigen", "cpu", &p.shape, FL_FP32, &bytes), FL_OK)
      << fl_last_error();
  EXPECT_EQ(bytes, 2 * sizeof(float) * size_t(p.s.score_elems()));  // S and P
  std::vector<float> ws(bytes / sizeof(float));
  ASSERT_EQ(fl_forward_host("00_naive_eigen", &p.shape, FL_FP32, p.in.q.data(), p.in.k.data(),
                            p.in.v.data(), p.o.data(), p.lse.data(), ws.data(), bytes, nullptr),
            FL_OK)
      << fl_last_error();
  expect_matches_oracle(p.s, fl::DType::F32, p.in, p.o, p.lse);
}

// ---- Refusals: the right status, a message naming the problem, nothing written ------------------

TEST(CApi, RefusesBadInputsBeforeAnyWork) {
  HostProblem p(c_shape(1, 2, 1, 12, 12, 16, false), 3);
  const char* rung = "00_naive_eigen";
  auto call = [&](const fl_shape* s, fl_dtype t, const void* q) {
    return fl_forward_host(rung, s, t, q, p.in.k.data(), p.in.v.data(), p.o.data(), p.lse.data(),
                           nullptr, 0, nullptr);
  };
  fl_shape bad = p.shape;
  bad.batch = 0;
  EXPECT_REFUSED(call(&bad, FL_FP32, p.in.q.data()), FL_ERR_INVALID, "batch");
  bad = p.shape;
  bad.kv_heads = 3;
  EXPECT_REFUSED(call(&bad, FL_FP32, p.in.q.data()), FL_ERR_INVALID, "multiple");
  bad = p.shape;
  bad.scale = -1;
  EXPECT_REFUSED(call(&bad, FL_FP32, p.in.q.data()), FL_ERR_INVALID, "scale");
  bad = p.shape;
  bad.head_dim = 512;
  EXPECT_REFUSED(call(&bad, FL_FP32, p.in.q.data()), FL_ERR_INVALID, "head_dim 512");
  EXPECT_REFUSED(call(nullptr, FL_FP32, p.in.q.data()), FL_ERR_INVALID, "shape is NULL");
  EXPECT_REFUSED(call(&p.shape, FL_FP16, p.in.q.data()), FL_ERR_INVALID, "fp16");
  EXPECT_REFUSED(call(&p.shape, static_cast<fl_dtype>(7), p.in.q.data()), FL_ERR_INVALID,
                 "dtype 7");
  EXPECT_REFUSED(call(&p.shape, FL_FP32, nullptr), FL_ERR_INVALID, "'q'");
  EXPECT_REFUSED(fl_forward_host("99_no_such_rung", &p.shape, FL_FP32, p.in.q.data(),
                                 p.in.k.data(), p.in.v.data(), p.o.data(), p.lse.data(), nullptr,
                                 0, nullptr),
                 FL_ERR_NOT_FOUND, "99_no_such_rung");
  EXPECT_REFUSED(fl_forward_host(nullptr, &p.shape, FL_FP32, p.in.q.data(), p.in.k.data(),
                                 p.in.v.data(), p.o.data(), p.lse.data(), nullptr, 0, nullptr),
                 FL_ERR_INVALID, "rung name is NULL");
  // A workspace given but too small: the message names the bytes needed.
  size_t need = 0;
  ASSERT_EQ(fl_forward_workspace_bytes(rung, "cpu", &p.shape, FL_FP32, &need), FL_OK);
  std::vector<unsigned char> small(16);
  EXPECT_REFUSED(fl_forward_host(rung, &p.shape, FL_FP32, p.in.q.data(), p.in.k.data(),
                                 p.in.v.data(), p.o.data(), p.lse.data(), small.data(),
                                 small.size(), nullptr),
                 FL_ERR_INVALID, std::to_string(need) + " bytes");
  EXPECT_TRUE(p.untouched()) << "a refused call wrote to its outputs";

  EXPECT_REFUSED(fl_forward_workspace_bytes(rung, "cpu", &p.shape, FL_FP32, nullptr),
                 FL_ERR_INVALID, "bytes");
  // Success clears the message.
  ASSERT_EQ(p.run(rung), FL_OK) << fl_last_error();
  EXPECT_STREQ(fl_last_error(), "");
}

TEST(CApi, BackwardIsRefusedByRungsWithoutOne) {
  HostProblem p(c_shape(1, 1, 1, 8, 8, 16, false), 5);
  std::vector<float> g(p.o.size(), 1.f), dq(p.o.size()), dk(p.in.k.size()), dv(p.in.v.size());
  for (int i = 0; i < fl_rung_count(); ++i) {
    if (fl_rung_has_backward(i) || std::string(fl_rung_backend(i)) != "cpu") continue;
    const char* rung = fl_rung_name(i);
    SCOPED_TRACE(rung);
    EXPECT_REFUSED(fl_backward_host(rung, &p.shape, FL_FP32, p.in.q.data(), p.in.k.data(),
                                    p.in.v.data(), p.o.data(), p.lse.data(), g.data(), dq.data(),
                                    dk.data(), dv.data(), nullptr, 0, nullptr),
                   FL_ERR_INVALID, "backward");
    size_t bytes = 0;
    EXPECT_REFUSED(fl_backward_workspace_bytes(rung, "cpu", &p.shape, FL_FP32, &bytes),
                   FL_ERR_INVALID, "backward");
  }
}

// ---- Backward on the CPU twins ------------------------------------------------------------------

// Every twin with a backward pass, in every dtype and head dim it runs it in: gradients against the
// fp64 oracle's backward (on NaN-poisoned outputs), and the io it reports: bytes counted, and the
// rung's modelled backward bytes, which equal them exactly where the rung gives a closed form and
// are NaN (both fields) where it gives none.
TEST(CApi, HostBackwardOfEveryTwinMatchesTheOracleAndReportsIo) {
  const uint64_t seed = 20240612;
  const std::vector<fl_shape> shapes = {
      c_shape(2, 4, 2, 33, 70, 64, true),    // GQA 2:1, B·H = 8, ragged, Nq < Nk causal
      c_shape(1, 2, 2, 70, 33, 64, true),    // Nq > Nk causal: rows 0..36 see no key
      c_shape(1, 2, 1, 40, 40, 128, false),  // d = 128, GQA
  };
  int ran = 0;
  for (int i = 0; i < fl_rung_count(); ++i) {
    if (!fl_rung_has_backward(i) || std::string(fl_rung_backend(i)) != "cpu") continue;
    const std::string rung = fl_rung_name(i);
    for (const fl_shape& c : shapes)
      for (fl_dtype dt : {FL_FP32, FL_FP16, FL_BF16}) {
        size_t ws_bytes = 0;  // refused: a dtype or head dim this rung's backward does not run
        if (fl_backward_workspace_bytes(rung.c_str(), "cpu", &c, dt, &ws_bytes) != FL_OK) continue;
        const fl::AttentionShape s = cpp_shape(c);
        const fl::DType t = cpp_dtype(dt);
        SCOPED_TRACE(rung + " " + s.str() + " " + fl::dtype_name(t) + " seed=" + std::to_string(seed));
        const fl::Inputs in = fl::make_inputs(s, t, seed);
        const fl::BackwardInputs bin = fl::make_backward_inputs(s, t, in, seed + 1);
        const auto q = fl::to_storage(in.q, t), k = fl::to_storage(in.k, t), v = fl::to_storage(in.v, t),
                   o = fl::to_storage(bin.o, t), dout = fl::to_storage(bin.dout, t);
        auto dq = fl::to_storage(std::vector<float>(s.q_elems(), kNaN), t);
        auto dk = fl::to_storage(std::vector<float>(s.kv_elems(), kNaN), t);
        auto dv = fl::to_storage(std::vector<float>(s.kv_elems(), kNaN), t);
        fl_io io{};
        ASSERT_EQ(fl_backward_host(rung.c_str(), &c, dt, q.data(), k.data(), v.data(), o.data(), bin.lse.data(),
                                   dout.data(), dq.data(), dk.data(), dv.data(), nullptr, 0, &io),
                  FL_OK)
            << fl_last_error();
        EXPECT_STREQ(fl_last_error(), "");
        const fl::ReferenceBackward ref =
            fl::reference_backward(s, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
        const fl::BackwardCheck check = fl::check_backward(
            t, fl::BackwardOutputs{fl::from_storage(dq, t), fl::from_storage(dk, t), fl::from_storage(dv, t)}, ref);
        EXPECT_TRUE(check.pass) << check.str();
        EXPECT_GT(io.read_bytes, 0u);
        EXPECT_GT(io.written_bytes, 0u);
        EXPECT_EQ(std::isnan(io.modelled_read_bytes), std::isnan(io.modelled_written_bytes))
            << io.modelled_read_bytes << " " << io.modelled_written_bytes;
        if (!std::isnan(io.modelled_read_bytes)) {  // the IO model's promise, as for the forward
          EXPECT_EQ(double(io.read_bytes), io.modelled_read_bytes);
          EXPECT_EQ(double(io.written_bytes), io.modelled_written_bytes);
        }
        ++ran;
      }
  }
  EXPECT_GT(ran, 0) << "no CPU twin with a backward pass ran (fl_rung_has_backward is 0 for every twin?)";
}

TEST(CApi, DeviceEntryPointNamesWhatIsMissing) {
  if (fl_cuda_available()) GTEST_SKIP() << "a GPU is present; GpuForward covers the device path";
  const std::string why = fl_last_error();
  EXPECT_FALSE(why.empty()) << "fl_cuda_available returned 0 without saying why";
  HostProblem p(c_shape(1, 1, 1, 4, 4, 16, false), 1);
  // Every argument valid (a workspace given: arguments are checked before the GPU is looked for).
  std::vector<unsigned char> ws(1 << 20);
  const fl_status st = fl_forward("00_naive_eigen", &p.shape, FL_FP32, p.in.q.data(),
                                  p.in.k.data(), p.in.v.data(), p.o.data(), p.lse.data(), ws.data(),
                                  ws.size(), nullptr);
  EXPECT_TRUE(st == FL_ERR_NOT_FOUND || st == FL_ERR_CUDA) << fl_status_name(st);
  EXPECT_GT(std::strlen(fl_last_error()), 0u);
  EXPECT_TRUE(p.untouched());
}

// A bad argument is a bad argument on every machine: FL_ERR_INVALID, whether or not there is a
// GPU (or GPU rungs in this build) to look for.
TEST(CApi, BadArgumentsAreInvalidBeforeAGpuIsLookedFor) {
  HostProblem p(c_shape(1, 1, 1, 4, 4, 16, false), 1);
  fl_shape bad = p.shape;
  bad.heads = 0;
  EXPECT_REFUSED(fl_forward("05_fa2_loop_order", &bad, FL_FP32, p.in.q.data(), p.in.k.data(), p.in.v.data(),
                            p.o.data(), p.lse.data(), nullptr, 0, nullptr),
                 FL_ERR_INVALID, "heads (H) = 0");
  std::vector<float> g(64, kNaN);
  EXPECT_REFUSED(fl_backward("07_backward_recompute", &bad, FL_FP32, p.in.q.data(), p.in.k.data(),
                             p.in.v.data(), p.o.data(), p.lse.data(), p.o.data(), g.data(), g.data(), g.data(),
                             nullptr, 0, nullptr),
                 FL_ERR_INVALID, "heads (H) = 0");
  EXPECT_REFUSED(fl_forward("05_fa2_loop_order", &p.shape, static_cast<fl_dtype>(9), p.in.q.data(), p.in.k.data(),
                            p.in.v.data(), p.o.data(), p.lse.data(), nullptr, 0, nullptr),
                 FL_ERR_INVALID, "dtype 9");
  EXPECT_TRUE(p.untouched());
}

// fl_backward_ex: an unknown flag is invalid on every machine; the deterministic flag is refused
// by a GPU rung without the mode (where the build has it), before any work.
TEST(CApi, BackwardFlagsAreCheckedBeforeAnyWork) {
  HostProblem p(c_shape(1, 1, 1, 4, 4, 64, false), 1);
  std::vector<float> g(256, kNaN);
  std::vector<unsigned char> ws(1 << 20);
  EXPECT_REFUSED(fl_backward_ex("07_backward_recompute", &p.shape, FL_FP32, p.in.q.data(), p.in.k.data(),
                                p.in.v.data(), p.o.data(), p.lse.data(), p.o.data(), g.data(), g.data(), g.data(),
                                ws.data(), ws.size(), 6u, nullptr),
                 FL_ERR_INVALID, "unknown flag bits 6");
  bool listed = false;
  for (int i = 0; i < fl_rung_count(); ++i) {
    const std::string name = fl_rung_name(i), backend = fl_rung_backend(i);
    if (backend == "cpu") {
      EXPECT_EQ(fl_rung_has_deterministic_backward(i), fl_rung_has_backward(i)) << name;
    }
    if (name == "07_backward_recompute" && backend == "cuda") {
      EXPECT_EQ(fl_rung_has_deterministic_backward(i), 0);
      listed = true;
    }
    if (name == "09_hopper_backward/v2_deterministic" && backend == "cuda") {
      EXPECT_EQ(fl_rung_has_deterministic_backward(i), 1);
    }
  }
  if (!listed) GTEST_SKIP() << "no CUDA rungs in this build";
  EXPECT_REFUSED(fl_backward_ex("07_backward_recompute", &p.shape, FL_FP32, p.in.q.data(), p.in.k.data(),
                                p.in.v.data(), p.o.data(), p.lse.data(), p.o.data(), g.data(), g.data(), g.data(),
                                ws.data(), ws.size(), FL_BACKWARD_DETERMINISTIC, nullptr),
                 FL_ERR_INVALID, "no deterministic backward");
  EXPECT_TRUE(p.untouched());
}

// Without a GPU, the backward's entry point points to the backward's host twin, not the forward's.
TEST(CApi, DeviceBackwardNamesTheHostBackward) {
  if (fl_cuda_available()) GTEST_SKIP() << "a GPU is present; the GPU tests cover the device path";
  HostProblem p(c_shape(1, 1, 1, 4, 4, 64, false), 1);  // a head dim the rung runs
  std::vector<float> dout(p.in.q), g(256, kNaN);
  std::vector<unsigned char> ws(1 << 20);  // every argument valid: the GPU is what is missing
  const fl_status st = fl_backward("07_backward_recompute", &p.shape, FL_FP32, p.in.q.data(), p.in.k.data(),
                                   p.in.v.data(), p.o.data(), p.lse.data(), dout.data(), g.data(), g.data(),
                                   g.data(), ws.data(), ws.size(), nullptr);
  EXPECT_TRUE(st == FL_ERR_NOT_FOUND || st == FL_ERR_CUDA) << fl_status_name(st);
  const std::string why = fl_last_error();
  EXPECT_NE(why.find("fl_backward_host"), std::string::npos) << why;
  EXPECT_EQ(why.find("fl_forward_host"), std::string::npos) << why;
}

// A CPU twin whose workspace cannot fit in host memory is refused before it is allocated, with how
// much it needs and how much there is (rung 00 stores S and P: 2 x 4 bytes x 2^40 = 8 TiB here).
TEST(CApi, HostTwinOutOfMemorySaysHowMuch) {
  const int64_t n = int64_t(1) << 20;
  const fl_shape shape = c_shape(1, 1, 1, n, n, 1, false);
  std::vector<float> q(n, 1.f), k(n, 1.f), v(n, 1.f), o(n, kNaN), lse(n, kNaN);
  const fl_status st = fl_forward_host("00_naive_eigen", &shape, FL_FP32, q.data(), k.data(), v.data(), o.data(),
                                       lse.data(), nullptr, 0, nullptr);
  EXPECT_EQ(st, FL_ERR_OUT_OF_MEMORY) << fl_status_name(st) << ": " << fl_last_error();
  const std::string why = fl_last_error();
  EXPECT_NE(why.find("8.00 TiB"), std::string::npos) << why;
  EXPECT_NE(why.find("of host memory, but this machine has"), std::string::npos) << why;
  EXPECT_TRUE(std::isnan(o[0]));
}

// ---- Forward on the GPU kernels -----------------------------------------------------------------

#if FLASH_LADDER_HAS_CUDA
// One problem in device memory: inputs rounded to the dtype, outputs poisoned (NaN).
struct DeviceProblem {
  fl_shape shape;
  fl::AttentionShape s;
  fl::DType t;
  fl::Inputs in;
  fl::gpu::DeviceBuffer q, k, v, o, lse;
  DeviceProblem(const fl_shape& c, fl_dtype dt, uint64_t seed)
      : shape(c), s(cpp_shape(c)), t(cpp_dtype(dt)) {
    in = fl::make_inputs(s, t, seed);
    const size_t e = fl::dtype_bytes(t);
    q = fl::gpu::DeviceBuffer(s.q_elems() * e);
    k = fl::gpu::DeviceBuffer(s.kv_elems() * e);
    v = fl::gpu::DeviceBuffer(s.kv_elems() * e);
    o = fl::gpu::DeviceBuffer(s.o_elems() * e);
    lse = fl::gpu::DeviceBuffer(s.lse_elems() * sizeof(float));
    auto up = [&](fl::gpu::DeviceBuffer& b, const std::vector<float>& x) {
      const auto bytes = fl::to_storage(x, t);
      b.upload(bytes.data(), bytes.size());
    };
    up(q, in.q), up(k, in.k), up(v, in.v);
    o.poison();
    lse.poison();
    fl::gpu::synchronize();
  }
  std::vector<float> fetch_o() const {
    std::vector<unsigned char> b(o.size());
    o.download(b.data(), b.size());
    return fl::from_storage(b, t);
  }
  std::vector<float> fetch_lse() const {
    std::vector<float> x(s.lse_elems());
    lse.download(x.data(), x.size() * sizeof(float));
    return x;
  }
};
#endif

TEST(CApi, GpuForward) {
  if (!fl_cuda_available()) GTEST_SKIP() << "no GPU: " << fl_last_error();
#if FLASH_LADDER_HAS_CUDA
  const auto kernels = listed("cuda");
  ASSERT_FALSE(kernels.empty()) << "a GPU is present but no GPU rung is listed";
  const std::vector<fl_shape> shapes = {
      c_shape(2, 4, 2, 77, 130, 64, true),    // ragged, GQA, Nq < Nk causal
      c_shape(1, 2, 2, 130, 77, 64, true),    // Nq > Nk causal: rows that see no key
      c_shape(1, 3, 1, 65, 64, 128, false),   // d = 128, GQA 3:1
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const Listed& r : kernels) {
    for (const fl_shape& c : shapes) {
      for (fl_dtype dt : {FL_FP32, FL_FP16, FL_BF16}) {
        if (!fl_rung_supports(r.name.c_str(), "cuda", &c, dt)) continue;
        DeviceProblem p(c, dt, 11);
        SCOPED_TRACE(r.name + " " + p.s.str() + " " + fl::dtype_name(p.t));
        size_t bytes = 0;
        ASSERT_EQ(fl_forward_workspace_bytes(r.name.c_str(), "cuda", &c, dt, &bytes), FL_OK)
            << fl_last_error();
        fl::gpu::DeviceBuffer ws(bytes);
        if (bytes > 0) {
          // One byte short is refused, naming the bytes needed, and nothing is launched.
          EXPECT_REFUSED(fl_forward(r.name.c_str(), &c, dt, p.q.get(), p.k.get(), p.v.get(),
                                    p.o.get(), static_cast<float*>(p.lse.get()), ws.get(),
                                    bytes - 1, stream),
                         FL_ERR_INVALID, std::to_string(bytes) + " bytes");
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          const auto o = p.fetch_o();
          EXPECT_TRUE(std::isnan(o.front()) && std::isnan(o.back())) << "refused call wrote O";
        }
        // A host pointer where a device pointer belongs is refused, not faulted on.
        EXPECT_REFUSED(fl_forward(r.name.c_str(), &c, dt, p.in.q.data(), p.k.get(), p.v.get(),
                                  p.o.get(), static_cast<float*>(p.lse.get()), ws.get(), bytes,
                                  stream),
                       FL_ERR_INVALID, "host memory");

        ASSERT_EQ(fl_forward(r.name.c_str(), &c, dt, p.q.get(), p.k.get(), p.v.get(), p.o.get(),
                             static_cast<float*>(p.lse.get()), ws.get(), bytes, stream),
                  FL_OK)
            << fl_last_error();
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess)
            << cudaGetErrorString(cudaGetLastError());
        expect_matches_oracle(p.s, p.t, p.in, p.fetch_o(), p.fetch_lse());
      }
    }
  }
  cudaStreamDestroy(stream);
#endif
}

// ---- Decoding (rung 10): its twin through the ABI -------------------------------------------------

// A batch of three sequences (5 keys, none, 130), 4 query heads on 2 KV heads, 2 new rows, causal,
// bf16: the twin through fl_decode_host against the oracle run on each sequence alone, the same
// bits from a paged cache, the traffic equal to the closed form, and the refusals.
TEST(CApi, DecodeHostRunsRung10sTwin) {
  const fl::DType t = fl::DType::BF16;
  const int64_t B = 3, H = 4, Hkv = 2, Nq = 2, d = 64, cap = 130;
  const std::vector<int32_t> len = {5, 0, 130};
  fl::AttentionShape whole;  // only to draw inputs: Q [B, H, Nq, d], K and V [B, Hkv, cap, d]
  whole.batch = B, whole.heads = H, whole.kv_heads = Hkv, whole.seq_q = Nq, whole.seq_k = cap, whole.head_dim = d;
  const fl::Inputs in = fl::make_inputs(whole, t, 77);
  const std::vector<unsigned char> q = fl::to_storage(in.q, t), k = fl::to_storage(in.k, t), v = fl::to_storage(in.v, t);
  fl_decode_shape c{B, H, Hkv, Nq, d, cap, 0, 0, 0, 1, 0.0};
  EXPECT_EQ(fl_decode_choose_splits(&c, 130, 132), 1);   // 6 blocks for 132 SMs, but 130 keys: one piece
  EXPECT_EQ(fl_decode_choose_splits(&c, 5000, 132), 10);  // 22 could fill the SMs; 10 pieces of at least 512 keys
  size_t bytes = 0;
  ASSERT_EQ(fl_decode_workspace_bytes(&c, 3, &bytes), FL_OK) << fl_last_error();
  EXPECT_EQ(bytes, size_t(B * Hkv * 3 * (2 * Nq) * (d + 1) * 4));
  std::vector<unsigned char> o(q.size());
  std::vector<float> lse(size_t(B * H * Nq), std::nanf(""));
  fl_io io{};
  ASSERT_EQ(fl_decode_host(&c, FL_BF16, q.data(), k.data(), v.data(), nullptr, len.data(), o.data(), lse.data(), 0,
                           nullptr, 0, &io),
            FL_OK)
      << fl_last_error();
  EXPECT_EQ(double(io.read_bytes), io.modelled_read_bytes);
  EXPECT_EQ(double(io.written_bytes), io.modelled_written_bytes);
  const std::vector<float> of = fl::from_storage(o, t);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t per = H * Nq * d;
    if (len[size_t(b)] == 0) {
      for (int64_t i = 0; i < per; ++i) EXPECT_EQ(of[size_t(b * per + i)], 0.f);
      for (int64_t i = 0; i < H * Nq; ++i) EXPECT_TRUE(std::isinf(lse[size_t(b * H * Nq + i)]));
      continue;
    }
    fl::AttentionShape one = whole;
    one.batch = 1, one.seq_k = len[size_t(b)], one.causal = true;
    std::vector<float> kb, vb;
    for (int64_t h = 0; h < Hkv; ++h) {
      const auto from = in.k.begin() + (b * Hkv + h) * cap * d;
      kb.insert(kb.end(), from, from + len[size_t(b)] * d);
      const auto vfrom = in.v.begin() + (b * Hkv + h) * cap * d;
      vb.insert(vb.end(), vfrom, vfrom + len[size_t(b)] * d);
    }
    const fl::ReferenceForward ref = fl::reference_forward(one, in.q.data() + b * per, kb.data(), vb.data());
    const fl::ErrorStats e = fl::compare(of.data() + b * per, ref.o.data(), per);
    EXPECT_TRUE(fl::passes(e, t)) << "sequence " << b << ": " << e.str();
  }
  // The same cache in pages of 16 (sequence b's page p is page 9·b + 8 − p of the pool): the same bits.
  fl_decode_shape pc{B, H, Hkv, Nq, d, 144, 16, 9 * B, 9, 1, 0.0};
  std::vector<int32_t> table(size_t(B * 9));
  std::vector<float> pool(size_t(9 * B * Hkv * 16 * d), 0.f), vpool = pool;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < 9; ++p) table[size_t(b * 9 + p)] = int32_t(9 * b + 8 - p);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t j = 0; j < cap; ++j) {
        const int64_t page = table[size_t(b * 9 + j / 16)];
        const size_t to = size_t(((page * Hkv + h) * 16 + j % 16) * d), from = size_t(((b * Hkv + h) * cap + j) * d);
        std::copy_n(in.k.begin() + long(from), d, pool.begin() + long(to));
        std::copy_n(in.v.begin() + long(from), d, vpool.begin() + long(to));
      }
  const std::vector<unsigned char> kp = fl::to_storage(pool, t), vp = fl::to_storage(vpool, t);
  std::vector<unsigned char> o2(q.size());
  std::vector<float> lse2(lse.size());
  ASSERT_EQ(fl_decode_host(&pc, FL_BF16, q.data(), kp.data(), vp.data(), table.data(), len.data(), o2.data(),
                           lse2.data(), 0, nullptr, 0, nullptr),
            FL_OK)
      << fl_last_error();
  EXPECT_EQ(o, o2);
  EXPECT_EQ(0, std::memcmp(lse.data(), lse2.data(), lse.size() * sizeof(float)));
  // Refusals, each before any work, each named.
  EXPECT_REFUSED(fl_decode_host(nullptr, FL_BF16, q.data(), k.data(), v.data(), nullptr, len.data(), o.data(),
                                lse.data(), 0, nullptr, 0, nullptr),
                 FL_ERR_INVALID, "shape is NULL");
  EXPECT_REFUSED(fl_decode_host(&c, FL_FP32, q.data(), k.data(), v.data(), nullptr, len.data(), o.data(), lse.data(),
                                0, nullptr, 0, nullptr),
                 FL_ERR_INVALID, "fp16 and bf16");
  std::vector<unsigned char> small(16);
  EXPECT_REFUSED(fl_decode_host(&c, FL_BF16, q.data(), k.data(), v.data(), nullptr, len.data(), o.data(), lse.data(),
                                3, small.data(), small.size(), nullptr),
                 FL_ERR_INVALID, "fl_decode_workspace_bytes");
  fl_decode_shape wide = c;
  wide.seq_q = 17;
  EXPECT_REFUSED(fl_decode_workspace_bytes(&wide, 1, &bytes), FL_ERR_INVALID, "seq_q");
  EXPECT_EQ(fl_decode_choose_splits(&wide, 10, 132), -1);
}

// The kernels through the ABI: listed with their ideas; an unknown name is FL_ERR_NOT_FOUND; with
// no GPU, fl_decode and fl_stream_read say so (FL_ERR_CUDA); with one, every version on device
// copies of a small ragged problem gives what the twin gives, to rounding.
TEST(CApi, DecodeKernelsAreListedAndRun) {
  const int n = fl_decode_version_count();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(std::string(fl_decode_version_name(i)).rfind("10_decoding/v", 0), 0u) << fl_decode_version_name(i);
    EXPECT_FALSE(std::string(fl_decode_version_idea(i)).empty());
  }
  EXPECT_EQ(fl_decode_version_name(n), nullptr);
  fl_decode_shape c{2, 4, 2, 2, 64, 130, 0, 0, 0, 1, 0.0};
  EXPECT_REFUSED(fl_decode("10_decoding/v0_none", &c, FL_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                           nullptr, 1, nullptr, 0, nullptr),
                 FL_ERR_NOT_FOUND, "v0_none");
  if (!fl_cuda_available()) {
    float sink = 0;
    EXPECT_EQ(fl_stream_read(&sink, 16, &sink, nullptr), FL_ERR_CUDA);
    if (n > 0) {
      EXPECT_EQ(fl_decode(fl_decode_version_name(0), &c, FL_BF16, &sink, &sink, &sink, nullptr, nullptr, &sink, &sink,
                          1, nullptr, 0, nullptr),
                FL_ERR_CUDA);
    }
    GTEST_SKIP() << "no GPU: the kernels' run is left out";
  }
  const fl::DType t = fl::DType::BF16;
  fl::AttentionShape whole;
  whole.batch = 2, whole.heads = 4, whole.kv_heads = 2, whole.seq_q = 2, whole.seq_k = 130, whole.head_dim = 64;
  const fl::Inputs in = fl::make_inputs(whole, t, 78);
  const std::vector<unsigned char> q = fl::to_storage(in.q, t), k = fl::to_storage(in.k, t), v = fl::to_storage(in.v, t);
  const std::vector<int32_t> len = {130, 7};
  std::vector<unsigned char> o_twin(q.size());
  // lse is [B, H, Nq]: 16 values here (a buffer of 8, as this test once had, let the twin write past
  // its end on the host and the kernels past theirs on the device; a run of every test in one
  // process then crashed at exit).
  const size_t n_lse = size_t(whole.lse_elems());
  std::vector<float> lse_twin(n_lse);
  ASSERT_EQ(fl_decode_host(&c, FL_BF16, q.data(), k.data(), v.data(), nullptr, len.data(), o_twin.data(),
                           lse_twin.data(), 3, nullptr, 0, nullptr),
            FL_OK)
      << fl_last_error();
  size_t ws_bytes = 0;
  ASSERT_EQ(fl_decode_workspace_bytes(&c, 3, &ws_bytes), FL_OK);
  fl::gpu::DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size()), dl(len.size() * 4), dout(q.size()), dlse(n_lse * 4),
      dws(ws_bytes), sink(16);
  dq.upload(q.data(), q.size()), dk.upload(k.data(), k.size()), dv.upload(v.data(), v.size());
  dl.upload(len.data(), len.size() * 4);
  for (int i = 0; i < n; ++i) {
    dout.poison(), dlse.poison();
    ASSERT_EQ(fl_decode(fl_decode_version_name(i), &c, FL_BF16, dq.get(), dk.get(), dv.get(), nullptr,
                        static_cast<const int32_t*>(dl.get()), dout.get(), static_cast<float*>(dlse.get()), 3,
                        dws.get(), ws_bytes, nullptr),
              FL_OK)
        << fl_last_error();
    std::vector<unsigned char> o(q.size());
    std::vector<float> lse(n_lse);
    dout.download(o.data(), o.size());
    dlse.download(lse.data(), lse.size() * 4);
    const std::vector<float> of = fl::from_storage(o, t), tf = fl::from_storage(o_twin, t);
    const std::vector<double> ref(tf.begin(), tf.end());
    const fl::ErrorStats e = fl::compare(of.data(), ref.data(), int64_t(of.size()));
    EXPECT_TRUE(fl::passes(e, t)) << fl_decode_version_name(i) << ": " << e.str();
    for (size_t r = 0; r < n_lse; ++r) EXPECT_NEAR(lse[r], lse_twin[r], 1e-3) << fl_decode_version_name(i) << ", row " << r;
  }
  ASSERT_EQ(fl_stream_read(dq.get(), q.size() / 16 * 16, static_cast<float*>(sink.get()), nullptr), FL_OK)
      << fl_last_error();
  fl::gpu::synchronize();
}

// ---- Ring attention (rung 11) through the ABI ------------------------------------------------------

// The chunks a rank holds, the CPU twin of the ring against the fp64 oracle on the whole problem
// (zigzag, causal, GQA, fp32, on NaN-poisoned outputs), and the refusals, each named before any
// work; the NCCL entry points say what this build lacks, or refuse bad arguments before NCCL.
TEST(CApi, RingTwinAndItsRefusals) {
  fl_ring_shape c{1, 4, 2, 96, 64, 1, 0.0, 3, 1};  // N = 96 over P = 3, zigzag: six chunks of 16
  int64_t ch[2] = {-1, -1};
  ASSERT_EQ(fl_ring_chunks(&c, 0, ch), 2) << fl_last_error();
  EXPECT_EQ(ch[0], 0);
  EXPECT_EQ(ch[1], 5);
  ASSERT_EQ(fl_ring_chunks(&c, 2, ch), 2) << fl_last_error();
  EXPECT_EQ(ch[0], 2);
  EXPECT_EQ(ch[1], 3);
  fl_ring_shape contiguous = c;
  contiguous.zigzag = 0;
  ASSERT_EQ(fl_ring_chunks(&contiguous, 1, ch), 1) << fl_last_error();
  EXPECT_EQ(ch[0], 1);
  EXPECT_EQ(fl_ring_chunks(&c, 3, ch), -1);
  EXPECT_NE(std::string(fl_last_error()).find("rank 3"), std::string::npos) << fl_last_error();

  fl::AttentionShape whole;
  whole.batch = 1, whole.heads = 4, whole.kv_heads = 2, whole.seq_q = whole.seq_k = 96, whole.head_dim = 64;
  whole.causal = true;
  const fl::Inputs in = fl::make_inputs(whole, fl::DType::F32, 5);
  std::vector<float> o(size_t(whole.o_elems()), std::nanf("")), lse(size_t(whole.lse_elems()), std::nanf(""));
  ASSERT_EQ(fl_ring_forward_host(&c, FL_FP32, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data()), FL_OK)
      << fl_last_error();
  expect_matches_oracle(whole, fl::DType::F32, in, o, lse);

  fl_ring_shape bad = c;
  bad.seq = 100;  // not a multiple of 2P = 6
  EXPECT_REFUSED(fl_ring_forward_host(&bad, FL_FP32, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data()),
                 FL_ERR_INVALID, "multiple");
  bad = c;
  bad.ranks = 0;
  EXPECT_REFUSED(fl_ring_forward_host(&bad, FL_FP32, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data()),
                 FL_ERR_INVALID, "P");
  EXPECT_REFUSED(fl_ring_forward_host(nullptr, FL_FP32, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data()),
                 FL_ERR_INVALID, "shape is NULL");
  EXPECT_REFUSED(fl_ring_forward_host(&c, FL_FP32, nullptr, in.k.data(), in.v.data(), o.data(), lse.data()),
                 FL_ERR_INVALID, "null");

  void* comm = reinterpret_cast<void*>(1);
  if (!fl_ring_nccl_available()) {
    EXPECT_NE(std::string(fl_last_error()).find("no NCCL"), std::string::npos) << fl_last_error();
    unsigned char id[FL_RING_ID_BYTES] = {};
    EXPECT_REFUSED(fl_ring_unique_id(id), FL_ERR_NOT_FOUND, "no NCCL");
    EXPECT_REFUSED(fl_ring_comm_init(id, 2, 0, &comm), FL_ERR_NOT_FOUND, "no NCCL");
    EXPECT_EQ(comm, nullptr);  // the out-parameter is cleared before any refusal
    EXPECT_REFUSED(fl_ring_forward(&c, FL_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
                   FL_ERR_NOT_FOUND, "fl_ring_forward_host");
  } else {
    EXPECT_REFUSED(fl_ring_comm_init(nullptr, 2, 0, &comm), fl_cuda_available() ? FL_ERR_INVALID : FL_ERR_CUDA,
                   fl_cuda_available() ? "id is null" : "no GPU");
    EXPECT_EQ(comm, nullptr);
  }
  EXPECT_REFUSED(fl_ring_comm_init(nullptr, 2, 0, nullptr), FL_ERR_INVALID, "comm is NULL");
  // fl_ring_forward checks a rank's shape only together with the other ranks (none may leave before
  // they agree); without a communicator there is nobody to agree with.
  if (fl_ring_nccl_available() && fl_cuda_available())
    EXPECT_REFUSED(fl_ring_forward(&bad, FL_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
                   FL_ERR_INVALID, "comm is null");
}

// The ring through the ABI on one GPU: a communicator of one rank made from a unique id, the
// forward on it (causal, GQA, bf16, on poisoned outputs) against the CPU twin, and the communicator
// freed. Two ranks need two GPUs (NCCL refuses two ranks on one): rung 11's own tests have those.
TEST(CApi, RingForwardOnOneGpuThroughACommunicatorItMade) {
  if (!fl_cuda_available()) GTEST_SKIP() << "no GPU: " << fl_last_error();
  if (!fl_ring_nccl_available()) GTEST_SKIP() << fl_last_error();
#if FLASH_LADDER_HAS_CUDA
  const fl::DType t = fl::DType::BF16;
  fl_ring_shape c{2, 4, 2, 256, 64, 1, 0.0, 1, 0};
  fl::AttentionShape whole;
  whole.batch = 2, whole.heads = 4, whole.kv_heads = 2, whole.seq_q = whole.seq_k = 256, whole.head_dim = 64;
  whole.causal = true;
  const fl::Inputs in = fl::make_inputs(whole, t, 9);
  const std::vector<unsigned char> q = fl::to_storage(in.q, t), k = fl::to_storage(in.k, t), v = fl::to_storage(in.v, t);
  std::vector<unsigned char> o_twin(q.size());
  std::vector<float> lse_twin(size_t(whole.lse_elems()));
  ASSERT_EQ(fl_ring_forward_host(&c, FL_BF16, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data()), FL_OK)
      << fl_last_error();
  unsigned char id[FL_RING_ID_BYTES];
  ASSERT_EQ(fl_ring_unique_id(id), FL_OK) << fl_last_error();
  void* comm = nullptr;
  ASSERT_EQ(fl_ring_comm_init(id, 1, 0, &comm), FL_OK) << fl_last_error();
  ASSERT_NE(comm, nullptr);
  fl::gpu::DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size()), dout(q.size()), dlse(lse_twin.size() * 4);
  dq.upload(q.data(), q.size()), dk.upload(k.data(), k.size()), dv.upload(v.data(), v.size());
  dout.poison(), dlse.poison();
  // What a rank alone gets wrong is refused after the ranks' agreement (here a ring of one), not
  // before it, where the others would wait: a NULL shape, an unknown dtype, a bad shape, fp32.
  fl_ring_shape odd = c;
  odd.seq = 255, odd.zigzag = 1;  // zigzag: N a multiple of 2P
  float* dl = static_cast<float*>(dlse.get());
  EXPECT_REFUSED(fl_ring_forward(nullptr, FL_BF16, dq.get(), dk.get(), dv.get(), dout.get(), dl, comm, nullptr),
                 FL_ERR_INVALID, "shape is NULL");
  EXPECT_REFUSED(fl_ring_forward(&c, fl_dtype(7), dq.get(), dk.get(), dv.get(), dout.get(), dl, comm, nullptr),
                 FL_ERR_INVALID, "FL_FP32");
  EXPECT_REFUSED(fl_ring_forward(&odd, FL_BF16, dq.get(), dk.get(), dv.get(), dout.get(), dl, comm, nullptr),
                 FL_ERR_INVALID, "multiple");
  EXPECT_REFUSED(fl_ring_forward(&c, FL_FP32, dq.get(), dk.get(), dv.get(), dout.get(), dl, comm, nullptr),
                 FL_ERR_INVALID, "fp16 and bf16");
  const fl_status st = fl_ring_forward(&c, FL_BF16, dq.get(), dk.get(), dv.get(), dout.get(), dl, comm, nullptr);
  const std::string why = fl_last_error();
  EXPECT_EQ(fl_ring_comm_destroy(comm), FL_OK) << fl_last_error();
  ASSERT_EQ(st, FL_OK) << why;
  std::vector<unsigned char> o(q.size());
  std::vector<float> lse(lse_twin.size());
  dout.download(o.data(), o.size());
  dlse.download(lse.data(), lse.size() * 4);
  const std::vector<float> of = fl::from_storage(o, t), tf = fl::from_storage(o_twin, t);
  const std::vector<double> ref(tf.begin(), tf.end());
  const fl::ErrorStats e = fl::compare(of.data(), ref.data(), int64_t(of.size()));
  EXPECT_TRUE(fl::passes(e, t)) << e.str();
  EXPECT_EQ(e.bad, 0) << "unwritten (still NaN) or non-finite O elements";
  for (size_t r = 0; r < lse.size(); ++r) ASSERT_NEAR(lse[r], lse_twin[r], 1e-3) << "row " << r;
#endif
}

// A rank kept across calls through the ABI (fl_ring_open), a ring of one rank on one GPU: its forward
// twice (the second gives the first's bits) against the CPU twin, its backward against the fp64
// oracle, and what it refuses: a NULL shape or rank at open (after the agreement, as a ring of one),
// a NULL array in a call (FL_ERR_INVALID, and the rank still runs the next call), a NULL rank.
TEST(CApi, RingRankKeptAcrossCallsWithItsBackward) {
  if (!fl_cuda_available()) GTEST_SKIP() << "no GPU: " << fl_last_error();
  if (!fl_ring_nccl_available()) GTEST_SKIP() << fl_last_error();
#if FLASH_LADDER_HAS_CUDA
  const fl::DType t = fl::DType::BF16;
  fl_ring_shape c{2, 4, 2, 256, 64, 1, 0.0, 1, 1};
  fl::AttentionShape whole;
  whole.batch = 2, whole.heads = 4, whole.kv_heads = 2, whole.seq_q = whole.seq_k = 256, whole.head_dim = 64;
  whole.causal = true;
  const fl::Inputs in = fl::make_inputs(whole, t, 19);
  const fl::BackwardInputs bin = fl::make_backward_inputs(whole, t, in, 20);
  const std::vector<unsigned char> q = fl::to_storage(in.q, t), k = fl::to_storage(in.k, t), v = fl::to_storage(in.v, t),
                                   o_in = fl::to_storage(bin.o, t), dout = fl::to_storage(bin.dout, t);
  std::vector<unsigned char> o_twin(q.size());
  std::vector<float> lse_twin(size_t(whole.lse_elems()));
  ASSERT_EQ(fl_ring_forward_host(&c, FL_BF16, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data()), FL_OK)
      << fl_last_error();
  unsigned char id[FL_RING_ID_BYTES];
  ASSERT_EQ(fl_ring_unique_id(id), FL_OK) << fl_last_error();
  void* comm = nullptr;
  ASSERT_EQ(fl_ring_comm_init(id, 1, 0, &comm), FL_OK) << fl_last_error();
  fl_ring_rank* rank = nullptr;
  EXPECT_REFUSED(fl_ring_open(nullptr, FL_BF16, comm, nullptr, &rank), FL_ERR_INVALID, "shape is NULL");
  EXPECT_REFUSED(fl_ring_open(&c, FL_BF16, comm, nullptr, nullptr), FL_ERR_INVALID, "rank is NULL");
  EXPECT_REFUSED(fl_ring_rank_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), FL_ERR_INVALID, "rank is NULL");
  ASSERT_EQ(fl_ring_open(&c, FL_BF16, comm, nullptr, &rank), FL_OK) << fl_last_error();
  fl::gpu::DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size()), out(q.size()), dlse(lse_twin.size() * 4),
      doo(q.size()), ddo(q.size()), dl2(lse_twin.size() * 4), gq(q.size()), gk(k.size()), gv(v.size());
  dq.upload(q.data(), q.size()), dk.upload(k.data(), k.size()), dv.upload(v.data(), v.size());
  doo.upload(o_in.data(), o_in.size()), ddo.upload(dout.data(), dout.size());
  dl2.upload(bin.lse.data(), bin.lse.size() * 4);
  float* dl = static_cast<float*>(dlse.get());
  EXPECT_REFUSED(fl_ring_rank_forward(rank, dq.get(), dk.get(), dv.get(), nullptr, dl), FL_ERR_INVALID, "null pointer");
  std::vector<unsigned char> first(q.size()), o(q.size());
  for (int call = 0; call < 2; ++call) {
    out.poison(), dlse.poison();
    ASSERT_EQ(fl_ring_rank_forward(rank, dq.get(), dk.get(), dv.get(), out.get(), dl), FL_OK) << fl_last_error();
    out.download((call ? o : first).data(), q.size());
  }
  EXPECT_EQ(first, o) << "the second call's O differs from the first's";
  gq.poison(), gk.poison(), gv.poison();
  const fl_status b = fl_ring_rank_backward(rank, dq.get(), dk.get(), dv.get(), doo.get(), static_cast<const float*>(dl2.get()),
                                            ddo.get(), gq.get(), gk.get(), gv.get());
  const std::string why = fl_last_error();
  EXPECT_EQ(fl_ring_close(rank), FL_OK) << fl_last_error();
  EXPECT_EQ(fl_ring_comm_destroy(comm), FL_OK) << fl_last_error();
  ASSERT_EQ(b, FL_OK) << why;
  const std::vector<float> of = fl::from_storage(o, t), tf = fl::from_storage(o_twin, t);
  const std::vector<double> ref(tf.begin(), tf.end());
  const fl::ErrorStats e = fl::compare(of.data(), ref.data(), int64_t(of.size()));
  EXPECT_TRUE(fl::passes(e, t)) << e.str();
  EXPECT_EQ(e.bad, 0) << "unwritten (still NaN) or non-finite O elements";
  std::vector<unsigned char> g1(q.size()), g2(k.size()), g3(v.size());
  gq.download(g1.data(), g1.size()), gk.download(g2.data(), g2.size()), gv.download(g3.data(), g3.size());
  const fl::BackwardCheck bc = fl::check_backward(
      t, {fl::from_storage(g1, t), fl::from_storage(g2, t), fl::from_storage(g3, t)},
      fl::reference_backward(whole, in.q.data(), in.k.data(), in.v.data(), bin.dout.data()));
  EXPECT_TRUE(bc.pass) << bc.str();
#endif
}

}  // namespace
