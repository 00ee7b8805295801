#!/usr/bin/env bash
# The GPU suite: on a machine with a CUDA GPU, one command builds the Hopper preset, runs every test,
# runs compute-sanitizer over every GPU rung on small ragged shapes, and benchmarks the ladder
# against PyTorch's kernels.
#
#   tests/gpu_suite.sh OUTDIR
#
# OUTDIR gets exactly eight files (the device machine hands back at most eight, no folders):
#   suite.log    everything every stage printed
#   summary.txt  one line per stage: PASS / FAIL / SKIP, seconds, and why
#   ptxas.log    ptxas's registers / shared memory / spills for every kernel, from a fresh compile
#   sass.txt     cuobjdump's resource usage and per-kernel instruction counts (FFMA, HMMA, LDL, ...)
#   ladder.json  the ladder program on its default GPU problem and on bigger ones: each rung's
#                forward and, for rungs with a backward pass, its backward (backward_rows)
#   bench.json   ladder_bench's Google Benchmark sweep (fwd, and bwd and fwd+bwd where a rung has them)
#   torch.json   bench/compare_torch.py: each rung against SDPA's flash, cuDNN, efficient, math,
#                forward and backward (rows of phase fwd, bwd, fwd+bwd), and the memory sweep
#                (--memory-sweep: extra memory of a forward+backward against N, rows of kind memory;
#                bench/plot.py --memory torch.json draws docs/figures/backward_memory.png from it);
#                then the decode stage appends bench/compare_decode.py's rows to the same list
#                (rung 10 against the stream-read and copy ceilings and SDPA: rows of kind "ceiling"
#                and "decode"; bench/plot.py --decode torch.json OUT.png draws them). Without a
#                torch stage in the same call, torch.json holds the decode rows alone.
#   io.json      bench/ncu_io.py: DRAM bytes Nsight Compute measured for one forward of each
#                fp32 rung, beside its modelled bytes
#
# Every stage runs even when an earlier one failed (the later ones say SKIP when what they need is
# missing); the exit status is non-zero when any stage failed. The whole suite keeps to a time
# budget (FL_SUITE_BUDGET_S, default 540 s) so that it ends, summary printed, inside a 10-minute
# call: each stage's time limit is cut to what is left.
#
# Environment:
#   FL_SUITE_BUDGET_S  total seconds (default 540)
#   FL_JOBS            build parallelism (default: number of cores)
#   FL_DEPS_DIR        a folder of .deb files (libeigen3-dev, libgtest-dev, libbenchmark-dev,
#                      libbenchmark1debian) unpacked into a private prefix before configuring, for a
#                      machine that has no C++ packages and no network (default: .deps)
#   FL_TORCH_DTYPES    dtypes for compare_torch.py (default fp32,bf16)
#   FL_TORCH_RUNGS     rungs for compare_torch.py, its --rungs (default: every rung in the library)
#   FL_TORCH_PEERS     SDPA backends for compare_torch.py, its --peers (default: all four)
#   FL_TORCH_MEMORY    0: leave out compare_torch.py's memory sweep (default: run it)
#   FL_TORCH_ROUNDS    compare_torch.py's --rounds: each cell's kernels timed in that many rounds of
#                      alternating order (default 1: one after another, the SDPA backends last)
#   FL_DECODE_S        seconds kept for the decode stage when the torch stage runs before it
#                      (default 180, at most half of what is left; compare_decode.py stops starting
#                      cells when its time is up)
#   FL_BUILD_DIR       build folder (default build-hopper, the hopper preset's)
#   FL_KEEP_OBJECTS    set: keep compiled CUDA objects (ptxas.log then covers only what changed)
#   FL_RACECHECK_S     the racecheck stage's time limit (default 220 s; racecheck runs every GPU
#                      kernel at a fraction of its speed, and a full pass over rung 09's versions
#                      takes about that long on an H100: give it a call of its own,
#                      FL_STAGES=racecheck and FL_RACECHECK_S=500, when the default stops it)
#   FL_BENCH_FILTER    the bench stage's --benchmark_filter (a regex over names such as
#                      fwd/08_hopper_forward/v11_tma_store/cuda/bf16/B1_H16_N512_d64_c0; default:
#                      every benchmark). The whole sweep is hundreds of benchmarks at about 7 s each
#                      on an H100 (675 of them, 35 in the stage's 240 s, 2026-11-25): far more than
#                      a call, so a call sweeps a slice, e.g. FL_BENCH_FILTER='^fwd/08_'
#   FL_STAGES          comma list of the stages to run (default: all). Configure and build always
#                      run (with the SASS check about 120 s); on an H100 a 10-minute device call can
#                      take "ctest,memcheck,initcheck" (ctest 160–180 s, each sanitizer about 15 s),
#                      a second "racecheck" (with FL_RACECHECK_S=500), a third "ladder,io,torch,decode"
#                      (ladder about 120 s, io 30 s; torch and decode share what is left) and, for
#                      the Google Benchmark sweep, "bench" with FL_BENCH_FILTER a slice a call.
# shellcheck disable=SC2317  # the stage functions run through `stage`, which shellcheck cannot see
set -u -o pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: tests/gpu_suite.sh OUTDIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$PWD
BUILD=${FL_BUILD_DIR:-build-hopper}
[[ $BUILD == /* ]] || BUILD=$REPO/$BUILD
LOG=$OUT/suite.log
SUMMARY=$OUT/summary.txt
BUDGET=${FL_SUITE_BUDGET_S:-540}
JOBS=${FL_JOBS:-$(nproc 2>/dev/null || echo 8)}
TMP=$(mktemp -d)  # intermediate files live here, never in OUTDIR (eight files come back, no more)
trap 'rm -rf "$TMP"' EXIT
export PYTHONUNBUFFERED=1
: >"$LOG"
: >"$SUMMARY"
START=$SECONDS
FAILED=0
declare -a ROWS=()

say() { echo "$*" | tee -a "$LOG"; }
left() { echo $((BUDGET - (SECONDS - START))); }

# record NAME STATUS SECONDS NOTE
record() {
  ROWS+=("$(printf '%-18s %-5s %5ss  %s' "$1" "$2" "$3" "$4")")
  [[ $2 == FAIL ]] && FAILED=1
  say "=== [$1] $2 in ${3}s${4:+: $4}"
}

# stage NAME LIMIT_S COMMAND...: runs COMMAND (a function of this script or a program) with its
# output tee'd into suite.log, under a time limit cut to what is left of the budget. A stage that
# exits non-zero or runs out of time fails; the suite goes on either way.
stage() {
  local name=$1 limit=$2
  shift 2
  case $name in
    env | deps | configure | build | sass) ;;  # always: every other stage needs them
    *)
      if [[ -n ${FL_STAGES:-} && ",$FL_STAGES," != *",$name,"* ]]; then
        record "$name" SKIP 0 "not in FL_STAGES=$FL_STAGES"
        return 1
      fi
      ;;
  esac
  local remaining
  remaining=$(left)
  if ((remaining < 15)); then
    record "$name" SKIP 0 "out of time (suite budget ${BUDGET}s spent)"
    return 1
  fi
  ((limit > remaining - 10)) && limit=$((remaining - 10))
  say ""
  say "=== [$name] $(date -u +%H:%M:%S), limit ${limit}s: $*"
  local t0=$SECONDS rc
  # The stage runs in a child bash so `timeout` can stop it (and whatever it started) as a whole;
  # shell options are not inherited, so pipefail is set again there.
  timeout --kill-after=15 "$limit" bash -c "set -o pipefail; $(declare -f); $(printf '%q ' "$@")" 2>&1 |
    tee -a "$LOG"
  rc=$?
  local dt=$((SECONDS - t0))
  if ((rc == 124 || rc == 137)); then
    record "$name" FAIL "$dt" "stopped after ${limit}s"
  elif ((rc != 0)); then
    record "$name" FAIL "$dt" "exit status $rc (suite.log has its output)"
  else
    record "$name" PASS "$dt" ""
  fi
  return "$rc"
}

skip() { record "$1" SKIP 0 "$2"; }

# Adds a note to the summary row of the stage that ran last.
note_last() { ROWS[${#ROWS[@]} - 1]+=" $*"; }

find_tool() {  # a CUDA tool on PATH or in the toolkit
  command -v "$1" 2>/dev/null && return
  local d
  for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /usr/local/cuda-*/bin; do
    [[ -x $d/$1 ]] && { echo "$d/$1"; return; }
  done
  return 1
}

# ---- stages (each runs in its own bash; variables it needs are exported) --------------------------

env_report() {
  local rc=0
  echo "repo: $REPO  ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || rc=1
  nvcc --version | tail -n 2 || rc=1
  cmake --version | head -n 1
  echo "ninja: $(ninja --version 2>/dev/null || echo 'not found (Makefiles instead)')"
  echo "compute-sanitizer: $(find_tool compute-sanitizer || echo 'not found')"
  echo "cuobjdump: $(find_tool cuobjdump || echo 'not found')"
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name())' \
    || echo "PyTorch not usable: compare_torch.py will fail"
  echo "cores: $(nproc), jobs: $JOBS, budget: ${BUDGET}s"
  return "$rc"
}

# Unpacks FL_DEPS_DIR's .deb files into a private prefix (no root or apt needed; dpkg -x only).
unpack_deps() {
  local f
  mkdir -p "$DEPS_ROOT"
  for f in "$DEPS_DIR"/*.deb; do
    echo "unpacking $(basename "$f")"
    dpkg -x "$f" "$DEPS_ROOT" || return 1
  done
}

configure() {
  local gen=()
  if command -v ninja >/dev/null; then gen=(-G Ninja); fi
  # A cache made by another generator cannot be reused: start that build folder afresh.
  if [[ -f $BUILD/CMakeCache.txt ]] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}\$" "$BUILD/CMakeCache.txt"; then
    echo "removing $BUILD: made with another generator"
    rm -rf "$BUILD"
  fi
  cmake --preset hopper -B "$BUILD" "${gen[@]}" -DFLASH_LADDER_PTXAS_REPORT=ON ${DEPS_PREFIX:+"-DCMAKE_PREFIX_PATH=$DEPS_PREFIX"}
}

build() {
  # ptxas reports only what it compiles: drop the CUDA objects so every kernel is compiled (and
  # reported) in this run even when the build folder was kept from an earlier one.
  # FL_KEEP_OBJECTS=1 skips that, for a second call on a warm machine whose first call reported.
  [[ -n ${FL_KEEP_OBJECTS:-} ]] || find "$BUILD" -name '*.cu.o' -delete 2>/dev/null
  cmake --build "$BUILD" -j "$JOBS" 2>&1 | tee "$TMP/build.log"
  local rc=${PIPESTATUS[0]}
  # The ptxas report: each "Building CUDA object" line, then ptxas's lines for its kernels, with
  # the mangled kernel names demangled.
  grep -E 'Building CUDA object|ptxas|bytes stack frame' "$TMP/build.log" | grep -v 'Compile time' |
    c++filt >"$OUT/ptxas.log"
  echo "ptxas.log: $(grep -c 'Compiling entry function' "$OUT/ptxas.log") kernels reported," \
       "$(grep -cE '[1-9][0-9]* bytes spill (stores|loads)' "$OUT/ptxas.log") with spills"
  # ptxas says when it serializes a kernel's wgmma (C7514: accumulators read between issue and
  # wait; C7515: accumulators written between them; C7517: a wait it inserted; C7520: a divergent
  # path between them): a silent slowdown of the Hopper rungs, named here.
  local serial
  serial=$(awk '/Building CUDA object/ { obj = $NF }
                 match($0, /\(C75(14|15|17|20)\)/) { n = split(obj, part, "/"); print part[n] ": " substr($0, RSTART + 1, 5) }' \
             "$OUT/ptxas.log" | sort | uniq -c)
  if [[ -n $serial ]]; then
    echo "WARNING: ptxas serialized wgmma (C7514/C7515/C7517/C7520); kernels by file and note:"
    echo "$serial"  # uniq -c's counts indent each line
  else
    echo "ptxas.log: no kernel with serialized wgmma (C7514/C7515/C7517/C7520)"
  fi
  return "$rc"
}

sass_report() {
  local lib=$BUILD/capi/libflash_ladder.so cuobjdump
  cuobjdump=$(find_tool cuobjdump) || { echo "cuobjdump not found" | tee "$OUT/sass.txt"; return 1; }
  {
    echo "# $lib"
    echo "# Per kernel: registers, stack, shared and local memory (cuobjdump --dump-resource-usage)"
    "$cuobjdump" --dump-resource-usage "$lib" | grep -E '^identifier|Function |REG:' | c++filt
    echo
    echo "# Per kernel: how many of each instruction its SASS holds (static counts, not executed)."
    echo "# FFMA fp32 FMA, HMMA tensor-core MMA (mma.sync), HGMMA warpgroup MMA (wgmma), LDS/STS"
    echo "# shared memory, LDSM ldmatrix, LDG/STG global, LDGSTS cp.async, LDL/STL local memory"
    echo "# (register spills), MUFU special functions (ex2), BAR barriers, SHFL warp shuffles."
    # One cubin a process, JOBS at once: the library's SASS in one cuobjdump call took longer than
    # the stage's minute once rung 09 had sixteen versions (2026-11-25).
    local cubins
    cubins=$(mktemp -d)
    (cd "$cubins" && "$cuobjdump" -xelf all "$lib" >/dev/null)
    # shellcheck disable=SC2016  # $0 and $1 are sh -c's own arguments, expanded by that shell
    find "$cubins" -name '*.cubin' -print0 | xargs -0 -P "$JOBS" -I{} sh -c '"$0" -sass "$1" > "$1.sass"' "$cuobjdump" {}
    cat "$cubins"/*.cubin.sass | python3 -c '
import re, sys, collections
cols = ["FFMA", "HMMA", "HGMMA", "LDS", "STS", "LDSM", "LDG", "STG", "LDGSTS", "LDL", "STL", "MUFU", "BAR", "SHFL"]
counts, order, fn = {}, [], None
for line in sys.stdin:
    m = re.search(r"Function : (\S+)", line)
    if m:
        fn = m.group(1); order.append(fn); counts[fn] = collections.Counter(); continue
    m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
    if fn and m:
        counts[fn][m.group(1)] += 1
print("%-8s" * len(cols) % tuple(cols) + "%-8s kernel" % "total")
for fn in order:
    c = counts[fn]
    total = sum(n for op, n in c.items() if op != "NOP")  # NOPs only pad the end of a kernel
    print("".join("%-8d" % c[k] for k in cols) + "%-8d %s" % (total, fn))
' | c++filt
  } >"$OUT/sass.txt"
  local rc=$?
  rm -rf "$cubins"
  grep -A1000 '^FFMA' "$OUT/sass.txt" | cut -c1-200
  return "$rc"
}

run_ctest() {
  # --stop-time ends the run (tests still running are stopped) in time for ctest to write its
  # JUnit report, which a run killed from outside never writes.
  local stop
  stop=$(date -d "+$(($1 - 20)) seconds" +%H:%M:%S)
  ctest --test-dir "$BUILD" -j "$((JOBS > 8 ? 8 : JOBS))" --timeout 300 --stop-time "$stop" --output-on-failure \
    --output-junit "$TMP/ctest.xml" || return 1
  # ctest runs every test in a process of its own, so a test that writes past a host buffer can
  # pass there and corrupt the heap only for the tests after it. The C ABI's binary (every entry
  # point, a few seconds) also runs whole, in one process, once.
  echo "--- tests/test_capi, every test in one process"
  timeout 120 "$BUILD/tests/test_capi" >"$TMP/test_capi_whole.log" 2>&1 ||
    { tail -20 "$TMP/test_capi_whole.log"; echo "tests/test_capi failed or crashed when run whole"; return 1; }
}

# The dtypes some GPU rung runs, asked of the C ABI (never parsed from printed text).
gpu_dtypes() {
  python3 - "$BUILD/capi/libflash_ladder.so" <<'EOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class Shape(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim")] + \
               [("causal", ctypes.c_int), ("scale", ctypes.c_double)]
for f in ("fl_rung_name", "fl_rung_backend"):
    getattr(lib, f).restype = ctypes.c_char_p
lib.fl_rung_supports.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Shape), ctypes.c_int]
found = []
for i in range(lib.fl_rung_count()):
    if lib.fl_rung_backend(i) != b"cuda":
        continue
    for code, name in ((0, "fp32"), (1, "fp16"), (2, "bf16")):
        for d in (64, 128):
            if name not in found and lib.fl_rung_supports(lib.fl_rung_name(i), b"cuda", ctypes.byref(Shape(1, 2, 1, 77, 130, d, 1, 0.0)), code):
                found.append(name)
print(" ".join(found))
EOF
}

# compute-sanitizer TOOL over every GPU rung, on small ragged problems (Nq != Nk, GQA, causal,
# both head dims), in every dtype some GPU rung runs: the forward, and the backward of the rungs
# that have one (the ladder's backward table: one checked call on NaN-poisoned gradients, then one
# timed backward and one forward+backward). Any finding fails the stage.
sanitize() {
  local tool=$1 sanitizer dtypes dt rc=0
  sanitizer=$(find_tool compute-sanitizer) || { echo "compute-sanitizer not found"; return 1; }
  dtypes=$(gpu_dtypes) || return 1
  [[ -n $dtypes ]] || { echo "no GPU rung in the library"; return 1; }
  for dt in $dtypes; do
    for problem in "--seq-q 77 --seq-k 130 --heads 2 --kv-heads 1 --head-dim 64 --causal" \
                   "--seq-q 100 --seq-k 67 --heads 2 --kv-heads 2 --head-dim 128"; do
      echo "--- $tool, $dt: ladder $problem"
      # shellcheck disable=SC2086  # $problem is a list of flags
      "$sanitizer" --tool "$tool" --error-exitcode 1 --print-limit 20 \
        "$BUILD/bench/ladder" --device cuda --dtype "$dt" $problem --reps 1 --warmup 0 \
        --verify-rows all 2>&1 | tee -a "$TMP/sanitize_$tool.log" || rc=1
    done
    # The deterministic backward (rung 09): its turn counters, waits and hand-overs, on a problem
    # of several K/V blocks and Q blocks (causal, GQA), at both head dims (d = 64 has two staging
    # tiles and, from v5, two writers); two batches, so v6's launch order has two heads to take.
    if [[ $dt != fp32 ]]; then
      for d in 64 128; do
        echo "--- $tool, $dt: ladder --deterministic, rung 09, d=$d"
        "$sanitizer" --tool "$tool" --error-exitcode 1 --print-limit 20 \
          "$BUILD/bench/ladder" --device cuda --dtype "$dt" --rungs 09_hopper_backward --deterministic \
          --batch 2 --seq-q 300 --seq-k 520 --heads 4 --kv-heads 2 --head-dim "$d" --causal --reps 1 --warmup 0 \
          --verify-rows all 2>&1 | tee -a "$TMP/sanitize_$tool.log" || rc=1
      done
    fi
    # Rung 10 (decoding): ragged lengths, a paged cache with pages not filled to the end, pieces
    # and their merge, GQA and causal Nq > 1, at both head sizes.
    if [[ $dt != fp32 ]]; then
      for d in 64 128; do
        echo "--- $tool, $dt: ladder --decode, d=$d"
        "$sanitizer" --tool "$tool" --error-exitcode 1 --print-limit 20 \
          "$BUILD/bench/ladder" --decode --device cuda --dtype "$dt" --batch 3 --heads 8 --kv-heads 2 --seq-q 4 \
          --seq-k 1000 --head-dim "$d" --page-size 16 --splits 5 --causal --reps 1 --warmup 0 --no-ceiling 2>&1 | tee -a "$TMP/sanitize_$tool.log" || rc=1
      done
    fi
  done
  # The backward kernels ran in the ladder above (its backward table, printed when a rung has a
  # backward pass); say so when none did, so that it does not pass unnoticed.
  grep -q '^Backward pass of the rungs that have one' "$TMP/sanitize_$tool.log" ||
    echo "note: the ladder printed no backward table under $tool: no GPU rung ran a backward"
  return "$rc"
}

ladder_json() {
  local rc=0
  "$BUILD/bench/ladder" --device cuda --json "$TMP/ladder_default.json" || rc=1
  "$BUILD/bench/ladder" --device cuda --seq 4096 --heads 16 --json "$TMP/ladder_4096.json" || rc=1
  # Where standard attention's N² memory no longer fits: rungs 00–03 must refuse before
  # allocating, 04–05 must run. One timed call each (rung 04 takes seconds here).
  "$BUILD/bench/ladder" --device cuda --seq 65536 --heads 16 --reps 1 --warmup 0 \
    --json "$TMP/ladder_65536.json" || rc=1
  # The tensor-core rung's versions side by side, on one of the anchors' bf16 problems.
  "$BUILD/bench/ladder" --device cuda --dtype bf16 --batch 4 --seq 4096 --heads 16 \
    --json "$TMP/ladder_bf16.json" || rc=1
  # One file: {"default": ..., "seq4096_heads16": ...}; a run that wrote nothing is left out.
  python3 - "$TMP" "$OUT/ladder.json" <<'EOF' || rc=1
import json, os, sys
tmp, out = sys.argv[1], sys.argv[2]
runs = {}
for key, name in (("default", "ladder_default.json"), ("seq4096_heads16", "ladder_4096.json"),
                  ("seq65536_heads16", "ladder_65536.json"), ("bf16_b4_seq4096_heads16", "ladder_bf16.json")):
    path = os.path.join(tmp, name)
    if os.path.exists(path):
        with open(path) as f:
            runs[key] = json.load(f)
with open(out, "w") as f:
    json.dump(runs or {"error": "no ladder run wrote JSON (suite.log says why)"}, f, indent=1)
print("ladder.json:", ", ".join(runs) or "no run wrote JSON")
EOF
  return "$rc"
}

io_measure() {
  python3 "$REPO/bench/ncu_io.py" --probe "$BUILD/bench/io_probe" --json "$OUT/io.json"
}

bench_sweep() {
  "$BUILD/bench/ladder_bench" --fl_device=cuda ${FL_BENCH_FILTER:+--benchmark_filter="$FL_BENCH_FILTER"} \
    --benchmark_out="$OUT/bench.json" --benchmark_out_format=json
}

torch_compare() {
  # --memory-sweep runs first (a minute or less) and writes its rows into the same torch.json.
  local sweep=()
  [[ ${FL_TORCH_MEMORY:-1} == 0 ]] || sweep=(--memory-sweep)
  python3 "$REPO/bench/compare_torch.py" --lib "$BUILD/capi/libflash_ladder.so" \
    --dtype "${FL_TORCH_DTYPES:-fp32,bf16}" ${FL_TORCH_RUNGS:+--rungs "$FL_TORCH_RUNGS"} \
    ${FL_TORCH_PEERS:+--peers "$FL_TORCH_PEERS"} ${FL_TORCH_ROUNDS:+--rounds "$FL_TORCH_ROUNDS"} "${sweep[@]}" \
    --json "$OUT/torch.json" --time-limit "$1"
}

decode_compare() {
  # Its rows go to $TMP/decode.json (rewritten after every cell); the suite appends them to
  # torch.json afterwards (merge_decode_rows), so OUTDIR keeps its eight files.
  python3 "$REPO/bench/compare_decode.py" --lib "$BUILD/capi/libflash_ladder.so" \
    --json "$TMP/decode.json" --time-limit "$1"
}

# Appends the decode stage's rows to torch.json's list (or makes torch.json of them when the torch
# stage wrote no list). Runs outside the stage, so rows written before a stage was stopped still land.
merge_decode_rows() {
  [[ -s $TMP/decode.json ]] || return 0
  python3 - "$TMP/decode.json" "$OUT/torch.json" <<'EOF'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
with open(src) as f:
    rows = json.load(f)
doc = []
if os.path.exists(dst):
    try:
        with open(dst) as f:
            doc = json.load(f)
    except ValueError:
        doc = []
doc = (doc if isinstance(doc, list) else []) + rows
with open(dst + ".part", "w") as f:
    json.dump(doc, f, indent=1)
os.replace(dst + ".part", dst)
print("torch.json: %d decode rows appended, %d rows in all" % (len(rows), len(doc)))
EOF
}

# Whether FL_STAGES (empty: every stage) names stage $1.
wanted() { [[ -z ${FL_STAGES:-} || ",$FL_STAGES," == *",$1,"* ]]; }

export REPO BUILD OUT TMP JOBS BUDGET LOG

# ---- the suite ---------------------------------------------------------------------------------------

say "Flash Ladder GPU suite, $(date -u +%Y-%m-%dT%H:%M:%SZ), output in $OUT"
stage env 60 env_report

# True when CMake finds Eigen, GoogleTest and Google Benchmark installed on this machine.
system_has_deps() {
  mkdir -p "$TMP/probe"
  printf '%s\n' 'cmake_minimum_required(VERSION 3.22)' 'project(probe CXX)' \
    'find_package(Eigen3 REQUIRED NO_MODULE)' 'find_package(GTest REQUIRED)' 'find_package(benchmark REQUIRED)' \
    >"$TMP/probe/CMakeLists.txt"
  cmake -S "$TMP/probe" -B "$TMP/probe/build" >/dev/null 2>&1
}

DEPS_DIR=${FL_DEPS_DIR:-$REPO/.deps}
DEPS_ROOT=$TMP/deps
DEPS_PREFIX=""
# Carried .deb files are a fallback only: the machine's own packages come first.
if compgen -G "$DEPS_DIR/*.deb" >/dev/null && ! system_has_deps; then
  export DEPS_DIR DEPS_ROOT
  if stage deps 120 unpack_deps; then
    # find_package looks under <prefix>/share/<name>/cmake and <prefix>/lib/<arch>/cmake/<name>.
    DEPS_PREFIX="$DEPS_ROOT/usr"
    export LD_LIBRARY_PATH="$DEPS_ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
export DEPS_PREFIX

if stage configure 120 configure; then
  stage build 300 build
else
  skip build "configure failed"
fi

if [[ -f $BUILD/capi/libflash_ladder.so ]]; then
  stage sass 60 sass_report
else
  skip sass "no build-hopper/capi/libflash_ladder.so"
  echo "no library was built, so there is no SASS to report" >"$OUT/sass.txt"
fi
[[ -f $OUT/ptxas.log ]] || echo "the build did not run, so ptxas reported nothing" >"$OUT/ptxas.log"

if [[ -f $BUILD/CTestTestfile.cmake ]]; then
  # 160–180 s on an H100 with 16 cores (440 tests, 2026-11-25); 300 leaves room for more.
  ctest_limit=$(( $(left) - 10 < 300 ? $(left) - 10 : 300 ))
  stage ctest 300 run_ctest "$ctest_limit"
  if [[ -s $TMP/ctest.xml ]]; then  # the counts, from ctest's own report
    note_last "$(python3 - "$TMP/ctest.xml" 2>/dev/null <<'EOF'
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
print("[%s tests, %s failed, %s skipped]" % (r.get("tests"), r.get("failures"), r.get("skipped")))
EOF
)"
    # ctest's --stop-time ends the tests still running when the stage's time is up and reports
    # them as timeouts: say so, so that a stopped test does not read as a hung or failing one.
    stopped=$(grep -cE '\*\*\*Timeout' "$LOG" 2>/dev/null)
    ((stopped > 0)) && note_last "($stopped timed out: at the stage's ${ctest_limit}s limit or their own; raise FL_SUITE_BUDGET_S or run FL_STAGES=ctest alone)"
  fi
else
  skip ctest "not configured"
fi

if [[ -x $BUILD/bench/ladder && -f $BUILD/capi/libflash_ladder.so ]]; then
  for tool in memcheck racecheck initcheck; do
    case $tool in memcheck) limit=120 ;; racecheck) limit=${FL_RACECHECK_S:-220} ;; *) limit=90 ;; esac
    stage "$tool" "$limit" sanitize "$tool"
    # The sanitizer's own count, so the summary says whether it found something or failed to run.
    if [[ -f $TMP/sanitize_$tool.log ]]; then
      # memcheck and initcheck end with "ERROR SUMMARY: N errors", racecheck with
      # "RACECHECK SUMMARY: N hazards displayed".
      note_last "[$(grep -cE '(ERROR|RACECHECK) SUMMARY' "$TMP/sanitize_$tool.log") runs," \
        "$(grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+' "$TMP/sanitize_$tool.log" | awk '{n += $3} END {print n + 0}') findings]"
    fi
  done
  stage ladder 240 ladder_json
else
  for s in memcheck racecheck initcheck ladder; do skip "$s" "no build-hopper/bench/ladder"; done
fi

if [[ -x $BUILD/bench/ladder_bench ]]; then
  stage bench 240 bench_sweep
  # Google Benchmark closes its JSON only at the end: a sweep stopped early leaves it cut short.
  # (No file at all means the stage did not run: FL_STAGES left it out, or the budget was spent.)
  if [[ -s $OUT/bench.json ]] && ! python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$OUT/bench.json" 2>/dev/null; then
    say "bench.json is not complete JSON (the sweep was stopped or failed); its rows so far are kept"
  fi
else
  record bench FAIL 0 "ladder_bench was not built (Google Benchmark not found at configure time?)"
fi

if [[ -x $BUILD/bench/io_probe ]]; then
  stage io 120 io_measure
else
  skip io "no build-hopper/bench/io_probe"
fi

if [[ -f $BUILD/capi/libflash_ladder.so ]]; then
  # compare_torch.py stops starting new shapes when its own limit comes, and writes what it has;
  # it leaves FL_DECODE_S seconds (at most half of what is left) to the decode stage when that runs.
  decode_keep=0
  if wanted decode; then
    decode_keep=${FL_DECODE_S:-180}
    ((decode_keep > $(left) / 2)) && decode_keep=$(($(left) / 2))
  fi
  torch_limit=$(($(left) - 25 - decode_keep))
  stage torch 600 torch_compare "$torch_limit"
  # The same for rung 10's kernels (bench/compare_decode.py); its rows join torch.json.
  decode_limit=$(($(left) - 25))
  stage decode 600 decode_compare "$decode_limit"
  merge_decode_rows 2>&1 | tee -a "$LOG"
else
  skip torch "no library"
  skip decode "no library"
fi

# Every file the caller expects exists, even when its stage could not run, and says so.
for f in bench.json torch.json ladder.json io.json; do
  [[ -s $OUT/$f ]] || echo '{"error": "not produced: its stage failed or was skipped (see summary.txt)"}' >"$OUT/$f"
done

{
  echo "Flash Ladder GPU suite: $( ((FAILED)) && echo FAILED || echo PASSED ), $((SECONDS - START))s in all"
  printf '%-18s %-5s %6s  %s\n' stage result time note
  printf '%s\n' "${ROWS[@]}"
} >"$SUMMARY"
say ""
tee -a "$LOG" <"$SUMMARY"
ls "$OUT" >>"$LOG"
exit "$FAILED"
