#include "rung.hpp"

#include <algorithm>
#include <sstream>

namespace fl {

const char* backend_name(Backend b) { return b == Backend::Cpu ? "cpu" : "cuda"; }

std::string Rung::step() const {
  const std::string n = name();
  return n.substr(0, n.find('/'));
}

void Rung::backward(const AttentionShape&, DType, const BackwardArgs&) const {
  throw InputError("rung " + label() + " has no backward pass; rung 07_backward_recompute has one");
}

bool Rung::supports(const AttentionShape& s, DType t, std::string* why) const {
  try {
    check_supported(s, t);
    return true;
  } catch (const InputError& e) {
    if (why) *why = e.what();
    return false;
  }
}

void Rung::check_supported(const AttentionShape& s, DType t, bool for_backward) const {
  s.validate();
  if (const std::string why = unavailable(); !why.empty()) throw InputError("rung " + label() + " cannot run here: " + why);
  const Capabilities c = caps();
  auto refuse = [&](const std::string& what, const std::string& allowed) {
    throw InputError("rung " + label() + " does not run " + what + "; it supports " + allowed);
  };
  if (std::find(c.dtypes.begin(), c.dtypes.end(), t) == c.dtypes.end()) {
    std::string allowed;
    for (DType d : c.dtypes) allowed += std::string(allowed.empty() ? "" : ", ") + dtype_name(d);
    refuse(std::string("dtype ") + dtype_name(t), "dtype " + allowed);
  }
  if (c.head_dims.empty()) {
    if (s.head_dim > c.max_head_dim)
      refuse("head_dim " + std::to_string(s.head_dim),
             "head_dim 1.." + std::to_string(c.max_head_dim));
  } else if (std::find(c.head_dims.begin(), c.head_dims.end(), s.head_dim) == c.head_dims.end()) {
    std::string allowed;
    for (int d : c.head_dims) allowed += (allowed.empty() ? "" : ", ") + std::to_string(d);
    refuse("head_dim " + std::to_string(s.head_dim), "head_dim in {" + allowed + "}");
  }
  if (s.causal && !c.causal) refuse("causal masking", "non-causal attention only");
  if (s.kv_heads != s.heads && !c.gqa)
    refuse("grouped-query attention (H=" + std::to_string(s.heads) +
               ", Hkv=" + std::to_string(s.kv_heads) + ")",
           "H = Hkv only");
  if (for_backward && !c.backward) refuse("the backward pass", "the forward pass only");
}

namespace {
void need(const void* p, const char* what, const Rung& r) {
  if (!p) throw InputError("rung " + r.label() + ": pointer '" + what + "' is null");
}
}  // namespace

void Rung::check(const AttentionShape& s, DType t, const ForwardArgs& a) const {
  check_supported(s, t);
  need(a.q, "q", *this);
  need(a.k, "k", *this);
  need(a.v, "v", *this);
  need(a.o, "o", *this);
  need(a.lse, "lse", *this);
  if (workspace_bytes(s, t) > 0) need(a.workspace, "workspace", *this);
}

void Rung::check(const AttentionShape& s, DType t, const BackwardArgs& a) const {
  check_supported(s, t, true);
  for (auto [p, n] : {std::pair<const void*, const char*>{a.q, "q"}, {a.k, "k"}, {a.v, "v"},
                      {a.o, "o"}, {a.lse, "lse"}, {a.dout, "dout"}, {a.dq, "dq"}, {a.dk, "dk"},
                      {a.dv, "dv"}})
    need(p, n, *this);
  if (backward_workspace_bytes(s, t) > 0) need(a.workspace, "workspace", *this);
  if (a.deterministic && backend() == Backend::Cuda && !caps().deterministic_backward)
    throw InputError("rung " + label() + " has no deterministic backward (its dQ contributions are added in whatever "
                     "order the GPU runs them); these have one: " + Registry::instance().deterministic_backward_names());
}

std::string Registry::deterministic_backward_names() const {
  std::string out;
  for (const Rung* r : all())
    if (r->backend() == Backend::Cuda && r->caps().deterministic_backward) out += (out.empty() ? "" : ", ") + r->name();
  return out.empty() ? "none in this build" : out;
}

Registry& Registry::instance() {
  static Registry r;  // function-local: safe whatever order the rungs' static objects start in
  return r;
}

bool natural_less(std::string_view a, std::string_view b) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      // The numbers' values, without their leading zeros: the longer is the larger, else by digits.
      std::string_view x = a.substr(i, ie - i), y = b.substr(j, je - j);
      x.remove_prefix(std::min(x.find_first_not_of('0'), x.size()));
      y.remove_prefix(std::min(y.find_first_not_of('0'), y.size()));
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      if (ie - i != je - j) return ie - i < je - j;  // equal values: fewer written digits first
      i = ie, j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

void Registry::add(std::unique_ptr<Rung> r) {
  if (find(r->name(), r->backend()))
    throw std::logic_error("rung " + r->label() + " registered twice");
  rungs_.push_back(std::move(r));
  std::stable_sort(rungs_.begin(), rungs_.end(), [](const auto& a, const auto& b) {
    if (a->name() != b->name()) return natural_less(a->name(), b->name());
    return int(a->backend()) < int(b->backend());
  });
}

std::vector<const Rung*> Registry::all() const {
  std::vector<const Rung*> out;
  for (const auto& r : rungs_) out.push_back(r.get());
  return out;
}

const Rung* Registry::find(std::string_view name, Backend b) const {
  for (const auto& r : rungs_)
    if (r->name() == name && r->backend() == b) return r.get();
  return nullptr;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& r : rungs_)
    if (out.empty() || out.back() != r->name()) out.push_back(r->name());
  return out;
}

}  // namespace fl
