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
  if (!var) GTEST_SKIP() << "no " #backend " rung " << name << ": " << ::fl::testing::skip_reason(backend)
std::string skip_reason(Backend b);

struct CaseResult {
  ForwardOutputs out;
  ReferenceForward ref;
  ForwardCheck check;
  IoCounter io;  // counted traffic, for CPU twins
};
// Runs the rung on fresh inputs for the case (outputs poisoned first) and checks every row.
CaseResult run_case(const Rung& r, DType t, const Case& c, double tol = 0);

uint64_t base_seed();  // FL_TEST_SEED or a fresh random seed, printed once per process

}  // namespace fl::testing
