// LAB backward_ds (docs/labs.md): fill in the TODO(lab) lines, then rebuild and grade (build/ in
// place of build-cpu/ with the GPU rungs): cmake --build build-cpu --target lab_backward_ds && ctest --test-dir build-cpu -L lab_backward_ds --output-on-failure
// Rung 07, CPU twin: FlashAttention-2's backward with Eigen blocks, every block counted, in the
// precision of either kernel.
#include "backward_recompute.hpp"

#include <Eigen/Core>
#include <limits>
#include <type_traits>

#include "twin.hpp"

namespace fl::backward {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Q blocks that see at least one key of the K/V block starting at j0 (causal skips the rest).
template <class F>
void for_visible_q_blocks(const AttentionShape& s, int64_t j0, F&& visit) {
  for (int64_t i0 = 0; i0 < s.seq_q; i0 += kBr) {
    const int64_t br = std::min(kBr, s.seq_q - i0);
    if (s.last_key(i0 + br - 1) >= j0) visit(i0, br);
  }
}

}  // namespace

std::size_t dq_accum_offset(const AttentionShape& s) {
  return (std::size_t(s.lse_elems()) * sizeof(float) + 255) / 256 * 256;
}

std::size_t workspace_bytes(const AttentionShape& s, Precision p) {
  if (p == Precision::Fp32) return std::size_t(s.lse_elems()) * sizeof(float);
  return dq_accum_offset(s) + std::size_t(s.q_elems()) * sizeof(float);
}

Capabilities capabilities(Precision p) {
  Capabilities c;
  c.dtypes = p == Precision::Fp32 ? std::vector<DType>{DType::F32} : std::vector<DType>{DType::F16, DType::BF16};
  c.head_dims = {64, 128};
  c.backward = true;
  c.workspace_what = p == Precision::Fp32 ? "D = rowsum(dO*O), B*H*Nq fp32"
                                          : "D = rowsum(dO*O), B*H*Nq fp32, and dQ's fp32 accumulator, B*H*Nq*d";
  return c;
}

IoModel io_model(const AttentionShape& s, DType t, int64_t kBc) {
  const double d = double(s.head_dim), e = double(dtype_bytes(t)), f = sizeof(float), nq = double(s.seq_q);
  // Once per query head: O, dO read; D written; dQ's fp32 accumulator zeroed.
  double read = double(s.heads) * 2 * nq * d * e, written = double(s.heads) * (nq * f + nq * d * f);
  for (int64_t j0 = 0; j0 < s.seq_k; j0 += kBc) {
    const double bc = double(std::min(kBc, s.seq_k - j0));
    read += double(s.kv_heads) * 2 * bc * d * e;     // K_j, V_j, once per key/value head
    written += double(s.kv_heads) * 2 * bc * d * e;  // dK_j, dV_j
    for_visible_q_blocks(s, j0, [&](int64_t, int64_t br) {
      read += double(s.heads) * br * (2 * d * e + 2 * f + d * f);  // Q_i, dO_i, L_i, D_i, and dQ_i
      written += double(s.heads) * br * d * f;                     // dQ_i back
    });
  }
  if (t != DType::F32) {  // the last pass: dQ = scale · accumulator, rounded to the dtype
    read += double(s.heads) * nq * d * f;
    written += double(s.heads) * nq * d * e;
  }
  return {double(s.batch) * read, double(s.batch) * written};
}

namespace {

// x as the kernel feeds it to a product: rounded to T (a no-op for fp32).
template <class T>
Block round_to(const Block& x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return x.unaryExpr([](float v) { return float(T(v)); });
}

// T is the storage type: float, Eigen::half or Eigen::bfloat16.
template <class T>
void twin(const AttentionShape& s, const BackwardArgs& a, IoCounter& io, int64_t kBc) {
  constexpr bool kFp32 = std::is_same_v<T, float>;
  const int64_t d = s.head_dim, q_rows = s.batch * s.heads * s.seq_q, kv_rows = s.batch * s.kv_heads * s.seq_k;
  HbmMatrix<const T> Q(static_cast<const T*>(a.q), q_rows, d, io);
  HbmMatrix<const T> K(static_cast<const T*>(a.k), kv_rows, d, io);
  HbmMatrix<const T> V(static_cast<const T*>(a.v), kv_rows, d, io);
  HbmMatrix<const T> O(static_cast<const T*>(a.o), q_rows, d, io);
  HbmMatrix<const T> dO(static_cast<const T*>(a.dout), q_rows, d, io);
  HbmMatrix<const float> L(a.lse, q_rows, 1, io);
  HbmMatrix<T> dQ(static_cast<T*>(a.dq), q_rows, d, io);
  HbmMatrix<T> dK(static_cast<T*>(a.dk), kv_rows, d, io);
  HbmMatrix<T> dV(static_cast<T*>(a.dv), kv_rows, d, io);
  unsigned char* ws = static_cast<unsigned char*>(a.workspace);
  HbmMatrix<float> Dm(reinterpret_cast<float*>(ws), q_rows, 1, io);
  // fp32: dQ itself is the accumulator; 16 bits: an fp32 array in the workspace.
  float* acc = kFp32 ? static_cast<float*>(a.dq) : reinterpret_cast<float*>(ws + dq_accum_offset(s));
  HbmMatrix<float> dQacc(acc, q_rows, d, io);
  const float scale = s.softmax_scale();

  // Preprocessing, once per query head: D = rowsum(dO ∘ O), and a zero accumulator for dQ.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h);
      const Block o = O.load_rows(q0, s.seq_q), dout = dO.load_rows(q0, s.seq_q);
      // TODO(lab): D = rowsum(dO ∘ O), one number per query row: multiply o and dout element by
      //   element (Eigen: .array()), sum each row (.rowwise().sum()), and store the seq_q × 1
      //   result with Dm.store(q0, 0, ...) instead of the zeros below.
      Dm.store(q0, 0, Block::Zero(s.seq_q, 1));  // wrong on purpose
      dQacc.store(q0, 0, Block::Zero(s.seq_q, d));
    }

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t hk = 0; hk < s.kv_heads; ++hk) {
      const int64_t k0 = (b * s.kv_heads + hk) * s.seq_k;
      for (int64_t j0 = 0; j0 < s.seq_k; j0 += kBc) {  // outer: K/V blocks
        const int64_t bc = std::min(kBc, s.seq_k - j0);
        const Block Kj = K.load_rows(k0 + j0, bc), Vj = V.load_rows(k0 + j0, bc);
        Block dKj = Block::Zero(bc, d), dVj = Block::Zero(bc, d);  // on chip until j is done
        for (int64_t h = hk * s.group(); h < (hk + 1) * s.group(); ++h) {  // the group's heads
          const int64_t q0 = s.q_row0(b, h);
          for_visible_q_blocks(s, j0, [&](int64_t i0, int64_t br) {  // inner: Q blocks
            const Block Qi = Q.load_rows(q0 + i0, br), dOi = dO.load_rows(q0 + i0, br);
            const Block Li = L.load_rows(q0 + i0, br), Di = Dm.load_rows(q0 + i0, br);
            // Recompute P = exp(S − L) for this tile; masked keys and rows that see nothing: 0.
            Block P = (Qi * Kj.transpose()) * scale;
            for (int64_t r = 0; r < br; ++r)
              for (int64_t c = 0; c < bc; ++c)
                P(r, c) = (j0 + c > s.last_key(i0 + r) || Li(r, 0) == kNegInf) ? 0.f : std::exp(P(r, c) - Li(r, 0));
            dVj += round_to<T>(P).transpose() * dOi;                      // dV = Pᵀ dO
            const Block dP = dOi * Vj.transpose();                        // dP = dO Vᵀ
            // TODO(lab): dS = P ∘ (dP − D): subtract row r's D_i (Di(r, 0)) from every entry of row r
            //   of dP (Eigen: dP.colwise() - Di.col(0)), multiply element by element by P, and round
            //   the result to T as the kernel does, with round_to<T>(...) (a no-op in fp32).
            const Block dS = Block::Zero(br, bc);  // wrong on purpose: no gradient reaches dQ or dK
            dKj += dS.transpose() * Qi;                                   // dK = scale · dSᵀ Q (scaled below)
            Block dQi = dQacc.load_rows(q0 + i0, br);                     // dQ: a round trip per block
            dQi += kFp32 ? Block(scale * (dS * Kj)) : Block(dS * Kj);     // 16 bits: scaled at the end
            dQacc.store(q0 + i0, 0, dQi);
          });
        }
        dK.store(k0 + j0, 0, Block(scale * dKj));
        dV.store(k0 + j0, 0, dVj);
      }
    }

  if constexpr (!kFp32)  // the last pass: dQ = scale · accumulator, rounded to the dtype once
    for (int64_t r0 = 0; r0 < q_rows; r0 += s.seq_q) dQ.store(r0, 0, Block(scale * dQacc.load_rows(r0, s.seq_q)));
}

}  // namespace

void twin_backward(const AttentionShape& s, DType t, const BackwardArgs& a, int64_t block_keys) {
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  switch (t) {
    case DType::F32: return twin<float>(s, a, io, block_keys);
    case DType::F16: return twin<Eigen::half>(s, a, io, block_keys);
    case DType::BF16: return twin<Eigen::bfloat16>(s, a, io, block_keys);
  }
}

// A twin for every version, under the version's name, with that version's block size: every
// kernel is checked against a twin of the same name.
static const struct RegisterTwins {
  RegisterTwins() {
    for (const VersionInfo& v : kVersions) Registry::instance().add(std::make_unique<BackwardRung<Backend::Cpu>>(v.version));
  }
} registered;


}  // namespace fl::backward
