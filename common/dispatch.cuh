// The step between a rung's launcher and its kernel templates that every tensor-core rung takes:
// pick the kernel instance for the call's 16-bit dtype and head dim (CUDA sources only).
//     dispatch_16bit<Launch, 64, 128>(who, t, s.head_dim, args...)
// calls Launch::run<T, D>(args...) with T = __half or __nv_bfloat16 and D the head dim, and refuses
// any other head dim with a message that starts with `who` (the rung's name).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "problem.hpp"

namespace fl {

template <class Launch, int... Dims, class... Args>
void dispatch_16bit(const std::string& who, DType t, int64_t head_dim, Args&&... args) {
  auto by_dim = [&](auto type) {
    using T = decltype(type);
    const bool found = ((head_dim == Dims ? (Launch::template run<T, Dims>(args...), true) : false) || ...);
    if (!found) {
      std::string dims;
      ((dims += (dims.empty() ? "" : ", ") + std::to_string(Dims)), ...);
      throw InputError(who + "head_dim " + std::to_string(head_dim) + " has no kernel; supported: " + dims);
    }
  };
  if (t == DType::F16) by_dim(__half{});
  else if (t == DType::BF16) by_dim(__nv_bfloat16{});
  else throw InputError(who + "dtype " + dtype_name(t) + " has no kernel; supported: fp16, bf16");
}

}  // namespace fl
