// The GPU as the rest of the project sees it, from plain C++: device buffers, timing, memory
// checks. Implemented in device.cu with CUDA and in device_stub.cpp without it, where
// available() says why there is no GPU and everything else throws.
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>

namespace fl::gpu {

bool built_with_cuda();
// True when a CUDA device can run our kernels; otherwise `why` says what is missing.
bool available(std::string* why = nullptr);
std::string device_name();  // "NVIDIA H100 80GB HBM3"
int sm_count();             // the current device's streaming multiprocessors (132 on an H100 SXM)
std::size_t free_memory();
std::size_t total_memory();
// How many device allocations this process has made through DeviceBuffer so far: what a test
// checks to show that a refusal came before any allocation (free_memory() also moves with other
// processes' work, and an allocation freed again would not show in it).
std::size_t allocation_count();
void synchronize();

// Thrown when a rung would need more device memory than is free; said before allocating.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws OutOfMemory naming `who`, the bytes needed and the bytes free, if `bytes` do not fit.
void require_memory(std::size_t bytes, const std::string& who);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;
  void poison();  // every 16-bit word 0x7fc0: a NaN in fp32, fp16 and bf16 alike

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Median time in milliseconds of `fn` (which launches work on the default stream), measured with
// CUDA events after `warmup` untimed calls. `before` runs outside the timed region before every
// call (poisoning outputs, flushing L2).
double time_ms(const std::function<void()>& fn, int warmup, int reps,
               const std::function<void()>& before = {});

// Evicts L2 by writing a buffer twice its size, so the next kernel reads inputs from DRAM.
void flush_l2();

}  // namespace fl::gpu
