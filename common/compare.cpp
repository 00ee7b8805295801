#include "compare.hpp"

#include <cmath>
#include <cstdio>

namespace fl {

ErrorStats compare(const float* out, const double* ref, int64_t n) {
  ErrorStats e;
  e.count = n;
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double o = out[i], r = ref[i];
    if (!std::isfinite(r) || !std::isfinite(o)) {
      if (!(std::isinf(r) && o == r)) {  // a matching infinity (lse of an empty row) is right
        if (e.bad++ == 0) e.first_bad = i;
      }
      continue;
    }
    const double diff = std::abs(o - r);
    e.max_abs = std::max(e.max_abs, diff);
    num += diff * diff;
    den += r * r;
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  e.l2 = std::sqrt(num);
  e.ref_l2 = std::sqrt(den);
  return e;
}

std::string ErrorStats::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "rel_l2=%.2e max_abs=%.2e", rel_l2, max_abs);
  std::string s = buf;
  if (bad) s += "; " + std::to_string(bad) + " of " + std::to_string(count) +
                " wrong in kind: NaN or ±∞ where the oracle's value is finite (an output never written stays "
                "NaN, the harness's poison), or finite where it is ±∞ (first at index " +
                std::to_string(first_bad) + ")";
  return s;
}

double tolerance(DType t) {
  switch (t) {
    case DType::F32: return 1e-5;   // fp32 accumulation over Nk ≤ 64k terms lands near 1e-7..1e-6
    case DType::F16: return 5e-3;   // 10-bit mantissa inputs and P: ~1e-3 expected
    case DType::BF16: return 2e-2;  // 7-bit mantissa: ~5e-3 expected
  }
  return 0;
}

bool passes(const ErrorStats& e, DType t) { return e.bad == 0 && e.rel_l2 <= tolerance(t); }

}  // namespace fl
