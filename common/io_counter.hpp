// The IO model made executable: a CPU twin keeps its "device memory" (HBM) arrays behind HbmMatrix,
// so every byte it moves between slow memory and its "on-chip" Eigen blocks is counted. Tests pin
// the counts to each rung's closed form (docs/io_model.md derives them).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "io_model.hpp"

namespace fl {

// The on-chip side of a twin: fp32 Eigen blocks, row-major like the device arrays.
using Block = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A row-major [rows, cols] matrix in the twin's device memory, stored as T (float, Eigen::half,
// Eigen::bfloat16) and seen on chip as float. No raw access: every load and store is counted.
template <class T>
class HbmMatrix {
 public:
  HbmMatrix(T* data, int64_t rows, int64_t cols, IoCounter& io)
      : data_(data), rows_(rows), cols_(cols), io_(&io) {}

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

  // Rows [r0, r0+nr) × columns [c0, c0+nc), copied on chip.
  Block load(int64_t r0, int64_t nr, int64_t c0, int64_t nc) const {
    bounds(r0, nr, c0, nc);
    Block b(nr, nc);
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t c = 0; c < nc; ++c) b(r, c) = float(data_[(r0 + r) * cols_ + c0 + c]);
    io_->read += uint64_t(nr * nc) * sizeof(T);
    return b;
  }
  Block load_rows(int64_t r0, int64_t nr) const { return load(r0, nr, 0, cols_); }
  float load(int64_t r, int64_t c) const { return load(r, 1, c, 1)(0, 0); }

  // Writes an on-chip block back at (r0, c0), rounding to T where T is narrower than float.
  template <class Derived>
  void store(int64_t r0, int64_t c0, const Eigen::MatrixBase<Derived>& expr) {
    // Evaluated once: indexing a product expression (O.store(r, 0, p * v)) element by element
    // would redo the whole product for every element. A plain Block is not copied.
    const auto& b = expr.eval();
    bounds(r0, b.rows(), c0, b.cols());
    for (int64_t r = 0; r < b.rows(); ++r)
      for (int64_t c = 0; c < b.cols(); ++c) data_[(r0 + r) * cols_ + c0 + c] = T(float(b(r, c)));
    io_->written += uint64_t(b.rows() * b.cols()) * sizeof(T);
  }
  void store(int64_t r, int64_t c, float v) {
    bounds(r, 1, c, 1);
    data_[r * cols_ + c] = T(v);
    io_->written += sizeof(T);
  }

 private:
  void bounds(int64_t r0, int64_t nr, int64_t c0, int64_t nc) const {
    if (r0 < 0 || c0 < 0 || nr < 0 || nc < 0 || r0 + nr > rows_ || c0 + nc > cols_)
      out_of_range(r0, nr, c0, nc);
  }
  // Out of line and [[noreturn]], so the compiler sees that no access follows a failed check.
  [[noreturn]] __attribute__((noinline)) void out_of_range(int64_t r0, int64_t nr, int64_t c0,
                                                             int64_t nc) const {
    throw std::out_of_range("HbmMatrix: block [" + std::to_string(r0) + "+" + std::to_string(nr) +
                            ", " + std::to_string(c0) + "+" + std::to_string(nc) + ") outside [" +
                            std::to_string(rows_) + ", " + std::to_string(cols_) + "]");
  }
  T* data_;
  int64_t rows_, cols_;
  IoCounter* io_;
};

}  // namespace fl
