// A contiguous KV cache copied into the paged layout (decoding.hpp): what the tests and the ladder
// use to give a kernel the same keys both ways.
#include <algorithm>
#include <numeric>
#include <random>

#include "decoding.hpp"

namespace fl::decoding {

PagedCopy to_paged(const DecodeShape& s, const std::vector<float>& k, const std::vector<float>& v, int64_t page_size,
                   uint64_t seed, int64_t spare, float fill) {
  if (s.paged() || page_size <= 0 || page_size % 16 != 0 || spare < 0)
    throw InputError("rung 10_decoding: to_paged takes a contiguous cache, a page size that is a positive multiple "
                     "of 16 and spare >= 0");
  const int64_t d = s.head_dim;
  if (int64_t(k.size()) != s.batch * s.kv_heads * s.capacity * d || v.size() != k.size())
    throw InputError("rung 10_decoding: to_paged: k and v must hold [B, Hkv, capacity, d] values");
  PagedCopy p;
  p.shape = s;
  p.shape.page_size = page_size;
  p.shape.pages_per_seq = (s.capacity + page_size - 1) / page_size;
  p.shape.capacity = p.shape.pages_per_seq * page_size;
  p.shape.num_pages = s.batch * p.shape.pages_per_seq + spare;
  std::vector<int32_t> ids(std::size_t(p.shape.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  p.table.assign(ids.begin(), ids.begin() + s.batch * p.shape.pages_per_seq);
  p.k.assign(std::size_t(p.shape.num_pages * s.kv_heads * page_size * d), fill);
  p.v = p.k;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.kv_heads; ++h)
      for (int64_t j = 0; j < s.capacity; ++j) {
        const int64_t page = p.table[std::size_t(b * p.shape.pages_per_seq + j / page_size)];
        const auto to = std::ptrdiff_t(((page * s.kv_heads + h) * page_size + j % page_size) * d);
        const auto from = std::ptrdiff_t(((b * s.kv_heads + h) * s.capacity + j) * d);
        std::copy_n(k.begin() + from, d, p.k.begin() + to);
        std::copy_n(v.begin() + from, d, p.v.begin() + to);
      }
  return p;
}

}  // namespace fl::decoding
