# What quickstart.sh and test.sh share (sourced, not run): checking for what the build needs and
# installing only what is truly missing, choosing the CUDA architectures, configuring when needed
# (again when nvcc appeared or went away since), and building with a progress line.
#
# What the build needs is asked of the tools themselves, not of a package manager: the commands on
# PATH (cmake >= 3.22, ninja, a C++17 compiler) and what CMake's find_package finds (a probe project
# in a temporary folder asks for Eigen3, GTest and benchmark the way CMakeLists.txt does). So CMake
# from pip, or Eigen under CMAKE_PREFIX_PATH, count as installed. What is missing is installed with
# apt-get (through sudo when not root); where that cannot be done, one message says what is missing
# and how to get it.
#
# Environment, all optional: CUDACXX (the CUDA compiler; default: nvcc on PATH), CUDAARCHS (the
# architectures to build, CMake's own variable, e.g. "90"), CMAKE_PREFIX_PATH (where find_package
# also looks), FL_BUILD_DIR (default build, the default preset's folder).

FL_CMAKE_MIN=3.22
FL_BUILD_DIR=${FL_BUILD_DIR:-build}
FL_DEFAULT_ARCHS="80 86 89 90"  # CMakeLists.txt's default: A100, consumer Ampere, Ada, Hopper

fl_say() { echo "${FL_SCRIPT:-setup}: $*"; }

# a >= b, for dotted versions
fl_version_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]; }

fl_cmake_version() { cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p' | head -n1; }

fl_cxx() {
  local c
  for c in "${CXX:-}" c++ g++ clang++; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && { command -v "$c"; return 0; }
  done
  return 1
}

# What each missing thing is called, the Debian packages that bring it, and how to get it by hand.
fl_what() {
  case $1 in
    cmake) echo "CMake >= $FL_CMAKE_MIN" ;;
    ninja) echo "Ninja" ;;
    cxx) echo "a C++17 compiler" ;;
    Eigen3) echo "Eigen >= 3.3" ;;
    GTest) echo "GoogleTest" ;;
    benchmark) echo "Google Benchmark" ;;
  esac
}
fl_packages_of() {
  case $1 in
    cmake) echo cmake ;;
    ninja) echo ninja-build ;;
    cxx) echo g++ ;;
    Eigen3) echo libeigen3-dev ;;
    GTest) echo libgtest-dev libgmock-dev ;;
    benchmark) echo libbenchmark-dev ;;
  esac
}

# Runs the find_package probe; prints the names it did not find (Eigen3, GTest, benchmark, cxx),
# one a line. Returns 1 (printing the reason on stderr) when the probe itself could not configure.
fl_probe() {
  local dir out gen=()
  dir=$(mktemp -d "${TMPDIR:-/tmp}/flash_ladder_probe.XXXXXX")
  cat >"$dir/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(flash_ladder_probe LANGUAGES CXX)
if(NOT "cxx_std_17" IN_LIST CMAKE_CXX_COMPILE_FEATURES)
  message(STATUS "probe-missing: cxx")
endif()
find_package(Eigen3 3.3 QUIET NO_MODULE)
if(NOT Eigen3_FOUND)
  message(STATUS "probe-missing: Eigen3")
endif()
find_package(GTest QUIET)
if(NOT GTest_FOUND AND NOT GTEST_FOUND)
  message(STATUS "probe-missing: GTest")
endif()
find_package(benchmark QUIET)
if(NOT benchmark_FOUND)
  message(STATUS "probe-missing: benchmark")
endif()
EOF
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  if ! out=$(cmake -S "$dir" -B "$dir/build" "${gen[@]}" 2>&1); then
    rm -rf "$dir"
    if echo "$out" | grep -q "CMAKE_CXX_COMPILER"; then echo cxx; return 0; fi
    echo "$out" | tail -n 5 >&2
    return 1
  fi
  rm -rf "$dir"
  echo "$out" | sed -n 's/^-- probe-missing: //p'
}

# Installs Debian packages; on failure sets FL_CANNOT to why and returns 1.
FL_CANNOT=""
fl_apt_install() {
  local sudo=()
  if ! command -v apt-get >/dev/null 2>&1; then
    FL_CANNOT="this is not a Debian/Ubuntu system (no apt-get)"; return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
      FL_CANNOT="you are not root and there is no sudo"; return 1
    fi
  fi
  fl_say "installing $*"
  if ! "${sudo[@]}" apt-get update -qq; then
    FL_CANNOT="'apt-get update' failed (no network, or no permission?)"; return 1
  fi
  if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; then
    FL_CANNOT="'apt-get install $*' failed"; return 1
  fi
}

# What is missing now: the commands, then (with CMake there to ask) the libraries. Sets FL_MISSING
# (names as in fl_what) and FL_OLD_CMAKE (the version of a CMake that is there but too old).
fl_check() {
  FL_MISSING=()
  FL_OLD_CMAKE=""
  local v
  if ! command -v cmake >/dev/null 2>&1; then FL_MISSING+=(cmake)
  else
    v=$(fl_cmake_version)
    fl_version_ge "${v:-0}" "$FL_CMAKE_MIN" || FL_OLD_CMAKE=${v:-unknown}
  fi
  command -v ninja >/dev/null 2>&1 || FL_MISSING+=(ninja)
  fl_cxx >/dev/null || FL_MISSING+=(cxx)
  FL_UNCHECKED=""
  if command -v cmake >/dev/null 2>&1 && fl_cxx >/dev/null; then
    local m
    if m=$(fl_probe); then
      for v in $m; do
        case " ${FL_MISSING[*]} " in *" $v "*) ;; *) FL_MISSING+=("$v") ;; esac
      done
    else
      FL_UNCHECKED="the libraries (CMake's probe did not configure, see above)"
    fi
  else
    FL_UNCHECKED="Eigen, GoogleTest and Google Benchmark (they are looked for with CMake and a compiler)"
  fi
}

# Checks, installs what is missing where it can, and stops with one message where it cannot.
# Google Benchmark is optional (ladder_bench is left out without it): its absence alone is a note.
fl_ensure_tools() {
  fl_check
  local required=() optional=() m pkgs=()
  for m in "${FL_MISSING[@]}"; do
    if [ "$m" = benchmark ]; then optional+=("$m"); else required+=("$m"); fi
  done
  if ((${#FL_MISSING[@]})); then
    for m in "${FL_MISSING[@]}"; do read -r -a p <<<"$(fl_packages_of "$m")"; pkgs+=("${p[@]}"); done
    # Libraries not yet probed (no CMake or compiler to ask) come along when dpkg says they are absent.
    if [ -n "$FL_UNCHECKED" ] && command -v dpkg >/dev/null 2>&1; then
      for p in libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev; do
        dpkg -s "$p" >/dev/null 2>&1 || pkgs+=("$p")
      done
    fi
    if fl_apt_install "${pkgs[@]}"; then
      fl_check
      required=(); optional=()
      for m in "${FL_MISSING[@]}"; do
        if [ "$m" = benchmark ]; then optional+=("$m"); else required+=("$m"); fi
      done
      [ ${#FL_MISSING[@]} -eq 0 ] || FL_CANNOT="installing ${pkgs[*]} did not bring them"
    fi
  fi
  if [ -z "$FL_OLD_CMAKE" ] && [ ${#required[@]} -eq 0 ]; then
    if ((${#optional[@]})); then
      fl_say "note: Google Benchmark was not found (${FL_CANNOT:-not installed}): ladder_bench is left out, the rest builds; it comes with libbenchmark-dev"
    fi
    return 0
  fi
  # One message: what is missing, why it could not be installed here, how to get it.
  local names=() apt=()
  for m in "${required[@]}" "${optional[@]}"; do
    names+=("$(fl_what "$m")")
    read -r -a p <<<"$(fl_packages_of "$m")"; apt+=("${p[@]}")
  done
  [ -n "$FL_OLD_CMAKE" ] && names+=("CMake >= $FL_CMAKE_MIN (this one is $FL_OLD_CMAKE)")
  local list
  list=$(printf '%s, ' "${names[@]}"); list=${list%, }
  {
    echo "${FL_SCRIPT:-setup}: cannot build yet: missing ${list}${FL_UNCHECKED:+ (not checked yet: $FL_UNCHECKED)}."
    [ -n "$FL_CANNOT" ] && echo "  Not installed here because $FL_CANNOT."
    echo "  Get them, then run this again:"
    ((${#apt[@]})) && echo "    Debian/Ubuntu, as root:  apt-get install ${apt[*]}"
    if [ -n "$FL_OLD_CMAKE" ] || [[ " ${required[*]} " == *" cmake "* ]] || [[ " ${required[*]} " == *" ninja "* ]]; then
      echo "    CMake and Ninja without root:  python3 -m pip install --user cmake ninja  (then ~/.local/bin on PATH)"
    fi
    if [[ " ${required[*]} ${optional[*]} " =~ \ (Eigen3|GTest|benchmark)\  ]]; then
      echo "    a library built or unpacked anywhere: export CMAKE_PREFIX_PATH=<its install prefix>"
    fi
  } >&2
  exit 1
}

# ---- CUDA -------------------------------------------------------------------------------------
# The lowest CUDA that knows each architecture (rung 07 builds sm_90 as sm_90a: 12.0).
fl_arch_min_cuda() {
  case $1 in
    80) echo 11.0 ;; 86) echo 11.1 ;; 87) echo 11.4 ;; 89) echo 11.8 ;; 90) echo 12.0 ;; 90a) echo 12.0 ;;
    *) echo 0 ;;
  esac
}

# Sets FL_CUDA_ARGS (extra configure arguments) and FL_ARCHS (the architectures the GPU rungs are
# compiled for; empty without CUDA), and says in one line what was chosen and why.
fl_choose_cuda() {
  FL_CUDA_ARGS=()
  FL_ARCHS=""
  # Where CMake looks too: CUDACXX, then PATH, then CUDA_PATH.
  FL_NVCC=${CUDACXX:-$(command -v nvcc 2>/dev/null || true)}
  [ -z "$FL_NVCC" ] && [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ] && FL_NVCC="$CUDA_PATH/bin/nvcc"
  if [ -z "$FL_NVCC" ] || ! [ -x "$FL_NVCC" ]; then
    FL_NVCC=""
    fl_say "no CUDA compiler (nvcc) on PATH: building the CPU twins only (install the CUDA Toolkit for the GPU rungs)"
    return 0
  fi
  local ver
  ver=$("$FL_NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1)
  ver=${ver:-0}
  # A GPU here: build for it alone (what CMake's "native" picks), named by number so that rungs 08
  # and 09's sm_90 -> sm_90a rule still sees it.
  local gpus="" caps="" why=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sed '/^$/d' || true)
    caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sed '/^$/d' | sort -u | tr '\n' ' ' || true)
    [ -n "$gpus" ] || why="nvidia-smi finds no GPU"
  else
    why="no nvidia-smi"
  fi
  local asked
  if [ -n "${CUDAARCHS:-}" ]; then
    asked=${CUDAARCHS//;/ }
  elif [ -n "$gpus" ] && [[ "$caps" =~ ^[0-9\ ]+$ ]]; then
    asked=$caps
  elif [ -n "$gpus" ]; then
    asked=native
  else
    asked=$FL_DEFAULT_ARCHS
  fi
  if [ "$asked" = native ]; then
    if fl_version_ge "$(fl_cmake_version)" 3.24; then
      FL_ARCHS=native
      FL_CUDA_ARGS=(-DCMAKE_CUDA_ARCHITECTURES=native)
      fl_say "GPU found ($(echo "$gpus" | head -n1)): compiling the GPU rungs for it alone (CMAKE_CUDA_ARCHITECTURES=native)"
      return 0
    fi
    asked=$FL_DEFAULT_ARCHS
  fi
  # Keep what this nvcc knows; say what it does not.
  local a keep=() drop=()
  for a in $asked; do
    if fl_version_ge "$ver" "$(fl_arch_min_cuda "$a")"; then keep+=("$a"); else drop+=("sm_$a (needs CUDA >= $(fl_arch_min_cuda "$a"))"); fi
  done
  if ((${#drop[@]})); then
    fl_say "nvcc $ver does not know $(printf '%s, ' "${drop[@]}" | sed 's/, $//'); a newer CUDA Toolkit builds them"
  fi
  if [ ${#keep[@]} -eq 0 ]; then
    fl_say "so the GPU rungs are left out: building the CPU twins only"
    FL_NVCC=""
    FL_CUDA_ARGS=(-DFLASH_LADDER_CUDA=OFF)
    return 0
  fi
  FL_ARCHS="${keep[*]}"
  FL_CUDA_ARGS=("-DCMAKE_CUDA_ARCHITECTURES=${FL_ARCHS// /;}")
  local sm
  sm=$(printf 'sm_%s, ' "${keep[@]}"); sm=${sm%, }
  if [ -n "${CUDAARCHS:-}" ]; then
    fl_say "CUDA $ver: compiling the GPU rungs for $sm (CUDAARCHS)"
  elif [ -n "$gpus" ]; then
    fl_say "GPU found ($(echo "$gpus" | head -n1)): compiling the GPU rungs for it alone ($sm, what CMAKE_CUDA_ARCHITECTURES=native would pick)"
  else
    fl_say "no GPU here ($why), but nvcc $ver is: the GPU rungs are compiled (not run) for $sm; on a machine without a GPU, 'cmake --preset cpu && cmake --build --preset cpu' skips that compile"
  fi
}

# ---- Configure and build -------------------------------------------------------------------------
fl_cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$FL_BUILD_DIR/CMakeCache.txt" 2>/dev/null | head -n1; }

# Configures when there is no cache, or afresh when the CUDA compiler appeared, went away or
# changed since the cache was written (check_language caches its answer, so a plain re-run would
# keep it); otherwise re-runs configure only to pass a changed architecture list.
fl_configure() {
  fl_choose_cuda
  local fresh="" cached
  if [ -f "$FL_BUILD_DIR/CMakeCache.txt" ]; then
    cached=$(fl_cache_get CMAKE_CUDA_COMPILER)
    case $cached in *NOTFOUND*) cached="" ;; esac
    local want=""
    [ -n "$FL_NVCC" ] && want=$(readlink -f "$FL_NVCC")
    [ -n "$cached" ] && cached=$(readlink -f "$cached" 2>/dev/null || echo "$cached")
    if [ "$cached" != "$want" ]; then
      if [ -z "$cached" ]; then fresh="nvcc appeared since the last configure (the cache has none)"
      elif [ -z "$want" ]; then fresh="the cached CUDA compiler ($cached) is gone or not used"
      else fresh="the CUDA compiler changed ($cached -> $want)"; fi
    fi
  fi
  if [ -n "$fresh" ]; then
    fl_say "$fresh: configuring afresh"
    rm -rf "$FL_BUILD_DIR/CMakeCache.txt" "$FL_BUILD_DIR/CMakeFiles"
  fi
  if [ ! -f "$FL_BUILD_DIR/CMakeCache.txt" ] ||
     { [ -n "$FL_ARCHS" ] && [ "$(fl_cache_get CMAKE_CUDA_ARCHITECTURES)" != "${FL_ARCHS// /;}" ]; }; then
    local args=("${FL_CUDA_ARGS[@]}")
    # Point CMake at the nvcc found here (CUDACXX or PATH), the one the checks above were made on.
    [ -n "$FL_NVCC" ] && args+=("-DCMAKE_CUDA_COMPILER=$FL_NVCC")
    [ "$FL_BUILD_DIR" != build ] && args+=(-B "$FL_BUILD_DIR")
    cmake --preset default "${args[@]}"
  fi
}

# Builds, saying first what the build will cost when it is the first one.
fl_build() {
  local cores
  cores=$(nproc 2>/dev/null || echo 2)
  if [ ! -e "$FL_BUILD_DIR/bench/ladder" ]; then
    if [ -n "$FL_ARCHS" ]; then
      local n
      if [ "$FL_ARCHS" = native ]; then n=1; else n=$(echo "$FL_ARCHS" | wc -w); fi
      # Measured: the whole quick start took 575-619 s for 4 architectures on CI's 2 cores (2026-11-24), most of it the
      # tensor-core rungs' kernel files (one file a version), each compiled once per architecture: ~5 min a core each.
      local min=$(( (n * 5 + cores - 1) / cores ))
      fl_say "building: the first build compiles $n GPU architecture$([ "$n" -gt 1 ] && echo s) ($FL_ARCHS); ~$min min on $cores cores"
    else
      fl_say "building: the first build compiles the CPU twins and the tests; ~$(( (4 + cores - 1) / cores )) min on $cores cores"
    fi
  fi
  cmake --build "$FL_BUILD_DIR"
}
