// Error metrics against the fp64 oracle, and the tolerance each dtype is held to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.hpp"

namespace fl {

struct ErrorStats {
  int64_t count = 0;
  int64_t bad = 0;          // NaN / ±inf where the oracle is finite, or the wrong infinity: a
                            // poisoned (NaN) element that was never written shows up here
  int64_t first_bad = -1;   // index of the first bad element
  double max_abs = 0;       // over elements where both are finite
  double rel_l2 = 0;        // ‖out − ref‖₂ / ‖ref‖₂ over those elements (plain L2 if ‖ref‖ = 0)
  double l2 = 0;            // ‖out − ref‖₂ over those elements
  double ref_l2 = 0;        // ‖ref‖₂ over those elements
  std::string str() const;  // "rel_l2=1.2e-07 max_abs=3.0e-07" or "...; 12 bad (first at 5)"
};

// out[i] against ref[i] for i < n. Elements where ref is −∞ (an empty row's lse) must be −∞ too.
ErrorStats compare(const float* out, const double* ref, int64_t n);

// Relative L2 error a dtype is held to against the fp64 oracle.
double tolerance(DType t);

// The rule a GPU rung meets: no bad element, relative error within the dtype's tolerance.
bool passes(const ErrorStats& e, DType t);

}  // namespace fl
