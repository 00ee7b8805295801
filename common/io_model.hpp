// What the IO model counts: bytes between device memory (HBM) and on-chip memory. Kept free of
// Eigen so CUDA sources can include rung.hpp cheaply; io_counter.hpp has the counting side.
#pragma once

#include <cstdint>

namespace fl {

// Bytes a CPU twin actually moved, counted by HbmMatrix.
struct IoCounter {
  uint64_t read = 0;     // bytes loaded from device memory
  uint64_t written = 0;  // bytes stored to device memory
  uint64_t total() const { return read + written; }
};

// Bytes a rung's algorithm moves between device memory and on-chip memory, by closed form.
struct IoModel {
  double read = 0;
  double written = 0;
  double total() const { return read + written; }
};

}  // namespace fl
