// The tests every rung passes, whatever it teaches. A rung's test file includes this header and
// instantiates the suite with its name:
//     INSTANTIATE_TEST_SUITE_P(Rung00, RungConformance, ::testing::Values("00_naive_eigen"));
// then adds the tests of its own idea below. (TEST_P bodies live in this header, not a library,
// so the linker can never drop them.)
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rung_testing.hpp"

namespace fl::testing {

// The registered names of one rung, in order: its directory name and every version
// ("06_tensor_core_mma/v1_mma"), for
//     INSTANTIATE_TEST_SUITE_P(Rung06, RungConformance, ::testing::ValuesIn(rung_names("06_tensor_core_mma")),
//                              version_label);
// (gtest evaluates the list in main, after every rung has registered itself.)
inline std::vector<std::string> rung_names(const std::string& step) {
  std::vector<std::string> out;
  for (const std::string& n : Registry::instance().names())
    if (n.substr(0, n.find('/')) == step) out.push_back(n);
  return out;
}
// A test name for a rung's name: the version ("v1_mma"), or "base" for the directory name itself.
inline std::string version_label(const ::testing::TestParamInfo<std::string>& p) {
  const auto slash = p.param.find('/');
  return slash == std::string::npos ? std::string("base") : p.param.substr(slash + 1);
}

class RungConformance : public ::testing::TestWithParam<std::string> {
 protected:
  const Rung* twin() const { return Registry::instance().find(GetParam(), Backend::Cpu); }
};

// The CPU twin matches the fp64 oracle on every ladder shape, for every dtype it runs.
TEST_P(RungConformance, CpuTwinMatchesOracle) {
  ASSERT_NE(twin(), nullptr) << GetParam() << " registered no CPU twin";
  for (DType t : twin()->caps().dtypes) expect_ladder_cases_pass(GetParam(), Backend::Cpu, t);
}

// The GPU rung matches the oracle too, within 2× its twin's error, every element written.
TEST_P(RungConformance, GpuMatchesOracleAndTwin) {
  FL_RUNG_OR_SKIP(gpu, GetParam(), Backend::Cuda);
  for (DType t : gpu->caps().dtypes) expect_ladder_cases_pass(GetParam(), Backend::Cuda, t);
}

// The twin moves exactly the bytes its closed form says, on ragged shapes, causal and GQA too.
TEST_P(RungConformance, TwinTrafficMatchesClosedForm) {
  ASSERT_NE(twin(), nullptr);
  const DType t = twin()->caps().dtypes.front();
  std::vector<AttentionShape> shapes;
  for (const AttentionShape& s : {make_shape(1, 1, 1, 64, 64, 64, false), make_shape(1, 2, 1, 100, 37, 64, true),
                                  make_shape(2, 2, 2, 129, 257, 128, false), make_shape(1, 1, 1, 300, 300, 32, true)})
    if (twin()->supports(s, t)) shapes.push_back(s);
  ASSERT_FALSE(shapes.empty());
  expect_io_matches_model(*twin(), t, shapes);
}

// Bad shapes, unsupported dtypes and head dims, and null pointers are refused before any work,
// with a message that names the rung and says what it supports.
TEST_P(RungConformance, RefusesWhatItDoesNotRun) {
  for (Backend b : {Backend::Cpu, Backend::Cuda}) {
    const Rung* r = Registry::instance().find(GetParam(), b);
    if (!r || !r->unavailable().empty()) continue;  // cannot run here: every call is refused, with why
    SCOPED_TRACE(r->label());
    const Capabilities c = r->caps();
    const AttentionShape ok = make_shape(1, 2, 2, 16, 16, c.head_dims.empty() ? 64 : c.head_dims.front(), false);
    const DType t = c.dtypes.front();
    ASSERT_TRUE(r->supports(ok, t));
    auto refused = [&](const AttentionShape& s, DType dt, const std::string& must_say) {
      std::string why;
      EXPECT_FALSE(r->supports(s, dt, &why)) << s.str();
      EXPECT_NE(why.find(must_say), std::string::npos) << "message: " << why;
    };
    AttentionShape s = ok;
    s.seq_q = 0;
    refused(s, t, "seq_q (Nq) = 0");
    s = ok, s.heads = 3, s.kv_heads = 2;
    refused(s, t, "not a multiple of kv_heads");
    s = ok, s.head_dim = -4;
    refused(s, t, "head_dim (d) = -4");
    s = ok, s.head_dim = 1000;
    refused(s, t, r->name());
    for (DType other : {DType::F32, DType::F16, DType::BF16})
      if (std::find(c.dtypes.begin(), c.dtypes.end(), other) == c.dtypes.end())
        refused(ok, other, std::string("dtype ") + dtype_name(other));
    // A null pointer is refused by check() before the rung touches anything.
    ForwardArgs none;
    try {
      r->check(ok, t, none);
      ADD_FAILURE() << "null pointers accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("is null"), std::string::npos) << e.what();
    }
  }
}

// A GPU rung whose memory grows like N² says so, before allocating anything, at N = 65536.
TEST_P(RungConformance, GpuRefusesWhatDoesNotFitBeforeAllocating) {
  FL_RUNG_OR_SKIP(gpu, GetParam(), Backend::Cuda);
  const AttentionShape big = make_shape(1, 16, 16, 65536, 65536, 64, false);
  const DType t = gpu->caps().dtypes.front();
  if (ForwardRun::device_bytes(*gpu, big, t) < gpu::free_memory())
    GTEST_SKIP() << gpu->label() << " fits N=65536 in device memory (its memory is linear in N)";
  const std::size_t allocations_before = gpu::allocation_count();
  try {
    ForwardRun run(*gpu, big, t, Inputs{});
    FAIL() << "expected a refusal";
  } catch (const gpu::OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("needs"), std::string::npos) << m;
    EXPECT_NE(m.find("free"), std::string::npos) << m;
    EXPECT_NE(m.find(gpu->name()), std::string::npos) << m;
  }
  EXPECT_EQ(gpu::allocation_count(), allocations_before) << "device memory was allocated before the refusal";
}

}  // namespace fl::testing
