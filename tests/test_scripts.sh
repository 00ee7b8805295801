#!/usr/bin/env bash
# The quick-start scripts on machines they did not expect, without touching this machine: each case
# copies scripts/ into a temporary folder and runs it with a PATH of stubs (cmake, ninja, c++,
# dpkg, apt-get, sudo, id, nvcc, nvidia-smi, ctest) beside a few real basic tools, and checks what
# the script printed, what it asked the stubs to do, and its exit status.
#   tests/test_scripts.sh [SOURCE_DIR]     (default: this file's repository)
# Exit status 0 when every case passed; the last line is "N passed, N failed".
set -uo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/flash_ladder_scripts.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Real tools the scripts may use besides the stubs.
basic="$work/basic"
mkdir -p "$basic"
for t in bash sh sed grep sort head tail tr wc mktemp rm cat readlink dirname basename nproc env mkdir \
         touch ls cp awk chmod cut uname tee; do
  p=$(command -v "$t") && ln -s "$p" "$basic/$t"
done

# ---- Stubs -------------------------------------------------------------------------------------
# Every stub appends its command line to $STUB_LOG. $STUB_STATE holds what "installing" brought.
make_stubs() {  # make_stubs DIR NAME...
  local dir=$1 name; shift
  mkdir -p "$dir"
  for name in "$@"; do
    case $name in
      cmake) cat >"$dir/cmake" <<'EOF'
#!/usr/bin/env bash
echo "cmake $*" >>"$STUB_LOG"
case "$1" in
  --version) echo "cmake version ${STUB_CMAKE_VERSION:-3.28.1}"; exit 0 ;;
  -S)  # the find_package probe
    for m in ${STUB_MISSING:-}; do [ -e "$STUB_STATE/installed-$m" ] || echo "-- probe-missing: $m"; done
    exit 0 ;;
  --preset)  # configure
    mkdir -p build
    cc=CMAKE_CUDA_COMPILER-NOTFOUND; arch=""
    for a in "$@"; do
      case $a in -DCMAKE_CUDA_COMPILER=*) cc=${a#*=} ;; -DCMAKE_CUDA_ARCHITECTURES=*) arch=${a#*=} ;; esac
    done
    { echo "CMAKE_CUDA_COMPILER:FILEPATH=$cc"; [ -n "$arch" ] && echo "CMAKE_CUDA_ARCHITECTURES:STRING=$arch"; } >build/CMakeCache.txt
    exit 0 ;;
  --build)
    mkdir -p build/bench
    printf '#!/usr/bin/env bash\necho "ladder ran $*"\n' >build/bench/ladder
    chmod +x build/bench/ladder
    exit 0 ;;
esac
exit 0
EOF
      ;;
      ctest) cat >"$dir/ctest" <<'EOF'
#!/usr/bin/env bash
echo "ctest $*" >>"$STUB_LOG"
mkdir -p build/Testing/Temporary
cat >build/Testing/Temporary/LastTest.log <<'LOG'
1/2 Testing: Cpu.Works
1/2 Test: Cpu.Works
Output:
----------------------------------------------------------
[ RUN      ] Cpu.Works
[       OK ] Cpu.Works (0 ms)
<end of output>
2/2 Testing: Gpu.Kernel
2/2 Test: Gpu.Kernel
Output:
----------------------------------------------------------
[ RUN      ] Gpu.Kernel
/src/tests/test_x.cpp:12: Skipped
no NVIDIA driver or GPU was found: no NVIDIA driver is installed (cudaErrorInsufficientDriver)
[  SKIPPED ] Gpu.Kernel (0 ms)
[  SKIPPED ] 1 test, listed below:
[  SKIPPED ] Gpu.Kernel
<end of output>
LOG
echo "100% tests passed, 0 tests failed out of 2"
echo "The following tests did not run:"
echo "	  2 - Gpu.Kernel (Skipped)"
exit 0
EOF
      ;;
      apt-get) cat >"$dir/apt-get" <<'EOF'
#!/usr/bin/env bash
echo "apt-get $*" >>"$STUB_LOG"
if [ "$1" = update ]; then [ -n "${STUB_NO_NETWORK:-}" ] && { echo "E: could not resolve host" >&2; exit 100; }; exit 0; fi
if [ -n "${STUB_NO_NETWORK:-}" ]; then echo "E: unable to fetch" >&2; exit 100; fi
for p in "$@"; do
  case $p in
    libeigen3-dev) touch "$STUB_STATE/installed-Eigen3" ;;
    libgtest-dev) touch "$STUB_STATE/installed-GTest" ;;
    libbenchmark-dev) touch "$STUB_STATE/installed-benchmark" ;;
  esac
done
exit 0
EOF
      ;;
      dpkg) printf '#!/usr/bin/env bash\necho "dpkg $*" >>"$STUB_LOG"\nexit 1\n' >"$dir/dpkg" ;;  # knows of no package
      sudo) printf '#!/usr/bin/env bash\necho "sudo $*" >>"$STUB_LOG"\nexec "$@"\n' >"$dir/sudo" ;;
      id) printf '#!/usr/bin/env bash\n[ "$1" = -u ] && echo "${STUB_UID:-0}"\n' >"$dir/id" ;;
      nvcc) printf '#!/usr/bin/env bash\necho "Cuda compilation tools, release %s, V%s.0"\n' \
                   '${STUB_NVCC:-13.0}' '${STUB_NVCC:-13.0}' >"$dir/nvcc" ;;
      nvidia-smi) cat >"$dir/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *compute_cap*) echo "9.0" ;;
  *name*) echo "NVIDIA H100 80GB HBM3" ;;
esac
EOF
      ;;
      *) printf '#!/usr/bin/env bash\necho "%s $*" >>"$STUB_LOG"\n' "$name" >"$dir/$name" ;;  # ninja, c++
    esac
    chmod +x "$dir/$name"
  done
}

# run_case NAME SCRIPT STUBS... -- runs scripts/SCRIPT in a fresh copy with those stubs; leaves
# $out (stdout and stderr), $rc, $log (the stubs' calls) and $repo.
run_case() {
  local name=$1 script=$2; shift 2
  repo="$work/$name/repo"
  mkdir -p "$repo" "$work/$name/state"
  cp -r "$src/scripts" "$repo/"
  make_stubs "$work/$name/stubs" "$@"
  log="$work/$name/log"
  : >"$log"
  out=$(cd "$repo" && env -i HOME="$work" PATH="$work/$name/stubs:$basic" STUB_LOG="$log" \
        STUB_STATE="$work/$name/state" ${STUB_ENV:-} bash "scripts/$script" 2>&1)
  rc=$?
}

passed=0 failed=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1; shift
  if "$@"; then return 0; fi
  echo "FAIL [$case_name] $what"
  case_ok=0
}
has() { grep -qF -- "$1" <<<"$out"; }
logged() { grep -qF -- "$1" "$log"; }
finish() {
  if ((case_ok)); then passed=$((passed + 1)); echo "ok   $case_name"
  else failed=$((failed + 1)); echo "---- its output:"; echo "$out" | sed 's/^/     /'; echo "---- its calls:"; sed 's/^/     /' "$log"; fi
}
start() { case_name=$1; case_ok=1; }

all_tools=(cmake ninja c++ dpkg apt-get id)

# 1. The H100 machine of the issue: CMake and Ninja from pip (not dpkg), libraries present, no
#    network. Nothing is missing, so nothing is installed and the quick start goes on.
start tools_present_not_through_dpkg
STUB_ENV="STUB_NO_NETWORK=1" run_case "$case_name" quickstart.sh "${all_tools[@]}"
check "exits 0 (got $rc)" test "$rc" -eq 0
check "runs the ladder" has "ladder ran"
check "asks apt-get for nothing" bash -c "! grep -q apt-get '$log'"
finish

# 2. Something missing, and no way to install it (not root, no sudo): one message naming it and how.
start missing_not_root_no_sudo
STUB_ENV="STUB_UID=1000 STUB_MISSING=Eigen3" run_case "$case_name" quickstart.sh "${all_tools[@]}"
check "exits 1 (got $rc)" test "$rc" -eq 1
check "names what is missing" has "missing Eigen >= 3.3"
check "says why it cannot install" has "you are not root and there is no sudo"
check "says how to get it" has "apt-get install libeigen3-dev"
check "no 'command not found'" bash -c "! grep -q 'command not found' <<<'$out'"
check "one message" test "$(grep -c 'cannot build yet' <<<"$out")" -eq 1
check "does not configure" bash -c "! grep -q -- '--preset' '$log'"
finish

# 3. Root, but no network: apt-get update fails; one message with what is missing and why.
start missing_no_network
STUB_ENV="STUB_NO_NETWORK=1 STUB_MISSING=GTest" run_case "$case_name" quickstart.sh "${all_tools[@]}"
check "exits 1 (got $rc)" test "$rc" -eq 1
check "names what is missing" has "missing GoogleTest"
check "says apt-get update failed" has "'apt-get update' failed"
check "says how to get it" has "apt-get install libgtest-dev libgmock-dev"
finish

# 4. Root with network: installs exactly what is missing, and nothing that is there another way.
start installs_only_what_is_missing
STUB_ENV="STUB_MISSING=Eigen3" run_case "$case_name" quickstart.sh "${all_tools[@]}"
check "exits 0 (got $rc)" test "$rc" -eq 0
check "installs libeigen3-dev alone" logged "apt-get install -y -qq --no-install-recommends libeigen3-dev"
check "installs nothing else" test "$(grep -c 'apt-get install' "$log")" -eq 1
check "runs the ladder" has "ladder ran"
finish

# 5. A non-root user with sudo: apt-get goes through sudo.
start installs_through_sudo
STUB_ENV="STUB_UID=1000 STUB_MISSING=Eigen3" run_case "$case_name" quickstart.sh "${all_tools[@]}" sudo
check "exits 0 (got $rc)" test "$rc" -eq 0
check "uses sudo for apt-get" logged "sudo apt-get update"
finish

# 6. CMake too old (Ubuntu 20.04's 3.16): said, not a confusing configure error later.
start cmake_too_old
STUB_ENV="STUB_CMAKE_VERSION=3.16.3" run_case "$case_name" quickstart.sh "${all_tools[@]}"
check "exits 1 (got $rc)" test "$rc" -eq 1
check "names the version needed and found" has "CMake >= 3.22 (this one is 3.16.3)"
check "says pip can bring it" has "pip install --user cmake ninja"
finish

# 7. nvcc, no GPU (CI): the GPU rungs still compile for the four default architectures, said in one line.
start no_gpu_with_nvcc
STUB_ENV="STUB_NVCC=13.0" run_case "$case_name" quickstart.sh "${all_tools[@]}" nvcc
check "exits 0 (got $rc)" test "$rc" -eq 0
check "configures for 80;86;89;90" logged "-DCMAKE_CUDA_ARCHITECTURES=80;86;89;90"
check "does not switch to the CPU build" bash -c "! grep -q FLASH_LADDER_CUDA=OFF '$log'"
check "says what it chose" has "no GPU here"
check "says what the first build costs" has "building: the first build compiles 4 GPU architectures"
finish

# 8. A GPU present: built for it alone.
start gpu_present
STUB_ENV="STUB_NVCC=12.4" run_case "$case_name" quickstart.sh "${all_tools[@]}" nvcc nvidia-smi
check "exits 0 (got $rc)" test "$rc" -eq 0
check "configures for sm_90 alone" logged "-DCMAKE_CUDA_ARCHITECTURES=90"
check "says what it chose" has "GPU found (NVIDIA H100 80GB HBM3)"
check "one architecture" has "compiles 1 GPU architecture"
finish

# 9. An nvcc too old for some architectures: those are left out, and said.
start nvcc_too_old_for_some_architectures
STUB_ENV="STUB_NVCC=11.4" run_case "$case_name" quickstart.sh "${all_tools[@]}" nvcc
check "exits 0 (got $rc)" test "$rc" -eq 0
check "configures for 80;86" logged "-DCMAKE_CUDA_ARCHITECTURES=80;86 "
check "says what it does not know" has "nvcc 11.4 does not know sm_89 (needs CUDA >= 11.8), sm_90 (needs CUDA >= 12.0)"
finish

# 10. Configured once without nvcc; nvcc installed since: configured again, with it.
start reconfigures_when_nvcc_appears
mkdir -p "$work/$case_name/repo/build"
echo "CMAKE_CUDA_COMPILER:FILEPATH=CMAKE_CUDA_COMPILER-NOTFOUND" >"$work/$case_name/repo/build/CMakeCache.txt"
STUB_ENV="STUB_NVCC=13.0" run_case "$case_name" quickstart.sh "${all_tools[@]}" nvcc
check "exits 0 (got $rc)" test "$rc" -eq 0
check "says why it configures again" has "nvcc appeared since the last configure"
check "configures with nvcc" logged "-DCMAKE_CUDA_COMPILER="
finish

# 11. The same for test.sh, which also lists the skipped tests with their reasons.
start test_sh_reconfigures_and_lists_skips
mkdir -p "$work/$case_name/repo/build"
echo "CMAKE_CUDA_COMPILER:FILEPATH=CMAKE_CUDA_COMPILER-NOTFOUND" >"$work/$case_name/repo/build/CMakeCache.txt"
STUB_ENV="STUB_NVCC=13.0" run_case "$case_name" test.sh cmake ninja c++ nvcc ctest
check "exits 0 (got $rc)" test "$rc" -eq 0
check "configures again" has "nvcc appeared since the last configure"
check "runs ctest" logged "ctest"
check "lists the skipped test with its reason" \
  has "1 skipped: no NVIDIA driver or GPU was found: no NVIDIA driver is installed (cudaErrorInsufficientDriver) (Gpu.Kernel)"
check "ends on a closing line that counts skips apart" has "test: 1 passed, 0 failed, 1 skipped"
finish

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
