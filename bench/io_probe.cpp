// io_probe: runs one GPU rung's forward exactly once, so a profiler can measure the device-memory
// bytes that one forward moves and set them beside the rung's modelled traffic. bench/ncu_io.py
// drives it under Nsight Compute; by hand:
//
//   ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum
//       build-hopper/bench/io_probe --rung 05_fa2_loop_order --seq 4096 --heads 16 --head-dim 64
//
// It prints one JSON object with the rung's modelled bytes; the kernels it launches besides the
// rung's own are the harness's NaN poisoning (fill_u16), which the script leaves out.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench_common.hpp"
#include "device.hpp"
#include "harness.hpp"

static const char* kUsage =
    "usage: io_probe --rung NAME [--seq N] [--heads H] [--head-dim d] [--causal]\n"
    "runs one forward of a GPU rung once, for a profiler to measure\n";

int main(int argc, char** argv) {
  using namespace fl;
  std::string name;
  AttentionShape s;
  s.heads = s.kv_heads = 16;
  s.seq_q = s.seq_k = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "io_probe: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    // Whole-string parsing, as the ladder does: std::stoll read "12x" as 12 and threw on "abc"
    // outside any handler, which aborted the probe instead of saying what was wrong.
    auto integer = [&]() -> int64_t {
      const std::string v = next();
      int64_t x = 0;
      if (!bench::parse_int(v, &x)) {
        std::fprintf(stderr, "io_probe: %s expects an integer, got '%s'\n", a.c_str(), v.c_str());
        std::exit(2);
      }
      return x;
    };
    if (a == "--rung") name = next();
    else if (a == "--seq") s.seq_q = s.seq_k = integer();
    else if (a == "--heads") s.heads = s.kv_heads = integer();
    else if (a == "--head-dim") s.head_dim = integer();
    else if (a == "--causal") s.causal = true;
    else {
      if (a != "--help") std::fprintf(stderr, "io_probe: unknown flag '%s'\n", a.c_str());
      std::fprintf(stderr, "%s", kUsage);
      return a == "--help" ? 0 : 2;
    }
  }
  if (name.empty()) {
    std::fprintf(stderr, "io_probe: --rung is required\n%s", kUsage);
    return 2;
  }
  try {
    std::string why;
    if (!gpu::available(&why)) throw std::runtime_error("no GPU: " + why);
    const Rung* r = Registry::instance().find(name, Backend::Cuda);
    if (!r) throw InputError("no GPU rung named '" + name + "' in this build");
    const Inputs in = make_inputs(s, DType::F32, 1);
    ForwardRun run(*r, s, DType::F32, in);  // uploads and poisons outputs
    gpu::synchronize();
    run.run();
    gpu::synchronize();
    const IoModel m = r->modelled_io(s, DType::F32);
    std::printf("{\"rung\": \"%s\", \"shape\": \"%s\", \"seq\": %lld, \"heads\": %lld, \"head_dim\": %lld, "
                "\"causal\": %d, \"modelled_read\": %.0f, \"modelled_written\": %.0f}\n",
                name.c_str(), s.str().c_str(), (long long)s.seq_q, (long long)s.heads, (long long)s.head_dim,
                int(s.causal), m.read, m.written);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "io_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
