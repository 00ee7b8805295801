#include "problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace fl {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::F32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw InputError("unknown dtype '" + std::string(s) + "': allowed are fp32, fp16, bf16");
}

std::size_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

void AttentionShape::validate() const {
  auto positive = [](const char* what, int64_t v) {
    if (v < 1)
      throw InputError(std::string("bad shape: ") + what + " = " + std::to_string(v) +
                       "; it must be at least 1");
  };
  positive("batch (B)", batch);
  positive("heads (H)", heads);
  positive("kv_heads (Hkv)", kv_heads);
  positive("seq_q (Nq)", seq_q);
  positive("seq_k (Nk)", seq_k);
  positive("head_dim (d)", head_dim);
  if (heads % kv_heads != 0)
    throw InputError("bad shape: heads (H) = " + std::to_string(heads) +
                     " is not a multiple of kv_heads (Hkv) = " + std::to_string(kv_heads) +
                     "; grouped-query attention needs H = g·Hkv");
  if (scale != 0.0 && !(std::isfinite(scale) && scale > 0.0))
    throw InputError("bad scale " + std::to_string(scale) +
                     ": it must be finite and > 0 (or 0 for the default 1/sqrt(d))");
  // Element counts must fit in int64 (the largest is B·H·Nq·Nk for rungs that store S).
  const long double big = (long double)batch * heads * std::max(seq_q, seq_k) *
                          std::max({seq_k, head_dim, int64_t(1)});
  if (big > (long double)std::numeric_limits<int64_t>::max() / 8)
    throw InputError("bad shape: " + str() + " has more elements than 64-bit indexing allows");
}

float AttentionShape::softmax_scale() const {
  return scale != 0.0 ? float(scale) : float(1.0 / std::sqrt(double(head_dim)));
}

double AttentionShape::flops_forward() const {
  const double f = 4.0 * double(batch) * double(heads) * double(seq_q) * double(seq_k) * double(head_dim);
  return causal ? 0.5 * f : f;
}

std::string AttentionShape::str() const {
  std::ostringstream s;
  s << "B=" << batch << " H=" << heads << " Hkv=" << kv_heads << " Nq=" << seq_q << " Nk=" << seq_k
    << " d=" << head_dim << " causal=" << (causal ? 1 : 0);
  if (scale != 0.0) s << " scale=" << scale;
  return s.str();
}

std::string describe_bytes(double bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) { bytes /= 1024.0; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, unit[u]);
  return buf;
}

}  // namespace fl
