// Host memory: how much there is to use, and refusing work that would not fit before anything is
// allocated (the host-side twin of gpu::require_memory). A problem of 10^7 tokens asks for tens of
// GiB of Q, K and V alone; saying so at once beats a minute of swapping and a std::bad_alloc.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace fl {

// Bytes that can be allocated without swapping: MemAvailable from /proc/meminfo (the kernel's own
// estimate, page cache it can drop included), else sysconf's available physical pages. 0 when
// neither can be read. `source`, when given, is told which of the two it was.
std::size_t available_host_memory(std::string* source = nullptr);

// Thrown when work would need more host memory than is available; said before allocating.
struct HostOutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws HostOutOfMemory naming `who`, the bytes needed and the bytes available, when `bytes` (a
// double, so that a product of sizes past 2^64 is still a number) do not fit. Keeps back an eighth
// of what is available, at most 1 GiB, for everything else this process and the system hold.
// `advice`, when given, ends the message ("a smaller --seq fits").
void require_host_memory(double bytes, const std::string& who, const std::string& advice = "");

// "needs 35.76 GiB of host memory, but this machine has 21.3 GiB available (MemAvailable in
// /proc/meminfo)": the figures that messages about host memory give.
std::string host_memory_figures(double bytes);

}  // namespace fl
