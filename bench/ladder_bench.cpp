// ladder_bench: the forward pass of every rung over a sweep of shapes, timed with Google Benchmark,
// written as JSON that bench/plot.py turns into the figures in docs/; for the rungs with a backward
// pass (Capabilities::backward) also the backward alone and a forward followed by a backward.
//
//   build/bench/ladder_bench --benchmark_out=results.json --benchmark_out_format=json
//   python3 bench/plot.py results.json                      # -> docs/figures/*.png
//
// Honest numbers, as shared/design.md asks: every (rung, shape) is checked against the fp64 oracle
// before it is timed (a rung that fails is reported as an error, never as a time); GPU runs are
// timed with CUDA events around the kernels alone, with L2 flushed before each call outside the
// timed region, after untimed warm-up calls; each benchmark is repeated and the median kept.
// Exit status 1 when a benchmark failed its check or threw (running out of memory is not a failure).
//
// Backward benchmarks: "bwd" times the backward alone on the O and lse of one forward of the rung
// (the rung's own, as in training), "fwd+bwd" a forward followed by a backward, each with a random
// dO. Their gradients are checked against the fp64 oracle's backward first, on the problem itself
// up to B·H·Nq·Nk·d = 2^26 and past that on one group of heads with shorter sequences
// (backward_check_shape: the oracle holds N×N matrices), with the same seed.
//
// Flags of its own, given with Google Benchmark's (--benchmark_*):
//   --fl_device=cpu|cuda|all   which backends (default all: CPU twins, and GPU rungs if usable)
//   --fl_rungs=LIST            all, or rung names / numbers: 00,05 or 06_tensor_core_mma
//   --fl_max_seq=N             leave out shapes with N above this (default 16384)
//   --fl_quick                 only N <= 1024, for a CI smoke run
//   --fl_reps=R                repetitions of each benchmark, median reported (default 3;
//                              --benchmark_repetitions overrides it)
//   --fl_no_backward           only the forward benchmarks
//
// Benchmark names are "<fwd|bwd|fwdbwd>/<rung>/<cpu|cuda>/<dtype>/B<b>_H<h>_N<n>_d<d>_c<0|1>"
// (Google Benchmark appends /min_time:.../repeats:.../manual_time), for people. bench/plot.py reads
// measurements from counters (TFLOP/s, GB/s, modelled_bytes, extra_bytes, rel_err, N, d, causal, B,
// H) and what was run from the label "rung=<name> device=<cpu|cuda> dtype=<dtype> phase=<fwd|bwd|
// fwd+bwd> B=.. H=.. N=.. d=.. causal=..", which a benchmark that reports an error (out of memory,
// failed check) keeps; never from the name. TFLOP/s counts the FLOPs of shared/anchors.md: the
// forward's, 2.5× them for bwd, 3.5× for fwd+bwd. extra_bytes is the rung's workspace: the
// forward's (fwd), the backward's (bwd), both (fwd+bwd). modelled_bytes and GB/s are the rung's
// closed-form traffic (Rung::modelled_io, and modelled_backward_io where the rung gives one; left
// out where it does not). rel_err is O's (fwd) or the largest of
// dQ's, dK's and dV's (bwd, fwd+bwd; each also in rel_err_dq, rel_err_dk, rel_err_dv).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "device.hpp"
#include "harness.hpp"
#include "reference.hpp"

namespace fl {
namespace {

// ---- Configuration -------------------------------------------------------------------------------
struct Config {
  std::string device = "all";
  std::string rungs = "all";
  int64_t max_seq = 16384;
  bool quick = false;
  int64_t reps = 3;
  bool backward = true;        // bwd and fwd+bwd benchmarks for rungs with a backward pass
  bool user_min_time = false;  // --benchmark_min_time given: do not override it per benchmark
  bool user_reps = false;      // --benchmark_repetitions given: likewise
};

// Long enough per repetition for a stable mean of microsecond kernels; a call slower than this is
// timed once per repetition, which is what keeps multi-second naive kernels at large N affordable.
constexpr double kMinTimeSeconds = 0.1;
// A call slower than this gets one warm-up call instead of several.
constexpr double kSlowCallMs = 200;
constexpr int kWarmupCalls = 3;
// Rows of each head checked against the oracle: first, last, block edges and a spread between.
constexpr int64_t kVerifyRows = 64;
constexpr uint64_t kSeed = 1234;
constexpr int64_t kQuickMaxSeq = 1024;

const char* kUsage = R"(ladder_bench flags (Google Benchmark's own --benchmark_* flags follow):
  --fl_device=cpu|cuda|all   backends to run (default all: CPU twins, and GPU rungs if usable)
  --fl_rungs=LIST            all, or a comma list of rung names or numbers (default all)
  --fl_max_seq=N             leave out shapes with N above this (default 16384)
  --fl_quick                 only N <= 1024 (a CI smoke run)
  --fl_reps=R                repetitions per benchmark, median reported (default 3)
  --fl_no_backward           leave out the backward (bwd) and forward+backward (fwdbwd) benchmarks
                             of the rungs that have a backward pass
example: ladder_bench --fl_rungs=04,05 --benchmark_out=r.json --benchmark_out_format=json

)";

// Takes our flags out of argv (Google Benchmark refuses flags it does not know) and notes the
// Google Benchmark flags that per-benchmark settings would otherwise silently override.
Config parse_flags(int* argc, char** argv) {
  Config c;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    auto integer = [&](int64_t min) {
      int64_t x = 0;
      if (!bench::parse_int(value, &x) || x < min)
        throw InputError(flag + " expects an integer >= " + std::to_string(min) + ", got '" + value + "'");
      return x;
    };
    if (flag == "--fl_device") {
      if (value != "cpu" && value != "cuda" && value != "all")
        throw InputError("--fl_device: unknown device '" + value + "'; allowed are cpu, cuda, all");
      c.device = value;
    } else if (flag == "--fl_rungs") {
      c.rungs = value;
    } else if (flag == "--fl_max_seq") {
      c.max_seq = integer(1);
    } else if (flag == "--fl_quick") {
      if (eq != std::string::npos) throw InputError("--fl_quick takes no value");
      c.quick = true;
    } else if (flag == "--fl_reps") {
      c.reps = integer(1);
    } else if (flag == "--fl_no_backward") {
      if (eq != std::string::npos) throw InputError("--fl_no_backward takes no value");
      c.backward = false;
    } else if (flag.rfind("--fl_", 0) == 0) {
      throw InputError("unknown flag '" + flag +
                       "'; ours are --fl_device --fl_rungs --fl_max_seq --fl_quick --fl_reps --fl_no_backward");
    } else {
      if (flag == "--benchmark_min_time") c.user_min_time = true;
      if (flag == "--benchmark_repetitions") c.user_reps = true;
      if (flag == "--help") std::cout << kUsage;
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  return c;
}

AttentionShape make_shape(int64_t b, int64_t h, int64_t n, int64_t d, bool causal) {
  AttentionShape s;
  s.batch = b;
  s.heads = h;
  s.kv_heads = h;
  s.seq_q = s.seq_k = n;
  s.head_dim = d;
  s.causal = causal;
  return s;
}

// The GPU sweep: N from where a kernel is launch-bound to where S no longer fits (16 heads of
// 16384² fp32 scores are 17 GB, twice over for S and P), both head dims FlashAttention papers
// report, and one causal shape.
std::vector<AttentionShape> gpu_shapes() {
  std::vector<AttentionShape> v;
  for (int64_t n : {512, 1024, 2048, 4096, 8192, 16384}) v.push_back(make_shape(1, 16, n, 64, false));
  for (int64_t n : {1024, 4096}) v.push_back(make_shape(1, 16, n, 128, false));
  v.push_back(make_shape(1, 16, 4096, 64, true));
  return v;
}

// The shapes a GPU rung's backward is benchmarked on: the backward and forward+backward at every N
// of the sweep would add half again to the time tests/gpu_suite.sh gives the sweep, so three N of the
// anchors' grid (shared/anchors.md) carry the curve; the CPU twins' shapes are all small.
bool backward_swept(const AttentionShape& s, Backend b) {
  return b == Backend::Cpu || s.seq_q == 1024 || s.seq_q == 4096 || s.seq_q == 16384;
}

// The CPU twins do the GPU's work on a few cores: small shapes only.
std::vector<AttentionShape> cpu_shapes() {
  std::vector<AttentionShape> v;
  for (int64_t n : {128, 256, 512}) v.push_back(make_shape(1, 2, n, 64, false));
  return v;
}

// fp32 where the rung runs it; otherwise bf16, the dtype the anchors' peers are measured in.
DType bench_dtype(const Rung& r) {
  const auto dt = r.caps().dtypes;
  for (DType t : {DType::F32, DType::BF16})
    if (std::find(dt.begin(), dt.end(), t) != dt.end()) return t;
  return dt.front();
}

// What a benchmark times: the forward, the backward alone, or a forward followed by a backward.
enum class Phase { Fwd, Bwd, FwdBwd };
const char* phase_label(Phase p) { return p == Phase::Fwd ? "fwd" : p == Phase::Bwd ? "bwd" : "fwd+bwd"; }
const char* phase_prefix(Phase p) { return p == Phase::Fwd ? "fwd" : p == Phase::Bwd ? "bwd" : "fwdbwd"; }

std::string bench_name(const Rung& r, const AttentionShape& s, DType t, Phase phase) {
  return std::string(phase_prefix(phase)) + "/" + r.name() + "/" + backend_name(r.backend()) + "/" + dtype_name(t) + "/B" +
         std::to_string(s.batch) + "_H" + std::to_string(s.heads) + "_N" + std::to_string(s.seq_q) +
         "_d" + std::to_string(s.head_dim) + "_c" + (s.causal ? "1" : "0");
}

// ---- State kept between Google Benchmark's calls of one benchmark --------------------------------
// Google Benchmark calls a benchmark's function once per trial iteration count and once per
// repetition. Inputs, the oracle, device buffers and the check are made on the first call and kept
// for the rest; only the current benchmark's are kept, so rung 00's 34 GB of S and P at N = 16384
// are freed before the next rung allocates.

// Inputs and oracle rows for one shape and dtype, shared by every rung benchmarked on it (the
// sweep registers shape by shape, so one is enough). The oracle is made when a rung first runs on
// this shape: if every rung is out of memory, it never is.
Oracle& shape_data(const AttentionShape& s, DType t) {
  static std::string key;
  static Oracle d;
  const std::string k = s.str() + " " + dtype_name(t);
  if (key != k) {
    key = k;
    d = Oracle(s, t, make_inputs(s, t, kSeed), sample_rows(s.seq_q, kVerifyRows), kSeed + 1);
  }
  return d;
}

// The oracle that backward benchmarks are checked against: on backward_check_shape() of theirs,
// with inputs from the same seed, so the sweep's long sequences (which all check on the same
// smaller problem) compute it once per dtype. Small: a few fp64 arrays of that problem.
Oracle& backward_oracle(const AttentionShape& s, DType t) {
  static std::map<std::string, std::unique_ptr<Oracle>> cache;
  const AttentionShape c = backward_check_shape(s);
  auto& o = cache[c.str() + " " + dtype_name(t)];
  if (!o) o = std::make_unique<Oracle>(c, t, make_inputs(c, t, kSeed), std::vector<int64_t>{}, kSeed + 1);
  return *o;
}

struct Case {
  const Rung* rung;
  AttentionShape shape;
  DType dtype;
  Phase phase;
  std::string name;
};

struct Fixture {
  std::string name;                           // the benchmark it belongs to
  std::unique_ptr<ForwardRun> run;            // fwd: inputs, outputs and workspace where the rung runs
  std::unique_ptr<BackwardRun> brun;   // bwd, fwd+bwd: the same for a forward and a backward
  std::string error;                          // non-empty: every call reports it and times nothing
  double rel_err = 0;                         // O's relative L2 error, or the largest of dQ's, dK's, dV's
  double rel_err_dq = 0, rel_err_dk = 0, rel_err_dv = 0;
};

Fixture& current_fixture() {
  static Fixture f;
  return f;
}

// Benchmarks that failed their check or threw: reported as errors in the JSON, and also in the exit
// status, so a CI smoke run or the GPU suite cannot pass over a rung that computes the wrong thing.
// Out of memory is expected (rung 00 at large N) and is not counted.
std::vector<std::string>& failed_benchmarks() {
  static std::vector<std::string> names;
  return names;
}

using bench::host_ms;

// One call of what the benchmark times (no synchronization).
void call(Fixture& f, Phase phase) {
  if (phase == Phase::Fwd) {
    f.run->run();
  } else {
    if (phase == Phase::FwdBwd) f.brun->forward();
    f.brun->backward();
  }
}

Fixture& fixture_for(const Case& c) {
  Fixture& f = current_fixture();
  if (f.name == c.name) return f;
  // Free the previous benchmark's device memory before allocating this one's.
  f.run.reset();
  f.brun.reset();
  f = Fixture{};
  f.name = c.name;
  const bool on_gpu = c.rung->backend() == Backend::Cuda;
  auto fail = [&](const std::string& what) {
    f.error = what;
    f.run.reset();
    f.brun.reset();
    failed_benchmarks().push_back(c.name);
  };
  try {
    Oracle& data = shape_data(c.shape, c.dtype);
    if (c.phase == Phase::Fwd) {
      f.run = std::make_unique<ForwardRun>(*c.rung, c.shape, c.dtype, data.inputs());
      f.run->run();  // on poisoned outputs: an element the rung never writes fails the check
      const ForwardCheck check = check_forward(c.shape, c.dtype, f.run->fetch(), data.forward());
      f.rel_err = check.o.rel_l2;
      if (!check.pass) {
        fail("FAIL against the fp64 oracle: " + check.str());
        return f;
      }
    } else {
      // Gradients (poisoned first) against the oracle, on the problem it can afford.
      Oracle& ref = backward_oracle(c.shape, c.dtype);
      const BackwardCheck check = ref.check_backward_of(*c.rung, ref.shape());
      f.rel_err_dq = check.dq.rel_l2, f.rel_err_dk = check.dk.rel_l2, f.rel_err_dv = check.dv.rel_l2;
      f.rel_err = std::max({f.rel_err_dq, f.rel_err_dk, f.rel_err_dv});
      if (!check.pass) {
        fail("FAIL against the fp64 oracle's backward on " + ref.shape().str() + ": " + check.str());
        return f;
      }
      f.brun = std::make_unique<BackwardRun>(*c.rung, c.shape, c.dtype, data.inputs(), data.dout_seed());
      f.brun->forward();  // O and lse for the backward
    }
    // Warm-up: clocks up, caches and the instruction cache filled, lazy module loading done.
    const double first_ms = host_ms([&] {
      call(f, c.phase);
      if (on_gpu) gpu::synchronize();
    });
    if (first_ms < kSlowCallMs)
      for (int i = 0; i < kWarmupCalls; ++i) call(f, c.phase);
    if (on_gpu) gpu::synchronize();
  } catch (const gpu::OutOfMemory& e) {
    f.error = e.what();  // expected for the rungs that store S and P at large N
    f.run.reset();
    f.brun.reset();
  } catch (const std::exception& e) {
    fail(std::string("error: ") + e.what());
  }
  return f;
}

void release_fixture() {
  current_fixture() = Fixture{};
}

// Every (rung, shape) to time: the CPU twins on cpu_shapes(), the GPU rungs on gpu_shapes(), each
// in bench_dtype(), and for a rung with a backward pass its bwd and fwd+bwd after its fwd (GPU: on
// the shapes backward_swept picks). Ordered
// shape by shape, and within a shape dtype by dtype, so the inputs and oracle of each (shape, dtype)
// are made once. A shape a rung does not run (a head dim, causal) is left out with a line on
// stderr; one it cannot fit in memory is kept, to report that.
std::vector<Case> sweep(const std::vector<const Rung*>& rungs, int64_t max_seq, bool backward) {
  std::vector<Case> cases;
  for (Backend backend : {Backend::Cpu, Backend::Cuda})
    for (const AttentionShape& s : backend == Backend::Cpu ? cpu_shapes() : gpu_shapes()) {
      if (s.seq_q > max_seq) continue;
      for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (const Rung* r : rungs) {
          if (r->backend() != backend || bench_dtype(*r) != t) continue;
          std::string why;
          if (!r->supports(s, t, &why)) {
            std::cerr << "ladder_bench: left out: " << why << '\n';
            continue;
          }
          cases.push_back({r, s, t, Phase::Fwd, bench_name(*r, s, t, Phase::Fwd)});
          if (!backward || !r->caps().backward || !backward_swept(s, backend)) continue;
          try {
            r->check_supported(s, t, /*for_backward=*/true);
          } catch (const InputError& e) {
            std::cerr << "ladder_bench: backward left out: " << e.what() << '\n';
            continue;
          }
          for (Phase ph : {Phase::Bwd, Phase::FwdBwd}) cases.push_back({r, s, t, ph, bench_name(*r, s, t, ph)});
        }
    }
  return cases;
}

// ---- The benchmark -------------------------------------------------------------------------------
// The label says what was run in key=value form for bench/plot.py; it is kept on a benchmark that
// reports an error (counters are not), so the plot can mark where a rung ran out of memory.
std::string label(const Case& c) {
  const AttentionShape& s = c.shape;
  return "rung=" + c.rung->name() + " device=" + backend_name(c.rung->backend()) +
         " dtype=" + dtype_name(c.dtype) + " phase=" + phase_label(c.phase) + " B=" + std::to_string(s.batch) +
         " H=" + std::to_string(s.heads) + " N=" + std::to_string(s.seq_q) +
         " d=" + std::to_string(s.head_dim) + " causal=" + (s.causal ? "1" : "0");
}

void attention_benchmark(benchmark::State& state, const Case& c) {
  state.SetLabel(label(c));
  Fixture& f = fixture_for(c);
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  const bool on_gpu = c.rung->backend() == Backend::Cuda;
  double seconds = 0;
  for (auto _ : state) {
    // GPU: CUDA events around the launches alone; flush_l2 runs before the start event, so the
    // kernels read their inputs from DRAM as they would in a model, not from a warm 50 MB L2.
    const double ms = on_gpu ? gpu::time_ms([&] { call(f, c.phase); }, 0, 1, [] { gpu::flush_l2(); })
                             : host_ms([&] { call(f, c.phase); });
    state.SetIterationTime(ms * 1e-3);
    seconds += ms * 1e-3;
  }

  const AttentionShape& s = c.shape;
  const double per_call = seconds / double(state.iterations());
  using C = benchmark::Counter;
  const double fwd_ws = double(c.rung->workspace_bytes(s, c.dtype));
  if (c.phase == Phase::Fwd) {
    const double io = c.rung->modelled_io(s, c.dtype).total();
    state.counters["TFLOP/s"] = s.flops_forward() / per_call / 1e12;
    state.counters["modelled_bytes"] = C(io, C::kDefaults, C::kIs1024);
    state.counters["GB/s"] = io / per_call / 1e9;
    state.counters["extra_bytes"] = C(fwd_ws, C::kDefaults, C::kIs1024);
  } else {
    const double bwd_ws = double(c.rung->backward_workspace_bytes(s, c.dtype));
    const double flops = (c.phase == Phase::Bwd ? 2.5 : 3.5) * s.flops_forward();
    state.counters["TFLOP/s"] = flops / per_call / 1e12;
    // Modelled bytes where the rung gives a closed form for its backward (a NaN counter would make
    // Google Benchmark's JSON unreadable): the backward's, plus the forward's for fwd+bwd.
    const double io = c.rung->modelled_backward_io(s, c.dtype).total() +
                      (c.phase == Phase::FwdBwd ? c.rung->modelled_io(s, c.dtype).total() : 0.0);
    if (std::isfinite(io)) {
      state.counters["modelled_bytes"] = C(io, C::kDefaults, C::kIs1024);
      state.counters["GB/s"] = io / per_call / 1e9;
    }
    state.counters["extra_bytes"] = C(c.phase == Phase::Bwd ? bwd_ws : fwd_ws + bwd_ws, C::kDefaults, C::kIs1024);
    state.counters["rel_err_dq"] = f.rel_err_dq;
    state.counters["rel_err_dk"] = f.rel_err_dk;
    state.counters["rel_err_dv"] = f.rel_err_dv;
  }
  state.counters["rel_err"] = f.rel_err;
  state.counters["B"] = double(s.batch);
  state.counters["H"] = double(s.heads);
  state.counters["N"] = double(s.seq_q);
  state.counters["d"] = double(s.head_dim);
  state.counters["causal"] = s.causal ? 1 : 0;
}

int bench_main(int argc, char** argv) {
  const Config cfg = parse_flags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  // Asked even for --fl_device=cpu: the JSON's context names the machine's GPU either way.
  const bench::GpuChoice gpu = bench::choose_gpu(cfg.device, "--fl_device=cuda", /*ask_anyway=*/true);
  const bool gpu_ok = gpu.use;
  if (cfg.device == "all" && !gpu_ok)
    std::cerr << "ladder_bench: GPU rungs skipped (" << gpu.why << "); running the CPU twins only\n";
  benchmark::AddCustomContext("gpu", gpu.present ? gpu::device_name() : "none (" + gpu.why + ")");
  // Google Benchmark's own "date" is local time; this one is the day in UTC, for figure titles.
  benchmark::AddCustomContext("date_utc", bench::today_utc());
  benchmark::AddCustomContext("flash_ladder_seed", std::to_string(kSeed));

  const auto rungs = bench::select_rungs(cfg.rungs, cfg.device != "cuda", gpu_ok);
  if (rungs.empty()) throw InputError("no rung of this build matches --fl_rungs=" + cfg.rungs);

  const int64_t max_seq = cfg.quick ? std::min(cfg.max_seq, kQuickMaxSeq) : cfg.max_seq;
  const std::vector<Case> cases = sweep(rungs, max_seq, cfg.backward);
  for (const Case& c : cases) {
    auto* b = benchmark::RegisterBenchmark(c.name.c_str(),
                                           [c](benchmark::State& st) { attention_benchmark(st, c); });
    b->UseManualTime()->Unit(benchmark::kMillisecond)->DisplayAggregatesOnly(true);
    if (!cfg.user_min_time) b->MinTime(kMinTimeSeconds);
    if (!cfg.user_reps) b->Repetitions(int(cfg.reps));
  }
  std::cerr << "ladder_bench: " << cases.size() << " benchmarks\n";
  benchmark::RunSpecifiedBenchmarks();
  release_fixture();
  benchmark::Shutdown();
  const auto& failed = failed_benchmarks();
  if (failed.empty()) return 0;
  std::cerr << "ladder_bench: " << failed.size() << " benchmark(s) failed (wrong result or error):\n";
  for (const auto& n : failed) std::cerr << "  " << n << '\n';
  return 1;
}

}  // namespace
}  // namespace fl

int main(int argc, char** argv) {
  try {
    return fl::bench_main(argc, argv);
  } catch (const fl::InputError& e) {
    std::cerr << "ladder_bench: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ladder_bench: " << e.what() << '\n';
    return 1;
  }
}
