#!/usr/bin/env bash
# Quick start, step 1 of 2: checks for what the build needs and installs only what is missing
# (Debian/Ubuntu; where it cannot, it says what is missing and how to get it), builds everything,
# and runs the ladder on its default problem. With nvcc the GPU rungs are built too: for the GPU
# here when there is one, else for the four default architectures (compiled, not run). Extra
# arguments go to the ladder (try --help). The checks live in scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
FL_SCRIPT=quickstart
source scripts/setup.sh

fl_ensure_tools
fl_configure
fl_build
echo
"./$FL_BUILD_DIR/bench/ladder" "$@"
