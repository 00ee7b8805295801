// The attention problem every rung solves, and the checks that refuse a bad one before any work.
//
//   O = softmax(Q·Kᵀ·scale + mask)·V        Q: [B, H, Nq, d]   K, V: [B, Hkv, Nk, d]   O: [B, H, Nq, d]
//   lse = log Σ_j exp(S_ij)  (natural log)  lse: [B, H, Nq] fp32
//
// Grouped-query attention: query head h reads key/value head h / (H / Hkv).
// Causal: key j is masked for query i when j > i + (Nk − Nq) (bottom-right aligned, as
// FlashAttention-2 and PyTorch do when Nq ≠ Nk). A query row that sees no key gets O = 0, lse = −∞.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fl {

// Thrown for every bad input (shape, dtype, head dim, pointer). The message says what was given,
// what is allowed and, where a rung refused, which rung.
struct InputError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

enum class DType { F32, F16, BF16 };
const char* dtype_name(DType t);       // "fp32", "fp16", "bf16"
DType parse_dtype(std::string_view s);  // throws InputError naming the allowed spellings
std::size_t dtype_bytes(DType t);

struct AttentionShape {
  int64_t batch = 1;     // B
  int64_t heads = 1;     // H, query heads
  int64_t kv_heads = 1;  // Hkv, key/value heads; H must be a multiple of it
  int64_t seq_q = 1;     // Nq
  int64_t seq_k = 1;     // Nk
  int64_t head_dim = 64; // d
  bool causal = false;
  double scale = 0.0;  // 0 means the default 1/√d; otherwise must be finite and > 0

  // Throws InputError (before any work) for zero/negative sizes, H % Hkv ≠ 0, a bad scale, or
  // sizes whose element counts overflow 64 bits.
  void validate() const;

  float softmax_scale() const;  // scale, or 1/√d by default
  int64_t group() const { return heads / kv_heads; }  // query heads per key/value head

  int64_t q_elems() const { return batch * heads * seq_q * head_dim; }
  int64_t kv_elems() const { return batch * kv_heads * seq_k * head_dim; }
  int64_t o_elems() const { return q_elems(); }
  int64_t lse_elems() const { return batch * heads * seq_q; }
  int64_t score_elems() const { return batch * heads * seq_q * seq_k; }  // one S or P

  // Where head (b, h) starts in a contiguous tensor seen as rows of d: its first query row in
  // Q, O, lse ([B·H·Nq] rows), and the first row of the key/value head it reads in K, V
  // ([B·Hkv·Nk] rows; query head h reads key/value head h / group()).
  int64_t q_row0(int64_t b, int64_t h) const { return (b * heads + h) * seq_q; }
  int64_t kv_row0(int64_t b, int64_t h) const { return (b * kv_heads + h / group()) * seq_k; }

  // The last key index query i may see (inclusive); keys past it are masked.
  // Non-causal: Nk − 1. Causal: i + (Nk − Nq), which is < 0 when row i sees no key.
  int64_t last_key(int64_t i) const { return causal ? i + (seq_k - seq_q) : seq_k - 1; }

  // FLOPs by the convention of ../shared/anchors.md: 4·B·H·Nq·Nk·d, half of it when causal.
  double flops_forward() const;
  double flops_backward() const { return 2.5 * flops_forward(); }

  std::string str() const;  // "B=1 H=16 Hkv=16 Nq=4096 Nk=4096 d=64 causal=0"
};

// Nothing in a name of the form "NN_name" needs more than this to find it in a message.
std::string describe_bytes(double bytes);  // "1.50 GiB", "512 B"

}  // namespace fl
