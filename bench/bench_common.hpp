// What the `ladder` program and the `ladder_bench` sweep share: picking rungs from a command-line
// list, strict number parsing, the short GPU name and the UTC date they print, the GPU check behind
// their device flags, and the host clock for a first call. The oracle (common/oracle.hpp) and the
// staging of a rung's data (common/harness.hpp, ForwardRun and BackwardRun) live in common/.
// Header-only, bench/ only (io_probe uses the number parsing too).
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device.hpp"
#include "harness.hpp"
#include "oracle.hpp"
#include "problem.hpp"
#include "reference.hpp"
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
        const std::string head = it.substr(0, 2);
        if (head == "10" || head == "11")  // their problems are not one AttentionShape: a mode of their own
          throw InputError("rung " + it + " does not run with --rungs: rung 10 (decoding) runs with --decode, "
                           "rung 11 (ring attention) with --ring P; ladder --help says what each takes");
        throw InputError("no rung matches '" + it + "'; give a full name or its number (00, 01, ...) " +
                         "from the rungs this build has (rung 10 runs with --decode, rung 11 with --ring P): " +
                         built);
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

// ---- Which devices --------------------------------------------------------------------------------
struct GpuChoice {
  bool present = false;  // a CUDA device can run the GPU rungs
  bool use = false;      // ... and the device flag lets them run
  std::string why;       // why there is none, when !present ("" when it was not asked)
};

// What a device flag (cpu | cuda | all, already checked to be one of them) leaves to run. The GPU is
// asked about only when the flag allows it or `ask_anyway` (a CUDA context costs a moment even when
// it is not used). `cuda_flag` is how the flag asking for the GPU is spelled in the message given
// when there is none ("--device cuda", "--fl_device=cuda").
inline GpuChoice choose_gpu(const std::string& device, const std::string& cuda_flag, bool ask_anyway = false) {
  GpuChoice g;
  if (device != "cpu" || ask_anyway) g.present = gpu::available(&g.why);
  g.use = g.present && device != "cpu";
  if (device == "cuda" && !g.present)
    throw InputError(cuda_flag + ": no GPU rung can run here: " + g.why + " (without " + cuda_flag +
                     " the CPU twins run)");
  return g;
}

// ---- Timing ----------------------------------------------------------------------------------------
inline double host_ms(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace fl::bench
