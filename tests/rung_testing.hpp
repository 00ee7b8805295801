// What every rung's test file shares: the shapes the design asks each rung to pass, running a
// rung on one of them against the fp64 oracle, and the GPU-or-skip rule.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device.hpp"
#include "harness.hpp"

namespace fl::testing {

struct Case {
  AttentionShape shape;
  InputKind kind = InputKind::Normal;
  uint64_t seed = 0;
  std::string str() const;  // shape, input kind and seed: enough to reproduce a failure
};

// Ragged (1, 17, 113×203, 1000, 1023×1024), Nq ≠ Nk both ways (rows that see no key when causal),
// causal and not, B·H > 1, GQA, several head dims; only those the rung supports for `t`.
// Seeds are fresh per process unless FL_TEST_SEED is set; every failure message prints them.
std::vector<Case> ladder_cases(const Rung& r, DType t);

// Finds a registered rung; a GPU rung skips the test (with the reason) when no GPU can run it.
const Rung* rung_or_skip(const std::string& name, Backend b);
#define FL_RUNG_OR_SKIP(var, name, backend)            \
  const ::fl::Rung* var = ::fl::testing::rung_or_skip(name, backend); \
  if (!var) GTEST_SKIP() << "no " #backend " rung " << name << ": " << ::fl::testing::skip_reason(name, backend)
std::string skip_reason(Backend b);
std::string skip_reason(const std::string& name, Backend b);  // with the rung's own reason, if any

struct CaseResult {
  ForwardOutputs out;
  ReferenceForward ref;
  ForwardCheck check;
  IoCounter io;  // counted traffic, for CPU twins
};
// Runs the rung on fresh inputs for the case (outputs poisoned first) and checks every row.
CaseResult run_case(const Rung& r, DType t, const Case& c, double tol = 0);

uint64_t base_seed();

// Every ladder case passes against the oracle. For a GPU rung each case's error must also be at
// most 2× its CPU twin's on the same inputs (with a floor of a tenth of the dtype's tolerance,
// for when both sit at rounding level), and every output element must have been written.
void expect_ladder_cases_pass(const std::string& name, Backend b, DType t);
// The same checks on cases of the caller's choosing (a rung's own inputs or shapes).
void expect_cases_pass(const Rung& r, DType t, const std::vector<Case>& cases);

// A GPU backward on one problem against the fp64 oracle, and within 2× its CPU twin's error (with
// the same floor), every gradient element written; skips without a GPU that runs it.
// `deterministic` runs the rung's deterministic mode.
void expect_gpu_backward_matches_oracle_and_twin(const std::string& name, DType t, const AttentionShape& s,
                                                 uint64_t seed, bool deterministic = false);

// The twin's counted device-memory traffic equals the rung's closed form exactly.
void expect_io_matches_model(const Rung& twin, DType t, const std::vector<AttentionShape>& shapes);
// Hopper rungs (08, 09): where a version's kernels cannot run, every check refuses with the
// rung's reason (`Rung::unavailable`); where they can, nothing is refused for that reason.
// Skips without a CUDA build.
void expect_refused_where_unavailable(const std::vector<std::string>& names);

// A shape from its fields, for test tables.
AttentionShape make_shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nk, int64_t d,
                          bool causal);  // FL_TEST_SEED or a fresh random seed, printed once per process

}  // namespace fl::testing
