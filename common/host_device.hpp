// FL_HOST_DEVICE marks small math helpers that a CPU twin (g++) and a kernel (nvcc) both call,
// so the twin runs the very same arithmetic as the kernel.
#pragma once

#ifdef __CUDACC__
#define FL_HOST_DEVICE __host__ __device__
#else
#define FL_HOST_DEVICE
#endif
