// The ladder: every rung on one problem, checked against the fp64 oracle, timed, in one table.
//
//   build/bench/ladder                              the CPU twins, and the GPU rungs if there is a GPU
//   build/bench/ladder --seq 4096 --heads 16        a bigger problem
//   build/bench/ladder --rungs 00,01 --inputs large-logits   why rung 01 exists
//   build/bench/ladder --list                       what each rung teaches
//   build/bench/ladder --decode --seq-k 32768 --heads 32 --kv-heads 8 --batch 16 --page-size 16
//                                                   rung 10: decoding against a KV cache
//   build/bench/ladder --ring 4 --sharding zigzag --causal --seq 256   rung 11's ring, simulated
//   build/bench/ladder --ring 2 --device cuda --causal --seq 65536      the ring over NCCL on 2 GPUs
//
// One row per rung and device: the median time, TFLOP/s by the convention of shared/anchors.md
// (4·B·H·Nq·Nk·d, halved when causal), the speed-up over the rung above it on the same device, the
// bytes its algorithm moves between device memory and on-chip memory (the rung's closed-form IO
// model, the same formula its CPU twin's counted traffic is pinned to), the extra memory it needs,
// and its error against the oracle. All rungs get the same inputs and the oracle runs once.
//
// Rungs with a backward pass (Capabilities::backward) get a second table below the first: the
// backward's median time alone and that of a forward followed by a backward, TFLOP/s by the same
// convention (2.5× and 3.5× the forward's FLOPs), its modelled IO (Rung::modelled_backward_io, where
// the rung gives one), the extra memory the backward needs, and the
// relative L2 errors of dQ, dK and dV against the fp64 oracle's backward. That oracle holds whole
// N×N matrices, so on a large problem the gradients are checked on a smaller one (one group of
// heads, shorter sequences: backward_check_shape) while the times are of the problem asked
// for; a CPU twin's backward runs, timed and checked, on a problem of at most 2^24 B·H·Nq·Nk·d
// (kTwinBackwardLimit), which keeps the default run quick. --no-backward leaves the table out.
//
// A row passes when its error is within the dtype's tolerance relative to the oracle's answer, or
// within the problem's condition floor: how far the exact answer moves when every input changes by
// that tolerance (harness.hpp). So a gradient that is exactly 0 (the constant-row head's dQ) or a
// problem that amplifies rounding (large logits, --scale 1000) is held to what the arithmetic
// allows, and FAIL means a bug. Rung 00's textbook softmax overflowing on logits past fp32's range
// is that rung's lesson: it shows as OVERFLOW (expected) and does not fail the run.
//
// Exit status: 0 when every row that ran passed (or overflowed as documented), 1 when one failed,
// 2 for a bad command line, a problem no rung can take (zero sizes, H not a multiple of Hkv, an
// unknown dtype, or a dtype, head dim, mask or GQA that every selected rung refuses) or a problem
// whose arrays do not fit in host memory (said before anything is allocated, with how much it
// needs and how much there is). When nothing ran for another reason (the CPU twins sitting out a
// large problem, too little device memory) the ladder says so and exits 0.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "device.hpp"
#include "harness.hpp"
#include "host_memory.hpp"
#include "reference.hpp"
#include "../steps/10_decoding/decoding.hpp"
#include "../steps/11_ring_attention/ring_attention.hpp"
#include "../steps/11_ring_attention/ring_gpu.hpp"

namespace fl {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A CPU twin does the GPU's work on two or four cores; past this many FLOPs it takes minutes, so
// the twins sit out unless --device cpu asks for them (naming them in --rungs is not enough).
constexpr double kCpuTwinFlopLimit = 2e10;

// A CPU twin's backward runs, timed and checked, on a problem of at most this many B·H·Nq·Nk·d
// (one head of the default problem): the default ladder, which CI runs on two cores, stays quick.
// backward_check_shape picks it; the table says when it is smaller than the problem.
constexpr double kTwinBackwardLimit = double(int64_t(1) << 24);

// Long sequences are checked on a sample of query rows (each still attends to every key): the
// fp64 oracle on all rows would cost more than every rung together.
constexpr int64_t kAllRowsUpTo = 1024;
constexpr int64_t kSampledRows = 64;

// ---- The command line ----------------------------------------------------------------------------
// A flag the command line got wrong (as opposed to a problem no rung can take): the message ends
// with a pointer to --help.
struct UsageError : InputError {
  using InputError::InputError;
};

struct Options {
  std::string rungs = "all";
  std::string device = "all";
  int64_t batch = 1, heads = 4, seq = 512, head_dim = 64;
  std::optional<int64_t> kv_heads, seq_q, seq_k;  // default: H, and --seq
  bool causal = false;
  double scale = 0;  // 0: the default 1/√d
  DType dtype = DType::F32;
  uint64_t seed = 1234;
  InputKind inputs = InputKind::Normal;
  int64_t warmup = -1, reps = -1;  // -1: the device's default
  int64_t verify_rows = 0;         // 0: all rows up to kAllRowsUpTo, else a sample; -1: all
  std::string json;
  bool backward = true;            // the backward table, for rungs that have a backward pass
  bool deterministic = false;      // every backward in the rung's deterministic mode
  bool list = false, help = false;
  // --decode: rung 10's problem (new rows against a KV cache) instead of the rungs' one
  bool decode = false, dtype_given = false;
  int64_t page_size = 0;  // --page-size: 0 for a contiguous cache
  int64_t splits = 0;     // --splits: 0 lets the rung choose
  bool no_ceiling = false;  // --no-ceiling: leave out the streaming-read probe
  // --ring P: rung 11's twin, the problem's sequence over P simulated GPUs
  int64_t ring = 0;
  ring::Sharding sharding = ring::Sharding::Zigzag;

  AttentionShape shape() const {
    AttentionShape s;
    s.batch = batch;
    s.heads = heads;
    s.kv_heads = kv_heads.value_or(heads);
    s.seq_q = seq_q.value_or(seq);
    s.seq_k = seq_k.value_or(seq);
    s.head_dim = head_dim;
    s.causal = causal;
    s.scale = scale;
    return s;
  }
  int warmup_for(Backend b) const { return int(warmup >= 0 ? warmup : b == Backend::Cuda ? 2 : 1); }
  int reps_for(Backend b) const { return int(reps >= 1 ? reps : b == Backend::Cuda ? 10 : 3); }
};

const char* kUsage = R"(usage: ladder [flags]

Runs the rungs of the ladder on one attention problem, checks each against the fp64 oracle, times
it and prints one table; rungs with a backward pass get a second table, with the backward's time
alone and a forward's and backward's together, and the errors of dQ, dK, dV. A rung passes when
its error is within the dtype's tolerance, or within how far the exact answer moves when every
input changes by that tolerance (the condition floor: what the arithmetic allows where the answer
is ~0 or the logits are large). Exit status 0 if every rung that ran passed (rung 00 overflowing
on large logits, its lesson, shows as OVERFLOW (expected) and counts as no failure), 1 if one
failed, 2 for a bad command line, a problem that no selected rung takes, or one that does not fit
in host memory (refused at once, with how much it needs and how much there is); nothing ran for
any other reason, such as too little device memory: 0, and it says why.

Problem (Q: [B, H, Nq, d], K and V: [B, Hkv, Nk, d]):
  --batch B            batch size (default 1)
  --heads H            query heads (default 4)
  --kv-heads Hkv       key/value heads; H must be a multiple (default H)
  --seq N              sets Nq = Nk = N (default 512)
  --seq-q Nq           query length (overrides --seq)
  --seq-k Nk           key length (overrides --seq)
  --head-dim d         head dimension (default 64)
  --causal             causal mask, bottom-right aligned when Nq != Nk
  --scale S            softmax scale, finite and > 0 (default 1/sqrt(d))
  --dtype T            fp32 | fp16 | bf16 (default fp32)
  --seed S             seed of the random inputs (default 1234)
  --inputs KIND        normal | large-logits | constant-row (default normal); large-logits makes
                       exp() overflow fp32, which is what rung 00 fails on and rung 01 mends

Which rungs:
  --rungs LIST         all, or a comma list of rung names or numbers: 00,02 or 01_safe_softmax
                       (default all)
  --device D           cpu | cuda | all (default all: the CPU twins, and the GPU rungs when a
                       GPU is usable). CPU twins sit out problems over 2e10 FLOPs unless
                       --device cpu is given.
  --list               list the rungs this build has (name, backend, dtypes, head dims, idea)

Measuring:
  --warmup W           untimed runs before timing (default 2 on the GPU, 1 on the CPU)
  --reps R             timed runs; the table shows their median (default 10 GPU, 3 CPU).
                       GPU runs flush L2 before each timed run.
  --verify-rows N|all  query rows checked against the oracle (default all when Nq <= 1024,
                       else a sample of 64 rows that includes the first, last and block edges)
  --no-backward        leave out the backward table. By default rungs with a backward pass
                       run it: a GPU rung is timed on the problem and its gradients checked on it
                       up to B*H*Nq*Nk*d = 2^26 (past that on one group of heads with shorter
                       sequences); a CPU twin is timed and checked on at most 2^24 of it
  --deterministic      run every backward in its deterministic mode (the same dQ, dK, dV bits on
                       every run: rung 09's v2_deterministic and later); a GPU rung without
                       one is left out of the backward table, with why
  --json FILE          also write the results as JSON to FILE

Decoding (rung 10: one to sixteen new rows per sequence against a KV cache):
  --decode             run rung 10's twin and kernels instead of the rungs above: B sequences of
                       ragged lengths (sequence b holds Nk - b*Nk/(2B) keys), Nq = --seq-q new
                       rows each (default 1), --heads and --kv-heads as above, bf16 unless --dtype
                       says fp16. Each is checked against the fp64 oracle sequence by sequence and
                       timed; the table gives the K and V bytes read per second and, on a GPU,
                       that as a share of a plain streaming read of the same GPU.
  --page-size P        a paged KV cache, P keys a page (a multiple of 16; default 0: contiguous)
  --splits S           pieces each sequence's keys are cut into, 1..256 (default: the rung chooses)
  --no-ceiling         leave out the streaming read of 1 GB or more (the "of stream read" ceiling):
                       for runs under compute-sanitizer, where it is slow and measures nothing

Ring attention (rung 11: one sequence over P GPUs, simulated on the CPU):
  --ring P             run rung 11's twin on the problem (Nq = Nk = --seq) over P simulated ranks:
                       forward and backward checked against the fp64 oracle, and per rank the
                       chunks it holds, the work it did and the bytes it sent beside the closed form
  --sharding S         zigzag | contiguous (default zigzag: balanced causal work)
  --ring P --device cuda
                       the ring's forward over NCCL on GPUs 0 .. P-1 of this machine, a thread a rank
                       (fp16 or bf16): checked against the fp64 oracle (all rows up to 1024, else a
                       sample; --verify-rows), then timed (--reps calls, the median wall time a call)

  --help               this text

Flags take their value as the next argument or after '=': --seq 1024, --seq=1024.

Examples:
  ladder
  ladder --seq 4096 --heads 16 --causal --rungs 04,05 --json ladder.json
  ladder --rungs 00,01 --inputs large-logits
)";

InputKind parse_inputs(const std::string& s) {
  for (InputKind k : {InputKind::Normal, InputKind::LargeLogits, InputKind::ConstantRow})
    if (s == input_kind_name(k)) return k;
  throw UsageError("--inputs: unknown kind '" + s + "'; allowed are normal, large-logits, constant-row");
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    bool inline_value = false;
    if (flag.rfind("--", 0) != 0)
      throw UsageError("unexpected argument '" + flag + "'; every flag starts with --");
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    auto switch_flag = [&] {
      if (inline_value) throw UsageError(flag + " takes no value");
      return true;
    };
    auto next = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      return argv[++i];
    };
    auto integer = [&](int64_t min, int64_t max = std::numeric_limits<int64_t>::max()) {
      const std::string v = next();
      int64_t x = 0;
      if (!bench::parse_int(v, &x)) throw UsageError(flag + " expects an integer, got '" + v + "'");
      if (x < min)
        throw UsageError(flag + " must be at least " + std::to_string(min) + ", got " + v);
      if (x > max)
        throw UsageError(flag + " must be at most " + std::to_string(max) + ", got " + v);
      return x;
    };
    // Shape sizes take any integer here: AttentionShape::validate() says what is wrong with them,
    // in the same words the tests and the C ABI use.
    constexpr int64_t kAny = std::numeric_limits<int64_t>::min();

    if (flag == "--help") o.help = switch_flag();
    else if (flag == "--list") o.list = switch_flag();
    else if (flag == "--decode") o.decode = switch_flag();
    else if (flag == "--page-size") o.page_size = integer(0);
    else if (flag == "--splits") o.splits = integer(1, decoding::kMaxSplits);
    else if (flag == "--no-ceiling") o.no_ceiling = switch_flag();
    else if (flag == "--ring") o.ring = integer(1, 4096);
    else if (flag == "--sharding") {
      const std::string v = next();
      if (v == "zigzag") o.sharding = ring::Sharding::Zigzag;
      else if (v == "contiguous") o.sharding = ring::Sharding::Contiguous;
      else throw UsageError("--sharding: unknown '" + v + "'; allowed are zigzag, contiguous");
    }
    else if (flag == "--no-backward") o.backward = !switch_flag();
    else if (flag == "--deterministic") o.deterministic = switch_flag();
    else if (flag == "--causal") o.causal = switch_flag();
    else if (flag == "--rungs") o.rungs = next();
    else if (flag == "--device") {
      o.device = next();
      if (o.device != "cpu" && o.device != "cuda" && o.device != "all")
        throw UsageError("--device: unknown device '" + o.device + "'; allowed are cpu, cuda, all");
    } else if (flag == "--batch") o.batch = integer(kAny);
    else if (flag == "--heads") o.heads = integer(kAny);
    else if (flag == "--kv-heads") o.kv_heads = integer(kAny);
    else if (flag == "--seq") o.seq = integer(kAny);
    else if (flag == "--seq-q") o.seq_q = integer(kAny);
    else if (flag == "--seq-k") o.seq_k = integer(kAny);
    else if (flag == "--head-dim") o.head_dim = integer(kAny);
    else if (flag == "--scale") {
      const std::string v = next();
      char* end = nullptr;
      o.scale = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size())
        throw UsageError("--scale expects a number, got '" + v + "'");
      // 0 is how the shape spells "the default", so it is refused here with inf and NaN alike.
      if (!(std::isfinite(o.scale) && o.scale > 0))
        throw UsageError("--scale must be finite and > 0 (leave it out for the default 1/sqrt(d)), got " + v);
    } else if (flag == "--dtype") o.dtype = parse_dtype(next()), o.dtype_given = true;
    else if (flag == "--seed") {
      const std::string v = next();
      if (!bench::parse_uint64(v, &o.seed))
        throw UsageError("--seed expects a non-negative integer, got '" + v + "'");
    } else if (flag == "--inputs") o.inputs = parse_inputs(next());
    // Counts of runs end up as int (warmup_for, reps_for): a larger one would wrap negative.
    else if (flag == "--warmup") o.warmup = integer(0, std::numeric_limits<int>::max());
    else if (flag == "--reps") o.reps = integer(1, std::numeric_limits<int>::max());
    else if (flag == "--verify-rows") {
      const std::string v = next();
      int64_t n = 0;
      if (v == "all") o.verify_rows = -1;
      else if (bench::parse_int(v, &n) && n >= 1) o.verify_rows = n;
      else throw UsageError("--verify-rows expects a number of rows (at least 1) or 'all', got '" + v + "'");
    } else if (flag == "--json") o.json = next();
    else
      throw UsageError("unknown flag '" + flag + "'; the flags are --rungs --device --batch --heads "
                       "--kv-heads --seq --seq-q --seq-k --head-dim --causal --scale --dtype --seed "
                       "--inputs --warmup --reps --verify-rows --no-backward --deterministic --json --list --decode "
                       "--page-size --splits --no-ceiling --ring --sharding --help");
  }
  return o;
}

// ---- Formatting ----------------------------------------------------------------------------------
std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// Three significant digits without an exponent: 1234, 12.3, 0.0123.
std::string sig3(double x) {
  if (!std::isfinite(x)) return "-";
  const double a = std::abs(x);
  if (a >= 100) return fmt("%.0f", x);
  if (a >= 10) return fmt("%.1f", x);
  if (a >= 1) return fmt("%.2f", x);
  if (a >= 0.1) return fmt("%.3f", x);
  if (a >= 0.01) return fmt("%.4f", x);
  if (a >= 0.001) return fmt("%.5f", x);
  return fmt("%.2e", x);
}

// A Markdown table, so `ladder` output can be pasted into the docs as it is.
class Table {
 public:
  explicit Table(std::vector<std::string> head, std::vector<bool> right_aligned)
      : head_(std::move(head)), right_(std::move(right_aligned)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& os) const {
    std::vector<std::size_t> w(head_.size());
    for (std::size_t c = 0; c < w.size(); ++c) {
      w[c] = std::max<std::size_t>(head_[c].size(), 3);
      for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
    }
    auto line = [&](const std::vector<std::string>& r) {
      os << "|";
      for (std::size_t c = 0; c < w.size(); ++c) {
        const std::string pad(w[c] - r[c].size(), ' ');
        os << ' ' << (right_[c] ? pad + r[c] : r[c] + pad) << " |";
      }
      os << '\n';
    };
    line(head_);
    os << "|";
    for (std::size_t c = 0; c < w.size(); ++c)
      os << (right_[c] ? std::string(w[c] + 1, '-') + ":|" : std::string(w[c] + 2, '-') + "|");
    os << '\n';
    for (const auto& r : rows_) line(r);
  }

 private:
  std::vector<std::string> head_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += char(c);
    else if (c == '\n') out += "\\n";
    else if (c < 0x20) out += fmt("\\u%04x", c);
    else out += char(c);
  }
  return out + "\"";
}

// JSON has no NaN or infinity: a value that was not measured is null.
std::string json_number(double x) { return std::isfinite(x) ? fmt("%.9g", x) : "null"; }

// One JSON object, fields in the order they were added.
class JsonObject {
 public:
  JsonObject& str(const std::string& k, const std::string& v) { return raw(k, json_string(v)); }
  JsonObject& num(const std::string& k, double v) { return raw(k, json_number(v)); }
  JsonObject& boolean(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
  JsonObject& raw(const std::string& k, const std::string& v) {
    fields_.emplace_back(k, v);
    return *this;
  }
  std::string dump(const std::string& indent = "") const {
    std::string out = "{";
    for (std::size_t i = 0; i < fields_.size(); ++i)
      out += (i ? ",\n" : "\n") + indent + "  " + json_string(fields_[i].first) + ": " + fields_[i].second;
    return out + "\n" + indent + "}";
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// ---- Running one rung ----------------------------------------------------------------------------
struct Problem {
  AttentionShape shape;
  DType dtype;
  std::vector<int64_t> verify_rows;  // empty: every row
  // Rungs whose arrays do not fit in host memory, and the message that says so (host_bytes_needed).
  std::map<const Rung*, std::string> forward_skip, backward_skip;
  Oracle oracle;              // the inputs, and the oracle computed when a rung first needs it

  const Inputs& inputs() { return oracle.inputs(); }
};

// Overflow is the point of a rung that runs the textbook softmax: its chapter shows it, the README
// demonstrates it (--inputs large-logits), and the rung above it mends it. Such a row is reported
// as OVERFLOW (expected) instead of FAIL, and does not fail the run, when (1) the rung is listed
// here, (2) the problem's softmax sum really leaves fp32 (the oracle's lse, log Σ_j exp(s_ij), past
// ln(FLT_MAX) ≈ 88.72: an unshifted Σ exp(s) is +∞ there) and (3) what is wrong is only non-finite
// outputs. Anything else, on any rung, stays FAIL.
const char* documented_overflow(const Rung& r) {
  if (r.step() == "00_naive_eigen")
    return "softmax without max-subtraction: exp(s) summed as it is overflows fp32 once the row's "
           "log-sum-exp passes ln(FLT_MAX) = 88.72 (docs/00_naive_eigen.md); rung 01 subtracts the max";
  return nullptr;
}

enum class Status { Pass, Fail, Skipped, Overflow };

const char* status_name(Status s) {
  switch (s) {
    case Status::Pass: return "PASS";
    case Status::Fail: return "FAIL";
    case Status::Skipped: return "skipped";
    case Status::Overflow: return "OVERFLOW (expected)";
  }
  return "?";
}

// A CPU twin's work past kCpuTwinFlopLimit: the reason a twin sits out, or "" when it runs.
std::string twin_sits_out(const Rung& r, const Problem& p, const Options& opt) {
  if (r.backend() == Backend::Cuda || opt.device == "cpu" || p.shape.flops_forward() <= kCpuTwinFlopLimit)
    return "";
  return "CPU twins sit out problems over " + fmt("%.0f", kCpuTwinFlopLimit / 1e9) + " GFLOP (this one is " +
         fmt("%.0f", p.shape.flops_forward() / 1e9) + " GFLOP); --device cpu runs them anyway";
}

struct Row {
  const Rung* rung = nullptr;
  std::string device;  // "cpu" or the GPU's short name
  Status status = Status::Skipped;
  bool refused = false;  // skipped because the rung does not run this problem (dtype, d, mask, GQA)
  std::string note;    // why it was skipped or what failed
  double ms = kNaN;    // median
  double speedup = kNaN;
  IoModel io;
  double extra_bytes = kNaN;
  double counted_io = kNaN;  // CPU twins: the bytes the twin actually moved (equals io by test)
  std::optional<ForwardCheck> check;

  const char* status_name() const { return fl::status_name(status); }
};

Row run_rung(const Rung& r, Problem& p, const Options& opt, const std::string& gpu_short) {
  Row row;
  row.rung = &r;
  const bool on_gpu = r.backend() == Backend::Cuda;
  row.device = on_gpu ? gpu_short : "cpu";
  auto skip = [&](std::string why) {
    row.status = Status::Skipped;
    row.note = std::move(why);
    return row;
  };

  std::string why;
  if (!r.supports(p.shape, p.dtype, &why)) {
    row.refused = true;
    return skip(why);
  }
  row.io = r.modelled_io(p.shape, p.dtype);
  row.extra_bytes = double(r.workspace_bytes(p.shape, p.dtype));
  if (const std::string out = twin_sits_out(r, p, opt); !out.empty()) return skip(out);
  if (const auto it = p.forward_skip.find(&r); it != p.forward_skip.end()) return skip(it->second);

  std::cerr << "running " << r.label() << "...\n";
  try {
    ForwardRun run(r, p.shape, p.dtype, p.inputs());  // outputs poisoned: unwritten rows show as NaN
    IoCounter io;
    run.run(on_gpu ? nullptr : &io);
    const ForwardOutputs out = run.fetch();
    if (!on_gpu) row.counted_io = double(io.total());
    row.check = p.oracle.check_forward_of(out);
    row.status = row.check->pass ? Status::Pass : Status::Fail;
    if (!row.check->pass) row.note = row.check->str();
    // A pass that rests on the condition floor says so: its rel err alone would look like a failure.
    if (row.check->passed_on_floor()) row.note = row.check->str();
    if (!row.check->pass) {
      double lse_max = -std::numeric_limits<double>::infinity();
      for (double x : p.oracle.forward().lse) lse_max = std::max(lse_max, x);
      const ForwardCheck& c = *row.check;
      // What is wrong is only non-finite elements: the finite ones are within what is allowed.
      const bool finite_part_ok = c.o.l2 <= std::max(c.tolerance * c.o.ref_l2, c.o_floor);
      if (const char* why = documented_overflow(r);
          why && lse_max > std::log(double(std::numeric_limits<float>::max())) && (c.o.bad > 0 || c.lse.bad > 0) &&
          finite_part_ok) {
        row.status = Status::Overflow;
        row.note = std::string(why) + "; here the largest log-sum-exp is " + fmt("%.4g", lse_max) +
                   ", and " + std::to_string(c.o.bad) + " of " + std::to_string(c.o.count) +
                   " elements of O are not finite. Expected, so not counted as a failure.";
      }
    }
    // A failing rung is still timed: rung 00 overflowing on large logits is no faster or slower
    // for it, and the table should show that.
    row.ms = run.time_ms(opt.warmup_for(r.backend()), opt.reps_for(r.backend()));
  } catch (const gpu::OutOfMemory& e) {
    return skip(e.what());
  } catch (const std::bad_alloc&) {
    return skip("out of host memory: the twin's arrays need about " +
                describe_bytes(double(ForwardRun::device_bytes(r, p.shape, p.dtype))));
  } catch (const std::exception& e) {
    row.status = Status::Fail;
    row.note = std::string("error: ") + e.what();
  }
  return row;
}

// ---- Running one rung's backward -----------------------------------------------------------------
struct BackwardRow {
  const Rung* rung = nullptr;
  std::string device;
  Status status = Status::Skipped;
  bool refused = false;
  std::string note;
  AttentionShape shape;                     // the problem timed: the ladder's, or smaller for a twin
  AttentionShape check_shape;               // the problem the gradients are checked on
  double bwd_ms = kNaN, fwd_bwd_ms = kNaN;  // medians: the backward alone; a forward then a backward
  IoModel io{kNaN, kNaN};                   // the backward's modelled IO (NaN: the rung gives none)
  double extra_bytes = kNaN;                // the backward's workspace
  double fwd_bwd_extra_bytes = kNaN;        // the forward's and the backward's workspaces
  double counted_io = kNaN;                 // CPU twins: bytes the backward moved
  std::optional<BackwardCheck> check;       // on check_shape
};

// A GPU rung's backward is timed on the problem and checked on what the oracle affords; a twin's
// backward runs on a problem small enough to do both on (kTwinBackwardLimit).
AttentionShape backward_timed_shape(const Rung& r, const AttentionShape& s) {
  return r.backend() == Backend::Cpu ? backward_check_shape(s, kTwinBackwardLimit) : s;
}
AttentionShape backward_checked_shape(const Rung& r, const AttentionShape& s) {
  return backward_check_shape(backward_timed_shape(r, s), kBackwardOracleLimit);
}

BackwardRow run_backward_rung(const Rung& r, Problem& p, const Options& opt, const std::string& gpu_short) {
  BackwardRow row;
  row.rung = &r;
  const bool on_gpu = r.backend() == Backend::Cuda;
  row.device = on_gpu ? gpu_short : "cpu";
  row.shape = backward_timed_shape(r, p.shape);
  row.check_shape = backward_checked_shape(r, p.shape);
  auto skip = [&](std::string why) {
    row.status = Status::Skipped;
    row.note = std::move(why);
    return row;
  };
  try {
    r.check_supported(p.shape, p.dtype, /*for_backward=*/true);
  } catch (const InputError& e) {
    row.refused = true;
    return skip(e.what());
  }
  row.io = r.modelled_backward_io(row.shape, p.dtype);
  row.extra_bytes = double(r.backward_workspace_bytes(row.shape, p.dtype));
  row.fwd_bwd_extra_bytes = double(r.workspace_bytes(row.shape, p.dtype)) + row.extra_bytes;
  if (const std::string out = twin_sits_out(r, p, opt); !out.empty()) return skip(out);
  if (const auto it = p.backward_skip.find(&r); it != p.backward_skip.end()) return skip(it->second);
  if (opt.deterministic && on_gpu && !r.caps().deterministic_backward)
    return skip("no deterministic backward (--deterministic; these have one: " +
                Registry::instance().deterministic_backward_names() + ")");

  std::cerr << "running the backward of " << r.label() << "...\n";
  try {
    // Gradients first, each poisoned (NaN) before the call, on the problem the oracle can afford;
    // a twin counts its traffic there (the problem it is timed on too).
    IoCounter io;
    row.check = p.oracle.check_backward_of(r, row.check_shape, on_gpu ? nullptr : &io, opt.deterministic);
    if (!on_gpu) row.counted_io = double(io.total());
    row.status = row.check->pass ? Status::Pass : Status::Fail;
    if (!row.check->pass || row.check->passed_on_floor()) row.note = row.check->str();
    // Then the times; a failing rung is timed too, as in the forward table.
    BackwardRun run(r, row.shape, p.dtype, p.oracle.backward_qkv(row.shape), p.oracle.dout_seed(), opt.deterministic);
    const int warmup = opt.warmup_for(r.backend()), reps = opt.reps_for(r.backend());
    row.bwd_ms = run.time_backward_ms(warmup, reps);
    row.fwd_bwd_ms = run.time_forward_backward_ms(warmup, reps);
  } catch (const gpu::OutOfMemory& e) {
    if (row.status == Status::Fail) row.note += "; not timed: " + std::string(e.what());
    else {
      row.check.reset();
      return skip(e.what());
    }
  } catch (const std::bad_alloc&) {
    const std::string why = "out of host memory: the twin's arrays need about " +
                            describe_bytes(double(BackwardRun::device_bytes(r, row.shape, p.dtype)));
    if (row.status == Status::Fail) row.note += "; not timed: " + why;
    else {
      row.check.reset();
      return skip(why);
    }
  } catch (const std::exception& e) {
    row.status = Status::Fail;
    row.note = (row.note.empty() ? "" : row.note + "; ") + "error: " + e.what();
  }
  return row;
}

// ---- Host memory ---------------------------------------------------------------------------------
// What the run holds in host memory at its peak, worked out from the sizes alone before anything is
// allocated, in double (a product of sizes past 2^64 is still a number, and is refused like any
// other). The problem's Q, K and V (fp32) are counted always: a run cannot hold less. The rest only
// for the rungs that will run (a twin sitting out a large problem allocates nothing): the oracle's
// rows and its per-head matrices, twice (the condition floor runs it again on moved inputs), and
// what one rung's forward (its inputs and outputs in its dtype; a twin's workspace) or backward
// (BackwardRun's arrays; the backward oracle on the checked problem) holds beside them. A rung whose
// own arrays do not fit is skipped with the figures (as a GPU rung is when device memory is short);
// the run is refused (exit status 2) when not even the inputs fit, or no rung that would run does.
struct HostNeed {
  double inputs = 0;  // Q, K, V in fp32
  double total = 0;   // the peak of everything that will run
  std::map<const Rung*, std::string> forward_skip, backward_skip;  // rungs whose arrays do not fit
};

double elems(double a, double b, double c, double d) { return a * b * c * d; }

HostNeed host_bytes_needed(const Problem& p, const std::vector<const Rung*>& rungs, const Options& opt) {
  const AttentionShape& s = p.shape;
  const double e = double(dtype_bytes(p.dtype));
  auto q_of = [](const AttentionShape& x) { return elems(x.batch, x.heads, x.seq_q, x.head_dim); };
  auto kv_of = [](const AttentionShape& x) { return elems(x.batch, x.kv_heads, x.seq_k, x.head_dim); };
  auto lse_of = [](const AttentionShape& x) { return elems(x.batch, x.heads, x.seq_q, 1); };
  const double q = q_of(s), kv = kv_of(s), lse = lse_of(s), d = double(s.head_dim);
  const double rows = p.verify_rows.empty() ? double(s.seq_q) : double(p.verify_rows.size());
  HostNeed need;
  need.inputs = 4 * (q + 2 * kv);
  // The oracle's forward: its rows of O and lse (kept, and once more for the condition floor), a
  // head's widened Q, K, V and its rows' scores while it runs, and the moved copy of the inputs.
  const double kept = 2 * 8 * elems(s.batch, s.heads, rows, d + 1);
  const double head = 8 * (double(s.seq_q) * d + 2 * double(s.seq_k) * d + 2 * rows * double(s.seq_k) + 2 * rows * d);
  auto with_base = [&](double rung_peak) { return need.inputs + kept + std::max(need.inputs + head, rung_peak); };
  const double available = double(available_host_memory());
  auto fits = [&](double bytes) { return available <= 0 || bytes + std::min(available / 8, 1073741824.0) <= available; };

  double peak = 0, smallest = 0;
  bool any = false, skipped_all = true;
  auto consider = [&](const Rung* r, double rung_peak, std::map<const Rung*, std::string>& skip) {
    const double total = with_base(rung_peak);
    any = true;
    if (smallest == 0 || total < smallest) smallest = total;
    if (fits(total)) {
      skipped_all = false;
      peak = std::max(peak, total);
    } else {
      skip[r] = "rung " + r->label() + " on " + s.str() + " " + host_memory_figures(total) +
                "; nothing was allocated";
    }
  };
  for (const Rung* r : rungs) {
    if (!r->supports(s, p.dtype) || !twin_sits_out(*r, p, opt).empty()) continue;
    const bool cpu = r->backend() == Backend::Cpu;
    // Forward: ForwardRun's arrays in the dtype (and a twin's workspace), the fp32 copies fetch()
    // makes, and the checked rows check_forward gathers.
    consider(r,
             e * (2 * q + 2 * kv) + 4 * lse + (cpu ? double(r->workspace_bytes(s, p.dtype)) : 0) + 4 * (q + lse) +
                 4 * elems(s.batch, s.heads, rows, d + 1),
             need.forward_skip);
    if (!opt.backward || !r->caps().backward) continue;
    try {
      r->check_supported(s, p.dtype, /*for_backward=*/true);
    } catch (const InputError&) {
      continue;
    }
    // Backward: BackwardRun on the timed problem (Q, K, V, dO, O, dQ, dK, dV in the dtype, dO in
    // fp32 as drawn, a twin's workspaces), then the oracle's backward on the checked problem (and on
    // moved inputs for the floor).
    const AttentionShape ts = backward_timed_shape(*r, s), cs = backward_checked_shape(*r, s);
    const double tq = q_of(ts), tkv = kv_of(ts);
    const double run = e * (4 * tq + 4 * tkv) + 4 * lse_of(ts) + 4 * tq +
                       (cpu ? double(r->workspace_bytes(ts, p.dtype)) + double(r->backward_workspace_bytes(ts, p.dtype))
                            : 0);
    const double cq = q_of(cs), ckv = kv_of(cs);
    const double oracle = 4 * 3 * (cq + 2 * ckv) + 8 * 2 * (cq + 2 * ckv) + 4 * (2 * cq + lse_of(cs)) +
                          8 * 6 * double(cs.seq_q) * double(cs.seq_k) + e * 5 * (cq + ckv);
    consider(r, run + oracle, need.backward_skip);
  }
  need.total = !any ? need.inputs : skipped_all ? smallest : peak;
  return need;
}

// ---- Output --------------------------------------------------------------------------------------
// O's relative L2 error, or how many elements are NaN / inf / never written when some are: their
// error is no number, and the finite rest would look deceptively good.
std::string rel_error(const Row& r) {
  if (!r.check) return "-";
  if (r.check->o.bad > 0) return std::to_string(r.check->o.bad) + " bad";
  return fmt("%.1e", r.check->o.rel_l2);
}

// Notes (why skipped, what failed) go under a table, numbered, so rows stay one line wide.
class Notes {
 public:
  std::string ref(const std::string& n) {
    auto it = std::find(notes_.begin(), notes_.end(), n);
    if (it == notes_.end()) it = notes_.insert(notes_.end(), n);
    return " [" + std::to_string(it - notes_.begin() + 1) + "]";
  }
  void print(std::ostream& os) const {
    for (std::size_t i = 0; i < notes_.size(); ++i) os << "[" << i + 1 << "] " << notes_[i] << '\n';
  }

 private:
  std::vector<std::string> notes_;
};

std::string tflops(double flops, double ms) { return std::isfinite(ms) ? sig3(flops / (ms * 1e-3) / 1e12) : "-"; }

// Rows of rungs that do not take the run's dtype at all (fp32, the default, for every tensor-core
// rung: dozens of versions) stay out of a table that has other rows, and are named in one line
// under it instead, a line for each set of dtypes they take.
bool takes_dtype(const Rung& r, DType t) {
  const auto& d = r.caps().dtypes;
  return std::find(d.begin(), d.end(), t) != d.end();
}

template <class R>
std::vector<const R*> shown_rows(const std::vector<R>& rows, DType t) {
  std::vector<const R*> shown;
  for (const R& r : rows)
    if (!(r.refused && !takes_dtype(*r.rung, t))) shown.push_back(&r);
  if (shown.empty())  // every row: keep them all, each with its reason
    for (const R& r : rows) shown.push_back(&r);
  return shown;
}

template <class R>
void print_left_out(const std::vector<R>& rows, const std::vector<const R*>& shown, DType t, std::ostream& os) {
  std::vector<std::string> takes;  // each set of dtypes, in first-seen order
  std::map<std::string, std::vector<std::vector<const Rung*>>> by_takes;  // -> each rung's versions
  for (const R& r : rows) {
    if (std::find(shown.begin(), shown.end(), &r) != shown.end()) continue;
    std::string allowed;
    for (DType d : r.rung->caps().dtypes) allowed += (allowed.empty() ? "" : " and ") + std::string(dtype_name(d));
    if (!by_takes.count(allowed)) takes.push_back(allowed);
    auto& rungs = by_takes[allowed];
    if (rungs.empty() || rungs.back().front()->step() != r.rung->step()) rungs.push_back({});
    rungs.back().push_back(r.rung);
  }
  for (const std::string& a : takes) {
    std::string list;
    std::size_t n = 0;
    for (const auto& versions : by_takes[a]) {
      const std::string rung = versions.front()->step();
      const auto version = [&](const Rung* v) { return v->name().substr(std::min(v->name().size(), rung.size() + 1)); };
      list += (list.empty() ? "" : ", ") +
              (versions.size() == 1 ? versions.front()->name()
                                    : rung + " (" + std::to_string(versions.size()) + " versions: " +
                                          version(versions.front()) + " to " + version(versions.back()) + ")");
      n += versions.size();
    }
    os << "Not in the table: " << n << " version" << (n > 1 ? "s" : "") << " that take " << a << ", not "
       << dtype_name(t) << " (--dtype " << a.substr(a.rfind(' ') + 1) << " runs them): " << list << ".\n";
  }
}

// A relative L2 error, or how many elements are bad (see rel_error).
std::string error_cell(const ErrorStats& e) {
  return e.bad > 0 ? std::to_string(e.bad) + " bad" : fmt("%.1e", e.rel_l2);
}

void print_table(const std::vector<Row>& rows, const Problem& p, std::ostream& os) {
  Table t({"rung", "device", "dtype", "time (ms)", "TFLOP/s", "speed-up", "modelled IO",
           "extra memory", "rel err O", "check"},
          {false, false, false, true, true, true, true, true, true, false});
  Notes notes;
  auto note_ref = [&](const std::string& n) { return notes.ref(n); };
  const double flops = p.shape.flops_forward();
  const std::vector<const Row*> shown = shown_rows(rows, p.dtype);
  for (const Row* row : shown) {
    const Row& r = *row;
    const bool ran = std::isfinite(r.ms);
    const bool sized = std::isfinite(r.extra_bytes);
    std::string check = r.status_name();
    if (!r.note.empty()) check += note_ref(r.note);
    t.add({r.rung->name(), r.device, dtype_name(p.dtype), ran ? sig3(r.ms) : "-",
           ran ? sig3(flops / (r.ms * 1e-3) / 1e12) : "-",
           std::isfinite(r.speedup) ? sig3(r.speedup) + "x" : "-",
           sized ? describe_bytes(r.io.total()) : "-", sized ? describe_bytes(r.extra_bytes) : "-",
           rel_error(r), check});
  }
  t.print(os);
  notes.print(os);
  print_left_out(rows, shown, p.dtype, os);
}

void print_backward_table(const std::vector<BackwardRow>& rows, const Problem& p, std::ostream& os) {
  const AttentionShape& s = p.shape;
  os << "\nBackward pass of the rungs that have one: dQ, dK, dV from Q, K, V, O, lse and a random dO. "
     << "'bwd' is the backward alone (on the O and lse of the rung's own forward), 'fwd+bwd' a forward "
     << "followed by a backward; TFLOP/s count 2.5x and 3.5x the forward's FLOPs. Modelled IO is the "
     << "backward's closed-form traffic (- where the rung gives none), extra memory its workspace. The "
     << "rel errs are of dQ, dK, dV against the fp64 oracle's backward.\n";
  // Say where a row's problem is not the one above, and why.
  std::vector<std::string> said;
  for (const BackwardRow& r : rows) {
    // Only rows that ran: a row that sat out the problem was checked on nothing.
    if (r.refused || r.status == Status::Skipped) continue;
    const bool twin = r.rung->backend() == Backend::Cpu;
    std::string line;
    if (!same_problem(r.shape, s))
      line = "CPU twins: the backward is timed and checked on " + r.shape.str() + ", a smaller problem (" +
             fmt("%.3g", r.shape.flops_backward() / 1e9) + " GFLOP of backward): past B*H*Nq*Nk*d = 2^24 a " +
             "twin's backward takes one group of heads and shorter sequences, which keeps the default ladder quick.";
    else if (!same_problem(r.check_shape, r.shape))
      line = std::string(twin ? "CPU twins" : "GPU rungs") + ": timed on the problem above; gradients checked on " +
             r.check_shape.str() + " (the fp64 oracle holds N x N matrices of every head; past B*H*Nq*Nk*d " +
             "= 2^26 it checks one group of heads on shorter sequences).";
    if (!line.empty() && std::find(said.begin(), said.end(), line) == said.end()) {
      said.push_back(line);
      os << line << '\n';
    }
  }
  os << '\n';
  Table t({"rung", "device", "dtype", "bwd (ms)", "bwd TFLOP/s", "fwd+bwd (ms)", "fwd+bwd TFLOP/s",
           "modelled IO", "extra memory", "rel err dQ", "rel err dK", "rel err dV", "check"},
          {false, false, false, true, true, true, true, true, true, true, true, true, false});
  Notes notes;
  const std::vector<const BackwardRow*> shown = shown_rows(rows, p.dtype);
  for (const BackwardRow* row : shown) {
    const BackwardRow& r = *row;
    std::string check = status_name(r.status);
    if (!r.note.empty()) check += notes.ref(r.note);
    const bool checked = r.check.has_value();
    t.add({r.rung->name(), r.device, dtype_name(p.dtype), std::isfinite(r.bwd_ms) ? sig3(r.bwd_ms) : "-",
           tflops(r.shape.flops_backward(), r.bwd_ms), std::isfinite(r.fwd_bwd_ms) ? sig3(r.fwd_bwd_ms) : "-",
           tflops(3.5 * r.shape.flops_forward(), r.fwd_bwd_ms),
           std::isfinite(r.io.total()) ? describe_bytes(r.io.total()) : "-",
           std::isfinite(r.extra_bytes) ? describe_bytes(r.extra_bytes) : "-",
           checked ? error_cell(r.check->dq) : "-", checked ? error_cell(r.check->dk) : "-",
           checked ? error_cell(r.check->dv) : "-", check});
  }
  t.print(os);
  notes.print(os);
  print_left_out(rows, shown, p.dtype, os);
}

// floor_l2: the condition floor (how far inputs changed by the tolerance move the exact answer).
JsonObject error_json(const ErrorStats& e, double floor) {
  JsonObject o;
  o.num("rel_l2", e.rel_l2).num("max_abs", e.max_abs).num("bad", double(e.bad)).num("l2", e.l2)
      .num("ref_l2", e.ref_l2).num("floor_l2", floor);
  return o;
}

std::string json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ",\n    " : "\n    ") + items[i];
  return out + (items.empty() ? "]" : "\n  ]");
}

void write_json(const std::string& path, const std::vector<Row>& rows,
                const std::vector<BackwardRow>& backward_rows, const Problem& p, const Options& opt,
                bool gpu_ok, const std::string& gpu_info) {
  const AttentionShape& s = p.shape;
  JsonObject problem;
  problem.num("batch", s.batch).num("heads", s.heads).num("kv_heads", s.kv_heads)
      .num("seq_q", s.seq_q).num("seq_k", s.seq_k).num("head_dim", s.head_dim)
      .boolean("causal", s.causal).num("scale", s.softmax_scale()).str("dtype", dtype_name(p.dtype))
      .raw("seed", std::to_string(p.oracle.seed())).str("inputs", input_kind_name(p.oracle.kind()))
      .num("flops_forward", s.flops_forward())
      .num("flops_backward", s.flops_backward()).num("flops_forward_backward", 3.5 * s.flops_forward())
      .num("verified_rows", double(p.verify_rows.empty() ? s.seq_q : int64_t(p.verify_rows.size())))
      .str("shape", s.str()).boolean("backward", opt.backward);
  if (opt.backward) problem.raw("dout_seed", std::to_string(p.oracle.dout_seed()));
  JsonObject device;
  device.boolean("gpu_available", gpu_ok).str(gpu_ok ? "gpu_name" : "gpu_skipped_reason", gpu_info)
      .boolean("built_with_cuda", gpu::built_with_cuda()).str("date", bench::today_utc())
      .num("warmup_cpu", opt.warmup_for(Backend::Cpu)).num("reps_cpu", opt.reps_for(Backend::Cpu))
      .num("warmup_gpu", opt.warmup_for(Backend::Cuda)).num("reps_gpu", opt.reps_for(Backend::Cuda));
  std::vector<std::string> row_list;
  for (const Row& r : rows) {
    JsonObject o;
    o.str("rung", r.rung->name()).str("backend", backend_name(r.rung->backend()))
        .str("device", r.device).str("dtype", dtype_name(p.dtype)).str("status", r.status_name())
        .str("note", r.note).num("time_ms", r.ms)
        .num("tflops", s.flops_forward() / (r.ms * 1e-3) / 1e12).num("speedup", r.speedup)
        .num("modelled_read_bytes", std::isfinite(r.extra_bytes) ? r.io.read : kNaN)
        .num("modelled_written_bytes", std::isfinite(r.extra_bytes) ? r.io.written : kNaN)
        .num("modelled_bytes", std::isfinite(r.extra_bytes) ? r.io.total() : kNaN)
        .num("counted_bytes", r.counted_io).num("extra_bytes", r.extra_bytes);
    if (r.check) {
      const ForwardCheck& c = *r.check;
      o.num("o_rel_l2", c.o.rel_l2).num("o_max_abs", c.o.max_abs).num("o_bad", double(c.o.bad))
          .num("lse_rel_l2", c.lse.rel_l2).num("lse_max_abs", c.lse.max_abs)
          .num("lse_bad", double(c.lse.bad)).num("tolerance", tolerance(p.dtype)).num("o_l2", c.o.l2)
          .num("o_ref_l2", c.o.ref_l2).num("o_floor_l2", c.o_floor).num("lse_floor", c.lse_floor);
    }
    row_list.push_back(o.dump("    "));
  }
  // The backward rows: times of `shape` (the problem, or a smaller one for a CPU twin), gradients
  // checked on `check_shape`.
  std::vector<std::string> bwd_list;
  for (const BackwardRow& r : backward_rows) {
    const double f = r.shape.flops_forward();
    JsonObject o;
    o.str("rung", r.rung->name()).str("backend", backend_name(r.rung->backend()))
        .str("device", r.device).str("dtype", dtype_name(p.dtype)).str("status", status_name(r.status))
        .str("note", r.note).str("shape", r.shape.str()).str("check_shape", r.check_shape.str())
        .num("flops_backward", 2.5 * f).num("flops_forward_backward", 3.5 * f).num("bwd_time_ms", r.bwd_ms)
        .num("bwd_tflops", 2.5 * f / (r.bwd_ms * 1e-3) / 1e12).num("fwd_bwd_time_ms", r.fwd_bwd_ms)
        .num("fwd_bwd_tflops", 3.5 * f / (r.fwd_bwd_ms * 1e-3) / 1e12)
        .num("modelled_read_bytes", r.io.read).num("modelled_written_bytes", r.io.written)
        .num("modelled_bytes", r.io.total()).num("counted_bytes", r.counted_io).num("extra_bytes", r.extra_bytes)
        .num("fwd_bwd_extra_bytes", r.fwd_bwd_extra_bytes);
    if (r.check)
      o.raw("dq", error_json(r.check->dq, r.check->dq_floor).dump("    "))
          .raw("dk", error_json(r.check->dk, r.check->dk_floor).dump("    "))
          .raw("dv", error_json(r.check->dv, r.check->dv_floor).dump("    ")).num("tolerance", tolerance(p.dtype));
    bwd_list.push_back(o.dump("    "));
  }
  JsonObject top;
  top.raw("problem", problem.dump("  ")).raw("device", device.dump("  ")).raw("rows", json_list(row_list))
      .raw("backward_rows", json_list(bwd_list));
  std::ofstream f(path);
  if (!f) throw InputError("--json: cannot write '" + path + "': " + std::strerror(errno));
  f << top.dump() << '\n';
  f.close();
  // A full disk shows only here; "wrote FILE" and exit status 0 over a truncated file would not do.
  if (!f) throw std::runtime_error("--json: writing '" + path + "' failed");
}

void list_rungs(std::ostream& os) {
  Table t({"rung", "backend", "dtypes", "head dims", "causal", "GQA", "backward", "idea"},
          {false, false, false, false, false, false, false, false});
  for (const Rung* r : Registry::instance().all()) {
    const Capabilities c = r->caps();
    std::string dtypes, dims;
    for (DType d : c.dtypes) dtypes += (dtypes.empty() ? "" : ",") + std::string(dtype_name(d));
    for (int d : c.head_dims) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    if (dims.empty()) dims = "1.." + std::to_string(c.max_head_dim);
    auto yn = [](bool b) { return std::string(b ? "yes" : "no"); };
    t.add({r->name(), backend_name(r->backend()), dtypes, dims, yn(c.causal), yn(c.gqa),
           yn(c.backward), r->idea()});
  }
  t.print(os);
  os << "\nRung 10, decoding (ladder --decode): its twin (cpu) and kernels (cuda), fp16 and bf16\n";
  Table d({"version", "backend", "paged", "idea"}, {false, false, false, false});
  d.add({"10_decoding", "cpu", "yes", "the twin: split-KV with a group's rows packed, contiguous or paged cache"});
  for (const decoding::Kernel& k : decoding::kernels()) d.add({k.name, "cuda", k.paged ? "yes" : "no", k.idea});
  d.print(os);
  os << "\nRung 11, ring attention (ladder --ring P): one sequence over P ranks\n";
  Table g({"version", "backend", "idea"}, {false, false, false});
  g.add({"11_ring_attention", "cpu", "the twin: P ranks simulated in one process, every byte sent counted"});
#ifdef FLASH_LADDER_HAS_CUDA
  g.add({"11_ring_attention/v1_ring", "cuda", "every rank on one GPU, the transfers as device copies"});
#endif
#ifdef FLASH_LADDER_HAS_NCCL
  g.add({"11_ring_attention/v2_nccl", "cuda", "a rank a GPU, the shards over NCCL, set up on every call"});
  for (const ring::NcclRingVersion& v : ring::kNcclRingVersions)
    g.add({std::string("11_ring_attention/") + v.name, "cuda", v.idea});
#elif defined(FLASH_LADDER_HAS_CUDA)
  g.add({"11_ring_attention/v2_nccl .. v5_backward", "-", "not in this build: CMake found no NCCL"});
#else
  g.add({"11_ring_attention/v2_nccl .. v5_backward", "-", "not in this build: it has no CUDA (and so no NCCL)"});
#endif
  g.print(os);
}

// ---- --decode: rung 10 ---------------------------------------------------------------------------

gpu::DeviceBuffer upload(const std::vector<unsigned char>& x) {
  gpu::DeviceBuffer d(std::max<std::size_t>(x.size(), 16));
  if (!x.empty()) d.upload(x.data(), x.size());
  return d;
}
gpu::DeviceBuffer upload_ints(const std::vector<int32_t>& x) {
  gpu::DeviceBuffer d(std::max<std::size_t>(x.size() * 4, 16));
  if (!x.empty()) d.upload(x.data(), x.size() * 4);
  return d;
}

// Rung 10's problem from the flags: B sequences of ragged lengths (the longest Nk), Nq new rows.
struct DecodeRun {
  decoding::DecodeShape s;  // contiguous; the paged copy is made from it
  std::vector<int32_t> len;
  std::vector<float> q, k, v;  // q [B, H, Nq, d]; k, v [B, Hkv, Nk, d], slots past a length NaN
};

DecodeRun make_decode_run(const Options& o) {
  DecodeRun r;
  decoding::DecodeShape& s = r.s;
  s.batch = o.batch, s.heads = o.heads, s.kv_heads = o.kv_heads.value_or(o.heads);
  s.seq_q = o.seq_q.value_or(1), s.head_dim = o.head_dim, s.causal = o.causal, s.scale = o.scale;
  s.capacity = o.seq_k.value_or(o.seq);
  s.validate();
  if (s.capacity > std::numeric_limits<int32_t>::max()) throw InputError("--seq-k: lengths are int32");
  for (int64_t b = 0; b < s.batch; ++b) r.len.push_back(int32_t(s.capacity - b * (s.capacity / (2 * s.batch))));
  const double values = double(s.batch) * double(s.kv_heads) * double(s.capacity) * double(s.head_dim);
  require_host_memory(values * 4 * 2 * (o.page_size > 0 ? 2 : 1) + values * 2 * 2,
                      "the KV cache (" + s.str() + ")", "a smaller --seq-k, --batch or --kv-heads would fit");
  const Inputs in = make_inputs(
      AttentionShape{s.batch, s.heads, s.kv_heads, s.seq_q, s.capacity, s.head_dim, false, 0.0}, o.dtype, o.seed);
  r.q = in.q, r.k = in.k, r.v = in.v;
  for (int64_t b = 0; b < s.batch; ++b)  // slots past a sequence's length: NaN, never read
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      const auto from = std::ptrdiff_t(((b * s.kv_heads + h) * s.capacity + r.len[std::size_t(b)]) * s.head_dim);
      const auto to = std::ptrdiff_t(((b * s.kv_heads + h) + 1) * s.capacity * s.head_dim);
      std::fill(r.k.begin() + from, r.k.begin() + to, std::numeric_limits<float>::quiet_NaN());
      std::fill(r.v.begin() + from, r.v.begin() + to, std::numeric_limits<float>::quiet_NaN());
    }
  return r;
}

// The fp64 oracle, sequence by sequence (each on its own keys): O [B, H, Nq, d] and lse.
void decode_oracle(const DecodeRun& r, std::vector<double>* o, std::vector<double>* lse) {
  const decoding::DecodeShape& s = r.s;
  const int64_t d = s.head_dim, per_o = s.heads * s.seq_q * d, per_l = s.heads * s.seq_q;
  o->assign(std::size_t(s.batch * per_o), 0.0);
  lse->assign(std::size_t(s.batch * per_l), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t L = r.len[std::size_t(b)];
    if (L == 0) continue;
    std::vector<float> kb, vb;
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      const auto from = std::ptrdiff_t((b * s.kv_heads + h) * s.capacity * d);
      kb.insert(kb.end(), r.k.begin() + from, r.k.begin() + from + L * d);
      vb.insert(vb.end(), r.v.begin() + from, r.v.begin() + from + L * d);
    }
    const ReferenceForward ref = reference_forward(
        AttentionShape{1, s.heads, s.kv_heads, s.seq_q, L, d, s.causal, s.scale}, r.q.data() + b * per_o, kb.data(),
        vb.data());
    std::copy(ref.o.begin(), ref.o.end(), o->begin() + b * per_o);
    std::copy(ref.lse.begin(), ref.lse.end(), lse->begin() + b * per_l);
  }
}

int decode_main(const Options& opt) {
  if (!opt.json.empty() || opt.rungs != "all" || opt.inputs != InputKind::Normal || opt.deterministic ||
      opt.verify_rows != 0)
    throw UsageError("--decode takes the shape flags, --dtype, --seed, --device, --warmup, --reps, --page-size, "
                     "--splits and --no-ceiling; --json, --rungs, --inputs, --verify-rows and --deterministic are for the other rungs");
  if (opt.dtype_given && opt.dtype != DType::F16 && opt.dtype != DType::BF16)
    throw InputError("--decode runs fp16 and bf16 (rung 10's dtypes), not " + std::string(dtype_name(opt.dtype)));
  if (opt.page_size > 0 && opt.page_size % 16 != 0)
    throw UsageError("--page-size must be a multiple of 16 (or 0 for a contiguous cache), got " +
                     std::to_string(opt.page_size));
  const DType t = opt.dtype_given ? opt.dtype : DType::BF16;
  Options o = opt;
  o.dtype = t;
  const DecodeRun run = make_decode_run(o);
  decoding::DecodeShape s = run.s;
  std::vector<float> k = run.k, v = run.v;
  std::vector<int32_t> table;
  if (opt.page_size > 0) {
    decoding::PagedCopy paged =
        decoding::to_paged(s, run.k, run.v, opt.page_size, opt.seed + 7, 3, std::numeric_limits<float>::quiet_NaN());
    s = paged.shape;
    k = std::move(paged.k), v = std::move(paged.v), table = std::move(paged.table);
  }
  const bench::GpuChoice gpu = bench::choose_gpu(opt.device, "--device cuda");
  const int sms = gpu.use ? gpu::sm_count() : 132;
  const int splits = opt.splits > 0 ? int(opt.splits) : decoding::choose_splits(s, s.capacity, sms);
  const double kv_bytes = [&] {
    double n = 0;
    for (int32_t L : run.len) n += 2.0 * double(L) * double(s.kv_heads) * double(s.head_dim) * dtype_bytes(t);
    return n;
  }();
  std::string lens;
  for (int32_t L : run.len) lens += (lens.empty() ? "" : ",") + std::to_string(L);
  std::cout << "Flash Ladder, rung 10 (decoding): " << s.str() << ", " << dtype_name(t) << ", lengths {" << lens
            << "}, " << splits << " piece" << (splits > 1 ? "s" : "") << " per sequence"
            << (opt.splits > 0 ? ""
                : gpu.use  ? " (chosen for this GPU's " + std::to_string(sms) + " SMs)"
                           : " (chosen for " + std::to_string(sms) + " SMs, an H100's or H200's: no GPU here)")
            << "\nK and V: "
            << describe_bytes(kv_bytes) << " read once per KV head; checked against the fp64 oracle, every sequence\n";
  if (opt.device == "all" && !gpu.use) std::cout << "GPU kernels skipped: " << gpu.why << '\n';
  std::cerr << "fp64 oracle...\n";
  std::vector<double> ref_o, ref_l;
  decode_oracle(run, &ref_o, &ref_l);

  const std::vector<unsigned char> q8 = to_storage(run.q, t), k8 = to_storage(k, t), v8 = to_storage(v, t);
  const std::size_t o_bytes = q8.size(), l_count = ref_l.size(), ws_bytes = decoding::workspace_bytes(s, splits);
  Table tab({"version", "backend", "ms", "K,V GB/s", "of stream read", "O rel err", "lse max err", "status"},
            {false, false, true, true, true, true, true, false});
  int failed = 0;
  // One row: check O and lse (downloaded into o8, lse), time `call`.
  auto add_row = [&](const std::string& name, const std::string& backend, const std::vector<unsigned char>& o8,
                     const std::vector<float>& lse, double ms, double ceiling) {
    const std::vector<float> of = from_storage(o8, t);
    const ErrorStats eo = compare(of.data(), ref_o.data(), int64_t(of.size()));
    const ErrorStats el = compare(lse.data(), ref_l.data(), int64_t(lse.size()));
    const bool ok = passes(eo, t) && el.bad == 0 && el.max_abs < 1e-3;
    failed += !ok;
    const double gbs = kv_bytes / (ms * 1e-3) / 1e9;
    tab.add({name, backend, fmt("%.4g", ms), fmt("%.0f", gbs), ceiling > 0 ? fmt("%.0f%%", 100 * gbs / ceiling) : "-",
             fmt("%.2e", eo.rel_l2), fmt("%.2e", el.max_abs), ok ? "PASS" : "FAIL"});
  };
  decoding::DecodeArgs a;
  a.splits = splits;
  a.sm_count = sms;
  if (opt.device != "cuda") {  // the twin
    if (kv_bytes > 4e8) {
      tab.add({"10_decoding", "cpu", "-", "-", "-", "-", "-", "skipped: K and V past 400 MB (--device cpu is slow)"});
    } else {
      std::vector<unsigned char> o8(o_bytes), ws(ws_bytes);
      std::vector<float> lse(l_count);
      a.q = q8.data(), a.k = k8.data(), a.v = v8.data(), a.page_table = table.empty() ? nullptr : table.data();
      a.kv_len = run.len.data(), a.o = o8.data(), a.lse = lse.data(), a.workspace = ws.empty() ? nullptr : ws.data();
      std::cerr << "10_decoding (cpu)...\n";
      const double ms = bench::host_ms([&] { decoding::twin_decode(s, t, a); });
      add_row("10_decoding", "cpu", o8, lse, ms, 0);
    }
  }
  if (gpu.use) {
    const gpu::DeviceBuffer dq = upload(q8), dk = upload(k8), dv = upload(v8),
                            dt = upload_ints(table), dl = upload_ints(run.len);
    gpu::DeviceBuffer dout(o_bytes), dlse(l_count * 4), dws(std::max<std::size_t>(ws_bytes, 16));
    // The ceiling: a streaming read of a buffer at least as large as K and V (and 1 GB).
    const std::size_t read_bytes = std::max<std::size_t>(std::size_t(1) << 30, std::size_t(kv_bytes)) / 16 * 16;
    double ceiling = 0;
    if (!opt.no_ceiling) {
      gpu::require_memory(read_bytes, "the streaming-read probe");
      gpu::DeviceBuffer big(read_bytes), sink(16);
      big.poison(), sink.poison();  // their values do not matter, but initcheck reports reads of never-written memory
      const double ms = gpu::time_ms([&] { decoding::stream_read(big.get(), read_bytes, static_cast<float*>(sink.get()), nullptr); },
                                     1, 5, [] { gpu::flush_l2(); });
      ceiling = double(read_bytes) / (ms * 1e-3) / 1e9;
      tab.add({"stream_read", "cuda", fmt("%.4g", ms), fmt("%.0f", ceiling), "100%", "-", "-", "the ceiling"});
    }
    a.q = dq.get(), a.k = dk.get(), a.v = dv.get();
    a.page_table = table.empty() ? nullptr : static_cast<const int32_t*>(dt.get());
    a.kv_len = static_cast<const int32_t*>(dl.get()), a.o = dout.get(), a.lse = static_cast<float*>(dlse.get());
    a.workspace = dws.get();
    for (const decoding::Kernel& kern : decoding::kernels()) {
      if (s.paged() && !kern.paged) {
        tab.add({kern.name, "cuda", "-", "-", "-", "-", "-", "skipped: no paged path (--page-size 0 runs it)"});
        continue;
      }
      std::cerr << kern.name << "...\n";
      dout.poison(), dlse.poison();
      decoding::decode(kern, s, t, a, dws.size());
      gpu::synchronize();
      std::vector<unsigned char> o8(o_bytes);
      std::vector<float> lse(l_count);
      dout.download(o8.data(), o8.size());
      dlse.download(lse.data(), lse.size() * 4);
      const double ms = gpu::time_ms([&] { decoding::decode(kern, s, t, a, dws.size()); }, opt.warmup_for(Backend::Cuda),
                                     opt.reps_for(Backend::Cuda), [] { gpu::flush_l2(); });
      add_row(kern.name, "cuda", o8, lse, ms, ceiling);
    }
  }
  std::cout << '\n';
  tab.print(std::cout);
  std::cout << "\nK,V GB/s: the bytes of K and V of every sequence (once per KV head) over the time; "
            << "rows pass within the dtype's tolerance (" << fmt("%.0e", tolerance(t)) << ") and lse within 1e-3\n";
  return failed ? 1 : 0;
}

// The query rows the oracle checks for --verify-rows on a sequence of n rows: all (empty) up to
// kAllRowsUpTo, else a sample; a count asked for, or -1 for all.
std::vector<int64_t> rows_to_verify(const Options& opt, int64_t n) {
  std::vector<int64_t> rows;
  if (opt.verify_rows > 0) rows = sample_rows(n, opt.verify_rows);
  else if (opt.verify_rows == 0 && n > kAllRowsUpTo) rows = sample_rows(n, kSampledRows);
  if (int64_t(rows.size()) == n) rows.clear();
  return rows;
}

// ---- --ring: rung 11 -----------------------------------------------------------------------------

// --ring P --device cuda: the ring's forward over NCCL on GPUs 0 .. P − 1, a thread a rank, its newest
// version opened once (fl::ring::nccl_ring_forward_on_gpus), checked against the fp64 oracle and timed.
int ring_gpu_main(const Options& opt) {
  if (!opt.json.empty() || opt.rungs != "all" || opt.deterministic || opt.page_size || opt.splits || opt.no_ceiling)
    throw UsageError("--ring P --device cuda runs rung 11's forward on P GPUs: it takes the shape flags, --dtype, "
                     "--seed, --inputs, --sharding, --verify-rows and --reps");
  ring::RingShape s{opt.shape(), opt.ring, opt.sharding};
  s.validate();
  const DType t = opt.dtype;
  const int64_t n = s.seq();
  const std::vector<int64_t> rows = rows_to_verify(opt, n);
  if (std::string why; !gpu::available(&why))
    throw InputError("--ring P --device cuda: no GPU to run on (" + why + "); without --device cuda the ring runs "
                     "as its CPU twin");
  const Rung& local = ring::gpu_local_rung(t);  // refuses fp32, and a build or GPU without one
  Oracle oracle(s.attn, t, opt.seed, opt.inputs, rows, opt.seed + 1);
  oracle.on_compute = [](const std::string& what) { std::cerr << what << "...\n"; };
  std::cout << "Flash Ladder, rung 11 (ring attention over NCCL, a GPU a rank, " << ring::nccl_ring_versions().back()
            << "): " << s.str() << ", " << dtype_name(t) << ", inputs " << input_kind_name(opt.inputs) << ", seed "
            << opt.seed << "; each step runs " << local.name() << "\n";
  const Inputs& in = oracle.inputs();
  const std::vector<unsigned char> q = to_storage(in.q, t), k = to_storage(in.k, t), v = to_storage(in.v, t);
  std::vector<unsigned char> o(q.size());
  std::vector<float> lse(std::size_t(s.attn.lse_elems()), std::numeric_limits<float>::quiet_NaN());
  const int reps = opt.reps_for(Backend::Cuda);
  double ms = NAN;
  std::cerr << "the ring's forward on GPUs 0.." << s.ranks - 1 << ", then " << reps << " timed calls...\n";
  const std::vector<std::string> errors =
      ring::nccl_ring_forward_on_gpus(s, t, q.data(), k.data(), v.data(), o.data(), lse.data(), reps, &ms);
  bool ran = true;
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) std::cout << "rank " << r << " failed: " << errors[r] << '\n', ran = false;
  if (!ran) return 1;
  Table tab({"rank", "GPU", "chunks"}, {true, true, false});
  for (int64_t r = 0; r < s.ranks; ++r) {
    std::string chunks;
    for (int64_t c : s.chunks_of(r)) chunks += (chunks.empty() ? "" : ",") + std::to_string(c);
    tab.add({std::to_string(r), std::to_string(r), chunks});
  }
  std::cout << '\n';
  tab.print(std::cout);
  const ForwardCheck fc = oracle.check_forward_of(ForwardOutputs{from_storage(o, t), lse});
  std::cout << "\nforward: " << fc.str() << " (" << (rows.empty() ? "every row" : std::to_string(rows.size()) + " sampled rows")
            << " of each head)\n"
            << "time: " << sig3(ms) << " ms a call, the median of " << reps << " (rank 0's wall clock; "
            << tflops(s.attn.flops_forward(), ms) << " TFLOP/s over " << s.ranks << (s.ranks == 1 ? " GPU)\n" : " GPUs)\n");
  return fc.pass ? 0 : 1;
}

int ring_main(const Options& opt) {
  if (opt.device == "cuda") return ring_gpu_main(opt);
  if (!opt.json.empty() || opt.rungs != "all" || opt.deterministic || opt.verify_rows != 0 || opt.page_size ||
      opt.splits || opt.no_ceiling)
    throw UsageError("--ring runs rung 11's CPU twin (--device cuda: its forward on GPUs): it takes the shape "
                     "flags, --dtype, --seed, --inputs and --sharding; --json, --rungs, --verify-rows, "
                     "--deterministic, --page-size, --splits and --no-ceiling are for the other rungs");
  ring::RingShape s{opt.shape(), opt.ring, opt.sharding};
  s.validate();
  const DType t = opt.dtype;
  const double n = double(s.attn.batch) * double(s.attn.heads) * double(s.seq()) * double(s.seq()) * double(s.attn.head_dim);
  if (n > kTwinBackwardLimit * 4)
    throw InputError("--ring: the twin and the oracle hold N x N scores; B·H·N²·d = " + fmt("%.3g", n) +
                     " is past " + fmt("%.3g", kTwinBackwardLimit * 4) + " (a smaller --seq, --heads or --batch)");
  std::cout << "Flash Ladder, rung 11 (ring attention, simulated): " << s.str() << ", " << dtype_name(t) << ", inputs "
            << input_kind_name(opt.inputs) << ", seed " << opt.seed << "; each step runs "
            << ring::local_rung(t).name() << "'s twin\n";
  const Inputs in = make_inputs(s.attn, t, opt.seed, opt.inputs);
  std::cerr << "the ring's forward...\n";
  const ring::RingForwardRun f = ring::run_ring_forward(s, t, in);
  const ForwardCheck fc =
      check_forward(s.attn, t, f.out, reference_forward(s.attn, in.q.data(), in.k.data(), in.v.data()));
  std::cerr << "the ring's backward...\n";
  const BackwardInputs bin = make_backward_inputs(s.attn, t, in, opt.seed + 1);
  const ring::RingBackwardRun b = ring::run_ring_backward(s, t, in, bin);
  const BackwardCheck bc =
      check_backward(t, b.grads, reference_backward(s.attn, in.q.data(), in.k.data(), in.v.data(), bin.dout.data()));
  const ring::RingIo m = ring::ring_io_model(s, t);

  Table tab({"rank", "chunks", "pairs full", "diagonal", "skipped", "scores", "fwd sent", "bwd sent"},
            {true, false, true, true, true, true, true, true});
  for (int64_t r = 0; r < s.ranks; ++r) {
    std::string chunks;
    for (int64_t c : s.chunks_of(r)) chunks += (chunks.empty() ? "" : ",") + std::to_string(c);
    const ring::RankStats& fr = f.stats.ranks[std::size_t(r)];
    const ring::RankStats& br = b.stats.ranks[std::size_t(r)];
    tab.add({std::to_string(r), chunks, std::to_string(fr.pairs_full), std::to_string(fr.pairs_diagonal),
             std::to_string(fr.pairs_skipped), std::to_string(fr.scores), describe_bytes(double(fr.bytes_sent)),
             describe_bytes(double(br.bytes_sent))});
  }
  std::cout << '\n';
  tab.print(std::cout);
  std::cout << "\nclosed form per rank: forward " << describe_bytes(m.forward_per_rank) << ", backward "
            << describe_bytes(m.backward_per_rank) << " (a K/V shard is " << describe_bytes(m.kv_shard)
            << ", a dK/dV accumulator " << describe_bytes(m.dkv_shard) << ")\n"
            << "scores: the (query, key) pairs a rank's rows see, per head: the work the sharding balances\n\n"
            << "forward:  " << fc.str() << '\n'
            << "backward: " << bc.str() << '\n';
  bool io_ok = true;
  for (int64_t r = 0; r < s.ranks; ++r)
    io_ok = io_ok && double(f.stats.ranks[std::size_t(r)].bytes_sent) == m.forward_per_rank &&
            double(b.stats.ranks[std::size_t(r)].bytes_sent) == m.backward_per_rank;
  std::cout << "bytes sent: " << (io_ok ? "every rank's equal the closed form" : "DIFFER from the closed form") << '\n';
  return fc.pass && bc.pass && io_ok ? 0 : 1;
}

// ---- main ----------------------------------------------------------------------------------------
int ladder_main(int argc, char** argv) {
  const Options opt = parse_args(argc, argv);
  if (opt.help) {
    std::cout << kUsage;
    return 0;
  }
  if (opt.list) {
    list_rungs(std::cout);
    return 0;
  }
  if (opt.decode && opt.ring) throw UsageError("--decode and --ring are two different problems: give one");
  if (opt.decode) return decode_main(opt);
  if (opt.ring) return ring_main(opt);
  if (opt.page_size || opt.splits || opt.no_ceiling)
    throw UsageError("--page-size, --splits and --no-ceiling go with --decode");

  Problem p;
  p.shape = opt.shape();
  p.shape.validate();
  p.dtype = opt.dtype;
  if (!opt.json.empty()) {  // say so before the work
    // The probe creates the file; a run that dies before writing must not leave it there empty, for
    // tests/gpu_suite.sh takes an existing file for a finished run and json.load()s it.
    std::error_code ec;
    const bool existed = std::filesystem::exists(opt.json, ec);
    if (!std::ofstream(opt.json, std::ios::app))
      throw InputError("--json: cannot write '" + opt.json + "': " + std::strerror(errno));
    if (!existed) std::filesystem::remove(opt.json, ec);
  }

  const bench::GpuChoice gpu_choice = bench::choose_gpu(opt.device, "--device cuda");
  const bool gpu_ok = gpu_choice.use;
  const std::string gpu_name = gpu_ok ? gpu::device_name() : "";

  std::vector<const Rung*> rungs =
      bench::select_rungs(opt.rungs, opt.device != "cuda", opt.device != "cpu" && gpu_ok);
  if (rungs.empty())
    throw InputError("no rung of this build matches --rungs " + opt.rungs + " on --device " + opt.device);
  // One ladder per device: the CPU twins from 00 up, then the GPU rungs, so each speed-up compares
  // a rung with the one below it on the same hardware.
  std::stable_partition(rungs.begin(), rungs.end(),
                        [](const Rung* r) { return r->backend() == Backend::Cpu; });

  const int64_t nq = p.shape.seq_q;
  p.verify_rows = rows_to_verify(opt, nq);
  // Refused before anything is allocated when it cannot fit (exit status 2), with the figures.
  HostNeed need = host_bytes_needed(p, rungs, opt);
  p.forward_skip = std::move(need.forward_skip);
  p.backward_skip = std::move(need.backward_skip);
  require_host_memory(need.total, "this run (" + p.shape.str() + ", " + dtype_name(p.dtype) + ")",
                      "Q, K and V alone are " + describe_bytes(need.inputs) + ", and a smaller --seq, --heads or "
                      "--batch would fit");
  // dO for the backward is drawn from seed + 1, as the tests draw it.
  // The inputs are drawn when the first rung runs: a run whose every rung sits out draws none.
  p.oracle = Oracle(p.shape, p.dtype, opt.seed, opt.inputs, p.verify_rows, opt.seed + 1);
  p.oracle.on_compute = [](const std::string& what) { std::cerr << what << "...\n"; };

  std::cout << "Flash Ladder: " << p.shape.str() << ", " << dtype_name(p.dtype) << ", inputs "
            << input_kind_name(opt.inputs) << ", seed " << opt.seed << '\n'
            << "forward " << fmt("%.3g", p.shape.flops_forward() / 1e9) << " GFLOP; checked against "
            << "the fp64 oracle on "
            << (p.verify_rows.empty() ? "all " + std::to_string(nq)
                                      : std::to_string(p.verify_rows.size()) + " of " + std::to_string(nq))
            << " query rows of every head\n";
  if (opt.device == "all" && !gpu_ok) std::cout << "GPU rungs skipped: " << gpu_choice.why << '\n';
  if (gpu_ok) std::cout << "GPU: " << gpu_name << '\n';
  std::cout << "time: the median of";
  if (opt.device != "cuda")
    std::cout << " " << opt.reps_for(Backend::Cpu) << " runs after " << opt.warmup_for(Backend::Cpu)
              << " warm-up on the CPU" << (gpu_ok ? "," : "");
  if (gpu_ok)
    std::cout << " " << opt.reps_for(Backend::Cuda) << " runs after " << opt.warmup_for(Backend::Cuda)
              << " warm-up on the GPU (CUDA events, L2 flushed before each)";
  std::cout << "\n" << std::endl;  // before the progress lines on stderr

  std::vector<Row> rows;
  const std::string gpu_short = gpu_ok ? bench::short_gpu_name(gpu_name) : "";
  for (const Rung* r : rungs) rows.push_back(run_rung(*r, p, opt, gpu_short));

  std::map<Backend, double> previous_ms;
  for (Row& r : rows) {
    if (!std::isfinite(r.ms)) continue;
    const Backend b = r.rung->backend();
    if (previous_ms.count(b)) r.speedup = previous_ms[b] / r.ms;
    previous_ms[b] = r.ms;
  }

  std::vector<BackwardRow> backward_rows;
  if (opt.backward)
    for (const Rung* r : rungs)
      if (r->caps().backward) backward_rows.push_back(run_backward_rung(*r, p, opt, gpu_short));

  print_table(rows, p, std::cout);
  if (!backward_rows.empty()) print_backward_table(backward_rows, p, std::cout);

  // Tallies, and whether every row that did not run was refused (the rung does not take the problem).
  struct Tally {
    int pass = 0, fail = 0, skipped = 0, overflow = 0;
    bool all_refused = true;
    void add(Status s, bool refused) {
      (s == Status::Pass ? pass : s == Status::Fail ? fail : s == Status::Overflow ? overflow : skipped)++;
      all_refused = all_refused && (s == Status::Skipped && refused);
    }
    std::string str() const {
      return std::to_string(pass) + " passed, " + std::to_string(fail) + " failed, " + std::to_string(skipped) +
             " skipped" + (overflow ? ", " + std::to_string(overflow) + " overflowed as documented" : "");
    }
  } fwd, bwd;
  for (const Row& r : rows) fwd.add(r.status, r.refused);
  for (const BackwardRow& r : backward_rows) bwd.add(r.status, r.refused);
  std::cout << "\n" << (backward_rows.empty() ? "" : "forward: ") << fwd.str();
  if (!backward_rows.empty()) std::cout << "; backward: " << bwd.str();
  std::cout << " (relative L2 tolerance for " << dtype_name(p.dtype) << ": " << fmt("%.0e", tolerance(p.dtype))
            << ", or the condition floor: how far changing every input by that much moves the exact answer)\n";
  if (!opt.json.empty()) {
    write_json(opt.json, rows, backward_rows, p, opt, gpu_ok, gpu_ok ? gpu_name : gpu_choice.why);
    std::cout << "wrote " << opt.json << '\n';
  }
  // Nothing ran: say so rather than end on a table of dashes. When every selected rung refused the
  // problem it is a problem no rung takes (exit status 2); otherwise (the twins sitting out a large
  // problem, too little memory) nothing was wrong, and the notes say why.
  if (fwd.pass + fwd.fail + fwd.overflow + bwd.pass + bwd.fail + bwd.overflow == 0) {
    if (fwd.all_refused && bwd.all_refused) {
      std::cerr << "ladder: no selected rung runs this problem (" << p.shape.str() << ", "
                << dtype_name(p.dtype) << "): each refused it, for the reasons under the table\n";
      if (p.dtype == DType::F32 && !opt.dtype_given)
        std::cerr << "ladder: fp32 is the default dtype; the tensor-core rungs (06 and up) take fp16 and bf16: "
                     "try --dtype bf16\n";
      return 2;
    }
    std::cout << "Nothing ran: every rung was skipped, for the reasons under the table"
              << (backward_rows.empty() ? "" : "s") << ".\n";
    return 0;
  }
  return fwd.fail + bwd.fail ? 1 : 0;
}

}  // namespace
}  // namespace fl

int main(int argc, char** argv) {
  try {
    return fl::ladder_main(argc, argv);
  } catch (const fl::UsageError& e) {
    std::cerr << "ladder: " << e.what() << "\n(ladder --help lists every flag)\n";
    return 2;
  } catch (const fl::InputError& e) {
    std::cerr << "ladder: " << e.what() << '\n';
    return 2;
  } catch (const fl::HostOutOfMemory& e) {
    std::cerr << "ladder: " << e.what() << '\n';
    return 2;
  } catch (const std::bad_alloc&) {
    // The estimate before the run (host_bytes_needed) should have refused it; say what there is.
    std::string source;
    const double available = double(fl::available_host_memory(&source));
    std::cerr << "ladder: out of host memory: this machine has " << fl::describe_bytes(available)
              << " available (" << source << "); a smaller --seq, --heads or --batch fits\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ladder: " << e.what() << '\n';
    return 1;
  }
}
