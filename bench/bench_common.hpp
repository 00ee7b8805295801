// What the `ladder` program and the `ladder_bench` sweep share: picking rungs from a command-line
// list, strict number parsing, the short GPU name and the UTC date they print. Header-only, bench/
// only (io_probe uses the number parsing too).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "problem.hpp"
#include "rung.hpp"

namespace fl::bench {

inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// An item of --rungs names a rung by its whole name ("06_tensor_core_mma/v3_pipeline") or by a
// leading part that ends where the name has '_' or '/' ("06", "06_tensor_core_mma"), so "0"
// matches nothing rather than every rung from 00 to 09.
inline bool rung_matches(const std::string& name, const std::string& item) {
  if (item.empty() || name.compare(0, item.size(), item) != 0) return false;
  return name.size() == item.size() || name[item.size()] == '_' || name[item.size()] == '/';
}

// The registered rungs named by `list` ("all" or a comma list), in registry order, on the given
// backends. Throws InputError naming the item that matched nothing and what is built.
inline std::vector<const Rung*> select_rungs(const std::string& list, bool cpu, bool cuda) {
  const auto all = Registry::instance().all();
  std::vector<std::string> items = split_commas(list);
  const bool everything = list == "all";
  std::vector<const Rung*> out;
  for (const Rung* r : all) {
    if ((r->backend() == Backend::Cpu && !cpu) || (r->backend() == Backend::Cuda && !cuda)) continue;
    bool wanted = everything;
    for (const auto& it : items) wanted = wanted || rung_matches(r->name(), it);
    if (wanted) out.push_back(r);
  }
  if (!everything)
    for (const auto& it : items) {
      bool found = false;
      for (const Rung* r : all) found = found || rung_matches(r->name(), it);
      if (!found) {
        std::string built;
        for (const auto& n : Registry::instance().names()) built += (built.empty() ? "" : ", ") + n;
        throw InputError("no rung matches '" + it + "'; give a full name or its number (00, 01, ...) " +
                         "from the rungs this build has: " + built);
      }
    }
  return out;
}

// Whole-string integer parsing: "12x", "", "1e3" are refused, not read as 12, 0, 1.
inline bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

inline bool parse_uint64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

// "NVIDIA H100 80GB HBM3" -> "H100 80GB": short enough for a table column, enough to tell GPUs apart.
inline std::string short_gpu_name(std::string name) {
  for (const char* prefix : {"NVIDIA ", "GeForce "})
    if (name.rfind(prefix, 0) == 0) name.erase(0, std::string(prefix).size());
  int words = 0;
  for (std::size_t i = 0; i < name.size(); ++i)
    if (name[i] == ' ' && ++words == 2) return name.substr(0, i);
  return name;
}

// "2025-06-01": the day in UTC, for results that say when they were measured.
inline std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

}  // namespace fl::bench
