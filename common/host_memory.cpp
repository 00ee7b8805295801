#include "host_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "problem.hpp"

namespace fl {

std::size_t available_host_memory(std::string* source) {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    unsigned long long kib = 0;
    if (in >> kib) {
      if (source) *source = "MemAvailable in /proc/meminfo";
      return std::size_t(kib) * 1024;
    }
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    if (source) *source = "sysconf(_SC_AVPHYS_PAGES)";
    return std::size_t(pages) * std::size_t(page);
  }
  if (source) *source = "unknown";
  return 0;
}

namespace {
// What is kept back for everything else: an eighth of what is available, at most 1 GiB.
double margin(double available) { return std::min(available / 8, double(std::size_t(1) << 30)); }
}  // namespace

std::string host_memory_figures(double bytes) {
  std::string source;
  const double available = double(available_host_memory(&source));
  std::ostringstream s;
  s << "needs " << describe_bytes(bytes) << " of host memory, but this machine has "
    << (available > 0 ? describe_bytes(available) : std::string("an unknown amount")) << " available ("
    << source << ")";
  return s.str();
}

void require_host_memory(double bytes, const std::string& who, const std::string& advice) {
  const double available = double(available_host_memory());
  if (available <= 0) return;  // cannot tell: let the allocation say
  if (bytes + margin(available) > available)
    throw HostOutOfMemory(who + " " + host_memory_figures(bytes) + "; nothing was allocated" +
                          (advice.empty() ? "" : "; " + advice));
}

}  // namespace fl
