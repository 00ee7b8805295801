// Rung 06, numerics twin: rung 05's loop order in the kernel's precision, every block counted.
#include "tensor_core_mma.hpp"

#include <Eigen/Core>
#include <limits>

#include "twin.hpp"
#include "twin_step.hpp"

namespace fl::tensor_core_mma {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class T>  // Eigen::half or Eigen::bfloat16: the storage type of Q, K, V and O
void twin(const AttentionShape& s, const ForwardArgs& a, IoCounter& io, Tiling tile) {
  const int64_t block_rows = tile.rows, kBc = tile.keys;
  const int64_t d = s.head_dim, q_rows = s.batch * s.heads * s.seq_q, kv_rows = s.batch * s.kv_heads * s.seq_k;
  HbmMatrix<const T> Q(static_cast<const T*>(a.q), q_rows, d, io);
  HbmMatrix<const T> K(static_cast<const T*>(a.k), kv_rows, d, io);
  HbmMatrix<const T> V(static_cast<const T*>(a.v), kv_rows, d, io);
  HbmMatrix<T> O(static_cast<T*>(a.o), q_rows, d, io);
  HbmMatrix<float> LSE(a.lse, q_rows, 1, io);
  const float scale = s.softmax_scale();

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t q0 = s.q_row0(b, h), k0 = s.kv_row0(b, h);
      for (int64_t b0 = tile.first_row(s.seq_q); b0 < s.seq_q; b0 += block_rows) {
        const int64_t i0 = std::max<int64_t>(b0, 0), br = std::min(b0 + block_rows, s.seq_q) - i0;
        const Block Qi = Q.load_rows(q0 + i0, br);  // 16-bit values, exact in fp32
        Block acc = Block::Zero(br, d);
        std::vector<online_softmax::RowState> st(br);
        const int64_t end = fa2::visible_key_end(s, i0, br);
        for (int64_t j0 = 0; j0 < end; j0 += kBc) {
          const int64_t bc = std::min(kBc, s.seq_k - j0);
          const Block Kj = K.load_rows(k0 + j0, bc), Vj = V.load_rows(k0 + j0, bc);
          Block S = (Qi * Kj.transpose()) * scale;  // fp32 accumulation, like the tensor cores'
          for (int64_t r = 0; r < br; ++r) {
            for (int64_t c = 0; c < bc; ++c)
              if (j0 + c > s.last_key(i0 + r)) S(r, c) = kNegInf;
            twin_row_step<T>(S, r, Vj, acc, st[r]);  // P rounded to T before P·V
          }
        }
        const Block lse = twin_finish(acc, st);
        O.store(q0 + i0, 0, acc);  // rounded to T on the way out
        LSE.store(q0 + i0, 0, lse);
      }
    }
}

}  // namespace

Capabilities capabilities() {
  Capabilities c;
  c.dtypes = {DType::F16, DType::BF16};
  c.head_dims = {64, 128};
  return c;
}

IoModel io_model(const AttentionShape& s, DType t, Tiling tile) {
  const int64_t block_rows = tile.rows, kBc = tile.keys;
  const double d = double(s.head_dim), e = double(dtype_bytes(t));
  double read = double(s.seq_q) * d * e, written = double(s.seq_q) * (d * e + 4);  // Q; O, lse
  for (int64_t b0 = tile.first_row(s.seq_q); b0 < s.seq_q; b0 += block_rows) {
    const int64_t i0 = std::max<int64_t>(b0, 0);
    const int64_t end = fa2::visible_key_end(s, i0, std::min(b0 + block_rows, s.seq_q) - i0);
    for (int64_t j0 = 0; j0 < end; j0 += kBc) read += 2.0 * double(std::min(kBc, s.seq_k - j0)) * d * e;
  }
  const double bh = double(s.batch * s.heads);
  return {bh * read, bh * written};
}

void twin_forward(const AttentionShape& s, DType t, const ForwardArgs& a, Tiling tile) {
  IoCounter scratch;
  IoCounter& io = a.io ? *a.io : scratch;
  if (t == DType::F16) twin<Eigen::half>(s, a, io, tile);
  else twin<Eigen::bfloat16>(s, a, io, tile);
}

void gpu_forward(Version v, const AttentionShape& s, DType t, const ForwardArgs& a) {
  const Rung* r = Registry::instance().find(info(v).name, Backend::Cuda);
  if (!r) throw InputError(std::string("rung ") + info(v).name + " (cuda) is not in this build (built without CUDA)");
  r->forward(s, t, a);
}

// One twin per version (they differ only in the rows and keys per block, which the IO count
// follows), so every version's GPU rung is checked against a twin of the same name.
static const struct RegisterTwins {
  RegisterTwins() {
    for (const VersionInfo& v : kVersions) Registry::instance().add(std::make_unique<TensorCoreRung<Backend::Cpu>>(v.version));
  }
} registered;

}  // namespace fl::tensor_core_mma
