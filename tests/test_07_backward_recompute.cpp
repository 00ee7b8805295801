// Rung 07: the backward pass by recomputation. The conformance suite covers its forward (rung
// 05's); here: gradients against the fp64 oracle's backward (itself checked by finite differences
// in test_common.cpp), the identity that lets D be computed from O, and the twin's traffic pinned
// to its closed form.
#include <Eigen/Dense>

#include <cstdlib>
#include <string>
#include <vector>

#include "../steps/07_backward_recompute/backward_recompute.hpp"
#include "conformance_tests.hpp"

namespace fl::testing {
namespace {

// Every version, each on its own (the fp32 one, v1..v4 and the `mma` name for the fastest).
INSTANTIATE_TEST_SUITE_P(Rung07, RungConformance, ::testing::ValuesIn(rung_names("07_backward_recompute")),
                         version_label);

const Rung& twin(const char* name = backward::kName) {
  const Rung* r = Registry::instance().find(name, Backend::Cpu);
  if (!r) throw std::logic_error(std::string(name) + " twin not registered");
  return *r;
}

// Ragged, causal (with rows that see no key when Nq > Nk), GQA, both head dims: the shapes the
// GPU tests run.
std::vector<AttentionShape> gpu_shapes() {
  return {make_shape(1, 2, 2, 17, 17, 64, true),    make_shape(2, 3, 1, 113, 203, 64, true),
          make_shape(1, 2, 2, 203, 113, 128, true), make_shape(1, 4, 2, 77, 300, 128, false),
          make_shape(1, 2, 1, 1000, 1000, 64, false), make_shape(1, 2, 2, 333, 333, 128, true)};
}

void expect_gpu_matches_oracle_and_twin(const char* name, DType t, const AttentionShape& s, uint64_t seed) {
  expect_gpu_backward_matches_oracle_and_twin(name, t, s, seed);
}

// Ragged, causal (with rows that see no key when Nq > Nk), GQA, both head dims.
TEST(Backward, TwinGradientsMatchTheOracle) {
  uint64_t seed = base_seed();
  for (const AttentionShape& s : {make_shape(1, 1, 1, 1, 1, 64, false), make_shape(1, 2, 2, 17, 17, 64, true),
                                  make_shape(2, 3, 1, 113, 203, 64, true), make_shape(1, 2, 2, 203, 113, 128, true),
                                  make_shape(1, 4, 2, 77, 300, 128, false), make_shape(1, 2, 1, 300, 300, 64, false)}) {
    SCOPED_TRACE(s.str() + " seed=" + std::to_string(seed));
    const Inputs in = make_inputs(s, DType::F32, seed++);
    const BackwardInputs bin = make_backward_inputs(s, DType::F32, in, seed++);
    const BackwardOutputs out = run_backward(twin(), s, DType::F32, in, bin);
    const ReferenceBackward ref = reference_backward(s, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
    // With the condition floor: on the 1 × 1 shape the exact dQ and dK are 0 (one key: P = 1, so
    // dS = P·(dP − D) = dP − D = 0), and only the floor says how far from 0 roundings may take them.
    const ReferenceBackward moved = reference_backward_moved(s, DType::F32, in, bin);
    const BackwardCheck c = check_backward(DType::F32, out, ref, 0, &moved);
    EXPECT_TRUE(c.pass) << c.str();
  }
}

// The readable fp32 CUDA backward.
TEST(Backward, GpuGradientsMatchTheOracleAndTheTwin) {
  uint64_t seed = base_seed();
  for (const AttentionShape& s : gpu_shapes()) expect_gpu_matches_oracle_and_twin(backward::kName, DType::F32, s, seed += 2);
}

// The tensor-core backward under the name of the fastest version, fp16 and bf16, against the
// oracle and the numerics twin.
TEST(Backward, GpuMmaGradientsMatchTheOracleAndTheTwin) {
  uint64_t seed = base_seed();
  for (DType t : {DType::F16, DType::BF16})
    for (const AttentionShape& s : gpu_shapes()) expect_gpu_matches_oracle_and_twin(backward::kMmaName, t, s, seed += 2);
}

// Every tensor-core version by its own name, not only the fastest (which is v3 or v4): the
// others would otherwise go untested.
TEST(Backward, GpuEveryVersionMatchesTheOracleAndTheTwin) {
  if (!rung_or_skip(backward::kMmaName, Backend::Cuda)) GTEST_SKIP() << skip_reason(Backend::Cuda);
  uint64_t seed = base_seed();
  for (const backward::VersionInfo& v : backward::kVersions) {
    if (v.version == backward::Version::Fp32 || v.version == backward::Version::Fastest) continue;
    for (DType t : {DType::F16, DType::BF16})
      for (const AttentionShape& s : {make_shape(2, 3, 1, 113, 203, 64, true), make_shape(1, 4, 2, 77, 300, 128, false)})
        expect_gpu_matches_oracle_and_twin(v.name, t, s, seed += 2);
  }
}

// The tensor-core rung's twin makes the kernel's roundings and still meets the dtype's tolerance;
// bf16's 3 fewer mantissa bits show as a larger error than fp16's.
TEST(Backward, MmaTwinGradientsMatchTheOracle) {
  uint64_t seed = base_seed();
  for (const AttentionShape& s : {make_shape(1, 2, 2, 17, 17, 64, true), make_shape(2, 4, 2, 113, 203, 64, true),
                                  make_shape(1, 2, 2, 203, 113, 128, true), make_shape(1, 2, 1, 150, 150, 128, false)}) {
    double err[2] = {};
    for (DType t : {DType::F16, DType::BF16}) {
      SCOPED_TRACE(s.str() + " " + dtype_name(t) + " seed=" + std::to_string(seed));
      const Inputs in = make_inputs(s, t, seed++);
      const BackwardInputs bin = make_backward_inputs(s, t, in, seed++);
      const BackwardOutputs out = run_backward(twin(backward::kMmaName), s, t, in, bin);
      const ReferenceBackward ref = reference_backward(s, in.q.data(), in.k.data(), in.v.data(), bin.dout.data());
      const BackwardCheck c = check_backward(t, out, ref);
      EXPECT_TRUE(c.pass) << c.str();
      err[t == DType::BF16] = c.dq.rel_l2 + c.dk.rel_l2 + c.dv.rel_l2;
    }
    EXPECT_GT(err[1], 3 * err[0]) << "bf16 error " << err[1] << " vs fp16 " << err[0];
  }
}

// Why D = rowsum(dO ∘ O) may stand in for rowsum(P ∘ dP): O = P·V, so
// Σ_c dO_ic O_ic = Σ_c dO_ic Σ_j P_ij V_jc = Σ_j P_ij Σ_c dO_ic V_jc = Σ_j P_ij dP_ij.
// Checked in fp64 on random data, causal, so that masked entries take part too.
TEST(Backward, RowsumOfDoTimesOEqualsRowsumOfPTimesDp) {
  const AttentionShape s = make_shape(1, 1, 1, 40, 50, 16, true);
  const Inputs in = make_inputs(s, DType::F32, base_seed());
  const std::vector<float> dout = make_inputs(s, DType::F32, base_seed() + 1).q;
  using Mat = Eigen::MatrixXd;
  const auto map = [](const std::vector<float>& x, int64_t r, int64_t c) {
    return Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>(x.data(), r, c).cast<double>().eval();
  };
  const Mat Q = map(in.q, 40, 16), K = map(in.k, 50, 16), V = map(in.v, 50, 16), dO = map(dout, 40, 16);
  Mat P = Q * K.transpose() * double(s.softmax_scale());
  for (int i = 0; i < 40; ++i) {
    for (int j = 0; j < 50; ++j)
      if (j > s.last_key(i)) P(i, j) = -INFINITY;
    P.row(i) = (P.row(i).array() - P.row(i).maxCoeff()).exp().matrix();
    P.row(i) /= P.row(i).sum();
  }
  const Mat O = P * V, dP = dO * V.transpose();
  const Eigen::VectorXd D = (dO.array() * O.array()).rowwise().sum();
  const Eigen::VectorXd PdP = (P.array() * dP.array()).rowwise().sum();
  EXPECT_LT((D - PdP).cwiseAbs().maxCoeff(), 1e-12);
}

// The twin's counted bytes equal the closed form; non-causal by hand for N = 1024, d = 64
// (Tc = 16): per head, O, dO read and D, dQ=0 written once; K, V read and dK, dV written once;
// per K/V block, Q, dO, L, D and dQ read and dQ written for all 1024 rows.
TEST(Backward, TrafficMatchesClosedForm) {
  uint64_t seed = base_seed();
  for (const AttentionShape& s : {make_shape(1, 2, 1, 100, 130, 64, true), make_shape(2, 2, 2, 129, 65, 128, false),
                                  make_shape(1, 4, 2, 70, 200, 64, true)}) {
    SCOPED_TRACE(s.str());
    const Inputs in = make_inputs(s, DType::F32, seed++);
    const BackwardInputs bin = make_backward_inputs(s, DType::F32, in, seed++);
    IoCounter io;
    run_backward(twin(), s, DType::F32, in, bin, &io);
    const IoModel m = backward::io_model(s, DType::F32, backward::info(backward::Version::Fp32).block_keys);
    EXPECT_EQ(double(io.read), m.read);
    EXPECT_EQ(double(io.written), m.written);
    // The tensor-core versions' twins: 2-byte elements, the last pass over dQ's accumulator, and
    // the version's B_c (64 for v1, 128 after).
    const Inputs in16 = make_inputs(s, DType::BF16, seed++);
    const BackwardInputs bin16 = make_backward_inputs(s, DType::BF16, in16, seed++);
    for (backward::Version v : {backward::Version::V1Mma, backward::Version::V4Tiles2d}) {
      IoCounter io16;
      run_backward(twin(backward::info(v).name), s, DType::BF16, in16, bin16, &io16);
      const IoModel m16 = backward::io_model(s, DType::BF16, backward::info(v).block_keys);
      EXPECT_EQ(double(io16.read), m16.read) << backward::info(v).name;
      EXPECT_EQ(double(io16.written), m16.written) << backward::info(v).name;
      EXPECT_EQ(twin(backward::info(v).name).modelled_backward_io(s, DType::BF16).read, m16.read);
    }
  }
  const double N = 1024, d = 64, tc = 16;
  const IoModel m = backward::io_model(make_shape(1, 1, 1, 1024, 1024, 64, false), DType::F32, 64);
  EXPECT_EQ(m.read, 4 * (2 * N * d + 2 * N * d + tc * N * (3 * d + 2)));
  EXPECT_EQ(m.written, 4 * (N + N * d + 2 * N * d + tc * N * d));
}

TEST(Backward, ExtraMemoryIsLinearInN) {
  EXPECT_EQ(twin().backward_workspace_bytes(make_shape(1, 16, 16, 65536, 65536, 64, false), DType::F32),
            std::size_t(16) * 65536 * 4);  // D: 4 MiB, where P would be 256 GiB
  // The tensor-core rung adds dQ's fp32 accumulator: 16 · 65536 · 64 · 4 bytes = 256 MiB.
  EXPECT_EQ(twin(backward::kMmaName).backward_workspace_bytes(make_shape(1, 16, 16, 65536, 65536, 64, false), DType::BF16),
            std::size_t(16) * 65536 * 4 + std::size_t(16) * 65536 * 64 * 4);
}

TEST(Backward, RefusesMissingPointers) {
  const AttentionShape s = make_shape(1, 1, 1, 8, 8, 64, false);
  BackwardArgs none;
  try {
    twin().check(s, DType::F32, none);
    ADD_FAILURE() << "null pointers accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is null"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fl::testing
