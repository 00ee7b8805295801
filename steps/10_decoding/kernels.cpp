// Rung 10's kernels as the rest of the project sees them, from plain C++: the registry the
// version files (v1_split_kv.cu, v2_paged.cu) add themselves to, and the checks every call passes
// before a launch (`decode`). Compiled with or without CUDA: without it the registry stays empty.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "decoding.hpp"

namespace fl::decoding {

namespace {
InputError bad(const std::string& what) { return InputError("rung 10_decoding: " + what); }
}  // namespace

namespace {
std::vector<Kernel>& registry() {
  static std::vector<Kernel> all;
  return all;
}
}  // namespace

void register_kernel(const Kernel& k) {
  auto& all = registry();
  all.push_back(k);
  std::sort(all.begin(), all.end(), [](const Kernel& x, const Kernel& y) { return x.name < y.name; });
}

const std::vector<Kernel>& kernels() { return registry(); }

const Kernel& find_kernel(const std::string& name) {
  std::string names;
  for (const Kernel& k : registry()) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : ", ") + k.name;
  }
  throw bad("no kernel named '" + name + "' in this build; there are: " + (names.empty() ? "none (built without CUDA)" : names));
}

void decode(const Kernel& k, const DecodeShape& s, DType t, const DecodeArgs& a, std::size_t ws_bytes) {
  s.validate();
  const std::string who = k.name + ": ";
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw InputError("rung " + who + what);
  };
  need(t == DType::F16 || t == DType::BF16, std::string("dtype ") + dtype_name(t) + " has no kernel; fp16 and bf16 do");
  need(s.head_dim == 64 || s.head_dim == 128, "head_dim " + std::to_string(s.head_dim) + " has no kernel; 64 and 128 do");
  need(!s.paged() || k.paged, "has no paged path (page_size " + std::to_string(s.page_size) +
                                  "): a later version reads through a page table");
  need(a.q && a.k && a.v && a.o && a.lse && a.kv_len, "q, k, v, o, lse and kv_len must not be null");
  need(!s.paged() || a.page_table, "a paged cache (page_size > 0) needs a page table");
  for (auto [p, what] : {std::pair<const void*, const char*>{a.q, "q"}, {a.k, "k"}, {a.v, "v"}, {a.o, "o"},
                         {a.workspace, "workspace"}})
    need(reinterpret_cast<std::uintptr_t>(p) % 16 == 0,
         std::string(what) + " must be 16-byte aligned (the kernel moves 16 bytes at a time)");
  for (auto [p, what] : {std::pair<const void*, const char*>{a.lse, "lse"}, {a.kv_len, "kv_len"},
                         {a.page_table, "page_table"}})
    need(reinterpret_cast<std::uintptr_t>(p) % 4 == 0, std::string(what) + " must be 4-byte aligned");
  need(s.page_size <= (1 << 30) && s.pages_per_seq <= (1 << 30) && s.capacity <= (int64_t(1) << 31),
       "page_size and pages_per_seq must be below 2^30 and capacity at most 2^31 (kv_len is int32)");
  need(s.batch <= 65535 && s.kv_heads * ((s.rows() + 15) / 16) <= 65535,
       "batch and kv_heads × ⌈rows / 16⌉ must each be at most 65535 (the grid's z and y)");
  need(a.splits >= 0 && a.splits <= kMaxSplits,
       "splits must be 0 (choose) or 1.." + std::to_string(kMaxSplits) + ", not " + std::to_string(a.splits));
  DecodeArgs run = a;
  if (run.splits == 0) run.splits = choose_splits(s, s.capacity, a.sm_count);
  const std::size_t ws = workspace_bytes(s, run.splits);
  need(ws == 0 || (a.workspace && ws_bytes >= ws),
       "splits = " + std::to_string(run.splits) + " needs a workspace of " + std::to_string(ws) + " bytes (got " +
           std::to_string(a.workspace ? ws_bytes : 0) + "; workspace_bytes)");
  k.launch(s, t, run);
}

#if !FLASH_LADDER_HAS_CUDA
void stream_read(const void*, std::size_t, float*, void*) {
  throw std::runtime_error("stream_read: this build has no CUDA");
}
#endif

}  // namespace fl::decoding
