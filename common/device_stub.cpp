// Built when there is no CUDA compiler: the project still runs every CPU twin, and anything that
// asks for the GPU gets a clear answer instead of a link error.
#include <stdexcept>

#include "device.hpp"

namespace fl::gpu {
namespace {
// Why there is no CUDA here, as CMake knew it: switched off (FLASH_LADDER_CUDA=OFF, the cpu
// preset's choice) or no CUDA compiler found; each has its own remedy.
#if FLASH_LADDER_CUDA_SWITCHED_OFF
constexpr const char* kWhy = "built without CUDA (configured with FLASH_LADDER_CUDA=OFF, as the cpu preset does)";
constexpr const char* kRemedy = "configure a build with CUDA (cmake --preset default) to get them";
#else
constexpr const char* kWhy = "built without CUDA (no nvcc at configure time)";
constexpr const char* kRemedy = "install the CUDA Toolkit (nvcc on PATH) and reconfigure";
#endif
[[noreturn]] void no_cuda(const char* what) {
  throw std::runtime_error(std::string(what) + ": this build has no GPU rungs (" + kWhy + "); " + kRemedy);
}
}  // namespace

bool built_with_cuda() { return false; }
bool available(std::string* why) {
  if (why) *why = kWhy;
  return false;
}
std::string device_name() { no_cuda("device_name"); }
int sm_count() { no_cuda("sm_count"); }
std::size_t free_memory() { no_cuda("free_memory"); }
std::size_t total_memory() { no_cuda("total_memory"); }
std::size_t allocation_count() { return 0; }
void synchronize() { no_cuda("synchronize"); }
void require_memory(std::size_t, const std::string& who) { no_cuda(who.c_str()); }
DeviceBuffer::DeviceBuffer(std::size_t) { no_cuda("DeviceBuffer"); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept = default;
void DeviceBuffer::upload(const void*, std::size_t) { no_cuda("upload"); }
void DeviceBuffer::download(void*, std::size_t) const { no_cuda("download"); }
void DeviceBuffer::poison() { no_cuda("poison"); }
double time_ms(const std::function<void()>&, int, int, const std::function<void()>&) {
  no_cuda("time_ms");
}
void flush_l2() { no_cuda("flush_l2"); }
}  // namespace fl::gpu
