#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "cuda_check.cuh"
#include "device.hpp"
#include "problem.hpp"

namespace fl::gpu {

bool built_with_cuda() { return true; }

namespace {
// Why cudaGetDeviceCount found nothing, in the words a student can act on. With no NVIDIA driver
// installed at all the runtime reports cudaErrorInsufficientDriver ("CUDA driver version is
// insufficient for CUDA runtime version"), which reads as "update your driver" on a machine that
// has neither driver nor GPU; cudaDriverGetVersion tells the two apart (0: no driver).
std::string no_device_reason(cudaError_t e) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const std::string code = std::string(" (") + cudaGetErrorName(e) + ")";
  if (e == cudaSuccess) return "no NVIDIA driver or GPU was found: the driver is installed but sees no GPU";
  if (e == cudaErrorNoDevice)
    return "no NVIDIA driver or GPU was found: the driver is installed but sees no GPU" + code;
  if (e == cudaErrorInsufficientDriver && driver == 0)
    return "no NVIDIA driver or GPU was found: no NVIDIA driver is installed" + code;
  if (e == cudaErrorInsufficientDriver)
    return "the NVIDIA driver supports CUDA " + version(driver) + ", older than this build's CUDA runtime " +
           version(runtime) + "; update the driver" + code;
  return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")" + code;
}
}  // namespace

bool available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = no_device_reason(e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  cudaDeviceProp p{};
  FL_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  if (p.major < 8) {
    if (why) *why = std::string(p.name) + " is compute capability " + std::to_string(p.major) + "." +
                    std::to_string(p.minor) + "; the GPU rungs are built for 8.0 and newer";
    return false;
  }
  return true;
}

std::string device_name() {
  cudaDeviceProp p{};
  FL_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  return p.name;
}

int sm_count() {
  int device = 0, n = 0;
  FL_CUDA_CHECK(cudaGetDevice(&device));
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

std::size_t free_memory() {
  size_t f = 0, t = 0;
  FL_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return f;
}

std::size_t total_memory() {
  size_t f = 0, t = 0;
  FL_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return t;
}

void synchronize() { FL_CUDA_CHECK(cudaDeviceSynchronize()); }

void require_memory(std::size_t bytes, const std::string& who) {
  const std::size_t free = free_memory();
  // Keep a little back for the CUDA context and library workspaces.
  const std::size_t margin = std::size_t(256) << 20;
  if (bytes + margin > free)
    throw OutOfMemory(who + " needs " + describe_bytes(double(bytes)) + " of device memory, but " +
                      device_name() + " has " + describe_bytes(double(free)) + " free (of " +
                      describe_bytes(double(total_memory())) + "); nothing was allocated");
}

namespace {
std::atomic<std::size_t> g_allocations{0};
}  // namespace

std::size_t allocation_count() { return g_allocations.load(); }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes) {
    ++g_allocations;
    FL_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  return *this;
}
void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  FL_CUDA_CHECK(cudaMemcpy(ptr_, host, std::min(bytes, bytes_), cudaMemcpyHostToDevice));
}
void DeviceBuffer::download(void* host, std::size_t bytes) const {
  FL_CUDA_CHECK(cudaMemcpy(host, ptr_, std::min(bytes, bytes_), cudaMemcpyDeviceToHost));
}

namespace {
__global__ void fill_u16(uint16_t* p, std::size_t n, uint16_t value) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = value;
}
}  // namespace

void DeviceBuffer::poison() {
  if (!ptr_) return;
  const std::size_t n = bytes_ / 2;
  fill_u16<<<1024, 256>>>(static_cast<uint16_t*>(ptr_), n, 0x7fc0);
  FL_CUDA_CHECK_LAUNCH();
}

double time_ms(const std::function<void()>& fn, int warmup, int reps,
               const std::function<void()>& before) {
  for (int i = 0; i < warmup; ++i) {
    if (before) before();
    fn();
  }
  FL_CUDA_CHECK(cudaDeviceSynchronize());
  // Owned events: a failing call below throws, and the events must not leak with it.
  struct Event {
    cudaEvent_t e = nullptr;
    Event() { FL_CUDA_CHECK(cudaEventCreate(&e)); }
    ~Event() { cudaEventDestroy(e); }
  } start_event, stop_event;
  const cudaEvent_t start = start_event.e, stop = stop_event.e;
  std::vector<float> ms;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    if (before) before();
    FL_CUDA_CHECK(cudaEventRecord(start));
    fn();
    FL_CUDA_CHECK(cudaEventRecord(stop));
    FL_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    FL_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

namespace {
// Reads n 16-byte words. The buffer holds 0x5a bytes, so the store never happens, but the compiler
// cannot know that and must keep every load.
__global__ void read_all(const uint4* __restrict__ p, std::size_t n, unsigned* sink) {
  unsigned x = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const uint4 a = p[i];
    x |= a.x | a.y | a.z | a.w;
  }
  if (x == 0xffffffffu) *sink = x;
}

// Keeps one warp busy for `cycles` clocks.
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
}  // namespace

// Evicts L2 by reading a buffer twice its size. Reading, not writing: a memset leaves L2 full of
// modified lines, and the timed call that follows pays for writing them back to HBM (about 10 us
// on an H100: tens of per cent of a short decoding call). Unmodified lines are simply dropped.
// Then a spin of about 0.2 ms keeps the GPU busy while the host queues the timed call, so that
// the events around it time the GPU's work, not the host's.
void flush_l2() {
  static DeviceBuffer scratch, sink;
  static bool filled = false;  // set only once the memset has succeeded
  if (!filled) {
    int l2 = 0;
    FL_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    if (!scratch.get()) scratch = DeviceBuffer(std::size_t(std::max(l2, 1 << 20)) * 2);
    if (!sink.get()) sink = DeviceBuffer(16);
    FL_CUDA_CHECK(cudaMemset(scratch.get(), 0x5a, scratch.size()));  // once; the reads below clean L2
    filled = true;
  }
  read_all<<<unsigned(sm_count() * 4), 256>>>(static_cast<const uint4*>(scratch.get()), scratch.size() / 16,
                                              static_cast<unsigned*>(sink.get()));
  FL_CUDA_CHECK_LAUNCH();
  spin<<<1, 32>>>(400000);
  FL_CUDA_CHECK_LAUNCH();
}

}  // namespace fl::gpu
