#!/usr/bin/env bash
# Quick start, step 1 of 2: installs what is missing (Debian/Ubuntu), builds everything, and runs
# the ladder on its default problem. With nvcc on PATH the GPU rungs are built too; with a GPU
# they run beside the CPU twins. Extra arguments go to the ladder (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev)
missing=()
if command -v dpkg >/dev/null; then
  for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
else
  echo "quickstart: not a Debian/Ubuntu system; install by hand: CMake >= 3.22, Ninja, a C++17" \
       "compiler, Eigen 3, GoogleTest and Google Benchmark (and the CUDA Toolkit for GPU rungs)" >&2
fi
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "quickstart: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ -f build/CMakeCache.txt ] || cmake --preset default
cmake --build --preset default
echo
./build/bench/ladder "$@"
