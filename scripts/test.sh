#!/usr/bin/env bash
# Quick start, step 2 of 2: builds what changed and runs the whole test suite (CPU tests always;
# GPU tests run where a GPU is, and say why they skip where there is none).
# Extra arguments go to ctest, e.g.  scripts/test.sh -L 01_safe_softmax
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/CMakeCache.txt ] || cmake --preset default
cmake --build --preset default
ctest --preset default -j "$(nproc)" "$@"
